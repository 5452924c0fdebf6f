"""Symmetry-adapted diagonalisation of the Fock matrix and irrep labels.

The point group is the Abelian group PySCF built the molecule with (D2h or a subgroup;
``mol.groupname``).  ``mol.symm_orb`` holds, per irrep, the symmetry-adapted linear
combinations of AOs (SALCs); ``mol.irrep_id`` their bit labels, whose products are XORs.
The Fock and overlap matrices are block diagonal in the SALC basis; each block is
diagonalised on its own, and every orbital carries the label of its block, so labels are
exact even for degenerate orbitals (no numerical symmetry assignment is needed).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.linalg

from tessera.chem.molecule import ABELIAN_GROUPS   # D2h and its subgroups (XOR irreps)
from tessera.errors import InputError


@dataclass(frozen=True)
class SymmetryBasis:
    group: str
    irrep_ids: tuple          # bit label per irrep block
    irrep_names: dict         # label -> name
    salc: tuple               # per irrep: (nao, n_irrep) coefficient matrix

    @property
    def nmo(self) -> int:
        return sum(c.shape[1] for c in self.salc)

    def eigh(self, fock: np.ndarray, ovlp: np.ndarray) -> tuple:
        """Orbital energies (ascending), coefficients (nao, nmo), labels (nmo,)."""
        es, cs, syms = [], [], []
        for label, u in zip(self.irrep_ids, self.salc):
            if u.shape[1] == 0:
                continue
            f = u.T @ fock @ u
            s = u.T @ ovlp @ u
            e, c = scipy.linalg.eigh(0.5 * (f + f.T), 0.5 * (s + s.T))
            es.append(e)
            cs.append(u @ c)
            syms.append(np.full(e.size, label, dtype=np.int64))
        e = np.concatenate(es)
        c = np.hstack(cs)
        sym = np.concatenate(syms)
        order = np.argsort(e, kind="stable")
        return e[order], c[:, order], sym[order]


def symmetry_basis(mol) -> SymmetryBasis:
    """The SALC basis of a built molecule; one identity block (label 0, "A") without
    symmetry."""
    if not getattr(mol, "symmetry", False) or mol.symm_orb is None:
        return SymmetryBasis(group="C1", irrep_ids=(0,), irrep_names={0: "A"},
                             salc=(np.eye(mol.nao),))
    group = mol.groupname
    if group not in ABELIAN_GROUPS:
        raise InputError(
            f"point group {group!r} is not Abelian; Tessera labels orbitals by the irreps "
            f"of D2h and its subgroups {ABELIAN_GROUPS}. Build the molecule with "
            "symmetry='D2h' (or a subgroup, e.g. 'C2v') or symmetry=False")
    ids = tuple(int(i) for i in mol.irrep_id)
    names = {int(i): str(n) for i, n in zip(mol.irrep_id, mol.irrep_name)}
    salc = tuple(np.asarray(c) for c in mol.symm_orb)
    nmo = sum(c.shape[1] for c in salc)
    if nmo != mol.nao:
        raise InputError(f"the symmetry-adapted basis has {nmo} functions for {mol.nao} AOs; "
                         "expected a complete SALC basis (mol.symm_orb) from pyscf")
    return SymmetryBasis(group=group, irrep_ids=ids, irrep_names=names, salc=salc)
