"""BlockTensor: a tensor over a tuple of index spaces that stores only allowed blocks.

A block is keyed by a tuple of tile indices, one per space. A block is allowed when the
XOR of its tiles' irreps equals the tensor's irrep (point-group symmetry); only allowed,
non-zero blocks are stored, a missing allowed block is zero. Permutational symmetry
(e.g. T2[ijab] = T2[jiba]) is carried as metadata: a list of (axis permutation, sign)
under which the tensor is invariant; all allowed blocks are stored in this version.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from tessera.errors import ShapeError, SymmetryError
from tessera.tensor.space import IndexSpace


_uids = itertools.count()


@dataclass(frozen=True)
class PermutationalSymmetry:
    """The tensor equals ``sign * tensor.transpose(perm)``."""

    perm: tuple
    sign: int = 1


def allowed_keys(spaces: tuple, irrep: int) -> list:
    """All tile tuples over ``spaces`` whose irreps multiply (XOR) to ``irrep``."""
    return list(_allowed_keys(tuple(spaces), int(irrep)))


@lru_cache(maxsize=4096)
def _allowed_keys(spaces: tuple, irrep: int) -> tuple:
    if not spaces:
        return ((),) if irrep == 0 else ()
    *head, last = spaces
    by_irrep = last.tiles_by_irrep
    keys = []
    for prefix in itertools.product(*(range(len(s.tiles)) for s in head)):
        g = irrep
        for s, t in zip(head, prefix):
            g ^= s.tiles[t].irrep
        for t in by_irrep.get(g, ()):
            keys.append(prefix + (t,))
    return tuple(keys)


class BlockTensor:
    """Dense blocks keyed by tile tuples; see the module docstring."""

    def __init__(self, spaces, irrep: int = 0, *, name: str = "", symmetry=()):
        self.spaces = tuple(spaces)
        for s in self.spaces:
            if not isinstance(s, IndexSpace):
                raise ShapeError(f"tensor {name!r}: spaces must be IndexSpace objects, got {type(s).__name__}")
        self.irrep = int(irrep)
        self.name = name
        self.symmetry = tuple(symmetry)
        for ps in self.symmetry:
            if sorted(ps.perm) != list(range(self.ndim)):
                raise ShapeError(f"tensor {name!r}: {ps.perm} is not a permutation of {self.ndim} axes")
        self.blocks: dict = {}
        self.uid = next(_uids)
        self.version = 0      # bumped on every change; caches of derived data key on it
        self.constant = False  # set by freeze(): executors may cache data derived from it

    def freeze(self) -> "BlockTensor":
        """Mark the tensor as constant (integrals): gathered matrices may be cached."""
        self.constant = True
        return self

    # ----------------------------------------------------------------- structure
    @property
    def ndim(self) -> int:
        return len(self.spaces)

    @property
    def shape(self) -> tuple:
        return tuple(s.dim for s in self.spaces)

    def allowed_keys(self) -> list:
        return allowed_keys(self.spaces, self.irrep)

    def is_allowed(self, key) -> bool:
        if len(key) != self.ndim:
            return False
        g = 0
        for s, t in zip(self.spaces, key):
            if not 0 <= t < len(s.tiles):
                return False
            g ^= s.tiles[t].irrep
        return g == self.irrep

    def block_shape(self, key) -> tuple:
        return tuple(s.tiles[t].size for s, t in zip(self.spaces, key))

    def like(self, name: str = "") -> "BlockTensor":
        """An empty (zero) tensor with the same spaces, irrep and symmetry."""
        return BlockTensor(self.spaces, self.irrep, name=name or self.name, symmetry=self.symmetry)

    # ----------------------------------------------------------------- blocks
    def get_block(self, key):
        """The stored block, or None when the block is zero (not stored)."""
        return self.blocks.get(key)

    def set_block(self, key, array) -> None:
        key = tuple(key)
        if not self.is_allowed(key):
            raise SymmetryError(f"tensor {self.name!r}: block {key} is not allowed by its irrep {self.irrep}")
        array = np.asarray(array, dtype=np.float64)
        if array.shape != self.block_shape(key):
            raise ShapeError(f"tensor {self.name!r}: block {key} has shape {array.shape}, "
                             f"expected {self.block_shape(key)}")
        self.blocks[key] = array
        self.version += 1

    def accumulate_block(self, key, array, scale: float = 1.0) -> None:
        """blocks[key] += scale * array, creating the block when missing (no checks: hot path)."""
        blk = self.blocks.get(key)
        if blk is None:
            self.blocks[key] = array * scale if scale != 1.0 else np.array(array, copy=True)
        elif scale == 1.0:
            blk += array
        else:
            blk += scale * array
        self.version += 1

    def fill_zero_blocks(self) -> "BlockTensor":
        """Store every allowed block, zeros where missing."""
        for key in self.allowed_keys():
            if key not in self.blocks:
                self.blocks[key] = np.zeros(self.block_shape(key))
        self.version += 1
        return self

    # ----------------------------------------------------------------- dense views
    @classmethod
    def from_dense(cls, dense, spaces, irrep: int = 0, *, name: str = "", symmetry=(),
                   drop_zero: bool = False) -> "BlockTensor":
        """Blocks of ``dense`` (indexed by the spaces' orbitals) at the allowed keys."""
        t = cls(spaces, irrep, name=name, symmetry=symmetry)
        dense = np.asarray(dense, dtype=np.float64)
        if dense.shape != t.shape:
            raise ShapeError(f"tensor {name!r}: dense array of shape {dense.shape}, expected {t.shape}")
        for key in t.allowed_keys():
            idx = np.ix_(*(s.orbitals[s.slice(k)] for s, k in zip(t.spaces, key)))
            blk = np.ascontiguousarray(dense[idx])
            if drop_zero and not blk.any():
                continue
            t.blocks[key] = blk
        return t

    def to_dense(self) -> np.ndarray:
        """The full array, indexed by the spaces' orbitals (symmetry-forbidden parts zero)."""
        out = np.zeros(self.shape)
        for key, blk in self.blocks.items():
            idx = np.ix_(*(s.orbitals[s.slice(k)] for s, k in zip(self.spaces, key)))
            out[idx] = blk
        return out

    @classmethod
    def random(cls, spaces, irrep: int = 0, *, rng, name: str = "", fill: float = 1.0) -> "BlockTensor":
        """Random blocks at a fraction ``fill`` of the allowed keys (seeded ``rng``)."""
        t = cls(spaces, irrep, name=name)
        for key in t.allowed_keys():
            if fill >= 1.0 or rng.random() < fill:
                t.blocks[key] = rng.standard_normal(t.block_shape(key))
        return t

    # ----------------------------------------------------------------- whole-tensor ops
    def copy(self, name: str = "") -> "BlockTensor":
        t = self.like(name)
        t.blocks = {k: b.copy() for k, b in self.blocks.items()}
        return t

    def scale_(self, factor: float) -> "BlockTensor":
        for b in self.blocks.values():
            b *= factor
        self.version += 1
        return self

    def zero_(self) -> "BlockTensor":
        self.blocks.clear()
        self.version += 1
        return self

    def axpy_(self, alpha: float, other: "BlockTensor") -> "BlockTensor":
        """self += alpha * other (same spaces and irrep)."""
        self._check_same(other)
        for k, b in other.blocks.items():
            self.accumulate_block(k, b, alpha)
        return self

    def vdot(self, other: "BlockTensor") -> float:
        self._check_same(other)
        return float(sum(np.vdot(b, other.blocks[k]) for k, b in self.blocks.items() if k in other.blocks))

    def norm(self) -> float:
        return float(np.sqrt(sum(np.vdot(b, b) for b in self.blocks.values())))

    def max_abs(self) -> float:
        return max((float(np.abs(b).max()) for b in self.blocks.values() if b.size), default=0.0)

    def _check_same(self, other: "BlockTensor") -> None:
        if other.spaces != self.spaces or other.irrep != self.irrep:
            raise ShapeError(f"tensors {self.name!r} and {other.name!r} differ in spaces or irrep")

    # ----------------------------------------------------------------- accounting
    @property
    def stored_elements(self) -> int:
        return int(sum(b.size for b in self.blocks.values()))

    @property
    def dense_elements(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return int(sum(b.nbytes for b in self.blocks.values()))

    # ----------------------------------------------------------------- expressions
    def __getitem__(self, indices: str):
        from tessera.expr.terms import Ref
        return Ref(self, indices)

    def __setitem__(self, indices: str, value) -> None:
        from tessera.expr.terms import assign
        assign(self, indices, value)

    def __repr__(self) -> str:
        dims = "x".join(str(d) for d in self.shape)
        return (f"BlockTensor({self.name!r}, {dims}, irrep={self.irrep}, "
                f"blocks={len(self.blocks)}/{len(self.allowed_keys())})")
