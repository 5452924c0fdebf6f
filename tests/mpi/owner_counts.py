"""mpi-onesided's variant ``owner`` in a CCSD iteration under `mpiexec -n K`, step by step:
each rank's gets, puts and their bytes with other ranks, against the model
(``step_bytes.onesided_owner_counts``, ``owner_other_ops``, ``moved_bytes``) and the
totals the cost model prices (``iteration_counts.structure_stats(..., owner=True)``).

For the molecule and tile given (cc-pVDZ, RHF by PySCF on rank 0; TESSERA_PIECES as the
caller sets it) and the frozen cache keeping every frozen block (``all``) or none (``0``):
CCSD for three iterations, and per step of the third (a steady iteration: frozen blocks
kept since the first) each rank's get and put operations and bytes with other ranks from
the comm log (a rank's copy of its own piece of a block is a memory copy, no operation).
The run's steps are the structure's plans' steps from the first amplitude-dependent one
(the iteration's ``tau`` ends it), so they are matched as a rotation of the plans' steps.
Rank 0 prints one JSON object: per bound, per step (label, kind, counted[rank] and
model[rank] as [gets, puts, bytes]) and the totals (per step the busiest rank's, summed:
the model's unit), counted and from ``structure_stats``.
"""

import argparse
import json
from dataclasses import replace

import numpy as np

from tessera.backends import registry
from tessera.backends.context import Context
from tessera.backends.iteration_counts import structure_stats
from tessera.backends.onesided import OneSidedExecutor
from tessera.backends.step_bytes import moved_bytes, onesided_owner_counts, owner_other_ops, owner_step_moves
from tessera.chem.ccsd import CCSD, CCSDStructure
from tessera.chem.integrals import transform
from tessera.chem.molecule import Molecule
from tessera.chem.pyscf_reference import rhf_reference
from tessera.errors import ConvergenceError
from tessera.runtime import World

ITERATIONS = 3


def counted_run(world, ref, tile: int, keep_all: bool) -> list:
    """[(label, kind, [gets, puts, bytes] of each rank)] per step of iteration ``ITERATIONS``."""
    state = {"iteration": 1, "steps": []}
    run_step = OneSidedExecutor.run_step

    def counted(ex, step):
        snap = ex.world.comm_log.snapshot()
        run_step(ex, step)
        if state["iteration"] == ITERATIONS:
            row = [0, 0, 0]
            for r in ex.world.comm_log.records(since=snap):
                if r.op in ("get", "put") and r.peer != ex.world.rank:
                    row[r.op == "put"] += r.count
                    row[2] += r.nbytes
            state["steps"].append((step.label, step.kind, row))
    OneSidedExecutor.run_step = counted
    try:
        with Context("mpi-onesided", variant="owner") as ctx:
            if not keep_all:
                ctx.executor.frozen.limit = 0
            ints = transform(ref, 0, tile)
            try:
                CCSD(max_iter=ITERATIONS, progress=lambda row: state.update(iteration=row["iter"] + 1)).kernel(ints)
            except ConvergenceError:
                pass
    finally:
        OneSidedExecutor.run_step = run_step
    rows = world.allgather(state["steps"])
    return [(per[0][0], per[0][1], [r[2] for r in per]) for per in zip(*rows)]


def model_steps(steps, nranks: int, keep_all: bool) -> list:
    """[gets, puts, bytes] of each rank per step, as the model counts them (a frozen
    operand's gets none while its cache keeps every block)."""
    cache = {"least": registry.least_pieces()}
    out = []
    for step in steps:
        if step.kind == "contract":
            c = onesided_owner_counts(step, nranks, cache)
            rows = (c["gets"] - keep_all * c["frozen_gets"], c["puts"], c["bytes"] - keep_all * c["frozen_bytes"])
        elif step.kind in ("add", "hadamard"):
            rows = (*owner_other_ops(step, nranks, cache),
                    moved_bytes(owner_step_moves(step, nranks, cache), nranks, "owner"))
        else:
            rows = (np.zeros(nranks),) * 3
        out.append(np.array(rows).T.astype(int).tolist())
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("xyz")
    ap.add_argument("tile", type=int)
    args = ap.parse_args()
    world = World.get()
    mol = Molecule.from_xyz(args.xyz, basis="cc-pvdz").to_pyscf()
    ref = rhf_reference(mol) if world.rank == 0 else None
    ref = replace(world.bcast(None if ref is None else replace(ref, mol=None), root=0), mol=mol)
    structure = CCSDStructure(ref.orbsym, ref.nocc, 0, distributed=True)
    planned = [s for p in structure(args.tile, args.tile).plans for s in p.steps]
    ow = structure_stats(structure, args.tile, args.tile, world.size, owner=True)
    out = {}
    for bound, keep_all in (("all", True), ("0", False)):
        run = counted_run(world, ref, args.tile, keep_all)
        n = len(planned)
        shift = [k for k in range(n) if all((planned[(k + i) % n].label, planned[(k + i) % n].kind) == run[i][:2]
                                            for i in range(n))] if len(run) == n else []
        steps = planned[shift[0]:] + planned[:shift[0]] if shift else []
        model = model_steps(steps, world.size, keep_all)
        contract = ow["owner"]["thawed_ops" if keep_all else "ops"] + ow["owner"]["other_ops"]
        out[bound] = {
            "steps": [(label, kind, c, m) for (label, kind, c), m in zip(run, model)], "matched": bool(shift),
            "counted": {"ops": sum(max(g + p for g, p, _ in c) for _, _, c in run),
                        "bytes": sum(max(b for _, _, b in c) for _, _, c in run)},
            "structure_stats": {"ops": contract, "bytes": ow["owner"]["thawed_bytes" if keep_all else "bytes"]
                                + ow["owner_other_bytes"]}}
    if world.rank == 0:
        print(json.dumps(out), flush=True)
    world.stop()


if __name__ == "__main__":
    main()
