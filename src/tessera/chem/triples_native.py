"""The compiled memory passes of (T): ``triples_kernel.c``, built by the install.

The C source (its header comment gives the equations: Raghavachari et al. 1989, the
closed-shell form of Rendell, Lee, Komornicki 1991 / PySCF's ``cc/ccsd_t.py``) is a
compiled part loaded by ``chem.native`` (ctypes releases the GIL, so the threads backend
runs one call per worker at once).
"""

from __future__ import annotations

import ctypes
from functools import cache

import numpy as np

from tessera.chem.native import load
from tessera.errors import ShapeError

__all__ = ["require", "energy_dense", "energy_packed"]

_MODULE = "tessera.chem._triples_kernel"
_ABI = 1            # tessera_abi_version() of triples_kernel.c whose argument lists these are
_ptr = ctypes.c_void_p


@cache
def _library() -> ctypes.CDLL:
    lib = load(_MODULE, _ABI, "the compiled (T) kernel")
    fn = lib.tessera_t3_energy_dense
    fn.restype = ctypes.c_double
    fn.argtypes = [ctypes.c_long, _ptr, _ptr, _ptr, _ptr, ctypes.c_double] + [_ptr] * 6
    fn = lib.tessera_t3_energy_packed
    fn.restype = ctypes.c_double
    fn.argtypes = [ctypes.c_long, _ptr, ctypes.c_long, _ptr, _ptr, _ptr, _ptr, ctypes.c_double] + [_ptr] * 11
    return lib


def require() -> None:
    """BuildError (naming ``make``) unless the compiled kernel is built; loads it."""
    _library()


def _addr(a: np.ndarray, size: int, dtype=np.float64) -> int:
    """Address of ``a``'s first element after checking it is ``size`` contiguous ``dtype``."""
    if a.dtype != dtype or a.size != size or not a.flags.c_contiguous:
        raise ShapeError(f"the (T) kernel needs {size} contiguous {np.dtype(dtype)}, got {a.dtype} {a.shape}")
    return a.ctypes.data


def energy_dense(A, B, C, ev, eijk: float, t1i, t1j, t1k, Pjk, Pik, Pij) -> float:
    """sum_abc W r3(W + V) / D of one occupied triple (i, j, k), one virtual irrep of v:
    W[abc] = A[abc] + B[bac] + C[cab] (each [v, v, v]), V[abc] = t1i[a] Pjk[bc] +
    t1j[b] Pik[ac] + t1k[c] Pij[ab] (Pjk[bc] = (jb|kc), ...), D = eijk - ev[a] - ev[b] - ev[c]."""
    nv = ev.size
    n3, n2 = nv ** 3, nv * nv
    return _library().tessera_t3_energy_dense(
        nv, _addr(A, n3), _addr(B, n3), _addr(C, n3), _addr(ev, nv), float(eijk),
        _addr(t1i, nv), _addr(t1j, nv), _addr(t1k, nv), _addr(Pjk, n2), _addr(Pik, n2), _addr(Pij, n2))


def energy_packed(orbits, A, Bs, C, ev, eijk: float, t1i, t1j, t1k, rows, pair_irreps, lay, scratch) -> float:
    """The same sum with point-group symmetry: A, Bs, C packed layouts a, b (pairs swapped)
    and c of one triple (``VirtualLayout``: ``lay``), ``orbits`` the table of
    ``VirtualLayout.prepare``; ``rows``: the packed (x t|y u) rows (jb|kc), (ia|kc), (ia|jb)
    of pair irreps ``pair_irreps`` (empty: zero by symmetry); ``scratch`` 3 v^2 doubles."""
    nv, n = ev.size, A.size
    rows = [_addr(p, int(lay.npair[h])) if p.size else None for p, h in zip(rows, pair_irreps)]
    h = np.array(pair_irreps, dtype=np.int64)
    return _library().tessera_t3_energy_packed(
        orbits.shape[0], _addr(orbits, orbits.size, np.int32), nv, _addr(A, n), _addr(Bs, n), _addr(C, n),
        _addr(ev, nv), float(eijk), _addr(t1i, nv), _addr(t1j, nv), _addr(t1k, nv), *rows,
        h.ctypes.data, *(t.ctypes.data for t in lay.native), _addr(scratch, 3 * nv * nv))

