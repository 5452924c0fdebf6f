"""``tessera plan``: the block tasks, flops, bytes and memory of one CCSD iteration."""

from __future__ import annotations

from tessera.backends.context import PlanningContext
from tessera.chem import ccsd_equations as eq
from tessera.chem.integrals import transform
from tessera.chem.job import frozen_core_orbitals
from tessera.chem.molecule import Molecule
from tessera.chem.pyscf_reference import rhf_reference


def print_plan(options, rank: int = 0) -> None:
    """Print the plan (rank 0 only). For the MPI backends and ``auto`` also the cost
    model's decision for the number of ranks this was started with, and its estimates."""
    if rank != 0:
        return
    from tessera.backends.executors import launched_ranks, runs_distributed
    molecule = Molecule.from_xyz(options.geometry, charge=options.charge, basis=options.basis)
    molecule.check_closed_shell()
    mol = molecule.to_pyscf(symmetry=options.symmetry)
    ref = rhf_reference(mol)
    nfrozen = frozen_core_orbitals(mol) if options.frozen_core else 0
    tile, occ_tile = options.tile or 32, None
    nranks = launched_ranks()
    if runs_distributed(options.backend):
        from tessera.backends.auto import decide, render
        decision = decide(ref.orbsym, ref.nocc, nfrozen, nranks, backend=options.backend, tile=options.tile,
                          variant=options.variant, schedule=options.schedule)
        print(render(decision))
        tile, occ_tile = decision["tile"], decision["occ_tile"]
    elif options.backend == "auto":
        print("auto decision on 1 rank: backend threads (one process: shared memory)")
    ints = transform(ref, nfrozen, tile, occ_tile=occ_tile)
    t1 = eq.new(ints, "ov", "t1").fill_zero_blocks()
    t2 = eq.new(ints, "oovv", "t2").fill_zero_blocks()
    ctx = PlanningContext()
    with ctx:
        eq.residual(ints, t1, t2)
    print(f"{molecule.point_group_full} -> {ref.point_group}; tiles: o {[t.size for t in ints.o.tiles]}, "
          f"v {[t.size for t in ints.v.tiles]}")
    total, peak = 0, 0
    for plan in ctx.plans:
        print(plan.render())
        total += plan.flops
        peak = max(peak, plan.peak_memory)
    print(f"\nCCSD iteration: {total:.4e} flops, peak temporary memory {peak / 2**20:.1f} MiB, "
          f"backend {options.backend}")
