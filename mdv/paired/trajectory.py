"""The paired measurement's target trajectory, sampled from the target alone, reading the target laws a
context's tree pass already holds.

A trajectory is plain autoregressive sampling from the target under the run's transform:

    x_{j+1} ~ p(. | prompt, x_1..x_j),    one uniform u_j per token,  x = F_p^{-1}(u_j)

exactly as ``mdv.generate(target, None, prompt, "ar", seed=s)`` does it: the same seeded generator and the
engine's own step and draw (:func:`mdv.engine.ar_logits`, :func:`mdv.engine.ar_draw`).  What differs
is only *where the law p comes from*.  At a measured context c the token-tree pass has scored every
draft prefix: ``p[k, d] = p(. | c, D_k,<d+1)`` (:func:`mdv.engine.score_drafts`).  So while the
trajectory's new tokens after c are a prefix ``D_k,<d+1`` of some draft, the next law is already known
and costs no target call; once the trajectory leaves every draft path (or d > L_max) it takes ordinary
target steps on the same KV-cache session.  Every token is still drawn from the target's own conditional
given the trajectory so far -- the draft only decides which conditionals were computed before -- so the
trajectory's law is the target's AR law, and with the same seed it is the token sequence ``generate``
gives (up to float32 rounding between a tree pass and a one-token pass, which flips a draw only when a
uniform falls within ~1e-6 of a CDF step).  The drafts of the next context are drawn after these tokens
are fixed, from an independent generator, so contexts and drafts keep the law of module
:mod:`mdv.paired.measure`.

Cost: one target call per token not on a draft path instead of one per token.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import torch
from torch import Tensor

from mdv.engine import ar_draw, ar_logits
from mdv.models.sampling import SamplingConfig
from mdv.models.session import DecodeSession


class TreeTrajectory:
    """Sampled target trajectory after ``prompt`` (module doc), advanced between measured contexts.

    session: the target's decode session, shared with the context probe (between contexts it holds a
    prefix of ``prompt + tokens``, at least the last token pending, and one row).  ``advance`` appends up
    to ``n`` tokens; it stops for good at an EOS token, at ``max_new_tokens`` or at the model context
    ``ctx`` (the stops of :func:`mdv.engine._decode_ar`; the context stop is known as soon as the last
    token fits, so no context is measured where ``generate`` would not have gone on).
    """

    def __init__(self, session: DecodeSession, prompt: Sequence[int], sampling: SamplingConfig, *, seed: int,
                 max_new_tokens: int, eos: frozenset[int], ctx: Optional[int]):
        self.session, self.prompt, self.sampling = session, list(prompt), sampling
        self.max_new_tokens, self.eos, self.ctx = int(max_new_tokens), eos, ctx
        self.generator = torch.Generator(device=session.device)
        self.generator.manual_seed(int(seed))
        self.tokens: list[int] = []
        self.stopped = False
        self.target_steps = 0  # target calls made for the trajectory (tokens off every draft path)
        self.reused = 0  # tokens whose law came from a tree pass
        self.laws: list[Tensor] = []  # [V] each: the law each token was drawn from

    def advance(self, n: int, drafts: Optional[Tensor] = None, p: Optional[Tensor] = None) -> None:
        """Append up to ``n`` tokens.  drafts [K, L] int64 and p [K, L+1, V] float64: the last tree pass
        at the context ``prompt + tokens`` (as it is when called), whose laws are reused where they hold
        (None: target steps only)."""
        start = len(self.tokens)
        with torch.inference_mode():
            for _ in range(n):
                seq_len = len(self.prompt) + len(self.tokens)
                if self.stopped or (self.ctx is not None and seq_len >= self.ctx):
                    self.stopped = True
                    return
                law = self._known_law(self.tokens[start:], drafts, p)
                if law is None:
                    law = self._target_step()
                else:
                    self.reused += 1
                token = ar_draw(law, self.generator)
                self.tokens.append(token)
                self.laws.append(law.reshape(-1).clone())  # a copy: a view would keep the tree pass's [K, L+1, V]
                if (token in self.eos or len(self.tokens) >= self.max_new_tokens
                        or (self.ctx is not None and seq_len + 1 >= self.ctx)):
                    self.stopped = True
                    return

    @staticmethod
    def _known_law(new: list[int], drafts: Optional[Tensor], p: Optional[Tensor]) -> Optional[Tensor]:
        """p(. | context, new) from the tree pass when ``new`` is a prefix of a draft; else None."""
        if drafts is None or p is None:
            return None
        d = len(new)
        if d == 0:
            return p[0, 0]  # every row starts at the context
        if d > drafts.shape[1]:
            return None
        on_path = (drafts[:, :d] == torch.tensor(new, dtype=drafts.dtype)).all(1).nonzero()
        return p[int(on_path[0, 0]), d] if len(on_path) else None

    def _target_step(self) -> Tensor:
        """One target call on the shared session: feed the pending tokens, -> the law of the next [V]."""
        logits = ar_logits(self.session, self.prompt + self.tokens)  # [1, V]
        self.target_steps += 1
        return self.sampling.probs(logits)[0]


def survival_along(drafter: Any, prompt: Sequence[int], tokens: Sequence[int], laws: Sequence[Tensor],
                   sampling: SamplingConfig, K_max: int) -> list[list[list[float]]]:
    """Where real ``sd`` / ``spectr`` iterations would end along a trajectory (:mod:`mdv.paired.renewal`,
    (3)-(5)): ``out[i][k-1][c]`` = P(c of the k drafts on the output's path at position i stay on it |
    the output), k = 1..K_max, c = 0..k.

    At position i the output token is y = x_i, the target law p = ``laws[i]`` and the draft law q the
    drafter's first-token law after ``prompt + tokens[:i]`` (:func:`mdv.paired.renewal.kseq_survival` has
    the formula).  The draft model gives q in one pass over the sequence; another drafter by its
    ``reference_law`` at each position (slow for ``eagle`` and ``layerskip``: a target pass each).
    laws: [n] of [V], the laws the tokens were drawn from (:attr:`TreeTrajectory.laws`)."""
    from mdv.drafters.model import ModelDrafter
    from mdv.paired.renewal import kseq_survival

    n, P = len(tokens), len(prompt)
    if n == 0:
        return []
    seq = list(prompt) + list(tokens)
    with torch.inference_mode():
        p = torch.stack([law.to(torch.float64).cpu() for law in laws])  # [n, V]
        if isinstance(drafter, ModelDrafter):
            q = laws_along(drafter.model, prompt, tokens, sampling)  # [n, V]: q(. | seq[:P + i])
        else:
            q = torch.stack([drafter.reference_law(seq[:P + i], sampling).to(torch.float64).cpu() for i in range(n)])
        y = torch.tensor(list(tokens), dtype=torch.long)
        return kseq_survival(p, q, y, K_max).tolist()


def laws_along(model: Any, prompt: Sequence[int], tokens: Sequence[int], sampling: SamplingConfig) -> Tensor:
    """[n, V] float64: model(. | prompt + tokens[:i]) under ``sampling``, i = 0..n-1, from ONE pass over
    ``prompt + tokens[:-1]`` (the draft's laws along a trajectory; the target's along an output that did not
    come from :class:`TreeTrajectory`, e.g. a real generation's)."""
    from mdv.models.session import open_session

    seq, P = list(prompt) + list(tokens), len(prompt)
    with torch.inference_mode():
        session = open_session(model)
        logits = session.extend(torch.tensor([seq[:-1]], dtype=torch.long, device=session.device))[0]
        return sampling.probs(logits[P - 1:]).to(torch.float64).cpu()  # [n, V]


def survival_given_output(target: Any, drafter: Any, prompt: Sequence[int], tokens: Sequence[int],
                          sampling: SamplingConfig, K_max: int) -> list[list[list[float]]]:
    """:func:`survival_along` for any output of a lossless run (a real ``sd`` / ``spectr`` generation's
    tokens): the target laws from one pass (:func:`laws_along`).  The law holds for any output
    because, given the output up to i, the survivors at i say nothing of the tokens after it (each
    iteration's output is p-distributed whatever drafts survive), so a run's own output gives E[N | x]
    for that very run (:mod:`mdv.paired.renewal`, (4))."""
    if not tokens:
        return []
    return survival_along(drafter, prompt, tokens, list(laws_along(target, prompt, tokens, sampling)), sampling,
                          K_max)


__all__ = ["TreeTrajectory", "survival_along", "laws_along", "survival_given_output"]
