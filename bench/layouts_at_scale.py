"""Per-rank memory and bytes of a CCSD iteration on many simulated ranks (no MPI, no SCF).

    .venv/bin/python bench/layouts_at_scale.py [--waters 8,16] [--ranks 64,256,1024] [--tile 32|auto|run]
                                               [--memory-per-rank 8] [--json bench/results/layouts_at_scale.json] [--src DIR]

BEFORE/AFTER: run it on these sources and with ``--src`` on an older checkout's ``src``
(e.g. ``git archive <commit> src | tar -x -C /tmp/old`` then ``--src /tmp/old/src``).

For water clusters (H2O)n in cc-pVDZ (C1, geometries built deterministically), every
stored tensor class (T2 and the integral classes) is placed over P ranks with Tessera's
own placement code (``backends.balance.loads``: what ``TensorStore`` stores, the
integral classes in pieces where they have too few blocks),
and the per-rank bytes of each class are summed: max, mean and max/mean per class.
(T) per rank: the rows and kernel buffers it holds beside them, its tasks and the
bytes of rows they read (``chem.memory.triples_parts``, ``chem.triples_plan.plan_counts``),
beside what the same budget's tasks by whole occupied rows would read (``row_plan``).
The bytes each rank moves per CCSD iteration come from the cost model
(``backends.iteration_counts.structure_stats`` and ``cost_model.estimate``) for each executor and variant, and
its memory per rank (``memory_parts``: the stored classes of the fullest rank, what the
driver holds, the executor's working set); the
block tasks per rank of the dominant contraction steps and their busiest rank's flops
over the mean from ``cli.plan_ranks.dominant_steps`` (as ``tessera plan --ranks``).
Also, at each rank count, the Python time and memory (tracemalloc peak) of what one
rank builds for the issue's example (C1, 100 occupied, 800 virtual, tile 48): the
owners and own slots of every class, and the owner-computes variant's task lists of one
planned CCSD iteration (``layout_cost``); and the example's per-class max/mean at each
rank count, at tile 48 and at the tiles of a run's rule with ``--memory-per-rank``
(``backends.balance.run_tiles``: the candidate ``backends.auto.decide`` always costs;
where they balance every class, decide takes only candidates that do, when one meets
every condition). ``--tile auto``: the water clusters at the tiles ``tessera plan
--ranks`` shows (every class balanced); ``--tile run``: at the run rule's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, os.environ.get("TESSERA_BENCH_SRC", str(REPO / "src")))

try:               # the cost model in its own modules (older checkouts, --src: in backends.auto)
    from tessera.backends.cost_model import estimate, memory_parts  # noqa: E402
    from tessera.backends.iteration_counts import structure_stats  # noqa: E402
except ImportError:
    from tessera.backends.auto import estimate, memory_parts, structure_stats  # noqa: E402
from tessera.chem.ccsd import CCSDStructure  # noqa: E402
from tessera.chem.integrals import CLASSES, class_tensor, make_spaces  # noqa: E402
from tessera.cli.plan_ranks import dominant_steps  # noqa: E402
from tessera.runtime.distribution import block_owners  # noqa: E402
from tessera.tensor.block_tensor import BlockTensor  # noqa: E402

EXECUTORS = [("mpi-onesided", "original"), ("mpi-onesided", "inverted"), ("mpi-onesided", "cached"),
             ("mpi-collective", "summa"), ("mpi-collective", "2.5d")]
NBAS_WATER = 24      # cc-pVDZ functions of one water


def class_tensors(orbsym, nocc, tile, occ_tile=None):
    """{class: empty tensor} of what a run stores at these tiles (T2 as canonical blocks;
    older sources without ``CCSDStructure.stored``: every T2 block)."""
    structure = CCSDStructure(orbsym, nocc, distributed=True)
    if hasattr(structure, "stored"):
        return structure.stored(tile, occ_tile)
    o, v = make_spaces(orbsym, nocc, 0, tile, occ_tile)
    out = {"t2": BlockTensor((o, o, v, v), 0, name="t2")}
    out.update({name: class_tensor(name, o, v) for name in CLASSES})
    return out


def per_rank(tensors, nranks) -> dict:
    """{class: {max_bytes, mean_bytes, max_over_mean}} and the total (``balance.loads``
    where the sources have it: an integral class in pieces as mpi-onesided stores it)."""
    try:
        from tessera.backends.balance import loads
    except ImportError:                                  # an older checkout (--src)
        loads = None
    out, total = {}, np.zeros(nranks)
    for name, t in tensors.items():
        if loads is not None:
            load = loads(t, nranks)
        else:
            load = np.zeros(nranks)
            for k, r in block_owners(t.spaces, t.irrep, t.stored_keys(), nranks, t.placement).items():
                load[r] += 8 * int(np.prod(t.block_shape(k)))
        total += load
        out[name] = _stats(load)
    out["total"] = _stats(total)
    return out


def _stats(load) -> dict:
    mean = float(load.mean())
    return {"max_bytes": int(load.max()), "mean_bytes": mean,
            "max_over_mean": float(load.max() / mean) if mean else 1.0}


def triples_per_rank(tensors, P, memory_bytes=None) -> dict:
    """(T) per rank beside the classes: ``rows`` and ``kernel`` bytes (``chem.memory.
    triples_parts``) and, where the sources have it, tasks, the occupied task tile and rows
    read per rank (``chem.triples_plan.plan_counts``); ``memory_bytes``, a rank's memory
    budget, is passed where the sources take it (windowed tasks size their tile from it)."""
    import inspect
    o, v = tensors["t2"].spaces[0], tensors["t2"].spaces[2]
    out = {}
    budget = (lambda f: {"memory_bytes": memory_bytes}
              if "memory_bytes" in inspect.signature(f).parameters else {})
    try:
        from tessera.chem.memory import triples_parts
        out.update(triples_parts(o, v, P, 1, **budget(triples_parts)))
    except ImportError:
        pass
    try:
        from tessera.chem.triples_plan import plan_counts
        c = plan_counts(tensors, P, **budget(plan_counts))
        out.update(tasks_per_rank=c["tasks_per_rank"], read_bytes_per_rank=c["read_bytes_per_rank"],
                   occ_tile=c.get("occ_tile"), chunks=c.get("chunks", 1))
    except ImportError:
        pass
    try:                                  # the same tasks by whole occupied rows, for comparison
        from tessera.chem.triples_plan import keys_by_tile, row_plan
        from tessera.chem.triples_budget import window_budget
        try:
            limit = window_budget(None, memory_bytes, tensors, P)
        except TypeError:                 # older sources: a share of the memory, whatever the ranks
            limit = window_budget(None, memory_bytes)
        read = row_plan(o, keys_by_tile(tensors), tensors, limit, P)[2][1]
        out.update(whole_rows_read_per_rank=read / P)
    except ImportError:
        pass
    return out


def layout_cost(nranks: int, iteration=None) -> dict:
    """Seconds and tracemalloc peak of what rank 0 builds for the issue's example before a
    GlobalArray allocates its window: for every stored class the owners and where its own
    blocks lie (the slots it keeps), and, given ``iteration`` (a planned CCSD iteration),
    the owner-computes variant's task lists of its contraction steps. On these sources
    (``runtime.placement``) both are per key: the placement's half-grid tables, rank 0's
    own keys, its own output tasks. Run against older sources (``--src``) it measures the
    steps as they were (every block's owner and offset; every task of every step)."""
    orbsym, nocc = np.zeros(900, dtype=int), 100
    tensors = class_tensors(orbsym, nocc, 48)
    keys = {n: t.stored_keys() for n, t in tensors.items()}   # cached structure, not layout work
    out = {"ranks": nranks, "blocks": {n: len(k) for n, k in keys.items()}}
    for what, fn in (("layouts", lambda: build(tensors, keys, nranks)),
                     ("tasks", lambda: task_lists(iteration, nranks))):
        if what == "tasks" and iteration is None:
            continue
        clear_caches()
        t0 = time.perf_counter()
        kept = fn()
        out[f"{what}_seconds"] = time.perf_counter() - t0   # timed without tracemalloc, which slows Python
        del kept
        clear_caches()
        tracemalloc.start()
        kept = fn()
        out[f"{what}_peak_bytes"] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        if what == "tasks":
            out["own_tasks"] = sum(len(t) for t in kept)
        del kept
    return out


def clear_caches() -> None:
    """Task lists are cached per structure: each measurement starts without them."""
    from tessera.plan import blocktasks
    for name in ("_tasks", "_owned"):
        if hasattr(blocktasks, name):
            getattr(blocktasks, name).cache_clear()


def build(tensors, keys, nranks: int) -> dict:
    from tessera.runtime import distribution
    from tessera.runtime.layout import BlockLayout
    kept = {}
    for n, t in tensors.items():
        tiling = [[tl.size for tl in s.tiles] for s in t.spaces]
        try:                                                 # owners per key, own keys only
            from tessera.runtime.placement import block_placement
            from tessera.tensor.block_tensor import symmetry_group
        except ImportError:
            block_placement = None
        if block_placement is not None:
            group = symmetry_group(t.symmetry, t.ndim) if t.canonical else ()
            pl = block_placement(t.spaces, t.irrep, group, nranks)
            mine = pl.local_keys(0)                          # one after the other, as GlobalArray
            offsets = np.cumsum([0] + [int(np.prod(t.block_shape(k))) for k in mine])
            kept[n] = (pl, {k: (0, int(off), t.block_shape(k)) for k, off in zip(mine, offsets.tolist())})
        elif hasattr(distribution, "block_offsets"):        # owners and offsets as arrays
            lay = BlockLayout(tiling, keys[n])
            owner = distribution.block_owner_array(t.spaces, t.irrep, keys[n], nranks, t.placement)[lay.order]
            offsets, run = distribution.block_offsets(owner, lay.sizes(), nranks)
            mine = np.flatnonzero(owner == 0)
            kept[n] = (lay, owner, offsets, {lay.keys[i]: (0, int(offsets[i]), lay.block_shape(lay.keys[i]))
                                             for i in mine})
        else:                                                # a slot per block, every rank
            lay = BlockLayout(tiling, keys[n])
            owners = distribution.block_owners(t.spaces, t.irrep, keys[n], nranks, t.placement)
            owners = {lay.normalize_key(k): r for k, r in owners.items()}
            sizes = [int(np.prod(lay.block_shape(k))) for k in lay.keys]
            owner = distribution.assign_owners(lay.keys, nranks, owners=owners)
            run, slots = [0] * nranks, {}
            for key, count in zip(lay.keys, sizes):
                r = owner[key]
                slots[key] = (r, run[r], lay.block_shape(key))
                run[r] += count
            kept[n] = (lay, owner, slots)
    return kept


def task_lists(iteration, nranks: int) -> list:
    """Rank 0's task lists of the iteration's contraction steps under the owner-computes
    variant: its own output blocks' tasks (``owned_tasks``), or, on sources without it,
    every task of the step (what the variant listed before cutting it to its own)."""
    from tessera.plan import blocktasks
    steps = [s for plan in iteration.plans for s in plan.steps if s.kind == "contract"]
    if not hasattr(blocktasks, "owned_tasks"):
        return [blocktasks.contraction_tasks(s) for s in steps]
    from tessera.runtime.placement import block_placement
    from tessera.tensor.block_tensor import symmetry_group
    placements, out = {}, []
    for s in steps:
        t = s.out.tensor
        skey = (t.spaces, t.irrep, t.canonical)
        if skey not in placements:
            group = symmetry_group(t.symmetry, t.ndim) if t.canonical else ()
            placements[skey] = block_placement(t.spaces, t.irrep, group, nranks).local_keys(0)
        out.append(blocktasks.owned_tasks(s, placements[skey]))
    return out


def auto_tiles(structure, P: int, how: str, budget: float) -> tuple:
    """(tile, occ_tile): ``auto`` the largest that balance every class
    (``balance.balanced_tiles``), ``run`` as a run with ``budget`` bytes per rank and
    ``tessera plan --ranks`` take them (``balance.run_tiles``; on older sources without
    it, the plan's)."""
    try:
        from tessera.backends.balance import balanced_tiles
    except ImportError:                  # older sources (--src)
        from tessera.cli.plan_ranks import choose_tiles
        return choose_tiles(structure.orbsym, structure.nocc, 0, P)
    if how == "run":
        try:
            from tessera.backends.balance import run_tiles
            return tuple(run_tiles(structure, P, budget)[:2])
        except ImportError:
            return tuple(balanced_tiles(structure.stored, P, budget)[:2])
    return tuple(balanced_tiles(structure.stored, P)[:2])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--waters", default="8,16", help="water cluster sizes (empty: only the issue example)")
    ap.add_argument("--ranks", default="64,256,1024")
    ap.add_argument("--tile", default="32", help="largest tile, or auto: the tiles tessera plan --ranks "
                    "chooses for each rank count (every class balanced), or run: the tiles of a run's "
                    "rule with --memory-per-rank (balance.run_tiles)")
    ap.add_argument("--memory-per-rank", type=float, default=8.0, help="GiB a rank may use (as tessera plan "
                    "--memory-per-node 512GB --ranks-per-node 64): (T)'s windowed tasks take a share")
    ap.add_argument("--json", default=str(REPO / "bench" / "results" / "layouts_at_scale.json"))
    ap.add_argument("--src", default=None, help="import Tessera from this src folder (e.g. an older "
                    "checkout's, for the BEFORE numbers): the script runs itself again with it")
    args = ap.parse_args(argv)
    if args.src:
        import subprocess
        rest = [a for a in (argv if argv is not None else sys.argv[1:])]
        i = rest.index("--src")
        del rest[i:i + 2]
        env = dict(os.environ, TESSERA_BENCH_SRC=args.src)
        raise SystemExit(subprocess.call([sys.executable, __file__, *rest], env=env))
    waters = [int(x) for x in args.waters.split(",") if x]
    ranks = [int(x) for x in args.ranks.split(",")]
    result = {"tile": args.tile, "load": os.getloadavg()[0], "clusters": {}}
    for n in waters:
        nocc, nmo = 5 * n, NBAS_WATER * n
        orbsym = np.zeros(nmo, dtype=int)
        structure = CCSDStructure(orbsym, nocc, distributed=True)
        rows = {}
        for P in ranks:
            if args.tile in ("auto", "run"):
                tile, occ_tile = auto_tiles(structure, P, args.tile, args.memory_per_rank * 2**30)
            else:
                tile = occ_tile = int(args.tile)
            tensors = class_tensors(orbsym, nocc, tile, occ_tile)
            s = structure_stats(structure, tile, occ_tile, P)
            moved = {f"{b} {v}": estimate(s, P, b, v, 10e9)["bytes_per_rank"] for b, v in EXECUTORS}
            parts = {f"{b} {v}": memory_parts(s, P, b, v) for b, v in EXECUTORS}
            steps = [{k: d[k] for k in ("step", "tasks", "tasks_per_rank", "busiest_over_mean_flops")}
                     for d in dominant_steps(structure(tile, occ_tile).plans, P)]
            rows[P] = {"tiles": [tile, occ_tile], "memory_per_rank": per_rank(tensors, P), "bytes_per_rank": moved,
                       "dominant_steps": steps, "executor_memory": parts, "triples": triples_per_rank(tensors, P, args.memory_per_rank * 2**30)}
        result["clusters"][f"(H2O){n}"] = rows
        print(f"\n(H2O){n} cc-pVDZ, C1, o={nocc} v={nmo - nocc}, tile {args.tile}: per-rank memory "
              "(MiB max / MiB mean / max/mean) per class; tiles (v/o) per rank count: "
              + ", ".join(f"{P}: {r['tiles'][0]}/{r['tiles'][1]}" for P, r in rows.items()))
        names = list(next(iter(rows.values()))["memory_per_rank"])
        print(f"{'ranks':>6s} " + " ".join(f"{c:>22s}" for c in names))
        for P, row in rows.items():
            cells = [f"{m['max_bytes'] / 2**20:8.1f}/{m['mean_bytes'] / 2**20:7.1f}/{m['max_over_mean']:5.2f}"
                     for m in row["memory_per_rank"].values()]
            print(f"{P:6d} " + " ".join(f"{c:>22s}" for c in cells))
        print("block tasks per rank of the dominant steps: the fewest, each step's (most flops first); "
              "the busiest rank's flops over the mean, the worst")
        for P, row in rows.items():
            per = [d["tasks_per_rank"] for d in row["dominant_steps"]]
            print(f"{P:6d} tiles {row['tiles'][0]:2d}/{row['tiles'][1]:<2d} fewest {min(per, default=0):7.2f}  "
                  + " ".join(f"{x:7.2f}" for x in per)
                  + f"  busiest/mean {max(d['busiest_over_mean_flops'] for d in row['dominant_steps']):6.2f}")
        print("(T) per rank: rows held, kernel buffers (MiB); tasks; occupied task tile; rows read (MiB); "
              "rows read by whole occupied rows (MiB) and the ratio; chunks of a streamed task (1: unstreamed)")
        for P, row in rows.items():
            t = row["triples"]
            read, whole = t.get("read_bytes_per_rank", float("nan")), t.get("whole_rows_read_per_rank", float("nan"))
            print(f"{P:6d} rows {t.get('rows', 0) / 2**20:10.1f} kernel {t.get('kernel', 0) / 2**20:8.1f} "
                  f"tasks {t.get('tasks_per_rank', float('nan')):10.1f} tile {t.get('occ_tile') or '-':>3} "
                  f"read {read / 2**20:12.1f} whole rows {whole / 2**20:12.1f} ({read / whole:.2f}x) "
                  f"chunks {t.get('chunks', 1)}")
        print("bytes moved per rank per CCSD iteration (MiB), by executor and variant")
        print(f"{'ranks':>6s} " + " ".join(f"{e:>22s}" for e in rows[ranks[0]]["bytes_per_rank"]))
        for P, row in rows.items():
            print(f"{P:6d} " + " ".join(f"{b / 2**20:22.1f}" for b in row["bytes_per_rank"].values()))
        print("memory per rank of a CCSD iteration (MiB: stored T2 + integrals of the fullest rank / held / working, "
              "backends.cost_model.memory_parts), by executor and variant")
        for P, row in rows.items():
            print(f"{P:6d} " + " ".join(f"{m['stored'] / 2**20:8.1f}/{m['held'] / 2**20:6.1f}/{m['working'] / 2**20:6.1f}"
                                        for m in row["executor_memory"].values()))
    iteration = CCSDStructure(np.zeros(900, dtype=int), 100, distributed=True)(48, 48)   # planned once: structure, not layout work
    costs = [layout_cost(P, iteration) for P in ranks]
    result["layout_cost"] = costs
    print("\nissue example (C1, o=100, v=800, tile 48), what rank 0 builds: the owners and own slots of every "
          "class (layouts) and the owner variant's task lists of one CCSD iteration (tasks)")
    print(f"{'ranks':>6s} {'layouts s':>10s} {'peak MiB':>9s} {'tasks s':>8s} {'peak MiB':>9s} {'own tasks':>10s}")
    for c in costs:
        print(f"{c['ranks']:6d} {c['layouts_seconds']:10.3f} {c['layouts_peak_bytes'] / 2**20:9.2f} "
              f"{c['tasks_seconds']:8.3f} {c['tasks_peak_bytes'] / 2**20:9.2f} {c['own_tasks']:10d}")
    example = CCSDStructure(np.zeros(900, dtype=int), 100, distributed=True)
    result["example"] = {}
    print("issue example per rank count: per class max/mean (blocks) at tile 48, and at the tiles of a "
          f"run's rule with {args.memory_per_rank:g} GiB per rank (balance.run_tiles)")
    for P in ranks:
        row = result["example"][P] = {}
        for label, (tile, occ_tile) in (("48", (48, 48)), ("run", auto_tiles(example, P, "run",
                                                                            args.memory_per_rank * 2**30))):
            tensors = class_tensors(example.orbsym, 100, tile, occ_tile)
            memory = per_rank(tensors, P)
            row[label] = {"tiles": [tile, occ_tile], "memory_per_rank": memory}
            print(f"{P:6d} tiles {tile:2d}/{occ_tile:<2d} " + " ".join(
                f"{n} {m['max_over_mean']:.2f}" + (f" ({len(tensors[n].stored_keys())})" if n in tensors else "")
                for n, m in memory.items()))
        big = row["run"]["memory_per_rank"]
        print("       at the run's tiles, max GiB per rank: " + " ".join(
            f"{n} {m['max_bytes'] / 2**30:.3f}" for n, m in big.items()))
    print(f"(load average {result['load']:.2f})")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
