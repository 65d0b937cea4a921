"""Hub loaders: the real datasets through ``datasets.load_dataset``, for users who have the hub.

None of these is ever called while ``HF_HUB_OFFLINE`` or ``HF_DATASETS_OFFLINE`` is set (see
:func:`hub_offline`); :func:`mdv.data.load_prompts` checks that before it imports ``datasets``.
Ids follow the same scheme as the offline readers where the data overlap (``gsm8k-test/<index>``,
``HumanEval/<n>``), so results from either source can be joined on prompt id.
"""
from __future__ import annotations

import os
import sys
from typing import Any

from mdv.assets import MGSM_LANGS
from mdv.data.sources import MGSM_HUB_CONFIGS, final_answer
from mdv.data.types import Prompt

_TRUE = {"1", "true", "yes", "on"}


def hub_offline() -> bool:
    """True when the Hugging Face hub must not be contacted: ``HF_HUB_OFFLINE`` or
    ``HF_DATASETS_OFFLINE`` is set to a true value (read now, not at import), or an already imported
    ``huggingface_hub`` says so."""
    if any(os.environ.get(v, "").strip().lower() in _TRUE for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")):
        return True
    constants = sys.modules.get("huggingface_hub.constants")
    return bool(getattr(constants, "HF_HUB_OFFLINE", False))


def _load(path: str, config: str | None, split: str) -> Any:
    import datasets  # imported lazily: pyarrow and friends take a second

    return datasets.load_dataset(path, config, split=split)


def gsm8k() -> list[Prompt]:
    """``openai/gsm8k`` (config ``main``), test split: 1319 problems; id ``gsm8k-test/<index>``."""
    ds = _load("openai/gsm8k", "main", "test")
    return [Prompt(f"gsm8k-test/{i}", r["question"].strip(), "math",
                   {"answer": final_answer(r["answer"]), "solution": r["answer"], "lang": "eng",
                    "gsm8k_test_index": i})
            for i, r in enumerate(ds)]


def humaneval() -> list[Prompt]:
    """``openai_humaneval``, test split: 164 problems; id = ``task_id``."""
    ds = _load("openai_humaneval", None, "test")
    return [Prompt(r["task_id"], r["prompt"], "code", {"entry_point": r["entry_point"]}) for r in ds]


def mgsm() -> list[Prompt]:
    """``juletxara/mgsm``, test split, the ten non-English languages (250 problems each, 2500 in
    all); problem-major order (problem 0 in every language, then problem 1, ...); id
    ``mgsm/<lang>/<index>`` with the ISO 639-3 language code."""
    per_lang = {lang: list(_load("juletxara/mgsm", MGSM_HUB_CONFIGS[lang], "test")) for lang in MGSM_LANGS}
    n = max(len(v) for v in per_lang.values())
    out = []
    for i in range(n):
        for lang in MGSM_LANGS:
            if i < len(per_lang[lang]):
                r = per_lang[lang][i]
                out.append(Prompt(f"mgsm/{lang}/{i}", str(r["question"]).strip(), "math",
                                  {"answer": str(r.get("answer_number", "")), "lang": lang}))
    return out


def lm1b() -> list[Prompt]:
    """``lm1b``, test split (the held-out sentences of the One Billion Word benchmark; a large
    download); id ``lm1b-test/<index>``."""
    ds = _load("lm1b", None, "test")
    return [Prompt(f"lm1b-test/{i}", r["text"].strip(), "text") for i, r in enumerate(ds)]


def alpaca() -> list[Prompt]:
    """``tatsu-lab/alpaca``, train split (its only split, 52,002 records); text = the instruction,
    followed by the ``input`` after a blank line when there is one; id ``alpaca/<index>``."""
    ds = _load("tatsu-lab/alpaca", None, "train")
    out = []
    for i, r in enumerate(ds):
        text = r["instruction"].strip()
        if (r.get("input") or "").strip():
            text += "\n\n" + r["input"].strip()
        out.append(Prompt(f"alpaca/{i}", text, "chat"))
    return out
