"""Tokens per iteration of a generation capped at n tokens: the last iteration's cut, exactly.

The paired measurement gives the law of the tokens emitted by ONE iteration, e = 1 + tau in {1, ...,
L + 1}.  A real generation of ``max_new_tokens = n`` (no EOS) stops at the first iteration whose running
total reaches n, and cuts that iteration's surplus: it emits exactly n tokens in

    N(n) = min{k : e_1 + ... + e_k >= n}

iterations, so its tokens per iteration are n / N(n), below E[e] whenever the last block is cut.  With
the e_i i.i.d. (the law pooled over contexts), the expected number of iterations solves the renewal
equation

    E[N(m)] = 1 + sum_j P(e = j) E[N(m - j)],    E[N(m)] = 0 for m <= 0                       (1)

(Feller 1968, "An Introduction to Probability Theory and Its Applications", vol. 1, ch. XIII), and Wald's
identity E[e_1 + ... + e_N] = E[e] E[N] (Wald 1944) turns it into the expected overshoot
E[S_N] - n = E[e] E[N(n)] - n >= 0.  The cut costs a fraction

    cap_factor(n) = (n / E[N(n)]) / E[e]   in (0, 1]                                             (2)

of the per-iteration tokens; for large n it tends to 1 - E[e(e - 1)] / (2 E[e] n) (the stationary
overshoot of a lattice renewal process).  The ratio n / E[N] is the ratio-of-means tokens per iteration
of many such runs, the quantity a measured "emitted ÷ target calls" pooled over prompts estimates.

:func:`expected_iterations` is the O(n·L) dynamic programme (1); :func:`expected_iterations_reference`
enumerates every sequence of blocks (exponential, for tests).
"""
from __future__ import annotations

import itertools
import math
from typing import Sequence

import numpy as np

from mdv.errors import InvalidInputError

__all__ = ["cap_factor", "emitted_law", "expected_iterations", "expected_iterations_reference"]


def _check_law(law: Sequence[float] | np.ndarray) -> np.ndarray:
    pe = np.asarray(law, dtype=np.float64)  # [L+1]: pe[j-1] = P(e = j)
    if pe.ndim != 1 or pe.size < 1:
        raise InvalidInputError(f"the emitted-token law must be a 1-D array P(e = 1..L+1); got shape {pe.shape}")
    if not np.isfinite(pe).all() or pe.min() < -1e-12 or abs(pe.sum() - 1.0) > 1e-9:
        raise InvalidInputError(f"the emitted-token law must be non-negative and sum to 1; got sum {pe.sum()!r}"
                                f" and min {pe.min()!r}")
    return np.clip(pe, 0.0, None) / np.clip(pe, 0.0, None).sum()


def _check_n(n: int) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise InvalidInputError(f"n (max_new_tokens) must be an integer >= 1; got {n!r}")
    return int(n)


def emitted_law(reach: np.ndarray) -> np.ndarray:
    """The law of e = 1 + tau from the tail probabilities of tau.

    reach: [..., L] P(tau >= i), i = 1..L (non-increasing, in [0, 1]).
    -> [..., L + 1] P(e = j) = P(tau >= j - 1) - P(tau >= j), with P(tau >= 0) = 1, P(tau >= L + 1) = 0.
    """
    r = np.asarray(reach, dtype=np.float64)  # [..., L]
    ones = np.ones(r.shape[:-1] + (1,))
    zeros = np.zeros(r.shape[:-1] + (1,))
    tail = np.concatenate([ones, r, zeros], axis=-1)  # [..., L+2]: P(tau >= i), i = 0..L+1
    return np.clip(tail[..., :-1] - tail[..., 1:], 0.0, None)  # [..., L+1]


def expected_iterations(law: Sequence[float] | np.ndarray, n: int) -> float:
    """E[N(n)], iterations until n tokens are emitted, by the renewal equation (1).

    law: [L+1] P(e = j) for j = 1..L+1 tokens emitted per iteration."""
    pe, n = _check_law(law), _check_n(n)
    f = np.zeros(n + 1)  # f[m] = E[N(m)], m = 0..n (f[0] = 0)
    for m in range(1, n + 1):
        j = np.arange(1, min(pe.size, m) + 1)  # blocks that leave m - j > 0 still to emit ... or finish
        f[m] = 1.0 + float(np.dot(pe[j - 1], f[m - j]))  # m - j <= 0 contributes 0: f[0] = 0, j <= m
    return float(f[n])


def expected_iterations_reference(law: Sequence[float] | np.ndarray, n: int) -> float:
    """E[N(n)] by enumerating every sequence (e_1, ..., e_n) of emitted counts (N(n) <= n since e >= 1):
    sum over sequences of P(sequence) · (first k with e_1 + ... + e_k >= n).  Exponential: tests only."""
    pe, n = _check_law(law), _check_n(n)
    total = 0.0
    for seq in itertools.product(range(1, pe.size + 1), repeat=n):
        s, k = 0, 0
        while s < n:
            s += seq[k]
            k += 1
        total += math.prod(pe[e - 1] for e in seq) * k
    return total


def cap_factor(law: Sequence[float] | np.ndarray, n: int) -> float:
    """(2): the tokens per iteration of an n-token run, n / E[N(n)], divided by E[e]."""
    pe = _check_law(law)
    mean = float(np.dot(np.arange(1, pe.size + 1), pe))
    return (_check_n(n) / expected_iterations(pe, n)) / mean
