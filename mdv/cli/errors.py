"""Clean failure for the Hydra entry points: one line naming the problem, a non-zero exit, no
traceback (set HYDRA_FULL_ERROR=1 for the full trace).

Two kinds of bad input reach a command:

* a value the task checks (K = 0, an unknown dataset, a missing model file, ...): an
  :class:`~mdv.errors.MdvError` raised in the task function, turned into ``error: <message>`` and exit
  status 2 by :func:`clean_errors`;
* a config the schema rejects while Hydra composes it, before the task starts (an unknown option of a
  config group such as ``dataset=gsm9k``, an unknown key, a value of the wrong type, a malformed
  override): Hydra would print a multi-line report and exit 1; :func:`hydra_cli` turns it into the same
  single ``error:`` line and exit status 2.
"""
from __future__ import annotations

import functools
import os
import sys
from typing import Any, Callable

from mdv.errors import MdvError

#: Exit status of a command given bad input (argparse uses 2 as well).
EXIT_BAD_INPUT = 2
_DETAIL_PREFIXES = ("full_key:", "reference_type=", "object_type=")


def _full_error() -> bool:
    return os.environ.get("HYDRA_FULL_ERROR") == "1"


def clean_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate a Hydra task function: an mdv error becomes ``error: <message>`` and exit status 2."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except MdvError as err:
            if _full_error():
                raise
            print(f"error: {' '.join(str(err).split())}", file=sys.stderr)
            sys.exit(EXIT_BAD_INPUT)

    return wrapper


def _lines(text: str) -> list[str]:
    out = []
    for line in str(text).splitlines():
        line = line.strip()
        if line.startswith("Config search path:"):
            break
        if line and not line.startswith(_DETAIL_PREFIXES):
            out.append(line.rstrip("."))
    return out


def compose_error_line(err: BaseException) -> str:
    """One line for a Hydra composition error: the unknown option with the valid ones, or Hydra's
    message and the schema's reason, without the search path and the OmegaConf key details."""
    from hydra.errors import MissingConfigException, OverrideParseException

    if isinstance(err, MissingConfigException) and err.missing_cfg_file and err.options:
        group, _, name = str(err.missing_cfg_file).rpartition("/")
        if group:
            return (f"unknown {group} option {name!r}; valid {group} options are: {', '.join(err.options)}"
                    f" (set it with {group}=<option>)")
    parts = _lines(str(err))
    if isinstance(err, OverrideParseException):
        parts = [f"cannot parse the override {err.override!r}"] + parts
    elif err.__cause__ is not None:
        cause = _lines(str(err.__cause__))
        parts = parts[:1] + cause[:1] + parts[1:]
    return "; ".join(parts) if parts else type(err).__name__


def hydra_cli(main: Callable[[], Any]) -> Any:
    """Run a ``@hydra.main`` entry point so that a config error Hydra finds while composing (before the
    task function runs) is one ``error: <message>`` line and exit status 2, like an mdv error in the task.
    With HYDRA_FULL_ERROR=1 Hydra reports it as usual, with the trace."""
    try:
        from hydra._internal import utils as hydra_utils
        from hydra.errors import CompactHydraException
    except ImportError:  # another Hydra layout: keep Hydra's own report
        return main()
    original = getattr(hydra_utils, "run_and_report", None)
    if original is None:
        return main()

    def run_and_report(func: Callable[[], Any]) -> Any:
        def guarded() -> Any:
            try:
                return func()
            except CompactHydraException as err:
                if _full_error():
                    raise
                print(f"error: {compose_error_line(err)}", file=sys.stderr)
                sys.exit(EXIT_BAD_INPUT)

        return original(guarded)

    hydra_utils.run_and_report = run_and_report
    try:
        return main()
    finally:
        hydra_utils.run_and_report = original
