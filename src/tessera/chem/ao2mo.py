"""The AO->MO integral transformation of ``chem.integrals`` as task sets.

One driver for every backend: the tasks run on the current context (serial, threads or
over MPI ranks); the class tensors are block tensors on the context's storage, so with a
distributed context no rank computes or holds all AO integrals or a whole four-index
tensor, and no data goes through one rank. Two ways to the half-transformed rows
(pq|lam sig), p >= q over the active orbitals, lam >= sig over the AOs:

A. *In memory* (a local context, serial or threads, when the 8-fold AO integrals fit the
   memory budget): the unique AO integrals (ij|kl), ij >= kl, once (libcint, ``s8``; or
   the SCF's own, handed over by the reference: ``Reference.ao_integrals``) are
   half-transformed by PySCF's e1 kernel (``half_rows``: pieces of AO pairs on the
   threads) into one array of rows (AO pair, pq), and dropped before any MO block exists:
   the dense AO integrals and the MO classes are never held at once.
B. *AO units* (task set ``transform: AO integrals``, statically balanced by their exact
   cost under MPI; a unit's rows go wherever their owners are). AO shell
   pairs (lam >= sig) are cut into units of at most ``slab_bytes``/2 of integrals (a
   diagonal shell pair alone). A task computes (lam sig|mu nu) for its unit and all
   mu >= nu (libcint via ``moleintor.getints``: ``s2kl`` for off-diagonal shell pairs,
   ``s4`` for a diagonal one, so over all units each AO pair lam >= sig is computed once:
   the 4-fold packed set, npair^2 with npair = nao(nao+1)/2), half-transforms mu nu ->
   p >= q over all active orbitals at once (``nr_e2``, s2), and writes the rows each
   class needs into that class's half-transformed tensor H[(P Q) rows, unit]
   (``put_block``: a one-sided put to the owner of the row group when distributed).

*Point-group symmetry* (``chem/ao2mo_symmetry.py``; when the group's operations map AOs
onto signed AOs and each orbital is of one irrep): the rows of one AO pair give those of
its whole orbit under the group, so A half-transforms one AO pair per orbit and B only
the units of one shell pair per orbit of shell pairs (about 1/4 of the AO pairs of a
planar D2h molecule, 1/8 of a non-planar one; in memory, operations that map every AO
onto +-itself, as a molecular plane, give AOs, AO pairs and orbitals classes, and a pair
is half-transformed only over the orbital blocks its class meets, each from the AOs of
its two classes: ``ClassTransform.class_blocks``); the finish then goes through the
symmetry-adapted basis (a sparse map from those AO pairs to each SO block, then the SO
coefficients of the orbitals of each irrep), reading only the AO pairs whose rows can be
non-zero for the group's irrep (``PairOrbits.reps_of``: in a planar molecule about half).

Then the *row groups* (task set ``transform: finish``): a first-pair group (P, Q) of a
class is finished lam sig -> r s per irrep of r (without orbits; only symmetry-allowed (R, S): the
orbitals of one irrep are contiguous in a space, so each irrep pair is one dense
transform with the coefficients of those irreps; r >= s packed when both indices run
over the same orbitals), and its blocks are written with ``put_block`` wherever the
class tensor keeps them (any owner map). When p and q run over the same space (oooo,
oovv, vvvv) only groups P >= Q are transformed: (qp|rs) = (pq|rs), so the (Q, P, R, S)
blocks are the transposes. Only the canonical blocks of a canonical class are computed.
In memory with orbits, one task finishes a first-pair group for every class with those
first pairs (oooo and oovv; ovoo, ovov and ovvv): they share its rows and their SO products.
Under MPI the row groups are balanced over *all* ranks (largest first by rows; H is laid
out with placement ``("rows", homes)``) and each group is finished where its rows are
(``TaskSet.home``): every rank takes part in both task sets whatever the class tensors'
owner maps. The H tensors are released (collective) before returning.

Memory per rank, in doubles: its class blocks (~ stored total / ranks) + its rows of H,
sum over classes of rows(P Q) x columns (~ (2 o^2 + 3 o v + v^2) columns / ranks; the
columns are npair AO pairs, or with orbits those of the representative shell pairs) + per
thread about ``slab_bytes`` of working arrays; in memory (A): npair (npair + 1) / 2 AO
integrals + nact (nact + 1) / 2 x columns rows, then the rows and the classes.
"""

from __future__ import annotations

import ctypes
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from pyscf import lib
from pyscf.ao2mo import _ao2mo
from pyscf.gto import moleintor

from tessera.backends.context import thread_limit
from tessera.backends.heap import base_pages
from tessera.backends.local import threads_of
from tessera.backends.schedule import partition
from tessera.backends.tasks import TaskSet
from tessera.chem.ao2mo_symmetry import pair_orbits
from tessera.errors import SymmetryError
from tessera.tensor.block_tensor import BlockTensor
from tessera.tensor.space import IndexSpace


def pair_index(p, q) -> np.ndarray:
    """Packed pair index of (p, q) for every p in ``p``, q in ``q`` (4-fold packing p>=q)."""
    hi = np.maximum(p[:, None], q[None, :])
    lo = np.minimum(p[:, None], q[None, :])
    return hi * (hi + 1) // 2 + lo


def half_flops(nao: int, nmo: int) -> int:
    """Flops of one AO-pair row (mu nu|u) -> (pq|u), all p >= q of ``nmo`` orbitals
    (PySCF's s2 kernel: a symmetric product, then the lower triangle of the second)."""
    return 2 * nao * nao * nmo + nao * nmo * (nmo + 1)


def pair_flops(nao: int, nz: int, nw: int, same: bool) -> int:
    """Flops of one row (pq|lam sig) -> (pq|rs), r over ``nz``, s over ``nw`` orbitals
    (``same``: the same orbitals, r >= s packed), as ``_ao2mo.nr_e2`` runs it."""
    if same:
        return half_flops(nao, nz)
    return 2 * nao * nao * min(nz, nw) + 2 * nao * nz * nw


def half_rows(eri_s8: np.ndarray, coeff: np.ndarray, pairs: np.ndarray, threads: int) -> np.ndarray:
    """H[u, pq] = (pq|u) for the AO pairs ``pairs`` (packed index, ascending) and all
    p >= q of ``coeff``'s orbitals, from the 8-fold AO integrals: PySCF's e1 kernel on
    pieces of at most 32 consecutive pairs, handed to ``threads`` threads of one OpenMP
    thread each as they come free (with point-group orbits the runs of pairs are mostly
    short; and a loaded machine delays one OpenMP thread of a static split, which the
    others wait for, where here the free thread takes the next piece)."""
    nao, nmo = coeff.shape
    out = base_pages((len(pairs), nmo * (nmo + 1) // 2))
    mo = np.asarray(coeff, order="F")
    fdrv = _ao2mo.libao2mo.AO2MOnr_e1incore_drv
    ftrans = _ao2mo.libao2mo.AO2MOtranse1_incore_s8
    fmmm = _ao2mo.libao2mo.AO2MOmmm_nr_s2_s2
    starts = np.flatnonzero(np.diff(pairs, prepend=-2) != 1)
    stops = np.append(starts[1:], len(pairs))
    pieces = [(p, min(p + 32, stop)) for start, stop in zip(starts, stops)
              for p in range(start, stop, 32)]

    def piece(ab):
        a, b = ab
        with lib.with_omp_threads(1):
            fdrv(ftrans, fmmm, out[a:b].ctypes.data_as(ctypes.c_void_p),
                 eri_s8.ctypes.data_as(ctypes.c_void_p), mo.ctypes.data_as(ctypes.c_void_p),
                 ctypes.c_int(int(pairs[a])), ctypes.c_int(int(b - a)), ctypes.c_int(nao),
                 ctypes.c_int(0), ctypes.c_int(nmo), ctypes.c_int(0), ctypes.c_int(nmo))

    with ThreadPoolExecutor(max(1, int(threads))) as pool:
        list(pool.map(piece, pieces))
    return out


def ao_pair_units(ao_loc, max_cols: int, keep=None) -> list:
    """The AO integral work units: [(l, s0, s1, diagonal, ncols)].

    Shell pairs (l, s), s <= l, in (l, s) order (only those with ``keep[l, s]`` when
    given); a diagonal shell pair (s = l) is a unit of its own, consecutive others of one
    l are grouped into units of at most ``max_cols`` AO pairs (at least one shell pair).
    A unit's columns are the AO pairs (lam, sig) in libcint's order (lam-major; lam >=
    sig within a diagonal shell pair).
    """
    size = np.diff(np.asarray(ao_loc, dtype=np.int64))
    units = []
    for l in range(len(size)):
        s0, ncols = 0, 0
        for s in range(l):
            cost = int(size[l] * size[s])
            if ncols and (ncols + cost > max_cols or (keep is not None and not keep[l, s])):
                units.append((l, s0, s, False, ncols))
                ncols = 0
            if keep is not None and not keep[l, s]:
                continue
            if not ncols:
                s0 = s
            ncols += cost
        if ncols:
            units.append((l, s0, l, False, ncols))
        if keep is None or keep[l, l]:
            units.append((l, l, l + 1, True, int(size[l] * (size[l] + 1) // 2)))
    return units


def _unit_tril(ao_loc, unit) -> np.ndarray:
    """Packed AO-pair index lam(lam+1)/2 + sig of each column of a unit."""
    l, s0, s1, diag, _ = unit
    a0, a1 = int(ao_loc[l]), int(ao_loc[l + 1])
    if diag:
        lam, sig = np.tril_indices(a1 - a0)
        lam, sig = lam + a0, sig + a0
    else:
        lam = np.repeat(np.arange(a0, a1), ao_loc[s1] - ao_loc[s0])
        sig = np.tile(np.arange(ao_loc[s0], ao_loc[s1]), a1 - a0)
    return lam * (lam + 1) // 2 + sig


class _Half:
    """The half-transformed rows of one class: H[(P Q) row group, unit]."""

    def __init__(self, name, t, index):
        groups: dict = {}
        # (pq|rs) = (qp|rs): when p and q run over the same space only groups P >= Q are
        # transformed; the finish writes the (Q, P) blocks as transposes
        self.mirror = name[0] == name[1]
        for key in t.stored_keys():         # a canonical tensor: its canonical blocks only
            if not self.mirror or key[0] >= key[1]:
                groups.setdefault(key[:2], []).append(key)
        self.name, self.t, self.gkeys = name, t, sorted(groups)
        self.groups = [groups[g] for g in self.gkeys]
        sp = t.spaces
        self.rows = np.concatenate([pair_index(index[name[0]][sp[0].slice(P)],
                                               index[name[1]][sp[1].slice(Q)]).ravel()
                                    for P, Q in self.gkeys]) if self.gkeys else np.zeros(0, np.int64)
        self.sizes = [sp[0].tiles[P].size * sp[1].tiles[Q].size for P, Q in self.gkeys]
        self.bounds = np.concatenate([[0], np.cumsum(self.sizes)]).astype(int)
        self.home, self.H = (0,) * len(self.groups), None

    def place(self, home, units_space) -> None:
        """Lay out H: row group g on rank ``home[g]`` (collective when distributed)."""
        self.home = tuple(home)
        self.H = BlockTensor((IndexSpace.uniform(f"rows-{self.name}", self.sizes), units_space), 0,
                             name=f"half-{self.name}", placement=("rows", self.home))


class ClassTransform:
    """Both task sets of one transformation (module docstring) and their counts."""

    def __init__(self, mol, coeff, index, tensors, slab_bytes: int, nranks: int,
                 in_memory: bool = False, omp: int = 1, orbits=None):
        self.mol, self.coeff, self.index = mol, coeff, index
        self.omp = max(1, int(omp))          # OpenMP threads of each task's library calls
        nao, self.nact = coeff.shape
        self.npair = npair = nao * (nao + 1) // 2
        self.nact_pair = self.nact * (self.nact + 1) // 2
        self.intor = mol._add_suffix("int2e")
        self.ao_loc = moleintor.make_loc(mol._bas, self.intor)
        self.halves = [_Half(name, t, index) for name, t in tensors.items() if t.allowed_keys()]
        self.rep_rows = None                # in memory (A): (pq|u), (AO pair u, pq), all p >= q
        self.rep_blocks = None              # the same with orbits, by classes (class_blocks)
        self.orbits = orbits                # point-group orbits of the AO pairs (ao2mo_symmetry)
        self.units = []
        if not in_memory:
            # units of at most slab/2 bytes, and enough of them to spread over the ranks;
            # with orbits those of the representative shell pairs only
            max_cols = max(1, min(slab_bytes // (16 * npair), npair // (4 * nranks)))
            keep = None if orbits is None else orbits.rep_shell_pairs
            self.units = ao_pair_units(self.ao_loc, max_cols, keep)
            col_tril = np.concatenate([_unit_tril(self.ao_loc, u) for u in self.units])
            self.col_of_tril = np.zeros(npair, dtype=np.int64)
            self.col_of_tril[col_tril] = np.arange(col_tril.size)          # tril order -> column
            if orbits is not None:             # the columns in the orbits' order
                self.col_of_tril = self.col_of_tril[orbits.reps]
            units_space = IndexSpace.uniform("ao-pairs", [u[4] for u in self.units])
            # the row groups of all classes balanced over all ranks, largest first
            groups = [(h, g) for h in self.halves for g in range(len(h.groups))]
            home = np.zeros(len(groups), dtype=int)
            for rank, queue in enumerate(partition([h.sizes[g] for h, g in groups], nranks)):
                home[queue] = rank
            start = 0
            for h in self.halves:
                h.place(home[start:start + len(h.groups)], units_space)
                start += len(h.groups)
        self.row_chunk = max(1, slab_bytes // (16 * npair))
        self.cintopt = moleintor.make_cintopt(mol._atm, mol._bas, mol._env, self.intor)
        self.local = threading.local()              # per-thread scratch buffers
        self.lock = threading.Lock()
        self.computed = self.columns = 0            # this rank's AO integrals and AO-pair columns
        self.flops = {"half": 0, "finish": 0}       # this rank's, by half

    def in_omp(self, work):
        """``work`` run with this transform's OpenMP threads (a per-thread setting)."""
        def run(i, blocks):
            with lib.with_omp_threads(self.omp):
                return work(i, blocks)
        return run

    def scratch(self, name: str, shape: tuple) -> np.ndarray:
        bufs = self.local.__dict__.setdefault("bufs", {})
        size = int(np.prod(shape))
        buf = bufs.get(name)
        if buf is None or buf.size < size:
            buf = bufs[name] = np.empty(size)
        return buf[:size].reshape(shape)

    # -- A: the 8-fold AO integrals in memory, half-transformed at once ---------------
    def half_in_memory(self, eri_s8, threads: int) -> None:
        """rep_rows[u, pq] = (pq|u) for all active p >= q from the 8-fold AO integrals, u
        over all AO pairs; with point-group orbits ``rep_blocks`` instead, over their
        representative pairs only, by classes (``class_blocks``): a block (p in a, q in
        b) of a pair u is c_a^T X_u[AOs of a, AOs of b] c_b (an orbital's coefficients
        lie on the AOs of its class), two GEMMs per piece of 32 pairs on the threads;
        3.3 against 8.3 GFLOP on benzene cc-pVDZ by PySCF's s2 kernel over all pairs."""
        nao = len(self.coeff)
        if self.orbits is None:
            self.rep_rows = half_rows(eri_s8, self.coeff, np.arange(self.npair), threads)
            self.count("half", half_flops(nao, self.nact) * self.npair)
            return
        blocks = self.class_blocks()
        if len(self.class_mos) == 1:        # no class: all p >= q by PySCF's s2 kernel
            self.rep_pos = np.arange(len(self.orbits.reps))
            self.rep_blocks = {(0, 0, 0): half_rows(eri_s8, self.coeff, self.orbits.reps, threads)}
            self.count("half", half_flops(nao, self.nact) * len(self.orbits.reps))
            return
        self.rep_blocks = {key: base_pages((len(self.orbits.reps[rows]), len(self.class_mos[key[1]]),
                                            len(self.class_mos[key[2]]))) for key, rows in blocks.items()}
        # per class coefficients of its orbitals on its AOs (zero on the others)
        aos = {a: np.flatnonzero(self.orbits.ao_class == a) for a in self.class_mos}
        coef = {a: np.ascontiguousarray(self.coeff[np.ix_(aos[a], mos)]) for a, mos in self.class_mos.items()}
        pieces = [(kappa, rows[i:i + 32]) for kappa, rows in self.class_rows.items()
                  for i in range(0, len(rows), 32)]
        # a row's packed AO pairs (k in a, l in b), k-major: gathered from the packed row
        # at once (no unpacked nao x nao row, then its class block: one pass, not three)
        cols = {(a, b): pair_index(aos[a], aos[b]).ravel() for kappa in self.class_rows
                for a, b in self.class_pairs[kappa]}
        unpack_row = lib.numpy_helper._np_helper.NPdunpack_row   # lib.unpack_row, into a given row
        eri_s8 = np.ascontiguousarray(eri_s8, dtype=np.float64)     # read by pointer (as libcint and the SCF give them: no copy)
        eri_ptr, npair = eri_s8.ctypes.data_as(ctypes.c_void_p), ctypes.c_int(self.npair)

        def piece(item):
            kappa, rows = item
            r = self.rep_pos[rows]
            x = self.scratch("rows", (len(rows), self.npair))
            for i, u in enumerate(self.orbits.reps[rows].tolist()):
                unpack_row(npair, ctypes.c_int(u), eri_ptr, x[i].ctypes.data_as(ctypes.c_void_p))
            with lib.with_omp_threads(1):
                for a, b in self.class_pairs[kappa]:       # (AOs of a, AOs of b) of each row
                    xs = lib.take_2d(x, np.arange(len(rows)), cols[a, b]).reshape(-1, len(aos[b]))
                    t = (xs @ coef[b]).reshape(len(rows), len(aos[a]), -1)
                    self.rep_blocks[kappa, a, b][r[0]:r[-1] + 1] = np.matmul(coef[a].T, t)
                    self.count("half", len(rows) * 2 * len(aos[a]) * coef[b].shape[1]
                               * (len(aos[b]) + coef[a].shape[1]))

        with thread_limit(1), ThreadPoolExecutor(max(1, int(threads))) as pool:
            list(pool.map(piece, pieces))

    def class_blocks(self) -> dict:
        """{(class k of the AO pairs, a, b): rows of ``orbits.reps`` of class k}: the
        blocks (p in class a, q in class b, a <= b) that class k meets (a x b = k). Sets
        ``class_mos`` (class -> its orbitals, ascending), ``mo_pos`` (an orbital's
        position there), ``class_rows`` (k -> its rows), ``class_pairs`` (k -> its (a, b))
        and ``rep_pos`` (a representative pair's row among those of its class)."""
        o = self.orbits
        mo_class = np.array([o.irrep_class[r] for r in o.orbital_irrep], dtype=np.int64)
        self.class_mos = {a: np.flatnonzero(mo_class == a) for a in np.unique(mo_class).tolist()}
        self.mo_class, self.mo_pos = mo_class, np.zeros(self.nact, dtype=np.int64)
        for mos in self.class_mos.values():
            self.mo_pos[mos] = np.arange(len(mos))
        self.rep_pos = np.zeros(len(o.reps), dtype=np.int64)
        self.class_rows, self.class_pairs, blocks = {}, {}, {}
        for kappa in np.unique(o.rep_class).tolist():
            rows = self.class_rows[kappa] = np.flatnonzero(o.rep_class == kappa)
            self.rep_pos[rows] = np.arange(len(rows))
            self.class_pairs[kappa] = [(a, a ^ kappa) for a in self.class_mos
                                       if a ^ kappa in self.class_mos and a <= a ^ kappa]
            for a, b in self.class_pairs[kappa]:
                blocks[kappa, a, b] = rows
        return blocks

    def block_columns(self, p, q) -> tuple:
        """(key of ``rep_blocks``, columns there) of the pairs (p, q) for p in ``p``, q in
        ``q`` (p-major), orbitals of one class each."""
        if len(self.class_mos) == 1:
            return (0, 0, 0), pair_index(p, q).ravel()
        a, b = int(self.mo_class[p[0]]), int(self.mo_class[q[0]])
        pp, pq_ = self.mo_pos[p], self.mo_pos[q]
        if a <= b:
            return (a ^ b, a, b), (pp[:, None] * len(self.class_mos[b]) + pq_[None, :]).ravel()
        return (a ^ b, b, a), (pq_[None, :] * len(self.class_mos[a]) + pp[:, None]).ravel()

    def count(self, half: str, flops: int) -> int:
        with self.lock:
            self.flops[half] += flops
        return flops

    # -- B, task set 1: AO integrals of one unit, half-transformed, rows to their owners ---
    def ao_tasks(self) -> TaskSet:
        return TaskSet("transform: AO integrals", [u[4] for u in self.units], self.in_omp(self.ao_unit),
                       schedule="static", progress=True, flops=lambda: self.flops["half"])   # costs are exact: a balanced split needs no counter

    def ao_unit(self, i: int, _blocks) -> float:
        l, s0, s1, diag, n = self.units[i]
        mol = self.mol
        ao = moleintor.getints(self.intor, mol._atm, mol._bas, mol._env,
                               (l, l + 1, s0, s1, 0, mol.nbas, 0, mol.nbas),
                               aosym="s4" if diag else "s2kl", cintopt=self.cintopt).reshape(n, self.npair)
        half = _ao2mo.nr_e2(ao, self.coeff, (0, self.nact, 0, self.nact), "s2kl", "s2",
                            out=self.scratch("half", (n, self.nact_pair)))
        flops = self.count("half", half_flops(len(self.coeff), self.nact) * n)
        with self.lock:
            self.computed += ao.size
            self.columns += n
        del ao
        half_t = lib.transpose(half, out=self.scratch("half_t", (self.nact_pair, n)))
        for h in self.halves:
            rows = np.take(half_t, h.rows, axis=0, mode="clip")
            for g in range(len(h.groups)):
                h.H.put_block((g, i), rows[h.bounds[g]:h.bounds[g + 1]])
        return float(flops)

    def row_chunk_of(self, h, g: int, r0: int, r1: int) -> np.ndarray:
        """Rows r0:r1 of group g of class half h, (r1 - r0, AO pairs), AO pairs in packed
        order (with orbits: the representatives, ``orbits.reps``)."""
        width = self.npair if self.orbits is None else len(self.orbits.reps)
        out = self.scratch("tril", (r1 - r0, width))
        if self.rep_rows is not None:
            b = h.bounds[g]
            return lib.transpose(self.rep_rows[:, h.rows[b + r0:b + r1]], out=out)
        cols = np.concatenate([h.H.blocks[(g, u)][r0:r1] for u in range(len(self.units))], axis=1,
                              out=self.scratch("cols", (r1 - r0, width)))
        return np.take(cols, self.col_of_tril, axis=1, mode="clip", out=out)

    # -- task set 2: finish the row groups where their rows are ------------------------
    def finish_tasks(self) -> TaskSet:
        # a task per first-pair group (P, Q) of a class; from the in-memory rows with orbits
        # one per (P, Q) of all classes with those first pairs (oooo and oovv; ovoo, ovov
        # and ovvv), which share the group's rows and their SO products (``_finish_so``)
        work: dict = {}
        for h in self.halves:
            for g in range(len(h.groups)):
                key = (h.name[:2],) + h.gkeys[g] if self.rep_blocks is not None else (h.name, g)
                work.setdefault(key, []).append((h, g))
        self.work = list(work.values())
        costs = [sum((h.bounds[g + 1] - h.bounds[g]) * self.npair for h, g in w) for w in self.work]
        return TaskSet("transform: finish", costs, self.in_omp(self.finish_group),
                       home=[w[0][0].home[w[0][1]] for w in self.work], progress=True,
                       flops=lambda: self.flops["finish"])

    def finish_group(self, j: int, _blocks) -> float:
        """(P Q | lam sig) rows of one first-pair group -> the blocks (P Q | R S) of each
        class of the task (``finish_tasks``)."""
        shared: dict = {}            # what the classes share: the group's rows, their SO products
        return float(self.count("finish", sum(self._finish_class(h, g, shared) for h, g in self.work[j])))

    def _finish_class(self, h, g: int, shared: dict) -> int:
        """The blocks (P Q | R S) of group g of class half h; returns their flops."""
        t, keys = h.t, h.groups[g]
        sp = t.spaces
        npq = int(h.bounds[g + 1] - h.bounds[g])
        by_irrep: dict = {}
        for key in keys:
            by_irrep.setdefault((sp[2].tiles[key[2]].irrep, sp[3].tiles[key[3]].irrep), []).append(key)
        # per irrep pair the span of the tiles its blocks need (contiguous: the orbitals of
        # an irrep are; a canonical class needs only part of an irrep's tiles)
        spans = {hh: (_span(sp[2], [k[2] for k in hkeys]), _span(sp[3], [k[3] for k in hkeys]))
                 for hh, hkeys in by_irrep.items()}
        out = {key: np.empty((npq,) + t.block_shape(key)[2:]) for key in keys}
        if self.orbits is not None:          # through the SO basis (chem/ao2mo_symmetry.py)
            flops = self._finish_so(h, g, npq, by_irrep, spans, out, shared)
        else:
            flops = self._finish_ao(h, g, npq, by_irrep, spans, out)
        for key, blk in out.items():
            blk = blk.reshape(t.block_shape(key))
            t.put_block(key, blk)
            if h.mirror and key[0] > key[1] and not t.aliases:   # (Q P|R S) = (P Q|R S) transposed
                t.put_block((key[1], key[0]) + key[2:], np.ascontiguousarray(blk.transpose(1, 0, 2, 3)))
        return flops

    def _finish_so(self, h, g, npq, by_irrep, spans, out, shared) -> int:
        """Finish from the representative AO pairs' rows, one SO irrep pair at a time;
        returns its flops. ``shared``: the rows and Y_RS (``PairOrbits.so_rows``) of the
        group's first pairs, made by the first class of the task that needs them."""
        name, sp = h.name, h.t.spaces
        # the representative pairs that can meet this group's pairs pq (all its irrep pairs
        # are of one irrep: P x Q), the others' rows are zero by symmetry
        reps = self.orbits.reps_of(*next(iter(by_irrep)))
        iz, iw = self.index[name[2]], self.index[name[3]]
        if "rows" not in shared and self.rep_blocks is not None:
            P, Q = h.gkeys[g]
            key, cols = self.block_columns(self.index[name[0]][sp[0].slice(P)],
                                           self.index[name[1]][sp[1].slice(Q)])
            # (reps, npq) C-contiguous (the sparse products, one per irrep pair, would each
            # copy a strided view), by PySCF's C gather: 2.5x faster than np.take
            blk = self.rep_blocks[key]
            if np.any(self.orbits.rep_class[reps] != key[0]):    # take_2d does not check bounds
                raise SymmetryError(f"transform: representative AO pairs of another class meet "
                                    f"irreps {tuple(by_irrep)}; the point-group tables disagree")
            shared["rows"] = lib.take_2d(blk.reshape(len(blk), -1), self.rep_pos[reps], cols)
        elif "rows" not in shared:
            shared["rows"] = np.take(lib.transpose(self.row_chunk_of(h, g, 0, npq)), reps, axis=0)
        flops = 0
        for (hz, hw), hkeys in by_irrep.items():
            (z0, z1), (w0, w1) = spans[(hz, hw)]
            if (hz, hw) not in shared:
                shared[hz, hw] = self.orbits.so_rows(shared["rows"], hz, hw)
                flops += self.orbits.so_rows_flops(hz, hw, npq)
            res = self.orbits.finish(shared[hz, hw], hz, hw, iz[z0:z1], iw[w0:w1])
            flops += self.orbits.finish_flops(hz, hw, z1 - z0, w1 - w0, npq)
            for key in hkeys:
                out[key][:] = res[:, slice(*_rel(sp[2], key[2], z0)), slice(*_rel(sp[3], key[3], w0))]
        return flops

    def _finish_ao(self, h, g, npq, by_irrep, spans, out) -> int:
        """Finish from all AO pairs' rows, in chunks of rows, one irrep pair at a time;
        returns its flops."""
        name, sp = h.name, h.t.spaces
        cz, cw = self.coeff[:, self.index[name[2]]], self.coeff[:, self.index[name[3]]]
        same_space = name[2] == name[3]
        flops = npq * sum(pair_flops(len(self.coeff), z1 - z0, w1 - w0, same_space and (z0, z1) == (w0, w1))
                          for (z0, z1), (w0, w1) in spans.values())
        for r0 in range(0, npq, self.row_chunk):
            r1 = min(r0 + self.row_chunk, npq)
            tril = self.row_chunk_of(h, g, r0, r1)
            for (hz, hw), hkeys in by_irrep.items():
                (z0, z1), (w0, w1) = spans[(hz, hw)]
                if same_space and (z0, z1) == (w0, w1):
                    n = z1 - z0
                    res = _ao2mo.nr_e2(tril, cz[:, z0:z1], (0, n, 0, n), "s2kl", "s2",
                                       out=self.scratch("res", (r1 - r0, n * (n + 1) // 2)))
                    for key in hkeys:
                        rs = pair_index(np.arange(*_rel(sp[2], key[2], z0)), np.arange(*_rel(sp[3], key[3], z0)))
                        out[key][r0:r1] = res[:, rs.ravel()].reshape((r1 - r0,) + rs.shape)
                else:
                    nz, nw = z1 - z0, w1 - w0
                    res = _ao2mo.nr_e2(tril, np.hstack([cz[:, z0:z1], cw[:, w0:w1]]), (0, nz, nz, nz + nw),
                                       "s2kl", "s1", out=self.scratch("res", (r1 - r0, nz * nw)))
                    res = res.reshape(r1 - r0, nz, nw)
                    for key in hkeys:
                        out[key][r0:r1] = res[:, slice(*_rel(sp[2], key[2], z0)), slice(*_rel(sp[3], key[3], w0))]
        return flops


def transform_classes(context, mol, coeff, index, tensors, slab_bytes: int,
                      in_memory: bool = False, kept=None) -> dict:
    """Fill the class tensors (local or distributed) on ``context``; collective under MPI.
    ``in_memory``: the 8-fold AO integrals in memory (A; a local context only), those of
    ``kept`` (``reference.KeptIntegrals``, taken) when it still holds them; else AO units (B).
    With point-group symmetry the half transform takes one AO pair per orbit in memory,
    the shell pairs of one shell pair per orbit by units (``ao2mo_symmetry``). Returns
    this rank's counts: AO integrals computed (packed as computed: 8-fold in memory,
    4-fold by units), AO-pair columns, bytes of half-transformed rows held; and the flops
    of both halves over all ranks (the products of the half and finish kernels, the
    sparse SO maps' multiply-adds included; not the AO integrals), each half's too, and
    each half's wall seconds on this rank (by units the first half's include computing the
    AO integrals; the finish's, writing the blocks)."""
    ranks = context.ranks
    # ranks x task workers x OpenMP threads <= the threads of the rank
    threads = threads_of(context.executor.name, context.distributed)
    workers = 1 if context.distributed else getattr(context.executor, "workers", 1)
    # with point-group orbits, the orbitals in space order (each space's tiles in turn, an
    # irrep's contiguous): a row group's pairs pq are then runs of consecutive packed
    # pairs, which the SO finish gathers from the half-transformed rows (not single columns
    # scattered by orbital energy); without, the orbitals as given
    given = np.ascontiguousarray(coeff), index
    order = np.concatenate([index[ch] for ch in index])
    if np.array_equal(np.sort(order), np.arange(coeff.shape[1])):
        starts = np.cumsum([0] + [len(index[ch]) for ch in index])
        coeff = coeff[:, order]
        index = {ch: np.arange(a, b) for ch, a, b in zip(index, starts, starts[1:])}
    coeff = np.ascontiguousarray(coeff)
    orbsym = np.zeros(coeff.shape[1], dtype=np.int64)        # the irreps of the class tiles
    for name, t in tensors.items():
        for ch, sp in zip(name, t.spaces):
            for tile in range(len(sp.tiles)):
                orbsym[index[ch][sp.slice(tile)]] = sp.tiles[tile].irrep
    orbits = pair_orbits(mol, coeff, not in_memory, orbsym)
    if orbits is None:
        coeff, index = given
    job = ClassTransform(mol, coeff, index, tensors, slab_bytes, ranks.size, in_memory=in_memory,
                         omp=threads // workers, orbits=orbits)
    if in_memory:
        eri = kept.take() if kept is not None else None
        if eri is None:
            with lib.with_omp_threads(threads):
                eri = moleintor.getints(job.intor, mol._atm, mol._bas, mol._env, aosym="s8")
            job.computed = eri.size
        t0 = time.perf_counter()
        job.half_in_memory(eri, threads)
        half_s = time.perf_counter() - t0
        context.record("transform: half in memory", half_s, job.flops["half"], t0)
        del eri                                    # no AO integrals while MO blocks exist
        if job.rep_blocks is None:
            job.columns, held = len(job.rep_rows), job.rep_rows.nbytes
        else:
            job.columns = len(job.orbits.reps)
            held = sum(a.nbytes for a in job.rep_blocks.values())
        flops = job.flops["half"]
    else:
        t0 = time.perf_counter()
        flops = context.run_tasks(job.ao_tasks()).sum()         # every rank's
        half_s = time.perf_counter() - t0
        held = 0
        for h in job.halves:
            if h.H.dist is not None:
                h.H.dist.sync()
            held += h.H.local_nbytes
    t0 = time.perf_counter()
    finish_flops = context.run_tasks(job.finish_tasks()).sum()
    finish_s = time.perf_counter() - t0
    for h in job.halves:
        if h.H is not None:
            h.H.release()
    job.rep_rows = job.rep_blocks = None
    for t in tensors.values():
        if t.dist is not None:
            t.dist.sync()
    return {"ao_integrals": "in memory" if in_memory else "units",
            "ao_integrals_from_scf": bool(in_memory and not job.computed),
            "ao_integrals_computed": int(job.computed),
            "ao_integrals_total": int(job.npair * (job.npair + 1) // 2 if in_memory
                                      else job.npair * sum(u[4] for u in job.units)),
            "ao_pair_columns": int(job.columns), "ao_pairs": int(job.npair),
            "half_bytes_held": int(held), "ranks": int(ranks.size),
            "rows_finished": int(sum(h.sizes[g] for h in job.halves for g in range(len(h.groups))
                                     if h.home[g] == ranks.rank)),
            "flops": int(flops + finish_flops), "half_flops": int(flops), "finish_flops": int(finish_flops),
            "half_s": half_s, "finish_s": finish_s}


def _span(space, tiles) -> tuple:
    """(first, stop) positions spanning the given tiles of a space."""
    return (min(space.tiles[t].offset for t in tiles),
            max(space.tiles[t].offset + space.tiles[t].size for t in tiles))


def _rel(space, tile: int, start: int) -> tuple:
    """(first, stop) of a tile's positions relative to ``start``."""
    s = space.slice(tile)
    return s.start - start, s.stop - start
