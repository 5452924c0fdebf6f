"""The task space of the Fock build: unique quartets of shell blocks, Schwarz screening
and cost estimates (the static partition is the engine's, ``backends.schedule``).

A *pair block* is a pair of shell blocks (A, B) with A >= B.  A task is a pair of pair
blocks (AB, CD) with AB >= CD, i.e. one canonical block quartet (AB|CD) of the 8-fold
permutational symmetry (ab|cd) = (ba|cd) = (ab|dc) = (cd|ab) = ...  This is GTFock's task
granularity one level up (Liu, Patel, Chow, IPDPS 2014: a task is a pair of shell-pair
blocks); a task's integrals come from one libcint call.

Screening (Schwarz, |(ij|kl)| <= Q_ij Q_kl): a task whose largest bound is below the
threshold is dropped from the task list; a task whose smallest bound is below it is
*partial*: its sub-threshold shell quartets are zeroed after the integral call, so every
shell quartet below the threshold is excluded from the Fock matrix, exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tessera.chem.scf.blocking import ShellBlocks

#: Fixed cost of one task (integral + Python + communication overhead), in units of one
#: two-electron integral.  Used only by the cost-balanced static partition.
TASK_OVERHEAD = 2000.0

SKIP, FULL, PARTIAL = 0, 1, 2


@dataclass
class PairBlock:
    a: int
    b: int
    qshell: np.ndarray      # (nsh_a, nsh_b) Schwarz bounds of the shell pairs
    qfunc: np.ndarray       # (na, nb) the shell bound expanded to functions
    qsorted: np.ndarray     # flat shell-pair bounds, descending
    wcum: np.ndarray        # cumulative function-pair counts in that order
    weights: np.ndarray     # flat function-pair count of each shell pair (unsorted)
    qmax: float
    qmin: float


@dataclass
class TaskList:
    """Every non-skipped task, in the canonical order (AB outer, CD inner).

    Arrays are indexed by task id: block indices ``a b c d``, the degeneracy factor
    ``scale`` (= orbit size / 8), ``kind`` (FULL or PARTIAL), ``cost`` (estimated
    integrals computed plus a fixed overhead) and ``nints`` (integrals in the block).
    """

    blocks: ShellBlocks
    pairs: list
    threshold: float
    a: np.ndarray
    b: np.ndarray
    c: np.ndarray
    d: np.ndarray
    p: np.ndarray
    q: np.ndarray
    scale: np.ndarray
    kind: np.ndarray
    cost: np.ndarray
    nints: np.ndarray
    n_block_quartets: int          # all canonical block quartets
    n_block_quartets_skipped: int  # dropped whole by the block bound
    n_shell_quartets: int          # all unique shell quartets (8-fold symmetry)
    n_shell_quartets_skipped: int  # unique shell quartets below the threshold

    def __len__(self) -> int:
        return len(self.a)

    def quartet(self, t: int) -> tuple:
        return int(self.a[t]), int(self.b[t]), int(self.c[t]), int(self.d[t])

    def density_tiles(self, ids) -> set:
        """The lower-triangle density tiles (row >= col) the given tasks read."""
        tiles = set()
        for t in ids:
            a, b, c, d = self.quartet(t)
            for x, y in ((a, b), (c, d), (a, c), (b, d), (a, d), (b, c)):
                tiles.add((x, y) if x >= y else (y, x))
        return tiles

    def mask(self, t: int) -> np.ndarray:
        """Boolean (na, nb, nc, nd): integrals whose shell quartet survives screening."""
        pab = self.pairs[int(self.p[t])]
        pcd = self.pairs[int(self.q[t])]
        return np.multiply.outer(pab.qfunc, pcd.qfunc) >= self.threshold


def _pair_block(blocks: ShellBlocks, qshell_all: np.ndarray, a: int, b: int) -> PairBlock:
    sa0, sa1 = blocks.shell_ranges[a]
    sb0, sb1 = blocks.shell_ranges[b]
    qs = qshell_all[sa0:sa1, sb0:sb1]
    na_sh = blocks.shell_sizes(a)
    nb_sh = blocks.shell_sizes(b)
    qfunc = np.repeat(np.repeat(qs, na_sh, axis=0), nb_sh, axis=1)
    w = np.multiply.outer(na_sh, nb_sh).ravel().astype(float)
    flat = qs.ravel()
    order = np.argsort(-flat, kind="stable")
    return PairBlock(a=a, b=b, qshell=qs, qfunc=qfunc, qsorted=flat[order],
                     wcum=np.concatenate(([0.0], np.cumsum(w[order]))), weights=w,
                     qmax=float(flat.max()), qmin=float(flat.min()))


def _surviving_integrals(pab: PairBlock, pcd: PairBlock, thr: float) -> float:
    """Integrals of (AB|CD) whose shell quartet bound is >= thr."""
    qab = pab.qshell.ravel()
    with np.errstate(divide="ignore"):
        need = np.where(qab > 0, thr / np.where(qab > 0, qab, 1.0), np.inf)
    # number of CD shell pairs with Q_cd >= need (qsorted is descending)
    n = np.searchsorted(-pcd.qsorted, -need, side="right")
    return float(np.dot(pab.weights, pcd.wcum[n]))


def count_skipped_shell_quartets(qshell: np.ndarray, thr: float) -> tuple:
    """(skipped, total) unique shell quartets (ij|kl), i>=j, k>=l, ij>=kl, with
    Q_ij Q_kl < thr."""
    il = np.tril_indices(qshell.shape[0])
    v = np.sort(qshell[il])
    npair = len(v)
    total = npair * (npair + 1) // 2
    if thr <= 0 or npair == 0:
        return 0, total
    with np.errstate(divide="ignore"):
        limit = np.where(v > 0, thr / np.where(v > 0, v, 1.0), np.inf)
    ordered = np.searchsorted(v, limit, side="left").sum()     # v_q < thr / v_p
    diag = int(np.count_nonzero(v * v < thr))
    return int((ordered + diag) // 2), total


def make_tasks(blocks: ShellBlocks, qshell: np.ndarray, threshold: float) -> TaskList:
    nb = blocks.nblocks
    pairs = [_pair_block(blocks, qshell, a, b) for a in range(nb) for b in range(a + 1)]
    cols = {k: [] for k in "abcdpq"}
    scale, kind, cost, nints = [], [], [], []
    n_all = 0
    sizes = blocks.sizes
    for ip, pab in enumerate(pairs):
        for iq in range(ip + 1):
            pcd = pairs[iq]
            n_all += 1
            if pab.qmax * pcd.qmax < threshold:
                continue
            full = pab.qmin * pcd.qmin >= threshold
            n = sizes[pab.a] * sizes[pab.b] * sizes[pcd.a] * sizes[pcd.b]
            surv = float(n) if full else _surviving_integrals(pab, pcd, threshold)
            s = 1.0
            if pab.a == pab.b:
                s *= 0.5
            if pcd.a == pcd.b:
                s *= 0.5
            if ip == iq:
                s *= 0.5
            for k, v in zip("abcdpq", (pab.a, pab.b, pcd.a, pcd.b, ip, iq)):
                cols[k].append(v)
            scale.append(s)
            kind.append(FULL if full else PARTIAL)
            cost.append(surv + TASK_OVERHEAD)
            nints.append(n)
    skipped_sq, total_sq = count_skipped_shell_quartets(qshell, threshold)
    arr = {k: np.asarray(v, dtype=np.int64) for k, v in cols.items()}
    return TaskList(blocks=blocks, pairs=pairs, threshold=float(threshold),
                    scale=np.asarray(scale), kind=np.asarray(kind, dtype=np.int8),
                    cost=np.asarray(cost), nints=np.asarray(nints, dtype=np.int64),
                    n_block_quartets=n_all, n_block_quartets_skipped=n_all - len(scale),
                    n_shell_quartets=total_sq, n_shell_quartets_skipped=skipped_sq,
                    **arr)

