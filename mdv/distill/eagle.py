"""The ``eagle`` drafter's recipe (entry point ``experiments/train_eagle``, config ``mdv/conf/train_eagle.yaml``).

1. Text: the default draft's recipe, steps 1-2 (:func:`mdv.distill.data.build_sequences`: the same seeded
   held-out split, the target's own generations, reference answers, raw code).  The generations are
   shipped as ``output.generations`` (gzip JSON of the generation chunks, sha256-checked,
   :func:`~mdv.distill.data.pack_generations`): a rerun with the same settings reuses them instead of
   regenerating; other settings miss and generate (the chunk keys hash target, prompts, settings, seed).
2. Features: one float32 target pass per sequence, keeping the last decoder layer's output ``h_j`` (the
   final norm's input; fp16, cached per sequence under ``$MDV_CACHE/train_eagle``).
3. Training (:func:`train_eagle`): the drafter of :mod:`mdv.drafters.eagle` (``fc`` and one layer,
   initialised from target layer ``eagle.init_layer``, ``fc`` from [I, I]), AdamW on, at every position j >= start,

   .. math::

       \\mathcal L_j = \\mathrm{CE}\\big(p_S(\\cdot \\mid h_j),\\; q_S(\\cdot \\mid \\hat h_j)\\big)
           + w \\cdot \\mathrm{SmoothL1}\\big((\\hat h_j - h_j) / \\sigma\\big)

   with ``p_S``, ``q_S`` the softmax of the head subset rows after the target's final norm, σ the RMS of
   the target's features, and ``ĥ_j`` the drafter's prediction from the target's ``h_{j-1}`` plus noise
   of std ``train.feature_noise``·σ (EAGLE's robustness to its own feature errors).  With
   ``train.unroll = 2`` a second pass feeds the first pass's predictions ``ĥ_{j-1}`` as the features
   (what the second drafted token sees; training-time test, as in HASS / EAGLE-3) and adds its loss.
4. Output: ``<output.name>.safetensors`` + ``.json`` (naming the default draft's head subset file, not a
   copy) and ``eagle_report.json``: training curve, teacher-forced greedy agreement of the first and the
   second drafted token on the held-out prompts, expected acceptance, and the cost of a drafter step
   against a target step.
"""
from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any, Sequence

import torch
from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm

from mdv import assets
from mdv.distill.data import (batched_generate, build_sequences, cache_key, chat_ids, interleave,
                              load_prompt_records, pack_generations, split_records, unpack_generations)
from mdv.drafters.eagle import EagleHead, EagleNet, layer_config, load_eagle, save_eagle
from mdv.distill.train import warmup_cosine
from mdv.errors import InvalidInputError
from mdv.models import default_pair as dp
from mdv.models.hf import decoder_stack, last_layer_outputs


def check_options(cfg: DictConfig) -> None:
    """Reject option values the recipe would only trip over after the text and the feature pass."""
    for key, minimum in (("train.steps", 1), ("train.batch_size", 1), ("train.unroll", 1), ("features.batch", 1),
                         ("gen.samples_per_prompt", 1), ("eval.num_prompts", 1)):
        value = OmegaConf.select(cfg, key)
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise InvalidInputError(f"{key} must be an integer >= {minimum}; got {value!r}")
    if int(cfg.train.unroll) > 2:
        raise InvalidInputError(f"train.unroll must be 1 or 2; got {cfg.train.unroll}")
    if cfg.eagle.fc_init not in ("identity", "random"):
        raise InvalidInputError(f"eagle.fc_init must be identity or random; got {cfg.eagle.fc_init!r}")
    if cfg.eagle.head not in ("subset", "full"):
        raise InvalidInputError(f"eagle.head must be subset or full; got {cfg.eagle.head!r}")
    if cfg.train.autocast not in (None, "bfloat16"):
        raise InvalidInputError(f"train.autocast must be null or bfloat16; got {cfg.train.autocast!r}")
    layer = cfg.eagle.init_layer
    if layer is not None and (not isinstance(layer, int) or isinstance(layer, bool) or layer < 0):
        raise InvalidInputError(f"eagle.init_layer must be a target layer index or null; got {layer!r}")


@torch.no_grad()
def target_features_batch(target: Any, seqs: list[dict[str, Any]], batch: int, cache: Path | None
                          ) -> tuple[list[torch.Tensor], float]:
    """Per sequence the target's last decoder layer output at every position, fp16 [len, d] (recipe step 2),
    cached per sequence; also the seconds spent (as measured when computed)."""
    sha = assets.get_asset(dp.TARGET_ASSET).sha256
    keys = [cache_key({"target": sha, "ids": s["ids"], "features": "last_layer"}) for s in seqs]
    out: list[Any] = [None] * len(seqs)
    seconds = 0.0
    todo = []
    for i, key in enumerate(keys):
        p = cache / "features" / f"{key}.pt" if cache is not None else None
        if p is not None and p.is_file():
            d = torch.load(p)
            out[i], seconds = d["features"], seconds + d["seconds"]
        else:
            todo.append(i)
    if cache is not None:
        (cache / "features").mkdir(parents=True, exist_ok=True)
    order = sorted(todo, key=lambda i: len(seqs[i]["ids"]))
    for s in tqdm(range(0, len(order), batch), desc="target features", unit="batch"):
        t0 = time.perf_counter()
        idx = order[s:s + batch]
        n = max(len(seqs[i]["ids"]) for i in idx)
        ids = torch.zeros((len(idx), n), dtype=torch.long)
        for r, i in enumerate(idx):
            ids[r, :len(seqs[i]["ids"])] = torch.tensor(seqs[i]["ids"])
        with last_layer_outputs(target, "the eagle recipe") as got:
            target(input_ids=ids, use_cache=False, logits_to_keep=1)  # right padding: causal, exact
        dt = time.perf_counter() - t0
        seconds += dt
        for r, i in enumerate(idx):
            out[i] = got[-1][r, :len(seqs[i]["ids"])].half().clone()
            if cache is not None:
                tmp = cache / "features" / f"{keys[i]}.tmp"
                torch.save({"features": out[i], "seconds": dt / len(idx)}, tmp)
                tmp.replace(cache / "features" / f"{keys[i]}.pt")  # atomic: a kill leaves no half file
    return out, seconds


def make_net(target: Any, cfg: DictConfig) -> EagleNet:
    """The drafter net to train: the one in ``eagle.init_file`` (training goes on from it), else a fresh net
    whose layer copies target layer ``eagle.init_layer`` (null: random init) and, with
    ``eagle.fc_init=identity``, ``z_j = f_{j-1} + e(x_j)`` at the start (fc = [I, I], no bias)."""
    torch.manual_seed(int(cfg.seed))
    if cfg.eagle.init_file:
        net, info, _ = load_eagle(Path(cfg.eagle.init_file))
        if info["hidden_size"] != int(target.config.hidden_size):
            raise InvalidInputError(f"eagle.init_file {cfg.eagle.init_file} was trained for another target")
        return net.float()
    net = EagleNet(layer_config(target.config, cfg.eagle.intermediate_size))
    if cfg.eagle.fc_init == "identity":
        d = net.hidden_size
        with torch.no_grad():
            net.fc.bias.zero_()
            net.fc.weight.copy_(torch.cat([torch.eye(d), torch.eye(d)], 1))
    layer = cfg.eagle.init_layer
    if layer is not None:
        layers = decoder_stack(target, "the eagle recipe").layers
        if layer >= len(layers):
            raise InvalidInputError(f"eagle.init_layer={layer} is outside the target's {len(layers)} layers")
        missing, unexpected = net.decoder.layers[0].load_state_dict(layers[layer].state_dict(), strict=False)
        if unexpected or (missing and cfg.eagle.intermediate_size is None):
            raise InvalidInputError(f"eagle.init_layer: target layer {layer} does not fit the drafter's layer")
    return net.float()


class _Batch:
    """Padded tensors of a batch of sequences: ids [B, n], features [B, n, d] (float32), and the loss mask
    [B, n] (positions j >= start with a target feature, j < len)."""

    def __init__(self, seqs: list[dict[str, Any]], feats: list[torch.Tensor], idx: list[int]):
        n = max(len(seqs[i]["ids"]) for i in idx)
        d = feats[idx[0]].shape[1]
        self.ids = torch.zeros((len(idx), n), dtype=torch.long)
        self.h = torch.zeros((len(idx), n, d))
        self.mask = torch.zeros((len(idx), n), dtype=torch.bool)
        for r, i in enumerate(idx):
            m = len(seqs[i]["ids"])
            self.ids[r, :m] = torch.tensor(seqs[i]["ids"])
            self.h[r, :m] = feats[i].float()
            self.mask[r, max(1, seqs[i]["start"]):m] = True


def predict(net: EagleNet, embed: Any, b: _Batch, prev: torch.Tensor) -> torch.Tensor:
    """ĥ [B, n, d] from the features ``prev`` [B, n, d] (prev[:, j] = f_{j-1}) and the batch's tokens."""
    return net(prev, embed(b.ids))


def shifted(h: torch.Tensor) -> torch.Tensor:
    """f_{j-1} for every j: ``h`` moved one position right, zeros at j = 0.  [B, n, d]."""
    return torch.cat([torch.zeros_like(h[:, :1]), h[:, :-1]], 1)


def train_eagle(cfg: DictConfig, target: Any, seqs: list[dict[str, Any]], feats: list[torch.Tensor],
                head_ids: Sequence[int] | None) -> tuple[EagleNet, dict[str, Any]]:
    """Recipe step 3 (module docstring); -> (net, training log)."""
    t = cfg.train
    rng = random.Random(int(cfg.seed) + 7)
    gen = torch.Generator().manual_seed(int(cfg.seed) + 8)
    idx_all = list(range(len(seqs)))
    rng.shuffle(idx_all)
    n_val = max(1, int(round(float(cfg.data.val_fraction) * len(seqs))))
    val, tr = idx_all[:n_val], idx_all[n_val:]
    net = make_net(target, cfg).train()
    head = EagleHead(target, head_ids)
    embed = target.get_input_embeddings()
    sigma = float(torch.cat([feats[i].float() for i in tr[:200]]).pow(2).mean().sqrt())
    params = [p for p in net.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=float(t.lr), weight_decay=float(t.weight_decay), betas=(0.9, 0.95))
    steps = int(t.steps)
    sched = warmup_cosine(opt, steps, int(t.warmup), float(t.min_lr_ratio))
    autocast = t.autocast
    w, noise, unroll = float(t.reg_weight), float(t.feature_noise), int(t.unroll)

    def loss_of(idx: list[int], train: bool) -> tuple[torch.Tensor, dict[str, float]]:
        b = _Batch(seqs, feats, idx)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast is not None):
            with torch.no_grad():
                p_t = torch.softmax(head(b.h[b.mask]).float(), -1)  # [N, V]: -inf rows outside S give 0
            prev = shifted(b.h)
            if train and noise > 0:
                prev = prev + noise * sigma * torch.randn(prev.shape, generator=gen)
            total = torch.zeros(())
            stats: dict[str, float] = {}
            for depth in range(1, unroll + 1):
                h_hat = predict(net, embed, b, prev)  # [B, n, d]
                hh = h_hat[b.mask].float()
                logq = torch.log_softmax(head(hh).float(), -1)
                ce = -(p_t * logq.masked_fill(p_t == 0, 0.0)).sum(-1).mean()
                reg = torch.nn.functional.smooth_l1_loss(hh / sigma, b.h[b.mask] / sigma)
                total = total + ce + w * reg
                top1 = float((logq.argmax(-1) == p_t.argmax(-1)).float().mean())
                stats.update({f"ce{depth}": float(ce.detach()), f"reg{depth}": float(reg.detach()),
                              f"top1_{depth}": top1})
                prev = shifted(h_hat)  # the next depth sees the drafter's own features
        return total, stats

    def evaluate_val() -> dict[str, float]:
        net.eval()
        acc: dict[str, float] = {}
        with torch.no_grad():
            chunks = [val[s:s + int(t.batch_size)] for s in range(0, len(val), int(t.batch_size))]
            for c in chunks:
                _, st = loss_of(c, train=False)
                for k, v in st.items():
                    acc[k] = acc.get(k, 0.0) + v / len(chunks)
        net.train()
        return {f"val_{k}": round(v, 4) for k, v in acc.items()}

    lengths = [len(seqs[i]["ids"]) for i in tr]
    curve: list[dict[str, Any]] = [{"step": 0, **evaluate_val()}]
    tqdm.write(f"step 0: {curve[0]}")
    bar = tqdm(total=steps, desc="train eagle", unit="step")
    step, ema = 0, None
    t0 = time.perf_counter()
    while step < steps:
        order = sorted(range(len(tr)), key=lambda i: (lengths[i], rng.random()))
        batches = [order[s:s + int(t.batch_size)] for s in range(0, len(order), int(t.batch_size))]
        rng.shuffle(batches)
        for bi in batches:
            if step >= steps:
                break
            loss, st = loss_of([tr[i] for i in bi], train=True)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            gn = torch.nn.utils.clip_grad_norm_(params, float(t.grad_clip))
            opt.step()
            sched.step()
            step += 1
            ema = float(loss) if ema is None else 0.95 * ema + 0.05 * float(loss)
            bar.update(1)
            bar.set_postfix(loss=f"{ema:.3f}", top1=f"{st['top1_1']:.2f}", gn=f"{float(gn):.2f}")
            if step % int(t.val_every) == 0 or step == steps:
                row = {"step": step, "train_loss_ema": round(ema, 4), **evaluate_val()}
                curve.append(row)
                tqdm.write(f"step {step}: {row}")
    bar.close()
    return net.eval(), {"curve": curve, "train_sequences": len(tr), "val_sequences": len(val),
                        "feature_rms": sigma, "train_seconds": round(time.perf_counter() - t0, 1),
                        "trainable_parameters": sum(p.numel() for p in params)}


@torch.no_grad()
def greedy_agreement(target: Any, net: EagleNet, head: EagleHead, tok: Any, held: list[dict[str, Any]],
                     cfg: DictConfig, cache: Path | None) -> dict[str, Any]:
    """Teacher-forced along the target's greedy continuation of each held-out chat prompt: the fraction of
    positions where the drafter's argmax equals the target's, for the first drafted token (every previous
    feature the target's) and the second (the previous feature the drafter's own prediction); also the
    expected acceptance sum_x min(p_T, q_T) of the first drafted token at each ``eval.temperatures``."""
    from mdv.drafters.eagle import target_features

    e = cfg.eval
    recs = interleave(held, int(cfg.seed) + 11)[: int(e.num_prompts)]
    prompts = [chat_ids(tok, r["user"]) for r in recs]
    conts, _ = batched_generate(target, tok, prompts, int(e.max_new_tokens), 0.0, 1.0, len(prompts), int(cfg.seed),
                                desc="target greedy (held-out)", cache=cache)
    embed = target.get_input_embeddings()
    tot = {"agree_1": 0, "agree_2": 0, "positions": 0}
    acc = {str(float(T)): 0.0 for T in e.temperatures}
    by_src: dict[str, list[int]] = {}
    for r, p, c in zip(recs, prompts, conts):
        ids = p + c
        P = len(p)
        h = target_features(target, ids).float().unsqueeze(0)  # [1, n, d]
        x = torch.tensor([ids])
        e_x = embed(x)
        h1 = net(shifted(h), e_x)  # depth 1: ĥ_j from h_{j-1}
        h2 = net(shifted(h1), e_x)  # depth 2: ĥ_j from ĥ_{j-1}
        sl = slice(P - 1, len(ids) - 1)
        lt = head(h[0, sl])
        at = lt.argmax(-1)
        a1 = int((head(h1[0, sl]).argmax(-1) == at).sum())
        a2 = int((head(h2[0, sl]).argmax(-1) == at).sum())
        tot["agree_1"] += a1
        tot["agree_2"] += a2
        tot["positions"] += int(at.numel())
        s = by_src.setdefault(r["source"], [0, 0, 0])
        s[0], s[1], s[2] = s[0] + a1, s[1] + a2, s[2] + int(at.numel())
        lq = head(h1[0, sl])
        for T in e.temperatures:
            pt, qt = torch.softmax(lt.double() / T, -1), torch.softmax(lq.double() / T, -1)
            acc[str(float(T))] += float(torch.minimum(pt, qt).sum())
    n = tot["positions"]
    return {"greedy_agreement_first_token": tot["agree_1"] / n, "greedy_agreement_second_token": tot["agree_2"] / n,
            "by_source": {k: {"first": v[0] / v[2], "second": v[1] / v[2], "positions": v[2]} for k, v in by_src.items()},
            "expected_acceptance_first_token": {k: v / n for k, v in acc.items()},
            "positions": n, "prompts": len(recs), "max_new_tokens": int(e.max_new_tokens),
            "definition": "teacher-forced along the target's greedy continuation of each held-out chat prompt:"
                          " fraction of positions where the drafter's argmax = the target's argmax; 'first': every"
                          " previous feature is the target's, 'second': the previous one is the drafter's own"}


def _step_times(tgt: Any, drafters: list[tuple[str, Any, int]], prompt: list[int], reps: int) -> dict[str, float]:
    """Median wall time (ms) of one KV-cache step of the target session ``tgt`` (key "target") and of one
    drafted position of each bound drafter (key, drafter, K rows): its layer, norm, head and law.  The calls
    interleave, two warm-up rounds dropped."""
    from mdv.models.sampling import SamplingConfig

    sess = tgt.new_session()
    sess.prefill(prompt[:-1])
    sampling = SamplingConfig(1.0)
    g = torch.Generator().manual_seed(0)
    times: dict[str, list[float]] = {"target": [], **{key: [] for key, _, _ in drafters}}

    def target_step() -> float:
        t0 = time.perf_counter()
        sess.extend(torch.tensor([[prompt[-1]]]))
        dt = time.perf_counter() - t0
        sess.crop(len(prompt) - 1)
        return dt

    def eagle_step(drf: Any, K: int) -> float:
        drf.prefill(prompt)
        drf.propose(prompt, K, 1, sampling, g)  # the prompt in the drafter's cache, forked into K rows
        h = torch.zeros(K, drf.net.hidden_size)
        x = torch.full((K, 1), prompt[-1])
        t0 = time.perf_counter()  # one drafted position: the layer, norm and head, the law
        h = drf.layer_step(h.unsqueeze(1), x, len(prompt))[:, -1]
        sampling.probs(drf.head(h))
        return time.perf_counter() - t0

    calls = [("target", target_step)] + [(key, lambda d=drf, k=K: eagle_step(d, k)) for key, drf, K in drafters]
    with torch.inference_mode():
        for rep in range(reps + 2):
            for key, fn in calls:
                dt = fn()
                if rep >= 2:
                    times[key].append(dt)
    return {k: 1e3 * sorted(v)[len(v) // 2] for k, v in times.items()}


def step_cost(target: Any, eagle_file: Path, prompt: list[int], reps: int) -> dict[str, Any]:
    """Median wall time (ms) of one target KV-cache step and one drafter step (1 and 3 rows), interleaved, on
    the plain path (torch's linears; the target on transformers' forward) and, where the panel kernel runs, on
    mdv's fast path (the target's lean forward on float32 weight panels; the drafter's own linears on panels in
    each dtype of :data:`~mdv.drafters.eagle.EAGLE_PANEL_DTYPES`, its law computed as in a run)."""
    from mdv.drafters.eagle import EAGLE_PANEL_DTYPES, EagleDrafter
    from mdv.models.hf import HFModel
    from mdv.models.lean import LeanModel
    from mdv.models.panels import PanelPacks, panel_kernel_status

    tgt = HFModel(target)

    def bound(panel_dtype: str | None = None) -> Any:
        drf = EagleDrafter(file=str(eagle_file), panel_dtype=panel_dtype)
        drf.bind(tgt, None)
        return drf

    def summary(med: dict[str, float], note: str) -> dict[str, Any]:
        return {"ms": {k: round(v, 3) for k, v in med.items()},
                "ratio_to_target": {k: round(v / med["target"], 4) for k, v in med.items() if k != "target"},
                "context_tokens": len(prompt), "reps": reps, "threads": torch.get_num_threads(), "note": note}

    plain = _step_times(tgt, [("eagle_1", bound(), 1), ("eagle_3", bound(), 3)], prompt, reps)
    out = summary(plain, "median single-token step with a KV cache; the drafter step is its layer plus norm and"
                         " head plus the law; plain path: the target on transformers' forward, the drafter's layer on"
                         " the lean layer loop's torch operations, torch's linears; CPU, shared machine")
    ok, why = panel_kernel_status()
    if not ok:
        out["fast_path"] = {"skipped": why}
        return out
    with PanelPacks(target):
        lean = LeanModel.of(tgt)
        drafters = [(f"eagle_1_{d}", bound(d), 1) for d in EAGLE_PANEL_DTYPES]
        fast = _step_times(lean, drafters, prompt, reps)
    out["fast_path"] = summary(fast, "the same steps on mdv's fast path: the target's lean forward on float32 weight"
                                     " panels; the drafter's fc, layer (one C call) and subset head on panels in the"
                                     " dtype named (models.draft_panel_dtype in a run)")
    return out


def run_recipe(cfg: DictConfig, out_dir: Path, command: str) -> dict[str, Any]:
    """Steps 1-4 (module docstring) into ``out_dir``; ``command`` is recorded.  -> the report written."""
    check_options(cfg)
    torch.set_num_threads(int(cfg.num_threads))
    random.seed(int(cfg.seed))
    wall0 = time.perf_counter()
    cache = Path(cfg.output.work_cache) if cfg.output.work_cache else assets.cache_dir() / "train_draft"
    cache.mkdir(parents=True, exist_ok=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    gen_asset = out_dir / str(cfg.output.generations)
    seeded = unpack_generations(gen_asset, cache)
    target, tok = dp.load_target(torch.float32)
    for p in target.parameters():
        p.requires_grad_(False)
    train, held = split_records(load_prompt_records(), dict(cfg.data.holdout), int(cfg.seed))
    eagle_path = out_dir / f"{cfg.output.name}.json"
    head_file = dp.head_ids_path() if cfg.eagle.head == "subset" else None
    head_ids = dp.read_head_ids(head_file, int(target.get_output_embeddings().weight.shape[0])) if head_file else None
    report: dict[str, Any] = {"drafter": cfg.output.name, "target": dp.TARGET_ASSET, "recipe": command,
                              "config": OmegaConf.to_container(cfg, resolve=True),
                              "heldout_prompt_ids": [r["id"] for r in held],
                              "machine": {"threads": torch.get_num_threads(), "torch": torch.__version__,
                                          "note": "2-core CPU shared with other jobs: wall times are upper bounds"}}
    if not cfg.eval_only:
        seqs, data_info = build_sequences(cfg, tok, target, train, cache)
        data_info["generation_chunks_from_asset"] = seeded
        digest = pack_generations(data_info.pop("generation_chunks"), cache, gen_asset)
        data_info["generations_asset"] = {"file": gen_asset.name, "sha256": digest, "bytes": gen_asset.stat().st_size}
        feats, fsecs = target_features_batch(target, seqs, int(cfg.features.batch), cache / "eagle")
        data_info["feature_seconds"] = round(fsecs, 1)
        net, train_info = train_eagle(cfg, target, seqs, feats, head_ids)
        del feats
        if head_file is not None and head_file.parent.resolve() != out_dir.resolve():  # the subset file sits beside it
            (out_dir / head_file.name).write_bytes(head_file.read_bytes())
            head_file = out_dir / head_file.name
        save_eagle(net, eagle_path, {"target_asset": dp.TARGET_ASSET,
                                     "target_sha256": assets.get_asset(dp.TARGET_ASSET).sha256,
                                     "recipe": command, "config": report["config"]},
                   vocab_size=int(target.get_output_embeddings().weight.shape[0]), head_ids_file=head_file,
                   dtype=getattr(torch, str(cfg.output.weights_dtype)))
        report["data"], report["training"] = data_info, train_info
    elif (out_dir / cfg.output.report).is_file():  # keep the training run's sections (and its stages' notes)
        prev = json.loads((out_dir / cfg.output.report).read_text())
        report.update({k: v for k, v in prev.items() if k not in ("evaluation", "files")})  # machine, wall: training's
        report["evaluated_by"] = command
    net, _, ids = load_eagle(eagle_path)  # evaluate the drafter as shipped (fp16 weights, its head)
    head = EagleHead(target, ids)
    t0 = time.perf_counter()
    report["evaluation"] = greedy_agreement(target, net, head, tok, held, cfg, cache)
    prompt = chat_ids(tok, held[0]["user"])
    report["evaluation"]["step_cost"] = step_cost(target, eagle_path, prompt, int(cfg.eval.cost_reps))
    report["evaluation"]["eval_seconds"] = round(time.perf_counter() - t0, 1)
    report["files"] = {"config": eagle_path.name, "weights": eagle_path.with_suffix(".safetensors").name,
                       "weights_bytes": eagle_path.with_suffix(".safetensors").stat().st_size}
    report.setdefault("total_wall_seconds", round(time.perf_counter() - wall0, 1))  # eval_only: the training run's
    (out_dir / cfg.output.report).write_text(json.dumps(report, indent=2) + "\n")
    return report
