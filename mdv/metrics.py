"""Per-generation metrics of the engine, and their aggregation over prompts.

Conventions (algorithms.md §9, §12.14; state them in every table caption):

* **block efficiency** = emitted tokens ÷ target calls, the correction/bonus token included, the emitted
  count capped at ``max_new_tokens`` (AR = 1.00; at most L + 1).  Target calls count decode passes
  only: the prompt prefill is not a call.
* **acceptance rate**, both ways: accepted draft tokens ÷ (K·L·iterations) -- the SpecTr-GBV code's
  convention -- and accepted ÷ (L·iterations).  Accepted lengths are the verifiers' raw tau values,
  not capped.
* **per-position acceptance**: ``reach[i-1]`` = fraction of iterations with tau ≥ i, and the
  conditional rate ``conditional[i-1]`` = #(tau ≥ i) ÷ #(tau ≥ i-1), for i = 1..L.
* **time split**: prefill (prompt into both caches) is separate from decode; decode = draft + target +
  verify + bookkeeping.  tokens/s is reported for decode only and end to end (prefill included).
  For the autoregressive baseline (``method="ar"``), ``verify_s`` is the time spent sampling.
"""
from __future__ import annotations

import math
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence


def block_efficiency(emitted_tokens: int, target_calls: int) -> float:
    """Emitted tokens per target call (bonus/correction included); NaN with no call."""
    return emitted_tokens / target_calls if target_calls > 0 else float("nan")


def accepted_histogram(accepted_lengths: Sequence[int], L: int) -> list[int]:
    """Counts of tau = 0..L.  -> list of length L + 1."""
    hist = [0] * (L + 1)
    for tau in accepted_lengths:
        hist[int(tau)] += 1
    return hist


def position_reach(accepted_lengths: Sequence[int], L: int) -> list[float]:
    """``reach[i-1]`` = fraction of iterations whose accepted length is at least i, i = 1..L."""
    n = len(accepted_lengths)
    if n == 0:
        return [float("nan")] * L
    return [sum(1 for t in accepted_lengths if t >= i) / n for i in range(1, L + 1)]


def conditional_acceptance(accepted_lengths: Sequence[int], L: int) -> list[float]:
    """``cond[i-1]`` = #(tau ≥ i) ÷ #(tau ≥ i-1): the acceptance rate at position i given that the
    block got there (NaN where no iteration reached position i)."""
    out = []
    for i in range(1, L + 1):
        reached = sum(1 for t in accepted_lengths if t >= i - 1)
        out.append(sum(1 for t in accepted_lengths if t >= i) / reached if reached else float("nan"))
    return out


def acceptance_rates(accepted_lengths: Sequence[int], K: int, L: int) -> tuple[float, float]:
    """(accepted ÷ (K·L·iterations), accepted ÷ (L·iterations)); NaN with no iteration."""
    n = len(accepted_lengths)
    if n == 0:
        return float("nan"), float("nan")
    total = float(sum(accepted_lengths))
    return total / (K * L * n), total / (L * n)


class Stopwatch:
    """Accumulates wall time per named phase; ``sync`` (e.g. ``torch.cuda.synchronize``) runs before
    each reading so that asynchronous GPU work is charged to the phase that launched it."""

    def __init__(self, sync: Callable[[], None] | None = None):
        self.sync = sync
        self.seconds: dict[str, float] = {}

    def now(self) -> float:
        if self.sync is not None:
            self.sync()
        return time.perf_counter()

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        t0 = self.now()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + self.now() - t0

    def get(self, name: str) -> float:
        return self.seconds.get(name, 0.0)


@dataclass
class GenerationStats:
    """What one generation records; :meth:`as_dict` gives the ``.stats`` dict of
    :class:`mdv.engine.GenerationResult`."""

    method: str
    K: int
    L: int
    max_new_tokens: int
    prompt_length: int
    new_tokens: int = 0
    target_calls: int = 0
    draft_calls: int = 0
    accepted_lengths: list[int] = field(default_factory=list)
    selected_drafts: list[int] = field(default_factory=list)
    stop_reason: str = "max_new_tokens"
    watch: Stopwatch = field(default_factory=Stopwatch)
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        speculative = self.method != "ar"
        L = self.L
        taus = self.accepted_lengths
        rate_kl, rate_l = acceptance_rates(taus, self.K, L) if speculative else (float("nan"), float("nan"))
        w = self.watch
        prefill, decode = w.get("prefill"), w.get("decode")
        draft, target, verify = w.get("draft"), w.get("target"), w.get("verify")
        total = prefill + decode
        out: dict[str, Any] = {
            "method": self.method,
            "K": self.K if speculative else None,
            "L": L if speculative else None,
            "max_new_tokens": self.max_new_tokens,
            "prompt_length": self.prompt_length,
            "new_tokens": self.new_tokens,
            "target_calls": self.target_calls,
            "draft_calls": self.draft_calls,
            "iterations": self.target_calls,
            "block_efficiency": block_efficiency(self.new_tokens, self.target_calls),
            "accepted_lengths": list(taus),
            "mean_accepted_length": (sum(taus) / len(taus)) if taus else float("nan"),
            "accepted_length_histogram": accepted_histogram(taus, L) if speculative else [],
            "per_position_acceptance": position_reach(taus, L) if speculative else [],
            "conditional_acceptance": conditional_acceptance(taus, L) if speculative else [],
            "acceptance_rate_kl": rate_kl,
            "acceptance_rate_l": rate_l,
            "selected_drafts": list(self.selected_drafts),
            "stop_reason": self.stop_reason,
            "prefill_s": prefill,
            "draft_s": draft,
            "target_s": target,
            "verify_s": verify,
            "other_s": max(decode - draft - target - verify, 0.0),
            "decode_s": decode,
            "total_s": total,
            "tokens_per_second": self.new_tokens / decode if decode > 0 else float("nan"),
            "tokens_per_second_e2e": self.new_tokens / total if total > 0 else float("nan"),
        }
        out.update(self.extra)
        return out


def mean_ci(values: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """Mean and the half-width of its Student-t confidence interval (NaN half-width for n < 2)."""
    xs = [float(v) for v in values if not math.isnan(float(v))]
    n = len(xs)
    if n == 0:
        return float("nan"), float("nan")
    mean = sum(xs) / n
    if n < 2:
        return mean, float("nan")
    from scipy import stats as _st

    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    return mean, float(_st.t.ppf(0.5 + level / 2, n - 1)) * sd / math.sqrt(n)


def aggregate(stats: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Aggregate per-generation ``.stats`` dicts (one per prompt) of one method.

    Pooled ratios (total tokens ÷ total target calls, total accepted ÷ total drafted) next to the
    per-prompt mean and its 95% confidence half-width for block efficiency and tokens/s.
    """
    if not stats:
        return {}
    tokens = sum(s["new_tokens"] for s in stats)
    calls = sum(s["target_calls"] for s in stats)
    decode = sum(s["decode_s"] for s in stats)
    total = sum(s["total_s"] for s in stats)
    taus = [t for s in stats for t in s["accepted_lengths"]]
    first = stats[0]
    out: dict[str, Any] = {
        "method": first["method"], "K": first["K"], "L": first["L"], "n_generations": len(stats),
        "new_tokens": tokens, "target_calls": calls,
        "block_efficiency_pooled": block_efficiency(tokens, calls),
        "tokens_per_second_pooled": tokens / decode if decode > 0 else float("nan"),
        "tokens_per_second_e2e_pooled": tokens / total if total > 0 else float("nan"),
    }
    for key in ("block_efficiency", "tokens_per_second", "tokens_per_second_e2e", "mean_accepted_length"):
        m, h = mean_ci([s[key] for s in stats])
        out[f"{key}_mean"], out[f"{key}_ci95"] = m, h
    if first["L"] is not None:
        rate_kl, rate_l = acceptance_rates(taus, first["K"], first["L"])
        out.update({"acceptance_rate_kl": rate_kl, "acceptance_rate_l": rate_l,
                    "accepted_length_histogram": accepted_histogram(taus, first["L"]),
                    "per_position_acceptance": position_reach(taus, first["L"])})
    for key in ("prefill_s", "draft_s", "target_s", "verify_s", "decode_s", "total_s"):
        out[key] = sum(s[key] for s in stats)
    return out
