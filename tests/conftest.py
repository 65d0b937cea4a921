"""Shared fixtures: context-dependent random toy pairs (some with zero probabilities) and the
verifier lists the parametrised tests run over."""
from __future__ import annotations

import pytest
import torch

import mdv
from mdv.oracle import random_toy_model

torch.set_num_threads(1)  # tiny tensors: threads only add overhead, and CI has 2 cores

LOSSLESS = sorted(name for name, cls in mdv.VERIFIERS.items() if cls.lossless)
ALL_METHODS = sorted(mdv.VERIFIERS)


def toy_pair(V: int, seed: int, zeros: bool = False):
    """(target, draft): independent random context-dependent models; with ``zeros`` about 30% of the
    next-token laws have a zero entry."""
    z = 0.3 if zeros else 0.0
    return (random_toy_model(V, 1000 + seed, zero_prob=z, name=f"target{seed}"),
            random_toy_model(V, 2000 + seed, zero_prob=z, name=f"draft{seed}"))


def drafts_for(method: str) -> tuple[int, ...]:
    return (1, 2, 3) if mdv.VERIFIERS[method].multi_draft else (1,)


@pytest.fixture
def bv_paper_pair():
    """The BV paper's example: context-free target (1/3, 2/3), draft (2/3, 1/3)."""
    from mdv.oracle import iid_toy_model
    return iid_toy_model([1 / 3, 2 / 3], name="target"), iid_toy_model([2 / 3, 1 / 3], name="draft")
