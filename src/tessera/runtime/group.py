"""A sub-communicator of the worker ranks, made by `World.split(color, key)`.

`Group` wraps an MPI communicator over some of the workers (those that passed the same
`color`, ordered by `key`, ties by World rank) with the few collectives the executors
need: `bcast` of an ndarray in place, `allreduce`, `barrier`. Every call is recorded in
the World's comm log like the World's own collectives, with the peer given as a World
rank (the root's World rank for `bcast`, -1 for the others), so per-rank accounting
does not depend on which group a call ran in. A one-rank group records nothing (it
moves nothing).

Creating and freeing are collective over the group's members (creation over all
workers). `free()` may be called early; the World frees every group still alive at
`World.stop()`, before its own communicators, so MPI_Finalize finds nothing left.
"""

from __future__ import annotations

import time

import numpy as np

from tessera.errors import RuntimeLayerError

REDUCE_OPS = ("sum", "prod", "max", "min", "land", "lor", "band", "bor")


def reduce_op(MPI, op: str):
    """The MPI operation of a reduction name (an error names the valid ones)."""
    if op not in REDUCE_OPS:
        raise RuntimeLayerError(
            f"unknown reduction {op!r}; expected one of {', '.join(REDUCE_OPS)}."
        )
    return getattr(MPI, op.upper())


def allreduce_peers(members, me: int, nbytes: int) -> list:
    """[(peer, bytes received)] of an allreduce of ``nbytes`` per rank over ``members``
    (World ranks), by the reduce-scatter + allgather model: 2 * nbytes / p from each other
    member."""
    members = list(members)
    share = 2 * nbytes // len(members) if members else 0
    return [(m, share) for m in members if m != me] if share else []


def allreduce_on(comm, MPI, value, op: str) -> tuple:
    """(result, bytes per rank) of an element-wise reduction over ``comm``: an ndarray
    (the result is a new array) or a scalar."""
    mpi_op = reduce_op(MPI, op)
    if isinstance(value, np.ndarray):
        src = np.ascontiguousarray(value)
        out = np.empty_like(src)
        comm.Allreduce(src, out, op=mpi_op)
        return out, src.nbytes
    return comm.allreduce(value, op=mpi_op), np.asarray(value).nbytes


class Group:
    """Sub-communicator of the workers (see module docstring)."""

    def __init__(self, world, comm, color: int, key: int):
        self.world = world
        self.color = color
        self.key = key
        self._comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        # group rank -> World rank (one allgather at creation, unrecorded set-up)
        self._world_ranks = [int(r) for r in comm.allgather(world.rank)]
        self.freed = False

    # -- ranks ------------------------------------------------------------------------
    def world_rank(self, r: int) -> int:
        """The World rank of group rank ``r``."""
        if not 0 <= r < self.size:
            raise RuntimeLayerError(
                f"group rank {r} is outside this group of {self.size} rank(s); expected "
                f"0..{self.size - 1}."
            )
        return self._world_ranks[r]

    @property
    def world_ranks(self) -> list:
        """World ranks of the members, in group rank order."""
        return list(self._world_ranks)

    def _check(self) -> None:
        if self.freed:
            raise RuntimeLayerError(
                f"group (color {self.color}) was freed; a group cannot be used after free() or "
                "World.stop(). Make a new one with world.split(color, key)."
            )
        self.world._check_running()

    # -- recorded collectives ---------------------------------------------------------
    def bcast(self, buf: np.ndarray, root: int = 0, op_name: str = "bcast") -> np.ndarray:
        """Broadcast a contiguous ndarray in place from group rank ``root`` (same shape and
        dtype on every member); returns ``buf``. Recorded as ``op_name`` with the root's
        World rank as peer and ``buf.nbytes`` bytes."""
        self._check()
        if not isinstance(buf, np.ndarray) or not buf.flags.c_contiguous:
            raise RuntimeLayerError(
                f"Group.bcast takes a C-contiguous numpy array, got {type(buf).__name__}"
                f"{'' if not isinstance(buf, np.ndarray) else ' (not contiguous)'}; pass "
                "np.ascontiguousarray(x) (objects: use World.bcast)."
            )
        peer = self.world_rank(root)
        if self.size == 1 or buf.size == 0:
            return buf
        t0 = time.perf_counter()
        self._comm.Bcast(buf, root=root)
        self.world.comm_log.add(op_name, peer, buf.nbytes, time.perf_counter() - t0,
                                peers=None if self.rank == root else [(peer, buf.nbytes)])
        return buf

    def allreduce(self, value, op: str = "sum", op_name: str = "allreduce"):
        """Element-wise reduction over the members: an ndarray (returns a new array) or a
        scalar."""
        self._check()
        t0 = time.perf_counter()
        out, nbytes = allreduce_on(self._comm, self.world._MPI, value, op)
        if self.size > 1:
            self.world.comm_log.add(op_name, -1, nbytes, time.perf_counter() - t0,
                                    peers=allreduce_peers(self._world_ranks, self.world.rank, nbytes))
        return out

    def barrier(self) -> None:
        self._check()
        t0 = time.perf_counter()
        self._comm.Barrier()
        if self.size > 1:
            self.world.comm_log.add("barrier", -1, 0, time.perf_counter() - t0)

    # -- lifetime ---------------------------------------------------------------------
    def free(self) -> None:
        """Collective over the members; a second call does nothing."""
        if self.freed:
            return
        self.freed = True
        self.world._forget_group(self)
        if not self.world._MPI.Is_finalized():
            self._comm.Free()
        self._comm = None

    def __repr__(self) -> str:
        return (f"Group(color={self.color}, rank={self.rank}, size={self.size}, "
                f"world_ranks={self._world_ranks}{', freed' if self.freed else ''})")
