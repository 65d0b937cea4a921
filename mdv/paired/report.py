"""The paired report: Markdown + CSV tables, the verdict table (``claims.md``) and plots.

:func:`write_report` turns the records under ``<results_dir>/paired`` (and, for the speedup check, the
sweep cells under ``<results_dir>/cells``) into ``paired_report.md``, ``paired_claims.md``,
``paired_be.csv``, ``paired_verdicts.csv``, ``paired_optimality.csv``, ``paired_speedup.csv`` and the
plots ``paired_be_vs_k.png``, ``paired_be_vs_l.png``, ``paired_optimality_gap.png``,
``paired_sr_check.png``.
"""
from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from mdv.paired import analysis as A

#: Block lengths shown in the K plots and the Markdown tables.
SHOWN_L = (1, 2, 4, 8)
#: The goal of the speedup check: |predicted / measured − 1| within this for sd and spectr at L ≤ 4.
SR_GOAL = 0.10


def _f(x: Any, d: int = 3) -> str:
    try:
        x = float(x)
    except (TypeError, ValueError):
        return "—"
    return "—" if math.isnan(x) else f"{x:.{d}f}"


def _ci(mean: float, lo: float, hi: float, d: int = 3) -> str:
    if math.isnan(mean):
        return "—"
    if math.isnan(lo):
        return f"{mean:.{d}f}"
    return f"{mean:.{d}f} [{lo:.{d}f}, {hi:.{d}f}]"


def _write_csv(path: Path, rows: Sequence[dict[str, Any]]) -> Path:
    keys: list[str] = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()})
    tmp.replace(path)
    return path


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


_COLORS = {"sd": "#1f77b4", "spectr": "#ff7f0e", "bv": "#2ca02c", "gbv": "#d62728", "spectr_gbv": "#9467bd",
           "mdbv": "#8c564b"}


def _color(m: str) -> str:
    return _COLORS.get(m, "#7f7f7f")


def _band(ax, xs, rows, m, style="-"):
    ys = [r["be"] for r in rows]
    lo = [r["lo"] for r in rows]
    hi = [r["hi"] for r in rows]
    ax.plot(xs, ys, style, marker="o", ms=3, color=_color(m), label=A.label(m))
    ax.fill_between(xs, lo, hi, color=_color(m), alpha=0.18, linewidth=0)


def plot_be_vs_k(data: A.PairedData, rows: Sequence[dict[str, Any]], path: Path) -> Path:
    """Block efficiency vs K per method, one panel per L, 95% CI bands (single-draft methods: their K = 1
    value drawn across, dashed)."""
    plt = _plt()
    Ls = [L for L in SHOWN_L if L <= data.L_max] or [data.L_max]
    fig, axes = plt.subplots(1, len(Ls), figsize=(4.2 * len(Ls), 3.6), squeeze=False)
    Ks = list(range(1, data.K_max + 1))
    for ax, L in zip(axes[0], Ls):
        for m in data.methods:
            sel = [r for r in rows if r["method"] == m and r["L"] == L and r["dataset"] == "all"]
            sel.sort(key=lambda r: r["K"])
            if A.is_multi_draft(m):
                _band(ax, [r["K"] for r in sel], sel, m)
            else:
                _band(ax, Ks, sel * len(Ks), m, "--")
        ax.set_title(f"L = {L}")
        ax.set_xlabel("K (drafts)")
        ax.set_xticks(Ks)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("block efficiency 1 + E[tau] (per iteration)")
    axes[0][-1].legend(fontsize=7, loc="best")
    fig.suptitle(f"Paired exact-conditional block efficiency, T = {data.setting['temperature']:g},"
                 f" {data.n} contexts / {data.n_prompts} prompts (95% cluster-bootstrap CI)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_be_vs_l(data: A.PairedData, rows: Sequence[dict[str, Any]], K: int, path: Path) -> Path:
    """Block efficiency vs L per method at K (single-draft methods at K = 1), 95% CI bands."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for m in data.methods:
        k = A.k_of(m, K)
        sel = sorted([r for r in rows if r["method"] == m and r["K"] == k and r["dataset"] == "all"],
                     key=lambda r: r["L"])
        _band(ax, [r["L"] for r in sel], sel, m)
    ax.set_xlabel("L (draft length)")
    ax.set_ylabel("block efficiency 1 + E[tau]")
    ax.set_title(f"vs L at K = {K} (single-draft methods K = 1), T = {data.setting['temperature']:g}", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_optimality(data: A.PairedData, gaps: Sequence[dict[str, Any]], path: Path) -> Path:
    """Left: E[tau] at L = 1 vs K with the optimum α*_K; right: the gap α*_K − E[tau] with CI bands."""
    plt = _plt()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9.5, 3.6))
    Ks = list(range(1, data.K_max + 1))
    alpha = [float(np.mean(data.alpha[:, K - 1])) for K in Ks]
    ax1.plot(Ks, alpha, "k-", marker="s", ms=4, label="α*_K (optimum)")
    for m in data.methods:
        sel = sorted([g for g in gaps if g["method"] == m], key=lambda g: g["K"])
        if not sel:
            continue
        if A.is_multi_draft(m):
            ks = [g["K"] for g in sel]
            ax1.plot(ks, [g["etau"] for g in sel], marker="o", ms=3, color=_color(m), label=A.label(m))
            ax2.plot(ks, [g["gap"] for g in sel], marker="o", ms=3, color=_color(m), label=A.label(m))
            ax2.fill_between(ks, [g["lo"] for g in sel], [g["hi"] for g in sel], color=_color(m), alpha=0.18,
                             linewidth=0)
        else:
            ax1.plot([1], [sel[0]["etau"]], marker="x", ms=6, color=_color(m), linestyle="none", label=A.label(m))
    ax2.axhline(0.0, color="k", lw=0.8)
    ax1.set_xlabel("K")
    ax2.set_xlabel("K")
    ax1.set_ylabel("E[tau] at L = 1")
    ax2.set_ylabel("gap α*_K − E[tau]")
    ax1.set_xticks(Ks)
    ax2.set_xticks(Ks)
    ax1.grid(alpha=0.3)
    ax2.grid(alpha=0.3)
    ax1.legend(fontsize=7)
    fig.suptitle("L = 1: every K-draft verifier against the optimum α*_K(p, q) = min_H p(H) + 1 − q(H)^K", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_sr_check(check: Sequence[dict[str, Any]], path: Path) -> Path | None:
    """Predicted (x) vs measured (y) speedup of real generations, 95% CIs, the diagonal and ±10%; where the
    check's runs carry E[N | their output], a second panel: the prediction error per cell with its CI, from
    the trajectories and paired with the runs' own outputs."""
    pts = [c for c in check if not math.isnan(c["measured"]) and not math.isnan(c["predicted"])]
    if not pts:
        return None
    plt = _plt()
    paired = [c for c in pts if "given_output_error" in c]
    fig, axes = plt.subplots(1, 2 if paired else 1, figsize=(9.6 if paired else 4.8, 4.4), squeeze=False)
    ax = axes[0, 0]
    lim = [0.0, 1.15 * max(max(c["measured_hi"] if not math.isnan(c["measured_hi"]) else c["measured"],
                               c["predicted"]) for c in pts)]
    ax.plot(lim, lim, "k-", lw=0.8, label="measured = predicted")
    ax.plot(lim, [x * (1 + SR_GOAL) for x in lim], "k:", lw=0.8, label=f"±{SR_GOAL:.0%}")
    ax.plot(lim, [x * (1 - SR_GOAL) for x in lim], "k:", lw=0.8)
    for c in pts:
        m = c["method"]
        xerr = [[max(c["predicted"] - c["predicted_lo"], 0)], [max(c["predicted_hi"] - c["predicted"], 0)]] \
            if not math.isnan(c["predicted_lo"]) else None
        yerr = [[max(c["measured"] - c["measured_lo"], 0)], [max(c["measured_hi"] - c["measured"], 0)]] \
            if not math.isnan(c["measured_lo"]) else None
        ax.errorbar([c["predicted"]], [c["measured"]], xerr=xerr, yerr=yerr, fmt="o", ms=4, color=_color(m),
                    capsize=2)
        ax.annotate(f"{m} K{c['K']} L{c['L']}", (c["predicted"], c["measured"]), fontsize=6,
                    xytext=(3, 3), textcoords="offset points")
    ax.set_xlim(lim)
    ax.set_ylim(lim)
    ax.set_xlabel("predicted SR (paired E[1+tau] ÷ calibrated time)")
    ax.set_ylabel("measured SR (real generations)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    if paired:
        ax = axes[0, 1]
        ys = np.arange(len(paired))
        for y, c in zip(ys, paired):
            for dy, key, fmt, lab in ((0.15, "error", "o", "from the trajectories (range over the measured CI)"),
                                      (-0.15, "given_output_error", "s", "paired with the runs' own outputs")):
                e, lo, hi = c[key], c[f"{key}_lo"], c[f"{key}_hi"]
                ax.errorbar([100 * e], [y + dy], xerr=[[100 * max(e - lo, 0)], [100 * max(hi - e, 0)]], fmt=fmt,
                            ms=4, color=_color(c["method"]), mfc="white" if fmt == "s" else None, capsize=2,
                            label=lab if y == 0 else None)
        ax.axvspan(-100 * SR_GOAL, 100 * SR_GOAL, color="0.9", zorder=0, label=f"goal ±{SR_GOAL:.0%}")
        ax.axvline(0, color="k", lw=0.8)
        ax.set_yticks(ys, [f"{c['method']} K{c['K']} L{c['L']}" for c in paired], fontsize=7)
        ax.set_xlabel("SR prediction error (%), 95% CI")
        ax.set_ylim(-0.6, len(paired) - 0.4)
        ax.grid(alpha=0.3, axis="x")
        ax.legend(fontsize=6, loc="lower center", bbox_to_anchor=(0.5, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ----------------------------------------------------------------------------------------------- report
@dataclass
class PairedReportResult:
    paths: dict[str, Path]
    claims: list[A.ClaimResult]
    claims_markdown: str
    sr_check: list[dict[str, Any]] = field(default_factory=list)
    summary_lines: list[str] = field(default_factory=list)


def _claims_md(claims: Sequence[A.ClaimResult], data: A.PairedData, opts: A.Options) -> list[str]:
    lines = [f"Paired exact-conditional measurement: {data.n} contexts from {data.n_prompts} prompts"
             f" ({', '.join(data.dataset_names())}), T = {data.setting['temperature']:g}, K ≤ {data.K_max},"
             f" L ≤ {data.L_max}. Effects are paired differences of block efficiency 1 + E[tau] on the same drafts"
             f" (tokens per iteration), CIs from a bootstrap clustered by prompt; a claim resting on m comparisons"
             f" tests each at level 1 − {1 - opts.level:g}/m (Bonferroni: family-wise {opts.level:.0%}); *equal* = the"
             f" whole CI inside ±δ = {opts.delta:g}. Greedy block verifiers (gbv, mdbv) are measured with a fresh state:"
             f" the per-iteration quantity of the LPs and the paper ({A.LOSSY_MARK} = not lossless).", "",
             "| claim | verdict | decided by |", "|---|---|---|"]
    for c in claims:
        counts: dict[str, int] = {}
        for _, v in c.parts:
            counts[v.outcome] = counts.get(v.outcome, 0) + 1
        lines.append(f"| {c.statement} | **{c.outcome}** | "
                     + ", ".join(f"{n} {o}" for o, n in sorted(counts.items())) + " |")
    for c in claims:
        lines += ["", f"### {c.statement}: **{c.outcome}**", ""]
        if c.note:
            lines += [f"_{c.note}_", ""]
        lines += ["| comparison | effect [CI] | verdict |", "|---|---|---|"]
        lines += [f"| {w} | {_ci(v.effect.mean, v.effect.lo, v.effect.hi, 4)} | {v.text} |" for w, v in c.parts]
    return lines


def _be_table_md(data: A.PairedData, rows: Sequence[dict[str, Any]]) -> list[str]:
    Ls = [L for L in SHOWN_L if L <= data.L_max]
    lines = ["| method | K | " + " | ".join(f"L={L}" for L in Ls) + " |", "|---|---|" + "---|" * len(Ls)]
    by = {(r["method"], r["K"], r["L"]): r for r in rows if r["dataset"] == "all"}
    for m in data.methods:
        for K in range(1, (data.K_max if A.is_multi_draft(m) else 1) + 1):
            cells = [by[(m, K, L)] for L in Ls]
            lines.append(f"| {A.label(m)} | {K} | " + " | ".join(_ci(r["be"], r["lo"], r["hi"]) for r in cells) + " |")
    return lines


def _per_dataset_md(data: A.PairedData, rows: Sequence[dict[str, Any]], K: int, L: int) -> list[str]:
    ds = data.dataset_names()
    by = {(r["method"], r["K"], r["L"], r["dataset"]): r for r in rows}
    lines = ["| method | " + " | ".join(ds) + " | all |", "|---|" + "---|" * (len(ds) + 1)]
    for m in data.methods:
        k = A.k_of(m, K)
        vals = [by[(m, k, L, d)] for d in [*ds, "all"]]
        lines.append(f"| {A.label(m)} (K={k}) | " + " | ".join(_ci(r["be"], r["lo"], r["hi"], 2) for r in vals) + " |")
    return lines


def sr_check_rows(data: A.PairedData, cost: Any, measured: dict[tuple, A.MeasuredSpeedup], opts: A.Options,
                  given: dict[tuple, A.GivenOutput] | None = None) -> list[dict[str, Any]]:
    """Predicted vs measured SR for every (method, K, L) with real generations.  The prediction uses the
    paired contexts of the same prompts (dataset, prompt index, seed) the real generations timed, and cuts
    the last iteration of a run of the generations' length (:func:`mdv.paired.renewal.cap_factor` of the
    pooled per-iteration law; the factor is a plug-in, its own sampling error left out of the CI).  SR is
    split into tokens per iteration and time per iteration (AR steps) on both sides, so the error can be
    placed.

    For ``sd`` and ``spectr`` (:data:`mdv.paired.renewal.KSEQ_METHODS`), where every checked prompt's trajectory carries
    where their iterations end along it (``survival``), the tokens per iteration are instead the exact count
    of real iterations along the trajectories, n / mean E[N | x]
    (:func:`mdv.paired.renewal.iteration_starts`), and the time per iteration is the contexts' mean weighted
    by how many real iterations start in the stretch of text each stands for
    (:func:`mdv.paired.renewal.stretch_weights`; its tree is larger where drafts diverge): the per-context
    mean over-predicts real runs, whose iterations start more often where acceptance is low
    (``"tokens_from"``: ``"along trajectories"`` or ``"per-context mean"``; ``tokens_per_context`` keeps the
    latter, cut, for comparison).

    ``given`` (:func:`mdv.paired.analysis.check_given_output`): where the check's ``sd`` / ``spectr`` runs
    carry E[N | their own output], the same cost model is also evaluated on those very runs -- tokens from
    E[N | output], time per iteration from the prompt's contexts as above -- and compared with each run's
    measured SR (``given_output_*``: predicted, error, and the error's tokens and time parts, CIs from one
    bootstrap over prompts for both sides).  The prediction above and the measurement sample different
    outputs of each prompt, so their error carries the spread between outputs twice; paired with the runs'
    outputs, what is left is the model's error (the iteration count's conditional spread given the output,
    and the time per iteration)."""
    from mdv.paired.cost import iteration_time, predict_speedup
    from mdv.paired.renewal import KSEQ_METHODS, cap_factor, iteration_starts, stretch_weights
    from mdv.paired.stats import cluster_bootstrap, ratio_of_ratios

    out = []
    for (m, K, L), meas in sorted(measured.items()):
        if m not in data.methods or K > data.K_max or L > data.L_max:
            continue
        same = np.isin(data.clusters, sorted(meas.prompts))
        if not same.any():
            continue
        sub = data.subset(same)
        k = A.k_of(m, K)
        pe = predict_speedup(sub.be(m, k, L), sub.nodes[:, k - 1, L - 1], sub.clusters, method=m, K=k, L=L,
                             cost=cost, **opts.boot())
        p = {"sr": pe.mean, "lo": pe.lo, "hi": pe.hi}
        cut = cap_factor(sub.emitted_law(m, k, L), meas.n_tokens) if meas.n_tokens >= 1 else 1.0
        tokens = float(np.mean(sub.be(m, k, L)))
        time_ = float(np.mean(iteration_time(sub.nodes[:, k - 1, L - 1], method=m, K=k, L=L, cost=cost)))
        e = meas.sr
        sr, lo, hi, tokens_pred, source = p["sr"] * cut, p["lo"] * cut, p["hi"] * cut, tokens * cut, "per-context mean"
        clusters = sorted(set(sub.clusters))
        paired_with_runs: dict[str, Any] = {}
        if m in KSEQ_METHODS and meas.n_tokens >= 1 and all(c in sub.survival for c in clusters):
            n_c = np.array([min(meas.n_tokens, sub.survival[c].shape[0]) for c in clusters], dtype=np.float64)
            iters, t_c = np.zeros(len(clusters)), np.zeros(len(clusters))  # [prompts] E[N | x], AR steps
            for i, (c, n) in enumerate(zip(clusters, n_c)):
                if n == 0:  # pragma: no cover - every trajectory has a token unless EOS came first
                    continue
                starts = iteration_starts(sub.survival[c][:int(n)], L, k)  # [n] P(an iteration starts at t | x)
                here = (sub.clusters == c) & (sub.offsets < n)
                t_ctx = iteration_time(sub.nodes[here, k - 1, L - 1], method=m, K=k, L=L, cost=cost)  # [contexts]
                w = stretch_weights(starts, sub.offsets[here])  # real iterations starting in its stretch
                iters[i] = starts.sum()
                t_c[i] = float(np.sum(w * t_ctx) / np.sum(w)) if np.sum(w) > 0 else float(np.mean(t_ctx))
            time_ = float(np.sum(iters * t_c) / np.sum(iters))
            est = cluster_bootstrap(n_c, np.array(clusters), ratio_to=iters * t_c, **opts.boot())
            sr, lo, hi, source = est.mean, est.lo, est.hi, "along trajectories"
            tokens_pred = float(n_c.sum() / iters.sum())
            go = (given or {}).get((m, K, L))
            t_of = dict(zip(clusters, t_c))
            if go is not None and len(go.n) and all(c in t_of for c in go.clusters):
                t_g = np.array([t_of[c] for c in go.clusters])  # [generations] predicted AR steps per iteration
                b = opts.boot()
                sr_err = ratio_of_ratios(go.n, go.iterations * t_g, go.n * go.ar_per_token, go.decode_s, go.clusters, **b)
                tok_err = cluster_bootstrap(go.calls, go.clusters, ratio_to=go.iterations, **b)  # pred/meas tokens/iter
                time_err = ratio_of_ratios(go.iterations * t_g, go.iterations, go.decode_s, go.calls * go.ar_per_token,
                                           go.clusters, **b)
                paired_with_runs = {
                    "given_output_predicted": float(go.n.sum() / np.sum(go.iterations * t_g)),
                    "given_output_prompts": sr_err.n_clusters, "given_output_runs": int(len(go.n)),
                    **{f"given_output_{name}{suffix}": v - 1.0 for name, e in
                       (("error", sr_err), ("tokens_error", tok_err), ("time_error", time_err))
                       for suffix, v in (("", e.mean), ("_lo", e.lo), ("_hi", e.hi))}}
        out.append({"method": m, "K": K, "L": L, "predicted": sr, "predicted_lo": lo,
                    "predicted_hi": hi, "predicted_per_iteration": p["sr"], "cap_factor": cut,
                    "tokens_from": source, "tokens_per_context": tokens * cut,
                    "n_tokens": meas.n_tokens, "measured": e.mean, "measured_lo": e.lo, "measured_hi": e.hi,
                    "prompts": e.n_clusters, "contexts": sub.n,
                    "error": sr / e.mean - 1.0 if e.mean > 0 else float("nan"),
                    "error_lo": sr / e.hi - 1.0 if e.hi > 0 else float("nan"),
                    "error_hi": sr / e.lo - 1.0 if e.lo > 0 else float("nan"),
                    "tokens_predicted": tokens_pred, "tokens_measured": meas.tokens_per_iteration,
                    "time_predicted": time_, "time_measured": meas.time_per_iteration,
                    "goal": m in ("sd", "spectr") and L <= 4, **paired_with_runs})
    return out


def _given_output_md(check: Sequence[dict[str, Any]]) -> list[str]:
    """The check's rows evaluated on the runs' own outputs (``given_output_*`` of :func:`sr_check_rows`)."""
    rows = [c for c in check if "given_output_error" in c]
    if not rows:
        return []

    def err(c: dict[str, Any], name: str) -> str:
        return (f"{c[f'given_output_{name}']:+.1%} [{c[f'given_output_{name}_lo']:+.1%},"
                f" {c[f'given_output_{name}_hi']:+.1%}]")

    md = ["", "#### Paired with the runs' own outputs", "",
          "The prediction above and the real runs sample different outputs of each prompt, so its error carries"
          " the spread between outputs of both. Here the same cost model is evaluated on the very outputs the"
          " runs emitted: tokens per iteration n / E[N | output] (`mdv.paired.renewal`, (4), from one target and"
          " one draft pass over each output), time per iteration from the prompt's contexts as above; the CIs"
          " resample prompts once for both sides. What is left is the model's own error: the tokens part checks"
          " the iteration count (its expectation is exact), the time part the calibration.", "",
          "| method | K | L | predicted SR | measured SR | runs | error [95% CI] | tokens part | time part |"
          " in goal? |", "|---|---|---|---|---|---|---|---|---|---|"]
    for c in rows:
        ok = "—" if not c["goal"] else ("yes" if abs(c["given_output_error"]) <= SR_GOAL else "**no**")
        md.append(f"| {A.label(c['method'])} | {c['K']} | {c['L']} | {c['given_output_predicted']:.2f} |"
                  f" {c['measured']:.2f} | {c['given_output_runs']} | {err(c, 'error')} | {err(c, 'tokens_error')} |"
                  f" {err(c, 'time_error')} | {ok} |")
    return md


def resolve_cost_profile(name: str) -> Path:
    """A cost profile by name (``mdv/conf/cost/<name>.yaml``) or path."""
    p = Path(name)
    if p.suffix in (".yaml", ".yml") or p.exists():
        return p
    return Path(__file__).resolve().parents[1] / "conf" / "cost" / f"{name}.yaml"


def write_report(results_dir: str | Path, out_dir: str | Path, *, opts: A.Options | None = None,
                 headline_K: int = 3, headline_L: int = 4, cells: Sequence[Any] = (),
                 cost_profiles: Sequence[str] = ("gpu_like",),
                 warn: Callable[[str], None] | None = None) -> PairedReportResult | None:
    """Write the paired report for ``results_dir`` into ``out_dir``; None when there are no paired records.
    ``cells``: loaded sweep cells (``mdv.analysis.Cell``) for the measured-speedup check."""
    from mdv.paired.cost import Calibration, load_cost_profile
    from mdv.paired.records import load_records, paired_dir

    opts = opts or A.Options()
    warn = warn or (lambda s: None)
    records = load_records(results_dir, warn)
    if not records:
        return None
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    groups = A.collect(records)
    paths: dict[str, Path] = {}
    md = ["# Paired exact-conditional measurement", ""]
    claims_md: list[str] = ["# Claims, decided on real models", ""]
    all_claims: list[A.ClaimResult] = []
    be_all, verdict_all, gap_all, sr_all, check_all = [], [], [], [], []
    summary: list[str] = []
    from mdv.paired.records import calibration_file
    from mdv.paired.speedcheck import check_file, read_check

    checks: dict[str, Any] = {}  # drafter -> its speed check
    calibrations: dict[str, Calibration] = {}  # drafter -> the calibration that timed it
    for drafter in sorted({str(g.setting.get("drafter", "model")) for g in groups}):
        checks[drafter] = read_check(paired_dir(results_dir) / check_file(drafter))
        calib_path = paired_dir(results_dir) / calibration_file(drafter)
        if calib_path.exists():
            try:
                cal = Calibration.from_dict(json.loads(calib_path.read_text(encoding="utf-8")))
            except Exception as e:  # a report must still come out; say why the prediction is missing
                warn(f"calibration {calib_path} unreadable ({type(e).__name__}: {e}); no calibrated SR prediction")
                continue
            if cal.drafter["name"] == drafter:
                calibrations[drafter] = cal
            else:  # a file renamed by hand: it prices another drafter's call
                warn(f"calibration {calib_path} timed the {cal.drafter['name']} drafter, not {drafter}; no"
                     " calibrated SR prediction for it")
    profiles = []
    for name in cost_profiles:
        try:
            profiles.append(load_cost_profile(resolve_cost_profile(name)))
        except Exception as e:
            warn(f"cost profile {name!r}: {e}")
    for gi, data in enumerate(groups, 1):
        K, L = A.headline(data, headline_K, headline_L)
        suffix = "" if len(groups) == 1 else f"_{gi}"
        rows = A.be_rows(data, opts)
        claims = A.all_claims(data, opts, K, L)
        gaps = A.optimality_gaps(data, opts)
        all_claims += claims
        be_all += [{**r, "setting": gi} for r in rows]
        for c in claims:
            verdict_all += [{**r, "setting": gi} for r in c.to_rows()]
        gap_all += [{**g, "setting": gi} for g in gaps]
        drafter = data.setting.get("drafter", "model")
        title = (f"models {data.setting['models']}" + (f", drafter {drafter}" if drafter != "model" else "")
                 + f", T = {data.setting['temperature']:g}, K ≤ {data.K_max}, L ≤ {data.L_max}")
        md += [f"## Setting {gi}: {title}", "",
               f"{data.n_records} prompts, {data.n} contexts ({', '.join(data.dataset_names())}); target {data.models.get('target')},"
               f" draft {data.models.get('draft')}.", ""]
        t = data.timing
        laws = {k.split('/', 1)[1]: v for k, v in t.items() if k.startswith("laws/")}
        total = t.get("wall_s", float("nan"))
        parts = {"trajectories (AR)": t.get("trajectory_s", 0.0), "prefill": t.get("prefill_s", 0.0),
                 "draft": t.get("draft_s", 0.0), "target tree pass": t.get("target_s", 0.0),
                 "verifier laws": sum(laws.values()), "α* (L = 1 optimum)": t.get("optimum_s", 0.0)}
        md += [f"Time: {total:.1f} s in all, {data.n / total:.2f} contexts/s; shares: "
               + ", ".join(f"{k} {v / total:.0%}" for k, v in parts.items())
               + "; laws per verifier (s): " + ", ".join(f"{k} {v:.1f}" for k, v in laws.items()) + ".", ""]
        md += ["### Block efficiency 1 + E[tau] per iteration (all datasets)", "",
               "Mean over contexts [95% CI, bootstrap clustered by prompt]; single-draft methods run at K = 1.", ""]
        md += _be_table_md(data, rows)
        md += ["", f"### Per dataset at K = {K}, L = {L}", ""] + _per_dataset_md(data, rows, K, L)
        md += ["", "### L = 1 optimality gap α*_K − E[tau]", "",
               "α*_K(p, q) = min_H [p(H) + 1 − q(H)^K] at each context (O(V log V) sorted-prefix min-cut, checked"
               " against the 2^V enumeration in the tests): the best any K-draft verifier can do at L = 1.", "",
               "| K | α*_K | " + " | ".join(A.label(m) for m in data.methods) + " |",
               "|---|---|" + "---|" * len(data.methods)]
        for k in range(1, data.K_max + 1):
            cells_k = []
            for m in data.methods:
                g = next((g for g in gaps if g["method"] == m and g["K"] == k), None)
                cells_k.append("—" if g is None else f"{_f(g['etau'])} (gap {_ci(g['gap'], g['lo'], g['hi'], 4)})")
            opt = next(g for g in gaps if g["K"] == k and g["method"].startswith("α*"))
            md.append(f"| {k} | {_f(opt['etau'])} | " + " | ".join(cells_k) + " |")
        paths[f"be_vs_k{suffix}"] = plot_be_vs_k(data, rows, out / f"paired_be_vs_k{suffix}.png")
        paths[f"be_vs_l{suffix}"] = plot_be_vs_l(data, rows, K, out / f"paired_be_vs_l{suffix}.png")
        paths[f"optimality_gap{suffix}"] = plot_optimality(data, gaps, out / f"paired_optimality_gap{suffix}.png")

        # speedups: calibrated prediction, profiles, check against real generations
        md += ["", "### Speedup over AR, predicted", "",
               "Per iteration at the measured contexts (positions taken uniformly): the quantity the verifiers'"
               " theory compares. Real runs start more iterations where acceptance is low, so for them this"
               " over-predicts where acceptance varies along the text; the check below counts `sd` and `spectr`"
               " iterations along the trajectories instead.", ""]
        costs: list[tuple[str, Any]] = []
        # a calibration prices the drafter it timed; a cost profile's c is a draft model's step
        cal, check_data = calibrations.get(drafter), checks.get(drafter)
        if cal is not None:
            costs.append(("calibrated (this machine)", cal))
        if drafter == "model":
            costs += [(f"profile {p.name}", p) for p in profiles]
        elif profiles:
            md.append(f"Cost profiles price a draft model's step (c); not applied to the {drafter} drafter.")
        if not costs:
            md.append("No calibration and no cost profile that applies: no prediction.")
        for cname, cost in costs:
            try:
                pred = A.predicted_speedups(data, cost, opts, Ls=[L_ for L_ in SHOWN_L if L_ <= data.L_max])
            except Exception as e:
                warn(f"speedup prediction with {cname} failed: {e}")
                continue
            sr_all += [{**r, "cost": cname, "setting": gi} for r in pred]
            best = max(pred, key=lambda r: r["sr"])
            md.append(f"- {cname}: best {A.label(best['method'])} K={best['K']} L={best['L']}: SR"
                      f" {_ci(best['sr'], best['lo'], best['hi'], 2)}; at K={K}, L={L}: "
                      + ", ".join(f"{A.label(r['method'])} {_f(r['sr'], 2)}" for r in pred
                                  if r["K"] == A.k_of(r["method"], K) and r["L"] == L))
        if cal is not None:
            Lc = max(int(k.split("/")[1]) for k in cal.propose_s) if cal.propose_s else 0
            md.append(f"- calibration: AR step {cal.ar_step_s * 1e3:.1f} ms; target tree pass "
                      + ", ".join(f"{n} nodes {s * 1e3:.1f} ms" for n, s in sorted(cal.target_s.items()))
                      + (f"; the {drafter} drafter's call at L = {Lc} (K blocks) " + ", ".join(
                          f"K={k} {cal.propose_s[f'{k}/{Lc}'] * 1e3:.1f} ms" for k in range(1, cal.K_max + 1)
                          if f"{k}/{Lc}" in cal.propose_s) if cal.propose_s else
                         "; draft step (K rows) " + ", ".join(f"K={k} {s * 1e3:.1f} ms"
                                                              for k, s in sorted(cal.draft_step_s.items()))))
        if check_data is not None and A.check_matches(check_data, data.setting):
            measured = A.check_speedups(check_data, opts)
            given = A.check_given_output(check_data)
            real_be = A.check_block_efficiency(check_data, opts)
            real_datasets = sorted({str(g["dataset"]) for g in check_data.get("generations", [])})
            source = (f"the speed check (`paired/{check_file(drafter)}`: AR and every cell interleaved per prompt,"
                      f" {check_data['settings']['n_tokens']} tokens each, EOS ignored)")
        else:
            measured = A.measured_speedups(cells, data.setting, opts) if cells else {}
            given = {}
            real_be = A.measured_block_efficiency(cells, data.setting, opts) if cells else {}
            real_datasets = sorted(A.cell_datasets(cells)) if cells else []
            source = "the sweep's cells (run one after the other: a load change between cells reads as a speedup)"
        same = np.isin(data.dataset_keys, real_datasets)
        check = sr_check_rows(data, cal, measured, opts, given) if cal is not None and measured else []
        check_all += [{**c, "setting": gi} for c in check]
        if real_be and same.any():
            sub = data.subset(same)
            md += ["", "### Block efficiency: paired (fresh state) next to real generations", "",
                   f"Real generations: {source}, on {', '.join(real_datasets)}. Real runs cut the last iteration"
                   " at max_new_tokens and carry gbv/mdbv's target adjustment across iterations; the paired value"
                   " is the per-iteration, fresh-state 1 + E[tau] on those datasets.", "",
                   "| method | K | L | paired 1 + E[tau] | real generations |", "|---|---|---|---|---|"]
            for (m, k, l), e in sorted(real_be.items()):
                if m in sub.methods and k <= sub.K_max and l <= sub.L_max:
                    pe = A.be_estimate(sub, m, k, l, opts)
                    md.append(f"| {A.label(m)} | {k} | {l} | {_ci(pe.mean, pe.lo, pe.hi)} | {_ci(e.mean, e.lo, e.hi)} |")
        md += ["", "### Speedup check: predicted vs measured on real generations", ""]
        if check:
            md += [f"Measured: {source}. Predicted: the paired contexts of the same prompts. Tokens per iteration"
                   " *along trajectories* (`sd`, `spectr`): the exact count of real iterations along the prompts' target"
                   " trajectories, n / E[N | x] (`mdv.paired.renewal`, (4)); *per-context mean*: the mean of"
                   " 1 + E[tau] over the contexts with the last iteration of a run of that length cut (× the"
                   " cut factor), which over-predicts real runs where acceptance varies along the text (their"
                   " iterations start more often where it is low; the column in brackets is that mean). Along"
                   " trajectories the time per iteration weighs each context by how many real iterations start"
                   " in the stretch of text it stands for (from its position to the next context's)."
                   " SR = tokens per iteration ÷ time per iteration (in AR steps), both sides; the error's range"
                   " is over the measured SR's CI.", "",
                   "| method | K | L | predicted SR | measured SR | prompts | error [range] | tokens predicted |"
                   " cut factor | tokens/iter pred. / meas. | time/iter pred. / meas. | in goal? |",
                   "|---|---|---|---|---|---|---|---|---|---|---|---|"]
            for c in check:
                ok = "—" if not c["goal"] else ("yes" if abs(c["error"]) <= SR_GOAL else "**no**")
                md.append(f"| {A.label(c['method'])} | {c['K']} | {c['L']} |"
                          f" {_ci(c['predicted'], c['predicted_lo'], c['predicted_hi'], 2)} |"
                          f" {_ci(c['measured'], c['measured_lo'], c['measured_hi'], 2)} | {c['prompts']} |"
                          f" {c['error']:+.1%} [{c['error_lo']:+.0%}, {c['error_hi']:+.0%}] | {c['tokens_from']} |"
                          f" {c['cap_factor']:.3f} | {c['tokens_predicted']:.2f}"
                          + (f" ({c['tokens_per_context']:.2f})" if c["tokens_from"] != "per-context mean" else "")
                          + f" / {c['tokens_measured']:.2f} |"
                          f" {c['time_predicted']:.2f} / {c['time_measured']:.2f} | {ok} |")
            goal = [c for c in check if c["goal"]]
            if goal:
                worst = max(abs(c["error"]) for c in goal)
                line = (f"SR prediction error, sd and spectr at L ≤ 4: max |error| {worst:.1%} over {len(goal)}"
                        f" configurations (goal ≤ {SR_GOAL:.0%}: {'met' if worst <= SR_GOAL else 'missed'})")
                md += ["", line + "."]
                summary.append(line)
            md += _given_output_md(check)
            paired_goal = [c for c in goal if "given_output_error" in c]
            if paired_goal:
                worst = max(abs(c["given_output_error"]) for c in paired_goal)
                inside = sum(-SR_GOAL <= c["given_output_error_lo"] and c["given_output_error_hi"] <= SR_GOAL
                             for c in paired_goal)
                line = (f"SR prediction error paired with the runs' own outputs, sd and spectr at L ≤ 4: max |error|"
                        f" {worst:.1%} over {len(paired_goal)} configurations (goal ≤ {SR_GOAL:.0%}:"
                        f" {'met' if worst <= SR_GOAL else 'missed'}; CI inside ±{SR_GOAL:.0%} in {inside} of"
                        f" {len(paired_goal)})")
                md += ["", line + "."]
                summary.append(line)
            p = plot_sr_check(check, out / f"paired_sr_check{suffix}.png")
            if p is not None:
                paths[f"sr_check{suffix}"] = p
        else:
            md.append("No real generations with a calibrated prediction to compare (run the main job, or enable"
                      " `paired.speed_check`).")
        claims_md += [f"## Setting {gi}: {title}", ""] + _claims_md(claims, data, opts) + [""]
        md += ["", "### Verdicts", "", "See `paired_claims.md` (and `claims.md`). Summary:", ""]
        md += [f"- {c.statement}: **{c.outcome}**" for c in claims]
        plots = [p for k, p in paths.items() if str(p).endswith(f"{suffix}.png") and k.endswith(suffix)]
        md += ["", "Plots: " + ", ".join(f"`{p.name}`" for p in plots), ""]
        summary += [f"{c.statement}: {c.outcome}" for c in claims]
    paths["be_csv"] = _write_csv(out / "paired_be.csv", be_all)
    paths["verdicts_csv"] = _write_csv(out / "paired_verdicts.csv", verdict_all)
    paths["optimality_csv"] = _write_csv(out / "paired_optimality.csv", gap_all)
    if sr_all:
        paths["speedup_csv"] = _write_csv(out / "paired_speedup.csv", sr_all + [{**c, "cost": "check"} for c in check_all])
    claims_text = "\n".join(claims_md) + "\n"
    paths["claims"] = out / "paired_claims.md"
    paths["claims"].write_text(claims_text, encoding="utf-8")
    paths["report"] = out / "paired_report.md"
    paths["report"].write_text("\n".join(md) + "\n", encoding="utf-8")
    return PairedReportResult(paths, all_claims, claims_text, check_all, summary)


__all__ = ["PairedReportResult", "plot_be_vs_k", "plot_be_vs_l", "plot_optimality", "plot_sr_check",
           "resolve_cost_profile", "sr_check_rows", "write_report"]


def report_options(records_dir: str | Path) -> tuple[A.Options, dict[str, Any]]:
    """The statistics options and headline settings the run stored in its records (defaults otherwise)."""
    from mdv.paired.records import load_records

    recs = load_records(records_dir)
    a = recs[0].get("analysis", {}) if recs else {}
    opts = A.Options(level=float(a.get("level", 0.95)), n_boot=int(a.get("n_boot", 2000)),
                     delta=float(a.get("delta", 0.01)))
    return opts, {"headline_K": int(a.get("headline_K", 3)), "headline_L": int(a.get("headline_L", 4)),
                  "cost_profiles": list(a.get("cost_profiles", ["gpu_like"]))}


def analyze_results(results_dir: str | Path, out_dir: str | Path | None = None,
                    warn: Callable[[str], None] | None = None, delta: float | None = None) -> dict[str, Any]:
    """The whole report of a results folder: the sweep cells' tables (:func:`mdv.analysis.analyze`, when
    there are cells) and the paired report (when there are paired records).  With paired records the
    top-level ``claims.md`` holds the paired verdicts first, then the timing-based claims of the cells.
    Raises :class:`mdv.analysis.AnalysisError` when there is neither."""
    import sys

    from mdv.analysis import AnalysisError, analyze

    warn = warn or (lambda line: print(line, file=sys.stderr))
    if delta is not None and not (math.isfinite(delta) and delta > 0):
        raise AnalysisError(f"--delta must be a finite number > 0 (the equivalence margin, tokens per iteration);"
                            f" got {delta}")
    out = Path(out_dir) if out_dir is not None else Path(results_dir) / "analysis"
    cells_result = None
    try:
        cells_result = analyze(results_dir, out, warn)
    except AnalysisError as e:
        from mdv.paired.records import load_records

        if not load_records(results_dir):
            raise AnalysisError(f"{e}; and no paired records under {Path(results_dir) / 'paired'}") from None
    opts, head = report_options(results_dir)
    if delta is not None:
        opts = A.Options(level=opts.level, n_boot=opts.n_boot, seed=opts.seed, delta=delta)
    paired = write_report(results_dir, out, opts=opts, cells=cells_result.loaded.ok if cells_result else (),
                          warn=warn, **head)
    if paired is not None:
        text = paired.claims_markdown
        if cells_result is not None:
            cells_claims = cells_result.paths["claims"].read_text(encoding="utf-8")
            text += ("\n# Timing-based claims from the real generations (sweep cells)\n\n"
                     "Wall-clock speedups of a few short generations: noisy by nature; the decisive verdicts are"
                     " the paired ones above.\n\n" + cells_claims.split("\n", 1)[1])
            report = cells_result.paths["report"]
            report.write_text(report.read_text(encoding="utf-8") + "\n## Paired measurement\n\nSee"
                              " `paired_report.md` and the paired verdicts in `claims.md`.\n", encoding="utf-8")
        (out / "claims.md").write_text(text, encoding="utf-8")
    return {"cells": cells_result, "paired": paired, "out": out}
