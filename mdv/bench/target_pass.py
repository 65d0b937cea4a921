"""The ``target_pass`` benchmark: the verification pass of K drafts of length L on the default target: the
engine's token tree (one row, every shared prefix once, keep the selected path) and its K-row fallback (fork
the cache, one batched pass, keep the selected row), each against the single-draft pass.
"""
from __future__ import annotations

import time
from typing import Any, Optional

import torch
from torch import Tensor

from mdv.models.tree import build_tree
from mdv.bench.config import TargetPassBench, TinyPair
from mdv.bench.pairs import target_for, torch_device
from mdv.bench.records import bench_record, goal_record, print_goals, print_table, range_text
from mdv.bench.timing import interleaved, ratios_of, spread, sync_for


def run_target_pass(cfg: TargetPassBench, target: Any = None, tiny: TinyPair | None = None,
                    device: Optional[str] = None, dtype: str = "float32") -> dict[str, Any]:
    """The ``target_pass`` benchmark (K drafts vs one draft on the target)."""
    t_start = time.perf_counter()
    dev = torch_device(device)
    target = target_for("target_pass", cfg, target, tiny, dev, dtype)
    if isinstance(target, dict):  # the default target's file is absent: the skipped record
        return target
    sync = sync_for(dev)
    K, L, n0 = cfg.K, cfg.L, cfg.context
    gen = torch.Generator().manual_seed(cfg.seed)
    prompt = torch.randint(0, target.vocab_size, (n0 + 1,), generator=gen).tolist()
    drafts = torch.randint(0, target.vocab_size, (K, L), generator=gen)
    if cfg.shared:
        drafts[:, :cfg.shared] = drafts[:1, :cfg.shared]
    pending = prompt[-1]
    token_tree = build_tree([pending], drafts)
    single_in = torch.cat([torch.tensor([[pending]]), drafts[:1]], 1).to(dev)  # [1, L+1]
    rows_in = torch.cat([torch.full((K, 1), pending), drafts], 1).to(dev)  # [K, L+1]
    s = target.new_session()
    with torch.inference_mode():
        s.prefill(prompt[:-1])

        def single() -> Tensor:
            out = s.extend(single_in)
            s.crop(n0)
            return out

        def k_rows() -> Tensor:  # target_pass="rows": fork the cache, one batched pass, keep one row
            s.fork(K)
            out = s.extend(rows_in)
            s.keep(0)
            s.crop(n0)
            return out

        def tree() -> Tensor:  # what the engine does for K > 1: one row, keep the selected path
            out = s.extend_tree(token_tree)
            s.keep_nodes(token_tree.path(K - 1, L))  # the last draft's path: its keys and values move
            s.crop(n0)
            return out

        def fork_keep() -> None:  # the rows pass's cache bookkeeping alone (copies of the cached prefix)
            s.fork(K)
            s.keep(0)

        # the tree pass must score exactly what the K rows score
        ref, tr = k_rows(), tree()
        max_diff = float((tr[token_tree.node_of].float() - ref.float()).abs().max())
        times = interleaved({"single": single, "k_rows": k_rows, "tree": tree, "fork_keep": fork_keep}, cfg.repeats,
                            cfg.warmup, sync)
    res = {"K": K, "L": L, "context": n0, "shared": cfg.shared, "tree_nodes": token_tree.size,
           "k_rows_tokens": K * (L + 1), "single_tokens": L + 1,
           "ms": {k: spread([1e3 * t for t in v]) for k, v in times.items()},
           "k_rows_vs_single": spread(ratios_of(times["k_rows"], times["single"])),
           "tree_vs_single": spread(ratios_of(times["tree"], times["single"])),
           "tree_vs_k_rows": spread(ratios_of(times["tree"], times["k_rows"])),
           "fork_keep_vs_single": spread(ratios_of(times["fork_keep"], times["single"])),
           "tree_max_abs_logit_diff": max_diff}
    print_table(f"target verification pass, K={K}, L={L}, {n0} cached tokens, {cfg.shared} shared draft tokens"
                f" ({target.name}; {cfg.repeats} interleaved repeats)", ["pass", "tokens", "ms", "x single"],
                [["single draft", L + 1, range_text(res["ms"]["single"]), "1"],
                 ["K full rows (target_pass=rows: fork + pass + keep)", K * (L + 1), range_text(res["ms"]["k_rows"]),
                  range_text(res["k_rows_vs_single"])],
                 ["token tree (target_pass=tree, the engine's default)", token_tree.size, range_text(res["ms"]["tree"]),
                  range_text(res["tree_vs_single"])],
                 ["(of K full rows: fork + keep of the cache alone)", 0, range_text(res["ms"]["fork_keep"]),
                  range_text(res["fork_keep_vs_single"])]])
    print(f"  tree vs K-row logits: max |diff| = {max_diff:.3g}", flush=True)
    goals = [goal_record(f"K={K}, L={L} pass (engine, token tree) <= {cfg.goal_ratio:g}x the single-draft pass",
                   res["tree_vs_single"]["median"], cfg.goal_ratio),
             goal_record(f"K={K}, L={L} pass (K full rows, target_pass=rows) <= {cfg.goal_ratio:g}x the single-draft pass",
                   res["k_rows_vs_single"]["median"], cfg.goal_ratio,
                   why="the fallback for targets whose attention takes no custom mask")]
    print_goals(goals)
    return bench_record("target_pass", cfg, str(dev), str(target.dtype).removeprefix("torch."), res,
                   {"target": target.name}, goals, wall_seconds=time.perf_counter() - t_start)
