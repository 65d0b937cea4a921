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

**Where iterations start: the per-context mean over-predicts.**  (1)–(2) pool one law over contexts taken
every ``stride`` tokens, i.e. uniformly over *positions*.  Real iterations do not start uniformly: where
acceptance is low they are short and many, where it is high long and few, so the contexts at iteration
starts over-represent the hard stretches (the inspection paradox of renewal theory, Feller 1971, vol. 2,
§XI.4).  The per-position mean E[e] then exceeds a real run's n / E[N]: two stretches of equal length
with e = 5 and e = 1 give E[e] = 3 but 5/3 tokens per iteration (the harmonic mean).  Measured on the
default pair, 50 prompts × 64 tokens: ``sd`` L = 4 per-context mean 2.47 tokens per iteration, real runs
1.94.

For ``sd`` (Leviathan et al. 2023) and ``spectr`` (Sun et al. 2023, K-SEQ; ``sd`` is its K = 1), with a
drafter whose q at a position depends on the committed prefix alone, the real count has an exact form
along a target trajectory x (its law is the output's: both are lossless).  Given the output, the drafts
still on the output's path at a position are i.i.d. from q(. | x_<i) whatever happened before, so only
their number matters.  For ``sd`` the token at position i came from an accepted draft token with
probability

    a_i = min(p_i(x_i), q_i(x_i)) / p_i(x_i) = min(1, q_i(x_i) / p_i(x_i)),                       (3)

independently of the other positions; for ``spectr`` the number c of the k drafts on the path that stay
on it past position i has the law (5) of :func:`kseq_survival` (at k = 1 it is [1 - a_i, a_i]).  An
iteration ends at the first position of depth <= L where none stays, or after its bonus token at depth
L + 1, and the probability B_t that an iteration starts at position t follows forward over the positions
with the state (depth, drafts on the path), B_0 = 1:

    E[N | x] = sum_{t < n} B_t                                                                  (4)

(:func:`iteration_starts`; :func:`iterations_given_output_reference` walks every path of survivor
counts).  ``n / mean_x E[N | x]`` over trajectories is the real runs' tokens per iteration, the last
iteration's cut included, and B_t also tells how many real iterations start in the stretch of text each
measured context stands for (:func:`stretch_weights`; :func:`mdv.paired.report.sr_check_rows` weighs the
contexts' iteration times with it).  Measured on the
``sr_check`` run's trajectories: ``sd`` 1.79 / 2.05 tokens per iteration at L = 2 / 4 (real runs 1.78 /
1.94), ``spectr`` K = 3 1.89 / 2.22 (real 1.94 / 2.09).  Block verifiers (``bv``, ``gbv``, ``mdbv``,
``mpbv``) end their iterations by another law; they keep the per-context mean.
"""
from __future__ import annotations

import itertools
import math
from typing import TYPE_CHECKING, Sequence

import numpy as np

from mdv.errors import InvalidInputError

if TYPE_CHECKING:  # pragma: no cover
    from torch import Tensor

#: Methods whose iterations end by K-SEQ's survivor law (:func:`kseq_survival`; ``sd`` is its k = 1):
#: their real iteration count given the output is (4).  Block verifiers end iterations by another law.
KSEQ_METHODS = ("sd", "spectr")

__all__ = ["KSEQ_METHODS", "cap_factor", "emitted_law", "expected_iterations", "expected_iterations_reference",
           "iteration_starts", "iterations_given_output", "iterations_given_output_reference", "kseq_survival",
           "kseq_survival_reference", "stretch_weights"]


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


def _check_survival(survival: np.ndarray | Sequence, K: int, L: int) -> np.ndarray:
    T = np.asarray(survival, dtype=np.float64)  # [n, K_max, K_max+1]
    for name, v in (("K", K), ("L", L)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise InvalidInputError(f"{name} must be an integer >= 1; got {v!r}")
    if T.ndim != 3 or T.shape[0] < 1 or T.shape[2] != T.shape[1] + 1 or T.shape[1] < K:
        raise InvalidInputError(f"survival must be [n, K_max, K_max + 1] with K_max >= K = {K}; got shape {T.shape}")
    if not np.isfinite(T).all() or T.min() < 0 or np.abs(T.sum(-1) - 1.0).max() > 1e-6:
        raise InvalidInputError("survival rows must be laws over the survivor count (non-negative, summing to 1)")
    return T


def iterations_given_output(survival: np.ndarray | Sequence, L: int, K: int = 1) -> float:
    """E[N | x] of (4): the expected iterations of a run that emits exactly the output x, the sum of
    :func:`iteration_starts`."""
    return float(iteration_starts(survival, L, K).sum())


def iteration_starts(survival: np.ndarray | Sequence, L: int, K: int = 1) -> np.ndarray:
    """[n] P(an iteration starts at output position t | the output x), t = 0..n-1 (B_t of (4)).

    survival: [n, K_max, K_max + 1]; ``survival[i, k-1, c]`` = P(c drafts stay on the output's path after
    position i | k drafts reached it, the output), :func:`mdv.paired.trajectory.survival_along`; for ``sd``
    (K = 1) ``survival[i, 0] = [1 - a_i, a_i]`` of (3).  K: drafts per iteration (``spectr``'s K; 1 for
    ``sd``).  Forward over positions with the state (depth in the iteration, drafts on the path); an
    iteration ends where none stays, or after its bonus token at depth L + 1.  O(n·L·K²)."""
    T, K, L = _check_survival(survival, K, L), int(K), int(L)
    n = T.shape[0]
    mass = np.zeros((L + 2, K + 1))  # [depth 1..L+1, survivors]: the state at the current position
    mass[1, K] = 1.0
    starts = np.zeros(n)
    for t in range(n):
        starts[t] = mass[1, K]  # depth 1: an iteration starts at t
        nxt = np.zeros_like(mass)
        nxt[1, K] += mass[L + 1].sum()  # the bonus token ends its iteration
        for d in range(1, L + 1):
            for k in range(1, K + 1):
                w = mass[d, k]
                if w == 0.0:
                    continue
                law = T[t, k - 1, :k + 1]  # [k+1]: survivors after position t
                nxt[1, K] += w * law[0]  # none stays: the iteration ends with this token
                nxt[d + 1, 1:k + 1] += w * law[1:]  # depth L + 1 is the bonus position
        mass = nxt
    return starts


def stretch_weights(starts: np.ndarray | Sequence[float], offsets: np.ndarray | Sequence[int]) -> np.ndarray:
    """[c] the expected number of real iterations that start in the stretch of text each context stands for.

    starts: [n] B_t of (4) (:func:`iteration_starts`); offsets: [c] the contexts' positions, each in [0, n).
    With the distinct offsets sorted, o_1 < ... < o_m, the contexts at o_i stand for the positions
    [o_i, o_{i+1}) (the first also for [0, o_1), the last up to n), and their weight is

        w_i = sum_{t in that stretch} B_t,        so  sum_i w_i = sum_t B_t = E[N | x];

    contexts that share an offset split its stretch equally.  The time per real iteration is then
    estimated as sum_i w_i t_i / sum_i w_i: each position's time read off the context before it.

    Why not B at the context's own position: the contexts are sparse (every ``stride`` tokens), and B there
    is close to 0 or 1 (at T = 0.4 most positions are surely or surely not an iteration start), so the
    mean rested on one or two contexts per prompt, above all the first, where B = 1 always and the drafts
    agree most (the opening of a reply): on the fast path's main job (8 prompts, K = 3, L = 4) it put
    the target pass at 46.5 ms per iteration, these weights at 49.9, the real runs at 52.9."""
    B = np.asarray(starts, dtype=np.float64)
    o = np.asarray(offsets)
    if B.ndim != 1 or o.ndim != 1 or not len(o):
        raise InvalidInputError(f"starts must be [n] and offsets a non-empty [c]; got shapes {B.shape}, {o.shape}")
    if not np.issubdtype(o.dtype, np.integer) or o.min() < 0 or o.max() >= B.shape[0]:
        raise InvalidInputError(f"offsets must be integer positions in [0, {B.shape[0]}); got {o.tolist()}")
    distinct = np.unique(o)  # sorted
    bounds = np.append(distinct, B.shape[0])
    bounds[0] = 0  # the first stretch also covers the positions before it
    per_offset = np.array([B[a:b].sum() for a, b in zip(bounds[:-1], bounds[1:])])  # [m]
    slot = np.searchsorted(distinct, o)  # [c]
    return per_offset[slot] / np.bincount(slot, minlength=len(distinct))[slot]


def iterations_given_output_reference(survival: np.ndarray | Sequence, L: int, K: int = 1) -> float:
    """E[N | x] by enumerating every path of survivor counts c_0, c_1, ... through the output (each step
    drawn from ``survival``), walking the iterations it implies.  Exponential: tests only."""
    T, K, L = _check_survival(survival, K, L), int(K), int(L)
    n = T.shape[0]

    def walk(t: int, depth: int, k: int) -> float:  # expected iteration starts at positions >= t
        if t >= n:
            return 0.0
        starts = 1.0 if depth == 1 else 0.0
        if depth == L + 1:  # the bonus token
            return starts + walk(t + 1, 1, K)
        return starts + sum(T[t, k - 1, c] * (walk(t + 1, 1, K) if c == 0 else walk(t + 1, depth + 1, c))
                            for c in range(k + 1) if T[t, k - 1, c] > 0.0)

    return walk(0, 1, K)


def kseq_survival(p: "Tensor", q: "Tensor", y: "Tensor", K_max: int) -> "Tensor":
    """P(c drafts stay on the output's path | k reached it, the output y) for K-SEQ, k = 1..K_max.

    At one position with target law p, draft law q and output token y, k i.i.d. drafts from q are tested
    in order by K-SEQ (``mdv.verify.spectr``: accepted with min(1, p/(rho* q)); k = 1 is ``sd``); the drafts
    that stay are those whose token is y, tested or not, and a residual draw y keeps the drafts equal to it.
    With mu = min(q(y), p(y)/rho*), r = 1 - beta(rho*) one draft's rejection, nu = q(y) - mu (token y,
    rejected) and r - nu (another token, rejected):

        P(y, c) = sum_{j=1..k} sum_{b + a = c - 1} C(j-1, b) nu^b (r - nu)^(j-1-b) mu C(k-j, a) q(y)^a (1 - q(y))^(k-j-a)
                  + C(k, c) nu^c (r - nu)^(k-c) p_res(y)                                           (5)

    (draft j is the first accepted, b of the rejected ones before it and a of the untested ones after it
    are also y; or all k are rejected and the residual draws y), and the law is P(y, c) / p(y) (the output
    is p-distributed: the terms sum to p(y)).  At k = 1: [1 - a, a] with a = min(1, q(y)/p(y)), (3).

    p, q: [n, V] float64; y: [n] int64.  -> [n, K_max, K_max + 1] float64 (entries c > k are 0)."""
    import torch

    from mdv.verify.spectr import _reject, kseq_residual, kseq_rho

    n = p.shape[0]
    rows = torch.arange(n)
    py, qy = p[rows, y], q[rows, y]  # [n]
    out = torch.zeros(n, K_max, K_max + 1, dtype=torch.float64)
    for k in range(1, K_max + 1):
        rho = kseq_rho(p, q, k)  # [n]
        mu = torch.minimum(qy, py / rho)
        r = _reject(p, q, rho)
        nu = (qy - mu).clamp_min(0.0)
        other = (r - nu).clamp_min(0.0)
        pres = kseq_residual(p, q, k, rho)[rows, y]  # [n]
        for c in range(k + 1):
            total = math.comb(k, c) * nu ** c * other ** (k - c) * pres  # all rejected, the residual draws y
            for j in range(1, k + 1):  # draft j is the first accepted
                for b in range(0, min(j - 1, c - 1) + 1):
                    a = c - 1 - b
                    if a <= k - j:
                        total = total + (math.comb(j - 1, b) * nu ** b * other ** (j - 1 - b) * mu
                                         * math.comb(k - j, a) * qy ** a * (1.0 - qy) ** (k - j - a))
            out[:, k - 1, c] = total / py
    return out


def kseq_survival_reference(p: "Tensor", q: "Tensor", y: int, k: int) -> list[float]:
    """(5) at one position by enumerating the k-tuples of draft tokens: P(survivors = c | output y), [k+1].
    Exponential in k: tests only."""
    from mdv.verify.spectr import kseq_accept_prob, kseq_residual, kseq_rho

    p1, q1 = p.reshape(1, -1), q.reshape(1, -1)
    rho = kseq_rho(p1, q1, k)
    res = kseq_residual(p1, q1, k, rho)[0]
    V = p.shape[-1]
    joint = [0.0] * (k + 1)
    for drafts in itertools.product(range(V), repeat=k):
        prob = math.prod(float(q[d]) for d in drafts)
        if prob == 0.0:
            continue
        c = sum(d == y for d in drafts)
        rejected_so_far = 1.0
        for d in drafts:
            w = float(kseq_accept_prob(p[d:d + 1], q[d:d + 1], rho)[0])
            if d == y:
                joint[c] += prob * rejected_so_far * w
            rejected_so_far *= 1.0 - w
        joint[c] += prob * rejected_so_far * float(res[y])
    return [v / float(p[y]) for v in joint]
