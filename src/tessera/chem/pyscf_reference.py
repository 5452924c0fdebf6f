"""A closed-shell RHF reference computed by PySCF, with orbitals labelled by irrep.

This is the trusted reference that Tessera's own SCF is checked against, and a quick way
to get orbitals for the correlated methods.  With a symmetric molecule PySCF's
symmetry-adapted RHF is used, so every orbital has one irrep of the Abelian group (an
XOR-able bit label from ``pyscf.symm.param.IRREP_ID_TABLE``). PySCF's in-memory AO
integrals, when its RHF kept them, go with the reference to the transform
(``Reference.ao_integrals``), which then does not compute them again.
"""

from __future__ import annotations

import numpy as np

from tessera.chem.molecule import ABELIAN_GROUPS, Molecule
from tessera.chem.reference import KeptIntegrals, Reference
from tessera.chem.scf.incore import s8_bytes
from tessera.errors import ConvergenceError, InputError

__all__ = ["rhf_reference"]


def rhf_reference(mol, conv_tol: float = 1e-11, *, conv_tol_grad: float = 1e-7,
                  max_cycle: int = 100) -> Reference:
    """Run PySCF's RHF on ``mol`` and return a converged :class:`Reference`.

    ``mol`` is a :class:`~tessera.chem.molecule.Molecule` (built with symmetry) or a built
    ``pyscf.gto.Mole`` whose group is D2h or a subgroup (or symmetry off).  Converges to
    ``conv_tol`` in the energy and ``conv_tol_grad`` in the orbital gradient.

    Raises ``InputError`` for an odd electron count or a non-zero spin, and
    ``ConvergenceError`` (carrying the unconverged Reference as ``result``) when the SCF
    does not converge within ``max_cycle`` iterations.
    """
    from pyscf import scf

    if isinstance(mol, Molecule):
        mol.check_closed_shell()
        mol = mol.to_pyscf(symmetry=True)
    _check_pyscf_mol(mol)
    if not (conv_tol > 0 and conv_tol_grad > 0):
        raise InputError(
            f"conv_tol {conv_tol!r} and conv_tol_grad {conv_tol_grad!r} must be positive; "
            f"expected e.g. 1e-11 and 1e-7: fix the tolerances")
    if isinstance(max_cycle, bool) or not isinstance(max_cycle, int) or max_cycle < 1:
        raise InputError(
            f"max_cycle {max_cycle!r} is not a positive integer; expected e.g. 100: "
            f"fix max_cycle")

    mf = scf.RHF(mol)               # symmetry-adapted when mol.symmetry
    mf.verbose = 0                  # library code does not print
    mf.conv_tol = conv_tol
    mf.conv_tol_grad = conv_tol_grad
    mf.max_cycle = max_cycle
    e_hf = float(mf.kernel())

    mo_coeff = np.array(mf.mo_coeff, dtype=float)     # drops PySCF's orbsym tag
    if mol.symmetry:
        from pyscf.scf import hf_symm     # also for C1, where RHF(mol) is not symmetry-adapted
        orbsym = np.asarray(hf_symm.get_orbsym(mol, mf.mo_coeff), dtype=int)
        point_group = mol.groupname
        irrep_names = _irrep_names(mol)
    else:
        orbsym = np.zeros(mo_coeff.shape[1], dtype=int)
        point_group = "C1"
        irrep_names = {0: "A"}
    iterations = int(getattr(mf, "cycles", 0) or 0)
    # PySCF's in-memory 8-fold AO integrals (``mf._eri``, when they fitted mol.max_memory),
    # handed to the transform as Tessera's SCF hands its own: not computed a second time
    eri = getattr(mf, "_eri", None)
    if eri is not None and eri.nbytes != s8_bytes(mol.nao):
        eri = None
    reference = Reference(
        mol=mol,
        e_hf=e_hf,
        e_nuc=float(mol.energy_nuc()),
        mo_coeff=mo_coeff,
        mo_energy=np.array(mf.mo_energy, dtype=float),
        orbsym=orbsym,
        nocc=mol.nelectron // 2,
        point_group=point_group,
        irrep_names=irrep_names,
        converged=bool(mf.converged),
        iterations=iterations,
        source="pyscf",
        ao_integrals=None if eri is None else KeptIntegrals(eri),
        info={
            "point_group_full": mol.topgroup if mol.symmetry else "C1",
            "conv_tol": conv_tol,
            "conv_tol_grad": conv_tol_grad,
            "max_cycle": max_cycle,
            "mo_occ": np.array(mf.mo_occ, dtype=float),
        },
    )
    if not mf.converged:
        raise ConvergenceError(
            f"PySCF RHF did not converge in {max_cycle} iterations (last energy "
            f"{e_hf:.12f} Eh, conv_tol {conv_tol:g}); expected convergence: raise "
            f"--scf-max-iter, or check the geometry and --charge", result=reference)
    return reference


def _check_pyscf_mol(mol) -> None:
    if not hasattr(mol, "nelectron") or not hasattr(mol, "energy_nuc"):
        raise InputError(
            f"rhf_reference got {type(mol).__name__}; expected a tessera Molecule or a "
            f"pyscf.gto.Mole: pass one of those")
    if getattr(mol, "_built", True) is False:
        raise InputError("the pyscf.gto.Mole is not built; expected a built molecule: "
                         "call mol.build() first")
    if mol.nelectron % 2:
        raise InputError(
            f"the molecule has {mol.nelectron} electrons (charge {mol.charge}); "
            f"closed-shell methods need an even number: change --charge")
    if mol.spin != 0:
        raise InputError(
            f"the molecule has spin {mol.spin} (2S); closed-shell RHF needs spin 0: "
            f"set spin to 0")
    if mol.symmetry and mol.groupname not in ABELIAN_GROUPS:
        raise InputError(
            f"point group {mol.groupname} has no XOR irrep labels; expected D2h or a "
            f"subgroup: build the molecule with Molecule.to_pyscf() or set "
            f"mol.symmetry_subgroup (e.g. 'D2h' for Dooh, 'C2v' for Coov)")


def _irrep_names(mol) -> dict[int, str]:
    """{bit label: name} for every irrep of the group, checked against ``mol``'s own."""
    from pyscf.symm import param

    names = {label: name for name, label in param.IRREP_ID_TABLE[mol.groupname].items()}
    for label, name in zip(mol.irrep_id, mol.irrep_name):
        if names.get(int(label)) != name:
            raise InputError(
                f"irrep {name} of {mol.groupname} has id {label}, which is not PySCF's "
                f"bit label {names}; expected D2h-subgroup labels: build the molecule "
                f"with Molecule.to_pyscf()")
    return names
