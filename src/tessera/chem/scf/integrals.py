"""Two-electron integrals over shell blocks, from libcint (through PySCF's C drivers).

PySCF stays the source of basis sets and Gaussian integrals; this module only asks
libcint for one block quartet ``(AB|CD)`` at a time, with a ``shls_slice``, exactly as
``pyscf.gto.moleintor.getints4c`` does, but with the argument arrays and the libcint
optimizer (``cintopt``) prepared once instead of on every call: a Fock build makes
thousands of such calls per iteration.

Also the whole 8-fold array of the in-memory SCF (``s8_integrals``), from one shell
quartet per point-group orbit (the C fill ``s8fill.c``), and the Schwarz bounds
Q_ij = sqrt(max |(ij|ij)|) per shell pair (Haser and Ahlrichs, J. Comput. Chem. 10, 104
(1989)): |(ij|kl)| <= Q_ij Q_kl.
"""

from __future__ import annotations

import ctypes
import logging
import weakref
from concurrent.futures import ThreadPoolExecutor
from functools import cache

import numpy as np
from pyscf.gto import moleintor
from pyscf.lib import unpack_tril, with_omp_threads

from tessera.backends.schedule import partition
from tessera.chem.scf.blocking import ShellBlocks
from tessera.chem.native import load
from tessera.errors import BuildError, SymmetryError

log = logging.getLogger(__name__)
_S8_MODULE = "tessera.chem.scf._s8fill"
#: Tasks of ranges of shell pairs per rank (the direct build: per rank, worker and thread),
#: small enough for the schedules to balance.
PAIR_TASKS_PER_WORKER = 32
#: A range task's fixed cost (Python and scheduling), in integrals, for the ranges' balance.
PAIR_TASK_OVERHEAD = 2000.0
_S8_ABI = 6         # tessera_abi_version() of s8fill.c whose argument lists these are


class BlockERI:
    """Callable computing the integral block ``(ij|kl)`` for shell ranges, shape
    ``(ni, nj, nk, nl)``, chemists' notation, real spherical (or Cartesian) AOs."""

    def __init__(self, mol):
        self.intor_name = mol._add_suffix("int2e")
        self._atm = np.asarray(mol._atm, dtype=np.int32, order="C")
        self._bas = np.asarray(mol._bas, dtype=np.int32, order="C")
        self._env = np.asarray(mol._env, dtype=np.double, order="C")
        self.ao_loc = np.asarray(moleintor.make_loc(self._bas, self.intor_name),
                                 dtype=np.int32)
        self._natm = ctypes.c_int(self._atm.shape[0])
        self._nbas = ctypes.c_int(self._bas.shape[0])
        self._cintopt = moleintor.make_cintopt(self._atm, self._bas, self._env,
                                               self.intor_name)
        lib = moleintor.libcgto
        self._drv = lib.GTOnr2e_fill_drv
        self._fill = {"s1": lib.GTOnr2e_fill_s1, "s2ij": lib.GTOnr2e_fill_s2ij,
                      "s2kl": lib.GTOnr2e_fill_s2kl, "s4": lib.GTOnr2e_fill_s4}
        self._intor = getattr(lib, self.intor_name)
        self._null = ctypes.c_void_p()
        self._args_tail = (
            self.ao_loc.ctypes.data_as(ctypes.c_void_p), self._cintopt,
            self._atm.ctypes.data_as(ctypes.c_void_p), self._natm,
            self._bas.ctypes.data_as(ctypes.c_void_p), self._nbas,
            self._env.ctypes.data_as(ctypes.c_void_p))
        nbas = self._bas.shape[0]
        self._cache_doubles = int(lib.GTOmax_cache_size(
            self._intor, (ctypes.c_int * 2)(0, nbas), ctypes.c_int(1), *self._args_tail[2:]))

    def scratch(self) -> np.ndarray:
        """One thread's scratch of the C fill and direct build (``s8fill.c``): a shell
        quartet of the largest shell and libcint's cache, sized once (PySCF's
        ``GTOmax_cache_size``); without it libcint allocates a cache in every call."""
        quartet = s8_library().tessera_s8_quartet_doubles(self._nbas, self.ao_loc.ctypes.data_as(ctypes.c_void_p))
        return np.empty(quartet + self._cache_doubles)

    def _fill_call(self, sym: str, shls: tuple, shape: tuple) -> np.ndarray:
        out = np.empty(shape)
        if out.size:
            self._drv(self._intor, self._fill[sym], self._null,
                      out.ctypes.data_as(ctypes.c_void_p), ctypes.c_int(1),
                      (ctypes.c_int * 8)(*shls), *self._args_tail)
        return out

    def __call__(self, i0, i1, j0, j1, k0, k1, l0, l1) -> np.ndarray:
        """The full block (ij|kl) for shell ranges [i0, i1) x [j0, j1) x ..."""
        loc = self.ao_loc
        shape = (int(loc[i1] - loc[i0]), int(loc[j1] - loc[j0]),
                 int(loc[k1] - loc[k0]), int(loc[l1] - loc[l0]))
        return self._fill_call("s1", (i0, i1, j0, j1, k0, k1, l0, l1), shape)

    def blocks(self, blocks: ShellBlocks, a, b, c, d) -> np.ndarray:
        """The full block quartet (AB|CD), shape (na, nb, nc, nd), for shell blocks.

        When A == B (or C == D) libcint computes only the shell pairs i >= j of that pair
        (``GTOnr2e_fill_s2ij`` / ``s2kl`` / ``s4``), and the block is unpacked with
        (ij|kl) = (ji|kl); this removes the redundant half of a diagonal pair block.
        """
        sr = blocks.shell_ranges
        shls = (*sr[a], *sr[b], *sr[c], *sr[d])
        na, nb, nc, nd = (blocks.ao_ranges[x][1] - blocks.ao_ranges[x][0]
                          for x in (a, b, c, d))
        if a == b and c == d:
            t = self._fill_call("s4", shls, (na * (na + 1) // 2, nc * (nc + 1) // 2))
            t = unpack_tril(t)                                   # (nab, nc, nc)
            return unpack_tril(t.reshape(t.shape[0], -1), axis=0).reshape(na, na, nc, nc)
        if a == b:
            t = self._fill_call("s2ij", shls, (na * (na + 1) // 2, nc * nd))
            return unpack_tril(t, axis=0).reshape(na, na, nc, nd)
        if c == d:
            t = self._fill_call("s2kl", shls, (na * nb, nc * (nc + 1) // 2))
            return unpack_tril(t).reshape(na, nb, nc, nc)
        return self._fill_call("s1", shls, (na, nb, nc, nd))


def schwarz_bounds(eri: BlockERI, mol) -> np.ndarray:
    """Q[i, j] = sqrt(max over functions of |(ij|ij)|) for every shell pair, (nbas, nbas).

    Computed one atom pair at a time: the diagonal of (IJ|IJ), I and J the shell ranges
    of two atoms, holds every (ij|ij) with i on atom I and j on atom J.  (Atom pairs, not
    Fock blocks: the cost is sum over atom pairs of (n_I n_J)^2, small for any blocking.)
    """
    ao_loc = np.asarray(eri.ao_loc, dtype=np.int64)
    nbas = len(ao_loc) - 1
    groups = [(int(r[0]), int(r[1])) for r in mol.aoslice_by_atom() if r[1] > r[0]]
    q = np.zeros((nbas, nbas))
    for ia, (a0, a1) in enumerate(groups):
        ra = ao_loc[a0:a1] - ao_loc[a0]
        for b0, b1 in groups[:ia + 1]:
            g = eri(a0, a1, b0, b1, a0, a1, b0, b1)
            diag = np.abs(np.einsum("abab->ab", g))
            rb = ao_loc[b0:b1] - ao_loc[b0]
            m = np.maximum.reduceat(np.maximum.reduceat(diag, ra, axis=0), rb, axis=1)
            q[a0:a1, b0:b1] = m
            q[b0:b1, a0:a1] = m.T
    return np.sqrt(q)


def s8_integrals(mol, threads: int = 1):
    """(eri, skeleton): the 8-fold symmetric integrals (ij|kl), i >= j, k >= l, ij >= kl
    (PySCF's ``mol.intor("int2e", aosym="s8")`` layout), with libcint computing one shell
    quartet per orbit of the point group (``s8fill.c``: about 1/4 of them for a planar D2h
    molecule, 1/8 for a non-planar one) on ``threads`` threads, and the ``Skeleton`` that
    builds J and K from those quartets alone; without point-group operations that map
    shells onto shells with signed AOs, PySCF's own s8 fill and None. (Over several ranks
    each keeps the representatives of the shell pairs it computed: ``ShellPairQuartets``.)"""
    ops = shell_operations(mol) if compiled_fill() is not None else []
    if not ops:
        with with_omp_threads(max(1, int(threads))):
            return mol.intor("int2e", aosym="s8"), None
    quartets = ShellPairQuartets(mol, ops)
    nsp = quartets.npairs
    out = np.empty(s8_bytes(mol.nao) // 8)
    orbit = np.empty(nsp * (nsp + 1) // 2, dtype=np.uint8)
    quartets.fill(0, nsp, out, orbit, threads)
    return out, Skeleton(ops, quartets.eri.ao_loc, mol.nao, orbit, (0, nsp))


class ShellPairQuartets:
    """The representative quartets (ij|kl), kl <= ij, one per orbit of the operations
    ``ops`` (``shell_operations``, the identity alone without a group), of ranges of shell
    pairs ij: ``fill`` writes them packed (every image, one process) or, with ``row_off``,
    compact (``part``: libcint's blocks one after the other, no images; what a rank of
    several keeps, ``incore.IncoreFock``)."""

    def __init__(self, mol, ops):
        self.eri, self.ops = BlockERI(mol), ops
        self.nao, self.npairs = mol.nao, mol.nbas * (mol.nbas + 1) // 2
        self.shell_map = np.ascontiguousarray([s for s, _, _ in ops], dtype=np.int32)
        self.ao_map = np.ascontiguousarray([p for _, p, _ in ops], dtype=np.int32)
        self.ao_sign = np.ascontiguousarray([g for _, _, g in ops], dtype=np.float64)

    def part(self, start: int, end: int, cost: np.ndarray, row_off: np.ndarray, threads: int) -> tuple:
        """(eri, orbit) of the shell pairs [start, end), compact: ``row_off[ij]`` (set here
        for these pairs alone, from ``cost``, ``all_pair_costs``) where pair ij's
        representatives start in eri."""
        offsets = np.concatenate(([0], np.cumsum(cost[start:end])))
        row_off[start:end] = offsets[:-1]
        out = np.empty(int(offsets[-1]))
        orbit = np.empty(end * (end + 1) // 2 - start * (start + 1) // 2, dtype=np.uint8)
        self.fill(start, end, out, orbit, threads, row_off)
        return out, orbit

    def fill(self, start, end, out, orbit, threads: int, row_off=None) -> None:
        """``s8fill.c``'s ``tessera_s8_fill`` of the pairs [start, end) on ``threads``
        threads: ``out`` packed (``row_off`` None) or compact; ``orbit`` the orbit sizes of
        their quartets (ij|kl), kl <= ij, from pair(start, 0) on."""
        e, ptr = self.eri, ctypes.c_void_p
        offsets = None if row_off is None else row_off.ctypes.data_as(ptr)

        def work(counter):
            scratch = e.scratch()           # this thread's, for the whole call
            return compiled_fill()(ctypes.cast(e._intor, ptr), e._cintopt, e._atm.ctypes.data_as(ptr), e._natm,
                           e._bas.ctypes.data_as(ptr), e._nbas, e._env.ctypes.data_as(ptr),
                           e.ao_loc.ctypes.data_as(ptr), self.nao, len(self.ops),
                           self.shell_map.ctypes.data_as(ptr), self.ao_map.ctypes.data_as(ptr),
                           self.ao_sign.ctypes.data_as(ptr), counter, end, offsets,
                           out.ctypes.data_as(ptr), orbit.ctypes.data_as(ptr), start * (start + 1) // 2,
                           scratch.ctypes.data_as(ptr))
        if any(on_threads(work, threads, start)):
            raise SymmetryError("s8fill: more than 64 point-group operations")


def pair_ranges(cost: np.ndarray, ntasks: int) -> tuple:
    """(ranges, costs): at most ``ntasks`` contiguous ranges [start, end) of shell pairs of
    near-equal ``cost`` (``all_pair_costs``; the engine's contiguous partition), those
    without representatives dropped, and each range's cost plus ``PAIR_TASK_OVERHEAD``: the
    tasks of the direct build and of the in-memory build over ranks."""
    ntasks = max(1, min(len(cost), int(ntasks)))
    ranges = [(int(q[0]), int(q[-1]) + 1) for q in partition(list(cost), ntasks, "contiguous") if len(q)]
    return ranges, [float(cost[s:e].sum()) + PAIR_TASK_OVERHEAD for s, e in ranges]


def s8_ranges(mol, nranks: int, ranks=None, ops=None) -> np.ndarray:
    """(nranks, 4) integers per rank: the span [start, end) of the shell pairs ij (packed,
    i >= j) of its static share of the in-memory build's tasks (``pair_ranges``, dealt by
    the engine's ``contiguous`` partition of their costs, as ``Context.run_tasks`` deals
    them statically), the integrals of their representative quartets (``_pair_costs``)
    and the bytes of their orbit sizes (one rank: every pair, the whole 8-fold array and
    no orbit bytes). ``ranks``: the costs are counted in parts, one per rank, and
    gathered; ``ops``: ``shell_operations(mol)`` (the identity alone when empty)."""
    nsp = mol.nbas * (mol.nbas + 1) // 2
    if nranks == 1:
        return np.array([[0, nsp, s8_bytes(mol.nao) // 8, 0]], dtype=np.int64)
    ops = (ops or shell_operations(mol)) or [(np.arange(mol.nbas),)]
    shell_map = np.ascontiguousarray([op[0] for op in ops], dtype=np.int32)
    cost = all_pair_costs(mol, shell_map, ranks)
    ranges, costs = pair_ranges(cost, PAIR_TASKS_PER_WORKER * nranks)
    out = np.zeros((nranks, 4), dtype=np.int64)
    for rank, queue in enumerate(partition(costs, nranks, "contiguous")):
        if len(queue):
            mine = [ranges[t] for t in queue]
            out[rank] = (mine[0][0], mine[-1][1], sum(cost[s:e].sum() for s, e in mine),
                         sum((e * (e + 1) - s * (s + 1)) // 2 for s, e in mine))
    return out


_PAIR_COSTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # mol -> {key: costs}


def all_pair_costs(mol, shell_map: np.ndarray, ranks=None) -> np.ndarray:
    """``_pair_costs`` of every shell pair of ``mol``, with ``ranks`` counted in parts, one
    per rank, and gathered. Kept per molecule, basis, operations and rank count, so that the
    builder's choice, its ranges and each rank's offsets count them once; counted over
    ranks only by calls every rank makes (all of them find it kept, or none: the memory
    estimate, which one rank makes alone, keeps its own count apart)."""
    key = (mol.nbas, np.asarray(mol.ao_loc_nr()).tobytes(), shell_map.tobytes(),
           1 if ranks is None else ranks.size)
    kept = _PAIR_COSTS.setdefault(mol, {})
    if key not in kept:
        nsp = mol.nbas * (mol.nbas + 1) // 2
        size, me = (1, 0) if ranks is None else (ranks.size, ranks.rank)
        cut = np.linspace(0, nsp, size + 1).astype(np.int64)
        part = _pair_costs(mol, shell_map, int(cut[me]), int(cut[me + 1]))
        kept[key] = part if ranks is None else np.concatenate(ranks.allgather(part))
    return kept[key]


def _pair_costs(mol, shell_map: np.ndarray, start: int, end: int) -> np.ndarray:
    """Integrals of the representative quartets (ij|kl), kl <= ij, of the shell pairs ij
    in [start, end) (``s8fill.c``'s ``tessera_s8_cost``)."""
    loc = np.ascontiguousarray(mol.ao_loc_nr(), dtype=np.int32)
    cost = np.empty(end - start)
    ptr = ctypes.c_void_p
    s8_library().tessera_s8_cost(mol.nbas, loc.ctypes.data_as(ptr), len(shell_map),
                                  shell_map.ctypes.data_as(ptr), start, end,
                                  cost.ctypes.data_as(ptr))
    return cost.astype(np.int64)


def s8_shares(mol, nranks: int, ranks=None) -> np.ndarray | None:
    """Bytes of 8-fold integrals each of ``nranks`` ranks is expected to keep: the
    representatives of its static share of the shell pairs (``s8_ranges``, whose costs
    ``ranks`` count in parts; the identity alone without point-group operations; one rank:
    the whole array), counted without computing an integral; None over several ranks
    without the compiled fill."""
    if nranks > 1 and compiled_fill() is None:
        return None
    ops = shell_operations(mol) if nranks > 1 else None
    _, _, kept, orbits = s8_ranges(mol, nranks, ranks, ops).T
    return 8 * kept + orbits      # and the orbit sizes of their quartets, a byte each


def s8_bytes(nao: int) -> int:
    """Bytes of the 8-fold symmetric integral array of ``nao`` functions."""
    npair = nao * (nao + 1) // 2
    return npair * (npair + 1) // 2 * 8


class Skeleton:
    """J and K of a density that the point group leaves invariant (every SCF density of
    symmetry-adapted orbitals) from the representative shell quartets of ``s8_integrals``
    only, each weighted by the size of its orbit, then summed over the group's operations
    (the skeleton Fock matrix of Dupuis and King, Int. J. Quantum Chem. 11, 613 (1977)):
    ``orbit[pair(ij, kl) - pair(start, 0)]`` (``pairs`` = (start, end)) is that size for a representative shell quartet, 0 otherwise;
    ``pairs``: the range of shell pairs ij whose quartets ``jk`` contracts (``parts_jk``:
    those of each part; the identity alone without a group: the plain 8-fold J and K)."""

    def __init__(self, ops, ao_loc, nao: int, orbit: np.ndarray, pairs: tuple):
        self.ops, self.ao_loc, self.nao, self.orbit, self.pairs = ops, ao_loc, int(nao), orbit, pairs

    def jk(self, eri: np.ndarray, dm: np.ndarray, threads: int = 1) -> tuple:
        """(J, K) of the symmetric density ``dm`` from the packed 8-fold ``eri``."""
        return self.parts_jk([(*self.pairs, eri, self.orbit)], dm, threads)

    def parts_jk(self, parts: list, dm: np.ndarray, threads: int = 1, row_off=None) -> tuple:
        """(J, K) of the symmetric density ``dm`` from ``parts`` [(start, end, eri, orbit)]
        of shell pairs [start, end) (``ShellPairQuartets``): ``eri`` packed (``row_off``
        None) or compact; over ranks each rank's part of J and K, to be summed."""
        nao, ptr = self.nao, ctypes.c_void_p
        dm = np.ascontiguousarray(dm, dtype=np.float64)
        jk = s8_library().tessera_s8_jk
        offsets = None if row_off is None else row_off.ctypes.data_as(ptr)
        counters = np.array([p[0] for p in parts], dtype=np.int64)    # the threads claim pairs from each
        out = []

        def work(_counter):
            vj, vk = np.zeros((nao, nao)), np.zeros((nao, nao))
            out.append((vj, vk))
            for n, (start, end, eri, orbit) in enumerate(parts):
                jk(len(self.ao_loc) - 1, self.ao_loc.ctypes.data_as(ptr), nao, orbit.ctypes.data_as(ptr),
                   eri.ctypes.data_as(ptr), offsets, dm.ctypes.data_as(ptr), ptr(counters.ctypes.data + 8 * n),
                   end, vj.ctypes.data_as(ptr), vk.ctypes.data_as(ptr), start * (start + 1) // 2)
        on_threads(work, threads)
        vj, vk = (sum(p[n] for p in out) for n in (0, 1))
        return self.symmetrize(vj + vj.T), self.symmetrize(vk + vk.T)

    def invariant(self, dm: np.ndarray, tol: float = 1e-10) -> bool:
        """Whether the group leaves ``dm`` unchanged (to ``tol`` of its largest element),
        the condition under which ``jk`` is exact: every density of symmetry-adapted
        orbitals is; another (a broken-symmetry guess, a response density) is not."""
        return bool(np.abs(self.symmetrize(dm) - dm).max(initial=0.0) <= tol * max(1.0, np.abs(dm).max(initial=0.0)))

    def symmetrize(self, m: np.ndarray) -> np.ndarray:
        """(1/|G|) sum over the operations g of g m g^T, (g m g^T)[pi a, pi b] = s_a s_b m[a, b]."""
        out = np.zeros_like(m)
        for _, perm, sign in self.ops:
            out[np.ix_(perm, perm)] += sign[:, None] * m * sign[None, :]
        return out / len(self.ops)


def on_threads(work, threads: int, start: int = 0) -> list:
    """``work(counter)`` on ``threads`` threads at once (ctypes calls release the GIL),
    sharing the counter from which they claim shell pairs, from ``start`` on; their results."""
    counter = np.full(1, start, dtype=np.int64)
    arg = counter.ctypes.data_as(ctypes.c_void_p)
    n = max(1, int(threads))
    if n == 1:
        return [work(arg)]
    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(lambda _: work(arg), range(n)))


def shell_operations(mol) -> list:
    """[(shell map, AO map, AO signs)] of the point group's operations, the identity
    first, when they map every shell onto a shell AO by AO (D2h and its subgroups in
    PySCF's orientation); [] without symmetry or when one does not."""
    from tessera.chem.ao2mo_symmetry import ao_operations
    if not getattr(mol, "symmetry", False) or mol.symm_orb is None or mol.groupname == "C1":
        return []
    U = np.hstack(mol.symm_orb)
    U[np.abs(U) < 1e-12] = 0.0
    loc = np.asarray(mol.ao_loc_nr())
    shell = np.repeat(np.arange(mol.nbas), np.diff(loc))
    out = [(np.arange(mol.nbas), np.arange(mol.nao), np.ones(mol.nao))]
    for perm, sign in ao_operations(mol, U):
        smap = shell[perm[loc[:-1]]]
        if not (np.array_equal(np.diff(loc)[smap], np.diff(loc))
                and np.array_equal(perm, loc[smap][shell] + np.arange(mol.nao) - loc[shell])):
            return []
        out.append((smap, perm, sign))
    return out if len(out) > 1 else []


@cache
def compiled_fill():
    """The compiled fill, or None (logged once) when it is not built: the SCF then
    computes every quartet (one process) or keeps screened blocks (several ranks)."""
    try:
        return s8_library().tessera_s8_fill
    except BuildError as exc:
        log.warning("%s; the SCF computes every shell quartet instead", exc)
        return None


@cache
def s8_library() -> ctypes.CDLL:
    lib = load(_S8_MODULE, _S8_ABI, "the compiled integral fill")
    lib.tessera_s8_fill.restype = ctypes.c_int
    i64 = ctypes.c_int64
    lib.tessera_s8_fill.argtypes = ([ctypes.c_void_p] * 3 + [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
                                    + [ctypes.c_void_p] * 2 + [ctypes.c_int, ctypes.c_int]
                                    + [ctypes.c_void_p] * 4 + [i64] + [ctypes.c_void_p] * 3 + [i64, ctypes.c_void_p])
    lib.tessera_s8_quartet_doubles.restype = i64
    lib.tessera_s8_quartet_doubles.argtypes = [ctypes.c_int, ctypes.c_void_p]
    lib.tessera_s8_cost.restype = None
    lib.tessera_s8_cost.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                                    i64, i64, ctypes.c_void_p]
    lib.tessera_s8_jk.restype = None
    lib.tessera_s8_jk.argtypes = ([ctypes.c_int, ctypes.c_void_p, ctypes.c_int] + [ctypes.c_void_p] * 5
                                  + [i64] + [ctypes.c_void_p] * 2 + [i64])
    lib.tessera_s8_direct_jk.restype = ctypes.c_int
    lib.tessera_s8_direct_jk.argtypes = ([ctypes.c_void_p] * 3 + [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
                                         + [ctypes.c_void_p] * 2 + [ctypes.c_int, ctypes.c_int]
                                         + [ctypes.c_void_p] * 3 + [ctypes.c_double] + [ctypes.c_void_p] * 2
                                         + [i64] + [ctypes.c_void_p] * 4)
    return lib
