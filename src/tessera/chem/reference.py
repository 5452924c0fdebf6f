"""The mean-field reference that correlated methods start from."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


class KeptIntegrals:
    """AO integrals an SCF kept in memory, handed to the transform once: ``take()`` returns
    them (then None) and forgets them, so they are freed as soon as the transform is done
    with them. Never copied to other ranks (pickles empty)."""

    def __init__(self, eri: np.ndarray | None):
        self._eri = eri

    def take(self) -> np.ndarray | None:
        eri, self._eri = self._eri, None
        return eri

    @property
    def nbytes(self) -> int:
        return 0 if self._eri is None else int(self._eri.nbytes)

    def __reduce__(self):
        return KeptIntegrals, (None,)

    def __repr__(self) -> str:
        return f"KeptIntegrals({self.nbytes} bytes)"


@dataclass(frozen=True)
class Reference:
    """A closed-shell RHF reference with orbitals labelled by irrep.

    ``orbsym[p]`` is the irrep of orbital ``p`` as a bit label of the Abelian point group
    (D2h and its subgroups): the product of two irreps is their XOR, as in PySCF's
    ``IRREP_ID`` tables.  ``irrep_names[label]`` names each label in ``point_group``.

    Two kinds: from a molecule (``mol`` set; the transform computes the MO integrals from
    the AO basis and ``mo_coeff``), or from MO integrals alone (an FCIDUMP: ``mol`` None,
    ``mo_coeff`` the identity, ``h1_mo`` and ``eri_mo`` the integrals).
    """

    mol: object                 # pyscf.gto.Mole, built, with the symmetry actually used; None: MO kind
    e_hf: float
    e_nuc: float
    mo_coeff: np.ndarray        # (nao, nmo)
    mo_energy: np.ndarray       # (nmo,)
    orbsym: np.ndarray          # (nmo,) int irrep labels
    nocc: int                   # doubly occupied orbitals
    point_group: str            # the Abelian group used, e.g. "C2v"; "C1" when off
    irrep_names: dict = field(default_factory=dict)
    converged: bool = True
    iterations: int = 0
    source: str = "pyscf"       # which SCF produced it
    info: dict = field(default_factory=dict)   # SCF-specific data (schedules, screening, ...)
    h1_mo: np.ndarray | None = None    # MO kind: core Hamiltonian (nmo, nmo)
    eri_mo: np.ndarray | None = None   # MO kind: (pq|rs), 8-fold packed (pyscf.ao2mo 's8')
    ao_integrals: KeptIntegrals | None = None   # the SCF's 8-fold AO integrals, for the transform

    @property
    def nmo(self) -> int:
        return self.mo_coeff.shape[1]

    @property
    def nvir(self) -> int:
        return self.nmo - self.nocc
