"""PySCF in and out: ``tessera.CCSD(mf).run()``, ``mycc.ccsd_t()``, ``tessera.RHF(mol).run()``.

Named and shaped as PySCF's classes, so that a PySCF script changes one import:

    mf = pyscf.scf.RHF(mol).run()              # or tessera.RHF(mol).run(): our own SCF
    mycc = tessera.CCSD(mf, frozen=1).run()    # no second SCF: mf's orbitals and energies
    e_t = mycc.ccsd_t()
    mycc.e_corr, mycc.e_tot, mycc.t1, mycc.t2  # t1[i, a], t2[i, j, a, b] over active orbitals

Options keep PySCF's names (``conv_tol``, ``max_cycle``, ``frozen`` as a number of
lowest orbitals or a list of orbital indices, ``verbose``) next to Tessera's ``backend``
and ``tile``. The run is a :class:`~tessera.chem.job.Job` from the mean-field's reference,
in this process (``serial`` or ``threads``; runs over MPI ranks go through ``tessera run``).
"""

from __future__ import annotations

import numpy as np

from tessera.chem.reference import Reference
from tessera.errors import ConvergenceError, InputError

__all__ = ["CCSD", "RHF", "reference_from_scf"]

_LOCAL = ("auto", "serial", "threads")


def _check_backend(backend: str) -> None:
    from tessera.backends.registry import runs_distributed
    if backend not in _LOCAL or runs_distributed(backend):
        raise InputError(f"backend {backend!r}: the Python API runs in this process; expected one of "
                         f"{', '.join(_LOCAL)}: for MPI ranks use `mpiexec ... tessera run`")


def _set_options(obj, options: dict, names: tuple) -> None:
    """PySCF's ``run(**kwargs)``: set options by name; an unknown name is an error."""
    for key, value in options.items():
        if key not in names:
            raise InputError(f"{type(obj).__name__} has no option {key!r}; expected one of "
                             f"{', '.join(names)}: fix the keyword")
        setattr(obj, key, value)


class RHF:
    """Tessera's own closed-shell SCF on a PySCF ``Mole`` (symmetry on by default:
    the point group's Abelian subgroup labels the orbitals)."""

    def __init__(self, mol, *, conv_tol: float = 1e-10, max_cycle: int = 100, symmetry: bool = True,
                 backend: str = "auto", verbose: int | None = None):
        self.mol, self.conv_tol, self.max_cycle = mol, conv_tol, max_cycle
        self.symmetry, self.backend = symmetry, backend
        self.verbose = getattr(mol, "verbose", 0) if verbose is None else verbose
        self.reference: Reference | None = None
        self.converged = False
        self.e_tot = self.mo_coeff = self.mo_energy = self.mo_occ = self.orbsym = None

    def kernel(self) -> float:
        from tessera.backends.context import Context
        from tessera.chem.inputs import load
        from tessera.chem.scf import rhf

        _check_backend(self.backend)
        mol = load(self.mol, basis="", charge=0, symmetry=self.symmetry).mol
        ctx = Context("threads" if self.backend == "auto" else self.backend)
        try:
            with ctx:
                ref = rhf(mol, conv_tol=self.conv_tol, max_iter=self.max_cycle, context=ctx)
        except ConvergenceError as err:
            ref = err.result
        finally:
            ctx.close()
        self.reference, self.converged, self.e_tot = ref, bool(ref.converged), ref.e_hf
        self.mo_coeff, self.mo_energy, self.orbsym = ref.mo_coeff, ref.mo_energy, ref.orbsym
        self.mo_occ = np.where(np.arange(ref.nmo) < ref.nocc, 2.0, 0.0)
        if self.verbose >= 3:
            print(f"{'converged' if self.converged else 'not converged'} SCF energy = {self.e_tot:.15g}")
        return self.e_tot

    def run(self, **options) -> "RHF":
        _set_options(self, options, ("conv_tol", "max_cycle", "symmetry", "backend", "verbose"))
        self.kernel()
        return self


def reference_from_scf(mf, frozen=None) -> Reference:
    """The converged closed-shell reference of ``mf`` (a PySCF RHF or a :class:`RHF`),
    orbitals reordered occupied first, the ``frozen`` ones left out (an int: that many
    lowest orbitals; a list: those orbital indices of ``mf``)."""
    ref = mf.reference if isinstance(mf, RHF) else _pyscf_reference(mf)
    if ref is None or not ref.converged:
        raise InputError("the mean-field object is not converged; expected a converged RHF: "
                         "run mf.kernel() (raise its max_cycle) first")
    drop = _frozen_orbitals(frozen, ref.nmo)
    keep = np.setdiff1d(np.arange(ref.nmo), drop)
    nocc = ref.nocc - int(np.count_nonzero(drop < ref.nocc))
    if nocc < 1 or nocc == len(keep):
        raise InputError(f"frozen={frozen!r} leaves {nocc} occupied and {len(keep) - nocc} virtual "
                         f"orbitals; expected at least one of each: freeze fewer orbitals")
    return Reference(mol=ref.mol, e_hf=ref.e_hf, e_nuc=ref.e_nuc, mo_coeff=ref.mo_coeff[:, keep],
                     mo_energy=ref.mo_energy[keep], orbsym=ref.orbsym[keep], nocc=nocc,
                     point_group=ref.point_group, irrep_names=ref.irrep_names, converged=True,
                     iterations=ref.iterations, source=ref.source,
                     info={**ref.info, "frozen_orbitals": drop.tolist()})


def _frozen_orbitals(frozen, nmo: int) -> np.ndarray:
    if frozen is None:
        return np.zeros(0, dtype=int)
    if isinstance(frozen, (int, np.integer)) and not isinstance(frozen, bool):
        if not 0 <= frozen < nmo:
            raise InputError(f"frozen={frozen} is not between 0 and {nmo - 1}; expected the number of "
                             f"lowest orbitals to freeze: fix frozen")
        return np.arange(int(frozen))
    try:
        drop = np.array(sorted(set(int(p) for p in frozen)), dtype=int)
        ok = all(float(p) == int(p) for p in frozen)
    except (TypeError, ValueError):
        ok = False
    if not ok or (drop.size and (drop[0] < 0 or drop[-1] >= nmo)):
        raise InputError(f"frozen={frozen!r} is not an int or a list of orbital indices 0..{nmo - 1}; "
                         f"expected e.g. frozen=1 or frozen=[0, 1]: fix frozen")
    return drop


def _pyscf_reference(mf) -> Reference:
    from pyscf.scf import hf_symm
    from pyscf.symm import param

    from tessera.chem.molecule import ABELIAN_GROUPS
    from tessera.chem.pyscf_reference import _irrep_names

    mol = getattr(mf, "mol", None)
    coeff = np.asarray(getattr(mf, "mo_coeff", None) if mol is not None else None)
    if mol is None or coeff.ndim != 2 or getattr(mf, "mo_occ", None) is None:
        raise InputError(f"tessera.CCSD got {type(mf).__name__}; expected a converged PySCF RHF "
                         f"(pyscf.scf.RHF(mol).run()) or tessera.RHF(mol).run(): pass one of those")
    if hasattr(mf, "xc") or mol.spin != 0 or mol.nelectron % 2:
        raise InputError(f"tessera.CCSD got {type(mf).__name__} (spin {mol.spin}); expected a closed-"
                         f"shell Hartree-Fock reference: use pyscf.scf.RHF")
    occ = np.asarray(mf.mo_occ, dtype=float)
    if not getattr(mf, "converged", False) or not np.all((occ == 0) | (occ == 2)):
        raise InputError("the mean-field object is not a converged closed-shell RHF (occupations 2 and 0); "
                         "expected a converged RHF: run mf.kernel() (raise its max_cycle) first")
    order = np.concatenate([np.flatnonzero(occ == 2), np.flatnonzero(occ == 0)])
    coeff = coeff[:, order]
    if mol.symmetry and mol.groupname in ABELIAN_GROUPS:
        orbsym = np.asarray(hf_symm.get_orbsym(mol, coeff), dtype=int)
        group, names = mol.groupname, _irrep_names(mol)
    elif mol.symmetry and mol.groupname in ("Dooh", "Coov"):      # PySCF's linear ids: D2h/C2v id + 10 k
        orbsym = np.asarray(hf_symm.get_orbsym(mol, coeff), dtype=int) % 10
        group = "D2h" if mol.groupname == "Dooh" else "C2v"
        names = {label: name for name, label in param.IRREP_ID_TABLE[group].items()}
    else:
        orbsym, group, names = np.zeros(coeff.shape[1], dtype=int), "C1", {0: "A"}
    # the Fock diagonal of these orbitals, as PySCF's CCSD takes it (not the eigenvalues
    # of the last SCF iteration's Fock matrix)
    dm = mf.make_rdm1(coeff, occ[order])
    fock = coeff.T @ (mf.get_hcore() + mf.get_veff(mol, dm)) @ coeff
    return Reference(mol=mol, e_hf=float(mf.e_tot), e_nuc=float(mol.energy_nuc()), mo_coeff=coeff,
                     mo_energy=np.diag(fock).copy(), orbsym=orbsym, nocc=int(np.count_nonzero(occ == 2)),
                     point_group=group, irrep_names=names, converged=True, source="pyscf",
                     info={"point_group_full": mol.topgroup if mol.symmetry else "C1"})


class _Printer:
    """Progress as PySCF prints it at ``verbose`` >= 4 (iterations)."""

    def __init__(self, verbose: int):
        self.verbose = verbose

    def options(self, options): ...
    def molecule(self, info): ...
    def memory(self, estimate): ...
    def scf(self, info): ...
    def energies(self, energies, timings): ...

    def iteration(self, row: dict) -> None:
        if self.verbose >= 4:
            print(f"cycle = {row['iter']}  E_corr(CCSD) = {row['e_corr']:.15g}  dE = {row['delta']:.8g}  "
                  f"norm(t1,t2) = {row['residual']:.6g}")


class CCSD:
    """Closed-shell CCSD from a converged mean-field object (see the module docstring)."""

    def __init__(self, mf, frozen=None, *, conv_tol: float = 1e-8, max_cycle: int = 50,
                 verbose: int | None = None, backend: str = "auto", tile: int | None = None):
        self._scf, self.frozen = mf, frozen
        self.conv_tol, self.max_cycle, self.backend, self.tile = conv_tol, max_cycle, backend, tile
        self.verbose = getattr(mf, "verbose", 0) if verbose is None else verbose
        self.e_hf = self.e_corr = self.t1 = self.t2 = None
        self.converged = False
        self.result = None               # the Job's JobResult: data, timings, iterations

    @property
    def e_tot(self):
        return None if self.e_corr is None else self.e_hf + self.e_corr

    def kernel(self):
        """Run CCSD; returns (e_corr, t1, t2) as PySCF's ``kernel`` does."""
        from tessera.chem.job import Job, RunOptions

        _check_backend(self.backend)
        ref = reference_from_scf(self._scf, self.frozen)
        options = RunOptions(ref.mol, method="ccsd", backend=self.backend, tile=self.tile,
                             conv=self.conv_tol, max_iter=self.max_cycle, symmetry=ref.point_group != "C1")
        self.result = result = Job(options, _Printer(self.verbose)).kernel(reference=ref)
        energies = result.data["energies"]
        self.e_hf, self.e_corr, self.converged = ref.e_hf, energies["ccsd_correlation"], result.converged
        self.t1 = result.tensors["t1"].to_dense()
        self.t2 = result.tensors["t2"].to_dense()
        if self.verbose >= 3:
            print(f"E(CCSD) = {self.e_tot:.16g}  E_corr = {self.e_corr:.16g}"
                  + ("" if self.converged else "  (not converged)"))
        return self.e_corr, self.t1, self.t2

    def run(self, **options) -> "CCSD":
        _set_options(self, options, ("frozen", "conv_tol", "max_cycle", "verbose", "backend", "tile"))
        self.kernel()
        return self

    def ccsd_t(self) -> float:
        """The (T) correction of the converged amplitudes (not added to ``e_tot``, as in PySCF)."""
        from tessera.backends.context import Context
        from tessera.chem.triples import triples_correction

        if self.result is None or not self.converged:
            raise InputError("ccsd_t() needs converged CCSD amplitudes; expected run() first "
                             "(raise max_cycle if it did not converge)")
        tensors = self.result.tensors
        ctx = Context(self.result.data["backend"])
        try:
            e_t = triples_correction(tensors["integrals"], tensors["t1"], tensors["t2"], context=ctx).energy
        finally:
            ctx.close()
        if self.verbose >= 3:
            print(f"CCSD(T) correction = {e_t:.15g}")
        return e_t
