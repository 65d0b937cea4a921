"""mdv.paired.stats: cluster-bootstrap coverage (and the under-coverage of an i.i.d. bootstrap on
clustered data), the ratio estimator, pairing, the verdict rules and their order, needed_clusters,
determinism and input errors.  numpy only; the whole file runs in about a second."""
from __future__ import annotations

import math
import time

import numpy as np
import pytest

from mdv.errors import InvalidInputError
from mdv.paired.stats import (Estimate, Verdict, _multiplicities, cluster_bootstrap, paired_difference,
                              verdict)

TRUE_MEAN = 2.0


def clustered(rng: np.random.Generator, G: int, sd_cluster: float = 1.0, sd_noise: float = 0.5):
    """G clusters of 5..15 contexts: v = TRUE_MEAN + u_cluster + e (ICC = 1 / 1.25 = 0.8)."""
    sizes = rng.integers(5, 16, size=G)
    cl = np.repeat(np.arange(G), sizes)
    u = rng.normal(0.0, sd_cluster, size=G)
    return TRUE_MEAN + u[cl] + rng.normal(0.0, sd_noise, size=cl.size), cl


# ------------------------------------------------------------------------------------- (1) coverage

def test_cluster_bootstrap_covers_and_iid_bootstrap_undercovers():
    """300 data sets of 40 clusters with strong intra-cluster correlation.  Measured (this seed):
    cluster bootstrap 0.923 (0.937 over 2000 repetitions), i.i.d. bootstrap 0.443."""
    rng = np.random.default_rng(123)
    reps, hit_cluster, hit_iid = 300, 0, 0
    for r in range(reps):
        v, cl = clustered(rng, 40)
        e = cluster_bootstrap(v, cl, n_boot=400, seed=r)
        hit_cluster += e.lo < TRUE_MEAN < e.hi
        naive = cluster_bootstrap(v, np.arange(v.size), n_boot=400, seed=r)  # every context its own cluster
        hit_iid += naive.lo < TRUE_MEAN < naive.hi
        assert e.n == v.size and e.n_clusters == 40 and naive.n_clusters == v.size
    cov_cluster, cov_iid = hit_cluster / reps, hit_iid / reps
    assert 0.90 <= cov_cluster <= 0.99, cov_cluster
    assert cov_iid < 0.75, cov_iid
    assert cov_cluster - cov_iid > 0.3, (cov_cluster, cov_iid)


def test_vectorised_bootstrap_matches_explicit_resampling():
    """The [B, G] matrix form equals pooling the contexts of the drawn clusters, resample by resample
    (same RNG stream), for the ratio estimator with unsorted string labels and unequal cluster sizes."""
    rng = np.random.default_rng(5)
    labels = np.array(["p7", "p2", "p9", "p0", "p5", "p3"])
    cl = labels[rng.integers(0, labels.size, size=60)]
    v = rng.normal(size=60)
    r = rng.uniform(0.5, 2.0, size=60)
    B, seed = 150, 11
    e = cluster_bootstrap(v, cl, n_boot=B, seed=seed, ratio_to=r, level=0.9)
    uniq, inv = np.unique(cl, return_inverse=True)
    W = _multiplicities(np.random.default_rng(seed), uniq.size, B)  # [B, G]
    assert W.shape == (B, uniq.size) and (W.sum(axis=1) == uniq.size).all()
    ref = np.empty(B)
    for b in range(B):
        idx = np.concatenate([np.repeat(np.flatnonzero(inv == g), W[b, g]) for g in range(uniq.size)])
        ref[b] = v[idx].sum() / r[idx].sum()
    lo, hi = np.quantile(ref, [0.05, 0.95])
    assert e.lo == pytest.approx(lo, rel=1e-12, abs=1e-12)
    assert e.hi == pytest.approx(hi, rel=1e-12, abs=1e-12)


def test_speed_2000_resamples_1000_contexts_50_clusters():
    rng = np.random.default_rng(0)
    v, cl = rng.normal(size=1000), rng.integers(0, 50, size=1000)
    best = math.inf
    for _ in range(5):
        t0 = time.perf_counter()
        cluster_bootstrap(v, cl, n_boot=2000)
        best = min(best, time.perf_counter() - t0)
    assert best < 0.05, f"{best * 1e3:.1f} ms"


# ---------------------------------------------------------------------------------------- (2) ratio

def test_ratio_to_point_estimate_is_ratio_of_sums():
    rng = np.random.default_rng(1)
    v, cl = clustered(rng, 12)
    r = rng.uniform(1.0, 3.0, size=v.size)
    e = cluster_bootstrap(v, cl, n_boot=200, ratio_to=r)
    assert e.mean == float(np.sum(v) / np.sum(r))
    assert e.mean != pytest.approx(float(np.mean(v / r)), rel=1e-3)  # not the mean of per-context ratios
    assert e.lo < e.mean < e.hi


def test_ratio_to_ones_is_the_mean():
    rng = np.random.default_rng(2)
    v, cl = clustered(rng, 15)
    plain = cluster_bootstrap(v, cl, n_boot=300, seed=4)
    ones = cluster_bootstrap(v, cl, n_boot=300, seed=4, ratio_to=np.ones(v.size))
    assert plain.mean == float(np.mean(v))
    assert ones.mean == plain.mean
    assert (ones.lo, ones.hi) == pytest.approx((plain.lo, plain.hi), rel=1e-13)


# -------------------------------------------------------------------------------------- (3) pairing

def test_paired_difference_is_much_narrower_than_marginals():
    rng = np.random.default_rng(3)
    base, cl = clustered(rng, 30, sd_cluster=1.0, sd_noise=0.5)  # shared context / draft effect
    a = base + 0.05 + rng.normal(0.0, 0.01, size=base.size)
    b = base + rng.normal(0.0, 0.01, size=base.size)
    ea, eb = cluster_bootstrap(a, cl, seed=1), cluster_bootstrap(b, cl, seed=2)
    d = paired_difference(a, b, cl, seed=3)
    unpaired = math.hypot(ea.half_width, eb.half_width)  # half-width if a, b were independent
    assert d.half_width < 0.05 * unpaired, (d.half_width, unpaired)
    assert ea.lo < eb.hi  # the marginal CIs overlap: unpaired, the +0.05 would not even be resolved
    assert d.lo > 0.0 and d.lo < 0.05 < d.hi
    assert d.mean == pytest.approx(float(np.mean(a) - np.mean(b)), abs=1e-12)
    same = cluster_bootstrap(a - b, cl, seed=3)
    assert (d.mean, d.lo, d.hi) == (same.mean, same.lo, same.hi)


# ------------------------------------------------------------------------------------- (4) verdicts

def est(mean: float, lo: float, hi: float, G: int = 50, level: float = 0.95) -> Estimate:
    return Estimate(mean=mean, lo=lo, hi=hi, level=level, n=10 * G, n_clusters=G)


@pytest.mark.parametrize("claim", ["greater", "geq"])
@pytest.mark.parametrize("e, outcome", [
    (est(0.123, 0.101, 0.145), "supported"),
    (est(-0.05, -0.08, -0.02), "contradicted"),
    (est(0.004, 0.002, 0.006), "equal"),  # lo > 0 too: equal comes first
    (est(-0.004, -0.006, -0.002), "equal"),  # hi < 0 too: equal comes first
    (est(0.0, -0.004, 0.004), "equal"),
    (est(-0.03, -0.05, -0.001), "contradicted"),
    (est(0.0, -0.02, 0.02), "inconclusive"),
])
def test_verdict_shared_branches(e, outcome, claim):
    v = verdict(e, delta=0.01, claim=claim)
    assert v.outcome == outcome
    assert (v.needed_clusters is None) == (outcome != "inconclusive")
    assert v.text.startswith("inconclusive: " if outcome == "inconclusive" else outcome)


def test_verdict_text_and_to_dict():
    v = verdict(est(0.123, 0.101, 0.145), delta=0.01)
    assert v.text == "supported: +0.123 [0.101, 0.145] (95% CI, 50 prompts)"
    d = v.to_dict()
    assert d["outcome"] == "supported" and d["claim"] == "greater" and d["delta"] == 0.01
    assert d["effect"] == {"mean": 0.123, "lo": 0.101, "hi": 0.145, "level": 0.95, "n": 500,
                           "n_clusters": 50, "half_width": pytest.approx(0.022)}
    assert isinstance(v, Verdict) and d["needed_clusters"] is None
    assert verdict(est(0.004, 0.002, 0.006)).text.startswith("equal within ±0.010: +0.004 [0.002, 0.006]")


def test_margin_boundaries_are_strict():
    # lo == -delta is not inside (-delta, delta); lo is not > 0 and hi is not < 0.
    assert verdict(est(0.0, -0.01, 0.005), delta=0.01).outcome == "inconclusive"
    assert verdict(est(0.0, -0.005, 0.01), delta=0.01).outcome == "inconclusive"
    # the same CI is equal under a wider margin, and lo == delta is supported, not equal
    assert verdict(est(0.0, -0.01, 0.005), delta=0.011).outcome == "equal"
    assert verdict(est(0.02, 0.01, 0.03), delta=0.01).outcome == "supported"


def test_geq_non_inferiority_differs_from_greater():
    e = est(0.02, -0.005, 0.05)  # excludes a decrease beyond delta, does not exclude 0
    g, q = verdict(e, delta=0.01, claim="greater"), verdict(e, delta=0.01, claim="geq")
    assert g.outcome == "inconclusive" and q.outcome == "supported"
    assert q.text.startswith("supported (no decrease beyond 0.010): +0.020 [-0.005, 0.050]")
    assert verdict(est(0.02, -0.015, 0.05), delta=0.01, claim="geq").outcome == "inconclusive"


def test_needed_clusters_hand_computation():
    # h = 0.01, G = 50, m = 0.004, delta = 0.01: exclude 0 needs 50 (0.01/0.004)^2 = 312.5,
    # fit in the margin needs 50 (0.01/0.006)^2 = 138.9 -> 139.
    v = verdict(est(0.004, -0.006, 0.014), delta=0.01)
    assert v.outcome == "inconclusive" and v.needed_clusters == 139
    assert v.text == "inconclusive: +0.004 [-0.006, 0.014] (95% CI, 50 prompts); ~139 prompts would decide it"
    # |m| >= delta: only "exclude 0": 20 (0.04/0.03)^2 = 35.6 -> 36
    assert verdict(est(0.03, -0.01, 0.07, G=20), delta=0.01).needed_clusters == 36
    # geq: m = 0.005, h = 0.025: supported needs h' < m + delta = 0.015 -> 50 (0.025/0.015)^2 = 138.9 -> 139;
    # greater needs h' < 0.005 -> 50 * 25 = 1250
    e = est(0.005, -0.02, 0.03)
    assert verdict(e, delta=0.01, claim="geq").needed_clusters == 139
    assert verdict(e, delta=0.01, claim="greater").needed_clusters == 1250
    # asymmetric CI whose symmetric projection is already decisive (h = 0.013 < |m| = 0.02): G + 1
    assert verdict(est(0.02, -0.001, 0.025), delta=0.01).needed_clusters == 51


def test_one_cluster_gives_nan_ci_and_inconclusive_verdict():
    e = cluster_bootstrap(np.array([1.0, 2.0, 4.0]), np.array([7, 7, 7]), n_boot=100)
    assert e.mean == pytest.approx(7.0 / 3.0) and e.n == 3 and e.n_clusters == 1
    assert math.isnan(e.lo) and math.isnan(e.hi) and math.isnan(e.half_width)
    v = verdict(e, delta=0.01)
    assert v.outcome == "inconclusive" and v.needed_clusters is None
    assert "[nan, nan]" in v.text and "1 prompt)" in v.text


# ---------------------------------------------------------------------------------- (5) determinism

def test_seed_determinism():
    rng = np.random.default_rng(9)
    v, cl = clustered(rng, 25)
    a, b = cluster_bootstrap(v, cl, seed=17), cluster_bootstrap(v, cl, seed=17)
    assert a == b
    c = cluster_bootstrap(v, cl, seed=18)
    assert (c.lo, c.hi) != (a.lo, a.hi) and c.mean == a.mean


# ------------------------------------------------------------------------------------ (6) bad input

V, CL = np.arange(6.0), np.array([0, 0, 1, 1, 2, 2])


@pytest.mark.parametrize("kwargs, match", [
    (dict(values=V, clusters=CL[:5]), "clusters has length 5"),
    (dict(values=np.array([]), clusters=np.array([])), "values is empty"),
    (dict(values=np.array([0.0, np.nan, 1, 2, 3, 4]), clusters=CL), "values has 1 non-finite"),
    (dict(values=np.array([0.0, np.inf, 1, 2, 3, 4]), clusters=CL), "values has 1 non-finite"),
    (dict(values=V.reshape(2, 3), clusters=CL), "values must be a 1-D"),
    (dict(values=V, clusters=CL, n_boot=99), "n_boot must be an integer >= 100"),
    (dict(values=V, clusters=CL, n_boot=2000.0), "n_boot"),
    (dict(values=V, clusters=CL, n_boot=True), "n_boot"),
    (dict(values=V, clusters=CL, level=0.0), "level must be"),
    (dict(values=V, clusters=CL, level=1.0), "level must be"),
    (dict(values=V, clusters=CL, level=95), "level must be"),
    (dict(values=V, clusters=CL, seed=-1), "seed"),
    (dict(values=V, clusters=CL, ratio_to=np.ones(5)), "ratio_to has length 5"),
    (dict(values=V, clusters=CL, ratio_to=np.array([1, 1, 1, 1, 1, np.nan])), "ratio_to has 1 non-finite"),
    (dict(values=V, clusters=CL, ratio_to=np.array([1, 1, 1, 1, 1, -1.0])), "ratio_to must be >= 0"),
    (dict(values=V, clusters=CL, ratio_to=np.array([1, 1, 0, 0, 1, 1.0])), "ratio_to sums to 0 within 1"),
    (dict(values=V, clusters=np.array([0, 0, 1, 1, np.nan, 2])), "clusters has NaN"),
])
def test_cluster_bootstrap_bad_input(kwargs, match):
    with pytest.raises(InvalidInputError, match=match):
        cluster_bootstrap(**kwargs)


def test_paired_difference_bad_input():
    with pytest.raises(InvalidInputError, match="a and b must have the same length"):
        paired_difference(V, V[:5], CL)
    with pytest.raises(InvalidInputError, match="b has 1 non-finite"):
        paired_difference(V, np.array([0.0, 1, 2, 3, np.nan, 5]), CL)
    with pytest.raises(InvalidInputError, match="clusters has length 4"):
        paired_difference(V, V, CL[:4])


@pytest.mark.parametrize("kwargs, match", [
    (dict(delta=0.0), "delta must be"),
    (dict(delta=-0.01), "delta must be"),
    (dict(delta=float("nan")), "delta must be"),
    (dict(claim="less"), "claim must be one of greater, geq"),
])
def test_verdict_bad_input(kwargs, match):
    with pytest.raises(InvalidInputError, match=match):
        verdict(est(0.1, 0.05, 0.15), **kwargs)
    with pytest.raises(InvalidInputError, match="effect must be an Estimate"):
        verdict((0.1, 0.05, 0.15))  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="effect.mean must be finite"):
        verdict(est(float("nan"), 0.05, 0.15))


def test_ratio_of_ratios_is_the_paired_bootstrap_of_two_ratios() -> None:
    """(sum a / sum b) / (sum c / sum d): the point by hand; with c = d it is cluster_bootstrap's ratio on
    the same resamples (same seed -> same interval); pairing keeps the covariance: a ratio of a quantity to a
    noisy copy of itself has a far narrower CI than the two ratios' separate CIs allow."""
    from mdv.paired.stats import ratio_of_ratios

    rng = np.random.default_rng(5)
    cl = np.repeat(np.arange(30), 3)
    a, b = rng.random(90) + 1, rng.random(90) + 0.5
    c, d = a * (1 + 0.01 * rng.standard_normal(90)), b
    est = ratio_of_ratios(a, b, c, d, cl, n_boot=500, seed=3)
    assert est.mean == pytest.approx((a.sum() / b.sum()) / (c.sum() / d.sum()))
    one = ratio_of_ratios(a, b, np.ones(90), np.ones(90), cl, n_boot=500, seed=3)
    ref = cluster_bootstrap(a, cl, ratio_to=b, n_boot=500, seed=3)
    assert (one.mean, one.lo, one.hi) == pytest.approx((ref.mean, ref.lo, ref.hi), abs=1e-12)
    sep = cluster_bootstrap(a, cl, ratio_to=b, n_boot=500, seed=3)
    assert est.hi - est.lo < 0.2 * (sep.hi - sep.lo)
    with pytest.raises(InvalidInputError, match="denominator"):
        ratio_of_ratios(a, -b, c, d, cl)
