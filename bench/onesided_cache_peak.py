"""The bytes mpi-onesided's per-step block cache holds at its peak (``cached``, ``owner``),
measured on every rank, against the cost model's estimate (``memory_parts``' working set:
``max_step_rank_bytes``, a rank's share of a step's product reads, at most the step's
distinct blocks, and the frozen cache's ``frozen_share`` for the schedule, which the
model bounds by the cache).

    mpiexec -n 2 python bench/onesided_cache_peak.py examples/water.xyz --tile 24 \
        [--iterations 2] [--schedule nxtval|steal]

cc-pVDZ, RHF by PySCF on rank 0, ``--iterations`` CCSD iterations per variant. The peak is taken over
every ``BlockCache`` the executor makes (one per contraction step) and the executor's
``FrozenCache``; rank 0 prints per variant the busiest rank's peaks and the model's terms.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))


def main(argv=None) -> None:
    from tessera.backends import distributed
    from tessera.backends.context import Context
    from tessera.backends.cost_model import frozen_share
    from tessera.backends.iteration_counts import structure_stats
    from tessera.chem.ccsd import CCSD, CCSDStructure
    from tessera.chem.integrals import transform
    from tessera.chem.molecule import Molecule
    from tessera.chem.pyscf_reference import rhf_reference
    from tessera.errors import ConvergenceError
    from tessera.runtime import World
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("xyz")
    ap.add_argument("--tile", type=int, default=24)
    ap.add_argument("--iterations", type=int, default=2)
    ap.add_argument("--schedule", default="nxtval", choices=("nxtval", "steal"))
    args = ap.parse_args(argv)
    world = World.get()
    mol = Molecule.from_xyz(args.xyz, basis="cc-pvdz").to_pyscf()
    ref = rhf_reference(mol) if world.rank == 0 else None
    ref = replace(world.bcast(None if ref is None else replace(ref, mol=None), root=0), mol=mol)
    s = structure_stats(CCSDStructure(ref.orbsym, ref.nocc, 0, distributed=True), args.tile, args.tile, world.size)
    peak = {"step": 0, "frozen": 0}
    put, keep = distributed.BlockCache.put, distributed.FrozenCache.put

    def counted(cache, key, blk):
        put(cache, key, blk)
        peak["step"] = max(peak["step"], cache.bytes)

    def kept(cache, *args):
        done = keep(cache, *args)
        peak["frozen"] = max(peak["frozen"], cache.bytes)
        return done
    distributed.BlockCache.put, distributed.FrozenCache.put = counted, kept
    out = {"ranks": world.size, "tile": args.tile, "schedule": args.schedule, "iterations": args.iterations,
           "model_step_rank_bytes": s["max_step_rank_bytes"], "model_frozen_bytes": frozen_share(s, world.size, args.schedule)}
    for variant in ("cached", "owner"):
        peak.update(step=0, frozen=0)
        with Context("mpi-onesided", variant=variant, schedule=args.schedule):
            ints = transform(ref, 0, args.tile)
            try:
                CCSD(max_iter=args.iterations).kernel(ints)
            except ConvergenceError:
                pass
        rows = world.allgather(dict(peak))
        out[variant] = {"step_cache_peak": max(r["step"] for r in rows), "frozen_cache": max(r["frozen"] for r in rows)}
    if world.rank == 0:
        print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
