"""The paired measurement on real models: target trajectories, K_max drafts per context, one tree pass,
every verifier's exact conditional acceptance on the same drafts.

For prompt i of a dataset (sampling transform T, top-k, top-p of the run):

1. **Trajectory.**  ``n_tokens`` tokens sampled from the target alone (recorded with their seed
   ``prompt_seed(seed, i)``): the tokens ``mdv.generate(target, None, prompt, "ar", seed=...)`` gives,
   with the laws that the previous context's tree pass already holds reused instead of recomputed
   (:mod:`mdv.paired.trajectory`).  Contexts are ``prompt + trajectory[:j]`` for
   j = 0, stride, 2·stride, ... < len(trajectory): they follow the target's law, like the contexts of a
   lossless generation.
2. **Drafts.**  At each context the draft proposes K_max i.i.d. blocks of length L_max in one K-row batch
   (:func:`mdv.drafters.model.draft_blocks`, the engine's own step, generator seeded with ``draft_seed``).
3. **Target.**  ONE token-tree pass scores every distinct draft prefix (:func:`mdv.engine.score_drafts`).
4. **Laws.**  For every verifier, K ≤ K_max and L ≤ L_max: the exact ``E[tau | c, D]`` and ``P(tau ≥ i |
   c, D)`` from the verifier's own ``law`` with a fresh state (:mod:`mdv.paired.conditional`); and, at
   L = 1, the optimum α*_K(p, q) of any K-draft verifier (:func:`mdv.oracle.membership.membership_ot_sorted`).
   The caches are rolled back to the context and extended to the next one.

**Greedy block verifiers** (``gbv``, ``mdbv``) carry a target adjustment across iterations in real runs;
the fresh-state value measured here is the per-iteration quantity the LPs and the paper talk about.

Results: one JSON file per (dataset, prompt) in ``<results_dir>/paired/`` (schema ``mdv.paired/2``),
written atomically under a per-record lock like sweep cells: a killed run keeps its finished prompts, a
rerun skips them, two runs at once never compute one record.
"""
from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch

from mdv.errors import InvalidInputError, MdvError
from mdv.paired.conditional import all_conditional, tree_nodes
from mdv.paired.config import PairedConfig, validate_paired
from mdv.paired.records import SCHEMA, paired_dir, read_record, record_config, record_id

log = logging.getLogger(__name__)

#: Offset between a prompt's trajectory seed and its draft seed (two independent streams).
DRAFT_SEED_OFFSET = 2 ** 40


@dataclass
class PromptTiming:
    """Seconds spent per part of one prompt's measurement."""

    trajectory_s: float = 0.0
    prefill_s: float = 0.0
    draft_s: float = 0.0
    target_s: float = 0.0
    optimum_s: float = 0.0
    laws_s: dict[str, float] = field(default_factory=dict)


def contexts_of(trajectory_length: int, stride: int) -> list[int]:
    """Generated-token offsets j of the contexts ``prompt + trajectory[:j]``: 0, stride, ... < length."""
    return list(range(0, max(trajectory_length, 1), stride))


@dataclass
class ContextMeasurement:
    """One context's measurement: the verifier input ``block`` (tokens [1, K_max, L_max], q, p), every
    method's :class:`~mdv.paired.conditional.ConditionalAcceptance`, the tree sizes [K_max, L_max], α*_K
    at L = 1 for K = 1..K_max, and per method the mean E[tau] at L = 1 over ``optimum_draws`` extra
    K_max-tuples drawn from the context's draft law (empty when none were drawn)."""

    block: Any
    conditional: dict[str, Any]
    nodes: np.ndarray
    alpha_star: list[float]
    first_token: dict[str, list[float]] = field(default_factory=dict)


class ContextProbe:
    """Draft-and-score at contexts that extend one prompt (module doc, steps 2-4), on KV-cache sessions.

    ``measure(seq, ...)`` drafts K_max blocks after ``seq`` (which must extend the previous one), scores
    them in one tree pass, computes every method's exact conditional acceptance and rolls both caches back
    to ``seq``; calling it again with the same ``seq`` draws fresh drafts at the same context.
    """

    def __init__(self, target: Any, draft: Any, prompt_ids: Sequence[int], sampling: Any, *, seed: int,
                 drafter: Any = "model", drafter_options: dict[str, Any] | None = None):
        from mdv.drafters.registry import get_drafter
        from mdv.models.session import open_session, tree_capable

        self.sampling = sampling
        self.drafter = get_drafter(drafter, **(drafter_options or {}))
        self.drafter.bind(target, draft)
        with torch.inference_mode():
            self.tgt = open_session(target)
            self.use_tree = tree_capable(self.tgt)
            self.generator = torch.Generator(device=self.tgt.device)
            self.generator.manual_seed(int(seed))
            t0 = time.perf_counter()
            self.tgt.prefill(list(prompt_ids)[:-1])
            self.drafter.prefill(list(prompt_ids))
            self.prefill_s = time.perf_counter() - t0

    @torch.inference_mode()
    def measure(self, seq: Sequence[int], K_max: int, L_max: int, methods: Sequence[str],
                timing: PromptTiming | None = None, optimum_draws: int = 0) -> ContextMeasurement:
        from mdv.engine import score_drafts
        from mdv.models.tree import build_tree
        from mdv.oracle.membership import membership_ot_sorted_upto
        from mdv.paired.conditional import first_token_acceptance, first_token_block
        from mdv.verify._math import categorical
        from mdv.verify.base import Block

        seq = list(seq)
        if len(seq) <= self.tgt.length:
            raise InvalidInputError("ContextProbe.measure: each context must extend the previous one")
        timing = timing if timing is not None else PromptTiming()
        t0 = time.perf_counter()
        proposal = self.drafter.propose(seq, K_max, L_max, self.sampling, self.generator)
        tokens, q = proposal.tokens, proposal.q  # [K, L], [K, L, V]
        t1 = time.perf_counter()
        tree = build_tree(seq[self.tgt.length:], tokens.cpu()) if self.use_tree else None
        p = score_drafts(self.tgt, seq, tokens, self.sampling, tree)  # [K, L+1, V]
        t2 = time.perf_counter()
        timing.draft_s += t1 - t0
        timing.target_s += t2 - t1
        block = Block(tokens.unsqueeze(0).cpu(), q.unsqueeze(0).cpu(), p.unsqueeze(0).cpu()).validate()
        conds = all_conditional(methods, block, timings=timing.laws_s)
        t3 = time.perf_counter()
        p0, q0 = block.p[0, 0, 0], block.q[0, 0, 0]  # [V]: the laws at the context (L = 1)
        alpha = membership_ot_sorted_upto(p0, q0, K_max)  # [K_max]: α*_1..α*_K_max, one sort
        first: dict[str, list[float]] = {}
        if optimum_draws:
            # more i.i.d. K-tuples at L = 1 cost no model call (q0 and p0 are known): they shrink the
            # draft noise of the L = 1 optimality gap
            u = torch.rand(optimum_draws * K_max, generator=self.generator, dtype=torch.float64,
                           device=self.generator.device).cpu()
            extra = categorical(q0.expand(optimum_draws * K_max, -1), u).view(optimum_draws, K_max)  # [M, K]
            fb = first_token_block(p0, q0, extra)
            first = {m: np.mean(first_token_acceptance(m, fb), 0).tolist() for m in methods}
        timing.optimum_s += time.perf_counter() - t3
        # back to the context, its last token pending again (as in the engine): both caches keep row 0 /
        # the committed chain up to seq[:-1]
        if tree is not None:
            self.tgt.keep_nodes(tree.path(0, 0))
        else:
            self.tgt.keep(0)
        self.tgt.crop(len(seq) - 1)
        self.drafter.rewind(len(seq) - 1)
        return ContextMeasurement(block, conds, tree_nodes(tokens.cpu()), alpha, first)


def measure_prompt(target: Any, draft: Any, prompt_ids: Sequence[int], cfg: PairedConfig, *, temperature: float,
                   top_k: Optional[int], top_p: Optional[float], seed: int,
                   progress: Optional[Callable[[int, int], None]] = None) -> dict[str, Any]:
    """Measure one prompt (module doc, steps 1-4).  Returns the ``trajectory`` / ``contexts`` / ``timing``
    part of a record: per context its offset, the draft tokens [K_max, L_max], the tree node counts
    [K_max, L_max], α*_K at L = 1 [K_max], and per method ``etau`` [K_max, L_max] and ``reach``
    [K_max, L_max, L_max] (reach[K-1][L-1][i-1] = P(tau ≥ i) at (K, L), i ≤ L); NaN (null) where a
    single-draft method does not run and for i > L."""
    from mdv.engine import _eos_set, max_context
    from mdv.models.sampling import SamplingConfig
    from mdv.paired.trajectory import TreeTrajectory, survival_along

    K_max, L_max = cfg.K_max, cfg.L_max
    sampling = SamplingConfig(temperature, top_k, top_p)
    timing = PromptTiming(laws_s={m: 0.0 for m in cfg.methods})
    probe = ContextProbe(target, draft, prompt_ids, sampling, seed=int(seed) + DRAFT_SEED_OFFSET,
                         drafter=cfg.drafter, drafter_options=dict(cfg.drafter_options or {}))
    timing.prefill_s = probe.prefill_s
    traj = TreeTrajectory(probe.tgt, prompt_ids, sampling, seed=seed, max_new_tokens=cfg.n_tokens,
                          eos=_eos_set(None, target), ctx=max_context(target))
    contexts: list[dict[str, Any]] = []
    # a context every `stride` tokens while the trajectory goes on (contexts_of); the trajectory's next
    # `stride` tokens reuse the laws of the context's tree pass (mdv.paired.trajectory)
    while True:
        j = len(traj.tokens)
        seq = list(prompt_ids) + traj.tokens
        m = probe.measure(seq, K_max, L_max, cfg.methods, timing, optimum_draws=cfg.optimum_draws)
        contexts.append({
            "offset": j, "context_length": len(seq), "drafts": m.block.tokens[0].tolist(),
            "nodes": m.nodes.tolist(), "alpha_star": m.alpha_star,
            "first_token": m.first_token,
            "etau": {k: c.etau.tolist() for k, c in m.conditional.items()},
            "reach": {k: c.reach.tolist() for k, c in m.conditional.items()},
        })
        t0 = time.perf_counter()
        traj.advance(cfg.stride, m.block.tokens[0], m.block.p[0])
        timing.trajectory_s += time.perf_counter() - t0
        if progress is not None:
            progress(len(contexts), len(contexts_of(cfg.n_tokens, cfg.stride)))  # at most that many: EOS ends early
        if traj.stopped:
            break
    assert [c["offset"] for c in contexts] == contexts_of(len(traj.tokens), cfg.stride)
    t0 = time.perf_counter()  # where real sd / spectr iterations would end along it (mdv.paired.renewal)
    survival = survival_along(probe.drafter, prompt_ids, traj.tokens, traj.laws, sampling, K_max)
    timing.trajectory_s += time.perf_counter() - t0
    return {"trajectory": {"seed": int(seed), "tokens": [int(t) for t in traj.tokens],
                           "target_steps": traj.target_steps, "reused_laws": traj.reused, "survival": survival},
            "draft_seed": int(seed) + DRAFT_SEED_OFFSET, "contexts": contexts, "timing": asdict(timing)}


@dataclass
class PairedReport:
    """What :func:`run_paired` did."""

    results_dir: Path
    records: list[str]
    skipped: list[str]
    ok: list[str]
    failed: list[str]
    busy: list[str]
    wall_seconds: float
    calibration: Optional[Path] = None
    speed_check: Optional[Path] = None

    def line(self) -> str:
        busy = f", {len(self.busy)} left to another running process" if self.busy else ""
        if self.calibration is not None:
            busy += f"; calibration {self.calibration}"
        if self.speed_check is not None:
            busy += f"; speed check {self.speed_check}"
        return (f"paired: {len(self.records)} prompts: {len(self.ok)} measured, {len(self.skipped)} already done,"
                f" {len(self.failed)} failed{busy}; {self.wall_seconds:.1f} s; records in"
                f" {paired_dir(self.results_dir)}")


def run_paired(run_cfg: Any, *, tracker: Any = None, loader: Callable[..., Any] | None = None,
               formatter: Callable[..., Any] | None = None) -> PairedReport:
    """Measure every (dataset, prompt, temperature, seed) of ``run_cfg`` (a :class:`mdv.sweep.RunConfig`;
    datasets, prompts, temperatures, top-k/p and seeds come from its groups, the rest from
    ``run_cfg.paired``) and write one record each (module doc).  Bad config: one
    :class:`~mdv.errors.MdvError` before any work.  ``tracker`` (:mod:`mdv.tracking`): every record is logged
    (``log_paired``), then the report of the folder (verdicts, plots) with ``finish_paired``."""
    # mdv.sweep's schema holds a PairedConfig: imported here, not at the top, to keep the import acyclic
    from mdv.sweep.config import enum_value, models_label, validate
    from mdv.sweep.grid import prompt_seed
    from mdv.sweep.model_sets import check_models_available, load_models
    from mdv.sweep.prompts import format_dataset_prompts, import_callable, load_prompt_set, prompt_id
    from mdv.progress import progress_bar
    from mdv.sweep.runner import dataset_block
    from mdv.sweep.store import (check_writable_dir, environment, remove_stale_locks, remove_stale_temp_files,
                                 try_lock, write_json_atomic)

    t_start = time.perf_counter()
    cfg: PairedConfig = run_cfg.paired
    validate_paired(cfg)
    validate(run_cfg)
    if run_cfg.threads is not None:
        torch.set_num_threads(run_cfg.threads)
    out = check_writable_dir(paired_dir(run_cfg.results_dir), "results_dir/paired")
    remove_stale_temp_files(out)
    remove_stale_locks(out)
    models_name = models_label(run_cfg.models)
    datasets = list(cfg.datasets) if cfg.datasets is not None else [enum_value(d) for d in run_cfg.dataset.names]
    n = cfg.n_prompts or run_cfg.dataset.n_prompts
    if cfg.speed_check.enabled and cfg.speed_check.n_prompts > n:
        raise InvalidInputError(f"paired.speed_check.n_prompts={cfg.speed_check.n_prompts} exceeds the {n} prompts"
                                " per dataset the paired run measures (their contexts give the prediction); lower"
                                " paired.speed_check.n_prompts or raise paired.n_prompts")
    todo: list[tuple[str, int, float, int, dict[str, Any], str]] = []
    for name in datasets:
        for T in run_cfg.sampling.temperatures:
            for seed in run_cfg.sweep.seeds:
                config = record_config(cfg, dataset=name, temperature=T, top_k=run_cfg.sampling.top_k,
                                       top_p=run_cfg.sampling.top_p, seed=seed, models=models_name)
                for i in range(n):
                    todo.append((name, i, float(T), int(seed), config, record_id(config, i)))
    done = {rid for *_, rid in todo if read_record(out / f"{rid}.json") is not None}
    pending = [t for t in todo if t[-1] not in done]
    prompt_sets: dict[str, Any] = {}
    formatted: dict[str, list[list[int]]] = {}
    models = None
    from mdv.paired.records import calibration_file
    from mdv.paired.speedcheck import check_is_current, finish_speed_check, start_speed_check

    check_todo = not check_is_current(run_cfg, out, datasets)
    if pending or check_todo or (cfg.calibration is not None
                                 or (cfg.calibrate and not (out / calibration_file(cfg.drafter)).exists())):
        from mdv.drafters.model import check_pair

        loader = loader or import_callable(run_cfg.dataset.loader, "dataset.loader")
        formatter = formatter or import_callable(run_cfg.dataset.formatter, "dataset.formatter")
        check_models_available(run_cfg.models)
        models = load_models(run_cfg.models)
        check_pair(models.target, models.draft)
        needed = [t[0] for t in pending or todo[:1]]
        if check_todo:
            needed += list(cfg.speed_check.datasets or datasets)
        for name in dict.fromkeys(needed):
            prompt_sets[name] = load_prompt_set(loader, name, n, run_cfg.dataset.source)
            formatted[name] = format_dataset_prompts(name, prompt_sets[name], n, models, formatter,
                                                       cfg.L_max + cfg.n_tokens)
    # the calibration and the speed check, interleaved, before any helper starts
    pending_check = start_speed_check(run_cfg, out, models, formatted, datasets)
    calibration_path = prepare_calibration(run_cfg, out, models, formatted, check=pending_check)
    check_file = finish_speed_check(run_cfg, out, models, pending_check)
    skipped = [rid for *_, rid in todo if rid in done]
    from mdv.tracking import NullTracker

    tracking = tracker is not None and not isinstance(tracker, NullTracker)
    if tracking:
        tracker.start_paired(run_cfg, len(todo))
        for rid in skipped:
            tracker.log_paired(read_record(out / f"{rid}.json"), resumed=True)
    ok, failed, busy = [], [], []
    helpers = start_helpers(run_cfg) if pending and cfg.workers > 1 else []
    bar = progress_bar(run_cfg.progress, total=len(todo), desc="paired prompts", position=0, initial=len(skipped))
    try:
        for name, i, T, seed, config, rid in pending:
            path = out / f"{rid}.json"
            lock = try_lock(out / f".{rid}.lock")
            if lock is None:
                busy.append(rid)
                bar.update(1)
                continue
            try:
                if read_record(path) is not None:  # finished by another process meanwhile
                    skipped.append(rid)
                    bar.update(1)
                    continue
                assert models is not None
                ps = prompt_sets[name]
                ids = formatted[name][i]
                bar.set_postfix_str(f"{name} #{i}")
                t0 = time.perf_counter()

                def tick(k: int, total: int) -> None:
                    bar.set_postfix_str(f"{name} #{i}: context {k}/{total}")

                error = None
                body: dict[str, Any] = {}
                try:
                    body = measure_prompt(models.target, models.draft, ids, cfg, temperature=T,
                                          top_k=run_cfg.sampling.top_k, top_p=run_cfg.sampling.top_p,
                                          seed=prompt_seed(seed, i), progress=tick)
                except MdvError:
                    raise
                except Exception as e:  # recorded; the run goes on
                    error = f"{type(e).__name__}: {e}"
                    log.warning("paired record %s failed: %s", rid, error.splitlines()[0])
                    log.debug("traceback of %s", rid, exc_info=True)
                record = {"schema": SCHEMA, "record_id": rid, "status": "ok" if error is None else "failed",
                          "error": error, "config": config, "prompt_index": i,
                          "prompt_id": prompt_id(ps.prompts[i], name, i), "prompt_length": len(ids),
                          "dataset": dataset_block(ps),
                          "models": {"target": models.target_name, "draft": models.draft_name},
                          "environment": environment(models.dtype, models.device),
                          "analysis": analysis_options(cfg), "wall_seconds": time.perf_counter() - t0, **body}
                write_json_atomic(path, record)
            finally:
                lock.release()
            (ok if error is None else failed).append(rid)
            if tracking and error is None:
                tracker.log_paired(record, resumed=False)
            bar.update(1)
    finally:
        bar.close()
        for proc in helpers:  # the records they hold locks on are theirs: wait, then count them
            proc.join()
        done_now: list[str] = []
        if helpers:
            done_now = [rid for rid in busy if read_record(out / f"{rid}.json") is not None]
            by_helpers = len(done_now)
            busy = [rid for rid in busy if rid not in done_now]
            ok += done_now
            if any(proc.exitcode for proc in helpers):
                log.warning("a helper process exited with status %s; rerun the same command to measure what"
                            " it left", [proc.exitcode for proc in helpers])
            log.info("%d of the records measured by %d helper process(es)", by_helpers, len(helpers))
        if tracking:
            for rid in done_now:
                tracker.log_paired(read_record(out / f"{rid}.json"), resumed=False)
            from mdv.paired.report import write_report

            tracker.finish_paired(write_report(run_cfg.results_dir, out / "report", headline_K=cfg.headline_K,
                                               headline_L=cfg.headline_L, cost_profiles=cfg.cost_profiles,
                                               opts=options_of(cfg)))
    return PairedReport(Path(run_cfg.results_dir), [t[-1] for t in todo], skipped, ok, failed, busy,
                        time.perf_counter() - t_start, calibration_path, check_file)


def _helper_main(run_cfg: Any) -> None:
    """A helper process of :func:`run_paired`: the same todo list, taking the records no one holds."""
    logging.basicConfig(level=logging.WARNING)
    run_paired(run_cfg)


def start_helpers(run_cfg: Any) -> list[Any]:
    """``paired.workers - 1`` helper processes (spawned, one torch thread each) that measure the same
    records: the per-record locks hand each record to one process.  Their configs skip calibration,
    progress bars and tracking; the caller joins them."""
    import copy
    import multiprocessing as mp

    ctx = mp.get_context("spawn")  # a fresh interpreter: no forked OpenMP or torch state
    procs = []
    for _ in range(run_cfg.paired.workers - 1):
        cfg = copy.deepcopy(run_cfg)
        cfg.paired.workers, cfg.paired.calibrate, cfg.paired.calibration = 1, False, None
        cfg.progress, cfg.threads = False, cfg.threads or 1
        proc = ctx.Process(target=_helper_main, args=(cfg,), daemon=True)
        proc.start()
        procs.append(proc)
    return procs


def analysis_options(cfg: PairedConfig) -> dict[str, Any]:
    """How the report decides (stored in each record, outside its id: they change no measured number)."""
    return {"delta": cfg.delta, "level": cfg.level, "n_boot": cfg.n_boot, "headline_K": cfg.headline_K,
            "headline_L": cfg.headline_L, "cost_profiles": list(cfg.cost_profiles)}


def options_of(cfg: PairedConfig) -> Any:
    """The statistics options (:class:`mdv.paired.analysis.Options`) of a config."""
    from mdv.paired.analysis import Options

    return Options(level=cfg.level, n_boot=cfg.n_boot, delta=cfg.delta)


def calibration_context(run_cfg: Any, formatted: dict[str, list[list[int]]]) -> list[int]:
    """The context the calibration times at: as long as the median context of the runs it predicts.

    Pass costs grow with the context (KV-cache attention; K-row draft steps and tree passes faster than one
    AR step: measured on the default pair, a 3-row draft step 8.6 ms at 110 tokens, 10.0 at 250, 11.0 at
    400), so the length is median(prompt length + n/2) over the speed check's prompts (all paired prompts
    without a check), n the generated tokens.  Token identity barely matters for timing: the prompts are
    concatenated and cut to that length."""
    cfg: PairedConfig = run_cfg.paired
    check = cfg.speed_check
    names = list(check.datasets or formatted) if check.enabled else list(formatted)
    prompts = [ids for name in names for ids in formatted.get(name, [])[: check.n_prompts if check.enabled else None]]
    prompts = prompts or [ids for ids_list in formatted.values() for ids in ids_list]
    n = (check.n_tokens or cfg.n_tokens) if check.enabled else cfg.n_tokens
    length = max(2, int(np.median([len(ids) + n / 2 for ids in prompts])))
    pool = [t for ids in prompts for t in ids]
    return (pool * (length // len(pool) + 1))[:length]


def calibration_outdated(cal: Any, context_length: int) -> Optional[str]:
    """Why a stored :class:`~mdv.paired.cost.Calibration` that matches this machine, these models and this
    drafter must still be redone (made by an older mdv, or at another context length), or None."""
    if not cal.propose_s:
        return "the stored calibration timed no drafter call (made by an older mdv)"
    if "cache_evicted_bytes" not in cal.settings:
        return "the stored calibration timed its calls with warm caches (made by an older mdv)"
    if cal.settings.get("context_length") != context_length:
        return (f"the stored calibration was timed at a {cal.settings.get('context_length')}-token context, this"
                f" run's contexts call for {context_length}")
    return None


def prepare_calibration(run_cfg: Any, out: Path, models: Any, formatted: dict[str, list[list[int]]],
                        check: Any = None) -> Optional[Path]:
    """The calibration the report predicts speedups with, as ``<out>/calibration.json`` (for the draft model;
    ``calibration.<drafter>.json`` for another ``paired.drafter``, whose call it times).

    ``paired.calibration`` (a file): loaded and checked against this machine and models (a mismatch is
    one :class:`~mdv.errors.InvalidInputError`), copied there.  Else, with ``paired.calibrate``: an
    existing ``calibration.json`` that matches (machine, models, context length) is reused, otherwise this
    machine is calibrated: one short interleaved run (:func:`mdv.paired.cost.calibrate`) at a context of
    the predicted runs' median length (:func:`calibration_context`).  ``check``: a speed check being
    measured (:class:`mdv.paired.speedcheck.PendingCheck`); this machine is then recalibrated with the
    check's rounds spread between the calibration's (:func:`mdv.paired.speedcheck.spread_rounds`), so the
    prediction and its check see the same machine.
    """
    from mdv.models.sampling import SamplingConfig
    from mdv.paired.cost import calibrate, load_calibration
    from mdv.paired.records import calibration_file
    from mdv.paired.speedcheck import spread_rounds

    cfg: PairedConfig = run_cfg.paired
    path = out / calibration_file(cfg.drafter)
    drafter = {"drafter": cfg.drafter, "drafter_options": dict(cfg.drafter_options or {})}
    if cfg.calibration is not None:
        cal = load_calibration(cfg.calibration, target=models.target, draft=models.draft, **drafter)
        cal.save(path)
        return path
    if not cfg.calibrate:
        return path if path.exists() else None
    if models is None:  # nothing to measure and a calibration exists: keep it
        return path
    context = calibration_context(run_cfg, formatted)
    try:
        old = load_calibration(path, target=models.target, draft=models.draft, **drafter)
        reason = calibration_outdated(old, len(context))
        if reason is not None:
            log.warning("recalibrating: %s", reason)
        elif check is not None:
            log.info("recalibrating alongside the speed check being measured")
        else:
            return path
    except MdvError as e:
        if path.exists():
            log.warning("recalibrating: %s", e)
    T = run_cfg.sampling.temperatures[0]
    log.info("calibrating this machine's pass costs (K_max=%d, L_max=%d, a %d-token context)", cfg.K_max,
             cfg.L_max, len(context))
    cal = calibrate(models.target, models.draft, K_max=cfg.K_max, L_max=cfg.L_max, methods=cfg.methods,
                    context_ids=context, repeats=cfg.calibration_repeats, progress=run_cfg.progress,
                    sampling=SamplingConfig(T, run_cfg.sampling.top_k, run_cfg.sampling.top_p),
                    between_rounds=spread_rounds(check.runner) if check is not None else None, **drafter)
    cal.save(path)
    return path


__all__ = ["PairedReport", "PromptTiming", "contexts_of", "measure_prompt", "run_paired"]
