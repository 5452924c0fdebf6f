"""Restricted closed-shell Hartree-Fock with DIIS, on Tessera's distributed Fock build.

Roothaan-Hall SCF (C. C. J. Roothaan, Rev. Mod. Phys. 23, 69 (1951)) with Pulay DIIS
(Chem. Phys. Lett. 73, 393 (1980)).  The two-electron Fock matrix comes from
``FockBuilder`` (GTFock-style shell-block tasks, Liu, Patel, Chow, IPDPS 2014: Schwarz
screening, static / NXTVAL / work-stealing schedules, run as a task set on the current
context); one-electron integrals, the basis set and the minimal-basis
(MINAO) initial guess come from PySCF.  Orbitals are found in the symmetry-adapted basis
and labelled by irrep.  Orbitals are replicated: rank 0 diagonalises and its result is
shared (``Ranks.share``), so that all ranks take the same decisions and return the same
``Reference``.

Integrals are kept in memory by default (``mode="auto"``) when they fit the memory
budget: the 8-fold integrals (``incore.IncoreFock``: on one process all of them, over
several ranks each rank the symmetry-unique quartets of the shell pairs it computed, a
task set dealt with the schedule; each rank's share counted before any is computed),
without the compiled fill over several ranks each rank's screened integral blocks
(``fock.FockBuilder``); otherwise the build is direct (``direct.DirectFock``: the
symmetry-unique quartets recomputed, incremental, density-weighted screening; the block
tasks of ``fock.FockBuilder`` without the compiled fill) and the log says so. Per iteration every rank does O(nao^2) work besides its
share of the Fock build: the O(nao^3) steps (commutator, DIIS, diagonalisation, density)
run on rank 0, which shares the new density.
"""

from __future__ import annotations

import contextlib
import logging
import time

import numpy as np
from pyscf.scf import hf as pyscf_hf

from tessera.backends.budget import memory_budget
from tessera.backends.context import current_context, thread_limit
from tessera.backends.registry import check_schedule
from tessera.chem.reference import Reference
from tessera.chem.diis import DIIS
from tessera.backends.local import available_cores, threads_per_rank
from tessera.chem.scf.direct import DirectFock
from tessera.chem.scf.fock import MODES, REBUILD_EVERY, SCREENING, FockBuilder
from tessera.chem.scf.incore import IncoreFock, fits
from tessera.chem.scf.integrals import compiled_fill, shell_operations, s8_shares
from tessera.chem.scf.stats import summarize
from tessera.chem.scf.symmetry import symmetry_basis
from tessera.errors import ConvergenceError, InputError

log = logging.getLogger(__name__)

#: Below this many functions rank 0's O(nao^3) steps (commutator, DIIS, diagonalisation,
#: density; before the iterations S^(-1/2), the MINAO density and the guess orbitals of
#: the memory estimate) run on one BLAS thread: a BLAS thread pool beside the OpenMP threads that the
#: integral and J/K calls leave spinning ran them 10-80x slower on 100-800 functions
#: (measured on 2 cores: glycine cc-pVDZ, 95 functions, 280 ms against 3.4 ms a solve).
SMALL_BLAS_NAO = 1000


def small_blas(nao: int):
    """One BLAS thread while it is entered, for ``nao`` < SMALL_BLAS_NAO (the Fock build
    sets its own threads inside); else nothing changes."""
    if nao < SMALL_BLAS_NAO:
        return thread_limit(1)
    return contextlib.nullcontext()


def _check_molecule(mol) -> int:
    if not hasattr(mol, "nao") or getattr(mol, "_atm", None) is None or mol.natm == 0:
        raise InputError("rhf() needs a built pyscf.gto.Mole (call mol.build() first)")
    nelec = int(mol.nelectron)
    if nelec % 2 != 0 or int(mol.spin) != 0:
        raise InputError(
            f"RHF is closed-shell only: the molecule has {nelec} electrons and spin "
            f"{mol.spin}; expected an even electron count and spin 0. Change the charge "
            "or use an open-shell method")
    if nelec == 0:
        raise InputError("the molecule has no electrons; expected at least two")
    return nelec // 2


def commutator_error(fock: np.ndarray, dm: np.ndarray, ovlp: np.ndarray,
                     x: np.ndarray) -> np.ndarray:
    """X^T (F D S - S D F) X: the SCF orbital-gradient matrix in an orthonormal basis
    X = S^(-1/2) (Pulay 1982: DIIS error vector; zero at self-consistency)."""
    fds = fock @ dm @ ovlp
    return x.T @ (fds - fds.T) @ x


def _orthonormalizer(ovlp: np.ndarray) -> np.ndarray:
    w, v = np.linalg.eigh(ovlp)
    if w.min() < 1e-10:
        raise InputError(f"the basis is linearly dependent (smallest overlap eigenvalue "
                         f"{w.min():.2e}); expected a well-conditioned basis set")
    return (v / np.sqrt(w)) @ v.T


def rank_threads(context) -> int:
    """Threads one rank may run inside its Fock build: the serial executor 1, else
    ``OMP_NUM_THREADS`` (``--threads``) when set, else the cores divided among the ranks
    (ranks x threads <= cores)."""
    if not context.distributed and context.executor.name == "serial":
        return 1
    return threads_per_rank() or max(1, available_cores() // context.ranks.size)


def make_builder(mol, context, *, mode: str, budget: tuple, **options):
    """The Fock builder of ``mode`` (module docstring) for ``budget`` = (bytes per rank,
    where that figure comes from, as ``backends.budget.memory_budget``); logs which one
    and why, in one line."""
    ranks = context.ranks
    say = log.info if ranks.rank == 0 else log.debug
    threads = rank_threads(context)
    per_rank, source = budget

    def chosen(fit, how):
        ok, need, room = fit
        if ok:
            say("RHF: AO integrals in memory: %.4g MiB per rank of %.4g MiB (%s), %s",
                need / 2**20, per_rank / 2**20, source, how)
        else:
            say("RHF: direct Fock builds: AO integrals in memory would need %.4g MiB per rank, "
                "budget %.4g MiB (%s) of which %.4g MiB are free", need / 2**20,
                per_rank / 2**20, source, max(room, 0) / 2**20)
    # 8-fold integrals: one process, or several ranks that each keep the representative
    # quartets of the shell pairs they compute; each rank's share counted, none computed
    # (without the compiled fill over ranks: screened blocks, FockBuilder)
    shares = s8_shares(mol, ranks.size, ranks) if mode in ("auto", "incore") else None
    if shares is not None:
        fit = fits(ranks, int(shares[ranks.rank]), per_rank)
        where = "" if ranks.size == 1 else f" on the fullest of {ranks.size} ranks"
        if mode == "incore" and not fit[0]:
            raise InputError(
                f"mode='incore' needs {fit[1] / 2**20:.4g} MiB of 8-fold integrals{where}, more "
                f"than the {fit[2] / 2**20:.4g} MiB the memory budget leaves ({source} "
                f"{per_rank / 2**20:.4g} MiB less what the process holds); use mode='direct'"
                f"{', more ranks' if where else ''} or a larger budget (--max-memory)")
        chosen(fit, f"8-fold, {threads} threads" if ranks.size == 1 else
               f"8-fold {'skeleton ' if shell_operations(mol) else ''}over {ranks.size} ranks "
               f"(their shares of the shell pairs counted), schedule={options['schedule']}, "
               f"{threads} threads each")
        if fit[0]:
            return IncoreFock(mol, threads, context, schedule=options["schedule"], budget=per_rank)
        mode = "direct"
    # in a threads context the executor's workers share the cores of the rank
    workers = 1 if context.distributed else getattr(context.executor, "workers", 1)
    threads = max(1, threads // workers)
    if mode != "direct" or compiled_fill() is None:
        # several ranks without point-group operations: screened blocks per rank if they fit
        builder = FockBuilder(mol, context, mode=mode, budget_bytes=per_rank,
                              threads=threads, **options)
        if builder.fit is not None:
            chosen(builder.fit, f"screened blocks over {ranks.size} ranks")
        if builder.mode == "incore" or compiled_fill() is None:
            return builder
        builder.free()
    options.pop("block_nbf", None)          # no shell blocks: ranges of shell pairs
    builder = DirectFock(mol, context, threads=threads, **options)
    say("RHF: direct Fock builds from the symmetry-unique shell quartets of %d operation(s), "
        "%d tasks of shell pairs, schedule=%s screening=%g ranks=%d threads=%d",
        len(builder.shell_map), len(builder.ranges), builder.schedule, builder.threshold,
        ranks.size, threads)
    return builder


def rhf(mol, *, schedule: str = "steal", screening: float = SCREENING, mode: str = "auto",
        conv_tol: float = 1e-10, max_iter: int = 100,
        max_memory: float | None = None, block_nbf: int | None = None,
        diis_space: int = 8, rebuild_every: int | None = REBUILD_EVERY,
        context=None) -> Reference:
    """Closed-shell RHF of ``mol`` (a built ``pyscf.gto.Mole``, symmetry Abelian or off).

    Runs on ``context`` (default: the current context; serial, threads, mpi-onesided or
    mpi-collective). Collective over its ranks; every rank returns the same
    ``Reference``.  Converged when the energy change is below ``conv_tol`` and
    the norm of the orbital-gradient commutator X^T(FDS - SDF)X below sqrt(conv_tol);
    otherwise ``ConvergenceError`` after ``max_iter`` Fock builds.

    ``schedule``: "static" | "nxtval" | "steal";  ``screening``: Schwarz threshold (0 =
    none);  ``mode``: "auto" (incore when each rank's share of the integrals fits the
    memory budget per rank beside what the rank holds, else direct) | "incore" (an error
    when they do not fit) | "direct";  ``max_memory``: the budget, MiB per rank (default
    ``backends.budget.memory_budget``: TESSERA_MEMORY_PER_RANK_MB, else the memory
    available on the node shared by its ranks);  ``rebuild_every``: direct mode, incremental builds between
    full ones;  ``block_nbf``: target shell block size in basis functions (default:
    about nao/6, at most 32).
    """
    nocc = _check_molecule(mol)
    if int(max_iter) < 1:
        raise InputError(f"max_iter={max_iter!r}: expected at least 1 iteration")
    if not (conv_tol > 0):
        raise InputError(f"conv_tol={conv_tol!r}: expected a positive tolerance")
    check_schedule(schedule)
    if mode not in MODES:
        raise InputError(f"unknown mode {mode!r}; expected one of {MODES}")
    if not (screening >= 0.0):
        raise InputError(f"screening={screening!r}: expected a Schwarz threshold >= 0 "
                         "(0 disables screening)")
    sym = symmetry_basis(mol)
    context = current_context() if context is None else context
    ranks = context.ranks
    say = log.info if ranks.rank == 0 else log.debug
    budget = memory_budget(ranks.node_size, max_memory)

    t0 = time.perf_counter()
    hcore = mol.intor_symmetric("int1e_kin") + mol.intor_symmetric("int1e_nuc")
    if mol.has_ecp():
        hcore = hcore + mol.intor_symmetric("ECPscalar")
    ovlp = mol.intor_symmetric("int1e_ovlp")
    with small_blas(mol.nao):
        xorth = _orthonormalizer(ovlp)
        dm = pyscf_hf.init_guess_by_minao(mol)
    e_nuc = float(mol.energy_nuc())
    conv_grad = float(np.sqrt(conv_tol))

    setup_s = time.perf_counter() - t0
    builder = make_builder(mol, context, mode=mode, budget=budget,
                           schedule=schedule, screening=screening, block_nbf=block_nbf,
                           rebuild_every=rebuild_every)
    if getattr(builder, "skeleton", None) is not None:
        # the guess of a geometry symmetric within PySCF's tolerance only is not quite
        # invariant, which the skeleton J/K needs (over ranks it refuses another density)
        dm = builder.skeleton.symmetrize(dm)
    if builder.tasks is not None:
        say("RHF: %d AOs in %d shell blocks, %d tasks (%d block quartets skipped), "
            "schedule=%s mode=%s screening=%g ranks=%d group=%s",
            mol.nao, builder.blocks.nblocks, len(builder.tasks),
            builder.tasks.n_block_quartets_skipped, builder.schedule, builder.mode,
            screening, ranks.size, sym.group)
    diis = DIIS(diis_space, max_condition=1e14)
    energies, errors, iter_wall, fock_wall, solve_wall = [], [], [], [], []
    state = {"e_last": None}          # rank 0's: the last energy and orbitals

    def solve(fock, dm, e_tot):
        """Rank 0: commutator, DIIS, diagonalisation, next density (the O(nao^3) steps)."""
        t = time.perf_counter()
        err_mat = commutator_error(fock, dm, ovlp, xorth)
        err = float(np.linalg.norm(err_mat))
        de = np.inf if state["e_last"] is None else e_tot - state["e_last"]
        converged = abs(de) < conv_tol and err < conv_grad
        f_diag = fock if converged else diis.update(fock, err_mat)
        state["orbitals"] = sym.eigh(f_diag, ovlp)
        state["e_last"] = e_tot
        c_occ = state["orbitals"][1][:, :nocc]
        return 2.0 * (c_occ @ c_occ.T), e_tot, err, de, converged, time.perf_counter() - t

    try:
        with small_blas(mol.nao):
            for it in range(1, int(max_iter) + 1):
                t_it = time.perf_counter()
                fock = hcore + builder.build(dm)
                fock_wall.append(time.perf_counter() - t_it)
                e_tot = e_nuc + 0.5 * float(np.sum(dm * (hcore + fock)))
                dm, e_tot, err, de, converged, solve_s = ranks.share(lambda: solve(fock, dm, e_tot))
                energies.append(e_tot)
                errors.append(err)
                solve_wall.append(solve_s)
                iter_wall.append(time.perf_counter() - t_it)
                context.record("SCF iteration", iter_wall[-1], start=t_it, kind="iteration")
                say("RHF iter %3d  E = %.12f  dE = %+.3e  |[F,D]| = %.3e  %.3f s",
                    it, e_tot, de, err, iter_wall[-1])
                if converged:
                    break
        mo_energy, mo_coeff, orbsym = ranks.share(lambda: state["orbitals"])
        info = summarize(builder, ranks, schedule=schedule, mode=builder.mode,
                         screening=float(screening), energies=energies, errors=errors,
                         iteration_wall_s=iter_wall, fock_wall_s=fock_wall,
                         solve_wall_s=solve_wall, one_electron_s=setup_s,
                         total_wall_s=time.perf_counter() - t0)
        kept = builder.hand_over() if isinstance(builder, IncoreFock) else None
    finally:
        builder.free()

    ref = Reference(mol=mol, e_hf=float(e_tot), e_nuc=e_nuc, mo_coeff=mo_coeff,
                    mo_energy=mo_energy, orbsym=orbsym, nocc=nocc, point_group=sym.group,
                    irrep_names=dict(sym.irrep_names), converged=bool(converged),
                    iterations=it, source="tessera", info=info, ao_integrals=kept)
    if not converged:
        raise ConvergenceError(
            f"RHF did not converge in {max_iter} iterations: last energy "
            f"{e_tot:.12f} Eh, last energy change {de:+.3e} Eh (conv_tol {conv_tol:g}), "
            f"last commutator error |X^T(FDS-SDF)X| = {err:.3e} (needs < {conv_grad:.1e}). "
            "Raise --scf-max-iter, or check the geometry and --charge",
            result=ref)
    say("RHF converged in %d iterations: E = %.12f", it, e_tot)
    return ref


def guess_orbitals(mol) -> tuple:
    """(orbsym, nocc, group, irrep_names) of the initial guess, without an SCF and without
    two-electron integrals: the symmetry-adapted eigenvectors of h + V_SAP, the core
    Hamiltonian plus a superposition of atomic potentials (S. Lehtola, J. Chem. Theory
    Comput. 15, 1593 (2019); PySCF's Gaussian fit, ``make_sap``, J. Chem. Phys. 152,
    144105 (2020)): one set of three-centre integrals, a few hundredths of a second where
    the Fock matrix of the MINAO density costs a direct J/K build (0.6 s for benzene
    cc-pVDZ). With ECPs the atomic potentials would count the core electrons an ECP
    replaces, so there the Fock matrix of the MINAO density gives the orbitals. The
    orbitals per irrep a run will have, for planning; an SCF may occupy the irreps
    differently when the guess orders near-degenerate levels otherwise."""
    nocc = _check_molecule(mol)
    sym = symmetry_basis(mol)
    mf = pyscf_hf.RHF(mol)
    mf.verbose = 0
    hcore, ovlp = mf.get_hcore(), mf.get_ovlp()
    if mol.has_ecp():
        mf.max_memory = 0     # integral-direct: never hold PySCF's whole AO ERI array for a guess
        fock = mf.get_fock(h1e=hcore, s1e=ovlp, dm=pyscf_hf.init_guess_by_minao(mol))
    else:
        fock = hcore + pyscf_hf.make_sap(mol, _sap_basis(mol, mf.sap_basis))
    with small_blas(mol.nao):
        _, _, orbsym = sym.eigh(fock, ovlp)
    return np.asarray(orbsym), nocc, sym.group, dict(sym.irrep_names)


def _sap_basis(mol, name: str) -> dict:
    """{atom symbol: (exponent, coefficient) rows} of the SAP fit ``name`` for the atoms of
    ``mol`` (as PySCF's ``RHF.init_guess_by_sap`` loads them)."""
    from pyscf.gto.basis import load
    out = {}
    for atom in {a[0] for a in mol._atom}:
        fit = load(name, atom)
        out[atom] = np.asarray((fit[atom] if isinstance(fit, dict) else fit)[0][1:], dtype=float)
    return out
