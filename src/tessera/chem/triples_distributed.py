"""(T) with distributed amplitudes and integrals: the same kernel, fed block by block.

``chem.triples`` holds the physics (Raghavachari et al. 1989; the closed-shell form and
the packed virtual-triple layouts): its ``_Kernel`` computes the contribution of one
occupied orbital triple from irrep-blocked operands. This module runs that kernel when
t2 and the integrals are spread over ranks: the work is split into tasks, one per
triple of occupied tiles (I >= J >= K), handed out by the context's executor
(``run_block_tasks``: NXTVAL or stealing for ``mpi-onesided``, bulk-synchronous rounds
for ``mpi-collective``). A task gets the blocks of the occupied tiles it touches,
builds the kernel's operands for just those orbitals (S, at most three tiles) and
calls the kernel with orbital numbers local to S. Partial energies are summed over
ranks in task order, so the result does not depend on the schedule.

What one rank holds: t1 (o x v) and the orbital energies (replicated, small), and per
occupied tensor tile X of a task (least recently used tiles dropped beyond six):
(X a|b c) for all a, b, c (twice, in the kernel's two pair orders: 2 tX v^3),
t2[m, X, a, b] for all m (o tX v^2), (i a|X b) and (i a|X m) for all i (o tX v^2,
o^2 tX v); never o^3 v^3 or v^4. With a single occupied tile these slabs are whole
tensors (as dense arrays): use tiles smaller than the occupied space.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections import OrderedDict

import numpy as np
from threadpoolctl import threadpool_limits

from tessera.chem import triples as serial
from tessera.errors import InputError, ShapeError

_log = logging.getLogger(__name__)
_NIRREP = serial._NIRREP
TILE_CACHE = 6        # occupied tiles whose derived operands a rank keeps


def _build(cls, **known):
    """``cls(...)`` with its parameters taken by name from ``known``: the private classes of
    chem.triples change while it is developed, and a missing argument should say so."""
    params = [p for p in inspect.signature(cls).parameters]
    unknown = [p for p in params if p not in known]
    if unknown:
        raise InputError(f"chem.triples.{cls.__name__} now needs {', '.join(unknown)}; "
                         "chem/triples_distributed.py must be updated to provide it")
    return cls(**{p: known[p] for p in params})


class _Tile:
    """Operands derived from one occupied tensor tile X (positions start..stop, irrep g)."""

    def __init__(self, g, start, stop, ov1, ov2, t2col, ovov, ovoo):
        self.g, self.start, self.stop = g, start, stop
        self.ov1, self.ov2 = ov1, ov2      # {g_f: [tX, n_v(g_f), pairs]} (kernel's ov1/ov2 rows)
        self.t2col = t2col                 # t2[m, x, a, b], all m, x in X   [o, tX, v, v]
        self.ovov = ovov                   # (i a | x b)                      [o, v, tX, v]
        self.ovoo = ovoo                   # (i a | x m)                      [o, v, tX, o]


class _LocalInputs:
    """Duck-typed ``triples._Inputs`` for the orbitals S of one task (local numbering)."""


class DistributedTriples:
    """Builds tasks and local operands; the executor decides who runs what."""

    def __init__(self, ints, t1, t2, context, occ_tile):
        self.ints, self.t1, self.t2 = ints, t1, t2
        self.ctx = context
        o, v = ints.o, ints.v
        self.o, self.v = o, v
        self.orange, self.vrange = serial._ranges(o, "occupied"), serial._ranges(v, "virtual")
        self.lay = _build(serial._VirtualLayout, vrange=self.vrange, irreps=v.irreps,
                          ev=np.asarray(ints.ev, float)[v.orbitals])
        self.nv = self.lay.n
        self.no = self.orange[:, 1] - self.orange[:, 0]
        self.eo = np.asarray(ints.eo, float)[o.orbitals]
        self.t1d = t1.to_dense()[np.ix_(o.orbitals, v.orbitals)]        # in space positions
        self.cache: OrderedDict = OrderedDict()          # tensor tile -> _Tile
        nirrep = len(set(v.irreps.tolist()) | set(o.irreps.tolist())) or 1
        if occ_tile is None:
            occ_tile = max(1, int((2e6 / max(1.0, v.dim ** 3 / nirrep)) ** (1 / 3)))
        # task tiles: tensor tiles (irrep-pure, in position order) cut to <= occ_tile
        self.tiles = []
        for n, tl in enumerate(o.tiles):
            for s0 in range(tl.offset, tl.offset + tl.size, occ_tile):
                self.tiles.append((s0, min(s0 + occ_tile, tl.offset + tl.size), tl.irrep, n))
        self.triples = [(a, b, c) for a in range(len(self.tiles)) for b in range(a + 1) for c in range(b + 1)]
        for G in sorted({self.tiles[a][2] ^ self.tiles[b][2] ^ self.tiles[c][2] for a, b, c in self.triples}):
            self.lay.prepare(G, v.dim)
        self.flops = 0
        self.pool = None

    # ------------------------------------------------------------------ blocks per tile
    def _tile_keys(self, n: int) -> list:
        """(tensor, key) of every block that tile n of the occupied space contributes."""
        out = []
        for t, pos in ((self.ints.ovvv, 0), (self.t2, 1), (self.ints.ovov, 2), (self.ints.ovoo, 2)):
            out += [(t, k) for k in t.allowed_keys() if k[pos] == n]
        return out

    def need(self, task: int) -> list:
        wanted = {self.tiles[x][3] for x in self.triples[task]}
        return [req for n in sorted(wanted) if n not in self.cache for req in self._tile_keys(n)]

    def _build_tile(self, n: int, blocks: dict) -> _Tile:
        o, v, lay, nv = self.o, self.v, self.lay, self.nv
        tl = o.tiles[n]
        tx, g = tl.size, tl.irrep
        vr = self.vrange
        ov1, ov2 = {}, {}
        for gf in range(_NIRREP):
            if nv[gf]:
                h = g ^ gf
                ov1[gf] = np.zeros((tx, int(nv[gf]), int(lay.npair[h])))
                ov2[gf] = np.zeros((tx, int(nv[gf]), int(lay.npair[h])))
        ovvv = self.ints.ovvv
        for key in ovvv.allowed_keys():
            if key[0] != n:
                continue
            blk = blocks[(ovvv.uid, key)]
            tiles = [sp.tiles[k] for sp, k in zip(ovvv.spaces, key)]
            gp, gq, gf = (t.irrep for t in tiles[1:])
            h = gp ^ gq
            ps, qs, fs = (slice(t.offset - vr[t.irrep, 0], t.offset - vr[t.irrep, 0] + t.size) for t in tiles[1:])
            seg1 = ov1[gf][:, :, lay.poff[h, gp]:lay.poff[h, gp] + nv[gp] * nv[gq]]
            seg1.reshape(tx, nv[gf], nv[gp], nv[gq])[:, fs, ps, qs] = blk.transpose(0, 3, 1, 2)
            seg2 = ov2[gf][:, :, lay.poff[h, gq]:lay.poff[h, gq] + nv[gq] * nv[gp]]
            seg2.reshape(tx, nv[gf], nv[gq], nv[gp])[:, fs, qs, ps] = blk.transpose(0, 3, 2, 1)
        t2col = np.zeros((o.dim, tx, v.dim, v.dim))
        ovov = np.zeros((o.dim, v.dim, tx, v.dim))
        ovoo = np.zeros((o.dim, v.dim, tx, o.dim))
        for t, arr, pos in ((self.t2, t2col, 1), (self.ints.ovov, ovov, 2), (self.ints.ovoo, ovoo, 2)):
            for key in t.allowed_keys():
                if key[pos] == n:
                    sl = tuple(slice(None) if a == pos else sp.slice(k) for a, (sp, k) in enumerate(zip(t.spaces, key)))
                    arr[sl] = blocks[(t.uid, key)]
        return _Tile(g, tl.offset, tl.offset + tx, ov1, ov2, t2col, ovov, ovoo)

    def _tile(self, n: int, blocks: dict) -> _Tile:
        hit = self.cache.get(n)
        if hit is not None:
            self.cache.move_to_end(n)
            return hit
        tile = self._build_tile(n, blocks)
        self.cache[n] = tile
        while len(self.cache) > TILE_CACHE:
            self.cache.popitem(last=False)
        return tile

    # ------------------------------------------------------------------ one task
    def _inputs(self, S: np.ndarray, tiles: dict) -> _LocalInputs:
        """The kernel's operands for orbital positions S (sorted), numbered 0..|S|-1."""
        o, v, nv = self.o, self.v, self.nv
        inp = _LocalInputs()
        ns = len(S)
        owner = [next(tl for tl in tiles.values() if tl.start <= p < tl.stop) for p in S]
        loc = [p - tl.start for p, tl in zip(S, owner)]
        irr = o.irreps[S]
        inp.nocc, inp.nvir = ns, v.dim
        inp.eo = self.eo[S]
        inp.t1 = np.ascontiguousarray(self.t1d[S])
        inp.ov_irrep = irr
        inp.orel = np.array([int(np.sum(irr[:n] == irr[n])) for n in range(ns)], dtype=np.int64)
        inp.lay = self.lay
        inp.orange = self.orange
        inp.nv_by_irrep, inp.no_by_irrep = nv, self.no
        inp.ovov = np.empty((ns, ns, v.dim, v.dim))
        for b in range(ns):
            inp.ovov[:, b] = owner[b].ovov[S, :, loc[b], :]
        present = [g for g in range(_NIRREP) if nv[g]]
        opresent = [g for g in range(_NIRREP) if self.no[g]]
        vsl = {g: slice(*self.vrange[g]) for g in present}
        osl = {g: slice(*self.orange[g]) for g in opresent}
        inp.t2f = {}
        for gf in present:
            arr = np.empty((ns, ns, v.dim, int(nv[gf])))
            for y in range(ns):
                arr[:, y] = owner[y].t2col[S, loc[y], :, vsl[gf]]
            inp.t2f[gf] = arr
        inp.ooL = {}
        for gm in opresent:
            arr = np.empty((ns, ns, v.dim, int(self.no[gm])))
            for y in range(ns):
                arr[:, y] = owner[y].ovoo[S, :, loc[y], osl[gm]]
            inp.ooL[gm] = arr
        inp.ov1, inp.ov2, inp.t2p1, inp.t2p2 = {}, {}, {}, {}
        for gx in sorted(set(irr.tolist())):
            members = [n for n in range(ns) if irr[n] == gx]
            for gf in present:
                inp.ov1[gx, gf] = np.concatenate([owner[n].ov1[gf][loc[n]:loc[n] + 1] for n in members])
                inp.ov2[gx, gf] = np.concatenate([owner[n].ov2[gf][loc[n]:loc[n] + 1] for n in members])
            for gm in opresent:
                h = gx ^ gm
                p1, p2 = [], []
                for n in members:
                    col = owner[n].t2col[osl[gm], loc[n]]                       # [m, q, r]
                    r1, r2 = [], []
                    for gq in present:
                        gr = gq ^ h
                        if not nv[gr]:
                            continue
                        r1.append(col[:, vsl[gq], vsl[gr]].reshape(col.shape[0], -1))   # t2[m z q r]
                        r2.append(col[:, vsl[gr], vsl[gq]].transpose(0, 2, 1).reshape(col.shape[0], -1))
                    nm = int(self.no[gm])
                    p1.append(np.concatenate(r1, axis=1) if r1 else np.zeros((nm, 0)))
                    p2.append(np.concatenate(r2, axis=1) if r2 else np.zeros((nm, 0)))
                inp.t2p1[gx, gm] = np.ascontiguousarray(np.stack(p1))
                inp.t2p2[gx, gm] = np.ascontiguousarray(np.stack(p2))
        return inp

    def work(self, task: int, blocks: dict) -> float:
        a, b, c = self.triples[task]
        I, J, K = self.tiles[a], self.tiles[b], self.tiles[c]
        wanted = sorted({I[3], J[3], K[3]})
        for n in wanted:                 # keep this task's cached tiles from being dropped
            if n in self.cache:
                self.cache.move_to_end(n)
        tiles = {n: self._tile(n, blocks) for n in wanted}
        S = np.array(sorted(set(range(I[0], I[1])) | set(range(J[0], J[1])) | set(range(K[0], K[1]))))
        local = {int(p): n for n, p in enumerate(S)}
        inp = self._inputs(S, tiles)
        if self.pool is None:            # the kernel's buffers, reused by this rank's tasks
            self.pool = [np.empty(int(self.lay.ntrip.max())) for _ in range(8)]
        kern = _build(serial._Kernel, inp=inp, G=I[2] ^ J[2] ^ K[2], pool=self.pool)
        energy = 0.0
        for i in range(I[0], I[1]):
            for j in range(J[0], min(J[1], i + 1)):
                for k in range(K[0], min(K[1], j + 1)):
                    weight = 1 if i == k else (3 if i == j or j == k else 6)
                    energy += weight * kern.energy(local[i], local[j], local[k])
        self.flops += kern.flops
        return energy / 3.0

    def cost(self, task: int) -> float:
        a, b, c = self.triples[task]
        return float(np.prod([self.tiles[x][1] - self.tiles[x][0] for x in (a, b, c)]))


def triples_correction_distributed(ints, t1, t2, *, context=None, occ_tile: int | None = None):
    """E(T) of distributed CCSD amplitudes; the signature and result of
    :func:`tessera.chem.triples.triples_correction` (collective: every rank calls it and
    gets the same energy)."""
    from tessera.backends.context import current_context

    t_start = time.perf_counter()
    context = current_context() if context is None else context
    if not getattr(context, "distributed", False):
        raise InputError("triples_correction_distributed needs a distributed context "
                         "(mpi-onesided or mpi-collective); use chem.triples.triples_correction otherwise")
    o, v = ints.o, ints.v
    if t1.spaces != (o, v) or t2.spaces != (o, o, v, v) or t1.irrep or t2.irrep:
        raise ShapeError("t1 must be a BlockTensor over (ints.o, ints.v) and t2 over "
                         "(ints.o, ints.o, ints.v, ints.v), both of irrep 0")
    if occ_tile is not None and (isinstance(occ_tile, bool) or not isinstance(occ_tile, (int, np.integer))
                                 or occ_tile < 1):
        raise InputError(f"occ_tile must be a positive integer or None, got {occ_tile!r}")
    job = DistributedTriples(ints, t1, t2, context, occ_tile)
    costs = [job.cost(i) for i in range(len(job.triples))]
    ex = context.executor
    snap = ex.account.begin()
    c0 = ex.compute_seconds
    chunk = max(1, min(8, len(costs) // (4 * ex.world.size)))
    with threadpool_limits(limits=ex.blas_threads, user_api="blas"):
        results = ex.run_block_tasks(costs, job.need, job.work, chunk)
    energy = float(sum(results.tolist()))               # task order: schedule-independent
    flops = int(ex.world.allreduce(job.flops, "sum")) if ex.world.size > 1 else job.flops
    seconds = time.perf_counter() - t_start
    ex.account.end("(T) triples", snap, seconds, ex.compute_seconds - c0, flops)
    _log.info("(T) correction %.12f Eh: %d tasks, %.3g GFLOP, %.2f s", energy, len(costs),
              flops / 1e9, seconds)
    return serial.TriplesResult(energy, flops, len(costs), seconds)
