"""Tests of ``mpbv``, greedy multi-path block verification (mdv/verify/mpbv.py; Thomas & Pal, arXiv 2602.16961).

What is checked:
* exactness across iterations by enumeration: the first L+2 tokens follow the target law (TV < 1e-9) for
  K, L in {1, 2, 3} on dense, zero-containing and context-free (tied) toys, and T = 0 is greedy matching;
* fast sampler == scalar reference on the same uniforms (random consistent blocks with ties p = q, ties
  p > q, one-hot rows and zeros; blocks whose drafts disagree on a shared prefix's rows), both tie rules;
* chi-square of the fast sampler against the exact one-iteration law (both tie rules);
* the released tie rule: the oracle measures its bias (TV from the target, recorded values);
* K = 1 is ``bv``: same law, same decisions on the same uniforms (degenerate ones included), same E[tau];
* the deepest-first sampler makes the decisions of the law's own h, bit for bit (coins at h +- 1 ulp);
* the law of the kept path, q_sel, equals a brute-force enumeration of the lexicographic maximum of K
  i.i.d. paths, and the selection picks that maximum;
* numerical robustness on long blocks and option validation.
"""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

import mdv
from mdv.errors import InvalidInputError
from mdv.oracle import exact_law, expected_accepted, iid_toy_model, iteration_law, target_law, total_variation
from mdv.oracle.enumerate import block_table
from mdv.oracle.montecarlo import chi_square_pvalue, sample_iterations
from mdv.verify.base import Block, Uniforms
from mdv.verify.bv import BlockVerification
from mdv.verify.mpbv import MultiPathBlockVerification, select_path
from tests.conftest import toy_pair

f64 = torch.float64

# (K, L) -> vocabulary size of the random toys (enumeration costs V^(K·L) tuples per iteration)
VOCAB = {(1, 1): 4, (1, 2): 3, (1, 3): 3, (2, 1): 4, (2, 2): 3, (2, 3): 2, (3, 1): 3, (3, 2): 2, (3, 3): 2}
#: Context-free pair with a tie: tokens 0 and 1 both have p > q, so r = 1 for both.
TIED_TARGET, TIED_DRAFT = [0.45, 0.35, 0.2], [0.25, 0.25, 0.5]


def tied_iid_pair(V: int):
    if V == 3:
        return iid_toy_model(TIED_TARGET, name="target"), iid_toy_model(TIED_DRAFT, name="draft")
    return iid_toy_model([0.7, 0.3], name="target"), iid_toy_model([0.4, 0.6], name="draft")


# ------------------------------------------------------------------------------------------ exactness
CASES = [(K, L, kind) for K in (1, 2, 3) for L in (1, 2, 3) for kind in ("dense", "zeros", "iid")]


@pytest.mark.parametrize("K,L,kind", CASES, ids=[f"K{K}-L{L}-{kind}" for K, L, kind in CASES])
def test_exact_target_law_across_iterations(K: int, L: int, kind: str) -> None:
    if kind == "iid":
        target, draft = tied_iid_pair(3 if K * L <= 6 else 2)
    else:
        target, draft = toy_pair(VOCAB[(K, L)], seed=40 + 10 * K + L, zeros=kind == "zeros")
    n = L + 2
    law = exact_law("mpbv", target, draft, K, L, n)
    assert abs(math.fsum(law.values()) - 1.0) < 1e-9
    tv = total_variation(law, target_law(target, n))
    assert tv < 1e-9, f"mpbv K={K} L={L} {kind}: TV {tv:.3g}"


@pytest.mark.parametrize("K", [1, 2, 3])
def test_greedy_temperature_zero_is_prefix_matching(K: int) -> None:
    target, draft = toy_pair(3, seed=8)
    for tie_rule in ("exact", "released"):
        law = exact_law("mpbv", target, draft, K, 2, 5, temperature=0.0, tie_rule=tie_rule)
        greedy = target_law(target, 5, temperature=0.0)
        assert len(greedy) == 1 and total_variation(law, greedy) < 1e-12


def test_exact_at_temperature_and_top_k() -> None:
    target, draft = toy_pair(3, seed=9, zeros=True)
    for kw in ({"temperature": 0.6}, {"temperature": 1.5, "top_k": 2}, {"temperature": 0.9, "top_p": 0.8}):
        tv = total_variation(exact_law("mpbv", target, draft, 3, 2, 4, **kw), target_law(target, 4, **kw))
        assert tv < 1e-9, f"{kw}: TV {tv:.3g}"


# ------------------------------------------------------------------------------------------ parity
def _dist(rng: np.random.Generator, V: int, zeros: float) -> np.ndarray:
    kind = rng.random()
    if kind < 0.1:  # one-hot
        v = np.zeros(V)
        v[rng.integers(V)] = 1.0
        return v
    if kind < 0.2:  # uniform
        return np.full(V, 1.0 / V)
    v = rng.dirichlet(rng.choice([0.3, 1.0, 3.0]) * np.ones(V))
    if V > 1 and rng.random() < zeros:
        v[rng.choice(V, size=rng.integers(1, V), replace=False)] = 0.0
        if v.sum() <= 0:
            v[rng.integers(V)] = 1.0
    return v / v.sum()


def consistent_block(seed: int, B: int, K: int, L: int, V: int, zeros: float = 0.3, same_pq: float = 0.2,
                     tie: float = 0.2) -> Block:
    """B instances with per-prefix random laws (drafts sharing a prefix share rows): some rows have p = q
    (every r = 1), some a target that puts more mass than q on two tokens (a tie r = 1 between them)."""
    rng = np.random.default_rng(seed)
    tokens = np.zeros((B, K, L), dtype=np.int64)
    q = np.zeros((B, K, L, V))
    p = np.zeros((B, K, L + 1, V))
    for b in range(B):
        table: dict[tuple[int, ...], tuple[np.ndarray, np.ndarray]] = {}

        def laws(u: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
            if u not in table:
                qv = _dist(rng, V, zeros)
                m = rng.random()
                if m < same_pq:
                    pv = qv.copy()
                elif m < same_pq + tie and V >= 3:
                    pv = qv.copy()
                    lo = int(np.argmax(qv))  # move mass away from the likeliest token onto the others
                    pv[lo] *= 0.3
                    pv = np.where(np.arange(V) == lo, pv, qv + (0.7 * qv[lo]) / (V - 1))
                    pv = pv / pv.sum()
                else:
                    pv = _dist(rng, V, zeros)
                table[u] = (pv, qv)
            return table[u]

        for k in range(K):
            u: tuple[int, ...] = ()
            for i in range(L + 1):
                pv, qv = laws(u)
                p[b, k, i] = pv
                if i < L:
                    q[b, k, i] = qv
                    x = int(rng.choice(V, p=qv))
                    tokens[b, k, i] = x
                    u = u + (x,)
    return Block(torch.from_numpy(tokens), torch.from_numpy(q), torch.from_numpy(p)).validate()


def inconsistent_block(seed: int, B: int, K: int, L: int, V: int) -> Block:
    """Independent rows per draft, with draft 1 repeating draft 0's first token (rows differ anyway):
    the heads' rows decide, in every view."""
    g = torch.Generator().manual_seed(seed)
    q = torch.rand(B, K, L, V, generator=g, dtype=f64) ** 3
    p = torch.rand(B, K, L + 1, V, generator=g, dtype=f64) ** 3
    q, p = q / q.sum(-1, keepdim=True), p / p.sum(-1, keepdim=True)
    q[:, :, 0], p[:, :, 0] = q[:, :1, 0], p[:, :1, 0]
    tokens = torch.multinomial(q.reshape(-1, V), 1, generator=g).view(B, K, L)
    if K > 1:
        tokens[:, 1, 0] = tokens[:, 0, 0]
    return Block(tokens, q, p).validate()


PARITY = [(K, L, V) for K in (1, 2, 3, 4) for L in (1, 2, 3, 4) for V in (2, 3, 5, 8)]


@pytest.mark.parametrize("tie_rule", ["exact", "released"])
def test_sample_matches_reference_on_same_draws(tie_rule: str) -> None:
    v = mdv.get_verifier("mpbv", tie_rule=tie_rule)
    gen = torch.Generator().manual_seed(3)
    n = 0
    for seed, (K, L, V) in enumerate(PARITY):
        for block in (consistent_block(seed, 60, K, L, V), inconsistent_block(seed, 8, K, L, V)):
            drawn = Uniforms.draw(block.B, K, L, gen)
            # coins of 0: every test with h > 0 accepts
            for uniforms in (drawn, Uniforms(torch.zeros_like(drawn.coins), drawn.draws)):
                fast, slow = v.sample(block, uniforms), v.reference(block, uniforms)
                for name in ("tau", "sel", "token"):
                    a, b = getattr(fast, name).tolist(), getattr(slow, name).tolist()
                    assert a == b, f"K={K} L={L} V={V} seed={seed}: {name} {a} != {b}"
                n += block.B
    assert n == 2 * len(PARITY) * 68  # 8,704 instances per tie rule


def test_law_is_a_probability_law_and_covers_the_samples() -> None:
    v = MultiPathBlockVerification()
    gen = torch.Generator().manual_seed(4)
    for seed, (K, L, V) in enumerate([(3, 3, 5), (4, 2, 3), (2, 4, 8), (3, 1, 2)]):
        block = consistent_block(100 + seed, 40, K, L, V)
        branches = v.law(block)
        total = torch.stack([br.prob for br in branches]).sum(0)
        torch.testing.assert_close(total, torch.ones_like(total), atol=1e-12, rtol=0)
        out = v.sample(block, Uniforms.draw(block.B, K, L, gen))
        for b in range(block.B):
            br = branches[int(out.tau[b])]
            assert float(br.prob[b]) > 0 and int(br.sel[b]) == int(out.sel[b])
            assert float(br.next_dist[b, out.token[b]]) > 0


def test_deepest_first_sampler_makes_the_decisions_of_the_law() -> None:
    """``sample`` builds rows of q_sel only where its deepest-first scan needs them; its decisions equal
    tau = max{i : eta_i < h_i} and the extra-token draw on the law's own h and next-token laws (all rows
    built at once), bit for bit, with coins placed exactly at h or one ulp either side (V up to 4096)."""
    from mdv.bench import synthetic_block
    from mdv.verify._math import categorical, last_accepted
    from mdv.verify.bv import h_and_residuals
    from mdv.verify.mpbv import skew_rows

    gen = torch.Generator().manual_seed(13)
    for V, K, L in ((300, 3, 4), (2048, 4, 5), (4096, 2, 3), (64, 5, 1)):
        for tie_rule in ("exact", "released"):
            v = MultiPathBlockVerification(tie_rule)
            block = synthetic_block(V, K, L, generator=gen).validate()
            sel, _, p, q_rows, alpha, rho, _, w = v.kept_path(block)
            h, scaled = h_and_residuals(w, p, skew_rows(p[:, :-1], q_rows, alpha, rho, K, tie_rule))
            for trial in range(12):
                u = Uniforms.draw(1, K, L, gen)
                m = torch.rand(L, generator=gen, dtype=f64)
                up = torch.nextafter(h[0], torch.full_like(h[0], 2.0))
                down = torch.nextafter(h[0], torch.full_like(h[0], -1.0))
                at = torch.where(m < 0.3, h[0], torch.where(m < 0.5, up, torch.where(m < 0.7, down, u.coins[0, 0])))
                coins = u.coins.clone()
                coins[0, 0] = at.clamp(0.0, 1.0 - 2.0 ** -53)
                u = Uniforms(coins, u.draws)
                out = v.sample(block, u)
                tau = int(last_accepted(h, coins[:, 0])[0])
                dist = p[0, L] if tau == L else normalize(scaled[0, tau], p[0, tau])
                assert (int(out.tau[0]), int(out.sel[0])) == (tau, int(sel[0]))
                assert int(out.token[0]) == int(categorical(dist, u.draws[0, tau]))


def normalize(res: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    from mdv.verify._math import normalize_or
    return normalize_or(res.clone(), fallback)


# ------------------------------------------------------------------------------------------ chi-square
@pytest.mark.parametrize("tie_rule", ["exact", "released"])
def test_fast_sampler_matches_exact_law(tie_rule: str) -> None:
    target, draft = tied_iid_pair(3)
    for (K, L), (tgt, drf) in (((3, 2), toy_pair(3, seed=5, zeros=True)), ((2, 3), (target, draft))):
        law = iteration_law("mpbv", tgt, drf, K, L, tie_rule=tie_rule)
        counts = sample_iterations("mpbv", tgt, drf, K, L, 400_000, seed=17, tie_rule=tie_rule)
        p_value = chi_square_pvalue(counts, law)
        assert p_value > 1e-3, f"K={K} L={L} {tie_rule}: chi-square p = {p_value:.3g} over {len(law)} outcomes"


# ------------------------------------------------------------------------------------------ released rule
#: TV of the first L+2 tokens from the target, mpbv(tie_rule="released"), measured by the oracle:
#: (toy, K, L) -> TV.  "iid" is the tied context-free pair; "rand" random_toy_model(3, 1000+s/2000+s) s = 22.
RELEASED_TV = {("iid", 2, 2): 0.06618395054334388, ("iid", 3, 2): 0.12052876226686775,
               ("rand", 2, 2): 0.012746514660874942}


def _toy(name: str):
    return tied_iid_pair(3) if name == "iid" else toy_pair(3, seed=22)


@pytest.mark.parametrize("toy,K,L", list(RELEASED_TV))
def test_released_tie_rule_is_biased(toy: str, K: int, L: int) -> None:
    target, draft = _toy(toy)
    ref = target_law(target, L + 2)
    tv_released = total_variation(exact_law("mpbv", target, draft, K, L, L + 2, tie_rule="released"), ref)
    tv_exact = total_variation(exact_law("mpbv", target, draft, K, L, L + 2), ref)
    print(f"{toy} K={K} L={L}: TV released {tv_released:.6g}, exact {tv_exact:.3g}")
    assert tv_exact < 1e-9
    assert tv_released > 1e-3
    assert tv_released == pytest.approx(RELEASED_TV[(toy, K, L)], abs=1e-9)


def test_released_is_flagged_and_options_are_validated() -> None:
    assert mdv.VERIFIERS["mpbv"].lossless is True
    assert mdv.get_verifier("mpbv").lossless is True
    assert mdv.get_verifier("mpbv", tie_rule="released").lossless is False
    assert mdv.VERIFIERS["mpbv"].multi_draft and not mdv.VERIFIERS["mpbv"].stateful
    for bad in ("first", "", None, 1):
        with pytest.raises(InvalidInputError, match="tie_rule"):
            mdv.get_verifier("mpbv", tie_rule=bad)


def test_released_rule_differs_from_exact_only_on_ties() -> None:
    """Without ties in r the two rules make the same decisions: rows with p(x) ∝ q(x) t(x), t continuous in
    (0, 1) except one token with t = 1000 -- exactly one token has r = 1, the others distinct r < 1."""
    gen = torch.Generator().manual_seed(6)
    B, K, L, V = 300, 3, 3, 6
    q = torch.rand(B, K, L + 1, V, generator=gen, dtype=f64) + 0.05
    q = q / q.sum(-1, keepdim=True)
    t = torch.rand(B, K, L + 1, V, generator=gen, dtype=f64)
    t.scatter_(-1, torch.randint(0, V, (B, K, L + 1, 1), generator=gen), 1000.0)
    p = q * t / (q * t).sum(-1, keepdim=True)
    q, p = q[:, :, :L].contiguous(), p.contiguous()
    q[:, :, 0], p[:, :, 0] = q[:, :1, 0], p[:, :1, 0]
    tokens = torch.multinomial(q.reshape(-1, V), 1, generator=gen).view(B, K, L)
    block = Block(tokens, q, p).validate()
    exact, released = MultiPathBlockVerification("exact"), MultiPathBlockVerification("released")
    u = Uniforms.draw(B, K, L, gen)
    a, b = exact.sample(block, u), released.sample(block, u)
    assert torch.equal(a.sel, b.sel) and torch.equal(a.tau, b.tau) and torch.equal(a.token, b.token)
    for x, y in zip(exact.law(block), released.law(block)):
        torch.testing.assert_close(x.prob, y.prob, atol=1e-14, rtol=0)


# ------------------------------------------------------------------------------------------ K = 1 is bv
def test_k1_equals_bv() -> None:
    gen = torch.Generator().manual_seed(8)
    bv, mp = BlockVerification(), MultiPathBlockVerification()
    for seed, (L, V) in enumerate([(1, 3), (3, 5), (4, 2), (6, 8)]):
        block = consistent_block(200 + seed, 50, 1, L, V)
        for x, y in zip(bv.law(block), mp.law(block)):
            assert torch.equal(x.prob, y.prob) and torch.equal(x.tau, y.tau) and torch.equal(x.next_dist, y.next_dist)
            assert torch.equal(x.sel, y.sel)
        drawn = Uniforms.draw(block.B, 1, L, gen)
        top = 1.0 - 2.0 ** -53
        for u in (drawn, Uniforms(torch.zeros_like(drawn.coins), torch.zeros_like(drawn.draws)),
                  Uniforms(torch.full_like(drawn.coins, top), torch.full_like(drawn.draws, top))):
            a, b = bv.sample(block, u), mp.sample(block, u)
            assert torch.equal(a.tau, b.tau) and torch.equal(a.sel, b.sel) and torch.equal(a.token, b.token)
            r = mp.reference(block, u)
            assert torch.equal(a.tau, r.tau) and torch.equal(a.token, r.token)
    target, draft = toy_pair(3, seed=2, zeros=True)
    for L in (1, 2, 3):
        assert expected_accepted("mpbv", target, draft, 1, L) == expected_accepted("bv", target, draft, 1, L)


# ------------------------------------------------------------------------------------------ the skew law
def _brute_force_max_law(tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor, log_q: torch.Tensor, K: int,
                         released: bool) -> np.ndarray:
    """P(max of K i.i.d. blocks = block n) by enumerating all K-tuples, comparing blocks pairwise in the
    lexicographic order of keys (r, -x) (or (r, +x)) read from the rows at their common prefix."""
    N, L = tokens.shape

    def key(n: int, i: int) -> tuple[float, int]:
        x = int(tokens[n, i])
        pv, qv = float(p[n, i, x]), float(q[n, i, x])
        r = 0.0 if pv <= 0 else (1.0 if qv <= 0 else min(1.0, pv / qv))
        return (r, x if released else -x)

    def greater(a: int, b: int) -> bool:
        for i in range(L):
            if int(tokens[a, i]) != int(tokens[b, i]):
                return key(a, i) > key(b, i)
        return False

    w = log_q.exp().numpy()
    law = np.zeros(N)
    for tup in itertools.product(range(N), repeat=K):
        best = tup[0]
        for n in tup[1:]:
            if greater(n, best):
                best = n
        law[best] += float(np.prod(w[list(tup)]))
    return law


@pytest.mark.parametrize("K,L,V,toy", [(2, 2, 3, "iid"), (3, 2, 3, "zeros"), (2, 3, 3, "dense"), (4, 2, 2, "dense"),
                                       (3, 3, 2, "zeros")])
def test_skew_law_is_the_law_of_the_lexicographic_maximum(K: int, L: int, V: int, toy: str) -> None:
    target, draft = tied_iid_pair(V) if toy == "iid" else toy_pair(V, seed=30 + K + L, zeros=toy == "zeros")
    toks, q, p, log_q = block_table(target, draft, L)  # every block with Q > 0, its rows, log Q
    N = toks.shape[0]
    for tie_rule in ("exact", "released"):
        v = MultiPathBlockVerification(tie_rule)
        brute = _brute_force_max_law(toks, q, p, log_q, K, tie_rule == "released")
        assert brute.sum() == pytest.approx(1.0, abs=1e-12)
        # q_sel along block n (K copies of it: the kept path is n) multiplied out = P(max = n)
        same = Block(toks[:, None].expand(N, K, L), q[:, None].expand(N, K, L, V), p[:, None].expand(N, K, L + 1, V))
        _, _, _, q_sel, log_q_tok = v.selected(same)
        torch.testing.assert_close(q_sel.sum(-1), torch.ones(N, L, dtype=f64), atol=1e-12, rtol=0)
        np.testing.assert_allclose(log_q_tok.sum(-1).exp().numpy(), brute, atol=1e-13, rtol=1e-10)
        # the full rows are the conditionals of that law: q_sel(x | u) = Pr(u·x ⪯ M) / Pr(u ⪯ M)
        for i in range(L):
            for n in range(N):
                u = tuple(toks[n, :i].tolist())
                m_u = sum(brute[m] for m in range(N) if tuple(toks[m, :i].tolist()) == u)
                for x in range(V):
                    m_ux = sum(brute[m] for m in range(N) if tuple(toks[m, :i + 1].tolist()) == u + (x,))
                    assert float(q_sel[n, i, x]) == pytest.approx(m_ux / m_u, abs=1e-12)
    # the exact rule's selection picks that maximum on every tuple (the released one's does not, on ties)
    brute = _brute_force_max_law(toks, q, p, log_q, K, False)
    idx = torch.cartesian_prod(*[torch.arange(N)] * K).reshape(-1, K)
    sel, _ = select_path(Block(toks[idx], q[idx], p[idx]), "exact")
    kept = idx.gather(1, sel[:, None]).squeeze(1)
    law = np.zeros(N)
    np.add.at(law, kept.numpy(), log_q[idx].sum(-1).exp().numpy())
    np.testing.assert_allclose(law, brute, atol=1e-14)


# ------------------------------------------------------------------------------------------ numerics
def test_long_blocks_and_many_drafts_stay_finite() -> None:
    """Joints of L = 48 blocks over V = 40 underflow float64's product range; the scale-free recursion
    and the log-space kept-token law keep every view finite and normalised."""
    v = MultiPathBlockVerification()
    block = consistent_block(9, 3, 8, 48, 40, zeros=0.1)
    _, _, _, q_sel, log_q_tok = v.selected(block)
    assert torch.isfinite(q_sel).all() and torch.isfinite(log_q_tok).all()
    torch.testing.assert_close(q_sel.sum(-1), torch.ones(3, 48, dtype=f64), atol=1e-9, rtol=0)
    total = torch.stack([br.prob for br in v.law(block)]).sum(0)
    torch.testing.assert_close(total, torch.ones_like(total), atol=1e-12, rtol=0)
    out = v.sample(block, Uniforms.draw(3, 8, 48, torch.Generator().manual_seed(1)))
    assert ((out.tau >= 0) & (out.tau <= 48)).all()


def test_kept_token_below_float_range() -> None:
    """All drafts on the lowest-ranked token of q = 1e-300 mass: q_sel of the kept token is ~1e-900
    (underflows), its log stays finite, and p = 0 there gives w = 0 rather than NaN."""
    V, K, L = 3, 4, 2
    q = torch.tensor([1e-300, 0.5, 0.5 - 1e-300], dtype=f64)
    for p0 in (0.0, 1e-301):
        p = torch.tensor([p0, 0.5, 0.5 - p0], dtype=f64)
        block = Block(torch.zeros(1, K, L, dtype=torch.long), q.expand(1, K, L, V).clone(),
                      p.expand(1, K, L + 1, V).clone()).validate()
        v = MultiPathBlockVerification()
        _, _, _, q_sel, log_q_tok = v.selected(block)
        assert torch.isfinite(log_q_tok).all()
        assert float(log_q_tok[0, 0]) == pytest.approx(K * math.log(1e-300), rel=1e-9)
        branches = v.law(block)
        probs = torch.stack([br.prob for br in branches])
        assert torch.isfinite(probs).all() and float(probs.sum()) == pytest.approx(1.0, abs=1e-12)
        for br in branches:
            assert torch.isfinite(br.next_dist).all()
