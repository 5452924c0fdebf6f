"""The files a run writes besides its JSON: QCSchema AtomicResult, FCIDUMP, Molden."""

from __future__ import annotations

import numpy as np

from tessera.errors import InputError

__all__ = ["write_outputs", "write_molden", "check_outputs"]


def check_outputs(source_is_fcidump: bool, *, qcschema=None, molden=None) -> None:
    """Refuse, before any work, an output the input cannot give."""
    for flag, value in (("--qcschema", qcschema), ("--molden", molden)):
        if value and source_is_fcidump:
            raise InputError(f"{flag} needs a molecule (atoms and a basis); an FCIDUMP has none: "
                             f"drop {flag}")


def write_molden(ref, path) -> None:
    """The orbitals of ``ref`` (energies, occupations, irreps) in Molden format."""
    from pyscf.tools import molden

    if ref.mol is None:
        raise InputError("--molden needs a molecule (atoms and a basis); an FCIDUMP has none: drop --molden")
    occ = np.where(np.arange(ref.nmo) < ref.nocc, 2.0, 0.0)
    names = [ref.irrep_names.get(int(g), str(g)) for g in ref.orbsym]
    molden.from_mo(ref.mol, str(path), ref.mo_coeff, symm=names, ene=ref.mo_energy, occ=occ)


def write_outputs(result, *, qcschema=None, fcidump=None, molden=None) -> None:
    """Write the files asked for (paths or None) from a JobResult."""
    from tessera.chem.fcidump import write_fcidump
    from tessera.chem.qcschema import write_atomic_result

    for flag, path, write in (("--qcschema", qcschema, lambda p: write_atomic_result(result.data, p)),
                              ("--fcidump-out", fcidump, lambda p: write_fcidump(result.reference, p)),
                              ("--molden", molden, lambda p: write_molden(result.reference, p))):
        if not path:
            continue
        try:
            write(path)
        except OSError as err:
            raise InputError(f"cannot write {flag} {path}: {err.strerror or err}") from None
