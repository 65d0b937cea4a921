"""Monte-Carlo counterparts of the exact laws: many independent iterations of a verifier's fast
sampler on a tiny model pair, for statistical tests of the vectorised paths against the oracle."""
from __future__ import annotations

from collections import Counter
from typing import Any, Sequence

import numpy as np
import torch
from scipy import stats
from torch import Tensor

from mdv.models.base import LanguageModel
from mdv.models.sampling import SamplingConfig
from mdv.oracle.enumerate import _resolve, block_table
from mdv.verify.base import Block, Uniforms, Verifier


def sample_blocks(target: LanguageModel, draft: LanguageModel, K: int, L: int, trials: int,
                  prompt: Sequence[int] = (), sampling: SamplingConfig | None = None,
                  generator: torch.Generator | None = None) -> Block:
    """``trials`` independent tuples of K i.i.d. draft blocks drawn from the draft, with their p and q.

    Blocks are drawn from the exact block law Q (all V^L blocks tabulated once), so this is cheap for
    tiny vocabularies.  -> Block with B = trials.
    """
    toks, q_blk, p_blk, log_q = block_table(target, draft, L, prompt, sampling)
    idx = torch.multinomial(log_q.exp(), trials * K, replacement=True, generator=generator).reshape(trials, K)
    return Block(toks[idx], q_blk[idx], p_blk[idx])


def sample_iterations(method: str | Verifier, target: LanguageModel, draft: LanguageModel, K: int, L: int,
                      trials: int, seed: int = 0, prompt: Sequence[int] = (), temperature: float = 1.0,
                      top_k: int | None = None, top_p: float | None = None, batch: int = 200_000,
                      **verifier_options: Any) -> Counter:
    """Counts of the emitted tokens of ``trials`` independent iterations of ``method``'s fast sampler
    from the verifier's initial state."""
    verifier = _resolve(method, verifier_options)
    verifier.check_drafts(K)
    sampling = SamplingConfig(temperature, top_k, top_p)
    gen = torch.Generator().manual_seed(seed)
    counts: Counter = Counter()
    V = target.vocab_size
    done = 0
    while done < trials:
        n = min(batch, trials - done)
        block = sample_blocks(target, draft, K, L, n, prompt, sampling, gen)
        out = verifier.sample(block, Uniforms.draw(n, K, L, gen), verifier.initial_state())
        kept = block.tokens[torch.arange(n), out.sel]  # [n, L]
        pos = torch.arange(L)
        prefix = torch.where(pos < out.tau.unsqueeze(-1), kept, torch.full_like(kept, -1))
        keys = torch.cat([prefix, out.token.unsqueeze(-1)], -1)
        for row, c in _count_rows(keys, V):
            counts[tuple(x for x in row[:-1] if x >= 0) + (row[-1],)] += c
        done += n
    assert all(0 <= t < V for key in counts for t in key)
    return counts


def _count_rows(keys: Tensor, V: int) -> list[tuple[list[int], int]]:
    """The distinct rows of ``keys`` [n, m] (entries in -1..V-1) with their counts, in lexicographic order.

    Rows are read as base-(V+1) integers when they fit in int64 (a 1-D ``bincount`` / ``unique`` is far
    faster than ``unique(dim=0)``), else counted by ``unique(dim=0)``.
    """
    n, m = keys.shape
    base = V + 1
    if n == 0 or base ** m >= 2 ** 62:
        uniq, cnt = torch.unique(keys, dim=0, return_counts=True)
        return list(zip(uniq.tolist(), cnt.tolist()))
    weights = torch.tensor([base ** (m - 1 - j) for j in range(m)], dtype=torch.long)
    code = (keys.long() + 1) @ weights  # [n]
    if base ** m <= 4 * n + 4096:
        cnt = torch.bincount(code, minlength=base ** m)
        codes = cnt.nonzero().squeeze(-1)
        cnt = cnt[codes]
    else:
        codes, cnt = torch.unique(code, return_counts=True)
    digits = (codes.unsqueeze(-1) // weights) % base - 1  # [G, m]
    return list(zip(digits.tolist(), cnt.tolist()))


def chi_square_pvalue(counts: Counter, law: dict[tuple, float], min_expected: float = 5.0) -> float:
    """Pearson chi-square goodness of fit of ``counts`` to ``law``.

    Cells with expected count < ``min_expected`` are pooled into one cell; an observed outcome that the
    law gives probability 0 makes the p-value 0.
    """
    n = sum(counts.values())
    if any(law.get(k, 0.0) <= 0 for k in counts):
        return 0.0
    obs, exp, pool_obs, pool_exp = [], [], 0.0, 0.0
    for k, pk in law.items():
        e = n * pk
        if e < min_expected:
            pool_obs += counts.get(k, 0)
            pool_exp += e
        else:
            obs.append(counts.get(k, 0))
            exp.append(e)
    if pool_exp > 0:
        obs.append(pool_obs)
        exp.append(pool_exp)
    obs_a, exp_a = np.asarray(obs, float), np.asarray(exp, float)
    exp_a *= obs_a.sum() / exp_a.sum()  # the law sums to 1 up to rounding
    if len(obs_a) < 2:
        return 1.0
    stat = float(((obs_a - exp_a) ** 2 / exp_a).sum())
    return float(stats.chi2.sf(stat, len(obs_a) - 1))
