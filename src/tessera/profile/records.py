"""This rank's records of what ran: every region (a phase, an iteration, an equation
step, a task set), when it started, how long it took and its flops; with
``detailed=True`` (``tessera run --profile``) also every task of a task set; the time
spent computing; and the memory a run held, by name.

Fed by the execution context (``backends.context``) and the job's drivers, rendered by
``profile.run`` (records files, end-of-run table) and ``profile.trace``. Communication is
recorded beside it: per operation and peer by the runtime (``profile.commlog``), per
equation term by the distributed executors (``profile.terms``).

Region kinds: ``phase`` (scf, transform, ccsd, triples), ``iteration`` (SCF or CCSD
iteration; a phase's joules are the energy counted since the previous phase ended),
``step`` kinds of an equation (``contract``, ``add``, ``hadamard``,
``zero``: flops are the whole step's, the same on every rank) and ``tasks`` (a task
set: flops are this rank's own). Only steps and task sets enter ``table``.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from tessera.profile.energy import EnergyMeter

SPAN_KINDS = ("phase", "iteration")


@dataclass(frozen=True)
class Region:
    label: str          # the update's expression text, or a task set's name
    start: float        # seconds since the recorder was made
    seconds: float
    flops: int
    kind: str = "step"
    thread: int = 0     # threading.get_ident() of the thread that ran it


class Recorder:
    """Regions run on this rank, in order, and their totals per label."""

    def __init__(self, detailed: bool = False):
        self.t0 = time.perf_counter()
        self.detailed = detailed
        self.regions: list = []
        self.tasks: list = []          # (task set, index, start, seconds, thread) if detailed
        self.table: dict = {}          # label -> [calls, seconds, flops]
        self.kinds: dict = {}          # label -> region kind (of table entries)
        self.flops = 0
        self.compute = 0.0             # seconds of arithmetic (see backends.context)
        # joules per phase from the node's energy counters (profile.energy), when profiling
        self.energy = EnergyMeter() if detailed else None
        self.joules: dict = {}
        self._joules_at = self.energy.read() if self.energy is not None else None

    def region(self, label: str, seconds: float, flops: int = 0, start: float | None = None,
               kind: str = "step") -> None:
        """Record a region that has just ended after ``seconds``; ``start``: its
        perf_counter() at the start (default: now - seconds)."""
        begin = (time.perf_counter() - seconds if start is None else start) - self.t0
        self.regions.append(Region(label, begin, seconds, int(flops), kind, threading.get_ident()))
        if kind == "phase" and self._joules_at is not None:
            now = self.energy.read()
            self.joules[label] = self.joules.get(label, 0.0) + now - self._joules_at
            self._joules_at = now
        if kind in SPAN_KINDS:
            return
        row = self.table.get(label)
        if row is None:
            row = self.table[label] = [0, 0.0, 0]
            self.kinds[label] = kind
        row[0] += 1
        row[1] += seconds
        row[2] += flops
        self.flops += flops

    def task(self, name: str, index: int, start: float, seconds: float) -> None:
        """One task of task set ``name`` (start: perf_counter()); kept if detailed."""
        self.tasks.append((name, int(index), start - self.t0, seconds, threading.get_ident()))

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
