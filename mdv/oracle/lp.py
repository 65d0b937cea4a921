"""Exact LP oracles and closed forms on tiny vocabularies (algorithms.md §2, §6.3, §7).

Letters follow algorithms.md §1: p = target, q = draft, K i.i.d. drafts of length L, Ω the vocabulary
(V = |Ω|).  Block joints are measured from the end of ``prompt``:
``P(u) = Π_j p(u_j | prompt, u_<j)`` and ``Q(u) = Π_j q(u_j | prompt, u_<j)``, with p and q the laws
*after* the sampling transform (temperature / top-k / top-p, §8).

What is here:

* :func:`membership_ot` -- SpecTr's single-token optimum α*_K (OT with membership cost, §7.1), by
  POT's network simplex; :func:`membership_ot_mincut` -- its closed form
  ``min_{H ⊆ Ω} [p(H) + 1 - q(H)^K]``; :func:`membership_ot_upper_bound` -- SpecTr's bound.
* :func:`lp_greedy` -- the block OT "LP-greedy" of §7.2 (greedy semantics: later targets may be
  adjusted), by POT; :func:`lp_valid` -- the per-iteration-valid block LP "LP-valid" of §7.3, by
  scipy's HiGHS; :func:`lp_optimum` dispatches between them.
* Closed forms used by identity tests: :func:`paper_claimed_expected_accepted` (the φ-sum of §6.3),
  :func:`gbv_expected_accepted_formula` (Σ min(P, Q), §5 / §7.2) and
  :func:`sd_expected_accepted_formula` (the product formula of §2).

Everything is exact enumeration in float64; the LPs grow like V^(L·K), so sizes are capped (see
:data:`MAX_DRAFT_TUPLES`, :data:`MAX_COST_ENTRIES`, :data:`MAX_VALID_VARIABLES`).  A solver that does
not report optimality raises :class:`LPSolveError`.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import ot
import scipy.sparse as sp
import torch
from scipy.optimize import linprog

from mdv.errors import InvalidInputError, MdvError
from mdv.models.base import LanguageModel, check_model, check_token_ids
from mdv.models.sampling import SamplingConfig

__all__ = [
    "LPSolveError",
    "LP_KINDS",
    "MAX_DRAFT_TUPLES",
    "MAX_COST_ENTRIES",
    "MAX_VALID_VARIABLES",
    "MAX_MINCUT_VOCAB",
    "BlockJoints",
    "membership_ot",
    "membership_ot_mincut",
    "membership_ot_upper_bound",
    "block_joints",
    "lp_greedy",
    "lp_valid",
    "lp_optimum",
    "paper_claimed_expected_accepted",
    "gbv_expected_accepted_formula",
    "sd_expected_accepted_formula",
]

#: The kinds accepted by :func:`lp_optimum`.
LP_KINDS: tuple[str, ...] = ("valid", "greedy")
#: Ceiling on the number of draft tuples V^(L·K) (LP rows) for both block LPs, and on V^K for
#: :func:`membership_ot` (algorithms.md §7.0: "practical ceiling about V^{L·K} ≤ 2·10^4 rows").
MAX_DRAFT_TUPLES = 20_000
#: Ceiling on the dense cost matrix of :func:`lp_greedy`: V^(L·K) · V^L = V^(L·(K+1)) entries
#: (4·10^6 float64 = 32 MB; the binding limit at K = 1).
MAX_COST_ENTRIES = 4_000_000
#: Ceiling on the a-priori variable count of :func:`lp_valid`: V^(L·K) · K · (L+1) · V.
MAX_VALID_VARIABLES = 600_000
#: :func:`membership_ot_mincut` enumerates all 2^V subsets.
MAX_MINCUT_VOCAB = 20

# Probability vectors given to the single-token functions must sum to 1 within this tolerance.
_SUM_TOL = 1e-6


class LPSolveError(MdvError, RuntimeError):
    """An LP / OT solver did not report an optimal solution (the message carries its status)."""


# ---------------------------------------------------------------------------------------- helpers
def _check_positive_int(name: str, value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise InvalidInputError(f"{name} ({what}) must be an integer >= 1; got {name}={value!r}")
    return int(value)


def _prob_vector(name: str, x: object) -> np.ndarray:
    """A float64 1-D probability vector, validated (finite, >= 0, sums to 1 within 1e-6) and renormalised."""
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    v = np.asarray(x, dtype=np.float64)
    if v.ndim != 1 or v.size == 0:
        raise InvalidInputError(f"{name} must be a non-empty 1-D probability vector; got shape {v.shape}")
    if not np.isfinite(v).all() or (v < 0).any():
        raise InvalidInputError(f"{name} must be finite and non-negative; got {v}")
    s = float(v.sum())
    if abs(s - 1.0) > _SUM_TOL:
        raise InvalidInputError(f"{name} must sum to 1 (got sum {s:.9g}); pass probabilities, not logits")
    return v / s


def _pq(p: object, q: object, K: object) -> tuple[np.ndarray, np.ndarray, int]:
    pv, qv = _prob_vector("p (target)", p), _prob_vector("q (draft)", q)
    if pv.shape != qv.shape:
        raise InvalidInputError(f"p and q must have the same length (vocabulary); got {pv.size} and {qv.size}")
    return pv, qv, _check_positive_int("K", K, "number of drafts")


def _one_minus_pow_one_minus(x: np.ndarray, K: int) -> np.ndarray:
    """``1 - (1 - x)^K`` for x in [0, 1], computed as ``-expm1(K·log1p(-x))`` (algorithms.md §12.11)."""
    x = np.clip(np.asarray(x, dtype=np.float64), 0.0, 1.0)
    with np.errstate(divide="ignore"):
        return -np.expm1(K * np.log1p(-x))


def _emd_value(a: np.ndarray, b: np.ndarray, M: np.ndarray, what: str) -> float:
    """``Σ G∘M`` for the optimal plan ``G = ot.emd(a, b, M)``; raises :class:`LPSolveError` unless POT's
    network simplex reports ``result_code == 1`` (optimal)."""
    a = np.ascontiguousarray(a / a.sum(), dtype=np.float64)
    b = np.ascontiguousarray(b / b.sum(), dtype=np.float64)
    M = np.ascontiguousarray(M, dtype=np.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # POT warns on non-optimal exits; we raise instead
        G, log = ot.emd(a, b, M, numItermax=10_000_000, log=True)
    if int(log["result_code"]) != 1:
        raise LPSolveError(
            f"{what}: POT ot.emd did not reach optimality (result_code={log['result_code']},"
            f" {log['warning']!r}); cost matrix {M.shape[0]}x{M.shape[1]}")
    return float((np.asarray(G) * M).sum())


# ---------------------------------------------------------------------------------------- §7.1
def membership_ot(p: Sequence[float] | np.ndarray | torch.Tensor, q: Sequence[float] | np.ndarray | torch.Tensor,
                  K: int) -> float:
    """SpecTr's optimal single-token acceptance α*_K(p, q): OT with membership cost (algorithms.md §7.1).

    LP over ``π(x̄, y) ≥ 0``, ``x̄ ∈ Ω^K`` (the K i.i.d. draft tokens), ``y ∈ Ω`` (the output)::

        maximise   Σ π(x̄, y) · 1[y ∈ x̄]
        subject to Σ_y π(x̄, y) = Π_k q(x̄_k)    for every x̄   (drafts i.i.d. q)
                   Σ_x̄ π(x̄, y) = p(y)          for every y    (output ~ p)

    Solved as ``G = ot.emd(a, b, M)`` with ``a = q^{⊗K}`` flattened over Ω^K, ``b = p`` and cost
    ``M(x̄, y) = 1[y ∉ x̄]``; returns ``α* = 1 - Σ G∘M``.  Requires V^K ≤ :data:`MAX_DRAFT_TUPLES`.
    """
    pv, qv, K = _pq(p, q, K)
    V = pv.size
    if V ** K > MAX_DRAFT_TUPLES:
        raise InvalidInputError(
            f"membership_ot: V^K = {V}^{K} = {V ** K} draft tuples exceeds the ceiling MAX_DRAFT_TUPLES ="
            f" {MAX_DRAFT_TUPLES}; use membership_ot_mincut (2^V subsets) for larger K")
    tuples = np.indices((V,) * K).reshape(K, -1).T  # [V^K, K], lexicographic
    a = np.prod(qv[tuples], axis=1)
    member = (tuples[:, :, None] == np.arange(V)[None, None, :]).any(axis=1)  # [V^K, V]
    M = (~member).astype(np.float64)
    keep = a > 0
    return 1.0 - _emd_value(a[keep], pv, M[keep], "membership_ot")


def membership_ot_mincut(p: Sequence[float] | np.ndarray | torch.Tensor,
                         q: Sequence[float] | np.ndarray | torch.Tensor, K: int) -> float:
    """Closed form of α*_K (algorithms.md §7.1, a max-flow/min-cut argument)::

        α*_K(p, q) = min over subsets H ⊆ Ω of [ p(H) + 1 - q(H)^K ]

    (H = ∅ gives 1.)  Enumerates all 2^V subsets; requires V ≤ :data:`MAX_MINCUT_VOCAB`.
    """
    pv, qv, K = _pq(p, q, K)
    V = pv.size
    if V > MAX_MINCUT_VOCAB:
        raise InvalidInputError(
            f"membership_ot_mincut enumerates 2^V subsets; V = {V} exceeds MAX_MINCUT_VOCAB = {MAX_MINCUT_VOCAB}")
    masks = ((np.arange(2 ** V)[:, None] >> np.arange(V)[None, :]) & 1).astype(np.float64)  # [2^V, V]
    pH, qH = masks @ pv, masks @ qv
    return float(np.min(pH + 1.0 - np.clip(qH, 0.0, 1.0) ** K))


def membership_ot_upper_bound(p: Sequence[float] | np.ndarray | torch.Tensor,
                              q: Sequence[float] | np.ndarray | torch.Tensor, K: int) -> float:
    """SpecTr's upper bound on α*_K (algorithms.md §3.1): ``Σ_y min{ p(y), 1 - (1 - q(y))^K }``."""
    pv, qv, K = _pq(p, q, K)
    return float(np.minimum(pv, _one_minus_pow_one_minus(qv, K)).sum())


# ---------------------------------------------------------------------------------------- joints
@dataclass(frozen=True)
class BlockJoints:
    """All V^L blocks from the prompt with their joint probabilities.

    blocks: [V^L, L] int64, in lexicographic order (block index = Σ_j u_j V^(L-j));
    P, Q:   [V^L] float64 -- ``P(u) = Π_j p(u_j | prompt, u_<j)``, ``Q(u)`` likewise for the draft.
    """

    blocks: np.ndarray
    P: np.ndarray
    Q: np.ndarray


def _vocab(target: LanguageModel, draft: LanguageModel) -> int:
    V, Vd = check_model("target", target), check_model("draft", draft)
    if V != Vd:
        raise InvalidInputError(
            f"target and draft must share one vocabulary; got target.vocab_size={V}, draft.vocab_size={Vd}")
    return V


def _conditional_tree(model: LanguageModel, depth: int, prompt: Sequence[int],
                      sampling: SamplingConfig) -> list[np.ndarray]:
    """``C[t]`` for t = 1..depth: array of shape [V]*t with ``C[t][u] = model(u_t | prompt, u_<t)`` after
    the sampling transform.  ``C[0]`` is the scalar 1.  One batched ``next_logprobs`` call per depth."""
    V = int(model.vocab_size)
    prompt = tuple(check_token_ids("prompt", prompt, V, allow_empty=True))
    C: list[np.ndarray] = [np.ones(())]
    for t in range(depth):
        prefixes = [prompt + tuple(int(x) for x in u) for u in np.ndindex(*((V,) * t))] if t else [prompt]
        logits = model.next_logprobs(prefixes)
        probs = sampling.probs(torch.as_tensor(logits).detach().cpu()).numpy().astype(np.float64)
        if probs.shape != (len(prefixes), V):
            raise InvalidInputError(
                f"next_logprobs returned shape {tuple(probs.shape)}, expected ({len(prefixes)}, {V})")
        if not np.isfinite(probs).all():
            raise InvalidInputError(f"the sampling law after a prefix of length {len(prompt) + t} is not finite")
        C.append(probs.reshape((V,) * (t + 1)))
    return C


def _joint_tree(C: list[np.ndarray]) -> list[np.ndarray]:
    """Joints ``J[t][u] = Π_{i ≤ t} C[i][u_≤i]`` from a conditional tree (J[0] = 1)."""
    J = [np.ones(())]
    for t in range(1, len(C)):
        J.append(J[-1][..., None] * C[t])
    return J


def _joint_trees(target: LanguageModel, draft: LanguageModel, L: int, prompt: Sequence[int],
                 sampling: SamplingConfig, target_depth: int | None = None
                 ) -> tuple[int, list[np.ndarray], list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
    V = _vocab(target, draft)
    Cp = _conditional_tree(target, L if target_depth is None else target_depth, prompt, sampling)
    Cq = _conditional_tree(draft, L, prompt, sampling)
    return V, Cp, Cq, _joint_tree(Cp), _joint_tree(Cq)


def block_joints(target: LanguageModel, draft: LanguageModel, L: int, prompt: Sequence[int] = (),
                 sampling: SamplingConfig = SamplingConfig()) -> BlockJoints:
    """All V^L blocks u with ``P(u)`` and ``Q(u)`` from ``prompt`` (algorithms.md §1), using each model's
    ``next_logprobs`` passed through ``sampling.probs`` (the same transform for both, §8)."""
    L = _check_positive_int("L", L, "draft length")
    _, _, _, Jp, Jq = _joint_trees(target, draft, L, prompt, sampling)
    V = Jp[L].shape[0]
    blocks = np.indices((V,) * L).reshape(L, -1).T.astype(np.int64)
    return BlockJoints(blocks=blocks, P=Jp[L].reshape(-1).copy(), Q=Jq[L].reshape(-1).copy())


def _check_sizes(kind: str, V: int, K: int, L: int) -> None:
    tuples = V ** (L * K)
    if tuples > MAX_DRAFT_TUPLES:
        raise InvalidInputError(
            f"lp_{kind}: V^(L·K) = {V}^({L}·{K}) = {tuples} draft tuples (LP rows) exceeds the ceiling"
            f" MAX_DRAFT_TUPLES = {MAX_DRAFT_TUPLES}; use a smaller vocabulary V, block length L or draft count K")
    if kind == "greedy" and tuples * V ** L > MAX_COST_ENTRIES:
        raise InvalidInputError(
            f"lp_greedy: the cost matrix has V^(L·K) x V^L = {tuples} x {V ** L} = {tuples * V ** L} entries,"
            f" above the ceiling MAX_COST_ENTRIES = {MAX_COST_ENTRIES} (V={V}, L={L}, K={K}); use a smaller V or L")
    if kind == "valid" and tuples * K * (L + 1) * V > MAX_VALID_VARIABLES:
        raise InvalidInputError(
            f"lp_valid: V^(L·K)·K·(L+1)·V = {tuples * K * (L + 1) * V} candidate variables (V={V}, L={L}, K={K})"
            f" exceeds the ceiling MAX_VALID_VARIABLES = {MAX_VALID_VARIABLES}; use a smaller V, L or K")


def _draft_tuples(Q: np.ndarray, K: int) -> tuple[np.ndarray, np.ndarray]:
    """Draft tuples d̄ over the *support* of Q: indices [N, K] into the blocks and masses Π_k Q(d_k) [N].

    Tuples with a zero-mass draft are dropped: their row of the LP forces π = 0."""
    support = np.flatnonzero(Q > 0)
    n = support.size
    idx = support[np.indices((n,) * K).reshape(K, -1).T]  # [n^K, K]
    mass = np.prod(Q[idx], axis=1)
    keep = mass > 0
    return idx[keep], mass[keep]


# ---------------------------------------------------------------------------------------- §7.2
def lp_greedy(target: LanguageModel, draft: LanguageModel, K: int, L: int, prompt: Sequence[int] = (),
              sampling: SamplingConfig = SamplingConfig()) -> float:
    """LP-greedy (algorithms.md §7.2): the best one-iteration E[tau] of any *greedy* verifier with K
    i.i.d. drafts of length L (later targets may be adjusted), as a block optimal-transport problem.

    LP over ``π(d̄, z) ≥ 0``, ``d̄ = (d_1..d_K) ∈ (Ω^L)^K`` (drafts), ``z ∈ Ω^L`` (target block)::

        maximise   Σ π(d̄, z) · max_k LCP(d_k, z)
        subject to Σ_z π(d̄, z) = Π_k Q(d_k)    for every d̄
                   Σ_d̄ π(d̄, z) = P(z)         for every z

    LCP = longest-common-prefix length.  Solved by ``ot.emd`` with cost ``M = L - max_k LCP(d_k, z)``;
    ``E*[tau] = L - Σ G∘M``.  Rows with Π_k Q(d_k) = 0 and columns with P(z) = 0 are dropped (their
    transport mass is zero).  At K = 1 it equals :func:`gbv_expected_accepted_formula`.
    Requires V^(L·K) ≤ :data:`MAX_DRAFT_TUPLES` and V^(L·(K+1)) ≤ :data:`MAX_COST_ENTRIES`.
    """
    K = _check_positive_int("K", K, "number of drafts")
    L = _check_positive_int("L", L, "draft length")
    V = _vocab(target, draft)
    _check_sizes("greedy", V, K, L)
    bj = block_joints(target, draft, L, prompt, sampling)
    # LCP between every pair of blocks: the number of leading positions that agree.
    eq = bj.blocks[:, None, :] == bj.blocks[None, :, :]  # [V^L, V^L, L]
    lcp = np.cumprod(eq, axis=-1).sum(-1)  # [V^L, V^L]
    cols = np.flatnonzero(bj.P > 0)
    idx, a = _draft_tuples(bj.Q, K)
    lcp = lcp[:, cols]
    best = lcp[idx[:, 0]]  # [N, |cols|]: max_k LCP(d_k, z), accumulated over k
    for k in range(1, K):
        np.maximum(best, lcp[idx[:, k]], out=best)
    M = (L - best).astype(np.float64)
    return float(L - _emd_value(a, bj.P[cols], M, "lp_greedy"))


# ---------------------------------------------------------------------------------------- §7.3
def lp_valid(target: LanguageModel, draft: LanguageModel, K: int, L: int, prompt: Sequence[int] = (),
             sampling: SamplingConfig = SamplingConfig()) -> float:
    """LP-valid (algorithms.md §7.3): the best one-iteration E[tau] of any *per-iteration valid* verifier
    (SD, BV, SpecTr) with K i.i.d. drafts of length L.

    The verifier emits ``O = d_k,≤j · y`` (a length-j prefix of some draft, j = 0..L, plus one free token
    y ∈ Ω), and ``tau = |O| - 1``.  LP over ``π(d̄, o) ≥ 0`` for every draft tuple d̄ and every o in
    ``O(d̄) = {d_k,≤j · y}``::

        maximise   Σ π(d̄, o) · (|o| - 1)
        subject to Σ_{o ∈ O(d̄)} π(d̄, o) = Π_k Q(d_k)                      for every d̄
                   Σ_d̄ Σ_{o ∈ O(d̄), o ⪯ s} π(d̄, o) · P(s after o | o) = P(s)   for every s ∈ Ω^{L+1}

    where ``P(s after o | o) = Π_{i > |o|} p(s_i | prompt, s_<i)``: O followed by ordinary target sampling
    reproduces the target on Ω^{L+1}.  Implementation: the second family is written on auxiliary
    marginals ``m(o) = Σ_d̄ π(d̄, o)`` (one linking row per output o that occurs), which keeps every
    s-row at ≤ L+1 entries; this is the same LP.  Both marginals sum to one, so one equality is
    redundant; it is dropped (the last s-row) before calling scipy ``linprog(method="highs")``, as §7.3
    prescribes (HiGHS presolve can misreport infeasibility otherwise).  If HiGHS still reports
    "infeasible" (seen with probabilities ~1e-10), the solve is retried once without presolve (slow).
    Draft tuples with zero mass are dropped.  At K = 1 it equals BV's ``Σ_i E[w_i]`` (§4).
    Requires V^(L·K) ≤ :data:`MAX_DRAFT_TUPLES` and V^(L·K)·K·(L+1)·V ≤ :data:`MAX_VALID_VARIABLES`.
    """
    K = _check_positive_int("K", K, "number of drafts")
    L = _check_positive_int("L", L, "draft length")
    V = _vocab(target, draft)
    _check_sizes("valid", V, K, L)
    _, Cp, _, Jp, Jq = _joint_trees(target, draft, L, prompt, sampling, target_depth=L + 1)
    n_full = V ** (L + 1)
    full = np.indices((V,) * (L + 1)).reshape(L + 1, -1).T  # [V^(L+1), L+1], lexicographic
    # cond[i][s] = p(s_i | prompt, s_<i) for full strings s, i = 1..L+1
    cond = [None] + [Cp[i][tuple(full[:, :i].T)] for i in range(1, L + 2)]
    # tail[l][s] = P(s after its first l tokens | s_≤l) = Π_{i > l} cond[i][s], l = 1..L+1
    tail = [None] * (L + 2)
    tail[L + 1] = np.ones(n_full)
    for l in range(L, 0, -1):
        tail[l] = tail[l + 1] * cond[l + 1]
    P_full = Jp[L + 1].reshape(-1)

    blocks = np.indices((V,) * L).reshape(L, -1).T  # [V^L, L]
    idx, a = _draft_tuples(Jq[L].reshape(-1), K)  # [N, K], [N]
    N = idx.shape[0]
    # Lexicographic code of every prefix d_k,≤j (j = 0..L) of every draft: [N, K, L+1]
    codes = np.zeros((N, K, L + 1), dtype=np.int64)
    drafts = blocks[idx]  # [N, K, L]
    for j in range(1, L + 1):
        codes[:, :, j] = codes[:, :, j - 1] * V + drafts[:, :, j - 1]
    # Outputs o = prefix_j · y have length l = j + 1 and code codes_j * V + y.  Global id: offset[l-1] + code.
    offset = np.concatenate([[0], np.cumsum(V ** np.arange(1, L + 2))])  # offset[l-1] for length l
    out_code = codes[:, :, :, None] * V + np.arange(V)[None, None, None, :]  # [N, K, L+1, V]
    out_len = np.broadcast_to(np.arange(1, L + 2)[None, None, :, None], out_code.shape)
    out_id = offset[out_len - 1] + out_code
    row = np.broadcast_to(np.arange(N)[:, None, None, None], out_code.shape)
    n_out = int(offset[-1])
    pairs = np.unique(row.reshape(-1).astype(np.int64) * n_out + out_id.reshape(-1))
    var_row, var_out = pairs // n_out, pairs % n_out
    nv = pairs.size
    var_len = np.searchsorted(offset, var_out, side="right")  # length l of each output (1..L+1)

    # Used outputs get a marginal variable m(o) = Pr(O = o) = Σ_d̄ π(d̄, o); the target constraint is
    # written on m, so each s-row has at most L+1 entries however many draft tuples there are.
    used, var_m = np.unique(var_out, return_inverse=True)
    nm = used.size
    m_len = np.searchsorted(offset, used, side="right")
    m_code = used - offset[m_len - 1]
    # Rows 0..N-1: Σ_o π(d̄, o) = Q(d̄)
    r1, c1, v1 = var_row, np.arange(nv), np.ones(nv)
    # Rows N..N+nm-1: Σ_d̄ π(d̄, o) - m(o) = 0
    r2 = np.concatenate([N + var_m, N + np.arange(nm)])
    c2 = np.concatenate([np.arange(nv), nv + np.arange(nm)])
    v2 = np.concatenate([np.ones(nv), -np.ones(nm)])
    # Rows N+nm..: for each s ∈ Ω^{L+1}, Σ_{o ⪯ s} m(o) P(s after o | o) = P(s); the s extending o form
    # the contiguous range code(o)·W .. code(o)·W + W - 1, W = V^(L+1-|o|).
    r3, c3, v3 = [], [], []
    for l in range(1, L + 2):
        sel = np.flatnonzero(m_len == l)
        if sel.size == 0:
            continue
        W = V ** (L + 1 - l)
        s = m_code[sel][:, None] * W + np.arange(W)[None, :]  # [n_l, W]
        r3.append(s.reshape(-1))
        c3.append(np.repeat(nv + sel, W))
        v3.append(tail[l][s].reshape(-1))
    r3a, c3a, v3a = np.concatenate(r3), np.concatenate(c3), np.concatenate(v3)
    nz = v3a != 0
    A = sp.csr_matrix(
        (np.concatenate([v1, v2, v3a[nz]]),
         (np.concatenate([r1, r2, N + nm + r3a[nz]]), np.concatenate([c1, c2, c3a[nz]]))),
        shape=(N + nm + n_full, nv + nm))
    b = np.concatenate([a / a.sum(), np.zeros(nm), P_full / P_full.sum()])
    A, b = A[:-1], b[:-1]  # drop one redundant equality (the last s-row), algorithms.md §7.3
    c = np.concatenate([-(var_len - 1).astype(np.float64), np.zeros(nm)])
    res = linprog(c, A_eq=A, b_eq=b, bounds=(0, None), method="highs")
    if res.status == 2:
        # The LP is feasible by construction (SD is a valid verifier), so "infeasible" is a presolve
        # artefact; seen with probabilities ~1e-10 (V = 40 Dirichlet toys).  Retry without presolve.
        res = linprog(c, A_eq=A, b_eq=b, bounds=(0, None), method="highs", options={"presolve": False})
    if res.status != 0:
        raise LPSolveError(
            f"lp_valid: HiGHS did not reach optimality (status={res.status}: {res.message}); LP with {N} draft"
            f" tuples, {nv} variables, V={V}, L={L}, K={K}")
    return float(-res.fun)


# ---------------------------------------------------------------------------------------- dispatch
def lp_optimum(target: LanguageModel, draft: LanguageModel, K: int, L: int, kind: str,
               prompt: Sequence[int] = (), temperature: float = 1.0, top_k: int | None = None,
               top_p: float | None = None) -> float:
    """The exact one-iteration optimum of E[tau] for K drafts of length L from ``prompt``:
    ``kind="valid"`` -> :func:`lp_valid` (§7.3), ``kind="greedy"`` -> :func:`lp_greedy` (§7.2).

    The same temperature / top-k / top-p transform is applied to both models (§8).  Raises
    :class:`~mdv.errors.InvalidInputError` for an unknown kind, K < 1, L < 1, or sizes above the
    ceilings (:data:`MAX_DRAFT_TUPLES` = 2·10^4 draft tuples V^(L·K), and the per-kind limits)."""
    if kind not in LP_KINDS:
        raise InvalidInputError(f"unknown LP kind {kind!r}; valid kinds are: {', '.join(LP_KINDS)}")
    K = _check_positive_int("K", K, "number of drafts")
    L = _check_positive_int("L", L, "draft length")
    sampling = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p)
    fn = lp_valid if kind == "valid" else lp_greedy
    return fn(target, draft, K, L, prompt, sampling)


# ---------------------------------------------------------------------------------------- closed forms
def paper_claimed_expected_accepted(target: LanguageModel, draft: LanguageModel, K: int, L: int,
                                    prompt: Sequence[int] = (),
                                    sampling: SamplingConfig = SamplingConfig()) -> float:
    """SpecTr-GBV's claimed expected accepted length, the φ-sum of algorithms.md §6.3::

        E_paper[tau] = Σ_{t=1..L} Σ_{u ∈ Ω^t} φ_K(u),   φ_K(u) = P(u) · [1 - (1 - r(u))^K],
        r(u) = min{ Q(u)/P(u), 1 }  (r = 1 where P(u) = 0, which gives φ = 0).

    ``1 - (1 - r)^K`` is computed as ``-expm1(K·log1p(-r))``.  At K = 1 it is Σ min(P, Q)."""
    K = _check_positive_int("K", K, "number of drafts")
    L = _check_positive_int("L", L, "draft length")
    _, _, _, Jp, Jq = _joint_trees(target, draft, L, prompt, sampling)
    total = 0.0
    for t in range(1, L + 1):
        P, Q = Jp[t].reshape(-1), Jq[t].reshape(-1)
        with np.errstate(divide="ignore", invalid="ignore"):
            r = np.where(P > 0, np.minimum(Q / np.where(P > 0, P, 1.0), 1.0), 1.0)
        total += float((P * _one_minus_pow_one_minus(r, K)).sum())
    return total


def gbv_expected_accepted_formula(target: LanguageModel, draft: LanguageModel, L: int,
                                  prompt: Sequence[int] = (),
                                  sampling: SamplingConfig = SamplingConfig()) -> float:
    """GBV's expected accepted length (algorithms.md §5, = LP-greedy at K = 1, §7.2)::

        E[tau_GBV] = Σ_{t=1..L} Σ_{u ∈ Ω^t} min{ P(u), Q(u) }."""
    L = _check_positive_int("L", L, "draft length")
    _, _, _, Jp, Jq = _joint_trees(target, draft, L, prompt, sampling)
    return float(sum(np.minimum(Jp[t], Jq[t]).sum() for t in range(1, L + 1)))


def sd_expected_accepted_formula(target: LanguageModel, draft: LanguageModel, L: int,
                                 prompt: Sequence[int] = (),
                                 sampling: SamplingConfig = SamplingConfig()) -> float:
    """Token-level SD's expected accepted length for context-dependent models (algorithms.md §2)::

        E[tau_SD] = Σ_{i=1..L} Σ_{u ∈ Ω^i} Π_{j=1..i} min{ p(u_j | prompt, u_<j), q(u_j | prompt, u_<j) }."""
    L = _check_positive_int("L", L, "draft length")
    _, Cp, Cq, _, _ = _joint_trees(target, draft, L, prompt, sampling)
    mins = [np.ones(())] + [np.minimum(Cp[t], Cq[t]) for t in range(1, L + 1)]
    return float(sum(m.sum() for m in _joint_tree(mins)[1:]))
