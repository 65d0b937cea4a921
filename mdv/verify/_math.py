"""Small numerical helpers shared by the verifiers (float64 throughout).

Conventions: probabilities are float64 tensors whose last dimension is the vocabulary.  A
uniform ``eta`` in [0, 1) *accepts* a test of probability ``h`` iff ``eta < h``, so that h = 0 never
accepts and h = 1 always does.
"""
from __future__ import annotations

import torch
from torch import Tensor

# Masses below this (after scale-free normalisation) are treated as zero (algorithms.md §12.11).
TOL = 1e-12
# exp() of a log-ratio is clamped here: ratios beyond e^700 behave as infinity without overflowing.
MAX_LOG_RATIO = 700.0
# torch's CPU reductions of at least this many elements run on several threads when allowed
# (at::internal::GRAIN_SIZE): a single output is then summed in two passes (another rounding), a batch of
# outputs row by row (each row as a serial sum).
_GRAIN = 32768


def normalize_or(weights: Tensor, fallback: Tensor) -> Tensor:
    """``norm((weights)_+)`` along the last dim; rows whose mass is (numerically) zero take ``fallback``.

    A zero residual has probability 0 in exact arithmetic (algorithms.md §12.11): falling back to the
    effective target keeps the sampler defined without biasing the law.
    """
    w = weights.clamp_min(0.0)
    mass = w.sum(-1, keepdim=True)
    ok = mass > TOL * fallback.sum(-1, keepdim=True).clamp_min(1.0)
    if w.device.type == "cpu" and bool(ok.all()):  # the common case: skip a pass (same values)
        return w.div_(mass)
    return torch.where(ok, w / torch.where(ok, mass, torch.ones_like(mass)), fallback)


def row_sum(x: Tensor, rows: int) -> float:
    """``x.sum()`` of one row (x: [V] or [1, V]), rounded exactly as torch rounds this row's sum over the last
    dim of a contiguous batch of ``rows`` rows (elementwise ops give the same value per element whatever the
    shape; reductions are the one place where the shape can change the rounding)."""
    if rows > 1 and x.numel() >= _GRAIN and torch.get_num_threads() > 1:
        return float(x.reshape(1, -1).expand(2, -1).sum(-1)[0])  # two outputs: row by row, as in the batch
    return float(x.sum())


def safe_ratio(log_num: Tensor, log_den: Tensor) -> Tensor:
    """``exp(log_num - log_den)`` with 0/anything = 0 and x/0 = e^700 (no NaN, no inf)."""
    diff = (log_num - log_den).nan_to_num(nan=0.0, posinf=MAX_LOG_RATIO).clamp_max(MAX_LOG_RATIO)
    return torch.where(torch.isneginf(log_num), torch.zeros_like(diff), diff.exp())


def categorical(probs: Tensor, u: Tensor) -> Tensor:
    """Inverse-CDF draw: the first index whose cumulative mass exceeds ``u * total``.

    probs: [..., V] non-negative; u: [...] uniforms in [0, 1).  Zero-probability entries are never
    drawn.  The same uniform gives the same token in the reference and the fast path.
    """
    cdf = probs.cumsum(-1)
    target = (u * cdf[..., -1]).unsqueeze(-1)
    idx = torch.searchsorted(cdf.contiguous(), target.contiguous(), right=True).squeeze(-1)
    return idx.clamp_max(probs.shape[-1] - 1)


def last_accepted(h: Tensor, coins: Tensor) -> Tensor:
    """``tau = max{i : eta_i < h_i}`` (1-based), 0 if none: the block-verification exit rule.

    h, coins: [..., L] -> [...] int64.  A rejection does not stop the scan (algorithms.md §12.3).
    """
    L = h.shape[-1]
    accepted = coins < h
    idx = torch.arange(1, L + 1, device=h.device).expand_as(accepted)
    return torch.where(accepted, idx, torch.zeros_like(idx)).amax(-1)


def last_accepted_law(h: Tensor) -> Tensor:
    """Exact law of :func:`last_accepted`: ``Pr(tau = i) = h_i * prod_{j > i} (1 - h_j)``, h_0 = 1.

    h: [..., L] -> [..., L+1].
    """
    one = torch.ones_like(h[..., :1])
    h0 = torch.cat([one, h], -1)  # [..., L+1]: h_0 = 1, h_1..h_L
    # suffix[i] = prod_{j = i+1..L} (1 - h_j), suffix[L] = 1
    rev = torch.flip(torch.cumprod(torch.flip(1.0 - h, [-1]), -1), [-1])
    suffix = torch.cat([rev, one], -1)
    return h0 * suffix

