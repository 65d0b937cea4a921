"""Hugging Face transformers causal LMs behind the LanguageModel protocol, with KV-cache sessions.

:class:`HFModel` wraps any loaded transformers causal LM (``HFModel(model, tokenizer=None)``) or loads
one (:meth:`HFModel.from_pretrained`: a hub id for users who have the hub, a local folder, or a GGUF
file through transformers' ``gguf_file``).  It offers

* ``next_logprobs(prefixes) -> [N, V]`` (float64 log-probabilities; full forward passes, no cache):
  what the exact oracle and the tests need;
* ``new_session() -> HFSession``: the engine's incremental view, one ``DynamicCache`` per sequence,
  with the operations of :class:`mdv.models.session.DecodeSession` mapped onto the cache API of
  transformers 5.x -- ``crop`` (rollback), ``batch_repeat_interleave`` (fork one prefix into K rows)
  and ``batch_select_indices`` (keep the selected row).  The prefix is never recomputed.  K drafts can
  instead be scored as one token tree in a single row (``extend_tree`` / ``keep_nodes``, a tree
  attention mask; :mod:`mdv.models.tree`) when the model's attention takes a custom 4-D mask (eager,
  sdpa) and every cache layer is a plain full-attention ``DynamicLayer``.
"""
from __future__ import annotations

import contextlib
import inspect
import os
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch
from torch import Tensor

from mdv.errors import InvalidInputError, MissingAssetError
from mdv.models.session import CacheSessionBase, check_tree_start
from mdv.models.tree import TokenTree

# Prefixes per forward pass in next_logprobs (grouped by length, so no padding is needed).
_ORACLE_CHUNK = 256
# Attention implementations that apply a custom 4-D attention mask (the tree mask); flash kernels do not.
_MASKABLE_ATTENTION = ("eager", "sdpa")


def default_device() -> torch.device:
    """CUDA when available, else CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _looks_like_path(name: str) -> bool:
    """True when ``name`` cannot be a hub id ("org/name" or "name") and must be a local path."""
    if name.startswith(("/", "./", "../", "~", ".\\")) or name.endswith(".gguf") or "\\" in name:
        return True
    return name.count("/") > 1


def _first_line(exc: BaseException, limit: int = 300) -> str:
    text = str(exc).strip()
    line = text.splitlines()[0].rstrip(" .") if text else type(exc).__name__
    return line if len(line) <= limit else line[:limit] + "..."


_DTYPES = ("float32", "float16", "bfloat16", "float64")


def _as_dtype(dtype: Any) -> torch.dtype:
    """A torch floating dtype from a dtype or its name ("float32", "bfloat16", ...)."""
    value = dtype
    if isinstance(value, str) and value.removeprefix("torch.") in _DTYPES:
        value = getattr(torch, value.removeprefix("torch."))
    if not isinstance(value, torch.dtype) or not value.is_floating_point:
        raise InvalidInputError(f"dtype must be a torch floating dtype or one of {', '.join(_DTYPES)}; got {dtype!r}")
    return value


def _as_device(device: Any) -> torch.device:
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise InvalidInputError(f"device must be 'cpu', 'cuda', 'cuda:<n>' or a torch.device; got {device!r}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise InvalidInputError(f"device {device!r} asked for but CUDA is not available here; use device='cpu'")
    return dev


def decoder_stack(model: Any, who: str) -> Any:
    """The decoder stack (with ``.layers`` and ``.norm``) of a transformers causal LM, or one
    :class:`~mdv.errors.InvalidInputError` naming ``who`` needs it."""
    dec = model.get_decoder() if hasattr(model, "get_decoder") else None
    if dec is None or not isinstance(getattr(dec, "layers", None), torch.nn.ModuleList) or not hasattr(dec, "norm"):
        raise InvalidInputError(
            f"{who} needs a transformers decoder with get_decoder().layers and .norm (Llama-like);"
            f" {type(model).__name__} has none")
    return dec


@contextlib.contextmanager
def last_layer_outputs(model: Any, who: str) -> Iterator[list[Tensor]]:
    """Inside the block, every forward pass of ``model`` appends its last decoder layer's output
    [R, n, d] (the final norm's input, at every position) to the list it yields: only that layer is
    kept, through a hook on the norm, not ``output_hidden_states``."""
    got: list[Tensor] = []
    hook = decoder_stack(model, who).norm.register_forward_pre_hook(lambda _module, args: got.append(args[0]))
    try:
        yield got
    finally:
        hook.remove()


class HFModel:
    """A transformers causal LM as a :class:`~mdv.models.base.LanguageModel` with KV-cache sessions.

    Attributes: ``model`` (the ``PreTrainedModel``, in eval mode), ``tokenizer`` (or None),
    ``vocab_size`` (the width of the logits), ``device``, ``dtype``, ``eos_token_id`` (the tokenizer's
    end-of-sequence id, None without a tokenizer), ``max_context`` (``max_position_embeddings`` or None).
    """

    def __init__(self, model: Any, tokenizer: Any = None, name: str | None = None):
        if not isinstance(model, torch.nn.Module) or not hasattr(model, "config"):
            raise InvalidInputError(
                f"HFModel wraps a loaded transformers causal LM (a PreTrainedModel); got {type(model).__name__}."
                " To load one by name or path use HFModel.from_pretrained(...)")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name or getattr(model.config, "_name_or_path", None) or type(model).__name__
        cfg = model.config.get_text_config(decoder=True) if hasattr(model.config, "get_text_config") else model.config
        self.config = cfg
        head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        weight = getattr(head, "weight", None)
        self.vocab_size: int = int(weight.shape[0]) if weight is not None else int(cfg.vocab_size)
        ctx = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None)
        self.max_context: int | None = int(ctx) if ctx else None
        eos = getattr(tokenizer, "eos_token_id", None) if tokenizer is not None else None
        self.eos_token_id: int | None = int(eos) if isinstance(eos, int) else None
        params = inspect.signature(model.forward).parameters
        # transformers >= 5 calls the cache argument `cache`; 4.x called it `past_key_values`.
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._has_logits_to_keep = "logits_to_keep" in params

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_pretrained(cls, name_or_path: str | os.PathLike[str], gguf_file: str | None = None,
                        dtype: torch.dtype = torch.float32, device: torch.device | str | None = None,
                        load_tokenizer: bool = True, **kwargs: Any) -> "HFModel":
        """Load a causal LM (and its tokenizer) from a hub id, a local folder or a GGUF file.

        ``name_or_path`` may be a folder with ``config.json`` and weights, a folder plus ``gguf_file``
        (a file name inside it, or an absolute path), a path to a ``.gguf`` file, or a hub id (needs
        the hub).  GGUF weights are dequantised to ``dtype`` (float32 recommended on CPU).  ``device``
        defaults to CUDA when available, else CPU.  A missing file or folder, or an unreachable hub
        id, raises :class:`~mdv.errors.MissingAssetError` with a short message.
        """
        from transformers import AutoModelForCausalLM, AutoTokenizer

        dtype = _as_dtype(dtype)
        dev = _as_device(device) if device is not None else default_device()
        if not isinstance(name_or_path, (str, os.PathLike)) or not os.fspath(name_or_path):
            raise InvalidInputError(f"name_or_path must be a hub id, a model folder or a .gguf path; got {name_or_path!r}")
        name = os.fspath(name_or_path)
        path = Path(name).expanduser()
        if gguf_file is None and path.suffix == ".gguf":
            path, gguf_file = path.parent, path.name
        if gguf_file is not None:
            gpath = Path(gguf_file).expanduser()
            if not gpath.is_absolute():
                gpath = path / gpath
            if not gpath.is_file():
                raise MissingAssetError(
                    f"GGUF file not found: {gpath}. Fetch the model first (see `python -m mdv.assets list`)"
                    " or pass the path of an existing .gguf file")
            source, gguf_name = str(gpath.parent), gpath.name
        elif path.exists():
            if not path.is_dir() or not (path / "config.json").is_file():
                raise MissingAssetError(
                    f"{path} is not a model folder (no config.json); pass a folder written by"
                    " save_pretrained(), a .gguf file, or a hub id")
            source, gguf_name = str(path), None
        elif _looks_like_path(name):
            raise MissingAssetError(f"model path not found: {path}")
        else:
            source, gguf_name = name, None  # a hub id

        extra: dict[str, Any] = dict(kwargs)
        if gguf_name is not None:
            extra["gguf_file"] = gguf_name
        local = Path(source).exists()
        try:
            model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, **extra)
        except OSError as exc:  # missing weights, unreachable hub, unknown repo
            hint = ("; the Hugging Face hub is unreachable or disabled (HF_HUB_OFFLINE=1): use a local"
                    " folder or GGUF file" if not local else "")
            raise MissingAssetError(f"could not load model {name!r}: {_first_line(exc)}{hint}") from None
        except Exception as exc:  # a truncated / garbage GGUF or safetensors file, an unknown architecture
            what = f"GGUF file {Path(source) / gguf_name}" if gguf_name is not None else f"model {name!r}"
            raise MissingAssetError(
                f"could not load {what}: {type(exc).__name__}: {_first_line(exc)}; the file is corrupt, truncated"
                " or not a supported causal LM: fetch it again (`python -m mdv.assets fetch <name>` for a pinned"
                " asset) or save it again with save_pretrained()") from None
        tokenizer = None
        if load_tokenizer:
            tok_kwargs = {"gguf_file": gguf_name} if gguf_name is not None else {}
            try:
                tokenizer = AutoTokenizer.from_pretrained(source, **tok_kwargs)
            except (OSError, ValueError, TypeError, KeyError):
                tokenizer = None  # weights without a tokenizer are still usable on token ids
        model.to(dev)
        return cls(model, tokenizer, name=name)

    # ------------------------------------------------------------------ properties
    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def same_vocabulary(self, other: Any) -> bool:
        """True when ``other``'s tokenizer maps the same strings to the same ids.

        Only what can be compared is: when either model has no tokenizer, or a tokenizer cannot list its
        vocabulary (``get_vocab`` absent or unimplemented), the ids cannot be checked and the pair is
        accepted on its equal vocabulary size alone (which :func:`mdv.drafters.model.check_pair` checks first)."""
        a, b = self.tokenizer, getattr(other, "tokenizer", None)
        if a is None or b is None or a is b:
            return True
        try:
            va, vb = a.get_vocab(), b.get_vocab()
        except (AttributeError, NotImplementedError):  # a tokenizer that cannot list its vocabulary
            return True
        return va == vb

    # ------------------------------------------------------------------ forward passes
    @torch.no_grad()
    def forward(self, input_ids: Tensor, cache: Any = None, position_ids: Tensor | None = None,
                last_only: bool = False, attention_mask: Tensor | None = None,
                features: list[Tensor] | None = None) -> Tensor:
        """One forward pass.  input_ids: [R, n] -> logits [R, n, V] (or [R, 1, V] with ``last_only``).
        attention_mask: None (causal) or a 4-D [R, 1, n, cached + n] mask, passed to the model as is.
        features: a list that receives the last decoder layer's output [R, n, d] (at every position, even
        with ``last_only``; :func:`last_layer_outputs`)."""
        if features is not None:
            with last_layer_outputs(self.model, "recording the target's features") as got:
                logits = self.forward(input_ids, cache, position_ids, last_only, attention_mask)
            features.extend(got)
            return logits
        dev = self.device
        kwargs: dict[str, Any] = {"input_ids": input_ids.to(dev)}
        if position_ids is not None:
            kwargs["position_ids"] = position_ids.to(dev)
        if attention_mask is not None:
            kwargs["attention_mask"] = attention_mask.to(dev)
        if cache is not None:
            kwargs[self._cache_kw] = cache
            kwargs["use_cache"] = True
        else:
            kwargs["use_cache"] = False
        if last_only and self._has_logits_to_keep:
            kwargs["logits_to_keep"] = 1
        logits = self.model(**kwargs).logits
        return logits[:, -1:] if last_only else logits

    @torch.inference_mode()
    def next_logprobs(self, prefixes: Sequence[Sequence[int]]) -> Tensor:
        """[N, V] float64 next-token log-probabilities after each prefix (full forward passes, grouped by
        length; every prefix needs at least one token)."""
        out = torch.empty(len(prefixes), self.vocab_size, dtype=torch.float64)
        groups: dict[int, list[int]] = {}
        for i, pre in enumerate(prefixes):
            if len(pre) == 0:
                raise InvalidInputError(
                    "HFModel.next_logprobs needs non-empty prefixes (a causal LM conditions on at least one"
                    " token; start the prompt with the tokenizer's BOS token)")
            groups.setdefault(len(pre), []).append(i)
        for idx in groups.values():
            for s in range(0, len(idx), _ORACLE_CHUNK):
                chunk = idx[s:s + _ORACLE_CHUNK]
                ids = torch.tensor([list(map(int, prefixes[i])) for i in chunk], dtype=torch.long)
                self._check_ids(ids)
                logits = self.forward(ids, last_only=True)[:, -1]  # [n, V]
                out[chunk] = torch.log_softmax(logits.to(torch.float64), -1).cpu()
        return out

    def _check_ids(self, ids: Tensor) -> None:
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.vocab_size):
            raise InvalidInputError(
                f"token ids must lie in [0, vocab_size={self.vocab_size}); got [{int(ids.min())}, {int(ids.max())}]")

    # ------------------------------------------------------------------ sessions
    def new_session(self) -> "HFSession":
        """A fresh KV-cache session (one row, nothing processed)."""
        return HFSession(self)

    def __repr__(self) -> str:
        return (f"HFModel(name={self.name!r}, vocab_size={self.vocab_size}, device={self.device},"
                f" dtype={self.dtype})")


class HFSession(CacheSessionBase):
    """One sequence's KV cache for an :class:`HFModel` (a :class:`~mdv.models.session.DecodeSession`).

    All rows always hold the same number of tokens (``length``), so no padding or attention mask is
    needed: position ids are ``length .. length + n - 1`` in every row.  A token tree (``extend_tree``)
    is appended to the single row with a tree attention mask and position ids ``length + depth``;
    ``keep_nodes`` moves the kept path's keys and values next to the prefix and drops the rest.
    """

    def __init__(self, hf: HFModel):
        from transformers import DynamicCache

        self.hf = hf
        try:
            self.cache = DynamicCache(config=hf.model.config)
        except TypeError:  # transformers 4.x
            self.cache = DynamicCache()
        if hasattr(self.cache, "activate_past_recording"):  # sliding-window layers stay croppable
            self.cache.activate_past_recording()
        self._rows = 1
        self._length = 0
        self._device = hf.device
        self._tree: TokenTree | None = None  # scored by extend_tree (in the cache after `length`)
        #: when True, every pass keeps the last decoder layer's output of its tokens in ``last_features``
        #: ([R, n, d]; a tree pass: [1, nodes, d]) for drafters that read the target's features
        self.record_features = False
        self.last_features: Tensor | None = None
        attn = getattr(hf.model.config, "_attn_implementation", None) or "eager"
        layers = getattr(self.cache, "layers", None)
        try:
            from transformers.cache_utils import DynamicLayer
        except ImportError:  # transformers 4.x caches: no per-layer objects to rearrange
            DynamicLayer = None
        self.supports_tree: bool = (attn in _MASKABLE_ATTENTION and DynamicLayer is not None and bool(layers)
                                    and all(type(layer) is DynamicLayer for layer in layers))

    def _run(self, tokens: Tensor, last_only: bool) -> Tensor:
        R, n = tokens.shape
        pos = torch.arange(self._length, self._length + n, dtype=torch.long).expand(R, n)
        feats: list[Tensor] | None = [] if self.record_features else None
        logits = self.hf.forward(tokens.long(), cache=self.cache, position_ids=pos, last_only=last_only,
                                 features=feats)
        self.last_features = feats[-1] if feats else None
        self._length += n
        if getattr(self.cache, "is_croppable", True) is False:
            raise InvalidInputError(
                f"{self.hf.name}: its cache cannot be rolled back (recurrent or linear-attention layers);"
                " speculative decoding needs a model with a croppable KV cache")
        return logits

    def prefill(self, tokens: Sequence[int]) -> None:
        """Process a prompt in the single row (no scores returned)."""
        ids = self._prompt_ids(tokens)
        if ids is not None:
            self._run(ids, last_only=True)

    def extend(self, tokens: Tensor) -> Tensor:
        """tokens: [R, n] -> logits [R, n, V] after each new token (the model's dtype and device)."""
        self._check_extend(tokens)
        return self._run(tokens, last_only=False)

    def fork(self, k: int) -> None:
        """One row -> k identical rows (``DynamicCache.batch_repeat_interleave``)."""
        self._check_fork(k)
        if k > 1 and self._length > 0:
            self.cache.batch_repeat_interleave(k)
        self._rows = k

    def keep(self, row: int) -> None:
        """Keep one row (``DynamicCache.batch_select_indices``)."""
        self._check_keep(row)
        if self._rows > 1 and self._length > 0:
            self.cache.batch_select_indices(torch.tensor([row], device=self.device))
        self._rows = 1

    def crop(self, length: int) -> None:
        """Forget every token past ``length`` (``DynamicCache.crop`` with a negative count); a pending
        token tree is dropped."""
        self._check_crop(length)
        remove = self._length - length
        if self._tree is not None:
            remove += self._tree.size
            self._tree = None
        if length == 0 and remove > 0:  # an empty cache: start afresh, keeping the row count
            rows = self._rows
            self.__init__(self.hf)
            self._rows = rows
            return
        if remove > 0:
            self.cache.crop(-remove)
        self._length = length

    def extend_tree(self, tree: TokenTree) -> Tensor:
        """Score the nodes of ``tree`` in the single row.  -> logits [n, V] (the model's dtype and device).

        Each node attends to the cached prefix, its ancestors and itself, at position ``length + depth``,
        so its logits equal those of a plain row over its root path.  The nodes stay in the cache until
        :meth:`keep_nodes` (or :meth:`crop`)."""
        if not self.supports_tree:
            raise InvalidInputError(
                f"{self.hf.name}: token trees need an attention that takes a custom mask (eager or sdpa) and a"
                " plain full-attention KV cache; score the drafts as rows (target_pass='rows')")
        check_tree_start(self._rows, self._tree)
        ids = torch.tensor([tree.ids], dtype=torch.long)  # [1, n]
        self.hf._check_ids(ids)
        past = self._length
        pos = (past + torch.tensor(tree.depth, dtype=torch.long)).unsqueeze(0)  # [1, n]
        allowed = tree.attention_mask(past, self._device)  # [1, 1, n, past + n] bool
        # an additive mask (0 = attend, dtype min = masked): eager attention adds the 4-D mask it is given to
        # the scores as is, so a boolean mask would be read as +1 / +0; sdpa takes either form
        dtype = self.hf.dtype
        mask = torch.zeros(allowed.shape, dtype=dtype, device=self._device).masked_fill_(
            ~allowed, torch.finfo(dtype).min)
        feats: list[Tensor] | None = [] if self.record_features else None
        logits = self.hf.forward(ids, cache=self.cache, position_ids=pos, attention_mask=mask,
                                 features=feats)[0]  # [n, V]
        self.last_features = feats[-1] if feats else None
        self._tree = tree
        return logits

    def keep_nodes(self, nodes: Sequence[int]) -> None:
        """Keep the cached prefix plus the tree nodes ``nodes`` (a path from the root), in that order."""
        if self._tree is None:
            raise InvalidInputError("keep_nodes() needs a tree scored by extend_tree() first")
        tree = self._tree
        nodes = tree.check_path(nodes)
        past, keep = self._length, len(nodes)
        if nodes != list(range(keep)):  # move the kept path right after the prefix (tiny copies)
            idx = torch.tensor(nodes, dtype=torch.long, device=self._device) + past
            with torch.inference_mode():
                for layer in self.cache.layers:
                    if getattr(layer, "is_initialized", True):
                        for kv in (layer.keys, layer.values):  # [R, H, S, D]
                            kv[..., past:past + keep, :] = kv.index_select(-2, idx)
        if tree.size > keep:
            self.cache.crop(-(tree.size - keep))
        self._length = past + keep
        self._tree = None
