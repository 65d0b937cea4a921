"""mdv.models.hugepages: huge-page tensors are ordinary tensors that start on a 2 MiB boundary, hold what is
written to them for as long as they live, and an arena hands out aligned, disjoint tensors."""
from __future__ import annotations

import gc

import pytest
import torch

from mdv.models import hugepages
from mdv.models.hugepages import HUGE_PAGE, HugePageArena, huge_page_empty

needs_madvise = pytest.mark.skipif(not hugepages.huge_pages_possible(), reason="no MADV_HUGEPAGE on this platform")


@needs_madvise
def test_a_large_tensor_starts_on_a_huge_page_and_keeps_its_values() -> None:
    t = huge_page_empty((3, HUGE_PAGE // 4), torch.float32)  # 6 MiB
    assert t.shape == (3, HUGE_PAGE // 4) and t.dtype == torch.float32 and t.is_contiguous()
    assert t.data_ptr() % HUGE_PAGE == 0
    values = torch.arange(t.numel(), dtype=torch.float32).reshape(t.shape)
    t.copy_(values)
    del values
    gc.collect()  # the mapping lives as long as the tensor, not the function that made it
    assert torch.equal(t, torch.arange(t.numel(), dtype=torch.float32).reshape(t.shape))
    view = t[1:]
    del t
    gc.collect()
    assert float(view[0, 0]) == HUGE_PAGE // 4  # a view keeps the mapping too


def test_a_small_tensor_is_an_ordinary_one() -> None:
    t = huge_page_empty((10, 4), torch.float16)  # below one huge page: torch.empty
    assert t.shape == (10, 4) and t.dtype == torch.float16 and t.is_contiguous()
    src = torch.randn(10, 4).half()
    t.copy_(src)
    assert torch.equal(t, src)


@needs_madvise
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int8])
def test_a_huge_page_arena_holds_values_exactly(dtype: torch.dtype) -> None:
    src = (torch.randn(1024, 1024) * 50).to(dtype)  # 1-4 MiB
    arena = HugePageArena(HugePageArena.bytes_for([src.numel() * src.element_size()]))
    got = arena.take(src.shape, dtype)
    got.copy_(src)
    assert got.dtype == dtype and torch.equal(got, src)
    if arena.nbytes >= HUGE_PAGE:
        assert got.data_ptr() % HUGE_PAGE == 0  # the arena's first tensor starts its mapping


def test_an_arena_hands_out_aligned_disjoint_tensors_and_refuses_overflow() -> None:
    shapes = [((5, 3), torch.float32), ((7,), torch.float16), ((2, 2, 16), torch.int8), ((1,), torch.float64)]
    sizes = [torch.Size(s).numel() * torch.empty((), dtype=d).element_size() for s, d in shapes]
    assert HugePageArena.bytes_for(sizes) == 64 * 4  # each rounded up to one 64-byte line
    arena = HugePageArena(HugePageArena.bytes_for(sizes))
    got = [arena.take(s, d) for s, d in shapes]
    for t, (s, d) in zip(got, shapes):
        assert t.shape == s and t.dtype == d and t.is_contiguous() and t.data_ptr() % 64 == 0
    starts = [t.data_ptr() for t in got]
    assert starts == sorted(starts) and all(b - a == 64 for a, b in zip(starts, starts[1:]))
    for i, t in enumerate(got):
        t.fill_(i + 1)
    assert [float(t.double().mean()) for t in got] == [1.0, 2.0, 3.0, 4.0]  # no tensor overwrote another
    with pytest.raises(RuntimeError, match="do not fit"):
        arena.take((1,), torch.float32)


def test_the_transparent_huge_page_mode_is_one_of_the_kernels_words(tmp_path, monkeypatch) -> None:
    assert hugepages.transparent_huge_pages_mode() in ("always", "madvise", "never", "unavailable")
    import builtins

    real_open = builtins.open
    fake = tmp_path / "enabled"
    fake.write_text("always [madvise] never\n")
    monkeypatch.setattr(builtins, "open", lambda path, *a, **k: real_open(fake if "transparent_hugepage" in str(path) else path, *a, **k))
    assert hugepages.transparent_huge_pages_mode() == "madvise"
    fake.unlink()
    assert hugepages.transparent_huge_pages_mode() == "unavailable"
