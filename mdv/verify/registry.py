"""The verifier registry: name -> class, filled by the verifiers themselves.

A verifier is one file: a :class:`~mdv.verify.base.Verifier` subclass decorated with
:func:`register_verifier`.  The registry fills itself in two steps:

1. **Built-ins**: every module of the ``mdv.verify`` package (except the shared ``base``, ``registry``,
   ``adjust`` and ``_``-private ones) is imported and registers its class; they are listed in name order.
2. **Plug-ins**, after them, on the first read of :data:`VERIFIERS` (so that a plug-in module may import any
   part of mdv): every entry point of the group ``mdv.verifiers`` (``importlib.metadata``) is loaded; it
   names a Verifier subclass (``my_rules = "my_pkg.rules:MyRule"``) or a module whose classes register
   themselves.  A plug-in that fails to load is skipped with one warning naming the entry point and the
   error, so a broken plug-in never breaks mdv.

Everything that lists methods derives from :data:`VERIFIERS`: ``mdv.generate``'s ``method`` choices, the
sweep schema's ``Method`` enum and ``mdv/conf/method/all.yaml`` (``${mdv_methods:all}``), the paired
measurement's default ``paired.methods``.  ``get_verifier`` validates the name and lists the choices.
"""
from __future__ import annotations

from typing import Any, TypeVar

from mdv._registry import Registry, add_class, instantiate
from mdv.verify.base import Verifier

#: The entry-point group third-party verifiers register under.
ENTRY_POINT_GROUP = "mdv.verifiers"
#: Modules of ``mdv.verify`` that hold shared code, not a verifier.
_NOT_VERIFIERS = frozenset({"base", "registry", "adjust", "selection"})

VERIFIERS: dict[str, type[Verifier]] = Registry(ENTRY_POINT_GROUP, "Verifier", lambda cls: register_verifier(cls))
V = TypeVar("V", bound=type)


def register_verifier(cls: V) -> V:
    """Class decorator: add ``cls`` to :data:`VERIFIERS` under ``cls.name``.  A second class under a name
    already taken is refused (:class:`~mdv.errors.InvalidInputError` naming both); registering the same
    class again is a no-op."""
    add_class(VERIFIERS, cls, Verifier, reserved={"ar": "the autoregressive baseline"})
    return cls


def get_verifier(name: str, **options: Any) -> Verifier:
    """A fresh verifier instance by registry name (``bv``, ``gbv``, ``mdbv``, ``sd``, ``spectr``,
    ``spectr_gbv`` and any plug-in)."""
    return instantiate(VERIFIERS, name, options, kind="verifier", name_kind="method")


def _register_builtins() -> None:
    import mdv.verify as package

    VERIFIERS.register_builtins(package, _NOT_VERIFIERS)  # type: ignore[attr-defined]


_register_builtins()  # plug-ins: on the first read of VERIFIERS (mdv._registry.Registry)
