"""Tessera's distributed RHF under `mpiexec -n K`, K = 1..4, every schedule, against PySCF.

One launch of tests/mpi/scf_checks.py per rank count (MPI start-up paid once); K = 2 also
runs the extras: screening off vs on, incore mode and the non-convergence error (the
memory budget: test_scf_memory_mpi.py).  PySCF references are computed here, tightly converged.
"""

import sys
from pathlib import Path

import numpy as np
import pytest
from pyscf import scf
from pyscf.scf import hf_symm

from mpirun import run_mpi

sys.path.insert(0, str(Path(__file__).parent / "mpi"))
import scf_checks  # noqa: E402  (molecule definitions shared with the MPI script)

SCRIPT = Path(__file__).parent / "mpi" / "scf_checks.py"
RANKS = (1, 2, 3, 4)
EXTRAS_AT = 2
TIMEOUT = 420
E_TOL = 1e-9          # Eh, the requirement
ORB_TOL = 1e-5        # orbital energies: first order in the converged density

_runs: dict = {}
_refs: dict = {}


def launch(nranks):
    if nranks not in _runs:
        args = ("--extras",) if nranks == EXTRAS_AT else ()
        _runs[nranks] = run_mpi(SCRIPT, nranks, args=args, timeout=TIMEOUT)
    return _runs[nranks]


def pyscf_ref(name):
    if name not in _refs:
        mol = scf_checks.build(name)
        mf = scf.RHF(mol)
        mf.verbose = 0
        mf.conv_tol = 1e-12
        mf.conv_tol_grad = 1e-8
        e = mf.kernel()
        assert mf.converged
        orbsym = np.asarray(hf_symm.get_orbsym(mol, mf.mo_coeff))
        _refs[name] = {"e": e, "mo_energy": np.asarray(mf.mo_energy), "orbsym": orbsym,
                       "group": mol.groupname, "nocc": mol.nelectron // 2,
                       "e_nuc": mol.energy_nuc()}
    return _refs[name]


@pytest.mark.parametrize("nranks", RANKS)
def test_energies_equal_pyscf(nranks):
    out = launch(nranks)
    assert out["nranks"] == nranks
    for name in scf_checks.MOLECULES:
        ref = pyscf_ref(name)
        for schedule in scf_checks.SCHEDULES:
            run = out["runs"][f"{name}/{schedule}"]
            assert run["converged"] and run["source"] == "tessera"
            assert abs(run["e_hf"] - ref["e"]) < E_TOL, (name, schedule, run["e_hf"],
                                                         ref["e"])
            assert run["e_nuc"] == pytest.approx(ref["e_nuc"], abs=1e-12)
            assert run["nocc"] == ref["nocc"]
            assert run["point_group"] == ref["group"]
            assert run["same_on_all_ranks"], (name, schedule)


@pytest.mark.parametrize("nranks", RANKS)
def test_symmetric_incore_build_over_ranks_equals_pyscf(nranks):
    """In memory with a point group each rank keeps the symmetry-unique quartets of its
    range of shell pairs and builds its part of the skeleton J/K; the parts summed over
    the ranks give PySCF's energy and orbital energies."""
    out = launch(nranks)
    assert {key.split("/")[0] for key in out["incore"]} == set(scf_checks.MOLECULES)
    for key in ("benzene", "h2o2_c1"):
        assert {f"{key}/{s}" for s in scf_checks.SCHEDULES} <= set(out["incore"])
    for key, run in out["incore"].items():
        name = key.split("/")[0]
        ref = pyscf_ref(name)
        assert run["mode"] == "incore" and run["tasks_total"] is None, key
        assert run["converged"] and abs(run["e_hf"] - ref["e"]) < E_TOL, (key, run["e_hf"])
        np.testing.assert_allclose(sorted(run["mo_energy"]), sorted(ref["mo_energy"]),
                                   atol=ORB_TOL)
        assert run["same_on_all_ranks"], key
    build = out["incore_build"]
    dm = np.array(build["dm"])
    vj, vk = scf.hf.get_jk(scf_checks.build("water"), dm)
    np.testing.assert_allclose(build["g"], vj - 0.5 * vk, rtol=0, atol=1e-10)
    if nranks > 1:              # the budget left no room: each rank computed its ranges anew
        no_room = build["no_room"]
        np.testing.assert_allclose(no_room["g"], vj - 0.5 * vk, rtol=0, atol=1e-10)
        assert no_room["integral_pairs_kept"] == 0 and no_room["incore_bytes"] == 0
        # said once, never silent: the recomputed pairs named in one warning line
        assert len(no_room["warned"]) == 1 and "computed again in every Fock build" in no_room["warned"][0]
    if nranks > 1:              # one process contracts it with all its integrals
        assert build["refused"]["type"] == "SymmetryError"


@pytest.mark.parametrize("nranks", RANKS)
def test_orbital_irreps_equal_pyscf(nranks):
    """Per irrep, the sorted orbital energies agree: labels are right also inside
    degenerate groups (benzene's e1g/e2u pairs split over D2h irreps)."""
    out = launch(nranks)
    for name in scf_checks.MOLECULES:
        ref = pyscf_ref(name)
        run = out["runs"][f"{name}/steal"]
        e = np.asarray(run["mo_energy"])
        sym = np.asarray(run["orbsym"])
        assert np.all(np.diff(e) >= 0)
        assert sorted(np.unique(sym)) == sorted(np.unique(ref["orbsym"]))
        for label in np.unique(ref["orbsym"]):
            ours = np.sort(e[sym == label])
            theirs = np.sort(ref["mo_energy"][ref["orbsym"] == label])
            assert ours.shape == theirs.shape, (name, label)
            np.testing.assert_allclose(ours, theirs, atol=ORB_TOL)
        nocc = run["nocc"]
        assert sorted(sym[:nocc].tolist()) == sorted(ref["orbsym"][:nocc].tolist())
        names = run["irrep_names"]
        if ref["group"] == "D2h":
            assert names["0"] == "Ag" and names["7"] == "B3u"
        if ref["group"] == "C1":
            assert names == {"0": "A"} and set(sym.tolist()) == {0}


@pytest.mark.parametrize("nranks", RANKS)
def test_schedule_accounting(nranks):
    """Every task runs exactly once per Fock build; static never counts or steals; the
    counter operations are those of backends/schedule.py (chunk 1; one rank: no counter):
    nxtval: one claim per task, plus per rank one failing claim (fixed claims: nothing
    to give back);
    steal: one local claim per task run from the own queue, plus per rank a failing
    claim and its give-back; per steal a read and a claim (and a give-back when the claim
    ran past the end); per victim visit a final read that finds the queue empty (1 op) or
    a read, a failing claim and its give-back (3 ops); mostly local claims where a rank has
    16 tasks or more per build (the direct build's tasks are ranges of shell pairs: water
    6-31G has 26)."""
    out = launch(nranks)
    fraction_checked = False
    for name in scf_checks.MOLECULES:
        for schedule in scf_checks.SCHEDULES:
            run = out["runs"][f"{name}/{schedule}"]
            builds = run["fock_builds"]
            total = sum(run["tasks_per_build"])        # density-screened tasks of each build
            assert len(run["tasks_per_build"]) == builds
            assert max(run["tasks_per_build"]) <= run["tasks_total"]
            assert run["threads"] >= 1
            assert builds == run["iterations"]
            assert len(run["busy_s"]) == nranks and min(run["busy_s"]) >= 0
            assert sum(run["tasks_executed"]) == total
            assert run["imbalance"] == pytest.approx(
                max(run["busy_s"]) / np.mean(run["busy_s"]))
            ops = run["counter_ops"]
            stolen, steals = sum(run["tasks_stolen"]), sum(run["steals"])
            if schedule == "static" or nranks == 1:
                assert ops["local"] == ops["remote"] == 0
                assert stolen == steals == 0
            elif schedule == "nxtval":
                assert ops["local"] + ops["remote"] == total + nranks * builds
                assert stolen == steals == 0
            else:
                assert ops["local"] == total - stolen + 2 * nranks * builds
                visits = nranks * (nranks - 1) * builds
                assert 2 * steals + visits <= ops["remote"] <= 3 * (steals + visits)
                assert steals <= stolen
                if run["tasks_total"] >= 16 * nranks:   # else the fixed claims and visits dominate
                    assert ops["local_fraction"] > 0.5, (name, ops)
                    fraction_checked = True
    assert fraction_checked or nranks == 1


def test_screening_threshold_zero_and_default_agree():
    out = launch(EXTRAS_AT)
    screened = out["runs"]["benzene/steal"]
    exact = out["benzene_no_screening"]
    assert exact["screening"] == 0.0 and screened["screening"] == 1e-12
    assert exact["shell_quartets_skipped"] == 0
    assert screened["shell_quartets_skipped"] > 0
    assert screened["shell_quartets"] == exact["shell_quartets"]
    assert abs(screened["e_hf"] - exact["e_hf"]) < E_TOL
    assert abs(exact["e_hf"] - pyscf_ref("benzene")["e"]) < E_TOL


def test_incore_mode_equals_direct():
    """mode="incore" and the default "auto" (incore: the integrals fit): with a point group
    the 8-fold skeleton build over the ranks, without one (C1) each rank replays the first
    build's tasks."""
    out = launch(EXTRAS_AT)
    ref = pyscf_ref("water")["e"]
    auto = out["water_auto"]
    assert auto["mode"] == "incore" and abs(auto["e_hf"] - ref) < E_TOL
    for schedule, run in out["water_incore"].items():       # C2v: the 8-fold skeleton
        assert run["mode"] == "incore" and run["tasks_total"] is None
        assert abs(run["e_hf"] - ref) < E_TOL, schedule
    ref = pyscf_ref("h2o2_c1")["e"]
    for schedule, run in out["c1_incore"].items():          # C1: the identity's representatives
        assert run["mode"] == "incore" and run["tasks_total"] is None
        assert abs(run["e_hf"] - ref) < E_TOL, schedule


def test_stealing_moves_integral_tasks_from_a_slowed_rank():
    """The in-memory build's integral tasks under steal: the last rank, slowed, computes
    (and keeps) fewer shell pairs than its static share, the other more; every pair is
    computed once; the energy equals PySCF's."""
    out = launch(EXTRAS_AT)["slowed_rank"]
    ref = pyscf_ref("h2o2_c1")["e"]
    static, steal = out["static"], out["steal"]
    npairs = sum(static["integral_pairs_kept"])
    assert sum(steal["integral_pairs_kept"]) == npairs
    assert static["integral_tasks_stolen"] == [0, 0] and static["integral_pairs_recomputed"] == [0, 0]
    assert steal["integral_pairs_kept"][1] < static["integral_pairs_kept"][1]
    assert steal["integral_pairs_kept"][0] > static["integral_pairs_kept"][0]
    assert steal["integral_tasks_stolen"][0] > 0 and steal["integral_tasks"][0] > static["integral_tasks"][0]
    for run in (static, steal):
        assert abs(run["e_hf"] - ref) < E_TOL


def test_nonconvergence_raises_with_last_energy_and_error():
    out = launch(EXTRAS_AT)
    err = out["convergence_error"]
    assert err["type"] == "ConvergenceError"
    msg = err["message"]
    assert "did not converge in 3 iterations" in msg and "--scf-max-iter" in msg
    assert f"last energy {err['result_e_hf']:.12f} Eh" in msg
    assert "commutator error" in msg
    assert abs(err["result_e_hf"] - pyscf_ref("n2")["e"]) > 1e-6
