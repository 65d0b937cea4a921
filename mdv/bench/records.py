"""Benchmark records: the environment every record carries, printed tables, goals reported as met or
missed next to the measured figure (never asserted), and the ``bench_<name>.json`` files.
"""
from __future__ import annotations

import enum
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any, Sequence

import torch

from mdv.machine import describe


# 2: target_pass "tree" times the engine's token-tree pass (extend_tree + keep_nodes + crop), in 1 a
# benchmark-only forward pass with a crop; memory reads RSS after a gc.collect() per prompt, in 1 without
SCHEMA = "mdv.bench/2"


def environment(device: str | torch.device = "cpu", dtype: str = "float64") -> dict[str, Any]:
    """The record's ``environment``: :func:`mdv.machine.describe` (CPU, threads, versions, dtype, device, load
    average, timestamp)."""
    return describe(device, dtype)


def fmt_number(x: Any, digits: int = 3) -> str:
    """``x`` with ``digits`` significant digits for the printed tables; None -> "-"."""
    if x is None:
        return "-"
    if isinstance(x, float):
        if math.isnan(x):
            return "nan"
        return f"{x:.{digits}g}" if abs(x) < 1e5 else f"{x:.3e}"
    return str(x)


def range_text(s: dict[str, Any], digits: int = 3, pct: bool = False) -> str:
    """A :func:`~mdv.bench.timing.spread` as "median [min, max]"; "-" when empty."""
    if not s or not s.get("n"):
        return "-"
    f = (lambda v: f"{100 * v:.{max(digits - 1, 1)}g}%") if pct else (lambda v: fmt_number(v, digits))
    return f"{f(s['median'])} [{f(s['min'])}, {f(s['max'])}]"


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Print (and return) a Markdown table."""
    cells = [[c if isinstance(c, str) else fmt_number(c) for c in row] for row in rows]
    widths = [max(len(str(h)), *(len(r[i]) for r in cells)) if cells else len(str(h)) for i, h in enumerate(columns)]
    lines = [f"\n### {title}", "| " + " | ".join(str(h).ljust(w) for h, w in zip(columns, widths)) + " |",
             "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    lines += ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |" for r in cells]
    text = "\n".join(lines)
    print(text, flush=True)
    return text


def _jsonable(x: Any) -> Any:
    if isinstance(x, enum.Enum):
        return x.value
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
        return None  # strict JSON
    if isinstance(x, Path):
        return str(x)
    return x


def write_json(path: Path, record: dict[str, Any]) -> Path:
    """Write ``record`` as strict JSON (NaN -> null) atomically, with the cell store's writer
    (:func:`mdv.sweep.store.write_json_atomic`: temp file + fsync + replace)."""
    from mdv.sweep.store import write_json_atomic

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, _jsonable(record))
    return path


def bench_record(name: str, cfg_section: Any, device: str, dtype: str, results: Any, summary: dict[str, Any],
                 goals: list[dict[str, Any]], status: str = "ok", reason: str | None = None,
                 wall_seconds: float | None = None) -> dict[str, Any]:
    return {"schema": SCHEMA, "benchmark": name, "status": status, "reason": reason,
            "config": asdict(cfg_section) if cfg_section is not None else {},
            "environment": environment(device, dtype), "results": results, "summary": summary, "goals": goals,
            "wall_seconds": wall_seconds, "note": "shared machine: see environment.loadavg_1_5_15"}


def goal_record(name: str, value: float | None, limit: float, *, at_most: bool = True, unit: str = "",
                why: str | None = None) -> dict[str, Any]:
    """A goal verdict: met when value <= limit (``at_most``) or >= limit."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        met = None
    else:
        met = bool(value <= limit) if at_most else bool(value >= limit)
    return {"goal": name, "value": value, "limit": limit, "at_most": at_most, "unit": unit, "met": met,
            "why": why}


def print_goals(goals: list[dict[str, Any]]) -> None:
    """One line per goal: MET / MISSED / NOT MEASURED with the figure and the limit."""
    for g in goals:
        verdict = {True: "MET", False: "MISSED", None: "NOT MEASURED"}[g["met"]]
        op = "<=" if g["at_most"] else ">="
        print(f"  goal {g['goal']}: {fmt_number(g['value'], 4)}{g['unit']} {op} {fmt_number(g['limit'], 4)}{g['unit']} -> {verdict}"
              + (f" ({g['why']})" if g.get("why") else ""), flush=True)


def skipped_record(name: str, cfg_section: Any, reason: str) -> dict[str, Any]:
    """The record of a benchmark that could not run here, with the reason (printed too)."""
    print(f"{name}: skipped -- {reason}", flush=True)
    return bench_record(name, cfg_section, "cpu", "-", [], {}, [], status="skipped", reason=reason)
