"""What one rank of ``mpi-collective`` spends deciding how to run a CCSD iteration's
contractions, on many simulated ranks (no MPI).

    .venv/bin/python bench/rank_planning.py [--waters 8,16] [--ranks 64,256,1024] [--tile 32]
                                            [--variants summa,2.5d] [--json bench/results/rank_planning.json]
                                            [--src DIR]

BEFORE/AFTER: run it on these sources and with ``--src`` on an older checkout's ``src``
(``git archive <commit> src | tar -x -C /tmp/old`` then ``--src /tmp/old/src``).

For water clusters (H2O)n in cc-pVDZ (C1, tile ``--tile``, occupied tile the same; with
``--c1`` also a C1 molecule of given occupied and virtual orbitals), one
CCSD iteration is planned as a distributed run plans it (``chem.ccsd.CCSDStructure``),
and rank 0 of P simulated ranks makes ``CollectiveExecutor._mode``'s decision for every
contraction step (``stationary=auto``): the grid shape and SUMMA or the stationary
operand, and the rank of its block products. The operands' owners and pieces are those
of a run on P ranks: ``runtime.placement.block_placement`` per tensor structure, owners
per key (``locate``), pieces by ``piece_table`` (as ``GlobalArray`` gives them), frozen
operands (the integrals) counted as moved once. Caches of the step's task arrays and grid
layouts are cleared first (a run pays them in its first iteration). Per variant: seconds of rank 0's decisions
summed over the iteration's contractions (best of ``--repeat``), the peak of Python
memory they allocate (tracemalloc, a separate pass), and the contractions per mode.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import tracemalloc
from pathlib import Path
from types import SimpleNamespace

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, os.environ.get("TESSERA_BENCH_SRC", str(REPO / "src")))

from common import rerun_on_src  # noqa: E402
from tessera.backends import stationary  # noqa: E402
from tessera.chem.ccsd import CCSDStructure  # noqa: E402
from tessera.plan import blocktasks  # noqa: E402
from tessera.backends import summa_layout  # noqa: E402
from tessera.runtime.distribution import default_layers  # noqa: E402
from tessera.runtime.placement import PiecedPlacement, block_placement  # noqa: E402
from tessera.tensor.block_tensor import symmetry_group  # noqa: E402

try:                # these sources: each rank counts itself (older ones: every rank)
    from tessera.backends import rank_choice  # noqa: E402
except ImportError:
    rank_choice = None
try:                # a rank lists only its own products (older sources: mode_where's every product)
    from tessera.backends.own_products import own_tasks  # noqa: E402
except ImportError:
    own_tasks = None

NBAS_WATER = 24      # cc-pVDZ functions of one water


class SimulatedArray:
    """What ``CollectiveExecutor._mode`` reads of a tensor's ``GlobalArray`` on P ranks:
    ``owner`` per key (an alias: its stored block's) and ``piece_table``, from the
    placement a run makes (one per structure)."""

    def __init__(self, t, nranks: int, placements: dict):
        group = symmetry_group(t.symmetry, t.ndim) if t.canonical else ()
        skey = (t.spaces, t.irrep, t.placement, t.canonical, tuple(t.symmetry) if t.canonical else ())
        if skey not in placements:
            placements[skey] = block_placement(t.spaces, t.irrep, group, nranks, t.placement)
        self.place, self.aliases = placements[skey], t.aliases
        self.pieces = getattr(self.place, "k", 1)

    def stored(self, key):
        return self.aliases[key][0] if key in self.aliases else key

    def owner(self, key) -> int:
        return self.place.locate(self.stored(key))[0]

    def piece_table(self, keys) -> tuple:
        return self.place.piece_table([self.stored(k) for k in keys])

    def held(self, rank: int) -> set:
        """Stored keys whose block ``rank`` is home of or holds a piece of (the run's
        ``home_keys`` and ``local_pieces``, made with the array)."""
        if self.pieces == 1:
            return set(self.place.local_keys(rank))
        return set(self.place.home_keys(rank)) | {k for k, _, _ in self.place.local_pieces(rank)}


def simulated_tensor(t, nranks: int, placements: dict):
    """A stand-in for tensor ``t`` as distributed on ``nranks`` ranks: ``dist.ga`` (a
    ``SimulatedArray``), ``dist.owner``, ``pieced``, ``constant``, ``aliases``."""
    ga = SimulatedArray(t, nranks, placements)
    return SimpleNamespace(tensor=t, dist=SimpleNamespace(ga=ga, owner=ga.owner), pieced=isinstance(ga.place, PiecedPlacement),
                           constant=t.constant, aliases=t.aliases, block_shape=t.block_shape)


def clear_caches() -> None:
    """The caches a run fills in its first iteration (the steps' task arrays, the grids' deals)."""
    blocktasks._arrays.cache_clear()
    for f in (summa_layout._lpt, summa_layout._shift, summa_layout.least_idle_shapes, summa_layout.summa_layout):
        f.cache_clear()


def decide(step, sim: dict, nranks: int, layers: int, rank: int, chosen: dict) -> tuple:
    """``CollectiveExecutor._mode`` of ``step`` on ``rank`` (stationary=auto):
    (mode, grid, where) (where: the rank's own products, ``own_tasks``, where the tree has it). With per-rank counting (``rank_choice``) the rank counts itself;
    the allreduce's answer, the busiest rank's costs, is ``chosen[id(step)]`` (the whole
    count's choice, made beforehand, not timed)."""
    A, B, C = (sim[id(r.tensor)] for r in (*step.inputs, step.out))
    sig = tuple((s.irrep, s.rows, s.inner, s.cols) for s in step.sectors)
    perms = (step.perms["a"], step.perms["b"], step.perms["c"])
    ops = stationary.Operands((A.tensor, B.tensor, C.tensor), (A.dist.owner, B.dist.owner, C.dist.owner),
                              tuple(t.dist.ga.piece_table if t.pieced else None for t in (A, B, C)))
    moved_once = [x for x, t in (("a", A), ("b", B)) if t.constant]
    if rank_choice is None or id(step) not in chosen:
        mode, grid, _, plans = stationary.choose(blocktasks.task_arrays(step), sig, perms, layers, ops, nranks,
                                                 moved_once, stationary.MODES)
        chosen[id(step)] = (mode, grid)
        return mode, grid, None if mode == "summa" else plans[mode]["where"]
    held = tuple(t.dist.ga.held(rank) for t in (A, B, C))
    costs = rank_choice.rank_costs(sig, perms, layers, ops, nranks, rank, held, moved_once)
    rank_choice.pick(rank_choice.candidates(sig, perms, layers, nranks), costs)
    mode, grid = chosen[id(step)]
    if mode == "summa":
        return mode, grid, None
    if own_tasks is not None:
        return mode, grid, own_tasks(sig, perms, ops, held, mode)
    return mode, grid, stationary.mode_where(blocktasks.task_arrays(step), mode, ops.owners)


def one_rank(steps, sim, nranks: int, layers: int, repeat: int) -> dict:
    """Seconds (best of ``repeat``), peak Python MiB and modes of rank 0's decisions."""
    chosen: dict = {}
    if rank_choice is not None:         # the allreduce's answer (not timed)
        for s in steps:
            decide(s, sim, nranks, layers, 0, chosen)
    best = None
    for _ in range(repeat):
        clear_caches()
        t0 = time.process_time()
        modes = [decide(s, sim, nranks, layers, 0, chosen)[0] for s in steps]
        seconds = time.process_time() - t0
        best = seconds if best is None else min(best, seconds)
    clear_caches()
    tracemalloc.start()
    kept = [decide(s, sim, nranks, layers, 0, chosen) for s in steps]      # a run keeps its decisions
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    del kept
    count: dict = {}
    for m in modes:
        count[m] = count.get(m, 0) + 1
    return {"cpu_seconds": best, "peak_mib": peak / 2**20, "modes": count}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--waters", default="8,16")
    ap.add_argument("--c1", default="", help="also a C1 molecule of NOCC,NVIR orbitals (the issue's example: "
                    "100,800 with --tile 48)")
    ap.add_argument("--ranks", default="64,256,1024")
    ap.add_argument("--tile", type=int, default=32)
    ap.add_argument("--variants", default="summa,2.5d")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--json", default=str(REPO / "bench" / "results" / "rank_planning.json"))
    ap.add_argument("--src", default=None, help="import Tessera from this src folder (an older checkout's, "
                    "for the BEFORE numbers): the script runs itself again with it")
    args = ap.parse_args(argv)
    if args.src:
        rerun_on_src(__file__, argv if argv is not None else sys.argv[1:], args.src)
    result = {"load": os.getloadavg()[0], "tile": args.tile, "clusters": {}}
    print(f"{'cluster':>9s} {'ranks':>5s} {'variant':>7s} {'layers':>6s} {'steps':>5s} {'products':>9s} "
          f"{'cpu s':>8s} {'peak MiB':>9s}  modes")
    systems = [(f"(H2O){n}", NBAS_WATER * n, 5 * n) for n in [int(x) for x in args.waters.split(",") if x]]
    if args.c1:
        nocc, nvir = (int(x) for x in args.c1.split(","))
        systems.append((f"C1 {nocc}/{nvir}", nocc + nvir, nocc))
    for name, nbas, nocc in systems:
        structure = CCSDStructure(np.zeros(nbas, dtype=int), nocc, distributed=True)
        iteration = structure(args.tile, args.tile)
        steps = [s for plan in iteration.plans for s in plan.steps if s.kind == "contract"]
        products = sum(len(blocktasks.task_arrays(s).k) for s in steps)
        rows = {}
        for P in [int(x) for x in args.ranks.split(",")]:
            placements: dict = {}
            sim = {}
            for s in steps:
                for r in (*s.inputs, s.out):
                    if id(r.tensor) not in sim:
                        sim[id(r.tensor)] = simulated_tensor(r.tensor, P, placements)
            rows[P] = {}
            for variant in [v for v in args.variants.split(",") if v]:
                layers = 1 if variant == "summa" else default_layers(P)
                got = one_rank(steps, sim, P, layers, args.repeat)
                rows[P][variant] = {"layers": layers, **got}
                print(f"{name:>9s} {P:5d} {variant:>7s} {layers:6d} {len(steps):5d} {products:9d} "
                      f"{got['cpu_seconds']:8.2f} {got['peak_mib']:9.1f}  {got['modes']}", flush=True)
        result["clusters"][name] = {"products": products, "ranks": rows}
    print(f"(load average {result['load']:.2f} at the start; cpu s: rank 0's CPU seconds for the decisions of "
          "one CCSD iteration's contractions, best of --repeat; peak MiB: tracemalloc's peak over them)")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
