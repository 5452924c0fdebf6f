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
their owners), ``summa_grid`` the grid shape of least such cost; ``choose`` compares SUMMA
on that grid with the three modes, per contraction. Pure
functions of the block tasks and the operands' owner maps and pieces (``Operands``), the
same on every rank; no MPI (tests and the cost model run them for simulated rank counts).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from tessera.backends.summa_layout import FLOPS_PER_BYTE, grid_deal, inner_units, least_idle_shapes
from tessera.plan.blocktasks import block_sizes, invert_key
from tessera.runtime.placement import box_elements_before

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
        out["where"] = per_task(ta, ranks)
    return out


def per_task(ta, ranks) -> list:
    """``ranks`` (one per product of ``ta``) as one list per task."""
    flat = ranks.tolist()
    return [flat[s:e] for s, e in zip(ta.start[:-1].tolist(), ta.start[1:].tolist())]


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


def grid_items(sig, perms: tuple, layers: int, ops: Operands) -> dict:
    """What ``summa_recv`` counts of a contraction on any pr x pc grid of ``layers`` layers,
    listed once (the grid shapes ``summa_grid`` weighs share it): per operand ``a``, ``b``
    its home items, one per (row or column tuple, inner unit) of each sector, as arrays
    (``line``: the tuple, ``unit``: the unit, ``ident``: the distinct (key, part) of its
    tensor, ``size``: elements) and per distinct (key, part) of each tensor what a rank
    lacks of it (``Lacks``); ``c``: the output blocks (canonical ones) as arrays (``sector``,
    ``row``, ``col``: their tuples, ``size``) and their owners or pieces."""
    pa, pb, perm_c = perms
    (A, B, C), owners, pieces = ops
    lacks: dict = {}                 # id(tensor) -> Lacks (A and B of one tensor: one)
    out = {}
    for x, t, owner, pieces_of in (("a", A, owners[0], pieces[0]), ("b", B, owners[1], pieces[1])):
        slot = lacks.setdefault(id(t), Lacks(t, owner, pieces_of))
        line, unit, ident, size = [], [], [], []
        loff = uoff = 0
        for _, rows, inner, cols in sig:
            units, usize = inner_units(inner, layers)
            outer = rows if x == "a" else cols
            for r, rk in enumerate(outer.tuples):
                for u, (q, part) in enumerate(units):
                    if x == "a":
                        key = invert_key(rk + inner.tuples[q], pa)
                        part = part and (pa[len(rk)], *part)        # cut on A's first inner axis
                    else:
                        key = invert_key(inner.tuples[q] + rk, pb)
                        part = part and (pb[0], *part)              # B's
                    line.append(loff + r)
                    unit.append(uoff + u)
                    ident.append(slot.ident(key, part))
                    size.append(outer.sizes[r] * usize[u])
            loff += len(outer.tuples)
            uoff += len(units)
        out[x] = {"line": np.array(line, dtype=np.int64), "unit": np.array(unit, dtype=np.int64),
                  "ident": np.array(ident, dtype=np.int64), "size": np.array(size, dtype=float), "lacks": slot}
    for slot in lacks.values():
        slot.done()
    outs, sector, row, col, size = [], [], [], [], []
    roff = coff = 0
    for n, (_, rows, _, cols) in enumerate(sig):
        for r, rk in enumerate(rows.tuples):
            for c, ck in enumerate(cols.tuples):
                okey = tuple((rk + ck)[q] for q in perm_c)
                if okey not in C.aliases:
                    outs.append(okey)
                    sector.append(n)
                    row.append(roff + r)
                    col.append(coff + c)
                    size.append(rows.sizes[r] * cols.sizes[c])
        roff += len(rows.tuples)
        coff += len(cols.tuples)
    table = None if pieces[2] is None or not outs else pieces[2](outs)
    out["c"] = {"sector": np.array(sector, dtype=np.int64), "row": np.array(row, dtype=np.int64),
                "col": np.array(col, dtype=np.int64), "size": np.array(size, dtype=float), "table": table,
                "owner": None if table is not None else np.array([owners[2](k) for k in outs], dtype=np.int64)}
    return out


class Lacks:
    """The distinct (key, part) a tensor's home items name, and the elements of each that
    a rank does not hold: all of a block it does not own; of a block in pieces, the part's
    elements outside the rank's pieces (``placement.box_elements_before`` on the alias's
    stored block, per piece)."""

    def __init__(self, t, owner, pieces_of):
        self.t, self.owner, self.pieces_of = t, owner, pieces_of
        self.index: dict = {}
        self.items: list = []

    def ident(self, key, part) -> int:
        n = self.index.get((key, part))
        if n is None:
            n = self.index[(key, part)] = len(self.items)
            self.items.append((key, part))
        return n

    def done(self) -> None:
        """Owners, or pieces, of every item (once)."""
        keys = [k for k, _ in self.items]
        del self.index
        self.table = None if self.pieces_of is None or not keys else self.pieces_of(keys)
        if self.table is None:
            self.owners = np.array([self.owner(k) for k in keys], dtype=np.int64)
            return
        self.whole = np.array([part is None for _, part in self.items], dtype=bool)
        self.first = np.searchsorted(self.table[0], np.arange(len(keys) + 1))
        self.runs: dict = {}         # item -> (ranks, elements) holding its part, made when asked

    def _runs(self, i: int) -> tuple:
        if i not in self.runs:
            key, part = self.items[i]
            t = self.t
            stored, perm = t.aliases[key] if key in t.aliases else (key, None)
            shape = t.block_shape(stored)
            lo, hi = [0] * len(shape), list(shape)
            for n in range(0, len(part), 3):
                axis = part[n] if perm is None else perm[part[n]]
                lo[axis], hi[axis] = part[n + 1], part[n + 2]
            _, rank, count = self.table
            r, c = rank[self.first[i]:self.first[i + 1]], count[self.first[i]:self.first[i + 1]]
            end = np.cumsum(c)
            inside = box_elements_before(end, shape, lo, hi) - box_elements_before(end - c, shape, lo, hi)
            holders, at = np.unique(r, return_inverse=True)
            self.runs[i] = (holders, np.bincount(at.reshape(-1), weights=inside, minlength=len(holders)))
        return self.runs[i]

    def lacked(self, ident, size, dest, nranks: int) -> np.ndarray:
        """Elements of items ``ident`` (of ``size`` elements) that ranks ``dest`` lack."""
        if self.table is None:
            return size * (self.owners[ident] != dest)
        lacks = size - held(self.table, ident, dest, nranks) * self.whole[ident]
        for i in np.flatnonzero(~self.whole[ident]).tolist():
            holders, elements = self._runs(int(ident[i]))
            lacks[i] -= float(elements[holders == dest[i]].sum())
        return lacks


def summa_recv(sig, perms: tuple, grid: tuple, ops: Operands, nranks: int, moved_once=(), items=None) -> dict:
    """Bytes each rank receives when the contraction runs on the pr x pc x layers grid, as
    ``CollectiveExecutor.contract_step`` moves them (``summa_layout``), per rank: ``a``,
    ``b``: the blocks (parts) to their homes by the all-to-all (each (block part, rank)
    once, A and B of one tensor in one exchange; the elements the home does not hold);
    ``panels``: the broadcasts, A panels along grid rows and B panels along grid columns
    (every member but the root receives one; a grid line of one rank, none); ``c``: the
    output rectangles' blocks (canonical ones) to their owners, cut at their pieces (a
    rank keeps what it holds). An operand in ``moved_once`` (frozen: the executor keeps its
    panels) moves nothing; ``flops``: each rank's GEMM flops. From the deal as arrays
    (``summa_layout.grid_deal``) and ``items`` (``grid_items`` of the contraction on
    ``layers`` layers, listed here when not given): numpy work per item, no Python loop
    over blocks for the shape."""
    pa, pb, _ = perms
    pr, pc, layers = grid
    items = items or grid_items(sig, perms, layers, ops)
    deal = grid_deal(sig, pa, pb, pr, pc, layers)
    recv = {}
    seen: dict = {}                  # id(Lacks) -> codes (item, rank) already moved (``exchange``)
    for x in "ab":
        it = items[x]
        if x in moved_once:
            recv[x] = np.zeros(nranks)
            continue
        layer, panel = deal["unit_layer"][it["unit"]], deal["unit_panel"][it["unit"]]
        if x == "a":
            dest = (layer * pr + deal["row_line"][it["line"]]) * pc + panel % pc
        else:
            dest = (layer * pr + panel % pr) * pc + deal["col_line"][it["line"]]
        codes = it["ident"] * nranks + dest
        codes, first = np.unique(codes, return_index=True)
        before = seen.get(id(it["lacks"]))
        keep = first if before is None else first[~np.isin(codes, before)]
        seen[id(it["lacks"])] = codes if before is None else np.union1d(before, codes)
        lacks = it["lacks"].lacked(it["ident"][keep], it["size"][keep], dest[keep], nranks)
        recv[x] = np.bincount(dest[keep], weights=8.0 * lacks, minlength=nranks)
    recv["panels"] = panel_recv(deal, grid, moved_once)
    rows, cols, inner = deal["row_total"], deal["col_total"], deal["panel_inner"]
    # the output blocks of each grid position's rectangle (the same in every layer), from
    # each layer with inner work in their sector
    it = items["c"]
    src = deal["row_line"][it["row"]] * pc + deal["col_line"][it["col"]]
    active = inner.sum(2) > 0
    recv["c"] = np.zeros(nranks)
    for hl in range(layers):
        sent = active[it["sector"], hl]
        at = src + hl * pr * pc
        if it["table"] is None:
            dest = it["owner"]
            recv["c"] += np.bincount(dest, weights=8.0 * it["size"] * (sent & (dest != at)), minlength=nranks)
        else:
            index, rank, count = it["table"]
            away = sent[index] & (rank != at[index])
            recv["c"] += np.bincount(rank[away], weights=8.0 * count[away], minlength=nranks)
    recv["flops"] = 2 * np.einsum("ng,nh,nl->lgh", rows, cols, inner.sum(2)).reshape(-1)
    return recv


def panel_recv(deal: dict, grid: tuple, moved_once=()) -> np.ndarray:
    """Bytes of panels each rank receives on the pr x pc x layers ``grid`` (``grid_deal``'s
    ``deal``): A panels along grid rows, B panels along grid columns, every member but the
    root receives one; an operand in ``moved_once`` none."""
    pr, pc, layers = grid
    panels = np.zeros((layers, pr, pc))
    npanel = max(pr, pc)
    rows, cols, inner = deal["row_total"], deal["col_total"], deal["panel_inner"]
    if "a" not in moved_once and pc > 1:
        a = 8.0 * np.einsum("ng,nlp->lpg", rows, inner)
        panels += a.sum(1)[:, :, None]
        for p in range(npanel):
            panels[:, :, p % pc] -= a[:, p, :]
    if "b" not in moved_once and pr > 1:
        b = 8.0 * np.einsum("nh,nlp->lph", cols, inner)
        panels += b.sum(1)[:, None, :]
        for p in range(npanel):
            panels[:, p % pr, :] -= b[:, p, :]
    return panels.reshape(-1)


def summa_score(sig, perms: tuple, grid: tuple, ops: Operands, nranks: int, moved_once=(), items=None) -> dict:
    """SUMMA's busiest rank on its grid in ``score``'s terms, from what each rank receives
    (``summa_recv``; ``items``: its ``grid_items``, when the caller has them); also
    ``panel_bytes``, the most one rank receives in panels."""
    recv = summa_recv(sig, perms, grid, ops, nranks, moved_once, items)
    total = recv["a"] + recv["b"] + recv["panels"] + recv["c"]
    return {"flops": float(recv["flops"].max(initial=0)), "recv_bytes": float(total.max(initial=0)),
            "cost": float((recv["flops"] + FLOPS_PER_BYTE * total).max(initial=0)),
            "panel_bytes": float(recv["panels"].max(initial=0))}


def summa_grid(sig, perms: tuple, layers: int, ops: Operands, nranks: int, moved_once=(), items=None) -> tuple:
    """((pr, pc, layers), its ``summa_score``) of the grid SUMMA runs a contraction on: of the
    shapes with the fewest idle grid lines (``summa_layout.least_idle_shapes``), the least
    cost of the busiest rank as each rank receives (``summa_score``: the count ``choose``
    weighs against the stationary modes), then the most square (``items``: ``grid_items``,
    listed once for every shape when not given)."""
    best = None
    items = items or grid_items(sig, perms, layers, ops)
    for pr, pc in least_idle_shapes(sig, perms[0], perms[1], nranks // layers, layers):
        sc = summa_score(sig, perms, (pr, pc, layers), ops, nranks, moved_once, items)
        if best is None or sc["cost"] < best[1]["cost"]:
            best = ((pr, pc, layers), sc)
    return best


def choose(ta, sig, perms: tuple, layers: int, ops: Operands, nranks: int, moved_once=(), modes=MODES,
           stationary: tuple | None = None, items=None) -> tuple:
    """(mode, grid, scores, plans): ``"summa"`` on its grid (``summa_grid``) or the stationary
    operand (of ``modes``) of least cost for the busiest rank (``perms``: the step's axis
    orders of A, B and C; ``layers``: SUMMA's layers; ``ops``: the operands as stored); a tie
    keeps SUMMA. ``grid``: SUMMA's (pr, pc, layers) whatever the mode; ``scores`` maps each
    mode to its ``score`` (SUMMA's: ``summa_score``), ``plans`` each stationary mode to its
    ``plan``; ``stationary``: ``stationary_scores`` of these tasks and owners, and ``items``:
    ``grid_items``, when the caller has them (they do not depend on the grid)."""
    grid, summa = summa_grid(sig, perms, layers, ops, nranks, moved_once, items)
    scores = {"summa": summa}
    kept, plans = stationary or stationary_scores(ta, ops.owners, nranks, moved_once, modes, pieces=ops.tables(ta),
                                                  shared=ops.tensors[0] is ops.tensors[1])
    if set(kept) != set(modes):
        raise ValueError(f"stationary scores of modes {sorted(kept)}, asked for {sorted(modes)}")
    scores.update(kept)
    best = min(scores, key=lambda m: (scores[m]["cost"], m != "summa"))
    return best, grid, scores, plans
