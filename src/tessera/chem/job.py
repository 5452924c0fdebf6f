"""One calculation from molecule to energies: SCF, integral transformation, CCSD, (T).

``Job(options).kernel()`` returns a ``JobResult``; progress goes to the ``report``
callbacks (the CLI prints them as tables).

Under MPI (``mpi-onesided``, ``mpi-collective``, or ``auto`` started by mpiexec with
several ranks) every rank runs ``kernel()``: the PySCF reference is computed once and
shared, the integrals and amplitudes are created inside the distributed context (so
they are spread over the ranks), and the result (complete on every rank) adds the
communication per equation term and the memory held per rank.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field, fields, replace

import numpy as np

from tessera.backends.budget import executor_cache_bytes, memory_budget, parse_size
from tessera.backends.context import Context, ranks_of
from tessera.backends.local import threads_of
from tessera.backends.registry import DEFAULT_BACKEND, check_options, runs_distributed
from tessera.chem.ccsd import CCSD, CCSDStructure, minimal_flops
from tessera.chem.checkpoint import Checkpoint, fingerprint
from tessera.chem.memory import RunShape, check, estimate, resident_peak
from tessera.chem.outcome import check_output_path
from tessera.chem.inputs import load, with_model
from tessera.chem.integrals import transform
from tessera.chem.triples import triples_correction
from tessera.chem.triples_native import require as require_triples_kernel
from tessera.errors import ConvergenceError, InputError
from tessera.profile.records import Recorder, memory_table, slowest
from tessera.tensor.pairs import FreedBlocks, free_plus_minus, kept_plus_minus

METHODS = ("hf", "ccsd", "ccsd(t)")
SCF_CODES = ("pyscf", "tessera")


@dataclass(frozen=True)
class RunOptions:
    geometry: object                 # XYZ/Z-matrix/QCSchema/FCIDUMP file or text, or a pyscf Mole (chem/inputs.py)
    basis: str = "cc-pvdz"
    method: str = "ccsd(t)"
    charge: int = 0
    frozen_core: bool = False
    backend: str = DEFAULT_BACKEND
    tile: int | None = None          # None: 32, or chosen by the cost model under MPI
    variant: str | None = None       # mpi-onesided loop order; mpi-collective algorithm
    schedule: str | None = None      # mpi-onesided task schedule
    conv: float = 1e-8
    max_iter: int = 50
    symmetry: bool = True
    scf: str = "tessera"
    scf_schedule: str = "steal"
    scf_max_iter: int = 100
    checkpoint: str | None = None    # HDF5 file for the orbitals, amplitudes and DIIS state
    restart: bool = False            # resume from ``checkpoint``
    checkpoint_interval: float | None = None   # seconds between CCSD writes; None: by their cost
    max_memory: float | str | None = None   # MiB per rank (or "8G", ...); None: backends.budget's default
    units: str = "angstrom"          # of an XYZ or Z-matrix geometry: angstrom | bohr
    scf_mode: str = "auto"

    def __post_init__(self):
        if self.method.lower() not in METHODS:
            raise InputError(f"unknown method {self.method!r}; choose one of: {', '.join(METHODS)}")
        if self.tile is not None and (not isinstance(self.tile, int) or self.tile <= 0):
            raise InputError(f"--tile must be a positive integer, got {self.tile}")
        if self.scf not in SCF_CODES:
            raise InputError(f"unknown SCF code {self.scf!r}; choose one of: {', '.join(SCF_CODES)}")
        if not (math.isfinite(self.conv) and self.conv > 0):
            raise InputError(f"--conv must be a positive finite number (e.g. 1e-8), got {self.conv}")
        if self.max_iter < 1:
            raise InputError(f"--max-iter must be at least 1, got {self.max_iter}")
        if self.scf_max_iter < 1:
            raise InputError(f"--scf-max-iter must be at least 1, got {self.scf_max_iter}")
        check_options(self.backend, self.variant, self.schedule)
        if self.max_memory is not None:
            object.__setattr__(self, "max_memory", parse_size(self.max_memory))
        if self.checkpoint_interval is not None and not (math.isfinite(self.checkpoint_interval)
                                                         and self.checkpoint_interval >= 0):
            raise InputError(f"--checkpoint-interval must be a number of seconds >= 0 (0: every CCSD "
                             f"iteration), got {self.checkpoint_interval}")
        if self.restart and self.checkpoint is None:
            raise InputError("--restart needs a checkpoint; give --checkpoint FILE")
        if self.checkpoint is not None:
            check_output_path(self.checkpoint, "--checkpoint", inputs=[self.geometry])
            if self.restart and not os.path.isfile(self.checkpoint):
                raise InputError(f"--restart: no checkpoint at {self.checkpoint}; run once without "
                                 "--restart (it writes one), or give its path with --checkpoint")


@dataclass
class JobResult:
    data: dict = field(default_factory=dict)
    converged: bool = True
    error: str = ""
    reference: object = field(default=None, repr=False)   # the Reference the run used
    tensors: dict = field(default_factory=dict, repr=False)   # local runs: integrals, t1, t2


class Report:
    """Callbacks for progress; the CLI overrides them to print (and to save the result).

    ``phase(name)`` when a phase starts and ``done(name, data)`` when it has finished,
    for the phases "scf", "transform", "ccsd", "triples"; ``data`` is the result so far,
    its ``"completed"`` the phases finished."""

    def options(self, options: dict) -> None: ...
    def phase(self, name: str) -> None: ...
    def done(self, name: str, data: dict) -> None: ...
    def molecule(self, info: dict) -> None: ...
    def memory(self, estimate) -> None: ...
    def scf(self, info: dict) -> None: ...
    def iteration(self, row: dict) -> None: ...
    def energies(self, energies: dict, timings: dict) -> None: ...


def _per_irrep(orbsym, names) -> dict:
    out: dict = {}
    for g in np.asarray(orbsym).tolist():
        key = names.get(g, str(g))
        out[key] = out.get(key, 0) + 1
    return out


class Job:
    def __init__(self, options: RunOptions, report: Report | None = None,
                 recorder: Recorder | None = None):
        self.options = options
        self.report = report or Report()
        # the run's regions (phases, iterations, steps, task sets) and compute time, from
        # every context the job opens; detailed when the CLI profiles (--profile)
        self.recorder = recorder if recorder is not None else Recorder()
        self.budget = None       # bytes a rank may use (backends.budget), set by _check_memory

    def _phase(self, timings: dict, name: str, t0: float) -> None:
        timings[name] = time.perf_counter() - t0
        self.recorder.region(name, timings[name], start=t0, kind="phase")

    def _iteration(self, row: dict) -> None:
        self.recorder.region("CCSD iteration", row["seconds"], kind="iteration")
        self.report.iteration(row)

    def kernel(self, reference=None) -> JobResult:
        """The run; ``reference`` (a converged Reference of the geometry's molecule, e.g.
        from a PySCF mean-field object) replaces the SCF."""
        t_start = time.perf_counter()
        opt = self.options
        source = load(opt.geometry, basis=opt.basis, charge=opt.charge, units=opt.units, symmetry=opt.symmetry)
        opt = self.options = with_model(opt, source.model)
        method = opt.method.lower()
        self.report.options({f.name: getattr(opt, f.name) for f in fields(opt)})
        mol = source.mol
        if opt.frozen_core and mol is None:
            raise InputError("--frozen-core needs a molecule to find the core orbitals; an FCIDUMP "
                             "has none: drop --frozen-core (or dump only the active orbitals)")
        if mol is not None:
            check_electrons(mol)
        if method == "ccsd(t)":
            require_triples_kernel()     # a missing build is said before the SCF and CCSD, not after
        timings: dict = {}
        ranks = ranks_of(opt.backend)
        nfrozen = frozen_core_orbitals(mol) if opt.frozen_core else 0
        given = reference or source.reference
        chk = None
        if opt.checkpoint is not None and method != "hf":     # amplitudes to keep: CCSD only
            chk = Checkpoint(opt.checkpoint, ranks, restart=opt.restart, interval=opt.checkpoint_interval)
            chk.check(fingerprint(source.molecule, source.basis, opt.symmetry, nfrozen, given))
        # on restart the checkpoint's orbitals size the estimate (no initial guess)
        resumed = chk.reference(mol) if opt.restart and given is None and chk is not None else None
        tiles = chk.stored_tiles() if chk is not None and opt.tile is None else None
        memory = self._check_memory(mol, method, nfrozen, ranks, given or resumed, tiles)

        t0 = time.perf_counter()
        self.report.phase("scf")
        if given is not None:
            ref, scf_error = given, None
        elif resumed is not None:
            ref, scf_error = resumed, None
        else:
            ref, scf_error = self._scf(mol, ranks)
        self._phase(timings, "scf", t0)
        backend, exec_options, tile, decision = self._resolve_backend(ref, nfrozen, ranks, method)
        occ_tile = decision["occ_tile"] if decision is not None else None
        if chk is not None:
            tile, occ_tile = chk.tiles(tile, occ_tile, given=opt.tile is not None)
            chk.start(ref)
        data = {
            "molecule": source.molecule,
            "basis": source.basis, "point_group": ref.point_group, "nao": int(mol.nao if mol else ref.nmo),
            "nocc": int(ref.nocc), "nvir": int(ref.nvir), "frozen_core": nfrozen,
            "backend": backend, "tile": tile, "occ_tile": occ_tile or tile, "method": method, "scf": opt.scf,
            "ranks": ranks.size, "nodes": ranks.nodes, "threads_per_rank": threads_of(backend, ranks.size > 1),
            "nuclear_repulsion": ref.e_nuc,
            "occupied_per_irrep": _per_irrep(ref.orbsym[:ref.nocc], ref.irrep_names),
            "virtual_per_irrep": _per_irrep(ref.orbsym[ref.nocc:], ref.irrep_names),
        }
        data["memory"] = {"estimate": memory.as_dict()}
        data.update({k: v for k, v in exec_options.items() if v is not None})
        if decision is not None:
            data["auto"] = decision
        self.report.molecule(data)
        self.report.scf({"e_hf": ref.e_hf, "iterations": ref.iterations, "seconds": timings["scf"],
                         "source": ref.source})
        energies = {"hf": ref.e_hf}
        data["scf_info"] = scf_info(ref)
        data["energies"] = energies
        data["timings"] = timings
        data["converged"] = scf_error is None
        data["completed"] = []
        result = JobResult(data, reference=ref)
        if scf_error is not None:          # the JSON says what was reached; exit code 1
            result.converged, result.error = False, str(scf_error)
            data["error"] = {"phase": "scf", "kind": "not converged", "message": str(scf_error)}
            return self._finish(result, t_start)
        self._done("scf", data)
        if method == "hf":
            return self._finish(result, t_start)

        ctx = Context(backend, recorder=self.recorder, **exec_options)
        with ctx:
            self._correlated(ctx, ref, nfrozen, (tile, occ_tile), method, result, chk)
        # Not in a ``finally``: closing a distributed context is collective, and an error
        # raised on some ranks only must reach the caller (which ends every rank) rather
        # than wait in that collective for ranks that are still computing.
        ctx.close()
        return self._finish(result, t_start)

    def _correlated(self, ctx, ref, nfrozen, tiles, method, result, chk=None) -> None:
        opt, data = self.options, result.data
        timings, energies = data["timings"], data["energies"]
        t0 = time.perf_counter()
        self.report.phase("transform")
        ints = transform(ref, nfrozen, tiles[0], occ_tile=tiles[1], max_memory_mb=opt.max_memory)
        self._phase(timings, "transform", t0)
        data["transform_info"] = dict(ints.transform_stats)
        self._done("transform", data)

        t0 = time.perf_counter()
        self.report.phase("ccsd")
        ccsd = CCSD(conv=opt.conv, max_iter=opt.max_iter, progress=self._iteration, checkpoint=chk)
        try:
            cc = ccsd.kernel(ints, ctx)
        except ConvergenceError as err:
            cc = err.result
            result.converged = False
            result.error = str(err)
        self._phase(timings, "ccsd", t0)
        data["iterations"] = cc.iterations
        data["converged"] = result.converged
        energies["ccsd_correlation"] = cc.e_corr
        energies["total"] = ref.e_hf + cc.e_corr
        data["storage"] = {
            "t2_elements_stored": cc.t2.stored_elements, "t2_elements_dense": cc.t2.dense_elements,
            "integrals_elements_stored": ints.stored_elements + sum(t.stored_elements for t in
                                                                   kept_plus_minus(ints.tensors["vvvv"])),
            "integrals_elements_dense": ints.dense_elements,
            "classes": {name: {"stored": t.stored_elements, "dense": t.dense_elements}
                        for name, t in (("t2", cc.t2), *((c, ints.tensors[c]) for c in ("vvvv", "ovvv", "ovov", "oooo")))},
        }
        plus_minus = kept_plus_minus(ints.tensors["vvvv"])      # the ladder's V+- (tensor.pairs)
        if isinstance(ints.tensors["vvvv"].blocks, FreedBlocks):   # a local run keeps V+- only
            data["storage"]["classes"]["vvvv"]["freed"] = True
        if plus_minus:
            data["storage"]["classes"]["vvvv_plus_minus"] = {
                "stored": sum(t.stored_elements for t in plus_minus), "dense": ints.tensors["vvvv"].dense_elements}
        del plus_minus
        # V+- (61 MiB of triangles on glycine cc-pVDZ) are read by no later phase: freed, and
        # the heap's free memory handed back, before (T) takes its own
        free_plus_minus(ints.tensors["vvvv"])
        ctx.drop_gathered()
        minimal = minimal_flops(ints.o, ints.v)
        data["flops"] = {"ccsd_per_iteration": cc.flops_per_iteration, "ccsd_minimal_per_iteration": minimal,
                         "ccsd_over_minimal": cc.flops_per_iteration / minimal if minimal else None}
        if ctx.distributed:
            data["memory_per_rank"] = memory_per_rank(ctx, cc.t2, ints)
        if result.converged:
            self._done("ccsd", data)
        if method == "ccsd(t)" and result.converged:
            t0 = time.perf_counter()
            self.report.phase("triples")
            tr = triples_correction(ints, cc.t1, cc.t2, context=ctx,
                                    memory_mb=None if self.budget is None else self.budget / 2**20)
            self._phase(timings, "triples", t0)
            energies["t_correction"] = tr.energy
            energies["total"] = ref.e_hf + cc.e_corr + tr.energy
            data["flops"].update(triples=tr.flops, triples_minimal=tr.minimal_flops,
                                 triples_over_minimal=tr.flops / tr.minimal_flops if tr.minimal_flops else None,
                                 triples_gflops_per_second=tr.flops / tr.seconds / 1e9)
            if ctx.distributed:
                data["memory_per_rank"]["triples"] = {
                    "peak_operand_bytes": list(tr.rank_peak_operand_bytes),
                    "peak_share_of_whole": tr.peak_share, "task_tile": tr.task_tile}
            self._done("triples", data)
        data["profile"] = slowest(ctx.profile)
        if not ctx.distributed:
            result.tensors = {"integrals": ints, "t1": cc.t1, "t2": cc.t2}
        if ctx.distributed:
            summary = ctx.executor.account.summary()
            data["communication"] = summary
            data["executor"] = ctx.executor.describe()

    def _resolve_backend(self, ref, nfrozen, ranks, method):
        """(backend, executor options, tile, auto decision or None), the same on every rank.
        An HF run has no correlated phase: the cost model is not consulted."""
        opt = self.options
        options = {"variant": opt.variant, "schedule": opt.schedule}
        if not runs_distributed(opt.backend):
            return ("threads" if opt.backend == "auto" else opt.backend), options, opt.tile or 32, None
        if method == "hf":
            return opt.backend, options, opt.tile or 32, None
        from tessera.backends.auto import decide
        structure = CCSDStructure(ref.orbsym, ref.nocc, nfrozen, distributed=True)
        decision = ranks.share(lambda: decide(structure, ranks.size, backend=opt.backend, tile=opt.tile,
                                              variant=opt.variant, schedule=opt.schedule, budget=self.budget,
                                              ranks_per_node=ranks.node_size,
                                              threads_per_rank=threads_of(opt.backend, True)))
        # the executor's caches within the budget, as the estimate and the decision took them
        options = {"variant": decision["variant"], "schedule": decision.get("schedule"),
                   "cache_mb": executor_cache_bytes(self.budget) >> 20}
        return decision["backend"], options, decision["tile"], decision

    def _check_memory(self, mol, method, nfrozen, ranks, reference=None, tiles=None):
        """The estimate of the peak memory per rank (reported), before any heavy work; an
        InputError on every rank when it exceeds the memory budget per rank
        (``backends.budget``: --max-memory, TESSERA_MEMORY_PER_RANK_MB, or the memory
        available now shared by the node's ranks), which the cost model also uses.
        ``tiles``: (tile, occupied tile) of a restart's checkpoint, else --tile or 32."""
        opt = self.options
        tile, occ_tile = tiles or (opt.tile or 32, None)

        def judge():
            budget = memory_budget(ranks.node_size, opt.max_memory)
            own_scf = reference is None and opt.scf == "tessera"
            shape = RunShape(mol, method, opt.backend, opt.variant, ranks.size, tile, occ_tile,
                             nfrozen, runs_distributed(opt.backend), reference,
                             node_ranks=ranks.node_size, shared_windows=ranks.shared_windows,
                             scf_mode=opt.scf_mode if own_scf else None, budget=budget[0])
            est = estimate(shape)
            self.report.memory(est)
            check(est, budget, shape)
            return est, budget[0]
        est, self.budget = ranks.share(judge)
        return est

    def _scf(self, mol, ranks):
        """The RHF reference. Tessera's own SCF is collective (every rank takes part, in an
        mpi-onesided context of its own under MPI, else a serial/threads one);
        PySCF's runs on rank 0 only. Under MPI rank 0's reference is then shared, so every
        rank uses bit-identical orbitals."""
        opt = self.options
        if opt.scf == "pyscf":
            from tessera.chem.pyscf_reference import rhf_reference

            def reference():
                try:
                    return replace(rhf_reference(mol, max_cycle=opt.scf_max_iter), mol=None), None
                except ConvergenceError as err:
                    return replace(err.result, mol=None), err
            shared, error = ranks.share(reference)
            return replace(shared, mol=mol), error
        from tessera.chem.scf import rhf
        # under MPI the Fock build is GTFock's one-sided workload (its schedule is
        # --scf-schedule) whatever executor runs the equations
        ctx = Context("mpi-onesided" if runs_distributed(opt.backend) else opt.backend,
                      recorder=self.recorder)
        error = None
        with ctx:
            try:
                ref = rhf(mol, schedule=opt.scf_schedule, max_iter=opt.scf_max_iter, mode=opt.scf_mode,
                          max_memory=opt.max_memory, context=ctx)
            except ConvergenceError as err:     # on every rank alike: the result is shared
                ref, error = err.result, err
        ctx.close()        # collective when distributed: not in a finally (see kernel)
        if ranks.size == 1:
            return ref, error
        shared = ranks.share(lambda: replace(ref, mol=None))
        return replace(shared, mol=mol), error

    def _done(self, phase: str, data: dict) -> None:
        data["completed"].append(phase)
        self.report.done(phase, data)

    def _finish(self, result: JobResult, t_start: float) -> JobResult:
        result.data["timings"]["total"] = time.perf_counter() - t_start
        result.data["phases"] = phases(result.data)
        result.data["memory"]["measured_peak"] = ranks_of(self.options.backend).allgather(resident_peak())
        self.report.energies(result.data["energies"], result.data["timings"])
        return result


def memory_per_rank(ctx, t2, ints) -> dict:
    """Bytes of T2 and of the MO integrals held by each rank (collective)."""
    mine = {"t2": t2.local_nbytes, "integrals": sum(t.local_nbytes for t in ints.tensors.values())}
    return memory_table(ctx.ranks.allgather(mine), {"t2": t2.nbytes, "integrals": 8 * ints.stored_elements})


def check_electrons(mol) -> None:
    """InputError unless the electrons fill at least one and at most all of the orbitals
    (``--charge -10`` on water in STO-3G asks for 20 electrons in 7 orbitals)."""
    nelec, nao = int(mol.nelectron), int(mol.nao)
    if nelec < 2 or nelec > 2 * nao:
        raise InputError(f"{nelec} electrons (charge {mol.charge}) do not fit: basis {mol.basis} has {nao} "
                         f"orbitals, room for 2 to {2 * nao} electrons in a closed shell: change --charge "
                         "or --basis")


def frozen_core_orbitals(mol) -> int:
    """Doubly occupied core orbitals to freeze (PySCF's chemcore: 1s on Li-Ne, ...)."""
    from pyscf.data import elements
    return int(elements.chemcore(mol))


def scf_info(ref) -> dict:
    """The SCF's iterations and where its time went (Tessera's SCF; PySCF's: iterations)."""
    info = ref.info or {}
    out = {"iterations": int(ref.iterations), "source": ref.source}
    for key in ("mode", "threads", "setup_s", "one_electron_s", "nranks", "incremental_builds"):
        if key in info:
            out[key] = info[key]
    for key in ("fock_wall_s", "solve_wall_s"):
        if key in info:
            out[key.replace("_wall_s", "_s")] = float(sum(info[key]))
    return out


def phases(data: dict) -> dict:
    """Each phase's seconds, iterations and flops where defined (the integral evaluation
    of the SCF and the transform is not counted in flops)."""
    timings, flops = data.get("timings", {}), data.get("flops", {})
    out = {"scf": {"seconds": timings.get("scf"), **data.get("scf_info", {})}}
    if "transform" in timings:
        out["transform"] = {"seconds": timings["transform"], **data.get("transform_info", {})}
    if "ccsd" in timings:
        its = len(data.get("iterations") or [])
        per = flops.get("ccsd_per_iteration")
        out["ccsd"] = {"seconds": timings["ccsd"], "iterations": its, "flops_per_iteration": per,
                       "flops": per * its if per is not None else None}
    if "triples" in timings:
        out["triples"] = {"seconds": timings["triples"], "flops": flops.get("triples")}
    return out
