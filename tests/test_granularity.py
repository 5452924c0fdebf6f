"""Granularity from the rank count, checked on structure alone (simulated rank counts,
no MPI): mpi-collective's grid per contraction leaves no grid row or column idle where
the tuples allow it; the cached loop order's batches respect the cache bound and give
every rank tasks; the all-to-all's rounds above the MPI count limit and the request
encoding; the tile search goes finer on many ranks."""

import numpy as np
import pytest

from tessera import BlockTensor, IndexSpace
from tessera.backends import auto, balance
from tessera.backends.exchange import _decode, _encode
from tessera.backends.summa_layout import choose_grid, grid_score, summa_layout
from tessera.backends.context import PlanningContext
from tessera.backends.cached_batches import BATCHES_PER_RANK, indexed_batches, task_batches
from tessera.chem.ccsd import CCSDStructure
from tessera.errors import RuntimeLayerError
from tessera.plan.blocktasks import _tasks, contraction_tasks, indexed_tasks
from tessera.runtime.alltoallv import offsets, plan_rounds, round_counts
from tessera.runtime.distribution import grid_shape


@pytest.fixture(autouse=True)
def _drop_layouts():
    """The layouts of 1024 simulated ranks are large: not kept for later tests (whose
    memory estimates measure this process's peak)."""
    yield
    summa_layout.cache_clear()
    choose_grid.cache_clear()
    _tasks.cache_clear()


def ladder_step(occ_tiles, vir_tiles, tile=2):
    """The contract step of R[ijab] += W[abcd] tau[ijcd] (C1, tiles of ``tile`` orbitals)."""
    o = IndexSpace.from_irreps("o", np.zeros(tile * occ_tiles, int), tile)
    v = IndexSpace.from_irreps("v", np.zeros(tile * vir_tiles, int), tile)
    ctx = PlanningContext()
    with ctx:
        W, tau = BlockTensor((v,) * 4, 0, name="W"), BlockTensor((o, o, v, v), 0, name="tau")
        R = BlockTensor((o, o, v, v), 0, name="R")
        R["ijab"] += W["abcd"] * tau["ijcd"]
    return next(s for s in ctx.plans[0].steps if s.kind == "contract")


def busy_lines(step, pr, pc, layers=1):
    """(grid rows, grid columns) with output work, from the layout the executor runs."""
    sig = tuple((s.irrep, s.rows, s.inner, s.cols) for s in step.sectors)
    lay = summa_layout(sig, step.perms["a"], step.perms["b"], pr, pc, layers)
    rows = sum(any(lay["row_total"][n][g] for n in range(len(sig))) for g in range(pr))
    cols = sum(any(lay["col_total"][n][h] for n in range(len(sig))) for h in range(pc))
    return rows, cols


@pytest.mark.parametrize("occ_tiles, vir_tiles, nranks", [(3, 12, 1024), (2, 10, 32), (3, 5, 32), (2, 3, 4)])
def test_grid_per_contraction_leaves_no_line_idle(occ_tiles, vir_tiles, nranks):
    """9 (i, j) tuples on 1024 ranks: the most square grid (32 x 32) idles 23 grid rows or
    columns; the chosen grid none (8 x 128 or 4 x 256 fit 9 x 144 tuples), and its busiest
    rank computes and receives no more."""
    step = ladder_step(occ_tiles, vir_tiles)
    sig = tuple((s.irrep, s.rows, s.inner, s.cols) for s in step.sectors)
    pa, pb = step.perms["a"], step.perms["b"]
    pr, pc = choose_grid(sig, pa, pb, nranks)
    assert pr * pc == nranks
    assert busy_lines(step, pr, pc) == (pr, pc)
    square = grid_shape(nranks)
    if occ_tiles ** 2 < max(square):
        assert busy_lines(step, *square) != square     # the fixed grid idled some lines
    chosen, fixed = grid_score(sig, pa, pb, pr, pc), grid_score(sig, pa, pb, *square)
    assert chosen["cost"] <= fixed["cost"] and chosen["idle"] == 0


def test_grid_score_counts_flops_of_the_busiest_rank():
    """4 ij tuples x 9 ab tuples, one layer: the busiest rank's flops are 2 * rows * cols *
    inner of its rectangle (by hand from the deal)."""
    step = ladder_step(2, 3)
    sig = tuple((s.irrep, s.rows, s.inner, s.cols) for s in step.sectors)
    (_, rows, inner, cols), = sig
    for pr, pc in ((1, 1), (1, 2), (2, 2)):
        lay = summa_layout(sig, step.perms["a"], step.perms["b"], pr, pc, 1)
        flops = max(2 * lay["row_total"][0][g] * lay["col_total"][0][h] * inner.total
                    for g in range(pr) for h in range(pc))
        assert grid_score(sig, step.perms["a"], step.perms["b"], pr, pc)["flops"] == flops
    assert grid_score(sig, step.perms["a"], step.perms["b"], 1, 1)["flops"] == 2 * rows.total * cols.total * inner.total


def cached_batches(step, by_row, bound, nranks) -> list:
    """The batches the cached loop order deals for ``step``, as lists of (task, lo, hi)."""
    batches = indexed_batches(indexed_tasks(step), by_row, bound, nranks)
    return [batches[b] for b in range(len(batches))]


def distinct_bytes(tasks, batch):
    a, b = {}, {}
    for i, lo, hi in batch:
        t = tasks[i]
        for p in t.products[lo:hi]:
            a[p.a], b[p.b] = 8 * t.m * p.k, 8 * p.k * t.n
    return sum(a.values()) + sum(b.values())


@pytest.mark.parametrize("nranks", (1, 4, 64))
def test_cached_batches_fit_the_cache_and_feed_every_rank(nranks):
    step = ladder_step(3, 6)
    tasks = contraction_tasks(step)
    whole = sum(8 * int(np.prod(t.out_shape)) for t in tasks)     # every output block, a scale
    one_task = min(distinct_bytes(tasks, [(i, 0, len(t.products))]) for i, t in enumerate(tasks))
    every = [(i, q) for i, t in enumerate(tasks) for q in range(len(t.products))]
    for bound in (10 ** 12, whole // 20, one_task // 3):
        batches = cached_batches(step, True, bound, nranks)
        assert sorted((i, q) for b in batches for i, lo, hi in b for q in range(lo, hi)) == every
        for b in batches:
            assert distinct_bytes(tasks, b) <= bound or (len(b) == 1 and b[0][2] - b[0][1] == 1)
            assert len({(tasks[i].sector, tasks[i].r) for i, _, _ in b}) == 1
        assert len(batches) >= min(len(tasks), BATCHES_PER_RANK * nranks)
        if bound == one_task // 3:                  # no task fits whole: each is cut in parts
            assert all(hi - lo < len(tasks[i].products) for b in batches for i, lo, hi in b)
    # one rank, no bound: one batch per row of blocks of A (every A block fetched once)
    if nranks == 1:
        rows = {(t.sector, t.r) for t in tasks}
        assert len(cached_batches(step, True, 10 ** 12, 1)) == max(len(rows), BATCHES_PER_RANK)
        tight = cached_batches(step, True, whole // 20, 1)
        assert len(tight) > len(rows)              # all of tau per row did not fit


@pytest.mark.parametrize("nranks, limit", [(2, 5), (3, 5), (4, 7), (5, 5), (8, 2 ** 31 - 1)])
def test_alltoallv_rounds(nranks, limit):
    rng = np.random.default_rng(nranks)
    counts = rng.integers(0, 12, size=(nranks, nranks))     # counts[s][d]
    totals = max(counts.sum(0).max(), counts.sum(1).max())
    with pytest.raises(RuntimeLayerError, match="at least the rank count"):
        plan_rounds(int(totals), int(counts.max()), nranks, nranks - 1)
    rounds, per = plan_rounds(int(totals), int(counts.max()), nranks, limit)
    if totals <= limit:
        assert (rounds, per) == (1, None)
        return
    moved = np.zeros_like(counts)
    for r in range(rounds):
        for s in range(nranks):
            sc = round_counts(counts[s].tolist(), r, per)
            assert sum(sc) <= limit and max(offsets(sc)) <= limit
            moved[s] += sc
    assert (moved == counts).all()
    assert rounds == -(-int(counts.max()) // (limit // nranks))


def test_request_encoding_round_trip():
    reqs = [(3, (0, 1, 2, 3), None), (7, (5,), (0, 2, 4)), (3, (1, 1), (1, 0, 1)), (0, (), None),
            (2, (0, 4, 1), (0, 1, 3, 2, 5, 9))]          # a patch cut along two axes
    ints = [x for eid, key, part in reqs for x in _encode(eid, key, part)]
    assert _decode(np.array(ints, dtype=np.int64)) == reqs


def test_tile_search_goes_finer_on_many_ranks(monkeypatch):
    """The search stops at the first tile with more than max(MAX_PRODUCTS,
    PRODUCTS_PER_RANK * P) block products: on 64 ranks it reaches finer tiles than on 2."""
    monkeypatch.setattr(auto, "MAX_PRODUCTS", 200)
    monkeypatch.setattr(auto, "PRODUCTS_PER_RANK", 50)
    structure = CCSDStructure(np.zeros(30, dtype=int), 6, 0)
    tiles = {}
    for nranks in (2, 64):
        d = auto.decide(structure, nranks, backend="mpi-collective", variant="summa", rate=5e9)
        tiles[nranks] = {c["tile"] for c in d["candidates"]}
        products = {}          # per tile its fewest block products (the run rule's tiling may have more)
        for c in d["candidates"]:
            products[c["tile"]] = min(products.get(c["tile"], c["block_products"]), c["block_products"])
        coarser = [t for t in tiles[nranks] if t != min(tiles[nranks])]
        assert all(products[t] <= max(200, 50 * nranks) for t in coarser)
    assert min(tiles[64]) < min(tiles[2])


def test_cached_batches_of_the_dominant_steps_at_1024_ranks():
    """The cached loop order on the dominant steps of (H2O)4 cc-pVDZ (C1, o=20, v=76) at the
    tiles a run takes on 1024 ranks (``balance.run_tiles``): every product in one batch,
    each batch's distinct input blocks within the cache bound (the executor's default, and
    a quarter of the smaller operand, where a ladder batch of one row of vvvv would
    otherwise prefetch all of tau), one batch per output task or more (147 to 196 tasks
    here, fewer than 2 per rank: the batches cannot feed every rank)."""
    from tessera.backends.balance import dominant_steps, run_tiles
    from tessera.backends.budget import EXECUTOR_CACHE_MB
    from tessera.tensor.block_tensor import allowed_elements
    structure = CCSDStructure(np.zeros(96, dtype=int), 20, 0, distributed=True)
    tile, occ_tile, _, _ = run_tiles(structure, 1024, 8 * 2**30)
    cut = {}
    for step in dominant_steps(structure(tile, occ_tile).plans):
        tasks = contraction_tasks(step)
        a, b = (8 * allowed_elements(r.tensor.spaces, r.tensor.irrep) for r in step.inputs)
        every = sorted((i, q) for i, t in enumerate(tasks) for q in range(len(t.products)))
        count = []
        for bound in (EXECUTOR_CACHE_MB << 20, min(a, b) // 4):
            batches = cached_batches(step, a >= b, bound, 1024)
            assert sorted((i, q) for x in batches for i, lo, hi in x for q in range(lo, hi)) == every
            assert all(distinct_bytes(tasks, x) <= bound or (len(x) == 1 and x[0][2] - x[0][1] == 1)
                       for x in batches), step.describe()
            assert len(batches) >= len(tasks)
            count.append(len(batches))
        cut[step.describe().split("+=")[0].strip()] = count
    # the ladder's tasks each read all of tau (pairs): the tight bound cuts them in runs
    assert cut["contract pairs[Pab]"][1] > cut["contract pairs[Pab]"][0] == 147


@pytest.mark.parametrize("n, nranks, tiles", [(8, 256, (24, 12)), (16, 256, (48, 24))])
def test_collective_tiles_keep_every_grid_line_busy(n, nranks, tiles):
    """mpi-collective's tiles (``balance.run_tiles`` with ``layers=1``, summa) are judged by
    its grid, not by tasks per rank: the largest balanced tiles at which every dominant
    step, on the grid the executor runs it on, has output work on every grid row and
    column (from ``summa_layout``, the executor's layout). (H2O)8 and (H2O)16 cc-pVDZ on
    256 ranks take coarser tiles than the task rule's 2 tasks per rank allow (24/12 and
    48/24 with 1.75 tasks per rank; the task rule took 16/12 and 48/16)."""
    from tessera.backends.balance import TASKS_PER_RANK, dominant_steps, run_tiles
    from tessera.plan.blocktasks import task_count
    structure = CCSDStructure(np.zeros(24 * n, dtype=int), 5 * n, distributed=True)
    tile, occ_tile, worst, _ = run_tiles(structure, nranks, 8 * 2**30, 1)
    assert (tile, occ_tile) == tiles and worst <= 1.5
    steps = dominant_steps(structure(tile, occ_tile).plans)
    assert min(task_count(s) for s in steps) < TASKS_PER_RANK * nranks
    for s in steps:
        sig = tuple((sec.irrep, sec.rows, sec.inner, sec.cols) for sec in s.sectors)
        pr, pc = choose_grid(sig, s.perms["a"], s.perms["b"], nranks, 1)
        assert busy_lines(s, pr, pc) == (pr, pc), (s, pr, pc)


def layout_judgement(step, nranks, layers):
    """(idle grid rows + columns + layers, busiest rank's flops over the mean) of ``step``
    on the pr x pc x layers grid the executor runs it on, counted from ``summa_layout``'s
    own assignment (output rectangles, panels per layer, layers with inner work)."""
    sig = tuple((s.irrep, s.rows, s.inner, s.cols) for s in step.sectors)
    pa, pb = step.perms["a"], step.perms["b"]
    pr, pc = choose_grid(sig, pa, pb, nranks // layers, layers)
    lay = summa_layout(sig, pa, pb, pr, pc, layers)
    rows, cols = busy_lines(step, pr, pc, layers)
    idle = (pr - rows) + (pc - cols)
    if layers > 1:
        idle += sum(not any(lay["active"][n][l_] for n in range(len(sig))) for l_ in range(layers))
    flops = max(sum(2 * lay["row_total"][n][g] * lay["col_total"][n][h] * sum(lay["panel_inner"][n][l_])
                    for n in range(len(sig)))
                for l_ in range(layers) for g in range(pr) for h in range(pc))
    return idle, flops * nranks / step.flops


@pytest.mark.parametrize("occ_tiles, vir_tiles, nranks, layers", [(2, 3, 8, 2), (1, 2, 27, 3), (3, 5, 64, 4), (1, 1, 27, 3)])
def test_grid_lines_judge_the_layered_grid_from_its_layout(occ_tiles, vir_tiles, nranks, layers):
    """``balance.grid_lines`` with c layers (mpi-collective 2.5d) counts the idle grid rows,
    columns and layers and the busiest rank of the layout the executor runs
    (``summa_layout`` on ``choose_grid``'s per-layer grid): the ladder on small grids
    (one inner tuple of 2 x 2 orbitals on 3 layers: cut into 2 parts, one layer idle, 5
    idle lines and layers in all), and the dominant
    steps of (H2O)8 cc-pVDZ on 256 ranks in 8 layers at 48/32, where summa's one-layer
    grid idles 97 lines and the layered grid none."""
    step = ladder_step(occ_tiles, vir_tiles)
    assert balance.grid_lines([step], nranks, layers) == pytest.approx(layout_judgement(step, nranks, layers))
    if (occ_tiles, vir_tiles) == (1, 1):
        assert balance.grid_lines([step], nranks, layers)[0] == 5
    if (occ_tiles, vir_tiles, nranks) == (2, 3, 8):
        structure = CCSDStructure(np.zeros(192, dtype=int), 40, distributed=True)
        steps = balance.dominant_steps(structure(48, 32).plans)
        judged = [layout_judgement(s, 256, 8) for s in steps]
        assert balance.grid_lines(steps, 256, 8) == pytest.approx((sum(i for i, _ in judged), max(b for _, b in judged)))
        assert balance.grid_lines(steps, 256, 8)[0] == 0 and balance.grid_lines(steps, 256, 1)[0] == 97


@pytest.mark.parametrize("case", ["4:64", "8:256"])
def test_decide_unchanged_by_its_caches(case):
    """``auto.decide`` for (H2O)n cc-pVDZ on P ranks (C1 structure, fixed rate and budget)
    gives the decision and every candidate's estimates, as JSON, that it gave before its
    repeated work was cached (tests/data/decide_water.json: its ``made_by`` says how): the
    plans kept per tiling, block sizes kept with the task arrays, deals kept per sizes,
    the stationary modes' distinct pairs by sort."""
    import json
    from pathlib import Path
    ref = json.loads((Path(__file__).parent / "data" / "decide_water.json").read_text())["cases"][case]
    n, nranks = map(int, case.split(":"))
    structure = CCSDStructure(np.zeros(24 * n, dtype=int), 5 * n, distributed=True)
    got = auto.decide(structure, nranks, rate=10e9, budget=8 * 2**30, ranks_per_node=64)
    assert json.loads(json.dumps(got, sort_keys=True)) == ref


def reference_batches(tasks, by_row: bool, bound: int, nranks: int) -> tuple:
    """The cached loop order's batches as the executor made them up to this test's commit,
    from every task's products (``contraction_tasks``): (batches, their flops)."""
    import heapq

    def blocks(e):
        i, lo, hi = e
        t, out = tasks[i], {}
        for p in t.products[lo:hi]:
            out[(0, p.a)], out[(1, p.b)] = 8 * t.m * p.k, 8 * p.k * t.n
        return out

    def flops(batch):
        return sum(tasks[i].flops * (hi - lo) // len(tasks[i].products) for i, lo, hi in batch)

    def runs(entries):
        out, run, seen, size = [], [], set(), 0
        for e in entries:
            bl = blocks(e)
            extra = sum(b for k, b in bl.items() if k not in seen)
            if run and size + extra > bound:
                out.append(run)
                run, seen, size, extra = [], set(), 0, sum(bl.values())
            run.append(e)
            seen.update(bl)
            size += extra
        return out + [run] if run else out

    groups: dict = {}
    for i, t in enumerate(tasks):
        groups.setdefault((t.sector, t.r) if by_row else (t.sector, t.c), []).append(i)
    out = []
    for g in (groups[k] for k in sorted(groups)):
        entries = []
        for i in g:
            n = len(tasks[i].products)
            if sum(blocks((i, 0, n)).values()) <= bound:
                entries.append((i, 0, n))
            else:
                entries += [(i, r[0][1], r[-1][2]) for r in runs([(i, q, q + 1) for q in range(n)])]
        out += runs(entries)
    heap = [(-flops(b), (q,), b) for q, b in enumerate(out)]
    heapq.heapify(heap)
    while heap and len(heap) < BATCHES_PER_RANK * nranks:
        _, place, big = heap[0]
        if len(big) < 2:
            break
        heapq.heappop(heap)
        half = len(big) // 2
        for end, part in ((0, big[:half]), (1, big[half:])):
            heapq.heappush(heap, (-flops(part), place + (end,), part))
    batches = [b for _, _, b in sorted(heap, key=lambda e: e[1])]
    return batches, [flops(b) for b in batches]


# water cc-pVDZ in C2v (24 orbitals, 5 occupied: irreps A1 A1 B1 A1 B2, then the virtuals
# by irrep) at tile 3, and (H2O)4 cc-pVDZ in C1 (o = 20, v = 76) at tile 16
WATER_C2V = ([0, 0, 2, 0, 3] + [0] * 8 + [1] * 2 + [2] * 3 + [3] * 6, 5, 3)
TETRAMER_C1 = ([0] * 96, 20, 16)


@pytest.mark.parametrize("orbsym, nocc, tile", [WATER_C2V, TETRAMER_C1])
def test_cached_batches_from_sizes_equal_those_from_products(orbsym, nocc, tile):
    """The batches found from the tasks' sizes (``indexed_batches``, no product listed) are
    the batches made from every task's products (``reference_batches``): same entries,
    order, cuts and halving, same flops, for every contraction of a distributed CCSD
    iteration, by row and by column, on 1, 7 and 64 ranks, a bound that fits every task
    whole and bounds that cut groups and tasks; and a rank's own tasks alike
    (``task_batches``, the owner variant's)."""
    structure = CCSDStructure(np.array(orbsym), nocc, 0, distributed=True)
    steps = [s for plan in structure(tile, tile).plans for s in plan.steps if s.kind == "contract" and s.sectors]
    cut = whole_cut = 0
    for step in steps:
        tasks = contraction_tasks(step)
        task_bytes = sorted(8 * (t.m + t.n) * sum(p.k for p in t.products) for t in tasks)
        for by_row in (True, False):
            for bound in (10 ** 12, 2 * task_bytes[len(task_bytes) // 2], task_bytes[-1] // 3):
                for nranks in (1, 7, 64):
                    want, flops = reference_batches(tasks, by_row, bound, nranks)
                    got = indexed_batches(indexed_tasks(step), by_row, bound, nranks)
                    assert [got[b] for b in range(len(got))] == want, (step.describe(), by_row, bound, nranks)
                    assert got.flops.tolist() == flops
                    cut += any(hi - lo < len(tasks[i].products) for b in want for i, lo, hi in b)
                    whole_cut += any(len({(tasks[i].sector, tasks[i].r if by_row else tasks[i].c) for i, _, _ in b})
                                     == 1 and len(b) > 1 for b in want)
            mine = tasks[::3]                                # a rank's own tasks, in task order
            want, flops = reference_batches(mine, by_row, task_bytes[-1] // 3, 1)
            got = task_batches(step, mine, by_row, task_bytes[-1] // 3, 1)
            assert [got[b] for b in range(len(got))] == want and got.flops.tolist() == flops
    assert cut and whole_cut          # tasks were cut in runs, and groups held several entries
