"""Distributed storage of BlockTensors over the runtime's global arrays.

``TensorStore`` is the storage a distributed context installs (``use_storage``): every
BlockTensor created while it is current gets a ``DistHandle`` (``tensor.dist``) and its
``blocks`` become views of the blocks this rank owns in a GlobalArray.

Ownership is a deterministic function of a tensor's structure, so every rank computes
the same map without communication:
- ``balanced`` (every tensor, the integral classes included): the allowed blocks ranked
  by size and dealt round-robin, the rank labels rotated by a structural hash so that
  many small tensors do not all start on rank 0 (``runtime.distribution.block_owners``),
  computed per key (``runtime.placement``): a rank lists only its own blocks;
- ``pieces`` (the integral classes, T2 and the T2-sized CCSD tensors): as ``balanced``,
  but where a class has too few blocks for the ranks each block is stored in pieces over
  several ranks (``runtime.placement.PiecedPlacement``); no rank then holds a whole
  block (``tensor.blocks`` is empty; ``DistributedExecutor`` computes a block on its home
  rank and accumulates its pieces, ``mpi-collective`` sends them to their owners in its
  all-to-all; elementwise work of tensors of one structure and
  placement is rank-local on ``DistHandle.local_run``: ``BlockTensor``'s whole-tensor
  operations, ``DistributedExecutor.rank_local`` steps) and every read gathers its
  pieces (one-sided gets, or an all-to-all on ``mpi-collective``). ``TESSERA_PIECES=N``
  (tests) cuts every block of a ``pieces`` tensor into at least N pieces;
- ``("rows", owners)``: a tensor that follows another's ownership row by row.

Collective lifetime. Creating a GlobalArray is collective; tensors are created in the
same order on every rank (SPMD), so creation in the constructor is safe. Freeing is the
delicate part: a tensor dropped by CPython's reference counting releases its array to a
*pending* list; at the start of each plan execution (a collective point that every rank
reaches in the same order) the ranks agree, with one allgather, on the arrays released
everywhere, and only those are reused, for the next tensor of the same structure and
placement (lowest array id first, so every rank picks the same one). ``close()`` (the
context's end, collective) frees the pooled arrays; arrays of tensors still alive are
freed at ``World.stop()``. The pool bounds their number by the peak of live tensors.
"""

from __future__ import annotations

import logging
import weakref
from collections import OrderedDict

import numpy as np

from tessera.errors import RuntimeLayerError
from tessera.runtime import GlobalArray, World
from tessera.runtime.placement import block_placement
from tessera.backends.registry import least_pieces
from tessera.tensor.block_tensor import symmetry_group

log = logging.getLogger(__name__)

class DistHandle:
    """``tensor.dist``: ownership, remote access and reductions for one distributed tensor."""

    def __init__(self, store: "TensorStore", ga: GlobalArray, name: str):
        self.store = store
        self.ga = ga
        self.name = name
        self.world = store.world
        self.pieced = ga.pieces > 1      # blocks stored in pieces: no rank holds one whole

    def owner(self, key) -> int:
        return self.ga.owner(key)

    def fetch(self, key) -> np.ndarray:
        """A copy of one block, from wherever it lives (one-sided get)."""
        return self.ga.get(key)

    def fetch_many(self, keys) -> dict:
        """{key: block} for ``keys`` (unknown keys are skipped). Called by every rank at
        the same point (SPMD): the collective backend answers with one all-to-all."""
        keys = [k for k in keys if k in self.ga]
        return self.store.fetcher(self, keys)

    def accumulate(self, key, array, scale: float = 1.0) -> None:
        self.ga.acc(key, array, scale)

    def put(self, key, array) -> None:
        """Set a block wherever it lives (one-sided put; in place for an owned block)."""
        self.ga.put(key, array)

    def free(self) -> None:
        """Collective: release the tensor's distributed memory now (not when the tensor
        is garbage collected); the tensor must not be used afterwards."""
        self.store.free(self)

    def allreduce(self, value, op: str = "sum"):
        return value if self.world.size == 1 else self.world.allreduce(value, op)

    def sync(self) -> None:
        """Collective: every update to this tensor issued before is visible after."""
        self.ga.sync()

    def local_nbytes(self) -> int:
        return self.ga.nbytes_local()

    def local_run(self) -> np.ndarray:
        """This rank's storage as one writable vector (``local_pieces`` order)."""
        return self.ga.local_run()

    def local_pieces(self) -> list:
        """[(key, first element in the block, elements), ...] of ``local_run``."""
        return self.ga.local_pieces()

    def home_keys(self) -> list:
        """The stored keys this rank computes (owner computes): its own blocks, or the
        blocks whose first piece it holds."""
        return self.ga.home_keys()

    def same_layout(self, other) -> bool:
        """Whether ``other`` (a handle) stores its elements where this one does: one
        placement, so elementwise work is rank-local on ``local_run``."""
        return other is not None and self.ga.same_layout(other.ga)


def onesided_fetch(handle: DistHandle, keys) -> dict:
    """Non-blocking gets of every block, then wait: the one-sided ``fetch_many``."""
    me = handle.world.rank
    out, pending = {}, []
    for k in keys:
        if not handle.pieced and handle.ga.owner(k) == me:
            out[k] = handle.ga.local_view(k).copy()
        else:
            pending.append((k, handle.ga.iget(k)))
    for k, h in pending:
        out[k] = h.wait()
    return out


class TensorStore:
    """The storage callable for ``use_storage`` plus the pool of global arrays."""

    def __init__(self, world: World | None = None, fetcher=onesided_fetch):
        self.world = world or World.get()
        self.fetcher = fetcher
        # into at least how many pieces the blocks of a ``pieces`` tensor are cut
        self.least_pieces = least_pieces()
        self._free: dict = {}          # structure key -> [GlobalArray], agreed free, by eid
        self._pending: list = []       # (structure key, GlobalArray) released here
        self._placements: dict = {}    # structure key -> where its blocks live (runtime.placement)
        self.by_eid: dict = {}         # array id (the same on every rank) -> GlobalArray
        self.closed = False

    # -- the storage protocol of BlockTensor --------------------------------------------
    def __call__(self, tensor, placement: str):
        if self.closed:
            raise RuntimeLayerError(
                f"tensor {tensor.name!r} created after its distributed context was closed; "
                "create tensors inside the context (with Context(...)) that runs them.")
        # the symmetry of a canonical tensor decides which blocks it stores, so its placement
        skey = (tensor.spaces, tensor.irrep, placement, tensor.canonical,
                tuple(tensor.symmetry) if tensor.canonical else ())
        free = self._free.get(skey)
        if free:
            ga = free.pop(0)
            ga.clear_local()
        else:
            ga = self._create(tensor, placement, skey)
        handle = DistHandle(self, ga, tensor.name)
        tensor.blocks = {k: ga.local_view(k) for k in ga.local_keys()}
        if tensor.aliases:                  # views of owned canonical blocks (their aliases only)
            for canon in ga.local_keys():
                for alias, _ in tensor.aliases.of(canon):
                    tensor.blocks[alias] = ga.local_view(alias)
        handle.release = weakref.finalize(tensor, self._pending.append, (skey, ga))
        return handle

    def free(self, handle: DistHandle) -> None:
        """Collective: free one tensor's array at once (every rank frees the same tensor
        at the same point)."""
        handle.release.detach()
        self.by_eid.pop(handle.ga.eid, None)
        handle.ga.free()

    def _create(self, tensor, placement, skey) -> GlobalArray:
        """A new array for ``tensor``: its owners and offsets computed per key
        (``runtime.placement``; no rank lists every block)."""
        tiling = [[t.size for t in s.tiles] for s in tensor.spaces]
        where = self._placements.get(skey)
        if where is None:
            group = symmetry_group(tensor.symmetry, tensor.ndim) if tensor.canonical else ()
            where = self._placements[skey] = block_placement(tensor.spaces, tensor.irrep, group,
                                                             self.world.size, placement, self.least_pieces)
        ga = GlobalArray(tiling, placement=where, name=tensor.name or "tensor", world=self.world,
                         aliases=tensor.aliases)
        self.by_eid[ga.eid] = ga
        return ga

    # -- collective points ----------------------------------------------------------------
    def collect(self) -> None:
        """Collective: make the arrays that every rank has released reusable."""
        pending = list(self._pending)   # tensors freed meanwhile append; they wait for the next call
        mine = sorted(ga.eid for _, ga in pending)
        if self.world.size > 1:
            everyone = self.world.allgather(mine)
            common = set(everyone[0]).intersection(*map(set, everyone[1:]))
        else:
            common = set(mine)
        if not common:
            return
        for skey, ga in pending:
            if ga.eid in common:
                self._free.setdefault(skey, []).append(ga)
        self._pending[:] = [(skey, ga) for skey, ga in self._pending if ga.eid not in common]
        for lst in self._free.values():
            lst.sort(key=lambda g: g.eid)

    def close(self) -> None:
        """Collective: free the arrays no tensor uses any more; arrays of tensors still
        alive stay until World.stop()."""
        if self.closed:
            return
        self.collect()
        for lst in self._free.values():
            for ga in lst:
                self.by_eid.pop(ga.eid, None)
                ga.free()
        self._free.clear()
        self.closed = True


class BlockCache:
    """Blocks fetched from other ranks, least recently used first out, bounded in bytes."""

    def __init__(self, limit_bytes: int):
        self.limit = int(limit_bytes)
        self.bytes = 0
        self._d: OrderedDict = OrderedDict()

    def get(self, key):
        blk = self._d.get(key)
        if blk is not None:
            self._d.move_to_end(key)
        return blk

    def put(self, key, blk) -> None:
        if key in self._d:
            return
        self._d[key] = blk
        self.bytes += blk.nbytes
        while self.bytes > self.limit and len(self._d) > 1:
            _, old = self._d.popitem(last=False)
            self.bytes -= old.nbytes

    def __contains__(self, key) -> bool:
        return key in self._d

    def clear(self) -> None:
        self._d.clear()
        self.bytes = 0


class FrozenCache:
    """What an executor derived from frozen tensors (``BlockTensor.freeze``: the integrals,
    which never change between iterations), kept across steps and iterations: fetched
    blocks (``mpi-onesided``), received panels and blocks (``mpi-collective``). Keyed by the
    tensor's uid and version and the caller's key; bounded by ``limit`` bytes, least
    recently used first out. A non-frozen tensor is never kept."""

    def __init__(self, limit_bytes: int):
        self.limit = int(limit_bytes)
        self.bytes = 0
        self._d: OrderedDict = OrderedDict()     # key -> (value, bytes)

    def get(self, t, key):
        """What was kept for ``key`` of tensor ``t``, or None."""
        if not t.constant:
            return None
        hit = self._d.get((t.uid, t.version, *key))
        if hit is None:
            return None
        self._d.move_to_end((t.uid, t.version, *key))
        return hit[0]

    def put(self, t, key, value, nbytes: int) -> bool:
        """Keep ``value`` (``nbytes``) for ``key`` of ``t`` if ``t`` is frozen and it fits the
        bound (older entries out); True when kept. Deterministic in its arguments, so
        ranks that pass the same sizes keep the same entries."""
        if not t.constant or nbytes > self.limit:
            return False
        k = (t.uid, t.version, *key)
        if k in self._d:
            return True
        while self.bytes + nbytes > self.limit:
            self.bytes -= self._d.popitem(last=False)[1][1]
        self._d[k] = (value, int(nbytes))
        self.bytes += int(nbytes)
        return True

    def clear(self) -> None:
        self._d.clear()
        self.bytes = 0
