"""The toy pairs an audit runs a rule on: :class:`CaseSpec` (a config entry) and :class:`AuditCase`
(the built models).

The default grid (``mdv/conf/audit_cases/default.yaml``) mixes context-dependent pairs (every prefix has
its own Dirichlet law, :func:`~mdv.oracle.toy.random_toy_model`) and context-free ones (the papers'
examples, :func:`~mdv.oracle.toy.iid_toy_model`), some with zero probabilities, V = 2..5, K = 1..4,
L = 1..3.  A user adds pairs by listing more specs, or passes :class:`AuditCase` objects with any
:class:`~mdv.models.base.LanguageModel` pair.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from typing import Optional, Sequence

from omegaconf import OmegaConf

from mdv.errors import InvalidInputError
from mdv.models.base import LanguageModel, check_model
from mdv.oracle.toy import iid_toy_model, random_toy_model

KINDS = ("random", "iid")
#: CaseSpec.key() -> the built case (models are deterministic functions of the spec).
_BUILT: dict[tuple, "AuditCase"] = {}


@dataclass
class CaseSpec:
    """One audit case as configured (Hydra schema of an entry of ``cases``).

    kind "random": target = random_toy_model(V, seed), draft = random_toy_model(V, seed + 1), both with
    ``zero_prob``; kind "iid": the context-free laws ``target`` and ``draft`` (lists of V probabilities).
    ``n_tokens`` (default L + 2): the length of the emitted prefix whose law is tested.
    """

    name: str = ""
    kind: str = "random"
    V: int = 3
    K: int = 1
    L: int = 1
    seed: int = 0
    zero_prob: float = 0.0
    target: Optional[list[float]] = None
    draft: Optional[list[float]] = None
    temperature: float = 1.0
    n_tokens: Optional[int] = None

    def key(self) -> tuple:
        """Every field, hashable: equal specs build the same models (:func:`build` caches on it)."""
        return tuple(tuple(v) if isinstance(v, list) else v for v in vars(self).values())

    def build(self) -> "AuditCase":
        """The case with its models; equal specs return the same objects, so exact reference figures computed
        for one audit (:func:`mdv.audit.audit.references`) serve the next."""
        hit = _BUILT.get(self.key())
        if hit is None:
            hit = _BUILT[self.key()] = self._build()
        return hit

    def _build(self) -> "AuditCase":
        where = f"audit case {self.name or '(unnamed)'}"
        if self.kind not in KINDS:
            raise InvalidInputError(f"{where}: kind must be one of {', '.join(KINDS)}; got {self.kind!r}")
        if self.kind == "random":
            if isinstance(self.V, bool) or not isinstance(self.V, int) or self.V < 2:
                raise InvalidInputError(f"{where}: V must be an integer >= 2; got {self.V!r}")
            target = random_toy_model(self.V, self.seed, zero_prob=self.zero_prob,
                                      name=f"toy(V={self.V}, seed={self.seed}, zero_prob={self.zero_prob})")
            draft = random_toy_model(self.V, self.seed + 1, zero_prob=self.zero_prob,
                                     name=f"toy(V={self.V}, seed={self.seed + 1}, zero_prob={self.zero_prob})")
        else:
            if self.target is None or self.draft is None:
                raise InvalidInputError(f"{where}: kind 'iid' needs the lists target and draft (V probabilities each)")
            if len(self.target) != len(self.draft):
                raise InvalidInputError(f"{where}: target has {len(self.target)} probabilities and draft"
                                        f" {len(self.draft)}; they share one vocabulary")
            target = iid_toy_model(list(self.target), name=f"iid{tuple(self.target)}")
            draft = iid_toy_model(list(self.draft), name=f"iid{tuple(self.draft)}")
        name = self.name or f"{self.kind} V={target.vocab_size} K={self.K} L={self.L}"
        return AuditCase(name, target, draft, self.K, self.L, self.n_tokens, self.temperature)


@dataclass
class AuditCase:
    """One model pair and one (K, L) to audit a rule on; ``n_tokens`` defaults to L + 2."""

    name: str
    target: LanguageModel
    draft: LanguageModel
    K: int
    L: int
    n_tokens: Optional[int] = None
    temperature: float = 1.0
    prompt: Sequence[int] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        where = f"audit case {self.name!r}"
        for attr in ("K", "L"):
            value = getattr(self, attr)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidInputError(f"{where}: {attr} must be an integer >= 1; got {value!r}")
        if self.n_tokens is None:
            self.n_tokens = self.L + 2
        if isinstance(self.n_tokens, bool) or not isinstance(self.n_tokens, int) or self.n_tokens < self.L + 2:
            raise InvalidInputError(
                f"{where}: n_tokens must be an integer >= L + 2 = {self.L + 2} (so that the test sees tokens of at least"
                f" two iterations); got {self.n_tokens!r}")
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)) or not self.temperature > 0:
            raise InvalidInputError(f"{where}: temperature must be > 0 (the audit samples); got {self.temperature!r}")
        V, Vd = check_model("target", self.target), check_model("draft", self.draft)
        if V != Vd:
            raise InvalidInputError(f"{where}: target and draft must share one vocabulary; got V={V} and {Vd}")

    @property
    def V(self) -> int:
        return int(self.target.vocab_size)


def load_specs(name: str = "default") -> list[CaseSpec]:
    """The case grid ``mdv/conf/audit_cases/<name>.yaml`` as typed specs."""
    path = resources.files("mdv.conf").joinpath("audit_cases", f"{name}.yaml")
    if not path.is_file():
        options = sorted(p.name[:-5] for p in resources.files("mdv.conf").joinpath("audit_cases").iterdir()
                         if p.name.endswith(".yaml"))
        raise InvalidInputError(f"unknown audit case grid {name!r}; the shipped grids are: {', '.join(options)}")
    raw = OmegaConf.to_container(OmegaConf.load(str(path)), resolve=True)
    return specs_from(raw.get("cases", []) if isinstance(raw, dict) else raw)


def specs_from(entries: Sequence[object]) -> list[CaseSpec]:
    """Typed specs from a list of mappings (a config's ``cases``), checked against :class:`CaseSpec`."""
    schema = OmegaConf.structured(CaseSpec)
    out = []
    for entry in entries:
        if isinstance(entry, CaseSpec):
            out.append(entry)
            continue
        try:
            out.append(OmegaConf.to_object(OmegaConf.merge(schema, entry)))
        except Exception as err:
            raise InvalidInputError(f"audit case {entry!r} does not fit the case schema (mdv.audit.cases.CaseSpec):"
                                    f" {' '.join(str(err).split())[:300]}") from err
    return out


def resolve_cases(cases: str | Sequence[object]) -> list[AuditCase]:
    """``"default"`` (or another shipped grid's name), or a list of :class:`AuditCase` / :class:`CaseSpec` /
    mappings -> built cases."""
    if isinstance(cases, str):
        specs: list[object] = list(load_specs(cases))
    else:
        specs = list(cases)
    if not specs:
        raise InvalidInputError("the audit needs at least one case; got an empty list")
    built = []
    for entry in specs:
        if isinstance(entry, AuditCase):
            built.append(entry)
        elif isinstance(entry, CaseSpec):
            built.append(entry.build())
        else:
            built.append(specs_from([entry])[0].build())
    names = [c.name for c in built]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise InvalidInputError(f"audit case names must be unique; repeated: {', '.join(dup)}")
    return built
