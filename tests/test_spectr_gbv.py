"""SpecTr-GBV as released (algorithms.md §6.2-§6.4, §6.7, §12.9-§12.13).

* parity: the vectorised sampler (H replaced by the prefix-sharing test) and the literal transcription
  with an explicit H set agree outcome for outcome on the same uniforms;
* the exact law (dynamic program over drafts) equals a brute-force branching over every coin with a
  literal H set, sums to 1, and matches 10^6 samples (chi-square);
* the published numbers of Example C (§6.4) and of the random toys in the reference run, the bias
  (not lossless), K = 1 = GBV without adjustment, T = 0 = greedy longest-prefix matching, numerics.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import chi2

from mdv.oracle import (enumerate_block, exact_law, expected_accepted, iid_toy_model, random_toy_model, target_law,
                        total_variation)
from mdv.verify.base import Block, Uniforms
from mdv.verify.spectr_gbv import SpecTrGBV, longest_shared_prefix


# ---------------------------------------------------------------------------------------------- helpers
@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """These tensors are tiny: intra-op threads only add overhead (a lot of it on a loaded 2-core box)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def random_blocks(seed: int, B: int, K: int, L: int, V: int, *, onehot: float = 0.15, zeros: float = 0.15,
                  dup: float = 0.35, greedy: bool = False) -> Block:
    """B instances, each with its own random prefix-function target and draft (rows are functions of the
    prefix, so drafts sharing a prefix share their rows).  Drafts are sampled from q; with probability
    ``dup`` a draft first copies a random-length prefix of an earlier draft (so H matters).  Rows are
    one-hot w.p. ``onehot`` (always when ``greedy``: T = 0) and lose a random entry w.p. ``zeros``."""
    rng = np.random.default_rng(seed)
    tokens = np.zeros((B, K, L), dtype=np.int64)
    q = np.zeros((B, K, L, V))
    p = np.zeros((B, K, L + 1, V))
    for b in range(B):
        rows: dict[tuple, np.ndarray] = {}

        def row(which: str, prefix: tuple[int, ...]) -> np.ndarray:
            key = (which, prefix)
            if key not in rows:
                if greedy or rng.random() < onehot:
                    v = np.zeros(V)
                    v[rng.integers(V)] = 1.0
                else:
                    v = rng.dirichlet(0.6 * np.ones(V))
                    if V > 1 and rng.random() < zeros:
                        v[rng.integers(V)] = 0.0
                    v = v / v.sum()
                rows[key] = v
            return rows[key]

        drafts: list[list[int]] = []
        for k in range(K):
            d: list[int] = []
            if k > 0 and rng.random() < dup:
                d = list(drafts[int(rng.integers(k))][:int(rng.integers(1, L + 1))])
            while len(d) < L:
                qq = row("q", tuple(d))
                d.append(int(rng.choice(V, p=qq)))
            drafts.append(d)
            tokens[b, k] = d
            for i in range(L):
                q[b, k, i] = row("q", tuple(d[:i]))
            for i in range(L + 1):
                p[b, k, i] = row("p", tuple(d[:i]))
    return Block(torch.from_numpy(tokens), torch.from_numpy(q), torch.from_numpy(p)).validate()


def branching_law(block: Block, h: torch.Tensor, b: int) -> dict[tuple[int, int], float]:
    """Brute force over every coin of instance b with a literal H set (like the reference enumeration of
    algorithms.md §6.4): {(tau, sel): probability}.  h: [B, K, L] from SpecTrGBV.h_and_dists."""
    K, L = block.K, block.L
    D = [tuple(int(x) for x in block.tokens[b, k].tolist()) for k in range(K)]
    out: dict[tuple[int, int], float] = {}

    def run(k: int, i: int | None, tau: int, sel: int, H: frozenset, mass: float) -> None:
        if mass <= 0.0:
            return
        if k == K:
            out[(tau, sel)] = out.get((tau, sel), 0.0) + mass
            return
        if i is None:
            i = tau + 1
        if i <= L - 1:
            u = D[k][:i]
            if u in H:
                run(k, i + 1, tau, sel, H, mass)
                return
            hv = float(h[b, k, i - 1])
            run(k, i + 1, i, k, H, mass * hv)
            run(k, i + 1, tau, sel, H | {u}, mass * (1.0 - hv))
            return
        hv = float(h[b, k, L - 1])
        out[(L, k)] = out.get((L, k), 0.0) + mass * hv
        run(k + 1, None, tau, sel, H, mass * (1.0 - hv))

    run(0, None, 0, 0, frozenset(), 1.0)
    return out


def law_table(block: Block) -> tuple[dict[tuple[int, int], torch.Tensor], dict[tuple[int, int], torch.Tensor]]:
    """{(tau, sel): prob [B]} and {(tau, sel): next_dist [B, V]} from SpecTrGBV.law."""
    probs, dists = {}, {}
    for br in SpecTrGBV().law(block):
        assert bool((br.tau == br.tau[0]).all()) and bool((br.sel == br.sel[0]).all())
        key = (int(br.tau[0]), int(br.sel[0]))
        assert key not in probs
        probs[key], dists[key] = br.prob, br.next_dist
    return probs, dists


# ---------------------------------------------------------------------------------------------- structure
def test_flags() -> None:
    v = SpecTrGBV()
    assert v.name == "spectr_gbv" and v.multi_draft and not v.lossless and not v.stateful
    v.check_drafts(4)


def test_longest_shared_prefix() -> None:
    tokens = torch.tensor([[[0, 1, 2], [0, 1, 0], [1, 1, 2], [0, 1, 2], [0, 2, 2]]])
    assert longest_shared_prefix(tokens).tolist() == [[0, 2, 0, 3, 1]]


# ---------------------------------------------------------------------------------------------- parity
@pytest.mark.parametrize("K", [1, 2, 3, 5])
def test_sample_matches_reference(K: int) -> None:
    """Same uniforms -> identical (tau, sel, token): confirms that skipping u ∈ H equals skipping the
    lengths shared with an earlier draft (module docstring), incl. duplicated drafts and one-hot rows."""
    v = SpecTrGBV()
    gen = torch.Generator().manual_seed(100 + K)
    n_shared = n_nontrivial = 0
    for L in (2, 3, 6):
        for V in (2, 3, 40):
            B = 200
            block = random_blocks(1000 * K + 10 * L + V, B, K, L, V)
            uni = Uniforms.draw(B, K, L, gen)
            fast, ref = v.sample(block, uni), v.reference(block, uni)
            assert torch.equal(fast.tau, ref.tau), (L, V)
            assert torch.equal(fast.sel, ref.sel), (L, V)
            assert torch.equal(fast.token, ref.token), (L, V)
            assert bool((fast.sel[fast.tau == 0] == 0).all())
            n_shared += int((longest_shared_prefix(block.tokens) > 0).sum())
            n_nontrivial += int(((fast.tau > 0) & (fast.tau < L)).sum())
    assert n_nontrivial > 100
    if K > 1:
        assert n_shared > 200  # the H test is exercised


def test_greedy_blocks_parity() -> None:
    v = SpecTrGBV()
    gen = torch.Generator().manual_seed(7)
    for K, L, V in ((1, 3, 3), (3, 4, 5), (5, 6, 40)):
        block = random_blocks(77 + K, 100, K, L, V, greedy=True)
        uni = Uniforms.draw(100, K, L, gen)
        fast, ref = v.sample(block, uni), v.reference(block, uni)
        assert torch.equal(fast.tau, ref.tau) and torch.equal(fast.sel, ref.sel) and torch.equal(fast.token, ref.token)


def test_skip_shared_subblocks() -> None:
    """Draft 2 shares (0,) and (0,0) with draft 1, whose tests of them were rejected: they are in H and
    draft 2 does not test them, even though its coins would accept them (h > 0)."""
    p = torch.tensor([0.5, 0.5], dtype=torch.float64)
    q = torch.tensor([0.25, 0.75], dtype=torch.float64)
    tokens = torch.tensor([[[0, 0, 0], [0, 0, 1]]])
    block = Block(tokens, q.expand(1, 2, 3, 2).clone(), p.expand(1, 2, 4, 2).clone()).validate()
    h, _ = SpecTrGBV.h_and_dists(block)
    assert float(h[0, 1, 0]) > 0.1 and float(h[0, 1, 1]) > 0.1
    coins = torch.tensor([[[1 - 1e-12] * 3, [0.0, 0.0, 1 - 1e-12]]], dtype=torch.float64)
    uni = Uniforms(coins, torch.full((1, 4), 0.5, dtype=torch.float64))
    for out in (SpecTrGBV().sample(block, uni), SpecTrGBV().reference(block, uni)):
        assert int(out.tau[0]) == 0 and int(out.sel[0]) == 0
    # the same coins on a draft 2 with another first token: its sub-blocks are tested and accepted
    block2 = Block(torch.tensor([[[0, 0, 0], [1, 0, 1]]]), block.q, block.p)
    h2, _ = SpecTrGBV.h_and_dists(block2)
    assert float(h2[0, 1, 1]) > 0
    for out in (SpecTrGBV().sample(block2, uni), SpecTrGBV().reference(block2, uni)):
        assert int(out.tau[0]) == 2 and int(out.sel[0]) == 1


# ---------------------------------------------------------------------------------------------- exact law
@pytest.mark.parametrize("K,L,V", [(1, 4, 3), (2, 3, 2), (3, 3, 3), (4, 4, 2), (5, 2, 3)])
def test_law_equals_brute_force(K: int, L: int, V: int) -> None:
    block = random_blocks(500 + K, 60, K, L, V, dup=0.5)
    h, dists = SpecTrGBV.h_and_dists(block)
    assert torch.isfinite(h).all() and bool(((h >= 0) & (h <= 1)).all())
    probs, next_dists = law_table(block)
    total = sum(probs.values())
    assert torch.allclose(total, torch.ones_like(total), atol=1e-12, rtol=0)
    assert all(bool((pr >= 0).all()) for pr in probs.values())
    for key, nd in next_dists.items():
        assert torch.isfinite(nd).all() and torch.allclose(nd.sum(-1), torch.ones(block.B, dtype=torch.float64))
    for b in range(block.B):
        brute = branching_law(block, h, b)
        for key in set(brute) | set(probs):
            want = brute.get(key, 0.0)
            got = float(probs[key][b]) if key in probs else 0.0
            assert abs(got - want) < 1e-12, (b, key, got, want)


@pytest.mark.parametrize("case", [0, 1, 2])
def test_law_matches_monte_carlo(case: int) -> None:
    """10^6 draws on one fixed block vs the exact law: Pearson chi-square over the (tau, sel, token) cells
    with expected count >= 5 (the rest pooled), significance level 1e-3 (fixed seeds: deterministic);
    cells of probability 0 must never be drawn.

    The draws use :meth:`SpecTrGBV.scan` on h, dists computed once (all trials share the block, and these
    are elementwise in B); a first batch checks that this is exactly what :meth:`sample` returns."""
    K, L, V = [(3, 3, 3), (2, 4, 2), (5, 2, 3)][case]
    block = None
    for seed in range(50):  # the first block (fixed seeds) whose drafts share prefixes and whose law is spread
        cand = random_blocks(9000 + 100 * case + seed, 1, K, L, V, onehot=0.0, zeros=0.0, dup=1.0)
        probs, _ = law_table(cand)
        if int(longest_shared_prefix(cand.tokens).max()) >= 1 and sum(float(v[0]) > 0.02 for v in probs.values()) >= 4:
            block = cand
            break
    assert block is not None
    probs, next_dists = law_table(block)
    keys = sorted(probs)
    expected = torch.stack([probs[k][0] * next_dists[k][0] for k in keys])  # [cells, V]
    tau_sel_index = torch.full((L + 1, K), -1, dtype=torch.long)
    for n, (t, s) in enumerate(keys):
        tau_sel_index[t, s] = n

    n_total, chunk = 1_000_000, 250_000
    gen = torch.Generator().manual_seed(31337 + case)
    h, dists = SpecTrGBV.h_and_dists(block)
    shared = longest_shared_prefix(block.tokens)
    h, dists, shared = h.expand(chunk, -1, -1), dists.expand(chunk, -1, -1, -1), shared.expand(chunk, -1)
    small = 2000
    uni = Uniforms.draw(small, K, L, gen)
    big = Block(block.tokens.expand(small, K, L), block.q.expand(small, K, L, V), block.p.expand(small, K, L + 1, V))
    a, b = SpecTrGBV().sample(big, uni), SpecTrGBV.scan(h[:small], dists[:small], shared[:small], uni)
    assert torch.equal(a.tau, b.tau) and torch.equal(a.sel, b.sel) and torch.equal(a.token, b.token)

    counts = torch.zeros(len(keys) * V, dtype=torch.float64)
    for _ in range(n_total // chunk):
        out = SpecTrGBV.scan(h, dists, shared, Uniforms.draw(chunk, K, L, gen))
        cell = tau_sel_index[out.tau, out.sel]
        assert bool((cell >= 0).all())
        counts += torch.bincount(cell * V + out.token, minlength=len(keys) * V).to(torch.float64)
    exp_counts = (n_total * expected).flatten()
    assert float(counts[exp_counts == 0].sum()) == 0.0
    big_cells = exp_counts >= 5
    e = torch.cat([exp_counts[big_cells], exp_counts[~big_cells].sum().reshape(1)])
    o = torch.cat([counts[big_cells], counts[~big_cells].sum().reshape(1)])
    keep = e > 0
    stat = float((((o - e) ** 2)[keep] / e[keep]).sum())
    dof = int(keep.sum()) - 1
    assert dof >= 5
    assert chi2.sf(stat, dof) > 1e-3, (stat, dof)


# ---------------------------------------------------------------------------------------------- §6.4 numbers
def _example_c_stats(K: int) -> tuple[float, float]:
    """E[tau] and Pr(accepted prefix = (1, 1)) of one iteration: sum over draft tuples of
    prod_k Q(d_k) x branch probabilities (enumerate_block lists every tuple)."""
    T, D = iid_toy_model([0.5, 0.5]), iid_toy_model([0.25, 0.75])
    block, weights = enumerate_block(T, D, K, 2)
    assert abs(float(weights.sum()) - 1.0) < 1e-12
    e_tau = acc11 = 0.0
    rows = torch.arange(block.B)
    for br in SpecTrGBV().law(block):
        kept = block.tokens[rows, br.sel]  # [B, L]
        e_tau += float((weights * br.prob * br.tau).sum())
        is11 = (br.tau == 2) & (kept[:, 0] == 1) & (kept[:, 1] == 1)
        acc11 += float((weights * br.prob * is11).sum())
    return e_tau, acc11


@pytest.mark.parametrize("K,e_tau,acc11,tv3", [(1, 1.4375, 0.2500, 0.0625), (2, 1.5064, 0.2628, 0.0731),
                                                (3, 1.6000, 0.2995, 0.0951)])
def test_example_c(K: int, e_tau: float, acc11: float, tv3: float) -> None:
    """algorithms.md §6.4: target (.5,.5), draft (.25,.75), L = 2.  At K >= 2 the prefix (1,1) is accepted
    more often than the target generates it (0.25): the released rule is biased."""
    got_tau, got_acc11 = _example_c_stats(K)
    assert got_tau == pytest.approx(e_tau, abs=5e-5)
    assert got_acc11 == pytest.approx(acc11, abs=5e-5)
    assert expected_accepted("spectr_gbv", iid_toy_model([0.5, 0.5]), iid_toy_model([0.25, 0.75]), K, 2) == \
        pytest.approx(got_tau, abs=1e-12)
    if K >= 2:
        assert got_acc11 > 0.25 + 0.01
    T, D = iid_toy_model([0.5, 0.5]), iid_toy_model([0.25, 0.75])
    tv = total_variation(exact_law(SpecTrGBV(), T, D, K, 2, 3), target_law(T, 3))
    assert tv == pytest.approx(tv3, abs=5e-5)


@pytest.mark.parametrize("seed,K,e_tau", [(0, 2, 1.0018), (0, 3, 1.0346), (1, 2, 1.0738), (1, 3, 1.1880),
                                          (2, 2, 1.3795), (2, 3, 1.4624)])
def test_random_toys_reference_numbers(seed: int, K: int, e_tau: float) -> None:
    """E[tau] of the released rule on the reference run's context-dependent toys (V=3, L=2; target seed
    100+s, draft seed 200+s), algorithms.md §6.4."""
    P, Q = random_toy_model(3, 100 + seed), random_toy_model(3, 200 + seed)
    assert expected_accepted(SpecTrGBV(), P, Q, K, 2) == pytest.approx(e_tau, abs=5e-5)


def test_random_toy_bias() -> None:
    """Not lossless on a context-dependent toy either: TV over 4 tokens 0.089 (reference run, seed 0, K=2)."""
    P, Q = random_toy_model(3, 100), random_toy_model(3, 200)
    tv = total_variation(exact_law(SpecTrGBV(), P, Q, 2, 2, 4), target_law(P, 4))
    assert tv == pytest.approx(0.089, abs=5e-4)


# ---------------------------------------------------------------------------------------------- K = 1
def test_k1_equals_gbv_without_adjustment() -> None:
    """At K = 1, phi_1 = min(P, Q) and A_1 = Q: the rule is GBV's (§5), without its target adjustment."""
    from mdv.verify.gbv import GreedyBlockVerification

    gbv = GreedyBlockVerification(adjust_target=False)
    gen = torch.Generator().manual_seed(5)
    for L, V in ((2, 2), (3, 3), (5, 6)):
        block = random_blocks(3000 + L, 300, 1, L, V)
        mine, _ = law_table(block)
        theirs = {int(br.tau[0]): br for br in gbv.law(block, gbv.initial_state())}
        _, dists = law_table(block)
        for t in range(L + 1):
            assert torch.allclose(mine[(t, 0)], theirs[t].prob, atol=1e-12, rtol=0)
            live = mine[(t, 0)] > 1e-9
            assert torch.allclose(dists[(t, 0)][live], theirs[t].next_dist[live], atol=1e-10, rtol=0)
        uni = Uniforms.draw(300, 1, L, gen)
        a, b = SpecTrGBV().sample(block, uni), gbv.sample(block, uni, gbv.initial_state())
        assert torch.equal(a.tau, b.tau) and torch.equal(a.token, b.token)


def test_k1_bv_example_bias() -> None:
    """§5: BV example (target (1/3,2/3), draft (2/3,1/3), L=2): first two tokens (1/9, 2/9, 1/3, 1/3)."""
    law = exact_law(SpecTrGBV(), iid_toy_model([1 / 3, 2 / 3]), iid_toy_model([2 / 3, 1 / 3]), 1, 2, 2)
    want = {(0, 0): 1 / 9, (0, 1): 2 / 9, (1, 0): 1 / 3, (1, 1): 1 / 3}
    assert total_variation(law, want) < 1e-12


# ---------------------------------------------------------------------------------------------- T = 0, numerics
def test_greedy_is_longest_prefix_matching() -> None:
    """T = 0 (§6.7): all drafts identical; tau = longest prefix agreeing with the target argmax path,
    sel = 0, the extra token is the target argmax; the law is one branch of probability 1, no NaN."""
    for K, L, V in ((1, 4, 3), (3, 4, 2), (4, 6, 5)):
        block = random_blocks(4242 + K, 150, K, L, V, greedy=True)
        assert bool((block.tokens == block.tokens[:, :1]).all())
        h, dists = SpecTrGBV.h_and_dists(block)
        assert torch.isfinite(h).all() and torch.isfinite(dists).all()
        argmax = block.p[:, 0].argmax(-1)  # [B, L+1]
        match = (block.tokens[:, 0] == argmax[:, :L]).long().cumprod(-1).sum(-1)  # [B]
        rows = torch.arange(block.B)
        out = SpecTrGBV().sample(block, Uniforms.draw(block.B, K, L, torch.Generator().manual_seed(K)))
        assert torch.equal(out.tau, match) and bool((out.sel == 0).all())
        assert torch.equal(out.token, argmax[rows, match])
        probs, _ = law_table(block)
        for (t, s), pr in probs.items():
            assert torch.isfinite(pr).all()
            want = ((match == t) & (s == 0)).to(torch.float64)
            assert torch.equal(pr, want), (t, s)
        assert bool((match > 0).any()) and bool((match < L).any())


def test_underflowing_joints_stay_finite() -> None:
    """Drafted tokens of probability ~1e-40 (Q(D) = 1e-480 underflows in float64): h stays finite, and
    h_L = phi/A = P(D)[1 - (1 - r)^K] / (K Q(D)) = [1 - (1 - r)^K] / (K r) with r = Q(D)/P(D) = 2^-L
    (A_K(D) = K Q(D) to first order in Q(D))."""
    L, K = 12, 3
    q_row = torch.tensor([1e-40, 0.5, 0.5 - 1e-40], dtype=torch.float64)
    p_row = torch.tensor([2e-40, 0.3, 0.7 - 2e-40], dtype=torch.float64)
    block = Block(torch.zeros(1, K, L, dtype=torch.long), q_row.expand(1, K, L, 3).clone(),
                  p_row.expand(1, K, L + 1, 3).clone()).validate()
    h, dists = SpecTrGBV.h_and_dists(block)
    assert torch.isfinite(h).all() and torch.isfinite(dists).all()
    r = 2.0 ** -L
    assert float(h[0, 0, -1]) == pytest.approx((1 - (1 - r) ** K) / (K * r), rel=1e-12)
    total = sum(br.prob for br in SpecTrGBV().law(block))
    assert float(total[0]) == pytest.approx(1.0, abs=1e-12)


def test_large_vocabulary_smoke() -> None:
    """The engine's scale: V = 49152, L = 12, K = 8, one instance."""
    V, L, K = 49152, 12, 8
    gen = torch.Generator().manual_seed(0)
    q = torch.softmax(3.0 * torch.randn(1, K, L, V, generator=gen, dtype=torch.float64), -1)
    p = torch.softmax(3.0 * torch.randn(1, K, L + 1, V, generator=gen, dtype=torch.float64), -1)
    tokens = torch.multinomial(q.reshape(-1, V), 1, generator=gen).reshape(1, K, L)
    tokens[0, 1, :5] = tokens[0, 0, :5]  # a shared prefix (rows differ here; fine for a smoke test)
    block = Block(tokens, q, p).validate()
    v = SpecTrGBV()
    out = v.sample(block, Uniforms.draw(1, K, L, gen))
    assert 0 <= int(out.tau[0]) <= L and 0 <= int(out.token[0]) < V
    total = sum(br.prob for br in v.law(block))
    assert float(total[0]) == pytest.approx(1.0, abs=1e-12)
