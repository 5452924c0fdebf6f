"""The memory a rank may use: one budget for the run's memory check (``chem.memory``)
and for the cost model (``backends.auto``).

In this order: ``--max-memory`` (``RunOptions.max_memory``), else (for ``tessera plan
--ranks``) the memory of a simulated node shared by its ranks, else the environment
variable ``TESSERA_MEMORY_PER_RANK_MB``, else the memory available on this node now
(``MemAvailable``) shared by the ranks on this node. The option and the variable take
the same values (MiB as a number, or a size with a binary unit: ``500M``, ``8G``,
``2GiB``) and are checked alike: anything else is a one-line InputError naming which.
"""

from __future__ import annotations

import math
import os
import re

from tessera.errors import InputError

ENV_MEMORY = "TESSERA_MEMORY_PER_RANK_MB"     # MiB (or a size) a rank may use
EXECUTOR_CACHE_MB = 512     # each cache of an MPI executor at most (fetched blocks, frozen blocks or panels)
CACHE_SHARE = 1 / 8        # ... and at most this share of the memory budget per rank

_UNITS = {"": 2**20, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


def parse_size(text, what: str = "--max-memory") -> float:
    """MiB of ``text``: a number of MiB, or with a binary unit (``500M``, ``8GB``,
    ``2GiB``, ``1T``); ``what`` names the option or variable in the error."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([kKmMgGtT]?)(?:i?[bB])?\s*", str(text))
    value = float(m.group(1)) * _UNITS[m.group(2).lower()] / 2**20 if m else float("nan")
    if not (math.isfinite(value) and value > 0):
        raise InputError(f"{what} {text!r} is not a memory size; expected a positive size per "
                         "rank such as 4000 (MiB), 500M or 8G")
    return value


def env_memory() -> float | None:
    """MiB per rank from TESSERA_MEMORY_PER_RANK_MB (None when unset or empty)."""
    raw = os.environ.get(ENV_MEMORY)
    if raw is None or not raw.strip():
        return None
    return parse_size(raw, f"environment variable {ENV_MEMORY}")


def available_memory() -> int:
    """Bytes this node can give a new run now (MemAvailable; else its physical memory)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 * 2**30


def executor_cache_bytes(budget: float | None) -> int:
    """Bytes each cache of an MPI executor may hold (``mpi-onesided``'s per-step block
    cache and its frozen cache, ``mpi-collective``'s frozen cache): EXECUTOR_CACHE_MB, at
    most CACHE_SHARE of the memory ``budget`` per rank (None: no budget), so that a run
    given less memory (``--max-memory``) keeps smaller caches rather than more than it was
    allowed; in whole MiB (at least one), what the run's executors take (``cache_mb``) and
    the cost model's estimate counts."""
    mib = EXECUTOR_CACHE_MB if budget is None else max(1, min(EXECUTOR_CACHE_MB, int(CACHE_SHARE * budget) >> 20))
    return mib << 20


def memory_budget(node_ranks: int = 1, max_memory: float | None = None,
                  memory_per_node: float | None = None) -> tuple[float, str]:
    """(bytes a rank may use, where that figure comes from): ``max_memory`` (MiB, the
    option), else ``memory_per_node`` (bytes of a simulated node, ``tessera plan
    --memory-per-node``) shared by its ``node_ranks`` ranks, else
    TESSERA_MEMORY_PER_RANK_MB, else this node's available memory shared by its
    ``node_ranks`` ranks."""
    n = max(1, int(node_ranks))
    if max_memory is not None:
        return float(max_memory) * 2**20, "--max-memory"
    if memory_per_node is not None:
        return float(memory_per_node) / n, f"--memory-per-node / {n} ranks per node"
    mib = env_memory()
    if mib is not None:
        return mib * 2**20, ENV_MEMORY
    return available_memory() / n, ("available memory" if n == 1 else f"available memory / {n} ranks on this node")
