"""The ``pass_limit`` benchmark: how far the target's forward pass is from its physical limit on this machine.

A pass over n new tokens reads every weight once and does about ``n · F`` floating-point operations,
``F = 2 · (weights of every linear layer, the output head included)`` per token (attention over the
cached context adds ``4 · layers · hidden · context`` per token, small at the contexts timed here and
left out: the limit is a lower bound).  It cannot take less than

    limit(n) = max(W / B, n · F / P)

with W the bytes of those weights, B the machine's memory read bandwidth and P its peak GEMM rate, both
measured here in the same run and at the same thread count (B: ``sum`` over a buffer far larger than the
caches; P: a large square float32 matrix product).  The benchmark times the engine's cached pass
(``HFSession.extend`` of n tokens after ``context`` cached ones) for each n and thread count and reports
``time / limit``; it also checks the cached pass's probabilities against a fresh full forward pass.

With ``packed: true`` every n is also timed with the target's linears on MKL packs made for
``rung_for(n, pack_rungs)`` rows (n itself, or the next rung up with zero rows padded; :mod:`mdv.models.packed`;
one pack at a time, built before and freed after that n's timings),
alternating with the plain pass in the same loop, and that pass's p is checked against the plain one.
With ``panels: true`` the same for the linears on 16-column weight panels (:mod:`mdv.models.panels`: one
pack for every n, as many bytes as the weights), and both float32 full passes are compared with a float64
one, which shows how far float32 rounding alone moves p.  With ``lean: true`` the same for the pass on
mdv's lean decoder forward (:mod:`mdv.models.lean`: no transformers modules per layer, a preallocated cache),
its linears on the panels when ``panels`` is true, else plain.  ``lean_compare`` (panels and lean) times the
lean pass with one thing changed as well, interleaved with it, so each ratio comes from one run:
``avx2_kernel`` forces the AVX2 panel kernel (the default is AVX-512 where the CPU has it;
:func:`mdv.models.panels.panel_isa`), ``small_pages`` runs a second pack of the panels on 4 KiB pages
(:mod:`mdv.models.hugepages`; its own lean session, so neither variant rebuilds the C layers' plan),
``per_query_attention`` runs the C layers' attention one query at a time
(:func:`mdv.models.lean_layer.forced_attention`; the default tiles it into panel products from 40 queries per
key/value head on).
"""
from __future__ import annotations

import contextlib
import copy
import time
from contextlib import nullcontext
from functools import partial
from typing import Any, Callable, Optional

import torch

from mdv.bench.config import LEAN_COMPARISONS, PassLimitBench, TinyPair
from mdv.bench.pairs import target_for, torch_device
from mdv.bench.records import bench_record, goal_record, print_goals, print_table, range_text
from mdv.bench.timing import ratios_of, spread, sync_for, time_call
from mdv.models.hugepages import huge_page_empty, transparent_huge_pages_mode
from mdv.models.lean import LeanModel
from mdv.models.lean_layer import forced_attention
from mdv.models.packed import LinearPacks, rung_for
from mdv.models.panels import PanelPacks, forced_panel_isa, panel_isa


def linear_weights(model: torch.nn.Module) -> list[torch.Tensor]:
    """The distinct weight matrices of every ``nn.Linear`` of ``model`` (a tied output head counted once)."""
    seen: dict[int, torch.Tensor] = {}
    for mod in model.modules():
        if isinstance(mod, torch.nn.Linear):
            seen.setdefault(id(mod.weight), mod.weight)
    return list(seen.values())


def read_bandwidth(megabytes: int, repeats: int) -> list[float]:
    """Memory read bandwidth in GB/s, one figure per repeat: ``sum`` over a ``megabytes`` float32 buffer on
    transparent huge pages, as the panels are (:mod:`mdv.models.hugepages`; on 4 KiB pages the same sum reads
    ~25% slower on this project's CI machine, so the limit would be looser)."""
    x = huge_page_empty((megabytes * (1 << 20) // 4,), torch.float32)
    x.fill_(1.0)  # touch every page first
    return [x.numel() * 4 / time_call(x.sum) / 1e9 for _ in range(repeats)]


def gemm_rate(size: int, repeats: int) -> list[float]:
    """Peak float32 GEMM rate in GFLOP/s, one figure per repeat: a [size x size] · [size x size] product."""
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(size, size, generator=gen)
    b = torch.randn(size, size, generator=gen)
    a @ b  # warm-up: thread pool, packing buffers
    return [2 * size ** 3 / time_call(lambda: a @ b) / 1e9 for _ in range(repeats)]


class _Both:
    """``with`` a reusable context (the panels, entered every repeat) and a fresh one from ``make`` inside it."""

    def __init__(self, ctx: Any, make: Callable[[], Any]) -> None:
        self.ctx, self.make = ctx, make

    def __enter__(self) -> "_Both":
        self._stack = contextlib.ExitStack()
        self._stack.enter_context(self.ctx)
        self._stack.enter_context(self.make())
        return self

    def __exit__(self, *exc: Any) -> Any:
        return self._stack.__exit__(*exc)


def run_pass_limit(cfg: PassLimitBench, target: Any = None, tiny: TinyPair | None = None,
                   device: Optional[str] = None, dtype: str = "float32") -> dict[str, Any]:
    """The ``pass_limit`` benchmark (module docstring)."""
    t_start = time.perf_counter()
    dev = torch_device(device)
    target = target_for("pass_limit", cfg, target, tiny, dev, dtype)
    if isinstance(target, dict):  # the default target's file is absent: the skipped record
        return target
    sync = sync_for(dev)
    weights = linear_weights(target.model)
    weight_bytes = sum(w.numel() * w.element_size() for w in weights)
    flops_per_token = 2 * sum(w.numel() for w in weights)
    gen = torch.Generator().manual_seed(cfg.seed)
    n_max = max(cfg.n)
    tokens = torch.randint(0, target.vocab_size, (cfg.context + n_max,), generator=gen).tolist()
    threads_before = torch.get_num_threads()
    per_threads: list[dict[str, Any]] = []
    panels = PanelPacks(target.model) if cfg.panels else None  # one pack serves every n and thread count
    compare = list(cfg.lean_compare)
    small_pages = PanelPacks(target.model, huge_pages=False) if "small_pages" in compare else None
    lean_target = LeanModel.of(target) if cfg.lean else None  # checks the model can run lean, before timing
    try:
        for t in cfg.threads:
            torch.set_num_threads(int(t))
            bw = read_bandwidth(cfg.bandwidth_megabytes, cfg.repeats)
            peak = gemm_rate(cfg.gemm_size, cfg.repeats)
            bw_med, peak_med = spread(bw)["median"], spread(peak)["median"]
            rows = []
            s = target.new_session()
            lean_s = lean_target.new_session() if lean_target is not None else None
            small_s = lean_target.new_session() if small_pages is not None else None
            with torch.inference_mode():
                s.prefill(tokens[:cfg.context])
                if lean_s is not None:
                    with panels if panels is not None else nullcontext():
                        lean_s.prefill(tokens[:cfg.context])
                if small_s is not None:
                    with small_pages:
                        small_s.prefill(tokens[:cfg.context])
                for n in cfg.n:
                    new = torch.tensor([tokens[cfg.context:cfg.context + n]], device=dev)  # [1, n]

                    def one_pass(new: torch.Tensor = new, session: Any = s) -> torch.Tensor:
                        logits = session.extend(new)
                        session.crop(cfg.context)
                        return logits

                    # the variants timed beside the plain pass, alternating with it so load drift hits all alike:
                    # name -> (the with-block its linears need, its pass)
                    variants: dict[str, tuple[Any, Callable[[], torch.Tensor]]] = {}
                    if cfg.packed:
                        variants["packed"] = (LinearPacks(target.model, [rung_for(n, cfg.pack_rungs)]), one_pass)
                    if panels is not None:
                        variants["panels"] = (panels, one_pass)
                    if lean_s is not None:
                        variants["lean"] = (panels if panels is not None else nullcontext(),
                                            partial(one_pass, new, lean_s))
                    if "avx2_kernel" in compare:  # the same lean pass on the AVX2 panel kernel
                        variants["lean_avx2_kernel"] = (_Both(panels, partial(forced_panel_isa, "avx2")),
                                                        partial(one_pass, new, lean_s))
                    if "per_query_attention" in compare:  # the same lean pass, attention one query at a time
                        variants["lean_per_query_attention"] = (_Both(panels, partial(forced_attention, "per_query")),
                                                                partial(one_pass, new, lean_s))
                    if small_s is not None:  # the same lean pass on panels on 4 KiB pages
                        variants["lean_small_pages"] = (small_pages, partial(one_pass, new, small_s))
                    for _ in range(cfg.warmup):
                        one_pass()
                        for ctx, fn in variants.values():
                            with ctx:
                                fn()
                    ms: list[float] = []
                    variant_ms: dict[str, list[float]] = {v: [] for v in variants}
                    for _ in range(cfg.repeats):
                        ms.append(1e3 * time_call(one_pass, sync))
                        for v, (ctx, fn) in variants.items():
                            with ctx:
                                variant_ms[v].append(1e3 * time_call(fn, sync))
                    limit_ms = 1e3 * max(weight_bytes / (bw_med * 1e9), n * flops_per_token / (peak_med * 1e9))
                    row = {"n": n, "ms": spread(ms), "limit_ms": limit_ms,
                           "bound": "bandwidth" if weight_bytes / bw_med >= n * flops_per_token / peak_med
                           else "compute",
                           "vs_limit": spread([m / limit_ms for m in ms])}
                    if variants:
                        plain_p = torch.softmax(one_pass()[0].double(), -1)
                    for v, (ctx, fn) in variants.items():
                        with ctx:
                            got_p = torch.softmax(fn()[0].double(), -1)
                        row.update({f"{v}_ms": spread(variant_ms[v]),
                                    f"{v}_vs_limit": spread([m / limit_ms for m in variant_ms[v]]),
                                    f"{v}_vs_plain": spread(ratios_of(variant_ms[v], ms)),
                                    f"{v}_abs_prob_diff": float((got_p - plain_p).abs().max())})
                    for c in compare:  # lean / lean with that one change, call by call
                        row[f"lean_vs_lean_{c}"] = spread(ratios_of(variant_ms["lean"], variant_ms[f"lean_{c}"]))
                    if "packed" in variants:
                        packs = variants["packed"][0]
                        row.update({"pack_rows": packs.sizes[0], "pack_bytes": packs.pack_bytes,
                                    "pack_seconds": packs.pack_seconds})
                        packs.free()
                    rows.append(row)
            per_threads.append({"threads": int(t), "read_GBps": spread(bw), "gemm_GFLOPs": spread(peak), "passes": rows})
    finally:
        torch.set_num_threads(threads_before)
    # the cached pass's law against a fresh full forward pass over the same tokens (and, with panels, both
    # float32 passes against a float64 one: how far float32 rounding alone moves p)
    with torch.inference_mode():
        s = target.new_session()
        s.prefill(tokens[:cfg.context])
        cached = torch.softmax(s.extend(torch.tensor([tokens[cfg.context:cfg.context + n_max]], device=dev))[0].double(), -1)
        full = torch.softmax(target.forward(torch.tensor([tokens[:cfg.context + n_max]]))[0, cfg.context:].double(), -1)
        if panels is not None:
            ids = torch.tensor([tokens[:cfg.context + n_max]])
            with panels:
                full_panels = torch.softmax(target.forward(ids)[0, cfg.context:].double(), -1)
            panels.free()
            if small_pages is not None:
                small_pages.free()
            model64 = copy.deepcopy(target.model).double()
            full64 = torch.softmax(model64(ids.to(dev)).logits[0, cfg.context:].double(), -1)
            del model64
    prob_diff = float((cached - full).abs().max())
    res = {"context": cfg.context, "weight_bytes": weight_bytes, "flops_per_token": flops_per_token,
           "per_threads": per_threads, "max_abs_prob_diff_cached_vs_full": prob_diff}
    if panels is not None:
        res["max_abs_prob_diff_plain_vs_float64"] = float((full - full64).abs().max())
        res["max_abs_prob_diff_panels_vs_float64"] = float((full_panels - full64).abs().max())
        res["panel_pack_bytes"], res["panel_pack_seconds"] = panels.pack_bytes, panels.pack_seconds
        res["panel_isa"] = panel_isa()  # the kernel the panels and lean columns ran (lean_avx2_kernel: forced AVX2)
        res["transparent_huge_pages"] = transparent_huge_pages_mode()  # the OS policy the panels' arena asked under
    packed, paneled, lean = bool(cfg.packed), panels is not None, lean_target is not None
    for entry in per_threads:
        print_table(f"target pass vs its limit, {entry['threads']} thread(s): read bandwidth"
                    f" {range_text(entry['read_GBps'])} GB/s, GEMM {range_text(entry['gemm_GFLOPs'])} GFLOP/s;"
                    f" {weight_bytes / 1e6:.0f} MB of linear weights, {flops_per_token / 1e9:.3g} GFLOP per token,"
                    f" {cfg.context} cached tokens ({target.name})"
                    + ("; packed = linears on MKL packs for the pack rows (n padded up to them)" if packed else "")
                    + ("; panels = linears on 16-column weight panels (mdv.models.panels)" if paneled else "")
                    + (f"; lean = mdv's lean decoder forward (mdv.models.lean), linears {'on panels' if paneled else 'plain'}"
                       if lean else "")
                    + (f"; panel kernel {res['panel_isa']}, panels on huge pages (the OS's policy:"
                       f" {res['transparent_huge_pages']})" if paneled else "")
                    + "".join(f"; lean {c} = the lean pass with {LEAN_COMPARISONS[c]}" for c in compare),
                    ["n new tokens", "ms", "limit ms", "bound", "x limit"]
                    + (["pack rows", "packed ms", "packed x limit", "packed / plain", "pack MB"] if packed else [])
                    + (["panels ms", "panels x limit", "panels / plain"] if paneled else [])
                    + (["lean ms", "lean x limit", "lean / plain"] if lean else [])
                    + [h for c in compare for h in (f"lean {c} ms", f"lean {c} x limit", f"lean / lean {c}")],
                    [[r["n"], range_text(r["ms"]), f"{r['limit_ms']:.3g}", r["bound"], range_text(r["vs_limit"])]
                     + ([r["pack_rows"], range_text(r["packed_ms"]), range_text(r["packed_vs_limit"]), range_text(r["packed_vs_plain"]),
                         f"{r['pack_bytes'] / 1e6:.0f}"] if packed else [])
                     + ([range_text(r["panels_ms"]), range_text(r["panels_vs_limit"]), range_text(r["panels_vs_plain"])]
                        if paneled else [])
                     + ([range_text(r["lean_ms"]), range_text(r["lean_vs_limit"]), range_text(r["lean_vs_plain"])]
                        if lean else [])
                     + [range_text(r[key]) for c in compare
                        for key in (f"lean_{c}_ms", f"lean_{c}_vs_limit", f"lean_vs_lean_{c}")]
                     for r in entry["passes"]])
    print(f"  cached pass vs a fresh full pass: max |p diff| = {prob_diff:.3g}", flush=True)
    if paneled:
        print(f"  full pass in float32 vs float64: max |p diff| = {res['max_abs_prob_diff_plain_vs_float64']:.3g} plain,"
              f" {res['max_abs_prob_diff_panels_vs_float64']:.3g} on panels ({res['panel_pack_bytes'] / 1e6:.0f} MB of panels,"
              f" packed in {res['panel_pack_seconds']:.2g} s)", flush=True)
    goals = [goal_record(f"{e['threads']} thread(s), n={r['n']}: pass <= {cfg.goal_ratio:g}x its limit",
                         r["vs_limit"]["median"], cfg.goal_ratio) for e in per_threads for r in e["passes"]]
    goals.append(goal_record("cached pass p equal to a fresh full pass (max abs difference)", prob_diff, cfg.goal_prob_diff))
    for v in (["packed"] if packed else []) + (["panels"] if paneled else []) + (["lean"] if lean else []) + [f"lean_{c}" for c in compare]:
        if v.removeprefix("lean_") not in compare:  # a comparison: its p is checked, its speed is a column, not a goal
            goals += [goal_record(f"{e['threads']} thread(s), n={r['n']}: {v} pass <= {cfg.goal_ratio:g}x its limit",
                                  r[f"{v}_vs_limit"]["median"], cfg.goal_ratio) for e in per_threads for r in e["passes"]]
        res[f"max_abs_prob_diff_{v}_vs_plain"] = max(r[f"{v}_abs_prob_diff"] for e in per_threads for r in e["passes"])
        goals.append(goal_record(f"{v} pass p equal to the plain pass (max abs difference)",
                                 res[f"max_abs_prob_diff_{v}_vs_plain"], cfg.goal_prob_diff))
    print_goals(goals)
    return bench_record("pass_limit", cfg, str(dev), str(target.dtype).removeprefix("torch."), res,
                        {"target": target.name}, goals, wall_seconds=time.perf_counter() - t_start)
