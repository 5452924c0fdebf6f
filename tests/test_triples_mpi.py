"""Distributed (T) under `mpiexec -n K`, K = 1, 2, 4, against the serial kernel.

One launch of tests/mpi/triples_checks.py per rank count: H2O2 distorted to C1 (one
occupied and one virtual tensor tile, so every four-index tensor is one block) and
water in C2v, each with mpi-onesided (nxtval, steal) and mpi-collective, default
occ_tile, occ_tile 4, and occ_tile 4 with the virtual index blocked (vblock 3), on the same t1/t2 as the serial ``triples_correction``.
Checked: E(T) equal to 1e-9; for H2O2 with the default occ_tile, task tiles smaller
than the occupied space and, on every rank, the peak bytes held that come from each of
ovvv, t2, (ov|ov) and (ov|oo) (fetched rows, packed rows, cache, scratch) below the
bytes of that whole tensor; one-sided gets only from mpi-onesided and only with 2+ ranks.
The slow-rank, streamed and budget-streamed runs are made only at the rank counts whose
tests check them (triples_checks.SLOW_RANKS, STREAMED_RANKS, BUDGET_RANKS).
(The sum over the four tensors is not below whole ovvv or whole t2 for molecules this
small: the kernel needs the ovvv rows of three orbitals, 3 v^3, and t2 is o^2 v^2.)
"""

import math
import sys
from pathlib import Path

import pytest
from mpirun import cached_launcher

from tessera.chem.triples_native import DENSE_TILE

sys.path.insert(0, str(Path(__file__).parent / "mpi"))
import triples_checks  # noqa: E402  (molecules and combinations shared with the script)

SCRIPT = Path(__file__).parent / "mpi" / "triples_checks.py"
RANKS = (1, 2, 4)
E_TOL = 1e-9
TIMEOUT = 300

launch = cached_launcher(SCRIPT, TIMEOUT)


@pytest.mark.parametrize("nranks", RANKS)
def test_distributed_triples_equal_serial(nranks):
    out = launch(nranks)
    assert out["nranks"] == nranks
    assert set(out["molecules"]) == set(triples_checks.MOLECULES)
    for name, mol in out["molecules"].items():
        assert len(mol["runs"]) == len(triples_checks.COMBOS)
        for combo, runs in mol["runs"].items():
            assert set(runs) == set(triples_checks.RUNS)
            assert runs["4/vblock3"]["virtual_block"] == 3 and runs["4"]["virtual_block"] == 0
            for ot, run in runs.items():
                e_ref = mol["e_serial"][ot]
                assert abs(run["e_t"] - e_ref) < E_TOL, (name, combo, ot, run["e_t"], e_ref)
                assert run["tasks"] > 0 and len(run["peak_operand_bytes"]) == nranks


VT, OT = [(0, 4), (4, 7), (7, 10), (10, 13)], [(0, 3), (3, 6), (6, 9)]       # H2O2's tensor tiles
WT = [(0, 2), (2, 4), (4, 7), (7, 10), (10, 13)]                            # its window tiles


def _cuts(rng, tiles):
    """A range cut at tensor tile bounds."""
    return [(max(rng[0], a), min(rng[1], b)) for a, b in tiles if max(rng[0], a) < min(rng[1], b)]


def _parts(X, W, fs, ms, last=True):
    """{(source, ranges per axis)}: the blocks' parts a task (stage) of task tiles X and window
    tiles W reads, f in range ``fs``, m in ``ms``: (x p|q f), t2[x m p q], t2[x y p f],
    (x p|y m) and, ``last``, (x p|y q), p, q in W, y over the task's own orbitals."""
    out = set()
    for x in X:
        for P in W:
            out |= {("ovvv", OT[x], WT[P], WT[Q], f) for Q in W for f in _cuts(fs, VT)}
            out |= {("t2", OT[x], m, WT[P], WT[Q]) for Q in W for m in _cuts(ms, OT)}
            for y in X:
                out |= {("t2", OT[x], OT[y], WT[P], f) for f in _cuts(fs, VT)}
                out |= {("ovoo", OT[x], WT[P], OT[y], m) for m in _cuts(ms, OT)}
                out |= {("ovov", OT[x], WT[P], OT[y], WT[Q]) for Q in W} if last else set()
    return out


def _nbytes(parts):
    return sum(8 * math.prod(b - a for a, b in r[1:]) for r in parts)


# window by window, then the occupied triples
ORDER = [(X, (A, B, C)) for A in range(len(WT)) for B in range(A + 1) for C in range(B + 1)
         for X in [(a, b, c) for a in range(3) for b in range(a + 1) for c in range(b + 1)]]


@pytest.mark.parametrize("nranks", RANKS)
def test_operands_fetched_by_virtual_tile(nranks):
    """Distributed tensors, kernel blocked in the virtual index: a task is a triple of task
    tiles and a window (three window tiles); it reads only what the kernel reads, for its
    rows x and p, q in the window W: (x p|q f), t2[x m p q] (f, m whole), and over the
    task's own orbitals y only t2[x y p f], (x p|y m) and (x p|y q): in C1, for R rows of
    its distinct task tiles and w window orbitals, 8 R (w^2 v + o w^2 + R w v + R w o +
    R w^2) bytes, less 8 R^2 w w_t for the w_t window orbitals in window tiles that are
    whole tensor tiles (t2[x y p f] is then a part t2[x m p q] asks for too, requested
    once) (before, t2[x y p f], (x p|y m) and (x p|y q) for every y: 8 R (w^2 v +
    o w v + o w^2 + o^2 w), more wherever R (w v + o w + w^2) < o (w v + o w), as for every
    task of fewer than three task tiles here). The tasks run window by window, each
    window's occupied triples in order, dealt in contiguous runs (a rank's own, then halves
    of what others have left: ``rank_runs``, which together hold every task once); a rank
    keeps the block parts of its previous task that the next one reads too. What each rank
    reads equals the parts its tasks, in its order, read less those kept (fewer than all
    the tasks' parts); E(T) equals the serial one; a rank holds at most one task's rows and
    tables (as many bytes again).
    The budget allows windows 3 orbitals wide (``window_width``), so of the virtual tiles
    (4 3 3 3) the first is cut into two window tiles (2 2), fetched as patches of its blocks."""
    mol = launch(nranks)["molecules"]["h2o2_c1"]
    assert set(mol["windows"]) == {"mpi-onesided", "mpi-collective"}    # patches by get, by exchange
    for run in mol["windows"].values():
        _check_window_run(run, mol["e_serial"]["None"], nranks)
    # what travels is no more than what the tasks read (patches of alias blocks too: t2
    # keeps canonical blocks only); with 2+ ranks some of it is remote
    gets, read = mol["windows"]["mpi-onesided"]["get_bytes"], sum(mol["windows"]["mpi-onesided"]["read_bytes"])
    assert (0 < gets <= read) if nranks > 1 else gets == 0, (gets, read)


def _check_window_run(run, e_serial, nranks):
    assert abs(run["e_t"] - e_serial) < E_TOL
    o_tiles, v_tiles = run["tiles"]["o"], run["tiles"]["v"]
    o, v = sum(o_tiles), sum(v_tiles)
    assert (o_tiles, v_tiles) == ([3, 3, 3], [4, 3, 3, 3])
    count = bound = 0
    reads = []
    queues = [[i for a, b in runs for i in range(a, b)] for runs in run["runs"]]
    assert len(queues) == nranks and sorted(i for q in queues for i in q) == list(range(len(ORDER)))
    for queue in queues:
        mine, before = 0, set()
        for i in queue:
            X, W = sorted(set(ORDER[i][0])), sorted(set(ORDER[i][1]))
            parts = _parts(X, W, (0, v), (0, o))
            R, w = 3 * len(X), sum(WT[t][1] - WT[t][0] for t in W)
            # t2[x y p f] with f a window tile that is a whole tensor tile is t2[x m p q]'s
            # block part too (m = y's tile, q = f): requested once
            whole = sum(WT[t][1] - WT[t][0] for t in W if WT[t] in VT)
            assert _nbytes(parts) == 8 * R * (w * w * v + o * w * w + R * w * (v + o + w) - R * w * whole)
            if R < o:
                assert _nbytes(parts) < 8 * R * (w * w * v + o * w * v + o * w * w + o * o * w)
            count += _nbytes(parts)
            bound = max(bound, 2 * _nbytes(parts))
            mine += _nbytes(parts - before)
            before = parts
        reads.append(mine)
    assert run["tasks"] == len(ORDER) and run["read_bytes"] == reads, (run["read_bytes"], reads)
    assert sum(reads) < count
    # held at once: one task's fetched copies and the tables built from them
    assert all(0 < p <= bound for p in run["peak_operand_bytes"]), (run["peak_operand_bytes"], bound)


@pytest.mark.parametrize("nranks", triples_checks.SLOW_RANKS)
def test_windowed_tasks_are_stolen_from_a_slow_rank(nranks):
    """The windowed run again on mpi-onesided, each task taking the last rank five times as
    long (it sleeps 4 times its kernel's wall time after it, 5 ms at least):
    the others run their own contiguous runs, then steal halves of what it has left
    (``backends.schedule``'s steal), so it runs the fewest tasks and another rank runs
    tasks of its queue; every task runs once, E(T) is the serial one and each rank reads
    what its tasks, in its order, read (``_check_window_run``)."""
    mol = launch(nranks)["molecules"]["h2o2_c1"]
    run = mol["slow_rank"]
    _check_window_run(run, mol["e_serial"]["None"], nranks)
    tasks = [sum(b - a for a, b in runs) for runs in run["runs"]]
    assert tasks[-1] < min(tasks[:-1]), tasks
    assert sum(run["stolen"][:-1]) > 0, run["stolen"]
    # the slow rank's own queue is the last contiguous run of tasks, from where it started
    start = run["runs"][-1][0][0]
    taken = [max(0, b - max(a, start)) for runs in run["runs"][:-1] for a, b in runs]
    assert sum(taken) > 0, run["runs"]


@pytest.mark.parametrize("nranks", triples_checks.STREAMED_RANKS)
def test_streamed_tasks_hold_one_chunk_of_the_contracted_indices(nranks):
    """The windowed run again with the contracted f and m streamed in 3 chunks
    (``chem.triples_stream``: a task in 3 stages, each fetching chunk s of f and m, and y
    only over the task's own orbitals; W kept across the stages). H2O2 C1, o = 9 (tiles
    3 3 3, chunks 3 3 3), v = 13 (chunks 4 4 5), windows of w orbitals: E(T) the serial
    one and the unstreamed windowed one's to 1e-12 on mpi-onesided and mpi-collective; a
    task reads, over its stages, 8 R (w^2 v + o w^2 + R w v + R w o + R w^2) bytes for
    R rows of its distinct task tiles ((x p|q f), t2[x m p q], t2[x y p f], (x p|y m) and,
    last stage, (x p|y q), y over those R orbitals; no chunk is kept from one stage to
    the next), each rank what its tasks read; a rank holds at most one stage's rows and
    tables and the next stage's rows in flight (``TaskSet.lookahead``), as ``stream_bytes``
    counts them: 3 x 8 R (w^2 (c_v + c_o) + R w (c_v + c_o) + R w^2) for the widest
    chunks c_v = 5, c_o = 3, and W of the task's orbital triples, 8 N w^3: terms of the
    tiles and chunks, not of v and o; and less than the unstreamed run's peak."""
    mol = launch(nranks)["molecules"]["h2o2_c1"]
    vc, oc = [(0, 4), (4, 8), (8, 13)], [(0, 3), (3, 6), (6, 9)]                # chunks of f, m

    for backend, run in mol["streamed"].items():
        plain = mol["windows"][backend]
        assert abs(run["e_t"] - mol["e_serial"]["None"]) < E_TOL
        assert abs(run["e_t"] - plain["e_t"]) < 1e-12, (backend, run["e_t"], plain["e_t"])
        assert (run["tiles"]["o"], run["tiles"]["v"]) == ([3, 3, 3], [4, 3, 3, 3])
        w_tiles = [b - a for a, b in WT]
        order = ORDER
        reads, bound = [], 0
        for runs in run["runs"]:
            mine, before = 0, set()
            for i in (i for a, b in runs for i in range(a, b)):
                X, W = sorted(set(order[i][0])), sorted(set(order[i][1]))
                for s in range(3):             # a rank keeps the previous stage's rows, no more
                    rows = _parts(X, W, vc[s], oc[s], s == 2)
                    mine += _nbytes(rows - before)
                    before = rows
                w, R = sum(w_tiles[t] for t in W), sum(3 for _ in X)
                a, b, c = (range(*OT[x]) for x in order[i][0])
                ntrip = sum(1 for i_ in a for j in b for k in c if i_ >= j >= k)
                bound = max(bound, 24 * R * (w * w * 8 + R * w * 8 + R * w * w) + 8 * ntrip * w ** 3)
            reads.append(mine)
        assert run["tasks"] == len(order) and run["read_bytes"] == reads, (backend, run["read_bytes"], reads)
        peaks = run["peak_operand_bytes"]
        assert all(0 < p <= bound for p in peaks), (backend, peaks, bound)
        assert max(peaks) < max(plain["peak_operand_bytes"]), (backend, peaks, plain["peak_operand_bytes"])


@pytest.mark.parametrize("nranks", RANKS)
def test_no_rank_holds_a_whole_tensor_for_triples(nranks):
    mol = launch(nranks)["molecules"]["h2o2_c1"]
    assert mol["occ_tensor_tiles"] == 1            # the case that used to fetch whole tensors
    for combo, runs in mol["runs"].items():
        run = runs["None"]
        assert 1 <= run["task_tile"] < mol["nocc"]
        whole = run["whole_bytes"]
        assert set(whole) == {"ovvv", "t2", "ovov", "ovoo"}
        for source, share in run["peak_share"].items():
            assert 0 < share < 1.0, (combo, source, share)   # max over ranks of held / whole
        # per rank: below the sum of the four tensors, and the kernel's buffers are v^3-sized
        assert all(0 < p < sum(whole.values()) for p in run["peak_operand_bytes"]), (combo, run)
        # (less the one-irrep sweep's four local tiles, a fixed 4 x 16^3 doubles whatever v)
        assert run["kernel_buffer_bytes"] - 8 * 4 * DENSE_TILE ** 3 < whole["ovvv"]


@pytest.mark.parametrize("nranks", RANKS)
def test_rows_travel_by_the_executors_means(nranks):
    for name, mol in launch(nranks)["molecules"].items():
        for combo, runs in mol["runs"].items():
            for ot, run in runs.items():
                if combo.startswith("mpi-collective") or nranks == 1:
                    assert run["get_bytes"] == 0, (name, combo, ot)
                else:
                    assert run["get_bytes"] > 0, (name, combo, ot)


@pytest.mark.parametrize("nranks", triples_checks.BUDGET_RANKS)
def test_the_budget_rule_streams_where_no_unstreamed_task_fits(nranks):
    """H2O2 C1 (o = 9, v = 13) windowed on 2 ranks with no chunks given and a budget
    (``cache_mb`` 0.1, 104.9 kB) under which one-orbital unstreamed tasks would take windows
    two orbitals wide (``window_width``; 19,800 tasks): the budget rule (``stream_plan``)
    streams the tasks, whose read share (bytes and requests per compute, ``read_share``) is
    the lesser, in C > 1 stages of one-orbital task tiles (here 165 tasks, windows spanning
    v, 9 stages; 0.055 MB, windows 3 wide, took the same branch in 5,775 tasks x 7 stages,
    three quarters of the 2-rank launch); E(T) the serial one's to 1e-9 and the unstreamed
    windowed run's to 1e-12, and a rank's peak below the unstreamed run's."""
    mol = launch(nranks)["molecules"]["h2o2_c1"]
    run, plain = mol["budget_streamed"], mol["windows"]["mpi-onesided"]
    assert run["stages"] > 1 and run["task_tile"] == 1 and plain["stages"] == 1, (run["stages"], run["task_tile"])
    assert abs(run["e_t"] - mol["e_serial"]["None"]) < E_TOL
    assert abs(run["e_t"] - plain["e_t"]) < 1e-12, (run["e_t"], plain["e_t"])
    assert max(run["peak_operand_bytes"]) < max(plain["peak_operand_bytes"])


@pytest.mark.parametrize("nranks, env", [(2, {}), (4, {"TESSERA_EMULATE_NODES": "2", "MPIR_CVAR_NOLOCAL": "1",
                                                       "TESSERA_PROGRESS": "none"})])
def test_streamed_tasks_with_lookahead_equal_without(nranks, env):
    """tests/mpi/streamed_lookahead.py: water 6-31G (T) streamed in 3 stages on
    mpi-onesided (steal), at 2 ranks and at 2 emulated nodes x 2 ranks: with lookahead (the
    next part's rows in flight during this part's work, as the run does) E(T) equals the
    run with lookahead off to 1e-12, the unstreamed windowed run's to 1e-10 and the serial
    one's to 1e-9; the same tasks, and each rank holds at most twice the peak it held
    without lookahead (two parts' rows instead of one)."""
    from mpirun import run_mpi
    out = run_mpi(Path(__file__).parent / "mpi" / "streamed_lookahead.py", nranks, env=env, timeout=TIMEOUT)
    assert (out["nranks"], out["nodes"]) == (nranks, 2 if env else 1)
    ahead, plain, windowed = (out["runs"][k] for k in ("ahead", "plain", "windowed"))
    assert ahead["stages"] == plain["stages"] == 3 and windowed["stages"] == 1
    assert ahead["tasks"] == plain["tasks"] == windowed["tasks"] > 0
    assert abs(ahead["e_t"] - plain["e_t"]) < 1e-12
    assert abs(ahead["e_t"] - windowed["e_t"]) < 1e-10
    assert abs(ahead["e_t"] - out["e_serial"]) < E_TOL
    assert max(ahead["peak_operand_bytes"]) <= 2 * max(plain["peak_operand_bytes"])
