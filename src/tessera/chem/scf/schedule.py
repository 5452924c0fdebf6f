"""Who computes which Fock-build task: static partition, one global counter, or static
partition plus work stealing.

- ``static``: rank r runs the contiguous, cost-balanced range [lo_r, hi_r) of the task
  list (GTFock's initial static partition), nothing else.
- ``nxtval``: one global counter hands out tasks, largest estimated cost first (the
  NXTVAL dynamic load balancing of NWChem/TCE and of the original GA SCF).
- ``steal``: each rank owns the static range of ``static`` and a counter in its own
  memory; it claims its own tasks one at a time through that counter (a *local*
  fetch-and-add), and when its range is exhausted it steals half of the remaining tasks
  of another rank through that rank's counter (*remote* fetch-and-adds).  Liu, Patel,
  Chow, IPDPS 2014, Sec. III-C: static partition plus work stealing, most counter
  operations stay local.

A dispenser yields *chunks* (arrays of task ids) so that the Fock build can prefetch the
density tiles a chunk needs before computing it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tessera.errors import InputError

SCHEDULES = ("static", "nxtval", "steal")


@dataclass
class DispatchStats:
    tasks: int = 0                 # tasks this rank executed
    stolen: int = 0                # of which taken from another rank's range
    counter_local: int = 0         # fetch-and-adds on a counter in this rank's memory
    counter_remote: int = 0        # fetch-and-adds on another rank's counter
    steals: int = 0                # successful steal operations
    victims: dict = field(default_factory=dict)   # victim rank -> tasks stolen


def check_schedule(schedule: str) -> str:
    if schedule not in SCHEDULES:
        raise InputError(f"unknown schedule {schedule!r}; expected one of {SCHEDULES}")
    return schedule


class Dispenser:
    """One Fock build's task hand-out on one rank.  ``chunks()`` yields arrays of task ids;
    ``stats`` counts what happened.  ``counter`` is a ``tessera.runtime.TaskCounter`` of
    kind ``"global"`` (nxtval) or ``"per_rank"`` (steal), already reset; None for static.
    ``global_host`` is the rank holding the global counter (for local/remote counts)."""

    def __init__(self, schedule: str, bounds: np.ndarray, order: np.ndarray | None,
                 rank: int, size: int, counter=None, global_host: int = 0):
        self.schedule = check_schedule(schedule)
        self.bounds = bounds
        self.order = order
        self.rank = rank
        self.size = size
        self.counter = counter
        self.global_host = global_host
        self.stats = DispatchStats()

    def own_range(self) -> np.ndarray:
        """The static range of this rank (static and steal)."""
        return np.arange(self.bounds[self.rank], self.bounds[self.rank + 1])

    def chunks(self):
        if self.schedule == "static":
            ids = self.own_range()
            self.stats.tasks += len(ids)
            if len(ids):
                yield ids
        elif self.schedule == "nxtval":
            yield from self._nxtval()
        else:
            yield from self._steal()

    def _count(self, target: int) -> None:
        if target == self.rank:
            self.stats.counter_local += 1
        else:
            self.stats.counter_remote += 1

    def _nxtval(self):
        ntask = len(self.order)
        while True:
            i = int(self.counter.next())
            self._count(self.global_host)
            if i >= ntask:
                return
            self.stats.tasks += 1
            yield self.order[i:i + 1]

    def _steal(self):
        me = self.rank
        lo, hi = int(self.bounds[me]), int(self.bounds[me + 1])
        # own range, one task per local fetch-and-add
        while True:
            i = int(self.counter.next(target=me))
            self._count(me)
            if lo + i >= hi:
                break
            self.stats.tasks += 1
            yield np.arange(lo + i, lo + i + 1)
        # then steal half of what a victim has left, victims in ring order
        for k in range(1, self.size):
            victim = (me + k) % self.size
            vlo, vhi = int(self.bounds[victim]), int(self.bounds[victim + 1])
            n = vhi - vlo
            while True:
                seen = int(self.counter.fetch_add(0, target=victim))
                self._count(victim)
                if seen >= n:
                    break
                want = max(1, (n - seen) // 2)
                start = int(self.counter.fetch_add(want, target=victim))
                self._count(victim)
                stop = min(start + want, n)
                if start >= n:
                    break
                got = stop - start
                self.stats.tasks += got
                self.stats.stolen += got
                self.stats.steals += 1
                self.stats.victims[victim] = self.stats.victims.get(victim, 0) + got
                yield np.arange(vlo + start, vlo + stop)
