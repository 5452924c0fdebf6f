"""Who runs which task: ``static``, ``nxtval`` or ``steal``, one implementation each.

Every parallel workload (contraction steps of ``mpi-onesided``, the Fock build, (T),
the transform) gets its tasks from :meth:`Scheduler.deal`; the schedule decides:

- ``static``: a cost-balanced partition (``partition="largest_first"``: Graham's LPT
  rule, each queue largest first; ``"contiguous"``: runs of consecutive tasks of
  near-equal cost, in task order, which keeps neighbouring tasks, and the data they
  share, on one rank); each rank runs its own queue and nothing else. No counter.
- ``nxtval``: one global counter (NWChem's NXTVAL) hands out tasks ``chunk`` tickets at a
  time, whoever asks first gets the next: in task order (``order="index"``: neighbours
  share data, as TCE's loops) or largest first (``order="cost"``: better balance when
  costs vary widely, as the SCF's quartets).
- ``steal``: the static partition, then stealing (Liu, Patel, Chow, IPDPS 2014, Sec.
  III-C; the same rule as UPC++/Cilk-style "steal half"): each rank drains its own queue
  through a counter in its own memory (local fetch-and-adds, ``chunk`` at a time); when
  it is empty the rank visits the others in ring order, those of its own node first, and
  steals *half of a victim's remaining tasks from the back of its queue* with one remote
  fetch-and-add on the victim's counter, until every queue is empty. The victim keeps its
  front (its next tasks, whose blocks it may be fetching) in order; a steal is one
  contiguous run of the queue's tail. On several nodes with progress ``none`` it steals
  from its own node's ranks only (``Scheduler.victims``).

  The queue's counter is two-ended in one int64: ``front + back * 2**32`` (tasks taken
  from either end). The owner adds ``chunk`` (front), a thief adds ``want * 2**32``
  (back); one atomic fetch-and-add returns both ends as they stood, so each claim gets
  exactly the tasks between the two ends it covers, and the queue is empty when they
  meet. A thief whose claim went past the front gives its excess back; the owner, when
  its claim meets the back, closes the queue with one fetch-and-add that sets the front
  to the queue's length and the back to zero (once the thieves gave back their excess).

``nxtval`` across nodes without a helper to serve the counter (ranks on more than one
node and progress ``none``: no ghost holds it, no progress thread answers for a busy
rank) is hierarchical instead of one counter on worker 0, whose fetch-and-adds from
other nodes would complete only when worker 0 enters MPI: the tasks are first split
among the nodes (by cost: contiguous runs for ``order="index"``, largest first for
``"cost"``, each in the deal's order), each node's share is handed out by a counter on
the node's first worker, ``chunk`` tickets at a time, to that node's ranks only; a rank
whose node has run out steals half of what another node has left (``steal``'s rule,
node by node in ring order). Counter traffic between nodes is then one read per other
node per rank and deal, plus the steals.

Counters are not reset between deals (a reset needs two barriers); every rank must know
where a counter stands after a deal without a message. Under nxtval every claim takes
``chunk`` tickets and every rank stops after exactly one failing claim, so the counter
ends ``chunk * (claims with tasks + ranks)`` above its start. Under steal (and the
hierarchical nxtval's node counters) claims vary in size (half of what is left), so a
claim that runs past the end of a queue gives the excess back and, with the owner's
closing fetch-and-add under steal, the queue's counter ends exactly ``len(queue)`` above
its start. A counter
is used again only after a barrier (``synced``), when every claim of its last deal is
complete; with ``NCOUNTERS`` counters in turn, consecutive deals need no barrier.

What a rank builds per deal (:class:`Share`): the queue lengths of every rank (or node),
its own queue, and another's only when it steals from it; a static rank keeps nothing
else. A task set's partition and largest-first order are computed once and kept by the
Scheduler, by the content of its costs (``MEMO_SETS`` task sets, ``MEMO_TASKS`` task
ids): a step dealt again with the same costs (every CCSD iteration) reuses them, and
only hashes its costs. The one part still linear in Python per task is Graham's rule of
the ``largest_first`` partition (a heap operation per task), once per task set; sorts,
masks and counts are NumPy.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from tessera.backends.registry import check_schedule
from tessera.runtime import TaskCounter
from tessera.runtime.distribution import largest_first_order, largest_first_sorted, run_bounds

NCOUNTERS = 4
SHIFT = 32                 # steal: a queue's counter holds front + back * BACK ...
BACK = 1 << SHIFT          # ... (tasks taken from either end; a queue < 2**31 tasks)
MEMO_SETS = 64             # task sets whose share or order a Scheduler keeps ...
MEMO_TASKS = 1 << 22       # ... holding at most this many task ids together
PARTITIONS = ("largest_first", "contiguous")
ORDERS = ("index", "cost")


@dataclass
class DealStats:
    """What this rank did in its deals (summed over deals)."""
    tasks: int = 0                 # tasks run here
    stolen: int = 0                # of which taken from another rank's queue
    steals: int = 0                # successful steal operations
    counter_local: int = 0         # fetch-and-adds on a counter in this rank's memory
    counter_remote: int = 0        # fetch-and-adds on another rank's counter
    victims: dict = field(default_factory=dict)   # victim rank -> tasks stolen

    def as_dict(self) -> dict:
        return {"tasks": self.tasks, "stolen": self.stolen, "steals": self.steals,
                "counter_local": self.counter_local, "counter_remote": self.counter_remote,
                "victims": dict(self.victims)}


def partition(costs, nranks: int, how: str = "largest_first") -> list:
    """[[task, ...] per rank] of the static partition (deterministic, the same on every rank);
    ``contiguous``: a range per rank (its cut points, no list of every task)."""
    share = Share(costs, nranks, how)
    return [share.queue(r) for r in range(nranks)]


class Share:
    """The static partition of one task set over ``nbins`` ranks (or nodes), as one rank
    needs it: ``lengths`` (tasks per bin) and ``queue(r)``, bin r's tasks, listed when
    asked (NumPy, no Python work per task of another bin):

    - ``how="contiguous"``: a range per bin (``run_bounds``, near-equal cost);
    - ``how="largest_first"``: Graham's rule (``largest_first``), each queue largest first;
    - ``home``: task i on bin ``home[i]``, each queue in task order (costs unused).

    ``keep``: the one bin whose queue is ever asked for (a static deal, a collective
    run): it is listed at once and nothing of the others is kept but their lengths."""

    def __init__(self, costs, nbins: int, how: str = "largest_first", home=None, keep: int | None = None):
        if home is None and how not in PARTITIONS:
            raise ValueError(f"unknown partition {how!r}; expected one of {PARTITIONS}")
        self.how = "home" if home is not None else how
        self._queues: dict = {}
        if self.how == "contiguous":
            self.bounds = run_bounds(costs, nbins).tolist()
            self.lengths = [b - a for a, b in zip(self.bounds, self.bounds[1:])]
        else:
            if home is not None:
                order, bins = None, np.asarray(home, dtype=np.int64)
            else:
                costs = np.asarray(costs, dtype=float)
                order = largest_first_order(costs)
                bins = largest_first_sorted(costs[order], nbins)
            counts = np.bincount(bins, minlength=nbins)
            self.lengths = counts.tolist()
            self.starts = np.concatenate(([0], np.cumsum(counts))).tolist()
            by_bin = np.argsort(bins, kind="stable")          # the queues one after the other
            self.flat = (by_bin if order is None else order[by_bin]).astype(np.int32 if len(bins) < 2**31 else np.int64)
            if keep is not None:
                self.queue(keep)
                self.flat = None                      # only ``keep``'s queue is asked for
        # task ids it may hold: its kept queue, or the queues (an array) and those listed from it
        self.held = 2 * len(self.flat) if getattr(self, "flat", None) is not None else len(self._queues.get(keep, ()))

    def queue(self, r: int):
        """Bin r's tasks in the order it runs them (listing them is O(its own tasks))."""
        if self.how == "contiguous":
            return range(self.bounds[r], self.bounds[r + 1])
        q = self._queues.get(r)
        if q is None:
            q = self._queues[r] = self.flat[self.starts[r]:self.starts[r + 1]].tolist()
        return q

    @property
    def longest(self) -> int:
        return max(self.lengths, default=0)


class Deal:
    """One hand-out of tasks on one rank: iterate for chunks (lists of task ids);
    ``own`` is this rank's static queue (prefetch it), ``stats`` counts what happened."""

    def __init__(self, scheduler: "Scheduler", costs, chunk: int, how: str, home=None, order: str = "index"):
        self.s = scheduler
        self.n = len(costs)
        self.chunk = max(1, int(chunk))
        self.stats = DealStats()
        size, me = scheduler.size, scheduler.rank
        if order not in ORDERS:
            raise ValueError(f"unknown task order {order!r}; expected one of {ORDERS}")
        if how not in PARTITIONS:
            raise ValueError(f"unknown partition {how!r}; expected one of {PARTITIONS}")
        self.schedule = "static" if home is not None else scheduler.schedule
        if home is not None:                  # only this rank's queue: nothing is stolen
            self.own = Share(None, size, home=home, keep=me).queue(me)
        elif self.schedule == "nxtval" and scheduler.leaders:
            self.schedule = "node"
            how = "contiguous" if order == "index" else "largest_first"
            self.share = scheduler.shared(("share", len(scheduler.leaders), how), costs,
                                          lambda: Share(costs, len(scheduler.leaders), how))
            self.own = []
        elif self.schedule == "nxtval" or size == 1:
            self.order = (range(self.n) if order == "index"          # no list of every task
                          else scheduler.shared(("order",), costs, lambda: largest_first_order(costs)))
            self.own = self.order if size == 1 else []
        else:
            keep = me if self.schedule == "static" else None           # static: no other queue is read
            self.share = scheduler.shared(("share", size, how, keep), costs,
                                          lambda: Share(costs, size, how, keep=keep))
            self.own = self.share.queue(me)

    def __iter__(self):
        s = self.s
        if s.size == 1 and self.schedule != "static":    # one rank: everything, no counter
            for start in range(0, self.n, self.chunk):
                yield self._got(self.order[start:start + self.chunk])
            return
        if self.schedule == "static":
            for start in range(0, len(self.own), self.chunk):
                yield self._got(self.own[start:start + self.chunk])
            return
        k = s.take_counter()
        if self.schedule == "nxtval":
            # fixed claims only: every rank ends with one failing claim, so the counter
            # ends at base + chunk * (claims that got tasks + ranks): nothing to give back
            yield from self._claims(k, None, 0, self.order, self.chunk, give_back=False)
            s.advance(k, [self.chunk * (-(-self.n // self.chunk) + s.size)])
            return
        if self.schedule == "node":
            # the own node's counter (on its first worker), then steal node by node
            nodes, mine = len(s.leaders), s.node
            yield from self._claims(k, s.leaders[mine], mine, self.share, self.chunk)
            for j in range(1, nodes):
                victim = (mine + j) % nodes
                yield from self._claims(k, s.leaders[victim], victim, self.share, None)
            s.advance(k, self.share.lengths)
            return
        me = s.rank
        yield from self._front(k, me, self.share, self.chunk)
        for victim in s.victims():
            yield from self._tail(k, victim, self.share)
        s.advance(k, self.share.lengths)

    def _got(self, ids, victim=None):
        ids = ids.tolist() if isinstance(ids, np.ndarray) else list(ids)
        self.stats.tasks += len(ids)
        if victim is not None:
            self.stats.stolen += len(ids)
            self.stats.steals += 1
            self.stats.victims[victim] = self.stats.victims.get(victim, 0) + len(ids)
        return ids

    def _claims(self, k, target, q, queue, chunk, give_back: bool = True):
        """Claim tasks of ``queue`` (a sequence, or a Share: its bin q's queue, listed only
        when a claim gets tasks) through counter k's entry ``q`` (on rank ``target``; None:
        the global counter) until it is empty, from its front: ``chunk`` at a time, or
        (chunk None: a steal from another node's counter) half of what is left, read
        first. With ``give_back`` the excess of a claim past the end is given back (claims
        of varying size: the end value is then known)."""
        s = self.s
        n = queue.lengths[q] if isinstance(queue, Share) else len(queue)
        base = s.bases[k][q]
        while True:
            if chunk is None:
                seen = s.fetch_add(k, 0, target, self.stats) - base
                if seen >= n:
                    return
                want = max(1, (n - seen) // 2)
            else:
                want = chunk
            start = s.fetch_add(k, want, target, self.stats) - base
            excess = start + want - n
            if give_back and excess > 0:
                s.fetch_add(k, -min(excess, want), target, self.stats)
            if start >= n:
                return
            if isinstance(queue, Share):
                queue = queue.queue(q)
            yield self._got(queue[start:min(start + want, n)], target if chunk is None else None)

    # -- steal: a two-ended queue per rank (module docstring) ------------------------------
    def _ends(self, k, n: int, q: int) -> tuple:
        """(front, back) of queue q as they stood before a fetch-and-add of ``n`` on its
        counter: the tasks claimed from either end (claims' excess included until it is
        given back; the owner's close takes from the back what thieves took)."""
        d = self.s.fetch_add(k, n, q, self.stats) - self.s.bases[k][q]
        front = d & (BACK - 1)
        return front, (d - front) >> SHIFT

    def _front(self, k, q, share, chunk):
        """The owner drains its queue q from the front, ``chunk`` at a time, until it meets
        the back; then it closes the queue: its counter ends at base + len(queue) (one
        fetch-and-add that sets the front to the end and the back to zero)."""
        n = share.lengths[q]
        while True:
            front, back = self._ends(k, chunk, q)
            got = max(0, min(front + chunk, n - back) - front)
            if got:
                yield self._got(share.queue(q)[front:front + got])
            if got < chunk:     # nothing left: the back is n - front - got once thieves gave back
                self.s.fetch_add(k, n - front - chunk - (n - front - got) * BACK, q, self.stats)
                return

    def _tail(self, k, q, share):
        """Steal from rank q's queue: half of what is left (read first), from its back, one
        contiguous run per steal, until the front and the back meet; a claim that reached
        past the front gives the excess back."""
        n = share.lengths[q]
        while True:
            front, back = self._ends(k, 0, q)
            left = n - back - front
            if left <= 0:
                return
            want = max(1, left // 2)
            front, back = self._ends(k, want * BACK, q)
            end = n - back
            got = max(0, end - max(front, end - want))
            if got < want:
                self.s.fetch_add(k, (got - want) * BACK, q, self.stats)
            if not got:
                return
            yield self._got(share.queue(q)[end - got:end], q)


def _held(memo) -> int:
    return memo.held if isinstance(memo, Share) else len(memo)


class Scheduler:
    """The task hand-out of one executor (or of one workload) over ``world``'s ranks.

    ``schedule``: static | nxtval | steal. ``barrier``: the owner's barrier, called when
    all counters were used since the last one; it must call ``synced`` (as the owner does
    after each of its barriers; the default is a world barrier and ``synced``). Creating it is collective (its counters are RMA windows);
    ``make_counter(kind)`` replaces ``TaskCounter`` (tests simulate ranks in one process)."""

    def __init__(self, world, schedule: str, barrier=None, make_counter=None):
        self.schedule = check_schedule(schedule)
        self.world = world
        self.rank, self.size = world.rank, world.size
        self._barrier = barrier or self._world_barrier
        self.counters = []
        # nxtval on several nodes with no ghost or thread to serve a counter: one counter
        # per node, on its first worker (``leaders[node]``; module docstring)
        node_of = self.node_of = list(getattr(world, "node_of", None) or [0] * self.size)
        progress = getattr(getattr(world, "options", None), "progress", "none")
        self.leaders = []
        # steal on several nodes with none to serve a busy rank's counter: steals stay on the node
        self.node_steals = schedule == "steal" and len(set(node_of)) > 1 and progress == "none"
        if schedule == "nxtval" and len(set(node_of)) > 1 and progress == "none":
            self.leaders = [node_of.index(n) for n in range(max(node_of) + 1)]
            self.node = node_of[self.rank]
        if self.size > 1 and schedule != "static":
            kind = "global" if schedule == "nxtval" and not self.leaders else "per_rank"
            make = make_counter or (lambda kind: TaskCounter(kind=kind, world=world))
            self.counters = [make(kind) for _ in range(NCOUNTERS)]
        self.bases = [[0] * self.size for _ in range(NCOUNTERS)]
        self.epoch = 0
        self._used = [-1] * NCOUNTERS
        self._memo: dict = {}          # (what, costs' digest) -> Share or order, oldest first
        self._held = 0                 # task ids in _memo

    def deal(self, costs, chunk: int = 1, partition: str = "largest_first", home=None,
             order: str = "index") -> Deal:
        """This rank's share of tasks 0..len(costs)-1 (iterate the result for chunks).
        Collective in the sense that every rank must deal the same tasks in the same order.
        ``home[i]``: the rank task i must run on (a static deal, whatever the schedule);
        ``order``: nxtval's (and one rank's) hand-out order, ``index`` or ``cost``."""
        return Deal(self, np.asarray(costs, dtype=float), chunk, partition, home, order)

    def shared(self, what: tuple, costs: np.ndarray, make):
        """``make()`` (a Share or an order) of the task set with these ``costs`` (by content,
        a 16-byte BLAKE2 digest of them) and ``what``, kept for the next deal of the same
        costs: a step dealt every iteration builds its partition once."""
        key = (what, len(costs), hashlib.blake2b(costs.tobytes(), digest_size=16).digest())
        hit = self._memo.pop(key, None)
        if hit is None:
            hit = make()
            self._held += _held(hit)
        self._memo[key] = hit                     # the most recently used last
        while len(self._memo) > MEMO_SETS or (self._held > MEMO_TASKS and len(self._memo) > 1):
            self._held -= _held(self._memo.pop(next(iter(self._memo))))
        return hit

    # -- counters (used by Deal) -----------------------------------------------------------
    def victims(self) -> list:
        """The ranks ``steal`` visits in turn: the others in ring order, those of this
        rank's node first (their counters answer through the node's memory, while one on
        another node may answer only when its rank enters MPI), and with progress ``none``
        on several nodes only those (a steal from a busy rank elsewhere would wait for it)."""
        me, node = self.rank, self.node_of[self.rank]
        ring = [(me + j) % self.size for j in range(1, self.size)]
        if self.node_steals:
            return [r for r in ring if self.node_of[r] == node]
        return sorted(ring, key=lambda r: self.node_of[r] != node)

    def take_counter(self) -> int:
        for k in range(NCOUNTERS):
            if self._used[k] != self.epoch:
                self._used[k] = self.epoch
                return k
        self._barrier()                  # calls synced(): every counter is free again
        self._used[0] = self.epoch
        return 0

    def _world_barrier(self) -> None:
        self.world.barrier()
        self.synced()

    def synced(self) -> None:
        """The owner passed a barrier: every claim on every counter is complete."""
        self.epoch += 1

    def fetch_add(self, k: int, n: int, target, stats: DealStats) -> int:
        host = 0 if target is None else target
        if host == self.rank:
            stats.counter_local += 1
        else:
            stats.counter_remote += 1
        return int(self.counters[k].fetch_add(n, target))

    def advance(self, k: int, lengths) -> None:
        for q, n in enumerate(lengths):
            self.bases[k][q] += n

    def free(self) -> None:
        """Collective: release the counters."""
        for c in self.counters:
            c.free()
        self.counters = []
