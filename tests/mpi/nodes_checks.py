"""Multi-node paths on one machine: run under `TESSERA_EMULATE_NODES=2` (and MPICH's
`MPIR_CVAR_NOLOCAL=1`), `mpiexec -n 4`.

Reports the World's view of its nodes (node of every worker, the progress mode auto chose
or the one asked), which ranks a GlobalArray reads by direct copy (only ranks of the
same emulated node may be mapped), and, for water in STO-3G with one orbital per tile,
CCSD for ``--iters`` iterations plus (T) on every executor and one-sided loop order
given by ``--combos``: energies, gets, accumulates, the bytes that crossed emulated
nodes (one-sided operations to a rank on another node) and the counter operations (all,
and those on another node's counter), summed over ranks. Rank 0
prints one JSON object; tests/test_nodes_mpi.py compares it with the serial backend.
"""

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from tessera.backends.context import Context
from tessera.chem.ccsd import CCSD
from tessera.chem.integrals import transform
from tessera.chem.molecule import Molecule
from tessera.chem.pyscf_reference import rhf_reference
from tessera.chem.triples import triples_correction
from tessera.errors import ConvergenceError
from tessera.runtime import GlobalArray, TaskCounter, World

WATER = Path(__file__).resolve().parents[2] / "examples" / "water.xyz"
TILE = 1


def offnode(world, records, ops=("get", "acc", "put", "fetch_add")) -> list:
    return [r for r in records if r.op in ops and 0 <= r.peer < world.size
            and world.node_of[r.peer] != world.node_of[world.rank]]


def one_run(world, ref, backend, variant, schedule, iters):
    opts = {"variant": variant} if schedule == "None" else {"variant": variant, "schedule": schedule}
    ctx = Context(backend, **opts)
    snap = world.comm_log.snapshot()
    try:
        with ctx:
            ints = transform(ref, 0, TILE)
            try:
                cc = CCSD(conv=1e-14, max_iter=iters).kernel(ints, ctx)
            except ConvergenceError as err:
                cc = err.result
            tr = triples_correction(ints, cc.t1, cc.t2, context=ctx)
            windowed = triples_correction(ints, cc.t1, cc.t2, context=ctx, vblock=1)   # operands by virtual tile
            comm = ctx.executor.account.summary()
    finally:
        ctx.close()
    records = world.comm_log.records(since=snap)
    out = {"e_ccsd": cc.e_corr, "e_t": tr.energy, "e_t_windowed": windowed.energy,
           "read_bytes": list(windowed.rank_read_bytes), "iterations": len(cc.iterations),
           "offnode_bytes": world.allreduce(sum(r.nbytes for r in offnode(world, records)), "sum"),
           "counter_ops": world.allreduce(sum(r.count for r in records if r.op == "fetch_add"), "sum"),
           "offnode_counter_ops": world.allreduce(sum(r.count for r in offnode(world, records, ("fetch_add",))),
                                                  "sum")}
    if comm is not None:            # rank 0: the terms' operations summed over ranks
        contract = [r for r in comm["per_term"] if not r["update"].startswith(("(T)", "transform:"))]
        out.update(gets=sum(r["gets"] for r in contract), accs=sum(r["accs"] for r in contract))
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--iters", type=int, default=2)
    p.add_argument("--combos", default="mpi-onesided/cached/nxtval")
    args = p.parse_args()
    world = World.get()
    ga = GlobalArray([[2] * world.size], keys=[(r,) for r in range(world.size)],
                     owners={(r,): r for r in range(world.size)}, name="probe")
    counter = TaskCounter("global", world=world, name="probe")
    ghost_ranks = set(range(world.full_size)) - set(world.workers.allgather(world.full_rank))
    view = {"direct_ranks": ga.direct_ranks, "counter_on_ghost": counter._targets[0] in ghost_ranks}
    ga.free()
    counter.free()
    mol = Molecule.from_xyz(str(WATER), basis="sto-3g").to_pyscf()
    ref = rhf_reference(mol) if world.rank == 0 else None
    ref = replace(world.bcast(None if ref is None else replace(ref, mol=None), root=0), mol=mol)
    runs = {"hf": ref.e_hf}
    for combo in args.combos.split(","):
        runs[combo] = one_run(world, ref, *combo.split("/"), args.iters)
    views = world.gather(view)
    if world.rank == 0:
        print(json.dumps({"workers": world.size, "describe": world.describe(), "node_of": world.node_of,
                          "views": views, "runs": runs}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
