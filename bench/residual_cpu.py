"""CPU time of one CCSD residual on one process, by array operation: the work outside the GEMMs.

    .venv/bin/python bench/residual_cpu.py [examples/benzene.xyz] [--basis cc-pvdz]
        [--backend serial|threads] [--iterations 8] [--tile 32]

Starts from PySCF's RHF and our transform (not timed), runs CCSD for ``--iterations``
iterations and prints, per residual (the median over the iterations after the first two,
which build the plans' index arrays): wall time, the calling thread's CPU time, the
process's CPU time (every thread: pool workers and BLAS's own), and minor page faults.
The CPU time of the tasks is split by array operation: GEMMs (with their GFLOP per CPU
second), flat adds (products and permuted sums added into the outputs by one index
array), gathers, block-by-block adds and scatters, outer products (made block by block
where they are added), planning; on ``serial`` (every task
on the calling thread) the rest of the calling thread's time is "other"; on ``threads``
the operations' CPU time is summed over the pool's threads, and workers x wall less the
process's CPU time is the time the workers were not computing: waiting at the end of a
step for the last task, while the calling thread prepared the next, or for a core (a
loaded machine). Also the CPU time of the rest of an iteration (update, DIIS, tau,
energy), the energy reached and the machine's load. Measured, never asserted.
"""

from __future__ import annotations

import argparse
import resource
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import uptime  # noqa: E402

from tessera.backends import blockops, context  # noqa: E402
from tessera.chem import ccsd_equations  # noqa: E402
from tessera.chem.ccsd import CCSD  # noqa: E402
from tessera.chem.integrals import transform  # noqa: E402
from tessera.chem.molecule import Molecule  # noqa: E402
from tessera.chem.pyscf_reference import rhf_reference  # noqa: E402
from tessera.errors import ConvergenceError  # noqa: E402

# the array operations' functions, by category (their tasks call them through the module)
CATEGORIES = {"gemm": (blockops, ("_gemm_one", "_gemm_scatter_one")), "flat add": (blockops, ("_flat_add",)),
              "gather": (blockops, ("_take", "_gather_one")), "block adds": (blockops, ("_add_one", "_pairs_one")),
              "scatter": (blockops, ("_scatter_one", "_scatter_rows")), "outer": (blockops, ("_outer_one",)),
              "plan": (context, ("plan_updates",))}


def _timed(fn, label: str, spent: Counter, stack: threading.local, lock: threading.Lock):
    """``fn`` whose thread time counts under ``label``, less that of timed calls inside
    it (``stack.nested``, one per thread: one entry per open timed call, the time of the
    calls inside it)."""
    def run(*args, **kwargs):
        nested = stack.__dict__.setdefault("nested", [])
        t0 = time.thread_time()
        nested.append(0.0)
        try:
            return fn(*args, **kwargs)
        finally:
            dt = time.thread_time() - t0
            with lock:
                spent[label] += dt - nested.pop()
            if nested:
                nested[-1] += dt
    return run


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("xyz", nargs="?", default=str(Path(__file__).resolve().parents[1] / "examples" / "benzene.xyz"))
    p.add_argument("--basis", default="cc-pvdz")
    p.add_argument("--backend", choices=("serial", "threads"), default="serial")
    p.add_argument("--iterations", type=int, default=8)
    p.add_argument("--tile", type=int, default=32)
    a = p.parse_args()
    if a.iterations < 4:
        p.error("--iterations must be at least 4 (the first two are not counted; the rest of an iteration is timed up to the next)")
    ref = rhf_reference(Molecule.from_xyz(a.xyz, basis=a.basis).to_pyscf())
    spent, rows, ended, stack, lock = Counter(), [], [], threading.local(), threading.Lock()
    # nested calls (a GEMM inside a scatter task) count in the inner one only
    for label, (module, names) in CATEGORIES.items():
        for name in names:
            setattr(module, name, _timed(getattr(module, name), label, spent, stack, lock))
    residual = ccsd_equations.residual

    def measured(*args, **kwargs):
        if ended:
            rows[-1]["rest of the iteration"] = time.thread_time() - ended[-1]
        spent.clear()
        w0, t0, c0 = time.perf_counter(), time.thread_time(), time.process_time()
        f0, flops0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, context.current_context().flops
        out = residual(*args, **kwargs)
        rows.append({"wall": time.perf_counter() - w0, "thread": time.thread_time() - t0,
                     "process": time.process_time() - c0, "flops": context.current_context().flops - flops0,
                     "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0, **spent})
        ended.append(time.thread_time())
        return out

    ccsd_equations.residual = measured
    with context.Context(a.backend) as ctx:
        ints = transform(ref, 0, a.tile)
        try:
            e_corr = CCSD(conv=1e-12, max_iter=a.iterations).kernel(ints, ctx).e_corr
        except ConvergenceError as err:       # not converged in --iterations: expected
            e_corr = err.result.e_corr
    kept = rows[2:]
    med = {k: float(np.median([r.get(k, 0.0) for r in kept])) for k in kept[0]}
    print(f"{Path(a.xyz).stem} {a.basis} {a.backend}: E_corr after {a.iterations} iterations {e_corr:.12f}; "
          f"load {uptime()}")
    print(f"per residual (median of {len(kept)}): wall {med['wall'] * 1e3:.1f} ms, calling thread CPU "
          f"{med['thread'] * 1e3:.1f} ms, process CPU {med['process'] * 1e3:.1f} ms, "
          f"{np.median([r['faults'] for r in kept]):.0f} minor page faults")
    counted = 0.0
    print(f"CPU time of the tasks by operation{'' if a.backend == 'serial' else ', summed over the threads'}:")
    for label in CATEGORIES:
        counted += med.get(label, 0.0)
        print(f"  {label:12s} {med.get(label, 0.0) * 1e3:7.1f} ms")
    if med.get("gemm"):
        print(f"  (GEMMs: {med['flops'] / 1e9:.1f} GFLOP at {med['flops'] / med['gemm'] / 1e9:.1f} GFLOP per CPU second)")
    if a.backend == "serial":
        print(f"  {'other':12s} {(med['thread'] - counted) * 1e3:7.1f} ms")
    else:
        workers = ctx.executor.workers
        idle = float(np.median([workers * r["wall"] - r["process"] for r in kept]))
        print(f"  {'not in tasks':12s} {(med['process'] - counted) * 1e3:7.1f} ms (the calling thread between tasks, BLAS's own threads)")
        print(f"  {workers} workers x wall - process CPU: {idle * 1e3:.1f} ms (workers not computing: waiting or preempted)")
    rest = [r["rest of the iteration"] for r in kept if "rest of the iteration" in r]
    print(f"rest of an iteration, calling thread CPU (median): {np.median(rest) * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
