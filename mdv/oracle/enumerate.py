"""Exact output laws by enumeration on tiny vocabularies.

At each iteration the oracle enumerates **every** tuple of K draft blocks (V^(K·L) of them) with its
probability ``prod_k Q(d_k)``, builds one :class:`~mdv.verify.base.Block` batched over all tuples, and
asks the verifier for the exact law of its outcome (:meth:`Verifier.law` -- the same vectorised code
the engine samples from).  Iterations are chained, verifier state included, until ``n_tokens`` are
generated; nodes with the same generated prefix and the same state are merged, so stateless
verifiers explore a DAG over prefixes rather than a tree.
"""
from __future__ import annotations

import itertools
from typing import Any, Sequence

import torch
from torch import Tensor

from mdv.errors import InvalidInputError
from mdv.models.base import LanguageModel, check_model, check_token_ids
from mdv.models.sampling import SamplingConfig
from mdv.verify.base import Block, Outcome, Verifier
from mdv.verify.registry import get_verifier

#: Largest number of draft tuples enumerated in one iteration.
MAX_TUPLES = 300_000


def _check_models(target: LanguageModel, draft: LanguageModel) -> int:
    V, Vd = check_model("target", target), check_model("draft", draft)
    if V != Vd:
        raise InvalidInputError(
            f"target and draft must share one vocabulary: target vocab_size={V}, draft vocab_size={Vd}")
    return V


def _prompt(prompt: Sequence[int], V: int) -> tuple[int, ...]:
    return tuple(check_token_ids("prompt", prompt, V, allow_empty=True))


def _check_sizes(K: int, L: int) -> None:
    for name, value in (("K", K), ("L", L)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise InvalidInputError(f"{name} must be an integer >= 1; got {name}={value!r}")


def _probs(model: LanguageModel, prefixes: list[tuple[int, ...]], sampling: SamplingConfig) -> Tensor:
    return sampling.probs(model.next_logprobs(prefixes))


def block_table(target: LanguageModel, draft: LanguageModel, L: int, prompt: Sequence[int] = (),
                sampling: SamplingConfig | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Every single draft block of length L after ``prompt`` with positive draft probability.

    Returns (tokens [N, L], q [N, L, V], p [N, L+1, V], log_q [N] = log Q(block)).
    """
    sampling = sampling or SamplingConfig()
    V = _check_models(target, draft)
    _check_sizes(1, L)
    prompt = _prompt(prompt, V)
    blocks = list(itertools.product(range(V), repeat=L))
    prefixes = sorted({prompt + blk[:i] for blk in blocks for i in range(L + 1)})
    index = {pre: n for n, pre in enumerate(prefixes)}
    p_all, q_all = _probs(target, prefixes, sampling), _probs(draft, prefixes, sampling)  # [P, V]
    toks = torch.tensor(blocks, dtype=torch.long).reshape(len(blocks), L)  # [N, L]
    rows = torch.tensor([[index[prompt + blk[:i]] for i in range(L + 1)] for blk in blocks])  # [N, L+1]
    q_blk, p_blk = q_all[rows[:, :L]], p_all[rows]  # [N, L, V], [N, L+1, V]
    log_q = q_blk.gather(-1, toks.unsqueeze(-1)).squeeze(-1).log().sum(-1)  # [N]
    keep = torch.isfinite(log_q)
    return toks[keep], q_blk[keep], p_blk[keep], log_q[keep]


def enumerate_block(target: LanguageModel, draft: LanguageModel, K: int, L: int, prompt: Sequence[int] = (),
                    sampling: SamplingConfig | None = None) -> tuple[Block, Tensor]:
    """Every tuple of K draft blocks after ``prompt``, with its probability.

    Returns (block, weights): block.tokens [B, K, L], block.q [B, K, L, V], block.p [B, K, L+1, V]
    for the B tuples of positive draft probability, and weights [B] = prod_k Q(d_k).
    """
    _check_models(target, draft)
    _check_sizes(K, L)
    n_blocks = target.vocab_size ** L
    if n_blocks ** K > MAX_TUPLES:
        raise InvalidInputError(
            f"exact enumeration needs V^(K·L) = {target.vocab_size}^{K * L} = {n_blocks ** K} draft tuples,"
            f" above the ceiling of {MAX_TUPLES}; use a smaller vocabulary, K or L")
    toks, q_blk, p_blk, log_q = block_table(target, draft, L, prompt, sampling)
    N = toks.shape[0]
    idx = torch.cartesian_prod(*[torch.arange(N)] * K).reshape(-1, K)  # [B, K]
    weights = log_q[idx].sum(-1).exp()
    return Block(toks[idx], q_blk[idx], p_blk[idx]), weights


def _resolve(method: str | Verifier, options: dict[str, Any]) -> Verifier:
    return method if isinstance(method, Verifier) else get_verifier(method, **options)


def _iteration(verifier: Verifier, block: Block, weights: Tensor, state: Any):
    """Yield (emitted tuple, probability, new state) for one iteration, merging equal (emitted, state)."""
    V = block.V
    merged: dict[tuple, list] = {}
    for branch in verifier.law(block, state):
        w = weights * branch.prob  # [B]
        live = torch.nonzero(w > 0).flatten()
        if live.numel() == 0:
            continue
        dist = branch.next_dist[live]  # [n, V]
        mass = w[live].unsqueeze(-1) * dist  # [n, V]
        sel, tau = branch.sel[live], branch.tau[live]
        toks = block.tokens[live, sel]  # [n, L] the kept draft of each instance
        # group instances by (accepted prefix, exit detail): rows of a small key matrix
        L = block.L
        pos = torch.arange(L)
        key = torch.where(pos < tau.unsqueeze(-1), toks, torch.full_like(toks, -1))  # [n, L]
        if branch.exits is not None and verifier.stateful:
            anchors = [torch.where(pos < e, block.tokens[live, j], torch.full_like(toks, -1))
                       for j, e in enumerate(branch.exits) if e >= 0]
            key = torch.cat([key, *anchors], -1) if anchors else key
        uniq, inverse = torch.unique(key, dim=0, return_inverse=True)
        group_mass = torch.zeros(uniq.shape[0], V, dtype=mass.dtype).index_add_(0, inverse, mass)  # [G, V]
        first = torch.full((uniq.shape[0],), -1, dtype=torch.long)
        first.scatter_reduce_(0, inverse, torch.arange(inverse.numel()), reduce="amin", include_self=False)
        for g in range(uniq.shape[0]):
            b = int(live[first[g]])
            t, s = int(branch.tau[b]), int(branch.sel[b])
            prefix = tuple(int(x) for x in block.tokens[b, s, :t])
            exits = None if branch.exits is None else torch.tensor([branch.exits])
            for y in torch.nonzero(group_mass[g] > 0).flatten().tolist():
                pm = float(group_mass[g, y])
                if verifier.stateful:
                    outcome = Outcome(torch.tensor([t]), torch.tensor([s]), torch.tensor([y]), exits)
                    new_state = verifier.advance(state, block.select(b), outcome)
                    skey = verifier.state_key(new_state)
                else:
                    new_state, skey = state, None
                k = (prefix + (y,), skey)
                if k in merged:
                    merged[k][1] += pm
                else:
                    merged[k] = [prefix + (y,), pm, new_state]
    for emitted, pm, new_state in merged.values():
        yield emitted, pm, new_state


def iteration_law(method: str | Verifier, target: LanguageModel, draft: LanguageModel, K: int, L: int,
                  prompt: Sequence[int] = (), temperature: float = 1.0, top_k: int | None = None,
                  top_p: float | None = None, **verifier_options: Any) -> dict[tuple[int, ...], float]:
    """Exact law of the tokens emitted by one iteration from ``prompt`` (accepted prefix + extra token)."""
    verifier = _resolve(method, verifier_options)
    verifier.check_drafts(K)
    block, weights = enumerate_block(target, draft, K, L, prompt, SamplingConfig(temperature, top_k, top_p))
    law: dict[tuple[int, ...], float] = {}
    for emitted, pm, _ in _iteration(verifier, block, weights, verifier.initial_state()):
        law[emitted] = law.get(emitted, 0.0) + pm
    return law


def expected_accepted(method: str | Verifier, target: LanguageModel, draft: LanguageModel, K: int, L: int,
                      prompt: Sequence[int] = (), temperature: float = 1.0, top_k: int | None = None,
                      top_p: float | None = None, **verifier_options: Any) -> float:
    """Exact E[tau] of one iteration from ``prompt`` (initial verifier state)."""
    verifier = _resolve(method, verifier_options)
    verifier.check_drafts(K)
    block, weights = enumerate_block(target, draft, K, L, prompt, SamplingConfig(temperature, top_k, top_p))
    total = 0.0
    for branch in verifier.law(block, verifier.initial_state()):
        total += float((weights * branch.prob * branch.tau.to(weights.dtype)).sum())
    return total


def exact_law(method: str | Verifier, target: LanguageModel, draft: LanguageModel, K: int, L: int, n_tokens: int,
              prompt: Sequence[int] = (), temperature: float = 1.0, top_k: int | None = None,
              top_p: float | None = None, **verifier_options: Any) -> dict[tuple[int, ...], float]:
    """Exact law of the first ``n_tokens`` generated tokens, across as many iterations as needed,
    verifier state included.  Returns {generated tokens: probability}."""
    if isinstance(n_tokens, bool) or not isinstance(n_tokens, int) or n_tokens < 1:
        raise InvalidInputError(f"n_tokens must be an integer >= 1; got {n_tokens!r}")
    verifier = _resolve(method, verifier_options)
    verifier.check_drafts(K)
    sampling = SamplingConfig(temperature, top_k, top_p)
    prompt = _prompt(prompt, _check_models(target, draft))
    # frontier keyed by (generated prefix, state key); processed shortest prefix first so merges happen
    frontier: dict[tuple, list] = {((), verifier.state_key(verifier.initial_state())): [1.0, verifier.initial_state()]}
    law: dict[tuple[int, ...], float] = {}
    while frontier:
        (gen, skey) = min(frontier, key=lambda k: len(k[0]))
        mass, state = frontier.pop((gen, skey))
        block, weights = enumerate_block(target, draft, K, L, prompt + gen, sampling)
        for emitted, pm, new_state in _iteration(verifier, block, weights, state):
            out = gen + emitted
            if len(out) >= n_tokens:
                key = out[:n_tokens]
                law[key] = law.get(key, 0.0) + mass * pm
            else:
                nk = (out, verifier.state_key(new_state))
                if nk in frontier:
                    frontier[nk][0] += mass * pm
                else:
                    frontier[nk] = [mass * pm, new_state]
    return law


def target_law(target: LanguageModel, n_tokens: int, prompt: Sequence[int] = (), temperature: float = 1.0,
               top_k: int | None = None, top_p: float | None = None) -> dict[tuple[int, ...], float]:
    """Exact law of ``n_tokens`` tokens sampled autoregressively from the (transformed) target."""
    if isinstance(n_tokens, bool) or not isinstance(n_tokens, int) or n_tokens < 0:
        raise InvalidInputError(f"n_tokens must be an integer >= 0; got {n_tokens!r}")
    sampling = SamplingConfig(temperature, top_k, top_p)
    prompt = _prompt(prompt, check_model("target", target))
    law: dict[tuple[int, ...], float] = {(): 1.0}
    for _ in range(n_tokens):
        prefixes = list(law)
        probs = _probs(target, [prompt + u for u in prefixes], sampling)
        law = {u + (y,): law[u] * float(probs[n, y]) for n, u in enumerate(prefixes)
               for y in range(target.vocab_size) if probs[n, y] > 0}
    return law


def total_variation(a: dict[tuple, float], b: dict[tuple, float]) -> float:
    """``0.5 · sum |a(x) - b(x)|`` over the union of supports."""
    for name, law in (("a", a), ("b", b)):
        if not isinstance(law, dict):
            raise InvalidInputError(f"total_variation compares two laws given as dicts {{outcome: probability}}"
                                    f" (as exact_law / target_law return); {name} is a {type(law).__name__}")
    return 0.5 * sum(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b))
