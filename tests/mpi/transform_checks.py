"""Distributed AO->MO transform under `mpiexec -n K` against PySCF's and the local one.

For each case (molecule, basis, frozen core, tile, slab size, backend) the RHF reference
is computed on rank 0 and broadcast; every rank runs the transform of that reference on
local tensors (small molecules: cheap) and checks it against PySCF's ``ao2mo.full``,
then runs it inside a distributed context and compares each block it owns with the
local block (every block has one owner, for a block stored in pieces its home, so the
blocks compared over all ranks are all blocks). Rank 0 prints one JSON object with, per
case: the largest difference from PySCF (local) and from the local blocks (distributed),
blocks compared and expected, each rank's transform
counts (AO integrals computed, AO-pair columns, bytes of half-transformed rows held),
the one-sided operations the transform issued (summed over ranks), whether any of its
temporary arrays is still alive, and the largest share of a class tensor one rank holds.
tests/test_transform_mpi.py checks them.
"""

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
from pyscf import ao2mo

from tessera.backends.context import Context
from tessera.chem.integrals import transform
from tessera.chem.molecule import Molecule
from tessera.chem.pyscf_reference import rhf_reference
from tessera.runtime import World

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
MOLECULES = {"water": ("water.xyz", "6-31g"),              # C2v
             "h2o2_c1": ("h2o2_distorted.xyz", "6-31g")}   # C1
# (molecule, frozen core, tile, slab_bytes or None, backend); small slabs force several
# AO units per rank and several flushes of the half-transformed chunk
CASES = [
    ("water", 0, 3, None, "mpi-onesided"),
    ("water", 1, 2, 4096, "mpi-onesided"),
    ("h2o2_c1", 0, 4, 4096, "mpi-onesided"),
    ("h2o2_c1", 2, 5, None, "mpi-collective"),
]


def case_name(case) -> str:
    mol, nfz, tile, slab, backend = case
    return f"{mol}/fc{nfz}/tile{tile}/slab{slab}/{backend}"


def reference(world, name):
    xyz, basis = MOLECULES[name]
    mol = Molecule.from_xyz(str(EXAMPLES / xyz), basis=basis).to_pyscf()
    ref = rhf_reference(mol) if world.rank == 0 else None
    shared = world.bcast(None if ref is None else replace(ref, mol=None), root=0)
    return replace(shared, mol=mol)


def one_case(world, ref, case) -> dict:
    _, nfz, tile, slab, backend = case
    serial = transform(ref, nfz, tile)
    coeff = ref.mo_coeff[:, nfz:]
    eri = ao2mo.restore(1, ao2mo.full(ref.mol, coeff), coeff.shape[1])
    nocc = ref.nocc - nfz
    index = {"o": np.arange(nocc), "v": nocc + np.arange(serial.v.dim)}
    err_pyscf = max(float(np.abs(t.to_dense() - eri[np.ix_(*(index[ch] for ch in name))]).max())
                    for name, t in serial.tensors.items())
    ctx = Context(backend)
    try:
        with ctx:
            snap = world.comm_log.snapshot()
            t0 = time.perf_counter()
            ints = transform(ref, nfz, tile, slab_bytes=slab)
            seconds = time.perf_counter() - t0
            ops = {}
            for r in world.comm_log.records(since=snap):
                if r.op in ("get", "put", "acc"):
                    ops[r.op] = ops.get(r.op, 0) + r.count
                    ops[r.op + "_bytes"] = ops.get(r.op + "_bytes", 0) + r.nbytes
            err, compared = 0.0, 0
            for name, t in ints.tensors.items():
                ref_t = serial.tensors[name]
                assert t.dist is not None
                # canonical blocks and their alias views; of a class stored in pieces, those
                # whose home is this rank, read whole (get_block)
                keys = [k for k in t.allowed_keys() if t.dist.owner(k) == world.rank] if t.dist.pieced \
                    else t.local_keys()
                for key in keys:
                    err = max(err, float(np.abs(t.get_block(key) - ref_t.blocks[key]).max()))
                    compared += 1
            share = max(t.local_nbytes / t.nbytes for t in ints.tensors.values())
            leftover = sum(1 for a in world._live.values() if str(getattr(a, "name", "")).startswith("half-"))
            stats = world.allgather(ints.transform_stats)
            out = {
                "max_error": world.allreduce(err, "max"),
                "max_error_local_vs_pyscf": err_pyscf,
                "blocks_compared": world.allreduce(compared, "sum"),
                "blocks_expected": sum(len(t.allowed_keys()) for t in serial.tensors.values()),
                "stats": stats,
                "onesided_ops": {op: world.allreduce(ops.get(op, 0), "sum")
                                 for op in ("get", "put", "acc", "get_bytes", "put_bytes", "acc_bytes")},
                "half_arrays_alive": world.allreduce(leftover, "sum"),
                "largest_share": world.allreduce(share, "max"),
                "seconds": world.allreduce(seconds, "max"),
            }
    finally:
        ctx.close()
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--cases", default="all", help="comma-separated case indices, or 'all'")
    args = p.parse_args()
    world = World.get()
    cases = CASES if args.cases == "all" else [CASES[int(i)] for i in args.cases.split(",")]
    refs, results = {}, {}
    t_start = time.perf_counter()
    for case in cases:
        if case[0] not in refs:
            refs[case[0]] = reference(world, case[0])
        results[case_name(case)] = one_case(world, refs[case[0]], case)
    if world.rank == 0:
        print(json.dumps({"nranks": world.size, "cases": results,
                          "seconds": time.perf_counter() - t_start}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
