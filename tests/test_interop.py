"""PySCF, QCSchema, FCIDUMP, Molden, Z-matrix, --units, --version, --threads: in and out.

Every energy is checked against PySCF computed here from the same molecule or mean field.
"""

import json
from importlib import metadata

import numpy as np
import pytest
from pyscf import cc, gto, scf
from pyscf.tools import fcidump, molden

import tessera
from tessera.chem.fcidump import read_fcidump
from tessera.chem.job import Job, RunOptions
from tessera.cli.main import main
from tessera.errors import InputError

WATER_ATOMS = [("O", (0.0, 0.0, 0.117790)), ("H", (0.0, 0.755453, -0.471161)), ("H", (0.0, -0.755453, -0.471161))]
WATER_XYZ = "3\nwater\n" + "".join(f"{s} {x:.6f} {y:.6f} {z:.6f}\n" for s, (x, y, z) in WATER_ATOMS)


def water(basis="6-31g", symmetry=True):
    return gto.M(atom=[[s, xyz] for s, xyz in WATER_ATOMS], basis=basis, symmetry=symmetry, verbose=0)


@pytest.fixture(scope="module")
def mf():
    m = scf.RHF(water())
    m.conv_tol = 1e-12
    m.kernel()
    return m


def pyscf_ccsd(mf, frozen=None):
    m = cc.CCSD(mf, frozen=frozen)
    m.conv_tol, m.conv_tol_normt = 1e-11, 1e-8
    m.kernel()
    return m, m.ccsd_t()


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(code, err, needle):
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1 and needle in err, err


# ---------------------------------------------------------------- PySCF in and out

@pytest.mark.parametrize("frozen", [None, 1, [0, 12]])
def test_ccsd_from_pyscf_mf_matches_pyscf(mf, frozen):
    mycc = tessera.CCSD(mf, frozen=frozen, conv_tol=1e-10).run()
    e_t = mycc.ccsd_t()
    ref, ref_t = pyscf_ccsd(mf, frozen)
    assert mycc.converged
    assert abs(mycc.e_corr - ref.e_corr) < 1e-8
    assert abs(mycc.e_tot - ref.e_tot) < 1e-8
    assert abs(e_t - ref_t) < 1e-8
    assert mycc.t1.shape == ref.t1.shape and mycc.t2.shape == ref.t2.shape
    assert np.abs(mycc.t1 - ref.t1).max() < 1e-6 and np.abs(mycc.t2 - ref.t2).max() < 1e-6


@pytest.mark.parametrize("atom, symmetry", [
    ("N 0 0 0; N 0 0 1.1", True),                       # Dooh: PySCF's linear irrep ids, used as D2h's
    ([[s, xyz] for s, xyz in WATER_ATOMS], False),      # C1
])
def test_ccsd_from_pyscf_mf_other_groups(atom, symmetry):
    mf = scf.RHF(gto.M(atom=atom, basis="sto-3g", symmetry=symmetry, verbose=0)).run(conv_tol=1e-12)
    mycc = tessera.CCSD(mf, conv_tol=1e-10).run()
    assert abs(mycc.e_corr - pyscf_ccsd(mf)[0].e_corr) < 1e-8
    assert mycc.result.data["point_group"] == ("D2h" if symmetry else "C1")


def test_own_rhf_on_a_pyscf_mole(mf):
    ours = tessera.RHF(water()).run()
    assert ours.converged and abs(ours.e_tot - mf.e_tot) < 1e-9
    assert np.allclose(ours.mo_energy, mf.mo_energy, atol=1e-6)
    assert ours.mo_occ.sum() == 10
    mycc = tessera.CCSD(ours, conv_tol=1e-10).run()         # our RHF feeds our CCSD like a PySCF mf
    assert abs(mycc.e_corr - pyscf_ccsd(mf)[0].e_corr) < 1e-8


def test_job_with_a_pyscf_mole(mf):
    result = Job(RunOptions(water(symmetry=False), method="hf")).kernel()
    assert abs(result.data["energies"]["hf"] - mf.e_tot) < 1e-9
    assert result.data["point_group"] == "C2v"                  # symmetry on, as the options say


@pytest.mark.parametrize("make, needle", [
    (lambda mf: tessera.CCSD(mf, frozen="core"), "frozen"),
    (lambda mf: tessera.CCSD(mf, frozen=99), "frozen=99"),
    (lambda mf: tessera.CCSD(mf, frozen=[0, 1, 2, 3, 4]), "occupied"),
    (lambda mf: tessera.CCSD(mf, backend="mpi-onesided"), "mpiexec"),
    (lambda mf: tessera.CCSD(scf.UHF(mf.mol).run()), "expected a converged PySCF RHF"),
    (lambda mf: tessera.CCSD(mf.to_rks().run()), "Hartree-Fock"),
    (lambda mf: tessera.CCSD(scf.RHF(mf.mol)), "converged"),          # never run
    (lambda mf: tessera.CCSD(mf.mol), "expected a converged PySCF RHF"),
])
def test_pyscf_api_bad_input(mf, make, needle):
    with pytest.raises(InputError, match=needle.replace("(", r"\(")):
        make(mf).run()


def test_unknown_keywords_are_errors(mf):
    with pytest.raises(InputError, match="no option 'conv'"):
        tessera.CCSD(mf).run(conv=1e-9)
    with pytest.raises(InputError, match="no option 'maxiter'"):
        tessera.RHF(mf.mol).run(maxiter=3)


def test_verbose_as_pyscf_names_it(mf, capsys):
    tessera.CCSD(mf, verbose=0).run()
    assert capsys.readouterr().out == ""
    mycc = tessera.CCSD(mf, verbose=4).run()
    out = capsys.readouterr().out
    assert f"E(CCSD) = {mycc.e_tot:.16g}" in out and "cycle = 1 " in out       # PySCF's lines


def test_unconverged_ccsd_is_reported_not_raised(mf):
    mycc = tessera.CCSD(mf, max_cycle=2).run()
    assert not mycc.converged and len(mycc.result.data["iterations"]) == 2
    with pytest.raises(InputError, match="converged"):
        mycc.ccsd_t()


def test_job_with_an_open_shell_mole_is_refused():
    mol = gto.M(atom="O 0 0 0; H 0 0 1", basis="sto-3g", spin=1, verbose=0)
    with pytest.raises(InputError, match="spin 1"):
        Job(RunOptions(mol, method="hf")).kernel()


# ---------------------------------------------------------------- FCIDUMP

@pytest.fixture(scope="module")
def dumped(mf, tmp_path_factory):
    path = tmp_path_factory.mktemp("fcidump") / "water.fcidump"
    fcidump.from_scf(mf, str(path))
    return path


def test_fcidump_from_pyscf_runs_to_pyscf_ccsd_t(mf, dumped, tmp_path, capsys):
    out = tmp_path / "r.json"
    code, _, _ = run(capsys, "run", dumped, "--method", "ccsd(t)", "--json", out)
    assert code == 0
    e = json.loads(out.read_text())["energies"]
    ref, ref_t = pyscf_ccsd(mf)
    assert abs(e["hf"] - mf.e_tot) < 1e-9
    assert abs(e["total"] - (ref.e_tot + ref_t)) < 1e-7


def test_fcidump_of_another_order_and_numbering(mf, tmp_path):
    """Orbitals in a scrambled order with Molpro's 1-based ORBSYM (as Molpro writes them,
    grouped by symmetry): the occupied orbitals are found by their Fock energies."""
    from pyscf import ao2mo
    order = np.argsort(np.asarray(mf.mo_coeff.orbsym), kind="stable")        # by irrep
    coeff = mf.mo_coeff[:, order]
    h1 = coeff.T @ mf.get_hcore() @ coeff
    eri = ao2mo.full(mf.mol, coeff)
    numbers = fcidump.ORBSYM_MAP["C2v"]
    path = tmp_path / "molpro.fcidump"
    fcidump.from_integrals(str(path), h1, eri, h1.shape[0], 10, nuc=mf.mol.energy_nuc(),
                           orbsym=[numbers[g] for g in np.asarray(mf.mo_coeff.orbsym)[order]])
    ref = read_fcidump(path)
    assert abs(ref.e_hf - mf.e_tot) < 1e-9
    assert np.allclose(np.sort(ref.mo_energy), mf.mo_energy, atol=1e-7)
    e = Job(RunOptions(str(path), method="ccsd")).kernel().data["energies"]
    assert abs(e["ccsd_correlation"] - pyscf_ccsd(mf)[0].e_corr) < 1e-7


def test_fcidump_out_and_molden(mf, tmp_path, capsys):
    xyz = tmp_path / "water.xyz"
    xyz.write_text(WATER_XYZ)
    dump, orbitals = tmp_path / "out.fcidump", tmp_path / "out.molden"
    code, out, _ = run(capsys, "run", xyz, "--basis", "6-31g", "--method", "hf", "--fcidump-out", dump,
                       "--molden", orbitals)
    assert code == 0
    back = read_fcidump(dump)
    assert abs(back.e_hf - mf.e_tot) < 1e-9 and back.nmo == 13
    assert np.allclose(back.mo_energy, mf.mo_energy, atol=1e-7)
    mol, energies, coeff, occ, irreps, _ = molden.load(str(orbitals))
    assert np.allclose(energies, mf.mo_energy, atol=1e-7) and occ.sum() == 10 and coeff.shape == (13, 13)
    assert "A1" in irreps


def test_fcidump_rejects(tmp_path, mf, capsys):
    garbage = tmp_path / "bad.fcidump"
    garbage.write_text("&FCI NORB=2, NELEC=2\n&END\n x y z\n")
    one_line_error(*run(capsys, "run", garbage)[::2], "cannot be read")
    # orbitals that are not canonical: rotate two occupied orbitals into each other
    c = mf.mo_coeff.copy()
    c[:, [1, 2]] = c[:, [1, 2]] @ np.array([[0.8, -0.6], [0.6, 0.8]])
    rotated = tmp_path / "rotated.fcidump"
    fcidump.from_mo(mf.mol, str(rotated), c, orbsym=[0] * 13)
    one_line_error(*run(capsys, "run", rotated)[::2], "not canonical")
    zeros = tmp_path / "zeros.fcidump"
    zeros.write_text("&FCI NORB=2,NELEC=2,MS2=0,\n ORBSYM=1,1,\n ISYM=1,\n&END\n")
    one_line_error(*run(capsys, "run", zeros)[::2], "no gap")
    good = tmp_path / "good.fcidump"
    fcidump.from_scf(mf, str(good))
    for flag in ("--qcschema", "--molden"):
        one_line_error(*run(capsys, "run", good, flag, tmp_path / "x")[::2], flag)
    one_line_error(*run(capsys, "run", good, "--frozen-core")[::2], "--frozen-core")
    one_line_error(*run(capsys, "run", good, "--units", "bohr")[::2], "--units")
    one_line_error(*run(capsys, "run", good, "--method", "hf", "--fcidump-out", tmp_path / "no" / "x")[::2],
                   "--fcidump-out")


# ---------------------------------------------------------------- QCSchema

def test_qcschema_result_validates_and_round_trips(tmp_path, capsys, mf):
    from qcelemental.models import AtomicResult
    xyz = tmp_path / "water.xyz"
    xyz.write_text(WATER_XYZ)
    out = tmp_path / "water.qcschema.json"
    code, _, _ = run(capsys, "run", xyz, "--basis", "6-31g", "--method", "ccsd(t)", "--qcschema", out)
    assert code == 0
    result = AtomicResult(**json.loads(out.read_text()))          # validates
    p = result.properties
    ref, ref_t = pyscf_ccsd(mf)
    assert abs(p.scf_total_energy - mf.e_tot) < 1e-9
    assert abs(p.ccsd_correlation_energy - ref.e_corr) < 1e-7
    assert abs(p.ccsd_total_energy - ref.e_tot) < 1e-7
    assert abs(p.ccsd_prt_pr_correlation_energy - (ref.e_corr + ref_t)) < 1e-7
    assert abs(p.ccsd_prt_pr_total_energy - (ref.e_tot + ref_t)) < 1e-7
    assert p.return_energy == result.return_result == p.ccsd_prt_pr_total_energy
    assert p.calcinfo_nbasis == 13 and p.calcinfo_nalpha == 5
    assert result.provenance.creator == "Tessera" and result.provenance.version == tessera.__version__
    assert result.model.method == "ccsd(t)" and result.model.basis == "6-31g" and result.success
    bohr = np.array([xyz for _, xyz in WATER_ATOMS]) / 0.52917721092
    assert np.abs(np.asarray(result.molecule.geometry) - bohr).max() < 1e-6
    assert list(result.molecule.symbols) == ["O", "H", "H"]
    # read back in: the same molecule and model, so the same energy
    again = tmp_path / "again.json"
    code, _, _ = run(capsys, "run", out, "--json", again)
    assert code == 0
    data = json.loads(again.read_text())
    assert data["basis"] == "6-31g" and data["method"] == "ccsd(t)"
    assert abs(data["energies"]["total"] - p.return_energy) < 1e-9
    one_line_error(*run(capsys, "run", out, "--method", "hf")[::2], "model.method")
    # (qcelemental rounds geometries to 1e-8 bohr)
    assert np.abs(np.array([a[1] for a in data["molecule"]["atoms"]])
                  - np.array([xyz for _, xyz in WATER_ATOMS])).max() < 1e-8


def test_qcschema_molecule_and_atomic_input(tmp_path, capsys):
    from qcelemental.models import AtomicInput, Molecule
    mol = Molecule(symbols=["O", "H", "H"],
                   geometry=(np.array([xyz for _, xyz in WATER_ATOMS]) / 0.52917721092).ravel())
    e_hf = scf.RHF(water("sto-3g")).run(conv_tol=1e-12).e_tot
    path = tmp_path / "mol.json"
    path.write_text(mol.json())
    out = tmp_path / "r.json"
    assert run(capsys, "run", path, "--basis", "sto-3g", "--method", "hf", "--json", out)[0] == 0
    assert abs(json.loads(out.read_text())["energies"]["hf"] - e_hf) < 1e-9
    inp = tmp_path / "input.json"
    inp.write_text(AtomicInput(molecule=mol, driver="energy", model={"method": "hf", "basis": "sto-3g"}).json())
    assert run(capsys, "run", inp, "--json", out)[0] == 0                # model's basis and method
    data = json.loads(out.read_text())
    assert data["method"] == "hf" and data["basis"] == "sto-3g" and abs(data["energies"]["hf"] - e_hf) < 1e-9
    one_line_error(*run(capsys, "run", inp, "--basis", "cc-pvtz")[::2], "model.basis")
    triplet = tmp_path / "triplet.json"
    triplet.write_text(Molecule(symbols=["O", "O"], geometry=[0, 0, 0, 0, 0, 2.3],
                                molecular_multiplicity=3).json())
    one_line_error(*run(capsys, "run", triplet)[::2], "multiplicity")
    broken = tmp_path / "broken.json"
    broken.write_text('{"symbols": ["O"], "geometry": [0, 0]}')
    one_line_error(*run(capsys, "run", broken)[::2], "not a valid QCSchema")
    tessera_json = tmp_path / "tessera.json"          # our own result JSON is not QCSchema
    tessera_json.write_text(json.dumps({"molecule": {"atoms": [["O", [0, 0, 0]]]}, "energies": {}}))
    one_line_error(*run(capsys, "run", tessera_json)[::2], "not a valid QCSchema")
    notjson = tmp_path / "notjson.json"
    notjson.write_text("{nope")
    one_line_error(*run(capsys, "run", notjson)[::2], "not JSON")


# ---------------------------------------------------------------- geometry forms, version, threads

def test_units_bohr_gives_the_angstrom_result(tmp_path, capsys):
    ang, bohr = tmp_path / "ang.xyz", tmp_path / "bohr.xyz"
    ang.write_text(WATER_XYZ)
    bohr.write_text("3\nwater in bohr\n" + "".join(
        f"{s} {x / 0.52917721092:.10f} {y / 0.52917721092:.10f} {z / 0.52917721092:.10f}\n"
        for s, (x, y, z) in WATER_ATOMS))
    energies = []
    for path, units in ((ang, "angstrom"), (bohr, "bohr")):
        out = tmp_path / f"{units}.json"
        assert run(capsys, "run", path, "--units", units, "--basis", "sto-3g", "--method", "hf", "--json", out)[0] == 0
        energies.append(json.loads(out.read_text())["energies"]["hf"])
    assert abs(energies[0] - energies[1]) < 1e-9
    assert abs(energies[0] - scf.RHF(water("sto-3g")).run(conv_tol=1e-12).e_tot) < 1e-9
    one_line_error(*run(capsys, "run", ang, "--units", "parsec")[::2], "parsec")


def test_zmatrix_file_and_text(tmp_path, capsys):
    zmat = "O\nH 1 0.9572\nH 1 0.9572 2 104.52\n"
    mol = gto.M(atom=zmat, basis="sto-3g", verbose=0)             # PySCF reads Z-matrices too
    e_ref = scf.RHF(mol).run(conv_tol=1e-12).e_tot
    path = tmp_path / "water.zmat"
    path.write_text(zmat)
    out = tmp_path / "z.json"
    assert run(capsys, "run", path, "--basis", "sto-3g", "--method", "hf", "--json", out)[0] == 0
    assert abs(json.loads(out.read_text())["energies"]["hf"] - e_ref) < 1e-9
    result = Job(RunOptions(zmat, basis="sto-3g", method="hf")).kernel()
    assert abs(result.data["energies"]["hf"] - e_ref) < 1e-9
    bad = tmp_path / "bad.zmat"
    bad.write_text("O\nH 1 zero\n")
    one_line_error(*run(capsys, "run", bad)[::2], "Z-matrix")


def test_version(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0
    assert capsys.readouterr().out.strip() == f"tessera {metadata.version('tessera')}"


def test_threads(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "2")        # restored after the test (--threads sets it)
    xyz = tmp_path / "water.xyz"
    xyz.write_text(WATER_XYZ)
    out = tmp_path / "t.json"
    code, printed, _ = run(capsys, "run", xyz, "--basis", "sto-3g", "--method", "ccsd", "--threads", "1",
                           "--json", out)
    assert code == 0 and "1 thread(s) per rank" in printed
    assert json.loads(out.read_text())["threads_per_rank"] == 1
    from tessera.backends.local import ThreadsExecutor
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    pool = ThreadsExecutor()
    assert pool.workers == 3 and pool.blas_threads == 1
    pool.close()
    for bad in ("0", "-1", "x"):
        one_line_error(*run(capsys, "run", xyz, "--threads", bad)[::2], "--threads")
    monkeypatch.setenv("OMP_NUM_THREADS", "lots")
    one_line_error(*run(capsys, "run", xyz, "--basis", "sto-3g", "--method", "ccsd")[::2], "OMP_NUM_THREADS")
