"""(T) as a :class:`~tessera.backends.tasks.TaskSet`: the one driver of every backend.

The physics, the packed layouts and the kernel are ``chem.triples``' (:class:`TripleKernel`
on :class:`KernelInputs` built from :class:`RowSlab` s).  The work is split into tasks,
one per triple of occupied *task tiles* I >= J >= K; a task tile is a run of at most
``occ_tile`` orbitals inside one occupied tensor tile.  ``Context.run_tasks`` runs them
on any executor (serial, threads, or dealt over MPI ranks); partial energies are added
in task order, so the result does not depend on the schedule.

Local (resident) tensors: nothing is fetched; each task tile's RowSlab is packed once,
with its pair-swapped rows (``add_swapped``), and kept for the whole run.  Default
``occ_tile``: :func:`default_occ_tile`.

Distributed tensors: for each task tile X of a task that is not in its cache, a rank
requests only the rows x in X (a partial-block request along axis 0) of every block
whose first index is X's tensor tile: (x a|b c), t2[x, m, a, b], (x a|m b) and
(x a|m n).  It packs them into a RowSlab, drops the fetched copies, and runs the kernel;
the pair-swapped rows are made per orbital on use, in a scratch buffer.  Default
``occ_tile``: ``row_plan``, the rule of the windowed tasks below (fewest bytes read, at
least TASKS_PER_RANK tasks per rank, one task within the budget), at most ``nocc // 8``,
so a task's orbitals are a small part of the occupied space.  The rank's (T) operands
(fetched rows until packed, slabs, cache, two scratch rows; owned blocks arrive as views
and are not counted) are measured and returned.  The cache is bounded in bytes (``cache_mb``, default ``window_budget``) and at rest to
half of each tensor; before each fetch it drops least recently used slabs until cache +
the task's fetched rows + their slabs + scratch are below every whole tensor.  That is
always possible when the task alone fits: with n_S <= 3 occ_tile orbitals per task,
2 n_S + 1 rows < o, which the default gives for nocc >= 8.  With fewer occupied
orbitals (water: 5) a rank can hold as many bytes from one tensor as the whole tensor
has, and with nocc = 1 necessarily whole o-slabs.  Never o^3 v^3 or v^4 data.

Distributed tensors with the kernel blocked in the virtual index: a task is a triple of
task tiles and a window of virtual tiles (``chem.triples_window``); it requests only its
window's rows and builds them into tables (``cache_mb`` bounds one task's bytes; by
default ``window_budget``: the rank's share of the operands, so what a rank holds falls
as ranks grow, down to a floor: ``fastest_task``, at least ``task_floor``; never above
the budget of half the ranks, ``unstreamed_budget``, so it never grows with them).  The
tasks run window by window (``window_tasks``), so consecutive tasks share their window
and mostly two of three task tiles; a rank keeps the rows its previous task fetched
that its next task needs and fetches only the rest.  What a rank holds is then never
more than one task's rows and tables, the bound one task already has.  Windowed tasks
are dealt in contiguous runs of near-equal estimated time, compute and reads
(``deal_weights``), each rank running its own run first; a rank that is done steals half
of what another has left (``backends.schedule``'s ``steal``), again a contiguous run, so
a slow rank does not hold up the others and the rows stay shared along each run.
``TriplesResult.rank_runs`` says which runs each rank ran; ``sequence_reads`` what they
read.  With ``chunks`` (C > 1) a windowed task runs in C stages, each
fetching one chunk of the contracted indices (``chem.triples_stream``; the stage is
passed to need and work, ``TaskSet.stages``; C = 1: one stage, never streamed); the budget rule
streams where the budget is below the unstreamed floor (``stream_plan``).  ``plan_counts`` counts tasks and rows read (``window_reads``: the static deal,
no steals) from structure alone, for ``tessera plan --ranks``.
"""

from __future__ import annotations

import math
import threading
from bisect import bisect_right
from collections import OrderedDict
from functools import lru_cache

import numpy as np

from tessera.backends.machine import Machine
from tessera.backends.tasks import TaskSet, request_tag
from tessera.chem.triples_blocked import (DEFAULT_KERNEL_MB, BlockedTripleKernel, blocked_batch,
                                          blocked_pool_sizes, choose_vblock)
from tessera.chem.triples import (NIRREP, SOURCES, KernelInputs, RowSlab, TripleKernel, VirtualLayout,
                                  default_occ_tile, irrep_ranges)
from tessera.chem.triples_stream import Chunks, StreamTables, StreamTripleKernel, stream_requests
from tessera.chem.triples_window import (Windows, bytes_per_row, deal_weights, task_bytes,
                                         window_reads, window_tiles, window_width)
from tessera.errors import InputError
from tessera.tensor.block_tensor import allowed_elements

DEFAULT_CACHE_MB = 256     # RowSlabs of recent task tiles a rank keeps (distributed; also capped per tensor)
WINDOW_SHARE = 0.25        # windowed tasks: of a rank's memory budget, what one task may hold
TASKS_PER_RANK = 8         # windowed tasks: the fewest per rank a larger occupied task tile may leave
OCC_TILE_CHOICES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48)     # occupied task tiles tried (windowed)
# windows narrower than this many virtuals make the kernel's GEMMs small: a larger task tile
# is not taken if it narrows them below it (water tetramer cc-pVDZ (T), one rank, under
# load: windows 38 / 19 / 10 orbitals wide took 91 / 110 / 160 s)
MIN_WINDOW = 16
READ_SHARE = 0.1           # distributed (T): the time a task reads rows, at most this share of its compute
MAX_TASKS = 2**24          # distributed (T): windowed tasks at most (each rank weighs every task for the deal)
# streamed tasks (far smaller, more of them) are taken only where the rank's share of the
# operands is below this fraction of the unstreamed floor: with few ranks holding the floor
# costs little and its larger tasks run faster (water tetramer cc-pVDZ (T) on 2 ranks,
# idle: streamed, 13440 tasks, 61.9 s; unstreamed 10.6 s)
STREAM_BELOW = 8
# (T) plans whose modelled seconds per rank differ by less than this share count as equal
# (the budget rule then takes the one holding least): the model's constants, measured on
# a shared machine, are no more precise (o=40, v=152, tile 32, 64 ranks of a node:
# one-orbital windows 28.03 s, 210 MiB, against whole rows 27.99 s, 257 MiB)
SECONDS_TIE = 0.01
STREAM_CHUNK = 16          # streamed (T) tasks: the narrowest chunk of a contracted index (the GEMMs' k)
STREAM_TILES = (1, 2, 3, 4, 6, 8)     # streamed (T) tasks: occupied task tiles tried


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


def window_budget(cache_mb: float | None, memory_bytes: float | None, tensors: dict, nranks: int,
                  ranks_per_node: int | None = None) -> float:
    """Bytes one distributed (T) task may hold (windowed: its rows and tables; by whole
    rows: its rows, and the row cache): ``cache_mb`` when given, else ``unstreamed_budget``
    -- or, where the rank's share of the operands is below 1/STREAM_BELOW of the
    unstreamed floor (``task_floor``), ``stream_floor`` (streamed tasks, set by the machine
    alone) when it is less, but not below that share."""
    if cache_mb is not None:
        return cache_mb * 2**20
    budget, share = unstreamed_budget(memory_bytes, tensors, nranks, ranks_per_node)
    o, v = tensors["t2"].spaces[0], tensors["t2"].spaces[2]
    if STREAM_BELOW * share >= task_floor(o, v, nranks, ranks_per_node):
        return budget
    streamed = stream_floor(o, v, nranks, ranks_per_node)
    return budget if streamed is None else min(budget, max(streamed[2], share))


def unstreamed_budget(memory_bytes: float | None, tensors: dict, nranks: int,
                      ranks_per_node: int | None = None) -> tuple:
    """(bytes one unstreamed (T) task may hold, the rank's share of the (T) operands
    ``tensors``: ovvv, t2, ovov, ovoo, every allowed element over ``nranks``): the share,
    so it falls as ranks grow, but never below what the task of fewest modelled seconds
    per rank holds among those within the cap (``fastest_task``) nor below ``task_floor``,
    and never above WINDOW_SHARE of the rank's memory budget ``memory_bytes`` (at least
    DEFAULT_CACHE_MB) -- nor above this budget on half the ranks of the same machine
    (nranks // 2, down to one rank), so it never grows with the rank count: the floors
    rise where reads get dearer (between nodes the bandwidth per rank falls, so the
    least task within READ_SHARE is larger), and without that bound a rank held more on
    several nodes than on one ((H2O)12 cc-pVDZ, tile 32, 64-rank nodes: 760 MiB on 64
    ranks, 1435 MiB on 256); with it the larger run takes the windows of the smaller
    one's budget and reads more per flop.  Streamed budgets (``window_budget``) are not
    carried up: between nodes no streamed task meets READ_SHARE, and unstreamed tasks
    that small read far more ((H2O)8 cc-pVDZ at tile 12 on 1008 ranks: 29.5 MiB windows,
    7.07 GiB read per rank, against 210 MiB, 0.46 GiB)."""
    base = DEFAULT_CACHE_MB * 2**20
    cap = base if memory_bytes is None else max(base, WINDOW_SHARE * memory_bytes)
    share = 8 * sum(allowed_elements(tensors[s].spaces, tensors[s].irrep) for s in SOURCES) / nranks
    o, v = tensors["t2"].spaces[0], tensors["t2"].spaces[2]
    least = max(task_floor(o, v, nranks, ranks_per_node), fastest_task(o, v, nranks, ranks_per_node, cap) or 0.0)
    budget = min(cap, max(least, share))
    if nranks >= 2:
        budget = min(budget, unstreamed_budget(memory_bytes, tensors, nranks // 2, ranks_per_node)[0])
    return budget, share


@lru_cache(maxsize=256)
def task_candidates(o, v, nranks: int, ranks_per_node: int | None = None) -> list:
    """``task_model`` s of the unstreamed distributed (T) tasks the budget rule weighs: the
    one-orbital windowed task of ``least_width`` and the tasks by whole rows of each task
    tile ``row_plan`` may take (at most nocc // 8, larger than one orbital only while the
    tasks stay TASKS_PER_RANK per rank).  Kept by their arguments (``unstreamed_budget``
    asks at every halving of the rank count; the machine calibration is fixed for a
    process)."""
    nocc = o.dim
    rows = [r for r in range(1, max(1, nocc // 8) + 1)
            if r == 1 or (-(-nocc // r)) ** 3 / 6 >= TASKS_PER_RANK * nranks]
    return ([task_model(o, v, 1, least_width(o, v, 1, nranks, ranks_per_node))]
            + [task_model(o, v, r, None) for r in rows])


def task_floor(o, v, nranks: int, ranks_per_node: int | None = None) -> float:
    """The least bytes a distributed (T) task over spaces o, v is given, what the budget
    rule holds where the memory cap forces it (``window_budget``): of ``task_candidates``,
    the one that holds least among those whose ``read_share`` (bytes and requests) is
    within READ_SHARE, or, where none is, the one of least share: a task too small to pay
    for its requests (H2O2 6-31G: whole rows ask for 4 blocks per task, a window spanning v
    for 17: whole rows).  Set by o, v, the tiles and the machine, not by the rank count
    alone but for that task count; where reads are dear (between nodes) it reaches the cap
    of ``window_budget``."""
    shares = [(read_share(m, nranks, ranks_per_node), m[3]) for m in task_candidates(o, v, nranks, ranks_per_node)]
    within = [held for share, held in shares if share <= READ_SHARE]
    return min(within) if within else min(shares)[1]


def fastest_task(o, v, nranks: int, ranks_per_node: int | None, cap: float):
    """Bytes held by the one of ``task_candidates`` holding at most ``cap`` whose run takes
    the fewest modelled seconds per rank (``plan_seconds``; within SECONDS_TIE of the
    fewest: the one holding least), or None where none fits: where the memory budget allows larger tasks than the
    floor, fewer of them pay less Python work and read less (water tetramer cc-pVDZ, tile
    48, 2 ranks: whole rows of task tile 2, 220 tasks, not task tile 1, 1,540 tasks)."""
    fits = [(plan_seconds(o, v, m, nranks, ranks_per_node), m[3])
            for m in task_candidates(o, v, nranks, ranks_per_node) if m[3] <= cap]
    if not fits:
        return None
    fewest = min(fits)[0]
    return min(held for seconds, held in fits if seconds <= (1 + SECONDS_TIE) * fewest)


def plan_seconds(o, v, model: tuple, nranks: int, ranks_per_node: int | None = None) -> float:
    """Modelled seconds per rank of distributed (T) run as tasks like ``model``
    (``task_model``): (T)'s 2 o^3 v^3 (v + o) flops (C1) over the task's give the tasks,
    each taking its flops at the calibrated GEMM rate, its reads (as ``read_share``: bytes
    at the bandwidth, one get latency per request) and one ``Machine.triples_task_seconds``
    of Python work; dealt over ``nranks``, the busiest rank ends at most one task after
    the mean (Graham's bound of a list schedule, Bell Syst. Tech. J. 45, 1563 (1966)), so
    the mean plus one task (larger tasks balance worse: (H2O)8 cc-pVDZ on 64 ranks keeps
    one-orbital windowed tasks, 210 MiB, not whole rows of task tile 2, 513 MiB)."""
    flops, read, asks, _ = model
    machine = Machine.calibrated()
    on = machine.on(nranks, ranks_per_node or nranks)
    tasks = 2 * o.dim ** 3 * v.dim ** 3 * (v.dim + o.dim) / flops
    task = (flops / machine.gemm_flops_per_second + read / on["bandwidth"] + asks * on["t_get"]
            + machine.triples_task_seconds)
    return (tasks / nranks + 1) * task


def least_width(o, v, occ_tile: int, nranks: int, ranks_per_node: int | None = None) -> int:
    """The narrowest window tile (orbitals, at least MIN_WINDOW, at most v) at which an
    unstreamed windowed task of task tile ``occ_tile`` keeps its ``read_share`` within
    READ_SHARE and the tasks (one per occupied orbital triple of task tiles and window, C1
    count) are at most MAX_TASKS; where none does, the width of least share (reads and
    requests grow as w^2, compute as w^3: the widest).  A task tile given under the
    default budget takes windows no narrower (``window_plan``)."""
    nocc, nvir = o.dim, v.dim
    vr = irrep_ranges(v, "virtual")
    irel = [tl.offset - int(vr[tl.irrep, 0]) for tl in v.tiles]
    triples = (-(-nocc // occ_tile)) ** 3 / 6
    best = None
    for width in range(min(MIN_WINDOW, nvir), nvir + 1):
        n = len(window_tiles(v, irel, width)[0])
        if triples * n * (n + 1) * (n + 2) / 6 > MAX_TASKS:
            continue
        share = read_share(task_model(o, v, occ_tile, width), nranks, ranks_per_node)
        if share <= READ_SHARE:
            return width
        if best is None or share < best[0]:
            best = (share, width)
    return nvir if best is None else best[1]


def task_model(o, v, occ_tile: int, width: int | None, chunks: int = 1) -> tuple:
    """(flops, bytes read, requests, bytes held) of one distributed (T) task of task tile r
    = ``occ_tile`` as it runs among others (C1; tensor tiles of o and v at their mean
    size): (T)'s 2 o^3 v^3 (v + o) flops over (o/r)^3 / 6 triples of task tiles and
    n (n + 1) (n + 2) / 6 windows of n = v / ``width`` window tiles (72 r^3 width^3 (v + o)
    for many), w = 3 width orbitals a window (at most v); ``width`` None: by whole rows, n = 1.
    Unstreamed, consecutive tasks share two of three task tiles, so a task reads one
    tile's rows (w^2 v + o w^2 doubles each: (x p|q f), t2[x m p q]) and five r x r pairs
    (w v + w o + w^2 each: t2[x y p f], (x p|y m), (x p|y q)), one request per block
    part: n_w^2 (n_v + n_o) and five times n_w (n_v + n_o) + n_w^2, n_w the blocks or
    parts of blocks a window spans on a virtual axis; by whole rows one tile's rows, v^3 +
    2 o v^2 + o^2 v doubles, n_v^3 + 2 n_o n_v^2 + n_o^2 n_v blocks.  Streamed in ``chunks``
    C > 1 stages (``chem.triples_stream``): every tile and pair read again, the f and m
    axes in C + n_v - 1 and C + n_o - 1 parts.  Held: ``task_bytes`` (whole rows: 3 r rows,
    fetched and packed; streamed: ``stream_bytes``)."""
    nocc, nvir = o.dim, v.dim
    n_o, n_v = max(1, len(o.tiles)), max(1, len(v.tiles))
    r, R = occ_tile, min(3 * occ_tile, nocc)
    w = nvir if width is None else min(3 * width, nvir)
    n = 1 if width is None else -(-nvir // width)
    flops = 12 * r ** 3 * nvir ** 3 * (nvir + nocc) / (n * (n + 1) * (n + 2) / 6)
    if width is None:
        row = nvir ** 3 + 2 * nocc * nvir ** 2 + nocc ** 2 * nvir
        return flops, 8 * r * row, n_v ** 3 + 2 * n_o * n_v ** 2 + n_o ** 2 * n_v, 2 * 8 * R * row
    n_w = w / min(width, nvir / n_v)
    if chunks == 1:
        read = 8 * (r * (w * w * nvir + nocc * w * w) + 5 * r * r * w * (nvir + nocc + w))
        asks = n_w * n_w * (n_v + n_o) + 5 * (n_w * (n_v + n_o) + n_w * n_w)
        return flops, read, asks, task_bytes(nocc, nvir, r, width)
    f, m = chunks + n_v - 1, chunks + n_o - 1
    read = 8 * (3 * r * (w * w * (nvir + nocc)) + 9 * r * r * w * (nvir + nocc + w))
    asks = 3 * n_w * n_w * (f + m) + 9 * (n_w * (f + m) + n_w * n_w)
    nv, no = -(-nvir // chunks), -(-nocc // chunks)
    return flops, read, asks, stream_bytes(nocc, nvir, r, width, nv, no)


def read_share(model: tuple, nranks: int, ranks_per_node: int | None = None) -> float:
    """Seconds a task (``task_model``) spends reading, its bytes at the bandwidth of
    ``nranks`` ranks ``ranks_per_node`` (default: all) to a node and one get latency per
    request (``Machine.on``), per second of its compute at the calibrated GEMM rate: what
    READ_SHARE bounds."""
    flops, read, asks, _ = model
    machine = Machine.calibrated()
    on = machine.on(nranks, ranks_per_node or nranks)
    return (read / on["bandwidth"] + asks * on["t_get"]) / (flops / machine.gemm_flops_per_second)


def stream_bytes(nocc: int, nvir: int, occ_tile: int, width: int, cv: int, co: int) -> float:
    """Bytes a streamed task (``chem.triples_stream``) holds at most (C1): one stage's rows,
    fetched and tabled, 3 r rows of w^2 (c_v + c_o) + Y w (c_v + c_o) + Y w^2 doubles (r
    ``occ_tile``, Y = 3 r, windows of three tiles ``width`` wide, w = 3 width, at most
    v; chunks c_v, c_o), and W of its orbital triples, r^3 w^3 doubles: no term in o or v."""
    w, Y, r = min(3 * width, nvir), min(3 * occ_tile, nocc), occ_tile
    return 8 * (2 * 3 * r * (w * w * (cv + co) + Y * w * (cv + co) + Y * w * w) + r ** 3 * w ** 3)


def stream_floor(o, v, nranks: int, ranks_per_node: int | None = None):
    """(occ_tile, width, bytes) of the streamed task that holds least (``stream_bytes``,
    chunks STREAM_CHUNK wide) among those whose reads take at most READ_SHARE of their
    compute at the calibrated GEMM rate and bandwidth (as ``task_floor``): a streamed task
    rereads its rows each task, 8 x 27 r wd (wd + r)(v + o) bytes for 72 r^3 wd^3 (v + o)
    flops (C1), r^2 wd^2 / (3 (wd + r)) flops per byte whatever o and v; windows at least
    MIN_WINDOW wide, at most MAX_TASKS tasks. None when none meets it (between nodes)."""
    nocc, nvir = o.dim, v.dim
    machine = Machine.calibrated()
    balance = machine.gemm_flops_per_second / machine.on(nranks, ranks_per_node or nranks)["bandwidth"] / READ_SHARE
    largest = max((tl.size for tl in o.tiles), default=1)
    best = None
    for r in (r for r in STREAM_TILES if r <= largest):
        tasks = -(-nocc // r) ** 3 / 6
        for width in range(min(MIN_WINDOW, nvir), nvir + 1):
            if r * r * width * width < 3 * balance * (width + r) or tasks * (-(-nvir // width)) ** 3 / 6 > MAX_TASKS:
                continue
            held = stream_bytes(nocc, nvir, r, width, min(STREAM_CHUNK, nvir), min(STREAM_CHUNK, nocc))
            if best is None or held < best[2]:
                best = (r, width, held)
            break                      # wider windows hold more
    return best


def stream_plan(lay: VirtualLayout, o, v, budget: float, nranks: int, ranks_per_node: int | None = None,
                occ_tile: int | None = None):
    """(occ_tile, width, chunks) of streamed (T) tasks, or None (unstreamed): streamed when
    ``budget`` is below the unstreamed floor (``task_floor``) and a streamed task fits it
    in the fewest chunks (C > 1) whose ``stream_bytes`` fit: the task of ``stream_floor``
    where it holds less than that floor; else one-orbital tasks of the widest windows (at
    most MIN_WINDOW) that fit, where their ``read_share`` is less than that of the
    one-orbital unstreamed tasks of the budget (``window_width``): a streamed task reads
    its rows again each task and asks for them in parts, but its windows are wider, its
    compute per task larger (H2O2 6-31G at 41.9 kB: unstreamed windows 1 orbital wide,
    75,075 tasks; streamed 3 wide in 7 chunks, 5,775 tasks). A given ``occ_tile`` is the
    task tile of every candidate."""
    floor = task_floor(o, v, nranks, ranks_per_node)
    if budget >= floor:
        return None
    nv, no = int(lay.n.max()), int(lay.no.max())

    def fewest(r, width):                 # the fewest chunks (2+) in which the task fits the budget
        return next((count for count in range(2, max(nv, no) + 1)
                     if stream_bytes(o.dim, v.dim, r, width, -(-nv // count), -(-no // count)) <= budget), None)
    balanced = stream_floor(o, v, nranks, ranks_per_node)
    if balanced is not None and balanced[2] < floor:
        r, width = occ_tile or balanced[0], balanced[1]
        count = fewest(r, width)
        if count is not None:
            return r, width, count
    r = occ_tile or 1
    plain = read_share(task_model(o, v, r, window_width(o, v, r, budget)), nranks, ranks_per_node)
    for width in range(min(MIN_WINDOW, v.dim), 1, -1):
        count = fewest(r, width)
        if count is not None:
            better = read_share(task_model(o, v, r, width, count), nranks, ranks_per_node) < plain
            return (r, width, count) if better else None
    return None


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
    irreps alone, so kept by them (``tessera plan --ranks`` asks twice: for the (T) memory
    and for the task counts). Streamed tasks (``stream_plan``; ``chunks`` > 1): the most
    one holds is ``stream_bytes`` and the rows read every task's rows with the contracted
    indices whole, no rows kept between tasks (an upper bound). Also the budget of one task (``window_budget``) and the row
    cache's bytes (whole rows: the budget, at most DEFAULT_CACHE_MB unless ``cache_mb``)."""
    key = (tuple((tensors[n].spaces, tensors[n].irrep) for n in SOURCES), nranks, cache_mb, kernel_mb,
           memory_bytes, ranks_per_node)
    if key not in _PLAN_COUNTS:
        _PLAN_COUNTS[key] = _plan_counts(tensors, nranks, cache_mb, kernel_mb, memory_bytes, ranks_per_node)
        while len(_PLAN_COUNTS) > 16:
            _PLAN_COUNTS.popitem(last=False)        # the least recently used
    _PLAN_COUNTS.move_to_end(key)
    return dict(_PLAN_COUNTS[key])


# plan_counts by key, least recently used first (the machine calibration is fixed for a process)
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
    elif vblock is None:                    # whole rows per task tile
        occ_tile, _, (ntasks, read, most) = row_plan(o, keys, tensors, budget, nranks)
        batch = min(kernel_plan(lay, o, v, None, False, kernel_mb=kernel_mb)[2], occ_tile)
        kernel = pool_bytes(lay, None, batch)
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
    return {"tasks": ntasks, "tasks_per_rank": ntasks / nranks, "read_bytes": int(read),
            "read_bytes_per_rank": read / nranks, "task_bytes": int(most), "occ_tile": int(occ_tile),
            "vblock": vblock or 0, "chunks": chunks, "kernel_bytes": int(kernel), "budget_bytes": int(budget),
            "cache_bytes": int(budget if cache_mb is not None else min(DEFAULT_CACHE_MB * 2**20, budget))}


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


class _Ledger:
    """Bytes held per source tensor now, and the peaks (total and per source)."""

    def __init__(self):
        self.now = dict.fromkeys(SOURCES + ("W",), 0)       # W: a streamed task's accumulated W
        self.peak = 0
        self.peak_by = dict.fromkeys(SOURCES + ("W",), 0)

    def add(self, nbytes: dict, sign: int = 1) -> None:
        for s, b in nbytes.items():
            self.now[s] += sign * b
            if sign > 0:
                self.peak_by[s] = max(self.peak_by[s], self.now[s])
        if sign > 0:
            self.peak = max(self.peak, sum(self.now.values()))


class TriplesTasks:
    """Task tiles, tasks, their requests and work; the executor decides who runs what.
    ``work`` and ``need`` are thread-safe (one lock for cache, ledger and flops; kernel
    buffers per thread)."""

    def __init__(self, ints, t1, t2, occ_tile, cache_mb, resident: bool, vblock=None, kernel_mb=None,
                 nranks: int = 1, memory_bytes: float | None = None, ranks_per_node: int | None = None,
                 chunks: int | None = None):
        o, v = ints.o, ints.v
        self.ranks_per_node = ranks_per_node
        self.o, self.v, self.resident = o, v, resident
        self.tensors = dict(zip(SOURCES, (ints.ovvv, t2, ints.ovov, ints.ovoo)))
        self.source_of = {t.uid: name for name, t in self.tensors.items()}
        orange, vrange = irrep_ranges(o, "occupied"), irrep_ranges(v, "virtual")
        self.lay = lay = VirtualLayout(vrange, v.irreps, np.asarray(ints.ev, float)[v.orbitals], orange)
        self.eo = np.asarray(ints.eo, float)[o.orbitals]
        self.t1d = t1.to_dense()[np.ix_(o.orbitals, v.orbitals)]        # in space positions
        self.irrep = o.irreps.tolist()
        self.occ_tile, self.vblock, self.batch, self.pool_bytes = kernel_plan(
            lay, o, v, occ_tile, resident, vblock, kernel_mb)
        self.keys = keys_by_tile(self.tensors)
        # a task: a triple of task tiles and, when the operands are fetched by virtual tile
        # (distributed tensors, blocked kernel: chem.triples_window), one window; then the
        # task tile and the windows come from the bytes one task may hold (window_plan)
        # (whole rows: the task tile from the same budget, the kernel's batch no larger)
        self.windows = None
        budget = None if resident else window_budget(cache_mb, memory_bytes, self.tensors, nranks, ranks_per_node)
        streamed = None if resident or chunks else stream_plan(lay, o, v, budget, nranks, ranks_per_node, occ_tile)
        if not resident and streamed is None and self.vblock is None:   # whole rows only while one task fits
            self.vblock = rows_vblock(lay, o, v, self.keys, self.tensors, budget, kernel_mb)
        if streamed is not None:         # the budget's streamed tasks (stream_plan)
            occ, width, chunks = streamed
            self.vblock = min(self.vblock or width, width, int(lay.n.max()))
            self.windows = Windows(o, v, lay.vr, orange, self.keys, self.tensors, self.vblock, width)
            self.occ_tile, _, self.batch, _ = kernel_plan(lay, o, v, occ, resident, self.vblock, kernel_mb)
        elif not resident and self.vblock is not None:
            occ, self.windows, _ = window_plan(o, v, lay.vr, orange, self.keys, self.tensors, self.vblock,
                                               budget, nranks, occ_tile, ranks_per_node,
                                               widen=occ_tile is not None and cache_mb is None)
            self.occ_tile, _, self.batch, _ = kernel_plan(lay, o, v, occ, resident, self.vblock, kernel_mb)
            self.pool_bytes = pool_bytes(lay, self.vblock, self.batch, self.windows)
        # windowed tasks in stages, the contracted f and m in chunks (chem.triples_stream);
        # chunks 1 (given or chosen): one stage, f and m whole
        if chunks and chunks > 1 and self.windows is None:
            raise InputError(f"chunks={chunks} streams windowed (T) tasks, which need distributed tensors and the "
                             "kernel blocked in the virtual index; " + (
                                 "these tensors are local: drop chunks" if resident else
                                 "the whole-space kernel fits here: give vblock too, or drop chunks"))
        self.stream = Chunks(lay, chunks or 1) if self.windows is not None else None
        self.stage_requests: dict = {}                   # streamed: (task, stage) -> its requests (need)
        self.acc: dict = {}                              # streamed: task -> W of its block triples
        if self.stream is not None:
            self.pool_bytes = pool_bytes(lay, self.vblock, self.batch, self.windows, self.stream.widest)
        elif not resident and occ_tile is None and self.windows is None:
            self.occ_tile, _, _ = row_plan(o, self.keys, self.tensors, budget, nranks)
            self.batch = min(self.batch, self.occ_tile)
            self.pool_bytes = pool_bytes(lay, None, self.batch)
        if cache_mb is None and budget is not None:      # the row cache (whole rows): within the budget
            cache_mb = min(DEFAULT_CACHE_MB, budget / 2**20)
        self.tiles, self.triples, self.G = task_tiles(o, self.occ_tile)
        for G in sorted(set(self.G)) if self.vblock is None else ():    # maps of the whole-space kernel
            lay.prepare(G)
        self._budget(cache_mb)
        self.tasks = ([(t, None) for t in range(len(self.triples))] if self.windows is None else
                      window_tasks(self.triples, self.G, self.windows))
        self.read: dict = {}                             # windowed task -> bytes of rows it read
        self.runs: list = []                             # windowed: [start, stop) of the tasks run here, in order
        self.kept: dict = {}                             # windowed: the previous task's rows (tag -> rows)
        self.cache: OrderedDict = OrderedDict()          # task tile -> RowSlab
        self.cached = dict.fromkeys(SOURCES, 0)
        self.held = _Ledger()
        self.scratch = None
        if not resident and self.vblock is None:         # pair-swapped rows made on access
            self.held.add(self.scratch_bytes)
            self.scratch = tuple(np.empty(self.scratch_bytes[s] // 8) for s in ("ovvv", "t2"))
        self.lock = threading.Lock()
        self.local = threading.local()                   # the kernel's buffers, one set per thread
        self.flops = 0

    # ------------------------------------------------------------------ sizes
    def _row_elements(self, g: int) -> dict:
        """Elements of one packed row (an occupied orbital of irrep g) of each source."""
        lay, r = self.lay, range(NIRREP)
        return {"ovvv": int(sum(lay.n[h] * lay.npair[g ^ h] for h in r)),
                "t2": int(sum(lay.no[h] * lay.npair[g ^ h] for h in r)),
                "ovov": int(sum(lay.no[h] * lay.npair[g ^ h] for h in r)),
                "ovoo": int(sum(lay.no[h] * lay.nvo[g ^ h] for h in r))}

    def _budget(self, cache_mb) -> None:
        """Bytes per task tile and source, scratch rows, whole tensors; ``bounded``: even a
        task that fetches all its rows stays below every whole tensor; the cache limits
        (none for resident tensors: every slab is kept)."""
        rows = {g: self._row_elements(g) for g in set(self.irrep)}
        self.tile_bytes = [{s: 8 * (t[1] - t[0]) * rows[t[2]][s] for s in SOURCES} for t in self.tiles]
        self.scratch_bytes = {s: 0 for s in SOURCES}
        for s in ("ovvv", "t2"):
            self.scratch_bytes[s] = 8 * max(r[s] for r in rows.values())
        self.whole = {s: int(t.nbytes) for s, t in self.tensors.items()}
        self.worst = {s: 2 * sum(sorted(tb[s] for tb in self.tile_bytes)[-3:]) + self.scratch_bytes[s]
                      for s in SOURCES}
        self.bounded = all(self.worst[s] < self.whole[s] for s in SOURCES)
        self.cache_limit = int((DEFAULT_CACHE_MB if cache_mb is None else cache_mb) * 2 ** 20)
        self.cache_cap = {s: min(self.whole[s] // 2, self.whole[s] - self.scratch_bytes[s] - 1)
                          for s in SOURCES}

    def minimal_flops(self) -> int:
        """``minimal_flops`` of this run's block structure."""
        return minimal_flops(self.lay, self.irrep)

    # ------------------------------------------------------------------ tasks
    def task_set(self, nranks: int) -> TaskSet:
        costs = self.costs()
        chunk = max(1, min(8, len(costs) // (4 * nranks)))
        if self.resident:        # packed once, before any worker starts: forked workers share them
            self._resident_slabs(range(len(self.tiles)))
        deal = {}
        if self.windows is not None:
            # contiguous runs of near-equal time (``deal_weights``), so a rank's consecutive
            # tasks share rows (``need``); a rank that has run its own steals half of what
            # another has left, a contiguous run too (``backends.schedule``: steal)
            costs = deal_weights(self.windows, self.tiles, self.triples, self.tasks, costs,
                                 self.minimal_flops(), nranks, self.ranks_per_node)
            deal = {"schedule": "steal", "partition": "contiguous"}
        # packed batches run wholly in C with the GIL released (triples_native.batch_packed):
        # threads share the slabs, where forked workers would fault in copies of them
        packed = self.vblock is None and len(set(self.lay.irrep.tolist())) > 1
        return TaskSet("(T) triples", costs, self.work, self.need, chunk, flops=lambda: self.flops,
                       progress=True, forkable=self.resident and not packed, add_flops=self._add_flops,
                       stages=self.stream.count if self.stream is not None else 1, **deal)

    def _add_flops(self, n: int) -> None:
        with self.lock:
            self.flops += n

    def costs(self) -> list:
        """Per task: ``task_costs``."""
        return task_costs(self.tiles, self.triples, self.tasks, self.lay.ntrip,
                          self.windows.vtiles if self.windows is not None else None)

    def need(self, task: int, stage: int = 0) -> list:
        """Rows of the blocks of the task's uncached task tiles (partial requests); first
        drops cached slabs (least recently used, not the task's) until what arrives fits.
        Nothing for resident tensors; for a windowed task, its window's rows that the
        rank's previous task did not fetch (those it did are kept, the rest dropped): a
        rank calls need(i) then work(i) for one task after another (``dist_base.run_tasks``);
        streamed, need(i, s) then work(i, blocks, s) for each stage s (``TaskSet.stages``)."""
        t, window = self.tasks[task]
        if self.resident or not self.lay.ntrip[self.G[t]]:
            return []
        wanted = sorted(set(self.triples[t]))
        if self.stream is not None:
            return self._stream_need(task, stage, wanted, window)
        with self.lock:
            new = [x for x in wanted if x not in self.cache]
            room = {s: 2 * sum(self.tile_bytes[x][s] for x in new) + self.scratch_bytes[s] for s in SOURCES}
            self._evict(lambda: any(self.cached[s] + room[s] >= self.whole[s] for s in SOURCES), wanted)
        out = []
        for x in new:
            n, part = self.tiles[x][3], self.tiles[x][4]
            for name, t in self.tensors.items():
                out += [(t, key) if part is None else (t, key, part) for key in self.keys[name].get(n, ())]
        return out

    def _evict(self, over, keep) -> None:
        """Drop least recently used slabs not in ``keep`` while ``over()`` (lock held)."""
        for y in [y for y in self.cache if y not in keep]:
            if not over():
                return
            del self.cache[y]
            for s in SOURCES:
                self.cached[s] -= self.tile_bytes[y][s]
            self.held.add(self.tile_bytes[y], -1)

    def _slab(self, x: int, blocks: dict) -> RowSlab:
        """Task tile x packed from ``blocks`` (fetched rows) or, resident, from the tensors'
        blocks (views of the rows), with the pair-swapped rows."""
        s0, s1, _, n, part = self.tiles[x]
        parts = {}
        for name, t in self.tensors.items():
            rows = []
            for key in self.keys[name].get(n, ()):
                if self.resident:
                    blk = t.blocks.get(key)
                    if blk is not None:
                        rows.append((key, blk if part is None else blk[part[1]:part[2]]))
                else:
                    rows.append((key, blocks[(t.uid, key) if part is None else (t.uid, key, part)]))
            parts[name] = rows
        slab = RowSlab.from_blocks(self.lay, self.o, self.v, s0, s1, parts)
        return slab.add_swapped(self.lay) if self.resident and self.vblock is None else slab

    def _admit(self, x: int, slab: RowSlab, keep) -> bool:
        """Put a new slab into the cache, dropping least recently used slabs (never one of
        ``keep``) while over a limit; False when it does not fit (the task drops it)."""
        over = (lambda: sum(self.cached.values()) > self.cache_limit
                or any(self.cached[s] > self.cache_cap[s] for s in SOURCES))
        self.cache[x] = slab
        for s in SOURCES:
            self.cached[s] += self.tile_bytes[x][s]
        self._evict(over, keep)
        if over():
            del self.cache[x]
            for s in SOURCES:
                self.cached[s] -= self.tile_bytes[x][s]
            return False
        return True

    def _resident_slabs(self, wanted) -> dict:
        """Slabs of resident task tiles, packed on first use and kept."""
        with self.lock:
            for x in wanted:
                if x not in self.cache:
                    self.cache[x] = self._slab(x, {})
            return {x: self.cache[x] for x in wanted}

    def _fetched_slabs(self, wanted, blocks: dict) -> tuple:
        """(slabs, task tiles to drop after the task) from cache and fetched rows."""
        with self.lock:
            fetched = dict.fromkeys(SOURCES, 0)     # copies that arrived (owned blocks come as views)
            for k, arr in blocks.items():
                name = self.source_of[k[0]]
                if k[1] not in self.tensors[name].blocks:
                    fetched[name] += arr.nbytes
            self.held.add(fetched)
            slabs, new = {}, []
            for x in wanted:
                slab = self.cache.get(x)
                if slab is None:
                    slab = self._slab(x, blocks)
                    self.held.add(self.tile_bytes[x])
                    new.append(x)
                else:
                    self.cache.move_to_end(x)
                slabs[x] = slab
            blocks.clear()                   # the fetched rows are packed: let them go
            self.held.add(fetched, -1)
            return slabs, [x for x in new if not self._admit(x, slabs[x], wanted)]

    def work(self, task: int, blocks: dict, stage: int = 0) -> float:
        t, window = self.tasks[task]
        a, b, c = self.triples[t]
        G = self.G[t]
        if window is not None and stage == 0:
            with self.lock:
                if self.runs and self.runs[-1][1] == task:
                    self.runs[-1][1] += 1
                else:
                    self.runs.append([task, task + 1])
        if not self.lay.ntrip[G]:
            return 0.0
        wanted = sorted({a, b, c})
        if self.stream is not None:
            return self._stream_work(task, stage, wanted, blocks)
        if self.resident:
            slabs, transient = self._resident_slabs(wanted), []
        else:
            slabs, transient = self._fetched_slabs(wanted, blocks)
        inp = KernelInputs.from_slabs(self.lay, self.eo, self.t1d, self.irrep, slabs.values(),
                                      scratch=self.scratch)
        kern = (TripleKernel(inp, G, self._pool(), self.batch) if self.vblock is None
                else BlockedTripleKernel(inp, G, self._pool(), self.batch, self.vblock))
        I, J, K = (self.tiles[x][:2] for x in (a, b, c))
        energy = kern.tile_energy(I, J, K)
        with self.lock:
            self.flops += kern.flops
            for x in transient:
                self.held.add(self.tile_bytes[x], -1)
        return energy

    def _pool(self) -> list:
        """The kernel's buffers of this thread."""
        if not hasattr(self.local, "pool"):
            self.local.pool = (TripleKernel.new_pool(self.lay, self.batch) if self.vblock is None
                               else BlockedTripleKernel.new_pool(self.lay, self.vblock, self.batch,
                                                                 self.windows and self.windows.blocks,
                                                                 self.stream and self.stream.widest,
                                                                 self.windows and self.windows.frame_width))
        return self.local.pool

    def _drop_kept(self, tag) -> None:
        """Let a kept row go (lock held)."""
        arr, name, copy = self.kept.pop(tag)
        self.held.add({name: arr.nbytes if copy else 0}, -1)

    def _keep(self, tag, name: str, key, blocks: dict) -> tuple:
        """(rows, bytes that arrived) of request ``tag``: arrived in ``blocks`` (kept for the
        rank's next task or stage; a copy's bytes go to the ledger by the caller) or kept."""
        with self.lock:
            if tag not in blocks:
                return self.kept[tag][0], 0
            arr = blocks.pop(tag)
            copy = key not in self.tensors[name].blocks          # owned blocks arrive as views
            nbytes = arr.nbytes
            if copy and getattr(arr.base, "nbytes", 0) > arr.nbytes:
                arr = arr.copy()     # a part of a larger buffer: keep only the part
            self.kept[tag] = (arr, name, copy)
            return arr, nbytes

    # ------------------------------------------------------------------ streamed (chunks)
    def _stream_need(self, task: int, stage: int, wanted: list, window) -> list:
        """The requests of stage ``stage`` of the task (``triples_stream.stream_requests``;
        kept for its work) that the rank's previous stage did not fetch (kept; the rest
        dropped), each once."""
        reqs = stream_requests(self.windows, self.stream, [self.tiles[x] for x in wanted], window, stage)
        with self.lock:
            self.stage_requests[(task, stage)] = reqs
        out = {}
        for name, key, part, _, _ in reqs:
            req = (self.tensors[name], key, part) if part else (self.tensors[name], key)
            out[request_tag(req)] = req
        with self.lock:
            for tag in [tag for tag in self.kept if tag not in out]:
                self._drop_kept(tag)
        return [r for tag, r in out.items() if tag not in self.kept]

    def _stream_work(self, task: int, stage: int, wanted: list, blocks: dict) -> float:
        """Stage ``stage`` of a windowed task: its rows (the requests its need listed) into
        StreamTables; streamed (C > 1), the chunk's W0 terms added to the task's W
        (``acc[task]``, made at stage 0, dropped after the last) and at the last stage the
        energy; one stage, W and the energy at once. Held: the stage's fetched copies and
        tables, and W."""
        t, window = self.tasks[task]
        streamed = self.stream.count > 1
        with self.lock:
            reqs = self.stage_requests.pop((task, stage))
            if streamed and stage == 0:           # a task run again starts a new W
                self.held.add({"W": _acc_bytes(self.acc.pop(task, {}))}, -1)
                self.acc[task] = {}
            acc = self.acc[task] if streamed else None
        ytiles = {self.tiles[x][0]: (self.tiles[x][1] - self.tiles[x][0], self.tiles[x][2]) for x in wanted}
        tables = StreamTables(self.windows, self.irrep, self.stream, stage, ytiles)
        read, copies = 0, dict.fromkeys(SOURCES, 0)
        for name, key, part, kind, place in reqs:
            tensor = self.tensors[name]
            tag = request_tag((tensor, key, part or None))
            arr, got = self._keep(tag, name, key, blocks)
            read += got
            copies[name] += got if key not in tensor.blocks else 0
            tables.add(kind, arr, place)
        blocks.clear()
        counted = dict(tables.nbytes)          # zero tables the kernel asks for come on top
        with self.lock:
            self.read[task] = self.read.get(task, 0) + read
            self.held.add({s: copies[s] + counted[s] for s in SOURCES})
        inp = KernelInputs(self.lay, self.eo, self.t1d, self.irrep, ov1=None, ov2=None, t2r=None, t2s=None,
                           ooL=None, ovov=None)
        kern = StreamTripleKernel(inp, self.G[t], self._pool(), self.batch, self.vblock, self.windows, window,
                                  tables, acc)
        I, J, K = (self.tiles[x][:2] for x in self.triples[t])
        before = _acc_bytes(acc) if streamed else 0
        energy = kern.tile_energy(I, J, K)
        if streamed:
            held = _acc_bytes(acc)
            with self.lock:
                self.held.add({"W": held - before})
            if stage == self.stream.count - 1:       # W complete: the energy, then W dropped
                kern.adding = False
                energy = kern.tile_energy(I, J, K)
                with self.lock:
                    self.held.add({"W": held}, -1)
                    del self.acc[task]
        with self.lock:
            self.flops += kern.flops
            self.held.add({k: n - counted[k] for k, n in tables.nbytes.items()})
            self.held.add(tables.nbytes, -1)
        return energy


def _acc_bytes(acc: dict) -> int:
    """Bytes of a streamed task's W (``StreamTripleKernel``'s ``acc``)."""
    return sum(w.nbytes for blocks in acc.values() for w in blocks.values())
