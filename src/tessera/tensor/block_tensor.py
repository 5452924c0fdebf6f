"""BlockTensor: a tensor over a tuple of index spaces that stores only allowed blocks.

A block is keyed by a tuple of tile indices, one per space. A block is allowed when the
XOR of its tiles' irreps equals the tensor's irrep (point-group symmetry); only allowed,
non-zero blocks are stored, a missing allowed block is zero. Permutational symmetry
(e.g. T2[ijab] = T2[jiba]) is a list of (axis permutation, sign) under which the tensor
is invariant. By default it is metadata and all allowed blocks are stored; a tensor made
with ``canonical=True`` (the vvvv integrals, T2 and the other pair-symmetric amplitude
tensors of CCSD) stores one block per orbit of its symmetry group (the largest key, its
*canonical* block); every other allowed block is an *alias*, a transposed view of its
canonical block here (no memory) and a fetch of the canonical block permuted locally
when it lives elsewhere (libtensor's and NWChem TCE's storage of permuted blocks).
Writing an alias writes its canonical block; plans write canonical blocks only
(``plan.symmetric`` checks that the update is symmetric).

Distributed tensors. While a distributed storage is in use (``use_storage``, set by a
distributed execution context), a new tensor asks it for a handle ``tensor.dist``. The
metadata stay the same; ``blocks`` then holds only the blocks this process owns, as
writable views into distributed memory (every allowed block exists, zero at first).
Writes to owned blocks are in place (a view is never replaced); other blocks are
reached through the handle (``get_block`` fetches, ``accumulate_block`` accumulates to
the owner). Reductions (``norm``, ``vdot``, ``max_abs``) sum over the processes. A
tensor stored in pieces (``pieced``: each block cut into runs of elements on several
processes) has no whole block here: ``owned_keys`` are the blocks whose first piece is
here (``store_block`` puts them), and ``copy``, ``zero_`` and the reductions work on the
pieces a process holds. The handle is supplied by the backend; this module knows only
its methods and attribute ``pieced``: ``owner(key)``, ``fetch(key)``,
``fetch_many(keys)``, ``accumulate(key, array, scale)``, ``put(key, array)``,
``allreduce(value, op)``, ``sync()``, ``local_nbytes()``, ``free()``, and for pieces
``local_run()``, ``local_pieces()``, ``home_keys()``, ``same_layout(handle)``.
"""

from __future__ import annotations

import contextvars
import itertools
import math
import operator
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from tessera.errors import ShapeError, SymmetryError
from tessera.tensor.space import IndexSpace


_uids = itertools.count()

# The storage that new tensors attach to: None (local dict of blocks) or a callable
# ``storage(tensor, placement) -> handle`` supplied by a distributed backend.
_storage: contextvars.ContextVar = contextvars.ContextVar("tessera_storage", default=None)


def use_storage(storage):
    """Make ``storage`` the one new tensors attach to; returns a token for ``reset_storage``."""
    return _storage.set(storage)


def reset_storage(token) -> None:
    _storage.reset(token)


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


@lru_cache(maxsize=4096)
def allowed_elements(spaces: tuple, irrep: int) -> int:
    """Elements of the allowed blocks, from the positions per irrep of each space (an XOR
    convolution over the irreps, no list of keys: intermediates the planner costs have
    tens of thousands of them)."""
    count = {0: 1}                              # irrep of the axes so far -> elements
    for s in spaces:
        per_irrep: dict = {}
        for t in s.tiles:
            per_irrep[t.irrep] = per_irrep.get(t.irrep, 0) + t.size
        made: dict = {}
        for g, n in count.items():
            for h, m in per_irrep.items():
                made[g ^ h] = made.get(g ^ h, 0) + n * m
        count = made
    return count.get(int(irrep), 0)


@lru_cache(maxsize=4096)
def flat_offsets(spaces: tuple, irrep: int, aliases) -> dict:
    """{stored key: (offset, shape)} of the blocks of ``BlockTensor.flat``: the allowed
    keys that are not ``aliases`` (an AliasMap or None), end to end in key order."""
    out, offset = {}, 0
    for key in _allowed_keys(spaces, irrep):
        if aliases and key in aliases:
            continue
        shape = tuple(s.tiles[t].size for s, t in zip(spaces, key))
        out[key] = (offset, shape)
        offset += math.prod(shape)
    return out


@lru_cache(maxsize=4096)
def flat_size(spaces: tuple, irrep: int, aliases) -> int:
    """Elements of ``BlockTensor.flat``: its stored blocks (``flat_offsets``) end to end."""
    return sum(math.prod(shape) for _, shape in flat_offsets(spaces, irrep, aliases).values())


@lru_cache(maxsize=256)
def flat_weights(spaces: tuple, irrep: int, aliases) -> np.ndarray:
    """Per element of ``BlockTensor.flat``, the allowed elements it stands for: the size of
    its block's orbit (1 + its aliases)."""
    offsets = flat_offsets(spaces, irrep, aliases)
    sizes = [math.prod(shape) for _, shape in offsets.values()]
    orbits = [1 + len(aliases.of(key)) if aliases else 1 for key in offsets]
    return np.repeat(np.array(orbits, dtype=np.float64), sizes)


@lru_cache(maxsize=256)
def symmetry_group(symmetry: tuple, ndim: int) -> frozenset:
    """The axis permutations generated by the declared ones with sign +1 (identity
    included), closed under composition."""
    group = {tuple(range(ndim))}
    todo = list(group)
    gens = [tuple(ps.perm) for ps in symmetry if ps.sign == 1]
    while todo:
        g = todo.pop()
        for h in gens:
            gh = tuple(g[h[k]] for k in range(len(h)))
            if gh not in group:
                group.add(gh)
                todo.append(gh)
    return frozenset(group)


class AliasMap(dict):
    """{alias key: (canonical key, perm)} of one tensor structure; one object per
    structure (``aliases``), hashed by identity so that caches of plans may key on it."""

    __hash__ = object.__hash__

    def __eq__(self, other):
        return self is other

    def __ne__(self, other):
        return self is not other

    def of(self, key) -> list:
        """[(alias, perm)] of canonical ``key``."""
        index = self.__dict__.get("_index")
        if index is None:   # built whole, then published: threads storing blocks share the map
            index = {}
            for alias, (canon, perm) in self.items():
                index.setdefault(canon, []).append((alias, perm))
            self._index = index
        return index.get(key, [])


@lru_cache(maxsize=1024)
def aliases(spaces: tuple, irrep: int, symmetry: tuple) -> AliasMap:
    """{alias key: (canonical key, perm)} over the allowed keys: the canonical key of an
    orbit of the symmetry group is its largest key; block(alias) =
    block(canonical).transpose(perm). Cached per structure (shared, do not modify).

    NumPy over the allowed keys (Python work only to build the map's entries): each key's
    images under the group as integer codes; its canonical key is the largest image, its
    ``perm`` that of the last group element (in the group's iteration order) giving it."""
    group = list(symmetry_group(tuple(symmetry), len(spaces)))
    keys = _allowed_keys(tuple(spaces), int(irrep))
    out = AliasMap()
    if len(group) == 1 or not keys:
        return out
    k = np.asarray(keys, dtype=np.int64).reshape(len(keys), len(spaces))
    base = max(len(s.tiles) for s in spaces)

    def code(axes) -> np.ndarray:       # the image (key[axes[0]], key[axes[1]], ...), lexicographic
        c = np.zeros(len(k), dtype=np.int64)
        for a in axes:
            c = c * base + k[:, a]
        return c
    best, which = np.full(len(k), -1, dtype=np.int64), np.zeros(len(k), dtype=np.int64)
    for j, g in enumerate(group):
        c = code(g)
        last = c >= best
        best[last], which[last] = c[last], j
    own = code(range(len(spaces)))
    alias = np.flatnonzero(best != own)
    # the canonical key is an allowed key: its tuple is taken from ``keys`` (found by code)
    order = np.argsort(own, kind="stable")
    canon = order[np.searchsorted(own[order], best[alias])]
    perms = [tuple(int(x) for x in np.argsort(g)) for g in group]   # canonical axis k is alias axis g[k]
    out.update(zip([keys[n] for n in alias.tolist()],
                   zip([keys[n] for n in canon.tolist()], [perms[j] for j in which[alias].tolist()])))
    return out


class BlockTensor:
    """Dense blocks keyed by tile tuples; see the module docstring."""

    def __init__(self, spaces, irrep: int = 0, *, name: str = "", symmetry=(), placement: str = "balanced",
                 canonical: bool = False):
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
        self._flat, self._lazy = None, False    # see ``flat``
        self.blocks: dict = {}
        self.uid = next(_uids)
        self.version = 0      # bumped on every change; caches of derived data key on it
        self.constant = False  # set by freeze(): executors may cache data derived from it
        self.placement = placement   # hint for a distributed storage: how to spread blocks
        # alias key -> (canonical key, perm): block(alias) = block(canonical).transpose(perm)
        self.aliases = aliases(self.spaces, self.irrep, self.symmetry) if canonical else {}
        self.canonical = canonical
        self.dist = None
        storage = _storage.get()
        if storage is not None:
            self.dist = storage(self, placement)   # fills self.blocks with owned views

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
        """An empty (zero) tensor with the same spaces, irrep, symmetry and placement
        (one stored in pieces: in the same pieces, so elementwise work stays rank-local)."""
        return BlockTensor(self.spaces, self.irrep, name=name or self.name, symmetry=self.symmetry,
                           placement=self.placement, canonical=self.canonical)

    @property
    def pieced(self) -> bool:
        """Whether the blocks are stored in pieces over several processes (no process
        holds one whole: whole-tensor operations work on ``dist.local_run``)."""
        return self.dist is not None and self.dist.pieced

    def owned_keys(self) -> list:
        """The allowed keys this process stores: all of them for a local tensor, the
        owned ones for a distributed tensor, the ones whose first piece it holds for a
        tensor stored in pieces (fill these with ``store_block``)."""
        if self.dist is None:
            return self.stored_keys()
        if self.pieced:
            return self.dist.home_keys()
        return [k for k in self.blocks if k not in self.aliases]

    def stored_keys(self) -> list:
        """The allowed keys that have storage of their own (not aliases)."""
        return [k for k in self.allowed_keys() if k not in self.aliases]

    def local_keys(self) -> list:
        """Keys of the blocks held here (stored blocks; owned blocks when distributed)."""
        return list(self.blocks)

    def global_sum(self, value, op: str = "sum"):
        """``value`` (a number or array computed from this process's blocks) reduced over
        the processes that hold parts of this tensor; ``value`` itself for a local tensor."""
        return value if self.dist is None else self.dist.allreduce(value, op)

    # ----------------------------------------------------------------- blocks
    def get_block(self, key):
        """The stored block, or None when the block is zero (not stored). For a distributed
        tensor a block owned elsewhere is fetched (a copy)."""
        blk = self.blocks.get(key)
        if blk is None and self.dist is not None and self.is_allowed(key):
            return self.dist.fetch(key)
        return blk

    def set_block(self, key, array) -> None:
        key = tuple(key)
        if not self.is_allowed(key):
            raise SymmetryError(f"tensor {self.name!r}: block {key} is not allowed by its irrep {self.irrep}")
        array = np.asarray(array, dtype=np.float64)
        if array.shape != self.block_shape(key):
            raise ShapeError(f"tensor {self.name!r}: block {key} has shape {array.shape}, "
                             f"expected {self.block_shape(key)}")
        self.store_block(key, array)

    def store_block(self, key, array) -> None:
        """Set a block this process stores (no checks: hot path). Distributed tensors copy
        into the owned view; a block owned elsewhere is an error."""
        if self.dist is None:
            if self.aliases:
                self._store_canonical(key, array)
            else:
                self.blocks[key] = array
        elif self.pieced:
            self.dist.put(key, array)              # a home key's pieces, wherever they lie
        else:
            view = self.blocks.get(key)
            if view is None:
                raise SymmetryError(
                    f"tensor {self.name!r}: block {key} is owned by process {self.dist.owner(key)}, "
                    "not by this one; expected one of owned_keys(). Fill only owned blocks "
                    "(each process fills its own), or use accumulate_block to add to a remote one.")
            view[...] = array
        self.version += 1

    def _store_canonical(self, key, array) -> None:
        """Local canonical storage: keep the canonical block, alias views onto it."""
        if key in self.aliases:
            key, perm = self.aliases[key]
            array = array.transpose(np.argsort(perm))
        self.blocks[key] = np.ascontiguousarray(array)
        for alias, perm in self.aliases.of(key):
            self.blocks[alias] = self.blocks[key].transpose(perm)

    @property
    def blocks(self) -> dict:
        """{key: array} of the blocks held here (see the module docstring)."""
        if self._lazy:
            self._make_views()
        return self._blocks

    @blocks.setter
    def blocks(self, value: dict) -> None:
        self._blocks, self._flat, self._lazy = value, None, False

    def flat(self) -> np.ndarray:
        """The stored blocks of a local tensor as one contiguous vector (``flat_offsets``
        order; a missing block is zeros there), its blocks views into it from now on, so
        that whole-tensor operations of the local executors (``backends.sectors``) are
        one NumPy call instead of one per block. A tensor with no blocks gets a zero
        vector, and its block views are made only when ``blocks`` is first read. Made
        again only when a block was replaced since (``store_block``, ``zero_``)."""
        if self._lazy:
            return self._flat[0]
        offsets = flat_offsets(self.spaces, self.irrep, self.aliases or None)
        made, blocks = self._flat, self._blocks
        if made is not None and len(made[1]) == len(offsets) and \
                all(map(operator.is_, map(blocks.get, offsets), made[1])):     # no block replaced since
            return made[0]
        if self.dist is not None:
            raise SymmetryError(f"tensor {self.name!r} is distributed: its blocks cannot be one local vector")
        if not blocks:
            self._refuse_freed()
            self._flat = (np.zeros(flat_size(self.spaces, self.irrep, self.aliases or None)), None)
            self._lazy = True
            return self._flat[0]
        parts = [blocks.get(k) for k in offsets]
        for n, (_, shape) in enumerate(offsets.values()):
            if parts[n] is None:
                parts[n] = np.zeros(shape)
        self._flat = (np.concatenate(parts, axis=None), None)
        self._make_views()
        return self._flat[0]

    def holds_nothing(self) -> bool:
        """Whether a local tensor stores no block yet (it is zero, with no storage)."""
        return self.dist is None and self._flat is None and not self._blocks

    def fresh_flat(self) -> np.ndarray:
        """For a local tensor that stores no block yet (``holds_nothing``): a new ``flat``
        vector, its elements undefined (the caller sets every one), the blocks views
        into it once read: an update that sets a new tensor needs no zeros first."""
        self._refuse_freed()
        self._flat = (np.empty(flat_size(self.spaces, self.irrep, self.aliases or None)), None)
        self._lazy = True
        return self._flat[0]

    def _refuse_freed(self) -> None:
        """Raise if the blocks were freed (``tensor.pairs.free_for_ladder``): no zeros for them."""
        getattr(self._blocks, "refuse", lambda: None)()

    def _make_views(self) -> None:
        """Point the blocks (aliases too) at their parts of the ``flat`` vector."""
        vector = self._flat[0]
        views = []
        for key, (offset, shape) in flat_offsets(self.spaces, self.irrep, self.aliases or None).items():
            view = vector[offset:offset + math.prod(shape)].reshape(shape)
            self._blocks[key] = view
            views.append(view)
            if self.aliases:
                for alias, perm in self.aliases.of(key):
                    self._blocks[alias] = view.transpose(perm)
        self._flat, self._lazy = (vector, views), False

    def orbit_size(self, key) -> int:
        """Allowed blocks that stored block ``key`` stands for (1 + its aliases)."""
        return 1 + len(self.aliases.of(key)) if self.aliases else 1

    def put_block(self, key, array) -> None:
        """Set a block wherever it is stored: ``store_block`` for a local tensor or an owned
        block, a one-sided put to the owner for a block owned elsewhere."""
        if self.dist is None or key in self.blocks:
            self.store_block(key, array)
        else:
            self.dist.put(key, array)
            self.version += 1

    def release(self) -> None:
        """Free the tensor's storage now (collective for a distributed tensor); the
        tensor is empty afterwards and must not be used."""
        if self.dist is not None:
            self.dist.free()
            self.dist = None
        self.blocks = {}

    def accumulate_block(self, key, array, scale: float = 1.0) -> None:
        """blocks[key] += scale * array, creating the block when missing (no checks: hot path).
        For a distributed tensor a block owned elsewhere is accumulated at its owner."""
        blk = self.blocks.get(key)
        if blk is None:
            if self.dist is not None:
                self.dist.accumulate(key, array, scale)
            elif self.aliases:
                self._store_canonical(key, array * scale)
            else:
                self.blocks[key] = array * scale if scale != 1.0 else np.array(array, copy=True)
        elif scale == 1.0:
            blk += array
        else:
            blk += scale * array
        self.version += 1

    def fill_zero_blocks(self) -> "BlockTensor":
        """Store every allowed block, zeros where missing (distributed: all exist already)."""
        if self.dist is None:
            for key in self.stored_keys():
                if key not in self.blocks:
                    self.store_block(key, np.zeros(self.block_shape(key)))
        self.version += 1
        return self

    # ----------------------------------------------------------------- dense views
    @classmethod
    def from_dense(cls, dense, spaces, irrep: int = 0, *, name: str = "", symmetry=(),
                   drop_zero: bool = False, canonical: bool = False) -> "BlockTensor":
        """Blocks of ``dense`` (indexed by the spaces' orbitals) at the allowed keys (the
        canonical ones only for ``canonical``: ``dense`` must have the symmetry)."""
        t = cls(spaces, irrep, name=name, symmetry=symmetry, canonical=canonical)
        dense = np.asarray(dense, dtype=np.float64)
        if dense.shape != t.shape:
            raise ShapeError(f"tensor {name!r}: dense array of shape {dense.shape}, expected {t.shape}")
        for key in t.owned_keys():
            idx = np.ix_(*(s.orbitals[s.slice(k)] for s, k in zip(t.spaces, key)))
            blk = np.ascontiguousarray(dense[idx])
            if drop_zero and t.dist is None and not blk.any():
                continue
            t.store_block(key, blk)
        return t

    def to_dense(self) -> np.ndarray:
        """The full array, indexed by the spaces' orbitals (symmetry-forbidden parts zero).
        A distributed tensor fetches every block (every process gets the whole array)."""
        self._refuse_freed()
        out = np.zeros(self.shape)
        blocks = self.blocks if self.dist is None else self.dist.fetch_many(self.allowed_keys())
        for key, blk in blocks.items():
            idx = np.ix_(*(s.orbitals[s.slice(k)] for s, k in zip(self.spaces, key)))
            out[idx] = blk
        return out

    @classmethod
    def random(cls, spaces, irrep: int = 0, *, rng, name: str = "", fill: float = 1.0) -> "BlockTensor":
        """Random blocks at a fraction ``fill`` of the allowed keys (seeded ``rng``; a
        distributed tensor draws every block and keeps its own, so all processes agree)."""
        t = cls(spaces, irrep, name=name)
        for key in t.stored_keys():
            if fill >= 1.0 or rng.random() < fill:
                blk = rng.standard_normal(t.block_shape(key))
                if t.dist is None or key in t.blocks:
                    t.store_block(key, blk)
        return t

    # ----------------------------------------------------------------- whole-tensor ops
    # A tensor stored in pieces: each process works on the pieces it holds (``local_run``,
    # contiguous runs of elements of its blocks, weighted by their orbits' sizes for a
    # canonical tensor), one allreduce for a reduction; two such tensors are combined
    # element by element only when they share a layout (one structure and placement).
    def _local_weights(self) -> np.ndarray | None:
        """Per element of ``dist.local_run``, the allowed elements it stands for (None: 1)."""
        if not self.aliases:
            return None
        parts = self.dist.local_pieces()
        return np.repeat(np.array([self.orbit_size(k) for k, _, _ in parts], dtype=np.float64),
                         [n for _, _, n in parts])

    def _same_pieces(self, other: "BlockTensor", what: str) -> None:
        if not self.dist.same_layout(other.dist):
            raise ShapeError(f"cannot {what} tensors {self.name!r} and {other.name!r}: {self.name!r} is stored "
                             "in pieces and the other is not stored in the same pieces; expected two "
                             "tensors of one structure and placement")

    def copy(self, name: str = "") -> "BlockTensor":
        t = self.like(name)
        if self.pieced:
            self._same_pieces(t, "copy")
            t.dist.local_run()[:] = self.dist.local_run()
        elif self.dist is None and not self.aliases:
            t.blocks = {k: b.copy() for k, b in self.blocks.items()}
        else:
            for k, b in self.blocks.items():
                if k not in self.aliases:
                    t.store_block(k, b.copy() if self.dist is None else b)
        return t

    def zero_(self) -> "BlockTensor":
        if self.pieced:
            self.dist.local_run().fill(0.0)
        elif self.dist is None:
            self._blocks.clear()
            self._flat, self._lazy = None, False
        else:
            for b in self.blocks.values():
                b.fill(0.0)
        self.version += 1
        return self

    def _partner_blocks(self, other: "BlockTensor") -> dict:
        """other's blocks at this process's keys (fetched where other stores them elsewhere)."""
        missing = [k for k in self.blocks if k not in other.blocks]
        got = other.dist.fetch_many(missing) if other.dist is not None else {}
        return {k: other.blocks[k] if k in other.blocks else got.get(k) for k in self.blocks}

    def vdot(self, other: "BlockTensor") -> float:
        self._check_same(other)
        if self.pieced and other.pieced:
            self._same_pieces(other, "dot")
            x, y, w = self.dist.local_run(), other.dist.local_run(), self._local_weights()
            return float(self.global_sum(float(np.dot(x, y if w is None else w * y))))
        if self.pieced:                 # the other's whole blocks fetch these pieces
            return other.vdot(self)
        if self.dist is None:
            return float(sum(np.vdot(b, other.blocks[k]) for k, b in self.blocks.items() if k in other.blocks))
        theirs = self._partner_blocks(other)
        local = float(sum(np.vdot(b, theirs[k]) for k, b in self.blocks.items() if theirs[k] is not None))
        return float(self.global_sum(local))

    def norm(self) -> float:
        if self.pieced:
            return float(np.sqrt(self.vdot(self)))
        return float(np.sqrt(self.global_sum(float(sum(np.vdot(b, b) for b in self.blocks.values())))))

    def max_abs(self) -> float:
        if self.pieced:
            run = self.dist.local_run()
            local = float(np.abs(run).max()) if run.size else 0.0
        else:
            local = max((float(np.abs(b).max()) for b in self.blocks.values() if b.size), default=0.0)
        return float(self.global_sum(local, "max"))

    def _check_same(self, other: "BlockTensor") -> None:
        if other.spaces != self.spaces or other.irrep != self.irrep:
            raise ShapeError(f"tensors {self.name!r} and {other.name!r} differ in spaces or irrep")

    # ----------------------------------------------------------------- accounting
    @property
    def stored_elements(self) -> int:
        """Elements stored (over all processes for a distributed tensor)."""
        if self._lazy:          # one flat vector, its block views not made yet: not made here
            return self._flat[0].size
        if self.aliases:
            if self.dist is None:
                return int(sum(b.size for k, b in self.blocks.items() if k not in self.aliases))
            return int(sum(math.prod(self.block_shape(k)) for k in self.stored_keys()))
        if self.dist is not None:
            return allowed_elements(self.spaces, self.irrep)
        return int(sum(b.size for b in self.blocks.values()))

    @property
    def dense_elements(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        """Bytes stored (over all processes for a distributed tensor)."""
        if self.dist is not None or self.aliases:
            return 8 * self.stored_elements
        return int(sum(b.nbytes for b in self.blocks.values()))

    @property
    def local_nbytes(self) -> int:
        """Bytes of the blocks held by this process (aliases are views: not counted; a
        distributed tensor's: its storage here, blocks or pieces of blocks)."""
        if self.dist is not None:
            return int(self.dist.local_nbytes())
        return int(sum(b.nbytes for k, b in self.blocks.items() if k not in self.aliases))

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
