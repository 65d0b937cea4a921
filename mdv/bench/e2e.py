"""The ``e2e`` benchmark: AR and every method on a model pair over prompts from :mod:`mdv.data`: tokens/s,
speedup over AR, block efficiency and the draft / target / verify time split.

With ``packed: true`` every cell (AR included) also runs with the target's linears on MKL packs
(:mod:`mdv.models.packed`), interleaved with the plain cells; a packed cell's speedup is over packed AR,
so both sides of every ratio run the same target code.  A cell's packs serve its largest target pass
(AR: 1 row; K = 1 or rows: K·(L + 1); a token tree: K·L + 1 nodes), rounded up to the smallest of
``pack_rungs`` at or above it; smaller passes are padded to that size.  The packs of the last
``pack_cache`` sizes are kept (each holds ~5x the target's weights), older ones are freed and rebuilt
when needed, outside the timed generation.  Drafters that run the target's own modules (``layerskip``'s
layers, ``eagle``'s head) run them on the packs too, their K-row steps padded up to the cell's size.

With ``panels: true`` every cell also runs with the target's and the draft model's linears on 16-column
weight panels (:mod:`mdv.models.panels`; one pack each, as many bytes as the weights, serves every pass),
speedup over AR on panels (AR runs the same target code; the draft model's subset head is on panels too).

``draft_panel_dtype: float16`` holds the draft's panels in float16 (half its bytes per step), ``int8`` in int8
with a scale per output column (a quarter; :func:`mdv.models.panels.pack_panels`); the draft's law is whatever
it computes and q stays exact, so every method stays lossless; the target's panels stay float32.

With ``lean: true`` every cell also runs on mdv's lean decoder forward (:mod:`mdv.models.lean`) for the target
and the draft model: variant ``lean`` with plain linears, or ``lean+panels`` on the panels when ``panels`` is
true; its speedup is over AR on the same code.

``variants`` names the code of every cell exactly instead (e.g. ``[lean+panels]``: mdv's fast path alone,
without the plain cells and their "x / plain speed" columns).
"""
from __future__ import annotations

import math
import statistics
import sys
import time
from contextlib import nullcontext
from typing import Any, Callable, Optional, Sequence

from mdv.bench.config import E2EBench, TinyPair, e2e_needs, e2e_variants
from mdv.bench.pairs import pair_for, pair_identity, prompt_ids, torch_device
from mdv.bench.records import bench_record, fmt_number, goal_record, print_goals, print_table, range_text
from mdv.bench.timing import ratios_of, rotated, spread
from mdv.errors import InvalidInputError
from mdv.models.packed import PacksTogether, rung_for




# ====================================================================================== e2e
#: (method, K, L, drafter, variant): the target code, "plain", "packed" (MKL packs), "panels" (weight panels),
#: "lean" (the lean forward) or "lean+panels" (the lean forward on the panels)
Cell = tuple[str, Optional[int], Optional[int], Optional[str], str]


def variant_linears(variant: str) -> str:
    """The linears a variant runs on: "plain", "packed" or "panels"."""
    return "panels" if variant.endswith("panels") else "packed" if variant == "packed" else "plain"


def variant_forward(variant: str) -> str:
    """The decoder forward a variant runs: "lean" (mdv.models.lean) or "hf" (transformers')."""
    return "lean" if variant.startswith("lean") else "hf"


def _e2e_cells(cfg: E2EBench) -> list[Cell]:
    """(method, K, L, drafter, variant) in run order: AR first (no K, L or drafter), then every drafter x
    method; every cell on each of :func:`~mdv.bench.config.e2e_variants` (plain, then packed, panels, lean)."""
    from mdv.verify.registry import VERIFIERS

    plain: list[tuple[str, int | None, int | None, str | None]] = [("ar", None, None, None)]
    for d in cfg.drafters:
        for m in cfg.methods:
            for K in (cfg.K if VERIFIERS[m].multi_draft else [1]):
                for L in cfg.L:
                    if (m, K, L, d) not in plain:
                        plain.append((m, K, L, d))
    variants = e2e_variants(cfg)
    return [(*c, v) for c in plain for v in variants]


def check_draft_panel_dtype(name: str, panels: bool) -> Any:
    """The torch dtype of ``e2e.draft_panel_dtype`` (:data:`~mdv.sweep.config.DRAFT_PANEL_DTYPES`), or one
    clear error (also when float16 or int8 is asked for without panels, where it would change nothing)."""
    import torch

    from mdv.sweep.config import DRAFT_PANEL_DTYPES

    if name not in DRAFT_PANEL_DTYPES:
        raise InvalidInputError(f"e2e.draft_panel_dtype must be one of {', '.join(DRAFT_PANEL_DTYPES)}; got {name!r}")
    if name != "float32" and not panels:
        raise InvalidInputError(f"e2e.draft_panel_dtype={name} holds the draft's panels in {name}: set e2e.panels=true")
    return getattr(torch, name)


def pack_size(cell: Cell, tree: bool, rungs: Sequence[int]) -> int:
    """The rows a cell's packs are made for (module docstring): its largest target pass, rounded up to the
    smallest rung at or above it.  ``tree``: the target scores K > 1 drafts as one token tree."""
    m, K, L, _, _ = cell
    if m == "ar":
        rows = 1
    else:
        K, L = K or 1, L or 1
        rows = K * L + 1 if K > 1 and tree else K * (L + 1)
    return rung_for(rows, rungs)


class PackCache:
    """LinearPacks of one model by size, the ``keep`` most recently used ones kept."""

    def __init__(self, model: Any, keep: int):
        self.model, self.keep = model, keep
        self._packs: dict[int, Any] = {}

    def get(self, size: int) -> Any:
        from mdv.models.packed import LinearPacks

        packs = self._packs.pop(size, None)
        if packs is None:
            while len(self._packs) >= self.keep:  # free the oldest before building: peak memory stays keep packs
                self._packs.pop(next(iter(self._packs))).free()
            packs = LinearPacks(self.model, [size])
        self._packs[size] = packs  # most recent last
        return packs

    def free(self) -> None:
        for packs in self._packs.values():
            packs.free()
        self._packs.clear()


def _linears_note(row: dict[str, Any]) -> str:
    variant = row.get("variant", row.get("linears", "plain"))
    return "" if variant == "plain" else f", {variant}"


def interleaved_generations(cells: Sequence[Any], prompts: Sequence[list[int]],
                            run_cell: Callable[[Any, int, list[int]], dict[str, Any]]) -> dict[Any, list[dict[str, Any]]]:
    """Every cell on every prompt, prompt by prompt, the cell order rotated by one per prompt (so machine
    load drifts hit every cell alike).  run_cell(cell, i, prompt_ids) -> the generation's stats.
    -> cell -> stats per prompt, in prompt order (prompt 0 is the warm-up the callers leave out of timings)."""
    stats: dict[Any, list[dict[str, Any]]] = {c: [] for c in cells}
    for i, ids in enumerate(prompts):
        for cell in rotated(cells, i):
            stats[cell].append(run_cell(cell, i, ids))
    return stats


def run_e2e(cfg: E2EBench, pair: tuple[Any, Any, Any] | None = None, tiny: TinyPair | None = None,
            device: Optional[str] = None, dtype: str = "float32") -> dict[str, Any]:
    """The ``e2e`` benchmark.  ``pair``: (target, draft, tokenizer) HFModels, else loaded from ``cfg.pair``."""
    from mdv.engine import generate

    t_start = time.perf_counter()
    dev = torch_device(device)
    pair = pair_for("e2e", cfg, pair, tiny, dev, dtype)
    if isinstance(pair, dict):  # the pair's files are absent: the skipped record
        return pair
    target, draft, tok = pair
    from mdv.drafters.registry import get_drafter

    for d in cfg.drafters:  # a drafter that cannot run on this pair fails here, before any generation
        get_drafter(d, **dict(cfg.drafter_options.get(d) or {})).bind(target, draft)
    on_packs, on_panels, on_lean, with_plain = (e2e_needs(cfg, w) for w in ("packed", "panels", "lean", "plain"))
    if on_packs or on_panels:  # float32 on the CPU (and MKL for the packs), or one clear error now
        from mdv.models.packed import check_packable, float32_cpu_linears

        (check_packable if on_packs else float32_cpu_linears)(target.model)
    draft_panel_dtype = check_draft_panel_dtype(cfg.draft_panel_dtype, on_panels)
    prompts, label = prompt_ids(tok, cfg.datasets, cfg.n_prompts, cfg.seed)
    cells = _e2e_cells(cfg)
    results: list[dict[str, Any]] = []
    from tqdm import tqdm

    from mdv.models.session import tree_capable

    tree = tree_capable(target.new_session())
    packs = PackCache(target.model, cfg.pack_cache) if on_packs else None
    panels: Any = None
    if on_panels:  # one pack of the target and one of the draft serve every cell (the kernel compiles, or fails, here)
        from mdv.models.panels import PanelPacks

        panels = PacksTogether(PanelPacks(target.model), PanelPacks(draft.model, dtype=draft_panel_dtype))
    lean_pair: tuple[Any, Any] | None = None
    if on_lean:  # both models must run lean (Llama-like decoders), or one clear error now
        from mdv.models.lean import LeanModel

        lean_pair = (LeanModel.of(target), LeanModel.of(draft))
    bar = tqdm(total=len(cfg.temperatures) * len(prompts) * len(cells), desc="e2e generations", unit="gen",
               dynamic_ncols=True, file=sys.stderr)
    try:
        for T in cfg.temperatures:
            def run_cell(cell: Cell, i: int, ids: list[int], T: float = T) -> dict[str, Any]:
                m, K, L, d, variant = cell
                linears = variant_linears(variant)
                bar.set_postfix_str(f"T={T:g} prompt {i + 1}/{len(prompts)} {m} K={K or 1} L={L or 1} {d or ''}"
                                    f"{'' if variant == 'plain' else ' ' + variant}", refresh=False)
                extra = {} if d is None else {"drafter": d, "drafter_options": dict(cfg.drafter_options.get(d) or {})}
                # packs are built (when not cached) before the generation, so their cost is not timed
                ctx: Any = nullcontext()
                if linears == "packed" and packs is not None:
                    ctx = packs.get(pack_size(cell, tree, cfg.pack_rungs))
                elif linears == "panels" and panels is not None:
                    ctx = panels
                tgt, drf = lean_pair if variant_forward(variant) == "lean" and lean_pair is not None else (target, draft)
                with ctx:
                    r = generate(tgt, drf if m != "ar" else None, ids, m, K=K or 1, L=L or 1, temperature=T,
                                 max_new_tokens=cfg.max_new_tokens, seed=cfg.seed + i, eos_token_id=[], **extra)
                bar.update()
                return r.stats

            stats = interleaved_generations(cells, prompts, run_cell)
            for (m, K, L, d, variant), st in stats.items():
                linears, forward = variant_linears(variant), variant_forward(variant)
                ar = stats[("ar", None, None, None, variant)]
                timed = st[1:]  # prompt 0 is the warm-up
                speed = ratios_of([a["decode_s"] for a in ar[1:]], [s["decode_s"] for s in timed])
                speed_e2e = ratios_of([a["total_s"] for a in ar[1:]], [s["total_s"] for s in timed])
                tokens = sum(s["new_tokens"] for s in st)
                calls = sum(s["target_calls"] for s in st)
                dec = sum(s["decode_s"] for s in timed)
                split = {k: (sum(s[f"{k}_s"] for s in timed) / dec if dec > 0 else float("nan"))
                         for k in ("draft", "target", "verify", "other")}
                row = {"temperature": T, "method": m, "K": K, "L": L, "drafter": d, "variant": variant,
                       "linears": linears, "forward": forward, "packed": linears == "packed", "panels": linears == "panels",
                       "tokens_per_second": spread([s["tokens_per_second"] for s in timed]),
                       "speedup": spread(speed), "speedup_mean": statistics.fmean(speed) if speed else float("nan"),
                       "speedup_e2e": spread(speed_e2e),
                       "block_efficiency": tokens / calls if calls else float("nan"),
                       "time_split": split, "n_timed_prompts": len(timed)}
                if variant != "plain" and with_plain:
                    plain = stats[(m, K, L, d, "plain")][1:]
                    #: plain decode s / this cell's decode s per prompt: what the packs, panels or lean forward gain here
                    row[f"{'lean' if forward == 'lean' else linears}_speed_vs_plain"] = spread(ratios_of([s["decode_s"] for s in plain],
                                                                        [s["decode_s"] for s in timed]))
                if linears == "packed":
                    row["pack_size"] = pack_size((m, K, L, d, variant), tree, cfg.pack_rungs)
                results.append(row)
    finally:
        bar.close()
        if packs is not None:
            packs.free()
        if panels is not None:
            panels.free()
    # the "x / plain speed" columns need the plain cells
    packed_col, panels_col, lean_col = (with_plain and on for on in (on_packs, on_panels, on_lean))
    code_col = on_panels or on_lean or not with_plain
    rows = [[r["temperature"], r["method"], r["drafter"] or "-", r["K"] or "-", r["L"] or "-"]
            + ([r["variant"]] if code_col else [])
            + ([r["pack_size"] if r["packed"] else "-"] if on_packs else []) + [
             range_text(r["tokens_per_second"]),
             range_text(r["speedup"]), fmt_number(r["block_efficiency"]),
             " / ".join(f"{100 * r['time_split'][k]:.0f}%" if not math.isnan(r["time_split"][k]) else "-"
                        for k in ("draft", "target", "verify", "other"))]
            + ([range_text(r["packed_speed_vs_plain"]) if r["packed"] else "-"] if packed_col else [])
            + ([range_text(r["panels_speed_vs_plain"]) if r["variant"] == "panels" else "-"] if panels_col else [])
            + ([range_text(r["lean_speed_vs_plain"]) if r["forward"] == "lean" else "-"] if lean_col else [])
            for r in results]
    print_table(f"end to end: {target.name} + {draft.name}; {len(prompts) - 1} timed prompts (+1 warm-up) x"
                f" {cfg.max_new_tokens} new tokens from {label}; decode speedup = AR decode s / method decode s per"
                " prompt, median [min, max]" + ("; packed rows: linears on MKL packs for that many rows, speedup vs packed AR"
                                              if on_packs else "")
                + ("; panels: the target's and draft's linears on weight panels (mdv.models.panels), speedup vs AR on panels"
                   + (f" (the draft's panels in {cfg.draft_panel_dtype})" if cfg.draft_panel_dtype != "float32" else "")
                   if on_panels else "")
                + ("; lean: target and draft on mdv's lean decoder forward (mdv.models.lean), speedup vs AR on the same code"
                   if on_lean else ""),
                ["T", "method", "drafter", "K", "L"] + (["code"] if code_col else [])
                + (["packed rows"] if on_packs else [])
                + ["tokens/s", "speedup vs AR", "block eff.", "draft/target/verify/other"]
                + (["packed / plain speed"] if packed_col else []) + (["panels / plain speed"] if panels_col else [])
                + (["lean / plain speed"] if lean_col else []), rows)
    goals = []
    at = [r for r in results if r["temperature"] == cfg.goal_temperature and r["method"] != "ar"]
    if at:
        best = max(at, key=lambda r: r["speedup"]["median"] if r["speedup"]["n"] else -1.0)
        goals.append(goal_record(f"best method at T={cfg.goal_temperature:g} ({best['method']} K={best['K']} L={best['L']}"
                                 f" drafter {best['drafter']}{_linears_note(best)})"
                           f" >= {cfg.goal_best:g}x AR", best["speedup"]["median"], cfg.goal_best, at_most=False))
        sd = [r for r in at if r["method"] == "sd"]
        if sd:
            b = max(sd, key=lambda r: r["speedup"]["median"] if r["speedup"]["n"] else -1.0)
            goals.append(goal_record(f"sd at its best L (L={b['L']}, drafter {b['drafter']}{_linears_note(b)}) at T={cfg.goal_temperature:g} >= {cfg.goal_sd:g}x AR",
                               b["speedup"]["median"], cfg.goal_sd, at_most=False))
    print_goals(goals)
    return bench_record("e2e", cfg, str(dev), str(target.dtype).removeprefix("torch."), results,
                   {"target": target.name, "draft": draft.name, "prompts": label, "n_prompts": len(prompts),
                    "pair_files": pair_identity(cfg.pair)},
                   goals, wall_seconds=time.perf_counter() - t_start)
