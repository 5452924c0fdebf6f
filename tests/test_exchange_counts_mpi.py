"""mpi-collective's cost model counts every exchange its executor makes in a CCSD iteration
(tests/mpi/exchange_counts.py: each rank's all-to-alls and grid broadcasts per step of a
steady iteration, from the comm log, against ``collective_model.collective_traffic``)."""

from pathlib import Path

import pytest

from mpirun import run_mpi

SCRIPT = Path(__file__).parent / "mpi" / "exchange_counts.py"
CASES = ("water.xyz:48", "water_tetramer.xyz:24")


@pytest.fixture(scope="module")
def counts():
    return run_mpi(SCRIPT, 2, args=[x for case in CASES for x in ("--case", case)], timeout=400)


@pytest.mark.parametrize("variant", ["summa", "2.5d"])
@pytest.mark.parametrize("case", CASES)
def test_model_counts_every_exchange_of_a_ccsd_iteration(counts, case, variant):
    """Water (C2v) cc-pVDZ at tile 48 and the water tetramer at tile 24, 2 ranks, summa
    (a 2 x 1 grid) and 2.5d (two layers of one rank), contraction modes by cost: per step
    the busiest rank's all-to-alls and broadcasts, summed over the steps of the structure's
    plans, equal the model's, and the executor runs each contraction in the mode the model
    chooses (grid and the stationary modes a, b, c). Before, the model counted the
    ladder's pair unpacking as a local run plans it (one step moving nothing; the
    executor runs a half and two adds): water summa 112 all-to-alls against 128; and it
    left out the amplitude updates t1 = R1 / D1, t2 = R2 / D2 (``CCSDStructure`` now plans
    them as the driver runs them: ``chem.ccsd._update``)."""
    got = counts[f"{case}/{variant}"]
    counted, model = got["counted"], got["model"]
    assert counted["steps"] > 0 and counted["alltoallv"] > 0
    assert counted["alltoallv"] == model["alltoallv"], got
    assert counted["broadcasts"] == model["broadcasts"], got
    assert counted["modes"] == model["modes"], got
    assert set(counted["modes"]) == {"summa", "a", "b", "c"}, got
    assert counted["broadcasts"] > 0 if variant == "summa" else counted["broadcasts"] == 0


@pytest.mark.parametrize("kind", ["add", "hadamard"])
def test_model_counts_the_exchange_of_a_step_with_no_block(counts, kind):
    """A sum and a Hadamard product whose output has no allowed block (occupied orbitals of
    irrep 0, virtual of irrep 1, irrep 0 wanted): each rank still makes the inputs'
    all-to-all (a rank lists only its own items, so none can tell the step is empty
    without one), and the model counts it, deciding from the structure as every rank does
    (``step_bytes.exchanges_inputs``; it counted none for a step that moved nothing)."""
    got = counts["empty"][kind]
    assert got["kinds"] == [kind]
    assert got["counted"] == [got["model"]] * 2 == [1, 1], got
