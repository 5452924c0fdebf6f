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
copies.  Energy of one block triple: sum over its blocks of R (W + V), R = r3(W / D) =
3Y + Yc - 2Zs, V's three rank-one parts as contractions of R with (ov|ov) pairs and t1.

Buffers per thread (:func:`blocked_pool_sizes`): at most 19 batch n^3 + K n^2 +
batch n K, n the largest block, K the largest irrep (virtual or occupied).
:func:`choose_vblock` picks the block from a byte budget.
"""

from __future__ import annotations

from itertools import permutations
from math import prod

import numpy as np
from scipy.linalg.blas import dgemm

from tessera.chem.triples import NIRREP, TripleKernel, VirtualLayout

DEFAULT_KERNEL_MB = 256       # per thread: above it (T) runs blocked in the virtual index


def virtual_blocks(lay: VirtualLayout, vblock: int) -> list:
    """(irrep, first position inside the irrep, size) of every virtual block."""
    out = []
    for g in range(NIRREP):
        n = int(lay.n[g])
        out += [(g, r, min(vblock, n - r)) for r in range(0, n, vblock)]
    return out


def blocked_pool_sizes(lay: VirtualLayout, vblock: int, batch: int, blocks=None, k: int | None = None) -> list:
    """Elements of one thread's buffers: W, Y and Yc of the ordered blocks of one block
    triple (six, three or one, as the number of blocks allows), one layout's scratch, the
    right operand (pair copied out) and the stacked left operands; ``blocks``: the blocks
    a triple is drawn from when not ``virtual_blocks(lay, vblock)`` (windows:
    ``Windows.blocks``, none larger than those, whose size is the kernel's slot); ``k``:
    the widest contracted index (default: the largest irrep, virtual or occupied)."""
    full = virtual_blocks(lay, vblock)
    n = max((s for _, _, s in full), default=1)
    count = len(full if blocks is None else blocks)
    orders = 6 if count >= 3 else 2 * count - 1
    k = max(int(lay.n.max()), int(lay.no.max()), 1) if k is None else max(k, 1)
    return [3 * orders * batch * n ** 3, batch * n ** 3, k * n * n, batch * n * k]


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

    def __init__(self, inp, G: int, pool: list, batch: int, vblock: int, triples=None):
        self.inp, self.G, self.batch = inp, G, batch
        lay = inp.lay
        self.irr, self.rel = inp.irrep, inp.rel
        self.poff, self.vooff = lay.poff.tolist(), lay.vooff.tolist()
        self.nv, self.no, self.vr = lay.n.tolist(), lay.no.tolist(), lay.vr.tolist()
        self.ev = lay.ev
        self.wbuf, self.sbuf, self.rbuf, self.lbuf = pool
        blocks = virtual_blocks(lay, vblock)
        self.slot = max(s for _, _, s in blocks) ** 3
        self.triples = triples if triples is not None else \
            [sorted(set(permutations((blocks[a], blocks[b], blocks[c]))))
             for a in range(len(blocks)) for b in range(a + 1) for c in range(b + 1)
             if blocks[a][0] ^ blocks[b][0] ^ blocks[c][0] == G]
        self.flops = 0

    @staticmethod
    def new_pool(lay: VirtualLayout, vblock: int, batch: int, blocks=None, k: int | None = None) -> list:
        return [np.empty(max(n, 1)) for n in blocked_pool_sizes(lay, vblock, batch, blocks, k)]

    def energy(self, i: int, j: int, ks: range) -> float:
        """sum over k in ks of sum_abc W r3(W + V) / D, block triple by block triple."""
        return sum(self._triple_energy(i, j, ks, order) for order in self.triples)

    def _triple_energy(self, i, j, ks, order) -> float:
        return self._order_energy(i, j, ks, order, self._order_w(i, j, ks, order))

    def _view(self, b: int, n: int, shape) -> np.ndarray:
        """Buffer n (0: W, 1: Sb / Y, 2: Sa / Yc) of ordered block b, [shape]."""
        return self.wbuf[(3 * b + n) * shape[0] * self.slot:][:prod(shape)].reshape(shape)

    def _order_w(self, i, j, ks, order) -> dict:
        """W of each ordered block of one block triple (views of buffer 0)."""
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
            W[X, Yb, Z] = w = view(b, 0, (nk, nx, ny, nz))
            sb = (Sa[Yb, X, Z].transpose(0, 1, 3, 2) if i == j else Sb[X, Yb, Z])
            np.add(Sa[X, Yb, Z], sb.transpose(0, 3, 1, 2), out=w)
            if ks[0] == j:                            # Sc[XYZ] = Sb[XZY] with the pair swapped
                sc = (Sa[Z, X, Yb].transpose(0, 1, 3, 2) if i == j else Sb[X, Z, Yb]).transpose(0, 1, 3, 2)
            else:
                sc = self.sbuf[:nk * nx * ny * nz].reshape(nk, nz, nx, ny)
                self._accumulate(sc.reshape(nk, nz, nx * ny), ks, None, i, j, Z, X, Yb)
            w += sc.transpose(0, 2, 3, 1)
        return W

    def _order_energy(self, i, j, ks, order, W: dict) -> float:
        """sum over the ordered blocks of R (W + V) / D, from their W."""
        nk, eo, view = len(ks), self.inp.eo, self._view
        shapes = {key: (nk, key[0][2], key[1][2], key[2][2]) for key in order}
        Y, U = {}, {}
        for b, key in enumerate(order):
            Y[key], U[key] = y, _ = view(b, 1, shapes[key]), view(b, 2, shapes[key])
            y[...] = (eo[i] + eo[j] + eo[ks[0]:ks[-1] + 1])[:, None, None, None]
            for axis, blk in enumerate(key):
                e = self.ev[self.vr[blk[0]][0] + blk[1]:][:blk[2]]
                y -= e.reshape((1,) * (axis + 1) + (-1,) + (1,) * (2 - axis))
            np.divide(W[key], y, out=y)                                  # Y = W / D
        for (X, Yb, Z), u in U.items():                                  # Yc = Y + Y[bca] + Y[cab]
            np.add(Y[X, Yb, Z], Y[Yb, Z, X].transpose(0, 3, 1, 2), out=u)
            u += Y[Z, X, Yb].transpose(0, 2, 3, 1)
        energy = 0.0
        for (X, Yb, Z), r in Y.items():                                  # R = 3Y + Yc - 2 Yc[acb]
            r *= 3.0
            r += U[X, Yb, Z]
            zs = U[X, Z, Yb].transpose(0, 1, 3, 2)
            r -= zs
            r -= zs
            energy += float(np.vdot(r, W[X, Yb, Z])) + self._v_dot(r, i, j, ks, X, Yb, Z)
        return energy

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

    def _v_dot(self, r, i, j, ks, X, Yb, Z) -> float:
        """sum R V, V = t1[ia] (jb|kc) + t1[jb] (ia|kc) + t1[kc] (ia|jb); t1 is zero
        unless the virtual's irrep is its orbital's."""
        t1, g, rel, vr = self.inp.t1, self.irr, self.rel, self.vr
        krows = slice(rel[ks[0]], rel[ks[0]] + len(ks))
        t1s = (lambda x, B: t1[x, vr[B[0]][0] + B[1]:][..., :B[2]])
        total = 0.0
        if X[0] == g[i] and (p := self._pairs(j, g[ks[0]], krows, Yb, Z)) is not None:
            total += float(np.einsum("kxyz,kyz->x", r, p) @ t1s(i, X))
        if Yb[0] == g[j] and (p := self._pairs(i, g[ks[0]], krows, X, Z)) is not None:
            total += float(np.einsum("kxyz,kxz->y", r, p) @ t1s(j, Yb))
        if Z[0] == g[ks[0]] and (p := self._pairs(i, g[j], slice(rel[j], rel[j] + 1), X, Yb)) is not None:
            total += float(np.vdot(np.einsum("kxyz,xy->kz", r, p[0]), t1s(slice(ks[0], ks[-1] + 1), Z)))
        return total

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
