"""FCIDUMP input and QCSchema output over 2 MPI ranks: the same energies as PySCF."""

import json
import sys
from pathlib import Path

import pytest
from pyscf import cc, gto, scf
from pyscf.tools import fcidump

sys.path.insert(0, str(Path(__file__).parent))
from mpirun import run_mpi_raw  # noqa: E402

TESSERA = Path(sys.executable).parent / "tessera"


@pytest.fixture(scope="module")
def water(tmp_path_factory):
    mol = gto.M(atom="O 0 0 0.117790; H 0 0.755453 -0.471161; H 0 -0.755453 -0.471161", basis="6-31g",
                symmetry=True, verbose=0)
    mf = scf.RHF(mol)
    mf.conv_tol = 1e-12
    mf.kernel()
    m = cc.CCSD(mf)
    m.conv_tol, m.conv_tol_normt = 1e-11, 1e-8
    m.kernel()
    path = tmp_path_factory.mktemp("dump") / "water.fcidump"
    fcidump.from_scf(mf, str(path))
    return path, mf.e_tot, m.e_tot + m.ccsd_t()


@pytest.mark.parametrize("backend", ["mpi-onesided", "mpi-collective"])
def test_fcidump_over_two_ranks(water, backend, tmp_path):
    path, e_hf, e_total = water
    out = tmp_path / "r.json"
    run = run_mpi_raw(TESSERA, 2, args=["run", path, "--method", "ccsd(t)", "--backend", backend,
                                        "--threads", "1", "--json", out], timeout=420)
    assert run.returncode == 0, run.describe()
    data = json.loads(out.read_text())
    assert data["ranks"] == 2 and data["threads_per_rank"] == 1
    assert abs(data["energies"]["hf"] - e_hf) < 1e-9
    assert abs(data["energies"]["total"] - e_total) < 1e-7
    assert run.stdout.count("1 thread(s) per rank") == 1


def test_qcschema_over_two_ranks(water, tmp_path):
    from qcelemental.models import AtomicResult
    _, _, e_total = water
    out = tmp_path / "r.qcschema.json"
    run = run_mpi_raw(TESSERA, 2, args=["run", "examples/water.xyz", "--basis", "6-31g", "--method", "ccsd(t)",
                                        "--backend", "mpi-onesided", "--qcschema", out], timeout=420)
    assert run.returncode == 0, run.describe()
    result = AtomicResult(**json.loads(out.read_text()))
    assert abs(result.return_result - e_total) < 1e-7 and result.extras["tessera"]["ranks"] == 2
