"""(T) on distributed tensors, operands fetched by virtual tile: memory bounded by tiles.

With distributed tensors and the kernel blocked in the virtual index
(:mod:`tessera.chem.triples_blocked`), a (T) task is a triple of occupied task tiles
*and* a *window*: an unordered triple of window tiles A >= B >= C (runs of the tensors'
virtual tiles inside one irrep, joined while one task's bytes stay within a budget,
``window_width``; where even one tensor tile is over it, near-equal parts of that tile,
fetched as patches of its blocks) whose irreps multiply to the task's G.  The kernel's
virtual blocks are the window tiles cut into runs of at most ``vblock`` orbitals, so
every block triple the kernel visits lies in exactly one window, and the windows' tasks
together visit each block triple once.  A
task fetches, for the rows x of its occupied task tiles, only what the block triples of
its window read (W = the window's tiles, f any virtual, m any occupied, y the task's own
occupied orbitals: those of its task tiles), the requests of ``chem.triples_stream``
with the contracted indices in one chunk:

    ovvv  (x p|q f)      p, q in W          right operands of the (ov|vv) terms
    t2    t2[x m p q]    p, q in W          right operands of the (ov|oo) terms
    t2    t2[x y p f]    p in W             left operands of the (ov|vv) terms
    ovoo  (x p|y m)      p in W             left operands of the (ov|oo) terms
    ovov  (x p|y q)      p, q in W          the pairs of V

so a task of R rows holds about R (w^2 v + o w^2 + R w v + R w o + R w^2) doubles
(w the window's orbitals), fetched and tabled: never a v^3 row, and no o w v or o^2 w
row either.  :class:`Windows` (structure only: spaces and allowed keys, no data) lists
the windows and the bytes per row (and per pair of rows) a task reads (the count
``tessera plan --ranks`` reports).  A rank keeps only the rows of its previous task
that its next one needs (``chem.triples_plan``: tasks run window by window, so
consecutive tasks share their window and mostly two of three task tiles, and the rows
of pairs of them), so what it holds stays one task's; ``sequence_reads`` counts what a
rank's tasks then read, ``deal_weights`` the estimated seconds per task their deal
balances, ``window_reads`` the reads per rank of that deal.
"""

from __future__ import annotations

from itertools import permutations

import numpy as np

from tessera.backends.machine import Machine
from tessera.backends.schedule import partition



def task_bytes(nocc: int, nvir: int, occ_tile: int, width: int) -> float:
    """Bytes one task's rows and tables take at most (C1): R = 3 occ_tile rows (at most
    o), windows of three tiles ``width`` orbitals wide, w = 3 x width orbitals (at most
    v): per row w^2 v + o w^2 + R w v + R w o + R w^2 doubles (``Windows.row_bytes``,
    ``pair_bytes``), fetched and tabled."""
    w, R = min(3 * width, nvir), min(3 * occ_tile, nocc)
    return 2 * 8 * R * (w * w * nvir + nocc * w * w + R * w * (nvir + nocc + w))


def window_width(o, v, occ_tile: int, budget_bytes: float) -> int:
    """Virtual orbitals per window tile (``Windows``: tiles joined up to it, or cut into
    parts no wider): the most (at least 1) at which one task's rows and tables
    (``task_bytes``) fit ``budget_bytes``; more width, fewer windows: each task refetches
    its rows."""
    width = max(1, v.dim)
    while width > 1 and task_bytes(o.dim, v.dim, occ_tile, width) > budget_bytes:
        width -= 1
    return width


def window_tiles(v, irel, width: int) -> tuple:
    """(window tiles, pieces) of ``Windows`` over virtual space v (``irel``: each tensor
    tile's first position inside its irrep)."""
    vtiles, pieces = [], []
    joinable = False
    for n, tl in enumerate(v.tiles):
        last = vtiles[-1] if vtiles else None
        if joinable and last[0] == tl.irrep and last[2] + tl.size <= width:
            vtiles[-1] = (last[0], last[1], last[2] + tl.size)
            pieces.append([(len(vtiles) - 1, 0, last[2], tl.size)])
            continue
        cuts = -(-tl.size // max(1, width))
        bounds = [tl.size * k // cuts for k in range(cuts + 1)]
        pieces.append([])
        for lo, hi in zip(bounds, bounds[1:]):
            pieces[-1].append((len(vtiles), lo, 0, hi - lo))
            vtiles.append((tl.irrep, irel[n] + lo, hi - lo))
        joinable = cuts == 1
    return vtiles, pieces


class Windows:
    """Windows, requests and bytes of windowed (T) tasks over spaces o, v; ``keys``:
    {source: {occupied tensor tile: allowed keys with it first}}; ``shapes``:
    {source: tensor} (``block_shape``). Window tiles: runs of the tensors' virtual tiles
    inside one irrep, each as long as ``width`` allows, or, for a tensor tile wider than
    ``width``, near-equal parts of it (the fewest no wider than ``width``)."""

    def __init__(self, o, v, vr, orange, keys: dict, shapes: dict, vblock: int, width: int):
        self.o, self.v, self.keys, self.shapes = o, v, keys, shapes
        # window tiles (irrep, first position inside the irrep, size); per tensor tile its
        # first position inside its irrep and its pieces (window tile, first orbital in the
        # tensor tile, first position in the window tile, orbitals): one piece when the tile
        # fits ``width`` (tiles joined while they fit), else near-equal cuts, each a window tile
        self.irel = [tl.offset - int(vr[tl.irrep, 0]) for tl in v.tiles]
        self.vtiles, self.pieces = window_tiles(v, self.irel, width)
        self.vsize = [tl.size for tl in v.tiles]
        # the narrowest part cut from a tensor tile (orbitals; None cut: the width asked)
        self.narrowest_cut = min((p[3] for ps in self.pieces if len(ps) > 1 for p in ps), default=width)
        self.orel = [tl.offset - int(orange[tl.irrep, 0]) for tl in o.tiles]
        # kernel blocks: window tiles cut into runs of at most vblock, and their window tile
        self.blocks, self.block_tile = [], []
        for n, (g, r, size) in enumerate(self.vtiles):
            for k in range(0, size, vblock):
                self.blocks.append((g, r + k, min(vblock, size - k)))
                self.block_tile.append(n)
        # the most virtuals one window's frame spans (its three widest tiles)
        self.frame_width = sum(sorted(t[2] for t in self.vtiles)[-3:])
        self.tile_at = {(b[0], b[1]): (self.block_tile[i], b[1] - self.vtiles[self.block_tile[i]][1])
                        for i, b in enumerate(self.blocks)}
        nt = len(self.vtiles)
        self._by_G: dict = {}
        self._triples: dict = {}
        self._totals: dict = {}
        for A in range(nt):
            for B in range(A + 1):
                for C in range(B + 1):
                    G = self.vtiles[A][0] ^ self.vtiles[B][0] ^ self.vtiles[C][0]
                    self._by_G.setdefault(G, []).append((A, B, C))

    def windows(self, G: int) -> list:
        """The tile triples (A >= B >= C) of irrep G."""
        return self._by_G.get(G, [])

    def block_triples(self, G: int, window) -> list:
        """The kernel's ordered block triples (per unordered block triple, as
        BlockedTripleKernel lists them) whose tiles are ``window``."""
        key = (G, tuple(window))
        if key not in self._triples:
            self._triples[key] = self._block_triples(G, window)
        return self._triples[key]

    def _block_triples(self, G: int, window) -> list:
        out, bl, bt = [], self.blocks, self.block_tile
        cand = [i for i, t in enumerate(bt) if t in window]
        for a in cand:
            for b in (x for x in cand if x <= a):
                for c in (x for x in cand if x <= b):
                    if (bt[a], bt[b], bt[c]) == tuple(window) and bl[a][0] ^ bl[b][0] ^ bl[c][0] == G:
                        out.append(sorted(set(permutations((bl[a], bl[b], bl[c])))))
        return out

    def frame(self, window) -> list:
        """The window's tiles (irrep, first position, size), the virtuals its kernel's V and
        energies index (``BlockedTripleKernel``'s frame)."""
        return [self.vtiles[t] for t in sorted(set(window))]

    def row_bytes(self, n: int, window) -> int:
        """Bytes a task of ``window`` reads per row of occupied tile ``n`` whatever its other
        task tiles: (x p|q f) and t2[x m p q] for p, q in the window (``triples_stream``'s
        requests with one chunk), from per-tile totals."""
        W = sorted(set(window))
        return int(self._totals_of(n)[0][np.ix_(W, W)].sum())

    def pair_bytes(self, n: int, m: int, window, whole: bool = False) -> int:
        """Bytes a task of ``window`` reads per row of occupied tile ``n`` and orbital y of
        its task tile in occupied tile ``m``: t2[x y p f], (x p|y m') and (x p|y q), p, q in
        the window (the left operands and V read y over the task's own orbitals only); a
        task tile that is the ``whole`` tile m asks for t2[x y p f] with f a whole tensor
        tile of the window as t2[x m p q] does (one request, read once): less those."""
        W = sorted(set(window))
        _, single, pair, same = self._totals_of(n)
        return int(single[m, W].sum() + pair[m][np.ix_(W, W)].sum() - (same[m][np.ix_(W, W)].sum() if whole else 0))

    def window_totals(self, n: int, windows) -> tuple:
        """(``row_bytes`` [window], ``pair_bytes`` [window, occupied tile m], the same of whole
        task tiles) of occupied tile ``n`` for every window of ``windows`` at once."""
        member = np.zeros((len(windows), len(self.vtiles)))
        for i, w in enumerate(windows):
            member[i, sorted(set(w))] = 1.0
        pq, single, pair, same = self._totals_of(n)
        by_y = member @ single.T + np.einsum("wP,mPQ,wQ->wm", member, pair, member)
        return np.einsum("wP,PQ,wQ->w", member, pq, member), by_y, by_y - np.einsum("wP,mPQ,wQ->wm", member, same,
                                                                                     member)

    def _totals_of(self, n: int) -> tuple:
        if n not in self._totals:
            self._totals[n] = self._tile_totals(n)
        return self._totals[n]

    def _tile_totals(self, n: int) -> tuple:
        """Bytes per row of tile n's blocks (NumPy over the keys, no loop per block): [P, Q]
        of (x p|q f) and t2[x m p q] (p, q in window tiles P, Q); per occupied tile m of y and
        per orbital y, [m, P] of t2[x y p f] and (x p|y m') and [m, P, Q] of (x p|y q): per
        key its bytes per windowed orbital (and y), spread over the window tiles by the
        orbitals each shares with the key's tensor tiles (``overlap``); and [m, P, Q] of
        t2[x m p q] with q's tensor tile whole in Q (``pair_bytes``' requests made twice)."""
        nv, no, nw = len(self.vsize), len(self.o.tiles), len(self.vtiles)
        overlap = np.zeros((nv, nw), dtype=np.int64)     # tensor tile x window tile
        for m, pieces in enumerate(self.pieces):
            for A, _, _, size in pieces:
                overlap[m, A] += size
        vs = np.asarray(self.vsize, dtype=np.int64)
        os_ = np.asarray([tl.size for tl in self.o.tiles], dtype=np.int64)
        pair_pq, by_y, by_y_pq = np.zeros((nv, nv), np.int64), np.zeros((no, nv), np.int64), \
            np.zeros((no, nv, nv), np.int64)
        t2_pq = np.zeros((no, nv, nv), np.int64)            # t2[x m p q] per orbital of m
        whole = overlap * np.asarray([[len(p) == 1] for p in self.pieces])    # q's tile one piece
        # (source, windowed virtual axes, the y axis or None)
        for s, axes, y in (("ovvv", (1, 2), None), ("t2", (2, 3), None), ("t2", (2,), 1), ("ovoo", (1,), 2),
                           ("ovov", (1, 3), 2)):
            keys = self.keys[s].get(n, ())
            if not keys:
                continue
            k = np.asarray(keys, dtype=np.int64)
            unit = bytes_per_row(self.shapes[s], k) // np.prod([vs[k[:, a]] for a in axes], axis=0)
            if y is None:
                np.add.at(pair_pq, (k[:, axes[0]], k[:, axes[1]]), unit)
                if s == "t2":
                    np.add.at(t2_pq, (k[:, 1], k[:, 2], k[:, 3]), unit // os_[k[:, 1]])
            elif len(axes) == 1:
                np.add.at(by_y, (k[:, y], k[:, axes[0]]), unit // os_[k[:, y]])
            else:
                np.add.at(by_y_pq, (k[:, y], k[:, axes[0]], k[:, axes[1]]), unit // os_[k[:, y]])
        return (overlap.T @ pair_pq @ overlap, by_y @ overlap,
                np.einsum("mab,aP,bQ->mPQ", by_y_pq, overlap, overlap),
                np.einsum("mab,aP,bQ->mPQ", t2_pq, overlap, whole))


def bytes_per_row(tensor, keys: np.ndarray) -> np.ndarray:
    """Bytes of one row (one index of the first axis) of each block ``keys`` (an array of
    keys) of ``tensor``: 8 x the product of the other axes' tile sizes."""
    out = np.full(len(keys), 8, dtype=np.int64)
    for d in range(1, tensor.ndim):
        out *= np.asarray([tl.size for tl in tensor.spaces[d].tiles], dtype=np.int64)[keys[:, d]]
    return out


def sequence_reads(win: Windows, tiles, triples, tasks, sequence) -> list:
    """Bytes of rows each windowed task of ``sequence`` (ids of ``tasks``, the (triple,
    window) of ``triples_plan.window_tasks`` over task tiles ``tiles`` and their
    ``triples``, in the order one rank runs them) reads when the rank keeps the rows of
    its previous task that the next one needs: ``task_read``, less what the previous
    task read too (``_read``)."""
    count, out, prev = _counter(win), [], (set(), frozenset())
    for i in sequence:
        t, w = tasks[i]
        X, W = set(triples[t]), frozenset(w)
        out.append(_read(tiles, count, X, W, prev))
        prev = (X, W)
    return out


def _counter(win: Windows):
    """count(n, m, W, whole): ``Windows.row_bytes`` (m None) or ``pair_bytes`` of window tiles W (kept)."""
    memo: dict = {}

    def count(n, m, W, whole=False):
        if (n, m, W, whole) not in memo:
            memo[n, m, W, whole] = 0 if not W else win.row_bytes(n, W) if m is None else \
                win.pair_bytes(n, m, W, whole)
        return memo[n, m, W, whole]
    return count


def _read(tiles, count, X, W, prev) -> int:
    """Bytes a task of task tiles X and window tiles W reads after the task ``prev`` ((its
    task tiles, its window tiles)): per task tile x, rows(x) ``row_bytes`` and per task
    tile y, rows(x) rows(y) ``pair_bytes`` (``task_read``), less, where x (and y) were the
    previous task's too, the same on the window tiles both windows share."""
    shared, read = W & prev[1], 0
    rows = {x: tiles[x][1] - tiles[x][0] for x in X}
    for x in X:
        n, kept = tiles[x][3], x in prev[0]
        read += rows[x] * (count(n, None, W) - (count(n, None, shared) if kept else 0))
        for y in X:
            m, whole, both = tiles[y][3], tiles[y][4] is None, kept and y in prev[0]
            read += rows[x] * rows[y] * (count(n, m, W, whole) - (count(n, m, shared, whole) if both else 0))
    return read


def order_reads(win: Windows, tiles, triples, tasks) -> np.ndarray:
    """``sequence_reads`` of every task in deal order (0, 1, ...; ``tasks`` a
    ``triples_plan.WindowTasks``) without a Python step per task: in a window, a task
    reads the rows of the task tiles the triple before it lacks and the pairs of its task
    tiles not both in that triple, so a group's reads are (bytes per row, and per pair of
    rows, of each window and tensor tile) @ (rows, and pairs of rows, new to each triple
    per tensor tile); a window's first task, after another window's last, by ``_read``."""
    count, out = _counter(win), []
    prev = (set(), frozenset())
    for windows, trips in tasks.groups:
        cols = sorted({tiles[x][3] for t in trips for x in triples[t]})
        col, nc = {n: c for c, n in enumerate(cols)}, len(cols)
        new, pairs, before = np.zeros((nc, len(trips))), np.zeros((2 * nc * nc, len(trips))), set()
        for i, t in enumerate(trips):
            X = set(triples[t])
            for x in X:
                rx = tiles[x][1] - tiles[x][0]
                if x not in before:
                    new[col[tiles[x][3]], i] += rx
                for y in X:
                    if x not in before or y not in before:
                        at = (2 * col[tiles[x][3]] + (tiles[y][4] is None)) * nc + col[tiles[y][3]]
                        pairs[at, i] += rx * (tiles[y][1] - tiles[y][0])
            before = X
        for w in windows:
            W = frozenset(w)
            reads = np.asarray([count(n, None, W) for n in cols], dtype=float) @ new + \
                np.asarray([count(n, m, W, whole) for n in cols for whole in (False, True) for m in cols],
                           dtype=float) @ pairs
            reads[0] = _read(tiles, count, set(triples[trips[0]]), W, prev)
            out.append(reads)
            prev = (set(triples[trips[-1]]), W)
    return np.concatenate([np.zeros(0)] + out)


def window_reads(win: Windows, tiles, triples, tasks, weights, nranks: int) -> list:
    """Bytes of rows each rank reads when windowed ``tasks`` are dealt statically in
    contiguous runs of near-equal ``weights`` (``partition``; ``deal_weights``) and a rank
    keeps the rows of its previous task that the next one needs (``sequence_reads``):
    what a run reads when no rank steals. (``order_reads`` in deal order; a run's first
    task reads after none.)"""
    reads = order_reads(win, tiles, triples, tasks)
    return [int(reads[q.start + 1:q.stop].sum() + sequence_reads(win, tiles, triples, tasks, [q.start])[0])
            if len(q) else 0 for q in partition(weights, nranks, "contiguous")]


def deal_weights(win: Windows, tiles, triples, tasks, costs, least_flops: float, nranks: int,
                 ranks_per_node: int | None = None) -> list:
    """Seconds per windowed task, the weights of their deal: its flops (``least_flops``,
    the minimal count of (T), spread over the tasks by ``costs``) at the calibrated DGEMM
    rate plus the bytes it reads after the task before it in deal order (``sequence_reads``)
    at the bandwidth a rank has to the others, ``nranks`` ranks ``ranks_per_node``
    (default: all) to a node (``Machine.on``). So the
    contiguous runs balance compute and reads together: a run where windows change
    often reads more per flop and gets fewer tasks."""
    machine = Machine.calibrated()
    bandwidth = machine.on(nranks, ranks_per_node or nranks)["bandwidth"]
    reads = order_reads(win, tiles, triples, tasks)
    costs = np.asarray(costs, dtype=float)
    per_cost, rate = least_flops / max(float(costs.sum()), 1.0), machine.rank_flops_per_second
    return costs * per_cost / rate + reads / bandwidth


class ZeroTables:
    """A task's tables, each made zero on first use (``get``; missing keys read as zero),
    their bytes counted per source tensor (``source_of``: table kind -> tensor)."""

    source_of: dict = {}

    def __init__(self):
        self.data: dict = {}          # (kind, x, key) -> array
        self.nbytes = dict.fromkeys(("ovvv", "t2", "ovov", "ovoo"), 0)

    def get(self, kind: str, x: int, key) -> np.ndarray:
        arr = self.data.get((kind, x, key))
        if arr is None:
            arr = self.data[(kind, x, key)] = np.zeros(self._shape(kind, x, key))
            self.nbytes[self.source_of[kind]] += arr.nbytes
        return arr
