"""The verifier interface: one iteration's input (:class:`Block`), its exact outcome law
(:class:`Branch`), a sampled outcome (:class:`Outcome`) and the :class:`Verifier` base class.

Letters follow ``algorithms.md`` §1: p = target, q = draft, K drafts of length L, tau = accepted
length.  Every tensor is batched over B independent *instances* that share one context and one
verifier state: B = 1 in the engine, B = all draft tuples in the exact oracle, B = 10^6 trials in
Monte-Carlo tests.

Each verifier provides three views of the same rule:

* :meth:`Verifier.law` -- the exact law of the outcome given the drafts, vectorised over B; the
  oracle enumerates it.
* :meth:`Verifier.sample` -- the fast vectorised sampler driven by explicit :class:`Uniforms`.
* :meth:`Verifier.reference` -- a slow, scalar, step-by-step transcription of the algorithm driven
  by the *same* uniforms; the parity tests require identical outcomes.

Greedy block verifiers (``gbv``, ``mdbv``) also carry a target adjustment into later iterations
(:mod:`mdv.verify.adjust`); :meth:`Verifier.effective_target` applies it and :meth:`Verifier.advance`
updates it.  :class:`Verifier` objects also own that state for the engine (:meth:`reset`,
:meth:`step`).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from mdv.errors import InvalidInputError

# Probability vectors must sum to 1 within this tolerance.
SUM_TOL = 1e-6


def _values_ok(x: Tensor, check_sums: bool) -> bool:
    """True iff ``x`` passes every value check of :meth:`Block.validate` (finite, in [0, 1 + SUM_TOL], rows
    summing to 1 within SUM_TOL), in two passes instead of six.

    amin/amax propagate NaN, so ``min >= 0`` fails on a NaN; with every entry >= 0, a row sum within
    SUM_TOL of 1 also rules out +inf and bounds every entry by 1 + SUM_TOL.  Exactly the inputs the
    separate checks accept pass here.
    """
    if x.numel() == 0:
        return True
    if check_sums:
        return bool(x.amin() >= 0) and float((x.sum(-1) - 1.0).abs().max()) <= SUM_TOL
    lo, hi = torch.aminmax(x)
    return bool(lo >= 0) and bool(hi <= 1 + SUM_TOL)


@dataclass(frozen=True)
class Block:
    """One verification step's input.

    tokens: [B, K, L] int64 -- K i.i.d. draft blocks of length L.
    q:      [B, K, L, V] float64 -- the draft law each token was sampled from: q[b, k, i] = q(.|c, D_k,<i+1).
    p:      [B, K, L+1, V] float64 -- the target law along each draft: p[b, k, i] = p(.|c, D_k,<i+1).
    """

    tokens: Tensor
    q: Tensor
    p: Tensor

    @property
    def B(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def K(self) -> int:
        return int(self.tokens.shape[1])

    @property
    def L(self) -> int:
        return int(self.tokens.shape[2])

    @property
    def V(self) -> int:
        return int(self.q.shape[-1])

    def select(self, index: Tensor | slice | int) -> "Block":
        """The sub-batch ``index`` (keeps the batch dimension)."""
        if isinstance(index, int):
            index = slice(index, index + 1)
        return Block(self.tokens[index], self.q[index], self.p[index])

    def validate(self, *, check_sums: bool = True, full: bool = True) -> "Block":
        """Raise :class:`~mdv.errors.InvalidInputError` naming the argument if anything is off.

        ``full=False`` skips the O(B·K·L·V) value checks of p and q (finite, in [0, 1], rows summing to 1)
        and keeps the O(B·K·L) ones: shapes, dtypes, token range, q > 0 and finite at every drafted token,
        and the first entry of every p and q row finite (a softmax over NaN or infinite logits is NaN in
        the whole row).  The engine uses it after the first iteration of a sequence, whose laws come from
        the same sampling transform.
        """
        t, q, p = self.tokens, self.q, self.p
        if t.dim() != 3:
            raise InvalidInputError(f"tokens must have shape [B, K, L]; got {tuple(t.shape)}")
        B, K, L = t.shape
        if K < 1:
            raise InvalidInputError(f"K (number of drafts) must be >= 1; got K={K}")
        if L < 1:
            raise InvalidInputError(f"L (draft length) must be >= 1; got L={L}")
        if t.dtype not in (torch.int64, torch.int32):
            raise InvalidInputError(f"tokens must be an integer tensor; got dtype {t.dtype}")
        if q.dim() != 4 or tuple(q.shape[:3]) != (B, K, L):
            raise InvalidInputError(f"q must have shape [B, K, L, V] = [{B}, {K}, {L}, V]; got {tuple(q.shape)}")
        V = q.shape[-1]
        if p.dim() != 4 or tuple(p.shape) != (B, K, L + 1, V):
            raise InvalidInputError(
                f"p must have shape [B, K, L+1, V] = [{B}, {K}, {L + 1}, {V}] (target law at L+1 positions,"
                f" same vocabulary as q); got {tuple(p.shape)}")
        for name, x in (("q", q), ("p", p)):
            if x.dtype != torch.float64:
                raise InvalidInputError(f"{name} must be float64 (verification runs in float64); got {x.dtype}")
            if not full:
                if x.numel() and not bool(torch.isfinite(x[..., 0]).all()):
                    raise InvalidInputError(f"{name} contains NaN or inf")
                continue
            if _values_ok(x, check_sums):
                continue  # the common case, in two passes; otherwise the checks below name the problem
            if not torch.isfinite(x).all():
                raise InvalidInputError(f"{name} contains NaN or inf")
            if (x < 0).any() or (x > 1 + SUM_TOL).any():
                raise InvalidInputError(f"{name} has probabilities outside [0, 1]")
            if check_sums:
                err = (x.sum(-1) - 1.0).abs().max().item() if x.numel() else 0.0
                if err > SUM_TOL:
                    raise InvalidInputError(
                        f"{name} rows must sum to 1 (max deviation {err:.3g} > {SUM_TOL}); pass probabilities,"
                        " not logits, and normalise them")
        if t.numel() and (t.min() < 0 or t.max() >= V):
            raise InvalidInputError(f"tokens must lie in [0, V={V}); got values in [{int(t.min())}, {int(t.max())}]")
        if t.numel():
            qd = q.gather(-1, t.long().unsqueeze(-1)).squeeze(-1)
            if not full and not bool(torch.isfinite(qd).all()):
                raise InvalidInputError("q contains NaN or inf")
            if (qd <= 0).any():
                raise InvalidInputError(
                    "a draft token has q = 0 under the draft law it was supposedly sampled from; q must be the"
                    " exact vector the token was drawn from (algorithms.md §12.2)")
        return self


@dataclass(frozen=True)
class Uniforms:
    """Explicit randomness of one verification step, so that two implementations can be compared
    on the same draws.

    coins: [B, K, L] -- one uniform per (draft, position) test.
    draws: [B, L+1] -- one uniform per categorical draw (residual, correction or bonus) at each depth.
    """

    coins: Tensor
    draws: Tensor

    @staticmethod
    def draw(B: int, K: int, L: int, generator: torch.Generator | None = None,
             device: torch.device | str | None = None) -> "Uniforms":
        coins = torch.rand((B, K, L), generator=generator, dtype=torch.float64, device=device)
        draws = torch.rand((B, L + 1), generator=generator, dtype=torch.float64, device=device)
        return Uniforms(coins, draws)

    def select(self, index: Tensor | slice | int) -> "Uniforms":
        if isinstance(index, int):
            index = slice(index, index + 1)
        return Uniforms(self.coins[index], self.draws[index])


@dataclass(frozen=True)
class Outcome:
    """A sampled verification outcome per instance.

    tau:   [B] accepted length (0..L).
    sel:   [B] index of the kept draft (its first tau tokens are emitted).
    token: [B] the correction (tau < L) or bonus (tau = L) token.
    exits: [B, K] or None -- verifier-specific detail that the state update needs (``mdbv``: the exit
           point of each scanned draft, -1 for drafts never scanned).
    """

    tau: Tensor
    sel: Tensor
    token: Tensor
    exits: Tensor | None = None

    def emitted(self, block: Block, b: int = 0) -> list[int]:
        """The emitted tokens of instance ``b``: the kept draft's first tau tokens, then ``token``."""
        tau, sel = int(self.tau[b]), int(self.sel[b])
        return [int(x) for x in block.tokens[b, sel, :tau].tolist()] + [int(self.token[b])]


@dataclass(frozen=True)
class Branch:
    """One branch of an exact outcome law.

    With probability ``prob[b]`` (given the drafts of instance b), the verifier keeps draft ``sel[b]``,
    accepts ``tau[b]`` tokens and draws the next token from ``next_dist[b]``.  ``exits`` carries the
    verifier-specific detail of this branch (as in :class:`Outcome`), shared by all b.

    prob: [B]; sel: [B]; tau: [B]; next_dist: [B, V].
    """

    prob: Tensor
    sel: Tensor
    tau: Tensor
    next_dist: Tensor
    exits: tuple[int, ...] | None = None


class Verifier(ABC):
    """Base class of all verifiers.  Subclasses set the class flags and implement the three views."""

    name: ClassVar[str]
    #: True when the whole generated sequence provably follows the target law (checked by the oracle).
    lossless: ClassVar[bool]
    #: True when the verifier uses K >= 2 drafts; single-draft verifiers require K = 1.
    multi_draft: ClassVar[bool]
    #: True when the verifier carries a target adjustment into later iterations.
    stateful: ClassVar[bool] = False
    #: True when the decision at depth i uses only depth-i quantities (token-level rules), so that the run
    #: with block length L is the run with a longer block stopped at L: P(tau_L >= i) = P(tau_L' >= i) for
    #: i <= L <= L'.  The paired estimator uses it; ``tests/test_paired.py`` checks it against ``law``.
    prefix_consistent: ClassVar[bool] = False
    #: True when the drafts are scanned one after the other and draft k's scan never looks at later drafts,
    #: so the run with K' drafts is the run with K > K' drafts stopped after draft K' (``mdbv``; not SpecTr's
    #: K-dependent coupling).  :meth:`acceptance_laws_upto_K` then has a one-pass override;
    #: ``tests/test_verify_acceptance_law.py`` checks the flag against ``law``.
    drafts_in_sequence: ClassVar[bool] = False

    def __init__(self) -> None:
        self.state: Any = self.initial_state()

    # ------------------------------------------------------------------ state (greedy verifiers)
    def initial_state(self) -> Any:
        """The state at the start of a sequence (None for per-iteration-valid verifiers)."""
        return None

    def effective_target(self, block: Block, state: Any) -> Tensor:
        """The target law the verifier checks against: p itself, or p adjusted by ``state``.  [B, K, L+1, V]"""
        return block.p

    def advance(self, state: Any, block: Block, outcome: Outcome) -> Any:
        """The state after ``outcome`` (instance 0 of ``block``) has been emitted."""
        return state

    def state_key(self, state: Any) -> Any:
        """A hashable description of ``state`` that, together with the generated prefix, determines it."""
        return None

    # ------------------------------------------------------------------ the three views
    @abstractmethod
    def law(self, block: Block, state: Any = None) -> list[Branch]:
        """Exact law of the outcome given the drafts (vectorised over B)."""

    def acceptance_law(self, block: Block, state: Any = None) -> Tensor:
        """The law of tau alone: ``[B, L+1]`` with entry [b, t] = P(tau = t | drafts of b), t = 0..L.

        The marginal of :meth:`law` over the kept draft and the next token: sum of ``prob`` over the branches
        with ``tau = t`` (this default).  A verifier whose ``law`` spends most of its time on the branches'
        next-token laws (O(V) each) overrides it without them; ``tests/test_verify_acceptance_law.py``
        checks every override against this default."""
        out = torch.zeros(block.B, block.L + 1, dtype=block.p.dtype, device=block.p.device)  # [B, L+1]
        for br in self.law(block, state):
            out.scatter_add_(1, br.tau.unsqueeze(1), br.prob.unsqueeze(1))
        return out

    def acceptance_laws_upto_K(self, block: Block, state: Any = None) -> Tensor:
        """The law of tau with the first K' drafts of ``block``, K' = 1..K: ``[B, K, L+1]`` (entry [b, K'-1,
        t] = P(tau = t) of the K'-draft run).  Default: :meth:`acceptance_law` on each K' prefix of the
        drafts (single-draft verifiers: K' = 1 only, so K must be 1).  A verifier whose K'-draft run is its
        K-draft run stopped after draft K' (``mdbv``) overrides it with one pass."""
        self.check_drafts(block.K)
        return torch.stack([self.acceptance_law(Block(block.tokens[:, :k], block.q[:, :k], block.p[:, :k]), state)
                            for k in range(1, block.K + 1)], 1)

    @abstractmethod
    def sample(self, block: Block, uniforms: Uniforms, state: Any = None) -> Outcome:
        """Fast vectorised sampler."""

    @abstractmethod
    def reference(self, block: Block, uniforms: Uniforms, state: Any = None) -> Outcome:
        """Slow scalar transcription of the algorithm, on the same uniforms as :meth:`sample`."""

    # ------------------------------------------------------------------ engine helpers
    def check_drafts(self, K: int) -> None:
        if K < 1:
            raise InvalidInputError(f"K (number of drafts) must be >= 1; got K={K}")
        if not self.multi_draft and K != 1:
            raise InvalidInputError(
                f"verifier {self.name!r} is single-draft and needs K=1 (got K={K}); use a multi-draft"
                " verifier (spectr, spectr_gbv, mdbv) for K > 1")

    def reset(self) -> None:
        """Start a new sequence: forget any target adjustment."""
        self.state = self.initial_state()

    def step(self, block: Block, generator: torch.Generator | None = None, *, validate: bool = True) -> Outcome:
        """Verify one block of the current sequence (B = 1) and update the owned state."""
        if validate:
            block.validate()
        self.check_drafts(block.K)
        if block.B != 1:
            raise InvalidInputError(f"step() verifies one sequence at a time (B=1); got B={block.B}")
        uniforms = Uniforms.draw(1, block.K, block.L, generator, device=block.p.device)
        outcome = self.sample(block, uniforms, self.state)
        self.state = self.advance(self.state, block, outcome)
        return outcome

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(name={self.name!r}, lossless={self.lossless},"
                f" multi_draft={self.multi_draft})")
