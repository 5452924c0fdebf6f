"""The arrays a distributed CCSD really holds at its peak, against the memory estimate.

Under `mpiexec -n K` (or singleton): the RHF of a molecule, its transform and CCSD on
mpi-onesided. At every DIIS update after the first (the peak of an iteration: every
intermediate's global array is in the storage's pool, and the driver's packed amplitude
vectors are alive) each rank sums the bytes of its global arrays (``TensorStore.by_eid``:
in use or pooled) and of the packed vectors alive: the last vector, the new one and the
error passed to ``DIIS.update``, the weights, and what the update allocates beyond them
(tracemalloc's peak inside it; ``diis.CHUNK`` made small, as the history's read buffers
are beside vectors of a real size). Rank 0 prints each rank's bytes at its peak update
and ``memory_parts``' ``stored`` and ``held`` (with the structure's parts) for the same
structure and ranks.
"""

import argparse
import json
import tracemalloc
from pathlib import Path

import tessera.chem.diis as diis_module
from tessera.backends.context import Context
from tessera.backends.cost_model import memory_parts
from tessera.backends.iteration_counts import structure_stats
from tessera.chem.ccsd import CCSD, CCSDStructure
from tessera.chem.integrals import transform
from tessera.chem.molecule import Molecule
from tessera.chem.pyscf_reference import rhf_reference
from tessera.errors import ConvergenceError
from tessera.runtime import World

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--xyz", default="water.xyz")
    ap.add_argument("--basis", default="6-31g")
    ap.add_argument("--tile", type=int, default=3)
    args = ap.parse_args()
    world = World.get()
    ref = rhf_reference(Molecule.from_xyz(str(EXAMPLES / args.xyz), basis=args.basis).to_pyscf()) \
        if world.rank == 0 else None
    ref = world.bcast(ref)
    ctx = Context("mpi-onesided", variant="original")
    store = ctx.executor.store
    updates = []
    update = diis_module.DIIS.update
    diis_module.CHUNK = 16

    def measured_update(self, vector, error):
        arrays = sum(ga.nbytes_local() for ga in store.by_eid.values())
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        out = update(self, vector, error)
        inside = tracemalloc.get_traced_memory()[1] - before
        updates.append({"arrays": arrays, "vector": vector.nbytes, "inside": inside, "weight": self.weight.nbytes})
        return out

    diis_module.DIIS.update = measured_update
    tracemalloc.start()
    with ctx:
        ints = transform(ref, 0, args.tile)
        try:
            CCSD(conv=1e-14, max_iter=3).kernel(ints, ctx)
        except ConvergenceError:
            pass
    tracemalloc.stop()
    peak = max(updates[1:], key=lambda u: u["arrays"] + u["inside"])
    peaks = world.allgather(peak)
    if world.rank == 0:
        structure = CCSDStructure(ref.orbsym, ref.nocc, 0, distributed=True)
        s = structure_stats(structure, args.tile, args.tile, world.size, block_tasks=False)
        parts = memory_parts(s, world.size, "mpi-onesided", "original")
        print(json.dumps({"ranks": world.size, "peaks": peaks, "stored": parts["stored"], "held": parts["held"],
                          "held_parts": s["held"], "pooled_bytes": s["pooled_bytes"]}), flush=True)

if __name__ == "__main__":
    main()
