"""Context-dependent random toy models for tests, audits and the theory tables."""
from __future__ import annotations

import numpy as np

from mdv.errors import InvalidInputError
from mdv.models.callable import CallableLM


def random_toy_model(vocab_size: int, seed: int, *, concentration: float = 0.7, zero_prob: float = 0.0,
                     name: str | None = None) -> CallableLM:
    """A :class:`CallableLM` whose next-token law after each prefix is an independent Dirichlet draw.

    The law after prefix u is seeded by ``(seed, len(u), *u)``, so the model is a fixed, reproducible
    function of the prefix.  With ``zero_prob > 0`` a random entry is set to zero with that probability
    (the row is renormalised; it always keeps at least one positive entry).
    """
    if isinstance(zero_prob, bool) or not isinstance(zero_prob, (int, float)) or not 0.0 <= zero_prob <= 1.0:
        raise InvalidInputError(f"zero_prob is a probability and must lie in [0, 1]; got {zero_prob!r}")
    if isinstance(concentration, bool) or not isinstance(concentration, (int, float)) or not concentration > 0:
        raise InvalidInputError(f"concentration (of the Dirichlet draws) must be a number > 0; got {concentration!r}")

    def fn(prefix: tuple[int, ...]) -> np.ndarray:
        rng = np.random.default_rng([seed, len(prefix), *prefix])
        v = rng.dirichlet(concentration * np.ones(vocab_size))
        if zero_prob > 0 and vocab_size > 1 and rng.random() < zero_prob:
            v[rng.integers(vocab_size)] = 0.0
            v = v / v.sum()
        return v

    return CallableLM(fn, vocab_size, name=name or f"toy(V={vocab_size}, seed={seed})")


def iid_toy_model(probs: list[float] | np.ndarray, name: str | None = None) -> CallableLM:
    """A context-free model: the same next-token law after every prefix (the papers' examples)."""
    v = np.asarray(probs, dtype=np.float64)
    return CallableLM(lambda prefix: v, len(v), name=name or f"iid{tuple(np.round(v, 4))}")
