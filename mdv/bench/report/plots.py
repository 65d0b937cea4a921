"""The bench report's plots: verifier cost vs V, end-to-end speedup vs L, the end-to-end time split."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from mdv.bench.report.format import _color, fmt, _method_rank, pct
from mdv.bench.report.load import Record, SPLIT_COLORS, SPLIT_KEYS
from mdv.bench.report.sections import (_e2e_key, _method_k_label, e2e_label, verifier_blocks, verifier_cell, _verifier_multi,
                                       verifier_series)


# =============================================================================================== plots
def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _errbar(ax, xs, spreads, scale: float = 1.0, marker: str = "o", **kw) -> None:
    ys = [s["median"] * scale for s in spreads]
    lo = [max(0.0, (s["median"] - (s["min"] if s.get("min") is not None else s["median"])) * scale) for s in spreads]
    hi = [max(0.0, ((s["max"] if s.get("max") is not None else s["median"]) - s["median"]) * scale) for s in spreads]
    ax.errorbar(xs, ys, yerr=[lo, hi], capsize=3, marker=marker, **kw)


def plot_verify_cost(rec: Record, path: Path, K: int, L: int) -> str:
    """Verifier cost vs V at (K, L): ms per call and share of a target step (when measured).  -> note."""
    k, l_, note = verifier_cell(rec, K, L)
    multi = _verifier_multi(rec)
    series = verifier_series(rec, k, l_)
    ms_pts = {m: [r for r in rs if r["ms"].get("n") and r["ms"].get("median") is not None] for m, rs in series.items()}
    fr_pts = {m: [r for r in rs if r["step_fraction"].get("n") and r["step_fraction"].get("median") is not None]
              for m, rs in series.items()}
    ms_pts = {m: v for m, v in ms_pts.items() if v}
    fr_pts = {m: v for m, v in fr_pts.items() if v}
    if not ms_pts:
        raise _Skip(f"no measured verifier cost at K={k}, L={l_}")
    if len({r["V"] for rs in ms_pts.values() for r in rs}) == 1:  # one V (e.g. real blocks): bars, not lines
        return _plot_verify_cost_bars(rec, path, k, l_, note, ms_pts, fr_pts, multi)
    plt = _plt()
    n = 2 if fr_pts else 1
    fig, axes = plt.subplots(1, n, figsize=(5.4 * n, 4.4), squeeze=False)
    axes = axes[0]
    for m, rs in ms_pts.items():
        _errbar(axes[0], [r["V"] for r in rs], [r["ms"] for r in rs], color=_color(m),
                linestyle="-" if m in multi else "--", label=_method_k_label(m, multi, k))
    axes[0].set_xscale("log")
    axes[0].set_yscale("log")
    axes[0].set_xlabel("vocabulary size V")
    axes[0].set_ylabel("ms per call (median, min–max)")
    axes[0].set_title("verifier fast path, ms per call", fontsize=9)
    if fr_pts:
        ax = axes[1]
        for m, rs in fr_pts.items():
            _errbar(ax, [r["V"] for r in rs], [r["step_fraction"] for r in rs], scale=100.0, color=_color(m),
                    linestyle="-" if m in multi else "--", label=_method_k_label(m, multi, k))
        limits = sorted({g["limit"] for g in rec.goals if "target step" in g["goal"] and g.get("limit") is not None})
        for lim in limits:
            ax.axhline(100 * lim, color="grey", linestyle=":", linewidth=1)
            ax.annotate(f"goal {pct(lim)}", (1.0, 100 * lim), xycoords=("axes fraction", "data"), ha="right",
                        va="bottom", fontsize=7, color="grey")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("vocabulary size V")
        ax.set_ylabel("% of one target decode step")
        target = rec.summary.get("target") or "target"
        ax.set_title(f"share of a decode step of {target}", fontsize=8)
    for ax in axes:
        ax.grid(alpha=0.3, which="both")
    fig.suptitle(f"verifier cost vs V at K={k}, L={l_} (dashed: single-draft, K=1)"
                 + (f"\n{note}" if note else ""), fontsize=9)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 6), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    what = "ms per call" + (" and share of a target step" if fr_pts else " (no target step measured)")
    return f"verifier cost vs V at K={k}, L={l_}: {what}" + (f" ({note})" if note else "")


def _goal_lines(ax, rec: Record) -> None:
    """The record's target-step goals as vertical dotted lines on a share-of-a-step axis (in %)."""
    for lim in sorted({g["limit"] for g in rec.goals if "target step" in g["goal"] and g.get("limit") is not None}):
        ax.axvline(100 * lim, color="grey", linestyle=":", linewidth=1)
        ax.annotate(f"goal {pct(lim)}", (100 * lim, 1.0), xycoords=("data", "axes fraction"), ha="left", va="top",
                    fontsize=7, color="grey", rotation=90)


def _plot_verify_cost_bars(rec: Record, path: Path, k: int, l_: int, note: str, ms_pts: dict[str, list],
                           fr_pts: dict[str, list], multi: set[str]) -> str:
    """:func:`plot_verify_cost` where the record has one V: a bar per method (median, whiskers min-max), ms per
    call and share of a target step side by side."""
    plt = _plt()
    methods = list(ms_pts)
    labels = [_method_k_label(m, multi, k) for m in methods]
    V = ms_pts[methods[0]][0]["V"]
    n = 2 if fr_pts else 1
    fig, axes = plt.subplots(1, n, figsize=(5.2 * n, 0.45 * len(methods) + 1.8), squeeze=False)
    axes = axes[0]
    # (axis, points, field, scale, unit, label)
    panels = [(axes[0], ms_pts, "ms", 1.0, "", "ms per call (median, min–max)")]
    if fr_pts:
        panels.append((axes[1], fr_pts, "step_fraction", 100.0, "%", "% of one target decode step"))
    ys = list(range(len(methods)))[::-1]  # the first method on top
    for ax, points, field, scale, unit, xlabel in panels:
        for y, m in zip(ys, methods):
            if not points.get(m):
                continue
            spread_ = points[m][0][field]
            med = spread_["median"] * scale
            lo = (spread_["min"] if spread_.get("min") is not None else spread_["median"]) * scale
            hi = (spread_["max"] if spread_.get("max") is not None else spread_["median"]) * scale
            ax.barh(y, med, color=_color(m), alpha=0.85, hatch=None if m in multi else "//")
            ax.errorbar([med], [y], xerr=[[max(med - lo, 0.0)], [max(hi - med, 0.0)]], color="black", capsize=3,
                        linewidth=1)
            ax.annotate(f" {fmt(med)}{unit}", (med, y), va="center", fontsize=7)
        ax.set_yticks(ys)
        ax.set_yticklabels(labels, fontsize=8)
        ax.set_xscale("log")
        ax.set_xlabel(xlabel, fontsize=8)
        ax.grid(alpha=0.3, which="both", axis="x")
    if fr_pts:
        _goal_lines(axes[1], rec)
        axes[1].set_yticklabels([])
    where = verifier_blocks(rec)
    fig.suptitle(f"verifier cost at V={V}, K={k}, L={l_} on {where} (hatched: single-draft, K=1)"
                 + (f"\n{note}" if note else ""), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    what = "ms per call" + (" and share of a target step" if fr_pts else " (no target step measured)")
    return f"verifier cost at V={V}, K={k}, L={l_} on {where}: {what}" + (f" ({note})" if note else "")


def plot_e2e_speedup(rec: Record, path: Path) -> str:
    """Decode speedup over AR vs L, one line per (method, K), one panel per temperature.  -> note."""
    temps = sorted({r["temperature"] for r in rec.results})
    panels = []
    for T in temps:
        lines: dict[tuple[str, int], list[dict]] = {}
        for r in rec.results:
            if (r["temperature"] == T and r["method"] != "ar" and r["speedup"].get("n")
                    and r["speedup"].get("median") is not None):
                lines.setdefault((e2e_label(r), r["K"]), []).append(r)
        if lines:
            panels.append((T, lines))
    if not panels:
        raise _Skip("no measured speedup in the e2e record")
    plt = _plt()
    cols = min(len(panels), 2)
    nrows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(7.0 * cols, 4.6 * nrows + 1.0), squeeze=False)
    flat = [a for row in axes for a in row]
    for a in flat[len(panels):]:
        a.set_visible(False)
    Ks = sorted({K for _, ls in panels for (_, K) in ls})
    markers = "osD^vP*X"
    for ax, (T, lines) in zip(flat, panels):
        keys = sorted(lines, key=lambda mk: (_method_rank(mk[0]), mk[1]))
        for i, (m, K) in enumerate(keys):
            rs = sorted(lines[(m, K)], key=lambda r: r["L"])
            dodge = 1.0 + 0.012 * (i - (len(keys) - 1) / 2)  # keep the error bars of one L apart (log x)
            # the lean forward's line has hollow markers: same method colour, told apart from its panels twin
            hollow = {"markerfacecolor": "white"} if " lean" in m else {}
            _errbar(ax, [r["L"] * dodge for r in rs], [r["speedup"] for r in rs], color=_color(m),
                    linestyle="-" if K > 1 else "--", marker=markers[Ks.index(K) % len(markers)], label=f"{m} K={K}",
                    **hollow)
        ax.axhline(1.0, color="grey", linewidth=0.8)
        Ls = sorted({r["L"] for rs in lines.values() for r in rs})
        ax.set_xscale("log", base=2)
        ax.set_xticks(Ls)
        ax.set_xticklabels([str(x) for x in Ls])
        ax.minorticks_off()
        ax.set_xlabel("L (draft length)")
        ax.set_ylabel("decode speedup over AR (median, min–max)")
        ax.set_title(f"T = {fmt(T)} (grey line: AR)", fontsize=9)
        ax.grid(alpha=0.3)
    handles: dict[str, Any] = {}
    for ax in flat[:len(panels)]:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    n_lines = len(handles)
    fig.suptitle(f"end-to-end speedup vs L (dashed: K=1; hollow markers: the lean forward)\n{rec.summary.get('target') or 'target'} +"
                 f" {rec.summary.get('draft') or 'draft'}", fontsize=9)
    fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=min(n_lines, 5), fontsize=8,
               frameon=False)
    fig.tight_layout(rect=(0, (0.35 + 0.2 * math.ceil(n_lines / 5)) / fig.get_figheight(), 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"end-to-end speedup vs L, {n_lines} (method, K) line(s), T = {', '.join(fmt(T) for T, _ in panels)}"


def plot_e2e_split(rec: Record, path: Path) -> str:
    rows = [r for r in rec.results if isinstance(r.get("time_split"), dict)
            and any(r["time_split"].get(k) is not None for k in SPLIT_KEYS)]
    if not rows:
        raise _Skip("the e2e record has no time_split")
    temps = sorted({r["temperature"] for r in rows})
    plt = _plt()
    n_bars = max(sum(1 for r in rows if r["temperature"] == T) for T in temps)
    fig, axes = plt.subplots(len(temps), 1, figsize=(max(6.0, 0.42 * n_bars + 1.5), 3.6 * len(temps) + 0.8),
                             squeeze=False)
    for ax, T in zip(axes[:, 0], temps):
        rs = sorted([r for r in rows if r["temperature"] == T], key=_e2e_key)
        xs = list(range(len(rs)))
        bottom = [0.0] * len(rs)
        for k in SPLIT_KEYS:
            vals = [float(r["time_split"].get(k) or 0.0) for r in rs]
            ax.bar(xs, vals, bottom=bottom, color=SPLIT_COLORS[k], label=k, width=0.8)
            bottom = [b + v for b, v in zip(bottom, vals)]
        ax.set_xticks(xs)
        ax.set_xticklabels([e2e_label(r).upper() if r["method"] == "ar" else f"{e2e_label(r)} K{r['K']} L{r['L']}" for r in rs],
                           rotation=60, ha="right", fontsize=7)
        ax.set_ylim(0, 1.0)
        ax.set_ylabel("share of decode time")
        ax.set_title(f"T = {fmt(T)}", fontsize=9)
        ax.grid(alpha=0.3, axis="y")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    top = 1.0 - 0.6 / fig.get_figheight()  # room for the title and the legend (inches -> figure fraction)
    fig.suptitle("decode time split: draft / target / verify / other (share of decode time)", fontsize=9)
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 1.0 - 0.35 / fig.get_figheight()), ncol=4,
               fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, top))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"decode time split of {len(rows)} setting(s), T = {', '.join(fmt(T) for T in temps)}"


class _Skip(Exception):
    """A plot has nothing to draw (the message says why)."""
