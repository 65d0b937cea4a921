"""Prompt formatting: the one place where a :class:`~mdv.data.types.Prompt` becomes token ids.

Rules (by ``prompt.kind``; the datasets map to kinds as gsm8k/mgsm -> ``math``, humaneval ->
``code``, alpaca -> ``chat``, lm1b -> ``text``):

* **Chat template** -- used when the tokenizer has one (``tokenizer.chat_template``; instruct
  models) and the kind is not ``text``.  One user turn holds the short per-kind instruction
  (:data:`INSTRUCTIONS`) and the prompt, then the template's generation prompt (the assistant
  header) is appended.  The rendered string is encoded with ``add_special_tokens=False``: the
  template already places its own special tokens.
* **Plain text** -- tokenizers without a chat template (base models) get the plain scaffold of
  :data:`PLAIN` (``Question: ... Answer:`` for math, the bare HumanEval prompt to complete for
  code, an Alpaca-style ``### Instruction / ### Response`` block for chat), encoded with the
  tokenizer's default special tokens (e.g. a BOS token where the tokenizer adds one).
* **text** (LM1B and its stand-in) -- always the raw text, never a template or instruction: the
  model continues the sentence.

MGSM prompts get the same English instruction as GSM8K (the problem stays in its language).
"""
from __future__ import annotations

from typing import Any

from mdv.data.types import KINDS, Prompt
from mdv.errors import InvalidInputError

#: The instruction put before the prompt in the user turn of a chat template (None: the prompt alone).
INSTRUCTIONS: dict[str, str | None] = {
    "math": "Solve the following math problem step by step. Give the final answer after '####'.",
    "code": "Complete the following Python function. Reply with the complete function in one ```python code block.",
    "chat": None,  # the instruction is the prompt
    "text": None,  # never templated
}

#: Plain-text scaffolds for tokenizers without a chat template (``{text}`` is the prompt).
PLAIN: dict[str, str] = {
    "math": "Question: {text}\nAnswer:",
    "code": "{text}",
    "chat": "### Instruction:\n{text}\n\n### Response:\n",
    "text": "{text}",
}


def has_chat_template(tokenizer: Any) -> bool:
    """True when ``tokenizer`` carries a chat template (and can apply it)."""
    return bool(getattr(tokenizer, "chat_template", None)) and hasattr(tokenizer, "apply_chat_template")


def _check(prompt: Prompt) -> None:
    if not isinstance(prompt, Prompt):
        raise InvalidInputError(f"prompt must be an mdv.data.Prompt; got {type(prompt).__name__}")
    if prompt.kind not in KINDS:
        raise InvalidInputError(f"prompt {prompt.id!r} has unknown kind {prompt.kind!r}; valid kinds: {', '.join(KINDS)}")


def user_message(prompt: Prompt) -> str:
    """The content of the user turn for a chat template: instruction, blank line, prompt (code is
    shown in a ``python`` fence)."""
    _check(prompt)
    body = f"```python\n{prompt.text.rstrip()}\n```" if prompt.kind == "code" else prompt.text
    instr = INSTRUCTIONS[prompt.kind]
    return f"{instr}\n\n{body}" if instr else body


def render_prompt(prompt: Prompt, tokenizer: Any = None) -> tuple[str, bool]:
    """The prompt as the string that is encoded, and whether it came from a chat template.

    ``tokenizer=None`` renders the plain form.
    """
    _check(prompt)
    if prompt.kind != "text" and tokenizer is not None and has_chat_template(tokenizer):
        s = tokenizer.apply_chat_template([{"role": "user", "content": user_message(prompt)}],
                                          tokenize=False, add_generation_prompt=True)
        if not isinstance(s, str):
            raise InvalidInputError(f"{type(tokenizer).__name__}.apply_chat_template(tokenize=False) returned "
                                    f"{type(s).__name__}, not a string")
        return s, True
    return PLAIN[prompt.kind].format(text=prompt.text), False


def format_prompt(prompt: Prompt, tokenizer: Any) -> list[int]:
    """Token ids of ``prompt`` for ``tokenizer`` (a transformers tokenizer), by the rules above."""
    if tokenizer is None or not hasattr(tokenizer, "encode"):
        raise InvalidInputError(f"format_prompt needs a tokenizer with .encode(); got {type(tokenizer).__name__}")
    text, chat = render_prompt(prompt, tokenizer)
    ids = tokenizer.encode(text, add_special_tokens=False) if chat else tokenizer.encode(text)
    return [int(i) for i in ids]
