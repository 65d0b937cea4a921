"""A sweep's prompts: the dataset loaders, and prompt token ids checked against the pair before any cell runs.
"""
from __future__ import annotations

import importlib
from typing import Any, Callable, Sequence

from mdv.errors import InvalidInputError, MdvError, MissingAssetError
from mdv.sweep.grid import Cell
from mdv.sweep.model_sets import LoadedModels


def import_callable(spec: str, what: str) -> Callable[..., Any]:
    """``"package.module:function"`` -> the function; a clear error when it does not resolve."""
    mod_name, _, attr = spec.partition(":")
    if not mod_name or not attr:
        raise InvalidInputError(f"{what} must look like 'package.module:function'; got {spec!r}")
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as e:
        raise InvalidInputError(f"{what} {spec!r}: cannot import {mod_name!r} ({e})") from None
    fn = getattr(mod, attr, None)
    if not callable(fn):
        raise InvalidInputError(f"{what} {spec!r}: {mod_name} has no function {attr!r}")
    return fn


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def load_prompt_set(loader: Callable[..., Any], name: str, n: int, source: str) -> Any:
    """``loader(name, n, source=source)``; any non-mdv failure becomes a one-line
    :class:`~mdv.errors.MissingAssetError` naming the dataset."""
    try:
        ps = loader(name, n, source=source)
    except MdvError:
        raise
    except Exception as e:  # e.g. the hub is unreachable offline
        raise MissingAssetError(
            f"dataset {name!r} (source={source}) is unavailable: {type(e).__name__}: {_first_line(e)};"
            " fetch its offline source (`python -m mdv.assets fetch`) or choose dataset.source=auto") from None
    for attr in ("name", "label", "source", "size", "prompts"):
        if not hasattr(ps, attr):
            raise InvalidInputError(f"the dataset loader returned {type(ps).__name__} without {attr!r}")
    if len(ps.prompts) == 0:
        raise MissingAssetError(f"dataset {name!r} (source={source}) has no prompts")
    return ps


def prompt_id(prompt: Any, dataset: str, index: int) -> str:
    """A prompt's own id (``id`` / ``prompt_id`` / ``task_id``), else ``<dataset>/<index>``."""
    for attr in ("id", "prompt_id", "task_id"):
        v = prompt.get(attr) if isinstance(prompt, dict) else getattr(prompt, attr, None)
        if v is not None:
            return str(v)
    return f"{dataset}/{index}"


def format_prompts(pending: Sequence[Cell], prompt_sets: dict[str, Any], models: LoadedModels,
                   formatter: Callable[..., Any]) -> dict[str, list[list[int]]]:
    """Token ids of every prompt the ``pending`` cells need, by dataset, checked before any cell runs:
    the pair must share a vocabulary (when a speculative method is pending), and every prompt must
    format to valid ids that leave room in the model context for one block of the largest L.  A bad
    prompt or pair is bad input (one :class:`~mdv.errors.InvalidInputError` naming the dataset and
    prompt), not a failed cell: rerunning could not fix it."""
    from mdv.drafters.model import check_pair

    if any(c.method != "ar" for c in pending):
        check_pair(models.target, models.draft)
    formatted: dict[str, list[list[int]]] = {}
    for name, ps in prompt_sets.items():
        todo = [c for c in pending if c.dataset == name]
        n = max(c.n_prompts for c in todo)
        L_max = max((c.L or 1 for c in todo if c.method != "ar"), default=None)
        formatted[name] = format_dataset_prompts(name, ps, n, models, formatter, L_max)
    return formatted


def format_dataset_prompts(name: str, prompt_set: Any, n: int, models: LoadedModels, formatter: Callable[..., Any],
                           L_max: int | None) -> list[list[int]]:
    """Token ids of the first ``n`` prompts of ``prompt_set``, each checked to be valid ids that leave room
    in the model context for one block of ``L_max`` tokens (None: autoregressive only); a bad prompt is one
    :class:`~mdv.errors.InvalidInputError` naming the dataset and prompt."""
    from mdv.engine import check_prompt_fits, max_context
    from mdv.models.base import check_token_ids

    ctx = max_context(models.target, models.draft if L_max is not None else None)
    out: list[list[int]] = []
    for i, prompt in enumerate(prompt_set.prompts[:n]):
        where = f"dataset {name!r}, prompt {prompt_id(prompt, name, i)!r}"
        try:
            raw = formatter(prompt, models.tokenizer)
        except MdvError as e:
            raise InvalidInputError(f"{where}: {e}") from None
        except Exception as e:
            raise InvalidInputError(f"{where}: the prompt formatter failed ({type(e).__name__}: {e});"
                                    " check dataset.formatter and the models' tokenizer") from None
        try:
            ids = check_token_ids("prompt_ids", list(raw), models.target.vocab_size)
            check_prompt_fits(len(ids), ctx, L_max)
        except InvalidInputError as e:
            raise InvalidInputError(f"{where}: {e}") from None
        out.append(ids)
    return out
