"""``mpi-onesided``: block tasks that get their inputs from the owners and accumulate results.

The TCE model (NWChem's Tensor Contraction Engine): tensors live in global arrays; a
contraction step is a list of block tasks (``plan.blocktasks``); any rank may run any
task: it gets the input blocks it needs (one-sided, from whoever owns them), multiplies
them, and accumulates the result block into the owner's memory (atomic per element).

Schedules (who runs which task; ``backends.schedule``):
- ``nxtval``: a global counter hands out tasks in task order (a task set may ask for
  largest first, ``TaskSet.order``);
- ``steal``: a static partition by estimated cost (largest first), then each rank
  drains its own queue and steals half of what another rank has left.
A TaskSet that names a schedule (``TaskSet.schedule``, static too) is dealt by a
Scheduler kept for that schedule (created on first use, collectively); the last deal's
``DealStats`` are in ``deal_stats``.

Loop orders (how blocks travel), as in TCE:
- ``original``: per output block, get both inputs of every contributing product, GEMM
  into a local buffer, accumulate the output block once;
- ``inverted``: per block of the reused input (the operand with more bytes), get it
  once, then for every partner get it, GEMM and accumulate that product's result:
  fewer gets than ``original``, more accumulates;
- ``cached``: a batch of output tasks (all tasks of one row of blocks of the operand with
  more bytes, as ``inverted`` reuses it) first fetches the distinct input blocks it
  needs into a local cache (kept across batches of the step, bounded, least recently
  used out), then computes and accumulates once per output block: every block of the
  larger operand is fetched once in all, the other's at most once per rank: the fewest
  gets. A batch's distinct blocks fit the cache bound (an output task whose own inputs do
  not fit is cut into runs of products, each accumulating its part), and there are at
  least ``BATCHES_PER_RANK`` batches per rank where the tasks allow (``cached_batches``:
  found from the tasks' sizes, no product listed; a rank makes the tasks of its batches).
  Remote blocks of a frozen operand (the integrals) go to the executor's ``FrozenCache``
  instead, kept across steps and iterations (bounded; once full it keeps what it holds):
  a rank fetches such a block once per run while it stays there.
- ``owner`` (owner computes, for networks where remote accumulates are slow): each output
  block is computed by the rank that owns it, in ``cached``'s batches and through its
  cache, and added in place: gets only, no accumulate leaves a rank (into an output
  stored in pieces, its home rank gets the block's pieces, adds and puts them back; so
  do the other steps into it). The deal follows
  ownership (no counter), so the balance is the layout's; a rank lists only its own
  output blocks' tasks (``plan.blocktasks.owned_tasks``). The dealt variants keep the
  step's global task list: a counter (nxtval, steal) or a cost-balanced partition
  (static) hands out indices into one numbering that every rank shares.
Gets are non-blocking: the next product's blocks are in flight during the current
GEMM (original, inverted) or a whole batch is in flight at once (cached); a task set
with ``lookahead`` has its next part's blocks in flight during this part's work
(``dist_base.run_tasks``). Blocks the
rank owns are read in place, never fetched.
"""

from __future__ import annotations

import time

import numpy as np

from tessera.backends.budget import EXECUTOR_CACHE_MB
from tessera.backends.cached_batches import indexed_batches, task_batches
from tessera.backends.dist_base import DistributedExecutor, part_range
from tessera.backends.distributed import BlockCache
from tessera.backends.registry import DEFAULT_SCHEDULE, DEFAULT_VARIANT, check_options
from tessera.backends.schedule import Scheduler
from tessera.backends.tasks import part_slice
from tessera.plan.blocktasks import indexed_groups, indexed_tasks, owned_tasks


class OneSidedExecutor(DistributedExecutor):
    name = "mpi-onesided"
    reads_ahead = True        # a lookahead TaskSet's next part is fetched during this part's work

    def __init__(self, variant: str = DEFAULT_VARIANT["mpi-onesided"], schedule: str = DEFAULT_SCHEDULE,
                 cache_mb: int = EXECUTOR_CACHE_MB, world=None):
        # cached/owner: remote blocks of frozen operands (integrals) kept across iterations
        super().__init__(world, frozen_bytes=int(cache_mb) << 20)
        check_options(self.name, variant, schedule, ranks=max(2, self.world.size))
        self.variant, self.schedule = variant, schedule
        self.cache_bytes = int(cache_mb) << 20
        self.scheduler = Scheduler(self.world, schedule, barrier=self.barrier)
        self._schedulers = {schedule: self.scheduler}   # schedule name -> Scheduler
        self.deal_stats = None        # DealStats of the last task set's deal on this rank
        self._kept: dict = {}         # (what, id(tasks or groups of a step)) -> (them, what of them)

    def describe(self) -> dict:
        return {**super().describe(), "variant": self.variant, "schedule": self.schedule,
                "cache_bytes": self.cache_bytes}

    @property
    def accumulates(self) -> bool:
        return self.variant != "owner"

    def in_place(self, step) -> bool:
        if step.kind == "contract" and self.variant == "owner":
            return not step.out.tensor.pieced
        return super().in_place(step)

    def synced(self) -> None:
        super().synced()
        for s in self._schedulers.values():
            s.synced()

    def close(self) -> None:
        if not self.closed:
            for s in self._schedulers.values():
                s.free()
        super().close()

    def _once(self, what, units, make):
        """``make()`` of a step's tasks or task groups ``units`` (kept lists: the same step
        deals the same units every iteration) under the name ``what``, computed once."""
        key = (what, id(units))
        hit = self._kept.get(key)
        if hit is None or hit[0] is not units:
            hit = self._kept[key] = (units, make())
        return hit[1]

    def _costs_of(self, units, make) -> np.ndarray:
        """The cost array of ``units`` (``_once``)."""
        return self._once("costs", units, lambda: np.asarray(make(), dtype=float))

    def batches(self, costs, chunk: int = 1, partition: str = "largest_first", home=None):
        """Lists of task indices for this rank; every task goes to exactly one rank."""
        return self.scheduler.deal(costs, chunk, partition, home)

    def scheduler_for(self, schedule: str | None) -> Scheduler:
        """The Scheduler of ``schedule`` (None: the executor's), created on first use:
        collective, like every task set, which all ranks run in the same order."""
        name = schedule or self.schedule
        if name not in self._schedulers:
            self._schedulers[name] = Scheduler(self.world, name, barrier=self.barrier)
        return self._schedulers[name]

    def task_order(self, task_set):
        deal = self.scheduler_for(task_set.schedule).deal(task_set.costs, task_set.chunk,
                                                          task_set.partition, task_set.home,
                                                          task_set.order)
        self.deal_stats = deal.stats
        for batch in deal:
            yield from batch

    # ---------------------------------------------------------------- block access
    def fetch_blocks(self, requests) -> dict:
        return self.wait_blocks(self.post_blocks(requests))

    def post_blocks(self, requests) -> tuple:
        """Start getting ``requests`` (as ``fetch_blocks``): (the blocks here, as views; the
        gets in flight), for ``wait_blocks``."""
        out, pending = {}, []
        seen = set()
        for t, key, *part in requests:
            part = part[0] if part else None
            k = (t.uid, key) if part is None else (t.uid, key, part)
            if k in seen:
                continue
            seen.add(k)
            view = t.blocks.get(key)
            if view is not None:
                out[k] = view if part is None else view[part_slice(view.ndim, part)]
            elif part is None:
                pending.append((k, t.dist.ga.iget(key), None))
            elif key in t.dist.ga.aliases:         # an alias: that patch of its canonical block
                canon, perm = t.dist.ga.aliases[key]
                cpart = tuple(x for n in range(0, len(part), 3)
                              for x in (perm[part[n]], part[n + 1], part[n + 2]))
                pending.append((k, t.dist.ga.iget_patch(*part_range(t.dist.ga, canon, cpart)), perm))
            else:
                pending.append((k, t.dist.ga.iget_patch(*part_range(t.dist.ga, key, part)), None))
        return out, pending

    @staticmethod
    def wait_blocks(posted: tuple) -> dict:
        """The blocks of a ``post_blocks``: its gets waited for."""
        out, pending = posted
        for k, h, perm in pending:
            blk = h.wait()
            out[k] = blk if perm is None else blk.transpose(perm)
        return out

    # ---------------------------------------------------------------- contraction
    def contract_step(self, step) -> None:
        A, B = step.inputs[0].tensor, step.inputs[1].tensor
        out = step.out.tensor
        # owner computes: a rank lists only the tasks of its own output blocks; original,
        # inverted and cached: tasks (groups) by index (a counter's value or a static queue's
        # entry), made when run; cached cuts them into batches (by the rows or columns a
        # batch shares, by bytes) from their sizes before dealing them
        if self.variant == "inverted":
            self._inverted_loop(step, A, B, out)
            return
        tasks = owned_tasks(step, out.owned_keys()) if self.variant == "owner" else indexed_tasks(step)
        if self.variant == "cached":
            self._cached_loop(step, tasks, A, B, out)
        elif self.variant == "owner":
            self._owner_loop(step, tasks, A, B, out)
        else:
            self._original_loop(step, tasks, A, B, out)

    @staticmethod
    def _issue(t, key):
        view = t.blocks.get(key)
        return view if view is not None else t.dist.ga.iget(key)

    @staticmethod
    def _ready(x):
        return x if isinstance(x, np.ndarray) else x.wait()

    def _original_loop(self, step, tasks, A, B, out) -> None:
        pa, pb, pc = step.perms["a"], step.perms["b"], step.perms["c"]
        ga_out, scale = out.dist.ga, step.scale
        costs = self._costs_of(tasks, lambda: tasks.flops + 1)
        compute = 0.0
        for batch in self.batches(costs, 1):
            for ti in batch:
                t = tasks[ti]
                prods = t.products
                cur = (self._issue(A, prods[0].a), self._issue(B, prods[0].b))
                acc = None
                for q, p in enumerate(prods):
                    a_blk, b_blk = self._ready(cur[0]), self._ready(cur[1])
                    if q + 1 < len(prods):        # next pair in flight during this GEMM
                        cur = (self._issue(A, prods[q + 1].a), self._issue(B, prods[q + 1].b))
                    c0 = time.perf_counter()
                    prod = a_blk.transpose(pa).reshape(t.m, p.k) @ b_blk.transpose(pb).reshape(p.k, t.n)
                    if acc is None:
                        acc = prod
                    else:
                        acc += prod
                    compute += time.perf_counter() - c0
                ga_out.acc(t.out, np.ascontiguousarray(acc.reshape(t.out_shape).transpose(pc)), scale)
        self.compute_seconds += compute

    def _inverted_loop(self, step, A, B, out) -> None:
        pa, pb, pc = step.perms["a"], step.perms["b"], step.perms["c"]
        ga_out, scale = out.dist.ga, step.scale
        # groups by the reused block (A, the operand with more bytes, or B), by index:
        # a group's items made when it is run (``blocktasks.IndexedGroups``)
        reuse_a = A.nbytes >= B.nbytes
        groups = indexed_groups(step, reuse_a)
        costs = self._costs_of(groups, lambda: groups.flops + 1)
        compute = 0.0
        for batch in self.batches(costs, 1):
            for gi in batch:
                rkey, items = groups[gi]
                fixed = self._ready(self._issue(A if reuse_a else B, rkey))
                t0, p0 = items[0]
                if reuse_a:
                    fm = fixed.transpose(pa).reshape(t0.m, p0.k)
                else:
                    fm = fixed.transpose(pb).reshape(p0.k, t0.n)
                other = B if reuse_a else A
                cur = self._issue(other, items[0][1].b if reuse_a else items[0][1].a)
                handles = []
                for q, (t, p) in enumerate(items):
                    blk = self._ready(cur)
                    if q + 1 < len(items):
                        nxt = items[q + 1][1]
                        cur = self._issue(other, nxt.b if reuse_a else nxt.a)
                    c0 = time.perf_counter()
                    if reuse_a:
                        prod = fm @ blk.transpose(pb).reshape(p.k, t.n)
                    else:
                        prod = blk.transpose(pa).reshape(t.m, p.k) @ fm
                    res = np.ascontiguousarray(prod.reshape(t.out_shape).transpose(pc))
                    compute += time.perf_counter() - c0
                    handles.append(ga_out.iacc(t.out, res, scale))    # one accumulate per product
                for h in handles:
                    h.wait()
        self.compute_seconds += compute

    def _cached_loop(self, step, tasks, A, B, out) -> None:
        ga_out, scale = out.dist.ga, step.scale
        groups = self._cached_groups(tasks, A, B)      # batches of (task, first product, end)
        costs = self._costs_of(groups, lambda: groups.flops + 1)
        cache = BlockCache(self.cache_bytes)      # (which, key) -> block as a GEMM operand
        for gbatch in self.batches(costs, 1):
            batch = [e for g in gbatch for e in groups[g]]
            made = {ti: tasks[ti] for ti, _, _ in batch}      # the OutputTasks this rank runs
            have = self._prefetch(step, made, batch, A, B, cache)
            handles = [ga_out.iacc(made[ti].out, res, scale)     # once per output block (or part)
                       for ti, res in self._products(step, made, batch, have)]
            for h in handles:
                h.wait()

    def _owner_loop(self, step, tasks, A, B, out) -> None:
        """Owner computes: each output block on the rank that owns it (a static deal by
        owner), batches of its tasks as ``cached`` forms them (inputs by get, through the
        block cache), the result added in place: no accumulate leaves the rank (an output
        stored in pieces: the home rank of a block computes it and adds it to its pieces
        by get and put, ``_add_into``)."""
        groups = self._owner_groups(step, tasks, A, B)
        cache = BlockCache(self.cache_bytes)
        for batch in (groups[b] for b in range(len(groups))):
            have = self._prefetch(step, tasks, batch, A, B, cache)
            self._add_into(out, [(tasks[ti].out, res) for ti, res in self._products(step, tasks, batch, have)],
                           step.scale)

    def _owner_groups(self, step, tasks, A, B):
        """This rank's batches under ``owner``: its own tasks (``owned_tasks``) in batches
        as ``cached`` forms them for one rank (kept per task list)."""
        return self._once("owner", tasks, lambda: task_batches(step, tasks, A.nbytes >= B.nbytes, self.cache_bytes, 1))

    def _prefetch(self, step, tasks, batch, A, B, cache) -> dict:
        """{(0 | 1, key): GEMM operand} of every input block the batch's entries (task,
        lo, hi) need: from the cache (remote blocks of a frozen operand: from the
        executor's ``FrozenCache``, kept across steps and iterations), in place for owned
        blocks, else by non-blocking gets all in flight at once (each stored in a cache)."""
        perms = (step.perms["a"], step.perms["b"])
        have: dict = {}
        pending = []
        for ti, lo, hi in batch:
            t = tasks[ti]
            for p in t.products[lo:hi]:
                for which, ten, key, shape in ((0, A, p.a, (t.m, p.k)), (1, B, p.b, (p.k, t.n))):
                    k = (which, key)
                    if k in have:
                        continue
                    mat = cache.get(k)
                    if mat is None:
                        mat = self.frozen.get(ten, (key, perms[which], shape))
                    if mat is not None:
                        have[k] = mat
                        continue
                    blk = ten.blocks.get(key)
                    if blk is None:
                        pending.append((k, ten, shape, ten.dist.ga.iget(key)))
                        have[k] = None
                    else:
                        have[k] = self._operand(blk, perms[which], shape)
                        cache.put(k, have[k])
        for k, ten, shape, h in pending:
            blk = h.wait()
            c0 = time.perf_counter()
            have[k] = self._operand(blk, perms[k[0]], shape)
            self.compute_seconds += time.perf_counter() - c0
            if not self.frozen.put(ten, (k[1], perms[k[0]], shape), have[k], have[k].nbytes):
                cache.put(k, have[k])
        return have

    def _products(self, step, tasks, batch, have):
        """(task, its output block or the part of it from products lo..hi-1) for each entry
        (task, lo, hi) of the batch, from the prefetched operands."""
        pc = step.perms["c"]
        for ti, lo, hi in batch:
            t = tasks[ti]
            c0 = time.perf_counter()
            acc = None
            for p in t.products[lo:hi]:
                prod = have[(0, p.a)] @ have[(1, p.b)]
                if acc is None:
                    acc = prod
                else:
                    acc += prod
            res = np.ascontiguousarray(acc.reshape(t.out_shape).transpose(pc))
            self.compute_seconds += time.perf_counter() - c0
            yield ti, res

    def _cached_groups(self, tasks, A, B):
        """``cached_batches.indexed_batches`` of the step's ``IndexedTasks``, for this rank
        count and cache (kept per task list)."""
        by_row = A.nbytes >= B.nbytes
        return self._once(("cached", by_row), tasks,
                          lambda: indexed_batches(tasks, by_row, self.cache_bytes, self.world.size))

    @staticmethod
    def _operand(blk, perm, shape) -> np.ndarray:
        """A block as a contiguous GEMM operand (permuted once, reused by every product)."""
        return np.ascontiguousarray(blk.transpose(perm)).reshape(shape)
