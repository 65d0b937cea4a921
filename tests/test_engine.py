"""The engine on tiny randomly initialised float64 transformer pairs (built here, no files).

* T = 0: every registered method, K in {1, 3} (single-draft methods K = 1) and L in {1, 4}, emits
  exactly the autoregressive greedy tokens (computed by fresh full-prefix forward passes).
* KV caches: along a run with accepts and rejects, every p and q vector the verifier saw equals a
  fresh full-prefix forward pass (1e-9, float64).
* T > 0, vocabulary 8: the law of the first 3 tokens of ``generate`` over many seeds matches the exact
  target law enumerated from the model's own probabilities (chi-square, significance ALPHA) for every
  lossless method; a method flagged not lossless (``spectr_gbv``) must instead match the law the oracle
  predicts for it, and its bias must be visible.
* Stopping (max_new_tokens, EOS, context), stats bookkeeping, reproducibility.  Bad input to
  ``generate``: ``tests/test_bad_input_matrix.py``.
"""
from __future__ import annotations

import math
from collections import Counter

import pytest
import torch
from scipy import stats as sps

import mdv
from mdv.engine import GenerationResult, StepRecord, generate
from mdv.models.sampling import apply_sampling
from mdv.oracle import exact_law, random_toy_model, target_law, total_variation
from tests.test_hf_model import full_logprobs, tiny_pair

ALL_METHODS = sorted(mdv.VERIFIERS)
# chi-square significance: a correct engine fails a given test with probability ALPHA (the seeds are
# fixed, so the outcome is deterministic)
ALPHA = 1e-3
N_LAW = 600  # generations per method in the law test
PROMPT = [1, 5, 7]


@pytest.fixture(scope="module")
def pair32():
    return tiny_pair(32, seed=0)


def greedy_reference(model, prompt: list[int], n: int) -> list[int]:
    """Greedy decoding by fresh full-prefix forward passes (no cache)."""
    seq = list(prompt)
    for _ in range(n):
        seq.append(int(full_logprobs(model, seq)[-1].argmax()))
    return seq[len(prompt):]


@pytest.fixture(scope="module")
def greedy32(pair32) -> list[int]:
    return greedy_reference(pair32[0], PROMPT, 24)


# ---------------------------------------------------------------------------------- T = 0
GREEDY_CASES = [(m, K, L) for m in ALL_METHODS for K in ((1, 3) if mdv.VERIFIERS[m].multi_draft else (1,))
                for L in (1, 4)]


def test_ar_greedy_matches_full_forward(pair32, greedy32) -> None:
    res = generate(pair32[0], None, PROMPT, "ar", temperature=0, max_new_tokens=24)
    assert res.tokens == greedy32
    assert res.stats["target_calls"] == 24 and res.stats["block_efficiency"] == 1.0


@pytest.mark.parametrize("method,K,L", GREEDY_CASES, ids=[f"{m}-K{K}-L{L}" for m, K, L in GREEDY_CASES])
def test_greedy_equals_autoregressive(pair32, greedy32, method: str, K: int, L: int) -> None:
    target, draft = pair32
    res = generate(target, draft, PROMPT, method, K=K, L=L, temperature=0, max_new_tokens=24)
    assert res.tokens == greedy32
    taus = res.stats["accepted_lengths"]
    assert res.stats["new_tokens"] == 24 and res.stats["target_calls"] == len(taus)
    if L == 4:  # the pair is neither identical nor unrelated: both accepts and rejects happen
        assert max(taus) > 0 and min(taus) < L


# ---------------------------------------------------------------------------------- KV caches
@pytest.mark.parametrize("method,K", [("sd", 1), ("mdbv", 3), ("spectr", 3)])
def test_cached_probabilities_equal_full_forward(pair32, method: str, K: int) -> None:
    """Every p [K, L+1, V] and q [K, L, V] the verifier received equals a fresh, cache-free forward pass
    over the full prefix (context + draft), after many accept/reject/rollback iterations."""
    target, draft = pair32
    L, temperature = 4, 1.0
    records: list[StepRecord] = []
    res = generate(target, draft, PROMPT, method, K=K, L=L, temperature=temperature, max_new_tokens=30, seed=3,
                   on_step=records.append)
    taus = [int(r.outcome.tau[0]) for r in records]
    assert len(records) >= 5 and min(taus) < L and max(taus) > 0, taus
    assert res.stats["accepted_lengths"] == taus
    worst = 0.0
    for rec in records:
        n = len(rec.context)
        assert list(rec.context[len(PROMPT):]) == res.tokens[:n - len(PROMPT)]
        for k in range(K):
            seq = list(rec.context) + rec.block.tokens[0, k].tolist()
            p_ref = apply_sampling(full_logprobs(target, seq)[n - 1:], temperature)  # [L+1, V]
            q_ref = apply_sampling(full_logprobs(draft, seq[:-1])[n - 1:], temperature)  # [L, V]
            worst = max(worst, (rec.block.p[0, k] - p_ref).abs().max().item(),
                        (rec.block.q[0, k] - q_ref).abs().max().item())
    assert worst < 1e-9, worst


# ---------------------------------------------------------------------------------- T > 0: the law
LAW_SAMPLING = {"temperature": 0.9, "top_k": 5}  # top-k zeroes 3 of 8 tokens in p and in q
LAW_PROMPT = [3]  # one token: nothing to prefill, so each generation is cheap
LAW_L = 2  # 3 tokens need one or two iterations: greedy verifiers carry their state into the second


@pytest.fixture(scope="module")
def pair8():
    # chosen for a spread-out law: 35 cells with expected count >= 5 at N_LAW = 600 (76% of the mass),
    # E[tau] of sd at L = 2 is 1.25, and spectr_gbv's predicted bias is TV = 0.106
    return tiny_pair(8, seed=7, scale=15.0)


@pytest.fixture(scope="module")
def target_law8(pair8) -> dict[tuple[int, ...], float]:
    return target_law(pair8[0], 3, LAW_PROMPT, **LAW_SAMPLING)


def chi_square_pvalue(counts: Counter, law: dict[tuple[int, ...], float], n: int) -> float:
    """Pearson chi-square of observed counts against ``law``; cells with expected count < 5 are pooled
    (the pool is merged into the smallest kept cell if it is itself below 5).  Outcomes outside the
    support of ``law`` give p = 0."""
    if any(law.get(k, 0.0) <= 0.0 for k in counts):
        return 0.0
    keys = sorted(law, key=lambda k: -law[k])
    big = [k for k in keys if law[k] * n >= 5]
    small = [k for k in keys if law[k] * n < 5]
    obs = [counts.get(k, 0) for k in big]
    exp = [law[k] * n for k in big]
    if small:
        pool_obs, pool_exp = sum(counts.get(k, 0) for k in small), sum(law[k] for k in small) * n
        if pool_exp >= 5:
            obs.append(pool_obs)
            exp.append(pool_exp)
        else:
            obs[-1] += pool_obs
            exp[-1] += pool_exp
    exp_arr = [e * sum(obs) / sum(exp) for e in exp]  # renormalise float rounding
    return float(sps.chisquare(obs, exp_arr).pvalue)


def sample_first_tokens(method: str, target, draft, K: int, n: int) -> Counter:
    counts: Counter = Counter()
    for seed in range(n):
        res = generate(target, draft, LAW_PROMPT, method, K=K, L=LAW_L, max_new_tokens=3, seed=seed,
                       eos_token_id=[], **LAW_SAMPLING)
        assert len(res.tokens) == 3
        counts[tuple(res.tokens)] += 1
    return counts


@pytest.mark.parametrize("method", ALL_METHODS)
def test_law_of_first_tokens(pair8, target_law8, method: str) -> None:
    target, draft = pair8
    cls = mdv.VERIFIERS[method]
    K = 2 if cls.multi_draft else 1
    counts = sample_first_tokens(method, target, draft, K, N_LAW)
    p_target = chi_square_pvalue(counts, target_law8, N_LAW)
    if cls.lossless:
        assert p_target > ALPHA, f"{method}: chi-square p = {p_target:.3g} against the exact target law"
        return
    # not lossless: the engine must reproduce the law the oracle predicts, and the samples must favour
    # that biased law over the target law (likelihood ratio > 1/ALPHA) whenever the oracle's bias is
    # large enough to show at this N (expected log-ratio N·KL(predicted || target) > 3·log(1/ALPHA))
    predicted = exact_law(method, target, draft, K, LAW_L, 3, LAW_PROMPT, **LAW_SAMPLING)
    p_pred = chi_square_pvalue(counts, predicted, N_LAW)
    assert p_pred > ALPHA, f"{method}: chi-square p = {p_pred:.3g} against the oracle's predicted law"
    kl = sum(v * math.log(v / target_law8[k]) if target_law8.get(k, 0.0) > 0 else math.inf
             for k, v in predicted.items() if v > 0)
    if N_LAW * kl > 3 * math.log(1 / ALPHA):
        llr = log_likelihood_ratio(counts, predicted, target_law8)
        assert llr > math.log(1 / ALPHA), (
            f"{method}: oracle predicts KL {kl:.3g} from the target, but the samples do not show it"
            f" (log-likelihood ratio {llr:.3g}, chi-square p against the target {p_target:.3g})")


def log_likelihood_ratio(counts: Counter, law_a: dict[tuple[int, ...], float],
                         law_b: dict[tuple[int, ...], float]) -> float:
    """log of Pr(counts | law_a) / Pr(counts | law_b) (+inf when an outcome is impossible under law_b)."""
    total = 0.0
    for k, c in counts.items():
        a, b = law_a.get(k, 0.0), law_b.get(k, 0.0)
        if b <= 0.0:
            return math.inf if a > 0.0 else -math.inf
        total += c * (math.log(a) - math.log(b)) if a > 0.0 else -math.inf
    return total


def test_law_test_has_power(pair8, target_law8) -> None:
    """Sanity of the statistic: a wrong law (the target at another temperature) is rejected."""
    target, draft = pair8
    counts = Counter()
    for seed in range(N_LAW):
        res = generate(target, None, LAW_PROMPT, "ar", max_new_tokens=3, seed=seed, eos_token_id=[],
                       temperature=1.3, top_k=6)
        counts[tuple(res.tokens)] += 1
    assert chi_square_pvalue(counts, target_law8, N_LAW) < ALPHA


# ---------------------------------------------------------------------------------- stopping and stats
def test_reproducible_with_seed(pair32) -> None:
    target, draft = pair32
    a = generate(target, draft, PROMPT, "spectr", K=3, L=3, max_new_tokens=20, seed=11)
    b = generate(target, draft, PROMPT, "spectr", K=3, L=3, max_new_tokens=20, seed=11)
    c = generate(target, draft, PROMPT, "spectr", K=3, L=3, max_new_tokens=20, seed=12)
    assert a.tokens == b.tokens and a.stats["accepted_lengths"] == b.stats["accepted_lengths"]
    assert a.stats["selected_drafts"] == b.stats["selected_drafts"]
    assert c.tokens != a.tokens


def test_stats_bookkeeping(pair32) -> None:
    target, draft = pair32
    K, L, cap = 3, 4, 17
    res = generate(target, draft, PROMPT, "mdbv", K=K, L=L, max_new_tokens=cap, seed=1)
    s = res.stats
    assert isinstance(res, GenerationResult) and len(res.tokens) == cap == s["new_tokens"]
    taus = s["accepted_lengths"]
    n_it = len(taus)
    assert s["target_calls"] == s["iterations"] == n_it
    assert s["draft_calls"] == n_it * L  # pending tokens in one row, then L-1 steps over K rows
    assert sum(t + 1 for t in taus) >= cap > sum(t + 1 for t in taus[:-1])  # the last iteration is capped
    assert math.isclose(s["block_efficiency"], cap / n_it)
    assert s["accepted_length_histogram"] == [taus.count(i) for i in range(L + 1)]
    assert math.isclose(s["acceptance_rate_kl"], sum(taus) / (K * L * n_it))
    assert math.isclose(s["acceptance_rate_l"], sum(taus) / (L * n_it))
    assert s["per_position_acceptance"] == [sum(t >= i for t in taus) / n_it for i in range(1, L + 1)]
    assert len(s["selected_drafts"]) == n_it and all(0 <= k < K for k in s["selected_drafts"])
    assert s["stop_reason"] == "max_new_tokens"
    for key in ("prefill_s", "draft_s", "target_s", "verify_s", "decode_s", "total_s"):
        assert s[key] >= 0.0
    assert s["decode_s"] >= s["draft_s"] + s["target_s"] + s["verify_s"] - 1e-9
    assert s["tokens_per_second"] > 0 and s["tokens_per_second_e2e"] > 0


def test_eos_stops_generation(pair32, greedy32) -> None:
    target, draft = pair32
    eos = greedy32[5]
    stop = greedy32.index(eos)
    for method, K in (("ar", 1), ("sd", 1), ("mdbv", 3)):
        res = generate(target, draft, PROMPT, method, K=K, L=4, temperature=0, max_new_tokens=24, eos_token_id=eos)
        assert res.tokens == greedy32[:stop + 1], method
        assert res.stats["stop_reason"] == "eos" and res.stats["new_tokens"] == stop + 1


def test_context_limit_stops_cleanly() -> None:
    target, draft = tiny_pair(16, seed=2, context=12)
    res = generate(target, draft, [1, 2, 3], "sd", L=4, max_new_tokens=50, temperature=0)
    assert res.stats["stop_reason"] == "context" and 3 + len(res.tokens) <= 12 + 1
    res = generate(target, None, [1, 2, 3], "ar", max_new_tokens=50, temperature=0)
    assert res.stats["stop_reason"] == "context" and 3 + len(res.tokens) <= 12


def test_callable_models_run_through_prefix_sessions() -> None:
    """CallableLM pairs use the engine unchanged (prefix sessions instead of KV caches)."""
    target, draft = random_toy_model(6, seed=1), random_toy_model(6, seed=2)
    seq = [0]
    for _ in range(10):
        seq.append(int(target.probs(seq).argmax()))
    for method in ALL_METHODS:
        K = 3 if mdv.VERIFIERS[method].multi_draft else 1
        res = generate(target, draft, [0], method, K=K, L=3, temperature=0, max_new_tokens=10)
        assert res.tokens == seq[1:], method
    res = generate(target, draft, [0], "bv", L=3, temperature=0.7, max_new_tokens=10, seed=4)
    assert len(res.tokens) == 10


def test_prompt_forms_and_aggregate(pair32, greedy32) -> None:
    """Tensors, numpy arrays and lists give the same run; metrics.aggregate pools generations."""
    import numpy as np

    from mdv.metrics import aggregate

    target, draft = pair32
    runs = [generate(target, draft, prompt, "bv", L=4, temperature=0, max_new_tokens=12, eos_token_id=[])
            for prompt in (PROMPT, torch.tensor([PROMPT]), np.array(PROMPT, dtype=np.int64))]
    assert all(r.tokens == greedy32[:12] for r in runs)
    agg = aggregate([r.stats for r in runs])
    assert agg["n_generations"] == 3 and agg["new_tokens"] == 36
    assert math.isclose(agg["block_efficiency_pooled"], 36 / sum(r.stats["target_calls"] for r in runs))
    assert math.isclose(agg["block_efficiency_mean"], runs[0].stats["block_efficiency"])
    assert agg["block_efficiency_ci95"] == pytest.approx(0.0, abs=1e-12)
    assert sum(agg["accepted_length_histogram"]) == sum(r.stats["target_calls"] for r in runs)
