"""The verifier registry: name -> class.  ``get_verifier`` validates the name and lists the choices."""
from __future__ import annotations

import inspect
from typing import Any

from mdv.errors import InvalidInputError, unknown_name
from mdv.verify.base import Verifier
from mdv.verify.bv import BlockVerification
from mdv.verify.gbv import GreedyBlockVerification
from mdv.verify.mdbv import MultiDraftBlockVerification
from mdv.verify.sd import SpeculativeSampling
from mdv.verify.spectr import SpecTr
from mdv.verify.spectr_gbv import SpecTrGBV

VERIFIERS: dict[str, type[Verifier]] = {
    cls.name: cls
    for cls in (SpeculativeSampling, SpecTr, BlockVerification, GreedyBlockVerification, SpecTrGBV,
                MultiDraftBlockVerification)
}


def get_verifier(name: str, **options: Any) -> Verifier:
    """A fresh verifier instance by registry name (``sd``, ``spectr``, ``bv``, ``gbv``, ``spectr_gbv``, ``mdbv``)."""
    try:
        cls = VERIFIERS[name]
    except (KeyError, TypeError):
        raise unknown_name("method", name, list(VERIFIERS)) from None
    accepted = [p for p in inspect.signature(cls).parameters if p not in ("self", "args", "kwargs")]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise InvalidInputError(
            f"verifier {name!r} has no option(s) {', '.join(map(repr, unknown))}; its options are: "
            + (", ".join(accepted) if accepted else "none"))
    return cls(**options)
