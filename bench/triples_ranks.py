"""Benchmark: windowed (T) on K ranks: rows each rank reads, its tasks, the (T) wall time.

    mpiexec -n 2 .venv/bin/python bench/triples_ranks.py examples/water_trimer.xyz --basis 6-31g \
        --vblock 4 --cache-mb 2

Rank 0 runs the RHF reference and a few serial CCSD iterations (any amplitudes will do:
the work of (T) does not depend on their values) and broadcasts them; then the MO
integrals and amplitudes become distributed tensors of mpi-onesided and
``triples_correction`` runs with the kernel blocked in the virtual index (``--vblock``)
and the bytes one task may hold (``--cache-mb``), which makes it fetch its operands by
virtual window (``chem.triples_window``). Printed and written as JSON (``--json``): per
rank the bytes its tasks read, the seconds its tasks' work took (``task_seconds``, fetches
not included), the tasks it ran and of those the ones taken from another rank's queue
(``TriplesResult.rank_stolen``), the runs of consecutive tasks it ran; E(T), the (T) wall
time, the load average. No assertions. A diagnostic of the deal (who ran what, who read
what), not a comparison: no other code runs windowed (T) to set beside it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

from tessera import BlockTensor
from tessera.backends.context import Context
from tessera.chem.ccsd import CCSD
from tessera.chem.ccsd_equations import T2_SYMMETRY
from tessera.chem.integrals import transform
from tessera.chem.molecule import Molecule
from tessera.chem.pyscf_reference import rhf_reference
from tessera.chem.triples import triples_correction
from tessera.errors import ConvergenceError
from tessera.runtime import World

sys.path.insert(0, str(Path(__file__).parent))
from common import uptime  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("xyz")
    p.add_argument("--basis", default="6-31g")
    p.add_argument("--tile", type=int, default=8, help="MO tile")
    p.add_argument("--vblock", type=int, default=4)
    p.add_argument("--cache-mb", type=float, default=2.0, help="bytes one windowed task may hold (MiB)")
    p.add_argument("--iters", type=int, default=2, help="serial CCSD iterations for the amplitudes")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    world = World.get()
    mol = Molecule.from_xyz(args.xyz, basis=args.basis).to_pyscf()
    out = None
    if world.rank == 0:
        ref = rhf_reference(mol)
        with Context("serial") as ctx:
            ints = transform(ref, 0, args.tile)
            try:
                cc = CCSD(conv=1e-14, max_iter=args.iters).kernel(ints, ctx)
            except ConvergenceError as err:
                cc = err.result
            out = (replace(ref, mol=None), cc.t1.to_dense(), cc.t2.to_dense())
        ctx.close()
    ref, t1d, t2d = world.bcast(out, root=0)
    ref = replace(ref, mol=mol)
    ctx = Context("mpi-onesided", variant="cached")
    try:
        with ctx:
            ints = transform(ref, 0, args.tile)
            t1 = BlockTensor.from_dense(t1d, (ints.o, ints.v), name="t1")
            t2 = BlockTensor.from_dense(t2d, (ints.o, ints.o, ints.v, ints.v), name="t2",
                                        symmetry=T2_SYMMETRY, canonical=True)
            world.barrier()
            t0, c0 = time.perf_counter(), ctx.executor.compute_seconds
            res = triples_correction(ints, t1, t2, context=ctx, vblock=args.vblock, cache_mb=args.cache_mb)
            seconds = time.perf_counter() - t0
            busy = ctx.ranks.allgather(ctx.executor.compute_seconds - c0)
    finally:
        ctx.close()
    if world.rank == 0:
        out = {"molecule": args.xyz, "basis": args.basis, "ranks": world.size, "e_t": res.energy,
               "tasks": res.tasks, "task_tile": res.task_tile, "seconds": seconds,
               "read_mib": [r / 2**20 for r in res.rank_read_bytes], "task_seconds": busy,
               "tasks_per_rank": [sum(b - a for a, b in runs) for runs in res.rank_runs],
               "stolen": list(res.rank_stolen), "runs": [len(r) for r in res.rank_runs], "load": uptime()}
        print(json.dumps(out, indent=1))
        if args.json:
            Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    sys.exit(main())
