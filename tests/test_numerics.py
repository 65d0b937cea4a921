"""Numerics of long blocks (issue 6, "Numerics"; algorithms.md §12.11).

* Synthetic L = 16 blocks whose drafted tokens have probabilities near 1e-30, so every block joint
  ((1e-30)^16 = 1e-480) underflows a float64 product: a naive product-space computation of GBV's
  acceptance probabilities gives 0/0, while mdv's log-space ones are finite and equal to the exact
  values computed in rational arithmetic (:class:`fractions.Fraction` on the same float64 inputs); the
  exact outcome laws of sd / bv / gbv / mdbv (K = 1) and SpecTr-GBV's h match rational arithmetic too,
  and every verifier returns valid outcomes.
* L = 16 at temperature 2 on random V = 3..5 toys: every verifier's fast path returns finite
  acceptance probabilities, valid outcomes and normalised laws, and matches its scalar reference.
* Exactness where the oracle can enumerate: V = 2, K = 1, L = 8 (2^8 draft blocks per iteration) for
  sd / bv / gbv, and K = 2, L = 4 (2^8 draft pairs) for spectr / mdbv, at T = 1 and T = 2, on toys
  with 1e-200 entries after a third of the prefixes (at L = 8 some block joints underflow float64: 123
  of 256 at T = 1, 4 at T = 2); law of the first 3 tokens, TV < 1e-9.
"""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch

import mdv
from mdv.models.sampling import SamplingConfig
from mdv.models.callable import CallableLM
from mdv.oracle import exact_law, random_toy_model, target_law, total_variation
from mdv.oracle.enumerate import block_table
from mdv.verify import Block, Uniforms
from mdv.verify._math import TOL
from mdv.verify.gbv import GreedyBlockVerification, log_joints
from mdv.verify.spectr_gbv import SpecTrGBV
from tests.test_fuzz_verifiers import check_law, check_outcome, prefix_key

torch.set_num_threads(1)

ALL_METHODS = sorted(mdv.VERIFIERS)
L_LONG = 16


# ----------------------------------------------------------------------------------- synthetic blocks
def tiny_block(K: int, L: int = L_LONG, seed: int = 0, tiny: float = 1e-30) -> Block:
    """K drafts of length L over V = 3 whose drafted tokens have draft probability ~``tiny`` and target
    probability ``c · tiny`` (log c uniform in [-1.5, 1.5] per position): every block joint underflows a float64
    product, while the ratios P/Q stay moderate.  Drafts k >= 1 share draft 0's first k tokens and
    then take token 0 (also tiny) or token 1; rows are functions of the prefix, as in a real model."""
    rng = np.random.default_rng(seed)
    V = 3
    rows: dict[tuple[int, ...], tuple[np.ndarray, np.ndarray]] = {}

    def row(prefix: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
        if prefix not in rows:
            c = math.exp(rng.uniform(-1.5, 1.5))
            a, b = rng.uniform(0.05, 0.95, size=2)
            q = np.array([tiny, a, 1.0 - a]) / (1.0 + tiny)
            p = np.array([c * tiny, b, 1.0 - b]) / (1.0 + c * tiny)
            rows[prefix] = (p, q)
        return rows[prefix]

    drafts = [[0] * L]
    for k in range(1, K):
        d = drafts[0][:k % L] + [int(x) for x in rng.integers(0, 2, size=L - k % L)]
        drafts.append(d)
    toks = torch.tensor(drafts, dtype=torch.long).view(1, K, L)
    q = torch.zeros(1, K, L, V, dtype=torch.float64)
    p = torch.zeros(1, K, L + 1, V, dtype=torch.float64)
    for k, d in enumerate(drafts):
        for i in range(L + 1):
            pr, qr = row(tuple(d[:i]))
            p[0, k, i] = torch.from_numpy(pr)
            if i < L:
                q[0, k, i] = torch.from_numpy(qr)
    return Block(toks, q, p).validate()


def frac(x: float) -> Fraction:
    return Fraction(float(x))  # the exact binary value of the float64 input


def exact_draft(block: Block, k: int) -> tuple[list[int], list[list[Fraction]], list[list[Fraction]],
                                             list[Fraction], list[Fraction]]:
    """Draft k of ``block`` in exact rationals: tokens d, rows p [L+1][V] and q [L][V], and the prefix
    joints P_i = prod_{j<i} p_j(d_j), Q_i = prod_{j<i} q_j(d_j) for i = 0..L."""
    L = block.L
    d = [int(x) for x in block.tokens[0, k]]
    p = [[frac(x) for x in block.p[0, k, i]] for i in range(L + 1)]
    q = [[frac(x) for x in block.q[0, k, i]] for i in range(L)]
    P, Q = [Fraction(1)], [Fraction(1)]
    for i in range(L):
        P.append(P[-1] * p[i][d[i]])
        Q.append(Q[-1] * q[i][d[i]])
    return d, p, q, P, Q


def exact_gbv_h(block: Block, k: int = 0) -> list[Fraction]:
    """GBV's h_1..h_L along draft k (algorithms.md §5) in exact rational arithmetic."""
    L, V = block.L, block.V
    d, p, q, P, Q = exact_draft(block, k)
    h = []
    for i in range(1, L):
        s = sum(min(P[i] * p[i][x], Q[i] * q[i][x]) for x in range(V))
        num, den = min(P[i], Q[i]) - s, Q[i] - s
        # the guards of mdv.verify.gbv.greedy_block_h, relative to Q(u): 0/0 cases are decided by the
        # rounding of the rows' sums, not by the algorithm
        h.append(Fraction(1) if den <= TOL * Q[i] else Fraction(0) if num <= TOL * Q[i] else min(Fraction(1), num / den))
    h.append(min(Fraction(1), P[L] / Q[L]))
    return h


def exact_last_accepted_law(h: list[Fraction]) -> list[Fraction]:
    """Pr(tau = i) = h_i prod_{j > i} (1 - h_j), h_0 = 1."""
    hh = [Fraction(1)] + h
    out = []
    for i in range(len(hh)):
        pr = hh[i]
        for j in range(i + 1, len(hh)):
            pr *= 1 - hh[j]
        out.append(pr)
    return out


def exact_sd_law(block: Block) -> list[Fraction]:
    L = block.L
    d = [int(x) for x in block.tokens[0, 0]]
    a = [min(Fraction(1), frac(block.p[0, 0, i, d[i]]) / frac(block.q[0, 0, i, d[i]])) for i in range(L)]
    out, reach = [], Fraction(1)
    for i in range(L):
        out.append(reach * (1 - a[i]))
        reach *= a[i]
    return out + [reach]


def exact_bv_law(block: Block) -> list[Fraction]:
    L, V = block.L, block.V
    d = [int(x) for x in block.tokens[0, 0]]
    p = [[frac(x) for x in block.p[0, 0, i]] for i in range(L + 1)]
    q = [[frac(x) for x in block.q[0, 0, i]] for i in range(L)]
    w = [Fraction(1)]
    for i in range(L):
        w.append(min(Fraction(1), w[-1] * p[i][d[i]] / q[i][d[i]]))
    h = []
    for i in range(1, L):
        A = sum(max(w[i] * p[i][x] - q[i][x], Fraction(0)) for x in range(V))
        den = A + 1 - w[i]
        h.append(Fraction(1) if den <= TOL else min(Fraction(1), A / den))  # mdv.verify.bv's guard
    h.append(w[L])
    return exact_last_accepted_law(h)


def exact_spectr_gbv_h(block: Block, k: int) -> list[Fraction]:
    """SpecTr-GBV's h along draft k (algorithms.md §6.3, phi form) in exact rational arithmetic."""
    K, L, V = block.K, block.L, block.V
    d, p, q, P, Q = exact_draft(block, k)

    def phi(Pv: Fraction, Qv: Fraction) -> Fraction:
        r = Fraction(1) if Pv == 0 else min(Qv / Pv, Fraction(1))
        return Pv * (1 - (1 - r) ** K)

    h = []
    for i in range(1, L):
        A = 1 - (1 - Q[i]) ** K
        S = sum(phi(P[i] * p[i][x], Q[i] * q[i][x]) for x in range(V))
        num, den = phi(P[i], Q[i]) - S, A - S
        # the guards of mdv.verify.spectr_gbv._h_from_scaled, relative to A(u)
        h.append(Fraction(0) if num <= TOL * A else Fraction(1) if den <= TOL * A else min(Fraction(1), num / den))
    h.append(min(Fraction(1), phi(P[L], Q[L]) / (1 - (1 - Q[L]) ** K)))
    return h


def max_abs_diff(a: torch.Tensor, b: list[Fraction]) -> float:
    return max(float(abs(frac(x) - y)) for x, y in zip(a.tolist(), b))


# ----------------------------------------------------------------------------------- underflow
def test_naive_products_underflow_where_log_space_does_not() -> None:
    block = tiny_block(K=1, seed=1)
    d = block.tokens[0, 0]
    p_tok = block.p[0, 0, :-1].gather(-1, d[:, None]).squeeze(-1)
    q_tok = block.q[0, 0].gather(-1, d[:, None]).squeeze(-1)
    # naive: float64 products of the joints underflow to exactly 0 and the ratio P/Q is undefined
    P_naive, Q_naive = float(np.prod(p_tok.numpy())), float(np.prod(q_tok.numpy()))
    assert P_naive == 0.0 and Q_naive == 0.0
    with np.errstate(invalid="ignore"):
        assert math.isnan(np.float64(P_naive) / np.float64(Q_naive))
    # the exact joints are ~1e-480, far below float64's smallest subnormal (4.9e-324)
    exact_Q = math.prod(frac(x) for x in q_tok.tolist())
    assert math.log10(exact_Q.numerator) - math.log10(exact_Q.denominator) < -470
    # log space: finite joints and the exact ratio
    log_P, log_Q = log_joints(d[None], block.p[0, 0][None]), log_joints(d[None], block.q[0, 0][None])
    assert torch.isfinite(log_P).all() and torch.isfinite(log_Q).all() and float(log_Q[0, -1]) < -1000
    exact_ratio = math.prod(frac(x) for x in p_tok.tolist()) / math.prod(frac(x) for x in q_tok.tolist())
    assert math.exp(float(log_P[0, -1] - log_Q[0, -1])) == pytest.approx(float(exact_ratio), rel=1e-12)
    # GBV's acceptance probabilities and outcome law equal the exact rational values
    h, _ = GreedyBlockVerification().h_and_dists(block, None)
    assert torch.isfinite(h).all()
    h_exact = exact_gbv_h(block)
    assert max_abs_diff(h[0], h_exact) < 1e-10
    assert int(((h > 0.01) & (h < 0.99)).sum()) >= 3  # a non-trivial test: not only 0/1 values


@pytest.mark.parametrize("method", ["sd", "bv", "gbv", "mdbv", "spectr"])
def test_single_draft_laws_exact_on_underflowing_blocks(method: str) -> None:
    """At K = 1 (mdbv = gbv, spectr = sd) the conditional law of tau given the drafted block equals the
    rational-arithmetic law, to 1e-10, on blocks whose joints underflow float64 products."""
    exact_of = {"sd": exact_sd_law, "spectr": exact_sd_law, "bv": exact_bv_law,
                "gbv": lambda b: exact_last_accepted_law(exact_gbv_h(b)),
                "mdbv": lambda b: exact_last_accepted_law(exact_gbv_h(b))}[method]
    verifier = mdv.get_verifier(method)
    for seed in range(5):
        block = tiny_block(K=1, seed=seed)
        exact = exact_of(block)
        law = [0.0] * (block.L + 1)
        for br in verifier.law(block, verifier.initial_state()):
            law[int(br.tau[0])] += float(br.prob[0])
        assert max(abs(float(Fraction(x) - y)) for x, y in zip(law, exact)) < 1e-10, f"{method} seed {seed}"
        assert sum(float(y) for y in exact[1:]) > 1e-3  # the block is accepted in part with real probability


@pytest.mark.parametrize("K", [1, 2, 4])
def test_spectr_gbv_h_exact_on_underflowing_blocks(K: int) -> None:
    """SpecTr-GBV (lossless or not) must compute its own formula: its h equals rational arithmetic."""
    block = tiny_block(K=K, seed=K)
    h, dists = SpecTrGBV.h_and_dists(block)
    assert torch.isfinite(h).all() and torch.isfinite(dists).all()
    for k in range(K):
        assert max_abs_diff(h[0, k], exact_spectr_gbv_h(block, k)) < 1e-10, f"draft {k}"


@pytest.mark.parametrize("method", ALL_METHODS)
def test_every_verifier_valid_on_underflowing_blocks(method: str) -> None:
    K = 4 if mdv.VERIFIERS[method].multi_draft else 1
    verifier = mdv.get_verifier(method)
    gen = torch.Generator().manual_seed(0)
    for seed in range(4):
        block = tiny_block(K=K, seed=seed)
        state = verifier.initial_state()
        for trial in range(25):
            out = verifier.sample(block, Uniforms.draw(1, K, block.L, gen), state)
            check_outcome(verifier, block, out)
        if method != "mdbv":  # mdbv's law enumerates (L+1)^K = 17^4 exit tuples: checked at K = 2
            check_law(verifier, block, state, out)
    if method == "mdbv":
        block = tiny_block(K=2, seed=7)
        out = verifier.sample(block, Uniforms.draw(1, 2, block.L, gen), verifier.initial_state())
        check_law(verifier, block, verifier.initial_state(), out)


# ----------------------------------------------------------------------------------- high temperature
def draw_blocks(target, draft, K: int, L: int, B: int, sampling: SamplingConfig, gen: torch.Generator) -> Block:
    """B tuples of K i.i.d. draft blocks sampled along the draft model (no V^L table: L = 16 is fine)."""
    n = B * K
    seqs: list[tuple[int, ...]] = [()] * n
    qs, ps = [], []
    for _ in range(L):
        q = sampling.probs(draft.next_logprobs(seqs))
        ps.append(sampling.probs(target.next_logprobs(seqs)))
        qs.append(q)
        tok = torch.multinomial(q, 1, generator=gen).squeeze(-1).tolist()
        seqs = [s + (t,) for s, t in zip(seqs, tok)]
    ps.append(sampling.probs(target.next_logprobs(seqs)))
    V = target.vocab_size
    toks = torch.tensor(seqs, dtype=torch.long).view(B, K, L)
    return Block(toks, torch.stack(qs, 1).view(B, K, L, V), torch.stack(ps, 1).view(B, K, L + 1, V))


@pytest.mark.parametrize("method", ALL_METHODS)
@pytest.mark.parametrize("V", [3, 5])
def test_long_blocks_at_high_temperature(method: str, V: int) -> None:
    K = 3 if mdv.VERIFIERS[method].multi_draft else 1
    target = random_toy_model(V, 600 + V, zero_prob=0.2, name="target")
    draft = random_toy_model(V, 700 + V, zero_prob=0.2, name="draft")
    gen = torch.Generator().manual_seed(V)
    B = 40
    block = draw_blocks(target, draft, K, L_LONG, B, SamplingConfig(temperature=2.0), gen).validate()
    verifier = mdv.get_verifier(method)
    state = verifier.initial_state()
    if hasattr(verifier, "h_and_dists"):
        h, dists = (verifier.h_and_dists(block, state) if verifier.stateful else verifier.h_and_dists(block))
        assert torch.isfinite(h).all() and ((h >= 0) & (h <= 1)).all() and torch.isfinite(dists).all()
    uniforms = Uniforms.draw(B, K, L_LONG, gen)
    fast = verifier.sample(block, uniforms, state)
    check_outcome(verifier, block, fast)
    slow = verifier.reference(block, uniforms, state)
    assert torch.equal(fast.tau, slow.tau.long()) and torch.equal(fast.sel, slow.sel.long())
    assert torch.equal(fast.token, slow.token.long())
    if method != "mdbv":  # (L+1)^K exit tuples
        check_law(verifier, block, state, fast)
    assert int(fast.tau.max()) > 0  # at T = 2 some drafts are (partly) accepted


# ----------------------------------------------------------------------------------- oracle
ORACLE_CASES = [("sd", 1, 8), ("bv", 1, 8), ("gbv", 1, 8), ("spectr", 2, 4), ("mdbv", 2, 4)]
N_TOKENS = 3


def tiny_entry_model(seed: int, name: str) -> CallableLM:
    """A V = 2 toy with random rows, except that after about a third of the prefixes one entry is 1e-200:
    at L = 8 and T = 1 about half of the 2^8 draft blocks have joints below float64's range."""
    base = random_toy_model(2, seed, name=name)

    def fn(prefix: tuple[int, ...]) -> np.ndarray:
        v = base.probs(prefix).numpy().copy()
        key = prefix_key(prefix) + seed
        if key % 3 == 0:
            v[(key // 3) % 2] = 1e-200
            v = v / v.sum()
        return v

    return CallableLM(fn, 2, name=name)


@pytest.mark.parametrize("method,K,L", ORACLE_CASES, ids=[f"{m}-K{K}-L{L}" for m, K, L in ORACLE_CASES])
@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_exact_at_enumerable_sizes(method: str, K: int, L: int, temperature: float) -> None:
    target, draft = tiny_entry_model(31, "target"), tiny_entry_model(32, "draft")
    sampling = SamplingConfig(temperature)
    _, _, _, log_q = block_table(target, draft, L, (), sampling)
    if L == 8:  # the premise: some block joints are below float64's normal range (weights exp() to ~0)
        assert bool((log_q < math.log(1e-308)).any())
    law = exact_law(method, target, draft, K, L, N_TOKENS, temperature=temperature)
    ref = target_law(target, N_TOKENS, temperature=temperature)
    assert abs(math.fsum(law.values()) - 1.0) < 1e-9
    tv = total_variation(law, ref)
    assert tv < 1e-9, f"{method} K={K} L={L} T={temperature}: TV {tv:.3g}"
