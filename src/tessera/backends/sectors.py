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

from functools import lru_cache

from tessera.plan.blocktasks import invert_key
from tessera.tensor.block_tensor import allowed_keys


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
