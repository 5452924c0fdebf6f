"""What the MPI executors move per step, from structure alone (for the cost model, ``cost_model``).

Where a run puts a tensor's blocks on P ranks (``owner_function``: a block's owner or, in
pieces, its home; ``pieces_per_block``; ``piece_rows``: the rank and elements of every
piece, ``runtime.distribution.piece_table``), each made once per tensor in a cache dict
(``cache["least"]``: the run's least pieces per block, TESSERA_PIECES), and the bytes each
rank receives in a step (``step_recv``): a contraction with an operand stationary
(``backends.stationary``), a sum or Hadamard product as ``CollectiveExecutor.add_step``
and ``hadamard_step`` move it (``owner_step_recv``); on ``mpi-onesided``, the bytes each
rank's gets, accumulates and puts move in a sum or Hadamard product
(``onesided_step_bytes``). Both from ``owner_step_moves`` (``moved_bytes``). Variant
``owner``'s gets and puts: in a contraction ``onesided_owner_counts``, in a sum or
Hadamard product ``owner_other_ops``.
"""

from __future__ import annotations

import numpy as np

from tessera.backends import registry, stationary
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


def operands(cache: dict, step, nranks: int) -> stationary.Operands:
    """A contraction's A, B and output as a run stores them on ``nranks`` ranks
    (``backends.stationary.Operands``: owner functions and ``piece_rows``)."""
    tensors = tuple(r.tensor for r in (*step.inputs, step.out))
    return stationary.Operands(
        tensors, tuple(owner_function(cache, t, nranks) for t in tensors),
        tuple(None if pieces_per_block(cache, t, nranks) == 1 else
              (lambda keys, t=t: piece_rows(cache, t, nranks, keys)) for t in tensors))


def step_recv(step, nranks: int, mode: str = "c", least_pieces: int | None = None, layers: int = 1,
              moved_once=()) -> np.ndarray:
    """Bytes each rank receives by collectives in ``step`` on ``mpi-collective``, as the
    model counts them (``least_pieces``: pieces per block at least, None: the run's,
    ``registry.least_pieces``): a contraction on the grid of ``layers`` layers (``mode``
    ``"summa"``: ``stationary.summa_recv``, on ``stationary.summa_grid``'s grid, both
    counting the operands of ``moved_once`` as already sent, as the executor does) or with
    operand ``mode`` stationary (``backends.stationary``), a sum or Hadamard product by
    ``owner_step_recv``."""
    cache = {"least": registry.least_pieces() if least_pieces is None else least_pieces}
    if step.kind != "contract":
        return owner_step_recv(step, nranks, cache)
    ta = task_arrays(step)
    ops = operands(cache, step, nranks)
    if mode == "summa":
        sig = tuple((sec.irrep, sec.rows, sec.inner, sec.cols) for sec in step.sectors)
        perms = (step.perms["a"], step.perms["b"], step.perms["c"])
        items = stationary.grid_items(sig, perms, layers, ops)
        grid, _ = stationary.summa_grid(sig, perms, layers, ops, nranks, moved_once, items)
        recv = stationary.summa_recv(sig, perms, grid, ops, nranks, moved_once, items)
        return recv["a"] + recv["b"] + recv["panels"] + recv["c"]
    plan = stationary.stationary_scores(ta, ops.owners, nranks, modes=(mode,), where=False, pieces=ops.tables(ta),
                                        shared=step.inputs[0].tensor is step.inputs[1].tensor)[1][mode]
    return sum(plan["recv"].values())


def _same_pieces(a, b) -> bool:
    """Whether tensors ``a`` and ``b`` are stored alike (one structure and placement: a run
    gives them one placement object)."""
    return (a.placement == b.placement and a.irrep == b.irrep and a.canonical == b.canonical
            and tuple(a.symmetry) == tuple(b.symmetry) and a.spaces == b.spaces)


def owner_step_recv(step, nranks: int, cache: dict) -> np.ndarray:
    """Bytes each rank receives in an ``add`` or ``hadamard`` step on ``mpi-collective``
    (``add_step``, ``hadamard_step``): ``owner_step_moves``' inputs at the homes, and the
    output pieces at their owners (``moved_bytes``)."""
    return moved_bytes(owner_step_moves(step, nranks, cache), nranks, "mpi-collective")


def onesided_step_bytes(step, nranks: int, cache: dict, accumulates: bool = True) -> np.ndarray:
    """Bytes each rank moves to or from other ranks in an ``add`` or ``hadamard`` step on
    ``mpi-onesided`` (``accumulates`` False: variant ``owner``), as its counters record
    them (``moved_bytes``)."""
    return moved_bytes(owner_step_moves(step, nranks, cache), nranks,
                       "mpi-onesided" if accumulates else "owner")


def moved_bytes(moves: tuple, nranks: int, executor: str) -> np.ndarray:
    """Per rank, the bytes of ``owner_step_moves`` as ``executor`` moves and counts them:
    ``mpi-collective`` what each rank receives (inputs at the homes, output pieces at their
    owners); ``mpi-onesided`` (``DistributedExecutor.add_step``, ``hadamard_step``,
    ``_add_into``) what its gets receive and its accumulates send (the home gets the inputs
    it lacks and accumulates each output piece held elsewhere), ``owner`` the same with a
    get and a put per such piece."""
    by_tensor, (home, owner, nbytes) = moves
    reads = sum(by_tensor.values(), np.zeros(nranks))
    if executor == "mpi-collective":
        return reads + np.bincount(owner, weights=nbytes, minlength=nranks)
    return reads + (2 if executor == "owner" else 1) * np.bincount(home, weights=nbytes, minlength=nranks)


def owner_step_moves(step, nranks: int, cache: dict) -> tuple:
    """What an ``add`` or ``hadamard`` step moves on either MPI executor, which compute
    each output block on its home: ({id(input tensor): bytes of its elements each rank,
    as the home of output blocks, lacks and receives}; (home, owner, bytes) arrays of the
    output pieces a home sends to the other pieces' owners). An input block (or an alias of it) goes to
    a home once (``exchange``, ``fetch_blocks``); an ``add`` between tensors in the same
    pieces, read in the same order, moves nothing (``rank_local``). ``cache``:
    ``iteration_counts.structure_stats``' cache (made once per tensor)."""
    out = step.out.tensor
    recv = {}
    none = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0))
    reads, outs = owner_step_reads(step, nranks, cache)
    if not outs:
        return recv, none
    for t in {id(t): t for t, _, _ in reads}.values():
        pairs = sorted({(k, r) for u, k, r in reads if u is t})       # ``exchange``: each (block, rank) once
        keys, at = [k for k, _ in pairs], np.array([r for _, r in pairs], dtype=np.int64)
        size = tensor_block_sizes(t.spaces, [t.aliases[k][0] if k in t.aliases else k for k in keys])
        rows = piece_rows(cache, t, nranks, keys)
        if rows is None:
            lacks = size * (np.array([owner_function(cache, t, nranks)(k) for k in keys], dtype=np.int64) != at)
        else:
            lacks = size - stationary.held(rows, np.arange(len(keys)), at, nranks)
        recv[id(t)] = np.bincount(at, weights=8.0 * lacks, minlength=nranks)
    rows = piece_rows(cache, out, nranks, [k for k, _ in outs])
    if rows is None:
        return recv, none
    index, rank, count = rows           # the home's result to the other pieces' owners
    homes = np.array([r for _, r in outs], dtype=np.int64)[index]
    away = rank != homes
    return recv, (homes[away], rank[away], 8.0 * count[away])


def exchanges_inputs(step, nranks: int, cache: dict) -> bool:
    """Whether the MPI executors gather the inputs of an ``add`` or ``hadamard`` step at
    the homes of its output blocks (``mpi-collective``: by an exchange, made whether any
    block moves or not), from the structure alone: every such step but an ``add`` between
    tensors in the same pieces, read in the same order (``DistributedExecutor.rank_local``),
    and a local plan's pair maps (``unpack``, the ladder's +- form), never run distributed."""
    out = step.out.tensor
    if step.kind not in ("add", "hadamard") or step.pairs not in (None, "pack", "unpack_half"):
        return False
    same = tuple(range(out.ndim))
    return not (step.kind == "add" and out.placement == "pieces" and pieces_per_block(cache, out, nranks) > 1
                and not step.pairs and tuple(step.perms["a"]) == same and _same_pieces(out, step.inputs[0].tensor)
                and (step.divisor is None or (tuple(step.perms["d"]) == same
                                              and _same_pieces(out, step.divisor.tensor))))


def owner_step_reads(step, nranks: int, cache: dict) -> tuple:
    """The blocks an ``add`` or ``hadamard`` step reads at the homes of its output blocks,
    as the executors list them: ([(tensor, key, home)], [(output key, home)]), both empty
    for a step that moves nothing (an ``add`` between tensors in the same pieces, read in
    the same order: ``rank_local``)."""
    out = step.out.tensor
    if not exchanges_inputs(step, nranks, cache):
        return [], []
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
    return reads, outs


def frozen_reads(step, nranks: int, cache: dict) -> list:
    """[(tensor, key, bytes)] of the frozen inputs of an ``add`` or ``hadamard`` step on
    ``mpi-collective``, in the order its ``_exchange`` offers them to its ``FrozenCache``:
    the key (per step and input, as the executor keys them: its output, the input's place
    and its items, (block, home) per read) and the bytes
    the entry takes, the most one rank receives of them, a block (a block in pieces
    whole) per read at a home that does not own it whole."""
    reads, _ = owner_step_reads(step, nranks, cache)
    parts = 2 if step.kind == "hadamard" or step.divisor is not None else 1
    out = []
    for n in range(parts):                  # the reads alternate between the step's inputs
        part = reads[n::parts]
        if not part or not part[0][0].constant:
            continue
        t = part[0][0]
        size = tensor_block_sizes(t.spaces, [t.aliases[k][0] if k in t.aliases else k for _, k, _ in part])
        at = np.array([r for _, _, r in part], dtype=np.int64)
        if pieces_per_block(cache, t, nranks) == 1:
            owner = owner_function(cache, t, nranks)
            size = size * (np.array([owner(k) for _, k, _ in part], dtype=np.int64) != at)
        out.append((t, ("in", id(step.out.tensor), n, tuple((k, r) for _, k, r in part)),
                    float(np.bincount(at, weights=8.0 * size, minlength=nranks).max(initial=0))))
    return out


def onesided_owner_counts(step, nranks: int, cache: dict) -> dict:
    """Per rank, what ``mpi-onesided``'s variant ``owner`` does in contraction ``step``
    (``OneSidedExecutor._owner_loop``): every output block's tasks run on its home (a static
    deal by ownership, ``owned_tasks``); a rank gets each distinct block its products read
    that it does not hold once (the step's block cache; a block in pieces: the pieces held
    elsewhere), and an output in pieces it gets and puts back at the pieces held elsewhere,
    once per task (``_add_into``; a whole output block is its own). Per rank: ``flops``,
    ``gets``, ``puts`` and ``bytes`` (operations with other ranks, one per block or piece
    held elsewhere, and the bytes of both; a rank's copy of its own piece is no operation),
    of which ``frozen_gets`` and ``frozen_bytes`` read frozen operands (the executor's
    ``FrozenCache`` keeps them across iterations).
    Exact while a rank's blocks of the step fit its block cache and no task's products
    are cut between batches (``cached_batches``); else a rank fetches some blocks again.
    ``cache``: ``owner_function``'s."""
    ta = task_arrays(step)
    A, B, C = (r.tensor for r in (*step.inputs, step.out))
    home = owner_function(cache, C, nranks)
    task_rank = np.array([home(k) for k in ta.out], dtype=np.int64)
    rank_of = task_rank[ta.task]
    flops = 2.0 * ta.m[ta.task] * ta.k * ta.n[ta.task]
    out = {"flops": np.bincount(rank_of, weights=flops, minlength=nranks)}
    out.update({k: np.zeros(nranks) for k in ("gets", "bytes", "frozen_gets", "frozen_bytes")})
    for t, ids, keys, size in ((A, ta.a, ta.a_keys, ta.a_size), (B, ta.b, ta.b_keys, ta.b_size)):
        ids, at = stationary.distinct_pairs(ids, rank_of, nranks)
        ops, nbytes = _away(cache, t, nranks, keys, ids, at, size[ids])
        for x, kind in ((ops, "gets"), (nbytes, "bytes")):
            out[kind] += x
            if t.constant:
                out["frozen_" + kind] += x
    ops, nbytes = _away(cache, C, nranks, ta.out, np.arange(len(ta.out)), task_rank, ta.m * ta.n)
    out["gets"] += ops              # a get and a put per piece held elsewhere
    out["puts"] = ops
    out["bytes"] += 2 * nbytes
    return out


def owner_other_ops(step, nranks: int, cache: dict) -> tuple:
    """(gets, puts) per rank of variant ``owner`` in an ``add`` or ``hadamard`` step
    (``DistributedExecutor.add_step``, ``hadamard_step``, ``_add_into``): the home of each
    output block gets each input block it reads once (``owner_step_reads``; a block in
    pieces: one get per piece held elsewhere), and gets and puts back each piece of the
    output block held elsewhere; their bytes are ``moved_bytes(..., "owner")``'s."""
    gets, puts = np.zeros(nranks), np.zeros(nranks)
    reads, outs = owner_step_reads(step, nranks, cache)
    for t in {id(t): t for t, _, _ in reads}.values():
        pairs = sorted({(k, r) for u, k, r in reads if u is t})       # ``fetch_blocks``: each (block, rank) once
        gets += _away(cache, t, nranks, [k for k, _ in pairs], np.arange(len(pairs)),
                      np.array([r for _, r in pairs], dtype=np.int64), np.zeros(len(pairs)))[0]
    if outs:
        puts = _away(cache, step.out.tensor, nranks, [k for k, _ in outs], np.arange(len(outs)),
                     np.array([r for _, r in outs], dtype=np.int64), np.zeros(len(outs)))[0]
    return gets + puts, puts


def _away(cache: dict, t, nranks: int, keys, ids, at, size) -> tuple:
    """(operations, bytes) per rank of rank ``at[i]`` reading or writing block
    ``keys[ids[i]]`` (``size[i]`` elements) of ``t`` where other ranks hold it: a whole
    block held elsewhere, one operation; a block in pieces, one per piece held elsewhere,
    its elements."""
    table = piece_rows(cache, t, nranks, keys)
    if table is None:
        owner = owner_function(cache, t, nranks)
        away = np.array([owner(k) for k in keys], dtype=np.int64)[ids] != at
        return (np.bincount(at, weights=away, minlength=nranks),
                np.bincount(at, weights=8.0 * size * away, minlength=nranks))
    index, rank, _ = table
    mine = stationary.held((index, rank, np.ones(len(index))), ids, at, nranks)
    return (np.bincount(at, weights=np.bincount(index, minlength=len(keys))[ids] - mine, minlength=nranks),
            np.bincount(at, weights=8.0 * (size - stationary.held(table, ids, at, nranks)), minlength=nranks))
