"""The execution context: an executor, a cache of gathered matrices, and run statistics.

``with Context("threads"):`` makes a context current for the equations run inside it;
``current_context()`` returns the innermost one (a threads context by default).

With a distributed executor (``mpi-onesided``, ``mpi-collective``) the context also
installs the executor's tensor storage while it is current: tensors created inside
``with Context(...)`` are spread over the ranks, and plans run step by step through the
executor (``executor.execute_plan``).
"""

from __future__ import annotations

import contextvars
import functools
import sys
import time
import weakref
from collections import Counter, OrderedDict
from dataclasses import replace
from functools import lru_cache

import numpy as np
from threadpoolctl import ThreadpoolController

from tessera.backends import blockops
from tessera.backends.heap import give_back_freed_memory, keep_freed_memory
from tessera.backends.sectors import FLAT_PAIRS, PAIR_DIVISORS, add_index, pair_index, scatter_index, small_blocks
from tessera.backends.registry import (BACKENDS, DEFAULT_BACKEND, LOCAL_BACKENDS, check_options,
                                       launched_ranks, resolve_auto, runs_distributed)
from tessera.backends.tasklog import TaskProgress
from tessera.backends.tasks import run_local
from tessera.errors import InputError, TesseraError
from tessera.expr import terms
from tessera.plan.planner import plan_updates
from tessera.plan.reuse import reused_plan
from tessera.profile.records import Recorder
from tessera.tensor.block_tensor import reset_storage, symmetry_group, use_storage
from tessera.tensor.pairs import TriangleBlocks

CACHE_BYTES = 2 << 30      # gathered matrices of constant tensors a context keeps, at most
# a constant's left operand is read from its blocks (``_gathered``) in a product of at most
# this many columns: a GEMM bound by reading A once (t1 and one-body products: o columns or
# one), where the blocks' smaller GEMMs cost what one GEMM on a gathered copy does; wider
# ones run near BLAS peak, where per-block GEMMs and their sums were slower (the ladder's
# V+- of glycine cc-pVDZ: 0.061 -> 0.065 s of CPU per GEMM)
BLOCK_READ_COLUMNS = 64

_current: contextvars.ContextVar = contextvars.ContextVar("tessera_context", default=None)
_default = None


def make_executor(name: str, **options):
    """The executor of backend ``name`` (options not given are left to its defaults)."""
    options = {k: v for k, v in options.items() if v is not None}
    if name not in BACKENDS:
        raise InputError(f"unknown backend {name!r}; choose one of: {', '.join(BACKENDS)}")
    if name == "auto":
        name, options = resolve_auto(launched_ranks(), **options)
    if name in LOCAL_BACKENDS:
        bad = sorted(set(options) - ({"workers"} if name == "threads" else set()))
        if bad:
            raise InputError(f"backend {name!r} takes no option {', '.join(bad)}; variants, schedules "
                             "and caches belong to the MPI backends (mpi-onesided, mpi-collective)")
        from tessera.backends.local import SerialExecutor, ThreadsExecutor
        return SerialExecutor() if name == "serial" else ThreadsExecutor(**options)
    check_options(name, options.get("variant"), options.get("schedule"), ranks=2)
    if name == "mpi-onesided":
        from tessera.backends.onesided import OneSidedExecutor
        return OneSidedExecutor(**options)
    from tessera.backends.collective import CollectiveExecutor
    return CollectiveExecutor(**options)


class Context:
    """Runs plans with one executor; keeps per-update time and flops."""

    def __init__(self, backend: str = DEFAULT_BACKEND, *, cache_bytes: int = CACHE_BYTES,
                 recorder: Recorder | None = None, **executor_options):
        self.backend = backend
        self.executor = make_executor(backend, **executor_options)
        keep_freed_memory()         # working arrays reused across steps, not faulted in afresh
        self.cache_bytes = cache_bytes
        self._cache: OrderedDict = OrderedDict()     # (uid, version, layout ids) -> matrices
        self._permuted_flats: dict = {}     # constants' flat vectors in another order (_permuted)
        self._block_read: dict = {}   # constants' left operands read from their blocks (_gathered)
        self._constants = weakref.WeakValueDictionary()    # uid -> constant with a gathered matrix kept
        # regions run here: time, flops (a run's contexts may share one recorder)
        self.profile = recorder if recorder is not None else Recorder()
        self._tokens: list = []
        self._uses, self._batch = Counter(), {}     # gathers reused within one plan (execute)
        self.distributed = bool(getattr(self.executor, "distributed", False))
        self.deal_stats = None      # DealStats of the last run_tasks on this rank (see run_tasks)

    @property
    def ranks(self) -> "Ranks":
        return Ranks(self.executor.world if self.distributed else None)

    # ---------------------------------------------------------------- current context
    def __enter__(self):
        storage = self.executor.store if self.distributed else None
        self._tokens.append((_current.set(self), use_storage(storage)))
        return self

    def __exit__(self, *exc):
        token, storage_token = self._tokens.pop()
        reset_storage(storage_token)
        _current.reset(token)
        return False

    def close(self) -> None:
        """Close the executor and hand the heap's free memory back to the kernel."""
        self.executor.close()
        self._cache.clear()
        self._permuted_flats.clear()
        self._block_read.clear()
        give_back_freed_memory()

    def _blas_limit(self):
        """Limits BLAS to the executor's threads per worker while in use (``with``)."""
        return thread_limit(self.executor.blas_threads)

    def drop_gathered(self) -> None:
        """Free the gathered matrices of constant tensors kept for later steps (a driver
        whose equations are done: its next phase does not contract those tensors) and what
        a distributed executor kept of them (``drop_frozen``), and
        give the memory the heap kept for the phase's working arrays back to the kernel
        (``heap.give_back_freed_memory``)."""
        self._cache.clear()
        self._permuted_flats.clear()
        self._block_read.clear()
        self.drop_frozen()
        give_back_freed_memory()

    def drop_frozen(self) -> None:
        """Forget what a distributed executor kept of frozen operands (``FrozenCache``): what
        steps that do not recur (a driver's set-up, its last phase) kept would pin it."""
        if self.distributed:
            self.executor.drop_frozen()

    def store_constants_gathered(self) -> None:
        """Each constant that the plans run so far gathered in one layout only, and never read
        from its blocks (``_gathered``), keeps its blocks as views of those kept matrices: its own block arrays
        are freed, not held beside a copy of the same numbers (``blockops.blocks_into_gathered``;
        the ladder's V+- do so as ``_gathered`` gathers them).
        A driver calls it once its plans have all run (after a CCSD's first residual)."""
        entries: dict = {}
        for key, mats in self._cache.items():
            entries.setdefault(key[1], []).append((key, mats))
        read_from_blocks = {key[0] for key in self._block_read}
        for uid, kept in entries.items():
            t = self._constants.get(uid)
            if t is None or len(kept) != 1 or uid in read_from_blocks or not _plain_blocks(t):
                continue
            (version, _, perm, sectors), mats = kept[0]
            if version == t.version:
                blockops.blocks_into_gathered(t, perm, sectors, mats)

    def record_step(self, step, seconds: float, start: float | None = None) -> None:
        self.record(step.label, seconds, step.flops, start, step.kind)

    def record(self, label: str, seconds: float, flops: int = 0, start: float | None = None,
               kind: str = "step") -> None:
        """A region that just ended (``start``: its perf_counter(); kinds: profile.records)."""
        self.profile.region(label, seconds, flops, start, kind)

    def _computed(self, c0: float, seconds: float) -> None:
        """Add the arithmetic of a finished run to the recorder: the distributed
        executor's compute time since ``c0``, or all of it on a local executor."""
        self.profile.compute += (self.executor.compute_seconds - c0) if self.distributed else seconds

    def machine(self):
        """The calibrated machine (``backends.machine``) as this context runs on it: its
        executor's BLAS threads per rank, and whether its gets run ahead of its compute
        (``reads_ahead``: mpi-onesided); what a plan made inside the run is for
        (``machine.planning``)."""
        from tessera.backends.machine import Machine
        return Machine.calibrated(threads_per_rank=int(getattr(self.executor, "blas_threads", 1)),
                                  reads_overlap=bool(getattr(self.executor, "reads_ahead", False)))

    @property
    def stats(self) -> dict:
        """label -> [calls, seconds, flops] of the regions run here."""
        return self.profile.table

    @property
    def flops(self) -> int:
        """Flops of every region run here so far."""
        return self.profile.flops

    # ---------------------------------------------------------------- execution
    def run_tasks(self, task_set):
        """Run a :class:`~tessera.backends.tasks.TaskSet` on this context's executor;
        returns every task's result (on every rank). Time and flops are recorded under
        ``task_set.name``. ``self.deal_stats``: this rank's
        :class:`~tessera.backends.schedule.DealStats` of the run when the executor dealt it
        through a Scheduler (``mpi-onesided``), else None."""
        t0 = time.perf_counter()
        c0 = self.executor.compute_seconds if self.distributed else 0.0
        self.deal_stats = None
        progress = None
        if task_set.progress:
            ranks = self.ranks
            parts = task_set.stages if self.distributed else 1     # wrapped work runs once per part
            progress = TaskProgress(task_set.name, len(task_set) * parts, ranks.rank, ranks.size)
            if self.distributed:
                task_set = replace(task_set, work=progress.wrap(task_set.work))
        if self.profile.detailed:         # per-task records are kept in this process
            task_set = replace(_timed_tasks(task_set, self.profile), forkable=False)
        with self._blas_limit():
            if self.distributed:
                results = self.executor.run_tasks(task_set)
                self.deal_stats = getattr(self.executor, "deal_stats", None)
            else:
                results = run_local(self.executor, task_set, progress and progress.tick)
        if progress is not None:
            progress.finish()
        dt = time.perf_counter() - t0
        self._computed(c0, dt)
        self.record(task_set.name, dt, task_set.flops() if task_set.flops else 0, t0, "tasks")
        return results

    def execute(self, updates) -> None:
        if self.distributed:      # plan temporaries are created on the executor's storage
            token = use_storage(self.executor.store)
            c0 = self.executor.compute_seconds
            try:
                plan = plan_updates(updates)
                with self._blas_limit():
                    self.executor.execute_plan(plan, self)
            finally:
                reset_storage(token)
            self._computed(c0, 0.0)
            return
        plan = reused_plan(updates)
        # gathers of a non-constant operand that a later step of the plan repeats (same
        # tensor, permutation and layouts) are kept until their last use, while unchanged
        self._uses = Counter(_gather_key(ref.tensor, perm, layouts)
                             for step in plan.steps if step.kind == "contract"
                             for ref, perm, layouts in _operands(step) if not ref.tensor.constant)
        self._batch = {}
        try:
            with self._blas_limit():
                for step in plan.steps:
                    t0 = time.perf_counter()
                    self._run_step(step)
                    dt = time.perf_counter() - t0
                    self._computed(0.0, dt)
                    self.record_step(step, dt, t0)
        finally:
            self._uses, self._batch = Counter(), {}

    def _run_step(self, step) -> None:
        run = self.executor.run
        if step.kind == "zero":
            step.out.tensor.zero_()
        elif step.kind == "add":
            a, out = step.inputs[0].tensor, step.out.tensor
            div = step.divisor.tensor if step.divisor is not None else None
            if all(small_blocks(t) for t in (a, out, div) if t is not None) and \
                    not (step.pairs and (step.pairs not in FLAT_PAIRS or step.pairs != "unpack" and out.aliases)):
                src = a.flat()
                if step.pairs:
                    maps = [(index, dindex, PAIR_DIVISORS if dindex is not None else None)
                            for index, dindex in pair_index(a, out, step.pairs, step.perms.get("sym"))]
                else:
                    index, dindex = add_index(a, out, step.perms["a"], div, step.perms.get("d"))
                    if a.constant and index is not None and div is None:
                        kept = self._permuted(a, out, step.perms["a"], index)
                        if kept is not None:
                            src, index = kept, None
                    maps = [(index, dindex, div.flat() if div is not None else None)]
                for index, dindex, divisor in maps:
                    run(blockops.flat_add_tasks(out, src, index, step.scale, self.executor.workers, divisor, dindex))
            else:
                run(blockops.add_tasks(step, self.executor.workers))
        elif step.kind == "hadamard":
            run(blockops.hadamard_tasks(step))
        elif step.kind == "contract" and not step.sectors:
            pass                # no symmetry-allowed block product: the output receives nothing
        elif step.kind == "contract":
            (a, aperm, alayouts), b = _operands(step)
            left = all(s.cols.total <= BLOCK_READ_COLUMNS for s in step.sectors)
            amats, bmats = self._gathered(a, aperm, alayouts, left), self._gathered(*b)
            if small_blocks(step.out.tensor):       # products end to end, then one add into the output
                index, total = scatter_index(step.out.tensor, step.perms["c"], step.sectors)
                products = np.empty(total + 1)
                products[total] = 0.0           # what an output block that no sector makes receives
                run(blockops.gemm_into_tasks(step, amats, bmats, products, self.executor.workers))
                run(blockops.flat_add_tasks(step.out.tensor, products, index, 1.0, self.executor.workers))
            else:
                for tasks in blockops.gemm_scatter_tasks(step, amats, bmats, self.executor.workers):
                    run(tasks)
        else:  # the planner makes no other kind
            raise AssertionError(step.kind)

    def _permuted(self, a, out, perm, index) -> np.ndarray | None:
        """``a.flat()[index]`` of a constant tensor ``a``, kept while ``a`` is unchanged: a
        constant added every iteration into a tensor of another axis order (CCSD's
        Z += ovov[iajb]) is then read in order, not through the index. None when keeping
        it would pass ``cache_bytes`` (with the gathered matrices kept)."""
        key = (a.uid, perm, out.spaces, out.irrep, out.aliases or None)
        version, vector = self._permuted_flats.get(key, (None, None))
        if version != a.version:
            self._permuted_flats.pop(key, None)         # a stale copy holds no room
            if self._kept_bytes() + 8 * index.size > self.cache_bytes:
                return None
            vector = np.take(a.flat(), index, mode="clip")
            self._permuted_flats[key] = (a.version, vector)
        return vector

    def _kept_bytes(self) -> int:
        """Bytes kept for later steps: gathered matrices of constants and permuted constants
        (together within ``cache_bytes``)."""
        return sum(v.nbytes for _, v in self._permuted_flats.values()) + \
            sum(m.nbytes for v in self._cache.values() for m in v.values())

    def _gathered(self, ref, perm, layouts, left: bool = False) -> dict:
        """The sector matrices of an operand. A constant's ``left`` operand (A of A @ B,
        in a product of few columns: ``BLOCK_READ_COLUMNS``) is read from its blocks
        (``blockops.BlockMatrix``): in place where a block reshapes to its place without a
        copy, else each block copied as the product reads it; no gathered copy made or
        kept (CCSD's ovvv, ovov, oovv and ovoo in the t1 and one-body products: glycine
        cc-pVDZ kept two gathered copies of ovvv beside its blocks, 128 MiB). The ladder's
        V+- (``tensor.pairs.TriangleBlocks``), gathered once into the squares of their one
        product, keep only their diagonal triangles beside them from then on (glycine
        cc-pVDZ: 73 -> 23 MiB of triangles beside 124 MiB of squares)."""
        t = ref.tensor
        if not t.constant:
            return self._batch_gathered(ref, perm, layouts)
        key = (t.version,) + _gather_key(t, perm, layouts)
        if left:        # by layout, with the version: a stale entry holds no old blocks
            version, mats = self._block_read.get(key[1:], (None, None))
            if version != t.version:
                mats = blockops.block_matrices(ref, perm, layouts)
                if version is None:     # the views keep the blocks alive: not beyond the tensor
                    weakref.finalize(t, self._block_read.pop, key[1:], None)
                self._block_read[key[1:]] = (t.version, mats)
            return mats
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            return hit
        hit = self._cached_equal(t, perm, layouts)
        if hit is not None:
            return hit
        mats: dict = {}
        self.executor.run(blockops.gather_tasks(ref, perm, layouts, mats, self.executor.workers))
        size = sum(m.nbytes for m in mats.values())
        if size <= self.cache_bytes:
            self._cache[key] = mats
            self._constants[t.uid] = t      # for store_constants_gathered
            if type(t.blocks) is TriangleBlocks:    # the ladder's V+-: one layout, their one product
                blockops.blocks_into_gathered(t, perm, key[3], mats)
            while self._cache and self._kept_bytes() > self.cache_bytes:
                self._cache.popitem(last=False)
        return mats

    def _cached_equal(self, t, perm, layouts) -> dict | None:
        """The matrices of gather ``perm`` of constant ``t`` from a cached twin
        (``gather_twins``): its own matrices or their transposes (views: no copy, no
        memory), or None. In C1 CCSD a third of the integrals' gathers have a twin."""
        nrow = len(next(iter(layouts.values()))[0].tuples[0])
        twins = gather_twins(t, perm, nrow)
        for (version, uid, cperm, sectors), mats in self._cache.items():
            if uid != t.uid or version != t.version:
                continue
            have = {(r, c): g for g, r, c in sectors}
            for q, swapped in twins:
                if q == cperm:
                    need = [(c, r) if swapped else (r, c) for r, c in layouts.values()]
                    if all(k in have for k in need):
                        return {g: mats[have[k]].T if swapped else mats[have[k]] for g, k in zip(layouts, need)}
        return None

    def _batch_gathered(self, ref, perm, layouts) -> dict:
        """The sector matrices of a non-constant operand, reused within one plan."""
        t = ref.tensor
        key = _gather_key(t, perm, layouts)
        self._uses[key] -= 1
        version, mats = self._batch.pop(key, (None, None))
        if version != t.version:
            mats = {}
            if small_blocks(t):
                self.executor.run(blockops.gather_flat_tasks(ref, perm, layouts, mats, self.executor.workers))
            else:
                self.executor.run(blockops.gather_tasks(ref, perm, layouts, mats, self.executor.workers))
        if self._uses[key] > 0:
            self._batch[key] = (t.version, mats)
        return mats

    def report(self) -> list:
        """(label, calls, seconds, flops) per region, slowest first."""
        return self.profile.rows()


def _blas() -> ThreadpoolController:
    """The BLAS (and OpenMP) libraries of this process, searched for (the search reads
    /proc/self/maps) again only when modules were imported since the last search (one
    may have loaded a library: scipy's BLAS, PySCF's OpenMP)."""
    return _controller(len(sys.modules))


@lru_cache(maxsize=1)
def _controller(_modules: int) -> ThreadpoolController:
    return ThreadpoolController()


def thread_limit(limits: int, user_api: str | None = "blas"):
    """``limits`` threads for the pools of ``user_api`` ("blas", "openmp"; None: both)
    while entered (``with``), through the libraries ``_blas`` found:
    ``threadpoolctl.threadpool_limits`` searches them anew at every use, about 1.8 ms of
    CPU against 0.02 ms here (measured, 2 cores)."""
    return _blas().limit(limits=limits, user_api=user_api)


def one_blas_thread(fn):
    """``fn`` run with one BLAS thread (``thread_limit(1)``): a decorator."""
    @functools.wraps(fn)
    def limited(*args, **kwargs):
        with thread_limit(1):
            return fn(*args, **kwargs)
    return limited


def _operands(step) -> tuple:
    """(ref, permutation, {irrep: (row layout, column layout)}) of a contraction's A and B."""
    a, b = step.inputs
    return ((a, step.perms["a"], {s.irrep: (s.rows, s.inner) for s in step.sectors}),
            (b, step.perms["b"], {s.irrep: (s.inner, s.cols) for s in step.sectors}))


def gather_twins(t, perm: tuple, nrow: int) -> list:
    """(perm', swapped) of the gathers of ``t`` whose matrices equal this gather's (the
    first ``nrow`` axes of ``t.transpose(perm)`` as rows): the images ``g[perm]`` under
    the tensor's declared symmetries (``T.transpose(g) == T``, so ``T.transpose(perm) ==
    T.transpose(g[perm])``) with the same rows (swapped False), and the same with rows and
    columns exchanged (swapped True: this gather is that one's transpose)."""
    out = []
    for g in sorted(symmetry_group(t.symmetry, t.ndim)):
        q = tuple(g[p] for p in perm)
        out += [(q, False), (q[nrow:] + q[:nrow], True)]
    return out


def _plain_blocks(t) -> bool:
    """Whether a local tensor's blocks are its own arrays in a plain dict: not views of its
    flat vector (``BlockTensor.flat``), not triangles (the ladder's V+-, ``tensor.pairs``)."""
    return t.dist is None and t._flat is None and type(t.blocks) is dict


def _gather_key(t, perm, layouts) -> tuple:
    """The layouts themselves, not their ids: the key holds them, so no freed layout's id
    can be reused by another while the entry exists."""
    return (t.uid, perm, tuple((g, r, c) for g, (r, c) in layouts.items()))


def _timed_tasks(task_set, recorder):
    """``task_set`` whose work also records each task's start and time (profiling)."""
    work, name = task_set.work, task_set.name

    def timed(i, blocks, *stage):
        t0 = time.perf_counter()
        out = work(i, blocks, *stage)
        recorder.task(name, i, t0, time.perf_counter() - t0)
        return out
    return replace(task_set, work=timed)


def current_context() -> Context:
    ctx = _current.get()
    if ctx is None:
        global _default
        if _default is None:
            _default = Context("threads")
        ctx = _default
    return ctx


terms.set_runner(lambda updates: current_context().execute(updates))


class PlanningContext(Context):
    """Records the plan of every batch of equations instead of running it."""

    def __init__(self):
        super().__init__("serial")
        self.plans: list = []

    def __enter__(self):        # tensors made while planning are local, whatever is current
        self._tokens.append((_current.set(self), use_storage(None)))
        return self

    def execute(self, updates) -> None:
        self.plans.append(plan_updates(updates))


class Ranks:
    """The processes of a distributed run, as drivers see them: this rank, their number,
    a value computed on one rank and shared, reductions. Collective methods must be
    called by every rank in the same order."""

    def __init__(self, world=None):
        self._world = world          # None: one process, no MPI
        self.rank, self.size = (0, 1) if world is None else (world.rank, world.size)
        self.nodes = 1 if world is None else world.nnodes
        # ranks on this rank's node, and whether they map each other's distributed
        # storage (same-node windows in shared memory: every window but "create")
        self.node_size = 1 if world is None else world.node_workers
        self.shared_windows = world is not None and world.options.window != "create"

    def share(self, compute, root: int = 0):
        """``compute()`` on rank ``root`` only, its result on every rank. A TesseraError it
        raises is raised on every rank, so that all stop alike."""
        if self._world is None:
            return compute()
        value = None
        if self.rank == root:
            try:
                value = compute()
            except TesseraError as err:
                value = _Raised(err)
        value = self._world.bcast(value, root=root)
        if isinstance(value, _Raised):
            raise value.error
        return value

    def allreduce(self, value, op: str = "sum"):
        return value if self.size == 1 else self._world.allreduce(value, op)

    def allgather(self, value) -> list:
        return [value] if self.size == 1 else self._world.allgather(value)


class _Raised:
    def __init__(self, error):
        self.error = error


def ranks_of(backend: str) -> Ranks:
    """The ranks ``backend`` runs on here (starts MPI only for a distributed backend;
    one process without MPI for serial, threads, auto without mpiexec)."""
    if not runs_distributed(backend):
        return Ranks()
    from tessera.runtime import World
    return Ranks(World.get())
