"""The lean forward's C layers (mdv.models.lean_layer, kernels/lean_layer.c) against the torch loop they
replace (the reference) on the same panels: every session operation (rows, fork, keep, crop, a token tree,
cache growth), float32 and float16 panels, head sizes on the 8-wide path (16) and off it (12), and the
fallbacks (a stale weight, a model not on fused panels)."""
from __future__ import annotations

import pytest
import torch

import mdv.models.lean as lean_mod
from mdv.errors import InvalidInputError
from mdv.models import panels
from mdv.models.lean import LeanModel
from mdv.models.panels import PanelPacks, panel_kernel_status
from mdv.models.tree import build_tree

pytestmark = pytest.mark.skipif(not panel_kernel_status()[0], reason=panel_kernel_status()[1] or "available")

# two float32 computations of a 2-layer model (different summation orders, exp within 1 ulp); the tiny models'
# logits are scaled x30, so a few ulps of a logit move p by ~1e-6 (measured max 1.2e-6 over 240 tokens)
TOL = 5e-6


@pytest.fixture(scope="module", params=[48, 64], ids=["head_dim12", "head_dim16"])
def target(request):
    from mdv.models.tiny_random import build_tiny_random_pair

    return build_tiny_random_pair(vocab_size=96, seed=5, hidden_size=request.param, num_layers=2)[0]


def _torch_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lean_mod, "layer_plan", lambda *a: None)


def _run(lean: LeanModel, script) -> list[torch.Tensor]:
    s = lean.new_session()
    with torch.inference_mode():
        return [torch.softmax(out.double(), -1) for out in script(s)] + [torch.tensor([s.length, s.rows])]


def _session_script(s):
    gen = torch.Generator().manual_seed(0)
    s.prefill(torch.randint(0, 96, (30,), generator=gen).tolist())
    yield s.extend(torch.randint(0, 96, (1, 1), generator=gen))
    yield s.extend(torch.randint(0, 96, (1, 5), generator=gen))  # causal mask
    s.fork(3)
    yield s.extend(torch.randint(0, 96, (3, 1), generator=gen))  # rows
    yield s.extend(torch.randint(0, 96, (3, 2), generator=gen))
    s.keep(1)  # a strided row view of the cache
    s.crop(s.length - 2)
    yield s.extend(torch.randint(0, 96, (1, 3), generator=gen))
    drafts = torch.randint(0, 96, (3, 3), generator=gen)
    drafts[1, :2] = drafts[0, :2]
    tree = build_tree([7], drafts)
    yield s.extend_tree(tree)  # a tree mask
    s.keep_nodes(tree.path(1, 2))
    yield s.extend(torch.randint(0, 96, (1, 1), generator=gen))
    yield s.extend(torch.randint(0, 96, (1, 240), generator=gen))  # past the first capacity (256)
    yield s.extend(torch.randint(0, 96, (1, 1), generator=gen))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_c_layers_equal_the_torch_loop_on_every_session_operation(target, dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    lean = LeanModel.of(target)
    with PanelPacks(target.model, dtype=dtype):
        calls: list[int] = []
        real = panels.panel_linear
        monkeypatch.setattr(panels, "panel_linear", lambda x, *a: calls.append(1) or real(x, *a))
        fast = _run(lean, _session_script)
        assert len(calls) == 10  # only the head's product runs from Python: every layer ran in C
        _torch_loop(monkeypatch)
        ref = _run(lean, _session_script)
    assert len(fast) == len(ref)
    for a, b in zip(fast[:-1], ref[:-1]):
        assert a.shape == b.shape and (a - b).abs().max().item() < TOL
    assert torch.equal(fast[-1], ref[-1])  # same length and rows


def test_the_c_layers_write_the_cache_the_torch_loop_reads(target, monkeypatch: pytest.MonkeyPatch) -> None:
    """Prefill in C, continue on the torch loop: the C layers' keys and values are the torch loop's."""
    lean = LeanModel.of(target)
    prompt = list(range(3, 40))
    with PanelPacks(target.model), torch.inference_mode():
        s = lean.new_session()
        s.prefill(prompt)
        _torch_loop(monkeypatch)
        mixed = s.extend(torch.tensor([[5, 6]]))
        r = lean.new_session()
        r.prefill(prompt)
        ref = r.extend(torch.tensor([[5, 6]]))
    assert (torch.softmax(mixed.double(), -1) - torch.softmax(ref.double(), -1)).abs().max() < TOL


def test_a_stale_weight_leaves_the_c_layers_and_is_refused(target) -> None:
    lean = LeanModel.of(target)
    pp = PanelPacks(target.model)
    layer = target.model.model.layers[1]
    with pp, torch.no_grad():
        s = lean.new_session()
        s.prefill([1, 2, 3])
        assert s._c_plan is not None
        layer.mlp.up_proj.weight.mul_(1.0)  # an in-place update bumps the version: the panels are stale
        with pytest.raises(InvalidInputError, match="stale"):
            s.extend(torch.tensor([[4]]))
    pp.free()


def test_without_fused_panels_the_torch_loop_runs(target, monkeypatch: pytest.MonkeyPatch) -> None:
    lean = LeanModel.of(target)
    monkeypatch.setattr(panels, "SIBLING_GROUPS", ())  # no sibling groups: no fused streams to run in C
    monkeypatch.setattr(panels, "_sibling_groups", lambda model: [])
    with PanelPacks(target.model), torch.inference_mode():
        s = lean.new_session()
        s.prefill([1, 2, 3])
        assert s._c_plan is None
    s = lean.new_session()  # no panels at all
    with torch.inference_mode():
        s.prefill([1, 2, 3])
    assert s._c_plan is None
