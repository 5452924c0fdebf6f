"""TaskCounter: atomic fetch-and-add counters for dynamic and stolen work.

kind="global": one counter (NXTVAL) held by worker 0; `next()` hands out 0, 1, 2, ...
    across all ranks, each value exactly once.
kind="per_rank": one counter per worker, for a static partition plus work stealing: a
    rank drains its own queue by fetch-and-add on its own counter, then steals from the
    others' counters. Ticket i of queue r is handed out exactly once, whoever takes it.
    (backends.schedule's ``steal`` keeps two ends of a queue in one counter: the owner
    adds to the low 32 bits, thieves to the high ones.)

All operations are MPI_Fetch_and_op (MPI_SUM, int64) followed by a flush, so they are
atomic with respect to every other rank. Creation, reset and free are collective.
"""

from __future__ import annotations

import logging
from time import perf_counter

import numpy as np

from tessera.errors import RuntimeLayerError
from tessera.runtime._mpi import load_mpi
from tessera.runtime.exposure import Exposure

log = logging.getLogger("tessera.runtime")

COUNTER_KINDS = ("global", "per_rank")


class TaskCounter:
    """Atomic int64 counters over MPI RMA (see module docstring)."""

    def __init__(self, kind: str = "global", world=None, name: str = "counter"):
        if kind not in COUNTER_KINDS:
            raise RuntimeLayerError(
                f"unknown counter kind {kind!r}; expected 'global' (one NXTVAL counter) or "
                "'per_rank' (one counter per rank, for static partition plus stealing)."
            )
        if world is None:
            from tessera.runtime.world import World

            world = World.get()
        world._check_running()
        MPI = load_mpi()
        self._MPI = MPI
        self.world = world
        self.kind = kind
        self.name = name
        holds = kind == "per_rank" or world.rank == 0
        self._exp = Exposure(world, 8 if holds else 0, 8, kind="counter")
        self.eid = self._exp.eid
        self._win = self._exp.win
        self._targets = self._exp.targets
        self._base = self._exp.base
        self._op = np.zeros(1, dtype=np.int64)
        self._res = np.zeros(1, dtype=np.int64)
        self._log = world.comm_log
        self._SUM = MPI.SUM
        self._INT64 = MPI.INT64_T
        self._ospec = [self._op, 1, MPI.INT64_T]
        self._rspec = [self._res, 1, MPI.INT64_T]
        # target argument -> (peer, window target, displacement); None = the default peer
        peers = range(world.size) if kind == "per_rank" else [0]
        self._specs = {p: (p, self._targets[p], self._base[p]) for p in peers}
        self._specs[None] = self._specs[world.rank if kind == "per_rank" else 0]
        if holds:
            self._exp.local.view(np.int64)[0] = 0
        self._exp.sync_memory()
        world.comm.Barrier()
        world._register(self)

    # -- operations -------------------------------------------------------------------
    def _peer(self, target) -> int:
        if self._win is None:
            raise RuntimeLayerError(
                f"counter {self.name!r} was freed; expected a live counter (World.stop() "
                "frees every counter)."
            )
        if self.kind == "global":
            if target not in (None, 0):
                raise RuntimeLayerError(
                    f"counter {self.name!r} is global (one counter on rank 0) but target="
                    f"{target!r} was given; call next() without a target, or create a "
                    "TaskCounter(kind='per_rank')."
                )
            return 0
        if target is None:
            return self.world.rank
        if isinstance(target, bool) or not hasattr(target, "__index__") or \
                not 0 <= int(target) < self.world.size:
            raise RuntimeLayerError(
                f"counter target {target!r} is not a worker rank; expected 0 <= target < "
                f"{self.world.size}."
            )
        return int(target)

    def fetch_add(self, n: int = 1, target=None) -> int:
        """Atomically add n to target's counter (own rank by default for per_rank);
        returns the value before the addition."""
        t0 = perf_counter()
        spec = self._specs.get(target)
        if spec is None:
            spec = self._specs[self._peer(target)]
        peer, t, disp = spec
        self._op[0] = n
        self._win.Fetch_and_op(self._ospec, self._rspec, t, disp, self._SUM)
        self._win.Flush(t)
        self._log.add("fetch_add", peer, 8, perf_counter() - t0)
        return int(self._res[0])

    def next(self, target=None) -> int:
        """fetch_add(1, target): the next ticket."""
        return self.fetch_add(1, target)

    def read(self, target=None) -> int:
        """Atomic read (fetch-and-add of 0)."""
        return self.fetch_add(0, target)

    def reset(self, value: int = 0) -> None:
        """Collective: set every counter to value."""
        peer = self._peer(None if self.kind == "per_rank" else 0)
        self._win.Flush_all()
        self.world.comm.Barrier()
        if self.kind == "per_rank" or self.world.rank == 0:
            self._op[0] = value
            t = self._targets[peer]
            self._win.Fetch_and_op([self._op, 1, self._INT64], [self._res, 1, self._INT64],
                                   t, self._base[peer], self._MPI.REPLACE)
            self._win.Flush(t)
        self.world.comm.Barrier()

    def free(self) -> None:
        """Collective: release the window."""
        if self._win is None:
            return
        self._exp.free()
        self._win = None
        self._specs = {}
        self.world._unregister(self)
