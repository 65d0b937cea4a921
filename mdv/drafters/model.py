"""``model``: K i.i.d. blocks from a separate draft language model (the default pair's draft).

Per iteration (algorithms.md §12.2): the draft session processes its pending tokens (committed, not yet
in its cache) in one row, forks into K rows and takes L sequential steps; token i of row k is drawn by
inverse CDF from ``q[k, i] = T(q_model(. | c, D_k,<i+1))``, the draft model's next-token law under the
cell's sampling transform T (:class:`~mdv.models.sampling.SamplingConfig`, float64).  After the
verifier's outcome the cache keeps row ``sel`` and is cropped to ``n + min(tau, L - 1)`` tokens: the
correction/bonus token (and, after a full acceptance, the last draft token) stays pending.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import Tensor

from mdv.drafters.base import Draft, Drafter, draw_rows
from mdv.drafters.registry import register_drafter
from mdv.errors import InvalidInputError
from mdv.models.base import check_model
from mdv.models.sampling import SamplingConfig
from mdv.models.session import DecodeSession, open_session


def check_pair(target: Any, draft: Any) -> int:
    """The shared vocabulary size of ``target`` and ``draft``, or :class:`~mdv.errors.InvalidInputError`
    when either is not a LanguageModel or their vocabularies / tokenizers differ."""
    V = check_model("target", target)
    Vd = check_model("draft", draft)
    if Vd != V:
        raise InvalidInputError(
            f"target and draft vocabularies differ: target vocab_size={V}, draft vocab_size={Vd}; the"
            " two models must share one tokenizer (algorithms.md §12.15)")
    same = getattr(target, "same_vocabulary", None)
    if callable(same) and not same(draft):
        raise InvalidInputError(
            f"target and draft tokenizers map tokens to different ids (both have vocab_size={V}); the"
            " two models must share one tokenizer")
    return V


def draft_blocks(drf: DecodeSession, seq: Sequence[int], K: int, L: int, sampling: SamplingConfig,
                 generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """K i.i.d. draft blocks of length L after ``seq``: the draft session feeds its pending tokens
    ``seq[drf.length:]`` in one row, forks into K rows and takes L sequential steps (L draft calls).
    Each token is drawn from exactly the float64 vector recorded in q.

    Returns tokens [K, L] int64 and q [K, L, V] float64 on the generator's device; the session is left
    with K rows holding ``seq`` and the first L - 1 draft tokens.
    """
    gdev = generator.device
    pending = torch.tensor([list(seq[drf.length:])], dtype=torch.long, device=drf.device)  # [1, m]
    logits = drf.extend(pending)[:, -1]  # [1, V]
    drf.fork(K)
    q_i = sampling.probs(logits).to(gdev).expand(K, -1)  # [K, V] float64, shared first law
    qs: list[Tensor] = []
    toks: list[Tensor] = []
    for i in range(L):
        x = draw_rows(q_i, generator)  # [K]: drawn from exactly q_i
        qs.append(q_i)
        toks.append(x)
        if i < L - 1:
            logits = drf.extend(x.unsqueeze(1).to(drf.device))[:, -1]  # [K, V]
            q_i = sampling.probs(logits).to(gdev)
    return torch.stack(toks, 1), torch.stack(qs, 1)


@register_drafter
class ModelDrafter(Drafter):
    """The draft model passed to ``generate`` (``draft=``), with its KV-cache session."""

    name = "model"

    def __init__(self) -> None:
        self.model: Any = None
        self.session: DecodeSession | None = None
        self._n, self._L = 0, 0

    def draft_model(self, target: Any, draft: Any) -> Any:
        """The LanguageModel that drafts (subclasses derive it from the target)."""
        if draft is None:
            raise InvalidInputError("draft model is missing; pass a LanguageModel (CallableLM or HFModel) as draft,"
                                    " or choose a drafter that needs none (drafter='ngram' or 'layerskip')")
        return draft

    def bind(self, target: Any, draft: Any) -> int:
        model = self.draft_model(target, draft)
        V = check_pair(target, model)
        self.model = model
        return V

    @property
    def max_context(self) -> int | None:
        ctx = getattr(self.model, "max_context", None)
        return int(ctx) if ctx else None

    def prefill(self, prompt: Sequence[int]) -> None:
        self.session = open_session(self.model)
        self.session.prefill(list(prompt)[:-1])

    def propose(self, seq: Sequence[int], K: int, L: int, sampling: SamplingConfig,
                generator: torch.Generator, shorter_ok: bool = False) -> Draft:
        assert self.session is not None, "prefill() starts a sequence before propose()"
        tokens, q = draft_blocks(self.session, seq, K, L, sampling, generator)  # [K, L], [K, L, V]
        self._n, self._L = len(seq), L
        return Draft(tokens, q, calls=L)

    def commit(self, sel: int, tau: int) -> None:
        assert self.session is not None
        self.session.keep(sel)
        self.session.crop(self._n + min(tau, self._L - 1))

    def rewind(self, length: int) -> None:
        assert self.session is not None
        self.session.keep(0)
        self.session.crop(length)

    def reference_law(self, context: Sequence[int], sampling: SamplingConfig,
                      committed: int | None = None) -> Tensor:
        """A full forward pass over ``context`` (``next_logprobs``, no cache), under the transform."""
        return sampling.probs(torch.as_tensor(self.model.next_logprobs([list(context)]))[0])
