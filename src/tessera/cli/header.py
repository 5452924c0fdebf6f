"""The first lines of a run's log: what ran where (version, host, date, ranks, threads, BLAS).

Read from the environment only: printing it starts no MPI and no thread pool.
"""

from __future__ import annotations

import datetime
import socket
import sys


def threads_per_rank(backend: str) -> int:
    """The threads one rank of ``backend`` runs with (as the JSON's ``threads_per_rank``)."""
    from tessera.backends.local import threads_of
    from tessera.backends.registry import runs_distributed
    return threads_of(backend, runs_distributed(backend))


def blas() -> str:
    from threadpoolctl import threadpool_info
    libs = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    if not libs:
        return "unknown"
    # NumPy's library runs the tensor GEMMs; SciPy's or PySCF's may be listed before it
    i = next((i for i in libs if "numpy" in i.get("filepath", "")), libs[0])
    kernels = f"({i['architecture']} kernels)" if i.get("architecture") else None   # OpenBLAS's choice for the CPU
    return " ".join(str(x) for x in (i.get("internal_api"), i.get("version"), kernels) if x)


def header_lines(backend: str) -> list:
    from tessera import __version__
    from tessera.runtime.launch import detect
    ranks = detect().size or "unknown"
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    return [f"Tessera {__version__} on {socket.gethostname()}, {now}, Python {sys.version.split()[0]}",
            f"Ranks {ranks}, threads per rank {threads_per_rank(backend)}, BLAS {blas()}"]
