"""Streamed (T) with and without ``TaskSet.lookahead`` on mpi-onesided (the next part's rows in
flight during this part's work, or fetched when the part starts), alternated in one job.

    .venv/bin/mpiexec -n 2 .venv/bin/python bench/triples_lookahead.py [--repeat 2]
    TESSERA_EMULATE_NODES=2 MPIR_CVAR_NOLOCAL=1 .venv/bin/mpiexec -n 4 .venv/bin/python bench/triples_lookahead.py

Water cc-pVDZ (C1 orbitals of C2v water: o = 5, v = 19), CCSD amplitudes of 3 serial
iterations, then distributed (T) at tile 4, occ_tile 2, vblock 4, cache_mb 0.3, chunks 3,
schedule steal, run on then off, ``--repeat`` times (A B A B). Rank 0 prints per run E(T),
tasks, stages, the wall of ``triples_correction``, the CPU seconds of all ranks and the peak
bytes a rank held; then the best wall of each, their ratio and the machine's load (uptime).
"""
import argparse
import os
import subprocess
import sys
import time
from dataclasses import replace

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from common import blas_coretype  # noqa: E402

blas_coretype()
from pathlib import Path

from tessera import BlockTensor
from tessera.backends.context import Context
from tessera.chem.ccsd import CCSD
from tessera.chem.integrals import transform
from tessera.chem.molecule import Molecule
from tessera.chem.pyscf_reference import rhf_reference
from tessera.chem.triples import triples_correction
from tessera.chem.triples_tasks import TriplesTasks
from tessera.errors import ConvergenceError
from tessera.runtime import World
ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--repeat", type=int, default=2, help="runs of each, alternated (default 2)")
args = ap.parse_args()
world = World.get()
ref = rhf_reference(Molecule.from_xyz(str(Path(__file__).resolve().parents[1] / "examples" / "water.xyz"), basis="cc-pvdz").to_pyscf())
with Context("serial") as ctx:
    ints = transform(ref, 0, 4)
    try:
        cc = CCSD(conv=1e-14, max_iter=3).kernel(ints, ctx)
    except ConvergenceError as err:
        cc = err.result
    t1d, t2d = cc.t1.to_dense(), cc.t2.to_dense()


def run(ahead: bool) -> tuple:
    """(result, wall, CPU seconds of all ranks) of one distributed (T), lookahead on or off."""
    def made(self, nranks):              # TriplesTasks' own task set, its lookahead kept only when on
        tasks = task_set(self, nranks)
        return replace(tasks, lookahead=tasks.lookahead and ahead)
    TriplesTasks.task_set = made
    ctx = Context("mpi-onesided", variant="cached", schedule="steal")
    with ctx:
        ints = transform(ref, 0, 4)
        t1 = BlockTensor.from_dense(t1d, (ints.o, ints.v), name="t1")
        t2 = BlockTensor.from_dense(t2d, (ints.o, ints.o, ints.v, ints.v), name="t2")
        world.barrier()
        t0, c0 = time.perf_counter(), time.process_time()
        res = triples_correction(ints, t1, t2, context=ctx, occ_tile=2, vblock=4, cache_mb=0.3, chunks=3)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    ctx.close()
    return res, wall, float(world.allreduce(np.array([cpu]), "sum")[0])


task_set = TriplesTasks.task_set
best = {}
for rep in range(args.repeat):
    for ahead in (True, False):
        res, wall, cpu = run(ahead)
        name = "on" if ahead else "off"
        best[name] = min(best.get(name, wall), wall)
        if world.rank == 0:
            print(f"lookahead {name}: E(T) {res.energy:.12f} tasks {res.tasks} stages {res.stages} wall {wall:.2f} s "
                  f"cpu {cpu:.2f} s peak {max(res.rank_peak_operand_bytes)} B", flush=True)
if world.rank == 0:
    print(f"best of {args.repeat}: on {best['on']:.2f} s, off {best['off']:.2f} s, on/off {best['on'] / best['off']:.3f}; "
          f"ranks {world.size}, load {os.getloadavg()[0]:.2f} ({subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()})",
          flush=True)
