"""A scripted exchange under `mpiexec -n K` with profiling on, for tests/test_profile.py.

Every rank gets two known blocks from its right neighbour, puts one block to the rank
two to its right, accumulates one block to itself and one to its left neighbour, does
three counter operations on its right neighbour, and takes part in known collectives
(bcast of 1000 float64 from rank 0, allgather of a 100-byte string, alltoallv sending
(d + 1) * 10 float64 to each rank d, allreduce of 64 float64). It also runs a task set
through a Context sharing the same recorder. Then ``profile.run.finish`` writes the
profile to argv[1]; rank 0 prints what each rank asked for (the expectation) and the
summary.
"""

import json
import pickle
import sys
import time

import numpy as np

from tessera.backends.context import Context
from tessera.backends.tasks import TaskSet
from tessera.profile import run as run_profile
from tessera.profile.records import Recorder
from tessera.runtime import GlobalArray, TaskCounter, World

directory = sys.argv[1]
world = World.get()
rank, size = world.rank, world.size
right, left, two = (rank + 1) % size, (rank - 1) % size, (rank + 2) % size
recorder = Recorder(detailed=True)
run_profile.prepare(directory)
world.comm_log.record_events(recorder.t0)

# ---- one-sided: expected bytes per (op, peer) ---------------------------------------
tiling = [[4] * (2 * size), [3, 5]]
ga = GlobalArray(tiling, distribution="cyclic", name="profiled", world=world)
ctr = TaskCounter("per_rank", world=world, name="profiled-ctr")
world.barrier()
t_scripted = time.perf_counter()
expected: dict = {}


def expect(op, peer, nbytes, count=1):
    c, b = expected.get(f"{op}:{peer}", (0, 0))
    expected[f"{op}:{peer}"] = (c + count, b + nbytes)


def keys_of(owner):
    return [k for k in ga.keys if ga.owner(k) == owner]


for k in keys_of(right)[:2]:
    ga.get(k)
    expect("get", right, 8 * int(np.prod(ga.block_shape(k))))
k = keys_of(two)[0]
ga.put(k, np.ones(ga.block_shape(k)))
expect("put", two, 8 * int(np.prod(ga.block_shape(k))))
for peer in (rank, left):
    k = keys_of(peer)[-1]
    ga.acc(k, np.ones(ga.block_shape(k)))
    expect("acc", peer, 8 * int(np.prod(ga.block_shape(k))))
ga.sync()
for _ in range(3):
    ctr.fetch_add(1, target=right)
expect("fetch_add", right, 24, 3)

# ---- collectives: expected bytes received per (op, peer) ----------------------------
received: dict = {}


def got(op, peer, nbytes):
    received[f"{op}:{peer}"] = received.get(f"{op}:{peer}", 0) + nbytes


world.bcast(np.arange(1000.0) if rank == 0 else np.zeros(1000), root=0)
if rank != 0:
    got("bcast", 0, 8000)
word = "x" * 100
world.allgather(word)
for r in range(size):
    if r != rank:
        got("allgather", r, len(pickle.dumps(word, pickle.HIGHEST_PROTOCOL)))
world.alltoallv([np.zeros((d + 1) * 10) for d in range(size)], [(rank + 1) * 10] * size)
for s in range(size):
    if s != rank:
        got("alltoallv", s, 8 * (rank + 1) * 10)
world.allreduce(np.ones(64))
for r in range(size):
    if r != rank and size > 1:
        got("allreduce", r, 2 * 512 // size)

recorder.region("scripted exchange", time.perf_counter() - t_scripted, start=t_scripted, kind="phase")

# ---- a task set through a context sharing the recorder ------------------------------
with Context("mpi-onesided", recorder=recorder) as ctx:
    ctx.run_tasks(TaskSet("sleepy tasks", [1.0] * (3 * size),
                          lambda i, blocks: time.sleep(0.002) or float(i)))
ctx.close()
ga.free()
ctr.free()
recorder.region("whole script", time.perf_counter() - recorder.t0, start=recorder.t0, kind="phase")

summary = run_profile.finish(recorder, world, directory, {"molecule": {"atoms": []}, "basis": "none"})
everyone = world.gather({"expected": expected, "received": received})
if rank == 0:
    print(json.dumps({"size": size, "per_rank": everyone, "summary": summary}), flush=True)
