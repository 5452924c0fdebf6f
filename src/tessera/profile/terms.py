"""Communication and compute accounting per equation term, for the distributed executors.

Around each step the executor takes ``world.comm_log.snapshot()`` and afterwards adds the
difference, keyed by the step's label (the update's expression text), to a per-term
table. At the end ``summary()`` (collective) sums the ranks' tables on rank 0:
per term and in total the number of one-sided gets and accumulates (of which
``local_accs`` went to the caller's own blocks: still an MPI accumulate, no bytes
between ranks), the bytes they moved, counter operations, and the bytes and calls of
every collective. ``bytes_moved`` counts bytes between ranks only.
"""

from __future__ import annotations



def _blank() -> dict:
    return {"gets": 0, "get_bytes": 0, "accs": 0, "acc_bytes": 0, "local_accs": 0, "local_acc_bytes": 0,
            "puts": 0, "put_bytes": 0,
            "counter_ops": 0, "syncs": 0, "collectives": {}, "seconds": 0.0, "compute_seconds": 0.0,
            "flops": 0, "calls": 0}


class CommAccount:
    """Per-term communication of this rank (see module docstring)."""

    def __init__(self, world):
        self.world = world
        self.terms: dict = {}
        self.order: list = []

    def begin(self):
        return self.world.comm_log.snapshot()

    def end(self, label: str, snap, seconds: float = 0.0, compute: float = 0.0, flops: int = 0,
            count_call: bool = True) -> None:
        row = self.terms.get(label)
        if row is None:
            row = self.terms[label] = _blank()
            self.order.append(label)
        me = self.world.rank
        for r in self.world.comm_log.records(since=snap):
            _add_record(row, r.op, r.count, r.nbytes, r.peer == me)
        row["seconds"] += seconds
        row["compute_seconds"] += compute
        row["flops"] += flops
        row["calls"] += 1 if count_call else 0

    def summary(self) -> dict | None:
        """Collective: per-term and total counts summed over ranks, on rank 0 (else None)."""
        mine = {"terms": self.terms, "order": self.order}
        parts = self.world.gather(mine, root=0)
        if parts is None:
            return None
        order = []
        for p in parts:
            for lab in p["order"]:
                if lab not in order:
                    order.append(lab)
        per_term = []
        total = _blank()
        per_rank = []
        for p in parts:
            mine_total = _blank()
            for row in p["terms"].values():
                _merge(mine_total, row)
            per_rank.append({k: mine_total[k] for k in ("gets", "get_bytes", "accs", "acc_bytes", "local_accs",
                                                         "counter_ops", "collectives", "seconds",
                                                         "compute_seconds")})
            per_rank[-1]["bytes_moved"] = _moved(mine_total)
        for lab in order:
            row = _blank()
            for p in parts:
                if lab in p["terms"]:
                    _merge(row, p["terms"][lab])
            row["bytes_moved"] = _moved(row)
            row["seconds"] = max(p["terms"][lab]["seconds"] for p in parts if lab in p["terms"])
            row["calls"] = max(p["terms"][lab]["calls"] for p in parts if lab in p["terms"])
            _merge(total, row, seconds=False)
            per_term.append({"update": lab, **row})
        total["bytes_moved"] = _moved(total)
        total["seconds"] = max((r["seconds"] for r in per_rank), default=0.0)
        return {"per_term": per_term, "total": total, "per_rank": per_rank}


def _add_record(row: dict, op: str, count: int, nbytes: int, to_self: bool = False) -> None:
    if op == "get":
        row["gets"] += count
        row["get_bytes"] += nbytes
    elif op == "acc":
        row["accs"] += count
        row["acc_bytes"] += nbytes
        if to_self:           # an accumulate into this rank's own block (still through MPI)
            row["local_accs"] += count
            row["local_acc_bytes"] += nbytes
    elif op == "put":
        row["puts"] += count
        row["put_bytes"] += nbytes
    elif op == "fetch_add":
        row["counter_ops"] += count
    elif op == "sync":
        row["syncs"] += count
    else:
        c = row["collectives"].setdefault(op, {"calls": 0, "bytes": 0})
        c["calls"] += count
        c["bytes"] += nbytes


def _merge(into: dict, row: dict, seconds: bool = True) -> None:
    for k in ("gets", "get_bytes", "accs", "acc_bytes", "local_accs", "local_acc_bytes", "puts", "put_bytes",
              "counter_ops", "syncs", "flops", "calls"):
        into[k] += row.get(k, 0)
    if seconds:
        into["seconds"] += row.get("seconds", 0.0)
    into["compute_seconds"] += row.get("compute_seconds", 0.0)
    for op, c in row.get("collectives", {}).items():
        d = into["collectives"].setdefault(op, {"calls": 0, "bytes": 0})
        d["calls"] += c["calls"]
        d["bytes"] += c["bytes"]


def _moved(row: dict) -> int:
    """Payload bytes between ranks: gets, puts, accumulates to other ranks, collectives."""
    return int(row["get_bytes"] + row["acc_bytes"] - row["local_acc_bytes"] + row["put_bytes"]
               + sum(c["bytes"] for c in row["collectives"].values()))
