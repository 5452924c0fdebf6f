"""Task sets: the one way a workload other than the equations runs in parallel.

A :class:`TaskSet` is a list of independent tasks: per task an estimated cost, the
blocks (or block parts) it reads, and the work. ``Context.run_tasks(task_set)`` runs it
on whatever executor the context has:

- ``serial`` / ``threads``: every task here, largest first (threads: on the pool, so
  ``work`` must be thread-safe); the blocks a task needs are views of local tensors;
- ``mpi-onesided``: tasks dealt by a :class:`~tessera.backends.schedule.Scheduler`, the
  executor's own or, when ``task_set.schedule`` names one, one kept for that schedule
  (static, nxtval or steal); a task gets the remote blocks it needs one-sidedly; the
  deal's :class:`~tessera.backends.schedule.DealStats` end up in ``Context.deal_stats``;
- ``mpi-collective``: a static partition run in bulk-synchronous rounds; the blocks of
  a round travel in one all-to-all.

Each task returns a float (an energy, a count, or 0.0); ``run_tasks`` returns the
results of every task on every rank, so a caller can add them in task order and get a
number that does not depend on who ran what. Requests are ``(tensor, key)`` or
``(tensor, key, (axis, lo, hi))`` (rows lo..hi of one axis of the block; more axes:
``(axis, lo, hi, axis', lo', hi', ...)``, ``part_slice``); ``work``
receives ``{(tensor.uid, key[, part]): block}``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from tessera.runtime.distribution import largest_first_order


def part_slice(ndim: int, part) -> tuple:
    """The index of ``part = (axis, lo, hi)`` (rows lo..hi along one axis) in a block, or
    of ``(axis, lo, hi, axis', lo', hi', ...)``, a patch cut along several axes."""
    index = [slice(None)] * ndim
    for n in range(0, len(part), 3):
        axis, lo, hi = part[n:n + 3]
        index[axis] = slice(lo, hi)
    return tuple(index)


def request_tag(request) -> tuple:
    """The key under which a request's block is handed to ``work``."""
    t, key, *part = request
    return (t.uid, key) if not part or part[0] is None else (t.uid, key, part[0])


def _no_blocks(_task: int) -> list:
    return []


@dataclass
class TaskSet:
    """Independent tasks (see the module docstring).

    name: the label under which time and flops are accounted;
    costs: an estimate per task (any unit), for the schedule;
    work: ``work(i, blocks) -> float``;
    need: ``need(i) -> [(tensor, key[, part])]`` the blocks task i reads;
    chunk: tasks handed out per claim (dynamic schedules);
    partition: static partition, ``largest_first`` or ``contiguous`` (neighbours together);
    order: the order of a dynamic hand-out (nxtval), ``index`` (neighbours after each
        other) or ``cost`` (largest first);
    schedule: static | nxtval | steal for this task set under ``mpi-onesided`` (None: the
    executor's schedule); ``mpi-collective`` always runs static rounds, serial and
    threads run every task here;
    flops: ``flops() -> int`` this rank's flops after the run (for accounting), or None;
    home: ``home[i]`` the rank that must run task i (owner computes: its data is there),
        or None for any rank; with homes the schedule is static, no task moves;
    progress: log throttled progress lines while it runs (``backends.tasklog``);
    forkable: ``work`` may run in a forked worker process of the ``threads`` executor
        (``backends.local``): it reads only what the process holds when the run starts
        (inherited copy-on-write) and changes nothing the caller needs but its result
        and the count behind ``flops``;
    add_flops: ``add_flops(n)`` receives the flops that forked workers counted (their
        ``flops()`` increments), so that ``flops()`` afterwards covers the whole run;
    stages: a task's blocks arrive in this many parts: with ``stages`` > 1 the executor
        calls ``need(i, s)`` then ``work(i, blocks, s)`` for s = 0, 1, ..., stages - 1 in
        a row for the same task on one rank, its result the sum (``run_task``); so a task
        holds one part's blocks at a time (e.g. a contracted index streamed in chunks).
        The part is passed, never inferred from the order of calls: a need() asked twice
        or a task run again asks for the same part.
    lookahead: under ``mpi-onesided`` the next part's blocks (the next stage of this task,
        or stage 0 of the next task the deal gives) are requested before this part's work
        and waited for after it, so reads overlap compute: ``need`` of the next part is
        then called before ``work`` of this one (and must not take away what this one's
        work reads). ``mpi-collective`` (bulk-synchronous rounds), serial and threads
        ignore it (need then work, part by part).
    """

    name: str
    costs: Sequence[float]
    work: Callable[[int, dict], float]
    need: Callable[[int], list] = _no_blocks
    chunk: int = 1
    partition: str = "largest_first"
    order: str = "index"
    schedule: str | None = None
    flops: Callable[[], int] | None = None
    home: Sequence[int] | None = None
    progress: bool = False
    forkable: bool = False
    add_flops: Callable[[int], None] | None = None
    stages: int = 1
    lookahead: bool = False

    def __len__(self) -> int:
        return len(self.costs)

    def need_part(self, i: int, stage: int) -> list:
        """The blocks part ``stage`` of task i reads (``need``, with the part when staged)."""
        return self.need(i, stage) if self.stages > 1 else self.need(i)

    def work_part(self, i: int, blocks: dict, stage: int) -> float:
        """Part ``stage`` of task i on its ``blocks`` (``work``, with the part when staged)."""
        return self.work(i, blocks, stage) if self.stages > 1 else self.work(i, blocks)


def local_blocks(requests) -> dict:
    """Requests served from local tensors: views, no copies."""
    out = {}
    for req in requests:
        t, key = req[0], req[1]
        blk = t.blocks.get(key)
        if blk is None:
            blk = np.zeros(t.block_shape(key))
        tag = request_tag(req)
        out[tag] = blk if len(tag) == 2 else blk[part_slice(blk.ndim, tag[2])]
    return out


def run_task(task_set: TaskSet, i: int, fetch: Callable[[list], dict]) -> float:
    """Task i: its ``stages`` parts one after another, each part's blocks (``fetch`` of
    its ``need``) handed to its ``work``; the sum of what they return."""
    return sum(task_set.work_part(i, fetch(task_set.need_part(i, s)), s) for s in range(task_set.stages))


def run_local(executor, task_set: TaskSet, done: Callable[[], None] | None = None) -> np.ndarray:
    """Every task on a serial or threads executor, largest first; ``done()`` after each
    task. A forkable task set runs in the threads executor's worker processes
    (``executor.run_forked``) when it has more than one worker."""
    order = largest_first_order(task_set.costs).tolist()
    done = done or (lambda: None)
    forked = getattr(executor, "run_forked", None)
    if task_set.forkable and forked is not None:
        results = forked(task_set, order, done)
        if results is not None:
            return results
    results = np.zeros(len(task_set))

    def one(i):
        results[i] = run_task(task_set, i, local_blocks)
        done()
    executor.run([(lambda i=i: one(i)) for i in order])
    return results
