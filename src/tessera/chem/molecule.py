"""The molecule a calculation runs on: atoms, charge, basis, and its PySCF counterpart.

``Molecule`` is a plain frozen record (coordinates in Ångström).  It reads XYZ files,
counts electrons, and builds the ``pyscf.gto.Mole`` that integrals and the reference
come from, with the point group detected and reduced to its largest Abelian subgroup
(D2h or one of its subgroups), so that every irrep is a bit label and the product of two
irreps is their XOR (PySCF's ``symm.param.IRREP_ID_TABLE``).
"""

from __future__ import annotations

import logging
import math
import os
import re
import warnings
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
from pyscf.data import elements as _elements
from pyscf.lib import param as _param

from tessera.errors import InputError

__all__ = ["Molecule", "ABELIAN_GROUPS", "BOHR_IN_ANGSTROM"]

_log = logging.getLogger(__name__)

#: Å per bohr, the value PySCF uses (so a Bohr file round-trips exactly through PySCF).
BOHR_IN_ANGSTROM = _param.BOHR

#: The Abelian groups whose irreps are XOR-able bit labels: D2h and its subgroups.
ABELIAN_GROUPS = ("D2h", "C2h", "C2v", "D2", "Cs", "Ci", "C2", "C1")

# Continuous groups PySCF keeps unless told otherwise (linear molecules, atoms), and
# the Abelian subgroup we ask for instead.
_CONTINUOUS_SUBGROUP = {"Coov": "C2v", "Dooh": "D2h", "SO3": "D2h"}

_FIXED_GROUP_ORDER = {"C1": 1, "Ci": 2, "Cs": 2, "T": 12, "Td": 24, "Th": 24, "O": 24,
                      "Oh": 48, "I": 60, "Ih": 120}

_UNITS = {"angstrom": "angstrom", "ang": "angstrom", "a": "angstrom",
          "bohr": "bohr", "au": "bohr", "a.u.": "bohr"}

_BASIS_SUGGESTION = "cc-pvdz, sto-3g, 6-31g or def2-svp"

# symbol (upper case) -> (normalized symbol, atomic number); PySCF's element table,
# without its ghost/dummy entry 'X' (Z = 0).
_ELEMENTS = {sym.upper(): (sym, z) for z, sym in enumerate(_elements.ELEMENTS) if z > 0}


def _element(token: str, where: str) -> str:
    """Normalize an element symbol ('o', 'CL') or atomic number ('8') to 'O', 'Cl'."""
    if token.isdigit():
        z = int(token)
        if 1 <= z < len(_elements.ELEMENTS):
            return _elements.ELEMENTS[z]
        raise InputError(
            f"{where}: {token!r} is not an atomic number; expected 1 to "
            f"{len(_elements.ELEMENTS) - 1} or a symbol such as O or H: fix the atom line")
    entry = _ELEMENTS.get(token.upper())
    if entry is None:
        raise InputError(
            f"{where}: {token!r} is not a chemical element; expected a symbol such as "
            f"O or H: fix the atom line")
    return entry[0]


def _finite_float(token: str, where: str, axis: str) -> float:
    try:
        value = float(token)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise InputError(
            f"{where}: {axis} coordinate {token!r} is not a number; expected a finite "
            f"decimal number such as -0.4712: fix the atom line")
    return value


def _units(units: str) -> str:
    key = str(units).strip().lower()
    if key not in _UNITS:
        raise InputError(
            f"units {units!r} are not known; expected 'angstrom' or 'bohr': "
            f"pass one of those")
    return _UNITS[key]


@dataclass(frozen=True)
class Molecule:
    """Atoms (symbol, (x, y, z) in Ångström), total charge, basis name and a title."""

    atoms: tuple[tuple[str, tuple[float, float, float]], ...]
    charge: int = 0
    basis: str = "cc-pvdz"
    title: str = ""

    def __post_init__(self):
        try:
            entries = list(self.atoms)
        except TypeError:
            raise InputError(
                f"atoms must be a sequence of (symbol, (x, y, z)) pairs, got "
                f"{type(self.atoms).__name__}: pass e.g. (('H', (0, 0, 0)), ('H', (0, 0, 0.74)))"
            ) from None
        if not entries:
            raise InputError("the molecule has no atoms; expected at least one: "
                             "give one (symbol, (x, y, z)) pair per atom")
        atoms = []
        for k, entry in enumerate(entries, start=1):
            where = f"atom {k}"
            try:
                symbol, xyz = entry
                xyz = tuple(xyz)
            except (TypeError, ValueError):
                raise InputError(
                    f"{where}: {entry!r} is not a (symbol, (x, y, z)) pair; expected e.g. "
                    f"('O', (0.0, 0.0, 0.1178)): fix that atom") from None
            if len(xyz) != 3:
                raise InputError(
                    f"{where}: {len(xyz)} coordinates given; expected 3 (x, y, z in Å): "
                    f"fix that atom")
            symbol = _element(str(symbol).strip(), where)
            coords = tuple(_finite_float(str(v), where, axis) for v, axis in zip(xyz, "xyz"))
            atoms.append((symbol, coords))
        object.__setattr__(self, "atoms", tuple(atoms))
        _check_distinct_positions(atoms)

        if isinstance(self.charge, bool) or not isinstance(self.charge, int):
            try:
                charge = int(self.charge)
                ok = charge == self.charge and not isinstance(self.charge, bool)
            except (TypeError, ValueError):
                ok = False
            if not ok:
                raise InputError(
                    f"charge {self.charge!r} is not an integer; expected a whole number "
                    f"such as 0, 1 or -1: fix --charge")
            object.__setattr__(self, "charge", charge)
        if self.nelectron < 0:
            raise InputError(
                f"charge {self.charge} leaves {self.nelectron} electrons "
                f"({self.nuclear_charge} protons); expected a charge of at most "
                f"{self.nuclear_charge}: fix --charge")
        if not isinstance(self.basis, str) or not self.basis.strip():
            raise InputError(
                f"basis {self.basis!r} is not a basis-set name; expected a name such as "
                f"{_BASIS_SUGGESTION}: fix --basis")
        object.__setattr__(self, "basis", self.basis.strip())
        object.__setattr__(self, "title", str(self.title))

    # ------------------------------------------------------------------ reading

    @classmethod
    def from_xyz(cls, path_or_text, *, charge: int = 0, basis: str = "cc-pvdz",
                 units: str = "angstrom") -> "Molecule":
        """Read a standard XYZ file, or XYZ text if the argument contains a newline.

        Format: the atom count, a comment line (kept as ``title``), then one
        ``Symbol x y z`` line per atom.  Symbols are matched case-insensitively ('cl'
        gives 'Cl'); atomic numbers are accepted too.  Blank lines at the end are
        ignored.  ``units='bohr'`` converts the coordinates to Ångström.
        """
        unit = _units(units)
        if isinstance(path_or_text, str) and "\n" in path_or_text:
            text, source = path_or_text, "the XYZ text"
        elif isinstance(path_or_text, (str, os.PathLike)):
            text, source = _read_text(Path(path_or_text)), str(path_or_text)
        else:
            raise InputError(
                f"from_xyz got {type(path_or_text).__name__}; expected a file path or "
                f"XYZ text (a string with newlines): pass one of those")
        atoms, title = _parse_xyz(text, source)
        if unit == "bohr":
            atoms = [(s, tuple(v * BOHR_IN_ANGSTROM for v in xyz)) for s, xyz in atoms]
        return cls(atoms=tuple(atoms), charge=charge, basis=basis, title=title)

    # ------------------------------------------------------------------ electrons

    @property
    def nuclear_charge(self) -> int:
        """Sum of the atomic numbers."""
        return sum(_elements.charge(symbol) for symbol, _ in self.atoms)

    @property
    def nelectron(self) -> int:
        """Number of electrons: nuclear charge minus the total charge."""
        return self.nuclear_charge - self.charge

    def check_closed_shell(self) -> None:
        """Raise ``InputError`` unless the electron count is even (closed-shell methods)."""
        if self.nelectron % 2:
            raise InputError(
                f"{self._name()} has {self.nelectron} electrons (charge {self.charge}); "
                f"closed-shell methods need an even number: change --charge")

    def _name(self) -> str:
        """The formula in order of first appearance, e.g. 'OH2', for messages."""
        counts: dict[str, int] = {}
        for symbol, _ in self.atoms:
            counts[symbol] = counts.get(symbol, 0) + 1
        return "".join(f"{s}{n if n > 1 else ''}" for s, n in counts.items())

    # ------------------------------------------------------------------ PySCF

    def to_pyscf(self, symmetry: bool = True):
        """Build the ``pyscf.gto.Mole`` (verbose 0, no output, spherical functions).

        With ``symmetry`` the point group is detected (``mol.topgroup``, e.g. 'C3v') and
        reduced to its largest Abelian subgroup (``mol.groupname``, D2h or a subgroup;
        linear molecules get C2v or D2h, atoms D2h), so ``mol.irrep_id`` are XOR-able
        bit labels.  The coordinates are then made exactly symmetric (each atom moves by
        less than PySCF's detection tolerance, about 1e-5 bohr), so integrals between
        different irreps vanish to machine precision rather than to the precision of
        the input file.  Without ``symmetry`` the group is C1 and the coordinates are
        used as given.  An odd electron count builds a doublet (spin 1); closed-shell
        methods reject it via :meth:`check_closed_shell`.
        """
        from pyscf import gto

        self._check_basis()
        mol = gto.Mole()
        mol.atom = [[symbol, xyz] for symbol, xyz in self.atoms]
        mol.unit = "Angstrom"
        mol.basis = self.basis
        mol.charge = self.charge
        mol.spin = self.nelectron % 2
        mol.cart = False
        mol.verbose = 0
        mol.output = None
        mol.symmetry = bool(symmetry)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                mol.build()
                if symmetry:
                    subgroup = _CONTINUOUS_SUBGROUP.get(mol.groupname)
                    if subgroup is not None:
                        mol.symmetry_subgroup = subgroup
                        mol.build()
                    if mol.groupname in ABELIAN_GROUPS and mol.groupname != "C1":
                        self._symmetrize(mol)
        except InputError:
            raise
        except Exception as exc:  # PySCF reports geometry problems as plain exceptions
            detail = " ".join(str(exc).split()) or type(exc).__name__
            raise InputError(
                f"PySCF could not build {self._name()} in basis {self.basis}: {detail}; "
                f"expected a valid geometry (no two atoms on the same spot): "
                f"check the coordinates") from None
        if symmetry and mol.groupname not in ABELIAN_GROUPS:
            raise InputError(
                f"{self._name()}: PySCF chose point group {mol.groupname}, which has no "
                f"XOR irrep labels; expected D2h or a subgroup: run without symmetry")
        return mol

    def _symmetrize(self, mol) -> None:
        """Move the atoms of a built ``mol`` onto exactly symmetric positions, rebuild.

        First under the full group (so that whichever mirror plane or axis PySCF picks
        for the Abelian subgroup is exact), then under the Abelian group PySCF uses.
        """
        groups = (mol.topgroup, mol.groupname)
        original = mol.atom_coords()
        charges = mol.atom_charges().astype(float)
        full = _full_group_symmetrized(original, charges, _group_order(mol.topgroup))
        for coords in (full, None):
            if coords is None:
                coords, _ = _symmetrized_coords(mol)
            if np.abs(coords - mol.atom_coords()).max() > 1e-13:
                mol.atom = [[symbol, xyz * BOHR_IN_ANGSTROM]
                            for (symbol, _), xyz in zip(self.atoms, coords)]
                mol.build()
                if (mol.topgroup, mol.groupname) != groups:
                    raise InputError(
                        f"{self._name()}: point group changed from {groups[0]} to "
                        f"{mol.topgroup} when the geometry was symmetrized; expected a "
                        f"geometry that is clearly symmetric or clearly not: run without "
                        f"symmetry or make the coordinates symmetric")
        _, residual = _symmetrized_coords(mol)
        _log.debug("symmetrized %s (%s, used as %s): atoms moved by at most %.2e bohr, "
                   "remaining asymmetry %.2e bohr", self._name(), groups[0], groups[1],
                   np.abs(mol.atom_coords() - original).max(), residual)

    def _check_basis(self) -> None:
        """Load the basis for every element now, so a bad name is an InputError."""
        from pyscf import gto
        from pyscf.lib.exceptions import BasisNotFoundError

        for symbol in dict.fromkeys(s for s, _ in self.atoms):
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    shells = gto.basis.load(self.basis, symbol)
            except BasisNotFoundError as exc:
                if "not found for" in str(exc):
                    raise InputError(
                        f"basis {self.basis!r} has no functions for {symbol}; expected a "
                        f"basis that covers every element of {self._name()}: choose a "
                        f"--basis that includes {symbol}") from None
                raise InputError(
                    f"basis {self.basis!r} is not a basis set PySCF knows; expected a "
                    f"name such as {_BASIS_SUGGESTION}: "
                    f"fix --basis") from None
            except Exception as exc:
                detail = " ".join(str(exc).split())
                raise InputError(
                    f"basis {self.basis!r} could not be loaded for {symbol} ({detail}); "
                    f"expected a name such as {_BASIS_SUGGESTION}: "
                    f"fix --basis") from None
            if not shells:
                raise InputError(
                    f"basis {self.basis!r} has no functions for {symbol}; expected a "
                    f"basis that covers every element of {self._name()}: choose a "
                    f"--basis that includes {symbol}")

    @cached_property
    def _symmetry_mol(self):
        return self.to_pyscf(symmetry=True)

    @property
    def point_group_full(self) -> str:
        """The full point group PySCF detects, e.g. 'C3v', 'D6h', 'Coov'."""
        return self._symmetry_mol.topgroup

    @property
    def point_group(self) -> str:
        """The Abelian subgroup used for irrep labels, e.g. 'Cs' for C3v, 'D2h' for D6h."""
        return self._symmetry_mol.groupname


#: Atoms closer than this (Å) are taken as a mistake in the input.
MIN_ATOM_DISTANCE = 0.1


def _check_distinct_positions(atoms) -> None:
    xyz = np.array([c for _, c in atoms], dtype=float)
    distance = np.linalg.norm(xyz[:, None, :] - xyz[None, :, :], axis=2)
    distance[np.diag_indices(len(xyz))] = np.inf
    i, j = np.unravel_index(np.argmin(distance), distance.shape)
    if distance[i, j] < MIN_ATOM_DISTANCE:
        i, j = sorted((int(i), int(j)))
        raise InputError(
            f"atoms {i + 1} ({atoms[i][0]}) and {j + 1} ({atoms[j][0]}) are "
            f"{distance[i, j]:.3f} Å apart; expected atoms at least {MIN_ATOM_DISTANCE} Å "
            f"apart: fix the coordinates (are they in bohr? XYZ coordinates are read in Ångström)")


def _group_order(name: str) -> int | None:
    """Number of operations of a finite point group named as PySCF names it."""
    if name in _FIXED_GROUP_ORDER:
        return _FIXED_GROUP_ORDER[name]
    match = re.fullmatch(r"([CDS])(\d+)([hvd]?)", name)
    if match is None:
        return None                                    # Coov, Dooh, SO3: infinite
    kind, n, suffix = match.group(1), int(match.group(2)), match.group(3)
    if kind == "S":
        return n
    if kind == "C":
        return 2 * n if suffix else n
    return 4 * n if suffix else 2 * n


def _polar(matrix):
    """The orthogonal matrix nearest to ``matrix``."""
    u, _, vt = np.linalg.svd(matrix)
    return u @ vt


def _full_group_symmetrized(coords, charges, order, tol=1e-3):
    """Coordinates (bohr) made exactly symmetric under the full point group, or None.

    The operations are found from the geometry itself: orthogonal maps (about the
    centre of nuclear charge) that send every atom onto an atom of the same element
    within ``tol`` bohr.  Found from slightly asymmetric positions they are a group only
    approximately; Kazhdan's averaging Q_g <- polar(mean_h Q_gh Q_h^T) makes them an
    exact representation (the error squares at each pass).  The geometry is then
    averaged over the group.  None when the molecule is linear or a single atom, or
    when the operations found do not number ``order`` (then only the Abelian
    symmetrization is applied).
    """
    if order is None or order == 1:
        return None
    center = charges @ coords / charges.sum()
    r = coords - center
    norms = np.linalg.norm(r, axis=1)
    off = np.flatnonzero(norms > tol)
    if off.size == 0:
        return None
    # reference atoms: a (of the rarest element off the centre) and b, not collinear
    rarest = min(set(charges[off]), key=lambda z: np.count_nonzero(charges[off] == z))
    a = next(i for i in off if charges[i] == rarest)
    cross = np.linalg.norm(np.cross(r[a], r), axis=1)
    b_candidates = [i for i in off if cross[i] > 1e-2 * norms[a] * norms[i]]
    if not b_candidates:
        return None                                    # linear
    b = b_candidates[0]
    source = np.array([r[a], r[b], np.cross(r[a], r[b])])
    ops: list[tuple[np.ndarray, np.ndarray]] = []
    for a2 in np.flatnonzero((charges == charges[a]) & (abs(norms - norms[a]) < tol)):
        for b2 in np.flatnonzero((charges == charges[b]) & (abs(norms - norms[b]) < tol)):
            if abs(r[a2] @ r[b2] - r[a] @ r[b]) > tol * (norms[a] + norms[b]):
                continue
            for sign in (1.0, -1.0):
                target = np.array([r[a2], r[b2], sign * np.cross(r[a2], r[b2])])
                q = _polar(target.T @ source)
                perm = _atom_permutation(r @ q.T, r, charges, tol)
                if perm is not None and not any(np.abs(q - q0).max() < 1e-6 for q0, _ in ops):
                    ops.append((q, perm))
    if len(ops) != order:
        return None
    qs = np.array([q for q, _ in ops])
    table = np.empty((order, order), dtype=int)        # table[g, h] = index of g h
    for g in range(order):
        for h in range(order):
            table[g, h] = int(np.argmin(np.abs(qs - qs[g] @ qs[h]).max(axis=(1, 2))))
            if not np.array_equal(ops[table[g, h]][1], ops[g][1][ops[h][1]]):
                return None                            # not closed: not a group
    for _ in range(4):
        qs = np.array([_polar(sum(qs[table[g, h]] @ qs[h].T for h in range(order)))
                       for g in range(order)])
    symmetric = np.zeros_like(r)
    for q, (_, perm) in zip(qs, ops):
        symmetric[perm] += r @ q.T                     # atom perm[i] receives g(r_i)
    return symmetric / order + center


def _atom_permutation(moved, r, charges, tol):
    """perm[i] = j when ``moved[i]`` lies on atom j of the same element, else None."""
    distance = np.linalg.norm(moved[:, None, :] - r[None, :, :], axis=2)
    distance[charges[:, None] != charges[None, :]] = np.inf
    perm = np.argmin(distance, axis=1)
    if distance[np.arange(len(r)), perm].max() > tol or len(set(perm)) != len(r):
        return None
    return perm


def _symmetrized_coords(mol):
    """Atom coordinates (bohr) made exactly symmetric under ``mol.groupname``.

    In PySCF's symmetry frame (origin ``mol._symm_orig``, axes ``mol._symm_axes``) every
    operation of D2h and its subgroups is a diagonal sign matrix.  Each atom is replaced
    by the average over the group of the operation applied to its image atom, which is
    the projection onto symmetric geometries.  Returns (coordinates, largest shift).
    """
    from pyscf.symm import param

    orig = np.asarray(mol._symm_orig, dtype=float)
    axes = np.asarray(mol._symm_axes, dtype=float)
    coords = mol.atom_coords()                         # bohr, input frame
    frame = (coords - orig) @ axes.T
    symbols = [mol.atom_pure_symbol(i) for i in range(mol.natm)]
    ops = [np.diag(param.D2H_OPS[name]) for name in param.OPERATOR_TABLE[mol.groupname]]
    average = np.zeros_like(frame)
    for signs in ops:
        image = frame * signs
        hits = np.zeros(mol.natm, dtype=int)
        for i in range(mol.natm):
            distance = np.linalg.norm(frame - image[i], axis=1)
            distance[[s != symbols[i] for s in symbols]] = np.inf
            j = int(np.argmin(distance))
            if distance[j] > 1e-3:
                raise InputError(
                    f"atom {i + 1} ({symbols[i]}) has no symmetry image under "
                    f"{mol.groupname} (nearest is {distance[j]:.2e} bohr away); expected a "
                    f"symmetric geometry: run without symmetry")
            average[j] += image[i]                     # atom j gets g(r_i), g = g^-1
            hits[j] += 1
        if np.any(hits != 1):
            raise InputError(
                f"the atoms do not map one-to-one onto each other under {mol.groupname}; "
                f"expected a symmetric geometry: run without symmetry")
    average /= len(ops)
    symmetric = average @ axes + orig
    return symmetric, float(np.abs(symmetric - coords).max())


def _read_text(path: Path) -> str:
    if not path.exists():
        raise InputError(
            f"XYZ file {str(path)!r} does not exist; expected a path to an XYZ file "
            f"(or XYZ text with newlines): check the path")
    if path.is_dir():
        raise InputError(
            f"{str(path)!r} is a directory; expected an XYZ file: give the file's path")
    try:
        return path.read_text(encoding="utf-8-sig")     # a byte-order mark is not content
    except UnicodeDecodeError:
        raise InputError(
            f"{str(path)!r} is not a text file; expected a plain-text XYZ file: "
            f"check the path") from None
    except OSError as exc:
        raise InputError(
            f"{str(path)!r} cannot be read ({exc.strerror}); expected a readable XYZ "
            f"file: check its permissions") from None


def _parse_xyz(text: str, source: str):
    lines = text.splitlines()
    while lines and not lines[-1].strip():
        lines.pop()
    if not lines:
        raise InputError(
            f"{source} is empty; expected an XYZ file: an atom count, a comment line, "
            f"then one 'Symbol x y z' line per atom")
    count_token = lines[0].strip()
    try:
        count = int(count_token)
    except ValueError:
        count = 0
    if count <= 0:
        raise InputError(
            f"line 1 of {source}: {count_token!r} is not a positive atom count; expected "
            f"the number of atoms, then a comment line, then the atom lines: fix line 1")
    title = lines[1].strip() if len(lines) > 1 else ""
    atom_lines = lines[2:]
    if len(atom_lines) != count:
        raise InputError(
            f"line 1 of {source}: the count says {count} atoms but {len(atom_lines)} atom "
            f"lines follow the comment line; expected the count to equal the number of atom "
            f"lines: fix the count or the atom lines (one geometry per file)")
    atoms = []
    for number, line in enumerate(atom_lines, start=3):
        where = f"line {number} of {source}"
        fields = line.split()
        if len(fields) != 4:
            raise InputError(
                f"{where}: {len(fields)} fields in {line.strip()!r}; expected 4, "
                f"'Symbol x y z': fix the atom line")
        symbol = _element(fields[0], where)
        xyz = tuple(_finite_float(tok, where, axis) for tok, axis in zip(fields[1:], "xyz"))
        atoms.append((symbol, xyz))
    return atoms, title
