"""Block tasks of a planned step: which blocks of A and B meet to update which block of C.

A contraction step (see ``planner``) is one GEMM per symmetry sector when all blocks are
at hand. When blocks are spread over processes, the same step is a list of block tasks:
for every output tile pair (r, c) of a sector, the products A[r, k] x B[k, c] over the
sector's inner tile tuples k. The sector layouts (``layout``) list exactly the
symmetry-allowed combinations, so nothing forbidden is ever enumerated. Keys are given
in each tensor's own axis order; ``perm_a`` / ``perm_b`` bring a block to
(external, contracted) / (contracted, external) order, ``perm_c`` the (r, c) product to
the output's order. No data and no processes here: only structure, cached per layout.
"""

from __future__ import annotations

import itertools
from functools import lru_cache
from typing import NamedTuple

import numpy as np

from tessera.tensor.pairs import pack_block, pm_pack_block, pm_unpack_block, unpack_half_block


class Product(NamedTuple):
    """One GEMM of a block task: A block (m x k after permutation) times B block (k x n)."""

    a: tuple
    b: tuple
    k: int
    inner: int          # position of the inner tuple in the sector's inner layout


class OutputTask(NamedTuple):
    """All products that update one output block."""

    out: tuple            # output key (output axis order)
    sector: int           # index into step.sectors
    r: int                # row tuple position
    c: int                # column tuple position
    m: int
    n: int
    out_shape: tuple      # shape of the (r, c) product before perm_c
    products: tuple       # Product, ...

    @property
    def flops(self) -> int:
        return sum(2 * self.m * p.k * self.n for p in self.products)


def invert_key(tkey, perm) -> tuple:
    """Key in a tensor's own axis order from its key permuted by ``perm``."""
    key = [0] * len(perm)
    for n, p in enumerate(perm):
        key[p] = tkey[n]
    return tuple(key)


def contraction_tasks(step) -> tuple:
    """OutputTasks of a ``contract`` step (every allowed output tile pair with products;
    for an output stored as canonical blocks, its canonical blocks only)."""
    return _tasks(*_layout(step))


def sector_signature(step) -> tuple:
    """(irrep, rows, inner, cols) of each sector of a contraction step: its layouts,
    hashable (what the caches of its tasks, batches and products are kept by)."""
    return tuple((s.irrep, s.rows, s.inner, s.cols) for s in step.sectors)


def _layout(step) -> tuple:
    """What a step's block tasks depend on: its sectors' layouts, the operands' axis
    orders and the output's aliases (the key of the caches below)."""
    perms = step.perms
    return sector_signature(step), perms["a"], perms["b"], perms["c"], step.out.tensor.aliases or None


def _outputs(rows, cols, perm_c, aliases) -> list:
    """(r, c, output key) of a sector's output tile pairs in task order, less the
    output's ``aliases`` (blocks stored as another, canonical block)."""
    identity = perm_c == tuple(range(len(perm_c)))
    out = []
    for r, rk in enumerate(rows.tuples):
        for c, ck in enumerate(cols.tuples):
            key = rk + ck
            okey = key if identity else tuple(key[p] for p in perm_c)
            if not (aliases and okey in aliases):
                out.append((r, c, okey))
    return out


def task_count(step) -> int:
    """The number of ``contraction_tasks(step)`` (output blocks), counted without listing
    their products."""
    return _task_count(*_layout(step))


@lru_cache(maxsize=4096)
def _task_count(sig, perm_a, perm_b, perm_c, aliases=None) -> int:
    if not aliases:
        return sum(len(rows.tuples) * len(cols.tuples) for _, rows, _, cols in sig)
    return sum(len(_outputs(rows, cols, perm_c, aliases)) for _, rows, _, cols in sig)


@lru_cache(maxsize=4096)
def _tasks(sig, perm_a, perm_b, perm_c, aliases=None) -> tuple:
    out = []
    for n, (_, rows, inner, cols) in enumerate(sig):
        akeys = [[invert_key(rk + kk, perm_a) for kk in inner.tuples] for rk in rows.tuples]
        bkeys = [[invert_key(kk + ck, perm_b) for ck in cols.tuples] for kk in inner.tuples]
        for r, c, okey in _outputs(rows, cols, perm_c, aliases):
            prods = tuple(Product(akeys[r][q], bkeys[q][c], inner.sizes[q], q)
                          for q in range(len(inner.tuples)))
            out.append(OutputTask(okey, n, r, c, rows.sizes[r], cols.sizes[c],
                                  rows.shapes[r] + cols.shapes[c], prods))
    return tuple(out)


class TaskArrays(NamedTuple):
    """``contraction_tasks`` as flat arrays, for counting without a loop over products:
    per task its ``out`` key, ``m`` and ``n``; per product (tasks' products in order) its
    ``task``, ``k`` and the index of its A and B block in ``a_keys`` / ``b_keys`` (the
    distinct keys the products use); ``start``: task t's products are
    ``start[t]:start[t + 1]``; ``a_size`` / ``b_size``: elements of each A / B block, by
    key index (``block_sizes``)."""

    out: tuple
    m: np.ndarray
    n: np.ndarray
    task: np.ndarray
    k: np.ndarray
    a: np.ndarray
    b: np.ndarray
    a_keys: tuple
    b_keys: tuple
    start: np.ndarray
    a_size: np.ndarray
    b_size: np.ndarray


def task_arrays(step) -> TaskArrays:
    """``TaskArrays`` of a ``contract`` step (cached per layout, as its tasks are)."""
    return _arrays(*_layout(step))


@lru_cache(maxsize=256)
def _arrays(sig, perm_a, perm_b, perm_c, aliases=None) -> TaskArrays:
    # the tasks and products of ``_tasks``, in its order, from the sector layouts alone:
    # A block (r, q) and B block (q, c) of a sector numbered from the sector's base, then
    # renumbered over the blocks the tasks use
    outs, parts, bases = [], [], []
    a_base = b_base = ntask = 0
    for _, rows, inner, cols in sig:
        nq, nc = len(inner.tuples), len(cols.tuples)
        kept = []
        for r, c, okey in _outputs(rows, cols, perm_c, aliases):
            kept.append((r, c))
            outs.append(okey)
        r, c = np.array(kept, dtype=np.int64).reshape(-1, 2).T
        q = np.tile(np.arange(nq), len(kept))
        parts.append((np.asarray(rows.sizes, dtype=np.int64)[r], np.asarray(cols.sizes, dtype=np.int64)[c],
                      ntask + np.repeat(np.arange(len(kept)), nq), np.asarray(inner.sizes, dtype=np.int64)[q],
                      a_base + np.repeat(r, nq) * nq + q, b_base + q * nc + np.repeat(c, nq)))
        bases.append((a_base, b_base, rows, inner, cols))
        a_base, b_base, ntask = a_base + len(rows.tuples) * nq, b_base + nq * nc, ntask + len(kept)
    m, n, task, k, a, b = (np.concatenate([p[i] for p in parts]) if parts else np.zeros(0, dtype=np.int64)
                           for i in range(6))
    (a_ids, a), (b_ids, b) = (np.unique(x, return_inverse=True) for x in (a, b))
    keys = []      # A ids: a_base + r * len(inner) + q; B ids: b_base + q * len(cols) + c
    for ids, (x, lrow, lcol), perm in ((a_ids, (0, 2, 3), perm_a), (b_ids, (1, 3, 4), perm_b)):
        start = np.array([base[x] for base in bases] or [0])
        width = np.array([max(1, len(base[lcol].tuples)) for base in bases] or [1])
        sector = np.searchsorted(start, ids, side="right") - 1
        row, col = np.divmod(ids - start[sector], width[sector])
        keys.append(tuple(invert_key(bases[g][lrow].tuples[i] + bases[g][lcol].tuples[j], perm)
                          for g, i, j in zip(sector.tolist(), row.tolist(), col.tolist())))
    counts = np.bincount(task, minlength=ntask)
    a, b = a.astype(np.int64), b.astype(np.int64)
    sizes = []
    for ids, rows, cols, nkeys in ((a, m[task], k, len(keys[0])), (b, k, n[task], len(keys[1]))):
        size = np.zeros(nkeys, dtype=np.int64)
        size[ids] = rows * cols
        sizes.append(size)
    out = TaskArrays(tuple(outs), m, n, task, k, a, b, *keys,
                     np.concatenate(([0], np.cumsum(counts))).astype(np.int64), *sizes)
    for x in out:               # cached and shared by every caller: read-only
        if isinstance(x, np.ndarray):
            x.flags.writeable = False
    return out


def block_sizes(ta: TaskArrays) -> tuple:
    """(elements of each A block, of each B block) of ``TaskArrays`` ``ta``, by key index
    (made once with the arrays)."""
    return ta.a_size, ta.b_size


def owned_tasks(step, keys) -> tuple:
    """The OutputTasks of ``contraction_tasks(step)`` whose output key is one of ``keys``
    (a rank's own output blocks), in the same order, built from those keys alone: each
    key is found in its sector's row and column layouts (no other output is listed), so
    the work is O(own outputs x inner tuples), not O(all outputs)."""
    perms = step.perms
    return _owned(sector_signature(step), perms["a"], perms["b"], perms["c"], step.out.tensor.aliases or None,
                  frozenset(keys))


@lru_cache(maxsize=1024)
def _owned(sig, perm_a, perm_b, perm_c, aliases, keys) -> tuple:
    nk = (len(perm_a) + len(perm_b) - len(perm_c)) // 2       # contracted indices
    nl = len(perm_a) - nk                                      # A's external (row) indices
    found = []
    for okey in keys:
        if aliases and okey in aliases:
            continue
        key = invert_key(okey, perm_c)
        rk, ck = key[:nl], key[nl:]
        for n, (_, rows, inner, cols) in enumerate(sig):
            r, c = rows.index.get(rk), cols.index.get(ck)
            if r is not None and c is not None:
                found.append((n, r, c, okey))
                break
    return tuple(_output_task(sig, n, r, c, okey, perm_a, perm_b) for n, r, c, okey in sorted(found))


def _output_task(sig, n: int, r: int, c: int, okey, perm_a, perm_b, qs=None) -> OutputTask:
    """The OutputTask of row tuple r and column tuple c of sector n (output key ``okey``),
    with the products of inner tuples ``qs`` (default: all)."""
    _, rows, inner, cols = sig[n]
    rk, ck = rows.tuples[r], cols.tuples[c]
    prods = tuple(Product(invert_key(rk + inner.tuples[q], perm_a), invert_key(inner.tuples[q] + ck, perm_b),
                          inner.sizes[q], q) for q in (range(len(inner.tuples)) if qs is None else qs))
    return OutputTask(okey, n, r, c, rows.sizes[r], cols.sizes[c], rows.shapes[r] + cols.shapes[c], prods)


def indexed_tasks(step) -> "IndexedTasks":
    """``contraction_tasks(step)`` as an ``IndexedTasks`` (one per layout, cached)."""
    return _indexed(*_layout(step))


@lru_cache(maxsize=256)
def _indexed(sig, perm_a, perm_b, perm_c, aliases=None) -> "IndexedTasks":
    return IndexedTasks(sig, perm_a, perm_b, perm_c, aliases)


class IndexedTasks:
    """``contraction_tasks`` of a layout by index: task i (a counter's value, a static
    queue's entry) is found by arithmetic (its sector from the tasks before each sector,
    then row and column tuple by divmod; an output with aliases: from the (r, c) array of
    the outputs each sector keeps) and its OutputTask made when asked, so a rank
    builds the products of the tasks it runs only (made again when asked again: nothing
    kept grows with the tasks a counter hands it over the iterations). ``flops``: every
    task's, as one array (what a deal by cost needs)."""

    def __init__(self, sig, perm_a, perm_b, perm_c, aliases=None):
        self._sig, self._perms = sig, (perm_a, perm_b, perm_c)
        self._kept, counts, flops = [], [], []
        for _, rows, inner, cols in sig:
            nc = len(cols.tuples)
            if aliases:      # the (r, c) of the outputs stored as themselves
                rc = np.array([(r, c) for r, c, _ in _outputs(rows, cols, perm_c, aliases)],
                              dtype=np.int64).reshape(-1, 2)
                r, c = rc[:, 0], rc[:, 1]
            else:
                rc = None
                r, c = np.divmod(np.arange(len(rows.tuples) * nc, dtype=np.int64), max(nc, 1))
            self._kept.append(rc)
            counts.append(len(r))
            flops.append(2 * np.asarray(rows.sizes, dtype=np.int64)[r] * np.asarray(cols.sizes, dtype=np.int64)[c]
                         * int(sum(inner.sizes)))
        self._starts = np.concatenate(([0], np.cumsum(counts, dtype=np.int64)))
        self.flops = np.concatenate(flops) if flops else np.zeros(0, dtype=np.int64)

    def __len__(self) -> int:
        return int(self._starts[-1])

    @property
    def sig(self) -> tuple:
        """The sectors' (irrep, rows, inner, cols) layouts the tasks are numbered over."""
        return self._sig

    def __getitem__(self, i: int) -> OutputTask:
        if not 0 <= i < len(self):
            raise IndexError(i)
        n = int(np.searchsorted(self._starts, i, side="right")) - 1
        j = i - int(self._starts[n])
        r, c = self._kept[n][j].tolist() if self._kept[n] is not None else divmod(j, len(self._sig[n][3].tuples))
        return self.task(n, r, c)

    def task(self, n: int, r: int, c: int, qs=None) -> OutputTask:
        """The OutputTask of row tuple r and column tuple c of sector n (only the products
        of inner tuples ``qs``, when given)."""
        _, rows, _, cols = self._sig[n]
        perm_a, perm_b, perm_c = self._perms
        okey = tuple((rows.tuples[r] + cols.tuples[c])[p] for p in perm_c)
        return _output_task(self._sig, n, r, c, okey, perm_a, perm_b, qs)

    def pairs(self, n: int) -> tuple:
        """([r], [c]) of sector n's tasks, in task order."""
        if self._kept[n] is not None:
            return self._kept[n][:, 0].tolist(), self._kept[n][:, 1].tolist()
        _, rows, _, cols = self._sig[n]
        return ([r for r in range(len(rows.tuples)) for _ in cols.tuples],
                list(range(len(cols.tuples))) * len(rows.tuples))


def indexed_groups(step, by_a: bool) -> "IndexedGroups":
    """``contraction_tasks(step)`` grouped by the A block (``by_a``) or B block each
    product reads, as an ``IndexedGroups`` (one per layout and side, cached)."""
    return _indexed_groups(*_layout(step), by_a)


@lru_cache(maxsize=256)
def _indexed_groups(sig, perm_a, perm_b, perm_c, aliases, by_a: bool) -> "IndexedGroups":
    return IndexedGroups(_indexed(sig, perm_a, perm_b, perm_c, aliases), by_a)


class IndexedGroups:
    """The products of ``IndexedTasks`` grouped by the block of A (``by_a``) or of B they
    read, in that block's key order (``mpi-onesided inverted``'s groups): group g is
    (key, [(OutputTask, Product)]: the tasks reading it, in task order, each with the
    product that reads it and holding that product alone: the part of the task the group
    runs), its items made when asked. One entry per distinct block (its
    sector, row or column tuple, inner tuple, and the tuples of the tasks that read it),
    O(blocks + tasks), no product listed. ``flops``: every group's, as one array."""

    def __init__(self, tasks: IndexedTasks, by_a: bool):
        self._tasks, self._by_a = tasks, by_a
        perm_a, perm_b, _ = tasks._perms
        keys, entries, flops = [], [], []
        for n, (_, rows, inner, cols) in enumerate(tasks._sig):
            readers: dict = {}      # row (A) or column (B) tuple -> the other tuples of its tasks, in task order
            for r, c in zip(*tasks.pairs(n)):
                if by_a:
                    readers.setdefault(r, []).append(c)
                else:
                    readers.setdefault(c, []).append(r)
            outer, other = (rows, cols) if by_a else (cols, rows)
            for i, js in readers.items():
                width = sum(other.sizes[j] for j in js)
                for q, kk in enumerate(inner.tuples):
                    keys.append(invert_key(outer.tuples[i] + kk, perm_a) if by_a else invert_key(kk + outer.tuples[i], perm_b))
                    entries.append((n, i, q, js))
                    flops.append(2 * outer.sizes[i] * inner.sizes[q] * width)
        order = sorted(range(len(keys)), key=keys.__getitem__)
        self._keys = [keys[g] for g in order]
        self._entries = [entries[g] for g in order]
        self.flops = np.array([flops[g] for g in order], dtype=np.int64)

    def __len__(self) -> int:
        return len(self._keys)

    def __getitem__(self, g: int) -> tuple:
        n, i, q, js = self._entries[g]
        items = []
        for j in js:
            task = self._tasks.task(n, *((i, j) if self._by_a else (j, i)), qs=(q,))
            items.append((task, task.products[0]))
        return self._keys[g], items


def hadamard_pairs(step) -> dict:
    """{output key: [(a key, b key), ...]} of a ``hadamard`` step over all allowed blocks."""
    a, b = step.inputs
    out = step.out
    shared = [ch for ch in a.indices if ch in b.indices]
    pos_a = [a.indices.index(ch) for ch in shared]
    pos_b = [b.indices.index(ch) for ch in shared]
    b_by: dict = {}
    for kb in b.tensor.allowed_keys():
        b_by.setdefault(tuple(kb[p] for p in pos_b), []).append(kb)
    pairs: dict = {}
    for ka in a.tensor.allowed_keys():
        for kb in b_by.get(tuple(ka[p] for p in pos_a), ()):
            tile = dict(zip(a.indices, ka))
            tile.update(zip(b.indices, kb))
            okey = tuple(tile[ch] for ch in out.indices)
            if out.tensor.is_allowed(okey):
                pairs.setdefault(okey, []).append((ka, kb))
    return pairs


def hadamard_outputs(step) -> dict:
    """``hadamard_pairs`` of the output blocks the step writes (canonical ones only)."""
    aliases = step.out.tensor.aliases
    return {k: v for k, v in hadamard_pairs(step).items() if k not in aliases}


def _tile_keys(step, fixed: dict, free: list):
    """Tile tuples of the index letters ``free`` (each over its space's tiles), with the
    tiles of ``fixed`` ({letter: tile}), as {letter: tile} dicts in lexicographic order."""
    space = {ch: r.tensor.spaces[r.indices.index(ch)] for r in (*step.inputs, step.out) for ch in r.indices}
    for tiles in itertools.product(*(range(len(space[ch].tiles)) for ch in free)):
        yield {**fixed, **dict(zip(free, tiles))}


def hadamard_block_pairs(step, okey) -> list:
    """``hadamard_pairs(step)[okey]`` of one output block, made from the block alone (its
    summed letters' tiles enumerated; [] for a block that receives none), in that order:
    O(the block's pairs), not O(blocks)."""
    (a, b), out = step.inputs, step.out
    summed = [ch for ch in dict.fromkeys(a.indices + b.indices) if ch not in out.indices]
    pairs = []
    for tile in _tile_keys(step, dict(zip(out.indices, okey)), summed):
        ka, kb = tuple(tile[ch] for ch in a.indices), tuple(tile[ch] for ch in b.indices)
        if a.tensor.is_allowed(ka) and b.tensor.is_allowed(kb):
            pairs.append((ka, kb))
    return pairs


def hadamard_fed(step, x: int, key) -> list:
    """The output blocks of ``hadamard_outputs(step)`` whose pairs may read block ``key``
    (as the step reads it: an alias too) of input ``x`` (0: A, 1: B): the allowed canonical
    output keys that agree with it on their common letters."""
    ref, out = step.inputs[x], step.out
    fixed = dict(zip(ref.indices, key))
    aliases = out.tensor.aliases
    found = []
    for tile in _tile_keys(step, fixed, [ch for ch in out.indices if ch not in fixed]):
        okey = tuple(tile[ch] for ch in out.indices)
        if out.tensor.is_allowed(okey) and not (aliases and okey in aliases):
            found.append(okey)
    return found


def add_source(step, okey) -> tuple:
    """(A key, divisor key or None) that an ``add`` step reads for output block ``okey``
    (A key None: the block receives nothing)."""
    if step.pairs == "pack":
        return step.out.tensor.spaces[0].tile_pairs[okey[0]] + tuple(okey[1:]), None
    if step.pairs == "unpack":           # two sources for a diagonal tile pair: local targets only
        raise AssertionError("an 'unpack' step is planned for local targets only (plan.symmetric.symmetric_half)")
    if step.pairs == "unpack_half":      # nothing below the diagonal tile pairs
        pairs = step.inputs[0].tensor.spaces[0]
        return (None if okey[0] > okey[1] else (pairs.tile_of[okey[:2]],) + tuple(okey[2:])), None
    akey = invert_key(okey, step.perms["a"])
    dkey = invert_key(okey, step.perms["d"]) if step.divisor is not None else None
    return akey, dkey


def source_block(step, okey, block):
    """What an ``add`` step adds to output block ``okey`` from its source block (before
    scale and divisor): the pair map of a ``pack``/``unpack_half`` step, else a transpose."""
    return pair_block(step, okey, block) if step.pairs else block.transpose(step.perms["a"])


PM_SIGN = {"plus_pack": 1.0, "minus_pack": -1.0, "plus_unpack": 1.0, "minus_unpack": -1.0}


def pair_outputs(step, akey) -> list:
    """Output keys of a ``pack`` / ``unpack_half`` / ``unpack`` step (or one of the +/-
    ladder's, ``tensor.pairs.pm_pack_block``) that source block ``akey`` feeds (an
    ``unpack``: the block of its pair and that block's mirror image by ``perms["sym"]``,
    those of them the output stores)."""
    if step.pairs in ("plus_pack", "minus_pack"):        # (P, s, t) -> (P, {s, t})
        return [(akey[0], step.out.tensor.spaces[1].tile_of[min(akey[1:]), max(akey[1:])])]
    if step.pairs in ("plus_unpack", "minus_unpack"):    # (P, {s, t}) -> (P, s, t), (P, t, s)
        s, t = step.inputs[0].tensor.spaces[1].tile_pairs[akey[1]]
        return [(akey[0], s, t)] + ([(akey[0], t, s)] if s != t else [])
    if step.pairs == "unpack":
        key = step.inputs[0].tensor.spaces[0].tile_pairs[akey[0]] + tuple(akey[1:])
        aliases = step.out.tensor.aliases
        return [k for k in dict.fromkeys((key, tuple(key[n] for n in step.perms["sym"])))
                if not (aliases and k in aliases)]
    if step.pairs == "pack":
        return [] if akey[0] > akey[1] else [(step.out.tensor.spaces[0].tile_of[akey[:2]],) + tuple(akey[2:])]
    return [step.inputs[0].tensor.spaces[0].tile_pairs[akey[0]] + tuple(akey[1:])]


def pair_block(step, okey, block, akey=None):
    """The output block ``okey`` of a ``pack`` / ``unpack_half`` step from its source block
    (an ``unpack``: what source block ``akey`` adds to ``okey``, its half H of
    ``unpack_half``, H transposed by ``perms["sym"]``, or both summed; a +/- ladder step:
    what source block ``akey`` adds to it)."""
    if step.pairs in ("plus_pack", "minus_pack"):
        return pm_pack_block(block, PM_SIGN[step.pairs], akey[1], akey[2])
    if step.pairs in ("plus_unpack", "minus_unpack"):
        base = step.out.tensor.spaces[1]
        s, t = sorted(okey[1:])
        return pm_unpack_block(block, PM_SIGN[step.pairs], base.tiles[s].size, base.tiles[t].size, s == t,
                               okey[1] > okey[2])
    if step.pairs == "unpack":
        base, sym = step.out.tensor.spaces[0], step.perms["sym"]
        s, t = step.inputs[0].tensor.spaces[0].tile_pairs[akey[0]]
        half = unpack_half_block(block, base.tiles[s].size, base.tiles[t].size, s == t)
        key = (s, t) + tuple(akey[1:])
        mirror = tuple(key[n] for n in sym)
        if key == mirror:
            return half + half.transpose(sym)
        return half if okey == key else half.transpose(sym)
    if step.pairs == "pack":
        s, t = step.out.tensor.spaces[0].tile_pairs[okey[0]]
        return pack_block(block, s == t)
    base = step.out.tensor.spaces[0]
    return unpack_half_block(block, base.tiles[okey[0]].size, base.tiles[okey[1]].size, okey[0] == okey[1])
