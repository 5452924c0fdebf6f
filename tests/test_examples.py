"""The Python scripts in examples/ run, and print PySCF's energies."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from pyscf import cc, gto, scf

ROOT = Path(__file__).resolve().parents[1]
ATOMS = [["O", (0.0, 0.0, 0.117790)], ["H", (0.0, 0.755453, -0.471161)], ["H", (0.0, -0.755453, -0.471161)]]


@pytest.fixture(scope="module")
def pyscf_energies():
    """{label printed by the examples: PySCF's value} for water 6-31G."""
    mf = scf.RHF(gto.M(atom=ATOMS, basis="6-31g", symmetry=True, verbose=0))
    mf.conv_tol = 1e-12
    mf.kernel()
    out = {"E(RHF)": mf.e_tot, "E(RHF, tessera)": mf.e_tot}
    for frozen, label in ((None, "E(CCSD(T))"), (1, "frozen")):
        m = cc.CCSD(mf, frozen=frozen)
        m.conv_tol, m.conv_tol_normt = 1e-11, 1e-8
        m.kernel()
        out[label] = m.e_tot + m.ccsd_t()
        if frozen:
            out["E(CCSD) correlation"] = m.e_corr
    return out


def printed(script: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / script)], capture_output=True, text=True,
                          timeout=600, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    return {m.group(1).strip(): float(m.group(2))
            for m in re.finditer(r"^(E\(.*?\)(?: correlation)?|E\(RHF, tessera\))\s*=\s*(-?\d+\.\d+)",
                                 proc.stdout, re.M)}


@pytest.mark.parametrize("script, frozen", [("00-simple_ccsd_t.py", False), ("01-from_pyscf_mf.py", True),
                                            ("02-restart.py", False), ("03-fcidump.py", False)])
def test_example_prints_pyscf_energies(pyscf_energies, script, frozen):
    energies = printed(script)
    assert energies, "the example printed no energy"
    for label, value in energies.items():
        expected = pyscf_energies["frozen" if frozen and label == "E(CCSD(T))" else label]
        assert abs(value - expected) < 1e-8, (label, value, expected)


def test_examples_are_listed():
    readme = (ROOT / "examples" / "README.md").read_text()
    for path in (ROOT / "examples").glob("0*"):
        assert path.name in readme


def test_mpi_example_prints_pyscf_energy(pyscf_energies, tmp_path):
    """examples/04-mpi_run.sh over 2 ranks: Tessera's JSON and the QCSchema result hold
    PySCF's CCSD(T) energy."""
    import json
    from mpirun import build_env
    (tmp_path / "examples").symlink_to(ROOT / "examples")       # the script runs from a root
    proc = subprocess.run(["sh", str(ROOT / "examples" / "04-mpi_run.sh")], capture_output=True, text=True,
                          timeout=600, cwd=tmp_path, env={**build_env(), "BIN": str(Path(sys.executable).parent)})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    total = json.loads((tmp_path / "water-mpi.json").read_text())["energies"]["total"]
    assert abs(total - pyscf_energies["E(CCSD(T))"]) < 1e-7
    assert json.loads((tmp_path / "water-mpi.qcschema.json").read_text())["return_result"] == total
