"""The first lines of a run's log: what ran where (version, host, date, ranks, threads, BLAS).

Read from the environment only: printing it starts no MPI and no thread pool.
"""

from __future__ import annotations

import datetime
import socket
import sys


def threads_per_rank(backend: str) -> tuple:
    """(task threads, BLAS threads per task thread) one rank of ``backend`` runs with."""
    from tessera.backends.local import available_cores
    from tessera.backends.registry import ENV_BLAS_THREADS, env_number, runs_distributed
    if runs_distributed(backend):
        return 1, env_number(ENV_BLAS_THREADS, 1, integer=True)
    if backend == "serial":
        return 1, 1
    cores = available_cores()                  # threads: one pool thread per core
    return cores, max(1, available_cores() // cores)


def blas() -> str:
    from threadpoolctl import threadpool_info
    libs = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    if not libs:
        return "unknown"
    i = libs[0]
    return " ".join(str(x) for x in (i.get("internal_api"), i.get("version")) if x)


def header_lines(backend: str) -> list:
    from tessera import __version__
    from tessera.backends.registry import launched_ranks
    tasks, blas_threads = threads_per_rank(backend)
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    return [f"Tessera {__version__} on {socket.gethostname()}, {now}, Python {sys.version.split()[0]}",
            f"Ranks {launched_ranks()}, threads per rank {tasks} (x {blas_threads} BLAS), BLAS {blas()}"]
