"""``eagle``: a one-layer drafter that reads the target's own features (Li et al. 2024, "EAGLE:
Speculative Sampling Requires Rethinking Feature Uncertainty", ICML; EAGLE-2/3 keep the idea).

Notation: ``x_0 .. x_{n-1}`` the committed sequence; ``h_j`` [d] the target's last decoder layer output
at position j (before its final norm, so the target's law of ``x_{j+1}`` is ``softmax(W norm(h_j))``);
``e(x)`` the target's token embedding.  The drafter predicts the target's feature one position ahead:

.. math::

    z_j = W_{fc} [f_{j-1}; e(x_j)] + b_{fc}, \\qquad f_{-1} = 0 \\\\
    \\hat h_j = \\mathrm{Layer}(z_0, \\dots, z_j) \\quad \\text{(one causal decoder layer, its own KV cache)} \\\\
    q(x_{j+1} \\mid x_{\\le j}) = T\\big(\\mathrm{softmax}(W_S\\, \\mathrm{norm}(\\hat h_j))\\big)

with ``f_{j-1} = h_{j-1}``, the target's feature, wherever the target has scored position j-1 (every
committed position but the last), and ``f_{j-1} = ĥ_{j-1}``, the drafter's own prediction, at drafted
positions.  ``norm`` and ``W`` are the target's final norm and head, frozen and shared (no copy);
``W_S`` keeps only the rows of a vocabulary subset S and gives ``-inf`` elsewhere, so q is exactly 0
outside S (the default draft's head trick, :class:`~mdv.models.default_pair.SubsetHead`); T is the
sampling transform.  Only ``W_fc``, ``b_fc`` and the layer are trained and shipped
(``mdv/assets_data/<name>.safetensors`` + ``.json``; recipe :mod:`mdv.distill.eagle`).

In the engine the target's session records the last layer's output of every pass
(:attr:`~mdv.drafters.base.Drafter.uses_target_features`); the committed positions' features reach
:meth:`EagleDrafter.observe_target` (after prefill: the prompt but its last token; after each iteration:
the pending chain and the accepted draft tokens).  :meth:`EagleDrafter.propose` then feeds the
positions not yet in its cache in one row, forks into K rows and takes L - 1 sequential steps, each row
extending its own features.  After the verifier's outcome its cache keeps row ``sel`` cropped to the
context length n: the positions past it were computed from *predicted* features, and are recomputed
from the target's once the target has scored them (so q depends on the committed prefix only, never on
rejected drafts).  A caller without recorded features (a bare ``prefill`` + ``propose``, the paired
measurement) gets the missing ones from one full target pass.  :meth:`EagleDrafter.reference_law`
recomputes everything from the context: one full target pass, then the layer over the whole sequence
once per drafted position, without a cache, on transformers' forward.

The cached steps run the layer on the lean forward's layer loop (:class:`~mdv.models.lean.LeanLayerSession`:
a preallocated cache, ``fork``/``keep``/``crop`` as the target's sessions) where it runs a Llama layer, else on
transformers' forward and a ``DynamicCache`` (:class:`TransformersLayerSession`).  Where the target's linears
run on weight panels (mdv's fast path), the drafter's own linears do too, in the draft model's panel dtype or
``panel_dtype`` (:meth:`EagleDrafter._pack_on_panels`), and the layer is then one C call
(:mod:`mdv.models.lean_layer`).
"""
from __future__ import annotations

import copy
import inspect
import json
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import Tensor

from mdv.drafters.base import Draft, Drafter, draw_rows
from mdv.drafters.registry import register_drafter
from mdv.errors import InvalidInputError, MissingAssetError
from mdv.models.panels import PANEL_DTYPES
from mdv.models.sampling import SamplingConfig

#: The weight dtypes of the panels the drafter's own linears can run on (option ``panel_dtype``).
EAGLE_PANEL_DTYPES = tuple(str(d).removeprefix("torch.") for d in PANEL_DTYPES)
#: The shipped eagle drafter of the default target (``mdv/assets_data/<EAGLE_NAME>.json``).
EAGLE_NAME = "smollm2-135m-instruct-eagle"
EAGLE_FORMAT = 1


def default_eagle_path() -> Path:
    from mdv.models.default_pair import DATA_DIR

    return DATA_DIR / f"{EAGLE_NAME}.json"


def layer_config(target_config: Any, intermediate_size: int | None = None) -> Any:
    """The config of the drafter's one decoder layer: the target's text config with one layer
    (``intermediate_size`` None: the target's MLP width), no vocabulary of its own."""
    cfg = copy.deepcopy(target_config)
    cfg.num_hidden_layers = 1
    if getattr(cfg, "layer_types", None) is not None:
        cfg.layer_types = list(cfg.layer_types)[:1]
    if intermediate_size is not None:
        cfg.intermediate_size = int(intermediate_size)
    cfg.vocab_size = 1  # the layer reads z_j, never token ids: no embedding table of its own
    cfg.pad_token_id = cfg.bos_token_id = cfg.eos_token_id = None  # ids of a vocabulary it does not have
    cfg.tie_word_embeddings = False
    return cfg


class EagleNet(torch.nn.Module):
    """The trained part: ``fc`` [2d -> d] and one decoder layer (a transformers base model with one
    layer, its embedding dropped and its final norm the identity: it returns ``ĥ`` before any norm)."""

    def __init__(self, config: Any) -> None:
        from transformers import AutoModel

        super().__init__()
        d = int(config.hidden_size)
        self.config = config
        self.fc = torch.nn.Linear(2 * d, d, bias=True)
        self.decoder = AutoModel.from_config(config)
        self.decoder.embed_tokens = None
        self.decoder.norm = torch.nn.Identity()
        # transformers >= 5 calls the cache argument `cache`; 4.x called it `past_key_values` (as in HFModel)
        self._cache_kw = "cache" if "cache" in inspect.signature(self.decoder.forward).parameters else "past_key_values"

    @property
    def hidden_size(self) -> int:
        return int(self.config.hidden_size)

    def fuse(self, prev: Tensor, emb: Tensor) -> Tensor:
        """The layer's inputs ``z_j = W_fc [f_{j-1}; e(x_j)] + b_fc``: prev, emb [R, n, d] -> z [R, n, d]."""
        return self.fc(torch.cat([prev, emb], -1))

    def forward(self, prev: Tensor, emb: Tensor, cache: Any = None, position_ids: Tensor | None = None,
                attention_mask: Tensor | None = None) -> Tensor:
        """prev: [R, n, d] the features f_{j-1}; emb: [R, n, d] the embeddings e(x_j); -> ĥ [R, n, d]."""
        z = self.fuse(prev, emb)  # [R, n, d]
        kw: dict[str, Any] = {"inputs_embeds": z, "use_cache": cache is not None}
        if cache is not None:
            kw[self._cache_kw] = cache
        if position_ids is not None:
            kw["position_ids"] = position_ids
        if attention_mask is not None:
            kw["attention_mask"] = attention_mask
        return self.decoder(**kw).last_hidden_state

    def trained_state(self) -> dict[str, Tensor]:
        """Every tensor of the net (fc and the layer): all of it is trained and shipped."""
        return dict(self.state_dict())


def save_eagle(net: EagleNet, path: Path, meta: dict[str, Any], vocab_size: int, head_ids_file: Path | None = None,
               dtype: torch.dtype = torch.float16) -> Path:
    """Write ``net`` as ``<path stem>.safetensors`` (``dtype``) and its JSON config ``path``; ``head_ids_file``
    (a head-subset file of :func:`mdv.models.default_pair.write_head_ids`, in the same folder) is named with its
    sha256, not copied.  -> the config path."""
    import os

    from safetensors.torch import save_file

    from mdv.models.default_pair import sha256_bytes

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    wpath = path.with_suffix(".safetensors")
    state = {k: v.detach().to(dtype).contiguous().clone() for k, v in net.trained_state().items()}
    save_file(state, str(wpath), metadata={"format": "pt", "mdv_eagle": path.stem})
    os.chmod(wpath, 0o644)  # safetensors writes 0600; the file is shipped in the repository
    cfg: dict[str, Any] = {
        "format": EAGLE_FORMAT, "name": path.stem, "kind": "eagle",
        "hidden_size": net.hidden_size, "vocab_size": int(vocab_size),
        "layer_config": net.config.to_dict(),
        "weights_file": wpath.name, "weights_sha256": sha256_bytes(wpath),
        "weights_dtype": str(dtype).removeprefix("torch."),
        "num_shipped_parameters": int(sum(v.numel() for v in state.values())),
    }
    if head_ids_file is not None:
        head_ids_file = Path(head_ids_file)
        if head_ids_file.parent.resolve() != path.parent.resolve():
            raise ValueError(f"the head subset {head_ids_file} must sit in the folder of {path}")
        cfg["head_vocab_subset"] = head_ids_file.name
        cfg["head_vocab_subset_sha256"] = sha256_bytes(head_ids_file)
    cfg.update(meta)
    path.write_text(json.dumps(cfg, indent=2) + "\n")
    os.chmod(path, 0o644)
    return path


def load_eagle(path: Path) -> tuple[EagleNet, dict[str, Any], list[int] | None]:
    """(net, its config, the head subset ids or None) from an eagle JSON config, every file sha256-checked;
    :class:`~mdv.errors.MissingAssetError` naming the fix otherwise."""
    from safetensors.torch import load_file
    from transformers import AutoConfig

    from mdv.models.default_pair import read_head_ids, sha256_bytes

    path = Path(path)
    fix = "retrain it with `python experiments/train_eagle.py`, or restore the shipped file from git"
    if not path.is_file():
        raise MissingAssetError(f"eagle drafter file not found: {path}; {fix}")
    try:
        cfg = json.loads(path.read_text())
        ok = (isinstance(cfg, dict) and cfg.get("kind") == "eagle" and isinstance(cfg.get("layer_config"), dict)
              and isinstance(cfg.get("weights_file"), str) and bool(cfg["weights_file"]))
    except (OSError, UnicodeDecodeError, ValueError):
        ok = False
    if not ok:
        raise MissingAssetError(f"{path} is not an eagle drafter config (a JSON file with kind 'eagle'); {fix}")
    wpath = path.with_name(cfg["weights_file"])
    if not wpath.is_file() or sha256_bytes(wpath) != cfg.get("weights_sha256"):
        raise MissingAssetError(f"{wpath} is missing or does not match the sha256 recorded in {path.name}; {fix}")
    lc = dict(cfg["layer_config"])
    config = AutoConfig.for_model(lc.pop("model_type"), **lc)
    net = EagleNet(config)
    state = load_file(str(wpath))
    missing, unexpected = net.load_state_dict({k: v.float() for k, v in state.items()}, strict=False)
    if missing or unexpected:
        raise MissingAssetError(f"{wpath.name} does not fit the eagle architecture (missing {missing}, unexpected"
                                f" {unexpected}); {fix}")
    ids = None
    if cfg.get("head_vocab_subset"):
        ids_path = path.with_name(cfg["head_vocab_subset"])
        if not ids_path.is_file() or sha256_bytes(ids_path) != cfg.get("head_vocab_subset_sha256"):
            raise MissingAssetError(f"{ids_path} is missing or does not match the sha256 in {path.name}; {fix}")
        try:
            ids = read_head_ids(ids_path, int(cfg["vocab_size"]))
        except (OSError, ValueError) as err:
            raise MissingAssetError(f"{ids_path} is not a valid head vocabulary subset ({err}); {fix}") from None
    return net.eval(), cfg, ids


class EagleHead(torch.nn.Module):
    """``q``'s logits from ``ĥ``: the target's final norm, then its head (restricted to ``ids``: -inf
    elsewhere), both the target's own modules (shared, frozen)."""

    def __init__(self, target_model: Any, ids: Sequence[int] | None) -> None:
        from mdv.models.default_pair import SubsetHead
        from mdv.models.hf import decoder_stack

        super().__init__()
        self.norm = decoder_stack(target_model, "drafter 'eagle'").norm
        weight = target_model.get_output_embeddings().weight
        self.head = SubsetHead(weight, ids, int(weight.shape[0])) if ids is not None \
            else target_model.get_output_embeddings()

    def forward(self, h: Tensor) -> Tensor:
        return self.head(self.norm(h))


def target_features(model: Any, ids: Sequence[int]) -> Tensor:
    """The target's last decoder layer output [n, d] at every position of ``ids`` (one full pass, no cache)."""
    from mdv.models.hf import last_layer_outputs

    dev = next(model.parameters()).device
    with last_layer_outputs(model, "drafter 'eagle'") as got:
        model(input_ids=torch.tensor([list(map(int, ids))], dtype=torch.long, device=dev), use_cache=False,
              logits_to_keep=1)
    return got[-1][0]


class TransformersLayerSession:
    """The drafter's layer on transformers' forward and a ``DynamicCache``, with the interface of
    :class:`~mdv.models.lean.LeanLayerSession` (``run``, ``fork``, ``keep``, ``crop``, ``length``): for a
    layer the lean loop does not run (a non-Llama target's)."""

    def __init__(self, net: EagleNet) -> None:
        self.net = net
        self.cache = self._new_cache()
        self.rows = 1

    def _new_cache(self) -> Any:
        from transformers import DynamicCache

        try:
            return DynamicCache(config=self.net.config)
        except TypeError:  # transformers 4.x
            return DynamicCache()

    @property
    def length(self) -> int:
        return int(self.cache.get_seq_length())

    def run(self, z: Tensor, positions: Tensor) -> Tensor:
        """z [R, n, d] at ``positions`` [R, n] -> the layer's output [R, n, d]."""
        kw = {"inputs_embeds": z, "use_cache": True, self.net._cache_kw: self.cache, "position_ids": positions}
        return self.net.decoder(**kw).last_hidden_state

    def fork(self, k: int) -> None:
        if k > 1:
            self.cache.batch_repeat_interleave(k)
        self.rows = k

    def keep(self, row: int) -> None:
        if self.rows > 1:
            self.cache.batch_select_indices(torch.tensor([row], device=self.net.fc.weight.device))
        self.rows = 1

    def crop(self, length: int) -> None:
        held = self.length
        if length == 0:
            self.cache = self._new_cache()
        elif held > length:
            self.cache.crop(length - held)  # transformers 5 crops by a negative count


@register_drafter
class EagleDrafter(Drafter):
    """One decoder layer over the target's features (module docstring)."""

    name = "eagle"
    uses_target_features = True

    def __init__(self, file: str | None = None, head: str = "subset", panel_dtype: str | None = None) -> None:
        if file is not None and not isinstance(file, (str, Path)):
            raise InvalidInputError(f"eagle drafter: file must be the path of an eagle JSON config; got {file!r}")
        if head not in ("subset", "full"):
            raise InvalidInputError(f"eagle drafter: head must be 'subset' or 'full'; got {head!r}")
        if panel_dtype is not None and panel_dtype not in EAGLE_PANEL_DTYPES:
            raise InvalidInputError(f"eagle drafter: panel_dtype must be one of {', '.join(EAGLE_PANEL_DTYPES)} or null"
                                    f" (null: the draft model's panel dtype); got {panel_dtype!r}")
        self.file = None if file is None else str(file)
        self.head_choice = head
        self.panel_dtype_choice = panel_dtype
        self.net: EagleNet | None = None
        self.target: Any = None
        self.head: EagleHead | None = None
        self._embed: Any = None
        self._cache: Any = None
        self._clen = 0  # leading positions of the cache computed from the target's features only
        self._feats: Tensor | None = None  # [N, d]: the target's features of positions 0..N-1
        self._n = 0
        self._rows = 1
        self._panels: Any = None  # PanelPacks of the drafter's own linears (bind: on mdv's fast path)

    def options(self) -> dict[str, Any]:
        return {"file": self.file, "head": self.head_choice, "panel_dtype": self.panel_dtype_choice}

    def bind(self, target: Any, draft: Any) -> int:
        from mdv.models.hf import HFModel, decoder_stack

        if not isinstance(target, HFModel):
            raise InvalidInputError(f"drafter 'eagle' needs the target as an mdv.models.HFModel (a transformers"
                                    f" model: it reads the target's hidden states); got {type(target).__name__}")
        decoder_stack(target.model, "drafter 'eagle'")
        path = Path(self.file) if self.file is not None else default_eagle_path()
        net, cfg, ids = load_eagle(path)
        d, V = int(target.config.hidden_size), int(target.vocab_size)
        if cfg["hidden_size"] != d or cfg["vocab_size"] != V:
            raise InvalidInputError(
                f"eagle drafter {path} was trained for another target (hidden size {cfg['hidden_size']}, vocabulary"
                f" {cfg['vocab_size']}); this target has hidden size {d} and vocabulary {V}: train one for it with"
                " `python experiments/train_eagle.py`")
        self.net = net.to(device=target.device, dtype=target.dtype).requires_grad_(False)
        self.target = target
        self.head = EagleHead(target.model, ids if self.head_choice == "subset" else None)
        self._embed = target.model.get_input_embeddings()
        self._pack_on_panels(target, draft)
        return V

    def _pack_on_panels(self, target: Any, draft: Any) -> None:
        """Where the target's linears run on weight panels (mdv's fast path), the drafter's own linears (``fc``,
        the layer's, the subset head's rows) run on panels too: in ``panel_dtype``, or by default in the dtype
        of the draft model's panels (``models.draft_panel_dtype``; float32 without a draft on panels).  float16
        and int8 round the drafter's weights, so they change its law q, which is still the law its tokens are
        drawn from (every verifier stays exact).  A full head is the target's own ``lm_head``, already on the
        target's panels."""
        from mdv.models.default_pair import SubsetHead
        from mdv.models.panels import PanelPacks, panel_dtype_of

        self._panels = None  # the previous bind's packs go with its net
        if panel_dtype_of(target.model) is None:
            return
        if self.panel_dtype_choice is not None:
            dtype = getattr(torch, self.panel_dtype_choice)
        else:
            dtype = (panel_dtype_of(draft.model) if hasattr(draft, "model") else None) or torch.float32
        own = torch.nn.ModuleDict({"net": self.net})
        if isinstance(self.head.head, SubsetHead):
            own["head"] = self.head.head
        self._panels = PanelPacks(own, dtype=dtype).__enter__()  # left open: the modules are this drafter's own

    @property
    def panel_dtype(self) -> torch.dtype | None:
        """The weight dtype of the panels the drafter's own linears run on (None: their own weights)."""
        return None if self._panels is None else self._panels.dtype

    @property
    def max_context(self) -> int | None:
        return getattr(self.target, "max_context", None)

    # ------------------------------------------------------------------ state
    def _new_cache(self) -> Any:
        """The layer's session: the lean forward's layer loop (:class:`~mdv.models.lean.LeanLayerSession`: a
        preallocated cache, one C call per layer on panels) where it runs the layer, else transformers'."""
        from mdv.models.lean import LeanLayerSession, lean_layer_support

        assert self.net is not None
        if lean_layer_support(self.net.decoder) is None:
            return LeanLayerSession(self.net.decoder)
        return TransformersLayerSession(self.net)

    def prefill(self, prompt: Sequence[int]) -> None:
        assert self.net is not None, "bind() before prefill()"
        self._cache = self._new_cache()
        self._clen = 0
        self._feats = torch.zeros(0, self.net.hidden_size, dtype=self.target.dtype, device=self.target.device)

    @property
    def committed_features(self) -> Tensor:
        """The target's features [N, d] the drafter holds, positions 0..N-1 of the committed sequence."""
        assert self._feats is not None, "prefill() first"
        return self._feats

    @property
    def cached_positions(self) -> int:
        """Positions in the drafter's own cache (each computed from the target's features only)."""
        return int(self._cache.length) if self._cache is not None else 0

    def observe_target(self, features: Tensor) -> None:
        assert self._feats is not None
        self._feats = torch.cat([self._feats, features.to(self._feats.dtype)], 0)

    def _features_upto(self, seq: Sequence[int], need: int) -> Tensor:
        """The target's features of positions 0..need-1; the missing ones from one full target pass."""
        assert self._feats is not None
        have = self._feats.shape[0]
        if have < need:
            full = target_features(self.target.model, seq[:need])  # [need, d]
            self._feats = torch.cat([self._feats, full[have:need].to(self._feats.dtype)], 0)
        return self._feats[:need]

    def layer_step(self, prev: Tensor, tokens: Tensor, start: int) -> Tensor:
        """The layer over ``tokens`` [R, m] at positions start..start+m-1 with features ``prev`` [R, m, d],
        through the cache; -> ĥ [R, m, d]."""
        R, m = tokens.shape
        pos = torch.arange(start, start + m, dtype=torch.long, device=tokens.device).expand(R, m)
        return self._cache.run(self.net.fuse(prev, self._embed(tokens)), pos)

    def _law(self, h: Tensor, sampling: SamplingConfig, device: torch.device) -> Tensor:
        return sampling.probs(self.head(h)).to(device)  # [R, V] float64

    def propose(self, seq: Sequence[int], K: int, L: int, sampling: SamplingConfig,
                generator: torch.Generator, shorter_ok: bool = False) -> Draft:
        assert self._cache is not None, "prefill() starts a sequence before propose()"
        n = len(seq)
        gdev, dev = generator.device, self.target.device
        feats = self._features_upto(seq, n - 1)  # [n-1, d]
        j0 = self._clen
        zero = feats.new_zeros(1, feats.shape[1])
        prev = torch.cat([zero, feats], 0)[j0:n]  # f_{j-1} for j = j0..n-1, [m, d]
        toks = torch.tensor([list(map(int, seq[j0:n]))], dtype=torch.long, device=dev)  # [1, m]
        h = self.layer_step(prev.unsqueeze(0), toks, j0)[:, -1]  # [1, d]: ĥ_{n-1}
        self._clen = n  # positions 0..n-1: computed from the target's features only
        if K > 1:
            self._cache.fork(K)
        h = h.expand(K, -1)
        q_i = self._law(h[:1], sampling, gdev).expand(K, -1)  # [K, V], the shared first law
        qs: list[Tensor] = []
        out: list[Tensor] = []
        for i in range(L):
            x = draw_rows(q_i, generator)  # [K]
            qs.append(q_i)
            out.append(x)
            if i < L - 1:  # drafted token i sits at position n + i; its feature is the row's own ĥ_{n+i-1}
                h = self.layer_step(h.unsqueeze(1), x.unsqueeze(1).to(dev), n + i)[:, -1]  # [K, d]
                q_i = self._law(h, sampling, gdev)
        self._n = n
        self._rows = K
        return Draft(torch.stack(out, 1), torch.stack(qs, 1), calls=L)

    def _keep(self, row: int) -> None:
        if self._rows > 1:
            self._cache.keep(row)
        self._rows = 1

    def commit(self, sel: int, tau: int) -> None:
        self._keep(sel)
        self._crop_cache(self._n)  # the drafted positions saw predicted features: recomputed next time

    def _crop_cache(self, length: int) -> None:
        if self._cache.length > length:
            self._cache.crop(length)
        self._clen = min(self._clen, length)

    def rewind(self, length: int) -> None:
        self._keep(0)
        self._crop_cache(min(self._clen, length))
        if self._feats is not None:
            self._feats = self._feats[:length]

    # ------------------------------------------------------------------ the slow law
    @torch.inference_mode()
    def reference_law(self, context: Sequence[int], sampling: SamplingConfig,
                      committed: int | None = None) -> Tensor:
        ctx = list(map(int, context))
        c = len(ctx) if committed is None else int(committed)
        d, dev = self.net.hidden_size, self.target.device
        feats = target_features(self.target.model, ctx[:c - 1]) if c > 1 else torch.zeros(0, d, device=dev)
        prev = torch.cat([torch.zeros(1, d, dtype=feats.dtype, device=dev), feats], 0)  # f_{j-1}, j = 0..c-1
        emb = self._embed(torch.tensor([ctx], dtype=torch.long, device=dev))  # [1, len, d]
        h = self.net(prev.unsqueeze(0), emb[:, :c])[0, -1]  # ĥ_{c-1}
        for j in range(c, len(ctx)):  # drafted positions: the previous feature is the drafter's own
            prev = torch.cat([prev, h.unsqueeze(0)], 0)
            h = self.net(prev.unsqueeze(0), emb[:, :j + 1])[0, -1]
        return sampling.probs(self.head(h.unsqueeze(0)))[0]
