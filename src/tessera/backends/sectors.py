"""Cached block maps of the local executors' steps: which block goes where, built once.

A CCSD iteration runs the same steps on the same block structures every time; only the
numbers change. The per-block bookkeeping of a step (the key of a block in its tensor's
axis order, its rows and columns in a sector matrix, its shape, whether the output
stores it or it is an alias) is therefore computed once per structure and kept here
(keyed by the sector layouts, which ``plan.layout`` makes once per space group and
irrep, the permutations and the output's alias map). What is left per block at run
time is a dictionary look-up and one NumPy copy or add (``blockops``). No data, no
threads, no physics here.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from functools import lru_cache

import numpy as np

from tessera.plan.blocktasks import invert_key
from tessera.tensor.pairs import pack_block, triu_pairs
from tessera.tensor.block_tensor import allowed_elements, allowed_keys, flat_offsets, flat_size


@lru_cache(maxsize=4096)
def gather_map(rows, cols, perm) -> tuple:
    """(key, row slice, column slice, permuted block shape) of every block of a sector
    matrix (rows x cols layouts); ``key`` in the tensor's own axis order, from which
    ``block.transpose(perm)`` lands at (row slice, column slice) reshaped."""
    out = []
    for rk, r0, rs, rsh in zip(rows.tuples, rows.offsets, rows.sizes, rows.shapes):
        rsl = slice(r0, r0 + rs)
        for ck, c0, cs, csh in zip(cols.tuples, cols.offsets, cols.sizes, cols.shapes):
            out.append((invert_key(rk + ck, perm), rsl, slice(c0, c0 + cs), rsh + csh))
    return tuple(out)


@lru_cache(maxsize=4096)
def scatter_map(rows, cols, cperm, aliases, first: int, last: int) -> tuple:
    """(output key, row slice, column slice, product shape) of the output blocks that
    rows ``first:last`` of a sector product (rows x cols) update, rows counted from the
    first of those rows; blocks an output stores as aliases of canonical ones are left
    out (a canonical output receives its canonical blocks only)."""
    identity = cperm == tuple(range(len(cperm)))
    base = rows.offsets[first]
    out = []
    for r in range(first, last):
        rk, rsh = rows.tuples[r], rows.shapes[r]
        rsl = slice(rows.offsets[r] - base, rows.offsets[r] - base + rows.sizes[r])
        for ck, c0, cs, csh in zip(cols.tuples, cols.offsets, cols.sizes, cols.shapes):
            key = rk + ck if identity else tuple((rk + ck)[p] for p in cperm)
            if aliases and key in aliases:
                continue
            out.append((key, rsl, slice(c0, c0 + cs), rsh + csh))
    return tuple(out)


@lru_cache(maxsize=4096)
def add_map(spaces: tuple, irrep: int, perm, dperm, aliases) -> tuple:
    """(source key, output key, divisor key or None) of an ``add`` step over every
    allowed source block, the output's alias blocks left out."""
    out = []
    for key in allowed_keys(spaces, irrep):
        okey = tuple(key[p] for p in perm)
        if aliases and okey in aliases:
            continue
        out.append((key, okey, None if dperm is None else invert_key(okey, dperm)))
    return tuple(out)


# ----------------------------------------------------------------------------- flat path
# Tensors of small blocks (high point-group symmetry: one tile per irrep, blocks of a
# few hundred elements) spend more time in the per-block NumPy calls above than in
# moving data. For them a step works on whole tensors instead (``BlockTensor.flat``):
# one index array per step maps every element once, and a gather, a scatter or a
# permuted add is one ``take`` and one vector add. The index arrays are built once per
# block structure and kept here, within ``INDEX_BYTES``.
FLAT_BLOCK_ELEMENTS = 8192      # stored elements per stored block below which a tensor takes the flat path
INDEX_BYTES = 256 << 20         # index arrays kept, at most (least recently used dropped)


class IndexCache:
    """Index arrays by block structure, least recently used dropped beyond ``INDEX_BYTES``."""

    def __init__(self):
        self.entries: OrderedDict = OrderedDict()
        self.bytes = self.hits = 0

    def get(self, key, build):
        hit = self.entries.get(key)
        if hit is not None:
            self.entries.move_to_end(key)
            self.hits += 1
            return hit
        made = self.entries[key] = build()
        self.bytes += _nbytes(made)
        while self.bytes > INDEX_BYTES and len(self.entries) > 1:
            self.bytes -= _nbytes(self.entries.popitem(last=False)[1])
        return made


def _nbytes(entry: tuple) -> int:
    """Bytes of the arrays of a cache entry (a tuple of arrays and others, or of such tuples)."""
    return sum(a.nbytes if isinstance(a, np.ndarray) else _nbytes(a) if isinstance(a, tuple) else 0 for a in entry)


index_cache = IndexCache()


def small_blocks(t) -> bool:
    """Whether a local tensor's blocks are small enough for the flat path."""
    return t.dist is None and _small(t.spaces, t.irrep, t.aliases or None, FLAT_BLOCK_ELEMENTS)


@lru_cache(maxsize=4096)
def _small(spaces: tuple, irrep: int, aliases, block_elements: int) -> bool:
    """``small_blocks`` of a structure (asked about a hundred times per CCSD residual)."""
    offsets = flat_offsets(spaces, irrep, aliases)
    return bool(offsets) and allowed_elements(spaces, irrep) < block_elements * len(offsets)


def _structure(t) -> tuple:
    return t.spaces, t.irrep, t.aliases or None


def _positions(structure, key) -> np.ndarray:
    """Positions in ``BlockTensor.flat`` of the elements of block ``key`` (in the block's
    shape; an alias block's are its canonical block's, transposed)."""
    aliases = structure[2]
    offsets = flat_offsets(*structure)
    perm = None
    if aliases and key in aliases:
        key, perm = aliases[key]
    offset, shape = offsets[key]
    pos = np.arange(offset, offset + math.prod(shape)).reshape(shape)
    return pos if perm is None else pos.transpose(perm)


def gather_index(t, perm, layouts: dict) -> tuple:
    """(index, [(g, start, shape)]): the sector matrices of ``t`` transposed by ``perm``
    (``layouts[g] = (rows, cols)``) are ``t.flat().take(index)[start:start + size]``."""
    structure = _structure(t)

    def build():
        parts, out, start = [], [], 0
        for g, (rows, cols) in layouts.items():
            idx = np.empty((rows.total, cols.total), np.intp)
            for key, rsl, csl, bshape in gather_map(rows, cols, perm):
                idx[rsl, csl].reshape(bshape)[...] = _positions(structure, key).transpose(perm)
            parts.append(idx.ravel())
            out.append((g, start, idx.shape))
            start += idx.size
        return np.concatenate(parts) if parts else np.zeros(0, np.intp), out

    return index_cache.get(("gather", structure, perm, tuple((g, r, c) for g, (r, c) in layouts.items())), build)


def scatter_index(out, cperm, sectors) -> tuple:
    """(index, total): element n of ``out.flat()`` receives element index[n] of the sector
    products laid end to end (each rows x cols, ``total`` elements; index ``total`` is a
    zero: an output block no sector makes). Alias blocks of a canonical output are left out."""
    structure = _structure(out)
    sectors = tuple(sectors)

    def build():
        aliases = structure[2]
        n = flat_size(*structure)
        total = sum(s.rows.total * s.cols.total for s in sectors)
        idx = np.full(n, total, np.intp)
        offsets, start = flat_offsets(*structure), 0
        for s in sectors:
            product = np.arange(start, start + s.rows.total * s.cols.total).reshape(s.rows.total, s.cols.total)
            for key, rsl, csl, shape in scatter_map(s.rows, s.cols, cperm, aliases, 0, len(s.rows.tuples)):
                offset, oshape = offsets[key]          # a stored key: its elements in order
                idx[offset:offset + math.prod(oshape)].reshape(oshape)[...] = \
                    product[rsl, csl].reshape(shape).transpose(cperm)
            start += product.size
        return idx, total

    return index_cache.get(("scatter", structure, cperm, sectors), build)


def add_index(a, out, perm, divisor=None, dperm=None) -> tuple:
    """(a index, divisor index): element n of ``out.flat()`` is updated from
    ``a.flat()[a_index[n]]`` (divided by ``divisor.flat()[d_index[n]]``); an index is
    None where it is the identity."""
    sa, so = _structure(a), _structure(out)
    sd = _structure(divisor) if divisor is not None else None

    def build():
        entries = add_map(a.spaces, a.irrep, perm, dperm, so[2])
        n = flat_size(*so)
        ia = np.empty(n, np.intp)
        idd = np.empty(n, np.intp) if sd is not None else None
        offsets = flat_offsets(*so)
        for key, okey, dkey in entries:
            offset, oshape = offsets[okey]             # a stored key: its elements in order
            where = slice(offset, offset + math.prod(oshape))
            ia[where].reshape(oshape)[...] = _positions(sa, key).transpose(perm)
            if idd is not None:
                idd[where].reshape(oshape)[...] = _positions(sd, dkey).transpose(dperm)
        return _unless_identity(ia, sa, n), (_unless_identity(idd, sd, n) if sd is not None else None)

    return index_cache.get(("add", sa, so, sd, perm, dperm), build)


def _unless_identity(index, structure, n: int):
    """None when ``index`` reads a flat vector of ``n`` elements in order, else ``index``."""
    return None if flat_size(*structure) == n and np.array_equal(index, np.arange(n)) else index


# divisors of a pair-map element (``pair_index``): 1, 2 (an ``unpack_half``'s pair p = q;
# the +/- ladder's halves), inf (an element that takes nothing from this source: x / inf
# = 0), -1 and -2 (the +/- ladder's antisymmetric parts)
PAIR_DIVISORS = np.array([1.0, 2.0, np.inf, -1.0, -2.0])
_ONE, _TWO, _NONE, _MINUS_ONE, _MINUS_TWO = range(5)
_PM_SIGNS = {"plus_pack": 1, "minus_pack": -1, "plus_unpack": 1, "minus_unpack": -1}
FLAT_PAIRS = ("pack", "unpack_half", "unpack", *_PM_SIGNS)     # what ``pair_index`` maps


def pair_index(a, out, kind: str, sym: tuple | None = None) -> tuple:
    """((a index, divisor index), ...) of a pair step (``FLAT_PAIRS``, ``tensor.pairs``) on
    the flat path: each pair adds ``a.flat()[a_index[n]]`` to element n of ``out.flat()``,
    divided by ``PAIR_DIVISORS[d_index[n]]`` (a divisor index None: by 1). One pair, two
    for a ``plus_pack`` / ``minus_pack`` (an element of X+- is made of two of X)."""
    if kind in _PM_SIGNS:
        return index_cache.get(("pm", kind, _structure(a), _structure(out)), lambda: _pm_index(a, out, kind))
    return (_pair_index(a, out, kind, sym),)


def _pair_index(a, out, kind: str, sym: tuple | None = None) -> tuple:
    """(a index, divisor index) of a ``pack`` / ``unpack_half`` / ``unpack`` step: element
    n of ``out.flat()`` is updated from ``a.flat()[a_index[n]]``, divided by
    ``PAIR_DIVISORS[d_index[n]]`` (an ``unpack_half``; None otherwise). ``out`` stores
    every allowed block (no aliases), but for an ``unpack`` (its stored blocks, ``sym``
    the symmetry they mirror by)."""
    sa, so = _structure(a), _structure(out)

    def build():
        n = flat_size(*so)
        ia = np.zeros(n, np.intp)
        idd = np.zeros(n, np.intp) if kind == "unpack_half" else None
        for okey, (offset, oshape) in flat_offsets(*so).items():
            where = slice(offset, offset + math.prod(oshape))
            if kind == "unpack":
                ia[where] = _unpack_positions(sa, a.spaces[0], okey, oshape, sym).ravel()
                continue
            if kind == "pack":
                s, t = out.spaces[0].tile_pairs[okey[0]]
                ia[where] = pack_block(_positions(sa, (s, t) + okey[1:]), s == t).ravel()
                continue
            s, t = okey[:2]
            if s > t:
                idd[where] = _NONE
                continue
            pos = _positions(sa, (a.spaces[0].tile_of[s, t],) + okey[2:])
            if s < t:
                ia[where] = pos.ravel()
                continue
            upper, divisor = triu_pairs(oshape[0]), np.full(oshape, _NONE, np.intp)
            full = np.zeros(oshape, np.intp)
            full[upper] = pos
            divisor[upper] = _ONE
            divisor[np.diag_indices(oshape[0])] = _TWO
            ia[where], idd[where] = full.ravel(), divisor.ravel()
        return ia, idd

    return index_cache.get(("pairs", kind, sa, so, sym), build)


def _pm_index(a, out, kind: str) -> tuple:
    """The pairs of ``pair_index`` for a step of the +/- ladder (``tensor.pairs``:
    ``pm_pack_block``, ``pm_unpack_block``, sign +1 for plus, -1 for minus). A pack: X+-
    (P, {s, t}) from X (P, s, t) / 2 and X (P, t, s) transposed / (2 sign), a diagonal
    pair c = c from X (P, c, c) / 2 (plus) or nothing (minus). An unpack: R (P, s, t) from
    S or A (P, {s, t}): s < t as it is, s > t transposed times sign, within a diagonal tile
    pair c < d as is, c > d from (d, c) times sign, c = d once (plus) or not (minus)."""
    sign = _PM_SIGNS[kind]
    sa, so = _structure(a), _structure(out)
    n = flat_size(*so)
    if kind.endswith("_pack"):
        direct, crossed = np.zeros(n, np.intp), np.zeros(n, np.intp)
        ddiv, cdiv = np.full(n, _TWO, np.intp), np.full(n, _TWO if sign > 0 else _MINUS_TWO, np.intp)
        for (p, st), (offset, oshape) in flat_offsets(*so).items():
            where = slice(offset, offset + math.prod(oshape))
            s, t = out.spaces[1].tile_pairs[st]
            pos = _positions(sa, (p, s, t))
            if s != t:
                direct[where] = pos.ravel()
                crossed[where] = _positions(sa, (p, t, s)).transpose(0, 2, 1).ravel()
                continue
            upper = triu_pairs(pos.shape[1])
            direct[where] = pos[:, upper[0], upper[1]].ravel()
            crossed[where] = pos[:, upper[1], upper[0]].ravel()
            diagonal = np.zeros(oshape, bool)
            diagonal[:, upper[0] == upper[1]] = True
            cdiv[where][diagonal.ravel()] = _NONE
            if sign < 0:
                ddiv[where][diagonal.ravel()] = _NONE
        return (direct, ddiv), (crossed, cdiv)
    ia, idd = np.zeros(n, np.intp), np.full(n, _ONE, np.intp)
    for (p, s, t), (offset, oshape) in flat_offsets(*so).items():
        where = slice(offset, offset + math.prod(oshape))
        if s != t:
            pos = _positions(sa, (p, a.spaces[1].tile_of[min(s, t), max(s, t)]))
            ia[where] = (pos.reshape(oshape) if s < t else
                         pos.reshape(oshape[0], oshape[2], oshape[1]).transpose(0, 2, 1)).ravel()
            if s > t and sign < 0:
                idd[where] = _MINUS_ONE
            continue
        pos, m = _positions(sa, (p, a.spaces[1].tile_of[s, t])), oshape[1]
        upper, full = triu_pairs(m), np.zeros(oshape, np.intp)
        full[:, upper[0], upper[1]] = pos
        full[:, upper[1], upper[0]] = pos
        divisor = np.full(oshape, _ONE if sign > 0 else _MINUS_ONE, np.intp)
        divisor[:, upper[0], upper[1]] = _ONE
        divisor[:, np.arange(m), np.arange(m)] = _ONE if sign > 0 else _NONE
        ia[where], idd[where] = full.ravel(), divisor.ravel()
    return ((ia, idd),)


def _unpack_positions(sa, pairs, okey: tuple, oshape: tuple, sym: tuple) -> np.ndarray:
    """Positions in the pair tensor (structure ``sa``, pair space ``pairs``) of the
    elements of the pair-symmetric block ``okey`` (s, t, ...): those of its pair block
    when s < t, of its mirror image's by ``sym`` when s > t; when s = t, the pairs p <= q
    from its own pair block (the diagonal p = q once), p > q from its mirror image's."""

    def from_pair(key, shape):          # block ``key`` (s <= t) read from its pair block
        s, t = key[:2]
        pos = _positions(sa, (pairs.tile_of[s, t],) + tuple(key[2:]))
        if s != t:
            return pos.reshape(shape)
        full = np.zeros(shape, np.intp)
        full[triu_pairs(shape[0])] = pos
        return full
    s, t = okey[:2]
    mirror = tuple(okey[n] for n in sym)
    if s < t:
        return from_pair(okey, oshape)
    lower = from_pair(mirror, tuple(oshape[n] for n in sym)).transpose(sym)
    if s > t:
        return lower
    full = from_pair(okey, oshape)
    below = np.tril(np.ones(oshape[:2], bool), -1)
    full[below] = lower[below]
    return full
