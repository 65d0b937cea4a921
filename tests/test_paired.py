"""The paired measurement (mdv.paired): the estimator's fast path against its reference, the estimate
against the exact oracle and against real one-iteration generations, exact pairing, resumable records,
the report, and bad input."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats as st

import mdv
from mdv.errors import InvalidInputError, MdvError
from mdv.models.sampling import SamplingConfig
from mdv.oracle import expected_accepted
from mdv.paired import conditional as C
from mdv.paired.config import PairedConfig, validate_paired
from mdv.paired.measure import ContextProbe, contexts_of, run_paired
from mdv.paired.records import load_records, paired_dir
from mdv.models.tiny_random import build_tiny_random_pair
from mdv.sweep import RunConfig
from mdv.verify.base import Block
from mdv.verify.registry import VERIFIERS

METHODS = list(VERIFIERS)


def random_block(V: int, K: int, L: int, seed: int, *, zero_cols: int = 0, zeros: float = 0.0) -> Block:
    """A random [1, K, L] block with shared first laws (as a real iteration has), optional columns where
    q is 0 in every row (undrafted, like the default draft's vocabulary-subset head) and scattered zeros."""
    g = torch.Generator().manual_seed(seed)
    q = torch.rand(1, K, L, V, generator=g, dtype=torch.float64) ** 3
    p = torch.rand(1, K, L + 1, V, generator=g, dtype=torch.float64) ** 3
    if zeros:
        q = q * (torch.rand(q.shape, generator=g, dtype=torch.float64) > zeros)
        p = p * (torch.rand(p.shape, generator=g, dtype=torch.float64) > zeros)
        q[..., 0] += 1e-3
        p[..., 0] += 1e-3
    if zero_cols:
        q[..., V - zero_cols:] = 0.0
    q, p = q / q.sum(-1, keepdim=True), p / p.sum(-1, keepdim=True)
    q[:, :, 0], p[:, :, 0] = q[:, :1, 0], p[:, :1, 0]
    tokens = torch.multinomial(q.reshape(-1, V), 1, generator=g).view(1, K, L)
    # drafts that share a prefix see the same later laws, as in a real tree
    for k in range(1, K):
        for i in range(1, L):
            for j in range(k):
                if torch.equal(tokens[0, k, :i], tokens[0, j, :i]):
                    q[0, k, i], p[0, k, i] = q[0, j, i], p[0, j, i]
                    tokens[0, k, i] = torch.multinomial(q[0, k, i], 1, generator=g)
                    break
        for j in range(k):
            if torch.equal(tokens[0, k], tokens[0, j]):
                p[0, k, L] = p[0, j, L]
                break
    return Block(tokens, q, p).validate()


# ------------------------------------------------------------------------------------------ estimator
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fast_estimator_equals_reference(method: str, seed: int) -> None:
    """Lumped vocabulary + early stop for token-level rules give the reference's numbers (one law call per
    (K, L) on the full vocabulary) to 1e-12, on blocks with undrafted columns and zeros."""
    block = random_block(7, 3, 3, seed, zero_cols=3, zeros=0.2 if seed else 0.0)
    ref = C.conditional_acceptance_reference(method, block)
    fast = C.conditional_acceptance(method, block)
    np.testing.assert_array_equal(np.isnan(ref.etau), np.isnan(fast.etau))
    np.testing.assert_allclose(np.nan_to_num(fast.etau), np.nan_to_num(ref.etau), atol=1e-12, rtol=0)
    np.testing.assert_allclose(np.nan_to_num(fast.reach), np.nan_to_num(ref.reach), atol=1e-12, rtol=0)
    valid = ~np.isnan(ref.etau)
    assert valid.sum() == (9 if VERIFIERS[method].multi_draft else 3)
    # E[tau] = Σ_i P(tau ≥ i)
    np.testing.assert_allclose(np.nansum(ref.reach, -1)[valid], ref.etau[valid], atol=1e-12)


def test_lumping_keeps_acceptance_and_target_mass() -> None:
    block = random_block(9, 2, 2, 5, zero_cols=4)
    lumped = C.lump_undrafted(block)
    assert lumped.V == 6  # 5 drafted columns + one lump
    torch.testing.assert_close(lumped.p.sum(-1), torch.ones_like(lumped.p.sum(-1)), atol=1e-12, rtol=0)
    assert float(lumped.q[..., -1].abs().max()) == 0.0
    assert C.lump_undrafted(lumped) is lumped  # nothing left to lump


@pytest.mark.parametrize("method", [m for m in METHODS if VERIFIERS[m].prefix_consistent])
def test_prefix_consistent_flag_holds(method: str) -> None:
    """The flag the fast path relies on: the law at L equals the law at L' > L stopped at L."""
    for seed in range(4):
        block = random_block(5, 2, 4, 10 + seed, zeros=0.2)
        for L in (1, 2, 3):
            e_short = C.conditional_acceptance_reference(method, C.sub_block(block, 2, L)).reach[1, L - 1, :L]
            e_long = C.conditional_acceptance_reference(method, block).reach[1, 3, :L]
            np.testing.assert_allclose(e_short, e_long, atol=1e-12)


def test_block_rules_are_not_prefix_consistent_here() -> None:
    """bv's law at L = 1 differs from its L = 2 law stopped at 1 on some block: the flag is not free."""
    diffs = []
    for seed in range(10):
        block = random_block(4, 1, 2, 30 + seed)
        short = C.conditional_acceptance_reference("bv", C.sub_block(block, 1, 1)).reach[0, 0, 0]
        long = C.conditional_acceptance_reference("bv", block).reach[0, 1, 0]
        diffs.append(abs(short - long))
    assert max(diffs) > 1e-6
    assert not VERIFIERS["bv"].prefix_consistent


def test_tree_nodes_counts_distinct_prefixes() -> None:
    tokens = torch.tensor([[1, 2, 3], [1, 2, 4], [5, 2, 3]])
    nodes = C.tree_nodes(tokens)
    assert nodes[0].tolist() == [2, 3, 4]
    assert nodes[1].tolist() == [2, 3, 5]
    assert nodes[2].tolist() == [3, 5, 8]


# ------------------------------------------------------------------------------------------ against the oracle
@pytest.fixture(scope="module")
def tiny_pair():
    target, draft, tok = build_tiny_random_pair(5, 0, logit_scale=3.0, dtype="float64")
    return target, draft


CONTEXT = [1, 3, 4, 3]
CASES = [(1, 1), (1, 2), (2, 2), (3, 2)]


@pytest.fixture(scope="module")
def draws(tiny_pair):
    """200 independent draft sets at one context, every method's exact conditional E[tau] on each."""
    target, draft = tiny_pair
    probe = ContextProbe(target, draft, CONTEXT, SamplingConfig(1.0, None, None), seed=123)
    out: dict[str, list[np.ndarray]] = {m: [] for m in METHODS}
    drafts = []
    for _ in range(200):
        m = probe.measure(CONTEXT, 3, 2, METHODS)
        drafts.append(m.block.tokens[0].clone())
        for k, c in m.conditional.items():
            out[k].append(c.etau)
    return {k: np.array(v) for k, v in out.items()}, drafts


def test_mean_conditional_matches_oracle(tiny_pair, draws) -> None:
    """z-test: the mean over sampled drafts of E[tau | c, D] against the oracle's exact E[tau | c], every
    verifier at several (K, L).  Two-sided, Bonferroni over the cases: |z| < z_{1 − 0.001/(2m)}."""
    target, draft = tiny_pair
    values, _ = draws
    checks = [(m, K, L) for m in METHODS for K, L in CASES if VERIFIERS[m].multi_draft or K == 1]
    z_max = st.norm.ppf(1 - 0.001 / (2 * len(checks)))
    worst = 0.0
    for m, K, L in checks:
        x = values[m][:, K - 1, L - 1]
        exact = expected_accepted(m, target, draft, K, L, prompt=CONTEXT)
        se = x.std(ddof=1) / math.sqrt(len(x))
        z = (x.mean() - exact) / se
        worst = max(worst, abs(z))
        assert abs(z) < z_max, f"{m} K={K} L={L}: mean {x.mean():.4f} vs exact {exact:.4f} (z = {z:.2f})"
    assert worst > 0  # the values are random draws, not the exact value itself


def test_one_iteration_generations_match_paired_estimate(tiny_pair, draws) -> None:
    """mdv.generate run for one iteration at the same context many times: its mean tau agrees with the
    paired estimate's mean (two-sample z-test, fixed seeds)."""
    target, draft = tiny_pair
    values, _ = draws
    for method, K, L in [("sd", 1, 2), ("spectr", 3, 2), ("mdbv", 2, 2)]:
        taus = []
        for seed in range(300):
            rec = []
            mdv.generate(target, draft, CONTEXT, method, K=K, L=L, temperature=1.0, max_new_tokens=1, seed=seed,
                         eos_token_id=[], on_step=rec.append)
            assert len(rec) == 1
            taus.append(int(rec[0].outcome.tau[0]))
        x = values[method][:, K - 1, L - 1]
        t = np.array(taus, dtype=float)
        z = (t.mean() - x.mean()) / math.sqrt(t.var(ddof=1) / len(t) + x.var(ddof=1) / len(x))
        assert abs(z) < st.norm.ppf(1 - 0.001 / 6), f"{method}: generate {t.mean():.3f} vs paired {x.mean():.3f}"


def test_every_verifier_sees_the_same_drafts(tiny_pair, monkeypatch) -> None:
    """Common random numbers: at each context every verifier's law (``law``, or the law of tau alone) is
    called on the recorded drafts."""
    target, draft = tiny_pair
    seen: dict[str, list[torch.Tensor]] = {m: [] for m in METHODS}
    for name, cls in VERIFIERS.items():
        for view in ("law", "acceptance_law", "acceptance_laws_upto_K"):
            original = getattr(cls, view)

            def spy(self, block, state=None, _orig=original, _name=name):
                seen[_name].append(block.tokens.clone())
                return _orig(self, block, state)

            monkeypatch.setattr(cls, view, spy)
    probe = ContextProbe(target, draft, CONTEXT, SamplingConfig(1.0, None, None), seed=7)
    for extra in ([], [3], [3, 4]):
        for m in METHODS:
            seen[m].clear()
        meas = probe.measure(CONTEXT + extra, 3, 2, METHODS)
        drafted = meas.block.tokens  # [1, 3, 2]; V = 5 is fully drafted or lumped: compare the lumped ids
        lumped = C.lump_undrafted(meas.block).tokens
        for m in METHODS:
            assert seen[m], m
            for t in seen[m]:
                K, L = t.shape[1], t.shape[2]
                assert torch.equal(t, lumped[:, :K, :L]), m
        assert drafted.shape == (1, 3, 2)


# ------------------------------------------------------------------------------------------ runs and records
def tiny_run_config(tmp_path: Path, **paired) -> RunConfig:
    cfg = RunConfig()
    cfg.name = "paired_test"
    cfg.results_dir = str(tmp_path / "res")
    cfg.progress = False
    cfg.models.kind = "tiny_random"
    cfg.models.name = "tiny"
    cfg.dataset.names = ["humaneval"]
    cfg.dataset.n_prompts = 2
    cfg.paired = PairedConfig(enabled=True, K_max=2, L_max=2, stride=4, n_tokens=8, calibrate=False,
                              methods=["sd", "spectr", "mdbv"], **paired)
    return cfg


def test_run_paired_writes_and_resumes(tmp_path: Path) -> None:
    cfg = tiny_run_config(tmp_path)
    rep = run_paired(cfg)
    assert len(rep.ok) == 2 and not rep.failed
    recs = load_records(cfg.results_dir)
    assert len(recs) == 2
    r = recs[0]
    assert r["schema"] == "mdv.paired/2" and len(r["contexts"]) == len(contexts_of(len(r["trajectory"]["tokens"]), 4))
    ctx = r["contexts"][0]
    assert np.array(ctx["etau"]["spectr"]).shape == (2, 2)
    assert ctx["etau"]["sd"][1][0] is None  # single-draft: not run at K = 2
    # the recorded trajectory is what mdv.generate gives with the recorded seed
    from mdv.sweep import load_models

    m = load_models(cfg.models)
    again = mdv.generate(m.target, None, _prompt(cfg, m, 0), "ar", temperature=0.4, max_new_tokens=8,
                         seed=r["trajectory"]["seed"] if r["prompt_index"] == 0 else recs[1]["trajectory"]["seed"])
    first = r if r["prompt_index"] == 0 else recs[1]
    assert again.tokens == first["trajectory"]["tokens"]
    # resume: finished prompts are skipped; a corrupt file is recomputed
    mtimes = {p.name: p.stat().st_mtime_ns for p in paired_dir(cfg.results_dir).glob("*.json")}
    rep2 = run_paired(cfg)
    assert len(rep2.skipped) == 2 and not rep2.ok
    victim = sorted(paired_dir(cfg.results_dir).glob("*.json"))[0]
    victim.write_text("{ truncated")
    rep3 = run_paired(cfg)
    assert rep3.ok == [victim.stem] and len(rep3.skipped) == 1
    assert json.loads(victim.read_text())["status"] == "ok"
    other = sorted(paired_dir(cfg.results_dir).glob("*.json"))[1]
    assert other.stat().st_mtime_ns == mtimes[other.name]


def _prompt(cfg: RunConfig, models, i: int) -> list[int]:
    from mdv.data import format_prompt, load_prompts

    ps = load_prompts("humaneval", cfg.dataset.n_prompts, source=cfg.dataset.source)
    return list(format_prompt(ps.prompts[i], models.tokenizer))


def test_report_from_tiny_run(tmp_path: Path) -> None:
    from mdv.paired.report import analyze_results

    cfg = tiny_run_config(tmp_path)
    cfg.dataset.n_prompts = 3
    run_paired(cfg)
    out = analyze_results(cfg.results_dir, tmp_path / "out", warn=lambda s: None)
    paired = out["paired"]
    assert out["cells"] is None and paired is not None
    names = {p.name for p in paired.paths.values()}
    assert {"paired_be.csv", "paired_verdicts.csv", "paired_claims.md", "paired_be_vs_k.png",
            "paired_be_vs_l.png", "paired_optimality_gap.png"} <= names
    claims = (tmp_path / "out" / "claims.md").read_text()
    assert "non-decreasing in K" in claims and "α*_K" in claims
    outcomes = {c.outcome for c in paired.claims}
    assert outcomes <= {"supported", "contradicted", "equal", "inconclusive", "not measured"}
    # every BE lies in [1, L + 1] and the CI brackets the mean
    import csv

    rows = list(csv.DictReader(open(tmp_path / "out" / "paired_be.csv")))
    assert rows and all(1.0 <= float(r["be"]) <= int(r["L"]) + 1 + 1e-12 for r in rows)
    assert all(float(r["lo"]) <= float(r["be"]) <= float(r["hi"]) for r in rows if r["lo"])


def test_the_paired_measurement_takes_a_drafter(tmp_path: Path) -> None:
    """``paired.drafter=ngram`` next to the model drafter in one folder: its own records (the model's keep
    their ids), drafts that are ngram's, its own setting in the report, and no speedup prediction for it without
    a calibration of it (the draft model's cost profiles do not price it)."""
    from mdv.paired.report import analyze_results

    model_cfg = tiny_run_config(tmp_path)
    ngram_cfg = tiny_run_config(tmp_path, drafter="ngram", drafter_options={"n_max": 2})
    run_paired(model_cfg)
    model_ids = sorted(p.name for p in paired_dir(model_cfg.results_dir).glob("*.json"))
    rep = run_paired(ngram_cfg)
    assert len(rep.ok) == 2 and not rep.failed
    recs = load_records(ngram_cfg.results_dir)
    assert len(recs) == 4 and sorted(r["config"].get("drafter", "model") for r in recs) == ["model"] * 2 + ["ngram"] * 2
    assert set(model_ids) <= {p.name for p in paired_dir(ngram_cfg.results_dir).glob("*.json")}
    from mdv.drafters.ngram import NgramDrafter
    from mdv.sweep import load_models

    models = load_models(ngram_cfg.models)
    lookup = NgramDrafter(n_max=2)
    lookup.bind(models.target, None)
    for r in (r for r in recs if r["config"].get("drafter") == "ngram"):
        prompt = _prompt(ngram_cfg, models, r["prompt_index"])
        for ctx in r["contexts"]:
            seq = prompt + r["trajectory"]["tokens"][:ctx["offset"]]
            for row in ctx["drafts"]:  # each drafted token is in the support of the lookup law at its place
                for i, tok in enumerate(row):
                    assert lookup.reference_law(seq + row[:i], SamplingConfig(0.4))[tok] > 0
    out = analyze_results(ngram_cfg.results_dir, tmp_path / "out", warn=lambda s: None)
    md = (tmp_path / "out" / "paired_report.md").read_text()
    assert "## Setting 1: models tiny, T = 0.4" in md and "## Setting 2: models tiny, drafter ngram, T = 0.4" in md
    assert "No calibration and no cost profile that applies: no prediction." in md  # calibrate=false here
    assert "Cost profiles price a draft model's step (c); not applied to the ngram drafter." in md
    assert out["paired"] is not None


# ------------------------------------------------------------------------------------------ bad input
def test_an_unknown_drafter_is_refused_before_any_work() -> None:
    with pytest.raises(MdvError, match=r"unknown drafter 'eagle3'"):
        validate_paired(PairedConfig(drafter="eagle3", calibrate=False))
    validate_paired(PairedConfig(drafter="ngram", calibrate=True))  # the calibration times the lookup


@pytest.mark.parametrize("field,value,needle", [
    ("K_max", 0, "paired.K_max"), ("L_max", 0, "paired.L_max"), ("stride", 0, "paired.stride"),
    ("delta", 0.0, "paired.delta"), ("delta", -1.0, "paired.delta"), ("methods", ["sd", "nope"], "nope"),
    ("methods", [], "paired.methods"), ("datasets", ["nope"], "nope"), ("n_tokens", 0, "paired.n_tokens"),
])
def test_bad_config_is_one_clear_error(field: str, value, needle: str) -> None:
    cfg = PairedConfig(**{field: value})
    with pytest.raises(MdvError) as e:
        validate_paired(cfg)
    assert needle in str(e.value)


def test_bad_config_fails_before_any_work(tmp_path: Path) -> None:
    cfg = tiny_run_config(tmp_path)
    cfg.paired.K_max = 0
    with pytest.raises(InvalidInputError, match="paired.K_max"):
        run_paired(cfg)
    assert not paired_dir(cfg.results_dir).exists() or not list(paired_dir(cfg.results_dir).glob("*.json"))


def test_unknown_method_in_estimator() -> None:
    block = random_block(4, 1, 1, 0)
    with pytest.raises(MdvError, match="unknown method"):
        C.conditional_acceptance("nope", block)


def test_calibration_from_another_machine_is_refused(tmp_path: Path) -> None:
    """paired.calibration pointing at a file made elsewhere: one error naming the field, no record written."""
    from mdv.paired.cost import Calibration

    cal = Calibration(machine={"hostname": "elsewhere", "cpu": "x", "torch_threads": 1, "device": "cpu"},
                      models={}, target_s={1: 0.1, 5: 0.2}, draft_first_s=0.01, draft_step_s={1: 0.01, 2: 0.01},
                      verify_s={"sd/1/1": 0.001}, ar_step_s=0.1)
    path = cal.save(tmp_path / "cal.json")
    cfg = tiny_run_config(tmp_path, calibration=str(path))
    with pytest.raises(InvalidInputError, match="hostname"):
        run_paired(cfg)
    assert not list(paired_dir(cfg.results_dir).glob("*.json"))


def test_two_processes_measure_every_record_once(tmp_path: Path) -> None:
    """paired.workers=2: a spawned helper and the main process share the records through the locks;
    every record is written once, with status ok."""
    cfg = tiny_run_config(tmp_path, workers=2)
    cfg.dataset.n_prompts = 4
    rep = run_paired(cfg)
    assert sorted(rep.ok) == sorted(rep.records) and not rep.busy and not rep.failed
    files = sorted(paired_dir(cfg.results_dir).glob("*.json"))
    assert len(files) == 4 and all(json.loads(f.read_text())["status"] == "ok" for f in files)
    assert not list(paired_dir(cfg.results_dir).glob(".*.tmp"))


def test_paired_benchmark_on_tiny_pair() -> None:
    """The benchmark entry times a fresh run and splits its time into parts that account for it."""
    from mdv.bench import PairedBench, run_paired_bench

    res = run_paired_bench(PairedBench(pair="tiny_random", datasets=["humaneval"], n_prompts=2, n_tokens=8, stride=4,
                                       K_max=2, L_max=2, goal_seconds=1e9))
    assert res["contexts"] == 4 and res["prompts"] == 2 and res["records_failed"] == 0
    assert 0.5 < sum(res["share"].values()) <= 1.0 + 1e-9
    assert set(res["share"]) >= {"trajectory", "draft", "target", "law/sd", "law/mdbv"}
    assert res["goal"]["met"] is True and res["contexts_per_second"] > 0


@pytest.mark.parametrize("method", METHODS)
def test_first_token_fast_equals_reference_and_ignores_the_bonus_law(method: str) -> None:
    """The L = 1 batch (lumped, one law call per K) equals the per-instance reference on the full vocabulary;
    and E[tau] at L = 1 does not depend on the bonus position's law that first_token_block fills with p0."""
    g = torch.Generator().manual_seed(3)
    V = 9
    q0 = torch.rand(V, generator=g, dtype=torch.float64) ** 2
    q0[6:] = 0.0  # undrafted columns
    q0 /= q0.sum()
    p0 = torch.rand(V, generator=g, dtype=torch.float64) ** 2
    p0[2] = 0.0
    p0 /= p0.sum()
    tokens = torch.multinomial(q0, 6 * 3, replacement=True, generator=g).view(6, 3)
    fast = C.first_token_acceptance(method, C.first_token_block(p0, q0, tokens))
    full = C.first_token_block(p0, q0, tokens, lump=False)
    ref = C.first_token_acceptance_reference(method, full)
    np.testing.assert_allclose(np.nan_to_num(fast), np.nan_to_num(ref), atol=1e-12, rtol=0)
    other = torch.rand(6, 3, 1, V, generator=g, dtype=torch.float64)
    bonus = Block(full.tokens, full.q, torch.cat([full.p[:, :, :1], other / other.sum(-1, keepdim=True)], 2))
    np.testing.assert_allclose(np.nan_to_num(C.first_token_acceptance_reference(method, bonus)), np.nan_to_num(ref),
                               atol=1e-12, rtol=0)


def test_extra_first_token_draws_match_oracle(tiny_pair) -> None:
    """The L = 1 estimate with extra draft tuples (the optimality gap's input) against the oracle's exact
    E[tau] at L = 1, every method and K (z-test, Bonferroni, fixed seed)."""
    target, draft = tiny_pair
    probe = ContextProbe(target, draft, CONTEXT, SamplingConfig(1.0, None, None), seed=99)
    rows = [probe.measure(CONTEXT, 3, 1, METHODS, optimum_draws=20).first_token for _ in range(30)]
    checks = [(m, K) for m in METHODS for K in (1, 2, 3) if VERIFIERS[m].multi_draft or K == 1]
    z_max = st.norm.ppf(1 - 0.001 / (2 * len(checks)))
    for m, K in checks:
        x = np.array([r[m][K - 1] for r in rows])
        exact = expected_accepted(m, target, draft, K, 1, prompt=CONTEXT)
        z = (x.mean() - exact) / (x.std(ddof=1) / math.sqrt(len(x)))
        assert abs(z) < z_max, f"{m} K={K}: {x.mean():.4f} vs exact {exact:.4f} (z = {z:.2f})"


def test_cli_bad_input_is_one_line_and_nonzero(tmp_path: Path) -> None:
    """experiments.run task=paired with paired.K_max=0, and analysis.report --delta 0: one error line
    naming the argument, non-zero exit, no record or report written as if complete."""
    import subprocess
    import sys

    env = {**__import__("os").environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline"}
    res = str(tmp_path / "r")
    proc = subprocess.run([sys.executable, "-m", "experiments.run", "task=paired", "models=tiny_random", "progress=false",
                           f"results_dir={res}", "paired.K_max=0"], capture_output=True, text=True, env=env,
                          cwd=Path(__file__).resolve().parent.parent)
    assert proc.returncode != 0
    err = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(err) == 1 and "paired.K_max" in err[0] and "Traceback" not in proc.stderr
    assert not list(Path(res).glob("paired/*.json"))
    cfg = tiny_run_config(tmp_path)
    run_paired(cfg)
    proc = subprocess.run([sys.executable, "-m", "analysis.report", cfg.results_dir, "--delta", "0"],
                          capture_output=True, text=True, env=env, cwd=Path(__file__).resolve().parent.parent)
    assert proc.returncode == 2 and "--delta" in proc.stderr and "Traceback" not in proc.stderr
    assert not (Path(cfg.results_dir) / "analysis" / "claims.md").exists()


def test_wandb_logs_paired_records_verdicts_and_plots(tmp_path: Path, monkeypatch) -> None:
    """logger=wandb (offline): one log row per record, the verdict table, the plots as images."""
    import glob
    import os

    pytest.importorskip("wandb", reason="wandb is not installed")
    from mdv.sweep import LoggerGroup, LoggerKind
    from mdv.tracking import make_tracker

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = tiny_run_config(tmp_path)
    cfg.dataset.n_prompts = 3
    run_paired(cfg, tracker=make_tracker(LoggerGroup(kind=LoggerKind.wandb, project="mdv-test"), "paired"))
    runs = glob.glob(str(tmp_path / "wandb" / "offline-run-*"))
    assert len(runs) == 1
    tables = glob.glob(os.path.join(runs[0], "files", "media", "table", "paired", "verdicts*.json"))
    assert len(tables) == 1
    table = json.loads(Path(tables[0]).read_text())
    assert table["columns"][:3] == ["claim", "part", "outcome"] and len(table["data"]) > 5
    images = glob.glob(os.path.join(runs[0], "files", "media", "images", "paired", "plots", "*.png"))
    assert len(images) >= 3
