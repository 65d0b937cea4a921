"""Formatting shared by the sections and the report: numbers, ranges, Markdown tables, goal rows, colours."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Iterable, Sequence

from mdv.analysis.tables import METHOD_ORDER  # rows in the sweep tables' order
from mdv.bench.report.load import PALETTE, Record


# =============================================================================================== formatting
def fmt(x: Any, digits: int = 3) -> str:
    """A number with ``digits`` significant digits (as ``mdv.bench`` prints); None / NaN -> "-"."""
    if x is None or isinstance(x, bool):
        return "-" if x is None else str(x)
    if isinstance(x, float):
        if math.isnan(x):
            return "-"
        return f"{x:.{digits}g}" if abs(x) < 1e5 else f"{x:.3e}"
    return str(x)


def pct(x: Any, digits: int = 3) -> str:
    """A fraction as a percentage: 0.05694 -> "5.69%"."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{100 * x:.{digits}g}%"


def rng(s: dict[str, Any] | None, digits: int = 3, percent: bool = False) -> str:
    """A spread ``{median, min, max, n}`` as "median [min, max]"; "-" when nothing was measured."""
    if not s or not s.get("n") or s.get("median") is None:
        return "-"
    f = (lambda v: pct(v, digits)) if percent else (lambda v: fmt(v, digits))
    return f"{f(s['median'])} [{f(s.get('min'))}, {f(s.get('max'))}]"


def _md(s: Any) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def md_table(columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    out = ["| " + " | ".join(_md(c) for c in columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    out += ["| " + " | ".join(_md(c if isinstance(c, str) else fmt(c)) for c in row) + " |" for row in rows]
    return out


def _method_rank(m: str) -> tuple:
    return (METHOD_ORDER.index(m), "") if m in METHOD_ORDER else (len(METHOD_ORDER), m)


def _color(method: str) -> str:
    i = METHOD_ORDER.index(method) if method in METHOD_ORDER else len(METHOD_ORDER) + sum(map(ord, method)) % 3
    return PALETTE[i]


def verdict(met: Any) -> str:
    return {True: "**met**", False: "**missed**"}.get(met, "not measured")


def goal_rows(rec: Record) -> list[list[str]]:
    """benchmark | goal | measured | target | verdict | note, from the record's own goal verdicts."""
    rows = []
    for g in rec.goals:
        unit = g.get("unit") or ""
        op = "≤" if g.get("at_most", True) else "≥"
        value = "-" if g.get("value") is None else f"{fmt(g['value'], 4)}{unit}"
        limit = "-" if g.get("limit") is None else f"{op} {fmt(g['limit'], 4)}{unit}"
        rows.append([rec.benchmark, g["goal"], value, limit, verdict(g.get("met")), g.get("why") or ""])
    return rows


def _load(env: dict) -> str:
    la = env.get("loadavg_1_5_15")
    return " / ".join(fmt(x) for x in la) if isinstance(la, list) and la else "-"


def _rel(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)
