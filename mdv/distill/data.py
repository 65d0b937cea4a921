"""The distillation text (recipe steps 1-2): prompts from the pinned offline assets, a seeded held-out split, chat
formatting, and the target's own generations (batched, cached per chunk) with reference answers and raw code.
"""
from __future__ import annotations

import copy
import gzip
import hashlib
import json
import random
import re
import time
import tomllib
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig
from tqdm.auto import tqdm

from mdv import assets
from mdv.models import default_pair as dp


SOURCES = ("humaneval", "alpaca", "gsm")
#: The target's generations shipped in ``mdv/assets_data`` (:func:`pack_generations`; both recipes read them).
SHIPPED_GENERATIONS = "smollm2-135m-instruct-generations.json.gz"


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


def cache_key(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


@torch.no_grad()
def batched_generate(model: Any, tok: Any, prompts: list[list[int]], max_new_tokens: int, temperature: float,
                     top_p: float, batch_size: int, seed: int, desc: str, cache: Path | None = None,
                     used: list[str] | None = None) -> tuple[list[list[int]], float]:
    """The target's continuations of ``prompts`` and the seconds spent computing them.

    Chunks of ``batch_size`` prompts, in order, are left-padded and decoded with the KV cache (greedy
    at T=0, else sampled with the chunk's seed), in the model's own dtype; each continuation is cut
    after its first end-of-sequence token.  With ``cache``, each chunk is stored under a key of its
    prompts, settings, seed and (when not float32) dtype, so a run with more prompts reuses the chunks
    it shares with an earlier run; ``used`` receives the chunks' keys (what :func:`pack_generations` ships).
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
        key = cache_key(spec)
        if used is not None:
            used.append(key)
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
    chunks: list[str] = []
    for k in range(int(g.samples_per_prompt)):
        # sample k > 0 draws with another seed; sample 0 keeps the seed (and cache keys) of one-sample runs
        conts, sample_secs = batched_generate(
            gen_model, tok, prompts, int(g.max_new_tokens), float(g.temperature), float(g.top_p),
            int(g.batch_size), seed + 7919 * k, desc=f"target generations (sample {k + 1})", cache=cache,
            used=chunks)
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
    info["generation_chunks"] = chunks
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


def pack_generations(keys: list[str], cache: Path, asset: Path) -> str:
    """Ship the generation chunks ``keys`` of ``cache`` as one gzip JSON ``asset`` ({key: chunk}); its
    sha256 goes to ``<asset>.sha256``.  Keys hash the target file, prompts, settings and seed, so a chunk
    is only ever reused for exactly the generation it was made by.  -> the sha256."""
    body = {k: json.loads((cache / f"gen-{k}.json").read_text()) for k in keys}
    data = gzip.compress(json.dumps(body, sort_keys=True, separators=(",", ":")).encode(), mtime=0)
    asset.write_bytes(data)
    digest = hashlib.sha256(data).hexdigest()
    asset.with_name(asset.name + ".sha256").write_text(f"{digest}  {asset.name}\n")
    return digest


def unpack_generations(asset: Path, cache: Path) -> int:
    """Seed ``cache`` with the shipped generation chunks of ``asset`` (those not cached yet), after checking
    its sha256 against ``<asset>.sha256``; -> chunks written.  No asset: 0 (the recipe generates)."""
    from mdv.errors import MissingAssetError

    sums = asset.with_name(asset.name + ".sha256")
    if not asset.is_file():
        return 0
    data = asset.read_bytes()
    want = sums.read_text().split()[0] if sums.is_file() else None
    if hashlib.sha256(data).hexdigest() != want:
        raise MissingAssetError(f"{asset} does not match its sha256 ({sums.name}); restore both from git, or delete"
                                " them to let the recipe regenerate the target's text")
    written = 0
    cache.mkdir(parents=True, exist_ok=True)
    for key, chunk in json.loads(gzip.decompress(data)).items():
        path = cache / f"gen-{key}.json"
        if not path.is_file():
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(chunk))
            tmp.replace(path)  # atomic: a concurrent reader sees a whole chunk or none
            written += 1
    return written


def pad_batch(seqs: list[dict[str, Any]], idx: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    n = max(len(seqs[i]["ids"]) for i in idx)
    ids = torch.zeros((len(idx), n), dtype=torch.long)
    mask = torch.zeros((len(idx), n), dtype=torch.long)
    for r, i in enumerate(idx):
        L = len(seqs[i]["ids"])
        ids[r, :L] = torch.tensor(seqs[i]["ids"])
        mask[r, :L] = 1
    return ids, mask
