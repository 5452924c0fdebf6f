"""Perturbative triples correction (T) for closed-shell CCSD, point-group blocked.

Raghavachari, Trucks, Pople, Head-Gordon, Chem. Phys. Lett. 157, 479 (1989); the
closed-shell (spin-adapted) form of Rendell, Lee, Komornicki, Chem. Phys. Lett. 178,
462 (1991), in the arrangement of PySCF's ``cc/ccsd_t_slow.py``.  With (pq|rs) in
chemists' notation, real canonical orbitals (f_ia = 0) and, for occupied i, j, k and
virtual a, b, c::

    W0[abc;ijk] = sum_f (ia|bf) t2[kjcf] - sum_m (ia|jm) t2[mkbc]
    W[abc;ijk]  = sum over the 6 simultaneous permutations of (ia), (jb), (kc) of W0
    V[abc;ijk]  = t1[ia] (jb|kc) + t1[jb] (ia|kc) + t1[kc] (ia|jb)
    r3(X)[abc]  = 4X[abc] + X[bca] + X[cab] - 2X[acb] - 2X[cba] - 2X[bac]
    E(T)        = 1/3 sum_ijk sum_abc W r3(W + V) / (e_i + e_j + e_k - e_a - e_b - e_c)

The sum over abc is invariant under permutations of ijk, so only orbital triples
i >= j >= k are visited (weight 6, 3 or 1).  For one ijk only the virtual triples with
g_a^g_b^g_c = g_i^g_j^g_k exist; they are stored packed, one block per irrep of a
"single" virtual s, each [n_s, (t, u) pairs of the complementary irrep], never as a
dense v^3 array.  The twelve W0 terms are sector GEMMs accumulated in place (beta = 1),
four per choice of single index (a, b or c).  The compiled sweep (``triples_kernel.c``
through ``chem.triples_native``) joins the three layouts into W, adds V and applies r3
and the denominators in one pass over the orbits a >= b >= c, tile triple by tile triple:
[v, v, v] arrays with one virtual irrep (C1); with several, W is formed once per triple
from the packed layouts, ordered irrep block by block, and read in place through the
strides of its irrep blocks (tiles within irreps).  On the fused operands of resident
slabs one call per batch runs its GEMMs and sweeps in C (``triples_native.batch_packed``;
C1: ``batch_dense``, the GEMMs shared over layouts and k).

Kernel API (fed by ``chem.triples_tasks``): :class:`VirtualLayout`
(packed layouts), :class:`RowSlab` (the operands of a range of occupied orbitals, built
from the rows of the blocks whose first index is occupied), :class:`KernelInputs` (what
the kernel reads, per occupied orbital) and :class:`TripleKernel` (E(T) of the orbital
triples of a task).  The kernel only reads the rows of the orbitals it is given, so
the same code runs on rows of local tensors and on one task's fetched rows.
:func:`triples_correction` is the one driver: tasks are the unique triples of occupied
task tiles (one irrep each), run by ``Context.run_tasks`` on any backend; each thread
keeps buffers of a few packed v^3 / nirrep arrays.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace

import numpy as np
from scipy.linalg.blas import dgemm

from tessera.backends.machine import planning
from tessera.chem.triples_native import (batch_dense, batch_packed, dense_scratch_size, energy_dense,
                                         energy_packed, packed_scratch_size, require)
from tessera.errors import InputError, ShapeError

__all__ = ["TriplesResult", "triples_correction", "NIRREP", "SOURCES", "irrep_ranges",
           "default_occ_tile", "check_occ_tile", "VirtualLayout", "RowSlab",
           "SwappedRows", "KernelInputs", "KernelPool", "TripleKernel"]

_log = logging.getLogger(__name__)
NIRREP = 8                        # irrep labels are bits of D2h and its subgroups
SOURCES = ("ovvv", "t2", "ovov", "ovoo")   # the four-index tensors (T) reads, occupied index first


@dataclass(frozen=True)
class TriplesResult:
    """E(T) and what it took; the bytes the ranks held (of (T) operands: fetched rows,
    RowSlabs, cache and scratch rows) are set for distributed tensors only."""

    energy: float                 # E(T) in hartree
    flops: int                    # GEMM flops actually done (all ranks)
    tasks: int                    # task tile triples run
    seconds: float                # wall time of the whole correction
    minimal_flops: int = 0        # the least GEMM flops of (T) on this block structure
    task_tile: int = 0            # occupied orbitals per task tile
    peak_operand_bytes: int = 0                  # max over ranks
    rank_peak_operand_bytes: tuple = ()          # per rank
    peak_share: dict = field(default_factory=dict)   # source -> max over ranks of peak held / whole tensor
    whole_bytes: dict = field(default_factory=dict)  # source -> bytes of the whole tensor
    cache_bytes: int = 0                         # cache limit per rank (bytes)
    kernel_buffer_bytes: int = 0                 # per thread of a rank
    virtual_block: int = 0                       # virtual orbitals per block (0: the whole space)
    rank_read_bytes: tuple = ()                  # per rank: rows its windowed tasks read (chem.triples_window)
    rank_runs: tuple = ()                        # per rank: (start, stop) of the windowed task ids it ran, in order
    rank_stolen: tuple = ()                      # per rank: of those, tasks taken from another rank's queue
    stages: int = 1                              # chunks of the contracted indices per windowed task (chem.triples_stream)


# --------------------------------------------------------------------------- layouts
def irrep_ranges(space, what: str) -> np.ndarray:
    """[NIRREP, 2] (start, stop) of every irrep's positions in ``space`` (each irrep must be
    contiguous, as IndexSpace.from_irreps makes them); (0, 0) for an absent irrep."""
    rng = np.zeros((NIRREP, 2), dtype=np.int64)
    irreps = space.irreps
    if len(irreps) and not 0 <= irreps.min() <= irreps.max() < NIRREP:
        raise InputError(f"{what} irrep labels {sorted(set(irreps.tolist()))} are not D2h bit labels "
                         f"0..7; use an Abelian point group (e.g. D2h for linear molecules)")
    for g in range(NIRREP):
        pos = np.flatnonzero(irreps == g)
        if len(pos):
            if pos[-1] - pos[0] + 1 != len(pos):
                raise InputError(f"{what} orbitals of irrep {g} are not contiguous in space "
                                 f"{space.name!r}; build the spaces with IndexSpace.from_irreps")
            rng[g] = pos[0], pos[-1] + 1
    return rng


class VirtualLayout:
    """Packed layouts of the kernel, built from the irrep ranges of both spaces.

    Virtual pairs of irrep h: (t, u) with g_t^g_u = h, by g_t, then t, then u; the block
    of g_t starts at ``poff[h, g_t]``, ``npair[h]`` pairs in all.  Mixed pairs (virtual s,
    occupied m) of irrep h: by g_s, then s, then m; offset ``vooff[h, g_s]``, ``nvo[h]`` in
    all.  Virtual triples of irrep G: one block per irrep g_s of the single index,
    [n_s, pairs of G^g_s], at ``foff[G, g_s]``, ``ntrip[G]`` in all.  ``prepare(G)`` adds
    what the kernel needs for G (``maps[G]``).
    """

    def __init__(self, vrange: np.ndarray, irreps: np.ndarray, ev: np.ndarray, orange: np.ndarray):
        self.vr, self.orange, self.irrep, self.ev, self.maps = vrange, orange, irreps, ev, {}
        self.n = n = vrange[:, 1] - vrange[:, 0]
        self.no = no = orange[:, 1] - orange[:, 0]
        xor = np.bitwise_xor.outer(np.arange(NIRREP), np.arange(NIRREP))
        offsets = (lambda sz: np.vstack([np.zeros(NIRREP, np.int64), np.cumsum(sz, axis=0)[:-1]]).T)
        sizes = n[:, None] * n[xor]                  # pairs (t, u) of irrep h: [g_t, h] blocks
        self.npair, self.poff = sizes.sum(axis=0), offsets(sizes)              # poff[h, g_t]
        sizes = n[:, None] * no[xor]                 # pairs (s, m) of irrep h: [g_s, h] blocks
        self.nvo, self.vooff = sizes.sum(axis=0), offsets(sizes)               # vooff[h, g_s]
        sizes = n[:, None] * self.npair[xor]         # triples of irrep G: [g_s, G] blocks
        self.ntrip, self.foff = sizes.sum(axis=0), offsets(sizes)              # foff[G, g_s]
        sizes = n[:, None] * (n + no)[xor]           # fused left rows (s, f or m) of irrep h: [g_s, h]
        self.nleft, self.loff = sizes.sum(axis=0), offsets(sizes)              # loff[h, g_s]
        self.c1 = not np.any(irreps) and not np.any(no[1:])      # every orbital of irrep 0
        # the irrep tables of the compiled packed sweep and batch kernel (chem.triples_native)
        self.batch_table = np.concatenate([np.ravel(x).astype(np.int64) for x in (
            n, no, vrange[:, 0], self.npair, self.nleft, n + no, self.poff, self.loff, self.foff)])

    def blocks(self, G: int) -> list:
        """(g_s, offset, n_single, n_pairs) of the non-empty single-irrep blocks of G."""
        return [(gs, int(self.foff[G, gs]), int(self.n[gs]), int(self.npair[G ^ gs]))
                for gs in range(NIRREP) if self.n[gs] and self.npair[G ^ gs]]

    def swap_pairs(self, src: np.ndarray, h: int, out: np.ndarray) -> None:
        """out[:, (u, t)] = src[:, (t, u)] over the packed pairs of irrep h ([rows, npair[h]])."""
        rows = src.shape[0]
        for gt in range(NIRREP):
            gu = gt ^ h
            nt, nu = int(self.n[gt]), int(self.n[gu])
            if nt and nu:
                a, b = int(self.poff[h, gt]), int(self.poff[h, gu])
                out[:, b:b + nu * nt].reshape(rows, nu, nt)[...] = \
                    src[:, a:a + nt * nu].reshape(rows, nt, nu).transpose(0, 2, 1)

    def prepare(self, G: int) -> None:
        """What the kernel needs for G (``maps[G]``): its blocks and whether it is dense (one
        virtual irrep: [v, v, v] arrays); the compiled packed sweep reads the layouts
        through the irrep tables (``batch_table``) alone."""
        if G in self.maps:
            return
        blocks = self.blocks(G)
        dense = len(blocks) == 1 and len(set(self.irrep.tolist())) == 1
        self.maps[G] = dict(blocks=blocks, dense=bool(dense))


# --------------------------------------------------------------------------- operands
class RowSlab:
    """The kernel's operands for the occupied orbitals x0..x1 (one irrep g), packed.

    Lists indexed by an irrep, entries [x1 - x0, ...] (None for an absent irrep):
    ``ov1[g_f]`` [n_f, pairs of g^g_f] = (x p|q f) at pair (p, q);
    ``t2r[g_y]`` [n_y, pairs of g^g_y] = t2[x y p q];
    ``ooL[g_y]`` [n_y, mixed pairs of g^g_y] = (x s|y m) at (s, m);
    ``ovov[g_y]`` [n_y, pairs of g^g_y] = (x a|y b);
    optionally (``add_swapped``) ``ov2`` and ``t2s``: ov1 and t2r with the pairs swapped.
    Every entry holds exactly the symmetry-allowed elements of those rows once; ov1[g_c]
    and t2r[g_c] are views of one array ``stacked[g_c]`` [x, n_c + o_c, pairs] (ov1 over t2r).
    ``add_swapped`` also gives the fused operands of the kernel: ``right_a`` = ``stacked``,
    ``right_b`` = ov2 over t2s (ov2, t2s are views of it), and ``left[g_y]`` [x, n_y, fused left pairs of g^g_y]:
    per single irrep g_s (offset ``loff[h, g_s]``) the rows [s, f + m] = t2[x y s f]
    beside -(x s|y m), so that the four W0 terms of one single index are two GEMMs of
    K = n_c + o_c instead of four of K = n_c or o_c.
    """

    def __init__(self, x0: int, x1: int, g: int, ov1, t2r, ooL, ovov, stacked=None):
        self.x0, self.x1, self.g = x0, x1, g
        self.ov1, self.t2r, self.ooL, self.ovov = ov1, t2r, ooL, ovov
        self.stacked = stacked        # [x, n_c + o_c, pairs] per g_c: ov1 over t2r (they are its views)
        self.ov2 = self.t2s = self.right_a = self.right_b = self.left = None
        self._native_rows = None      # native_rows(), made on first use

    @classmethod
    def from_blocks(cls, lay: VirtualLayout, o, v, x0: int, x1: int, parts: dict) -> "RowSlab":
        """``parts[name]`` (name in SOURCES): (key, rows) for every stored block of that tensor
        whose first (occupied) tile holds x0..x1; ``rows[r]`` is orbital x0 + r of the block.
        Missing blocks are zero."""
        n, no, tx = lay.n, lay.no, x1 - x0
        g = int(o.irreps[x0])
        poff, vooff = lay.poff, lay.vooff
        zeros = (lambda cnt, width: [np.zeros((tx, int(cnt[h]), int(width[g ^ h]))) if cnt[h]
                                     else None for h in range(NIRREP)])
        # ov1[g_c] and t2r[g_c] are the two parts of one [x, n_c + o_c, pairs] array: the fused
        # right operand of the kernel (add_swapped) without a copy
        stacked = zeros(n + no, lay.npair)
        ov1 = [None if a is None or not n[h] else a[:, :n[h]] for h, a in enumerate(stacked)]
        t2r = [None if a is None or not no[h] else a[:, n[h]:] for h, a in enumerate(stacked)]
        ooL, ovov = zeros(no, lay.nvo), zeros(no, lay.npair)

        def rel(space, rng, t):
            tl = space.tiles[t]
            a = tl.offset - int(rng[tl.irrep, 0])
            return tl.irrep, slice(a, a + tl.size)

        vt = (lambda t: rel(v, lay.vr, t))
        ot = (lambda t: rel(o, lay.orange, t))
        for key, blk in parts.get("ovvv", ()):             # blk[x p q f]
            (gp, ps), (gq, qs), (gf, fs) = vt(key[1]), vt(key[2]), vt(key[3])
            p0 = int(poff[gp ^ gq, gp])
            seg = ov1[gf][:, :, p0:p0 + n[gp] * n[gq]].reshape(tx, n[gf], n[gp], n[gq])
            seg[:, fs, ps, qs] = blk.transpose(0, 3, 1, 2)
        for key, blk in parts.get("t2", ()):               # blk[x y p q]
            (gy, ys), (gp, ps), (gq, qs) = ot(key[1]), vt(key[2]), vt(key[3])
            p0 = int(poff[gp ^ gq, gp])
            seg = t2r[gy][:, :, p0:p0 + n[gp] * n[gq]].reshape(tx, no[gy], n[gp], n[gq])
            seg[:, ys, ps, qs] = blk
        for key, blk in parts.get("ovov", ()):             # blk[x a y b]
            (ga, as_), (gy, ys), (gb, bs) = vt(key[1]), ot(key[2]), vt(key[3])
            p0 = int(poff[ga ^ gb, ga])
            seg = ovov[gy][:, :, p0:p0 + n[ga] * n[gb]].reshape(tx, no[gy], n[ga], n[gb])
            seg[:, ys, as_, bs] = blk.transpose(0, 2, 1, 3)
        for key, blk in parts.get("ovoo", ()):             # blk[x s y m]
            (gs, ss), (gy, ys), (gm, ms) = vt(key[1]), ot(key[2]), ot(key[3])
            q0 = int(vooff[gs ^ gm, gs])
            seg = ooL[gy][:, :, q0:q0 + n[gs] * no[gm]].reshape(tx, no[gy], n[gs], no[gm])
            seg[:, ys, ss, ms] = blk.transpose(0, 2, 1, 3)
        return cls(x0, x1, g, ov1, t2r, ooL, ovov, stacked)

    def add_swapped(self, lay: VirtualLayout) -> "RowSlab":
        """Store ov2 and t2s (pair-swapped ov1, t2r) too: the fast form for resident tensors."""
        n, no, tx = lay.n.tolist(), lay.no.tolist(), self.x1 - self.x0
        self.right_a, self.right_b = self.stacked, [None] * NIRREP
        self.ov2, self.t2s = [None] * NIRREP, [None] * NIRREP
        for gc, a in enumerate(self.stacked):       # right_b: right_a with the pairs swapped, in one pass
            if a is None:
                continue
            self.right_b[gc] = b = np.empty_like(a)
            rows = a.shape[0] * a.shape[1]          # not -1: a may hold no pairs (no virtuals of an irrep)
            lay.swap_pairs(a.reshape(rows, a.shape[-1]), self.g ^ gc, b.reshape(rows, a.shape[-1]))
            self.ov2[gc] = b[:, :n[gc]] if n[gc] else None
            self.t2s[gc] = b[:, n[gc]:] if no[gc] else None
        self.left = [None] * NIRREP
        for gy in range(NIRREP):
            if not no[gy]:
                continue
            h = self.g ^ gy
            self.left[gy] = left = np.empty((tx, no[gy], int(lay.nleft[h])))
            for gs in range(NIRREP):
                gc, ns = gs ^ h, n[gs]
                nf, nm = n[gc], no[gc]
                if not ns or not nf + nm:
                    continue
                seg = left[:, :, lay.loff[h, gs]:lay.loff[h, gs] + ns * (nf + nm)].reshape(tx, no[gy], ns, nf + nm)
                p0, q0 = lay.poff[h, gs], lay.vooff[h, gs]
                seg[..., :nf] = self.t2r[gy][:, :, p0:p0 + ns * nf].reshape(tx, no[gy], ns, nf)
                np.negative(self.ooL[gy][:, :, q0:q0 + ns * nm].reshape(tx, no[gy], ns, nm), out=seg[..., nf:])
        return self

    def native_rows(self) -> np.ndarray:
        """[4, x1 - x0, NIRREP] int64: the address of each orbital's row of left, right_a,
        right_b and ovov per irrep (0: none), for ``triples_native.batch_packed``; made once
        (the slab's arrays stay put)."""
        if self._native_rows is None:      # set once filled: threads may share the slab
            tx = self.x1 - self.x0
            rows = np.zeros((4, tx, NIRREP), dtype=np.int64)
            for t, arrs in enumerate((self.left, self.right_a, self.right_b, self.ovov)):
                for g, a in enumerate(arrs):
                    if a is not None:
                        rows[t, :, g] = a.ctypes.data + a.strides[0] * np.arange(tx)
            self._native_rows = rows
        return self._native_rows

    def nbytes(self) -> dict:
        """Bytes held per source tensor (ov2 counts for ovvv, t2s for t2)."""
        size = (lambda *lists: sum(a.nbytes for lst in lists if lst is not None
                                   for a in lst if a is not None))
        fused = self.left is not None               # left holds the t2 and ovoo rows once more
        return {"ovvv": size(self.ov1, self.ov2), "t2": size(self.t2r, self.t2s) + fused * size(self.t2r),
                "ovov": size(self.ovov), "ovoo": (1 + fused) * size(self.ooL)}


class SwappedRows:
    """``rows`` (a per-orbital table of ov1 or t2r) with the pairs swapped, made on access
    into one scratch buffer; the last orbital asked for is kept (one at a time in use)."""

    def __init__(self, rows, irrep, lay: VirtualLayout, scratch: np.ndarray):
        self.rows, self.irrep, self.lay, self.buf = rows, irrep, lay, scratch
        self.last, self.cur = None, None

    def __getitem__(self, x):
        if x == self.last:
            return self.cur
        out, pos, gx = [], 0, self.irrep[x]
        for h2, a in enumerate(self.rows[x]):
            if a is None:
                out.append(None)
                continue
            dst = self.buf[pos:pos + a.size].reshape(a.shape)
            pos += a.size
            self.lay.swap_pairs(a, gx ^ h2, dst)
            out.append(dst)
        self.last, self.cur = x, out
        return out


class KernelInputs:
    """What :class:`TripleKernel` reads, per occupied orbital x (a position in the space).

    ``lay`` (a :class:`VirtualLayout`, prepared for the task's G), ``eo`` [o] and ``t1``
    [o, v] by position, ``irrep`` (list: irrep of each position; ``rel`` its place among
    its irrep's orbitals, derived).  Per-orbital tables, ``table[x][g]`` as in
    :class:`RowSlab`: ``ov1``, ``ov2``, ``t2r``, ``t2s``, ``ooL``, ``ovov``; any object
    with ``[x]`` will do (e.g. :class:`SwappedRows`), and orbitals the kernel is not run
    on may be missing (None).  The kernel reads rows of i, j, k only (over all y).
    Optional: ``right_a``, ``right_b``, ``left``, per orbital x the fused operands of
    :class:`RowSlab` (``[x][g]`` as the tables); given, the kernel uses them.
    ``native_rows`` ([4, o, NIRREP] addresses of their rows and of ovov's, set by
    ``from_slabs``): given, packed batches run in one compiled call.
    """

    def __init__(self, lay, eo, t1, irrep, *, ov1, ov2, t2r, t2s, ooL, ovov,
                 right_a=None, right_b=None, left=None):
        self.lay, self.eo, self.t1 = lay, eo, t1
        self.irrep = [int(g) for g in irrep]
        self.rel = [x - int(lay.orange[g, 0]) for x, g in enumerate(self.irrep)]
        self.ov1, self.ov2, self.t2r, self.t2s, self.ooL, self.ovov = ov1, ov2, t2r, t2s, ooL, ovov
        self.right_a, self.right_b, self.left = right_a, right_b, left
        self.native_rows = None       # with the fused operands of RowSlab s: see from_slabs
        self.occ_table = np.array([self.irrep, self.rel], dtype=np.int64)

    @classmethod
    def from_slabs(cls, lay, eo, t1, irrep, slabs, scratch=None) -> "KernelInputs":
        """Tables from :class:`RowSlab` s (views, no copies).  With ``scratch`` = two flat
        buffers, ov2 and t2s are :class:`SwappedRows` made on access (the slabs need not
        carry them); otherwise the slabs must have ``add_swapped`` done."""
        nocc, slabs = len(irrep), list(slabs)
        names = ["ov1", "ov2", "t2r", "t2s", "ooL", "ovov"]
        if slabs and all(s.left is not None for s in slabs):
            names += ["right_a", "right_b", "left"]
        tables = {name: [None] * nocc for name in names}
        for s in slabs:
            for name, table in tables.items():
                arrs = getattr(s, name)
                if arrs is not None:
                    for x in range(s.x0, s.x1):
                        table[x] = [None if a is None else a[x - s.x0] for a in arrs]
        inp = cls(lay, eo, t1, irrep, **tables)
        if "left" in tables:                          # the compiled batch kernel's row addresses
            inp.native_rows = np.zeros((4, nocc, NIRREP), dtype=np.int64)
            for s in slabs:
                inp.native_rows[:, s.x0:s.x1] = s.native_rows()
        if scratch is not None:
            inp.ov2 = SwappedRows(inp.ov1, inp.irrep, lay, scratch[0])
            inp.t2s = SwappedRows(inp.t2r, inp.irrep, lay, scratch[1])
        return inp


# --------------------------------------------------------------------------- kernel
class KernelPool(list):
    """One thread's kernel buffers (:meth:`TripleKernel.pool_sizes`, in order), kept across
    its tasks; ``zeroed``: the first, the batch buffer, is all zero, as the compiled C1 batch
    (``triples_native.batch_dense``) needs it and leaves it."""

    zeroed = False


class TripleKernel:
    """E(T) contributions of the orbital triples of one task (all of total irrep G).

    Triples are run in batches (i, j, ks): fixed i >= j and a run ks of k < j of one
    irrep (or ks = [j] alone), at most ``batch`` long.  W of a batch is stored block by
    block, the k of the batch inside each block ([s, (t, u)] per k), so the W0 terms whose
    large operand (an ovvv or t2 row of i or j) is the same for every k are one GEMM
    over the batch (N = len(ks) n_s); the others are one GEMM per k.  ``pool``: the
    thread's buffers (``new_pool``), reused by its tasks; ``flops`` counts the GEMM flops.
    With one virtual irrep W of a batch is [k, a, b, c], relayouts are transposes and the
    energy sweep runs per k; with several, the compiled sweep of each k reads its three
    cyclic layouts in the batch layout (fetched rows: moved out of it first).
    """

    def __init__(self, inp: KernelInputs, G: int, pool: list, batch: int = 1):
        self.inp, self.G = inp, G
        lay = inp.lay
        self.maps = lay.maps[G]
        self.dense = self.maps["dense"]
        self.compiled = self.dense and inp.native_rows is not None and lay.c1     # batch_dense
        self.batch = batch                 # the batch new_pool(lay, batch) sized ``pool`` for
        self.pool = pool if isinstance(pool, KernelPool) else KernelPool(pool)   # a plain list: not known zero
        self.buf = pool[:-1]
        self.lbuf = pool[-1]
        self.irr, self.rel = inp.irrep, inp.rel
        self.poff, self.vooff, self.loff = lay.poff.tolist(), lay.vooff.tolist(), lay.loff.tolist()
        self.nv, self.no, self.vr = lay.n.tolist(), lay.no.tolist(), lay.vr.tolist()
        self.nfm = [a + b for a, b in zip(self.nv, self.no)]      # K of the fused terms
        self.nvir = len(lay.irrep)
        self.flops = 0
        self._ev = np.ascontiguousarray(lay.ev, dtype=float)       # the compiled sweep's operands
        self._zeros = np.zeros(self.nvir ** 2) if self.dense else None

    @staticmethod
    def batch_size(lay: VirtualLayout, occ_tile: int) -> int:
        """k per batch: about 256 columns (batch x virtuals per irrep) in the batched GEMMs,
        at most ``occ_tile`` and 64 MiB of batch buffers."""
        nirrep = max(1, len(set(lay.irrep.tolist())))
        width = max(1, len(lay.irrep) // nirrep)
        batch = max(1, min(occ_tile, -(-256 // width)))
        nbatch = 3
        while batch > 1 and nbatch * 8 * batch * int(lay.ntrip.max()) > 64 * 2 ** 20:
            batch -= 1
        return batch

    @staticmethod
    def pool_sizes(lay: VirtualLayout, batch: int = 1) -> list:
        """Elements of one thread's buffers: some of a batch's W (in the batch layout), some
        of one triple's (one virtual irrep: the compiled sweep's scratch), and the stacked
        left operands."""
        nv, no, ntrip = int(lay.n.max()), int(lay.no.max()), max(int(lay.ntrip.max()), 1)
        left = [max(batch * nv * (nv + no), 1)]          # stacked left operands (fused C1: v + o wide)
        if len(set(lay.irrep.tolist())) == 1:         # the batch's three layouts; the sweep's scratch
            return [3 * batch * ntrip, dense_scratch_size(len(lay.irrep)), 2 * left[0]]
        # the batch's three layouts; 3 of one triple; the sweep's scratch (with W of one
        # triple); left operands of two layouts stacked
        return [3 * batch * ntrip] + [ntrip] * 3 + [packed_scratch_size(len(lay.irrep), ntrip)] + [2 * left[0]]

    @staticmethod
    def new_pool(lay: VirtualLayout, batch: int = 1) -> KernelPool:
        """The buffers of :meth:`pool_sizes`, kept by a thread (new pages are slow)."""
        return KernelPool(np.empty(n) for n in TripleKernel.pool_sizes(lay, batch))

    def tile_energy(self, I, J, K) -> float:
        """Weighted E(T) (with the 1/3) of the orbital triples i >= j >= k, i in range(*I),
        j in range(*J), k in range(*K)."""
        energy = 0.0
        for i in range(*I):
            for j in range(J[0], min(J[1], i + 1)):
                below = min(K[1], j)                               # k < j: weight 6 (3 if i == j)
                for k0 in range(K[0], below, self.batch):
                    ks = range(k0, min(k0 + self.batch, below))
                    energy += (3 if i == j else 6) * self.energy(i, j, ks)
                if K[0] <= j < K[1]:                               # k == j: weight 3 (1 if i == j)
                    energy += (1 if i == j else 3) * self.energy(i, j, range(j, j + 1))
        return energy / 3.0

    def energy(self, i: int, j: int, ks: range) -> float:
        """sum over k in ks of sum_abc W r3(W + V) / D for (i, j, k) (no weight, no 1/3).

        D is the same at the six permutations of an orbit {a, b, c}; with Z = W + V and
        S_e, S_o the sums of Z over its even and odd permutations, r3(Z) at an even one p
        is 3 Z_p + S_e - 2 S_o (odd: 3 Z_p + S_o - 2 S_e): the compiled sweep's form.
        """
        return self._energy_dense(i, j, ks) if self.dense else self._energy_packed(i, j, ks)

    def _left(self, table, x, y, ks, p0: int, width: int, out=None) -> np.ndarray:
        """[len(ks), width]: row p0.. of table[x][g_y][y] per k in ks, the orbital that is
        None (x or y) being k (for one k the table's own slice, else a copy in the buffer;
        copied into ``out`` when given); neither None: that one row (a batch of one k)."""
        nk = len(ks)
        if x is not None and y is not None:          # a fixed row (nk == 1: k's is the right operand)
            row = table[x][self.irr[y]][self.rel[y]][p0:p0 + width]
            if out is None:
                return row[None]
            out[...] = row
            return out
        if out is None:
            if nk == 1 and x is None:
                return table[ks[0]][self.irr[y]][self.rel[y]][p0:p0 + width][None]
            if nk == 1:
                r0 = self.rel[ks[0]]
                return table[x][self.irr[ks[0]]][r0:r0 + 1, p0:p0 + width]
            out = self.lbuf[:nk * width].reshape(nk, width)
        if x is None:
            g, r = self.irr[y], self.rel[y]
            for n, k in enumerate(ks):
                out[n] = table[k][g][r][p0:p0 + width]
        else:
            r0 = self.rel[ks[0]]
            out[...] = table[x][self.irr[ks[0]]][r0:r0 + nk, p0:p0 + width]
        return out

    def _terms(self, ks, os_, ot, ou) -> tuple:
        """The W0 terms of single (o_s s), pair (o_t t, o_u u) (one orbital None: k), each
        (sign, left table, its second orbital, left offsets, pair irrep h, right table,
        right orbital, K per irrep): the fused pair, or the four of the plain tables."""
        inp, g = self.inp, self.irr
        occ_irrep = (lambda x: g[ks[0]] if x is None else g[x])
        hu, ht = occ_irrep(os_) ^ occ_irrep(ou), occ_irrep(os_) ^ occ_irrep(ot)
        # sum_f (o_t t|u f) t2[o_s o_u s f],  sum_f (o_u u|t f) t2[o_s o_t s f],
        # -sum_m (o_s s|o_t m) t2[m o_u t u], -sum_m (o_s s|o_u m) t2[m o_t u t]
        if inp.left is not None:            # fused: terms 1 and 4, 2 and 3 share the right orbital
            return ((1.0, inp.left, ou, self.loff, hu, inp.right_a, ot, self.nfm),
                    (1.0, inp.left, ot, self.loff, ht, inp.right_b, ou, self.nfm))
        return ((1.0, inp.t2r, ou, self.poff, hu, inp.ov1, ot, self.nv),
                (1.0, inp.t2r, ot, self.poff, ht, inp.ov2, ou, self.nv),
                (-1.0, inp.ooL, ot, self.vooff, ht, inp.t2s, ou, self.no),
                (-1.0, inp.ooL, ou, self.vooff, hu, inp.t2r, ot, self.no))

    def _accumulate(self, out, ks, layouts, nslot: int = 1) -> None:
        """The 4 W0 terms of each layout (slot, o_s, o_t, o_u): single (o_s s), pair
        (o_t t, o_u u), for every k in ks (one of o_s, o_t, o_u None: the orbital k).  Block
        g_s of ``out`` at nslot len(ks) foff[G, g_s] holds ``nslot`` slots, each
        [k, s, (t, u)].  Terms of one kind whose right operand is the same orbital in
        layouts of adjacent slots are one GEMM (left operands stacked, N summed); a term
        whose right orbital is k is one GEMM per k, shared likewise by the terms of one
        kind and pair irrep in adjacent slots (their left rows stacked, the product of
        each k added to the slots from a scratch buffer)."""
        g, rel, nk = self.irr, self.rel, len(ks)
        blocks = self.maps["blocks"]
        init = [[False] * len(blocks) for _ in range(nslot)]
        kinds = [[] for _ in range(4)]      # per term kind: [right orbital, [(slot, o_s, term)]]
        for slot, os_, ot, ou in layouts:
            for kind, term in enumerate(self._terms(ks, os_, ot, ou)):
                if term[6] is None and nk == 1:      # k's right operand is fixed too: may share a GEMM
                    term = term[:6] + (ks[0],) + term[7:]
                same = [grp for grp in kinds[kind] if grp[0] == term[6] and grp[1][-1][0] + 1 == slot
                        and (term[6] is not None or grp[1][-1][2][4] == term[4])]
                if same:
                    same[0][1].append((slot, os_, term))
                else:
                    kinds[kind].append([term[6], [(slot, os_, term)]])

        def beta_of(b, off, size, slots) -> float:     # the slots' block b is set from here on
            done = [init[sl][b] for sl in slots]
            beta = 1.0 if True in done else 0.0
            if beta and False in done:                   # rare: a vanishing term left one unset
                for sl, was in zip(slots, done):
                    if not was:
                        out[nslot * nk * off + sl * nk * size:][:nk * size] = 0.0
            for sl in slots:
                init[sl][b] = True
            return beta
        for groups in kinds:                # fixed right orbitals first: they set up most slots
            for rx, members in sorted(groups, key=lambda grp: grp[0] is None):
                sign, _, _, offs, h, rtab, _, dims = members[0][2]
                slots = [sl for sl, _, _ in members]
                for b, (gs, off, ns, npair) in enumerate(blocks):
                    nf, size, p0 = dims[gs ^ h], ns * npair, offs[h][gs]
                    if not nf:
                        continue
                    beta = beta_of(b, off, size, slots)
                    c = out[nslot * nk * off + slots[0] * nk * size:][:len(slots) * nk * size]
                    if rx is not None:
                        if len(members) == 1:
                            _, os_, (_, ltab, ly, *_) = members[0]
                            left = self._left(ltab, os_, ly, ks, p0, ns * nf)
                        else:
                            left = self.lbuf[:len(members) * nk * ns * nf].reshape(len(members), nk, ns * nf)
                            for m, (_, os_, term) in enumerate(members):
                                self._left(term[1], os_, term[2], ks, p0, ns * nf, out=left[m])
                        dgemm(sign, rtab[rx][gs ^ h].T, left.reshape(-1, nf).T, beta=beta,
                              c=c.reshape(-1, npair).T, overwrite_c=1)
                        self.flops += 2 * len(members) * nk * size * nf
                        continue
                    nm = len(members)
                    scratch = self._scratch(out, nm * size) if nm > 1 else None      # flat [m, s, pairs]
                    if nm == 1 or scratch is None:
                        for _, os_, (_, ltab, ly, *_) in members:
                            row = ltab[os_][g[ly]][rel[ly]][p0:p0 + ns * nf].reshape(ns, nf)
                            for n, k in enumerate(ks):
                                dgemm(sign, rtab[k][gs ^ h].T, row.T, beta=beta,
                                      c=c[n * size:(n + 1) * size].reshape(ns, npair).T, overwrite_c=1)
                            c = c[nk * size:]
                        self.flops += 2 * nm * nk * size * nf
                        continue
                    rows = self.lbuf[:nm * ns * nf].reshape(nm, ns * nf)
                    for m, (_, os_, (_, ltab, ly, *_)) in enumerate(members):
                        rows[m] = ltab[os_][g[ly]][rel[ly]][p0:p0 + ns * nf]
                    cs = c.reshape(nm, nk, size)
                    for n, k in enumerate(ks):
                        dgemm(sign, rtab[k][gs ^ h].T, rows.reshape(nm * ns, nf).T, beta=0.0,
                              c=scratch.reshape(nm * ns, npair).T, overwrite_c=1)
                        if beta:
                            cs[:, n] += scratch.reshape(nm, size)
                        else:
                            cs[:, n] = scratch.reshape(nm, size)
                    self.flops += 2 * nm * nk * size * nf
        for b, (gs, off, ns, npair) in enumerate(blocks):
            for sl, *_ in layouts:
                if not init[sl][b]:
                    out[(nslot * nk * off + sl * nk * ns * npair):][:nk * ns * npair] = 0.0

    def _scratch(self, out, n: int) -> np.ndarray | None:
        """n doubles (flat) of a pool buffer that is not ``out``; None when none is large
        enough.  Only the packed kernel accumulates several slots, into the batch buffer:
        its per-triple buffers are free until the batch is swept."""
        for a in self.buf:
            if a.size >= n and not np.may_share_memory(a, out):
                return a[:n]
        return None

    def _energy_dense(self, i, j, ks) -> float:
        """One virtual irrep: the three layouts of the batch, A [k, a, (b c)], B [k, b, (a c)]
        and C [k, c, (a b)], by GEMMs, then per k the compiled sweep
        (``chem.triples_native``): W = A + B[bac] + C[cab], V, r3 and D in one pass.  On
        the fused C1 operands of resident slabs the whole batch is one compiled call
        (``triples_native.batch_dense``: its GEMMs shared over layouts and k)."""
        nv, nk = self.nvir, len(ks)
        if self.compiled:
            if not self.pool.zeroed:          # a new pool, or another path's batch was in it
                self.buf[0].fill(0.0)
                self.pool.zeroed = True
            e, flops = batch_dense(i, j, ks[0], nk, self.inp, self._ev, self.buf[0], self.lbuf, self.buf[1])
            self.flops += flops
            return e
        self.pool.zeroed = False
        A, B, C = (self.buf[0][s * nk * nv ** 3:(s + 1) * nk * nv ** 3].reshape(nk, nv, nv, nv) for s in range(3))

        def single(out, os_, ot, ks, ou=None):
            self._accumulate(out.reshape(-1), ks, ((0, os_, ot, ou),))
        single(B, j, i, ks)                                       # single b, pair (a, c)
        if i == j:                                                # single a and b alike
            A = B
        else:
            single(A, i, j, ks)                                   # single a, pair (b, c)
        if ks[0] != j:                                            # else (j == k) as single b
            single(C, None, i, ks, j)                             # single c, pair (a, b)
        else:
            C = B
        return sum(self._sweep_dense(A[n], B[n], C[n], i, j, k) for n, k in enumerate(ks))

    def _sweep_dense(self, A, B, C, i, j, k) -> float:
        """sum_abc W r3(W + V) / D of one triple from its three layouts [v, v, v]."""
        nv2, ov, g, r, inp = self.nvir ** 2, self.inp.ovov, self.irr, self.rel, self.inp
        pairs = [ov[x][g[y]][r[y]] for x, y in ((j, k), (i, k), (i, j))]      # (jb|kc), (ia|kc), (ia|jb)
        pairs = [p if p.size == nv2 else self._zeros for p in pairs]          # else zero by symmetry
        t1 = inp.t1
        return energy_dense(A, B, C, self._ev, inp.eo[i] + inp.eo[j] + inp.eo[k], t1[i], t1[j], t1[k], *pairs,
                            self.buf[1])

    def _energy_packed(self, i, j, ks) -> float:
        """Point-group symmetry: the three cyclic layouts of the batch, then per k (moved out
        of the batch layout, fetched rows only) the compiled sweep.

        The batch holds, per single irrep g_s, slot 0: layout a (i; j, k), slot 1: layout b
        pair-swapped (j; i, k), slot 2: layout c (k; i, j), so the b and c terms whose right
        operand is i's are one GEMM (N doubled)."""
        nk, n, blocks = len(ks), int(self.inp.lay.ntrip[self.G]), self.maps["blocks"]
        self.pool.zeroed = False
        if self.inp.native_rows is not None:     # fused operands: the whole batch in one call
            e, flops = batch_packed(self.G, i, j, ks[0], nk, self.inp, self._ev,
                                    self.buf[0], self.lbuf, self.buf[4])
            self.flops += flops
            return e
        B = self.buf[0][:3 * nk * n]
        Sa_buf, Sb_buf, Sc_buf = (a[:n] for a in self.buf[1:4])
        layouts = [(0, i, j, None)]                               # single a, pair (b, c)
        if i != j:                                                # else the same terms, pair swapped
            layouts.append((1, j, i, None))                       # single b, pair (a, c)
        if ks[0] != j:                                            # else (j == k) as single b
            layouts.append((2, None, i, j))                       # single c, pair (a, b)
        self._accumulate(B, ks, layouts, nslot=3)

        def one(slot, n_k, out):                                  # triple n_k of a slot
            for _, off, ns, npair in blocks:
                size = ns * npair
                c0 = 3 * nk * off + (slot * nk + n_k) * size
                out[off:off + size] = B[c0:c0 + size]
            return out
        e, inp, g, r, lay = 0.0, self.inp, self.irr, self.rel, self.inp.lay
        for n_k, k in enumerate(ks):
            # on a diagonal layout b (pair-swapped) is a's (i == j) and c is b's (j == k)
            Sa = one(0, n_k, Sa_buf)
            bs = Sa if i == j else one(1, n_k, Sb_buf)
            Sc = bs if j == k else one(2, n_k, Sc_buf)
            pairs = [inp.ovov[x][g[y]][r[y]] for x, y in ((j, k), (i, k), (i, j))]   # (jb|kc), (ia|kc), (ia|jb)
            e += energy_packed(self.G, Sa, bs, Sc, self._ev, inp.eo[i] + inp.eo[j] + inp.eo[k],
                               inp.t1[i], inp.t1[j], inp.t1[k], pairs, (g[j] ^ g[k], g[i] ^ g[k], g[i] ^ g[j]),
                               lay, self.buf[4])
        return e


# --------------------------------------------------------------------------- driver
def default_occ_tile(nvir: int, nirrep: int) -> int:
    """Occupied orbitals per task tile: one task's orbital triples ~ 2e6 virtual triples."""
    return max(1, int((2e6 / max(1.0, nvir ** 3 / nirrep)) ** (1 / 3)))


def check_occ_tile(occ_tile, name: str = "occ_tile") -> None:
    """InputError unless ``occ_tile`` (the option ``name``) is None or a positive integer."""
    integer = isinstance(occ_tile, (int, np.integer)) and not isinstance(occ_tile, bool)
    if occ_tile is not None and not (integer and occ_tile >= 1):
        raise InputError(f"{name} must be a positive integer or None, got {occ_tile!r}")


def triples_correction(ints, t1, t2, *, context=None, occ_tile: int | None = None,
                       cache_mb: float | None = None, vblock: int | None = None,
                       kernel_mb: float | None = None, memory_mb: float | None = None,
                       chunks: int | None = None) -> TriplesResult:
    """E(T) of closed-shell CCSD amplitudes ``t1`` (o, v) and ``t2`` (o, o, v, v), local or
    distributed, on any backend (the tasks: :mod:`tessera.chem.triples_tasks`).

    ``ints`` are the MO integrals of :func:`tessera.chem.integrals.transform` (canonical
    RHF orbitals).  One task per unique triple of task tiles (``occ_tile`` occupied
    orbitals at most) runs through ``context.run_tasks`` (default: the current context).
    ``cache_mb``: per-rank cache of packed rows of distributed tensors (default: as below);
    with the blocked kernel, the bytes one task's windows may take (``chem.triples_window``;
    when not given, ``triples_budget.window_budget``: the rank's share of the (T) operands,
    at least what the task of fewest modelled seconds within the cap holds
    (``fastest_task``: unstreamed at least ``task_floor``, between nodes possibly streamed;
    on one node the streamed ``stream_floor`` if less), at
    most a quarter of ``memory_mb``, the rank's memory budget, or 256 MiB; the occupied
    task tile then follows from it: ``triples_plan.window_plan``, or, below the
    unstreamed floor or between nodes where a streamed task is the fastest within it,
    ``stream_plan``: the contracted indices fetched in chunks).
    ``kernel_mb``: the kernel's buffers per thread (default 256 MiB); when the whole-space
    kernel (~ v^3 / nirrep per buffer) does not fit, the virtual index is blocked too
    (:mod:`tessera.chem.triples_blocked`), in blocks of ``vblock`` orbitals if given.
    ``chunks``: distributed windowed tasks run in that many stages, each fetching one chunk
    of the contracted virtual and occupied indices (``chem.triples_stream``); 1: one
    stage, the contracted indices whole (never streamed, whatever the budget; a result's
    ``stages`` is 1 for every unstreamed run); None: the budget rule decides.
    Collective under MPI: every rank calls it and gets the same result.  Raises
    ShapeError when the amplitudes are not over ``ints``' spaces, InputError for a bad
    ``occ_tile`` or ``cache_mb``, distributed tensors with a local context, or ``chunks``
    > 1 where no task is windowed (local tensors, or the whole-space kernel without
    ``vblock``).
    """
    from tessera.backends.context import current_context

    t_start = time.perf_counter()
    context = current_context() if context is None else context
    o, v = ints.o, ints.v
    if t1.spaces != (o, v) or t2.spaces != (o, o, v, v) or t1.irrep or t2.irrep:
        raise ShapeError("t1 must be a BlockTensor over (ints.o, ints.v) and t2 over "
                         "(ints.o, ints.o, ints.v, ints.v), both of irrep 0; build them with "
                         "BlockTensor.from_dense(..., (ints.o, ints.v)) from the same MOIntegrals")
    check_occ_tile(occ_tile)
    check_occ_tile(vblock, "vblock")
    check_occ_tile(chunks, "chunks")
    for name, val in (("cache_mb", cache_mb), ("kernel_mb", kernel_mb), ("memory_mb", memory_mb)):
        if val is not None and (isinstance(val, bool) or not isinstance(val, (int, float)) or val < 0):
            raise InputError(f"{name} must be a number >= 0 or None, got {val!r}")
    require()                     # the compiled kernel, before any task (or forked worker) runs
    resident = all(getattr(t, "dist", None) is None for t in (t1, t2, *ints.tensors.values()))
    if not resident and not context.distributed:
        raise InputError("distributed tensors need a distributed context (mpi-onesided or "
                         "mpi-collective); run triples_correction inside the context that made them")
    from tessera.chem.triples_tasks import TriplesTasks
    ranks = context.ranks
    # one plan on every rank: nodes may hold different numbers of ranks
    per_node = ranks.allreduce(ranks.node_size, "max")
    with planning(context.machine()):      # planned for this run's threads and executor
        job = TriplesTasks(ints, t1, t2, occ_tile, cache_mb, resident, vblock, kernel_mb, nranks=ranks.size,
                           memory_bytes=None if memory_mb is None else memory_mb * 2**20, ranks_per_node=per_node,
                           chunks=chunks)
        task_set = job.task_set(ranks.size)
    results = context.run_tasks(task_set)
    energy = float(sum(results.tolist()))               # task order: schedule-independent
    flops = int(ranks.allreduce(job.flops, "sum"))
    seconds = time.perf_counter() - t_start
    out = TriplesResult(energy, flops, len(task_set), seconds, job.minimal_flops(), task_tile=job.occ_tile,
                        kernel_buffer_bytes=job.pool_bytes, virtual_block=job.vblock or 0,
                        stages=job.stream.count if job.stream is not None else 1)
    if resident:
        _log.info("(T) correction %.12f Eh: %d tasks, %.3g GFLOP (%.3f x minimal), %.2f s, %.1f GFLOP/s; "
                  "task tile %d, virtual block %s", energy, len(task_set), flops / 1e9,
                  flops / max(1, out.minimal_flops), seconds, flops / seconds / 1e9, job.occ_tile,
                  job.vblock or "whole")
        return out
    stolen = context.deal_stats.stolen if context.deal_stats is not None else 0
    everyone = ranks.allgather((job.held.peak, job.held.peak_by, sum(job.read.values()),
                                tuple(map(tuple, job.runs)), stolen))
    peaks = tuple(int(p) for p, *_ in everyone)
    share = {s: max(by[s] for _, by, *_ in everyone) / max(1, job.whole[s]) for s in SOURCES}
    _log.info("(T) correction %.12f Eh: %d tasks, %.3g GFLOP, %.2f s; task tile %d, peak (T) operands "
              "%.3g MB/rank (largest share of one tensor %.2f%s)", energy, len(task_set), flops / 1e9,
              seconds, job.occ_tile, max(peaks) / 1e6, max(share.values()),
              "" if job.bounded else "; occupied space too small for task rows below whole tensors")
    return replace(out, peak_operand_bytes=max(peaks), rank_peak_operand_bytes=peaks, peak_share=share,
                   whole_bytes=dict(job.whole), cache_bytes=job.cache_limit,
                   rank_read_bytes=tuple(int(r) for _, _, r, _, _ in everyone),
                   rank_runs=tuple(runs for *_, runs, _ in everyone),
                   rank_stolen=tuple(int(n) for *_, n in everyone))
