"""The in-memory Fock build of one process: 8-fold symmetric AO integrals and a J/K
kernel for them.

The unique integrals (ij|kl), i >= j, k >= l, ij >= kl, are computed once by libcint
(one shell quartet per point-group orbit, the others written from it:
``integrals.s8_integrals``; threads) and kept, npair (npair + 1) / 2 doubles with
npair = nao (nao + 1) / 2; every build is then one call of a C kernel, G(D) = J(D) -
K(D)/2: with point-group operations the skeleton J/K from the representative quartets
(``integrals.Skeleton``), else PySCF's for all 8-fold integrals
(``pyscf.scf._vhf.incore``, OpenMP-parallel). No Python loop touches an integral. This
is the build of one process, kept after the SCF for the transform of the same molecule
(``hand_over``). Over several ranks with point-group operations each rank keeps the
representative quartets of its range of shell pairs (``integrals.s8_ranges``), compact, and
contracts them into its part of the skeleton J and K; one allreduce of G sums the
parts. Without such operations several ranks keep screened integral blocks per rank
instead (``fock.FockBuilder``, mode "incore"). No rank of several holds all integrals;
each is kept only when it ``fits`` the memory budget per rank.
"""

from __future__ import annotations

import time

import numpy as np
from pyscf.lib import with_omp_threads
from pyscf.scf import _vhf

from tessera.chem.reference import KeptIntegrals
from tessera.chem.scf.integrals import s8_bytes, s8_integrals  # noqa: F401  (s8_bytes: this module's API)
from tessera.errors import SymmetryError


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
    ``context`` has several ranks (each holds its share, ``integrals.s8_shares``)."""

    blocks = tasks = None        # no shell blocks or tasks: one library call per build
    mode = "incore"

    def __init__(self, mol, threads: int = 1, context=None):
        self.threads = max(1, int(threads))
        self.context = context       # records each build as the region "scf.fock", as a task set
        t0 = time.perf_counter()
        ranks = None if context is None else context.ranks
        self.ranks = ranks if ranks is not None and ranks.size > 1 else None
        self.eri, self.skeleton = s8_integrals(mol, self.threads, self.ranks)
        self.setup_seconds = time.perf_counter() - t0
        self.nbytes = int(self.eri.nbytes) + (0 if self.skeleton is None else int(self.skeleton.orbit.nbytes))
        self.history: list = []

    def build(self, dm: np.ndarray) -> np.ndarray:
        t0, c0 = time.perf_counter(), time.process_time()
        if self.skeleton is not None and self.skeleton.invariant(dm):   # from the representative quartets alone
            vj, vk = self.skeleton.jk(self.eri, dm, self.threads)
        elif self.ranks is not None:        # a rank holds its representatives alone
            raise SymmetryError("the in-memory Fock build over several ranks needs a density "
                                "the point group leaves unchanged; use mode='direct' for another")
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
                             "replay": True, "incore_bytes": self.nbytes})
        return g

    def hand_over(self) -> KeptIntegrals:
        """The integrals, for the transform of the same molecule (``Reference.ao_integrals``);
        this builder no longer holds them; None over several ranks (each holds a part)."""
        if self.ranks is not None:
            return None
        kept, self.eri = KeptIntegrals(self.eri), None
        return kept

    def free(self) -> None:
        self.eri = self.skeleton = None
