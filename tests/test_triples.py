"""(T) correction against PySCF's CCSD(T) on the same molecule, basis, SCF and amplitudes.

References are computed in the test with PySCF 2.x: RHF (conv_tol 1e-11), CCSD
(conv_tol 1e-10; water with and without one frozen core orbital, N2 with, H2O2
without), ``mycc.ccsd_t()``. Tessera gets PySCF's t1/t2 and its own MO integrals. Both
executors, two MO tile sizes, two occupied tilings, point-group symmetry on (C2v, D2h, Cs, C2h)
and off (C1). A brute-force einsum of the same formula checks the kernel exactly
(PySCF's (T) differs from it by ~1e-11: it uses the Fock diagonal of its own integrals).
"""

from dataclasses import replace

import numpy as np
import pytest
from pyscf import cc, gto, lib, scf
from pyscf.scf import hf_symm

from tessera.backends.context import Context
from tessera.chem.integrals import transform
from tessera.chem.reference import Reference
from tessera.chem.triples import TriplesResult, triples_correction
from tessera.errors import BuildError, InputError, ShapeError
from tessera.tensor.block_tensor import BlockTensor

WATER = "O 0 0 0.11779; H 0 0.755453 -0.471161; H 0 -0.755453 -0.471161"
SYSTEMS = {   # name: (atoms, basis, symmetry, frozen cores); water C2v, N2 D2h, H2O2 C1,
             # HNO Cs, trans-diazene C2h
    "water": (WATER, "cc-pvdz", True, (0, 1)),
    "n2": ("N 0 0 0; N 0 0 1.0977", "6-31g", "D2h", (1,)),
    "h2o2": ("O 0 0 0; O 1.452 0 0; H -0.16757049 0 0.95033948; H 1.64638374 -0.89780731 -0.32677514",
             "6-31g", False, (0,)),
    "hno": ("N 0 0 0; O 1.21 0 0; H -0.33 1.02 0", "6-31g", True, (0,)),
    "diazene": ("N 0 0.6235 0; N 0 -0.6235 0; H 0.95 0.98 0; H -0.95 -0.98 0", "6-31g", True, (0, 2)),
}


def _system(atoms, basis, symmetry, frozen):
    mol = gto.M(atom=atoms, basis=basis, symmetry=symmetry, verbose=0)
    mf = scf.RHF(mol)
    mf.conv_tol = 1e-11
    mf.kernel()
    orbsym = (np.asarray(hf_symm.get_orbsym(mol, mf.mo_coeff)) if mol.symmetry
              else np.zeros(mol.nao, dtype=int))
    ref = Reference(mol, mf.e_tot, mol.energy_nuc(), np.asarray(mf.mo_coeff), mf.mo_energy,
                    orbsym, mol.nelectron // 2, mol.groupname)
    runs = {}
    for nfz in frozen:
        mycc = cc.CCSD(mf, frozen=nfz or None)
        mycc.conv_tol = 1e-10
        mycc.kernel()
        runs[nfz] = (mycc.t1, mycc.t2, mycc.ccsd_t())
    return ref, runs


@pytest.fixture(scope="module")
def systems():
    with lib.with_omp_threads(1):      # tiny molecules; OpenMP spinning hurts on a busy machine
        return {name: _system(*args) for name, args in SYSTEMS.items()}


def _inputs(ref, t1, t2, nfz, tile):
    ints = transform(ref, nfz, tile)
    return (ints, BlockTensor.from_dense(t1, (ints.o, ints.v)),
            BlockTensor.from_dense(t2, (ints.o, ints.o, ints.v, ints.v)))


@pytest.mark.parametrize("backend", ["serial", "threads"])
@pytest.mark.parametrize("name", ["water", "n2", "h2o2", "hno", "diazene"])
def test_triples_match_pyscf(systems, name, backend):
    ref, runs = systems[name]
    assert ref.point_group == {"water": "C2v", "n2": "D2h", "h2o2": "C1", "hno": "Cs", "diazene": "C2h"}[name]
    for nfz, (t1, t2, e_ref) in runs.items():
        for tile, occ_tile in ((32, None), (3, 1)):       # MO tiles; occupied tiles of the tasks
            ints, bt1, bt2 = _inputs(ref, t1, t2, nfz, tile)
            with Context(backend) as ctx:
                res = triples_correction(ints, bt1, bt2, context=ctx, occ_tile=occ_tile)
            ctx.close()
            assert isinstance(res, TriplesResult)
            assert abs(res.energy - e_ref) < 1e-9, (name, nfz, tile, occ_tile, res.energy, e_ref)
            assert res.tasks > 0 and res.flops > 0 and res.seconds > 0


def test_executors_agree_and_default_context(systems):
    ref, runs = systems["water"]
    ints, t1, t2 = _inputs(ref, *runs[0][:2], 0, 4)
    serial = triples_correction(ints, t1, t2, context=Context("serial"), occ_tile=2)
    pool = Context("threads", workers=3)
    threads = triples_correction(ints, t1, t2, context=pool, occ_tile=2)
    pool.close()
    with Context("serial") as ctx:
        current = triples_correction(ints, t1, t2, occ_tile=2)    # the current context
    assert ctx.stats["(T) triples"][0] == 1 and ctx.flops == current.flops
    assert abs(serial.energy - threads.energy) < 1e-15
    assert serial.energy == current.energy
    assert serial.flops == threads.flops and serial.tasks == threads.tasks


def test_packed_batches_run_on_threads_not_forked_workers(systems):
    """Resident (T) with several virtual irreps runs its compiled batches on the threads
    (they release the GIL); in C1 or blocked in the virtual index it stays forkable."""
    from tessera.chem.triples_tasks import TriplesTasks
    for name, vblock, forkable in (("water", None, False), ("water", 2, True), ("h2o2", None, True)):
        ref, runs = systems[name]
        ints, t1, t2 = _inputs(ref, *runs[0][:2], 0, 32)
        job = TriplesTasks(ints, t1, t2, None, None, True, vblock)
        assert job.task_set(1).forkable is forkable, (name, vblock)


def test_symmetry_forbidden_blocks_are_never_formed(systems):
    """Water's orbitals labelled C2v or all C1: the same E(T), a quarter of the GEMM flops."""
    ref, runs = systems["water"]
    t1, t2, e_ref = runs[0]
    res = {}
    for label, r in (("C2v", ref), ("C1", replace(ref, orbsym=np.zeros_like(ref.orbsym),
                                                    point_group="C1"))):
        ints, bt1, bt2 = _inputs(r, t1, t2, 0, 8)
        assert len(ints.v.tiles_by_irrep) == (4 if label == "C2v" else 1)
        res[label] = triples_correction(ints, bt1, bt2, context=Context("serial"))
    assert abs(res["C2v"].energy - res["C1"].energy) < 1e-13
    assert abs(res["C2v"].energy - e_ref) < 1e-9
    assert res["C2v"].flops <= res["C1"].flops / 4


def _brute_force(ints, t1, t2):
    """E(T) = 1/3 sum W r3(W + V) / D with full o^3 v^3 arrays (tiny systems only)."""
    ovvv, ovoo, ovov = (ints.tensors[n].to_dense() for n in ("ovvv", "ovoo", "ovov"))
    w0 = np.einsum("iabf,kjcf->ijkabc", ovvv, t2) - np.einsum("iajm,mkbc->ijkabc", ovoo, t2)
    perms = [(0, 1, 2), (0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0)]
    w = sum(w0.transpose(p + tuple(3 + x for x in p)) for p in perms)
    v = (np.einsum("ia,jbkc->ijkabc", t1, ovov) + np.einsum("jb,iakc->ijkabc", t1, ovov)
         + np.einsum("kc,iajb->ijkabc", t1, ovov))
    e3 = lambda e: e[:, None, None] + e[None, :, None] + e[None, None, :]  # noqa: E731
    d = e3(ints.eo)[..., None, None, None] - e3(ints.ev)
    x = w + v
    r3 = (4 * x + x.transpose(0, 1, 2, 4, 5, 3) + x.transpose(0, 1, 2, 5, 3, 4)
          - 2 * x.transpose(0, 1, 2, 3, 5, 4) - 2 * x.transpose(0, 1, 2, 5, 4, 3)
          - 2 * x.transpose(0, 1, 2, 4, 3, 5))
    return np.einsum("ijkabc,ijkabc->", w, r3 / d) / 3


@pytest.mark.parametrize("name", ["n2", "h2o2"])
def test_kernel_equals_brute_force_formula(systems, name):
    ref, runs = systems[name]
    nfz, (t1, t2, _) = next(iter(runs.items()))
    ints, bt1, bt2 = _inputs(ref, t1, t2, nfz, 2)
    e = triples_correction(ints, bt1, bt2, context=Context("serial"), occ_tile=2).energy
    assert abs(e - _brute_force(ints, t1, t2)) < 1e-14


def test_bad_input_is_reported(systems):
    ref, runs = systems["water"]
    ints, t1, t2 = _inputs(ref, *runs[0][:2], 0, 8)
    with pytest.raises(ShapeError, match="t1 must be a BlockTensor"):
        triples_correction(ints, t2, t1, context=Context("serial"))
    other, _, _ = _inputs(ref, *runs[0][:2], 0, 3)
    with pytest.raises(ShapeError):
        triples_correction(other, t1, t2, context=Context("serial"))
    for bad in (0, -2, 1.5, True, "4"):
        with pytest.raises(InputError, match="occ_tile"):
            triples_correction(ints, t1, t2, context=Context("serial"), occ_tile=bad)


def test_missing_compiled_kernel_is_a_clear_error(systems, monkeypatch):
    from tessera.chem import triples_native
    ref, runs = systems["water"]
    ints, t1, t2 = _inputs(ref, *runs[0][:2], 0, 8)
    monkeypatch.setattr(triples_native, "_MODULE", "tessera.chem._no_such_kernel")
    triples_native._library.cache_clear()
    try:
        with pytest.raises(BuildError, match=r"not built; run `make`"):
            triples_correction(ints, t1, t2, context=Context("serial"))
    finally:
        monkeypatch.undo()
        triples_native._library.cache_clear()
    assert triples_correction(ints, t1, t2, context=Context("serial")).energy < 0


def test_stale_or_missing_kernel_stops_a_run_before_its_scf(monkeypatch):
    """A library built from another version of the C source is refused (never called
    with the wrong arguments), and a CCSD(T) run without the kernel stops before the SCF."""
    from tessera.chem import triples_native
    from tessera.chem.job import Job, Report, RunOptions
    phases = []

    class Phases(Report):
        def phase(self, name):
            phases.append(name)
    monkeypatch.setattr(triples_native, "_ABI", triples_native._ABI + 1)
    triples_native._library.cache_clear()
    try:
        with pytest.raises(BuildError, match=r"another version of its source .* run `make`"):
            triples_native.require()
        monkeypatch.setattr(triples_native, "_MODULE", "tessera.chem._no_such_kernel")
        triples_native._library.cache_clear()
        with pytest.raises(BuildError, match=r"not built; run `make`"):
            Job(RunOptions("examples/water.xyz", basis="sto-3g", method="ccsd(t)"), Phases()).kernel()
        assert phases == []
    finally:
        monkeypatch.undo()
        triples_native._library.cache_clear()
    triples_native.require()


@pytest.mark.parametrize("name", ["water", "n2", "h2o2"])
def test_public_kernel_on_row_slabs(systems, name):
    """The kernel API the task set uses: RowSlabs of task-tile rows hold each tensor's
    allowed elements once; ov2/t2s made on access (SwappedRows, the distributed form)
    give the same E(T) as the materialized ones (add_swapped, the resident form)."""
    from tessera.chem.triples import SOURCES, KernelInputs, RowSlab, TripleKernel
    from tessera.chem.triples_tasks import TriplesTasks
    ref, runs = systems[name]
    nfz, (t1, t2, _) = next(iter(runs.items()))
    ints, bt1, bt2 = _inputs(ref, t1, t2, nfz, 3)
    e_serial = triples_correction(ints, bt1, bt2, context=Context("serial"), occ_tile=1).energy
    job = TriplesTasks(ints, bt1, bt2, 1, None, resident=True)
    lay, o, v = job.lay, ints.o, ints.v
    tensors = dict(zip(SOURCES, (ints.ovvv, bt2, ints.ovov, ints.ovoo)))
    slabs, held = [], dict.fromkeys(SOURCES, 0)
    for n, tl in enumerate(o.tiles):                  # task tiles of one orbital, as fetched rows
        for x in range(tl.offset, tl.offset + tl.size):
            r = x - tl.offset
            parts = {s: [(k, b[r:r + 1]) for k, b in t.blocks.items() if k[0] == n]
                     for s, t in tensors.items()}
            slabs.append(RowSlab.from_blocks(lay, o, v, x, x + 1, parts))
            for s, nb in slabs[-1].nbytes().items():
                held[s] += nb
    assert held == {s: t.nbytes for s, t in tensors.items()}
    lazy = KernelInputs.from_slabs(lay, job.eo, job.t1d, o.irreps, slabs,
                                   scratch=(np.empty(v.dim ** 3), np.empty(o.dim * v.dim ** 2)))
    whole = KernelInputs.from_slabs(lay, job.eo, job.t1d, o.irreps,        # add_swapped slabs
                                    [job._slab(x, {}) for x in range(len(job.tiles))])
    # the same fused operands without their row addresses: the batches' GEMMs from Python
    # (with them, packed batches run in one compiled call: triples_native.batch_packed)
    python = KernelInputs.from_slabs(lay, job.eo, job.t1d, o.irreps,
                                     [job._slab(x, {}) for x in range(len(job.tiles))])
    assert whole.native_rows is not None and lazy.native_rows is None
    python.native_rows = None
    pool = TripleKernel.new_pool(lay)
    energy = {"lazy": 0.0, "whole": 0.0, "python": 0.0}
    for a, b, c in job.triples:
        I, J, K = (job.tiles[x] for x in (a, b, c))
        G = I[2] ^ J[2] ^ K[2]
        if lay.ntrip[G]:
            for label, inp in (("lazy", lazy), ("whole", whole), ("python", python)):
                energy[label] += TripleKernel(inp, G, pool).tile_energy(I[:2], J[:2], K[:2])
    assert all(abs(e - e_serial) < 1e-14 for e in energy.values()), energy
    # task tiles of several orbitals, batches of up to 3 k: the compiled batch's stacked
    # GEMMs over k against the Python batch
    job = TriplesTasks(ints, bt1, bt2, 4, None, resident=True)
    compiled, python = (KernelInputs.from_slabs(lay, job.eo, job.t1d, o.irreps,
                                                [job._slab(x, {}) for x in range(len(job.tiles))]) for _ in range(2))
    python.native_rows = None
    pool, energy = TripleKernel.new_pool(lay, 3), {"compiled": 0.0, "python": 0.0}
    for a, b, c in job.triples:
        I, J, K = (job.tiles[x] for x in (a, b, c))
        G = I[2] ^ J[2] ^ K[2]
        if lay.ntrip[G]:
            for label, inp in (("compiled", compiled), ("python", python)):
                energy[label] += TripleKernel(inp, G, pool, batch=3).tile_energy(I[:2], J[:2], K[:2])
                if lay.c1:      # compiled C1 batches leave their buffer zero (their GEMMs accumulate
                    # into it); the Python one's written buffer is zeroed before the next compiled one
                    assert pool.zeroed == (label == "compiled") and (label == "python" or not pool[0].any())
    assert all(abs(e - e_serial) < 1e-14 for e in energy.values()), energy


def test_flops_equal_the_minimal_count(systems):
    """Executed GEMM flops equal the minimal count of (T) on the block structure, which in
    C1 is 4 v^3 (v + o) per W0 term group (single orbital i, j or k): 3 for each of the
    C(o, 3) triples i > j > k, 2 for the o (o - 1) with two equal orbitals, 1 for i = j = k
    (2 o^3 v^4 + 2 o^4 v^3 for large o). Batches of several k and a single one agree."""
    from math import comb
    ref, runs = systems["h2o2"]
    t1, t2, _ = runs[0]
    ints, bt1, bt2 = _inputs(ref, t1, t2, 0, 4)
    o, v = ints.o.dim, ints.v.dim
    c1 = 4 * v ** 3 * (v + o) * (3 * comb(o, 3) + 2 * o * (o - 1) + o)
    batched = triples_correction(ints, bt1, bt2, context=Context("serial"), occ_tile=4)
    single = triples_correction(ints, bt1, bt2, context=Context("serial"), occ_tile=1)
    for res in (batched, single):
        assert res.minimal_flops == c1 and res.flops == c1
    assert abs(batched.energy - single.energy) < 1e-14
    ref, runs = systems["water"]                         # C2v: fewer than C1, still executed exactly
    ints, bt1, bt2 = _inputs(ref, *runs[0][:2], 0, 8)
    res = triples_correction(ints, bt1, bt2, context=Context("serial"))
    o, v = ints.o.dim, ints.v.dim
    assert res.flops == res.minimal_flops < 4 * v ** 3 * (v + o) * (3 * comb(o, 3) + 2 * o * (o - 1) + o) / 3


def test_task_costs_count_the_orbital_triples_they_run(systems):
    """A task's cost is the number of orbital triples i >= j >= k its tile triple holds
    (counted here by the kernel's own loops) times the virtual triples of its irrep, so
    tasks on the diagonal cost less and the costs add up to C(o + 2, 3) in C1."""
    from math import comb
    from tessera.chem.triples_tasks import TriplesTasks
    ref, runs = systems["h2o2"]                          # C1
    ints, bt1, bt2 = _inputs(ref, *runs[0][:2], 0, 4)
    job = TriplesTasks(ints, bt1, bt2, 2, None, resident=True)
    ntrip, o = int(job.lay.ntrip[0]), ints.o.dim
    counts = []
    for a, b, c in job.triples:
        I, J, K = (job.tiles[x] for x in (a, b, c))
        counts.append(sum(1 for i in range(*I[:2]) for j in range(J[0], min(J[1], i + 1))
                          for k in range(K[0], min(K[1], j + 1))))
    costs = job.task_set(1).costs
    assert [int(c) for c in costs] == [n * ntrip for n in counts]
    assert sum(counts) == comb(o + 2, 3) and len(set(counts)) > 1


@pytest.mark.parametrize("name", ["water", "n2", "h2o2"])
def test_virtual_blocks_give_the_same_energy(systems, name):
    """The kernel blocked in the virtual index (tasks visit block triples {A, B, C}) gives
    the whole-space kernel's E(T) and its exact flop count, for blocks that split irreps
    unevenly (3, 4, 5 orbitals), blocks as large as the irreps, k batches of one and of
    several orbitals, serial and threads; N2 (D2h, 6-31G) has irreps without virtuals or
    occupied orbitals."""
    ref, runs = systems[name]
    nfz, (t1, t2, e_ref) = next(iter(runs.items()))
    ints, bt1, bt2 = _inputs(ref, t1, t2, nfz, 3)
    if name == "n2":
        assert len(set(ints.v.irreps.tolist())) < 8 and len(set(ints.o.irreps.tolist())) < 8
    whole = triples_correction(ints, bt1, bt2, context=Context("serial"))
    assert whole.virtual_block == 0
    for vblock, occ_tile, backend in ((4, None, "serial"), (3, 2, "threads"), (5, 1, "serial"),
                                      (ints.v.dim, 2, "serial")):
        with Context(backend) as ctx:
            res = triples_correction(ints, bt1, bt2, context=ctx, vblock=vblock, occ_tile=occ_tile)
        ctx.close()
        assert res.virtual_block == vblock
        assert abs(res.energy - whole.energy) < 1e-12, (vblock, occ_tile, res.energy, whole.energy)
        assert abs(res.energy - e_ref) < 1e-9
        assert res.flops == res.minimal_flops == whole.minimal_flops


def test_kernel_buffers_follow_the_budget(systems):
    """Counted elements, not timings: the buffers the kernel allocates per thread fit
    ``kernel_mb``, which picks the virtual block; the whole-space kernel's (~ v^3) do not.
    Smaller blocks allocate less; the memory estimate counts the same bytes."""
    from tessera.chem.triples_tasks import TriplesTasks
    ref, runs = systems["h2o2"]
    t1, t2, e_ref = runs[0]
    ints, bt1, bt2 = _inputs(ref, t1, t2, 0, 4)
    v, no = ints.v.dim, ints.o.dim

    def allocated(run_all=False, **opts):
        job = TriplesTasks(ints, bt1, bt2, None, None, True, opts.get("vblock"), opts.get("kernel_mb"))
        energy = sum(job.work(task, {}) for task in range(len(job.triples) if run_all else 1))
        assert abs(energy - e_ref) < 1e-9 or not run_all
        return job, 8 * sum(a.size for a in job.local.pool)

    whole, whole_bytes = allocated()
    assert whole.vblock is None and whole_bytes >= 8 * v ** 3
    budget = 0.02                                                   # MiB: below the whole-space kernel's
    assert whole_bytes > budget * 2 ** 20
    job, nbytes = allocated(run_all=True, kernel_mb=budget)
    assert 1 <= job.vblock < v and nbytes == job.pool_bytes <= budget * 2 ** 20
    n, k = job.vblock, max(v, no)                                   # C1: blocks of vblock orbitals
    # and the batch's (ov|ov) pairs over the frame (every virtual here)
    assert nbytes <= 8 * (19 * job.batch * n ** 3 + k * n * n + job.batch * n * k + (2 * job.batch + 1) * v * v)
    sizes = [allocated(vblock=b)[1] for b in (2, 4, 8)]                # same k batch
    assert sizes[0] < sizes[1] < sizes[2]
    res = triples_correction(ints, bt1, bt2, context=Context("serial"), kernel_mb=budget)
    assert res.virtual_block == job.vblock and res.kernel_buffer_bytes == nbytes


def test_chunks_above_one_need_windowed_tasks(systems):
    """``chunks`` > 1 streams windowed tasks: with local tensors, or distributed ones on the
    whole-space kernel (no windows), it is a one-line InputError, not silently ignored;
    ``chunks=1`` is one stage (a result's ``stages`` 1, the energy unchanged)."""
    from tessera.chem.triples_tasks import TriplesTasks
    ref, runs = systems["h2o2"]
    t1, t2, e_ref = runs[0]
    ints, bt1, bt2 = _inputs(ref, t1, t2, 0, 4)
    with Context("serial") as ctx:
        with pytest.raises(InputError, match=r"chunks=3 streams windowed .* local: drop chunks") as err:
            triples_correction(ints, bt1, bt2, context=ctx, chunks=3)
        assert "\n" not in str(err.value)
        one = triples_correction(ints, bt1, bt2, context=ctx, chunks=1)
    ctx.close()
    assert one.stages == 1 and abs(one.energy - e_ref) < 1e-9
    # the distributed planning (resident=False) on the whole-space kernel: no windows to stream
    with pytest.raises(InputError, match="whole-space kernel fits here: give vblock too"):
        TriplesTasks(ints, bt1, bt2, 4, 0.8, False, None, None, nranks=2, chunks=3)
    assert TriplesTasks(ints, bt1, bt2, 4, 0.8, False, 7, None, nranks=2, chunks=3).stream.count == 3


def test_streamed_stages_are_passed_not_counted(systems):
    """Streamed (T) tasks (``chunks`` 3, windows of a blocked kernel: cache_mb 1.0, windows
    4 orbitals wide, the 4 virtual tensor tiles, 200 tasks; 0.8 cut the first tile into
    patches, 350 tasks, twice the time: patches in stages are checked in
    test_triples_mpi.py's streamed runs; the distributed
    planning on local tensors, every part served as a view) run on the serial executor
    with each stage's ``need`` asked twice: the same energy as asked once and as the
    unstreamed windowed tasks (1e-12), PySCF's to 1e-9; a task's W is dropped after its
    last stage. (With a stage counted from calls to need, the second call moved to the
    next stage.)"""
    from tessera.chem.triples_tasks import TriplesTasks
    ref, runs = systems["h2o2"]
    t1, t2, e_ref = runs[0]
    ints, bt1, bt2 = _inputs(ref, t1, t2, 0, 4)

    def energy(chunks, twice=False):
        job = TriplesTasks(ints, bt1, bt2, 4, 1.0, False, 7, None, nranks=1, chunks=chunks)
        assert len(job.windows.vtiles) == 4 and len(job.tasks) == 200
        ts = job.task_set(1)
        if twice:
            ts = replace(ts, need=lambda i, s: (job.need(i, s), job.need(i, s))[1])
        with Context("serial") as ctx:
            out = float(sum(ctx.run_tasks(ts).tolist()))
        ctx.close()
        assert job.acc == {} and job.stage_requests == {} and job.held.now["W"] == 0
        return out, ts.stages
    (plain, one), (once, three), (twice, _) = energy(None), energy(3), energy(3, twice=True)
    assert (one, three) == (1, 3)
    assert abs(once - plain) < 1e-12 and abs(twice - plain) < 1e-12, (plain, once, twice)
    assert abs(plain - e_ref) < 1e-9


@pytest.mark.parametrize("nv", [1, 2, 15, 17, 33])
def test_dense_sweep_equals_the_formula_on_edge_tiles(nv):
    """The compiled one-irrep sweep (W formed once, four of its permutations gathered into
    tiles of 16 virtuals, two read in place) against numpy on
    random operands whose sizes leave partial and diagonal tiles: sum_abc W r3(W + V) / D,
    W = A + B[bac] + C[cab], V = t1i (x) Pjk + ... (``triples_native.energy_dense``); dense,
    and strided as in the compiled C1 batch's layout."""
    from tessera.chem.triples_native import dense_scratch_size, energy_dense
    rng = np.random.default_rng(nv)
    A, B, C = (rng.standard_normal((nv, nv, nv)) for _ in range(3))
    ev = rng.random(nv) + 1.0
    t1i, t1j, t1k = rng.standard_normal((3, nv))
    Pjk, Pik, Pij = rng.standard_normal((3, nv, nv))
    eijk = -2.5
    w = A + B.transpose(1, 0, 2) + C.transpose(1, 2, 0)
    v = (np.einsum("a,bc->abc", t1i, Pjk) + np.einsum("b,ac->abc", t1j, Pik)
         + np.einsum("c,ab->abc", t1k, Pij))
    z = w + v
    r3 = (4 * z + z.transpose(2, 0, 1) + z.transpose(1, 2, 0) - 2 * z.transpose(0, 2, 1)
          - 2 * z.transpose(2, 1, 0) - 2 * z.transpose(1, 0, 2))
    d = eijk - ev[:, None, None] - ev[None, :, None] - ev[None, None, :]
    expected = float(np.sum(w * r3 / d))
    scratch = np.full(dense_scratch_size(nv), np.nan)          # the sweep must not read it unset
    got = energy_dense(A.ravel(), B.ravel(), C.ravel(), ev, eijk, t1i, t1j, t1k,
                       Pjk.ravel(), Pik.ravel(), Pij.ravel(), scratch)
    assert abs(got - expected) <= 1e-12 * max(1.0, abs(expected))
    # the batch layout of triples_native.batch_dense: [s, k, pairs], here k = 1 of 3 (NaN around)
    strided = []
    for X in (A, B, C):
        buf = np.full((nv, 3, nv * nv), np.nan)
        buf[:, 1] = X.reshape(nv, nv * nv)
        strided.append(buf.reshape(-1)[nv * nv:][:(nv - 1) * 3 * nv * nv + nv * nv])
    got = energy_dense(*strided, ev, eijk, t1i, t1j, t1k, Pjk.ravel(), Pik.ravel(), Pij.ravel(), scratch,
                       ld=3 * nv * nv)
    assert abs(got - expected) <= 1e-12 * max(1.0, abs(expected))


@pytest.mark.parametrize("nv, nirrep", [(9, 4), (30, 8), (40, 2)])
def test_packed_sweep_equals_the_formula(nv, nirrep):
    """The compiled point-group sweep (W formed once from the three packed layouts, then read
    in place at six permutations through the strides of its irrep blocks, tiles within
    irreps) against numpy on random packed layouts:
    W[xyz] = A[x; y, z] + Bs[y; x, z] + C[z; x, y], V from the packed (x t|y u) rows; irreps
    in a shuffled order, of one orbital up to several tiles (``triples_native.energy_packed``)."""
    from tessera.chem.triples import NIRREP, VirtualLayout
    from tessera.chem.triples_native import energy_packed, packed_scratch_size
    rng = np.random.default_rng(nv)
    virr = rng.permutation(NIRREP)[np.sort(rng.integers(0, nirrep, nv))]
    vr = np.zeros((NIRREP, 2), dtype=np.int64)
    for g in set(virr.tolist()):
        pos = np.flatnonzero(virr == g)
        vr[g] = pos[0], pos[-1] + 1
    orange = np.zeros((NIRREP, 2), dtype=np.int64)
    ev = rng.random(nv) + 1.0
    lay = VirtualLayout(vr, virr, ev, orange)
    rel = np.arange(nv) - vr[virr, 0]
    x, y, z = np.meshgrid(*(np.arange(nv),) * 3, indexing="ij")
    gx, gy, gz = virr[x], virr[y], virr[z]

    def packed(G, s, t, u):                   # position of (s; t, u) in a layout of irrep G
        gs, gt, gu = virr[s], virr[t], virr[u]
        return lay.foff[G, gs] + rel[s] * lay.npair[G ^ gs] + lay.poff[G ^ gs, gt] + rel[t] * lay.n[gu] + rel[u]

    def dense_row(h, row):                    # the packed pairs of irrep h at (t, u)
        t, u = np.meshgrid(np.arange(nv), np.arange(nv), indexing="ij")
        allowed = (virr[t] ^ virr[u]) == h
        if not row.size:
            return np.zeros((nv, nv))
        return np.where(allowed, row[np.where(allowed, lay.poff[h, virr[t]] + rel[t] * lay.n[virr[u]] + rel[u], 0)], 0.0)
    for G in sorted(set((gx ^ gy ^ gz).ravel().tolist())):
        allowed = (gx ^ gy ^ gz) == G
        A, Bs, C = (rng.standard_normal(int(lay.ntrip[G])) for _ in range(3))
        w = np.where(allowed, A[np.where(allowed, packed(G, x, y, z), 0)] + Bs[np.where(allowed, packed(G, y, x, z), 0)]
                     + C[np.where(allowed, packed(G, z, x, y), 0)], 0.0)
        t1i, t1j, t1k = rng.standard_normal((3, nv))
        hs = [int(h) for h in rng.integers(0, nirrep, 3)]
        rows = [rng.standard_normal(int(lay.npair[h])) for h in hs]
        Pjk, Pik, Pij = (dense_row(h, r) for h, r in zip(hs, rows))
        v = (np.einsum("a,bc->abc", t1i, Pjk) + np.einsum("b,ac->abc", t1j, Pik)
             + np.einsum("c,ab->abc", t1k, Pij)) * allowed
        zz = w + v
        r3 = (4 * zz + zz.transpose(2, 0, 1) + zz.transpose(1, 2, 0) - 2 * zz.transpose(0, 2, 1)
              - 2 * zz.transpose(2, 1, 0) - 2 * zz.transpose(1, 0, 2))
        eijk = -2.5
        d = eijk - ev[:, None, None] - ev[None, :, None] - ev[None, None, :]
        expected = float(np.sum(w * r3 / d))
        scratch = np.full(packed_scratch_size(nv, A.size), np.nan)   # the sweep must not read it unset
        got = energy_packed(G, A, Bs, C, ev, eijk, t1i, t1j, t1k, rows, hs, lay, scratch)
        assert abs(got - expected) <= 1e-12 * max(1.0, abs(expected)), (G, got, expected)
