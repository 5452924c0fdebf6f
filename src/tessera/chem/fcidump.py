"""FCIDUMP in and out: integrals from any program, and ours for any program.

``read_fcidump(path)`` makes a :class:`~tessera.chem.reference.Reference` of the MO kind
(no basis, no SCF): the closed-shell determinant of the ``NELEC/2`` orbitals of lowest
Fock energy, which must be canonical (its Fock matrix diagonal to ``CANONICAL_TOL``), as
the orbitals of an RHF are. Parsing is PySCF's (``pyscf.tools.fcidump.read``).

Orbital symmetries (``ORBSYM``) come in two conventions: Molpro's numbering from 1
(written by Molpro, NECI, Block, ..., and by :func:`write_fcidump`) and PySCF's irrep ids
from 0 (``fcidump.from_scf``'s default). A file with a 0 label is read as PySCF's; either
way the label of irrep ``n`` becomes an XOR bit label (Molpro: ``n - 1``; PySCF: its id,
modulo 10 for the linear groups).
"""

from __future__ import annotations

import numpy as np

from tessera.chem.reference import Reference
from tessera.errors import InputError

__all__ = ["is_fcidump", "read_fcidump", "write_fcidump", "CANONICAL_TOL"]

#: Largest off-diagonal Fock element (Eh) accepted as canonical (an SCF converged to a
#: gradient of 1e-5 leaves elements of that size; their energy effect is quadratic).
CANONICAL_TOL = 1e-4
#: Smallest gap (Eh) between the highest occupied and the lowest virtual orbital energy.
GAP_TOL = 1e-6


def is_fcidump(path) -> bool:
    """Whether ``path`` is a readable file whose first word is the FCIDUMP header ``&FCI``."""
    try:
        with open(path, "rb") as f:
            return f.read(64).lstrip().upper().startswith(b"&FCI")
    except (OSError, TypeError, ValueError):
        return False


def read_fcidump(path) -> Reference:
    """The closed-shell reference of the FCIDUMP file ``path`` (see the module docstring)."""
    from pyscf.tools import fcidump

    try:
        data = fcidump.read(str(path), molpro_orbsym=False, verbose=False)
        norb, nelec = int(data["NORB"]), int(data["NELEC"])
        ms2, ecore = int(data.get("MS2", 0)), float(data.get("ECORE", 0.0))
        h1, eri = np.asarray(data["H1"], dtype=float), np.asarray(data["H2"], dtype=float)
        labels = data.get("ORBSYM")
    except Exception as exc:   # PySCF reports a malformed file as whatever its parsing hit
        detail = " ".join(str(exc).split()) or type(exc).__name__
        raise InputError(f"FCIDUMP {str(path)!r} cannot be read ({detail}); expected a header "
                         f"'&FCI NORB=.., NELEC=.., MS2=.., ORBSYM=.. &END' and integral lines: "
                         f"fix the file") from None
    if ms2 != 0 or nelec % 2 or not 0 < nelec < 2 * norb:
        raise InputError(f"FCIDUMP {str(path)!r} has NELEC={nelec}, MS2={ms2} for {norb} orbitals; "
                         f"closed-shell CCSD needs an even NELEC below 2*NORB and MS2=0: "
                         f"dump a closed-shell system")
    if not (np.isfinite(ecore) and np.isfinite(h1).all() and np.isfinite(eri).all()):
        raise InputError(f"FCIDUMP {str(path)!r} holds integrals that are not finite numbers; expected "
                         f"finite values: fix the file")
    orbsym = _xor_labels(labels, norb, path)
    nocc = nelec // 2
    occ, fock = _aufbau(h1, eri, nocc, path)
    energies = np.diag(fock)
    homo, lumo = energies[occ].max(), np.delete(energies, occ).min()
    if not lumo - homo > GAP_TOL:
        raise InputError(f"FCIDUMP {str(path)!r}: no gap between the occupied and virtual orbital energies "
                         f"(highest occupied {homo:.6f} Eh, lowest virtual {lumo:.6f} Eh); CCSD needs a "
                         f"closed-shell reference with a gap: check NELEC and the integrals")
    order = np.concatenate([occ, np.setdiff1d(np.arange(norb), occ)])
    fock = fock[np.ix_(order, order)]
    off = np.abs(fock - np.diag(np.diag(fock))).max() if norb > 1 else 0.0
    if off > CANONICAL_TOL:
        raise InputError(f"FCIDUMP {str(path)!r}: the orbitals are not canonical RHF orbitals (largest "
                         f"off-diagonal Fock element {off:.1e} Eh, expected below {CANONICAL_TOL:g}); "
                         f"Tessera's CCSD needs canonical orbitals: dump the integrals of converged "
                         f"RHF orbitals")
    if not np.array_equal(order, np.arange(norb)):
        h1, eri, orbsym = h1[np.ix_(order, order)], _permute_s8(eri, order), orbsym[order]
    e_hf = ecore + float(np.trace(h1[:nocc, :nocc]) + np.trace(fock[:nocc, :nocc]))
    nirrep_bits = int(orbsym.max()).bit_length() if norb else 0
    return Reference(
        mol=None, e_hf=e_hf, e_nuc=ecore, mo_coeff=np.eye(norb), mo_energy=np.diag(fock).copy(),
        orbsym=orbsym, nocc=nocc, point_group=f"{2 ** nirrep_bits} irreps" if nirrep_bits else "C1",
        irrep_names={g: f"irrep{g + 1}" for g in range(2 ** nirrep_bits)}, source="fcidump",
        info={"file": str(path), "orbital_order": order.tolist()}, h1_mo=h1, eri_mo=eri)


def _xor_labels(labels, norb: int, path) -> np.ndarray:
    if not labels:
        return np.zeros(norb, dtype=int)
    labels = np.asarray(labels, dtype=int)
    if labels.size != norb or labels.min() < 0:
        raise InputError(f"FCIDUMP {str(path)!r}: ORBSYM has {labels.size} labels (smallest "
                         f"{labels.min()}) for NORB={norb}; expected one label >= 0 per orbital: "
                         f"fix ORBSYM")
    xor = labels % 10 if labels.min() == 0 else labels - 1
    if xor.max() > 7:
        raise InputError(f"FCIDUMP {str(path)!r}: ORBSYM label {labels.max()} is not an irrep of "
                         f"D2h or a subgroup (1-8, or PySCF ids 0-7); expected Abelian labels: "
                         f"dump the integrals in D2h or a subgroup")
    return xor


def _pairs(p, q) -> np.ndarray:
    hi, lo = np.maximum(p, q), np.minimum(p, q)
    return hi * (hi + 1) // 2 + lo


def _fock(h1, eri, occ) -> np.ndarray:
    """F_pq = h_pq + sum_k 2 (pq|kk) - (pk|kq) over the doubly occupied ``occ``."""
    n = h1.shape[0]
    p, q = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    pq = _pairs(p, q)
    fock = h1.copy()
    for k in occ:
        kk = k * (k + 1) // 2 + k
        fock += 2 * eri[_pairs(pq, kk)] - eri[_pairs(_pairs(p, k), _pairs(k, q))]
    return fock


def _aufbau(h1, eri, nocc: int, path):
    """The ``nocc`` orbitals of lowest Fock energy, self-consistently (the first ``nocc``
    of the file to start); returns (occupied, Fock matrix)."""
    occ = np.arange(nocc)
    for _ in range(10):
        fock = _fock(h1, eri, occ)
        new = np.sort(np.argsort(np.diag(fock), kind="stable")[:nocc])
        if np.array_equal(new, occ):
            return occ, fock
        occ = new
    raise InputError(f"FCIDUMP {str(path)!r}: the lowest-energy occupation does not settle; "
                     f"expected the integrals of a closed-shell RHF: check NELEC")


def _permute_s8(eri, order) -> np.ndarray:
    """8-fold packed (pq|rs) with orbitals renumbered: new orbital p is old ``order[p]``."""
    n = len(order)
    p, q = np.tril_indices(n)
    old_pair = _pairs(order[p], order[q])                 # new pair PQ -> old pair
    out = np.empty_like(eri)
    for pq in range(len(old_pair)):
        start = pq * (pq + 1) // 2
        out[start:start + pq + 1] = eri[_pairs(old_pair[pq], old_pair[:pq + 1])]
    return out


def write_fcidump(ref: Reference, path) -> None:
    """Write the integrals of every orbital of ``ref`` (Molpro's ORBSYM numbering)."""
    from pyscf.tools import fcidump

    if ref.mol is None:
        orbsym = (np.asarray(ref.orbsym) + 1).tolist()
        fcidump.from_integrals(str(path), ref.h1_mo, ref.eri_mo, ref.nmo, 2 * ref.nocc,
                               nuc=ref.e_nuc, orbsym=orbsym)
        return
    numbers = fcidump.ORBSYM_MAP.get(ref.point_group, (1,))    # Molpro's number of each PySCF id
    orbsym = [numbers[g] for g in np.asarray(ref.orbsym).tolist()]
    fcidump.from_mo(ref.mol, str(path), ref.mo_coeff, orbsym=list(orbsym))
