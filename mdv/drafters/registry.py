"""The drafter registry: name -> class, filled by the drafters themselves (as :mod:`mdv.verify.registry`).

1. **Built-ins**: every module of ``mdv.drafters`` except ``base`` and ``registry`` is imported and its
   :func:`register_drafter` classes are listed in name order.
2. **Plug-ins**, on the first read of :data:`DRAFTERS`: every entry point of the group ``mdv.drafters`` names a
   :class:`~mdv.drafters.base.Drafter` subclass or a module whose classes register themselves; one that
   fails to load is skipped with one warning, so a broken plug-in never breaks mdv.

:func:`get_drafter` validates the name and the options before any generation.
"""
from __future__ import annotations

from typing import Any, TypeVar

from mdv._registry import Registry, add_class, instantiate
from mdv.drafters.base import Drafter
from mdv.errors import InvalidInputError

#: The entry-point group third-party drafters register under.
ENTRY_POINT_GROUP = "mdv.drafters"
_NOT_DRAFTERS = frozenset({"base", "registry"})

DRAFTERS: dict[str, type[Drafter]] = Registry(ENTRY_POINT_GROUP, "Drafter", lambda cls: register_drafter(cls))
D = TypeVar("D", bound=type)


def register_drafter(cls: D) -> D:
    """Class decorator: add ``cls`` to :data:`DRAFTERS` under ``cls.name`` (a name taken by another class
    is refused; the same class again is a no-op)."""
    add_class(DRAFTERS, cls, Drafter)
    return cls


def get_drafter(name: Any, **options: Any) -> Drafter:
    """A fresh drafter by registry name (``eagle``, ``layerskip``, ``model``, ``ngram`` and any plug-in) with its
    options; a :class:`~mdv.drafters.base.Drafter` instance is returned as is (no options allowed)."""
    if isinstance(name, Drafter):
        if options:
            raise InvalidInputError(f"drafter options {sorted(options)} given with a drafter instance {name!r};"
                                    " set them on the instance")
        return name
    return instantiate(DRAFTERS, name, options, kind="drafter")


def _register_builtins() -> None:
    import mdv.drafters as package

    DRAFTERS.register_builtins(package, _NOT_DRAFTERS)  # type: ignore[attr-defined]


_register_builtins()  # plug-ins: on the first read of DRAFTERS (mdv._registry.Registry)
