"""What one ``mpi-collective`` rank lists of a step, from the blocks it holds: O(its share),
not O(all blocks or products). Pure functions of the step's structure and the rank's
held keys (``held(t)``: the stored keys of tensor ``t`` whose block it is home of or holds
a piece of), so tests run them for simulated ranks without MPI.

Stationary contractions (``own_tasks``): with one operand stationary
(``backends.stationary``) a product runs on the home of its block of that operand (of its
output block, mode c). A rank runs the products whose stationary block it is home of,
sends the A and B blocks (or pieces) it holds to the products that read them elsewhere,
and receives the partial output blocks of the outputs it holds (a block or a piece) from
every rank with products of them: the products of ``rank_choice.product_codes``. They are
listed in step order (``contraction_tasks``: task by task, products by inner tuple), so
the exchange items a rank makes of them are the all-products items restricted to the
ones it sends or receives, in the same order, and ``exchange`` pairs sends and receives
as with the whole list.

Owner-computes steps (``add_homes``, ``hadamard_own``) and SUMMA (``summa_own``): the
output blocks, home items and partial blocks a rank computes, sends, receives or keeps,
found from its held blocks (and, for SUMMA, its grid cell in ``grid_deal``), listed in
the order of the whole lists (output keys; ``summa_layout``'s homes and grid cells) with
every item the rank does not take part in left out.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from tessera.backends.rank_choice import cell_items, held_outputs, line_offsets, product_codes, read_keys, sector_index
from tessera.backends.stationary import MODES
from tessera.backends.summa_layout import grid_deal, home_key, inner_units
from tessera.plan.blocktasks import (add_source, hadamard_block_pairs, hadamard_fed, invert_key, pair_outputs,
                                     sector_signature)


class OwnTask(NamedTuple):
    """The products of one output block that a rank takes part in (every product of an
    output it holds): ``products`` = ((A key, B key, k, rank that runs it), ...)."""

    out: tuple
    m: int
    n: int
    out_shape: tuple
    products: tuple


def own_tasks(sig, perms: tuple, ops, held: tuple, mode: str) -> list:
    """[OwnTask] of the products of ``product_codes(sig, perms, ops, held)`` with operand
    ``mode`` ("a", "b" or "c") stationary, in step order; ``ops``: ``stationary.Operands``
    (the owners give each product's rank, asked once per distinct stationary block)."""
    pa, pb, perm_c = perms
    aliases = ops.tensors[2].aliases
    x = MODES.index(mode)
    owner, homes = ops.owners[x], {}
    out = []
    for n, codes in enumerate(product_codes(sig, perms, ops, held)):
        _, rows, inner, cols = sig[n]
        nq, nc = len(inner.tuples), len(cols.tuples)
        rq, c = np.divmod(codes, nc)
        r, q = np.divmod(rq, nq)
        order = np.lexsort((q, c, r))           # task (r, c) by task, then inner tuple
        r, c, q = (v[order].tolist() for v in (r, c, q))
        start = 0
        while start < len(r):
            end = start
            while end < len(r) and r[end] == r[start] and c[end] == c[start]:
                end += 1
            rk, ck = rows.tuples[r[start]], cols.tuples[c[start]]
            okey = tuple((rk + ck)[p] for p in perm_c)
            if not (aliases and okey in aliases):
                prods = []
                for qi in q[start:end]:
                    kk = inner.tuples[qi]
                    akey, bkey = invert_key(rk + kk, pa), invert_key(kk + ck, pb)
                    home = (akey, bkey, okey)[x]
                    if home not in homes:
                        homes[home] = owner(home)
                    prods.append((akey, bkey, inner.sizes[qi], homes[home]))
                out.append(OwnTask(okey, rows.sizes[r[start]], cols.sizes[c[start]],
                                   rows.shapes[r[start]] + cols.shapes[c[start]], tuple(prods)))
            start = end
    return out


def add_homes(step, held, owner) -> list:
    """[(output key, its home, A key, divisor key)] of an ``add`` step that a rank computes
    (home), keeps a piece of, or sends a source block (piece) for, in key order: its output
    blocks and the outputs each A or divisor block it holds feeds (``pair_outputs``; read
    by an alias too). ``owner``: the output's owner function."""
    out = step.out.tensor
    sources = [(step.inputs[0].tensor, step.perms["a"])]
    if step.divisor is not None:
        sources.append((step.divisor.tensor, step.perms["d"]))
    found = set(held(out))
    for t, perm in sources:
        for key in read_keys(t, held(t)):
            found.update(pair_outputs(step, key) if step.pairs else [tuple(key[p] for p in perm)])
    homes = []
    for okey in sorted(found):
        if out.is_allowed(okey) and okey not in out.aliases:     # canonical blocks only
            akey, dkey = add_source(step, okey)
            if akey is not None:
                homes.append((okey, owner(okey), akey, dkey))
    return homes


def hadamard_own(step, me: int, held, owner, involved) -> list:
    """[(output key, its home, [(A key, B key)])] of a Hadamard step that rank ``me``
    computes (home), keeps a piece of, or sends an A or B block (piece) for, in key order:
    found from its output blocks and the outputs its A and B blocks may feed
    (``hadamard_fed``), each output's pairs made alone (``hadamard_block_pairs``).
    ``owner``: the output's owner function; ``involved(x, key, home)``: whether ``me``
    sends or receives block ``key`` of input x (0: A, 1: B) for an output computed on
    ``home`` (``exchange.involves``)."""
    out = step.out.tensor
    held_out = set(held(out))
    found = set(held_out)
    for x, ref in enumerate(step.inputs):
        for key in read_keys(ref.tensor, held(ref.tensor)):
            found.update(hadamard_fed(step, x, key))
    own = []
    for okey in sorted(found):
        plist = hadamard_block_pairs(step, okey)
        if not plist:
            continue
        home = owner(okey)
        if (home == me or okey in held_out
                or any(involved(0, ka, home) or involved(1, kb, home) for ka, kb in plist)):
            own.append((okey, home, plist))
    return own


def summa_own(step, grid: tuple, me: int, held, involved) -> dict:
    """Rank ``me``'s share of a SUMMA contraction on the pr x pc x layers ``grid``:
    ``a``, ``b``: (key, destination rank, part) of the home items it receives (those of its
    grid cell, ``cell_items``) or sends (those of the blocks it holds that ``involved(x, key,
    part, dest)`` says it holds a piece of), in ``summa_layout``'s home order; ``expect``:
    (output key, grid rank) of the partial blocks it keeps from the other grid cells'
    rectangles (every layer with inner work in the block's sector), in the order each grid
    rank sends them (sector, row tuple, column tuple)."""
    pa, pb, perm_c = step.perms["a"], step.perms["b"], step.perms["c"]
    perms = (pa, pb, perm_c)
    pr, pc, layers = grid
    sig = sector_signature(step)
    deal = grid_deal(sig, pa, pb, pr, pc, layers)
    nk = (len(pa) + len(pb) - len(perm_c)) // 2
    units = [inner_units(inner, layers)[0] for _, _, inner, _ in sig]
    of_tuple = [{} for _ in sig]                 # per sector: inner tuple -> its units
    for n, us in enumerate(units):
        for u, (q, _) in enumerate(us):
            of_tuple[n].setdefault(q, []).append(u)
    ustart = np.cumsum([0] + [len(us) for us in units])
    loff = line_offsets(sig)
    own = {}
    for x, ref, perm, split, axes in (("a", step.inputs[0], pa, len(pa) - nk, (0, 1)),
                                      ("b", step.inputs[1], pb, nk, (1, 2))):
        items = {}             # home order: A (sector, row, unit), B (sector, unit, column)
        for n, i, u, key, part, _ in cell_items(sig, perms, deal, grid, me, x):
            items[(n, i, u) if x == "a" else (n, u, i)] = (key, me, part)
        for key in read_keys(ref.tensor, held(ref.tensor)):
            found = sector_index(sig, tuple(key[p] for p in perm), split, axes)
            if found is None:
                continue
            n, i, j = found
            outer, q = (i, j) if x == "a" else (j, i)
            _, rows, inner, cols = sig[n]
            line = int(deal["row_line" if x == "a" else "col_line"][loff[x][n] + outer])
            for u in of_tuple[n].get(q, ()):
                layer, panel = (int(deal[f"unit_{w}"][ustart[n] + u]) for w in ("layer", "panel"))
                dest = ((layer * pr + line) * pc + panel % pc if x == "a"
                        else (layer * pr + panel % pr) * pc + line)
                tag = (n, outer, u) if x == "a" else (n, u, outer)
                if tag not in items:
                    outer_tuple = (rows if x == "a" else cols).tuples[outer]
                    _, part = home_key(x, perms, outer_tuple, inner.tuples[q], units[n][u][1])
                    if involved(x, key, part, dest):
                        items[tag] = (key, dest, part)
        own[x] = [items[tag] for tag in sorted(items)]
    active = deal["panel_inner"].sum(2) > 0
    found, cell = held_outputs(sig, perms, deal, grid, held(step.out.tensor))
    expect = []
    for (okey, (n, r, c)), at in zip(found, cell.tolist()):
        for layer in range(layers):
            if active[n, layer] and layer * pr * pc + at != me:
                expect.append(((n, r, c), okey, layer * pr * pc + at))
    own["expect"] = [(okey, src) for _, okey, src in sorted(expect)]
    return own
