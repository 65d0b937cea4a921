"""The audit's statistics: goodness of fit, a confidence interval on the total variation, the smallest
detectable bias, a mean with its interval, and the multiple-testing correction.

* Pearson's chi-square of counts against an exact law, cells of expected count < 5 pooled
  (:func:`mdv.oracle.montecarlo.chi_square`, the statistical tests' own); its p-value is asymptotic.
* A confidence interval on TV(R, P) between the rule's law R and the target law P over m cells, from
  Weissman et al. (2003), "Inequalities for the L1 deviation of the empirical distribution":
  P(||R̂ - R||_1 >= ε) <= (2^m - 2) exp(-n ε² / 2).  With ε_α = sqrt(2 (m ln 2 + ln(1/α)) / n) and the
  triangle inequality, TV(R, P) lies in [TV(R̂, P) - ε_α/2, TV(R̂, P) + ε_α/2] with probability >= 1 - α
  (:func:`tv_interval`): valid at every n, conservative.
* Detectable bias (:func:`detectable_tv`): a rule at TV ε from P over the tested cells has chi-square
  noncentrality λ = n Σ δ_x² / P_x >= 4 n ε² (Cauchy-Schwarz: (Σ |δ_x|)² <= Σ δ_x²/P_x · Σ P_x), so every
  bias of TV >= sqrt(λ_β / (4 n)) is detected with probability >= 1 - β, where λ_β is the noncentrality
  at which the test at level α' has power 1 - β (scipy's noncentral chi-square).
* Prefix marginals (:func:`prefix_chi_square`): a rule that is wrong at its j-th emitted token shows
  it in the law of the first j tokens, a test with far fewer degrees of freedom than the law of all N;
  the laws of the first 1, ..., N tokens are each tested and the smallest p-value, times N (Bonferroni),
  is the look's p-value.
* Holm's step-down correction across cases (:func:`holm`): family-wise error <= α.
"""
from __future__ import annotations

import math

import numpy as np
from scipy import optimize, stats

from mdv.oracle.montecarlo import chi_square

def prefix_laws(x: np.ndarray, V: int, n_tokens: int):
    """The laws (or counts) of the first 1, ..., n_tokens tokens from ``x`` [V^n_tokens] (base-V codes, first
    token most significant): yields (length, [V^length])."""
    full = np.asarray(x, dtype=np.float64).reshape((V,) * n_tokens)
    for length in range(1, n_tokens + 1):
        axes = tuple(range(length, n_tokens))
        yield length, (full.sum(axes) if axes else full).reshape(-1)


def prefix_chi_square(counts: np.ndarray, law: np.ndarray, V: int, n_tokens: int) -> tuple[float, int, int]:
    """The chi-square tests of the laws of the first 1..n_tokens tokens -> (n_tokens x the smallest p-value,
    capped at 1; the degrees of freedom of the full law's test; the prefix length with the smallest p-value)."""
    best, best_len, df_full = 1.0, n_tokens, 0
    for (length, c), (_, P) in zip(prefix_laws(counts, V, n_tokens), prefix_laws(law, V, n_tokens)):
        pv, df = chi_square(c, P)
        if length == n_tokens:
            df_full = df
        if pv < best:
            best, best_len = pv, length
    return min(1.0, n_tokens * best), df_full, best_len


def tv_interval(counts: np.ndarray, law: np.ndarray, alpha: float) -> tuple[float, float, float]:
    """(estimate, low, high): TV(R̂, P) and a level-(1 - alpha) interval on TV(R, P) (Weissman et al. 2003)."""
    counts = np.asarray(counts, dtype=np.float64)
    n = counts.sum()
    law = np.asarray(law, dtype=np.float64)
    tv = 0.5 * float(np.abs(counts / max(n, 1.0) - law).sum())
    m = int(((law > 0) | (counts > 0)).sum())
    eps = math.sqrt(2.0 * (m * math.log(2.0) + math.log(1.0 / alpha)) / max(n, 1.0))
    return tv, max(0.0, tv - eps / 2), min(1.0, tv + eps / 2)


def detectable_tv(n: float, df: int, level: float, power: float = 0.8) -> float:
    """The smallest TV that the chi-square test with ``df`` degrees of freedom at ``level`` detects with
    probability >= ``power`` from ``n`` trials, whatever the shape of the bias (see the module docstring)."""
    if n <= 0 or df < 1:
        return 1.0
    crit = stats.chi2.isf(level, df)
    lam = optimize.brentq(lambda x: stats.ncx2.sf(crit, df, x) - power, 1e-9, 1e7)
    return min(1.0, math.sqrt(lam / (4.0 * n)))


def mean_interval(values: np.ndarray, alpha: float) -> tuple[float, float, float]:
    """(mean, low, high): the normal-approximation level-(1 - alpha) interval of a mean (bounded values,
    n in the thousands or more)."""
    values = np.asarray(values, dtype=np.float64)
    n = values.size
    if n == 0:
        return math.nan, math.nan, math.nan
    mean = float(values.mean())
    half = float(stats.norm.isf(alpha / 2) * values.std(ddof=1) / math.sqrt(n)) if n > 1 else math.inf
    return mean, mean - half, mean + half


def holm(pvalues: list[float], alpha: float) -> list[bool]:
    """Holm's step-down procedure: which hypotheses are rejected at family-wise error ``alpha``."""
    order = np.argsort(pvalues, kind="stable")
    m = len(pvalues)
    rejected = [False] * m
    for rank, i in enumerate(order):
        if pvalues[i] > alpha / (m - rank):
            break
        rejected[i] = True
    return rejected
