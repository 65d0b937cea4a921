"""Per-prompt statistics of a cell: the mean with a 95% Student-t half-width (:func:`mdv.metrics.mean_ci`),
averages over datasets, and the comparison verdicts the claims are built from.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from mdv.metrics import mean_ci
from mdv.analysis.cells import as_number


# ----------------------------------------------------------------------------------------------- statistics


@dataclass(frozen=True)
class Stat:
    """Mean with the half-width of its 95% confidence interval, over n samples."""

    mean: float
    ci: float
    n: int

    @staticmethod
    def of(values: Sequence[float]) -> "Stat":
        xs = [v for v in (as_number(x) for x in values) if not math.isnan(v)]
        m, h = mean_ci(xs)
        return Stat(m, h, len(xs))

    @property
    def lo(self) -> float:
        return self.mean - self.ci

    @property
    def hi(self) -> float:
        return self.mean + self.ci

    @property
    def valid(self) -> bool:
        return self.n > 0 and not math.isnan(self.mean)

    def fmt(self, digits: int = 2) -> str:
        if not self.valid:
            return "—"
        if math.isnan(self.ci):
            return f"{self.mean:.{digits}f} (n={self.n})"
        return f"{self.mean:.{digits}f} ± {self.ci:.{digits}f}"


EMPTY = Stat(float("nan"), float("nan"), 0)


def average_stat(stats: Sequence[Stat]) -> Stat:
    """Unweighted mean over datasets; half-width sqrt(Σh²)/n (NaN if any part has no CI)."""
    if not stats or not all(s.valid for s in stats):
        return EMPTY
    n = len(stats)
    return Stat(sum(s.mean for s in stats) / n, math.sqrt(sum(s.ci ** 2 for s in stats)) / n,
                sum(s.n for s in stats))


def compare_greater(a: Stat, b: Stat) -> str:
    """Verdict on "a > b": supported / contradicted when the 95% CIs are disjoint, else inconclusive."""
    if not (a.valid and b.valid):
        return "not measured"
    if math.isnan(a.ci) or math.isnan(b.ci):
        return "inconclusive (no CI: fewer than 2 prompts)"
    if a.lo > b.hi:
        return "supported"
    if a.hi < b.lo:
        return "contradicted"
    return "inconclusive (CIs overlap)"


def combine_verdicts(verdicts: Sequence[str]) -> str:
    """A chain of comparisons: contradicted if any link is, supported if all are, else inconclusive."""
    if not verdicts or any(v == "not measured" for v in verdicts):
        return "not measured"
    if any(v == "contradicted" for v in verdicts):
        return "contradicted"
    if all(v == "supported" for v in verdicts):
        return "supported"
    return "inconclusive (CIs overlap)"
