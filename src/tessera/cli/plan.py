"""``tessera plan``: the block tasks, flops, bytes and memory of one CCSD iteration,
from structure only: the orbitals per irrep of the initial guess, no SCF, no integrals."""

from __future__ import annotations

from tessera.chem.ccsd import CCSDStructure, minimal_flops
from tessera.chem.job import frozen_core_orbitals
from tessera.chem.inputs import load
from tessera.chem.memory import RunShape, estimate


def print_plan(options, rank: int = 0) -> None:
    """Print the plan (rank 0 only). For the MPI backends and ``auto`` also the cost
    model's decision for the number of ranks this was started with, and its estimates."""
    if rank != 0:
        return
    from tessera.backends.registry import launched_ranks, runs_distributed
    source = load(options.geometry, basis=options.basis, charge=options.charge, units=options.units,
                  symmetry=options.symmetry)
    mol = source.mol
    nfrozen = frozen_core_orbitals(mol) if options.frozen_core and mol is not None else 0
    tile, occ_tile = options.tile or 32, None
    nranks = launched_ranks()
    # an FCIDUMP's orbitals are its reference's, else those of the initial guess
    shape = RunShape(mol, options.method.lower(), options.backend, options.variant, nranks, tile, None,
                     nfrozen, runs_distributed(options.backend), source.reference)
    group = shape.group
    structure = CCSDStructure(shape.orbsym, shape.nocc, nfrozen, shape.distributed)
    if runs_distributed(options.backend):
        from tessera.backends.auto import decide, render
        from tessera.backends.budget import memory_budget
        budget = memory_budget(nranks, options.max_memory)[0]
        decision = decide(structure, nranks, backend=options.backend, tile=options.tile,
                          variant=options.variant, schedule=options.schedule, budget=budget)
        print(render(decision))
        tile, occ_tile = decision["tile"], decision["occ_tile"]
        shape = shape.but(budget=budget)      # (T)'s tasks take a share of it
    else:           # the budget a local run's transform decides by (in memory or by AO units)
        from tessera.backends.budget import memory_budget
        shape = shape.but(budget=memory_budget(1, options.max_memory)[0])
        if options.backend == "auto":
            print("auto decision on 1 rank: backend threads (one process: shared memory)")
    run = structure(tile, occ_tile)
    print(f"{source.molecule['point_group_full']} -> {group}; tiles: o {run.tiles['o']}, v {run.tiles['v']}")
    total, peak = 0, 0
    for plan in run.plans:
        print(plan.render())
        total += plan.flops
        peak = max(peak, plan.peak_memory)
    paths = "\n".join(p.render_paths() for p in run.plans if p.choices)
    if paths:
        print("\npairing orders of the multi-factor terms (flops, largest intermediate), cheapest chosen:")
        print(paths)
    minimal = minimal_flops(run.o, run.v)
    print(f"\nminimal count (o2v4 + 8o3v3 + o4v2 on this block structure): {minimal:.4e} flops; "
          f"planned/minimal {total / minimal:.2f}")
    print(f"CCSD iteration: {total:.4e} flops, peak temporary memory {peak / 2**20:.1f} MiB, "
          f"backend {options.backend}")
    print(estimate(shape.but(tile=tile, occ_tile=occ_tile)).render())
