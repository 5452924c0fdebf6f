"""Asynchronous progress: a helper thread per rank, or ghost ranks that serve RMA.

MPI passive-target operations that the target's MPI library must process (active
messages: anything MPICH cannot do with shared-memory loads/stores or RDMA) complete
only when the target enters MPI. A rank busy in a long BLAS call then stalls every rank
that reads from it.

thread: `ProgressThread` posts a receive from itself on a private communicator and
    waits for it in a helper thread. MPI_Wait releases the GIL for its whole duration
    and MPICH spins its progress engine inside it, so incoming RMA is served while the
    main thread computes, without the helper ever taking the GIL (a Python polling loop
    would make every GIL hand-over of the main thread wait up to the 5 ms switch
    interval). `stop()` sends the matching message and joins. Cost: one core spinning.

ghost: `GhostServer.serve()` is the loop a ghost rank runs inside `World.get()`: it
    blocks in a receive on the control communicator (MPICH again spins progress inside
    it) and executes the workers' commands: expose (join the collective creation of a
    node shared-memory segment and its world window), free, stop.
"""

from __future__ import annotations

import logging
import threading

import numpy as np

from tessera.errors import RuntimeLayerError
from tessera.runtime._mpi import load_mpi

log = logging.getLogger("tessera.runtime")

CONTROL_TAG = 7301
_STOP_TAG = 7302


class ProgressThread:
    """A helper thread that sits in MPI_Wait so MPI progresses while the rank computes."""

    def __init__(self, comm):
        MPI = load_mpi()
        if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
            raise RuntimeLayerError(
                "progress mode 'thread' needs MPI_THREAD_MULTIPLE but MPI was initialised "
                f"with thread level {MPI.Query_thread()}; do not initialise MPI yourself with "
                "a lower level (mpi4py.rc.thread_level), or use TESSERA_PROGRESS=none|ghost."
            )
        self._MPI = MPI
        self._comm = comm.Dup()
        self._rbuf = np.zeros(1, dtype=np.int8)
        self._sbuf = np.zeros(1, dtype=np.int8)
        self._req = None
        self._thread = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        me = self._comm.Get_rank()
        self._req = self._comm.Irecv(self._rbuf, source=me, tag=_STOP_TAG)
        self._thread = threading.Thread(target=self._req.Wait, name="tessera-progress",
                                        daemon=True)
        self._thread.start()
        log.debug("progress thread started")

    def stop(self) -> None:
        if self._thread is None:
            return
        self._comm.Send(self._sbuf, dest=self._comm.Get_rank(), tag=_STOP_TAG)
        self._thread.join()
        self._thread = None
        self._comm.Free()
        log.debug("progress thread stopped")


class GhostServer:
    """The serve loop of a ghost rank; returns when the workers send 'stop'."""

    def __init__(self, world):
        from tessera.runtime.exposure import GhostExposure

        self._world = world
        self._make = GhostExposure
        self.exposures: dict = {}
        self.commands = 0

    def serve(self) -> None:
        MPI = load_mpi()
        ctrl = self._world._ctrl
        while True:
            cmd = ctrl.recv(source=MPI.ANY_SOURCE, tag=CONTROL_TAG)
            self.commands += 1
            kind = cmd[0]
            if kind == "expose":
                _, eid, itemsize, sizes = cmd
                self.exposures[eid] = self._make(self._world, itemsize, sizes)
            elif kind == "free":
                self.exposures.pop(cmd[1]).free()
            elif kind == "stop":
                break
            else:  # pragma: no cover - protocol error
                raise RuntimeLayerError(f"ghost rank received unknown command {kind!r}.")
        for eid in sorted(self.exposures):
            self.exposures.pop(eid).free()
        log.debug("ghost served %d commands", self.commands)
