"""Synthetic blocks for timing verifiers (the ``verifier`` benchmark's default and the paired measurement's
calibration).  Its own module, importing nothing of mdv's but the verifiers' Block: :mod:`mdv.paired.cost`
uses it, as does :mod:`mdv.bench.verifier`, which also draws real blocks through :mod:`mdv.paired` (so this
cannot live there without an import cycle); the ``mdv.bench`` package exports it.
"""
from __future__ import annotations

import torch


def synthetic_block(V: int, K: int, L: int, *, generator: torch.Generator, device: torch.device | str = "cpu",
                    logit_scale: float = 3.0, target_noise: float = 1.0):
    """A :class:`~mdv.verify.base.Block` (B = 1) of K drafts of length L over V tokens in float64.

    q = softmax(logit_scale · z), p = softmax(logit_scale · z + target_noise · z') with standard normal
    z, z' (a target close to the draft, as for a trained pair); every draft token is sampled from its q
    row, so it has q > 0.  The first position's laws are shared by all drafts (one context), deeper ones
    differ per draft.  -> Block with tokens [1, K, L], q [1, K, L, V], p [1, K, L+1, V].
    """
    from mdv.verify.base import Block

    dev = torch.device(device)
    z = logit_scale * torch.randn((1, K, L + 1, V), generator=generator, dtype=torch.float64, device=dev)
    z[:, :, 0] = z[:, :1, 0]
    zp = z + target_noise * torch.randn((1, K, L + 1, V), generator=generator, dtype=torch.float64, device=dev)
    zp[:, :, 0] = zp[:, :1, 0]
    q = torch.softmax(z[:, :, :L], -1)
    p = torch.softmax(zp, -1)
    tokens = torch.multinomial(q.reshape(-1, V), 1, generator=generator).reshape(1, K, L)
    return Block(tokens, q, p).validate()


__all__ = ["synthetic_block"]
