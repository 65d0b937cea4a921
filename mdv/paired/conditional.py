"""The paired estimator: every verifier's exact conditional acceptance given one set of drafts.

At a context c the draft proposes ``K_max`` i.i.d. blocks of length ``L_max`` and the target scores them
in one token-tree pass; that gives a :class:`~mdv.verify.base.Block` with tokens [1, K_max, L_max].  For
every verifier m, every K ≤ K_max (the first K drafts) and every L ≤ L_max (the block prefixes, with the
target laws the tree already holds) the verifier's own exact ``law`` (fresh state) gives

    E[tau | c, D]          = Σ_branches prob · tau
    P(tau ≥ i | c, D)      = Σ_branches prob · 1[tau ≥ i],   i = 1..L,

so ``1 + E[tau | c, D]`` is the block efficiency of one iteration at that context.  Averaging over D
(drafts) and c (contexts from target trajectories) estimates the per-iteration block efficiency with
*common random numbers*: every (m, K, L) sees the same drafts, so differences are paired.

Two implementations of one rule (the guide's reference / fast pair):

* :func:`conditional_acceptance_reference` -- one ``law`` call per (K, L) on the full vocabulary.
* :func:`conditional_acceptance` -- the same numbers with less work, each step exact:

  1. **Undrafted columns lumped.**  Columns x with q(x) = 0 in every row of the block (the default
     draft's vocabulary-subset head leaves 40,960 of 49,152 ids at q = 0) enter every verifier only
     through functions that are linear in p(x) when q(x) = 0 (``min(p, ρq) = 0``, ``(p − ρq)_+ = p``,
     row sums): they are replaced by ONE column holding their total target mass
     (:func:`lump_undrafted`).  The accepted lengths' law is unchanged (the next-token law is not
     needed here and is over the lumped vocabulary).
  2. **Token-level rules stop early.**  For a verifier with ``prefix_consistent`` (``sd``, ``spectr``:
     the decision at depth i uses only depth-i quantities), the run with block length L is the run with
     length L_max stopped at L, so ``P(tau_L ≥ i) = P(tau_Lmax ≥ i)`` for i ≤ L: one ``law`` call per K.
  3. **The law of tau alone.**  :meth:`~mdv.verify.base.Verifier.acceptance_law` (the marginal of ``law``
     over the kept draft and the next token) instead of ``law``: ``mdbv`` and ``spectr_gbv`` skip the
     next-token law of every branch, most of their ``law`` time.
  4. **Every K from one pass.**  For a verifier with ``drafts_in_sequence`` (``mdbv``: the K'-draft run is
     the K-draft run stopped after draft K'), :meth:`~mdv.verify.base.Verifier.acceptance_laws_upto_K`
     gives all K ≤ K_max from one recursion per L.

``tests/test_paired.py`` checks the two against each other on random and real blocks.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
from torch import Tensor

from mdv.errors import InvalidInputError, unknown_name
from mdv.verify.base import Block, Verifier


@dataclass(frozen=True)
class ConditionalAcceptance:
    """Exact conditional acceptance of one verifier at one context, for every (K, L) it runs at.

    etau:  [K_max, L_max] float64 -- E[tau | c, D_1..K, first L tokens]; NaN where the verifier does not
           run (single-draft verifiers at K ≥ 2).
    reach: [K_max, L_max, L_max] float64 -- reach[K-1, L-1, i-1] = P(tau ≥ i | ...), i ≤ L (NaN for i > L).
    """

    method: str
    etau: np.ndarray
    reach: np.ndarray


def sub_block(block: Block, K: int, L: int) -> Block:
    """The first K drafts and their first L tokens; the target laws at the L + 1 positions."""
    return Block(block.tokens[:, :K, :L], block.q[:, :K, :L], block.p[:, :K, :L + 1])


def lump_undrafted(block: Block) -> Block:
    """``block`` over the columns where some q row is positive, plus one column holding the target mass
    of all the others (q = 0 there).  Token ids are renumbered; exact for acceptance laws (module doc).

    tokens [B, K, L] -> [B, K, L]; q [B, K, L, V] -> [B, K, L, V'+1]; p [B, K, L+1, V] -> [.., V'+1].
    """
    drafted = (block.q > 0).flatten(0, -2).any(0)  # [V]
    if int((~drafted).sum()) <= 1:  # nothing to gain (a lumped block stays as it is)
        return block
    new_id = torch.cumsum(drafted.long(), 0) - 1  # [V]
    tokens = new_id[block.tokens.long()]
    q = torch.cat([block.q[..., drafted], torch.zeros_like(block.q[..., :1])], -1)
    rest = block.p[..., ~drafted].sum(-1, keepdim=True)  # summed directly: no 1 − Σ cancellation
    p = torch.cat([block.p[..., drafted], rest], -1)
    return Block(tokens, q, p)


def _check(method: str, block: Block) -> type[Verifier]:
    from mdv.verify.registry import VERIFIERS

    if method not in VERIFIERS:
        raise unknown_name("method", method, list(VERIFIERS))
    if block.B != 1:
        raise InvalidInputError(f"the paired estimator takes one context at a time (B = 1); got B = {block.B}")
    return VERIFIERS[method]


def _moments(verifier: Verifier, block: Block) -> tuple[float, np.ndarray]:
    """(E[tau], [P(tau ≥ i)]_{i=1..L}) from the verifier's exact law of tau (``acceptance_law``, the
    marginal of ``law``) with a fresh state."""
    return _law_moments(verifier.acceptance_law(block, verifier.initial_state())[0])


def _law_moments(law: Tensor) -> tuple[float, np.ndarray]:
    """(E[tau], [P(tau ≥ i)]_{i=1..L}) of law [L+1] = P(tau = t), t = 0..L."""
    law = law.to("cpu", torch.float64)
    tail = law.flip(0).cumsum(0).flip(0)  # [L+1]: P(tau >= t), t = 0..L
    etau = (law * torch.arange(law.shape[0], dtype=torch.float64)).sum()
    return float(etau), tail[1:].numpy()


def _moments_reference(verifier: Verifier, block: Block) -> tuple[float, np.ndarray]:
    """:func:`_moments` summed branch by branch over the full outcome law ``law``."""
    L = block.L
    reach = torch.zeros(L, dtype=torch.float64)
    etau = torch.zeros((), dtype=torch.float64)
    for br in verifier.law(block, verifier.initial_state()):
        prob, tau = br.prob[0].cpu(), int(br.tau[0])
        etau += prob * tau
        if tau >= 1:
            reach[:tau] += prob
    return float(etau), reach.numpy()


def _empty(K_max: int, L_max: int) -> tuple[np.ndarray, np.ndarray]:
    return np.full((K_max, L_max), np.nan), np.full((K_max, L_max, L_max), np.nan)


def conditional_acceptance_reference(method: str, block: Block) -> ConditionalAcceptance:
    """Slow path: one exact ``law`` call per (K, L) on the full vocabulary.  block: tokens [1, K_max, L_max]."""
    cls = _check(method, block)
    K_max, L_max = block.K, block.L
    etau, reach = _empty(K_max, L_max)
    for K in range(1, (K_max if cls.multi_draft else 1) + 1):
        for L in range(1, L_max + 1):
            e, r = _moments_reference(cls(), sub_block(block, K, L))
            etau[K - 1, L - 1] = e
            reach[K - 1, L - 1, :L] = r
    return ConditionalAcceptance(method, etau, reach)


def conditional_acceptance(method: str, block: Block, lumped: bool = False) -> ConditionalAcceptance:
    """Fast path of :func:`conditional_acceptance_reference` (module doc): same values to rounding.

    ``lumped=True`` says ``block`` is already :func:`lump_undrafted` (the measurement lumps once per context
    for all verifiers).
    """
    cls = _check(method, block)
    if not lumped:
        block = lump_undrafted(block)
    K_max, L_max = block.K, block.L
    etau, reach = _empty(K_max, L_max)
    if cls.multi_draft and cls.drafts_in_sequence:  # step 4: every K from one pass per L
        for L in range(1, L_max + 1):
            v = cls()
            law = v.acceptance_laws_upto_K(sub_block(block, K_max, L), v.initial_state())[0]  # [K_max, L+1]
            for K in range(1, K_max + 1):
                etau[K - 1, L - 1], reach[K - 1, L - 1, :L] = _law_moments(law[K - 1])
        return ConditionalAcceptance(method, etau, reach)
    for K in range(1, (K_max if cls.multi_draft else 1) + 1):
        if cls.prefix_consistent:  # step 2: one law per K
            _, r = _moments(cls(), sub_block(block, K, L_max))
            for L in range(1, L_max + 1):
                etau[K - 1, L - 1] = float(r[:L].sum())
                reach[K - 1, L - 1, :L] = r[:L]
            continue
        for L in range(1, L_max + 1):
            e, r = _moments(cls(), sub_block(block, K, L))
            etau[K - 1, L - 1] = e
            reach[K - 1, L - 1, :L] = r
    return ConditionalAcceptance(method, etau, reach)


def tree_nodes(tokens: Tensor, chain: int = 1) -> np.ndarray:
    """[K_max, L_max] int: the size of the token tree (``chain`` pending tokens + every distinct draft
    prefix) for the first K drafts cut at length L -- the node count of that iteration's target pass.

    tokens: [K_max, L_max] int64.
    """
    K_max, L_max = tokens.shape
    rows = tokens.tolist()
    out = np.zeros((K_max, L_max), dtype=np.int64)
    for K in range(1, K_max + 1):
        for L in range(1, L_max + 1):
            out[K - 1, L - 1] = chain + len({tuple(r[:i]) for r in rows[:K] for i in range(1, L + 1)})
    return out


def all_conditional(methods: Sequence[str], block: Block,
                    timings: dict[str, float] | None = None) -> dict[str, ConditionalAcceptance]:
    """:func:`conditional_acceptance` for every method, the block lumped once.  ``timings``: seconds per
    method are added to it (the lumping is counted under ``"lump"``)."""
    t0 = time.perf_counter()
    lumped = lump_undrafted(block)
    out: dict[str, ConditionalAcceptance] = {}
    t1 = time.perf_counter()
    if timings is not None:
        timings["lump"] = timings.get("lump", 0.0) + t1 - t0
    for m in methods:
        out[m] = conditional_acceptance(m, lumped, lumped=True)
        t2 = time.perf_counter()
        if timings is not None:
            timings[m] = timings.get(m, 0.0) + t2 - t1
        t1 = t2
    return out




def first_token_block(p0: Tensor, q0: Tensor, tokens: Tensor, *, lump: bool = True) -> Block:
    """The L = 1 verification instances of M draft tuples at one context, as one batch.

    p0, q0: [V] the target and draft laws at the context; tokens: [M, K] i.i.d. draws from q0.  The bonus
    position's law (after an accepted token) is not known without a target pass; it only shapes the next
    token's law, never the accepted length, so p0 stands in for it (``tests/test_paired.py`` checks that
    E[tau] at L = 1 does not depend on it).  ``lump``: the undrafted columns (q0 = 0) become one, as in
    :func:`lump_undrafted`, before the batch is built.  -> tokens [M, K, 1], q [M, K, 1, V'], p [M, K, 2, V'].
    """
    M, K = tokens.shape
    if lump:
        drafted = q0 > 0  # [V]
        if int((~drafted).sum()) > 1:
            tokens = (torch.cumsum(drafted.long(), 0) - 1)[tokens.long()]
            p0 = torch.cat([p0[drafted], p0[~drafted].sum(-1, keepdim=True)])
            q0 = torch.cat([q0[drafted], q0.new_zeros(1)])
    return Block(tokens.unsqueeze(-1), q0.expand(M, K, 1, -1), p0.expand(M, K, 2, -1))


def first_token_acceptance_reference(method: str, block: Block) -> np.ndarray:
    """[M, K_max]: E[tau | c, D_1..K] at L = 1 for every instance, one instance and one K at a time."""
    cls = _check(method, block.select(0))
    M, K_max = block.B, block.K
    out = np.full((M, K_max), np.nan)
    for b in range(M):
        one = block.select(b)
        for K in range(1, (K_max if cls.multi_draft else 1) + 1):
            out[b, K - 1] = _moments_reference(cls(), sub_block(one, K, 1))[0]
    return out


def first_token_acceptance(method: str, block: Block) -> np.ndarray:
    """Fast path of :func:`first_token_acceptance_reference`: one ``law`` call per K over the whole batch of
    M instances (pass a lumped :func:`first_token_block`).  -> [M, K_max]."""
    from mdv.verify.registry import VERIFIERS

    if method not in VERIFIERS:
        raise unknown_name("method", method, list(VERIFIERS))
    cls = VERIFIERS[method]
    M, K_max = block.B, block.K
    out = np.full((M, K_max), np.nan)
    for K in range(1, (K_max if cls.multi_draft else 1) + 1):
        v = cls()
        out[:, K - 1] = v.acceptance_law(sub_block(block, K, 1), v.initial_state())[:, 1].cpu().numpy()  # L = 1
    return out


__all__ = ["ConditionalAcceptance", "all_conditional", "conditional_acceptance", "conditional_acceptance_reference",
           "first_token_acceptance", "first_token_acceptance_reference", "first_token_block", "lump_undrafted",
           "sub_block", "tree_nodes"]
