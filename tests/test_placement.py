"""The balanced placement computed per key (runtime.placement) against the bulk one
(runtime.distribution.block_owner_array: every stored key ranked by size at once), and
a rank's own block tasks (plan.blocktasks.owned_tasks) against the full task list."""

import numpy as np
import pytest

import tessera as ts
from tessera import BlockTensor, IndexSpace
from tessera.backends.context import PlanningContext
from tessera.chem.ccsd_equations import T2_SYMMETRY
from tessera.chem.integrals import CLASSES, class_tensor, make_spaces
from tessera.backends.cached_batches import task_batches
from tessera.plan.blocktasks import contraction_tasks, owned_tasks
from tessera.errors import RuntimeLayerError
from tessera.runtime.distribution import block_owner_array, piece_count
from tessera.runtime.placement import block_placement
from tessera.tensor.block_tensor import symmetry_group


def structures(orbsym, nocc, tile, occ_tile):
    o, v = make_spaces(orbsym, nocc, 0, tile, occ_tile)
    out = {n: class_tensor(n, o, v) for n in CLASSES}
    out["t2"] = BlockTensor((o, o, v, v), 0, name="t2", symmetry=T2_SYMMETRY, canonical=True)
    out["ov"] = BlockTensor((o, v), 0, name="ov")
    out["ovv"] = BlockTensor((o, v, v), 1, name="ovv")
    out["v"] = BlockTensor((v,), 0, name="v")
    return out


def placement_of(t, nranks, placement="balanced"):
    group = symmetry_group(t.symmetry, t.ndim) if t.canonical else ()
    return block_placement(t.spaces, t.irrep, group, nranks, placement)


@pytest.mark.parametrize("orbsym", [[0] * 30, [0, 1, 2, 3, 1, 0, 2, 0, 3, 1] * 3], ids=["C1", "D2"])
@pytest.mark.parametrize("nranks", [1, 3, 8])
@pytest.mark.parametrize("how", ["balanced", "rows"])
def test_owner_per_key_equals_bulk_placement(orbsym, nranks, how):
    """Owner of every stored key as block_owner_array places it; each rank's keys (only
    its own unranked) lie one after the other in its memory; aliases and forbidden keys
    are not stored."""
    for name, t in structures(orbsym, 8, 5, 3).items():
        keys = t.stored_keys()
        if not keys:
            continue
        placement = how if how == "balanced" else ("rows", tuple((3 * i + 1) % nranks
                                                                 for i in range(len(t.spaces[0].tiles))))
        pl = placement_of(t, nranks, placement)
        ref = block_owner_array(t.spaces, t.irrep, keys, nranks, placement)
        assert pl.nblocks == len(keys) and pl.keys() == keys, name
        assert [pl.locate(k)[0] for k in keys] == ref.tolist(), name
        total = 0
        for r in range(nranks):
            mine = pl.local_keys(r)
            assert sorted(mine) == sorted(k for k, o in zip(keys, ref) if o == r), (name, r)
            off = 0
            for k in mine:
                assert pl.locate(k) == (r, off), (name, k)
                off += int(np.prod(t.block_shape(k)))
            assert pl.elements(r) == off
            total += off
        assert total == sum(int(np.prod(t.block_shape(k))) for k in keys)
        for alias in list(t.aliases)[:20]:
            assert not pl.stored(alias)
        forbidden = [k for k in np.ndindex(*(len(s.tiles) for s in t.spaces)) if not t.is_allowed(k)]
        assert not any(pl.stored(k) for k in forbidden[:20])
        assert not pl.stored((0,) * (t.ndim + 1)) and not pl.stored((-1,) * t.ndim)


def test_bad_placement_is_an_error():
    t = structures([0] * 30, 8, 5, 3)["ovvv"]
    with pytest.raises(RuntimeLayerError, match="placement 'rows' needs one rank"):
        placement_of(t, 2, ("rows", (0, 5)))
    with pytest.raises(RuntimeLayerError, match="unknown placement"):
        placement_of(t, 2, "cyclic")


def test_placement_holds_half_grid_tables():
    """What a placement keeps: counts per prefix (half the tile indices) and size class,
    not a row per block: the issue's example (C1, o=100, v=800, tile 48) at 1024 ranks."""
    t = structures([0] * 900, 100, 48, 48)["vvvv"]
    pl = placement_of(t, 1024)
    nv = len(t.spaces[0].tiles)
    assert pl.before.shape == (nv * nv, len(pl.classes)) and pl.nblocks > 5 * nv * nv
    mine = pl.local_keys(5)
    assert len(mine) in (pl.nblocks // 1024, pl.nblocks // 1024 + 1)
    assert all(pl.locate(k)[0] == 5 for k in mine)


@pytest.mark.parametrize("expr", ["acbd,ijcd->ijab", "akic,kjcb->ijab", "kcld,ilcd->ki", "iajm,mkbc->ijkabc"])
def test_owned_tasks_are_the_owners_share(expr):
    """owned_tasks(step, keys) is contraction_tasks(step) cut to the outputs in keys, in
    the same order, with the same products; a canonical output's aliases get none."""
    rng = np.random.default_rng(3)
    o = IndexSpace.from_irreps("o", rng.integers(0, 4, 7), 3)
    v = IndexSpace.from_irreps("v", rng.integers(0, 4, 11), 4)
    ins = expr.split("->")[0].split(",")
    tens = [BlockTensor.random(tuple(o if c in "ijklm" else v for c in s), int(rng.integers(0, 4)), rng=rng)
            for s in ins]
    ctx = PlanningContext()
    with ctx:
        ts.einsum(expr, *tens)
    (step,) = ctx.plans[0].steps
    every = contraction_tasks(step)
    outs = step.out.tensor.allowed_keys()
    for r in range(3):
        mine = outs[r::3]
        assert owned_tasks(step, mine) == tuple(t for t in every if t.out in set(mine))
    assert owned_tasks(step, []) == () and len(task_batches(step, (), True, 2**20, 4)) == 0   # a rank owning nothing


def dealt_pieces(keys, sizes, k, nranks, shift):
    """The ``pieces`` rule written out piece by piece (the reference): blocks by
    decreasing size (ties in key order), each cut into min(k, size) runs of its elements
    [j s // n, (j + 1) s // n), dealt round-robin from rank ``shift``; a rank's pieces one
    after the other in deal order. {key: [(owner, offset, start, count)]}."""
    out, used, i = {}, [0] * nranks, 0
    for n_ in sorted(range(len(keys)), key=lambda n_: (-sizes[n_], keys[n_])):
        s, pieces = sizes[n_], []
        n = min(k, s)
        for j in range(n):
            owner, start = (i + shift) % nranks, j * s // n
            count = (j + 1) * s // n - start
            pieces.append((owner, used[owner], start, count))
            used[owner] += count
            i += 1
        out[keys[n_]] = pieces
    return out


@pytest.mark.parametrize("orbsym", [[0] * 30, [0, 1, 2, 3, 1, 0, 2, 0, 3, 1] * 3], ids=["C1", "D2"])
@pytest.mark.parametrize("nranks,least", [(2, 3), (8, 1), (7, 3), (64, 1), (1000, 1)])
def test_pieces_cover_every_element_once(orbsym, nranks, least):
    """The ``pieces`` placement (runtime.placement.PiecedPlacement, by arithmetic on
    positions: distribution.PieceDeal) against the rule dealt out piece by piece
    (``dealt_pieces``): every block's pieces (owner, offset, elements), every rank's
    pieces in memory order, its home keys and element count; a block's pieces cover it
    once, a rank's pieces lie one after the other (``pieces_held``: those of one rank,
    several where ``least`` exceeds the ranks); a block's home is block_owner_array's
    (unforced); classes with few blocks for the ranks are cut (``least`` forces it, as
    TESSERA_PIECES does for tests), and then every class is spread with max/mean <= 1.5
    unless forced (also as ``backends.balance.loads`` counts it for plans)."""
    from tessera.backends.balance import loads
    from tessera.runtime.distribution import structure_signature
    from tessera.runtime.placement import BalancedPlacement, PiecedPlacement
    cut = 0
    for name, t in structures(orbsym, 8, 5, 3).items():
        keys = t.stored_keys()
        if not keys or t.ndim < 2:
            continue
        group = symmetry_group(t.symmetry, t.ndim) if t.canonical else ()
        pl = block_placement(t.spaces, t.irrep, group, nranks, "pieces", least)
        if not isinstance(pl, PiecedPlacement):
            assert isinstance(pl, BalancedPlacement) and least == 1, name    # whole blocks suffice
            continue
        cut += 1
        sizes = [int(np.prod(t.block_shape(k))) for k in keys]
        assert pl.k == piece_count(max(sizes), sum(sizes), nranks, least), name
        ref = dealt_pieces(keys, sizes, pl.k, nranks, structure_signature(t.spaces, t.irrep) % nranks)
        if least == 1:
            home = block_owner_array(t.spaces, t.irrep, keys, nranks, "pieces")
            assert home.tolist() == [ref[k][0][0] for k in keys], name
        memory = {r: [] for r in range(nranks)}
        sample = set(keys[::max(1, len(keys) // 40)])
        for key in keys:
            pieces = pl.pieces_of(key)
            assert pieces == ref[key] and pl.locate(key) == pieces[0][:2], (name, key)
            for r in ({p[0] for p in pieces} | {0, nranks - 1}) if key in sample else ():   # a rank's own, alone
                assert pl.pieces_held(key, r) == [p for p in pieces if p[0] == r], (name, key, r)
            at = 0
            for owner, offset, start, count in pieces:
                assert start == at and count > 0
                at += count
                memory[owner].append((offset, key, start, count))
            assert at == int(np.prod(t.block_shape(key))), (name, key)
        for r, runs in memory.items():
            runs.sort()
            assert [o for o, *_ in runs] == list(np.cumsum([0] + [c for *_, c in runs])[:-1]), (name, r)
            assert pl.local_pieces(r) == [tuple(x[1:]) for x in runs], (name, r)
            assert pl.home_keys(r) == sorted(k for k in keys if ref[k][0][0] == r), (name, r)
            assert pl.elements(r) == sum(c for *_, c in runs) and pl.local_keys(r) == []
        load = np.asarray([pl.elements(r) for r in range(nranks)])
        if least == 1 and t.placement == "pieces":
            assert (8 * load == loads(t, nranks)).all(), name
        if least == 1 and load.mean() >= 16:     # a piece is at least one element
            assert load.max() / load.mean() <= 1.5, (name, load)
    assert cut


def test_pieces_at_many_ranks_keep_no_table():
    """At 1024 ranks (the issue's example, T2 in pieces) a rank's pieced placement keeps
    the half-grid tables and O(size classes) integers, not a row per piece: its pieces and
    home keys are its own share, and a block's pieces agree with each owner's memory."""
    from tessera.runtime.placement import PiecedPlacement
    t = structures([0] * 900, 100, 48, 48)["t2"]
    pl = placement_of(t, 1024, "pieces")
    assert isinstance(pl, PiecedPlacement) and pl.k > 1
    assert len(pl.deal.sizes) == len(pl.base.classes)
    held = [len(x) for x in vars(pl.deal).values() if isinstance(x, (list, tuple, np.ndarray))]
    assert max(held) <= len(pl.base.classes) + 1, held       # O(size classes), nothing per block
    mine = pl.local_pieces(5)
    assert 0 < len(mine) <= pl.k * pl.nblocks // 1024 + len(pl.deal.sizes)
    assert sum(c for *_, c in mine) == pl.elements(5)
    for key, start, count in mine[:50]:
        (hit,) = [p for p in pl.pieces_of(key) if p[2] == start]
        assert hit[0] == 5 and hit[3] == count
    assert all(pl.locate(k)[0] == 5 for k in pl.home_keys(5))


def element_runs(pieces, shape, lo, hi):
    """The reference for ``part_runs``: per element of the box [lo, hi) (C order), the rank
    holding it and its offset there (-1 where none of ``pieces`` holds it)."""
    flat = np.arange(int(np.prod(shape))).reshape(shape)[tuple(slice(a, b) for a, b in zip(lo, hi))].reshape(-1)
    owner, offset = np.full(len(flat), -1), np.full(len(flat), -1)
    for r, off, start, count in pieces:
        held = (flat >= start) & (flat < start + count)
        owner[held], offset[held] = r, off + flat[held] - start
    return owner, offset


def runs_by_element(runs, n):
    """``part_runs``' runs written out per element of the box (as ``element_runs``)."""
    owner, offset = np.full(n, -1), np.full(n, -1)
    for r, off, pos, count in zip(*runs):
        assert count > 0 and (owner[pos:pos + count] == -1).all()     # runs do not overlap
        owner[pos:pos + count], offset[pos:pos + count] = r, off + np.arange(count)
    return owner, offset


def test_part_runs_against_elements():
    """``placement.part_runs`` (rows a piece meets counted, not searched) against the box
    written out element by element, for random shapes of 1-4 axes, random cuts of the
    block into pieces, random boxes and a random subset of the pieces (a rank's own);
    runs in the box's element order."""
    from tessera.runtime.placement import part_runs
    rng = np.random.default_rng(3)
    for _ in range(400):
        shape = tuple(int(x) for x in rng.integers(1, 6, rng.integers(1, 5)))
        size = int(np.prod(shape))
        k = int(rng.integers(1, min(size, 7) + 1))
        bounds = [0, *sorted(rng.choice(np.arange(1, size), k - 1, replace=False).tolist()), size]
        pieces = [(int(rng.integers(0, 3)), int(rng.integers(0, 99)), a, b - a) for a, b in zip(bounds, bounds[1:])]
        lo = [int(rng.integers(0, s)) for s in shape]
        hi = [int(rng.integers(a + 1, s + 1)) for a, s in zip(lo, shape)]
        some = [p for p in pieces if rng.random() < 0.6]
        runs = part_runs(some, shape, lo, hi)
        n = int(np.prod([b - a for a, b in zip(lo, hi)]))
        for got, want in zip(runs_by_element(runs, n), element_runs(some, shape, lo, hi)):
            assert (got == want).all(), (shape, lo, hi, some)
        assert (np.diff(runs[2]) > 0).all()


@pytest.mark.parametrize("nranks", [256, 1024])
def test_piece_runs_of_one_rank_at_scale(nranks):
    """A planned layout of (H2O)4 cc-pVDZ (C1, 20 occupied, 76 virtual, tile 16) on 256 and
    1024 ranks, T2 in pieces: a rank's runs of a part (``pieces_held``: its own pieces
    only, by arithmetic) are exactly the runs of all the pieces (``pieces_of``) that it
    holds, for parts cut as exchanges cut them (2.5D's layer halves of the first axis,
    (T)'s windows on the last axes); a rank holding none of a block gets none."""
    from tessera.runtime.placement import PiecedPlacement, part_runs
    t = structures([0] * 96, 20, 16, 16)["t2"]
    pl = placement_of(t, nranks, "pieces")
    assert isinstance(pl, PiecedPlacement) and pl.k > 1
    rng = np.random.default_rng(nranks)
    keys = t.stored_keys()
    for key in [keys[i] for i in rng.choice(len(keys), 6, replace=False)]:
        shape = t.block_shape(key)
        for lo, hi in (((0,) * 4, shape), ((0, 0, 0, 0), (shape[0] // 2 + 1, *shape[1:])),
                       ((0, 0, 1, 2), (*shape[:2], shape[2] - 1, shape[3] - 3)), ((1, 0, 0, 5), (2, *shape[1:3], 9))):
            every = part_runs(pl.pieces_of(key), shape, lo, hi)
            held = set(every[0].tolist())
            for r in sorted(held) + rng.choice(nranks, 8).tolist():
                mine = part_runs(pl.pieces_held(key, r), shape, lo, hi)
                sel = every[0] == r
                assert all((a == b[sel]).all() for a, b in zip(mine, every)), (key, r, lo, hi)
                assert len(mine[0]) == 0 or r in held


def test_box_elements_before_counts_the_box_by_hand():
    """``placement.box_elements_before``: the elements of a box of a C-order block that lie
    before each flat position, against a mask of the box counted by numpy (random shapes,
    boxes and positions, the block's end included)."""
    from tessera.runtime.placement import box_elements_before
    rng = np.random.default_rng(3)
    for _ in range(40):
        shape = tuple(int(n) for n in rng.integers(1, 5, rng.integers(1, 5)))
        lo = [int(rng.integers(0, n)) for n in shape]
        hi = [int(rng.integers(a + 1, n + 1)) for a, n in zip(lo, shape)]
        mask = np.zeros(shape, dtype=bool)
        mask[tuple(slice(a, b) for a, b in zip(lo, hi))] = True
        before = np.concatenate([[0], np.cumsum(mask.reshape(-1))])
        x = np.arange(mask.size + 1)
        assert box_elements_before(x, shape, lo, hi).tolist() == before.tolist(), (shape, lo, hi)
