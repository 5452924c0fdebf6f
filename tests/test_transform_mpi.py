"""Distributed AO->MO transform under `mpiexec -n K`, K = 1..4, against the serial one.

One launch of tests/mpi/transform_checks.py per rank count (water C2v and H2O2 C1 in
6-31G, frozen core on and off, small tiles, small and default slabs, both MPI backends).
Checked: every block of every class equals the serial transform to 1e-10 and every
block was compared; each rank computed only its share of the AO integrals (the shares
add up to the 4-fold packed total, npair x the AO-pair columns: all npair in C1, one
shell pair per orbit with symmetry; at 4 ranks none exceeds 1.5x the mean);
every rank finishes row groups, none more than 1.5x the mean rows; the flops of both
halves, totalled over the ranks, are the same at every rank count;
only puts moved data (no gets, no accumulates: nothing is gathered); the temporary
arrays are freed; no rank holds a whole class tensor at 2+ ranks; no MPI warnings.
"""

import sys
from pathlib import Path

import pytest

from mpirun import cached_launcher

sys.path.insert(0, str(Path(__file__).parent / "mpi"))
import transform_checks  # noqa: E402  (cases shared with the MPI script)

SCRIPT = Path(__file__).parent / "mpi" / "transform_checks.py"
RANKS = (1, 2, 3, 4)
TIMEOUT = 240
TOL = 1e-10

launch = cached_launcher(SCRIPT, TIMEOUT)


@pytest.mark.parametrize("nranks", RANKS)
def test_blocks_equal_serial(nranks):
    out = launch(nranks)
    assert out["nranks"] == nranks
    assert len(out["cases"]) == len(transform_checks.CASES)
    for name, case in out["cases"].items():
        assert case["max_error"] < TOL, (name, case["max_error"])
        assert case["max_error_local_vs_pyscf"] < TOL, (name, case["max_error_local_vs_pyscf"])
        assert case["blocks_compared"] == case["blocks_expected"] > 0, name
        assert case["half_arrays_alive"] == 0, name
        if nranks >= 2:
            assert case["largest_share"] < 1.0, name


@pytest.mark.parametrize("nranks", RANKS)
def test_each_rank_computes_its_share(nranks):
    out = launch(nranks)
    for name, case in out["cases"].items():
        stats = case["stats"]
        assert len(stats) == nranks and all(s["ranks"] == nranks for s in stats)
        total = stats[0]["ao_integrals_total"]
        npair = stats[0]["ao_pairs"]
        columns = sum(s["ao_pair_columns"] for s in stats)     # each AO pair once, over all ranks
        # C1: every AO pair; C2v: the shell pairs of one shell pair per orbit
        assert columns == npair if name.startswith("h2o2") else columns < npair, (name, columns)
        assert total == npair * columns
        # the flops of both halves, added over the ranks: every rank reports the same
        # total, and it does not depend on how many ranks shared the work
        flops = {s["flops"] for s in stats}
        assert flops == {launch(1)["cases"][name]["stats"][0]["flops"]} and min(flops) > 0, (name, flops)
        computed = [s["ao_integrals_computed"] for s in stats]
        assert sum(computed) == total, (name, computed)
        if nranks == 4:
            assert max(computed) <= 1.5 * total / nranks, (name, computed)
        if nranks >= 2:
            assert max(computed) < total
            held = [s["half_bytes_held"] for s in stats]
            assert all(h > 0 for h in held) and max(held) < sum(held), (name, held)
            # the finish is spread over all ranks, whoever owns the class blocks
            rows = [s["rows_finished"] for s in stats]
            assert all(r > 0 for r in rows) and max(rows) <= 1.5 * sum(rows) / nranks, (name, rows)


@pytest.mark.parametrize("nranks", RANKS)
def test_only_puts_move_data(nranks):
    out = launch(nranks)
    for name, case in out["cases"].items():
        ops = case["onesided_ops"]
        assert ops["get"] == 0 and ops["acc"] == 0, (name, ops)
        assert ops["put"] > 0 or nranks == 1, (name, ops)     # one rank: every row is its own


@pytest.mark.parametrize("nranks", RANKS)
def test_no_mpi_warnings(nranks):
    err = launch(nranks)["_stderr"]
    for bad in ("WARN", "Warning", "leak", "Traceback"):
        assert bad not in err, err[-2000:]
