"""mpi-collective's per-rank decision (``backends.rank_choice``) against the whole count
(``backends.stationary``), on simulated ranks, without MPI: every rank's cost of every
candidate equals its cost counted over all ranks, and the maximum over the ranks picks
``stationary.choose``'s mode and grid."""

import numpy as np
import pytest

from tessera.backends import rank_choice, stationary, step_bytes
from tessera.chem.ccsd import CCSDStructure
from tessera.backends.own_products import own_tasks
from tessera.plan.blocktasks import contraction_tasks, task_arrays


def ccsd_steps(seed: int) -> list:
    """The contraction steps of a distributed CCSD iteration of random irreps (frozen
    integrals, T2-sized tensors placed in pieces, canonical outputs among them)."""
    rng = np.random.default_rng(seed)
    run = CCSDStructure(np.sort(rng.integers(0, 4, 26)), 8, 0, distributed=True)(6, 4)
    return [s for p in run.plans for s in p.steps if s.kind == "contract"]


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
