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
iteration. ``summa_recv`` counts SUMMA (2.5D) on the contraction's grid in the same
terms, rank by rank, as the executor moves it (inputs to their homes, panels, outputs to
their owners); ``choose`` compares it with the three modes, per contraction. Pure
functions of the block tasks and the operands' owner maps and pieces (``Operands``), the
same on every rank; no MPI (tests and the cost model run them for simulated rank counts).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from tessera.backends.summa_layout import FLOPS_PER_BYTE, summa_layout
from tessera.plan.blocktasks import block_sizes
from tessera.runtime.placement import part_runs

MODES = ("a", "b", "c")


def owner_arrays(ta, owners: tuple) -> tuple:
    """The owners (functions of A, B, C) of ``ta``'s A keys, B keys and output keys, as arrays."""
    return tuple(np.array([owner(key) for key in keys], dtype=np.int64)
                 for owner, keys in zip(owners, (ta.a_keys, ta.b_keys, ta.out)))


def _plan(ta, mode: str, own: tuple, nranks: int, where: bool = True, pieces=(None, None, None),
          shared: bool = False) -> dict:
    """``where[t][q]``: the rank of product q of task t; per rank ``flops``, ``recv``
    ({"a", "b": bytes of distinct remote input blocks, "c": bytes of partial outputs}),
    ``asked`` ({"a", "b": bytes of the input blocks its products read that it does not own,
    a block once per product; a block in pieces whole});
    ``ta``: the step's ``plan.blocktasks.TaskArrays``, ``own``: ``owner_arrays`` (a block
    stored in pieces: its home); ``pieces``: per operand None (whole blocks) or its blocks'
    pieces, (index into ``ta``'s A keys, B keys or outputs, rank, elements); ``shared``: A
    and B are one tensor (a block both read moves to a rank once)."""
    if mode not in MODES:
        raise ValueError(f"unknown stationary operand {mode!r}; expected one of {MODES}")
    own_a, own_b, dest = own
    ranks = (own_a[ta.a] if mode == "a" else own_b[ta.b] if mode == "b" else dest[ta.task])
    flops = np.bincount(ranks, weights=2.0 * ta.m[ta.task] * ta.k * ta.n[ta.task], minlength=nranks)
    recv, moved, asked = {}, {}, {}
    for x, ids, own_x, size, table in zip("ab", (ta.a, ta.b), (own_a, own_b), block_sizes(ta), pieces):
        # what ``CollectiveExecutor._exchange`` sizes a frozen operand's entry by: a block
        # (a pieced one whole) per product that reads it, where its rank does not own it
        asked[x] = np.bincount(ranks, weights=8.0 * size[ids] * (True if table is not None else own_x[ids] != ranks),
                               minlength=nranks)
        # each (block, rank) once; a block in pieces moves to its home when stationary too
        ids, at = distinct_pairs(ids, ranks, nranks, stays=mode == x and table is None)
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
    t, at = distinct_pairs(ta.task, ranks, nranks, stays=mode == "c" and pieces[2] is None)   # each (task, rank) once
    if pieces[2] is None:
        t = t[at != dest[t]]
        recv["c"] = np.bincount(dest[t], weights=8.0 * ta.m[t] * ta.n[t], minlength=nranks)
    else:       # each piece from every rank with products of its block, but its owner
        index, rank, count = pieces[2]
        senders = np.bincount(t, minlength=len(ta.out))[index] - held((t, at, np.ones(len(t))), index, rank, nranks)
        recv["c"] = np.bincount(rank, weights=8.0 * count * senders, minlength=nranks)
    out = {"flops": flops, "recv": recv, "asked": asked}
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


def distinct_pairs(ids, ranks, nranks: int, stays: bool = False) -> tuple:
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


class Operands(NamedTuple):
    """A contraction's A, B and output as a run stores them: the ``tensors``, their
    ``owners`` (functions: key -> owner, of a block in pieces its home) and ``pieces``
    (functions: keys -> (index into keys, rank, elements) of every piece of those blocks,
    in element order, an alias as its stored block; None: whole blocks). The executor
    gives its arrays' (``GlobalArray.piece_table``), the cost model the placement's
    (``step_bytes.piece_rows``)."""
    tensors: tuple
    owners: tuple
    pieces: tuple

    def tables(self, ta) -> tuple:
        """The ``pieces`` of ``ta``'s A keys, B keys and outputs (``_plan``'s ``pieces``)."""
        return tuple(None if f is None else f(keys) for f, keys in zip(self.pieces, (ta.a_keys, ta.b_keys, ta.out)))


def _lacked(t, owner, pieces_of, items, size, nranks: int) -> np.ndarray:
    """Bytes each rank receives of ``items`` ((key, part, destination rank), each once) of
    tensor ``t``, of ``size`` elements each: a block (part) the destination does not own
    whole, less, for a block in pieces, the part's elements in the destination's own pieces
    (``placement.part_runs`` on the alias's stored block)."""
    if not items:
        return np.zeros(nranks)
    keys, dest = [k for k, _, _ in items], np.array([d for _, _, d in items], dtype=np.int64)
    size = np.asarray(size, dtype=float)
    table = None if pieces_of is None else pieces_of(keys)
    if table is None:
        lacks = size * (np.array([owner(k) for k in keys], dtype=np.int64) != dest)
        return np.bincount(dest, weights=8.0 * lacks, minlength=nranks)
    whole = np.array([part is None for _, part, _ in items])
    lacks = size - held(table, np.arange(len(keys)), dest, nranks) * whole
    index, rank, count = table
    first = np.searchsorted(index, np.arange(len(keys) + 1))
    for i in np.flatnonzero(~whole).tolist():
        key, part, _ = items[i]
        stored, perm = t.aliases[key] if key in t.aliases else (key, None)
        shape = t.block_shape(stored)
        lo, hi = [0] * len(shape), list(shape)
        for n in range(0, len(part), 3):
            axis = part[n] if perm is None else perm[part[n]]
            lo[axis], hi[axis] = part[n + 1], part[n + 2]
        r, c = rank[first[i]:first[i + 1]], count[first[i]:first[i + 1]]
        owners, _, _, runs = part_runs(list(zip(r.tolist(), [0] * len(r), (np.cumsum(c) - c).tolist(), c.tolist())),
                                       shape, lo, hi)
        lacks[i] -= float(runs[owners == dest[i]].sum())
    return np.bincount(dest, weights=8.0 * lacks, minlength=nranks)


def summa_recv(sig, perms: tuple, grid: tuple, ops: Operands, nranks: int, moved_once=()) -> dict:
    """Bytes each rank receives when the contraction runs on the pr x pc x layers grid, as
    ``CollectiveExecutor.contract_step`` moves them (``summa_layout``), per rank: ``a``,
    ``b``: the blocks (parts) to their homes by the all-to-all (each (block part, rank)
    once, A and B of one tensor in one exchange; the elements the home does not hold);
    ``panels``: the broadcasts, A panels along grid rows and B panels along grid columns
    (every member but the root receives one; a grid line of one rank, none); ``c``: the
    output rectangles' blocks (canonical ones) to their owners, cut at their pieces (a
    rank keeps what it holds). An operand in ``moved_once`` (frozen: the executor keeps its
    panels) moves nothing; ``flops``: each rank's GEMM flops."""
    pa, pb, perm_c = perms
    pr, pc, layers = grid
    lay = summa_layout(sig, pa, pb, pr, pc, layers)
    (A, B, C), owners, pieces = ops
    recv = {}
    seen = set()                     # ``exchange``: each (array, key, part, rank) once
    for x, t, owner, pieces_of in (("a", A, owners[0], pieces[0]), ("b", B, owners[1], pieces[1])):
        items, size = [], []
        if x not in moved_once:
            for (key, part, hl, hr, hc), n in zip(lay[f"{x}_homes"], lay[f"{x}_home_sizes"]):
                tag = (id(t), key, part, (hl * pr + hr) * pc + hc)
                if tag not in seen:
                    seen.add(tag)
                    items.append(tag[1:])
                    size.append(n)
        recv[x] = _lacked(t, owner, pieces_of, items, size, nranks)
    panels = np.zeros((layers, pr, pc))
    npanel = lay["npanel"]
    if "a" not in moved_once and pc > 1:
        a = 8.0 * np.array(lay["a_panel_size"], dtype=float).reshape(layers, npanel, pr)
        panels += a.sum(1)[:, :, None]
        for p in range(npanel):
            panels[:, :, p % pc] -= a[:, p, :]
    if "b" not in moved_once and pr > 1:
        b = 8.0 * np.array(lay["b_panel_size"], dtype=float).reshape(layers, npanel, pc)
        panels += b.sum(1)[:, None, :]
        for p in range(npanel):
            panels[:, p % pr, :] -= b[:, p, :]
    recv["panels"] = panels.reshape(-1)
    # the output blocks of each grid position's rectangle (the same in every layer) and
    # the layers that send them
    outs, src, size, sends = [], [], [], []
    for n, (_, rows, _, cols) in enumerate(sig):
        on = [hl for hl in range(layers) if lay["active"][n][hl]]
        for hr in range(pr):
            for hc in range(pc):
                for r, c, _, _ in lay["out"][n][hr][hc] if on else ():
                    okey = tuple((rows.tuples[r] + cols.tuples[c])[q] for q in perm_c)
                    if okey not in C.aliases:
                        outs.append(okey)
                        src.append(hr * pc + hc)
                        size.append(rows.sizes[r] * cols.sizes[c])
                        sends.append(on)
    recv["c"] = np.zeros(nranks)
    src = np.array(src, dtype=np.int64)
    table = None if pieces[2] is None or not outs else pieces[2](outs)
    if table is None:
        dest = np.array([owners[2](k) for k in outs], dtype=np.int64)
        size = np.array(size, dtype=float)
    else:
        index, rank, count = table
    for hl in range(layers):
        sent = np.array([hl in on for on in sends], dtype=bool)
        at = src + hl * pr * pc
        if table is None:
            recv["c"] += np.bincount(dest, weights=8.0 * size * (sent & (dest != at)), minlength=nranks)
        else:
            away = sent[index] & (rank != at[index])
            recv["c"] += np.bincount(rank[away], weights=8.0 * count[away], minlength=nranks)
    inner = np.array(lay["panel_inner"], dtype=float).reshape(len(sig), layers, npanel).sum(2)
    recv["flops"] = 2 * np.einsum("ng,nh,nl->lgh", np.array(lay["row_total"], dtype=float).reshape(len(sig), pr),
                                  np.array(lay["col_total"], dtype=float).reshape(len(sig), pc), inner).reshape(-1)
    return recv


def summa_score(sig, perms: tuple, grid: tuple, ops: Operands, nranks: int, moved_once=()) -> dict:
    """SUMMA's busiest rank on its grid in ``score``'s terms, from what each rank receives
    (``summa_recv``); also ``panel_bytes``, the most one rank receives in panels."""
    recv = summa_recv(sig, perms, grid, ops, nranks, moved_once)
    total = recv["a"] + recv["b"] + recv["panels"] + recv["c"]
    return {"flops": float(recv["flops"].max(initial=0)), "recv_bytes": float(total.max(initial=0)),
            "cost": float((recv["flops"] + FLOPS_PER_BYTE * total).max(initial=0)),
            "panel_bytes": float(recv["panels"].max(initial=0))}


def choose(ta, sig, perms: tuple, grid: tuple, ops: Operands, nranks: int, moved_once=(), modes=MODES,
           stationary: tuple | None = None) -> tuple:
    """(mode, scores, plans): ``"summa"`` or the stationary operand (of ``modes``) of least
    cost for the busiest rank (``perms``: the step's axis orders of A, B and C; ``grid``:
    SUMMA's pr, pc, layers; ``ops``: the operands as stored); a tie keeps SUMMA. ``scores``
    maps each mode to its ``score`` (SUMMA's: ``summa_score``), ``plans`` each stationary
    mode to its ``plan``; ``stationary``: ``stationary_scores`` of these tasks and owners,
    when the caller has them (they do not depend on the grid)."""
    scores = {"summa": summa_score(sig, perms, grid, ops, nranks, moved_once)}
    kept, plans = stationary or stationary_scores(ta, ops.owners, nranks, moved_once, modes, pieces=ops.tables(ta),
                                                  shared=ops.tensors[0] is ops.tensors[1])
    if set(kept) != set(modes):
        raise ValueError(f"stationary scores of modes {sorted(kept)}, asked for {sorted(modes)}")
    scores.update(kept)
    best = min(scores, key=lambda m: (scores[m]["cost"], m != "summa"))
    return best, scores, plans
