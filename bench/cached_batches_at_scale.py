"""What one rank builds to deal ``mpi-onesided cached``'s batches of a CCSD iteration, on
many simulated ranks (no MPI).

    PYTHONPATH=src .venv/bin/python bench/cached_batches_at_scale.py [--waters 16] [--tile 32]
                                                 [--ranks 64,256,1024] [--repeat 2] [--json FILE]

BEFORE/AFTER: run it with ``PYTHONPATH`` on an older checkout's ``src`` (``git archive
<commit> src | tar -x -C /tmp/old``): sources with ``backends.cached_batches`` build the
step's ``IndexedTasks`` and the batches from the tasks' sizes (``indexed_batches``), older
ones every task with its products (``contraction_tasks``) and the batches from them
(``onesided.cached_batches``), as their executors do.

For water clusters (H2O)n in cc-pVDZ (C1), one CCSD iteration is planned as a distributed
run plans it at tile ``--tile``; per rank count P, every contraction step's task list,
batches (cache bound: the executor's default, the operand with more stored bytes shared
by a batch) and cost array are built as one rank of ``cached`` builds them, kept for
every step as the executor keeps them: process CPU seconds (best of ``--repeat``) and the
tracemalloc peak (a separate pass: tracemalloc slows Python), and the batches made.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import tracemalloc

import numpy as np

from tessera.chem.ccsd import CCSDStructure
from tessera.plan import blocktasks

NBAS_WATER = 24      # cc-pVDZ functions of one water
CACHE_BYTES = 512 << 20      # the executors' default cache (no memory budget given)

try:                                  # sources that count canonical storage
    from tessera.backends.iteration_counts import stored_bytes
except ImportError:                   # older ones: every allowed block
    from tessera.tensor.block_tensor import allowed_elements

    def stored_bytes(t) -> int:
        return 8 * allowed_elements(t.spaces, t.irrep)

try:                                  # these sources: batches from the tasks' sizes
    from tessera.backends.cached_batches import indexed_batches

    def build(step, by_row: bool, bound: int, nranks: int) -> tuple:
        tasks = blocktasks.indexed_tasks(step)
        batches = indexed_batches(tasks, by_row, bound, nranks)
        return tasks, batches, batches.flops + 1.0
except ImportError:                   # older sources: every task's products on every rank
    from tessera.backends.onesided import batch_flops, cached_batches

    def build(step, by_row: bool, bound: int, nranks: int) -> tuple:
        tasks = blocktasks.contraction_tasks(step)
        batches = cached_batches(tasks, by_row, bound, nranks)
        return tasks, batches, np.asarray([batch_flops(tasks, b) + 1 for b in batches], dtype=float)


def clear_caches() -> None:
    """Task lists are cached per layout: each measurement starts without them."""
    for name in ("_tasks", "_indexed", "_indexed_groups"):
        if hasattr(blocktasks, name):
            getattr(blocktasks, name).cache_clear()


def build_all(steps, nranks: int, bound: int) -> list:
    return [build(step, by_row, bound, nranks) for step, by_row in steps]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--waters", default="16")
    ap.add_argument("--tile", type=int, default=32)
    ap.add_argument("--ranks", default="64,256,1024")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    bound = CACHE_BYTES
    out = {"load": os.getloadavg(), "tile": args.tile, "bound": bound, "cases": []}
    print(f"load {os.getloadavg()[0]:.1f}; sources: {'sizes' if 'indexed_batches' in globals() else 'products'}")
    for n in (int(x) for x in args.waters.split(",")):
        structure = CCSDStructure(np.zeros(NBAS_WATER * n, dtype=int), 5 * n, 0, distributed=True)
        steps = [(s, stored_bytes(s.inputs[0].tensor) >= stored_bytes(s.inputs[1].tensor))
                 for plan in structure(args.tile, args.tile).plans for s in plan.steps
                 if s.kind == "contract" and s.sectors]
        for nranks in (int(x) for x in args.ranks.split(",")):
            best = float("inf")
            for _ in range(args.repeat):
                clear_caches()
                t0 = time.process_time()
                kept = build_all(steps, nranks, bound)
                best = min(best, time.process_time() - t0)
                del kept
            clear_caches()
            tracemalloc.start()
            kept = build_all(steps, nranks, bound)
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            row = {"waters": n, "ranks": nranks, "steps": len(steps), "cpu_seconds": best, "peak_bytes": peak,
                   "tasks": sum(len(t) for t, _, _ in kept), "batches": sum(len(b) for _, b, _ in kept)}
            del kept
            out["cases"].append(row)
            print(f"(H2O){n} P={nranks}: {row['steps']} steps, {row['tasks']} tasks, {row['batches']} batches: "
                  f"{best:.2f} s CPU, peak {peak / 2**20:.1f} MiB")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
