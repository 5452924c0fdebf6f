"""The plan of distributed (T): task tiles, windows, the tasks' order and their counts.

``kernel_plan`` sizes the kernel (whole-space or blocked in the virtual index); the
occupied task tile is chosen by one rule (``occ_tile_plan``: fewest bytes read, at least
TASKS_PER_RANK tasks per rank, one task within the budget of ``chem.triples_budget``),
for windowed tasks with their windows (``window_plan``) and by whole rows (``row_plan``,
at most ``nocc // 8``).  Windowed tasks run window by window (``window_tasks``,
``WindowTasks``: no list of every task), so consecutive tasks share their window and
mostly two of three task tiles.  ``plan_counts`` counts a run's tasks, rows read
(``window_reads``: the static deal, no steals) and bytes held from structure alone, for
``tessera plan --ranks`` and the memory estimate (``chem.memory.triples_parts``).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import OrderedDict
from functools import lru_cache

import numpy as np

from tessera.backends.machine import Machine
from tessera.chem.triples import NIRREP, SOURCES, TripleKernel, VirtualLayout, default_occ_tile, irrep_ranges
from tessera.chem.triples_blocked import DEFAULT_KERNEL_MB, blocked_batch, blocked_pool_sizes, choose_vblock
from tessera.chem.triples_budget import (DEFAULT_CACHE_MB, MIN_WINDOW, TASKS_PER_RANK, least_width, plan_seconds,
                                         stream_bytes, stream_plan, task_model, window_budget)
from tessera.chem.triples_stream import Chunks
from tessera.chem.triples_window import Windows, bytes_per_row, deal_weights, window_reads, window_width

OCC_TILE_CHOICES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48)     # occupied task tiles tried (windowed)


def kernel_plan(lay: VirtualLayout, o, v, occ_tile, resident: bool, vblock=None, kernel_mb=None) -> tuple:
    """(occ_tile, vblock, batch, kernel buffer bytes per thread) of a (T) run.  vblock None:
    the whole-space kernel (its buffers ~ batch v^3 / nirrep fit ``kernel_mb``, default
    DEFAULT_KERNEL_MB); else the kernel blocked in the virtual index (``vblock`` given, or
    the largest block that fits ``kernel_mb``)."""
    if occ_tile is None:
        nirrep = len(set(v.irreps.tolist()) | set(o.irreps.tolist())) or 1
        occ_tile = max(default_occ_tile(v.dim, nirrep), TripleKernel.batch_size(lay, o.dim))
        occ_tile = occ_tile if resident else max(1, min(occ_tile, o.dim // 8))
    budget = (DEFAULT_KERNEL_MB if kernel_mb is None else kernel_mb) * 2 ** 20
    if vblock is None:
        vblock, batch = choose_vblock(lay, occ_tile, budget)
    else:
        batch = blocked_batch(lay, vblock, occ_tile, budget)
    return int(occ_tile), vblock, batch, pool_bytes(lay, vblock, batch)


def pool_bytes(lay: VirtualLayout, vblock, batch: int, win=None, k: int | None = None) -> int:
    """Bytes of one thread's kernel buffers (whole-space kernel when ``vblock`` is None;
    ``win``: the tasks' ``Windows`` (their kernel blocks and frames); ``k``: the widest
    contracted chunk, streamed tasks)."""
    sizes = (TripleKernel.pool_sizes(lay, batch) if vblock is None
             else blocked_pool_sizes(lay, vblock, batch, win and win.blocks, k, win and win.frame_width))
    return 8 * sum(max(n, 1) for n in sizes)


def task_tiles(o, occ_tile: int) -> tuple:
    """(task tiles, their triples a >= b >= c, the triples' irreps G); a task tile is
    (start, stop, irrep, tensor tile, part or None), a run of at most ``occ_tile``
    orbitals inside one tensor tile."""
    tiles = []
    for n, tl in enumerate(o.tiles):
        for s0 in range(tl.offset, tl.offset + tl.size, occ_tile):
            s1 = min(s0 + occ_tile, tl.offset + tl.size)
            part = None if s1 - s0 == tl.size else (0, s0 - tl.offset, s1 - tl.offset)
            tiles.append((s0, s1, tl.irrep, n, part))
    triples = [(a, b, c) for a in range(len(tiles)) for b in range(a + 1) for c in range(b + 1)]
    return tiles, triples, [tiles[a][2] ^ tiles[b][2] ^ tiles[c][2] for a, b, c in triples]


def window_counts(win: Windows, tiles, triples, G) -> tuple:
    """(tasks, bytes of rows they request, the most one task holds: rows and tables, as
    many bytes again) of windowed tasks over task tiles ``tiles`` (``task_tiles``), from
    per-tile totals (``Windows.window_totals``), once per irrep and distinct set of (tensor
    tile, rows) of a triple's task tiles."""
    kinds: dict = {}                   # (G, ((tensor tile, rows, whole) of each distinct task tile)) -> triples
    for t, g in zip(triples, G):
        kind = (g, tuple(sorted((tiles[x][3], tiles[x][1] - tiles[x][0], tiles[x][4] is None) for x in set(t))))
        kinds[kind] = kinds.get(kind, 0) + 1
    ntasks = read = most = 0
    totals: dict = {}                  # (G, tensor tile) -> window_totals over G's windows
    for (g, kind), count in kinds.items():
        windows = win.windows(g)
        if not windows:
            continue
        per = np.zeros(len(windows))
        for n, rows, _ in kind:
            if (g, n) not in totals:
                totals[g, n] = win.window_totals(n, windows)
            single, pair, whole = totals[g, n]
            per += rows * (single + sum(r * (whole if w else pair)[:, m] for m, r, w in kind))
        ntasks += count * len(windows)
        read += count * int(per.sum())
        most = max(most, 2 * int(per.max()))
    return ntasks, read, most


def window_tasks(triples, G, win: Windows) -> "WindowTasks":
    """Windowed tasks (triple, window) in the order they are dealt: window by window, each
    window's occupied triples (those of its irrep) in index order, so consecutive tasks
    share their window and mostly two of three task tiles, whose rows a rank keeps."""
    by_G: dict = {}
    for t, g in enumerate(G):
        by_G.setdefault(g, []).append(t)
    return WindowTasks([(win.windows(g), by_G[g]) for g in sorted(by_G)])


class WindowTasks:
    """The windowed tasks of ``window_tasks`` without a list of them all (there are
    windows x triples, tens of millions on many ranks): ``groups`` [(windows, triple
    ids)], one per irrep G in deal order, each group's tasks window by window;
    ``tasks[i]`` is (triple, window), found from the group's start."""

    def __init__(self, groups: list):
        self.groups = groups
        self.starts = np.cumsum([0] + [len(w) * len(t) for w, t in groups]).tolist()

    def __len__(self) -> int:
        return self.starts[-1]

    def __getitem__(self, i: int) -> tuple:
        if not 0 <= i < self.starts[-1]:
            raise IndexError(f"task {i} of {self.starts[-1]}")
        k = bisect_right(self.starts, i) - 1
        windows, trips = self.groups[k]
        w, t = divmod(i - self.starts[k], len(trips))
        return trips[t], windows[w]


def task_costs(tiles, triples, tasks, ntrip, vtiles=None):
    """Per task (triple, window or None): orbital triples i >= j >= k of its task tiles
    (counted once per triple) times its virtual triples (``ntrip[G]``, or the product of
    its window tiles' sizes): tiles on the diagonal hold a sixth (three equal) or half
    (two) of the product of their sizes, so a largest-first deal ends on small tasks.
    Windowed tasks (a ``WindowTasks``): an array, a group's windows times its triples."""
    sizes = []
    for t in triples:
        i, j, k = (np.arange(*tiles[x][:2]) for x in t)
        sizes.append(int(((j[None, :, None] <= i[:, None, None]) & (k[None, None, :] <= j[None, :, None])).sum()))
    if vtiles is None:
        G = [tiles[a][2] ^ tiles[b][2] ^ tiles[c][2] for a, b, c in triples]
        return [float(sizes[t] * max(1, int(ntrip[G[t]]))) for t, _ in tasks]
    sizes = np.asarray(sizes, dtype=float)          # windowed (WindowTasks): group by group
    return np.concatenate([np.zeros(0)] + [
        np.outer([max(1, math.prod(vtiles[w][2] for w in window)) for window in windows], sizes[trips]).ravel()
        for windows, trips in tasks.groups])


def occ_tile_plan(o, budget: float, nranks: int, counts_of, occ_tile: int | None = None,
                  cap: int | None = None, usable=None) -> tuple:
    """(occ_tile, extra, (tasks, read, most)) of distributed (T) on ``nranks`` ranks, the one
    rule of its occupied task tile: ``occ_tile`` if given, else the candidate (OCC_TILE_CHOICES
    below the largest tensor tile and ``cap``, and that bound itself) whose tasks read the
    fewest bytes.  Rows of a task tile
    are read once per task that holds them, so reads fall as the task tile grows; the tile
    grows while the tasks stay at least TASKS_PER_RANK per rank and one task holds no more
    than ``budget`` (or than a one-orbital tile's task, when even that is over it).
    ``counts_of(c)``: (extra, (tasks, bytes read, the most one task holds)) of tile c;
    ``usable(extra)``: whether a tile larger than the first may be taken."""
    largest = max((tl.size for tl in o.tiles), default=1)
    largest = max(1, largest if cap is None else min(largest, cap))
    cands = [occ_tile] if occ_tile else sorted({c for c in OCC_TILE_CHOICES if c < largest} | {largest})
    best, limit = None, None
    for c in cands:
        extra, counts = counts_of(c)
        if best is not None and (counts[0] < TASKS_PER_RANK * nranks or counts[2] > limit
                                 or (usable is not None and not usable(extra))):
            break
        limit = max(budget, counts[2]) if limit is None else limit
        if best is None or counts[1] < best[2][1]:
            best = (c, extra, counts)
    return best


def window_plan(o, v, vr, orange, keys: dict, shapes: dict, vblock: int, budget: float, nranks: int,
                occ_tile: int | None = None, ranks_per_node: int | None = None, widen: bool = False) -> tuple:
    """(occ_tile, Windows, (tasks, read, most)) of windowed (T) (``occ_tile_plan``), the
    windows as wide as ``budget`` allows for each candidate task tile; a larger task tile
    only while the parts its windows cut from tensor tiles stay ``MIN_WINDOW`` wide (the
    first is taken however narrow).  ``widen`` (a given ``occ_tile`` under the default
    budget, whose floor is one-orbital tasks'): its windows no narrower than
    ``least_width`` of that tile."""
    def counts_of(c):
        tiles, triples, G = task_tiles(o, c)
        width = window_width(o, v, c, budget)
        if widen:
            width = max(width, least_width(o, v, c, nranks, ranks_per_node))
        win = Windows(o, v, vr, orange, keys, shapes, vblock, width)
        return win, window_counts(win, tiles, triples, G)
    return occ_tile_plan(o, budget, nranks, counts_of, occ_tile, usable=lambda win: win.narrowest_cut >= MIN_WINDOW)


def row_counts(o, keys: dict, shapes: dict, occ_tile: int) -> tuple:
    """(tasks, bytes of rows they request, the most one task holds) of (T) by whole rows
    with task tile ``occ_tile``: a task requests its task tiles' rows of every block whose
    first index is their tensor tile, and holds them twice (fetched and packed)."""
    tiles, triples, _ = task_tiles(o, occ_tile)
    per_row = {}
    for name in SOURCES:
        for n, ks in keys[name].items():
            per_row[n] = per_row.get(n, 0) + int(bytes_per_row(shapes[name], np.asarray(ks, dtype=np.int64)).sum())
    rows = [(t[1] - t[0]) * per_row.get(t[3], 0) for t in tiles]
    task = [sum(rows[x] for x in set(t)) for t in triples]
    return len(triples), sum(task), 2 * max(task, default=0)


def row_plan(o, keys: dict, shapes: dict, budget: float, nranks: int) -> tuple:
    """(occ_tile, None, (tasks, read, most)) of (T) by whole rows (``occ_tile_plan``); a task
    tile is at most an eighth of the occupied space, so a task's rows stay a small part of
    every tensor (module docstring); one task within ``budget`` (``window_budget``)."""
    return occ_tile_plan(o, budget, nranks, lambda c: (None, row_counts(o, keys, shapes, c)),
                         cap=max(1, o.dim // 8))


def rows_vblock(lay: VirtualLayout, o, v, keys: dict, shapes: dict, budget: float, kernel_mb=None):
    """None (distributed (T) by whole rows, the whole-space kernel) while one task of
    one-orbital task tiles by whole rows (``row_counts``) fits ``budget``: whole rows hold
    v^3 per row whatever the budget; else windowed tasks, the kernel blocked in the virtual
    index at the widest window tile a one-orbital task of that budget has
    (``window_width``), no wider than the blocked kernel's buffers at batch 1 allow
    (``kernel_mb``, default DEFAULT_KERNEL_MB)."""
    if row_counts(o, keys, shapes, 1)[2] <= budget:
        return None
    vblock = window_width(o, v, 1, budget)
    limit = (DEFAULT_KERNEL_MB if kernel_mb is None else kernel_mb) * 2**20
    while vblock > 1 and 8 * sum(blocked_pool_sizes(lay, vblock, 1, range(3))) > limit:   # 3+ window blocks
        vblock -= 1
    return vblock


def keys_by_tile(tensors: dict) -> dict:
    """{source: {occupied tensor tile: allowed keys with it first}} of the (T) operands."""
    keys = {name: {} for name in SOURCES}
    for name in SOURCES:
        for key in tensors[name].allowed_keys():
            keys[name].setdefault(key[0], []).append(key)
    return keys


def plan_counts(tensors: dict, nranks: int, cache_mb: float | None = None, kernel_mb: float | None = None,
                memory_bytes: float | None = None, ranks_per_node: int | None = None) -> dict:
    """(T) of a distributed run on ``nranks`` ranks, from structure only (``tensors``: the
    empty ovvv, t2, ovov, ovoo; ``memory_bytes``: a rank's memory budget): its tasks, the
    bytes of rows they read (windowed: ``window_reads`` of the static deal, ``deal_weights``
    with ``ranks_per_node``, the rows a rank keeps from its previous task not read again,
    no steals; by whole rows: what a task requests, a row-cached run
    reads less) and the
    most one task holds (windowed: its fetched rows and tables; else its task tiles'
    packed rows, twice: fetched and packed) and the kernel buffers of one thread, as the
    run's ``TriplesTasks`` sizes them for that plan. Depends on the tensors' spaces and
    irreps and the machine (``Machine.calibrated()``) alone, so kept by them (``tessera plan --ranks`` asks twice: for the (T) memory
    and for the task counts). Streamed tasks (``stream_plan``; ``chunks`` > 1): the most
    one holds is ``stream_bytes`` and the rows read every task's rows with the contracted
    indices whole, no rows kept between tasks (an upper bound). Also the budget of one task (``window_budget``) and the row
    cache's bytes (whole rows: the budget, at most DEFAULT_CACHE_MB unless ``cache_mb``), and
    the modelled seconds per rank (``plan_seconds`` of the plan's ``task_model``, its widest
    window tile; streamed: reads overlapping compute, ``TaskSet.lookahead``)."""
    key = (tuple((tensors[n].spaces, tensors[n].irrep) for n in SOURCES), nranks, cache_mb, kernel_mb,
           memory_bytes, ranks_per_node, Machine.calibrated())
    if key not in _PLAN_COUNTS:
        _PLAN_COUNTS[key] = _plan_counts(tensors, nranks, cache_mb, kernel_mb, memory_bytes, ranks_per_node)
        while len(_PLAN_COUNTS) > 16:
            _PLAN_COUNTS.popitem(last=False)        # the least recently used
    _PLAN_COUNTS.move_to_end(key)
    return dict(_PLAN_COUNTS[key])


# plan_counts by key (with the machine, ``Machine.calibrated()``), least recently used first
_PLAN_COUNTS: OrderedDict = OrderedDict()


def _plan_counts(tensors: dict, nranks: int, cache_mb, kernel_mb, memory_bytes, ranks_per_node) -> dict:
    o, v = tensors["t2"].spaces[0], tensors["t2"].spaces[2]
    orange, vrange = irrep_ranges(o, "occupied"), irrep_ranges(v, "virtual")
    lay = VirtualLayout(vrange, v.irreps, np.zeros(v.dim), orange)
    _, vblock, _, _ = kernel_plan(lay, o, v, None, False, kernel_mb=kernel_mb)
    keys = keys_by_tile(tensors)
    budget = window_budget(cache_mb, memory_bytes, tensors, nranks, ranks_per_node)
    streamed = stream_plan(lay, o, v, budget, nranks, ranks_per_node)
    if streamed is None:
        vblock = vblock or rows_vblock(lay, o, v, keys, tensors, budget, kernel_mb)
    chunks = 1
    if streamed is not None:              # streamed windowed tasks: each reads its rows again
        occ_tile, width, chunks = streamed
        vblock = min(vblock or width, width, int(lay.n.max()))
        win = Windows(o, v, vrange, orange, keys, tensors, vblock, width)
        tiles, triples, G = task_tiles(o, occ_tile)
        ntasks, read, _ = window_counts(win, tiles, triples, G)
        batch = kernel_plan(lay, o, v, occ_tile, False, vblock, kernel_mb)[2]
        most = stream_bytes(o.dim, v.dim, occ_tile, width, -(-int(lay.n.max()) // chunks),
                            -(-int(lay.no.max()) // chunks))
        kernel = pool_bytes(lay, vblock, batch, win, Chunks(lay, chunks).widest)
        model = task_model(o, v, occ_tile, width, chunks)
    elif vblock is None:                    # whole rows per task tile
        occ_tile, _, (ntasks, read, most) = row_plan(o, keys, tensors, budget, nranks)
        batch = min(kernel_plan(lay, o, v, None, False, kernel_mb=kernel_mb)[2], occ_tile)
        kernel = pool_bytes(lay, None, batch)
        model = task_model(o, v, occ_tile, None)
    else:
        occ_tile, win, (ntasks, _, most) = window_plan(o, v, vrange, orange, keys, tensors, vblock,
                                                       budget, nranks)
        tiles, triples, G = task_tiles(o, occ_tile)
        tasks = window_tasks(triples, G, win)
        costs = task_costs(tiles, triples, tasks, lay.ntrip, win.vtiles)
        weights = deal_weights(win, tiles, triples, tasks, costs, minimal_flops(lay, o.irreps.tolist()),
                               nranks, ranks_per_node)
        read = sum(window_reads(win, tiles, triples, tasks, weights, nranks))
        batch = kernel_plan(lay, o, v, occ_tile, False, vblock, kernel_mb)[2]
        kernel = pool_bytes(lay, vblock, batch, win)
        model = task_model(o, v, occ_tile, max(t[2] for t in win.vtiles))
    seconds = plan_seconds(o, v, model, nranks, ranks_per_node, overlapped=chunks > 1)
    return {"tasks": ntasks, "tasks_per_rank": ntasks / nranks, "read_bytes": int(read),
            "read_bytes_per_rank": read / nranks, "task_bytes": int(most), "occ_tile": int(occ_tile),
            "vblock": vblock or 0, "chunks": chunks, "kernel_bytes": int(kernel), "budget_bytes": int(budget),
            "cache_bytes": int(budget if cache_mb is not None else min(DEFAULT_CACHE_MB * 2**20, budget)),
            "seconds": seconds}


def minimal_flops(lay: VirtualLayout, irrep) -> int:
    """GEMM flops (T) needs at the least, on the block structure of ``lay`` and the
    occupied orbitals' irreps ``irrep``: for every orbital triple i >= j >= k the W0 terms
    of its distinct orbitals (12 with i > j > k, 8 with two equal, 4 with three), each
    2 x (symmetry-allowed virtual triples) x (orbitals of the contracted index's irrep):
    2 o^3 v^4 + 2 o^4 v^3 in C1 for large o."""
    n, no, npair = (a.tolist() for a in (lay.n, lay.no, lay.npair))

    @lru_cache(maxsize=None)
    def terms(gs_o, gt_o, gu_o):        # the four W0 terms whose single index is o_s's
        G, hu, ht = gs_o ^ gt_o ^ gu_o, gs_o ^ gu_o, gs_o ^ gt_o
        return 2 * sum(n[gs] * npair[G ^ gs] * (n[gs ^ hu] + n[gs ^ ht] + no[gs ^ ht] + no[gs ^ hu])
                       for gs in range(NIRREP))
    g = irrep
    below = np.zeros(NIRREP, dtype=np.int64)      # orbitals k < j per irrep
    total = 0
    for j, gj in enumerate(g):
        for i in range(j, len(g)):
            gi = g[i]
            total += (terms(gi, gi, gi) if i == j                  # k == j
                      else terms(gi, gj, gj) + terms(gj, gj, gi))
            for gk in np.flatnonzero(below).tolist():
                cost = (terms(gi, gj, gk) + terms(gj, gk, gi) + terms(gk, gi, gj) if i > j
                        else terms(gi, gj, gk) + terms(gk, gi, gj))
                total += int(below[gk]) * cost
        below[gj] += 1
    return int(total)

