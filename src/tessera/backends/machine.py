"""The machine a cost estimate is for: calibrated constants of one node, the network
between nodes, and how ranks sit on the nodes.

``machine.json`` (next to this module) holds constants measured on one machine by
``bench/calibrate_machine.py`` (single-thread DGEMM rate, Python work per block
product, one-sided get and accumulate of a small block, a collective call, an
all-to-all of ``mpi-collective`` as a CCSD iteration meets it (its latency and the wait
for the later rank, ``exchange_measured``), copy bandwidth between two ranks of a node;
Python work per distributed (T) task, measured apart, ``triples_task_measured``), with
where, when and under what load they were measured. The network is not measurable from one machine: its bandwidth per node and
latency are options (``tessera plan --network-bandwidth --network-latency``, defaults
NETWORK_BANDWIDTH and NETWORK_LATENCY: a 100 Gb/s link, 2 us). ``Machine.on(P, rpn)``
gives the constants ``backends.cost_model.estimate`` uses for P ranks, ``rpn`` per node.

A rank may run several BLAS threads (``tessera run --threads T``; ``tessera plan
--threads-per-rank T``): its DGEMM rate, ``Machine.rank_flops_per_second``, is T x the
single-thread rate x ``gemm_thread_efficiency`` (the rate on the calibrating machine's
cores, 2 threads, over 2 x its single-thread rate, ``bench/calibrate_machine.py``: the
efficiency measured at 2 threads is assumed for more, an estimate). Python work per
block product or (T) task does not scale with threads (one interpreter per rank), nor
does a rank's share of the network (a node's link over its ranks).

The machine of a plan: ``planning(machine)`` makes ``Machine.calibrated()`` (no
arguments) return ``machine`` while entered, so the (T) planner
(``chem.triples_budget``, ``chem.triples_window``, ``chem.triples_plan``) sees the threads
and network ``tessera plan`` was given, or a run's own threads and executor
(``Context.machine``); its caches keep results per machine (``per_machine``).

``Machine.on`` gives, per operation:

  t_get, t_acc   node's value + f_off x latency (f_off: share of the other ranks on other nodes)
  t_coll         node's value (2 ranks) + barrier_log2_seconds x (ceil(log2 P) - 1) + latency
                 x ceil(log2 nodes): a barrier of P ranks takes ceil(log2 P) rounds
                 (dissemination), ceil(log2 nodes) of them between nodes
  t_exchange     node's value (``exchange_seconds``, 2 ranks) + exchange_peer_seconds x (P - 2)
                 + latency x (ranks on other nodes): an all-to-all of mpi-collective sends
                 one message to, and receives one from, every other rank
  t_bcast        node's value (``exchange_seconds``): a broadcast along a grid line of 2
  t_bcast_round  barrier_log2_seconds + f_off x latency: per round past the first of a
                 broadcast's ceil(log2 line) (a binomial tree over the line's ranks)
  bandwidth      1 / ((1 - f_off) / copy bandwidth + f_off / (network bandwidth / rpn)):
                 a rank's bytes go to its peers evenly; a node's link is shared by its ranks
  f_off, link    f_off, and network bandwidth / rpn: the share of a rank's bytes that crosses
                 the network and the rate it gets there (what an RDMA get moves while the rank
                 computes: ``chem.triples_budget.plan_seconds``)
"""

from __future__ import annotations

import functools
import json
import math
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, replace
from pathlib import Path

from tessera.errors import InputError

CALIBRATION = Path(__file__).with_name("machine.json")
NETWORK_BANDWIDTH = 12.5e9     # bytes/s per node (100 Gb/s)
NETWORK_LATENCY = 2e-6         # s per message between nodes
FIELDS = ("gemm_flops_per_second", "task_seconds", "get_seconds", "acc_seconds",
          "collective_seconds", "copy_bytes_per_second", "triples_task_seconds", "exchange_seconds",
          "exchange_peer_seconds", "barrier_log2_seconds", "gemm_thread_efficiency")


@dataclass(frozen=True)
class Machine:
    gemm_flops_per_second: float          # single-thread DGEMM rate
    task_seconds: float
    get_seconds: float
    acc_seconds: float
    collective_seconds: float
    copy_bytes_per_second: float
    triples_task_seconds: float = 0.0     # Python work per distributed (T) task (chem.triples_tasks)
    exchange_seconds: float = 0.0         # an all-to-all of mpi-collective inside a CCSD iteration
    exchange_peer_seconds: float = 0.0    # ... more per other rank past the first
    barrier_log2_seconds: float = 0.0     # a collective call more per round past the first
    gemm_thread_efficiency: float = 1.0   # DGEMM rate on 2 threads / (2 x the single-thread rate)
    threads_per_rank: int = 1             # BLAS threads of a rank
    # whether a rank's gets from other nodes move while it computes: a network that moves
    # them itself (RDMA) and an executor that posts them ahead (mpi-onesided's lookahead,
    # ``TaskSet.lookahead``); mpi-collective fetches, then computes
    reads_overlap: bool = True
    network_bandwidth: float = NETWORK_BANDWIDTH
    network_latency: float = NETWORK_LATENCY
    measured: str = ""          # where and when the node constants were measured

    @classmethod
    def calibrated(cls, path: Path | str | None = None, **choices) -> "Machine":
        """The constants of ``path`` (default: the shipped calibration) with the network's,
        the threads per rank and ``reads_overlap`` ``choices``; with no arguments inside
        ``planning(m)``, ``m``."""
        planned = _PLANNED.get()
        if planned is not None and path is None and not choices:
            return planned
        return replace(_node(str(CALIBRATION if path is None else path)), **choices)

    @property
    def rank_flops_per_second(self) -> float:
        """The DGEMM rate of one rank, what the whole model computes at: threads_per_rank x
        the single-thread rate x gemm_thread_efficiency (one thread: the single-thread rate)."""
        if self.threads_per_rank == 1:
            return self.gemm_flops_per_second
        return self.threads_per_rank * self.gemm_flops_per_second * self.gemm_thread_efficiency

    def on(self, nranks: int, ranks_per_node: int) -> dict:
        """The per-operation constants of ``backends.cost_model.estimate`` for ``nranks`` ranks
        placed ``ranks_per_node`` to a node (module docstring)."""
        rpn = max(1, min(ranks_per_node, nranks))
        nodes = -(-nranks // rpn)
        f_off = (nranks - rpn) / (nranks - 1) if nranks > 1 else 0.0
        per_rank_link = self.network_bandwidth / rpn
        bandwidth = 1.0 / ((1 - f_off) / self.copy_bytes_per_second + f_off / per_rank_link)
        rounds, tree = (math.ceil(math.log2(n)) if n > 1 else 0 for n in (nranks, nodes))
        return {"t_task": self.task_seconds, "t_get": self.get_seconds + f_off * self.network_latency,
                "t_acc": self.acc_seconds + f_off * self.network_latency,
                "t_coll": self.collective_seconds + max(0, rounds - 1) * self.barrier_log2_seconds
                + tree * self.network_latency,
                "t_exchange": self.exchange_seconds + max(0, nranks - 2) * self.exchange_peer_seconds
                + (nranks - rpn) * self.network_latency, "t_bcast": self.exchange_seconds,
                "t_bcast_round": self.barrier_log2_seconds + f_off * self.network_latency,
                "bandwidth": bandwidth, "f_off": f_off, "link": per_rank_link, "nodes": nodes}


_PLANNED: ContextVar = ContextVar("planned machine", default=None)


@contextmanager
def planning(machine: Machine):
    """While entered, ``Machine.calibrated()`` with no arguments is ``machine`` (in this
    thread: a ContextVar): the machine a plan (``tessera plan --ranks``) is for, its threads
    and network, seen by every part of the model that asks for the calibrated machine."""
    token = _PLANNED.set(machine)
    try:
        yield machine
    finally:
        _PLANNED.reset(token)


def per_machine(maxsize: int | None = None):
    """``functools.lru_cache`` for a function whose result depends on ``Machine.calibrated()``:
    the machine is part of the key, so a plan for another machine (``planning``) does not
    read a result of this one."""
    def wrap(fn):
        cached = functools.lru_cache(maxsize)(lambda machine, *args, **kwargs: fn(*args, **kwargs))

        @functools.wraps(fn)
        def call(*args, **kwargs):
            return cached(Machine.calibrated(), *args, **kwargs)
        return call
    return wrap


@functools.lru_cache(maxsize=None)
def _node(path: str) -> Machine:
    """The node constants of the calibration file ``path``, read once per process (the
    (T) planner asks for them per candidate task and window width)."""
    try:
        data = json.loads(Path(path).read_text())
        # a calibration from before the thread efficiency was measured: 1 (threads scale fully)
        node = {k: float(data[k] if k != "gemm_thread_efficiency" else data.get(k, 1.0)) for k in FIELDS}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(f"machine calibration {path} is unreadable ({exc}); expected the JSON "
                         "written by bench/calibrate_machine.py") from None
    where = (f"{data.get('host', '?')}, {data.get('date', '?')}, load {data.get('load', '?')}; "
             f"exchange {data.get('exchange_measured', '?')}; scaling {data.get('scaling_measured', '?')}; "
             f"(T) task {data.get('triples_task_measured', '?')}; threads {data.get('threads_measured', '?')}")
    return Machine(**node, measured=where)
