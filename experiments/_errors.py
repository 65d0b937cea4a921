"""Clean failure for the Hydra entry points: one line naming the problem, a non-zero exit, no
traceback (set HYDRA_FULL_ERROR=1 for the full trace)."""
from __future__ import annotations

import functools
import os
import sys
from typing import Any, Callable

from mdv.errors import MdvError


def clean_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate a Hydra task function: an mdv error becomes ``error: <message>`` and exit status 2."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except MdvError as err:
            if os.environ.get("HYDRA_FULL_ERROR") == "1":
                raise
            print(f"error: {err}", file=sys.stderr)
            sys.exit(2)

    return wrapper
