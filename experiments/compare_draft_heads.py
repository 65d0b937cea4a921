"""The default draft with its full output head vs the vocabulary-subset head, side by side in one process.

    python -m experiments.compare_draft_heads [--threads 1] [--prompts 6] [--max-new-tokens 64]
        [--temperature 0.4] [--methods sd gbv] [--L 2 4 8] [--reps 15] [--datasets gsm8k humaneval]
        [--out FILE.json]

Loads the default pair once and builds both drafts around the same target (``load_draft(head="full")``
and ``load_draft(head="subset")``, the default).  Then, all in one process:

1. draft step cost: median single-token KV-cache step of the target and of each draft with 1 and 3
   rows, every (model, rows) interleaved in each repetition (``experiments.train_draft.step_costs``);
2. end to end: for each prompt (``mdv.bench.prompt_ids``, the ``--datasets`` round robin, gsm8k then
   humaneval by default; the first is a warm-up), AR and every (method, K=1, L) with each draft, the order rotated per prompt; tokens/s,
   decode speedup vs AR of the same prompt (median over the timed prompts) and block efficiency
   (emitted tokens / target calls, all prompts).  Generation never stops at EOS.

On a shared CPU wall times are noisy; only ratios within this one run are meaningful.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--prompts", type=int, default=6, help="prompts, the first a warm-up")
    ap.add_argument("--datasets", nargs="*", default=["gsm8k", "humaneval"])
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.4)
    ap.add_argument("--methods", nargs="+", default=["sd", "gbv"])
    ap.add_argument("--L", nargs="+", type=int, default=[2, 4, 8])
    ap.add_argument("--reps", type=int, default=15, help="repetitions of the step-cost timing")
    ap.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)

    from mdv.distill.data import chat_ids
    from mdv.distill.head_subset import step_costs
    from mdv.bench import interleaved_generations, prompt_ids
    from mdv.engine import generate
    from mdv.models import HFModel
    from mdv.models import default_pair as dp

    target_lm, tok = dp.load_target()
    drafts_lm = {"full": dp.load_draft(target_lm, head="full"), "subset": dp.load_draft(target_lm, head="subset")}
    size = drafts_lm["subset"].config.head_vocab_size
    out: dict = {"threads": a.threads, "torch": torch.__version__, "head_vocab_size": size}

    costs = step_costs({"target": target_lm, **drafts_lm},
                       chat_ids(tok, "Write a Python function that checks whether a number is prime."), a.reps)
    out["step_cost"] = costs
    print(f"step cost (ms, median of {a.reps}, interleaved, {a.threads} thread(s)):")
    for name, ms in costs["ms"].items():
        print(f"  {name:8s} " + "  ".join(f"{R} row(s): {v:6.2f}" for R, v in ms.items()))

    target = HFModel(target_lm, tok)
    drafts = {k: HFModel(v, tok) for k, v in drafts_lm.items()}
    prompts, label = prompt_ids(tok, a.datasets, a.prompts)
    cells = [("ar", None, None)] + [(m, L, h) for m in a.methods for L in a.L for h in drafts]
    t0 = time.perf_counter()

    def run_cell(cell: tuple, i: int, ids: list[int]) -> dict:
        m, L, h = cell
        r = generate(target, drafts[h] if h else None, ids, m, K=1, L=L or 1, temperature=a.temperature,
                     max_new_tokens=a.max_new_tokens, seed=i, eos_token_id=[])
        if cell == cells[(i - 1) % len(cells)]:  # the last cell of prompt i's rotated order
            print(f"  prompt {i + 1}/{len(prompts)} done ({time.perf_counter() - t0:.0f} s)", flush=True)
        return r.stats

    runs = interleaved_generations(cells, prompts, run_cell)
    ar = runs[("ar", None, None)]
    rows = []
    for (m, L, h), st in runs.items():
        timed = st[1:]
        speed = [x["decode_s"] / s["decode_s"] for x, s in zip(ar[1:], timed)]
        calls = sum(s["target_calls"] for s in st)
        rows.append({"method": m, "L": L, "draft_head": h,
                     "tokens_per_second": statistics.median(s["tokens_per_second"] for s in timed),
                     "speedup_vs_ar": statistics.median(speed), "speedup_min": min(speed), "speedup_max": max(speed),
                     "block_efficiency": sum(s["new_tokens"] for s in st) / calls if calls else None,
                     "draft_share": sum(s["draft_s"] for s in timed) / sum(s["decode_s"] for s in timed)})
    out["e2e"] = {"prompts": label, "n_prompts": len(prompts), "max_new_tokens": a.max_new_tokens,
                  "temperature": a.temperature, "rows": rows, "wall_seconds": round(time.perf_counter() - t0, 1)}
    print(f"end to end, T={a.temperature}, {len(prompts) - 1} timed prompts (+1 warm-up) x {a.max_new_tokens}"
          f" tokens from {label}:")
    print(f"  {'method':6s} {'L':>2s} {'head':7s} {'tok/s':>7s} {'speedup [min, max]':>22s} {'BE':>6s} {'draft%':>7s}")
    for r in rows:
        be = f"{r['block_efficiency']:.3f}" if r["block_efficiency"] else "-"
        print(f"  {r['method']:6s} {r['L'] or '-':>2} {r['draft_head'] or '-':7s} {r['tokens_per_second']:7.2f}"
              f" {r['speedup_vs_ar']:6.3f} [{r['speedup_min']:.2f}, {r['speedup_max']:.2f}]"
              f" {be:>8s} {100 * r['draft_share']:6.0f}%")
    if a.out:
        a.out.write_text(json.dumps(out, indent=2) + "\n")
        print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
