"""Real generations that check the predicted speedups: AR and every (method, K, L), interleaved per prompt.

The calibrated cost model (:mod:`mdv.paired.cost`) predicts SR = E[tokens per iteration] / E[time per
iteration] from the paired contexts.  This module measures the same SR on real ``mdv.generate`` runs of
the same prompts, so the prediction error can be read off:

* **Interleaved.**  Prompt by prompt, AR and every cell run once each, the order rotated by one per
  prompt (:func:`mdv.bench.timing.rotated`, as the e2e benchmark does), so a drift of the machine's load hits every cell
  alike and the per-prompt ratio AR seconds ÷ method seconds cancels it.  A sweep's cells run one after
  the other and cannot do that: there a load change between two cells is read as a speedup.
* **Same drafter.**  The paired run's (``paired.drafter``), which the calibration timed too.
* **Same prompts, same seeds.**  The first ``n_prompts`` prompts of each dataset of the paired run
  (whose contexts give the prediction), seeded like the paired trajectories (:func:`mdv.sweep.prompt_seed`).
* **Fixed length.**  EOS is ignored, so every generation emits exactly ``n_tokens`` tokens and the cut of
  the last iteration is the one :mod:`mdv.paired.renewal` predicts.
* **Warm-up.**  One untimed round of every cell on the first prompt before the timed ones.
* **Beside the calibration.**  When the run calibrates too, the check's rounds run between the
  calibration's rounds (:func:`spread_rounds`, ``calibrate(between_rounds=...)``): on a shared machine the
  speed of compute-bound passes drifts by tens of percent over minutes (measured here: the same 3-token
  target pass 102-106 ms, a minute later 67-75 ms), and not alike for every part, so a calibration taken
  minutes before its check predicts another machine.

Result: ``<results_dir>/paired/speedcheck.json`` (``speedcheck.<drafter>.json`` for a drafter other than the
draft model; schema ``mdv.paired.speedcheck/1``), written atomically;
a rerun with the same settings, models and machine reuses it.  Per generation: dataset, prompt index,
method, K, L and the engine's :class:`~mdv.engine.GenerationStats` (decode seconds split into draft /
target / verify / other, target calls, emitted tokens); a speculative one also its output ``tokens``, and
an ``sd`` / ``spectr`` one of the draft model ``survival``, where its iterations end given that output
(:meth:`InterleavedCheck.add_survival`), so its target calls can be compared with E[N | output].
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from mdv.paired.config import SpeedCheckConfig
from mdv.sweep.config import models_label

log = logging.getLogger(__name__)

SCHEMA = "mdv.paired.speedcheck/1"
FILE = "speedcheck.json"  # the draft model's; another drafter's is check_file(drafter)


def check_file(drafter: str = "model") -> str:
    """``speedcheck.json`` (the draft model) or ``speedcheck.<drafter>.json``: one check per drafter."""
    from mdv.paired.records import drafter_file

    return drafter_file("speedcheck", drafter)

Cell = tuple[str, int, int]  # (method, K, L); ("ar", 1, 1) is the baseline

__all__ = ["Cell", "FILE", "check_file", "InterleavedCheck", "PendingCheck", "SCHEMA", "SpeedCheckPrompt", "check_cells",
           "check_is_current", "check_settings", "finish_speed_check", "read_check", "spread_rounds",
           "start_speed_check"]


@dataclass(frozen=True)
class SpeedCheckPrompt:
    """One prompt of the check: its dataset (config key), index in the paired run, token ids, seed."""

    dataset: str
    index: int
    ids: list[int]
    seed: int


def check_cells(cfg: SpeedCheckConfig) -> list[Cell]:
    """AR first, then every (method, K, L) of the config; single-draft methods at K = 1 only."""
    from mdv.verify.registry import VERIFIERS

    cells: list[Cell] = [("ar", 1, 1)]
    for m in cfg.methods:
        for K in (cfg.K if VERIFIERS[m].multi_draft else [1]):
            for L in cfg.L:
                if (m, int(K), int(L)) not in cells:
                    cells.append((m, int(K), int(L)))
    return cells


class InterleavedCheck:
    """The check's generations, one round (prompt) at a time: round 0 is an untimed warm-up on prompts[0],
    round i >= 1 runs every cell on prompts[i - 1], the cell order rotated by i (so a drift of the
    machine's load hits every cell alike).  :meth:`run_round` can be called between other work (the
    calibration's rounds); :meth:`result` gives the generations once every round ran."""

    def __init__(self, target: Any, draft: Any, prompts: Sequence[SpeedCheckPrompt], cells: Sequence[Cell], *,
                 n_tokens: int, temperature: float, top_k: Optional[int] = None, top_p: Optional[float] = None,
                 progress: bool = False, drafter: str = "model", drafter_options: Optional[dict[str, Any]] = None
                 ) -> None:
        from mdv.progress import progress_bar

        self.target, self.draft, self.cells = target, draft, list(cells)
        self.rounds = [prompts[0], *prompts]
        self.kw = {"temperature": temperature, "top_k": top_k, "top_p": top_p, "max_new_tokens": n_tokens,
                   "eos_token_id": []}
        self.drafter_kw = {"drafter": drafter, "drafter_options": dict(drafter_options or {})}
        self.done: list[bool] = [False] * len(self.rounds)
        self.with_calibration = False  # set by spread_rounds
        self.gens: list[dict[str, Any]] = []
        self.bar = progress_bar(progress, total=len(self.rounds) * len(self.cells), desc="speed check", position=0)
        self.t0 = time.perf_counter()

    def run_round(self, i: int) -> None:
        from mdv.engine import generate

        from mdv.bench.timing import rotated

        pr = self.rounds[i]
        for m, K, L in rotated(self.cells, i):
            self.bar.set_postfix_str(f"{'warm-up' if i == 0 else pr.dataset + ' #' + str(pr.index)} {m} K={K}"
                                     f" L={L}", refresh=False)
            r = generate(self.target, None if m == "ar" else self.draft, pr.ids, m, K=K, L=L, seed=pr.seed,
                         **self.kw, **({} if m == "ar" else self.drafter_kw))
            if i:  # the warm-up is left out
                self.gens.append({"dataset": pr.dataset, "prompt_index": pr.index, "method": m, "K": K, "L": L,
                                  "stats": r.stats, **({} if m == "ar" else {"tokens": [int(t) for t in r.tokens]})})
            self.bar.update(1)
        self.done[i] = True

    def add_survival(self, progress: bool = False) -> int:
        """Store, on every ``sd`` / ``spectr`` generation of the draft model, ``survival`` [n, K, K + 1]: where
        its iterations end given its own output (:func:`mdv.paired.trajectory.survival_given_output`; one
        target and one draft pass per generation, after the timed rounds), so the report can compare the
        run's target calls with E[N | its output] -- the prediction's iteration count paired with the run,
        free of the between-output noise.  Other drafters are left without it (their laws along an output
        cost a pass per position).  -> how many generations got it."""
        from mdv.models.sampling import SamplingConfig
        from mdv.paired.renewal import KSEQ_METHODS
        from mdv.paired.trajectory import survival_given_output
        from mdv.progress import progress_bar

        if self.drafter_kw["drafter"] != "model":
            return 0
        from mdv.drafters.registry import get_drafter

        drafter = get_drafter("model", **self.drafter_kw["drafter_options"])
        drafter.bind(self.target, self.draft)
        sampling = SamplingConfig(self.kw["temperature"], self.kw["top_k"], self.kw["top_p"])
        ids = {(pr.dataset, pr.index): pr.ids for pr in self.rounds}
        todo = [g for g in self.gens if g["method"] in KSEQ_METHODS and g.get("tokens")]
        for g in progress_bar(progress, iterable=todo, desc="iterations given the check's outputs", position=0):
            law = survival_given_output(self.target, drafter, ids[(g["dataset"], g["prompt_index"])], g["tokens"],
                                        sampling, int(g["K"]))  # [n][K][K+1]
            g["survival"] = [[[round(v, 9) for v in row] for row in pos] for pos in law]
        return len(todo)

    def result(self) -> dict[str, Any]:
        """{"generations": [{dataset, prompt_index, method, K, L, stats}], "wall_seconds"}."""
        self.bar.close()
        if not all(self.done):
            raise RuntimeError(f"speed check rounds {[i for i, d in enumerate(self.done) if not d]} never ran")
        return {"generations": self.gens, "wall_seconds": time.perf_counter() - self.t0}


def spread_rounds(check: InterleavedCheck) -> Callable[[int, int], None]:
    """A ``between_rounds`` hook for :func:`mdv.paired.cost.calibrate` that runs the check's J rounds
    spread evenly over the calibration's R rounds (round j after calibration round j·R // J; any left
    after the last)."""
    J = len(check.rounds)
    check.with_calibration = True

    def hook(r: int, R: int) -> None:
        for j in range(J):
            if not check.done[j] and (j * R // J <= r or r == R - 1):
                check.run_round(j)

    return hook


def read_check(path: Path) -> Optional[dict[str, Any]]:
    """The check in ``path``, or None when absent, unreadable or of another schema."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("schema") == SCHEMA else None


def check_settings(cfg: SpeedCheckConfig, *, datasets: Sequence[str], n_tokens: int, temperature: float,
                   top_k: Optional[int], top_p: Optional[float], seed: int, models: str, drafter: str = "model",
                   drafter_options: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """What determines the check's generations (a stored check with other settings is redone)."""
    return {"cells": [list(c) for c in check_cells(cfg)], "datasets": list(datasets), "n_prompts": cfg.n_prompts,
            "n_tokens": n_tokens, "temperature": float(temperature), "top_k": top_k, "top_p": top_p,
            "seed": int(seed), "models": models, "drafter": drafter, "drafter_options": dict(drafter_options or {})}


def _device_of(run_cfg: Any) -> str:
    """The device ``mdv.sweep.load_models`` puts the models on."""
    from mdv.models.hf import default_device

    return str(run_cfg.models.device or default_device())


def _settings_of(run_cfg: Any, datasets: Sequence[str]) -> dict[str, Any]:
    cfg: SpeedCheckConfig = run_cfg.paired.speed_check
    names = list(cfg.datasets) if cfg.datasets is not None else list(datasets)
    return check_settings(cfg, datasets=names, n_tokens=int(cfg.n_tokens or run_cfg.paired.n_tokens),
                          temperature=float(run_cfg.sampling.temperatures[0]),
                          top_k=run_cfg.sampling.top_k, top_p=run_cfg.sampling.top_p,
                          seed=int(run_cfg.sweep.seeds[0]), models=models_label(run_cfg.models),
                          drafter=str(run_cfg.paired.drafter), drafter_options=dict(run_cfg.paired.drafter_options or {}))


def check_is_current(run_cfg: Any, out: Path, datasets: Sequence[str]) -> bool:
    """True when ``out/speedcheck.json`` holds a check with this run's settings, made on this machine (or
    the check is disabled): nothing to measure."""
    from mdv.paired.cost import machine_fingerprint

    if not run_cfg.paired.speed_check.enabled:
        return True
    old = read_check(out / check_file(run_cfg.paired.drafter))
    return (old is not None and old.get("settings") == _settings_of(run_cfg, datasets)
            and old.get("machine") == machine_fingerprint(_device_of(run_cfg)))


@dataclass
class PendingCheck:
    """A speed check to be measured: its settings (stored with the result) and its stepwise runner."""

    settings: dict[str, Any]
    runner: InterleavedCheck


def start_speed_check(run_cfg: Any, out: Path, models: Any, formatted: dict[str, list[list[int]]],
                      datasets: Sequence[str]) -> Optional[PendingCheck]:
    """The speed check of ``run_cfg.paired.speed_check`` to measure now, or None: disabled, already
    current in ``out/speedcheck.json`` (:func:`check_is_current`), or nothing loaded (``models`` None).

    ``formatted``: dataset -> the paired run's formatted prompt ids (at least ``n_prompts`` per checked
    dataset); ``datasets``: the paired run's dataset names (the check's default).  Its rounds run
    interleaved with the calibration (:func:`spread_rounds`) or alone in :func:`finish_speed_check`.
    """
    from mdv.errors import InvalidInputError
    from mdv.sweep import prompt_seed

    cfg: SpeedCheckConfig = run_cfg.paired.speed_check
    if not cfg.enabled or models is None or check_is_current(run_cfg, out, datasets):
        return None
    if read_check(out / check_file(run_cfg.paired.drafter)) is not None:
        log.warning("redoing the speed check: other settings, or made on another machine")
    settings = _settings_of(run_cfg, datasets)
    seed = settings["seed"]
    prompts = []
    for name in settings["datasets"]:
        ids_list = formatted.get(name) or []
        if len(ids_list) < cfg.n_prompts:
            raise InvalidInputError(
                f"paired.speed_check needs {cfg.n_prompts} prompts of {name!r} but the paired run has"
                f" {len(ids_list)}; lower paired.speed_check.n_prompts or raise paired.n_prompts")
        prompts += [SpeedCheckPrompt(name, i, list(ids_list[i]), prompt_seed(seed, i)) for i in range(cfg.n_prompts)]
    cells = check_cells(cfg)
    log.info("speed check: %d cells x %d prompts x %d tokens, interleaved", len(cells), len(prompts),
             settings["n_tokens"])
    runner = InterleavedCheck(models.target, models.draft, prompts, cells, n_tokens=settings["n_tokens"],
                              temperature=settings["temperature"], top_k=settings["top_k"], top_p=settings["top_p"],
                              progress=run_cfg.progress, drafter=settings["drafter"],
                              drafter_options=settings["drafter_options"])
    return PendingCheck(settings, runner)


def finish_speed_check(run_cfg: Any, out: Path, models: Any, pending: Optional[PendingCheck]) -> Optional[Path]:
    """Run what ``pending`` has left (all of it when no calibration took its rounds) and write
    ``out/speedcheck.json``.  -> that file, or None when the check is disabled or absent."""
    from mdv.paired.cost import machine_fingerprint
    from mdv.sweep import write_json_atomic

    path = out / check_file(run_cfg.paired.drafter)
    if not run_cfg.paired.speed_check.enabled:
        return None
    if pending is None:
        return path if read_check(path) is not None else None
    for j, done in enumerate(pending.runner.done):
        if not done:
            pending.runner.run_round(j)
    body = pending.runner.result()
    pending.runner.add_survival(progress=run_cfg.progress)
    body["interleaved_with_calibration"] = pending.runner.with_calibration
    write_json_atomic(path, {"schema": SCHEMA, "settings": pending.settings,
                             "machine": machine_fingerprint(models.device),
                             "models": {"target": models.target_name, "draft": models.draft_name}, **body})
    return path

