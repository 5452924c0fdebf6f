"""What a run starts from: the ``geometry`` of ``RunOptions``, in any of its forms.

- an XYZ file or XYZ text (``units``: angstrom or bohr);
- a Z-matrix file (``.zmat``) or text (first line a lone element symbol), read by PySCF;
- a QCSchema molecule or AtomicInput JSON file (``chem/qcschema.py``);
- an FCIDUMP file (``chem/fcidump.py``): integrals, no molecule and no SCF;
- a built ``pyscf.gto.Mole``: used as it is (its own basis and charge), with the point
  group reduced to an Abelian one when symmetry is on.
"""

from __future__ import annotations

import os
import re
import warnings
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from tessera.chem.molecule import _CONTINUOUS_SUBGROUP, ABELIAN_GROUPS, BOHR_IN_ANGSTROM, Molecule, _units
from tessera.errors import InputError

__all__ = ["Source", "load", "with_model"]


@dataclass
class Source:
    mol: object | None                 # built pyscf.gto.Mole with the symmetry used; None for FCIDUMP
    molecule: dict                     # atoms (Å), charge, point_group_full: for reports and JSON
    basis: str
    reference: object = None           # a Reference given by the input (FCIDUMP), else None
    model: dict = field(default_factory=dict)   # an AtomicInput's method and basis


def load(geometry, *, basis: str, charge: int, units: str = "angstrom", symmetry: bool = True) -> Source:
    """The :class:`Source` of ``geometry`` (see the module docstring)."""
    unit = _units(units)
    if hasattr(geometry, "atom_coords") and hasattr(geometry, "nelectron"):
        return _from_mole(geometry, symmetry)
    if not isinstance(geometry, (str, os.PathLike)):
        raise InputError(f"geometry is a {type(geometry).__name__}; expected a file path, XYZ or "
                         f"Z-matrix text, or a pyscf.gto.Mole: pass one of those")
    text_given = isinstance(geometry, str) and "\n" in geometry
    model: dict = {}
    if not text_given:
        from tessera.chem.fcidump import is_fcidump, read_fcidump
        from tessera.chem.qcschema import is_qcschema, read_qcschema
        if is_fcidump(geometry):
            if unit != "angstrom":
                raise InputError("--units does not apply to an FCIDUMP (it has no geometry): drop --units")
            ref = read_fcidump(geometry)
            return Source(None, {"atoms": [], "charge": charge, "point_group_full": ref.point_group},
                          "(FCIDUMP)", reference=ref)
        if is_qcschema(geometry):
            if unit != "angstrom":
                raise InputError("--units does not apply to QCSchema (its geometry is in bohr): drop --units")
            molecule, model = read_qcschema(geometry, charge=charge, basis=basis)
        elif Path(geometry).suffix.lower() == ".zmat" or _looks_like_zmatrix(_peek(geometry)):
            molecule = _from_zmatrix(Path(geometry).read_text(encoding="utf-8-sig"), str(geometry),
                                     charge, basis, unit)
        else:
            molecule = Molecule.from_xyz(geometry, charge=charge, basis=basis, units=unit)
    elif _looks_like_zmatrix(geometry):
        molecule = _from_zmatrix(geometry, "the Z-matrix text", charge, basis, unit)
    else:
        molecule = Molecule.from_xyz(geometry, charge=charge, basis=basis, units=unit)
    molecule.check_closed_shell()
    mol = molecule.to_pyscf(symmetry=symmetry)
    # with symmetry on, the Mole just built knows the full group: no second PySCF build
    info = {"atoms": [[s, list(xyz)] for s, xyz in molecule.atoms], "charge": molecule.charge,
            "point_group_full": mol.topgroup if symmetry else molecule.point_group_full}
    return Source(mol, info, molecule.basis, model=model)


def with_model(options, model: dict):
    """``options`` with an AtomicInput's method and basis; an option set to another value
    than its default and the input's is an error."""
    defaults = {f.name: f.default for f in fields(options)}
    changes = {}
    for key, value in model.items():
        mine = getattr(options, key)
        if str(mine).lower() == str(value).lower():
            continue
        if mine != defaults[key]:
            raise InputError(f"--{key} {mine} disagrees with the AtomicInput's model.{key} {value}; "
                             f"expected one {key}: drop --{key} or fix the input")
        changes[key] = value
    return replace(options, **changes) if changes else options


def _peek(path) -> str:
    try:
        with open(path, encoding="utf-8-sig") as f:
            return f.readline() + "\n"
    except (OSError, UnicodeDecodeError):
        return ""                   # the XYZ reader reports it


def _looks_like_zmatrix(text: str) -> bool:
    """A Z-matrix starts with a lone element symbol (an XYZ file with its atom count)."""
    first = text.lstrip("\ufeff").strip().splitlines()[0].strip() if text.strip() else ""
    return re.fullmatch(r"[A-Za-z]{1,2}\d*", first) is not None


def _from_zmatrix(text: str, source: str, charge: int, basis: str, unit: str) -> Molecule:
    from pyscf.gto.mole import from_zmatrix

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            atoms = from_zmatrix(text.lstrip("\ufeff"))
    except Exception as exc:   # PySCF's parser reports a bad line as whatever it hit
        detail = " ".join(str(exc).split()) or type(exc).__name__
        raise InputError(f"{source} is not a Z-matrix PySCF can read ({detail}); expected lines "
                         f"'Symbol', 'Symbol i r', 'Symbol i r j angle', 'Symbol i r j angle k "
                         f"dihedral': fix the Z-matrix") from None
    scale = BOHR_IN_ANGSTROM if unit == "bohr" else 1.0
    return Molecule(atoms=tuple((re.sub(r"\d+$", "", s), tuple(float(c) * scale for c in xyz))
                                for s, xyz in atoms), charge=charge, basis=basis)


def _from_mole(mol, symmetry: bool) -> Source:
    """A user's built Mole, copied and rebuilt only when its symmetry must change."""
    if getattr(mol, "_built", False) is False or mol.natm == 0:
        raise InputError("the pyscf.gto.Mole is not built; expected a built molecule: call mol.build() first")
    if mol.nelectron % 2 or mol.spin != 0:
        raise InputError(f"the molecule has {mol.nelectron} electrons and spin {mol.spin}; closed-shell "
                         f"methods need an even number and spin 0: change its charge or spin")
    ready = (mol.groupname in ABELIAN_GROUPS) if symmetry and mol.symmetry else not (symmetry or mol.symmetry)
    if not ready:
        mol = mol.copy()
        mol.verbose, mol.output = 0, None
        mol.symmetry = (mol.symmetry or True) if symmetry else False
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mol.build()
            if symmetry and mol.groupname in _CONTINUOUS_SUBGROUP:
                mol.symmetry_subgroup = _CONTINUOUS_SUBGROUP[mol.groupname]
                mol.build()
        if symmetry and mol.groupname not in ABELIAN_GROUPS:
            raise InputError(f"PySCF chose point group {mol.groupname}, which has no XOR irrep labels; "
                             f"expected D2h or a subgroup: set mol.symmetry_subgroup or symmetry off")
    coords = mol.atom_coords() * BOHR_IN_ANGSTROM
    info = {"atoms": [[mol.atom_pure_symbol(i), coords[i].tolist()] for i in range(mol.natm)],
            "charge": int(mol.charge), "point_group_full": mol.topgroup if mol.symmetry else "C1"}
    return Source(mol, info, mol.basis if isinstance(mol.basis, str) else "(custom)")
