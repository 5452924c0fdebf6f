"""Molecule input (XYZ), point-group detection, XOR irrep labels and the PySCF RHF reference."""

from __future__ import annotations

import itertools
import warnings
from pathlib import Path

import numpy as np
import pytest
from pyscf import ao2mo, gto, scf
from pyscf.symm import param

from tessera.chem.inputs import load
from tessera.chem.molecule import ABELIAN_GROUPS, BOHR_IN_ANGSTROM, Molecule
from tessera.chem.pyscf_reference import rhf_reference
from tessera.errors import ConvergenceError, InputError, TesseraError

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

WATER_XYZ = """3
water, C2v
O    0.000000    0.000000    0.117790
H    0.000000    0.755453   -0.471161
H    0.000000   -0.755453   -0.471161
"""


def input_error(func, *args, **kwargs) -> str:
    """Call func, require an InputError with a one-line message, return the message."""
    with pytest.raises(InputError) as info:
        func(*args, **kwargs)
    message = str(info.value)
    assert "\n" not in message
    assert isinstance(info.value, TesseraError)
    return message


# ---------------------------------------------------------------------------- XYZ reading

def test_from_xyz_text_and_path_agree(tmp_path):
    from_text = Molecule.from_xyz(WATER_XYZ)
    path = tmp_path / "water.xyz"
    path.write_text(WATER_XYZ)
    assert Molecule.from_xyz(path) == from_text
    assert Molecule.from_xyz(str(path)) == from_text
    assert from_text.title == "water, C2v"
    assert from_text.charge == 0 and from_text.basis == "cc-pvdz"
    assert [s for s, _ in from_text.atoms] == ["O", "H", "H"]
    assert from_text.atoms[1][1] == (0.0, 0.755453, -0.471161)
    assert from_text.nelectron == 10
    from_text.check_closed_shell()


def test_symbols_case_insensitive_and_normalized():
    mol = Molecule.from_xyz("3\nhocl\no 0 0 0\nh 0.9643 0 0\nCL -0.3788 0 1.6461\n")
    assert [s for s, _ in mol.atoms] == ["O", "H", "Cl"]
    assert mol.nelectron == 8 + 1 + 17
    numbers = Molecule.from_xyz("2\n\n8 0 0 0\n1 0 0 0.97\n", charge=-1)
    assert [s for s, _ in numbers.atoms] == ["O", "H"] and numbers.nelectron == 10


def test_bohr_units_converted_to_angstrom():
    bohr = Molecule.from_xyz("2\nH2 in bohr\nH 0 0 0\nH 0 0 1.4\n", units="bohr")
    assert bohr.atoms[1][1][2] == pytest.approx(1.4 * BOHR_IN_ANGSTROM, abs=1e-15)
    assert BOHR_IN_ANGSTROM == pytest.approx(0.529177210903, abs=1e-9)
    mol = bohr.to_pyscf(symmetry=False)
    assert np.linalg.norm(mol.atom_coord(0) - mol.atom_coord(1)) == pytest.approx(1.4, abs=1e-12)
    assert "units" in input_error(Molecule.from_xyz, WATER_XYZ, units="nm")


def test_trailing_blank_lines_ignored():
    assert len(Molecule.from_xyz(WATER_XYZ + "\n\n   \n").atoms) == 3


def test_missing_file(tmp_path):
    message = input_error(Molecule.from_xyz, tmp_path / "nowhere.xyz")
    assert "nowhere.xyz" in message and "does not exist" in message


def test_directory_is_not_a_file(tmp_path):
    assert "directory" in input_error(Molecule.from_xyz, tmp_path)


def test_empty_file(tmp_path):
    path = tmp_path / "empty.xyz"
    path.write_text("")
    message = input_error(Molecule.from_xyz, path)
    assert "empty.xyz is empty" in message and "atom count" in message
    path.write_text("\n  \n")
    assert "is empty" in input_error(Molecule.from_xyz, path)


@pytest.mark.parametrize("count", ["three", "0", "-3", "2.5", ""])
def test_count_line_not_a_positive_integer(count):
    text = f"{count}\ncomment\nH 0 0 0\nH 0 0 0.74\n"
    message = input_error(Molecule.from_xyz, text)
    assert message.startswith("line 1 of the XYZ text")
    assert f"{count!r} is not a positive atom count" in message


@pytest.mark.parametrize("count,found", [(2, 3), (4, 3)])
def test_count_does_not_match_atom_lines(count, found):
    text = WATER_XYZ.replace("3\n", f"{count}\n", 1)
    message = input_error(Molecule.from_xyz, text)
    assert f"the count says {count} atoms but {found} atom lines" in message


def test_missing_comment_line_shows_as_count_mismatch():
    message = input_error(Molecule.from_xyz, "2\nH 0 0 0\nH 0 0 0.74\n")
    assert "the count says 2 atoms but 1 atom lines" in message


@pytest.mark.parametrize("symbol", ["Xx", "X", "Q", "H1", "0", "200"])
def test_bad_atom_symbol(symbol, tmp_path):
    path = tmp_path / "water.xyz"
    path.write_text(WATER_XYZ.replace("H    0.000000    0.755453", f"{symbol}    0.000000    0.755453"))
    message = input_error(Molecule.from_xyz, path)
    assert message.startswith(f"line 4 of {path}: {symbol!r} is not")
    assert "such as O or H" in message


@pytest.mark.parametrize("value", ["0.75a", "nan", "inf", "1,5"])
def test_non_numeric_coordinate(value):
    text = WATER_XYZ.replace("0.755453", value, 1)
    message = input_error(Molecule.from_xyz, text)
    assert message.startswith("line 4 of the XYZ text: y coordinate")
    assert f"{value!r} is not a number" in message


@pytest.mark.parametrize("line,nfields", [("H 0.0 0.75", 3), ("H 0.0 0.75 -0.47 0.1", 5), ("", 0)])
def test_wrong_number_of_fields(line, nfields):
    text = WATER_XYZ.replace("H    0.000000    0.755453   -0.471161", line)
    message = input_error(Molecule.from_xyz, text)
    assert message.startswith(f"line 4 of the XYZ text: {nfields} fields")
    assert "expected 4, 'Symbol x y z'" in message


def test_direct_construction_validated():
    mol = Molecule(atoms=(("he", (0, 0, 0)),), basis=" sto-3g ")
    assert mol.atoms == (("He", (0.0, 0.0, 0.0)),) and mol.basis == "sto-3g"
    assert "not a chemical element" in input_error(Molecule, atoms=(("Zz", (0, 0, 0)),))
    assert "2 coordinates given; expected 3" in input_error(Molecule, atoms=(("H", (0, 0)),))
    assert "no atoms" in input_error(Molecule, atoms=())
    assert "not an integer" in input_error(Molecule, atoms=(("H", (0, 0, 0)),), charge=0.5)
    assert "leaves -1 electrons" in input_error(Molecule, atoms=(("H", (0, 0, 0)),), charge=2)


def test_atoms_on_top_of_each_other():
    message = input_error(Molecule.from_xyz, "3\nbad\nO 0 0 0\nH 0 0 0.96\nH 0 0.02 0.96\n")
    assert message.startswith("atoms 2 (H) and 3 (H) are 0.020 Å apart")


# ---------------------------------------------------------------------------- electrons

def test_odd_electron_count_rejected():
    mol = Molecule.from_xyz("2\nOH radical\nO 0 0 0\nH 0 0 0.97\n")
    assert mol.nelectron == 9
    message = input_error(mol.check_closed_shell)
    assert "has 9 electrons (charge 0)" in message and "change --charge" in message
    anion = Molecule(mol.atoms, charge=-1)
    assert anion.nelectron == 10
    anion.check_closed_shell()
    assert "has 9 electrons" in input_error(rhf_reference, mol)
    assert "9 electrons" in input_error(rhf_reference, mol.to_pyscf())


# ---------------------------------------------------------------------------- basis

def test_unknown_basis_is_an_input_error():
    mol = Molecule.from_xyz(WATER_XYZ, basis="cc-pvxz")
    with warnings.catch_warnings():
        warnings.simplefilter("error")          # PySCF's own warning must not escape
        message = input_error(mol.to_pyscf)
    assert "'cc-pvxz'" in message
    assert "cc-pvdz" in message and "sto-3g" in message and "6-31g" in message


def test_basis_without_the_element():
    mol = Molecule((("U", (0.0, 0.0, 0.0)),), charge=2, basis="cc-pvdz")
    message = input_error(mol.to_pyscf)
    assert "'cc-pvdz' has no functions for U" in message


def test_to_pyscf_settings():
    mol = Molecule.from_xyz(WATER_XYZ, charge=0).to_pyscf()
    assert mol.verbose == 0 and mol.output is None and not mol.cart
    assert mol.nao == 24 and mol.nelectron == 10 and mol.spin == 0
    assert mol.unit.lower().startswith("ang")


# ---------------------------------------------------------------------------- point groups

# file -> (full group, Abelian group used, cc-pVDZ basis functions, electrons)
EXAMPLE_GROUPS = {
    "water.xyz": ("C2v", "C2v", 24, 10),
    "n2.xyz": ("Dooh", "D2h", 28, 14),
    "co.xyz": ("Coov", "C2v", 28, 14),
    "hocl.xyz": ("Cs", "Cs", 37, 26),
    "h2o2_distorted.xyz": ("C1", "C1", 38, 18),
    "ammonia.xyz": ("C3v", "Cs", 29, 10),
    "benzene.xyz": ("D6h", "D2h", 114, 42),
    "glycine.xyz": ("C1", "C1", 95, 40),
    "water_trimer.xyz": ("C1", "C1", 72, 30),
    "water_tetramer.xyz": ("S4", "C2", 96, 40),
    "water_tetramer_c1.xyz": ("C1", "C1", 96, 40),
}


def test_every_example_file_is_listed():
    assert sorted(p.name for p in EXAMPLES.glob("*.xyz")) == sorted(EXAMPLE_GROUPS)


@pytest.mark.parametrize("name", sorted(EXAMPLE_GROUPS))
def test_example_point_groups(name):
    full, abelian, nao, nelectron = EXAMPLE_GROUPS[name]
    molecule = Molecule.from_xyz(EXAMPLES / name)
    assert molecule.title                      # every example says what it is
    assert molecule.nelectron == nelectron
    molecule.check_closed_shell()
    mol = molecule.to_pyscf()
    assert (mol.topgroup, mol.groupname) == (full, abelian)
    assert (molecule.point_group_full, molecule.point_group) == (full, abelian)
    assert load(EXAMPLES / name, basis="cc-pvdz", charge=0).molecule["point_group_full"] == full
    assert mol.nao == nao
    table = param.IRREP_ID_TABLE[abelian]
    assert [table[name] for name in mol.irrep_name] == list(mol.irrep_id)
    assert sum(c.shape[1] for c in mol.symm_orb) == nao
    plain = molecule.to_pyscf(symmetry=False)
    assert (plain.topgroup, plain.groupname, plain.symmetry) == ("C1", "C1", False)


@pytest.mark.parametrize("group", ABELIAN_GROUPS)
def test_xor_labels_multiply_like_characters(group):
    assert set(param.IRREP_ID_TABLE) == set(ABELIAN_GROUPS)
    ids = param.IRREP_ID_TABLE[group]
    chars = {row[0]: np.array(row[1:]) for row in param.CHARACTER_TABLE[group]}
    order = len(param.OPERATOR_TABLE[group])
    assert set(chars) == set(ids) and len(ids) == order
    assert sorted(ids.values()) == list(range(order))         # bit labels 0 .. order-1
    by_id = {label: name for name, label in ids.items()}
    for a, b in itertools.product(ids, repeat=2):
        product = by_id[ids[a] ^ ids[b]]
        np.testing.assert_array_equal(chars[a] * chars[b], chars[product])
    assert by_id[0] in ("A", "Ag", "A1", "A'")                 # 0 is totally symmetric
    assert np.all(chars[by_id[0]] == 1)


@pytest.mark.parametrize("name,basis", [("n2.xyz", "cc-pvdz"), ("co.xyz", "cc-pvdz"),
                                        ("ammonia.xyz", "cc-pvdz"), ("water_tetramer.xyz", "sto-3g")])
def test_orbital_labels_make_integrals_vanish_by_xor(name, basis):
    """(pq|rs) and h_pq vanish unless the XOR of the labels is 0 (linear groups included)."""
    ref = rhf_reference(Molecule.from_xyz(EXAMPLES / name, basis=basis))
    mol, c, sym = ref.mol, ref.mo_coeff, ref.orbsym
    assert ref.point_group == EXAMPLE_GROUPS[name][1]
    assert set(np.unique(sym)) <= set(ref.irrep_names)
    hcore = c.T @ scf.hf.get_hcore(mol) @ c
    forbidden = sym[:, None] != sym[None, :]
    assert np.abs(hcore[forbidden]).max() < 1e-10
    assert np.abs(hcore[~forbidden]).max() > 0.1
    eri = ao2mo.restore(1, ao2mo.full(mol, c), c.shape[1])
    total = sym[:, None, None, None] ^ sym[None, :, None, None] ^ sym[None, None, :, None] ^ sym
    assert np.abs(eri[total != 0]).max() < 1e-10
    assert np.abs(eri[total == 0]).max() > 0.1


def _random_pose(molecule, seed, noise):
    """The molecule rotated and moved at random, each atom jiggled by ~noise Å."""
    from scipy.spatial.transform import Rotation

    rng = np.random.default_rng(seed)
    rotation = Rotation.random(random_state=rng).as_matrix()
    shift = rng.normal(size=3)
    atoms = tuple((s, tuple(np.array(xyz) @ rotation.T + shift + noise * rng.normal(size=3)))
                  for s, xyz in molecule.atoms)
    return Molecule(atoms, charge=molecule.charge, basis=molecule.basis)


@pytest.mark.parametrize("name", ["ammonia.xyz", "benzene.xyz", "water_tetramer.xyz", "water.xyz"])
def test_nearly_symmetric_geometry_made_exactly_symmetric(name):
    """A rotated geometry with 1e-7 Å noise keeps its group; integrals obey it exactly."""
    full, abelian = EXAMPLE_GROUPS[name][:2]
    molecule = _random_pose(Molecule.from_xyz(EXAMPLES / name, basis="sto-3g"), seed=7, noise=1e-7)
    mol = molecule.to_pyscf()
    assert (mol.topgroup, mol.groupname) == (full, abelian)
    plain = molecule.to_pyscf(symmetry=False).atom_coords()
    moved = np.abs(mol.atom_coords() - plain).max()
    assert 1e-9 < moved < 1e-5                         # bohr: nudged, not changed
    s = mol.intor("int1e_ovlp")
    h = mol.intor("int1e_kin") + mol.intor("int1e_nuc")
    for (i, a), (j, b) in itertools.combinations(enumerate(mol.symm_orb), 2):
        assert np.abs(a.T @ s @ b).max() < 1e-12 and np.abs(a.T @ h @ b).max() < 1e-11
    assert molecule.to_pyscf(symmetry=False).groupname == "C1"


def test_atoms_and_tetrahedra_get_abelian_groups():
    neon = Molecule.from_xyz("1\nneon atom\nNe 0 0 0\n").to_pyscf()
    assert (neon.topgroup, neon.groupname, neon.nao) == ("SO3", "D2h", 14)
    assert set(neon.irrep_id) <= set(range(8))
    methane = Molecule.from_xyz("5\nmethane\nC 0 0 0\nH 0.629118 0.629118 0.629118\n"
                                "H -0.629118 -0.629118 0.629118\nH -0.629118 0.629118 -0.629118\n"
                                "H 0.629118 -0.629118 -0.629118\n").to_pyscf()
    assert (methane.topgroup, methane.groupname) == ("Td", "D2")


# ---------------------------------------------------------------------------- RHF reference

def _direct_pyscf_energy(symmetry: bool) -> float:
    mol = gto.M(atom=str(EXAMPLES / "water.xyz"), basis="cc-pvdz", symmetry=symmetry,
                verbose=0, output=None)
    mf = scf.RHF(mol)
    mf.conv_tol = 1e-12
    return mf.kernel()


@pytest.mark.parametrize("symmetry", [True, False])
def test_water_rhf_matches_pyscf(symmetry, capfd):
    mol = Molecule.from_xyz(EXAMPLES / "water.xyz").to_pyscf(symmetry=symmetry)
    ref = rhf_reference(mol)
    assert capfd.readouterr() == ("", "")      # library code prints nothing
    assert ref.converged and ref.source == "pyscf" and ref.iterations > 0
    assert ref.e_hf == pytest.approx(_direct_pyscf_energy(symmetry), abs=1e-9)
    # stored value: PySCF 2.14 RHF/cc-pVDZ on examples/water.xyz, conv_tol 1e-12
    assert ref.e_hf == pytest.approx(-76.0267679974, abs=1e-9)
    assert ref.e_nuc == pytest.approx(mol.energy_nuc(), abs=1e-12)
    assert (ref.nocc, ref.nmo, ref.nvir) == (5, 24, 19)
    assert ref.orbsym.dtype.kind == "i" and ref.orbsym.shape == (24,)
    assert type(ref.mo_coeff) is np.ndarray and ref.mo_coeff.shape == (24, 24)
    s = mol.intor("int1e_ovlp")
    np.testing.assert_allclose(ref.mo_coeff.T @ s @ ref.mo_coeff, np.eye(24), atol=1e-10)
    assert np.all(np.diff(ref.mo_energy) >= -1e-12)
    if symmetry:
        assert ref.point_group == "C2v" and ref.info["point_group_full"] == "C2v"
        assert ref.irrep_names == {0: "A1", 1: "A2", 2: "B1", 3: "B2"}
        counts = {ref.irrep_names[k]: int(n) for k, n in zip(*np.unique(ref.orbsym, return_counts=True))}
        assert counts == {"A1": 11, "A2": 2, "B1": 4, "B2": 7}
        occupied = {ref.irrep_names[k]: int(n) for k, n in zip(*np.unique(ref.orbsym[:5], return_counts=True))}
        assert occupied == {"A1": 3, "B1": 1, "B2": 1}       # 1a1 2a1 1b2 3a1 1b1
        for label, so in zip(mol.irrep_id, mol.symm_orb):   # each MO lies in its irrep's span
            mos = ref.mo_coeff[:, ref.orbsym == label]
            projector = so @ np.linalg.solve(so.T @ s @ so, so.T @ s)
            np.testing.assert_allclose(projector @ mos, mos, atol=1e-10)
    else:
        assert ref.point_group == "C1" and ref.irrep_names == {0: "A"}
        assert np.all(ref.orbsym == 0)


def test_rhf_reference_accepts_molecule():
    ref = rhf_reference(Molecule.from_xyz(EXAMPLES / "water.xyz", basis="sto-3g"))
    assert ref.point_group == "C2v" and ref.mol.nao == 7
    # stored value: PySCF 2.14 RHF/STO-3G on examples/water.xyz, conv_tol 1e-12
    assert ref.e_hf == pytest.approx(-74.9631467756, abs=1e-9)


def test_rhf_non_convergence_raises_with_last_energy():
    mol = Molecule.from_xyz(EXAMPLES / "water.xyz")
    with pytest.raises(ConvergenceError) as info:
        rhf_reference(mol, max_cycle=1)
    result = info.value.result
    assert result is not None and not result.converged
    assert f"{result.e_hf:.12f}" in str(info.value)
    assert "--scf-max-iter" in str(info.value) and "\n" not in str(info.value)


def test_rhf_rejects_linear_group_without_subgroup():
    mol = gto.M(atom="N 0 0 0; N 0 0 1.0977", basis="sto-3g", symmetry=True, verbose=0)
    assert mol.groupname == "Dooh"
    assert "symmetry_subgroup" in input_error(rhf_reference, mol)
