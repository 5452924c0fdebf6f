"""Structure of distributed execution, without MPI: ownership, block tasks, cost model.

(The MPI runs themselves are in tests/test_distributed_mpi.py.)
"""

import numpy as np
import pytest

import tessera as ts
from tessera import BlockTensor, IndexSpace
from tessera.backends.auto import check_options, decide, grid_shape, render, structure_stats
from tessera.backends.collective import _summa_layout
from tessera.backends.context import PlanningContext
from tessera.backends.distributed import contiguous_runs, owner_map
from tessera.chem.integrals import make_spaces
from tessera.errors import InputError
from tessera.plan.blocktasks import contraction_tasks, hadamard_pairs


def spaces(seed, nirrep=4):
    rng = np.random.default_rng(seed)
    o = IndexSpace.from_irreps("o", rng.integers(0, nirrep, 7), 3)
    v = IndexSpace.from_irreps("v", rng.integers(0, nirrep, 11), 4)
    return o, v


@pytest.mark.parametrize("nranks", [1, 2, 3, 4, 7])
def test_owner_maps_deterministic_and_balanced(nranks):
    o, v = spaces(1)
    sp = (o, o, v, v)
    keys = BlockTensor(sp, 0).allowed_keys()
    for placement in ("balanced", "pairs"):
        own = owner_map(sp, 0, keys, nranks, placement)
        assert own == owner_map(sp, 0, keys, nranks, placement)
        assert set(own) == set(keys) and set(own.values()) <= set(range(nranks))
        if placement == "pairs":      # one owner per first-pair group: one rank transforms it
            groups = {}
            for k, r in own.items():
                groups.setdefault(k[:2], set()).add(r)
            assert all(len(g) == 1 for g in groups.values())
    sizes = {k: int(np.prod(BlockTensor(sp, 0).block_shape(k))) for k in keys}
    loads = [0] * nranks
    for k, r in owner_map(sp, 0, keys, nranks, "balanced").items():
        loads[r] += sizes[k]
    assert max(loads) <= sum(loads) / nranks + max(sizes.values())   # LPT bound


def test_contiguous_runs():
    assert contiguous_runs([1] * 8, 4) == [0, 0, 1, 1, 2, 2, 3, 3]
    runs = contiguous_runs([5, 1, 1, 1, 1, 1], 2)
    assert runs == sorted(runs) and runs[0] == 0 and runs[-1] == 1
    assert contiguous_runs([3, 3], 4) == sorted(contiguous_runs([3, 3], 4))


@pytest.mark.parametrize("expr", ["acbd,ijcd->ijab", "akic,kjcb->ijab", "kcld,ilcd->ki", "ia,jb->ijab",
                                  "iajm,mkbc->ijkabc"])
def test_block_tasks_cover_the_sector_gemms(expr):
    """Block tasks of a contraction do exactly the step's flops, each output block once,
    and only with blocks that symmetry allows."""
    o, v = spaces(3)
    ins, out = expr.split("->")
    rng = np.random.default_rng(0)
    tens = [BlockTensor.random(tuple(o if c in "ijklm" else v for c in s), int(rng.integers(0, 4)), rng=rng)
            for s in ins.split(",")]
    ctx = PlanningContext()
    with ctx:
        ts.einsum(expr, *tens)
    (step,) = ctx.plans[0].steps
    tasks = contraction_tasks(step)
    assert sum(t.flops for t in tasks) == step.flops
    outs = [t.out for t in tasks]
    assert len(outs) == len(set(outs))
    A, B = tens
    for t in tasks:
        assert step.out.tensor.is_allowed(t.out)
        for p in t.products:
            assert A.is_allowed(p.a) and B.is_allowed(p.b)


def test_hadamard_pairs_match_allowed_blocks():
    o, v = spaces(5)
    rng = np.random.default_rng(1)
    a = BlockTensor.random((o, o, v, v), 0, rng=rng)
    ctx = PlanningContext()
    with ctx:
        ts.einsum("ijab,ijab->ijab", a, a)
    (step,) = ctx.plans[0].steps
    pairs = hadamard_pairs(step)
    assert set(pairs) == set(a.allowed_keys())
    assert all(p == [(k, k)] for k, p in pairs.items())


@pytest.mark.parametrize("nranks", [1, 2, 3, 4, 6])
def test_summa_layout_places_every_block_once(nranks):
    o, v = spaces(7)
    rng = np.random.default_rng(2)
    W, tau = BlockTensor.random((v,) * 4, 0, rng=rng), BlockTensor.random((o, o, v, v), 0, rng=rng)
    ctx = PlanningContext()
    with ctx:
        ts.einsum("acbd,ijcd->ijab", W, tau)
    (step,) = ctx.plans[0].steps
    pr, pc = grid_shape(nranks)
    assert pr * pc == nranks and pr <= pc
    sig = tuple((s.irrep, s.rows, s.inner, s.cols) for s in step.sectors)
    lay = _summa_layout(sig, step.perms["a"], step.perms["b"], pr, pc)
    a_keys = [k for k, _, _ in lay["a_homes"]]
    assert len(a_keys) == len(set(a_keys)) and set(a_keys) <= set(W.allowed_keys() + tau.allowed_keys())
    outs = sum(len(lay["out"][n][r][c]) for n in range(len(sig)) for r in range(pr) for c in range(pc))
    assert outs == len(contraction_tasks(step))


def test_cost_model_decides_and_renders():
    rng = np.random.default_rng(4)
    orbsym = np.sort(rng.integers(0, 4, 30))
    stats = structure_stats(orbsym, 8, 0, 6, 4)
    assert stats["flops"] > 0 and stats["products"] >= stats["out_tasks"] > 0
    assert stats["memory_max_over_mean"] >= 1.0
    d = decide(orbsym, 8, 0, 4, rate=5e9)
    assert d["backend"] in ("mpi-onesided", "mpi-collective") and d["tile"] > 0
    assert (d["schedule"] is None) == (d["backend"] == "mpi-collective")
    assert d["candidates"][0]["seconds"] == d["estimated_seconds_per_iteration"]
    assert "auto decision on 4 rank(s)" in render(d)
    forced = decide(orbsym, 8, 0, 2, backend="mpi-onesided", variant="inverted", schedule="steal", tile=5,
                    rate=5e9)
    assert (forced["backend"], forced["variant"], forced["schedule"], forced["tile"]) == \
        ("mpi-onesided", "inverted", "steal", 5)
    # the model's cached variant never estimates more gets than original
    c = {x["variant"]: x for x in decide(orbsym, 8, 0, 4, backend="mpi-onesided", tile=4, rate=5e9)["candidates"]}
    assert c["cached"]["gets"] <= c["original"]["gets"] and c["inverted"]["accs"] >= c["original"]["accs"]


@pytest.mark.parametrize("backend, variant, schedule", [
    ("threads", "cached", None), ("serial", None, "nxtval"), ("mpi-onesided", "summa", None),
    ("mpi-onesided", "sideways", None), ("mpi-collective", "cached", None), ("mpi-collective", None, "steal"),
    ("mpi-onesided", None, "sometimes"), ("auto", "summa", "nxtval")])
def test_bad_option_combinations(backend, variant, schedule):
    with pytest.raises(InputError):
        check_options(backend, variant, schedule)


def test_even_tiles():
    o, v = make_spaces([0] * 5 + [0] * 13, 5, 0, 12)
    assert [t.size for t in v.tiles] == [7, 6]
    assert sorted(v.orbitals.tolist()) == list(range(13))
    with pytest.raises(InputError):
        make_spaces([0] * 10, 5, 0, 0)
