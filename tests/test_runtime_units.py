"""Runtime pieces that need no MPI: block layout and patches, distributions, options,
communication log; plus "importing the runtime does not start MPI"."""

import itertools
import subprocess
import sys

import numpy as np
import pytest

from tessera.errors import RuntimeLayerError
from tessera.profile.commlog import CommLog
from tessera.runtime.distribution import assign_owners
from tessera.runtime.layout import BlockLayout
from tessera.runtime.options import RuntimeOptions


# ---- layout ------------------------------------------------------------------------
def block_id_grid(tiling):
    """Flat block index of every element, built with np.repeat (independent of layout)."""
    counts = [len(t) for t in tiling]
    grid = np.arange(int(np.prod(counts))).reshape(counts)
    for d, tiles in enumerate(tiling):
        grid = np.repeat(grid, tiles, axis=d)
    return grid


@pytest.mark.parametrize("seed", range(6))
def test_patch_pieces_cover_patch_exactly(seed):
    rng = np.random.default_rng(seed)
    ndim = int(rng.integers(1, 5))
    tiling = [list(rng.integers(1, 5, size=int(rng.integers(1, 5)))) for _ in range(ndim)]
    all_keys = list(itertools.product(*(range(len(t)) for t in tiling)))
    keep = [k for k in all_keys if rng.random() < 0.7]
    lay = BlockLayout(tiling, keep)
    ids = block_id_grid(tiling)
    counts = [len(t) for t in tiling]
    for _ in range(20):
        lo = [int(rng.integers(0, n)) for n in lay.shape]
        hi = [int(rng.integers(a, n + 1)) for a, n in zip(lo, lay.shape)]
        pieces, missing = lay.pieces(*lay.check_patch(lo, hi))
        covered = np.zeros([b - a for a, b in zip(lo, hi)], dtype=int)
        for p in pieces:
            blo, _ = lay.block_range(p.key)
            psl = tuple(slice(s, s + n) for s, n in zip(p.patch_start, p.shape))
            covered[psl] += 1
            # every element of the piece lies in block p.key, at p.block_start + offset
            gsl = tuple(slice(a + s, a + s + n) for a, s, n in zip(lo, p.patch_start, p.shape))
            assert np.all(ids[gsl] == np.ravel_multi_index(p.key, counts))
            assert tuple(g.start - b for g, b in zip(gsl, blo)) == p.block_start
        patch_ids = ids[tuple(slice(a, b) for a, b in zip(lo, hi))]
        in_missing = np.isin(patch_ids, [np.ravel_multi_index(k, counts) for k in missing])
        assert np.all(covered[~in_missing] == 1) and np.all(covered[in_missing] == 0)
        touched = {tuple(int(i) for i in np.unravel_index(b, counts)) for b in np.unique(patch_ids)}
        assert touched == {p.key for p in pieces} | set(missing)
        assert set(missing).isdisjoint(keep)


def test_layout_shapes_and_keys():
    lay = BlockLayout([[3, 4, 2], [5, 5]])
    assert lay.shape == (9, 10) and lay.ndim == 2 and len(lay.keys) == 6
    assert lay.block_shape((1, 0)) == (4, 5)
    assert lay.block_range((2, 1)) == ((7, 5), (9, 10))
    assert BlockLayout([[2, 2]]).normalize_key(np.int64(1)) == (1,)
    assert lay.normalize_key([np.int32(2), 1]) == (2, 1)
    assert lay.pieces((0, 0), (0, 10)) == ([], [])


@pytest.mark.parametrize("bad,phrase", [
    ([], "not a list"), ([[3, 0]], "positive"), ([[2.5]], "positive"), ("abc", "not a list"),
])
def test_layout_bad_tiling(bad, phrase):
    with pytest.raises(RuntimeLayerError, match=phrase):
        BlockLayout(bad)


def test_layout_bad_keys_and_patches():
    lay = BlockLayout([[3, 4], [2]])
    with pytest.raises(RuntimeLayerError, match="listed twice"):
        BlockLayout([[3, 4]], keys=[(0,), (0,)])
    with pytest.raises(RuntimeLayerError, match="outside the tile grid"):
        lay.normalize_key((2, 0))
    with pytest.raises(RuntimeLayerError, match="not a tuple of tile indices"):
        lay.normalize_key("ab")
    with pytest.raises(RuntimeLayerError, match="outside the array along dimension 1"):
        lay.check_patch((0, 0), (7, 3))
    with pytest.raises(RuntimeLayerError, match="wrong number of dimensions"):
        lay.check_patch((0,), (1,))
    with pytest.raises(RuntimeLayerError, match="outside the array"):
        lay.check_patch((3, 0), (2, 1))  # lo > hi


# ---- distributions -----------------------------------------------------------------
KEYS = [(i,) for i in range(11)]


def test_cyclic_and_contiguous():
    cyc = assign_owners(KEYS, 3, "cyclic")
    assert [cyc[k] for k in KEYS] == [i % 3 for i in range(11)]
    con = assign_owners(KEYS, 3, "contiguous")
    assert [con[k] for k in KEYS] == [0] * 4 + [1] * 4 + [2] * 3


def test_balanced_is_lpt():
    costs = {k: float(c) for k, c in zip(KEYS, [7, 1, 3, 9, 2, 2, 8, 4, 5, 6, 1])}
    own = assign_owners(KEYS, 3, "balanced", costs=costs)
    loads = [sum(costs[k] for k in KEYS if own[k] == r) for r in range(3)]
    # LPT by hand (ties: lowest rank): 9->0, 8->1, 7->2, 6->2, 5->1, 4->0 (all 13),
    # 3->0, 2->1, 2->2, 1->1, 1->2
    assert loads == [16.0, 16.0, 16.0]
    assert own[(2,)] == 0 and own[(4,)] == 1 and own[(5,)] == 2 and own[(10,)] == 2
    assert own[(3,)] == 0 and own[(6,)] == 1 and own[(0,)] == 2
    # default costs are the given block sizes
    sized = assign_owners(KEYS[:3], 2, "balanced", default_costs=[10, 1, 1])
    assert sized == {(0,): 0, (1,): 1, (2,): 1}


def test_owners_and_errors():
    own = assign_owners(KEYS[:3], 2, owners={(0,): 1, (1,): 0, (2,): 1})
    assert own == {(0,): 1, (1,): 0, (2,): 1}
    with pytest.raises(RuntimeLayerError, match="no rank for block"):
        assign_owners(KEYS[:3], 2, owners={(0,): 1})
    with pytest.raises(RuntimeLayerError, match="expected a rank 0 <= r < 2"):
        assign_owners(KEYS[:1], 2, owners={(0,): 2})
    with pytest.raises(RuntimeLayerError, match="does not have"):
        assign_owners(KEYS[:1], 2, owners={(0,): 0, (5,): 1})
    with pytest.raises(RuntimeLayerError, match="unknown distribution"):
        assign_owners(KEYS, 2, "block")
    with pytest.raises(RuntimeLayerError, match="only by distribution='balanced'"):
        assign_owners(KEYS, 2, "cyclic", costs=[1] * 11)
    with pytest.raises(RuntimeLayerError, match="one cost per block"):
        assign_owners(KEYS, 2, "balanced", costs=[1, 2])
    with pytest.raises(RuntimeLayerError, match="finite number"):
        assign_owners(KEYS[:1], 2, "balanced", costs=[-1])


# ---- options -----------------------------------------------------------------------
def test_options_from_environment():
    o = RuntimeOptions.resolve(environ={})
    assert (o.progress, o.ghosts, o.window, o.emulate_nodes) == ("auto", 0, "allocate", 0)
    # auto: ghost progress (one ghost per node) when the ranks span nodes that all have a
    # rank left to work; else none
    assert (o.on_nodes(2, True).progress, o.on_nodes(2, True).ghosts) == ("ghost", 1)
    assert o.on_nodes(2, True).window == "shared"
    assert (o.on_nodes(1, True).progress, o.on_nodes(2, False).progress) == ("none", "none")
    o = RuntimeOptions.resolve(environ={"TESSERA_GHOSTS": "2"})        # ghosts asked: ghost mode
    assert (o.progress, o.ghosts, o.window) == ("ghost", 2, "shared")
    o = RuntimeOptions.resolve(environ={"TESSERA_WINDOW": "create"})   # a window asked: none
    assert (o.progress, o.window) == ("none", "create")
    assert RuntimeOptions.resolve(progress="thread").on_nodes(4, True).progress == "thread"
    assert RuntimeOptions.resolve(environ={"TESSERA_EMULATE_NODES": "2"}).emulate_nodes == 2
    o = RuntimeOptions.resolve(environ={"TESSERA_PROGRESS": "ghost"})
    assert (o.progress, o.ghosts, o.window) == ("ghost", 1, "shared")
    o = RuntimeOptions.resolve(environ={"TESSERA_PROGRESS": "ghost", "TESSERA_GHOSTS": "2"})
    assert o.ghosts == 2
    o = RuntimeOptions.resolve(environ={"TESSERA_PROGRESS": "Thread", "TESSERA_WINDOW": "create"})
    assert (o.progress, o.window) == ("thread", "create")
    o = RuntimeOptions.resolve(progress="none", environ={"TESSERA_PROGRESS": "ghost"})
    assert o.progress == "none"  # arguments win over the environment


@pytest.mark.parametrize("kwargs,env,phrase", [
    ({}, {"TESSERA_PROGRESS": "async"}, "unknown progress mode 'async'"),
    ({}, {"TESSERA_PROGRESS": "none", "TESSERA_GHOSTS": "1"}, "ghost ranks exist only with progress 'ghost'"),
    ({}, {"TESSERA_EMULATE_NODES": "0"}, "TESSERA_EMULATE_NODES='0': expected a whole number >= 1"),
    ({}, {"TESSERA_EMULATE_NODES": "two"}, "TESSERA_EMULATE_NODES='two'"),
    ({}, {"TESSERA_PROGRESS": "ghost", "TESSERA_GHOSTS": "0"}, "must be >= 1"),
    ({}, {"TESSERA_PROGRESS": "ghost", "TESSERA_GHOSTS": "two"}, "not an integer"),
    ({}, {"TESSERA_PROGRESS": "ghost", "TESSERA_WINDOW": "create"}, "cannot be chosen in ghost"),
    ({"window": "dynamic"}, {}, "unknown window kind 'dynamic'"),
])
def test_options_errors(kwargs, env, phrase):
    with pytest.raises(RuntimeLayerError, match=phrase):
        RuntimeOptions.resolve(environ=env, **kwargs)


# ---- communication log -------------------------------------------------------------
def test_commlog_aggregates_and_snapshots():
    log = CommLog(rank=0)
    log.add("get", 1, 100, 0.5)
    log.add("get", 1, 50, 0.25)
    log.add("acc", 2, 8, 0.1)
    snap = log.snapshot()
    log.add("get", 1, 10, 1.0)
    log.add_split("put", [(0, 30), (2, 10)], 2.0)
    log.add_time("get", 1, 0.5)
    recs = {(r.op, r.peer): r for r in log.records()}
    assert (recs[("get", 1)].count, recs[("get", 1)].nbytes) == (3, 160)
    assert recs[("get", 1)].seconds == pytest.approx(2.25)
    assert recs[("put", 0)].seconds == pytest.approx(1.5)
    assert recs[("put", 2)].seconds == pytest.approx(0.5)
    since = {(r.op, r.peer): r for r in log.records(since=snap)}
    assert set(since) == {("get", 1), ("put", 0), ("put", 2)}
    assert (since[("get", 1)].count, since[("get", 1)].nbytes) == (1, 10)
    tot = log.totals()
    assert (tot["get"].count, tot["get"].nbytes) == (3, 160)
    assert (tot["put"].count, tot["put"].nbytes) == (2, 40)
    assert log.row(3).tolist() == [30, 160, 18]
    assert log.row(3, ops=("acc",)).tolist() == [0, 0, 8]
    assert log.to_dict()["records"][0]["op"] == "acc"
    log.enabled = False
    log.add("get", 1, 1000, 1.0)
    assert log.totals()["get"].nbytes == 160


def test_import_does_not_start_mpi():
    code = ("import sys, tessera, tessera.runtime; "
            "print('mpi4py.MPI' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True)
    assert out.stdout.strip() == "False"
