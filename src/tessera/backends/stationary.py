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

``stationary_scores`` plans each mode: it gives the rank of each (output task, product) and, per rank, the
flops, the bytes of blocks received per operand (distinct remote blocks) and of partial
outputs received, as ``exchange`` and ``deliver`` move them for an operand stored in pieces
too (``pieces``: a block's elements the rank lacks come from their holders, the stationary
operand's to its block's home; a partial output goes in pieces to their owners); ``score`` the busiest rank's cost as ``summa_layout.grid_score`` counts
it (flops + FLOPS_PER_BYTE x bytes received), where an operand marked ``moved_once`` (a
frozen operand the executor keeps: the integrals) costs nothing after its first
iteration. ``choose`` compares SUMMA on the contraction's grid with the three modes,
per contraction. Pure functions of the block tasks and the owner maps, the same on
every rank; no MPI (tests and the cost model run them for simulated rank counts).
"""

from __future__ import annotations

import numpy as np

from tessera.backends.summa_layout import FLOPS_PER_BYTE, grid_score
from tessera.plan.blocktasks import block_sizes

MODES = ("a", "b", "c")


def owner_arrays(ta, owners: tuple) -> tuple:
    """The owners (functions of A, B, C) of ``ta``'s A keys, B keys and output keys, as arrays."""
    return tuple(np.array([owner(key) for key in keys], dtype=np.int64)
                 for owner, keys in zip(owners, (ta.a_keys, ta.b_keys, ta.out)))


def _plan(ta, mode: str, own: tuple, nranks: int, where: bool = True, pieces=(None, None, None),
          shared: bool = False) -> dict:
    """``where[t][q]``: the rank of product q of task t; per rank ``flops``, ``recv``
    ({"a", "b": bytes of distinct remote input blocks, "c": bytes of partial outputs});
    ``ta``: the step's ``plan.blocktasks.TaskArrays``, ``own``: ``owner_arrays`` (a block
    stored in pieces: its home); ``pieces``: per operand None (whole blocks) or its blocks'
    pieces, (index into ``ta``'s A keys, B keys or outputs, rank, elements); ``shared``: A
    and B are one tensor (a block both read moves to a rank once)."""
    if mode not in MODES:
        raise ValueError(f"unknown stationary operand {mode!r}; expected one of {MODES}")
    own_a, own_b, dest = own
    ranks = (own_a[ta.a] if mode == "a" else own_b[ta.b] if mode == "b" else dest[ta.task])
    flops = np.bincount(ranks, weights=2.0 * ta.m[ta.task] * ta.k * ta.n[ta.task], minlength=nranks)
    recv, moved = {}, {}
    for x, ids, own_x, size, table in zip("ab", (ta.a, ta.b), (own_a, own_b), block_sizes(ta), pieces):
        # each (block, rank) once; a block in pieces moves to its home when stationary too
        ids, at = _pairs(ids, ranks, nranks, stays=mode == x and table is None)
        lacks = (own_x[ids] != at) * size[ids] if table is None else size[ids] - held(table, ids, at, nranks)
        moved[x] = (ids, at, lacks)
    if shared:                  # B's blocks that A's already bring
        index = {k: i for i, k in enumerate(ta.a_keys)}
        ids, at, lacks = moved["b"]
        as_a = np.array([index.get(k, -1) for k in ta.b_keys], dtype=np.int64)[ids]
        keep = ~((as_a >= 0) & np.isin(as_a * nranks + at, moved["a"][0] * nranks + moved["a"][1]))
        moved["b"] = (ids[keep], at[keep], lacks[keep])
    for x, (ids, at, lacks) in moved.items():
        recv[x] = np.bincount(at, weights=8.0 * lacks, minlength=nranks)
    t, at = _pairs(ta.task, ranks, nranks, stays=mode == "c" and pieces[2] is None)   # each (task, rank) once
    if pieces[2] is None:
        t = t[at != dest[t]]
        recv["c"] = np.bincount(dest[t], weights=8.0 * ta.m[t] * ta.n[t], minlength=nranks)
    else:       # each piece from every rank with products of its block, but its owner
        index, rank, count = pieces[2]
        senders = np.bincount(t, minlength=len(ta.out))[index] - held((t, at, np.ones(len(t))), index, rank, nranks)
        recv["c"] = np.bincount(rank, weights=8.0 * count * senders, minlength=nranks)
    out = {"flops": flops, "recv": recv}
    if where:
        flat = ranks.tolist()
        out["where"] = [flat[s:e] for s, e in zip(ta.start[:-1].tolist(), ta.start[1:].tolist())]
    return out


def held(table, ids, at, nranks: int) -> np.ndarray:
    """Elements of block ``ids[i]`` that rank ``at[i]`` holds, from ``table`` (index, rank,
    elements) of its pieces."""
    index, rank, count = table
    codes, where = np.unique(index * nranks + rank, return_inverse=True)
    elements = np.bincount(where.reshape(-1), weights=count, minlength=len(codes))
    ask = ids * nranks + at
    if not len(codes):
        return np.zeros(len(ask))
    pos = np.minimum(np.searchsorted(codes, ask), len(codes) - 1)
    return np.where(codes[pos] == ask, elements[pos], 0)


def _pairs(ids, ranks, nranks: int, stays: bool) -> tuple:
    """(ids, ranks) of the distinct (id, rank) pairs, by id then rank; none when ``stays``
    (the operand that stays: every product runs where its block lives, nothing moves)."""
    if stays:
        return ids[:0], ranks[:0]
    pairs = np.sort(ids * nranks + ranks)
    first = np.ones(len(pairs), dtype=bool)          # np.unique's result, without its hashing
    first[1:] = pairs[1:] != pairs[:-1]
    pairs = pairs[first]
    return pairs // nranks, pairs % nranks


def stationary_scores(ta, owners: tuple, nranks: int, moved_once=(), modes=MODES, where: bool = True,
                      pieces=(None, None, None), shared: bool = False) -> tuple:
    """({mode: score}, {mode: plan}) of the stationary ``modes`` (``owners``: functions of A,
    B, C; ``where=False``: plans without ``where``, for a cost model; ``pieces``, ``shared``:
    ``_plan``'s). Independent of the grid."""
    own = owner_arrays(ta, owners)
    plans = {mode: _plan(ta, mode, own, nranks, where, pieces, shared) for mode in modes}
    return {mode: score(p, moved_once) for mode, p in plans.items()}, plans


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


def choose(ta, sig, pa, pb, grid: tuple, owners: tuple, nranks: int, moved_once=(), modes=MODES,
           stationary: tuple | None = None, pieces=(None, None, None), shared: bool = False) -> tuple:
    """(mode, scores, plans): ``"summa"`` or the stationary operand (of ``modes``) of least
    cost for the busiest rank (``grid``: SUMMA's pr, pc, layers; ``owners``: owner
    functions of A, B, C); a tie keeps SUMMA. ``scores`` maps each mode to its ``score``,
    ``plans`` each stationary mode to its ``plan``; ``stationary``: ``stationary_scores``
    of these tasks and owners, when the caller has them (they do not depend on the grid);
    ``pieces``, ``shared``: ``_plan``'s."""
    pr, pc, layers = grid
    size_a, size_b = block_sizes(ta)
    in_bytes = {"a": 8.0 * float(size_a.sum()), "b": 8.0 * float(size_b.sum())}
    out_bytes = 8.0 * float(ta.m @ ta.n)
    scores = {"summa": summa_score(sig, pa, pb, pr, pc, layers, in_bytes, out_bytes, nranks, moved_once)}
    kept, plans = stationary or stationary_scores(ta, owners, nranks, moved_once, modes, pieces=pieces,
                                                  shared=shared)
    if set(kept) != set(modes):
        raise ValueError(f"stationary scores of modes {sorted(kept)}, asked for {sorted(modes)}")
    scores.update(kept)
    best = min(scores, key=lambda m: (scores[m]["cost"], m != "summa"))
    return best, scores, plans
