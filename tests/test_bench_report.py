"""analysis.bench_report: the bench report built from real ``mdv.bench`` records.

The records are produced by running every benchmark in-process (``mdv.bench.run``, which writes
``bench_<name>.json`` exactly as ``experiments.bench`` does) on the tiny random model pair at tiny sizes; the
tests then check that the Markdown tables carry the records' numbers (re-formatted and, for the derived
figures, recomputed here by hand), that the goal verdicts are the records' own, that the plots are real PNG
images, that the newest record of each benchmark wins across folders, that missing benchmarks and skipped
plots are reported, and that bad input gives one ``error:`` line and exit status 2.  No timing is asserted.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from analysis.bench_report import main
from mdv import bench
from mdv.bench import (Benchmark, BenchConfig, E2EBench, MemoryBench, OracleBench, PairKind, TargetPassBench, TinyPair,
                       VerifierBench)
from mdv.bench.report import BENCHMARKS, SECTIONS
from mdv.bench import AuditBench, HFCompareBench, PairedBench, PassLimitBench

REPO = Path(__file__).resolve().parents[1]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TINY = TinyPair(vocab_size=32, hidden_size=16, num_layers=1, seed=0)


def tiny_config() -> BenchConfig:
    """Every benchmark at tiny sizes on the tiny random pair (a few seconds in all)."""
    return BenchConfig(
        benchmarks=list(Benchmark), threads=1, tiny=TINY,
        verifier=VerifierBench(methods=["sd", "bv", "gbv", "spectr", "spectr_gbv", "mdbv"], vocab_sizes=[16, 64, 256],
                               K=[1, 2], L=[2, 3], repeats=2, warmup=1, device="cpu", step_pair=PairKind.tiny_random,
                               step_context=4, step_calls=1, goal_V=64, goal_K=2, goal_L=3),
        target_pass=TargetPassBench(pair=PairKind.tiny_random, K=3, L=3, context=6, shared=1, repeats=2, warmup=1),
        pass_limit=PassLimitBench(pair=PairKind.tiny_random, n=[1, 3], threads=[1], context=4, repeats=2,
                                  bandwidth_megabytes=8, gemm_size=64, packed=True),
        e2e=E2EBench(pair=PairKind.tiny_random, datasets=[], n_prompts=3, max_new_tokens=4, temperatures=[0.0, 0.4],
                     methods=["sd", "spectr", "mdbv"], K=[1, 2], L=[1, 2], goal_temperature=0.4),
        oracle=OracleBench(vocab_sizes=[2], max_K=2, max_L=2, methods=["sd", "spectr", "mdbv"], mc_V=2, mc_K=2, mc_L=2,
                           mc_trials=500, mc_repeats=2),
        memory=MemoryBench(pair=PairKind.tiny_random, method="mdbv", K=2, L=2, n_prompts=6, max_new_tokens=2,
                           datasets=[], warmup_prompts=2, tensor_count_every=2),
        paired=PairedBench(pair="tiny_random", datasets=["humaneval"], n_prompts=2, n_tokens=8, stride=4, K_max=2,
                           L_max=2),
        audit=AuditBench(cases="smoke", methods=["sd", "spectr"], instances=2000, repeats=2, detection_rules=["sd"],
                         detection_cases=["smoke-rand-V3-K1-L1"], epsilon=0.05),
        hf_compare=HFCompareBench(pair=PairKind.tiny_random, datasets=[], n_prompts=2, max_new_tokens=3,
                                  contenders=["hf_plain", "hf_prompt_lookup", "mdv_ar", "mdv_sd_ngram"]))


@pytest.fixture(scope="module")
def records_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bench") / "2026-01-01_00-00-00"
    threads = torch.get_num_threads()
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            bench.run(tiny_config(), out)
    finally:
        torch.set_num_threads(threads)
    assert sorted(p.name for p in out.glob("bench_*.json")) == sorted(f"bench_{b}.json" for b in BENCHMARKS)
    return out


def records(folder: Path) -> dict[str, dict]:
    return {json.loads(p.read_text())["benchmark"]: json.loads(p.read_text()) for p in folder.glob("bench_*.json")}


def run_main(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([str(a) for a in args])
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def report(records_dir, tmp_path_factory) -> tuple[str, str, Path]:
    out = tmp_path_factory.mktemp("report")
    rc, stdout, stderr = run_main(records_dir, "--out", out)
    assert rc == 0, stderr
    assert stderr == ""  # nothing skipped, nothing warned
    return (out / "bench_report.md").read_text(), stdout, out


# ------------------------------------------------------------------------------------------ helpers
def f(x, digits: int = 3) -> str:
    """The number format the report promises: ``digits`` significant digits, 3-digit exponent form from 1e5."""
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{digits}g}" if abs(x) < 1e5 else f"{x:.3e}"
    return str(x)


def spread_str(s: dict, percent: bool = False) -> str:
    g = (lambda v: f"{100 * v:.3g}%") if percent else f
    return f"{g(s['median'])} [{g(s['min'])}, {g(s['max'])}]"


def table_after(md: str, start: str) -> list[dict[str, str]]:
    """The rows (header -> cell) of the first Markdown table after the first line starting with ``start``."""
    lines = md.splitlines()
    i = next(k for k, line in enumerate(lines) if line.startswith(start))
    while not lines[i].startswith("|"):
        i += 1
    header = [c.strip() for c in lines[i].strip().strip("|").split(" | ")]
    rows = []
    for line in lines[i + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        assert len(cells) == len(header), line
        rows.append(dict(zip(header, cells)))
    return rows


def is_png(path: Path) -> bool:
    import matplotlib.image as mpimg

    if not path.is_file() or path.read_bytes()[:8] != PNG_MAGIC:
        return False
    h, w = mpimg.imread(path).shape[:2]
    return h >= 200 and w >= 300


def copy_record(src: Path, dst_dir: Path, edit=None) -> Path:
    dst_dir.mkdir(parents=True, exist_ok=True)
    data = json.loads(src.read_text())
    if edit is not None:
        edit(data)
    path = dst_dir / src.name
    path.write_text(json.dumps(data))
    return path


# ------------------------------------------------------------------------------------------ tests
def test_every_benchmark_has_a_report_section() -> None:
    assert set(SECTIONS) == set(BENCHMARKS) == {b.value for b in Benchmark}


def test_environment_and_goals_come_from_the_records(report, records_dir) -> None:
    md, _, _ = report
    recs = records(records_dir)
    env_rows = {r["benchmark"]: r for r in table_after(md, "## Environment")}
    assert set(env_rows) == set(BENCHMARKS)
    for b, rec in recs.items():
        env, row = rec["environment"], env_rows[b]
        assert (row["CPU"], row["threads"], row["torch"], row["dtype"], row["device"]) == (
            env["cpu"], str(env["threads"]), env["torch"], env["dtype"], env["device"])
        assert row["load avg 1 / 5 / 15"] == " / ".join(f(x) for x in env["loadavg_1_5_15"])
    goal_rows = table_after(md, "## Goals")
    expected = []
    for b in BENCHMARKS:
        for g in recs[b]["goals"]:
            op = "≤" if g["at_most"] else "≥"
            expected.append({"benchmark": b, "goal": g["goal"],
                             "measured": "-" if g["value"] is None else f"{f(g['value'], 4)}{g['unit']}",
                             "limit": f"{op} {f(g['limit'], 4)}{g['unit']}",
                             "verdict": {True: "**met**", False: "**missed**", None: "not measured"}[g["met"]],
                             "note": g["why"] or ""})
    assert goal_rows == expected
    met = sum(g["met"] is True for r in recs.values() for g in r["goals"])
    missed = sum(g["met"] is False for r in recs.values() for g in r["goals"])
    assert f"{met} met, {missed} missed, {len(expected) - met - missed} not measured." in md


def test_goal_verdict_is_the_records_own(records_dir, tmp_path) -> None:
    """Flip one recorded verdict: the report follows the record (it does not re-judge the numbers)."""
    src = records_dir / "bench_target_pass.json"
    orig = json.loads(src.read_text())["goals"][0]

    def flip(d):
        d["goals"][0]["met"] = not orig["met"]

    copy_record(src, tmp_path / "run")
    copy_record(src, tmp_path / "flipped", flip)
    verdicts = []
    for folder in ("run", "flipped"):
        rc, _, _ = run_main(tmp_path / folder, "--out", tmp_path / f"out_{folder}")
        assert rc == 0
        rows = table_after((tmp_path / f"out_{folder}" / "bench_report.md").read_text(), "## Goals")
        verdicts.append(next(r["verdict"] for r in rows if r["goal"] == orig["goal"]))
    assert verdicts == [{True: "**met**", False: "**missed**"}[orig["met"]],
                        {True: "**met**", False: "**missed**"}[not orig["met"]]]


def test_verifier_tables(report, records_dir) -> None:
    md, _, _ = report
    rec = records(records_dir)["verifier"]
    by_cell = {(r["V"], r["K"], r["L"], r["method"]): r for r in rec["results"]}
    grid = table_after(md, "### Full grid")
    assert len(grid) == len(rec["results"])
    row = next(g for g in grid if (g["V"], g["K"], g["L"], g["method"]) == ("64", "2", "3", "mdbv"))
    r = by_cell[(64, 2, 3, "mdbv")]
    assert row["ms / call"] == spread_str(r["ms"])
    assert row["of a target step"] == spread_str(r["step_fraction"], percent=True)
    assert row["× spectr"] == spread_str(r["vs_spectr"])
    # the K=4, L=8 default is not in this grid: the nearest cell (K=2, L=3) is shown, and said so
    assert "### ms per call (share of a target step) at K=2, L=3 (K=4 not in the grid [1, 2]: K=2 shown;" \
           " L=8 not in the grid [2, 3]: L=3 shown)" in md
    pivot = {p["method"]: p for p in table_after(md, "### ms per call")}
    assert list(pivot) == ["sd (K=1)", "spectr (K=2)", "bv (K=1)", "gbv (K=1)", "mdbv (K=2)", "spectr_gbv (K=2)"]
    for label, key in (("mdbv (K=2)", (256, 2, 3, "mdbv")), ("sd (K=1)", (256, 1, 3, "sd"))):  # single-draft: K = 1
        c = by_cell[key]
        assert pivot[label]["V=256"] == f"{f(c['ms']['median'])} ({100 * c['step_fraction']['median']:.3g}%)"


def test_e2e_tables_and_best_setting_recomputed(report, records_dir) -> None:
    md, _, _ = report
    rec = records(records_dir)["e2e"]
    for T in (0.0, 0.4):
        rows = table_after(md, f"### T = {f(T)}")
        mine = [r for r in rec["results"] if r["temperature"] == T]
        assert len(rows) == len(mine)
        row = next(x for x in rows if (x["method"], x["K"], x["L"]) == ("spectr", "2", "2"))
        r = next(x for x in mine if (x["method"], x["K"], x["L"]) == ("spectr", 2, 2))
        assert row["speedup vs AR"] == spread_str(r["speedup"])
        assert row["tokens/s"] == spread_str(r["tokens_per_second"])
        assert row["block eff."] == f(r["block_efficiency"])
        assert row["draft"] == f"{100 * r['time_split']['draft']:.2g}%"
        # by hand: each method's setting with the highest median speedup
        best = {}
        for x in mine:
            if x["method"] != "ar" and (x["method"] not in best
                                        or x["speedup"]["median"] > best[x["method"]]["speedup"]["median"]):
                best[x["method"]] = x
        shown = {b["method"]: b for b in table_after(md, f"Best setting per method at T = {f(T)}")}
        assert set(shown) == {"sd", "spectr", "mdbv"}
        for m, x in best.items():
            assert (shown[m]["K"], shown[m]["L"], shown[m]["speedup vs AR"]) == (str(x["K"]), str(x["L"]),
                                                                                 spread_str(x["speedup"]))


def test_target_pass_oracle_memory_tables(report, records_dir) -> None:
    md, _, _ = report
    recs = records(records_dir)
    tp = recs["target_pass"]["results"]
    rows = {r["pass"]: r for r in table_after(md, "## target_pass")}
    k_rows = rows["K full rows (fork + pass + keep; target_pass=rows)"]
    assert (k_rows["tokens"], k_rows["ms"], k_rows["× single"]) == (
        str(tp["K"] * (tp["L"] + 1)), spread_str(tp["ms"]["k_rows"]), spread_str(tp["k_rows_vs_single"]))
    assert rows["token tree (shared prefixes once; the engine's default)"]["tokens"] == str(tp["tree_nodes"])
    pl = recs["pass_limit"]["results"]["per_threads"][0]
    passes = table_after(md, f"### {pl['threads']} thread(s): read bandwidth")
    assert [(r["n new tokens"], r["pack rows"], r["packed ms"], r["packed ÷ plain"]) for r in passes] == [
        (str(r["n"]), str(r["pack_rows"]), spread_str(r["packed_ms"]), spread_str(r["packed_vs_plain"]))
        for r in pl["passes"]]
    mc = {r["method"]: r for r in table_after(md, "Monte-Carlo throughput")}
    for r in recs["oracle"]["results"]["monte_carlo"]:
        assert mc[r["method"]]["trials / s"] == spread_str(r["trials_per_second"])
    exact = table_after(md, "Exact enumeration")
    assert [(e["function"], e["seconds"]) for e in exact] == [(r["function"], f(r["seconds"]))
                                                              for r in recs["oracle"]["results"]["exact"]]
    mem = recs["memory"]["results"]
    figs = {r["figure"]: r["value"] for r in table_after(md, "## memory")}
    assert figs["peak RSS (MiB), since the start of the run"] == f(mem["peak_rss_mib"], 5)
    assert figs["RSS growth, end − after the warm-up (MiB)"] == f(mem["rss_endpoint_growth_mib"])
    assert figs["live tensors (prompt: count)"] == ", ".join(f"{i}: {n}" for i, n in mem["live_tensors"])


def test_plots_are_png_images(report) -> None:
    md, stdout, out = report
    for name in ("verify_cost_vs_vocab", "e2e_speedup_vs_L", "e2e_time_split"):
        assert is_png(out / f"{name}.png"), name
        assert f"- `{name}.png`: " in md
        assert f"  {name}.png: " in stdout and "skipped" not in stdout
    assert "Missing benchmarks" not in md and "missing benchmark" not in stdout


def test_real_blocks_are_named_and_one_vocabulary_is_drawn_as_bars(tmp_path) -> None:
    cfg = BenchConfig(benchmarks=[Benchmark.verifier], threads=1, tiny=TINY, verifier=VerifierBench(
        methods=["sd", "spectr", "select_gbv"], K=[1, 2], L=[2], repeats=1, warmup=0, draws=1, device="cpu",
        step_pair=PairKind.tiny_random, step_context=4, step_calls=1, blocks="real", real_contexts=2,
        real_datasets=["gsm8k"]))
    records = tmp_path / "2026-01-02_00-00-00"
    threads = torch.get_num_threads()
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            bench.run(cfg, records)
    finally:
        torch.set_num_threads(threads)
    rc, stdout, stderr = run_main(records, "--out", tmp_path / "report")
    assert rc == 0, stderr
    md = (tmp_path / "report" / "bench_report.md").read_text()
    assert "`Verifier.sample` on 2 real blocks of the tiny_random pair at T = 0.4" in md
    assert is_png(tmp_path / "report" / "verify_cost_vs_vocab.png")
    assert f"verifier cost at V={TINY.vocab_size}, K=2, L=2 on 2 real blocks of the tiny_random pair at T = 0.4" in stdout


def test_newest_record_wins_in_any_folder_order(records_dir, tmp_path) -> None:
    src = records_dir / "bench_e2e.json"

    def older(d):  # a day older, with a figure that must not reach the report
        d["environment"]["timestamp"] = "2000-01-01T00:00:00+00:00"
        for r in d["results"]:
            r["speedup"]["median"] = 42.4242

    copy_record(src, tmp_path / "old", older)
    copy_record(src, tmp_path / "new")
    for order in (("old", "new"), ("new", "old")):
        out = tmp_path / f"out_{'_'.join(order)}"
        rc, stdout, _ = run_main(*(tmp_path / o for o in order), "--out", out)
        assert rc == 0
        md = (out / "bench_report.md").read_text()
        assert "42.4 [" not in md
        recs = {r["file"]: r["record"] for r in table_after(md, "## Records")}
        assert [rec for file, rec in recs.items() if "/old/" in file] == ["superseded (ok)"]
        assert [rec for file, rec in recs.items() if "/new/" in file] == ["used"]
    # the other way round, the edited record is the newest and its figure is shown
    copy_record(tmp_path / "old" / "bench_e2e.json", tmp_path / "newest",
                lambda d: d["environment"].update(timestamp="2099-01-01T00:00:00+00:00"))
    rc, _, _ = run_main(tmp_path / "new", tmp_path / "newest", "--out", tmp_path / "out3")
    assert rc == 0 and "42.4 [" in (tmp_path / "out3" / "bench_report.md").read_text()


def test_parent_folder_is_searched_one_level_down(records_dir, tmp_path) -> None:
    shutil.copytree(records_dir, tmp_path / "bench" / "run1")
    (tmp_path / "bench" / "empty_run").mkdir()
    rc, stdout, stderr = run_main(tmp_path / "bench", "--out", tmp_path / "out")
    assert rc == 0 and stderr == ""
    assert f"{len(BENCHMARKS)} benchmark(s) from {len(BENCHMARKS)} file(s)" in stdout


def test_missing_benchmarks_and_skipped_plots_are_reported(records_dir, tmp_path) -> None:
    copy_record(records_dir / "bench_oracle.json", tmp_path / "only_oracle")
    out = tmp_path / "out"
    rc, stdout, _ = run_main(tmp_path / "only_oracle", "--out", out)
    assert rc == 0
    for b in ("verifier", "target_pass", "e2e", "memory"):
        assert f"missing benchmark {b} (no record)" in stdout
    assert "missing benchmark oracle" not in stdout
    assert "verify_cost_vs_vocab.png: skipped (no verifier record)" in stdout
    assert "e2e_speedup_vs_L.png: skipped (no e2e record)" in stdout
    assert "e2e_time_split.png: skipped (no e2e record)" in stdout
    assert list(out.glob("*.png")) == []
    md = (out / "bench_report.md").read_text()
    assert "Missing benchmarks (no usable record): `verifier`, `target_pass`, `pass_limit`, `draft_step`, `e2e`, `memory`, `paired`, `audit`, `hf_compare`." in md
    assert "## oracle" in md and "## e2e" not in md


def test_e2e_without_time_split_and_a_skipped_record(records_dir, tmp_path) -> None:
    def no_split(d):
        for r in d["results"]:
            del r["time_split"]

    copy_record(records_dir / "bench_e2e.json", tmp_path / "run", no_split)
    copy_record(records_dir / "bench_verifier.json", tmp_path / "run",
                lambda d: d.update(status="skipped", reason="default target unavailable: test", results=[]))
    out = tmp_path / "out"
    rc, stdout, _ = run_main(tmp_path / "run", "--out", out)
    assert rc == 0
    assert "e2e_time_split.png: skipped (the e2e record has no time_split)" in stdout
    assert "verify_cost_vs_vocab.png: skipped (the verifier record was skipped: default target unavailable: test)" \
           in stdout
    assert "missing benchmark verifier (record skipped: default target unavailable: test)" in stdout
    assert is_png(out / "e2e_speedup_vs_L.png") and not (out / "e2e_time_split.png").exists()
    assert "draft" not in table_after((out / "bench_report.md").read_text(), "### T = 0.4")[0]


def test_bad_input_gives_one_error_line_and_exit_2(tmp_path) -> None:
    """Run as a user would (a subprocess, so a traceback would show): a folder with no record."""
    (tmp_path / "empty").mkdir()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("MDV_FULL_ERROR", None)
    env.pop("HYDRA_FULL_ERROR", None)
    proc = subprocess.run([sys.executable, "-m", "analysis.bench_report", str(tmp_path / "empty")], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: no bench_*.json record in"), proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""


@pytest.mark.parametrize("case", ["missing_folder", "truncated", "wrong_shape", "bad_K", "out_is_a_file"])
def test_bad_input_cases(records_dir, tmp_path, case) -> None:
    run = tmp_path / "run"
    args: list = [run]
    if case == "missing_folder":
        args = [tmp_path / "nope"]
        want = "does not exist"
    elif case == "truncated":
        run.mkdir()
        (run / "bench_e2e.json").write_text((records_dir / "bench_e2e.json").read_text()[:200])
        want = "bench_e2e.json: not valid JSON"
    elif case == "wrong_shape":
        copy_record(records_dir / "bench_verifier.json", run, lambda d: d.update(results=[{"V": "big"}]))
        want = "bench_verifier.json: results[0]: 'V' must be an integer"
    elif case == "bad_K":
        copy_record(records_dir / "bench_verifier.json", run)
        args += ["--K", "0"]
        want = "K must be an integer >= 1"
    else:
        copy_record(records_dir / "bench_verifier.json", run)
        (tmp_path / "file").write_text("x")
        args += ["--out", tmp_path / "file"]
        want = "cannot write the bench report"
    rc, stdout, stderr = run_main(*args)
    assert rc == 2
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and want in lines[0], stderr
    assert stdout == ""


def test_corrupt_files_among_good_ones_warn_and_go_on(records_dir, tmp_path) -> None:
    run = tmp_path / "run"
    copy_record(records_dir / "bench_verifier.json", run)
    (run / "bench_e2e.json").write_text("{\"schema\": \"mdv.bench/1\", ")
    copy_record(records_dir / "bench_oracle.json", run, lambda d: d.update(results="x"))
    (run / "bench_memory.json").write_text("[1, 2]")
    (tmp_path / "empty").mkdir()
    out = tmp_path / "out"
    rc, stdout, stderr = run_main(run, tmp_path / "empty", "--out", out)
    assert rc == 0
    lines = stderr.strip().splitlines()
    assert len(lines) == 4 and all(line.startswith("warning: ") for line in lines), stderr
    for name in ("bench_e2e.json", "bench_oracle.json", "bench_memory.json", "empty"):
        assert sum(name in line for line in lines) == 1, name
    md = (out / "bench_report.md").read_text()
    assert "Missing benchmarks (no usable record): `target_pass`, `pass_limit`, `draft_step`, `e2e`, `oracle`, `memory`, `paired`, `audit`, `hf_compare`." in md
    assert "## Warnings" in md and "bench_e2e.json: not valid JSON" in md
    assert is_png(out / "verify_cost_vs_vocab.png")
