"""One calculation from molecule to energies: SCF, integral transformation, CCSD, (T).

``Job(options).kernel()`` returns a ``JobResult``; progress goes to the ``report``
callbacks (the CLI prints them as tables).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import numpy as np

from tessera.backends.context import Context
from tessera.chem.ccsd import CCSD
from tessera.chem.integrals import transform
from tessera.chem.molecule import Molecule
from tessera.errors import ConvergenceError, InputError

METHODS = ("hf", "ccsd", "ccsd(t)")
SCF_CODES = ("pyscf", "tessera")


@dataclass(frozen=True)
class RunOptions:
    geometry: str
    basis: str = "cc-pvdz"
    method: str = "ccsd(t)"
    charge: int = 0
    frozen_core: bool = False
    backend: str = "threads"
    tile: int = 32
    conv: float = 1e-8
    max_iter: int = 50
    symmetry: bool = True
    scf: str = "tessera"
    scf_schedule: str = "steal"
    scf_max_iter: int = 100

    def __post_init__(self):
        if self.method.lower() not in METHODS:
            raise InputError(f"unknown method {self.method!r}; choose one of: {', '.join(METHODS)}")
        if not isinstance(self.tile, int) or self.tile <= 0:
            raise InputError(f"--tile must be a positive integer, got {self.tile}")
        if self.scf not in SCF_CODES:
            raise InputError(f"unknown SCF code {self.scf!r}; choose one of: {', '.join(SCF_CODES)}")
        if self.conv <= 0:
            raise InputError(f"--conv must be positive, got {self.conv}")
        if self.max_iter < 1:
            raise InputError(f"--max-iter must be at least 1, got {self.max_iter}")


@dataclass
class JobResult:
    data: dict = field(default_factory=dict)
    converged: bool = True
    error: str = ""


class Report:
    """Callbacks for progress; the CLI overrides them to print."""

    def options(self, options: dict) -> None: ...
    def molecule(self, info: dict) -> None: ...
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
    def __init__(self, options: RunOptions, report: Report | None = None):
        self.options = options
        self.report = report or Report()

    def kernel(self) -> JobResult:
        opt = self.options
        method = opt.method.lower()
        t_start = time.perf_counter()
        self.report.options(asdict(opt))
        molecule = Molecule.from_xyz(opt.geometry, charge=opt.charge, basis=opt.basis)
        molecule.check_closed_shell()
        mol = molecule.to_pyscf(symmetry=opt.symmetry)
        timings: dict = {}

        t0 = time.perf_counter()
        ref = self._scf(mol)
        timings["scf"] = time.perf_counter() - t0
        nfrozen = _frozen_core(mol) if opt.frozen_core else 0
        data = {
            "molecule": {"atoms": [[s, list(xyz)] for s, xyz in molecule.atoms], "charge": opt.charge,
                         "point_group_full": molecule.point_group_full},
            "basis": opt.basis, "point_group": ref.point_group, "nao": int(mol.nao),
            "nocc": int(ref.nocc), "nvir": int(ref.nvir), "frozen_core": nfrozen,
            "backend": opt.backend, "tile": opt.tile, "method": method, "scf": opt.scf,
            "occupied_per_irrep": _per_irrep(ref.orbsym[:ref.nocc], ref.irrep_names),
            "virtual_per_irrep": _per_irrep(ref.orbsym[ref.nocc:], ref.irrep_names),
        }
        self.report.molecule(data)
        self.report.scf({"e_hf": ref.e_hf, "iterations": ref.iterations, "seconds": timings["scf"],
                         "source": ref.source})
        energies = {"hf": ref.e_hf}
        data["energies"] = energies
        data["timings"] = timings
        data["converged"] = True
        result = JobResult(data)
        if method == "hf":
            return self._finish(result, t_start)

        ctx = Context(opt.backend)
        try:
            t0 = time.perf_counter()
            ints = transform(ref, nfrozen, opt.tile)
            timings["transform"] = time.perf_counter() - t0

            t0 = time.perf_counter()
            ccsd = CCSD(conv=opt.conv, max_iter=opt.max_iter, progress=self.report.iteration)
            try:
                cc = ccsd.kernel(ints, ctx)
            except ConvergenceError as err:
                cc = err.result
                result.converged = False
                result.error = str(err)
            timings["ccsd"] = time.perf_counter() - t0
            data["iterations"] = cc.iterations
            data["converged"] = result.converged
            energies["ccsd_correlation"] = cc.e_corr
            energies["total"] = ref.e_hf + cc.e_corr
            data["storage"] = {
                "t2_elements_stored": cc.t2.stored_elements, "t2_elements_dense": cc.t2.dense_elements,
                "integrals_elements_stored": ints.stored_elements,
                "integrals_elements_dense": ints.dense_elements,
            }
            data["flops"] = {"ccsd_per_iteration": cc.flops_per_iteration}
            if method == "ccsd(t)" and result.converged:
                from tessera.chem.triples import triples_correction
                t0 = time.perf_counter()
                tr = triples_correction(ints, cc.t1, cc.t2, context=ctx)
                timings["triples"] = time.perf_counter() - t0
                energies["t_correction"] = tr.energy
                energies["total"] = ref.e_hf + cc.e_corr + tr.energy
                data["flops"]["triples"] = tr.flops
            data["profile"] = [{"update": lab, "calls": n, "seconds": s, "flops": f}
                               for lab, n, s, f in ctx.report()[:25]]
        finally:
            ctx.close()
        return self._finish(result, t_start)

    def _scf(self, mol):
        opt = self.options
        if opt.scf == "pyscf":
            from tessera.chem.pyscf_reference import rhf_reference
            return rhf_reference(mol)
        from tessera.chem.scf import rhf
        return rhf(mol, schedule=opt.scf_schedule, max_iter=opt.scf_max_iter)

    def _finish(self, result: JobResult, t_start: float) -> JobResult:
        result.data["timings"]["total"] = time.perf_counter() - t_start
        self.report.energies(result.data["energies"], result.data["timings"])
        return result


def _frozen_core(mol) -> int:
    from pyscf.data import elements
    return int(elements.chemcore(mol))
