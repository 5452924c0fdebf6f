"""The counts of one iteration at given tiles (``structure_stats``), what the cost model
(``cost_model``, ``collective_model``) prices: the caller's ``structure(tile, occ_tile)``
plans one iteration of its method on structure alone (no data: empty tensors in a
planning context) and names the tensors a run stores; every contraction step is counted
from its block tasks (``plan.blocktasks.task_arrays``: the sizes of every task and block
product as arrays), its flops, bytes and one-sided operations per loop order; the sums and
Hadamard products by what each executor moves (``backends.step_bytes``); the stored
classes' balance over the ranks (``backends.balance``) and the memory parts.
"""

from __future__ import annotations

import numpy as np

from tessera.backends import registry
from tessera.backends.balance import binding, class_balance
from tessera.backends.context import BLOCK_READ_COLUMNS, CACHE_BYTES, gather_twins
from tessera.backends.step_bytes import (exchanges_inputs, frozen_reads, moved_bytes, onesided_owner_counts,
                                        operands, owner_other_ops, owner_step_moves, pieces_per_block)
from tessera.plan.blocktasks import block_sizes, task_arrays
from tessera.runtime.distribution import makespan
from tessera.tensor.block_tensor import allowed_elements, flat_size

PLANNER_TEMPORARIES = ("tmp", "pairs", "half")     # names of the tensors the planner makes


def structure_stats(structure, tile: int, occ_tile: int, nranks: int, budget: float | None = None,
                    block_tasks: bool = True, least_pieces: int | None = None, owner: bool = False) -> dict:
    """Counts of one iteration with these tile sizes, from ``structure(tile, occ_tile)``:
    its ``plans`` (structure only, no data) and the ``tensors`` a run stores; the class
    balance and largest share of one tensor over the classes that bind under ``budget``
    (``balance.binding``: all without one). ``block_tasks=False``: only what
    ``memory_parts`` needs for a local executor (no block tasks: their flops, bytes and
    the distributed working sets are left out). ``least_pieces``: pieces per block at
    least (None: the run's, ``registry.least_pieces``), in the bytes moved and stored.
    ``owner``: also ``s["owner"]``, what mpi-onesided's variant ``owner`` (a static deal by
    ownership) does on each rank (``step_bytes.onesided_owner_counts``): per contraction
    step the busiest rank's flops, and its operations (gets and puts, ``ops``) and bytes
    with and without the frozen operands', summed over the steps; per sum or Hadamard
    product the busiest rank's gets and puts (``other_ops``, ``step_bytes.owner_other_ops``;
    their bytes are ``owner_other_bytes``); each rank's frozen bytes summed over the steps
    (``frozen_per_rank``) and the contractions' operations of all ranks (``all_ops``,
    ``all_frozen_ops``)."""
    least_pieces = registry.least_pieces() if least_pieces is None else least_pieces
    run = structure(tile, occ_tile)
    s = {"flops": 0, "products": 0, "a_bytes": 0, "b_bytes": 0, "out_bytes": 0,
         "distinct_bytes": 0, "inv_bytes": 0, "contract_steps": 0, "other_steps": 0, "frozen_reads": [],
         "max_gemm": 0, "distinct_blocks": 0, "makespan_flops": 0,
         "collective_steps": [], "max_step_rank_bytes": 0, "temporary_bytes": 0,
         "frozen_distinct_bytes": 0, "frozen_ab_bytes": 0,
         # one-sided operations on mpi-onesided, one per piece of a block stored in pieces
         "get_ops": 0, "acc_ops": 0, "inv_get_ops": 0, "product_acc_ops": 0, "distinct_ops": 0,
         # sums and Hadamard products: per step the busiest rank's bytes, summed (mpi-onesided);
         # per step each rank's bytes and its frozen reads' (mpi-collective, ``collective_traffic``)
         "collective_others": [], "onesided_other_bytes": 0.0, "owner_other_bytes": 0.0}
    owners = {"least": least_pieces}     # id(tensor) -> owner function, pieces, on nranks ranks
    if owner and block_tasks:
        s["owner"] = {**dict.fromkeys(("flops", "ops", "bytes", "thawed_ops", "thawed_bytes", "all_ops",
                                       "all_frozen_ops", "other_ops"), 0.0), "frozen_per_rank": np.zeros(nranks)}
    gathered: dict = {}          # (tensor, perm, sectors) -> bytes of a constant operand's matrices
    pooled: dict = {}            # intermediate (not stored, not constant) -> its bytes
    for plan in run.plans:
        for step in plan.steps:
            # a step's matrices, and the planner's intermediates it reads
            temps = [r.tensor for r in (*step.inputs, step.out) if r.tensor.name in PLANNER_TEMPORARIES]
            held = sum(8 * allowed_elements(t.spaces, t.irrep) for t in temps if t is not step.out.tensor)
            s["temporary_bytes"] = max(s["temporary_bytes"], step.memory + held)
            for r in (*step.inputs, step.out):     # every intermediate keeps its global array
                if not r.tensor.constant and all(r.tensor is not t for t in run.tensors):
                    pooled[id(r.tensor)] = stored_bytes(r.tensor)
            if step.kind != "contract":
                s["other_steps"] += 1
                if block_tasks and nranks > 1:
                    # (before the contraction of this index: the order the frozen cache sees)
                    reads = frozen_reads(step, nranks, owners)
                    first = len(s["frozen_reads"])
                    s["frozen_reads"] += [(len(s["collective_steps"]), *entry) for entry in reads]
                    moves = owner_step_moves(step, nranks, owners)
                    for key, executor in (("onesided_other_bytes", "mpi-onesided"), ("owner_other_bytes", "owner")):
                        s[key] += float(moved_bytes(moves, nranks, executor).max())
                    if "owner" in s:
                        s["owner"]["other_ops"] += float(sum(owner_other_ops(step, nranks, owners)).max())
                    # mpi-collective: each rank's bytes, per frozen input (its entries in
                    # ``frozen_reads``) what each rank receives of it, and, where it exchanges
                    # its inputs (even if no block moves: every rank decides alike), whether
                    # any input is not frozen and whether its output is in pieces
                    # (``collective_traffic``)
                    frozen = {}
                    for n, (t, *_) in enumerate(reads, first):
                        frozen.setdefault(id(t), ([], moves[0][id(t)]))[0].append(n)
                    exchanged = exchanges_inputs(step, nranks, owners)
                    ins = [r.tensor for r in (*step.inputs, *([step.divisor] if step.divisor is not None else []))]
                    s["collective_others"].append((moved_bytes(moves, nranks, "mpi-collective"),
                                                   list(frozen.values()),
                                                   exchanged and not all(t.constant for t in ins),
                                                   exchanged and pieces_per_block(owners, step.out.tensor, nranks) > 1))
                continue
            s["contract_steps"] += 1
            if "owner" in s:
                counts, total = onesided_owner_counts(step, nranks, owners), s["owner"]
                ops = counts["gets"] + counts["puts"]
                total["flops"] += float(counts["flops"].max(initial=0))
                # and without the frozen operands' (kept from the first iteration)
                for k, x, frozen in (("ops", ops, counts["frozen_gets"]), ("bytes", counts["bytes"], counts["frozen_bytes"])):
                    total[k] += float(x.max(initial=0))
                    total["thawed_" + k] += float((x - frozen).max(initial=0))
                total["frozen_per_rank"] += counts["frozen_bytes"]
                total["all_ops"] += float(ops.sum())
                total["all_frozen_ops"] += float(counts["frozen_gets"].sum())
            # a constant left operand of few columns is read from its blocks, not gathered
            # (``Context._gathered``)
            from_blocks = all(sec.cols.total <= BLOCK_READ_COLUMNS for sec in step.sectors)
            for ref, side in zip(step.inputs, "ab"):
                if ref.tensor.constant and step.sectors and not (side == "a" and from_blocks):
                    dims = [(sec.rows.total, sec.inner.total) if side == "a" else (sec.inner.total, sec.cols.total)
                            for sec in step.sectors]
                    rows = step.sectors[0].rows if side == "a" else step.sectors[0].inner
                    # a gather and its twins (context.gather_twins) are cached once
                    key = min((ref.tensor.uid, q, tuple(sorted((c, r) if swapped else (r, c) for r, c in dims)))
                              for q, swapped in gather_twins(ref.tensor, step.perms[side], len(rows.tuples[0])))
                    gathered[key] = 8 * sum(r * c for r, c in dims)
            if not block_tasks:
                continue
            ta = task_arrays(step)
            m, n = ta.m[ta.task], ta.n[ta.task]
            flops = 2 * m * ta.k * n
            s["makespan_flops"] += makespan(np.bincount(ta.task, weights=flops, minlength=len(ta.out)), nranks)
            a_sum, b_sum = 8 * int((m * ta.k).sum()), 8 * int((ta.k * n).sum())
            bytes_a, bytes_b = (8 * int(size.sum()) for size in block_sizes(ta))
            out_bytes = 8 * int(ta.m @ ta.n)
            frozen_a, frozen_b = (r.tensor.constant for r in step.inputs)
            s["out_bytes"] += out_bytes
            s["products"] += len(ta.k)
            s["flops"] += int(flops.sum())
            s["a_bytes"] += a_sum
            s["b_bytes"] += b_sum
            s["frozen_ab_bytes"] += frozen_a * a_sum + frozen_b * b_sum
            s["distinct_bytes"] += bytes_a + bytes_b
            s["frozen_distinct_bytes"] += frozen_a * bytes_a + frozen_b * bytes_b
            # what one rank reads in the step (cached, owner: its block cache's bytes): its
            # share of the products' reads, at most the step's distinct blocks
            s["max_step_rank_bytes"] = max(s["max_step_rank_bytes"], min(bytes_a + bytes_b, (a_sum + b_sum) / nranks))
            reuse_a = bytes_a >= bytes_b
            ka, kb, kc = (pieces_per_block(owners, r.tensor, nranks) for r in (*step.inputs, step.out))
            s["get_ops"] += len(ta.k) * (ka + kb)
            s["acc_ops"] += len(ta.out) * kc
            s["product_acc_ops"] += len(ta.k) * kc
            s["inv_get_ops"] += len(ta.a_keys) * ka + len(ta.k) * kb if reuse_a else len(ta.b_keys) * kb + len(ta.k) * ka
            s["distinct_ops"] += len(ta.a_keys) * ka + len(ta.b_keys) * kb
            s["inv_bytes"] += (bytes_a if reuse_a else bytes_b) + (b_sum if reuse_a else a_sum)
            s["collective_steps"].append({
                "bytes": (bytes_a, bytes_b, out_bytes), "tasks": ta, "perms": (step.perms["a"], step.perms["b"]),
                "sig": tuple((sec.irrep, sec.rows, sec.inner, sec.cols) for sec in step.sectors),
                "operands": operands(owners, step, nranks), "perm_c": step.perms["c"],
                "moved_once": tuple(x for x, r in zip("ab", step.inputs) if r.tensor.constant), "stationary": {}})
            for sec in step.sectors:
                s["max_gemm"] = max(s["max_gemm"], sec.rows.total * sec.cols.total)
    # memory balance of the stored tensors (in total and of the worst binding class), and
    # the largest share of one binding tensor on one rank (as both MPI executors store them:
    # a ``pieces`` class of too few blocks in pieces)
    per_class = class_balance({i: t for i, t in enumerate(run.tensors)}, nranks, least_pieces)
    total = per_class.pop("total")
    bind = binding(per_class, budget)
    s["max_tensor_share"] = max((c["max_bytes"] / (c["mean_bytes"] * nranks) for c in bind.values()
                                 if c["mean_bytes"]), default=0.0)
    s["class_max_over_mean"] = max((c["max_over_mean"] for c in bind.values()), default=1.0)
    s["memory_per_rank_max"] = total["max_bytes"]
    s["memory_max_over_mean"] = total["max_over_mean"]
    s["tiles"] = run.tiles
    s["gathered_bytes"] = min(CACHE_BYTES, sum(gathered.values()))
    s["held"] = dict(getattr(run, "held", {}))
    s["held_bytes"] = sum(s["held"].values())
    s["dressing_bytes"] = getattr(run, "dressing", 0)
    if sum(gathered.values()) > CACHE_BYTES:
        # the gathered cache cannot keep every constant: the dressing's M+- may keep their
        # own blocks (``Context.store_constants_gathered`` finds no kept matrix), held beside
        s["held_bytes"] += s["dressing_bytes"]
    s["pooled_bytes"] = sum(pooled.values())
    return s


def stored_bytes(t) -> int:
    """Bytes a tensor's storage holds, from its structure: its allowed blocks, or, stored
    canonical (``aliases``: T2, tau, R2, ...), its canonical blocks only."""
    return 8 * (flat_size(t.spaces, t.irrep, t.aliases) if t.aliases else allowed_elements(t.spaces, t.irrep))
