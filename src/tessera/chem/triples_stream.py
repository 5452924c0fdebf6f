"""(T) windowed tasks with the contracted indices streamed in chunks: bytes set by tiles.

A windowed task (``chem.triples_window``: a triple of occupied task tiles X and a window
W of virtual tiles) reads, for its rows x, the contracted virtual f and occupied m
whole, so what it holds grows with v and o.  Streamed, as NWChem TCE's get -> dgemm ->
accumulate over a contracted tile, the task runs in C stages (``TaskSet.stages``); stage
s fetches only chunk s of every irrep's virtuals (f) and occupied orbitals (m)
(``Chunks``: near-equal parts), and the other occupied index y only over the task's own
orbitals Y (the W0 terms and V read no other):

    ovvv  (x p|q f)     p, q in W, f in chunk s        right operands of the (ov|vv) terms
    t2    t2[x m p q]   p, q in W, m in chunk s        right operands of the (ov|oo) terms
    t2    t2[x y p f]   y in Y, p in W, f in chunk s   left operands of the (ov|vv) terms
    ovoo  (x p|y m)     y in Y, p in W, m in chunk s   left operands of the (ov|oo) terms
    ovov  (x p|y q)     y in Y, p, q in W              V, last stage only

(Rendell, Lee, Komornicki, CPL 178, 462 (1991): each W0 term is a sum over f or m, so a
chunk's GEMMs add its part of W; ``chem.triples`` for the terms.)  The task keeps W of
its orbital triples and the window's block triples across its stages (``acc``) and
forms the energy from it at the last stage.  One chunk (C = 1) is the unstreamed
windowed task (``chem.triples_window``): the same requests and tables, f and m whole,
W formed and used per batch, nothing kept across stages.  Held at once: one stage's rows and tables,
about rows x (w^2 c_v + o_c w^2 + Y w c_v + Y w o_c + Y w^2) doubles for a window of w
orbitals and chunks c_v, o_c wide, and W, (orbital triples) x (w^3): tiles, not v or o.
"""

from __future__ import annotations

import numpy as np
from scipy.linalg.blas import dgemm

from tessera.chem.triples_blocked import BlockedTripleKernel
from tessera.chem.triples_window import ZeroTables

SOURCE_OF = {"ov1": "ovvv", "t2R": "t2", "t2L": "t2", "ooL": "ovoo", "ovov": "ovov"}   # table -> tensor


class Chunks:
    """Chunk s of C of each irrep of the virtual and occupied spaces: positions
    [n s / C, n (s + 1) / C) inside the irrep (n its orbitals)."""

    def __init__(self, lay, count: int):
        self.count = count
        self.n = {"v": lay.n.tolist(), "o": lay.no.tolist()}
        self.widest = max(-(-n // count) for n in self.n["v"] + self.n["o"] + [1])

    def range(self, space: str, g: int, s: int) -> tuple:
        n = self.n[space][g]
        return n * s // self.count, n * (s + 1) // self.count

    def widths(self, space: str, s: int) -> list:
        return [b - a for a, b in (self.range(space, g, s) for g in range(len(self.n[space])))]


def _cut(axis: int, lo: int, hi: int, size: int) -> tuple:
    """The part (axis, lo, hi) of a block, empty when it is the whole axis."""
    return () if (lo, hi) == (0, size) else (axis, lo, hi)


def stream_requests(win, chunks: Chunks, X: list, window, stage: int) -> list:
    """[(source, key, part, table, place)] of stage ``stage`` of a task of task tiles X
    ((start, stop, irrep, tensor tile, rows part) each) and window tiles ``window``: per
    block the part it reads (``backends.tasks.part_slice``) and where its rows go in the
    table (``StreamTables.add``)."""
    o, v, W = win.o, win.v, set(window)
    last = stage == chunks.count - 1

    def span(space, t):           # (part lo, hi inside tensor tile t, position in the chunk) or None
        tl, rel = (v.tiles[t], win.irel[t]) if space == "v" else (o.tiles[t], win.orel[t])
        lo, hi = chunks.range(space, tl.irrep, stage)
        a, b = max(rel, lo), min(rel + tl.size, hi)
        return None if a >= b else (a - rel, b - rel, a - lo)

    def pieces(t):
        return [p for p in win.pieces[t] if p[0] in W]

    def vcut(axis, p, t):
        return _cut(axis, p[1], p[1] + p[3], win.vsize[t])
    out = []
    for x0, _, _, n, rows in X:
        rows = rows or ()
        for key in win.keys["ovvv"].get(n, ()):
            f = span("v", key[3])
            for P in pieces(key[1]) if f else ():
                for Q in pieces(key[2]):
                    part = rows + vcut(1, P, key[1]) + vcut(2, Q, key[2]) + _cut(3, f[0], f[1], win.vsize[key[3]])
                    out.append(("ovvv", key, part, "ov1", (x0, P, Q, f)))
        for key in win.keys["t2"].get(n, ()):
            m = span("o", key[1])
            for P in pieces(key[2]) if m else ():
                for Q in pieces(key[3]):
                    part = rows + _cut(1, m[0], m[1], o.tiles[key[1]].size) + vcut(2, P, key[2]) + vcut(3, Q, key[3])
                    out.append(("t2", key, part, "t2R", (x0, P, Q, m)))
        for y0, y1, _, ny, _ in X:
            y = (y0 - o.tiles[ny].offset, y1 - o.tiles[ny].offset, o.tiles[ny].size)
            for key in (k for k in win.keys["t2"].get(n, ()) if k[1] == ny):
                f = span("v", key[3])
                for P in pieces(key[2]) if f else ():
                    part = rows + _cut(1, *y) + vcut(2, P, key[2]) + _cut(3, f[0], f[1], win.vsize[key[3]])
                    out.append(("t2", key, part, "t2L", (x0, y0, P, f)))
            for key in (k for k in win.keys["ovoo"].get(n, ()) if k[2] == ny):
                m = span("o", key[3])
                for P in pieces(key[1]) if m else ():
                    part = rows + vcut(1, P, key[1]) + _cut(2, *y) + _cut(3, m[0], m[1], o.tiles[key[3]].size)
                    out.append(("ovoo", key, part, "ooL", (x0, y0, P, m)))
            for key in (k for k in win.keys["ovov"].get(n, ()) if k[2] == ny) if last else ():
                for P in pieces(key[1]):
                    for Q in pieces(key[3]):
                        part = rows + vcut(1, P, key[1]) + _cut(2, *y) + vcut(3, Q, key[3])
                        out.append(("ovov", key, part, "ovov", (x0, y0, P, Q)))
    return out


class StreamTables(ZeroTables):
    """One stage's rows in the forms the streamed kernel reads, per occupied orbital x:
    ``ov1`` (P, Q) -> [f, n_P, n_Q] = (x p|q f); ``t2R`` (P, Q) -> [m, n_P, n_Q] =
    t2[x m p q]; ``t2L`` (y0, S) -> [n_y, n_S, f] = t2[x y s f]; ``ooL`` (y0, S) ->
    [n_y, n_S, m] = (x s|y m); ``ovov`` (y0, P, Q) -> [n_y, n_P, n_Q] = (x p|y q)
    (P, Q, S window tiles; f, m the stage's chunk of their irrep; y0 the first orbital
    of one of the task's tiles; missing keys are zero)."""

    source_of = SOURCE_OF

    def __init__(self, win, irrep, chunks: Chunks, stage: int, ytiles: dict):
        super().__init__()
        self.win, self.irrep, self.ytiles = win, irrep, ytiles      # ytiles: y0 -> (orbitals, irrep)
        self.wv, self.wo = chunks.widths("v", stage), chunks.widths("o", stage)
        self.ystart = {y: y0 for y0, (ny, _) in ytiles.items() for y in range(y0, y0 + ny)}

    def _shape(self, kind, x, key) -> tuple:
        g, vt = self.irrep[x], self.win.vtiles
        if kind in ("ov1", "t2R"):
            P, Q = key
            return ((self.wv if kind == "ov1" else self.wo)[g ^ vt[P][0] ^ vt[Q][0]], vt[P][2], vt[Q][2])
        ny, gy = self.ytiles[key[0]]
        if kind == "ovov":
            return (ny, vt[key[1]][2], vt[key[2]][2])
        return (ny, vt[key[1]][2], (self.wv if kind == "t2L" else self.wo)[g ^ gy ^ vt[key[1]][0]])

    def add(self, kind: str, rows: np.ndarray, place) -> None:
        """Rows x0.. of a block as fetched (``stream_requests``' part), into table ``kind``."""
        win = (lambda p: slice(p[2], p[2] + p[3]))          # a piece in its window tile
        chunk = (lambda c: slice(c[2], c[2] + c[1] - c[0]))  # a span in its chunk
        x0 = place[0]
        for r, blk in enumerate(rows):
            x = x0 + r
            if kind in ("ov1", "t2R"):
                _, P, Q, c = place
                dest = self.get(kind, x, (P[0], Q[0]))
                if kind == "ov1":                            # blk[p q f]
                    dest[chunk(c), win(P), win(Q)] = blk.transpose(2, 0, 1)
                else:                                        # blk[m p q]
                    dest[chunk(c), win(P), win(Q)] = blk
            elif kind == "t2L":                              # blk[y s f]
                _, y0, P, c = place
                self.get(kind, x, (y0, P[0]))[:, win(P), chunk(c)] = blk
            elif kind == "ooL":                              # blk[s y m]
                _, y0, P, c = place
                self.get(kind, x, (y0, P[0]))[:, win(P), chunk(c)] = blk.transpose(1, 0, 2)
            else:                                            # ovov blk[p y q]
                _, y0, P, Q = place
                self.get(kind, x, (y0, P[0], Q[0]))[:, win(P), win(Q)] = blk.transpose(1, 0, 2)


class StreamTripleKernel(BlockedTripleKernel):
    """The blocked kernel on one window, one stage's chunk at a time: while ``adding``,
    ``tile_energy`` adds the chunk's W0 terms to W of each batch and block triple in
    ``acc`` (kept by the task across its stages) and returns 0; then (last stage) the
    energy from W, dropping it from ``acc``.  ``acc`` None (one chunk: an unstreamed
    windowed task): W in the kernel's buffers and the energy at once, as the blocked kernel."""

    def __init__(self, inp, G: int, pool: list, batch: int, vblock: int, win, window, tables: StreamTables,
                 acc: dict):
        super().__init__(inp, G, pool, batch, vblock, triples=win.block_triples(G, window),
                         frame=win.frame(window))
        self.win, self.tab, self.acc = win, tables, acc
        self.adding = True

    def energy(self, i: int, j: int, ks: range) -> float:
        if self.acc is None:                          # one stage: W and its energy at once
            return super().energy(i, j, ks)
        if not self.adding:
            frame = self._frame_v(i, j, ks)
            return sum(self._order_energy(order, self.acc.pop((i, j, ks[0], n)), frame)
                       for n, order in enumerate(self.triples))
        for n, order in enumerate(self.triples):
            key = (i, j, ks[0], n)
            held = self.acc.get(key)
            if held is None:                          # W at the first stage, then added to
                held = self.acc[key] = {b: np.empty((len(ks), b[0][2], b[1][2], b[2][2])) for b in order}
                self._order_w(i, j, ks, order, held)
            else:
                self._order_w(i, j, ks, order, held, add=True)
        return 0.0

    def _tile(self, block) -> tuple:
        """(window tile, offset inside it) of a kernel block."""
        return self.win.tile_at[(block[0], block[1])]

    def _accumulate(self, out, ks, os_, ot, ou, S, T, U) -> None:
        """``BlockedTripleKernel._accumulate`` over the stage's chunk of f and m."""
        g, nk = self.irr, len(ks)
        occ_irrep = (lambda x: g[ks[0]] if x is None else g[x])
        hu, ht = occ_irrep(os_) ^ occ_irrep(ou), occ_irrep(os_) ^ occ_irrep(ot)
        gs, ns, npair = S[0], S[2], T[2] * U[2]
        # sum_f (o_t t|u f) t2[o_s o_u s f],  sum_f (o_u u|t f) t2[o_s o_t s f],
        # -sum_m (o_s s|o_t m) t2[m o_u t u], -sum_m (o_s s|o_u m) t2[m o_t u t]
        terms = ((1.0, "t2L", ou, hu, "ov1", ot, False), (1.0, "t2L", ot, ht, "ov1", ou, True),
                 (-1.0, "ooL", ot, ht, "t2R", ou, True), (-1.0, "ooL", ou, hu, "t2R", ot, False))
        beta = 0.0
        for sign, lkind, ly, h, rkind, rx, swapped in terms:
            nc = (self.tab.wv if lkind == "t2L" else self.tab.wo)[gs ^ h]
            if not nc:
                continue
            left = self._left_chunk(lkind, os_, ly, ks, S, nc)
            if rx is not None:                     # one right operand for every k: one GEMM
                right = self._right_chunk(rkind, rx, T, U, swapped, nc)
                dgemm_into(sign, right, left.reshape(-1, nc), out.reshape(nk * ns, npair), beta)
            else:
                for n, k in enumerate(ks):
                    right = self._right_chunk(rkind, k, T, U, swapped, nc)
                    dgemm_into(sign, right, left.reshape(ns, nc), out[n], beta)
            self.flops += 2 * nk * ns * npair * nc
            beta = 1.0
        if not beta:
            out[...] = 0.0

    def _left_chunk(self, kind, x, y, ks, S, nc) -> np.ndarray:
        """[len(ks) or 1, n_S, nc] contiguous: table[x][(y's tile, S)] rows y, s in S (x or
        y None: each k of ks)."""
        tile, off = self._tile(S)
        ys = self.tab.ystart

        def rows(x_, y_, count=1):
            y0 = ys[y_]
            return self.tab.get(kind, x_, (y0, tile))[y_ - y0:y_ - y0 + count, off:off + S[2]]
        nk = len(ks) if x is None or y is None else 1
        out = self.lbuf[:nk * S[2] * nc].reshape(nk, S[2], nc)
        if x is None:
            for n, k in enumerate(ks):
                out[n] = rows(k, y)[0]
        else:
            out[...] = rows(x, ks[0], nk) if y is None else rows(x, y)
        return out

    def _right_chunk(self, kind, x, T, U, swapped, nc) -> np.ndarray:
        """[nc, n_T n_U] contiguous: table[x][(T, U)] (stored as (U, T) when ``swapped``)."""
        first, second = (U, T) if swapped else (T, U)
        (t1, o1), (t2, o2) = self._tile(first), self._tile(second)
        seg = self.tab.get(kind, x, (t1, t2))[:, o1:o1 + first[2], o2:o2 + second[2]]
        return self._into_rbuf(seg, nc, T, U, swapped)

    def _pairs(self, x, gy, rows: slice, P, Q):
        if P[0] ^ Q[0] != self.irr[x] ^ gy:
            return None
        y = int(self.inp.lay.orange[gy, 0]) + rows.start
        y0 = self.tab.ystart[y]
        (tp, op), (tq, oq) = self._tile(P), self._tile(Q)
        seg = self.tab.get("ovov", x, (y0, tp, tq))[y - y0:y - y0 + rows.stop - rows.start]
        return seg[:, op:op + P[2], oq:oq + Q[2]]


def dgemm_into(sign: float, right: np.ndarray, left: np.ndarray, out: np.ndarray, beta: float) -> None:
    """out[r, c] = sign sum_k left[r, k] right[k, c] + beta out (as the blocked kernel's GEMMs)."""
    dgemm(sign, right.T, left.T, beta=beta, c=out.T, overwrite_c=1)
