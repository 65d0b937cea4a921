"""The verifier registry: name -> class, filled by the verifiers themselves.

A verifier is one file: a :class:`~mdv.verify.base.Verifier` subclass decorated with
:func:`register_verifier`.  The registry fills itself in two steps, the first time :mod:`mdv.verify` is
imported:

1. **Built-ins**: every module of the ``mdv.verify`` package (except the shared ``base``, ``registry``,
   ``adjust`` and ``_``-private ones) is imported and registers its class; they are listed in name order.
2. **Plug-ins**, after them: every entry point of the group ``mdv.verifiers`` (``importlib.metadata``) is loaded; it
   names a Verifier subclass (``my_rules = "my_pkg.rules:MyRule"``) or a module whose classes register
   themselves.  A plug-in that fails to load is skipped with one warning naming the entry point and the
   error, so a broken plug-in never breaks mdv.

Everything that lists methods derives from :data:`VERIFIERS`: ``mdv.generate``'s ``method`` choices, the
sweep schema's ``Method`` enum and ``mdv/conf/method/all.yaml`` (``${mdv_methods:all}``), the paired
measurement's default ``paired.methods``.  ``get_verifier`` validates the name and lists the choices.
"""
from __future__ import annotations

import importlib
import inspect
import logging
import pkgutil
from typing import Any, TypeVar

from mdv.errors import InvalidInputError, unknown_name
from mdv.verify.base import Verifier

log = logging.getLogger(__name__)

#: The entry-point group third-party verifiers register under.
ENTRY_POINT_GROUP = "mdv.verifiers"
#: Modules of ``mdv.verify`` that hold shared code, not a verifier.
_NOT_VERIFIERS = frozenset({"base", "registry", "adjust"})

VERIFIERS: dict[str, type[Verifier]] = {}
V = TypeVar("V", bound=type)


def register_verifier(cls: V) -> V:
    """Class decorator: add ``cls`` to :data:`VERIFIERS` under ``cls.name``.  A second class under a name
    already taken is refused (:class:`~mdv.errors.InvalidInputError` naming both); registering the same
    class again is a no-op."""
    if not (inspect.isclass(cls) and issubclass(cls, Verifier)):
        raise InvalidInputError(f"register_verifier: {cls!r} is not a subclass of mdv.verify.base.Verifier")
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name.isidentifier():
        raise InvalidInputError(
            f"register_verifier: {cls.__qualname__}.name must be an identifier-like string (it becomes a"
            f" method name in configs); got {name!r}")
    if name == "ar":
        raise InvalidInputError(f"register_verifier: {cls.__qualname__}.name 'ar' is the autoregressive baseline")
    old = VERIFIERS.get(name)
    if old is not None and old is not cls:
        raise InvalidInputError(
            f"register_verifier: the name {name!r} of {cls.__module__}.{cls.__qualname__} is already taken by"
            f" {old.__module__}.{old.__qualname__}; give the new verifier another `name`")
    VERIFIERS[name] = cls
    return cls


def _register_builtins() -> None:
    import mdv.verify as package

    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        if info.name.startswith("_") or info.name in _NOT_VERIFIERS:
            continue
        importlib.import_module(f"{package.__name__}.{info.name}")
    # name order, whatever order the modules' own imports registered them in
    ordered = sorted(VERIFIERS.items())
    VERIFIERS.clear()
    VERIFIERS.update(ordered)


def _register_plugins() -> None:
    from importlib.metadata import entry_points

    for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        try:
            obj = ep.load()
            if inspect.isclass(obj):
                register_verifier(obj)
            elif not inspect.ismodule(obj):
                raise InvalidInputError(f"it names {type(obj).__name__} {obj!r}, not a Verifier class or a module")
        except Exception as e:  # a broken plug-in is reported, never fatal
            log.warning("mdv verifier plug-in %r (%s) skipped: %s: %s", ep.name, ep.value, type(e).__name__,
                        str(e).splitlines()[0] if str(e) else "")


def get_verifier(name: str, **options: Any) -> Verifier:
    """A fresh verifier instance by registry name (``bv``, ``gbv``, ``mdbv``, ``sd``, ``spectr``,
    ``spectr_gbv`` and any plug-in)."""
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


_register_builtins()
_register_plugins()
