"""Streamed (T) with and without lookahead under `mpiexec -n K`, for tests/test_triples_mpi.py.

Water in 6-31G (C1, o = 5, v = 8, tile 2), CCSD amplitudes of ``--iters`` serial
iterations, then distributed (T) on mpi-onesided with the operands fetched by virtual
window (vblock 2, occ_tile 2, ``cache_mb`` 0.05) in ``--chunks`` stages: as the run does
(streamed tasks run with ``TaskSet.lookahead``: the next part's rows in flight during this
part's work), and with lookahead off (``TriplesTasks.task_set`` patched); beside the
unstreamed windowed run (chunks 1) and the serial one. Run it under
``TESSERA_EMULATE_NODES=2`` for two emulated nodes. Rank 0 prints energies, stages, the
bytes each rank read and its peak bytes held.
"""

import argparse
import json
from dataclasses import replace
from pathlib import Path

from tessera.backends.context import Context
from tessera.chem.ccsd import CCSD
from tessera.chem.integrals import transform
from tessera.chem.molecule import Molecule
from tessera.chem.pyscf_reference import rhf_reference
from tessera.chem.triples import triples_correction
from tessera.chem.triples_tasks import TriplesTasks
from tessera.errors import ConvergenceError
from tessera.runtime import World

WATER = Path(__file__).resolve().parents[2] / "examples" / "water.xyz"
TILE = 2


def amplitudes(ref, iters):
    with Context("serial") as ctx:
        ints = transform(ref, 0, TILE)
        try:
            cc = CCSD(conv=1e-14, max_iter=iters).kernel(ints, ctx)
        except ConvergenceError as err:
            cc = err.result
        e_serial = triples_correction(ints, cc.t1, cc.t2, context=ctx).energy
        return cc.t1.to_dense(), cc.t2.to_dense(), e_serial


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--chunks", type=int, default=3)
    args = p.parse_args()
    world = World.get()
    ref = rhf_reference(Molecule.from_xyz(str(WATER), basis="6-31g").to_pyscf())
    t1d, t2d, e_serial = amplitudes(ref, args.iters)
    from tessera import BlockTensor
    runs = {}
    plain_set = TriplesTasks.task_set
    for name, chunks, ahead in (("ahead", args.chunks, True), ("plain", args.chunks, False), ("windowed", 1, False)):
        TriplesTasks.task_set = plain_set if ahead else (lambda self, n: replace(plain_set(self, n), lookahead=False))
        ctx = Context("mpi-onesided", variant="cached", schedule="steal")
        try:
            with ctx:
                ints = transform(ref, 0, TILE)
                t1 = BlockTensor.from_dense(t1d, (ints.o, ints.v), name="t1")
                t2 = BlockTensor.from_dense(t2d, (ints.o, ints.o, ints.v, ints.v), name="t2")
                res = triples_correction(ints, t1, t2, context=ctx, occ_tile=2, vblock=2, cache_mb=0.05,
                                         chunks=chunks)
        finally:
            ctx.close()
            TriplesTasks.task_set = plain_set
        runs[name] = {"e_t": res.energy, "stages": res.stages, "tasks": res.tasks,
                      "read_bytes": list(res.rank_read_bytes), "peak_operand_bytes": list(res.rank_peak_operand_bytes)}
    if world.rank == 0:
        print(json.dumps({"nranks": world.size, "nodes": world.nnodes, "e_serial": e_serial, "runs": runs}),
              flush=True)


if __name__ == "__main__":
    main()
