"""Typed config of the paired measurement (Hydra group ``paired``, ``mdv/conf/paired/*.yaml``; the
``paired`` field of :class:`mdv.sweep.RunConfig`)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional
from mdv.errors import InvalidInputError


def _all_verifiers() -> list[str]:
    from mdv.verify.registry import VERIFIERS

    return list(VERIFIERS)


@dataclass
class SpeedCheckConfig:
    """Real generations that check the predicted speedups (:mod:`mdv.paired.speedcheck`).

    enabled: run them (after the calibration, before the paired measurement, alone on the machine).
    methods, K, L: the (method, K, L) cells (single-draft methods at K = 1); AR always runs too.
    datasets: dataset names (null: the paired measurement's); n_prompts: prompts per dataset, the first
    ones of the paired measurement (their contexts are the prediction's); n_tokens: max_new_tokens of every
    generation (EOS ignored, so each emits exactly that many).  One extra untimed round on the first prompt
    warms the machine up.
    """

    enabled: bool = False
    methods: list[str] = field(default_factory=lambda: ["sd", "spectr", "mdbv"])
    K: list[int] = field(default_factory=lambda: [3])
    L: list[int] = field(default_factory=lambda: [2, 4])
    datasets: Optional[list[str]] = None
    n_prompts: int = 2
    n_tokens: Optional[int] = None


@dataclass
class PairedConfig:
    """What the paired measurement measures and how it decides.

    n_prompts: prompts per dataset (null: ``dataset.n_prompts``, the sweep's).  datasets: dataset names
    (null: ``dataset.names``, the sweep's).
    enabled: run it (``task=paired`` runs it alone; a sweep with ``paired.enabled=true`` runs it after its
    cells, into ``<results_dir>/paired/``).  K_max, L_max: the drafts per context (every K ≤ K_max and
    L ≤ L_max is evaluated on them).  n_tokens: target-only trajectory length per prompt; stride: a
    context every ``stride`` generated tokens (the prompt itself is the first).  methods: verifiers
    (default: every registered one).  delta: the equivalence margin of the verdicts, in tokens per
    iteration.  level, n_boot: confidence level and bootstrap resamples.  headline_K / headline_L: where
    the ordering claim is read (clipped to K_max / L_max).  calibrate: time this machine's passes for the
    speedup prediction (``calibration.json``, reused when it matches the machine, models and drafter).
    cost_profiles: names in ``mdv/conf/cost/`` or YAML paths of hardware profiles to predict speedups for.
    workers: processes that measure prompts at once (each loads the models and takes one torch thread; the
    per-record locks share the work).  The sweep's timed cells and the calibration run before, alone.
    calibration: a calibration file to use instead of calibrating (refused when it was made on another
    machine or for other models).  speed_check: the real generations that check the predicted speedups
    (:class:`SpeedCheckConfig`).  drafter, drafter_options: who proposes the drafts (:mod:`mdv.drafters`);
    the calibration times that drafter's call and the speed check generates with it, each into a file of
    its own (``calibration.<drafter>.json``, ``speedcheck.<drafter>.json``; the draft model's keep the
    plain names).
    """

    enabled: bool = False
    n_prompts: Optional[int] = None
    datasets: Optional[list[str]] = None
    K_max: int = 4
    L_max: int = 8
    stride: int = 4
    n_tokens: int = 64
    methods: list[str] = field(default_factory=_all_verifiers)
    delta: float = 0.01
    level: float = 0.95
    n_boot: int = 2000
    headline_K: int = 3
    headline_L: int = 4
    optimum_draws: int = 8
    calibrate: bool = True
    calibration_repeats: int = 5
    cost_profiles: list[str] = field(default_factory=lambda: ["gpu_like"])
    calibration: Optional[str] = None
    workers: int = 1
    speed_check: SpeedCheckConfig = field(default_factory=SpeedCheckConfig)
    drafter: str = "model"
    drafter_options: dict[str, Any] = field(default_factory=dict)


def _pos_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidInputError(f"paired.{name} must be an integer >= 1; got {value!r} (e.g. paired.{name}=4)")


def validate_paired(cfg: PairedConfig) -> None:
    """One :class:`~mdv.errors.InvalidInputError` naming the first bad field and a fix."""
    from mdv.errors import unknown_name
    from mdv.verify.registry import VERIFIERS

    if cfg.datasets is not None:
        from mdv.data import DATASETS

        if not cfg.datasets:
            raise InvalidInputError("paired.datasets is empty; name datasets or set it to null (the sweep's)")
        for d in cfg.datasets:
            if d not in DATASETS:
                raise unknown_name("paired.datasets entry", d, list(DATASETS))
    if cfg.n_prompts is not None:
        _pos_int("n_prompts", cfg.n_prompts)
    if isinstance(cfg.optimum_draws, bool) or not isinstance(cfg.optimum_draws, int) or cfg.optimum_draws < 0:
        raise InvalidInputError(f"paired.optimum_draws must be an integer >= 0; got {cfg.optimum_draws!r}")
    for name in ("K_max", "L_max", "stride", "n_tokens", "n_boot", "headline_K", "headline_L",
                 "calibration_repeats", "workers"):
        _pos_int(name, getattr(cfg, name))
    if not isinstance(cfg.delta, (int, float)) or not math.isfinite(cfg.delta) or cfg.delta <= 0:
        raise InvalidInputError(f"paired.delta (the equivalence margin, tokens per iteration) must be a finite"
                                f" number > 0; got {cfg.delta!r} (e.g. paired.delta=0.01)")
    if not isinstance(cfg.level, (int, float)) or not 0 < cfg.level < 1:
        raise InvalidInputError(f"paired.level must lie in (0, 1); got {cfg.level!r} (e.g. paired.level=0.95)")
    if cfg.n_boot < 100:
        raise InvalidInputError(f"paired.n_boot must be >= 100 for a percentile CI; got {cfg.n_boot}")
    if not cfg.methods:
        raise InvalidInputError(f"paired.methods is empty; name verifiers, e.g. paired.methods=[sd,spectr]"
                                f" (valid: {', '.join(VERIFIERS)})")
    for m in cfg.methods:
        if m not in VERIFIERS:
            raise unknown_name("paired.methods entry", m, list(VERIFIERS))
    from mdv.drafters.registry import get_drafter

    get_drafter(cfg.drafter, **dict(cfg.drafter_options or {}))  # an unknown name or option: one line, now
    check = cfg.speed_check
    if check.enabled:
        _pos_int("speed_check.n_prompts", check.n_prompts)
        if check.n_tokens is not None:
            _pos_int("speed_check.n_tokens", check.n_tokens)
            if check.n_tokens > cfg.n_tokens:
                raise InvalidInputError(
                    f"paired.speed_check.n_tokens={check.n_tokens} exceeds paired.n_tokens={cfg.n_tokens}: the"
                    f" paired contexts cover only the first {cfg.n_tokens} generated positions and acceptance"
                    " changes with the position, so longer runs are not the ones predicted; lower"
                    " paired.speed_check.n_tokens (or set it to null) or raise paired.n_tokens")
        if not check.methods:
            raise InvalidInputError("paired.speed_check.methods is empty; name verifiers, e.g."
                                    " paired.speed_check.methods=[sd,spectr], or set paired.speed_check.enabled=false")
        for m in check.methods:
            if m not in cfg.methods:
                raise InvalidInputError(f"paired.speed_check.methods entry {m!r} is not measured by the paired"
                                        f" run (paired.methods = {list(cfg.methods)}), so it has no prediction to"
                                        " check; add it to paired.methods or drop it")
        for name, top in (("K", cfg.K_max), ("L", cfg.L_max)):
            values = getattr(check, name)
            if not values:
                raise InvalidInputError(f"paired.speed_check.{name} is empty; e.g. paired.speed_check.{name}=[2]")
            for v in values:
                if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= top:
                    raise InvalidInputError(f"paired.speed_check.{name} entry {v!r} must be an integer in [1,"
                                            f" paired.{name}_max = {top}] (the paired run predicts only there)")
        if check.datasets is not None:
            pool = cfg.datasets
            if not check.datasets:
                raise InvalidInputError("paired.speed_check.datasets is empty; name datasets or set it to null")
            for d in check.datasets:
                if pool is not None and d not in pool:
                    raise InvalidInputError(f"paired.speed_check.datasets entry {d!r} is not in paired.datasets"
                                            f" ({list(pool)}): its prompts would have no paired contexts")


__all__ = ["PairedConfig", "SpeedCheckConfig", "validate_paired"]
