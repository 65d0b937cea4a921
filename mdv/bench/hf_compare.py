"""The ``hf_compare`` benchmark: mdv against Hugging Face ``generate`` on the same target, draft, prompts and L.

Side by side in one process, interleaved per prompt (the contender order rotated by one per prompt):

* Hugging Face: plain sampling (``hf_plain``, the yardstick), assisted generation with the pair's draft
  (``hf_assistant``: ``assistant_model``, ``num_assistant_tokens = L``, constant schedule), prompt lookup
  (``hf_prompt_lookup``: ``prompt_lookup_num_tokens = L``, ``max_matching_ngram_size = ngram_size``) and
  early exit (``hf_early_exit``: ``assistant_early_exit = early_exit_depth``);
* mdv: ``mdv_ar`` and ``sd`` with the drafter Hugging Face uses for the same mode (``mdv_sd_model``,
  ``mdv_sd_ngram`` with ``n_max = ngram_size``, ``n_min = ngram_min`` and no draft where the context's suffix
  matches nothing that long (``on_miss="skip"``: one AR step, as Hugging Face's lookup on a miss; Hugging Face
  has no n_min and always goes down to 1-grams), ``mdv_sd_layerskip`` with ``depth = early_exit_depth``).

Every generation produces exactly ``max_new_tokens`` tokens (Hugging Face: ``min_new_tokens`` =
``max_new_tokens``; mdv: no EOS stop) at temperature ``temperature``, and is timed as one whole call
(prefill included, on both sides).  Reported per contender: tokens/s and the per-prompt ratio of its time
to ``hf_plain``'s (median [min, max] over the timed prompts; the first prompt warms up); the goals say
whether mdv with each drafter is ahead of Hugging Face with the same drafter.
"""
from __future__ import annotations

import sys
import time
from typing import Any, Callable, Optional

import torch

from mdv.bench.config import HFCompareBench, TinyPair
from mdv.bench.e2e import interleaved_generations
from mdv.bench.pairs import pair_for, prompt_ids, torch_device
from mdv.bench.records import bench_record, goal_record, print_goals, print_table, range_text
from mdv.bench.timing import ratios_of, spread

#: mdv's contender -> the Hugging Face mode with the same drafter (the "keep mdv ahead" goals)
SAME_DRAFTER = {"mdv_sd_model": "hf_assistant", "mdv_sd_ngram": "hf_prompt_lookup",
                "mdv_sd_layerskip": "hf_early_exit", "mdv_ar": "hf_plain"}


def _contenders(cfg: HFCompareBench, target: Any, draft: Any, tok: Any) -> dict[str, Callable[[list[int], int], int]]:
    """name -> fn(prompt ids, seed) -> new tokens, one generation each."""
    import mdv

    L, n = cfg.L, cfg.max_new_tokens
    pad = getattr(tok, "eos_token_id", None)
    pad = pad if isinstance(pad, int) else 0
    hf_kw = {"do_sample": cfg.temperature > 0, "max_new_tokens": n, "min_new_tokens": n, "pad_token_id": pad}
    if cfg.temperature > 0:
        hf_kw["temperature"] = cfg.temperature
    const = {"num_assistant_tokens": L, "num_assistant_tokens_schedule": "constant"}
    hf_modes: dict[str, dict[str, Any]] = {
        "hf_plain": {}, "hf_assistant": {"assistant_model": draft.model, **const},
        "hf_prompt_lookup": {"prompt_lookup_num_tokens": L, "max_matching_ngram_size": cfg.ngram_size},
        "hf_early_exit": {"assistant_early_exit": cfg.early_exit_depth, **const}}

    def hf(mode: dict[str, Any]) -> Callable[[list[int], int], int]:
        def run(ids: list[int], seed: int) -> int:
            torch.manual_seed(seed)
            x = torch.tensor([ids], device=target.device)
            out = target.model.generate(x, attention_mask=torch.ones_like(x), **hf_kw, **mode)
            return int(out.shape[1] - x.shape[1])
        return run

    def ours(method: str, drafter: str, options: dict[str, Any]) -> Callable[[list[int], int], int]:
        def run(ids: list[int], seed: int) -> int:
            res = mdv.generate(target, draft, ids, method, K=1, L=L, temperature=cfg.temperature, max_new_tokens=n,
                               seed=seed, eos_token_id=[], drafter=drafter, drafter_options=options)
            return len(res.tokens)
        return run

    mdv_modes = {"mdv_ar": ours("ar", "model", {}), "mdv_sd_model": ours("sd", "model", {}),
                 "mdv_sd_ngram": ours("sd", "ngram", {"n_max": cfg.ngram_size, "n_min": cfg.ngram_min,
                                                       "on_miss": "skip"}),
                 "mdv_sd_layerskip": ours("sd", "layerskip", {"depth": cfg.early_exit_depth})}
    table = {**{k: hf(v) for k, v in hf_modes.items()}, **mdv_modes}
    return {name: table[name] for name in cfg.contenders}


def run_hf_compare(cfg: HFCompareBench, pair: tuple[Any, Any, Any] | None = None, tiny: TinyPair | None = None,
                   device: Optional[str] = None, dtype: str = "float32") -> dict[str, Any]:
    """The ``hf_compare`` benchmark (module docstring)."""
    from transformers.utils import logging as hf_logging

    t_start = time.perf_counter()
    dev = torch_device(device)
    loaded = pair_for("hf_compare", cfg, pair, tiny, dev, dtype)
    if isinstance(loaded, dict):  # the pair's files are absent: the skipped record
        return loaded
    target, draft, tok = loaded
    if "mdv_sd_layerskip" in cfg.contenders:  # a depth the target cannot take fails before any generation
        from mdv.drafters.registry import get_drafter

        get_drafter("layerskip", depth=cfg.early_exit_depth).bind(target, draft)
    prompts, label = prompt_ids(tok, cfg.datasets, cfg.n_prompts, cfg.seed)
    runs = _contenders(cfg, target, draft, tok)
    from tqdm import tqdm

    bar = tqdm(total=len(prompts) * len(runs), desc="hf_compare generations", unit="gen", dynamic_ncols=True,
               file=sys.stderr)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # transformers warns about min_new_tokens on every call

    def run_cell(name: str, i: int, ids: list[int]) -> dict[str, Any]:
        bar.set_postfix_str(f"prompt {i + 1}/{len(prompts)} {name}", refresh=False)
        t0 = time.perf_counter()
        new = runs[name](ids, cfg.seed + i)
        dt = time.perf_counter() - t0
        bar.update()
        return {"seconds": dt, "new_tokens": new}

    try:
        with torch.inference_mode():
            stats = interleaved_generations(list(runs), prompts, run_cell)
    finally:
        hf_logging.set_verbosity(verbosity)
        bar.close()
    base = [s["seconds"] for s in stats["hf_plain"][1:]] if "hf_plain" in stats else None
    results = []
    for name, st in stats.items():
        timed = st[1:]  # prompt 0 is the warm-up
        secs = [s["seconds"] for s in timed]
        results.append({"contender": name, "tokens_per_second": spread([s["new_tokens"] / s["seconds"] for s in timed]),
                        "new_tokens": sorted({s["new_tokens"] for s in st}),
                        "speed_vs_hf_plain": spread(ratios_of(base, secs)) if base else spread([]),
                        "n_timed_prompts": len(timed)})
    by = {r["contender"]: r for r in results}
    print_table(f"mdv vs Hugging Face generate: {target.name} + {draft.name}; {len(prompts) - 1} timed prompts (+1 warm-up)"
                f" x {cfg.max_new_tokens} tokens from {label}; T={cfg.temperature:g}, L={cfg.L}; speed vs hf_plain ="
                " hf_plain s / contender s per prompt (whole call, prefill included), median [min, max]",
                ["contender", "tokens/s", "speed vs hf_plain"],
                [[r["contender"], range_text(r["tokens_per_second"]), range_text(r["speed_vs_hf_plain"])] for r in results])
    goals = []
    for ours, theirs in SAME_DRAFTER.items():
        if ours in by and theirs in by:
            ratio = spread(ratios_of([s["seconds"] for s in stats[theirs][1:]], [s["seconds"] for s in stats[ours][1:]]))
            by[ours]["speed_vs_hf_same_drafter"] = ratio
            goals.append(goal_record(f"{ours} at least as fast as {theirs} (same drafter)", ratio["median"], 1.0,
                                     at_most=False))
    print_goals(goals)
    return bench_record("hf_compare", cfg, str(dev), str(target.dtype).removeprefix("torch."), results,
                        {"target": target.name, "draft": draft.name, "prompts": label, "n_prompts": len(prompts)},
                        goals, wall_seconds=time.perf_counter() - t_start)
