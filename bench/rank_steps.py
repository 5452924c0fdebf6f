"""What one rank of ``mpi-collective`` walks to run a CCSD iteration's steps, on many
simulated ranks (no MPI: the exchanges' inputs emulated from the placements).

    .venv/bin/python bench/rank_steps.py [--waters 8,16] [--ranks 64,256,1024] [--tile 32]
                                         [--rank 0] [--json bench/results/rank_steps.json]

For water clusters (H2O)n in cc-pVDZ (C1, tile ``--tile``), one CCSD iteration is planned
as a distributed run plans it and its operands placed as on P ranks (``rank_planning``'s
simulated arrays); each contraction's mode is ``stationary.choose``'s (stationary=auto,
not timed). Rank ``--rank`` then does, per step, the listing work of the executor without
the data: the exchange items it builds, the owner of each item ``exchange`` looks up, the
tasks or output blocks its loops visit. Two paths:

- ``all``: every rank walks everything, every iteration (the executor up to commit
  1d3f719): a stationary contraction's every product with its rank (``stationary._plan``'s
  ``where``, made once per contraction), SUMMA's every home item and every grid cell's
  output rectangle, an ``add`` step's every output block;
- ``own``: what the executor walks now: a stationary contraction's ``own_products.own_tasks``
  (made once, from the blocks the rank holds), SUMMA's and an add step's items that the
  rank sends, receives or keeps (``own_products.summa_own``: from its grid cell and the
  blocks it holds, a part of a block counted here as its block's; ``add_homes``: from the
  blocks it holds), each made once per run.

Per path: ``once s``, the lists made once per run (process CPU), and per step kind the
steps, items walked and seconds of one iteration's walk (best of ``--repeat``);
``layout s``: the SUMMA contractions' layouts a rank makes once per layout, the whole
grid's (``summa_layout``, O(the step's blocks): the executor up to this bench's
``cell_layout`` commit) -> its own cell's (``cell_layout``, from the deal).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rank_planning import REPO, NBAS_WATER, simulated_tensor  # noqa: E402
from tessera.backends import stationary  # noqa: E402
from tessera.backends.own_products import add_homes, own_tasks, summa_own  # noqa: E402
from tessera.backends import summa_layout as summa_layouts  # noqa: E402
from tessera.backends.summa_layout import summa_layout  # noqa: E402
from tessera.chem.ccsd import CCSDStructure  # noqa: E402
from tessera.plan.blocktasks import add_source, contraction_tasks, task_arrays  # noqa: E402


def operands(step, sim) -> tuple:
    """(A, B, C simulated tensors, ``stationary.Operands``, sig, perms) of a contraction."""
    A, B, C = (sim[id(r.tensor)] for r in (*step.inputs, step.out))
    ops = stationary.Operands((A.tensor, B.tensor, C.tensor), (A.dist.owner, B.dist.owner, C.dist.owner),
                              tuple(t.dist.ga.piece_table if t.pieced else None for t in (A, B, C)))
    sig = tuple((s.irrep, s.rows, s.inner, s.cols) for s in step.sectors)
    return (A, B, C), ops, sig, (step.perms["a"], step.perms["b"], step.perms["c"])


def held_by(sim, t, me: int, cache: dict) -> set:
    """Stored keys of ``t`` (and their aliases) whose block rank ``me`` is home of or holds
    a piece of (a part of a block counted as the block's)."""
    if id(t) not in cache:
        keys = sim[id(t)].dist.ga.held(me)
        cache[id(t)] = keys | {alias for k in keys for alias, _ in (t.aliases.of(k) if t.aliases else ())}
    return cache[id(t)]


def summa_items(step, sim, grid, me: int, path: str, cache: dict) -> list:
    """SUMMA's lists: (tensor, key, dest) of both operands' home items and (output key,
    grid rank) of every grid cell's rectangle; ``own``: those rank ``me`` sends, receives
    or keeps (``CollectiveExecutor._summa_own``)."""
    (A, B, C), _, sig, (pa, pb, pc_) = operands(step, sim)
    pr, pc, layers = grid
    if path == "own":
        own = summa_own(step, grid, me, lambda t: sim[id(t)].dist.ga.held(me),
                        lambda x, key, part, dest: dest == me or key in held_by(sim, (A if x == "a" else B).tensor,
                                                                                me, cache))
        return ([(A, key, dest) for key, dest, _ in own["a"]] + [(B, key, dest) for key, dest, _ in own["b"]]
                + [(C, okey, src) for okey, src in own["expect"]])
    lay = summa_layout(sig, pa, pb, pr, pc, layers)
    out = []
    for t, homes in ((A, lay["a_homes"]), (B, lay["b_homes"])):
        out += [(t, key, (hl * pr + hr) * pc + hc) for key, _, hl, hr, hc in homes]
    for n, (_, rows, _, cols) in enumerate(sig):
        for gl in range(layers):
            for gr in range(pr):
                for gc in range(pc):
                    for r, c, _, _ in lay["out"][n][gr][gc]:
                        okey = tuple((rows.tuples[r] + cols.tuples[c])[q] for q in pc_)
                        out.append((C, okey, (gl * pr + gr) * pc + gc))
    return out


def add_items(step, sim, me: int, path: str, cache: dict) -> list:
    """(source tensor, A key, home) of an add step's output blocks; ``own``: those rank
    ``me`` computes, keeps a piece of, or feeds from a block it holds, found from the
    blocks it holds (``_add_homes``)."""
    a, out = sim[id(step.inputs[0].tensor)], sim[id(step.out.tensor)]
    if path == "own":
        return [(a, akey, home) for _, home, akey, _ in add_homes(step, lambda t: sim[id(t)].dist.ga.held(me),
                                                                   out.dist.owner)]
    items = []
    for okey in step.out.tensor.stored_keys():
        akey = add_source(step, okey)[0]
        if akey is not None:
            items.append((a, akey, out.dist.owner(okey)))
    return items


def walk_items(items) -> int:
    """An iteration's walk of SUMMA's or an add step's lists: each item's owner looked up
    (as ``exchange`` and ``expect_from`` do)."""
    for t, key, _ in items:
        t.dist.owner(key)
    return len(items)


def walk_products(ts, me: int, A, B) -> int:
    """An iteration's walk of a stationary contraction over ``ts`` = [(out, [(a, b, rank)])]:
    the exchange items (deduplicated, each item's owner looked up as ``exchange`` does)
    and the output loop (the ranks of each task, the products run here)."""
    seen, walked = set(), 0
    for x, t in ((0, A), (1, B)):
        for _, prods in ts:
            for p in prods:
                tag = (x, p[x], p[2])
                if tag not in seen:
                    seen.add(tag)
                    t.dist.ga.owner(p[x])
                walked += 1
    for _, prods in ts:
        sorted({r for *_, r in prods} - {me})
        [p for p in prods if p[2] == me]
    return walked


def rank_local(step, sim) -> bool:
    """``DistributedExecutor.rank_local`` on the simulated arrays (an add between tensors in
    the same pieces, read in the same order: no listing); also an ``unpack`` step (planned
    for local targets only)."""
    if step.pairs == "unpack":
        return True
    same = tuple(range(step.out.tensor.ndim))
    place = sim[id(step.out.tensor)].dist.ga.place
    return (sim[id(step.out.tensor)].pieced and not step.pairs and tuple(step.perms["a"]) == same
            and sim[id(step.inputs[0].tensor)].dist.ga.place is place
            and (step.divisor is None or (tuple(step.perms["d"]) == same
                                          and sim[id(step.divisor.tensor)].dist.ga.place is place)))


def listing(step, sim, mode: str, me: int, path: str, held) -> list:
    """The once-per-contraction listing: [(out, [(a, b, rank)])] of all products (``all``)
    or of this rank's (``own``)."""
    _, ops, sig, perms = operands(step, sim)
    if path == "own":
        return [(t.out, [(a, b, r) for a, b, _, r in t.products])
                for t in own_tasks(sig, perms, ops, held, mode)]
    ta = task_arrays(step)
    x = stationary.MODES.index(mode)
    keys, ids = (ta.a_keys, ta.b_keys, ta.out)[x], (ta.a, ta.b, ta.task)[x]
    ranks = np.array([ops.owners[x](k) for k in keys], dtype=np.int64)[ids].tolist()
    out, i = [], 0
    for t in contraction_tasks(step):
        out.append((t.out, [(p.a, p.b, ranks[i + j]) for j, p in enumerate(t.products)]))
        i += len(t.products)
    return out


def one_rank(steps, sim, modes, nranks: int, me: int, repeat: int) -> dict:
    held = {}
    for s in steps:
        if s.kind == "contract":
            for r in (*s.inputs, s.out):
                if id(r.tensor) not in held:
                    held[id(r.tensor)] = sim[id(r.tensor)].dist.ga.held(me)
    result = {}
    for path in ("all", "own"):
        kinds: dict = {}
        best = None
        for _ in range(repeat):
            lists, cache = {}, {}
            t0 = time.process_time()
            for s in steps:
                if s.kind == "add" and not rank_local(s, sim):
                    lists[id(s)] = ("add", add_items(s, sim, me, path, cache))
                elif s.kind == "contract" and modes[id(s)][0] == "summa":
                    lists[id(s)] = ("summa", summa_items(s, sim, modes[id(s)][1], me, path, cache))
                elif s.kind == "contract":
                    lists[id(s)] = ("stationary", listing(s, sim, modes[id(s)][0], me, path,
                                                          tuple(held[id(r.tensor)] for r in (*s.inputs, s.out))))
            once = time.process_time() - t0
            row: dict = {}
            for s in steps:
                if id(s) not in lists:
                    continue
                kind, items = lists[id(s)]
                t0 = time.process_time()
                if kind == "stationary":
                    A, B, _ = operands(s, sim)[0]
                    walked = walk_products(items, me, A, B)
                else:
                    walked = walk_items(items)
                got = row.setdefault(kind, {"steps": 0, "items": 0, "seconds": 0.0})
                got["steps"] += 1
                got["items"] += walked
                got["seconds"] += time.process_time() - t0
            total = sum(v["seconds"] for v in row.values())
            if best is None or total < best[0]:
                best, kinds = (total, once), row
        result[path] = {"once_seconds": best[1], "iteration_seconds": best[0], "kinds": kinds}
    result["layout_seconds"] = {path: min(layouts(steps, sim, modes, me, path) for _ in range(repeat))
                                for path in ("all", "own")}
    return result


def layouts(steps, sim, modes, me: int, path: str) -> float:
    """Seconds (process CPU) of the SUMMA contractions' layouts, caches cleared: the whole
    grid's (``all``) or rank ``me``'s cell (``own``)."""
    for f in (summa_layouts._lpt, summa_layouts._shift, summa_layouts._sector_layout, summa_layout,
              summa_layouts.cell_layout):
        f.cache_clear()
    t0 = time.process_time()
    for s in steps:
        if s.kind == "contract" and modes[id(s)][0] == "summa":
            _, _, sig, (pa, pb, _) = operands(s, sim)
            pr, pc, layers = modes[id(s)][1]
            if path == "all":
                summa_layout(sig, pa, pb, pr, pc, layers)
            else:
                summa_layouts.cell_layout(sig, pa, pb, pr, pc, layers, me // (pr * pc), me % (pr * pc) // pc, me % pc)
    return time.process_time() - t0


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--waters", default="8,16")
    ap.add_argument("--ranks", default="64,256,1024")
    ap.add_argument("--tile", type=int, default=32)
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--json", default=str(REPO / "bench" / "results" / "rank_steps.json"))
    args = ap.parse_args(argv)
    result = {"load": os.getloadavg()[0], "tile": args.tile, "rank": args.rank, "clusters": {}}
    print(f"{'cluster':>9s} {'ranks':>5s} {'path':>4s} {'once s':>7s} {'iter s':>7s}  per kind: steps items seconds")
    for n in [int(x) for x in args.waters.split(",") if x]:
        name = f"(H2O){n}"
        structure = CCSDStructure(np.zeros(NBAS_WATER * n, dtype=int), 5 * n, distributed=True)
        steps = [s for plan in structure(args.tile, args.tile).plans for s in plan.steps]
        rows = {}
        for P in [int(x) for x in args.ranks.split(",")]:
            placements, sim = {}, {}
            for s in steps:
                for r in (*s.inputs, s.out, *([s.divisor] if getattr(s, "divisor", None) else [])):
                    if id(r.tensor) not in sim:
                        sim[id(r.tensor)] = simulated_tensor(r.tensor, P, placements)
            modes = {}
            for s in steps:
                if s.kind == "contract":
                    (A, B, _), ops, sig, perms = operands(s, sim)
                    moved_once = [x for x, t in (("a", A), ("b", B)) if t.constant]
                    modes[id(s)] = stationary.choose(task_arrays(s), sig, perms, 1, ops, P, moved_once,
                                                     stationary.MODES)[:2]
            rows[P] = one_rank(steps, sim, modes, P, args.rank, args.repeat)
            for path in ("all", "own"):
                got = rows[P][path]
                kinds = "  ".join(f"{k} {v['steps']} {v['items']} {v['seconds']:.3f}" for k, v in got["kinds"].items())
                print(f"{name:>9s} {P:5d} {path:>4s} {got['once_seconds']:7.2f} {got['iteration_seconds']:7.3f}  {kinds}",
                      flush=True)
            print(f"{name:>9s} {P:5d} layout s {rows[P]['layout_seconds']['all']:.3f} -> {rows[P]['layout_seconds']['own']:.3f}"
                  " (the whole grid's -> its cell's, once per layout)")
        result["clusters"][name] = rows
    print(f"(load average {result['load']:.2f} at the start; once s: the lists made once per run; "
          "iter s: one iteration's walk of the contraction and add steps, best of --repeat)")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
