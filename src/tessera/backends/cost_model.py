"""The cost model of one iteration on P ranks: per executor and variant, a rank's seconds,
operations, bytes moved and memory, from the counts of the iteration at given tiles
(``iteration_counts.structure_stats``: one iteration of the caller's method planned on
structure alone, every contraction step counted from its block tasks,
``plan.blocktasks.task_arrays``). ``estimate`` gives, per rank:

  time = makespan / gemm_rate                          compute: per step, the flops of the
                                                       busiest rank (tasks dealt largest first)
       + tasks/P * t_task                              Python work per block product
       + (gets * t_get + accs * t_acc) / P             one-sided operations (onesided)
       + collectives * t_coll                          collective calls (barriers and counter
                                                       setup per step)
       + bytes moved / P / bandwidth                   data movement

and for ``mpi-collective``, bulk-synchronous, the compute is per contraction its busiest
rank's flops as the executor places the products (``collective_model.collective_traffic``'s
``busiest_flops``), no barrier, and each all-to-all it makes (``exchanges``) costs
``t_exchange``, what one costs inside a CCSD iteration (``machine.json``'s
``exchange_seconds``, measured by ``bench/calibrate_machine.py``: a water cc-pVDZ
iteration's wall over its ~140 exchanges on 2 ranks, the latency, the wait for the later
rank and the executor's work around each; 0.5 ms idle against ~50 us for one alltoallv
alone, docs/distributed.md), and on P ranks ``exchange_peer_seconds`` more per rank past
the second (an all-to-all sends a message to every other rank); a broadcast along a grid
line (SUMMA's panels) costs ``t_bcast`` (the same 2-rank figure) and ``t_bcast_round``
more per round past the first of its ceil(log2 line); a collective call costs
``t_coll`` at 2 ranks and ``barrier_log2_seconds`` more per round past the first of a
barrier's ceil(log2 P) (both measured by the same script, ``Machine.on``),

with the gets, accumulates and bytes the loop order implies (one per piece of a block
stored in pieces: T2 and the integral classes where they have too few blocks for the
ranks, ``runtime.distribution.piece_count``, at least TESSERA_PIECES as a run cuts them;
``original``: both inputs
of every product, one accumulate per output block; ``inverted``: the reused operand
once, the other per product, one accumulate per product; ``cached``: every distinct
remote block once per rank, a frozen operand's once per run; ``mpi-collective``: per
contraction as the executor runs it (``collective_model.collective_traffic``: its grid shape and SUMMA on
it, or an operand stationary, ``backends.stationary``; frozen operands moved once while the
executor's frozen cache keeps them, ``collective_model.frozen_resent``; blocks
in pieces as they move; on the grid rank by rank, ``stationary.summa_recv``), the busiest
rank's bytes, and per sum or Hadamard product the busiest rank's bytes as the executor
moves them (``backends.step_bytes``, which gives any step's bytes per rank: what a rank
receives on mpi-collective, what its gets and accumulates, or gets and puts under
``owner``, move on mpi-onesided; on mpi-collective a frozen input's only while its
frozen cache keeps it, ``frozen_resent``); variant ``2.5d`` on a pr x pc x c grid: panels broadcast
within a layer's smaller grid, c partial outputs to the owners). Exact where the
executor's moves follow from structure (every mpi-collective step, mpi-onesided's sums
and Hadamard products, and the contractions of variant ``owner``, a static deal by
ownership: per step the busiest rank's flops, gets and bytes as its deal places the
tasks, ``step_bytes.onesided_owner_counts``). The other loop orders' contractions are
dealt while the step runs (schedules ``nxtval`` and ``steal``): the model counts the
mean rank, i.e. assumes the step's gets, accumulates and bytes spread evenly over the
ranks (``cached``: each rank's distinct blocks at most once) and its flops dealt largest
first (``makespan``). The constants are per node, with
the network between nodes when the ranks span several (``run_costs``).

Each candidate also gets a memory estimate per rank
(``memory_parts``: T2 + integrals of the fullest rank; what the driver holds beside
them, the structure's ``held`` bytes (for CCSD its constants, the packed amplitude
vectors of a DIIS update and, on one process, the ladder's V+-) and every intermediate of
the iteration's plans, each once, as stored (``iteration_counts.stored_bytes``), spread
over the ranks; and the working set of the largest contraction step:
for ``mpi-collective`` twice the output rectangle, c times larger with 2.5d, the homes
of the inputs and one panel each; for ``cached`` its block cache (a rank's share of the
step's product reads, at most its distinct blocks) and frozen cache; on one process the
step's temporary matrices plus the gathered matrices of constant tensors the context
caches; and every intermediate of the iteration: distributed, each keeps its global array
in the storage's pool until the context closes; on one process the heap keeps what they
freed for the next iteration (``backends.heap``): measured).

The gemm rate is measured once (one mid-size DGEMM, ``gemm_rate``); the other constants
are typical shared-memory figures measured on the development machine
(docs/distributed.md) with the calibration's exchange and scaling (``run_costs``);
``estimate`` takes others (``backends.machine``: calibrated node constants plus a network,
as ``tessera plan --ranks`` uses for machines with many nodes).
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from tessera.backends.collective_model import FROZEN_CACHE_BYTES, collective_traffic
from tessera.backends.context import thread_limit
from tessera.backends.machine import Machine
from tessera.backends.registry import DEFAULT_SCHEDULE

T_TASK = 25e-6        # s of Python and numpy overhead per block product
T_GET = 15e-6         # s per one-sided get (issue + wait)
T_ACC = 20e-6         # s per one-sided accumulate (MPI_Accumulate + flush)
T_COLL = 60e-6        # s per collective call (latency, 2 ranks on one node; more ranks, ``run_costs``)
BANDWIDTH = 2.0e9     # bytes/s moved per rank (shared memory copies)


GEMM_N = 256          # the product gemm_rate times: GEMM_N^3


def gemm_seconds(threads: int = 1) -> float:
    """Seconds of a GEMM_N^3 DGEMM on ``threads`` BLAS threads, best of five after a warm-up."""
    a = np.random.default_rng(0).standard_normal((GEMM_N, GEMM_N))
    best = 1e9
    with thread_limit(threads):
        a @ a
        for _ in range(5):
            t0 = time.perf_counter()
            a @ a
            best = min(best, time.perf_counter() - t0)
    return max(best, 1e-9)


def gemm_rate() -> float:
    """Measured single-thread DGEMM flop rate of a 256^3 product (``gemm_seconds``), flop/s,
    clamped to [1, 50] GFLOP/s against a machine busy with others."""
    return float(min(50e9, max(1e9, 2 * GEMM_N ** 3 / gemm_seconds(1))))


def memory_parts(s: dict, nranks: int, backend: str, variant: str | None = None,
                 cache: int = FROZEN_CACHE_BYTES, schedule: str = DEFAULT_SCHEDULE) -> dict:
    """Bytes per rank of one CCSD iteration on ``backend`` (one of the local executors, or
    an MPI one with its ``variant``), by part: ``stored`` (T2 + integrals of the fullest
    rank, a ``pieces`` class of too few blocks in pieces), ``held`` (the structure's other bytes and every intermediate of
    the iteration, spread over the ranks: distributed, each keeps its global array in the storage's pool; on one process
    the heap keeps what they freed for the next iteration, ``backends.heap``), ``working`` (the executor's working set; see
    the module docstring; ``cache``: the bytes each of an MPI executor's caches may hold,
    ``budget.executor_cache_bytes``; ``schedule``: mpi-onesided's, ``frozen_share``)."""
    held = (s["held_bytes"] + s["pooled_bytes"]) / nranks
    if backend == "mpi-collective":
        working = collective_traffic(s, nranks, variant, cache)["working_bytes"]
    elif backend == "mpi-onesided":
        # owner: the frozen bytes of the rank that fetches the most (its static deal), as estimate
        frozen = float(s["owner"]["frozen_per_rank"].max(initial=0)) if variant == "owner" and "owner" in s \
            else frozen_share(s, nranks, schedule)
        working = min(cache, s["max_step_rank_bytes"]) + min(cache, frozen) if variant in ("cached", "owner") else 0
    else:
        working = s["temporary_bytes"] + s["gathered_bytes"]
    return {"stored": s["memory_per_rank_max"], "held": held, "working": working}


def frozen_share(s: dict, nranks: int, schedule: str = DEFAULT_SCHEDULE) -> float:
    """Bytes of frozen operands' blocks a rank of ``cached`` fetches over the iterations
    and would keep. ``nxtval``: its deal (a shared counter) gives it other batches each
    iteration, so in time it reads nearly every frozen block held elsewhere, (P - 1) / P
    of them; ``steal``: the same static deal every iteration (steals aside), so its share
    of one iteration's reads, at most the distinct ones (measured,
    ``bench/onesided_cache_peak.py``, water tetramer C1 cc-pVDZ tile 24, 4 ranks: under
    nxtval its frozen cache held 354 MB after 2 iterations and 483 MB after 4, bounded at
    537 MB, of 694 MB it meets; under steal 254 MB after 4, where one iteration's share is
    284 MB)."""
    if schedule == "steal":
        return min(s["frozen_distinct_bytes"], s["frozen_ab_bytes"] / nranks)
    return s["frozen_distinct_bytes"] * (nranks - 1) / nranks


def kept_share(frozen_bytes: float, limit: int = FROZEN_CACHE_BYTES) -> float:
    """The share of a rank's ``frozen_bytes`` of frozen blocks that its ``FrozenCache`` of
    ``limit`` bytes keeps after the first iteration: it keeps what it took first and refuses
    the rest once full, so all of them while they fit, else about ``limit`` bytes' worth
    (counted as that share of their gets and bytes). An estimate: under ``cached`` which
    rank fetches a block is decided at run time; its error against counted runs of
    ``owner`` is in docs/distributed.md (``bench/onesided_kept_share.py``)."""
    return 1.0 if frozen_bytes <= limit else limit / frozen_bytes


def run_costs(nranks: int, ranks_per_node: int | None = None) -> dict:
    """The per-operation constants of a run on ``nranks`` ranks (``Machine.on``): within a
    node the typical figures above (T_TASK, T_GET, T_ACC, T_COLL, BANDWIDTH) with the
    calibration's exchange and how an exchange and a barrier grow with the ranks
    (``machine.json``, read when first asked, ``Machine.calibrated``); when the ranks span
    nodes (``ranks_per_node`` < ``nranks``) the network between them, default network."""
    node = replace(Machine.calibrated(), task_seconds=T_TASK, get_seconds=T_GET, acc_seconds=T_ACC,
                   collective_seconds=T_COLL, copy_bytes_per_second=BANDWIDTH)
    return node.on(nranks, ranks_per_node or nranks)


def estimate(s: dict, nranks: int, backend: str, variant: str, rate: float, costs: dict | None = None,
             cache: int = FROZEN_CACHE_BYTES, schedule: str = DEFAULT_SCHEDULE) -> dict:
    """Estimated seconds per CCSD iteration, what moves and the memory, per rank (see
    module docstring). ``costs``: the per-operation constants (default ``run_costs``: the
    ranks on one node; ``backends.machine.Machine.on`` for ranks spread over nodes);
    ``cache``: the bound of each executor cache (``budget.executor_cache_bytes``);
    ``schedule``: mpi-onesided's (``frozen_share``)."""
    c_ = run_costs(nranks) if costs is None else costs
    T_TASK, T_GET, T_ACC, T_COLL, T_EXCHANGE, BANDWIDTH = (c_[k] for k in ("t_task", "t_get", "t_acc", "t_coll",
                                                                          "t_exchange", "bandwidth"))
    P = nranks
    remote = (P - 1) / P
    compute = s["makespan_flops"] / rate          # per step, the busiest rank's flops
    memory = sum(memory_parts(s, P, backend, variant, cache, schedule).values())
    if backend == "mpi-collective":
        tr = collective_traffic(s, P, variant, cache)
        pr, pc, c = tr["grid"]
        # bulk-synchronous: each contraction ends when its busiest rank, as the executor
        # places the products, does; each all-to-all costs what one does inside an iteration
        # (``T_EXCHANGE``: the latency, the wait for the later rank, the work around it), a
        # broadcast along a grid line the same at 2 ranks and a round more per doubling of
        # the line; no barrier (sums move by all-to-all, ``other_exchanges``)
        compute = tr["busiest_flops"] / rate
        coll = tr["exchanges"] + tr["other_exchanges"]
        moved = tr["bytes_per_rank"] + tr["other_bytes"]
        seconds = (compute + s["products"] / P * T_TASK + (coll - tr["broadcasts"]) * T_EXCHANGE
                   + tr["broadcasts"] * c_["t_bcast"] + tr["bcast_rounds"] * c_["t_bcast_round"]
                   + moved / BANDWIDTH)
        return {"seconds": seconds, "compute": compute, "gets": 0, "accs": 0, "collectives": coll,
                "bytes_per_rank": moved, "bcast_bytes_per_rank": tr["bcast_bytes_per_rank"], "layers": c,
                "contraction_modes": tr["modes"], "memory_per_rank": memory}
    overhead = s["products"] / P * T_TASK + s["other_steps"] * 3 * T_COLL
    # one get or accumulate per piece of a block stored in pieces (``structure_stats``);
    # sums and Hadamard products: the busiest rank's gets and accumulates (or, owner, gets
    # and puts) of each step (``step_bytes.onesided_step_bytes``)
    other_bytes = s["owner_other_bytes" if variant == "owner" else "onesided_other_bytes"]
    if variant == "owner":
        # a static deal by ownership: the busiest rank of each contraction step, its frozen
        # blocks fetched in the first iteration only as far as they fit its frozen cache,
        # which keeps what it took first once full: the share of them that fits is kept
        # (``structure_stats``, ``step_bytes.onesided_owner_counts``); no accumulate; and the
        # busiest rank's gets and puts of each sum or Hadamard product (``owner_other_ops``)
        if "owner" not in s:
            raise ValueError("estimate of variant owner needs structure_stats(..., owner=True, block_tasks=True)")
        ow = s["owner"]
        kept = kept_share(float(ow["frozen_per_rank"].max(initial=0)), cache)
        gets = ow["ops"] - kept * (ow["ops"] - ow["thawed_ops"]) + ow["other_ops"]
        nbytes = ow["bytes"] - kept * (ow["bytes"] - ow["thawed_bytes"])
        compute = ow["flops"] / rate
        seconds = (compute + overhead + gets * T_GET + (nbytes + other_bytes) / BANDWIDTH
                   + s["contract_steps"] * 4 * T_COLL)
        return {"seconds": seconds, "compute": compute, "gets": ow["all_ops"] - kept * ow["all_frozen_ops"],
                "accs": 0, "collectives": s["contract_steps"] * 2 + s["other_steps"],
                "bytes_per_rank": nbytes + other_bytes, "bcast_bytes_per_rank": 0.0, "layers": None,
                "memory_per_rank": memory}
    if variant == "original":
        gets = s["get_ops"] * remote
        accs = s["acc_ops"]
        moved = (s["a_bytes"] + s["b_bytes"]) * remote + s["out_bytes"] * remote
    elif variant == "inverted":
        gets = s["inv_get_ops"] * remote
        accs = s["product_acc_ops"]
        moved = s["inv_bytes"] * remote + s["out_bytes"] * remote * 2
    else:
        # cached: each rank fetches every distinct block it needs once: at most all of them,
        # but a frozen operand's only in the first iteration as far as its share fits the
        # frozen cache (``frozen_share``, ``kept_share``)
        gets = P * min(s["distinct_ops"], s["get_ops"] / P) * remote
        accs = s["acc_ops"]
        kept = kept_share(frozen_share(s, P, schedule), cache)
        moved = P * min(s["distinct_bytes"] - kept * s["frozen_distinct_bytes"],
                        (s["a_bytes"] + s["b_bytes"] - kept * s["frozen_ab_bytes"]) / P) * remote \
            + s["out_bytes"] * remote
    seconds = (compute + overhead + (gets * T_GET + accs * T_ACC) / P
               + (moved / P + other_bytes) / BANDWIDTH + s["contract_steps"] * 4 * T_COLL)
    return {"seconds": seconds, "compute": compute, "gets": gets, "accs": accs,
            "collectives": s["contract_steps"] * 2 + s["other_steps"], "bytes_per_rank": moved / P + other_bytes,
            "bcast_bytes_per_rank": 0.0, "layers": None, "memory_per_rank": memory}
