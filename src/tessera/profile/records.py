"""This rank's records of what ran: every region (an equation step, a task set), when it
started, how long it took and its flops; and the memory a run held, by name.

Fed by the execution context (``backends.context``) and rendered here for the run's
JSON. Communication is recorded beside it: per operation and peer by the runtime
(``profile.commlog``), per equation term by the distributed executors (``profile.terms``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Region:
    label: str          # the update's expression text, or a task set's name
    start: float        # seconds since the recorder was made
    seconds: float
    flops: int


class Recorder:
    """Regions run on this rank, in order, and their totals per label."""

    def __init__(self):
        self.t0 = time.perf_counter()
        self.regions: list = []
        self.table: dict = {}          # label -> [calls, seconds, flops]
        self.flops = 0

    def region(self, label: str, seconds: float, flops: int = 0) -> None:
        """Record a region that has just ended after ``seconds``."""
        self.regions.append(Region(label, time.perf_counter() - self.t0 - seconds, seconds, int(flops)))
        row = self.table.setdefault(label, [0, 0.0, 0])
        row[0] += 1
        row[1] += seconds
        row[2] += flops
        self.flops += flops

    def rows(self) -> list:
        """(label, calls, seconds, flops) per label, slowest first."""
        return sorted(((k, *v) for k, v in self.table.items()), key=lambda r: -r[2])


def slowest(recorder: Recorder, limit: int = 25) -> list:
    """The JSON's ``profile``: the slowest regions with calls, seconds and flops."""
    return [{"update": label, "calls": n, "seconds": s, "flops": f}
            for label, n, s, f in recorder.rows()[:limit]]


def imbalance(values) -> float:
    """Load imbalance of per-rank values (busy time, bytes): max / mean (1.0 is perfect)."""
    values = [float(v) for v in values]
    mean = sum(values) / len(values) if values else 0.0
    return max(values) / mean if mean > 0 else 1.0


def memory_table(parts: list, whole: dict) -> dict:
    """The JSON's ``memory_per_rank`` from every rank's ``{name: bytes}`` (same names on
    every rank) and the bytes of the whole tensors: per name a list over ranks, the total
    per rank, and max/mean of the total."""
    names = list(parts[0]) if parts else []
    out = {name: [p[name] for p in parts] for name in names}
    total = [sum(p.values()) for p in parts]
    out.update(total=total, max_over_mean=imbalance(total))
    out.update({f"whole_{name}_bytes": b for name, b in whole.items()})
    return out
