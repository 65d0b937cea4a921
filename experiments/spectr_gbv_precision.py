"""How much of the released SpecTr-GBV code's block efficiency is a float32 artifact (issue 19).

    python -m experiments.spectr_gbv_precision [--contexts 16] [--out FILE]

Two measurements, ``spectr_gbv(precision="float32")`` (the released arithmetic) against the float64 rule:

* **theory grid** (exact, :mod:`mdv.oracle`): on random toy pairs (V = 3, K = 1..3, L = 1..3, T = 1), E[tau],
  the full-block acceptance rate and the total variation of the first L + 2 tokens from the target;
* **real blocks** of the default pair at the paper's settings (K = 3 and 7, L = 6, 8 and 12, T = 0.4): for
  ``--contexts`` prompts (humaneval and gsm8k, alternating), at the prompt itself and after the first 24
  tokens of an AR generation from the target (seeded), K_max = 7 draft blocks of L_max = 12 and one target
  pass, then per (K, L) the exact conditional E[tau] and P(tau = L) of both precisions on the same drafts
  (mean over contexts).

Prints two Markdown tables and writes them to ``--out`` (default ``outputs/spectr_gbv_precision.md``).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

import torch

import mdv
from mdv.verify.spectr_gbv import SpecTrGBV


def theory_rows() -> list[list[str]]:
    from mdv.oracle import exact_law, iteration_law, random_toy_model, target_law, total_variation

    rows = []
    for seed in (0, 1):
        target = random_toy_model(3, seed=2 * seed, zero_prob=0.2)
        draft = random_toy_model(3, seed=2 * seed + 1, zero_prob=0.2)
        for K in (1, 2, 3):
            for L in (1, 2, 3):
                if 3 ** (K * L) > 729:
                    continue
                tv, etau, full = {}, {}, {}
                for prec in ("float64", "float32"):
                    law = exact_law("spectr_gbv", target, draft, K, L, L + 2, precision=prec)
                    tv[prec] = total_variation(law, target_law(target, L + 2))
                    it = iteration_law("spectr_gbv", target, draft, K, L, precision=prec)
                    # {emitted tokens: probability}; tau = len - 1 (the accepted prefix, then one extra token)
                    etau[prec] = sum(pr * (len(seq) - 1) for seq, pr in it.items())
                    full[prec] = sum(pr for seq, pr in it.items() if len(seq) == L + 1)
                rows.append([str(seed), str(K), str(L), f"{etau['float64']:.6f}", f"{etau['float32']:.6f}",
                             f"{full['float64']:.6f}", f"{full['float32']:.6f}", f"{tv['float64']:.6f}",
                             f"{tv['float32']:.6f}"])
    return rows


def real_rows(n_contexts: int) -> list[list[str]]:
    from mdv.data import format_prompt, load_prompts
    from mdv.drafters.model import draft_blocks
    from mdv.engine import score_drafts
    from mdv.models import HFModel
    from mdv.models.default_pair import load_default_pair
    from mdv.models.sampling import SamplingConfig
    from mdv.models.session import open_session, tree_capable
    from mdv.models.tree import build_tree
    from mdv.verify.base import Block

    target, draft, tok = load_default_pair()
    target, draft = HFModel(target, tok), HFModel(draft, tok)
    sampling = SamplingConfig(0.4, None, None)
    sets = [load_prompts(name, n=(n_contexts + 1) // 2, source="offline").prompts for name in ("humaneval", "gsm8k")]
    prompts = [sets[i % 2][i // 2] for i in range(n_contexts)]
    K_max, L_max = 7, 12
    offsets = (0, 24)
    sums: dict[tuple[int, int, int, str], list[float]] = {}
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for i, prompt in enumerate(prompts):
            ids = format_prompt(prompt, tok)
            traj = mdv.generate(target, None, ids, "ar", temperature=0.4, max_new_tokens=max(offsets), seed=i,
                                eos_token_id=[]).tokens
            for off in offsets:
                ctx = list(ids) + list(traj[:off])
                tgt, drf = open_session(target), open_session(draft)
                tgt.prefill(ctx[:-1])
                drf.prefill(ctx[:-1])
                tokens, q = draft_blocks(drf, ctx, K_max, L_max, sampling, g)  # [K, L], [K, L, V]
                tree = build_tree(ctx[tgt.length:], tokens.cpu()) if tree_capable(tgt) else None
                p = score_drafts(tgt, ctx, tokens, sampling, tree)  # [K, L+1, V]
                for K in (3, 7):
                    for L in (6, 8, 12):
                        block = Block(tokens[None, :K, :L].cpu(), q[None, :K, :L].cpu(), p[None, :K, :L + 1].cpu())
                        for prec in ("float64", "float32"):
                            law = SpecTrGBV(precision=prec).acceptance_law(block)[0]  # [L+1]
                            acc = sums.setdefault((off, K, L, prec), [0.0, 0.0])
                            acc[0] += float((law * torch.arange(L + 1, dtype=law.dtype)).sum())
                            acc[1] += float(law[L])
            print(f"  prompt {i + 1}/{n_contexts}", file=sys.stderr, flush=True)
    rows = []
    for off in offsets:
        for K in (3, 7):
            for L in (6, 8, 12):
                e64, f64 = (v / n_contexts for v in sums[(off, K, L, "float64")])
                e32, f32 = (v / n_contexts for v in sums[(off, K, L, "float32")])
                rows.append([str(off), str(K), str(L), f"{e64:.4f}", f"{e32:.4f}", f"{f64:.4f}", f"{f32:.4f}",
                             f"{(1 + e32) / (1 + e64):.4f}"])
    return rows


def md_table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(r) + " |" for r in rows]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.spectr_gbv_precision", description=__doc__.split("\n\n")[0])
    ap.add_argument("--contexts", type=int, default=16, help="real-block prompts (default 16; two contexts each)")
    ap.add_argument("--out", type=Path, default=Path("outputs/spectr_gbv_precision.md"))
    args = ap.parse_args(argv)
    if args.contexts < 1:
        print(f"error: --contexts must be >= 1; got {args.contexts}", file=sys.stderr)
        return 2
    lines = ["# spectr_gbv: the released float32 arithmetic vs the float64 rule", "",
             "## Theory grid (exact; V = 3, T = 1)", ""]
    lines += md_table(["seed", "K", "L", "E[tau] f64", "E[tau] f32", "P(full) f64", "P(full) f32", "TV f64",
                       "TV f32"], theory_rows())
    lines += ["", f"## Real default-pair blocks (T = 0.4, {args.contexts} prompts, exact conditional laws)", ""]
    lines += md_table(["tokens generated", "K", "L", "E[tau] f64", "E[tau] f32", "P(tau = L) f64", "P(tau = L) f32",
                       "block efficiency f32 / f64"], real_rows(args.contexts))
    text = "\n".join(lines) + "\n"
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
