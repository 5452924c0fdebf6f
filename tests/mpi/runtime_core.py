"""Runtime checks under `mpiexec -n K` (any K, any TESSERA_PROGRESS mode).

Every rank keeps a dense NumPy model of each global array, built from the same seeded
integer-valued data (so sums are exact and the order of accumulates cannot change a
bit). Rank 0 prints one JSON object with what it found; tests/test_runtime_mpi.py
asserts on it. Sections: blocks, patches (1, 2, 4 owners), concurrent accumulates,
apply_local, block-sparse + balanced/explicit owners, counters (NXTVAL, stealing with
a slow rank), communication records of a scripted exchange, error messages, and a
fingerprint of the final arrays for comparing progress modes.
"""

import hashlib
import json
import time

import numpy as np

from tessera.backends.schedule import Scheduler
from tessera.errors import RuntimeLayerError
from tessera.runtime import GlobalArray, TaskCounter, World
from tessera.runtime.placement import BalancedPlacement

SEED = 20240611
TILING = [[3, 5, 2, 4], [4, 1, 6], [2, 3]]


def ints(seed, shape, lo=-50, hi=50):
    return np.random.default_rng(seed).integers(lo, hi, size=shape).astype(np.float64)


def offsets(tiling):
    return [np.concatenate([[0], np.cumsum(t)]).astype(int) for t in tiling]


def owner_grid(ga, tiling):
    """Owner rank of every element, built from ga.owner() and the tiling only."""
    offs = offsets(tiling)
    grid = np.full([o[-1] for o in offs], -1, dtype=np.int64)
    for key in ga.keys:
        sl = tuple(slice(o[i], o[i + 1]) for o, i in zip(offs, key))
        grid[sl] = ga.owner(key)
    return grid


def block_grid(tiling):
    """Flat block index of every element (for counting blocks a patch touches)."""
    offs = offsets(tiling)
    idx = np.indices([len(t) for t in tiling])
    flat = np.ravel_multi_index(idx, [len(t) for t in tiling])
    for d, o in enumerate(offs):
        flat = np.repeat(flat, np.diff(o), axis=d)
    return flat


def find_patch(grid, nowners, rng, tries=20000):
    shape = grid.shape
    for _ in range(tries):
        lo = [int(rng.integers(0, n)) for n in shape]
        hi = [int(rng.integers(a + 1, n + 1)) for a, n in zip(lo, shape)]
        sl = tuple(slice(a, b) for a, b in zip(lo, hi))
        if len(np.unique(grid[sl])) == nowners:
            return tuple(lo), tuple(hi)
    return None


def sl(lo, hi):
    return tuple(slice(a, b) for a, b in zip(lo, hi))


def main():
    try:
        world = World.get()
    except RuntimeLayerError as exc:
        from mpi4py import MPI

        if MPI.COMM_WORLD.Get_rank() == 0:
            print(json.dumps({"world_error": str(exc)}), flush=True)
        return
    rank, size = world.rank, world.size
    out = {"size": size, "describe": world.describe()}
    bad = {}

    # ---- blocks: put by a non-owner, get + double-buffered iget by everyone --------
    ga = GlobalArray(TILING, distribution="cyclic", name="dense", world=world)
    keys = ga.keys
    model = np.zeros(ga.shape)
    offs = offsets(TILING)

    def bsl(key):
        return tuple(slice(o[i], o[i + 1]) for o, i in zip(offs, key))

    initially_zero = all(np.all(ga.get(k) == 0) for k in keys)
    ga.sync()
    for i, key in enumerate(keys):
        data = ints([SEED, i], ga.block_shape(key))
        model[bsl(key)] = data
        if (i * 7 + 3) % size == rank:
            ga.put(key, data)
    ga.sync()
    mism = 0
    for i, key in enumerate(keys[: len(keys) // 2]):
        mism += not np.array_equal(ga.get(key), model[bsl(key)])
    rest = keys[len(keys) // 2:]
    h = ga.iget(rest[0])
    for j in range(len(rest)):
        nxt = ga.iget(rest[j + 1]) if j + 1 < len(rest) else None
        mism += not np.array_equal(h.wait(), model[bsl(rest[j])])
        h = nxt
    bad["blocks"] = mism
    ga.sync()
    out["initially_zero"] = bool(world.allreduce(int(initially_zero), op="land"))

    # ---- patches spanning 1, 2, 4 owners: get, iget, put, acc, iacc -----------------
    grid = owner_grid(ga, TILING)
    blocks = block_grid(TILING)
    rng = np.random.default_rng(SEED + 1)
    patches = {}
    k0 = next(k for k in keys[len(keys) // 3:] if min(ga.block_shape(k)) >= 2)
    lo0 = tuple(o[i] + 1 for o, i in zip(offs, k0))
    hi0 = tuple(o[i + 1] for o, i in zip(offs, k0))
    patches["1"] = (lo0, hi0)  # inside one block (off its first row/column)
    for c in (2, 4):
        if c <= size:
            patches[str(c)] = find_patch(grid, c, rng)
    patches["all"] = ((0, 0, 0), ga.shape)
    out["patches"] = {
        n: None if p is None else {
            "lo": p[0], "hi": p[1],
            "owners": int(len(np.unique(grid[sl(*p)]))),
            "blocks": int(len(np.unique(blocks[sl(*p)]))),
        } for n, p in patches.items()}
    mism = 0
    for n, p in patches.items():
        if p is None:
            continue
        mism += not np.array_equal(ga.get_patch(*p), model[sl(*p)])
        mism += not np.array_equal(ga.iget_patch(*p).wait(), model[sl(*p)])
    bad["get_patch"] = mism
    ga.sync()
    big = patches.get("4") or patches.get("2") or patches["1"]
    mid = patches.get("2") or patches["1"]
    if rank == 0:
        new = ints([SEED, 99], tuple(b - a for a, b in zip(*mid)))
        ga.put_patch(*mid, new)
    model[sl(*mid)] = ints([SEED, 99], tuple(b - a for a, b in zip(*mid)))
    ga.sync()
    bad["put_patch"] = int(not np.array_equal(ga.get_patch((0, 0, 0), ga.shape), model))
    ga.sync()
    shape_big = tuple(b - a for a, b in zip(*big))
    shape_mid = tuple(b - a for a, b in zip(*mid))
    ga.acc_patch(*big, ints([SEED, 200, rank], shape_big), scale=2.0)
    hacc = ga.iacc_patch(*mid, ints([SEED, 300, rank], shape_mid), scale=-1.0)
    hacc.wait()
    for r in range(size):
        model[sl(*big)] += 2.0 * ints([SEED, 200, r], shape_big)
        model[sl(*mid)] -= ints([SEED, 300, r], shape_mid)
    ga.sync()
    bad["acc_patch"] = int(not np.array_equal(ga.get_patch((0, 0, 0), ga.shape), model))
    ga.sync()  # every rank has read before anyone writes again

    # ---- concurrent accumulates from all ranks to one block ------------------------
    kc = keys[5]
    shape_c = ga.block_shape(kc)
    pending = []
    nacc = 40
    for j in range(nacc):
        data = ints([SEED, 400, rank, j], shape_c)
        if j % 2:
            ga.acc(kc, data, scale=rank + 1)
        else:
            pending.append(ga.iacc(kc, data, scale=rank + 1))
            if len(pending) > 2:
                pending.pop(0).wait()
    for hh in pending:
        hh.wait()
    for r in range(size):
        for j in range(nacc):
            model[bsl(kc)] += (r + 1) * ints([SEED, 400, r, j], shape_c)
    ga.sync()
    bad["concurrent_acc"] = int(not np.array_equal(ga.get(kc), model[bsl(kc)]))
    ga.sync()
    out["concurrent_acc_ops"] = nacc * size

    # ---- apply_local, local_keys, owner ---------------------------------------------
    sums = ga.apply_local(lambda key, view: float(np.multiply(view, 3, out=view).sum()))
    model *= 3
    ga.sync()
    bad["apply_local"] = int(not np.array_equal(ga.get_patch((0, 0, 0), ga.shape), model))
    ga.sync()
    bad["apply_local_sums"] = int(sum(sums[k] != model[bsl(k)].sum() for k in sums))
    local_sets = world.allgather(sorted(ga.local_keys()))
    flat = [tuple(k) for lst in local_sets for k in lst]
    out["local_keys_partition"] = sorted(flat) == sorted(keys) and len(flat) == len(set(flat))
    out["owner_consistent"] = all(ga.owner(tuple(k)) == r for r, lst in enumerate(local_sets)
                                  for k in lst)
    out["nbytes_local_total"] = world.allreduce(ga.nbytes_local())
    out["nbytes_expected"] = int(np.prod(ga.shape)) * 8

    # ---- block-sparse, balanced by cost, and explicit owners ------------------------
    tiling2 = [[4, 4, 4], [2, 5, 3]]
    keys2 = [(i, j) for i in range(3) for j in range(3) if (i + j) % 2 == 0]
    costs = {k: float(k[0] + k[1] + 1) for k in keys2}
    sp = GlobalArray(tiling2, keys=keys2, distribution="balanced", costs=costs,
                     name="sparse", world=world)
    offs2 = offsets(tiling2)
    model2 = np.zeros(sp.shape)
    for i, key in enumerate(sp.keys):
        data = ints([SEED, 500, i], sp.block_shape(key))
        model2[tuple(slice(o[a], o[a + 1]) for o, a in zip(offs2, key))] = data
        if i % size == rank:
            sp.put(key, data)
    sp.sync()
    lo2, hi2 = (1, 1), (11, 9)
    bad["sparse_get_patch"] = int(not np.array_equal(sp.get_patch(lo2, hi2), model2[sl(lo2, hi2)]))
    loads = [0.0] * size
    for k in keys2:
        loads[sp.owner(k)] += costs[k]
    out["balanced_loads"] = loads
    owners = {k: (len(keys2) - 1 - i) % size for i, k in enumerate(sp.keys)}
    ex = GlobalArray(tiling2, keys=keys2, owners=owners, name="explicit", world=world)
    out["explicit_owners_ok"] = all(ex.owner(k) == r for k, r in owners.items())
    ex.free()

    # ---- owners and offsets computed per key (runtime.placement): no rank lists every
    # block; irreps and a pair symmetry (canonical keys only) make it block-sparse
    tiling3, irreps3 = [[3, 2, 4], [3, 2, 4], [5, 1]], [[0, 1, 1], [0, 1, 1], [0, 1]]
    pl = BalancedPlacement(tiling3, irreps3, 0, [(1, 0, 2)], size, shift=1)
    pa = GlobalArray(tiling3, placement=pl, name="placed", world=world)
    keys3, offs3 = pl.keys(), offsets(tiling3)
    model3 = np.zeros(pa.shape)
    for i, key in enumerate(keys3):
        data = ints([SEED, 600, i], pa.block_shape(key))
        model3[tuple(slice(o[a], o[a + 1]) for o, a in zip(offs3, key))] = 3 * data
        if i % size == rank:
            pa.put(key, data)
    pa.sync()
    for i, key in enumerate(keys3):
        if i % size == rank:
            pa.acc(key, ints([SEED, 600, i], pa.block_shape(key)), 2.0)
    pa.sync()
    bad["placed_blocks"] = sum(not np.array_equal(pa.get(k), model3[tuple(slice(o[a], o[a + 1]) for o, a in
                                                                        zip(offs3, k))]) for k in keys3)
    bad["placed_get_patch"] = int(not np.array_equal(pa.get_patch((0, 0, 0), pa.shape), model3))
    placed = world.allgather(sorted(pa.local_keys()))
    flat3 = [tuple(k) for lst in placed for k in lst]
    out["placed_partition"] = (sorted(flat3) == sorted(keys3) and len(flat3) == len(set(flat3))
                               and all(pa.owner(tuple(k)) == r for r, lst in enumerate(placed) for k in lst)
                               and (0, 1, 1) not in pa and (1, 0, 1) in pa)
    pa.free()

    # ---- counters: NXTVAL and static partition + stealing --------------------------
    ntickets = 10000
    nxt_sched = Scheduler(world, "nxtval")
    world.barrier()
    t0 = time.perf_counter()
    mine = [i for chunk in nxt_sched.deal([1.0] * ntickets) for i in chunk]
    t_nxt = time.perf_counter() - t0
    every = world.gather(mine)
    if rank == 0:
        allt = sorted(t for lst in every for t in lst)
        out["nxtval"] = {"n": len(allt), "exactly_once": allt == list(range(ntickets)),
                         "per_rank": [len(lst) for lst in every], "seconds": t_nxt}
    again = [i for chunk in nxt_sched.deal([1.0] * 50, chunk=7) for i in chunk]   # counter reused
    every = world.gather(again)
    if rank == 0:
        allt = sorted(t for lst in every for t in lst)
        out["nxtval_reset_chunk"] = allt == list(range(50))

    steal = Scheduler(world, "steal")
    costs = [1.0] * sum(40 + 5 * r for r in range(size))
    slow = 1 % size
    done = []
    deal = steal.deal(costs, partition="contiguous")
    own_ids = set(deal.own)
    steal_starts = []           # the first task of each steal, in the order of the steals
    for chunk in deal:
        if chunk[0] not in own_ids:
            steal_starts.append(chunk[0])
        for i in chunk:
            if rank == slow and size > 1:
                time.sleep(0.004)
            done.append((i in own_ids, i))
    every = world.gather(done)
    owns = world.gather(len(deal.own))
    queues, steal_starts = world.gather(list(deal.own)), world.gather(steal_starts)
    # own tasks: a prefix of the own queue, in order (thieves take from the back)
    own_prefix = world.gather([i for mine_, i in done if mine_] == list(deal.own)[:sum(m for m, _ in done)])
    done2 = [i for chunk in steal.deal(costs, chunk=3) for i in chunk]
    every2 = world.gather(done2)
    world.barrier()             # every claim complete: each counter where every rank thinks
    closed = world.gather([steal.counters[k].read() for k in range(len(steal.counters))]
                          == [b[rank] for b in steal.bases][:len(steal.counters)])
    nxt_sched.free()
    steal.free()
    if rank == 0:
        expected = list(range(len(costs)))
        out["stealing"] = {
            "exactly_once": sorted(i for lst in every for _, i in lst) == expected,
            "exactly_once_chunk3": sorted(i for lst in every2 for i in lst) == expected,
            "slow_rank": slow,
            "slow_own_done": sum(1 for mine_, _ in every[slow] if mine_),
            "slow_own_count": owns[slow],
            "stolen_by_rank": [sum(1 for mine_, _ in lst if not mine_) for lst in every],
            "own_prefix": all(own_prefix),
            # a thief's steals from one victim go from the back of its queue to the front
            "steals_back_to_front": all(pos == sorted(pos, reverse=True) for pos in (
                [q.index(i) for i in starts if i in q] for starts in steal_starts for q in queues)),
            "steals": sum(map(len, steal_starts)),
            "closed": all(closed),
        }

    # ---- communication records of a scripted exchange ------------------------------
    log = GlobalArray(TILING, distribution="contiguous", name="log", world=world)
    lgrid = owner_grid(log, TILING)
    ctr = TaskCounter("per_rank", world=world, name="log-ctr")
    world.barrier()
    snap = world.comm_log.snapshot()
    row = np.zeros(size, dtype=np.int64)
    ntrans = {"get": 0, "put": 0, "acc": 0, "fetch_add": 0}
    right = [k for k in log.keys if log.owner(k) == (rank + 1) % size][:2]
    for k in right:
        log.get(k)
        row[(rank + 1) % size] += 8 * int(np.prod(log.block_shape(k)))
        ntrans["get"] += 1
    tgt = [k for k in log.keys if log.owner(k) == (rank + 2) % size][:1]
    for k in tgt:
        log.put(k, np.ones(log.block_shape(k)))
        row[(rank + 2) % size] += 8 * int(np.prod(log.block_shape(k)))
        ntrans["put"] += 1
    for op, p in (("acc", big), ("get", mid)):
        if op == "acc":
            log.acc_patch(*p, np.ones(tuple(b - a for a, b in zip(*p))))
        else:
            log.get_patch(*p)
        row += 8 * np.bincount(lgrid[sl(*p)].ravel(), minlength=size)
        ntrans[op] += int(len(np.unique(blocks[sl(*p)])))
    for _ in range(3):
        ctr.fetch_add(1, target=(rank + 1) % size)
    row[(rank + 1) % size] += 3 * 8
    ntrans["fetch_add"] += 3
    world.barrier()
    summary = world.comm_log.summary(world, since=snap)
    rows = world.gather(row.tolist())
    counts_all = world.gather(ntrans)
    if rank == 0:
        out["commlog"] = {
            "matrix": summary.matrix,
            "expected": rows,
            "counts": {op: summary.totals[op]["count"] for op in ntrans},
            "expected_counts": {op: sum(c[op] for c in counts_all) for op in ntrans},
            "json_ok": json.loads(summary.to_json())["nranks"] == size,
        }

    # ---- other dtypes and the recorded collectives ---------------------------------
    snap = world.comm_log.snapshot()
    gi = GlobalArray([[3, 2]], dtype="int64", name="ints", world=world)
    gc = GlobalArray([[2, 2]], dtype="complex128", name="cplx", world=world)
    gi.acc((0,), np.arange(3) * (rank + 1))
    gi.acc_patch((2,), (5,), np.ones(3, dtype=np.int64), scale=rank + 1)
    gc.acc((1,), np.array([1 + 2j, 3 - 1j]), scale=1j * (rank + 1))
    gi.sync()
    tri = size * (size + 1) // 2
    other = {
        "int64": gi.get_patch((0,), (5,)).tolist() == [0, tri, 3 * tri, tri, tri],
        "int64_dtype": str(gi.get((0,)).dtype) == "int64",
        "complex128": np.array_equal(gc.get((1,)), np.array([1 + 2j, 3 - 1j]) * 1j * tri),
        "allreduce_array": np.array_equal(world.allreduce(np.arange(4.0) * (rank + 1)),
                                          np.arange(4.0) * tri),
        "allreduce_max": world.allreduce(rank, op="max") == size - 1,
        "bcast_object": world.bcast({"x": [1, 2]} if rank == 0 else None) == {"x": [1, 2]},
        "bcast_array": np.array_equal(world.bcast(np.arange(3.0) if rank == 0 else np.zeros(3)),
                                      np.arange(3.0)),
        "allgather": world.allgather(rank * 10) == [10 * r for r in range(size)],
    }
    tot = world.comm_log.totals(since=snap)
    other["recorded"] = {op: tot[op].count for op in ("allreduce", "bcast", "allgather")}
    other["bcast_bytes"] = tot["bcast"].nbytes
    out["other"] = other
    gi.sync()

    # ---- bad use gives clear errors ------------------------------------------------
    errors = {}

    def expect(name, fn):
        try:
            fn()
        except RuntimeLayerError as exc:
            errors[name] = str(exc)
        else:
            errors[name] = None

    shp = ga.shape
    expect("patch_outside", lambda: ga.get_patch((0, 0, 0), (shp[0] + 1, shp[1], shp[2])))
    expect("patch_negative", lambda: ga.get_patch((-1, 0, 0), (2, 2, 2)))
    expect("patch_ndim", lambda: ga.get_patch((0, 0), (2, 2)))
    expect("put_shape", lambda: ga.put(keys[0], np.zeros((2, 2))))
    expect("acc_shape", lambda: ga.acc(keys[0], np.zeros((1,) + ga.block_shape(keys[0]))))
    expect("put_patch_shape", lambda: ga.put_patch((0, 0, 0), (2, 2, 2), np.zeros((2, 2, 3))))
    expect("acc_patch_shape", lambda: ga.acc_patch((0, 0, 0), (2, 2, 2), np.zeros(8)))
    expect("put_dtype", lambda: ga.put(keys[0], np.zeros(ga.block_shape(keys[0]), complex)))
    expect("key_missing", lambda: sp.get((0, 1)))
    expect("key_outside_grid", lambda: ga.get((9, 9, 9)))
    expect("key_wrong_ndim", lambda: ga.get((0, 0)))
    expect("sparse_put_patch_missing", lambda: sp.put_patch((0, 0), (5, 3), np.zeros((5, 3))))
    nxt = TaskCounter("global", world=world, name="nxtval")
    per_rank = TaskCounter("per_rank", world=world, name="steal")
    expect("global_counter_target", lambda: nxt.next(target=1 if size > 1 else 5))
    expect("per_rank_counter_target", lambda: per_rank.next(target=size))
    expect("bad_distribution", lambda: GlobalArray(TILING, distribution="random", world=world))
    expect("owner_out_of_range",
           lambda: GlobalArray(tiling2, keys=keys2, owners={k: size for k in keys2}, world=world))
    expect("bad_tiling", lambda: GlobalArray([[3, 0]], world=world))
    tmp = GlobalArray([[2, 2]], name="tmp", world=world)
    tmp.free()
    expect("use_after_free", lambda: tmp.get((0,)))
    expect("int_scale", lambda: gi.acc((0,), np.ones(3, dtype=np.int64), scale=0.5))
    expect("unknown_reduction", lambda: world.allreduce(1, op="avg"))
    gi.free()
    gc.free()
    out["errors"] = errors

    # ---- fingerprint of the final data (equal across progress modes) --------------
    full = ga.get_patch((0, 0, 0), ga.shape)
    out["fingerprint"] = hashlib.sha256(full.tobytes() + sp.get_patch((0, 0), sp.shape)
                                        .tobytes()).hexdigest()
    out["model_fingerprint"] = hashlib.sha256(model.tobytes() + model2.tobytes()).hexdigest()
    bad_all = world.gather(bad)
    out["live_before_stop"] = len(world._live)
    world.stop()  # frees ga, sp, log and the counters
    if rank == 0:
        out["mismatches"] = {k: sum(b[k] for b in bad_all) for k in bad_all[0]}
        print(json.dumps(out, default=lambda o: o.item()), flush=True)


if __name__ == "__main__":
    main()
