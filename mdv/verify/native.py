"""The verifiers' per-prefix loops over the vocabulary in C (``kernels/verify_loops.c``), with torch, numpy
or Python floats as the reference of each.

At V = 49,152 some per-prefix work is a loop, not tensor algebra, and costs far more in eager torch than
its arithmetic: K-SEQ's rho* (a bisection whose steps each sum over the entries still in the bracket:
~2.3 ms a row in torch and Python, ~0.1 ms here), and for ``select_gbv``'s selected-draft law the stable
sort of the ratios, K-SEQ's prefix sums and rho* off them, ``lex``'s below-mass and ``fill``'s Jacobi
sweeps (~20 elementwise torch operations a sweep, 4 sweeps per survivor count), and the closed-form
marginals with their factors (~10-20 eager torch operations over [N, V] per rule and survivor count, ~20-40
us each at V = 49k; here one or two passes, adding ``pi(m) * marginal`` straight into the rule's row).  Each
C function does one row at a time, the same operations in the same order as its reference:

=========================  ==================================================  ==========================
C (this module)            reference                                           bits
=========================  ==================================================  ==========================
:func:`kseq_rho_active`    :func:`mdv.verify.spectr._bisect_active_set`        its sums' rounding
:func:`rank_order`         :func:`mdv.verify.selection.fill_order_torch`       the same permutation
:func:`lex_below`          :func:`mdv.verify.mpbv.below_mass` (c)              equal
:func:`sorted_masses`      :class:`mdv.verify.selection.SortedMasses` (numpy)  equal (p_zero: 1e-15)
:func:`kseq_rho`           :meth:`mdv.verify.selection.SortedMasses.row_rho`   equal
:func:`fill_marks`         :func:`mdv.verify.selection.fill_marks_torch`       see below
:func:`fill_law`           :func:`mdv.verify.selection.fill_factors` of those  equal (below: 1e-15)
:func:`fill_law` (acc)     ``acc + pi(m) * selection.fill_marginal``           equal
:func:`lex_marginal_add`   ``acc + pi(m) * selection.lex_marginal``            equal
:func:`kseq_factors`       :func:`mdv.verify.selection.kseq_factors_torch`     sums: 1e-15, else equal
:func:`kseq_marginal_add`  ``acc + pi(m) * selection.kseq_marginal``           its sum's rounding (1e-15)
:func:`overlap`            ``torch.minimum(target, marginal).sum(-1)``         its sum's rounding (1e-15)
:func:`ceiling`            ``overlap(target, selection.reach_mass(q, pi))``     its sum's rounding (1e-15)
:func:`support`            ``selection.support_columns`` in torch              p_zero: its sum's rounding
:func:`node_rule`          ``selection._score_prefix_stepwise``                equal (these, in its order)
=========================  ==================================================  ==========================

Where the reference sums over V in torch (whose reductions are not sequential, and round one row alone
differently from a batch of rows when several threads run), C sums left to right in long double, so a row
gets the same bits alone or in a batch; the choice's scores (:func:`overlap`) depend on that.

``fill``'s sweeps equal a scalar transcription bit for bit (tests/test_verify_native.py: the C loop stops
early where a sweep would repeat the last one, which gives the same bits as running them all); against the torch
sweeps they differ where torch's vectorised sqrt and pow round differently, and the sweeps carry those
last bits through their cumulative sums (1e-13 at V = 8, 1e-9 at V = 300, 1e-4 at V = 49,152: the
recursion is that sensitive; the law is computed from the thetas actually used, so either is exact).

Which path runs depends only on the machine (the library built or not) and the rows' device and dtype,
never on the batch, so every computation of one prefix within a process takes the same path and gets the
same law.  The library is portable C (no CPU flags), compiled on first use like the panel kernel
(:mod:`mdv._cbuild`); without a C compiler, or if the build fails, the reference code runs: the same
rules, only slower.  ``MDV_NATIVE_LOOPS=0`` forces the references (for comparisons).
"""
from __future__ import annotations

import ctypes
import functools
import os
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from mdv._cbuild import CompileError, build_library, c_compiler

_SOURCES = (Path(__file__).with_name("kernels") / "verify_loops.c",)
# no-math-errno and no-trapping-math let the sweeps' selects and roots vectorise; no -ffast-math, no FMA: every
# operation stays one correctly rounded IEEE operation, so vector and scalar code give the same bits
_FLAGS = ("-O3", "-fno-math-errno", "-fno-trapping-math", "-shared", "-fPIC")
_c_long, _c_int, _c_double, _ptr = ctypes.c_long, ctypes.c_int, ctypes.c_double, ctypes.c_void_p


@functools.lru_cache(maxsize=1)
def loops_library() -> ctypes.CDLL | None:
    """The compiled library, or None where it cannot be built (no compiler, a failing one, or
    ``MDV_NATIVE_LOOPS=0``): the callers then run the references."""
    if os.environ.get("MDV_NATIVE_LOOPS", "1") == "0":
        return None
    cc = c_compiler()
    if cc is None:
        return None
    try:
        lib = ctypes.CDLL(str(build_library("mdv_verify_loops", _SOURCES, _FLAGS, cc)))
    except (CompileError, OSError, TimeoutError):
        return None
    lib.kseq_rho_active.argtypes = [_c_long, _ptr, _ptr, _c_double, _c_int, _ptr]
    lib.kseq_rho_active.restype = _c_double
    lib.sel_rank_order.argtypes = [_c_long, _c_long, _ptr, _ptr, _ptr, _ptr, _ptr, _ptr]
    lib.sel_rank_order.restype = None
    lib.sel_fill_marks.argtypes = [_c_long, _c_long, _ptr, _ptr, _ptr, _c_int, _c_int, _c_double, _c_double, _ptr, _ptr]
    lib.sel_fill_marks.restype = None
    lib.sel_lex_below.argtypes = [_c_long, _c_long, _ptr, _ptr, _ptr, _ptr]
    lib.sel_lex_below.restype = None
    lib.sel_sorted_masses.argtypes = [_c_long, _c_long] + [_ptr] * 9
    lib.sel_sorted_masses.restype = None
    lib.sel_kseq_rho.argtypes = [_c_long, _c_long, _c_int, _c_int] + [_ptr] * 7
    lib.sel_kseq_rho.restype = None
    lib.sel_lex_marginal.argtypes = [_c_long, _c_long, _c_int] + [_ptr] * 4
    lib.sel_lex_marginal.restype = None
    lib.sel_kseq_factors.argtypes = [_c_long, _c_long, _c_int, _c_double] + [_ptr] * 10
    lib.sel_kseq_factors.restype = None
    lib.sel_kseq_marginal.argtypes = [_c_long, _c_long, _c_int] + [_ptr] * 7
    lib.sel_kseq_marginal.restype = None
    lib.sel_fill_law.argtypes = [_c_long, _c_long, _c_int, _c_int, _c_double, _c_double] + [_ptr] * 12
    lib.sel_fill_law.restype = None
    lib.sel_overlap.argtypes = [_c_long, _c_long] + [_ptr] * 3
    lib.sel_overlap.restype = None
    lib.sel_ceiling.argtypes = [_c_long, _c_long, _c_int] + [_ptr] * 4
    lib.sel_ceiling.restype = None
    lib.sel_support.argtypes = [_c_long, _ptr, _ptr, _c_long, _ptr, _ptr, _ptr]
    lib.sel_support.restype = _c_long
    lib.sel_node_rule.argtypes = ([_c_int, _c_long, _c_int, _ptr, _ptr, _c_double, _ptr, _c_int, _c_double, _c_int,
                                   _c_double] + [_ptr] * 13)
    lib.sel_node_rule.restype = _c_double
    return lib


def native_rows(*rows: Tensor) -> ctypes.CDLL | None:
    """The library when it is built and every tensor is a CPU float64 [N, V] block, else None."""
    if not all(t.device.type == "cpu" and t.dtype == torch.float64 and t.dim() == 2 for t in rows):
        return None
    return loops_library()


def kseq_rho_active(lib: ctypes.CDLL, p: Tensor, q: Tensor, k: float, iters: int) -> float:
    """K-SEQ's rho* with k > 1 drafts for one row: 1 where g(1) >= 0, else the active-set bisection.
    p, q: CPU float64 [V]."""
    p, q = p.contiguous(), q.contiguous()
    work = torch.empty(3 * q.shape[-1], dtype=torch.float64)
    return float(lib.kseq_rho_active(q.shape[-1], p.data_ptr(), q.data_ptr(), float(k), iters, work.data_ptr()))


def rank_order(lib: ctypes.CDLL, p: Tensor, q: Tensor) -> Tensor:
    """``fill``'s rank order (best first) by a stable radix sort.  p, q: CPU float64 [N, V] -> int64 [N, V]."""
    p, q = p.contiguous(), q.contiguous()
    N, V = q.shape
    order = torch.empty((N, V), dtype=torch.int64)
    keys, keys2 = torch.empty(V, dtype=torch.int64), torch.empty(V, dtype=torch.int64)  # uint64 bits in C
    ids = torch.empty(V, dtype=torch.int64)  # two uint32 id buffers in C
    lib.sel_rank_order(N, V, p.data_ptr(), q.data_ptr(), order.data_ptr(), keys.data_ptr(), keys2.data_ptr(),
                       ids.data_ptr())
    return order


def fill_marks(lib: ctypes.CDLL, q: Tensor, target: Tensor, order: Tensor, m: int, sweeps: int, eps: float,
               line: float) -> Tensor:
    """``fill``'s marks theta in token space.  q, target: CPU float64 [N, V]; order: [N, V] -> [N, V]."""
    q, target, order = q.contiguous(), target.contiguous(), order.to(torch.int64).contiguous()
    N, V = q.shape
    theta = torch.empty((N, V), dtype=torch.float64)
    work = torch.empty(4 * V, dtype=torch.float64)
    lib.sel_fill_marks(N, V, q.data_ptr(), target.data_ptr(), order.data_ptr(), m, sweeps, eps, line,
                       theta.data_ptr(), work.data_ptr())
    return theta


def lex_below(lib: ctypes.CDLL, p: Tensor, q: Tensor, order: Tensor) -> Tensor:
    """``lex``'s c(x) off ``fill``'s order.  p, q: CPU float64 [N, V]; order: [N, V] -> [N, V]."""
    p, q, order = p.contiguous(), q.contiguous(), order.to(torch.int64).contiguous()
    out = torch.empty_like(q)
    lib.sel_lex_below(q.shape[0], q.shape[1], p.data_ptr(), q.data_ptr(), order.data_ptr(), out.data_ptr())
    return out


def sorted_masses(lib: ctypes.CDLL, p: Tensor, q: Tensor, order: Tensor) -> tuple[np.ndarray, ...]:
    """(ratio [N, V], p_below, p_above, q_below, q_above [N, V+1], p_zero [N]) of
    :class:`~mdv.verify.selection.SortedMasses`, as numpy arrays.  p, q: CPU float64 [N, V]; order: [N, V]."""
    p, q, order = p.contiguous(), q.contiguous(), order.to(torch.int64).contiguous()
    N, V = q.shape
    ratio = np.empty((N, V))
    sums = [np.empty((N, V + 1)) for _ in range(4)]
    p_zero = np.empty(N)
    lib.sel_sorted_masses(N, V, p.data_ptr(), q.data_ptr(), order.data_ptr(), ratio.ctypes.data,
                          *(a.ctypes.data for a in sums), p_zero.ctypes.data)
    return (ratio, *sums, p_zero)


def kseq_rho(lib: ctypes.CDLL, masses: tuple[np.ndarray, ...], m: int, iters: int) -> np.ndarray:
    """K-SEQ's rho* with m drafts off :func:`sorted_masses`'s arrays (ratio, p_below, p_above, q_below,
    q_above, p_zero; float64, C-contiguous).  -> [N]"""
    ratio, *sums, p_zero = (np.ascontiguousarray(a, dtype=np.float64) for a in masses)
    N, V = ratio.shape
    rho = np.empty(N)
    lib.sel_kseq_rho(N, V, m, iters, ratio.ctypes.data, *(a.ctypes.data for a in sums), p_zero.ctypes.data,
                     rho.ctypes.data)
    return rho


def _rows_of(*rows: Tensor) -> list[Tensor]:
    """The tensors as C-contiguous float64 blocks (the pointers handed to C)."""
    return [t.to(torch.float64).contiguous() for t in rows]


def _accumulator(acc: Tensor) -> int:
    """acc's data pointer, once it is known that C may add into it in place (a contiguous CPU float64 block)."""
    if not (acc.is_contiguous() and acc.dtype == torch.float64 and acc.device.type == "cpu"):
        raise ValueError("acc must be a contiguous CPU float64 tensor: the C passes add into it in place")
    return acc.data_ptr()


def lex_marginal_add(lib: ctypes.CDLL, q: Tensor, c: Tensor, m: int, weight: Tensor, acc: Tensor) -> None:
    """``acc += weight * lex's marginal`` with m >= 2 survivors, in place.  q, c (lex's below-mass): CPU float64
    [N, V]; weight: [N]; acc: contiguous CPU float64 [N, V]."""
    q, c, weight = _rows_of(q, c, weight)
    lib.sel_lex_marginal(q.shape[0], q.shape[1], m, q.data_ptr(), c.data_ptr(), weight.data_ptr(), _accumulator(acc))


def kseq_factors(lib: ctypes.CDLL, p: Tensor, q: Tensor, rho: Tensor, m: int,
                 tol: float) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, list[Tensor]]:
    """K-SEQ's (beta, mu, nu, o, res [N, V], r [N, 1], moments: m tensors [N, 1]) with m >= 2 survivors at rho
    [N] (:class:`~mdv.verify.selection.KseqFactors`' fields); tol: the residual's fallback threshold
    (:data:`mdv.verify._math.TOL`).  p, q: CPU float64 [N, V]."""
    p, q, rho = _rows_of(p, q, rho)
    N, V = q.shape
    beta, mu, nu, o, res = (torch.empty((N, V), dtype=torch.float64) for _ in range(5))
    r, moments = torch.empty((N, 1), dtype=torch.float64), torch.empty((N, m), dtype=torch.float64)
    lib.sel_kseq_factors(N, V, m, tol, p.data_ptr(), q.data_ptr(), rho.data_ptr(), *(t.data_ptr() for t in (
        beta, mu, nu, o, res, r, moments)))
    return beta, mu, nu, o, res, r, list(moments.split(1, -1))


def kseq_marginal_add(lib: ctypes.CDLL, mu: Tensor, nu: Tensor, o: Tensor, res: Tensor, r: Tensor, m: int,
                      weight: Tensor, acc: Tensor) -> None:
    """``acc += weight * K-SEQ's marginal`` with m >= 2 survivors from its factors, in place.  mu, nu, o, res:
    CPU float64 [N, V]; r: [N, 1]; weight: [N]; acc: contiguous CPU float64 [N, V]."""
    mu, nu, o, res, r, weight = _rows_of(mu, nu, o, res, r, weight)
    lib.sel_kseq_marginal(mu.shape[0], mu.shape[1], m, *(t.data_ptr() for t in (mu, nu, o, res, r, weight)),
                          _accumulator(acc))


def fill_law(lib: ctypes.CDLL, qs: Tensor, ts: Tensor, order: Tensor, m: int, sweeps: int, eps: float, line: float,
             weight: Tensor | None = None, acc: Tensor | None = None) -> tuple[Tensor, ...]:
    """``fill``'s marks and factors with m survivors: (theta [N, V] in token space; ths, marked, unmarked,
    others, below [N, V] in rank order), :class:`~mdv.verify.selection.FillFactors`' fields but order and qs;
    theta has the bits of :func:`fill_marks`.  Given weight [N] and acc (contiguous CPU float64 [N, V]), also
    ``acc += weight * fill's marginal`` in place, in the factors' last pass.  qs, ts: q and the targets in rank
    order, CPU float64 [N, V]; order: [N, V]."""
    qs, ts = _rows_of(qs, ts)
    order = order.to(torch.int64).contiguous()
    N, V = qs.shape
    out = [torch.empty((N, V), dtype=torch.float64) for _ in range(6)]
    work = torch.empty(V, dtype=torch.float64)
    if acc is None:
        weight_ptr = acc_ptr = None
    else:
        weight = _rows_of(weight)[0]
        weight_ptr, acc_ptr = weight.data_ptr(), _accumulator(acc)
    lib.sel_fill_law(N, V, m, sweeps, eps, line, qs.data_ptr(), ts.data_ptr(), order.data_ptr(),
                     *(t.data_ptr() for t in out), weight_ptr, acc_ptr, work.data_ptr())
    return tuple(out)


def overlap(lib: ctypes.CDLL, target: Tensor, marginal: Tensor) -> Tensor:
    """``sum_x min(target, marginal)`` per row, summed in long double.  CPU float64 [N, V] -> [N]."""
    target, marginal = _rows_of(target, marginal)
    score = torch.empty(target.shape[0], dtype=torch.float64)
    lib.sel_overlap(target.shape[0], target.shape[1], target.data_ptr(), marginal.data_ptr(), score.data_ptr())
    return score


def ceiling(lib: ctypes.CDLL, target: Tensor, q: Tensor, pi: Tensor) -> Tensor:
    """The choice's ceiling ``sum_x min(target, reach_mass(q, pi))`` per row in one pass (no [N, V] reach
    row), summed in long double.  target, q: CPU float64 [N, V]; pi: [N, K+1] -> [N]."""
    target, q = _rows_of(target, q)
    pi = pi.to(torch.float64).contiguous()
    out = torch.empty(target.shape[0], dtype=torch.float64)
    lib.sel_ceiling(target.shape[0], target.shape[1], pi.shape[-1] - 1, target.data_ptr(), q.data_ptr(), pi.data_ptr(),
                    out.data_ptr())
    return out


def support(lib: ctypes.CDLL, p: Tensor, q: Tensor, max_cols: int) -> tuple[Tensor, Tensor, Tensor] | None:
    """One row's draft support in one pass: (vocab [S] int64, p and q on its columns and one more column with the
    target's mass off it [1, S + 1]), or None where more than max_cols tokens have q > 0.  p, q: CPU float64 [V]
    or [1, V]."""
    p, q = p.reshape(-1).contiguous(), q.reshape(-1).contiguous()
    cap = min(max_cols, q.shape[0])
    vocab = torch.empty(cap, dtype=torch.int64)
    p_cols, q_cols = torch.empty(cap + 1, dtype=torch.float64), torch.empty(cap + 1, dtype=torch.float64)
    S = int(lib.sel_support(q.shape[0], p.data_ptr(), q.data_ptr(), cap, vocab.data_ptr(), p_cols.data_ptr(),
                            q_cols.data_ptr()))
    if S < 0:
        return None
    return vocab[:S], p_cols[:S + 1].unsqueeze(0), q_cols[:S + 1].unsqueeze(0)


def _addresses(arrays: list[Tensor | None]) -> Tensor:
    """The data pointers of the arrays (0 for None) as an int64 table that C reads as double pointers."""
    return torch.tensor([0 if a is None else a.data_ptr() for a in arrays], dtype=torch.int64)


def _ptr_of(t: Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def node_rule(lib: ctypes.CDLL, rule: int, p: Tensor, q: Tensor, ratio: float, pi: Tensor, *, rho_iters: int,
              tol: float, sweeps: int, eps: float, lines: Tensor, order: Tensor, below: Tensor, target: Tensor,
              row: Tensor, work: Tensor, ceiling: Tensor | None = None, masses: list[Tensor] | None = None,
              rho: Tensor | None = None, kseq: dict[int, list[Tensor]] | None = None, qs: Tensor | None = None,
              ts: Tensor | None = None, fill: dict[int, list[Tensor]] | None = None) -> float:
    """One token rule of select_gbv's choice at one prefix in one C call (``sel_node_rule``: the functions of this
    module in :func:`mdv.verify.selection._score_prefix_stepwise`'s order, the same bits); returns its score.
    rule 0 (lex) also writes order, below, target and ceiling; 1 (kseq) needs masses (6 scratch arrays), rho [K+1]
    and kseq (count m >= 2 -> beta, mu, nu, o, res [V], r and the moments [1 + m]); 2 (fill) qs, ts and fill (count
    -> 6 arrays [V]).  Every tensor a contiguous CPU float64 (order int64) array; p, q: [V]; pi: [K+1]; lines: [K+1];
    work: [4 V]."""
    K, V = pi.shape[0] - 1, q.shape[0]
    tables = [None if d is None else _addresses([a for m in range(2, K + 1) for a in d.get(m, [None] * 6)])
              for d in (kseq, fill)]
    mass_table = None if masses is None else _addresses(masses)
    return float(lib.sel_node_rule(rule, V, K, p.data_ptr(), q.data_ptr(), float(ratio), pi.data_ptr(), rho_iters, tol,
                                   sweeps, eps, lines.data_ptr(), order.data_ptr(), below.data_ptr(), target.data_ptr(),
                                   row.data_ptr(), _ptr_of(ceiling), _ptr_of(mass_table), _ptr_of(rho),
                                   _ptr_of(tables[0]), _ptr_of(qs), _ptr_of(ts), _ptr_of(tables[1]), work.data_ptr()))


__all__ = ["loops_library", "native_rows", "kseq_rho_active", "rank_order", "fill_marks", "lex_below", "sorted_masses", "kseq_rho",
           "lex_marginal_add", "kseq_factors", "kseq_marginal_add", "fill_law", "overlap", "ceiling", "support",
           "node_rule"]
