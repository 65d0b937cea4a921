"""The ``verifier`` benchmark: the fast path (:meth:`Verifier.sample`) of every verifier on synthetic float64 p /
q over a V x K x L grid, or on real blocks of a model pair over K x L (``verifier.blocks=real``): ms per call and
as a fraction of one decode step of the default target, measured in the same run; also ``spectr_gbv`` and
``mdbv`` relative to ``spectr``. Runs on CUDA when present.

Real blocks matter for the rules whose cost grows with how often the drafts agree (``select_gbv`` scores its
token rules at every prefix where two or more drafts may still survive): a trained pair at T = 0.4 drafts the
same tokens far more often than the synthetic laws at ``logit_scale`` 3.
"""
from __future__ import annotations

import functools
import statistics
import time
from typing import Any, Callable

import torch

from mdv.bench.config import BlockSource, PairKind, TinyPair, VerifierBench
from mdv.bench.pairs import default_target_available, load_pair, load_target_model, prompt_ids, torch_device
from mdv.bench.synthetic import synthetic_block
from mdv.bench.records import bench_record, goal_record, print_goals, print_table, range_text
from mdv.bench.timing import ratios_of, spread, sync_for, time_call


def real_blocks(target: Any, draft: Any, tokenizer: Any, *, K: int, L: int, contexts: int, datasets: list[str],
                temperature: float, seed: int) -> tuple[list[Any], str]:
    """``contexts`` :class:`~mdv.verify.base.Block` s (B = 1, float64) of K drafts of length L: at each of
    ``contexts`` prompts (round robin over ``datasets``, :func:`~mdv.bench.pairs.prompt_ids`) the pair's draft
    proposes K i.i.d. drafts with their laws q and the target scores them in one tree pass, both at
    ``temperature`` -- the paired measurement's draw (:class:`mdv.paired.measure.ContextProbe`), with a seed per
    prompt.  -> (blocks, where the prompts came from)."""
    from mdv.models.sampling import SamplingConfig
    from mdv.paired.measure import ContextProbe

    prompts, label = prompt_ids(tokenizer, datasets, contexts, seed)
    sampling = SamplingConfig(float(temperature), None, None)
    blocks = []
    for i, ids in enumerate(prompts):
        probe = ContextProbe(target, draft, ids, sampling, seed=int(seed) + i)
        blocks.append(probe.measure(list(ids), K, L, []).block)
    return blocks, label


def _first(block: Any, K: int, L: int, device: torch.device) -> Any:
    """:func:`~mdv.paired.conditional.sub_block` (the first K drafts cut at length L) on ``device``, contiguous
    (the verifiers' C paths read whole rows)."""
    from mdv.paired.conditional import sub_block
    from mdv.verify.base import Block

    cut = sub_block(block, K, L)
    return Block(*(x.to(device).contiguous() for x in (cut.tokens, cut.q, cut.p)))


def decode_step_times(target: Any, context: int, calls: int, sync: Callable[[], None], seed: int = 0) -> list[float]:
    """Seconds of ``calls`` single-token decode steps of ``target`` (HFModel) with ``context`` tokens in its
    KV cache (each step is rolled back, so all see the same cache)."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, target.vocab_size, (context + 1,), generator=gen).tolist()
    session = target.new_session()
    with torch.inference_mode():
        session.prefill(ids[:-1])
        x = torch.tensor([[ids[-1]]], device=session.device)

        def step() -> None:
            session.extend(x)
            session.crop(context)

        step()  # warm-up
        return [time_call(step, sync) for _ in range(calls)]


def run_verifier(cfg: VerifierBench, target: Any = None, tiny: TinyPair | None = None,
                 dtype: str = "float32") -> dict[str, Any]:
    """The ``verifier`` benchmark.  ``target``: an HFModel whose decode step is the yardstick (None: the
    default target is loaded when ``cfg.target_step`` and its file is present).  With ``cfg.blocks = real`` the
    pair ``cfg.step_pair`` (``tiny`` for the tiny random one) is loaded for the blocks, and its target is the
    yardstick."""
    from mdv.verify.base import Uniforms
    from mdv.verify.registry import VERIFIERS

    t_start = time.perf_counter()
    dev = torch_device(cfg.device)
    sync = sync_for(dev)
    step_reason = None
    real = BlockSource(cfg.blocks) == BlockSource.real
    found: list[Any] = []  # the real blocks (all over the pair's V)
    blocks_info: dict[str, Any] = {"source": "synthetic", "logit_scale": cfg.logit_scale,
                                   "target_noise": cfg.target_noise}
    if real:
        from mdv.paired.conditional import tree_nodes

        pair_target, draft, tok = load_pair(dev, PairKind(cfg.step_pair), tiny, dtype)
        if cfg.target_step and target is None:  # the pair's own target is the yardstick
            target = pair_target
        with torch.inference_mode():
            found, label = real_blocks(pair_target, draft, tok, K=max(cfg.K), L=max(cfg.L), contexts=cfg.real_contexts,
                                       datasets=list(cfg.real_datasets), temperature=cfg.temperature, seed=cfg.seed)
        blocks_info = {"source": "real", "pair": PairKind(cfg.step_pair).value, "contexts": len(found), "prompts": label,
                       "temperature": cfg.temperature, "K_max": max(cfg.K), "L_max": max(cfg.L),
                       # how often the drafts agree: distinct draft prefixes of the K_max x L_max tree (K_max L_max when
                       # no two drafts share a token at depth 1)
                       "tree_prefixes": spread([float(tree_nodes(b.tokens[0], chain=0)[-1, -1]) for b in found])}
        del pair_target, draft
    if cfg.target_step and target is None:
        ok, why = default_target_available()
        if ok:
            target = load_target_model(dev, dtype=dtype)
        else:
            step_reason = f"default target unavailable: {why}"
    elif not cfg.target_step:
        step_reason = "verifier.target_step=false"
    gen = torch.Generator(device=dev).manual_seed(cfg.seed)
    results: list[dict[str, Any]] = []
    step_all: list[float] = []
    per_call = cfg.draws * (len(found) if real else 1)  # sample calls in one timed call
    with torch.inference_mode():
        for V in ([found[0].V] if real else cfg.vocab_sizes):
            # every (K, L, method) cell of this V: its blocks (one synthetic block, or the real ones cut to K, L)
            cells = []
            for K in cfg.K:
                for L in cfg.L:
                    methods = [m for m in cfg.methods if VERIFIERS[m].multi_draft or K == 1]
                    if not methods:
                        continue
                    blocks = ([_first(b, K, L, dev) for b in found] if real else
                              [synthetic_block(V, K, L, generator=gen, device=dev, logit_scale=cfg.logit_scale,
                                               target_noise=cfg.target_noise)])
                    unis = [Uniforms.draw(1, K, L, gen, device=dev) for _ in range(cfg.draws)]

                    def call(v: Any, bs: list[Any] = blocks, us: list[Any] = unis) -> None:
                        for b in bs:
                            for u in us:
                                v.sample(b, u, v.initial_state())

                    for m in methods:
                        cells.append(((V, K, L, m), functools.partial(call, VERIFIERS[m]())))
            if not cells:
                continue
            fns = {key: fn for key, fn in cells}
            times: dict[Any, list[float]] = {key: [] for key in fns}
            steps: list[float] = []
            for r in range(cfg.warmup + cfg.repeats):
                # one round: the target step, then every cell once (order rotated per round)
                st = (statistics.median(decode_step_times(target, cfg.step_context, cfg.step_calls, sync, cfg.seed + r))
                      if target is not None else float("nan"))
                keys = list(fns)
                keys = keys[r % len(keys):] + keys[:r % len(keys)]
                for key in keys:
                    t = time_call(fns[key], sync)
                    if r >= cfg.warmup:
                        times[key].append(t)
                if r >= cfg.warmup:
                    steps.append(st)
            step_all += steps
            for (V_, K, L, m), ts in times.items():
                ts = [t / per_call for t in ts]  # seconds per sample call
                row = {"V": V_, "K": K, "L": L, "method": m, "ms": spread([1e3 * t for t in ts]),
                       "step_fraction": spread(ratios_of(ts, steps)), "target_step_ms": spread([1e3 * s for s in steps])}
                ref = times.get((V_, K, L, "spectr"))
                if ref is not None and m != "spectr":
                    # both timed calls make per_call sample calls: their raw times' ratio is the per-call ratio
                    row["vs_spectr"] = spread(ratios_of(times[V_, K, L, m], ref))
                results.append(row)
            del fns, cells, times
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    step_ms = spread([1e3 * s for s in step_all])
    rows = [[r["V"], r["K"], r["L"], r["method"], range_text(r["ms"]), range_text(r["step_fraction"], pct=True),
             range_text(r.get("vs_spectr", {}))] for r in results]
    where = (f"{blocks_info['contexts']} real blocks of the {blocks_info['pair']} pair at T = {cfg.temperature}"
             f" ({blocks_info['prompts']})" if real else f"synthetic blocks (logit_scale {cfg.logit_scale})")
    print_table(f"verifier fast path (sample) on {dev}, {where}; target decode step {range_text(step_ms)} ms"
                f"{' (' + step_reason + ')' if step_reason else ''}; median [min, max] over {cfg.repeats} interleaved"
                f" repeats of the mean over {cfg.draws} uniform draws" + (" per block" if real else ""), ["V", "K", "L", "method", "ms/call", "of a target step", "x spectr"], rows)
    goals = []
    for m in cfg.methods:
        K = cfg.goal_K if VERIFIERS[m].multi_draft else 1
        hit = [r for r in results if (r["V"], r["K"], r["L"], r["method"]) == (cfg.goal_V, K, cfg.goal_L, m)]
        frac = hit[0]["step_fraction"]["median"] if hit and hit[0]["step_fraction"]["n"] else None
        limit = 0.10 if m == "spectr" else 0.05
        why = None if K == cfg.goal_K else "single-draft: measured at K=1"
        if not hit:
            why = "goal cell not in the grid"
        elif frac is None:
            why = step_reason
        goals.append(goal_record(f"{m} at V={cfg.goal_V}, K={K}, L={cfg.goal_L} costs <= {limit:.0%} of a target step",
                           frac, limit, why=why))
    vs_spectr = {}
    for m in ("spectr_gbv", "mdbv"):
        hit = [r for r in results if (r["V"], r["K"], r["L"], r["method"]) == (cfg.goal_V, cfg.goal_K, cfg.goal_L, m)]
        if hit and "vs_spectr" in hit[0]:
            vs_spectr[m] = hit[0]["vs_spectr"]
            print(f"  {m} / spectr at V={cfg.goal_V}, K={cfg.goal_K}, L={cfg.goal_L}: {range_text(hit[0]['vs_spectr'])}")
    if "spectr_gbv" in vs_spectr:
        goals.append(goal_record(f"paper's claim: spectr_gbv verification < 0.5x spectr's (V={cfg.goal_V}, K={cfg.goal_K},"
                           f" L={cfg.goal_L})", vs_spectr["spectr_gbv"]["median"], 0.5))
    print_goals(goals)
    summary = {"blocks": blocks_info, "target_step_ms": step_ms, "target_step_context": cfg.step_context, "target_step_reason": step_reason,
               "target": getattr(target, "name", None), "vs_spectr_at_goal_cell": vs_spectr}
    return bench_record("verifier", cfg, str(dev), "float64 (verifiers); float32 (target)", results, summary, goals,
                   wall_seconds=time.perf_counter() - t_start)
