"""Matrix layouts: how the allowed tile tuples of a group of indices become matrix rows.

A contraction C[IJ] += A[IK] B[KJ] over composite indices I (A's external), K
(contracted) and J (B's external) splits by the irrep g of K: in sector g the rows are
the tile tuples of I with irrep irrep(A)^g, the inner dimension the tuples of K with
irrep g, the columns the tuples of J with irrep irrep(B)^g. Each sector is one GEMM,
however many small blocks it gathers (large GEMMs even for high-symmetry molecules).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from tessera.tensor.block_tensor import allowed_keys


@dataclass(frozen=True)
class MatrixLayout:
    """Tile tuples of a group of spaces with a fixed irrep, laid end to end."""

    tuples: tuple          # tile tuples, in order
    offsets: tuple         # first row of each tuple
    sizes: tuple           # rows of each tuple (product of tile sizes)
    shapes: tuple          # block shape of each tuple
    total: int
    index: dict            # tuple -> position in ``tuples``

    __hash__ = object.__hash__      # by identity (layouts are made once, ``matrix_layout``), in C


@lru_cache(maxsize=8192)
def matrix_layout(spaces: tuple, irrep: int) -> MatrixLayout:
    tuples = tuple(allowed_keys(spaces, irrep))
    shapes = tuple(tuple(s.tiles[t].size for s, t in zip(spaces, key)) for key in tuples)
    sizes = tuple(int(np.prod(sh, dtype=np.int64)) for sh in shapes)
    offsets = tuple(int(x) for x in np.concatenate([[0], np.cumsum(sizes)[:-1]])) if sizes else ()
    return MatrixLayout(tuples, offsets, sizes, shapes, int(sum(sizes)),
                        {k: n for n, k in enumerate(tuples)})


@dataclass(frozen=True)
class Sector:
    """One GEMM of a contraction: rows x inner times inner x cols."""

    irrep: int
    rows: MatrixLayout
    inner: MatrixLayout
    cols: MatrixLayout

    @property
    def flops(self) -> int:
        return 2 * self.rows.total * self.inner.total * self.cols.total


def group_irreps(spaces: tuple) -> list:
    """Irreps that a tuple of tiles over ``spaces`` can have."""
    if not spaces:
        return [0]
    out = {0}
    for s in spaces:
        out = {a ^ t.irrep for a in out for t in s.tiles}
    return sorted(out)
