"""One Markdown section per benchmark (``SECTIONS``): the figures of a record as tables."""
from __future__ import annotations

from typing import Any, Callable, Sequence

from mdv.bench.config import LEAN_COMPARISONS
from mdv.bench.report.format import fmt, md_table, _method_rank, pct, rng
from mdv.bench.report.load import Record, SPLIT_KEYS
from mdv.drafters.base import method_label


# =============================================================================================== verifier
def _verifier_multi(rec: Record) -> set[str]:
    """Methods the record ran at some K > 1 (multi-draft); single-draft methods only run at K = 1."""
    return {r["method"] for r in rec.results if r["K"] > 1}


def _closest(want: int, have: Sequence[int]) -> int:
    return min(have, key=lambda v: (abs(v - want), -v))


def verifier_cell(rec: Record, K: int, L: int) -> tuple[int, int, str]:
    """The (K, L) of the verifier grid nearest to the requested one, and a note when it differs."""
    Ks = sorted({r["K"] for r in rec.results})
    Ls = sorted({r["L"] for r in rec.results})
    k, l_ = _closest(K, Ks), _closest(L, Ls)
    notes = []
    if k != K:
        notes.append(f"K={K} not in the grid {Ks}: K={k} shown")
    if l_ != L:
        notes.append(f"L={L} not in the grid {Ls}: L={l_} shown")
    return k, l_, "; ".join(notes)


def verifier_series(rec: Record, K: int, L: int) -> dict[str, list[dict[str, Any]]]:
    """method -> its rows at (K, L) sorted by V; single-draft methods from their K = 1 rows."""
    multi = _verifier_multi(rec)
    out: dict[str, list[dict[str, Any]]] = {}
    for r in rec.results:
        k_want = K if r["method"] in multi else 1
        if r["K"] == k_want and r["L"] == L:
            out.setdefault(r["method"], []).append(r)
    return {m: sorted(rows, key=lambda r: r["V"]) for m, rows in sorted(out.items(), key=lambda kv: _method_rank(kv[0]))}


def verifier_blocks(rec: Record) -> str:
    """What a verifier record timed: "synthetic blocks", or "N real blocks of the P pair at T = t"."""
    blocks = rec.summary.get("blocks") or {}
    if blocks.get("source") != "real":
        return "synthetic blocks"
    return (f"{blocks.get('contexts', '?')} real blocks of the {blocks.get('pair', '?')} pair at T ="
            f" {blocks.get('temperature', '?')}")


def _method_k_label(m: str, multi: set[str], K: int) -> str:
    return f"{m} (K={K})" if m in multi else f"{m} (K=1)"


def section_verifier(rec: Record, K: int, L: int) -> list[str]:
    cfg, summ, env = rec.config, rec.summary, rec.env
    k, l_, note = verifier_cell(rec, K, L)
    multi = _verifier_multi(rec)
    step = summ.get("target_step_ms")
    yard = (f"one decode step of {summ.get('target') or 'the target'} with {summ.get('target_step_context', '?')}"
            f" cached tokens: {rng(step)} ms")
    if summ.get("target_step_reason"):
        yard += f" (no step fraction: {summ['target_step_reason']})"
    blocks = summ.get("blocks") or {}
    where = verifier_blocks(rec) + (
        f" (prompts: {blocks.get('prompts', '?')}; distinct draft prefixes per block of {blocks.get('K_max', '?')} x"
        f" {blocks.get('L_max', '?')}: {rng(blocks.get('tree_prefixes'))})" if blocks.get("source") == "real" else "")
    lines = ["## verifier: fast-path cost", "",
             f"`Verifier.sample` on {where} (B = 1), device {env.get('device', '?')}, dtype"
             f" {env.get('dtype', '?')}; yardstick: {yard}. Median [min, max] over {cfg.get('repeats', '?')}"
             f" interleaved repeats ({cfg.get('warmup', '?')} warm-up); single-draft methods run at K = 1 only.", ""]
    series = verifier_series(rec, k, l_)
    Vs = sorted({r["V"] for r in rec.results})
    lines += [f"### ms per call (share of a target step) at K={k}, L={l_}" + (f" ({note})" if note else ""), ""]
    rows = []
    for m, rs in series.items():
        by_v = {r["V"]: r for r in rs}
        cells = []
        for V in Vs:
            r = by_v.get(V)
            if r is None:
                cells.append("-")
            else:
                frac = r["step_fraction"]["median"] if r["step_fraction"].get("n") else None
                cells.append(f"{fmt(r['ms']['median'])} ({pct(frac)})" if frac is not None else fmt(r["ms"]["median"]))
        rows.append([_method_k_label(m, multi, k)] + cells)
    lines += md_table(["method"] + [f"V={V}" for V in Vs], rows)
    vs = summ.get("vs_spectr_at_goal_cell") or {}
    if vs:
        lines += ["", f"Relative to `spectr` at the goal cell V={cfg.get('goal_V')}, K={cfg.get('goal_K')},"
                      f" L={cfg.get('goal_L')}: " + "; ".join(f"{m} {rng(s)}x" for m, s in vs.items()) + "."]
    lines += ["", "### Full grid", ""]
    grid = sorted(rec.results, key=lambda r: (r["V"], r["K"], r["L"], _method_rank(r["method"])))
    lines += md_table(["V", "K", "L", "method", "ms / call", "of a target step", "× spectr"],
                      [[r["V"], r["K"], r["L"], r["method"], rng(r["ms"]), rng(r["step_fraction"], percent=True),
                        rng(r.get("vs_spectr"))] for r in grid])
    return lines


# =============================================================================================== target pass
def section_target_pass(rec: Record) -> list[str]:
    res, env = rec.results, rec.env
    ms = res["ms"]
    lines = ["## target_pass: verification pass of K drafts", "",
             f"{rec.summary.get('target') or 'target'}; K={res['K']}, L={res['L']}, {res['context']} cached tokens,"
             f" {res.get('shared', 0)} shared draft tokens; device {env.get('device', '?')}, dtype {env.get('dtype', '?')};"
             f" {rec.config.get('repeats', '?')} interleaved repeats, ratios formed within a repeat.", ""]
    rows = [["single draft", res.get("single_tokens", res["L"] + 1), rng(ms["single"]), "1"],
            ["K full rows (fork + pass + keep; target_pass=rows)", res.get("k_rows_tokens", res["K"] * (res["L"] + 1)),
             rng(ms["k_rows"]), rng(res["k_rows_vs_single"])],
            ["token tree (shared prefixes once; the engine's default)" if rec.schema_version >= 2 else
             "tree attention (shared prefixes once; benchmark only)", res.get("tree_nodes", "-"), rng(ms["tree"]),
             rng(res["tree_vs_single"])]]
    if "fork_keep" in ms:
        rows.append(["(of K full rows: fork + keep of the cache alone)", 0, rng(ms["fork_keep"]),
                     rng(res.get("fork_keep_vs_single"))])
    lines += md_table(["pass", "tokens", "ms", "× single"], rows)
    extra = []
    if "tree_vs_k_rows" in res:
        extra.append(f"tree ÷ K full rows: {rng(res['tree_vs_k_rows'])}")
    if res.get("tree_max_abs_logit_diff") is not None:
        extra.append(f"tree vs K-row logits: max |diff| = {fmt(res['tree_max_abs_logit_diff'])}")
    if extra:
        lines += ["", "; ".join(extra) + "."]
    return lines


# =============================================================================================== e2e
def e2e_label(r: dict) -> str:
    """The row's method, with its drafter where that is not the default draft model (``sd+ngram``), and
    "packed" for a run on MKL-packed target linears (``sd packed``; speedup over packed AR), "panels" for one on
    weight panels (``sd panels``; speedup over AR on panels), "lean" / "lean+panels" for one on the lean
    decoder forward (speedup over AR on the same code)."""
    label = method_label(r["method"], r.get("drafter"))  # no drafter in records written before mdv.drafters
    variant = r.get("variant")  # records before the lean forward have packed / panels flags only
    if variant is None:
        variant = "packed" if r.get("packed") else "panels" if r.get("panels") else "plain"
    return label if variant == "plain" else f"{label} {variant}"


def _e2e_key(r: dict) -> tuple:
    d = r.get("drafter")
    return (bool(r.get("packed")), bool(r.get("panels")), r.get("forward") == "lean", d not in (None, "model"), d or "", _method_rank(r["method"]),
            r["K"] or 0, r["L"] or 0)


def best_per_method(rows: Sequence[dict]) -> dict[str, dict]:
    """method (+drafter, :func:`e2e_label`) -> its row with the highest median decode speedup (rows without a
    measured speedup ignored)."""
    best: dict[str, dict] = {}
    for r in rows:
        s, key = r["speedup"], e2e_label(r)
        if r["method"] == "ar" or not s.get("n") or s.get("median") is None:
            continue
        if key not in best or s["median"] > best[key]["speedup"]["median"]:
            best[key] = r
    return best


def section_e2e(rec: Record) -> list[str]:
    summ, cfg, env = rec.summary, rec.config, rec.env
    n = summ.get("n_prompts", cfg.get("n_prompts"))
    lines = ["## e2e: end to end", "",
             f"{summ.get('target') or 'target'} + {summ.get('draft') or 'draft'}; prompts: {summ.get('prompts', '?')};"
             f" {n} prompt(s), the first a warm-up (excluded from timing), {cfg.get('max_new_tokens', '?')} new tokens"
             f" each (no EOS stop); device {env.get('device', '?')}, dtype {env.get('dtype', '?')}. Speedup = AR decode s"
             " ÷ method decode s per prompt, median [min, max]; e2e speedup includes the prefill; block efficiency ="
             " emitted tokens ÷ target calls (all prompts); time split = share of decode time.", ""]
    temps = sorted({r["temperature"] for r in rec.results})
    has_split = any("time_split" in r for r in rec.results)
    for T in temps:
        rows_T = sorted([r for r in rec.results if r["temperature"] == T], key=_e2e_key)
        cols = ["method", "K", "L", "tokens/s", "speedup vs AR", "mean speedup", "e2e speedup", "block eff."]
        if has_split:
            cols += ["draft", "target", "verify", "other"]
        cols.append("timed prompts")
        rows = []
        for r in rows_T:
            row = [e2e_label(r), r["K"] if r["K"] is not None else "-", r["L"] if r["L"] is not None else "-",
                   rng(r["tokens_per_second"]), rng(r["speedup"]), fmt(r.get("speedup_mean")), rng(r.get("speedup_e2e")),
                   fmt(r.get("block_efficiency"))]
            if has_split:
                split = r.get("time_split") or {}
                row += [pct(split.get(k), 2) for k in SPLIT_KEYS]
            row.append(fmt(r.get("n_timed_prompts")))
            rows.append(row)
        lines += [f"### T = {fmt(T)}", ""] + md_table(cols, rows)
        best = best_per_method(rows_T)
        if best:
            lines += ["", f"Best setting per method at T = {fmt(T)} (highest median speedup):", ""]
            lines += md_table(["method", "K", "L", "speedup vs AR", "block eff."],
                              [[m, b["K"], b["L"], rng(b["speedup"]), fmt(b.get("block_efficiency"))]
                               for m, b in sorted(best.items(), key=lambda kv: _e2e_key(kv[1]))])
        lines.append("")
    return lines[:-1]


# =============================================================================================== oracle
def section_oracle(rec: Record) -> list[str]:
    res, cfg = rec.results, rec.config
    lines = ["## oracle: exact computations and Monte Carlo", "",
             "Exact enumeration and LPs at the largest size each supports per V (one run each, seconds):", ""]
    lines += md_table(["function", "method", "V", "K", "L", "tuples", "seconds"],
                      [[r["function"], r["method"], r.get("V", "-"), r.get("K", "-"), r.get("L", "-"),
                        r.get("tuples", "-"), fmt(r["seconds"])] for r in res["exact"]])
    lines += ["", f"Monte-Carlo throughput (`sample_iterations`), median [min, max] over {cfg.get('mc_repeats', '?')}"
                  " interleaved repeats:", ""]
    lines += md_table(["method", "V", "K", "L", "trials / call", "trials / s"],
                      [[r["method"], r.get("V", "-"), r.get("K", "-"), r.get("L", "-"), r.get("trials", "-"),
                        rng(r["trials_per_second"])]
                       for r in sorted(res["monte_carlo"], key=lambda r: _method_rank(r["method"]))])
    return lines


# =============================================================================================== memory
def section_memory(rec: Record) -> list[str]:
    res, cfg = rec.results, rec.config
    w = cfg.get("warmup_prompts", "?")
    lines = ["## memory: peak and growth", "",
             f"{rec.summary.get('target') or 'target'} + {rec.summary.get('draft') or 'draft'};"
             f" {res.get('method', cfg.get('method'))} K={res.get('K', cfg.get('K'))} L={res.get('L', cfg.get('L'))},"
             f" {res.get('n_prompts', cfg.get('n_prompts'))} prompts × {cfg.get('max_new_tokens', '?')} new tokens"
             f" ({res.get('prompts', '?')}); device {rec.env.get('device', '?')}.", ""]
    peak_note = ("since the start of the run" if res.get("peak_is_since_start_of_run")
                 else "process lifetime (peak reset not permitted)" if "peak_is_since_start_of_run" in res else "")
    rows = [[f"peak RSS (MiB){', ' + peak_note if peak_note else ''}", fmt(res.get("peak_rss_mib"), 5)],
            ["RSS before the run (MiB)", fmt(res.get("rss_before_mib"), 5)],
            [f"RSS after the warm-up ({w} prompts) (MiB)", fmt(res.get("rss_after_warmup_mib"), 5)],
            ["RSS at the end (MiB)", fmt(res.get("rss_end_mib"), 5)],
]
    if "rss_endpoint_growth_mib" in res:  # current records: rss_growth_mib is the median-based figure
        rows += [["RSS growth after the warm-up: median of the last quarter − median of the first (MiB)",
                  fmt(res.get("rss_growth_mib"))],
                 ["RSS growth, end − after the warm-up (MiB)", fmt(res.get("rss_endpoint_growth_mib"))]]
    else:  # records written before the median-based figure: rss_growth_mib was end − after the warm-up
        rows.append(["RSS growth, end − after the warm-up (MiB)", fmt(res.get("rss_growth_mib"))])
    rows += [
            ["RSS slope, least squares (MiB / prompt)", fmt(res.get("rss_slope_mib_per_prompt"))]]
    if res.get("cuda_peak_allocated_mib") is not None:
        rows.append(["CUDA peak allocated (MiB)", fmt(res["cuda_peak_allocated_mib"], 5)])
    lt = res.get("live_tensors") or []
    rows.append(["live tensors (prompt: count)", ", ".join(f"{i}: {c}" for i, c in lt) or "-"])
    rows.append(["live tensor growth after the warm-up", fmt(res.get("live_tensor_growth"))])
    lines += md_table(["figure", "value"], rows)
    return lines


def section_paired(rec: Record) -> list[str]:
    res, cfg = rec.results, rec.config
    lines = ["## paired: the paired measurement, timed", "",
             f"{res.get('prompts', '?')} prompts ({', '.join(cfg.get('datasets', []))}), {cfg.get('n_tokens', '?')}"
             f" generated tokens each, a context every {cfg.get('stride', '?')}: {res.get('contexts', '?')} contexts;"
             f" K_max = {cfg.get('K_max', '?')}, L_max = {cfg.get('L_max', '?')}, {cfg.get('workers', 1)} process(es);"
             f" {fmt(res.get('wall_seconds'))} s, {fmt(res.get('contexts_per_second'))} contexts/s. Each context costs a"
             " K_max-row draft of L_max steps and one target tree pass of up to K_max·L_max + 1 nodes; each"
             " trajectory token off the drafts' paths one AR target step"
             + (f" ({res['trajectory_target_steps']} steps for {res['trajectory_tokens']} tokens, the rest read from"
                " the tree passes)." if "trajectory_tokens" in res else "."), ""]
    share, secs = res.get("share") or {}, res.get("seconds") or {}
    lines += md_table(["part", "seconds", "share"], [[k, fmt(secs.get(k)), f"{float(v):.1%}"] for k, v in share.items()])
    return lines


def section_audit(rec: Record) -> list[str]:
    res = rec.results
    lines = ["## audit: the audit's speed and power", "",
             f"Harness with a free rule: {rng(res.get('harness_instances_per_second'))} instances/s; per-instance"
             f" adapter: {rng(res.get('scalar_instances_per_second'))} instances/s. Sampler throughput on the"
             " first-iteration blocks of each default-grid case (instances/s):", ""]
    lines += md_table(["case", "method", "instances/s"],
                      [[r["case"], r["method"], rng(r["instances_per_second"])] for r in res.get("throughput", [])])
    lines += ["", "Detection of a rule biased by a known TV on one case, the whole default audit run until its verdict:", ""]
    lines += md_table(["rule", "perturbed case", "TV", "verdict", "seconds", "sequences on that case"],
                      [[d["rule"], d["perturbed_case"], fmt(d["epsilon"]), d["verdict"], fmt(d["seconds"]),
                        fmt(d.get("sequences_on_perturbed_case"))] for d in res.get("detection", [])])
    return lines


def section_hf_compare(rec: Record) -> list[str]:
    summ, cfg = rec.summary, rec.config
    lines = ["## hf_compare: mdv against Hugging Face generate", "",
             f"{summ.get('target') or 'target'} + {summ.get('draft') or 'draft'}; prompts: {summ.get('prompts', '?')};"
             f" {summ.get('n_prompts', '?')} prompt(s), the first a warm-up, {cfg.get('max_new_tokens', '?')} tokens each,"
             f" T = {fmt(cfg.get('temperature'))}, L = {cfg.get('L', '?')}. Each generation is one whole call (prefill"
             " included); speed = the other contender's seconds ÷ this one's per prompt, median [min, max].", ""]
    lines += md_table(["contender", "tokens/s", "speed vs hf_plain", "speed vs HF with the same drafter"],
                      [[r["contender"], rng(r["tokens_per_second"]), rng(r["speed_vs_hf_plain"]),
                        rng(r["speed_vs_hf_same_drafter"]) if "speed_vs_hf_same_drafter" in r else "-"]
                       for r in rec.results])
    return lines


def section_pass_limit(rec: Record) -> list[str]:
    res = rec.results
    lines = ["## pass_limit: the target pass against its physical limit", "",
             f"{rec.summary.get('target') or 'target'}; {fmt(res['weight_bytes'] / 1e6)} MB of linear weights,"
             f" {fmt(res['flops_per_token'] / 1e9)} GFLOP per token, {fmt(res.get('context'))} cached tokens. Limit ="
             " max(weight bytes ÷ read bandwidth, n × FLOPs per token ÷ GEMM peak), both measured in the same run;"
             " attention over the context is left out, so the limit is a lower bound. Cached pass vs a fresh full"
             f" pass: max |p diff| = {fmt(res['max_abs_prob_diff_cached_vs_full'])}."
             + (" Packed: the linears on MKL packs made for the pack rows (n padded up to them; mdv.models.packed); p vs the plain pass:"
                f" max |p diff| = {fmt(res['max_abs_prob_diff_packed_vs_plain'])}."
                if "max_abs_prob_diff_packed_vs_plain" in res else "")
             + (" Panels: the linears on 16-column weight panels (mdv.models.panels; one pack for every n); p vs the plain"
                f" pass: max |p diff| = {fmt(res['max_abs_prob_diff_panels_vs_plain'])}; a full float32 pass vs float64:"
                f" {fmt(res['max_abs_prob_diff_plain_vs_float64'])} plain, {fmt(res['max_abs_prob_diff_panels_vs_float64'])}"
                " on panels." if "max_abs_prob_diff_panels_vs_plain" in res else "")
             + (" Lean: mdv's lean decoder forward (mdv.models.lean; on the panels when they are timed); p vs the plain"
                f" pass: max |p diff| = {fmt(res['max_abs_prob_diff_lean_vs_plain'])}."
                if "max_abs_prob_diff_lean_vs_plain" in res else "")
             + (f" Panel kernel: {res['panel_isa']}; panels on transparent huge pages (the OS's policy:"
                f" {res.get('transparent_huge_pages', '-')})." if "panel_isa" in res else "")
             + "".join(f" Lean {c}: the same lean pass with {LEAN_COMPARISONS[c]}, interleaved; p vs the plain pass:"
                       f" max |p diff| = {fmt(res[f'max_abs_prob_diff_lean_{c}_vs_plain'])}."
                       for c in LEAN_COMPARISONS if f"max_abs_prob_diff_lean_{c}_vs_plain" in res), ""]
    for e in res["per_threads"]:
        lines += [f"### {e['threads']} thread(s): read bandwidth {rng(e['read_GBps'])} GB/s, GEMM peak"
                  f" {rng(e['gemm_GFLOPs'])} GFLOP/s", ""]
        packed = any("packed_ms" in r for r in e["passes"])
        paneled = any("panels_ms" in r for r in e["passes"])
        lean = any("lean_ms" in r for r in e["passes"])
        compare = [c for c in LEAN_COMPARISONS if any(f"lean_{c}_ms" in r for r in e["passes"])]
        lines += md_table(["n new tokens", "ms", "limit ms", "bound", "× limit"]
                          + (["pack rows", "packed ms", "packed × limit", "packed ÷ plain"] if packed else [])
                          + (["panels ms", "panels × limit", "panels ÷ plain"] if paneled else [])
                          + (["lean ms", "lean × limit", "lean ÷ plain"] if lean else [])
                          + [h for c in compare for h in (f"lean {c} ms", f"lean {c} × limit", f"lean ÷ lean {c}")],
                          [[r["n"], rng(r["ms"]), fmt(r["limit_ms"]), r.get("bound", "-"), rng(r["vs_limit"])]
                           + ([r.get("pack_rows", r["n"]), rng(r["packed_ms"]), rng(r["packed_vs_limit"]), rng(r["packed_vs_plain"])]
                              if packed else [])
                           + ([rng(r["panels_ms"]), rng(r["panels_vs_limit"]), rng(r["panels_vs_plain"])] if paneled else [])
                           + ([rng(r["lean_ms"]), rng(r["lean_vs_limit"]), rng(r["lean_vs_plain"])] if lean else [])
                           + [rng(r[k]) for c in compare for k in (f"lean_{c}_ms", f"lean_{c}_vs_limit", f"lean_vs_lean_{c}")]
                           for r in e["passes"]])
        lines.append("")
    return lines[:-1]


def section_draft_step(rec: Record) -> list[str]:
    res = rec.results
    rows = res["rows"]
    ref = rec.config.get("dtypes", [rows[0]["dtype"]])[0]
    lines = ["## draft_step: one drafting iteration per panel dtype of the draft", "",
             f"{rec.summary.get('draft') or 'draft'}; K blocks of {rows[0].get('L', '-')} cached steps"
             f" (`draft_blocks`) after {fmt(res.get('context'))} tokens on the lean forward, each timed call after a"
             " cache eviction, dtypes interleaved. Limit = L × panel bytes ÷ read bandwidth"
             f" ({rng(res['read_GBps'])} GB/s, measured in the run). Law TV: total variation between the dtype's"
             " next-token law and float32 panels' (T = 1), mean and max over the compared positions.", ""]
    lines += md_table(["dtype", "K", "ms", "limit ms", "× limit", f"÷ {ref}", "panel MB", "law TV vs float32"],
                      [[r["dtype"], r["K"], rng(r["ms"]), fmt(r["limit_ms"]), rng(r["vs_limit"]),
                        rng(r[f"vs_{ref}"]) if f"vs_{ref}" in r else "-", fmt(r["pack_bytes"] / 1e6),
                        (f"{fmt(r['law_tv_vs_float32']['mean'])} / {fmt(r['law_tv_vs_float32']['max'])}"
                         if "law_tv_vs_float32" in r else "-")] for r in rows])
    return lines


SECTIONS: dict[str, Callable[..., list[str]]] = {
    "verifier": section_verifier, "target_pass": section_target_pass, "e2e": section_e2e, "oracle": section_oracle,
    "memory": section_memory, "paired": section_paired, "audit": section_audit, "pass_limit": section_pass_limit,
    "draft_step": section_draft_step,
    "hf_compare": section_hf_compare}
