"""Evaluating a draft (recipe step 5): teacher-forced greedy agreement on held-out prompts, draft/target cost per
KV-cache step, and the block efficiency of ``sd`` through :func:`mdv.generate`.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Sequence

import torch
from omegaconf import DictConfig
from tqdm.auto import tqdm

from mdv.models import default_pair as dp
from mdv.distill.data import SOURCES, batched_generate, chat_ids, interleave


@torch.no_grad()
def greedy_agreement(target: Any, draft: Any, tok: Any, held: list[dict[str, Any]], n_prompts: int,
                     max_new_tokens: int, seed: int, cache: Path | None = None,
                     temperatures: Sequence[float] = ()) -> dict[str, Any]:
    """Teacher-forced greedy agreement on held-out prompts: along the target's greedy continuation, the
    fraction of positions where the draft's argmax equals the target's argmax.  With ``temperatures``,
    also the mean expected acceptance ``sum_x min(p_T(x), q_T(x))`` of one drafted token at each
    temperature T over the same positions (``expected_acceptance``)."""
    recs = interleave(held, seed + 11)[:n_prompts]
    prompts = [chat_ids(tok, r["user"]) for r in recs]
    conts, _ = batched_generate(target, tok, prompts, max_new_tokens, 0.0, 1.0, len(prompts), seed,
                                desc="target greedy (held-out)", cache=cache)
    per: list[dict[str, Any]] = []
    for r, p, c in zip(recs, prompts, conts):
        ids = torch.tensor([p + c])
        P = len(p)
        lt = target(input_ids=ids).logits[0, P - 1:-1]
        at = lt.argmax(-1)
        ld = draft(input_ids=ids).logits[0, P - 1:-1]
        ad = ld.argmax(-1)
        per.append({"id": r["id"], "source": r["source"], "positions": int(at.numel()),
                    "agree": int((at == ad).sum()), "target_argmax_is_continuation":
                    float((at == ids[0, P:]).float().mean())})
        if temperatures:  # float64 laws; the draft's -inf logits (a subset head) give q = 0 there
            per[-1]["acceptance_sum"] = {
                str(float(T)): float(torch.minimum(torch.softmax(lt.double() / T, -1),
                                                   torch.softmax(ld.double() / T, -1)).sum(-1).sum())
                for T in temperatures}
    tot = sum(x["agree"] for x in per)
    n = sum(x["positions"] for x in per)
    by_src = {}
    for src in SOURCES:
        xs = [x for x in per if x["source"] == src]
        if xs:
            by_src[src] = sum(x["agree"] for x in xs) / sum(x["positions"] for x in xs)
    res = {"greedy_agreement": tot / n, "greedy_agreement_mean_over_prompts":
           sum(x["agree"] / x["positions"] for x in per) / len(per), "by_source": by_src,
           "positions": n, "prompts": per, "max_new_tokens": max_new_tokens,
           "definition": "teacher-forced along the target's greedy continuation of each held-out chat prompt:"
                         " fraction of positions where draft argmax = target argmax"}
    if temperatures:
        sums = [x.pop("acceptance_sum") for x in per]
        res["expected_acceptance"] = {str(float(T)): sum(a[str(float(T))] for a in sums) / n for T in temperatures}
        res["expected_acceptance_definition"] = (
            "mean over the same positions of sum_x min(p_T(x), q_T(x)), target p and draft q at temperature T:"
            " the probability that speculative sampling accepts one drafted token there")
    return res


@torch.no_grad()
def step_cost(target: Any, draft: Any, prompt: list[int], reps: int) -> dict[str, Any]:
    """Median wall time of one single-token KV-cache step of each model after the same prompt, timed
    side by side (calls interleaved), through mdv's HFModel sessions when available."""
    try:
        from mdv.models.hf import HFModel

        sessions = []
        for m in (target, draft):
            s = HFModel(m).new_session()
            s.prefill(prompt[:-1])
            sessions.append(s)

        def one(i: int) -> float:
            s = sessions[i]
            L = s.length
            t0 = time.perf_counter()
            s.extend(torch.tensor([[prompt[-1]]]))
            dt = time.perf_counter() - t0
            s.crop(L)
            return dt
        via = "mdv.models.hf.HFSession"
    except ImportError:  # engine not there: plain transformers caches
        caches = []
        for m in (target, draft):
            o = m(input_ids=torch.tensor([prompt[:-1]]), use_cache=True)
            caches.append(o.past_key_values)

        def one(i: int) -> float:
            m = (target, draft)[i]
            t0 = time.perf_counter()
            m(input_ids=torch.tensor([[prompt[-1]]]), past_key_values=caches[i], use_cache=True)
            dt = time.perf_counter() - t0
            caches[i].crop(-1)
            return dt
        via = "transformers DynamicCache"
    for i in (0, 1, 0, 1):  # warm-up
        one(i)
    tt, td = [], []
    for _ in range(reps):
        tt.append(one(0))
        td.append(one(1))
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    return {"target_ms": 1e3 * med(tt), "draft_ms": 1e3 * med(td), "ratio": med(td) / med(tt),
            "context_tokens": len(prompt), "reps": reps, "via": via,
            "note": "median single-token step with a KV cache, target and draft calls interleaved; CPU, "
                    f"{torch.get_num_threads()} threads, shared machine"}


def block_efficiency(target: Any, draft: Any, tok: Any, held: list[dict[str, Any]], cfg: DictConfig
                     ) -> dict[str, Any] | None:
    """Block efficiency of ``sd`` (K=1, L=eval.be_L, T=eval.be_temperature) via mdv.generate, or None
    when the engine is not importable."""
    try:
        from mdv.engine import generate
        from mdv.models.hf import HFModel
    except ImportError as e:  # pragma: no cover - depends on the checkout
        return {"skipped": f"mdv.engine not importable: {e}"}
    e = cfg.eval
    recs = interleave(held, int(cfg.seed) + 13)[: int(e.be_prompts)]
    if not recs:
        return None
    T_, D_ = HFModel(target, tok), HFModel(draft, tok)
    per = []
    for i, r in enumerate(tqdm(recs, desc="sd block efficiency", unit="prompt")):
        res = generate(T_, D_, chat_ids(tok, r["user"]), "sd", K=1, L=int(e.be_L),
                       temperature=float(e.be_temperature), max_new_tokens=int(e.be_max_new_tokens),
                       seed=int(cfg.seed) + i)
        st = res.stats
        per.append({"id": r["id"], "block_efficiency": float(st["block_efficiency"]),
                    "target_calls": int(st["target_calls"]), "new_tokens": len(res.tokens)})
    emitted = sum(x["new_tokens"] for x in per)
    calls = sum(x["target_calls"] for x in per)
    return {"method": "sd", "K": 1, "L": int(e.be_L), "temperature": float(e.be_temperature),
            "max_new_tokens": int(e.be_max_new_tokens),
            "block_efficiency_mean_over_prompts": sum(x["block_efficiency"] for x in per) / len(per),
            "pooled_tokens_per_target_call": emitted / calls if calls else None, "prompts": per}


def evaluate(cfg: DictConfig, target: Any, draft: Any, tok: Any, held: list[dict[str, Any]],
             cache: Path | None = None) -> dict[str, Any]:
    """Every held-out measurement of the report (the target's greedy continuations may be cached)."""
    e = cfg.eval
    t0 = time.perf_counter()
    agr = greedy_agreement(target, draft, tok, held, int(e.num_prompts), int(e.max_new_tokens), int(cfg.seed),
                           cache)
    first = interleave(held, int(cfg.seed) + 11)[0]
    cost = step_cost(target, draft, chat_ids(tok, first["user"]), int(e.cost_reps))
    be = block_efficiency(target, draft, tok, held, cfg)
    return {"draft": dp.draft_description(draft), "agreement": agr, "cost_per_step": cost, "sd_block_efficiency": be,
            "eval_seconds": round(time.perf_counter() - t0, 1)}
