"""Tessera runtime measurements, run under mpiexec by bench/runtime_bench.py.

    mpiexec -n 2 python bench/runtime_kernels.py flood [N]
    mpiexec -n 2 python bench/runtime_kernels.py latency
    mpiexec -n 2 python bench/runtime_kernels.py busy SECONDS blas|python

Progress mode and window kind come from TESSERA_PROGRESS / TESSERA_WINDOW. Rank 0
prints one JSON object. Same measurements as bench/ga/ga_bench.c.
"""

import json
import sys
import time

import numpy as np

from tessera.runtime import GlobalArray, TaskCounter, World

SIZES = [8 * 4**k for k in range(11)]  # 8 B .. 8 MiB
TRIALS = 3
TRIAL_SECONDS = 0.05


def flood(world, n):
    ctr = TaskCounter("per_rank", world=world)
    rng = np.random.default_rng(1234 + world.rank)
    size, me = world.size, world.rank
    peers = [(me + 1 + int(rng.integers(0, size - 1))) % size for _ in range(n)] \
        if size > 1 else [me] * n
    world.barrier()
    t0 = time.perf_counter()
    for _ in range(n):
        ctr.next()
    t_local = time.perf_counter() - t0
    world.barrier()
    t0 = time.perf_counter()
    for p in peers:
        ctr.next(p)
    t_remote = time.perf_counter() - t0
    world.barrier()
    total = sum(ctr.read(r) for r in range(size))
    tl = world.allreduce(t_local, op="max")
    tr = world.allreduce(t_remote, op="max")
    return {"kind": "flood", "ranks": size, "n": n, "local_seconds": tl,
            "remote_seconds": tr, "local_ops_per_s": size * n / tl,
            "remote_ops_per_s": size * n / tr, "total": total}


def _best_time(fn, finish=None):
    """Seconds per call: best of TRIALS timed loops of about TRIAL_SECONDS each."""
    for _ in range(3):
        fn()
    if finish:
        finish()
    t0 = time.perf_counter()
    fn()
    if finish:
        finish()
    reps = int(min(200000, max(5, TRIAL_SECONDS / max(time.perf_counter() - t0, 1e-7))))
    best = float("inf")
    for _ in range(TRIALS):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        if finish:
            finish()
        best = min(best, (time.perf_counter() - t0) / reps)
    return best, reps


def latency(world):
    rows = []
    for nbytes in SIZES:
        n = nbytes // 8
        ga = GlobalArray([[n] * world.size], owners={(r,): r for r in range(world.size)},
                         name=f"lat{n}", world=world)
        key = (1,)
        data = np.ones(n)
        if world.rank == 0:
            t, reps = _best_time(lambda: ga.get(key))
            rows.append({"op": "get", "bytes": nbytes, "seconds": t, "reps": reps})
            t, reps = _best_time(lambda: ga.acc(key, data))
            rows.append({"op": "acc", "bytes": nbytes, "seconds": t, "reps": reps})
            pending = []
            t, reps = _best_time(lambda: pending.append(ga.iacc(key, data)),
                                 finish=lambda: [h.wait() for h in pending] and pending.clear())
            rows.append({"op": "iacc", "bytes": nbytes, "seconds": t, "reps": reps})
        ga.sync()
        ga.free()
    return {"kind": "latency", "ranks": world.size, "rows": rows,
            "direct_ranks_note": "get of a same-node block with window 'allocate' is a "
                                 "shared-memory copy (no MPI call)"}


def compute_blas(seconds):
    a = np.random.default_rng(0).random((300, 300))
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        a = a @ a
        a /= np.abs(a).max()
    return float(a[0, 0])


def compute_python(seconds):
    t0 = time.perf_counter()
    x = 0
    while time.perf_counter() - t0 < seconds:
        for i in range(1000):
            x += i * i
    return x


def busy(world, seconds, kind):
    n = 1 << 17  # 1 MiB of float64
    ga = GlobalArray([[n] * world.size], owners={(r,): r for r in range(world.size)},
                     name="busy", world=world)
    ctr = TaskCounter("per_rank", world=world)
    compute = compute_blas if kind == "blas" else compute_python
    data = np.ones(n)
    waited = {}
    for op in ("get", "acc", "fetch_add"):
        ga.sync()
        if world.rank == 1:
            compute(seconds)
        elif world.rank == 0:
            time.sleep(0.1)
            t0 = time.perf_counter()
            if op == "get":
                ga.get((1,))
            elif op == "acc":
                ga.acc((1,), data)
            else:
                ctr.fetch_add(1, target=1)
            waited[op] = time.perf_counter() - t0
    ga.sync()
    return {"kind": "busy", "ranks": world.size, "compute": kind, "compute_seconds": seconds,
            "bytes": n * 8, "get_wait": waited.get("get"), "acc_wait": waited.get("acc"),
            "fetch_add_wait": waited.get("fetch_add")}


def main():
    what = sys.argv[1]
    world = World.get()
    if what == "flood":
        out = flood(world, int(sys.argv[2]) if len(sys.argv) > 2 else 100000)
    elif what == "latency":
        out = latency(world)
    elif what == "busy":
        out = busy(world, float(sys.argv[2]), sys.argv[3])
    else:
        raise SystemExit(f"unknown measurement {what!r}; expected flood|latency|busy")
    out["describe"] = world.describe()
    out["comm_totals"] = {op: t.__dict__ for op, t in world.comm_log.totals().items()}
    rank = world.rank
    world.stop()
    if rank == 0:
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
