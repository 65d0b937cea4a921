"""The ``eagle`` drafter (:mod:`mdv.drafters.eagle`) and its recipe's pure pieces (:mod:`mdv.distill.eagle`).

* Parity: along real generations with accepts and rejects (tree and rows passes), every q the verifier saw
  equals :meth:`EagleDrafter.reference_law` (one full target pass, then the layer over the whole sequence
  once per drafted position, no cache) to 1e-9 in float64.
* Features: after every iteration the drafter's target features equal a fresh full pass over the committed
  prefix, and its own cache holds no position computed from a predicted feature.
* Law of the draws (chi-square), losslessness (T = 0 equality with AR greedy for every lossless verifier;
  the law of the first 3 tokens at T > 0), the vocabulary-subset head (q = 0 outside it).
* The shipped drafter loads with the default pair and is lossless there; files and bad input give one line.
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch

import mdv
from mdv.drafters import get_drafter
from mdv.drafters.base import Draft
from mdv.drafters.eagle import EagleDrafter, EagleNet, layer_config, load_eagle, save_eagle, target_features
from mdv.engine import StepRecord, generate
from mdv.errors import InvalidInputError, MdvError, MissingAssetError
from mdv.models.default_pair import write_head_ids
from mdv.models.hf import HFModel
from mdv.models.sampling import SamplingConfig
from mdv.oracle import target_law
from mdv.oracle.montecarlo import chi_square_pvalue
from tests.test_engine import greedy_reference
from tests.test_hf_model import tiny_llama

LOSSLESS = sorted(n for n, c in mdv.VERIFIERS.items() if c.lossless)
ALPHA = 1e-3
PROMPT = [1, 5, 7, 5, 7, 9, 5, 7]


def make_eagle_file(target: HFModel, folder: Path, seed: int = 0, subset: list[int] | None = None) -> Path:
    """A random eagle drafter for ``target`` (float64, weights scaled so its laws are not flat), saved."""
    torch.manual_seed(seed)
    net = EagleNet(layer_config(target.config)).double()
    with torch.no_grad():
        for p in net.parameters():
            p.mul_(3.0)
    folder.mkdir(parents=True, exist_ok=True)
    ids_file = None
    if subset is not None:
        ids_file = folder / "tiny.head_ids.json"
        write_head_ids(ids_file, subset, target.vocab_size)
    return save_eagle(net, folder / "tiny-eagle.json", {"recipe": "tests"}, vocab_size=target.vocab_size,
                      head_ids_file=ids_file, dtype=torch.float64)


@pytest.fixture(scope="module")
def target3() -> HFModel:
    return HFModel(tiny_llama(16, seed=4, layers=3, scale=6.0))


@pytest.fixture(scope="module")
def eagle_file(target3, tmp_path_factory) -> Path:
    return make_eagle_file(target3, tmp_path_factory.mktemp("eagle"), subset=list(range(0, 16, 2)) + [1, 3, 5, 7, 9])


def bound(target: HFModel, file: Path) -> EagleDrafter:
    drf = get_drafter("eagle", file=str(file))
    drf.bind(target, None)
    return drf


def worst_q_gap(drf, records: list[StepRecord]) -> tuple[float, int]:
    """The largest |q - drf.reference_law| over every drafted position the verifier saw, and how many laws."""
    worst, checked = 0.0, 0
    for rec in records:
        for k in range(rec.block.K):
            for i in range(rec.block.L):
                ctx = list(rec.context) + rec.block.tokens[0, k, :i].tolist()
                ref = drf.reference_law(ctx, SamplingConfig(1.0), committed=len(rec.context))
                worst = max(worst, (rec.block.q[0, k, i] - ref).abs().max().item())
                checked += 1
    return worst, checked


# ---------------------------------------------------------------------------------- parity and features
@pytest.mark.parametrize("target_pass", ["tree", "rows"])
def test_recorded_q_equals_the_reference_law_along_generations(target3, eagle_file, target_pass: str) -> None:
    drf = bound(target3, eagle_file)
    records: list[StepRecord] = []
    for seed in range(3):
        generate(target3, None, PROMPT, "spectr", K=3, L=3, max_new_tokens=20, seed=seed, eos_token_id=[],
                 drafter=drf, on_step=records.append, target_pass=target_pass)
    rejected = sum(int(rec.outcome.tau[0]) < rec.block.L for rec in records)
    worst, checked = worst_q_gap(drf, records)
    assert rejected > 5 and checked > 100, (rejected, checked)
    assert worst < 1e-9, worst


def test_the_layer_runs_on_the_lean_loop_and_transformers_is_its_fallback(target3, eagle_file, monkeypatch) -> None:
    """The drafter's layer runs on the lean forward's layer loop (LeanLayerSession) where that loop runs it, on
    transformers' forward and DynamicCache otherwise; both hold q to the reference law (transformers' forward,
    no cache) along generations with accepts and rejects, and emit AR greedy's tokens at T = 0."""
    import mdv.models.lean as lean_mod
    from mdv.drafters.eagle import TransformersLayerSession
    from mdv.models.lean import LeanLayerSession

    ref = greedy_reference(target3, PROMPT, 16)
    for forced_fallback, kind in ((False, LeanLayerSession), (True, TransformersLayerSession)):
        if forced_fallback:
            monkeypatch.setattr(lean_mod, "lean_layer_support", lambda dec, cfg=None, name=None: "forced for the test")
        drf = bound(target3, eagle_file)
        records: list[StepRecord] = []
        generate(target3, None, PROMPT, "mdbv", K=2, L=3, max_new_tokens=16, seed=5, eos_token_id=[],
                 drafter=drf, on_step=records.append)
        assert isinstance(drf._cache, kind)
        worst, _ = worst_q_gap(drf, records)
        assert worst < 1e-9, (kind, worst)
        greedy = generate(target3, None, PROMPT, "spectr", K=3, L=3, temperature=0.0, max_new_tokens=16,
                          eos_token_id=[], drafter=drf).tokens
        assert greedy == ref, kind


def test_the_lean_layer_session_refuses_misplaced_inputs(target3, eagle_file) -> None:
    from mdv.models.lean import LeanLayerSession

    drf = bound(target3, eagle_file)
    sess = LeanLayerSession(drf.net.decoder)
    d = drf.net.hidden_size
    x = torch.zeros(1, 2, d, dtype=torch.float64)
    assert sess.run(x, torch.arange(2).unsqueeze(0)).shape == (1, 2, d) and sess.length == 2
    for bad_x, bad_pos in ((x, torch.arange(2).unsqueeze(0)),  # positions 0.. again: they must go on at 2
                           (torch.zeros(2, 1, d, dtype=torch.float64), torch.full((2, 1), 2)),  # 2 rows, one held
                           (torch.zeros(1, 3, d, dtype=torch.float64), torch.tensor([[2, 3]]))):  # 3 inputs, 2 positions
        with pytest.raises(InvalidInputError, match="run\\(\\) takes"):
            sess.run(bad_x, bad_pos)
    with pytest.raises(InvalidInputError, match="runs LlamaDecoderLayer"):
        LeanLayerSession(torch.nn.Module())


def test_reference_law_depends_on_what_is_committed(target3, eagle_file) -> None:
    """The same tokens give another law when the last one is drafted (its feature the drafter's own), so the
    parity above can tell a drafter that used the wrong feature."""
    drf = bound(target3, eagle_file)
    ctx = PROMPT + [3]
    a = drf.reference_law(ctx, SamplingConfig(1.0), committed=len(ctx))
    b = drf.reference_law(ctx, SamplingConfig(1.0), committed=len(ctx) - 1)
    assert (a - b).abs().max().item() > 1e-3


def test_features_after_accepts_and_rejects_equal_a_fresh_pass(target3, eagle_file) -> None:
    drf = bound(target3, eagle_file)
    seen: list[tuple[int, float]] = []

    def check(rec: StepRecord) -> None:
        tau = int(rec.outcome.tau[0])
        committed = list(rec.context) + list(rec.emitted)
        n_target = len(rec.context) + tau  # positions the target's cache holds after the iteration
        fresh = target_features(target3.model, committed[:n_target])  # [n_target, d]
        held = drf.committed_features
        assert held.shape == fresh.shape, (len(rec.context), tau, len(rec.emitted), rec.iteration)
        seen.append((tau, (held - fresh).abs().max().item()))
        assert drf.cached_positions <= len(rec.context)  # nothing computed from a predicted feature is kept

    for seed, tp in ((0, "tree"), (1, "rows")):
        generate(target3, None, PROMPT, "mdbv", K=2, L=3, max_new_tokens=24, seed=seed, eos_token_id=[],
                 drafter=drf, on_step=check, target_pass=tp)
    taus = {t for t, _ in seen}
    assert len(seen) > 8 and 0 in taus and len(taus) >= 3, taus  # rejections at several depths
    assert max(e for _, e in seen) < 1e-9


class _SkippingEagle(EagleDrafter):
    """``eagle`` that proposes no block every other call where the engine allows it (as ``ngram`` does on a
    miss): the engine's undrafted steps must hand it the pending chain's features like a verified block."""

    name = "skipping_eagle"

    def __init__(self, **opts) -> None:
        super().__init__(**opts)
        self.calls = self.skipped = 0

    def propose(self, seq, K, L, sampling, generator, shorter_ok=False):
        self.calls += 1
        if shorter_ok and self.calls % 2 == 0:
            self.skipped += 1
            self._n = len(seq)  # what commit() crops the drafter's cache to: nothing was drafted
            V = self.target.vocab_size
            return Draft(torch.empty(K, 0, dtype=torch.long), torch.empty(K, 0, V, dtype=torch.float64), calls=0)
        return super().propose(seq, K, L, sampling, generator, shorter_ok)


def test_undrafted_steps_hand_the_features_over(target3, eagle_file, monkeypatch) -> None:
    """After undrafted steps, the features the drafter holds equal a fresh target pass, and the drafter never
    had to recompute one itself (the engine handed every committed position over)."""
    import mdv.drafters.eagle as eagle_module

    drf = _SkippingEagle(file=str(eagle_file))
    drf.bind(target3, None)
    own_passes = []
    real = eagle_module.target_features
    monkeypatch.setattr(eagle_module, "target_features", lambda *a, **k: own_passes.append(1) or real(*a, **k))
    seen: list[float] = []

    def check(rec: StepRecord) -> None:
        tau = int(rec.outcome.tau[0])
        n_target = len(rec.context) + tau
        fresh = target_features(target3.model, (list(rec.context) + list(rec.emitted))[:n_target])
        held = drf.committed_features
        assert held.shape == fresh.shape, (len(rec.context), tau, rec.iteration)
        seen.append((held - fresh).abs().max().item())
        before = len(own_passes)  # the reference law below runs its own full pass: not the drafter's
        ref = drf.reference_law(list(rec.context), SamplingConfig(1.0), committed=len(rec.context))
        del own_passes[before:]
        for k in range(rec.block.K):  # the recorded q is the reference law after the undrafted steps
            assert (rec.block.q[0, k, 0] - ref).abs().max().item() < 1e-9

    for seed, tp in ((0, "tree"), (1, "rows")):
        res = generate(target3, None, PROMPT, "spectr", K=2, L=3, max_new_tokens=20, seed=seed, eos_token_id=[],
                       drafter=drf, on_step=check, target_pass=tp)
        assert res.stats["undrafted_steps"] >= 3
    assert drf.skipped >= 6 and len(seen) >= 6 and max(seen) < 1e-9
    assert not own_passes


def test_drawn_tokens_follow_the_recorded_law(target3, eagle_file) -> None:
    drf = bound(target3, eagle_file)
    sampling = SamplingConfig(1.0)
    seq = [1, 5, 7, 5, 8, 5, 9, 2, 5]
    gen = torch.Generator().manual_seed(11)
    pairs, firsts = Counter(), Counter()
    for _ in range(1500):
        drf.prefill(seq)  # no features handed over: the drafter computes them with one target pass
        t = drf.propose(seq, 2, 2, sampling, gen).tokens.tolist()
        pairs[(t[0][0], t[0][1])] += 1
        firsts[(t[0][0], t[1][0])] += 1
    q0 = drf.reference_law(seq, sampling)
    law_pairs = {(a, b): float(q0[a]) * float(drf.reference_law(seq + [a], sampling, committed=len(seq))[b])
                 for a in range(16) if q0[a] > 0 for b in range(16)}
    law_firsts = {(a, b): float(q0[a] * q0[b]) for a in range(16) for b in range(16)}
    assert chi_square_pvalue(pairs, law_pairs) > ALPHA
    assert chi_square_pvalue(firsts, law_firsts) > ALPHA
    assert len(pairs) >= 3
    # the wrong feature for the second token (the target's instead of the drafter's) is rejected
    wrong = {(a, b): float(q0[a]) * float(drf.reference_law(seq + [a], sampling)[b])
             for a in range(16) if q0[a] > 0 for b in range(16)}
    assert chi_square_pvalue(pairs, wrong) < ALPHA


def test_the_paired_probe_rewinds_and_extends_with_the_exact_law(target3, eagle_file) -> None:
    """The paired measurement drafts twice at a context, then at contexts that jump ahead (no engine hands
    features over there: the drafter computes them), rewinding its cache each time."""
    from mdv.paired.measure import ContextProbe

    sampling = SamplingConfig(1.0)
    probe = ContextProbe(target3, None, PROMPT, sampling, seed=5, drafter="eagle",
                         drafter_options={"file": str(eagle_file)})
    drf = probe.drafter
    for extra in ([], [], [3], [3, 4, 9, 2]):
        ctx = PROMPT + extra
        meas = probe.measure(ctx, 3, 2, ["sd", "spectr"])
        q, toks = meas.block.q[0], meas.block.tokens[0]  # [3, 2, V], [3, 2]
        for k in range(3):
            for i in range(2):
                ref = drf.reference_law(ctx + toks[k, :i].tolist(), sampling, committed=len(ctx))
                assert (q[k, i] - ref).abs().max().item() < 1e-9
        assert drf.cached_positions <= len(ctx) - 1 and drf.committed_features.shape[0] == len(ctx) - 1


def test_the_subset_head_gives_q_zero_outside_it(target3, eagle_file) -> None:
    drf = bound(target3, eagle_file)
    q = drf.reference_law(PROMPT, SamplingConfig(1.0))
    outside = [i for i in range(16) if i not in set(range(0, 16, 2)) | {1, 3, 5, 7, 9}]
    assert float(q[outside].sum()) == 0.0 and abs(float(q.sum()) - 1.0) < 1e-12
    full = get_drafter("eagle", file=str(eagle_file), head="full")
    full.bind(target3, None)
    assert float(full.reference_law(PROMPT, SamplingConfig(1.0))[outside].sum()) > 0


# ---------------------------------------------------------------------------------- lossless
GREEDY_CASES = [(m, K) for m in LOSSLESS for K in ((1, 3) if mdv.VERIFIERS[m].multi_draft else (1,))]


@pytest.mark.parametrize("method,K", GREEDY_CASES)
def test_greedy_equals_autoregressive_greedy(target3, eagle_file, method: str, K: int) -> None:
    ref = greedy_reference(target3, PROMPT, 20)
    res = generate(target3, None, PROMPT, method, K=K, L=3, temperature=0.0, max_new_tokens=20, eos_token_id=[],
                   drafter="eagle", drafter_options={"file": str(eagle_file)})
    assert res.tokens == ref
    assert res.stats["drafter"] == "eagle"


@pytest.mark.parametrize("method,K", [("sd", 1), ("spectr", 3)])
def test_greedy_on_the_lean_forward_equals_autoregressive_greedy(target3, eagle_file, method: str, K: int) -> None:
    """The lean forward (mdv.models.lean) records the same features for eagle, so T = 0 stays AR greedy."""
    from mdv.models.lean import LeanModel

    ref = greedy_reference(target3, PROMPT, 20)
    res = generate(LeanModel.of(target3), None, PROMPT, method, K=K, L=3, temperature=0.0, max_new_tokens=20,
                   eos_token_id=[], drafter="eagle", drafter_options={"file": str(eagle_file)})
    assert res.tokens == ref


LAW_SAMPLING = {"temperature": 0.9, "top_k": 5}
LAW_PROMPT = [3, 4, 3, 4, 3]


@pytest.fixture(scope="module")
def pair8(tmp_path_factory) -> tuple[HFModel, dict[tuple[int, ...], float], Path]:
    target = HFModel(tiny_llama(8, seed=7, layers=2, scale=15.0))
    return (target, target_law(target, 3, LAW_PROMPT, **LAW_SAMPLING),
            make_eagle_file(target, tmp_path_factory.mktemp("eagle8"), seed=1))


@pytest.mark.parametrize("method", ["sd", "spectr", "mdbv"])
def test_law_of_first_tokens(pair8, method: str) -> None:
    target, law, file = pair8
    drf = bound(target, file)
    K = 2 if mdv.VERIFIERS[method].multi_draft else 1
    counts: Counter = Counter()
    for seed in range(600):
        res = generate(target, None, LAW_PROMPT, method, K=K, L=2, max_new_tokens=3, seed=seed, eos_token_id=[],
                       drafter=drf, **LAW_SAMPLING)
        counts[tuple(res.tokens)] += 1
    p = chi_square_pvalue(counts, law)
    assert p > ALPHA, f"eagle/{method}: chi-square p = {p:.3g} against the exact target law"


def test_the_shipped_drafter_is_lossless_on_the_default_pair() -> None:
    from mdv.models.default_pair import load_default_pair

    target, draft, tok = load_default_pair()
    t = HFModel(target, tok)
    from mdv.distill.data import chat_ids

    prompt = chat_ids(tok, "What is 12 times 7? Explain each step.")
    ar = generate(t, None, prompt, "ar", temperature=0.0, max_new_tokens=24, eos_token_id=[]).tokens
    for method, K in (("sd", 1), ("mdbv", 2)):
        res = generate(t, None, prompt, method, K=K, L=4, temperature=0.0, max_new_tokens=24, eos_token_id=[],
                       drafter="eagle")
        assert res.tokens == ar, method
        assert len(res.stats["accepted_lengths"]) < 24  # it drafts: more than one token per target pass
    cfg = json.loads((Path(mdv.__file__).parent / "assets_data" / "smollm2-135m-instruct-eagle.json").read_text())
    assert cfg["head_vocab_subset"] == "smollm2-135m-instruct-draft.head_ids.json"
    assert Path(mdv.__file__).parent.joinpath("assets_data", cfg["weights_file"]).stat().st_size <= 30e6


# ---------------------------------------------------------------------------------- on weight panels
@pytest.fixture(scope="module")
def pair48(tmp_path_factory):
    """A float32 tiny pair (panels run float32) and an eagle drafter file for its target."""
    from mdv.models.panels import panel_kernel_status
    from mdv.models.tiny_random import build_tiny_random_pair

    ok, why = panel_kernel_status()
    if not ok:
        pytest.skip(why)
    target, draft, _ = build_tiny_random_pair(vocab_size=96, seed=3, hidden_size=48, num_layers=2)
    return target, draft, make_eagle_file(target, tmp_path_factory.mktemp("eagle48"), seed=2,
                                          subset=list(range(0, 96, 2)) + [1, 3, 5])


def test_on_panels_the_drafter_packs_its_own_linears(pair48) -> None:
    """With the target on weight panels the drafter's fc, layer and subset head go on panels too: in the draft
    model's panel dtype, float32 without one, or the ``panel_dtype`` option; with the target plain, nowhere."""
    from mdv.models.panels import PanelPacks, panel_dtype_of

    target, draft, file = pair48
    plain = bound(target, file)
    assert plain.panel_dtype is None and panel_dtype_of(plain.net) is None
    with PanelPacks(target.model), PanelPacks(draft.model, dtype=torch.float16):
        assert panel_dtype_of(target.model) == torch.float32 and panel_dtype_of(draft.model) == torch.float16
        for drf_draft, option, want in ((draft, None, torch.float16), (None, None, torch.float32),
                                        (draft, "int8", torch.int8), (None, "float16", torch.float16)):
            drf = get_drafter("eagle", file=str(file), panel_dtype=option)
            drf.bind(target, drf_draft)
            assert drf.panel_dtype == want and panel_dtype_of(drf.net) == want
            assert drf.head.head.__dict__["_mdv_panels"].dtype == want  # the subset head's rows
            assert "_mdv_panels" in drf.net.fc.__dict__
    with pytest.raises(InvalidInputError, match="panel_dtype"):
        get_drafter("eagle", file=str(file), panel_dtype="bfloat16")


@pytest.mark.parametrize("panel_dtype", ["float32", "int8"])
def test_on_panels_recorded_q_is_the_reference_law_and_greedy_is_ar(pair48, panel_dtype: str) -> None:
    """On panels (the target's in float32, the drafter's own in ``panel_dtype``, the lean forward) every q the
    verifier saw is the drafter's reference law on the same panels, to float32 rounding (the cached steps and
    the full recomputation multiply different row counts), and T = 0 still emits AR greedy's tokens."""
    from mdv.models.lean import LeanModel
    from mdv.models.panels import PanelPacks

    target, _, file = pair48
    lean = LeanModel.of(target)
    prompt = [1, 5, 9, 13, 5, 9]
    ar = generate(lean, None, prompt, "ar", temperature=0.0, max_new_tokens=24, eos_token_id=[]).tokens
    with PanelPacks(target.model):
        ar_panels = generate(lean, None, prompt, "ar", temperature=0.0, max_new_tokens=24, eos_token_id=[]).tokens
        drf = get_drafter("eagle", file=str(file), panel_dtype=panel_dtype)
        records: list[StepRecord] = []
        for seed in range(2):
            generate(lean, None, prompt, "spectr", K=3, L=3, max_new_tokens=16, seed=seed, eos_token_id=[],
                     drafter=drf, on_step=records.append)
        assert drf.panel_dtype == getattr(torch, panel_dtype)
        worst, checked = worst_q_gap(drf, records)
        greedy = {m: generate(lean, None, prompt, m, K=K, L=3, temperature=0.0, max_new_tokens=24, eos_token_id=[],
                              drafter="eagle", drafter_options={"file": str(file), "panel_dtype": panel_dtype}).tokens
                  for m, K in (("sd", 1), ("spectr", 3), ("mdbv", 3))}
    print(f"{checked} laws, worst |q - reference| {worst:.2e}")
    assert checked > 50 and worst < 1e-5, (checked, worst)
    assert ar_panels == ar and all(tokens == ar for tokens in greedy.values()), (ar, ar_panels, greedy)


def test_step_cost_times_both_paths_side_by_side(pair48) -> None:
    """The recipe's step cost (eagle_report.json) times the target step and the drafter's on the plain path and
    on the fast path (every panel dtype), and each ratio is its drafter's median over the target's."""
    from mdv.distill.eagle import step_cost
    from mdv.drafters.eagle import EAGLE_PANEL_DTYPES
    from mdv.models.panels import panel_dtype_of

    target, _, file = pair48
    cost = step_cost(target.model, file, [1, 5, 9, 13, 5, 9], reps=3)
    fast = cost["fast_path"]
    assert set(cost["ms"]) == {"target", "eagle_1", "eagle_3"}
    assert set(fast["ms"]) == {"target"} | {f"eagle_1_{d}" for d in EAGLE_PANEL_DTYPES}
    for part in (cost, fast):
        assert all(v > 0 for v in part["ms"].values())
        for key, ratio in part["ratio_to_target"].items():
            assert ratio == pytest.approx(part["ms"][key] / part["ms"]["target"], rel=2e-2)  # ms rounded to 1 us
    assert panel_dtype_of(target.model) is None  # the packs are closed again


# ---------------------------------------------------------------------------------- the calibration
def test_the_calibration_times_the_eagle_call(target3, eagle_file) -> None:
    """mdv.paired.cost.calibrate(drafter="eagle"): the drafter gets the prefill's features, every (K, L) call
    is timed, and the target is left as prefilled, still recording features (as in the engine)."""
    from mdv.paired.cost import calibrate

    tgt, drf = target3.new_session(), target3.new_session()
    with torch.inference_mode():
        cal = calibrate(target3, target3, K_max=2, L_max=2, methods=["sd"], context_ids=PROMPT * 2, repeats=1,
                        sessions=(tgt, drf), drafter="eagle", drafter_options={"file": str(eagle_file)})
    assert cal.drafter == {"name": "eagle", "options": {"file": str(eagle_file)}}
    assert sorted(cal.propose_s) == ["1/1", "1/2", "2/1", "2/2"] and min(cal.propose_s.values()) > 0
    assert (tgt.length, tgt.rows) == (2 * len(PROMPT) - 1, 1) and tgt.record_features


# ---------------------------------------------------------------------------------- files and bad input
def test_save_and_load_round_trip(target3, eagle_file) -> None:
    net, cfg, ids = load_eagle(eagle_file)
    assert cfg["hidden_size"] == 32 and cfg["vocab_size"] == 16 and ids == sorted(set(range(0, 16, 2)) | {1, 3, 5, 7, 9})
    assert net.config.num_hidden_layers == 1 and net.decoder.embed_tokens is None


def test_a_drafter_for_another_target_is_one_clear_error(eagle_file) -> None:
    other = HFModel(tiny_llama(8, seed=1))
    with pytest.raises(InvalidInputError, match=r"was trained for another target \(hidden size 32, vocabulary 16\);"
                                                r" this target has hidden size 32 and vocabulary 8"):
        generate(other, None, [1, 2, 3], "sd", max_new_tokens=2, drafter="eagle",
                 drafter_options={"file": str(eagle_file)})
    wider = HFModel(tiny_llama(16, seed=1, hidden=48))
    with pytest.raises(InvalidInputError, match=r"hidden size 32, vocabulary 16\); this target has hidden size 48"):
        generate(wider, None, [1, 2, 3], "sd", max_new_tokens=2, drafter="eagle",
                 drafter_options={"file": str(eagle_file)})


def test_missing_or_corrupt_files_are_one_clear_error(target3, eagle_file, tmp_path: Path) -> None:
    with pytest.raises(MissingAssetError, match="eagle drafter file not found: .*train_eagle.py"):
        bound(target3, tmp_path / "none.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(MissingAssetError, match="is not an eagle drafter config"):
        bound(target3, bad)
    copy = tmp_path / "copy"
    copy.mkdir()
    for f in eagle_file.parent.iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    w = copy / "tiny-eagle.safetensors"
    w.write_bytes(w.read_bytes()[:-8] + b"\0" * 8)
    with pytest.raises(MissingAssetError, match="does not match the sha256"):
        bound(target3, copy / "tiny-eagle.json")


@pytest.mark.parametrize("opts,match", [
    ({"head": "half"}, "head must be 'subset' or 'full'"),
    ({"file": 3}, "file must be the path of an eagle JSON config"),
    ({"layers": 2}, r"drafter 'eagle' has no option\(s\) 'layers'"),
])
def test_bad_options_are_one_clear_error(target3, opts, match) -> None:
    with pytest.raises(MdvError, match=match):
        generate(target3, None, PROMPT, "sd", max_new_tokens=2, drafter="eagle", drafter_options=opts)


def test_eagle_needs_a_transformers_target() -> None:
    from mdv.models.callable import CallableLM

    lm = CallableLM(lambda prefixes: torch.zeros(len(prefixes), 5), vocab_size=5)
    with pytest.raises(InvalidInputError, match="drafter 'eagle' needs the target as an mdv.models.HFModel"):
        generate(lm, None, [1, 2], "sd", drafter="eagle", max_new_tokens=2)


# ---------------------------------------------------------------------------------- the recipe's pieces
def test_recipe_option_checks() -> None:
    from omegaconf import OmegaConf

    from mdv.distill.eagle import check_options

    cfg = OmegaConf.load("mdv/conf/train_eagle.yaml")
    check_options(cfg)
    for key, value, match in (("train.unroll", 3, "unroll must be 1 or 2"), ("eagle.head", "half", "eagle.head"),
                              ("train.steps", 0, "train.steps must be an integer >= 1"),
                              ("eagle.fc_init", "zeros", "fc_init must be identity or random")):
        bad = cfg.copy()
        OmegaConf.update(bad, key, value)
        with pytest.raises(InvalidInputError, match=match):
            check_options(bad)


def test_shifted_features_are_the_previous_positions() -> None:
    from mdv.distill.eagle import shifted

    h = torch.arange(12.0).view(1, 4, 3)
    s = shifted(h)
    assert torch.equal(s[0, 0], torch.zeros(3)) and torch.equal(s[0, 1:], h[0, :3])


def test_generations_asset_round_trip(tmp_path: Path) -> None:
    from mdv.distill.data import pack_generations, unpack_generations

    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    for k in ("aa", "bb"):
        (src / f"gen-{k}.json").write_text(json.dumps({"continuations": [[1, 2, k == "aa" and 3 or 4]], "seconds": 1.5}))
    asset = tmp_path / "gens.json.gz"
    digest = pack_generations(["aa", "bb"], src, asset)
    assert len(digest) == 64 and pack_generations(["aa", "bb"], src, asset) == digest  # byte-identical
    assert unpack_generations(asset, dst) == 2 and unpack_generations(asset, dst) == 0
    assert json.loads((dst / "gen-bb.json").read_text())["continuations"] == [[1, 2, 4]]
    asset.write_bytes(asset.read_bytes() + b"x")
    with pytest.raises(MissingAssetError, match="does not match its sha256"):
        unpack_generations(asset, dst)
    assert unpack_generations(tmp_path / "absent.json.gz", dst) == 0


def test_the_recipe_feature_pass_equals_one_pass_per_sequence(target3) -> None:
    """Batched with right padding (the recipe's step 2) = each sequence alone (causal: exact up to rounding)."""
    from mdv.distill.eagle import target_features_batch

    seqs = [{"ids": [1, 5, 7, 5, 2, 9, 3]}, {"ids": [4, 4, 1]}, {"ids": [2, 3, 5, 7, 11 % 16]}]
    feats, _ = target_features_batch(target3.model, seqs, batch=3, cache=None)
    for s, f in zip(seqs, feats):
        want = target_features(target3.model, s["ids"])
        assert f.shape == want.shape
        torch.testing.assert_close(f.double(), want.half().double(), rtol=0, atol=0)  # stored as fp16
