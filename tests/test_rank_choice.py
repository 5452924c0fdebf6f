"""mpi-collective's per-rank decision (``backends.rank_choice``) against the whole count
(``backends.stationary``), on simulated ranks, without MPI: every rank's cost of every
candidate equals its cost counted over all ranks, and the maximum over the ranks picks
``stationary.choose``'s mode and grid."""

import numpy as np
import pytest

from tessera import BlockTensor, IndexSpace
from tessera.backends import rank_choice, stationary, step_bytes
from tessera.backends.own_products import add_homes, hadamard_own, own_tasks, summa_own
from tessera.backends.summa_layout import least_idle_shapes, summa_layout
from tessera.backends.tasks import part_slice
from tessera.chem.ccsd import CCSDStructure
from tessera.chem.ccsd_equations import T2_SYMMETRY
from tessera.plan.blocktasks import add_source, contraction_tasks, hadamard_outputs, task_arrays
from tessera.backends.context import PlanningContext


def ccsd_steps(seed: int, kind: str = "contract") -> list:
    """The ``kind`` steps of a distributed CCSD iteration of random irreps (frozen
    integrals, T2-sized tensors placed in pieces, canonical outputs among them)."""
    rng = np.random.default_rng(seed)
    run = CCSDStructure(np.sort(rng.integers(0, 4, 26)), 8, 0, distributed=True)(6, 4)
    return [s for p in run.plans for s in p.steps if s.kind == kind]


def held_keys(cache: dict, t, nranks: int) -> list:
    """Per rank, the stored keys of ``t`` it is home of or holds a piece of, from the
    model's placement of every block (``step_bytes``: an independent construction)."""
    keys = t.stored_keys()
    owner = step_bytes.owner_function(cache, t, nranks)
    held = [set() for _ in range(nranks)]
    for k in keys:
        held[owner(k)].add(k)
    rows = step_bytes.piece_rows(cache, t, nranks, keys)
    if rows is not None:
        for i, r in zip(rows[0].tolist(), rows[1].tolist()):
            held[r].add(keys[i])
    return held


def whole_costs(step, sig, perms, layers: int, ops, nranks: int, moved_once, modes) -> np.ndarray:
    """(candidates, ranks) costs of every rank, as ``stationary`` counts all ranks at once."""
    ta = task_arrays(step)
    rows = []
    for mode, grid in rank_choice.candidates(sig, perms, layers, nranks, modes):
        if mode == "summa":
            recv = stationary.summa_recv(sig, perms, grid, ops, nranks, moved_once)
            rows.append(recv["flops"] + 8.0 * (recv["a"] + recv["b"] + recv["panels"] + recv["c"]))
        else:
            p = stationary.stationary_scores(ta, ops.owners, nranks, moved_once, (mode,), where=False,
                                             pieces=ops.tables(ta), shared=ops.tensors[0] is ops.tensors[1])[1][mode]
            rows.append(p["flops"] + 8.0 * sum(v for x, v in p["recv"].items() if x not in moved_once))
    return np.array(rows)


@pytest.mark.parametrize("nranks,layers,least", [(2, 1, 1), (3, 1, 2), (4, 2, 2), (6, 1, 3), (8, 2, 2)])
def test_rank_costs_are_each_ranks_and_pick_what_choose_picks(nranks, layers, least):
    """Every contraction step of a CCSD iteration in four irreps (the integrals frozen,
    T2-sized tensors and the integrals in at least ``least`` pieces per block), on 2-8
    simulated ranks, SUMMA of one or two layers: per rank and candidate the cost counted
    from the rank's own blocks equals the whole count's, and ``pick`` on their maximum
    takes ``choose``'s mode and grid; also with nothing frozen, every operand frozen and
    one stationary mode alone and SUMMA alone (``never``'s candidates); steps whose A and B
    are one tensor among them."""
    steps = ccsd_steps(nranks)
    cache = {"least": least}
    pieced = shared = picked = 0
    for step in steps:
        ops = step_bytes.operands(cache, step, nranks)
        A, B, C = ops.tensors
        held = [held_keys(cache, t, nranks) for t in ops.tensors]
        sig = tuple((s.irrep, s.rows, s.inner, s.cols) for s in step.sectors)
        perms = (step.perms["a"], step.perms["b"], step.perms["c"])
        frozen = tuple(x for x, t in (("a", A), ("b", B)) if t.constant)
        pieced += any(f is not None for f in ops.pieces)
        shared += A is B
        for moved_once, modes in ((frozen, stationary.MODES), ((), stationary.MODES), (("a", "b"), ("b",)),
                                  (frozen, ())):
            whole = whole_costs(step, sig, perms, layers, ops, nranks, moved_once, modes)
            mine = np.array([rank_choice.rank_costs(sig, perms, layers, ops, nranks, me,
                                                    tuple(h[me] for h in held), moved_once, modes)
                             for me in range(nranks)]).T
            assert mine.tolist() == whole.tolist()
            cands = rank_choice.candidates(sig, perms, layers, nranks, modes)
            mode, grid = rank_choice.pick(cands, mine.max(axis=1))
            if modes:
                want = stationary.choose(task_arrays(step), sig, perms, layers, ops, nranks, moved_once, modes)[:2]
            else:
                want = ("summa", stationary.summa_grid(sig, perms, layers, ops, nranks, moved_once)[0])
            assert (mode, grid) == want
            picked += mode != "summa"
    assert picked and shared and (pieced or least == 1)


@pytest.mark.parametrize("nranks,least", [(2, 1), (3, 2), (5, 2), (8, 3)])
def test_own_tasks_are_the_whole_lists_products_of_each_rank(nranks, least):
    """``own_products.own_tasks`` (what one rank lists of a stationary contraction, from
    its own blocks) against the all-products path (``contraction_tasks`` and the plan's
    ``where``), for every mode of a CCSD iteration's steps (frozen integrals, T2-sized
    tensors in pieces, canonical outputs) on 2-8 simulated ranks: each rank's tasks are,
    in step order, the products whose A or B block it holds (home or a piece), that it
    runs, or of an output block it holds, each with the plan's rank; every product runs
    on exactly one rank."""
    cache = {"least": least}
    checked = pieced = aliased = 0
    for step in ccsd_steps(nranks + 10):
        ops = step_bytes.operands(cache, step, nranks)
        ta = task_arrays(step)
        held = [held_keys(cache, t, nranks) for t in ops.tensors]
        read = [[set(rank_choice.read_keys(t, h)) for h in hs] for t, hs in zip(ops.tensors[:2], held[:2])]
        sig = tuple((s.irrep, s.rows, s.inner, s.cols) for s in step.sectors)
        perms = (step.perms["a"], step.perms["b"], step.perms["c"])
        plans = stationary.stationary_scores(ta, ops.owners, nranks, pieces=ops.tables(ta))[1]
        tasks = contraction_tasks(step)
        pieced += any(f is not None for f in ops.pieces)
        aliased += bool(ops.tensors[2].aliases)
        for mode in stationary.MODES:
            runs = []
            for me in range(nranks):
                want = []
                for t, rs in zip(tasks, plans[mode]["where"]):
                    prods = tuple((p.a, p.b, p.k, r) for p, r in zip(t.products, rs)
                                  if r == me or t.out in held[2][me] or p.a in read[0][me] or p.b in read[1][me])
                    if prods:
                        want.append((t.out, t.m, t.n, t.out_shape, prods))
                got = own_tasks(sig, perms, ops, tuple(h[me] for h in held), mode)
                assert [tuple(t) for t in got] == want
                runs += [(t.out, a, b) for t in got for a, b, _, r in t.products if r == me]
            assert sorted(runs) == sorted((t.out, p.a, p.b) for t in tasks for p in t.products)
            checked += 1
    assert checked and aliased and (pieced or least == 1)


def element_ranks(cache: dict, t, nranks: int, key, part=None) -> set:
    """The ranks holding an element of block ``key`` of ``t`` (an alias: of its stored
    block, transposed), or of ``part`` of it, element by element from the model's pieces
    (``step_bytes.piece_rows``, in element order): independent of ``exchange.involves``."""
    stored, perm = t.aliases[key] if key in t.aliases else (key, None)
    rows = step_bytes.piece_rows(cache, t, nranks, [stored])
    if rows is None:
        return {step_bytes.owner_function(cache, t, nranks)(stored)}
    ranks = np.repeat(rows[1], rows[2]).reshape(t.block_shape(stored))
    if perm is not None:
        ranks = ranks.transpose(perm)
    if part:
        ranks = ranks[part_slice(ranks.ndim, part)]
    return set(np.unique(ranks).tolist())


def held_of(cache: dict, nranks: int, me: int):
    """``own_products``' ``held`` of rank ``me`` (``held_keys``, per tensor)."""
    return lambda t: held_keys(cache, t, nranks)[me]


RANKS = [(2, 1), (3, 2), (5, 2), (8, 3)]


@pytest.mark.parametrize("nranks,least", RANKS)
def test_add_homes_are_the_whole_lists_items_of_each_rank(nranks, least):
    """``own_products.add_homes`` (found from a rank's held blocks) against every output
    block of each ``add`` step of a CCSD iteration (pieced and whole tensors, pair maps,
    canonical outputs) on 2-8 simulated ranks: each rank lists, in key order, exactly the
    outputs it is home of, holds a piece of, or holds an element of the A or divisor block
    of; every output is listed by its home."""
    cache = {"least": least}
    checked = pieced = pairs = 0
    for step in ccsd_steps(nranks, "add"):
        if step.pairs == "unpack":          # planned for local targets only
            continue
        out, a = step.out.tensor, step.inputs[0].tensor
        d = step.divisor.tensor if step.divisor is not None else None
        owner = step_bytes.owner_function(cache, out, nranks)
        whole = [(okey, owner(okey), *add_source(step, okey)) for okey in sorted(out.stored_keys())
                 if add_source(step, okey)[0] is not None]
        listed = []
        for me in range(nranks):
            want = [item for item in whole
                    if me in element_ranks(cache, out, nranks, item[0]) | element_ranks(cache, a, nranks, item[2])
                    | (element_ranks(cache, d, nranks, item[3]) if d is not None else set())]
            got = add_homes(step, held_of(cache, nranks, me), owner)
            assert got == want
            listed += [item for item in got if item[1] == me]
        assert sorted(listed) == whole
        checked += 1
        pieced += out.placement == "pieces"
        pairs += step.pairs is not None
    assert checked and pairs and (pieced or least == 1)


def hadamard_steps() -> list:
    """Hadamard steps into a T2-like output stored in pieces: of a canonical pieced T2
    with itself transposed, and a product summed over the virtual letters."""
    o = IndexSpace.from_irreps("o", [0, 0, 1, 1, 2, 3, 3], 2)
    v = IndexSpace.from_irreps("v", np.random.default_rng(5).integers(0, 4, 19), 3)
    oovv = (o, o, v, v)
    T = BlockTensor(oovv, 0, name="T", placement="pieces", symmetry=T2_SYMMETRY, canonical=True)
    X = BlockTensor(oovv, 0, name="X", placement="balanced")
    Z = BlockTensor(oovv, 0, name="Z", placement="pieces")
    Y = BlockTensor((o, o), 0, name="Y", placement="balanced")
    ctx = PlanningContext()
    with ctx:
        Z["ijab"] = T["ijab"] * T["jiab"]
        Z["ijab"] += X["ijba"] * T["ijab"]
        Y["ij"] = T["ijab"] * X["ijab"]
    return [s for p in ctx.plans for s in p.steps if s.kind == "hadamard"]


@pytest.mark.parametrize("nranks,least", RANKS)
def test_hadamard_own_is_the_whole_lists_share_of_each_rank(nranks, least):
    """``own_products.hadamard_own`` (outputs found from a rank's held blocks, each one's
    pairs made alone) against ``hadamard_outputs`` (every output block's pairs) on 2-8
    simulated ranks, inputs and output in pieces or whole, an input canonical (read by
    its aliases), a sum over letters: each rank lists, in key order, exactly the outputs
    it is home of, holds a piece of, or holds an element of an A or B block of, with
    ``hadamard_outputs``' pairs; every output by its home."""
    cache = {"least": least}
    steps = hadamard_steps()
    for step in steps:
        out, a, b = step.out.tensor, step.inputs[0].tensor, step.inputs[1].tensor
        owner = step_bytes.owner_function(cache, out, nranks)
        whole = [(okey, owner(okey), plist) for okey, plist in sorted(hadamard_outputs(step).items()) if plist]
        listed = []
        for me in range(nranks):
            def involved(x, key, home):
                return home == me or me in element_ranks(cache, (a, b)[x], nranks, key)
            want = [item for item in whole if me in element_ranks(cache, out, nranks, item[0])
                    or any(involved(0, ka, item[1]) or involved(1, kb, item[1]) for ka, kb in item[2])]
            got = hadamard_own(step, me, held_of(cache, nranks, me), owner, involved)
            assert got == want
            listed += [item for item in got if item[1] == me]
        assert listed and sorted(listed) == whole
    assert len(steps) == 3


@pytest.mark.parametrize("nranks,least", RANKS)
def test_summa_own_is_the_whole_layouts_share_of_each_rank(nranks, least):
    """``own_products.summa_own`` (a rank's grid cell and held blocks) against
    ``summa_layout``'s whole lists for every contraction of a CCSD iteration on 2-8
    simulated ranks, one and two layers (cut inner tuples: parts of blocks in pieces),
    each grid of least idle lines: each rank's home items are, in home order, those whose
    destination it is or that it holds an element of (the part's elements); its expected
    partial blocks, in each sender's order, are those of every other active grid cell's
    rectangle that it holds an element of; every home item is received by its destination."""
    cache = {"least": least}
    checked = parts = 0
    for step in ccsd_steps(nranks):
        sig = tuple((s.irrep, s.rows, s.inner, s.cols) for s in step.sectors)
        pa, pb, pc_ = step.perms["a"], step.perms["b"], step.perms["c"]
        A, B, C = step.inputs[0].tensor, step.inputs[1].tensor, step.out.tensor
        for layers in (1, 2) if nranks % 2 == 0 else (1,):
            for pr, pc in least_idle_shapes(sig, pa, pb, nranks // layers, layers):
                lay = summa_layout(sig, pa, pb, pr, pc, layers)
                homes = {x: [(key, (hl * pr + hr) * pc + hc, part) for key, part, hl, hr, hc in lay[f"{x}_homes"]]
                         for x in "ab"}
                parts += any(part for key, dest, part in homes["a"] + homes["b"])
                received = {"a": [], "b": []}
                for me in range(nranks):
                    def involved(x, key, part, dest):
                        return dest == me or me in element_ranks(cache, A if x == "a" else B, nranks, key, part)
                    got = summa_own(step, (pr, pc, layers), me, held_of(cache, nranks, me), involved)
                    for x in "ab":
                        assert got[x] == [(key, dest, part) for key, dest, part in homes[x] if involved(x, key, part, dest)]
                        received[x] += [item for item in got[x] if item[1] == me]
                    want = {}
                    for n, (_, rows, _, cols) in enumerate(sig):
                        for gl in range(layers):
                            for gr in range(pr):
                                for gc in range(pc):
                                    src = (gl * pr + gr) * pc + gc
                                    if src == me or not lay["active"][n][gl]:
                                        continue
                                    for r, c, _, _ in lay["out"][n][gr][gc]:
                                        okey = tuple((rows.tuples[r] + cols.tuples[c])[q] for q in pc_)
                                        if okey not in C.aliases and me in element_ranks(cache, C, nranks, okey):
                                            want.setdefault(src, []).append(okey)
                    by_src = {}
                    for okey, src in got["expect"]:
                        by_src.setdefault(src, []).append(okey)
                    assert by_src == want
                for x in "ab":
                    assert sorted(received[x], key=repr) == sorted(homes[x], key=repr)
                checked += 1
    assert checked and (parts or nranks % 2)
