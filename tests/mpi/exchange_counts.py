"""mpi-collective's exchanges in a CCSD iteration under `mpiexec -n K`, step by step,
against the cost model's count (``collective_model.collective_traffic``).

For each molecule and tile given (``--case xyz:tile``, cc-pVDZ, RHF by PySCF on rank 0) and
each variant (summa, 2.5d; contraction modes by cost, so the grid and the stationary modes
a, b, c all run): CCSD for three iterations, each rank's all-to-alls (``alltoallv``) and
grid broadcasts (``bcast_row``, ``bcast_col``) counted per step of the third (a steady
iteration: the frozen operands kept since the first) from the comm log, with the mode of
each contraction. Rank 0 prints one JSON object: per case and variant the busiest rank's
counts per step summed over the steps of the structure's plans (the model's unit: each
step ends when its busiest rank does; the amplitude updates t1 = R1 / D1, t2 = R2 / D2
included), the contraction modes,
and the model's all-to-alls, broadcasts and modes for the same orbitals, tiles and ranks;
and (``empty``) a sum and a Hadamard product with no block to compute (the output has no
allowed block): the all-to-alls each rank makes, and the model's.
"""

import argparse
import json
from collections import Counter
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np

import tessera as ts
from tessera import BlockTensor, IndexSpace

from tessera.backends.collective import CollectiveExecutor
from tessera.backends.context import Context, PlanningContext
from tessera.chem.ccsd import CCSD, CCSDStructure
from tessera.chem.integrals import transform
from tessera.chem.molecule import Molecule
from tessera.chem.pyscf_reference import rhf_reference
from tessera.errors import ConvergenceError
from tessera.runtime import World

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
GRID_OPS = ("bcast_row", "bcast_col")
ITERATIONS = 3


class Recorder:
    """Wraps ``CollectiveExecutor.run_step`` and ``_mode``: per step of iteration
    ``ITERATIONS`` (label, kind, all-to-alls, broadcasts, contraction mode)."""

    def __init__(self):
        self.iteration, self.steps, self.mode = 1, [], None
        run_step, mode = CollectiveExecutor.run_step, CollectiveExecutor._mode
        rec = self

        def counted(ex, step):
            snap = ex.world.comm_log.snapshot()
            rec.mode = None
            run_step(ex, step)
            if rec.iteration == ITERATIONS:
                tot = ex.world.comm_log.totals(since=snap)
                rec.steps.append((step.label, step.kind, tot["alltoallv"].count if "alltoallv" in tot else 0,
                                  sum(tot[op].count for op in GRID_OPS if op in tot), rec.mode))

        def chosen(ex, step, sig):
            got = mode(ex, step, sig)
            rec.mode = got[0]
            return got
        CollectiveExecutor.run_step, CollectiveExecutor._mode = counted, chosen

    def progress(self, row) -> None:
        self.iteration = row["iter"] + 1


def counted_run(world, ref, tile: int, variant: str) -> dict:
    rec = Recorder()
    with Context("mpi-collective", variant=variant):
        ints = transform(ref, 0, tile)
        try:
            CCSD(max_iter=ITERATIONS, progress=rec.progress).kernel(ints)
        except ConvergenceError:
            pass
    rows = world.allgather(rec.steps)
    assert all(len(r) == len(rows[0]) for r in rows)
    out = {"alltoallv": 0, "broadcasts": 0, "modes": Counter(), "steps": len(rows[0])}
    for per_rank in zip(*rows):
        kind = per_rank[0][1]
        a2a, bc = max(r[2] for r in per_rank), max(r[3] for r in per_rank)
        out["alltoallv"] += a2a
        out["broadcasts"] += bc
        if kind == "contract":
            out["modes"][per_rank[0][4]] += 1
    return out


def model(ref, tile: int, nranks: int, variant: str) -> dict:
    from tessera.backends.collective_model import collective_traffic
    from tessera.backends.iteration_counts import structure_stats
    structure = CCSDStructure(ref.orbsym, ref.nocc, 0, distributed=True)
    tr = collective_traffic(structure_stats(structure, tile, tile, nranks), nranks, variant)
    return {"alltoallv": tr["exchanges"] - tr["broadcasts"] + tr["other_exchanges"], "broadcasts": tr["broadcasts"],
            "modes": tr["modes"]}


def empty_steps(world) -> dict:
    """Y[ia] += X[ia] and Y[ia] += X[ia] Z[ia] with o of irrep 0 and v of irrep 1 (no
    allowed block of irrep 0): per equation the all-to-alls each rank makes, and the
    model's (every rank decides from the structure alone whether to exchange)."""
    from tessera.backends.collective_model import collective_traffic
    from tessera.backends.iteration_counts import structure_stats
    o = IndexSpace.from_irreps("o", np.zeros(4, dtype=int), 2)
    v = IndexSpace.from_irreps("v", np.ones(3, dtype=int), 2)
    out = {}
    for name in ("add", "hadamard"):
        def run(context):
            with context:
                t = {n: BlockTensor((o, v), 0, name=n) for n in "XYZ"}
                snap = world.comm_log.snapshot()
                with ts.equations():
                    t["Y"]["ia"] += t["X"]["ia"] * t["Z"]["ia"] if name == "hadamard" else t["X"]["ia"]
                return world.comm_log.totals(since=snap)
        ops = run(Context("mpi-collective", variant="summa"))
        planned = PlanningContext()
        run(planned)
        structure = SimpleNamespace(plans=planned.plans, tensors=[], tiles={})
        tr = collective_traffic(structure_stats(lambda *_: structure, 0, 0, world.size), world.size, "summa")
        out[name] = {"kinds": [st.kind for p in planned.plans for st in p.steps],
                     "counted": world.allgather(ops["alltoallv"].count if "alltoallv" in ops else 0),
                     "model": tr["exchanges"] + tr["other_exchanges"]}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", action="append", required=True, help="xyz:tile")
    args = ap.parse_args()
    world = World.get()
    out = {}
    for case in args.case:
        xyz, tile = case.split(":")
        mol = Molecule.from_xyz(str(EXAMPLES / xyz), basis="cc-pvdz").to_pyscf()
        ref = rhf_reference(mol) if world.rank == 0 else None
        ref = replace(world.bcast(None if ref is None else replace(ref, mol=None), root=0), mol=mol)
        for variant in ("summa", "2.5d"):
            out[f"{case}/{variant}"] = {"counted": counted_run(world, ref, int(tile), variant),
                                        "model": model(ref, int(tile), world.size, variant)}
    out["empty"] = empty_steps(world)
    if world.rank == 0:
        print(json.dumps(out), flush=True)
    world.stop()


if __name__ == "__main__":
    main()
