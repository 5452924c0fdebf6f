"""Array operations on blocks (NumPy + BLAS): the math of one step, split into tasks.

An executor runs the task lists these functions return; the functions know blocks and
matrices, never physics, ranks or threads. Tasks of one list write disjoint output
blocks, so they may run in any order or concurrently. Which block goes where is worked
out once per block structure (``sectors``); a task only looks blocks up and copies or
adds them.
"""

from __future__ import annotations

from bisect import bisect_right
from functools import partial

import numpy as np

from tessera.backends.sectors import add_map, gather_index, gather_map, scatter_map
from tessera.errors import SymmetryError
from tessera.plan.blocktasks import pair_block, pair_outputs

# a sector's GEMM is split by rows into at most one task per worker, each of at least this many flops
_TASK_FLOPS = 2e7
# a sector's whole-row-tuple ranges whose largest holds more than this times its share of
# rows are split by equal rows instead (``gemm_scatter_tasks``)
_UNEVEN = 1.1
# elements of blocks one gather task copies
_GATHER_ELEMENTS = 1 << 19
# elements one task of a flat-path step (``sectors.small_blocks``) takes or adds, at least
_FLAT_ELEMENTS = 1 << 16


def gather_tasks(ref, perm, layouts: dict, into: dict, workers: int = 1) -> list:
    """Tasks that copy ``ref``'s blocks, transposed by ``perm``, into one matrix per sector.

    ``layouts[g] = (row_layout, col_layout)``: the leading permuted axes are rows, the
    others columns. Results land in ``into[g]``: a sector that is one block whose
    transpose reshapes without a copy is that view; else a matrix filled by tasks, a
    multiple of ``workers`` of them with equal elements (about ``_GATHER_ELEMENTS``
    each), so that the pool copies in parallel and no worker waits on a larger share
    (three tasks of whole blocks on two workers left one idle a third of the time).
    """
    blocks = ref.tensor.blocks
    copies = []         # (matrix, entry, block) of every block to copy
    for g, (rows, cols) in layouts.items():
        entries = gather_map(rows, cols, perm)
        shape = (rows.total, cols.total)
        found = [(e, blocks[e[0]]) for e in entries if e[0] in blocks]
        if len(found) == 1 and found[0][1].size == shape[0] * shape[1]:
            blk = found[0][1]
            view = blk.transpose(perm).reshape(shape)
            if np.may_share_memory(view, blk):
                into[g] = view
                continue
        into[g] = mat = np.empty(shape) if len(found) == len(entries) else np.zeros(shape)
        copies += [((mat, e, blk), e[3][0], blk.size) for e, blk in found]
    return [partial(_gather_one, perm, part) for part in _even_parts(copies, workers)]


def blocks_into_gathered(t, perm, sectors: tuple, mats: dict) -> None:
    """Make each block ``t`` holds a view of its place in the gathered matrices ``mats``
    (``gather_tasks`` of ``t`` by ``perm``, one matrix per ``(g, rows, cols)`` of
    ``sectors``), so that the blocks' own arrays are freed: a constant contracted in one
    layout only is then stored once, as its matrices. Blocks held as triangles
    (``tensor.pairs.TriangleBlocks``, the ladder's V+-) keep their diagonal triangles."""
    back = tuple(np.argsort(perm))
    blocks = t.blocks
    keep = getattr(blocks, "keep_view", blocks.__setitem__)
    for g, rows, cols in sectors:
        for key, rsl, csl, bshape in gather_map(rows, cols, perm):
            if key in blocks:
                keep(key, mats[g][rsl, csl].reshape(bshape).transpose(back))


class BlockMatrix:
    """A sector's left GEMM operand read from its tensor's blocks, never gathered into a
    matrix of its own: each block, transposed by the gather's permutation and reshaped
    to (rows, inner), is a view where the summed axes are a leading or trailing run of
    the stored block (BLAS reads it with a transpose flag), else a ``CopiedBlock``
    copied when a product reads it (a transient of one block), so nothing is kept beside
    the blocks. ``entries``: (first row, end row, first inner, end inner, view) of its
    blocks; ``self[r0:r1]`` its rows r0:r1; ``self @ B`` the product, a GEMM per block
    summed over the inner tuples."""

    nbytes = 0          # views, or block copies made as a product reads them: nothing kept

    def __init__(self, shape: tuple, entries: list):
        self.shape, self.entries = shape, entries

    def __getitem__(self, rows: slice) -> "BlockMatrix":
        r0, r1, _ = rows.indices(self.shape[0])
        return BlockMatrix((r1 - r0, self.shape[1]), [
            (max(a, r0) - r0, min(b, r1) - r0, i0, i1, v[max(a, r0) - a:min(b, r1) - a])
            for a, b, i0, i1, v in self.entries if a < r1 and b > r0])

    def __matmul__(self, bmat: np.ndarray) -> np.ndarray:
        return self.matmul_into(bmat, np.empty((self.shape[0], bmat.shape[1])))

    def matmul_into(self, bmat: np.ndarray, out: np.ndarray) -> np.ndarray:
        """out = self @ bmat: the first block of a row range writes its rows, the others add
        (``add_product``)."""
        written = np.zeros(self.shape[0], bool)
        for a, b, i0, i1, view in self.entries:
            amat = view.matrix() if isinstance(view, CopiedBlock) else view
            if written[a]:
                add_product(out[a:b], amat, bmat[i0:i1])
            else:
                np.matmul(amat, bmat[i0:i1], out=out[a:b])
                written[a:b] = True
        out[~written] = 0.0
        return out


def _blas_ready(m: np.ndarray) -> bool:
    """Whether SciPy's BLAS wrappers take ``m`` without a copy (C or Fortran order)."""
    return m.flags.c_contiguous or m.flags.f_contiguous


def add_product(out: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
    """out += a @ b in one BLAS call (dgemm with beta = 1 on out's transpose, which is in
    Fortran order when ``out`` is in C order; a and b in either order are passed with a
    transpose flag, not copied): no product array and no pass adding it. The blocks of an
    operand read from its blocks are summed so (ovvv's on glycine cc-pVDZ: k = 25 per
    block, three blocks per row range): its five ovvv products with t1 and u, 122 -> 116
    ms of CPU per iteration on serial against numpy's temporary and ``+=`` (alternate
    iterations of one run, under load). ``out`` in another order, or a strided operand
    (a row range of a block in Fortran order, which SciPy's wrapper would copy): numpy's
    ``+=``, whose matmul reads it in place."""
    if not (out.flags.c_contiguous and _blas_ready(a) and _blas_ready(b)):
        out += a @ b
        return
    # imported at first use: ``import tessera`` loads no SciPy, so that a program can defer
    # what SciPy imports and a run never uses (``cli.deferred``)
    from scipy.linalg.blas import dgemm
    x, trans_x = (b.T, 0) if b.flags.c_contiguous else (b, 1)
    y, trans_y = (a.T, 0) if a.flags.c_contiguous else (a, 1)
    dgemm(1.0, x, y, beta=1.0, c=out.T, trans_a=trans_x, trans_b=trans_y, overwrite_c=1)


class CopiedBlock:
    """Rows ``lo:hi`` of a block's (rows, inner) matrix where its transpose does not
    reshape without a copy: ``matrix()`` copies the block when a product reads it."""

    __slots__ = ("block", "perm", "shape", "lo", "hi")

    def __init__(self, block: np.ndarray, perm: tuple, shape: tuple, lo: int = 0, hi: int | None = None):
        self.block, self.perm, self.shape = block, perm, shape
        self.lo, self.hi = lo, shape[0] if hi is None else hi

    def __getitem__(self, rows: slice) -> "CopiedBlock":
        r0, r1, _ = rows.indices(self.hi - self.lo)
        return CopiedBlock(self.block, self.perm, self.shape, self.lo + r0, self.lo + r1)

    def matrix(self) -> np.ndarray:
        """Its rows, copying only the slab of the block's first (transposed) axis that holds
        them, not the whole block for every row range a task reads."""
        t = self.block.transpose(self.perm)
        rows = self.shape[0]
        if not t.shape[0] or rows < t.shape[0] or rows % t.shape[0]:     # axis 0 not a row axis
            return t.reshape(self.shape)[self.lo:self.hi]
        m = rows // t.shape[0]              # rows per index of axis 0
        a, b = self.lo // m, -(-self.hi // m)
        return t[a:b].reshape(-1, self.shape[1])[self.lo - a * m:self.hi - a * m]


def block_matrices(ref, perm, layouts: dict) -> dict:
    """``{g: BlockMatrix}`` of ``ref``'s sector matrices (``gather_tasks``' layouts): each
    stored block a view where its transpose reshapes to its place without a copy, else
    a ``CopiedBlock``."""
    blocks = ref.tensor.blocks
    out = {}
    for g, (rows, cols) in layouts.items():
        entries = []
        for key, rsl, csl, _ in gather_map(rows, cols, perm):
            blk = blocks.get(key)
            if blk is None:
                continue
            shape = (rsl.stop - rsl.start, csl.stop - csl.start)
            view = blk.transpose(perm).reshape(shape)
            if not np.may_share_memory(view, blk):
                view = CopiedBlock(blk, perm, shape)
            entries.append((rsl.start, rsl.stop, csl.start, csl.stop, view))
        out[g] = BlockMatrix((rows.total, cols.total), entries)
    return out


def _even_parts(items: list, workers: int) -> list:
    """``items`` ((thing, rows, elements) each) cut into ``workers`` x k lists of equal
    elements, about ``_GATHER_ELEMENTS`` each (one list below ``_FLAT_ELEMENTS``), to whole rows of a thing's first axis:
    (thing, first row, end row) each (a part: the rows that start in its range)."""
    total = sum(size for _, _, size in items)
    # one part (run inline, no pool dispatch) below _FLAT_ELEMENTS
    n = 1 if total < _FLAT_ELEMENTS else workers * max(1, round(total / (workers * _GATHER_ELEMENTS)))
    bounds = [total * k // n for k in range(n + 1)]
    parts: list = [[] for _ in range(n)]
    offset = 0
    for thing, nrow, size in items:
        row = size // nrow if nrow else 0
        r = 0
        while row and r < nrow:
            k = bisect_right(bounds, offset + r * row) - 1
            stop = min(nrow, -(-(bounds[k + 1] - offset) // row))
            parts[k].append((thing, r, stop))
            r = stop
        offset += size
    return [part for part in parts if part]


def _gather_one(perm, pieces) -> None:
    """Copy rows of blocks into their places in their matrices (one copy each: splitting
    the axes of a 2-d slice is always a view)."""
    for (mat, (_, rsl, csl, bshape), blk), r0, r1 in pieces:
        mat[rsl, csl].reshape(bshape)[r0:r1] = blk.transpose(perm)[r0:r1]


def gather_flat_tasks(ref, perm, layouts: dict, into: dict, workers: int = 1) -> list:
    """``gather_tasks`` for a tensor of small blocks: one ``take`` from ``flat()``."""
    t = ref.tensor
    index, parts = gather_index(t, perm, layouts)
    vector, out = t.flat(), np.empty(index.size)
    for g, start, shape in parts:
        into[g] = out[start:start + shape[0] * shape[1]].reshape(shape)
    return [partial(_take, vector, index, out, s, e) for s, e in _chunks(index.size, workers)]


def _take(vector, index, out, start, stop) -> None:
    np.take(vector, index[start:stop], out=out[start:stop], mode="clip")


def gemm_into_tasks(step, amats: dict, bmats: dict, products: np.ndarray, workers: int = 1) -> list:
    """Tasks computing every sector's scale * A_g @ B_g into ``products`` (rows x cols each, end
    to end in sector order; split by rows as ``gemm_scatter_tasks``), for ``flat_add_tasks``;
    largest first, so that the pool, taking them in order, does not end on a large one
    while the other workers wait (the tasks of a benzene D2h step differ up to 20-fold)."""
    tasks, start = [], 0
    for sec in step.sectors:
        cmat = products[start:start + sec.rows.total * sec.cols.total].reshape(sec.rows.total, sec.cols.total)
        start += cmat.size
        tasks += _gemm_tasks(sec, amats, bmats, cmat, workers, step.scale)
    if workers > 1:
        tasks.sort(key=lambda t: -t.args[0].shape[0] * t.args[0].shape[1] * t.args[1].shape[1])
    return tasks


def _gemm_tasks(sec, amats: dict, bmats: dict, cmat: np.ndarray, workers: int, scale: float = 1.0) -> list:
    """Tasks computing ``cmat = scale * A_g @ B_g`` by equal row ranges, one per worker at
    most, each of at least ``_TASK_FLOPS``."""
    parts = _parts(sec, workers)
    bounds = [sec.rows.total * k // parts for k in range(parts + 1)]
    return [partial(_gemm_one, amats[sec.irrep][r0:r1], bmats[sec.irrep], cmat[r0:r1], scale)
            for r0, r1 in zip(bounds[:-1], bounds[1:])]


def _gemm_one(amat, bmat, cmat, scale: float) -> None:
    amat, bmat, scale = _scaled(amat, bmat, scale)
    if isinstance(amat, BlockMatrix):
        amat.matmul_into(bmat, cmat)
    else:
        np.matmul(amat, bmat, out=cmat)
    if scale != 1.0:
        cmat *= scale


def _scaled(amat, bmat, scale: float) -> tuple:
    """(A', B', s') with s' A' @ B' = scale A @ B: the scale put on the smallest of A, B
    and their product (s' = 1 unless it is the product), so that a product with t1 or a
    one-body operand (CCSD's -Wt1_ovoo[iajk] t1[kb]: 1500 elements of B against 2.25 M of
    product on glycine) takes no scaling pass over its product. CCSD's scales (+-1,
    +-1/2, +-2) are exact in binary: the result is bitwise the scaled product's."""
    if scale == 1.0:
        return amat, bmat, scale
    (m, k), n = amat.shape, bmat.shape[1]
    a = m * k if not isinstance(amat, BlockMatrix) else m * n + 1     # read from its blocks: never scaled
    if k * n < min(a, m * n):
        return amat, bmat * scale, 1.0
    if a < m * n:
        return amat * scale, bmat, 1.0
    return amat, bmat, scale


def _parts(sec, workers: int) -> int:
    """Tasks a sector's GEMM is split into: at most one per worker, each of at least
    ``_TASK_FLOPS`` (few large GEMMs, each task reads all of B, that still fill the pool)
    or of ``_GATHER_ELEMENTS`` product elements to add into the output (an outer product
    t1 x t1 is few flops but o^2 v^2 elements to write) or elements of A to read (ovvv
    times t1 into fvv: few flops, o v^3 elements read)."""
    work = max(sec.flops // _TASK_FLOPS, sec.rows.total * max(sec.cols.total, sec.inner.total) // _GATHER_ELEMENTS)
    return max(1, min(workers, sec.rows.total, int(work)))


def flat_add_tasks(out, src, index, scale: float, workers: int = 1, divisor=None, dindex=None) -> list:
    """out.flat() += scale * src[index] (/ divisor[dindex]); an index of None reads in order.
    An output that stores nothing yet is set instead: no zeros, no pass to add them."""
    fresh = out.holds_nothing()
    vector = out.fresh_flat() if fresh else out.flat()
    return [partial(_flat_add, out, vector, src, index, scale, divisor, dindex, s, e, fresh)
            for s, e in _chunks(vector.size, workers)]


def _flat_add(out, vector, src, index, scale, divisor, dindex, start, stop, fresh) -> None:
    if fresh:                   # vector[start:stop] = scale * src[index] (/ divisor[dindex])
        part = vector[start:stop]
        if index is None:
            np.copyto(part, src[start:stop])
        else:
            np.take(src, index[start:stop], out=part, mode="clip")
        if divisor is not None:
            np.divide(part, divisor[start:stop] if dindex is None else
                      np.take(divisor, dindex[start:stop], mode="clip"), out=part)
        if scale != 1.0:
            part *= scale
        out.version += 1
        return
    part = src[start:stop] if index is None else np.take(src, index[start:stop], mode="clip")
    owned = index is not None           # part is a new array (may be overwritten)
    if divisor is not None:
        by = divisor[start:stop] if dindex is None else np.take(divisor, dindex[start:stop], mode="clip")
        part = np.divide(part, by, out=part if owned else None)
        owned = True
    if scale == -1.0:           # a subtraction: no pass to scale
        vector[start:stop] -= part
    else:
        if scale != 1.0:
            part = np.multiply(part, scale, out=part if owned else None)
        vector[start:stop] += part
    out.version += 1


def _chunks(n: int, workers: int) -> list:
    """(start, stop) of at most ``workers`` ranges of at least ``_FLAT_ELEMENTS`` covering n."""
    parts = max(1, min(workers, n // _FLAT_ELEMENTS))
    bounds = [n * k // parts for k in range(parts + 1)]
    return list(zip(bounds[:-1], bounds[1:]))


def _row_ranges(sec, workers: int) -> list:
    """(first row tuple, end row tuple, first row, end row) of whole row tuples, ``_parts``
    ranges at most: the rows a task that scatters its own product owns."""
    rows = sec.rows
    n = len(rows.tuples)
    per_task = -(-n // min(n, _parts(sec, workers)))
    out = []
    for start in range(0, n, per_task):
        stop = min(n, start + per_task)
        out.append((start, stop, rows.offsets[start], rows.offsets[stop - 1] + rows.sizes[stop - 1]))
    return out


def gemm_scatter_tasks(step, amats: dict, bmats: dict, workers: int = 1) -> tuple:
    """Two task lists, to run one after the other, computing C_g = A_g @ B_g and adding
    its blocks into the output. A sector whose whole row tuples split into ``_parts``
    ranges of about equal rows is done in the first, a task per range (its GEMM, then
    its blocks added); any other (a few large row tuples: 1000 + 500 rows would keep one
    worker busy twice as long as the other) computes its product into a matrix by equal
    row ranges in the first and adds its blocks, dealt among the workers, in the second."""
    cperm = step.perms["c"]
    aliases = step.out.tensor.aliases or None     # a canonical output receives its canonical blocks only
    transpose = None if cperm == tuple(range(len(cperm))) else cperm
    first, then = [], []
    for sec in step.sectors:
        if sec.inner.total == 1:        # an outer product (t1 x t1): each block made where it is added
            entries = scatter_map(sec.rows, sec.cols, cperm, aliases, 0, len(sec.rows.tuples))
            amat = amats[sec.irrep]
            if isinstance(amat, BlockMatrix):       # its one column
                amat = amat @ np.ones((1, 1))
            amat, bmat = amat[:, 0] * step.scale, bmats[sec.irrep][0]
            first += [partial(_outer_one, step.out.tensor, transpose, amat, bmat, entries[i::workers])
                      for i in range(min(workers, len(entries)))]
            continue
        ranges = _row_ranges(sec, workers)
        even = len(ranges) == _parts(sec, workers) and \
            max(r1 - r0 for _, _, r0, r1 in ranges) * len(ranges) <= _UNEVEN * sec.rows.total
        if not even:
            cmat = np.empty((sec.rows.total, sec.cols.total))
            first += _gemm_tasks(sec, amats, bmats, cmat, workers, step.scale)
            entries = scatter_map(sec.rows, sec.cols, cperm, aliases, 0, len(sec.rows.tuples))
            then += _scatter_parts(step.out.tensor, transpose, cmat, entries, workers)
            continue
        for start, stop, r0, r1 in ranges:
            first.append(partial(_gemm_scatter_one, step.out.tensor, step.scale, transpose,
                                 amats[sec.irrep][r0:r1], bmats[sec.irrep],
                                 scatter_map(sec.rows, sec.cols, cperm, aliases, start, stop)))
    return first, then


def _scatter_parts(out, transpose, cmat, entries, workers: int) -> list:
    """Tasks adding a computed product's blocks (``scatter_map`` entries) into a local,
    non-canonical output in ``_even_parts`` (ranges of each block's first product axis),
    so that nine equal blocks no longer go five to one worker and four to the other; an
    output block not yet there is made here, whole parts then set, not added. Any other
    output (canonical, with alias blocks): whole blocks dealt among the workers. Local
    contexts only (``Context._run_step``)."""
    if out.aliases:
        return [partial(_scatter_one, out, 1.0, transpose, cmat, entries[i::workers])
                for i in range(min(workers, len(entries)))]
    fresh = set()
    for key, _, _, shape in entries:
        if key not in out.blocks:
            out.store_block(key, np.empty(shape if transpose is None else tuple(shape[p] for p in transpose)))
            fresh.add(key)
    axis = 0 if transpose is None else transpose.index(0)
    items = [((e, e[0] in fresh), e[3][0], (e[1].stop - e[1].start) * (e[2].stop - e[2].start)) for e in entries]
    return [partial(_scatter_rows, out, transpose, axis, cmat, part) for part in _even_parts(items, workers)]


def _scatter_rows(out, transpose, axis: int, cmat, pieces) -> None:
    """Rows ``r0:r1`` of the first product axis of ``scatter_map`` entries added into (set,
    for a block made for this product) the output blocks, where they are axis ``axis``."""
    for ((key, rsl, csl, shape), fresh), r0, r1 in pieces:
        step = (rsl.stop - rsl.start) // shape[0]
        src = cmat[rsl.start + r0 * step:rsl.start + r1 * step, csl].reshape((r1 - r0,) + shape[1:])
        if transpose is not None:
            src = src.transpose(transpose)
        part = out.blocks[key][(slice(None),) * axis + (slice(r0, r1),)]
        if fresh:
            part[...] = src
        else:
            part += src
    out.version += 1


def _gemm_scatter_one(out, scale, transpose, amat, bmat, entries) -> None:
    amat, bmat, scale = _scaled(amat, bmat, scale)
    _scatter_one(out, scale, transpose, amat @ bmat, entries)


def _outer_one(out, transpose, avec, bvec, entries) -> None:
    """Blocks of the outer product of vectors ``avec`` (rows) and ``bvec`` (columns) added
    into the output, each made from its two slices: no product matrix, no GEMM of
    inner dimension 1, no second pass to read the product back."""
    for key, rsl, csl, shape in entries:
        _add_block(out, key, np.multiply.outer(avec[rsl], bvec[csl]).reshape(shape), transpose)
    out.version += 1


def _scatter_one(out, scale, transpose, cmat, entries) -> None:
    """Add blocks of a product (``scatter_map`` entries) into the output."""
    if scale != 1.0:
        cmat *= scale
    for key, rsl, csl, shape in entries:
        _add_block(out, key, cmat[rsl, csl].reshape(shape), transpose)
    out.version += 1


def _add_block(out, key, src, transpose) -> None:
    """out[key] += src (its axes in ``transpose`` order, when given)."""
    if transpose is not None:
        src = src.transpose(transpose)
    blk = out.blocks.get(key)
    if blk is None:
        out.accumulate_block(key, src)
    else:
        blk += src


def add_tasks(step, workers: int = 1) -> list:
    """C[out] += scale * A[perm] (/ D[perm]) block by block, one task per worker."""
    a = step.inputs[0].tensor
    if step.pairs:      # grouped by output block: the sources of one output go to one worker
        by_out: dict = {}
        for key in a.blocks:
            for okey in pair_outputs(step, key):
                by_out.setdefault(okey, []).append((key, okey))
        groups = list(by_out.values())
        return [partial(_pairs_one, step, [e for g in groups[i::workers] for e in g])
                for i in range(min(workers, len(groups)))]
    dperm = step.perms["d"] if step.divisor is not None else None
    entries = add_map(a.spaces, a.irrep, step.perms["a"], dperm, step.out.tensor.aliases or None)
    return [partial(_add_one, step, entries[i::workers]) for i in range(min(workers, len(entries)))]


def _pairs_one(step, entries) -> None:
    """A ``pack`` / ``unpack_half`` / ``unpack`` (or +/- ladder) step (``plan.blocktasks.pair_block``):
    (source key, output key) entries."""
    a, out = step.inputs[0].tensor, step.out.tensor
    for key, okey in entries:
        out.accumulate_block(okey, pair_block(step, okey, a.blocks[key], key), step.scale)


def _add_one(step, entries) -> None:
    a, out, div, scale = step.inputs[0].tensor, step.out.tensor, step.divisor, step.scale
    perm = step.perms["a"]
    dget, dperm = (div.tensor.blocks.get, step.perms["d"]) if div is not None else (None, None)
    aget, oget = a.blocks.get, out.blocks.get
    for key, okey, dkey in entries:
        src = aget(key)
        if src is None:
            continue
        blk = src.transpose(perm)
        if dget is not None:
            dblk = dget(dkey)
            if dblk is None:
                raise SymmetryError(f"denominator {div.tensor.name!r} has no block for {okey}")
            blk = blk / dblk.transpose(dperm)
            if scale != 1.0:
                blk *= scale
        elif scale != 1.0:
            blk = scale * blk
        oblk = oget(okey)
        if oblk is not None:
            oblk += blk
        elif blk.base is None and out.dist is None:     # a new array (quotient or scaled): kept
            out.store_block(okey, blk)
        else:
            out.accumulate_block(okey, blk)
    out.version += 1


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
