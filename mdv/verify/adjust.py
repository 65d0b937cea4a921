"""Target adjustment carried across iterations by greedy block verifiers (algorithms.md §5, §6.5).

A greedy verifier may accept more than a per-iteration-valid one because it may change what later
iterations sample.  When it exits early -- accepting u = D_<=tau and emitting a correction Y -- the
rest of the old block's window (relative depth < L from the old block start) must follow the
*residual chain* of the coupling, not the target:

    T_j(x | v)  ∝  ( T_{j-1}(v) · T_{j-1}(x | v)  -  Q(v) · q(x | v) )_+ ,      v ⪰ u_j,

where T_0 is the target law the iteration verified against (itself possibly adjusted by older
windows), Q the draft law, all joints measured from the old block start.  Single-draft GBV leaves one
level (anchored at its exit u); mdv's multi-draft verifier (``mdbv``) leaves one level per scanned
draft, anchored at that draft's exit point.  For |v| >= L the target is p again.

A window stores, at the current position v, the log-joints ``log T_{j-1}(v)`` of every level and
``log Q(v)``; applying it to a target vector costs O(levels · V), and advancing it along a token is
a gather.  Windows nest: the newest applies on top of the older ones, at most L deep.

``select_gbv`` verifies one draft *selected* from K, whose law Q_S is not the product of q
(:mod:`mdv.verify.selection`): its window (one level) replaces ``q(.|v)`` by the selected law's
conditional ``q_S(.|v)``, which depends on the survivor-count law pi_v that the window carries and
advances along the generated text (one :func:`~mdv.verify.selection.node_step` per covered position).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch
from torch import Tensor

from mdv.verify._math import normalize_or, safe_ratio
from mdv.verify.selection import NodeLaw, StackedLaws, advance_survivors, node_step, root_survivors


def residual_chain_step(cond0: Tensor, q: Tensor, log_joint: Sequence[Tensor], log_q: Tensor) -> list[Tensor]:
    """Conditionals of every level of a window at one position.

    cond0: [..., V] the law below the window, T_0(.|v); q: [..., V] the draft law q(.|v);
    log_joint[j-1]: [...] log T_{j-1}(v) for levels j = 1..m; log_q: [...] log Q(v).
    Returns [T_0(.|v), T_1(.|v), ..., T_m(.|v)], each [..., V].  A level whose residual has no mass
    (only where T_j(v) = 0, so the value is never used) falls back to the level below.
    """
    conds = [cond0]
    for lj in log_joint:
        ratio = safe_ratio(lj, log_q).unsqueeze(-1)  # T_{j-1}(v) / Q(v)
        conds.append(normalize_or(ratio * conds[-1] - q, conds[-1]))
    return conds


@dataclass(frozen=True)
class Window:
    """One early exit's adjustment, positioned at the current end of the generated text.

    length:    L of the iteration that made it: it covers relative depths < length.
    anchors:   the exit prefixes u_1..u_m of its levels (relative to the window start).
    depth:     relative depth of the current position (tokens emitted since the window start).
    log_joint: log T_{j-1}(v) at the current position, j = 1..m.
    log_q:     log Q(v) at the current position (log Q_S(v) for a selection window).
    base:      key of the state the window was made under: the law below it (T_0) depended on the
               windows active then, even after they expire.
    selection: '' for a product-law window; else the walk mode of ``select_gbv`` (its Q is Q_S).
    survivors: pi_v, the survivor-count law at the current position ([K+1], selection windows only).
    """

    length: int
    anchors: tuple[tuple[int, ...], ...]
    depth: int
    log_joint: tuple[float, ...]
    log_q: float
    base: tuple = ()
    selection: str = ""
    survivors: tuple[float, ...] = ()

    @property
    def active(self) -> bool:
        return self.depth < self.length

    def key(self) -> tuple:
        # With the generated prefix, these determine the log-joints (they are products along it).
        return (self.length, self.anchors, self.depth, self.base) + ((self.selection,) if self.selection else ())


@dataclass(frozen=True)
class AdjustedTarget:
    """The state of a greedy block verifier: the stack of active windows, oldest first."""

    windows: tuple[Window, ...] = field(default_factory=tuple)

    def key(self) -> tuple:
        return tuple(w.key() for w in self.windows)


class AdjustedTargetState:
    """The state methods of the greedy block verifiers (``gbv``, ``mdbv``, ``select_gbv``), mixed in before
    :class:`~mdv.verify.base.Verifier`: the state is a stack of windows, applied to p along every draft."""

    def initial_state(self) -> AdjustedTarget:
        return AdjustedTarget()

    def effective_target(self, block, state) -> Tensor:  # block: mdv.verify.base.Block -> [B, K, L+1, V]
        return apply_windows(state, block.tokens, block.p, block.q)

    def state_key(self, state) -> tuple:
        return state.key() if state is not None else ()


def window_draft_law(selection: str, cond: Tensor, q: Tensor, log_joint0: Tensor, log_q: Tensor,
                     pi: Tensor | None) -> tuple[Tensor, NodeLaw | StackedLaws | None]:
    """The draft law a window's residual subtracts at one position, and the selection walk's law there.

    cond: [N, V] the law below the window; q: [N, V] the draft rows; log_joint0, log_q: [N] log T_0(v),
    log Q(v); pi: [N, K+1] or None.  A product-law window (selection '') returns (q, None); a selection
    window returns (q_S(.|v) [N, V], the :class:`~mdv.verify.selection.NodeLaw`) of
    :func:`~mdv.verify.selection.node_step` with the ratio T_0(v)/Q_S(v) -- the quantities the iteration
    that made the window used at v.
    """
    if not selection:
        return q, None
    law = node_step(cond, q, safe_ratio(log_joint0, log_q), pi, selection)
    return law.q_sel, law


def apply_windows(state: AdjustedTarget | None, tokens: Tensor, p: Tensor, q: Tensor) -> Tensor:
    """The effective target along every draft row.

    tokens: [B, K, L]; p: [B, K, L+1, V] raw target along the rows; q: [B, K, L, V].
    Returns p_eff: [B, K, L+1, V], the law the verifier must check against.  Position i of the new
    block is relative depth ``w.depth + i`` of window w, covered while that is < ``w.length``.
    """
    if state is None or not state.windows:
        return p
    B, K, L = tokens.shape
    out = p.clone()
    scalars = [([torch.full((B, K), lj, dtype=p.dtype, device=p.device) for lj in w.log_joint],
                torch.full((B, K), w.log_q, dtype=p.dtype, device=p.device)) for w in state.windows]
    survivors = [torch.tensor(w.survivors, dtype=p.dtype, device=p.device).expand(B * K, -1) if w.selection else None
                 for w in state.windows]  # [B*K, K'+1] per selection window
    V = p.shape[-1]
    for i in range(L + 1):
        cond = p[:, :, i]
        for n, (w, (log_joint, log_q)) in enumerate(zip(state.windows, scalars)):
            if w.depth + i >= w.length:
                continue
            if i >= L:  # cannot happen: a window is at least one token deep when a block starts
                raise RuntimeError("a target-adjustment window reaches the bonus position")
            tok = tokens[:, :, i].unsqueeze(-1)
            q_row, law = window_draft_law(w.selection, cond.reshape(-1, V), q[:, :, i].reshape(-1, V),
                                          log_joint[0].reshape(-1), log_q.reshape(-1), survivors[n])
            q_row = q_row.view(B, K, V)
            conds = residual_chain_step(cond, q_row, log_joint, log_q)
            for j in range(len(log_joint)):
                log_joint[j] = log_joint[j] + conds[j].gather(-1, tok).squeeze(-1).log()
            log_q.add_(q_row.gather(-1, tok).squeeze(-1).log())
            if law is not None:
                survivors[n] = advance_survivors(law, tok.reshape(-1))[1]
            cond = conds[-1]
        out[:, :, i] = cond
    return out


def advance_state(state: AdjustedTarget | None, path: Sequence[int], p_path: Tensor, q_path: Tensor,
                  length: int, anchors: Sequence[tuple[int, ...]] | None,
                  selection: tuple[str, int] | None = None) -> AdjustedTarget:
    """The state after the tokens ``path`` were emitted by one iteration.

    path: the emitted tokens (accepted prefix, then the correction or bonus token);
    p_path: [n, V] raw target law at each emitted position; q_path: [n', V] draft law at those
    positions (n' >= the positions any window covers); length: this iteration's L;
    anchors: the exit prefixes of the new window's levels (relative to this block's start), or
    None when the iteration leaves no adjustment (a full block was accepted);
    selection: (walk mode, K) when the iteration verified a selected draft (``select_gbv``): its window
    subtracts Q_S, walked from the block start (pi = e_K) along the path.
    """
    dt = p_path.dtype
    old = list(state.windows) if state is not None else []
    old_scalars = [[list(w.log_joint), w.log_q, torch.tensor([w.survivors], dtype=dt) if w.selection else None]
                   for w in old]
    new_log_joint = [0.0] * len(anchors or ())
    new_log_q = 0.0
    new_pi = root_survivors(selection[1], torch.zeros(1)) if (anchors and selection) else None
    for i, tok in enumerate(path):
        cond = p_path[i]
        tok_t = torch.tensor([tok])
        for w, sc in zip(old, old_scalars):
            if w.depth + i >= w.length:
                continue
            log_joint = [torch.tensor(x, dtype=dt) for x in sc[0]]
            q_row, law = window_draft_law(w.selection, cond[None], q_path[i][None], log_joint[0].reshape(1),
                                          torch.tensor([sc[1]], dtype=dt), sc[2])
            conds = residual_chain_step(cond, q_row[0], log_joint, torch.tensor(sc[1], dtype=dt))
            sc[0] = [x + float(conds[j][tok].log()) for j, x in enumerate(sc[0])]
            sc[1] = sc[1] + float(q_row[0][tok].log())
            if law is not None:
                sc[2] = advance_survivors(law, tok_t)[1]
            cond = conds[-1]
        if anchors:
            # The new window's levels along the emitted path: before its anchor a level is the point
            # mass on the anchor's next token (its law is supported on strings extending the anchor).
            q_row, law = window_draft_law(selection[0] if selection else "", cond[None], q_path[i][None],
                                          torch.tensor([new_log_joint[0]], dtype=dt), torch.tensor([new_log_q], dtype=dt),
                                          new_pi)
            q_row = q_row[0]
            conds = [cond]
            for j, u in enumerate(anchors):
                if i < len(u):
                    conds.append(torch.nn.functional.one_hot(torch.tensor(u[i]), cond.shape[-1]).to(cond.dtype))
                else:
                    ratio = safe_ratio(torch.tensor(new_log_joint[j], dtype=cond.dtype),
                                       torch.tensor(new_log_q, dtype=cond.dtype))
                    conds.append(normalize_or(ratio * conds[-1] - q_row, conds[-1]))
            new_log_joint = [x + float(conds[j][tok].log()) for j, x in enumerate(new_log_joint)]
            new_log_q += float(q_row[tok].log())
            if law is not None:
                new_pi = advance_survivors(law, tok_t)[1]
    n = len(path)
    windows = [Window(w.length, w.anchors, w.depth + n, tuple(sc[0]), sc[1], w.base, w.selection,
                      tuple(float(x) for x in sc[2][0]) if sc[2] is not None else ())
               for w, sc in zip(old, old_scalars)]
    if anchors:
        base = state.key() if state is not None else ()
        windows.append(Window(length, tuple(tuple(u) for u in anchors), n, tuple(new_log_joint), new_log_q, base,
                              selection[0] if selection else "",
                              tuple(float(x) for x in new_pi[0]) if new_pi is not None else ()))
    return AdjustedTarget(tuple(w for w in windows if w.active))
