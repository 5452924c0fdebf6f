"""Streamed (T) with and without ``TaskSet.lookahead`` on mpi-onesided (the next part's rows in
flight during this part's work, or fetched when the part starts).

    /usr/bin/time -f '%U user %e wall' .venv/bin/mpiexec -n 2 .venv/bin/python bench/triples_lookahead.py on
    /usr/bin/time -f '%U user %e wall' .venv/bin/mpiexec -n 2 .venv/bin/python bench/triples_lookahead.py off

Water cc-pVDZ (C1 orbitals of C2v water: o = 5, v = 19), CCSD amplitudes of 3 serial
iterations, then distributed (T) at tile 4, occ_tile 2, vblock 4, cache_mb 0.3, chunks 3,
schedule steal. Rank 0 prints E(T), tasks, stages, the wall of ``triples_correction`` and the
peak bytes a rank held. Alternate on and off (A B A B) and keep the best of each.
"""
import sys
import time
from dataclasses import replace

sys.path.insert(0, __import__("os").path.dirname(__file__))
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
world = World.get()
ref = rhf_reference(Molecule.from_xyz(str(Path(__file__).resolve().parents[1] / "examples" / "water.xyz"), basis="cc-pvdz").to_pyscf())
with Context("serial") as ctx:
    ints = transform(ref, 0, 4)
    try:
        cc = CCSD(conv=1e-14, max_iter=3).kernel(ints, ctx)
    except ConvergenceError as err:
        cc = err.result
    t1d, t2d = cc.t1.to_dense(), cc.t2.to_dense()
if sys.argv[1] == "off":
    base = TriplesTasks.task_set
    TriplesTasks.task_set = lambda self, n: replace(base(self, n), lookahead=False)
ctx = Context("mpi-onesided", variant="cached", schedule="steal")
with ctx:
    ints = transform(ref, 0, 4)
    t1 = BlockTensor.from_dense(t1d, (ints.o, ints.v), name="t1")
    t2 = BlockTensor.from_dense(t2d, (ints.o, ints.o, ints.v, ints.v), name="t2")
    world.barrier()
    t0 = time.perf_counter()
    res = triples_correction(ints, t1, t2, context=ctx, occ_tile=2, vblock=4, cache_mb=0.3, chunks=3)
    wall = time.perf_counter() - t0
ctx.close()
if world.rank == 0:
    print(f"lookahead {sys.argv[1]}: E(T) {res.energy:.12f} tasks {res.tasks} stages {res.stages} wall {wall:.2f} s "
          f"peak {max(res.rank_peak_operand_bytes)} B", flush=True)
