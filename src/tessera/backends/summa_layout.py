"""Where the blocks of a contraction go on mpi-collective's process grid (structure only).

``summa_layout``: the SUMMA / 2.5D layout of one contraction step on a pr x pc x c grid
(which grid row, column, layer and panel every block (part) lives in, panel sizes, output
rectangles); ``least_idle_shapes``: the pr x pc shapes with the fewest idle grid lines,
among which the executor runs a contraction on the one of least counted cost
(``stationary.summa_grid``); ``choose_grid``: the one the tile rule judges (structure
alone, ``grid_score``).
Pure functions of the step's sectors and permutations, the same on every rank; no MPI
(tests run them for simulated rank counts). The executor is ``backends.collective``.
"""

from __future__ import annotations

import math
import zlib
from functools import lru_cache

import numpy as np

from tessera.plan.blocktasks import invert_key
from tessera.runtime.distribution import grid_shape, largest_first


def _rotated(bins: list, nbins: int, shift: int) -> list:
    """``bins`` relabelled by ``shift`` (the greedy deal favours bin 0 on ties: rotating it
    per sector spreads the remainders of many small sectors over the ranks)."""
    return [(b + shift) % nbins for b in bins]


@lru_cache(maxsize=8192)
def _lpt(sizes: tuple, nbins: int) -> tuple:
    """``largest_first(sizes, nbins)``, kept: the sectors of many steps and grid shapes deal
    the same sizes into the same number of bins."""
    return tuple(largest_first(sizes, nbins))


def _deal_layers(sizes, layers: int, npanel: int, shift: int = 0) -> list:
    """(layer, panel) of each inner tuple: dealt to layers by size (labels rotated by
    ``shift``), then within each layer to its panels by size (with one layer:
    ``largest_first(sizes, npanel)``)."""
    layer = _rotated(_lpt(tuple(sizes), layers), layers, shift) if layers > 1 else [0] * len(sizes)
    out = [(0, 0)] * len(sizes)
    for lay in range(layers):
        members = [q for q, l_ in enumerate(layer) if l_ == lay]
        for q, p in zip(members, _lpt(tuple(sizes[q] for q in members), npanel)):
            out[q] = (lay, p)
    return out


def _inner_units(inner, layers: int) -> list:
    """The inner tuples of a sector cut into units for the layers: ``(q, part)`` with
    ``part = None`` (the whole tuple) or ``(lo, hi)``, rows of the tuple's first inner
    tile. With one layer every tuple is one unit. With c layers a tuple larger than a
    layer's share (total / c) is cut into ceil(size / share) near-equal parts along its
    first tile (at most one part per orbital), so that a sector with fewer inner tuples
    than layers (e.g. one occupied tile) still spreads over the layers. An outer product
    (no inner index) is one unit."""
    if layers == 1:
        return [(q, None) for q in range(len(inner.tuples))]
    share = inner.total / layers
    units = []
    for q, shape in enumerate(inner.shapes):
        m = min(shape[0], math.ceil(inner.sizes[q] / share)) if shape and share > 0 else 1
        if m <= 1:
            units.append((q, None))
            continue
        cuts = [round(i * shape[0] / m) for i in range(m + 1)]
        units += [(q, (lo, hi)) for lo, hi in zip(cuts, cuts[1:]) if hi > lo]
    return units


@lru_cache(maxsize=8192)
def _shift(n, rows, inner, cols, pa, pb) -> int:
    """A stable number from sector n's structure that rotates its deals, so that the
    remainders of steps with few tuples do not all land on grid row/column/layer 0."""
    return zlib.crc32(repr((n, rows.tuples, inner.tuples, cols.tuples, pa, pb)).encode())


def _deal(n, rows, inner, cols, pa, pb, pr: int, pc: int, layers: int) -> tuple:
    """Sector n's deal: grid row of each row tuple, grid column of each column tuple, the
    inner units (``_inner_units``), their sizes and their (layer, panel)."""
    shift = _shift(n, rows, inner, cols, pa, pb)
    grow = _rotated(_lpt(rows.sizes, pr), pr, shift)
    gcol = _rotated(_lpt(cols.sizes, pc), pc, shift // pr)
    units, usize = inner_units(inner, layers)
    return grow, gcol, units, usize, _deal_layers(usize, layers, max(pr, pc), shift // (pr * pc))


def inner_units(inner, layers: int) -> tuple:
    """(``_inner_units``, the elements of each unit)."""
    units = _inner_units(inner, layers)
    return units, [inner.sizes[q] if part is None else inner.sizes[q] // inner.shapes[q][0] * (part[1] - part[0])
                   for q, part in units]


def home_key(x: str, perms: tuple, outer: tuple, kk: tuple, part) -> tuple:
    """(key, part) of the home item of operand ``x`` ("a": row tuple ``outer`` x inner
    tuple ``kk`` of A; "b": ``kk`` x column tuple ``outer`` of B) for inner unit ``part``
    (None or (lo, hi) rows of the first inner tile): the part as ``exchange`` takes it,
    (axis, lo, hi) on the operand's axis of that tile."""
    pa, pb = perms[:2]
    if x == "a":
        return invert_key(outer + kk, pa), part and (pa[len(outer)], *part)
    return invert_key(kk + outer, pb), part and (pb[0], *part)


def grid_deal(sig, pa, pb, pr: int, pc: int, layers: int) -> dict:
    """``summa_layout``'s deal of a contraction on the pr x pc x layers grid as arrays over
    the sectors' tuples in order (no list of blocks): ``row_line`` (grid row of each row
    tuple), ``col_line`` (grid column of each column tuple), ``unit_layer`` and
    ``unit_panel`` (of each inner unit, ``inner_units``); per sector ``row_total`` (n, pr),
    ``col_total`` (n, pc) and ``panel_inner`` (n, layers, panels)."""
    npanel = max(pr, pc)
    out = {"row_line": [], "col_line": [], "unit_layer": [], "unit_panel": [],
           "row_total": np.zeros((len(sig), pr)), "col_total": np.zeros((len(sig), pc)),
           "panel_inner": np.zeros((len(sig), layers, npanel))}
    for n, (_, rows, inner, cols) in enumerate(sig):
        grow, gcol, _, usize, place = _deal(n, rows, inner, cols, pa, pb, pr, pc, layers)
        out["row_line"] += grow
        out["col_line"] += gcol
        for (l_, p), size in zip(place, usize):
            out["unit_layer"].append(l_)
            out["unit_panel"].append(p)
            out["panel_inner"][n, l_, p] += size
        out["row_total"][n] = _offsets(grow, rows.sizes, pr)[1]
        out["col_total"][n] = _offsets(gcol, cols.sizes, pc)[1]
    for k in ("row_line", "col_line", "unit_layer", "unit_panel"):
        out[k] = np.array(out[k], dtype=np.int64)
    return out


def _offsets(bins, sizes, nbins: int) -> tuple:
    """(offset of each item in its bin, total per bin)."""
    off, tot = [0] * len(bins), [0] * nbins
    for i, g in enumerate(bins):
        off[i] = tot[g]
        tot[g] += sizes[i]
    return off, tot


@lru_cache(maxsize=4096)
def _sector_layout(n, rows, inner, cols, pa, pb, pr: int, pc: int, layers: int) -> tuple:
    """Sector n's deal (``_deal``) with the offsets it implies: (grid row of each row
    tuple, grid column of each column tuple, inner units, their sizes, their (layer,
    panel), row offset in the grid row, rows per grid row, the same for columns, inner
    offset of each unit in its panel, inner width of each (layer, panel)). O(tuples)."""
    grow, gcol, units, usize, place = _deal(n, rows, inner, cols, pa, pb, pr, pc, layers)
    roff, rtot = _offsets(grow, rows.sizes, pr)
    coff, ctot = _offsets(gcol, cols.sizes, pc)
    ioff, itot = [0] * len(units), [[0] * max(pr, pc) for _ in range(layers)]
    for u, (l_, p) in enumerate(place):
        ioff[u] = itot[l_][p]
        itot[l_][p] += usize[u]
    return grow, gcol, units, usize, place, roff, rtot, coff, ctot, ioff, itot


def _pack(sec, sector, pa, pb, x: str, lines, mine):
    """The pack entries of operand ``x`` for its row (A) or column (B) tuples ``lines`` and
    inner units ``mine``, as (layer, panel, grid line, entry): A (key, part, row offset,
    inner offset, rows, inner), by row tuple then unit; B (key, part, inner offset,
    column offset, inner, columns), by unit then column tuple (``summa_layout``'s home
    order). ``sec``: ``_sector_layout``."""
    grow, gcol, units, usize, place, roff, _, coff, _, ioff, _ = sec
    _, rows, inner, cols = sector
    outer, deal, off = (rows, grow, roff) if x == "a" else (cols, gcol, coff)
    for i, u in ((i, u) for i in lines for u in mine) if x == "a" else ((i, u) for u in mine for i in lines):
        q, part = units[u]
        key, kpart = home_key(x, (pa, pb), outer.tuples[i], inner.tuples[q], part)
        yield (*place[u], deal[i], (key, kpart, off[i], ioff[u], outer.sizes[i], usize[u]) if x == "a"
               else (key, kpart, ioff[u], off[i], usize[u], outer.sizes[i]))


def _rectangles(sec, rows, cols):
    """(grid row, grid column, (r, c, row offset, column offset)) of the output tile pairs
    of row tuples ``rows`` and column tuples ``cols``, row by row."""
    grow, gcol, roff, coff = sec[0], sec[1], sec[5], sec[7]
    for r in rows:
        for c in cols:
            yield grow[r], gcol[c], (r, c, roff[r], coff[c])


def _panels(secs, layers: int, npanel: int, pr: int, pc: int) -> tuple:
    """Elements of the A panels [layer][panel][grid row] and B panels [layer][panel][grid
    column] over the sectors (``_sector_layout``s), as int64 arrays."""
    a, b = np.zeros((layers, npanel, pr), dtype=np.int64), np.zeros((layers, npanel, pc), dtype=np.int64)
    for sec in secs:
        rtot, ctot, itot = (np.array(v, dtype=np.int64) for v in (sec[6], sec[8], sec[10]))
        a += itot[:, :, None] * rtot[None, None, :]
        b += itot[:, :, None] * ctot[None, None, :]
    return a, b


@lru_cache(maxsize=2048)
def summa_layout(sig, pa, pb, pr: int, pc: int, layers: int = 1) -> dict:
    """Where every block of a contraction goes on the pr x pc x layers grid (structure
    only; the whole grid's, for models and tests: the executor takes its own cell's,
    ``cell_layout``). Per sector n: ``row_total[n][grid row]``, ``col_total[n][grid col]``
    (output rectangle, the same in every layer); ``units[n]`` = [(q, part)] the inner
    tuples (or parts of them, see ``_inner_units``) and ``inner_panel[n][u] = (layer,
    panel)`` of unit u; ``panel_inner[n][layer][panel]`` (inner width of a panel),
    ``active[n][layer]`` (the layer has inner work); ``a_pack[n][layer][panel][grid row]``
    and ``b_pack[n][layer][panel][grid col]``: (key, part, row/inner offset, inner/col
    offset, rows, cols) of the blocks in a panel; ``out[n][grid row][grid col]``: output
    tile pairs and offsets. ``a_homes``/``b_homes``: (key, part, layer, grid row, grid col)
    of every input block (part) -- part is None or (axis, lo, hi) of the block, as
    ``exchange`` takes it; ``a_panel_size[layer][panel][grid row]``,
    ``b_panel_size[layer][panel][grid col]``: elements of the broadcast panels."""
    npanel = max(pr, pc)
    lay = {"npanel": npanel, "layers": layers, "row_total": [], "col_total": [], "panel_inner": [],
           "units": [], "inner_panel": [], "active": [], "a_homes": [], "b_homes": [], "a_pack": [],
           "b_pack": [], "out": []}
    secs = []
    for n, sector in enumerate(sig):
        _, rows, inner, cols = sector
        sec = _sector_layout(n, rows, inner, cols, pa, pb, pr, pc, layers)
        secs.append(sec)
        units, place, rtot, ctot, itot = sec[2], sec[4], sec[6], sec[8], sec[10]
        for x, nlines, outer in (("a", pr, rows), ("b", pc, cols)):
            pack = [[[[] for _ in range(nlines)] for _ in range(npanel)] for _ in range(layers)]
            homes = lay[f"{x}_homes"]
            for l_, p, g, entry in _pack(sec, sector, pa, pb, x, range(len(outer.tuples)), range(len(units))):
                pack[l_][p][g].append(entry)
                homes.append((*entry[:2], l_, g, p % pc) if x == "a" else (*entry[:2], l_, p % pr, g))
            lay[f"{x}_pack"].append(pack)
        out = [[[] for _ in range(pc)] for _ in range(pr)]
        for g, h, entry in _rectangles(sec, range(len(rows.tuples)), range(len(cols.tuples))):
            out[g][h].append(entry)
        lay["out"].append(out)
        lay["row_total"].append(rtot)
        lay["col_total"].append(ctot)
        lay["panel_inner"].append(itot)
        lay["units"].append(units)
        lay["inner_panel"].append(place)
        lay["active"].append([sum(itot[l_]) > 0 for l_ in range(layers)])
    a_panel, b_panel = _panels(secs, layers, npanel, pr, pc)
    lay["a_panel_size"], lay["b_panel_size"] = a_panel.tolist(), b_panel.tolist()
    # the most bytes of panels one rank receives for each operand (its strip of A or B)
    lay["a_strip_bytes"] = 8 * int(a_panel.sum(1).max(initial=0))
    lay["b_strip_bytes"] = 8 * int(b_panel.sum(1).max(initial=0))
    return lay


@lru_cache(maxsize=2048)
def cell_layout(sig, pa, pb, pr: int, pc: int, layers: int, layer: int, row: int, col: int) -> dict:
    """``summa_layout`` of one grid cell (the rank at ``layer``, grid ``row``, ``col``), made
    from the deal (O(tuples) per sector and the cell's own entries, not O(the step's
    blocks)): ``npanel``; per sector n ``active[n]`` (its layer has inner work),
    ``row_total[n]`` and ``col_total[n]`` (its rectangle), ``panel_inner[n][panel]`` (its
    layer's), ``a_pack[n][panel]`` (its layer and grid row), ``b_pack[n][panel]`` (its layer
    and grid column), ``out[n]`` (its rectangle's tile pairs); ``a_panel_size[panel]``,
    ``b_panel_size[panel]`` (its grid row's and column's panels in its layer); and, the
    same on every rank, ``a_strip_bytes`` and ``b_strip_bytes``."""
    npanel = max(pr, pc)
    cell = {"npanel": npanel, "active": [], "row_total": [], "col_total": [], "panel_inner": [],
            "a_pack": [], "b_pack": [], "out": []}
    secs = []
    for n, sector in enumerate(sig):
        _, rows, inner, cols = sector
        sec = _sector_layout(n, rows, inner, cols, pa, pb, pr, pc, layers)
        secs.append(sec)
        itot = sec[10]
        cell["active"].append(sum(itot[layer]) > 0)
        cell["row_total"].append(sec[6][row])
        cell["col_total"].append(sec[8][col])
        cell["panel_inner"].append(itot[layer])
        mine = [u for u, (l_, _) in enumerate(sec[4]) if l_ == layer]
        for x, deal, line in (("a", sec[0], row), ("b", sec[1], col)):
            pack = [[] for _ in range(npanel)]
            for _, p, _, entry in _pack(sec, sector, pa, pb, x, [i for i, g in enumerate(deal) if g == line], mine):
                pack[p].append(entry)
            cell[f"{x}_pack"].append(pack)
        cell["out"].append([entry for *_, entry in _rectangles(sec, [r for r, g in enumerate(sec[0]) if g == row],
                                                                [c for c, g in enumerate(sec[1]) if g == col])])
    a_panel, b_panel = _panels(secs, layers, npanel, pr, pc)
    cell["a_panel_size"], cell["b_panel_size"] = a_panel[layer, :, row].tolist(), b_panel[layer, :, col].tolist()
    cell["a_strip_bytes"] = 8 * int(a_panel.sum(1).max(initial=0))
    cell["b_strip_bytes"] = 8 * int(b_panel.sum(1).max(initial=0))
    return cell


FLOPS_PER_BYTE = 8.0     # a byte received costs about 8 flops (~16 GF/s and ~2 GB/s per rank)


def grid_shapes(nranks: int) -> list:
    """Every (pr, pc) with pr * pc = nranks."""
    return [(d, nranks // d) for d in range(1, nranks + 1) if nranks % d == 0]


def grid_score(sig, pa, pb, pr: int, pc: int, layers: int = 1, a: bool = True, b: bool = True) -> dict:
    """How a contraction fares on a pr x pc x layers grid (structure only): ``idle``, the
    grid rows and columns with no output rows or columns in any sector and, with layers,
    the layers with no inner tuple (part) in any sector; ``flops`` and
    ``recv_bytes``, the most any rank computes and receives in panels (of A and B, or
    only of those with ``a`` / ``b`` true: an operand whose panels are kept moves once);
    ``cost``, flops + FLOPS_PER_BYTE * bytes of the busiest rank."""
    rows, cols, inner = np.zeros((len(sig), pr)), np.zeros((len(sig), pc)), np.zeros((len(sig), layers))
    for n, (_, r, i, c) in enumerate(sig):      # the deals of summa_layout, without its lists
        grow, gcol, _, usize, place = _deal(n, r, i, c, pa, pb, pr, pc, layers)
        rows[n], cols[n] = _offsets(grow, r.sizes, pr)[1], _offsets(gcol, c.sizes, pc)[1]
        for size, (l_, _) in zip(usize, place):
            inner[n, l_] += size
    flops = 2 * np.einsum("ng,nh,nl->lgh", rows, cols, inner)
    # panels from the other pc - 1 columns (A) and pr - 1 rows (B), on average
    recv = 8 * (a * (pc - 1) / pc * np.einsum("ng,nl->lg", rows, inner)[:, :, None]
                + b * (pr - 1) / pr * np.einsum("nh,nl->lh", cols, inner)[:, None, :])
    idle = int((rows.sum(0) == 0).sum() + (cols.sum(0) == 0).sum()) + (int((inner.sum(0) == 0).sum()) if layers > 1 else 0)
    return {"idle": idle, "flops": float(flops.max(initial=0)), "recv_bytes": float(recv.max(initial=0)),
            "cost": float((flops + FLOPS_PER_BYTE * recv).max(initial=0))}


@lru_cache(maxsize=2048)
def least_idle_shapes(sig, pa, pb, nranks: int, layers: int = 1) -> tuple:
    """The (pr, pc) with pr * pc = ``nranks`` (per layer) on which a contraction idles the
    fewest grid rows, columns and layers (``grid_score``'s ``idle``: none where the sectors
    have as many row and column tuples as some grid has lines), most square first: the
    grids ``stationary.summa_grid`` counts."""
    if not sig:
        return (grid_shape(nranks),)
    idle = {(pr, pc): grid_score(sig, pa, pb, pr, pc, layers)["idle"] for pr, pc in grid_shapes(nranks)}
    fewest = min(idle.values())
    return tuple(sorted((g for g, n in idle.items() if n == fewest), key=lambda g: abs(g[0] - g[1])))


@lru_cache(maxsize=2048)
def choose_grid(sig, pa, pb, nranks: int, layers: int = 1) -> tuple:
    """(pr, pc) of the grid of ``nranks`` ranks (per layer) by which the tile rule judges a
    contraction (``balance.grid_lines``, structure alone): of ``least_idle_shapes``, the
    least cost of the busiest rank by ``grid_score``'s even count, then the most square.
    E.g. 9 (i, j) row tuples on 1024 ranks: 8 x 128, not 32 x 32 (23 idle rows). The
    executor runs, of the same shapes, the one whose busiest rank receives least as
    counted rank by rank (``stationary.summa_grid``)."""
    if not sig:
        return grid_shape(nranks)
    best = None
    for pr, pc in least_idle_shapes(sig, pa, pb, nranks, layers):
        sc = grid_score(sig, pa, pb, pr, pc, layers)
        rank = (sc["idle"], sc["cost"], abs(pr - pc))
        if best is None or rank < best[0]:
            best = (rank, (pr, pc))
    return best[1]
