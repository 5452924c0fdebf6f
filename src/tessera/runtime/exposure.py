"""Exposing memory for RMA: one collective call gives each worker a region that every
rank can reach with get/put/accumulate/fetch-and-op.

Where the bytes live and whom an operation targets depends on the progress mode:

- window "allocate" (progress none/thread): `MPI_Win_allocate` over all ranks; each
  worker's region is its own window memory; target = the worker. MPICH maps the windows
  of same-node ranks into shared memory and serves same-node RMA with loads/stores.
- window "create": `MPI_Win_create` over `MPI_Alloc_mem` memory; every RMA is processed
  by the target's MPI progress engine (as between nodes).
- ghost mode ("shared"): on each node the ghost ranks allocate the node's regions with
  `MPI_Win_allocate_shared` (each ghost holds the regions of the workers it serves,
  contiguously, 64-byte aligned) and expose them with `MPI_Win_create` over all ranks;
  target = the serving ghost, displacement = the worker's offset in the ghost's segment.
  Workers map their own region directly (shared memory) for owner-local access.

`direct` maps every worker whose region is mapped into this process (same node, window
"allocate" via MPI-4.1 MPI_Win_shared_query, or ghost mode's node segments) to that
region: GlobalArray reads and writes those blocks with plain copies, no MPI call. Where
the MPI library predates 4.1 or refuses the query (`shared_query_supported`,
`_shared_region`), only the rank's own region is direct and RMA serves the others.

Windows are locked once (`Lock_all`, MODE_NOCHECK) at creation by the ranks that issue
operations and unlocked at free; all synchronisation is by flush.
"""

from __future__ import annotations

import logging

import numpy as np

from tessera.errors import RuntimeLayerError
from tessera.runtime._mpi import load_mpi

log = logging.getLogger("tessera.runtime")

ALIGN = 64


def _pad(nbytes: int) -> int:
    return (nbytes + ALIGN - 1) // ALIGN * ALIGN


def _info(MPI, kind: str):
    info = MPI.Info.Create()
    info.Set("same_disp_unit", "true")
    info.Set("accumulate_ops", "same_op_no_op")
    if kind == "data":
        info.Set("accumulate_ordering", "none")
    return info


def shared_query_supported(MPI) -> bool:
    """Whether MPI_Win_shared_query may be asked of a window from MPI_Win_allocate: MPI 4.1
    and later (earlier it is erroneous). Without it same-node blocks go through RMA like
    any other (no direct copies), which is correct, only slower on one node."""
    return MPI.Get_version() >= (4, 1)


def _shared_region(win, rank: int):
    """The region of ``rank`` mapped into this process, or None (not shared, or the MPI
    library refuses the query: then RMA serves it)."""
    try:
        buf, _ = win.Shared_query(rank)
    except Exception as exc:        # mpi4py's MPI.Exception: an MPI that cannot answer
        log.debug("MPI_Win_shared_query(%d) failed (%s); RMA serves that rank's blocks", rank, exc)
        return None
    return buf if len(buf) else None


class Exposure:
    """Worker side of one exposed memory: the window, per-worker target and base
    displacement (in units of `itemsize`), and a writable view of this worker's region."""

    def __init__(self, world, nbytes: int, itemsize: int, kind: str = "data"):
        MPI = load_mpi()
        self._MPI = MPI
        self.world = world
        self.itemsize = itemsize
        self.nbytes = int(nbytes)
        self.win = None
        self._shm = None
        self._mem = None
        self.eid = world._next_exposure_id()
        self.direct: dict = {}  # worker rank -> its region, mapped in this process
        mode = world.options.window
        info = _info(MPI, kind)
        try:
            if mode == "shared":
                self._expose_ghost(MPI, info)
            elif mode == "allocate":
                self.win = MPI.Win.Allocate(self.nbytes, itemsize, info, world._full)
                self.local = np.frombuffer(self.win.tomemory(), dtype=np.uint8)[: self.nbytes]
                self.targets = list(range(world.size))
                self.base = [0] * world.size
                if shared_query_supported(MPI):
                    for w in world._same_node_workers:
                        if w != world.rank:
                            buf = _shared_region(self.win, w)
                            if buf is not None:
                                self.direct[w] = np.frombuffer(buf, dtype=np.uint8)
            else:  # create
                if self.nbytes:
                    self._mem = MPI.Alloc_mem(self.nbytes)
                    self.win = MPI.Win.Create(self._mem, itemsize, info, world._full)
                    self.local = np.frombuffer(self._mem, dtype=np.uint8)
                else:
                    self.win = MPI.Win.Create(MPI.BOTTOM, itemsize, info, world._full)
                    self.local = np.zeros(0, dtype=np.uint8)
                self.targets = list(range(world.size))
                self.base = [0] * world.size
        finally:
            info.Free()
        model = self.win.Get_attr(MPI.WIN_MODEL)
        if model is not None and model != MPI.WIN_UNIFIED:  # pragma: no cover - MPICH is unified
            raise RuntimeLayerError(
                "this MPI library gives RMA windows the 'separate' memory model; Tessera needs "
                "the 'unified' model for owner-local access. Use MPICH (the `mpich` wheel)."
            )
        self.direct[world.rank] = self.local
        self.win.Lock_all(MPI.MODE_NOCHECK)
        if self._shm is not None:
            self._shm.Lock_all(MPI.MODE_NOCHECK)

    def _expose_ghost(self, MPI, info) -> None:
        world = self.world
        sizes = world.comm.allgather(_pad(self.nbytes))
        if world.rank == 0:
            world._command(("expose", self.eid, self.itemsize, sizes))
        self._shm = MPI.Win.Allocate_shared(0, self.itemsize, info, world._node_all)
        buf, _ = self._shm.Shared_query(world._my_ghost_node_rank)
        offsets = world._ghost_offsets(sizes)
        start = offsets[world.rank]
        seg = np.frombuffer(buf, dtype=np.uint8)
        self.local = seg[start : start + self.nbytes]
        self.win = MPI.Win.Create(MPI.BOTTOM, self.itemsize, info, world._full)
        self.targets = list(world._ghost_of)
        self.base = [off // self.itemsize for off in offsets]
        segments = {}
        for w in world._same_node_workers:
            g = world._ghost_node_rank[w]
            if g not in segments:
                gbuf, _ = self._shm.Shared_query(g)
                segments[g] = np.frombuffer(gbuf, dtype=np.uint8)
            self.direct[w] = segments[g][offsets[w] : offsets[w] + sizes[w]]

    def sync_memory(self) -> None:
        """Memory barrier between owner-local loads/stores and RMA (MPI_Win_sync)."""
        if self._shm is not None:
            self._shm.Sync()
        self.win.Sync()

    def free(self) -> None:
        """Collective over the workers (and, in ghost mode, the ghosts)."""
        if self.win is None:
            return
        MPI = self._MPI
        world = self.world
        self.win.Flush_all()
        self.win.Unlock_all()
        if self._shm is not None:
            self._shm.Unlock_all()
            if world.rank == 0:
                world._command(("free", self.eid))
        self.local = np.zeros(0, dtype=np.uint8)
        self.direct = {}
        self.win.Free()
        self.win = None
        if self._shm is not None:
            self._shm.Free()
            self._shm = None
        if self._mem is not None:
            MPI.Free_mem(self._mem)
            self._mem = None


class GhostExposure:
    """Ghost side of an Exposure: allocate the served workers' regions in node shared
    memory and expose them to all ranks. Created by the ghost serve loop."""

    def __init__(self, world, itemsize: int, sizes: list):
        MPI = load_mpi()
        seg = sum(sizes[w] for w in world._served)
        info = _info(MPI, "data")
        try:
            self._shm = MPI.Win.Allocate_shared(seg, itemsize, info, world._node_all)
            buf, _ = self._shm.Shared_query(world._node_all.Get_rank())
            memory = buf if seg else MPI.BOTTOM
            self.win = MPI.Win.Create(memory, itemsize, info, world._full)
        finally:
            info.Free()
        self.nbytes = seg

    def free(self) -> None:
        self.win.Free()
        self._shm.Free()
