"""Training the draft (recipe step 4): the target's embedding, final norm and tied head plus a few decoder
layers initialised from target layers; only the layers (and the norm) trained, AdamW on the distillation loss.
"""
from __future__ import annotations

import math
import random
from typing import Any, Sequence

import torch
from omegaconf import DictConfig
from tqdm.auto import tqdm

from mdv.models import default_pair as dp
from mdv.distill.data import pad_batch
from mdv.distill.teacher import centered_gram, distill_loss


def warmup_cosine(opt: torch.optim.Optimizer, steps: int, warmup: int, min_lr_ratio: float
                  ) -> torch.optim.lr_scheduler.LambdaLR:
    """The recipes' schedule: the learning rate rises linearly over ``warmup`` steps, then follows a cosine
    from 1 to ``min_lr_ratio`` (times the optimiser's lr) at step ``steps``."""
    def lr_at(s: int) -> float:
        if s < warmup:
            return (s + 1) / warmup
        prog = (s - warmup) / max(1, steps - warmup)
        return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * prog))

    return torch.optim.lr_scheduler.LambdaLR(opt, lr_at)


def _batches(lengths: list[int], batch: int, rng: random.Random) -> list[list[int]]:
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], rng.random()))
    bs = [order[s:s + batch] for s in range(0, len(order), batch)]
    rng.shuffle(bs)
    return bs


def _draft_rows(draft: Any, seqs: list[dict[str, Any]], teach: list[torch.Tensor], idx: list[int]
                ) -> tuple[torch.Tensor, torch.Tensor]:
    ids, mask = pad_batch(seqs, idx)
    h = draft.model(input_ids=ids, attention_mask=mask).last_hidden_state
    hd = torch.cat([h[r, seqs[i]["start"]:len(seqs[i]["ids"])] for r, i in enumerate(idx)])
    ht = torch.cat([teach[i] for i in idx]).to(hd.dtype)
    return hd, ht


def train_draft(cfg: DictConfig, target: Any, seqs: list[dict[str, Any]], teach: list[torch.Tensor],
                head_ids: Sequence[int] | None = None) -> tuple[Any, dict[str, Any]]:
    """Train the draft's decoder layers (and final norm) to match the teacher; return (draft, log).

    With ``head_ids`` the KL is over those vocabulary rows only (``distill.head=subset``).  With
    ``train.autocast=bfloat16`` the forward and backward passes run under CPU autocast (parameters and
    optimiser state stay float32)."""
    t, dc = cfg.train, cfg.distill
    rng = random.Random(int(cfg.seed) + 7)
    gen = torch.Generator().manual_seed(int(cfg.seed) + 8)
    idx_all = list(range(len(seqs)))
    rng.shuffle(idx_all)
    n_val = max(1, int(round(float(cfg.data.val_fraction) * len(seqs))))
    val, tr = idx_all[:n_val], idx_all[n_val:]
    tr = tr + [i for i in tr if seqs[i]["kind"] == "generation"] * (int(cfg.data.generation_repeat) - 1)
    init = list(cfg.draft.init_layers) if cfg.draft.init_layers is not None else None
    draft = dp.make_draft(target, int(cfg.draft.num_layers), init, seed=int(cfg.seed)).train()
    for name, p in draft.named_parameters():
        p.requires_grad_(name.startswith("model.layers.") or (bool(cfg.draft.train_final_norm)
                                                               and name == "model.norm.weight"))
    params = [p for p in draft.parameters() if p.requires_grad]
    head = target.get_output_embeddings().weight.detach()
    gram = centered_gram(head)
    kl_head = head if head_ids is None else head[torch.as_tensor(list(head_ids))].contiguous()
    autocast = t.get("autocast")
    autocast_dtype = getattr(torch, str(autocast)) if autocast else None
    if autocast_dtype is not None:  # CPU autocast does not take float16 inputs to cat/matmul
        teach = [x.float() for x in teach]

    def rows_and_loss(idx: list[int], sample_kl_rows: bool) -> tuple[torch.Tensor, dict[str, float], int]:
        """The loss on sequences ``idx``: the KL at every position, or (training) at a random
        ``distill.kl_fraction`` of them; also the loss's stats and the number of positions."""
        with torch.autocast("cpu", dtype=autocast_dtype or torch.bfloat16, enabled=autocast_dtype is not None):
            hd, ht = _draft_rows(draft, seqs, teach, idx)
            n = hd.shape[0]
            rows = torch.arange(n) if not sample_kl_rows else (
                torch.randperm(n, generator=gen)[: max(1, int(round(frac * n)))] if frac > 0
                else torch.empty(0, dtype=torch.long))
            loss, st = distill_loss(hd, ht, kl_head, gram, T, rows, w)
        return loss, st, n

    opt = torch.optim.AdamW(params, lr=float(t.lr), weight_decay=float(t.weight_decay), betas=(0.9, 0.98))
    steps = int(t.steps)
    sched = warmup_cosine(opt, steps, int(t.warmup), float(t.min_lr_ratio))
    T, frac, w = float(dc.temperature), float(dc.kl_fraction), float(dc.mse_weight)
    tr_lengths = [len(seqs[i]["ids"]) for i in tr]

    def evaluate_val() -> dict[str, float]:
        draft.eval()
        tot = {"kl": 0.0, "mse": 0.0, "top1": 0.0}
        n = 0
        with torch.no_grad():
            for s in range(0, len(val), int(t.batch_size)):
                _, st, rows = rows_and_loss(val[s:s + int(t.batch_size)], sample_kl_rows=False)
                for k in tot:
                    tot[k] += st[k] * rows
                n += rows
        draft.train()
        return {f"val_{k}": v / n for k, v in tot.items()}

    curve: list[dict[str, Any]] = [{"step": 0, **evaluate_val()}]
    tqdm.write(f"step 0: {curve[0]}")
    bar = tqdm(total=steps, desc="train draft", unit="step")
    step, ema, seen = 0, None, 0
    while step < steps:
        for bi in _batches(tr_lengths, int(t.batch_size), rng):
            if step >= steps:
                break
            loss, st, n = rows_and_loss([tr[i] for i in bi], sample_kl_rows=True)
            opt.zero_grad(set_to_none=True)
            loss.float().backward()
            gn = torch.nn.utils.clip_grad_norm_(params, float(t.grad_clip))
            opt.step()
            sched.step()
            step += 1
            seen += n
            lv = loss.item()
            ema = lv if ema is None else 0.95 * ema + 0.05 * lv
            bar.update(1)
            bar.set_postfix(loss=f"{ema:.3f}", kl=f"{st.get('kl', 0):.2f}", top1=f"{st.get('top1', 0):.2f}",
                            gn=f"{float(gn):.2f}")
            if step % int(t.val_every) == 0 or step == steps:
                row = {"step": step, "train_loss_ema": ema, "positions_seen": seen, **evaluate_val()}
                curve.append(row)
                tqdm.write(f"step {step}: " + ", ".join(f"{k}={v:.4g}" for k, v in row.items() if k != "step"))
    bar.close()
    return draft.eval(), {"curve": curve, "train_sequences": len(tr), "val_sequences": len(val),
                          "positions_seen": seen, "trainable_parameters": sum(p.numel() for p in params)}
