"""Tensors on transparent huge pages, for weights that are streamed from memory at every pass.

A decode or verification pass reads every weight once; with 4 KiB pages a [49152 x 576] float32 head crosses
27,648 pages, each a TLB miss whose page walk stalls the stream, and the hardware prefetchers stop at every
page boundary.  On 2 MiB pages (Linux transparent huge pages, ``madvise(MADV_HUGEPAGE)``) the same head crosses
54.  Measured on this project's CI machine (Xeon, AVX-512, 1 thread, each call after a cache eviction, 4 KiB ->
2 MiB pages): the panel product on that head with the AVX2 kernel 10.0 -> 9.0 ms at 1 row, 10.4 -> 8.5 at 5,
17.5 -> 16.2 at 17; with the AVX-512 one (``kernels/panel_linear.c``) 15.0 -> 12.9 at 17 rows, 22.7 -> 19.7 at 33.
The bits are the same: only where the bytes live changes.

:func:`huge_page_empty` maps private anonymous memory aligned to 2 MiB and asks the kernel for huge pages; it
falls back to ``torch.empty`` where that cannot be asked (not Linux, no ``MADV_HUGEPAGE``, or smaller than one
huge page, where it would only waste memory).  Whether the kernel grants the pages is its choice
(``/sys/kernel/mm/transparent_hugepage/enabled``: ``always`` or ``madvise``; with ``never`` these are ordinary
pages and only the speed differs).
"""
from __future__ import annotations

import ctypes
import mmap
from typing import Sequence

import torch
from torch import Tensor

HUGE_PAGE = 2 << 20  # bytes: x86-64's transparent huge page


def huge_pages_possible() -> bool:
    """Whether this platform lets a process ask for transparent huge pages (Linux's ``MADV_HUGEPAGE``)."""
    return hasattr(mmap, "MADV_HUGEPAGE") and hasattr(mmap, "MAP_PRIVATE") and hasattr(mmap, "MAP_ANONYMOUS")


def transparent_huge_pages_mode() -> str:
    """The system's transparent-huge-page policy: "always" or "madvise" (a :func:`huge_page_empty` tensor gets
    huge pages when the kernel has free ones), "never", or "unavailable" (no such setting, e.g. not Linux)."""
    try:
        text = open("/sys/kernel/mm/transparent_hugepage/enabled").read()
    except OSError:
        return "unavailable"
    chosen = [word[1:-1] for word in text.split() if word.startswith("[") and word.endswith("]")]
    return chosen[0] if chosen else "unavailable"


def _nbytes(shape: Sequence[int], dtype: torch.dtype) -> int:
    numel = 1
    for size in shape:
        numel *= int(size)
    return numel * torch.empty((), dtype=dtype).element_size()


def huge_page_empty(shape: Sequence[int], dtype: torch.dtype) -> Tensor:
    """An uninitialised contiguous CPU tensor of ``shape`` and ``dtype`` whose memory starts on a 2 MiB
    boundary and is advised for transparent huge pages (module docstring); ``torch.empty`` when the platform
    cannot ask or the tensor is smaller than one huge page.  The tensor keeps its mapping alive; the mapping is
    released with the tensor's last reference."""
    nbytes = _nbytes(shape, dtype)
    if nbytes < HUGE_PAGE or not huge_pages_possible():
        return torch.empty(tuple(shape), dtype=dtype)
    area = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    offset = -ctypes.addressof(ctypes.c_char.from_buffer(area)) % HUGE_PAGE
    try:
        area.madvise(mmap.MADV_HUGEPAGE, 0, len(area))
    except OSError:  # a kernel built without transparent huge pages: ordinary pages, same bytes
        pass
    # frombuffer keeps the memoryview, and through it the mapping, alive as long as the tensor's storage
    return torch.frombuffer(memoryview(area)[offset:offset + nbytes], dtype=dtype).view(tuple(shape))


class HugePageArena:
    """One huge-page mapping (:func:`huge_page_empty`) handed out as consecutive tensors, each starting on a
    64-byte line: many weights share the mapping's huge pages, instead of one mapping (and one partly used
    last huge page) each, or 4 KiB pages for the weights smaller than a huge page."""

    ALIGN = 64  # bytes: a cache line, and a multiple of every dtype's size

    def __init__(self, nbytes: int, huge_pages: bool = True) -> None:
        self.nbytes = int(nbytes)
        # [nbytes] raw bytes; huge_pages=False: ordinary pages (to measure what the huge ones change)
        self._buf = huge_page_empty((self.nbytes,), torch.uint8) if huge_pages else torch.empty(self.nbytes, dtype=torch.uint8)
        self._used = 0

    @classmethod
    def bytes_for(cls, sizes: Sequence[int]) -> int:
        """The arena size that holds tensors of these byte sizes (each rounded up to :attr:`ALIGN`)."""
        return sum(-(-int(s) // cls.ALIGN) * cls.ALIGN for s in sizes)

    def take(self, shape: Sequence[int], dtype: torch.dtype) -> Tensor:
        """The next uninitialised contiguous tensor of ``shape`` and ``dtype`` in the arena."""
        nbytes = _nbytes(shape, dtype)
        if self._used + nbytes > self.nbytes:
            raise RuntimeError(f"HugePageArena: {nbytes} more bytes do not fit ({self._used} of {self.nbytes} used)")
        out = self._buf[self._used:self._used + nbytes].view(dtype).view(tuple(shape))
        self._used += self.bytes_for([nbytes])
        return out
