"""``auto``: pick the executor, loop order, schedule and tile size from a cost model.

One rank: ``threads``. Several ranks: for every candidate tile size the iteration is
counted (``iteration_counts.structure_stats``) and each executor and variant estimated
per rank (``cost_model.estimate``: seconds, operations, bytes moved, memory; the
constants per node, with the network between nodes when the ranks span several,
``cost_model.run_costs``), the memory compared with the run's memory budget per rank
(``backends.budget``: --max-memory, else TESSERA_MEMORY_PER_RANK_MB, else the memory
available now shared by the ranks); the fastest candidate that meets every condition
below wins.

Candidates that do not fit are dropped (unless --variant names them), so
replication (c > 1) is chosen only where memory allows; so are candidates at which a
stored class (T2, an integral class) that binds is spread with a max/mean above 1.5 or
lies whole on one rank: every class where occupied tiles no thinner than
``balance.MIN_OCC_TILE`` balance them all, else those that matter for memory (their
busiest rank holds more than 1/32 of the budget, ``balance.binding``); the tiles of
``backends.balance.run_tiles`` (the largest at which every binding class is balanced
and, where every class is, the dominant steps have 2 block tasks per rank; for
mpi-collective, whichever --backend, no idle grid line (or layer) on its grid of c
layers: ``layers``, 1 for summa) are always a candidate of that executor and variant,
so mpi-collective weighs under ``auto`` the candidates it weighs alone and runs at the
tiles ``tessera plan --ranks`` shows for it. A forced --tile is evaluated alone (no tile search) and gets one
warning line when it leaves any stored class above 1.5 (as ``tessera plan --ranks``). Tiles
are tried from large to small until a tile gives more than MAX_PRODUCTS block products
per iteration, or PRODUCTS_PER_RANK per rank where that is more: on many ranks finer
tiles (more tasks per rank, better balance) stay candidates. Every
choice can be overridden (``--backend``, ``--variant``, ``--schedule``, ``--tile``);
``tessera run --plan-only`` prints the decision and its estimates.
"""

from __future__ import annotations

import logging

from tessera.backends.balance import BALANCE, collective_layers, forced_tile_warning, run_tiles
from tessera.backends.budget import executor_cache_bytes, memory_budget
from tessera.backends.collective_model import grid_of
from tessera.backends.cost_model import estimate, gemm_rate, run_costs
from tessera.backends.iteration_counts import structure_stats
from tessera.backends.machine import Machine
from tessera.backends.registry import DEFAULT_SCHEDULE, VARIANTS, backend_of_variant, check_options
from tessera.errors import InputError
from tessera.runtime.distribution import default_layers

log = logging.getLogger(__name__)

TILES = (48, 32, 24, 16, 12, 8)     # tried from large to small ...
MAX_PRODUCTS = 60000                # ... down to the first with more block products per iteration
PRODUCTS_PER_RANK = 1000            # ... or, on many ranks, more than this many per rank

# auto weighs the TCE loop orders; ``owner`` (for networks with slow accumulates, which
# the shared-memory constants here do not model) runs when --variant names it
ONESIDED_VARIANTS = tuple(v for v in VARIANTS["mpi-onesided"] if v != "owner")
COLLECTIVE_VARIANTS = VARIANTS["mpi-collective"]


def decide(structure, nranks: int, *, backend: str = "auto", tile=None, variant=None, schedule=None,
           rate: float | None = None, budget: float | None = None, ranks_per_node: int | None = None,
           threads_per_rank: int = 1) -> dict:
    """The executor, options and tile for a run on ``nranks`` ranks, with the estimates.

    ``structure(tile, occ_tile)`` returns the run's structure at those tile sizes:
    ``plans`` (one iteration, planned without data), ``tensors`` (what a run stores) and
    ``tiles`` ({"o": sizes, "v": sizes}); ``structure.nocc`` is the active occupied count.
    ``budget``: bytes a rank may use (default ``budget.memory_budget`` with every rank on
    this node). ``ranks_per_node``: worker ranks per node (default: all on one node; fewer
    put the network between them, ``run_costs``). ``rate``: a rank's DGEMM rate (default:
    measured on one thread, ``gemm_rate``, times ``threads_per_rank`` at the calibrated
    thread efficiency, ``Machine.rank_flops_per_second``)."""
    if backend not in ("auto", "mpi-onesided", "mpi-collective"):
        raise InputError(f"backend {backend!r} is not decided by the cost model")
    check_options(backend, variant, schedule, ranks=max(2, nranks))
    rate = rate or Machine.calibrated(gemm_flops_per_second=gemm_rate(),
                                      threads_per_rank=threads_per_rank).rank_flops_per_second
    tiles = [tile] if tile else list(TILES)
    if backend == "auto" and variant is not None:
        backend = backend_of_variant(variant)
    collective = [("mpi-collective", "summa")]
    if default_layers(nranks) > 1:
        collective.append(("mpi-collective", "2.5d"))
    if backend == "mpi-collective":
        combos = [("mpi-collective", variant)] if variant else collective
    elif backend == "mpi-onesided":
        combos = [("mpi-onesided", variant)] if variant else [("mpi-onesided", v) for v in ONESIDED_VARIANTS]
    else:
        combos = [("mpi-onesided", v) for v in ONESIDED_VARIANTS] + collective
    budget = budget or memory_budget(nranks)[0]
    costs = run_costs(nranks, ranks_per_node)
    # with several ranks each tile is also tried with the occupied space cut in two or
    # more tiles: a single occupied tile leaves oooo whole on one rank
    half_occ = max(1, -(-structure.nocc // 2))
    # the combos grouped by their tile rule (``backends.balance.run_tiles``): the one-sided
    # ones by tasks per rank (None), mpi-collective's by its grid of c layers (summa 1, 2.5d
    # c). A rule's tiles are always a candidate of its group; the classes whose balance
    # binds (every class where occupied tiles of MIN_OCC_TILE or more balance them all,
    # else those that matter for memory) do not depend on the rule, so one ``binds`` serves
    # every group, and with every class binding each tile is tried with the rule's occupied
    # tile too. A forced --tile that leaves any stored class above BALANCE gets a warning
    # (forced tiles are evaluated alone, every class judged, as ``tessera plan --ranks`` does)
    groups: dict = {}
    for b, var in combos:
        groups.setdefault(None if b == "mpi-onesided" else collective_layers(var, nranks), []).append((b, var))
    rules, binds = {}, budget
    if nranks > 1 and tile:
        binds = None
        if note := forced_tile_warning(structure.stored, tile, None, nranks):
            log.warning(note)
    elif nranks > 1:
        for layers in groups:
            *rule, worst, binds = run_tiles(structure, nranks, budget, layers)
            if worst <= BALANCE:
                rules[layers] = tuple(rule)
    counted: dict = {}            # tiling -> structure_stats (each tiling counted once)
    candidates = []
    for layers, members in groups.items():
        rule = rules.get(layers)
        occs = [half_occ] + ([rule[1]] if rule and binds is None else [])
        pairs = [(t, t) for t in tiles] if tile or nranks == 1 else \
            [p for t in tiles for p in dict.fromkeys([(t, t)] + [(t, min(t, o)) for o in occs])]
        seen_tiles = set()
        for t, ot in [rule] + pairs if rule else pairs:
            tiling = structure(t, ot).tiles
            key = (tuple(tiling["o"]), tuple(tiling["v"]))
            if key in seen_tiles:          # a larger tile that changes nothing
                continue
            seen_tiles.add(key)
            if key not in counted:
                counted[key] = structure_stats(structure, t, ot, nranks, binds, owner=any(v == "owner" for _, v in combos))
            s = counted[key]
            for b, var in members:
                e = estimate(s, nranks, b, var, rate, costs, executor_cache_bytes(budget), schedule or DEFAULT_SCHEDULE)
                candidates.append({"backend": b, "variant": var, "tile": t, "occ_tile": ot,
                                   "memory_max_over_mean": round(s["memory_max_over_mean"], 3),
                                   "class_max_over_mean": round(s["class_max_over_mean"], 3),
                                   "max_tensor_share": round(s["max_tensor_share"], 3),
                                   "flops": s["flops"], "block_products": s["products"],
                                   "fits_memory": e["memory_per_rank"] <= budget,
                                   **{k: (round(x, 6) if isinstance(x, float) else x) for k, x in e.items()}})
            if s["products"] > max(MAX_PRODUCTS, PRODUCTS_PER_RANK * nranks) and not tile and (t, ot) != rule:
                break                      # too fine
    # a candidate must spread the tensors evenly, with no four-index tensor whole on one
    # rank (unless the tile was given), and fit in memory per rank (unless the variant was
    # given): 2.5d's c-times larger output rectangle is the reason it may not
    ok = [c for c in candidates
          if (tile or (c["class_max_over_mean"] <= BALANCE
                       and (c["max_tensor_share"] < 1.0 or nranks == 1)))
          and (c["fits_memory"] or variant)]
    pool = ok or [c for c in candidates if c["fits_memory"] or variant] \
        or [c for c in candidates if c["layers"] in (None, 1)] or candidates
    if not ok:
        log.warning("no candidate meets every condition (max/mean <= %.1f, no four-index tensor "
                    "whole on one rank, estimated memory within %d MiB per rank); running the "
                    "fastest of the rest. Set --tile, --variant or --max-memory to choose.",
                    BALANCE, int(budget) >> 20)
    best = min(pool, key=lambda c: (c["seconds"], -c["tile"]))
    sched = None
    if best["backend"] == "mpi-onesided":
        sched = schedule or "nxtval"
    return {"backend": best["backend"], "variant": best["variant"], "schedule": sched,
            "tile": best["tile"], "occ_tile": best["occ_tile"], "ranks": nranks, "gemm_rate": rate, "layers": best["layers"],
            "grid": list(grid_of(nranks, best["variant"])) if best["backend"] == "mpi-collective" else None,
            "memory_budget_per_rank": budget, "estimated_memory_per_rank": best["memory_per_rank"],
            "estimated_seconds_per_iteration": best["seconds"],
            "candidates": sorted(candidates, key=lambda c: c["seconds"])}


def _tiles(c: dict) -> str:
    """'32', or '32/8' when the occupied tile differs."""
    ot = c.get("occ_tile", c["tile"])
    return f"{c['tile']}" if ot == c["tile"] else f"{c['tile']}/{ot}"


def render(decision: dict, limit: int = 12) -> str:
    """The decision and the best candidates as a table."""
    grid = ""
    if decision.get("grid"):
        pr, pc, c = decision["grid"]
        grid = f" (grid {pr} x {pc}" + (f" x {c} layers)" if c > 1 else ")")
    lines = [f"auto decision on {decision['ranks']} rank(s): backend {decision['backend']}, "
             f"variant {decision['variant']}{grid}, schedule {decision['schedule']}, "
             f"tile {_tiles(decision)} "
             f"(measured DGEMM rate {decision['gemm_rate'] / 1e9:.1f} GFLOP/s; memory per rank: estimated "
             f"{decision.get('estimated_memory_per_rank', 0) / 2**20:.0f} MiB of "
             f"{decision.get('memory_budget_per_rank', 0) / 2**20:.0f} MiB allowed)",
             f"{'backend':15s} {'variant':9s} {'tile':>5s} {'est. s/iter':>11s} {'compute':>8s} "
             f"{'gets':>9s} {'accs':>8s} {'coll.':>6s} {'MB/rank':>8s} {'bcast MB':>8s} {'mem MiB':>8s} "
             f"{'mem max/mean':>12s}"]
    for c in decision["candidates"][:limit]:
        var = c["variant"] + (f" c={c['layers']}" if c.get("layers", 1) not in (None, 1) else "")
        mem = f"{c.get('memory_per_rank', 0) / 2**20:7.0f}" + (" " if c.get("fits_memory", True) else "!")
        lines.append(f"{c['backend']:15s} {var:9s} {_tiles(c):>5s} {c['seconds']:11.3f} "
                     f"{c['compute']:8.3f} {c['gets']:9.0f} {c['accs']:8.0f} {c['collectives']:6d} "
                     f"{c['bytes_per_rank'] / 2**20:8.1f} {c.get('bcast_bytes_per_rank', 0) / 2**20:8.1f} "
                     f"{mem:>8s} {c['memory_max_over_mean']:12.2f}")
    if any(not c.get("fits_memory", True) for c in decision["candidates"][:limit]):
        lines.append("! estimated memory per rank above the allowed (--max-memory, else TESSERA_MEMORY_PER_RANK_MB, "
                     "else the memory available now shared by the ranks): not chosen unless --variant asks for it")
    return "\n".join(lines)
