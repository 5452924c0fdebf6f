"""backends.schedule: static, nxtval and steal hand out every task exactly once, also when
ranks run at different speeds and counters are reused across deals (simulated ranks in
one process: counters are a list of ints with fetch-and-add)."""

from types import SimpleNamespace

import numpy as np
import pytest

from tessera.backends.schedule import NCOUNTERS, Scheduler, partition
from tessera.runtime.distribution import contiguous_runs, largest_first, makespan, run_bounds


class _Counters:
    """One simulated counter window: a value per rank (per_rank) or one (global)."""

    def __init__(self, kind, size):
        self.kind, self.v = kind, [0] * size

    def fetch_add(self, n, target=None):
        t = 0 if target is None else target
        old = self.v[t]
        self.v[t] += n
        return old


def _schedulers(size, schedule):
    windows = [[] for _ in range(NCOUNTERS)]
    out = []
    for r in range(size):
        made = iter(range(NCOUNTERS))

        def make(kind, made=made):
            k = next(made)
            if len(windows[k]) == 0:
                windows[k].append(_Counters(kind, size))
            return windows[k][0]
        out.append(Scheduler(SimpleNamespace(rank=r, size=size, barrier=lambda: None), schedule,
                             make_counter=make))
    return out


def _interleave(deals, speed):
    gens = [iter(d) for d in deals]
    got, live = [], list(range(len(deals)))
    while live:
        for r in list(live):
            for _ in range(speed[r]):
                chunk = next(gens[r], None)
                if chunk is None:
                    live.remove(r)
                    break
                got.extend(chunk)
    return got


@pytest.mark.parametrize("schedule", ["static", "nxtval", "steal"])
@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_every_task_once_over_many_deals(schedule, size):
    rng = np.random.default_rng(size)
    scheds = _schedulers(size, schedule)
    speed = [1, 3, 1, 2][:size]              # rank 1 is fast: it steals from the others
    for n_deal in range(2 * NCOUNTERS + 1):  # counters reused: bases must stay right
        cost = rng.uniform(1, 10, int(rng.integers(0, 60)))
        for chunk, how, order in ((1, "largest_first", "index"), (3, "contiguous", "cost")):
            deals = [s.deal(cost, chunk, how, order=order) for s in scheds]
            got = _interleave(deals, speed)
            assert sorted(got) == list(range(len(cost))), (n_deal, chunk)
            assert sum(d.stats.tasks for d in deals) == len(cost)
            if schedule == "steal" and size > 1 and len(cost) > 8 and chunk == 1:
                assert deals[1].stats.stolen > 0 and deals[1].stats.counter_remote > 0
            for s in scheds:                 # what a barrier between deals does
                s.synced()


def test_nxtval_orders_and_queues():
    (s,) = _schedulers(1, "nxtval")
    cost = [1.0, 5.0, 3.0, 5.0]
    assert [i for chunk in s.deal(cost) for i in chunk] == [0, 1, 2, 3]
    assert [i for chunk in s.deal(cost, order="cost") for i in chunk] == [1, 3, 2, 0]
    assert partition(cost, 2) == [[1, 2], [3, 0]]                 # LPT: each queue largest first
    assert partition(cost, 2, "contiguous") == [[0, 1], [2, 3]]


def test_partitions():
    cost = np.random.default_rng(11).uniform(1, 100, 1000)
    for n in (1, 2, 3, 4, 7):
        b = run_bounds(cost, n)
        assert b[0] == 0 and b[-1] == len(cost) and np.all(np.diff(b) >= 0)
        shares = np.add.reduceat(cost, b[:-1])
        assert shares.max() / shares.mean() < 1.02
        runs = contiguous_runs(cost, n)
        assert runs == sorted(runs) and np.bincount(runs, minlength=n).tolist() == np.diff(b).tolist()
        q = partition(cost, n, "largest_first")
        assert sorted(i for part in q for i in part) == list(range(len(cost)))
        loads = [sum(cost[i] for i in part) for part in q]
        assert max(loads) == pytest.approx(makespan(cost, n))
        assert max(loads) <= 4 / 3 * max(cost.sum() / n, cost.max()) + 1e-9   # Graham's bound
    assert largest_first([3, 1, 2], 2) == [0, 1, 1]
