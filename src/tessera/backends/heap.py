"""The process's allocator policy for the working arrays of the executors.

A CCSD iteration allocates and frees the same few hundred arrays every time (sector
products, gathered matrices, the flat vectors of new tensors), most of them 0.1-30 MB.
glibc's malloc serves such arrays by fresh memory mappings (above its mmap threshold)
or hands freed heap memory back to the kernel (above its trim threshold), so every
iteration touches fresh pages again: each first touch is a page fault that zeroes a page.
On benzene cc-pVDZ (D2h) that was ~19 000 faults per CCSD residual, about a quarter of
its CPU time. ``keep_freed_memory`` fixes both thresholds: arrays up to ``MMAP_BYTES``
come from the heap and freed ones are reused; larger ones (integral classes, C1 sector
matrices) are still mapped, and returned to the kernel when freed. Freed heap memory is
not handed back on its own: with a trim threshold of 64 MiB a glycine cc-pVDZ (C1) CCSD
iteration still gave ~40 MB back and faulted it in again, ~10 000 page faults and 60-140
ms of system time per iteration (measured on serial, 2 000 faults without trimming);
``give_back_freed_memory`` hands it back when a phase (CCSD) or a context is over. ``base_pages``
gives one large array its own mapping of base pages instead of transparent huge pages.

``keep_freed_memory`` also stops numpy asking for transparent huge pages for its arrays of
4 MiB or more (``madvise(MADV_HUGEPAGE)``; the kernel's default of ``madvise`` mode gives
them only to arrays that ask): a first touch of a huge page waits for the kernel to find
and zero 2 MiB, and on a shared virtual machine that was the larger part of the system
time of a run. Glycine cc-pVDZ (C1) CCSD, 2 threads: the first iteration (its constants'
~0.7 GB of gathered matrices touched for the first time) 1.5-1.7 s -> 0.3 s of system
time, the whole 5-iteration run 2.6-2.8 -> 1.3-1.5 s, user time unchanged (measured
under load; GEMMs run as fast on base pages). Like the malloc thresholds, this holds
for the whole process from the first ``Context`` on (a caller's own arrays included).
"""

from __future__ import annotations

import ctypes
import importlib
import logging
import mmap
from functools import cache

import numpy as np

_log = logging.getLogger(__name__)

MMAP_BYTES = 32 << 20       # glibc's own ceiling for its dynamic mmap threshold
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3       # mallopt parameters (malloc.h)
_MADV_POPULATE_WRITE = 23    # madvise(2), Linux 5.14; Python 3.11's mmap does not name it


@cache
def keep_freed_memory() -> bool:
    """Set the thresholds, once per process; False where the C library has no
    ``mallopt`` (not glibc): its allocator's own policy then stays."""
    try:
        mallopt = ctypes.CDLL(None).mallopt      # the process's own C library (no ldconfig search)
    except (OSError, AttributeError, TypeError):
        return False
    # a trim threshold of -1: never trimmed while in use (mallopt(3))
    done = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_BYTES)) and bool(mallopt(_M_TRIM_THRESHOLD, -1))
    _no_huge_pages()
    _log.debug("malloc keeps freed arrays below %d MiB for reuse: %s", MMAP_BYTES >> 20, done)
    return done


def _no_huge_pages() -> None:
    """numpy's arrays on base pages (module docstring): its switch for the ``madvise`` it
    makes for arrays of 4 MiB or more (numpy >= 1.20; its private name moved with numpy 2).
    Nothing where numpy has no such switch."""
    for module in ("numpy._core.multiarray", "numpy.core.multiarray"):
        try:
            switch = getattr(importlib.import_module(module), "_set_madvise_hugepage")
        except (ImportError, AttributeError):
            continue
        switch(False)
        return


def give_back_freed_memory() -> None:
    """Hand the heap's free memory back to the kernel (glibc ``malloc_trim``), where
    ``keep_freed_memory`` kept it: at the end of a phase whose working arrays the next
    one does not reuse. Nothing where the C library has no ``malloc_trim``."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError, TypeError):
        pass


def base_pages(shape: tuple) -> np.ndarray:
    """A new float64 array of ``shape`` (contents undefined) in its own memory mapping
    of base pages, unmapped when the array is freed. numpy asks for transparent huge
    pages for arrays of 4 MiB or more, and the first touch of those can wait for the
    kernel to assemble 2 MiB pages: the transform's 97 MB of half-transformed rows on
    benzene cc-pVDZ took 0.09 s longer to fill so (measured). The pages are mapped at
    once (MADV_POPULATE_WRITE, Linux 5.14 on, after MADV_NOHUGEPAGE): one call instead of a page fault per
    first touch, which also serialises the threads that fill the array (88 MB: 0.05 ->
    0.03 s, and unmapped in 0.006 instead of 0.02 s; measured). np.empty where the
    platform has no MADV_NOHUGEPAGE."""
    size = int(np.prod(shape))
    advice = getattr(mmap, "MADV_NOHUGEPAGE", None)
    if advice is None or size == 0:
        return np.empty(shape)
    buf = mmap.mmap(-1, 8 * size)
    buf.madvise(advice)             # before the pages exist: populated below as base pages
    try:
        buf.madvise(getattr(mmap, "MADV_POPULATE_WRITE", _MADV_POPULATE_WRITE))
    except OSError:                 # Linux < 5.14: pages come on first touch
        pass
    return np.frombuffer(buf, dtype=np.float64, count=size).reshape(shape)
