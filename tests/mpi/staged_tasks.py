"""A staged task set (``TaskSet.stages``) under `mpiexec -n K`, for tests/test_schedule.py.

A vector A over 12 orbitals in 6 tiles of 2 (A[n] = n + 1), distributed. Task i (of 4)
runs in 3 stages; stage s reads block (i + s) % 6 of A. The work of part s returns 10**s
times the sum of the block it got, so a part that reads another stage's block gives another
number.
Run on mpi-onesided (nxtval and steal) and mpi-collective, each with ``lookahead`` off and
on; rank 0 prints each run's results, the (task, stage) pairs every rank's work saw, in
order, and every rank's calls in order (["need" | "work", task, stage]).
"""

import json

import numpy as np

from tessera import BlockTensor
from tessera.backends.context import Context
from tessera.backends.tasks import TaskSet
from tessera.runtime import World
from tessera.tensor.space import IndexSpace

TASKS, STAGES = 4, 3

world = World.get()
space = IndexSpace.from_irreps("p", [0] * 12, 2)
out = {}
for backend, variant, schedule in (("mpi-onesided", "original", "nxtval"), ("mpi-onesided", "original", "steal"),
                                   ("mpi-collective", "summa", None)):
    for lookahead in (False, True):
        ctx = Context(backend, variant=variant, **({"schedule": schedule} if schedule else {}))
        with ctx:
            A = BlockTensor.from_dense(np.arange(1.0, 13.0), (space,), name="A")
            seen, calls = [], []

            def need(i, s):
                calls.append(["need", i, s])
                return [(A, ((i + s) % len(space.tiles),))]

            def work(i, blocks, s):
                seen.append([i, s])
                calls.append(["work", i, s])
                (block,) = blocks.values()
                return float(10 ** s * block.sum())
            results = ctx.run_tasks(TaskSet("staged", [1.0] * TASKS, work, need, stages=STAGES,
                                            lookahead=lookahead))
        ctx.close()
        out[f"{backend}/{schedule}/{'ahead' if lookahead else 'plain'}"] = {
            "results": results.tolist(), "seen": world.allgather(seen), "calls": world.allgather(calls)}
if world.rank == 0:
    print(json.dumps({"nranks": world.size, "executors": out}), flush=True)
