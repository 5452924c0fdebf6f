"""backends.schedule: static, nxtval and steal hand out every task exactly once, also when
ranks run at different speeds and counters are reused across deals (simulated ranks in
one process: counters are a list of ints with fetch-and-add)."""

import threading
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from tessera.backends.schedule import NCOUNTERS, Scheduler, Share, partition
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


class _Logged:
    """A rank's handle on a simulated counter window: records (rank, target) of each
    operation; with ``turns``, waits for its turn first (ranks in threads, _Turns)."""

    def __init__(self, window, rank, log, turns=None):
        self.window, self.rank, self.log, self.turns = window, rank, log, turns

    def fetch_add(self, n, target=None):
        if self.turns is not None:
            self.turns.turn(self.rank)
        self.log.append((self.rank, 0 if target is None else target))
        return self.window.fetch_add(n, target)


class _Turns:
    """Simulated ranks in threads whose counter operations run one at a time in a seeded
    random order: any interleaving of claims, reads and give-backs of several ranks."""

    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.cv = threading.Condition()
        self.waiting, self.granted, self.live, self.errors = set(), None, 0, []

    def turn(self, rank):
        with self.cv:
            self.waiting.add(rank)
            self.cv.notify_all()
            self.cv.wait_for(lambda: self.granted == rank)
            self.granted = None
            self.waiting.discard(rank)

    def _body(self, fn):
        try:
            fn()
        except BaseException as e:        # re-raised by run
            self.errors.append(e)
        finally:
            with self.cv:
                self.live -= 1
                self.cv.notify_all()

    def run(self, bodies):
        self.live = len(bodies)
        threads = [threading.Thread(target=self._body, args=(b,)) for b in bodies]
        for t in threads:
            t.start()
        with self.cv:
            while True:
                self.cv.wait_for(lambda: self.granted is None and len(self.waiting) == self.live)
                if not self.live:
                    break
                self.granted = int(self.rng.choice(sorted(self.waiting)))
                self.cv.notify_all()
        for t in threads:
            t.join()
        if self.errors:
            raise self.errors[0]


def _schedulers(size, schedule, node_of=None, progress="none", log=None, turns=None, windows=None):
    windows = [[] for _ in range(NCOUNTERS)] if windows is None else windows
    out = []
    log = [] if log is None else log
    for r in range(size):
        made = iter(range(NCOUNTERS))

        def make(kind, made=made, r=r):
            k = next(made)
            if len(windows[k]) == 0:
                windows[k].append(_Counters(kind, size))
            return _Logged(windows[k][0], r, log, turns)
        world = SimpleNamespace(rank=r, size=size, barrier=lambda: None, node_of=node_of,
                                options=SimpleNamespace(progress=progress))
        out.append(Scheduler(world, schedule, make_counter=make))
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


@pytest.mark.parametrize("schedule", ["static", "nxtval", "steal"])
def test_home_deal_runs_each_task_on_its_home(schedule):
    """``home``: a rank runs exactly the tasks homed on it, in task order, whatever the
    schedule, with no counter operation."""
    home = np.random.default_rng(5).integers(0, 3, 40).tolist()
    log = []
    for r, s in enumerate(_schedulers(3, schedule, log=log)):
        got = [i for chunk in s.deal([1.0] * len(home), 4, home=home) for i in chunk]
        assert got == [i for i, h in enumerate(home) if h == r]
    assert log == []


def test_nxtval_orders_and_queues():
    (s,) = _schedulers(1, "nxtval")
    cost = [1.0, 5.0, 3.0, 5.0]
    assert [i for chunk in s.deal(cost) for i in chunk] == [0, 1, 2, 3]
    assert [i for chunk in s.deal(cost, order="cost") for i in chunk] == [1, 3, 2, 0]
    assert partition(cost, 2) == [[1, 2], [3, 0]]                 # LPT: each queue largest first
    assert [list(q) for q in partition(cost, 2, "contiguous")] == [[0, 1], [2, 3]]   # ranges


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



@pytest.mark.parametrize("node_of", [[0, 0, 1, 1], [0, 0, 0, 1, 1], [0, 1, 1, 2]])
def test_nxtval_across_nodes_counts_on_each_node(node_of):
    """nxtval on several nodes with progress none: one counter per node, on its first
    worker; a rank takes its node's tasks there and goes to another node's counter only
    to steal (one read per other node, then its steals): every task still once, and the
    counter operations between nodes are a few per rank, not one per task."""
    size = len(node_of)
    rng = np.random.default_rng(size)
    log = []
    scheds = _schedulers(size, "nxtval", node_of, log=log)
    leaders = [node_of.index(n) for n in range(max(node_of) + 1)]
    assert all(s.leaders == leaders for s in scheds)
    assert _schedulers(size, "nxtval", node_of, progress="ghost")[0].leaders == []   # a ghost serves it
    assert _schedulers(size, "nxtval")[0].leaders == []                              # one node
    speed = [1, 3, 1, 2, 1][:size]
    for n_deal in range(2 * NCOUNTERS + 1):
        cost = rng.uniform(1, 10, int(rng.integers(0, 80)))
        for chunk, order in ((1, "index"), (2, "cost")):
            del log[:]
            deals = [s.deal(cost, chunk, order=order) for s in scheds]
            got = _interleave(deals, speed)
            assert sorted(got) == list(range(len(cost))), (n_deal, chunk)
            assert {t for _, t in log} <= set(leaders)
            for r, d in enumerate(deals):
                offnode = sum(1 for rank, t in log if rank == r and node_of[t] != node_of[r])
                # a read of each other node's counter, and per steal a read, a claim and a give-back
                assert offnode <= len(leaders) - 1 + 3 * d.stats.steals, (r, offnode, d.stats)
                assert set(d.stats.victims) <= set(leaders) - {leaders[node_of[r]]}
            if len(cost) >= 40 and chunk == 1:
                assert sum(1 for rank, t in log if node_of[t] != node_of[rank]) < len(cost) / 2
            for s in scheds:
                s.synced()


def _reference_queues(costs, nbins):
    """Graham's rule written out (every task by decreasing cost, ties in task order, to the
    least loaded bin, ties the lowest), each queue largest first: every bin's queue."""
    loads, out = [0.0] * nbins, [[] for _ in range(nbins)]
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        r = min(range(nbins), key=lambda b: (loads[b], b))
        loads[r] += costs[i]
        out[r].append(i)
    return out


def _irregular_costs(rng, n):
    """Costs with many ties (small integers) or spread over decades, as task flops are."""
    if rng.integers(2):
        return rng.integers(1, 4, n).astype(float).tolist()
    return (10.0 ** rng.uniform(0, 6, n)).round().tolist()


def _runs_of(chunks, queues):
    """[(queue, first position, last position)] of each chunk, checked to be one run in a queue."""
    where = {i: (q, p) for q, queue in enumerate(queues) for p, i in enumerate(queue)}
    out = []
    for c in chunks:
        (q, first), pos = where[c[0]], [where[i] for i in c]
        assert pos == [(q, first + j) for j in range(len(c))], (c, pos)
        out.append((q, first, first + len(c) - 1))
    return out


@pytest.mark.parametrize("seed", range(24))
def test_steal_races_take_the_tail_every_task_once(seed):
    """steal under any interleaving of counter operations (ranks in threads, one operation
    at a time in a seeded random order) at 2-4 ranks, over deals that reuse the counters:
    every task runs exactly once; a rank runs a prefix of its own queue, in order; a
    steal is one contiguous run of the victim's queue, and a victim's steals go from its
    back to its front; each queue's counter ends exactly len(queue) above its start."""
    rng = np.random.default_rng(seed)
    size, turns, windows = 2 + seed % 3, _Turns(seed), [[] for _ in range(NCOUNTERS)]
    scheds = _schedulers(size, "steal", turns=turns, windows=windows)
    for n_deal in range(NCOUNTERS + 2):
        costs = _irregular_costs(rng, int(rng.integers(0, 50)))
        chunk, how = int(rng.integers(1, 4)), ("largest_first", "contiguous")[n_deal % 2]
        deals = [s.deal(costs, chunk, how) for s in scheds]
        queues = [list(d.own) for d in deals]
        got = [[] for _ in range(size)]
        turns.run([lambda d=d, g=g: g.extend(d) for d, g in zip(deals, got)])
        assert sorted(i for g in got for c in g for i in c) == list(range(len(costs)))
        for r, g in enumerate(got):
            runs = _runs_of(g, queues)
            own = [i for c, (q, _, _) in zip(g, runs) if q == r for i in c]
            assert own == queues[r][:len(own)]
            assert deals[r].stats.stolen == sum(len(c) for c, (q, _, _) in zip(g, runs) if q != r)
        for q in range(size):            # each thief's steals from q: later ones nearer the front
            for g in got:
                firsts = [first for q_, first, _ in _runs_of(g, queues) if q_ == q and g is not got[q]]
                assert firsts == sorted(firsts, reverse=True)
        for s in scheds:
            s.synced()
    for k, w in enumerate(windows):
        assert w[0].v == scheds[0].bases[k]   # closed queues: the counters stand where every rank thinks


def test_steal_visits_its_own_node_first():
    """steal on nodes [0, 1, 0, 1] (ranks of a node not neighbours in the ring): a rank
    that has drained its queue reads the counter of the other rank of its node before any
    of the other node's; every task still runs once. One node: plain ring order. With
    progress none (no ghost or thread serves a busy rank's counter): its own node only."""
    node_of = [0, 1, 0, 1]
    log = []
    scheds = _schedulers(4, "steal", node_of, progress="ghost", log=log)
    assert [s.victims() for s in scheds] == [[2, 1, 3], [3, 2, 0], [0, 3, 1], [1, 0, 2]]
    assert [s.victims() for s in _schedulers(4, "steal", node_of)] == [[2], [3], [0], [1]]
    assert _schedulers(3, "steal")[1].victims() == [2, 0]
    cost = np.arange(1.0, 41.0)
    deals = [s.deal(cost, 1, "contiguous") for s in scheds]
    got = _interleave(deals, [3, 1, 1, 1])          # rank 0 runs out first and steals
    assert sorted(got) == list(range(len(cost)))
    visits = [t for rank, t in log if rank == 0 and t != 0]
    assert visits[0] == 2 and deals[0].stats.stolen > 0, (visits, deals[0].stats)
    log.clear()                 # progress none: rank 0 reads no counter of the other node
    scheds = _schedulers(4, "steal", node_of, log=log)
    deals = [s.deal(cost, 1, "contiguous") for s in scheds]
    got = _interleave(deals, [3, 1, 1, 1])
    assert sorted(got) == list(range(len(cost)))
    assert {t for rank, t in log if rank == 0} <= {0, 2} and deals[0].stats.stolen > 0, log


def test_share_is_the_global_rule_listing_only_what_is_asked():
    """A rank's queue from a Share equals its slice of the global partition (written out
    independently here) for largest_first, contiguous and homes, on irregular costs; with
    ``keep`` nothing but that rank's queue and every rank's length is kept."""
    rng = np.random.default_rng(12)
    for _ in range(40):
        n, P = int(rng.integers(0, 200)), int(rng.integers(1, 9))
        costs = _irregular_costs(rng, n)
        ref = _reference_queues(costs, P)
        home = rng.integers(0, P, n)
        bounds = run_bounds(costs, P)
        for r in range(P):
            share = Share(costs, P, "largest_first", keep=r)
            assert share.queue(r) == ref[r]
            assert share.lengths == [len(q) for q in ref] and set(share._queues) == {r}
            assert share.flat is None                                  # nothing of the others
            own = Share(None, P, home=home, keep=r)
            assert own.queue(r) == [i for i in range(n) if home[i] == r]
            assert own.lengths == np.bincount(home, minlength=P).tolist()
            assert list(Share(costs, P, "contiguous").queue(r)) == list(range(bounds[r], bounds[r + 1]))


@pytest.mark.parametrize("schedule", ["static", "steal"])
def test_partition_built_once_per_task_set_and_own_queue_only(schedule, monkeypatch):
    """Dealing the same costs again (a step in every iteration, a new list each time) reuses
    the rank's partition: Graham's rule runs once per rank and task set, not per deal. A
    static rank lists only its own queue; a stealing rank lists another's only when it
    takes tasks from it. The tasks each rank runs from its own queue are the reference's."""
    from tessera.backends import schedule as sched
    calls = []
    real = sched.largest_first_sorted
    monkeypatch.setattr(sched, "largest_first_sorted", lambda c, n: calls.append(n) or real(c, n))
    size, rng = 4, np.random.default_rng(3)
    sets = [_irregular_costs(rng, int(rng.integers(20, 90))) for _ in range(3)]
    scheds = _schedulers(size, schedule)
    for it in range(3):
        for costs in sets:
            deals = [s.deal(list(costs), 1) for s in scheds]
            ref = _reference_queues(costs, size)
            got = _interleave(deals, [1, 3, 1, 2])
            assert sorted(got) == list(range(len(costs)))
            for r, d in enumerate(deals):
                assert d.own == ref[r]
                listed = set(d.share._queues)
                assert listed == {r} if schedule == "static" else listed <= {r, *d.stats.victims}
            for s in scheds:
                s.synced()
    assert len(calls) == size * len(sets)


def test_collective_rounds_list_only_the_own_queue(monkeypatch):
    """mpi-collective's rounds: a rank runs its own queue (contiguous runs, or its homes)
    padded with None to the longest queue, and lists no other rank's queue."""
    from tessera.backends.collective import CollectiveExecutor
    from tessera.backends.tasks import TaskSet
    asked = []
    real = Share.queue
    monkeypatch.setattr(Share, "queue", lambda self, r: asked.append(r) or real(self, r))
    rng = np.random.default_rng(4)
    for _ in range(10):
        n, P = int(rng.integers(0, 120)), int(rng.integers(1, 7))
        costs = _irregular_costs(rng, n)
        bounds = run_bounds(costs, P)
        for home in (None, rng.integers(0, P, n).tolist()):
            ref = ([list(range(bounds[r], bounds[r + 1])) for r in range(P)] if home is None
                   else [[i for i in range(n) if home[i] == r] for r in range(P)])
            longest = max(map(len, ref))
            ts = TaskSet("t", costs, lambda i, b: 0.0, home=home)
            for r in range(P):
                del asked[:]
                fake = SimpleNamespace(world=SimpleNamespace(rank=r, size=P))
                got = list(CollectiveExecutor.task_order(fake, ts))
                assert got == ref[r] + [None] * (longest - len(ref[r]))
                assert set(asked) <= {r}


def test_kept_partitions_are_bounded(monkeypatch):
    """The Scheduler keeps at most MEMO_SETS task sets and MEMO_TASKS task ids; an evicted
    task set dealt again is partitioned again, the same way."""
    from tessera.backends import schedule as sched
    monkeypatch.setattr(sched, "MEMO_TASKS", 60)
    scheds = _schedulers(2, "static")
    rng = np.random.default_rng(8)
    sets = [_irregular_costs(rng, 40) for _ in range(6)]
    for _ in range(2):
        for costs in sets:
            for r, s in enumerate(scheds):
                d = s.deal(costs, 2)
                assert [i for c in d for i in c] == _reference_queues(costs, 2)[r]
                assert s._held <= 60 and len(s._memo) < len(sets)
                assert s._held == sum(m.held for m in s._memo.values())


@pytest.mark.parametrize("lookahead", [False, True])
@pytest.mark.parametrize("backend", ["serial", "threads"])
def test_task_stages_run_in_a_row_and_add(backend, lookahead):
    """A task set of ``stages`` parts: need(i, s) and work(i, blocks, s) called for s = 0,
    1, 2 in a row for each task, each part's blocks handed to its work, the task's result
    the sum of its parts' (here part s of task i returns (i + 1) * 10**s); ``lookahead``
    is ignored here (need then work, part by part)."""
    from tessera.backends.context import Context
    from tessera.backends.tasks import TaskSet
    calls, lock = {}, threading.Lock()

    def need(i, s):
        with lock:
            calls.setdefault(i, []).append(("need", s))
        return []

    def work(i, blocks, s):
        with lock:
            calls[i].append(("work", s))
        assert blocks == {}
        return float((i + 1) * 10 ** s)
    with Context(backend) as ctx:
        out = ctx.run_tasks(TaskSet("staged", [1.0] * 5, work, need, stages=3, lookahead=lookahead))
    assert all(c == [("need", 0), ("work", 0), ("need", 1), ("work", 1), ("need", 2), ("work", 2)]
               for c in calls.values()) and len(calls) == 5
    assert out.tolist() == [111.0 * (i + 1) for i in range(5)]


@pytest.mark.parametrize("nranks", [1, 2])
def test_task_stages_on_mpi_executors(nranks):
    """tests/mpi/staged_tasks.py on mpi-onesided (nxtval, steal) and mpi-collective, with
    ``lookahead`` off and on: task i's stage s reads block (i + s) % 6 of a distributed
    vector A[n] = n + 1 (tiles of 2) and returns 10**s times its sum: every task's result
    is sum_s 10**s (4 m + 3) for m = (i + s) % 6, and each rank's work saw its tasks'
    stages 0, 1, 2 in a row. The calls: need then work part by part, except under
    mpi-onesided with lookahead, where the next part's need comes before this part's work
    (need(p0), need(p1), work(p0), need(p2), work(p1), ..., work(last))."""
    from mpirun import run_mpi
    out = run_mpi(Path(__file__).parent / "mpi" / "staged_tasks.py", nranks, timeout=120)
    expected = [float(sum(10 ** s * (4 * ((i + s) % 6) + 3) for s in range(3))) for i in range(4)]
    for backend, run in out["executors"].items():
        assert run["results"] == expected, (backend, run["results"], expected)
        seen = [pair for rank in run["seen"] for pair in rank]
        assert sorted(seen) == [[i, s] for i in range(4) for s in range(3)], (backend, run["seen"])
        for rank in run["seen"]:
            assert [s for _, s in rank] == [0, 1, 2] * (len(rank) // 3), (backend, rank)
            assert all(rank[n][0] == rank[n + 1][0] == rank[n + 2][0] for n in range(0, len(rank), 3))
        ahead = backend.startswith("mpi-onesided") and backend.endswith("/ahead")
        for rank, calls in zip(run["seen"], run["calls"]):
            needs = [["need", *part] for part in rank]
            works = [["work", *part] for part in rank]
            if not ahead:
                assert calls == [c for pair in zip(needs, works) for c in pair], (backend, calls)
            elif rank:
                assert calls == needs[:1] + [c for pair in zip(needs[1:], works) for c in pair] + works[-1:], \
                    (backend, calls)
            else:
                assert calls == [], (backend, calls)
    assert len(out["executors"]) == 6
