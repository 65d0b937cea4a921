"""mdv.paired.cost: the calibrated cost model of a speculative iteration and the speedup it predicts.

(a) the prediction equals a hand computation on hand-written numbers (Calibration and CostProfile);
(b) target_s is linearly interpolated between the measured node counts, and refused outside them;
(c) calibrate() on the tiny random pair: every key present, positive and finite, the sessions left
    holding exactly the prefilled context (later passes score like a fresh session), in a few seconds;
(d) save / load round-trip; a file from another machine or for other models is refused naming the field;
(e) cost-profile YAML errors name the field.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from mdv.errors import InvalidInputError, MissingAssetError, UnknownNameError
from mdv.paired.cost import (Calibration, CostProfile, calibrate, iteration_time, load_calibration,
                             load_cost_profile, machine_fingerprint, measured_node_counts, model_fingerprint,
                             predict_speedup, synthetic_tree)
from mdv.paired.stats import cluster_bootstrap

REPO = Path(__file__).resolve().parent.parent


def hand_calibration(machine: dict | None = None, models: dict | None = None) -> Calibration:
    """Hand-written seconds (no timing)."""
    return Calibration(
        machine=machine or {"hostname": "h", "cpu": "c", "torch_threads": 1, "device": "cpu"},
        models=models or {"target": {"name": "t"}, "draft": {"name": "d"}},
        target_s={1: 0.010, 3: 0.014, 5: 0.020}, draft_first_s=0.002, draft_step_s={1: 0.001, 2: 0.0015},
        verify_s={"sd/1/2": 0.0003, "spectr/2/2": 0.0008, "spectr/1/2": 0.0004}, ar_step_s=0.008,
        draft_fork_s={1: 0.0, 2: 0.0005}, created="2026-01-01T00:00:00+00:00")


NODES = np.array([3, 4, 5, 5])  # [n] K=2 drafts of L=2: 3..5 nodes
TOKENS = np.array([1.5, 2.0, 2.5, 3.0])  # [n] 1 + E[tau]
CLUSTERS = np.array([0, 0, 1, 1])  # [n]


# ================================================================================ (a) prediction by hand
def test_iteration_time_matches_the_hand_computation_with_a_calibration() -> None:
    cal = hand_calibration()
    # (draft_first 0.002 + fork[2] 0.0005 + (L-1)=1 x step[2] 0.0015 + target(N) + verify 0.0008) / ar 0.008,
    # target(3) = 0.014, target(4) = 0.017 (halfway between 3 and 5), target(5) = 0.020
    t = iteration_time(NODES, method="spectr", K=2, L=2, cost=cal)
    np.testing.assert_allclose(t, [0.0188 / 0.008, 0.0218 / 0.008, 0.0248 / 0.008, 0.0248 / 0.008], rtol=1e-12)
    np.testing.assert_allclose(t, [2.35, 2.725, 3.1, 3.1], rtol=1e-12)
    # K = 1, sd: (0.002 + 0 + 1 x 0.001 + target(3) 0.014 + 0.0003) / 0.008
    t1 = iteration_time([3, 3], method="sd", K=1, L=2, cost=cal)
    np.testing.assert_allclose(t1, [2.1625, 2.1625], rtol=1e-12)
    # a method's own verify time enters: spectr at K = 1 (0.0004) differs from sd (0.0003) by 0.0001 / 0.008
    np.testing.assert_allclose(iteration_time([3], method="spectr", K=1, L=2, cost=cal) - t1[0], [0.0125],
                               rtol=1e-9)


def test_k1_uses_the_timed_rows_pass_when_there_is_one() -> None:
    """At K = 1 the engine scores the draft as a row (target_pass="rows"): target_rows_s[L] replaces the
    tree time; K > 1 keeps the tree; the field survives a JSON round trip."""
    from dataclasses import replace

    cal = replace(hand_calibration(), target_rows_s={1: 0.011, 2: 0.016})
    # (0.002 + 0 + 1 x 0.001 + rows[2] 0.016 + 0.0003) / 0.008, whatever the node count says
    np.testing.assert_allclose(iteration_time([3, 3], method="sd", K=1, L=2, cost=cal), [2.4125, 2.4125], rtol=1e-12)
    np.testing.assert_allclose(iteration_time(NODES, method="spectr", K=2, L=2, cost=cal),
                               iteration_time(NODES, method="spectr", K=2, L=2, cost=hand_calibration()), rtol=0)
    back = Calibration.from_dict(json.loads(json.dumps(cal.to_dict())))
    assert back.target_rows_s == {1: 0.011, 2: 0.016}


def test_speedup_is_the_ratio_of_means_with_a_calibration() -> None:
    cal = hand_calibration()
    est = predict_speedup(TOKENS, NODES, CLUSTERS, method="spectr", K=2, L=2, cost=cal, n_boot=500, seed=3)
    hand = (9.0 / 4) / ((2.35 + 2.725 + 3.1 + 3.1) / 4)  # mean(1 + tau) / mean(t)
    assert est.mean == pytest.approx(hand, rel=1e-12)
    assert est.mean == pytest.approx(0.798226164079823, rel=1e-12)
    # the mean of ratios would differ: the estimand is the ratio of means
    assert abs(est.mean - float(np.mean(TOKENS / np.array([2.35, 2.725, 3.1, 3.1])))) > 1e-3
    assert est.n == 4 and est.n_clusters == 2
    ref = cluster_bootstrap(TOKENS, CLUSTERS, ratio_to=np.array([2.35, 2.725, 3.1, 3.1]), n_boot=500, seed=3)
    assert (est.lo, est.hi) == pytest.approx((ref.lo, ref.hi), rel=1e-12)
    assert est.lo <= est.mean <= est.hi and est.lo < est.hi


def test_speedup_with_a_cost_profile() -> None:
    prof = CostProfile(alpha=0.1, c=0.05, name="gpu_like")
    t = iteration_time(NODES, method="spectr", K=2, L=2, cost=prof)
    # c·L + 1 + alpha·(N - 1) = 0.1 + 1 + 0.1·(N - 1)
    np.testing.assert_allclose(t, [1.3, 1.4, 1.5, 1.5], rtol=1e-12)
    est = predict_speedup(TOKENS, NODES, CLUSTERS, method="spectr", K=2, L=2, cost=prof, n_boot=200)
    assert est.mean == pytest.approx(2.25 / 1.425, rel=1e-12)
    # alpha = 0, c = 0: Leviathan's limit, speedup = E[1 + tau]
    free = predict_speedup(TOKENS, NODES, CLUSTERS, method="x", K=2, L=2, cost=CostProfile(0.0, 0.0), n_boot=200)
    assert free.mean == pytest.approx(2.25, rel=1e-12)


def test_prediction_refuses_inputs_outside_the_model() -> None:
    cal = hand_calibration()
    with pytest.raises(InvalidInputError, match=r"\[L\+1, K·L\+1\] = \[3, 5\]"):
        iteration_time([2], method="spectr", K=2, L=2, cost=cal)  # root not counted
    with pytest.raises(InvalidInputError, match=r"\[3, 5\]"):
        iteration_time([6], method="spectr", K=2, L=2, cost=cal)
    with pytest.raises(InvalidInputError, match="'sd/2/2'"):
        iteration_time([3], method="sd", K=2, L=2, cost=cal)
    with pytest.raises(InvalidInputError, match="K=3 is not calibrated"):
        iteration_time([4], method="spectr", K=3, L=1, cost=cal)
    with pytest.raises(InvalidInputError, match="tokens_per_iter"):
        predict_speedup([0.5, 2, 2, 2], NODES, CLUSTERS, method="spectr", K=2, L=2, cost=cal)
    with pytest.raises(InvalidInputError, match="tokens_per_iter has 3 entries"):
        predict_speedup(TOKENS[:3], NODES, CLUSTERS, method="spectr", K=2, L=2, cost=cal)
    with pytest.raises(InvalidInputError, match="Calibration or a CostProfile"):
        iteration_time([3], method="spectr", K=2, L=2, cost={"alpha": 0.1})


# ================================================================================ (b) interpolation
def test_target_time_interpolates_linearly_between_measured_counts() -> None:
    cal = hand_calibration()
    cal.target_s = {1: 1.0, 2: 2.0, 3: 2.5, 5: 4.5, 9: 5.0}
    np.testing.assert_allclose(cal.target_time([1, 2, 3, 5, 9]), [1.0, 2.0, 2.5, 4.5, 5.0])
    np.testing.assert_allclose(cal.target_time([4, 6, 7, 8]), [3.5, 4.625, 4.75, 4.875])
    for bad in ([0], [10], [4.5]):
        with pytest.raises(InvalidInputError):
            cal.target_time(bad)


def test_measured_node_counts_and_synthetic_trees() -> None:
    assert measured_node_counts(33) == [1, 2, 3, 5, 7, 9, 13, 17, 25, 33]
    assert measured_node_counts(25) == [1, 2, 3, 5, 7, 9, 13, 17, 25]
    assert measured_node_counts(13) == [1, 2, 3, 5, 7, 9, 13]
    assert measured_node_counts(5) == [1, 2, 3, 5]
    gen = torch.Generator().manual_seed(0)
    for K, L in ((4, 8), (2, 2), (3, 1)):
        for n in range(1, K * L + 2):
            tree, path = synthetic_tree(7, n, K, L, 64, gen)
            assert tree.size == n and path[0] == 0 and max(tree.depth) <= L
            tree.check_path(path)


# ================================================================================ (c) calibrate on the tiny pair
@pytest.fixture(scope="module")
def tiny():
    from mdv.models.tiny_random import build_tiny_random_pair

    target, draft, _ = build_tiny_random_pair()
    return target, draft


def _fresh_logits(model, prefix: list[int], tokens: list[int]) -> torch.Tensor:
    s = model.new_session()
    s.prefill(prefix)
    return s.extend(torch.tensor([tokens]))


def test_calibrate_on_the_tiny_pair(tiny, capsys, monkeypatch) -> None:
    from mdv.bench import timing

    target, draft = tiny
    ctx = [1 + (7 * i) % 60 for i in range(24)]
    tgt, drf = target.new_session(), draft.new_session()
    events: list[str] = []  # every timed call on the CPU comes right after a cache eviction
    evict, time_call = timing.CacheEvictor.__call__, timing.time_call
    monkeypatch.setattr(timing.CacheEvictor, "__call__", lambda self: (events.append("evict"), evict(self))[1])
    monkeypatch.setattr(timing, "time_call", lambda fn, sync=None: (events.append("time"), time_call(fn, sync))[1])
    with torch.inference_mode():
        cal = calibrate(target, draft, K_max=2, L_max=2, methods=["sd", "spectr"], context_ids=ctx, repeats=2,
                        progress=True, sessions=(tgt, drf))
    assert "calibrate" in capsys.readouterr().err  # the tqdm bar
    assert sorted(cal.target_s) == [1, 2, 3, 5]
    assert sorted(cal.draft_step_s) == [1, 2] and sorted(cal.draft_fork_s) == [1, 2]
    assert sorted(cal.target_rows_s) == [1, 2] and all(v > 0 for v in cal.target_rows_s.values())
    assert sorted(cal.verify_s) == ["sd/1/1", "sd/1/2", "spectr/1/1", "spectr/1/2", "spectr/2/1", "spectr/2/2"]
    values = [*cal.target_s.values(), *cal.draft_step_s.values(), *cal.verify_s.values(), cal.draft_first_s,
              cal.ar_step_s]
    assert all(math.isfinite(v) and v > 0 for v in values)
    assert all(math.isfinite(v) and v >= 0 for v in cal.draft_fork_s.values())
    assert sorted(cal.propose_s) == ["1/1", "1/2", "2/1", "2/2"] and cal.drafter == {"name": "model", "options": {}}
    assert all(math.isfinite(v) and v > 0 for v in cal.propose_s.values())
    assert all(d["n"] == 2 for d in cal.details.values()) and len(cal.details) == 4 + 2 + 1 + 1 + 2 + 2 + 4 + 6
    assert cal.models["target"] == model_fingerprint(target) and cal.models["draft"] == model_fingerprint(draft)
    assert cal.machine["hostname"] == machine_fingerprint()["hostname"]
    assert cal.settings["context_length"] == len(ctx) and cal.settings["repeats"] == 2
    assert events == ["evict", "time"] * (3 * len(cal.details))  # a warm-up and 2 timed rounds
    assert cal.settings["cache_evicted_bytes"] == 2 * timing.last_level_cache_bytes() > 0
    # the caches hold exactly the prefilled context: later passes score as a fresh session's do
    assert (tgt.length, tgt.rows, drf.length, drf.rows) == (len(ctx) - 1, 1, len(ctx), 1)
    with torch.inference_mode():
        torch.testing.assert_close(tgt.extend(torch.tensor([[ctx[-1], 5]])), _fresh_logits(target, ctx[:-1], [ctx[-1], 5]))
        torch.testing.assert_close(drf.extend(torch.tensor([[9]])), _fresh_logits(draft, ctx, [9]))
    # and the prediction runs on the measured calibration
    t = iteration_time([3, 4, 5], method="spectr", K=2, L=2, cost=cal)
    assert t.shape == (3,) and np.isfinite(t).all() and (t > 0).all()


def test_calibrate_times_another_drafters_call(tiny) -> None:
    """drafter="ngram": propose_s times the lookup (no model call), the prediction uses it, the file names the
    drafter, and the sessions are left as prefilled."""
    target, draft = tiny
    ctx = [1 + (7 * i) % 20 for i in range(30)]  # repeats: the lookup finds matches
    tgt, drf = target.new_session(), draft.new_session()
    with torch.inference_mode():
        cal = calibrate(target, draft, K_max=2, L_max=2, methods=["sd"], context_ids=ctx, repeats=2,
                        sessions=(tgt, drf), drafter="ngram", drafter_options={"n_max": 2})
    assert cal.drafter == {"name": "ngram", "options": {"n_max": 2}} and sorted(cal.propose_s) == ["1/1", "1/2", "2/1",
                                                                                                  "2/2"]
    assert (tgt.length, tgt.rows, drf.length, drf.rows) == (len(ctx) - 1, 1, len(ctx), 1)
    t = iteration_time([3, 3], method="sd", K=1, L=2, cost=cal)
    hand = (cal.propose_s["1/2"] + cal.target_rows_s[2] + cal.verify_s["sd/1/2"]) / cal.ar_step_s
    np.testing.assert_allclose(t, [hand, hand], rtol=1e-12)
    with pytest.raises(UnknownNameError, match="eagle3"):
        calibrate(target, draft, K_max=1, L_max=1, methods=["sd"], context_ids=ctx, drafter="eagle3")


def test_the_drafters_timed_call_replaces_the_draft_models_parts() -> None:
    """With propose_s, (1) is (propose_s[K/L] + target(N) + verify) / ar; a (K, L) it lacks, or a non-model
    drafter's calibration without any, is one clear error."""
    from dataclasses import replace

    cal = replace(hand_calibration(), propose_s={"2/2": 0.005, "1/2": 0.003})
    # (0.005 + target(3) 0.014 + verify 0.0008) / 0.008; the parts (0.002 + 0.0005 + 0.0015 = 0.004) gave 2.35
    np.testing.assert_allclose(iteration_time([3], method="spectr", K=2, L=2, cost=cal), [2.475], rtol=1e-12)
    with pytest.raises(InvalidInputError, match=r"propose_s has no entry '2/1'"):
        iteration_time([2], method="spectr", K=2, L=1, cost=replace(cal, verify_s={"spectr/2/1": 1e-3}))
    lookup = replace(hand_calibration(), drafter={"name": "ngram", "options": {}})
    with pytest.raises(InvalidInputError, match="drafter 'ngram' timed no propose call"):
        iteration_time([3], method="sd", K=1, L=2, cost=lookup)
    with pytest.raises(InvalidInputError, match="propose_s keys must read 'K/L'"):
        replace(hand_calibration(), propose_s={"2": 0.001})
    back = Calibration.from_dict(json.loads(json.dumps(cal.to_dict())))
    assert back.propose_s == cal.propose_s and back.drafter == {"name": "model", "options": {}}


def test_calibrate_refuses_bad_arguments_before_any_work(tiny) -> None:
    target, draft = tiny
    with pytest.raises(UnknownNameError, match="nope"):
        calibrate(target, draft, K_max=2, L_max=2, methods=["nope"], context_ids=[1, 2])
    with pytest.raises(InvalidInputError, match="K must be"):
        calibrate(target, draft, K_max=0, L_max=2, methods=["sd"], context_ids=[1, 2])
    with pytest.raises(InvalidInputError, match="context_ids"):
        calibrate(target, draft, K_max=1, L_max=1, methods=["sd"], context_ids=[1, 999])


# ================================================================================ (d) save / load
def _here_calibration(target=None, draft=None) -> Calibration:
    models = ({"target": model_fingerprint(target), "draft": model_fingerprint(draft)} if target is not None
              else None)
    return hand_calibration(machine=machine_fingerprint("cpu"), models=models)


def test_save_load_round_trip(tmp_path: Path, tiny) -> None:
    target, draft = tiny
    cal = _here_calibration(target, draft)
    path = cal.save(tmp_path / "sub" / "cal.json")
    assert [p.name for p in path.parent.iterdir()] == ["cal.json"]  # no temp file left
    assert json.loads(path.read_text())["target_s"] == {"1": 0.01, "3": 0.014, "5": 0.02}
    back = load_calibration(path, target=target, draft=draft)
    assert back.to_dict() == cal.to_dict()
    assert back.target_s == {1: 0.010, 3: 0.014, 5: 0.020} and back.draft_step_s == {1: 0.001, 2: 0.0015}
    np.testing.assert_allclose(iteration_time(NODES, method="spectr", K=2, L=2, cost=back), [2.35, 2.725, 3.1, 3.1])
    assert Calibration.from_dict(cal.to_dict()) == cal


@pytest.mark.parametrize("field,value", [("hostname", "another-host"), ("cpu", "Some Other CPU"),
                                         ("torch_threads", 97)])
def test_a_file_from_another_machine_is_refused(tmp_path: Path, field: str, value) -> None:
    cal = _here_calibration()
    cal.machine[field] = value
    path = cal.save(tmp_path / "cal.json")
    with pytest.raises(InvalidInputError) as err:
        load_calibration(path)
    msg = str(err.value)
    assert f"machine.{field}" in msg and repr(value) in msg and "delete it or recalibrate" in msg
    assert "\n" not in msg


@pytest.mark.parametrize("role,field", [("target", "parameters"), ("target", "name"), ("draft", "dtype"),
                                        ("draft", "vocab_size")])
def test_a_file_for_other_models_is_refused(tmp_path: Path, tiny, role: str, field: str) -> None:
    target, draft = tiny
    cal = _here_calibration(target, draft)
    cal.models[role][field] = "changed"
    path = cal.save(tmp_path / "cal.json")
    load_calibration(path)  # without models only the machine is checked
    with pytest.raises(InvalidInputError, match=rf"models\.{role}\.{field} is 'changed' in the file.*delete it or recalibrate"):
        load_calibration(path, target=target, draft=draft)


def test_a_file_for_another_drafter_is_refused(tmp_path: Path) -> None:
    from dataclasses import replace

    path = replace(_here_calibration(), drafter={"name": "ngram", "options": {"n_max": 3}}).save(tmp_path / "c.json")
    load_calibration(path, drafter="ngram", drafter_options={"n_max": 3})
    load_calibration(path)  # without a drafter it is not checked
    with pytest.raises(InvalidInputError, match=r"drafter is \{'name': 'ngram'.*\{'name': 'model'.*delete it or"):
        load_calibration(path, drafter="model")
    with pytest.raises(InvalidInputError, match=r"'n_max': 3.*'n_max': 2"):
        load_calibration(path, drafter="ngram", drafter_options={"n_max": 2})


def test_a_file_for_another_pair_is_refused(tmp_path: Path, tiny) -> None:
    from mdv.models.tiny_random import build_tiny_random_pair

    target, draft = tiny
    path = _here_calibration(target, draft).save(tmp_path / "cal.json")
    other_t, other_d, _ = build_tiny_random_pair(seed=1)
    with pytest.raises(InvalidInputError, match=r"models\.target\.name"):
        load_calibration(path, target=other_t, draft=draft)
    with pytest.raises(InvalidInputError, match=r"models\.draft\.name"):
        load_calibration(path, target=target, draft=other_d)


def test_missing_or_corrupt_calibration_files(tmp_path: Path) -> None:
    with pytest.raises(MissingAssetError, match="recalibrate"):
        load_calibration(tmp_path / "absent.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(InvalidInputError, match="unreadable.*delete it"):
        load_calibration(bad)
    rec = _here_calibration().to_dict()
    del rec["verify_s"]
    bad.write_text(json.dumps(rec))
    with pytest.raises(InvalidInputError, match="verify_s"):
        load_calibration(bad)
    rec = _here_calibration().to_dict()
    rec["ar_step_s"] = -1.0
    bad.write_text(json.dumps(rec))
    with pytest.raises(InvalidInputError, match="ar_step_s"):
        load_calibration(bad)


# ================================================================================ (e) cost profiles
def test_the_shipped_gpu_like_profile() -> None:
    prof = load_cost_profile(REPO / "mdv" / "conf" / "cost" / "gpu_like.yaml")
    assert prof == CostProfile(alpha=0.1, c=0.05, name="gpu_like")


def test_a_profile_without_name_takes_the_file_stem(tmp_path: Path) -> None:
    p = tmp_path / "mine.yaml"
    p.write_text("alpha: 0\nc: 0.2\n")
    assert load_cost_profile(p) == CostProfile(alpha=0.0, c=0.2, name="mine")


@pytest.mark.parametrize("text,field,hint", [
    ("name: x\nc: 0.05\n", "alpha", "missing field"),
    ("name: x\nalpha: 0.1\n", "c", "missing field"),
    ("name: x\nalpha: -0.1\nc: 0.05\n", "alpha", ">= 0"),
    ("name: x\nalpha: 0.1\nc: -1\n", "c", ">= 0"),
    ("name: x\nalpha: .nan\nc: 0.05\n", "alpha", "finite"),
    ("name: x\nalpha: 0.1\nc: .inf\n", "c", "finite"),
    ("name: x\nalpha: fast\nc: 0.05\n", "alpha", "number"),
    ("name: x\nalpha: true\nc: 0.05\n", "alpha", "number"),
    ("name: x\nalpha: 0.1\nc: 0.05\nbeta: 1\n", "beta", "unknown field"),
    ("name: 3\nalpha: 0.1\nc: 0.05\n", "name", "string"),
])
def test_cost_profile_errors_name_the_field(tmp_path: Path, text: str, field: str, hint: str) -> None:
    p = tmp_path / "prof.yaml"
    p.write_text(text)
    with pytest.raises(InvalidInputError) as err:
        load_cost_profile(p)
    msg = str(err.value)
    assert f"'{field}'" in msg and hint in msg and "\n" not in msg


def test_cost_profile_file_level_errors(tmp_path: Path) -> None:
    with pytest.raises(MissingAssetError):
        load_cost_profile(tmp_path / "absent.yaml")
    p = tmp_path / "list.yaml"
    p.write_text("- 1\n- 2\n")
    with pytest.raises(InvalidInputError, match="mapping"):
        load_cost_profile(p)
    for kw in ({"alpha": -0.5, "c": 0.1}, {"alpha": 0.1, "c": float("nan")}):
        with pytest.raises(InvalidInputError):
            CostProfile(**kw)
