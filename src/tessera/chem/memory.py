"""The peak memory per rank of a whole run, estimated before the SCF, and ``--max-memory``.

From the molecule, basis, symmetry (the orbitals per irrep of the initial guess, as
``tessera plan``), ranks and backend; bytes per rank, per phase:

  baseline   measured, not modelled: this process's peak resident memory so far (the
             interpreter, NumPy, PySCF, MPI and Tessera's modules)
  scf        Tessera's RHF: SCF_MATRICES nao x nao matrices (overlap, core Hamiltonian,
             orthogonaliser, Fock, density, the DIIS history of Fock and error matrices,
             the Fock build's blocks), plus one Fock buffer per thread, plus the AO
             integrals the SCF keeps in memory (``scf_integral_bytes``: one process the
             8-fold integrals, several ranks with a point group the fullest rank's share
             of the representative quartets, without one its share of the screened
             blocks) when it will keep them: mode incore, or auto and they fit the budget
             beside the baseline and the matrices (``scf.incore.fits``' rule; otherwise the
             SCF is direct and says so)
  transform  the MO integrals (this rank's share) and the half-transformed rows
             ((P Q | AO pair) rows of every class, this rank's share), plus each thread's
             slabs (AO integrals of one unit of AO pairs, its half transform, one chunk of
             rows in the finish); in one local process whose 8-fold AO integrals fit
             the memory budget per rank (``backends.budget``): the rows of all active pairs and the larger of
             the 8-fold AO integrals and the MO integrals
  ladder     a local run, before its first CCSD iteration: the integrals with vvvv and
             the ladder's V+- made from it (``chem.ccsd._ladder_form``), which then frees vvvv;
             the transform holds vvvv too, the iterations hold V+- instead (the job frees
             them when CCSD ends: (T) reads no vvvv)
  ccsd       one iteration as ``backends.cost_model.memory_parts`` counts it (the one estimator
             of the cost model): T2 + integrals of the fullest rank, every intermediate of
             the iteration's plans (each counted once, as stored: canonical ones by their
             canonical blocks), the structure's ``held`` (the constants D1, D2, L, VO and
             the packed amplitude vectors of a DIIS update, ``chem.ccsd.PACKED_VECTORS``;
             the DIIS history is in a file), the executor's working set
             (its gathered matrices of the constants: a local run's ladder dressing M+-,
             gathered in one layout, are held as those alone, ``chem.ccsd.IterationStructure``)
  (t)        the integrals and T2 (CCSD frees its gathered matrices; under MPI also
             CCSD's other global arrays, pooled until the context closes), the packed rows
             (T) reads (on one process every task tile's rows stay, with their pair-swapped
             copies unless the kernel is blocked in the virtual index; a rank holds one
             task's rows, as the run's task plan from the budget per rank counts them, and
             its row cache), kernel buffers per thread (``triples_plan.kernel_plan``: ~v^3/nirrep,
             or bounded by the kernel budget when blocked)

and the peak is the baseline plus the largest phase.

Ranks on one node (MPI): the default windows (``MPI_Win_allocate``, and ghost mode's
node segments) live in shared memory, and the one-sided executor reads the blocks other
ranks of its node hold with plain loads. Every page of another rank's window that a
rank touches counts in that rank's resident size (VmRSS/ru_maxrss count touched shared
pages), and one CCSD iteration touches nearly all of them (measured: 51 of 57 MiB per
rank, glycine 6-31G, 2 ranks; the collective executor moves blocks by collectives into
private buffers and touches none). The part ``other ranks' windows`` counts them:
(ranks on the node - 1) times a rank's own window bytes (the transform: the MO
integrals; CCSD and (T): the integrals, T2, the constants and every intermediate;
not the packed amplitude vectors, private arrays). They are in each rank's resident
peak but in the node's memory once, so ``check`` compares a rank's *own* share (the
peak less those pages) with the memory allowed per rank (``backends.budget``), and when
it does not fit names what would: more ranks (and how many fit on a node of this one's
available memory, so how many nodes), frozen core, a smaller tile.
"""

from __future__ import annotations

import functools
import resource
import sys

import numpy as np

from tessera.backends.budget import available_memory, executor_cache_bytes, memory_budget
from tessera.backends.context import one_blas_thread
from tessera.errors import InputError

SCF_MATRICES = 30
PHASES = ("scf", "transform", "ladder", "ccsd", "(t)")
SHARED = "other ranks' windows"     # pages of same-node windows this rank reads (module docstring)
# The estimate's matrices are small: one BLAS thread (``one_blas_thread``: several threads
# of a BLAS pool, next to the OpenMP threads PySCF's integral calls leave spinning, ran its
# guess and pair orbits several times slower, measured).


def resident_peak() -> int:
    """This process's peak resident memory so far, bytes (ru_maxrss)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)


def _mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:,.0f} MiB" if nbytes < 10 * 2**30 else f"{nbytes / 2**30:,.1f} GiB"


class MemoryEstimate:
    """Bytes per rank by phase and part (see the module docstring); ``peak`` = baseline
    plus the largest phase (the resident peak a rank will measure); ``own`` = the same
    without the pages of other ranks' windows (this rank's share of its node's memory)."""

    def __init__(self, nranks: int, baseline: int, parts: dict, node_ranks: int = 1):
        self.nranks, self.node_ranks, self.baseline, self.parts = nranks, node_ranks, int(baseline), parts
        self.phases = {ph: int(sum(parts[ph].values())) for ph in PHASES if ph in parts}
        self.largest = max(self.phases, key=self.phases.get)
        self.peak = self.baseline + self.phases[self.largest]
        own = {ph: n - parts[ph].get(SHARED, 0) for ph, n in self.phases.items()}
        self.own_largest = max(own, key=own.get)
        self.own = self.baseline + own[self.own_largest]

    def as_dict(self) -> dict:
        return {"ranks": self.nranks, "ranks_per_node": self.node_ranks, "baseline": self.baseline,
                "peak": self.peak, "own": self.own, "phases": self.phases,
                "parts": {ph: {k: int(v) for k, v in p.items()} for ph, p in self.parts.items()}}

    def render(self) -> str:
        lines = [f"Memory per rank (estimate, {self.nranks} rank(s)): peak {_mib(self.peak)} = baseline "
                 f"{_mib(self.baseline)} (measured) + {self.largest} {_mib(self.phases[self.largest])}"]
        if self.own != self.peak:
            lines[0] += (f"; {self.node_ranks} ranks per node share their windows: "
                         f"{_mib(self.own)} of it are this rank's own, the rest is counted once per node")
        for ph, nbytes in self.phases.items():
            detail = ", ".join(f"{k} {_mib(v)}" for k, v in self.parts[ph].items() if v)
            lines.append(f"  {ph:10s} {_mib(nbytes):>10s}  ({detail})")
        return "\n".join(lines)


class RunShape:
    """What the estimate needs of a run: the orbitals per irrep (of the initial guess),
    the molecule's size and the run's choices."""

    @one_blas_thread
    def __init__(self, mol, method: str, backend: str, variant, nranks: int, tile: int,
                 occ_tile: int | None, nfrozen: int, distributed: bool, reference=None,
                 node_ranks: int | None = None, shared_windows: bool = True,
                 scf_mode: str | None = None, budget: float | None = None):
        """``reference``: the orbitals when they are known before the run (an FCIDUMP, a
        PySCF mean field, a checkpoint), else the initial guess of ``mol`` gives them.
        ``node_ranks``: ranks on one node (default: all of them, when distributed);
        ``shared_windows``: whether they map each other's windows (module docstring).
        ``scf_mode``: the mode of Tessera's SCF when the run has one (None: no SCF of
        ours); ``budget``: the memory budget per rank in bytes (``backends.budget``), for
        the SCF's auto mode and the share distributed (T) tasks may hold
        (``triples_budget.window_budget``)."""
        from tessera.backends.local import available_cores
        from tessera.chem.ao2mo_symmetry import pair_orbits
        from tessera.chem.job import frozen_core_orbitals
        from tessera.chem.scf.driver import guess_orbitals
        if reference is not None:
            self.orbsym, self.nocc, self.group = np.asarray(reference.orbsym), reference.nocc, reference.point_group
        else:
            self.orbsym, self.nocc, self.group, _ = guess_orbitals(mol)
        self.nao = int(mol.nao) if mol is not None else len(self.orbsym)
        self.chemcore = frozen_core_orbitals(mol) if mol is not None else 0
        # AO pairs the transform half-transforms: in memory one per point-group orbit, by
        # units those of one shell pair per orbit (chem/ao2mo_symmetry.py)
        npair = self.nao * (self.nao + 1) // 2
        counts = []
        for by_shell_pair in (False, True):
            orbits = pair_orbits(mol, by_shell_pair=by_shell_pair) if mol is not None else None
            counts.append(npair if orbits is None else len(orbits.reps))
            if not by_shell_pair:          # the in-memory rows' doubles with orbits
                self.half_doubles = None if orbits is None else orbits.half_doubles(self.orbsym[int(nfrozen):])
        self.ao_pair_reps, self.ao_pair_unit_columns = counts
        # an FCIDUMP's MO integrals, held whole while its classes are filled
        eri = getattr(reference, "eri_mo", None)
        self.mo_eri_bytes = int(eri.nbytes) if eri is not None else 0
        threads = available_cores() if backend in ("threads", "auto") and not distributed else 1
        self.method, self.backend, self.variant = method, backend, variant
        self.nranks, self.tile, self.occ_tile = int(nranks), int(tile), occ_tile
        self.nfrozen, self.threads, self.distributed = int(nfrozen), int(threads), bool(distributed)
        self.node_ranks = int(node_ranks or nranks) if distributed else 1
        self.shared_windows = bool(shared_windows)
        self.mol = mol if scf_mode is not None else None
        self.scf_mode, self.budget = scf_mode, budget

    @functools.cached_property
    def scf_tasks(self):
        """The task list of the SCF's Fock build (its shares of integrals over ranks)."""
        from tessera.chem.scf.fock import screened_tasks
        return screened_tasks(self.mol)

    def but(self, **changes) -> "RunShape":
        other = object.__new__(RunShape)
        other.__dict__.update(self.__dict__, **changes)
        return other


def scf_integral_bytes(shape: RunShape) -> int:
    """Bytes of AO integrals a rank of ``shape``'s SCF keeps in memory if its mode keeps
    them (0 for mode direct or no SCF of ours): the fullest rank's share of the 8-fold
    integrals (``scf.integrals.s8_shares``: all of them on one rank, the representatives
    of its static share of the shell pairs on several), else (several ranks without the
    compiled fill) of the screened blocks (``scf.fock.incore_shares``)."""
    from tessera.chem.scf.fock import incore_shares
    from tessera.chem.scf.integrals import s8_shares
    if shape.mol is None or shape.scf_mode not in ("auto", "incore"):
        return 0
    shares = s8_shares(shape.mol, shape.nranks)
    if shares is not None:
        return int(shares.max())
    return int(incore_shares(shape.scf_tasks, shape.nranks).max())


@one_blas_thread
def estimate(shape: RunShape, baseline: int | None = None) -> MemoryEstimate:
    """The per-rank estimate of ``shape`` (``baseline``: measured now unless given)."""
    from tessera.backends.cost_model import memory_parts
    from tessera.backends.iteration_counts import structure_stats
    from tessera.chem.ccsd import CCSDStructure

    from tessera.chem.integrals import CLASSES, SLAB_BYTES, class_tensor, make_spaces
    from tessera.chem.scf.incore import s8_bytes, s8_fits

    P, T = shape.nranks, shape.threads
    nao = shape.nao
    parts = {"scf": {"matrices": 8 * (SCF_MATRICES + T) * nao * nao}}
    baseline = resident_peak() if baseline is None else baseline
    ints = scf_integral_bytes(shape)
    if ints and (shape.scf_mode == "incore" or shape.budget is None
                 or baseline + parts["scf"]["matrices"] + ints <= shape.budget):
        parts["scf"]["AO integrals"] = ints
    if shape.method == "hf":
        return MemoryEstimate(P, baseline, parts, shape.node_ranks)
    s = structure_stats(CCSDStructure(shape.orbsym, shape.nocc, shape.nfrozen, shape.distributed), shape.tile,
                        shape.occ_tile or shape.tile, P, block_tasks=shape.distributed)
    # the executor's share: on several ranks the most of the executors the run may use;
    # a one-sided executor on several ranks of a node also touches their windows
    others = shape.node_ranks - 1 if shape.distributed and shape.shared_windows else 0
    packed = s["held"].get("packed vectors", 0) / P      # private arrays, in no window

    def executor_parts(backend, variant):
        m = dict(memory_parts(s, P, backend, variant, executor_cache_bytes(shape.budget)))
        if others and backend == "mpi-onesided":
            m[SHARED] = others * (m["stored"] + m["held"] - packed)
        return m
    executors = _executors(shape)
    ccsd = max((executor_parts(b, v) for b, v in executors), key=lambda m: sum(m.values()))
    o, v = make_spaces(shape.orbsym, shape.nocc, shape.nfrozen, shape.tile, shape.occ_tile)
    # a local run holds the ladder's V+- through CCSD (kept on vvvv's tensor; the job frees
    # them before (T)) and frees vvvv once they are made (chem.ccsd._ladder_form):
    # the iterations' ``stored`` has no vvvv, the transform and the start of CCSD hold it
    ladder = s["held"].get("ladder V+-", 0)
    stored = with_vvvv = ccsd["stored"]
    if ladder:
        g = class_tensor("vvvv", o, v)
        with_vvvv += 8 * sum(int(np.prod(g.block_shape(k))) for k in g.stored_keys())

    # the transform: half-transformed rows of every class, each thread's slabs
    npair = nao * (nao + 1) // 2
    nact = o.dim + v.dim
    rows = group_rows = 0
    for name in CLASSES:
        t = class_tensor(name, o, v)
        groups = {k[:2] for k in t.allowed_keys() if name[0] != name[1] or k[0] >= k[1]}
        sizes = [t.spaces[0].tiles[p].size * t.spaces[1].tiles[q].size for p, q in groups]
        rows += sum(sizes)
        group_rows = max([group_rows, *sizes])
    max_cols = max(1, min(SLAB_BYTES // (16 * npair), npair // (4 * P)))
    row_chunk = min(group_rows, max(1, SLAB_BYTES // (16 * npair)))
    slabs = 8 * (max_cols * (npair + nact * (nact + 1)) + 2 * row_chunk * npair)
    if shape.mo_eri_bytes:
        parts["transform"] = {"integrals": with_vvvv, "fcidump integrals": shape.mo_eri_bytes}
    elif not shape.distributed and s8_fits(nao, memory_budget(1)[0] if shape.budget is None else shape.budget):
        # in memory (chem/ao2mo.py, A): the rows of all active pairs, with first the 8-fold
        # AO integrals (half_e1), then, once those are freed, the MO integrals and each
        # thread's finish arrays (a chunk of rows and its result). With point-group orbits
        # (chem/ao2mo_symmetry.py) the rows have one column per orbit, transposed once
        # while the AO integrals are held; a finish takes a group's rows, their transpose and
        # the products into the symmetry-adapted basis that the group's classes share (with
        # orbits by AO-pair classes: PairOrbits.half_doubles)
        half = 8 * (nact * (nact + 1) // 2 * npair if shape.half_doubles is None else shape.half_doubles)
        if shape.ao_pair_reps < npair:
            first, finish = s8_bytes(nao) + half, 8 * group_rows * (3 * shape.ao_pair_reps + nact * nact)
        else:
            first, finish = s8_bytes(nao), 8 * row_chunk * (npair + nact * nact)
        parts["transform"] = {"half-transformed": half,
                              "AO integrals, or MO integrals and working": max(first, with_vvvv + T * finish)}
    else:
        parts["transform"] = {"integrals": with_vvvv, "half-transformed": 8 * rows * shape.ao_pair_unit_columns / P,
                              "slabs": T * slabs}
    parts["ccsd"] = dict(ccsd)
    if ladder:
        parts["ladder"] = {"integrals with vvvv": with_vvvv, "ladder V+-": ladder,
                           "ladder dressing M+-": s["dressing_bytes"]}
    if shape.method == "ccsd(t)":
        parts["(t)"] = {"integrals": stored, **triples_parts(o, v, P, T, resident=not shape.distributed,
                                                              memory_bytes=shape.budget, ranks_per_node=shape.node_ranks)}
    if shape.distributed:
        # this rank's windows in CCSD: T2 + integrals, constants, intermediates pooled
        # until the context closes after (T) (the packed vectors are freed with CCSD)
        windows = stored + ccsd["held"] - packed
        if "(t)" in parts:
            parts["(t)"]["ccsd arrays"] = windows - stored
        if others and any(b == "mpi-onesided" for b, _ in executors):
            parts["transform"][SHARED] = others * stored
            if "(t)" in parts:
                parts["(t)"][SHARED] = others * windows
    return MemoryEstimate(P, baseline, parts, shape.node_ranks)


def triples_parts(o, v, nranks: int, threads: int, resident: bool | None = None,
                  memory_bytes: float | None = None, ranks_per_node: int | None = None) -> dict:
    """Bytes per rank of what (T) holds beside the integrals and T2, over spaces ``o``, ``v``:
    ``rows`` (the packed rows it reads: on one process, ``resident``, every task tile's rows,
    with their pair-swapped copies unless the kernel is blocked in the virtual index, and
    the fused left operands of ``RowSlab.add_swapped``; a rank holds what one task of the
    run's plan holds, ``triples_plan.plan_counts``: with the blocked kernel one windowed
    task's rows and tables, ``chem.triples_window``, the rows kept from the previous task
    among them (a rank keeps only those the task reads), else one task's rows and the row
    cache) and ``kernel`` (buffers per thread, as ``triples_plan.kernel_plan`` sizes
    them; distributed, for the plan's task tile and windows). The one formula of (T) memory, also used
    by ``tessera plan --ranks``. Distributed, a task and the row cache are held to
    ``triples_budget.window_budget``: the rank's share of the (T) operands, so ``rows``
    falls as ranks grow down to a floor (what the task of fewest modelled seconds within
    the cap holds, ``fastest_task``: unstreamed at least ``task_floor``, set by o, v, the
    tiles and the machine; between nodes possibly streamed, set by the machine alone; on
    one node the streamed tasks' ``stream_floor`` when less), at most a share of
    ``memory_bytes``, the rank's memory budget, and at most the budget of half the ranks
    (``fastest_budget``: it never grows with the rank count)."""
    from tessera.chem.triples import VirtualLayout, irrep_ranges
    from tessera.chem.triples_plan import kernel_plan
    resident = nranks == 1 if resident is None else resident
    dims = _class_bytes(o, v)
    lay = VirtualLayout(irrep_ranges(v, "virtual"), v.irreps, np.zeros(v.dim), irrep_ranges(o, "occupied"))
    _, vblock, _, kernel = kernel_plan(lay, o, v, None, resident)   # the run's kernel choice
    swapped = 2 if vblock is None else 1      # the whole-space kernel keeps pair-swapped rows
    rows_t = swapped * (dims["ovvv"] + dims["t2"]) + dims["ovov"] + dims["ovoo"]
    if resident and vblock is None:           # + the fused left operands (t2 beside ovoo rows)
        rows_t += dims["t2"] + dims["ovoo"]
    if not resident:                          # one task of the run's plan (+ the row cache)
        from tessera.chem.integrals import class_tensor
        from tessera.chem.triples_plan import plan_counts
        from tessera.tensor.block_tensor import BlockTensor
        tensors = {name: class_tensor(name, o, v) for name in ("ovvv", "ovov", "ovoo")}
        plan = plan_counts({**tensors, "t2": BlockTensor((o, o, v, v))}, nranks, memory_bytes=memory_bytes,
                           ranks_per_node=ranks_per_node)
        task, kernel = plan["task_bytes"], plan["kernel_bytes"]          # the run's kernel batch
        rows_t = task if plan["vblock"] else min(rows_t, plan["cache_bytes"] + task)   # windowed (or streamed)
    return {"rows": rows_t, "kernel": threads * kernel}


def _executors(shape: RunShape) -> list:
    """(backend, variant) pairs the run may execute CCSD with."""
    from tessera.backends.registry import VARIANTS, backend_of_variant
    if not shape.distributed:
        return [("threads" if shape.backend == "auto" else shape.backend, None)]
    if shape.variant:
        return [(backend_of_variant(shape.variant) if shape.backend == "auto" else shape.backend, shape.variant)]
    backends = ("mpi-onesided", "mpi-collective") if shape.backend == "auto" else (shape.backend,)
    return [(b, v) for b in backends for v in VARIANTS[b] if v != "2.5d"]   # 2.5d only where memory allows


def _class_bytes(o, v) -> dict:
    """Bytes of the (T) sources: ovvv, T2 (oovv), ovov, ovoo, as stored."""
    from tessera.chem.integrals import class_tensor
    from tessera.tensor.block_tensor import BlockTensor
    tensors = {name: class_tensor(name, o, v) for name in ("ovvv", "ovov", "ovoo")}
    tensors["t2"] = BlockTensor((o, o, v, v))
    return {name: 8 * sum(int(np.prod(t.block_shape(k))) for k in t.allowed_keys()) for name, t in tensors.items()}


def check(est: MemoryEstimate, budget: tuple, shape: RunShape) -> None:
    """InputError when this rank's own share ``est.own`` exceeds ``budget`` = (bytes per
    rank, its source, as ``backends.budget.memory_budget`` gives them), naming what would
    fit. More ranks shrink each rank's share but add a baseline each and share a node's
    memory: the hint says how many ranks fit on a node with this node's available memory
    (so how many nodes), rather than assume that more ranks means more memory."""
    allowed, source = budget
    if est.own <= allowed:
        return
    fits = []
    if shape.method != "hf" and shape.backend in ("auto", "mpi-onesided", "mpi-collective"):
        node = available_memory()
        for p in (2, 4, 8, 16, 32, 64, 128, 256, 512, 1024):
            if p <= shape.nranks:
                continue
            e = estimate(shape.but(nranks=p, distributed=True, node_ranks=1), est.baseline)
            per_node = min(p, int(node // e.own))
            if e.own <= allowed and per_node >= 1:
                where = "on this node" if per_node >= p else \
                    f"on {-(-p // per_node)} nodes, at most {per_node} per node (this node has {_mib(node)} available)"
                fits.append(f"mpiexec -n {p} {where} ({_mib(e.own)} per rank)")
                break
    if shape.nfrozen == 0 and shape.chemcore and shape.method != "hf":
        e = estimate(shape.but(nfrozen=shape.chemcore), est.baseline)
        if e.own <= allowed:
            fits.append(f"--frozen-core ({_mib(e.own)})")
    for tile in (16, 8):
        if tile < shape.tile and shape.method != "hf":
            e = estimate(shape.but(tile=tile, occ_tile=None), est.baseline)
            if e.own <= allowed:
                fits.append(f"--tile {tile} ({_mib(e.own)})")
                break
    hint = ("; would fit: " + ", ".join(fits)) if fits else \
        "; neither more ranks or nodes, --frozen-core nor a smaller --tile would fit: use nodes with more memory or a smaller basis"
    raise InputError(f"the run needs an estimated {_mib(est.own)} per rank ({est.own_largest} "
                     f"{_mib(est.own - est.baseline)} + baseline {_mib(est.baseline)}), more than "
                     f"{source} {_mib(allowed)}{hint}")
