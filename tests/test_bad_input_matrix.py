"""Bad input, end to end (issue 6): every user-facing entry point x every kind of bad input.

Two tables:

* ``API_CASES`` -- the Python API (``mdv.generate``, ``mdv.get_verifier``, ``SamplingConfig``, the oracle,
  ``HFModel.from_pretrained``, the default pair, ``mdv.data.load_prompts``, the analysis loader).  Each
  row must raise exactly the typed error it names (a subclass of :class:`mdv.errors.MdvError`; for a
  corrupt cell file the analysis' ``CellFileError``, which it turns into one warning line) with a
  one-line message that names the bad value and says how to fix it.
* ``CLI_CASES`` -- the commands (``python -m experiments.run | experiments.theory | experiments.bench |
  experiments.train_draft``, ``python -m analysis.report``).  Each must exit with status 2 and exactly one
  ``error:`` line matching the row's pattern, no traceback, and no result file.  Every row runs in its own process, all at once:
  forked from one runner that imported torch, mdv and Hydra once (:func:`_fork_runner`; ~25 s instead of
  ~2 min for ~30 plain ``python -m`` runs on 2 cores), and two rows also as plain subprocesses, which
  must give the same exit status and stderr.

Sweep runs use the tiny random pair (``models=tiny_random``) or tiny model folders written here, and a
stub prompt loader (this module's :func:`stub_prompts`), so nothing needs the asset cache; corrupt model
files are garbage written to tmp folders.  Moved here: the engine's bad-input table (was
``tests/test_engine.py``), the verifier / oracle name, size, vocabulary and sampling rows (was
``tests/test_bad_input.py``), the missing-path rows of ``HFModel.from_pretrained`` (was
``tests/test_hf_model.py``) and the command-line bad-input cases of ``tests/test_configs.py``.
Elsewhere: value checks of the sweep grid in-process (``tests/test_sweep.py``), the data module's
errors on a fixture cache (``tests/test_data.py``), the asset cache (``tests/test_default_pair.py``),
an absent or empty results folder and skipped files in the analysis (``tests/test_analysis.py``).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import pytest
import torch

import mdv
from mdv.errors import InvalidInputError, MdvError, MissingAssetError, UnknownNameError
from mdv.models import CallableLM, HFModel, SamplingConfig
from mdv.oracle import (exact_law, expected_accepted, iteration_law, lp_optimum, membership_ot, random_toy_model,
                        target_law, total_variation)
from mdv.models.tiny_random import build_tiny_random_pair
from tests.test_analysis import HE, write_cell

REPO = Path(__file__).resolve().parent.parent
ME = "tests.test_bad_input_matrix"
ALL_VERIFIERS = "bv, gbv, mdbv, mpbv, sd, select_gbv, spectr, spectr_gbv"
PROMPT = [1, 5, 7]


def options(group: str) -> str:
    """The options of a config group, as the error line lists them."""
    return ", ".join(sorted(p.stem for p in (REPO / "mdv" / "conf" / group).glob("*.yaml")))
CONTEXT = 32  # the tiny pair's context: a 40-token prompt does not fit


# --------------------------------------------------------------------------------------- stubs for the CLI
def stub_prompts(name: str, n: int, source: str = "auto") -> Any:
    """A ``dataset.loader`` for sweeps: ``n`` short prompts, no asset cache needed."""
    from mdv.data import Prompt, PromptSet

    prompts = [Prompt(f"{name}/{i}", f"prompt {i}", "text") for i in range(n)]
    return PromptSet(name=f"{name}-stub", label=f"{name}-stub (test prompts)", source="stand-in", size=n,
                     prompts=prompts, requested=name, total=n, selection="all")


def stub_format(prompt: Any, tokenizer: Any) -> list[int]:
    """A ``dataset.formatter``: four ids valid in every tiny vocabulary (>= 48)."""
    return [1, 5, 7, 9]


def long_format(prompt: Any, tokenizer: Any) -> list[int]:
    """A ``dataset.formatter`` whose prompts (40 ids) overflow a 16-token context."""
    return [1] + [5] * 39


# --------------------------------------------------------------------------------------- fixtures
class _Vocab:
    """A tokenizer stand-in that only answers ``get_vocab`` (what ``HFModel.same_vocabulary`` compares)."""

    eos_token_id = None

    def __init__(self, vocab: dict[str, int]):
        self._vocab = vocab

    def get_vocab(self) -> dict[str, int]:
        return dict(self._vocab)


def _tiny_llama(vocab_size: int, context: int = 64, model_type: str | None = None):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=context)
    return LlamaForCausalLM(cfg)


def _save(model, folder: Path) -> Path:
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def api(tmp_path_factory) -> SimpleNamespace:
    """Models and files the API rows need: the tiny random pair (context 32), a draft of another
    vocabulary, same-size models with different tokenizers, toy models, and corrupt model files."""
    tmp = tmp_path_factory.mktemp("api")
    target, draft, _ = build_tiny_random_pair(64, 0, context=CONTEXT)
    other = build_tiny_random_pair(48, 1)[1]
    toy_t, toy_d = random_toy_model(3, 1), random_toy_model(3, 2)
    (tmp / "garbage.gguf").write_bytes(b"GGUF" + bytes(range(256)) * 4)
    (tmp / "empty.gguf").write_bytes(b"")
    (tmp / "text.gguf").write_text("this is a text file, not a GGUF model\n")
    good = _save(_tiny_llama(16), tmp / "good")
    weights = (good / "model.safetensors").read_bytes()
    truncated = shutil.copytree(good, tmp / "truncated")
    (truncated / "model.safetensors").write_bytes(weights[: len(weights) // 2])
    garbage = shutil.copytree(good, tmp / "garbage")
    (garbage / "model.safetensors").write_bytes(b"\x00\x01garbage" * 64)
    alien = shutil.copytree(good, tmp / "alien")
    cfg = json.loads((alien / "config.json").read_text())
    (alien / "config.json").write_text(json.dumps({**cfg, "model_type": "no_such_architecture"}))
    (tmp / "no_config").mkdir()
    # caches: empty, and one whose default target file is garbage of the wrong size
    (tmp / "empty_cache").mkdir()
    bad = tmp / "bad_cache" / "smollm2-135m-instruct" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    bad.parent.mkdir(parents=True)
    bad.write_bytes(b"GGUF" + b"\x00" * 4096)
    he = tmp / "bad_cache" / "humaneval" / "HumanEval.jsonl.gz"
    he.parent.mkdir(parents=True)
    he.write_bytes(b"not gzip")
    # copies of the shipped draft: one with a corrupt config, one with corrupt weights
    from mdv.models import default_pair as dp

    for name in ("draft_bad_json", "draft_bad_weights"):
        (tmp / name).mkdir()
        shutil.copy(dp.draft_config_path(), tmp / name)
        shutil.copy(dp.draft_weights_path(), tmp / name)
    dp.draft_config_path(data_dir=tmp / "draft_bad_json").write_text('{"format": 1, "name": ')
    dp.draft_weights_path(data_dir=tmp / "draft_bad_weights").write_bytes(b"\x00" * 1024)
    return SimpleNamespace(
        tmp=tmp, target=target, draft=draft, other=other, toy_t=toy_t, toy_d=toy_d,
        tok_a=HFModel(target.model, _Vocab({"a": 0, "b": 1})), tok_b=HFModel(draft.model, _Vocab({"a": 1, "b": 0})))


def gen(a: SimpleNamespace, **kw: Any) -> Any:
    """``mdv.generate`` on the tiny pair with good defaults, ``kw`` overriding one argument."""
    args = {"target": a.target, "draft": a.draft, "prompt_ids": PROMPT, "method": "mdbv", "K": 2, "L": 3,
            "max_new_tokens": 4}
    return mdv.generate(**{**args, **kw})


def with_cache(mp: pytest.MonkeyPatch, folder: Path) -> None:
    mp.setenv("MDV_CACHE", str(folder))


def _default_pair(a, mp, cache: str):
    from mdv.models.default_pair import load_default_pair

    with_cache(mp, a.tmp / cache)
    return load_default_pair()


def _load_draft(a, folder: str):
    from mdv.models.default_pair import load_draft

    return load_draft(None, data_dir=a.tmp / folder)


def _load_prompts(a, mp, *args: Any, cache: str | None = None, **kw: Any):
    from mdv.data import load_prompts

    mp.setenv("HF_HUB_OFFLINE", "1")  # the hub is never touched: "auto" means the offline source
    mp.setenv("HF_DATASETS_OFFLINE", "1")
    if cache is not None:
        with_cache(mp, a.tmp / cache)
    return load_prompts(*args, **kw)


def _load_cell(a, mutate: Callable[[dict], Any]):
    """``mdv.analysis.load_cell`` on a good sd cell file changed by ``mutate``."""
    from mdv.analysis import load_cell

    folder = a.tmp / "cells" / mutate.__name__
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{write_cell(folder, 'sd', HE, 1, 4, 0.4, [2.0, 2.2, 1.8])}.json"
    data = json.loads(path.read_text())
    mutate(data)
    path.write_text(json.dumps(data))
    return load_cell(path)


def _stat(key: str, value: Any) -> Callable[[dict], None]:
    def mutate(d: dict) -> None:
        d["generations"][0]["stats"][key] = value

    mutate.__name__ = f"stat_{key}_{abs(hash(repr(value)))}"
    return mutate


def _config(key: str, value: Any) -> Callable[[dict], None]:
    def mutate(d: dict) -> None:
        d["config"][key] = value

    mutate.__name__ = f"config_{key}_{abs(hash(repr(value)))}"
    return mutate


def _duplicate_index(d: dict) -> None:
    d["generations"][1]["prompt_index"] = 0


def _analysis_out_is_a_file(a, mp):
    from mdv.analysis import analyze

    root = a.tmp / "analysis_out"
    (root / "cells").mkdir(parents=True, exist_ok=True)
    write_cell(root / "cells", "ar", HE, 1, 4, 0.4, [1.0] * 3)
    (root / "taken").write_text("a file where the output folder should go")
    return analyze(root, root / "taken", warn=lambda line: None)


def _analysis_only_corrupt(a, mp):
    from mdv.analysis import load_results

    root = a.tmp / "analysis_corrupt"
    (root / "cells").mkdir(parents=True, exist_ok=True)
    (root / "cells" / "cut.json").write_text('{"schema": "mdv.cell/1", "cell_id": ')
    return load_results(root, warn=lambda line: None)


# --------------------------------------------------------------------------------------- the API table
@dataclass(frozen=True)
class ApiCase:
    id: str
    call: Callable[[SimpleNamespace, pytest.MonkeyPatch], Any]
    error: type[MdvError] | None  # None: the analysis' CellFileError / AnalysisError (see _expected_error)
    match: str  # regex the one-line message must contain: the bad value and the fix


def case(id: str, call: Callable, error: type[MdvError] | None, match: str) -> ApiCase:
    return ApiCase(id, call, error, match)


IIE, UNE, MAE = InvalidInputError, UnknownNameError, MissingAssetError
_T = r"temperature must be a finite number >= 0 \(0 = greedy\); got "
_TOP_P = r"top_p must lie in \(0, 1\][^;]*; got "
_TOP_K = r"top_k must be None or an integer >= 0 \(0 = off\); got "

API_CASES: list[ApiCase] = [
    # ---- mdv.generate: every argument
    case("generate/unknown-method", lambda a, mp: gen(a, method="medusa"), UNE,
         r"unknown method 'medusa'; valid methods are: ar, " + ALL_VERIFIERS),
    case("generate/K=0", lambda a, mp: gen(a, K=0), IIE, r"K must be an integer >= 1; got 0"),
    case("generate/K<0", lambda a, mp: gen(a, K=-2), IIE, r"K must be an integer >= 1; got -2"),
    case("generate/L=0", lambda a, mp: gen(a, L=0), IIE, r"L must be an integer >= 1; got 0"),
    case("generate/L<0", lambda a, mp: gen(a, L=-1), IIE, r"L must be an integer >= 1; got -1"),
    case("generate/L-float", lambda a, mp: gen(a, L=2.5), IIE, r"L must be an integer >= 1; got 2.5"),
    case("generate/T<0", lambda a, mp: gen(a, temperature=-0.5), IIE, _T + r"-0.5"),
    case("generate/T-nan", lambda a, mp: gen(a, temperature=float("nan")), IIE, _T + r"nan"),
    case("generate/T-bool", lambda a, mp: gen(a, temperature=True), IIE, _T + r"True"),
    case("generate/top_p=0", lambda a, mp: gen(a, top_p=0.0), IIE, _TOP_P + r"0.0"),
    case("generate/top_p>1", lambda a, mp: gen(a, top_p=1.5), IIE, _TOP_P + r"1.5"),
    case("generate/top_p-bool", lambda a, mp: gen(a, top_p=True), IIE, _TOP_P + r"True"),
    case("generate/top_k<0", lambda a, mp: gen(a, top_k=-1), IIE, _TOP_K + r"-1"),
    case("generate/top_k-bool", lambda a, mp: gen(a, top_k=True), IIE, _TOP_K + r"True"),
    case("generate/max_new_tokens=0", lambda a, mp: gen(a, max_new_tokens=0), IIE,
         r"max_new_tokens must be an integer >= 1; got 0"),
    case("generate/seed-str", lambda a, mp: gen(a, seed="x"), IIE, r"seed must be an integer; got 'x'"),
    case("generate/unknown-target-pass", lambda a, mp: gen(a, target_pass="dag"), IIE,
         r"target_pass must be 'auto', 'tree' or 'rows'; got 'dag'"),
    case("generate/tree-pass-unsupported",
         lambda a, mp: (mp.setattr(a.target.model.config, "_attn_implementation", "flash_attention_2"),
                        gen(a, target_pass="tree")), IIE,
         r"target_pass='tree' asked for, but the target's session \(HFSession\) cannot score a token tree"
         r" .*; use target_pass='rows' or 'auto'"),
    case("generate/eos-float", lambda a, mp: gen(a, eos_token_id=1.5), IIE,
         r"eos_token_id must be None .*\(\[\] to never stop early\); got 1.5"),
    case("generate/prompt-longer-than-context", lambda a, mp: gen(a, prompt_ids=[1] * 40), IIE,
         rf"prompt_ids has 40 tokens but the model context is {CONTEXT} tokens; shorten the prompt"),
    case("generate/prompt-plus-block-over-context", lambda a, mp: gen(a, prompt_ids=[1] * 30, L=3), IIE,
         rf"prompt_ids has 30 tokens and one block of L=3 draft tokens needs 33 positions, above the model"
         rf" context of {CONTEXT} tokens; shorten the prompt or lower L"),
    case("generate/ar-prompt-longer-than-context", lambda a, mp: gen(a, method="ar", prompt_ids=[1] * CONTEXT), IIE,
         rf"prompt_ids has {CONTEXT} tokens but the model context is {CONTEXT} tokens"),
    case("generate/empty-prompt", lambda a, mp: gen(a, prompt_ids=[]), IIE,
         r"prompt_ids is empty: .* \(e.g. the tokenizer's BOS token\)"),
    case("generate/empty-tensor-prompt", lambda a, mp: gen(a, prompt_ids=torch.tensor([], dtype=torch.long)), IIE,
         r"prompt_ids is empty"),
    case("generate/text-prompt", lambda a, mp: gen(a, prompt_ids="hello"), IIE,
         r"prompt_ids must be a sequence of token ids \(encode text with the tokenizer first\); got str"),
    case("generate/prompt-out-of-vocab", lambda a, mp: gen(a, prompt_ids=[1, 99]), IIE,
         r"prompt_ids must lie in \[0, vocab_size=64\); got values in \[1, 99\]"),
    case("generate/float-prompt", lambda a, mp: gen(a, prompt_ids=torch.tensor([1.0, 2.0])), IIE,
         r"prompt_ids must be a 1-D sequence of integer token ids; got an array of shape \(2,\) and dtype torch.float32"),
    case("generate/mismatched-vocab", lambda a, mp: gen(a, draft=a.other), IIE,
         r"target vocab_size=64, draft vocab_size=48; the two models must share one tokenizer"),
    case("generate/mismatched-tokenizers", lambda a, mp: gen(a, target=a.tok_a, draft=a.tok_b, method="sd", K=1), IIE,
         r"tokenizers map tokens to different ids \(both have vocab_size=64\); the two models must share one tokenizer"),
    case("generate/no-draft", lambda a, mp: gen(a, draft=None), IIE,
         r"draft model is missing; pass a LanguageModel \(CallableLM or HFModel\)"),
    case("generate/target-not-a-model", lambda a, mp: gen(a, target="gpt2"), IIE,
         r"target must be a LanguageModel .* got str \(wrap a transformers model in mdv.models.HFModel"),
    case("generate/single-draft-K=3", lambda a, mp: gen(a, method="sd", K=3), IIE,
         r"verifier 'sd' is single-draft and needs K=1 \(got K=3\); use a multi-draft verifier"),
    # ---- mdv.get_verifier
    case("get_verifier/unknown-name", lambda a, mp: mdv.get_verifier("spectr-gbv"), UNE,
         r"unknown method 'spectr-gbv'; valid methods are: " + ALL_VERIFIERS),
    case("get_verifier/not-a-name", lambda a, mp: mdv.get_verifier(None), UNE, r"unknown method None; valid methods"),
    case("get_verifier/unknown-option", lambda a, mp: mdv.get_verifier("gbv", adjust=False), IIE,
         r"verifier 'gbv' has no option\(s\) 'adjust'; its options are: adjust_target"),
    case("get_verifier/option-of-another", lambda a, mp: mdv.get_verifier("sd", adjust_target=False), IIE,
         r"verifier 'sd' has no option\(s\) 'adjust_target'; its options are: none"),
    case("get_verifier/option-value", lambda a, mp: mdv.get_verifier("gbv", adjust_target="no"), IIE,
         r"gbv option adjust_target must be True or False; got 'no'"),
    # ---- mdv.models.SamplingConfig
    case("SamplingConfig/T<0", lambda a, mp: SamplingConfig(temperature=-0.5), IIE, _T + r"-0.5"),
    case("SamplingConfig/T-nan", lambda a, mp: SamplingConfig(temperature=float("nan")), IIE, _T + r"nan"),
    case("SamplingConfig/T-inf", lambda a, mp: SamplingConfig(temperature=float("inf")), IIE, _T + r"inf"),
    case("SamplingConfig/T-str", lambda a, mp: SamplingConfig(temperature="0.4"), IIE, _T + r"'0.4'"),
    case("SamplingConfig/top_p=0", lambda a, mp: SamplingConfig(top_p=0.0), IIE, _TOP_P + r"0.0"),
    case("SamplingConfig/top_p>1", lambda a, mp: SamplingConfig(top_p=1.01), IIE, _TOP_P + r"1.01"),
    case("SamplingConfig/top_p-nan", lambda a, mp: SamplingConfig(top_p=float("nan")), IIE, _TOP_P + r"nan"),
    case("SamplingConfig/top_k<0", lambda a, mp: SamplingConfig(top_k=-1), IIE, _TOP_K + r"-1"),
    case("SamplingConfig/top_k-float", lambda a, mp: SamplingConfig(top_k=2.5), IIE, _TOP_K + r"2.5"),
    case("SamplingConfig/top_k-bool", lambda a, mp: SamplingConfig(top_k=True), IIE, _TOP_K + r"True"),
    # ---- the oracle
    case("oracle/unknown-method", lambda a, mp: exact_law("nope", a.toy_t, a.toy_d, 1, 1, 2), UNE,
         r"unknown method 'nope'; valid methods are: " + ALL_VERIFIERS),
    case("oracle/K=0", lambda a, mp: expected_accepted("mdbv", a.toy_t, a.toy_d, 0, 2), IIE, r"K .*>= 1; got K=0"),
    case("oracle/K<0", lambda a, mp: iteration_law("mdbv", a.toy_t, a.toy_d, -1, 2), IIE, r"K .*>= 1; got K=-1"),
    case("oracle/L=0", lambda a, mp: expected_accepted("mdbv", a.toy_t, a.toy_d, 1, 0), IIE,
         r"L must be an integer >= 1; got L=0"),
    case("oracle/L<0", lambda a, mp: exact_law("sd", a.toy_t, a.toy_d, 1, -3, 2), IIE,
         r"L must be an integer >= 1; got L=-3"),
    case("oracle/T<0", lambda a, mp: exact_law("sd", a.toy_t, a.toy_d, 1, 1, 2, temperature=-0.5), IIE, _T + r"-0.5"),
    case("oracle/top_p>1", lambda a, mp: exact_law("sd", a.toy_t, a.toy_d, 1, 1, 2, top_p=1.5), IIE, _TOP_P + r"1.5"),
    case("oracle/top_k<0", lambda a, mp: target_law(a.toy_t, 2, top_k=-1), IIE, _TOP_K + r"-1"),
    case("oracle/mismatched-vocab", lambda a, mp: expected_accepted("sd", a.toy_t, random_toy_model(2, 3), 1, 1), IIE,
         r"target and draft must share one vocabulary: target vocab_size=3, draft vocab_size=2"),
    case("oracle/prompt-out-of-vocab", lambda a, mp: exact_law("sd", a.toy_t, a.toy_d, 1, 1, 2, prompt=(5,)), IIE,
         r"prompt must lie in \[0, vocab_size=3\); got values in \[5, 5\]"),
    case("oracle/text-prompt", lambda a, mp: expected_accepted("sd", a.toy_t, a.toy_d, 1, 1, prompt="ab"), IIE,
         r"prompt must be a sequence of token ids \(encode text with the tokenizer first\); got str"),
    case("oracle/no-draft", lambda a, mp: exact_law("sd", a.toy_t, None, 1, 1, 2), IIE, r"draft model is missing"),
    case("oracle/too-large", lambda a, mp: expected_accepted("mdbv", a.toy_t, a.toy_d, 4, 4), IIE,
         r"V\^\(K·L\) = 3\^16 = 43046721 draft tuples, above the ceiling of 300000; use a smaller vocabulary, K or L"),
    case("oracle/lp-unknown-kind", lambda a, mp: lp_optimum(a.toy_t, a.toy_d, 1, 1, "best"), IIE,
         r"unknown LP kind 'best'; valid kinds are: valid, greedy"),
    case("oracle/lp-K=0", lambda a, mp: lp_optimum(a.toy_t, a.toy_d, 0, 1, "valid"), IIE,
         r"K \(number of drafts\) must be an integer >= 1; got K=0"),
    case("oracle/lp-prompt-out-of-vocab", lambda a, mp: lp_optimum(a.toy_t, a.toy_d, 1, 1, "greedy", prompt=(9,)), IIE,
         r"prompt must lie in \[0, vocab_size=3\)"),
    case("oracle/membership_ot-not-a-law", lambda a, mp: membership_ot([0.5, 0.6], [0.5, 0.5], 1), IIE,
         r"p \(target\) must sum to 1 \(got sum 1.1\); pass probabilities, not logits"),
    case("oracle/total_variation-not-a-law", lambda a, mp: total_variation([0.5], [0.5]), IIE,
         r"total_variation compares two laws given as dicts .*; a is a list"),
    case("oracle/toy-zero_prob>1", lambda a, mp: random_toy_model(3, 0, zero_prob=2.0), IIE,
         r"zero_prob is a probability and must lie in \[0, 1\]; got 2.0"),
    case("oracle/CallableLM-not-callable", lambda a, mp: CallableLM([0.5, 0.5], 2), IIE,
         r"fn must be a function of the prefix .* got list"),
    # ---- HFModel.from_pretrained: missing and corrupt model files
    case("from_pretrained/missing-gguf", lambda a, mp: HFModel.from_pretrained(a.tmp / "absent" / "model.gguf"), MAE,
         r"GGUF file not found: .*absent/model.gguf. Fetch the model first"),
    case("from_pretrained/missing-folder", lambda a, mp: HFModel.from_pretrained("/nonexistent/mdv-model"), MAE,
         r"model path not found: /nonexistent/mdv-model"),
    case("from_pretrained/missing-relative", lambda a, mp: HFModel.from_pretrained("./no/such/folder/here"), MAE,
         r"model path not found: no/such/folder/here"),
    case("from_pretrained/missing-gguf-in-folder",
         lambda a, mp: HFModel.from_pretrained(a.tmp / "good", gguf_file="model-q4.gguf"), MAE,
         r"GGUF file not found: .*good/model-q4.gguf"),
    case("from_pretrained/folder-without-config", lambda a, mp: HFModel.from_pretrained(a.tmp / "no_config"), MAE,
         r"no_config is not a model folder \(no config.json\); pass a folder written by save_pretrained\(\)"),
    case("from_pretrained/garbage-gguf", lambda a, mp: HFModel.from_pretrained(a.tmp / "garbage.gguf", device="cpu"),
         MAE, r"could not load GGUF file .*garbage.gguf: ValueError: .* the file is corrupt, truncated or not a"
              r" supported causal LM: fetch it again"),
    case("from_pretrained/empty-gguf", lambda a, mp: HFModel.from_pretrained(a.tmp / "empty.gguf", device="cpu"),
         MAE, r"could not load GGUF file .*empty.gguf: .*corrupt, truncated"),
    case("from_pretrained/text-file-gguf", lambda a, mp: HFModel.from_pretrained(a.tmp / "text.gguf", device="cpu"),
         MAE, r"could not load GGUF file .*text.gguf: .*not a GGUF file.*corrupt, truncated"),
    case("from_pretrained/truncated-safetensors",
         lambda a, mp: HFModel.from_pretrained(a.tmp / "truncated", device="cpu"), MAE,
         r"could not load model '.*truncated': SafetensorError: .*corrupt, truncated"),
    case("from_pretrained/garbage-safetensors",
         lambda a, mp: HFModel.from_pretrained(a.tmp / "garbage", device="cpu"), MAE,
         r"could not load model '.*garbage': SafetensorError: .*corrupt, truncated"),
    case("from_pretrained/unknown-architecture", lambda a, mp: HFModel.from_pretrained(a.tmp / "alien", device="cpu"),
         MAE, r"could not load model '.*alien': ValueError: .*no_such_architecture.*not a supported causal LM"),
    case("from_pretrained/unknown-dtype", lambda a, mp: HFModel.from_pretrained(a.tmp / "good", dtype="float99"), IIE,
         r"dtype must be a torch floating dtype or one of float32, float16, bfloat16, float64; got 'float99'"),
    case("from_pretrained/unknown-device", lambda a, mp: HFModel.from_pretrained(a.tmp / "good", device="tpu9"), IIE,
         r"device must be 'cpu', 'cuda', 'cuda:<n>' or a torch.device; got 'tpu9'"),
    # ---- the default pair (asset cache and shipped draft)
    case("default_pair/missing-target", lambda a, mp: _default_pair(a, mp, "empty_cache"), MAE,
         r"asset 'smollm2-135m-instruct' .* is not in the cache at .*; fetch it with"
         r" `python -m mdv.assets fetch smollm2-135m-instruct`"),
    case("default_pair/corrupt-target", lambda a, mp: _default_pair(a, mp, "bad_cache"), MAE,
         r"asset 'smollm2-135m-instruct' .* is corrupt \(size 4100 B, expected 98362432 B\) at .*; fetch it with"
         r" `python -m mdv.assets fetch smollm2-135m-instruct`"),
    case("default_pair/corrupt-draft-config", lambda a, mp: _load_draft(a, "draft_bad_json"), MAE,
         r"smollm2-135m-instruct-draft.json cannot be read \(JSONDecodeError: .*\); restore it from git or"
         r" regenerate it with `python experiments/train_draft.py`"),
    case("default_pair/corrupt-draft-weights", lambda a, mp: _load_draft(a, "draft_bad_weights"), MAE,
         r"smollm2-135m-instruct-draft.safetensors does not match the sha256 recorded in"
         r" smollm2-135m-instruct-draft.json; restore it from git"),
    # ---- mdv.data.load_prompts
    case("load_prompts/unknown-dataset", lambda a, mp: _load_prompts(a, mp, "gsm9k"), UNE,
         r"unknown dataset 'gsm9k'; valid datasets are: alpaca, gsm8k, humaneval, lm1b, mgsm"),
    case("load_prompts/n=0", lambda a, mp: _load_prompts(a, mp, "humaneval", n=0), IIE,
         r"n must be a positive integer or None \(all prompts\); got 0"),
    case("load_prompts/unknown-source", lambda a, mp: _load_prompts(a, mp, "humaneval", source="web"), IIE,
         r"source must be one of auto, hub, offline, package, stand-in; got 'web'"),
    case("load_prompts/hub-while-offline", lambda a, mp: _load_prompts(a, mp, "gsm8k", source="hub"), MAE,
         r"dataset 'gsm8k': source='hub' but the hub is switched off .* use the offline source 'gsm8k-100'"
         r" \(source='offline', fetched with `python -m mdv.data fetch gsm8k`\)"),
    case("load_prompts/not-in-cache", lambda a, mp: _load_prompts(a, mp, "humaneval", cache="empty_cache"), MAE,
         r"the offline source of dataset 'humaneval' \(humaneval\) is missing or corrupt .*; fetch it with"
         r" `python -m mdv.data fetch humaneval`"),
    case("load_prompts/corrupt-in-cache", lambda a, mp: _load_prompts(a, mp, "humaneval", cache="bad_cache"), MAE,
         r"the offline source of dataset 'humaneval' .* fetch it with `python -m mdv.data fetch humaneval`"),
    # ---- the analysis loader: corrupt cell files (each is skipped with one warning line)
    case("analysis/be-not-a-number", lambda a, mp: _load_cell(a, _stat("block_efficiency", "abc")), None,
         r"generations\[0\].stats.block_efficiency is 'abc', expected a finite number >= 0 \(or null\)"),
    case("analysis/be-negative", lambda a, mp: _load_cell(a, _stat("block_efficiency", -3)), None,
         r"block_efficiency is -3, expected a finite number >= 0"),
    case("analysis/decode-negative", lambda a, mp: _load_cell(a, _stat("decode_s", -1.0)), None,
         r"decode_s is -1.0, expected a finite number >= 0"),
    case("analysis/accepted-lengths-not-ints", lambda a, mp: _load_cell(a, _stat("accepted_lengths", "x")), None,
         r"accepted_lengths must be a list of integers in \[0, L=4\]; got x"),
    case("analysis/accepted-length-above-L", lambda a, mp: _load_cell(a, _stat("accepted_lengths", [2, 9])), None,
         r"accepted_lengths must be a list of integers in \[0, L=4\]; got \[2, 9\]"),
    case("analysis/duplicate-prompt", lambda a, mp: _load_cell(a, _duplicate_index), None,
         r"generations\[1\].prompt_index 0 appears twice"),
    case("analysis/K<1", lambda a, mp: _load_cell(a, _config("K", -2)), None, r"config K=-2 out of range"),
    case("analysis/T<0", lambda a, mp: _load_cell(a, _config("temperature", -1)), None,
         r"config temperature=-1 out of range"),
    case("analysis/top_p>1", lambda a, mp: _load_cell(a, _config("top_p", 1.5)), None, r"config top_p=1.5 out of range"),
    case("analysis/method-not-a-name", lambda a, mp: _load_cell(a, _config("method", ["sd"])), None,
         r"config method is \['sd'\], expected a non-empty string"),
    case("analysis/only-corrupt-files", _analysis_only_corrupt, None,
         r"no usable cell file in .*1 .json file\(s\) found, 1 skipped as unreadable, 0 failed; run a sweep"),
    case("analysis/output-is-a-file", _analysis_out_is_a_file, None,
         r"cannot write the analysis to .*taken.*; pass a writable folder with --out DIR"),
]


def _expected_error(c: ApiCase) -> type[Exception]:
    if c.error is not None:
        return c.error
    from mdv.analysis import AnalysisError, CellFileError

    return AnalysisError if c.id in ("analysis/only-corrupt-files", "analysis/output-is-a-file") else CellFileError


@pytest.mark.parametrize("c", API_CASES, ids=[c.id for c in API_CASES])
def test_api_bad_input_raises_one_typed_one_line_error(api, monkeypatch, c: ApiCase) -> None:
    expected = _expected_error(c)
    with pytest.raises(Exception) as info:
        c.call(api, monkeypatch)
    err = info.value
    assert type(err) is expected, f"{type(err).__name__}: {err}"
    if expected.__name__ != "CellFileError":  # the analysis turns a bad cell file into a warning, not an error
        assert isinstance(err, MdvError)
    msg = str(err)
    assert "\n" not in msg, msg
    assert re.search(c.match, msg), msg


def test_api_table_covers_every_entry_point() -> None:
    rows = {c.id.split("/")[0] for c in API_CASES}
    assert rows == {"generate", "get_verifier", "SamplingConfig", "oracle", "from_pretrained", "default_pair",
                    "load_prompts", "analysis"}


def test_typed_errors_are_the_builtin_kinds_users_catch() -> None:
    """Callers catching ValueError / KeyError / FileNotFoundError keep working with mdv's typed errors."""
    assert issubclass(InvalidInputError, ValueError) and issubclass(UnknownNameError, KeyError)
    assert issubclass(UnknownNameError, ValueError) and issubclass(MissingAssetError, FileNotFoundError)
    assert str(UnknownNameError("unknown method 'x'")) == "unknown method 'x'"  # KeyError would quote it


def test_good_input_still_runs(api) -> None:
    """The checks reject only bad input: the same calls with good values succeed (so the rows above
    fail for the reason they name)."""
    assert len(gen(api).tokens) == 4
    assert len(gen(api, prompt_ids=[1] * (CONTEXT - 3), L=3, max_new_tokens=1).tokens) == 1
    assert len(gen(api, method="ar", prompt_ids=[1] * (CONTEXT - 1), max_new_tokens=1).tokens) == 1
    assert len(gen(api, temperature=0, top_k=0, top_p=1.0).tokens) == 4
    assert mdv.get_verifier("gbv", adjust_target=False).lossless is False
    assert SamplingConfig(temperature=0, top_k=5, top_p=0.5).greedy
    assert 0 < expected_accepted("sd", api.toy_t, api.toy_d, 1, 1, prompt=(2,)) <= 1
    assert HFModel.from_pretrained(api.tmp / "good", dtype="float64", device="cpu").dtype == torch.float64


# --------------------------------------------------------------------------------------- the CLI table
@dataclass(frozen=True)
class CliCase:
    command: str  # run | theory | bench | train_draft | report
    args: dict[str, str] = field(default_factory=dict)  # overrides (report: {"argv": ...})
    match: str = ""  # regex the single `error:` line must match
    env: dict[str, str] = field(default_factory=dict)


RUN_BASE = {"models": "tiny_random", "progress": "false", "dataset": "humaneval", "method": "sd",
            "dataset.n_prompts": "1", "sampling.max_new_tokens": "2", "dataset.loader": f"{ME}:stub_prompts",
            "dataset.formatter": f"{ME}:stub_format"}
THEORY_BASE = {"seeds": "[0]", "K": "[1]", "L": "[1]", "temperatures": "[1.0]", "vocab_sizes": "[2]"}
BENCH_BASE = {"threads": "1", "benchmarks": "[verifier]", "verifier.target_step": "false", "verifier.vocab_sizes": "[8]",
              "verifier.K": "[1]", "verifier.L": "[1]", "verifier.repeats": "1", "verifier.methods": "[sd]"}
HUB = {"models": "hub", "models.dtype": "float32", "models.device": "cpu"}

CLI_CASES: dict[str, CliCase] = {
    # python -m experiments.run
    "run/unknown-method": CliCase("run", {"method": "nope"}, r"unknown method option 'nope'; valid method options"
                                  rf" are: {options('method')} \(set it with method=<option>\)$"),
    "run/unknown-dataset": CliCase("run", {"dataset": "gsm9k"}, r"unknown dataset option 'gsm9k'; valid dataset"
                                   rf" options are: {options('dataset')} \(set it with dataset=<option>\)$"),
    "run/unknown-preset": CliCase("run", {"experiment": "paper"}, r"unknown experiment option 'paper'; valid experiment"
                                  rf" options are: {options('experiment')} \(set it with experiment=<option>\)$"),
    "run/unknown-models": CliCase("run", {"models": "nope"}, r"unknown models option 'nope'; valid models options"
                                  rf" are: {options('models')} \(set it with models=<option>\)$"),
    "run/unknown-method-in-list": CliCase("run", {"method.names": "[sd,nope]"},
                                          r"method.names=\[sd,nope\]; Invalid value 'nope', expected one of \[ar, bv, gbv,"),
    "run/K=0": CliCase("run", {"sweep.K": "[0]"}, r"sweep.K must be a non-empty list of integers >= 1; got \[0\]"
                                                  r" \(e.g. sweep.K=\[1,2,3\]\)"),
    "run/negative-T": CliCase("run", {"sampling.temperatures": "[-0.4]"},
                              r"sampling.temperatures must be a non-empty list of finite numbers >= 0 .*got \[-0.4\]"),
    "run/top_p>1": CliCase("run", {"sampling.top_p": "1.5"}, r"sampling.top_p must lie in \(0, 1\] \(null = off\); got 1.5"),
    "run/dataset-hub-offline": CliCase("run", {"dataset.source": "hub", "dataset.loader": "mdv.data:load_prompts"},
                                       r"dataset 'humaneval': source='hub' but the hub is switched off .*"
                                       r"`python -m mdv.data fetch humaneval`"),
    "run/dataset-not-in-cache": CliCase("run", {"dataset.source": "offline", "dataset.loader": "mdv.data:load_prompts"},
                                        r"offline source of dataset 'humaneval' \(humaneval\) is missing or corrupt .*"
                                        r"fetch it with `python -m mdv.data fetch humaneval`",
                                        env={"MDV_CACHE": "{tmp}/empty_cache"}),
    "run/missing-model-file": CliCase("run", {**HUB, "models.target": "{tmp}/absent.gguf",
                                              "models.draft": "{tmp}/absent.gguf"},
                                      r"GGUF file not found: .*absent.gguf. Fetch the model first"),
    "run/corrupt-model-file": CliCase("run", {**HUB, "models.target": "{tmp}/garbage.gguf",
                                              "models.draft": "{tmp}/garbage.gguf"},
                                      r"could not load GGUF file .*garbage.gguf: ValueError: .*the file is corrupt"),
    "run/corrupt-default-target": CliCase("run", {"models": "default"},
                                          r"the default model pair is unavailable: asset 'smollm2-135m-instruct' .* is"
                                          r" corrupt \(size .*fetch it with `python -m mdv.assets fetch"
                                          r" smollm2-135m-instruct`", env={"MDV_CACHE": "{tmp}/bad_cache"}),
    "run/unwritable-results": CliCase("run", {"results_dir": "{tmp}/a-file/results"},
                                      r"results_dir '.*a-file/results' is not writable .*pass a writable folder"),
    "run/mismatched-vocab": CliCase("run", {**HUB, "models.target": "{tmp}/v64", "models.draft": "{tmp}/v48"},
                                    r"target and draft vocabularies differ: target vocab_size=64, draft vocab_size=48"),
    "run/prompt-longer-than-context": CliCase("run", {**HUB, "models.target": "{tmp}/ctx16", "models.draft": "{tmp}/ctx16",
                                                      "dataset.formatter": f"{ME}:long_format"},
                                              r"prompt_ids has 40 tokens but the model context is 16 tokens"),
    "run/panels-on-bfloat16": CliCase("run", {"models.linears": "panels", "models.dtype": "bfloat16"},
                                      r"models.linears=panels runs float32 models on the CPU; got dtype=bfloat16, .*"
                                      r" or models.linears=plain$"),
    "run/unknown-linears": CliCase("run", {"models.linears": "fast"},
                                   r"models.linears=fast; Invalid value 'fast', expected one of \[plain, panels, auto\]"),
    "run/unknown-forward": CliCase("run", {"models.forward": "fast"},
                                   r"models.forward=fast; Invalid value 'fast', expected one of \[hf, lean, auto\]"),
    # python -m experiments.theory
    "theory/unknown-method": CliCase("theory", {"methods": "[nope]"},
                                     r"unknown method\(s\) \['nope'\]; valid methods are: " + ALL_VERIFIERS),
    "theory/L<0": CliCase("theory", {"L": "[-1]"}, r"theory.L must be a non-empty list of integers >= 1; got \[-1\]"),
    "theory/negative-T": CliCase("theory", {"temperatures": "[-1.0]"}, r"theory.temperatures must be >= 0; got \[-1.0\]"),
    "theory/random-toys-peer": CliCase("theory", {"random_toys": "3", "dominance_peers": "[nope]"},
                                       r"theory.dominance_method / dominance_peers must name registered verifiers \(at"
                                       r" least one peer\); got unknown \['nope'\] with peers \['nope'\]; valid: "
                                       + ALL_VERIFIERS),
    "theory/unknown-key": CliCase("theory", {"Kx": "[1]"},
                                  r"Could not override 'Kx'; Key 'Kx' not in 'TheoryConfig'; To append to your config"
                                  r" use \+Kx=\[1\]"),
    # python -m experiments.bench
    "bench/unknown-benchmark": CliCase("bench", {"benchmarks": "[nope]"},
                                       r"benchmarks=\[nope\]; Invalid value 'nope', expected one of \[verifier,"
                                       r" target_pass, pass_limit, draft_step, e2e, oracle, memory, paired, audit, hf_compare\]"),
    "bench/draft_step-dtype": CliCase("bench", {"benchmarks": "[draft_step]", "draft_step.dtypes": "[bfloat16]"},
                                      r"draft_step.dtypes must be distinct entries of float32, float16, int8; got"
                                      r" \['bfloat16'\]"),
    "bench/unknown-method": CliCase("bench", {"verifier.methods": "[nope]"},
                                    r"verifier.methods: unknown method 'nope'; valid methods are: " + ALL_VERIFIERS),
    "bench/K=0": CliCase("bench", {"verifier.K": "[0]"},
                         r"verifier.K must be a non-empty list of integers >= 1; got \[0\]"),
    "bench/verifier-unknown-blocks": CliCase("bench", {"verifier.blocks": "nope"},
                                             r"verifier.blocks=nope; Invalid value 'nope', expected one of \[synthetic,"
                                             r" real\]"),
    "bench/verifier-real-dataset": CliCase("bench", {"verifier.blocks": "real", "verifier.real_datasets": "[gsm9k]"},
                                           r"verifier.real_datasets: unknown dataset 'gsm9k'; valid datasets are: alpaca,"),
    "bench/unknown-dtype": CliCase("bench", {"dtype": "int8"},
                                   r"dtype must be one of float32, bfloat16, float16, float64; got 'int8'"),
    "bench/unknown-dataset": CliCase("bench", {"benchmarks": "[e2e]", "e2e.pair": "tiny_random", "e2e.datasets": "[gsm9k]"},
                                     r"e2e.datasets: unknown dataset 'gsm9k'; valid datasets are: alpaca, gsm8k,"),
    "bench/e2e-unknown-variant": CliCase("bench", {"benchmarks": "[e2e]", "e2e.pair": "tiny_random",
                                                   "e2e.variants": "[lean+panel]"},
                                         r"e2e.variants: unknown variant 'lean\+panel'; valid variants are: lean, lean\+panels,"
                                         r" packed, panels, plain$"),
    "bench/draft_step-without-a-compiler": CliCase("bench", {"benchmarks": "[draft_step]", "draft_step.pair": "tiny_random"},
                                                    r"draft_step times the draft on weight panels: the panel kernel (needs an"
                                                    r" x86-64 CPU with AVX2|is compiled on first use, but no C compiler was"
                                                    r" found).* \(leave draft_step out of benchmarks\)$",
                                                    env={"CC": "mdv-no-such-compiler"}),
    "bench/panels-without-a-compiler": CliCase("bench", {"benchmarks": "[pass_limit]", "pass_limit.pair": "tiny_random",
                                                         "pass_limit.panels": "true"},
                                               r"e2e.panels / pass_limit.panels: the panel kernel (needs an x86-64 CPU"
                                               r" with AVX2|is compiled on first use, but no C compiler was found).*"
                                               r" \(set them to false\)$", env={"CC": "mdv-no-such-compiler"}),
    "bench/lean_compare-without-panels": CliCase("bench", {"benchmarks": "[pass_limit]", "pass_limit.pair": "tiny_random",
                                                           "pass_limit.lean": "true", "pass_limit.lean_compare": "[avx2_kernel]"},
                                                 r"pass_limit.lean_compare times variants of the lean pass on panels: it"
                                                 r" needs pass_limit.panels=true and pass_limit.lean=true \(got panels=False,"
                                                 r" lean=True\)$"),
    "bench/lean_compare-unknown": CliCase("bench", {"benchmarks": "[pass_limit]", "pass_limit.lean_compare": "[avx3]"},
                                          r"pass_limit.lean_compare must be distinct entries of avx2_kernel, small_pages,"
                                          r" per_query_attention;"
                                          r" got \['avx3'\]$"),
    # python -m experiments.train_draft (checked before the target loads and hours of generation start)
    "train_draft/unknown-distill-head": CliCase("train_draft", {"distill.head": "rows"},
                                                r"distill.head must be one of subset, full; got 'rows'$"),
    "train_draft/subset-kl-without-subset": CliCase("train_draft", {"head_subset.enabled": "false"},
                                                    r"distill.head=subset needs head_subset.enabled=true .* set"
                                                    r" distill.head=full"),
    "train_draft/unknown-gen-dtype": CliCase("train_draft", {"gen.dtype": "int8"},
                                             r"gen.dtype must be one of float32, bfloat16, float16; got 'int8'$"),
    "train_draft/greedy-with-several-samples": CliCase("train_draft", {"gen.temperature": "0", "gen.samples_per_prompt": "2"},
                                                       r"gen.samples_per_prompt > 1 needs gen.temperature > 0 .* set"
                                                       r" gen.samples_per_prompt=1 or a positive gen.temperature$"),
    # python -m analysis.report
    "report/not-a-folder": CliCase("report", {"argv": "{tmp}/a-file"},
                                   r"results folder '.*a-file' is a file, not a folder; pass the folder a sweep wrote"),
    "report/only-corrupt-cell-files": CliCase("report", {"argv": "{tmp}/corrupt_results"},
                                              r"no usable cell file in '.*corrupt_results/cells': 2 .json file\(s\) found,"
                                              r" 2 skipped as unreadable, 0 failed; run a sweep"),
    "report/output-not-writable": CliCase("report", {"argv": "{tmp}/good_results --out {tmp}/a-file"},
                                          r"cannot write the analysis to '.*a-file' .*pass a writable folder with --out"),
}
MODULES = {"run": "experiments.run", "theory": "experiments.theory", "bench": "experiments.bench",
           "train_draft": "experiments.train_draft", "report": "analysis.report"}


def _argv(name: str, c: CliCase, tmp: Path) -> list[str]:
    if c.command == "report":
        return [sys.executable, "-m", MODULES["report"], *c.args["argv"].format(tmp=tmp).split()]
    folder = str(tmp / "out" / _slug(name))
    base = {"run": {**RUN_BASE, "results_dir": folder}, "theory": {**THEORY_BASE, "hydra.run.dir": folder},
            "bench": {**BENCH_BASE, "hydra.run.dir": folder},
            # never the shipped draft's folder or the real work cache, should a row not fail early
            "train_draft": {"hydra.run.dir": folder, "output.dir": f"{folder}/draft",
                            "output.work_cache": f"{folder}/cache"}}[c.command]
    args = {**base, **{k: v.format(tmp=tmp) for k, v in c.args.items()}}
    return [sys.executable, "-m", MODULES[c.command], *(f"{k}={v}" for k, v in args.items())]


def _cli_files(tmp: Path) -> None:
    """What the CLI rows read: a file where a folder is expected, garbage / tiny model files, caches and
    results folders (only corrupt cell files; good cells for the --out row)."""
    (tmp / "a-file").write_text("not a folder")
    (tmp / "garbage.gguf").write_bytes(b"GGUF" + bytes(range(256)) * 4)
    (tmp / "empty_cache").mkdir()
    bad = tmp / "bad_cache" / "smollm2-135m-instruct" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    bad.parent.mkdir(parents=True)
    bad.write_bytes(b"GGUF" + b"\x00" * 4096)
    _save(_tiny_llama(64), tmp / "v64")
    _save(_tiny_llama(48), tmp / "v48")
    _save(_tiny_llama(64, context=16), tmp / "ctx16")
    cells = tmp / "corrupt_results" / "cells"
    cells.mkdir(parents=True)
    good = write_cell(cells, "sd", HE, 1, 4, 0.4, [2.0, 2.2])
    data = json.loads((cells / f"{good}.json").read_text())
    data["generations"][0]["stats"]["accepted_lengths"] = "x"  # was a ValueError traceback in the report
    (cells / f"{good}.json").write_text(json.dumps(data))
    (cells / "truncated.json").write_text('{"schema": "mdv.cell/1", "cell_id": "x", "sta')
    cells = tmp / "good_results" / "cells"
    cells.mkdir(parents=True)
    write_cell(cells, "ar", HE, 1, 4, 0.4, [1.0] * 3)


def _fork_runner(jobs_file: str) -> None:
    """Run every job of ``jobs_file`` as ``python -m <module> <args>`` in its own process, all at once.

    The modules every command imports (torch, transformers, mdv, Hydra, the entry points, matplotlib) are
    imported once here; each job is a forked child that sets its environment, sends its stdout / stderr to
    files and runs the module as ``__main__`` (:func:`runpy.run_module`), ending like the interpreter
    does: ``SystemExit`` gives its code, any other exception prints its traceback and gives 1.  This
    saves the ~3 s import per command (two rows are also run as plain subprocesses and must match).
    """
    import runpy
    import traceback

    import analysis.report  # noqa: F401
    import experiments.bench  # noqa: F401
    import experiments.run  # noqa: F401
    import experiments.theory  # noqa: F401
    import experiments.train_draft  # noqa: F401
    import matplotlib.pyplot  # noqa: F401
    import mdv.analysis  # noqa: F401
    import mdv.bench  # noqa: F401
    from transformers import LlamaForCausalLM  # noqa: F401

    jobs = json.loads(Path(jobs_file).read_text())
    pids = {}
    for job in jobs:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid:
            pids[pid] = job["name"]
            continue
        code = 1
        try:
            for k in list(os.environ):
                if k not in job["env"]:
                    del os.environ[k]
            os.environ.update(job["env"])
            for fd, path in ((1, job["stdout"]), (2, job["stderr"])):
                f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.dup2(f, fd)
                os.close(f)
            sys.argv = [job["module"], *job["args"]]
            sys.modules.pop(job["module"], None)  # as with `python -m`: the module runs once, as __main__
            try:
                runpy.run_module(job["module"], run_name="__main__", alter_sys=True)
                code = 0
            except SystemExit as e:
                if e.code is None or isinstance(e.code, int):
                    code = e.code or 0
                else:
                    print(e.code, file=sys.stderr)
            except BaseException:
                traceback.print_exc()
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)
    codes = {}
    while pids:
        pid, status = os.wait()
        codes[pids.pop(pid)] = os.waitstatus_to_exitcode(status)
    Path(jobs_file).with_suffix(".codes.json").write_text(json.dumps(codes))


@pytest.fixture(scope="module")
def cli(tmp_path_factory) -> dict[str, Any]:
    """Every CLI row, plus two HYDRA_FULL_ERROR=1 runs and a mixed results folder, run together by
    :func:`_fork_runner`; two rows also run as plain subprocesses, alongside."""
    tmp = tmp_path_factory.mktemp("cli")
    _cli_files(tmp)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "WANDB_MODE": "offline", "MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    for k in ("HYDRA_FULL_ERROR", "MDV_FULL_ERROR"):
        env.pop(k, None)
    jobs: dict[str, tuple[list[str], dict[str, str]]] = {}
    for name, c in CLI_CASES.items():
        jobs[name] = (_argv(name, c, tmp), {**env, **{k: v.format(tmp=tmp) for k, v in c.env.items()}})
    full = {**env, "HYDRA_FULL_ERROR": "1"}
    jobs["full-error/task"] = (_argv("full-task", CliCase("run", {"sweep.K": "[0]"}), tmp), full)
    jobs["full-error/compose"] = (_argv("full-compose", CliCase("run", {"dataset": "gsm9k"}), tmp), full)
    mixed = tmp / "mixed" / "cells"
    mixed.mkdir(parents=True)
    write_cell(mixed, "ar", HE, 1, 4, 0.4, [1.0] * 3)
    write_cell(mixed, "sd", HE, 1, 4, 0.4, [2.0, 2.2, 1.8])
    bad = write_cell(mixed, "gbv", HE, 1, 4, 0.4, [2.5, 2.5, 2.5])
    (mixed / f"{bad}.json").write_text((mixed / f"{bad}.json").read_text()[:300])
    jobs["report/mixed"] = ([sys.executable, "-m", MODULES["report"], str(tmp / "mixed")], env)
    logs = tmp / "logs"
    logs.mkdir()
    spec = [{"name": name, "module": cmd[2], "args": cmd[3:], "env": e,
             "stdout": str(logs / f"{_slug(name)}.out"), "stderr": str(logs / f"{_slug(name)}.err")}
            for name, (cmd, e) in jobs.items()]
    (logs / "jobs.json").write_text(json.dumps(spec))
    if not hasattr(os, "fork"):  # no fork here: every row as a plain subprocess (slower)
        procs = {job["name"]: subprocess.Popen([sys.executable, "-m", job["module"], *job["args"]], cwd=REPO,
                                               env=job["env"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                               text=True) for job in spec}
        out = {"_tmp": tmp, "_plain": {}}
        for name, p in procs.items():
            stdout, stderr = p.communicate(timeout=600)
            out[name] = out["_plain"][name] = subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr)
        return out
    runner = subprocess.Popen([sys.executable, "-c", "import sys; from tests.test_bad_input_matrix import"
                               " _fork_runner; _fork_runner(sys.argv[1])", str(logs / "jobs.json")],
                              cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    plain = {name: subprocess.Popen(jobs[name][0], cwd=REPO, env=jobs[name][1], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True) for name in PLAIN}
    out: dict[str, Any] = {"_tmp": tmp, "_plain": {}}
    for name, p in plain.items():
        stdout, stderr = p.communicate(timeout=600)
        out["_plain"][name] = subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr)
    r_out, r_err = runner.communicate(timeout=600)
    assert runner.returncode == 0, r_err[-3000:]
    codes = json.loads((logs / "jobs.codes.json").read_text())
    for job in spec:
        out[job["name"]] = subprocess.CompletedProcess(
            [job["module"], *job["args"]], codes[job["name"]], Path(job["stdout"]).read_text(),
            Path(job["stderr"]).read_text())
    return out


#: Rows also run as plain ``python -m`` subprocesses: the fork runner must give the same result.
PLAIN = ("run/K=0", "report/not-a-folder")


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", name)


def _result_files(name: str, c: CliCase, tmp: Path) -> list[Path]:
    """Anything a run of row ``name`` could have written as a result."""
    folder = tmp / "out" / _slug(name)
    if c.command == "run":
        return sorted(folder.glob("cells/*.json"))
    if c.command == "train_draft":
        return sorted((folder / "draft").glob("*"))
    if c.command in ("theory", "bench"):
        return sorted(p for p in folder.glob("*")
                      if p.name in ("theory.md", "theory.csv", "theory_etau_vs_k.png") or p.name.startswith("bench_"))
    argv = c.args["argv"].format(tmp=tmp).split()
    folder = Path(argv[argv.index("--out") + 1]) if "--out" in argv else Path(argv[0]) / "analysis"
    return sorted(folder.glob("*")) if folder.is_dir() else []


@pytest.mark.parametrize("name", list(CLI_CASES))
def test_cli_bad_input_is_one_error_line(cli, name: str) -> None:
    c, proc = CLI_CASES[name], cli[name]
    tail = f"exit {proc.returncode}\nstderr:\n{proc.stderr[-3000:]}"
    assert "Traceback" not in proc.stderr + proc.stdout, tail
    assert proc.returncode == 2, tail
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, tail
    assert re.search(c.match, errors[0]), tail
    assert _result_files(name, c, cli["_tmp"]) == [], tail


def test_cli_table_covers_every_command() -> None:
    assert {c.command for c in CLI_CASES.values()} == set(MODULES)


@pytest.mark.parametrize("name", PLAIN)
def test_fork_runner_matches_a_plain_subprocess(cli, name: str) -> None:
    forked, plain = cli[name], cli["_plain"][name]
    assert (forked.returncode, forked.stderr) == (plain.returncode, plain.stderr)
    assert forked.stderr.startswith("error: ")


def test_report_without_error_line_has_only_stderr_warnings(cli) -> None:
    """A corrupt (non-JSON) line never spreads: a folder-level error is the only stderr line apart from one
    warning per skipped file, each naming its file."""
    proc = cli["report/only-corrupt-cell-files"]
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    warnings = [ln for ln in lines if ln.startswith("warning: skipping")]
    assert len(warnings) == 2 and len(lines) == 3, proc.stderr
    assert any("truncated.json" in w and "not valid JSON" in w for w in warnings), warnings
    assert any("accepted_lengths" in w for w in warnings), warnings


def test_full_error_shows_the_trace(cli) -> None:
    task, compose = cli["full-error/task"], cli["full-error/compose"]
    assert task.returncode != 0 and "Traceback" in task.stderr and "InvalidInputError" in task.stderr
    assert compose.returncode != 0 and "Traceback" in compose.stderr and "MissingConfigException" in compose.stderr
    assert not any(ln.startswith("error:") for ln in task.stderr.splitlines() + compose.stderr.splitlines())


def test_report_skips_a_corrupt_cell_and_tabulates_the_rest(cli) -> None:
    """A results folder with one truncated cell file among good ones: exit 0, one warning naming the file,
    and the truncated cell (gbv) is absent from the results while the good ones (ar, sd) are present."""
    proc = cli["report/mixed"]
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("warning: skipping") and "gbv" in lines[0], proc.stderr
    rows = (cli["_tmp"] / "mixed" / "analysis" / "results.csv").read_text()
    assert ",sd," in rows and ",ar," in rows and "gbv" not in rows, rows
