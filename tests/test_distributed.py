"""Structure of distributed execution, without MPI: ownership, block tasks, cost model.

(The MPI runs themselves are in tests/test_distributed_mpi.py.)
"""

from types import SimpleNamespace

import numpy as np
import pytest

import tessera as ts
from tessera import BlockTensor, IndexSpace
from tessera.backends.auto import decide, render
from tessera.backends.collective_model import grid_of
from tessera.backends.registry import check_options
from tessera.chem.ccsd import CCSDStructure
from tessera.backends.collective import CollectiveExecutor
from tessera.backends.summa_layout import cell_layout, summa_layout
from tessera.backends.context import PlanningContext
from tessera.backends.tasks import part_slice
from tessera.runtime.distribution import block_owners as owner_map, contiguous_runs, default_layers, grid_shape
from tessera.chem.integrals import make_spaces
from tessera.errors import InputError
from tessera.plan.blocktasks import (invert_key, contraction_tasks, hadamard_block_pairs, hadamard_pairs, indexed_groups,
                                     indexed_tasks, task_arrays)


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
    own = owner_map(sp, 0, keys, nranks, "balanced")
    assert own == owner_map(sp, 0, keys, nranks, "balanced")
    assert set(own) == set(keys) and set(own.values()) <= set(range(nranks))
    sizes = {k: int(np.prod(BlockTensor(sp, 0).block_shape(k))) for k in keys}
    loads = [0] * nranks
    for k, r in owner_map(sp, 0, keys, nranks, "balanced").items():
        loads[r] += sizes[k]
    assert max(loads) - min(loads) <= max(sizes.values())   # within one block of each other


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


def test_indexed_tasks_are_the_contraction_tasks():
    """``indexed_tasks`` (mpi-onesided original's tasks by index: task i found by
    arithmetic, made when asked) is ``contraction_tasks`` task by task, with every task's
    flops, for every contraction of a CCSD iteration in four irreps (canonical outputs,
    whose aliases are left out, among them); out of range is an IndexError."""
    rng = np.random.default_rng(3)
    run = CCSDStructure(np.sort(rng.integers(0, 4, 26)), 8, 0, distributed=True)(6, 4)
    steps = [s for p in run.plans for s in p.steps if s.kind == "contract"]
    aliased = 0
    for step in steps:
        whole, indexed = contraction_tasks(step), indexed_tasks(step)
        assert len(indexed) == len(whole)
        assert [indexed[i] for i in range(len(whole))] == list(whole)
        assert indexed.flops.tolist() == [t.flops for t in whole]
        with pytest.raises(IndexError):
            indexed[len(whole)]
        aliased += bool(step.out.tensor.aliases)
    assert aliased


def test_indexed_groups_are_the_products_grouped_by_block():
    """``indexed_groups`` (mpi-onesided inverted's groups by index) is every product of
    ``contraction_tasks`` grouped by its A block, or its B block, in key order, each
    group's (task, product) items in task order, with each group's flops, for every
    contraction of a CCSD iteration in four irreps (canonical outputs among them)."""
    rng = np.random.default_rng(4)
    run = CCSDStructure(np.sort(rng.integers(0, 4, 26)), 8, 0, distributed=True)(6, 4)
    steps = [s for p in run.plans for s in p.steps if s.kind == "contract"]
    for step in steps:
        for by_a in (True, False):
            whole: dict = {}
            for t in contraction_tasks(step):
                for p in t.products:
                    whole.setdefault(p.a if by_a else p.b, []).append((t, p))
            groups = indexed_groups(step, by_a)
            # each item's task holds the group's product alone (the part of it the group runs)
            assert [groups[g] for g in range(len(groups))] == \
                [(key, [(t._replace(products=(p,)), p) for t, p in items]) for key, items in sorted(whole.items())]
            assert groups.flops.tolist() == [sum(2 * t.m * p.k * t.n for t, p in items) for _, items in sorted(whole.items())]
    assert any(s.out.tensor.aliases for s in steps)


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
    # one output block's pairs, made alone (what a rank lists of its own outputs)
    assert all(hadamard_block_pairs(step, k) == p for k, p in pairs.items())


def contraction_step(expr, seed):
    """A planned contraction of random tensors; seed 0: one occupied tile of 5 orbitals
    in one irrep (a sector with a single occupied inner tuple)."""
    if seed == 0:
        o = IndexSpace.from_irreps("o", [0] * 5, 5)
        v = IndexSpace.from_irreps("v", np.random.default_rng(0).integers(0, 2, 9), 3)
    else:
        o, v = spaces(seed)
    rng = np.random.default_rng(seed)
    ins = expr.split("->")[0].split(",")
    tens = [BlockTensor.random(tuple(o if c in "ijklm" else v for c in s), int(rng.integers(0, 4)) if seed else 0,
                               rng=rng) for s in ins]
    ctx = PlanningContext()
    with ctx:
        ts.einsum(expr, *tens)
    (step,) = ctx.plans[0].steps
    return step, tens


@pytest.mark.parametrize("nranks", [1, 2, 3, 4, 6])
def test_summa_layout_places_every_block_once(nranks):
    step, (W, tau) = contraction_step("acbd,ijcd->ijab", 7)
    pr, pc = grid_shape(nranks)
    assert pr * pc == nranks and pr <= pc
    sig = tuple((s.irrep, s.rows, s.inner, s.cols) for s in step.sectors)
    lay = summa_layout(sig, step.perms["a"], step.perms["b"], pr, pc)
    a_keys = [k for k, _, _, _, _ in lay["a_homes"]]
    assert len(a_keys) == len(set(a_keys)) and set(a_keys) <= set(W.allowed_keys() + tau.allowed_keys())
    assert {(part, layer) for _, part, layer, _, _ in lay["a_homes"] + lay["b_homes"]} == {(None, 0)}
    outs = sum(len(lay["out"][n][r][c]) for n in range(len(sig)) for r in range(pr) for c in range(pc))
    assert outs == len(contraction_tasks(step))


@pytest.mark.parametrize("expr, seed", [("acbd,ijcd->ijab", 11), ("akic,kjcb->ijab", 12), ("kdac,kb->abcd", 0),
                                        ("ia,jb->ijab", 15)])
@pytest.mark.parametrize("pr, pc, layers", [(1, 1, 1), (2, 3, 1), (1, 2, 2), (2, 2, 3)])
def test_cell_layout_is_its_cell_of_summa_layout(expr, seed, pr, pc, layers):
    """``cell_layout`` (what one rank of the grid makes, from the deal alone) is its cell's
    part of the whole ``summa_layout``, for every cell: its rectangle, its panels' inner
    widths and sizes, its row's A and column's B pack entries, its output tile pairs, the
    grid's strip bytes (cut inner tuples at seed 0 with layers)."""
    step, _ = contraction_step(expr, seed)
    sig = tuple((s.irrep, s.rows, s.inner, s.cols) for s in step.sectors)
    pa, pb = step.perms["a"], step.perms["b"]
    lay = summa_layout(sig, pa, pb, pr, pc, layers)
    panels, sectors = range(lay["npanel"]), range(len(sig))
    for l_ in range(layers):
        for g in range(pr):
            for h in range(pc):
                assert cell_layout(sig, pa, pb, pr, pc, layers, l_, g, h) == {
                    "npanel": lay["npanel"], "active": [lay["active"][n][l_] for n in sectors],
                    "row_total": [lay["row_total"][n][g] for n in sectors],
                    "col_total": [lay["col_total"][n][h] for n in sectors],
                    "panel_inner": [lay["panel_inner"][n][l_] for n in sectors],
                    "a_pack": [[lay["a_pack"][n][l_][p][g] for p in panels] for n in sectors],
                    "b_pack": [[lay["b_pack"][n][l_][p][h] for p in panels] for n in sectors],
                    "out": [lay["out"][n][g][h] for n in sectors],
                    "a_panel_size": [lay["a_panel_size"][l_][p][g] for p in panels],
                    "b_panel_size": [lay["b_panel_size"][l_][p][h] for p in panels],
                    "a_strip_bytes": lay["a_strip_bytes"], "b_strip_bytes": lay["b_strip_bytes"]}


def test_default_layers_and_grids():
    assert [default_layers(p) for p in (1, 2, 3, 4, 6, 8, 12, 16, 27, 64)] == [1, 2, 3, 2, 2, 2, 3, 4, 3, 4]
    for p in range(1, 33):
        for variant in ("summa", "2.5d"):
            pr, pc, c = grid_of(p, variant)
            assert pr * pc * c == p and pr <= pc and (c == 1 or variant == "2.5d")


@pytest.mark.parametrize("expr, seed", [("acbd,ijcd->ijab", 11), ("akic,kjcb->ijab", 12),
                                        ("kcld,ilcd->ki", 13), ("iajm,mkbc->ijkabc", 14),
                                        ("kdac,kb->abcd", 0), ("ka,kb->ab", 0), ("ia,jb->ijab", 15)])
@pytest.mark.parametrize("pr, pc, layers", [(1, 1, 1), (1, 2, 2), (2, 2, 1), (1, 1, 4), (1, 3, 2), (2, 2, 3)])
def test_25d_layout_covers_every_inner_panel_once(expr, seed, pr, pc, layers):
    """For random sector signatures: over all layers every inner tuple (or its parts, when
    one tuple is larger than a layer's share: seed 0 has a single occupied tile) lies in
    exactly one (layer, panel), the panels tile the inner dimension without overlap,
    every input block (part) has one home in the layer of its unit, and running the
    layout (each layer's SUMMA, then the sum over layers at the owners, emulated here)
    gives numpy.einsum."""
    step, (A, B) = contraction_step(expr, seed)
    sig = tuple((s.irrep, s.rows, s.inner, s.cols) for s in step.sectors)
    pa, pb, pcp = step.perms["a"], step.perms["b"], step.perms["c"]
    assert sig, "no sector: the test would check nothing"
    lay = summa_layout(sig, pa, pb, pr, pc, layers)
    npanel = lay["npanel"]
    homes_a = {(k, part): (l_, r, c) for k, part, l_, r, c in lay["a_homes"]}
    homes_b = {(k, part): (l_, r, c) for k, part, l_, r, c in lay["b_homes"]}
    assert len(homes_a) == len(lay["a_homes"]) and len(homes_b) == len(lay["b_homes"])
    split = False
    for n, (_, rows, inner, cols) in enumerate(sig):
        units, place = lay["units"][n], lay["inner_panel"][n]
        assert len(place) == len(units)
        assert sum(map(sum, lay["panel_inner"][n])) == inner.total
        # every orbital row of every inner tuple in exactly one unit
        first = [shape[0] if shape else 1 for shape in inner.shapes]     # an outer product: ()
        rows_of = {q: [] for q in range(len(inner.tuples))}
        for q, part in units:
            rows_of[q] += list(range(*part)) if part else list(range(first[q]))
        assert rows_of == {q: list(range(first[q])) for q in rows_of}
        split |= any(part is not None for _, part in units)
        covered = {}
        for l_ in range(layers):
            for p in range(npanel):
                spans = sorted({(io, ks) for g in range(pr) for _, _, _, io, _, ks in lay["a_pack"][n][l_][p][g]})
                here = [u for u, lp in enumerate(place) if lp == (l_, p)]
                pos = 0
                for io, ks in spans:       # contiguous, no overlap
                    assert io == pos
                    pos += ks
                assert pos == lay["panel_inner"][n][l_][p]
                for u in here:
                    covered[u] = covered.get(u, 0) + 1
            assert lay["active"][n][l_] == (sum(lay["panel_inner"][n][l_]) > 0)
        assert covered == {u: 1 for u in range(len(units))}
        loads = [sum(lay["panel_inner"][n][l_]) for l_ in range(layers)]
        assert max(loads) - min(loads) <= max(inner.sizes)          # greedy by size
        if layers > 1 and len(inner.tuples) == 1 and first[0] >= layers:
            assert min(loads) > 0                                    # a single tuple is cut
        for r, rk in enumerate(rows.tuples):
            for u, (q, part) in enumerate(units):
                apart = None if part is None else (pa[len(rk)], *part)
                assert homes_a[(invert_key(rk + inner.tuples[q], pa), apart)][0] == place[u][0]
    if expr == "ka,kb->ab" and layers > 1:
        assert split
    # emulate every rank of the grid as the executor runs it: its own cell's layout and packing
    ga = SimpleNamespace(eid=1)
    shim_a, shim_b = SimpleNamespace(dist=SimpleNamespace(ga=ga)), SimpleNamespace(dist=SimpleNamespace(ga=ga))
    def home(t, homes):
        out = {}
        for k, part in homes:
            blk = t.blocks.get(k, np.zeros(t.block_shape(k)))
            out[(1, k) if part is None else (1, k, part)] = blk if part is None else \
                blk[part_slice(blk.ndim, part)]
        return out

    home_a, home_b = home(A, homes_a), home(B, homes_b)
    out = {}
    for l_ in range(layers):
        for gr in range(pr):
            for gc in range(pc):
                cell = cell_layout(sig, pa, pb, pr, pc, layers, l_, gr, gc)     # what that rank makes
                cmat = [np.zeros((cell["row_total"][n], cell["col_total"][n])) for n in range(len(sig))]
                for p in range(npanel):
                    abuf = np.empty(cell["a_panel_size"][p])
                    bbuf = np.empty(cell["b_panel_size"][p])
                    CollectiveExecutor._pack(abuf, cell, "a", p, shim_a, home_a, pa)
                    CollectiveExecutor._pack(bbuf, cell, "b", p, shim_b, home_b, pb)
                    aoff = boff = 0
                    for n in range(len(sig)):
                        m, k, nc = cell["row_total"][n], cell["panel_inner"][n][p], cell["col_total"][n]
                        cmat[n] += abuf[aoff:aoff + m * k].reshape(m, k) @ bbuf[boff:boff + k * nc].reshape(k, nc)
                        aoff, boff = aoff + m * k, boff + k * nc
                for n, (_, rows, _, cols) in enumerate(sig):
                    for r, c, ro, co in cell["out"][n]:
                        okey = tuple((rows.tuples[r] + cols.tuples[c])[q] for q in pcp)
                        blk = cmat[n][ro:ro + rows.sizes[r], co:co + cols.sizes[c]]
                        res = blk.reshape(rows.shapes[r] + cols.shapes[c]).transpose(pcp)
                        out[okey] = out.get(okey, 0) + res
    C = step.out.tensor.like()
    for okey, blk in out.items():
        C.set_block(okey, blk)
    ref = np.einsum(expr, A.to_dense(), B.to_dense())
    assert np.allclose(C.to_dense(), ref, atol=1e-12 * max(1.0, np.abs(ref).max()))


def test_cost_model_per_contraction_and_memory(monkeypatch):
    """The collective model runs every contraction as the executor does (its grid, or an
    operand stationary where that costs less): the modes cover every contraction step,
    broadcasts only where some run on the grid (on 16 ranks some do).
    A candidate over the memory budget is not chosen unless asked for, and --plan-only's
    table shows the layers and the memory estimate."""
    from tessera.backends.iteration_counts import structure_stats
    rng = np.random.default_rng(4)
    orbsym = np.sort(rng.integers(0, 4, 30))
    structure = CCSDStructure(orbsym, 8, 0)
    d = decide(structure, 4, backend="mpi-collective", tile=6, rate=5e9)
    cand = {c["variant"]: c for c in d["candidates"]}
    assert set(cand) == {"summa", "2.5d"} and cand["2.5d"]["layers"] == 2 and cand["summa"]["layers"] == 1
    steps = structure_stats(structure, 6, 6, 4)["contract_steps"]
    for c in cand.values():
        assert sum(c["contraction_modes"].values()) == steps and c["bytes_per_rank"] > 0
        assert set(c["contraction_modes"]) - {"summa"}         # some operand kept stationary
        assert (c["bcast_bytes_per_rank"] > 0) == ("summa" in c["contraction_modes"])
    assert "c=2" in render(d) and "MiB allowed" in render(d)
    wide = {c["variant"]: c for c in decide(structure, 16, backend="mpi-collective", tile=6, rate=5e9)["candidates"]}
    assert all(c["contraction_modes"].get("summa", 0) > 0 and c["bcast_bytes_per_rank"] > 0 for c in wide.values())
    lo, hi = sorted(c["memory_per_rank"] for c in wide.values())
    assert lo < hi
    monkeypatch.setenv("TESSERA_MEMORY_PER_RANK_MB", str((lo + hi) / 2 / 2**20))
    tight = decide(structure, 16, backend="mpi-collective", tile=6, rate=5e9)
    assert tight["estimated_memory_per_rank"] == lo
    assert sum(not c["fits_memory"] for c in tight["candidates"]) == 1
    big = max(wide.values(), key=lambda c: c["memory_per_rank"])["variant"]
    forced = decide(structure, 16, backend="mpi-collective", variant=big, tile=6, rate=5e9)
    assert forced["variant"] == big
    monkeypatch.setenv("TESSERA_MEMORY_PER_RANK_MB", "1e9")
    roomy = decide(structure, 4, backend="auto", tile=6, rate=5e9)
    assert all(c["fits_memory"] for c in roomy["candidates"])
    assert decide(structure, 3, backend="mpi-collective", tile=6, rate=5e9)["candidates"][0]["layers"] in (1, 3)


def test_collective_estimate_waits_for_the_busiest_rank_and_charges_each_exchange():
    """mpi-collective is bulk-synchronous: each contraction ends when its busiest rank, as
    the executor places the products (grid or stationary), does, and each all-to-all or
    broadcast costs ``t_exchange`` at 2 ranks (measured inside a CCSD iteration, ``machine.json``).
    Hand check on 2 ranks: the busiest-rank flops per contraction from ``stationary.choose``
    as the executor calls it, at least the mean rank's; the exchanges as the executor makes
    them (every frozen operand kept at 2 ranks: an all-to-all of the inputs unless both are
    frozen, one of the partial outputs; on a 2 x 1 or 1 x 2 grid a broadcast per non-empty
    panel of the operand that travels along the line of 2 ranks, unless frozen) and the
    other steps' (``other_exchanges``; both tested against the counters in
    tests/test_pieces_mpi.py); the seconds grow by that count per
    second of ``t_exchange`` and ``t_bcast`` (2 ranks: a broadcast's line of 2 takes one round;
    the executor makes no barrier, so ``t_coll`` does not enter)."""
    from tessera.backends import stationary
    from tessera.backends.collective_model import collective_traffic
    from tessera.backends.cost_model import estimate, run_costs
    from tessera.backends.iteration_counts import structure_stats
    from tessera.backends.machine import Machine
    from tessera.backends.summa_layout import summa_layout
    rng = np.random.default_rng(7)
    structure = CCSDStructure(np.sort(rng.integers(0, 2, 20)), 4, 0, distributed=True)
    s = structure_stats(structure, 6, 6, 2)
    busiest = mean = 0.0
    exchanges = collective_traffic(s, 2, "summa")["other_exchanges"]
    assert 0 < exchanges
    for st in s["collective_steps"]:
        pa, pb = st["perms"]
        mode, grid, scores, _ = stationary.choose(st["tasks"], st["sig"], (pa, pb, st["perm_c"]), 1,
                                                  st["operands"], 2, st["moved_once"])
        busiest += scores[mode]["flops"]
        exchanges += int(not {"a", "b"} <= set(st["moved_once"])) + 1
        if mode == "summa":
            x = "b" if grid[0] == 2 else "a"         # B along a grid column, A along a row
            sizes = summa_layout(st["sig"], pa, pb, *grid)[f"{x}_panel_size"][0]
            exchanges += 0 if x in st["moved_once"] else sum(size[0] > 0 for size in sizes)
        ta = st["tasks"]
        mean += float(2 * ta.m[ta.task] * ta.k @ ta.n[ta.task]) / 2
    assert busiest >= mean > 0
    rate, costs = 5e9, run_costs(2)
    base = estimate(s, 2, "mpi-collective", "summa", rate, {**costs, "t_exchange": 0.0, "t_bcast": 0.0})
    assert base["compute"] == pytest.approx(busiest / rate)
    slow = estimate(s, 2, "mpi-collective", "summa", rate, {**costs, "t_exchange": 1e-3, "t_bcast": 1e-3,
                                                            "t_coll": 0.0})
    assert slow["collectives"] == exchanges
    assert slow["seconds"] - base["seconds"] == pytest.approx(exchanges * 1e-3)      # no barrier
    assert costs["t_exchange"] == costs["t_bcast"] == Machine.calibrated().exchange_seconds > 0


def test_auto_runs_the_water_monomer_on_mpi_onesided_at_2_ranks():
    """Water cc-pVDZ (C2v) on 2 ranks: a CCSD iteration is a few MFlop, so the ~140
    exchanges of mpi-collective, each a measured ``exchange_seconds`` (latency, the wait
    for the later rank, the work around it), cost more than mpi-onesided's gets and
    accumulates; measured idle (docs/distributed.md) mpi-onesided's whole CCSD takes less
    than half mpi-collective's, and auto picks it."""
    from pathlib import Path
    from tessera.chem.molecule import Molecule
    from tessera.chem.pyscf_reference import rhf_reference
    xyz = Path(__file__).resolve().parents[1] / "examples" / "water.xyz"
    ref = rhf_reference(Molecule.from_xyz(str(xyz), basis="cc-pvdz").to_pyscf())
    d = decide(CCSDStructure(ref.orbsym, ref.nocc, 0, distributed=True), 2, rate=50e9, budget=2**30)
    assert d["backend"] == "mpi-onesided"
    best = {c["backend"]: c["seconds"] for c in reversed(d["candidates"])}
    assert best["mpi-onesided"] < best["mpi-collective"]


def test_cost_model_never_leaves_a_four_index_tensor_whole_on_a_rank():
    """C1, 10 occupied / 30 virtual orbitals, 2 ranks, mpi-collective summa, a budget of
    512 KiB: every tile >= 10 makes the occupied space one tile (oooo one block). Both MPI
    executors store such a block in pieces over the ranks, so the decision may keep the
    whole occupied space as one tile, but no stored class may sit whole on one rank: the
    chosen candidates' busiest rank holds less than a whole tensor (the decision's check),
    and every class at the chosen tiles is held by both ranks (``balance.loads``, as a run
    places it: this part fails only if a class stops being cut in pieces)."""
    from tessera.backends.balance import loads
    orbsym = np.zeros(40, dtype=int)
    structure = CCSDStructure(orbsym, 10, 0)
    d = decide(structure, 2, variant="summa", rate=5e9, budget=2**19)
    chosen = [c for c in d["candidates"] if c["tile"] == d["tile"] and c["occ_tile"] == d["occ_tile"]]
    assert chosen and all(c["max_tensor_share"] < 1.0 for c in chosen)
    for name, t in structure.stored(d["tile"], d["occ_tile"]).items():
        per_rank = loads(t, 2)
        assert per_rank.min() > 0 and per_rank.max() < per_rank.sum(), (name, per_rank)


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


def test_block_offsets_and_layout_order():
    """Offsets: a rank's blocks one after the other in key order; a layout made from
    unsorted keys (vectorised path) sorts them and says where each came from."""
    from tessera.runtime.distribution import block_offsets, size_ranked
    from tessera.runtime.layout import BlockLayout
    rng = np.random.default_rng(5)
    sizes = rng.integers(1, 50, 40)
    owners = size_ranked(sizes, 6, shift=4)
    offsets, run = block_offsets(owners, sizes, 6)
    for r in range(6):
        mine = np.flatnonzero(owners == r)
        assert list(offsets[mine]) == list(np.concatenate(([0], np.cumsum(sizes[mine])[:-1])))
        assert run[r] == sizes[mine].sum()
    loads = np.bincount(owners, weights=sizes, minlength=6)
    assert loads.max() - loads.min() <= sizes.max()
    keys = [(2, 1), (0, 3), (1, 0), (0, 1)]
    lay = BlockLayout([[1, 2, 3], [4, 5, 6, 7]], keys)
    assert lay.keys == tuple(sorted(keys)) and [keys[n] for n in lay.order] == list(lay.keys)
    assert list(lay.sizes()) == [5, 7, 8, 15]


def test_frozen_cache_keeps_only_frozen_tensors_within_its_bound():
    """What an executor keeps across iterations (mpi-onesided's fetched integral blocks,
    mpi-collective's panels): frozen tensors only, within its bound, what it holds kept
    when full; a put of a new version drops the old one's entries, ``release`` those of a
    released array."""
    from tessera.backends.distributed import FrozenCache
    o, v = spaces(3)
    ints, amps = BlockTensor((o, v), 0).freeze(), BlockTensor((o, v), 0)
    cache = FrozenCache(100)
    assert not cache.put(amps, ("k",), "t", 8) and cache.get(amps, ("k",)) is None
    assert not cache.put(ints, ("big",), "x", 101) and cache.get(ints, ("big",)) is None
    assert cache.put(ints, ("a",), "A", 60) and cache.put(ints, ("b",), "B", 30)
    assert not cache.put(ints, ("c",), "C", 40)         # 130 > 100: a and b stay, c is refused
    assert cache.get(ints, ("a",)) == "A" and cache.get(ints, ("b",)) == "B" and cache.bytes == 90
    assert cache.put(ints, ("d",), "D", 10) and cache.bytes == 100       # what still fits
    ints.version += 1                                   # a new version is a new tensor ...
    assert cache.get(ints, ("a",)) is None
    assert cache.put(ints, ("c",), "C", 40) and cache.bytes == 40        # ... whose put drops the old
    other = SimpleNamespace(uid=-1, version=0, constant=True, dist=SimpleNamespace(ga=SimpleNamespace(eid=7)))
    assert cache.put(other, ("e",), "E", 50) and cache.bytes == 90
    cache.release({7})                                  # its array released on every rank
    assert cache.get(other, ("e",)) is None and cache.bytes == 40


def test_frozen_cache_keeps_a_fixed_subset_of_a_cyclic_scan():
    """Entries of 40 bytes read in the same order three times (a CCSD iteration's frozen
    operands) through a 100-byte cache: least recently used out, iterations 2 and 3 missed
    all 6 (each entry evicted before its next read); kept when full, 2 of the 3 stay and
    only the third misses, 2 of 6."""
    from tessera.backends.distributed import FrozenCache
    o, v = spaces(3)
    ints = BlockTensor((o, v), 0).freeze()
    cache, misses = FrozenCache(100), 0
    for iteration in range(3):
        for key in ("x", "y", "z"):
            if cache.get(ints, (key,)) is None:
                misses += iteration > 0
                cache.put(ints, (key,), key, 40)
    assert misses == 2 and cache.bytes == 80


def test_task_arrays_are_the_block_tasks():
    """plan.blocktasks.task_arrays (built from the sector layouts, for counting) lists the
    tasks and products of contraction_tasks, in its order, with each product's A and B key
    and sizes: every contraction step of a distributed CCSD iteration in four irreps (outputs
    stored as canonical blocks among them) and random contractions."""
    rng = np.random.default_rng(4)
    run = CCSDStructure(np.sort(rng.integers(0, 4, 30)), 8, 0, distributed=True)(6, 4)
    steps = [s for p in run.plans for s in p.steps if s.kind == "contract"]
    steps += [contraction_step(e, seed)[0] for e in ("acbd,ijcd->ijab", "ikac,kjcb->ijab") for seed in (0, 2)]
    assert any(s.out.tensor.aliases for s in steps)
    for step in steps:
        tasks, ta = contraction_tasks(step), task_arrays(step)
        assert list(ta.out) == [t.out for t in tasks]
        assert ta.m.tolist() == [t.m for t in tasks] and ta.n.tolist() == [t.n for t in tasks]
        prods = [(i, p) for i, t in enumerate(tasks) for p in t.products]
        assert ta.task.tolist() == [i for i, _ in prods] and ta.k.tolist() == [p.k for _, p in prods]
        assert [ta.a_keys[x] for x in ta.a] == [p.a for _, p in prods]
        assert [ta.b_keys[x] for x in ta.b] == [p.b for _, p in prods]
        assert len(set(ta.a_keys)) == len(ta.a_keys) and len(set(ta.b_keys)) == len(ta.b_keys)
        assert ta.start.tolist() == np.cumsum([0] + [len(t.products) for t in tasks]).tolist()


@pytest.mark.parametrize("nranks", [1, 3, 4])
def test_stationary_plans_run_every_product_once_where_they_say(nranks):
    """backends.stationary on a ladder step: each mode runs every block product once, on
    the owner of its A block, B block or output block; the flops add up to the step's; a
    rank receives exactly the remote blocks its products need and, as an output's owner,
    one partial block per other rank with products of it (both counted here by brute
    force); a frozen operand moved once costs nothing in the score."""
    from tessera.backends import stationary
    step, (A, B) = contraction_step("acbd,ijcd->ijab", 2)
    tasks = contraction_tasks(step)
    own = {n: owner_map(t.spaces, t.irrep, t.stored_keys(), nranks)
           for n, t in (("a", A), ("b", B), ("c", step.out.tensor))}
    owners = tuple(own[n].__getitem__ for n in "abc")
    for mode in stationary.MODES:
        p = stationary.stationary_scores(task_arrays(step), owners, nranks, modes=(mode,))[1][mode]
        assert p["flops"].sum() == step.flops
        need = {x: [set() for _ in range(nranks)] for x in "ab"}
        parts = [0] * nranks
        for t, ranks in zip(tasks, p["where"]):
            assert len(ranks) == len(t.products)
            for q, r in zip(t.products, ranks):
                assert r == {"a": own["a"][q.a], "b": own["b"][q.b], "c": own["c"][t.out]}[mode]
                need["a"][r].add((q.a, t.m * q.k))
                need["b"][r].add((q.b, q.k * t.n))
            parts[own["c"][t.out]] += 8 * t.m * t.n * len(set(ranks) - {own["c"][t.out]})
        for x in "ab":
            assert p["recv"][x].tolist() == [8 * sum(n for k, n in need[x][r] if own[x][k] != r)
                                            for r in range(nranks)]
        assert p["recv"]["c"].tolist() == parts and (mode != "c" or not any(parts))
        if mode == "a":
            assert not p["recv"]["a"].any()
        assert stationary.score(p, ("a", "b"))["recv_bytes"] == max(parts)
    ops = stationary.Operands((A, B, step.out.tensor), owners, (None, None, None))
    mode, _, scores, _ = stationary.choose(task_arrays(step), tuple((s.irrep, s.rows, s.inner, s.cols) for s in step.sectors),
                                           (step.perms["a"], step.perms["b"], step.perms["c"]), 1, ops, nranks)
    assert scores[mode]["cost"] == min(sc["cost"] for sc in scores.values())
    if nranks == 1:
        assert mode == "summa"          # nothing moves: a tie keeps the grid
