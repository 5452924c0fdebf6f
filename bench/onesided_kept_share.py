"""How much of its frozen blocks mpi-onesided's ``owner`` keeps across CCSD iterations,
counted, against the cost model's ``kept_share``.

    mpiexec -n 2 python bench/onesided_kept_share.py examples/water.xyz --tile 24

cc-pVDZ, RHF by PySCF on rank 0. The model's frozen bytes per rank (``structure_stats(...,
owner=True)``'s ``frozen_per_rank``, the most of any rank) set the executor's frozen-cache
bounds (0, 1/4, 1/2, 3/4, 1 and 2 times them); per bound, CCSD runs three iterations and the
third's gets and puts of contraction steps with other ranks are counted from the comm log
(per step the busiest rank's, summed: the model's unit; a rank's copy of its own piece of a
block is no operation). Rank 0 prints, per bound, the counted operations
and bytes, the share of the frozen ones kept (those the bound-0 run makes and this one does
not, over those the unbounded run saves), and the model's operations, bytes and
``kept_share``.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
BOUNDS = (0.0, 0.25, 0.5, 0.75, 1.0, 2.0)      # times the model's frozen bytes per rank


def main(argv=None) -> None:
    from tessera.backends.context import Context
    from tessera.backends.cost_model import kept_share
    from tessera.backends.iteration_counts import structure_stats
    from tessera.backends.onesided import OneSidedExecutor
    from tessera.chem.ccsd import CCSD, CCSDStructure
    from tessera.chem.integrals import transform
    from tessera.chem.molecule import Molecule
    from tessera.chem.pyscf_reference import rhf_reference
    from tessera.errors import ConvergenceError
    from tessera.runtime import World
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("xyz")
    ap.add_argument("--tile", type=int, default=24)
    args = ap.parse_args(argv)
    world = World.get()
    mol = Molecule.from_xyz(args.xyz, basis="cc-pvdz").to_pyscf()
    ref = rhf_reference(mol) if world.rank == 0 else None
    ref = replace(world.bcast(None if ref is None else replace(ref, mol=None), root=0), mol=mol)
    ow = structure_stats(CCSDStructure(ref.orbsym, ref.nocc, 0, distributed=True), args.tile, args.tile,
                         world.size, owner=True)["owner"]
    frozen = float(ow["frozen_per_rank"].max(initial=0))
    state = {"iteration": 1, "steps": []}
    run_step = OneSidedExecutor.run_step

    def counted(ex, step):
        snap = ex.world.comm_log.snapshot()
        run_step(ex, step)
        if state["iteration"] == 3 and step.kind == "contract":
            ops = [r for r in ex.world.comm_log.records(since=snap)
                   if r.op in ("get", "put") and r.peer != ex.world.rank]
            state["steps"].append((sum(r.count for r in ops), sum(r.nbytes for r in ops)))
    OneSidedExecutor.run_step = counted
    runs = {}
    for bound in BOUNDS:
        state.update(iteration=1, steps=[])
        with Context("mpi-onesided", variant="owner") as ctx:
            ctx.executor.frozen.limit = int(bound * frozen)
            ints = transform(ref, 0, args.tile)
            try:
                CCSD(max_iter=3, progress=lambda row: state.update(iteration=row["iter"] + 1)).kernel(ints)
            except ConvergenceError:
                pass
        rows = world.allgather(state["steps"])
        runs[bound] = [sum(max(r[i][x] for r in rows) for i in range(len(rows[0]))) for x in (0, 1)]
    if world.rank == 0:
        (ops0, bytes0), (ops_all, bytes_all) = runs[BOUNDS[0]], runs[BOUNDS[-1]]
        out = {"frozen_bytes_per_rank": frozen, "model_frozen_ops": ow["ops"] - ow["thawed_ops"],
               "counted_frozen_ops": ops0 - ops_all, "bounds": {}}
        for bound, (ops, nbytes) in runs.items():
            k = kept_share(frozen, int(bound * frozen))
            out["bounds"][bound] = {
                "counted_ops": ops, "counted_bytes": nbytes,
                "counted_kept_ops": round((ops0 - ops) / max(ops0 - ops_all, 1), 3),
                "counted_kept_bytes": round((bytes0 - nbytes) / max(bytes0 - bytes_all, 1), 3),
                "model_kept_share": round(k, 3), "model_ops": ow["ops"] - k * (ow["ops"] - ow["thawed_ops"]),
                "model_bytes": ow["bytes"] - k * (ow["bytes"] - ow["thawed_bytes"])}
        print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
