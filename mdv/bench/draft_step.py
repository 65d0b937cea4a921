"""The ``draft_step`` benchmark: one iteration's drafting (K blocks of L tokens) with the draft model's
panels in each weight dtype, side by side, against the weight stream's limit.

A drafting iteration (:func:`mdv.drafters.model.draft_blocks`, what the engine's ``model`` drafter runs) feeds
the pending token, forks into K rows and takes L - 1 more cached steps, sampling from the float64 law q at
each.  Every step reads the draft's panel weights once (K <= 6 rows share one read, ``kernels/panel_linear.c``),
so the iteration cannot take less than

    limit = L · (panel bytes) / B

with B the read bandwidth measured in the same run (:func:`mdv.bench.pass_limit.read_bandwidth`).  Every
timed call follows a :class:`~mdv.bench.timing.CacheEvictor` pass, as a drafting iteration follows a target
pass that streamed 538 MB through the caches; the dtypes alternate in an order rotated every repeat, on the
lean forward (:mod:`mdv.models.lean`, whose layers run in C on the panels).

float16 and int8 panels (:func:`mdv.models.panels.pack_panels`) round the draft's weights, so they change its
law; every method stays lossless (q is recorded from what the draft computes), but block efficiency can move.
The benchmark reports how far: the total variation between each dtype's next-token law and the float32
panels' one, at ``law_positions`` positions of one context (T = 1, before any sampling transform).
"""
from __future__ import annotations

import time
from typing import Any

import torch

from mdv.bench.config import DraftStepBench, TinyPair, check_draft_step
from mdv.bench.pairs import pair_for
from mdv.bench.pass_limit import read_bandwidth
from mdv.bench.records import bench_record, print_table, range_text
from mdv.bench.timing import CacheEvictor, ratios_of, rotated, spread, time_call
from mdv.models.lean import LeanModel
from mdv.models.panels import PanelPacks
from mdv.models.sampling import SamplingConfig


def run_draft_step(cfg: DraftStepBench, pair: tuple[Any, Any, Any] | None = None,
                   tiny: TinyPair | None = None) -> dict[str, Any]:
    """The ``draft_step`` benchmark (module docstring).  ``pair``: (target, draft, tokenizer), else loaded on
    the CPU (weight panels are a CPU path, also on a machine with a GPU)."""
    from mdv.drafters.model import draft_blocks

    check_draft_step(cfg)
    t_start = time.perf_counter()
    dev = torch.device("cpu")
    pair = pair_for("draft_step", cfg, pair, tiny, dev, "float32")
    if isinstance(pair, dict):  # the pair's files are absent: the skipped record
        return pair
    _, draft, _ = pair
    lean = LeanModel.of(draft)  # one clear error for a draft the lean forward cannot run
    packs = {d: PanelPacks(draft.model, dtype=getattr(torch, d)) for d in cfg.dtypes}
    gen = torch.Generator().manual_seed(cfg.seed)
    context = torch.randint(0, draft.vocab_size, (cfg.context + cfg.law_positions,), generator=gen).tolist()
    sampling = SamplingConfig(temperature=cfg.temperature)
    untempered = SamplingConfig()  # T = 1: the draft's own law, where the roundings are compared
    ref = cfg.dtypes[0]  # the ratios' denominator
    evict = CacheEvictor()
    bandwidth = read_bandwidth(cfg.bandwidth_megabytes, cfg.repeats)
    bw = spread(bandwidth)["median"]
    try:
        # each dtype's next-token law at law_positions positions, against float32 panels' (T = 1)
        laws: dict[str, torch.Tensor] = {}
        for d, p in packs.items():
            with p, torch.inference_mode():
                s = lean.new_session()
                s.prefill(context[:cfg.context])
                tail = torch.tensor([context[cfg.context:]])  # [1, law_positions]
                laws[d] = untempered.probs(s.extend(tail)[0])  # [law_positions, V] float64
        base = laws.get("float32")
        rows: list[dict[str, Any]] = []
        for K in cfg.K:
            sessions = {}
            for d, p in packs.items():
                with p, torch.inference_mode():
                    s = lean.new_session()
                    s.prefill(context[:cfg.context])
                    sessions[d] = s
            seq = context[:cfg.context + 1]  # one pending token, as after a verification

            def block(d: str, K: int = int(K)) -> None:
                with packs[d], torch.inference_mode():
                    draft_blocks(sessions[d], seq, K, cfg.L, sampling, gen)

            def reset(d: str) -> None:
                sessions[d].keep(0)
                sessions[d].crop(cfg.context)

            for _ in range(cfg.warmup):
                for d in packs:
                    block(d)
                    reset(d)
            ms: dict[str, list[float]] = {d: [] for d in packs}
            for r in range(cfg.repeats):
                for d in rotated(list(packs), r):
                    evict()
                    ms[d].append(1e3 * time_call(lambda d=d: block(d)))
                    reset(d)
            for d, p in packs.items():
                limit_ms = 1e3 * cfg.L * p.pack_bytes / (bw * 1e9)
                row = {"dtype": d, "K": int(K), "L": cfg.L, "ms": spread(ms[d]), "pack_bytes": p.pack_bytes,
                       "limit_ms": limit_ms, "vs_limit": spread([m / limit_ms for m in ms[d]]),
                       f"vs_{ref}": spread(ratios_of(ms[d], ms[ref]))}
                if base is not None:
                    tv = 0.5 * (laws[d] - base).abs().sum(-1)  # [law_positions]
                    row["law_tv_vs_float32"] = {"mean": float(tv.mean()), "max": float(tv.max())}
                rows.append(row)
    finally:
        for p in packs.values():
            p.free()
    print_table(f"draft step: {cfg.L} cached draft steps for K rows (draft_blocks) after {cfg.context} tokens, each"
                f" call after a cache eviction, dtypes interleaved; read bandwidth {range_text(spread(bandwidth))} GB/s;"
                f" limit = L x panel bytes / bandwidth ({draft.name})",
                ["dtype", "K", "ms", "limit ms", "x limit", f"/ {ref}", "panel MB", "law TV vs float32 (mean, max)"],
                [[r["dtype"], r["K"], range_text(r["ms"]), f"{r['limit_ms']:.3g}", range_text(r["vs_limit"]),
                  range_text(r[f"vs_{ref}"]), f"{r['pack_bytes'] / 1e6:.1f}",
                  (f"{r['law_tv_vs_float32']['mean']:.2g}, {r['law_tv_vs_float32']['max']:.2g}"
                   if "law_tv_vs_float32" in r else "-")] for r in rows])
    res = {"context": cfg.context, "read_GBps": spread(bandwidth), "rows": rows}
    return bench_record("draft_step", cfg, str(dev), "float32", res, {"draft": draft.name}, [],
                        wall_seconds=time.perf_counter() - t_start)
