"""What one rank builds to deal a CCSD iteration's tasks on many simulated ranks (no MPI).

    .venv/bin/python bench/schedule_at_scale.py [--waters 8,16] [--ranks 64,256,1024] [--iterations 2]
                                                [--json bench/results/schedule_at_scale.json] [--src DIR]

BEFORE/AFTER: run it on these sources and with ``--src`` on an older checkout's ``src``
(``git archive <commit> src | tar -x -C /tmp/old`` then ``--src /tmp/old/src``).

For water clusters (H2O)n in cc-pVDZ (C1), one CCSD iteration is planned with the tiles
``tessera plan --ranks P`` chooses (``backends.balance.balanced_tiles``), and the
contraction steps' tasks are dealt as ``mpi-onesided``'s original variant deals them (cost
= flops + 1, a new cost list per step and iteration) by rank 0 of a
``backends.schedule.Scheduler`` on P simulated ranks (counters are not touched: only the
deal's set-up is timed, what the rank builds before it claims a task). Per schedule
(static and steal with the largest-first partition; nxtval with the largest-first order)
and iteration: the seconds of set-up summed over the steps, the task ids the rank listed
in Python lists (its own queue, other ranks' queues, a global order) and those it keeps
in NumPy arrays.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, os.environ.get("TESSERA_BENCH_SRC", str(REPO / "src")))

from tessera.backends.balance import balanced_tiles  # noqa: E402
from tessera.backends.schedule import Scheduler  # noqa: E402
from tessera.chem.ccsd import CCSDStructure  # noqa: E402
from tessera.plan.blocktasks import contraction_tasks  # noqa: E402

NBAS_WATER = 24      # cc-pVDZ functions of one water
SCHEDULES = [("static", "largest_first", "index"), ("steal", "largest_first", "index"), ("nxtval", "largest_first", "cost")]


def listed(deal) -> tuple:
    """(task ids the deal listed on this rank in Python lists: its own queue, other ranks'
    queues, a global order; task ids it holds in NumPy arrays)."""
    share = getattr(deal, "share", None)
    if share is not None:                                        # these sources: a Share
        flat = getattr(share, "flat", None)
        return sum(len(q) for q in share._queues.values()), 0 if flat is None else len(flat)
    queues = getattr(deal, "queues", None)                       # older sources: every queue
    if queues:
        return sum(len(q) for q in queues), 0
    order = getattr(deal, "order", None)
    if isinstance(order, np.ndarray):
        return 0, len(order)
    return (len(order), 0) if isinstance(order, list) else (len(deal.own), 0)


def deal_costs(costs_of_steps, nranks: int, schedule: str, how: str, order: str, iterations: int) -> list:
    """Per iteration: seconds, task ids listed (Python) and held (NumPy) of rank 0's deals of
    every step."""
    world = SimpleNamespace(rank=0, size=nranks, barrier=lambda: None, node_of=None,
                            options=SimpleNamespace(progress="none"))
    sched = Scheduler(world, schedule, make_counter=lambda kind: None)
    out = []
    for _ in range(iterations):
        seconds, ids, arrays = 0.0, 0, 0
        for costs in costs_of_steps:
            fresh = list(costs)                                  # a new cost list per step and iteration
            t0 = time.perf_counter()
            d = sched.deal(fresh, 1, how, order=order)
            seconds += time.perf_counter() - t0
            got = listed(d)
            ids, arrays = ids + got[0], arrays + got[1]
            sched.synced()
        out.append({"seconds": seconds, "ids_listed": ids, "ids_in_arrays": arrays})
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--waters", default="8,16")
    ap.add_argument("--ranks", default="64,256,1024")
    ap.add_argument("--iterations", type=int, default=2)
    ap.add_argument("--json", default=str(REPO / "bench" / "results" / "schedule_at_scale.json"))
    ap.add_argument("--src", default=None, help="import Tessera from this src folder (an older checkout's, "
                    "for the BEFORE numbers): the script runs itself again with it")
    args = ap.parse_args(argv)
    if args.src:
        import subprocess
        rest = list(argv if argv is not None else sys.argv[1:])
        i = rest.index("--src")
        del rest[i:i + 2]
        env = dict(os.environ, TESSERA_BENCH_SRC=args.src)
        raise SystemExit(subprocess.call([sys.executable, __file__, *rest], env=env))
    result = {"load": os.getloadavg()[0], "clusters": {}}
    print(f"{'cluster':>9s} {'ranks':>5s} {'tiles':>6s} {'tasks':>7s} {'schedule':>8s} "
          + " ".join(f"{'it' + str(k + 1) + ' s':>8s} {'listed':>8s} {'arrays':>8s}" for k in range(args.iterations)))
    for n in [int(x) for x in args.waters.split(",") if x]:
        structure = CCSDStructure(np.zeros(NBAS_WATER * n, dtype=int), 5 * n, distributed=True)
        rows = {}
        for P in [int(x) for x in args.ranks.split(",")]:
            tile, occ_tile = balanced_tiles(structure.stored, P)[:2]
            iteration = structure(tile, occ_tile)
            steps = [s for plan in iteration.plans for s in plan.steps if s.kind == "contract"]
            costs = [[t.flops + 1 for t in contraction_tasks(s)] for s in steps]
            ntasks = sum(map(len, costs))
            rows[P] = {"tiles": [tile, occ_tile], "tasks": ntasks}
            for schedule, how, order in SCHEDULES:
                its = deal_costs(costs, P, schedule, how, order, args.iterations)
                rows[P][schedule] = its
                print(f"{'(H2O)' + str(n):>9s} {P:5d} {tile:3d}/{occ_tile:<2d} {ntasks:7d} {schedule:>8s} "
                      + " ".join(f"{it['seconds']:8.3f} {it['ids_listed']:8d} {it['ids_in_arrays']:8d}" for it in its))
        result["clusters"][f"(H2O){n}"] = rows
    print(f"(load average {result['load']:.2f}; seconds: rank 0's deal set-up summed over the iteration's "
          "contraction steps; listed: task ids in Python lists, arrays: task ids in NumPy arrays it keeps)")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
