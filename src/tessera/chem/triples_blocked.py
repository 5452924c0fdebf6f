"""(T) kernel blocked in the virtual index: buffers bounded by a block size, not by v^3.

The virtual space is cut into *virtual blocks*: runs of at most ``vblock`` orbitals inside
one irrep.  For an orbital batch (i, j, ks) of :class:`~tessera.chem.triples.TripleKernel`
the virtual triples are visited by unordered block triples {A, B, C} (A >= B >= C, irreps
multiplying to the batch's G).  The distinct orderings (X, Y, Z) of one triple are closed
under permutations of abc, so r3 and the energy of a block triple need nothing else: W of
its (at most six) ordered blocks, [len(ks), n_X, n_Y, n_Z] each, is all the kernel holds.

Per ordered block, W[abc] = Sa[a, (b c)] + Sb[b, (c a)] + Sc[c, (a b)] with the three
single-index layouts of ``TripleKernel`` (four W0 terms each, same formula), as GEMMs of
M = n_T n_U (the pair), N = len(ks) n_S or n_S, K = the contracted virtuals or occupied of
one irrep.  The pair (T, U) of a right operand is copied out of its packed row (pairs
swapped where the term needs it) into a scratch [K, n_T n_U], so the kernel reads the same
:class:`~tessera.chem.triples.RowSlab` s as the whole-space kernel but never their swapped
copies.  W of an ordered block (the three layouts' outputs summed, two of them
transposed) and the energy of a block triple, sum W r3(W + V) / D orbit by orbit (each
orbit's six permutations read once from the ordered blocks' W, V from (ov|ov) pairs and
t1 over the kernel's frame of virtuals), are compiled (``triples_kernel.c``:
``tessera_t3_block_w``, ``tessera_t3_block_energy``).

Buffers per thread (:func:`blocked_pool_sizes`): at most 19 batch n^3 + K n^2 +
batch n K + (2 batch + 1) f^2, n the largest block, K the largest irrep (virtual or
occupied), f the virtuals of the frame (all of them, or a window's three tiles).
:func:`choose_vblock` picks the block from a byte budget.
"""

from __future__ import annotations

from itertools import permutations
from math import prod

import numpy as np
from scipy.linalg.blas import dgemm

from tessera.chem.triples import NIRREP, TripleKernel, VirtualLayout
from tessera.chem.triples_native import block_energy, block_w
from tessera.errors import TesseraError

DEFAULT_KERNEL_MB = 256       # per thread: above it (T) runs blocked in the virtual index


def virtual_blocks(lay: VirtualLayout, vblock: int) -> list:
    """(irrep, first position inside the irrep, size) of every virtual block."""
    out = []
    for g in range(NIRREP):
        n = int(lay.n[g])
        out += [(g, r, min(vblock, n - r)) for r in range(0, n, vblock)]
    return out


def blocked_pool_sizes(lay: VirtualLayout, vblock: int, batch: int, blocks=None, k: int | None = None,
                       frame: int | None = None) -> list:
    """Elements of one thread's buffers: W, Sb and Sa of the ordered blocks of one block
    triple (six, three or one, as the number of blocks allows), one layout's scratch, the
    right operand (pair copied out), the stacked left operands, and a batch's (ov|ov)
    pairs over the frame (``_frame_v``: 2 batch + 1 frame x frame matrices); ``blocks``:
    the blocks a triple is drawn from when not ``virtual_blocks(lay, vblock)`` (windows:
    ``Windows.blocks``, none larger than those, whose size is the kernel's slot); ``k``:
    the widest contracted index (default: the largest irrep, virtual or occupied);
    ``frame``: the most virtuals a frame spans (default: all, ``Windows.frame_width``)."""
    full = virtual_blocks(lay, vblock)
    n = max((s for _, _, s in full), default=1)
    count = len(full if blocks is None else blocks)
    orders = 6 if count >= 3 else 2 * count - 1
    k = max(int(lay.n.max()), int(lay.no.max()), 1) if k is None else max(k, 1)
    f = int(lay.n.sum()) if frame is None else frame
    return [3 * orders * batch * n ** 3, batch * n ** 3, k * n * n, batch * n * k, (2 * batch + 1) * f * f]


def choose_vblock(lay: VirtualLayout, occ_tile: int, budget_bytes: float) -> tuple:
    """(vblock or None, batch): None (the whole-space kernel) when its buffers fit the
    budget, else the largest block whose buffers at batch 1 do, and the largest batch
    (<= occ_tile) that still fits."""
    batch = TripleKernel.batch_size(lay, occ_tile)
    if 8 * sum(TripleKernel.pool_sizes(lay, batch)) <= budget_bytes:
        return None, batch
    vblock = max(1, int(lay.n.max()))
    while vblock > 1 and 8 * sum(blocked_pool_sizes(lay, vblock, 1)) > budget_bytes:
        vblock -= 1
    return vblock, blocked_batch(lay, vblock, occ_tile, budget_bytes)


def blocked_batch(lay: VirtualLayout, vblock: int, occ_tile: int, budget_bytes: float) -> int:
    """The largest k batch (<= occ_tile) whose blocked buffers fit the budget (at least 1)."""
    batch = max(1, occ_tile)
    while batch > 1 and 8 * sum(blocked_pool_sizes(lay, vblock, batch)) > budget_bytes:
        batch -= 1
    return batch


class BlockedTripleKernel(TripleKernel):
    """:class:`TripleKernel` (same batches, weights and inputs) with the virtual triples
    visited by block triples; ``pool`` from ``new_pool(lay, vblock, batch)``; ``triples``:
    the ordered block triples to visit (default: all of G's, in blocks of ``vblock``)."""

    def __init__(self, inp, G: int, pool: list, batch: int, vblock: int, triples=None, frame=None):
        self.inp, self.G, self.batch = inp, G, batch
        lay = inp.lay
        self.irr, self.rel = inp.irrep, inp.rel
        self.poff, self.vooff = lay.poff.tolist(), lay.vooff.tolist()
        self.nv, self.no, self.vr = lay.n.tolist(), lay.no.tolist(), lay.vr.tolist()
        self.ev = lay.ev
        self.wbuf, self.sbuf, self.rbuf, self.lbuf, self.vbuf = pool
        blocks = virtual_blocks(lay, vblock)
        self.slot = max(s for _, _, s in blocks) ** 3
        self.triples = triples if triples is not None else \
            [sorted(set(permutations((blocks[a], blocks[b], blocks[c]))))
             for a in range(len(blocks)) for b in range(a + 1) for c in range(b + 1)
             if blocks[a][0] ^ blocks[b][0] ^ blocks[c][0] == G]
        # the virtuals V and the energies index: (irrep, first position, size) runs
        self.frame = frame if frame is not None else [(g, 0, n) for g, n in enumerate(self.nv) if n]
        self.flops = 0

    @staticmethod
    def new_pool(lay: VirtualLayout, vblock: int, batch: int, blocks=None, k: int | None = None,
                 frame: int | None = None) -> list:
        return [np.empty(max(n, 1)) for n in blocked_pool_sizes(lay, vblock, batch, blocks, k, frame)]

    def energy(self, i: int, j: int, ks: range) -> float:
        """sum over k in ks of sum_abc W r3(W + V) / D, block triple by block triple."""
        frame = self._frame_v(i, j, ks)
        return sum(self._order_energy(order, self._order_w(i, j, ks, order), frame) for order in self.triples)

    def _view(self, b: int, n: int, shape) -> np.ndarray:
        """Buffer n (0: W, 1: Sb, 2: Sa) of ordered block b, [shape]."""
        return self.wbuf[(3 * b + n) * shape[0] * self.slot:][:prod(shape)].reshape(shape)

    def _order_w(self, i, j, ks, order, out: dict | None = None, add: bool = False) -> dict:
        """W of each ordered block of one block triple: into ``out`` (ordered block -> its
        [nk, n_X, n_Y, n_Z], added to it when ``add``), else views of buffer 0; the sums of
        the layouts' GEMM outputs in C (``triples_native.block_w``)."""
        nk, view = len(ks), self._view
        W, Sa, Sb = {}, {}, {}
        for b, (X, Yb, Z) in enumerate(order):        # layouts a and b of every ordered block
            nx, ny, nz = X[2], Yb[2], Z[2]
            Sa[X, Yb, Z] = view(b, 2, (nk, nx, ny, nz))
            self._accumulate(Sa[X, Yb, Z].reshape(nk, nx, ny * nz), ks, i, j, None, X, Yb, Z)
            if i != j:                                # else Sb[XYZ] = Sa[YXZ] with the pair swapped
                Sb[X, Yb, Z] = view(b, 1, (nk, ny, nz, nx))
                self._accumulate(Sb[X, Yb, Z].reshape(nk, ny, nz * nx), ks, j, None, i, Yb, Z, X)
        for b, (X, Yb, Z) in enumerate(order):        # W[abc] = Sa[a, (b c)] + Sb[b, (c a)] + Sc[c, (a b)]
            nx, ny, nz = X[2], Yb[2], Z[2]
            W[X, Yb, Z] = w = view(b, 0, (nk, nx, ny, nz)) if out is None else out[X, Yb, Z]
            sb = (Sa[Yb, X, Z].transpose(0, 1, 3, 2) if i == j else Sb[X, Yb, Z])
            if ks[0] == j:                            # Sc[XYZ] = Sb[XZY] with the pair swapped
                sc = (Sa[Z, X, Yb].transpose(0, 1, 3, 2) if i == j else Sb[X, Z, Yb]).transpose(0, 1, 3, 2)
            else:
                sc = self.sbuf[:nk * nx * ny * nz].reshape(nk, nz, nx, ny)
                self._accumulate(sc.reshape(nk, nz, nx * ny), ks, None, i, j, Z, X, Yb)
            block_w(w, (Sa[X, Yb, Z], sb.transpose(0, 3, 1, 2), sc.transpose(0, 2, 3, 1)), add)
        return W

    def _frame_v(self, i, j, ks) -> tuple:
        """(frame positions of each frame run's first orbital, ev, e_ijk per k, t1i, t1j,
        t1k, Pjk, Pik, Pij) of batch (i, j, ks) over the virtuals of ``frame`` (each irrep
        whole; windowed kernels: the window's tiles), P.. pairs of (ov|ov): (jb|kc), (ia|kc)
        per k, (ia|jb), zero where symmetry forbids."""
        frame = self.frame
        at, f = {}, 0
        for F in frame:
            at[F], f = f, f + F[2]
        idx = np.concatenate([np.arange(self.vr[g][0] + r, self.vr[g][0] + r + n) for g, r, n in frame])
        t1, g, rel, nk = self.inp.t1, self.irr, self.rel, len(ks)
        krows, jrow = slice(rel[ks[0]], rel[ks[0]] + nk), slice(rel[j], rel[j] + 1)
        P = self.vbuf[:(2 * nk + 1) * f * f].reshape(2 * nk + 1, f, f)
        P[:] = 0.0
        for FP in frame:
            for FQ in frame:
                cut = (slice(None), slice(at[FP], at[FP] + FP[2]), slice(at[FQ], at[FQ] + FQ[2]))
                for dest, (x, gy, rows) in ((P[:nk], (j, g[ks[0]], krows)), (P[nk:2 * nk], (i, g[ks[0]], krows)),
                                            (P[2 * nk:], (i, g[j], jrow))):
                    p = self._pairs(x, gy, rows, FP, FQ)
                    if p is not None:
                        dest[cut] = p
        eijk = self.inp.eo[i] + self.inp.eo[j] + self.inp.eo[ks[0]:ks[-1] + 1]
        return (at, np.ascontiguousarray(self.ev[idx]), np.ascontiguousarray(eijk), t1[i, idx].copy(),
                t1[j, idx].copy(), np.ascontiguousarray(t1[ks[0]:ks[-1] + 1][:, idx]), P[:nk], P[nk:2 * nk], P[2 * nk])

    def _frame_at(self, at: dict, block) -> int:
        """Frame position of a kernel block's first orbital."""
        for F, f in at.items():
            if F[0] == block[0] and F[1] <= block[1] < F[1] + F[2]:
                return f + block[1] - F[1]
        raise TesseraError(f"(T) virtual block {block} outside the kernel's frame")

    def _order_energy(self, order, W: dict, frame) -> float:
        """sum over the orbits of one block triple of W r3(W + V) / D, from W of its ordered
        blocks (``triples_native.block_energy``)."""
        at, *rest = frame
        blocks = sorted(set(order[0]))
        ids = [[blocks.index(b) for b in key] for key in order]
        return block_energy(sorted(ids[0]), [b[2] for b in blocks], [self._frame_at(at, b) for b in blocks],
                            ids, [W[key] for key in order], *rest)

    def _pairs(self, x, gy, rows: slice, P, Q) -> np.ndarray | None:
        """(x p|y q) for y at ``rows`` of the (ov|ov) row of x, p in block P, q in block Q:
        [rows, n_P, n_Q]; None when the pair's irrep is not that of the row."""
        h = self.irr[x] ^ gy
        if P[0] ^ Q[0] != h:
            return None
        row = self.inp.ovov[x][gy][rows]
        p0, nq = self.poff[h][P[0]], self.nv[Q[0]]
        seg = row[:, p0:p0 + self.nv[P[0]] * nq].reshape(-1, self.nv[P[0]], nq)
        return seg[:, P[1]:P[1] + P[2], Q[1]:Q[1] + Q[2]]

    def _right(self, table, x, gc: int, nc: int, T, U, swapped: bool) -> np.ndarray:
        """[n_c, n_T n_U] contiguous: the pairs (t in T, u in U) of table[x][gc] ([nc, pairs],
        stored as (u, t) when ``swapped``)."""
        h = self.irr[x] ^ gc
        first, second = (U, T) if swapped else (T, U)
        p0, n1, n2 = self.poff[h][first[0]], self.nv[first[0]], self.nv[second[0]]
        seg = table[x][gc][:, p0:p0 + n1 * n2]
        if not swapped and seg.flags.c_contiguous and (T[2], U[2]) == (n1, n2):
            return seg                                   # the whole row: no copy
        seg = seg.reshape(nc, n1, n2)
        seg = seg[:, first[1]:first[1] + first[2], second[1]:second[1] + second[2]]
        return self._into_rbuf(seg, nc, T, U, swapped)

    def _into_rbuf(self, seg, nc: int, T, U, swapped: bool) -> np.ndarray:
        """``seg`` [nc, first, second] (``swapped``: first is U) as [nc, n_T n_U] in the
        right-operand buffer (pairs t in T, u in U)."""
        out = self.rbuf[:nc * T[2] * U[2]].reshape(nc, T[2], U[2])
        out[...] = seg.transpose(0, 2, 1) if swapped else seg
        return out.reshape(nc, T[2] * U[2])

    def _accumulate(self, out, ks, os_, ot, ou, S, T, U) -> None:
        """out[k, s, (t u)] = the 4 W0 terms with (o_s, s in S) single and pair (o_t t in T,
        o_u u in U), for every k in ks (one of os_, ot, ou is None: the orbital k)."""
        inp, g, rel, nk = self.inp, self.irr, self.rel, len(ks)
        occ_irrep = (lambda x: g[ks[0]] if x is None else g[x])
        hu, ht = occ_irrep(os_) ^ occ_irrep(ou), occ_irrep(os_) ^ occ_irrep(ot)
        gs, s0, ns = S
        npair = T[2] * U[2]
        # sum_f (o_t t|u f) t2[o_s o_u s f],  sum_f (o_u u|t f) t2[o_s o_t s f],
        # -sum_m (o_s s|o_t m) t2[m o_u t u], -sum_m (o_s s|o_u m) t2[m o_t u t]
        terms = ((1.0, inp.t2r, ou, self.poff, hu, inp.ov1, ot, False, self.nv),
                 (1.0, inp.t2r, ot, self.poff, ht, inp.ov1, ou, True, self.nv),
                 (-1.0, inp.ooL, ot, self.vooff, ht, inp.t2r, ou, True, self.no),
                 (-1.0, inp.ooL, ou, self.vooff, hu, inp.t2r, ot, False, self.no))
        beta = 0.0
        for sign, ltab, ly, offs, h, rtab, rx, swapped, dims in terms:
            gc = gs ^ h
            nc = dims[gc]
            if not nc:
                continue
            p0 = offs[h][gs] + s0 * nc
            if rx is not None:                     # one right operand for every k: one GEMM
                right = self._right(rtab, rx, gc, nc, T, U, swapped)
                left = self._left(ltab, os_, ly, ks, p0, ns * nc)
                dgemm(sign, right.T, left.reshape(nk * ns, nc).T, beta=beta,
                      c=out.reshape(nk * ns, npair).T, overwrite_c=1)
            else:
                left = ltab[os_][g[ly]][rel[ly]][p0:p0 + ns * nc].reshape(ns, nc)
                for n, k in enumerate(ks):
                    right = self._right(rtab, k, gc, nc, T, U, swapped)
                    dgemm(sign, right.T, left.T, beta=beta, c=out[n].T, overwrite_c=1)
            self.flops += 2 * nk * ns * npair * nc
            beta = 1.0
        if not beta:
            out[...] = 0.0
