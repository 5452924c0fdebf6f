"""CCSD correlation energies against PySCF's RCCSD on the same molecule, basis and SCF.

Every backend, two tile sizes, with and without frozen core, and with point-group
symmetry on and off. References are computed in the test (PySCF 2.x, conv_tol 1e-10).
"""

import numpy as np
import pytest
from pyscf import cc, lib, scf

from tessera.backends.context import Context
from tessera.chem.ccsd import CCSD
from tessera.chem.integrals import transform
from tessera.chem.job import frozen_core_orbitals
from tessera.chem.molecule import Molecule
from tessera.chem.pyscf_reference import rhf_reference
from tessera.errors import ConvergenceError
from tessera.tensor.pairs import kept_plus_minus

EXAMPLES = "examples/"
MOLECULES = {   # file, basis: C2v, D2h, Cs, C1
    "water": ("water.xyz", "cc-pvdz"),
    "n2": ("n2.xyz", "cc-pvdz"),
    "hocl": ("hocl.xyz", "6-31g"),
    "h2o2": ("h2o2_distorted.xyz", "cc-pvdz"),
}


@pytest.fixture(scope="module")
def systems():
    """name -> (reference, {frozen: PySCF CCSD correlation energy})."""
    out = {}
    with lib.with_omp_threads(1):      # small molecules; OpenMP spinning hurts on a busy machine
        for name, (path, basis) in MOLECULES.items():
            mol = Molecule.from_xyz(EXAMPLES + path, basis=basis).to_pyscf()
            ref = rhf_reference(mol)
            mf = scf.RHF(mol)
            mf.conv_tol = 1e-11
            mf.kernel()
            assert abs(ref.e_hf - mf.e_tot) < 1e-9
            energies = {}
            for nfz in (0, frozen_core_orbitals(mol)):
                mycc = cc.CCSD(mf, frozen=nfz or None)
                mycc.conv_tol = 1e-10
                mycc.kernel()
                energies[nfz] = mycc.e_corr
            out[name] = (ref, energies)
    return out


@pytest.mark.parametrize("backend", ["serial", "threads"])
@pytest.mark.parametrize("name", list(MOLECULES))
def test_ccsd_energy_matches_pyscf(systems, name, backend):
    ref, energies = systems[name]
    for nfz, e_ref in energies.items():
        for tile in (32, 7):
            ints = transform(ref, nfz, tile)
            with Context(backend) as ctx:
                result = CCSD(conv=1e-10).kernel(ints, ctx)
            assert result.converged
            assert abs(result.e_corr - e_ref) < 1e-7, (name, nfz, tile, result.e_corr, e_ref)


def test_symmetry_on_and_off_agree(systems):
    ref_sym, energies = systems["water"]
    mol = Molecule.from_xyz(EXAMPLES + "water.xyz").to_pyscf(symmetry=False)
    ref_c1 = rhf_reference(mol)
    assert ref_c1.point_group == "C1" and ref_sym.point_group == "C2v"
    assert abs(ref_c1.e_hf - ref_sym.e_hf) < 1e-9
    e = {}
    for label, ref in (("sym", ref_sym), ("c1", ref_c1)):
        ints = transform(ref, 0, 8)
        vvvv = ints.tensors["vvvv"]
        canonical = (vvvv.stored_elements, sum(int(np.prod(vvvv.block_shape(k))) for k in vvvv.stored_keys()))
        before = (ints.stored_elements, ints.dense_elements)       # before CCSD frees vvvv
        cc = CCSD(conv=1e-10).kernel(ints, Context("serial"))
        e[label] = cc.e_corr
        # T2 stores one block per mirror pair (ij|ab), (ji|ba): about half, self-mirrors whole
        t2 = cc.t2
        assert t2.stored_elements == sum(int(np.prod(t2.block_shape(k))) for k in t2.stored_keys())
        assert sum(t2.orbit_size(k) * int(np.prod(t2.block_shape(k))) for k in t2.stored_keys()) \
            == sum(int(np.prod(t2.block_shape(k))) for k in t2.allowed_keys())
        assert t2.stored_elements < 0.7 * t2.dense_elements
        if label == "sym":
            assert before[0] < 0.5 * before[1]
        else:     # C1: every class whole, except vvvv in canonical blocks (8-fold, ~1/8 + diagonals)
            assert all(t.stored_elements == t.dense_elements for n, t in ints.tensors.items() if n != "vvvv")
            assert canonical[0] == canonical[1] <= 0.3 * vvvv.dense_elements
            # a local CCSD made the ladder's V+- (canonical halves, diagonal blocks as
            # triangles) and freed vvvv: V+- alone hold its elements, fewer still
            vp, vm = kept_plus_minus(vvvv)
            assert vvvv.stored_elements == 0 and not vvvv.blocks
            assert vp.stored_elements + vm.stored_elements <= 0.3 * vvvv.dense_elements
    assert abs(e["sym"] - e["c1"]) < 1e-8
    assert abs(e["sym"] - energies[0]) < 1e-7


def test_not_converged_reports_last_state(systems):
    ref, _ = systems["water"]
    ints = transform(ref, 0, 32)
    with pytest.raises(ConvergenceError) as info:
        CCSD(conv=1e-10, max_iter=3).kernel(ints, Context("serial"))
    assert "did not converge in 3 iterations" in str(info.value)
    assert len(info.value.result.iterations) == 3
    assert np.isfinite(info.value.result.e_corr)


def test_residual_frees_intermediates_before_the_ladder(monkeypatch):
    """The residual's intermediates (th, taup, taupp, X0, X, u, the Wt1s, W2, Y, Z)
    are no longer referenced when its last group runs (the ladder is one of its updates);
    ovvv, read by products of few columns only, is never gathered (read from its blocks:
    no copy kept beside them); after the first residual of a local CCSD the ladder
    dressing's M+- (gathered in one layout) keep their blocks as views of the kept
    matrices; the energy still equals PySCF's."""
    import weakref

    from tessera.backends import blockops
    from tessera.chem import ccsd_equations as eq
    from tessera.tensor.pairs import kept_plus_minus_last
    mol = Molecule.from_xyz(EXAMPLES + "water.xyz", basis="cc-pvdz").to_pyscf()
    ref = rhf_reference(mol)
    mf = scf.RHF(mol).run(conv_tol=1e-11)
    mycc = cc.CCSD(mf).run(conv_tol=1e-10)
    ints = transform(ref, 0, 32)
    made, checked = {}, []
    new, ladder = eq.new, eq.ladder

    def recording_new(ints_, letters, name, symmetry=None):
        t = new(ints_, letters, name, symmetry)
        made[name] = weakref.ref(t)
        return t

    def checking_ladder(*args):
        if "X" in made:         # in a residual (not the plan of the ladder before the iterations)
            checked.append({n: made[n]() is None for n in ("taup", "taupp", "X0", "X", "u",
                                                           "Wt1_ovov", "Wt1_ovoo", "W2", "Y", "Z")})
        return ladder(*args)

    monkeypatch.setattr(eq, "new", recording_new)
    monkeypatch.setattr(eq, "ladder", checking_ladder)
    gathered, gather_tasks = [], blockops.gather_tasks
    monkeypatch.setattr(blockops, "gather_tasks", lambda ref, *args: gathered.append(ref.tensor.name)
                        or gather_tasks(ref, *args))
    ctx = Context("serial")
    shared = []
    store = ctx.store_constants_gathered

    def storing():
        store()
        for m in kept_plus_minus_last(ints.ovvv):
            kept = [mats for key, mats in ctx._cache.items() if key[1] == m.uid]
            shared.append(bool(kept) and all(any(np.shares_memory(b, x) for x in kept[0].values())
                                             for b in m.blocks.values()))
    monkeypatch.setattr(ctx, "store_constants_gathered", storing)
    result = CCSD(conv=1e-10).kernel(ints, ctx)
    assert checked and all(all(freed.values()) for freed in checked), checked
    assert shared == [True, True]
    assert "ovvv" not in gathered and "ovvv+" in gathered
    assert abs(result.e_corr - mycc.e_corr) < 1e-7
