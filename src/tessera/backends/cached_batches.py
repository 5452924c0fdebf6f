"""The batches of ``mpi-onesided``'s ``cached`` loop order (and ``owner``'s), from sizes alone.

A batch is a list of entries (task, lo, hi): products lo..hi-1 of an output task (an
``OutputTask`` of ``plan.blocktasks``: task t of a step is row tuple r and column tuple c
of sector n, its products the sector's inner tuples q). Output tasks that share one row of
blocks of A (``by_row``, A the operand with more bytes) or one column of B form a group, in
task order, the groups in (sector, row or column) order; a task whose own input blocks
exceed ``bound`` bytes is cut into runs of products that fit (each run accumulates its
part of the output block: one accumulate per part); a group whose distinct input blocks
exceed ``bound`` is cut into consecutive runs that fit (only a single product larger than
the bound exceeds it). Then, while there are fewer than ``BATCHES_PER_RANK * nranks``
batches, the batch with the most flops (the first of them) is halved (a cut batch fetches
its shared row on each rank that runs a part, the price of keeping every rank busy). The
same on every rank.

No product is listed: a task's input bytes follow from its sector's tile sizes (the A
block of row r and inner tuple q holds m_r k_q elements, the B block of q and column c
k_q n_c; the tasks of a row group share its A blocks and read B blocks of their own, a
column group alike), so the batches are found from per-task integers (O(tasks), the
entries kept as arrays), and a rank makes the OutputTasks of the batches it runs only.
"""

from __future__ import annotations

import heapq

import numpy as np

from tessera.plan.blocktasks import sector_signature

BATCHES_PER_RANK = 2      # cached: at least this many batches per rank where tasks allow


class CachedBatches:
    """The batches (module docstring) of tasks given by sector, row and column tuple
    (``sectors``, ``rows``, ``cols``: one entry per task, in task order) of the step's
    sectors ``sig`` ((irrep, rows, inner, cols) layouts). ``batches[b]``: batch b's entries
    [(task, lo, hi)]; ``flops``: each batch's flops (a task's flops times the share of its
    products an entry holds, rounded down per entry), as one array."""

    def __init__(self, sig, sectors, rows, cols, by_row: bool, bound: int, nranks: int):
        sectors, rows, cols = (np.asarray(x, dtype=np.int64) for x in (sectors, rows, cols))
        inner_sums = [np.concatenate(([0], np.cumsum(inner.sizes, dtype=np.int64))).tolist()
                      for _, _, inner, _ in sig]
        shared = rows if by_row else cols                    # the tuple a group shares
        order = np.lexsort((np.arange(len(sectors)), shared, sectors))
        task, lo, hi, flops = [], [], [], []
        runs, run_start = [], 0                              # (first entry, end) of each run
        group, size, seen = None, 0, []
        for i, n, r, c in zip(order.tolist(), sectors[order].tolist(), rows[order].tolist(), cols[order].tolist()):
            _, row_layout, _, col_layout = sig[n]
            m, w = row_layout.sizes[r], col_layout.sizes[c]
            ksum = inner_sums[n]
            nq = len(ksum) - 1
            if (n, r if by_row else c) != group:             # a new group: a new run
                if len(task) > run_start:
                    runs.append((run_start, len(task)))
                run_start, group, size, seen = len(task), (n, r if by_row else c), 0, []
            for q0, q1 in _task_runs(ksum, 8 * (m + w), bound):
                whole = 8 * (m + w) * (ksum[q1] - ksum[q0])
                # the shared blocks of q0..q1-1 not fetched yet by this run, and the task's own
                extra = 8 * (w if by_row else m) * (ksum[q1] - ksum[q0]) + \
                    8 * (m if by_row else w) * _unseen(ksum, seen, q0, q1)
                if len(task) > run_start and size + extra > bound:
                    runs.append((run_start, len(task)))
                    run_start, size, seen, extra = len(task), 0, [], whole
                task.append(i)
                lo.append(q0)
                hi.append(q1)
                flops.append(2 * m * w * ksum[-1] * (q1 - q0) // nq if nq else 0)
                _see(seen, q0, q1)
                size += extra
        if len(task) > run_start:
            runs.append((run_start, len(task)))
        self._entries = (task, lo, hi)
        prefix = np.concatenate(([0], np.cumsum(flops, dtype=np.int64))).tolist()
        self._ranges = _halved(runs, prefix, BATCHES_PER_RANK * nranks)
        self.flops = np.array([prefix[e] - prefix[s] for s, e in self._ranges], dtype=np.int64)

    def __len__(self) -> int:
        return len(self._ranges)

    def __getitem__(self, b: int) -> list:
        s, e = self._ranges[b]
        task, lo, hi = self._entries
        return list(zip(task[s:e], lo[s:e], hi[s:e]))


def indexed_batches(tasks, by_row: bool, bound: int, nranks: int) -> CachedBatches:
    """``CachedBatches`` of every task of an ``IndexedTasks`` (``plan.blocktasks``): the
    ``cached`` loop order's, the same on every rank, no product listed."""
    cells = [(n, *tasks.pairs(n)) for n in range(len(tasks.sig))]
    sectors = np.concatenate([np.full(len(r), n, dtype=np.int64) for n, r, _ in cells] + [np.zeros(0, np.int64)])
    rows = np.concatenate([np.asarray(r, dtype=np.int64) for _, r, _ in cells] + [np.zeros(0, np.int64)])
    cols = np.concatenate([np.asarray(c, dtype=np.int64) for _, _, c in cells] + [np.zeros(0, np.int64)])
    return CachedBatches(tasks.sig, sectors, rows, cols, by_row, bound, nranks)


def task_batches(step, tasks, by_row: bool, bound: int, nranks: int) -> CachedBatches:
    """``CachedBatches`` of a list of a step's OutputTasks (``owner``: a rank's own, from
    ``blocktasks.owned_tasks``; entries index that list)."""
    return CachedBatches(sector_signature(step), [t.sector for t in tasks], [t.r for t in tasks], [t.c for t in tasks],
                         by_row, bound, nranks)


def _task_runs(ksum: list, width: int, bound: int) -> list:
    """A task's entries (lo, hi): all its products when its input blocks (``width`` bytes
    per inner element: 8 (m + n)) fit ``bound``, else runs of consecutive products that
    fit (a product larger than the bound alone)."""
    nq = len(ksum) - 1
    if width * ksum[-1] <= bound:
        return [(0, nq)]
    out, start = [], 0
    for q in range(1, nq):
        if width * (ksum[q + 1] - ksum[start]) > bound:
            out.append((start, q))
            start = q
    return out + [(start, nq)]


def _unseen(ksum: list, seen: list, q0: int, q1: int) -> int:
    """Inner elements of tuples q0..q1-1 outside the ranges ``seen`` (disjoint, sorted)."""
    total = ksum[q1] - ksum[q0]
    for a, b in seen:
        a, b = max(a, q0), min(b, q1)
        if a < b:
            total -= ksum[b] - ksum[a]
    return total


def _see(seen: list, q0: int, q1: int) -> None:
    """Add q0..q1-1 to the disjoint sorted ranges ``seen`` (merged)."""
    merged = []
    for a, b in sorted(seen + [(q0, q1)]):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    seen[:] = merged


def _halved(runs: list, prefix: list, least: int) -> list:
    """``runs`` ((first entry, end) in order) with the one of the most flops (the first
    of them; ``prefix``: the entries' flops summed) halved by its entries while there are
    fewer than ``least`` and it holds two or more; in order. A heap of (-flops, first
    entry): halves keep the order, so the first entry orders the batches as the list."""
    heap = [(prefix[s] - prefix[e], s, e) for s, e in runs]
    heapq.heapify(heap)
    while heap and len(heap) < least:
        _, s, e = heap[0]
        if e - s < 2:
            break
        heapq.heappop(heap)
        mid = s + (e - s) // 2
        for a, b in ((s, mid), (mid, e)):
            heapq.heappush(heap, (prefix[a] - prefix[b], a, b))
    return [(s, e) for _, s, e in sorted(heap, key=lambda x: x[1])]
