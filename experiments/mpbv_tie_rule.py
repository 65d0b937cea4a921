"""The oracle's verdict on mpbv's tie rule, and its E[tau] against the other multi-draft verifiers.

    python -m experiments.mpbv_tie_rule [--max-kl 9] [--out FILE]

On 3-token toys with ties in r = min(1, p/q) (two tokens with p > q at every prefix of the context-free
pairs; random context-dependent pairs, where ties come and go with the prefix), for K = 2, 3 and L = 2, 3:

* the exact total variation of the first L + 2 generated tokens from the target, for ``mpbv`` (one
  consistent tie rule) and ``mpbv(tie_rule="released")`` (the public artifact's: first child with the largest
  ratio, skew ranking ties by token id);
* the exact one-iteration E[tau] of mpbv (both rules), spectr, mdbv, and the LP optima (valid: the best
  per-iteration-valid verifier, "n/a" above the oracle's size ceiling; greedy: the best verifier that may
  adjust later targets).

Everything is computed by :mod:`mdv.oracle` (enumeration of every draft tuple); the K = 3, L = 3 cells take
about a minute each.  Prints a Markdown table and writes it to ``--out`` when given.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Sequence

from mdv.errors import InvalidInputError
from mdv.oracle import (exact_law, expected_accepted, iid_toy_model, lp_optimum, random_toy_model, target_law,
                        total_variation)

#: name -> (target, draft) builders; "iid" pairs tie tokens 0 and 1 (p > q on both) at every prefix.
TOYS = {
    "iid A": lambda: (iid_toy_model([0.45, 0.35, 0.2], name="t"), iid_toy_model([0.25, 0.25, 0.5], name="d")),
    "iid B": lambda: (iid_toy_model([0.3, 0.3, 0.4], name="t"), iid_toy_model([0.2, 0.1, 0.7], name="d")),
    "rand 22": lambda: (random_toy_model(3, 1022), random_toy_model(3, 2022)),
    "rand 5 (zeros)": lambda: (random_toy_model(3, 1005, zero_prob=0.3), random_toy_model(3, 2005, zero_prob=0.3)),
}
HEADER = ["toy", "K", "L", "TV mpbv", "TV released", "E[tau] mpbv", "E[tau] released", "spectr", "mdbv",
          "LP valid", "LP greedy"]


def row(toy: str, K: int, L: int) -> list[str]:
    target, draft = TOYS[toy]()
    ref = target_law(target, L + 2)
    tv = [total_variation(exact_law("mpbv", target, draft, K, L, L + 2, tie_rule=r), ref)
          for r in ("exact", "released")]
    e = [expected_accepted("mpbv", target, draft, K, L, tie_rule=r) for r in ("exact", "released")]
    e += [expected_accepted(m, target, draft, K, L) for m in ("spectr", "mdbv")]
    e += [_lp(target, draft, K, L, k) for k in ("valid", "greedy")]
    return [toy, str(K), str(L), f"{tv[0]:.2e}", f"{tv[1]:.6f}", *("n/a" if x is None else f"{x:.6f}" for x in e)]


def _lp(target, draft, K: int, L: int, kind: str) -> float | None:
    """The LP optimum, or None above the oracle's size ceilings (the valid LP at K = L = 3)."""
    try:
        return lp_optimum(target, draft, K, L, kind=kind)
    except InvalidInputError:
        return None


def markdown(rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-kl", type=int, default=9, help="skip cells with K·L above this (9: all; 6: fast)")
    ap.add_argument("--out", type=Path, default=None, help="also write the table here")
    args = ap.parse_args(argv)
    rows, t0 = [], time.time()
    for toy in TOYS:
        for K in (2, 3):
            for L in (2, 3):
                if K * L <= args.max_kl:
                    rows.append(row(toy, K, L))
                    print(" | ".join(rows[-1]), f"({time.time() - t0:.0f} s)", file=sys.stderr, flush=True)
    table = markdown(rows)
    print(table)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
