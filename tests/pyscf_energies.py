"""PySCF reference energies the tests compare with: RHF converged to 1e-11, CCSD to 1e-10,
on one OpenMP thread (small molecules: PySCF's threads spin against the other processes
of a busy machine; tests/test_ccsd.py's references took 31-57 s on 2 threads, 10-15 s on
one, at load 4-5)."""

from pyscf import cc, lib, scf


def rhf(mol):
    """PySCF's RHF of ``mol`` (conv_tol 1e-11)."""
    mf = scf.RHF(mol)
    mf.conv_tol = 1e-11
    with lib.with_omp_threads(1):
        mf.kernel()
    return mf


def ccsd_t_energies(mf, frozen: int = 0) -> tuple:
    """(E_HF, E_corr of CCSD, E(T)) from PySCF on ``mf`` with ``frozen`` core orbitals."""
    mycc = cc.CCSD(mf, frozen=frozen or None)
    mycc.conv_tol = 1e-10
    with lib.with_omp_threads(1):
        mycc.kernel()
        return mf.e_tot, mycc.e_corr, mycc.ccsd_t()
