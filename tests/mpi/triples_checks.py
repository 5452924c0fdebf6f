"""Distributed (T) under `mpiexec -n K` against the serial kernel on the same amplitudes.

For each molecule (H2O2 distorted to C1 in 6-31G with a tile of 16, so the occupied
space (9) and the virtual space (13) are one tensor tile each and every four-index
tensor is a single block; water in C2v, 6-31G, tile 4) rank 0 runs the RHF reference
and a few serial CCSD iterations (not converged: any amplitudes will do) and the serial
``triples_correction`` on them, and broadcasts t1, t2 and that energy. Then, for each
executor (mpi-onesided with nxtval and with steal, mpi-collective), the transform runs
in that context, t1 and t2 become distributed tensors (from the same dense arrays) and
``triples_correction`` runs on them with the default occ_tile, with occ_tile 4, and with
occ_tile 4 and the kernel blocked in the virtual index (vblock 3: the operands are then
fetched by virtual tile, chem.triples_window); H2O2 also with tile 4, vblock 7 and windows
narrower than a tile on mpi-onesided and mpi-collective (``window_run``: the rows each
rank's windowed tasks read, the runs of tasks each ran), and once more on mpi-onesided
with the last rank slowed down (each task takes it five times as long, SLOW seconds
more at least) so that the others steal from it (at SLOW_RANKS only).
Rank 0 prints one JSON object: per run the energies, the peak bytes of (T) operands per
rank, the largest share of each source tensor a rank held, the whole tensors' bytes and
the bytes moved by one-sided gets during (T). The windowed runs again with the contracted
indices streamed in STREAM_CHUNKS chunks (``streamed``, at STREAMED_RANKS), and once more with
no chunks given and a budget under which unstreamed one-orbital windows would be two
orbitals wide, STREAM_CACHE_MB, where the budget rule streams them (``budget_streamed``, at BUDGET_RANKS).
Each of these three runs only at the rank counts whose test checks it
(tests/test_triples_mpi.py parametrizes by the same tuples).
tests/test_triples_mpi.py checks them.
"""

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
from tessera.chem.triples_stream import StreamTripleKernel
from tessera.errors import ConvergenceError
from tessera.runtime import World

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
MOLECULES = {            # name -> (xyz, basis, MO tile)
    "h2o2_c1": ("h2o2_distorted.xyz", "6-31g", 16),
    "water_c2v": ("water.xyz", "6-31g", 4),
}
WINDOW_TILE = 4          # h2o2_c1 again, operands fetched by virtual tile (window_run)
WINDOW_COMBOS = [("mpi-onesided", "cached"), ("mpi-collective", "summa")]    # patches by get, by exchange
COMBOS = [("mpi-onesided", "cached", "nxtval"), ("mpi-onesided", "cached", "steal"),
          ("mpi-collective", "summa", None)]
STREAM_CACHE_MB = 0.1     # window_run again, no chunks given: a budget (104.9 kB) of unstreamed windows 2 orbitals wide
STREAM_CHUNKS = 3        # window_run again, the contracted f and m fetched in 3 chunks (chem.triples_stream)
SLOW = 0.005             # the slow-rank run: the last rank sleeps at least this long (s) per windowed task
SLOW_RANKS = (2, 4)      # rank counts that run the slow-rank run (stealing needs 2+ ranks)
STREAMED_RANKS = (1, 2)  # rank counts that run the streamed runs
BUDGET_RANKS = (2,)      # rank counts that run the budget-streamed run (165 one-orbital tasks x 9 stages)
RUNS = {"None": {}, "4": {"occ_tile": 4},               # default and given occ_tile
        "4/vblock3": {"occ_tile": 4, "vblock": 3}}        # the kernel blocked in the virtual index too


def serial_reference(world, name, iters):
    """(ref, t1, t2 dense, {occ_tile: E(T)}), computed on rank 0 and broadcast."""
    xyz, basis, tile = MOLECULES[name]
    mol = Molecule.from_xyz(str(EXAMPLES / xyz), basis=basis).to_pyscf()
    out = None
    if world.rank == 0:
        ref = rhf_reference(mol)
        with Context("serial") as ctx:
            ints = transform(ref, 0, tile)
            try:
                cc = CCSD(conv=1e-14, max_iter=iters).kernel(ints, ctx)
            except ConvergenceError as err:
                cc = err.result
            e_t = {key: triples_correction(ints, cc.t1, cc.t2, context=ctx, **opts).energy
                   for key, opts in RUNS.items()}
            out = (replace(ref, mol=None), cc.t1.to_dense(), cc.t2.to_dense(), e_t,
                   ints.o.dim, ints.v.dim, len(ints.o.tiles))
        ctx.close()
    ref, t1, t2, e_t, nocc, nvir, otiles = world.bcast(out, root=0)
    return replace(ref, mol=mol), t1, t2, e_t, {"nocc": nocc, "nvir": nvir, "occ_tensor_tiles": otiles}


def one_run(world, ref, tile, t1d, t2d, backend, variant, schedule):
    opts = {"variant": variant} if schedule is None else {"variant": variant, "schedule": schedule}
    ctx = Context(backend, **opts)
    runs = {}
    try:
        with ctx:
            ints = transform(ref, 0, tile)
            t1 = BlockTensor.from_dense(t1d, (ints.o, ints.v), name="t1")
            t2 = BlockTensor.from_dense(t2d, (ints.o, ints.o, ints.v, ints.v), name="t2")
            for key, run_opts in RUNS.items():
                snap = world.comm_log.snapshot()
                res = triples_correction(ints, t1, t2, context=ctx, **run_opts)
                gets = sum(r.nbytes for r in world.comm_log.records(since=snap) if r.op == "get")
                runs[key] = {"e_t": res.energy, "task_tile": res.task_tile, "tasks": res.tasks,
                                 "peak_operand_bytes": list(res.rank_peak_operand_bytes),
                                 "peak_share": res.peak_share, "whole_bytes": res.whole_bytes,
                                 "kernel_buffer_bytes": res.kernel_buffer_bytes,
                                 "virtual_block": res.virtual_block,
                                 "get_bytes": int(world.allreduce(gets, "sum"))}
    finally:
        ctx.close()
    return runs


def window_run(world, ref, t1d, t2d, backend, variant, slow: float = 0.0, chunks=None, cache_mb=0.8, occ_tile=4):
    """H2O2 (C1) with tile 4 (occupied tiles 3 3 3, virtual 4 3 3 3), occ_tile 4, vblock 7, and
    cache_mb 0.8 (windows 3 orbitals wide: the first virtual tile cut into 2 2 and fetched
    by patch, the others whole; T2 kept as canonical blocks, so half its rows are patches of
    alias blocks): the operands fetched by virtual window; E(T), the rows
    each rank's tasks read, the bytes one-sided gets moved, tiles. (vblock 7 cuts the 13 virtuals into two blocks, the
    windows into five: the kernel's buffers follow the windows' blocks.) ``slow``: the last
    rank (of 2+) sleeps after each task's kernel 4 times its wall time, at least ``slow``
    seconds, so the others run out first."""
    ctx = Context(backend, variant=variant)
    try:
        with ctx:
            ints = transform(ref, 0, WINDOW_TILE)
            t1 = BlockTensor.from_dense(t1d, (ints.o, ints.v), name="t1")
            # canonical blocks only, as CCSD keeps T2: half the rows come as patches of aliases
            t2 = BlockTensor.from_dense(t2d, (ints.o, ints.o, ints.v, ints.v), name="t2",
                                        symmetry=T2_SYMMETRY, canonical=True)
            snap = world.comm_log.snapshot()
            kernel, own = StreamTripleKernel.tile_energy, "tile_energy" in StreamTripleKernel.__dict__
            slowed = slow and world.size > 1 and world.rank == world.size - 1
            if slowed:                  # a task takes 5 times its kernel's wall time, at least ``slow``
                def tile_energy(self, *a):
                    t0 = time.perf_counter()
                    out = kernel(self, *a)
                    time.sleep(max(slow, 4 * (time.perf_counter() - t0)))
                    return out
                StreamTripleKernel.tile_energy = tile_energy
            try:
                res = triples_correction(ints, t1, t2, context=ctx, occ_tile=occ_tile, vblock=7, cache_mb=cache_mb,
                                         chunks=chunks)
            finally:
                if slowed and own:
                    StreamTripleKernel.tile_energy = kernel
                elif slowed:
                    del StreamTripleKernel.tile_energy
            gets = sum(r.nbytes for r in world.comm_log.records(since=snap) if r.op == "get")
            tiles = {"o": [t.size for t in ints.o.tiles], "v": [t.size for t in ints.v.tiles]}
    finally:
        ctx.close()
    return {"e_t": res.energy, "tasks": res.tasks, "stages": res.stages, "task_tile": res.task_tile,
            "read_bytes": list(res.rank_read_bytes), "tiles": tiles,
            "runs": [list(map(list, r)) for r in res.rank_runs], "stolen": list(res.rank_stolen),
            "peak_operand_bytes": list(res.rank_peak_operand_bytes), "whole_bytes": res.whole_bytes,
            "get_bytes": int(world.allreduce(gets, "sum"))}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--iters", type=int, default=2, help="serial CCSD iterations for the amplitudes")
    p.add_argument("--molecules", default=",".join(MOLECULES))
    args = p.parse_args()
    world = World.get()
    t_start = time.perf_counter()
    out = {}
    for name in args.molecules.split(","):
        ref, t1, t2, e_ref, dims = serial_reference(world, name, args.iters)
        out[name] = {"e_serial": e_ref, **dims, "runs": {}}
        for backend, variant, schedule in COMBOS:
            out[name]["runs"][f"{backend}/{schedule}"] = one_run(world, ref, MOLECULES[name][2], t1, t2,
                                                                 backend, variant, schedule)
        if name == "h2o2_c1":
            out[name]["windows"] = {b: window_run(world, ref, t1, t2, b, v) for b, v in WINDOW_COMBOS}
            if world.size in SLOW_RANKS:
                out[name]["slow_rank"] = window_run(world, ref, t1, t2, "mpi-onesided", "cached", slow=SLOW)
            if world.size in STREAMED_RANKS:
                out[name]["streamed"] = {b: window_run(world, ref, t1, t2, b, v, chunks=STREAM_CHUNKS)
                                         for b, v in WINDOW_COMBOS}
            if world.size in BUDGET_RANKS:
                out[name]["budget_streamed"] = window_run(world, ref, t1, t2, "mpi-onesided", "cached",
                                                          cache_mb=STREAM_CACHE_MB, occ_tile=None)
    if world.rank == 0:
        print(json.dumps({"nranks": world.size, "molecules": out,
                          "seconds": time.perf_counter() - t_start}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
