"""The audit's outputs: ``audit.md`` (verdict, per-case table, where the bias sits), ``audit.csv`` (one row
per case), ``audit.json`` (everything) and ``audit.png`` (TV interval and accepted length per case)."""
from __future__ import annotations

import csv
import math
from dataclasses import asdict
from pathlib import Path

from mdv.audit.audit import AuditReport, CaseResult
from mdv.sweep.store import write_json_atomic

CSV_FIELDS = ("name", "V", "K", "L", "n_tokens", "status", "sequences", "looks", "p_value", "chi2_df",
              "worst_prefix_length", "tv", "tv_low", "tv_high", "detectable_tv", "mean_tau", "mean_tau_low",
              "mean_tau_high", "lp_valid", "lp_greedy", "exceeds_optimum", "top_excess_prefix", "seconds",
              "instances_per_second")


def _f(x: float, digits: int = 4) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def _p(x: float) -> str:
    return "—" if math.isnan(x) else f"{x:.2g}"


def _excess(c: CaseResult) -> str:
    if not c.excess:
        return "—"
    e = c.excess[0]
    return f"{list(e.prefix)}: {e.observed:.4f} vs {e.expected:.4f} (z = {e.z:.1f})"


def markdown(report: AuditReport) -> str:
    run = [c for c in report.cases if not c.skipped]
    refs = sorted({m for c in run for m in c.references})
    lines = [f"# Audit of `{report.sampler}`: **{report.verdict}**", "",
             report.summary() + ".", "",
             f"Each case runs the rule for N = L + 2 (or more) emitted tokens on up to {report.trials} independent"
             f" sequences and tests the laws of the first 1..N tokens against the target's exact law (chi-square; a"
             f" case stops as soon as it is decided). Family-wise error {report.alpha} for \"biased\" ({report.correction})."
             f" \"lossless\" means: no case rejected, and every case could detect any bias of TV >= {report.tv_resolution}"
             f" with probability >= 0.8. TV intervals: Weissman et al. (2003), level {1 - report.alpha:g}, conservative."
             f" E[tau]: the first iteration's mean accepted length with its interval, next to the exact LP optima"
             f" (LP-valid: per-iteration valid rules; LP-greedy: any lossless rule) and mdv's verifiers (exact)."
             f" Seed {report.seed}; {report.seconds:.0f} s.", "",
             "| case | V | K | L | status | sequences | p-value | TV [interval] | detectable TV | E[tau] [interval] |"
             " LP-valid | LP-greedy | most over-produced prefix |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in report.cases:
        if c.skipped:
            lines.append(f"| {c.name} | {c.V} | {c.K} | {c.L} | {c.status} | | | | | | | | |")
            continue
        flag = " **exceeds LP-greedy**" if c.exceeds_optimum else ""
        lines.append(f"| {c.name} | {c.V} | {c.K} | {c.L} | {c.status} | {c.sequences} | {_p(c.p_value)} |"
                     f" {_f(c.tv)} [{_f(c.tv_low)}, {_f(c.tv_high)}] | {_f(c.detectable_tv)} |"
                     f" {_f(c.mean_tau, 3)} [{_f(c.mean_tau_low, 3)}, {_f(c.mean_tau_high, 3)}]{flag} |"
                     f" {_f(c.lp_valid, 3)} | {_f(c.lp_greedy, 3)} | {_excess(c)} |")
    if refs:
        lines += ["", "## Exact E[tau] of mdv's verifiers on the same cases", "",
                  "| case | rule (measured) | " + " | ".join(refs) + " | LP-greedy |", "|---|---|" + "---|" * (len(refs) + 1)]
        for c in run:
            lines.append(f"| {c.name} | {_f(c.mean_tau, 3)} | " + " | ".join(_f(c.references.get(m, math.nan), 3) for m in refs)
                         + f" | {_f(c.lp_greedy, 3)} |")
    biased = report.biased_cases
    if biased:
        lines += ["", "## Where the bias is", "",
                  "The prefixes the rule emits more often than the target (frequency vs exact probability):", ""]
        for c in biased:
            lines.append(f"- {c.name} (the law of the first {c.worst_prefix_length} token(s) gave the smallest p-value): "
                         + "; ".join(f"{list(e.prefix)} {e.observed:.4f} vs {e.expected:.4f} (z = {e.z:.1f})" for e in c.excess))
    rate = [c.instances_per_second for c in run if not math.isnan(c.instances_per_second)]
    if rate:
        lines += ["", f"Sampler speed: {min(rate) / 1e6:.2f}–{max(rate) / 1e6:.2f} M instances/s (its own time, one process)."]
    return "\n".join(lines) + "\n"


def write(report: AuditReport, out_dir: Path) -> dict[str, Path]:
    """Write audit.md, audit.csv, audit.json and audit.png into ``out_dir``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"md": out_dir / "audit.md", "csv": out_dir / "audit.csv", "json": out_dir / "audit.json",
             "png": out_dir / "audit.png"}
    paths["md"].write_text(markdown(report))
    with open(paths["csv"], "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(CSV_FIELDS))
        w.writeheader()
        for c in report.cases:
            row = {k: getattr(c, k) for k in CSV_FIELDS if k not in ("top_excess_prefix", "instances_per_second")}
            row["top_excess_prefix"] = " ".join(map(str, c.excess[0].prefix)) if c.excess else ""
            row["instances_per_second"] = c.instances_per_second
            w.writerow(row)
    write_json_atomic(paths["json"], {"sampler": report.sampler, "verdict": report.verdict, "alpha": report.alpha,
                                      "tv_resolution": report.tv_resolution, "trials": report.trials,
                                      "seed": report.seed, "seconds": report.seconds, "correction": report.correction,
                                      "cases": [asdict(c) for c in report.cases]})
    plot(report, paths["png"])
    return paths


def plot(report: AuditReport, path: Path) -> None:
    """Left: TV from the target per case, with its interval and the detectable TV; right: the measured
    E[tau] with its interval against LP-greedy.  Biased cases in red."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run = [c for c in report.cases if not c.skipped]
    fig, (ax_tv, ax_tau) = plt.subplots(1, 2, figsize=(11, 0.32 * max(len(run), 4) + 1.6), sharey=True)
    ys = list(range(len(run)))
    for y, c in zip(ys, run):
        color = "tab:red" if c.status == "biased" else "tab:blue"
        ax_tv.errorbar(c.tv, y, xerr=[[c.tv - c.tv_low], [c.tv_high - c.tv]], fmt="o", color=color, capsize=3)
        ax_tv.plot(c.detectable_tv, y, marker="|", markersize=12, color="gray")
        ax_tau.errorbar(c.mean_tau, y, xerr=[[c.mean_tau - c.mean_tau_low], [c.mean_tau_high - c.mean_tau]], fmt="o",
                        color=color, capsize=3)
        if not math.isnan(c.lp_greedy):
            ax_tau.plot(c.lp_greedy, y, marker="D", color="black", markersize=5, linestyle="none")
    ax_tv.set_yticks(ys, [c.name for c in run], fontsize=7)
    ax_tv.set_xlabel("TV from the target (dot, interval); gray bar: detectable TV")
    ax_tau.set_xlabel("E[tau], first iteration (dot, interval); black diamond: LP-greedy")
    ax_tv.invert_yaxis()
    for ax in (ax_tv, ax_tau):
        ax.grid(alpha=0.3)
    fig.suptitle(f"audit of {report.sampler}: {report.verdict}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
