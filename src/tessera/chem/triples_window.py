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
its window read (W = the window's tiles, f any virtual, y and m any occupied):

    ovvv  (x p|q f)      p, q in W          the right operands of the (ov|vv) terms
    t2    t2[x y p f]    p in W             right operands (f in W) and left ones (f any)
    ovov  (x p|y q)      p, q in W          the pairs of V
    ovoo  (x s|y m)      s in W             the left operands of the (ov|oo) terms

so a task holds about rows x (|W|^2 tile^2 v + |W| tile (o v + o^2) + |W|^2 tile^2 o)
doubles, never a v^3 row.  :class:`Windows` (structure only: spaces and allowed keys,
no data) lists the windows, the requests and their bytes (the count ``tessera plan
--ranks`` reports); :class:`WindowTables` holds one task's fetched rows in the forms the
kernel reads; :class:`WindowTripleKernel` is the blocked kernel reading them.  A rank
keeps only the rows of its previous task that its next one needs
(``chem.triples_tasks``: tasks run window by window), so what it holds stays one task's;
``sequence_reads`` counts what a rank's tasks then read, ``deal_weights`` the estimated
seconds per task their deal balances, ``window_reads`` the reads per rank of that deal.
"""

from __future__ import annotations

from itertools import permutations, product

import numpy as np

from tessera.backends.machine import Machine
from tessera.backends.schedule import partition
from tessera.chem.triples_blocked import BlockedTripleKernel

SOURCE_OF = {"ov1": "ovvv", "t2r": "t2", "ovov": "ovov", "ooL": "ovoo"}     # table -> tensor
WINDOWED = {"ovvv": (1, 2), "t2": (2,), "ovov": (1, 3), "ovoo": (1,)}      # axes a window cuts


def task_bytes(nocc: int, nvir: int, occ_tile: int, width: int) -> float:
    """Bytes one task's rows and tables take at most (C1): 3 occ_tile rows, windows of
    three tiles ``width`` orbitals wide, w = 3 x width orbitals: read w^2 v + o w v + o w^2
    + o^2 w, tables w^2 v + 2 o w v + o^2 w doubles per row."""
    w = 3 * width
    return 8 * 3 * occ_tile * (2 * w * w * nvir + 3 * nocc * w * nvir + nocc * w * w + 2 * nocc * nocc * w)


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

    def requests(self, n: int, window) -> dict:
        """{source: [(key, part, pieces)]} a task reads for the rows of occupied tensor tile
        ``n``: per block, one request per choice of the window's pieces on its windowed
        axes (``WINDOWED``); ``part``: the (axis, lo, hi) cuts of pieces smaller than their
        tensor tile (``backends.tasks.part_slice``), empty for whole blocks."""
        W, out = set(window), {}
        for s, axes in WINDOWED.items():
            reqs = out[s] = []
            for k in self.keys[s].get(n, ()):
                for pieces in product(*([p for p in self.pieces[k[a]] if p[0] in W] for a in axes)):
                    part = tuple(x for a, p in zip(axes, pieces) if p[3] < self.vsize[k[a]]
                                 for x in (a, p[1], p[1] + p[3]))
                    reqs.append((k, part, pieces))
        return out

    def row_bytes(self, n: int, window) -> tuple:
        """(bytes read, bytes of the tables built) per row of occupied tile ``n`` for a
        task of ``window``: the sums of :meth:`requests`' blocks, from per-tile totals
        (:class:`WindowTables` keeps ovov's rows whole in q)."""
        if n not in self._totals:
            self._totals[n] = self._tile_totals(n)
        pair, single, ovov_pair, ovov_whole = self._totals[n]
        W = sorted(set(window))
        read = pair[np.ix_(W, W)].sum() + single[W].sum()
        return int(read), int(read - ovov_pair[np.ix_(W, W)].sum() + ovov_whole[W].sum())

    def _tile_totals(self, n: int) -> tuple:
        """Bytes per row of tile n's blocks: [P, Q] of ovvv and ovov (p, q in window tiles
        P, Q), [P] of t2 and ovoo (p in P), and of ovov with any q (NumPy over the keys, no
        loop per block): per key its bytes per windowed orbital, spread over the window
        tiles by the orbitals each shares with the key's tensor tiles (``overlap``)."""
        nv = len(self.vsize)
        overlap = np.zeros((nv, len(self.vtiles)), dtype=np.int64)     # tensor tile x window tile
        for m, pieces in enumerate(self.pieces):
            for A, _, _, size in pieces:
                overlap[m, A] += size
        sizes = np.asarray(self.vsize, dtype=np.int64)
        out = []
        for s, axes in (("ovvv", (1, 2)), ("t2", (2,)), ("ovoo", (1,)), ("ovov", (1, 3)), ("ovov", (1,))):
            per = np.zeros((nv,) * len(axes), dtype=np.int64)
            keys = self.keys[s].get(n, ())
            if keys:
                k = np.asarray(keys, dtype=np.int64)
                unit = bytes_per_row(self.shapes[s], k) // np.prod([sizes[k[:, a]] for a in axes], axis=0)
                np.add.at(per, tuple(k[:, a] for a in axes), unit)
            out.append(overlap.T @ per @ overlap if len(axes) == 2 else overlap.T @ per)
        pair, single, ovoo, ovov_pair, ovov_whole = out
        return pair + ovov_pair, single + ovoo, ovov_pair, ovov_whole


def bytes_per_row(tensor, keys: np.ndarray) -> np.ndarray:
    """Bytes of one row (one index of the first axis) of each block ``keys`` (an array of
    keys) of ``tensor``: 8 x the product of the other axes' tile sizes."""
    out = np.full(len(keys), 8, dtype=np.int64)
    for d in range(1, tensor.ndim):
        out *= np.asarray([tl.size for tl in tensor.spaces[d].tiles], dtype=np.int64)[keys[:, d]]
    return out


def sequence_reads(win: Windows, tiles, triples, tasks, sequence) -> list:
    """Bytes of rows each windowed task of ``sequence`` (ids of ``tasks``, the (triple,
    window) of ``triples_tasks.window_tasks`` over task tiles ``tiles`` and their
    ``triples``, in the order one rank runs them) reads when the rank keeps the rows of
    its previous task that the next one needs: rows(x) x its window's bytes per row for
    each of its task tiles x, less, for a task tile the previous task had too, the bytes
    of the window tiles both windows share (``Windows.row_bytes``)."""
    per_row = _per_row(win)
    out, prev = [], (set(), frozenset())
    for i in sequence:
        t, w = tasks[i]
        X, W = set(triples[t]), frozenset(w)
        out.append(_read(tiles, per_row, X, W, prev))
        prev = (X, W)
    return out


def _per_row(win: Windows):
    """per_row(n, W): bytes of one row of occupied tile n for window tiles W (kept)."""
    memo: dict = {}

    def per_row(n, W):
        if (n, W) not in memo:
            memo[n, W] = win.row_bytes(n, W)[0] if W else 0
        return memo[n, W]
    return per_row


def _read(tiles, per_row, X, W, prev) -> int:
    """Bytes a task of task tiles X and window tiles W reads after the task ``prev``
    ((its task tiles, its window tiles)): ``sequence_reads``' rule."""
    shared, read = W & prev[1], 0
    for x in X:
        n, rows = tiles[x][3], tiles[x][1] - tiles[x][0]
        read += rows * (per_row(n, W) - (per_row(n, shared) if x in prev[0] else 0))
    return read


def order_reads(win: Windows, tiles, triples, tasks) -> np.ndarray:
    """``sequence_reads`` of every task in deal order (0, 1, ...; ``tasks`` a
    ``triples_tasks.WindowTasks``) without a Python step per task: in a window, a task
    reads the rows of the task tiles the triple before it lacks, so a group's reads are
    (bytes per row of each window and tensor tile) @ (rows new to each triple per tensor
    tile); a window's first task, after another window's last, by ``_read``."""
    per_row, out = _per_row(win), []
    prev = (set(), frozenset())
    for windows, trips in tasks.groups:
        cols = sorted({tiles[x][3] for t in trips for x in triples[t]})
        col = {n: c for c, n in enumerate(cols)}
        new, before = np.zeros((len(cols), len(trips))), set()
        for i, t in enumerate(trips):
            X = set(triples[t])
            for x in X - before:
                new[col[tiles[x][3]], i] += tiles[x][1] - tiles[x][0]
            before = X
        for w in windows:
            W = frozenset(w)
            reads = np.asarray([per_row(n, W) for n in cols], dtype=float) @ new
            reads[0] = _read(tiles, per_row, set(triples[trips[0]]), W, prev)
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
    per_cost, rate = least_flops / max(float(costs.sum()), 1.0), machine.gemm_flops_per_second
    return costs * per_cost / rate + reads / bandwidth


class _LeftRows:
    """``table[x][g_y]`` of a packed left operand (``kind`` t2r or ooL) of one task: rows
    y of irrep g_y, indexed as the kernel indexes packed rows (``[r][p0:p1]`` and
    ``[r0:r1, p0:p1]``); columns p0:p1 are (s in a kernel block S, c of one irrep)."""

    def __init__(self, tables, kind: str, x: int, gy: int):
        self.t, self.kind, self.x, self.gy = tables, kind, x, gy

    def cols(self, cols: slice) -> np.ndarray:
        """[n_y, n_S, n_c] of the block S whose packed columns start at cols.start."""
        t = self.t
        h = t.irrep[self.x] ^ self.gy
        offs, dims = t.offsets[self.kind], t.dims[self.kind]
        p0, width = cols.start, cols.stop - cols.start
        for gs in range(len(t.nv)):
            nc = dims[gs ^ h]
            if t.nv[gs] and nc and offs[h][gs] <= p0 < offs[h][gs] + t.nv[gs] * nc:
                tile, off = t.win.tile_at[(gs, (p0 - offs[h][gs]) // nc)]
                return t.get(self.kind, self.x, (self.gy, tile))[:, off:off + width // nc, :]
        raise IndexError(f"columns {cols} start no kernel block")

    def __getitem__(self, idx):
        if isinstance(idx, tuple):              # [r0:r1, p0:p1]
            seg = self.cols(idx[1])[idx[0]]
            return seg.reshape(seg.shape[0], -1)
        return _Row(self, idx)


class _Row:
    def __init__(self, rows: _LeftRows, r: int):
        self.rows, self.r = rows, r

    def __getitem__(self, cols: slice) -> np.ndarray:
        return self.rows.cols(cols)[self.r].reshape(-1)


class _Table:
    """``table[x][g_y]`` (a :class:`_LeftRows`) of one packed left table."""

    def __init__(self, tables, kind: str):
        self.tables, self.kind = tables, kind

    def __getitem__(self, x):
        return _ByIrrep(self.tables, self.kind, x)


class _ByIrrep:
    def __init__(self, tables, kind: str, x: int):
        self.tables, self.kind, self.x = tables, kind, x

    def __getitem__(self, gy):
        return _LeftRows(self.tables, self.kind, self.x, gy)


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


class WindowTables(ZeroTables):
    """One task's fetched rows, in the forms the windowed kernel reads, per occupied
    orbital x and key: ``ov1`` (P, Q) -> [n_f, n_P, n_Q] = (x p|q f); ``t2r`` (g_y, S) ->
    [n_y, n_S, n_f] = t2[x y s f]; ``ooL`` (g_y, S) -> [n_y, n_S, n_m] = (x s|y m);
    ``ovov`` (g_y, P) -> [n_y, n_P, n_q] = (x p|y q) (P, Q, S virtual tiles, the others
    whole irreps; missing keys are zero)."""

    source_of = SOURCE_OF

    def __init__(self, win: Windows, lay, irrep, o, v):
        super().__init__()
        self.win, self.lay, self.irrep, self.o, self.v = win, lay, irrep, o, v
        self.nv, self.no = lay.n.tolist(), lay.no.tolist()
        self.offsets = {"t2r": lay.poff.tolist(), "ooL": lay.vooff.tolist()}
        self.dims = {"t2r": self.nv, "ooL": self.no}

    def _shape(self, kind, x, key) -> tuple:
        g, vt = self.irrep[x], self.win.vtiles
        if kind == "ov1":
            P, Q = key
            return (self.nv[g ^ vt[P][0] ^ vt[Q][0]], vt[P][2], vt[Q][2])
        gy, S = key
        other = g ^ gy ^ vt[S][0]
        return (self.no[gy], vt[S][2], (self.no if kind == "ooL" else self.nv)[other])

    def add(self, source: str, key, rows: np.ndarray, x0: int, pieces) -> None:
        """Rows x0.. of the block ``key`` of ``source`` ([rows, ...] as fetched, cut to
        ``pieces`` on its windowed axes, ``Windows.requests``): placed by the irrep positions
        of its whole-irrep indices and the pieces' positions in their window tiles."""
        w, ot = self.win, self.o.tiles
        occ = (lambda t: slice(w.orel[t], w.orel[t] + ot[t].size))      # in its irrep
        vir = (lambda t: slice(w.irel[t], w.irel[t] + w.vsize[t]))
        win = (lambda p: slice(p[2], p[2] + p[3]))                      # a piece in its window tile
        for r, blk in enumerate(rows):
            x = x0 + r
            if source == "ovvv":                     # blk[p q f]
                P, Q = pieces
                self.get("ov1", x, (P[0], Q[0]))[vir(key[3]), win(P), win(Q)] = blk.transpose(2, 0, 1)
            elif source == "t2":                     # blk[y s f]
                self.get("t2r", x, (ot[key[1]].irrep, pieces[0][0]))[occ(key[1]), win(pieces[0]), vir(key[3])] = blk
            elif source == "ovov":                   # blk[p y q]
                P, Q = pieces
                q0 = w.irel[key[3]] + Q[1]
                self.get("ovov", x, (ot[key[2]].irrep, P[0]))[occ(key[2]), win(P), q0:q0 + Q[3]] = \
                    blk.transpose(1, 0, 2)
            else:                                    # ovoo blk[s y m]
                self.get("ooL", x, (ot[key[2]].irrep, pieces[0][0]))[occ(key[2]), win(pieces[0]), occ(key[3])] = \
                    blk.transpose(1, 0, 2)

    def tables(self) -> dict:
        """The kernel's tables (``KernelInputs`` keyword arguments)."""
        return {"ov1": self, "ov2": None, "t2r": _Table(self, "t2r"), "t2s": None,
                "ooL": _Table(self, "ooL"), "ovov": self}


class WindowTripleKernel(BlockedTripleKernel):
    """The blocked kernel on one window: its block triples only, operands from
    :class:`WindowTables` (``inp.ov1`` and ``inp.ovov`` are the tables themselves)."""

    def __init__(self, inp, G: int, pool: list, batch: int, vblock: int, win: Windows, window, tables):
        super().__init__(inp, G, pool, batch, vblock, triples=win.block_triples(G, window),
                         frame=win.frame(window))
        self.win, self.tab = win, tables

    def _right(self, table, x, gc, nc, T, U, swapped) -> np.ndarray:
        first, second = (U, T) if swapped else (T, U)
        (t1, o1), (t2, o2) = self._tile(first), self._tile(second)
        if table is self.inp.ov1:
            seg = self.tab.get("ov1", x, (t1, t2))[:, o1:o1 + first[2], o2:o2 + second[2]]
        else:                                        # t2r: rows m of irrep gc, (s in first, f any)
            seg = self.tab.get("t2r", x, (gc, t1))[:, o1:o1 + first[2], second[1]:second[1] + second[2]]
        return self._into_rbuf(seg, nc, T, U, swapped)

    def _pairs(self, x, gy, rows: slice, P, Q):
        if P[0] ^ Q[0] != self.irr[x] ^ gy:
            return None
        tp, op = self._tile(P)
        seg = self.tab.get("ovov", x, (gy, tp))[rows]
        return seg[:, op:op + P[2], Q[1]:Q[1] + Q[2]]

    def _tile(self, block) -> tuple:
        """(virtual tile, offset inside it) of a kernel block."""
        tile, off = self.win.tile_at[(block[0], block[1])]
        return tile, off
