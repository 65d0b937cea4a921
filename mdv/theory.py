"""Exact theory tables: E[tau] of every verifier next to the LP optima and the paper's claimed value,
with each method's exactness verdict, on random toy pairs (the engine of ``experiments/theory``).

Everything here is exact (enumeration and LPs), so a table is a statement about the algorithms, not a
sample: a researcher checks the optimality and monotonicity claims of SpecTr-GBV in minutes.
"""
from __future__ import annotations

import csv
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable

import numpy as np
from tqdm import tqdm

from mdv.errors import InvalidInputError
from mdv.models.sampling import SamplingConfig
from mdv.oracle import exact_law, expected_accepted, random_toy_model, target_law, total_variation
from mdv.oracle.lp import lp_optimum, paper_claimed_expected_accepted
from mdv.verify.registry import VERIFIERS


def lp_bound_kind(method: str) -> str:
    """"lp_valid" for a lossless rule that carries no state (every iteration is valid on its own: sd, bv,
    spectr, mpbv), else "lp_greedy" (greedy rules, and lossy ones, are held to the larger optimum)."""
    cls = VERIFIERS[method]
    return "lp_valid" if cls.lossless and not cls.stateful else "lp_greedy"


#: Above this TV a method is reported as biased (exact enumeration reaches ~1e-15 for exact methods).
EXACT_TV = 1e-9


@dataclass
class TheoryConfig:
    """Grid of the theory tables (Hydra schema: mdv/conf/theory.yaml)."""

    seeds: list[int] = field(default_factory=lambda: [0, 1])
    vocab_sizes: list[int] = field(default_factory=lambda: [3, 2])
    K: list[int] = field(default_factory=lambda: [1, 2, 3, 4])
    L: list[int] = field(default_factory=lambda: [1, 2, 3])
    temperatures: list[float] = field(default_factory=lambda: [1.0, 0.5])
    methods: list[str] = field(default_factory=lambda: list(VERIFIERS))  # every registered verifier
    zero_prob: float = 0.2
    max_tuples: int = 4096  # largest V^(K·L) enumerated for E[tau] and the LPs
    tv_max_tuples: int = 729  # exactness verdicts (laws over L+2 tokens) where V^(K·L) <= this
    #: off the grid: this many random toys (V = 3 at L = 2, 3; K = 2, 3) on which ``dominance_method`` is held
    #: to the best of ``dominance_peers`` (:func:`random_toy_dominance`); 0 = skip
    random_toys: int = 0
    random_toys_seed: int = 0
    dominance_method: str = "select_gbv"
    dominance_peers: list[str] = field(default_factory=lambda: ["spectr", "mdbv", "mpbv"])

    def validate(self) -> None:
        unknown = [m for m in self.methods if m not in VERIFIERS]
        if unknown:
            raise InvalidInputError(f"unknown method(s) {unknown}; valid methods are: {', '.join(sorted(VERIFIERS))}")
        for name in ("K", "L", "vocab_sizes"):
            values = getattr(self, name)
            if not values or any(int(v) < 1 for v in values):
                raise InvalidInputError(f"theory.{name} must be a non-empty list of integers >= 1; got {values}")
        if any(t < 0 for t in self.temperatures):
            raise InvalidInputError(f"theory.temperatures must be >= 0; got {self.temperatures}")
        if self.random_toys < 0:
            raise InvalidInputError(f"theory.random_toys must be >= 0 (0 skips the off-grid check); got {self.random_toys}")
        unknown = [m for m in [self.dominance_method, *self.dominance_peers] if m not in VERIFIERS]
        if self.random_toys and (unknown or not self.dominance_peers):
            raise InvalidInputError(f"theory.dominance_method / dominance_peers must name registered verifiers (at least"
                                    f" one peer); got unknown {unknown or 'none'} with peers {self.dominance_peers};"
                                    f" valid: {', '.join(sorted(VERIFIERS))}")


@dataclass
class Row:
    seed: int
    V: int
    temperature: float
    K: int
    L: int
    method: str
    expected_accepted: float
    tv: float  # NaN where the verdict was not computed (too large)
    lp_valid: float
    lp_greedy: float
    paper_claim: float


def vocab_for(cfg: TheoryConfig, K: int, L: int) -> int | None:
    """The largest configured vocabulary whose V^(K·L) draft tuples fit ``max_tuples``."""
    fits = [V for V in cfg.vocab_sizes if V ** (K * L) <= cfg.max_tuples]
    return max(fits) if fits else None


def _lp(target, draft, K: int, L: int, kind: str, T: float) -> float:
    try:
        return lp_optimum(target, draft, K, L, kind, temperature=T)
    except InvalidInputError:  # above the LP's size ceiling
        return math.nan


def compute(cfg: TheoryConfig, progress: bool = True) -> list[Row]:
    cfg.validate()
    cells = [(s, T, L, K) for s in cfg.seeds for T in cfg.temperatures for L in cfg.L for K in cfg.K]
    rows: list[Row] = []
    for seed, T, L, K in tqdm(cells, desc="theory cells", disable=not progress):
        V = vocab_for(cfg, K, L)
        if V is None:
            continue
        target = random_toy_model(V, 100 + seed, zero_prob=cfg.zero_prob, name=f"target{seed}")
        draft = random_toy_model(V, 200 + seed, zero_prob=cfg.zero_prob, name=f"draft{seed}")
        lp_valid = _lp(target, draft, K, L, "valid", T)
        lp_greedy = _lp(target, draft, K, L, "greedy", T)
        claim = (paper_claimed_expected_accepted(target, draft, K, L, sampling=SamplingConfig(T)) if T > 0
                 else math.nan)
        reference_law = None
        for method in cfg.methods:
            if K > 1 and not VERIFIERS[method].multi_draft:
                continue
            e_tau = expected_accepted(method, target, draft, K, L, temperature=T)
            tv = math.nan
            if V ** (K * L) <= cfg.tv_max_tuples:
                reference_law = reference_law or target_law(target, L + 2, temperature=T)
                tv = total_variation(exact_law(method, target, draft, K, L, L + 2, temperature=T), reference_law)
            rows.append(Row(seed, V, T, K, L, method, e_tau, tv, lp_valid, lp_greedy, claim))
    return rows


def monotonicity_violations(rows: Iterable[Row], tol: float = 1e-12) -> list[dict]:
    """Every (method, seed, T, L, K) where E[tau] at K is below E[tau] at the previous K measured."""
    by_series: dict[tuple, list[Row]] = {}
    for r in rows:
        by_series.setdefault((r.method, r.seed, r.V, r.temperature, r.L), []).append(r)
    out = []
    for (method, seed, V, T, L), series in sorted(by_series.items()):
        series.sort(key=lambda r: r.K)
        for a, b in zip(series, series[1:]):
            if b.expected_accepted < a.expected_accepted - tol:
                out.append(dict(method=method, seed=seed, V=V, temperature=T, L=L, K_from=a.K, K_to=b.K,
                                e_from=a.expected_accepted, e_to=b.expected_accepted))
    return out


def summary(rows: list[Row]) -> dict:
    """Headline figures: per-method worst TV, cells above the LP optimum, and claim checks."""
    methods = sorted({r.method for r in rows}, key=lambda m: list(VERIFIERS).index(m))
    per_method = {}
    for m in methods:
        mr = [r for r in rows if r.method == m]
        tvs = [r.tv for r in mr if not math.isnan(r.tv)]
        bound = lp_bound_kind(m)
        above = [r for r in mr if not math.isnan(getattr(r, bound)) and r.expected_accepted > getattr(r, bound) + 1e-9]
        # the fraction of the exact LP-greedy optimum reached, over the multi-draft cells (K >= 2)
        fractions = [r.expected_accepted / r.lp_greedy for r in mr if r.K >= 2 and r.lp_greedy > 0]
        per_method[m] = dict(max_tv=max(tvs) if tvs else math.nan, tv_cells=len(tvs), cells=len(mr),
                             bound=bound, above_bound=len(above), lossless_flag=VERIFIERS[m].lossless,
                             lp_greedy_fraction_mean=float(np.mean(fractions)) if fractions else math.nan,
                             lp_greedy_fraction_worst=min(fractions) if fractions else math.nan,
                             verdict=("exact" if tvs and max(tvs) < EXACT_TV else "biased" if tvs else "not checked"))
    cells = {(r.seed, r.V, r.temperature, r.K, r.L): r for r in rows}
    claim_cells = [r for r in cells.values() if not math.isnan(r.paper_claim) and not math.isnan(r.lp_greedy)]
    sgbv = {(r.seed, r.V, r.temperature, r.K, r.L): r.expected_accepted for r in rows if r.method == "spectr_gbv"}
    spectr = {(r.seed, r.V, r.temperature, r.K, r.L): r.expected_accepted for r in rows if r.method == "spectr"}
    common = [k for k in sgbv if k in spectr and k[3] >= 2]
    return dict(
        per_method=per_method,
        claim_below_lp_greedy=sum(r.paper_claim < r.lp_greedy - 1e-9 for r in claim_cells),
        claim_cells=len(claim_cells),
        spectr_gbv_reaches_claim=sum(abs(sgbv[k] - cells[k].paper_claim) < 1e-9 for k in sgbv
                                     if not math.isnan(cells[k].paper_claim)),
        spectr_gbv_cells=len(sgbv),
        spectr_gbv_below_spectr=sum(sgbv[k] < spectr[k] - 1e-12 for k in common),
        multi_draft_cells=len(common),
        monotonicity=monotonicity_violations(rows),
        best_by_shape=best_exact_by_shape(rows),
        dominance=dominance(rows),
    )


def best_exact_by_shape(rows: Iterable[Row]) -> list[dict]:
    """Per (K, L) with K >= 2: each exact (lossless-flagged) rule's mean fraction of LP-greedy over the cells of
    that shape, the best rule and its lead over the runner-up."""
    by_shape: dict[tuple[int, int], dict[str, list[float]]] = {}
    for r in rows:
        if r.K >= 2 and VERIFIERS[r.method].lossless and r.lp_greedy > 0:
            by_shape.setdefault((r.K, r.L), {}).setdefault(r.method, []).append(r.expected_accepted / r.lp_greedy)
    out = []
    for (K, L), per in sorted(by_shape.items()):
        means = sorted(((float(np.mean(v)), m) for m, v in per.items()), reverse=True)
        out.append(dict(K=K, L=L, cells=max(len(v) for v in per.values()), means={m: f for f, m in means},
                        best=means[0][1], lead=means[0][0] - means[1][0] if len(means) > 1 else math.nan))
    return out


def dominance(rows: Iterable[Row], tol: float = 1e-9) -> dict[str, tuple[int, int]]:
    """method -> (cells where its E[tau] >= every other exact multi-draft rule's - tol, multi-draft cells)."""
    cells: dict[tuple, dict[str, float]] = {}
    for r in rows:
        if r.K >= 2 and VERIFIERS[r.method].lossless:
            cells.setdefault((r.seed, r.V, r.temperature, r.K, r.L), {})[r.method] = r.expected_accepted
    out = {}
    for m in {m for c in cells.values() for m in c}:
        have = [c for c in cells.values() if m in c]
        out[m] = (sum(c[m] >= max(c.values()) - tol for c in have), len(have))
    return out


#: The shapes of the off-grid check: where the per-prefix choice has a subtree to get wrong (L >= 2) and the
#: exact E[tau] of V = 3 toys takes well under a second.
RANDOM_TOY_SHAPES = ((2, 2), (3, 2), (2, 3))


def random_toy_case(rng: np.random.Generator, V: int = 3):
    """One random toy pair off the grid, drawn from ``rng``: (target, draft, T, zero_prob, model seed), with T in
    {0.5, 1, 2} and zero_prob in {0, 0.2, 0.4}; the draft's model seed is the target's + 1."""
    toy_seed = int(rng.integers(1 << 30))
    zero_prob, T = float(rng.choice([0.0, 0.2, 0.4])), float(rng.choice([0.5, 1.0, 2.0]))
    target = random_toy_model(V, toy_seed, zero_prob=zero_prob, name="target")
    draft = random_toy_model(V, toy_seed + 1, zero_prob=zero_prob, name="draft")
    return target, draft, T, zero_prob, toy_seed


def random_toy_dominance(n: int, seed: int, method: str = "select_gbv",
                         peers: Iterable[str] = ("spectr", "mdbv", "mpbv"), progress: bool = False) -> dict:
    """Exact E[tau] of ``method`` against the best of ``peers`` on n random toy pairs off the theory grid.

    Toy t has (K, L) = RANDOM_TOY_SHAPES[t mod 3] and V = 3, drawn by :func:`random_toy_case` from
    ``numpy.random.default_rng(seed)``; each E[tau] is exact (enumeration).
    A miss is a toy with E[tau](method) < max over peers - 1e-9.  Returns the counts, each miss (its toy, the
    peer that wins, the gap as a fraction of that peer's E[tau]) and the mean E[tau] of every method.
    """
    peers = list(peers)
    rng = np.random.default_rng(seed)
    misses, means = [], {m: [] for m in [method, *peers]}
    below = {m: 0 for m in peers}
    for t in tqdm(range(n), desc="random toys", disable=not progress):
        K, L = RANDOM_TOY_SHAPES[t % len(RANDOM_TOY_SHAPES)]
        target, draft, T, zero_prob, toy_seed = random_toy_case(rng)
        value = {m: expected_accepted(m, target, draft, K, L, temperature=T) for m in means}
        for m, v in value.items():
            means[m].append(v)
        best = max(peers, key=lambda m: value[m])
        for m in peers:
            below[m] += value[method] < value[m] - 1e-9
        if value[method] < value[best] - 1e-9:
            misses.append(dict(K=K, L=L, T=T, zero_prob=zero_prob, toy_seed=toy_seed, peer=best,
                               value=value[method], peer_value=value[best],
                               gap=(value[best] - value[method]) / value[best]))
    gaps = sorted(x["gap"] for x in misses)
    return dict(n=n, seed=seed, method=method, peers=peers, misses=misses, below=below,
                median_gap=float(np.median(gaps)) if gaps else 0.0, max_gap=gaps[-1] if gaps else 0.0,
                mean_expected_accepted={m: float(np.mean(v)) if v else math.nan for m, v in means.items()})


def _random_toy_lines(d: dict) -> list[str]:
    by_peer = ", ".join(f"{m} {k}" for m, k in d["below"].items())
    lines = ["", f"## Off the grid: `{d['method']}` against the best of {', '.join(d['peers'])}", "",
             f"{d['n']} random V = 3 toys (shapes K, L in {list(RANDOM_TOY_SHAPES)}, T in {{0.5, 1, 2}}, zero_prob in"
             f" {{0, 0.2, 0.4}}; `random_toys_seed={d['seed']}`), exact E[tau]. Below the best peer in"
             f" **{len(d['misses'])} of {d['n']}** ({len(d['misses']) / max(d['n'], 1):.1%}); below each peer: {by_peer};"
             f" gap median {d['median_gap']:.2%}, max {d['max_gap']:.2%} of the peer's E[tau]. Mean E[tau]: "
             + ", ".join(f"{m} {v:.4f}" for m, v in d["mean_expected_accepted"].items()) + "."]
    if d["misses"]:
        lines += ["", "| K | L | T | zero_prob | toy seed | best peer | E[tau] | peer's | gap |", "|---|---|---|---|---|---|---|---|---|"]
        lines += [f"| {x['K']} | {x['L']} | {x['T']} | {x['zero_prob']} | {x['toy_seed']} | {x['peer']} | {x['value']:.4f}"
                  f" | {x['peer_value']:.4f} | {x['gap']:.2%} |" for x in d["misses"]]
    return lines


def _fmt(x: float, digits: int = 4) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def write_outputs(rows: list[Row], out_dir: Path, cfg: TheoryConfig, seconds: float,
                  off_grid: dict | None = None) -> dict[str, Path]:
    """theory.csv (one row per cell × method), theory.md (wide table + verdicts, and ``off_grid``'s
    :func:`random_toy_dominance` when given), theory_etau_vs_k.png."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"csv": out_dir / "theory.csv", "md": out_dir / "theory.md", "png": out_dir / "theory_etau_vs_k.png"}
    with open(paths["csv"], "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(asdict(rows[0]).keys()))
        w.writeheader()
        for r in rows:
            w.writerow(asdict(r))
    s = summary(rows)
    methods = [m for m in cfg.methods if any(r.method == m for r in rows)]
    lines = ["# Exact theory table", "",
             f"Random context-dependent toy pairs (seeds {cfg.seeds}, zero_prob {cfg.zero_prob}), one iteration from an"
             f" empty prompt. Entries are exact E[tau] (accepted draft tokens per iteration, bonus excluded)."
             f" LP-valid = best per-iteration-valid verifier (§7.3), LP-greedy = best verifier allowed to adjust later"
             f" targets (§7.2), claim = the SpecTr-GBV paper's value (φ-sum, §6.3). `*` marks a value above its"
             f" method's LP optimum (impossible for an exact method). Computed in {seconds:.0f} s.", "",
             "## Exactness verdicts", "",
             "| method | flagged lossless | verdict | max TV (first L+2 tokens) | cells checked | cells above LP bound |",
             "|---|---|---|---|---|---|"]
    for m, d in s["per_method"].items():
        lines.append(f"| {m} | {d['lossless_flag']} | {d['verdict']} | {_fmt(d['max_tv'], 6) if not math.isnan(d['max_tv']) else '—'}"
                     f" | {d['tv_cells']}/{d['cells']} | {d['above_bound']} ({d['bound']}) |")
    multi = [m for m, d in s["per_method"].items() if not math.isnan(d["lp_greedy_fraction_mean"])]
    lines += ["", "## Fraction of LP-greedy (multi-draft cells, K >= 2)", "",
              "E[tau] / the exact LP-greedy optimum, the best any lossless rule can reach; a lossy rule (flagged"
              " lossless = False) can exceed 1.", "",
              "| method | lossless | mean | worst cell |", "|---|---|---|---|"]
    lines += [f"| {m} | {s['per_method'][m]['lossless_flag']} | {_fmt(s['per_method'][m]['lp_greedy_fraction_mean'])} |"
              f" {_fmt(s['per_method'][m]['lp_greedy_fraction_worst'])} |" for m in multi]
    shapes = s["best_by_shape"]
    if shapes:
        exact = [m for m in multi if VERIFIERS[m].lossless]
        lines += ["", "## Best exact rule per K and L (mean fraction of LP-greedy over the cells of that shape)", "",
                  "| K | L | cells | " + " | ".join(exact) + " | best | lead over the runner-up |",
                  "|" + "---|" * (3 + len(exact) + 2)]
        for d in shapes:
            lines.append(f"| {d['K']} | {d['L']} | {d['cells']} | "
                         + " | ".join(_fmt(d["means"].get(m, math.nan)) for m in exact)
                         + f" | {d['best']} | {_fmt(d['lead'])} |")
        lines += ["", "Cells (K >= 2) where a rule's E[tau] is at least every other exact rule's (to 1e-9): "
                  + ", ".join(f"{m} {a}/{n}" for m, (a, n) in sorted(s["dominance"].items(),
                                                                  key=lambda kv: -kv[1][0]))]
    lines += ["", "## Claims", "",
              f"- The paper's claimed value (φ-sum) is below the exact LP-greedy optimum in {s['claim_below_lp_greedy']}"
              f" of {s['claim_cells']} cells.",
              f"- The published SpecTr-GBV rule attains its claimed value in {s['spectr_gbv_reaches_claim']} of"
              f" {s['spectr_gbv_cells']} cells, and is below SpecTr in {s['spectr_gbv_below_spectr']} of"
              f" {s['multi_draft_cells']} multi-draft cells.",
              f"- Monotonicity in K: {len(s['monotonicity'])} violation(s)."]
    for v in s["monotonicity"]:
        lines.append(f"  - {v['method']}: seed {v['seed']}, V={v['V']}, T={v['temperature']}, L={v['L']}: E[tau]"
                     f" {v['e_from']:.4f} at K={v['K_from']} > {v['e_to']:.4f} at K={v['K_to']}")
    if off_grid is not None:
        lines += _random_toy_lines(off_grid)
    lines += ["", "## E[tau] per cell", "",
              "| seed | V | T | L | K | " + " | ".join(methods) + " | LP-valid | LP-greedy | claim | best lossless"
              " (fraction of LP-greedy) |",
              "|" + "---|" * (5 + len(methods) + 4)]
    cells: dict[tuple, dict[str, Row]] = {}
    for r in rows:
        cells.setdefault((r.seed, r.V, r.temperature, r.L, r.K), {})[r.method] = r
    for key in sorted(cells):
        by_m = cells[key]
        any_row = next(iter(by_m.values()))
        vals = []
        for m in methods:
            r = by_m.get(m)
            if r is None:
                vals.append("")
                continue
            bound = getattr(r, lp_bound_kind(m))
            star = "*" if not math.isnan(bound) and r.expected_accepted > bound + 1e-9 else ""
            vals.append(_fmt(r.expected_accepted) + star)
        exact = [r for r in by_m.values() if VERIFIERS[r.method].lossless]
        best = max(exact, key=lambda r: r.expected_accepted) if exact else None
        frac = (f"{best.method} ({_fmt(best.expected_accepted / any_row.lp_greedy, 3)})"
                if best is not None and any_row.lp_greedy > 0 else "—")
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {key[4]} | " + " | ".join(vals)
                     + f" | {_fmt(any_row.lp_valid)} | {_fmt(any_row.lp_greedy)} | {_fmt(any_row.paper_claim)} | {frac} |")
    paths["md"].write_text("\n".join(lines) + "\n")
    _plot(rows, cfg, methods, paths["png"])
    return paths


def _plot(rows: list[Row], cfg: TheoryConfig, methods: list[str], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seed, T = cfg.seeds[0], cfg.temperatures[0]
    Ls = sorted({r.L for r in rows})
    fig, axes = plt.subplots(1, len(Ls), figsize=(4.2 * len(Ls), 3.6), squeeze=False)
    for ax, L in zip(axes[0], Ls):
        sel = [r for r in rows if r.seed == seed and r.temperature == T and r.L == L]
        for m in methods:
            pts = sorted((r.K, r.expected_accepted) for r in sel if r.method == m)
            if pts:
                ax.plot(*zip(*pts), marker="o", label=m)
        for name, style in (("lp_valid", "--"), ("lp_greedy", ":")):
            pts = sorted({(r.K, getattr(r, name)) for r in sel if not math.isnan(getattr(r, name))})
            if pts:
                ax.plot(*zip(*pts), linestyle=style, color="black", label=name.replace("_", "-").upper())
        ax.set_title(f"L = {L} (toy seed {seed}, T = {T})")
        ax.set_xlabel("K (drafts)")
        ax.set_ylabel("exact E[tau]")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
