"""How this process was launched, read from the launcher's environment (no MPI started),
and which MPI library mpi4py should load.

Launchers, checked innermost first (a launcher started inside another's job sees the
outer one's variables too):

    openmpi   Open MPI's mpirun/prterun, jsrun      OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_RANK
    pals      HPE Cray PALS (mpiexec on Cray EX)    PALS_RANKID; size from PMI_SIZE
    pmi       MPICH hydra (the mpich wheel's         PMI_SIZE, PMI_RANK
              mpiexec), Intel MPI, srun --mpi=pmi2
    slurm     srun (any --mpi plugin)               SLURM_STEP_NUM_TASKS, SLURM_PROCID
    pmix      a PMIx server (prterun, srun           PMIX_RANK; the size is not in the
              --mpi=pmix outside a Slurm step)      environment

A launcher whose rank variable is set but whose size cannot be read gives ``size None``:
``--backend auto`` then refuses to run (it could not tell one process from N copies),
and an MPI backend lets MPI say. After MPI starts, ``check_world_size`` compares MPI's
rank count with the launcher's: an MPI library that cannot talk to the launcher starts
every process as a one-rank singleton, and N serial copies must never run.

The MPI library: mpi4py's PyPI wheel loads the first ``libmpi`` it finds, the `mpich`
wheel in this Python environment before anything on ``LD_LIBRARY_PATH``. When a
launcher started this process and a site MPI library is on ``LD_LIBRARY_PATH`` (``module
load ...``), ``prefer_site_mpi`` points ``MPI4PY_LIBMPI`` at it, unless ``MPI4PY_LIBMPI``
or ``MPI4PY_MPIABI`` already say which library to use, or mpi4py was built against one
MPI (then it links that one). See docs/cluster.md.
"""

from __future__ import annotations

import glob
import logging
import os
import sys
from dataclasses import dataclass
from typing import Mapping

from tessera.errors import InputError, RuntimeLayerError

log = logging.getLogger("tessera.runtime")

# (launcher, size variable or None, rank variable, whether the launcher always sets the
# size: then the size marks the launch, and a rank variable without it is a stray, e.g.
# SLURM_PROCID in a batch script; else the rank variable marks it)
LAUNCHERS = (
    ("openmpi", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", True),
    ("pals", "PMI_SIZE", "PALS_RANKID", False),
    ("pmi", "PMI_SIZE", "PMI_RANK", True),
    ("slurm", "SLURM_STEP_NUM_TASKS", "SLURM_PROCID", True),
    ("pmix", None, "PMIX_RANK", False),
)
LIBMPI_NAMES = ("libmpi.so.12", "libmpi.so.40", "libmpi.so")


@dataclass(frozen=True)
class Launch:
    """``launcher`` (None: started without one), ``size`` (ranks; None: launched, size
    unreadable), ``rank`` and the variables they were read from."""

    launcher: str | None = None
    size: int | None = 1
    rank: int = 0
    source: str = ""


def _count(env: Mapping[str, str], name: str, minimum: int) -> int | None:
    raw = env.get(name)
    if raw is None or not raw.strip():
        return None
    try:
        value = int(raw)
    except ValueError:
        value = None
    if value is None or value < minimum:
        raise InputError(f"{name}={raw!r} (set by the MPI launcher) is not a "
                         f"{'rank count' if minimum else 'rank'}; expected a whole number >= {minimum}. "
                         "Unset it when not launching under MPI")
    return value


def detect(environ: Mapping[str, str] | None = None) -> Launch:
    """The launch of this process, from its environment (see module docstring)."""
    env = os.environ if environ is None else environ
    for name, size_var, rank_var, always in LAUNCHERS:
        if always and not env.get(size_var, "").strip():
            continue
        rank = _count(env, rank_var, 0)
        if rank is None:
            if not always:
                continue
            rank = 0                # the size marks the launch (a rank variable alone does not)
        size = _count(env, size_var, 1) if size_var else None
        if size is not None and rank >= size:
            raise InputError(f"{rank_var}={rank} but {size_var}={size}: the launcher's rank must be "
                             "below its size; unset stale MPI variables")
        return Launch(name, size, rank, f"{rank_var}" + (f", {size_var}={size}" if size else ""))
    return Launch()


def launched_size(environ: Mapping[str, str] | None = None) -> int:
    """Ranks the launcher started (1 without one); an InputError when a launcher started
    this process but its rank count cannot be read from the environment."""
    launch = detect(environ)
    if launch.size is None:
        raise InputError(
            f"launched by {launch.launcher} ({launch.source} set) but the number of ranks is not in "
            "the environment, so --backend auto cannot tell one process from several; name the "
            "backend (--backend mpi-onesided or mpi-collective), or launch with srun or mpiexec "
            "(docs/cluster.md)")
    return launch.size


def check_world_size(mpi_size: int, environ: Mapping[str, str] | None = None) -> None:
    """After MPI starts: MPI's rank count must be the launcher's (see module docstring)."""
    launch = detect(environ)
    bad = (launch.size is not None and launch.size != mpi_size) or \
        (launch.size is None and mpi_size == 1 and launch.rank > 0)
    if bad:
        raise RuntimeLayerError(
            f"launched by {launch.launcher} as {launch.size or 'several'} rank(s) ({launch.source}) but "
            f"MPI started {mpi_size}: the MPI library mpi4py loaded ({os.environ.get('MPI4PY_LIBMPI') or 'its default'}) "
            "cannot talk to this launcher, and every process would run the whole calculation alone. Use the "
            "site MPI (MPI4PY_LIBMPI=/path/to/libmpi.so) or the launcher that belongs to the MPI "
            "library (docs/cluster.md)")


def _multi_abi_mpi4py() -> bool:
    """Whether mpi4py is the PyPI wheel that picks its MPI library at run time."""
    import mpi4py
    return bool(glob.glob(os.path.join(os.path.dirname(mpi4py.__file__), "MPI.mpich.*")))


def site_libmpi(environ: Mapping[str, str] | None = None) -> str | None:
    """The first MPI library on LD_LIBRARY_PATH outside this Python environment, or None."""
    env = os.environ if environ is None else environ
    prefix = os.path.realpath(sys.prefix)
    for entry in filter(None, env.get("LD_LIBRARY_PATH", "").split(os.pathsep)):
        if os.path.realpath(entry).startswith(prefix + os.sep):
            continue
        for name in LIBMPI_NAMES:
            path = os.path.join(entry, name)
            if os.path.isfile(path):
                return path
    return None


def prefer_site_mpi() -> str | None:
    """Before mpi4py loads MPI: point MPI4PY_LIBMPI at a site MPI library when a launcher
    started this process (see module docstring); returns the library chosen, or None."""
    env = os.environ
    if env.get("MPI4PY_LIBMPI") or env.get("MPI4PY_MPIABI") or detect().launcher is None:
        return None
    path = site_libmpi()
    if path is None or not _multi_abi_mpi4py():
        return None
    env["MPI4PY_LIBMPI"] = path
    log.info("MPI library: %s (the site MPI on LD_LIBRARY_PATH, ahead of the mpich wheel; "
             "set MPI4PY_LIBMPI to choose another)", path)
    return path
