"""The executors of one process; the math of a task lives in the array ops (``blockops``).

``serial`` runs tasks in order on one thread with single-threaded BLAS: the
deterministic reference. ``threads`` runs them on a pool with dynamic scheduling; BLAS
releases the GIL, and threadpoolctl keeps pool threads x BLAS threads <= cores (the
threads per rank: ``OMP_NUM_THREADS`` when set, which ``tessera run --threads`` sets,
else the cores this process may use). Executors are made by name in ``registry``.

A task set marked ``forkable`` (``backends.tasks``) runs on ``threads`` in forked worker
processes instead, one per worker, each with the BLAS threads of a pool thread: work
whose numpy passes between GEMMs hold the GIL or are short then scales as separate
processes do. The workers inherit the process's memory copy-on-write (tasks read it,
never write it) and send back only each task's result and flop count; tasks are handed
out dynamically, largest first. Where the platform cannot fork, the threads run them
(and say so in the log).
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing
import os
import signal
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from tessera.backends.registry import ENV_BLAS_THREADS, env_number
from tessera.backends.tasks import local_blocks, run_task
from tessera.errors import InputError

_log = logging.getLogger(__name__)
_forked = None        # the task set forked workers run: set by the parent right before the fork


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def threads_of(backend: str, distributed: bool) -> int:
    """The threads one rank of ``backend`` runs with: 1 for serial; a distributed run's
    ``mpi_blas_threads``; in one process --threads / OMP_NUM_THREADS when set, else all cores."""
    if backend == "serial":
        return 1
    return mpi_blas_threads() if distributed else threads_per_rank() or available_cores()


def mpi_blas_threads() -> int:
    """BLAS threads of each rank of an MPI executor: TESSERA_BLAS_THREADS, else the threads
    a process was asked for (OMP_NUM_THREADS, as --threads sets it), else 1: one rank per
    core (threaded BLAS on small block GEMMs beside other busy ranks costs more than it
    gains)."""
    return env_number(ENV_BLAS_THREADS, threads_per_rank() or 1, integer=True)


def threads_per_rank() -> int | None:
    """The threads a process may use as asked by ``OMP_NUM_THREADS`` (its first value),
    or None when it is not set."""
    value = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    if not value:
        return None
    if not value.isdigit() or int(value) < 1:
        raise InputError(f"OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']!r} is not a positive "
                         "integer; expected the threads per process, e.g. 4: fix or unset it")
    return int(value)


class SerialExecutor:
    name = "serial"
    blas_threads = 1
    workers = 1

    def run(self, tasks) -> None:
        for task in tasks:
            task()

    def close(self) -> None:
        pass


class ThreadsExecutor:
    name = "threads"

    def __init__(self, workers: int | None = None):
        cores = threads_per_rank() or available_cores()
        self.workers = int(workers or cores)
        if self.workers < 1:
            raise InputError(f"threads executor needs at least 1 worker, got {workers}")
        self.blas_threads = max(1, cores // self.workers)
        self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="tessera")

    def run(self, tasks) -> None:
        """Run ``tasks`` on ``workers`` threads, the calling one among them: each takes the
        next task not yet taken until none is left (one pool submission per helper, not
        per task: a step of small blocks is many short runs of a few tasks). A task's error
        stops the others taking more; it is raised once the running ones have ended."""
        if len(tasks) <= 1:
            for task in tasks:
                task()
            return
        lock, taken, failed = threading.Lock(), itertools.count(), threading.Event()

        def drain():
            while not failed.is_set():  # after a task's error no other task starts
                with lock:              # each task taken once (not only under the GIL)
                    n = next(taken)
                if n >= len(tasks):
                    return
                try:
                    tasks[n]()
                except BaseException:
                    failed.set()
                    raise
        helpers = [self._pool.submit(drain) for _ in range(min(self.workers, len(tasks)) - 1)]
        try:
            drain()
        finally:                        # no task runs on after run returns or raises
            for f in helpers:
                f.exception()
        for f in helpers:
            f.result()

    def run_forked(self, task_set, order, done) -> np.ndarray | None:
        """Results of a forkable task set's tasks (in ``order``, dynamically, largest
        first) run in ``workers`` forked processes; ``done()`` as each one comes back;
        the workers' flops go to ``task_set.add_flops``. None (run them on the threads)
        with one worker or task, or where fork is not available."""
        global _forked
        if self.workers < 2 or len(order) < 2:
            return None
        if "fork" not in multiprocessing.get_all_start_methods():
            _log.info("%s: this platform cannot fork worker processes; running its tasks on %d threads",
                      task_set.name, self.workers)
            return None
        results, flops = np.zeros(len(task_set)), 0
        _forked = task_set
        pool = multiprocessing.get_context("fork").Pool(self.workers, initializer=_worker_signals)
        try:
            for i, result, n in pool.imap_unordered(_forked_task, order):
                results[i] = result
                flops += n
                done()
            pool.close()
            pool.join()
        finally:
            pool.terminate()            # only on an error: the workers have ended otherwise
            _forked = None
        if task_set.add_flops is not None:
            task_set.add_flops(flops)
        return results

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def _worker_signals() -> None:
    """In a forked worker: Ctrl-C is the parent's to handle, SIGTERM (the pool ending it
    after an error) ends it, and neither wakes a signal watcher the parent may run
    (``cli.interrupt``: the wakeup descriptor is inherited)."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _forked_task(i: int) -> tuple:
    """In a forked worker: (i, result of task i, flops it counted)."""
    ts = _forked
    before = ts.flops() if ts.flops else 0
    result = float(run_task(ts, i, local_blocks))
    return i, result, (ts.flops() - before) if ts.flops else 0
