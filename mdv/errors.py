"""Typed errors of mdv.  Every user-facing check raises one of these with a message that names the
argument, what is wrong with it, and how to fix it."""
from __future__ import annotations


class MdvError(Exception):
    """Base class of mdv's own errors."""


class InvalidInputError(MdvError, ValueError):
    """An argument has the wrong shape, range or value (a ``ValueError``)."""


class UnknownNameError(MdvError, KeyError, ValueError):
    """An unknown registry name (method, dataset, ...); the message lists the valid ones."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class MissingAssetError(MdvError, FileNotFoundError):
    """A model or dataset file is absent or corrupt; the message names the command that fetches it."""


def unknown_name(kind: str, name: object, valid: list[str] | tuple[str, ...]) -> UnknownNameError:
    """Build the standard "unknown X" error listing the valid choices."""
    return UnknownNameError(f"unknown {kind} {name!r}; valid {kind}s are: {', '.join(sorted(valid))}")
