"""What one rank builds to place a CCSD run's stored tensors on P ranks (no MPI, no SCF).

    .venv/bin/python bench/placement_build.py [--case example|waters16] [--ranks 64,256,1024]
                                              [--tile 48] [--rank 5] [--json FILE]

For every stored class of a run (``CCSDStructure.stored``: the integral classes, T2 and
the T2-sized intermediates, each in the placement a one-sided run gives it), the rank
builds its ``runtime.placement.block_placement`` and what a GlobalArray takes from it
for its own memory: its element count, its own keys, and for a class stored in pieces
its own pieces and the keys it computes (home keys). Reported per rank count: CPU
seconds of that build (``time.process_time``), its tracemalloc peak and what stays
allocated afterwards (the placements), and the CPU seconds of then locating every
stored block's pieces (the most a rank can touch; each key is located once per
structure and kept). Cases: ``example``,
the issue's C1 example (100 occupied, 800 virtual); ``waters16``, (H2O)16 cc-pVDZ (C1,
80 occupied, 304 virtual). BEFORE/AFTER: run it with ``PYTHONPATH`` set to each
checkout's ``src``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import tracemalloc

import numpy as np

from tessera.chem.ccsd import CCSDStructure
from tessera.runtime.placement import block_placement
from tessera.tensor.block_tensor import symmetry_group

CASES = {"example": (900, 100), "waters16": (16 * 24, 16 * 5)}


def build(tensors, nranks: int, me: int) -> dict:
    """What rank ``me`` builds for every class: {name: (placement, its own parts)}."""
    kept = {}
    for name, t in tensors.items():
        group = symmetry_group(t.symmetry, t.ndim) if t.canonical else ()
        pl = block_placement(t.spaces, t.irrep, group, nranks, t.placement)
        mine = [pl.elements(me), pl.local_keys(me)]
        if hasattr(pl, "pieces_of"):
            mine += [pl.local_pieces(me), pl.home_keys(me)]
        kept[name] = (pl, mine)
    return kept


def touch_all(kept, tensors) -> float:
    """CPU seconds of locating every stored key's data (``pieces_of`` or ``locate``): a
    rank that touches every block of every class, the most it can ask."""
    t0 = time.process_time()
    for name, (pl, _) in kept.items():
        for k in tensors[name].stored_keys():
            pl.pieces_of(k) if hasattr(pl, "pieces_of") else pl.locate(k)
    return time.process_time() - t0


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", default="example", choices=sorted(CASES))
    ap.add_argument("--ranks", default="64,256,1024")
    ap.add_argument("--tile", type=int, default=48)
    ap.add_argument("--rank", type=int, default=5, help="the rank whose build is measured")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    nmo, nocc = CASES[args.case]
    structure = CCSDStructure(np.zeros(nmo, dtype=int), nocc, distributed=True)
    tensors = structure.stored(args.tile, args.tile)
    rows = []
    print(f"{args.case}: o={nocc} v={nmo - nocc} tile {args.tile}, rank {args.rank}'s placements of "
          f"{len(tensors)} classes ({sum(len(t.stored_keys()) for t in tensors.values())} stored blocks)")
    print(f"{'ranks':>6s} {'cut':>24s} {'CPU s':>8s} {'peak MiB':>9s} {'kept MiB':>9s} {'touch-all s':>11s}")
    for P in [int(x) for x in args.ranks.split(",")]:
        me = args.rank % P
        t0 = time.process_time()
        kept = build(tensors, P, me)
        cpu = time.process_time() - t0
        del kept
        tracemalloc.start()
        kept = build(tensors, P, me)
        now, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        touch = touch_all(kept, tensors)
        cut = {n: pl.k for n, (pl, _) in kept.items() if getattr(pl, "k", 1) > 1}
        rows.append({"ranks": P, "cpu_seconds": cpu, "peak_bytes": peak, "kept_bytes": now,
                     "touch_all_seconds": touch, "pieces_per_block": cut})
        print(f"{P:6d} {' '.join(f'{n}:{k}' for n, k in cut.items()) or '-':>24s} {cpu:8.3f} "
              f"{peak / 2**20:9.2f} {now / 2**20:9.2f} {touch:11.3f}")
        del kept
    print(f"(load average {os.getloadavg()[0]:.2f})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"case": args.case, "tile": args.tile, "rank": args.rank, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
