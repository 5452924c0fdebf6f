"""(T) with distributed amplitudes and integrals: the public kernel of ``chem.triples``,
fed per task with the occupied rows it reads and nothing more.

The physics, the packed layouts and the kernel are ``chem.triples``' (:class:`TripleKernel`
on :class:`KernelInputs` built from :class:`RowSlab` s).  The work is split into tasks,
one per triple of occupied *task tiles* I >= J >= K; a task tile is a run of at most
``occ_tile`` orbitals inside one occupied tensor tile (default: ``nocc // 8``, at least
1 and at most the serial default, so a task's orbitals are a small part of the
occupied space).  The context's executor hands the tasks out (``run_block_tasks``: NXTVAL
or stealing for ``mpi-onesided``, bulk-synchronous rounds for ``mpi-collective``).

For each task tile X of a task that is not in its cache, a rank requests only the rows
x in X (a partial-block request along axis 0) of every block whose first index is X's
tensor tile: (x a|b c), t2[x, m, a, b], (x a|m b) and (x a|m n) for all m, n, a, b, c
(t2 and the integrals already have the task's occupied index first).  It packs them
into a RowSlab (the symmetry-allowed elements of those rows, once), drops the fetched
copies, and runs the kernel over the task's orbital triples; the kernel's pair-swapped
rows (ov2, t2s) are made per orbital on use, in a scratch buffer.  Partial energies are
summed over ranks in task order, so the result does not depend on the schedule.

What one rank holds: t1 (o x v) and the orbital energies (replicated, small); the
kernel's buffers (8 packed v^3/nirrep arrays for one orbital triple, not counted
below); and the (T) operands, whose peak is measured and returned
(``peak_operand_bytes``, per source tensor ``peak_share``): the fetched copies of the
rows of a task's uncached task tiles (until packed; blocks the rank owns arrive as
views and are not counted), their RowSlabs (tX rows, i.e. tX/o, of each of ovvv, t2,
ovov and ovoo per task tile), a cache of recent RowSlabs, and two scratch rows (one
orbital's worth of ovvv and of t2).  The cache is bounded in bytes (``cache_mb``,
default 256 MiB) and at rest to half of each tensor; before each fetch it drops least
recently used slabs until cache + the task's fetched rows + their slabs + scratch are
below every whole tensor.  That is always possible when the task alone fits: with
n_S <= 3 occ_tile orbitals per task, 2 n_S + 1 rows < o, which the default occ_tile
gives for nocc >= 8 (H2O2 all-electron, o = 9: at most 8/9 of any tensor, total
bytes over the four tensors 2-3x whole ovvv).  With fewer occupied orbitals (water:
5, so n_S = 3 even with one-orbital task tiles) a rank can hold as many bytes from one
tensor as the whole tensor has (a fetched and a packed copy of 3 of its 5 rows), and
when one task tile is the whole occupied space (nocc = 1) a rank necessarily holds
whole o-slabs.  Never o^3 v^3 or v^4 data.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np
from threadpoolctl import threadpool_limits

from tessera.backends.tasks import TaskSet
from tessera.chem.triples import (NIRREP, SOURCES, KernelInputs, RowSlab, TripleKernel,
                                  TriplesResult, VirtualLayout, check_occ_tile, default_occ_tile,
                                  irrep_ranges)
from tessera.errors import InputError, ShapeError

_log = logging.getLogger(__name__)
DEFAULT_CACHE_MB = 256     # RowSlabs of recent task tiles a rank keeps (also capped per tensor)


@dataclass(frozen=True)
class DistributedTriplesResult(TriplesResult):
    """:class:`TriplesResult` plus what the ranks held (bytes of (T) operands: fetched rows,
    RowSlabs, cache and scratch rows; the kernel's per-triple buffers are separate)."""

    occ_tile: int = 0
    peak_operand_bytes: int = 0                  # max over ranks
    rank_peak_operand_bytes: tuple = ()          # per rank
    peak_share: dict = field(default_factory=dict)   # source -> max over ranks of peak held / whole tensor
    whole_bytes: dict = field(default_factory=dict)  # source -> bytes of the whole tensor
    cache_bytes: int = 0                         # cache limit per rank (bytes)
    kernel_buffer_bytes: int = 0                 # per rank


class _Ledger:
    """Bytes held per source tensor now, and the peaks (total and per source)."""

    def __init__(self):
        self.now = dict.fromkeys(SOURCES, 0)
        self.peak = 0
        self.peak_by = dict.fromkeys(SOURCES, 0)

    def add(self, nbytes: dict, sign: int = 1) -> None:
        for s, b in nbytes.items():
            self.now[s] += sign * b
            if sign > 0:
                self.peak_by[s] = max(self.peak_by[s], self.now[s])
        if sign > 0:
            self.peak = max(self.peak, sum(self.now.values()))


class DistributedTriples:
    """Task tiles, tasks and their requests; the executor decides who runs what."""

    def __init__(self, ints, t1, t2, occ_tile, cache_mb):
        o, v = ints.o, ints.v
        self.o, self.v = o, v
        self.tensors = dict(zip(SOURCES, (ints.ovvv, t2, ints.ovov, ints.ovoo)))
        self.source_of = {t.uid: name for name, t in self.tensors.items()}
        orange, vrange = irrep_ranges(o, "occupied"), irrep_ranges(v, "virtual")
        self.lay = lay = VirtualLayout(vrange, v.irreps, np.asarray(ints.ev, float)[v.orbitals], orange)
        self.eo = np.asarray(ints.eo, float)[o.orbitals]
        self.t1d = t1.to_dense()[np.ix_(o.orbitals, v.orbitals)]        # in space positions
        self.irrep = o.irreps.tolist()
        nirrep = len(set(v.irreps.tolist()) | set(o.irreps.tolist())) or 1
        if occ_tile is None:
            occ_tile = max(1, min(default_occ_tile(v.dim, nirrep), o.dim // 8))
        self.occ_tile = int(occ_tile)
        # task tiles: (start, stop, irrep, tensor tile, part or None) inside one tensor tile
        self.tiles = []
        for n, tl in enumerate(o.tiles):
            for s0 in range(tl.offset, tl.offset + tl.size, self.occ_tile):
                s1 = min(s0 + self.occ_tile, tl.offset + tl.size)
                part = None if s1 - s0 == tl.size else (0, s0 - tl.offset, s1 - tl.offset)
                self.tiles.append((s0, s1, tl.irrep, n, part))
        self.triples = [(a, b, c) for a in range(len(self.tiles)) for b in range(a + 1) for c in range(b + 1)]
        self.G = [self.tiles[a][2] ^ self.tiles[b][2] ^ self.tiles[c][2] for a, b, c in self.triples]
        for G in sorted(set(self.G)):
            lay.prepare(G)
        self.keys = {name: {} for name in SOURCES}     # source -> tensor tile -> keys with it first
        for name, t in self.tensors.items():
            for key in t.allowed_keys():
                self.keys[name].setdefault(key[0], []).append(key)
        self._budget(cache_mb)
        self.cache: OrderedDict = OrderedDict()          # task tile -> RowSlab
        self.cached = dict.fromkeys(SOURCES, 0)
        self.held = _Ledger()
        self.held.add(self.scratch_bytes)
        self.scratch = (np.empty(self.scratch_bytes["ovvv"] // 8), np.empty(self.scratch_bytes["t2"] // 8))
        self.pool = TripleKernel.new_pool(lay)           # the kernel's buffers, reused by every task
        self.flops = 0

    # ------------------------------------------------------------------ sizes
    def _row_elements(self, g: int) -> dict:
        """Elements of one packed row (an occupied orbital of irrep g) of each source."""
        lay, r = self.lay, range(NIRREP)
        return {"ovvv": int(sum(lay.n[h] * lay.npair[g ^ h] for h in r)),
                "t2": int(sum(lay.no[h] * lay.npair[g ^ h] for h in r)),
                "ovov": int(sum(lay.no[h] * lay.npair[g ^ h] for h in r)),
                "ovoo": int(sum(lay.no[h] * lay.nvo[g ^ h] for h in r))}

    def _budget(self, cache_mb) -> None:
        """Bytes per task tile and source, scratch rows, whole tensors; ``bounded``: even a
        task that fetches all its rows stays below every whole tensor; the cache limits."""
        rows = {g: self._row_elements(g) for g in set(self.irrep)}
        self.tile_bytes = [{s: 8 * (t[1] - t[0]) * rows[t[2]][s] for s in SOURCES} for t in self.tiles]
        self.scratch_bytes = {s: 0 for s in SOURCES}
        for s in ("ovvv", "t2"):
            self.scratch_bytes[s] = 8 * max(r[s] for r in rows.values())
        self.whole = {s: int(t.nbytes) for s, t in self.tensors.items()}
        self.worst = {s: 2 * sum(sorted(tb[s] for tb in self.tile_bytes)[-3:]) + self.scratch_bytes[s]
                      for s in SOURCES}
        self.bounded = all(self.worst[s] < self.whole[s] for s in SOURCES)
        self.cache_limit = int((DEFAULT_CACHE_MB if cache_mb is None else cache_mb) * 2 ** 20)
        # at rest the cache keeps at most half of each tensor; before a fetch it shrinks
        # until cache + the task's fetched rows + their slabs + scratch < the whole tensor
        self.cache_cap = {s: min(self.whole[s] // 2, self.whole[s] - self.scratch_bytes[s] - 1)
                          for s in SOURCES}

    # ------------------------------------------------------------------ tasks
    def cost(self, task: int) -> float:
        a, b, c = self.triples[task]
        size = np.prod([self.tiles[x][1] - self.tiles[x][0] for x in (a, b, c)])
        return float(size * max(1, int(self.lay.ntrip[self.G[task]])))

    def need(self, task: int) -> list:
        """Rows of the blocks of the task's uncached task tiles (partial requests); first
        drops cached slabs (least recently used, not the task's) until what arrives fits."""
        if not self.lay.ntrip[self.G[task]]:
            return []
        wanted = sorted(set(self.triples[task]))
        new = [x for x in wanted if x not in self.cache]
        room = {s: 2 * sum(self.tile_bytes[x][s] for x in new) + self.scratch_bytes[s] for s in SOURCES}
        self._evict(lambda: any(self.cached[s] + room[s] >= self.whole[s] for s in SOURCES), wanted)
        out = []
        for x in new:
            n, part = self.tiles[x][3], self.tiles[x][4]
            for name, t in self.tensors.items():
                out += [(t, key) if part is None else (t, key, part) for key in self.keys[name].get(n, ())]
        return out

    def _evict(self, over, keep) -> None:
        """Drop least recently used slabs not in ``keep`` while ``over()``."""
        for y in [y for y in self.cache if y not in keep]:
            if not over():
                return
            del self.cache[y]
            for s in SOURCES:
                self.cached[s] -= self.tile_bytes[y][s]
            self.held.add(self.tile_bytes[y], -1)

    def _slab(self, x: int, blocks: dict) -> RowSlab:
        s0, s1, _, n, part = self.tiles[x]
        parts = {}
        for name, t in self.tensors.items():
            tag = (lambda key: (t.uid, key)) if part is None else (lambda key: (t.uid, key, part))
            parts[name] = [(key, blocks[tag(key)]) for key in self.keys[name].get(n, ())]
        return RowSlab.from_blocks(self.lay, self.o, self.v, s0, s1, parts)

    def _admit(self, x: int, slab: RowSlab, keep) -> bool:
        """Put a new slab into the cache, dropping least recently used slabs (never one of
        ``keep``) while over a limit; False when it does not fit (the task drops it)."""
        over = (lambda: sum(self.cached.values()) > self.cache_limit
                or any(self.cached[s] > self.cache_cap[s] for s in SOURCES))
        self.cache[x] = slab
        for s in SOURCES:
            self.cached[s] += self.tile_bytes[x][s]
        self._evict(over, keep)
        if over():
            del self.cache[x]
            for s in SOURCES:
                self.cached[s] -= self.tile_bytes[x][s]
            return False
        return True

    def work(self, task: int, blocks: dict) -> float:
        a, b, c = self.triples[task]
        G = self.G[task]
        if not self.lay.ntrip[G]:
            return 0.0
        fetched = dict.fromkeys(SOURCES, 0)     # copies that arrived (owned blocks come as views)
        for k, arr in blocks.items():
            name = self.source_of[k[0]]
            if k[1] not in self.tensors[name].blocks:
                fetched[name] += arr.nbytes
        self.held.add(fetched)
        wanted = sorted({a, b, c})
        slabs, new = {}, []
        for x in wanted:
            slab = self.cache.get(x)
            if slab is None:
                slab = self._slab(x, blocks)
                self.held.add(self.tile_bytes[x])
                new.append(x)
            else:
                self.cache.move_to_end(x)
            slabs[x] = slab
        blocks.clear()                   # the fetched rows are packed: let them go
        self.held.add(fetched, -1)
        transient = [x for x in new if not self._admit(x, slabs[x], wanted)]
        inp = KernelInputs.from_slabs(self.lay, self.eo, self.t1d, self.irrep, slabs.values(),
                                      scratch=self.scratch)
        kern = TripleKernel(inp, G, self.pool)
        I, J, K = (self.tiles[x][:2] for x in (a, b, c))
        energy = kern.tile_energy(I, J, K)
        self.flops += kern.flops
        for x in transient:
            self.held.add(self.tile_bytes[x], -1)
        return energy


def triples_correction_distributed(ints, t1, t2, *, context=None, occ_tile: int | None = None,
                                   cache_mb: float | None = None) -> DistributedTriplesResult:
    """E(T) of distributed CCSD amplitudes; the arguments of
    :func:`tessera.chem.triples.triples_correction` plus ``cache_mb`` (per-rank cache of
    packed rows, default 256 MiB).  Collective: every rank calls it and gets the same
    result, a :class:`DistributedTriplesResult` (a TriplesResult with the bytes the
    ranks held)."""
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
    check_occ_tile(occ_tile)
    if cache_mb is not None and not (isinstance(cache_mb, (int, float)) and cache_mb >= 0):
        raise InputError(f"cache_mb must be a number >= 0 or None, got {cache_mb!r}")
    job = DistributedTriples(ints, t1, t2, occ_tile, cache_mb)
    costs = [job.cost(i) for i in range(len(job.triples))]
    ex = context.executor
    snap = ex.account.begin()
    c0 = ex.compute_seconds
    chunk = max(1, min(8, len(costs) // (4 * ex.world.size)))
    with threadpool_limits(limits=ex.blas_threads, user_api="blas"):
        results = ex.run_tasks(TaskSet("(T) triples", costs, job.work, job.need, chunk))
    energy = float(sum(results.tolist()))               # task order: schedule-independent
    world = ex.world
    mine = (job.held.peak, job.held.peak_by)
    everyone = world.allgather(mine) if world.size > 1 else [mine]
    flops = int(world.allreduce(job.flops, "sum")) if world.size > 1 else job.flops
    seconds = time.perf_counter() - t_start
    ex.account.end("(T) triples", snap, seconds, ex.compute_seconds - c0, flops)
    peaks = tuple(int(p) for p, _ in everyone)
    share = {s: max(by[s] for _, by in everyone) / max(1, job.whole[s]) for s in SOURCES}
    _log.info("(T) correction %.12f Eh: %d tasks, %.3g GFLOP, %.2f s; occ_tile %d, peak (T) operands "
              "%.3g MB/rank (largest share of one tensor %.2f%s)", energy, len(costs), flops / 1e9,
              seconds, job.occ_tile, max(peaks) / 1e6, max(share.values()),
              "" if job.bounded else "; occupied space too small for task rows below whole tensors")
    return DistributedTriplesResult(energy, flops, len(costs), seconds, occ_tile=job.occ_tile,
                                    peak_operand_bytes=max(peaks), rank_peak_operand_bytes=peaks,
                                    peak_share=share, whole_bytes=dict(job.whole),
                                    cache_bytes=job.cache_limit,
                                    kernel_buffer_bytes=int(sum(a.nbytes for a in job.pool)))
