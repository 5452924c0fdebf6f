"""Does a get from a rank that is not calling MPI complete before that rank wakes up?

Worker 1 owns a 1 MiB block and a counter, then sleeps SLEEP seconds without calling
MPI. Worker 0 waits 0.2 s, then gets the block, accumulates into it and does a
fetch-and-add on worker 1's counter, timing each against worker 1's wake-up time (one
node, so time.time() is the same clock). Run with TESSERA_WINDOW=create for none/thread
(with MPI_Win_allocate MPICH serves same-node RMA from shared memory and nothing would
wait) or with TESSERA_PROGRESS=ghost. Rank 0 prints JSON.
"""

import json
import time

import numpy as np

from tessera.runtime import GlobalArray, TaskCounter, World

SLEEP = 1.5
N = 1 << 17  # 1 MiB of float64


def main():
    world = World.get()
    rank = world.rank
    ga = GlobalArray([[N]], owners={(0,): 1 % world.size}, name="busy", world=world)
    ctr = TaskCounter("per_rank", world=world)
    data = np.arange(N, dtype=np.float64)
    if rank == 1:
        ga.put((0,), data)
    ga.sync()
    times = {}
    if rank == 1:
        time.sleep(SLEEP)  # no MPI call: only a progress thread or a ghost can serve
        times["wake"] = time.time()
    elif rank == 0:
        time.sleep(0.2)
        t0 = time.time()
        got = ga.get((0,))
        times["get_done"] = time.time()
        ga.acc((0,), np.ones(N))
        times["acc_done"] = time.time()
        ctr.fetch_add(5, target=1)
        times["fetch_add_done"] = time.time()
        times["start"] = t0
        times["get_ok"] = bool(np.array_equal(got, data))
    ga.sync()
    final_ok = bool(np.array_equal(ga.get((0,)), data + 1))
    counter = ctr.read(target=1)
    every = world.gather(times)
    describe = world.describe()
    world.stop()
    if rank == 0:
        t_rank0, t_rank1 = every[0], every[1]
        wake = t_rank1["wake"]
        out = {
            "describe": describe,
            "sleep": SLEEP,
            "get_ok": t_rank0["get_ok"],
            "final_ok": final_ok,
            "counter": counter,
            "before_wake": {op: t_rank0[f"{op}_done"] < wake
                            for op in ("get", "acc", "fetch_add")},
            "waited": {op: t_rank0[f"{op}_done"] - t_rank0["start"]
                       for op in ("get", "acc", "fetch_add")},
        }
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
