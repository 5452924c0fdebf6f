"""Blocks between ``mpi-collective``'s ranks by all-to-all (``CollectiveComm.alltoallv``):
inputs to where they are needed (``exchange``; by request, ``request_exchange``) and
partial output blocks to their keepers (``deliver``, ``expect_from``, ``add_partials``),
whole or in pieces (``GlobalArray.piece_runs``). ``cc``: the ``CollectiveComm`` (its
``rank``, ``size`` and ``alltoallv``). Both sides of a pair list what travels in one
order, so a message needs no header: sizes follow from the structure.
"""

from __future__ import annotations

import time

import numpy as np

from tessera.backends.dist_base import part_range
from tessera.backends.tasks import part_slice
from tessera.runtime.placement import run_index


def exchange(cc, items) -> dict:
    """Blocks to where they are needed, by one all-to-all.

    ``items``: (global array, key, destination rank) of the step, or (global array,
    key, destination, part) for rows lo..hi of one axis (``part = (axis, lo, hi)``; several
    axes: ``tasks.part_slice``). Every rank lists, in one order common to all ranks, at
    least the items it sends or receives (``involves``; the others' may be left out):
    sender and receiver pair the blocks of one message by that order. Returns {(array id, key): block} (with
    ``part`` appended to the key when given) of the items destined here (owned blocks as
    views). A block (part) stored in pieces is gathered at its destination: each rank
    holding a piece of it sends the part's elements in that piece (``_pieced_item``)."""
    me, size = cc.rank, cc.size
    send = [[] for _ in range(size)]
    expect = [[] for _ in range(size)]     # (tag, shape): a view of the buffer; (None, (part, index, n)): into part[index]
    out: dict = {}
    gathered: list = []
    seen = set()
    for ga, key, dest, *part in items:
        part = part[0] if part else None
        tag = (ga.eid, key) if part is None else (ga.eid, key, part)
        if (tag, dest) in seen:
            continue
        seen.add((tag, dest))
        if ga.pieces > 1:
            _pieced_item(ga, key, part, tag, dest, me, send, expect, gathered)
            continue
        src = ga.owner(key)
        if src == me:
            view = _owned_view(ga, key, part)
            if dest == me:
                out[tag] = view
            else:
                send[dest].append(view.ravel())
        elif dest == me:
            lo, hi = part_range(ga, key, part)
            expect[src].append((tag, tuple(b - a for a, b in zip(lo, hi))))
    counts = [sum(int(np.prod(shape)) if tag is not None else shape[2] for tag, shape in lst) for lst in expect]
    recv = cc.alltoallv([np.concatenate(s) if s else np.zeros(0) for s in send], counts)
    for src, lst in enumerate(expect):
        pos, buf = 0, recv[src]
        for tag, shape in lst:
            if tag is None:              # runs of a gathered part
                flat, index, n = shape
                flat[index] = buf[pos:pos + n]
                pos += n
                continue
            n = int(np.prod(shape))
            out[tag] = buf[pos:pos + n].reshape(shape)
            pos += n
    for tag, blk, order in gathered:
        out[tag] = blk if order is None else blk.transpose(order)
    return out


def _pieced_item(ga, key, part, tag, dest, me, send, expect, gathered) -> None:
    """``exchange`` of one item of an array stored in pieces: this rank sends its runs of
    the block or part (``GlobalArray.piece_runs``: a contiguous row of the part per run, so
    only the part's elements move) to ``dest``; at ``dest`` the part (stored axis order) is
    assembled from them (its own runs copied) and, after the all-to-all, transposed to an
    alias's axes (``gathered``). A rank other than ``dest`` finds only its own runs."""
    runs = ga.piece_runs(key, part, None if dest == me else me)
    mine = runs.owner == me
    if dest != me:
        if mine.any():
            send[dest].append(ga.local_run()[run_index(runs.offset[mine], runs.count[mine])])
        return
    flat = np.empty(int(np.prod(runs.shape, dtype=np.int64)))
    if mine.any():
        flat[run_index(runs.pos[mine], runs.count[mine])] = ga.local_run()[run_index(runs.offset[mine], runs.count[mine])]
    for owner in np.unique(runs.owner[~mine]).tolist():
        sel = runs.owner == owner
        expect[owner].append((None, (flat, run_index(runs.pos[sel], runs.count[sel]), int(runs.count[sel].sum()))))
    gathered.append((tag, flat.reshape(runs.shape), runs.order))


def _owned_view(ga, key, part):
    view = ga.local_view(key)
    return view if part is None else view[part_slice(view.ndim, part)]


def owned_views(me: int, items) -> dict:
    """``exchange``'s answer for the whole blocks this rank owns itself (no communication)."""
    out = {}
    for ga, key, _, *part in items:
        if ga.pieces == 1 and ga.owner(key) == me:
            part = part[0] if part else None
            out[(ga.eid, key) if part is None else (ga.eid, key, part)] = _owned_view(ga, key, part)
    return out


def involves(ga, key, part, dest: int, me: int) -> bool:
    """Whether ``exchange`` of the item (``ga``, ``key``, ``dest``, ``part``) sends from or
    delivers to rank ``me`` (an item that does not may be left out of ``me``'s list)."""
    if dest == me:
        return True
    if ga.pieces > 1:
        return bool((ga.piece_runs(key, part, me).owner == me).any())
    return ga.owner(key) == me


def _encode(eid: int, key: tuple, part) -> list:
    """One request as integers: array id, key length, key, the part's length (0: the whole
    block), then its (axis, lo, hi) triples."""
    part = part or ()
    return [eid, len(key), *key, len(part), *part]


def _decode(ints) -> list:
    """[(array id, key, part)] of a stream of ``_encode`` records."""
    out, pos = [], 0
    while pos < len(ints):
        eid, n = int(ints[pos]), int(ints[pos + 1])
        key = tuple(int(x) for x in ints[pos + 2:pos + 2 + n])
        m = int(ints[pos + 2 + n])
        part = tuple(int(x) for x in ints[pos + 3 + n:pos + 3 + n + m])
        out.append((eid, key, part or None))
        pos += n + 3 + m
    return out


def request_exchange(cc, arrays: dict, requests) -> dict:
    """Blocks by request: every rank sends each owner the keys it needs from it (one
    all-to-all of counts, one of the requests, as integers), the owners answer (one
    all-to-all of the blocks, ``exchange``). ``requests`` = [(global array, key)] or
    [(global array, key, part)] of this rank; ``arrays`` maps array ids to the arrays any
    rank may name. A rank receives only the requests addressed to it."""
    me, size = cc.rank, cc.size
    mine = sorted({(ga.eid, key, *rest) for ga, key, *rest in requests}, key=repr)
    ask = [[] for _ in range(size)]
    items = []
    for eid, key, *rest in mine:
        ga = arrays[eid]
        part = rest[0] if rest else None
        items.append((ga, key, me, *rest))
        # a block stored in pieces: asked of every rank holding a piece of the part
        owners = set(ga.piece_runs(key, part).owner.tolist()) if ga.pieces > 1 else {ga.owner(key)}
        for owner in sorted(owners - {me}):
            ask[owner] += _encode(eid, key, part)
    if size > 1:
        # int64 records travel bit for bit as float64 elements (the runtime moves float64)
        counts = cc.alltoallv([np.array([len(a)], dtype=np.int64).view(np.float64) for a in ask], [1] * size)
        counts = [int(c.view(np.int64)[0]) for c in counts]
        got = cc.alltoallv([np.array(a, dtype=np.int64).view(np.float64) for a in ask], counts)
        for src, buf in enumerate(got):
            # in the requester's order: ``exchange`` pairs sends and receives by list order
            items += [(arrays[eid], key, src, *([part] if part is not None else []))
                      for eid, key, part in _decode(buf.view(np.int64))]
    return exchange(cc, items)


def _sinks(C, okey, me: int, held: bool = False) -> list:
    """Where output block ``okey`` of ``C`` (a stored key) is kept: [(rank, first element,
    elements, its flat view here or None)]; one entry for a whole block, one per piece for
    a block stored in pieces (``GlobalArray.piece_runs``; ``held``: only this rank's)."""
    ga = C.dist.ga
    if ga.pieces > 1:
        runs = ga.piece_runs(okey, rank=me if held else None)
        local = ga.local_run() if (runs.owner == me).any() else None
        return [(r, start, n, local[off:off + n] if r == me else None)
                for r, off, start, n in zip(*(c.tolist() for c in (runs.owner, runs.offset, runs.pos, runs.count)))]
    owner = ga.owner(okey)
    return [(owner, 0, int(np.prod(ga.block_shape(okey))), C.blocks[okey].reshape(-1) if owner == me else None)]


def deliver(C, okey, res, scale: float, send: list, me: int) -> None:
    """A (partial) result ``res`` of output block ``okey``, computed here: ``scale * res``
    added to what this rank keeps of the block, the rest queued for its keepers
    (``send[d]``, unscaled: ``add_partials`` scales on arrival), cut at piece boundaries."""
    flat = np.ascontiguousarray(res).reshape(-1)
    for rank, start, n, view in _sinks(C, okey, me):
        if view is not None:
            view += scale * flat[start:start + n] if scale != 1.0 else flat[start:start + n]
        else:
            send[rank].append(flat[start:start + n])


def expect_from(C, okey, src: int, expect: list, me: int) -> None:
    """What this rank keeps of output block ``okey``, to receive from ``src`` (``deliver``
    there), appended to ``expect[src]`` as flat views."""
    expect[src] += [view for rank, _, _, view in _sinks(C, okey, me, held=True) if view is not None]


def add_partials(cc, scale, send, expect) -> float:
    """Send partial output blocks (or their pieces) to their keepers (``send[d]``: flat
    arrays for rank d, ``deliver``) and add what arrives (``expect[s]``: flat views of the
    output, in rank s's order, ``expect_from``); returns the seconds spent adding."""
    counts = [sum(view.size for view in views) for views in expect]
    recv = cc.alltoallv([np.concatenate(s) if s else np.zeros(0) for s in send], counts)
    c0 = time.perf_counter()
    for src, views in enumerate(expect):
        pos, buf = 0, recv[src]
        for view in views:
            view += scale * buf[pos:pos + view.size]
            pos += view.size
    return time.perf_counter() - c0
