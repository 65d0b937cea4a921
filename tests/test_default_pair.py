"""mdv.assets (pinned, sha256-checked offline assets) and the embedded default pair.

The fast tests build fake assets and fake archives in a temporary cache; nothing is downloaded.
The slow tests load SmolLM2-135M-Instruct and the shipped draft; they are skipped, with the fetch
command in the reason, when the target file is not in the cache.
"""
from __future__ import annotations

import hashlib
import io
import os
import zipfile
from pathlib import Path

import pytest
import torch

from mdv import assets
from mdv.errors import MissingAssetError, UnknownNameError

CONTENT = b"mdv fake asset payload\n" * 10


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private asset cache ($MDV_CACHE) with a fake single-file asset registered."""
    monkeypatch.setenv("MDV_CACHE", str(tmp_path / "cache"))
    fake = assets.Asset(name="fake-asset", kind="dataset", filename="fake.bin",
                        parts=(assets.Part("fake-pkg", "1.0", "fake_pkg/data/fake.bin"),),
                        sha256=hashlib.sha256(CONTENT).hexdigest(), size=len(CONTENT), description="a test asset")
    monkeypatch.setitem(assets.ASSETS, fake.name, fake)
    return tmp_path / "cache"


def _write(p: Path, data: bytes) -> None:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)


def test_cache_dir_follows_env(cache: Path) -> None:
    assert assets.cache_dir() == cache
    assert assets.target_path("fake-asset") == cache / "fake-asset" / "fake.bin"


def test_absent_asset_names_fetch_command(cache: Path) -> None:
    with pytest.raises(MissingAssetError, match=r"python -m mdv\.assets fetch fake-asset") as ei:
        assets.path("fake-asset")
    assert "not in the cache" in str(ei.value)
    assert not assets.is_available("fake-asset")


def test_corrupt_asset_is_rejected_with_fetch_command(cache: Path) -> None:
    p = assets.target_path("fake-asset")
    _write(p, CONTENT[:-1] + b"X")  # same size, one byte differs
    with pytest.raises(MissingAssetError, match=r"(?s)corrupt \(sha256 .*python -m mdv\.assets fetch fake-asset"):
        assets.path("fake-asset")
    _write(p, CONTENT + b"more")  # wrong size
    with pytest.raises(MissingAssetError, match=r"corrupt \(size"):
        assets.path("fake-asset")


def test_valid_asset_then_tampered_is_caught(cache: Path) -> None:
    p = assets.target_path("fake-asset")
    _write(p, CONTENT)
    assert assets.path("fake-asset") == p  # writes the verification stamp
    st = p.stat()
    _write(p, CONTENT[:-1] + b"Y")
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # a different mtime: the stamp is stale
    with pytest.raises(MissingAssetError, match="sha256"):
        assets.path("fake-asset")


def test_unknown_asset_lists_valid_names() -> None:
    with pytest.raises(UnknownNameError, match="smollm2-135m-instruct"):
        assets.path("no-such-asset")


def _fake_wheel(dest: Path, members: dict[str, bytes]) -> Path:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    p = dest / "fake-1.0-py3-none-any.whl"
    p.write_bytes(buf.getvalue())
    return p


def test_fetch_extracts_and_verifies(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def fake_download(part: assets.Part, dest: Path) -> Path:
        calls.append(part.requirement)
        return _fake_wheel(dest, {part.member: CONTENT, "other/file.txt": b"x"})

    monkeypatch.setattr(assets, "_pip_download", fake_download)
    p = assets.fetch("fake-asset", quiet=True)
    assert p.read_bytes() == CONTENT and assets.path("fake-asset") == p
    assert calls == ["fake-pkg==1.0"]
    assets.fetch("fake-asset", quiet=True)  # present and valid: no second download
    assert calls == ["fake-pkg==1.0"]


def test_fetch_refuses_a_changed_package(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(assets, "_pip_download",
                        lambda part, dest: _fake_wheel(dest, {part.member: b"something else"}))
    with pytest.raises(MissingAssetError, match="pinned"):
        assets.fetch("fake-asset", quiet=True)
    assert not assets.target_path("fake-asset").exists()


def test_multi_part_assembly(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The code path of the chunked Qwen2.5-Coder GGUFs: parts concatenated in order, then checked."""
    chunks = [bytes([i]) * (1000 + i) for i in range(1, 4)]
    whole = b"".join(chunks)
    parts = tuple(assets.Part(f"chunk-part{i}", "0.2.0", f"chunk_part{i}/data/part{i:02d}.bin") for i in range(1, 4))
    a = assets.Asset(name="fake-chunked", kind="model", filename="model.gguf", parts=parts,
                     sha256=hashlib.sha256(whole).hexdigest(), size=len(whole), optional=True)
    monkeypatch.setitem(assets.ASSETS, a.name, a)
    by_pkg = {p.package: (p.member, c) for p, c in zip(parts, chunks)}
    monkeypatch.setattr(assets, "_pip_download",
                        lambda part, dest: _fake_wheel(dest, {by_pkg[part.package][0]: by_pkg[part.package][1]}))
    assert assets.fetch("fake-chunked", quiet=True).read_bytes() == whole


def test_qwen_pair_is_registered_as_optional() -> None:
    for name, n, sha in [("qwen2.5-coder-1.5b-instruct", 22, "cc324af070c2"), ("qwen2.5-coder-0.5b-instruct", 6,
                                                                               "1d9614638d18")]:
        a = assets.get_asset(name)
        assert a.optional and len(a.parts) == n and a.sha256.startswith(sha)
        assert name not in assets.DEFAULT_ASSETS


def test_cli_check_reports_missing(cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert assets.main(["check", "fake-asset"]) == 1
    assert "python -m mdv.assets fetch fake-asset" in capsys.readouterr().err
    _write(assets.target_path("fake-asset"), CONTENT)
    assert assets.main(["check", "fake-asset"]) == 0


def test_load_default_pair_without_target_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mdv.models.default_pair import load_default_pair

    monkeypatch.setenv("MDV_CACHE", str(tmp_path))
    with pytest.raises(MissingAssetError, match=r"python -m mdv\.assets fetch smollm2-135m-instruct"):
        load_default_pair()


def test_shipped_draft_files_are_small() -> None:
    from mdv.models import default_pair as dp

    w = dp.draft_weights_path()
    assert w.is_file(), f"the shipped draft {w} is missing"
    assert w.stat().st_size <= 30 * 2**20
    assert dp.draft_config_path().is_file()


# ------------------------------------------------------------------------------------ slow tests
def _skip_reason() -> str | None:
    from mdv.models.default_pair import default_pair_available

    ok, why = default_pair_available()
    return None if ok else f"default pair not available: {why.splitlines()[0]} (run: python -m mdv.assets fetch smollm2-135m-instruct)"


@pytest.fixture(scope="module")
def pair():
    why = _skip_reason()
    if why:
        pytest.skip(why)
    from mdv.models.default_pair import load_default_pair

    torch.set_num_threads(2)
    return load_default_pair()


@pytest.mark.slow
def test_pair_loads_and_vocabularies_match(pair) -> None:
    target, draft, tok = pair
    assert len(tok) == 49152
    assert target.config.vocab_size == draft.config.vocab_size == 49152
    assert draft.config.num_hidden_layers < target.config.num_hidden_layers
    assert torch.equal(draft.get_output_embeddings().weight, target.get_output_embeddings().weight)
    assert torch.equal(draft.get_input_embeddings().weight, target.get_input_embeddings().weight)
    n_draft_own = sum(p.numel() for n, p in draft.named_parameters() if "embed_tokens" not in n and "lm_head" not in n)
    assert n_draft_own < 15e6
    from mdv.models.hf import HFModel

    assert HFModel(target, tok).same_vocabulary(HFModel(draft, tok))


@pytest.mark.slow
@torch.no_grad()
def test_draft_greedy_agreement_well_above_chance(pair) -> None:
    """Teacher-forced along the target's greedy continuation of two chat prompts (one code, one prose):
    chance is about 1/49152; the shipped draft measures 0.37 on its held-out prompts (draft_report.json),
    and 0.32 (the previous draft) measured 14/48 on these two, so 0.15 is "well above chance" with room for floating-point noise."""
    target, draft, tok = pair
    agree = total = 0
    for text in ["Write a Python function that returns the sum of the squares of a list of numbers.",
                 "Give three tips for staying healthy."]:
        ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                      return_tensors="pt", return_dict=True)["input_ids"]
        P = ids.shape[1]
        out = target.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=24,
                              do_sample=False, pad_token_id=tok.pad_token_id)
        at = target(input_ids=out).logits[0, P - 1:-1].argmax(-1)
        ad = draft(input_ids=out).logits[0, P - 1:-1].argmax(-1)
        agree += int((at == ad).sum())
        total += at.numel()
    assert agree / total >= 0.15, f"greedy agreement {agree}/{total}"


GREEDY_PROMPTS = ["Write a Python function that checks whether a number is prime.",
                  "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May."
                  " How many clips did Natalia sell altogether in April and May?",
                  "Give three tips for staying healthy."]
GREEDY_SETTINGS = [("sd", 1, 4), ("bv", 1, 4), ("gbv", 1, 4), ("spectr", 3, 4), ("spectr_gbv", 3, 4), ("mdbv", 3, 4)]
LOGIT_TIE = 1e-3  # top-two logit gap below which float32 kernels with other matrix shapes may flip the argmax


@pytest.mark.slow
@torch.no_grad()
def test_every_method_equals_greedy_on_the_default_pair(pair) -> None:
    """At T = 0 every method must emit the target's autoregressive greedy tokens (3 prompts x 32 tokens).

    The target computes in float32 and a K-row verification pass multiplies matrices of other shapes than
    a one-token decode step, so an exact tie can break differently.  Where a method's tokens differ, the
    test checks that the first difference is such a tie -- the target's two largest logits at that
    position (one fresh full-prefix pass) within LOGIT_TIE, and both emitted tokens among those two --
    and fails otherwise.  Only the first difference can be judged: after it the prefixes differ."""
    import mdv
    from mdv.models import HFModel

    target_lm, draft_lm, tok = pair
    target, draft = HFModel(target_lm, tok), HFModel(draft_lm, tok)
    identical = ties = 0
    for text in GREEDY_PROMPTS:
        ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                      return_tensors="pt", return_dict=True)["input_ids"][0].tolist()
        greedy = mdv.generate(target, None, ids, "ar", temperature=0.0, max_new_tokens=32, eos_token_id=[]).tokens
        assert len(greedy) == 32
        for method, K, L in GREEDY_SETTINGS:
            got = mdv.generate(target, draft, ids, method, K=K, L=L, temperature=0.0, max_new_tokens=32,
                               eos_token_id=[]).tokens
            assert len(got) == 32, (method, len(got))
            if got == greedy:
                identical += 1
                continue
            i = next(j for j, (a, b) in enumerate(zip(got, greedy)) if a != b)
            logits = target_lm(input_ids=torch.tensor([ids + greedy[:i]])).logits[0, -1].double()
            top2 = torch.topk(logits, 2)
            gap = float(top2.values[0] - top2.values[1])
            assert gap < LOGIT_TIE and {got[i], greedy[i]} == set(top2.indices.tolist()), (
                f"{method} K={K} L={L} differs from greedy at new token {i} ({got[i]} vs {greedy[i]}) but the"
                f" target's top-two logit gap there is {gap:.3g} (tokens {top2.indices.tolist()}): not a tie")
            ties += 1
    # a tie should be rare; if most runs diverge the test would only be checking ties
    assert identical >= len(GREEDY_PROMPTS) * len(GREEDY_SETTINGS) - 3, f"{identical} identical, {ties} ties"
