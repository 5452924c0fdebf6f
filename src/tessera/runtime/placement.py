"""Where each block of a GlobalArray lives, computed per key (no per-block table).

``BalancedPlacement`` is the ``balanced`` placement of ``distribution.block_owner_array``
(the stored blocks ranked by decreasing size, ties in key order, dealt round-robin from
a structure-hashed start rank) computed for any key from tables the size of a *half*
key grid, never from a list of every block:

- the key grid is split into a prefix (the first ``ndim // 2`` tiles) and a suffix (the
  rest); a block is stored when its tiles' irreps XOR to the tensor's irrep and, for a
  tensor stored as canonical blocks, it is the largest key of its orbit under the
  permutation group (as ``tensor.block_tensor.aliases``);
- ``before[p, c]``: stored blocks of size class ``c`` (sizes in decreasing order) under
  the prefixes before ``p``; ``start[c]``: stored blocks of the larger classes. The
  global position of a key is ``start[c] + before[p, c] +`` (stored suffixes of class
  ``c`` before its own under ``p``, counted on the one prefix's row of suffixes), its
  owner ``(position + shift) mod nranks``;
- a rank's blocks are the positions ``g0, g0 + P, g0 + 2P, ...``; they lie in its
  memory in that order, so the offset of a block in its owner's memory and a rank's
  element count are sums over the size classes (arithmetic, no other rank's keys);
- ``local_keys(rank)`` unranks only that rank's positions.

Memory: O(prefixes x size classes + suffixes) integers (for a 4-index tensor, the tiles
squared; the blocks are the tiles to the fourth). Building the counts evaluates the
stored-block rule over the grid with NumPy in chunks of CHUNK cells (no Python work per
block, but NumPy work over every block, the same on every rank count).
``RowsPlacement`` is the ``("rows", owners)`` placement the same way (per first tile:
its elements and where its row starts in its owner's memory); ``TablePlacement`` the
same interface over an explicit owner per listed key (GlobalArray's distributions and
explicit owners). ``PiecedPlacement`` is the ``pieces`` placement (blocks stored in
pieces over several ranks, ``distribution.PieceDeal``) where a structure has too few
blocks for its ranks: the same half-grid tables plus O(size classes) integers; a
block's pieces and a rank's own pieces are arithmetic on positions.
``block_placement`` makes the one a tensor structure asks for. ``part_runs`` says where
a box of a block lies in its pieces (one run per contiguous row of the box in a piece;
``PieceRuns``, as ``GlobalArray.piece_runs`` returns them), ``run_index`` selects runs of
a flat array.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from tessera.runtime.distribution import PieceDeal, block_offsets, check_placement, structure_signature

CHUNK = 1 << 14            # grid cells evaluated at once when building the counts
ROWS = 64                  # prefix rows kept by a placement (``_row``)


def _grid(radix) -> np.ndarray:
    """Every tile tuple of a grid with these tiles per dimension, in key order (rows)."""
    if not len(radix):
        return np.zeros((1, 0), dtype=np.int64)         # the one empty tuple
    return np.indices(tuple(radix), dtype=np.int64).reshape(len(radix), -1).T


class StoredGrid:
    """The stored blocks of a structure, as rule, not list: a key is split into a prefix
    (its first ``m`` tiles) and a suffix (the rest); ``_stored(rows)`` says which suffixes
    are stored under each prefix of ``rows``: their tiles' irreps XOR to ``irrep`` and,
    with a ``group`` (axis permutations), the key is the largest of its orbit (as
    ``tensor.block_tensor.aliases``; empty group: every allowed key is stored)."""

    def __init__(self, sizes, irreps, irrep: int, group, m: int):
        self.irrep = int(irrep)
        self.ndim = nd = len(sizes)
        self.radix = np.asarray([len(s) for s in sizes], dtype=np.int64)
        self.tile_sizes = [np.asarray(s, dtype=np.int64) for s in sizes]
        self.tile_irreps = [np.asarray(g, dtype=np.int64) for g in irreps]
        self.group = [tuple(g) for g in group if tuple(g) != tuple(range(nd))]
        self.m = m
        self.code_base = int(self.radix.max()) if nd else 1   # lexicographic code of a key
        self.pgrid, self.sgrid = _grid(self.radix[:m]), _grid(self.radix[m:])
        self.psize, self.pirr = self._fold(self.pgrid, 0)
        self.ssize, self.sirr = self._fold(self.sgrid, m)
        self._cache: dict = {}         # prefix -> _row
        self._located: dict = {}       # key -> locate(key)

    def _fold(self, grid, first: int):
        size = np.ones(len(grid), dtype=np.int64)
        irr = np.zeros(len(grid), dtype=np.int64)
        for j in range(grid.shape[1]):
            size *= self.tile_sizes[first + j][grid[:, j]]
            irr ^= self.tile_irreps[first + j][grid[:, j]]
        return size, irr

    def _chunks(self):
        """(prefixes, their stored masks) over the whole grid, CHUNK cells at a time."""
        step = max(1, CHUNK // max(1, len(self.sgrid)))
        for p0 in range(0, len(self.pgrid), step):
            rows = np.arange(p0, min(p0 + step, len(self.pgrid)))
            yield rows, self._stored(rows)

    def _stored(self, rows) -> np.ndarray:
        """Whether each suffix under each prefix of ``rows`` is stored: (len(rows), suffixes)."""
        stored = (self.pirr[rows][:, None] ^ self.sirr[None, :]) == self.irrep
        if self.group:
            keys = [np.broadcast_to(self.pgrid[rows, j][:, None], stored.shape) for j in range(self.m)]
            keys += [np.broadcast_to(self.sgrid[:, j][None, :], stored.shape) for j in range(self.ndim - self.m)]
            code = self._code(keys, range(self.ndim))
            for g in self.group:
                stored &= code >= self._code(keys, g)
        return stored

    def _code(self, keys, order) -> np.ndarray:
        out = np.zeros(keys[0].shape, dtype=np.int64)
        for d in order:
            out = out * self.code_base + keys[d]
        return out

    def _split(self, keys: np.ndarray) -> tuple:
        p = np.zeros(len(keys), dtype=np.int64)
        for j in range(self.m):
            p = p * self.radix[j] + keys[:, j]
        q = np.zeros(len(keys), dtype=np.int64)
        for j in range(self.m, self.ndim):
            q = q * self.radix[j] + keys[:, j]
        return p, q

    def _cached_row(self, p: int, make) -> tuple:
        """``make(p)`` of prefix ``p``, the last ROWS prefixes used kept."""
        hit = self._cache.get(p)
        if hit is None:
            if len(self._cache) >= ROWS:
                self._cache.pop(next(iter(self._cache)))
            hit = self._cache[p] = make(p)
        return hit

    def stored(self, key) -> bool:
        """Whether ``key`` (a tuple of tile indices) is a stored block."""
        try:
            self.locate(key)
        except (KeyError, TypeError, ValueError):
            return False
        return True

    def locate(self, key) -> tuple:
        """(owner, offset in the owner's memory) of a stored key; KeyError otherwise.
        Kept for the next array of this structure (the keys a rank touches)."""
        hit = self._located.get(key)
        if hit is None:
            if len(key) != self.ndim:
                raise KeyError(key)
            hit = self._located[key] = self._locate(np.asarray([key], dtype=np.int64))
        return hit

    def keys(self) -> list:
        """Every stored key in key order (O(blocks): for inspection, not for a run)."""
        out = []
        for rows, stored in self._chunks():
            for p, mask in zip(rows.tolist(), stored):
                out += [tuple(self.pgrid[p].tolist()) + tuple(self.sgrid[q].tolist()) for q in np.flatnonzero(mask)]
        return out


class BalancedPlacement(StoredGrid):
    """The ``balanced`` placement of one structure on ``nranks`` ranks, per key.

    ``sizes[d]`` / ``irreps[d]``: tile sizes and irreps of dimension ``d``; ``irrep``:
    the tensor's irrep; ``group``: axis permutations under which only the largest key
    of an orbit is stored (empty: every allowed key is stored); ``shift``: the start
    rank (``distribution.structure_signature(spaces, irrep) % nranks``)."""

    name = "balanced"

    def __init__(self, sizes, irreps, irrep: int, group, nranks: int, shift: int = 0):
        super().__init__(sizes, irreps, irrep, group, len(sizes) // 2)
        self.nranks, self.shift = int(nranks), int(shift) % int(nranks)
        self.classes = np.unique(np.multiply.outer(np.unique(self.psize), np.unique(self.ssize)))[::-1]
        counts = np.zeros((len(self.pgrid), len(self.classes)), dtype=np.int64)
        for rows, stored in self._chunks():
            flat = (rows[:, None] * len(self.classes) + self._classes(rows))[stored]
            counts += np.bincount(flat, minlength=counts.size).reshape(counts.shape)
        self.before = np.cumsum(counts, axis=0) - counts      # exclusive, per class
        per_class = counts.sum(axis=0)
        self.start = np.concatenate(([0], np.cumsum(per_class)))      # class c: [start[c], start[c+1])
        self.nblocks = int(self.start[-1])
        self._local: dict = {}         # rank -> its keys

    def _classes(self, rows) -> np.ndarray:
        """Size class of every suffix under each prefix of ``rows``."""
        size = self.psize[rows][:, None] * self.ssize[None, :]
        return len(self.classes) - 1 - np.searchsorted(self.classes[::-1], size)

    # -- per key ------------------------------------------------------------------------
    def _row(self, p: int) -> tuple:
        """(stored, size class, rank among the stored suffixes of its class) of every
        suffix under prefix ``p``."""
        def make(p):
            rows = np.asarray([p])
            stored, cls = self._stored(rows)[0], self._classes(rows)[0]
            rank = np.zeros(len(stored), dtype=np.int64)
            for c in np.unique(cls[stored]):
                idx = np.flatnonzero(stored & (cls == c))
                rank[idx] = np.arange(len(idx))
            return stored, cls, rank
        return self._cached_row(p, make)

    def positions(self, keys) -> np.ndarray:
        """Global position (rank in the size-ranked order) of each key; -1 for a key that
        is not stored (outside the grid, not allowed, or an alias)."""
        keys = np.asarray(keys, dtype=np.int64).reshape(-1, self.ndim)
        out = np.full(len(keys), -1, dtype=np.int64)
        inside = ((keys >= 0) & (keys < self.radix)).all(axis=1)
        p, q = self._split(np.where(inside[:, None], keys, 0))
        for pu in np.unique(p[inside]).tolist():
            stored, cls, rank = self._row(pu)
            sel = np.flatnonzero(inside & (p == pu))
            sel = sel[stored[q[sel]]]
            c = cls[q[sel]]
            out[sel] = self.start[c] + self.before[pu, c] + rank[q[sel]]
        return out

    def owner_of(self, positions) -> np.ndarray:
        return (np.asarray(positions) + self.shift) % self.nranks

    def _count_below(self, g0: int, x) -> np.ndarray:
        """Positions g0, g0 + P, ... below x."""
        return np.maximum(0, (np.asarray(x) - g0 + self.nranks - 1) // self.nranks)

    def _elements_before(self, rank: int, j) -> int:
        """Elements of ``rank``'s first ``j`` blocks (its memory before its j-th block)."""
        g0 = (rank - self.shift) % self.nranks
        n = np.minimum(self._count_below(g0, self.start), j)
        return int(np.dot(np.diff(n), self.classes))

    def _locate(self, key) -> tuple:
        g = int(self.positions(key)[0])
        if g < 0:
            raise KeyError(tuple(key[0].tolist()))
        r = int(self.owner_of(g))
        return r, self._elements_before(r, (g - (r - self.shift) % self.nranks) // self.nranks)

    def elements(self, rank: int) -> int:
        """Elements ``rank`` holds."""
        return self._elements_before(rank, self.nblocks)

    def local_keys(self, rank: int) -> list:
        """``rank``'s keys in memory order, one after the other (only its own positions
        are unranked; kept for the next array of this structure)."""
        hit = self._local.get(rank)
        if hit is None:
            hit = self._local[rank] = self._unrank(rank)
        return list(hit)

    def _unrank(self, rank: int) -> tuple:
        g0 = (rank - self.shift) % self.nranks
        return self.keys_at(np.arange(g0, self.nblocks, self.nranks, dtype=np.int64))

    def keys_at(self, g) -> tuple:
        """The keys at positions ``g`` (stored blocks in the size-ranked order), as tuples."""
        g = np.asarray(g, dtype=np.int64)
        c = np.searchsorted(self.start, g, side="right") - 1
        t = g - self.start[c]
        p = np.empty(len(g), dtype=np.int64)
        for cu in np.unique(c):
            sel = c == cu
            p[sel] = np.searchsorted(self.before[:, cu], t[sel], side="right") - 1
        out = np.empty((len(g), self.ndim), dtype=np.int64)
        for pu in np.unique(p).tolist():
            stored, cls, _ = self._row(pu)
            sel = np.flatnonzero(p == pu)
            for cu in np.unique(c[sel]).tolist():      # the k-th stored suffix of class cu
                n = sel[c[sel] == cu]
                out[n, self.m:] = self.sgrid[np.flatnonzero(stored & (cls == cu))[t[n] - self.before[pu, cu]]]
            out[sel, :self.m] = self.pgrid[pu]
        return tuple(map(tuple, out.tolist()))


class RowsPlacement(StoredGrid):
    """The ``("rows", owners)`` placement per key: every stored block of first tile ``i``
    on rank ``owners[i]``, a rank's blocks in key order. Kept: the elements under each
    first tile and where each row starts in its owner's memory (O(tiles))."""

    name = "rows"

    def __init__(self, sizes, irreps, irrep: int, group, owners):
        super().__init__(sizes, irreps, irrep, group, 1)
        self.rows = np.asarray(owners, dtype=np.int64)
        elements = np.zeros(len(self.pgrid), dtype=np.int64)
        count = 0
        for rows, stored in self._chunks():
            elements[rows] = (stored * self.ssize[None, :]).sum(axis=1) * self.psize[rows]
            count += int(stored.sum())
        self.nblocks = count
        self.row_start = np.zeros(len(self.rows), dtype=np.int64)
        self._elements: dict = {}
        for i, r in enumerate(self.rows.tolist()):
            self.row_start[i] = self._elements.get(r, 0)
            self._elements[r] = self.row_start[i] + elements[i]

    def _row(self, p: int) -> tuple:
        """(stored, elements before each suffix) under first tile ``p``."""
        def make(p):
            stored = self._stored(np.asarray([p]))[0]
            sizes = stored * self.ssize * self.psize[p]
            return stored, np.cumsum(sizes) - sizes
        return self._cached_row(p, make)

    def _locate(self, key) -> tuple:
        if not ((key >= 0) & (key < self.radix)).all():
            raise KeyError(tuple(key[0].tolist()))
        p, q = (int(x[0]) for x in self._split(key))
        stored, before = self._row(p)
        if not stored[q]:
            raise KeyError(tuple(key[0].tolist()))
        return int(self.rows[p]), int(self.row_start[p] + before[q])

    def elements(self, rank: int) -> int:
        return int(self._elements.get(rank, 0))

    def local_keys(self, rank: int) -> list:
        """``rank``'s keys in key order (its rows only)."""
        out = []
        for p in np.flatnonzero(self.rows == rank).tolist():
            first = tuple(self.pgrid[p].tolist())
            out += [first + tuple(self.sgrid[q].tolist()) for q in np.flatnonzero(self._row(p)[0])]
        return out


class TablePlacement:
    """The same interface over an explicit owner of every key of ``layout`` (aligned
    with ``layout.keys``): a rank's blocks lie in key order."""

    def __init__(self, layout, owners, nranks: int):
        self.layout, self.owner = layout, np.asarray(owners, dtype=np.int64)
        self.sizes = layout.sizes()
        self.offset, self.run = block_offsets(self.owner, self.sizes, nranks)
        self.nblocks = len(layout.keys)

    def locate(self, key) -> tuple:
        n = self.layout.index[key]
        return int(self.owner[n]), int(self.offset[n])

    def elements(self, rank: int) -> int:
        return int(self.run[rank])

    def local_keys(self, rank: int) -> list:
        """``rank``'s keys in memory order (key order), one after the other."""
        return [self.layout.keys[n] for n in np.flatnonzero(self.owner == rank)]

    def keys(self) -> list:
        return list(self.layout.keys)


class PiecedPlacement:
    """The ``pieces`` placement of the stored blocks of ``base`` (a BalancedPlacement of
    the same structure: keys <-> positions) by ``deal`` (``distribution.PieceDeal``: a
    block's pieces, offsets and a rank's pieces by arithmetic on positions): nothing per
    block or piece is listed; ``pieces_of(key)`` is kept for the keys a rank touches. No
    rank holds a whole block (``local_keys`` is empty)."""

    name = "pieces"

    def __init__(self, base: BalancedPlacement, deal: PieceDeal):
        self.base, self.deal = base, deal
        self.nblocks, self.k = base.nblocks, deal.k
        self._pieces: dict = {}        # key -> pieces_of(key)
        self._positions: dict = {}     # key -> its position (the keys a rank touches)
        self._own: dict = {}           # rank -> (local_pieces, home_keys)

    def stored(self, key) -> bool:
        return self.base.stored(key)

    def keys(self) -> list:
        return self.base.keys()

    def pieces_of(self, key) -> list:
        """[(owner, offset in its memory, first element in the block, elements), ...] of
        the pieces of a stored key, in element order; KeyError for another key."""
        hit = self._pieces.get(key)
        if hit is None:
            hit = self._pieces[key] = self.deal.pieces(self._position(key))
        return hit

    def pieces_held(self, key, rank: int) -> list:
        """The entries of ``pieces_of(key)`` that ``rank`` holds, made alone (arithmetic:
        O(size classes), whatever the pieces per block)."""
        return self.deal.pieces_held(self._position(key), rank)

    def piece_table(self, keys) -> tuple:
        """``distribution.PieceDeal.table`` of stored ``keys``: (index into ``keys``, owner,
        elements) of every piece (vectorised)."""
        return self.deal.table(self.base.positions(keys))

    def _position(self, key) -> int:
        g = self._positions.get(key)
        if g is None:
            g = int(self.base.positions(key)[0]) if len(key) == self.base.ndim else -1
            if g < 0:
                raise KeyError(key)
            self._positions[key] = g
        return g

    def locate(self, key) -> tuple:
        """(home: the owner of the block's first piece, its offset there)."""
        return self.pieces_of(key)[0][:2]

    def elements(self, rank: int) -> int:
        return self.deal.elements(rank)

    def local_keys(self, rank: int) -> list:
        return []

    def _rank(self, rank: int) -> tuple:
        if rank not in self._own:
            g, start, count = self.deal.rank_pieces(rank)
            self._own[rank] = (list(zip(self.base.keys_at(g), start.tolist(), count.tolist())),
                               sorted(self.base.keys_at(self.deal.home_positions(rank))))
        return self._own[rank]

    def home_keys(self, rank: int) -> list:
        """The keys whose first piece ``rank`` holds (their home), in key order."""
        return self._rank(rank)[1]

    def local_pieces(self, rank: int) -> list:
        """[(key, first element in the block, elements), ...] of the pieces ``rank`` holds,
        in memory order (one after the other from its offset 0)."""
        return self._rank(rank)[0]


def block_placement(spaces, irrep: int, group, nranks: int, placement="balanced", least_pieces: int = 1):
    """The placement of a structure (index spaces with ``tiles`` of ``size`` and
    ``irrep``, the tensor's irrep, its canonical group or ``()``) on ``nranks`` ranks:
    ``"balanced"``, ``"pieces"`` or ``("rows", owners)`` (see
    ``distribution.block_owner_array``); ``pieces`` is the BalancedPlacement where
    whole blocks are cut in one piece (``distribution.piece_count``; at least
    ``least_pieces``)."""
    sizes = [[t.size for t in s.tiles] for s in spaces]
    irreps = [[t.irrep for t in s.tiles] for s in spaces]
    rows = check_placement(placement, len(sizes[0]), nranks)
    if rows is not None:
        return RowsPlacement(sizes, irreps, irrep, group, rows)
    base = BalancedPlacement(sizes, irreps, irrep, group, nranks, structure_signature(spaces, irrep) % nranks)
    if placement == "pieces" and base.nblocks:
        deal = PieceDeal(base.classes, np.diff(base.start), nranks, base.shift, least_pieces)
        if deal.k > 1:
            return PiecedPlacement(base, deal)
    return base


def _rows_before(x, lo, hi, strides, last: int) -> np.ndarray:
    """How many rows of the box [lo, hi) of a C-order block (``strides``: elements per step
    of each axis; a row: the box's elements along the axes from ``last`` on, ``last`` its
    last cut axis) start before element ``x`` (an array): digit by digit over the axes
    before ``last``, O(axes), without listing the rows."""
    rem = np.asarray(x, dtype=np.int64) - lo[last] * strides[last]
    count = np.zeros(rem.shape, dtype=np.int64)
    alive = np.ones(rem.shape, dtype=bool)          # the row's leading digits equal x's so far
    below = 1
    for ax in range(last - 1, -1, -1):
        below *= hi[ax] - lo[ax]
    for ax in range(last):
        below //= hi[ax] - lo[ax]
        q = rem // strides[ax]
        count += np.where(alive, np.clip(q - lo[ax], 0, hi[ax] - lo[ax]) * below, 0)
        alive &= (lo[ax] <= q) & (q < hi[ax])
        rem = rem - q * strides[ax]
    return count + (alive & (rem > 0))


def part_runs(pieces, shape, lo, hi) -> tuple:
    """Where the box [lo, hi) of a block of ``shape`` (C order) lies in ``pieces``
    ([(owner, offset in its memory, first element in the block, elements)]: contiguous runs
    of the block's elements, all of them or some): one run per contiguous row of the box
    within a piece, as arrays in the box's element order: owner, offset, first element in
    the box, elements. The rows a piece meets are counted (``_rows_before``), not searched:
    O(pieces x axes + runs) work, nothing for the rows of pieces not given."""
    if not pieces:
        return (np.zeros(0, dtype=np.int64),) * 4
    strides = np.cumprod((1,) + tuple(shape[:0:-1]), dtype=np.int64)[::-1].tolist()
    box = [b - a for a, b in zip(lo, hi)]
    cut = [ax for ax in range(len(shape)) if box[ax] != shape[ax]]
    last = cut[-1] if cut else 0
    row = box[last] * strides[last]                          # elements per row of the box
    owner, offset, start, count = (np.array([p[n] for p in pieces], dtype=np.int64).reshape(-1) for n in range(4))
    end = start + count
    i0 = _rows_before(start - row + 1, lo, hi, strides, last)   # the first row ending after the piece starts
    i1 = _rows_before(end, lo, hi, strides, last)               # the rows starting before it ends
    n = np.maximum(i1 - i0, 0)
    which = np.repeat(np.arange(len(n)), n)                   # a run per (piece, row)
    rows = np.arange(int(n.sum()), dtype=np.int64) - np.repeat(np.cumsum(n) - n, n) + i0[which]
    first = np.full(len(rows), lo[last] * strides[last], dtype=np.int64)
    for ax, digit in zip(range(last), np.unravel_index(rows, box[:last]) if last else ()):
        first += (lo[ax] + digit) * strides[ax]
    s, e = np.maximum(first, start[which]), np.minimum(first + row, end[which])
    pos = rows * row + s - first
    order = np.argsort(pos, kind="stable")
    return owner[which][order], (offset[which] + s - start[which])[order], pos[order], (e - s)[order]


class PieceRuns(NamedTuple):
    """``GlobalArray.piece_runs``: the stored key, the axis order (None, or the alias's
    ``transpose`` of the stored block), the part's shape in the stored axes, and per run
    (arrays, in the part's element order, C order of the stored axes): the rank holding
    it, its offset in that rank's memory, its first element in the part, its elements."""
    key: tuple
    order: tuple | None
    shape: tuple
    owner: np.ndarray
    offset: np.ndarray
    pos: np.ndarray
    count: np.ndarray


def run_index(starts, counts):
    """An index of a flat array selecting the runs ``starts[i]``.. ``+ counts[i]`` one after
    the other: a slice for one run, else an integer array."""
    if len(starts) == 1:
        return slice(int(starts[0]), int(starts[0] + counts[0]))
    ends = np.cumsum(counts)
    return np.arange(int(ends[-1]) if len(ends) else 0, dtype=np.int64) + np.repeat(starts - ends + counts, counts)
