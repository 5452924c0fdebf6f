"""mpi-collective's exchanges under `mpiexec -n K` (tests/mpi/collective_checks.py): the
all-to-all in rounds with a small artificial limit gives the same data as one call;
blocks fetched by request (counts + alltoallv to the owners, no allgather) equal the
tensor's; a frozen operand moves in the first run of a contraction only."""

import math
from pathlib import Path

import pytest

from mpirun import run_mpi

SCRIPT = Path(__file__).parent / "mpi" / "collective_checks.py"
_runs: dict = {}


def launch(nranks):
    if nranks not in _runs:
        _runs[nranks] = run_mpi(SCRIPT, nranks, timeout=180)
    return _runs[nranks]


@pytest.mark.parametrize("nranks", (2, 3, 4))
def test_alltoallv_in_rounds_above_the_limit(nranks):
    out = launch(nranks)["alltoallv"]
    assert out["limit5"]["ok"] and out["default"]["ok"]
    # pair (s, d) sends (3s + 5d) % 12 elements; rounds of max(1, 5 // P) elements per pair
    largest = max((3 * s + 5 * d) % 12 for s in range(nranks) for d in range(nranks))
    assert out["limit5"]["calls"] == math.ceil(largest / max(1, 5 // nranks)) > 1
    assert out["default"]["calls"] == 1


@pytest.mark.parametrize("nranks", (2, 3, 4))
def test_requests_go_to_owners_by_alltoallv(nranks):
    out = launch(nranks)["requests"]
    assert out["complete"] and out["err"] == 0.0
    assert out["ops"] == ["alltoallv"]          # no allgather of every rank's request list


@pytest.mark.parametrize("nranks", (2, 3, 4))
def test_patches_along_two_axes_of_alias_blocks(nranks):
    """Requests of a patch cut along two axes, of canonical blocks and of their aliases:
    the values are the dense tensor's on both executors, and one-sided gets move exactly
    the remote patches (an alias's patch is cut from its canonical block, not the whole)."""
    out = launch(nranks)["patches"]
    for backend, res in out.items():
        assert res["err"] == 0.0 and res["aliases"] > 0, backend
    assert out["mpi-onesided"]["gets"] == out["mpi-onesided"]["remote"] > 0


@pytest.mark.parametrize("nranks", (2, 3, 4))
def test_frozen_operands_move_once(nranks):
    """R = W * tau three times on the grid: a frozen operand's panels are kept after the first run, so
    the second and third runs move the same amount, less than the first and than a run with
    nothing frozen, and least with both frozen (the grid shape is chosen with the frozen
    operands counted as moved once, so it may differ from the unfrozen run's); likewise for
    the inputs of a permuted addition and a Hadamard product; the result is numpy's every time."""
    out = launch(nranks)["frozen"]
    first = out["none"]["moved"][0]
    assert first > 0
    assert out["none"]["moved"] == [first] * 3
    for case in ("W", "tau", "both"):
        moved = out[case]["moved"]
        assert moved[1] == moved[2] < min(moved[0], first), (case, moved)
    assert out["both"]["moved"][1] <= min(out["W"]["moved"][1], out["tau"]["moved"][1]), out
    # products on the output's owners (stationary c): the W blocks a rank receives are kept
    plain, kept = out["stationary_c_none"]["moved"], out["stationary_c_W"]["moved"]
    assert plain == [plain[0]] * 3 and kept[0] == plain[0] > 0 and kept[1] == kept[2] < kept[0]
    # owner-computes steps (permuted addition, Hadamard): frozen inputs are not sent again
    plain, frozen = out["owner_none"]["moved"], out["owner_frozen"]["moved"]
    assert plain == [plain[0]] * 3 and frozen[0] == plain[0] > 0
    assert frozen[1] == frozen[2] < frozen[0]
    for case in out.values():
        assert case["err"] < 1e-12


@pytest.mark.parametrize("nranks", (2, 4))
def test_cached_batches_cut_tasks_larger_than_the_cache(nranks):
    """mpi-onesided cached with a 0-byte cache bound: every product runs as its own part of
    an output block (one accumulate each, so as many as block products) and the result is
    numpy's."""
    out = launch(nranks)["cached_split"]
    assert out["err"] < 1e-12
    assert out["accs"] == out["products"]
