"""Executors decide who runs which task; the math of a task lives in the array ops.

``serial`` runs tasks in order on one thread with single-threaded BLAS: the
deterministic reference. ``threads`` runs them on a pool with dynamic scheduling; BLAS
releases the GIL, and threadpoolctl keeps pool threads x BLAS threads <= cores.
Executors are looked up by name; the MPI executors (``mpi-onesided``,
``mpi-collective``, modules ``onesided`` and ``collective``) are imported only when
chosen, and ``auto`` resolves to one of the others (``auto.resolve``).
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


class SerialExecutor:
    name = "serial"
    blas_threads = 1

    def run(self, tasks) -> None:
        for task in tasks:
            task()

    def close(self) -> None:
        pass


class ThreadsExecutor:
    name = "threads"

    def __init__(self, workers: int | None = None):
        cores = available_cores()
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


def launched_ranks() -> int:
    """Ranks this process was started with by mpiexec (1 without it), read from the
    launcher's environment, so that asking does not start MPI."""
    for var in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE"):
        value = os.environ.get(var)
        if value and value.isdigit():
            return int(value)
    return 1


def runs_distributed(backend: str) -> bool:
    """Whether ``backend`` runs over MPI ranks here: an MPI backend, or ``auto`` when
    mpiexec started several ranks (does not start MPI)."""
    return backend in MPI_BACKENDS or (backend == "auto" and launched_ranks() > 1)


def _onesided(**options):
    from tessera.backends.onesided import OneSidedExecutor
    return OneSidedExecutor(**options)


def _collective(**options):
    from tessera.backends.collective import CollectiveExecutor
    return CollectiveExecutor(**options)


def _auto(**options):
    from tessera.backends.auto import resolve
    name, opts = resolve(launched_ranks(), **options)
    return make_executor(name, **opts)


EXECUTORS = {"serial": SerialExecutor, "threads": ThreadsExecutor, "mpi-onesided": _onesided,
             "mpi-collective": _collective, "auto": _auto}
BACKENDS = ("serial", "threads", "mpi-onesided", "mpi-collective", "auto")
MPI_BACKENDS = ("mpi-onesided", "mpi-collective")


def make_executor(name: str, **options):
    if name not in EXECUTORS:
        raise InputError(f"unknown backend {name!r}; choose one of: {', '.join(BACKENDS)}")
    options = {k: v for k, v in options.items() if v is not None}
    if name in ("serial", "threads"):
        bad = sorted(set(options) - ({"workers"} if name == "threads" else set()))
        if bad:
            raise InputError(f"backend {name!r} takes no option {', '.join(bad)}; variants, schedules "
                             "and caches belong to the MPI backends (mpi-onesided, mpi-collective)")
    return EXECUTORS[name](**options)
