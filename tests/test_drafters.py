"""Drafters (:mod:`mdv.drafters`): the law q each one records is the law its tokens are drawn from, and
every lossless verifier still reproduces the target with it.

* Parity: along real generations with accepts and rejects, every q vector the verifier saw equals the
  drafter's slow :meth:`~mdv.drafters.base.Drafter.reference_law` of that context (the ``ngram`` index
  against a full scan, exactly; ``layerskip``'s weight-sharing view with its KV cache against the full
  target's ``hidden_states[depth]`` with norm and head, 1e-9 in float64; ``model`` against a fresh
  full-prefix pass).
* Law of the draws: at a fixed context, the first two tokens of row 0 and the first tokens of rows 0
  and 1 over many proposals match the exact law built from ``reference_law`` (chi-square, ALPHA).
* T = 0: every lossless verifier with ``ngram`` and ``layerskip`` emits the autoregressive greedy
  tokens.  T > 0: the law of the first 3 generated tokens with ``ngram`` (every lossless verifier) and
  ``layerskip`` (sd, mdbv) matches the exact target law.
* ``ngram`` edge cases: no match (unigram fallback), a match at the very end of the context, overlapping
  occurrences, K above the number of distinct continuations, longest n first.
* Bad input: one clear error before any generation.
"""
from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest
import torch

import mdv
from mdv.drafters import DRAFTERS, Drafter, get_drafter
from mdv.drafters.ngram import NgramDrafter
from mdv.engine import StepRecord, generate
from mdv.errors import InvalidInputError, MdvError
from mdv.models.hf import HFModel
from mdv.models.sampling import SamplingConfig
from mdv.oracle import target_law
from mdv.oracle.montecarlo import chi_square_pvalue
from tests.test_engine import greedy_reference
from tests.test_hf_model import tiny_llama, tiny_pair

LOSSLESS = sorted(n for n, c in mdv.VERIFIERS.items() if c.lossless)
ALPHA = 1e-3  # chi-square significance; the seeds are fixed, so each outcome is deterministic
PROMPT = [1, 5, 7, 5, 7, 9, 5, 7]  # repeats, so that lookups match


@pytest.fixture(scope="module")
def target3() -> HFModel:
    return HFModel(tiny_llama(16, seed=4, layers=3, scale=6.0))


def drafters_for(target: HFModel) -> dict[str, tuple[Drafter, Any]]:
    """name -> (a bound drafter, the draft model to pass)."""
    draft = tiny_pair(16, seed=4)[1]
    out: dict[str, tuple[Drafter, Any]] = {}
    for name, opts, d in (("model", {}, draft), ("ngram", {"n_max": 3}, None), ("layerskip", {"depth": 1}, None)):
        drf = get_drafter(name, **opts)
        drf.bind(target, d)
        out[name] = (drf, d)
    return out


def test_registry_lists_the_builtin_drafters() -> None:
    assert list(DRAFTERS) == ["eagle", "layerskip", "model", "ngram"]
    assert all(issubclass(c, Drafter) for c in DRAFTERS.values())


# ---------------------------------------------------------------------------------- parity along generations
@pytest.mark.parametrize("name", ["model", "ngram", "layerskip"])
def test_recorded_q_equals_the_reference_law_along_generations(target3, name: str) -> None:
    drf, draft = drafters_for(target3)[name]
    sampling = SamplingConfig(1.0)
    records: list[StepRecord] = []
    checked, rejected = 0, 0
    for seed in range(3):
        generate(target3, draft, PROMPT, "spectr", K=3, L=3, max_new_tokens=20, seed=seed, eos_token_id=[],
                 drafter=drf, on_step=records.append)
    worst = 0.0
    for rec in records:
        rejected += int(rec.outcome.tau[0]) < rec.block.L
        for k in range(rec.block.K):
            for i in range(rec.block.L):
                ctx = list(rec.context) + rec.block.tokens[0, k, :i].tolist()
                ref = drf.reference_law(ctx, sampling, committed=len(rec.context))
                worst = max(worst, (rec.block.q[0, k, i] - ref).abs().max().item())
                checked += 1
    assert rejected > 0 and checked > 50, (rejected, checked)
    if name == "ngram":
        assert worst == 0.0  # counts over the same occurrences: the same float64 divisions
    assert worst < 1e-9, worst


# ---------------------------------------------------------------------------------- the law of the draws
@pytest.mark.parametrize("name", ["model", "ngram", "layerskip"])
def test_drawn_tokens_follow_the_recorded_law(target3, name: str) -> None:
    drf, _ = drafters_for(target3)[name]
    sampling = SamplingConfig(1.0)
    seq = [1, 5, 7, 5, 8, 5, 9, 2, 5]  # ngram: "5" was followed by 7, 8 and 9; then by 5, 5 and 2
    n = 1500
    gen = torch.Generator().manual_seed(11)
    pairs, firsts = Counter(), Counter()
    for _ in range(n):
        drf.prefill(seq)
        d = drf.propose(seq, 2, 2, sampling, gen)
        t = d.tokens.tolist()
        pairs[(t[0][0], t[0][1])] += 1
        firsts[(t[0][0], t[1][0])] += 1
    q0 = drf.reference_law(seq, sampling)
    law_pairs = {(a, b): float(q0[a]) * float(drf.reference_law(seq + [a], sampling)[b])
                 for a in range(16) if q0[a] > 0 for b in range(16)}
    law_firsts = {(a, b): float(q0[a] * q0[b]) for a in range(16) for b in range(16)}  # rows independent
    assert chi_square_pvalue(pairs, law_pairs) > ALPHA
    assert chi_square_pvalue(firsts, law_firsts) > ALPHA
    assert len(pairs) >= 3  # the law is not a point mass: the test can fail


def test_the_law_test_has_power(target3) -> None:
    """A wrong law (row 0's second token from the first position's law) is rejected."""
    drf, _ = drafters_for(target3)["layerskip"]
    sampling = SamplingConfig(1.0)
    seq = PROMPT + [5]
    gen = torch.Generator().manual_seed(11)
    pairs = Counter()
    for _ in range(1500):
        drf.prefill(seq)
        t = drf.propose(seq, 1, 2, sampling, gen).tokens.tolist()
        pairs[(t[0][0], t[0][1])] += 1
    q0 = drf.reference_law(seq, sampling)
    wrong = {(a, b): float(q0[a] * q0[b]) for a in range(16) for b in range(16)}
    assert chi_square_pvalue(pairs, wrong) < ALPHA


# ---------------------------------------------------------------------------------- lossless with every drafter
GREEDY_CASES = [(d, m, K) for d in ("ngram", "layerskip") for m in LOSSLESS
                for K in ((1, 3) if mdv.VERIFIERS[m].multi_draft else (1,))]


@pytest.mark.parametrize("drafter,method,K", GREEDY_CASES)
def test_greedy_equals_autoregressive_greedy(target3, drafter: str, method: str, K: int) -> None:
    ref = greedy_reference(target3, PROMPT, 20)
    opts = {"depth": 2} if drafter == "layerskip" else {}
    res = generate(target3, None, PROMPT, method, K=K, L=3, temperature=0.0, max_new_tokens=20, eos_token_id=[],
                   drafter=drafter, drafter_options=opts)
    assert res.tokens == ref
    assert res.stats["drafter"] == drafter


@pytest.mark.parametrize("drafter", ["ngram", "layerskip"])
def test_greedy_on_the_lean_forward_equals_autoregressive_greedy(target3, drafter: str) -> None:
    from mdv.models.lean import LeanModel

    ref = greedy_reference(target3, PROMPT, 20)
    opts = {"depth": 2} if drafter == "layerskip" else {}
    res = generate(LeanModel.of(target3), None, PROMPT, "spectr", K=3, L=3, temperature=0.0, max_new_tokens=20,
                   eos_token_id=[], drafter=drafter, drafter_options=opts)
    assert res.tokens == ref


LAW_SAMPLING = {"temperature": 0.9, "top_k": 5}
LAW_PROMPT = [3, 4, 3, 4, 3]
N_LAW = 600


@pytest.fixture(scope="module")
def pair8() -> tuple[HFModel, dict[tuple[int, ...], float]]:
    target = HFModel(tiny_llama(8, seed=7, layers=2, scale=15.0))
    return target, target_law(target, 3, LAW_PROMPT, **LAW_SAMPLING)


LAW_CASES = [("ngram", m) for m in LOSSLESS] + [("layerskip", "sd"), ("layerskip", "mdbv")]


@pytest.mark.parametrize("drafter,method", LAW_CASES)
def test_law_of_first_tokens(pair8, drafter: str, method: str) -> None:
    target, law = pair8
    K = 2 if mdv.VERIFIERS[method].multi_draft else 1
    counts: Counter = Counter()
    opts = {"n_max": 2} if drafter == "ngram" else {"depth": 1}
    for seed in range(N_LAW):
        res = generate(target, None, LAW_PROMPT, method, K=K, L=2, max_new_tokens=3, seed=seed, eos_token_id=[],
                       drafter=drafter, drafter_options=opts, **LAW_SAMPLING)
        counts[tuple(res.tokens)] += 1
    p = chi_square_pvalue(counts, law)
    assert p > ALPHA, f"{drafter}/{method}: chi-square p = {p:.3g} against the exact target law"


# ---------------------------------------------------------------------------------- ngram edge cases
def bound_ngram(V: int = 10, **opts: Any) -> NgramDrafter:
    drf = NgramDrafter(**opts)
    drf.bind(HFModel(tiny_llama(V, seed=0)), None)
    return drf


def law_of(drf: NgramDrafter, ctx: list[int]) -> dict[int, float]:
    q = drf.reference_law(ctx, SamplingConfig(1.0))
    return {i: float(v) for i, v in enumerate(q) if v > 0}


def test_ngram_no_match_falls_back_to_the_unigram_law() -> None:
    drf = bound_ngram(n_min=2, n_max=3)
    assert law_of(drf, [1, 2, 3, 2, 4]) == {1: 0.2, 2: 0.4, 3: 0.2, 4: 0.2}  # "2 4" never seen before


def test_ngram_longest_match_first_and_match_at_the_very_end() -> None:
    drf = bound_ngram(n_max=3)
    # suffix "2 3": seen once earlier followed by 4; the 1-gram "3" also precedes 9, but n = 2 wins
    assert law_of(drf, [2, 3, 4, 3, 9, 2, 3]) == {4: 1.0}
    # the earlier occurrence ends right before the suffix: it is followed by the suffix's first token
    assert law_of(drf, [5, 6, 5, 6]) == {5: 1.0}
    # overlapping occurrences of "1 1" in "1 1 1 1": followed by 1 twice
    assert law_of(drf, [1, 1, 1, 1]) == {1: 1.0}
    # a one-token context: nothing earlier, the unigram fallback
    assert law_of(drf, [7]) == {7: 1.0}


def test_ngram_empirical_law_and_K_above_the_distinct_continuations() -> None:
    drf = bound_ngram(n_max=2, n_min=1)
    seq = [4, 1, 4, 2, 4, 1, 8, 4]  # "4" followed by 1, 2, 1: q = (2/3, 1/3)
    assert law_of(drf, seq) == pytest.approx({1: 2 / 3, 2: 1 / 3})
    drf.prefill(seq)
    d = drf.propose(seq, 6, 2, SamplingConfig(1.0), torch.Generator().manual_seed(0))
    assert d.tokens.shape == (6, 2) and d.q.shape == (6, 2, 10) and d.calls == 0
    assert set(d.tokens[:, 0].tolist()) <= {1, 2}  # 6 i.i.d. rows over 2 continuations: repeats
    for k in range(6):  # each row's second law follows its own first token
        first = int(d.tokens[k, 0])
        torch.testing.assert_close(d.q[k, 1], drf.reference_law(seq + [first], SamplingConfig(1.0)), rtol=0, atol=0)


@pytest.mark.parametrize("on_miss, miss_length", [("skip", 0), ("guess", 1), ("block", 3)])
def test_ngram_shortens_a_block_only_where_the_context_has_no_match_and_only_when_allowed(on_miss, miss_length) -> None:
    drf = bound_ngram(n_max=2, n_min=1, on_miss=on_miss)
    gen = torch.Generator().manual_seed(0)
    miss, hit = [1, 2, 3, 4], [1, 2, 3, 1]  # "4" never seen before; "1" was followed by 2
    for seq, shorter_ok, length in ((miss, True, miss_length), (miss, False, 3), (hit, True, 3), (hit, False, 3)):
        drf.prefill(seq)
        d = drf.propose(seq, 2, 3, SamplingConfig(1.0), gen, shorter_ok=shorter_ok)
        assert d.tokens.shape == (2, length) and d.q.shape == (2, length, 10), (seq, shorter_ok)
    # the default n_min = 2: a suffix that matches only as a 1-gram ("1") is a miss too
    default = bound_ngram(on_miss=on_miss)
    default.prefill(hit)
    assert default.propose(hit, 2, 3, SamplingConfig(1.0), gen, shorter_ok=True).tokens.shape == (2, miss_length)


@pytest.mark.parametrize("on_miss", ["skip", "guess"])
@pytest.mark.parametrize("method, K", [("sd", 1), ("spectr", 2)])
def test_the_engine_takes_shortened_and_empty_blocks_and_counts_them(target3, on_miss, method, K) -> None:
    prompt = [1, 2, 3, 4, 5, 6, 7]  # no repeats: the first contexts miss
    ref = greedy_reference(target3, prompt, 12)
    res = generate(target3, None, prompt, method, K=K, L=3, temperature=0.0, max_new_tokens=12,
                   eos_token_id=[], drafter="ngram", drafter_options={"on_miss": on_miss})
    assert res.tokens == ref and res.stats["short_blocks"] >= 1
    assert ("undrafted_steps" in res.stats) == (on_miss == "skip")
    taus = res.stats["accepted_lengths"]
    assert len(taus) == res.stats["target_calls"] and all(0 <= t <= 3 for t in taus)
    # every target call emitted tau + 1 tokens (the last one possibly cut at max_new_tokens)
    assert sum(t + 1 for t in taus) >= len(res.tokens) > sum(t + 1 for t in taus[:-1])


@pytest.mark.parametrize("method", ["sd", "spectr"])
def test_undrafted_steps_keep_the_target_law_at_temperature(pair8, method: str) -> None:
    """T > 0, a prompt without repeats: the first context misses, so ngram (on_miss="skip") proposes
    nothing and the engine takes an AR step; the first 3 tokens still follow the exact target law."""
    target, _ = pair8
    prompt = [1, 2, 5, 6, 7]
    law = target_law(target, 3, prompt, **LAW_SAMPLING)
    K = 2 if mdv.VERIFIERS[method].multi_draft else 1
    counts: Counter = Counter()
    undrafted = 0
    for seed in range(N_LAW):
        res = generate(target, None, prompt, method, K=K, L=2, max_new_tokens=3, seed=seed, eos_token_id=[],
                       drafter="ngram", drafter_options={"n_max": 2, "on_miss": "skip"}, **LAW_SAMPLING)
        undrafted += res.stats.get("undrafted_steps", 0)
        counts[tuple(res.tokens)] += 1
    assert undrafted >= N_LAW  # every generation began with one
    p = chi_square_pvalue(counts, law)
    assert p > ALPHA, f"ngram/{method} with undrafted steps: chi-square p = {p:.3g} against the exact target law"


def test_ngram_index_equals_the_full_scan_on_random_sequences() -> None:
    rng = random.Random(3)
    for _ in range(200):
        drf = bound_ngram(V=4, n_max=rng.randint(1, 4), n_min=1)
        seq = [rng.randrange(4) for _ in range(rng.randint(1, 25))]
        drf.prefill(seq[:rng.randint(1, len(seq))])  # an index built in two steps
        drf._sync(seq)
        drafted = [rng.randrange(4) for _ in range(rng.randint(0, 4))]
        fast = drf._fast_law(drafted)
        ref = drf.reference_law(seq + drafted, SamplingConfig(1.0))
        if fast is None:  # no match: the fallback law
            assert law_of(drf, seq + drafted) == {t: c / len(seq + drafted) for t, c in Counter(seq + drafted).items()}
        else:
            assert torch.equal(fast, ref)


# ---------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("kw,match", [
    ({"drafter": "eagle2"}, r"unknown drafter 'eagle2'; valid drafters are: eagle, layerskip, model, ngram"),
    ({"drafter": "ngram", "drafter_options": {"n_min": 3, "n_max": 2}}, r"n_min=3 > n_max=2"),
    ({"drafter": "ngram", "drafter_options": {"n_max": 0}}, r"n_max must be an integer >= 1"),
    ({"drafter": "ngram", "drafter_options": {"on_miss": "stop"}}, r"on_miss must be one of skip, guess, block; got 'stop'"),
    ({"drafter": "ngram", "drafter_options": {"shorten_on_miss": False}},
     r"drafter 'ngram' has no option\(s\) 'shorten_on_miss'"),
    ({"drafter": "ngram", "drafter_options": {"depth": 2}}, r"drafter 'ngram' has no option\(s\) 'depth'"),
    ({"drafter": "layerskip", "drafter_options": {"depth": 3}}, r"depth=3 is outside \[1, 3\) for this target \(3 layers\)"),
    ({"drafter": "layerskip", "drafter_options": {"depth": 0}}, r"depth=0 is outside \[1, 3\)"),
    ({"drafter": "model"}, r"draft model is missing; .* or choose a drafter that needs none \(drafter='ngram'"),
])
def test_bad_drafter_input_is_one_clear_error(target3, kw: dict[str, Any], match: str) -> None:
    with pytest.raises(MdvError, match=match):
        generate(target3, None, PROMPT, "sd", K=1, L=2, max_new_tokens=2, **kw)


def test_layerskip_needs_a_transformers_target() -> None:
    from mdv.models.callable import CallableLM

    lm = CallableLM(lambda prefixes: torch.zeros(len(prefixes), 5), vocab_size=5)
    with pytest.raises(InvalidInputError, match="layerskip' needs the target as an mdv.models.HFModel"):
        generate(lm, None, [1, 2], "sd", drafter="layerskip", max_new_tokens=2)
