"""Which operand of a contraction stays where it lives on ``mpi-collective`` (structure only).

SUMMA (``summa_layout``) moves every operand: A and B to their homes on the grid, their
panels along grid rows and columns, the output pieces to the owners. When one operand is
much larger than the others (the vvvv or ovvv integrals against tau), moving it costs
more than moving the others to it. A stationary mode keeps one operand in place and runs
each block product on the rank that owns that operand's block:

- ``a``: products on the owner of their A block; B blocks go there, partial output
  blocks (summed over the rank's products of one output block) go to the output's owner;
- ``b``: the same with B;
- ``c``: products on the owner of their output block; A and B blocks go there, the
  result is added in place (owner computes).

``plan`` gives, for a mode, the rank of each (output task, product) and, per rank, the
flops, the bytes of blocks received per operand (distinct remote blocks) and of partial
outputs received; ``score`` the busiest rank's cost as ``summa_layout.grid_score`` counts
it (flops + FLOPS_PER_BYTE x bytes received), where an operand marked ``moved_once`` (a
frozen operand the executor keeps: the integrals) costs nothing after its first
iteration. ``choose`` compares SUMMA on the contraction's grid with the three modes,
per contraction. Pure functions of the block tasks and the owner maps, the same on
every rank; no MPI (tests and the cost model run them for simulated rank counts).
"""

from __future__ import annotations

import numpy as np

from tessera.backends.summa_layout import FLOPS_PER_BYTE, grid_score

MODES = ("a", "b", "c")


def plan(tasks, mode: str, owner_a, owner_b, owner_c, nranks: int) -> dict:
    """``where[t][q]``: the rank of product q of task t; per rank ``flops``, ``recv``
    ({"a", "b": bytes of distinct remote input blocks, "c": bytes of partial outputs})."""
    if mode not in MODES:
        raise ValueError(f"unknown stationary operand {mode!r}; expected one of {MODES}")
    flops = np.zeros(nranks)
    recv = {x: np.zeros(nranks) for x in "abc"}
    seen: set = set()
    where = []
    for t in tasks:
        dest = owner_c(t.out)
        ranks = [owner_a(p.a) if mode == "a" else owner_b(p.b) if mode == "b" else dest for p in t.products]
        where.append(ranks)
        for p, r in zip(t.products, ranks):
            flops[r] += 2 * t.m * p.k * t.n
            for x, key, size in (("a", p.a, t.m * p.k), ("b", p.b, p.k * t.n)):
                if (x, key, r) not in seen:
                    seen.add((x, key, r))
                    if (owner_a if x == "a" else owner_b)(key) != r:
                        recv[x][r] += 8 * size
        for r in set(ranks) - {dest}:
            recv["c"][dest] += 8 * t.m * t.n
    return {"where": where, "flops": flops, "recv": recv}


def score(p: dict, moved_once=()) -> dict:
    """The busiest rank of a ``plan``: ``flops``, ``recv_bytes`` (operands in ``moved_once``
    not counted) and ``cost`` (flops + FLOPS_PER_BYTE x bytes, of the same rank)."""
    recv = sum(v for x, v in p["recv"].items() if x not in moved_once)
    cost = p["flops"] + FLOPS_PER_BYTE * recv
    return {"flops": float(p["flops"].max(initial=0)), "recv_bytes": float(np.max(recv, initial=0)),
            "cost": float(cost.max(initial=0))}


def summa_score(sig, pa, pb, pr: int, pc: int, layers: int, in_bytes: dict, out_bytes: float, nranks: int,
                moved_once=()) -> dict:
    """SUMMA's busiest rank on its grid in the same terms: ``grid_score``'s panels (an
    operand in ``moved_once`` kept: no panels) plus a rank's share of the redistribution
    that leaves its owner, the inputs to their homes (``in_bytes``: {"a", "b": bytes})
    and ``layers`` partial outputs of ``out_bytes`` to the owners."""
    sc = grid_score(sig, pa, pb, pr, pc, layers, a=("a" not in moved_once), b=("b" not in moved_once))
    share = (sum(v for x, v in in_bytes.items() if x not in moved_once) + layers * out_bytes) \
        * (nranks - 1) / nranks ** 2                    # a rank's share, less what stays with it
    recv = sc["recv_bytes"] + share
    return {"flops": sc["flops"], "recv_bytes": recv, "cost": sc["cost"] + FLOPS_PER_BYTE * share}


def choose(tasks, sig, pa, pb, grid: tuple, owners: tuple, nranks: int, moved_once=(), modes=MODES) -> tuple:
    """(mode, scores, plans): ``"summa"`` or the stationary operand (of ``modes``) of least
    cost for the busiest rank (``grid``: SUMMA's pr, pc, layers; ``owners``: owner
    functions of A, B, C); a tie keeps SUMMA. ``scores`` maps each mode to its ``score``,
    ``plans`` each stationary mode to its ``plan``."""
    pr, pc, layers = grid
    in_bytes = {"a": 0.0, "b": 0.0}
    seen: set = set()
    out_bytes = 0.0
    for t in tasks:
        out_bytes += 8 * t.m * t.n
        for p in t.products:
            for x, key, size in (("a", p.a, t.m * p.k), ("b", p.b, p.k * t.n)):
                if (x, key) not in seen:
                    seen.add((x, key))
                    in_bytes[x] += 8 * size
    scores = {"summa": summa_score(sig, pa, pb, pr, pc, layers, in_bytes, out_bytes, nranks, moved_once)}
    plans = {mode: plan(tasks, mode, *owners, nranks) for mode in modes}
    scores.update({mode: score(p, moved_once) for mode, p in plans.items()})
    best = min(scores, key=lambda m: (scores[m]["cost"], m != "summa"))
    return best, scores, plans
