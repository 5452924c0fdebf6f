"""One rule for the tiles of a distributed run: every stored class balanced over the ranks.

The integral classes and T2 are placed in ``pieces`` (``runtime.distribution.piece_deal``):
a class with too few blocks for the ranks (oooo and ovoo of a small occupied space on
many ranks, T2 of a small molecule) has its blocks cut into pieces dealt over the ranks,
so it is spread with max/mean <= BALANCE at any tiles (as both MPI executors store it;
in whole blocks a class with fewer blocks than about twice the ranks cannot be spread).
``balanced_tiles`` picks the
largest tiles of TILES (occupied tiles no larger, from OCC_TILES) at which every class a
run stores is spread with max/mean <= BALANCE over P ranks (when no pair reaches it, the
pair with the smallest worst max/mean). ``tessera plan --ranks`` (``cli.plan_ranks``)
and the cost model of a real run (``backends.auto.decide``, when --tile is not given)
both use it; a forced --tile that leaves a class above BALANCE gets one warning line
(``forced_tile_warning``).

A run (``run_tiles``) balances every class whenever tiles no thinner than MIN_OCC_TILE
(occupied: or the whole occupied space) do it: the issue example (C1, o=100, v=800) on
1024 ranks is balanced at 48/48 (T2 in pieces; in whole blocks it needs 48/32; for tasks
per rank it takes 48/24, below). Below that floor the block
GEMMs lose about half their rate (one-thread DGEMM of the ladder's (oo, vv, vv) shape, v
tile 48, measured under load: 53/38/24/18 GFLOP/s at occupied tiles 34/14/8/4), so there
balance is about memory alone: with a ``budget`` (bytes a rank may use) it binds only
the classes that matter, those whose busiest rank holds more than MATTERS of the budget,
and the run's candidate is the least unbalanced tiles at the floor;
the cost model chooses for speed among every candidate at which those classes are
balanced, instead of tiles cut small to spread a few kilobytes. ``tessera plan --ranks``
shows the tiles a run with its budget takes (``run_tiles``).

Among the tiles at or above that floor that balance every class, a run takes the
largest (virtual tile first, then occupied: the largest GEMMs, the fewest bytes moved)
that give every dominant step (``dominant_steps``: the contractions with at least
DOMINANT of the largest one's flops; for CCSD the ladder and the o^3v^3 ring terms) at
least TASKS_PER_RANK block tasks per rank, as the planner runs them (output blocks,
``plan.blocktasks.task_count``), so that no rank idles in them: (H2O)8 cc-pVDZ on 1024
ranks takes 12/12, not 48/48 (4 tasks of its o^3v step for 1024 ranks). Where no such tiles reach the
target, the ones with the most tasks (the finest the floor allows; ``granularity`` says
whether a run's tiles reach it). ``mpi-collective`` (``layers``: its c layers, 1 for
summa, ``collective_layers``) is not dealt by a task counter: its grid deals output row
tuples over grid rows, column tuples over grid columns and (2.5d) inner tuples over the
layers, so tasks per rank say neither whether a grid line idles nor how even the
work is (at 2+ tasks per rank its busiest rank still does up to 1.9x the mean, (H2O)16
on 1024 ranks). Its tiles are the largest at which no dominant step leaves a grid line
(or layer) idle (``grid_lines``, on ``choose_grid``'s shape: one of the shapes with the fewest idle
lines, of which the executor's ``stationary.summa_grid`` takes the one whose busiest rank receives
least, so the idle count is the run's, the evenness may be another shape's), else the fewest idle lines,
then the most even: (H2O)8 and (H2O)16 cc-pVDZ on 256 ranks take 24/12 and 48/24 (1.75
tasks per rank, every line busy; the task rule took 16/12 and 48/16). Tiles that change nothing (the same tiling as larger
ones) are not tried twice.

``stored(tile, occ_tile)`` is the caller's: {class name: empty tensor} of what a run
stores at those tiles (for CCSD ``chem.ccsd.CCSDStructure.stored``); ``structure(tile,
occ_tile).plans`` the plans of one iteration (structure only, ``CCSDStructure``).
"""

from __future__ import annotations

import math

import numpy as np

BALANCE = 1.5
TILES = (48, 32, 24, 16, 12, 8, 6, 4)         # tried from large to small ...
OCC_TILES = TILES + (3, 2)                     # ... with occupied tiles no larger
MATTERS = 1 / 32           # a class's balance binds when its busiest rank holds more of the budget
MIN_OCC_TILE = 12          # the thinnest occupied tile a run cuts to balance the small classes
TASKS_PER_RANK = 2         # block tasks per rank a run's tiles give each dominant step ...
DOMINANT = 1 / 8           # ... a contraction with at least this share of the largest one's flops


def loads(t, nranks: int, least: int | None = None) -> np.ndarray:
    """Bytes of tensor ``t`` on each of ``nranks`` ranks, placed as a run places them: a
    ``pieces`` tensor as ``runtime.distribution.piece_deal`` cuts it, at least ``least``
    pieces per block (None: the run's, ``registry.least_pieces``, TESSERA_PIECES)."""
    from tessera.backends.registry import least_pieces
    from tessera.runtime.distribution import block_owner_array, block_sizes, piece_deal
    keys = t.stored_keys()
    if t.placement == "pieces" and nranks > 1:
        least = least_pieces() if least is None else least
        return 8.0 * piece_deal(t.spaces, t.irrep, keys, nranks, least).loads()
    placement = "balanced" if t.placement == "pieces" else t.placement
    return np.bincount(block_owner_array(t.spaces, t.irrep, keys, nranks, placement),
                       weights=8.0 * block_sizes(t.spaces, keys), minlength=nranks)


def stats(load) -> dict:
    """{max_bytes, mean_bytes, max_over_mean} of per-rank bytes ``load``."""
    mean = float(np.mean(load))
    return {"max_bytes": int(np.max(load)), "mean_bytes": mean,
            "max_over_mean": round(float(np.max(load)) / mean, 4) if mean else 1.0}


def class_balance(tensors: dict, nranks: int, least: int | None = None) -> dict:
    """{name: stats} of each tensor's blocks placed over ``nranks`` ranks (``loads``, at
    least ``least`` pieces per block), and ``total`` (the ranks' sums)."""
    out, total = {}, np.zeros(nranks)
    for name, t in tensors.items():
        load = loads(t, nranks, least)
        total += load
        out[name] = stats(load)
    out["total"] = stats(total)
    return out


def binding(per_class: dict, budget: float | None) -> dict:
    """The classes of ``per_class`` ({name: stats}) whose balance binds under ``budget``:
    all without one, else those whose busiest rank holds more than MATTERS of it."""
    if budget is None:
        return per_class
    return {n: c for n, c in per_class.items() if c["max_bytes"] > MATTERS * budget}


def _signature(t) -> tuple:
    """What a tensor's placement depends on: its name and the tiles of its spaces."""
    return (t.name, t.irrep, tuple(tuple((tl.size, tl.irrep) for tl in s.tiles) for s in t.spaces))


def worst_class(stored, tile: int, occ_tile: int, nranks: int, memo: dict | None = None,
                stop: float = math.inf, budget: float | None = None) -> tuple:
    """(class name, max/mean) of the least balanced stored class at these tiles, among
    those that bind under ``budget`` (``binding``; ("", 0.0) when none does); stops at
    the first class above ``stop``. ``memo`` keeps each class's stats by its tiles."""
    memo = {} if memo is None else memo
    worst = ("", 0.0)
    for name, t in stored(tile, occ_tile).items():
        key = _signature(t)
        if key not in memo:
            memo[key] = stats(loads(t, nranks))
        if binding({name: memo[key]}, budget) and memo[key]["max_over_mean"] > worst[1]:
            worst = (name, memo[key]["max_over_mean"])
        if worst[1] > stop:
            break
    return worst


def balanced_tiles(stored, nranks: int, budget: float | None = None, min_occ: int = 1,
                   min_tile: int = 1) -> tuple:
    """(tile, occ_tile, worst binding class max/mean there) by the rule of the module
    docstring, among occupied tiles of at least ``min_occ`` and tiles of at least
    ``min_tile``."""
    memo: dict = {}
    best, best_worst = None, math.inf
    for tile in [t for t in TILES if t >= max(min_occ, min_tile)]:
        for occ_tile in [t for t in OCC_TILES if min_occ <= t <= tile]:
            worst = worst_class(stored, tile, occ_tile, nranks, memo, stop=BALANCE, budget=budget)[1]
            if worst <= BALANCE:
                return tile, occ_tile, worst
            if worst < best_worst:
                best, best_worst = (tile, occ_tile), worst
    return (*best, best_worst)


def dominant_steps(plans) -> list:
    """The contraction steps of ``plans`` with at least DOMINANT of the largest one's
    flops, most flops first."""
    steps = sorted((s for p in plans for s in p.steps if s.kind == "contract"), key=lambda s: -s.flops)
    return [s for s in steps if s.flops >= DOMINANT * steps[0].flops] if steps else []


def granularity(plans, nranks: int, layers: int | None = None) -> dict:
    """{target, tasks_per_rank, met}: the fewest block tasks per rank of a dominant step
    of ``plans`` on ``nranks`` ranks against TASKS_PER_RANK. With ``layers`` (c: the grid
    rule of mpi-collective, whose pr x pc x c grid, not a task counter, deals the work;
    1 for summa) also ``idle_lines`` and ``busiest_over_mean`` (``grid_lines``), and
    ``met`` when no grid line idles."""
    from tessera.plan.blocktasks import task_count
    steps = dominant_steps(plans)
    fewest = min((task_count(s) for s in steps), default=0) / nranks
    out = {"target": TASKS_PER_RANK, "tasks_per_rank": fewest, "met": fewest >= TASKS_PER_RANK}
    if layers is None:
        return out
    idle, busiest = grid_lines(steps, nranks, layers)
    return {**out, "idle_lines": idle, "busiest_over_mean": busiest, "met": idle == 0}


def grid_lines(steps, nranks: int, layers: int = 1) -> tuple:
    """(grid rows, columns and layers that idle, the busiest rank's flops over the mean)
    summed and at most over contraction ``steps`` on mpi-collective's grid of ``nranks``
    ranks in ``layers`` layers (summa: 1; 2.5d: c), each on the pr x pc grid per layer of
    ``summa_layout.choose_grid`` (the executor runs one of its idle count,
    ``summa_layout.least_idle_shapes``; ``grid_score`` counts the deal of
    ``summa_layout``): output row tuples are dealt over grid rows, column tuples over grid
    columns and inner tuples (or parts of them) over the layers, so a step with fewer of
    them than grid lines idles ranks however many tasks it has."""
    from tessera.backends.summa_layout import choose_grid, grid_score
    idle, busiest = 0, 1.0
    for s in steps:
        sig = tuple((sec.irrep, sec.rows, sec.inner, sec.cols) for sec in s.sectors)
        grid = choose_grid(sig, s.perms["a"], s.perms["b"], nranks // layers, layers)
        sc = grid_score(sig, s.perms["a"], s.perms["b"], *grid, layers)
        idle += sc["idle"]
        busiest = max(busiest, sc["flops"] * nranks / s.flops if s.flops else 1.0)
    return idle, busiest


def granular_tiles(structure, nranks: int, min_occ: int, layers: int | None = None) -> tuple | None:
    """(tile, occ_tile, worst max/mean) by the rule of the module docstring: among tiles
    of at least MIN_OCC_TILE and occupied tiles of at least ``min_occ`` that balance every
    class, the largest whose dominant steps have TASKS_PER_RANK tasks per rank, else the
    ones with the most (``layers``: mpi-collective's on c layers, judged by ``grid_lines``); None when no
    such tiles balance every class."""
    memo: dict = {}
    pairs = [(tile, occ_tile) for tile in TILES if tile >= max(min_occ, MIN_OCC_TILE)
             for occ_tile in OCC_TILES if min_occ <= occ_tile <= tile]
    seen, best = set(), None
    for tile, occ_tile in pairs:
        tiling = tuple(_signature(t) for t in structure.stored(tile, occ_tile).values())
        if tiling in seen:
            continue
        seen.add(tiling)
        worst = worst_class(structure.stored, tile, occ_tile, nranks, memo, stop=BALANCE)[1]
        if worst > BALANCE:
            continue
        g = granularity(structure(tile, occ_tile).plans, nranks, layers)
        if g["met"]:
            return tile, occ_tile, worst
        rank = (g["idle_lines"], g["busiest_over_mean"]) if layers else (-g["tasks_per_rank"],)
        if best is None or rank < best[0]:
            best = (rank, tile, occ_tile, worst)
    return best and best[1:]


def run_tiles(structure, nranks: int, budget: float | None, layers: int | None = None) -> tuple:
    """(tile, occ_tile, worst, binds) of a run on ``nranks`` ranks (module docstring):
    ``binds`` is what ``binding`` then judges the run's candidates by, None (every class)
    when tiles with occupied tiles of at least min(MIN_OCC_TILE, active occupied) balance
    every class (then the tiles are ``granular_tiles``', by the grid rule with ``layers``:
    mpi-collective on c layers, ``collective_layers``), else ``budget``; then the tiles
    are the least unbalanced of those, where the classes that matter are balanced, else
    the largest at which they are."""
    if budget is None or nranks == 1:
        return (*balanced_tiles(structure.stored, nranks, budget), budget)
    floor = min(MIN_OCC_TILE, structure.nocc)
    if found := granular_tiles(structure, nranks, floor, layers):
        return (*found, None)
    *tiles, worst = balanced_tiles(structure.stored, nranks, min_occ=floor, min_tile=MIN_OCC_TILE)
    worst = worst_class(structure.stored, *tiles, nranks, budget=budget)[1]
    if worst <= BALANCE:
        return (*tiles, worst, budget)
    return (*balanced_tiles(structure.stored, nranks, budget), budget)


def collective_layers(variant: str, nranks: int) -> int:
    """The layers of mpi-collective's grid that its grid rule judges: 1 for summa, the
    executor's default for 2.5d (``runtime.distribution.default_layers``)."""
    from tessera.runtime.distribution import default_layers
    return default_layers(nranks) if variant == "2.5d" else 1


def forced_tile_warning(stored, tile: int, occ_tile: int | None, nranks: int,
                        budget: float | None = None) -> str | None:
    """One line when tiles the user gave leave a binding stored class above BALANCE, else None."""
    name, worst = worst_class(stored, tile, occ_tile or tile, nranks, budget=budget)
    if worst <= BALANCE:
        return None
    return (f"--tile {tile}: class {name} is spread over {nranks} ranks with max/mean {worst:.2f} "
            f"(above {BALANCE}); drop --tile to let Tessera choose balanced tiles")
