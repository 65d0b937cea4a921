"""``ngram``: prompt lookup with a proper law (no model; Saxena 2023, "Prompt Lookup Decoding", made
stochastic so that every multi-draft verifier applies).

Law of the next drafted token after the context ``c = c_1 .. c_m`` (committed sequence plus the row's
drafted prefix): for n = n_max, n_max - 1, .., n_min, let ``s = c_{m-n+1..m}`` be the suffix n-gram and

    J_n = { j : j + n <= m - 1,  c_{j+1..j+n} = s }        (earlier occurrences followed by a token)

The first n with ``J_n`` non-empty gives the empirical law of the tokens that follow it,

    q(x | c) = #{ j in J_n : c_{j+n+1} = x } / |J_n|.

Occurrences may overlap the suffix (``a a a`` after ``a a``); the suffix itself is never one (it has no
following token).  With no match at any n, the fallback rule is ``"unigram"``: the empirical law of
all tokens of c (always defined; a rejected guess still yields the target's correction token, one token
per target pass as autoregressive decoding would).  ``on_miss``: what the engine gets where the committed
context itself has no match (decided from the context before any draw, so the K blocks stay i.i.d. of
one length), when it takes shorter blocks (stateless verifiers; otherwise always ``"block"``):

* ``"skip"`` (default): no tokens; the iteration is one autoregressive target step, as Hugging Face's
  prompt lookup, which proposes nothing there;
* ``"guess"``: a block of one token from the fallback law (a 2-token target pass);
* ``"block"``: L tokens from the fallback law (an (L + 1)-token pass).

The sampling transform is not
applied to q: verification needs only that q is the exact law the tokens are drawn from.  The K blocks
are i.i.d. draws of this law, position by position, each row conditioning on its own drafted prefix.

Fast path: a per-sequence index ``(n, n-gram) -> next-token counts`` over the committed sequence, grown
incrementally; windows that end inside a row's drafted prefix (at most L - 1 per n) are counted by a
direct scan.  :meth:`NgramDrafter.reference_law` scans the whole context for every n.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any, Sequence

import torch
from torch import Tensor

from mdv.drafters.base import Draft, Drafter, draw_rows
from mdv.drafters.registry import register_drafter
from mdv.errors import InvalidInputError
from mdv.models.base import check_model
from mdv.models.sampling import SamplingConfig

FALLBACKS = ("unigram",)
#: What a context without a match gets (module docstring): no block, one fallback token, or L of them.
ON_MISS = ("skip", "guess", "block")


def _law(counts: Counter[int], V: int) -> Tensor:
    """The empirical law [V] float64 of ``counts`` (token -> count)."""
    q = torch.zeros(V, dtype=torch.float64)
    total = sum(counts.values())
    for tok, c in counts.items():
        q[tok] = c / total
    return q


@register_drafter
class NgramDrafter(Drafter):
    """Prompt lookup: the empirical law after the longest earlier suffix match (module docstring)."""

    name = "ngram"

    def __init__(self, n_max: int = 3, n_min: int = 2, fallback: str = "unigram", on_miss: str = "skip") -> None:
        for label, v in (("n_max", n_max), ("n_min", n_min)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InvalidInputError(f"ngram drafter: {label} must be an integer >= 1; got {v!r}")
        if n_min > n_max:
            raise InvalidInputError(f"ngram drafter: n_min={n_min} > n_max={n_max}; choose 1 <= n_min <= n_max")
        if fallback not in FALLBACKS:
            raise InvalidInputError(f"ngram drafter: fallback must be one of {', '.join(FALLBACKS)}; got {fallback!r}")
        if on_miss not in ON_MISS:
            raise InvalidInputError(f"ngram drafter: on_miss must be one of {', '.join(ON_MISS)}; got {on_miss!r}")
        self.n_max, self.n_min, self.fallback, self.on_miss = n_max, n_min, fallback, on_miss
        self.V = 0
        self._reset()

    def options(self) -> dict[str, Any]:
        return {"n_max": self.n_max, "n_min": self.n_min, "fallback": self.fallback,
                "on_miss": self.on_miss}

    def bind(self, target: Any, draft: Any) -> int:
        self.V = check_model("target", target)
        return self.V

    # ------------------------------------------------------------------ the index over committed tokens
    def _reset(self) -> None:
        self._seq: list[int] = []
        self._index: dict[tuple[int, ...], Counter[int]] = defaultdict(Counter)
        self._unigram: Counter[int] = Counter()

    def _sync(self, seq: Sequence[int]) -> None:
        """Index every position of ``seq`` not indexed yet (``seq`` extends the indexed sequence)."""
        m0 = len(self._seq)
        if list(seq[:m0]) != self._seq:  # a different sequence: start over
            self._reset()
            m0 = 0
        self._seq.extend(int(t) for t in seq[m0:])
        c = self._seq
        for t in range(m0, len(c)):  # c[t] follows the windows that end at t - 1
            self._unigram[c[t]] += 1
            for n in range(self.n_min, min(self.n_max, t) + 1):
                self._index[tuple(c[t - n:t])][c[t]] += 1

    def prefill(self, prompt: Sequence[int]) -> None:
        self._reset()
        self._sync(prompt)

    def _fast_law(self, drafted: Sequence[int]) -> Tensor | None:
        """The lookup law after the indexed sequence + ``drafted``; None when no n matches."""
        c, m0 = self._seq, len(self._seq)
        ctx = c + list(drafted)
        m = len(ctx)
        for n in range(min(self.n_max, m - 1), self.n_min - 1, -1):
            s = tuple(ctx[m - n:])
            counts = Counter(self._index.get(s, ()))
            # windows whose following token is a drafted one: follower index f in [m0, m)
            for f in range(max(m0, n), m):
                if tuple(ctx[f - n:f]) == s:
                    counts[ctx[f]] += 1
            if counts:
                return _law(counts, self.V)
        return None

    def propose(self, seq: Sequence[int], K: int, L: int, sampling: SamplingConfig,
                generator: torch.Generator, shorter_ok: bool = False) -> Draft:
        self._sync(seq)
        first = self._fast_law([])  # the law at the context itself, shared by every row
        if shorter_ok and first is None and self.on_miss != "block":
            # no earlier occurrence of the context's suffix: no block, or one guess, not L (module docstring)
            L = 0 if self.on_miss == "skip" else 1
        if first is None:
            first = _law(self._unigram, self.V)
        rows: list[list[int]] = [[] for _ in range(K)]
        qs = torch.empty(K, L, self.V, dtype=torch.float64)
        for i in range(L):
            if i == 0:
                q_i = first.expand(K, -1).to(generator.device)  # [K, V]
            else:
                laws = []
                for k in range(K):
                    law = self._fast_law(rows[k])
                    laws.append(law if law is not None else _law(self._unigram + Counter(rows[k]), self.V))
                q_i = torch.stack(laws).to(generator.device)  # [K, V]
            x = draw_rows(q_i, generator).tolist()
            qs[:, i] = q_i.cpu()
            for k in range(K):
                rows[k].append(int(x[k]))
        return Draft(torch.tensor(rows, dtype=torch.long, device=generator.device), qs.to(generator.device), calls=0)

    def reference_law(self, context: Sequence[int], sampling: SamplingConfig,
                      committed: int | None = None) -> Tensor:
        c = [int(t) for t in context]
        m = len(c)
        for n in range(self.n_max, self.n_min - 1, -1):
            if n >= m:
                continue
            s = c[m - n:]
            followers = Counter(c[j + n] for j in range(0, m - n) if c[j:j + n] == s)
            if followers:
                return _law(followers, self.V)
        return _law(Counter(c), self.V)  # the unigram fallback
