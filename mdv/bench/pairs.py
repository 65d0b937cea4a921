"""The model pairs and prompts the benchmarks run on (the default pair, or the tiny random pair).
"""
from __future__ import annotations

import json
import math
from typing import Any, Optional, Sequence

import torch

from mdv.bench.config import PairKind, TinyPair
from mdv.bench.records import skipped_record


#: Used when :mod:`mdv.data` cannot provide prompts (or ``datasets: []``).
FIXED_PROMPTS = [
    "Write a short story about a robot who learns to paint.",
    "Explain why the sky is blue in three sentences.",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "A farmer has 17 sheep and buys 5 more, then sells 8. How many sheep does he have? Think step by step.",
    "List five tips for writing clear technical documentation.",
    "Translate to French: The weather is lovely today and we are going to the park.",
    "Summarise the plot of Romeo and Juliet in one paragraph.",
    "What are the main differences between TCP and UDP?",
    "Write a haiku about autumn leaves.",
    "Describe how a hash table works to a beginner programmer.",
]


def torch_device(device: Optional[str]) -> torch.device:
    """``device`` as a torch device; None: where mdv puts models (:func:`mdv.models.hf.default_device`)."""
    from mdv.models.hf import default_device

    return torch.device(device) if device else default_device()


def default_target_available() -> tuple[bool, str]:
    """(True, "") when the default target's file is in the asset cache, else (False, why)."""
    from mdv import assets
    from mdv.errors import MissingAssetError
    from mdv.models.default_pair import TARGET_ASSET

    try:
        assets.path(TARGET_ASSET)
    except MissingAssetError as e:
        return False, str(e)
    return True, ""


def load_target_model(device: torch.device, pair: PairKind = PairKind.default, tiny: TinyPair | None = None,
                      dtype: str = "float32"):
    """The target as an :class:`~mdv.models.hf.HFModel` on ``device`` in ``dtype`` (default pair's target,
    or the tiny random one).  Raises MissingAssetError when the default target file is absent."""
    if PairKind(pair) == PairKind.tiny_random:
        return load_pair(device, pair, tiny, dtype)[0]
    from mdv.models.default_pair import load_target
    from mdv.models.hf import HFModel

    model, tok = load_target(torch.float32)
    return HFModel(model.to(device=device, dtype=getattr(torch, dtype)), tok,
                   name="SmolLM2-135M-Instruct (default target)")


def load_pair(device: torch.device, pair: PairKind = PairKind.default, tiny: TinyPair | None = None,
              dtype: str = "float32"):
    """(target, draft, tokenizer): HFModels on ``device`` in ``dtype``.  Raises MissingAssetError when the
    default pair is incomplete."""
    from mdv.models.hf import HFModel

    if PairKind(pair) == PairKind.tiny_random:
        from mdv.models.tiny_random import build_tiny_random_pair

        t = tiny or TinyPair()
        return build_tiny_random_pair(t.vocab_size, t.seed, hidden_size=t.hidden_size, num_layers=t.num_layers,
                                      dtype=dtype, device=str(device))
    from mdv.errors import MissingAssetError
    from mdv.models import default_pair

    ok, reason = default_pair.default_pair_available()
    if not ok:
        raise MissingAssetError(f"the default model pair is unavailable: {reason}")
    t, d, tok = default_pair.load_default_pair(getattr(torch, dtype))
    return (HFModel(t.to(device), tok, name="SmolLM2-135M-Instruct (default target)"),
            HFModel(d.to(device), tok, name=f"{default_pair.draft_description(d)} (default draft)"), tok)


def pair_identity(pair: PairKind) -> dict[str, Any]:
    """What identifies the pair's files: for the default pair, the draft's recorded sha256 and the target asset."""
    if PairKind(pair) != PairKind.default:
        return {"pair": PairKind(pair).value}
    from mdv.models import default_pair

    try:
        cfg = json.loads(default_pair.draft_config_path().read_text())
    except (OSError, ValueError):
        cfg = {}
    return {"pair": "default", "target_asset": default_pair.TARGET_ASSET, "draft": default_pair.DRAFT_NAME,
            "draft_weights_sha256": cfg.get("weights_sha256"), "draft_num_layers": cfg.get("num_hidden_layers"),
            "draft_head_vocab_size": cfg.get("head_vocab_size"),
            "draft_head_vocab_subset_sha256": cfg.get("head_vocab_subset_sha256")}


def pair_available(pair: PairKind) -> tuple[bool, str]:
    """(True, "") when the pair's files are here, else (False, why)."""
    if PairKind(pair) == PairKind.tiny_random:
        return True, ""
    from mdv.models.default_pair import default_pair_available

    return default_pair_available()


def pair_for(name: str, cfg: Any, pair: tuple[Any, Any, Any] | None, tiny: TinyPair | None, device: torch.device,
             dtype: str) -> tuple[Any, Any, Any] | dict[str, Any]:
    """The (target, draft, tokenizer) benchmark ``name`` runs on: ``pair`` when given, else ``cfg.pair``
    loaded on ``device``; the benchmark's skipped record (a dict) when that pair's files are absent."""
    if pair is not None:
        return pair
    ok, why = pair_available(cfg.pair)
    if not ok:
        return skipped_record(name, cfg, f"default pair unavailable: {why}")
    return load_pair(device, cfg.pair, tiny, dtype)


def target_for(name: str, cfg: Any, target: Any, tiny: TinyPair | None, device: torch.device,
               dtype: str) -> Any:
    """The target benchmark ``name`` runs on: ``target`` when given, else ``cfg.pair``'s target loaded on
    ``device``; the benchmark's skipped record (a dict) when the default target's file is absent."""
    if target is not None:
        return target
    if PairKind(cfg.pair) == PairKind.default:
        ok, why = default_target_available()
        if not ok:
            return skipped_record(name, cfg, f"default target unavailable: {why}")
    return load_target_model(device, cfg.pair, tiny, dtype)


def prompt_ids(tokenizer: Any, datasets: Sequence[str], n: int, seed: int = 0) -> tuple[list[list[int]], str]:
    """``n`` prompts as token ids, cycling over ``datasets`` (mdv.data), or the fixed list when none is
    given or mdv.data cannot load one.  -> (ids, a label saying where they came from: each dataset with the
    number of its prompts among the n)."""
    out: list[list[int]] = []
    label = ""
    if datasets:
        try:
            from mdv.data import format_prompt, load_prompts

            per = max(1, math.ceil(n / len(datasets)))
            sets = [load_prompts(name, n=per, seed=seed) for name in datasets]
            origin: list[int] = []  # the dataset of each prompt in out
            longest = max(len(s.prompts) for s in sets)
            for j in range(longest):  # round robin over the datasets
                for k, s in enumerate(sets):
                    if j < len(s.prompts):
                        out.append(format_prompt(s.prompts[j], tokenizer))
                        origin.append(k)
            used = [0] * len(sets)
            for i in range(n if out else 0):  # the n returned below, cycling where fewer were loaded
                used[origin[i % len(out)]] += 1
            label = ", ".join(f"{s.name} ({s.source}, {u})" for s, u in zip(sets, used))
        except Exception as e:  # mdv.data missing, or a dataset unavailable offline
            out, label = [], f"fixed list (mdv.data failed: {type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''})"
    if not out:
        label = label or "fixed list (mdv.bench.FIXED_PROMPTS)"
        for text in FIXED_PROMPTS:
            ids = tokenizer.encode(text) if hasattr(tokenizer, "encode") else tokenizer(text)["input_ids"]
            out.append([int(x) for x in ids])
    texts_ids = [out[i % len(out)] for i in range(n)]  # fewer prompts than asked: cycle
    return texts_ids[:n], label
