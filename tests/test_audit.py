"""mdv.audit: the harness against exact computations, the verdicts on mdv's own verifiers, the detection
power on a rule of known bias, the false-alarm rate, stateful rules, bad samplers and the command."""
from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats

import mdv
from mdv.audit import AuditCase, CaseSpec, SamplerError, VerifierSampler, audit, load_specs
from mdv.audit.rules import MoveMass, block_verification_residual_off_by_one
from mdv.audit.run import build_table
from mdv.audit.stats import detectable_tv, holm, prefix_chi_square, tv_interval
from mdv.errors import InvalidInputError
from mdv.oracle import exact_law, random_toy_model, target_law
from mdv.oracle.montecarlo import chi_square, chi_square_pvalue
from mdv.verify.base import Block, Uniforms
from mdv.verify.registry import get_verifier

ROOT = Path(__file__).resolve().parents[1]
LOSSLESS = sorted(n for n, c in mdv.VERIFIERS.items() if c.lossless)
SMALL = 2 ** 14


def _case(name: str) -> CaseSpec:
    return next(s for s in load_specs() if s.name == name)


# ----------------------------------------------------------------------------------- the harness is exact
def test_table_target_law_equals_the_oracle():
    case = AuditCase("t", random_toy_model(3, 5, zero_prob=0.3), random_toy_model(3, 6), K=2, L=2)
    law = build_table(case).target_law(case.n_tokens)
    exact = target_law(case.target, case.n_tokens)
    codes = {tuple(int(x) for x in np.unravel_index(i, (3,) * case.n_tokens)): float(v) for i, v in enumerate(law)}
    assert max(abs(codes[k] - exact.get(k, 0.0)) for k in codes) < 1e-15
    assert abs(float(law.sum()) - 1) < 1e-12


def test_draft_blocks_follow_the_draft_law():
    """The harness's inverse-CDF draws of whole blocks against the exact block law (chi-square, 1e5 draws)."""
    target, draft = random_toy_model(3, 7), random_toy_model(3, 8, zero_prob=0.3)
    table = build_table(AuditCase("d", target, draft, K=1, L=3))
    tokens, path = table.draw_blocks(torch.zeros(100_000, dtype=torch.long), 1, 3, torch.Generator().manual_seed(1))
    counts = Counter(tuple(t) for t in tokens[:, 0].tolist())
    law = {blk: float(np.prod([draft.probs(blk[:i])[blk[i]] for i in range(3)])) for blk in
           [(a, b, c) for a in range(3) for b in range(3) for c in range(3)]}
    assert chi_square_pvalue(counts, {k: v for k, v in law.items() if v > 0}) > 1e-3
    # the rows along each draft are the prefixes' rows: q at depth i is the draft law after D_<i+1
    n = 17
    blk = tuple(tokens[n, 0].tolist())
    for i in range(4):
        assert torch.allclose(table.p[path[n, 0, i]], target.probs(blk[:i]), atol=1e-12, rtol=0)


def test_the_emitted_law_of_a_verifier_equals_its_exact_law():
    """What the harness emits with spectr_gbv (biased) is spectr_gbv's exact law, not the target's: the harness
    chains iterations exactly like the oracle (chi-square against exact_law)."""
    spec = _case("rand-V3-K2-L2")
    case = spec.build()
    from mdv.audit.run import Tally, run_batch
    table = build_table(case)
    tally = Tally.empty(3, case.n_tokens)
    run_batch(VerifierSampler(get_verifier("spectr_gbv")), case, table, 60_000, torch.Generator().manual_seed(3), tally)
    exact = exact_law("spectr_gbv", case.target, case.draft, 2, 2, case.n_tokens)
    law = np.zeros(3 ** case.n_tokens)
    for seq, pr in exact.items():
        law[int(np.ravel_multi_index(seq, (3,) * case.n_tokens))] = pr
    assert chi_square(tally.counts, law)[0] > 1e-3
    assert chi_square(tally.counts, table.target_law(case.n_tokens).numpy())[0] < 1e-6


# ----------------------------------------------------------------------------------- statistics
def test_holm_and_prefix_test():
    assert holm([0.001, 0.02, 0.04], 0.05) == [True, True, True]
    assert holm([0.001, 0.03, 0.04], 0.05) == [True, False, False]
    law = np.full(9, 1 / 9)
    p, df, _ = prefix_chi_square(np.full(9, 1000), law, 3, 2)
    assert p == 1.0 and df == 8
    counts = np.array([1300, 1000, 1000, 1000, 1000, 1000, 700, 1000, 1000])
    p, df, worst = prefix_chi_square(counts, law, 3, 2)
    assert p < 1e-10


def test_tv_interval_covers_and_detectable_tv_is_honest():
    """Over 200 seeds the Weissman interval covers the true TV (0.05 here) every time it should (>= 99%), and
    a bias of the promised detectable TV is detected at >= 80% (measured over 200 seeds)."""
    rng = np.random.default_rng(0)
    P = np.array([0.4, 0.3, 0.2, 0.1])
    R = np.array([0.45, 0.25, 0.2, 0.1])  # TV 0.05
    covered = sum(lo <= 0.05 <= hi for lo, hi in (tv_interval(rng.multinomial(5000, R), P, 0.01)[1:] for _ in range(200)))
    assert covered >= 198
    n, level = 20_000, 1e-3
    eps = detectable_tv(n, 3, level)
    spread = P + eps * np.array([1, -1, 1, -1]) * P / 0.5  # a spread-out bias of TV eps (the hardest shape)
    hits = sum(chi_square(rng.multinomial(n, spread / spread.sum()), P)[0] < level for _ in range(200))
    assert hits >= 0.8 * 200 * 0.9, (eps, hits)


# ----------------------------------------------------------------------------------- verdicts on mdv's verifiers
@pytest.mark.parametrize("method", LOSSLESS)
def test_every_lossless_verifier_is_audited_lossless(method):
    report = audit(method, trials=SMALL, looks=2, tv_resolution=0.06, seed=1)
    assert report.verdict == "lossless", report.summary()
    assert report.lossless is True
    run = [c for c in report.cases if not c.skipped]
    assert len(run) == (16 if mdv.VERIFIERS[method].multi_draft else 5)
    # the measured first-iteration E[tau] agrees with the exact one
    for c in run:
        assert c.mean_tau_low - 0.02 <= c.references[method] <= c.mean_tau_high + 0.02, (c.name, c.mean_tau, c.references)


@pytest.mark.parametrize("rule", ["spectr_gbv", "gbv_no_adjustment"])
def test_biased_rules_are_flagged(rule):
    verifier = get_verifier("gbv", adjust_target=False) if rule == "gbv_no_adjustment" else get_verifier(rule)
    report = audit(verifier, trials=SMALL, looks=2, seed=2)
    assert report.verdict == "biased" and report.lossless is False, report.summary()
    assert len(report.biased_cases) >= 3
    worst = max(report.biased_cases, key=lambda c: c.tv)
    assert worst.tv_low > 0 and worst.excess and worst.excess[0].observed > worst.excess[0].expected


def test_spectr_gbv_exceeds_the_exact_optimum_somewhere():
    report = audit("spectr_gbv", cases=[_case("rand-V2-K4-L3-zeros")], trials=2 ** 16, looks=1)
    (c,) = report.cases
    assert c.exceeds_optimum and c.mean_tau_low > c.lp_greedy, (c.mean_tau_low, c.lp_greedy)
    assert c.references["spectr_gbv"] > c.lp_greedy  # the exact value agrees


# ----------------------------------------------------------------------------------- power and false alarms
def test_a_known_bias_of_tv_0_005_is_found_within_the_default_budget():
    """The docs' promise: a rule at TV 0.005 from the target is found with the default budget (2^20)."""
    report = audit(MoveMass("sd", 0.005), cases=[_case("rand-V3-K1-L2"), _case("iid-V2-K1-L3")],
                   with_references=False, stop_on_bias=True)
    assert report.verdict == "biased", report.summary()
    c = report.biased_cases[0]
    assert c.worst_prefix_length == 1 and c.sequences <= 2 ** 20


def test_the_same_rule_unperturbed_is_not_flagged_and_the_exact_tv_is_as_built():
    cases = [_case("rand-V3-K1-L2")]
    report = audit(MoveMass("sd", 0.0), cases=cases, trials=2 ** 18, with_references=False, tv_resolution=0.02)
    assert report.verdict == "lossless", report.summary()
    biased = audit(MoveMass("sd", 0.05), cases=cases, trials=2 ** 16, looks=1, with_references=False)
    (c,) = biased.cases
    assert c.status == "biased" and c.tv_low <= 0.05 <= c.tv_high


def test_false_alarm_rate_is_at_most_alpha():
    """A lossless rule over 200 seeds at alpha = 0.1 on one case: the number of "biased" verdicts is
    consistent with a rate <= 0.1 (one-sided binomial bound at 0.999)."""
    spec = [_case("rand-V3-K1-L1")]
    alarms = sum(audit("sd", cases=spec, trials=2000, looks=2, alpha=0.1, seed=s, with_references=False).verdict
                 == "biased" for s in range(200))
    assert alarms <= stats.binom.ppf(0.999, 200, 0.1), alarms


# ----------------------------------------------------------------------------------- stateful rules
class PerInstanceGBV:
    """A user's stateful rule: mdv's gbv, one state per instance kept by the object (B = 1 calls)."""

    multi_draft = False

    def __init__(self, reset_every_iteration: bool = False) -> None:
        self.v = get_verifier("gbv")
        self.forget = reset_every_iteration
        self.states: list = []

    def reset(self) -> None:
        self.states = []

    def __call__(self, tokens, q, p, generator):
        N, K, L = tokens.shape
        if not self.states or self.forget:
            self.states = [self.v.initial_state()] * N
        out = torch.empty(3, N, dtype=torch.long)
        for n in range(N):
            block = Block(tokens[n:n + 1], q[n:n + 1], p[n:n + 1])
            o = self.v.sample(block, Uniforms.draw(1, K, L, generator), self.states[n])
            self.states[n] = self.v.advance(self.states[n], block, o)
            out[:, n] = torch.stack([o.tau[0], o.sel[0], o.token[0]])
        return out[0], out[1], out[2]


def test_a_stateful_user_rule_passes_and_the_same_rule_without_its_state_is_flagged():
    cases = [_case("iid-V2-K1-L3")]
    kept = audit(PerInstanceGBV(), cases=cases, trials=3000, looks=1, with_references=False, tv_resolution=0.1)
    assert kept.verdict == "lossless", kept.summary()
    forgot = audit(PerInstanceGBV(reset_every_iteration=True), cases=cases, trials=3000, looks=1, with_references=False)
    assert forgot.verdict == "biased", forgot.summary()


@pytest.mark.parametrize("method", ["gbv", "mdbv"])
def test_the_adapter_samples_stateful_verifiers_through_their_effective_target(method):
    """VerifierSampler samples a batch of mixed states in one call from the initial state with p replaced by
    each instance's effective target; that is the verifier's own sample with the state, on the same uniforms."""
    v = get_verifier(method)
    K = 1 if method == "gbv" else 2
    case = AuditCase("s", random_toy_model(3, 1), random_toy_model(3, 2), K=K, L=2)
    table = build_table(case)
    sampler = VerifierSampler(v)
    g = torch.Generator().manual_seed(0)
    rows = torch.zeros(400, dtype=torch.long)
    for _ in range(2):  # two iterations from the prompt give many distinct states
        tokens, path = table.draw_blocks(rows, K, 2, g)
        sampler(tokens, table.q[path[:, :, :2]], table.p[path], g)
    states = [sampler._states[int(s)] for s in sampler._state_of]
    assert len({id(s) for s in states}) >= 3
    tokens, path = table.draw_blocks(rows, K, 2, g)
    block = Block(tokens, table.q[path[:, :, :2]], table.p[path])
    u = Uniforms.draw(400, K, 2, g)
    for n in range(0, 400, 7):
        b, un = block.select(n), u.select(n)
        direct = v.sample(b, un, states[n])
        shortcut = v.sample(Block(b.tokens, b.q, v.effective_target(b, states[n])), un, v.initial_state())
        assert (int(direct.tau), int(direct.sel), int(direct.token)) == (int(shortcut.tau), int(shortcut.sel), int(shortcut.token))


def test_scalar_functions_are_adapted():
    def reject_everything(tokens, q, p, generator):  # lossless: emit a token from the target law, accept none
        return 0, 0, int(torch.multinomial(p[0, 0], 1, generator=generator))

    report = audit(reject_everything, cases=[_case("rand-V3-K2-L2")], scalar=True, trials=3000, looks=1,
                   tv_resolution=0.2, with_references=False)
    assert report.verdict == "lossless" and report.cases[0].mean_tau == 0.0


def test_the_docs_buggy_rule_is_biased_and_the_bias_sits_at_the_correction():
    report = audit(block_verification_residual_off_by_one, cases=[_case("iid-V2-K1-L3")], trials=2 ** 15, looks=2)
    assert report.verdict == "biased"
    assert report.cases[0].status == "biased"


# ----------------------------------------------------------------------------------- bad samplers
def _returns(value):
    def rule(tokens, q, p, generator):
        return value(tokens.shape[0]) if callable(value) else value
    return rule


_z = lambda n: torch.zeros(n, dtype=torch.long)  # noqa: E731

BAD = {
    "not a tuple": (_returns(lambda n: _z(n)), "must return a tuple (tau, sel, token)"),
    "two outputs": (_returns(lambda n: (_z(n), _z(n))), "of length 2"),
    "wrong shape": (_returns(lambda n: (_z(n + 1), _z(n), _z(n))), "tau must have shape [N]"),
    "float dtype": (_returns(lambda n: (_z(n).double(), _z(n), _z(n))), "tau must be an integer tensor"),
    "NaN": (_returns(lambda n: (_z(n), _z(n), torch.full((n,), float("nan")))), "contains NaN"),
    "numpy": (_returns(lambda n: (np.zeros(n), _z(n), _z(n))), "tau must be a torch int64 tensor"),
    "tau > L": (_returns(lambda n: (_z(n) + 5, _z(n), _z(n))), "tau must lie in [0, L] = [0, 2]"),
    "tau < 0": (_returns(lambda n: (_z(n) - 1, _z(n), _z(n))), "tau = -1"),
    "sel >= K": (_returns(lambda n: (_z(n), _z(n) + 2, _z(n))), "sel must lie in [0, K) = [0, 2)"),
    "token >= V": (_returns(lambda n: (_z(n), _z(n), _z(n) + 3)), "token must lie in the vocabulary [0, V) = [0, 3)"),
}


@pytest.mark.parametrize("what", list(BAD))
def test_bad_sampler_outputs_are_one_clear_error(what):
    rule, message = BAD[what]
    with pytest.raises(SamplerError) as err:
        audit(rule, cases=[_case("rand-V3-K2-L2")], trials=1000, looks=1)
    assert message in str(err.value) and "case rand-V3-K2-L2" in str(err.value) and "iteration 1" in str(err.value)


def test_an_exception_inside_the_sampler_names_where_it_failed():
    calls = []

    def flaky(tokens, q, p, generator):
        calls.append(1)
        if len(calls) == 2:
            raise ZeroDivisionError("my bug")
        return _z(tokens.shape[0]), _z(tokens.shape[0]), _z(tokens.shape[0])

    with pytest.raises(SamplerError, match=r"iteration 2: the sampler raised ZeroDivisionError: my bug"):
        audit(flaky, cases=[_case("rand-V3-K1-L1")], trials=1000, looks=1)


@pytest.mark.parametrize("kwargs, message", [
    ({"trials": 10}, "trials must be an integer >= 1000"),
    ({"alpha": 1.5}, "alpha must lie in (0, 1)"),
    ({"cases": "nope"}, "unknown audit case grid 'nope'"),
    ({"cases": []}, "at least one case"),
    ({"cases": [{"name": "x", "kind": "iid", "K": 1, "L": 1, "target": [0.5, 0.5]}]}, "needs the lists target and draft"),
    ({"cases": [{"name": "x", "colour": 1}]}, "does not fit the case schema"),
    ({"cases": [{"name": "x", "V": 3, "K": 1, "L": 1, "n_tokens": 2}]}, "n_tokens must be an integer >= L + 2"),
])
def test_bad_audit_arguments(kwargs, message):
    with pytest.raises(InvalidInputError) as err:
        audit("sd", **{"trials": 1000, **kwargs})
    assert message in str(err.value)


def test_not_a_rule():
    with pytest.raises(InvalidInputError, match="must be callable"):
        audit(42, cases=[_case("rand-V3-K1-L1")], trials=1000)
    with pytest.raises(InvalidInputError, match="cannot import module 'no_such_module'"):
        audit("no_such_module:verify", trials=1000)
    with pytest.raises(InvalidInputError, match="has no attribute 'nope'"):
        audit("mdv.audit.rules:nope", trials=1000)


# ----------------------------------------------------------------------------------- the command
def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{ROOT}:{cwd}"}
    return subprocess.run([sys.executable, "-m", "experiments.audit", *args, f"hydra.run.dir={cwd / 'out'}", "progress=false"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_command_exit_status_and_outputs(tmp_path):
    (tmp_path / "my_rules.py").write_text(
        "import torch\n"
        "def always_first(tokens, q, p, generator):\n"
        "    n = tokens.shape[0]\n"
        "    z = torch.zeros(n, dtype=torch.long)\n"
        "    return z + tokens.shape[2], z, z  # accepts every draft, bonus token 0: biased\n")
    ok = _cli("sampler=sd", "cases=smoke", "trials=8192", "tv_resolution=0.1", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert "LOSSLESS" in ok.stdout
    for name in ("audit.md", "audit.csv", "audit.json", "audit.png"):
        assert (tmp_path / "out" / name).stat().st_size > 0
    bad = _cli("sampler=my_rules:always_first", "cases=smoke", "trials=4096", cwd=tmp_path)
    assert bad.returncode == 1 and "BIASED" in bad.stdout, bad.stderr[-2000:]
    assert "| biased |" in (tmp_path / "out" / "audit.md").read_text()
    gone = _cli("sampler=my_rules:nothing", "cases=smoke", cwd=tmp_path)
    assert gone.returncode == 2 and gone.stderr.strip().splitlines()[-1].startswith("error: sampler='my_rules:nothing'")
    weak = _cli("sampler=gbv", "+options.adjust_target=true", "cases=smoke", "trials=2048", "tv_resolution=0.001",
                cwd=tmp_path)
    assert weak.returncode == 3 and "INCONCLUSIVE" in weak.stdout, weak.stderr[-2000:]


def test_reference_figures_belong_to_their_own_pair():
    """Exact figures are cached per model pair: two specs that differ in one field (zero_prob) get their own,
    and one spec built twice shares its models (and the cached figures)."""
    from mdv.audit.audit import references
    a = CaseSpec(name="a", V=3, K=1, L=2, seed=5, zero_prob=0.0)
    b = CaseSpec(name="a", V=3, K=1, L=2, seed=5, zero_prob=0.9)
    assert a.build() is a.build() and a.build() is not b.build()
    ra, rb = references(a.build()), references(b.build())
    exact = mdv.oracle.expected_accepted("sd", b.build().target, b.build().draft, 1, 2)
    assert rb[2]["sd"] == pytest.approx(exact, abs=1e-12) and ra[2]["sd"] != rb[2]["sd"]
