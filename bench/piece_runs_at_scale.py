"""What one rank computes to move blocks stored in pieces on P ranks (no MPI, no SCF).

    .venv/bin/python bench/piece_runs_at_scale.py [--case waters4|waters16] [--ranks 256,1024]
                                                  [--tile 16] [--ranks-measured 3] [--json FILE]

``mpi-collective``'s exchanges list every item of a step on every rank; for an item of a
tensor stored in pieces each rank asks ``GlobalArray.piece_runs`` where the part's
elements lie (``exchange``: all of them at the destination, its own runs elsewhere). For
every stored class of a CCSD run that is cut in pieces on P ranks (``CCSDStructure.stored``,
placed as a run places them), the items here are every stored block whole and its two
halves along the first axis (2.5D's layer parts), each sent to a rank chosen from its
position. Reported per rank count: the CPU seconds (``time.process_time``) of one rank's
``piece_runs`` calls for all items, the mean over the measured ranks. The array is a
stand-in with the placement and the block shapes (``piece_runs`` reads no MPI state), so
BEFORE/AFTER: run it with ``PYTHONPATH`` set to each checkout's ``src`` (a ``piece_runs``
without ``rank`` is called as the old ``exchange`` called it: all runs on every rank).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import time
from types import SimpleNamespace

import numpy as np

from tessera.chem.ccsd import CCSDStructure
from tessera.runtime.global_array import GlobalArray
from tessera.runtime.placement import PiecedPlacement, block_placement
from tessera.tensor.block_tensor import symmetry_group

CASES = {"waters4": (4 * 24, 4 * 5), "waters16": (16 * 24, 16 * 5)}


def stand_in(t, pl) -> SimpleNamespace:
    """What ``GlobalArray.piece_runs`` reads of an array: its placement, block shapes, aliases."""
    return SimpleNamespace(aliases={}, _place=pl, layout=SimpleNamespace(block_shape=t.block_shape),
                           _slot=lambda key: (None, None, None, t.block_shape(key)))


def items(t) -> list:
    """(key, part) of every stored block: whole, and its halves along the first axis."""
    out = []
    for key in t.stored_keys():
        n = t.block_shape(key)[0]
        out += [(key, None)] + ([(key, (0, 0, n // 2)), (key, (0, n // 2, n))] if n > 1 else [])
    return out


def rank_seconds(ga, work, me: int, nranks: int, by_rank: bool) -> float:
    """CPU seconds of rank ``me``'s ``piece_runs`` calls for ``work`` (destination: the
    item's number mod P)."""
    t0 = time.process_time()
    for n, (key, part) in enumerate(work):
        if by_rank and n % nranks != me:
            GlobalArray.piece_runs(ga, key, part, me)
        else:
            GlobalArray.piece_runs(ga, key, part)
    return time.process_time() - t0


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", default="waters4", choices=sorted(CASES))
    ap.add_argument("--ranks", default="256,1024")
    ap.add_argument("--tile", type=int, default=16)
    ap.add_argument("--ranks-measured", type=int, default=3)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    by_rank = "rank" in inspect.signature(GlobalArray.piece_runs).parameters
    nmo, nocc = CASES[args.case]
    tensors = CCSDStructure(np.zeros(nmo, dtype=int), nocc, distributed=True).stored(args.tile, args.tile)
    rows = []
    print(f"{args.case}: o={nocc} v={nmo - nocc} tile {args.tile}; piece_runs {'per rank' if by_rank else 'all runs'}")
    print(f"{'ranks':>6s} {'cut (pieces per block)':>30s} {'items':>7s} {'CPU s per rank':>15s}")
    for P in [int(x) for x in args.ranks.split(",")]:
        ranks = np.linspace(0, P - 1, args.ranks_measured).astype(int).tolist()
        seconds = []
        for me in ranks:            # each rank with placements of its own (their caches its own)
            cut, work = {}, []
            for name, t in tensors.items():
                group = symmetry_group(t.symmetry, t.ndim) if t.canonical else ()
                pl = block_placement(t.spaces, t.irrep, group, P, t.placement)
                if isinstance(pl, PiecedPlacement):
                    cut[name] = pl.k
                    work.append((stand_in(t, pl), items(t)))
            seconds.append(sum(rank_seconds(ga, w, me, P, by_rank) for ga, w in work))
        rows.append({"ranks": P, "pieces_per_block": cut, "items": sum(len(w) for _, w in work),
                     "seconds_per_rank": float(np.mean(seconds)), "measured_ranks": ranks})
        print(f"{P:6d} {' '.join(f'{n}:{k}' for n, k in cut.items()) or '-':>30s} {rows[-1]['items']:7d} "
              f"{rows[-1]['seconds_per_rank']:15.3f}")
    print(f"(load average {os.getloadavg()[0]:.2f})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"case": args.case, "tile": args.tile, "per_rank": by_rank, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
