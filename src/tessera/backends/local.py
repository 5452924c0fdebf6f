"""The executors of one process; the math of a task lives in the array ops (``blockops``).

``serial`` runs tasks in order on one thread with single-threaded BLAS: the
deterministic reference. ``threads`` runs them on a pool with dynamic scheduling; BLAS
releases the GIL, and threadpoolctl keeps pool threads x BLAS threads <= cores (the
threads per rank: ``OMP_NUM_THREADS`` when set, which ``tessera run --threads`` sets,
else the cores this process may use). Executors are made by name in ``registry``.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

from tessera.errors import InputError


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def threads_of(backend: str, distributed: bool) -> int:
    """The threads one rank of ``backend`` runs with: 1 for serial; --threads /
    OMP_NUM_THREADS when set; else 1 per rank of a distributed run, all cores in one process."""
    if backend == "serial":
        return 1
    return threads_per_rank() or (1 if distributed else available_cores())


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
        if len(tasks) <= 1:
            for task in tasks:
                task()
            return
        for f in [self._pool.submit(t) for t in tasks]:
            f.result()

    def close(self) -> None:
        self._pool.shutdown(wait=True)
