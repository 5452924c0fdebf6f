"""The runtime under mpiexec: K = 1..4 ranks, every progress mode, window kinds.

Each launch runs tests/mpi/runtime_core.py (all checks against a NumPy model, see its
docstring) and returns rank 0's JSON; launches are cached per configuration so each
configuration pays MPI start-up once. Progress modes must give bit-identical arrays to
`none` with the same number of worker ranks (integer-valued data: exact sums).
"""

from pathlib import Path

import pytest

from mpirun import run_mpi, run_mpi_raw

MPI_DIR = Path(__file__).parent / "mpi"
CORE = MPI_DIR / "runtime_core.py"
PROGRESS = MPI_DIR / "runtime_progress.py"
ABORT = MPI_DIR / "runtime_abort.py"
TIMEOUT = 180

_cache: dict = {}


def core(nprocs, progress="none", ghosts=None, window=None):
    key = (nprocs, progress, ghosts, window)
    if key not in _cache:
        env = {"TESSERA_PROGRESS": progress, "TESSERA_GHOSTS": ghosts, "TESSERA_WINDOW": window}
        _cache[key] = run_mpi(CORE, nprocs, env=env, timeout=TIMEOUT)
    return _cache[key]


# (nprocs, progress, ghosts, window) -> worker ranks
CONFIGS = [
    (1, "none", None, None),
    (2, "none", None, None),
    (3, "none", None, None),
    (4, "none", None, None),
    (3, "none", None, "create"),
    (2, "thread", None, None),
    (4, "thread", None, "create"),
    (3, "ghost", 1, None),
    (4, "ghost", 1, None),
    (4, "ghost", 2, None),
]


def workers_of(cfg):
    nprocs, progress, ghosts, _ = cfg
    return nprocs - (ghosts or 0) if progress == "ghost" else nprocs


ERROR_PHRASES = {
    "patch_outside": ["outside the array", "dimension 0", "<= 14"],
    "patch_negative": ["outside the array"],
    "patch_ndim": ["wrong number of dimensions", "has 3"],
    "put_shape": ["put", "shape (2, 2)", "(3, 4, 2)"],
    "acc_shape": ["acc", "(1, 3, 4, 2)", "(3, 4, 2)"],
    "put_patch_shape": ["put_patch", "(2, 2, 3)", "(2, 2, 2)"],
    "acc_patch_shape": ["acc_patch", "(8,)", "(2, 2, 2)"],
    "put_dtype": ["complex128", "float64"],
    "key_missing": ["(0, 1)", "does not exist", "sparse"],
    "key_outside_grid": ["(9, 9, 9)", "outside the tile grid"],
    "key_wrong_ndim": ["(0, 0)", "expected 3 indices"],
    "sparse_put_patch_missing": ["do not exist", "(0, 1)"],
    "global_counter_target": ["global", "per_rank"],
    "per_rank_counter_target": ["not a worker rank"],
    "bad_distribution": ["unknown distribution 'random'", "cyclic"],
    "owner_out_of_range": ["owner of block", "expected a rank"],
    "bad_tiling": ["[3, 0]", "positive integer"],
    "use_after_free": ["was freed"],
    "int_scale": ["integer", "scale 0.5"],
    "unknown_reduction": ["unknown reduction 'avg'"],
}


def check_core(r, workers):
    assert r["size"] == workers
    assert r["mismatches"] == {k: 0 for k in r["mismatches"]}, r["mismatches"]
    assert len(r["mismatches"]) == 10
    assert r["initially_zero"] is True
    assert r["fingerprint"] == r["model_fingerprint"]
    # patches really span 1, 2 and 4 owners (as many as there are ranks)
    p = r["patches"]
    assert p["1"]["owners"] == 1 and p["1"]["blocks"] == 1
    if workers >= 2:
        assert p["2"]["owners"] == 2 and p["2"]["blocks"] >= 2
    if workers >= 4:
        assert p["4"]["owners"] == 4 and p["4"]["blocks"] >= 4
    assert p["all"]["owners"] == workers and p["all"]["blocks"] == 24
    assert r["concurrent_acc_ops"] == 40 * workers
    assert r["local_keys_partition"] is True and r["owner_consistent"] is True
    assert r["nbytes_local_total"] == r["nbytes_expected"] == 14 * 11 * 5 * 8
    loads = r["balanced_loads"]  # costs 1, 3, 3, 5, 3 (sum 15), max 5
    assert sum(loads) == 15.0 and max(loads) <= 15.0 / workers + 5.0
    assert r["explicit_owners_ok"] is True
    assert r["placed_partition"] is True
    # NXTVAL: 0..N-1 exactly once across ranks
    nx = r["nxtval"]
    assert nx["n"] == 10000 and nx["exactly_once"] is True
    assert sum(nx["per_rank"]) == 10000 and len(nx["per_rank"]) == workers
    assert r["nxtval_reset_chunk"] is True
    # static partition + stealing: every task once, the slow rank's queue got stolen
    st = r["stealing"]
    assert st["exactly_once"] is True and st["exactly_once_chunk3"] is True
    assert st["own_prefix"] is True and st["closed"] is True and st["steals_back_to_front"] is True
    if workers > 1:
        assert st["slow_own_done"] < st["slow_own_count"]
        assert sum(st["stolen_by_rank"]) >= st["slow_own_count"] - st["slow_own_done"]
        assert st["steals"] >= 2              # at least two steals ordered back to front
    else:
        assert st["stolen_by_rank"] == [0]
    # communication records equal the bytes requested by the scripted exchange
    cl = r["commlog"]
    assert cl["matrix"] == cl["expected"]
    assert cl["counts"] == cl["expected_counts"]
    assert cl["json_ok"] is True
    # clear errors
    errors = r["errors"]
    assert set(errors) == set(ERROR_PHRASES)
    for name, phrases in ERROR_PHRASES.items():
        msg = errors[name]
        assert msg is not None, f"{name}: no RuntimeLayerError raised"
        for ph in phrases:
            assert ph in msg, f"{name}: {ph!r} not in {msg!r}"
    other = r["other"]
    for name in ("int64", "int64_dtype", "complex128", "allreduce_array", "allreduce_max",
                 "bcast_object", "bcast_array", "allgather"):
        assert other[name] is True, name
    # the section calls allreduce twice, bcast twice and allgather once
    assert other["recorded"] == {"allreduce": 2, "bcast": 2, "allgather": 1}
    assert other["bcast_bytes"] > 3 * 8
    assert r["live_before_stop"] == 6  # 3 arrays + 3 counters freed by World.stop()
    # clean shutdown: no warnings from MPI/UCX
    for bad in ("WARN", "Warning", "leak", "Traceback"):
        assert bad not in r["_stderr"], r["_stderr"][-2000:]


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: "-".join(str(x) for x in c if x))
def test_core(cfg):
    r = core(*cfg)
    assert r["describe"]["progress"] == cfg[1]
    assert r["describe"]["ghosts"] == (cfg[2] or 0)
    check_core(r, workers_of(cfg))


def test_singleton_without_mpiexec():
    r = run_mpi(CORE, None, timeout=TIMEOUT)
    check_core(r, 1)
    assert r["fingerprint"] == core(1)["fingerprint"]


@pytest.mark.parametrize("cfg", [c for c in CONFIGS if c[1] != "none" or c[3]],
                         ids=lambda c: "-".join(str(x) for x in c if x))
def test_mode_same_as_none(cfg):
    """Every progress mode / window kind gives bit-identical arrays to progress 'none'."""
    reference = core(workers_of(cfg))
    assert core(*cfg)["fingerprint"] == reference["fingerprint"]


def test_ghosts_leave_no_worker():
    r = run_mpi(CORE, 2, env={"TESSERA_PROGRESS": "ghost", "TESSERA_GHOSTS": 2},
                timeout=TIMEOUT)
    msg = r["world_error"]
    assert "TESSERA_GHOSTS=2" in msg and "leaves no worker" in msg and "[2]" in msg


@pytest.mark.parametrize("progress,nprocs,window,served", [
    ("none", 2, "create", False),
    ("thread", 2, "create", True),
    ("ghost", 3, None, True),
])
def test_busy_target(progress, nprocs, window, served):
    """A rank that sleeps without calling MPI: with window=create and no progress help
    the get waits for it to wake; a progress thread or a ghost serves it meanwhile."""
    env = {"TESSERA_PROGRESS": progress, "TESSERA_WINDOW": window}
    r = run_mpi(PROGRESS, nprocs, env=env, timeout=TIMEOUT)
    assert r["get_ok"] and r["final_ok"] and r["counter"] == 5
    assert r["before_wake"] == {"get": served, "acc": served, "fetch_add": served}, r["waited"]


@pytest.mark.parametrize("progress,nprocs", [("none", 3), ("ghost", 3)])
def test_exception_on_one_rank_aborts_all(progress, nprocs):
    """No hang: an uncaught exception on rank 1 aborts every rank (ghosts included)."""
    run = run_mpi_raw(ABORT, nprocs, env={"TESSERA_PROGRESS": progress}, timeout=60)
    assert not run.timed_out, run.describe()
    assert run.returncode != 0
    assert "deliberate failure on rank 1" in run.stderr
    assert "passed_barrier" not in run.stdout
