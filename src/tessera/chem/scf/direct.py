"""The direct Fock build from symmetry-unique shell quartets, on one process and over ranks.

Every build recomputes the representative shell quartets (ij|kl), kl <= ij, one per
orbit of the point group (the same quartets the in-memory build keeps,
``integrals.s8_integrals``), and contracts each at once into the skeleton J and K,
weighted by its orbit size (``s8fill.c``'s ``tessera_s8_direct_jk``: libcint into a buffer
and the same contraction as ``tessera_s8_jk``; nothing is kept); the sum over the
ranks (one allreduce of G, nao^2) is symmetrised over the group's operations afterwards
(the skeleton Fock matrix of M. Dupuis and H. F. King, Int. J. Quantum Chem. 11, 613
(1977)). The tasks are contiguous ranges of shell pairs ij of near-equal cost (the
integrals of their representatives, ``integrals.all_pair_costs``) run as a ``TaskSet`` on
the context: dealt by the SCF's schedule under ``mpi-onesided`` (static ranges, NXTVAL, or
those ranges with stealing), static rounds under ``mpi-collective``, every task here on
one process; inside a task the rank's threads claim its shell pairs from a shared counter.

Between full builds the build is incremental (``fock.Incremental``: G(D_last) +
G(D - D_last)), and each representative quartet is screened by its Schwarz bound and by
the density-weighted bound Q_ij Q_kl max(4|D_ij|, 4|D_kl|, |D_ik|, |D_jl|, |D_il|, |D_jk|)
(M. Haser and R. Ahlrichs, J. Comput. Chem. 10, 104 (1989); shell-pair maxima of the
density the build contracts, D - D_last when incremental). The skeleton is exact for a
density the group leaves unchanged (every SCF density here, and so their differences); a
build of another density runs with the identity alone (every quartet, orbit 1). Without
point-group operations (C1) that is every build.
"""

from __future__ import annotations

import ctypes
import queue
import threading
import time

import numpy as np

from tessera.backends.context import thread_limit
from tessera.backends.registry import check_schedule
from tessera.backends.tasks import TaskSet
from tessera.chem.scf.fock import Incremental, SCREENING, REBUILD_EVERY, shell_maxima
from tessera.chem.scf.integrals import (PAIR_TASKS_PER_WORKER, BlockERI, Skeleton, all_pair_costs,
                                        on_threads, s8_library, shell_operations, pair_ranges,
                                        schwarz_bounds)
from tessera.chem.scf.tasks import count_skipped_shell_quartets
from tessera.errors import SymmetryError

_DEAL_KEYS = ("stolen", "steals", "counter_local", "counter_remote")


class DirectFock:
    """``build(dm) -> G`` recomputing the representative quartets (module docstring);
    ``history``: this rank's statistics per build (``stats.summarize``). Collective: every
    rank constructs it inside ``context`` and calls ``build`` the same number of times."""

    blocks = tasks = None
    mode = "direct"

    def __init__(self, mol, context, *, schedule: str = "steal", screening: float = SCREENING,
                 rebuild_every: int | None = REBUILD_EVERY, threads: int = 1):
        self.schedule = check_schedule(schedule)
        self.delta = Incremental(screening, rebuild_every)
        self.threshold = float(screening)
        self.threads = max(1, int(threads))
        self.context, self.ranks = context, context.ranks
        t0 = time.perf_counter()
        self.eri = BlockERI(mol)
        self.qshell = np.ascontiguousarray(schwarz_bounds(self.eri, mol))
        nbas, nao = mol.nbas, mol.nao
        identity = (np.arange(nbas), np.arange(nao), np.ones(nao))
        ops = shell_operations(mol) or [identity]
        self.skeleton = Skeleton(ops, self.eri.ao_loc, nao, None, (0, nbas * (nbas + 1) // 2))
        self.shell_map = np.ascontiguousarray([s for s, _, _ in ops], dtype=np.int32)
        size = self.ranks.size
        cost = all_pair_costs(mol, self.shell_map, self.ranks if size > 1 else None)
        workers = getattr(context.executor, "workers", 1)          # a threads executor's
        self.ranges, self.costs = pair_ranges(cost, PAIR_TASKS_PER_WORKER * size * workers * self.threads)
        self.quartet_counts = count_skipped_shell_quartets(self.qshell, self.threshold)
        self.scratch = queue.SimpleQueue()     # libcint scratch of each concurrent caller, kept between builds
        self.setup_seconds = time.perf_counter() - t0
        self.history: list = []

    def build(self, dm: np.ndarray) -> np.ndarray:
        """G(D) = J - K/2 on every rank for the replicated density ``dm``."""
        with thread_limit(self.threads, None):
            return self.delta.build(np.ascontiguousarray(dm, dtype=np.float64), self._build)

    def shell_density(self, dm: np.ndarray) -> np.ndarray:
        """max |D| over the functions of each shell pair, (nbas, nbas)."""
        return shell_maxima(dm, self.eri.ao_loc)

    def _build(self, dm: np.ndarray, incremental: bool) -> np.ndarray:
        t_start = time.perf_counter()
        sym = len(self.shell_map) > 1 and self.skeleton.invariant(dm)
        nops = len(self.shell_map) if sym else 1
        dsh = self.shell_density(dm)
        nao, e, ptr = self.skeleton.nao, self.eri, ctypes.c_void_p
        direct_jk = s8_library().tessera_s8_direct_jk
        spare, made = queue.SimpleQueue(), []      # each concurrent caller's vj, vk, counts
        busy, lock = {"wall": 0.0, "cpu": 0.0, "tasks": 0}, threading.Lock()

        def one(counter, end):
            try:
                part = spare.get_nowait()
            except queue.Empty:
                try:
                    scratch = self.scratch.get_nowait()
                except queue.Empty:
                    scratch = e.scratch()
                part = (np.zeros((nao, nao)), np.zeros((nao, nao)), np.zeros(3, dtype=np.int64), scratch)
                made.append(part)
            vj, vk, counts, scratch = part
            rc = direct_jk(ctypes.cast(e._intor, ptr), e._cintopt, e._atm.ctypes.data_as(ptr), e._natm,
                           e._bas.ctypes.data_as(ptr), e._nbas, e._env.ctypes.data_as(ptr),
                           e.ao_loc.ctypes.data_as(ptr), nao, nops, self.shell_map.ctypes.data_as(ptr),
                           self.qshell.ctypes.data_as(ptr), dsh.ctypes.data_as(ptr), self.threshold,
                           dm.ctypes.data_as(ptr), counter, end, vj.ctypes.data_as(ptr),
                           vk.ctypes.data_as(ptr), counts.ctypes.data_as(ptr), scratch.ctypes.data_as(ptr))
            spare.put(part)
            return rc

        # this thread's CPU time, or the process's when the task runs threads of its own
        clock = time.thread_time if self.threads == 1 else time.process_time

        def work(t, _blocks):
            start, end = self.ranges[t]
            wall, cpu = time.perf_counter(), clock()
            if any(on_threads(lambda counter: one(counter, end), self.threads, start)):
                raise SymmetryError("s8fill: more than 64 point-group operations")
            with lock:              # a threads executor's workers run tasks at once
                busy["wall"] += time.perf_counter() - wall
                busy["cpu"] += clock() - cpu
                busy["tasks"] += 1
            return 0.0

        t_tasks = time.perf_counter()
        self.context.run_tasks(TaskSet("scf.fock", self.costs, work, schedule=self.schedule,
                                       partition="contiguous", order="cost"))
        deal = self.context.deal_stats
        tasks_s = time.perf_counter() - t_tasks
        t = time.perf_counter()
        g = np.zeros((nao, nao))
        counts = np.zeros(3, dtype=np.int64)
        for vj, vk, c, scratch in made:
            g += vj - 0.5 * vk
            counts += c
            self.scratch.put(scratch)
        g = self.ranks.allreduce(g + g.T)
        if sym:
            g = self.skeleton.symmetrize(g)
        self.history.append({
            "tasks": busy["tasks"], "busy_s": busy["wall"], "busy_cpu_s": busy["cpu"],
            "tasks_s": tasks_s, "reduce_s": time.perf_counter() - t,
            "wall_s": time.perf_counter() - t_start, "tasks_active": len(self.ranges),
            "incremental": incremental, "skeleton": sym, "integrals": int(counts[2]),
            "shell_quartets_computed": int(counts[0]), "shell_quartets_screened": int(counts[1]),
            **{k: getattr(deal, k, 0) for k in _DEAL_KEYS},
            "victims": dict(deal.victims) if deal is not None else {}})
        return g

    def free(self) -> None:
        self.delta.last = None
