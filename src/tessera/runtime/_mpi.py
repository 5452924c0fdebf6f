"""Lazy access to mpi4py, numpy-to-MPI datatypes and a cache of subarray datatypes.

MPI is initialised on first use, not when `tessera` or `tessera.runtime` is imported:
`load_mpi()` imports `mpi4py.MPI`, which calls `MPI_Init_thread` requesting
`MPI_THREAD_MULTIPLE` (mpi4py's default). Without `mpiexec` MPICH starts as a
singleton (one rank), so a plain `python script.py` works. Which MPI library mpi4py
loads: `runtime.launch.prefer_site_mpi` (a site MPI ahead of the `mpich` wheel when a
launcher started the process and the site MPI is on LD_LIBRARY_PATH).
"""

from __future__ import annotations

import logging
import os
from collections import OrderedDict

import numpy as np

from tessera.errors import RuntimeLayerError

log = logging.getLogger("tessera.runtime")

_MPI = None


def load_mpi():
    """Return the `mpi4py.MPI` module, initialising MPI on first call."""
    global _MPI
    if _MPI is None:
        try:
            import mpi4py
        except ImportError as exc:  # pragma: no cover - dependency of the package
            raise RuntimeLayerError(
                "mpi4py is not installed, but the Tessera runtime needs it to talk to MPI. "
                "Install the package with its MPI: `pip install mpi4py mpich`."
            ) from exc
        mpi4py.rc.thread_level = "multiple"
        from tessera.runtime.launch import prefer_site_mpi
        prefer_site_mpi()
        try:
            from mpi4py import MPI
        except (ImportError, OSError, RuntimeError) as exc:
            what = " ".join(str(exc).split())[:300]
            raise RuntimeLayerError(
                f"mpi4py could not load an MPI library (MPI4PY_LIBMPI="
                f"{os.environ.get('MPI4PY_LIBMPI') or 'unset'}): {what}. Point MPI4PY_LIBMPI at "
                "the site's libmpi.so, or unset it to use the mpich wheel (docs/cluster.md)."
            ) from exc

        _MPI = MPI
    return _MPI


def mpi_datatype(dtype: np.dtype):
    """The MPI datatype of a numpy dtype (float32/64, complex64/128, int8..int64, uint*)."""
    MPI = load_mpi()
    from mpi4py.util import dtlib

    dtype = np.dtype(dtype)
    if dtype.kind not in "fciu" or not dtype.isnative:
        raise RuntimeLayerError(
            f"dtype {dtype} cannot be stored in a global array: expected a native numeric "
            "dtype (float32, float64, complex64, complex128 or a native integer); "
            "convert the data first."
        )
    try:
        mpitype = dtlib.from_numpy_dtype(dtype)
    except (KeyError, ValueError) as exc:
        raise RuntimeLayerError(
            f"dtype {dtype} has no MPI datatype in this MPI library; use float64 or int64."
        ) from exc
    if mpitype == MPI.DATATYPE_NULL:  # pragma: no cover - defensive
        raise RuntimeLayerError(f"dtype {dtype} has no MPI datatype; use float64 or int64.")
    return mpitype


class SubarrayTypes:
    """Committed MPI subarray datatypes, cached by (base, shape, subshape, start).

    Patch transfers describe a box inside a C-ordered block with one subarray
    datatype; building and committing one costs tens of microseconds, so they are
    kept in a bounded LRU cache. A datatype evicted while an operation that uses it
    is still pending stays valid (MPI frees it when the operation completes).
    """

    def __init__(self, capacity: int = 1024):
        self._capacity = capacity
        self._types: OrderedDict = OrderedDict()

    def get(self, base, shape: tuple, subshape: tuple, start: tuple):
        key = (base.handle, shape, subshape, start)
        dt = self._types.get(key)
        if dt is not None:
            self._types.move_to_end(key)
            return dt
        dt = base.Create_subarray(shape, subshape, start).Commit()
        self._types[key] = dt
        if len(self._types) > self._capacity:
            _, old = self._types.popitem(last=False)
            old.Free()
        return dt

    def clear(self) -> None:
        for dt in self._types.values():
            dt.Free()
        self._types.clear()

    def __len__(self) -> int:
        return len(self._types)
