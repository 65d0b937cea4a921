"""Statistics of the paired measurement: cluster-bootstrap confidence intervals and three-outcome verdicts.

The paired measurement evaluates, at n contexts, an *exact conditional value* per verifier method
(e.g. ``E[tau | context, drafts]``, or block efficiency ``1 + E[tau | ...]``), every method on the SAME
drafts (common random numbers).  A method-vs-method or K+1-vs-K difference is therefore a per-context
number ``d_i = a_i - b_i`` whose only noise is the draw of contexts and drafts, and the draft noise
common to both methods cancels in ``d_i``.  Contexts come in *clusters*: several contexts are taken
along one prompt's trajectory, so contexts of one prompt are correlated and the prompts, not the
contexts, are the independent units.

Estimation (:func:`cluster_bootstrap`, :func:`paired_difference`)
    Point estimate: the mean over contexts ``(1/n) sum_i v_i``, or the ratio of means
    ``sum_i v_i / sum_i r_i``.  Interval: the percentile bootstrap (Efron & Tibshirani 1993, ch. 13)
    with whole clusters resampled with replacement -- the cluster (or "case") bootstrap for
    hierarchical data (Davison & Hinkley 1997, §3.8; Field & Welsh 2007, "Bootstrapping clustered
    data", JRSS-B 69:369-390).  Resampling contexts i.i.d. would ignore the intra-prompt correlation
    and give intervals that are too narrow (see tests/test_paired_stats.py for the coverage figures).

Decision (:func:`verdict`)
    Three decisive outcomes plus "inconclusive", from the position of the CI relative to 0 and to an
    equivalence margin ``(-delta, delta)``.  "equal" is equivalence by CI inclusion: a (1 - 2α)
    two-sided CI inside the margin is Schuirmann's (1987) two one-sided tests (TOST) at level α; with
    the default 95% CI the TOST level is 2.5%, i.e. conservative.

Everything is numpy float64; no scipy.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from mdv.errors import InvalidInputError

__all__ = ["CLAIMS", "OUTCOMES", "Estimate", "Verdict", "cluster_bootstrap", "paired_difference", "ratio_of_ratios",
           "verdict"]

OUTCOMES = ("supported", "contradicted", "equal", "inconclusive")
CLAIMS = ("greater", "geq")

_MIN_BOOT = 100
_CHUNK_CELLS = 1 << 22  # resamples × clusters per weight block: bounds memory at ~32 MiB of float64


# --------------------------------------------------------------------------------------------------
# Result types
# --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Estimate:
    """A point estimate with its bootstrap confidence interval ``[lo, hi]`` at confidence ``level``.

    ``n`` is the number of contexts, ``n_clusters`` the number of independent clusters (prompts).
    ``lo``/``hi`` are NaN when the interval is undefined (a single cluster).
    """

    mean: float
    lo: float
    hi: float
    level: float
    n: int
    n_clusters: int

    @property
    def half_width(self) -> float:
        """``(hi - lo) / 2`` (the percentile CI need not be symmetric about ``mean``); NaN if undefined."""
        return (self.hi - self.lo) / 2.0

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of the fields plus ``half_width`` (NaN stays ``float('nan')``)."""
        d = asdict(self)
        d["half_width"] = self.half_width
        return d


@dataclass(frozen=True)
class Verdict:
    """The outcome of testing a claim about ``effect`` (see :func:`verdict` for the rules).

    ``outcome`` is one of ``"supported" | "contradicted" | "equal" | "inconclusive"``;
    ``needed_clusters`` is set only for an inconclusive verdict with a defined CI: the projected
    number of clusters (prompts) that would decide it.  ``text`` is one human-readable line.
    """

    outcome: str  # "supported" | "contradicted" | "equal" | "inconclusive"
    effect: Estimate
    delta: float
    needed_clusters: int | None
    text: str
    claim: str = "greater"

    def to_dict(self) -> dict[str, Any]:
        """Plain dict; ``effect`` is nested as :meth:`Estimate.to_dict`."""
        return {"outcome": self.outcome, "claim": self.claim, "delta": self.delta,
                "needed_clusters": self.needed_clusters, "text": self.text, "effect": self.effect.to_dict()}


# --------------------------------------------------------------------------------------------------
# Input checks
# --------------------------------------------------------------------------------------------------

def _as_vector(name: str, x: Any) -> np.ndarray:
    """-> float64 [n], finite, non-empty."""
    try:
        arr = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"{name} must be a 1-D array of numbers; got {type(x).__name__} ({exc})") from None
    if arr.ndim != 1:
        raise InvalidInputError(f"{name} must be a 1-D array [n contexts]; got shape {arr.shape} "
                                f"(flatten it, one entry per context)")
    if arr.size == 0:
        raise InvalidInputError(f"{name} is empty; pass at least one context (and two clusters for a CI)")
    bad = ~np.isfinite(arr)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise InvalidInputError(f"{name} has {int(bad.sum())} non-finite entries (first at index {i}: {arr[i]}); "
                                f"NaN/inf are not dropped silently: fix or remove those contexts first")
    return arr


def _cluster_index(clusters: Any, n: int) -> tuple[np.ndarray, int]:
    """Cluster labels [n] (any sortable labels: ints, strings) -> (dense index int64 [n] in 0..G-1, G)."""
    lab = np.asarray(clusters)
    if lab.ndim != 1:
        raise InvalidInputError(f"clusters must be a 1-D array of labels [n contexts]; got shape {lab.shape}")
    if lab.shape[0] != n:
        raise InvalidInputError(f"clusters has length {lab.shape[0]} but values has length {n}; "
                                f"pass one cluster (prompt) label per context")
    if lab.dtype.kind == "f" and not np.isfinite(lab).all():
        raise InvalidInputError("clusters has NaN/inf labels; label every context with its prompt id")
    try:
        _, inv = np.unique(lab, return_inverse=True)
    except TypeError as exc:
        raise InvalidInputError(f"clusters labels must be mutually comparable (e.g. all ints or all str): "
                                f"{exc}") from None
    inv = inv.reshape(-1).astype(np.int64)
    return inv, int(inv.max()) + 1


def _check_options(n_boot: Any, level: Any, seed: Any) -> None:
    if isinstance(n_boot, bool) or not isinstance(n_boot, (int, np.integer)) or n_boot < _MIN_BOOT:
        raise InvalidInputError(f"n_boot must be an integer >= {_MIN_BOOT}; got {n_boot!r} "
                                f"(use ~2000 for reported intervals)")
    if isinstance(level, bool) or not isinstance(level, (int, float, np.floating, np.integer)) \
            or not (0.0 < float(level) < 1.0):
        raise InvalidInputError(f"level must be a confidence level strictly between 0 and 1; got {level!r} "
                                f"(e.g. 0.95, not 95)")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise InvalidInputError(f"seed must be a non-negative integer; got {seed!r}")


# --------------------------------------------------------------------------------------------------
# Bootstrap
# --------------------------------------------------------------------------------------------------

def _multiplicities(rng: np.random.Generator, n_clusters: int, n_rows: int) -> np.ndarray:
    """Cluster multiplicities of ``n_rows`` bootstrap resamples -> int64 [n_rows, G].

    Row b counts how often each of the G clusters is drawn when G clusters are drawn uniformly with
    replacement, i.e. one Multinomial(G; 1/G, ..., 1/G) vector; drawn as G uniform indices per row and
    counted with one ``bincount`` (faster than ``Generator.multinomial`` for this shape)."""
    G = n_clusters
    idx = rng.integers(0, G, size=(n_rows, G), dtype=np.int64)  # [n_rows, G]
    idx += (np.arange(n_rows, dtype=np.int64) * G)[:, None]
    return np.bincount(idx.reshape(-1), minlength=n_rows * G).reshape(n_rows, G)


def _percentile_interval(statistic: Any, G: int, *, n_boot: int, level: float, seed: int) -> tuple[float, float]:
    """The percentile interval of ``statistic(W)`` -> [rows] over ``n_boot`` resamples of G clusters, W the
    [rows, G] float64 multiplicities (:func:`_multiplicities`), drawn in blocks that bound the memory."""
    rng = np.random.default_rng(int(seed))
    boot = np.empty(int(n_boot), dtype=np.float64)  # [B] theta*_b
    rows = max(1, _CHUNK_CELLS // G)
    for start in range(0, int(n_boot), rows):
        stop = min(int(n_boot), start + rows)
        boot[start:stop] = statistic(_multiplicities(rng, G, stop - start).astype(np.float64))  # W [rows, G]
    alpha = 1.0 - float(level)
    lo, hi = np.quantile(boot, [alpha / 2.0, 1.0 - alpha / 2.0])
    return float(lo), float(hi)


def cluster_bootstrap(values: np.ndarray, clusters: np.ndarray, *, n_boot: int = 2000, level: float = 0.95,
                      seed: int = 0, ratio_to: np.ndarray | None = None) -> Estimate:
    """Mean (or ratio of means) over contexts with a percentile cluster-bootstrap CI.

    Args:
        values: [n] per-context values v_i (finite; NaN is an error, never dropped).
        clusters: [n] cluster (prompt) label of each context; any sortable labels.
        n_boot: number of bootstrap resamples B (>= 100).
        level: two-sided confidence level in (0, 1).
        seed: seed of ``numpy.random.default_rng``; the same inputs and seed give the same Estimate.
        ratio_to: optional [n] denominators r_i (finite, >= 0, every cluster's sum > 0): the estimand is
            then the ratio of means sum_i v_i / sum_i r_i (e.g. emitted tokens per target call).

    Math.  Let the G clusters have value sums S_g = sum_{i in g} v_i and sizes (or denominator sums)
    C_g = |g| (or sum_{i in g} r_i).  The point estimate is theta = sum_g S_g / sum_g C_g (= the plain
    mean of the values without ``ratio_to``).  A cluster-bootstrap resample draws G clusters uniformly
    with replacement, with multiplicities w^(b) ~ Multinomial(G; 1/G, ..., 1/G), and pools all the
    contexts of the drawn clusters, so its estimate is

        theta*_b = (w^(b) . S) / (w^(b) . C),           b = 1..B,

    computed for all b at once as two matrix-vector products [B, G] @ [G].  Unequal cluster sizes are
    handled by the denominator (the resampled n varies).  The CI is the percentile interval
    [q_{(1-level)/2}, q_{(1+level)/2}] of the theta*_b (Efron & Tibshirani 1993, §13.3), resampling
    clusters, not contexts, because contexts of one prompt are correlated and the prompts are the
    independent units (Davison & Hinkley 1997, §3.8, "case resampling" at the top stage; Field & Welsh
    2007).  Passing ``clusters = arange(n)`` gives the ordinary i.i.d. bootstrap.

    With a single cluster every resample equals the point estimate and there is no information about
    between-cluster variation: ``lo`` and ``hi`` are then NaN (the mean is still returned).

    The percentile interval from G clusters is somewhat narrow for small G (its variance is that of
    the plug-in, a factor (G-1)/G, and no t-correction); use G >= ~20 clusters for reported CIs.

    Cost: O(n) once for the cluster sums, then O(B·G); 2000 resamples of 50 clusters take ~2 ms.
    """
    _check_options(n_boot, level, seed)
    v = _as_vector("values", values)  # [n]
    n = v.shape[0]
    inv, G = _cluster_index(clusters, n)  # [n], G
    S = np.bincount(inv, weights=v, minlength=G)  # [G] per-cluster value sums
    if ratio_to is None:
        C = np.bincount(inv, minlength=G).astype(np.float64)  # [G] cluster sizes
        mean = float(np.mean(v))
    else:
        r = _as_vector("ratio_to", ratio_to)  # [n]
        if r.shape[0] != n:
            raise InvalidInputError(f"ratio_to has length {r.shape[0]} but values has length {n}; "
                                    f"pass one denominator per context")
        if (r < 0).any():
            raise InvalidInputError("ratio_to must be >= 0 (denominators such as target calls); "
                                    f"got a minimum of {r.min()}")
        C = np.bincount(inv, weights=r, minlength=G)  # [G] per-cluster denominator sums
        if (C <= 0).any():
            raise InvalidInputError(f"ratio_to sums to 0 within {int((C <= 0).sum())} cluster(s); every cluster "
                                    f"needs a positive denominator sum (drop the clusters with none)")
        mean = float(np.sum(v) / np.sum(r))
    if G < 2:
        return Estimate(mean=mean, lo=float("nan"), hi=float("nan"), level=float(level), n=n, n_clusters=G)

    lo, hi = _percentile_interval(lambda W: (W @ S) / (W @ C), G, n_boot=n_boot, level=level, seed=seed)
    return Estimate(mean=mean, lo=lo, hi=hi, level=float(level), n=n, n_clusters=G)


def ratio_of_ratios(a: np.ndarray, b: np.ndarray, c: np.ndarray, d: np.ndarray, clusters: np.ndarray, *,
                    n_boot: int = 2000, level: float = 0.95, seed: int = 0) -> Estimate:
    """(sum a / sum b) / (sum c / sum d) with a cluster-bootstrap CI: one set of resampled clusters for all
    four sums, so two ratios measured on the same units stay paired (e.g. a predicted and a measured
    speedup of the same generations: their ratio's CI then keeps the covariance of the shared prompts).

    Args:
        a, b, c, d: [n] finite values, b and d >= 0 with every cluster's sum > 0 (denominators).
        clusters, n_boot, level, seed: as in :func:`cluster_bootstrap`.

    Math: with cluster sums A_g, B_g, C_g, D_g and multiplicities w^(b) (as in :func:`cluster_bootstrap`),
    theta*_b = (w.A / w.B) / (w.C / w.D); the CI is the percentile interval of the theta*_b."""
    _check_options(n_boot, level, seed)
    cols = [_as_vector(name, x) for name, x in (("a", a), ("b", b), ("c", c), ("d", d))]
    n = cols[0].shape[0]
    if any(x.shape[0] != n for x in cols):
        raise InvalidInputError(f"a, b, c, d must have one entry per unit each; got lengths {[x.shape[0] for x in cols]}")
    inv, G = _cluster_index(clusters, n)
    A, B, C, D = (np.bincount(inv, weights=x, minlength=G) for x in cols)  # [G] each
    for name, x, S in (("b", cols[1], B), ("d", cols[3], D)):
        if (x < 0).any() or (S <= 0).any():
            raise InvalidInputError(f"{name} is a denominator: it must be >= 0 with a positive sum in every cluster")
    mean = float((A.sum() / B.sum()) / (C.sum() / D.sum()))
    if G < 2:
        return Estimate(mean=mean, lo=float("nan"), hi=float("nan"), level=float(level), n=n, n_clusters=G)
    lo, hi = _percentile_interval(lambda W: ((W @ A) / (W @ B)) / ((W @ C) / (W @ D)), G, n_boot=n_boot,
                                  level=level, seed=seed)
    return Estimate(mean=mean, lo=lo, hi=hi, level=float(level), n=n, n_clusters=G)


def paired_difference(a: np.ndarray, b: np.ndarray, clusters: np.ndarray, *, n_boot: int = 2000,
                      level: float = 0.95, seed: int = 0, ratio_to: np.ndarray | None = None) -> Estimate:
    """Paired estimate of mean(a) - mean(b): the cluster bootstrap of the per-context differences.

    Args:
        a, b: [n] values of two methods (or K+1 and K) at the SAME contexts and drafts.
        clusters: [n] cluster (prompt) labels, shared by a and b.
        n_boot, level, seed, ratio_to: as in :func:`cluster_bootstrap` (with ``ratio_to`` the estimand is
            sum(a - b) / sum(ratio_to)).

    Because a_i and b_i are measured on common random numbers, d_i = a_i - b_i is bootstrapped with
    one set of resampled clusters for both methods: Var(mean d) = Var(mean a) + Var(mean b)
    - 2 Cov(mean a, mean b), and the (typically large, positive) covariance from the shared contexts
    and drafts is kept.  Comparing two separately computed marginal CIs would ignore it and be far
    too wide.  This is exactly ``cluster_bootstrap(a - b, clusters, ...)``.
    """
    av = _as_vector("a", a)
    bv = _as_vector("b", b)
    if av.shape != bv.shape:
        raise InvalidInputError(f"a and b must have the same length (one value per context, same contexts); "
                                f"got {av.shape[0]} and {bv.shape[0]}")
    return cluster_bootstrap(av - bv, clusters, n_boot=n_boot, level=level, seed=seed, ratio_to=ratio_to)


# --------------------------------------------------------------------------------------------------
# Verdicts
# --------------------------------------------------------------------------------------------------

def _decisive_thresholds(mean: float, delta: float, claim: str) -> list[float]:
    """Half-widths h' below which a CI ``mean ± h'`` would be decisive, one per reachable outcome."""
    m = mean
    out: list[float] = []
    if abs(m) < delta:
        out.append(delta - abs(m))  # equal: -delta < m - h', m + h' < delta
    if claim == "greater":
        if m != 0.0:
            out.append(abs(m))  # supported (m > 0: m - h' > 0) or contradicted (m < 0: m + h' < 0)
    else:  # "geq"
        if m > -delta:
            out.append(m + delta)  # supported: m - h' > -delta
        if m < 0.0:
            out.append(-m)  # contradicted: m + h' < 0
    return out


def _fmt(x: float, decimals: int, sign: bool = False) -> str:
    if not math.isfinite(x):
        return "nan"
    return f"{x:+.{decimals}f}" if sign else f"{x:.{decimals}f}"


def _prompts(k: int) -> str:
    return f"{k} prompt" if k == 1 else f"{k} prompts"


def verdict(effect: Estimate, *, delta: float = 0.01, claim: str = "greater") -> Verdict:
    """Three-outcome verdict (plus "inconclusive") on a claim about ``effect`` (e.g. a paired difference).

    Args:
        effect: the Estimate of the effect (typically from :func:`paired_difference`).
        delta: equivalence margin δ > 0, in the units of the effect: |effect| < δ is "practically 0".
        claim: ``"greater"`` -- the claim is effect > 0 (method A beats B); ``"geq"`` -- the claim is
            effect ≥ 0 up to the margin (a monotonicity claim such as "E[tau] is non-decreasing in K").

    Rules, applied in this order to the CI [lo, hi] (first match wins):

    ========  =====================  =========================  ===========================================
    order     outcome                claim="greater"            claim="geq"
    ========  =====================  =========================  ===========================================
    0         inconclusive           lo or hi is NaN            lo or hi is NaN
    1         equal                  -δ < lo and hi < δ         -δ < lo and hi < δ
    2         supported              lo > 0                     lo > -δ  (non-inferiority at margin δ)
    3         contradicted           hi < 0                     hi < 0
    4         inconclusive           otherwise                  otherwise
    ========  =====================  =========================  ===========================================

    Why this order.  "equal" goes first: a CI inside the margin (equivalence by CI inclusion, i.e.
    Schuirmann's 1987 TOST) means the effect is practically 0 even if the CI also excludes 0, and an
    effect of +0.002 ± 0.001 should be reported as "no meaningful difference", not as "A beats B".
    Under "greater" a CI inside (0, δ) is therefore "equal", not "supported".  Rules 2 and 3 cannot both
    match (lo > 0 > hi, or lo > -δ with hi < 0, puts the CI inside the margin, caught by rule 1).

    "geq" differs from "greater" only in rule 2.  A non-decreasing claim is violated only by a
    decrease, so what decides in its favour is excluding a *meaningful* decrease: lo > -δ (the one-sided
    non-inferiority test).  It is contradicted by any resolved decrease, hi < 0 (not hi < -δ): the
    values are exact conditional expectations, so a CI entirely below 0 is evidence that the property
    fails, however small the violation; a violation too small to matter is still reported as "equal"
    when the whole CI also lies inside the margin (rule 1 first).  Under "geq", "equal" is consistent
    with the claim (flat within δ); the caller decides whether flat counts as support.

    ``needed_clusters`` (inconclusive verdicts with a defined CI only).  Assuming the half-width h
    shrinks as 1/sqrt(G) with the number of clusters G and the mean m stays put, the CI m ± h' with
    h' = h sqrt(G / G') becomes decisive once h' is below a threshold x: for "greater" x = |m| (exclude
    0, if m ≠ 0) or x = δ - |m| (fit in the margin, if |m| < δ); for "geq" x = m + δ (if m > -δ),
    x = -m (if m < 0) or δ - |m| (if |m| < δ).  The smallest budget wins:
    G' = ceil(G (h / max x)^2), raised to at least G + 1 (if the symmetric projection says G already
    suffices, the inconclusiveness comes from the asymmetry of the percentile CI and more clusters are
    still needed).  None when h is NaN.  It is a planning figure, not a guarantee.
    """
    if not isinstance(effect, Estimate):
        raise InvalidInputError(f"effect must be an Estimate (from cluster_bootstrap/paired_difference); "
                                f"got {type(effect).__name__}")
    if isinstance(delta, bool) or not isinstance(delta, (int, float, np.floating, np.integer)) \
            or not math.isfinite(float(delta)) or float(delta) <= 0.0:
        raise InvalidInputError(f"delta must be a finite equivalence margin > 0 in the units of the effect; "
                                f"got {delta!r} (e.g. delta=0.01)")
    if claim not in CLAIMS:
        raise InvalidInputError(f"claim must be one of {', '.join(CLAIMS)} ('greater': effect > 0, 'geq': "
                                f"effect >= 0 up to delta); got {claim!r}")
    m, lo, hi, d = float(effect.mean), float(effect.lo), float(effect.hi), float(delta)
    if not math.isfinite(m):
        raise InvalidInputError(f"effect.mean must be finite; got {effect.mean!r}")
    G = int(effect.n_clusters)
    decimals = max(3, math.ceil(-math.log10(d)) + 1)
    ci = f"{_fmt(m, decimals, sign=True)} [{_fmt(lo, decimals)}, {_fmt(hi, decimals)}]"
    tail = f"({round(100 * effect.level, 2):g}% CI, {_prompts(G)})"

    needed: int | None = None
    if math.isnan(lo) or math.isnan(hi):
        outcome = "inconclusive"
    elif -d < lo and hi < d:
        outcome = "equal"
    elif (lo > 0.0) if claim == "greater" else (lo > -d):
        outcome = "supported"
    elif hi < 0.0:
        outcome = "contradicted"
    else:
        outcome = "inconclusive"

    if outcome == "equal":
        text = f"equal within ±{_fmt(d, decimals)}: {ci} {tail}"
    elif outcome == "supported" and claim == "geq" and lo <= 0.0:
        text = f"supported (no decrease beyond {_fmt(d, decimals)}): {ci} {tail}"
    elif outcome != "inconclusive":
        text = f"{outcome}: {ci} {tail}"
    else:
        h = (hi - lo) / 2.0
        if math.isnan(h):
            why = "one prompt gives no CI" if G < 2 else "the CI is undefined"
            text = f"inconclusive: {ci} {tail}; {why}, more prompts needed"
        else:
            x = max(_decisive_thresholds(m, d, claim))  # non-empty: |m| < δ or m ≠ 0 always holds
            needed = max(G + 1, math.ceil(G * (h / x) ** 2 - 1e-9))
            text = f"inconclusive: {ci} {tail}; ~{needed} prompts would decide it"
    return Verdict(outcome=outcome, effect=effect, delta=d, needed_clusters=needed, text=text, claim=claim)
