"""Plans: symmetry-allowed block tasks only, large GEMMs per sector, printable costs."""

import numpy as np

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


def _term_flops(order, dims):
    """Dense flops of a three-factor contraction done in ``order`` (hand count)."""
    flops = 0
    for pair in order:
        flops += 2 * int(np.prod([dims[ch] for ch in set("".join(pair))]))
    return flops


def test_pairing_order_is_the_cheapest_path_and_runs_right():
    """R[ijab] -= W[kdac] t[kb] tau[ijcd]: the cheapest-first-pair rule picks (W t), an
    o v^4 product; the cheapest path contracts W with tau first (o^3 v^3)."""
    rng = np.random.default_rng(3)
    o, v = IndexSpace.from_irreps("o", np.zeros(4, int), 4), IndexSpace.from_irreps("v", np.zeros(12, int), 12)
    W, t = BlockTensor.random((o, v, v, v), rng=rng, name="W"), BlockTensor.random((o, v), rng=rng, name="t")
    tau, R = BlockTensor.random((o, o, v, v), rng=rng, name="tau"), BlockTensor((o, o, v, v), 0, name="R")
    ctx = PlanningContext()
    with ctx:
        R["ijab"] -= W["kdac"] * t["kb"] * tau["ijcd"]
    (plan,) = ctx.plans
    dims = dict.fromkeys("ijk", 4) | dict.fromkeys("abcd", 12)
    by_hand = {"W tau first": _term_flops(["kdacijcd", "kaijkb"], dims),
               "W t first": _term_flops(["kdackb", "dacbijcd"], dims),
               "t tau first": _term_flops(["kbijcd", "kdackbijcd"], dims)}
    assert plan.flops == min(by_hand.values()) == by_hand["W tau first"]
    (choice,) = plan.choices
    assert sorted(f for _, f, _ in choice.paths) == sorted(by_hand.values())
    assert "chosen" in plan.render_paths()
    R["ijab"] -= W["kdac"] * t["kb"] * tau["ijcd"]
    ref = -np.einsum("kdac,kb,ijcd->ijab", W.to_dense(), t.to_dense(), tau.to_dense())
    np.testing.assert_allclose(R.to_dense(), ref, atol=1e-10)


def test_reused_plan_rebinds_new_tensors_and_keeps_no_data(monkeypatch):
    """A local context plans a structure once (``plan.reuse.reused_plan``) and runs it
    again on new tensors of that structure, with new temporaries: the ladder in the +/-
    form (pair tensors, V+- of a frozen W) and a three-factor term (an intermediate), on
    new random data each time, equal numpy.einsum; the kept template holds none of the
    first run's tensors."""
    import gc
    import weakref

    import tessera as ts
    from tessera.backends import context
    from tessera.plan import reuse
    from tessera.plan.planner import plan_updates

    rng = np.random.default_rng(7)
    o, v = IndexSpace.from_irreps("o", rng.integers(0, 4, 5), 2), IndexSpace.from_irreps("v", rng.integers(0, 4, 8), 3)
    sym = (ts.PermutationalSymmetry((1, 0, 3, 2)),)
    W_d = BlockTensor.random((v,) * 4, rng=rng).to_dense()
    W_d = W_d + W_d.transpose(2, 3, 0, 1)        # W[acbd] = W[bdac]: (ac|bd) = (bd|ac), as the +/- ladder needs
    W = BlockTensor.from_dense(W_d, (v,) * 4, 0, name="W", symmetry=(ts.PermutationalSymmetry((2, 3, 0, 1)),)).freeze()
    A = BlockTensor.random((o, v, v, v), rng=rng, name="A").freeze()
    plans, planned = [], []
    monkeypatch.setattr(context, "reused_plan", lambda updates: plans.append(reuse.reused_plan(updates)) or plans[-1])
    monkeypatch.setattr(reuse, "_templates", reuse.OrderedDict())
    monkeypatch.setattr(reuse, "plan_updates", lambda updates: planned.append(1) or plan_updates(updates))
    earlier = []
    with ts.Context("serial"):
        for run in range(3):
            x = BlockTensor.random((o, o, v, v), rng=rng).to_dense()
            tau_d = x + x.transpose(1, 0, 3, 2)
            tau = BlockTensor.from_dense(tau_d, (o, o, v, v), name="tau", symmetry=sym, canonical=True)
            t = BlockTensor.random((o, v), rng=rng, name="t")
            R = BlockTensor((o, o, v, v), name="R", symmetry=sym, canonical=True)
            Z = BlockTensor((o, o, v, v), name="Z")
            with ts.equations():
                R["ijab"] = 0.7 * W["acbd"] * tau["ijcd"]
                Z["ijab"] = -A["kcdb"] * tau["ijcd"] * t["ka"]
            np.testing.assert_allclose(R.to_dense(), 0.7 * np.einsum("acbd,ijcd->ijab", W_d, tau_d), atol=1e-11)
            np.testing.assert_allclose(Z.to_dense(), -np.einsum("kcdb,ijcd,ka->ijab", A.to_dense(), tau_d,
                                                                t.to_dense()), atol=1e-11)
            tensors = {r.tensor for st in plans[-1].steps for r in (st.out, *st.inputs) if not r.tensor.constant}
            if run == 0:
                kept = len(reuse._templates)
            else:                   # planned once; new temporaries every time
                assert len(reuse._templates) == kept and len(planned) == 1
                assert not {r() for r in earlier} & tensors
                assert any(st.pairs == "plus_pack" for st in plans[-1].steps)
            earlier += [weakref.ref(x) for x in tensors]
        with ts.equations():        # another scale: another structure, planned anew
            R["ijab"] = 0.8 * W["acbd"] * tau["ijcd"]
        np.testing.assert_allclose(R.to_dense(), 0.8 * np.einsum("acbd,ijcd->ijab", W_d, tau_d), atol=1e-11)
        assert len(planned) == 2
    plans.clear()
    del tau, t, R, Z, x, tensors
    gc.collect()
    assert all(r() is None for r in earlier)      # the template keeps no tensor (nor its data) alive
