"""The AO->MO transform on one process against a dense numpy.einsum transform, block by
block: water (C2v) and distorted H2O2 (C1) in 6-31G, both ways to the half-transformed
rows (8-fold AO integrals in memory, the SCF's own or computed; AO units when the budget
is 0), frozen core on and off, serial and threads contexts. (MPI: test_transform_mpi.)"""

from pathlib import Path

import numpy as np
import pytest

from tessera.backends.context import Context
from tessera.backends.heap import base_pages
from tessera.chem.ao2mo import half_flops
from tessera.chem.integrals import transform
from tessera.chem.molecule import Molecule
from tessera.chem.pyscf_reference import rhf_reference
from tessera.chem.scf import rhf
from tessera.chem.scf.incore import s8_bytes

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.fixture(scope="module", params=[("water.xyz", "C2v"), ("h2o2_distorted.xyz", "C1")],
                ids=["water-C2v", "h2o2-C1"])
def system(request):
    xyz, group = request.param
    mol = Molecule.from_xyz(str(EXAMPLES / xyz), basis="6-31g").to_pyscf()
    with Context("serial") as ctx:
        ref = rhf(mol, context=ctx)
    ctx.close()
    assert ref.point_group == group
    eri_ao = mol.intor("int2e", aosym="s1")                   # dense (nao,)*4
    c = ref.mo_coeff
    eri_mo = np.einsum("pqrs,pi,qj,rk,sl->ijkl", eri_ao, c, c, c, c, optimize=True)
    return ref, eri_mo


def check_blocks(ints, ref, eri_mo, nfz):
    """Every stored block of every class equals the dense MO integrals' block."""
    index = {"o": nfz + ints.o.orbitals, "v": ref.nocc + ints.v.orbitals}
    compared = 0
    for name, t in ints.tensors.items():
        assert t.stored_keys()
        for key in t.stored_keys():
            idx = [index[ch][sp.slice(k)] for ch, sp, k in zip(name, t.spaces, key)]
            np.testing.assert_allclose(t.blocks[key], eri_mo[np.ix_(*idx)], rtol=0, atol=1e-10)
            compared += 1
        # and no symmetry-forbidden block is stored
        assert set(t.stored_keys()) <= set(t.allowed_keys())
    return compared


@pytest.mark.parametrize("backend", ["serial", "threads"])
@pytest.mark.parametrize("nfz,tile", [(0, 3), (1, 2)])
def test_in_memory_and_units_equal_dense_einsum(system, backend, nfz, tile):
    ref, eri_mo = system
    with Context(backend):
        mem = transform(ref, nfz, tile)                              # 8-fold, in memory
        units = transform(ref, nfz, tile, max_memory_mb=0, slab_bytes=4096)   # AO units
    assert mem.transform_stats["ao_integrals"] == "in memory"
    assert units.transform_stats["ao_integrals"] == "units"
    npair = ref.mol.nao * (ref.mol.nao + 1) // 2
    assert mem.transform_stats["ao_integrals_total"] == npair * (npair + 1) // 2
    # by units each AO pair of the computed shell pairs with all AO pairs (4-fold); with
    # point-group symmetry only the shell pairs of one shell pair per orbit
    cols = units.transform_stats["ao_pair_columns"]
    assert units.transform_stats["ao_integrals_computed"] == npair * cols
    assert (cols < npair) == (ref.point_group != "C1")
    assert check_blocks(mem, ref, eri_mo, nfz) == check_blocks(units, ref, eri_mo, nfz) > 0
    # flops of both halves: by units each AO-pair column's row costs one s2 kernel row
    # (2 nao^2 nact for its first product, and more); in memory the same without
    # symmetry, and with it (water is planar: its plane maps each AO onto +-itself) fewer:
    # a pair meets only the orbital pairs of its class there; the finishes count the same
    # without symmetry, and with it fewer in memory: the classes with the same first pairs
    # (oooo and oovv; ovoo, ovov and ovvv) share those rows' sparse SO products
    stats = mem.transform_stats, units.transform_stats
    nact = ref.mol.nao - nfz
    assert stats[1]["flops"] > stats[1]["ao_pair_columns"] * 2 * ref.mol.nao ** 2 * nact
    assert stats[1]["half_flops"] == stats[1]["ao_pair_columns"] * half_flops(ref.mol.nao, nact)
    assert stats[0]["ao_pair_columns"] == stats[1]["ao_pair_columns"]
    if ref.point_group == "C1":
        assert stats[0]["half_flops"] == stats[1]["half_flops"]
        assert stats[0]["finish_flops"] == stats[1]["finish_flops"]
    else:
        assert stats[0]["half_flops"] < 0.8 * stats[1]["half_flops"]
        assert stats[0]["finish_flops"] < stats[1]["finish_flops"]
    for s in stats:
        assert s["half_flops"] + s["finish_flops"] == s["flops"] and s["finish_flops"] > 0
        assert s["half_s"] > 0 and s["finish_s"] > 0


def test_scf_integrals_are_handed_to_the_transform_once(system):
    """Tessera's in-memory SCF keeps its 8-fold integrals for the transform: the first
    transform computes no AO integral, a second one computes them again; both correct."""
    ref, eri_mo = system
    with Context("serial") as ctx:
        own = rhf(ref.mol, context=ctx)
        assert own.ao_integrals.nbytes > 0
        first = transform(own, 0, 4)
        assert own.ao_integrals.nbytes == 0
        second = transform(own, 0, 4)
    ctx.close()
    assert first.transform_stats["ao_integrals_from_scf"]
    assert first.transform_stats["ao_integrals_computed"] == 0
    assert second.transform_stats["ao_integrals_computed"] > 0
    # the same orbitals: the same blocks, whichever way the AO integrals came (the SCF's
    # from one shell quartet per point-group orbit, chem/scf/s8fill.c: libcint's to 1e-14)
    for a, b in zip(first.tensors.values(), second.tensors.values()):
        for key in a.stored_keys():
            np.testing.assert_allclose(a.blocks[key], b.blocks[key], rtol=0, atol=1e-12)


def test_pyscf_reference_hands_its_integrals_to_the_transform(system):
    """PySCF's RHF keeps its 8-fold integrals in memory (``mf._eri``): the reference hands
    them to the transform as Tessera's SCF does; the blocks equal the dense einsum."""
    ref, eri_mo = system
    theirs = rhf_reference(ref.mol)
    assert theirs.ao_integrals.nbytes == s8_bytes(ref.mol.nao)
    with Context("threads"):
        ints = transform(theirs, 0, 4)
    assert theirs.ao_integrals.nbytes == 0
    assert ints.transform_stats["ao_integrals_from_scf"]
    assert ints.transform_stats["ao_integrals_computed"] == 0
    # PySCF's orbitals may differ from ours by a sign: compare with their own einsum
    c = theirs.mo_coeff
    dense = np.einsum("pqrs,pi,qj,rk,sl->ijkl", ref.mol.intor("int2e", aosym="s1"), c, c, c, c,
                      optimize=True)
    assert check_blocks(ints, theirs, dense, 0) > 0


@pytest.mark.parametrize("xyz,symmetry,group,orbits", [
    ("benzene.xyz", True, "D2h", True),      # planar D2h: AO pairs in orbits of up to 4
    ("benzene.xyz", False, "C1", False),     # the same molecule without symmetry: all AO pairs
    ("ammonia.xyz", True, "Cs", False),      # mirror not a plane of the input axes: all pairs
])
@pytest.mark.parametrize("backend", ["serial", "threads"])
def test_point_group_orbits_equal_dense_einsum(xyz, symmetry, group, orbits, backend):
    """In memory with point-group symmetry the half transform takes one AO pair per orbit
    and finishes through the SO basis (chem/ao2mo_symmetry.py); every block still equals
    the dense einsum transform, with and without symmetry."""
    mol = Molecule.from_xyz(str(EXAMPLES / xyz), basis="sto-3g").to_pyscf(symmetry=symmetry)
    with Context(backend) as ctx:
        ref = rhf(mol, context=ctx)
        ints = transform(ref, 1, 4)
    ctx.close()
    assert ref.point_group == group
    c = ref.mo_coeff
    eri_mo = np.einsum("pqrs,pi,qj,rk,sl->ijkl", mol.intor("int2e", aosym="s1"), c, c, c, c,
                       optimize=True)
    stats = ints.transform_stats
    assert stats["ao_integrals"] == "in memory"
    npair = mol.nao * (mol.nao + 1) // 2
    if orbits:
        # Burnside: orbits = sum over the 8 operations of the AO pairs each fixes, / 8. The
        # 36 AOs: E and the molecular plane fix all (666 pairs each); the C2 axis and the
        # mirror through the 4 on-axis atoms fix their 12 AOs (78 pairs + 12 swapped
        # pairs {k, g k}); the other 4 operations fix no AO (18 swapped pairs each):
        # (2 * 666 + 2 * 90 + 4 * 18) / 8 = 198
        assert stats["ao_pair_columns"] == 198 < npair // 3
        # the rows held: as the memory estimate counts them (by AO-pair classes)
        from tessera.chem.ao2mo_symmetry import pair_orbits
        assert stats["half_bytes_held"] == 8 * pair_orbits(mol).half_doubles(ref.orbsym[1:])
    else:
        assert stats["ao_pair_columns"] == npair
    assert check_blocks(ints, ref, eri_mo, 1) > 0



def test_finish_skips_only_representative_pairs_that_vanish():
    """``PairOrbits.reps_of``: for each irrep G the finish reads only the representative
    AO pairs that can meet pairs pq of G. In planar benzene the plane fixes every AO pair
    up to a sign, so each pair meets the irreps of one parity only (and pairs of on-axis
    AOs fewer still: in STO-3G 42 to 140 of the 198 per G); the rows of the others,
    half-transformed, are zero (1e-12)."""
    from pyscf.gto import moleintor

    from tessera.chem.ao2mo import half_rows, pair_index
    from tessera.chem.ao2mo_symmetry import pair_orbits
    mol = Molecule.from_xyz(str(EXAMPLES / "benzene.xyz"), basis="sto-3g").to_pyscf()
    with Context("serial") as ctx:
        ref = rhf(mol, context=ctx)
    ctx.close()
    orbits = pair_orbits(mol, ref.mo_coeff, orbsym=ref.orbsym)
    eri = moleintor.getints("int2e_sph", mol._atm, mol._bas, mol._env, aosym="s8")
    rows = half_rows(eri, ref.mo_coeff, orbits.reps, 1)           # (rep, pq) over all p >= q
    nrep, sets = len(orbits.reps), set()
    for R in orbits.chi:
        for S in orbits.chi:
            used = orbits.reps_of(R, S)
            sets.add(tuple(used.tolist()))
            pq = pair_index(np.flatnonzero(ref.orbsym == R), np.flatnonzero(ref.orbsym == S)).ravel()
            skipped = np.setdiff1d(np.arange(nrep), used)
            assert np.abs(rows[np.ix_(skipped, pq)]).max() < 1e-12
            assert np.abs(rows[np.ix_(used, pq)]).max() > 1e-3
    # every G skips some pairs; each pair is read for some G
    assert max(len(u) for u in sets) < nrep and set(sum(sets, ())) == set(range(nrep))


def test_orbits_without_classes_equal_dense_einsum():
    """Methane in D2 (axes x, y, z): AO pairs fall into orbits but no operation maps every
    AO onto +-itself (the H atoms move), so one class: the half over the representatives
    by PySCF's s2 kernel; every block equals the dense einsum transform."""
    from pyscf import gto

    from tessera.chem.ao2mo_symmetry import pair_orbits
    a = 0.63
    mol = gto.M(atom=f"C 0 0 0; H {a} {a} {a}; H {-a} {-a} {a}; H {-a} {a} {-a}; H {a} {-a} {-a}",
                basis="sto-3g", symmetry=True, verbose=0)
    with Context("serial") as ctx:
        ref = rhf(mol, context=ctx)
        ints = transform(ref, 1, 2)
    ctx.close()
    orbits = pair_orbits(mol, ref.mo_coeff, orbsym=ref.orbsym)
    assert ref.point_group == "D2" and set(orbits.irrep_class.values()) == {0}
    assert ints.transform_stats["ao_pair_columns"] == len(orbits.reps) == 24 < orbits.npair
    c = ref.mo_coeff
    eri_mo = np.einsum("pqrs,pi,qj,rk,sl->ijkl", mol.intor("int2e", aosym="s1"), c, c, c, c,
                       optimize=True)
    assert check_blocks(ints, ref, eri_mo, 1) > 0

def test_rounding_noise_in_the_so_table_keeps_pairs_in_their_class():
    """Water in the xz plane: PySCF's SO table has ~1e-16 on AOs an SO does not contain;
    each irrep pair still reads only representative AO pairs of its own class (the finish
    indexes the class's rows by them) and the transform equals the dense einsum."""
    from pyscf import gto

    from tessera.chem.ao2mo_symmetry import pair_orbits
    mol = gto.M(atom="O 0 0 0; H 0.757 0 0.587; H -0.757 0 0.587", basis="cc-pvdz",
                symmetry=True, verbose=0)
    noise = np.abs(np.hstack(mol.symm_orb))
    assert ((noise > 0) & (noise < 1e-12)).any()          # the case this test is about
    with Context("serial") as ctx:
        ref = rhf(mol, context=ctx)
        ints = transform(ref, 1, 4)
    ctx.close()
    orbits = pair_orbits(mol, ref.mo_coeff, orbsym=ref.orbsym)
    for R in orbits.chi:
        for S in orbits.chi:
            cls = orbits.irrep_class[R] ^ orbits.irrep_class[S]
            assert (orbits.rep_class[orbits.reps_of(R, S)] == cls).all()
    c = ref.mo_coeff
    eri_mo = np.einsum("pqrs,pi,qj,rk,sl->ijkl", mol.intor("int2e", aosym="s1"), c, c, c, c,
                       optimize=True)
    assert check_blocks(ints, ref, eri_mo, 1) > 0


def test_orbits_only_for_orbitals_of_one_irrep(system):
    """The SO finish takes each orbital's coefficients on the SOs of its irrep alone: with
    orbitals that mix two irreps, or labelled other than their irreps (all C1), the
    transform takes every AO pair (no orbits)."""
    from tessera.chem.ao2mo_symmetry import pair_orbits
    ref, _ = system
    if ref.point_group == "C1":
        assert pair_orbits(ref.mol, ref.mo_coeff) is None
        return
    assert pair_orbits(ref.mol, ref.mo_coeff, orbsym=ref.orbsym) is not None
    assert pair_orbits(ref.mol, ref.mo_coeff, orbsym=np.zeros_like(ref.orbsym)) is None
    p, q = (int(np.flatnonzero(ref.orbsym == g)[0]) for g in sorted(set(ref.orbsym.tolist()))[:2])
    mixed = ref.mo_coeff.copy()
    mixed[:, [p, q]] = ref.mo_coeff[:, [p, q]] @ np.array([[0.8, -0.6], [0.6, 0.8]])
    assert pair_orbits(ref.mol, mixed) is None


def test_base_pages_arrays_are_fresh_writable_and_separate():
    """The half-transformed rows' array (its own mapping of base pages): float64, C order,
    writable, not shared with the next one; an empty shape works."""
    a, b = base_pages((300, 700)), base_pages((300, 700))
    a[:] = np.arange(a.size).reshape(a.shape)
    b[:] = -1.0
    assert a.dtype == np.float64 and a.flags.c_contiguous and a.flags.writeable
    assert a.sum() == a.size * (a.size - 1) / 2 and b.sum() == -b.size
    assert base_pages((0, 4)).shape == (0, 4)


def test_in_memory_follows_the_run_budget_not_pyscf_max_memory(system, monkeypatch, caplog):
    """The in-memory decision takes Tessera's budget per rank (``backends.budget``:
    TESSERA_MEMORY_PER_RANK_MB here), not PySCF's ``mol.max_memory``; over budget the
    transform goes by AO units and says so in the log; both equal the dense einsum."""
    ref, eri_mo = system
    monkeypatch.setattr(ref.mol, "max_memory", 0)      # PySCF's own budget: ignored
    monkeypatch.setenv("TESSERA_MEMORY_PER_RANK_MB", "4000")
    with Context("serial"):
        fits = transform(ref, 0, 3)
    monkeypatch.setenv("TESSERA_MEMORY_PER_RANK_MB", str(s8_bytes(ref.mol.nao) / 2 / 2**20))
    with caplog.at_level("INFO", logger="tessera.chem.integrals"), Context("serial"):
        over = transform(ref, 0, 3)
    assert fits.transform_stats["ao_integrals"] == "in memory"
    assert over.transform_stats["ao_integrals"] == "units"
    assert "exceed the memory budget" in caplog.text and "TESSERA_MEMORY_PER_RANK_MB" in caplog.text
    assert check_blocks(fits, ref, eri_mo, 0) == check_blocks(over, ref, eri_mo, 0) > 0
