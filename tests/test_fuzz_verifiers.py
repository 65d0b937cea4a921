"""Property-based fuzzing of every verifier in ``mdv.VERIFIERS`` (issue 6, "Fuzzed verifiers").

Each generated case is a prefix-dependent toy model pair whose next-token laws come from a small
hypothesis-drawn table (rows with exact zeros, entries near 1e-30 and 1e-300, one-hot rows, uniform
rows; V = 1..8; the draft table independent of, identical to, or partly equal to the target's),
K i.i.d. draft blocks of length L (K, L up to 16; K = 1 for single-draft verifiers, K <= 3 for
``select_gbv``, whose reference enumerates the survivors' next tokens) drawn along the
draft model (drafted tokens have q > 0; drafts sharing a prefix share their p / q rows because both are
functions of the prefix), and explicit uniforms (random, all 0, all just below 1, or a mix).  Stateful
verifiers (``gbv``, ``mdbv``, ``select_gbv``) run 1-3 consecutive iterations so their target adjustment is exercised.

Properties:

* ``test_outcomes_and_laws_are_valid`` -- ``sample`` returns tau in [0, L], sel in [0, K) (0 for
  single-draft verifiers), token ids in [0, V); ``law`` (where its size is moderate) has finite
  branch probabilities in [0, 1] summing to 1 and next-token laws in [0, 1] summing to 1; the sampled
  outcome lies in the support of the law; a lossless verifier never emits a token the target gives
  probability 0.
* ``test_sample_equals_reference`` -- the fast sampler and the scalar reference agree draw for draw
  (K·L <= 12, random uniforms, blocks whose plain products stay in float64's normal range: the
  references are deliberately plain-product transcriptions; underflow is tests/test_numerics.py's).
* ``test_single_draft_identities`` -- at K = 1, ``spectr`` decides exactly as ``sd``, and ``mdbv`` and
  ``select_gbv`` as ``gbv`` (state carried), on the same uniforms, degenerate ones included.
* ``test_lossless_exact_on_tiny_cases`` -- lossless verifiers reproduce the target law of the first
  L + 1 tokens by exact enumeration (V <= 3, K·L <= 6, TV < 1e-9), at temperatures 0, 0.5, 1 and 2.

Case counts are fixed (``derandomize=True``, no example database) so CI is reproducible; see
docs/robustness.md.  ``MDV_FUZZ_SCALE=10`` multiplies every count for a longer local run (the examples
then differ from CI's); ``MDV_FUZZ_STATS=path.json`` writes the number of cases run per property and
verifier, with coverage counters (sizes, uniform and draft modes, underflowing joints).
"""
from __future__ import annotations

import json
import math
import os
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch
from torch import Tensor
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import mdv
from mdv.models.callable import CallableLM
from mdv.oracle import exact_law, target_law, total_variation
from mdv.verify import Block, Outcome, Uniforms, Verifier

torch.set_num_threads(1)

ALL_METHODS = sorted(mdv.VERIFIERS)
LOSSLESS = sorted(name for name, cls in mdv.VERIFIERS.items() if cls.lossless)

SCALE = float(os.environ.get("MDV_FUZZ_SCALE", "1"))
# Examples per verifier and property: together >= 2,000 per verifier (lossy verifiers get more
# validity cases because the exactness property does not apply to them).
N_VALID = {True: round(1500 * SCALE), False: round(1700 * SCALE)}  # keyed by "is lossless"
N_REFERENCE = round(300 * SCALE)
N_EXACT = round(200 * SCALE)
N_IDENTITY = round(1000 * SCALE)

#: Cases run and coverage counters, keyed by "property/method" (written out with MDV_FUZZ_STATS).
STATS: dict[str, Counter] = {}


@pytest.fixture(scope="module", autouse=True)
def _write_stats():
    yield
    path = os.environ.get("MDV_FUZZ_STATS")
    if path:
        with open(path, "w") as f:
            json.dump({k: dict(sorted(v.items())) for k, v in sorted(STATS.items())}, f, indent=1)


def count(key: str, label: str) -> None:
    STATS.setdefault(key, Counter())[label] += 1


#: Just below 1: the largest float64 uniform in [0, 1).
ONE_MINUS = math.nextafter(1.0, 0.0)
#: Largest mdbv law enumeration ((L+1)^K exit tuples) run in the validity property.
MDBV_LAW_MAX = 400
#: Most drafts per case for a verifier whose reference is exponential in K: ``select_gbv``'s reference
#: enumerates the m next tokens of the survivors (V^m tuples) at every prefix, and its kernels cost O(K^3 V).
K_MAX = {"select_gbv": 3}


def _settings(n: int) -> settings:
    return settings(max_examples=n, deadline=None, derandomize=True, database=None, print_blob=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much])


# ----------------------------------------------------------------------------------- toy models
def prefix_key(prefix: tuple[int, ...]) -> int:
    """A deterministic hash of the whole prefix (so rows depend on the prefix, not just its length)."""
    h = 1469598103934665603 + 7 * len(prefix)
    for t in prefix:
        h = ((h ^ (t + 1)) * 1099511628211) % (1 << 61)
    return h


@dataclass(frozen=True)
class Table:
    """A next-token law that depends on the prefix through a fixed table of normalised rows."""

    rows: tuple[tuple[float, ...], ...]

    @property
    def V(self) -> int:
        return len(self.rows[0])

    def row(self, prefix: tuple[int, ...]) -> np.ndarray:
        return np.asarray(self.rows[prefix_key(prefix) % len(self.rows)], dtype=np.float64)

    def model(self, name: str) -> CallableLM:
        return CallableLM(self.row, self.V, name=name)


def normalise(weights: list[float]) -> tuple[float, ...]:
    """Weights -> a probability row; an all-zero row becomes one-hot on token 0."""
    total = math.fsum(weights)
    if total <= 0.0:
        return tuple(1.0 if i == 0 else 0.0 for i in range(len(weights)))
    return tuple(w / total for w in weights)


WEIGHT = st.one_of(st.sampled_from([0.0, 1e-300, 1e-30, 3e-30, 1e-12, 0.5, 1.0]), st.floats(1e-3, 1.0))


def random_row(V: int, seed: int) -> tuple[float, ...]:
    """A Dirichlet(0.5) row from ``seed``, with each entry replaced by 0, 1e-300 or 1e-30 w.p. 1/6 each."""
    rng = np.random.default_rng(seed)
    w = rng.dirichlet(0.5 * np.ones(V))
    special = rng.integers(0, 6, size=V)
    w = np.where(special == 0, 0.0, np.where(special == 1, 1e-300, np.where(special == 2, 1e-30, w)))
    return normalise([float(x) for x in w])


def row_strategy(V: int) -> st.SearchStrategy[tuple[float, ...]]:
    """A third hypothesis-drawn weights (zeros, 1e-300, 1e-30, ... and ordinary values), a third generic
    random rows with such entries, a sixth one-hot, a sixth uniform."""
    weights = st.lists(WEIGHT, min_size=V, max_size=V).map(normalise)
    generic = st.integers(0, 2**32 - 1).map(lambda seed: random_row(V, seed))
    return st.one_of(
        weights, weights, generic, generic,
        st.integers(0, V - 1).map(lambda i: tuple(1.0 if j == i else 0.0 for j in range(V))),
        st.just(tuple([1.0 / V] * V)),
    )


def seeded_model_pair(seed: int, max_V: int) -> tuple[Table, Table]:
    """The same kinds of tables as :func:`drawn_model_pair`, generated from one seed (hypothesis mutates
    its own draws into many near-duplicates; seeded pairs keep the stream diverse)."""
    rng = np.random.default_rng(seed)
    V = int(rng.integers(1, max_V + 1))
    n = int(rng.integers(1, 5))

    def row() -> tuple[float, ...]:
        kind = rng.integers(0, 6)
        if kind == 0:
            hot = int(rng.integers(0, V))
            return tuple(1.0 if j == hot else 0.0 for j in range(V))
        if kind == 1:
            return tuple([1.0 / V] * V)
        return random_row(V, int(rng.integers(0, 2**32)))

    p_rows = [row() for _ in range(n)]
    mode = rng.integers(0, 4)  # 0, 1: independent; 2: identical; 3: shares the even rows
    q_rows = list(p_rows) if mode == 2 else [row() for _ in range(n)]
    if mode == 3:
        q_rows = [p if i % 2 == 0 and i < n - 1 else q for i, (p, q) in enumerate(zip(p_rows, q_rows))]
    return Table(tuple(p_rows)), Table(tuple(q_rows))


def model_pair(max_V: int) -> st.SearchStrategy[tuple[Table, Table]]:
    """Half hypothesis-drawn tables (shrinkable), half seeded ones."""
    return st.one_of(drawn_model_pair(max_V), st.integers(0, 2**32 - 1).map(lambda s: seeded_model_pair(s, max_V)))


@st.composite
def drawn_model_pair(draw: st.DrawFn, max_V: int) -> tuple[Table, Table]:
    V = draw(st.integers(1, max_V))
    n = draw(st.integers(1, 4))
    p_rows = draw(st.lists(row_strategy(V), min_size=n, max_size=n))
    # the draft table: independent (half the cases), identical to the target's, or sharing its even rows
    mode = draw(st.sampled_from(["independent", "identical", "independent", "partly"]))
    if mode == "identical":
        q_rows = list(p_rows)
    else:
        q_rows = draw(st.lists(row_strategy(V), min_size=n, max_size=n))
        if mode == "partly":
            q_rows = [p if i % 2 == 0 and i < n - 1 else q for i, (p, q) in enumerate(zip(p_rows, q_rows))]
    return Table(tuple(p_rows)), Table(tuple(q_rows))


# ----------------------------------------------------------------------------------- blocks
def draft_token(q_row: np.ndarray, mode: str, rng: np.random.Generator) -> int:
    """A drafted token: sampled from q (mode "sample") or the least likely token with q > 0 ("rare",
    which drives block joints towards underflow); "mixed" flips a coin per position."""
    if mode == "mixed":
        mode = "sample" if rng.random() < 0.5 else "rare"
    if mode == "rare":
        positive = np.flatnonzero(q_row > 0)
        return int(positive[np.argmin(q_row[positive])])
    cdf = np.cumsum(q_row)
    return int(min(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"), len(q_row) - 1))


def build_block(target: Table, draft: Table, prefix: tuple[int, ...], B: int, K: int, L: int, mode: str,
                rng: np.random.Generator) -> Block:
    """B instances of K draft blocks of length L drawn along the draft table after ``prefix``, with the
    rows of both tables along every draft (so drafts sharing a prefix share their rows)."""
    V = target.V
    toks = np.zeros((B * K, L), dtype=np.int64)
    q = np.zeros((B * K, L, V))
    p = np.zeros((B * K, L + 1, V))
    for n in range(B * K):
        d = prefix
        for i in range(L):
            q[n, i], p[n, i] = draft.row(d), target.row(d)
            toks[n, i] = draft_token(q[n, i], mode, rng)
            d = d + (int(toks[n, i]),)
        p[n, L] = target.row(d)
    return Block(torch.from_numpy(toks).view(B, K, L), torch.from_numpy(q).view(B, K, L, V),
                 torch.from_numpy(p).view(B, K, L + 1, V))


def make_uniforms(B: int, K: int, L: int, mode: str, seed: int) -> Uniforms:
    """Uniforms of one step: "random", all 0 ("zeros"), all 1 - 2^-53 ("high"), or a per-entry "mix"."""
    gen = torch.Generator().manual_seed(seed)
    u = Uniforms.draw(B, K, L, gen)
    if mode == "random":
        return u
    if mode == "zeros":
        return Uniforms(torch.zeros_like(u.coins), torch.zeros_like(u.draws))
    if mode == "high":
        return Uniforms(torch.full_like(u.coins, ONE_MINUS), torch.full_like(u.draws, ONE_MINUS))

    def mix(x: Tensor) -> Tensor:  # "mix": each uniform is 0, just below 1, or random
        pick = torch.randint(0, 3, x.shape, generator=gen)
        return torch.where(pick == 0, torch.zeros_like(x), torch.where(pick == 1, torch.full_like(x, ONE_MINUS), x))
    return Uniforms(mix(u.coins), mix(u.draws))


@dataclass
class Case:
    """One generated case: a model pair, sizes, how drafts and uniforms are drawn, and the seed."""

    method: str
    target_table: Table
    draft_table: Table
    K: int
    L: int
    B: int
    iterations: int
    draft_mode: str
    uniform_mode: str
    seed: int


@st.composite
def cases(draw: st.DrawFn, method: str, max_K: int = 16, max_L: int = 16, max_KL: int | None = None,
          max_V: int = 8, uniform_modes: tuple[str, ...] = ("random", "zeros", "high", "mix")) -> Case:
    target_table, draft_table = draw(model_pair(max_V))
    multi = mdv.VERIFIERS[method].multi_draft
    # sizes: a third small (<= 4), a third uniform up to the maximum, a third L = max_L (long blocks);
    # K: half small, half uniform (K = L = 16 costs ~0.5 s per mdbv sample)
    L = draw(st.one_of(st.integers(1, min(4, max_L)), st.integers(1, max_L), st.just(max_L)))
    K_cap = min(max_K, K_MAX.get(method, max_K)) if multi else 1
    if max_KL is not None:
        K_cap = max(1, min(K_cap, max_KL // L))
    K = draw(st.one_of(st.integers(1, min(4, K_cap)), st.integers(1, K_cap)))
    stateful = mdv.VERIFIERS[method].stateful
    return Case(method, target_table, draft_table, K, L, B=draw(st.integers(1, 3)),
                iterations=draw(st.integers(1, 3)) if stateful and K * L <= 64 else 1,
                draft_mode=draw(st.sampled_from(["sample", "rare", "mixed"])),
                uniform_mode=draw(st.sampled_from(uniform_modes)), seed=draw(st.integers(0, 2**31 - 1)))


def describe(key: str, case: Case) -> None:
    """Coverage counters of one completed case (see MDV_FUZZ_STATS)."""
    count(key, "cases")
    count(key, f"K*L {'<= 16' if case.K * case.L <= 16 else '17..64' if case.K * case.L <= 64 else '> 64'}")
    count(key, f"L = 16: {case.L == 16}")
    count(key, f"K = 16: {case.K == 16}")
    count(key, f"V = {case.target_table.V if case.target_table.V <= 2 else '3..8'}")
    count(key, f"p and q tables identical: {case.target_table == case.draft_table}")
    count(key, f"uniforms: {case.uniform_mode}")
    count(key, f"drafts: {case.draft_mode}")
    count(key, f"iterations: {case.iterations}")


def run_case(case: Case, check: Any) -> None:
    """Run ``case.iterations`` consecutive iterations (instance 0 continues, state carried) and call
    ``check(verifier, block, uniforms, state)`` on each."""
    verifier = mdv.get_verifier(case.method)
    target, draft = case.target_table, case.draft_table
    rng = np.random.default_rng(case.seed)
    prefix: tuple[int, ...] = ()
    state = verifier.initial_state()
    for it in range(case.iterations):
        block = build_block(target, draft, prefix, case.B, case.K, case.L, case.draft_mode, rng).validate()
        uniforms = make_uniforms(case.B, case.K, case.L, case.uniform_mode, case.seed + it)
        out = check(verifier, block, uniforms, state)
        prefix = prefix + tuple(out.emitted(block, 0))
        state = verifier.advance(state, block.select(0), _first(out))


def _first(out: Outcome) -> Outcome:
    return Outcome(out.tau[:1], out.sel[:1], out.token[:1], None if out.exits is None else out.exits[:1])


# ----------------------------------------------------------------------------------- checks
def law_is_moderate(method: str, K: int, L: int) -> bool:
    return method != "mdbv" or (L + 1) ** K <= MDBV_LAW_MAX


def check_outcome(verifier: Verifier, block: Block, out: Outcome) -> None:
    B, K, L, V = block.B, block.K, block.L, block.V
    for name in ("tau", "sel", "token"):
        t = getattr(out, name)
        assert t.shape == (B,) and not t.is_floating_point(), f"{name}: shape {tuple(t.shape)}, dtype {t.dtype}"
    assert ((out.tau >= 0) & (out.tau <= L)).all(), f"tau outside [0, {L}]: {out.tau.tolist()}"
    assert ((out.sel >= 0) & (out.sel < K)).all(), f"sel outside [0, {K}): {out.sel.tolist()}"
    if not verifier.multi_draft:
        assert (out.sel == 0).all()
    assert ((out.token >= 0) & (out.token < V)).all(), f"token id outside [0, {V}): {out.token.tolist()}"
    if verifier.lossless:
        # a lossless verifier never emits a string of target probability 0
        for b in range(B):
            tau, sel = int(out.tau[b]), int(out.sel[b])
            path = out.emitted(block, b)
            probs = [float(block.p[b, sel, i, path[i]]) for i in range(tau + 1)]
            assert min(probs) > 0.0, f"instance {b}: emitted {path} with target probabilities {probs}"


def check_law(verifier: Verifier, block: Block, state: Any, out: Outcome | None) -> None:
    branches = verifier.law(block, state)
    B, V = block.B, block.V
    probs = torch.stack([br.prob for br in branches])  # [n, B]
    assert torch.isfinite(probs).all(), "law: NaN/inf branch probability"
    assert ((probs >= 0) & (probs <= 1 + 1e-12)).all(), f"law: probability outside [0, 1]: {probs.min()}, {probs.max()}"
    total = probs.sum(0)
    assert torch.allclose(total, torch.ones_like(total), atol=1e-9, rtol=0), f"law sums to {total.tolist()}"
    for br in branches:
        d = br.next_dist
        assert d.shape == (B, V)
        assert torch.isfinite(d).all(), "law: NaN/inf in a next-token law"
        assert ((d >= 0) & (d <= 1 + 1e-12)).all(), "law: next-token probability outside [0, 1]"
        live = br.prob > 0
        sums = d[live].sum(-1)
        assert torch.allclose(sums, torch.ones_like(sums), atol=1e-9, rtol=0), f"next-token law sums to {sums.tolist()}"
        assert ((br.tau >= 0) & (br.tau <= block.L)).all() and ((br.sel >= 0) & (br.sel < block.K)).all()
    if out is None:
        return
    # the sampled outcome is a branch of positive probability, and its token has positive probability
    for b in range(B):
        tau, sel, tok = int(out.tau[b]), int(out.sel[b]), int(out.token[b])
        exits = None if out.exits is None else tuple(int(x) for x in out.exits[b])
        hit = [br for br in branches if int(br.tau[b]) == tau and int(br.sel[b]) == sel
               and (br.exits is None or exits is None or tuple(br.exits) == exits)]
        assert hit and max(float(br.prob[b]) for br in hit) > 0, f"instance {b}: sampled (tau={tau}, sel={sel}) has law probability 0"
        assert max(float(br.next_dist[b, tok]) for br in hit if float(br.prob[b]) > 0) > 0, \
            f"instance {b}: sampled token {tok} has probability 0 under the law"


#: log of the smallest product the scalar references may form without underflow to zero or to
#: subnormals (float64 normal range ends at 2.2e-308).
LOG_PRODUCT_FLOOR = math.log(1e-290)


def naive_products_safe(verifier: Verifier, block: Block, state: Any) -> bool:
    """Whether every plain product a scalar reference forms -- P(u)·p(x|u) and Q(u)·q(x|u) over the
    draft prefixes u and positive entries x -- stays in float64's normal range.  The references
    (deliberately plain transcriptions) divide such products; mdv's fast paths work in log space and
    are checked on underflowing blocks in tests/test_numerics.py."""
    p = verifier.effective_target(block, state)
    for d in (p, block.q):  # rows 0..n-1 along each draft; joints of the prefixes of length 0..n-1
        n = d.shape[2]
        factors = d[:, :, :n - 1].gather(-1, block.tokens[..., :n - 1, None].long()).squeeze(-1)
        logs = torch.where(factors > 0, factors.log(), torch.zeros_like(factors))  # P = 0 exactly is fine
        log_joint = torch.cat([torch.zeros_like(logs[..., :1]), logs.cumsum(-1)], -1)  # [B, K, rows]
        smallest = torch.where(d > 0, d.log(), torch.zeros_like(d)).amin(-1)  # [B, K, rows]
        if bool(((log_joint + smallest) < LOG_PRODUCT_FLOOR).any()):
            return False
    return True


# ----------------------------------------------------------------------------------- properties
@pytest.mark.parametrize("method", ALL_METHODS)
def test_outcomes_and_laws_are_valid(method: str) -> None:
    n = N_VALID[mdv.VERIFIERS[method].lossless]

    @_settings(n)
    @given(case=cases(method))
    def prop(case: Case) -> None:
        key = f"valid/{method}"
        flags: Counter = Counter()

        def check(verifier: Verifier, block: Block, uniforms: Uniforms, state: Any) -> Outcome:
            flags["underflow"] |= not naive_products_safe(verifier, block, state)
            out = verifier.sample(block, uniforms, state)
            check_outcome(verifier, block, out)
            flags["tau = 0"] |= bool((out.tau == 0).any())
            flags["0 < tau < L"] |= bool(((out.tau > 0) & (out.tau < block.L)).any())
            flags["tau = L"] |= bool((out.tau == block.L).any())
            if law_is_moderate(method, block.K, block.L):
                flags["law checked"] = 1
                # support check only with random uniforms: degenerate ones may hit events whose law
                # probability underflows to 0 (e.g. h = 1e-200 twice)
                check_law(verifier, block, state, out if case.uniform_mode == "random" else None)
            return out

        run_case(case, check)
        describe(key, case)
        for label, hit in flags.items():
            if hit:
                count(key, f"with {label}" if label != "underflow" else "a plain-product joint underflows")

    prop()


@pytest.mark.parametrize("method", ALL_METHODS)
def test_sample_equals_reference(method: str) -> None:
    # Random uniforms only: the fast paths work in log space and the references in plain products, so
    # their acceptance probabilities legitimately differ by ~1e-16..1e-15 (e.g. h = 1 vs 1 - 2.2e-16 in
    # gbv after an adjustment), which a coin of exactly 1 - 2^-53 turns into different decisions.
    # Degenerate uniforms are used by the validity and identity properties.
    @_settings(N_REFERENCE)
    @given(case=cases(method, max_KL=12, uniform_modes=("random",)))
    def prop(case: Case) -> None:
        def check(verifier: Verifier, block: Block, uniforms: Uniforms, state: Any) -> Outcome:
            assume(naive_products_safe(verifier, block, state))
            fast = verifier.sample(block, uniforms, state)
            slow = verifier.reference(block, uniforms, state)
            for name in ("tau", "sel", "token"):
                assert torch.equal(getattr(fast, name).long(), getattr(slow, name).long()), \
                    f"{name}: fast {getattr(fast, name).tolist()} != reference {getattr(slow, name).tolist()}"
            return fast

        run_case(case, check)
        describe(f"reference/{method}", case)

    prop()


IDENTITIES = [("spectr", "sd"), ("mdbv", "gbv"), ("select_gbv", "gbv")]


@pytest.mark.parametrize("multi,single", IDENTITIES, ids=[f"{m}=={s}" for m, s in IDENTITIES])
def test_single_draft_identities(multi: str, single: str) -> None:
    """At K = 1 SpecTr is SD, and mdbv and select_gbv are GBV (with its adjustment across iterations): the same decisions
    on the same blocks and uniforms, including uniforms of exactly 0 and 1 - 2^-53, which expose any
    rounding leak onto a token whose probability is exactly 0 in one of the two formulas."""

    @_settings(N_IDENTITY)
    @given(case=cases(single))
    def prop(case: Case) -> None:
        other = mdv.get_verifier(multi)
        states = {"other": other.initial_state()}

        def check(verifier: Verifier, block: Block, uniforms: Uniforms, state: Any) -> Outcome:
            a = verifier.sample(block, uniforms, state)
            b = other.sample(block, uniforms, states["other"])
            # select_gbv's sample runs gbv's sampler at K = 1: its walk is checked as well
            views = [b, other.sample_walk(block, uniforms, states["other"])] if multi == "select_gbv" else [b]
            for view in views:
                for name in ("tau", "sel", "token"):
                    assert torch.equal(getattr(a, name), getattr(view, name)), \
                        f"{name}: {single} {getattr(a, name).tolist()} != {multi} {getattr(view, name).tolist()}"
            states["other"] = other.advance(states["other"], block.select(0), _first(b))
            return a

        run_case(case, check)
        describe(f"identity/{multi}=={single}", case)

    prop()


TEMPERATURES = (1.0, 1.0, 0.5, 2.0, 0.0)


@pytest.mark.parametrize("method", LOSSLESS)
def test_lossless_exact_on_tiny_cases(method: str) -> None:
    @_settings(N_EXACT)
    @given(pair=model_pair(max_V=3), data=st.data())
    def prop(pair: tuple[Table, Table], data: st.DataObject) -> None:
        target_table, draft_table = pair
        V = target_table.V
        multi = mdv.VERIFIERS[method].multi_draft
        L = data.draw(st.integers(1, 3 if V == 3 else 4), label="L")
        K_cap = 1 if not multi else max(1, min(3, 6 // L))
        K = data.draw(st.integers(1, K_cap), label="K")
        temperature = data.draw(st.sampled_from(TEMPERATURES), label="temperature")
        target, draft = target_table.model("target"), draft_table.model("draft")
        n = L + 1
        law = exact_law(method, target, draft, K, L, n, temperature=temperature)
        ref = target_law(target, n, temperature=temperature)
        assert abs(math.fsum(law.values()) - 1.0) < 1e-9
        tv = total_variation(law, ref)
        assert tv < 1e-9, f"{method} K={K} L={L} T={temperature}: TV {tv:.3g} to the target law"
        key = f"exact/{method}"
        count(key, "cases")
        count(key, f"K={K} L={L}")
        count(key, f"V = {V}")
        count(key, f"T = {temperature}")
        count(key, f"p and q tables identical: {target_table == draft_table}")

    prop()


# ----------------------------------------------------------------------------------- regressions
def test_regression_spectr_k1_residual_has_no_rounding_leak() -> None:
    """Found by ``test_sample_equals_reference[spectr]`` (shrunk by hypothesis to L = 1): at K = 1 the
    K-SEQ residual ``p - min(q, p/rho)·(1-(1-beta)^k)/beta`` left ~2e-16 of mass on the tokens with
    q >= p, where SD's residual (p - q)_+ is exactly 0.  A uniform just below 1 then drew the rejected
    draft token itself from the residual, so the walk continued and SpecTr returned tau = 1 with a
    bonus token, where SD (and SpecTr's scalar reference) return tau = 0 and token 1.  Fixed in
    ``mdv.verify.spectr.kseq_residual`` and the reference's ``_kseq_scalar``: the factor is exactly 1
    at k = 1, and tokens with q >= p/rho carry no residual (exactly 0 at rho*)."""
    from mdv.verify.spectr import kseq_residual

    p = torch.full((1, 1, 2, 3), 1.0 / 3.0, dtype=torch.float64)
    q = torch.tensor([[[normalise([1.0, 0.125, 0.8652482972257377])]]], dtype=torch.float64)
    block = Block(torch.tensor([[[2]]]), q, p).validate()
    high = Uniforms(torch.full((1, 1, 1), ONE_MINUS, dtype=torch.float64),
                    torch.full((1, 2), ONE_MINUS, dtype=torch.float64))
    res = kseq_residual(p[0, 0, :1], q[0, 0], 1)
    assert res[0, 0].item() == 0.0 and res[0, 2].item() == 0.0 and res[0, 1].item() == 1.0
    for method in ("spectr", "sd"):  # before the fix: spectr.sample gave (tau, token) = (1, 2)
        verifier = mdv.get_verifier(method)
        for out in (verifier.sample(block, high), verifier.reference(block, high)):
            assert (int(out.tau[0]), int(out.token[0])) == (0, 1), f"{method}: {out}"


def test_regression_spectr_k1_residual_tiny_target_entry() -> None:
    """Found by ``test_single_draft_identities[spectr==sd]`` before the fix (shrunk): target row
    (0, 0, 0, 1e-270, 1), uniform draft row, a drafted token with p = 0 is rejected, and a residual
    uniform of 0 drew token 3 -- SpecTr's residual had 1e-270·(1 - factor) > 0 there, SD's (p - q)_+ has
    exactly 0 -- instead of SD's token 4."""
    from mdv.verify.spectr import kseq_residual

    p_row = [0.0, 0.0, 0.0, 1e-270, 1.0]
    p = torch.tensor([[[p_row, p_row]]], dtype=torch.float64)
    q = torch.full((1, 1, 1, 5), 0.2, dtype=torch.float64)
    block = Block(torch.tensor([[[0]]]), q, p).validate()
    zeros = Uniforms(torch.zeros(1, 1, 1, dtype=torch.float64), torch.zeros(1, 2, dtype=torch.float64))
    assert kseq_residual(p[0, 0, :1], q[0, 0], 1).tolist() == [[0.0, 0.0, 0.0, 0.0, 1.0]]
    for method in ("spectr", "sd"):
        verifier = mdv.get_verifier(method)
        for out in (verifier.sample(block, zeros), verifier.reference(block, zeros)):
            assert (int(out.tau[0]), int(out.token[0])) == (0, 4), f"{method}: {out}"
