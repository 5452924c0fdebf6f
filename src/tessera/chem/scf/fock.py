"""The two-electron Fock build G(D) = J(D) - K(D)/2 as a task set of the engine.

GTFock's scheme (Liu, Patel, Chow, IPDPS 2014, Sec. III) on Tessera's task layer: the
density D and the Fock accumulator M are BlockTensors over one index space whose tiles
are the shell blocks, created inside the run's context (distributed over the ranks
under MPI, local otherwise). Each build

1. every rank writes the lower density tiles (x >= y) it owns from the replicated
   density matrix (no message);
2. runs the block-quartet tasks as a ``TaskSet`` on the context (``Context.run_tasks``):
   under ``mpi-onesided`` dealt by the engine's scheduler with the SCF's schedule
   (static: GTFock's contiguous cost-balanced ranges, for density-tile locality; nxtval,
   largest first; steal: that partition plus stealing half of a victim's queue); a task asks for the
   density tiles it reads that this build has not fetched yet; contributions go to
   per-thread tile buffers;
3. every rank accumulates its buffers into M, once per tile; after a sync every rank
   reads M whole (O(nao^2)) and forms G = (M + M^T)/2.

``mode="direct"`` (the SCF's direct mode only without the compiled fill; with it,
``direct.DirectFock``) recomputes the integrals every build, *incrementally*: a build after
the first computes G(D - D_last) and adds it to the last G (the difference of two SCF
densities is small, so more tasks fall below the screening threshold), and every
``rebuild_every`` + 1-th build is a full G(D) again, which bounds the error the skipped
contributions accumulate (PySCF's direct SCF does the same, ``rebuild_nsteps``).
Screening is density-weighted at the task level (Haser and Ahlrichs 1989, as PySCF's
``CVHFnrs8_prescreen``): a task (AB|CD) runs only when
max Q_AB max Q_CD max(4|D_AB|, 4|D_CD|, |D_AC|, |D_BD|, |D_AD|, |D_BC|) reaches the
threshold (max |D| over each density tile of the density the build contracts); inside a
task the same bound is evaluated per *shell quartet* (max |D| over each shell pair's
functions, with the Schwarz bound Q_ab Q_cd; ``quartet_screen``), and libcint computes,
per shell a, only the box of shells that holds a's surviving quartets when these boxes
hold at most ``BOX_FRACTION`` of the block (``screened_block``; the rest of the block is
never computed). The task's work, and so G, depends only on the density, not on the
task partition or the rank count.

``mode="incore"`` keeps, on each rank, the screened integral blocks of the tasks it runs
in the first build, and later builds replay exactly those tasks (no scheduling). The first
build deals its tasks statically (``first_build_homes``: the engine's contiguous
cost-balanced partition, whatever the schedule), so each rank's share of the integrals
is known before any is computed: ``incore_shares``. If a rank's share does not fit its
memory budget (``incore.fits``), the SCF stops with an error instead of switching to
direct; ``mode="auto"`` is incore when every rank's share fits its budget, else direct.
(This is the in-memory mode over ranks without the compiled fill only; with it, and on
one process, the 8-fold integrals are kept instead: ``incore.IncoreFock``.)

Threads: each task's libcint call runs ``threads`` OpenMP threads (the caller chooses
them so that ranks x workers x threads <= cores).
"""

from __future__ import annotations

import threading
import time

import numpy as np
from pyscf.lib import with_omp_threads

from tessera.backends.context import thread_limit
from tessera.backends.registry import check_schedule
from tessera.backends.schedule import partition
from tessera.backends.tasks import TaskSet
from tessera.chem.scf.blocking import make_blocks
from tessera.chem.scf.incore import fits
from tessera.chem.scf.integrals import BlockERI, schwarz_bounds
from tessera.chem.scf.kernel import contract_block
from tessera.chem.scf.tasks import PARTIAL, TaskList, make_tasks
from tessera.errors import InputError
from tessera.tensor.block_tensor import BlockTensor
from tessera.tensor.space import IndexSpace, Tile

MODES = ("auto", "direct", "incore")
#: Default Schwarz threshold of the task builds.
SCREENING = 1e-12
#: Direct mode: incremental builds between two full builds (PySCF's rebuild_nsteps).
REBUILD_EVERY = 5
#: Direct builds: a task's shell-quartet screen computes boxes of shells instead of the
#: whole block when they hold at most this fraction of its integrals.
BOX_FRACTION = 0.75
_DEAL_KEYS = ("stolen", "steals", "counter_local", "counter_remote")



def shell_maxima(dm: np.ndarray, ao_loc) -> np.ndarray:
    """max |D| over the functions of each shell pair, (nbas, nbas) contiguous: the density
    factor of the density-weighted screening bound."""
    loc = np.asarray(ao_loc[:-1], dtype=np.int64)
    return np.ascontiguousarray(np.maximum.reduceat(np.maximum.reduceat(np.abs(dm), loc, axis=0), loc, axis=1))

class Incremental:
    """The incremental (Delta D) scheme of a direct build: ``build(dm, full)`` is G(dm) from
    ``full(d, incremental) -> G(d)``, as G(D_last) + G(D - D_last) between full builds,
    G(D) in full every ``rebuild_every`` + 1-th build (None: never again, tests only; 0:
    always), which bounds the error that screened contributions accumulate (Haser and
    Ahlrichs, J. Comput. Chem. 10, 104 (1989); PySCF's ``rebuild_nsteps``). Also checks
    the options of a direct build."""

    def __init__(self, screening: float, rebuild_every: int | None):
        if not (screening >= 0.0):
            raise InputError(f"screening={screening!r}: expected a threshold >= 0 "
                             "(0 disables Schwarz screening)")
        if rebuild_every is not None and int(rebuild_every) < 0:
            raise InputError(f"rebuild_every={rebuild_every!r}: expected incremental builds "
                             "between full ones >= 0 (0: every build is full)")
        self.rebuild_every = rebuild_every
        self.last = None             # (D, G) of the last build
        self.since_full = 0          # incremental builds since the last full one

    def build(self, dm: np.ndarray, full) -> np.ndarray:
        if self.last is not None and (self.rebuild_every is None
                                      or self.since_full < self.rebuild_every):
            g = self.last[1] + full(dm - self.last[0], True)
            self.since_full += 1
        else:
            g = full(dm, False)
            self.since_full = 0
        self.last = (dm.copy(), g)
        return g


class _Worker:
    """One thread's share of a build: its M tile buffers, counts and kept integrals."""

    def __init__(self):
        self.buf: dict = {}
        self.tasks = self.nints = self.quartets_screened = 0
        self.busy = self.busy_cpu = 0.0
        self.stored: list = []


def first_build_homes(tasks: TaskList, nranks: int) -> np.ndarray:
    """The rank of each task in an incore first build: the contiguous cost-balanced
    static partition (``backends.schedule.partition``), the same on every rank."""
    home = np.zeros(len(tasks), dtype=np.int64)
    for rank, queue in enumerate(partition(list(tasks.cost), nranks, "contiguous")):
        home[queue] = rank
    return home


def incore_shares(tasks: TaskList, nranks: int, home: np.ndarray | None = None) -> np.ndarray:
    """Bytes of integral blocks each of ``nranks`` ranks keeps in mode incore (``home``:
    ``first_build_homes``, when already known)."""
    home = first_build_homes(tasks, nranks) if home is None else home
    return np.bincount(home, weights=8.0 * tasks.nints, minlength=nranks).astype(np.int64)


def screened_tasks(mol, screening: float = SCREENING, block_nbf: int | None = None) -> TaskList:
    """The task list of ``mol``'s Fock build (for estimates; ``FockBuilder`` keeps the
    parts it also needs)."""
    blocks = make_blocks(mol, block_nbf)
    eri = BlockERI(mol)
    return make_tasks(blocks, schwarz_bounds(eri, mol), float(screening))


class FockBuilder:
    """Blocking, screening, task list and the D and M tensors of one SCF. Collective:
    every rank constructs it inside ``context``, calls ``build`` the same number of
    times and finally ``free``."""

    def __init__(self, mol, context, *, schedule: str = "steal", screening: float = SCREENING,
                 mode: str = "direct", budget_bytes: float | None = None,
                 block_nbf: int | None = None, rebuild_every: int | None = REBUILD_EVERY,
                 threads: int = 1):
        self.schedule = check_schedule(schedule)
        if mode not in MODES:
            raise InputError(f"unknown mode {mode!r}; expected one of {MODES}")
        self.delta = Incremental(screening, rebuild_every)
        self.threads = max(1, int(threads))
        self.context = context
        self.ranks = context.ranks
        t0 = time.perf_counter()
        self.blocks = make_blocks(mol, block_nbf)
        self.eri = BlockERI(mol)
        self.qshell = schwarz_bounds(self.eri, mol)
        self.tasks = make_tasks(self.blocks, self.qshell, float(screening))
        self.setup_seconds = time.perf_counter() - t0

        size = self.ranks.size
        self.homes = first_build_homes(self.tasks, size)
        #: auto and incore: (fits, largest share, smallest room) of ``incore.fits``
        self.fit = None
        if mode != "direct":
            if budget_bytes is None:
                raise InputError(f"mode={mode!r} needs the memory budget per rank (budget_bytes)")
            share = incore_shares(self.tasks, size, self.homes)[self.ranks.rank]    # this rank's bytes
            self.fit = fits(self.ranks, share, float(budget_bytes))
            ok, need, room = self.fit
            if mode == "incore" and not ok:
                raise InputError(
                    f"mode='incore' needs {need / 2**20:.4g} MiB of screened integral blocks on "
                    f"the fullest of {size} rank(s), more than the {room / 2**20:.4g} MiB its "
                    f"memory budget leaves ({budget_bytes / 2**20:.4g} MiB per rank less what it "
                    "holds); use mode='direct', more ranks, or a larger budget (--max-memory)")
            mode = "incore" if ok else "direct"
        self.mode = mode
        ar = self.blocks.ao_ranges
        space = IndexSpace("shell blocks", [Tile(hi - lo, 0, lo) for lo, hi in ar])
        with context:
            self.dens = BlockTensor((space, space), name="scf.D")
            self.fock = BlockTensor((space, space), name="scf.M")
        self._stored = None          # incore: list of (task id, integral block) run here
        pairs = self.tasks.pairs
        self._qmax = np.array([pb.qmax for pb in pairs])
        self.history = []            # per build: dict of this rank's statistics

    # -- one build --------------------------------------------------------------------
    def build(self, dm: np.ndarray) -> np.ndarray:
        """G(D) on every rank; ``dm`` is the replicated density matrix (direct mode:
        incremental from the last build unless a full build is due)."""
        with thread_limit(self.threads, None):
            if self.mode == "direct":
                return self.delta.build(dm, self._build)
            return self._build(dm, False)

    def screen(self, dm: np.ndarray) -> np.ndarray:
        """Ids of the tasks whose density-weighted Schwarz bound for ``dm`` reaches the
        threshold (all tasks with threshold 0); identical on every rank for the same
        ``dm``."""
        t = self.tasks
        if t.threshold <= 0:
            return np.arange(len(t))
        ar = self.blocks.ao_ranges
        nb = len(ar)
        dmax = np.empty((nb, nb))
        for x in range(nb):
            for y in range(x + 1):
                dmax[x, y] = dmax[y, x] = np.abs(dm[slice(*ar[x]), slice(*ar[y])]).max()
        dens = np.maximum.reduce([4.0 * dmax[t.a, t.b], 4.0 * dmax[t.c, t.d], dmax[t.a, t.c],
                                  dmax[t.b, t.d], dmax[t.a, t.d], dmax[t.b, t.c]])
        return np.flatnonzero(self._qmax[t.p] * self._qmax[t.q] * dens >= t.threshold)

    def shell_density(self, dm: np.ndarray) -> np.ndarray | None:
        """max |D| over the functions of each shell pair (nbas, nbas), for the quartet
        screening of a direct build; None when nothing is screened."""
        if self.mode != "direct" or self.tasks.threshold <= 0:
            return None
        return shell_maxima(dm, self.blocks.ao_loc)

    def quartet_screen(self, quartet: tuple, dsh: np.ndarray) -> np.ndarray:
        """Boolean (nsa, nsb, nsc, nsd) over the shells of a block quartet: Q_ab Q_cd and
        Q_ab Q_cd max(4|D_ab|, 4|D_cd|, |D_ac|, |D_bd|, |D_ad|, |D_bc|) both reach the
        threshold (shell-level maxima)."""
        a, b, c, d = (slice(*self.blocks.shell_ranges[x]) for x in quartet)
        q, thr = self.qshell, self.tasks.threshold
        qq = q[a, b][:, :, None, None] * q[c, d][None, None]
        dens = 4.0 * np.maximum(dsh[a, b][:, :, None, None], dsh[c, d][None, None])
        for part in (dsh[a, c][:, None, :, None], dsh[b, d][None, :, None, :],
                     dsh[a, d][:, None, None, :], dsh[b, c][None, :, :, None]):
            dens = np.maximum(dens, part)
        return (qq >= thr) & (qq * dens >= thr)

    def screened_block(self, quartet: tuple, keep: np.ndarray) -> tuple:
        """(g, quartets not computed): (AB|CD) computed by libcint per shell a of A over
        the box of shells (b, c, d) that holds a's kept quartets, zero elsewhere, when
        these boxes hold at most ``BOX_FRACTION`` of the block's integrals; else None."""
        sr, loc = self.blocks.shell_ranges, self.blocks.ao_loc
        base = [sr[x][0] for x in quartet]
        size = [np.diff(loc[sr[x][0]:sr[x][1] + 1]) for x in quartet]
        boxes, n_box, q_box = [], 0, 0
        for ia in np.flatnonzero(keep.any(axis=(1, 2, 3))):
            box = [(int(ia), int(ia) + 1)]
            for axis in range(3):
                hit = np.flatnonzero(keep[ia].any(axis=tuple(x for x in range(3) if x != axis)))
                box.append((int(hit[0]), int(hit[-1]) + 1))
            boxes.append(box)
            n_box += int(np.prod([size[n][lo:hi].sum() for n, (lo, hi) in enumerate(box)]))
            q_box += int(np.prod([hi - lo for lo, hi in box]))
        a, b, c, d = quartet
        whole = np.prod([sz.sum() for sz in size]) / (2 if a == b else 1) / (2 if c == d else 1)
        if n_box > BOX_FRACTION * whole:
            return None, 0
        g = np.zeros(tuple(int(sz.sum()) for sz in size))
        for box in boxes:
            shells = [(base[n] + lo, base[n] + hi) for n, (lo, hi) in enumerate(box)]
            g[tuple(slice(int(loc[s0] - loc[base[n]]), int(loc[s1] - loc[base[n]]))
                    for n, (s0, s1) in enumerate(shells))] = self.eri(*(s for sh in shells for s in sh))
        return g, keep.size - q_box

    def _build(self, dm: np.ndarray, incremental: bool) -> np.ndarray:
        t_start = time.perf_counter()
        D, M = self.dens, self.fock
        ar = self.blocks.ao_ranges
        for x, y in D.owned_keys():
            if x >= y:
                D.store_block((x, y), np.ascontiguousarray(dm[slice(*ar[x]), slice(*ar[y])]))
        M.zero_()
        for t in (D, M):
            if t.dist is not None:
                t.dist.sync()
        tiles: dict = {}             # density tiles this build holds, (x, y) -> block
        workers: list = []
        lock = threading.Lock()
        local = threading.local()

        def worker() -> _Worker:
            w = getattr(local, "w", None)
            if w is None:
                w = local.w = _Worker()
                with lock:
                    workers.append(w)
            return w

        replay = self.mode == "incore" and self._stored is not None
        deal = None
        active = self.screen(dm) if self.mode == "direct" else np.arange(len(self.tasks))
        t_tasks = time.perf_counter()
        if replay:
            self._replay(worker(), tiles)
        elif len(active):            # the same on every rank: all skip, or none
            self.context.run_tasks(self._task_set(worker, tiles, active, self.shell_density(dm)))
            deal = self.context.deal_stats
        tasks_s = time.perf_counter() - t_tasks

        t = time.perf_counter()
        add = M.dist.accumulate if M.dist is not None else M.accumulate_block
        for w in workers:
            for key, blk in w.buf.items():
                add(key, blk)
        if M.dist is not None:
            M.dist.sync()
            got = M.dist.fetch_many([k for k in M.allowed_keys() if k[0] >= k[1]])
        else:
            got = M.blocks
        m = np.zeros((self.blocks.nao, self.blocks.nao))
        for (x, y), blk in got.items():
            m[slice(*ar[x]), slice(*ar[y])] = blk
        g2e = 0.5 * (m + m.T)        # only lower tiles hold data
        stats = {
            "tasks": sum(w.tasks for w in workers), "integrals": sum(w.nints for w in workers),
            "shell_quartets_screened": sum(w.quartets_screened for w in workers),
            "busy_s": sum(w.busy for w in workers), "busy_cpu_s": sum(w.busy_cpu for w in workers),
            "tasks_s": tasks_s, "reduce_s": time.perf_counter() - t,
            "wall_s": time.perf_counter() - t_start, "density_tiles": len(tiles),
            "fock_tiles": len({k for w in workers for k in w.buf}), "replay": replay,
            "tasks_active": len(active), "incremental": incremental,
            **{k: getattr(deal, k, 0) for k in _DEAL_KEYS},
            "victims": dict(deal.victims) if deal is not None else {},
        }
        if self.mode == "incore" and not replay:
            self._stored = sorted((s for w in workers for s in w.stored), key=lambda s: s[0])
            stats["incore_bytes"] = sum(g.nbytes for _, g in self._stored)
        self.history.append(stats)
        return g2e

    def _task_set(self, worker, tiles: dict, active: np.ndarray, dsh=None) -> TaskSet:
        """The build's tasks (ids ``active``): need() asks for density tiles not yet held;
        work() computes one block quartet into the calling thread's buffers
        (thread-safe); ``dsh``: shell-pair density maxima of a screened direct build."""
        tasks, D = self.tasks, self.dens
        storing = self.mode == "incore"      # the first build: dealt by first_build_homes

        def need(j):
            return [(D, k) for k in tasks.density_tiles((int(active[j]),)) if k not in tiles]

        def work(j, blocks):
            i = int(active[j])
            for (_, key), blk in blocks.items():
                tiles[key] = blk
            w = worker()
            wall, cpu = time.perf_counter(), time.thread_time()
            quartet = tasks.quartet(i)
            keep = None if dsh is None else self.quartet_screen(quartet, dsh)
            if keep is not None and not keep.any():
                w.quartets_screened += keep.size
                return 0.0
            with with_omp_threads(self.threads):   # OpenMP settings are per thread
                g, skipped = (None, 0) if keep is None or keep.all() else self.screened_block(quartet, keep)
                w.quartets_screened += skipped
                if g is None:
                    g = self.eri.blocks(self.blocks, *quartet)
                    if tasks.kind[i] == PARTIAL:
                        g *= tasks.mask(i)
            contract_block(g, tasks.scale[i], quartet, tiles, w.buf)
            w.busy += time.perf_counter() - wall
            w.busy_cpu += time.thread_time() - cpu
            w.tasks += 1
            w.nints += g.size
            if storing:
                w.stored.append((i, g))
            return 0.0

        return TaskSet("scf.fock", list(tasks.cost[active]), work, need, schedule=self.schedule,
                       partition="contiguous", order="cost",
                       home=self.homes[active].tolist() if storing else None)

    def _replay(self, w: _Worker, tiles: dict) -> None:
        """incore, after the first build: this rank's kept integral blocks, no schedule."""
        D, tasks = self.dens, self.tasks
        keys = tasks.density_tiles([t for t, _ in self._stored])
        if D.dist is None:
            tiles.update({k: D.blocks[k] for k in keys})
        else:
            tiles.update({k: D.blocks[k] for k in keys if k in D.blocks})
            tiles.update(D.dist.fetch_many(sorted(k for k in keys if k not in D.blocks)))
        for t, g in self._stored:
            wall, cpu = time.perf_counter(), time.thread_time()
            contract_block(g, tasks.scale[t], tasks.quartet(t), tiles, w.buf)
            w.busy += time.perf_counter() - wall
            w.busy_cpu += time.thread_time() - cpu
            w.tasks += 1

    def free(self) -> None:
        """Drop the kept integrals and the tensors (their arrays return to the context's
        pool at its next collective point)."""
        self._stored = None
        self.dens = self.fock = None
