"""The compiled memory passes of (T): ``triples_kernel.c``, built by the install.

The C source (its header comment gives the equations: Raghavachari et al. 1989, the
closed-shell form of Rendell, Lee, Komornicki 1991 / PySCF's ``cc/ccsd_t.py``) is a
compiled part loaded by ``chem.native`` (ctypes releases the GIL, so the threads backend
runs one call per worker at once).  The packed batch kernel calls BLAS dgemm through
the address SciPy exports (``scipy.linalg.cython_blas``), set once at load: the BLAS
SciPy already loaded, none at link time.
"""

from __future__ import annotations

import ctypes
from functools import cache

import numpy as np

from tessera.chem.native import load
from tessera.errors import BuildError, ShapeError, TesseraError

__all__ = ["require", "dense_scratch_size", "packed_scratch_size", "energy_dense", "energy_packed",
           "batch_packed", "batch_dense", "block_w", "block_energy"]

_MODULE = "tessera.chem._triples_kernel"
_ABI = 9            # tessera_abi_version() of triples_kernel.c whose argument lists these are
_ptr = ctypes.c_void_p


@cache
def _library() -> ctypes.CDLL:
    lib = load(_MODULE, _ABI, "the compiled (T) kernel")
    fn = lib.tessera_t3_energy_dense
    fn.restype = ctypes.c_double
    fn.argtypes = [ctypes.c_long, ctypes.c_long, _ptr, _ptr, _ptr, _ptr, ctypes.c_double] + [_ptr] * 7
    lib.tessera_t3_dense_scratch.restype = ctypes.c_long
    lib.tessera_t3_dense_scratch.argtypes = [ctypes.c_long]
    lib.tessera_t3_packed_scratch.restype = ctypes.c_long
    lib.tessera_t3_packed_scratch.argtypes = [ctypes.c_long, ctypes.c_long]
    if (lib.tessera_t3_dense_scratch(7), lib.tessera_t3_packed_scratch(7, 11)) != (dense_scratch_size(7),
                                                                                  packed_scratch_size(7, 11)):
        raise BuildError("the compiled (T) kernel's scratch differs from triples_native's "
                         "(DENSE_TILE): rebuild it with `make`")
    fn = lib.tessera_t3_energy_packed
    fn.restype = ctypes.c_double
    fn.argtypes = [ctypes.c_long, _ptr, ctypes.c_long, _ptr, _ptr, _ptr, _ptr, ctypes.c_double] + [_ptr] * 8
    fn = lib.tessera_t3_batch_packed
    fn.restype = ctypes.c_double
    fn.argtypes = [ctypes.c_long] * 6 + [_ptr] * 6 + [ctypes.c_long] + [_ptr] * 4
    fn = lib.tessera_t3_batch_dense
    fn.restype = ctypes.c_double
    fn.argtypes = [ctypes.c_long] * 5 + [_ptr] * 5 + [ctypes.c_long] * 2 + [_ptr] * 4
    lib.tessera_t3_block_w.restype = None
    lib.tessera_t3_block_w.argtypes = [ctypes.c_long] * 4 + [_ptr, _ptr, ctypes.c_int]
    fn = lib.tessera_t3_block_energy
    fn.restype = ctypes.c_double
    fn.argtypes = [ctypes.c_long, ctypes.c_long, _ptr, _ptr, _ptr, ctypes.c_long, _ptr, _ptr, ctypes.c_long] + [_ptr] * 8
    lib.tessera_t3_set_dgemm.argtypes = [_ptr]
    lib.tessera_t3_set_dgemm(_scipy_dgemm())
    return lib


def _scipy_dgemm() -> int:
    """Address of SciPy's BLAS dgemm (Fortran convention), from the capsule that
    ``scipy.linalg.cython_blas`` exports: the kernel calls the BLAS SciPy loaded."""
    import scipy
    from scipy.linalg import cython_blas
    # prototypes of our own: the process-wide ctypes.pythonapi ones are left as they are
    get_name = ctypes.PYFUNCTYPE(ctypes.c_char_p, ctypes.py_object)(("PyCapsule_GetName", ctypes.pythonapi))
    get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
        ("PyCapsule_GetPointer", ctypes.pythonapi))
    try:
        capsule = cython_blas.__pyx_capi__["dgemm"]
        address = get_pointer(capsule, get_name(capsule))
    except (AttributeError, KeyError, ValueError) as exc:
        address = None
        why = f"{type(exc).__name__}: {exc}"
    if not address:
        raise BuildError(f"the (T) kernel needs SciPy's BLAS dgemm (scipy.linalg.cython_blas), which "
                         f"SciPy {scipy.__version__} does not export here ({why if address is None else 'NULL'})")
    return address


def require() -> None:
    """BuildError (naming ``make``) unless the compiled kernel is built; loads it."""
    _library()


def _addr(a: np.ndarray, size: int, dtype=np.float64) -> int:
    """Address of ``a``'s first element after checking it is ``size`` contiguous ``dtype``."""
    if a.dtype != dtype or a.size != size or not a.flags.c_contiguous:
        raise ShapeError(f"the (T) kernel needs {size} contiguous {np.dtype(dtype)}, got {a.dtype} {a.shape}")
    return a.ctypes.data


DENSE_TILE = 16     # DTILE of triples_kernel.c: virtuals per edge of the sweeps' tiles


def dense_scratch_size(nv: int) -> int:
    """Doubles of the scratch ``energy_dense`` needs for ``nv`` virtuals (its four local
    tiles, three transposed pair matrices and W of the triple; C's ``tessera_t3_dense_scratch``, checked
    when the kernel loads): known without the compiled kernel, so plans and memory
    estimates need no build."""
    return 4 * DENSE_TILE ** 3 + 3 * nv * nv + nv ** 3


def packed_scratch_size(nv: int, ntrip: int) -> int:
    """Doubles of the scratch ``energy_packed`` and ``batch_packed`` need for ``nv``
    virtuals and ``ntrip`` virtual triples of the total irrep (``VirtualLayout.ntrip``):
    three (x t|y u) rows made dense [v, v] and their transposes, then W of one orbital
    triple (C's ``tessera_t3_packed_scratch``, checked when the kernel loads)."""
    return 6 * nv * nv + ntrip


def energy_dense(A, B, C, ev, eijk: float, t1i, t1j, t1k, Pjk, Pik, Pij, scratch, ld: int | None = None) -> float:
    """sum_abc W r3(W + V) / D of one occupied triple (i, j, k), one virtual irrep of v:
    W[abc] = A[abc] + B[bac] + C[cab] (each [v, v, v]), V[abc] = t1i[a] Pjk[bc] +
    t1j[b] Pik[ac] + t1k[c] Pij[ab] (Pjk[bc] = (jb|kc), ...), D = eijk - ev[a] - ev[b] - ev[c];
    ``scratch``: at least ``dense_scratch_size(v)`` doubles.  ``ld``: the stride of the
    first index of A, B, C (flat, (v - 1) ld + v^2 doubles; default v^2: dense), as in
    the batch layout of ``batch_dense``."""
    nv = ev.size
    n2, ns = nv * nv, dense_scratch_size(nv)
    ld = n2 if ld is None else ld
    n3 = (nv - 1) * ld + n2
    return _library().tessera_t3_energy_dense(
        nv, ld, _addr(A, n3), _addr(B, n3), _addr(C, n3), _addr(ev, nv), float(eijk),
        _addr(t1i, nv), _addr(t1j, nv), _addr(t1k, nv), _addr(Pjk, n2), _addr(Pik, n2), _addr(Pij, n2),
        _addr(scratch[:ns], ns))


def energy_packed(G: int, A, Bs, C, ev, eijk: float, t1i, t1j, t1k, rows, pair_irreps, lay, scratch) -> float:
    """The same sum with point-group symmetry: A, Bs, C packed layouts a, b (pairs swapped)
    and c of one triple of irrep G (``VirtualLayout``: ``lay``); ``rows``: the packed
    (x t|y u) rows (jb|kc), (ia|kc), (ia|jb) of pair irreps ``pair_irreps`` (empty: zero by
    symmetry); ``scratch`` at least ``packed_scratch_size(v, A.size)`` doubles."""
    nv, n = ev.size, A.size
    ns = packed_scratch_size(nv, n)
    rows = [_addr(p, int(lay.npair[h])) if p.size else None for p, h in zip(rows, pair_irreps)]
    h = np.array(pair_irreps, dtype=np.int64)
    return _library().tessera_t3_energy_packed(
        G, lay.batch_table.ctypes.data, nv, _addr(A, n), _addr(Bs, n), _addr(C, n), _addr(ev, nv), float(eijk),
        _addr(t1i, nv), _addr(t1j, nv), _addr(t1k, nv), *rows, h.ctypes.data, _addr(scratch[:ns], ns))


def batch_packed(G: int, i: int, j: int, k0: int, nk: int, inp, ev, B, lbuf, scratch) -> tuple:
    """(sum over k in k0..k0+nk-1 of the energy of energy_packed, GEMM flops) of one batch
    (i, j, ks) of ``TripleKernel`` on the fused operands (``inp.native_rows``): its GEMMs
    and the sweeps in one call, the sweeps reading the batch buffer ``B`` (3 nk ntrip) in
    place; ``lbuf`` the stacked left operands, ``scratch`` ``packed_scratch_size(v, ntrip[G])`` doubles."""
    lay, nocc, nv = inp.lay, len(inp.irrep), ev.size
    ntrip = int(lay.ntrip[G])
    ns = packed_scratch_size(nv, ntrip)
    if not inp.native_rows[:, [i, j, *range(k0, k0 + nk)]].any(axis=(0, 2)).all():
        raise ShapeError(f"(T) batch ({i}, {j}, {k0}..{k0 + nk - 1}): an orbital outside the given row slabs")
    flops = ctypes.c_int64(0)
    energy = _library().tessera_t3_batch_packed(
        G, i, j, k0, nk, nocc, lay.batch_table.ctypes.data, _addr(inp.occ_table, 2 * nocc, np.int64),
        _addr(inp.native_rows, 4 * nocc * 8, np.int64), _addr(inp.t1, nocc * nv), _addr(inp.eo, nocc),
        _addr(ev, nv), nv, _addr(B[:3 * nk * ntrip], 3 * nk * ntrip), lbuf.ctypes.data,
        _addr(scratch[:ns], ns), ctypes.byref(flops))
    return energy, flops.value


def batch_dense(i: int, j: int, k0: int, nk: int, inp, ev, B, lbuf, scratch) -> tuple:
    """(sum over k in k0..k0+nk-1 of the energy of energy_dense, GEMM flops) of one batch
    (i, j, ks) of ``TripleKernel`` with one virtual irrep (C1) on the fused operands
    (``inp.native_rows``): its GEMMs and sweeps in one call; ``B`` the batch buffer
    (3 nk v^3), all zero on entry and left so (the sweeps zero what they read, the GEMMs
    accumulate), ``lbuf`` the stacked left operands (2 nk v (v + o)), ``scratch``
    ``dense_scratch_size(v)`` doubles."""
    nocc, nv = len(inp.irrep), ev.size
    nk3, nleft, ns = 3 * nk * nv ** 3, 2 * nk * nv * (nv + nocc), dense_scratch_size(nv)
    if not inp.native_rows[:, [i, j, *range(k0, k0 + nk)], 0].all():
        raise ShapeError(f"(T) batch ({i}, {j}, {k0}..{k0 + nk - 1}): an orbital outside the given row slabs")
    flops = ctypes.c_int64(0)
    energy = _library().tessera_t3_batch_dense(
        i, j, k0, nk, nocc, _addr(inp.occ_table, 2 * nocc, np.int64), _addr(inp.native_rows, 4 * nocc * 8, np.int64),
        _addr(inp.t1, nocc * nv), _addr(inp.eo, nocc), _addr(ev, nv), nv, nv + nocc, _addr(B[:nk3], nk3),
        _addr(lbuf[:nleft], nleft), _addr(scratch[:ns], ns), ctypes.byref(flops))
    return energy, flops.value


def block_w(out: np.ndarray, terms, add: bool) -> None:
    """W of one ordered block of the blocked kernel, ``out`` [nk, n_X, n_Y, n_Z] (C order):
    = (or += when ``add``) the sum of ``terms``, float64 arrays of out's shape in any
    strides (views: Sa, and Sb, Sc transposed to index order k, a, b, c), read in place."""
    desc = np.zeros((3, 5), dtype=np.int64)
    for t, term in enumerate(terms):
        if term.shape != out.shape or term.dtype != np.float64:
            raise ShapeError(f"(T) W term {term.dtype} {term.shape}, expected float64 {out.shape}")
        desc[t] = (term.ctypes.data, *(s // 8 for s in term.strides))
    _library().tessera_t3_block_w(*out.shape, desc.ctypes.data, _addr(out, out.size), int(add))


def block_energy(tri, sizes, offsets, ids, W: list, ev, eijk, t1i, t1j, t1k, Pjk, Pik, Pij) -> float:
    """sum_k sum_abc W r3(W + V) / D over one unordered block triple (``tri``: its block ids,
    equal ids adjacent; ``sizes``, ``offsets``: of its distinct blocks in a frame of nf
    virtuals), from W of its ordered blocks (``ids`` [norder, 3], ``W`` contiguous [nk, n_X,
    n_Y, n_Z] each); in frame positions ev, t1i, t1j [nf], t1k [nk, nf], Pjk, Pik [nk, nf,
    nf] ((jb|kc), (ia|kc)), Pij [nf, nf] ((ia|jb)); eijk [nk]: e_i + e_j + e_k."""
    nk, nf = eijk.size, ev.size
    sizes, offsets = np.asarray(sizes, dtype=np.int64), np.asarray(offsets, dtype=np.int64)
    tri, ids = np.asarray(tri, dtype=np.int64), np.ascontiguousarray(ids, dtype=np.int64)
    vol = [int(np.prod(sizes[row])) for row in ids]
    ptrs = np.array([_addr(w, nk * n) for w, n in zip(W, vol)], dtype=np.int64)
    e = _library().tessera_t3_block_energy(
        nk, sizes.size, sizes.ctypes.data, offsets.ctypes.data, tri.ctypes.data, len(ids), ids.ctypes.data,
        ptrs.ctypes.data, nf, _addr(ev, nf), _addr(eijk, nk), _addr(t1i, nf), _addr(t1j, nf),
        _addr(t1k, nk * nf), _addr(Pjk, nk * nf * nf), _addr(Pik, nk * nf * nf), _addr(Pij, nf * nf))
    if e != e:          # the kernel's NaN: an ordering of the triple was not given
        raise TesseraError(f"(T) block triple {tri.tolist()}: W of an ordering of its blocks is missing")
    return e
