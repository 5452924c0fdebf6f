"""``auto``: pick the executor, loop order, schedule and tile size from a cost model.

One rank: ``threads``. Several ranks: for every candidate tile size the caller's
``structure(tile, occ_tile)`` plans one iteration of its method on structure alone (no
data: empty tensors in a planning context) and names the tensors a run stores; every
contraction step is counted from its block tasks (``plan.blocktasks.task_arrays``: the
sizes of every task and block product as arrays), and for each executor the model
estimates, per rank:

  time = makespan / gemm_rate                          compute: per step, the flops of the
                                                       busiest rank (tasks dealt largest first)
       + tasks/P * t_task                              Python work per block product
       + (gets * t_get + accs * t_acc) / P             one-sided operations (onesided)
       + collectives * t_coll                          collective calls (barriers and counter
                                                       setup per step)
       + bytes moved / P / bandwidth                   data movement

and for ``mpi-collective``, bulk-synchronous, the compute is per contraction its busiest
rank's flops as the executor places the products (``collective_traffic``'s
``busiest_flops``) and each all-to-all or broadcast it makes (``exchanges``) costs
``t_exchange``, what one costs inside a CCSD iteration (``machine.json``'s
``exchange_seconds``, measured by ``bench/calibrate_machine.py``: a water cc-pVDZ
iteration's wall over its ~140 exchanges on 2 ranks, the latency, the wait for the later
rank and the executor's work around each; 0.5 ms idle against ~50 us for one alltoallv
alone, docs/distributed.md), and on P ranks ``exchange_peer_seconds`` more per rank past
the second (an all-to-all sends a message to every other rank); a collective call costs
``t_coll`` at 2 ranks and ``barrier_log2_seconds`` more per round past the first of a
barrier's ceil(log2 P) (both measured by the same script, ``Machine.on``),

with the gets, accumulates and bytes the loop order implies (one per piece of a block
stored in pieces: T2 and the integral classes where they have too few blocks for the
ranks, ``runtime.distribution.piece_count``, at least TESSERA_PIECES as a run cuts them;
``original``: both inputs
of every product, one accumulate per output block; ``inverted``: the reused operand
once, the other per product, one accumulate per product; ``cached``: every distinct
remote block once per rank, a frozen operand's once per run; ``mpi-collective``: per
contraction as the executor runs it (``collective_traffic``: its grid shape and SUMMA on
it, or an operand stationary, ``backends.stationary``; frozen operands moved once while the
executor's frozen cache keeps them, ``frozen_resent``; blocks
in pieces as they move; on the grid rank by rank, ``stationary.summa_recv``), the busiest
rank's bytes, and per sum or Hadamard product the busiest rank's bytes as the executor
moves them (``backends.step_bytes``, which gives any step's bytes per rank: what a rank
receives on mpi-collective, what its gets and accumulates, or gets and puts under
``owner``, move on mpi-onesided; on mpi-collective a frozen input's only while its
frozen cache keeps it, ``frozen_resent``); variant ``2.5d`` on a pr x pc x c grid: panels broadcast
within a layer's smaller grid, c partial outputs to the owners). Exact where the
executor's moves follow from structure (every mpi-collective step, mpi-onesided's sums
and Hadamard products, and the contractions of variant ``owner``, a static deal by
ownership: per step the busiest rank's flops, gets and bytes as its deal places the
tasks, ``step_bytes.onesided_owner_counts``). The other loop orders' contractions are
dealt while the step runs (schedules ``nxtval`` and ``steal``): the model counts the
mean rank, i.e. assumes the step's gets, accumulates and bytes spread evenly over the
ranks (``cached``: each rank's distinct blocks at most once) and its flops dealt largest
first (``makespan``). The constants are per node, with
the network between nodes when the ranks span several (``run_costs``). Each candidate also gets a memory estimate per rank
(``memory_parts``: T2 + integrals of the fullest rank; what the driver holds beside
them, the structure's ``held`` bytes (for CCSD the amplitude copies and,
on one process, the ladder's V+-) spread over the ranks; and the working set of the largest contraction step:
for ``mpi-collective`` twice the output rectangle, c times larger with 2.5d, the homes
of the inputs and one panel each; for ``cached`` its block cache; on one process the
step's temporary matrices plus the gathered matrices of constant tensors the context
caches; and every intermediate of the iteration: distributed, each keeps its global array
in the storage's pool until the context closes; on one process the heap keeps what they
freed for the next iteration (``backends.heap``): measured), compared with the run's
memory budget per rank (``backends.budget``: --max-memory, else
TESSERA_MEMORY_PER_RANK_MB, else the memory available now shared by the ranks).
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
warning line when it leaves any stored class above 1.5 (as ``tessera plan --ranks``). The
gemm rate is measured once (one mid-size DGEMM); the other constants are typical
shared-memory figures measured on the development machine (docs/distributed.md);
``estimate`` takes others (``backends.machine``: calibrated node constants plus a
network, as ``tessera plan --ranks`` uses for machines with many nodes). Tiles
are tried from large to small until a tile gives more than MAX_PRODUCTS block products
per iteration, or PRODUCTS_PER_RANK per rank where that is more: on many ranks finer
tiles (more tasks per rank, better balance) stay candidates. Every
choice can be overridden (``--backend``, ``--variant``, ``--schedule``, ``--tile``);
``tessera run --plan-only`` prints the decision and its estimates.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace

import numpy as np

from tessera.backends.balance import (BALANCE, binding, class_balance, collective_layers, forced_tile_warning,
                                      run_tiles)
from tessera.backends.context import BLOCK_READ_COLUMNS, CACHE_BYTES, gather_twins, thread_limit
from tessera.backends.dist_base import DEFAULT_CACHE_MB
from tessera.backends.budget import memory_budget
from tessera.backends.machine import Machine
from tessera.backends import registry
from tessera.backends.registry import VARIANTS, backend_of_variant, check_options
from tessera.errors import InputError
from tessera.backends.step_bytes import (frozen_reads, moved_bytes, onesided_owner_counts, operands, owner_step_moves,
                                        pieces_per_block)
from tessera.plan.blocktasks import block_sizes, task_arrays
from tessera.runtime.distribution import default_layers, grid_3d, makespan
from tessera.tensor.block_tensor import allowed_elements

log = logging.getLogger(__name__)

T_TASK = 25e-6        # s of Python and numpy overhead per block product
T_GET = 15e-6         # s per one-sided get (issue + wait)
T_ACC = 20e-6         # s per one-sided accumulate (MPI_Accumulate + flush)
T_COLL = 60e-6        # s per collective call (latency, 2 ranks on one node; more ranks, ``run_costs``)
BANDWIDTH = 2.0e9     # bytes/s moved per rank (shared memory copies)
TILES = (48, 32, 24, 16, 12, 8)     # tried from large to small ...
MAX_PRODUCTS = 60000                # ... down to the first with more block products per iteration
PRODUCTS_PER_RANK = 1000            # ... or, on many ranks, more than this many per rank
FROZEN_CACHE_BYTES = DEFAULT_CACHE_MB << 20      # what an executor keeps of frozen operands
PLANNER_TEMPORARIES = ("tmp", "pairs", "half")     # names of the tensors the planner makes

# auto weighs the TCE loop orders; ``owner`` (for networks with slow accumulates, which
# the shared-memory constants here do not model) runs when --variant names it
ONESIDED_VARIANTS = tuple(v for v in VARIANTS["mpi-onesided"] if v != "owner")
COLLECTIVE_VARIANTS = VARIANTS["mpi-collective"]


def gemm_rate() -> float:
    """Measured single-thread DGEMM flop rate of a 256^3 product (best of five after a
    warm-up), flop/s, clamped to [1, 50] GFLOP/s against a machine busy with others."""
    a = np.random.default_rng(0).standard_normal((256, 256))
    best = 1e9
    with thread_limit(1):
        a @ a
        for _ in range(5):
            t0 = time.perf_counter()
            a @ a
            best = min(best, time.perf_counter() - t0)
    return float(min(50e9, max(1e9, 2 * 256 ** 3 / max(best, 1e-9))))


def structure_stats(structure, tile: int, occ_tile: int, nranks: int, budget: float | None = None,
                    block_tasks: bool = True, least_pieces: int | None = None, owner: bool = False) -> dict:
    """Counts of one iteration with these tile sizes, from ``structure(tile, occ_tile)``:
    its ``plans`` (structure only, no data) and the ``tensors`` a run stores; the class
    balance and largest share of one tensor over the classes that bind under ``budget``
    (``balance.binding``: all without one). ``block_tasks=False``: only what
    ``memory_parts`` needs for a local executor (no block tasks: their flops, bytes and
    the distributed working sets are left out). ``least_pieces``: pieces per block at
    least (None: the run's, ``registry.least_pieces``), in the bytes moved and stored.
    ``owner``: also ``s["owner"]``, what mpi-onesided's variant ``owner`` (a static deal by
    ownership) does on each rank (``step_bytes.onesided_owner_counts``): per contraction
    step the busiest rank's flops, and its gets and bytes with and without the frozen
    operands', summed over the steps; each rank's frozen bytes summed over the steps
    (``frozen_per_rank``) and the operations of all ranks (``all_gets``, ``all_frozen_gets``)."""
    least_pieces = registry.least_pieces() if least_pieces is None else least_pieces
    run = structure(tile, occ_tile)
    s = {"flops": 0, "products": 0, "a_bytes": 0, "b_bytes": 0, "out_bytes": 0,
         "distinct_bytes": 0, "inv_bytes": 0, "contract_steps": 0, "other_steps": 0, "frozen_reads": [],
         "max_gemm": 0, "distinct_blocks": 0, "makespan_flops": 0,
         "collective_steps": [], "max_step_distinct_bytes": 0, "temporary_bytes": 0,
         "frozen_distinct_bytes": 0, "frozen_ab_bytes": 0,
         # one-sided operations on mpi-onesided, one per piece of a block stored in pieces
         "get_ops": 0, "acc_ops": 0, "inv_get_ops": 0, "product_acc_ops": 0, "distinct_ops": 0,
         # sums and Hadamard products: per step the busiest rank's bytes, summed (mpi-onesided);
         # per step each rank's bytes and its frozen reads' (mpi-collective, ``collective_traffic``)
         "collective_others": [], "onesided_other_bytes": 0.0, "owner_other_bytes": 0.0}
    owners = {"least": least_pieces}     # id(tensor) -> owner function, pieces, on nranks ranks
    if owner and block_tasks:
        s["owner"] = {**dict.fromkeys(("flops", "gets", "bytes", "thawed_gets", "thawed_bytes", "all_gets",
                                       "all_frozen_gets"), 0.0), "frozen_per_rank": np.zeros(nranks)}
    gathered: dict = {}          # (tensor, perm, sectors) -> bytes of a constant operand's matrices
    pooled: dict = {}            # intermediate (not stored, not constant) -> its bytes
    for plan in run.plans:
        for step in plan.steps:
            # a step's matrices, and the planner's intermediates it reads
            temps = [r.tensor for r in (*step.inputs, step.out) if r.tensor.name in PLANNER_TEMPORARIES]
            held = sum(8 * allowed_elements(t.spaces, t.irrep) for t in temps if t is not step.out.tensor)
            s["temporary_bytes"] = max(s["temporary_bytes"], step.memory + held)
            for r in (*step.inputs, step.out):     # every intermediate keeps its global array
                if not r.tensor.constant and all(r.tensor is not t for t in run.tensors):
                    pooled[id(r.tensor)] = 8 * allowed_elements(r.tensor.spaces, r.tensor.irrep)
            if step.kind != "contract":
                s["other_steps"] += 1
                if block_tasks and nranks > 1:
                    # (before the contraction of this index: the order the frozen cache sees)
                    reads = frozen_reads(step, nranks, owners)
                    first = len(s["frozen_reads"])
                    s["frozen_reads"] += [(len(s["collective_steps"]), *entry) for entry in reads]
                    moves = owner_step_moves(step, nranks, owners)
                    for key, executor in (("onesided_other_bytes", "mpi-onesided"), ("owner_other_bytes", "owner")):
                        s[key] += float(moved_bytes(moves, nranks, executor).max())
                    # mpi-collective: each rank's bytes, and per frozen input (its entries in
                    # ``frozen_reads``) what each rank receives of it
                    frozen = {}
                    for n, (t, *_) in enumerate(reads, first):
                        frozen.setdefault(id(t), ([], moves[0][id(t)]))[0].append(n)
                    s["collective_others"].append((moved_bytes(moves, nranks, "mpi-collective"),
                                                   list(frozen.values())))
                continue
            s["contract_steps"] += 1
            if "owner" in s:
                counts, total = onesided_owner_counts(step, nranks, owners), s["owner"]
                for k in ("flops", "gets", "bytes"):
                    total[k] += float(counts[k].max(initial=0))
                    if k != "flops":        # without the frozen operands' (kept from the first iteration)
                        total["thawed_" + k] += float((counts[k] - counts["frozen_" + k]).max(initial=0))
                total["frozen_per_rank"] += counts["frozen_bytes"]
                total["all_gets"] += float(counts["gets"].sum())
                total["all_frozen_gets"] += float(counts["frozen_gets"].sum())
            # a constant left operand of few columns is read from its blocks, not gathered
            # (``Context._gathered``)
            from_blocks = all(sec.cols.total <= BLOCK_READ_COLUMNS for sec in step.sectors)
            for ref, side in zip(step.inputs, "ab"):
                if ref.tensor.constant and step.sectors and not (side == "a" and from_blocks):
                    dims = [(sec.rows.total, sec.inner.total) if side == "a" else (sec.inner.total, sec.cols.total)
                            for sec in step.sectors]
                    rows = step.sectors[0].rows if side == "a" else step.sectors[0].inner
                    # a gather and its twins (context.gather_twins) are cached once
                    key = min((ref.tensor.uid, q, tuple(sorted((c, r) if swapped else (r, c) for r, c in dims)))
                              for q, swapped in gather_twins(ref.tensor, step.perms[side], len(rows.tuples[0])))
                    gathered[key] = 8 * sum(r * c for r, c in dims)
            if not block_tasks:
                continue
            ta = task_arrays(step)
            m, n = ta.m[ta.task], ta.n[ta.task]
            flops = 2 * m * ta.k * n
            s["makespan_flops"] += makespan(np.bincount(ta.task, weights=flops, minlength=len(ta.out)), nranks)
            a_sum, b_sum = 8 * int((m * ta.k).sum()), 8 * int((ta.k * n).sum())
            bytes_a, bytes_b = (8 * int(size.sum()) for size in block_sizes(ta))
            out_bytes = 8 * int(ta.m @ ta.n)
            frozen_a, frozen_b = (r.tensor.constant for r in step.inputs)
            s["out_bytes"] += out_bytes
            s["products"] += len(ta.k)
            s["flops"] += int(flops.sum())
            s["a_bytes"] += a_sum
            s["b_bytes"] += b_sum
            s["frozen_ab_bytes"] += frozen_a * a_sum + frozen_b * b_sum
            s["distinct_bytes"] += bytes_a + bytes_b
            s["frozen_distinct_bytes"] += frozen_a * bytes_a + frozen_b * bytes_b
            s["max_step_distinct_bytes"] = max(s["max_step_distinct_bytes"], bytes_a + bytes_b)
            reuse_a = bytes_a >= bytes_b
            ka, kb, kc = (pieces_per_block(owners, r.tensor, nranks) for r in (*step.inputs, step.out))
            s["get_ops"] += len(ta.k) * (ka + kb)
            s["acc_ops"] += len(ta.out) * kc
            s["product_acc_ops"] += len(ta.k) * kc
            s["inv_get_ops"] += len(ta.a_keys) * ka + len(ta.k) * kb if reuse_a else len(ta.b_keys) * kb + len(ta.k) * ka
            s["distinct_ops"] += len(ta.a_keys) * ka + len(ta.b_keys) * kb
            s["inv_bytes"] += (bytes_a if reuse_a else bytes_b) + (b_sum if reuse_a else a_sum)
            s["collective_steps"].append({
                "bytes": (bytes_a, bytes_b, out_bytes), "tasks": ta, "perms": (step.perms["a"], step.perms["b"]),
                "sig": tuple((sec.irrep, sec.rows, sec.inner, sec.cols) for sec in step.sectors),
                "operands": operands(owners, step, nranks), "perm_c": step.perms["c"],
                "moved_once": tuple(x for x, r in zip("ab", step.inputs) if r.tensor.constant), "stationary": {}})
            for sec in step.sectors:
                s["max_gemm"] = max(s["max_gemm"], sec.rows.total * sec.cols.total)
    # memory balance of the stored tensors (in total and of the worst binding class), and
    # the largest share of one binding tensor on one rank (as both MPI executors store them:
    # a ``pieces`` class of too few blocks in pieces)
    per_class = class_balance({i: t for i, t in enumerate(run.tensors)}, nranks, least_pieces)
    total = per_class.pop("total")
    bind = binding(per_class, budget)
    s["max_tensor_share"] = max((c["max_bytes"] / (c["mean_bytes"] * nranks) for c in bind.values()
                                 if c["mean_bytes"]), default=0.0)
    s["class_max_over_mean"] = max((c["max_over_mean"] for c in bind.values()), default=1.0)
    s["memory_per_rank_max"] = total["max_bytes"]
    s["memory_max_over_mean"] = total["max_over_mean"]
    s["tiles"] = run.tiles
    s["gathered_bytes"] = min(CACHE_BYTES, sum(gathered.values()))
    s["held"] = dict(getattr(run, "held", {}))
    s["held_bytes"] = sum(s["held"].values())
    s["dressing_bytes"] = getattr(run, "dressing", 0)
    if sum(gathered.values()) > CACHE_BYTES:
        # the gathered cache cannot keep every constant: the dressing's M+- may keep their
        # own blocks (``Context.store_constants_gathered`` finds no kept matrix), held beside
        s["held_bytes"] += s["dressing_bytes"]
    s["pooled_bytes"] = sum(pooled.values())
    return s


def grid_of(nranks: int, variant: str) -> tuple:
    """(pr, pc, layers) of ``mpi-collective`` with this variant on P ranks."""
    return grid_3d(nranks, collective_layers(variant, nranks))


def collective_traffic(s: dict, nranks: int, variant: str, frozen_bytes: int = FROZEN_CACHE_BYTES) -> dict:
    """What ``mpi-collective`` moves and holds per CCSD iteration on a pr x pc x c grid,
    contraction by contraction as the executor runs it: SUMMA on the contraction's grid
    shape (``stationary.summa_grid``), or an operand kept stationary
    (``backends.stationary.choose``, owner maps as a run places the blocks; frozen operands
    moved once where the executor keeps them). ``bytes_per_rank``: per contraction the bytes
    the busiest rank receives, summed; ``bcast_bytes_per_rank``: of which panels of the
    contractions run on the grid; ``other_bytes``: per sum or Hadamard product the busiest
    rank's bytes, summed (``step_bytes.owner_step_recv``), a frozen input's not counted
    while the frozen cache keeps it; ``modes``: contractions per mode; ``busiest_flops``: per
    contraction the flops of its busiest rank as the executor places them, summed;
    ``exchanges``: all-to-alls and broadcasts (a stationary contraction 2, one on the grid 2
    and one per panel along each grid line, 2 max(pr, pc)); ``working_bytes`` per
    rank (largest step: on the grid twice the output rectangle, c times SUMMA's, for the
    GEMMs and the send buffers, the homes twice and one A and one B panel; stationary, the
    blocks received, frozen ones included as the first iteration receives them, and the
    partial outputs; plus what the frozen cache keeps). A frozen operand moves once while the
    executor's frozen cache (``frozen_bytes``) keeps what it sent, else every iteration
    (``frozen_resent``). Kept in ``s`` per (ranks, variant, frozen_bytes): estimate and
    memory_parts both ask."""
    memo = s.setdefault("traffic", {})
    if (nranks, variant, frozen_bytes) not in memo:
        memo[nranks, variant, frozen_bytes] = _collective_traffic(s, nranks, variant, frozen_bytes)
    return memo[nranks, variant, frozen_bytes]


def _collective_traffic(s: dict, nranks: int, variant: str, frozen_bytes: int) -> dict:
    from tessera.backends import stationary
    pr, pc, c = grid_of(nranks, variant)
    chosen = []                 # (step, grid, mode, scores, grid_items), as the executor chooses
    for st in s["collective_steps"]:
        pa, pb = st["perms"]
        if nranks > 1:      # the stationary modes' scores do not depend on the grid: once per rank count
            if nranks not in st["stationary"]:
                ops = st["operands"]
                st["stationary"][nranks] = stationary.stationary_scores(
                    st["tasks"], ops.owners, nranks, st["moved_once"], where=False, pieces=ops.tables(st["tasks"]),
                    shared=ops.tensors[0] is ops.tensors[1])
            items = stationary.grid_items(st["sig"], (pa, pb, st["perm_c"]), c, st["operands"])
            mode, grid, scores, _ = stationary.choose(st["tasks"], st["sig"], (pa, pb, st["perm_c"]), c,
                                                      st["operands"], nranks, st["moved_once"],
                                                      stationary=st["stationary"][nranks], items=items)
        else:
            mode, grid, scores, items = "summa", (1, 1, c), None, None
        # the grid's items kept only where a frozen operand resent is counted again on the grid
        chosen.append((st, grid, mode, scores, items if mode == "summa" and st["moved_once"] else None))
    resent, resent_reads, kept_bytes = frozen_resent(chosen, nranks, frozen_bytes, s["frozen_reads"]) \
        if nranks > 1 else (set(), set(), 0)
    # sums and Hadamard products: per step the busiest rank's bytes, less a frozen input's
    # while the frozen cache keeps every entry of it (``CollectiveExecutor._exchange``)
    other = sum(float((recv - sum((part for entries, part in frozen if not resent_reads.intersection(entries)),
                                  np.zeros(nranks))).max(initial=0))
                for recv, frozen in s["collective_others"])
    moved = bcast = work = busiest = 0.0
    modes: dict = {}
    exchanges = 0
    for n, (st, (gr, gc, _), mode, scores, items) in enumerate(chosen):
        a, b, out = st["bytes"]
        modes[mode] = modes.get(mode, 0) + 1
        exchanges += 2 + 2 * max(gr, gc) if mode == "summa" else 2
        ta = st["tasks"]
        busiest += scores[mode]["flops"] if scores else float(2 * ta.m[ta.task] * ta.k @ ta.n[ta.task])
        kept = tuple(x for x in st["moved_once"] if (n, x) not in resent)
        if kept != st["moved_once"]:       # a frozen operand the executor sends again every iteration
            pa, pb = st["perms"]
            scores = {mode: stationary.summa_score(st["sig"], (pa, pb, st["perm_c"]), (gr, gc, c), st["operands"],
                                                   nranks, kept, items) if mode == "summa" else
                      stationary.score(st["stationary"][nranks][1][mode], kept)}
        if mode == "summa":
            if nranks > 1:
                moved += scores["summa"]["recv_bytes"]
                bcast += scores["summa"]["panel_bytes"]
            work = max(work, 2 * out * c / nranks + 2 * (a + b) / nranks
                       + a / (gr * c * max(gr, gc)) + b / (gc * c * max(gr, gc)))
        else:
            moved += scores[mode]["recv_bytes"]
            # the first iteration receives the frozen operands too
            first = stationary.score(st["stationary"][nranks][1][mode])["recv_bytes"] if nranks > 1 else 0.0
            work = max(work, 2 * first + out / nranks)
    return {"grid": (pr, pc, c), "bytes_per_rank": moved, "other_bytes": other, "bcast_bytes_per_rank": bcast,
            "working_bytes": work + kept_bytes, "modes": modes, "busiest_flops": busiest, "exchanges": exchanges}


def frozen_resent(chosen: list, nranks: int, limit: int = FROZEN_CACHE_BYTES, others=()) -> tuple:
    """(contraction, operand) of the frozen operands mpi-collective sends again in every
    iteration, the indices into ``others`` of the frozen reads of sums it sends again, and
    the bytes its frozen cache then holds (a rank's working memory): its
    ``FrozenCache`` of ``limit`` bytes, played over two iterations (the second's misses),
    keeps what a contraction's frozen operand sent (on the grid its panels, under the grid
    shape's layout key, the bytes the fullest strip holds, ``summa_layout``'s
    ``a_strip_bytes``; stationary the blocks received, the bytes the rank receiving the
    most of them gets, a block once per product that reads it,
    ``CollectiveExecutor._exchange``) when it fits beside what it holds. ``chosen``: (step,
    grid, mode, ...) per contraction in order; ``others``: the frozen inputs of sums and
    Hadamard products, (index of the contraction they precede, tensor, key, bytes),
    ``step_bytes.frozen_reads``: they take the cache's room in their turn, and are not sent
    again while kept."""
    from tessera.backends.distributed import FrozenCache
    from tessera.backends.summa_layout import summa_layout
    entries = []
    for n, (st, grid, mode, *_) in enumerate(chosen):
        for x in st["moved_once"]:
            t = st["operands"].tensors["ab".index(x)]
            if mode == "summa":
                key = (x, st["sig"], *st["perms"], *grid)
                need = summa_layout(st["sig"], *st["perms"], *grid)[f"{x}_strip_bytes"]
            else:
                key = ("in", st["sig"], *st["perms"], st["perm_c"], mode, x)     # its items
                need = int(st["stationary"][nranks][1][mode]["asked"][x].max(initial=0))
            entries.append((n, x, t, key, need))
    # a sum's entries (x: its index in ``others``) before the contraction they precede (a
    # stable sort keeps each list's order)
    entries = sorted([(n, j, t, key, need) for j, (n, t, key, need) in enumerate(others)] + entries,
                     key=lambda e: (e[0], isinstance(e[1], str)))
    cache, resent, resent_reads = FrozenCache(limit), set(), set()
    for iteration in (1, 2):
        for n, x, t, key, need in entries:
            if cache.get(t, key) is None:
                if iteration == 2 and isinstance(x, str):
                    resent.add((n, x))
                elif iteration == 2:
                    resent_reads.add(x)
                cache.put(t, key, True, need)
    return resent, resent_reads, cache.bytes


def memory_parts(s: dict, nranks: int, backend: str, variant: str | None = None) -> dict:
    """Bytes per rank of one CCSD iteration on ``backend`` (one of the local executors, or
    an MPI one with its ``variant``), by part: ``stored`` (T2 + integrals of the fullest
    rank, a ``pieces`` class of too few blocks in pieces), ``held`` (the structure's other bytes and every intermediate of
    the iteration, spread over the ranks: distributed, each keeps its global array in the storage's pool; on one process
    the heap keeps what they freed for the next iteration, ``backends.heap``), ``working`` (the executor's working set; see
    the module docstring)."""
    held = (s["held_bytes"] + s["pooled_bytes"]) / nranks
    if backend == "mpi-collective":
        working = collective_traffic(s, nranks, variant)["working_bytes"]
    elif backend == "mpi-onesided":
        # owner: the frozen bytes of the rank that fetches the most (its static deal), as estimate
        frozen = float(s["owner"]["frozen_per_rank"].max(initial=0)) if variant == "owner" and "owner" in s \
            else frozen_share(s, nranks)
        working = min(FROZEN_CACHE_BYTES, s["max_step_distinct_bytes"]) + \
            min(FROZEN_CACHE_BYTES, frozen) if variant in ("cached", "owner") else 0
    else:
        working = s["temporary_bytes"] + s["gathered_bytes"]
    return {"stored": s["memory_per_rank_max"], "held": held, "working": working}


def frozen_share(s: dict, nranks: int) -> float:
    """Bytes of frozen operands' blocks a rank fetches (``cached``, ``owner``) and keeps."""
    return min(s["frozen_distinct_bytes"], s["frozen_ab_bytes"] / nranks)


def kept_share(frozen_bytes: float, limit: int = FROZEN_CACHE_BYTES) -> float:
    """The share of a rank's ``frozen_bytes`` of frozen blocks that its ``FrozenCache`` of
    ``limit`` bytes keeps after the first iteration: it keeps what it took first and refuses
    the rest once full, so all of them while they fit, else about ``limit`` bytes' worth
    (counted as that share of their gets and bytes)."""
    return 1.0 if frozen_bytes <= limit else limit / frozen_bytes


def run_costs(nranks: int, ranks_per_node: int | None = None) -> dict:
    """The per-operation constants of a run on ``nranks`` ranks (``Machine.on``): within a
    node the typical figures above (T_TASK, T_GET, T_ACC, T_COLL, BANDWIDTH) with the
    calibration's exchange and how an exchange and a barrier grow with the ranks
    (``machine.json``, read when first asked, ``Machine.calibrated``); when the ranks span
    nodes (``ranks_per_node`` < ``nranks``) the network between them, default network."""
    node = replace(Machine.calibrated(), task_seconds=T_TASK, get_seconds=T_GET, acc_seconds=T_ACC,
                   collective_seconds=T_COLL, copy_bytes_per_second=BANDWIDTH)
    return node.on(nranks, ranks_per_node or nranks)


def estimate(s: dict, nranks: int, backend: str, variant: str, rate: float, costs: dict | None = None) -> dict:
    """Estimated seconds per CCSD iteration, what moves and the memory, per rank (see
    module docstring). ``costs``: the per-operation constants (default ``run_costs``: the
    ranks on one node; ``backends.machine.Machine.on`` for ranks spread over nodes)."""
    c_ = run_costs(nranks) if costs is None else costs
    T_TASK, T_GET, T_ACC, T_COLL, T_EXCHANGE, BANDWIDTH = (c_[k] for k in ("t_task", "t_get", "t_acc", "t_coll",
                                                                          "t_exchange", "bandwidth"))
    P = nranks
    remote = (P - 1) / P
    compute = s["makespan_flops"] / rate          # per step, the busiest rank's flops
    overhead = s["products"] / P * T_TASK + s["other_steps"] * 3 * T_COLL
    memory = sum(memory_parts(s, P, backend, variant).values())
    if backend == "mpi-collective":
        tr = collective_traffic(s, P, variant)
        pr, pc, c = tr["grid"]
        # bulk-synchronous: each contraction ends when its busiest rank, as the executor
        # places the products, does; each all-to-all or broadcast costs what one does inside
        # an iteration (``T_EXCHANGE``: the latency, the wait for the later rank, the work around it)
        compute = tr["busiest_flops"] / rate
        coll = tr["exchanges"] + s["other_steps"]
        moved = tr["bytes_per_rank"] + tr["other_bytes"]
        seconds = compute + overhead + coll * T_EXCHANGE + moved / BANDWIDTH
        return {"seconds": seconds, "compute": compute, "gets": 0, "accs": 0, "collectives": coll,
                "bytes_per_rank": moved, "bcast_bytes_per_rank": tr["bcast_bytes_per_rank"], "layers": c,
                "contraction_modes": tr["modes"], "memory_per_rank": memory}
    # one get or accumulate per piece of a block stored in pieces (``structure_stats``);
    # sums and Hadamard products: the busiest rank's gets and accumulates (or, owner, gets
    # and puts) of each step (``step_bytes.onesided_step_bytes``)
    other_bytes = s["owner_other_bytes" if variant == "owner" else "onesided_other_bytes"]
    if variant == "owner":
        # a static deal by ownership: the busiest rank of each contraction step, its frozen
        # blocks fetched in the first iteration only as far as they fit its frozen cache,
        # which keeps what it took first once full: the share of them that fits is kept
        # (``structure_stats``, ``step_bytes.onesided_owner_counts``); no accumulate
        if "owner" not in s:
            raise ValueError("estimate of variant owner needs structure_stats(..., owner=True, block_tasks=True)")
        ow = s["owner"]
        kept = kept_share(float(ow["frozen_per_rank"].max(initial=0)))
        gets = ow["gets"] - kept * (ow["gets"] - ow["thawed_gets"])
        nbytes = ow["bytes"] - kept * (ow["bytes"] - ow["thawed_bytes"])
        compute = ow["flops"] / rate
        seconds = (compute + overhead + gets * T_GET + (nbytes + other_bytes) / BANDWIDTH
                   + s["contract_steps"] * 4 * T_COLL)
        return {"seconds": seconds, "compute": compute, "gets": ow["all_gets"] - kept * ow["all_frozen_gets"],
                "accs": 0, "collectives": s["contract_steps"] * 2 + s["other_steps"],
                "bytes_per_rank": nbytes + other_bytes, "bcast_bytes_per_rank": 0.0, "layers": None,
                "memory_per_rank": memory}
    if variant == "original":
        gets = s["get_ops"] * remote
        accs = s["acc_ops"]
        moved = (s["a_bytes"] + s["b_bytes"]) * remote + s["out_bytes"] * remote
    elif variant == "inverted":
        gets = s["inv_get_ops"] * remote
        accs = s["product_acc_ops"]
        moved = s["inv_bytes"] * remote + s["out_bytes"] * remote * 2
    else:
        # cached: each rank fetches every distinct block it needs once: at most all of them,
        # but a frozen operand's only in the first iteration as far as its share fits the
        # frozen cache (``frozen_share``, ``kept_share``)
        gets = P * min(s["distinct_ops"], s["get_ops"] / P) * remote
        accs = s["acc_ops"]
        kept = kept_share(frozen_share(s, P))
        moved = P * min(s["distinct_bytes"] - kept * s["frozen_distinct_bytes"],
                        (s["a_bytes"] + s["b_bytes"] - kept * s["frozen_ab_bytes"]) / P) * remote \
            + s["out_bytes"] * remote
    seconds = (compute + overhead + (gets * T_GET + accs * T_ACC) / P
               + (moved / P + other_bytes) / BANDWIDTH + s["contract_steps"] * 4 * T_COLL)
    return {"seconds": seconds, "compute": compute, "gets": gets, "accs": accs,
            "collectives": s["contract_steps"] * 2 + s["other_steps"], "bytes_per_rank": moved / P + other_bytes,
            "bcast_bytes_per_rank": 0.0, "layers": None, "memory_per_rank": memory}


def decide(structure, nranks: int, *, backend: str = "auto", tile=None, variant=None, schedule=None,
           rate: float | None = None, budget: float | None = None, ranks_per_node: int | None = None) -> dict:
    """The executor, options and tile for a run on ``nranks`` ranks, with the estimates.

    ``structure(tile, occ_tile)`` returns the run's structure at those tile sizes:
    ``plans`` (one iteration, planned without data), ``tensors`` (what a run stores) and
    ``tiles`` ({"o": sizes, "v": sizes}); ``structure.nocc`` is the active occupied count.
    ``budget``: bytes a rank may use (default ``budget.memory_budget`` with every rank on
    this node). ``ranks_per_node``: worker ranks per node (default: all on one node; fewer
    put the network between them, ``run_costs``)."""
    if backend not in ("auto", "mpi-onesided", "mpi-collective"):
        raise InputError(f"backend {backend!r} is not decided by the cost model")
    check_options(backend, variant, schedule, ranks=max(2, nranks))
    rate = rate or gemm_rate()
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
                e = estimate(s, nranks, b, var, rate, costs)
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
