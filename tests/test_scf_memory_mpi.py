"""The distributed RHF's integrals and the memory budget at 2 ranks (tests/mpi/
scf_memory_checks.py): in memory when each rank's share fits its budget, direct (and
said in the log) when not, the same energy as PySCF either way, and the estimate
counts the share each rank keeps."""

import sys
from pathlib import Path

import pytest
from pyscf import scf

from mpirun import run_mpi

sys.path.insert(0, str(Path(__file__).parent / "mpi"))
from scf_checks import build  # noqa: E402  (the MPI script's molecules)

SCRIPT = Path(__file__).parent / "mpi" / "scf_memory_checks.py"
E_TOL = 1e-9


@pytest.fixture(scope="module")
def out():
    return run_mpi(SCRIPT, 2, timeout=300)


@pytest.fixture(scope="module")
def e_pyscf():
    mf = scf.RHF(build("water"))
    mf.verbose, mf.conv_tol = 0, 1e-12
    return mf.kernel()


def test_auto_keeps_each_ranks_share_when_it_fits(out, e_pyscf):
    auto = out["auto"]
    assert auto["mode"] == "incore" and abs(auto["e_hf"] - e_pyscf) < E_TOL
    # static: each rank keeps exactly the share counted before any integral, none all of them
    assert auto["kept"] == out["shares"] and 0 < max(out["shares"]) < sum(out["shares"])
    line = [s for s in auto["log"] if "AO integrals in memory:" in s]
    assert line and f"{max(out['shares']) / 2**20:.4g} MiB per rank of" in line[0]
    assert "8-fold skeleton over 2 ranks" in line[0] and "schedule=static" in line[0]
    # steal (the default): each rank keeps what it computed, together every representative
    steal = out["auto_steal"]
    assert steal["mode"] == "incore" and abs(steal["e_hf"] - e_pyscf) < E_TOL
    assert sum(steal["kept"]) == sum(out["shares"]) and max(steal["kept"]) < sum(out["shares"])


def test_c1_auto_decides_from_counted_shares(out):
    """Several ranks without point-group operations: the choice counts each rank's share of
    the identity's representatives (no Fock builder is made, no integral computed before
    it): in memory when it fits, said in the log line with the fullest share."""
    run, shares = out["c1_auto"], out["c1_shares"]
    mf = scf.RHF(build("h2o2_c1"))
    mf.verbose, mf.conv_tol = 0, 1e-12
    assert run["mode"] == "incore" and abs(run["e_hf"] - mf.kernel()) < E_TOL
    assert run["kept"] == shares and 0 < max(shares) < sum(shares)
    line = [s for s in run["log"] if "AO integrals in memory:" in s]
    assert line and f"{max(shares) / 2**20:.4g} MiB per rank of" in line[0]
    assert "8-fold over 2 ranks (their shares of the shell pairs counted)" in line[0]


def test_auto_is_direct_and_says_so_when_the_share_does_not_fit(out, e_pyscf):
    run = out["auto_no_room"]
    assert run["mode"] == "direct" and abs(run["e_hf"] - e_pyscf) < E_TOL
    assert run["kept"] == [0, 0]
    line = [s for s in run["log"] if "direct Fock builds" in s]
    assert line and f"would need {max(out['shares']) / 2**20:.4g} MiB per rank" in line[0]
    assert "budget" in line[0] and "(--max-memory)" in line[0]


def test_c1_auto_without_room_is_the_direct_build_of_every_quartet(out):
    """Several ranks without point-group operations: the counted shares do not fit, so the
    builds are direct, through the compiled build with the identity alone."""
    run = out["c1_auto_no_room"]
    line = [s for s in run["log"] if "direct Fock builds: AO integrals" in s]
    assert line and f"would need {max(out['c1_shares']) / 2**20:.4g} MiB per rank" in line[0]
    mf = scf.RHF(build("h2o2_c1"))
    mf.verbose, mf.conv_tol = 0, 1e-12
    assert run["mode"] == "direct" and abs(run["e_hf"] - mf.kernel()) < E_TOL
    assert run["kept"] == [0, 0]
    assert any("symmetry-unique shell quartets of 1 operation(s)" in s for s in run["log"]), run["log"]


def test_incore_over_budget_is_an_error_not_a_switch(out):
    err = out["incore_no_room"]
    assert err["type"] == "InputError"
    assert "mode='incore' needs" in err["message"] and "mode='direct'" in err["message"]


def test_estimate_counts_the_share_when_the_scf_keeps_it(out):
    assert out["estimate_scf"]["AO integrals"] == max(out["shares"])
    assert "AO integrals" not in out["estimate_scf_no_room"]
