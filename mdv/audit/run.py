"""Running a rule for N emitted tokens on many independent sequences: the audit's harness.

Each batch of n sequences starts at the prompt with the rule freshly ``reset()``.  An iteration draws K
i.i.d. draft blocks per sequence from the draft's exact law at the sequence's current context (inverse
CDF on tabulated laws, :class:`~mdv.audit.table.PrefixTable`), hands the rule the tokens with their exact
q and p, checks what it returns, and appends the kept draft's first tau tokens and the correction/bonus
token to the sequence.  The batch ends when every sequence has N tokens; each iteration emits at least
one, so there are at most N iterations.  What is kept: the base-V code of each sequence's first N
tokens (their law is what the audit tests) and tau of each sequence's first iteration (from the prompt
and the initial state, the iteration the exact E[tau] figures describe).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from mdv.audit.cases import AuditCase
from mdv.audit.protocol import Sampler, SamplerError, check_outcome
from mdv.audit.table import PrefixTable
from mdv.errors import MdvError
from mdv.models.sampling import SamplingConfig


def build_table(case: AuditCase) -> PrefixTable:
    """The laws an audit of ``case`` can reach: prefixes of up to n_tokens - 1 + L tokens."""
    return PrefixTable.build(case.target, case.draft, case.n_tokens - 1 + case.L, case.prompt,
                             SamplingConfig(case.temperature))


@dataclass
class Tally:
    """What the batches of one case have gathered so far."""

    counts: np.ndarray  # [V^N] int64: how often each first-N-token sequence was emitted
    tau_first: list[Tensor] = field(default_factory=list)  # [n] per batch: tau of the first iteration
    sequences: int = 0
    instances: int = 0  # sampler instances (sequences x iterations, fillers included)
    sampler_seconds: float = 0.0
    harness_seconds: float = 0.0

    @staticmethod
    def empty(V: int, n_tokens: int) -> "Tally":
        return Tally(np.zeros(V ** n_tokens, dtype=np.int64))

    def first_taus(self) -> np.ndarray:
        return torch.cat(self.tau_first).numpy() if self.tau_first else np.zeros(0)


def _guarded(where: str, fn: Any, *args: Any) -> Any:
    """``fn(*args)``, any failure of the user's code turned into one :class:`SamplerError` naming ``where``."""
    try:
        return fn(*args)
    except SamplerError:
        raise
    except MdvError as err:
        raise SamplerError(f"{where}: the sampler refused its input: {err}") from err
    except Exception as err:  # the user's code failed: name where, keep the trace as the cause
        raise SamplerError(f"{where}: the sampler raised {type(err).__name__}: {err}") from err


def run_batch(sampler: Sampler, case: AuditCase, table: PrefixTable, n: int, generator: torch.Generator,
              tally: Tally) -> None:
    """Run ``n`` fresh sequences of ``case`` to N tokens and add them to ``tally``."""
    K, L, V, N = case.K, case.L, case.V, case.n_tokens
    start = time.perf_counter()
    sampler_time = 0.0
    if hasattr(sampler, "reset"):
        _guarded(f"case {case.name}, reset()", sampler.reset)
    rows = torch.zeros(n, dtype=torch.long)  # the context row of each sequence (0 = the prompt)
    emitted = torch.zeros(n, dtype=torch.long)
    code = torch.zeros(n, dtype=torch.long)
    done = torch.zeros(n, dtype=torch.bool)
    arange = torch.arange(n)
    iteration = 0
    while not bool(done.all()):
        where = f"case {case.name} (K={K}, L={L}, V={V}), iteration {iteration + 1}"
        context = torch.where(done, torch.zeros_like(rows), rows)  # finished sequences: fillers at the prompt
        tokens, path = table.draw_blocks(context, K, L, generator)  # [n, K, L], [n, K, L+1]
        q = table.q[path[:, :, :L]]  # [n, K, L, V]
        p = table.p[path]  # [n, K, L+1, V]
        t0 = time.perf_counter()
        out = _guarded(where, sampler, tokens, q, p, generator)
        sampler_time += time.perf_counter() - t0
        tau, sel, token = check_outcome(out, n, K, L, V, where)
        if iteration == 0:
            tally.tau_first.append(tau.clone())
        kept = tokens[arange, sel]  # [n, L]
        for j in range(L + 1):
            tok_j = kept[:, j] if j < L else token
            tok_j = torch.where(tau == j, token, tok_j)
            take = (j <= tau) & ~done & (emitted < N)
            code[take] = code[take] * V + tok_j[take]
            rows[take] = table.child[rows[take], tok_j[take]]
            emitted += take.long()
        done |= emitted >= N
        tally.instances += n
        iteration += 1
    tally.counts += np.bincount(code.numpy(), minlength=V ** N)
    tally.sequences += n
    tally.sampler_seconds += sampler_time
    tally.harness_seconds += time.perf_counter() - start - sampler_time
