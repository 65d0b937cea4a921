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


#: Cells whose expected count is below this are pooled into one cell before a chi-square test.
MIN_EXPECTED = 5.0


def chi_square(counts: np.ndarray, law: np.ndarray, min_expected: float = MIN_EXPECTED) -> tuple[float, int]:
    """Pearson's chi-square test of ``counts`` [m] against the exact ``law`` [m] -> (p-value, degrees of freedom).

    Cells of expected count < ``min_expected`` are pooled into one; a count in a cell the law gives
    probability 0 makes the p-value 0 (an impossible outcome was observed); fewer than two cells: 1.
    """
    counts = np.asarray(counts, dtype=np.float64)
    law = np.asarray(law, dtype=np.float64)
    n = counts.sum()
    if n == 0:
        return 1.0, 0
    if (counts[law <= 0] > 0).any():
        return 0.0, 0
    expected = n * law / law.sum()  # the law sums to 1 up to rounding
    big = expected >= min_expected
    obs, exp = counts[big], expected[big]
    if (~big).any() and expected[~big].sum() > 0:
        obs = np.append(obs, counts[~big].sum())
        exp = np.append(exp, expected[~big].sum())
    df = len(obs) - 1
    if df < 1:
        return 1.0, 0
    stat = float(((obs - exp) ** 2 / exp).sum())
    return float(stats.chi2.sf(stat, df)), df


def chi_square_pvalue(counts: Counter, law: dict[tuple, float], min_expected: float = MIN_EXPECTED) -> float:
    """:func:`chi_square` of ``counts`` against ``law``, both keyed by outcome (an observed outcome the law
    does not list has probability 0: p-value 0)."""
    if any(law.get(k, 0.0) <= 0 for k in counts):
        return 0.0
    keys = list(law)
    return chi_square(np.array([counts.get(k, 0) for k in keys]), np.array([law[k] for k in keys]), min_expected)[0]
