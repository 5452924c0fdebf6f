"""(T) as a :class:`~tessera.backends.tasks.TaskSet`: the one driver of every backend.

The physics, the packed layouts and the kernel are ``chem.triples``' (:class:`TripleKernel`
on :class:`KernelInputs` built from :class:`RowSlab` s).  The work is split into tasks,
one per triple of occupied *task tiles* I >= J >= K; a task tile is a run of at most
``occ_tile`` orbitals inside one occupied tensor tile.  ``Context.run_tasks`` runs them
on any executor (serial, threads, or dealt over MPI ranks); partial energies are added
in task order, so the result does not depend on the schedule.

Local (resident) tensors: nothing is fetched; each task tile's RowSlab is packed once,
with its pair-swapped rows (``add_swapped``), and kept for the whole run.  Default
``occ_tile``: :func:`default_occ_tile`.

Distributed tensors: for each task tile X of a task that is not in its cache, a rank
requests only the rows x in X (a partial-block request along axis 0) of every block
whose first index is X's tensor tile: (x a|b c), t2[x, m, a, b], (x a|m b) and
(x a|m n).  It packs them into a RowSlab, drops the fetched copies, and runs the kernel;
the pair-swapped rows are made per orbital on use, in a scratch buffer.  Default
``occ_tile``: ``chem.triples_plan.row_plan``, the rule of the windowed tasks below (fewest bytes read, at
least TASKS_PER_RANK tasks per rank, one task within the budget), at most ``nocc // 8``,
so a task's orbitals are a small part of the occupied space.  The rank's (T) operands
(fetched rows until packed, slabs, cache, two scratch rows; owned blocks arrive as views
and are not counted) are measured and returned.  The cache is bounded in bytes (``cache_mb``, default
``chem.triples_budget.window_budget``) and at rest to
half of each tensor; before each fetch it drops least recently used slabs until cache +
the task's fetched rows + their slabs + scratch are below every whole tensor.  That is
always possible when the task alone fits: with n_S <= 3 occ_tile orbitals per task,
2 n_S + 1 rows < o, which the default gives for nocc >= 8.  With fewer occupied
orbitals (water: 5) a rank can hold as many bytes from one tensor as the whole tensor
has, and with nocc = 1 necessarily whole o-slabs.  Never o^3 v^3 or v^4 data.

Distributed tensors with the kernel blocked in the virtual index: a task is a triple of
task tiles and a window of virtual tiles (``chem.triples_window``); it requests only its
window's rows and builds them into tables (``cache_mb`` bounds one task's bytes; by
default ``chem.triples_budget.window_budget``).  The
tasks run window by window (``chem.triples_plan.window_tasks``), so consecutive tasks share their window
and mostly two of three task tiles; a rank keeps the rows its previous task fetched
that its next task needs and fetches only the rest.  What a rank holds is then never
more than one task's rows and tables, the bound one task already has.  Windowed tasks
are dealt in contiguous runs of near-equal estimated time, compute and reads
(``deal_weights``), each rank running its own run first; a rank that is done steals half
of what another has left (``backends.schedule``'s ``steal``), again a contiguous run, so
a slow rank does not hold up the others and the rows stay shared along each run.
``TriplesResult.rank_runs`` says which runs each rank ran; ``sequence_reads`` what they
read.  With ``chunks`` (C > 1) a windowed task runs in C stages, each
fetching one chunk of the contracted indices (``chem.triples_stream``; the stage is
passed to need and work, ``TaskSet.stages``; C = 1: one stage, never streamed) with
``TaskSet.lookahead``: under mpi-onesided the next stage's rows are in flight while this
stage computes, so a rank holds two stages' rows (``triples_budget.stream_bytes``); the budget rule
streams where the budget is below the unstreamed floor, or between nodes where a streamed
task is the fastest within it (``triples_budget.stream_plan``).
The plan (task tiles, windows, counts from structure alone: ``plan_counts``) is
``chem.triples_plan``'s.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np

from tessera.backends.tasks import TaskSet, request_tag
from tessera.chem.triples_blocked import BlockedTripleKernel
from tessera.chem.triples import NIRREP, SOURCES, KernelInputs, RowSlab, TripleKernel, VirtualLayout, irrep_ranges
from tessera.chem.triples_budget import DEFAULT_CACHE_MB, stream_plan, window_budget
from tessera.chem.triples_plan import (kernel_plan, keys_by_tile, minimal_flops, pool_bytes, row_plan, rows_vblock,
                                       task_costs, task_tiles, window_plan, window_tasks)
from tessera.chem.triples_stream import Chunks, StreamTables, StreamTripleKernel, stream_requests
from tessera.chem.triples_window import Windows, deal_weights
from tessera.errors import InputError


class _Ledger:
    """Bytes held per source tensor now, and the peaks (total and per source)."""

    def __init__(self):
        self.now = dict.fromkeys(SOURCES + ("W",), 0)       # W: a streamed task's accumulated W
        self.peak = 0
        self.peak_by = dict.fromkeys(SOURCES + ("W",), 0)

    def add(self, nbytes: dict, sign: int = 1) -> None:
        for s, b in nbytes.items():
            self.now[s] += sign * b
            if sign > 0:
                self.peak_by[s] = max(self.peak_by[s], self.now[s])
        if sign > 0:
            self.peak = max(self.peak, sum(self.now.values()))


class TriplesTasks:
    """Task tiles, tasks, their requests and work; the executor decides who runs what.
    ``work`` and ``need`` are thread-safe (one lock for cache, ledger and flops; kernel
    buffers per thread)."""

    def __init__(self, ints, t1, t2, occ_tile, cache_mb, resident: bool, vblock=None, kernel_mb=None,
                 nranks: int = 1, memory_bytes: float | None = None, ranks_per_node: int | None = None,
                 chunks: int | None = None):
        o, v = ints.o, ints.v
        self.ranks_per_node = ranks_per_node
        self.o, self.v, self.resident = o, v, resident
        self.tensors = dict(zip(SOURCES, (ints.ovvv, t2, ints.ovov, ints.ovoo)))
        self.source_of = {t.uid: name for name, t in self.tensors.items()}
        orange, vrange = irrep_ranges(o, "occupied"), irrep_ranges(v, "virtual")
        self.lay = lay = VirtualLayout(vrange, v.irreps, np.asarray(ints.ev, float)[v.orbitals], orange)
        self.eo = np.asarray(ints.eo, float)[o.orbitals]
        self.t1d = t1.to_dense()[np.ix_(o.orbitals, v.orbitals)]        # in space positions
        self.irrep = o.irreps.tolist()
        self.occ_tile, self.vblock, self.batch, self.pool_bytes = kernel_plan(
            lay, o, v, occ_tile, resident, vblock, kernel_mb)
        self.keys = keys_by_tile(self.tensors)
        # a task: a triple of task tiles and, when the operands are fetched by virtual tile
        # (distributed tensors, blocked kernel: chem.triples_window), one window; then the
        # task tile and the windows come from the bytes one task may hold (window_plan)
        # (whole rows: the task tile from the same budget, the kernel's batch no larger)
        self.windows = None
        budget = None if resident else window_budget(cache_mb, memory_bytes, self.tensors, nranks, ranks_per_node)
        streamed = None if resident or chunks else stream_plan(lay, o, v, budget, nranks, ranks_per_node, occ_tile)
        if not resident and streamed is None and self.vblock is None:   # whole rows only while one task fits
            self.vblock = rows_vblock(lay, o, v, self.keys, self.tensors, budget, kernel_mb)
        if streamed is not None:         # the budget's streamed tasks (stream_plan)
            occ, width, chunks = streamed
            self.vblock = min(self.vblock or width, width, int(lay.n.max()))
            self.windows = Windows(o, v, lay.vr, orange, self.keys, self.tensors, self.vblock, width)
            self.occ_tile, _, self.batch, _ = kernel_plan(lay, o, v, occ, resident, self.vblock, kernel_mb)
        elif not resident and self.vblock is not None:
            occ, self.windows, _ = window_plan(o, v, lay.vr, orange, self.keys, self.tensors, self.vblock,
                                               budget, nranks, occ_tile, ranks_per_node,
                                               widen=occ_tile is not None and cache_mb is None)
            self.occ_tile, _, self.batch, _ = kernel_plan(lay, o, v, occ, resident, self.vblock, kernel_mb)
            self.pool_bytes = pool_bytes(lay, self.vblock, self.batch, self.windows)
        # windowed tasks in stages, the contracted f and m in chunks (chem.triples_stream);
        # chunks 1 (given or chosen): one stage, f and m whole
        if chunks and chunks > 1 and self.windows is None:
            raise InputError(f"chunks={chunks} streams windowed (T) tasks, which need distributed tensors and the "
                             "kernel blocked in the virtual index; " + (
                                 "these tensors are local: drop chunks" if resident else
                                 "the whole-space kernel fits here: give vblock too, or drop chunks"))
        self.stream = Chunks(lay, chunks or 1) if self.windows is not None else None
        self.stage_requests: dict = {}                   # streamed: (task, stage) -> (its requests, bytes in flight)
        self.asked = (None, set(), set())                # streamed: the part asked last, its tags, its previous's
        self.acc: dict = {}                              # streamed: task -> W of its block triples
        if self.stream is not None:
            self.pool_bytes = pool_bytes(lay, self.vblock, self.batch, self.windows, self.stream.widest)
        elif not resident and occ_tile is None and self.windows is None:
            self.occ_tile, _, _ = row_plan(o, self.keys, self.tensors, budget, nranks)
            self.batch = min(self.batch, self.occ_tile)
            self.pool_bytes = pool_bytes(lay, None, self.batch)
        if cache_mb is None and budget is not None:      # the row cache (whole rows): within the budget
            cache_mb = min(DEFAULT_CACHE_MB, budget / 2**20)
        self.tiles, self.triples, self.G = task_tiles(o, self.occ_tile)
        for G in sorted(set(self.G)) if self.vblock is None else ():    # maps of the whole-space kernel
            lay.prepare(G)
        self._budget(cache_mb)
        self.tasks = ([(t, None) for t in range(len(self.triples))] if self.windows is None else
                      window_tasks(self.triples, self.G, self.windows))
        self.read: dict = {}                             # windowed task -> bytes of rows it read
        self.runs: list = []                             # windowed: [start, stop) of the tasks run here, in order
        self.kept: dict = {}                             # windowed: the previous task's rows (tag -> rows)
        self.cache: OrderedDict = OrderedDict()          # task tile -> RowSlab
        self.cached = dict.fromkeys(SOURCES, 0)
        self.held = _Ledger()
        self.scratch = None
        if not resident and self.vblock is None:         # pair-swapped rows made on access
            self.held.add(self.scratch_bytes)
            self.scratch = tuple(np.empty(self.scratch_bytes[s] // 8) for s in ("ovvv", "t2"))
        self.lock = threading.Lock()
        self.local = threading.local()                   # the kernel's buffers, one set per thread
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
        task that fetches all its rows stays below every whole tensor; the cache limits
        (none for resident tensors: every slab is kept)."""
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
        self.cache_cap = {s: min(self.whole[s] // 2, self.whole[s] - self.scratch_bytes[s] - 1)
                          for s in SOURCES}

    def minimal_flops(self) -> int:
        """``minimal_flops`` of this run's block structure."""
        return minimal_flops(self.lay, self.irrep)

    # ------------------------------------------------------------------ tasks
    def task_set(self, nranks: int) -> TaskSet:
        costs = self.costs()
        chunk = max(1, min(8, len(costs) // (4 * nranks)))
        if self.resident:        # packed once, before any worker starts: forked workers share them
            self._resident_slabs(range(len(self.tiles)))
        deal = {}
        if self.windows is not None:
            # contiguous runs of near-equal time (``deal_weights``), so a rank's consecutive
            # tasks share rows (``need``); a rank that has run its own steals half of what
            # another has left, a contiguous run too (``backends.schedule``: steal)
            costs = deal_weights(self.windows, self.tiles, self.triples, self.tasks, costs,
                                 self.minimal_flops(), nranks, self.ranks_per_node)
            deal = {"schedule": "steal", "partition": "contiguous"}
        # packed batches run wholly in C with the GIL released (triples_native.batch_packed):
        # threads share the slabs, where forked workers would fault in copies of them
        packed = self.vblock is None and len(set(self.lay.irrep.tolist())) > 1
        return TaskSet("(T) triples", costs, self.work, self.need, chunk, flops=lambda: self.flops,
                       progress=True, forkable=self.resident and not packed, add_flops=self._add_flops,
                       stages=self.stream.count if self.stream is not None else 1,
                       lookahead=self.stream is not None and self.stream.count > 1, **deal)

    def _add_flops(self, n: int) -> None:
        with self.lock:
            self.flops += n

    def costs(self) -> list:
        """Per task: ``task_costs``."""
        return task_costs(self.tiles, self.triples, self.tasks, self.lay.ntrip,
                          self.windows.vtiles if self.windows is not None else None)

    def need(self, task: int, stage: int = 0) -> list:
        """Rows of the blocks of the task's uncached task tiles (partial requests); first
        drops cached slabs (least recently used, not the task's) until what arrives fits.
        Nothing for resident tensors; for a windowed task, its window's rows that the
        rank's previous task did not fetch (those it did are kept, the rest dropped): a
        rank calls need(i) then work(i) for one task after another (``dist_base.run_tasks``);
        streamed, need(i, s) then work(i, blocks, s) for each stage s (``TaskSet.stages``)."""
        t, window = self.tasks[task]
        if self.resident or not self.lay.ntrip[self.G[t]]:
            return []
        wanted = sorted(set(self.triples[t]))
        if self.stream is not None:
            return self._stream_need(task, stage, wanted, window)
        with self.lock:
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
        """Drop least recently used slabs not in ``keep`` while ``over()`` (lock held)."""
        for y in [y for y in self.cache if y not in keep]:
            if not over():
                return
            del self.cache[y]
            for s in SOURCES:
                self.cached[s] -= self.tile_bytes[y][s]
            self.held.add(self.tile_bytes[y], -1)

    def _slab(self, x: int, blocks: dict) -> RowSlab:
        """Task tile x packed from ``blocks`` (fetched rows) or, resident, from the tensors'
        blocks (views of the rows), with the pair-swapped rows."""
        s0, s1, _, n, part = self.tiles[x]
        parts = {}
        for name, t in self.tensors.items():
            rows = []
            for key in self.keys[name].get(n, ()):
                if self.resident:
                    blk = t.blocks.get(key)
                    if blk is not None:
                        rows.append((key, blk if part is None else blk[part[1]:part[2]]))
                else:
                    rows.append((key, blocks[(t.uid, key) if part is None else (t.uid, key, part)]))
            parts[name] = rows
        slab = RowSlab.from_blocks(self.lay, self.o, self.v, s0, s1, parts)
        return slab.add_swapped(self.lay) if self.resident and self.vblock is None else slab

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

    def _resident_slabs(self, wanted) -> dict:
        """Slabs of resident task tiles, packed on first use and kept."""
        with self.lock:
            for x in wanted:
                if x not in self.cache:
                    self.cache[x] = self._slab(x, {})
            return {x: self.cache[x] for x in wanted}

    def _fetched_slabs(self, wanted, blocks: dict) -> tuple:
        """(slabs, task tiles to drop after the task) from cache and fetched rows."""
        with self.lock:
            fetched = dict.fromkeys(SOURCES, 0)     # copies that arrived (owned blocks come as views)
            for k, arr in blocks.items():
                name = self.source_of[k[0]]
                if k[1] not in self.tensors[name].blocks:
                    fetched[name] += arr.nbytes
            self.held.add(fetched)
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
            return slabs, [x for x in new if not self._admit(x, slabs[x], wanted)]

    def work(self, task: int, blocks: dict, stage: int = 0) -> float:
        t, window = self.tasks[task]
        a, b, c = self.triples[t]
        G = self.G[t]
        if window is not None and stage == 0:
            with self.lock:
                if self.runs and self.runs[-1][1] == task:
                    self.runs[-1][1] += 1
                else:
                    self.runs.append([task, task + 1])
        if not self.lay.ntrip[G]:
            return 0.0
        wanted = sorted({a, b, c})
        if self.stream is not None:
            return self._stream_work(task, stage, wanted, blocks)
        if self.resident:
            slabs, transient = self._resident_slabs(wanted), []
        else:
            slabs, transient = self._fetched_slabs(wanted, blocks)
        inp = KernelInputs.from_slabs(self.lay, self.eo, self.t1d, self.irrep, slabs.values(),
                                      scratch=self.scratch)
        kern = (TripleKernel(inp, G, self._pool(), self.batch) if self.vblock is None
                else BlockedTripleKernel(inp, G, self._pool(), self.batch, self.vblock))
        I, J, K = (self.tiles[x][:2] for x in (a, b, c))
        energy = kern.tile_energy(I, J, K)
        with self.lock:
            self.flops += kern.flops
            for x in transient:
                self.held.add(self.tile_bytes[x], -1)
        return energy

    def _pool(self) -> list:
        """The kernel's buffers of this thread."""
        if not hasattr(self.local, "pool"):
            self.local.pool = (TripleKernel.new_pool(self.lay, self.batch) if self.vblock is None
                               else BlockedTripleKernel.new_pool(self.lay, self.vblock, self.batch,
                                                                 self.windows and self.windows.blocks,
                                                                 self.stream and self.stream.widest,
                                                                 self.windows and self.windows.frame_width))
        return self.local.pool

    def _drop_kept(self, tag) -> None:
        """Let a kept row go (lock held)."""
        arr, name, copy = self.kept.pop(tag)
        self.held.add({name: arr.nbytes if copy else 0}, -1)

    def _keep(self, tag, name: str, key, blocks: dict) -> tuple:
        """(rows, bytes that arrived) of request ``tag``: arrived in ``blocks`` (kept for the
        rank's next task or stage; a copy's bytes go to the ledger by the caller) or kept."""
        with self.lock:
            if tag not in blocks:
                return self.kept[tag][0], 0
            arr = blocks.pop(tag)
            copy = key not in self.tensors[name].blocks          # owned blocks arrive as views
            nbytes = arr.nbytes
            if copy and getattr(arr.base, "nbytes", 0) > arr.nbytes:
                arr = arr.copy()     # a part of a larger buffer: keep only the part
            self.kept[tag] = (arr, name, copy)
            return arr, nbytes

    # ------------------------------------------------------------------ streamed (chunks)
    def _stream_need(self, task: int, stage: int, wanted: list, window) -> list:
        """The requests of stage ``stage`` of the task (``triples_stream.stream_requests``;
        kept for its work) that the rank's previous part (stage, or last stage of its
        previous task) does not read, each once; their bytes go to the ledger as they are
        asked for (in flight). Streamed tasks run with ``TaskSet.lookahead``: this need may
        come before the previous part's work, whose rows (kept, or still in flight) stay
        until that work is done; else the kept rows this part does not read are dropped."""
        reqs = stream_requests(self.windows, self.stream, [self.tiles[x] for x in wanted], window, stage)
        out = {}
        for name, key, part, _, _ in reqs:
            req = (self.tensors[name], key, part) if part else (self.tensors[name], key)
            out[request_tag(req)] = req
        part_key = (task, stage)
        with self.lock:
            last, tags, before = self.asked                # a part asked again: its previous stays
            prev = before if last == part_key else tags
            self.asked = (part_key, set(out), prev)
            ahead = any(k != part_key for k in self.stage_requests)     # the previous part not yet worked
            if part_key in self.stage_requests:
                self.held.add(self.stage_requests[part_key][1], -1)
            for tag in [tag for tag in self.kept if tag not in (prev if ahead else out)]:
                self._drop_kept(tag)
            new = [r for tag, r in out.items() if tag not in self.kept and not (ahead and tag in prev)]
            inflight = dict.fromkeys(SOURCES, 0)
            for t, key, *part in new:
                if key not in t.blocks:                    # owned blocks arrive as views
                    inflight[self.source_of[t.uid]] += 8 * _part_size(t.block_shape(key), part)
            self.stage_requests[part_key] = (reqs, inflight)
            self.held.add(inflight)
        return new

    def _stream_work(self, task: int, stage: int, wanted: list, blocks: dict) -> float:
        """Stage ``stage`` of a windowed task: its rows (the requests its need listed) into
        StreamTables; streamed (C > 1), the chunk's W0 terms added to the task's W
        (``acc[task]``, made at stage 0, dropped after the last) and at the last stage the
        energy; one stage, W and the energy at once. Held: the stage's fetched copies and
        tables, and W."""
        t, window = self.tasks[task]
        streamed = self.stream.count > 1
        with self.lock:
            reqs = self.stage_requests.pop((task, stage))[0]
            if streamed and stage == 0:           # a task run again starts a new W
                self.held.add({"W": _acc_bytes(self.acc.pop(task, {}))}, -1)
                self.acc[task] = {}
            acc = self.acc[task] if streamed else None
        ytiles = {self.tiles[x][0]: (self.tiles[x][1] - self.tiles[x][0], self.tiles[x][2]) for x in wanted}
        tables = StreamTables(self.windows, self.irrep, self.stream, stage, ytiles)
        read = 0
        for name, key, part, kind, place in reqs:
            tag = request_tag((self.tensors[name], key, part or None))
            arr, got = self._keep(tag, name, key, blocks)
            read += got
            tables.add(kind, arr, place)
        blocks.clear()
        counted = dict(tables.nbytes)          # zero tables the kernel asks for come on top
        with self.lock:                        # (the fetched copies were counted by need)
            self.read[task] = self.read.get(task, 0) + read
            self.held.add(counted)
        inp = KernelInputs(self.lay, self.eo, self.t1d, self.irrep, ov1=None, ov2=None, t2r=None, t2s=None,
                           ooL=None, ovov=None)
        kern = StreamTripleKernel(inp, self.G[t], self._pool(), self.batch, self.vblock, self.windows, window,
                                  tables, acc)
        I, J, K = (self.tiles[x][:2] for x in self.triples[t])
        before = _acc_bytes(acc) if streamed else 0
        energy = kern.tile_energy(I, J, K)
        if streamed:
            held = _acc_bytes(acc)
            with self.lock:
                self.held.add({"W": held - before})
            if stage == self.stream.count - 1:       # W complete: the energy, then W dropped
                kern.adding = False
                energy = kern.tile_energy(I, J, K)
                with self.lock:
                    self.held.add({"W": held}, -1)
                    del self.acc[task]
        with self.lock:
            self.flops += kern.flops
            self.held.add({k: n - counted[k] for k, n in tables.nbytes.items()})
            self.held.add(tables.nbytes, -1)
        return energy


def _part_size(shape: tuple, part: list) -> int:
    """Elements of a request's ``part`` ([(axis, lo, hi, ...)] or []) of a block of ``shape``."""
    dims = list(shape)
    cut = part[0] if part and part[0] else ()
    for n in range(0, len(cut), 3):
        dims[cut[n]] = cut[n + 2] - cut[n + 1]
    return int(np.prod(dims))


def _acc_bytes(acc: dict) -> int:
    """Bytes of a streamed task's W (``StreamTripleKernel``'s ``acc``)."""
    return sum(w.nbytes for blocks in acc.values() for w in blocks.values())
