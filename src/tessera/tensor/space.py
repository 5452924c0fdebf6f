"""Index spaces: ordered lists of tiles, each tile with a size and an irrep label.

Irreps are bit labels of an Abelian point group (D2h and its subgroups); the product of
two irreps is their XOR. Orbitals are grouped by irrep, then split into tiles no larger
than the tile size, so every tile holds orbitals of one irrep.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from tessera.errors import InputError


@dataclass(frozen=True)
class Tile:
    size: int
    irrep: int
    offset: int          # first position of the tile in the space


_STRUCTURES: dict = {}       # (kind, name, tiles) -> itself: one object per space structure


class IndexSpace:
    """An ordered list of tiles; ``orbitals[p]`` is the original index of position ``p``.

    Spaces compare and hash by structure (kind, name and tiles), not by orbitals: the
    block structure of a tensor depends on its spaces' tiles only, so the caches keyed on
    spaces (allowed keys, matrix layouts, the planner's contractions and pairing orders,
    the local executors' index arrays) serve every space of one tiling, e.g. the memory
    estimate's (from the initial guess) and the run's (from the converged orbitals)."""

    def __init__(self, name: str, tiles, orbitals=None):
        self.name = name
        self.tiles = tuple(tiles)
        self.dim = sum(t.size for t in self.tiles)
        self.orbitals = (np.arange(self.dim) if orbitals is None
                         else np.asarray(orbitals, dtype=np.int64))
        if len(self.orbitals) != self.dim:
            raise InputError(f"space {name!r}: {len(self.orbitals)} orbitals for {self.dim} positions")
        self._intern()

    def _intern(self) -> None:
        key = (type(self).__name__, self.name, self.tiles)
        self._structure = _STRUCTURES.setdefault(key, key)   # equal structures: the same object
        self._hash = hash(key)

    def __eq__(self, other):
        if not isinstance(other, IndexSpace):
            return NotImplemented
        return self._structure is other._structure

    def __hash__(self) -> int:
        return self._hash

    def __setstate__(self, state) -> None:     # unpickled (another process): interned here
        self.__dict__.update(state)
        self._intern()

    @classmethod
    def from_irreps(cls, name: str, irreps, tile_size: int, first: int = 0) -> "IndexSpace":
        """Group orbitals ``first, first+1, ...`` with labels ``irreps`` by irrep into tiles."""
        if not isinstance(tile_size, (int, np.integer)) or tile_size <= 0:
            raise InputError(f"tile size must be a positive integer, got {tile_size!r}; use e.g. --tile 32")
        irreps = np.asarray(irreps, dtype=np.int64)
        tiles, order, offset = [], [], 0
        for g in sorted(set(irreps.tolist())):
            members = np.flatnonzero(irreps == g)
            for start in range(0, len(members), tile_size):
                chunk = members[start:start + tile_size]
                tiles.append(Tile(len(chunk), int(g), offset))
                order.extend((chunk + first).tolist())
                offset += len(chunk)
        return cls(name, tiles, order)

    @classmethod
    def uniform(cls, name: str, sizes, irreps=None) -> "IndexSpace":
        """A space from explicit tile sizes and irreps (positions are the orbitals)."""
        irreps = [0] * len(sizes) if irreps is None else list(irreps)
        offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(int)
        return cls(name, [Tile(int(s), int(g), int(o)) for s, g, o in zip(sizes, irreps, offsets)])

    @cached_property
    def tiles_by_irrep(self) -> dict:
        out: dict = {}
        for n, t in enumerate(self.tiles):
            out.setdefault(t.irrep, []).append(n)
        return out

    @cached_property
    def irreps(self) -> np.ndarray:
        """Irrep of every position."""
        return np.concatenate([[t.irrep] * t.size for t in self.tiles]).astype(np.int64) \
            if self.tiles else np.zeros(0, np.int64)

    def slice(self, tile: int) -> slice:
        t = self.tiles[tile]
        return slice(t.offset, t.offset + t.size)

    def __len__(self) -> int:
        return len(self.tiles)

    def __repr__(self) -> str:
        return f"IndexSpace({self.name!r}, dim={self.dim}, tiles={len(self.tiles)})"
