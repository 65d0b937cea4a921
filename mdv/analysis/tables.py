"""Tables in the SpecTr-GBV Table 1 layout: one per setting, methods as rows, datasets as columns, CSV and
Markdown writers, captions that state the conventions.
"""
from __future__ import annotations

import csv
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from mdv.metrics import position_reach
from mdv.analysis.cells import AR, Cell, top_k_of, top_p_of
from mdv.analysis.speedup import find_ar, lossless, multi_draft, speedups
from mdv.analysis.stats import EMPTY, Stat, average_stat


#: Row order of the tables (the paper's Table 1 order, mdv's extra verifiers in between).
METHOD_ORDER = ["ar", "sd", "spectr", "bv", "gbv", "mdbv", "spectr_gbv"]
#: Column order of the paper's datasets (matched on the start of the dataset name).
DATASET_ORDER = ["humaneval", "gsm8k", "mgsm", "lm1b", "alpaca"]
LOSSY_MARK = "†"


# ----------------------------------------------------------------------------------------------- tables


@dataclass(frozen=True, order=True)
class Setting:
    """One table: models, K, L, temperature (+ top-k, top-p, max_new_tokens)."""

    target: str
    draft: str
    temperature: float
    top_k: int
    top_p: float
    max_new_tokens: int
    K: int
    L: int

    def base(self) -> tuple:
        return (self.target, self.draft, self.temperature, self.top_k, self.top_p, self.max_new_tokens)

    def title(self) -> str:
        extra = []
        if self.top_k >= 0:
            extra.append(f"top-k {self.top_k}")
        if self.top_p >= 0:
            extra.append(f"top-p {self.top_p:g}")
        k = "—" if self.K < 0 else str(self.K)
        l_ = "—" if self.L < 0 else str(self.L)
        return (f"target {self.target}, draft {self.draft}, K = {k}, L = {l_}, T = {self.temperature:g}"
                + "".join(f", {e}" for e in extra) + f", max_new_tokens {self.max_new_tokens}")

    def slug(self) -> str:
        s = f"K{self.K}_L{self.L}_T{self.temperature:g}"
        if self.top_k >= 0:
            s += f"_k{self.top_k}"
        if self.top_p >= 0:
            s += f"_p{self.top_p:g}"
        s += f"_n{self.max_new_tokens}__{self.target}__{self.draft}"
        return re.sub(r"[^A-Za-z0-9_.-]+", "-", s)[:150]


def _base_of(cell: Cell) -> tuple:
    c = cell.config
    return (cell.target, cell.draft, cell.temperature, top_k_of(c.get("top_k")), top_p_of(c.get("top_p")),
            int(c.get("max_new_tokens") or 0))


def _base_eq(a: tuple, b: tuple) -> bool:
    """Bases equal; an empty draft (an AR cell that records none) matches any draft."""
    return all(x == y or (i == 1 and (not x or not y)) for i, (x, y) in enumerate(zip(a, b)))


@dataclass
class Entry:
    """One table cell: a method on a dataset in one setting (cells differing only in seed pooled)."""

    method: str
    dataset: str  # column key: the honest label
    cells: list[Cell]
    be: Stat
    sr: Stat
    sr_e2e: Stat
    sr_note: str = ""
    unequal_tokens: int = 0
    reach: list[float] = field(default_factory=list)
    acceptance_rate_kl: float = float("nan")
    acceptance_rate_l: float = float("nan")
    tokens_per_second: Stat = EMPTY


@dataclass
class Table:
    setting: Setting
    datasets: list[str]  # honest labels, column order
    sources: dict[str, str]
    methods: list[str]
    entries: dict[tuple[str, str], Entry]
    headers: dict[str, str] = field(default_factory=dict)  # full label -> short column header

    def header(self, dataset: str) -> str:
        """The short column header of a dataset (its label up to the first parenthesis, stand-ins marked)."""
        return self.headers.get(dataset, dataset)

    def get(self, method: str, dataset: str) -> Entry | None:
        return self.entries.get((method, dataset))

    def average(self, method: str, metric: str, datasets: Sequence[str] | None = None) -> Stat:
        """Mean over ``datasets`` (default: all datasets of the table); EMPTY if the method misses one."""
        parts = []
        for d in self.datasets if datasets is None else datasets:
            e = self.get(method, d)
            if e is None:
                return EMPTY
            parts.append(getattr(e, metric))
        return average_stat(parts)


def method_rank(m: str) -> tuple:
    """Sort key of a method (or ``method+drafter`` label): the drafter rows after the draft model's, then
    the place in METHOD_ORDER, unknown methods last by name."""
    base, _, drafter = m.partition("+")
    return (drafter,) + ((METHOD_ORDER.index(base), m) if base in METHOD_ORDER else (len(METHOD_ORDER), m))


def _dataset_rank(name: str, label: str) -> tuple:
    low = name.lower()
    for i, prefix in enumerate(DATASET_ORDER):
        if low.startswith(prefix):
            return (i, label)
    return (len(DATASET_ORDER), label)


def short_label(label: str, source: str) -> str:
    """A column header from an honest label: the part before the first " (", with ``[stand-in]`` added
    for a stand-in whose short name does not already say so."""
    short = label.split(" (")[0].strip() or label
    if source == "stand-in" and not re.search(r"stand.?in", short, re.I):
        short += " [stand-in]"
    return short


def _headers(labels: Sequence[str], sources: dict[str, str]) -> dict[str, str]:
    """Short headers; labels whose short forms collide keep their full label."""
    short = {d: short_label(d, sources.get(d, "")) for d in labels}
    counts: dict[str, int] = {}
    for v in short.values():
        counts[v] = counts.get(v, 0) + 1
    return {d: (v if counts[v] == 1 else d) for d, v in short.items()}


def _entry(method: str, label: str, cells: list[Cell], ar_cells: Sequence[Cell], warn: Callable[[str], None]) -> Entry:
    # one cell per seed: a duplicate seed (e.g. a different prompt count) keeps the larger cell
    by_seed: dict[Any, Cell] = {}
    for c in sorted(cells, key=lambda c: (-len(c.generations), c.cell_id)):
        s = c.config.get("seed")
        if s in by_seed:
            warn(f"warning: {c.cell_id}: same setting and seed as {by_seed[s].cell_id}; keeping the larger cell")
            continue
        by_seed[s] = c
    cells = [by_seed[s] for s in sorted(by_seed, key=str)]
    be = Stat.of([g["stats"]["block_efficiency"] for c in cells for g in c.generations])
    tps = Stat.of([g["stats"].get("tokens_per_second") for c in cells for g in c.timed()])
    taus = [int(t) for c in cells for g in c.generations for t in (g["stats"].get("accepted_lengths") or [])]
    L = cells[0].L
    reach = position_reach(taus, L) if (method != AR and L and taus) else []
    rate_kl = rate_l = float("nan")
    if taus and L and cells[0].K:
        rate_kl = sum(taus) / (cells[0].K * L * len(taus))
        rate_l = sum(taus) / (L * len(taus))
    dec: list[float] = []
    e2e: list[float] = []
    notes: list[str] = []
    unequal = 0
    for c in cells:
        if method == AR:
            sp = speedups(c, c)
        else:
            ar, why = find_ar(c, ar_cells)
            if ar is None:
                notes.append(why)
                continue
            sp = speedups(c, ar)
        dec += sp.decode
        e2e += sp.e2e
        unequal += sp.unequal_tokens
    return Entry(method=method, dataset=label, cells=cells, be=be, sr=Stat.of(dec), sr_e2e=Stat.of(e2e),
                 sr_note="; ".join(sorted(set(notes))), unequal_tokens=unequal, reach=reach,
                 acceptance_rate_kl=rate_kl, acceptance_rate_l=rate_l, tokens_per_second=tps)


def build_tables(cells: Sequence[Cell], warn: Callable[[str], None] | None = None) -> list[Table]:
    """One table per (models, K, L, temperature, top-k, top-p, max_new_tokens) setting.

    Multi-draft methods define the K values of a setting; single-draft methods join every K table with
    their L, and AR joins every table with its models and sampling (its own K and L are ignored).
    """
    warn = warn or (lambda line: print(line, file=sys.stderr))
    ar_cells = [c for c in cells if c.method == AR]
    spec = [c for c in cells if c.method != AR]
    settings: set[Setting] = set()
    bases = {}
    for c in spec:
        bases.setdefault(_base_of(c), []).append(c)
    for base, group in bases.items():
        for L in sorted({c.L for c in group if c.L is not None}):
            ks = {c.K for c in group if c.L == L and multi_draft(c.method) and c.K is not None}
            if not ks:
                ks = {c.K if c.K is not None else 1 for c in group if c.L == L}
            settings |= {Setting(*base, K=int(k), L=int(L)) for k in ks}
    for c in ar_cells:  # AR cells without any speculative cell of their setting get their own table
        if not any(_base_eq(_base_of(c), s.base()) for s in settings):
            settings.add(Setting(*_base_of(c), K=-1, L=-1))
    tables = []
    for s in sorted(settings):
        members: dict[tuple[str, str], list[Cell]] = {}
        labels: dict[str, tuple] = {}
        sources: dict[str, str] = {}
        for c in cells:
            if not _base_eq(_base_of(c), s.base()):
                continue
            if c.method != AR:
                if c.L != s.L or (multi_draft(c.method) and c.K != s.K):
                    continue
            members.setdefault((c.label, c.dataset_label), []).append(c)
            labels.setdefault(c.dataset_label, _dataset_rank(c.dataset_name, c.dataset_label))
            sources[c.dataset_label] = str(c.dataset.get("source", "?"))
        if s.K >= 0 and not any(m != AR for m, _ in members):
            continue
        entries = {key: _entry(key[0], key[1], group, ar_cells, warn) for key, group in members.items()}
        datasets = sorted(labels, key=lambda d: labels[d])
        methods = sorted({m for m, _ in members}, key=method_rank)
        tables.append(Table(setting=s, datasets=datasets, sources=sources, methods=methods, entries=entries,
                            headers=_headers(datasets, sources)))
    return tables


def method_label(method: str) -> str:
    """Row label: a lossy method carries the dagger."""
    return method + (LOSSY_MARK if lossless(method) is False else "")


def md_escape(s: str) -> str:
    """``s`` safe inside a Markdown table cell."""
    return s.replace("|", "\\|")


def environment_lines(cells: Sequence[Cell]) -> list[str]:
    """The environment header: one row per distinct environment."""
    keys = ("cpu", "threads", "torch", "transformers", "dtype", "device", "mdv", "python")
    envs: dict[tuple, list[Cell]] = {}
    for c in cells:
        envs.setdefault(tuple(str(c.environment.get(k, "?")) for k in keys), []).append(c)
    lines = ["| " + " | ".join(keys) + " | cells | timestamps |", "|" + "---|" * (len(keys) + 2)]
    for env, group in envs.items():
        ts = sorted(str(c.environment.get("timestamp", "")) for c in group)
        lines.append("| " + " | ".join(md_escape(v) for v in env) + f" | {len(group)} | {ts[0]} … {ts[-1]} |")
    if len(envs) > 1:
        lines += ["", "**Several environments**: speedup pairs a method only with an AR cell of its own environment."]
    return lines


def caption(table: Table, index: int) -> str:
    lossy = [m for m in table.methods if lossless(m) is False]
    unknown = [m for m in table.methods if lossless(m) is None]
    ns = [e.be.n for e in table.entries.values()]
    s = table.setting
    text = (f"**Table {index}.** {s.title()}. Single-draft methods run with K = 1. Entries: mean ± half-width of the 95%"
            f" Student-t CI over prompts (n = {_range(ns)} per entry, seeds pooled). **BE** = emitted tokens ÷"
            f" target calls, bonus/correction token included (AR = 1.00; at most L + 1), all prompts. **SR** = AR"
            f" decode time ÷ method decode time per prompt, paired by prompt with the AR cell of the same prompts,"
            f" machine and run, warm-up prompt excluded, prefill excluded (end-to-end SR with prefill: next table)."
            f" Avg = unweighted mean over the datasets, half-width √(Σh²)/n; — where a dataset is missing."
            f" Column headers are the datasets' honest labels (a stand-in is never named as the real dataset).")
    if lossy:
        text += (f" {LOSSY_MARK} {', '.join(lossy)}: not lossless per the exact oracle (experiments/theory): BE not"
                 f" comparable with the lossless methods'.")
    if unknown:
        text += f" Unknown method(s) {', '.join(unknown)}: losslessness not known to mdv."
    return text


def _range(ns: Sequence[int]) -> str:
    return f"{min(ns)}" if min(ns) == max(ns) else f"{min(ns)}–{max(ns)}"


def markdown_table(table: Table, metrics: Sequence[tuple[str, str]] = (("be", "BE"), ("sr", "SR"))) -> list[str]:
    head = ["method"]
    for d in table.datasets:
        head += [f"{md_escape(table.header(d))} {name}" for _, name in metrics]
    head += [f"avg {name}" for _, name in metrics]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for m in table.methods:
        row = [method_label(m)]
        for d in table.datasets:
            e = table.get(m, d)
            row += [getattr(e, key).fmt() if e else "—" for key, _ in metrics]
        row += [table.average(m, key).fmt() for key, _ in metrics]
        lines.append("| " + " | ".join(row) + " |")
    return lines


def write_table_csv(table: Table, path: Path) -> None:
    """The paper layout as CSV: one row per method, per dataset BE/SR mean, CI and n, then the average."""
    fields = ["method", "lossless"]
    for d in table.datasets:
        for key in ("be", "sr", "sr_e2e"):
            h = table.header(d)
            fields += [f"{h} {key} mean", f"{h} {key} ci95", f"{h} {key} n"]
    for key in ("be", "sr", "sr_e2e"):
        fields += [f"avg {key} mean", f"avg {key} ci95"]
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(fields)
        for m in table.methods:
            row: list[Any] = [m, lossless(m)]
            for d in table.datasets:
                e = table.get(m, d)
                for key in ("be", "sr", "sr_e2e"):
                    st = getattr(e, key) if e else EMPTY
                    row += [_csv_num(st.mean), _csv_num(st.ci), st.n]
            for key in ("be", "sr", "sr_e2e"):
                st = table.average(m, key)
                row += [_csv_num(st.mean), _csv_num(st.ci)]
            w.writerow(row)


def _csv_num(x: float) -> str:
    return "" if x is None or math.isnan(x) else f"{x:.6g}"


LONG_FIELDS = ["setting", "method", "lossless", "dataset_label", "dataset_source", "target", "draft", "K", "L",
               "temperature", "top_k", "top_p", "max_new_tokens", "seeds", "cells", "n_be", "be_mean", "be_ci95",
               "n_sr", "sr_mean", "sr_ci95", "sr_e2e_mean", "sr_e2e_ci95", "tokens_per_second_mean",
               "acceptance_rate_kl", "acceptance_rate_l", "per_position_acceptance", "unequal_token_pairs", "sr_note"]


def write_long_csv(tables: Sequence[Table], path: Path) -> None:
    """Every table entry as one tidy row (all settings together)."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=LONG_FIELDS)
        w.writeheader()
        for t in tables:
            s = t.setting
            for (m, d), e in sorted(t.entries.items(), key=lambda kv: (method_rank(kv[0][0]), kv[0][1])):
                w.writerow({
                    "setting": s.slug(), "method": m, "lossless": lossless(m), "dataset_label": d,
                    "dataset_source": t.sources.get(d, ""), "target": s.target, "draft": s.draft,
                    "K": e.cells[0].K if m != AR else "", "L": e.cells[0].L if m != AR else "",
                    "temperature": s.temperature, "top_k": "" if s.top_k < 0 else s.top_k,
                    "top_p": "" if s.top_p < 0 else s.top_p, "max_new_tokens": s.max_new_tokens,
                    "seeds": " ".join(str(c.config.get("seed")) for c in e.cells),
                    "cells": " ".join(c.cell_id for c in e.cells), "n_be": e.be.n,
                    "be_mean": _csv_num(e.be.mean), "be_ci95": _csv_num(e.be.ci), "n_sr": e.sr.n,
                    "sr_mean": _csv_num(e.sr.mean), "sr_ci95": _csv_num(e.sr.ci),
                    "sr_e2e_mean": _csv_num(e.sr_e2e.mean), "sr_e2e_ci95": _csv_num(e.sr_e2e.ci),
                    "tokens_per_second_mean": _csv_num(e.tokens_per_second.mean),
                    "acceptance_rate_kl": _csv_num(e.acceptance_rate_kl),
                    "acceptance_rate_l": _csv_num(e.acceptance_rate_l),
                    "per_position_acceptance": " ".join(f"{r:.4g}" for r in e.reach),
                    "unequal_token_pairs": e.unequal_tokens, "sr_note": e.sr_note,
                })
