"""The tiny random model pair of tests, CI and ``models.kind=tiny_random``: a random Llama target, a draft
that is the target plus Gaussian noise, and :class:`TinyTokenizer`, a byte tokenizer with no learned
merges.  Deterministic from a seed; built in memory in well under a second, no files needed.
"""
from __future__ import annotations

import copy
import string
from typing import Any, Iterable, Sequence

from mdv.errors import InvalidInputError


class TinyTokenizer:
    """A trivial tokenizer-like object for the tiny random pair: bytes -> ids, no learned merges.

    ids 0/1/2 are pad/BOS/EOS; every byte b of the UTF-8 text maps to ``3 + b % (vocab_size - 3)``.
    ``decode`` shows id i >= 3 as a printable character (the mapping is not invertible: the tiny model
    is random, so its "text" carries no meaning anyway).  Offers ``encode``, ``__call__``, ``decode``
    and ``apply_chat_template`` (``role: content`` lines), with ``chat_template = None``.
    """

    pad_token_id = 0
    bos_token_id = 1
    eos_token_id = 2
    chat_template = None
    name_or_path = "mdv-tiny-random"
    _ALPHABET = string.ascii_letters + string.digits + string.punctuation + " "

    def __init__(self, vocab_size: int = 64):
        if vocab_size < 4:
            raise InvalidInputError(f"TinyTokenizer needs vocab_size >= 4; got {vocab_size}")
        self.vocab_size = vocab_size

    def __len__(self) -> int:
        return self.vocab_size

    def encode(self, text: str, add_special_tokens: bool = True, **_: Any) -> list[int]:
        ids = [3 + b % (self.vocab_size - 3) for b in str(text).encode("utf-8")]
        return ([self.bos_token_id] if add_special_tokens else []) + ids

    def __call__(self, text: str, add_special_tokens: bool = True, **_: Any) -> dict[str, list[int]]:
        return {"input_ids": self.encode(text, add_special_tokens=add_special_tokens)}

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True, **_: Any) -> str:
        out = []
        for i in ids:
            i = int(i)
            if i < 3:
                if not skip_special_tokens:
                    out.append(("<pad>", "<s>", "</s>")[i])
                continue
            out.append(self._ALPHABET[(i - 3) % len(self._ALPHABET)])
        return "".join(out)

    def apply_chat_template(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True,
                            tokenize: bool = True, **_: Any) -> Any:
        text = "".join(f"{m['role']}: {m['content']}\n" for m in messages)
        if add_generation_prompt:
            text += "assistant: "
        return self.encode(text) if tokenize else text


def build_tiny_random_pair(vocab_size: int = 64, seed: int = 0, *, hidden_size: int = 32, num_layers: int = 2,
                           logit_scale: float = 30.0, draft_noise: float = 0.3, context: int = 4096,
                           dtype: str = "float32", device: str = "cpu") -> tuple[Any, Any, TinyTokenizer]:
    """A tiny random Llama target and a draft = target + Gaussian noise (``draft_noise`` x each tensor's
    std), deterministic from ``seed``; the output head is scaled by ``logit_scale`` so next-token laws
    are peaked (drafts are accepted often, not always).  -> (target HFModel, draft HFModel, tokenizer)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from mdv.models.hf import HFModel

    tok = TinyTokenizer(vocab_size)
    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                      num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=context, tie_word_embeddings=False,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        target = LlamaForCausalLM(cfg).to(getattr(torch, dtype)).eval()
    with torch.no_grad():
        target.lm_head.weight.mul_(logit_scale)
    draft = copy.deepcopy(target)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in draft.parameters():
            if p.numel() > 1:
                noise = torch.randn(p.shape, generator=gen, dtype=torch.float32).to(p.dtype)
                p.add_(draft_noise * p.std() * noise)
    target, draft = target.to(device), draft.to(device)
    name = f"tiny-random-llama(V={vocab_size},d={hidden_size},layers={num_layers},seed={seed})"
    return (HFModel(target, tok, name=f"{name} target"),
            HFModel(draft, tok, name=f"{name} draft (target + noise {draft_noise:g})"), tok)


__all__ = ["TinyTokenizer", "build_tiny_random_pair"]
