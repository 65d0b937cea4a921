"""The sweep's plots: block efficiency vs K, speedup vs L, both vs temperature, and per-position acceptance.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from mdv.metrics import position_reach
from mdv.analysis.cells import AR
from mdv.analysis.speedup import multi_draft
from mdv.analysis.stats import Stat
from mdv.analysis.tables import LOSSY_MARK, METHOD_ORDER, Setting, Table, method_label, method_rank


# ----------------------------------------------------------------------------------------------- plots


@dataclass
class PlotResult:
    path: Path | None
    note: str


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _color(method: str) -> str:
    """One fixed colour per method across all plots."""
    palette = ["#7f7f7f", "#1f77b4", "#ff7f0e", "#8c564b", "#2ca02c", "#9467bd", "#d62728", "#e377c2", "#17becf",
               "#bcbd22"]
    i = METHOD_ORDER.index(method) if method in METHOD_ORDER else len(METHOD_ORDER) + sum(map(ord, method)) % 3
    return palette[i]


Series = dict[str, list[tuple[float, Stat]]]


def _series(tables: Sequence[Table], x: str, fixed: Callable[[Setting], tuple],
            metric: str) -> dict[tuple, tuple[str, Series]]:
    """groups (the fixed part of the setting) -> (which datasets were averaged, method -> [(x, stat)]).

    A method's line averages, at every point, the same datasets: those it was measured on at every x of
    its group (so a line never mixes different dataset sets).
    """
    groups: dict[tuple, list[Table]] = {}
    for t in tables:
        xv = getattr(t.setting, x)
        if not (isinstance(xv, int) and xv < 0):
            groups.setdefault(fixed(t.setting), []).append(t)
    out: dict[tuple, tuple[str, Series]] = {}
    for g, ts in groups.items():
        series: Series = {}
        sizes: set[int] = set()
        for m in sorted({m for t in ts for m in t.methods if m != AR}, key=method_rank):
            with_m = [t for t in ts if m in t.methods]
            common = sorted(set.intersection(*({d for d in t.datasets if t.get(m, d)} for t in with_m)))
            if not common:
                continue
            for t in with_m:
                stat = t.average(m, metric, common)
                if stat.valid:
                    series.setdefault(m, []).append((getattr(t.setting, x), stat))
            if m in series:
                sizes.add(len(common))
        if series:
            n = f"{min(sizes)}" if min(sizes) == max(sizes) else f"{min(sizes)}–{max(sizes)}"
            out[g] = (n, series)
    return out


def _varied(groups: dict[tuple, tuple[str, Series]], need: Callable[[str], bool] = lambda m: True
            ) -> dict[tuple, tuple[str, Series]]:
    """Keep the groups where some method (passing ``need``) has at least two distinct x values."""
    return {g: v for g, v in groups.items()
            if any(need(m) and len({x for x, _ in pts}) >= 2 for m, pts in v[1].items())}


def _grid(n: int):
    plt = _plt()
    cols = min(n, 3)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.6 * rows + 0.6), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax in flat[n:]:
        ax.set_visible(False)
    return plt, fig, flat[:n]


def _finish(plt, fig, axes, path: Path) -> None:
    """One legend for the whole figure (every method of every panel), then save."""
    handles: dict[str, Any] = {}
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    labels = sorted(handles, key=lambda lab: method_rank(lab.rstrip(LOSSY_MARK)))
    fig.legend([handles[lab] for lab in labels], labels, loc="lower center", ncol=min(len(labels), 7), fontsize=8,
               frameon=False)
    fig.tight_layout(rect=(0, 0.1 if len(axes) <= 3 else 0.05, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _draw_lines(ax, series: Series) -> None:
    for m in sorted(series, key=method_rank):
        pts = sorted(series[m], key=lambda p: p[0])
        style = "--" if not multi_draft(m) else "-"
        ax.errorbar([p[0] for p in pts], [p[1].mean for p in pts],
                    yerr=[0.0 if math.isnan(p[1].ci) else p[1].ci for p in pts], marker="o", linestyle=style,
                    capsize=3, color=_color(m), label=method_label(m))
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.grid(alpha=0.3)


def _fixed_title(names: Sequence[str], g: tuple, n_datasets: str) -> str:
    parts = []
    for n, v in zip(names, g):
        if n in ("target", "draft") or (n in ("top_k", "top_p") and v < 0):
            continue
        parts.append(f"{n}={v:g}" if isinstance(v, float) else f"{n}={v}")
    return ", ".join(parts) + f"\n(mean over the {n_datasets} dataset(s) each method has at every point)"


def _line_plot(tables: Sequence[Table], x: str, metric: str, path: Path, x_label: str, y_label: str,
               need: Callable[[str], bool], what: str, skip_reason: str) -> PlotResult:
    names = tuple(n for n in ("target", "draft", "K", "L", "temperature", "top_k", "top_p", "max_new_tokens")
                  if n != x)
    groups = _varied(_series(tables, x, lambda s: tuple(getattr(s, n) for n in names), metric), need)
    if not groups:
        return PlotResult(None, f"{what}: skipped ({skip_reason})")
    items = list(groups.items())
    more = f"; first 6 of {len(items)} settings" if len(items) > 6 else ""
    plt, fig, axes = _grid(min(len(items), 6))
    for ax, (g, (n_ds, series)) in zip(axes, items):
        _draw_lines(ax, series)
        ax.set_title(_fixed_title(names, g, n_ds), fontsize=8)
        ax.set_xlabel(x_label)
        ax.set_ylabel(y_label)
    _finish(plt, fig, axes, path)
    return PlotResult(path, what + more)


def plot_be_vs_k(tables: Sequence[Table], path: Path) -> PlotResult:
    return _line_plot(tables, "K", "be", path, "K (drafts)", "block efficiency", multi_draft,
                      "block efficiency vs K (single-draft methods dashed: K = 1, drawn across as a reference)",
                      "no multi-draft method measured at two or more K values in one setting")


def plot_sr_vs_l(tables: Sequence[Table], path: Path) -> PlotResult:
    return _line_plot(tables, "L", "sr", path, "L (draft length)", "speedup vs AR (decode)", lambda m: True,
                      "speedup (decode) vs L", "no method with a speedup at two or more L values in one setting;"
                      " speedup needs the AR cell")


def plot_vs_temperature(tables: Sequence[Table], path: Path) -> PlotResult:
    names = ("target", "draft", "K", "L", "top_k", "top_p", "max_new_tokens")
    fixed = lambda s: tuple(getattr(s, n) for n in names)  # noqa: E731
    be = _varied(_series(tables, "temperature", fixed, "be"))
    sr = _varied(_series(tables, "temperature", fixed, "sr"))
    if not be:
        return PlotResult(None, "block efficiency and speedup vs T: skipped (no method measured at two or more"
                                " temperatures in one setting)")
    items = list(be.items())[:3]
    panels = [(g, "block efficiency", v) for g, v in items]
    panels += [(g, "speedup vs AR (decode)", sr[g]) for g, _ in items if g in sr]
    plt, fig, axes = _grid(len(panels))
    for ax, (g, ylabel, (n_ds, series)) in zip(axes, panels):
        _draw_lines(ax, series)
        ax.set_title(_fixed_title(names, g, n_ds), fontsize=8)
        ax.set_xlabel("temperature T")
        ax.set_ylabel(ylabel)
    _finish(plt, fig, axes, path)
    note = "block efficiency and speedup vs T"
    if any(g not in sr for g, _ in items):
        note += " (speedup panel missing where no AR pairing exists at two temperatures)"
    if len(be) > 3:
        note += f"; first 3 of {len(be)} settings"
    return PlotResult(path, note)


def plot_per_position(tables: Sequence[Table], path: Path) -> PlotResult:
    panels = []
    for t in tables:
        lines = {}
        for m in t.methods:
            taus = [int(x) for d in t.datasets if (e := t.get(m, d)) for c in e.cells for g in c.generations
                    for x in (g["stats"].get("accepted_lengths") or [])]
            if m != AR and taus and t.setting.L > 0:
                lines[m] = position_reach(taus, t.setting.L)
        if lines:
            panels.append((t.setting, lines))
    if not panels:
        return PlotResult(None, "per-position acceptance: skipped (no speculative cell with accepted lengths)")
    more = f" (first 6 of {len(panels)} settings)" if len(panels) > 6 else ""
    panels = panels[:6]
    plt, fig, axes = _grid(len(panels))
    for ax, (s, lines) in zip(axes, panels):
        for m in sorted(lines, key=method_rank):
            ax.plot(range(1, len(lines[m]) + 1), lines[m], marker="o", color=_color(m), label=method_label(m))
        ax.set_ylim(0, 1.02)
        ax.set_xticks(range(1, s.L + 1))
        ax.set_xlabel("draft position i")
        ax.set_ylabel("P(tau ≥ i)")
        ax.set_title(f"K={s.K}, L={s.L}, T={s.temperature:g} (datasets pooled)", fontsize=8)
        ax.grid(alpha=0.3)
    _finish(plt, fig, axes, path)
    return PlotResult(path, "per-position acceptance P(tau ≥ i)" + more)
