"""Plans: symmetry-allowed block tasks only, large GEMMs per sector, printable costs."""

import numpy as np

import tessera as ts
from tessera import BlockTensor, IndexSpace
from tessera.backends.context import PlanningContext
from tessera.cli.main import main


def test_sector_gemm_flops_count_only_allowed_blocks():
    rng = np.random.default_rng(0)
    irr_o, irr_v = rng.integers(0, 8, 10), rng.integers(0, 8, 30)
    flops = {}
    for label, (io, iv) in {"D2h": (irr_o, irr_v), "C1": (0 * irr_o, 0 * irr_v)}.items():
        o, v = IndexSpace.from_irreps("o", io, 4), IndexSpace.from_irreps("v", iv, 4)
        W, tau = BlockTensor((v,) * 4, 0, name="W"), BlockTensor((o, o, v, v), 0, name="tau")
        R = BlockTensor((o, o, v, v), 0, name="R")
        ctx = PlanningContext()
        with ctx:
            R["ijab"] += W["abcd"] * tau["ijcd"]
        (plan,) = ctx.plans
        (step,) = plan.steps
        # one GEMM per symmetry sector of the contracted pair (c, d), never one per block
        assert len(step.sectors) == len({a ^ b for a in set(iv) for b in set(iv)}) if label == "D2h" else 1
        counts = {g: (io == g).sum() for g in range(8)}, {g: (iv == g).sum() for g in range(8)}
        exact = sum(2 * counts[0][gi] * counts[0][gj] * counts[1][ga] * counts[1][gb] * counts[1][gc]
                    * counts[1][ga ^ gb ^ gc]
                    for gi in range(8) for gj in range(8) for ga in range(8) for gb in range(8)
                    for gc in range(8) if (ga ^ gb) == (gi ^ gj)) if label == "D2h" else 2 * 10**2 * 30**4
        assert plan.flops == exact
        flops[label] = plan.flops
        assert "R[ijab] +=" in plan.render()
    assert flops["D2h"] < flops["C1"] / 16


def test_plan_command_prints_costs(capsys):
    assert main(["plan", "examples/water.xyz", "--basis", "sto-3g"]) == 0
    out = capsys.readouterr().out
    assert "flops" in out and "CCSD iteration:" in out and "vvvv[acbd]" in out
