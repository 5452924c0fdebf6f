"""Pair spaces: one index for the unordered pairs p <= q of a space (packed storage).

A tensor that is symmetric under swapping two axes over the same space (with the other
axes permuted alongside, e.g. tau[ijab] = tau[jiba]) needs only its pairs i <= j. The
pair space of ``o`` has one tile per tile pair (s, t) with s <= t: an off-diagonal pair
holds all n_s n_t elements (row-major), a diagonal pair the n(n+1)/2 elements i <= j
(row-major upper triangle); its irrep is irrep(s) ^ irrep(t). Contractions over a pair
index then run on the canonical half only: the ladder of closed-shell CCSD with rows
i <= j costs o(o+1)/2 v^4 GEMM rows instead of o^2 (the packed-pair form of PySCF's
``_add_vvvv``; Scuseria, Janssen, Schaefer, J. Chem. Phys. 89, 7382 (1988)).

``pack_block`` and ``unpack_half_block`` are the block maps of the planner's ``pack``
and ``unpack_half`` steps (``plan.planner``: a contraction whose result is symmetric is
computed on the pairs of one factor, unpacked to half and added with its transpose).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from tessera.tensor.space import IndexSpace, Tile


class PairSpace(IndexSpace):
    """The pairs p <= q of ``base``; ``tile_pairs[n]`` is the (s, t) tile pair of tile n."""

    def __init__(self, base: IndexSpace):
        self.base = base
        self.tile_pairs = tuple((s, t) for s in range(len(base.tiles)) for t in range(s, len(base.tiles)))
        self.tile_of = {st: n for n, st in enumerate(self.tile_pairs)}
        tiles, offset = [], 0
        for s, t in self.tile_pairs:
            ns, nt = base.tiles[s].size, base.tiles[t].size
            size = ns * (ns + 1) // 2 if s == t else ns * nt
            tiles.append(Tile(size, base.tiles[s].irrep ^ base.tiles[t].irrep, offset))
            offset += size
        super().__init__(f"({base.name}{base.name})", tiles)


def pair_space(base: IndexSpace) -> PairSpace:
    """The pair space of ``base``, made once per space object (pair spaces of spaces of
    one tiling compare equal, as the spaces do)."""
    made = base.__dict__.get("_pair_space")
    if made is None:
        made = base.__dict__["_pair_space"] = PairSpace(base)
    return made


def pack_block(block: np.ndarray, diagonal: bool) -> np.ndarray:
    """Block (s, t, ...) of a pair-symmetric tensor -> its pair block (pairs, ...)."""
    n1, n2 = block.shape[:2]
    if diagonal:
        return block[_triu(n1)]
    return block.reshape(n1 * n2, *block.shape[2:])


def unpack_half_block(block: np.ndarray, n1: int, n2: int, diagonal: bool) -> np.ndarray:
    """Pair block (pairs, ...) -> block (s, t, ...), s <= t, holding the pairs p < q and
    half of p = q, zero below: X + X.transpose(sym) is the whole pair-symmetric tensor."""
    if not diagonal:
        return block.reshape(n1, n2, *block.shape[1:])
    out = np.zeros((n1, n1, *block.shape[1:]), dtype=block.dtype)
    out[_triu(n1)] = block
    idx = np.arange(n1)
    out[idx, idx] *= 0.5
    return out


@lru_cache(maxsize=256)
def _triu(n: int) -> tuple:
    """``np.triu_indices(n)``, made once per tile size (a pack or unpack step asks for it
    once per diagonal block, thousands of times per CCSD iteration)."""
    return np.triu_indices(n)
