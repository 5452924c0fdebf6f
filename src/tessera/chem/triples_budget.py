"""The bytes one distributed (T) task may hold, and the model of a task's seconds they come from.

``window_budget`` bounds one task of ``chem.triples_tasks`` (windowed: its rows and tables;
by whole rows: its rows, and the row cache): the rank's share of the (T) operands, so what
a rank holds falls as ranks grow, down to a floor: ``fastest_task``, unstreamed at least
``task_floor``; never above the budget of half the ranks (``fastest_budget``), so it
never grows with them.  Streamed tasks (``stream_tasks``, ``stream_plan``): on one node
where the share is far below the unstreamed floor (``stream_floor``); between nodes,
where their off-node reads run during their compute (``plan_seconds``, overlapped,
OFF_NODE_OVERLAP), wherever they are the fastest, the same bytes for every molecule.
Floors, windows and the choice between whole rows,
windowed and streamed tasks follow one model of a task's seconds: ``task_model`` (flops,
bytes read, requests, bytes held), ``read_share`` (reads against compute at the
calibrated constants of ``backends.machine``) and ``plan_seconds`` (a run of such tasks
on P ranks).  The plans themselves (task tiles, windows, counts) are
``chem.triples_plan``'s.
"""

from __future__ import annotations

from tessera.backends.machine import Machine, per_machine
from tessera.chem.triples import SOURCES, VirtualLayout, irrep_ranges
from tessera.chem.triples_window import task_bytes, window_tiles, window_width
from tessera.tensor.block_tensor import allowed_elements

DEFAULT_CACHE_MB = 256     # RowSlabs of recent task tiles a rank keeps (distributed; also capped per tensor)
WINDOW_SHARE = 0.25        # windowed tasks: of a rank's memory budget, what one task may hold
TASKS_PER_RANK = 8         # windowed tasks: the fewest per rank a larger occupied task tile may leave
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
# streamed (T) tasks between nodes: their off-node bytes (the share f_off of a rank's peers
# on other nodes, ``Machine.on``) may take up to this share of their compute. They are RDMA
# gets posted a part ahead (``TaskSet.lookahead``) that the network moves while the rank
# computes, so ``plan_seconds`` takes the longer of the two and at 1.0 they hide entirely;
# the on-node bytes are copies the rank makes itself and stay within READ_SHARE. A model,
# not a measurement: on one machine every get is such a copy (bench/triples_lookahead.py,
# lookahead on / off: 2 ranks 2.72 / 2.68 s, 2 emulated nodes x 2 ranks 4.89 / 4.94 s)
OFF_NODE_OVERLAP = 1.0
STREAM_TILES = (1, 2, 3, 4, 6, 8)     # streamed (T) tasks: occupied task tiles tried


def window_budget(cache_mb: float | None, memory_bytes: float | None, tensors: dict, nranks: int,
                  ranks_per_node: int | None = None) -> float:
    """Bytes one distributed (T) task may hold (windowed: its rows and tables; by whole
    rows: its rows, and the row cache): ``cache_mb`` when given, else ``fastest_budget``
    -- or, where the rank's share of the operands is below 1/STREAM_BELOW of the
    unstreamed floor (``task_floor``), ``stream_floor`` (streamed tasks, set by the machine
    alone) when it is less, but not below that share.  On one node only: between nodes
    streamed tasks are candidates of ``fastest_task`` already, the least-held one loses
    time ((H2O)16 cc-pVDZ at the run's tiles, 1024 ranks of 8-rank nodes: 44.5 MiB,
    309.5 s, against 450 MiB, 251.0 s) and, its windows widening with the share of
    off-node peers, would not fall with the rank count."""
    if cache_mb is not None:
        return cache_mb * 2**20
    budget, share = fastest_budget(memory_bytes, tensors, nranks, ranks_per_node)
    o, v = tensors["t2"].spaces[0], tensors["t2"].spaces[2]
    if overlapped(nranks, ranks_per_node) or STREAM_BELOW * share >= task_floor(o, v, nranks, ranks_per_node):
        return budget
    streamed = stream_floor(o, v, nranks, ranks_per_node)
    return budget if streamed is None else min(budget, max(streamed[2], share))


def fastest_budget(memory_bytes: float | None, tensors: dict, nranks: int,
                   ranks_per_node: int | None = None) -> tuple:
    """(bytes one (T) task may hold, the rank's share of the (T) operands ``tensors``:
    ovvv, t2, ovov, ovoo, every allowed element over ``nranks``): the share, so it falls
    as ranks grow, but never below what the task of fewest modelled seconds per rank holds
    among those within the cap (``fastest_task``; an unstreamed one at least
    ``task_floor``), and never above WINDOW_SHARE of the rank's memory budget
    ``memory_bytes`` (at least DEFAULT_CACHE_MB) -- nor above this budget on half the ranks of the same machine
    (nranks // 2, down to one rank), so it never grows with the rank count: the floors
    rise where reads get dearer (between nodes the bandwidth per rank falls, so the
    least task within READ_SHARE is larger), and without that bound a rank held more on
    several nodes than on one ((H2O)12 cc-pVDZ, tile 32, 64-rank nodes: 760 MiB on 64
    ranks, 1435 MiB on 256); with it the larger run takes the windows of the smaller
    one's budget and reads more per flop.  Between nodes a streamed task whose off-node
    reads overlap its compute (``stream_tasks``) is often the fastest, and is then the
    budget.  The streamed floor of ``window_budget`` is not carried up: unstreamed tasks
    that small read far more ((H2O)8 cc-pVDZ at tile 12 on 1008 ranks: 29.5 MiB windows,
    7.07 GiB read per rank, against 210 MiB, 0.46 GiB)."""
    base = DEFAULT_CACHE_MB * 2**20
    cap = base if memory_bytes is None else max(base, WINDOW_SHARE * memory_bytes)
    share = 8 * sum(allowed_elements(tensors[s].spaces, tensors[s].irrep) for s in SOURCES) / nranks
    o, v = tensors["t2"].spaces[0], tensors["t2"].spaces[2]
    least, streamed = fastest_task(o, v, nranks, ranks_per_node, cap) or (0.0, False)
    least = least if streamed else max(task_floor(o, v, nranks, ranks_per_node), least)
    budget = min(cap, max(least, share))
    if nranks >= 2:
        budget = min(budget, fastest_budget(memory_bytes, tensors, nranks // 2, ranks_per_node)[0])
    return budget, share


@per_machine(maxsize=256)
def task_candidates(o, v, nranks: int, ranks_per_node: int | None = None) -> list:
    """``task_model`` s of the unstreamed distributed (T) tasks the budget rule weighs: the
    one-orbital windowed task of ``least_width`` and the tasks by whole rows of each task
    tile ``row_plan`` may take (at most nocc // 8, larger than one orbital only while the
    tasks stay TASKS_PER_RANK per rank).  Kept by their arguments (``fastest_budget``
    asks at every halving of the rank count) and the machine (``Machine.calibrated()``)."""
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
    """(bytes held, streamed) of the one of ``task_candidates`` -- and between nodes the
    streamed tasks of ``stream_tasks`` (``stream_model``) -- holding at most ``cap`` whose
    run takes the fewest modelled seconds per rank (``plan_seconds``, streamed ones
    overlapped; within SECONDS_TIE of the fewest: the one holding least), or None where
    none fits: where the memory budget allows larger tasks than the floor, fewer of them
    pay less Python work and read less (water tetramer cc-pVDZ, tile 48, 2 ranks: whole
    rows of task tile 2, 220 tasks, not task tile 1, 1,540 tasks).  Between nodes a
    streamed task's off-node reads run during its compute, so it can be the fastest
    holding far less; on one node nothing overlaps, and a streamed task only rereads what
    an unstreamed one keeps, yet it would beat the unstreamed candidates, which are the
    least tasks of their kind, not the larger task tiles a larger budget gives
    (``chem.triples_plan.window_plan``): (H2O)16 cc-pVDZ, tile 48, 64 ranks of a node:
    streamed, task tile 8, 502 MiB, 3564 s against one-orbital windows 3607 s, but the
    windows of task tile 12 that budget gives take 3473 s."""
    streams = stream_tasks(o, v, nranks, ranks_per_node) if overlapped(nranks, ranks_per_node) else ()
    models = ([(m, False) for m in task_candidates(o, v, nranks, ranks_per_node)]
              + [(stream_model(o, v, r, width), True) for r, width, _ in streams])
    fits = [(plan_seconds(o, v, m, nranks, ranks_per_node, overlapped=streamed), m[3], streamed)
            for m, streamed in models if m[3] <= cap]
    return fastest(fits)[1:] if fits else None


def overlapped(nranks: int, ranks_per_node: int | None = None) -> bool:
    """Whether ``nranks`` ranks span nodes and the machine's reads overlap compute
    (``Machine.reads_overlap``: mpi-onesided), so that a streamed task's off-node reads run
    during its compute (``plan_seconds``)."""
    machine = Machine.calibrated()
    return machine.reads_overlap and machine.on(nranks, ranks_per_node or nranks)["f_off"] > 0


def fastest(plans: list) -> tuple:
    """Of ``plans`` (seconds, bytes held, ...), the one holding least among those whose
    seconds are within SECONDS_TIE of the fewest."""
    fewest = min(plan[0] for plan in plans)
    return min((plan for plan in plans if plan[0] <= (1 + SECONDS_TIE) * fewest), key=lambda plan: plan[1])


def plan_seconds(o, v, model: tuple, nranks: int, ranks_per_node: int | None = None,
                 overlapped: bool = False) -> float:
    """Modelled seconds per rank of distributed (T) run as tasks like ``model``
    (``task_model``): (T)'s 2 o^3 v^3 (v + o) flops (C1) over the task's give the tasks,
    each taking its flops at the calibrated GEMM rate, its reads (as ``read_share``: bytes
    at the bandwidth, one get latency per request) and one ``Machine.triples_task_seconds``
    of Python work; dealt over ``nranks``, the busiest rank ends at most one task after
    the mean (Graham's bound of a list schedule, Bell Syst. Tech. J. 45, 1563 (1966)), so
    the mean plus one task (larger tasks balance worse: (H2O)8 cc-pVDZ on 64 ranks keeps
    one-orbital windowed tasks, 210 MiB, not whole rows of task tile 2, 513 MiB).
    ``overlapped`` (streamed tasks, ``TaskSet.lookahead``): a task's off-node bytes (the
    share f_off of ``Machine.on``, at the rank's share of its node's link) arrive during
    the previous part's compute, so it takes the longer of its compute and those bytes,
    plus its on-node bytes at the copy bandwidth (copies the rank makes itself: on one node
    nothing overlaps, bench/triples_lookahead.py), its requests' latencies and the Python
    work; nothing overlaps where the machine's reads do not (``Machine.reads_overlap``:
    mpi-collective fetches, then computes)."""
    flops, read, asks, _ = model
    machine = Machine.calibrated()
    on = machine.on(nranks, ranks_per_node or nranks)
    tasks = 2 * o.dim ** 3 * v.dim ** 3 * (v.dim + o.dim) / flops
    compute = flops / machine.rank_flops_per_second
    if overlapped and machine.reads_overlap:
        busy = max(compute, read * on["f_off"] / on["link"]) + read * (1 - on["f_off"]) / machine.copy_bytes_per_second
    else:
        busy = compute + read / on["bandwidth"]
    task = busy + asks * on["t_get"] + machine.triples_task_seconds
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
    return (read / on["bandwidth"] + asks * on["t_get"]) / (flops / machine.rank_flops_per_second)


def stream_bytes(nocc: int, nvir: int, occ_tile: int, width: int, cv: int, co: int) -> float:
    """Bytes a streamed task (``chem.triples_stream``) holds at most (C1): one stage's rows,
    fetched and tabled, and the next stage's rows in flight (``TaskSet.lookahead``), three
    times 3 r rows of w^2 (c_v + c_o) + Y w (c_v + c_o) + Y w^2 doubles (r ``occ_tile``,
    Y = 3 r, windows of three tiles ``width`` wide, w = 3 width, at most v; chunks c_v,
    c_o), and W of its orbital triples, r^3 w^3 doubles: no term in o or v."""
    w, Y, r = min(3 * width, nvir), min(3 * occ_tile, nocc), occ_tile
    return 8 * (3 * 3 * r * (w * w * (cv + co) + Y * w * (cv + co) + Y * w * w) + r ** 3 * w ** 3)


@per_machine(maxsize=256)
def stream_tasks(o, v, nranks: int, ranks_per_node: int | None = None) -> tuple:
    """(occ_tile, width, bytes) of the streamed task shapes the budget rule weighs: per
    task tile of STREAM_TILES (at most the largest occupied tile) the narrowest window tile
    (at least MIN_WINDOW, at most MAX_TASKS tasks) whose reads meet the bound, and what it
    holds (``stream_bytes``, chunks STREAM_CHUNK wide).  A streamed task rereads its rows
    each task, 8 x 27 r wd (wd + r)(v + o) bytes for 72 r^3 wd^3 (v + o) flops (C1),
    r^2 wd^2 / (3 (wd + r)) flops per byte whatever o and v; of those bytes the share
    f_off (``Machine.on``) crosses the network during the compute (``TaskSet.lookahead``)
    and must take at most OFF_NODE_OVERLAP of it at the rank's share of the link (READ_SHARE
    where the machine's reads do not overlap, ``Machine.reads_overlap``), the rest
    are on-node copies and must take at most READ_SHARE of it at the copy bandwidth (on one
    node: all of them, as ``task_floor``'s reads).  Requests' latencies are not in the
    bound (``plan_seconds`` counts them).  Kept by their arguments and the machine."""
    nocc, nvir = o.dim, v.dim
    machine = Machine.calibrated()
    on = machine.on(nranks, ranks_per_node or nranks)
    off_node = OFF_NODE_OVERLAP if machine.reads_overlap else READ_SHARE     # fetched, then computed
    balance = machine.rank_flops_per_second * max((1 - on["f_off"]) / machine.copy_bytes_per_second / READ_SHARE,
                                                  on["f_off"] / on["link"] / off_node)
    largest = max((tl.size for tl in o.tiles), default=1)
    shapes = []
    for r in (r for r in STREAM_TILES if r <= largest):
        tasks = -(-nocc // r) ** 3 / 6
        for width in range(min(MIN_WINDOW, nvir), nvir + 1):
            if r * r * width * width < 3 * balance * (width + r) or tasks * (-(-nvir // width)) ** 3 / 6 > MAX_TASKS:
                continue
            shapes.append((r, width, stream_model(o, v, r, width)[3]))
            break                      # wider windows hold more
    return tuple(shapes)


def stream_floor(o, v, nranks: int, ranks_per_node: int | None = None):
    """(occ_tile, width, bytes) of the streamed task that holds least among
    ``stream_tasks``, None when there is none.  (On one node (H2O)4 cc-pVDZ streamed at
    64 ranks below its 256-rank budget had the bound been looser than READ_SHARE.)"""
    return min(stream_tasks(o, v, nranks, ranks_per_node), key=lambda shape: shape[2], default=None)


def stream_model(o, v, occ_tile: int, width: int) -> tuple:
    """``task_model`` of a streamed task of ``stream_tasks``, its contracted indices in
    chunks STREAM_CHUNK wide (at least two), holding ``stream_bytes`` of chunks of
    STREAM_CHUNK orbitals of both (no term in o or v: the same budget for every molecule;
    the run holds the fewest chunks that fit it, ``stream_plan``)."""
    nocc, nvir = o.dim, v.dim
    flops, read, asks, _ = task_model(o, v, occ_tile, width, max(2, -(-max(nocc, nvir) // STREAM_CHUNK)))
    return flops, read, asks, stream_bytes(nocc, nvir, occ_tile, width, min(STREAM_CHUNK, nvir), min(STREAM_CHUNK, nocc))


def stream_plan(lay: VirtualLayout, o, v, budget: float, nranks: int, ranks_per_node: int | None = None,
                occ_tile: int | None = None):
    """(occ_tile, width, chunks) of streamed (T) tasks, or None (unstreamed): streamed when
    ``budget`` is below the unstreamed floor (``task_floor``), or between nodes when the
    task of fewest modelled seconds within it (as ``fastest_task``) is streamed, and a
    streamed task fits it in the fewest chunks (C > 1) whose ``stream_bytes`` fit.  On one
    node the task of ``stream_floor``, where it holds less than that floor.  Between nodes,
    of the tasks of ``stream_tasks``, the one of fewest modelled seconds (``plan_seconds``,
    overlapped; within SECONDS_TIE: the one holding least, as ``fastest_task`` chose the
    budget), each at the widest window tile (at least MIN_WINDOW) that fits where the
    budget of fewer ranks (``fastest_budget``) is below it: its off-node reads then take
    somewhat longer than its compute, which ``plan_seconds`` counts ((H2O)16 cc-pVDZ, tile
    32, 1024 ranks of 64-rank nodes: the budget of 128 ranks, 523 MiB, holds task tile 8
    at windows 16 wide, not 17).  Else one-orbital tasks of the widest windows (at most
    MIN_WINDOW) that fit, where their ``read_share`` is less than that of the one-orbital
    unstreamed tasks of the budget (``window_width``): a streamed task reads its rows
    again each task and asks for them in parts, but its windows are wider, its compute per
    task larger (H2O2 6-31G at 57.7 kB: unstreamed windows 1 orbital wide, 75,075 tasks;
    streamed 3 wide in 7 chunks, 5,775 tasks). A given ``occ_tile`` is the task tile of
    every candidate (at ``stream_floor``'s window tile)."""
    floor, between = task_floor(o, v, nranks, ranks_per_node), overlapped(nranks, ranks_per_node)
    if budget >= floor and not between:
        return None
    nv, no = int(lay.n.max()), int(lay.no.max())

    def fewest(r, width):                 # the fewest chunks (2+) in which the task fits the budget
        return next((count for count in range(2, max(nv, no) + 1)
                     if stream_bytes(o.dim, v.dim, r, width, -(-nv // count), -(-no // count)) <= budget), None)
    least = stream_floor(o, v, nranks, ranks_per_node)
    shapes = ([shape[:2] for shape in stream_tasks(o, v, nranks, ranks_per_node)] if between
              else [least[:2]] if least is not None and least[2] < floor else [])
    if occ_tile and shapes:
        shapes = [(occ_tile, least[1])]
    fits = []
    for r, width in shapes:
        count = fewest(r, width)
        while count is None and between and width > MIN_WINDOW:
            width -= 1
            count = fewest(r, width)
        if count is not None:
            model = task_model(o, v, r, width, count)
            fits.append((plan_seconds(o, v, model, nranks, ranks_per_node, overlapped=True), model[3], r, width, count))
    if budget >= floor:                 # between nodes: streamed only where faster than the unstreamed tasks
        fits += [(plan_seconds(o, v, m, nranks, ranks_per_node), m[3], None, None, None)
                 for m in task_candidates(o, v, nranks, ranks_per_node) if m[3] <= budget]
        choice = fastest(fits)
        return choice[2:] if choice[2] else None
    if fits:
        return fastest(fits)[2:]
    r = occ_tile or 1
    plain = read_share(task_model(o, v, r, window_width(o, v, r, budget)), nranks, ranks_per_node)
    for width in range(min(MIN_WINDOW, v.dim), 1, -1):
        count = fewest(r, width)
        if count is not None:
            better = read_share(task_model(o, v, r, width, count), nranks, ranks_per_node) < plain
            return (r, width, count) if better else None
    return None
