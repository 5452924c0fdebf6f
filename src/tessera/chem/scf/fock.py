"""The distributed two-electron Fock build G(D) = J(D) - K(D)/2.

GTFock's scheme (Liu, Patel, Chow, IPDPS 2014, Sec. III): the density D and the Fock
accumulator M are GlobalArrays with an irregular 2-D block distribution whose tiles are
the shell blocks.  Each rank

1. writes the density tiles it owns (orbitals are replicated, so this needs no message),
2. prefetches (non-blocking gets) the density tiles its static task range reads,
3. runs tasks -- its own range, and under ``nxtval``/``steal`` whatever the counters hand
   it, fetching the density tiles of those tasks on first use -- accumulating their
   contributions into local tile buffers,
4. accumulates its buffers into the distributed M, once per tile,

and after a collective sync every rank reads M back (it is small; the orbitals are
replicated) and forms G = (M + M^T)/2.

``mode="direct"`` recomputes the integrals every build.  ``mode="incore"`` keeps, on each
rank, the screened integral blocks of the tasks it ran in the first build, and later
builds replay exactly those tasks (no counters); if they do not fit in the per-rank memory
budget, the SCF stops with an error instead of switching to direct.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict

import numpy as np
from pyscf.lib import with_omp_threads
from threadpoolctl import threadpool_limits

from tessera.chem.scf.blocking import make_blocks
from tessera.chem.scf.integrals import BlockERI, schwarz_bounds
from tessera.chem.scf.kernel import contract_block
from tessera.chem.scf.schedule import Dispenser, check_schedule
from tessera.chem.scf.tasks import PARTIAL, make_tasks, static_partition
from tessera.errors import InputError

log = logging.getLogger(__name__)

MODES = ("direct", "incore")


def _tile_owners(tasks, bounds, nblocks: int, size: int) -> dict:
    """Owner of each tile: the rank whose static range holds most tasks with that tile as
    their bra pair (AB), so that the Coulomb updates M[A,B] stay local; cyclic for tiles
    that are no task's bra pair.  Tiles (x, y) and (y, x) share an owner."""
    votes = np.zeros((nblocks, nblocks, size), dtype=np.int64)
    for r in range(size):
        lo, hi = bounds[r], bounds[r + 1]
        np.add.at(votes, (tasks.a[lo:hi], tasks.b[lo:hi], r), 1)
    owners = {}
    k = 0
    for x in range(nblocks):
        for y in range(x + 1):
            v = votes[x, y]
            if v.max() > 0:
                r = int(np.argmax(v))
            else:
                r = k % size
                k += 1
            owners[(x, y)] = r
            owners[(y, x)] = r
    return owners


class FockBuilder:
    """Holds the blocking, screening, task list, distributed arrays and counters of one
    SCF.  Collective: every rank of ``world`` constructs it, calls ``build`` the same
    number of times and finally ``free``."""

    def __init__(self, mol, world, *, schedule: str = "steal", screening: float = 1e-12,
                 mode: str = "direct", max_memory_mb: float = 4000.0,
                 block_nbf: int | None = None):
        from tessera.runtime import GlobalArray, TaskCounter

        self.schedule = check_schedule(schedule)
        if mode not in MODES:
            raise InputError(f"unknown mode {mode!r}; expected one of {MODES}")
        if not (screening >= 0.0):
            raise InputError(f"screening={screening!r}: expected a threshold >= 0 "
                             "(0 disables Schwarz screening)")
        self.mode = mode
        self.world = world
        self.rank, self.size = world.rank, world.size
        t0 = time.perf_counter()
        self.blocks = make_blocks(mol, block_nbf)
        self.eri = BlockERI(mol)
        self.qshell = schwarz_bounds(self.eri, mol)
        self.tasks = make_tasks(self.blocks, self.qshell, float(screening))
        self.bounds = static_partition(self.tasks.cost, self.size)
        self.setup_seconds = time.perf_counter() - t0
        nb = self.blocks.nblocks

        self.budget_bytes = float(max_memory_mb) * 1e6
        self.incore_bytes_total = int(self.tasks.nints.sum()) * 8
        if mode == "incore" and self.incore_bytes_total > self.budget_bytes * self.size:
            raise InputError(
                f"mode='incore' needs {self.incore_bytes_total / 1e6:.4g} MB of screened "
                f"integral blocks, more than the budget of {max_memory_mb:.4g} MB per rank x "
                f"{self.size} ranks; use mode='direct', more ranks, or a larger memory "
                "budget (max_memory_mb)")

        sizes = self.blocks.sizes
        owners = _tile_owners(self.tasks, self.bounds, nb, self.size)
        self.dens = GlobalArray(tiling=[sizes, sizes], owners=owners, name="scf.D",
                                world=world)
        self.fock = GlobalArray(tiling=[sizes, sizes], owners=owners, name="scf.M",
                                world=world)
        self.counter = None
        self.global_host = 0         # the runtime keeps the global counter on worker 0
        if self.schedule == "nxtval":
            self.counter = TaskCounter(kind="global", world=world)
        elif self.schedule == "steal":
            self.counter = TaskCounter(kind="per_rank", world=world)
        # nxtval hands out the most expensive tasks first
        self.order = np.argsort(-self.tasks.cost, kind="stable")
        self._stored = None          # incore: list of (task id, integral block)
        self.history = []            # per build: dict of this rank's statistics
        self._freed = False

    # -- one build --------------------------------------------------------------------
    def build(self, dm: np.ndarray) -> np.ndarray:
        """G(D) on every rank.  ``dm`` is the replicated density matrix.

        Integrals and contractions run single-threaded (OpenMP and BLAS): a task is too
        small for a parallel region to pay off, and ranks, not threads, share the cores.
        """
        with with_omp_threads(1), threadpool_limits(1):
            return self._build(dm)

    def _build(self, dm: np.ndarray) -> np.ndarray:
        t_start = time.perf_counter()
        ar = self.blocks.ao_ranges
        for key in self.dens.local_keys():
            x, y = key
            if x >= y:
                self.dens.put(key, np.ascontiguousarray(dm[slice(*ar[x]), slice(*ar[y])]))
        self.fock.zero()                 # collective, with syncs
        self.dens.sync()
        replay = self.mode == "incore" and self._stored is not None
        if self.counter is not None and not replay:
            self.counter.reset()

        tiles = {}
        comm_s = 0.0
        busy = 0.0
        busy_cpu = 0.0
        buf = {}
        tasks = self.tasks

        def fetch(ids):
            nonlocal comm_s
            need = [k for k in tasks.density_tiles(ids) if k not in tiles]
            if not need:
                return
            t = time.perf_counter()
            handles = [(k, self.dens.iget(k)) for k in need]
            for k, h in handles:
                tiles[k] = h.wait()
            comm_s += time.perf_counter() - t

        if replay:
            stats = {"tasks": len(self._stored), "stolen": 0, "counter_local": 0,
                     "counter_remote": 0, "steals": 0, "victims": {}}
            fetch([t for t, _ in self._stored])
            for t, g in self._stored:
                w, c = time.perf_counter(), time.thread_time()
                contract_block(g, tasks.scale[t], tasks.quartet(t), tiles, buf)
                busy += time.perf_counter() - w
                busy_cpu += time.thread_time() - c
        else:
            storing = self.mode == "incore"
            stored, stored_bytes, over_budget = [], 0, False
            disp = Dispenser(self.schedule, self.bounds, self.order, self.rank, self.size,
                             counter=self.counter, global_host=self.global_host)
            if self.schedule != "nxtval":
                fetch(disp.own_range())          # prefetch the static range's tiles
            nints = 0
            for ids in disp.chunks():
                fetch(ids)
                for t in ids:
                    t = int(t)
                    w, c = time.perf_counter(), time.thread_time()
                    quartet = tasks.quartet(t)
                    g = self.eri.blocks(self.blocks, *quartet)
                    if tasks.kind[t] == PARTIAL:
                        g *= tasks.mask(t)
                    contract_block(g, tasks.scale[t], quartet, tiles, buf)
                    busy += time.perf_counter() - w
                    busy_cpu += time.thread_time() - c
                    nints += g.size
                    if storing and not over_budget:
                        if stored_bytes + g.nbytes > self.budget_bytes:
                            over_budget = True
                            stored = []
                        else:
                            stored.append((t, g))
                            stored_bytes += g.nbytes
            stats = asdict(disp.stats)
            stats["integrals"] = nints
            if storing:
                self._check_incore(over_budget, stored_bytes)
                self._stored = stored
                stats["incore_bytes"] = stored_bytes

        t = time.perf_counter()
        handles = [self.fock.iacc(key, blk) for key, blk in buf.items()]
        for h in handles:
            h.wait()
        self.fock.sync()
        m = self.fock.get_patch((0, 0), (self.blocks.nao, self.blocks.nao))
        comm_s += time.perf_counter() - t
        # only lower tiles hold data: (M + M^T)/2
        g2e = 0.5 * (m + m.T)
        stats.update(busy_s=busy, busy_cpu_s=busy_cpu, comm_s=comm_s,
                     wall_s=time.perf_counter() - t_start, density_tiles=len(tiles),
                     fock_tiles=len(buf), replay=replay)
        self.history.append(stats)
        return g2e

    def _check_incore(self, over_budget: bool, stored_bytes: int) -> None:
        if any(self.world.allgather(bool(over_budget))):
            raise InputError(
                "mode='incore': the integral blocks of the tasks one rank ran in the first "
                f"Fock build exceed its memory budget of {self.budget_bytes / 1e6:.4g} MB "
                f"(all ranks together need {self.incore_bytes_total / 1e6:.4g} MB); use "
                "mode='direct', more ranks, schedule='static', or a larger max_memory_mb")

    def free(self) -> None:
        if self._freed:
            return
        self._freed = True
        self._stored = None
        self.dens.free()
        self.fock.free()
        if self.counter is not None:
            self.counter.free()

