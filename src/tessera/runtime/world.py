"""The MPI world of one process: communicators, progress mode, ghost ranks, clean stop.

`World.get()` starts the world on first call (initialising MPI if needed) and returns
the same object afterwards. Without `mpiexec` MPICH runs as a singleton: one rank.

Nodes are the ranks that share memory (MPI_COMM_TYPE_SHARED), or, with
TESSERA_EMULATE_NODES=N, N blocks of consecutive ranks: no shared window and no direct
copy between ranks of different emulated nodes (with MPICH's MPIR_CVAR_NOLOCAL=1 nothing
goes through shared memory), so multi-node paths run on one machine. Progress "auto"
(the default) becomes ghost progress, one ghost per node, when the ranks span more than
one node, else none. Before anything else the rank count MPI reports is checked against
the launcher's (runtime/launch.py).

User code sees only the worker ranks: `world.comm` (== `world.workers`), `world.rank`
and `world.size` refer to the workers in every mode. In ghost mode the ghost ranks run
their serve loop inside `World.get()` and leave the process (SystemExit(0)) when the
workers stop; they never return to user code. `world.full_comm` includes the ghosts
and is for inspection only.

Collectives over the workers (`barrier`, `bcast`, `allreduce`, `allgather`, `gather`,
`alltoallv`) are recorded in `world.comm_log`; `split(color, key)` makes a `Group`
(sub-communicator of the workers, runtime/group.py) whose collectives are recorded too.

`stop()` (collective; also registered with `atexit`) frees every live window, counter
and group, stops the progress thread, releases the ghosts and frees the communicators,
so that MPI_Finalize (run by mpi4py at exit) finds nothing left. A process runs one
World; after `stop()` `World.get()` is an error.
"""

from __future__ import annotations

import atexit
import logging
import os
import pickle
import sys
import time

import numpy as np

from tessera.errors import RuntimeLayerError
from tessera.runtime._mpi import SubarrayTypes, load_mpi
from tessera.runtime.alltoallv import alltoallv as chunked_alltoallv
from tessera.profile.commlog import CommLog
from tessera.runtime.group import Group, allreduce_on, allreduce_peers
from tessera.runtime.launch import check_world_size
from tessera.runtime.options import ENV_EMULATE_NODES, ENV_GHOSTS, RuntimeOptions
from tessera.runtime.progress import CONTROL_TAG, GhostServer, ProgressThread

log = logging.getLogger("tessera.runtime")

_HEAVY_YIELD = "MPIR_CVAR_ENABLE_HEAVY_YIELD"


class World:
    """Communicators and run state of the MPI ranks of one run (see module docstring)."""

    _current: "World | None" = None
    _stopped: bool = False

    @classmethod
    def get(cls, progress: str | None = None, ghosts: int | None = None,
            window: str | None = None, abort_on_error: bool = True) -> "World":
        """The process's World, started on first call (collective then).

        progress, ghosts, window: see RuntimeOptions (defaults from TESSERA_PROGRESS,
        TESSERA_GHOSTS, TESSERA_WINDOW). On later calls explicit options must match.
        """
        if cls._current is not None:
            cur = cls._current.options
            asked = {"progress": progress, "ghosts": ghosts, "window": window}
            for name, value in asked.items():
                if value is not None and value != getattr(cur, name):
                    raise RuntimeLayerError(
                        f"World.get({name}={value!r}) but this process's world already runs "
                        f"with {name}={getattr(cur, name)!r}; options are fixed when the world "
                        "starts. Call World.get() without options, or set them on the first call."
                    )
            return cls._current
        if cls._stopped:
            raise RuntimeLayerError(
                "the World of this process was stopped; a process runs one World (MPI cannot "
                "be restarted). Start a new process for a new run."
            )
        options = RuntimeOptions.resolve(progress, ghosts, window, abort_on_error)
        world = cls(options)
        cls._current = world
        try:
            world._start()
        except BaseException:
            cls._current = None
            raise
        return world

    @classmethod
    def current(cls) -> "World | None":
        """The running World, or None (does not start one)."""
        return cls._current

    def __init__(self, options: RuntimeOptions):
        self.options = options
        self.comm_log = CommLog()
        self.is_ghost = False
        self.stopped = False
        self._live: dict = {}
        self._exposure_ids = 0
        self._progress = None
        self._types = SubarrayTypes()
        self._old_excepthook = None
        self._comms: list = []
        self._groups: list = []          # live Groups (split), freed at stop()

    # -- start ------------------------------------------------------------------------
    def _start(self) -> None:
        if self.options.progress == "thread" and "mpi4py.MPI" not in sys.modules:
            # MPICH's progress loop holds its lock while it spins; without this the
            # helper thread starves the main thread's own MPI calls (a 1 MiB get from a
            # busy rank waited ~600 ms instead of ~40 ms on 2 cores). Ignored by other MPIs.
            if os.environ.setdefault(_HEAVY_YIELD, "1") == "1":
                log.debug("progress thread: %s=1 (nanosleep in MPICH lock yields)", _HEAVY_YIELD)
        MPI = load_mpi()
        self._MPI = MPI
        check_world_size(MPI.COMM_WORLD.Get_size())     # never N one-rank copies
        self._full = MPI.COMM_WORLD.Dup()
        self._ctrl = MPI.COMM_WORLD.Dup()
        self._comms += [self._full, self._ctrl]
        self.full_comm = self._full
        self.full_rank = self._full.Get_rank()
        self.full_size = self._full.Get_size()
        self.thread_level = MPI.Query_thread()
        self._node_all = self._split_nodes(MPI)
        self._comms.append(self._node_all)

        nrank, nsize = self._node_all.Get_rank(), self._node_all.Get_size()
        leaders = self._node_all.bcast(self.full_rank, root=0)
        nnodes = len(set(self._full.allgather(leaders)))
        # ghost ranks serve their node through MPI shared memory: every node needs a worker
        # beside its ghost and memory that MPI can share among the node's ranks
        probe = self._node_all.Split_type(MPI.COMM_TYPE_SHARED)
        shares = self._full.allreduce(probe.Get_size() == nsize, op=MPI.LAND)
        probe.Free()
        auto = self.options.progress == "auto"
        self.options = opts = self.options.on_nodes(
            nnodes, shares and self._full.allreduce(nsize > 1, op=MPI.LAND))
        if opts.progress == "ghost" and not shares:
            self._free_comms()
            raise RuntimeLayerError(
                "ghost progress needs MPI shared memory among the ranks of a node, but this MPI "
                "shares none between them (MPIR_CVAR_NOLOCAL=1, or TESSERA_EMULATE_NODES across "
                "real nodes); unset that, or use TESSERA_PROGRESS=none|thread."
            )
        if auto and opts.progress == "none" and nnodes > 1 and self.full_rank == 0:
            log.warning("the ranks span %d nodes but some node has one rank or no shared memory, so no "
                        "ghost progress: a rank busy computing delays one-sided operations on its data "
                        "from other nodes; start two or more ranks per node (docs/cluster.md)", nnodes)
        self.is_ghost = opts.ghosts > 0 and nrank >= nsize - opts.ghosts
        ok = nsize > opts.ghosts
        all_ok = self._full.allreduce(ok, op=MPI.LAND)
        if not all_ok:
            sizes = self._full.allgather(nsize)
            self._free_comms()
            raise RuntimeLayerError(
                f"{ENV_GHOSTS}={opts.ghosts} ghost rank(s) per node leaves no worker on a node "
                f"(ranks per node: {sorted(set(sizes))}); expected fewer ghosts than ranks on "
                "every node. Lower TESSERA_GHOSTS or start more ranks per node."
            )
        color = 1 if self.is_ghost else 0
        if opts.ghosts:
            self.workers = self._full.Split(color, self.full_rank)
        else:
            self.workers = self._full.Dup()
        self._comms.append(self.workers)
        self.comm = self.workers
        self.rank = self.workers.Get_rank()
        self.size = self.workers.Get_size()
        self.comm_log.rank = self.rank
        # Per full rank: (is_ghost, node leader, worker rank or -1, node rank).
        table = self._full.allgather((self.is_ghost, leaders,
                                      -1 if self.is_ghost else self.rank, nrank))
        self._map_ghosts(table)
        self._same_node_workers = [t[2] for t in table if t[1] == leaders and not t[0]]
        nodes = sorted({t[1] for t in table})
        self.node_of = [0] * sum(1 for t in table if not t[0])  # worker rank -> node index
        for ghost, leader, wrank, _ in table:
            if not ghost:
                self.node_of[wrank] = nodes.index(leader)
        if self.is_ghost:
            self.node_comm = None
            self.nnodes = len({t[1] for t in table})
            self._serve_as_ghost()  # raises SystemExit
        self.node_comm = self.workers.Split(self.node_of[self.rank], self.rank)
        self._comms.append(self.node_comm)
        self.nnodes = len({t[1] for t in table})
        if opts.progress == "thread":
            self._progress = ProgressThread(self._full)
            self._progress.start()
        if opts.abort_on_error and self.full_size > 1:
            self._install_excepthook()
        atexit.register(self._atexit)
        log.info("world started: %d worker rank(s), %d ghost(s), %d node(s), progress=%s, "
                 "window=%s", self.size, self.full_size - self.size, self.nnodes,
                 opts.progress, opts.window)

    def _split_nodes(self, MPI):
        """The communicator of this rank's node: the ranks that share memory, or with
        TESSERA_EMULATE_NODES=N the N blocks of consecutive ranks (all ranks on one machine,
        whatever MPI says of their locality: MPIR_CVAR_NOLOCAL=1 makes every rank its own)."""
        n = self.options.emulate_nodes
        if not n:
            return self._full.Split_type(MPI.COMM_TYPE_SHARED)
        if n > self.full_size:
            self._free_comms()
            raise RuntimeLayerError(
                f"{ENV_EMULATE_NODES}={n} but only {self.full_size} rank(s) run; expected at most "
                "one emulated node per rank. Lower it or start more ranks."
            )
        return self._full.Split(self.full_rank * n // self.full_size, self.full_rank)

    @property
    def node_workers(self) -> int:
        """Worker ranks on this rank's node (this one included)."""
        return len(self._same_node_workers)

    def _map_ghosts(self, table) -> None:
        """Who serves whom: ghost g serves the workers of its node round-robin."""
        self._ghost_of: list = []        # worker rank -> full rank of its target ghost
        self._ghost_node_rank: list = []  # worker rank -> that ghost's rank in its node comm
        self._served: list = []           # (ghost only) worker ranks I serve, in order
        if not self.options.ghosts:
            return
        by_node: dict = {}
        for full_rank, (ghost, leader, wrank, nrank) in enumerate(table):
            by_node.setdefault(leader, []).append((full_rank, ghost, wrank, nrank))
        ghost_of = {}
        for members in by_node.values():
            ghosts = [m for m in members if m[1]]
            workers = [m for m in members if not m[1]]
            for i, (_, _, wrank, _) in enumerate(workers):
                g = ghosts[i % len(ghosts)]
                ghost_of[wrank] = (g[0], g[3])
                if g[0] == self.full_rank:
                    self._served.append(wrank)
        nworkers = len(ghost_of)
        self._ghost_of = [ghost_of[w][0] for w in range(nworkers)]
        self._ghost_node_rank = [ghost_of[w][1] for w in range(nworkers)]
        self._worker_order = {}
        for g in set(self._ghost_of):
            self._worker_order[g] = [w for w in range(nworkers) if self._ghost_of[w] == g]
        if not self.is_ghost:
            self._my_ghost_node_rank = self._ghost_node_rank[self.workers.Get_rank()]

    def _ghost_offsets(self, sizes: list) -> list:
        """Byte offset of each worker's region inside its ghost's segment."""
        offsets = [0] * len(sizes)
        for order in self._worker_order.values():
            acc = 0
            for w in order:
                offsets[w] = acc
                acc += sizes[w]
        return offsets

    def _serve_as_ghost(self) -> None:
        log.debug("rank %d is a ghost serving workers %s", self.full_rank, self._served)
        server = GhostServer(self)
        try:
            server.serve()
            self._full.Barrier()
        finally:
            self._free_comms()
            self.stopped = True
            World._stopped = True
        raise SystemExit(0)

    # -- runtime-internal hooks -------------------------------------------------------
    def _command(self, cmd) -> None:
        """Worker 0 only: send a command to every ghost (in order)."""
        for g in sorted(set(self._ghost_of)):
            self._ctrl.send(cmd, dest=g, tag=CONTROL_TAG)

    def _next_exposure_id(self) -> int:
        self._check_running()
        self._exposure_ids += 1
        return self._exposure_ids

    def _register(self, obj) -> None:
        self._live[id(obj)] = obj

    def _unregister(self, obj) -> None:
        self._live.pop(id(obj), None)

    def _check_running(self) -> None:
        if self.stopped:
            raise RuntimeLayerError(
                "the world was stopped; no window, counter or collective can be used after "
                "World.stop(). Keep the world running until the end of the run."
            )

    # -- stop -------------------------------------------------------------------------
    def abort(self, code: int = 1) -> None:
        """End every process of the run now (MPI_Abort over all ranks, ghosts included):
        for an error raised on some ranks only, which would leave the others waiting."""
        self._full.Abort(int(code))

    def stop(self) -> None:
        """Collective over the workers: free live windows, stop progress, release ghosts."""
        if self.stopped or self.is_ghost:
            return
        for obj in sorted(self._live.values(), key=lambda o: o.eid):
            obj.free()
        self._types.clear()
        for group in list(self._groups):
            group.free()
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
        if self.options.ghosts:
            if self.rank == 0:
                self._command(("stop",))
            self._full.Barrier()
        else:
            self._full.Barrier()
        self._free_comms()
        self.stopped = True
        World._stopped = True
        World._current = None
        if self._old_excepthook is not None:
            sys.excepthook = self._old_excepthook
            self._old_excepthook = None
        log.info("world stopped")

    def _atexit(self) -> None:
        if not self.stopped and not self._MPI.Is_finalized():
            self.stop()

    def _free_comms(self) -> None:
        for c in reversed(self._comms):
            if c is not None and c != self._MPI.COMM_NULL:
                c.Free()
        self._comms = []

    def _install_excepthook(self) -> None:
        old = sys.excepthook
        full = self._full

        def hook(exc_type, exc, tb):
            old(exc_type, exc, tb)
            log.critical("uncaught %s on rank %d; aborting all ranks (MPI_Abort)",
                         exc_type.__name__, self.full_rank)
            full.Abort(1)

        self._old_excepthook = old
        sys.excepthook = hook

    # -- recorded collectives over the workers ----------------------------------------
    def barrier(self) -> None:
        self._check_running()
        t0 = time.perf_counter()
        self.comm.Barrier()
        self.comm_log.add("barrier", -1, 0, time.perf_counter() - t0)

    def bcast(self, obj, root: int = 0):
        """Broadcast an ndarray in place (same shape/dtype on all ranks) or any object."""
        self._check_running()
        t0 = time.perf_counter()
        if isinstance(obj, np.ndarray):
            self.comm.Bcast(obj, root=root)
            nbytes, out = obj.nbytes, obj
        else:
            data = pickle.dumps(obj, pickle.HIGHEST_PROTOCOL) if self.rank == root else None
            data = self.comm.bcast(data, root=root)
            nbytes = len(data)
            out = obj if self.rank == root else pickle.loads(data)
        self.comm_log.add("bcast", root, nbytes, time.perf_counter() - t0,
                          peers=None if self.rank == root else [(root, nbytes)])
        return out

    def allreduce(self, value, op: str = "sum"):
        """Element-wise reduction of an ndarray (returns a new array) or a scalar."""
        self._check_running()
        t0 = time.perf_counter()
        out, nbytes = allreduce_on(self.comm, self._MPI, value, op)
        self.comm_log.add("allreduce", -1, nbytes, time.perf_counter() - t0,
                          peers=allreduce_peers(range(self.size), self.rank, nbytes))
        return out

    def allgather(self, obj) -> list:
        self._check_running()
        t0 = time.perf_counter()
        data = pickle.dumps(obj, pickle.HIGHEST_PROTOCOL)
        parts = self.comm.allgather(data)
        self.comm_log.add("allgather", -1, len(data), time.perf_counter() - t0,
                          peers=[(r, len(p)) for r, p in enumerate(parts) if r != self.rank])
        return [pickle.loads(p) for p in parts]

    def gather(self, obj, root: int = 0):
        """List of every rank's obj on root, None elsewhere."""
        self._check_running()
        t0 = time.perf_counter()
        data = pickle.dumps(obj, pickle.HIGHEST_PROTOCOL)
        parts = self.comm.gather(data, root=root)
        self.comm_log.add("gather", root, len(data), time.perf_counter() - t0,
                          peers=None if parts is None else
                          [(r, len(p)) for r, p in enumerate(parts) if r != root])
        return None if parts is None else [pickle.loads(p) for p in parts]

    def alltoallv(self, send: list, recv_counts: list) -> list:
        """Personalised all-to-all of float64 data over the workers.

        ``send[d]``: the flat float64 array for rank d (every rank, itself included);
        ``recv_counts[s]``: how many elements rank s sends here (the caller knows them,
        e.g. from the structure of the data: a mismatch is an MPI error). Returns
        ``recv[s]`` for every rank s (views into one buffer; ``recv[me]`` is a copy of
        ``send[me]``). Recorded as ``alltoallv`` (peer -1) with the bytes sent to other
        ranks."""
        self._check_running()
        size = self.size
        if len(send) != size or len(recv_counts) != size:
            raise RuntimeLayerError(
                f"alltoallv needs one send array and one receive count per rank ({size}); got "
                f"{len(send)} send array(s) and {len(recv_counts)} count(s)."
            )
        parts = []
        for d, a in enumerate(send):
            a = np.asarray(a)
            if a.dtype != np.float64:
                raise RuntimeLayerError(
                    f"alltoallv sends float64 data; send[{d}] has dtype {a.dtype}. Convert it "
                    "first (a.astype(np.float64))."
                )
            parts.append(a.ravel())
        counts = [int(a.size) for a in parts]
        rc = [int(c) for c in recv_counts]
        if min(rc, default=0) < 0:
            raise RuntimeLayerError(f"alltoallv receive counts must be >= 0, got {rc}.")
        t0 = time.perf_counter()
        rbuf, rdis = chunked_alltoallv(self.comm, self._MPI, parts, rc)   # in rounds above 2^31 elements
        sent = 8 * (sum(counts) - counts[self.rank])
        self.comm_log.add("alltoallv", -1, sent, time.perf_counter() - t0,
                          peers=[(s, 8 * c) for s, c in enumerate(rc) if s != self.rank and c])
        return [rbuf[d:d + c] for d, c in zip(rdis, rc)]

    # -- sub-communicators ------------------------------------------------------------
    def split(self, color: int, key: int = 0) -> Group:
        """Collective over the workers: the group of workers that pass the same ``color``
        (a non-negative int), ranked by ``key`` (ties: World rank). Freed by
        ``Group.free()`` or at ``stop()``. See ``tessera.runtime.group``."""
        self._check_running()
        if not isinstance(color, (int, np.integer)) or isinstance(color, bool) or color < 0:
            raise RuntimeLayerError(
                f"split color must be a non-negative integer, got {color!r}; ranks that pass "
                "the same color form one group."
            )
        if not isinstance(key, (int, np.integer)) or isinstance(key, bool):
            raise RuntimeLayerError(f"split key must be an integer, got {key!r} (it orders the group).")
        comm = self.comm.Split(int(color), int(key))
        group = Group(self, comm, int(color), int(key))
        self._groups.append(group)
        return group

    def _forget_group(self, group) -> None:
        self._groups = [g for g in self._groups if g is not group]

    # -- description ------------------------------------------------------------------
    def describe(self) -> dict:
        """Plain data for logs and reports: sizes and options."""
        opts = self.options.to_dict()
        opts["ghosts_per_node"] = opts.pop("ghosts")
        return {
            "workers": self.size,
            "ranks": self.full_size,
            "ghosts": self.full_size - self.size,
            "nodes": self.nnodes,
            "thread_level": self.thread_level,
            **opts,
        }

    def __repr__(self) -> str:
        return (f"World(rank={getattr(self, 'rank', '?')}, size={getattr(self, 'size', '?')}, "
                f"progress={self.options.progress!r}, ghosts={self.options.ghosts})")
