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
four per choice of single index (a, b or c); index maps (cyclic shifts and a pair swap
of abc) join the three layouts and apply r3.  With one virtual irrep (C1) the layouts
are [v, v, v] arrays, eight terms land in W[abc] directly and the moves are transposes.
Tasks are the unique triples of occupied tiles (one irrep each), run by the context's
executor; each task keeps private buffers of a few packed v^3 / nirrep arrays.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

import numpy as np
from scipy.linalg.blas import dgemm
from threadpoolctl import threadpool_limits

from tessera.errors import InputError, ShapeError

__all__ = ["TriplesResult", "triples_correction"]

_log = logging.getLogger(__name__)
_NIRREP = 8                       # irrep labels are bits of D2h and its subgroups


@dataclass(frozen=True)
class TriplesResult:
    energy: float                 # E(T) in hartree
    flops: int                    # GEMM flops actually done
    tasks: int                    # occupied tile triples run
    seconds: float                # wall time of the whole correction


# --------------------------------------------------------------------------- layout
def _ranges(space, what: str) -> np.ndarray:
    """(start, stop) of every irrep's positions in ``space``; each irrep contiguous."""
    rng = np.zeros((_NIRREP, 2), dtype=np.int64)
    irreps = space.irreps
    if len(irreps) and not 0 <= irreps.min() <= irreps.max() < _NIRREP:
        raise InputError(f"{what} irrep labels {sorted(set(irreps.tolist()))} are not D2h bit labels "
                         f"0..7; use an Abelian point group (e.g. D2h for linear molecules)")
    for g in range(_NIRREP):
        pos = np.flatnonzero(irreps == g)
        if len(pos):
            if pos[-1] - pos[0] + 1 != len(pos):
                raise InputError(f"{what} orbitals of irrep {g} are not contiguous in space "
                                 f"{space.name!r}; build the spaces with IndexSpace.from_irreps")
            rng[g] = pos[0], pos[-1] + 1
    return rng


class _VirtualLayout:
    """Packed (single, pair) layouts of the virtual triples of each total irrep G."""

    def __init__(self, vrange: np.ndarray, irreps: np.ndarray, ev: np.ndarray):
        self.vr, self.irrep, self.ev, self.maps = vrange, irreps, ev, {}
        self.n = n = vrange[:, 1] - vrange[:, 0]
        xor = np.bitwise_xor.outer(np.arange(_NIRREP), np.arange(_NIRREP))
        offsets = (lambda sz: np.vstack([np.zeros(_NIRREP, np.int64), np.cumsum(sz, axis=0)[:-1]]).T)
        sizes = n[:, None] * n[xor]                  # pairs (t, u) of irrep h: [g_t, h] blocks
        self.npair, self.poff = sizes.sum(axis=0), offsets(sizes)              # poff[h, g_t]
        sizes = n[:, None] * self.npair[xor]         # triples of irrep G: [g_s, G] blocks
        self.ntrip, self.foff = sizes.sum(axis=0), offsets(sizes)              # foff[G, g_s]
        self.rel = np.arange(len(irreps)) - vrange[irreps, 0]

    def blocks(self, G: int) -> list:
        """(g_s, offset, n_single, n_pairs) of the non-empty single-irrep blocks of G."""
        return [(gs, int(self.foff[G, gs]), int(self.n[gs]), int(self.npair[G ^ gs]))
                for gs in range(_NIRREP) if self.n[gs] and self.npair[G ^ gs]]

    def pair_positions(self, h: int) -> tuple:
        """Virtual positions (t, u) of the packed pairs of irrep h."""
        ts, us = [], []
        for gt in range(_NIRREP):
            gu = gt ^ h
            t = np.arange(self.vr[gt, 0], self.vr[gt, 1])
            u = np.arange(self.vr[gu, 0], self.vr[gu, 1])
            ts.append(np.repeat(t, len(u)))
            us.append(np.tile(u, len(t)))
        return np.concatenate(ts), np.concatenate(us)

    def index(self, G: int, s, t, u):
        """Packed position of the virtual triple (single s, pair (t, u)) of irrep G."""
        gs, gu = self.irrep[s], self.irrep[u]
        h = G ^ gs
        return (self.foff[G, gs] + self.rel[s] * self.npair[h] + self.poff[h, self.irrep[t]]
                + self.rel[t] * self.n[gu] + self.rel[u])

    def prepare(self, G: int, nvir: int) -> None:
        """Maps of G: cyclic shifts (rot, rot2) and pair swap of abc, e_a+e_b+e_c, pairs."""
        ss, ts, us, p3, blocks, q0 = [], [], [], [], [], 0
        for gs, off, ns, npair in self.blocks(G):
            t, u = self.pair_positions(G ^ gs)
            s = np.arange(self.vr[gs, 0], self.vr[gs, 1])
            ss.append(np.repeat(s, npair))
            ts.append(np.tile(t, ns))
            us.append(np.tile(u, ns))
            p3.append((np.arange(3)[:, None] * nvir * nvir + t * nvir + u).ravel())
            blocks.append((gs, off, ns, npair, q0))
            q0 += 3 * npair
        cat = (lambda x: np.concatenate(x) if x else np.zeros(0, np.int64))
        s, t, u = cat(ss), cat(ts), cat(us)
        dense = len(blocks) == 1 and len(set(self.irrep.tolist())) == 1
        maps = dict(e3=self.ev[s] + self.ev[t] + self.ev[u], pairs3=cat(p3), blocks=blocks,
                    dense=bool(dense))
        if not dense:       # packed: index maps; dense: the same moves are transposes
            maps.update(rot=self.index(G, t, u, s), rot2=self.index(G, u, s, t),
                        swap=self.index(G, s, u, t))
        self.maps[G] = maps


# --------------------------------------------------------------------------- inputs
def _array(t) -> np.ndarray:
    """A BlockTensor as one array in space-position (tile) order; used for o^2 v^2 and smaller."""
    out = np.zeros(tuple(s.dim for s in t.spaces))
    for key, blk in t.blocks.items():
        out[tuple(s.slice(k) for s, k in zip(t.spaces, key))] = blk
    return out


class _Inputs:
    """Irrep-blocked, read-only operands shared by all tasks (built once)."""

    def __init__(self, ints, t1, t2):
        o, v = ints.o, ints.v
        self.orange, vr = _ranges(o, "occupied"), _ranges(v, "virtual")
        self.nocc, self.nvir = o.dim, v.dim
        self.eo = np.asarray(ints.eo, float)[o.orbitals]
        self.ov_irrep = o.irreps
        self.lay = lay = _VirtualLayout(vr, v.irreps, np.asarray(ints.ev, float)[v.orbitals])
        self.orel = np.arange(o.dim) - self.orange[o.irreps, 0]
        self.nv_by_irrep = nv = lay.n
        self.no_by_irrep = no = self.orange[:, 1] - self.orange[:, 0]
        self.t1 = _array(t1)
        t2d = _array(t2)                                                    # t2[i j a b]
        ovoo = _array(ints.ovoo)                                            # (ia|jm)
        self.ovov = np.ascontiguousarray(_array(ints.ovov).transpose(0, 2, 1, 3))  # [i j a b]
        vsl = {g: slice(*vr[g]) for g in range(_NIRREP) if nv[g]}
        osl = {g: slice(*self.orange[g]) for g in range(_NIRREP) if no[g]}
        # term 1 left: t2f[g_f][z, y, r, f of g_f];  term 2 left: ooL[g_m][x, y, p, m of g_m]
        self.t2f = {g: np.ascontiguousarray(t2d[..., sl]) for g, sl in vsl.items()}
        self.ooL = {g: np.ascontiguousarray(ovoo[..., sl].transpose(0, 2, 1, 3))
                    for g, sl in osl.items()}
        # term 1 right: ov1[g_x, g_f][x, f, (p q)] = (xp|qf); ov2 the same at the pair (q p)
        self.ov1 = {(gx, gf): np.zeros((no[gx], nv[gf], lay.npair[gx ^ gf]))
                    for gx in osl for gf in vsl}
        self.ov2 = {key: np.zeros_like(a) for key, a in self.ov1.items()}
        for key, blk in ints.ovvv.blocks.items():                         # blk[x p q f]
            tx, tp, tq, tf = (sp.tiles[n] for sp, n in zip(ints.ovvv.spaces, key))
            gx, gp, gq, gf = tx.irrep, tp.irrep, tq.irrep, tf.irrep
            xs, ps, qs, fs = (slice(tl.offset - rng[tl.irrep, 0], tl.offset - rng[tl.irrep, 0] + tl.size)
                              for tl, rng in ((tx, self.orange), (tp, vr), (tq, vr), (tf, vr)))
            for table, g1, g2, sl1, sl2, perm in ((self.ov1, gp, gq, ps, qs, (0, 3, 1, 2)),
                                                  (self.ov2, gq, gp, qs, ps, (0, 3, 2, 1))):
                p0 = lay.poff[gp ^ gq, g1]
                seg = table[gx, gf][:, :, p0:p0 + nv[g1] * nv[g2]]
                seg.reshape(no[gx], nv[gf], nv[g1], nv[g2])[xs, fs, sl1, sl2] = blk.transpose(perm)
        # term 2 right: t2p1[g_z, g_m][z, m, (q r)] = t2[m z q r]; t2p2 at the pair (r q)
        self.t2p1, self.t2p2 = {}, {}
        for gz in osl:
            for gm in osl:
                h, shape = gz ^ gm, (no[gz], no[gm], -1)
                pairs = [(vsl[gq], vsl[gq ^ h]) for gq in vsl if nv[gq ^ h]]
                join = (lambda parts: np.concatenate(parts, axis=2) if parts
                        else np.zeros(shape[:2] + (0,)))
                self.t2p1[gz, gm] = join([t2d[osl[gm], osl[gz], q, r].transpose(1, 0, 2, 3)
                                          .reshape(shape) for q, r in pairs])
                self.t2p2[gz, gm] = join([t2d[osl[gz], osl[gm], q, r].reshape(shape)
                                          for q, r in pairs])


# --------------------------------------------------------------------------- kernel
class _Kernel:
    """E(T) contributions of the orbital triples of one task, in its thread's buffers."""

    def __init__(self, inp: _Inputs, G: int, pool: list):
        self.inp, self.G = inp, G
        self.maps = inp.lay.maps[G]
        self.dense = self.maps["dense"]
        n = int(inp.lay.ntrip[G])
        self.buf = [a[:n] for a in pool[:5 if self.dense else 8]]   # the thread's buffers
        self.flops = 0

    def _accumulate(self, out, os_, ot, ou) -> None:
        """out = the 4 W0 terms with (o_s, s) single, pair (t, u); blocks [s, (t, u)]."""
        inp, g = self.inp, self.inp.ov_irrep
        gs_ = g[os_]
        for gs, off, ns, npair, _ in self.maps["blocks"]:
            c = out[off:off + ns * npair].reshape(ns, npair).T
            v0, v1 = inp.lay.vr[gs]
            beta = 0.0
            # sum_f (o_t t|u f) t2[o_s o_u s f]  and  sum_f (o_u u|t f) t2[o_s o_t s f]
            terms = [(1.0, inp.t2f[gf][os_, y, v0:v1], table[g[x], gf][inp.orel[x]])
                     for x, y, table in ((ot, ou, inp.ov1), (ou, ot, inp.ov2))
                     for gf in (gs ^ gs_ ^ g[y],) if inp.nv_by_irrep[gf]]
            # -sum_m (o_s s|o_t m) t2[m o_u t u]  and  -sum_m (o_s s|o_u m) t2[m o_t u t]
            terms += [(-1.0, inp.ooL[gm][os_, y, v0:v1], table[g[z], gm][inp.orel[z]])
                      for y, z, table in ((ot, ou, inp.t2p1), (ou, ot, inp.t2p2))
                      for gm in (gs ^ gs_ ^ g[y],) if inp.no_by_irrep[gm]]
            for alpha, left, right in terms:              # left [s, K], right [K, (t, u)]
                dgemm(alpha, right.T, left.T, beta=beta, c=c, overwrite_c=1)
                self.flops += 2 * ns * npair * left.shape[1]
                beta = 1.0
            if beta == 0.0:
                c[...] = 0.0

    def _pair_vectors(self, i, j, k) -> tuple:
        """Per block [3, pairs]: P = (jt|ku), (kt|iu), (it|ju) and P - 2 (ju|kt), (ku|it), (iu|jt).

        P makes V_l = t1[o_s s] (o_t t|o_u u) rank 1 in the cyclic layouts; the pair-swapped
        part is V[acb], which Zs = Yc[acb] meets as Yc meets V.
        """
        o2 = self.inp.ovov.reshape(-1, self.inp.nvir ** 2)
        no, pairs = self.inp.nocc, self.maps["pairs3"]
        p = o2[[j * no + k, k * no + i, i * no + j]].ravel()[pairs]
        return p, p - 2.0 * o2[[k * no + j, i * no + k, j * no + i]].ravel()[pairs]

    def _u_dot_v(self, U, i, j, k, P) -> float:
        """sum_l U.V_l with V_l = t1[o_s s] P_l[(t, u)] rank 1 in the cyclic layout l."""
        t1, vr = self.inp.t1, self.inp.lay.vr
        total = 0.0
        for gs, off, ns, npair, q0 in self.maps["blocks"]:
            v0, v1 = vr[gs]
            uv = U[off:off + ns * npair].reshape(ns, npair) @ P[q0:q0 + 3 * npair].reshape(3, npair).T
            total += float(np.vdot(t1[[i, j, k], v0:v1].T, uv))
        return total

    def energy(self, i: int, j: int, k: int) -> float:
        """sum_abc W r3(W + V) / D for one orbital triple (without the 1/3).

        With Y = W/D, Yc = Y + Y[bca] + Y[cab] and Zs = Yc[acb] (both invariant under
        cyclic shifts of abc), r3(Y) = 3Y + Yc - 2Zs and sum Y r3(X) = sum r3(Y) X.
        Invariant weights meet V = V1 + V2 + V3 in any cyclic layout, where each V_l is
        rank 1; 3Y meets V in layout (a; b, c).
        """
        return self._energy_dense(i, j, k) if self.dense else self._energy_packed(i, j, k)

    def _energy_dense(self, i, j, k) -> float:
        """One virtual irrep: layouts are [v, v, v] arrays and relayouts are transposes."""
        nv, t1, ov = self.inp.nvir, self.inp.t1, self.inp.ovov
        W, Sb, Y, U, T = self.buf
        cube = (lambda x: x.reshape(nv, nv, nv))
        if i == j:                                                # single a and b alike
            self._accumulate(Sb, j, i, k)                         # [b, (a c)] = [a, (b c)]
            np.add(cube(Sb), cube(Sb).transpose(1, 0, 2), out=cube(W))
        else:
            self._accumulate(W, i, j, k)                          # [a, (b c)]
            self._accumulate(Sb, j, i, k)                         # [b, (a c)]
            cube(W)[...] += cube(Sb).transpose(1, 0, 2)
        if j != k:                                                # else single c as single b
            self._accumulate(Sb, k, i, j)                         # [c, (a b)]
        cube(W)[...] += cube(Sb).transpose(1, 2, 0)               # W[abc]
        eo = self.inp.eo
        np.subtract(eo[i] + eo[j] + eo[k], self.maps["e3"], out=Y)
        np.divide(W, Y, out=Y)                                    # Y = W / D
        P, Pz = self._pair_vectors(i, j, k)
        e = 3.0 * (float(W @ Y) + t1[i] @ (Y.reshape(nv, -1) @ P[:nv * nv])
                   + float(np.vdot(np.matmul(t1[j], cube(Y)), ov[i, k]))
                   + float(np.vdot(Y.reshape(-1, nv) @ t1[k], ov[i, j])))
        np.copyto(cube(Sb), cube(Y).transpose(0, 2, 1))          # Y[acb]
        np.copyto(cube(T), cube(Y).transpose(1, 0, 2))           # Y[bac]
        np.add(cube(Y), cube(Sb).transpose(1, 0, 2), out=cube(U))  # + Y[bca]
        cube(U)[...] += cube(T).transpose(0, 2, 1)               # + Y[cab] = Yc
        np.copyto(cube(T), cube(U).transpose(0, 2, 1))           # Zs
        return e + float(U @ W) - 2.0 * float(T @ W) + self._u_dot_v(U, i, j, k, Pz)

    def _energy_packed(self, i, j, k) -> float:
        """Point-group symmetry: three cyclic layouts joined by index maps."""
        m = self.maps
        Sa, Sb, Sc, W, Y, Y1, Y2, U = self.buf
        self._accumulate(Sa, i, j, k)                             # single a, pair (b, c)
        if i == j:                                                # the same terms, pair swapped
            np.take(Sa, m["swap"], out=Sb, mode="wrap")
        else:
            self._accumulate(Sb, j, k, i)                         # single b, pair (c, a)
        if j == k:
            np.take(Sb, m["swap"], out=Sc, mode="wrap")
        else:
            self._accumulate(Sc, k, i, j)                         # single c, pair (a, b)
        np.take(Sb, m["rot"], out=W, mode="wrap")
        W += Sa
        np.take(Sc, m["rot2"], out=Y1, mode="wrap")
        W += Y1                                                   # W in layout (a; b, c)
        eo = self.inp.eo
        np.subtract(eo[i] + eo[j] + eo[k], m["e3"], out=Y)
        np.divide(W, Y, out=Y)                                    # Y = W / D
        np.take(Y, m["rot"], out=Y1, mode="wrap")                 # Y[bca]
        np.take(Y, m["rot2"], out=Y2, mode="wrap")                # Y[cab]
        np.add(Y, Y1, out=U)
        U += Y2                                                   # Yc
        P, Pz = self._pair_vectors(i, j, k)
        t1, vr = self.inp.t1, self.inp.lay.vr
        e = 3.0 * float(W @ Y)
        for gs, off, ns, npair, q0 in m["blocks"]:                # 3Y.V, V_l rank 1 per block
            v0, v1 = vr[gs]
            p = P[q0:q0 + 3 * npair].reshape(3, npair)
            sl = slice(off, off + ns * npair)
            for y, o, row in ((Y, i, 0), (Y2, j, 1), (Y1, k, 2)):
                e += 3.0 * (t1[o, v0:v1] @ (y[sl].reshape(ns, npair) @ p[row]))
        Sa += Sb
        Sa += Sc                                                  # U.W = U.(Sa + Sb + Sc)
        np.take(U, m["swap"], out=Y1, mode="wrap")                # Zs
        return e + float(U @ Sa) - 2.0 * float(Y1 @ Sa) + self._u_dot_v(U, i, j, k, Pz)


# --------------------------------------------------------------------------- driver
def _occ_tiles(orange: np.ndarray, tile: int) -> list:
    """(start, stop, irrep) of occupied tiles of one irrep and at most ``tile`` orbitals."""
    tiles = []
    for g in np.argsort(orange[:, 0], kind="stable"):
        a, b = orange[g]
        tiles += [(int(s), int(min(s + tile, b)), int(g)) for s in range(a, b, tile)]
    return tiles


def _run_task(inp: _Inputs, I, J, K, results: list, slot: int, local) -> None:
    """Weighted E(T) of the orbital triples i >= j >= k of the tiles I >= J >= K."""
    G = I[2] ^ J[2] ^ K[2]
    if not inp.lay.ntrip[G]:                     # no virtual triple of this irrep
        results[slot] = (0.0, 0)
        return
    if not hasattr(local, "pool"):               # one set per thread, reused by its tasks
        local.pool = [np.empty(int(inp.lay.ntrip.max())) for _ in range(8)]   # (new pages are slow)
    kern = _Kernel(inp, G, local.pool)
    energy = 0.0
    for i in range(*I[:2]):
        for j in range(J[0], min(J[1], i + 1)):
            for k in range(K[0], min(K[1], j + 1)):
                weight = 1 if i == k else (3 if i == j or j == k else 6)
                energy += weight * kern.energy(i, j, k)
    results[slot] = (energy / 3.0, kern.flops)


def triples_correction(ints, t1, t2, *, context=None, occ_tile: int | None = None) -> TriplesResult:
    """E(T) of closed-shell CCSD amplitudes ``t1`` (o, v) and ``t2`` (o, o, v, v).

    ``ints`` are the MO integrals of :func:`tessera.chem.integrals.transform` (canonical
    RHF orbitals).  One task per unique triple of occupied tiles (``occ_tile`` orbitals
    of one irrep at most; default from the size of the virtual space) runs on
    ``context.executor`` (default: the current context); partial energies are summed in
    a fixed order, so every executor gives the same number.  Raises ShapeError when the
    amplitudes are not over ``ints``' spaces, InputError for a bad ``occ_tile``.
    """
    from tessera.backends.context import current_context

    t_start = time.perf_counter()
    context = current_context() if context is None else context
    o, v = ints.o, ints.v
    if t1.spaces != (o, v) or t2.spaces != (o, o, v, v) or t1.irrep or t2.irrep:
        raise ShapeError("t1 must be a BlockTensor over (ints.o, ints.v) and t2 over "
                         "(ints.o, ints.o, ints.v, ints.v), both of irrep 0; build them with "
                         "BlockTensor.from_dense(..., (ints.o, ints.v)) from the same MOIntegrals")
    if getattr(context, "distributed", False) or any(getattr(t, "dist", None) is not None
                                                     for t in (t1, t2, *ints.tensors.values())):
        raise InputError("triples_correction reads whole local tensors; with a distributed "
                         "context use chem.triples_distributed.triples_correction_distributed")
    integer = isinstance(occ_tile, (int, np.integer)) and not isinstance(occ_tile, bool)
    if occ_tile is not None and not (integer and occ_tile >= 1):
        raise InputError(f"occ_tile must be a positive integer or None, got {occ_tile!r}")
    inp = _Inputs(ints, t1, t2)
    nirrep = len(set(v.irreps.tolist()) | set(o.irreps.tolist())) or 1
    if occ_tile is None:     # one task's orbital triples ~ 2e6 virtual triples
        occ_tile = max(1, int((2e6 / max(1.0, v.dim ** 3 / nirrep)) ** (1 / 3)))
    tiles = _occ_tiles(inp.orange, int(occ_tile))
    triples = [(I, J, K) for a, I in enumerate(tiles) for b, J in enumerate(tiles[:a + 1])
               for K in tiles[:b + 1]]
    for G in sorted({I[2] ^ J[2] ^ K[2] for I, J, K in triples}):
        inp.lay.prepare(G, v.dim)
    results: list = [None] * len(triples)
    cost = [(I[1] - I[0]) * (J[1] - J[0]) * (K[1] - K[0]) * inp.lay.ntrip[I[2] ^ J[2] ^ K[2]]
            for I, J, K in triples]
    order = sorted(range(len(triples)), key=lambda n: -cost[n])      # largest first
    local = threading.local()
    tasks = [(lambda n=n: _run_task(inp, *triples[n], results, n, local)) for n in order]
    with threadpool_limits(limits=context.executor.blas_threads, user_api="blas"):
        context.executor.run(tasks)
    energy = float(sum(r[0] for r in results))     # in triple order whatever ran first
    flops = int(sum(r[1] for r in results))
    seconds = time.perf_counter() - t_start
    stat = context.stats.setdefault("(T) triples correction", [0, 0.0, 0])
    stat[0], stat[1], stat[2] = stat[0] + 1, stat[1] + seconds, stat[2] + flops
    context.flops += flops
    _log.info("(T) correction %.12f Eh: %d tasks, %.3g GFLOP, %.2f s", energy, len(tasks),
              flops / 1e9, seconds)
    return TriplesResult(energy, flops, len(tasks), seconds)
