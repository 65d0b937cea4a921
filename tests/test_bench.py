"""The benchmarks of ``experiments/bench`` run end to end at tiny sizes (a tiny random model pair, tiny
grids): every record has the documented fields, its ratios are finite, and the tree-attention pass scores
what the K full rows score.  No timing is asserted: speed is only ever reported."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mdv import bench
from mdv.bench import (E2EBench, MemoryBench, OracleBench, PairKind, TargetPassBench, TinyPair, VerifierBench,
                       interleaved, largest_size, spread, write_json)
from mdv.errors import InvalidInputError

ROOT = Path(__file__).resolve().parent.parent
TINY = TinyPair(vocab_size=32, hidden_size=16, num_layers=1, seed=0)
ENV_KEYS = {"cpu", "logical_cores", "threads", "torch", "transformers", "dtype", "device", "mdv", "python",
            "loadavg_1_5_15", "timestamp"}
RECORD_KEYS = {"schema", "benchmark", "status", "reason", "config", "environment", "results", "summary", "goals",
               "wall_seconds", "note"}


@pytest.fixture(scope="module")
def tiny_pair():
    return bench.load_pair(torch.device("cpu"), PairKind.tiny_random, TINY)


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def _check_spread(s: dict, n: int, positive: bool = True) -> None:
    assert s["n"] == n
    assert all(_finite(s[k]) for k in ("median", "min", "max")), s
    assert s["min"] <= s["median"] <= s["max"]
    if positive:
        assert s["min"] > 0


def _check_record(rec: dict, name: str, tmp_path: Path) -> dict:
    assert RECORD_KEYS <= set(rec), set(rec) ^ RECORD_KEYS
    assert rec["schema"] == bench.SCHEMA and rec["benchmark"] == name and rec["status"] == "ok"
    assert ENV_KEYS <= set(rec["environment"])
    assert rec["environment"]["threads"] == torch.get_num_threads()
    for g in rec["goals"]:
        assert {"goal", "value", "limit", "met"} <= set(g)
    # strict JSON round trip (NaN would become null)
    path = write_json(tmp_path / f"bench_{name}.json", rec)
    back = json.loads(path.read_text())
    assert back["benchmark"] == name
    return back


# ------------------------------------------------------------------------------------------ helpers
def test_spread_and_interleaving() -> None:
    assert spread([3.0, 1.0, 2.0, float("nan")]) == {"median": 2.0, "min": 1.0, "max": 3.0, "n": 3}
    assert spread([])["n"] == 0 and math.isnan(spread([])["median"])
    calls: list[str] = []
    fns = {n: (lambda n=n: calls.append(n)) for n in "abc"}
    times = interleaved(fns, repeats=3, warmup=1)
    assert {k: len(v) for k, v in times.items()} == {"a": 3, "b": 3, "c": 3}
    # warm-up round in order, then one call each per round in a rotated order
    assert calls == list("abc") + list("abc") + list("bca") + list("cab")


def test_last_level_cache_size_from_sysfs_and_the_evictor(tmp_path: Path) -> None:
    """The largest level's size is read from index*/level and size (K and M suffixes); an unreadable tree
    gives the default; the evictor's buffer is twice that and each call writes every element once."""
    from mdv.bench.timing import DEFAULT_LLC_BYTES, CacheEvictor, last_level_cache_bytes

    for i, (level, size) in enumerate([(1, "32K"), (2, "512K"), (3, "16M"), (1, "32K")]):
        (tmp_path / f"index{i}").mkdir()
        (tmp_path / f"index{i}" / "level").write_text(f"{level}\n")
        (tmp_path / f"index{i}" / "size").write_text(f"{size}\n")
    assert last_level_cache_bytes(tmp_path) == 16 << 20
    (tmp_path / "index2" / "size").write_text("garbage\n")
    assert last_level_cache_bytes(tmp_path) == DEFAULT_LLC_BYTES
    assert last_level_cache_bytes(tmp_path / "absent") == DEFAULT_LLC_BYTES
    evict = CacheEvictor(nbytes=4096)
    assert evict.nbytes == 4096 and evict._buf.numel() == 1024
    evict()
    evict()
    assert bool((evict._buf == 2).all())


def test_largest_size_respects_the_ceiling() -> None:
    assert largest_size(4, 3, 3, lambda K, L: 4 ** (K * L) <= 300_000) == (3, 3)
    assert largest_size(5, 3, 3, lambda K, L: 5 ** (K * L) <= 300_000) in {(3, 2), (2, 3)}
    assert largest_size(5, 3, 3, lambda K, L: 5 ** (K * L) <= 300_000, multi_draft=False) == (1, 3)
    assert largest_size(3, 3, 3, lambda K, L: False) is None


# ------------------------------------------------------------------------------------------ benchmarks
def test_verifier_benchmark_tiny(tiny_pair, tmp_path) -> None:
    cfg = VerifierBench(methods=["sd", "gbv", "spectr", "spectr_gbv", "mdbv"], vocab_sizes=[16], K=[1, 2], L=[2, 3],
                        repeats=2, warmup=1, device="cpu", step_context=4, step_calls=1, goal_V=16, goal_K=2, goal_L=3)
    rec = _check_record(bench.run_verifier(cfg, target=tiny_pair[0]), "verifier", tmp_path)
    cells = {(r["V"], r["K"], r["L"], r["method"]) for r in rec["results"]}
    # single-draft methods only at K = 1; multi-draft methods at every K
    assert cells == {(16, K, L, m) for L in (2, 3) for K, ms in ((1, ("sd", "gbv", "spectr", "spectr_gbv", "mdbv")),
                                                                 (2, ("spectr", "spectr_gbv", "mdbv"))) for m in ms}
    for r in rec["results"]:
        _check_spread(r["ms"], 2)
        _check_spread(r["step_fraction"], 2)
        if r["method"] != "spectr":
            _check_spread(r["vs_spectr"], 2)
    _check_spread(rec["summary"]["target_step_ms"], 2)
    assert {g["met"] for g in rec["goals"]} <= {True, False}  # every goal measured
    assert any("spectr_gbv verification" in g["goal"] for g in rec["goals"])


def test_verifier_benchmark_without_a_target_reports_no_fraction(tmp_path) -> None:
    cfg = VerifierBench(methods=["sd"], vocab_sizes=[8], K=[1], L=[2], repeats=1, warmup=0, device="cpu",
                        target_step=False)
    rec = bench.run_verifier(cfg)
    assert rec["results"][0]["step_fraction"]["n"] == 0  # no yardstick: no ratio, and no made-up number
    assert rec["summary"]["target_step_reason"] == "verifier.target_step=false"
    assert rec["goals"][0]["met"] is None
    _check_spread(rec["results"][0]["ms"], 1)


def test_verifier_ratio_to_spectr_is_the_per_call_ratio(monkeypatch) -> None:
    # every timed call makes draws sample calls per method: "x spectr" is the ratio of the two methods' times,
    # not of one method's per-call time to spectr's per-timed-call time (which shrank it draws-fold)
    per_timed_call = {"spectr": 0.012, "mdbv": 0.003, "select_gbv": 0.048}
    monkeypatch.setattr("mdv.bench.verifier.time_call", lambda fn, sync: per_timed_call[fn.args[0].name])
    cfg = VerifierBench(methods=list(per_timed_call), vocab_sizes=[8], K=[2], L=[2], repeats=2, warmup=0, draws=3,
                        device="cpu", target_step=False)
    rec = bench.run_verifier(cfg)
    rows = {r["method"]: r for r in rec["results"]}
    for m, t in per_timed_call.items():
        assert rows[m]["ms"]["median"] == pytest.approx(1e3 * t / 3)  # per sample call
        if m != "spectr":
            assert rows[m]["vs_spectr"]["median"] == pytest.approx(t / per_timed_call["spectr"])
    assert rows["select_gbv"]["vs_spectr"]["median"] == pytest.approx(4.0)


def test_real_blocks_come_from_the_pair(tiny_pair) -> None:
    target, draft, tok = tiny_pair
    blocks, label = bench.real_blocks(target, draft, tok, K=3, L=4, contexts=2, datasets=["gsm8k"], temperature=0.7,
                                      seed=5)
    assert len(blocks) == 2 and "gsm8k" in label
    for b in blocks:
        b.validate()
        assert tuple(b.tokens.shape) == (1, 3, 4) and b.V == TINY.vocab_size
        assert b.p.dtype == b.q.dtype == torch.float64
        # every drafted token has positive draft mass, and all drafts start from the one context
        assert bool((b.q.gather(-1, b.tokens.unsqueeze(-1)) > 0).all())
        assert torch.equal(b.p[0, :, 0], b.p[0, :1, 0].expand(3, -1))
        assert torch.equal(b.q[0, :, 0], b.q[0, :1, 0].expand(3, -1))
    again, _ = bench.real_blocks(target, draft, tok, K=3, L=4, contexts=2, datasets=["gsm8k"], temperature=0.7, seed=5)
    assert all(torch.equal(a.tokens, b.tokens) and torch.equal(a.p, b.p) for a, b in zip(blocks, again))  # seeded


def test_verifier_benchmark_on_real_blocks(tmp_path) -> None:
    cfg = VerifierBench(methods=["sd", "spectr", "select_gbv"], K=[1, 2], L=[2, 3], blocks="real",
                        step_pair="tiny_random", real_contexts=2, real_datasets=["gsm8k", "humaneval"], repeats=2,
                        warmup=0, draws=1, device="cpu", step_context=4, step_calls=1)
    rec = _check_record(bench.run_verifier(cfg, tiny=TINY), "verifier", tmp_path)
    V = TINY.vocab_size  # the pair's vocabulary, not verifier.vocab_sizes
    assert {(r["V"], r["K"], r["L"], r["method"]) for r in rec["results"]} == {
        (V, K, L, m) for L in (2, 3) for K, ms in ((1, ("sd", "spectr", "select_gbv")), (2, ("spectr", "select_gbv")))
        for m in ms}
    for r in rec["results"]:
        _check_spread(r["ms"], 2)
        _check_spread(r["step_fraction"], 2)
    blocks = rec["summary"]["blocks"]
    assert blocks["source"] == "real" and blocks["contexts"] == 2 and blocks["pair"] == "tiny_random"
    assert blocks["temperature"] == 0.4 and (blocks["K_max"], blocks["L_max"]) == (2, 3)
    _check_spread(blocks["tree_prefixes"], 2)
    assert 3 <= blocks["tree_prefixes"]["min"] <= blocks["tree_prefixes"]["max"] <= 6  # L_max .. K_max L_max
    cfg.target_step, cfg.methods, cfg.K, cfg.L, cfg.repeats = False, ["sd"], [1], [2], 1
    rec = bench.run_verifier(cfg, tiny=TINY)  # the pair is loaded for its blocks, its step is not timed
    assert rec["results"][0]["step_fraction"]["n"] == 0 and rec["summary"]["target_step_ms"]["n"] == 0
    assert rec["summary"]["target_step_reason"] == "verifier.target_step=false"


def test_synthetic_block_is_valid_with_drafted_q_positive() -> None:
    gen = torch.Generator().manual_seed(0)
    block = bench.synthetic_block(50, 3, 4, generator=gen)
    assert block.tokens.shape == (1, 3, 4) and block.q.shape == (1, 3, 4, 50) and block.p.shape == (1, 3, 5, 50)
    assert (block.q.gather(-1, block.tokens.unsqueeze(-1)) > 0).all()
    assert torch.equal(block.q[0, 0, 0], block.q[0, 2, 0])  # one context: the first laws are shared


def test_interleaved_generations_rotates_the_cell_order() -> None:
    calls: list[tuple[str, int]] = []

    def run_cell(cell: str, i: int, ids: list[int]) -> dict:
        calls.append((cell, i))
        return {"cell": cell, "prompt": ids}

    stats = bench.interleaved_generations(["a", "b", "c"], [[1], [2], [3], [4]], run_cell)
    assert [c for c, _ in calls] == list("abc" "bca" "cab" "abc")
    assert [i for _, i in calls] == [0] * 3 + [1] * 3 + [2] * 3 + [3] * 3
    assert stats == {c: [{"cell": c, "prompt": [p]} for p in (1, 2, 3, 4)] for c in "abc"}


def test_benchmarks_load_models_in_the_configured_dtype(tmp_path) -> None:
    cfg = TargetPassBench(pair=PairKind.tiny_random, K=2, L=2, context=4, repeats=1, warmup=0)
    rec = bench.run_target_pass(cfg, tiny=TinyPair(), dtype="bfloat16")
    assert rec["environment"]["dtype"] == "bfloat16" and rec["status"] == "ok"
    assert rec["results"]["tree_max_abs_logit_diff"] < 0.5  # bfloat16 rounding, not a different model


def test_target_pass_benchmark_tiny(tiny_pair, tmp_path) -> None:
    cfg = TargetPassBench(pair=PairKind.tiny_random, K=3, L=3, context=6, shared=1, repeats=2, warmup=1)
    rec = _check_record(bench.run_target_pass(cfg, target=tiny_pair[0]), "target_pass", tmp_path)
    res = rec["results"]
    assert res["tree_nodes"] == 1 + 1 + 3 * 2  # pending, the shared first token, 2 more per draft
    for key in ("k_rows_vs_single", "tree_vs_single", "tree_vs_k_rows", "fork_keep_vs_single"):
        _check_spread(res[key], 2)
    # the engine's token tree scores exactly what the K full rows score (float32 rounding aside)
    assert res["tree_max_abs_logit_diff"] < 1e-3
    assert [g["goal"].split(" <=")[0] for g in rec["goals"]] == [
        "K=3, L=3 pass (engine, token tree)", "K=3, L=3 pass (K full rows, target_pass=rows)"]


def test_e2e_benchmark_tiny(tiny_pair, tmp_path) -> None:
    cfg = E2EBench(pair=PairKind.tiny_random, datasets=[], n_prompts=3, max_new_tokens=4, temperatures=[0.0, 0.4],
                   methods=["sd", "spectr"], K=[1, 2], L=[2], goal_temperature=0.4)
    rec = _check_record(bench.run_e2e(cfg, pair=tiny_pair), "e2e", tmp_path)
    cells = {(r["temperature"], r["method"], r["K"], r["L"]) for r in rec["results"]}
    assert cells == {(T, m, K, L) for T in (0.0, 0.4) for m, K, L in
                     (("ar", None, None), ("sd", 1, 2), ("spectr", 1, 2), ("spectr", 2, 2))}
    for r in rec["results"]:
        assert r["n_timed_prompts"] == 2  # prompt 0 is the warm-up
        _check_spread(r["speedup"], 2)
        _check_spread(r["tokens_per_second"], 2)
        if r["method"] == "ar":
            assert r["speedup"]["median"] == 1.0 and r["block_efficiency"] == 1.0
        else:
            assert 1.0 <= r["block_efficiency"] <= r["L"] + 1
        split = r["time_split"]
        assert all(_finite(v) and v >= 0 for v in split.values()) and sum(split.values()) == pytest.approx(1.0)
    assert rec["summary"]["prompts"].startswith("fixed list")
    assert [g["met"] is not None for g in rec["goals"]] == [True, True]  # best setting and sd at its best L


def test_e2e_packed_cells_run_beside_the_plain_ones(tiny_pair, tmp_path, monkeypatch) -> None:
    from mdv.bench.e2e import pack_size
    from mdv.bench.report.load import load_record
    from mdv.bench.report.sections import section_e2e
    from mdv.models import packed as packed_mod

    used: set[int] = set()  # the pack sizes the packed cells' products really ran on
    real = packed_mod._mkl_linear
    monkeypatch.setattr(packed_mod, "_mkl_linear", lambda x, pack, w, b, size: used.add(size) or real(x, pack, w, b, size))

    cfg = E2EBench(pair=PairKind.tiny_random, datasets=[], n_prompts=3, max_new_tokens=6, temperatures=[0.0],
                   methods=["sd", "spectr"], K=[1, 3], L=[2, 4], goal_temperature=0.0, packed=True, pack_cache=2)
    rec = _check_record(bench.run_e2e(cfg, pair=tiny_pair), "e2e", tmp_path)
    rows = {(r["method"], r["K"], r["L"], r["packed"]): r for r in rec["results"]}
    plain_cells = {("ar", None, None), ("sd", 1, 2), ("sd", 1, 4), ("spectr", 1, 2), ("spectr", 1, 4), ("spectr", 3, 2),
                   ("spectr", 3, 4)}
    assert set(rows) == {(*c, p) for c in plain_cells for p in (False, True)}
    # the rows each cell's packs serve: AR 1; K = 1: L + 1 rows; K = 3: a tree of up to K·L + 1 nodes; rounded up
    # to the rungs [1, 4, 8]
    assert {c: rows[(*c, True)]["pack_size"] for c in plain_cells} == {
        ("ar", None, None): 1, ("sd", 1, 2): 4, ("sd", 1, 4): 8, ("spectr", 1, 2): 4, ("spectr", 1, 4): 8,
        ("spectr", 3, 2): 8, ("spectr", 3, 4): 13}
    assert pack_size(("spectr", 3, 4, "model", True), False, [1, 4, 8]) == 15  # K full rows of L + 1
    for (m, K, L, packed), r in rows.items():
        if m == "ar":
            assert r["speedup"]["median"] == 1.0  # packed AR is the packed cells' baseline
        if packed:
            _check_spread(r["packed_speed_vs_plain"], 2)
            # T = 0: packed float32 rounding leaves the greedy tokens and so the acceptance unchanged here
            assert r["block_efficiency"] == rows[(m, K, L, False)]["block_efficiency"]
        else:
            assert "packed_speed_vs_plain" not in r
    assert used == {1, 4, 8, 13}
    assert not any("forward" in m.__dict__ for m in tiny_pair[0].model.modules())  # packs removed and freed
    text = "\n".join(section_e2e(load_record(tmp_path / "bench_e2e.json")))
    assert "| sd packed |" in text and "| ar packed |" in text, text


def test_e2e_crosses_every_drafter_with_every_method(tiny_pair, tmp_path) -> None:
    from mdv.bench.report.load import load_record
    from mdv.bench.report.sections import section_e2e

    cfg = E2EBench(pair=PairKind.tiny_random, datasets=[], n_prompts=2, max_new_tokens=4, temperatures=[0.4],
                   methods=["sd", "spectr"], K=[2], L=[2], drafters=["model", "ngram"],
                   drafter_options={"ngram": {"n_max": 2}}, goal_temperature=0.4)
    rec = _check_record(bench.run_e2e(cfg, pair=tiny_pair), "e2e", tmp_path)
    cells = {(r["method"], r["K"], r["drafter"]) for r in rec["results"]}
    assert cells == {("ar", None, None)} | {(m, K, d) for d in ("model", "ngram") for m, K in (("sd", 1), ("spectr", 2))}
    for r in rec["results"]:
        if r["method"] != "ar":
            assert 1.0 <= r["block_efficiency"] <= r["L"] + 1
    text = "\n".join(section_e2e(load_record(tmp_path / "bench_e2e.json")))
    for label in ("| sd |", "| spectr |", "| sd+ngram |", "| spectr+ngram |"):
        assert label in text, text


def test_e2e_drafter_that_cannot_run_on_the_pair_fails_before_any_generation(tiny_pair, capsys) -> None:
    cfg = E2EBench(pair=PairKind.tiny_random, datasets=[], n_prompts=2, max_new_tokens=2, methods=["sd"], K=[1],
                   L=[2], drafters=["model", "layerskip"], drafter_options={"layerskip": {"depth": 1}})
    with pytest.raises(Exception, match=r"'layerskip' needs a target with at least 2 layers .* this one has 1"):
        bench.run_e2e(cfg, pair=tiny_pair)
    assert "e2e generations" not in capsys.readouterr().err


def test_e2e_bad_drafter_is_one_clear_error_before_any_model_loads() -> None:
    from mdv.bench.config import BenchConfig, validate

    with pytest.raises(Exception, match=r"e2e.drafters: unknown drafter 'eagle3'; valid drafters are"):
        validate(BenchConfig(e2e=E2EBench(drafters=["eagle3"])))
    with pytest.raises(Exception, match=r"n_min=4 > n_max=2"):
        validate(BenchConfig(e2e=E2EBench(drafters=["ngram"], drafter_options={"ngram": {"n_min": 4, "n_max": 2}})))
    with pytest.raises(Exception, match=r"pack sizes must be integers >= 1"):
        validate(BenchConfig(e2e=E2EBench(packed=True, pack_rungs=[0, 4])))
    with pytest.raises(Exception, match=r"e2e.pack_cache must be >= 1"):
        validate(BenchConfig(e2e=E2EBench(packed=True, pack_cache=0)))


def test_e2e_packed_on_a_bfloat16_pair_fails_before_any_generation(capsys) -> None:
    pair = bench.load_pair(torch.device("cpu"), PairKind.tiny_random, TINY, dtype="bfloat16")
    cfg = E2EBench(pair=PairKind.tiny_random, datasets=[], n_prompts=2, max_new_tokens=2, methods=["sd"], K=[1],
                   L=[2], packed=True)
    with pytest.raises(Exception, match=r"packed linears are for float32 models on the CPU"):
        bench.run_e2e(cfg, pair=pair)
    assert "e2e generations" not in capsys.readouterr().err


def test_oracle_benchmark_tiny(tmp_path) -> None:
    cfg = OracleBench(vocab_sizes=[2], max_K=2, max_L=2, methods=["sd", "mdbv"], exact_law_max_tuples=16,
                      mc_V=2, mc_K=2, mc_L=2, mc_trials=3000, mc_repeats=2)
    rec = _check_record(bench.run_oracle(cfg), "oracle", tmp_path)
    exact = {(r["function"], r["method"]): r for r in rec["results"]["exact"]}
    assert set(exact) == {("iteration_law", "sd"), ("iteration_law", "mdbv"), ("exact_law", "sd"),
                          ("exact_law", "mdbv"), ("lp_valid", "-"), ("lp_greedy", "-")}
    assert (exact[("iteration_law", "mdbv")]["K"], exact[("iteration_law", "mdbv")]["L"]) == (2, 2)
    assert exact[("iteration_law", "sd")]["K"] == 1
    assert all(_finite(r["seconds"]) and r["seconds"] >= 0 for r in exact.values())
    mc = {r["method"]: r for r in rec["results"]["monte_carlo"]}
    assert set(mc) == {"sd", "mdbv"} and mc["mdbv"]["K"] == 2 and mc["sd"]["K"] == 1
    for r in mc.values():
        _check_spread(r["trials_per_second"], 2)


def test_pass_limit_benchmark_tiny(tiny_pair, tmp_path) -> None:
    cfg = bench.PassLimitBench(pair=PairKind.tiny_random, n=[1, 4], threads=[1], context=5, repeats=2,
                               bandwidth_megabytes=8, gemm_size=64)
    rec = _check_record(bench.run_pass_limit(cfg, target=tiny_pair[0]), "pass_limit", tmp_path)
    res = rec["results"]
    weights = [m.weight for m in tiny_pair[0].model.modules() if isinstance(m, torch.nn.Linear)]
    assert res["flops_per_token"] == 2 * sum(w.numel() for w in weights)  # the tiny pair's head is not tied
    assert res["weight_bytes"] == sum(w.numel() * w.element_size() for w in weights)
    (entry,) = res["per_threads"]
    assert entry["threads"] == 1 and [r["n"] for r in entry["passes"]] == [1, 4]
    for key in ("read_GBps", "gemm_GFLOPs"):
        _check_spread(entry[key], 2)
    for r in entry["passes"]:
        _check_spread(r["ms"], 2)
        bw, peak = entry["read_GBps"]["median"], entry["gemm_GFLOPs"]["median"]
        expect = 1e3 * max(res["weight_bytes"] / (bw * 1e9), r["n"] * res["flops_per_token"] / (peak * 1e9))
        assert r["limit_ms"] == pytest.approx(expect)
        assert r["vs_limit"]["median"] == pytest.approx(r["ms"]["median"] / r["limit_ms"])
    assert res["max_abs_prob_diff_cached_vs_full"] < 1e-5
    assert len(rec["goals"]) == 3 and all(g["met"] is not None for g in rec["goals"])
    assert all("packed_ms" not in r for r in entry["passes"])


def test_pass_limit_benchmark_packed_side_by_side(tiny_pair, tmp_path) -> None:
    cfg = bench.PassLimitBench(pair=PairKind.tiny_random, n=[1, 3], threads=[1], context=5, repeats=3,
                               bandwidth_megabytes=8, gemm_size=64, packed=True)
    rec = _check_record(bench.run_pass_limit(cfg, target=tiny_pair[0]), "pass_limit", tmp_path)
    res = rec["results"]
    for r in res["per_threads"][0]["passes"]:
        _check_spread(r["packed_ms"], 3)
        _check_spread(r["packed_vs_plain"], 3)
        assert r["packed_vs_limit"]["median"] == pytest.approx(r["packed_ms"]["median"] / r["limit_ms"])
        assert r["pack_bytes"] > 0 and r["packed_abs_prob_diff"] < 1e-6
        assert r["pack_rows"] == {1: 1, 3: 4}[r["n"]]  # the rungs [1, 4, 8]: 3 rows are padded to 4
    assert res["max_abs_prob_diff_packed_vs_plain"] < 1e-6
    # the plain goals, then one per packed pass and the packed p check
    assert len(rec["goals"]) == 3 + 3 and rec["goals"][-1]["met"] is True
    assert not any("forward" in m.__dict__ for m in tiny_pair[0].model.modules())


def _panels_available() -> bool:
    from mdv.models.panels import panel_kernel_status

    return panel_kernel_status()[0]


@pytest.mark.skipif(not _panels_available(), reason="the panel kernel needs AVX2, FMA and a C compiler")
def test_pass_limit_benchmark_packed_and_panels_side_by_side(tiny_pair, tmp_path) -> None:
    from mdv.bench.report.load import load_record
    from mdv.bench.report.sections import section_pass_limit

    cfg = bench.PassLimitBench(pair=PairKind.tiny_random, n=[1, 3], threads=[1, 2], context=5, repeats=3,
                               bandwidth_megabytes=8, gemm_size=64, packed=True, panels=True)
    rec = _check_record(bench.run_pass_limit(cfg, target=tiny_pair[0]), "pass_limit", tmp_path)
    res = rec["results"]
    for entry in res["per_threads"]:
        for r in entry["passes"]:
            for v in ("packed", "panels"):
                _check_spread(r[f"{v}_ms"], 3)
                _check_spread(r[f"{v}_vs_plain"], 3)
                assert r[f"{v}_vs_limit"]["median"] == pytest.approx(r[f"{v}_ms"]["median"] / r["limit_ms"])
                assert r[f"{v}_abs_prob_diff"] < 1e-6
    assert res["max_abs_prob_diff_panels_vs_plain"] < 1e-6
    assert res["panel_pack_bytes"] > 0
    # float32 rounding alone: both full passes are within float32 noise of the float64 one, and not equal to it
    assert 0 < res["max_abs_prob_diff_plain_vs_float64"] < 1e-5 and 0 < res["max_abs_prob_diff_panels_vs_float64"] < 1e-5
    # per thread count 2 plain goals, then per variant 2 x 2 passes and its p check; plus the cached-vs-full check
    assert len(rec["goals"]) == 4 + 1 + 2 * (4 + 1)
    assert [g["met"] for g in rec["goals"] if "p equal to the plain pass" in g["goal"]] == [True, True]
    assert not any("forward" in m.__dict__ for m in tiny_pair[0].model.modules())
    text = "\n".join(section_pass_limit(load_record(tmp_path / "bench_pass_limit.json")))
    assert "panels ÷ plain" in text and "Panels: the linears on 16-column weight panels" in text, text


@pytest.mark.skipif(not _panels_available(), reason="the panel kernel needs AVX2, FMA and a C compiler")
def test_e2e_panel_cells_run_beside_the_plain_ones(tiny_pair, tmp_path, monkeypatch) -> None:
    from mdv.bench.report.load import load_record
    from mdv.bench.report.sections import section_e2e
    from mdv.models import panels as panels_mod

    rows_seen: list[int] = []  # the rows of every product that really ran on the panels
    packs_used: set[int] = set()  # and the panels it ran on
    real = panels_mod.panel_linear

    def counting(x, p, b, n):
        rows_seen.append(x.reshape(-1, x.shape[-1]).shape[0])
        packs_used.add(p.data_ptr())
        return real(x, p, b, n)

    monkeypatch.setattr(panels_mod, "panel_linear", counting)
    built: list = []
    real_init = panels_mod.PanelPacks.__init__
    monkeypatch.setattr(panels_mod.PanelPacks, "__init__", lambda self, model, dtype=torch.float32: real_init(self, model, dtype)
                        or built.append((model, {pk[0].data_ptr() for _, pk in self._packs})))
    cfg = E2EBench(pair=PairKind.tiny_random, datasets=[], n_prompts=3, max_new_tokens=6, temperatures=[0.0],
                   methods=["sd", "spectr"], K=[1, 3], L=[2], goal_temperature=0.0, panels=True)
    rec = _check_record(bench.run_e2e(cfg, pair=tiny_pair), "e2e", tmp_path)
    rows = {(r["method"], r["K"], r["L"], r["linears"]): r for r in rec["results"]}
    cells = {("ar", None, None), ("sd", 1, 2), ("spectr", 1, 2), ("spectr", 3, 2)}
    assert set(rows) == {(*c, v) for c in cells for v in ("plain", "panels")}
    for (m, K, L, linears), r in rows.items():
        assert r["panels"] == (linears == "panels") and r["packed"] is False
        if m == "ar":
            assert r["speedup"]["median"] == 1.0  # AR on panels is the panel cells' baseline
        if linears == "panels":
            _check_spread(r["panels_speed_vs_plain"], 2)
            # T = 0: float32 rounding leaves the greedy tokens and so the acceptance unchanged here
            assert r["block_efficiency"] == rows[(m, K, L, "plain")]["block_efficiency"]
        else:
            assert "panels_speed_vs_plain" not in r
    # the target's and the draft's linears both ran on their panels
    assert [m for m, _ in built] == [tiny_pair[0].model, tiny_pair[1].model]
    assert all(ptrs & packs_used for _, ptrs in built)
    assert {1, 3} <= set(rows_seen), sorted(set(rows_seen))  # AR steps; L + 1 rows (at T = 0 the K drafts are one path)
    assert not any("forward" in m.__dict__ for p in tiny_pair[:2] for m in p.model.modules())  # panels removed, freed
    text = "\n".join(section_e2e(load_record(tmp_path / "bench_e2e.json")))
    assert "| sd panels |" in text and "| ar panels |" in text, text


@pytest.mark.skipif(not _panels_available(), reason="the panel kernel needs AVX2, FMA and a C compiler")
def test_e2e_variants_name_the_cells_code_exactly(tiny_pair, tmp_path) -> None:
    """e2e.variants=[lean+panels]: only those cells, each speedup over AR on the same code, no "x / plain"
    column; an unknown or repeated variant, or a flag no listed variant uses, is one clear error before any
    model loads."""
    from mdv.bench.config import BenchConfig, validate
    from mdv.bench.report.load import load_record
    from mdv.bench.report.sections import section_e2e

    cfg = E2EBench(pair=PairKind.tiny_random, datasets=[], n_prompts=3, max_new_tokens=6, temperatures=[0.0],
                   methods=["sd"], K=[1], L=[2], goal_temperature=0.0, variants=["lean+panels"])
    validate(BenchConfig(e2e=cfg))
    rec = _check_record(bench.run_e2e(cfg, pair=tiny_pair), "e2e", tmp_path)
    assert {(r["method"], r["variant"]) for r in rec["results"]} == {("ar", "lean+panels"), ("sd", "lean+panels")}
    for r in rec["results"]:
        assert r["panels"] and r["forward"] == "lean" and not any(k.endswith("_speed_vs_plain") for k in r), r
        if r["method"] == "ar":
            assert r["speedup"]["median"] == 1.0  # AR on the same code is the baseline
    assert [g["met"] is not None for g in rec["goals"]] == [True, True]
    text = "\n".join(section_e2e(load_record(tmp_path / "bench_e2e.json")))
    assert "| sd lean+panels |" in text and "| ar lean+panels |" in text, text
    for variants, flags, match in ((["lean+panel"], {}, r"e2e.variants: unknown variant 'lean\+panel'; valid variants are"),
                                   (["plain", "plain"], {}, r"e2e.variants lists 'plain' twice"),
                                   (["lean+panels"], {"packed": True}, r"none of it uses e2e.packed=true: add its variant")):
        with pytest.raises(Exception, match=match):
            validate(BenchConfig(e2e=E2EBench(variants=variants, **flags)))


@pytest.mark.skipif(not _panels_available(), reason="the panel kernel needs AVX2, FMA and a C compiler")
def test_pass_limit_benchmark_times_lean_variants_beside_the_lean_pass(tiny_pair, tmp_path) -> None:
    from mdv.bench.report.load import load_record
    from mdv.bench.report.sections import section_pass_limit
    from mdv.models.panels import panel_isa

    compare = ["avx2_kernel", "small_pages", "per_query_attention"]
    cfg = bench.PassLimitBench(pair=PairKind.tiny_random, n=[1, 9, 33], threads=[1], context=5, repeats=3,
                               bandwidth_megabytes=8, gemm_size=64, panels=True, lean=True, lean_compare=compare)
    rec = _check_record(bench.run_pass_limit(cfg, target=tiny_pair[0]), "pass_limit", tmp_path)
    res = rec["results"]
    config = tiny_pair[0].config
    group = config.num_attention_heads // config.num_key_value_heads  # query heads per key/value head (G)
    assert group * 33 >= 40 > group * 9  # n = 33 runs the tiled attention, n = 1 and 9 the per-query one
    assert res["panel_isa"] == panel_isa()  # the default kernel the panels and lean columns ran
    for r in res["per_threads"][0]["passes"]:
        for c in compare:
            _check_spread(r[f"lean_{c}_ms"], 3)
            _check_spread(r[f"lean_vs_lean_{c}"], 3)
            assert r[f"lean_{c}_vs_limit"]["median"] == pytest.approx(r[f"lean_{c}_ms"]["median"] / r["limit_ms"])
            if c != "per_query_attention" or group * r["n"] < 40:  # the same bits, only faster or slower (auto
                assert r[f"lean_{c}_abs_prob_diff"] == r["lean_abs_prob_diff"]  # tiles from 40 queries per kv head)
            else:  # the tiled attention against the per-query one: float32 rounding apart (their bits differ:
                assert r[f"lean_{c}_abs_prob_diff"] < 1e-5 and r["lean_abs_prob_diff"] < 1e-5  # test_lean_layer)
    assert panel_isa() == res["panel_isa"]  # the forced AVX2 kernel was only for its own column
    goals = {g["goal"]: g for g in rec["goals"]}
    for c in compare:
        assert goals[f"lean_{c} pass p equal to the plain pass (max abs difference)"]["met"]
        assert not any(g.startswith(f"1 thread(s), n=1: lean_{c}") for g in goals)  # a comparison, not a goal
    text = "\n".join(section_pass_limit(load_record(tmp_path / "bench_pass_limit.json")))
    assert "lean ÷ lean avx2_kernel" in text and "lean ÷ lean small_pages" in text, text
    assert "lean ÷ lean per_query_attention" in text and "the per-query attention" in text, text
    assert res["transparent_huge_pages"] in ("always", "madvise", "never", "unavailable")
    assert f"Panel kernel: {res['panel_isa']};" in text and "its panels on 4 KiB pages" in text, text


@pytest.mark.parametrize("panels", [False, pytest.param(True, marks=pytest.mark.skipif(
    not _panels_available(), reason="the panel kernel needs AVX2, FMA and a C compiler"))])
def test_pass_limit_benchmark_lean_side_by_side(tiny_pair, tmp_path, panels: bool) -> None:
    from mdv.bench.report.load import load_record
    from mdv.bench.report.sections import section_pass_limit

    cfg = bench.PassLimitBench(pair=PairKind.tiny_random, n=[1, 4], threads=[1], context=5, repeats=3,
                               bandwidth_megabytes=8, gemm_size=64, panels=panels, lean=True)
    rec = _check_record(bench.run_pass_limit(cfg, target=tiny_pair[0]), "pass_limit", tmp_path)
    res = rec["results"]
    for r in res["per_threads"][0]["passes"]:
        _check_spread(r["lean_ms"], 3)
        _check_spread(r["lean_vs_plain"], 3)
        assert r["lean_vs_limit"]["median"] == pytest.approx(r["lean_ms"]["median"] / r["limit_ms"])
        assert r["lean_abs_prob_diff"] < 1e-6
    assert res["max_abs_prob_diff_lean_vs_plain"] < 1e-6
    assert [g["met"] for g in rec["goals"] if g["goal"] == "lean pass p equal to the plain pass (max abs difference)"] == [True]
    text = "\n".join(section_pass_limit(load_record(tmp_path / "bench_pass_limit.json")))
    assert "lean ÷ plain" in text and "Lean: mdv's lean decoder forward" in text, text


def test_e2e_lean_cells_run_beside_the_plain_ones(tiny_pair, tmp_path, monkeypatch) -> None:
    from mdv.bench.report.load import load_record
    from mdv.bench.report.sections import section_e2e
    from mdv.models import lean as lean_mod

    passes: list[int] = []
    real = lean_mod.LeanSession._pass
    monkeypatch.setattr(lean_mod.LeanSession, "_pass", lambda self, ids, *a: passes.append(id(self.hf.model)) or real(self, ids, *a))
    cfg = E2EBench(pair=PairKind.tiny_random, datasets=[], n_prompts=3, max_new_tokens=6, temperatures=[0.0],
                   methods=["sd", "spectr"], K=[1, 3], L=[2], goal_temperature=0.0, lean=True)
    rec = _check_record(bench.run_e2e(cfg, pair=tiny_pair), "e2e", tmp_path)
    rows = {(r["method"], r["K"], r["L"], r["variant"]): r for r in rec["results"]}
    cells = {("ar", None, None), ("sd", 1, 2), ("spectr", 1, 2), ("spectr", 3, 2)}
    assert set(rows) == {(*c, v) for c in cells for v in ("plain", "lean")}
    for (m, K, L, variant), r in rows.items():
        assert r["forward"] == ("lean" if variant == "lean" else "hf") and r["linears"] == "plain"
        if m == "ar":
            assert r["speedup"]["median"] == 1.0  # AR on the lean forward is the lean cells' baseline
        if variant == "lean":
            _check_spread(r["lean_speed_vs_plain"], 2)
            assert r["block_efficiency"] == rows[(m, K, L, "plain")]["block_efficiency"]
        else:
            assert "lean_speed_vs_plain" not in r
    # both the target and the draft ran lean
    assert {id(tiny_pair[0].model), id(tiny_pair[1].model)} <= set(passes)
    text = "\n".join(section_e2e(load_record(tmp_path / "bench_e2e.json")))
    assert "| sd lean |" in text and "| ar lean |" in text, text


@pytest.mark.skipif(not _panels_available(), reason="the panel kernel needs AVX2, FMA and a C compiler")
@pytest.mark.parametrize("dtype", ["float16", "int8"])
def test_e2e_draft_panels_in_float16_or_int8(tiny_pair, tmp_path, monkeypatch, dtype: str) -> None:
    from mdv.models import panels as panels_mod

    built: list = []
    real_init = panels_mod.PanelPacks.__init__
    monkeypatch.setattr(panels_mod.PanelPacks, "__init__",
                        lambda self, model, dtype=torch.float32: real_init(self, model, dtype) or built.append((model, dtype)))
    cfg = E2EBench(pair=PairKind.tiny_random, datasets=[], n_prompts=2, max_new_tokens=4, temperatures=[0.0],
                   methods=["sd"], K=[1], L=[2], goal_temperature=0.0, panels=True, lean=True, draft_panel_dtype=dtype)
    rec = _check_record(bench.run_e2e(cfg, pair=tiny_pair), "e2e", tmp_path)
    assert built == [(tiny_pair[0].model, torch.float32), (tiny_pair[1].model, getattr(torch, dtype))]
    rows = {(r["method"], r["variant"]): r for r in rec["results"]}
    assert set(rows) == {(m, v) for m in ("ar", "sd") for v in ("plain", "panels", "lean+panels")}
    assert rows[("sd", "lean+panels")]["linears"] == "panels" and rows[("sd", "lean+panels")]["forward"] == "lean"
    with pytest.raises(InvalidInputError, match="e2e.draft_panel_dtype must be one of float32, float16, int8; got 'bfloat16'"):
        bench.run_e2e(E2EBench(pair=PairKind.tiny_random, datasets=[], n_prompts=2, max_new_tokens=4, panels=True,
                               draft_panel_dtype="bfloat16"), pair=tiny_pair)
    with pytest.raises(InvalidInputError, match=f"draft_panel_dtype={dtype} .*: set e2e.panels=true"):
        bench.run_e2e(E2EBench(pair=PairKind.tiny_random, datasets=[], n_prompts=2, max_new_tokens=4,
                               draft_panel_dtype=dtype), pair=tiny_pair)


@pytest.mark.skipif(not _panels_available(), reason="the panel kernel needs AVX2, FMA and a C compiler")
def test_draft_step_benchmark_times_every_dtype_side_by_side(tiny_pair, tmp_path) -> None:
    from mdv.bench.config import DraftStepBench
    from mdv.bench.draft_step import run_draft_step
    from mdv.bench.report.load import load_record
    from mdv.bench.report.sections import section_draft_step

    cfg = DraftStepBench(pair=PairKind.tiny_random, K=[1, 2], L=3, context=6, repeats=2, law_positions=5,
                         bandwidth_megabytes=8)
    rec = _check_record(run_draft_step(cfg, pair=tiny_pair), "draft_step", tmp_path)
    rows = rec["results"]["rows"]
    assert [(r["dtype"], r["K"]) for r in rows] == [(d, k) for k in (1, 2) for d in ("float32", "float16", "int8")]
    bw = rec["results"]["read_GBps"]["median"]
    for r in rows:
        _check_spread(r["ms"], 2)
        assert r["limit_ms"] == pytest.approx(1e3 * 3 * r["pack_bytes"] / (bw * 1e9))
        assert r["vs_limit"]["median"] == pytest.approx(r["ms"]["median"] / r["limit_ms"])
    by = {r["dtype"]: r for r in rows if r["K"] == 1}
    assert by["float32"]["vs_float32"]["median"] == 1.0
    assert by["float32"]["law_tv_vs_float32"] == {"mean": 0.0, "max": 0.0}  # the same panels, the same law
    assert 0 < by["int8"]["law_tv_vs_float32"]["mean"] <= by["int8"]["law_tv_vs_float32"]["max"] < 0.5  # rounded
    assert by["int8"]["pack_bytes"] < by["float16"]["pack_bytes"] < by["float32"]["pack_bytes"]
    text = "\n".join(section_draft_step(load_record(tmp_path / "bench_draft_step.json")))
    assert "| int8 | 2 |" in text and "÷ float32" in text
    with pytest.raises(InvalidInputError, match="draft_step.dtypes must be distinct entries of float32, float16, int8"):
        run_draft_step(DraftStepBench(dtypes=["bfloat16"]), pair=tiny_pair)


def test_hf_compare_benchmark_tiny(tmp_path) -> None:
    pair = bench.load_pair(torch.device("cpu"), PairKind.tiny_random, TinyPair(num_layers=2))
    cfg = bench.HFCompareBench(pair=PairKind.tiny_random, datasets=[], n_prompts=3, max_new_tokens=5,
                               early_exit_depth=1)
    rec = _check_record(bench.run_hf_compare(cfg, pair=pair), "hf_compare", tmp_path)
    rows = {r["contender"]: r for r in rec["results"]}
    assert list(rows) == list(cfg.contenders)
    for name, r in rows.items():
        assert r["new_tokens"] == [5] and r["n_timed_prompts"] == 2, name  # every call made exactly 5 tokens
        _check_spread(r["tokens_per_second"], 2)
        _check_spread(r["speed_vs_hf_plain"], 2)
    assert rows["hf_plain"]["speed_vs_hf_plain"]["median"] == 1.0
    assert [g["goal"].split(" at least")[0] for g in rec["goals"]] == ["mdv_sd_model", "mdv_sd_ngram",
                                                                     "mdv_sd_layerskip", "mdv_ar"]
    assert all(g["met"] is not None for g in rec["goals"])


def test_hf_compare_checks_its_contenders_and_the_early_exit_depth(tiny_pair) -> None:
    from mdv.bench.config import BenchConfig, validate

    with pytest.raises(Exception, match=r"hf_compare.contenders: unknown contender 'vllm'; valid contenders are"):
        validate(BenchConfig(hf_compare=bench.HFCompareBench(contenders=["vllm"])))
    with pytest.raises(Exception, match=r"hf_compare: ngram_min=3 must be in \[1, ngram_size=2\]"):
        validate(BenchConfig(hf_compare=bench.HFCompareBench(ngram_min=3)))
    cfg = bench.HFCompareBench(pair=PairKind.tiny_random, datasets=[], n_prompts=2, max_new_tokens=2)
    with pytest.raises(Exception, match=r"'layerskip' needs a target with at least 2 layers"):
        bench.run_hf_compare(cfg, pair=tiny_pair)  # the 1-layer tiny pair: before any generation


def test_audit_benchmark_tiny(tmp_path) -> None:
    cfg = bench.AuditBench(cases="smoke", methods=["sd", "spectr"], instances=2000, repeats=2,
                           detection_rules=["sd"], detection_cases=["smoke-rand-V3-K1-L1"], epsilon=0.05)
    rec = _check_record(bench.run_audit_bench(cfg), "audit", tmp_path)
    rows = rec["results"]["throughput"]
    assert {(r["case"], r["method"]) for r in rows} == {("smoke-rand-V3-K1-L1", "sd"), ("smoke-rand-V3-K1-L1", "spectr"),
                                                        ("smoke-rand-V3-K2-L2", "spectr"), ("smoke-iid-V4-K3-L1", "spectr")}
    for r in rows:
        _check_spread(r["instances_per_second"], 2)
    (d,) = rec["results"]["detection"]
    assert d["verdict"] == "biased" and d["perturbed_case_status"] == "biased" and d["seconds"] > 0
    assert rec["summary"]["scalar_slowdown"] > 1
    assert [g["met"] is not None for g in rec["goals"]] == [True] * len(rec["goals"])


def test_memory_benchmark_tiny(tiny_pair, tmp_path) -> None:
    cfg = MemoryBench(pair=PairKind.tiny_random, method="mdbv", K=2, L=3, n_prompts=4, max_new_tokens=3,
                      warmup_prompts=1, tensor_count_every=2, datasets=[])
    rec = _check_record(bench.run_memory(cfg, pair=tiny_pair), "memory", tmp_path)
    res = rec["results"]
    assert res["peak_rss_mib"] > 0 and _finite(res["rss_growth_mib"]) and _finite(res["rss_slope_mib_per_prompt"])
    assert _finite(res["rss_endpoint_growth_mib"])
    assert len(res["rss_mib_per_prompt"]) == 4
    assert [i for i, _ in res["live_tensors"]] == [1, 2, 4] and all(n > 0 for _, n in res["live_tensors"])
    assert res["live_tensor_growth"] is not None


def test_rss_trend_separates_noise_from_a_leak() -> None:
    noisy = [1200.0 + (40.0 if i % 7 == 0 else 0.0) for i in range(40)]  # allocator swings, no trend
    growth, slope = bench.rss_trend(noisy)
    assert abs(growth) < 1.0 and abs(slope) < 0.5
    leak = [1200.0 + 2.0 * i for i in range(40)]  # 2 MiB per prompt
    growth, slope = bench.rss_trend(leak)
    assert slope == pytest.approx(2.0) and growth == pytest.approx(2.0 * 30)
    assert math.isnan(bench.rss_trend([1.0])[0])


def test_missing_default_pair_is_skipped_with_a_reason(monkeypatch) -> None:
    import mdv.bench.pairs as pairs

    monkeypatch.setattr(pairs, "pair_available", lambda pair: (False, "draft files missing"))
    rec = bench.run_e2e(E2EBench())
    assert rec["status"] == "skipped" and "draft files missing" in rec["reason"]


def test_prompt_ids_cycle_and_label(tiny_pair) -> None:
    tok = tiny_pair[2]
    ids, label = bench.prompt_ids(tok, [], 12)
    assert len(ids) == 12 and ids[10] == ids[0] and label.startswith("fixed list")
    assert all(isinstance(t, int) for t in ids[3])


def test_prompt_ids_label_counts_the_prompts_used(tiny_pair) -> None:
    """8 prompts over five datasets, round robin: the label counts what is used (2, 2, 2, 1, 1), not the
    2 loaded per dataset; 12 over two datasets, 6 each."""
    tok = tiny_pair[2]
    ids, label = bench.prompt_ids(tok, ["gsm8k", "humaneval", "mgsm", "lm1b", "alpaca"], 8)
    assert len(ids) == 8
    counts = [int(part.rsplit(", ", 1)[1].rstrip(")")) for part in label.split("), ")]
    assert counts == [2, 2, 2, 1, 1], label
    ids, label = bench.prompt_ids(tok, ["gsm8k", "humaneval"], 12)
    assert [int(part.rsplit(", ", 1)[1].rstrip(")")) for part in label.split("), ")] == [6, 6], label


# ------------------------------------------------------------------------------------------ entry point
def _run_entry(*overrides: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "WANDB_MODE": "offline"}
    return subprocess.run([sys.executable, "-m", "experiments.bench", *overrides], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_entry_point_runs_every_benchmark_at_tiny_sizes(tmp_path) -> None:
    out = tmp_path / "run"
    proc = _run_entry(
        f"hydra.run.dir={out}", "threads=1", "tiny.vocab_size=32", "tiny.hidden_size=16", "tiny.num_layers=1",
        "verifier.methods=[sd,spectr]", "verifier.vocab_sizes=[16]", "verifier.K=[1,2]", "verifier.L=[2]",
        "verifier.repeats=1", "verifier.step_pair=tiny_random", "verifier.step_context=4", "verifier.step_calls=1",
        "verifier.device=cpu",
        "target_pass.pair=tiny_random", "target_pass.K=2", "target_pass.L=2", "target_pass.context=4",
        "target_pass.repeats=1",
        "e2e.pair=tiny_random", "e2e.datasets=[]", "e2e.n_prompts=2", "e2e.max_new_tokens=2", "e2e.methods=[sd]",
        "e2e.K=[1]", "e2e.L=[2]",
        "oracle.vocab_sizes=[2]", "oracle.max_K=1", "oracle.max_L=2", "oracle.methods=[sd]", "oracle.mc_V=2",
        "oracle.mc_K=1", "oracle.mc_L=2", "oracle.mc_trials=500", "oracle.mc_repeats=1",
        "memory.pair=tiny_random", "memory.K=2", "memory.L=2", "memory.n_prompts=3", "memory.max_new_tokens=2",
        "memory.warmup_prompts=1", "memory.datasets=[]")
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in ("verifier", "target_pass", "e2e", "oracle", "memory"):
        rec = json.loads((out / f"bench_{name}.json").read_text())
        assert rec["benchmark"] == name and rec["status"] == "ok" and rec["environment"]["threads"] == 1
        assert f"### " in proc.stdout  # the tables were printed


@pytest.mark.parametrize("override, needle", [("benchmarks=[verifer]", "expected one of"),
                                              ("verifier.mehtods=[sd]", "mehtods"),
                                              ("verifier.methods=[sdd]", "unknown method 'sdd'")])
def test_bad_configuration_fails_in_one_clear_line(override: str, needle: str, tmp_path) -> None:
    proc = _run_entry(f"hydra.run.dir={tmp_path}", override, timeout=120)
    assert proc.returncode != 0
    assert needle in proc.stderr
    assert "Traceback" not in proc.stderr
