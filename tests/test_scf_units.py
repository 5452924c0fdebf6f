"""Serial parts of Tessera's RHF (no MPI): shell blocks, block integrals, Schwarz bounds,
the task list with 8-fold symmetry and screening, the block J/K kernel, DIIS,
symmetry-adapted diagonalisation, and the whole RHF on serial and threads contexts (the
Fock build as a task set).  Reference values come from PySCF computed here."""

from pathlib import Path

import numpy as np
import pytest
from pyscf import gto, scf
from pyscf.scf import _vhf, hf, hf_symm

from tessera.chem.scf.blocking import default_block_nbf, make_blocks
from tessera.chem.diis import DIIS
from tessera.chem.scf.incore import s8_bytes
from tessera.chem.scf.integrals import (BlockERI, shell_operations, s8_integrals, s8_shares,
                                       s8_ranges, schwarz_bounds)
from tessera.chem.scf.kernel import assemble, contract_block
from tessera.chem.scf.symmetry import symmetry_basis
from tessera.chem.scf.tasks import PARTIAL, make_tasks
from tessera.errors import InputError

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def molecule(xyz, basis, symmetry=False):
    atoms = "".join((EXAMPLES / xyz).read_text().splitlines(True)[2:])
    return gto.M(atom=atoms, basis=basis, symmetry=symmetry, verbose=0)


@pytest.fixture(scope="module")
def water_dz():
    return molecule("water.xyz", "cc-pvdz")


@pytest.fixture(scope="module")
def trimer():
    return molecule("water_trimer.xyz", "6-31g")


def test_blocks_cover_shells_in_order(water_dz, trimer):
    for mol, target in ((water_dz, 4), (water_dz, None), (trimer, 7), (trimer, 1)):
        b = make_blocks(mol, target)
        shells = [s for s0, s1 in b.shell_ranges for s in range(s0, s1)]
        assert shells == list(range(mol.nbas))
        assert b.nao == mol.nao and sum(b.sizes) == mol.nao
        ao_loc = mol.ao_loc_nr()
        limit = target or default_block_nbf(mol.nao)
        for (s0, s1), n in zip(b.shell_ranges, b.sizes):
            # a block exceeds the target only when it is a single shell
            assert n <= limit or s1 - s0 == 1, (s0, s1, n, limit)
            assert n == ao_loc[s1] - ao_loc[s0]
    # whole atoms are kept together when they fit: trimer with 13-function blocks
    b = make_blocks(trimer, 13)
    atom_of = {s: ia for ia, row in enumerate(trimer.aoslice_by_atom())
               for s in range(row[0], row[1])}
    for s0, s1 in b.shell_ranges:
        atoms = sorted({atom_of[s] for s in range(s0, s1)})
        assert atoms == list(range(atoms[0], atoms[-1] + 1))
    with pytest.raises(InputError, match="positive number"):
        make_blocks(trimer, 0)


def test_block_integrals_equal_full_eri(water_dz):
    mol = water_dz
    b = make_blocks(mol, 5)
    eri = BlockERI(mol)
    full = mol.intor("int2e")
    nb = b.nblocks
    rng = np.random.default_rng(7)
    quartets = [(a, a, c, c) for a in range(nb) for c in range(nb)]          # s4 path
    quartets += [(a, a, c, d) for a in range(nb) for c in range(nb) for d in range(c)]
    quartets += [tuple(rng.integers(0, nb, 4)) for _ in range(40)]
    for a, bb, c, d in quartets:
        g = eri.blocks(b, a, bb, c, d)
        ref = full[b.ao_slice(a), b.ao_slice(bb), b.ao_slice(c), b.ao_slice(d)]
        np.testing.assert_allclose(g, ref, rtol=0, atol=1e-13)



@pytest.mark.parametrize("xyz, basis, group, nops, threads", [
    ("water.xyz", "cc-pvdz", "C2v", 4, 2),        # in the molecular plane: every op fixes O
    ("benzene.xyz", "sto-3g", "D2h", 8, 2),       # planar D2h: orbits of 4 shell quartets
    ("n2.xyz", "cc-pvtz", "D2h", 8, 1),           # f shells; an axis through both atoms
    ("hocl.xyz", "6-31g*", "Cs", 2, 2),           # Cartesian-free d shells, one plane
    ("water.xyz", "cc-pvdz", None, 0, 2),         # no symmetry: PySCF's own fill
])
def test_s8_integrals_from_symmetry_unique_quartets_equal_libcint(xyz, basis, group, nops, threads):
    """The 8-fold integrals written from one shell quartet per point-group orbit (s8fill.c)
    equal libcint's for every quartet, signs of the images included."""
    mol = molecule(xyz, basis, symmetry=group or False)
    assert len(shell_operations(mol)) == nops
    got, skeleton = s8_integrals(mol, threads)
    ref = mol.intor("int2e", aosym="s8")
    assert got.shape == ref.shape
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-12)
    assert (skeleton is None) == (nops == 0)
    if skeleton is not None:
        # J and K of a symmetric density (the MINAO guess) from the representative quartets
        # alone, summed over the group, equal PySCF's from all 8-fold integrals
        dm = hf.init_guess_by_minao(mol)
        vj, vk = _vhf.incore(ref, dm, hermi=1)
        got_j, got_k = skeleton.jk(got, dm, threads)
        np.testing.assert_allclose(got_j, vj, rtol=0, atol=1e-11)
        np.testing.assert_allclose(got_k, vk, rtol=0, atol=1e-11)


def test_point_group_operations_are_worked_out_once_per_molecule():
    """The SCF, its memory estimate and the transform ask for the AO operations of the same
    molecule: the second request returns the kept list; a moved atom (the same SOs) is
    worked out again, and both equal a fresh computation."""
    from tessera.chem import ao2mo_symmetry as aos
    mol = molecule("water.xyz", "6-31g", symmetry="C2v")
    U = np.hstack(mol.symm_orb)
    first = aos.ao_operations(mol, U)
    assert aos.ao_operations(mol, U.copy()) is first and len(first) == 3
    fresh = aos._operations(mol, U)
    assert all(np.array_equal(p, q) and np.array_equal(s, t) for (p, s), (q, t) in zip(first, fresh))
    mol.set_geom_(mol.atom_coords() * 1.01, unit="Bohr")
    assert aos.ao_operations(mol, np.hstack(mol.symm_orb)) is not first


def test_incore_fock_of_a_density_the_group_changes_uses_every_quartet():
    """The skeleton J/K is exact only for densities the group leaves unchanged; the
    in-memory builder gives a random (symmetric-matrix, not group-invariant) density the
    full 8-fold J/K, and the invariant part of it the skeleton's (both against PySCF)."""
    from tessera.chem.scf.incore import IncoreFock
    mol = molecule("water.xyz", "6-31g", symmetry="C2v")
    fock = IncoreFock(mol)
    assert fock.skeleton is not None
    rng = np.random.default_rng(7)
    dm = rng.standard_normal((mol.nao, mol.nao))
    dm = dm + dm.T
    for d in (dm, fock.skeleton.symmetrize(dm)):
        vj, vk = _vhf.incore(mol.intor("int2e", aosym="s8"), d, hermi=1)
        np.testing.assert_allclose(fock.build(d), vj - 0.5 * vk, rtol=0, atol=1e-11)
    assert not fock.skeleton.invariant(dm) and fock.skeleton.invariant(fock.skeleton.symmetrize(dm))


@pytest.mark.parametrize("xyz, basis, symmetry", [("benzene.xyz", "sto-3g", True),          # D2h skeleton
                                                    ("h2o2_distorted.xyz", "6-31g", True)])  # C1: identity
def test_parts_of_shell_pairs_computed_in_any_order_give_pyscf_jk(xyz, basis, symmetry):
    """What a rank of several keeps: the compact representatives of ranges of shell pairs
    (``ShellPairQuartets.part``), computed in another order than the ranges' (a stealing
    rank takes ranges from the back), half of them on one rank, half on another; their J and K
    (``Skeleton.parts_jk``) summed with the others' equal PySCF's (1e-11)."""
    from tessera.chem.scf.integrals import (ShellPairQuartets, Skeleton, all_pair_costs,
                                           pair_ranges)
    mol = molecule(xyz, basis, symmetry=symmetry)
    ops = shell_operations(mol) or [(np.arange(mol.nbas), np.arange(mol.nao), np.ones(mol.nao))]
    quartets = ShellPairQuartets(mol, ops)
    skeleton = Skeleton(ops, quartets.eri.ao_loc, mol.nao, None, (0, quartets.npairs))
    cost = all_pair_costs(mol, quartets.shell_map)
    ranges, _ = pair_ranges(cost, 7)
    assert len(ranges) > 3
    rng = np.random.default_rng(3)
    dm = rng.standard_normal((mol.nao, mol.nao))
    dm = skeleton.symmetrize(dm + dm.T)
    vj_ref, vk_ref = _vhf.incore(mol.intor("int2e", aosym="s8"), dm, hermi=1)
    vj = vk = 0
    half = len(ranges) // 2
    for ranks_ranges in (ranges[:half], ranges[half:]):   # two ranks' shares, each its own row offsets
        row_off = np.zeros(quartets.npairs + 1, dtype=np.int64)
        parts = [(s, e, *quartets.part(s, e, cost, row_off, 2)) for s, e in reversed(ranks_ranges)]
        j, k = skeleton.parts_jk(parts, dm, 2, row_off)
        vj, vk = vj + j, vk + k
    np.testing.assert_allclose(vj, vj_ref, rtol=0, atol=1e-11)
    np.testing.assert_allclose(vk, vk_ref, rtol=0, atol=1e-11)


def test_schwarz_bounds_equal_brute_force(water_dz):
    mol = water_dz
    q = schwarz_bounds(BlockERI(mol), mol)
    full = mol.intor("int2e")
    diag = np.sqrt(np.abs(np.einsum("ijij->ij", full)))
    loc = mol.ao_loc_nr()
    for i in range(mol.nbas):
        for j in range(mol.nbas):
            assert q[i, j] == pytest.approx(diag[loc[i]:loc[i + 1], loc[j]:loc[j + 1]].max(),
                                            rel=1e-12, abs=1e-15)


def test_s8_ranges_split_the_shell_pairs_and_count_their_representatives():
    """Several ranks: contiguous ranges of shell pairs, each pair on one rank, and each
    rank keeps the integrals of its pairs' representative quartets, counted here from
    the shell maps (a quartet is its orbit's representative when no operation maps it
    to a lower packed index); one rank: the whole array; C1 over several ranks: the
    identity's representatives, every canonical quartet (ij|kl), kl <= ij, once."""
    mol = molecule("benzene.xyz", "sto-3g", symmetry=True)
    ops = shell_operations(mol)
    size = np.diff(mol.ao_loc_nr())
    nsp = mol.nbas * (mol.nbas + 1) // 2

    def pair(a, b):
        return a * (a + 1) // 2 + b if a >= b else b * (b + 1) // 2 + a
    w = s8_ranges(mol, 3)
    assert w[0, 0] == 0 and w[-1, 1] == nsp and all(w[:-1, 1] == w[1:, 0])
    assert all(w[:, 1] > w[:, 0])
    kept = np.zeros(3, dtype=np.int64)
    reps = 0
    for i in range(mol.nbas):
        for j in range(i + 1):
            ij = pair(i, j)
            rank = int(np.flatnonzero((w[:, 0] <= ij) & (ij < w[:, 1]))[0])
            for k in range(i + 1):
                for l in range(k + 1):
                    q = pair(ij, pair(k, l))
                    if pair(k, l) > ij or any(pair(pair(m[i], m[j]), pair(m[k], m[l])) < q
                                              for m, _, _ in ops):
                        continue
                    reps += 1
                    kept[rank] += size[i] * size[j] * size[k] * size[l]
    assert w[:, 2].tolist() == kept.tolist() and 0 < reps
    quartets = [pair(e - 1, e - 1) + 1 - pair(s, 0) for s, e in w[:, :2]]   # kl <= ij of its pairs ij
    assert (0 < w[:, 3]).all() and (w[:, 3] <= quartets).all() and w[:, 3].sum() <= sum(quartets)
    assert s8_shares(mol, 3).tolist() == (8 * kept + w[:, 3]).tolist()        # + their orbit sizes
    assert s8_shares(mol, 1).tolist() == [s8_bytes(mol.nao)]
    c1 = molecule("h2o2_distorted.xyz", "6-31g", symmetry=True)
    assert c1.groupname == "C1"
    n = np.diff(c1.ao_loc_nr())
    nij = np.outer(n, n)[np.tril_indices(c1.nbas)]            # functions of each shell pair
    blocks = (int((nij ** 2).sum()) + int(nij.sum()) ** 2) // 2  # of every (ij|kl), kl <= ij
    npair = len(nij)
    w = s8_ranges(c1, 2)
    assert w[:, 2].sum() == blocks and w[:, 3].sum() == npair * (npair + 1) // 2
    assert s8_shares(c1, 2).sum() == 8 * blocks + npair * (npair + 1) // 2


def _serial_fock(mol, threshold, block_nbf, dm):
    b = make_blocks(mol, block_nbf)
    eri = BlockERI(mol)
    tasks = make_tasks(b, schwarz_bounds(eri, mol), threshold)
    dens = {(x, y): dm[b.ao_slice(x), b.ao_slice(y)]
            for x in range(b.nblocks) for y in range(x + 1)}
    buf = {}
    for t in range(len(tasks)):
        g = eri.blocks(b, *tasks.quartet(t))
        if tasks.kind[t] == PARTIAL:
            g *= tasks.mask(t)
        contract_block(g, tasks.scale[t], tasks.quartet(t), dens, buf)
    return assemble(buf, b.ao_ranges), tasks


def _random_density(n, seed):
    a = np.random.default_rng(seed).standard_normal((n, n))
    return a + a.T


@pytest.mark.parametrize("block_nbf", [3, 7, None])
def test_block_fock_equals_pyscf_jk(water_dz, block_nbf):
    """Unique block quartets with degeneracy weights reproduce J - K/2 exactly."""
    dm = _random_density(water_dz.nao, 3)
    g, tasks = _serial_fock(water_dz, 0.0, block_nbf, dm)
    nb = tasks.blocks.nblocks
    npair = nb * (nb + 1) // 2
    assert len(tasks) == npair * (npair + 1) // 2
    assert tasks.n_shell_quartets_skipped == 0
    vj, vk = scf.hf.get_jk(water_dz, dm)
    np.testing.assert_allclose(g, vj - 0.5 * vk, rtol=0, atol=1e-11)


def test_screening_skips_exactly_the_quartets_below_threshold(trimer):
    """Screened build == full integrals with every shell quartet whose Schwarz bound is
    below the threshold removed; the counts agree with a brute-force enumeration."""
    mol, thr = trimer, 1e-10
    dm = _random_density(mol.nao, 5)
    g, tasks = _serial_fock(mol, thr, 5, dm)
    q = schwarz_bounds(BlockERI(mol), mol)
    shell = np.repeat(np.arange(mol.nbas), np.diff(mol.ao_loc_nr()))
    qf = q[shell][:, shell]
    eri = mol.intor("int2e") * (np.multiply.outer(qf, qf) >= thr)
    ref = np.einsum("ijkl,kl->ij", eri, dm) - 0.5 * np.einsum("ikjl,kl->ij", eri, dm)
    np.testing.assert_allclose(g, ref, rtol=0, atol=1e-11)
    pairs = q[np.tril_indices(mol.nbas)]
    prod = np.multiply.outer(pairs, pairs)
    iu = np.tril_indices(len(pairs))
    assert tasks.n_shell_quartets == len(iu[0])
    assert tasks.n_shell_quartets_skipped == int(np.count_nonzero(prod[iu] < thr)) > 0
    assert tasks.n_block_quartets_skipped > 0          # whole tasks dropped
    assert np.any(tasks.kind == PARTIAL)


def test_diis_extrapolates_linear_error_exactly():
    rng = np.random.default_rng(2)
    f_star = rng.standard_normal((4, 4))
    basis = rng.standard_normal((2, 4, 4))
    diis = DIIS(8)
    out = None
    for _ in range(3):            # three errors in a 2-d subspace: exact combination
        r = np.tensordot(rng.standard_normal(2), basis, axes=1)
        out = diis.update(f_star + r, r)
    np.testing.assert_allclose(out, f_star, atol=1e-10)


def test_diis_combination_of_empty_and_full_vectors():
    """The extrapolated vector sum_i c_i v_i (BLAS axpy), also of empty vectors: a rank
    that owns no amplitude blocks combines nothing (BLAS refuses empty vectors)."""
    from tessera.chem.diis import MemoryHistory, _combine
    rng = np.random.default_rng(3)
    c, vs = rng.standard_normal(3), [rng.standard_normal((5, 7)) for _ in range(4)]
    np.testing.assert_allclose(_combine(c, MemoryHistory(vs[:3]), vs[3]),
                               sum(ci * v for ci, v in zip(c, vs[1:])), atol=1e-14)
    assert _combine(c, MemoryHistory([np.zeros(0)] * 2), np.zeros(0)).shape == (0,)


def test_symmetry_labels_equal_pyscf():
    mol = molecule("benzene.xyz", "sto-3g", symmetry=True)
    mf = scf.RHF(mol).run(conv_tol=1e-11)
    sym = symmetry_basis(mol)
    assert sym.group == "D2h" and sym.irrep_names[0] == "Ag"
    e, c, orbsym = sym.eigh(mf.get_fock(), mf.get_ovlp())
    ref = np.asarray(hf_symm.get_orbsym(mol, mf.mo_coeff))
    np.testing.assert_allclose(e, mf.mo_energy, atol=1e-8)
    for label in set(ref.tolist()) | set(orbsym.tolist()):
        np.testing.assert_allclose(np.sort(e[orbsym == label]),
                                   np.sort(mf.mo_energy[ref == label]), atol=1e-8)
    c1 = symmetry_basis(molecule("water.xyz", "sto-3g"))
    assert c1.group == "C1" and c1.irrep_names == {0: "A"}
    linear = gto.M(atom="N 0 0 0; N 0 0 1.1", basis="sto-3g", symmetry=True, verbose=0)
    with pytest.raises(InputError, match="not Abelian"):
        symmetry_basis(linear)


@pytest.mark.parametrize("backend", ["serial", "threads"])
def test_rhf_on_local_contexts_equals_pyscf(backend):
    """Direct: every screened-in task runs once per build (incremental after the first,
    a full build every rebuild_every + 1); incore and auto in one process: the 8-fold
    integrals (no tasks), as many iterations as PySCF (its cycles + the first build)."""
    from tessera.backends.context import Context
    from tessera.backends.local import available_cores, threads_per_rank
    from tessera.chem.scf import rhf
    from tessera.chem.scf.driver import rank_threads

    mol = molecule("water.xyz", "6-31g", symmetry=True)
    mf = scf.RHF(mol)
    mf.verbose, mf.conv_tol = 0, 1e-12
    e = mf.kernel()
    ctx = Context(backend)
    with ctx:
        for mode in ("direct", "incore", "auto"):
            ref = rhf(mol, mode=mode)
            info = ref.info
            assert abs(ref.e_hf - e) < 1e-9, (backend, mode)
            assert info["mode"] == ("direct" if mode == "direct" else "incore")
            if mode != "direct":          # the rank's cores; the serial executor: one
                assert info["threads"] == rank_threads(ctx) == (1 if backend == "serial" else
                                                                threads_per_rank() or available_cores())
            if mode == "direct":
                assert info["tasks_executed"] == [sum(info["tasks_per_build"])]
                assert info["incremental_builds"] == info["fock_builds"] - 1 - (info["fock_builds"] - 1) // 6
                assert info["counter_ops"]["local"] == info["counter_ops"]["remote"] == 0
            else:
                assert "tasks_total" not in info
                assert ref.iterations <= mf.cycles + 1
    ctx.close()


def test_input_errors_before_any_work():
    from tessera.chem.scf import rhf
    from tessera.errors import TesseraError

    radical = gto.M(atom="O 0 0 0; H 0 0 0.97", basis="sto-3g", spin=1, verbose=0)
    with pytest.raises(TesseraError, match="closed-shell only.*9 electrons"):
        rhf(radical)
    water = molecule("water.xyz", "sto-3g")
    with pytest.raises(InputError, match="unknown schedule 'dynamic'"):
        rhf(water, schedule="dynamic")
    with pytest.raises(InputError, match="unknown mode 'disk'"):
        rhf(water, mode="disk")
    with pytest.raises(InputError, match="screening"):
        rhf(water, screening=-1.0)
    with pytest.raises(InputError, match="max_iter"):
        rhf(water, max_iter=0)
