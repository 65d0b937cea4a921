"""``select_gbv``: select one of the K i.i.d. drafts by a walk whose law is known, then greedy block
verification (GBV, algorithms.md §5) of that draft against its own law Q_S, with the target adjustment.
Letters of algorithms.md §1: p = target, q = draft, K drafts of length L.

**Why this shape.**  Single-draft GBV handed a draft D ~ Q' and the exact conditionals of Q' along D
accepts ``E[tau] = sum_{i<=L} sum_{|v|=i} min(P(v), Q'(v))`` and is lossless with its target adjustment
(§5; the proof uses only that D ~ Q' and that the verifier knows Q').  So every selection rule whose law Q_S
is computable along the drafts gives an exact verifier, and

* **Dominance by coupling.**  If some exact verifier A's accepted prefix is always a prefix of the selected
  draft, then ``Pr(A accepts ⪰ v) <= min(P(v), Q_S(v))`` for every v (accepted tokens are final, so their
  law is at most the target's; and they lie on the selected draft), hence E[tau_A] <= E[tau] of this rule.
  The ``kseq`` walk extends SpecTr's accepted prefix (SpecTr continues exactly where the walk keeps a
  drafted token), so ``select_gbv(selection="kseq") >= spectr`` on every context; the ``lex`` walk selects
  ``mpbv``'s lexicographic maximum, and GBV >= BV for one draft of known law, so
  ``select_gbv(selection="lex") >= mpbv``.
* **The default** (``selection="choose"``) picks, at every prefix, the token rule (``kseq``, ``lex`` or
  ``fill``) with the largest contribution to that sum, ties going to ``lex`` (:mod:`mdv.verify.selection`);
  where two or more survivors are all but impossible (pi(m >= 2) <= FORCED_MASS) every rule scores the same
  to CHOICE_TOL / 2, and it keeps the first survivor's token (``first``: no sort, no factors).  ``fill`` marks
  survivors at random so that the selected token's law approaches the target's where the drafts allow;
  at L = 1 the sum is the selected token's overlap with p, and ``fill`` brings it close to the optimal
  K-draft acceptance alpha*_K.  The choice depends only on the prefix, so it keeps Q_S a function of the
  prefix and the rule exact.  Its dominance over ``spectr``, ``mdbv`` and ``mpbv`` is *measured*, not
  proven: it holds on the theory grid and at L = 1 (there >= ``spectr`` and ``mpbv`` by construction), and
  fails on 2.5% of random toys at L >= 2, by at most 1.6% of E[tau] (the choice scores only the next depth;
  ``experiments.theory random_toys=1600``, ``tests/test_verify_select_gbv.py``, README).
* At K = 1 nothing is selected (Q_S = q exactly) and the rule is ``gbv``, draw for draw: ``sample`` then
  runs ``gbv``'s vectorised sampler (the walk would build the same rows one prefix at a time); ``law``,
  ``reference`` and ``sample_walk`` still walk, and the tests compare them with ``gbv``.

**The rule.**  Walk the survivors S (:mod:`mdv.verify.selection`) to the selected draft D = D_sel; along D
the law of the selected draft has the conditionals q_S(.|D_<i) (full rows) and joints Q_S(D_<=i).  With
the effective target P (older windows applied),

    h_i = (min(P(u), Q_S(u)) - s(u)) / (Q_S(u) - s(u)),  s(u) = sum_x min(P(u·x), Q_S(u·x)),  u = D_<=i  (i < L),
    h_L = min(1, P(D)/Q_S(D)),        tau = max{i : eta_i < h_i},

extra token ``norm((P(u·x) - Q_S(u·x))_+)`` at u = D_<=tau, or the bonus p(.|c, D) at tau = L.  An early
exit leaves a window whose residual subtracts Q_S (:mod:`mdv.verify.adjust`, a selection window).

**Randomness** (:class:`~mdv.verify.base.Uniforms`).  GBV's test at depth i: ``coins[:, 0, i-1]``; the
K-SEQ walk at depth i: ``coins[:, 1, i]`` picks the first accepted survivor (one inverse-CDF draw over
"survivor j is the first accepted, or none"), ``draws[:, i]`` the residual y; the ``fill`` walk at depth
i: ``coins[:, 1, i]``, one inverse-CDF draw over the distinct survivor tokens in rank order with their
probabilities given the survivors (which are marked is never drawn survivor by survivor); the extra token:
``draws[:, L]`` (K >= 2) or ``draws[:, tau]`` (K = 1, as ``gbv``).  All distinct, so independent.

**Cost** (one instance).  Per depth of the selected draft, :func:`~mdv.verify.selection.node_step` for the
survivor counts still possible: one sort of V shared by the three rules, closed-form marginals O(m V) per
rule and count, up to FILL_SWEEPS passes per count for ``fill``'s marks (they stop at a fixed point), and
kernel rows only at the drafted tokens; where the survivor law puts almost no mass on two or more survivors
the rule is forced to ``first`` (the first survivor's token), whose marginal is q itself.  Where the draft proposes
at most half the vocabulary (the default pair's subset head: 8,192 of 49,152 tokens) all of it runs on the draft's
support and one column for the rest (:func:`~mdv.verify.selection.support_columns`: the same law, to 4e-16 on real
blocks).  The rows of a prefix are computed once and shared by the drafts through it; GBV's s(u) is summed on each
prefix's columns, and the sampler forms GBV's extra-token law only at the exit it drew (:meth:`law` forms all
L + 1).  Nothing grows with V^L or with draft tuples.  On CPU float64 rows
all of it runs in C (:mod:`mdv.verify.native`): the loops (the sort, K-SEQ's prefix sums and rho*, ``fill``'s
sweeps), each rule's factors and marginals added straight into its row, and the choice's scores, one C call per
rule at a prefix.  At V = 49,152, K = 4, L = 8 this is ~0.4-0.5 target steps on the verifier benchmark's synthetic
block (25-30 ms; 31-33 ms before the calls per rule; 46-50 ms before GBV ran per prefix and only at the drawn exit;
back to back with the lexicographic rule on forced prefixes: 58-60 ms; with K-SEQ there and on ties: 74-76 ms;
before the forced choice, the sweeps' stop and the cheaper cube root: 123-137 ms): its drafts rarely agree
past depth 2, so from depth 3 on the rule is forced, and the sorts, ``fill`` and K-SEQ's factors at the first
depths are the largest parts.  With peakier synthetic laws (``verifier.logit_scale=6`` / ``10``), whose drafts
agree more often as a trained pair's do, it is 1.7-1.8 target steps; on real blocks of the default pair at T = 0.4
(``verifier.blocks=real``), whose drafts share prefixes, every prefix of the selected draft is scored; there it
is ~0.2 target steps on the draft's support (11-15 ms; 16-18 ms before the calls per rule, against 64-65 ms on the
whole vocabulary, back to back;
1.6-1.7 steps before the choice skipped the rules that its ceiling rules out, :mod:`mdv.verify.selection`; README,
*Performance*).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from mdv.errors import InvalidInputError
from mdv.verify._math import categorical, last_accepted, last_accepted_law, safe_ratio
from mdv.verify.adjust import AdjustedTargetState, advance_state
from mdv.verify.base import Block, Branch, Outcome, Uniforms, Verifier
from mdv.verify.gbv import GreedyBlockVerification, greedy_h_of, greedy_residual
from mdv.verify.mpbv import ratio_scores
from mdv.verify.registry import register_verifier
from mdv.verify.selection import (CHOICE_ORDER, CHOICE_TOL, FILL_EPS, FILL_SWEEPS, FORCED_MASS, FORCED_RULE, MODES,
                                  RULES, NodeLaw, advance_survivors, fill_choice, node_step, root_survivors)
from mdv.verify.spectr import kseq_residual, kseq_rho


@dataclass
class _Prefix:
    """The walk at one prefix u: rows, the chosen rule and the selected law's next-token data."""

    p: Tensor  # [V] effective target p(.|u)
    q: Tensor | None  # [V] draft q(.|u) (None at depth L)
    log_p: float  # log P(u)
    log_q: float  # log Q_S(u)
    pi: Tensor  # [K+1] survivor-count law
    ratio: Tensor | None = None  # [1] P(u)/Q_S(u), as node_step saw it
    rule: str = "kseq"  # the token rule chosen at u (one of selection.RULES)
    law: NodeLaw | None = None  # node_step's law at u (N = 1)
    fill_rank: dict[int, Tensor] | None = None  # m -> rank [V] of fill's order

    @property
    def q_sel(self) -> Tensor:
        """[V] q_S(.|u) (formed on the tokens when first read: the walk reads the law's columns)."""
        return self.law.q_sel[0]


class _Walk:
    """The selected law along the drafts of one call, one instance b at a time.  A prefix's rows are read
    from the *first* draft through it (SpecTr's convention: in exact arithmetic all drafts through a prefix
    carry the same rows), so every quantity is a function of (b, prefix), computed once."""

    def __init__(self, block: Block, p_eff: Tensor, mode: str) -> None:
        self.block, self.p_eff, self.mode = block, p_eff, mode
        self.L = block.L  # (Block.L is a property over the tokens' shape: read once)
        # the walk reads single entries many times per instance: Python lists and numpy rows read once per
        # call instead of one small torch op per read (the audit and the fuzz tests run ~1e6 instances)
        self.token_lists: list[list[list[int]]] = block.tokens.long().tolist()  # [B][K][L]
        self.prefixes = [[[tuple(d[:i]) for i in range(block.L + 1)] for d in drafts]  # [B][K][L+1]
                         for drafts in self.token_lists]
        self.p_rows = p_eff.detach().cpu().numpy()  # [B, K, L+1, V]: the rows' bytes key shared nodes
        self.q_rows = block.q.detach().cpu().numpy()  # [B, K, L, V]
        self.memo: dict[tuple[int, tuple[int, ...]], _Prefix] = {}
        self.shared: dict[tuple, _Prefix] = {}
        self.gbv_memo: dict[int, tuple[Tensor, Tensor, Tensor]] = {}
        self.h_memo: dict[int, tuple[Tensor, Tensor, list[_Prefix]]] = {}  # h, P(u)/Q_S(u) and the nodes along a draft
        self.extra_memo: dict[tuple[int, int], Tensor] = {}  # the sampler's extra-token laws, by (draft, tau)

    def at(self, b: int, k: int, i: int) -> _Prefix:
        """The prefix of length i of draft k of instance b."""
        prefix = self.prefixes[b][k][i]
        key = (b, prefix)
        node = self.memo.get(key)
        if node is not None:
            return node
        head = next(j for j, d in enumerate(self.prefixes[b]) if d[i] == prefix)  # first draft through it
        parent = self.at(b, head, i - 1) if i > 0 else None
        p_row, q_row = self.p_eff[b, head, i], (self.block.q[b, head, i] if i < self.L else None)
        x = prefix[-1] if i else -1
        if len(self.token_lists) == 1:  # one instance: no other prefix has its node (a key copies and hashes 2 rows)
            node = self._make(parent, x, p_row, q_row)
        else:  # instances whose prefixes carry the same rows share the node (the oracle's instances share a context)
            content = (id(parent), x, self.p_rows[b, head, i].tobytes(),
                       self.q_rows[b, head, i].tobytes() if q_row is not None else b"")
            node = self.shared.get(content)
            if node is None:
                node = self.shared[content] = self._make(parent, x, p_row, q_row)
        self.memo[key] = node
        return node

    def _make(self, parent: _Prefix | None, x: int, p_row: Tensor, q_row: Tensor | None) -> _Prefix:
        if parent is None:
            log_p, log_q, pi = 0.0, 0.0, root_survivors(self.block.K, torch.zeros(()))
        else:
            mass, pi = advance_survivors(parent.law, torch.tensor([x]))
            log_p = parent.log_p + float(parent.p[x].log())  # -inf where the target gives the drafted token 0
            log_q, pi = parent.log_q + float(mass[0].log()), pi[0]
        node = _Prefix(p_row, q_row, log_p, log_q, pi)
        if q_row is not None:
            # float64: a float32 ratio moved fill's targets (and the choice) away from what a later iteration's
            # window recomputes in float64, and the law drifted (TV 7e-9, tests/test_exactness.py)
            node.ratio = safe_ratio(torch.tensor([log_p], dtype=torch.float64),
                                    torch.tensor([log_q], dtype=torch.float64))
            node.law = node_step(p_row[None], q_row[None], node.ratio, pi[None], self.mode)
            node.rule = RULES[int(node.law.rule[0])]
        return node

    # ------------------------------------------------------------------ the selection
    def _kseq_parts(self, node: _Prefix, m: int) -> tuple[Tensor, Tensor]:
        """(beta per-draft acceptance, the K-SEQ residual) with m >= 2 survivors: the law's own, on its columns
        (:class:`~mdv.verify.selection.NodeLaw`: the tokens, or the draft's support and one column off it)."""
        f = node.law.kseq(m)
        return f.beta[0], f.res[0]

    def _lex_token(self, node: _Prefix, toks: list[int]) -> int:
        """mpbv's ranking among the survivors' tokens: the largest (r(x), -x), r read at those tokens only."""
        at = torch.tensor(toks, dtype=torch.long)
        r = dict(zip(toks, ratio_scores(node.p[at], node.q[at]).tolist()))
        return max(toks, key=lambda x: (r[x], -x))

    def _fill_probs(self, node: _Prefix, cols: list[int]) -> list[tuple[int, float]]:
        """fill's choice among the survivors' tokens, given as the law's columns: [(column, probability)] in rank
        order."""
        if node.fill_rank is None:
            node.fill_rank = {}
        m = len(cols)
        f = node.law.fill(m)  # the law's own marks
        if m not in node.fill_rank:
            node.fill_rank[m] = f.rank()[0]
        return fill_choice(f.theta[0], node.fill_rank[m], cols)

    def _kseq_children(self, node: _Prefix, toks: list[int], cols: list[int], prob: float) -> dict[int, float]:
        """K-SEQ's choice among the survivors' tokens toks (columns cols), reached with probability prob:
        {token: probability}."""
        beta, res = self._kseq_parts(node, len(toks))
        children: dict[int, float] = {}
        rest = prob
        for t, c in zip(toks, cols):
            a = rest * float(beta[c])
            children[t] = children.get(t, 0.0) + a
            rest -= a
        token_of = dict(zip(cols, toks))  # the support's columns are its tokens, one to one
        drafted = set(cols)
        for c in drafted:
            children[token_of[c]] = children.get(token_of[c], 0.0) + rest * float(res[c])
        undrafted = 1.0 - sum(float(res[c]) for c in drafted)
        children[toks[0]] = children.get(toks[0], 0.0) + rest * max(undrafted, 0.0)
        return children

    def select(self, b: int, walk_coins: list[float], draws: list[float]) -> int:
        """The selected draft of instance b: walk_coins = ``uniforms.coins[b, 1]`` and draws = ``uniforms.draws[b]``
        as lists (one ``tolist`` per call, not one tensor read per depth)."""
        S = list(range(self.block.K))
        drafts = self.token_lists[b]
        for i in range(self.L):
            if len(S) == 1:
                break
            node = self.at(b, S[0], i)
            toks = [drafts[s][i] for s in S]
            if node.rule == "first":
                x = toks[0]
            elif node.rule == "lex":
                x = self._lex_token(node, toks)
            elif node.rule == "fill":  # one inverse-CDF draw over the distinct tokens in rank order
                cols = node.law.column_list(toks)
                u, cum, choice = walk_coins[i], 0.0, None
                for c, w in self._fill_probs(node, cols):
                    cum += w
                    choice = c
                    if u < cum:
                        break
                x = toks[cols.index(choice)]
            else:
                cols = node.law.column_list(toks)
                beta, res = self._kseq_parts(node, len(S))
                u, cum, rest, x = walk_coins[i], 0.0, 1.0, None
                for t, c in zip(toks, cols):
                    a = rest * float(beta[c])
                    if u < cum + a:
                        x = t
                        break
                    cum, rest = cum + a, rest - a
                if x is None:  # y over the tokens (in id order, as without the support's columns)
                    y = int(categorical(node.law.residual_on_tokens(res, node.p),
                                        torch.tensor(draws[i], dtype=torch.float64)))
                    x = y if y in toks else toks[0]
            S = [s for s, t in zip(S, toks) if t == x]
        return S[0]

    def selection_law(self, b: int) -> dict[int, float]:
        """sel -> Pr(sel | drafts of instance b), by branching the walk."""
        out: dict[int, float] = {}

        def walk(S: list[int], i: int, prob: float) -> None:
            if prob <= 0.0:
                return
            if i == self.L or len(S) == 1:
                out[S[0]] = out.get(S[0], 0.0) + prob
                return
            node = self.at(b, S[0], i)
            toks = [self.token_lists[b][s][i] for s in S]
            children: dict[int, float] = {}
            if node.rule == "first":
                children[toks[0]] = prob
            elif node.rule == "lex":
                children[self._lex_token(node, toks)] = prob
            elif node.rule == "fill":
                cols = node.law.column_list(toks)
                children = {toks[cols.index(c)]: prob * w for c, w in self._fill_probs(node, cols)}
            else:
                children = self._kseq_children(node, toks, node.law.column_list(toks), prob)
            for t, w in children.items():
                walk([s for s, x in zip(S, toks) if x == t], i + 1, w)

        walk(list(range(self.block.K)), 0, 1.0)
        return out

    # ------------------------------------------------------------------ GBV along the selected draft
    def along(self, b: int, sel: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(log P [L+1], log Q_S [L+1], p rows [L+1, V], q_S rows [L, V]) along draft sel."""
        L = self.block.L
        nodes = [self.at(b, sel, i) for i in range(L + 1)]
        log_p = torch.tensor([n.log_p for n in nodes], dtype=torch.float64)
        log_q = torch.tensor([n.log_q for n in nodes], dtype=torch.float64)
        return log_p, log_q, torch.stack([n.p for n in nodes]), torch.stack([n.q_sel for n in nodes[:L]])

    def gbv(self, b: int, sel: int) -> tuple[Tensor, Tensor, Tensor]:
        """(h [L], the extra-token laws after tau = 0..L [L+1, V], the law of tau [L+1]) along draft sel, once
        per distinct draft."""
        key = id(self.at(b, sel, self.L))  # the full block's node: shared by instances with equal rows
        if key not in self.gbv_memo:
            h = self.gbv_h(b, sel)
            log_p, log_q, p_rows, q_rows = self.along(b, sel)
            residuals = greedy_residual(safe_ratio(log_p[:-1], log_q[:-1]), p_rows[:-1], q_rows)  # [L, V]
            self.gbv_memo[key] = (h, torch.cat([residuals, p_rows[-1:]], 0), last_accepted_law(h))
        return self.gbv_memo[key]

    def gbv_h(self, b: int, sel: int) -> Tensor:
        """GBV's h [L] along draft sel, once per distinct draft: :func:`~mdv.verify.gbv.greedy_block_h` with each
        s(u) summed on its prefix's columns (:meth:`~mdv.verify.selection.NodeLaw.overlap_on_columns`: the
        draft's support where the law was scored on it), not over [L, V] stacked rows."""
        key = id(self.at(b, sel, self.L))
        if key not in self.h_memo:
            nodes = [self.at(b, sel, i) for i in range(self.L + 1)]
            r = safe_ratio(torch.tensor([n.log_p for n in nodes], dtype=torch.float64),
                           torch.tensor([n.log_q for n in nodes], dtype=torch.float64))  # [L+1] P(u)/Q_S(u)
            s = torch.cat([nodes[i].law.overlap_on_columns(r[i]) for i in range(1, self.L)]) if self.L > 1 \
                else r.new_zeros(0)  # [L-1]
            self.h_memo[key] = (greedy_h_of(r, s), r, nodes)
        return self.h_memo[key][0]

    def extra_law(self, b: int, sel: int, tau: int) -> Tensor:
        """The extra token's law [V] after GBV accepts tau tokens of draft sel (after :meth:`gbv_h`): the residual
        at tau < L, the bonus row at L -- :meth:`gbv`'s row tau, formed alone (a call needs one of L + 1)."""
        key = id(self.at(b, sel, self.L))
        if (key, tau) not in self.extra_memo:
            _, r, nodes = self.h_memo[key]
            self.extra_memo[key, tau] = nodes[tau].p if tau == self.L else greedy_residual(
                r[tau], nodes[tau].p, nodes[tau].q_sel)
        return self.extra_memo[key, tau]


@register_verifier
class SelectGreedyBlockVerification(AdjustedTargetState, Verifier):
    """``select_gbv``: a selected draft (K-SEQ, lexicographic or filling walk, chosen per prefix) verified by greedy
    block verification against its own law, with the target adjustment (module docstring)."""

    name: ClassVar[str] = "select_gbv"
    lossless: ClassVar[bool] = True
    multi_draft: ClassVar[bool] = True
    stateful: ClassVar[bool] = True

    def __init__(self, selection: str = "choose") -> None:
        if not isinstance(selection, str) or selection not in MODES:
            raise InvalidInputError(
                f"select_gbv option selection must be one of {', '.join(map(repr, MODES))}; got {selection!r}")
        self.selection = selection
        super().__init__()

    # ------------------------------------------------------------------ state (AdjustedTargetState)
    def advance(self, state: Any, block: Block, outcome: Outcome) -> Any:
        tau, sel = int(outcome.tau[0]), int(outcome.sel[0])
        path = outcome.emitted(block, 0)
        anchors = None if tau == block.L else [tuple(path[:tau])]
        return advance_state(state, path, block.p[0, sel, :tau + 1], block.q[0, sel], block.L, anchors,
                             selection=(self.selection, block.K))

    # ------------------------------------------------------------------ the three views
    def law(self, block: Block, state: Any = None) -> list[Branch]:
        """Pr(sel | drafts) by branching the walk; given sel, GBV's law: (L+1) branches per selectable draft."""
        walk = _Walk(block, self.effective_target(block, state), self.selection)
        B, K, L, V = block.B, block.K, block.L, block.V
        prob = torch.zeros(B, K, L + 1, dtype=torch.float64)
        dists = torch.zeros(B, K, L + 1, V, dtype=torch.float64)
        at_b, at_sel, weights, tau_laws, next_laws = [], [], [], [], []  # one entry per selectable (b, sel)
        for b in range(B):
            for sel, w in walk.selection_law(b).items():
                _, d, tau_law = walk.gbv(b, sel)
                at_b.append(b)
                at_sel.append(sel)
                weights.append(w)
                tau_laws.append(tau_law)
                next_laws.append(d)
        if at_b:  # written at once: one indexed store instead of two per (b, sel)
            where = (torch.tensor(at_b), torch.tensor(at_sel))
            prob[where] = torch.tensor(weights, dtype=torch.float64).unsqueeze(-1) * torch.stack(tau_laws)
            dists[where] = torch.stack(next_laws)
        out = []
        for sel in range(K):
            for t in range(L + 1):
                out.append(Branch(prob[:, sel, t], torch.full((B,), sel, dtype=torch.long),
                                  torch.full((B,), t, dtype=torch.long), dists[:, sel, t]))
        return out

    def sample(self, block: Block, uniforms: Uniforms, state: Any = None) -> Outcome:
        if block.K == 1:  # Q_S = q: GBV itself (same effective target, same uniforms; module docstring)
            return GreedyBlockVerification().sample(block, uniforms, state)
        return self.sample_walk(block, uniforms, state)

    def sample_walk(self, block: Block, uniforms: Uniforms, state: Any = None) -> Outcome:
        """The walk's sampler, at any K (``sample`` uses it for K >= 2; at K = 1 the tests compare it with gbv)."""
        walk = _Walk(block, self.effective_target(block, state), self.selection)
        B, L = block.B, block.L
        # the walk's coins are uniforms.coins[:, 1] (at K = 1 there is no such row, and the walk reads no coin)
        walk_coins, draws = uniforms.coins[:, min(1, block.K - 1)].tolist(), uniforms.draws.tolist()
        sels = [walk.select(b, walk_coins[b], draws[b]) for b in range(B)]
        # GBV along the selected drafts: the exits for all instances at once, then the extra token's law at each
        tau = last_accepted(torch.stack([walk.gbv_h(b, sel) for b, sel in enumerate(sels)]), uniforms.coins[:, 0])  # [B]
        dist = torch.stack([walk.extra_law(b, sel, t) for b, (sel, t) in enumerate(zip(sels, tau.tolist()))])  # [B, V]
        draw = uniforms.draws[:, L] if block.K > 1 else uniforms.draws.gather(1, tau.unsqueeze(1)).squeeze(1)
        return Outcome(tau, torch.tensor(sels, dtype=torch.long), categorical(dist, draw))

    def reference(self, block: Block, uniforms: Uniforms, state: Any = None) -> Outcome:
        """Scalar transcription: the walk with K-SEQ's sequential coin tests spelled out, the survivor law by
        enumerating the m-tuples of next tokens (exponential in K: tests only), plain joints for GBV."""
        p_all = self.effective_target(block, state)
        K, L, V = block.K, block.L, block.V
        taus, sels, toks = [], [], []
        # step() below is a pure function of its arguments; the walk calls it again along the same prefixes
        # (every depth restarts from the root, instances share rows), so its results are kept by argument
        step_memo: dict[tuple, tuple[str, list[list[float]]]] = {}
        for b in range(block.B):
            D = block.tokens[b].tolist()

            def rows(s: int, i: int) -> tuple[list[float], list[float]]:
                """The rows at draft s's prefix of length i, read from the first draft through that prefix."""
                head = next(k for k in range(K) if D[k][:i] == D[s][:i])
                return p_all[b, head, i].tolist(), (block.q[b, head, i].tolist() if i < L else [])

            def lex_pick(pr: list[float], qr: list[float], cand: list[int]) -> int:
                def r(x: int) -> float:
                    return 0.0 if pr[x] <= 0.0 else (1.0 if qr[x] <= 0.0 else min(1.0, pr[x] / qr[x]))
                return max(cand, key=lambda x: (r(x), -x))

            def kseq_pick(pr: list[float], qr: list[float], cand: list[int], u: float, y_u: float) -> int:
                pt, qt = torch.tensor([pr], dtype=torch.float64), torch.tensor([qr], dtype=torch.float64)
                rho = float(kseq_rho(pt, qt, len(cand))[0])
                rest = 1.0
                lo = 0.0
                for x in cand:  # sequential tests: draft j accepted given the earlier ones rejected
                    a = 0.0 if qr[x] <= 0.0 else min(1.0, pr[x] / (rho * qr[x]))
                    if u < lo + rest * a:
                        return x
                    lo, rest = lo + rest * a, rest * (1.0 - a)
                res = kseq_residual(pt, qt, len(cand), torch.tensor([rho], dtype=torch.float64))[0]
                y = int(categorical(res, torch.tensor(y_u, dtype=torch.float64)))
                return y if y in cand else cand[0]

            def fill_marks(pr: list[float], qr: list[float], target: float, m: int) -> tuple[list[int], list[float]]:
                """fill's rank order and theta: FILL_SWEEPS Jacobi sweeps of the filling recursion from theta = 1."""
                order = sorted(range(V), key=lambda x: (-(pr[x] / qr[x] if qr[x] > 0.0 else 0.0), x))
                theta = [1.0] * V
                for _ in range(FILL_SWEEPS):
                    new, above = [0.0] * V, 0.0
                    for x in order:
                        s = min(max(1.0 - above, 0.0), 1.0)  # no survivor marked above x, per survivor
                        d = max(s ** m - target * pr[x], 0.0)
                        rest = d ** (1.0 / m) if d >= FILL_EPS else d * FILL_EPS ** (1.0 / m - 1.0)  # Lipschitz root
                        new[x] = 0.0 if qr[x] <= 0.0 else min(max((s - rest) / qr[x], 0.0), 1.0)
                        above += qr[x] * theta[x]
                    theta = new
                return order, theta

            def fill_choice_by_marks(order: list[int], theta: list[float], tup: list[int]) -> dict[int, float]:
                """Pr(token chosen | the survivors' tokens), by enumerating which survivors are marked."""
                out: dict[int, float] = {}
                for marks in itertools.product((0, 1), repeat=len(tup)):
                    w = math.prod(theta[x] if mk else 1.0 - theta[x] for x, mk in zip(tup, marks))
                    marked = [x for x, mk in zip(tup, marks) if mk]
                    x = min(marked or tup, key=order.index)  # the top-ranked marked token, else the top-ranked one
                    out[x] = out.get(x, 0.0) + w
                return out

            def fill_pick(pr: list[float], qr: list[float], target: float, cand: list[int], u: float) -> int:
                order, theta = fill_marks(pr, qr, target, len(cand))
                cum = 0.0
                choice = fill_choice_by_marks(order, theta, cand)
                for x in sorted(set(cand), key=order.index):
                    cum += choice.get(x, 0.0)
                    if u < cum:
                        return x
                return x  # u at the top of the rounding: the lowest-ranked token, as the fast path

            def kernel(pr: list[float], qr: list[float], m: int, rule: str, target: float) -> list[list[float]]:
                """T_m(x, j) by enumerating the m next tokens and the walk's randomness."""
                T = [[0.0] * (K + 1) for _ in range(V)]
                if m == 1:
                    for x in range(V):
                        T[x][1] = qr[x]
                    return T
                pt, qt = torch.tensor([pr], dtype=torch.float64), torch.tensor([qr], dtype=torch.float64)
                rho = float(kseq_rho(pt, qt, m)[0])
                res = kseq_residual(pt, qt, m, torch.tensor([rho], dtype=torch.float64))[0].tolist()
                for tup in itertools.product(range(V), repeat=m):
                    w = math.prod(qr[x] for x in tup)
                    if w == 0.0:
                        continue
                    if rule in ("lex", "first"):
                        x = lex_pick(pr, qr, list(tup)) if rule == "lex" else tup[0]
                        T[x][tup.count(x)] += w
                        continue
                    if rule == "fill":
                        for x, c in fill_choice_by_marks(*fill_marks(pr, qr, target, m), list(tup)).items():
                            T[x][tup.count(x)] += w * c
                        continue
                    rest = w
                    for x in tup:
                        a = 0.0 if qr[x] <= 0.0 else min(1.0, pr[x] / (rho * qr[x]))
                        T[x][tup.count(x)] += rest * a
                        rest *= 1.0 - a
                    for y in range(V):
                        x = y if y in tup else tup[0]
                        T[x][tup.count(x)] += rest * res[y]
                return T

            # the law of the selected draft at a prefix, from its survivor law and the prefix's rows
            def step(pr: list[float], qr: list[float], P: float, Q: float,
                     pi: list[float]) -> tuple[str, list[list[float]]]:
                key = (tuple(pr), tuple(qr), P, Q, tuple(pi))
                if key not in step_memo:
                    step_memo[key] = step_uncached(pr, qr, P, Q, pi)
                return step_memo[key]

            def step_uncached(pr: list[float], qr: list[float], P: float, Q: float,
                              pi: list[float]) -> tuple[str, list[list[float]]]:
                mixed = {}
                for rule in RULES:
                    acc = [[0.0] * (K + 1) for _ in range(V)]
                    for m in range(1, K + 1):
                        if pi[m] > 0.0:
                            T = kernel(pr, qr, m, rule, P / Q)
                            for x in range(V):
                                for j in range(K + 1):
                                    acc[x][j] += pi[m] * T[x][j]
                    mixed[rule] = acc
                if self.selection != "choose":
                    return self.selection, mixed[self.selection]
                if sum(pi[2:]) <= FORCED_MASS:  # (selection.FORCED_MASS: no rule's score can differ by CHOICE_TOL)
                    return FORCED_RULE, mixed[FORCED_RULE]
                score = {rule: sum(min(P / Q * pr[x], sum(mixed[rule][x])) for x in range(V)) for rule in CHOICE_ORDER}
                best = CHOICE_ORDER[0]
                for rule in CHOICE_ORDER[1:]:  # a later rule must win by more than CHOICE_TOL
                    if score[rule] > score[best] + CHOICE_TOL:
                        best = rule
                return best, mixed[best]

            # the walk: P(u), Q_S(u), pi_u along the first survivor's prefix
            S = list(range(K))
            for i in range(L):
                if len(S) == 1:
                    break
                f = S[0]
                P, Q, pi = 1.0, 1.0, [0.0] * K + [1.0]
                for d in range(i):
                    pr, qr = rows(f, d)
                    _, T = step(pr, qr, P, Q, pi)
                    x = D[f][d]
                    qs = sum(T[x])
                    pi = [t / qs for t in T[x]]
                    P, Q = P * pr[x], Q * qs
                pr, qr = rows(f, i)
                rule, _ = step(pr, qr, P, Q, pi)
                cand = [D[s][i] for s in S]
                if rule == "first":
                    x = cand[0]
                elif rule == "lex":
                    x = lex_pick(pr, qr, cand)
                elif rule == "fill":
                    x = fill_pick(pr, qr, P / Q, cand, float(uniforms.coins[b, 1, i]))
                else:
                    x = kseq_pick(pr, qr, cand, float(uniforms.coins[b, 1, i]), float(uniforms.draws[b, i]))
                S = [s for s in S if D[s][i] == x]
            sel = S[0]
            # GBV along the selected draft with plain joints of P and Q_S
            P, Q, pi = [1.0], [1.0], [0.0] * K + [1.0]
            q_rows = []
            for i in range(L):
                pr, qr = rows(sel, i)
                _, T = step(pr, qr, P[-1], Q[-1], pi)
                qs = [sum(T[x]) for x in range(V)]
                q_rows.append(qs)
                x = D[sel][i]
                pi = [t / qs[x] for t in T[x]]
                P.append(P[-1] * pr[x])
                Q.append(Q[-1] * qs[x])
            h = [1.0]
            for i in range(1, L):
                pr = rows(sel, i)[0]
                a = min(P[i], Q[i])
                s = sum(min(P[i] * pr[x], Q[i] * q_rows[i][x]) for x in range(V))
                num, den = a - s, Q[i] - s
                h.append(1.0 if den <= 1e-12 * Q[i] else 0.0 if num <= 1e-12 * Q[i] else min(1.0, num / den))
            h.append(min(1.0, P[L] / Q[L]))
            tau = 0
            for i in range(1, L + 1):
                if float(uniforms.coins[b, 0, i - 1]) < h[i]:
                    tau = i
            p_tau = torch.tensor(rows(sel, tau)[0], dtype=torch.float64)
            if tau == L:
                dist = p_tau
            else:
                res = torch.clamp(P[tau] * p_tau - Q[tau] * torch.tensor(q_rows[tau], dtype=torch.float64), min=0.0)
                dist = res / res.sum() if float(res.sum()) > 1e-12 * Q[tau] else p_tau
            draw = uniforms.draws[b, L] if K > 1 else uniforms.draws[b, tau]
            taus.append(tau)
            sels.append(sel)
            toks.append(int(categorical(dist, draw)))
        return Outcome(torch.tensor(taus, dtype=torch.long), torch.tensor(sels, dtype=torch.long),
                       torch.tensor(toks, dtype=torch.long))


__all__ = ["SelectGreedyBlockVerification"]
