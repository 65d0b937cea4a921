"""``mdv.audit.audit``: is a verification rule lossless, and how far from optimal is it?

For every case of a grid of toy pairs (:mod:`mdv.audit.cases`) the rule is run for N >= L + 2 emitted
tokens on many independent sequences (:mod:`mdv.audit.run`), and the law of those N tokens is compared
with the target's exact law (:mod:`mdv.audit.stats`):

* **Sequential design.**  A case is looked at after n_1, 2 n_1, 4 n_1, ..., ``trials`` sequences (R looks);
  a look tests the laws of the first 1, ..., N tokens (chi-square each, N x the smallest p-value) and
  the case's p-value is R x the smallest look's (Bonferroni over the looks: a valid p-value whenever the
  case stops).  Holm's correction across the C cases run then gives a family-wise error
  <= ``alpha`` for the verdict "biased".  A case stops at the first look where its p-value is <= alpha / C:
  Holm rejects such a case whatever the others give, so stopping early never changes a verdict.
* **Undecided cases** report the smallest TV their trials could have detected with probability 0.8 at
  the strictest level used (alpha / (C R N), the full law's test), whatever the shape of the bias.
* **Verdict**: "biased" when Holm rejects some case; "lossless" when it rejects none and every case could
  have detected a bias of TV >= ``tv_resolution``; "inconclusive" otherwise (the budget was too small
  to promise that resolution).  "lossless" therefore reads: no bias of TV >= tv_resolution on any
  case, at power >= 0.8 per case.
* **Optimality.**  The mean accepted length of the first iteration (from the prompt, fresh state), with
  a level-(1 - alpha) interval, next to the exact LP-valid and LP-greedy optima
  (:func:`~mdv.oracle.lp.lp_optimum`) and the exact E[tau] of mdv's own verifiers on the same case; a
  rule whose interval lies above LP-greedy is flagged: no lossless rule can exceed it.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from mdv.audit.cases import AuditCase, resolve_cases
from mdv.audit.protocol import as_sampler
from mdv.audit.run import Tally, build_table, run_batch
from mdv.audit.stats import detectable_tv, holm, mean_interval, prefix_chi_square, prefix_laws, tv_interval
from mdv.errors import InvalidInputError
from mdv.oracle.enumerate import expected_accepted
from mdv.oracle.lp import lp_optimum
from mdv.verify.registry import VERIFIERS

VERDICTS = ("lossless", "biased", "inconclusive")
#: Exact reference figures are computed where the K-tuples of draft blocks number at most this.
MAX_REFERENCE_TUPLES = 20_000


@dataclass
class Excess:
    """A prefix of the emitted tokens that the rule produces more often than the target does."""

    prefix: tuple[int, ...]
    observed: float  # frequency among the sequences
    expected: float  # exact target probability
    z: float  # (observed - expected) / standard error under the target law


@dataclass
class CaseResult:
    name: str
    V: int
    K: int
    L: int
    n_tokens: int
    status: str  # "biased", "no bias found" or "skipped: <why>"
    sequences: int = 0
    looks: int = 0
    p_value: float = math.nan  # R x min over looks (valid at any stopping look); Holm is applied on these
    chi2_df: int = 0  # of the test of the full law of the N tokens
    worst_prefix_length: int = 0  # the prefix length whose law gave the smallest p-value
    tv: float = math.nan  # plug-in TV(R̂, P)
    tv_low: float = math.nan
    tv_high: float = math.nan
    detectable_tv: float = math.nan
    excess: list[Excess] = field(default_factory=list)
    mean_tau: float = math.nan
    mean_tau_low: float = math.nan
    mean_tau_high: float = math.nan
    lp_valid: float = math.nan
    lp_greedy: float = math.nan
    references: dict[str, float] = field(default_factory=dict)  # mdv verifier -> exact E[tau]
    exceeds_optimum: bool = False
    seconds: float = 0.0
    sampler_seconds: float = 0.0
    instances: int = 0

    @property
    def skipped(self) -> bool:
        return self.status.startswith("skipped")

    @property
    def instances_per_second(self) -> float:
        return self.instances / self.sampler_seconds if self.sampler_seconds > 0 else math.nan


@dataclass
class AuditReport:
    sampler: str
    verdict: str
    alpha: float
    tv_resolution: float
    trials: int
    seed: int
    cases: list[CaseResult]
    seconds: float
    correction: str = "Holm across cases; Bonferroni across the looks of a case"

    @property
    def lossless(self) -> bool | None:
        return {"lossless": True, "biased": False}.get(self.verdict)

    @property
    def biased_cases(self) -> list[CaseResult]:
        return [c for c in self.cases if c.status == "biased"]

    def summary(self) -> str:
        run = [c for c in self.cases if not c.skipped]
        line = f"audit of {self.sampler}: {self.verdict.upper()} ({len(run)} cases, alpha={self.alpha}, {self.correction})"
        if self.biased_cases:
            worst = max(self.biased_cases, key=lambda c: c.tv)
            ex = worst.excess[0] if worst.excess else None
            line += (f"; biased on {len(self.biased_cases)} case(s), e.g. {worst.name}: TV {worst.tv:.4f}"
                     f" [{worst.tv_low:.4f}, {worst.tv_high:.4f}]")
            if ex is not None:
                line += f", prefix {list(ex.prefix)} at {ex.observed:.4f} vs {ex.expected:.4f}"
        elif run:
            line += f"; largest detectable TV {max(c.detectable_tv for c in run):.4f} (resolution {self.tv_resolution})"
        return line


#: (id(target), id(draft), K, L, T, prompt) -> (target, draft, figures); the models are kept so their ids stay theirs.
_REFERENCE_CACHE: dict[tuple, tuple[Any, Any, tuple[float, float, dict[str, float]]]] = {}


def references(case: AuditCase) -> tuple[float, float, dict[str, float]]:
    """(LP-valid, LP-greedy, {mdv verifier: exact E[tau]}) of one iteration from the prompt; NaN / absent
    where the enumeration is too large.  Cached per model pair and sizes (they are exact and deterministic;
    the cases built from one spec share their models, see :meth:`CaseSpec.build`)."""
    key = (id(case.target), id(case.draft), case.K, case.L, case.temperature, tuple(case.prompt))
    if key in _REFERENCE_CACHE:
        return _REFERENCE_CACHE[key][2]
    lps = []
    for kind in ("valid", "greedy"):
        try:
            lps.append(lp_optimum(case.target, case.draft, case.K, case.L, kind, case.prompt, temperature=case.temperature))
        except InvalidInputError:  # above the LP's size ceiling
            lps.append(math.nan)
    refs: dict[str, float] = {}
    if case.V ** (case.K * case.L) <= MAX_REFERENCE_TUPLES:
        for name, cls in VERIFIERS.items():
            if case.K > 1 and not cls.multi_draft:
                continue
            refs[name] = expected_accepted(name, case.target, case.draft, case.K, case.L, case.prompt,
                                           temperature=case.temperature)
    _REFERENCE_CACHE[key] = (case.target, case.draft, (lps[0], lps[1], refs))
    return _REFERENCE_CACHE[key][2]


def excess_prefixes(counts: np.ndarray, law: np.ndarray, V: int, n_tokens: int, top: int = 3) -> list[Excess]:
    """The ``top`` prefixes (of 1..n_tokens tokens) with the largest excess frequency over the target."""
    n = counts.sum()
    found: list[Excess] = []
    for (depth, c), (_, exp) in zip(prefix_laws(counts, V, n_tokens), prefix_laws(law, V, n_tokens)):
        obs = c / n
        se = np.sqrt(np.maximum(exp * (1 - exp), 1e-300) / n)
        for idx in np.argsort(exp - obs)[:top]:
            if obs[idx] > exp[idx]:
                prefix = tuple(int(x) for x in np.unravel_index(idx, (V,) * depth))
                found.append(Excess(prefix, float(obs[idx]), float(exp[idx]), float((obs[idx] - exp[idx]) / se[idx])))
    found.sort(key=lambda e: (-(e.observed - e.expected), len(e.prefix)))
    return found[:top]


def _check_args(trials: object, alpha: object, looks: object, batch: object, tv_resolution: object) -> None:
    for name, value, lo in (("trials", trials, 1000), ("looks", looks, 1), ("batch", batch, 1)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < lo:
            raise InvalidInputError(f"audit: {name} must be an integer >= {lo}; got {value!r}")
    for name, value in (("alpha", alpha), ("tv_resolution", tv_resolution)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
            raise InvalidInputError(f"audit: {name} must lie in (0, 1); got {value!r}")


def audit(rule: Any, *, cases: str | Sequence[Any] = "default", trials: int = 2 ** 20, alpha: float = 0.01,
          seed: int = 0, looks: int = 5, batch: int = 2 ** 16, tv_resolution: float = 0.01,
          single_draft: bool | None = None, scalar: bool = False, with_references: bool = True,
          stop_on_bias: bool = False, progress: bool = False) -> AuditReport:
    """Audit ``rule`` (a sampler, see :mod:`mdv.audit.protocol`; an mdv verifier or its name; with
    ``scalar=True`` a per-instance function) on ``cases`` -> :class:`AuditReport`.

    trials: sequences per case at most (the sequential design may stop a case earlier); alpha:
    family-wise error of the verdict "biased" and level of the intervals; looks: number of sequential
    looks per case (trials / 2^(looks-1), ..., trials); single_draft: skip the cases with K > 1 (default:
    the rule's ``multi_draft`` attribute, True if absent); stop_on_bias: stop at the first case decided
    biased (the verdict is then settled: Holm rejects it whatever the other cases give; the cases not run
    are reported as skipped).
    """
    _check_args(trials, alpha, looks, batch, tv_resolution)
    sampler = as_sampler(rule, scalar=scalar)
    name = getattr(sampler, "name", None) or getattr(rule, "__name__", None) or type(rule).__name__
    if single_draft is None:
        single_draft = not getattr(sampler, "multi_draft", True)
    built = resolve_cases(cases)
    generator = torch.Generator().manual_seed(int(seed))
    start = time.perf_counter()
    to_run = [c for c in built if not (single_draft and c.K > 1)]
    C = max(1, len(to_run))
    schedule = sorted({max(1, int(round(trials / 2 ** (looks - 1 - j)))) for j in range(looks)})
    R = len(schedule)
    results: list[CaseResult] = []
    bar = tqdm(built, desc=f"audit {name}", disable=not progress, unit="case")
    stopped = False
    for case in bar:
        N = case.n_tokens
        if stopped:
            results.append(CaseResult(case.name, case.V, case.K, case.L, N, "skipped: stopped at the first bias"))
            continue
        if single_draft and case.K > 1:
            results.append(CaseResult(case.name, case.V, case.K, case.L, N, "skipped: single-draft rule, K > 1"))
            continue
        t0 = time.perf_counter()
        table = build_table(case)
        law = table.target_law(N).numpy()
        tally = Tally.empty(case.V, N)
        p_case, df, used_looks, worst_len = 1.0, 0, 0, N
        for target_n in schedule:
            while tally.sequences < target_n:
                run_batch(sampler, case, table, min(batch, target_n - tally.sequences), generator, tally)
            p_look, df, worst_len = prefix_chi_square(tally.counts, law, case.V, N)
            used_looks += 1
            p_case = min(p_case, min(1.0, R * p_look))
            if p_case <= alpha / C:
                break
        res = CaseResult(case.name, case.V, case.K, case.L, N, "pending", tally.sequences, used_looks, p_case, df,
                         worst_len)
        res.tv, res.tv_low, res.tv_high = tv_interval(tally.counts, law, alpha)
        res.detectable_tv = detectable_tv(tally.sequences, df, alpha / (C * R * N)) if df else 1.0
        res.excess = excess_prefixes(tally.counts, law, case.V, N)
        res.mean_tau, res.mean_tau_low, res.mean_tau_high = mean_interval(tally.first_taus(), alpha)
        if with_references:
            res.lp_valid, res.lp_greedy, res.references = references(case)
            res.exceeds_optimum = bool(res.mean_tau_low > res.lp_greedy + 1e-9)
        res.seconds = time.perf_counter() - t0
        res.sampler_seconds, res.instances = tally.sampler_seconds, tally.instances
        results.append(res)
        bar.set_postfix_str(f"{case.name}: p={p_case:.2g}")
        stopped = stop_on_bias and p_case <= alpha / C
    run = [r for r in results if not r.skipped]
    not_run = sum(r.status == "skipped: stopped at the first bias" for r in results)
    # The cases a stop left out count in the family as p = 1: Holm over all C planned cases.
    rejected = holm([r.p_value for r in run] + [1.0] * not_run, alpha)[:len(run)]
    for r, rej in zip(run, rejected):
        r.status = "biased" if rej else "no bias found"
    if any(rejected):
        verdict = "biased"
    elif run and all(r.detectable_tv <= tv_resolution for r in run):
        verdict = "lossless"
    else:
        verdict = "inconclusive"
    return AuditReport(name, verdict, alpha, tv_resolution, trials, int(seed), results, time.perf_counter() - start)
