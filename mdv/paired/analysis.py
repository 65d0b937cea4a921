"""From paired records to estimates, decisive verdicts, speedup predictions and plots.

Input: the ``mdv.paired/2`` records of :mod:`mdv.paired.measure` (one per prompt).  Every context
contributes, per verifier m and (K, L), the exact ``E[tau | c, D]``; the **cluster** of a context is its
prompt (contexts of one trajectory are correlated), so every CI is a cluster bootstrap over prompts
(:func:`mdv.paired.stats.cluster_bootstrap`).

* **Block efficiency** per iteration: ``BE = 1 + E[tau]`` (bonus/correction token included; the
  fresh-state value for greedy verifiers, i.e. the per-iteration quantity of the LPs).
* **Paired differences** (method vs method, K+1 vs K, L+1 vs L) are differences on the same drafts.
* **Verdicts** (:func:`mdv.paired.stats.verdict`): supported / contradicted / equal within ±δ, or
  inconclusive with the number of prompts that would decide it.
* **L = 1 optimality gap**: ``α*_K(p, q) − E[tau | c, D]`` at L = 1; its mean is ≥ 0 for every valid
  verifier (α*_K is the best any K-draft verifier can do at that context, in expectation over D).
* **Speedup**: ``SR = E[1 + tau] / E[t]`` with t the iteration time in AR steps from a calibration
  or a cost profile (:mod:`mdv.paired.cost`), checked against measured SR of real generations (sweep
  cells in the same results folder) when there are any.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Sequence

import numpy as np

from mdv.paired.stats import Estimate, Verdict, cluster_bootstrap, paired_difference, verdict

#: The paper's claimed ordering, best first (SpecTr-GBV > SpecTr > GBV > SD).
PAPER_ORDER = ("spectr_gbv", "spectr", "gbv", "sd")
LOSSY_MARK = "†"


def is_multi_draft(method: str) -> bool:
    from mdv.verify.registry import VERIFIERS

    return bool(VERIFIERS[method].multi_draft) if method in VERIFIERS else True


def is_lossless(method: str) -> bool:
    from mdv.verify.registry import VERIFIERS

    return bool(VERIFIERS[method].lossless) if method in VERIFIERS else False


def label(method: str) -> str:
    """The method's name, marked † when it is not lossless."""
    return method if is_lossless(method) else f"{method}{LOSSY_MARK}"


def k_of(method: str, K: int) -> int:
    """The K a method runs at: K for multi-draft verifiers, 1 for single-draft ones."""
    return K if is_multi_draft(method) else 1


# ----------------------------------------------------------------------------------------------- data
@dataclass
class PairedData:
    """All contexts of one setting (models, T, top-k, top-p, K_max, L_max), as arrays.

    etau[m]: [n, K_max, L_max]; reach[m]: [n, K_max, L_max, L_max] (P(tau ≥ i) at (K, L), NaN for i > L); alpha: [n, K_max];
    nodes: [n, K_max, L_max]; datasets, clusters: [n] labels (a cluster is one prompt's trajectory).
    survival: cluster -> [tokens, K_max, K_max + 1] where real sd / spectr iterations end along its
    trajectory (:func:`mdv.paired.trajectory.survival_along`; records made before it was stored have none);
    offsets: [n] each context's position in its trajectory.
    """

    setting: dict[str, Any]
    methods: list[str]
    K_max: int
    L_max: int
    datasets: np.ndarray
    clusters: np.ndarray
    etau: dict[str, np.ndarray]
    reach: dict[str, np.ndarray]
    alpha: np.ndarray
    nodes: np.ndarray
    dataset_keys: np.ndarray = field(default_factory=lambda: np.array([]))
    first_token: dict[str, np.ndarray] = field(default_factory=dict)  # [n, K_max] mean E[tau] at L = 1, extra draws
    optimum_draws: int = 0
    timing: dict[str, float] = field(default_factory=dict)
    environments: list[dict[str, Any]] = field(default_factory=list)
    models: dict[str, str] = field(default_factory=dict)
    n_records: int = 0
    survival: dict[str, np.ndarray] = field(default_factory=dict)
    offsets: np.ndarray = field(default_factory=lambda: np.array([], dtype=np.int64))  # [n] tokens into the trajectory

    @property
    def n(self) -> int:
        return int(self.clusters.shape[0])

    @property
    def n_prompts(self) -> int:
        return int(np.unique(self.clusters).size)

    def be(self, method: str, K: int, L: int) -> np.ndarray:
        """[n] block efficiency 1 + E[tau | c, D] of ``method`` at (K, L) (K = 1 for single-draft)."""
        return 1.0 + self.etau[method][:, k_of(method, K) - 1, L - 1]

    def emitted_law(self, method: str, K: int, L: int) -> np.ndarray:
        """[L+1] P(e = j), j = 1..L+1, of the tokens one iteration emits (e = 1 + tau) at (K, L), pooled
        (averaged) over the contexts: the law :mod:`mdv.paired.renewal` cuts at max_new_tokens."""
        from mdv.paired.renewal import emitted_law

        reach = self.reach[method][:, k_of(method, K) - 1, L - 1, :L]  # [n, L]
        return emitted_law(reach).mean(axis=0)  # [L+1]

    def etau_l1(self, method: str, K: int) -> np.ndarray:
        """[n] E[tau] at L = 1 with K drafts per context, averaged over the tree's drafts and the
        ``optimum_draws`` extra tuples (the same law, so the mean stays unbiased, with less draft noise)."""
        base = self.etau[method][:, K - 1, 0]
        if not self.optimum_draws or method not in self.first_token:
            return base
        M = self.optimum_draws
        return (base + M * self.first_token[method][:, K - 1]) / (M + 1)

    def dataset_names(self) -> list[str]:
        return list(dict.fromkeys(self.datasets.tolist()))

    def subset(self, mask: np.ndarray) -> "PairedData":
        """The contexts where ``mask`` [n] is True."""
        return PairedData(self.setting, self.methods, self.K_max, self.L_max, self.datasets[mask], self.clusters[mask],
                          {m: v[mask] for m, v in self.etau.items()}, {m: v[mask] for m, v in self.reach.items()},
                          self.alpha[mask], self.nodes[mask], self.dataset_keys[mask],
                          {m: v[mask] for m, v in self.first_token.items()}, self.optimum_draws, self.timing,
                          self.environments, self.models, self.n_records,
                          {c: a for c, a in self.survival.items() if c in set(self.clusters[mask])},
                          self.offsets[mask] if self.offsets.size else self.offsets)


def _nan(x: Any) -> float:
    return float("nan") if x is None else float(x)


def setting_key(record: dict[str, Any]) -> tuple:
    c = record["config"]
    return (c["models"], float(c["temperature"]), c.get("top_k"), c.get("top_p"), int(c["K_max"]),
            int(c["L_max"]), tuple(c["methods"]), int(c.get("optimum_draws", 0)), str(c.get("drafter") or "model"))


def collect(records: Sequence[dict[str, Any]]) -> list[PairedData]:
    """Records grouped by setting, each group's contexts stacked into arrays."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault(setting_key(r), []).append(r)
    out = []
    for key, recs in groups.items():
        models, T, top_k, top_p, K_max, L_max, methods, optimum_draws, drafter = key
        datasets, keys, clusters, alpha, nodes, offsets = [], [], [], [], [], []
        etau: dict[str, list] = {m: [] for m in methods}
        reach: dict[str, list] = {m: [] for m in methods}
        first: dict[str, list] = {m: [] for m in methods}
        timing: dict[str, float] = {}
        survival: dict[str, np.ndarray] = {}
        for r in recs:
            c = r["config"]
            cluster = f"{c['dataset']}/{r['prompt_index']}/s{c['seed']}"
            if r["trajectory"].get("survival"):
                survival[cluster] = np.array(r["trajectory"]["survival"], dtype=np.float64)
            for ctx in r["contexts"]:
                datasets.append(str(r.get("dataset", {}).get("label", c["dataset"])))
                keys.append(str(c["dataset"]))
                clusters.append(cluster)
                alpha.append(ctx["alpha_star"])
                offsets.append(int(ctx["offset"]))
                nodes.append(ctx["nodes"])
                for m in methods:
                    etau[m].append([[_nan(x) for x in row] for row in ctx["etau"][m]])
                    reach[m].append([[[_nan(x) for x in r] for r in row] for row in ctx["reach"][m]])
                    if optimum_draws:
                        first[m].append([_nan(x) for x in ctx["first_token"][m]])
            t = r.get("timing", {})
            for k, v in t.items():
                if isinstance(v, dict):
                    for m, s in v.items():
                        timing[f"laws/{m}"] = timing.get(f"laws/{m}", 0.0) + float(s)
                else:
                    timing[k] = timing.get(k, 0.0) + float(v)
            timing["wall_s"] = timing.get("wall_s", 0.0) + float(r.get("wall_seconds", 0.0))
        out.append(PairedData(
            setting={"models": models, "temperature": T, "top_k": top_k, "top_p": top_p, "drafter": drafter},
            methods=list(methods), K_max=K_max, L_max=L_max, datasets=np.array(datasets), clusters=np.array(clusters),
            etau={m: np.array(v, dtype=np.float64) for m, v in etau.items()},
            reach={m: np.array(v, dtype=np.float64) for m, v in reach.items()},
            alpha=np.array(alpha, dtype=np.float64), nodes=np.array(nodes, dtype=np.int64),
            dataset_keys=np.array(keys),
            first_token={m: np.array(v, dtype=np.float64) for m, v in first.items()} if optimum_draws else {},
            optimum_draws=optimum_draws, timing=timing,
            environments=[r.get("environment", {}) for r in recs], models=dict(recs[0].get("models", {})),
            n_records=len(recs), survival=survival, offsets=np.array(offsets, dtype=np.int64)))
    return out


# ----------------------------------------------------------------------------------------------- estimates
@dataclass(frozen=True)
class Options:
    """Statistics options: confidence level, bootstrap resamples, seed, equivalence margin δ."""

    level: float = 0.95
    n_boot: int = 2000
    seed: int = 0
    delta: float = 0.01

    def boot(self) -> dict[str, Any]:
        return {"level": self.level, "n_boot": self.n_boot, "seed": self.seed}


def _subset(data: PairedData, dataset: str | None) -> np.ndarray:
    return np.ones(data.n, dtype=bool) if dataset is None else data.datasets == dataset


def be_estimate(data: PairedData, method: str, K: int, L: int, opts: Options,
                dataset: str | None = None) -> Estimate:
    """Mean block efficiency of ``method`` at (K, L) with its cluster-bootstrap CI (one dataset or all)."""
    sel = _subset(data, dataset)
    return cluster_bootstrap(data.be(method, K, L)[sel], data.clusters[sel], **opts.boot())


def be_rows(data: PairedData, opts: Options) -> list[dict[str, Any]]:
    """Every (method, K, L, dataset or "all") block-efficiency estimate, as flat rows."""
    rows = []
    for dataset in [None, *data.dataset_names()]:
        for m in data.methods:
            for K in range(1, (data.K_max if is_multi_draft(m) else 1) + 1):
                for L in range(1, data.L_max + 1):
                    e = be_estimate(data, m, K, L, opts, dataset)
                    rows.append({"method": m, "lossless": is_lossless(m), "K": K, "L": L,
                                 "dataset": dataset or "all", "be": e.mean, "lo": e.lo, "hi": e.hi,
                                 "contexts": e.n, "prompts": e.n_clusters})
    return rows


# ----------------------------------------------------------------------------------------------- claims
@dataclass
class ClaimResult:
    """One claim: its overall outcome and the verdicts it rests on (each with a label)."""

    name: str
    statement: str
    outcome: str
    parts: list[tuple[str, Verdict]]
    note: str = ""

    def to_rows(self) -> list[dict[str, Any]]:
        return [{"claim": self.name, "part": where, "outcome": v.outcome, "effect": v.effect.mean,
                 "lo": v.effect.lo, "hi": v.effect.hi, "delta": v.delta, "prompts": v.effect.n_clusters,
                 "needed_prompts": v.needed_clusters, "text": v.text} for where, v in self.parts]


def combine(verdicts: Sequence[Verdict]) -> str:
    """Overall outcome of a claim that needs every part: contradicted if any part is; supported if all
    parts are supported or equal (at least one supported); equal if all are equal; else inconclusive."""
    outs = [v.outcome for v in verdicts]
    if not outs:
        return "not measured"
    if "contradicted" in outs:
        return "contradicted"
    if "inconclusive" in outs:
        return "inconclusive"
    if all(o == "equal" for o in outs):
        return "equal"
    return "supported"


def _diff(data: PairedData, a: np.ndarray, b: np.ndarray, opts: Options, claim: str) -> Verdict:
    return verdict(paired_difference(a, b, data.clusters, **opts.boot()), delta=opts.delta, claim=claim)


def family(opts: Options, n_parts: int) -> Options:
    """Options for one part of a claim resting on ``n_parts`` comparisons: Bonferroni, each CI at level
    ``1 − (1 − level) / n_parts`` so that the claim's family-wise error stays at most ``1 − level``; the
    resamples grow so that each percentile tail keeps at least 25 of them."""
    if n_parts <= 1:
        return opts
    alpha = (1.0 - opts.level) / n_parts
    return Options(level=1.0 - alpha, n_boot=max(opts.n_boot, int(math.ceil(50.0 / alpha))), seed=opts.seed,
                   delta=opts.delta)


def headline(data: PairedData, K: int, L: int) -> tuple[int, int]:
    return min(K, data.K_max), min(L, data.L_max)


def ordering_claim(data: PairedData, opts: Options, K: int, L: int) -> ClaimResult:
    """The paper's ordering SpecTr-GBV > SpecTr > GBV > SD at (K, L), each link a paired difference."""
    chain = [m for m in PAPER_ORDER if m in data.methods]
    parts = []
    opts = family(opts, len(chain) - 1)
    for a, b in zip(chain, chain[1:]):
        parts.append((f"{label(a)} (K={k_of(a, K)}) > {label(b)} (K={k_of(b, K)}), L={L}",
                      _diff(data, data.be(a, K, L), data.be(b, K, L), opts, "greater")))
    note = ("spectr_gbv† is not lossless (the exact oracle shows its output law differs from the target's), so"
            " its block efficiency is not comparable with a lossless method's") if "spectr_gbv" in chain else ""
    return ClaimResult("ordering", f"paper ordering {' > '.join(label(m) for m in chain)} at K={K}, L={L}",
                       combine([v for _, v in parts]), parts, note)


def best_lossless_claim(data: PairedData, opts: Options, K: int, L: int) -> ClaimResult:
    """Which lossless method has the highest block efficiency at (K, L), against each other lossless one."""
    lossless = [m for m in data.methods if is_lossless(m)]
    means = {m: float(np.mean(data.be(m, K, L))) for m in lossless}
    best = max(means, key=means.get)
    opts = family(opts, len(lossless) - 1)
    parts = [(f"{best} > {m} at K={K}, L={L}", _diff(data, data.be(best, K, L), data.be(m, K, L), opts, "greater"))
             for m in lossless if m != best]
    return ClaimResult("best_lossless", f"{best} is the best lossless method at K={K}, L={L}",
                       combine([v for _, v in parts]), parts)


#: Block lengths at which the monotonicity-in-K claim is tested (neighbouring L give nearly the same
#: comparison; every (K, L) estimate is in the CSV all the same).
CLAIM_L = (1, 2, 4, 8, 12, 16)


def claim_lengths(L_max: int) -> list[int]:
    return [L for L in CLAIM_L if L < L_max] + [L_max]


def monotone_k_claims(data: PairedData, opts: Options) -> list[ClaimResult]:
    """Per multi-draft method: E[tau] non-decreasing in K at L in :data:`CLAIM_L` (and L_max), paired K+1 vs K,
    claim ≥."""
    out = []
    for m in data.methods:
        if not is_multi_draft(m) or data.K_max < 2:
            continue
        Ls = claim_lengths(data.L_max)
        fam = family(opts, len(Ls) * (data.K_max - 1))
        parts = [(f"K={K}→{K + 1}, L={L}", _diff(data, data.be(m, K + 1, L), data.be(m, K, L), fam, "geq"))
                 for L in Ls for K in range(1, data.K_max)]
        out.append(ClaimResult(f"monotone_K/{m}", f"{label(m)}: block efficiency non-decreasing in K",
                               combine([v for _, v in parts]), parts))
    return out


def monotone_l_claims(data: PairedData, opts: Options, K: int) -> list[ClaimResult]:
    """Per method: E[tau] non-decreasing in L (paired L+1 vs L at the method's K, claim ≥)."""
    out = []
    for m in data.methods:
        k = k_of(m, K)
        fam = family(opts, data.L_max - 1)
        parts = [(f"L={L}→{L + 1}, K={k}", _diff(data, data.be(m, k, L + 1), data.be(m, k, L), fam, "geq"))
                 for L in range(1, data.L_max)]
        if parts:
            out.append(ClaimResult(f"monotone_L/{m}", f"{label(m)}: block efficiency non-decreasing in L (K={k})",
                                   combine([v for _, v in parts]), parts))
    return out


def optimality_gaps(data: PairedData, opts: Options) -> list[dict[str, Any]]:
    """Per method and K: the L = 1 gap α*_K − E[tau] with its CI (mean ≥ 0 for any valid verifier)."""
    rows = []
    for K in range(1, data.K_max + 1):
        a = cluster_bootstrap(data.alpha[:, K - 1], data.clusters, **opts.boot())
        rows.append({"method": "α*_K (optimum)", "K": K, "etau": a.mean, "gap": 0.0, "lo": float("nan"),
                     "hi": float("nan"), "verdict": ""})
        for m in data.methods:
            if not is_multi_draft(m) and K > 1:
                continue
            gap = data.alpha[:, K - 1] - data.etau_l1(m, K)
            e = cluster_bootstrap(gap, data.clusters, **opts.boot())
            v = verdict(e, delta=opts.delta, claim="geq")
            rows.append({"method": m, "K": K, "etau": float(np.mean(data.etau_l1(m, K))), "gap": e.mean,
                         "lo": e.lo, "hi": e.hi, "verdict": v.outcome, "text": v.text})
    return rows


def optimality_claim(data: PairedData, opts: Options) -> ClaimResult:
    """No verifier exceeds the L = 1 optimum α*_K on average (gap ≥ 0); a lossy rule may.  At K = 1 every
    verifier makes the same L = 1 decision (accept with min(1, p/q)); their identical K = 1 parts are
    tested once."""
    tests: list[tuple[str, np.ndarray]] = []
    for K in range(1, data.K_max + 1):
        cols = [(m, data.alpha[:, K - 1] - data.etau_l1(m, K)) for m in data.methods if is_multi_draft(m) or K == 1]
        if K == 1 and cols and all(np.allclose(g, cols[0][1], atol=1e-12, rtol=0) for _, g in cols):
            tests.append(("α*_1 − E[tau] of every verifier (they coincide at K = 1, L = 1)", cols[0][1]))
            continue
        tests += [(f"α*_{K} − E[tau] of {label(m)}, L=1", g) for m, g in cols]
    fam = family(opts, len(tests))
    parts = [(w, verdict(cluster_bootstrap(g, data.clusters, **fam.boot()), delta=opts.delta, claim="geq"))
             for w, g in tests]
    lossless = [v for w, v in parts if LOSSY_MARK not in w]
    return ClaimResult("optimum_L1", "no lossless verifier exceeds the L = 1 optimum α*_K(p, q) (gap ≥ 0)",
                       combine(lossless), parts,
                       "the overall outcome counts the lossless methods only; a lossy rule (†) can exceed α*_K")


def all_claims(data: PairedData, opts: Options, K: int, L: int) -> list[ClaimResult]:
    K, L = headline(data, K, L)
    claims = [ordering_claim(data, opts, K, L), best_lossless_claim(data, opts, K, L)]
    claims += monotone_k_claims(data, opts)
    claims += monotone_l_claims(data, opts, K)
    claims.append(optimality_claim(data, opts))
    return claims


# ----------------------------------------------------------------------------------------------- speedup
def predicted_speedups(data: PairedData, cost: Any, opts: Options, Ls: Sequence[int] | None = None
                       ) -> list[dict[str, Any]]:
    """Predicted SR per (method, K, L) from the paired tokens per iteration and the tree sizes."""
    from mdv.paired.cost import predict_speedup

    rows = []
    for m in data.methods:
        for K in range(1, (data.K_max if is_multi_draft(m) else 1) + 1):
            for L in (Ls or range(1, data.L_max + 1)):
                if L > data.L_max:
                    continue
                e = predict_speedup(data.be(m, K, L), data.nodes[:, K - 1, L - 1], data.clusters, method=m, K=K, L=L,
                                    cost=cost, **opts.boot())
                rows.append({"method": m, "K": K, "L": L, "sr": e.mean, "lo": e.lo, "hi": e.hi})
    return rows


def measured_block_efficiency(cells: Sequence[Any], setting: dict[str, Any], opts: Options) -> dict[tuple, Estimate]:
    """Block efficiency of real generations (emitted tokens ÷ target calls, every prompt), per (method, K, L),
    pooled over datasets as a ratio of sums, CI clustered by prompt.  Greedy block verifiers carry their
    target adjustment across iterations here, unlike the fresh-state paired value."""
    acc: dict[tuple, tuple[list, list, list]] = {}
    for c in cells:
        if c.method == "ar" or c.status != "ok" or abs(c.temperature - float(setting["temperature"])) > 1e-9:
            continue
        xs, ys, cl = acc.setdefault((c.method, c.K or 1, c.L or 1), ([], [], []))
        for g in c.generations:
            s = g["stats"]
            if s.get("target_calls"):
                xs.append(float(s["new_tokens"]))
                ys.append(float(s["target_calls"]))
                cl.append(f"{c.config.get('dataset')}/{g['prompt_index']}/s{c.config.get('seed')}")
    return {k: cluster_bootstrap(np.array(x), np.array(cl), ratio_to=np.array(y), **opts.boot())
            for k, (x, y, cl) in acc.items() if x}


def cell_datasets(cells: Sequence[Any]) -> set[str]:
    """The dataset names (config keys) of the ok sweep cells."""
    return {str(c.config.get("dataset")) for c in cells if c.status == "ok"}


@dataclass(frozen=True)
class MeasuredSpeedup:
    """Real generations of one (method, K, L), warm-up prompts excluded, pooled over datasets.

    sr: Σ (method tokens × AR seconds per token of the same prompt) ÷ Σ method decode seconds (CI by prompt).
    tokens_per_iteration: emitted tokens ÷ target calls; time_per_iteration: decode seconds per target call ÷
    AR seconds per token (AR-step units).  SR = tokens_per_iteration ÷ time_per_iteration.
    prompts: the (dataset, prompt index, seed) keys they ran on.  n_tokens: the median tokens a generation
    emitted (its max_new_tokens unless EOS stopped it), for the cut of the last iteration.
    """

    sr: Estimate
    tokens_per_iteration: float
    time_per_iteration: float
    prompts: frozenset
    n_tokens: int = 0


def _speedups(pairs: Iterable[tuple[tuple, str, dict[str, Any], dict[str, Any]]], opts: Options
              ) -> dict[tuple, MeasuredSpeedup]:
    """pairs: ((method, K, L), prompt cluster, AR generation stats, method generation stats) of one prompt."""
    acc: dict[tuple, dict[str, list]] = {}
    for key, cluster, ar_s, s in pairs:
        if not ar_s["new_tokens"] or not ar_s["decode_s"] or not s["decode_s"] or not s["target_calls"]:
            continue
        a = acc.setdefault(key, {k: [] for k in ("x", "y", "cl", "tok", "calls", "ar_s")})
        per_token = float(ar_s["decode_s"]) / float(ar_s["new_tokens"])
        a["x"].append(float(s["new_tokens"]) * per_token)
        a["y"].append(float(s["decode_s"]))
        a["cl"].append(cluster)
        a["tok"].append(float(s["new_tokens"]))
        a["calls"].append(float(s["target_calls"]))
        a["ar_s"].append(per_token * float(s["target_calls"]))
    out = {}
    for k, a in acc.items():
        sr = cluster_bootstrap(np.array(a["x"]), np.array(a["cl"]), ratio_to=np.array(a["y"]), **opts.boot())
        out[k] = MeasuredSpeedup(sr, sum(a["tok"]) / sum(a["calls"]), sum(a["y"]) / sum(a["ar_s"]),
                                 frozenset(a["cl"]), int(np.median(a["tok"])))
    return out


def measured_speedups(cells: Sequence[Any], setting: dict[str, Any], opts: Options) -> dict[tuple, MeasuredSpeedup]:
    """Measured SR of real generations per (method, K, L): sweep cells at the setting's temperature paired
    with their AR cells (``mdv.analysis.find_ar``; warm-up prompts excluded), see :class:`MeasuredSpeedup`.
    The cells ran one after the other, so a load change between cells reads as a speedup: the speed check
    (:func:`check_speedups`) interleaves them instead."""
    from mdv.analysis import find_ar

    ar_cells = [c for c in cells if c.method == "ar" and c.status == "ok"]

    def pairs() -> Iterator[tuple[tuple, str, dict[str, Any], dict[str, Any]]]:
        for c in cells:
            if c.method == "ar" or c.status != "ok" or abs(c.temperature - float(setting["temperature"])) > 1e-9:
                continue
            ar, _ = find_ar(c, ar_cells)
            if ar is None:
                continue
            ar_by = {int(g["prompt_index"]): g["stats"] for g in ar.timed()}
            for g in c.timed():
                if int(g["prompt_index"]) in ar_by:
                    yield ((c.method, c.K or 1, c.L or 1), f"{c.config.get('dataset')}/{g['prompt_index']}/s"
                           f"{c.config.get('seed')}", ar_by[int(g["prompt_index"])], g["stats"])

    return _speedups(pairs(), opts)


def check_matches(check: dict[str, Any], setting: dict[str, Any]) -> bool:
    """Whether a speed check (:mod:`mdv.paired.speedcheck`) ran at this paired setting (models, T, top-k/p)."""
    s = check.get("settings", {})
    return (s.get("drafter", "model") == setting.get("drafter", "model")  # checks older than the field: the model
            and str(s.get("models")) == str(setting["models"])
            and abs(float(s.get("temperature", float("nan"))) - float(setting["temperature"])) <= 1e-9
            and s.get("top_k") == setting.get("top_k") and s.get("top_p") == setting.get("top_p"))


def _check_cluster(g: dict[str, Any], check: dict[str, Any]) -> str:
    return f"{g['dataset']}/{g['prompt_index']}/s{check['settings']['seed']}"  # the paired records' cluster label


def check_speedups(check: dict[str, Any], opts: Options) -> dict[tuple, MeasuredSpeedup]:
    """Measured SR per (method, K, L) of the interleaved speed check: per prompt, the method's generation
    against the AR generation of the same round, see :class:`MeasuredSpeedup`."""
    gens = check.get("generations", [])
    ar = {(g["dataset"], g["prompt_index"]): g["stats"] for g in gens if g["method"] == "ar"}
    pairs = [((g["method"], g["K"], g["L"]), _check_cluster(g, check), ar[(g["dataset"], g["prompt_index"])],
              g["stats"]) for g in gens if g["method"] != "ar" and (g["dataset"], g["prompt_index"]) in ar]
    return _speedups(pairs, opts)


@dataclass(frozen=True)
class GivenOutput:
    """The speed check's ``sd`` / ``spectr`` generations of one (method, K, L) that carry where their
    iterations end given their own output (``survival``, :meth:`mdv.paired.speedcheck.InterleavedCheck.add_survival`),
    one entry per generation [g]: its prompt ``clusters``, emitted tokens ``n``, target calls ``calls``
    (its iterations), E[N | its output] ``iterations`` (:func:`mdv.paired.renewal.iterations_given_output`),
    decode seconds ``decode_s`` and the AR seconds per token of the same round ``ar_per_token``."""

    clusters: np.ndarray
    n: np.ndarray
    calls: np.ndarray
    iterations: np.ndarray
    decode_s: np.ndarray
    ar_per_token: np.ndarray


def check_given_output(check: dict[str, Any]) -> dict[tuple, GivenOutput]:
    """Per (method, K, L): the check's generations with ``survival`` (see :class:`GivenOutput`); empty for
    a check made before it was recorded or with another drafter than the draft model."""
    from mdv.paired.renewal import iterations_given_output

    gens = check.get("generations", [])
    ar = {(g["dataset"], g["prompt_index"]): g["stats"] for g in gens if g["method"] == "ar"}
    acc: dict[tuple, list[tuple]] = {}
    for g in gens:
        s, a = g["stats"], ar.get((g["dataset"], g["prompt_index"]))
        if not g.get("survival") or a is None or not a["new_tokens"] or not s["target_calls"] or not s["decode_s"]:
            continue
        n = int(s["new_tokens"])
        acc.setdefault((g["method"], g["K"], g["L"]), []).append(
            (_check_cluster(g, check), n, float(s["target_calls"]),
             iterations_given_output(np.asarray(g["survival"])[:n], int(g["L"]), int(g["K"])),
             float(s["decode_s"]), float(a["decode_s"]) / float(a["new_tokens"])))
    return {k: GivenOutput(*(np.array(col) for col in zip(*rows))) for k, rows in acc.items()}


def check_block_efficiency(check: dict[str, Any], opts: Options) -> dict[tuple, Estimate]:
    """Emitted tokens ÷ target calls of the speed check's generations per (method, K, L), ratio of sums
    pooled over prompts, CI clustered by prompt."""
    acc: dict[tuple, tuple[list, list, list]] = {}
    for g in check.get("generations", []):
        if g["method"] != "ar" and g["stats"].get("target_calls"):
            xs, ys, cl = acc.setdefault((g["method"], g["K"], g["L"]), ([], [], []))
            xs.append(float(g["stats"]["new_tokens"]))
            ys.append(float(g["stats"]["target_calls"]))
            cl.append(_check_cluster(g, check))
    return {k: cluster_bootstrap(np.array(x), np.array(cl), ratio_to=np.array(y), **opts.boot())
            for k, (x, y, cl) in acc.items()}


__all__ = ["ClaimResult", "Options", "PAPER_ORDER", "PairedData", "all_claims", "be_estimate", "be_rows",
           "GivenOutput", "MeasuredSpeedup", "check_block_efficiency", "check_given_output", "check_matches", "check_speedups", "collect", "combine", "measured_block_efficiency", "is_lossless", "is_multi_draft", "k_of", "label", "measured_speedups",
           "monotone_k_claims", "monotone_l_claims", "optimality_claim", "optimality_gaps", "ordering_claim",
           "predicted_speedups"]
