"""Token trees (mdv.models.tree) and the sessions that score them in one row.

* build_tree: shared draft prefixes become one node; node_of / path / ancestors / the attention mask
  follow the parent links; a pending chain of m > 1 tokens comes first.
* HFSession.extend_tree: the logits after every node equal a fresh full-prefix forward pass (float64:
  1e-10 with sdpa; 1e-6 with eager, whose softmax transformers takes in float32); after keep_nodes the
  cache continues exactly as if only the kept path had been processed, over several trees in a row;
  crop drops a pending tree.
* PrefixSession (CallableLM) gives the same scores and rows.
* The engine: "tree" and "rows" target passes give the same tokens at T = 0 and the same p and q (to
  1e-9) at T > 0 along a run with accepts and rejects; misuse of the session API is a clear error.
"""
from __future__ import annotations

import pytest
import torch

from mdv.engine import StepRecord, generate
from mdv.errors import InvalidInputError
from mdv.models.hf import HFModel
from mdv.models.session import PrefixSession
from mdv.models.tree import build_tree
from mdv.oracle import random_toy_model
from tests.test_hf_model import full_logprobs, tiny_llama, tiny_pair

TOL = 1e-10
#: transformers' eager attention takes its softmax in float32 even for a float64 model (modeling_llama:
#: ``softmax(..., dtype=torch.float32)``), so a tree pass and a full pass, whose score rows have other
#: lengths, agree only to float32 rounding (measured up to 4e-7 on an AMD EPYC, 0 on another CPU; 3e-15
#: with that softmax in float64).  A misread mask (e.g. a boolean one added as +1 / +0) errs by far more.
EAGER_TOL = 1e-6
DRAFTS = torch.tensor([[7, 8, 9], [7, 8, 1], [2, 3, 4], [7, 5, 6]])  # [K=4, L=3]: rows 0, 1, 3 share "7"


def test_shared_prefixes_are_one_node() -> None:
    tree = build_tree([5], DRAFTS)
    # root 5; 7 -> 8 -> {9, 1}; 2 -> 3 -> 4; 7 -> 5 -> 6
    assert tree.ids == [5, 7, 8, 9, 1, 2, 3, 4, 5, 6]
    assert tree.parent == [-1, 0, 1, 2, 2, 0, 5, 6, 1, 8]
    assert tree.depth == [0, 1, 2, 3, 3, 1, 2, 3, 2, 3]
    assert tree.node_of.tolist() == [[0, 1, 2, 3], [0, 1, 2, 4], [0, 5, 6, 7], [0, 1, 8, 9]]
    assert tree.size == 10 and tree.chain == 1
    assert tree.path(1, 3) == [0, 1, 2, 4] and tree.path(2, 0) == [0] and tree.path(3, 1) == [0, 1]
    for k in range(4):  # the tokens along node_of[k] are the draft itself
        assert [tree.ids[j] for j in tree.node_of[k, 1:].tolist()] == DRAFTS[k].tolist()


def test_identical_drafts_make_a_chain_and_pending_tokens_come_first() -> None:
    tree = build_tree([3, 4], torch.tensor([[1, 2], [1, 2], [1, 2]]))
    assert tree.ids == [3, 4, 1, 2] and tree.parent == [-1, 0, 1, 2] and tree.depth == [0, 1, 2, 3]
    assert tree.node_of.tolist() == [[1, 2, 3]] * 3 and tree.chain == 2
    assert tree.path(0, 2) == [0, 1, 2, 3] and tree.path(2, 0) == [0, 1]


def test_mask_lets_each_node_see_prefix_ancestors_and_itself() -> None:
    tree = build_tree([5], DRAFTS)
    mask = tree.attention_mask(past=3)[0, 0]  # [n, 3 + n]
    assert mask.shape == (10, 13) and mask[:, :3].all()
    for j in range(tree.size):
        ancestors = {j}
        a = tree.parent[j]
        while a >= 0:
            ancestors.add(a)
            a = tree.parent[a]
        assert {i for i in range(tree.size) if mask[j, 3 + i]} == ancestors


def test_tree_rejects_bad_input() -> None:
    with pytest.raises(InvalidInputError, match="at least one pending token"):
        build_tree([], DRAFTS)
    with pytest.raises(InvalidInputError, match=r"drafts must have shape \[K, L >= 1\]"):
        build_tree([1], torch.tensor([1, 2]))
    tree = build_tree([5], DRAFTS)
    for bad in ([], [1, 2], [0, 1, 3, 4], [0, 5, 2], [0, 99]):
        with pytest.raises(InvalidInputError, match="keep_nodes\\(\\) needs a path from the tree's root"):
            tree.check_path(bad)


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_hf_tree_scores_equal_full_forward(attention: str) -> None:
    model = tiny_llama(24, seed=3)
    model.config._attn_implementation = attention
    hf = HFModel(model)
    s = hf.new_session()
    assert s.supports_tree
    prompt = [1, 2, 3, 4, 5]
    s.prefill(prompt[:-1])
    with torch.inference_mode():
        tree = build_tree([prompt[-1]], DRAFTS)
        logits = s.extend_tree(tree)  # [n, V]
    assert logits.shape == (tree.size, 24)
    for k in range(DRAFTS.shape[0]):
        ref = full_logprobs(hf, prompt + DRAFTS[k].tolist())[len(prompt) - 1:]  # [L+1, V]
        got = torch.log_softmax(logits[tree.node_of[k]].double(), -1)
        assert (got - ref).abs().max().item() < (TOL if attention == "sdpa" else EAGER_TOL)


def test_hf_keep_nodes_continues_like_the_kept_path() -> None:
    """Three trees in a row, keeping paths that are not the first branch (their keys and values must move
    next to the prefix), then a plain extend: all equal fresh full-prefix passes."""
    hf = HFModel(tiny_llama(24, seed=3))
    s = hf.new_session()
    seq = [1, 2, 3, 4, 5]
    s.prefill(seq[:-1])
    pending = [seq[-1]]
    with torch.inference_mode():
        for k, accepted, nxt in ((1, 3, 11), (2, 1, 13), (3, 2, 6)):
            tree = build_tree(pending, DRAFTS)
            logits = s.extend_tree(tree)
            ref = full_logprobs(hf, seq + DRAFTS[k].tolist())[len(seq) - 1:]
            assert (torch.log_softmax(logits[tree.node_of[k]].double(), -1) - ref).abs().max().item() < TOL
            s.keep_nodes(tree.path(k, accepted))
            seq = seq + DRAFTS[k, :accepted].tolist()
            assert s.length == len(seq) and s.cache.get_seq_length() == len(seq)
            seq.append(nxt)
            pending = [nxt]
        out = s.extend(torch.tensor([pending]))[0]  # [1, V]
    ref = full_logprobs(hf, seq)[-1:]
    assert (torch.log_softmax(out.double(), -1) - ref).abs().max().item() < TOL


def test_hf_crop_drops_a_pending_tree_and_misuse_is_an_error() -> None:
    hf = HFModel(tiny_llama(24, seed=3))
    s = hf.new_session()
    s.prefill([1, 2, 3, 4])
    with torch.inference_mode():
        with pytest.raises(InvalidInputError, match="keep_nodes\\(\\) needs a tree scored by extend_tree"):
            s.keep_nodes([0])
        tree = build_tree([5], DRAFTS)
        s.extend_tree(tree)
        for call, op in ((lambda: s.extend(torch.tensor([[1]])), "extend"), (lambda: s.fork(2), "fork"),
                         (lambda: s.extend_tree(tree), "extend_tree"), (lambda: s.keep(0), "keep"),
                         (lambda: s.prefill([1]), "prefill")):
            with pytest.raises(InvalidInputError, match=rf"{op}\(\) called while a scored token tree is pending"):
                call()
        s.crop(3)  # drops the tree and one cached token
        assert s.length == 3 and s.cache.get_seq_length() == 3
        out = s.extend(torch.tensor([[4, 5]]))[0]
        s.fork(2)
        with pytest.raises(InvalidInputError, match=r"extend_tree\(\) needs a single row"):
            s.extend_tree(tree)
    ref = full_logprobs(hf, [1, 2, 3, 4, 5])[-2:]
    assert (torch.log_softmax(out.double(), -1) - ref).abs().max().item() < TOL


def test_prefix_session_scores_trees_like_prefixes() -> None:
    toy = random_toy_model(12, seed=4)
    s = PrefixSession(toy)
    s.prefill([1, 2])
    drafts = torch.tensor([[3, 4], [3, 5], [6, 7]])
    tree = build_tree([0], drafts)
    scores = s.extend_tree(tree)  # [n, V]
    for k in range(3):
        prefixes = [(1, 2, 0, *drafts[k, :i].tolist()) for i in range(3)]
        assert torch.equal(scores[tree.node_of[k]], torch.as_tensor(toy.next_logprobs(prefixes)))
    for call, op in ((lambda: s.extend(torch.tensor([[1]])), "extend"), (lambda: s.extend_tree(tree), "extend_tree")):
        with pytest.raises(InvalidInputError, match=rf"{op}\(\) called while a scored token tree is pending"):
            call()
    s.keep_nodes(tree.path(1, 2))
    assert s._rows == [[1, 2, 0, 3, 5]] and s.length == 5


# ---------------------------------------------------------------------------------- the engine
@pytest.fixture(scope="module")
def pair32():
    return tiny_pair(32, seed=0)


@pytest.mark.parametrize("method", ["spectr", "mdbv", "spectr_gbv"])
def test_engine_tree_and_rows_give_the_same_generation(pair32, method: str) -> None:
    target, draft = pair32
    greedy = {tp: generate(target, draft, [1, 5, 7], method, K=3, L=4, temperature=0, max_new_tokens=24,
                           target_pass=tp) for tp in ("tree", "rows")}
    assert greedy["tree"].tokens == greedy["rows"].tokens
    assert greedy["tree"].stats["target_pass"] == "tree" and greedy["rows"].stats["target_pass"] == "rows"
    # at T > 0 the same seed draws the same drafts; p from the tree equals p from the rows to roundoff
    records: dict[str, list[StepRecord]] = {"tree": [], "rows": []}
    runs = {tp: generate(target, draft, [1, 5, 7], method, K=3, L=4, temperature=1.0, max_new_tokens=30, seed=5,
                         target_pass=tp, on_step=records[tp].append) for tp in ("tree", "rows")}
    assert runs["tree"].tokens == runs["rows"].tokens
    taus = runs["tree"].stats["accepted_lengths"]
    assert len(taus) >= 5 and min(taus) < 4 and max(taus) > 0, taus
    for a, b in zip(records["tree"], records["rows"]):
        assert torch.equal(a.block.tokens, b.block.tokens) and torch.equal(a.block.q, b.block.q)
        assert (a.block.p - b.block.p).abs().max().item() < 1e-9


def test_engine_auto_uses_tree_only_for_several_drafts(pair32) -> None:
    target, draft = pair32
    assert generate(target, draft, [1, 5, 7], "mdbv", K=3, L=2, max_new_tokens=4).stats["target_pass"] == "tree"
    assert generate(target, draft, [1, 5, 7], "mdbv", K=1, L=2, max_new_tokens=4).stats["target_pass"] == "rows"
    assert generate(target, draft, [1, 5, 7], "sd", K=1, L=2, max_new_tokens=4,
                    target_pass="tree").stats["target_pass"] == "rows"  # K = 1: the tree is one row anyway
