"""The teacher (recipe step 3) and the loss: one float32 target pass per sequence, its final hidden states kept
(fp16, cached); KL(teacher_T || draft_T) at sampled positions plus the centred-logit MSE through a d x d Gram
matrix of the head.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from mdv import assets
from mdv.models import default_pair as dp
from mdv.distill.data import cache_key, pad_batch


@torch.no_grad()
def teacher_hidden(target: Any, seqs: list[dict[str, Any]], batch: int, cache: Path | None = None
                   ) -> tuple[list[torch.Tensor], float]:
    """Per sequence: the target's final (post-norm) hidden states at positions ``start .. len-1``, fp16
    [n_pos, d]: the teacher's logits are ``head @ h``.  Also the seconds spent (as measured when
    computed).  With ``cache``, each sequence's result is stored on disk."""
    sha = assets.get_asset(dp.TARGET_ASSET).sha256
    keys = [cache_key({"target": sha, "ids": s["ids"], "start": s["start"]}) for s in seqs]
    out: list[Any] = [None] * len(seqs)
    seconds = 0.0
    todo = []
    for i, key in enumerate(keys):
        p = cache / "teacher" / f"{key}.pt" if cache is not None else None
        if p is not None and p.is_file():
            d = torch.load(p)
            out[i] = d["hidden"]
            seconds += d["seconds"]
        else:
            todo.append(i)
    if cache is not None:
        (cache / "teacher").mkdir(parents=True, exist_ok=True)
    order = sorted(todo, key=lambda i: len(seqs[i]["ids"]))
    for s in tqdm(range(0, len(order), batch), desc="teacher pass", unit="batch"):
        t0 = time.perf_counter()
        idx = order[s:s + batch]
        ids, mask = pad_batch(seqs, idx)
        h = target.model(input_ids=ids, attention_mask=mask).last_hidden_state  # right padding: causal, exact
        for r, i in enumerate(idx):
            out[i] = h[r, seqs[i]["start"]:len(seqs[i]["ids"])].half().clone()
        dt = time.perf_counter() - t0
        seconds += dt
        if cache is not None:
            for i in idx:
                torch.save({"hidden": out[i], "seconds": dt / len(idx)}, cache / "teacher" / f"{keys[i]}.pt")
    return out, seconds


def centered_gram(head: torch.Tensor) -> torch.Tensor:
    """G = Wc^T Wc / V for the head W [V, d] with its mean row removed: for hidden states a, b,
    ``(a-b)^T G (a-b)`` is the mean squared difference of their softmax-invariant (centred) logits."""
    wc = head.double() - head.double().mean(0, keepdim=True)
    return (wc.T @ wc / head.shape[0]).float()


def distill_loss(h_draft: torch.Tensor, h_teacher: torch.Tensor, head: torch.Tensor, gram: torch.Tensor,
                 temperature: float, kl_rows: torch.Tensor, mse_weight: float
                 ) -> tuple[torch.Tensor, dict[str, float]]:
    """``KL(teacher_T || draft_T)`` (mean over the rows ``kl_rows``) plus ``mse_weight`` times the
    centred-logit mean squared error over all rows (computed through ``gram``, without forming the
    logits).  h_* [N, d] are post-norm final hidden states; ``head`` [V', d] is the target's output
    head or the rows of a vocabulary subset (both laws are then the softmax over those rows only: the
    shipped subset-head draft's support)."""
    d = h_draft - h_teacher
    mse = ((d @ gram) * d).sum(-1).mean()
    loss = mse_weight * mse
    stats = {"mse": float(mse.detach())}
    if kl_rows.numel():
        ld = torch.log_softmax((h_draft[kl_rows] @ head.T).float() / temperature, -1)
        with torch.no_grad():
            lt = torch.log_softmax((h_teacher[kl_rows] @ head.T).float() / temperature, -1)
        kl = (lt.exp() * (lt - ld)).sum(-1).mean()
        loss = loss + kl
        stats["kl"] = float(kl.detach())
        stats["top1"] = float((ld.argmax(-1) == lt.argmax(-1)).float().mean())
    return loss, stats
