"""World.alltoallv and World.split (sub-communicator Groups) under mpiexec, K = 1..4.

Each launch runs tests/mpi/runtime_groups.py (checks against a NumPy model, see its
docstring) and returns rank 0's JSON: all-to-all of known arrays (some pieces empty),
broadcasts along the rows and columns of a pr x pc grid (2 x 2 at 4 ranks) from every
root, group allreduce and barrier, comm-log records equal to the bytes requested, clear
errors, and groups freed at World.stop() without MPI warnings. Also with ghost ranks
(groups are made of the workers only).
"""

from pathlib import Path

import pytest

from mpirun import run_mpi

SCRIPT = Path(__file__).parent / "mpi" / "runtime_groups.py"
TIMEOUT = 120

ERROR_PHRASES = {
    "bad_color": ["non-negative integer", "-1"],
    "alltoallv_len": ["one send array and one receive count per rank"],
    "alltoallv_dtype": ["float64", "int64"],
    "bcast_object": ["numpy array", "list"],
    "world_rank_range": ["outside this group"],
    "use_after_free": ["was freed", "world.split"],
}


@pytest.mark.parametrize("nprocs, ghosts", [(1, None), (2, None), (3, None), (4, None), (4, 1)],
                         ids=["1", "2", "3", "4", "4-ghost1"])
def test_alltoallv_and_groups(nprocs, ghosts):
    env = {"TESSERA_PROGRESS": "ghost" if ghosts else "none", "TESSERA_GHOSTS": ghosts}
    r = run_mpi(SCRIPT, nprocs, env=env, timeout=TIMEOUT)
    workers = nprocs - (ghosts or 0)
    assert r["size"] == workers and r["ghosts"] == (ghosts or 0)
    a = r["alltoallv"]
    assert a["mismatches"] == 0 and a["log_ok"]
    assert a["received_total"] == a["expected_total"] > 0
    assert a["bytes_rank0"] == a["expected_rank0"]
    if workers >= 3:      # rank 0 sends 3 doubles to rank 2 (and nothing to rank 1)
        assert a["bytes_rank0"] >= 8 * 3
    assert r["alltoallv_empty"] is True
    pr, pc = r["grid"]
    assert pr * pc == workers and (workers != 4 or (pr, pc) == (2, 2))
    assert r["groups"] == {k: True for k in ("row_rank", "col_rank", "row_world_ranks", "col_world_ranks",
                                             "bcast_log", "row_allreduce", "col_allreduce_max")}
    assert r["bcast_mismatches"] == 0
    assert r["bcast_bytes_rank0"] == r["bcast_expected_rank0"]
    if workers == 4:      # rank 0: 2 row bcasts (5, 6 doubles), 2 column bcasts (2x3, 2x4)
        assert r["bcast_expected_rank0"] == 8 * (5 + 6 + 6 + 8)
    for name, phrases in ERROR_PHRASES.items():
        msg = r["errors"][name]
        assert msg is not None, f"{name}: no RuntimeLayerError raised"
        for ph in phrases:
            assert ph in msg, (name, ph, msg)
    assert r["live_groups_before_stop"] == 1 and r["row_freed_by_stop"] is True
    for bad in ("WARN", "Warning", "leak", "Traceback"):
        assert bad not in r["_stderr"], r["_stderr"][-2000:]
