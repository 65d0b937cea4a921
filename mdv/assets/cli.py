"""The command line, ``python -m mdv.assets list|fetch|check``: the state of each asset and :func:`main`."""
from __future__ import annotations

import argparse
import sys
from typing import Iterable, Sequence

from mdv.assets.cache import _verify, cache_dir, target_path
from mdv.assets.catalog import ASSETS, default_assets, get_asset
from mdv.assets.fetching import fetch
from mdv.errors import MissingAssetError


def _status_line(name: str) -> tuple[bool, str]:
    a = ASSETS[name]
    p = target_path(name)
    reason = _verify(a, p)
    state = "ok" if reason is None else ("absent" if reason == "not found" else f"CORRUPT: {reason}")
    opt = " (optional)" if a.optional else ""
    return reason is None, f"{name:32s} {a.kind:8s} {state:10s} {p}{opt}"


def main(argv: Sequence[str] | None = None) -> int:
    """Command line entry point: ``list``, ``fetch [names...]``, ``check [names...]``."""
    from mdv import assets as _package  # its docstring describes the command

    ap = argparse.ArgumentParser(prog="python -m mdv.assets", description=_package.__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="list every asset and its state")
    f = sub.add_parser("fetch", help="fetch assets (default: all non-optional ones)")
    f.add_argument("names", nargs="*")
    f.add_argument("--force", action="store_true", help="download again even when present")
    c = sub.add_parser("check", help="verify assets (default: all non-optional ones); exit 1 if any is missing")
    c.add_argument("names", nargs="*")
    args = ap.parse_args(argv)
    if args.cmd == "list":
        print(f"cache: {cache_dir()}")
        for n in ASSETS:
            print(_status_line(n)[1])
        return 0
    names: Iterable[str] = args.names or default_assets()
    try:
        for n in names:
            get_asset(n)
    except KeyError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.cmd == "fetch":
        failed = []
        for n in names:
            try:
                fetch(n, force=args.force)
            except MissingAssetError as e:
                print(f"[mdv.assets] {n}: FAILED: {e}", file=sys.stderr)
                failed.append(n)
        return 1 if failed else 0
    bad = 0
    for n in names:
        ok, line = _status_line(n)
        print(line)
        bad += not ok
    if bad:
        print(f"{bad} asset(s) missing or corrupt; fetch with: python -m mdv.assets fetch "
              + " ".join(n for n in names if not _status_line(n)[0]), file=sys.stderr)
    return 1 if bad else 0
