"""SCF start-up: the initial guess the memory estimate sizes a run by (no two-electron
integrals). Reference: the occupied orbitals per irrep of PySCF's converged RHF."""

from pathlib import Path

import numpy as np
import pytest
from pyscf import gto, scf
from pyscf.scf import hf_symm

from tessera.chem.scf.driver import guess_orbitals

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _xyz(name):
    return "".join((EXAMPLES / name).read_text().splitlines(True)[2:])


def _occupied_per_irrep(orbsym, nocc):
    labels, counts = np.unique(np.asarray(orbsym)[:nocc], return_counts=True)
    return dict(zip(labels.tolist(), counts.tolist()))


@pytest.mark.parametrize("atoms, basis, group", [
    (_xyz("water.xyz"), "cc-pvdz", "C2v"),
    (_xyz("n2.xyz"), "6-31g", "D2h"),          # the core Hamiltonian alone occupies N2's irreps wrongly
    (_xyz("benzene.xyz"), "sto-3g", "D2h"),    # ... and benzene's, and ethylene's
    (_xyz("hocl.xyz"), "6-31g", "Cs"),
    ("C 0 0 0.667; C 0 0 -0.667; H 0 0.923 1.238; H 0 -0.923 1.238; H 0 0.923 -1.238; "
     "H 0 -0.923 -1.238", "6-31g", "D2h"),      # ethylene
    ("H 0 0 0; I 0 0 1.61", "def2-svp", "C2v"),   # an ECP: the MINAO density's Fock matrix
])
def test_guess_occupies_the_irreps_of_the_converged_rhf(atoms, basis, group):
    ecp = basis if basis == "def2-svp" else None
    mol = gto.M(atom=atoms, basis=basis, ecp=ecp, symmetry=group, verbose=0)
    assert bool(mol.has_ecp()) == (ecp is not None)
    orbsym, nocc, got_group, names = guess_orbitals(mol)
    mf = scf.RHF(mol)
    mf.verbose, mf.conv_tol = 0, 1e-10
    mf.kernel()
    want = hf_symm.get_orbsym(mol, mf.mo_coeff)
    assert (got_group, nocc, len(orbsym)) == (group, mol.nelectron // 2, mol.nao)
    assert _occupied_per_irrep(orbsym, nocc) == _occupied_per_irrep(want, nocc)
    assert set(names) == {int(i) for i in mol.irrep_id}


def test_guess_without_symmetry_is_one_irrep():
    mol = gto.M(atom=_xyz("water.xyz"), basis="sto-3g", verbose=0)
    orbsym, nocc, group, names = guess_orbitals(mol)
    assert (group, nocc, names) == ("C1", 5, {0: "A"})
    assert not np.any(orbsym)
