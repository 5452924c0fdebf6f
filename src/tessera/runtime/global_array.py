"""GlobalArray: a distributed store of dense blocks over MPI one-sided operations.

The array is a grid of blocks (irregular tile sizes per dimension, block-sparse: only
the listed keys exist). Each block has one owner among the worker ranks; a rank's
blocks lie contiguously (sorted key order) in its exposed window memory (see
exposure.py for where that memory lives in each progress mode). With ``placement``
(runtime/placement.py) the blocks are the ones it stores, owner and offset of a key
are computed from the key, a rank's blocks lie in the placement's order, and no rank
lists every block: a rank keeps slots for its own blocks and those it touches. With a
``pieces`` placement (``placement.PiecedPlacement``) a block may be stored in pieces,
contiguous runs of its elements on several ranks: get/put/acc of such a block are one
operation per piece, of a patch in it one per contiguous row of the patch in a piece (only
the patch's elements move); no rank holds it whole (no local view), and its
owner is its home, the owner of its first piece.

Semantics
- Blocks start at zero.
- get / get_patch return when the data is in the returned array.
- put / acc (and their patch forms) return when the update is complete at the target:
  a later get by any rank that is ordered after the call (by a barrier, a counter,
  a message) sees it. iget / iacc return a handle; handle.wait() gives the same
  guarantee. Do not modify the array passed to iacc before wait().
- acc is element-wise atomic (MPI_Accumulate with MPI_SUM): concurrent accumulates from
  any number of ranks to the same elements lose no update.
- A put that overlaps a concurrent get/put/acc of the same elements from another rank
  is undefined (as in MPI); separate them with sync().
- Blocks whose memory is mapped into this process (own blocks; blocks of same-node
  ranks with window 'allocate' and in ghost mode: MPI shared memory) are read and
  written by direct copies (get, put); acc always goes through MPI so that it stays
  atomic with every other rank's accumulates.
- Patches (``runtime.patches``): a rectangular global index range [lo, hi) that may span
  any number of blocks and owners. get_patch returns zeros where blocks do not exist;
  put_patch and acc_patch require every touched block to exist.
- Methods are not thread-safe; call them from one thread per rank.
"""

from __future__ import annotations

import logging
import threading
from time import perf_counter

import numpy as np

from tessera.errors import RuntimeLayerError
from tessera.runtime._mpi import load_mpi, mpi_datatype
from tessera.runtime.distribution import assign_owners
from tessera.runtime.exposure import Exposure
from tessera.runtime.handle import Handle
from tessera.runtime.layout import BlockLayout
from tessera.runtime.patches import PatchAccess
from tessera.runtime.placement import PieceRuns, TablePlacement, part_runs

log = logging.getLogger("tessera.runtime")

RUNS_BYTES = 16 << 20   # bytes of piece runs kept per array (``GlobalArray.piece_runs``)


class _Slots(dict):
    """{key: slot} of a GlobalArray, each made on first use (``GlobalArray._make_slot``);
    a key the array does not have is a KeyError."""

    def __init__(self, ga):
        super().__init__()
        self._ga = ga

    def __missing__(self, key):
        slot = self[key] = self._ga._make_slot(key)     # KeyError for a key not stored
        return slot


class GlobalArray(PatchAccess):
    """Distributed blocks addressed by key or by global patch (see module docstring; the
    patch operations: ``runtime.patches``)."""

    def __init__(self, tiling, keys=None, distribution: str = "cyclic", costs=None,
                 owners=None, dtype="float64", name: str = "GA", world=None, aliases=None,
                 placement=None):
        if world is None:
            from tessera.runtime.world import World

            world = World.get()
        world._check_running()
        self._MPI = load_mpi()
        self.world = world
        self.name = str(name)
        self.dtype = np.dtype(dtype)
        self._mpitype = mpi_datatype(self.dtype)
        self.itemsize = self.dtype.itemsize
        if placement is not None:
            # owner and offset of a key computed from it (runtime.placement): no rank lists
            # every block, a rank unranks its own keys only
            self.layout = BlockLayout(tiling, exists=placement.stored)
            self.distribution = placement.name
        else:
            self.layout = BlockLayout(tiling, keys)
            placement = TablePlacement(self.layout, self._owner_table(owners, distribution, costs, world.size),
                                       world.size)
            self.distribution = "owners" if owners is not None else distribution
        self._place = placement
        self.pieces = getattr(placement, "k", 1)     # pieces per block (1: whole blocks)
        self._parts: dict = {}   # key stored in pieces -> [(owner, target, disp, start, count, view)]
        self._runs: dict = {}    # (key, part, rank) -> PieceRuns, at most RUNS_BYTES (``piece_runs``)
        self._runs_bytes = 0
        self._runs_lock = threading.Lock()
        me = world.rank
        self._local_count = placement.elements(me)
        self._exp = Exposure(world, self._local_count * self.itemsize, self.itemsize, kind="data")
        self.eid = self._exp.eid
        self._win = self._exp.win
        self._local = self._exp.local.view(self.dtype) if self._local_count else np.zeros(0, self.dtype)
        self._mapped = {w: region.view(self.dtype) for w, region in self._exp.direct.items()
                        if len(region) >= placement.elements(w) * self.itemsize}
        # a block's slot (owner, target, MPI target spec, shape, count, bytes, mapped view) is
        # made when first used: a rank holds the slots of its own blocks and of those it
        # touches, not one per block of the array
        self._slots = _Slots(self)
        self._local_keys = placement.local_keys(me)
        off = 0
        for key in self._local_keys:                  # one after the other in memory
            slot = self._slots[key] = self._slot_at(key, me, off)
            off += slot[4]
        # alias key -> (stored key, perm): block(alias) = block(stored).transpose(perm),
        # read through the stored block (no memory of its own); keys are tuples of ints,
        # the mapping is shared (a tensor structure's), not copied
        self.aliases = aliases if aliases is not None else {}
        self.direct_ranks = sorted(self._mapped)
        self._log = world.comm_log
        self._types = world._types
        self._SUM = self._MPI.SUM
        self._epochs = [0] * world.full_size  # flushes issued per target (see Handle)
        self._local[:] = 0
        self._exp.sync_memory()
        world.comm.Barrier()
        world._register(self)
        log.debug("global array %r: %d blocks, %d local (%d bytes)", self.name,
                  placement.nblocks, len(self._local_keys), self.nbytes_local())

    # -- description ------------------------------------------------------------------
    @property
    def shape(self) -> tuple:
        return self.layout.shape

    @property
    def ndim(self) -> int:
        return self.layout.ndim

    @property
    def tiling(self) -> tuple:
        return self.layout.tiling

    @property
    def keys(self) -> tuple:
        """Every block key (computed on demand under a placement: O(blocks))."""
        return tuple(self._place.keys())

    def __contains__(self, key) -> bool:
        return key in self._slots or key in self.aliases or key in self.layout

    def owner(self, key) -> int:
        if key in self.aliases:
            key = self.aliases[key][0]
        return self._slot(key)[0]

    def owners(self) -> dict:
        """{key: owner rank} for every block (O(blocks): for inspection)."""
        return {k: self.owner(k) for k in self._place.keys()}

    def _owner_table(self, owners, distribution, costs, nranks: int) -> np.ndarray:
        """Owner of every key of the layout (aligned with ``layout.keys``), checked."""
        lay = self.layout
        if owners is not None and not hasattr(owners, "items"):
            arr = np.asarray(owners)
            if arr.shape != (len(lay.keys),) or arr.dtype.kind not in "iu" \
                    or (len(arr) and not (0 <= arr.min() and arr.max() < nranks)):
                raise RuntimeLayerError(
                    f"owners of global array {self.name!r} is a sequence of shape {arr.shape} and "
                    f"type {arr.dtype}; expected one rank 0 <= r < {nranks} per key, aligned with "
                    "keys, or a dict {key: rank}.")
            return arr.astype(np.int64)[lay.order]
        if owners is not None:
            owners = {lay.normalize_key(k): r for k, r in dict(owners).items()}
        if costs is not None and hasattr(costs, "items"):
            costs = {lay.normalize_key(k): c for k, c in costs.items()}
        owner_map = assign_owners(lay.keys, nranks, distribution, costs, owners,
                                  default_costs=lay.sizes().tolist())
        return np.fromiter((owner_map[k] for k in lay.keys), dtype=np.int64, count=len(lay.keys))

    def _make_slot(self, key):
        if self.pieces > 1:       # the block's slot names its home; its pieces go to _parts
            parts = self._parts[key] = []
            for r, off, start, count in self._place.pieces_of(key):
                view = self._mapped[r][off:off + count] if r in self._mapped else None
                parts.append((r, self._exp.targets[r], self._exp.base[r] + off, start, count, view))
            shape = self.layout.block_shape(key)
            count = int(np.prod(shape, dtype=np.int64))
            return (parts[0][0], None, None, shape, count, count * self.itemsize, None)
        return self._slot_at(key, *self._place.locate(key))

    def _pieced(self, op: str, key, a, scale, blocking: bool):
        """get / put / acc of a whole block stored in pieces: one operation per piece,
        each on a contiguous run of the block's elements (direct copies for mapped
        pieces but acc, as for whole blocks); a Handle when not ``blocking``."""
        t0 = perf_counter()
        _, _, _, shape, count, _, _ = self._slots[key]
        buf = np.empty(shape, self.dtype) if op == "get" else self._as_block(a, shape, op, scale)
        flat, mt, isz = buf.reshape(-1), self._mpitype, self.itemsize
        targets, parts, synced = [], [], False
        for owner, target, disp, start, n, view in self._parts[key]:
            seg = flat[start:start + n]
            parts.append((owner, n * isz))
            if view is not None and op != "acc":
                if not synced:
                    self._exp.sync_memory()
                    synced = True
                if op == "get":
                    seg[:] = view
                else:
                    view[:] = seg
                continue
            if op == "get":
                self._win.Get([seg, n, mt], target, (disp, n, mt))
            elif op == "put":
                self._win.Put([seg, n, mt], target, (disp, n, mt))
            else:
                self._win.Accumulate([seg, n, mt], target, (disp, n, mt), self._SUM)
            if target not in targets:
                targets.append(target)
        if synced and op == "put":
            self._exp.sync_memory()
        result = buf if op == "get" else None
        self._log.add_split(op, parts, perf_counter() - t0)
        if blocking:
            for t in targets:
                self._flush(t)
            return result
        return Handle(self, op, result, tuple((t, self._epochs[t]) for t in targets), parts,
                      keep=None if op == "get" else buf)

    def _slot_at(self, key, r: int, off: int):
        shape = self.layout.block_shape(key)
        count = int(np.prod(shape, dtype=np.int64))
        view = self._mapped[r][off:off + count].reshape(shape) if r in self._mapped else None
        return (r, self._exp.targets[r], (self._exp.base[r] + off, count, self._mpitype), shape,
                count, count * self.itemsize, view)

    def local_keys(self) -> list:
        return list(self._local_keys)

    def piece_runs(self, key, part=None, rank: int | None = None) -> "PieceRuns":
        """Where the elements of a block stored in pieces, or of ``part`` of it, lie: one run
        per contiguous row of the part within a piece (``PieceRuns``; ``placement.part_runs``),
        for exchanges that move pieces by message (``mpi-collective``) and for patches
        (``_piece_patch``). ``part``: ``tasks.part_slice``'s cuts of the key's axes (an alias:
        through its stored block, which ``transpose(order)`` makes it). ``rank``: only the
        runs that rank holds, found from its own pieces alone (a sender's share: its work
        does not grow with the block's pieces). Structure alone decides, so runs are kept
        (read-only arrays; the first asked out first beyond RUNS_BYTES per array):
        mpi-collective asks the same ones in every CCSD iteration."""
        memo = (key, part, rank)
        with self._runs_lock:
            runs = self._runs.get(memo)
        if runs is not None:
            return runs
        runs = self._piece_runs(key, part, rank)
        size = sum(a.nbytes for a in runs[3:])
        with self._runs_lock:
            while self._runs and self._runs_bytes + size > RUNS_BYTES:
                old = self._runs.pop(next(iter(self._runs)))
                self._runs_bytes -= sum(a.nbytes for a in old[3:])
            if size <= RUNS_BYTES and memo not in self._runs:
                self._runs[memo] = runs
                self._runs_bytes += size
        return runs

    def _piece_runs(self, key, part, rank) -> "PieceRuns":
        key, order = self.aliases.get(key, (key, None))
        shape = self.layout.block_shape(key)
        lo, hi = [0] * len(shape), list(shape)
        for n in range(0, len(part or ()), 3):
            axis, a, b = part[n:n + 3]
            axis = order[axis] if order is not None else axis
            lo[axis], hi[axis] = a, b
        pieces = self._place.pieces_of(key) if rank is None else self._place.pieces_held(key, rank)
        runs = part_runs(pieces, shape, lo, hi)
        for a in runs:
            a.flags.writeable = False
        return PieceRuns(key, order, tuple(b - a for a, b in zip(lo, hi)), *runs)

    def piece_table(self, keys) -> tuple:
        """(index into ``keys``, rank, elements) of every piece of the blocks ``keys`` (an
        alias: its stored block's, which holds the same elements) of an array stored in
        pieces, vectorised (for cost models: ``backends.stationary``)."""
        return self._place.piece_table([self.aliases.get(k, (k,))[0] for k in keys])

    def block_shape(self, key) -> tuple:
        if key in self.aliases:
            canon, perm = self.aliases[key]
            return tuple(self._slot(canon)[3][p] for p in perm)
        return self._slot(key)[3]

    def block_range(self, key) -> tuple[tuple, tuple]:
        """Global index range [lo, hi) of a block."""
        k = self._key(key)
        return self.layout.block_range(k)

    def nbytes_local(self) -> int:
        return self._local_count * self.itemsize

    def __repr__(self) -> str:
        return (f"GlobalArray({self.name!r}, shape={self.shape}, blocks={self._place.nblocks}, "
                f"dtype={self.dtype}, distribution={self.distribution!r})")

    # -- key handling -----------------------------------------------------------------
    def _check_live(self) -> None:
        if self._win is None:
            raise RuntimeLayerError(
                f"global array {self.name!r} was freed; expected a live array. Create a new "
                "one, or free it only after its last use (World.stop() frees every array)."
            )

    def _key(self, key):
        self._check_live()
        k = self.layout.normalize_key(key)
        if k not in self.layout and k not in self.aliases:
            raise RuntimeLayerError(
                f"block {k} does not exist in global array {self.name!r} (it stores "
                f"{self._place.nblocks} of the blocks of its tile grid); expected one of its keys, "
                "see ga.keys."
            )
        return k

    def _slot(self, key):
        try:
            return self._slots[key]
        except (KeyError, TypeError):
            return self._slots[self._key(key)]

    def _as_block(self, a, shape: tuple, what: str, scale=1.0) -> np.ndarray:
        if (scale == 1.0 and type(a) is np.ndarray and a.dtype == self.dtype
                and a.shape == shape and a.flags.c_contiguous):
            return a
        arr = np.asarray(a)
        if arr.shape != shape:
            raise RuntimeLayerError(
                f"{what} on global array {self.name!r}: data of shape {arr.shape} does not "
                f"match the target of shape {shape}; expected an array of exactly that shape."
            )
        if scale != 1.0:
            if self.dtype.kind in "iu":
                if np.iscomplexobj(scale) or float(scale) != int(scale):
                    raise RuntimeLayerError(
                        f"{what} on integer global array {self.name!r} with scale {scale}; "
                        "expected an integer scale."
                    )
                scale = int(scale)
            arr = arr * scale
        if not np.can_cast(arr.dtype, self.dtype, casting="same_kind"):
            raise RuntimeLayerError(
                f"{what} on global array {self.name!r}: data of dtype {arr.dtype}"
                f"{' (after scaling)' if scale != 1.0 else ''} cannot be stored as "
                f"{self.dtype} without losing information; convert it first."
            )
        return np.ascontiguousarray(arr, dtype=self.dtype)

    # -- blocks -----------------------------------------------------------------------
    def _flush(self, target: int) -> None:
        self._win.Flush(target)
        self._epochs[target] += 1

    def get(self, key) -> np.ndarray:
        """A copy of one block."""
        if key in self.aliases:
            canon, perm = self.aliases[key]
            return self.get(canon).transpose(perm)
        t0 = perf_counter()
        owner, target, tspec, shape, count, nbytes, view = self._slot(key)
        if tspec is None:
            return self._pieced("get", key, None, 1.0, True)
        if view is not None:
            self._exp.sync_memory()
            out = view.copy()
        else:
            out = np.empty(shape, self.dtype)
            self._win.Get([out, count, self._mpitype], target, tspec)
            self._win.Flush(target)
            self._epochs[target] += 1
        self._log.add("get", owner, nbytes, perf_counter() - t0)
        return out

    def iget(self, key) -> Handle:
        """Start fetching one block; handle.wait() returns it."""
        t0 = perf_counter()
        key, perm = self.aliases.get(key, (key, None))
        owner, target, tspec, shape, count, nbytes, view = self._slot(key)
        if tspec is None:
            h = self._pieced("get", key, None, 1.0, False)
            h._perm = perm
            return h
        if view is not None:
            self._exp.sync_memory()
            h = Handle(self, "get", view.copy(), (), [(owner, nbytes)], perm=perm)
        else:
            out = np.empty(shape, self.dtype)
            self._win.Get([out, count, self._mpitype], target, tspec)
            h = Handle(self, "get", out, ((target, self._epochs[target]),), [(owner, nbytes)], perm=perm)
        self._log.add("get", owner, nbytes, perf_counter() - t0)
        return h

    def _stored(self, key, a) -> tuple:
        """(stored key, ``a`` in its axis order) for a write to alias ``key``."""
        canon, perm = self.aliases[key]
        return canon, np.asarray(a).transpose(np.argsort(perm))

    def put(self, key, a) -> None:
        """Overwrite one block with a (same shape)."""
        if key in self.aliases:
            return self.put(*self._stored(key, a))
        t0 = perf_counter()
        owner, target, tspec, shape, count, nbytes, view = self._slot(key)
        if tspec is None:
            return self._pieced("put", key, a, 1.0, True)
        buf = self._as_block(a, shape, "put")
        if view is not None:
            view[...] = buf
            self._exp.sync_memory()
        else:
            self._win.Put([buf, count, self._mpitype], target, tspec)
            self._win.Flush(target)
            self._epochs[target] += 1
        self._log.add("put", owner, nbytes, perf_counter() - t0)

    def acc(self, key, a, scale=1.0) -> None:
        """Block += scale * a, atomically per element."""
        if key in self.aliases:
            return self.acc(*self._stored(key, a), scale)
        t0 = perf_counter()
        owner, target, tspec, shape, count, nbytes, _ = self._slot(key)
        if tspec is None:
            return self._pieced("acc", key, a, scale, True)
        buf = self._as_block(a, shape, "acc", scale)
        self._win.Accumulate([buf, count, self._mpitype], target, tspec, self._SUM)
        self._win.Flush(target)
        self._epochs[target] += 1
        self._log.add("acc", owner, nbytes, perf_counter() - t0)

    def iacc(self, key, a, scale=1.0) -> Handle:
        """Start block += scale * a; handle.wait() completes it at the target."""
        if key in self.aliases:
            return self.iacc(*self._stored(key, a), scale)
        t0 = perf_counter()
        owner, target, tspec, shape, count, nbytes, _ = self._slot(key)
        if tspec is None:
            return self._pieced("acc", key, a, scale, False)
        buf = self._as_block(a, shape, "iacc", scale)
        self._win.Accumulate([buf, count, self._mpitype], target, tspec, self._SUM)
        h = Handle(self, "acc", None, ((target, self._epochs[target]),), [(owner, nbytes)],
                   keep=buf)
        self._log.add("acc", owner, nbytes, perf_counter() - t0)
        return h

    # -- owner-local work and collectives ---------------------------------------------
    def local_view(self, key) -> np.ndarray:
        """Writable view of a block this rank owns (direct memory, no copy)."""
        if key in self.aliases:
            canon, perm = self.aliases[key]
            return self.local_view(canon).transpose(perm)
        owner, _, tspec, _, _, _, view = self._slot(key)
        if tspec is None:
            raise RuntimeLayerError(
                f"block {key} of global array {self.name!r} is stored in pieces on several ranks; "
                "no rank holds it whole. Use get() / put() / acc().")
        if owner != self.world.rank:
            raise RuntimeLayerError(
                f"block {key} of global array {self.name!r} is owned by rank {owner}, not by "
                f"rank {self.world.rank}; local_view needs an owned block (see local_keys()). "
                "Use get() for remote blocks."
            )
        return view

    def apply_local(self, fn) -> dict:
        """Call fn(key, view) on every owned block (views are writable, in place);
        returns {key: result}. Not collective; call sync() before others read."""
        self._check_live()
        self._exp.sync_memory()
        out = {}
        for key in self._local_keys:
            out[key] = fn(key, self._slots[key][6])
        self._exp.sync_memory()
        return out

    def local_run(self) -> np.ndarray:
        """This rank's memory as one writable vector (its blocks or pieces one after the
        other: ``local_keys`` / ``local_pieces`` order); not collective."""
        self._check_live()
        self._exp.sync_memory()
        return self._local

    def local_pieces(self) -> list:
        """[(key, first element in the block, elements), ...] of ``local_run``, in order:
        this rank's pieces, or its whole blocks."""
        if self.pieces > 1:
            return self._place.local_pieces(self.world.rank)
        return [(k, 0, self._slots[k][4]) for k in self._local_keys]

    def same_layout(self, other: "GlobalArray") -> bool:
        """Whether ``other`` puts every element where this array does (one placement
        object: arrays of one structure and placement share it)."""
        return other._place is self._place

    def home_keys(self) -> list:
        """The keys whose home (owner; first piece) is this rank, in key order."""
        if self.pieces > 1:
            return self._place.home_keys(self.world.rank)
        return sorted(self._local_keys)

    def clear_local(self) -> None:
        """Set this rank's memory (its blocks and pieces) to zero; not collective."""
        self._check_live()
        self._exp.sync_memory()
        self._local[:] = 0
        self._exp.sync_memory()

    def sync(self) -> None:
        """Collective: complete this rank's outstanding operations, then barrier, so that
        every update issued before sync() is visible to every rank after it."""
        self._check_live()
        t0 = perf_counter()
        self._win.Flush_all()
        self._epochs = [e + 1 for e in self._epochs]
        self._exp.sync_memory()
        self.world.comm.Barrier()
        self._exp.sync_memory()
        self._log.add("sync", -1, 0, perf_counter() - t0)

    fence = sync

    def zero(self) -> None:
        """Collective: set every block to zero."""
        self.sync()
        self._local[:] = 0
        self.sync()

    def free(self) -> None:
        """Collective: release the window. Using the array afterwards is an error."""
        if self._win is None:
            return
        self._exp.free()
        self._win = None
        self._local = np.zeros(0, self.dtype)
        self._slots = {}
        self.world._unregister(self)
