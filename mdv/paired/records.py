"""Paired records: one JSON file per (dataset, prompt) under ``<results_dir>/paired/`` (schema
``mdv.paired/2``), named by a hash of everything that determines its numbers; read back leniently (an
unreadable, failed or foreign file is left out, never trusted)."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Callable, Optional

from mdv.paired.config import PairedConfig

SCHEMA = "mdv.paired/2"  # /2: reach at every (K, L), not only L = L_max


def record_config(cfg: PairedConfig, *, dataset: str, temperature: float, top_k: Optional[int],
                  top_p: Optional[float], seed: int, models: str) -> dict[str, Any]:
    """What determines a record's numbers (its id hashes it).  The default drafter adds no key, so records
    written before drafters existed keep their ids."""
    out = {"dataset": dataset, "K_max": cfg.K_max, "L_max": cfg.L_max, "stride": cfg.stride,
           "n_tokens": cfg.n_tokens, "methods": list(cfg.methods), "optimum_draws": cfg.optimum_draws,
           "temperature": float(temperature), "top_k": top_k, "top_p": top_p, "seed": int(seed), "models": models}
    if cfg.drafter != "model":
        out.update({"drafter": cfg.drafter, "drafter_options": dict(cfg.drafter_options or {})})
    return out


def record_id(config: dict[str, Any], prompt_index: int) -> str:
    digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:10]
    T = f"{config['temperature']:g}"
    return f"{config['dataset']}__p{prompt_index:03d}__K{config['K_max']}_L{config['L_max']}_T{T}__{digest}"


def paired_dir(results_dir: str | Path) -> Path:
    return Path(results_dir) / "paired"


def read_record(path: Path) -> Optional[dict[str, Any]]:
    """A finished record, or None when the file is absent, unreadable or not of this ``SCHEMA`` with status ok."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or data.get("status") != "ok":
        return None
    return data


def drafter_file(stem: str, drafter: str = "model") -> str:
    """The name of a per-drafter file of ``<results_dir>/paired``: ``<stem>.json`` for the draft model (the
    default drafter: the name files had before drafters were an axis), ``<stem>.<drafter>.json`` for another,
    so the runs of two drafters in one folder keep a calibration and a speed check each."""
    from mdv.drafters.base import DEFAULT_DRAFTER

    return f"{stem}.json" if drafter == DEFAULT_DRAFTER else f"{stem}.{drafter}.json"


def calibration_file(drafter: str = "model") -> str:
    """``calibration.json`` (the draft model) or ``calibration.<drafter>.json``: one per drafter."""
    return drafter_file("calibration", drafter)


def load_records(results_dir: str | Path, warn: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Every finished record under ``<results_dir>/paired``; unreadable or failed files are named by
    ``warn`` and left out."""
    folder = paired_dir(results_dir)
    out = []
    for path in sorted(folder.glob("*__p*.json")) if folder.is_dir() else []:  # record ids (not calibration.json)
        rec = read_record(path)
        if rec is None:
            if warn is not None:
                warn(f"paired record {path} is unreadable, failed or not {SCHEMA}; left out")
            continue
        out.append(rec)
    return out


__all__ = ["SCHEMA", "calibration_file", "drafter_file", "load_records", "paired_dir", "read_record", "record_config", "record_id"]
