"""mdv.paired.speedcheck: the interleaved real generations that check the predicted speedups, their
file and reuse, the measured SR they give, and the prediction's cut of the last iteration."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from mdv.errors import InvalidInputError, MdvError
from mdv.paired import analysis as A
from mdv.paired.config import PairedConfig, SpeedCheckConfig, validate_paired
from mdv.paired.measure import run_paired
from mdv.paired.records import load_records, paired_dir
from mdv.paired.speedcheck import FILE, check_cells, read_check
from mdv.sweep import RunConfig
from tests.test_paired import tiny_run_config


def run_config(tmp_path: Path, **check) -> RunConfig:
    """The paired tests' tiny run (tests/test_paired.py) with a speed check on its two prompts."""
    sc = SpeedCheckConfig(enabled=True, methods=["sd", "spectr"], K=[2], L=[1, 2], n_prompts=2, n_tokens=6)
    for k, v in check.items():
        setattr(sc, k, v)
    return tiny_run_config(tmp_path, speed_check=sc)


def test_cells_put_ar_first_and_single_draft_methods_at_k1() -> None:
    cfg = SpeedCheckConfig(methods=["sd", "spectr"], K=[2, 3], L=[1, 4])
    assert check_cells(cfg) == [("ar", 1, 1), ("sd", 1, 1), ("sd", 1, 4), ("spectr", 2, 1), ("spectr", 2, 4),
                                ("spectr", 3, 1), ("spectr", 3, 4)]


def test_run_writes_every_cell_on_every_prompt_and_reuses_it(tmp_path: Path) -> None:
    cfg = run_config(tmp_path)
    rep = run_paired(cfg)
    path = paired_dir(cfg.results_dir) / FILE
    assert rep.speed_check == path
    check = read_check(path)
    gens = check["generations"]
    cells = {(g["method"], g["K"], g["L"]) for g in gens}
    assert cells == set(check_cells(cfg.paired.speed_check))
    assert len(gens) == len(cells) * 2  # two timed prompts; the warm-up round is left out
    assert all(g["stats"]["new_tokens"] == 6 for g in gens)  # EOS ignored: every run is n_tokens long
    # same prompts and seeds as the paired trajectories: the AR generation replays the recorded trajectory
    recs = {r["prompt_index"]: r for r in load_records(cfg.results_dir)}
    for g in gens:
        if g["method"] == "ar":
            assert g["stats"]["seed"] == recs[g["prompt_index"]]["trajectory"]["seed"]
    before = path.stat().st_mtime_ns
    run_paired(cfg)  # nothing changed: reused, not rerun
    assert path.stat().st_mtime_ns == before
    cfg.paired.speed_check.n_tokens = 5  # other settings: redone
    run_paired(cfg)
    assert read_check(path)["settings"]["n_tokens"] == 5


def test_the_ar_generation_of_the_check_is_the_paired_trajectory(tmp_path: Path) -> None:
    """Check and paired run share prompt and seed: with n_tokens equal, AR gives the recorded tokens."""
    from mdv import generate
    from mdv.sweep import load_models

    cfg = run_config(tmp_path, n_tokens=8)
    run_paired(cfg)
    T = float(cfg.sampling.temperatures[0])
    rec = next(r for r in load_records(cfg.results_dir) if r["config"]["temperature"] == T)
    models = load_models(cfg.models)
    check = read_check(paired_dir(cfg.results_dir) / FILE)
    g = next(g for g in check["generations"] if g["method"] == "ar" and g["prompt_index"] == rec["prompt_index"])
    assert g["stats"]["seed"] == rec["trajectory"]["seed"]
    # the trajectory stopped at EOS or ran n_tokens; the check ignores EOS, so it is a prefix of the check's run
    from mdv.sweep import format_dataset_prompts, import_callable, load_prompt_set

    ps = load_prompt_set(import_callable(cfg.dataset.loader, "dataset.loader"), "humaneval", 2, cfg.dataset.source)
    ids = format_dataset_prompts("humaneval", ps, 2, models, import_callable(cfg.dataset.formatter, "f"),
                                 cfg.paired.L_max + 8)[rec["prompt_index"]]
    out = generate(models.target, None, ids, "ar", temperature=T, top_k=cfg.sampling.top_k, top_p=cfg.sampling.top_p, max_new_tokens=8, seed=g["stats"]["seed"],
                   eos_token_id=[]).tokens
    traj = rec["trajectory"]["tokens"]
    assert out[:len(traj)] == traj


@pytest.mark.parametrize("field,value,needle", [
    ("methods", [], "speed_check.methods"), ("methods", ["bv"], "not measured by the paired run"),
    ("L", [3], "speed_check.L"), ("K", [0], "speed_check.K"), ("n_tokens", 0, "speed_check.n_tokens"),
    ("n_prompts", 0, "speed_check.n_prompts"), ("datasets", ["gsm8k"], "not in paired.datasets"),
    ("n_tokens", 9, "exceeds paired.n_tokens=8"),
])
def test_bad_speed_check_config_is_one_clear_error(field: str, value, needle: str) -> None:
    sc = SpeedCheckConfig(enabled=True, methods=["sd", "spectr"], K=[2], L=[1, 2])
    validate_paired(PairedConfig(K_max=2, L_max=2, n_tokens=8, datasets=["humaneval"], methods=["sd", "spectr"],
                                 speed_check=sc))  # valid as it stands
    setattr(sc, field, value)
    cfg = PairedConfig(K_max=2, L_max=2, n_tokens=8, datasets=["humaneval"], methods=["sd", "spectr"],
                       speed_check=sc)
    with pytest.raises(MdvError, match=needle):
        validate_paired(cfg)


def test_more_check_prompts_than_paired_prompts_fails_before_any_work(tmp_path: Path) -> None:
    cfg = run_config(tmp_path, n_prompts=3)
    with pytest.raises(InvalidInputError, match="speed_check.n_prompts"):
        run_paired(cfg)
    assert not list(paired_dir(cfg.results_dir).glob("*.json"))


def _stats(tokens: int, calls: int, decode_s: float) -> dict:
    return {"new_tokens": tokens, "target_calls": calls, "decode_s": decode_s}


def test_measured_speedup_is_the_hand_computed_ratio() -> None:
    """SR = sum(method tokens x AR seconds per token of its prompt) / sum(method decode seconds); tokens per
    iteration = tokens / target calls; time per iteration in AR steps."""
    check = {"settings": {"seed": 0, "n_tokens": 10, "models": "m", "temperature": 0.4, "top_k": None,
                          "top_p": None},
             "generations": [
                 {"dataset": "d", "prompt_index": 0, "method": "ar", "K": 1, "L": 1, "stats": _stats(10, 10, 1.0)},
                 {"dataset": "d", "prompt_index": 1, "method": "ar", "K": 1, "L": 1, "stats": _stats(10, 10, 2.0)},
                 {"dataset": "d", "prompt_index": 0, "method": "sd", "K": 1, "L": 2, "stats": _stats(10, 4, 0.5)},
                 {"dataset": "d", "prompt_index": 1, "method": "sd", "K": 1, "L": 2, "stats": _stats(10, 5, 1.5)}]}
    m = A.check_speedups(check, A.Options(n_boot=200))[("sd", 1, 2)]
    assert m.sr.mean == pytest.approx((10 * 0.1 + 10 * 0.2) / (0.5 + 1.5))
    assert m.tokens_per_iteration == pytest.approx(20 / 9)
    assert m.time_per_iteration == pytest.approx((0.5 + 1.5) / (0.1 * 4 + 0.2 * 5))
    assert m.prompts == frozenset({"d/0/s0", "d/1/s0"}) and m.n_tokens == 10
    be = A.check_block_efficiency(check, A.Options(n_boot=200))[("sd", 1, 2)]
    assert be.mean == pytest.approx(20 / 9)
    assert A.check_matches(check, {"models": "m", "temperature": 0.4, "top_k": None, "top_p": None})
    assert not A.check_matches(check, {"models": "m", "temperature": 1.0, "top_k": None, "top_p": None})


def test_report_prediction_cuts_the_last_iteration(tmp_path: Path) -> None:
    """The check's rows: predicted SR = per-iteration prediction x cap_factor(pooled law, n_tokens)."""
    from mdv.paired.cost import Calibration
    from mdv.paired.renewal import cap_factor
    from mdv.paired.report import sr_check_rows

    cfg = run_config(tmp_path)
    run_paired(cfg)
    data = A.collect(load_records(cfg.results_dir))[0]
    cal = Calibration(machine={}, models={}, target_s={1: 0.1, 5: 0.15}, draft_first_s=0.01,
                      draft_step_s={1: 0.01, 2: 0.012}, verify_s={"sd/1/1": 1e-3, "sd/1/2": 1e-3,
                                                                  "spectr/2/1": 1e-3, "spectr/2/2": 1e-3},
                      ar_step_s=0.1)
    check = read_check(paired_dir(cfg.results_dir) / FILE)
    measured = A.check_speedups(check, A.Options(n_boot=200))
    data.survival = {}  # records made before the survival laws were stored: the per-context mean, cut
    rows = sr_check_rows(data, cal, measured, A.Options(n_boot=200))
    assert {(r["method"], r["K"], r["L"]) for r in rows} == {("sd", 1, 1), ("sd", 1, 2), ("spectr", 2, 1),
                                                             ("spectr", 2, 2)}
    for r in rows:
        law = data.emitted_law(r["method"], r["K"], r["L"])
        assert r["cap_factor"] == pytest.approx(cap_factor(law, 6)) and 0 < r["cap_factor"] <= 1
        assert r["predicted"] == pytest.approx(r["predicted_per_iteration"] * r["cap_factor"])
        assert r["error"] == pytest.approx(r["predicted"] / r["measured"] - 1)
        # the pooled law's mean is the mean block efficiency
        assert float(law @ np.arange(1, r["L"] + 2)) == pytest.approx(float(np.mean(data.be(r["method"], r["K"],
                                                                                            r["L"]))))
        assert r["tokens_from"] == "per-context mean"


def _stretch_by_hand(starts: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Each context's weight: P(an iteration starts at t) summed over the positions whose nearest context at
    or before t is at its offset (positions before the first offset: the first), shared by equal offsets."""
    w = np.zeros(len(offsets))
    for t in range(len(starts)):
        before = [o for o in offsets if o <= t]
        owner = max(before) if before else min(offsets)
        mine = [i for i, o in enumerate(offsets) if o == owner]
        for i in mine:
            w[i] += starts[t] / len(mine)
    return w


def test_report_prediction_counts_real_iterations_along_the_trajectories(tmp_path: Path) -> None:
    """sd and spectr rows with survival laws: tokens per iteration = sum n / sum E[N | x] over the checked
    prompts, time per iteration = the contexts' times weighted by how many iterations start in the stretch
    each stands for, by hand."""
    from mdv.paired.cost import Calibration, iteration_time
    from mdv.paired.renewal import iteration_starts
    from mdv.paired.report import sr_check_rows

    cfg = run_config(tmp_path)
    run_paired(cfg)
    data = A.collect(load_records(cfg.results_dir))[0]
    assert set(data.survival) == set(data.clusters) and data.offsets.shape == data.clusters.shape
    cal = Calibration(machine={}, models={}, target_s={1: 0.1, 5: 0.15}, draft_first_s=0.01,
                      draft_step_s={1: 0.01, 2: 0.012}, verify_s={f"{m}/{k}/{l}": 1e-3 for m, k in
                                                                  (("sd", 1), ("spectr", 2)) for l in (1, 2)},
                      ar_step_s=0.1)
    check = read_check(paired_dir(cfg.results_dir) / FILE)
    rows = sr_check_rows(data, cal, A.check_speedups(check, A.Options(n_boot=200)), A.Options(n_boot=200))
    assert {r["tokens_from"] for r in rows} == {"along trajectories"} and len(rows) == 4
    for r in rows:
        m, K, L = r["method"], r["K"], r["L"]
        tokens, iters, seconds = 0.0, 0.0, 0.0
        for c in sorted(set(data.clusters)):
            n = min(6, data.survival[c].shape[0])
            starts = iteration_starts(data.survival[c][:n], L, K)
            at = (data.clusters == c) & (data.offsets < n)
            t = iteration_time(data.nodes[at, K - 1, L - 1], method=m, K=K, L=L, cost=cal)
            w = _stretch_by_hand(starts, data.offsets[at])
            tokens, iters, seconds = tokens + n, iters + starts.sum(), seconds + starts.sum() * (w @ t) / w.sum()
        assert r["tokens_predicted"] == pytest.approx(tokens / iters)
        assert r["time_predicted"] == pytest.approx(seconds / iters)
        assert r["predicted"] == pytest.approx(tokens / seconds)


def test_check_runs_are_paired_with_the_law_given_their_own_outputs(tmp_path: Path) -> None:
    """Every sd / spectr generation of the check stores its tokens and survival [n, K, K+1] given that output
    (recomputed here from one target and one draft pass); the report evaluates the cost model on those runs:
    predicted SR = sum n / sum E[N | output] t_prompt, error against the same runs' measured SR, and its tokens
    and time parts, by hand."""
    from mdv.drafters.registry import get_drafter
    from mdv.models.sampling import SamplingConfig
    from mdv.paired.cost import Calibration, iteration_time
    from mdv.paired.renewal import iteration_starts, iterations_given_output
    from mdv.paired.report import sr_check_rows
    from mdv.paired.trajectory import survival_given_output
    from mdv.sweep import load_models
    from tests.test_paired import _prompt

    cfg = run_config(tmp_path)
    run_paired(cfg)
    check = read_check(paired_dir(cfg.results_dir) / FILE)
    spec = [g for g in check["generations"] if g["method"] != "ar"]
    assert spec and all(len(g["tokens"]) == g["stats"]["new_tokens"] == 6 for g in spec)
    assert all(np.asarray(g["survival"]).shape == (6, g["K"], g["K"] + 1) for g in spec)
    assert not any("survival" in g for g in check["generations"] if g["method"] == "ar")
    data = A.collect(load_records(cfg.results_dir))[0]
    models = load_models(cfg.models)
    drafter = get_drafter("model")
    drafter.bind(models.target, models.draft)
    g = next(g for g in spec if g["method"] == "spectr")
    again = survival_given_output(models.target, drafter, _prompt(cfg, models, g["prompt_index"]), g["tokens"],
                                  SamplingConfig(check["settings"]["temperature"]), g["K"])
    np.testing.assert_allclose(np.asarray(g["survival"]), np.asarray(again), atol=1e-8)

    cal = Calibration(machine={}, models={}, target_s={1: 0.1, 5: 0.15}, draft_first_s=0.01,
                      draft_step_s={1: 0.01, 2: 0.012}, verify_s={f"{m}/{k}/{l}": 1e-3 for m, k in
                                                                  (("sd", 1), ("spectr", 2)) for l in (1, 2)},
                      ar_step_s=0.1)
    opts = A.Options(n_boot=200)
    rows = sr_check_rows(data, cal, A.check_speedups(check, opts), opts, A.check_given_output(check))
    assert len(rows) == 4
    ar = {g["prompt_index"]: g["stats"] for g in check["generations"] if g["method"] == "ar"}
    for r in rows:
        m, K, L = r["method"], r["K"], r["L"]
        runs = [g for g in spec if (g["method"], g["K"], g["L"]) == (m, K, L)]
        n = pred_s = e_n = calls = ar_s = decode = ar_calls = 0.0
        for g in runs:
            c = f"{g['dataset']}/{g['prompt_index']}/s{check['settings']['seed']}"
            starts = iteration_starts(data.survival[c][:6], L, K)  # the prompt's time from its trajectory
            at = (data.clusters == c) & (data.offsets < 6)
            w = _stretch_by_hand(starts, data.offsets[at])
            t = (w @ iteration_time(data.nodes[at, K - 1, L - 1], method=m, K=K, L=L, cost=cal)) / w.sum()
            en = iterations_given_output(np.asarray(g["survival"]), L, K)
            a = ar[g["prompt_index"]]["decode_s"] / ar[g["prompt_index"]]["new_tokens"]
            n, e_n, pred_s = n + 6, e_n + en, pred_s + en * t
            calls, ar_s, decode = calls + g["stats"]["target_calls"], ar_s + 6 * a, decode + g["stats"]["decode_s"]
            ar_calls += g["stats"]["target_calls"] * a  # the run's iterations in AR seconds
        assert r["given_output_runs"] == len(runs) == 2
        assert r["given_output_predicted"] == pytest.approx(n / pred_s)
        assert r["given_output_error"] == pytest.approx((n / pred_s) / (ar_s / decode) - 1)
        assert r["given_output_error"] == pytest.approx(r["given_output_predicted"] / r["measured"] - 1)
        assert r["given_output_tokens_error"] == pytest.approx(calls / e_n - 1)
        assert r["given_output_time_error"] == pytest.approx((pred_s / e_n) / (decode / ar_calls) - 1)
        assert r["given_output_error_lo"] <= r["given_output_error"] <= r["given_output_error_hi"]


def test_calibration_context_has_the_median_length_of_the_checked_runs(tmp_path: Path) -> None:
    """median(prompt length + n/2) over the check's prompts (n: the tokens each run generates)."""
    from mdv.paired.measure import calibration_context

    cfg = run_config(tmp_path, datasets=["a"], n_prompts=3, n_tokens=4)
    formatted = {"a": [[1] * 10, [2] * 20, [3] * 31, [4] * 500], "b": [[5] * 1000]}
    ctx = calibration_context(cfg, formatted)
    assert len(ctx) == 22 and set(ctx) <= {1, 2, 3}  # median(12, 22, 33); prompt 4 and dataset b not checked
    cfg.paired.speed_check.enabled = False  # without a check: every paired prompt, paired.n_tokens = 8
    assert len(calibration_context(cfg, formatted)) == int(np.median([14, 24, 35, 504, 1004]))


def test_check_rounds_run_between_the_calibration_rounds(tmp_path: Path) -> None:
    """With paired.calibrate, the check's rounds are spread over the calibration's (same machine state for
    the prediction and its check): every round runs once, in order, and the file says so."""
    cfg = run_config(tmp_path)
    cfg.paired.calibrate = True
    cfg.paired.calibration_repeats = 2
    rep = run_paired(cfg)
    assert rep.calibration is not None and rep.calibration.exists()
    check = read_check(rep.speed_check)
    assert check["interleaved_with_calibration"] is True
    gens = check["generations"]
    assert len(gens) == len(check_cells(cfg.paired.speed_check)) * 2
    assert [g["prompt_index"] for g in gens] == sorted(g["prompt_index"] for g in gens)  # rounds in order


def test_spread_rounds_runs_every_round_once_in_order() -> None:
    from mdv.paired.speedcheck import spread_rounds

    class Fake:
        def __init__(self, J: int) -> None:
            self.rounds, self.done, self.order = [None] * J, [False] * J, []

        def run_round(self, j: int) -> None:
            assert not self.done[j]
            self.done[j] = True
            self.order.append(j)

    for J, R in [(9, 16), (16, 9), (1, 1), (5, 5), (3, 1)]:
        fake = Fake(J)
        hook = spread_rounds(fake)
        for r in range(R):
            hook(r, R)
        assert fake.order == list(range(J)), (J, R)


def test_another_drafter_gets_its_own_calibration_check_and_prediction(tmp_path: Path) -> None:
    """paired.drafter=ngram beside the draft model in one folder: the calibration times the lookup's call and
    the check generates with it, each into a file of its own (the model's files are left as they were), and
    the report predicts and checks the ngram setting's speedups from those."""
    from mdv.paired.cost import Calibration
    from mdv.paired.report import analyze_results

    model_cfg = run_config(tmp_path)
    model_cfg.paired.calibrate, model_cfg.paired.calibration_repeats = True, 1
    run_paired(model_cfg)
    out = paired_dir(model_cfg.results_dir)
    before = {name: (out / name).stat().st_mtime_ns for name in ("calibration.json", FILE)}
    ngram_cfg = run_config(tmp_path)
    ngram_cfg.paired.drafter, ngram_cfg.paired.drafter_options = "ngram", {"n_max": 2}
    ngram_cfg.paired.calibrate, ngram_cfg.paired.calibration_repeats = True, 1
    rep = run_paired(ngram_cfg)
    assert {name: (out / name).stat().st_mtime_ns for name in before} == before
    assert rep.calibration == out / "calibration.ngram.json" and rep.speed_check == out / "speedcheck.ngram.json"
    cal = Calibration.from_dict(json.loads(rep.calibration.read_text()))
    assert cal.drafter == {"name": "ngram", "options": {"n_max": 2}} and sorted(cal.propose_s) == ["1/1", "1/2", "2/1",
                                                                                                  "2/2"]
    model_cal = Calibration.from_dict(json.loads((out / "calibration.json").read_text()))
    assert model_cal.drafter["name"] == "model" and sorted(model_cal.propose_s) == sorted(cal.propose_s)
    check = read_check(rep.speed_check)
    assert check["settings"]["drafter"] == "ngram" and check["settings"]["drafter_options"] == {"n_max": 2}
    assert {g["stats"].get("drafter") for g in check["generations"] if g["method"] != "ar"} == {"ngram"}
    assert read_check(out / FILE)["settings"]["drafter"] == "model"
    again = {p: p.stat().st_mtime_ns for p in (rep.calibration, rep.speed_check)}
    run_paired(ngram_cfg)  # everything current: nothing is timed again
    assert {p: p.stat().st_mtime_ns for p in again} == again
    from mdv.paired.measure import calibration_outdated  # what makes a matching file be timed again
    assert calibration_outdated(cal, cal.settings["context_length"]) is None
    assert "context" in calibration_outdated(cal, cal.settings["context_length"] + 1)
    del cal.settings["cache_evicted_bytes"]  # timed with warm caches, by an older mdv
    assert "warm caches" in calibration_outdated(cal, cal.settings["context_length"])
    cal.propose_s.clear()
    assert "no drafter call" in calibration_outdated(cal, cal.settings["context_length"])
    analyze_results(ngram_cfg.results_dir, tmp_path / "report", warn=lambda s: None)
    md = (tmp_path / "report" / "paired_report.md").read_text()
    setting2 = md[md.index("drafter ngram"):]
    assert "calibrated (this machine)" in setting2 and "the ngram drafter's call at L = 2" in setting2
    assert "paired/speedcheck.ngram.json" in setting2 and "| spectr | 2 | 2 |" in setting2
    assert "paired/speedcheck.json" in md[:md.index("drafter ngram")]


def test_sr_check_plot_has_the_paired_error_panel(tmp_path: Path) -> None:
    """Rows with given_output_* get the second panel (the error per cell, both ways); rows without, one."""
    from mdv.paired.report import plot_sr_check

    row = {"method": "sd", "K": 1, "L": 2, "predicted": 1.2, "predicted_lo": 1.1, "predicted_hi": 1.3,
           "measured": 1.1, "measured_lo": 1.0, "measured_hi": 1.2, "error": 0.09, "error_lo": 0.0, "error_hi": 0.2}
    paired = {**row, "given_output_error": 0.03, "given_output_error_lo": 0.01, "given_output_error_hi": 0.05}
    import matplotlib.image as mpimg

    one = plot_sr_check([row], tmp_path / "one.png")
    two = plot_sr_check([paired, {**paired, "method": "spectr", "K": 3}], tmp_path / "two.png")
    assert mpimg.imread(two).shape[1] > 1.8 * mpimg.imread(one).shape[1]  # two panels side by side
