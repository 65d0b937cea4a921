"""What the registries of rules share (:mod:`mdv.verify.registry`, :mod:`mdv.drafters.registry`): built-ins
found by importing a package's modules, plug-ins loaded from an entry-point group, options checked
against the class's signature."""
from __future__ import annotations

import importlib
import inspect
import logging
import pkgutil
from types import ModuleType
from typing import Any, Callable, Iterable

from mdv.errors import InvalidInputError, unknown_name

log = logging.getLogger("mdv.registry")


class Registry(dict):
    """name -> class: the built-ins, registered when their package is imported, then the plug-ins of the
    entry-point group ``group``, loaded on the first *read* (``[]``, ``in``, iteration, ``get``, ...).

    Loading plug-ins lazily lets one plug-in module define rules of several kinds (a verifier and a
    drafter) and import any part of mdv: when it loads, mdv is already imported.  Loading them while a
    package of mdv is still being imported would hand the plug-in a partially initialised module.
    """

    def __init__(self, group: str, kind: str, register: Callable[[type], Any]):
        super().__init__()
        self.group, self.kind, self._register = group, kind, register
        self._plugins_loaded = False

    def load_plugins(self) -> None:
        if not self._plugins_loaded:
            self._plugins_loaded = True  # first: a plug-in that reads the registry while loading must not recurse
            register_plugins(self.group, self.kind, self._register)

    def register_builtins(self, package: ModuleType, skip: Iterable[str]) -> None:
        """Import every module of ``package`` except ``skip`` and ``_``-private ones (each registers its
        classes), then order the entries by name, whatever order the imports registered in."""
        skip = frozenset(skip)
        for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
            if not info.name.startswith("_") and info.name not in skip:
                importlib.import_module(f"{package.__name__}.{info.name}")
        ordered = sorted(dict.items(self))
        dict.clear(self)
        dict.update(self, ordered)

    def peek(self, name: str) -> Any:
        """The class registered under ``name`` so far (plug-ins not loaded), or None."""
        return dict.get(self, name)

    def __getitem__(self, name: str) -> Any:
        self.load_plugins()
        return dict.__getitem__(self, name)

    def __contains__(self, name: object) -> bool:
        self.load_plugins()
        return dict.__contains__(self, name)

    def __iter__(self):  # type: ignore[no-untyped-def]
        self.load_plugins()
        return dict.__iter__(self)

    def __len__(self) -> int:
        self.load_plugins()
        return dict.__len__(self)

    def __repr__(self) -> str:
        self.load_plugins()
        return dict.__repr__(self)

    def get(self, name: str, default: Any = None) -> Any:
        self.load_plugins()
        return dict.get(self, name, default)

    def keys(self):  # type: ignore[no-untyped-def]
        self.load_plugins()
        return dict.keys(self)

    def values(self):  # type: ignore[no-untyped-def]
        self.load_plugins()
        return dict.values(self)

    def items(self):  # type: ignore[no-untyped-def]
        self.load_plugins()
        return dict.items(self)

    def copy(self) -> dict[str, Any]:
        self.load_plugins()
        return dict(dict.items(self))


def register_plugins(group: str, kind: str, register: Callable[[type], Any]) -> None:
    """Load every entry point of ``group``: a class goes through ``register``, a module registers its own
    classes on import; one that fails is skipped with one warning naming it, never fatal."""
    from importlib.metadata import entry_points

    for ep in sorted(entry_points(group=group), key=lambda e: e.name):
        try:
            obj = ep.load()
            if inspect.isclass(obj):
                register(obj)
            elif not inspect.ismodule(obj):
                raise InvalidInputError(f"it names {type(obj).__name__} {obj!r}, not a {kind} class or a module")
        except Exception as e:  # a broken plug-in is reported, never fatal
            log.warning("mdv %s plug-in %r (%s) skipped: %s: %s", kind.lower(), ep.name, ep.value, type(e).__name__,
                        str(e).splitlines()[0] if str(e) else "")


def instantiate(registry: dict[str, Any], name: Any, options: dict[str, Any], *, kind: str,
                name_kind: str | None = None) -> Any:
    """A fresh ``registry[name](**options)``: an unknown name lists the choices (as ``name_kind``, e.g.
    "method"), an unknown option lists the class's options."""
    try:
        cls = registry[name]
    except (KeyError, TypeError):
        raise unknown_name(name_kind or kind, name, list(registry)) from None
    check_options(kind, name, cls, options)
    return cls(**options)


def check_options(kind: str, name: str, cls: type, options: dict[str, Any]) -> None:
    """:class:`~mdv.errors.InvalidInputError` listing the options ``cls`` takes when ``options`` has others."""
    accepted = [p for p in inspect.signature(cls).parameters if p not in ("self", "args", "kwargs")]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise InvalidInputError(
            f"{kind} {name!r} has no option(s) {', '.join(map(repr, unknown))}; its options are: "
            + (", ".join(accepted) if accepted else "none"))


def add_class(registry: Registry, cls: Any, base: type, *, reserved: dict[str, str] | None = None) -> None:
    """Add the ``base`` subclass ``cls`` to ``registry`` under ``cls.name``: an identifier, not one of
    ``reserved`` (name -> why), not taken by another class (the same class again is a no-op)."""
    kind = base.__name__.lower()
    where = f"{base.__module__}.{base.__qualname__}"
    if not (inspect.isclass(cls) and issubclass(cls, base)):
        raise InvalidInputError(f"register_{kind}: {cls!r} is not a subclass of {where}")
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name.isidentifier():
        raise InvalidInputError(
            f"register_{kind}: {cls.__qualname__}.name must be an identifier-like string (it becomes a name in"
            f" configs); got {name!r}")
    if reserved and name in reserved:
        raise InvalidInputError(f"register_{kind}: {cls.__qualname__}.name {name!r} is {reserved[name]}")
    old = registry.peek(name)  # not registry.get: a registration must not load the plug-ins
    if old is not None and old is not cls:
        raise InvalidInputError(
            f"register_{kind}: the name {name!r} of {cls.__module__}.{cls.__qualname__} is already taken by"
            f" {old.__module__}.{old.__qualname__}; give the new {kind} another `name`")
    registry[name] = cls
