"""The direct Fock build's incremental (ΔD) builds, its periodic full rebuild and its
density-weighted task and shell-quartet screening, against full builds and PySCF's J - K/2 (no MPI: the
build is the same task set on every context)."""

from pathlib import Path

import numpy as np
import pytest
from pyscf import gto, scf
from pyscf.scf import hf as pyscf_hf

from tessera.backends.context import Context
from tessera.chem.scf.direct import DirectFock
from tessera.chem.scf.fock import FockBuilder
from tessera.chem.scf.incore import IncoreFock, s8_bytes

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.fixture(scope="module")
def trimer():
    atoms = "".join((EXAMPLES / "water_trimer.xyz").read_text().splitlines(True)[2:])
    return gto.M(atom=atoms, basis="6-31g", verbose=0)


def densities(mol, steps, size, seed=7):
    """A guess density and ``steps`` densities each ``size`` (max element) away from the
    previous one: an SCF's sequence in miniature."""
    rng = np.random.default_rng(seed)
    dm = pyscf_hf.init_guess_by_minao(mol)
    out = [dm]
    for _ in range(steps):
        r = rng.standard_normal(dm.shape)
        r = r + r.T
        out.append(out[-1] + size * r / np.abs(r).max())
    return out


def jk(mol, dm):
    vj, vk = scf.hf.get_jk(mol, dm)
    return vj - 0.5 * vk


def builder(mol, ctx, **kw):
    return FockBuilder(mol, ctx, schedule="static", mode="direct", block_nbf=5, **kw)


def test_incremental_and_screened_builds_agree_with_full_rebuilds(trimer):
    """Incremental builds with density-weighted task screening (threshold 1e-11) equal
    full builds without screening to 1e-9, and skip tasks once ΔD is small."""
    dms = densities(trimer, 5, 1e-5)
    with Context("serial") as ctx:
        inc = builder(trimer, ctx, screening=1e-11)
        full = builder(trimer, ctx, screening=0.0, rebuild_every=0)
        for k, dm in enumerate(dms):
            g = inc.build(dm)
            np.testing.assert_allclose(g, full.build(dm), rtol=0, atol=1e-9)
            np.testing.assert_allclose(g, jk(trimer, dm), rtol=0, atol=1e-9)
        hist = inc.history
        assert [h["incremental"] for h in hist] == [False] + [True] * 5
        assert hist[0]["tasks_active"] <= len(inc.tasks)
        assert all(h["tasks_active"] < hist[0]["tasks_active"] for h in hist[1:])
        assert all(not h["incremental"] and h["tasks_active"] == len(full.tasks)
                   for h in full.history)
        inc.free()
        full.free()


def test_quartet_screening_inside_tasks_agrees_with_full_builds(trimer):
    """Inside the tasks that pass the task-level bound, the density-weighted bound of each
    shell quartet excludes quartets (more of them for a small ΔD); the builds still equal
    unscreened full builds to 1e-9, and the screen is the shell-level bound itself."""
    dms = densities(trimer, 3, 1e-6, seed=3)
    with Context("serial") as ctx:
        inc = builder(trimer, ctx, screening=1e-10)
        full = builder(trimer, ctx, screening=0.0, rebuild_every=0)
        for dm in dms:
            np.testing.assert_allclose(inc.build(dm), full.build(dm), rtol=0, atol=1e-9)
        screened = [h["shell_quartets_screened"] for h in inc.history]
        assert all(n > 0 for n in screened[1:]) and screened[1] > screened[0], screened
        assert all(h["shell_quartets_screened"] == 0 for h in full.history)
        # one task's screen against the bound evaluated quartet by quartet
        ddm = dms[1] - dms[0]
        dsh = inc.shell_density(ddm)
        t = inc.tasks
        quartet = t.quartet(len(t) // 2)
        keep = inc.quartet_screen(quartet, dsh)
        sr = inc.blocks.shell_ranges
        loc = inc.blocks.ao_loc
        q = inc.qshell
        for idx in np.ndindex(keep.shape):
            a, b, c, d = (sr[x][0] + i for x, i in zip(quartet, idx))
            dmax = lambda i, j: np.abs(ddm[loc[i]:loc[i + 1], loc[j]:loc[j + 1]]).max()  # noqa: E731
            bound = q[a, b] * q[c, d] * max(4 * dmax(a, b), 4 * dmax(c, d), dmax(a, c),
                                            dmax(b, d), dmax(a, d), dmax(b, c))
            assert keep[idx] == (q[a, b] * q[c, d] >= 1e-10 and bound >= 1e-10)
        inc.free()
        full.free()


def test_periodic_full_rebuild_bounds_the_accumulated_error(trimer):
    """A loose threshold (1e-6) makes every incremental build drop contributions; never
    rebuilding lets the error grow past 1e-9, a rebuild every third build resets it to
    that of one full screened build (7 builds: full rebuilds at the 4th and 7th)."""
    dms = densities(trimer, 6, 1e-3, seed=11)
    with Context("serial") as ctx:
        never = builder(trimer, ctx, screening=1e-6, rebuild_every=None)
        every3 = builder(trimer, ctx, screening=1e-6, rebuild_every=2)
        full = builder(trimer, ctx, screening=1e-6, rebuild_every=0)
        err_never, err_every3 = [], []
        for dm in dms:
            g_full = full.build(dm)
            err_never.append(np.abs(never.build(dm) - g_full).max())
            err_every3.append(np.abs(every3.build(dm) - g_full).max())
        assert [h["incremental"] for h in every3.history] == [False, True, True] * 2 + [False]
        for k in (3, 6):     # full builds: exactly the full screened G; never: drifted
            assert err_every3[k] < 1e-13 and err_never[k] > 1e-9
        assert max(err_every3) < max(err_never)
        for b in (never, every3, full):
            b.free()


def test_incore_8fold_build_equals_pyscf_jk(trimer):
    dm = densities(trimer, 1, 1e-2)[1]
    fock = IncoreFock(trimer, threads=1)
    npair = trimer.nao * (trimer.nao + 1) // 2
    assert fock.nbytes == s8_bytes(trimer.nao) == npair * (npair + 1) // 2 * 8
    np.testing.assert_allclose(fock.build(dm), jk(trimer, dm), rtol=0, atol=1e-11)
    fock.free()


@pytest.fixture(scope="module")
def benzene():
    atoms = "".join((EXAMPLES / "benzene.xyz").read_text().splitlines(True)[2:])
    return gto.M(atom=atoms, basis="sto-3g", symmetry=True, verbose=0)


def direct(mol, ctx, **kw):
    return DirectFock(mol, ctx, schedule="static", **kw)


@pytest.mark.parametrize("name,backend,threads", [("benzene", "serial", 1), ("trimer", "serial", 1),
                                                  ("benzene", "threads", 2), ("trimer", "threads", 1)])
def test_direct_skeleton_incremental_screened_builds_agree_with_full_rebuilds(name, backend, threads, request):
    """The direct build from the symmetry-unique quartets (benzene D2h: 8 operations;
    the C1 trimer: the identity alone), incremental with density-weighted screening,
    equals unscreened full builds and PySCF's J - K/2 to 1e-9 for a sequence of
    invariant densities, and screens more quartets once ΔD is small; also with tasks on
    a threads executor's workers and with threads of its own inside a task."""
    mol = request.getfixturevalue(name)
    with Context(backend) as ctx:
        inc = direct(mol, ctx, screening=1e-11, threads=threads)
        full = direct(mol, ctx, screening=0.0, rebuild_every=0)
        for dm in densities(mol, 4, 1e-5):
            dm = inc.skeleton.symmetrize(dm)
            g = inc.build(dm)
            np.testing.assert_allclose(g, full.build(dm), rtol=0, atol=1e-9)
            np.testing.assert_allclose(g, jk(mol, dm), rtol=0, atol=1e-9)
        hist = inc.history
        assert [h["incremental"] for h in hist] == [False] + [True] * 4
        assert all(h["skeleton"] == (name == "benzene") for h in hist + full.history)
        assert all(h["shell_quartets_screened"] > hist[0]["shell_quartets_screened"] for h in hist[1:])
        assert all(h["shell_quartets_screened"] == 0 for h in full.history)
        assert all(h["tasks"] == len(inc.ranges) for h in hist)
        inc.free()
        full.free()


def test_direct_skeleton_computes_one_quartet_per_orbit(benzene):
    """For an invariant density benzene's build computes the representatives alone (those
    the in-memory build keeps; about 1/4 of the quartets for planar D2h); a density the group changes is built from every quartet
    (the identity alone) and still equals PySCF's."""
    dm = pyscf_hf.init_guess_by_minao(benzene)
    with Context("serial") as ctx:
        fock = direct(benzene, ctx, screening=0.0, rebuild_every=0)
        dm = fock.skeleton.symmetrize(dm)
        np.testing.assert_allclose(fock.build(dm), jk(benzene, dm), rtol=0, atol=1e-10)
        broken = dm + 1e-3 * np.eye(len(dm))[::-1]
        np.testing.assert_allclose(fock.build(broken), jk(benzene, broken), rtol=0, atol=1e-10)
        sym, every = fock.history
        assert sym["skeleton"] and not every["skeleton"]
        nsp = benzene.nbas * (benzene.nbas + 1) // 2
        assert every["shell_quartets_computed"] == nsp * (nsp + 1) // 2
        assert sym["shell_quartets_computed"] < 0.3 * every["shell_quartets_computed"]
        kept = IncoreFock(benzene).skeleton.orbit
        assert sym["shell_quartets_computed"] == np.count_nonzero(kept)
        fock.free()


def test_direct_skeleton_periodic_full_rebuild(benzene):
    """A loose threshold (1e-6): never rebuilding drifts past 1e-9, a full build every
    third resets the error to that of one full screened build (7 builds: full rebuilds at
    the 4th and 7th)."""
    with Context("serial") as ctx:
        never = direct(benzene, ctx, screening=1e-6, rebuild_every=None)
        every3 = direct(benzene, ctx, screening=1e-6, rebuild_every=2)
        full = direct(benzene, ctx, screening=1e-6, rebuild_every=0)
        err_never, err_every3 = [], []
        for dm in densities(benzene, 6, 1e-3, seed=11):
            dm = full.skeleton.symmetrize(dm)
            g_full = full.build(dm)
            err_never.append(np.abs(never.build(dm) - g_full).max())
            err_every3.append(np.abs(every3.build(dm) - g_full).max())
        assert [h["incremental"] for h in every3.history] == [False, True, True] * 2 + [False]
        for k in (3, 6):
            assert err_every3[k] < 1e-13 and err_never[k] > 1e-9
        for b in (never, every3, full):
            b.free()
