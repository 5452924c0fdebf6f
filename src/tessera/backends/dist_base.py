"""What the two MPI executors share: the storage, the step loop, accounting, task helpers.

An MPI executor runs a plan step by step on every rank (SPMD). Ranks synchronise (one
barrier) only where a step depends on an earlier one that is not yet complete
everywhere: it reads a tensor that was written since the last barrier, it writes one
that was read since then (another rank may still be reading it), or it writes in place
(owner computes) into a tensor that other ranks accumulated into (or the reverse).
Independent steps, e.g. the terms of one update accumulating into the same output, run
back to back. Every accumulate is complete at its target when the call returns (or its
handle is waited on), so a barrier is all a dependency needs. A plan ends with a
barrier when anything is left unsynchronised, so code after it sees the results.

Per step it records time, compute time (block arithmetic) and the communication
(``accounting``), keyed by the step's label, the update's expression text.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod

import numpy as np

from tessera.profile.terms import CommAccount
from tessera.backends.budget import EXECUTOR_CACHE_MB
from tessera.backends.distributed import FrozenCache, TensorStore, onesided_fetch
from tessera.backends.local import mpi_blas_threads
from tessera.errors import ShapeError
from tessera.plan.blocktasks import add_source, hadamard_block_pairs, source_block


def part_range(ga, key, part) -> tuple:
    """Global [lo, hi) of ``part`` of block ``key`` in ``ga`` (whole block for None)."""
    lo, hi = (list(x) for x in ga.block_range(key))
    for n in range(0, len(part or ()), 3):           # (axis, lo, hi) per cut axis
        axis, a, b = part[n:n + 3]
        lo[axis], hi[axis] = lo[axis] + a, lo[axis] + b
    return tuple(lo), tuple(hi)



class DistributedExecutor(ABC):
    """Base of the MPI executors (see module docstring); ``OneSidedExecutor`` and
    ``CollectiveExecutor`` supply how blocks travel, contractions and task order."""

    distributed = True
    name = "mpi"
    accumulates = True       # whether writes into another rank's memory may be accumulates
    reads_ahead = False      # run_tasks honours TaskSet.lookahead (then the executor has post_blocks, wait_blocks)

    def __init__(self, world=None, fetcher=None, frozen_bytes: int = EXECUTOR_CACHE_MB << 20):
        from tessera.runtime import World
        self.world = world or World.get()
        # what the executor keeps of frozen operands across steps and iterations
        self.frozen = FrozenCache(frozen_bytes)
        self.store = TensorStore(self.world, fetcher or onesided_fetch,
                                 on_release=lambda eids: self.frozen.release(eids))
        self.account = CommAccount(self.world)
        self.blas_threads = mpi_blas_threads()
        self.compute_seconds = 0.0
        self.closed = False
        self._dirty: dict = {}        # uid -> "acc" | "local": written since the last barrier
        self._read: set = set()       # uids read since the last barrier
        self._own: dict = {}          # a step's structure -> what this rank sends, receives or computes

    # ---------------------------------------------------------------- generic tasks
    def run(self, tasks) -> None:
        """Run independent callables here, on this rank (rank-local work)."""
        for task in tasks:
            task()

    def describe(self) -> dict:
        w = self.world
        return {"backend": self.name, "ranks": w.size, "nodes": w.nnodes, "progress": w.options.progress,
                "ghost_ranks": w.full_size - w.size, "frozen_cache_bytes": self.frozen.limit}

    def close(self) -> None:
        self._own.clear()
        self.store.close()
        self.frozen.clear()
        self.closed = True

    def drop_frozen(self) -> None:
        """Forget what was kept of frozen operands (a driver's phase is done; every rank
        calls it at the same point)."""
        self.frozen.clear()

    # ---------------------------------------------------------------- plans
    def execute_plan(self, plan, context) -> None:
        self.store.collect()          # collective: also orders tensor creation before use
        self.synced()                 # ... and counts as a barrier
        for step in plan.steps:
            self._check_distributed(step)
            snap = self.account.begin()
            t0, c0 = time.perf_counter(), self.compute_seconds
            if self._needs_barrier(step):      # decided alike on every rank (SPMD state)
                self.barrier()
            self.run_step(step)
            self._wrote(step)
            dt = time.perf_counter() - t0
            self.account.end(step.label, snap, dt, self.compute_seconds - c0, step.flops)
            context.record_step(step, dt, t0)
        if self._dirty:
            snap = self.account.begin()
            t0 = time.perf_counter()
            self.barrier()
            self.account.end(plan.labels[-1] if plan.labels else "sync", snap, time.perf_counter() - t0,
                             count_call=False)

    def barrier(self) -> None:
        self.world.barrier()
        self.synced()

    def synced(self) -> None:
        """Every rank passed a common point: what was written before is complete."""
        self._dirty.clear()
        self._read.clear()

    @staticmethod
    def _reads(step) -> list:
        return [r.tensor for r in step.inputs] + ([step.divisor.tensor] if step.divisor is not None else [])

    def in_place(self, step) -> bool:
        """Whether ``step`` writes its output only on the owners, in place (else it
        accumulates into the owners' memory): every step but the one-sided contractions
        and the steps into a tensor stored in pieces (its home ranks compute whole blocks
        and accumulate them into the pieces; a ``zero`` step clears each rank's pieces, a
        ``rank_local`` one works on them)."""
        return step.kind != "contract" and (step.kind == "zero" or not step.out.tensor.pieced
                                            or self.rank_local(step))

    @staticmethod
    def rank_local(step) -> bool:
        """Whether ``step`` is an ``add`` into a tensor stored in pieces from tensors stored
        in the same pieces (one structure and placement), read in the same index order:
        element by element on the pieces each rank holds, no communication."""
        out, d = step.out.tensor, step.divisor
        same = tuple(range(out.ndim))
        return (step.kind == "add" and out.pieced and not step.pairs and tuple(step.perms["a"]) == same
                and out.dist.same_layout(step.inputs[0].tensor.dist)
                and (d is None or (tuple(step.perms["d"]) == same and out.dist.same_layout(d.tensor.dist))))

    def _needs_barrier(self, step) -> bool:
        dirty = self._dirty
        if any(t.uid in dirty for t in self._reads(step)):
            return True                      # read after write
        out = step.out.tensor.uid
        if out in self._read:
            return True                      # write after read
        state = dirty.get(out)
        if not self.in_place(step):
            return state == "local"          # accumulates racing the owners' in-place writes
        return state == "acc"                # in-place writes racing others' accumulates

    def _wrote(self, step) -> None:
        out = step.out.tensor
        out.version += 1                     # on every rank: version counts steps that wrote
        self._dirty[out.uid] = "local" if self.in_place(step) else "acc"
        self._read.update(t.uid for t in self._reads(step))

    def _check_distributed(self, step) -> None:
        for ref in (step.out, *step.inputs, *([step.divisor] if step.divisor is not None else [])):
            if ref.tensor.dist is None:
                raise ShapeError(
                    f"tensor {ref.tensor.name!r} in '{step.label}' is not distributed but the "
                    f"{self.name} backend runs on distributed tensors; create every tensor inside "
                    "the distributed context (with Context(...): ...) that runs it.")

    def run_step(self, step) -> None:
        if step.kind == "zero":
            step.out.tensor.zero_()
        elif step.kind == "add":
            self.add_step(step)
        elif step.kind == "hadamard":
            self.hadamard_step(step)
        elif step.kind == "contract":
            self.contract_step(step)
        else:  # the planner makes no other kind
            raise AssertionError(step.kind)

    # ---------------------------------------------------------------- owner computes
    @abstractmethod
    def fetch_blocks(self, requests) -> dict:
        """Blocks for [(tensor, key), ...] as {(uid, key): block}; owned blocks are views.

        A request may name part of a block, ``(tensor, key, (axis, lo, hi))``: the rows
        lo..hi (block-local) along one axis (or a patch cut along several axes,
        ``tasks.part_slice``), returned under ``(uid, key, part)``.
        Called by every rank at the same point; subclasses decide how remote blocks travel."""

    def add_step(self, step) -> None:
        """out[okey] += scale * A[perm] (/ D[perm]) on the owner of every output block (its
        canonical blocks only when the output stores canonical blocks)."""
        out = step.out.tensor
        a, d = step.inputs[0].tensor, step.divisor.tensor if step.divisor is not None else None
        if self.rank_local(step):
            self.add_local(step)
            return
        srcs = {okey: src for okey in out.owned_keys() if (src := add_source(step, okey))[0] is not None}
        req = [(a, s[0]) for s in srcs.values()]
        if d is not None:
            req += [(d, s[1]) for s in srcs.values()]
        blocks = self.fetch_blocks(req)
        t0, made = time.perf_counter(), []
        for okey, (akey, dkey) in srcs.items():
            blk = source_block(step, okey, blocks[(a.uid, akey)])
            if d is not None:
                blk = blk / blocks[(d.uid, dkey)].transpose(step.perms["d"])
            made.append((okey, blk))
        self.compute_seconds += time.perf_counter() - t0
        self._add_into(out, made, step.scale)

    def add_local(self, step) -> None:
        """A ``rank_local`` add: out += scale * A (/ D) on the pieces this rank holds."""
        a, d = step.inputs[0].tensor, step.divisor.tensor if step.divisor is not None else None
        t0, run = time.perf_counter(), a.dist.local_run()
        step.out.tensor.dist.local_run()[:] += step.scale * (run if d is None else run / d.dist.local_run())
        self.compute_seconds += time.perf_counter() - t0

    def hadamard_step(self, step) -> None:
        """out[okey] += scale * sum of A x B (elementwise) on the owner (home) of every output
        block: a rank lists its own output blocks' pairs only (``hadamard_block_pairs``),
        once per step structure."""
        out = step.out.tensor
        a, b = step.inputs[0].tensor, step.inputs[1].tensor
        key = ("hadamard", out.dist.ga.eid, a.dist.ga.eid, b.dist.ga.eid, step.perms["einsum"])
        if key not in self._own:
            self._own[key] = [(okey, plist) for okey in sorted(out.owned_keys())
                              if (plist := hadamard_block_pairs(step, okey))]
        pairs = self._own[key]
        req = [(a, ka) for _, v in pairs for ka, _ in v] + [(b, kb) for _, v in pairs for _, kb in v]
        blocks = self.fetch_blocks(req)
        t0 = time.perf_counter()
        expr = step.perms["einsum"]
        made = [(okey, sum(np.einsum(expr, blocks[(a.uid, ka)], blocks[(b.uid, kb)]) for ka, kb in plist))
                for okey, plist in pairs]
        self.compute_seconds += time.perf_counter() - t0
        self._add_into(out, made, step.scale)

    def _add_into(self, out, made, scale: float) -> None:
        """out[key] += scale * block for each (key, block) of ``made`` (computed here: the
        output's own blocks in place, or, stored in pieces, accumulated into its pieces,
        wherever they lie, each piece's bytes accounted to its owner; without remote
        accumulates (``accumulates`` False: every block is written by its home rank
        only) got from its pieces, added to and put back)."""
        if out.pieced:
            ga = out.dist.ga
            if self.accumulates:
                for h in [ga.iacc(key, blk, scale) for key, blk in made]:
                    h.wait()
                return
            summed: dict = {}
            for key, blk in made:
                summed[key] = summed[key] + blk if key in summed else blk
            for key, h in [(key, ga.iget(key)) for key in summed]:
                ga.put(key, h.wait() + scale * summed[key])
            return
        t0 = time.perf_counter()
        for key, blk in made:
            view = out.blocks[key]
            if scale == 1.0:
                view += blk
            else:
                view += scale * blk
        self.compute_seconds += time.perf_counter() - t0

    @abstractmethod
    def contract_step(self, step) -> None:
        """Run a ``contract`` step: one-sided block tasks or collective SUMMA."""

    # ---------------------------------------------------------------- task sets
    def run_tasks(self, task_set) -> np.ndarray:
        """Run a :class:`~tessera.backends.tasks.TaskSet` spread over the ranks; returns
        every task's result on every rank (summed over ranks, so the caller may add them
        in a fixed order). Collective. Communication is accounted under ``task_set.name``.

        Starts with a barrier: blocks that any rank wrote in place before the call (e.g.
        ``store_block`` outside a plan) are complete before a task reads them."""
        snap, t0, c0 = self.account.begin(), time.perf_counter(), self.compute_seconds
        self.barrier()
        results = np.zeros(len(task_set))
        # a task's parts one after another (TaskSet); i None: a collective round, no task
        parts = ((i, s) for i in self.task_order(task_set) for s in range(task_set.stages))
        if task_set.lookahead and self.reads_ahead:
            self._run_ahead(task_set, parts, results)
        else:
            for i, s in parts:
                blocks = self.fetch_blocks(task_set.need_part(i, s) if i is not None else [])
                if i is not None:
                    self._work_part(task_set, i, blocks, s, results)
        if self.world.size > 1:
            results = self.world.allreduce(results, "sum")
        self.account.end(task_set.name, snap, time.perf_counter() - t0, self.compute_seconds - c0,
                         task_set.flops() if task_set.flops else 0)
        return results

    def _work_part(self, task_set, i: int, blocks: dict, s: int, results) -> None:
        """Part s of task i on its blocks, its result added to ``results[i]``, timed as compute."""
        w0 = time.perf_counter()
        results[i] += task_set.work_part(i, blocks, s)
        self.compute_seconds += time.perf_counter() - w0

    def _run_ahead(self, task_set, parts, results) -> None:
        """The ``parts`` (task, stage) of a ``lookahead`` task set with the next part's
        requests in flight during this part's work: per part, its gets waited for, the
        next part's ``need`` asked and its gets posted (the next task claimed from the deal
        one part early), then this part's ``work``."""
        def post(part):                # i None: a collective round, no task (``task_order``)
            return self.post_blocks(task_set.need_part(*part) if part[0] is not None else [])
        cur = next(parts, None)
        posted = post(cur) if cur is not None else None
        while cur is not None:
            blocks = self.wait_blocks(posted)
            nxt = next(parts, None)
            if nxt is not None:
                posted = post(nxt)
            if cur[0] is not None:
                self._work_part(task_set, cur[0], blocks, cur[1], results)
            cur = nxt

    @abstractmethod
    def task_order(self, task_set):
        """Task indices for this rank (None: take part in a collective round, no task)."""

