"""Block grid of a global array: tiles per dimension, which blocks exist, patch geometry.

Pure Python (no MPI). A block key is a tuple of tile indices, one per dimension; the
global array's index range along dimension d is the concatenation of its tiles. A patch
is a rectangular global index range [lo, hi); `pieces(lo, hi)` cuts it along the tile
boundaries into one box per block it touches.
"""

from __future__ import annotations

import itertools
import operator
from bisect import bisect_right
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from tessera.errors import RuntimeLayerError

Key = tuple


@dataclass(frozen=True)
class Piece:
    """The part of a patch that lies in one block.

    key: the block; block_start: where the box starts inside the block; patch_start:
    where it starts inside the patch; shape: the box's extent.
    """

    key: Key
    block_start: tuple
    patch_start: tuple
    shape: tuple

    @property
    def size(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


class BlockLayout:
    """Tiles per dimension plus the set of blocks that exist (block-sparse): the listed
    ``keys`` (default: every tile tuple), or, with ``exists`` (a predicate on a key), the
    keys it accepts, never listed (``keys``, ``order``, ``index``, ``sizes`` are then
    absent; see GlobalArray's ``placement``)."""

    def __init__(self, tiling: Sequence[Sequence[int]], keys: Iterable | None = None, exists=None):
        self.tiling = self._check_tiling(tiling)
        self.ndim = len(self.tiling)
        offsets = []
        for tiles in self.tiling:
            acc = [0]
            for t in tiles:
                acc.append(acc[-1] + t)
            offsets.append(tuple(acc))
        self.offsets = tuple(offsets)
        self.shape = tuple(o[-1] for o in self.offsets)
        self.exists = exists
        if exists is not None:
            return
        fast = None if keys is None else self._fast_keys(keys)
        if keys is None:
            all_keys = itertools.product(*(range(len(t)) for t in self.tiling))
            self.keys = tuple(all_keys)
            self.order = np.arange(len(self.keys))
        elif fast is not None:
            self.keys, self.order = fast
        else:
            normalized = [self.normalize_key(k) for k in keys]
            if len(set(normalized)) != len(normalized):
                seen, dup = set(), None
                for k in normalized:
                    if k in seen:
                        dup = k
                        break
                    seen.add(k)
                raise RuntimeLayerError(
                    f"block key {dup} is listed twice in keys; expected each block once. "
                    "Remove the duplicates."
                )
            self.order = np.asarray(sorted(range(len(normalized)), key=normalized.__getitem__), dtype=np.int64)
            self.keys = tuple(normalized[n] for n in self.order)
        self.index = {k: n for n, k in enumerate(self.keys)}     # key -> position in keys

    def _fast_keys(self, keys):
        """(sorted keys, order) of keys that are a clean integer array inside the grid with
        no key twice, checked vectorised; None for anything else (the per-key path then
        says what is wrong)."""
        try:
            arr = np.asarray(keys)
        except (TypeError, ValueError):
            return None
        if arr.dtype.kind not in "iu" or arr.ndim != 2 or arr.shape[1] != self.ndim or not len(arr):
            return None
        grid = np.asarray([len(t) for t in self.tiling])
        if (arr < 0).any() or (arr >= grid).any():
            return None
        order = np.lexsort(arr.T[::-1])
        arr = arr[order]
        if (arr[1:] == arr[:-1]).all(axis=1).any():
            return None
        return tuple(map(tuple, arr.tolist())), order

    def sizes(self) -> np.ndarray:
        """Elements of each block, in ``keys`` order (vectorised)."""
        out = np.ones(len(self.keys), dtype=np.int64)
        if self.keys:
            arr = np.asarray(self.keys, dtype=np.int64)
            for d, tiles in enumerate(self.tiling):
                out *= np.asarray(tiles, dtype=np.int64)[arr[:, d]]
        return out

    @staticmethod
    def _check_tiling(tiling) -> tuple:
        if isinstance(tiling, (str, bytes)) or not hasattr(tiling, "__len__") or len(tiling) == 0:
            raise RuntimeLayerError(
                f"tiling {tiling!r} is not a list of tile-size lists; expected e.g. "
                "[[3, 4, 2], [5, 5]] (one list of positive tile sizes per dimension)."
            )
        out = []
        for d, tiles in enumerate(tiling):
            try:
                sizes = tuple(int(t) for t in tiles)
                ok = len(sizes) > 0 and all(s > 0 and s == t for s, t in zip(sizes, tiles))
            except (TypeError, ValueError):
                ok = False
            if not ok:
                raise RuntimeLayerError(
                    f"tiling of dimension {d} is {tiles!r}; expected a non-empty list of "
                    "positive integer tile sizes, e.g. [3, 4, 2]."
                )
            out.append(sizes)
        return tuple(out)

    # -- keys -------------------------------------------------------------------------
    def normalize_key(self, key) -> Key:
        """Return key as a tuple of ints within the tile grid, or raise."""
        if hasattr(key, "__index__") and not isinstance(key, bool):
            key = (key,)
        try:
            k = tuple(operator.index(i) for i in key)
        except TypeError:
            raise RuntimeLayerError(
                f"block key {key!r} is not a tuple of tile indices; expected a tuple of "
                f"{self.ndim} integers, e.g. {(0,) * self.ndim}."
            ) from None
        if len(k) != self.ndim or any(i < 0 or i >= len(t) for i, t in zip(k, self.tiling)):
            grid = tuple(len(t) for t in self.tiling)
            raise RuntimeLayerError(
                f"block key {key!r} is outside the tile grid {grid}; expected {self.ndim} "
                "indices, each 0 <= i < number of tiles in that dimension."
            )
        return k

    def __contains__(self, key) -> bool:
        return key in self.index if self.exists is None else self.exists(key)

    def block_shape(self, key: Key) -> tuple:
        return tuple(t[i] for t, i in zip(self.tiling, key))

    def block_range(self, key: Key) -> tuple[tuple, tuple]:
        lo = tuple(o[i] for o, i in zip(self.offsets, key))
        hi = tuple(o[i + 1] for o, i in zip(self.offsets, key))
        return lo, hi

    # -- patches ----------------------------------------------------------------------
    def check_patch(self, lo, hi) -> tuple[tuple, tuple]:
        try:
            lo_t = tuple(int(x) for x in lo)
            hi_t = tuple(int(x) for x in hi)
        except TypeError:
            raise RuntimeLayerError(
                f"patch bounds lo={lo!r}, hi={hi!r} are not sequences of integers; expected "
                f"two tuples of {self.ndim} indices."
            ) from None
        if len(lo_t) != self.ndim or len(hi_t) != self.ndim:
            raise RuntimeLayerError(
                f"patch lo={lo_t}, hi={hi_t} has the wrong number of dimensions; the array "
                f"has {self.ndim} (global shape {self.shape})."
            )
        for d, (a, b, n) in enumerate(zip(lo_t, hi_t, self.shape)):
            if not (0 <= a <= b <= n):
                raise RuntimeLayerError(
                    f"patch [{lo_t}, {hi_t}) is outside the array along dimension {d}: "
                    f"expected 0 <= lo <= hi <= {n} (global shape {self.shape}). "
                    "Clip the patch to the array."
                )
        return lo_t, hi_t

    def pieces(self, lo: tuple, hi: tuple) -> tuple[list[Piece], list[Key]]:
        """Cut the (checked) patch [lo, hi) into per-block pieces.

        Returns (pieces of existing blocks, keys of touched blocks that do not exist).
        """
        if any(a == b for a, b in zip(lo, hi)):
            return [], []
        per_dim = []
        for d in range(self.ndim):
            off = self.offsets[d]
            first = bisect_right(off, lo[d]) - 1
            last = bisect_right(off, hi[d] - 1) - 1
            spans = []
            for t in range(first, last + 1):
                a = max(lo[d], off[t])
                b = min(hi[d], off[t + 1])
                spans.append((t, a - off[t], a - lo[d], b - a))
            per_dim.append(spans)
        found, missing = [], []
        for combo in itertools.product(*per_dim):
            key = tuple(c[0] for c in combo)
            if key in self:
                found.append(Piece(key, tuple(c[1] for c in combo),
                                   tuple(c[2] for c in combo), tuple(c[3] for c in combo)))
            else:
                missing.append(key)
        return found, missing
