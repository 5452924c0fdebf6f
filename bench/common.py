"""What the benchmarks share: the BLAS kernels every process uses, a DGEMM peak measured in
the same run, timing, the machine's load, and plain-text tables.

    sys.path.insert(0, str(Path(__file__).resolve().parent)); from common import dgemm_peak, table

(the scripts in bench/ are run as files, so they import this one by path).
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time


def blas_coretype() -> str | None:
    """Set ``OPENBLAS_CORETYPE`` (unless already set) for this process and every process a
    benchmark starts, from the CPU's own flags: SkylakeX with AVX-512, Haswell with AVX2.

    OpenBLAS picks its kernels by CPU model; a build older than the CPU does not know the
    model and falls back to generic SSE3 ("Prescott") kernels. On an Emerald Rapids machine
    (family 6, model 207) PySCF's bundled OpenBLAS 0.3.3 and Debian's 0.3.21 (NWChem, Psi4)
    both did, running their DGEMMs ~2x slower, while numpy's newer OpenBLAS knew the CPU.
    A comparison gives every code the kernels its CPU supports. Returns the value in force."""
    if "OPENBLAS_CORETYPE" not in os.environ:
        try:
            with open("/proc/cpuinfo") as f:
                flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
        except OSError:
            flags = []
        if {"avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512cd"} <= set(flags):
            os.environ["OPENBLAS_CORETYPE"] = "SkylakeX"
        elif {"avx2", "fma"} <= set(flags):
            os.environ["OPENBLAS_CORETYPE"] = "Haswell"
    return os.environ.get("OPENBLAS_CORETYPE") or None


blas_coretype()  # before numpy (and any BLAS) loads in a script that imports this first

import numpy as np  # noqa: E402


def cpu_seconds() -> float:
    """CPU seconds of this process and of its ended children (the forked workers of a
    ``threads`` run's forkable task sets, e.g. (T))."""
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + kids.ru_utime + kids.ru_stime


def timed(fn):
    """(value, wall seconds, CPU seconds of this process and its ended children) of ``fn()``."""
    c0, t0 = cpu_seconds(), time.perf_counter()
    value = fn()
    return value, time.perf_counter() - t0, cpu_seconds() - c0


def dgemm_peak(n: int = 3000, threads: int | None = None, repeat: int = 3) -> tuple:
    """(GFLOP per wall second, GFLOP per CPU second) of the best of ``repeat`` square
    n x n DGEMMs (scipy's BLAS) with ``threads`` BLAS threads (None: as many as BLAS uses)."""
    from scipy.linalg.blas import dgemm
    from threadpoolctl import threadpool_limits
    a = np.asfortranarray(np.random.default_rng(0).random((n, n)))
    c = np.zeros((n, n), order="F")
    with threadpool_limits(limits=threads, user_api="blas"):
        runs = [timed(lambda: dgemm(1.0, a, a, beta=0.0, c=c, overwrite_c=1))[1:] for _ in range(repeat)]
    return 2.0 * n ** 3 / min(t for t, _ in runs) / 1e9, 2.0 * n ** 3 / min(c for _, c in runs) / 1e9


def blas_kernels() -> str:
    """One line: the ``OPENBLAS_CORETYPE`` in force and the kernels each OpenBLAS loaded in
    this process uses (threadpoolctl's ``architecture``)."""
    from threadpoolctl import threadpool_info
    libs = ", ".join(f"{os.path.basename(t['filepath'])} {t.get('architecture')}"
                     for t in threadpool_info() if t.get("internal_api") == "openblas")
    return f"BLAS kernels: OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(unset)')} ({libs})"


def uptime() -> str:
    """The output of ``uptime`` (load averages over 1, 5 and 15 minutes)."""
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "load average: " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def table(rows: list, columns: list) -> str:
    """A text table: ``columns`` is [(header, key or function of the row, format spec)];
    a missing value (None) prints as '-'."""
    def cell(row, get, spec):
        value = get(row) if callable(get) else row.get(get)
        return "-" if value is None else format(value, spec)
    cells = [[cell(r, get, spec) for _, get, spec in columns] for r in rows]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, (h, _, _) in enumerate(columns)]
    first = [not spec.endswith(("d", "f", "e", "g", "%")) for _, _, spec in columns]

    def line(values):
        return " ".join(v.ljust(w) if left else v.rjust(w) for v, w, left in zip(values, widths, first)).rstrip()
    return "\n".join([line([h for h, _, _ in columns])] + [line(c) for c in cells])


def rerun_on_src(script: str, argv, src: str) -> None:
    """Run ``script`` again with ``argv`` less ``--src DIR``, importing Tessera from ``src``
    (an older checkout's, for BEFORE numbers: the script reads TESSERA_BENCH_SRC), and exit
    with its status."""
    rest = list(argv)
    if "--src" in rest:
        i = rest.index("--src")
        del rest[i:i + 2]
    else:
        rest = [a for a in rest if not a.startswith("--src=")]
    env = dict(os.environ, TESSERA_BENCH_SRC=src)
    raise SystemExit(subprocess.call([sys.executable, script, *rest], env=env))
