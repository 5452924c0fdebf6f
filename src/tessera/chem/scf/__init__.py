"""Tessera's own distributed closed-shell Hartree-Fock.

``rhf(mol, *, schedule="steal", screening=1e-12, mode="auto", conv_tol=1e-10,
max_iter=100, context=None) -> Reference``: Roothaan-Hall SCF with DIIS whose two-electron
Fock build is a GTFock-style task set (Liu, Patel, Chow, IPDPS 2014): shell-block tasks
with Schwarz screening and 8-fold integral symmetry, density and Fock matrices as
BlockTensors of the context (distributed under MPI), static / NXTVAL / work-stealing
schedules of the engine (``backends.schedule``).  See docs/scf.md.

Modules: ``blocking`` (shell blocks), ``integrals`` (libcint block quartets, Schwarz
bounds), ``tasks`` (task list, screening, costs), ``kernel`` (J/K of one block quartet),
``fock`` (the build as a task set), ``direct`` (direct builds from the symmetry-unique
shell quartets),
``symmetry`` (symmetry-adapted orbitals, irrep labels), ``stats``, ``driver`` (the SCF).
"""

from tessera.chem.scf.driver import rhf

__all__ = ["rhf"]
