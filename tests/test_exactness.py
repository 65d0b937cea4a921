"""Every verifier flagged lossless reproduces the target law of the first N >= L+2 generated tokens,
across several iterations with its state, by exact enumeration (total variation < 1e-9)."""
from __future__ import annotations

import pytest

import mdv
from mdv.oracle import exact_law, target_law, total_variation
from tests.conftest import LOSSLESS, drafts_for, toy_pair

# (K, L) -> vocabulary size: enumeration costs V^(K·L) draft tuples per iteration.
VOCAB = {(1, 1): 4, (1, 2): 3, (1, 3): 3, (2, 1): 4, (2, 2): 3, (2, 3): 2, (3, 1): 3, (3, 2): 2, (3, 3): 2}
CASES = [(m, K, L, zeros) for m in LOSSLESS for K in drafts_for(m) for L in (1, 2, 3) for zeros in (False, True)]


@pytest.mark.parametrize("method,K,L,zeros", CASES, ids=[f"{m}-K{K}-L{L}-{'zeros' if z else 'dense'}"
                                                          for m, K, L, z in CASES])
def test_lossless_reproduces_target_law(method: str, K: int, L: int, zeros: bool) -> None:
    V = VOCAB[(K, L)]
    target, draft = toy_pair(V, seed=10 * K + L, zeros=zeros)
    n_tokens = L + 2
    law = exact_law(method, target, draft, K, L, n_tokens)
    assert abs(sum(law.values()) - 1.0) < 1e-9
    tv = total_variation(law, target_law(target, n_tokens))
    assert tv < 1e-9, f"{method} K={K} L={L}: TV {tv:.3g} to the target law"


@pytest.mark.parametrize("method", LOSSLESS)
def test_lossless_at_temperature_and_top_k(method: str) -> None:
    """Sampling transforms are applied identically to p and q; exactness holds for the transformed target."""
    K = 2 if mdv.VERIFIERS[method].multi_draft else 1
    target, draft = toy_pair(3, seed=7, zeros=True)
    for kw in ({"temperature": 0.5}, {"temperature": 1.7, "top_k": 2}, {"temperature": 0.8, "top_p": 0.7}):
        law = exact_law(method, target, draft, K, 2, 4, **kw)
        tv = total_variation(law, target_law(target, 4, **kw))
        assert tv < 1e-9, f"{method} {kw}: TV {tv:.3g}"


@pytest.mark.parametrize("method", sorted(mdv.VERIFIERS))
def test_greedy_temperature_zero_is_prefix_matching(method: str) -> None:
    """At T = 0 every method, lossless or not, emits exactly the greedy continuation."""
    K = 3 if mdv.VERIFIERS[method].multi_draft else 1
    target, draft = toy_pair(3, seed=3)
    law = exact_law(method, target, draft, K, 3, 6, temperature=0.0)
    greedy = target_law(target, 6, temperature=0.0)
    assert len(greedy) == 1
    assert total_variation(law, greedy) < 1e-12
