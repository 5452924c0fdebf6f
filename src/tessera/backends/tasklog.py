"""Progress lines of a long task set, for the logs of batch jobs (as NWChem's
``ccsd(t): done N out of M``): ``(T) triples: done 20 of 50 tasks (40%), 3.2 s``.

A task set asks for them with ``TaskSet(progress=True)`` (the AO->MO transform and (T)
do); ``Context.run_tasks`` counts its tasks as they finish. Lines go to the logger
``tessera.progress`` at INFO (the CLI shows it; a library user enables it with
``logging``), from rank 0 only, throttled: at most one line per tenth of the work and
none sooner than ``MIN_INTERVAL`` seconds after the previous one (a task set that ends
within that time prints nothing), and a closing 100% line once an earlier one was printed.
Under MPI rank 0 counts the tasks it ran itself: the share done is estimated as that count
times the number of ranks (what a balanced schedule gives), printed as ``about``, and
the closing line says that rank 0 is done.
"""

from __future__ import annotations

import logging
import threading
import time

log = logging.getLogger("tessera.progress")

MIN_INTERVAL = 1.0       # seconds between two lines of one task set


class TaskProgress:
    """Counts finished tasks of one task set on this rank and logs throttled lines."""

    def __init__(self, label: str, ntasks: int, rank: int = 0, nranks: int = 1):
        self.label, self.ntasks, self.nranks = label, int(ntasks), int(nranks)
        self.active = rank == 0 and self.ntasks > 0 and log.isEnabledFor(logging.INFO)
        self.done = self.tenth = self.lines = 0
        self.start = self.last = time.perf_counter()
        self._lock = threading.Lock()          # the threads executor runs tasks concurrently

    def wrap(self, work):
        """``work`` that also counts each finished task (``work`` itself when inactive)."""
        if not self.active:
            return work

        def counted(i, blocks, *stage):
            result = work(i, blocks, *stage)
            self.tick()
            return result
        return counted

    def tick(self) -> None:
        """One more task finished."""
        if not self.active:
            return
        with self._lock:
            self.done += 1
            tenth = min(10, self.done * self.nranks * 10 // self.ntasks)
            now = time.perf_counter()
            if tenth > self.tenth and tenth < 10 and now - self.last >= MIN_INTERVAL:
                self.tenth, self.last = tenth, now
                self._line(tenth * 10)

    def finish(self) -> None:
        """The closing line (only when an earlier line was printed)."""
        if self.active and self.lines:
            self._line(100)

    def _line(self, percent: int) -> None:
        self.lines += 1
        elapsed = time.perf_counter() - self.start
        if self.nranks == 1:
            done = self.ntasks if percent == 100 else self.done
            log.info("%s: done %d of %d tasks (%d%%), %.1f s", self.label, done, self.ntasks, percent, elapsed)
        elif percent < 100:
            log.info("%s: about %d%% done (rank 0 ran %d of %d tasks on %d ranks), %.1f s", self.label,
                     percent, self.done, self.ntasks, self.nranks, elapsed)
        else:       # the others may still be busy: say only what rank 0 knows
            log.info("%s: rank 0 done (ran %d of %d tasks on %d ranks), %.1f s", self.label,
                     self.done, self.ntasks, self.nranks, elapsed)
