"""The speculative decoding loop and the autoregressive baseline.

One iteration of :func:`generate` with a verifier:

1. **Draft.** The drafter (:mod:`mdv.drafters`; ``model`` by default) proposes K i.i.d. blocks
   ``tokens [K, L]``, each token drawn from exactly the float64 vector recorded in ``q [K, L, V]``.
   The ``model`` drafter's session processes its pending tokens (committed but not yet in its cache) in
   one row, then forks into K rows and takes L sequential steps (:meth:`SamplingConfig.probs`,
   algorithms.md §12.2); ``ngram`` looks the law up in the context (where it finds nothing it may
   propose no tokens: the iteration is then one autoregressive target step instead of steps 2-4);
   ``layerskip`` is ``model`` with the
   target's first layers; ``eagle`` is one layer over the target's own features, which the target's
   session records in every pass and the engine hands over for the committed positions (after prefill and
   after step 4's choice: the pending chain plus the accepted draft tokens).
2. **Target.** ONE forward pass scores ``[pending, D_k]`` for all k; ``p [K, L+1, V]`` are the laws
   before each draft token plus the bonus position, under the same sampling transform.  With K > 1 the
   pass is a token tree in a single row (``target_pass="tree"``, the default where the target's session
   supports it: every distinct draft prefix scored once under a tree attention mask,
   :mod:`mdv.models.tree`), or K full rows over a forked cache (``target_pass="rows"``).
3. **Verify.** ``verifier.step(Block(tokens[None], q[None], p[None]), generator)`` returns tau, the
   selected draft and the correction/bonus token; greedy verifiers keep their target adjustment in
   their own state across iterations (reset per sequence).
4. **Commit and roll back.** Emit ``D_sel[:tau] + [token]``; the target's cache (and the drafter's,
   :meth:`~mdv.drafters.base.Drafter.commit`) keeps row ``sel`` (the target's tree: the path of
   ``D_sel[:tau]``) and is cropped to the kept prefix.  The
   correction/bonus token (and, after a full acceptance, the last draft token for the draft model) is
   *not* in the caches yet: it is pending and processed on the next pass (algorithms.md §12.6).

Invariant between iterations: each cache holds a prefix of the committed sequence and at least its
last token is pending.  The prompt minus its last token is prefilled; the last prompt token is fed
with the first pass.  ``method="ar"`` is plain sampling from the target with the same transform, one
target call per token.  Everything runs under ``torch.inference_mode()`` with one seeded
``torch.Generator``: the same inputs and seed give the same tokens.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
from torch import Tensor

from mdv.errors import InvalidInputError, unknown_name
from mdv.metrics import GenerationStats, Stopwatch
from mdv.drafters.base import Drafter
from mdv.drafters.registry import get_drafter
from mdv.models.base import LanguageModel, check_model, check_token_ids
from mdv.models.sampling import SamplingConfig
from mdv.models.session import DecodeSession, open_session, tree_capable
from mdv.models.tree import TokenTree, build_tree
from mdv.verify._math import categorical
from mdv.verify.base import Block, Outcome, Verifier

AR = "ar"
TARGET_PASSES = ("auto", "tree", "rows")


@dataclass(frozen=True)
class GenerationResult:
    """``tokens``: the generated ids (prompt excluded, at most ``max_new_tokens``, ending at EOS when
    one was produced); ``stats``: see :class:`mdv.metrics.GenerationStats`."""

    tokens: list[int]
    stats: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class StepRecord:
    """What one speculative iteration saw and did, for audits and tests (``generate(on_step=...)``).

    context: the committed sequence (prompt + generated) before the iteration.
    block:   the verifier's input (B = 1): tokens [1, K, L], q [1, K, L, V], p [1, K, L+1, V].
    outcome: the verifier's decision; emitted: the tokens appended (before any max/EOS cut).
    """

    iteration: int
    context: tuple[int, ...]
    block: Block
    outcome: Outcome
    emitted: tuple[int, ...]


def valid_methods() -> list[str]:
    """``"ar"`` and every registered verifier name."""
    from mdv.verify.registry import VERIFIERS

    return [AR, *VERIFIERS]


def _int_arg(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise InvalidInputError(f"{name} must be an integer >= {minimum}; got {value!r}")
    return int(value)


def _eos_set(eos_token_id: Any, target: Any) -> frozenset[int]:
    if eos_token_id is None:
        eos_token_id = getattr(target, "eos_token_id", None)
    if eos_token_id is None:
        return frozenset()
    if isinstance(eos_token_id, Tensor):
        eos_token_id = eos_token_id.flatten().tolist()
    items = list(eos_token_id) if isinstance(eos_token_id, (Sequence, set, frozenset)) else [eos_token_id]
    if isinstance(eos_token_id, str) or not all(
            isinstance(t, numbers.Integral) and not isinstance(t, bool) for t in items):
        raise InvalidInputError(
            f"eos_token_id must be None (the target tokenizer's EOS), an id, or a list of ids ([] to never"
            f" stop early); got {eos_token_id!r}")
    return frozenset(int(t) for t in items)


def check_prompt_fits(prompt_length: int, ctx: int | None, L: int | None = None) -> None:
    """:class:`~mdv.errors.InvalidInputError` unless a prompt of ``prompt_length`` tokens leaves room in
    a model context of ``ctx`` tokens (None: unbounded) for one token (``L`` None: autoregressive) or
    for one block of ``L`` draft tokens scored by the target (speculative methods)."""
    if ctx is None:
        return
    if prompt_length >= ctx:
        raise InvalidInputError(
            f"prompt_ids has {prompt_length} tokens but the model context is {ctx} tokens; shorten the prompt")
    if L is not None and prompt_length + L > ctx:
        raise InvalidInputError(
            f"prompt_ids has {prompt_length} tokens and one block of L={L} draft tokens needs {prompt_length + L}"
            f" positions, above the model context of {ctx} tokens; shorten the prompt or lower L")


def max_context(*models: Any) -> int | None:
    """The smallest `max_context` of `models` (None where no model declares one)."""
    ctx = [int(c) for m in models if m is not None and (c := getattr(m, "max_context", None))]
    return min(ctx) if ctx else None


def _sync_for(device: torch.device) -> Callable[[], None] | None:
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return None


@torch.inference_mode()
def generate(target: LanguageModel, draft: LanguageModel | None, prompt_ids: Sequence[int] | Tensor,
             method: str, K: int = 1, L: int = 4, temperature: float = 1.0, top_k: int | None = None,
             top_p: float | None = None, max_new_tokens: int = 64, seed: int = 0,
             eos_token_id: int | Sequence[int] | None = None, *,
             on_step: Callable[[StepRecord], None] | None = None, target_pass: str = "auto",
             drafter: str | Drafter = "model", drafter_options: dict[str, Any] | None = None) -> GenerationResult:
    """Generate up to ``max_new_tokens`` tokens after ``prompt_ids`` with speculative decoding.

    target, draft: LanguageModels sharing one vocabulary (``HFModel`` with a KV cache, or any model
    with ``next_logprobs``); ``draft`` may be None for ``method="ar"``.  method: a registered verifier
    (``mdv.VERIFIERS``: sd, spectr, bv, gbv, spectr_gbv, mdbv) or ``"ar"``.  K drafts of length L per
    iteration (single-draft verifiers need K = 1).  temperature / top_k / top_p: one sampling transform
    applied identically to target and draft (T = 0 is greedy).  eos_token_id: None uses the target
    tokenizer's EOS (if any); ``[]`` never stops early.  on_step: called after every speculative
    iteration that verified a block, with a :class:`StepRecord` (not after an undrafted one: a drafter that
    proposes no tokens, ``ngram`` on a miss, makes that iteration one autoregressive step).  target_pass:
    how the target scores K > 1 drafts -- ``"tree"``
    (one row, shared prefixes once), ``"rows"`` (K rows over a forked cache) or ``"auto"`` (tree where
    the target's session supports it); K = 1 is always one row.  drafter: who proposes the K blocks
    (``mdv.drafters.DRAFTERS``: ``model`` = ``draft``, ``ngram`` = prompt lookup, ``layerskip`` = the
    target's first layers, ``eagle`` = one layer over the target's features; or a
    :class:`~mdv.drafters.base.Drafter` instance), with ``drafter_options`` (e.g. ``{"n_max": 3}``); only
    ``model`` needs ``draft``.  Returns :class:`GenerationResult`.
    """
    from mdv.verify.registry import VERIFIERS

    # ------------------------------------------------------------------ validation (before any work)
    valid = valid_methods()
    if not isinstance(method, str) or method not in valid:
        raise unknown_name("method", method, valid)
    K = _int_arg("K", K, 1)
    L = _int_arg("L", L, 1)
    max_new_tokens = _int_arg("max_new_tokens", max_new_tokens, 1)
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise InvalidInputError(f"seed must be an integer; got {seed!r}")
    sampling = SamplingConfig(temperature, top_k, top_p)
    V = check_model("target", target)
    verifier: Verifier | None = None
    drf: Drafter | None = None
    if method != AR:
        drf = get_drafter(drafter, **(drafter_options or {}))
        drf.bind(target, draft)
        verifier = VERIFIERS[method]()
        verifier.check_drafts(K)
    if not isinstance(target_pass, str) or target_pass not in TARGET_PASSES:
        raise InvalidInputError(f"target_pass must be 'auto', 'tree' or 'rows'; got {target_pass!r}")
    prompt = check_token_ids("prompt_ids", prompt_ids, V)
    ctx = max_context(target)
    if drf is not None and drf.max_context is not None:
        ctx = drf.max_context if ctx is None else min(ctx, drf.max_context)
    check_prompt_fits(len(prompt), ctx, None if method == AR else L)
    eos = _eos_set(eos_token_id, target)

    tgt = open_session(target)
    watch = Stopwatch(_sync_for(tgt.device))
    stats = GenerationStats(method=method, K=K, L=L, max_new_tokens=max_new_tokens, prompt_length=len(prompt),
                            watch=watch)
    stats.extra.update({"temperature": float(temperature), "top_k": top_k, "top_p": top_p, "seed": seed})
    generator = torch.Generator(device=tgt.device)
    generator.manual_seed(int(seed))

    if method == AR:
        with watch.phase("prefill"):
            tgt.prefill(prompt[:-1])
        with watch.phase("decode"):
            out = _decode_ar(tgt, prompt, sampling, max_new_tokens, eos, ctx, generator, stats)
    else:
        assert verifier is not None and drf is not None
        stats.extra.update({"drafter": drf.name, "drafter_options": drf.options()})
        use_tree = K > 1 and target_pass != "rows" and tree_capable(tgt)
        if target_pass == "tree" and K > 1 and not use_tree:
            raise InvalidInputError(
                f"target_pass='tree' asked for, but the target's session ({type(tgt).__name__}) cannot score a"
                " token tree (its attention takes no custom mask, or its cache cannot be rearranged); use"
                " target_pass='rows' or 'auto'")
        stats.extra["target_pass"] = "tree" if use_tree else "rows"
        if drf.uses_target_features:
            if not hasattr(tgt, "record_features"):
                raise InvalidInputError(f"drafter {drf.name!r} reads the target's hidden states, but the target's"
                                        f" session ({type(tgt).__name__}) cannot record them; use an HFModel target")
            tgt.record_features = True
        with watch.phase("prefill"):
            tgt.prefill(prompt[:-1])
            drf.prefill(prompt)
            if drf.uses_target_features and len(prompt) > 1:
                drf.observe_target(tgt.last_features[0])  # [len(prompt) - 1, d]
        with watch.phase("decode"):
            out = _decode_speculative(tgt, drf, verifier, prompt, sampling, K, L, max_new_tokens, eos, ctx,
                                      generator, stats, on_step, use_tree)
    stats.new_tokens = len(out)
    return GenerationResult(out, stats.as_dict())


def _commit(out: list[int], emitted: Sequence[int], max_new_tokens: int, eos: frozenset[int]) -> str | None:
    """Append ``emitted`` to ``out``, cut at EOS or at ``max_new_tokens``; the stop reason, if any."""
    for tok in emitted:
        out.append(int(tok))
        if tok in eos:
            return "eos"
        if len(out) >= max_new_tokens:
            return "max_new_tokens"
    return None


def ar_logits(tgt: DecodeSession, seq: Sequence[int]) -> Tensor:
    """One autoregressive target call: feed the pending tokens ``seq[tgt.length:]``; -> logits [1, V] of the
    next token."""
    pending = torch.tensor([list(seq[tgt.length:])], dtype=torch.long, device=tgt.device)  # [1, n]
    return tgt.extend(pending)[:, -1]


def ar_draw(p: Tensor, generator: torch.Generator) -> int:
    """The AR draw from the law p [1, V] (or [V]): one float64 uniform of ``generator``, inverse CDF."""
    u = torch.rand(1, generator=generator, dtype=torch.float64, device=generator.device)
    return int(categorical(p.reshape(1, -1).to(u.device), u)[0])


def _decode_ar(tgt: DecodeSession, prompt: list[int], sampling: SamplingConfig, max_new_tokens: int,
               eos: frozenset[int], ctx: int | None, generator: torch.Generator,
               stats: GenerationStats) -> list[int]:
    """Autoregressive sampling from the target: one call per token, pending token fed each call."""
    seq, out = list(prompt), []
    watch = stats.watch
    while True:
        if ctx is not None and len(seq) >= ctx:
            stats.stop_reason = "context"
            break
        with watch.phase("target"):
            logits = ar_logits(tgt, seq)  # [1, V]
            stats.target_calls += 1
        with watch.phase("verify"):  # sampling is the AR "verification"
            token = ar_draw(sampling.probs(logits), generator)
        seq.append(token)
        reason = _commit(out, [token], max_new_tokens, eos)
        if reason is not None:
            stats.stop_reason = reason
            break
    return out


def score_drafts(tgt: DecodeSession, seq: Sequence[int], tokens: Tensor, sampling: SamplingConfig,
                 tree: TokenTree | None = None) -> Tensor:
    """The target laws along K drafts after ``seq`` in ONE pass (module docstring, step 2):
    ``p[k, i] = p(.|seq, D_k,<i+1)``, i = 0..L (the bonus position last).

    tokens: [K, L].  tree: ``build_tree(seq[tgt.length:], tokens)`` to score them as a token tree in one
    row (the session must be tree-capable; it then holds the tree until ``keep_nodes``), or None for K
    full rows over a forked cache (the session is left with K rows).  Returns p [K, L+1, V] float64.
    """
    if tree is not None:
        node_p = sampling.probs(tgt.extend_tree(tree))  # [nodes, V] float64
        return node_p[tree.node_of.to(node_p.device)]
    K = tokens.shape[0]
    pending = list(seq[tgt.length:])
    m = len(pending)
    tgt.fork(K)
    inp = torch.cat([torch.tensor(pending, dtype=torch.long).expand(K, m), tokens.cpu()], 1)  # [K, m+L]
    logits = tgt.extend(inp.to(tgt.device))[:, m - 1:]  # [K, L+1, V]
    return sampling.probs(logits)


def _undrafted_step(tgt: DecodeSession, drf: Drafter, seq: Sequence[int], sampling: SamplingConfig,
                    generator: torch.Generator, stats: GenerationStats) -> int:
    """An iteration whose drafter proposed a block of no tokens (``ngram`` where the context has no match):
    the target's law after ``seq`` in one pass over the pending tokens, one AR draw, counted as an iteration
    that accepted nothing (tau = 0, draft 0; ``stats["undrafted_steps"]``).  -> the token."""
    watch = stats.watch
    with watch.phase("target"):
        pending = len(seq) - tgt.length
        logits = ar_logits(tgt, seq)  # [1, V]
        stats.target_calls += 1
    with watch.phase("verify"):
        token = ar_draw(sampling.probs(logits), generator)
    if drf.uses_target_features:  # the pending chain's features, as after a block with tau = 0
        drf.observe_target(tgt.last_features[0, :pending])
    drf.commit(0, 0)
    stats.accepted_lengths.append(0)
    stats.selected_drafts.append(0)
    stats.extra["undrafted_steps"] = stats.extra.get("undrafted_steps", 0) + 1
    return token


def _verify_block(tgt: DecodeSession, drf: Drafter, verifier: Verifier, seq: Sequence[int], tokens: Tensor,
                  q: Tensor, sampling: SamplingConfig, generator: torch.Generator, stats: GenerationStats,
                  use_tree: bool, full_check: bool) -> tuple[Block, Outcome, list[int]]:
    """Steps 2-4 of one iteration for the drafts ``tokens`` [K, L'] with laws ``q`` [K, L', V] after ``seq``:
    the target's pass, the verifier's step, the roll-back of both caches.  full_check: the O(K·L·V) value
    checks of the block (the first one; later laws come from the same transform, so only the O(K·L) checks
    -- shapes, drafted q > 0, NaN rows -- run).  -> (block, outcome, emitted tokens)."""
    watch = stats.watch
    n = len(seq)
    # 2. target: one pass over [pending, D_k] for all k (a token tree in one row, or K rows)
    with watch.phase("target"):
        pending = n - tgt.length  # committed tokens the target has not processed yet (>= 1)
        tree = build_tree(seq[tgt.length:], tokens.cpu()) if use_tree else None
        p = score_drafts(tgt, seq, tokens, sampling, tree).to(generator.device)  # [K, L'+1, V]
        stats.target_calls += 1
    # 3. verify
    with watch.phase("verify"):
        block = Block(tokens.unsqueeze(0), q.unsqueeze(0), p.unsqueeze(0))
        block.validate(full=full_check)
        outcome = verifier.step(block, generator, validate=False)
        tau, sel = int(outcome.tau[0]), int(outcome.sel[0])
        emitted = outcome.emitted(block)
    # 4. roll back both caches to the kept row and prefix; the new token stays pending
    if drf.uses_target_features:  # the target's features of the pending chain and D_sel[:tau]
        feats = tgt.last_features  # [1, nodes, d] (tree) or [K, pending + L', d] (rows)
        drf.observe_target(feats[0, tree.path(sel, tau)] if tree is not None else feats[sel, :pending + tau])
    if tree is not None:
        tgt.keep_nodes(tree.path(sel, tau))
    else:
        tgt.keep(sel)
        tgt.crop(n + tau)
    drf.commit(sel, tau)
    stats.accepted_lengths.append(tau)
    stats.selected_drafts.append(sel)
    return block, outcome, list(emitted)


def _decode_speculative(tgt: DecodeSession, drf: Drafter, verifier: Verifier, prompt: list[int],
                        sampling: SamplingConfig, K: int, L: int, max_new_tokens: int, eos: frozenset[int],
                        ctx: int | None, generator: torch.Generator, stats: GenerationStats,
                        on_step: Callable[[StepRecord], None] | None, use_tree: bool) -> list[int]:
    """The speculative loop (module docstring, steps 1-4); ``use_tree``: the target scores the K drafts
    as one token tree instead of K rows."""
    seq, out = list(prompt), []
    watch = stats.watch
    verifier.reset()
    iteration = 0
    while True:
        n = len(seq)
        if ctx is not None and n + L > ctx:
            stats.stop_reason = "context"
            break
        # 1. draft: K i.i.d. blocks with their exact law (the model drafter: pending tokens in one row,
        #    fork K, L sequential steps over K rows)
        with watch.phase("draft"):
            # blocks of 0..L tokens, except for verifiers whose state carries a window over the next L positions
            proposal = drf.propose(seq, K, L, sampling, generator, shorter_ok=not verifier.stateful)
            tokens, q = proposal.tokens, proposal.q  # [K, L'], [K, L', V], 0 <= L' <= L
            stats.draft_calls += proposal.calls
            if tokens.shape[1] < L:  # the acceptance rates per K·L and per position still count L
                stats.extra["short_blocks"] = stats.extra.get("short_blocks", 0) + 1
        if tokens.shape[1] == 0:  # the drafter proposed nothing: one autoregressive step (tau = 0)
            emitted = [_undrafted_step(tgt, drf, seq, sampling, generator, stats)]
        else:  # 2.-4.; ``iteration`` counts the verified blocks
            block, outcome, emitted = _verify_block(tgt, drf, verifier, seq, tokens, q, sampling, generator, stats,
                                                    use_tree, full_check=iteration == 0)
            if on_step is not None:
                on_step(StepRecord(iteration, tuple(seq), block, outcome, tuple(emitted)))
            iteration += 1
        seq.extend(emitted)
        reason = _commit(out, emitted, max_new_tokens, eos)
        if reason is not None:
            stats.stop_reason = reason
            break
    return out
