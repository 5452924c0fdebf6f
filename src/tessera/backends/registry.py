"""Every backend, variant and schedule name, their defaults and option checks, once.

The CLI, ``RunOptions`` and ``Context`` all call :func:`check_options`; executors are
made by ``context.make_executor``, which imports an MPI executor only when it is chosen.

- backends: ``auto`` (default: ``threads`` in one process, a cost-model choice under
  mpiexec with several ranks), ``serial``, ``threads``, ``mpi-onesided``, ``mpi-collective``;
- variants: ``mpi-onesided`` loop orders ``original | inverted | cached`` (default
  ``cached``) and ``owner`` (owner computes: gets only, no remote accumulate), ``mpi-collective`` algorithms ``summa | 2.5d`` (default ``summa``);
- schedules (``backends.schedule``): ``static | nxtval | steal``; the executor
  ``mpi-onesided`` takes ``nxtval`` (default) or ``steal``; task sets such as the Fock
  build may also ask for ``static``.
"""

from __future__ import annotations

import math
import os

from tessera.backends.budget import env_memory
from tessera.errors import InputError

DEFAULT_BACKEND = "auto"
BACKENDS = ("auto", "serial", "threads", "mpi-onesided", "mpi-collective")
LOCAL_BACKENDS = ("serial", "threads")
MPI_BACKENDS = ("mpi-onesided", "mpi-collective")
VARIANTS = {"mpi-onesided": ("original", "inverted", "cached", "owner"), "mpi-collective": ("summa", "2.5d")}
DEFAULT_VARIANT = {"mpi-onesided": "cached", "mpi-collective": "summa"}
SCHEDULES = ("static", "nxtval", "steal")
EXECUTOR_SCHEDULES = {"mpi-onesided": ("nxtval", "steal")}
DEFAULT_SCHEDULE = "nxtval"


ENV_BLAS_THREADS = "TESSERA_BLAS_THREADS"     # BLAS threads per MPI rank
ENV_PIECES = "TESSERA_PIECES"     # tests: at least this many pieces per block of a ``pieces`` tensor


def env_number(name: str, default, *, integer: bool = False):
    """The positive number in environment variable ``name`` (``default`` when unset or
    empty); a one-line InputError naming the variable for anything else (nan, inf, 0,
    negative, text), as for a bad option."""
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        value = int(raw) if integer else float(raw)
    except ValueError:
        value = None
    if value is None or not math.isfinite(value) or value <= 0:
        raise InputError(f"{name}={raw!r}: expected {'a whole number >= 1' if integer else 'a positive number'}; "
                         "fix or unset it")
    return value


def least_pieces() -> int:
    """Into at least how many pieces a run cuts every block of a ``pieces`` tensor
    (TESSERA_PIECES, a test setting; 1: the placement's own cut). The storage, the cost
    model and the memory estimate all read it here."""
    return env_number(ENV_PIECES, 1, integer=True)


def check_environment() -> None:
    """Every TESSERA_* variable checked before any work (as options are), without
    starting MPI: the memory budget, BLAS threads per rank and the runtime's options."""
    env_memory()                                         # as --max-memory (backends.budget)
    env_number(ENV_BLAS_THREADS, 1, integer=True)
    least_pieces()
    from tessera.backends.local import threads_per_rank
    threads_per_rank()                                   # OMP_NUM_THREADS
    from tessera.runtime.options import RuntimeOptions
    RuntimeOptions.resolve()


def launched_ranks() -> int:
    """Ranks this process was started with by a launcher (1 without one), read from the
    launcher's environment (PMI, Open MPI, Slurm, PALS, PMIx: ``runtime.launch``), so that
    asking does not start MPI. A launch whose rank count cannot be read is an InputError."""
    from tessera.runtime.launch import launched_size
    return launched_size()


def runs_distributed(backend: str) -> bool:
    """Whether ``backend`` runs over MPI ranks here: an MPI backend, or ``auto`` when
    a launcher started several ranks (does not start MPI; ``auto`` under a launcher whose
    rank count cannot be read is an InputError, never one serial copy per rank)."""
    return backend in MPI_BACKENDS or (backend == "auto" and launched_ranks() > 1)


def backend_of_variant(variant) -> str | None:
    """The MPI executor a variant belongs to (None for None or an unknown variant)."""
    for backend, names in VARIANTS.items():
        if variant in names:
            return backend
    return None


def check_schedule(schedule: str) -> str:
    if schedule not in SCHEDULES:
        raise InputError(f"unknown schedule {schedule!r}; choose one of: {', '.join(SCHEDULES)}")
    return schedule


def check_options(backend: str, variant=None, schedule=None, ranks: int | None = None) -> None:
    """Unknown or misplaced backend, --variant, --schedule are one-line errors.

    ``ranks`` (default: what mpiexec started) decides whether ``auto`` runs in one
    process (threads, no MPI option) and whether a one-process backend is misplaced.
    """
    if backend not in BACKENDS:
        raise InputError(f"unknown backend {backend!r}; choose one of: {', '.join(BACKENDS)}")
    if ranks is None:
        ranks = 2 if backend in MPI_BACKENDS else launched_ranks()
    all_variants = [v for names in VARIANTS.values() for v in names]
    if backend in LOCAL_BACKENDS:
        if variant is not None or schedule is not None:
            raise InputError(f"--variant and --schedule belong to the MPI backends; backend {backend!r} "
                             "takes neither (use --backend mpi-onesided or mpi-collective)")
        if ranks > 1:
            raise InputError(f"backend {backend!r} runs in one process, but mpiexec started {ranks}; "
                             "use --backend auto, mpi-onesided or mpi-collective, or run without mpiexec")
        return
    if backend == "auto" and ranks <= 1 and (variant is not None or schedule is not None):
        raise InputError("--variant and --schedule need several ranks with --backend auto (one "
                         "process runs threads); start with mpiexec or name an MPI backend")
    if backend in VARIANTS and variant is not None and variant not in VARIANTS[backend]:
        raise InputError(f"unknown variant {variant!r} for {backend}; choose one of: "
                         f"{', '.join(VARIANTS[backend])}")
    if backend == "auto" and variant is not None and variant not in all_variants:
        raise InputError(f"unknown variant {variant!r}; choose one of: "
                         + " or ".join(f"{', '.join(v)} ({b})" for b, v in VARIANTS.items()))
    executor = backend if backend != "auto" else backend_of_variant(variant)
    if schedule is not None:
        if executor == "mpi-collective":
            raise InputError("mpi-collective is bulk-synchronous and takes no --schedule; "
                             "schedules (nxtval, steal) belong to mpi-onesided"
                             + ("" if backend == "mpi-collective" else f" (variant {variant} is mpi-collective's)"))
        allowed = EXECUTOR_SCHEDULES["mpi-onesided"]
        if schedule not in allowed:
            raise InputError(f"unknown schedule {schedule!r}; choose one of: {', '.join(allowed)}")


def resolve_auto(nranks: int, variant=None, schedule=None, **options) -> tuple:
    """(backend, options) of ``Context("auto")`` without a cost model: threads on one
    rank, else the executor the variant belongs to, by default mpi-onesided with its
    default loop order and schedule (the cost model's usual winner)."""
    check_options("auto", variant, schedule, ranks=nranks)
    if nranks <= 1:
        given = sorted(k for k, v in options.items() if v is not None)
        if given:
            raise InputError(f"backend 'auto' on one process runs 'threads', which takes no option "
                             f"{', '.join(given)}; start several ranks with mpiexec, or name an MPI backend")
        return "threads", {}
    backend = backend_of_variant(variant) or "mpi-onesided"
    opts = {**options, "variant": variant or DEFAULT_VARIANT[backend]}
    if backend == "mpi-onesided":
        opts["schedule"] = schedule or DEFAULT_SCHEDULE
    return backend, opts
