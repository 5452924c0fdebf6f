"""Communication accounting: what each rank asked MPI to move, to whom, and how long it waited.

Every get/put/acc/fetch_add and every collective issued through the runtime is counted
on the calling rank, aggregated per (operation, peer): number of transfers, bytes and
seconds. Recording is a dict lookup and three additions, so it stays on in production.

Conventions (the input of the profiling reports):
- peer: the rank (in `world.comm`, the workers) that owns the data: the target of
  get/put/acc/fetch_add, the root of rooted collectives (bcast, gather, reduce), and
  -1 for collectives without a root (barrier, allreduce, allgather).
- nbytes: payload bytes: received for get, sent for put/acc, the operand (itemsize) for
  fetch_add, the local buffer (or pickled object) for collectives.
- count: transfers. A patch operation that touches k blocks counts k transfers.
- seconds: time the caller spent blocked in the call (issue plus wait). A call that
  moves several pieces splits its time among them in proportion to bytes.

Collectives also say which peers the data actually came from (``peers`` of ``add``):
bytes this rank received from each other rank (bcast: from the root; gather: the
root from every sender; allgather and alltoallv: from every sender; allreduce: the
reduce-scatter + allgather model, 2n/p from each other member; barrier: nothing).
These fill the collective half of the rank x rank matrix (``moved``), so each byte
between two ranks is counted once, on the receiving side.

With ``record_events(t0)`` (``tessera run --profile``) every call is also kept as an
event (op, peer, bytes, start, seconds, peers), start in seconds since ``t0``; a wait
on a non-blocking handle is an event with 0 bytes. Without it the only cost is one
``is None`` test per call.
"""

from __future__ import annotations

import json
from time import perf_counter
from dataclasses import asdict, dataclass, field

import numpy as np

ONE_SIDED_OPS = ("get", "put", "acc", "fetch_add")
LOCAL_OPS = ("sync",)        # completion of one's own operations: no bytes, no peer


_RECEIVED = ("received", None)     # snapshot key of the collectives' received bytes


def is_collective(op: str) -> bool:
    return op not in ONE_SIDED_OPS and op not in LOCAL_OPS


@dataclass(frozen=True)
class CommRecord:
    """Aggregate of one (op, peer) pair on one rank."""

    op: str
    peer: int
    count: int
    nbytes: int
    seconds: float


@dataclass(frozen=True)
class OpTotal:
    """Totals of one operation kind (over peers, or over peers and ranks)."""

    op: str
    count: int
    nbytes: int
    seconds: float


@dataclass
class CommSummary:
    """Communication of a whole run, gathered to rank 0.

    matrix[i][j]: bytes that rank i moved with peer j by one-sided operations (`ops`).
    totals: per operation, summed over all ranks. per_rank: each rank's own totals.
    """

    nranks: int
    ops: list
    matrix: list
    totals: dict
    per_rank: list = field(default_factory=list)

    def matrix_array(self) -> np.ndarray:
        return np.asarray(self.matrix, dtype=np.int64).reshape(self.nranks, self.nranks)

    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self, **kwargs) -> str:
        return json.dumps(self.to_dict(), **kwargs)


class CommLog:
    """Per-rank aggregated communication records. Not thread-safe by design (one
    thread issues the runtime's operations); the progress thread records nothing."""

    def __init__(self, rank: int = 0, enabled: bool = True):
        self.rank = rank
        self.enabled = enabled
        self._agg: dict = {}
        self._received: dict = {}      # (collective op, peer) -> bytes received from peer
        self.events: list | None = None   # [(op, peer, nbytes, start, seconds, peers)]
        self.t0 = 0.0

    def record_events(self, t0: float) -> None:
        """Keep every call from now on as an event, times relative to ``t0`` (perf_counter)."""
        self.t0 = t0
        self.events = []

    # -- recording (hot path) ---------------------------------------------------------
    def add(self, op: str, peer: int, nbytes: int, seconds: float, count: int = 1,
            peers: list | None = None) -> None:
        """Count ``count`` transfers of ``nbytes`` with ``peer`` that took ``seconds``;
        ``peers``: for a collective, [(rank, bytes received from it), ...]."""
        if not self.enabled:
            return
        slot = self._agg.get((op, peer))
        if slot is None:
            self._agg[(op, peer)] = [count, nbytes, seconds]
        else:
            slot[0] += count
            slot[1] += nbytes
            slot[2] += seconds
        if peers:
            rec = self._received
            for p, n in peers:
                rec[(op, p)] = rec.get((op, p), 0) + n
        if self.events is not None:
            self.events.append((op, peer, nbytes, perf_counter() - self.t0 - seconds, seconds, peers))

    def add_time(self, op: str, peer: int, seconds: float) -> None:
        """Add waiting time to an already counted transfer (non-blocking completion)."""
        if not self.enabled:
            return
        slot = self._agg.get((op, peer))
        if slot is None:
            self._agg[(op, peer)] = [0, 0, seconds]
        else:
            slot[2] += seconds
        if self.events is not None:
            self.events.append((op, peer, 0, perf_counter() - self.t0 - seconds, seconds, None))

    def add_split(self, op: str, parts: list, seconds: float) -> None:
        """Record several transfers of one call: parts = [(peer, nbytes), ...]; the
        call's time is shared in proportion to bytes (events: consecutive slices)."""
        if not self.enabled or not parts:
            return
        total = sum(n for _, n in parts)
        events, self.events = self.events, None
        start = perf_counter() - self.t0 - seconds if events is not None else 0.0
        for peer, n in parts:
            share = seconds * (n / total) if total else seconds / len(parts)
            self.add(op, peer, n, share)
            if events is not None:
                events.append((op, peer, n, start, share, None))
                start += share
        self.events = events

    def clear(self) -> None:
        self._agg.clear()
        self._received.clear()
        if self.events is not None:
            self.events.clear()

    # -- reading ----------------------------------------------------------------------
    def snapshot(self) -> dict:
        """A copy of the current aggregates, to diff against later with records(since=)
        and row(since=)."""
        snap = {k: tuple(v) for k, v in self._agg.items()}
        snap[_RECEIVED] = dict(self._received)
        return snap

    def records(self, since: dict | None = None) -> list[CommRecord]:
        out = []
        for (op, peer), (c, b, s) in sorted(self._agg.items(), key=lambda kv: (kv[0][0], kv[0][1])):
            if since is not None and (op, peer) in since:
                c0, b0, s0 = since[(op, peer)]
                c, b, s = c - c0, b - b0, s - s0
                if c == 0 and b == 0:
                    continue
            out.append(CommRecord(op, peer, int(c), int(b), float(s)))
        return out

    def __iter__(self):
        return iter(self.records())

    def __len__(self) -> int:
        return len(self._agg)

    def totals(self, since: dict | None = None) -> dict[str, OpTotal]:
        acc: dict = {}
        for r in self.records(since):
            c, b, s = acc.get(r.op, (0, 0, 0.0))
            acc[r.op] = (c + r.count, b + r.nbytes, s + r.seconds)
        return {op: OpTotal(op, c, b, s) for op, (c, b, s) in sorted(acc.items())}

    def received(self) -> dict:
        """{(collective op, peer): bytes received from peer} (see module docstring)."""
        return dict(self._received)

    def row(self, nranks: int, ops=ONE_SIDED_OPS, since: dict | None = None) -> np.ndarray:
        """Bytes moved with each peer by the given operations (this rank's matrix row):
        one-sided operations by their target (this rank's own included), collectives by
        the bytes received from each peer (``since`` applies to one-sided operations)."""
        row = np.zeros(nranks, dtype=np.int64)
        for r in self.records(since):
            if r.op in ops and not is_collective(r.op) and 0 <= r.peer < nranks:
                row[r.peer] += r.nbytes
        before = since.get(_RECEIVED, {}) if since is not None else {}
        for (op, peer), n in self._received.items():
            if op in ops and 0 <= peer < nranks:
                row[peer] += n - before.get((op, peer), 0)
        return row

    def to_dict(self) -> dict:
        return {"rank": self.rank, "records": [asdict(r) for r in self.records()]}

    # -- gathering (collective over world.comm) ---------------------------------------
    def matrix(self, world, ops=ONE_SIDED_OPS, since: dict | None = None) -> np.ndarray | None:
        """Collective: rank x rank byte matrix on rank 0 of world.comm, None elsewhere."""
        comm = world.comm
        row = self.row(comm.Get_size(), ops, since)
        rows = comm.gather(row, root=0)
        if comm.Get_rank() != 0:
            return None
        return np.vstack(rows)

    def summary(self, world, ops=ONE_SIDED_OPS, since: dict | None = None) -> CommSummary | None:
        """Collective: matrix, per-op totals over ranks and per-rank totals on rank 0."""
        comm = world.comm
        n = comm.Get_size()
        mine = {
            "row": self.row(n, ops, since).tolist(),
            "totals": {op: asdict(t) for op, t in self.totals(since).items()},
        }
        parts = comm.gather(mine, root=0)
        if comm.Get_rank() != 0:
            return None
        totals: dict = {}
        for p in parts:
            for op, t in p["totals"].items():
                c, b, s = totals.get(op, (0, 0, 0.0))
                totals[op] = (c + t["count"], b + t["nbytes"], s + t["seconds"])
        return CommSummary(
            nranks=n,
            ops=list(ops),
            matrix=[p["row"] for p in parts],
            totals={op: asdict(OpTotal(op, c, b, s)) for op, (c, b, s) in sorted(totals.items())},
            per_rank=[p["totals"] for p in parts],
        )
