"""What ``mpi-collective`` moves per step, from structure alone (for the cost model, ``auto``).

Where a run puts a tensor's blocks on P ranks (``owner_function``: a block's owner or, in
pieces, its home; ``pieces_per_block``; ``piece_rows``: the rank and elements of every
piece, ``runtime.distribution.piece_table``), each made once per tensor in a cache dict
(``cache["least"]``: the run's least pieces per block, TESSERA_PIECES), and the bytes each
rank receives in a step (``step_recv``): a contraction with an operand stationary
(``backends.stationary``), a sum or Hadamard product as ``CollectiveExecutor.add_step``
and ``hadamard_step`` move it (``owner_step_recv``).
"""

from __future__ import annotations

import numpy as np

from tessera.backends import stationary
from tessera.plan.blocktasks import add_source, hadamard_outputs, task_arrays
from tessera.runtime.distribution import block_owners, piece_count, piece_table
from tessera.runtime.distribution import block_sizes as tensor_block_sizes


def owner_function(cache: dict, t, nranks: int):
    """The owner function of tensor ``t``'s blocks (aliases: their canonical block's; a
    block in pieces: its home, its first piece's owner) on ``nranks`` ranks, as a run places
    them (made once per tensor)."""
    if id(t) not in cache:
        table = _piece_table(cache, t, nranks)
        if table is None:
            where = block_owners(t.spaces, t.irrep, t.stored_keys(), nranks,
                                 "balanced" if t.placement == "pieces" else t.placement)
        else:
            where = dict(zip(table[0], table[3][table[1]].tolist()))
        alias = t.aliases
        cache[id(t)] = (t, lambda key: where[key] if key in where else where[alias[key][0]])
    return cache[id(t)][1]


def pieces_per_block(cache: dict, t, nranks: int) -> int:
    """One-sided operations per block of ``t`` as mpi-onesided stores it on ``nranks`` ranks:
    its pieces per block where it is placed in pieces (``runtime.distribution.piece_count``;
    at least ``cache["least"]``), else 1 (made once per tensor)."""
    if t.placement != "pieces" or nranks == 1:
        return 1
    if ("pieces", id(t)) not in cache:
        sizes = tensor_block_sizes(t.spaces, t.stored_keys())
        cache[("pieces", id(t))] = (t, piece_count(int(sizes.max(initial=0)), int(sizes.sum()), nranks,
                                                   cache.get("least", 1)))
    return cache[("pieces", id(t))][1]


def _piece_table(cache: dict, t, nranks: int):
    """None where ``t``'s blocks are whole on ``nranks`` ranks; else (stored keys, where each
    one's pieces start in the rows, where they end, the rows' ranks, their elements), the
    rows of ``runtime.distribution.piece_table`` (made once per tensor)."""
    if pieces_per_block(cache, t, nranks) == 1:
        return None
    if ("table", id(t)) not in cache:
        keys = t.stored_keys()
        index, rank, count = piece_table(t.spaces, t.irrep, keys, nranks, cache.get("least", 1))
        start = np.searchsorted(index, np.arange(len(keys) + 1))
        cache[("table", id(t))] = (t, ({k: i for i, k in enumerate(keys)}, start[:-1], start[1:], rank, count))
    return cache[("table", id(t))][1]


def piece_rows(cache: dict, t, nranks: int, keys):
    """(index into ``keys``, rank, elements) of every piece of ``t``'s blocks ``keys`` (an
    alias: its stored block's), as ``stationary`` takes them; None for whole blocks."""
    table = _piece_table(cache, t, nranks)
    if table is None:
        return None
    where, start, end, rank, count = table
    rows = np.array([where[k] if k in where else where[t.aliases[k][0]] for k in keys], dtype=np.int64)
    n = end[rows] - start[rows]
    sel = np.repeat(start[rows] - np.cumsum(n) + n, n) + np.arange(int(n.sum()), dtype=np.int64)
    return np.repeat(np.arange(len(keys), dtype=np.int64), n), rank[sel], count[sel]


def operands(cache: dict, step, ta, nranks: int) -> tuple:
    """(owner functions, ``piece_rows``) of a contraction's A, B and output, as
    ``backends.stationary`` takes them."""
    refs = (*step.inputs, step.out)
    return (tuple(owner_function(cache, r.tensor, nranks) for r in refs),
            tuple(piece_rows(cache, r.tensor, nranks, keys) for r, keys in zip(refs, (ta.a_keys, ta.b_keys, ta.out))))


def step_recv(step, nranks: int, mode: str = "c", least_pieces: int = 1) -> np.ndarray:
    """Bytes each rank receives by all-to-all in ``step`` on ``mpi-collective``, as the model
    counts them (``least_pieces``: a run's TESSERA_PIECES): a contraction with operand
    ``mode`` stationary (``backends.stationary``), a sum or Hadamard product by
    ``owner_step_recv``."""
    cache = {"least": least_pieces}
    if step.kind != "contract":
        return owner_step_recv(step, nranks, cache)
    ta = task_arrays(step)
    owners, pieces = operands(cache, step, ta, nranks)
    plan = stationary.stationary_scores(ta, owners, nranks, modes=(mode,), where=False, pieces=pieces,
                                        shared=step.inputs[0].tensor is step.inputs[1].tensor)[1][mode]
    return sum(plan["recv"].values())


def _same_pieces(a, b) -> bool:
    """Whether tensors ``a`` and ``b`` are stored alike (one structure and placement: a run
    gives them one placement object)."""
    return (a.placement == b.placement and a.irrep == b.irrep and a.canonical == b.canonical
            and tuple(a.symmetry) == tuple(b.symmetry) and a.spaces == b.spaces)


def owner_step_recv(step, nranks: int, cache: dict) -> np.ndarray:
    """Bytes each rank receives in an ``add`` or ``hadamard`` step on ``mpi-collective``
    (``add_step``, ``hadamard_step``): the input blocks an output block reads go to its home
    (of a block in pieces, the elements the home lacks), and an output in pieces is cut at
    its pieces and each sent from the home to its owner; an ``add`` between tensors in the
    same pieces, read in the same order, moves nothing (``rank_local``). ``cache``:
    ``auto.structure_stats``' cache (made once per tensor)."""
    out = step.out.tensor
    recv = np.zeros(nranks)
    # (a local plan's pair maps, ``unpack`` and the ladder's +- form, never run distributed)
    if step.kind not in ("add", "hadamard") or step.pairs not in (None, "pack", "unpack_half"):
        return recv
    same = tuple(range(out.ndim))
    if (step.kind == "add" and out.placement == "pieces" and pieces_per_block(cache, out, nranks) > 1 and not step.pairs
            and tuple(step.perms["a"]) == same and _same_pieces(out, step.inputs[0].tensor)
            and (step.divisor is None or (tuple(step.perms["d"]) == same
                                          and _same_pieces(out, step.divisor.tensor)))):
        return recv
    home = owner_function(cache, out, nranks)
    reads, outs = [], []            # (tensor, key, home); (output key, home)
    if step.kind == "add":
        ins = (step.inputs[0].tensor,) + ((step.divisor.tensor,) if step.divisor is not None else ())
        for okey in out.stored_keys():
            src = add_source(step, okey)
            if src[0] is not None:
                outs.append((okey, home(okey)))
                reads += [(t, k, outs[-1][1]) for t, k in zip(ins, src)]
    else:
        a, b = (r.tensor for r in step.inputs)
        for okey, plist in hadamard_outputs(step).items():
            if not plist:
                continue
            outs.append((okey, home(okey)))
            reads += [(t, k, outs[-1][1]) for ka, kb in plist for t, k in ((a, ka), (b, kb))]
    for t in {id(t): t for t, _, _ in reads}.values():
        pairs = sorted({(k, r) for u, k, r in reads if u is t})       # ``exchange``: each (block, rank) once
        keys, at = [k for k, _ in pairs], np.array([r for _, r in pairs], dtype=np.int64)
        size = tensor_block_sizes(t.spaces, [t.aliases[k][0] if k in t.aliases else k for k in keys])
        rows = piece_rows(cache, t, nranks, keys)
        if rows is None:
            lacks = size * (np.array([owner_function(cache, t, nranks)(k) for k in keys], dtype=np.int64) != at)
        else:
            lacks = size - stationary.held(rows, np.arange(len(keys)), at, nranks)
        recv += np.bincount(at, weights=8.0 * lacks, minlength=nranks)
    rows = piece_rows(cache, out, nranks, [k for k, _ in outs])
    if rows is not None:            # the home's result to the other pieces' owners
        index, rank, count = rows
        away = rank != np.array([r for _, r in outs], dtype=np.int64)[index]
        recv += np.bincount(rank[away], weights=8.0 * count[away], minlength=nranks)
    return recv
