"""Array operations on blocks (NumPy + BLAS): the math of one step, split into tasks.

An executor runs the task lists these functions return; the functions know blocks and
matrices, never physics, ranks or threads. Tasks of one list write disjoint output
blocks, so they may run in any order or concurrently.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from tessera.errors import SymmetryError
from tessera.plan.blocktasks import invert_key, pair_block, pair_outputs

# rows of one GEMM task: enough work per task for BLAS, enough tasks for the pool
_TASK_FLOPS = 2e7
# elements of blocks one gather task copies
_GATHER_ELEMENTS = 1 << 19


def _sector_of(key, positions, spaces) -> int:
    g = 0
    for p in positions:
        g ^= spaces[p].tiles[key[p]].irrep
    return g


def gather_tasks(ref, perm, n_left, layouts: dict, sector_axes, into: dict) -> list:
    """Tasks that copy ``ref``'s blocks, transposed by ``perm``, into one matrix per sector.

    ``layouts[g] = (row_layout, col_layout)``; the first ``n_left`` permuted axes are rows;
    a block's sector is the irrep of its ``sector_axes`` (the contracted ones). Results
    land in ``into[g]``: a sector that is one block whose transpose reshapes without a
    copy is that view; else a matrix filled by tasks of about ``_GATHER_ELEMENTS``
    elements each, so that the pool copies in parallel.
    """
    t = ref.tensor
    left, right = perm[:n_left], perm[n_left:]
    by_sector: dict = {}
    for key in t.blocks:
        by_sector.setdefault(_sector_of(key, sector_axes, t.spaces), []).append(key)
    tasks = []
    for g, (rows, cols) in layouts.items():
        keys = by_sector.get(g, [])
        if len(keys) == 1 and t.blocks[keys[0]].size == rows.total * cols.total:
            blk = t.blocks[keys[0]]
            view = blk.transpose(perm).reshape(rows.total, cols.total)
            if np.may_share_memory(view, blk):
                into[g] = view
                continue
        into[g] = mat = np.zeros((rows.total, cols.total))
        chunk, size = [], 0
        for key in keys:
            chunk.append(key)
            size += t.blocks[key].size
            if size >= _GATHER_ELEMENTS:
                tasks.append(partial(_gather_one, t, chunk, left, right, perm, rows, cols, mat))
                chunk, size = [], 0
        if chunk:
            tasks.append(partial(_gather_one, t, chunk, left, right, perm, rows, cols, mat))
    return tasks


def _gather_one(t, keys, left, right, perm, rows, cols, mat) -> None:
    """Copy blocks ``keys`` into their places in ``mat`` (one copy each: the place,
    reshaped to the transposed block's shape, is a view: splitting axes never copies)."""
    for key in keys:
        r = rows.index[tuple(key[p] for p in left)]
        c = cols.index[tuple(key[p] for p in right)]
        r0, c0 = rows.offsets[r], cols.offsets[c]
        blk = t.blocks[key].transpose(perm)
        mat[r0:r0 + rows.sizes[r], c0:c0 + cols.sizes[c]].reshape(blk.shape)[...] = blk


def gemm_scatter_tasks(step, amats: dict, bmats: dict) -> list:
    """Tasks computing C_g = A_g @ B_g by row ranges and adding the blocks into the output."""
    tasks = []
    for sec in step.sectors:
        per_row = 2.0 * sec.inner.total * sec.cols.total
        n = len(sec.rows.tuples)
        rows_per_task = max(1, int(_TASK_FLOPS / max(per_row * max(1, sec.rows.total / n), 1.0)))
        for start in range(0, n, rows_per_task):
            tasks.append(partial(_gemm_scatter_one, step, sec, amats[sec.irrep], bmats[sec.irrep],
                                 start, min(n, start + rows_per_task)))
    return tasks


def _gemm_scatter_one(step, sec, amat, bmat, first, last) -> None:
    rows, cols = sec.rows, sec.cols
    r0 = rows.offsets[first]
    r1 = rows.offsets[last - 1] + rows.sizes[last - 1]
    cmat = amat[r0:r1] @ bmat
    out = step.out.tensor
    cperm = step.perms["c"]
    identity = cperm == tuple(range(len(cperm)))
    aliases = out.aliases        # a canonical output receives its canonical blocks only
    for r in range(first, last):
        rk, ro, rs, rsh = rows.tuples[r], rows.offsets[r] - r0, rows.sizes[r], rows.shapes[r]
        for c, ck in enumerate(cols.tuples):
            key = rk + ck if identity else tuple((rk + ck)[p] for p in cperm)
            if aliases and key in aliases:
                continue
            co = cols.offsets[c]
            blk = cmat[ro:ro + rs, co:co + cols.sizes[c]].reshape(rsh + cols.shapes[c])
            out.accumulate_block(key, blk if identity else blk.transpose(cperm), step.scale)


def add_tasks(step) -> list:
    """C[out] += scale * A[perm] (/ D[perm]) block by block."""
    a = step.inputs[0]
    perm = step.perms["a"]
    keys = list(a.tensor.blocks)
    chunks = [keys[i::4] for i in range(min(4, len(keys)))]
    return [partial(_add_one, step, chunk, perm) for chunk in chunks]


def _add_one(step, keys, perm) -> None:
    a, out, div = step.inputs[0].tensor, step.out.tensor, step.divisor
    for key in keys:
        if step.pairs:
            for okey in pair_outputs(step, key):
                out.accumulate_block(okey, pair_block(step, okey, a.blocks[key]), step.scale)
            continue
        okey = tuple(key[p] for p in perm)
        if okey in out.aliases:           # a canonical output receives its canonical blocks only
            continue
        blk = a.blocks[key].transpose(perm)
        if div is not None:
            dblk = div.tensor.blocks.get(invert_key(okey, step.perms["d"]))
            if dblk is None:
                raise SymmetryError(f"denominator {div.tensor.name!r} has no block for {okey}")
            blk = blk / dblk.transpose(step.perms["d"])
        out.accumulate_block(okey, blk, step.scale)


def hadamard_tasks(step) -> list:
    """Products with indices shared by both factors and the output, block pair by block pair."""
    return [partial(_hadamard_all, step)]


def _hadamard_all(step) -> None:
    a, b = step.inputs
    out = step.out
    expr = step.perms["einsum"]
    shared = [ch for ch in a.indices if ch in b.indices]
    pos_a = [a.indices.index(ch) for ch in shared]
    pos_b = [b.indices.index(ch) for ch in shared]
    b_by: dict = {}
    for kb in b.tensor.blocks:
        b_by.setdefault(tuple(kb[p] for p in pos_b), []).append(kb)
    for ka, ba in a.tensor.blocks.items():
        for kb in b_by.get(tuple(ka[p] for p in pos_a), ()):
            tile = dict(zip(a.indices, ka))
            tile.update(zip(b.indices, kb))
            okey = tuple(tile[ch] for ch in out.indices)
            if okey in out.tensor.aliases:
                continue
            out.tensor.accumulate_block(okey, np.einsum(expr, ba, b.tensor.blocks[kb]), step.scale)
