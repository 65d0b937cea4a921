"""Command line of :mod:`mdv.data`.

::

    python -m mdv.data list                      # datasets, their sources, whether the offline source is cached
    python -m mdv.data fetch [names...]          # fetch offline sources (default: all five datasets') into the cache
    python -m mdv.data fetch --force humaneval   # download again
    python -m mdv.data check [names...]          # verify + read the offline sources; exit 1 when one is missing
    python -m mdv.data show gsm8k -n 3           # print the first 3 prompts (--seed S: a seeded sample as in
                                                 # load_prompts, which samples with seed 0 by default; --source)

Exit status: 0 ok, 1 a source is missing or a fetch failed, 2 bad arguments (unknown dataset).
"""
from __future__ import annotations

import argparse
import sys
from typing import Sequence

from mdv import assets
from mdv.data.registry import DATASETS, SOURCES, DatasetSpec, get_spec, load_prompts
from mdv.errors import InvalidInputError, MissingAssetError, UnknownNameError


def _specs(names: Sequence[str]) -> list[DatasetSpec]:
    return [get_spec(n) for n in (names or list(DATASETS))]


def _offline_state(spec: DatasetSpec) -> str:
    if spec.offline is None:
        return "none"
    missing = [a for a in spec.offline.assets if not assets.is_available(a)]
    return "cached" if not missing else f"absent ({len(missing)}/{len(spec.offline.assets)} assets missing)"


def cmd_list() -> int:
    """Print every dataset with its hub and offline sources."""
    print(f"cache: {assets.cache_dir()}")
    for s in DATASETS.values():
        off = f"{s.offline.name} [{s.offline.kind}]" if s.offline else "-"
        hub = s.hub.label if s.hub else "-"
        print(f"{s.key:10s} {s.kind:5s} offline: {off:30s} {_offline_state(s):12s} hub: {hub}")
    return 0


def cmd_fetch(specs: list[DatasetSpec], force: bool) -> int:
    """Fetch the offline sources of ``specs`` (each asset once), then read them and print counts."""
    names: list[str] = []
    for s in specs:
        for a in (s.offline.assets if s.offline else ()):
            if a not in names:
                names.append(a)
    failed: list[str] = []
    for a in names:
        try:
            assets.fetch(a, force=force)
        except MissingAssetError as e:
            print(f"[mdv.data] {a}: FAILED: {e}", file=sys.stderr)
            failed.append(a)
    for s in specs:
        if s.offline is None:
            print(f"[mdv.data] {s.key}: no offline source (hub only)")
        elif not set(s.offline.assets) & set(failed):
            ps = load_prompts(s.key, source="offline")
            print(f"[mdv.data] {s.key}: {ps.size} prompts -- {ps.label}")
    return 1 if failed else 0


def cmd_check(specs: list[DatasetSpec]) -> int:
    """Verify and read each dataset's offline source; exit status 1 when one is missing or corrupt."""
    bad: list[str] = []
    for s in specs:
        if s.offline is None:
            print(f"{s.key:10s} no offline source (hub only)")
            continue
        try:
            ps = load_prompts(s.key, source="offline")
            print(f"{s.key:10s} ok       {ps.size:5d} prompts  [{ps.source}] {ps.label}")
        except MissingAssetError as e:
            print(f"{s.key:10s} MISSING  {str(e).splitlines()[0]}")
            bad.append(s.key)
    if bad:
        print(f"{len(bad)} dataset source(s) missing or corrupt; fetch with: python -m mdv.data fetch "
              + " ".join(bad), file=sys.stderr)
    return 1 if bad else 0


def cmd_show(name: str, n: int, source: str, seed: int | None) -> int:
    """Print the provenance and the first characters of ``n`` prompts."""
    ps = load_prompts(name, n=n, source=source, seed=seed)
    print(f"{ps.label}\nsource={ps.source} size={ps.size} of {ps.total} selection={ps.selection}")
    for p in ps.prompts:
        text = p.text if len(p.text) <= 300 else p.text[:300] + "..."
        print(f"--- {p.id} [{p.kind}]\n{text}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    ap = argparse.ArgumentParser(prog="python -m mdv.data", description="mdv datasets: offline sources and hub loaders")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="list datasets and their sources")
    f = sub.add_parser("fetch", help="fetch offline sources into the cache (default: all datasets)")
    f.add_argument("names", nargs="*")
    f.add_argument("--force", action="store_true", help="download again even when present")
    c = sub.add_parser("check", help="verify offline sources; exit 1 when one is missing")
    c.add_argument("names", nargs="*")
    s = sub.add_parser("show", help="print a few prompts")
    s.add_argument("name")
    s.add_argument("-n", type=int, default=3)
    s.add_argument("--source", default="auto", choices=SOURCES)
    s.add_argument("--seed", type=int, default=None, help="seeded sample (default: the first n)")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "list":
            return cmd_list()
        if args.cmd == "show":
            return cmd_show(args.name, args.n, args.source, args.seed)
        specs = _specs(args.names)
        return cmd_fetch(specs, args.force) if args.cmd == "fetch" else cmd_check(specs)
    except (UnknownNameError, InvalidInputError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except MissingAssetError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
