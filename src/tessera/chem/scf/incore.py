"""The in-memory Fock build: 8-fold symmetric AO integrals and a J/K kernel for them.

On one process the unique integrals (ij|kl), i >= j, k >= l, ij >= kl, are computed once
by libcint (one shell quartet per point-group orbit, the others written from it:
``integrals.s8_integrals``; threads) and kept, npair (npair + 1) / 2 doubles with
npair = nao (nao + 1) / 2; every build is then one call of a C kernel, G(D) = J(D) -
K(D)/2: with point-group operations the skeleton J/K from the representative quartets
(``integrals.Skeleton``), else PySCF's for all 8-fold integrals
(``pyscf.scf._vhf.incore``, OpenMP-parallel). No Python loop touches an integral. This
build is kept after the SCF for the transform of the same molecule (``hand_over``).

Over several ranks the representative quartets (the identity's alone without a point
group) are computed once, as a task set of ranges of shell pairs dealt with the SCF's
schedule (static ranges, NXTVAL, or those ranges with stealing; ``Context.run_tasks``);
each rank keeps, compact, the representatives of the pairs it computed, and every build
contracts them into its part of the skeleton J and K (``Skeleton.parts_jk``); one
allreduce of G sums the parts. No rank of several holds all integrals: the choice
(``fits``) counts each rank's share of the static partition (``integrals.s8_shares``), and
a rank keeps no more than its memory budget leaves room for.
"""

from __future__ import annotations

import logging
import time

import numpy as np
from pyscf.lib import with_omp_threads
from pyscf.scf import _vhf

from tessera.backends.registry import check_schedule
from tessera.backends.tasks import TaskSet
from tessera.chem.reference import KeptIntegrals
from tessera.chem.scf.integrals import (PAIR_TASKS_PER_WORKER, ShellPairQuartets, Skeleton,
                                        all_pair_costs, shell_operations, pair_ranges,
                                        s8_bytes, s8_integrals)  # noqa: F401  (s8_bytes: this module's API)
from tessera.errors import SymmetryError

_log = logging.getLogger(__name__)


def s8_fits(nao: int, budget: float) -> bool:
    """Whether the 8-fold integrals of ``nao`` functions fit ``budget`` (bytes per rank,
    ``backends.budget``): the rule of the in-memory transform (the SCF's is ``fits``)."""
    return s8_bytes(nao) <= float(budget)


def fits(ranks, need: int, budget: float) -> tuple:
    """(fits, largest need, smallest room): whether every rank's ``need`` bytes of
    integrals fit in the room its ``budget`` (bytes per rank, ``backends.budget``) leaves
    beside what it holds already (its resident peak so far); the one rule of the SCF's
    in-memory mode, decided alike on every rank (collective)."""
    from tessera.chem.memory import resident_peak
    table = ranks.allgather((int(need), float(budget) - resident_peak()))
    need_max = max(n for n, _ in table)
    room_min = min(r for _, r in table)
    return all(n <= r for n, r in table), need_max, room_min


class IncoreFock:
    """``build(dm) -> G``; ``history``: one statistics dict per build (as ``FockBuilder``);
    ``threads``: OpenMP threads of the integrals and of the contraction. Collective when
    ``context`` has several ranks: the integrals are then a task set of ranges of shell
    pairs (``integrals.pair_ranges``) dealt with ``schedule`` (static, nxtval, steal), each
    rank keeping the representatives of the pairs it computed while they fit the room its
    memory ``budget`` (bytes) leaves (``fits``'s rule, less one range: the largest it
    computes anew in a build); a range computed beyond it is computed anew, by the same
    rank, in every build."""

    blocks = tasks = None        # no shell blocks or Fock tasks: one library call per build
    mode = "incore"

    def __init__(self, mol, threads: int = 1, context=None, schedule: str = "steal",
                 budget: float | None = None):
        self.threads = max(1, int(threads))
        self.context = context       # records each build as the region "scf.fock", as a task set
        t0 = time.perf_counter()
        ranks = None if context is None else context.ranks
        self.ranks = ranks if ranks is not None and ranks.size > 1 else None
        self.parts = self.integral_deal = None
        if self.ranks is None:
            self.eri, self.skeleton = s8_integrals(mol, self.threads)
            self.nbytes = int(self.eri.nbytes) + (0 if self.skeleton is None else int(self.skeleton.orbit.nbytes))
        else:
            self.eri = None
            self._compute_parts(mol, check_schedule(schedule), budget)
        self.setup_seconds = time.perf_counter() - t0
        self.history: list = []

    def _compute_parts(self, mol, schedule: str, budget: float | None) -> None:
        """This rank's share of the representatives, computed as a task set (class docstring)."""
        from tessera.chem.memory import resident_peak
        nbas, nao = mol.nbas, mol.nao
        ops = shell_operations(mol) or [(np.arange(nbas), np.arange(nao), np.ones(nao))]
        self.quartets = ShellPairQuartets(mol, ops)
        self.skeleton = Skeleton(ops, self.quartets.eri.ao_loc, nao, None, (0, self.quartets.npairs))
        self.cost = all_pair_costs(mol, self.quartets.shell_map, self.ranks)
        ranges, costs = pair_ranges(self.cost, PAIR_TASKS_PER_WORKER * self.ranks.size)   # as s8_ranges
        self.row_off = np.zeros(self.quartets.npairs + 1, dtype=np.int64)
        need = [8 * int(self.cost[s:e].sum()) + (e * (e + 1) - s * (s + 1)) // 2 for s, e in ranges]
        room = np.inf if budget is None else float(budget) - resident_peak() - max(need)
        parts, kept = [], [0, 0]          # (start, end, eri, orbit); bytes and pairs kept

        def work(t, _blocks):
            start, end = ranges[t]
            if kept[0] + need[t] > room:      # no room: computed anew in every build
                parts.append((start, end, None, None))
                return 0.0
            parts.append((start, end, *self.quartets.part(start, end, self.cost, self.row_off, self.threads)))
            kept[0] += need[t]
            kept[1] += end - start
            return 0.0

        self.context.run_tasks(TaskSet("scf.integrals", costs, work, schedule=schedule,
                                       partition="contiguous", order="cost"))
        deal = self.context.deal_stats
        self.parts = sorted(parts, key=lambda p: p[0])
        self.nbytes = kept[0]
        self.integral_deal = {"integral_tasks": len(parts), "integral_pairs_kept": kept[1],
                              "integral_pairs_recomputed": sum(e - s for s, e, eri, _ in parts if eri is None),
                              "integral_tasks_stolen": getattr(deal, "stolen", 0)}
        if recomputed := self.integral_deal["integral_pairs_recomputed"]:
            # the budget passed ``fits`` (the rank's share) yet a range beyond the room it
            # leaves, less the largest range, is not kept: said, never silent
            _log.warning("rank %d: %d shell pairs of its share did not fit the memory budget beside the "
                         "kept ones; they are computed again in every Fock build",
                         self.ranks.rank if self.ranks is not None else 0, recomputed)

    def build(self, dm: np.ndarray) -> np.ndarray:
        t0, c0 = time.perf_counter(), time.process_time()
        if self.parts is not None:          # a rank holds the representatives of its pairs alone
            if not self.skeleton.invariant(dm):
                raise SymmetryError("the in-memory Fock build over several ranks needs a density "
                                    "the point group leaves unchanged; use mode='direct' for another")
            vj, vk = self._parts_jk(dm)
        elif self.skeleton is not None and self.skeleton.invariant(dm):   # from the representative quartets alone
            vj, vk = self.skeleton.jk(self.eri, dm, self.threads)
        else:
            with with_omp_threads(self.threads):
                vj, vk = _vhf.incore(self.eri, dm, hermi=1)
        g = vj - 0.5 * vk
        busy, busy_cpu = time.perf_counter() - t0, time.process_time() - c0
        if self.ranks is not None:          # each rank's part of the skeleton build
            g = self.ranks.allreduce(g)
        wall = time.perf_counter() - t0
        if self.context is not None:
            self.context.record("scf.fock", wall, 0, t0, "tasks")
        self.history.append({"tasks": 0, "busy_s": busy, "busy_cpu_s": busy_cpu,
                             "tasks_s": busy, "reduce_s": wall - busy, "wall_s": wall,
                             "replay": True, "incore_bytes": self.nbytes, **(self.integral_deal or {})})
        return g

    def _parts_jk(self, dm: np.ndarray) -> tuple:
        """This rank's part of the skeleton J and K: its kept representatives at once, then
        each range it has no room for, computed and contracted one at a time."""
        kept = [p for p in self.parts if p[2] is not None]
        vj, vk = self.skeleton.parts_jk(kept, dm, self.threads, self.row_off)
        for start, end, eri, _ in self.parts:
            if eri is None:
                part = (start, end, *self.quartets.part(start, end, self.cost, self.row_off, self.threads))
                j, k = self.skeleton.parts_jk([part], dm, self.threads, self.row_off)
                vj, vk = vj + j, vk + k
        return vj, vk

    def hand_over(self) -> KeptIntegrals:
        """The integrals, for the transform of the same molecule (``Reference.ao_integrals``);
        this builder no longer holds them; None over several ranks (each holds a part)."""
        if self.ranks is not None:
            return None
        kept, self.eri = KeptIntegrals(self.eri), None
        return kept

    def free(self) -> None:
        self.eri = self.skeleton = self.parts = None
