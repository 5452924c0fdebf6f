"""What ``mpi-collective`` moves and holds per iteration, contraction by contraction as its
executor runs it (``collective_traffic``): the grid shape and SUMMA on it, or an operand
stationary (``backends.stationary``), with the frozen operands and the frozen inputs of
sums sent again only where the executor's frozen cache does not keep them
(``frozen_resent`` plays that cache over two iterations). From the counts of
``iteration_counts.structure_stats``; ``cost_model`` prices them.
"""

from __future__ import annotations

import math

import numpy as np

from tessera.backends.balance import collective_layers
from tessera.backends.budget import EXECUTOR_CACHE_MB
from tessera.runtime.distribution import grid_3d

FROZEN_CACHE_BYTES = EXECUTOR_CACHE_MB << 20      # what an executor keeps of frozen operands


def grid_of(nranks: int, variant: str) -> tuple:
    """(pr, pc, layers) of ``mpi-collective`` with this variant on P ranks."""
    return grid_3d(nranks, collective_layers(variant, nranks))


def collective_traffic(s: dict, nranks: int, variant: str, frozen_bytes: int = FROZEN_CACHE_BYTES) -> dict:
    """What ``mpi-collective`` moves and holds per CCSD iteration on a pr x pc x c grid,
    contraction by contraction as the executor runs it: SUMMA on the contraction's grid
    shape (``stationary.summa_grid``), or an operand kept stationary
    (``backends.stationary.choose``, owner maps as a run places the blocks; frozen operands
    moved once where the executor keeps them). ``bytes_per_rank``: per contraction the bytes
    the busiest rank receives, summed; ``bcast_bytes_per_rank``: of which panels of the
    contractions run on the grid; ``other_bytes``: per sum or Hadamard product the busiest
    rank's bytes, summed (``step_bytes.owner_step_recv``), a frozen input's not counted
    while the frozen cache keeps it; ``other_exchanges``: their all-to-alls; ``modes``: contractions per mode; ``busiest_flops``: per
    contraction the flops of its busiest rank as the executor places them, summed;
    ``exchanges``: the contractions' all-to-alls and broadcasts (``contraction_exchanges``),
    ``broadcasts`` of them and their ``bcast_rounds`` past the first; ``working_bytes`` per
    rank (largest step: on the grid twice the output rectangle, c times SUMMA's, for the
    GEMMs and the send buffers, the homes twice and one A and one B panel; stationary, the
    blocks received, frozen ones included as the first iteration receives them, and the
    partial outputs; plus what the frozen cache keeps). A frozen operand moves once while the
    executor's frozen cache (``frozen_bytes``) keeps what it sent, else every iteration
    (``frozen_resent``). Kept in ``s`` per (ranks, variant, frozen_bytes): estimate and
    memory_parts both ask."""
    memo = s.setdefault("traffic", {})
    if (nranks, variant, frozen_bytes) not in memo:
        memo[nranks, variant, frozen_bytes] = _collective_traffic(s, nranks, variant, frozen_bytes)
    return memo[nranks, variant, frozen_bytes]


def _collective_traffic(s: dict, nranks: int, variant: str, frozen_bytes: int) -> dict:
    from tessera.backends import stationary
    pr, pc, c = grid_of(nranks, variant)
    chosen = []                 # (step, grid, mode, scores, grid_items), as the executor chooses
    for st in s["collective_steps"]:
        pa, pb = st["perms"]
        if nranks > 1:      # the stationary modes' scores do not depend on the grid: once per rank count
            if nranks not in st["stationary"]:
                ops = st["operands"]
                st["stationary"][nranks] = stationary.stationary_scores(
                    st["tasks"], ops.owners, nranks, st["moved_once"], where=False, pieces=ops.tables(st["tasks"]),
                    shared=ops.tensors[0] is ops.tensors[1])
            items = stationary.grid_items(st["sig"], (pa, pb, st["perm_c"]), c, st["operands"])
            mode, grid, scores, _ = stationary.choose(st["tasks"], st["sig"], (pa, pb, st["perm_c"]), c,
                                                      st["operands"], nranks, st["moved_once"],
                                                      stationary=st["stationary"][nranks], items=items)
        else:
            mode, grid, scores, items = "summa", (1, 1, c), None, None
        # the grid's items kept only where a frozen operand resent is counted again on the grid
        chosen.append((st, grid, mode, scores, items if mode == "summa" and st["moved_once"] else None))
    resent, resent_reads, kept_bytes = frozen_resent(chosen, nranks, frozen_bytes, s["frozen_reads"]) \
        if nranks > 1 else (set(), set(), 0)
    # sums and Hadamard products: per step the busiest rank's bytes, less a frozen input's
    # while the frozen cache keeps every entry of it (``CollectiveExecutor._exchange``); an
    # all-to-all of the inputs unless every input is kept (an input every rank receives
    # nothing of included; none for a ``rank_local`` step or a zero), and one of partial
    # outputs to an output in pieces
    other, other_exchanges = 0.0, 0
    for recv, frozen, thawed, pieced in s["collective_others"]:
        kept = [part for entries, part in frozen if not resent_reads.intersection(entries)]
        other += float((recv - sum(kept, np.zeros(nranks))).max(initial=0))
        other_exchanges += int(thawed or len(kept) < len(frozen)) + int(pieced)
    moved = bcast = work = busiest = 0.0
    modes: dict = {}
    exchanges = broadcasts = rounds = 0
    for n, (st, (gr, gc, _), mode, scores, items) in enumerate(chosen):
        a, b, out = st["bytes"]
        modes[mode] = modes.get(mode, 0) + 1
        ta = st["tasks"]
        busiest += scores[mode]["flops"] if scores else float(2 * ta.m[ta.task] * ta.k @ ta.n[ta.task])
        kept = tuple(x for x in st["moved_once"] if (n, x) not in resent)
        alltoalls, bcasts, extra = contraction_exchanges(st, mode, (gr, gc, c), kept)
        exchanges += alltoalls + bcasts
        broadcasts += bcasts
        rounds += extra
        if kept != st["moved_once"]:       # a frozen operand the executor sends again every iteration
            pa, pb = st["perms"]
            scores = {mode: stationary.summa_score(st["sig"], (pa, pb, st["perm_c"]), (gr, gc, c), st["operands"],
                                                   nranks, kept, items) if mode == "summa" else
                      stationary.score(st["stationary"][nranks][1][mode], kept)}
        if mode == "summa":
            if nranks > 1:
                moved += scores["summa"]["recv_bytes"]
                bcast += scores["summa"]["panel_bytes"]
            work = max(work, 2 * out * c / nranks + 2 * (a + b) / nranks
                       + a / (gr * c * max(gr, gc)) + b / (gc * c * max(gr, gc)))
        else:
            moved += scores[mode]["recv_bytes"]
            # the first iteration receives the frozen operands too
            first = stationary.score(st["stationary"][nranks][1][mode])["recv_bytes"] if nranks > 1 else 0.0
            work = max(work, 2 * first + out / nranks)
    return {"grid": (pr, pc, c), "bytes_per_rank": moved, "other_bytes": other, "other_exchanges": other_exchanges,
            "bcast_bytes_per_rank": bcast,
            "working_bytes": work + kept_bytes, "modes": modes, "busiest_flops": busiest, "exchanges": exchanges,
            "broadcasts": broadcasts, "bcast_rounds": rounds}


def contraction_exchanges(st: dict, mode: str, grid: tuple, kept: tuple) -> tuple:
    """(all-to-alls, broadcasts, broadcast rounds past the first) the busiest rank makes in
    contraction ``st`` (a ``structure_stats`` collective step) in ``mode`` on ``grid`` with
    the frozen operands ``kept`` not sent (``CollectiveExecutor.contract_step``,
    ``_stationary_step``): the inputs' all-to-all unless both are kept, the partial
    outputs' all-to-all and, on the grid, per panel A's broadcast along its grid row (pc
    ranks) and B's along its column (pr ranks) unless kept, in a line of one rank or empty
    (``_panel``, ``Group.bcast``); a broadcast over a line of n ranks takes ceil(log2 n)
    rounds (a binomial tree)."""
    from tessera.backends.summa_layout import summa_layout
    count = int(not {"a", "b"} <= set(kept)) + 1
    if mode != "summa":
        return count, 0, 0
    gr, gc, c = grid
    lay = summa_layout(st["sig"], *st["perms"], gr, gc, c)
    sends = [(gc, lay["a_panel_size"]) if "a" not in kept and gc > 1 else None,
             (gr, lay["b_panel_size"]) if "b" not in kept and gr > 1 else None]
    best = (0, 0)
    for layer in range(c):
        bcasts = rounds = 0
        for line, sizes in filter(None, sends):
            size = sizes[layer]
            n = max(sum(size[p][g] > 0 for p in range(lay["npanel"])) for g in range(len(size[0])))
            bcasts += n
            rounds += n * (math.ceil(math.log2(line)) - 1)
        best = max(best, (bcasts, rounds))
    return count, *best


def frozen_resent(chosen: list, nranks: int, limit: int = FROZEN_CACHE_BYTES, others=()) -> tuple:
    """(contraction, operand) of the frozen operands mpi-collective sends again in every
    iteration, the indices into ``others`` of the frozen reads of sums it sends again, and
    the bytes its frozen cache then holds (a rank's working memory): its
    ``FrozenCache`` of ``limit`` bytes, played over two iterations (the second's misses),
    keeps what a contraction's frozen operand sent (on the grid its panels, under the grid
    shape's layout key, the bytes the fullest strip holds, ``summa_layout``'s
    ``a_strip_bytes``; stationary the blocks received, the bytes the rank receiving the
    most of them gets, a block once per product that reads it,
    ``CollectiveExecutor._exchange``) when it fits beside what it holds. ``chosen``: (step,
    grid, mode, ...) per contraction in order; ``others``: the frozen inputs of sums and
    Hadamard products, (index of the contraction they precede, tensor, key, bytes),
    ``step_bytes.frozen_reads``: they take the cache's room in their turn, and are not sent
    again while kept."""
    from tessera.backends.distributed import FrozenCache
    from tessera.backends.summa_layout import summa_layout
    entries = []
    for n, (st, grid, mode, *_) in enumerate(chosen):
        for x in st["moved_once"]:
            t = st["operands"].tensors["ab".index(x)]
            if mode == "summa":
                key = (x, st["sig"], *st["perms"], *grid)
                need = summa_layout(st["sig"], *st["perms"], *grid)[f"{x}_strip_bytes"]
            else:
                # per contraction, as the executor keys it (its operands and output)
                key = ("in", st["sig"], *st["perms"], st["perm_c"], mode, x, id(st["operands"].tensors[2]))
                need = int(st["stationary"][nranks][1][mode]["asked"][x].max(initial=0))
            entries.append((n, x, t, key, need))
    # a sum's entries (x: its index in ``others``) before the contraction they precede (a
    # stable sort keeps each list's order)
    entries = sorted([(n, j, t, key, need) for j, (n, t, key, need) in enumerate(others)] + entries,
                     key=lambda e: (e[0], isinstance(e[1], str)))
    cache, resent, resent_reads = FrozenCache(limit), set(), set()
    for iteration in (1, 2):
        for n, x, t, key, need in entries:
            if cache.get(t, key) is None:
                if iteration == 2 and isinstance(x, str):
                    resent.add((n, x))
                elif iteration == 2:
                    resent_reads.add(x)
                cache.put(t, key, True, need)
    return resent, resent_reads, cache.bytes
