"""The sampler protocol: what a rule under audit must be, and the adapters that make one of anything.

A **sampler** verifies a batch of N independent instances, tensors only::

    fn(tokens,      # [N, K, L]     int64   -- K i.i.d. draft blocks of length L per instance
       q,           # [N, K, L, V]   float64 -- the draft law each draft token was sampled from
       p,           # [N, K, L+1, V] float64 -- the target law along each draft (position L: the bonus law)
       generator,   # torch.Generator       -- the only randomness the rule may use (reproducible audits)
    ) -> (tau,      # [N] int64 -- accepted length, 0..L
          sel,      # [N] int64 -- the kept draft, 0..K-1 (its first tau tokens are emitted)
          token)    # [N] int64 -- the correction (tau < L) or bonus (tau = L) token, 0..V-1

Letters as in ``algorithms.md`` §1.  Within one batch of sequences, instance n of every call is the same
sequence n, so a rule that carries state across iterations (a target adjustment) may keep it per
instance; such a rule is an object with that ``__call__`` and a ``reset()`` that the audit calls before
each new batch of sequences.  Once sequence n has emitted the tokens the audit needs, its later
instances are fillers drawn at the prompt (their outcomes are ignored).  An optional attribute
``multi_draft = False`` says the rule needs K = 1 (the audit then skips the cases with K > 1).

Adapters (:func:`as_sampler`): an mdv :class:`~mdv.verify.base.Verifier` (or its registry name) through
:class:`VerifierSampler`, state carried per instance; a per-instance function through
:class:`ScalarSampler` (a Python loop over N: measured 3·10^4 instances per second, against 0.1 to 6·10^6
for the vectorised samplers of mdv's verifiers, ``mdv bench benchmarks=[audit]``).
"""
from __future__ import annotations

import importlib
from typing import Any, Callable, Protocol

import torch
from torch import Tensor

from mdv.errors import InvalidInputError, MdvError
from mdv.verify.base import Block, Outcome, Uniforms, Verifier
from mdv.verify.registry import VERIFIERS, get_verifier


class SamplerError(MdvError, ValueError):
    """The sampler under audit failed or returned something that is not a verification outcome.  The
    audit stops with this error instead of a verdict (exit status 2 from the command line)."""


class Sampler(Protocol):
    """The batch protocol of the module docstring (the type of what the harness calls)."""

    def __call__(self, tokens: Tensor, q: Tensor, p: Tensor,
                 generator: torch.Generator) -> tuple[Tensor, Tensor, Tensor]: ...


def _describe(x: object) -> str:
    if isinstance(x, Tensor):
        return f"a {x.dtype} tensor of shape {tuple(x.shape)}"
    return f"a {type(x).__name__}"


def check_outcome(out: object, N: int, K: int, L: int, V: int, where: str) -> tuple[Tensor, Tensor, Tensor]:
    """``out`` as (tau, sel, token), each int64 [N], or a :class:`SamplerError` naming what is wrong."""
    if not isinstance(out, (tuple, list)) or len(out) != 3:
        raise SamplerError(f"{where}: the sampler must return a tuple (tau, sel, token) of three [N] int64 tensors;"
                           f" it returned {_describe(out)}" + (f" of length {len(out)}" if isinstance(out, (tuple, list)) else ""))
    checked = []
    for name, x, hi in zip(("tau", "sel", "token"), out, (L + 1, K, V)):
        if not isinstance(x, Tensor):
            raise SamplerError(f"{where}: {name} must be a torch int64 tensor of shape [N] = [{N}]; got {_describe(x)}")
        if x.is_floating_point() or x.is_complex() or x.dtype == torch.bool:
            nan = " (it contains NaN)" if x.is_floating_point() and bool(torch.isnan(x).any()) else ""
            raise SamplerError(f"{where}: {name} must be an integer tensor (int64); got {x.dtype}{nan}")
        if tuple(x.shape) != (N,):
            raise SamplerError(f"{where}: {name} must have shape [N] = [{N}] (one entry per instance); got {tuple(x.shape)}")
        x = x.long()
        if N and (int(x.min()) < 0 or int(x.max()) >= hi):
            bad = int(x[(x < 0) | (x >= hi)][0])
            what = {"tau": f"[0, L] = [0, {L}]", "sel": f"[0, K) = [0, {K})", "token": f"the vocabulary [0, V) = [0, {V})"}[name]
            raise SamplerError(f"{where}: {name} must lie in {what}; the sampler returned {name} = {bad}")
        checked.append(x)
    return checked[0], checked[1], checked[2]


class VerifierSampler:
    """An mdv verifier through the protocol, its state carried per instance.

    Stateless verifiers: one vectorised :meth:`Verifier.sample` per call.  Stateful ones (``gbv``,
    ``mdbv``) keep one state per instance, interned (equal states share one id):

    * sampling: mdv's built-in verifiers use their state only through :meth:`Verifier.effective_target`,
      so the effective target is computed once per distinct state and the whole batch sampled in one call
      from the initial state (``tests/test_audit.py`` checks this against per-state sampling); a plug-in
      verifier is sampled once per distinct state;
    * the next state: :meth:`Verifier.advance` is exact and deterministic, so it is computed once per
      distinct (state, what advance reads).  For the built-ins that is the outcome, the selected draft's
      tokens and laws up to the emitted length and the scanned drafts' tokens up to their exit points; for
      a plug-in, the whole block.
    """

    def __init__(self, verifier: Verifier, name: str | None = None) -> None:
        self.verifier = verifier
        self.multi_draft = verifier.multi_draft
        self.name = name or verifier.name
        self._builtin = type(verifier).__module__.startswith("mdv.verify.")
        # Kept across batches (advance is a function of its inputs): later batches mostly hit the memo.
        self._states: list[Any] = []  # id -> state
        self._ids: dict[Any, int] = {}  # state -> id (hashable states only)
        self._memo: dict[bytes, int] = {}  # (state id, what advance reads) -> id of the new state
        self.reset()

    def reset(self) -> None:
        """Start a new batch of sequences (every instance back to the initial state)."""
        self._state_of: Tensor = torch.empty(0, dtype=torch.long)  # [N] state id of each instance

    def _intern(self, state: Any) -> int:
        try:
            hit = self._ids.get(state)
        except TypeError:  # an unhashable state: no sharing
            hit = None
        if hit is None:
            hit = len(self._states)
            self._states.append(state)
            try:
                self._ids[state] = hit
            except TypeError:
                pass
        return hit

    def __call__(self, tokens: Tensor, q: Tensor, p: Tensor, generator: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
        v, block = self.verifier, Block(tokens, q, p)
        N, K, L = tokens.shape
        uniforms = Uniforms.draw(N, K, L, generator)
        if not v.stateful:
            out = v.sample(block, uniforms, v.initial_state())
            return out.tau, out.sel, out.token
        if self._state_of.numel() != N:  # the first call of a batch of sequences
            self._state_of = torch.full((N,), self._intern(v.initial_state()), dtype=torch.long)
        groups = torch.unique(self._state_of).tolist()
        if self._builtin:
            p_eff = p.clone()
            for s in groups:
                idx = (self._state_of == s).nonzero().squeeze(-1)
                p_eff[idx] = v.effective_target(block.select(idx), self._states[s])
            out = v.sample(Block(tokens, q, p_eff), uniforms, v.initial_state())
            tau, sel, token = out.tau.long(), out.sel.long(), out.token.long()
            exits = out.exits.long() if out.exits is not None else torch.full((N, K), -1, dtype=torch.long)
        else:
            tau = torch.empty(N, dtype=torch.long)
            sel, token = torch.empty_like(tau), torch.empty_like(tau)
            exits = torch.full((N, K), -1, dtype=torch.long)
            for s in groups:
                idx = (self._state_of == s).nonzero().squeeze(-1)
                out = v.sample(block.select(idx), uniforms.select(idx), self._states[s])
                tau[idx], sel[idx], token[idx] = out.tau, out.sel, out.token
                if out.exits is not None:
                    exits[idx] = out.exits.long()
        self._advance(block, tau, sel, token, exits)
        return tau, sel, token

    def _advance_inputs(self, block: Block, tau: Tensor, sel: Tensor, exits: Tensor) -> list[Tensor]:
        """What advance() may read, per instance, as int64 rows (floats by their exact bits)."""
        N, K, L = block.tokens.shape
        if not self._builtin:
            return [block.tokens.reshape(N, -1), block.q.reshape(N, -1).view(torch.int64),
                    block.p.reshape(N, -1).view(torch.int64)]
        rows = torch.arange(N)
        pos = torch.arange(L + 1)
        upto = (pos <= tau.unsqueeze(-1)).unsqueeze(-1)  # [N, L+1, 1]: positions up to the emitted length
        p_sel = torch.where(upto, block.p[rows, sel], 0.0)  # [N, L+1, V]
        q_sel = torch.where(upto[:, :L], block.q[rows, sel], 0.0)  # [N, L, V]
        scanned = torch.where(exits >= 0, exits, 0)  # [N, K]: tokens before a draft's exit point are anchors
        scanned = torch.where((sel.unsqueeze(-1) == torch.arange(K)) & (exits < 0), tau.unsqueeze(-1), scanned)
        toks = torch.where(pos[:L] < scanned.unsqueeze(-1), block.tokens.long(), -1)  # [N, K, L]
        return [toks.reshape(N, -1), p_sel.reshape(N, -1).view(torch.int64), q_sel.reshape(N, -1).view(torch.int64)]

    def _advance(self, block: Block, tau: Tensor, sel: Tensor, token: Tensor, exits: Tensor) -> None:
        N = block.B
        key = torch.cat([self._state_of.unsqueeze(-1), tau.unsqueeze(-1), sel.unsqueeze(-1), token.unsqueeze(-1),
                         exits, *self._advance_inputs(block, tau, sel, exits)], -1)
        uniq, inverse = torch.unique(key, dim=0, return_inverse=True)
        first = torch.full((uniq.shape[0],), N, dtype=torch.long).scatter_reduce(0, inverse, torch.arange(N), "amin")
        new_ids = torch.empty(uniq.shape[0], dtype=torch.long)
        for g, n in enumerate(first.tolist()):
            memo_key = uniq[g].numpy().tobytes()
            hit = self._memo.get(memo_key)
            if hit is None:
                out = Outcome(tau[n:n + 1], sel[n:n + 1], token[n:n + 1], exits[n:n + 1])
                hit = self._intern(self.verifier.advance(self._states[int(self._state_of[n])], block.select(n), out))
                self._memo[memo_key] = hit
            new_ids[g] = hit
        self._state_of = new_ids[inverse]


class ScalarSampler:
    """A per-instance function through the protocol: ``fn(tokens [K, L], q [K, L, V], p [K, L+1, V],
    generator) -> (tau, sel, token)`` as ints, called once per instance (a Python loop: slow)."""

    def __init__(self, fn: Callable[..., Any], multi_draft: bool = True) -> None:
        self.fn = fn
        self.multi_draft = multi_draft
        self.name = getattr(fn, "__name__", type(fn).__name__)

    def __call__(self, tokens: Tensor, q: Tensor, p: Tensor, generator: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
        N = tokens.shape[0]
        out = torch.empty(3, N, dtype=torch.long)
        for n in range(N):
            res = self.fn(tokens[n], q[n], p[n], generator)
            if not isinstance(res, (tuple, list)) or len(res) != 3:
                raise SamplerError(f"the scalar sampler {self.name!r} must return (tau, sel, token) as three ints;"
                                   f" it returned {_describe(res)} for instance {n}")
            try:
                out[:, n] = torch.tensor([int(x) for x in res])
            except (TypeError, ValueError, RuntimeError) as err:
                raise SamplerError(f"the scalar sampler {self.name!r} returned {res!r} for instance {n}, not three"
                                   f" integers: {err}") from err
        return out[0], out[1], out[2]


def load_sampler(path: str) -> Any:
    """The object named by ``"package.module:attribute"`` (or a registered mdv verifier name)."""
    if not isinstance(path, str) or not path.strip():
        raise InvalidInputError("sampler must name a rule: 'package.module:function' or an mdv verifier name"
                                f" ({', '.join(VERIFIERS)}); got {path!r}")
    if ":" not in path:
        if path in VERIFIERS:
            return get_verifier(path)
        raise InvalidInputError(f"sampler={path!r} is neither 'package.module:function' nor an mdv verifier name"
                                f" ({', '.join(VERIFIERS)}); write it as module:attribute, e.g. my_rules:verify")
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as err:  # an import error, or the user's module failing while it loads
        raise InvalidInputError(f"sampler={path!r}: cannot import module {module_name!r}: {type(err).__name__}: {err}"
                                " (is it on PYTHONPATH, and does it import cleanly?)") from err
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise InvalidInputError(f"sampler={path!r}: module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj


def as_sampler(rule: Any, scalar: bool = False) -> Any:
    """A sampler for ``rule``: an mdv verifier (instance, class or registry name) through
    :class:`VerifierSampler`, a per-instance function (``scalar=True``) through :class:`ScalarSampler`,
    any other callable as it is (it must follow the batch protocol)."""
    if isinstance(rule, str):
        rule = load_sampler(rule)
    if isinstance(rule, type) and issubclass(rule, Verifier):
        rule = rule()
    if isinstance(rule, Verifier):
        return VerifierSampler(rule)
    if not callable(rule):
        raise InvalidInputError(f"the rule under audit must be callable (see mdv.audit.protocol); got {_describe(rule)}")
    if isinstance(rule, type):
        try:
            rule = rule()
        except Exception as err:
            raise InvalidInputError(f"the rule under audit is the class {rule.__qualname__}, which cannot be built"
                                    f" without arguments ({type(err).__name__}: {err}); pass an instance") from err
    return ScalarSampler(rule, getattr(rule, "multi_draft", True)) if scalar else rule
