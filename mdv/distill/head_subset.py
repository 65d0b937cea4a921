"""The draft head's vocabulary subset (recipe step 6): token frequencies of the training text rank the vocabulary;
the most frequent ids (special and chat-template tokens always in) become the shipped head, compared across sizes.
"""
from __future__ import annotations

import copy
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, Iterable, Sequence

import torch
from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm

from mdv.errors import InvalidInputError
from mdv.models import default_pair as dp
from mdv.distill.data import SOURCES, batched_generate, chat_ids, interleave
from mdv.distill.evaluate import block_efficiency, greedy_agreement


def always_in_head(tok: Any) -> list[int]:
    """Ids every head subset keeps: the tokenizer's special and added tokens (EOS, BOS, padding, the chat
    template's ``<|im_start|>`` / ``<|im_end|>``, ...) and every token of the template's own text."""
    ids = set(getattr(tok, "all_special_ids", []) or [])
    ids |= {int(i) for i in (getattr(tok, "added_tokens_decoder", None) or {})}
    for attr in ("eos_token_id", "bos_token_id", "pad_token_id"):
        if isinstance(getattr(tok, attr, None), int):
            ids.add(int(getattr(tok, attr)))
    ids |= set(chat_ids(tok, "")) | set(chat_ids(tok, "", ""))
    return sorted(ids)


def token_frequencies(seqs: list[dict[str, Any]], train: list[dict[str, Any]], tok: Any
                      ) -> tuple[Counter, Counter]:
    """Token counts of the recipe's training text: (the target's generated tokens in the training sequences,
    every training prompt's chat with its reference answer plus HumanEval's raw code).  Held-out prompts
    are never counted."""
    gen: Counter = Counter()
    for sq in seqs:
        if sq["kind"] == "generation":
            gen.update(sq["ids"][sq["prompt_len"]:])
    text: Counter = Counter()
    for r in train:
        text.update(chat_ids(tok, r["user"], r["reference"]))
        if "raw" in r:
            text.update(tok.encode(r["raw"], add_special_tokens=False))
    return gen, text


def head_ranking(gen: Counter, text: Counter, vocab_size: int, generation_weight: float,
                 always: Iterable[int] = ()) -> list[int]:
    """Every id of the vocabulary, best first: the ``always`` ids, then by the mixed relative frequency
    ``w * gen/|gen| + (1 - w) * text/|text|`` (descending), ties and unseen ids by id (BPE ids are roughly
    in merge order, so a lower id is a more common piece)."""
    w = float(generation_weight)
    G, T = max(1, sum(gen.values())), max(1, sum(text.values()))
    score = {i: w * gen.get(i, 0) / G + (1 - w) * text.get(i, 0) / T for i in set(gen) | set(text)}
    first = list(dict.fromkeys(int(i) for i in always))
    seen = set(first)
    ranked = sorted((i for i in score if i not in seen and score[i] > 0), key=lambda i: (-score[i], i))
    seen |= set(ranked)
    return first + ranked + [i for i in range(vocab_size) if i not in seen]


def coverage(ids: Iterable[int], conts: list[list[int]], sources: list[str]) -> dict[str, Any]:
    """Fraction of the tokens of ``conts`` inside ``ids`` (pooled, and per source)."""
    s = set(ids)
    tot = sum(len(c) for c in conts)
    out: dict[str, Any] = {"coverage": sum(t in s for c in conts for t in c) / max(1, tot)}
    by = {}
    for src in SOURCES:
        xs = [c for c, so in zip(conts, sources) if so == src]
        n = sum(len(c) for c in xs)
        if n:
            by[src] = sum(t in s for c in xs for t in c) / n
    out["by_source"] = by
    return out


@torch.no_grad()
def step_costs(models: dict[str, Any], prompt: list[int], reps: int, rows: Sequence[int] = (1, 3)
               ) -> dict[str, Any]:
    """Median wall time (ms) of one single-token KV-cache step of each model with each row count, after the
    same prompt, every (model, rows) call interleaved with the others in each repetition (HFSession)."""
    from mdv.models.hf import HFModel

    sessions = {}
    for name, m in models.items():
        for R in rows:
            sess = HFModel(m).new_session()
            sess.prefill(prompt[:-1])
            sess.fork(int(R))
            sessions[(name, int(R))] = sess

    def one(key: tuple[str, int]) -> float:
        sess = sessions[key]
        L = sess.length
        x = torch.full((key[1], 1), prompt[-1], dtype=torch.long)
        t0 = time.perf_counter()
        sess.extend(x)
        dt = time.perf_counter() - t0
        sess.crop(L)
        return dt

    for _ in range(2):  # warm-up
        for key in sessions:
            one(key)
    times: dict[tuple[str, int], list[float]] = {k: [] for k in sessions}
    for _ in range(reps):
        for key in sessions:
            times[key].append(one(key))
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    ms = {name: {str(R): round(1e3 * med(times[(name, int(R))]), 3) for R in rows} for name in models}
    ref = next(iter(models))
    return {"ms": ms, f"ratio_to_{ref}": {name: {str(R): round(ms[name][str(R)] / ms[ref][str(R)], 4) for R in rows}
                                          for name in models if name != ref},
            "context_tokens": len(prompt), "reps": reps, "rows": [int(R) for R in rows],
            "via": "mdv.models.hf.HFSession",
            "note": "median single-token step with a KV cache (rows = sequences in the batch); every model and row"
                    f" count interleaved in each repetition; CPU, {torch.get_num_threads()} thread(s), shared machine"}


def choose_head_subsets(cfg: DictConfig, tok: Any, train: list[dict[str, Any]], seqs: list[dict[str, Any]],
                        vocab_size: int) -> tuple[dict[int, list[int]], list[int], Counter, Counter]:
    """The head vocabulary subsets of every size in ``head_subset.sizes`` and ``head_subset.size`` (sorted
    ids, a function of the training text and ``head_subset.*`` only), with the always-kept ids and the
    two token counts they were ranked by."""
    hs = cfg.head_subset
    size = int(hs.size)
    sizes = sorted({int(z) for z in hs.sizes} | {size})
    if not 0 < size <= vocab_size or any(not 0 < z <= vocab_size for z in sizes):
        raise InvalidInputError(f"head_subset sizes must lie in [1, {vocab_size}] (the target's vocabulary);"
                                f" got size={size}, sizes={sizes}; set head_subset.size / head_subset.sizes within it")
    always = always_in_head(tok)
    gen, text = token_frequencies(seqs, train, tok)
    ranking = head_ranking(gen, text, vocab_size, float(hs.generation_weight), always)
    return {z: sorted(ranking[:z]) for z in sizes}, always, gen, text


def head_subset_section(cfg: DictConfig, target: Any, tok: Any, train: list[dict[str, Any]],
                        held: list[dict[str, Any]], seqs: list[dict[str, Any]], out_dir: Path,
                        cache: Path | None) -> dict[str, Any]:
    """Step 6 of the recipe: choose, write and register the head vocabulary subset, then measure it against
    the full head (on the shipped decoder layers in ``out_dir``); returns the report's ``head_subset``."""
    hs = cfg.head_subset
    t0 = time.perf_counter()
    V = int(target.get_output_embeddings().weight.shape[0])
    size = int(hs.size)
    subsets, always, gen, text = choose_head_subsets(cfg, tok, train, seqs, V)
    sizes = sorted(subsets)
    # coverage: the target's greedy tokens on every held-out prompt
    prompts = [chat_ids(tok, r["user"]) for r in held]
    conts, _ = batched_generate(target, tok, prompts, int(hs.coverage_max_new_tokens), 0.0, 1.0,
                                int(hs.coverage_batch_size), int(cfg.seed), desc="target greedy (coverage)",
                                cache=cache)
    sources = [r["source"] for r in held]
    gen_conts = [sq["ids"][sq["prompt_len"]:] for sq in seqs if sq["kind"] == "generation"]
    table = []
    for z in sizes:
        cov = coverage(subsets[z], conts, sources)
        table.append({"size": z, "heldout_coverage": cov["coverage"], "heldout_coverage_by_source": cov["by_source"],
                      "train_generation_coverage": coverage(subsets[z], gen_conts, ["-"] * len(gen_conts))["coverage"]})
    # ship the chosen subset and name it in the draft config
    name = str(cfg.output.name)
    ids_path = out_dir / (str(hs.file) if hs.get("file") else dp.head_ids_path(name, out_dir).name)
    recipe = "python experiments/train_draft.py " + " ".join(sys.argv[1:])
    sha = dp.write_head_ids(ids_path, subsets[size], V, {  # a function of the data and head_subset.* only
        "draft": name, "made_by": "python experiments/train_draft.py (step 6)",
        "selection": {"generation_weight": float(hs.generation_weight), "always_included": len(always),
                      "seen_tokens": {"generation": sum(gen.values()), "text": sum(text.values())},
                      "distinct_seen": len(set(gen) | set(text)),
                      "rule": "special/chat-template ids, then mixed relative frequency in the training text"
                              " (descending), ties and unseen ids by id; stored sorted"}})
    cpath = dp.draft_config_path(name, out_dir)
    dcfg = json.loads(cpath.read_text())
    dcfg.update({"head_vocab_subset": ids_path.name, "head_vocab_subset_sha256": sha, "head_vocab_size": size,
                 "head_subset_recipe": {"command": recipe.strip(),
                                        "config": OmegaConf.to_container(hs, resolve=True)}})
    cpath.write_text(json.dumps(dcfg, indent=2) + "\n")
    # the draft with each head, built on the shipped layers (the chosen one as load_draft builds it)
    full = dp.load_draft(target, name, out_dir, head="full")
    drafts = {"full": full}
    W = target.get_output_embeddings().weight
    for z in sizes:
        drafts[f"subset_{z}"] = (dp.load_draft(target, name, out_dir, head="subset") if z == size
                                 else dp.restrict_head(copy.deepcopy(full), subsets[z], W))
    e = cfg.eval
    temps = [float(e.be_temperature), 1.0]
    agree = {}
    for key, d in tqdm(list(drafts.items()), desc="agreement by head", unit="head"):
        a = greedy_agreement(target, d, tok, held, int(e.num_prompts), int(e.max_new_tokens), int(cfg.seed),
                             cache, temperatures=temps)
        agree[key] = {k: a[k] for k in ("greedy_agreement", "by_source", "positions", "expected_acceptance")}
    for row in table:
        row.update({"greedy_agreement": agree[f"subset_{row['size']}"]["greedy_agreement"],
                    "expected_acceptance": agree[f"subset_{row['size']}"]["expected_acceptance"]})
    first = interleave(held, int(cfg.seed) + 11)[0]
    costs = step_costs({"target": target, **drafts}, chat_ids(tok, first["user"]), int(hs.cost_reps),
                       [int(R) for R in hs.cost_rows])
    for row in table:
        row["draft_step_ms"] = costs["ms"][f"subset_{row['size']}"]
        row["draft_target_step_ratio"] = costs["ratio_to_target"][f"subset_{row['size']}"]
    be = {}
    if hs.block_efficiency:
        for key in ("full", f"subset_{size}"):
            be[key] = block_efficiency(target, drafts[key], tok, held, cfg)
    chosen = next(row for row in table if row["size"] == size)
    return {
        "size": size, "vocab_size": V, "file": ids_path.name, "sha256": sha,
        "heldout_coverage": chosen["heldout_coverage"],
        "greedy_agreement": {"subset": agree[f"subset_{size}"]["greedy_agreement"],
                             "full": agree["full"]["greedy_agreement"]},
        "draft_target_step_ratio": {"subset": costs["ratio_to_target"][f"subset_{size}"],
                                    "full": costs["ratio_to_target"]["full"]},
        "sizes": table, "full_head": {"greedy_agreement": agree["full"]["greedy_agreement"],
                                      "expected_acceptance": agree["full"]["expected_acceptance"],
                                      "draft_step_ms": costs["ms"]["full"],
                                      "draft_target_step_ratio": costs["ratio_to_target"]["full"]},
        "agreement": agree, "step_cost": costs, "sd_block_efficiency": be or None,
        "coverage_definition": f"fraction of the target's greedy tokens ({int(hs.coverage_max_new_tokens)} new tokens,"
                               f" batched left-padded decoding) on all {len(held)} held-out prompts"
                               f" ({sum(len(c) for c in conts)} tokens) that lie in the subset",
        "agreement_definition": f"greedy_agreement() on the report's {int(e.num_prompts)} held-out prompts"
                                f" x {int(e.max_new_tokens)} tokens, per head; expected_acceptance at T ="
                                f" {temps} over the same positions",
        "recipe": recipe.strip(), "config": OmegaConf.to_container(hs, resolve=True),
        "machine": {"threads": torch.get_num_threads(), "torch": torch.__version__},
        "seconds": round(time.perf_counter() - t0, 1),
        "note": "the subset head is applied at load time to the shipped decoder layers, which were distilled with"
                + (" the KL over this subset's rows (distill.head=subset)" if str(cfg.distill.head) == "subset"
                   else " the full-vocabulary KL (distill.head=full)")
                + "; the evaluation section measures the draft as shipped (this subset head)",
    }
