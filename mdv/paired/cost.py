"""The cost of one speculative iteration, calibrated on this machine, and the speedup it predicts.

A speculative iteration (:mod:`mdv.engine`) costs

1. **draft**: the drafter's ``propose(seq, K, L)`` and ``commit`` (for the draft model: one ``extend`` of
   the pending token in one row, ``fork(K)``, L − 1 ``extend`` steps over K rows, the laws [K, L, V] and,
   at the end of the iteration, ``keep(sel)``; for ``ngram`` a lookup; for ``eagle`` its layer's steps);
2. **target**: ONE token-tree pass over the N nodes of ``build_tree(pending, drafts)`` -- the pending
   root plus every distinct draft prefix, so L + 1 <= N <= K·L + 1 -- then ``keep_nodes`` of the kept path
   (at K = 1 the engine scores the draft as one row instead, ``target_pass="rows"``: ``target_rows_s[L]``
   replaces ``target_s(N)`` below; on the default pair it costs what a tree of L + 1 nodes costs, within
   the timing noise: 74.7 vs 74.3 ms at L = 2, 104.4 vs 106.6 ms at L = 4);
3. **verify**: ``verifier.step`` on the block (float64 laws over the real vocabulary V).

In units of one autoregressive (AR) step of the target (one ``extend`` of one token: the cost of one
token of the AR baseline) the iteration takes

    t(m, K, L, N) = [propose_s[K/L] + target_s(N) + verify_s[m/K/L]] / ar_step_s                    (1)

where ``propose_s[K/L]`` is the drafter's whole ``propose`` + ``commit``, timed as one call.  A calibration
made before that was timed (no ``propose_s``) prices the draft model's parts instead,
``draft_first_s + draft_fork_s[K] + (L − 1)·draft_step_s[K]``, with ``draft_fork_s[K]`` the cache copy of
``fork(K)`` + ``keep`` (O(context), 0 at K = 1; a fixture without it reads 0); those parts are still
timed, as the breakdown of the model drafter's call (on the default pair the whole call and the sum of
its parts agreed within 3 ms, 7%, at K = 1 and 3, L = 2 and 4, in two calibrations).  Every iteration emits
1 + tau tokens, the AR baseline one token per step, so over contexts c (each with its drafts) the
speedup over AR is the ratio of means

    speedup = E_c[1 + E[tau | c, drafts]] / E_c[t(m, K, L, N_c)].                                (2)

This is the walltime improvement factor of Leviathan, Kalman & Matias 2023 ("Fast Inference from
Transformers via Speculative Decoding", ICML, §3.4: E[#tokens] / (γ·c + 1) with γ = L draft
steps of relative cost c and one target pass of relative cost 1), with the single-draft target pass
replaced by the measured cost of scoring a token tree of N positions, the batch/tree cost that
multi-draft verification pays (Sun et al. 2023, "SpecTr: Fast Speculative Decoding via Optimal
Transport", NeurIPS: K drafts scored in one batched pass cost more than one draft once the pass is no
longer purely memory-bound), plus the verifier's own time.

Two cost sources plug into (2):

* :class:`Calibration` -- measured here by :func:`calibrate` (one short interleaved run on the real
  sessions), saved as JSON and reloaded only on the same machine for the same models
  (:func:`load_calibration`);
* :class:`CostProfile` -- a user-supplied hardware profile in target-step units, ``t = c·L + 1 + α·(N − 1)``
  (``mdv/conf/cost/*.yaml``, :func:`load_cost_profile`), for predicting another machine (e.g. a GPU, where
  the pass is memory-bound and extra tree positions are nearly free) from the same per-context tokens.

``target_s`` is measured at a subset of node counts (1, 2, 3, 5, 7, 9, 13, 17, 25, 33, ... = 1 + 2^j and
1 + 3·2^j, and exactly n_max = K_max·L_max + 1: :func:`measured_node_counts`) and **linearly interpolated** in
between (:meth:`Calibration.target_time`).
"""
from __future__ import annotations

import datetime as _dt
import json
import math
import numbers
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np
import torch

from mdv.errors import InvalidInputError, MissingAssetError, unknown_name

if TYPE_CHECKING:  # pragma: no cover
    from mdv.paired.stats import Estimate

__all__ = ["Calibration", "CostProfile", "SCHEMA", "calibrate", "iteration_time", "load_calibration",
           "load_cost_profile", "machine_fingerprint", "measured_node_counts", "model_fingerprint",
           "predict_speedup", "synthetic_tree"]

SCHEMA = "mdv.paired.cost/1"
_RECALIBRATE = ("recalibrate with mdv.paired.cost.calibrate(target, draft, K_max=..., L_max=..., methods=[...],"
                " context_ids=...).save(path)")


# ====================================================================================== fingerprints
def machine_fingerprint(device: torch.device | str = "cpu") -> dict[str, Any]:
    """What a calibration depends on besides the models: ``hostname``, ``cpu`` (the model name in
    /proc/cpuinfo, else :func:`platform.processor`), ``logical_cores``, ``torch`` (version),
    ``torch_threads`` (:func:`torch.get_num_threads`), ``device`` (with the GPU name on CUDA)."""
    from mdv.machine import describe

    env = describe(device)
    return {"hostname": socket.gethostname(), "cpu": env["cpu"], "logical_cores": env["logical_cores"],
            "torch": env["torch"], "torch_threads": env["threads"], "device": env["device"]}


def model_fingerprint(model: Any) -> dict[str, Any]:
    """``class``, ``name``, ``vocab_size``, ``dtype`` and ``parameters`` (count) of a LanguageModel
    (``dtype`` / ``parameters`` None where the model has no torch module)."""
    module = getattr(model, "model", None)
    if not isinstance(module, torch.nn.Module):
        module = model if isinstance(model, torch.nn.Module) else None
    params = int(sum(p.numel() for p in module.parameters())) if module is not None else None
    dtype = getattr(model, "dtype", None)
    return {"class": type(model).__name__, "name": getattr(model, "name", None),
            "vocab_size": int(getattr(model, "vocab_size", 0)),
            "dtype": str(dtype).removeprefix("torch.") if dtype is not None else None, "parameters": params}


# ====================================================================================== Calibration
def _positive(name: str, x: Any) -> float:
    if isinstance(x, bool) or not isinstance(x, numbers.Real) or not math.isfinite(float(x)) or float(x) <= 0:
        raise InvalidInputError(f"{name} must be a finite number of seconds > 0; got {x!r}")
    return float(x)


def _int_keys(name: str, d: Mapping[Any, Any]) -> dict[int, float]:
    if not isinstance(d, Mapping) or not d:
        raise InvalidInputError(f"{name} must be a non-empty mapping int -> seconds; got {d!r}")
    out: dict[int, float] = {}
    for k, v in d.items():
        try:
            ik = int(k)
        except (TypeError, ValueError):
            raise InvalidInputError(f"{name} keys must be integers; got {k!r}") from None
        if ik < 1 or str(ik) != str(k).strip():
            raise InvalidInputError(f"{name} keys must be integers >= 1; got {k!r}")
        out[ik] = _positive(f"{name}[{ik}]", v)
    return dict(sorted(out.items()))


def verify_key(method: str, K: int, L: int) -> str:
    """The key of ``Calibration.verify_s``: ``"method/K/L"``."""
    return f"{method}/{int(K)}/{int(L)}"


@dataclass
class Calibration:
    """Measured seconds of the parts of one speculative iteration (formula (1) of the module docstring).

    machine:        :func:`machine_fingerprint` of the run (hostname, cpu, torch, torch_threads, device).
    models:         ``{"target": model_fingerprint, "draft": model_fingerprint}``.
    target_s:       n -> median seconds of one target token-tree pass with n nodes (extend_tree +
                    sampling law + keep_nodes), at the measured n only; :meth:`target_time` interpolates.
    draft_first_s:  one draft extend of the 1 pending token in one row (+ its sampling law and draw).
    draft_step_s:   K -> one draft extend step over K rows (+ laws and K draws), K = 1..K_max.
    verify_s:       "method/K/L" -> ``verifier.step`` on a synthetic block of the real V (+ the O(K·L)
                    block checks the engine runs per iteration).
    ar_step_s:      one target extend of 1 token (+ law and draw): the AR unit.
    draft_fork_s:   K -> ``fork(K)`` + ``keep(0)`` of the draft cache ({} = 0).
    target_rows_s:  L -> the K = 1 target pass the engine runs instead of a tree (``target_pass="rows"``:
                    ``fork(1)``, one extend of pending + L tokens, law, ``keep(0)``), L = 1..L_max ({}: the
                    tree pass of L + 1 nodes stands in, as in files made before it was timed).
    propose_s:      "K/L" -> the drafter's ``propose(context, K, L)`` + ``commit(0, 0)``, K = 1..K_max,
                    L = 1..L_max ({}: the draft model's parts above stand in, as in files made before it
                    was timed).
    drafter:        ``{"name", "options"}`` of the drafter ``propose_s`` timed (``mdv.drafters``).
    created:        ISO-8601 UTC time of the run.
    settings:       K_max, L_max, methods, context_length, repeats, sampling of the run.
    details:        measurement key -> {"median", "min", "max", "n"} in seconds (:func:`mdv.bench.timing.spread`).
    """

    machine: dict[str, Any]
    models: dict[str, Any]
    target_s: dict[int, float]
    draft_first_s: float
    draft_step_s: dict[int, float]
    verify_s: dict[str, float]
    ar_step_s: float
    draft_fork_s: dict[int, float] = field(default_factory=dict)
    target_rows_s: dict[int, float] = field(default_factory=dict)
    propose_s: dict[str, float] = field(default_factory=dict)
    drafter: dict[str, Any] = field(default_factory=lambda: {"name": "model", "options": {}})
    created: str = ""
    settings: dict[str, Any] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.target_s = _int_keys("target_s", self.target_s)
        self.draft_step_s = _int_keys("draft_step_s", self.draft_step_s)
        self.draft_fork_s = ({int(k): float(v) for k, v in self.draft_fork_s.items()} if self.draft_fork_s else {})
        for k, v in self.draft_fork_s.items():
            if not math.isfinite(v) or v < 0:
                raise InvalidInputError(f"draft_fork_s[{k}] must be a finite number of seconds >= 0; got {v!r}")
        self.target_rows_s = _int_keys("target_rows_s", self.target_rows_s) if self.target_rows_s else {}
        ps: dict[str, float] = {}
        for k, v in (self.propose_s or {}).items():
            parts = str(k).split("/")
            if len(parts) != 2 or not all(p.isdigit() and int(p) >= 1 for p in parts):
                raise InvalidInputError(f"propose_s keys must read 'K/L' (e.g. '3/4'); got {k!r}")
            ps[str(k)] = _positive(f"propose_s[{k!r}]", v)
        self.propose_s = ps
        if not isinstance(self.drafter, Mapping) or not isinstance(self.drafter.get("name"), str):
            raise InvalidInputError(f"drafter must be a mapping with a 'name' (and 'options'); got {self.drafter!r}")
        self.drafter = {"name": self.drafter["name"], "options": dict(self.drafter.get("options") or {})}
        self.draft_first_s = _positive("draft_first_s", self.draft_first_s)
        self.ar_step_s = _positive("ar_step_s", self.ar_step_s)
        if not isinstance(self.verify_s, Mapping) or not self.verify_s:
            raise InvalidInputError(f"verify_s must be a non-empty mapping 'method/K/L' -> seconds; got {self.verify_s!r}")
        vs: dict[str, float] = {}
        for k, v in self.verify_s.items():
            parts = str(k).split("/")
            if len(parts) != 3 or not all(p.isdigit() for p in parts[1:]):
                raise InvalidInputError(f"verify_s keys must read 'method/K/L' (e.g. 'spectr/4/8'); got {k!r}")
            vs[str(k)] = _positive(f"verify_s[{k!r}]", v)
        self.verify_s = vs

    # ------------------------------------------------------------------ derived
    @property
    def K_max(self) -> int:
        return max(self.draft_step_s)

    @property
    def n_max(self) -> int:
        """The largest calibrated tree (node count)."""
        return max(self.target_s)

    def target_time(self, nodes: np.ndarray | Sequence[int] | int) -> np.ndarray:
        """Seconds of a target tree pass with ``nodes`` nodes ([n] -> [n] float64): ``target_s`` linearly
        interpolated between the measured node counts; outside [min, max] measured is an error."""
        n = np.asarray(nodes, dtype=np.float64)
        xs = np.array(sorted(self.target_s), dtype=np.float64)
        ys = np.array([self.target_s[int(x)] for x in xs])
        if n.size and (not np.isfinite(n).all() or (n != np.round(n)).any()):
            raise InvalidInputError("nodes must be integer node counts (the pending root included)")
        if n.size and (n.min() < xs[0] or n.max() > xs[-1]):
            raise InvalidInputError(
                f"a tree of {int(n.min()) if n.min() < xs[0] else int(n.max())} nodes lies outside the calibrated"
                f" range [{int(xs[0])}, {int(xs[-1])}]; {_RECALIBRATE} with a larger K_max·L_max")
        return np.interp(n, xs, ys)

    def draft_seconds(self, K: int, L: int) -> float:
        """The draft part of (1): ``propose_s[K/L]``, or the draft model's parts where no call was timed."""
        if self.propose_s:
            key = f"{int(K)}/{int(L)}"
            if key not in self.propose_s:
                raise InvalidInputError(f"propose_s has no entry {key!r} (calibrated K <= {self.K_max}, L <="
                                        f" {max(int(k.split('/')[1]) for k in self.propose_s)}); {_RECALIBRATE}"
                                        f" with K_max >= {K}, L_max >= {L}")
            return self.propose_s[key]
        if self.drafter["name"] != "model":
            raise InvalidInputError(f"this calibration of drafter {self.drafter['name']!r} timed no propose call;"
                                    f" {_RECALIBRATE}")
        return self.draft_first_s + self.draft_fork_s.get(K, 0.0) + (L - 1) * self.draft_step_s[K]

    def iteration_seconds(self, method: str, K: int, L: int, nodes: np.ndarray) -> np.ndarray:
        """Numerator of (1) in seconds, [n] -> [n]."""
        if K not in self.draft_step_s:
            raise InvalidInputError(f"K={K} is not calibrated (draft_step_s has K in {sorted(self.draft_step_s)});"
                                    f" {_RECALIBRATE} with K_max >= {K}")
        key = verify_key(method, K, L)
        if key not in self.verify_s:
            raise InvalidInputError(
                f"verify_s has no entry {key!r} (calibrated: {', '.join(sorted(self.verify_s)[:8])}"
                f"{', ...' if len(self.verify_s) > 8 else ''}); {_RECALIBRATE} with {method!r} in methods and"
                f" K_max >= {K}, L_max >= {L}")
        fixed = self.draft_seconds(K, L) + self.verify_s[key]
        if K == 1 and L in self.target_rows_s:  # the engine scores one draft as a row, not a tree
            return fixed + np.full(np.shape(nodes), self.target_rows_s[L])
        return fixed + self.target_time(nodes)

    # ------------------------------------------------------------------ persistence
    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "created": self.created, "machine": dict(self.machine), "models": dict(self.models),
                "ar_step_s": self.ar_step_s, "draft_first_s": self.draft_first_s,
                "draft_step_s": {str(k): v for k, v in self.draft_step_s.items()},
                "draft_fork_s": {str(k): v for k, v in self.draft_fork_s.items()},
                "target_s": {str(k): v for k, v in self.target_s.items()},
                "target_rows_s": {str(k): v for k, v in self.target_rows_s.items()}, "verify_s": dict(self.verify_s),
                "propose_s": dict(self.propose_s), "drafter": {"name": self.drafter["name"],
                                                               "options": dict(self.drafter["options"])},
                "settings": dict(self.settings), "details": dict(self.details)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Calibration":
        """The inverse of :meth:`to_dict`; :class:`InvalidInputError` on a malformed record."""
        if not isinstance(d, Mapping):
            raise InvalidInputError(f"a calibration record must be a JSON object; got {type(d).__name__}")
        if d.get("schema", SCHEMA) != SCHEMA:
            raise InvalidInputError(f"calibration schema is {d.get('schema')!r}, this mdv reads {SCHEMA!r}")
        missing = [k for k in ("machine", "models", "target_s", "draft_first_s", "draft_step_s", "verify_s",
                               "ar_step_s") if k not in d]
        if missing:
            raise InvalidInputError(f"calibration record lacks field(s) {', '.join(missing)}")
        return cls(machine=dict(d["machine"]), models=dict(d["models"]), target_s=dict(d["target_s"]),
                   draft_first_s=d["draft_first_s"], draft_step_s=dict(d["draft_step_s"]),
                   verify_s=dict(d["verify_s"]), ar_step_s=d["ar_step_s"],
                   draft_fork_s=dict(d.get("draft_fork_s") or {}),
                   target_rows_s=dict(d.get("target_rows_s") or {}), propose_s=dict(d.get("propose_s") or {}),
                   drafter=dict(d.get("drafter") or {"name": "model", "options": {}}), created=str(d.get("created", "")),
                   settings=dict(d.get("settings") or {}), details=dict(d.get("details") or {}))

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the calibration as JSON, atomically (a temp file in the same folder, then os.replace)."""
        from mdv.bench.records import write_json

        return write_json(Path(path), self.to_dict())


def load_calibration(path: str | os.PathLike[str], *, target: Any = None, draft: Any = None,
                     drafter: str | None = None, drafter_options: Mapping[str, Any] | None = None) -> Calibration:
    """Read a calibration written by :meth:`Calibration.save`, refusing one that does not apply here.

    Checked: the machine's ``hostname``, ``cpu`` and ``torch_threads`` always, its ``device`` when
    ``target`` is given (the target's device), the :func:`model_fingerprint` of ``target`` / ``draft``
    when given, and the drafter's name and options when ``drafter`` is given.  A difference raises
    :class:`InvalidInputError` in one line naming the field, both values and the fix.  A missing file raises :class:`MissingAssetError`."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise MissingAssetError(f"calibration file not found: {path}; {_RECALIBRATE}") from None
    try:
        cal = Calibration.from_dict(json.loads(text))
    except (ValueError, TypeError) as exc:
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise InvalidInputError(f"calibration file {path} is unreadable ({msg}); delete it or {_RECALIBRATE}") from None

    def refuse(name: str, there: Any, here: Any) -> InvalidInputError:
        return InvalidInputError(f"calibration file {path} does not apply here: {name} is {there!r} in the file but"
                                 f" {here!r} now; delete it or {_RECALIBRATE}")

    dev = getattr(target, "device", None) if target is not None else None
    here = machine_fingerprint(dev if dev is not None else "cpu")
    fields = ["hostname", "cpu", "torch_threads"] + (["device"] if dev is not None else [])
    for f in fields:
        if cal.machine.get(f) != here[f]:
            raise refuse(f"machine.{f}", cal.machine.get(f), here[f])
    for role, model in (("target", target), ("draft", draft)):
        if model is None:
            continue
        mine = model_fingerprint(model)
        theirs = cal.models.get(role) or {}
        for f, v in mine.items():
            if theirs.get(f) != v:
                raise refuse(f"models.{role}.{f}", theirs.get(f), v)
    if drafter is not None:
        mine = {"name": str(drafter), "options": dict(drafter_options or {})}
        if cal.drafter != mine:
            raise refuse("drafter", cal.drafter, mine)
    return cal


# ====================================================================================== CostProfile
@dataclass(frozen=True)
class CostProfile:
    """A hardware profile in target-step units: one iteration costs

        t = c·L + 1 + alpha·(N − 1)

    with ``c`` the cost of one draft step, 1 the target pass of the root (the AR step), and ``alpha``
    the extra cost per verified tree position (each of the N − 1 nodes beyond the root).  This is
    SR = E[accepted] / (c·L + 1 + α·N') with N' = N − 1 verified draft positions; α = 0 gives the
    single-pass model of Leviathan et al. 2023, §3.4 (γ·c + 1), α > 0 the batch/tree cost of SpecTr
    (Sun et al. 2023).  The verifier's own time is taken as part of alpha (negligible on a GPU)."""

    alpha: float
    c: float
    name: str | None = None

    def __post_init__(self) -> None:
        for f in ("alpha", "c"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(float(v)) or float(v) < 0:
                raise InvalidInputError(f"cost profile field {f!r} must be a finite number >= 0; got {v!r}")
            object.__setattr__(self, f, float(v))
        if self.name is not None and not isinstance(self.name, str):
            raise InvalidInputError(f"cost profile field 'name' must be a string; got {self.name!r}")


_PROFILE_FIELDS = ("name", "alpha", "c")


def load_cost_profile(path: str | os.PathLike[str]) -> CostProfile:
    """A :class:`CostProfile` from a YAML file with fields ``alpha`` and ``c`` (required, finite, >= 0)
    and ``name`` (optional: the file's stem).  A missing or unknown field, or a bad value, raises
    :class:`InvalidInputError` naming the field and the fix."""
    import yaml

    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise MissingAssetError(f"cost profile not found: {path}; see mdv/conf/cost/gpu_like.yaml for an example") from None
    except yaml.YAMLError as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise InvalidInputError(f"cost profile {path} is not valid YAML ({first}); fix the file") from None
    if not isinstance(raw, dict):
        raise InvalidInputError(f"cost profile {path} must be a mapping with fields alpha, c (and name);"
                                f" got {type(raw).__name__}")
    extra = sorted(str(k) for k in raw if k not in _PROFILE_FIELDS)
    if extra:
        raise InvalidInputError(f"cost profile {path}: unknown field {extra[0]!r}; the fields are"
                                f" {', '.join(_PROFILE_FIELDS)}: remove it or fix its spelling")
    for f in ("alpha", "c"):
        if f not in raw or raw[f] is None:
            raise InvalidInputError(f"cost profile {path}: missing field {f!r}; add '{f}: <number >= 0>'"
                                    " (in target-step units)")
        v = raw[f]
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(float(v)) or float(v) < 0:
            raise InvalidInputError(f"cost profile {path}: field {f!r} must be a finite number >= 0 (target-step"
                                    f" units); got {v!r}: fix it")
    name = raw.get("name", path.stem)
    if name is not None and not isinstance(name, str):
        raise InvalidInputError(f"cost profile {path}: field 'name' must be a string; got {name!r}: quote it")
    return CostProfile(alpha=float(raw["alpha"]), c=float(raw["c"]), name=name)


# ====================================================================================== prediction
def _check_KL(K: Any, L: Any) -> tuple[int, int]:
    for n, v in (("K", K), ("L", L)):
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
            raise InvalidInputError(f"{n} must be an integer >= 1; got {v!r}")
    return int(K), int(L)


def _nodes_array(nodes: Any, K: int, L: int) -> np.ndarray:
    n = np.asarray(nodes, dtype=np.float64)
    if n.ndim != 1 or n.size == 0:
        raise InvalidInputError(f"nodes must be a non-empty 1-D array [n contexts]; got shape {n.shape}")
    if not np.isfinite(n).all() or (n != np.round(n)).any():
        raise InvalidInputError("nodes must be integer node counts (the pending root included)")
    lo, hi = L + 1, K * L + 1
    if n.min() < lo or n.max() > hi:
        bad = n.min() if n.min() < lo else n.max()
        raise InvalidInputError(
            f"nodes must lie in [L+1, K·L+1] = [{lo}, {hi}] (the tree of K={K} drafts of length L={L},"
            f" pending root included); got {int(bad)}")
    return n


def iteration_time(nodes: np.ndarray | Sequence[int], *, method: str, K: int, L: int,
                   cost: Calibration | CostProfile) -> np.ndarray:
    """Time per iteration in AR-step units at each context, [n] -> [n] float64.

    nodes: [n] tree sizes N (the pending root included; L + 1 <= N <= K·L + 1).  With a
    :class:`Calibration`: formula (1) of the module docstring; with a :class:`CostProfile`:
    ``c·L + 1 + alpha·(N − 1)`` (``method`` unused)."""
    K, L = _check_KL(K, L)
    n = _nodes_array(nodes, K, L)  # [n]
    if isinstance(cost, CostProfile):
        return cost.c * L + 1.0 + cost.alpha * (n - 1.0)  # [n]
    if isinstance(cost, Calibration):
        return cost.iteration_seconds(method, K, L, n) / cost.ar_step_s  # [n]
    raise InvalidInputError(f"cost must be a Calibration or a CostProfile; got {type(cost).__name__}")


def predict_speedup(tokens_per_iter: np.ndarray, nodes: np.ndarray, clusters: np.ndarray, *, method: str, K: int,
                    L: int, cost: Calibration | CostProfile, **bootstrap_kw: Any) -> "Estimate":
    """Predicted speedup over AR, E[1 + tau] / E[t] (formula (2)), with a cluster-bootstrap CI.

    tokens_per_iter: [n] 1 + E[tau | context, drafts] per context (in [1, L + 1]).
    nodes:           [n] tree size N of each context's K drafts of length L (root included).
    clusters:        [n] cluster (prompt) label per context.
    bootstrap_kw:    n_boot, level, seed of :func:`mdv.paired.stats.cluster_bootstrap`.
    -> ``cluster_bootstrap(tokens_per_iter, clusters, ratio_to=iteration_time(...))``: the mean is the
    ratio of means sum_i (1 + tau_i) / sum_i t_i."""
    from mdv.paired.stats import cluster_bootstrap

    K, L = _check_KL(K, L)
    tok = np.asarray(tokens_per_iter, dtype=np.float64)  # [n]
    if tok.ndim != 1:
        raise InvalidInputError(f"tokens_per_iter must be a 1-D array [n contexts]; got shape {tok.shape}")
    n = _nodes_array(nodes, K, L)  # [n]
    if tok.shape != n.shape:
        raise InvalidInputError(f"tokens_per_iter has {tok.shape[0]} entries but nodes has {n.shape[0]}; pass one"
                                " of each per context")
    if not np.isfinite(tok).all() or tok.min() < 1 or tok.max() > L + 1 + 1e-9:
        raise InvalidInputError(f"tokens_per_iter must lie in [1, L+1] = [1, {L + 1}] (1 + E[tau], tokens emitted per"
                                f" iteration); got values in [{tok.min()}, {tok.max()}]")
    times = iteration_time(n, method=method, K=K, L=L, cost=cost)  # [n]
    return cluster_bootstrap(tok, clusters, ratio_to=times, **bootstrap_kw)


# ====================================================================================== calibration run
def measured_node_counts(n_max: int) -> list[int]:
    """The node counts ``calibrate`` times: 1, 2, then 1 + 2^j and 1 + 3·2^j below n_max, and n_max itself.

    Between them the pass time is interpolated linearly, and it is not linear in n: the products' row blocks
    and the attention's switch to tiles make steps (on the panel kernel's 6-row blocks the interpolation
    between 9 and 17 nodes missed a 13-node pass by 5.4 ms, 10%).  1 + 3·2^j adds the full trees 1 + K·L of
    K = 3 with L = 2, 4, 8 (7, 13, 25 nodes: the speed check's spectr cells) for ~4 probes more."""
    pts = {1, min(2, n_max), n_max}
    j = 1
    while 1 + 2 ** j < n_max:
        pts.add(1 + 2 ** j)
        if 1 + 3 * 2 ** j < n_max:
            pts.add(1 + 3 * 2 ** j)
        j += 1
    return sorted(pts)


def synthetic_tree(pending: int, n: int, K: int, L: int, vocab_size: int, generator: torch.Generator):
    """A token tree of exactly ``n`` nodes (1 <= n <= K·L + 1) from at most K synthetic drafts of length
    at most L: ceil((n−1)/L') drafts of length L' = min(L, n−1) with distinct first tokens, the last one
    sharing just enough of a prefix with draft 0.  -> (TokenTree, the root path to keep)."""
    from mdv.models.tree import TokenTree, build_tree

    m = n - 1
    if not 0 <= m <= K * L:
        raise InvalidInputError(f"a tree of {n} nodes needs 1 <= n <= K·L + 1 = {K * L + 1}")
    if m == 0:
        return TokenTree([int(pending)], [-1], [0], torch.zeros(1, 1, dtype=torch.long)), [0]
    Ld = min(L, m)
    k = -(-m // Ld)
    share = k * Ld - m  # < Ld: the last draft repeats this many leading tokens of draft 0
    if vocab_size < k + 1:
        raise InvalidInputError(f"vocab_size={vocab_size} is too small for {k} distinct drafts")
    drafts = torch.randint(0, vocab_size, (k, Ld), generator=generator)
    drafts[:, 0] = torch.randperm(vocab_size, generator=generator)[:k]
    if share:
        drafts[k - 1, :share] = drafts[0, :share]
        drafts[k - 1, share] = (drafts[0, share] + 1) % vocab_size
    tree = build_tree([int(pending)], drafts)
    assert tree.size == n, (tree.size, n)
    return tree, tree.path(k - 1, Ld)


@dataclass
class _Probe:
    key: str
    run: Callable[[], Any]
    setup: Callable[[], None] | None = None
    restore: Callable[[], None] | None = None


def calibrate(target: Any, draft: Any, *, K_max: int, L_max: int, methods: Sequence[str],
              context_ids: Sequence[int], repeats: int = 5, progress: bool = False,
              sampling: Any = None, seed: int = 0, sessions: tuple[Any, Any] | None = None,
              between_rounds: Callable[[int, int], None] | None = None, drafter: str = "model",
              drafter_options: Mapping[str, Any] | None = None) -> Calibration:
    """Time every part of formula (1) in ONE short interleaved run; -> :class:`Calibration`.

    Opens a target and a draft session (:func:`mdv.models.session.open_session`, or ``sessions``: two
    fresh ones), prefills the target with ``context_ids[:-1]`` and the draft with ``context_ids`` (the
    last token is the pending root, as in the engine), then runs one untimed warm-up round and
    ``repeats`` timed rounds; in each round every measurement runs once, in an order rotated by one
    per round (:func:`mdv.bench.timing.interleaved`'s scheme), so a drift of the machine's load hits all of
    them alike.  Each measurement is prepared (fork / block slice) and undone (crop / keep) outside
    its timed call (:func:`mdv.bench.timing.time_call`, CUDA-synchronised), so every repeat sees the same
    context length.  On CPUs the caches are evicted after the preparation (:class:`mdv.bench.timing.
    CacheEvictor`, recorded as ``settings["cache_evicted_bytes"]``): the rotation runs each probe after its
    twin, with its weights and rows still cached, while in the engine every phase follows one that streamed
    the other model's weights; without it the calibration priced the draft's call ~1 ms and the verifier's
    step ~0.5 ms under what they cost in real runs (K = 3, L = 4 on the fast path).  The value kept is the
    median over the rounds.  Measurements:

    * ``target/n``: extend_tree of a :func:`synthetic_tree` with n nodes + the sampling law of its
      nodes + keep_nodes of the last draft's path; n in :func:`measured_node_counts` (K_max·L_max + 1);
    * ``target_rows/L``: the K = 1 pass the engine runs instead (``score_drafts`` without a tree: fork(1),
      one extend of the pending token + L draft tokens, the laws, keep(0)), L = 1..L_max;
    * ``ar``: target extend of the pending token + law + draw;
    * ``draft_first``: draft extend of the pending token in one row + law + draw;
    * ``draft_step/K``: draft extend of K rows (after an untimed fork) + laws + K draws, K = 1..K_max;
    * ``draft_fork/K``: fork(K) + keep(0) of the draft cache;
    * ``propose/K/L``: the drafter's (``drafter``, ``drafter_options``: :mod:`mdv.drafters`) ``propose`` of
      K blocks of L tokens after the context + ``commit(0, 0)``, then an untimed ``rewind`` to the
      prefilled state; K = 1..K_max, L = 1..L_max.  A drafter that reads the target's features
      (``eagle``) gets the prefill's, and the target records features in every pass but the AR unit's, as
      in the engine;
    * ``verify/m/K/L``: ``VERIFIERS[m]()`` (reset before each call) ``.step`` on the K×L slice of one
      :func:`mdv.bench.synthetic.synthetic_block` over the target's V, after the engine's per-iteration O(K·L)
      checks; single-draft methods at K = 1 only.

    ``sampling``: a :class:`~mdv.models.sampling.SamplingConfig` whose law is timed (default T = 1).
    ``between_rounds(r, rounds)``: called after each round r = 0..rounds-1 (outside every timed call, the
    sessions untouched): other work interleaved with the calibration, e.g. the speed check's generations
    (:mod:`mdv.paired.speedcheck`), so that both see the same machine (on a shared machine the speed of
    compute-bound passes drifts by tens of percent over minutes, and not alike for every part).
    On return the sessions hold ``len(context_ids) − 1`` (target) and ``len(context_ids)`` (draft)
    tokens in one row, as after the prefill.

    Cost: (1 + repeats) × (#node counts + L_max + 2 + 2·K_max + K_max·L_max + #verify cells) timed calls,
    each after a cache eviction on CPUs (~3-8 ms).  Measured before the evictions (add ~3-8 ms a call) and the
    drafter's ``propose`` probes were added, on a shared 2-core Xeon CPU: the tiny random
    pair (K_max = L_max = 2, sd + spectr, repeats = 2) ~0.4 s; the default pair (SmolLM2-135M target + its
    3-layer draft, float32), K_max = 4, L_max = 8, all six methods (120 verify cells), 128 context tokens,
    repeats = 5: 10.8 s with 1 torch thread at load
    average ~1 (target pass 80 ms at 1 node, 210 ms at 33), but 67 s with 2 threads while other jobs
    held both cores (load ~3: every pass 4-7x slower) -- calibrate on a quiet machine.
    """
    import time

    from tqdm.auto import tqdm

    from mdv.bench.timing import CacheEvictor, spread, sync_for, time_call
    from mdv.bench.synthetic import synthetic_block
    from mdv.drafters.model import check_pair
    from mdv.drafters.registry import get_drafter
    from mdv.engine import check_prompt_fits, max_context, score_drafts
    from mdv.models.base import check_token_ids
    from mdv.models.sampling import SamplingConfig
    from mdv.models.session import open_session, tree_capable
    from mdv.verify._math import categorical
    from mdv.verify.registry import VERIFIERS

    t_start = time.perf_counter()
    V = check_pair(target, draft)
    K_max, L_max = _check_KL(K_max, L_max)
    if isinstance(repeats, bool) or not isinstance(repeats, numbers.Integral) or repeats < 1:
        raise InvalidInputError(f"repeats must be an integer >= 1; got {repeats!r}")
    if isinstance(methods, str) or not isinstance(methods, Sequence) or not methods:
        raise InvalidInputError(f"methods must be a non-empty list of verifier names; got {methods!r}")
    for m in methods:
        if m not in VERIFIERS:
            raise unknown_name("method", m, list(VERIFIERS))
    drafter_options = dict(drafter_options or {})
    drf_rule = get_drafter(drafter, **drafter_options)  # an unknown name or option: one line, before any work
    if drf_rule.bind(target, draft) != V:  # pragma: no cover - bind checks the target check_pair checked
        raise InvalidInputError(f"drafter {drafter!r} drafts over another vocabulary than the target's {V}")
    ctx = check_token_ids("context_ids", context_ids, V)
    check_prompt_fits(len(ctx), max_context(target, draft), K_max * L_max + 1)
    sampling = sampling if sampling is not None else SamplingConfig()
    tgt, drf = sessions if sessions is not None else (open_session(target), open_session(draft))
    if tgt.length or drf.length:
        raise InvalidInputError("calibrate() needs fresh sessions (nothing processed yet)")
    if not tree_capable(tgt):
        raise InvalidInputError(
            f"the target's session ({type(tgt).__name__}) cannot score a token tree; calibrate() times the"
            " engine's tree pass (HFModel with eager or sdpa attention)")
    dev = tgt.device
    sync = sync_for(dev)
    gen = torch.Generator().manual_seed(int(seed))  # CPU: synthetic trees and tokens
    vgen = torch.Generator(device=dev).manual_seed(int(seed) + 1)  # verifier / draw randomness
    n0 = len(ctx) - 1
    pending = ctx[-1]
    pend_t = torch.tensor([[pending]], dtype=torch.long, device=tgt.device)
    pend_d = torch.tensor([[pending]], dtype=torch.long, device=drf.device)

    probes: list[_Probe] = []
    features = drf_rule.uses_target_features
    if features and not hasattr(tgt, "record_features"):
        raise InvalidInputError(f"drafter {drafter!r} reads the target's hidden states, but the target's session"
                                f" ({type(tgt).__name__}) cannot record them; use an HFModel target")
    with torch.inference_mode():
        if features:
            tgt.record_features = True
        tgt.prefill(ctx[:-1])
        drf.prefill(ctx)
        drf_rule.prefill(ctx)
        if features and n0:
            drf_rule.observe_target(tgt.last_features[0])  # [n0, d]

        # ------------------------------------------------------------ target tree passes and the AR unit
        n_max = K_max * L_max + 1
        for n in measured_node_counts(n_max):
            tree, path = synthetic_tree(pending, n, K_max, L_max, V, gen)
            node_of = tree.node_of.to(dev)

            def t_run(tree=tree, path=path, node_of=node_of) -> None:
                p = sampling.probs(tgt.extend_tree(tree))  # [n, V] float64
                p[node_of]  # [K, L+1, V]: the engine's gather
                tgt.keep_nodes(path)

            probes.append(_Probe(f"target/{n}", t_run, restore=lambda: tgt.crop(n0)))

        for L in range(1, L_max + 1):  # K = 1: the engine's rows pass (mdv.engine.score_drafts, tree=None)
            toks = torch.randint(0, V, (1, L), generator=gen)

            def r_run(toks=toks) -> None:
                score_drafts(tgt, ctx, toks, sampling, None)  # [1, L+1, V]
                tgt.keep(0)

            probes.append(_Probe(f"target_rows/{L}", r_run, restore=lambda: tgt.crop(n0)))

        def ar_run() -> None:
            p = sampling.probs(tgt.extend(pend_t)[:, -1])  # [1, V]
            categorical(p, torch.rand(1, generator=vgen, dtype=torch.float64, device=dev))

        def ar_restore() -> None:
            tgt.crop(n0)
            if features:
                tgt.record_features = True

        def ar_setup() -> None:  # the AR baseline records no features
            if features:
                tgt.record_features = False

        probes.append(_Probe("ar", ar_run, setup=ar_setup, restore=ar_restore))

        # ------------------------------------------------------------ draft
        def d_first() -> None:
            q = sampling.probs(drf.extend(pend_d)[:, -1]).to(dev)  # [1, V]
            categorical(q, torch.rand(1, generator=vgen, dtype=torch.float64, device=dev))

        probes.append(_Probe("draft_first", d_first, setup=lambda: drf.crop(n0)))
        for K in range(1, K_max + 1):
            xK = torch.randint(0, V, (K, 1), generator=gen).to(drf.device)

            def d_step(K=K, xK=xK) -> None:
                q = sampling.probs(drf.extend(xK)[:, -1]).to(dev)  # [K, V]
                categorical(q, torch.rand(K, generator=vgen, dtype=torch.float64, device=dev))

            def d_restore() -> None:
                drf.keep(0)
                drf.crop(n0 + 1)

            probes.append(_Probe(f"draft_step/{K}", d_step, setup=lambda K=K: drf.fork(K), restore=d_restore))

            def d_fork(K=K) -> None:
                drf.fork(K)
                drf.keep(0)

            probes.append(_Probe(f"draft_fork/{K}", d_fork))

        # ------------------------------------------------------------ the drafter's whole call
        for K in range(1, K_max + 1):
            for L in range(1, L_max + 1):
                def p_run(K=K, L=L) -> None:
                    drf_rule.propose(ctx, K, L, sampling, vgen)  # tokens [K, L], q [K, L, V]
                    drf_rule.commit(0, 0)

                probes.append(_Probe(f"propose/{K}/{L}", p_run, restore=lambda: drf_rule.rewind(n0)))

        # ------------------------------------------------------------ verifiers on synthetic blocks of V
        big = synthetic_block(V, K_max, L_max, generator=torch.Generator(device=dev).manual_seed(int(seed) + 2),
                              device=dev)
        current: dict[str, Any] = {}
        for m in methods:
            verifier = VERIFIERS[m]()
            for K in (range(1, K_max + 1) if VERIFIERS[m].multi_draft else [1]):
                for L in range(1, L_max + 1):
                    def v_setup(K=K, L=L, verifier=verifier) -> None:
                        from mdv.verify.base import Block

                        current["block"] = Block(big.tokens[:, :K, :L].contiguous(), big.q[:, :K, :L].contiguous(),
                                                 big.p[:, :K, :L + 1].contiguous())
                        verifier.reset()

                    def v_run(verifier=verifier) -> None:
                        block = current["block"]
                        block.validate(full=False)
                        verifier.step(block, vgen, validate=False).emitted(block)

                    probes.append(_Probe(f"verify/{verify_key(m, K, L)}", v_run, setup=v_setup,
                                         restore=lambda: current.clear()))

        # ------------------------------------------------------------ interleaved rounds
        times: dict[str, list[float]] = {p.key: [] for p in probes}
        rounds = 1 + int(repeats)  # the first is a warm-up
        # every probe starts with the caches the engine leaves it (CacheEvictor): on CPUs, cold
        evict = CacheEvictor() if dev.type == "cpu" else None
        with tqdm(total=rounds * len(probes), desc="calibrate", disable=not progress, leave=False) as bar:
            for r in range(rounds):
                s = r % len(probes)
                for probe in probes[s:] + probes[:s]:
                    if probe.setup is not None:
                        probe.setup()
                    if evict is not None:
                        evict()
                    t = time_call(probe.run, sync)
                    if probe.restore is not None:
                        probe.restore()
                    if r:
                        times[probe.key].append(t)
                    bar.update(1)
                if between_rounds is not None:
                    between_rounds(r, rounds)
        if tgt.length != n0 or tgt.rows != 1 or drf.length != n0 + 1 or drf.rows != 1:  # pragma: no cover
            raise RuntimeError(f"calibrate() left the sessions at ({tgt.length}, {tgt.rows}) / ({drf.length},"
                               f" {drf.rows}) tokens/rows; expected ({n0}, 1) / ({n0 + 1}, 1)")

    med = {k: spread(v)["median"] for k, v in times.items()}
    sub = lambda prefix: {k[len(prefix):]: v for k, v in med.items() if k.startswith(prefix)}  # noqa: E731
    return Calibration(
        machine=machine_fingerprint(dev), models={"target": model_fingerprint(target), "draft": model_fingerprint(draft)},
        target_s={int(k): v for k, v in sub("target/").items()}, draft_first_s=med["draft_first"],
        draft_step_s={int(k): v for k, v in sub("draft_step/").items()}, verify_s=sub("verify/"),
        ar_step_s=med["ar"], draft_fork_s={int(k): max(v, 0.0) for k, v in sub("draft_fork/").items()},
        target_rows_s={int(k): v for k, v in sub("target_rows/").items()}, propose_s=sub("propose/"),
        drafter={"name": drafter, "options": drafter_options},
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        settings={"K_max": K_max, "L_max": L_max, "methods": list(methods), "context_length": len(ctx),
                  "repeats": int(repeats), "warmup_rounds": 1, "node_counts": measured_node_counts(n_max),
                  "sampling": {"temperature": sampling.temperature, "top_k": sampling.top_k, "top_p": sampling.top_p},
                  "interpolation": "linear in n between the measured node counts",
                  "cache_evicted_bytes": evict.nbytes if evict is not None else 0,
                  "wall_seconds": round(time.perf_counter() - t_start, 3)},
        details={k: spread(v) for k, v in times.items()})
