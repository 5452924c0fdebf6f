"""``tessera plan --ranks P``: a run on a machine we do not have, from structure only.

No SCF, no integrals, no MPI: the orbitals per irrep (of the initial guess; C1 needs
none), the tensors a CCSD run stores and one planned iteration are placed on P simulated
ranks, ``--ranks-per-node`` to a node with ``--memory-per-node``, by the same code a run
uses (``runtime.distribution.block_owner_array``, ``backends.auto``). ``simulate``
returns, per rank:

- ``memory_per_rank``: per stored tensor class (the integral classes, T2 and one of each
  structure of the T2-sized intermediates, ``chem.ccsd.CCSDStructure.stored``) and in
  total, ``max_bytes``, ``mean_bytes`` and ``max_over_mean``, as ``mpi-onesided`` stores
  them (an integral class or T2 of too few blocks for the ranks in pieces,
  ``runtime.distribution.piece_deal``; ``mpi-collective`` the same); with (T) its rows and
  kernel buffers (``chem.memory.triples_parts``, the one formula of (T) memory);
- ``triples`` (with (T)): its tasks in all and per rank, the bytes of rows they read
  (in all and per rank, the mean; what the tasks request, before any row cache) and the
  most one task holds, and its budget, ``budget_bytes``, and the modelled seconds per rank,
  ``seconds`` (``chem.triples_plan.plan_counts``);
- ``steps``: the dominant contraction steps (``backends.balance.dominant_steps``, largest
  flops first) with their block tasks, tasks per rank and the busiest rank's flops over
  the mean; ``granularity``: the fewest tasks per rank among them against the target
  (``backends.balance.granularity``) and whether every class is balanced;
- ``executors``: for each executor and variant, bytes moved per rank per iteration,
  memory per rank (stored + held + working, ``backends.cost_model.memory_parts``) against the
  budget (memory per node / ranks per node) and seconds per iteration from the
  calibrated model (``backends.machine``: this machine's measured constants plus the
  network and the threads per rank given as options, ``--threads-per-rank`` T making a
  rank's DGEMM rate T x one thread's x the measured efficiency,
  ``Machine.rank_flops_per_second``; the (T) plan above is made for the same machine,
  ``backends.machine.planning``); the model ``auto`` decides with (``backends.cost_model.estimate``:
  mpi-collective contraction by contraction on its grid or with an operand stationary,
  ``contraction_modes``; frozen operands moved once). On several nodes a run has one
  ghost rank per node (progress ``auto``): the executors' figures are for the
  ``workers`` (ranks minus ghosts), the class table above for all ranks.

Without ``--tile`` the tiles are the candidate a run's cost model always considers
(``backends.balance.run_tiles``; it may take another): the largest,
with tiles and occupied tiles no thinner than ``MIN_OCC_TILE``, at which every stored
class is spread with max/mean <= 1.5 and every dominant step has at least
``TASKS_PER_RANK`` block tasks per rank (else the finest such tiles; the ``Granularity:``
line says which); the mpi-collective rows (each executor row carries its ``tile`` and
``occ_tile``) are at that variant's own candidate, by its grid rule (``layers``: no
dominant step leaves a grid line or layer idle on summa's grid or 2.5d's layered one;
``collective_granularity`` per variant), as ``auto.decide`` considers mpi-collective; where no such tiles balance every class, only the classes that matter for the
memory budget (more than 1/32 of it on one rank) are balanced, said in a warning line.
With a --tile that leaves a class above 1.5, one warning line names it. Distributed (T) takes its occupied
task tile (and, by virtual tile, its windows) from the bytes one task may hold
(``chem.triples_budget.window_budget``): the rank's share of the (T) operands, no less than
a floor set by o, v, the tiles and the machine, no more than a quarter of the budget per rank,
and no more than the budget of a run on half the ranks (so it never grows with the ranks).
"""

from __future__ import annotations

import json
import math

import numpy as np

from tessera.errors import InputError


def dominant_steps(plans, nranks: int) -> list:
    """The dominant contraction steps (``backends.balance.dominant_steps``): block tasks,
    per rank, balance."""
    from tessera.backends.balance import dominant_steps as dominant
    from tessera.plan.blocktasks import task_arrays
    from tessera.runtime.distribution import makespan
    out = []
    for step in dominant(plans):
        ta = task_arrays(step)
        flops = 2 * ta.m[ta.task] * ta.k * ta.n[ta.task]
        total = int(flops.sum())
        busiest = makespan(np.bincount(ta.task, weights=flops, minlength=len(ta.out)), nranks) if len(ta.out) else 0
        out.append({"update": step.label, "step": step.describe().strip(), "flops": int(step.flops),
                    "tasks": len(ta.out), "products": len(ta.k), "tasks_per_rank": len(ta.out) / nranks,
                    "busiest_over_mean_flops": round(busiest * nranks / total, 3) if total else 1.0})
    return out


def simulate(orbsym, nocc: int, nfrozen: int, method: str, nranks: int, ranks_per_node: int,
             memory_per_node: float | None, machine, tile: int | None = None, occ_tile: int | None = None) -> dict:
    """The per-rank plan of a run on ``nranks`` simulated ranks (module docstring)."""
    from tessera.backends.auto import COLLECTIVE_VARIANTS, ONESIDED_VARIANTS
    from tessera.backends.cost_model import estimate, memory_parts
    from tessera.backends.iteration_counts import structure_stats
    from tessera.chem.ccsd import CCSDStructure
    from tessera.backends.balance import (BALANCE, MIN_OCC_TILE, class_balance, collective_layers,
                                          forced_tile_warning, granularity, run_tiles)
    from tessera.chem.memory import triples_parts
    from tessera.backends.budget import executor_cache_bytes, memory_budget
    budget = memory_budget(min(nranks, ranks_per_node), memory_per_node=memory_per_node)[0]
    structure = CCSDStructure(orbsym, nocc, nfrozen, distributed=True)
    warning, given, binds = None, tile is not None, None
    # on several nodes a run has one ghost per node (progress auto): the executors' work,
    # bytes and time are those of the workers, and mpi-collective's grid is theirs
    rpn = min(ranks_per_node, nranks)
    ghosts = 1 if nranks > rpn > 1 else 0
    workers = nranks - ghosts * -(-nranks // rpn)
    layers = {v: collective_layers(v, workers) for v in COLLECTIVE_VARIANTS}
    grid_tiles = {}                    # layers -> mpi-collective's tiles by its grid rule
    if not given:
        tile, occ_tile, worst, binds = run_tiles(structure, nranks, budget)
        grid_tiles = {c: tuple(run_tiles(structure, workers, budget, c)[:2]) for c in set(layers.values())}
        if binds is not None and nranks > 1:
            warning = (f"no tiles of {MIN_OCC_TILE} or more spread every class with max/mean <= {BALANCE} over "
                       f"{nranks} ranks (too few blocks); these balance only the classes that hold more than "
                       "1/32 of the memory per rank" + ("" if worst <= BALANCE else
                                                       f", and not even those: the least unbalanced ({worst:.2f})"))
    else:
        warning = forced_tile_warning(structure.stored, tile, occ_tile, nranks)
    occ_tile = occ_tile or tile
    run = structure(tile, occ_tile)
    stats = structure_stats(lambda *_: run, tile, occ_tile, workers)
    counted = {(tile, occ_tile): stats}

    def counts(tiles):
        """structure_stats at ``tiles`` (once per tiles)."""
        if tiles not in counted:
            counted[tiles] = structure_stats(lambda *_: structure(*tiles), *tiles, workers)
        return tiles, counted[tiles]
    memory = class_balance(structure.stored(tile, occ_tile), nranks)
    granular = {**granularity(run.plans, workers), "rule": "given" if given else "memory" if binds is not None and nranks > 1 else "tasks",
                "every_class": all(m["max_over_mean"] <= BALANCE for m in memory.values())}
    triples = None
    if method == "ccsd(t)":
        from tessera.backends.machine import planning
        from tessera.chem.triples_plan import plan_counts
        # (T) runs on the workers, as the executors do, planned for ``machine`` (its threads, network)
        with planning(machine):
            memory["(t)"] = {k: int(b) for k, b in triples_parts(run.o, run.v, workers, 1, memory_bytes=budget,
                                                                       ranks_per_node=rpn - ghosts).items()}
            triples = plan_counts(structure.stored(tile, occ_tile), workers, memory_bytes=budget,
                                  ranks_per_node=rpn - ghosts)
    costs = machine.on(workers, rpn - ghosts)
    cache = executor_cache_bytes(budget)       # each cache of an executor, within the budget
    executors = []
    for backend, variants in (("mpi-onesided", ONESIDED_VARIANTS), ("mpi-collective", COLLECTIVE_VARIANTS)):
        for variant in variants:
            (t, ot), s = counts((tile, occ_tile) if backend == "mpi-onesided" else
                                grid_tiles.get(layers[variant], (tile, occ_tile)))
            e = estimate(s, workers, backend, variant, machine.rank_flops_per_second, costs, cache)
            parts = memory_parts(s, workers, backend, variant, cache)
            executors.append({"backend": backend, "variant": variant, "tile": t, "occ_tile": ot,
                              "bytes_per_rank": int(e["bytes_per_rank"]), "gets": e["gets"], "accs": e["accs"],
                              "collectives": e["collectives"], "seconds_per_iteration": e["seconds"],
                              "compute_seconds": e["compute"], "memory_per_rank": int(sum(parts.values())),
                              "memory_parts": {k: int(v) for k, v in parts.items()},
                              "fits_memory": sum(parts.values()) <= budget,
                              **({"contraction_modes": e["contraction_modes"]} if "contraction_modes" in e else {})})
    return {"ranks": nranks, "ranks_per_node": ranks_per_node, "nodes": -(-nranks // rpn), "workers": workers,
            "ghosts_per_node": ghosts,
            "memory_budget_per_rank": int(budget), "tile": tile, "occ_tile": occ_tile, "tile_warning": warning,
            "tile_given": given, "granularity": granular,
            "collective_granularity": {v: granularity(structure(*grid_tiles.get(c, (tile, occ_tile))).plans, workers, c)
                                       for v, c in layers.items()},
            "tiles": run.tiles, "nocc": int(run.o.dim), "nvir": int(run.v.dim),
            "flops_per_iteration": int(stats["flops"]), "block_products": int(stats["products"]),
            "memory_per_rank": memory, "triples": triples, "steps": dominant_steps(run.plans, workers),
            "executors": executors,
            "machine": {**{k: getattr(machine, k) for k in ("gemm_flops_per_second", "threads_per_rank",
                        "gemm_thread_efficiency", "rank_flops_per_second", "task_seconds",
                        "get_seconds", "acc_seconds", "collective_seconds", "exchange_seconds",
                        "exchange_peer_seconds", "barrier_log2_seconds", "copy_bytes_per_second", "triples_task_seconds", "network_bandwidth", "network_latency")}, "measured": machine.measured,
                        "per_operation": {k: v for k, v in costs.items() if k != "nodes"}}}


def _size(n: float) -> str:
    return f"{n / 2**30:8.2f} GiB" if n >= 2**30 else f"{n / 2**20:8.1f} MiB"


def _collective_lines(sim: dict) -> list:
    """What mpi-collective's grid rule makes of its tiles, per variant (the tiles of its rows below)."""
    out = []
    for e in [e for e in sim["executors"] if e["backend"] == "mpi-collective"]:
        g = sim["collective_granularity"][e["variant"]]
        tiles = f"{e['tile']}" if e["occ_tile"] == e["tile"] else f"{e['tile']}/{e['occ_tile']}"
        out.append(f"mpi-collective {e['variant']} at tiles {tiles}, judged by its grid: {g['idle_lines']} idle grid "
                   f"line(s) or layer(s) in the dominant steps, busiest rank {g['busiest_over_mean']:.2f}x the mean flops")
    return out


def render(sim: dict) -> str:
    from tessera.backends.balance import MIN_OCC_TILE
    g = sim["granularity"]
    ghosts = f", {sim['workers']} workers beside one ghost per node" if sim["ghosts_per_node"] else ""
    lines = [f"Simulated machine: {sim['ranks']} ranks, {sim['ranks_per_node']} per node ({sim['nodes']} nodes{ghosts}), "
             f"{_size(sim['memory_budget_per_rank']).strip()} per rank; tiles o {sim['tiles']['o']} "
             f"v {sim['tiles']['v']} (o={sim['nocc']}, v={sim['nvir']})",
             *([f"warning: {sim['tile_warning']}"] if sim.get("tile_warning") else []),
             f"Granularity: the dominant steps have {g['tasks_per_rank']:.2f} block tasks per rank or more "
             f"(target {g['target']}" + (")" if g["met"] else
                                         ", not reached: " + {"given": "the tiles given (--tile)",
                                                              "tasks": f"the finest tiles a run cuts, tiles of {MIN_OCC_TILE} or more",
                                                              "memory": "tiles chosen to balance memory"}[g["rule"]] + ")")
             + ("" if g["every_class"] else "; not every class within max/mean 1.5"),
             *_collective_lines(sim),
             "Memory per rank by tensor class (blocks placed as a run places them):",
             f"  {'class':8s} {'max':>12s} {'mean':>12s} {'max/mean':>9s}"]
    for name, m in sim["memory_per_rank"].items():
        if "max_bytes" in m:
            lines.append(f"  {name:8s} {_size(m['max_bytes']):>12s} {_size(m['mean_bytes']):>12s} "
                         f"{m['max_over_mean']:9.2f}")
    if "(t)" in sim["memory_per_rank"]:
        t = sim["memory_per_rank"]["(t)"]
        lines.append("  (t)      " + ", ".join(f"{k} {_size(v).strip()}" for k, v in t.items())
                     + " (per rank, one task at a time: its BLAS threads share one set of kernel buffers; "
                       "beside the classes and T2)")
    if sim.get("triples"):
        t = sim["triples"]
        how = (f"operands by virtual tile (windows), kernel blocks of {t['vblock']}" if t["vblock"]
               else "whole occupied rows per task tile")
        if t.get("chunks", 1) > 1:
            how += f", the contracted indices streamed in {t['chunks']} chunks"
            if sim["nodes"] > 1:
                how += " (as mpi-onesided runs them: off-node reads during compute)"
        lines.append(f"(T): {t['tasks']} tasks ({t['tasks_per_rank']:.1f} per rank, {t['occ_tile']} occupied "
                     f"orbitals per task tile, {how}); rows read {_size(t['read_bytes_per_rank']).strip()} "
                     f"per rank, modelled {t['seconds']:.1f} s per rank, at most {_size(t['task_bytes']).strip()} "
                     f"held by one task (budget "
                     f"{_size(t['budget_bytes']).strip()}: the ranks' share of the operands, at least a floor "
                     "set by o, v, the tiles and the machine, or by the machine alone when streamed, and "
                     "never above the budget on half the ranks)")
    lines.append(f"Dominant contraction steps ({sim['flops_per_iteration']:.3e} flops and "
                 f"{sim['block_products']} block products per iteration):")
    lines.append(f"  {'flops':>10s} {'tasks':>7s} {'per rank':>9s} {'busiest/mean':>12s}  step")
    for s in sim["steps"]:
        lines.append(f"  {s['flops']:10.3e} {s['tasks']:7d} {s['tasks_per_rank']:9.2f} "
                     f"{s['busiest_over_mean_flops']:12.2f}  {s['step'][:80]}")
    m = sim["machine"]
    threads = ("1 thread" if m["threads_per_rank"] == 1 else
               f"{m['threads_per_rank']} threads x {m['gemm_flops_per_second'] / 1e9:.1f} x efficiency "
               f"{m['gemm_thread_efficiency']:.2f}")
    lines.append(f"Per CCSD iteration and rank (calibrated: {m['rank_flops_per_second'] / 1e9:.1f} GFLOP/s per "
                 f"rank ({threads}), {m['task_seconds'] * 1e6:.0f} us per block product, measured {m['measured']}; network "
                 f"{m['network_bandwidth'] / 1e9:g} GB/s per node, {m['network_latency'] * 1e6:g} us):")
    lines.append(f"  {'backend':15s} {'variant':9s} {'tile':>5s} {'MiB moved':>10s} {'memory':>12s} {'est. s':>9s} "
                 f"{'compute s':>9s}")
    for e in sim["executors"]:
        fits = "" if e["fits_memory"] else " !"
        tiles = f"{e['tile']}" if e["occ_tile"] == e["tile"] else f"{e['tile']}/{e['occ_tile']}"
        lines.append(f"  {e['backend']:15s} {e['variant']:9s} {tiles:>5s} {e['bytes_per_rank'] / 2**20:10.1f} "
                     f"{_size(e['memory_per_rank']):>12s} {e['seconds_per_iteration']:9.3f} "
                     f"{e['compute_seconds']:9.3f}{fits}")
    if any(not e["fits_memory"] for e in sim["executors"]):
        lines.append("  ! more memory per rank than the node gives each rank (--memory-per-node / --ranks-per-node)")
    return "\n".join(lines)


def write_json(sim: dict, path: str) -> None:
    from tessera.chem.outcome import atomic_file
    with atomic_file(path) as tmp:
        with open(tmp, "w") as f:
            json.dump(sim, f, indent=1)


def _positive(flag: str, text, unit: float = 1.0) -> float | None:
    if text is None:
        return None
    try:
        value = float(text)
    except (TypeError, ValueError):
        value = float("nan")
    if not (math.isfinite(value) and value > 0):
        raise InputError(f"{flag} {text!r} is not a positive number; see tessera plan --help")
    return value * unit


def _whole(flag: str, text) -> int | None:
    if text is None:
        return None
    if not str(text).strip().isdigit() or int(text) < 1:
        raise InputError(f"{flag} {text!r} is not a positive whole number; expected e.g. {flag} 64")
    return int(text)


def orbitals(source, symmetry: bool) -> tuple:
    """(orbsym, nocc) without an SCF: an FCIDUMP's own, C1's without any work, else the
    initial guess's (``guess_orbitals``: no two-electron integrals)."""
    from tessera.chem.scf.driver import guess_orbitals
    ref = source.reference
    if ref is not None:
        return np.asarray(ref.orbsym), int(ref.nocc)
    mol = source.mol
    if not symmetry or not getattr(mol, "symmetry", False) or getattr(mol, "groupname", "C1") == "C1":
        if mol.nelectron % 2 or mol.spin:
            raise InputError(f"the molecule has {mol.nelectron} electrons and spin {mol.spin}; "
                             "expected a closed shell (change --charge)")
        return np.zeros(mol.nao, dtype=np.int64), int(mol.nelectron) // 2
    orbsym, nocc, _, _ = guess_orbitals(mol)
    return orbsym, nocc


def print_simulation(options, args) -> dict:
    """``tessera plan --ranks P ...``: print the simulation and write ``--json``."""
    from tessera.backends.machine import NETWORK_BANDWIDTH, NETWORK_LATENCY, Machine
    from tessera.chem.inputs import load
    from tessera.chem.job import frozen_core_orbitals
    nranks = _whole("--ranks", args.ranks)
    if nranks is None:
        raise InputError("--ranks-per-node, --memory-per-node, --threads-per-rank and the network options "
                         "describe a simulated machine: give its size with --ranks P")
    rpn = _whole("--ranks-per-node", args.ranks_per_node) or nranks
    node_bytes = args.memory_per_node
    if node_bytes is not None:
        from tessera.backends.budget import parse_size
        node_bytes = parse_size(node_bytes, "--memory-per-node") * 2**20
    machine = Machine.calibrated(
        network_bandwidth=_positive("--network-bandwidth", args.network_bandwidth, 1e9) or NETWORK_BANDWIDTH,
        network_latency=_positive("--network-latency", args.network_latency, 1e-6) or NETWORK_LATENCY,
        threads_per_rank=_whole("--threads-per-rank", args.threads_per_rank) or 1)
    if options.method.lower() == "hf":
        raise InputError("tessera plan --ranks plans a CCSD iteration; use --method ccsd or ccsd(t)")
    if args.json:
        from tessera.chem.outcome import check_output_path
        check_output_path(args.json, "--json", inputs=[args.geometry])
    source = load(options.geometry, basis=options.basis, charge=options.charge, units=options.units,
                  symmetry=options.symmetry)
    nfrozen = frozen_core_orbitals(source.mol) if options.frozen_core and source.mol is not None else 0
    orbsym, nocc = orbitals(source, options.symmetry)
    sim = simulate(orbsym, nocc, nfrozen, options.method.lower(), nranks, min(rpn, nranks), node_bytes,
                   machine, tile=options.tile)
    print(render(sim))
    if args.json:
        write_json(sim, args.json)
    return sim
