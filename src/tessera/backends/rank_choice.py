"""One rank's share of ``stationary.choose``: how a contraction runs on ``mpi-collective``,
decided from what each rank counts of itself.

``stationary.choose`` counts every rank under every candidate (SUMMA on each grid shape of
the fewest idle lines, each stationary operand): the cost model's way, which simulates the
machine (``tessera plan --ranks``), and O(all block products) on each rank. An executor
rank counts only itself (``rank_costs``): on each grid shape the home items of its grid
cell (its grid row's row tuples, or column's column tuples, times its layer's inner units
of its panels), its panels and flops from the deal, the output blocks or pieces it keeps;
under each stationary mode the block products that read or write a block it is home of or
holds a piece of (``local_products``: every product it runs, sends for or receives from).
Its cost is ``stationary.score``'s: its flops plus FLOPS_PER_BYTE x the bytes it receives
(frozen operands counted as moved once). The ranks' maxima (one allreduce of the few
candidates' costs) are ``choose``'s costs: bytes and flops are whole numbers, exact in
float64 (below 2^53) whatever the order of the sums, so ``pick`` takes ``choose``'s choice,
ties included. No MPI here: the executor reduces, tests take the maximum over simulated
ranks.
"""

from __future__ import annotations

import numpy as np

from tessera.backends.stationary import MODES, Lacks, panel_recv
from tessera.backends.summa_layout import FLOPS_PER_BYTE, grid_deal, home_key, inner_units, least_idle_shapes
from tessera.plan.blocktasks import invert_key


def candidates(sig, perms: tuple, layers: int, nranks: int, modes=MODES) -> list:
    """What ``choose`` weighs, in its order: ("summa", (pr, pc, layers)) for each shape of
    ``least_idle_shapes``, most square first, then (mode, None) for each of ``modes``."""
    shapes = least_idle_shapes(sig, perms[0], perms[1], nranks // layers, layers)
    return [("summa", (pr, pc, layers)) for pr, pc in shapes] + [(m, None) for m in modes]


def rank_costs(sig, perms: tuple, layers: int, ops, nranks: int, me: int, held: tuple, moved_once=(),
               modes=MODES) -> np.ndarray:
    """Rank ``me``'s cost under each of ``candidates`` (flops + FLOPS_PER_BYTE x bytes it
    receives, as ``stationary.summa_recv`` and ``stationary_scores`` count it); ``ops``:
    the ``stationary.Operands``; ``held``: for A, B and the output, the stored keys whose
    block ``me`` is home of or holds a piece of."""
    costs = [summa_cost(sig, perms, grid, ops, nranks, me, held[2], moved_once)
             for mode, grid in candidates(sig, perms, layers, nranks, ()) if mode == "summa"]
    if modes:
        lp = local_products(sig, perms, ops, held)
        costs += [mode_cost(lp, mode, ops, nranks, me, moved_once) for mode in modes]
    return np.array(costs, dtype=float)


def pick(cands: list, costs) -> tuple:
    """(mode, SUMMA's grid) as ``choose`` takes them from the busiest rank's cost of each of
    ``cands`` (the maximum of every rank's ``rank_costs``): of the grid shapes the least
    cost, the first (most square) on a tie; then the least of SUMMA and the modes, a tie
    keeping SUMMA, then the earlier mode."""
    grid, scores = None, {}
    for (mode, shape), cost in zip(cands, np.asarray(costs).tolist()):
        if mode != "summa":
            scores[mode] = cost
        elif grid is None or cost < scores["summa"]:
            grid, scores["summa"] = shape, cost
    return min(scores, key=lambda m: (scores[m], m != "summa")), grid


def sector_index(sig, key, nl: int, layouts: tuple) -> tuple | None:
    """(sector, first index, second index) of a key in step order (``nl`` axes in the first
    of ``layouts``, the rest in the second: 0 rows, 1 inner, 2 cols); None when no sector
    holds it."""
    for n, sector in enumerate(sig):
        i, j = sector[1 + layouts[0]].index.get(key[:nl]), sector[1 + layouts[1]].index.get(key[nl:])
        if i is not None and j is not None:
            return n, i, j
    return None


def read_keys(t, stored) -> list:
    """``stored`` keys of tensor ``t`` and their aliases (the keys a step may read them by)."""
    out = []
    for k in stored:
        out.append(k)
        if t.aliases:
            out += [alias for alias, _ in t.aliases.of(k)]
    return out


def product_codes(sig, perms: tuple, ops, held: tuple) -> list:
    """Per sector, the sorted codes (r * inner tuples + q) * column tuples + c of the block
    products that read a block of ``held`` (A and B stored keys or their aliases) or write
    one (output stored keys: every product of the block), whatever the output's aliases."""
    pa, pb, perm_c = perms
    A, B = ops.tensors[:2]
    nk = (len(pa) + len(pb) - len(perm_c)) // 2
    nl = len(pa) - nk
    codes = [[] for _ in sig]            # per sector: (r * nq + q) * nc + c
    for t, stored, perm, split, axes in ((A, held[0], pa, nl, (0, 1)), (B, held[1], pb, nk, (1, 2))):
        for key in read_keys(t, stored):
            found = sector_index(sig, tuple(key[p] for p in perm), split, axes)
            if found is None:
                continue
            n, i, j = found
            _, rows, inner, cols = sig[n]
            nq, nc = len(inner.tuples), len(cols.tuples)
            codes[n].append((i * nq + j) * nc + np.arange(nc) if axes == (0, 1)
                            else (np.arange(len(rows.tuples)) * nq + i) * nc + j)
    for okey in held[2]:
        found = sector_index(sig, invert_key(okey, perm_c), nl, (0, 2))
        if found is not None:
            n, r, c = found
            nq, nc = len(sig[n][2].tuples), len(sig[n][3].tuples)
            codes[n].append((r * nq + np.arange(nq)) * nc + c)
    return [np.unique(np.concatenate(parts)) if parts else np.zeros(0, dtype=np.int64) for parts in codes]


def local_products(sig, perms: tuple, ops, held: tuple) -> dict:
    """The block products of a contraction that read or write a block of ``held`` (A, B
    and output stored keys: ``rank_costs``'s), with every product of an output block held,
    as arrays: per product ``t`` (its task), ``a``, ``b`` (indices into ``a_keys``,
    ``b_keys``), ``flops``; per task ``out`` (its key) and ``size``; per A and B key
    ``a_size``, ``b_size``. Products of an output the tensor stores as an alias are none
    (``contraction_tasks`` lists canonical outputs only)."""
    pa, pb, perm_c = perms
    C = ops.tensors[2]
    codes = product_codes(sig, perms, ops, held)
    out, size = [], []
    blocks = {"a": ({}, [], []), "b": ({}, [], [])}     # key -> index, keys, elements
    cols = {x: [] for x in ("t", "a", "b", "flops")}
    for n, parts in enumerate(codes):
        if not len(parts):
            continue
        _, rows, inner, colsl = sig[n]
        nq, nc = len(inner.tuples), len(colsl.tuples)
        rq, c = np.divmod(parts, nc)
        r, q = np.divmod(rq, nq)
        tasks, t_of = np.unique(r * nc + c, return_inverse=True)
        task = []                   # each distinct task's index in ``out``; -1: an alias
        for tr, tc in zip(*(x.tolist() for x in np.divmod(tasks, nc))):
            okey = tuple((rows.tuples[tr] + colsl.tuples[tc])[p] for p in perm_c)
            task.append(-1 if C.aliases and okey in C.aliases else len(out))
            if task[-1] >= 0:
                out.append(okey)
                size.append(rows.sizes[tr] * colsl.sizes[tc])
        t = np.array(task, dtype=np.int64)[t_of.reshape(-1)]
        r, q, c, t = r[t >= 0], q[t >= 0], c[t >= 0], t[t >= 0]
        for x, (i, j, outer, width, perm) in (("a", (r, q, rows, inner, pa)), ("b", (q, c, inner, colsl, pb))):
            index, keys, elements = blocks[x]
            distinct, of = np.unique(i * len(width.tuples) + j, return_inverse=True)
            ids = []
            for bi, bj in zip(*(v.tolist() for v in np.divmod(distinct, len(width.tuples)))):
                key = invert_key(outer.tuples[bi] + width.tuples[bj], perm)
                ids.append(index.setdefault(key, len(keys)))
                if ids[-1] == len(keys):
                    keys.append(key)
                    elements.append(outer.sizes[bi] * width.sizes[bj])
            cols[x].append(np.array(ids, dtype=np.int64)[of.reshape(-1)])
        cols["t"].append(t)
        cols["flops"].append(2.0 * np.asarray(rows.sizes)[r] * np.asarray(inner.sizes)[q] * np.asarray(colsl.sizes)[c])
    lp = {x: np.concatenate(v) if v else np.zeros(0, dtype=float if x == "flops" else np.int64)
          for x, v in cols.items()}
    lp.update(out=out, size=np.array(size, dtype=float), a_keys=blocks["a"][1], b_keys=blocks["b"][1],
              a_size=np.array(blocks["a"][2], dtype=float), b_size=np.array(blocks["b"][2], dtype=float))
    return lp


def mode_cost(lp: dict, mode: str, ops, nranks: int, me: int, moved_once=()) -> float:
    """Rank ``me``'s cost with operand ``mode`` stationary (``stationary._plan``'s counts of
    one rank, from ``local_products``): the flops of its products, the distinct A and B
    blocks they read that it lacks (a block in pieces: the elements outside its pieces; B's
    that A's bring when both are one tensor once), the partial outputs it receives."""
    A, B, C = ops.tensors
    homes = lp.setdefault("homes", {})
    x_of = {"a": ("a_keys", 0), "b": ("b_keys", 1), "c": ("out", 2)}
    for x in ({"a", "b", "c"} - set(homes)) & {mode, "c"}:
        name, i = x_of[x]
        homes[x] = np.array([ops.owners[i](k) for k in lp[name]], dtype=np.int64)
    ranks = homes[mode][lp["t" if mode == "c" else mode]]
    here = ranks == me
    recv = {}
    brought = set()
    for x, i in (("a", 0), ("b", 1)):
        if mode == x and ops.pieces[i] is None:
            ids = np.zeros(0, dtype=np.int64)           # stays: every product where its block is
        else:
            ids = np.unique(lp[x][here])
        keys = lp[f"{x}_keys"]
        if x == "b" and A is B:
            ids = np.array([j for j in ids.tolist() if keys[j] not in brought], dtype=np.int64)
        if f"lacks_{x}" not in lp:
            lp[f"lacks_{x}"] = _lacks(ops, i, keys)
        lacks = lp[f"lacks_{x}"]
        recv[x] = float(np.sum(8.0 * lacks.lacked(ids, lp[f"{x}_size"][ids], np.full(len(ids), me), nranks)))
        if x == "a":
            brought = {keys[j] for j in ids.tolist()}
    pairs = np.unique(lp["t"] * nranks + ranks)          # distinct (task, rank)
    t, at = pairs // nranks, pairs % nranks
    if ops.pieces[2] is None:
        sent = (homes["c"][t] == me) & (at != me) if mode != "c" else np.zeros(len(t), dtype=bool)
        recv["c"] = float(np.sum(8.0 * lp["size"][t] * sent))
    else:       # each piece here from every rank with products of its block, but this one
        index, rank, count = ops.pieces[2](lp["out"])
        senders = np.bincount(t, minlength=len(lp["out"])) - np.isin(np.arange(len(lp["out"])), t[at == me])
        mine = rank == me
        recv["c"] = float(np.sum(8.0 * count[mine] * senders[index[mine]]))
    flops = float(np.sum(lp["flops"][here]))
    return flops + FLOPS_PER_BYTE * sum(v for x, v in recv.items() if x not in moved_once)


def _lacks(ops, i: int, keys: list) -> Lacks:
    """``stationary.Lacks`` of operand ``i``'s whole blocks ``keys`` (ident = index)."""
    slot = Lacks(ops.tensors[i], ops.owners[i], ops.pieces[i])
    for k in keys:
        slot.ident(k, None)
    slot.done()
    return slot


def cell_items(sig, perms: tuple, deal: dict, grid: tuple, me: int, x: str):
    """The home items of operand ``x`` ("a" or "b") in rank ``me``'s grid cell on the
    pr x pc x layers ``grid`` (``summa_layout``'s ``a_homes`` / ``b_homes`` whose
    destination is ``me``), from the deal (``grid_deal``) alone: (sector, its row tuple
    (A) or column tuple (B), inner unit, key, part, elements), sector by sector."""
    pr, pc, layers = grid
    layer, cell = divmod(me, pr * pc)
    row, col = divmod(cell, pc)
    loff = uoff = 0
    for n, (_, rows, inner, cols) in enumerate(sig):
        units, usize = inner_units(inner, layers)
        outer = rows if x == "a" else cols
        line = deal["row_line" if x == "a" else "col_line"][loff:loff + len(outer.tuples)]
        panel = deal["unit_panel"][uoff:uoff + len(units)]
        own_units = np.flatnonzero((deal["unit_layer"][uoff:uoff + len(units)] == layer)
                                   & (panel % (pc if x == "a" else pr) == (col if x == "a" else row))).tolist()
        for r in np.flatnonzero(line == (row if x == "a" else col)).tolist():
            for u in own_units:
                q, part = units[u]
                yield (n, r, u, *home_key(x, perms, outer.tuples[r], inner.tuples[q], part),
                       outer.sizes[r] * usize[u])
        loff += len(outer.tuples)
        uoff += len(units)


def line_offsets(sig) -> dict:
    """{"a": where each sector's row tuples start, "b": its column tuples} in the deal's
    ``row_line`` / ``col_line`` (``grid_deal``: sector after sector)."""
    return {"a": np.cumsum([0] + [len(s[1].tuples) for s in sig]),
            "b": np.cumsum([0] + [len(s[3].tuples) for s in sig])}


def held_outputs(sig, perms: tuple, deal: dict, grid: tuple, held_out) -> tuple:
    """([(output key, (sector, row tuple, column tuple))], the grid cell (row * pc + col,
    in every layer) whose rectangle holds each) of the keys of ``held_out`` that the
    contraction writes, from the deal (``grid_deal``) alone."""
    pa, pb, perm_c = perms
    nl = len(pa) - (len(pa) + len(pb) - len(perm_c)) // 2
    off = line_offsets(sig)
    found = [(okey, f) for okey in held_out
             if (f := sector_index(sig, invert_key(okey, perm_c), nl, (0, 2))) is not None]
    sector = np.array([f[0] for _, f in found], dtype=np.int64)
    cell = (deal["row_line"][off["a"][sector] + np.array([f[1] for _, f in found], dtype=np.int64)] * grid[1]
            + deal["col_line"][off["b"][sector] + np.array([f[2] for _, f in found], dtype=np.int64)])
    return found, cell


def summa_cost(sig, perms: tuple, grid: tuple, ops, nranks: int, me: int, held_out, moved_once=()) -> float:
    """Rank ``me``'s cost on the pr x pc x layers ``grid`` (``stationary.summa_recv`` of one
    rank): the home items of its grid cell it lacks (A and B of one tensor in one exchange),
    its panels, the output blocks or pieces it keeps (``held_out``) from the other grid
    cells' rectangles, and its flops."""
    pa, pb = perms[:2]
    pr, pc, layers = grid
    A, B, C = ops.tensors
    deal = grid_deal(sig, pa, pb, pr, pc, layers)
    layer, cell = divmod(me, pr * pc)
    row, col = divmod(cell, pc)
    slots: dict = {}                 # id(tensor) -> Lacks (A and B of one tensor: one)
    mine = {}
    for x, t, i in (("a", A, 0), ("b", B, 1)):
        slot = slots.setdefault(id(t), Lacks(t, ops.owners[i], ops.pieces[i]))
        ident, size = [], []
        for *_, key, part, elements in cell_items(sig, perms, deal, grid, me, x):
            ident.append(slot.ident(key, part))
            size.append(elements)
        mine[x] = (slot, np.array(ident, dtype=np.int64), np.array(size, dtype=float))
    for slot in slots.values():
        slot.done()
    recv = 0.0
    seen: dict = {}                  # id(Lacks) -> items already moved here (``exchange``)
    for x in "ab":
        slot, ident, size = mine[x]
        if x in moved_once:
            continue
        ident, first = np.unique(ident, return_index=True)
        keep = ~np.isin(ident, seen.get(id(slot), ()))
        seen[id(slot)] = np.union1d(seen.get(id(slot), ident[:0]), ident)
        ident, size = ident[keep], size[first][keep]
        recv += float(np.sum(8.0 * slot.lacked(ident, size, np.full(len(ident), me), nranks)))
    recv += float(panel_recv(deal, grid, moved_once)[me])
    # the output blocks this rank keeps, from the rectangle of their grid cell in each layer
    # with inner work in their sector (but its own)
    active = deal["panel_inner"].sum(2) > 0
    found, src = held_outputs(sig, perms, deal, grid, held_out)
    if found:
        sector = np.array([f[0] for _, f in found], dtype=np.int64)
        if ops.pieces[2] is None:
            index = np.arange(len(found))
            count = np.array([sig[n][1].sizes[r] * sig[n][3].sizes[c] for _, (n, r, c) in found], dtype=float)
        else:
            index, rank, count = ops.pieces[2]([okey for okey, _ in found])
            index, count = index[rank == me], count[rank == me]
        for hl in range(layers):
            away = active[sector[index], hl] & (src[index] + hl * pr * pc != me)
            recv += float(np.sum(8.0 * count * away))
    rows, cols, inner = deal["row_total"], deal["col_total"], deal["panel_inner"]
    flops = 2 * float(np.sum(rows[:, row] * cols[:, col] * inner.sum(2)[:, layer]))
    return flops + FLOPS_PER_BYTE * recv
