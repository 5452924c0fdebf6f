"""Whole calculations through `Job` (what `tessera run` does) against PySCF's CCSD(T).

Also: CCSD(T) from Tessera's own RHF equals CCSD(T) from PySCF's RHF to 1e-7 Eh.
"""

import pytest
from pyscf_energies import ccsd_t_energies, rhf

from tessera.chem.job import Job, RunOptions
from tessera.chem.molecule import Molecule


@pytest.fixture(scope="module")
def pyscf_water():
    mf = rhf(Molecule.from_xyz("examples/water.xyz", basis="cc-pvdz").to_pyscf())
    return {frozen: ccsd_t_energies(mf, frozen) for frozen in (0, 1)}


@pytest.mark.parametrize("scf_code", ["pyscf", "tessera"])
@pytest.mark.parametrize("frozen_core", [False, True])
def test_ccsd_t_water(pyscf_water, scf_code, frozen_core):
    e_hf, e_cc, e_t = pyscf_water[int(frozen_core)]
    result = Job(RunOptions("examples/water.xyz", method="ccsd(t)", conv=1e-10, scf=scf_code,
                            frozen_core=frozen_core, tile=4)).kernel()
    e = result.data["energies"]
    assert result.converged
    assert abs(e["hf"] - e_hf) < 1e-9
    assert abs(e["ccsd_correlation"] - e_cc) < 1e-7
    assert abs(e["t_correction"] - e_t) < 1e-7
    assert abs(e["total"] - (e_hf + e_cc + e_t)) < 2e-7
    d = result.data
    assert d["point_group"] == "C2v" and d["nao"] == 24 and d["nocc"] == 5 and d["nvir"] == 19
    assert d["frozen_core"] == int(frozen_core)
    assert 0 < d["storage"]["t2_elements_stored"] < d["storage"]["t2_elements_dense"]
    assert d["flops"]["ccsd_per_iteration"] > 0 and d["flops"]["triples"] > 0
    assert d["flops"]["triples"] == d["flops"]["triples_minimal"] and d["flops"]["triples_over_minimal"] == 1.0
    assert d["flops"]["triples_gflops_per_second"] > 0
    assert [row["iter"] for row in d["iterations"]] == list(range(1, len(d["iterations"]) + 1))


def test_ladder_freed_before_triples(monkeypatch):
    """A run frees the ladder's V+- when CCSD ends: (T) reads no vvvv, and the memory
    estimate counts no V+- in its (T) phase (chem/memory.py)."""
    import gc

    import tessera.chem.job as job
    from tessera.tensor.block_tensor import BlockTensor
    alive, real = [], job.triples_correction

    def spy(*args, **kwargs):
        gc.collect()
        alive.append(sorted(t.name for t in gc.get_objects() if isinstance(t, BlockTensor) and t.name in ("vvvv+", "vvvv-")))
        return real(*args, **kwargs)

    monkeypatch.setattr(job, "triples_correction", spy)
    Job(RunOptions("examples/water.xyz", basis="sto-3g", method="ccsd(t)", tile=4)).kernel()
    assert alive == [[]]


@pytest.mark.parametrize("atoms", ["H 0 0 0; H 0 0 0.74", "He 0 0 0"])
def test_ccsd_t_with_products_no_symmetry_allows(atoms):
    """H2 and He in STO-3G (D2h): one occupied orbital and one virtual of another irrep, or
    no virtual at all, so some of CCSD's contractions have no symmetry-allowed block
    product (they failed during setup and in the executor); energies equal PySCF's (He:
    no excitation, so no correlation)."""
    from pyscf import gto
    mol = gto.M(atom=atoms, basis="sto-3g", verbose=0)
    mf = rhf(mol)
    e_hf, e_cc, e_t = ccsd_t_energies(mf) if mol.nao > mol.nelectron // 2 else (mf.e_tot, 0.0, 0.0)
    xyz = f"{mol.natm}\n\n" + "\n".join(f"{a.split()[0]} {' '.join(a.split()[1:])}" for a in atoms.split(";"))
    e = Job(RunOptions(xyz, basis="sto-3g", method="ccsd(t)", conv=1e-10, checkpoint=None)).kernel().data["energies"]
    assert abs(e["hf"] - e_hf) < 1e-9
    assert abs(e["ccsd_correlation"] - e_cc) < 1e-7 and abs(e["t_correction"] - e_t) < 1e-7
