"""The whole recipe: option checks before any work, then steps 1-6 in order, the report written at the end
(:func:`run_recipe`), or step 6 alone on a draft already trained (:func:`head_subset_only`).
"""
from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any, Sequence

import torch
from omegaconf import DictConfig, OmegaConf

from mdv import assets
from mdv.distill.data import (SHIPPED_GENERATIONS, build_sequences, load_prompt_records, split_records,
                              unpack_generations)
from mdv.distill.evaluate import evaluate
from mdv.distill.head_subset import choose_head_subsets, head_subset_section
from mdv.distill.teacher import teacher_hidden
from mdv.distill.train import train_draft
from mdv.errors import InvalidInputError
from mdv.models import default_pair as dp


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


def head_subset_only(cfg: DictConfig, target: Any, tok: Any, train: list[dict[str, Any]],
                     held: list[dict[str, Any]], out_dir: Path, cache: Path) -> dict[str, Any]:
    """``head_subset_only=true``: step 6 alone on the draft already in ``output.dir``; every other section
    of the report is kept as it is (the training text comes from the cache, or is regenerated)."""
    from mdv.errors import MissingAssetError

    rpath = out_dir / cfg.output.report
    if not rpath.is_file() or not dp.draft_config_path(cfg.output.name, out_dir).is_file():
        raise MissingAssetError(f"head_subset_only needs the draft and its report in {out_dir}; run the recipe first")
    report = json.loads(rpath.read_text())
    seqs, _ = build_sequences(cfg, tok, target, train, cache)
    report["head_subset"] = head_subset_section(cfg, target, tok, train, held, seqs, out_dir, cache)
    rpath.write_text(json.dumps(report, indent=2) + "\n")
    return report


def run_recipe(cfg: DictConfig, out_dir: Path, command: str) -> dict[str, Any]:
    """Run the recipe (module doc of :mod:`mdv.distill`) with the ``mdv/conf/train_draft.yaml`` config ``cfg``,
    writing the draft and its report into ``out_dir``; ``command`` is recorded as the recipe that made it.
    With ``head_subset_only`` only step 6 runs (:func:`head_subset_only`).  -> the report written."""
    check_options(cfg)
    torch.set_num_threads(int(cfg.num_threads))
    torch.manual_seed(int(cfg.seed))
    random.seed(int(cfg.seed))
    wall0, cpu0 = time.perf_counter(), time.process_time()
    cache = Path(cfg.output.work_cache) if cfg.output.work_cache else assets.cache_dir() / "train_draft"
    cache.mkdir(parents=True, exist_ok=True)
    # the target's generations shipped with the eagle drafter share their chunk keys with this recipe's
    # first sample (same prompts, settings and seed): seed the cache with them instead of regenerating
    unpack_generations(dp.DATA_DIR / SHIPPED_GENERATIONS, cache)

    target, tok = dp.load_target(torch.float32)
    for p in target.parameters():
        p.requires_grad_(False)
    recs = load_prompt_records()
    train, held = split_records(recs, dict(cfg.data.holdout), int(cfg.seed))
    if cfg.head_subset_only:
        return head_subset_only(cfg, target, tok, train, held, out_dir, cache)
    subset_section: dict[str, Any] | None = None
    report: dict[str, Any] = {
        "draft": cfg.output.name, "target": dp.TARGET_ASSET,
        "recipe": command,
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
            subset_section = head_subset_section(cfg, target, tok, train, held, seqs, out_dir, cache)
        report["data"] = data_info
        report["training"] = train_info
        report["files"] = {"weights": _shown(wpath),
                           "config": _shown(cpath),
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
            report["evaluation_recipe"] = command
        if cfg.head_subset.enabled:
            seqs, _ = build_sequences(cfg, tok, target, train, cache)
            subset_section = head_subset_section(cfg, target, tok, train, held, seqs, out_dir, cache)
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
    return report


def _shown(path: Path) -> str:
    """``path`` as the report records it: relative to the working folder (the repository, when run as the
    README says) when it lies inside it."""
    path = path.resolve()
    return str(path.relative_to(Path.cwd())) if path.is_relative_to(Path.cwd()) else str(path)
