"""Tessera's own distributed closed-shell Hartree-Fock.

``rhf(mol, *, schedule="steal", screening=1e-12, mode="direct", conv_tol=1e-10,
max_iter=100, world=None) -> Reference``: Roothaan-Hall SCF with DIIS whose two-electron
Fock build is a GTFock-style distributed computation (Liu, Patel, Chow, IPDPS 2014):
shell-block tasks with Schwarz screening and 8-fold integral symmetry, density and Fock
matrices in GlobalArrays, static / NXTVAL / work-stealing schedules.  See docs/scf.md.

Modules: ``blocking`` (shell blocks), ``integrals`` (libcint block quartets, Schwarz
bounds), ``tasks`` (task list, screening, static partition), ``kernel`` (J/K of one block
quartet), ``schedule`` (who runs which task), ``fock`` (the distributed build),
``symmetry`` (symmetry-adapted orbitals, irrep labels), ``stats``, ``driver`` (the SCF).
"""

from tessera.chem.scf.driver import rhf

__all__ = ["rhf"]
