"""The peak memory per rank of a whole run, estimated before the SCF, and ``--max-memory``.

From the molecule, basis, symmetry (the orbitals per irrep of the initial guess, as
``tessera plan``), ranks and backend; bytes per rank, per phase:

  baseline   measured, not modelled: this process's peak resident memory so far (the
             interpreter, NumPy, PySCF, MPI and Tessera's modules)
  scf        Tessera's RHF: SCF_MATRICES nao x nao matrices (overlap, core Hamiltonian,
             orthogonaliser, Fock, density, the DIIS history of Fock and error matrices,
             the Fock build's blocks), plus one Fock buffer per thread
  transform  the MO integrals (this rank's share) and the half-transformed rows
             ((P Q | AO pair) rows of every class, this rank's share), plus each thread's
             slabs (AO integrals of one unit of AO pairs, its half transform, one chunk of
             rows in the finish); in one local process whose 8-fold AO integrals fit
             PySCF's default max_memory: the rows of all active pairs and the larger of
             the 8-fold AO integrals and the MO integrals
  ccsd       one iteration as ``backends.auto.memory_parts`` counts it (the one estimator
             of the cost model): T2 + integrals of the fullest rank, the amplitude copies
             and the DIIS history (the structure's ``held``), the executor's working set
  (t)        the integrals, T2 and the gathered matrices kept from CCSD, the packed rows
             (T) reads (on one process every task tile's rows stay, with their pair-swapped
             copies; a rank keeps its row cache), kernel buffers per thread

and the peak is the baseline plus the largest phase. ``check`` refuses a run whose peak
exceeds the memory allowed per rank, naming what would fit (more ranks, frozen core, a
smaller tile).
"""

from __future__ import annotations

import math
import os
import re
import resource
import sys

import numpy as np

from tessera.errors import InputError

SCF_MATRICES = 30
PHASES = ("scf", "transform", "ccsd", "(t)")


def resident_peak() -> int:
    """This process's peak resident memory so far, bytes (ru_maxrss)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)


def available_memory() -> int:
    """Bytes this machine can give a new run now (MemAvailable; else its physical memory)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 * 2**30


_UNITS = {"": 2**20, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


def parse_size(text) -> float:
    """``--max-memory``: MiB as a number, or with a binary unit (``500M``, ``8GB``, ``2GiB``,
    ``1T``); returns MiB."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([kKmMgGtT]?)(?:i?[bB])?\s*", str(text))
    value = float(m.group(1)) * _UNITS[m.group(2).lower()] / 2**20 if m else float("nan")
    if not (math.isfinite(value) and value > 0):
        raise InputError(f"--max-memory {text!r} is not a memory size; expected a positive size per "
                         "rank such as 4000 (MiB), 500M or 8G")
    return value


def _mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:,.0f} MiB" if nbytes < 10 * 2**30 else f"{nbytes / 2**30:,.1f} GiB"


class MemoryEstimate:
    """Bytes per rank by phase and part (see the module docstring); ``peak`` = baseline
    plus the largest phase."""

    def __init__(self, nranks: int, baseline: int, parts: dict):
        self.nranks, self.baseline, self.parts = nranks, int(baseline), parts
        self.phases = {ph: int(sum(parts[ph].values())) for ph in PHASES if ph in parts}
        self.largest = max(self.phases, key=self.phases.get)
        self.peak = self.baseline + self.phases[self.largest]

    def as_dict(self) -> dict:
        return {"ranks": self.nranks, "baseline": self.baseline, "peak": self.peak,
                "phases": self.phases, "parts": {ph: {k: int(v) for k, v in p.items()} for ph, p in self.parts.items()}}

    def render(self) -> str:
        lines = [f"Memory per rank (estimate, {self.nranks} rank(s)): peak {_mib(self.peak)} = baseline "
                 f"{_mib(self.baseline)} (measured) + {self.largest} {_mib(self.phases[self.largest])}"]
        for ph, nbytes in self.phases.items():
            detail = ", ".join(f"{k} {_mib(v)}" for k, v in self.parts[ph].items() if v)
            lines.append(f"  {ph:10s} {_mib(nbytes):>10s}  ({detail})")
        return "\n".join(lines)


class RunShape:
    """What the estimate needs of a run: the orbitals per irrep (of the initial guess),
    the molecule's size and the run's choices."""

    def __init__(self, mol, method: str, backend: str, variant, nranks: int, tile: int,
                 occ_tile: int | None, nfrozen: int, distributed: bool, reference=None):
        """``reference``: the orbitals when they are known before the run (an FCIDUMP, a
        PySCF mean field), else the initial guess of ``mol`` gives them."""
        from tessera.backends.local import available_cores
        from tessera.chem.job import frozen_core_orbitals
        from tessera.chem.scf.driver import guess_orbitals
        if reference is not None:
            self.orbsym, self.nocc, self.group = np.asarray(reference.orbsym), reference.nocc, reference.point_group
        else:
            self.orbsym, self.nocc, self.group, _ = guess_orbitals(mol)
        self.nao = int(mol.nao) if mol is not None else len(self.orbsym)
        self.chemcore = frozen_core_orbitals(mol) if mol is not None else 0
        # an FCIDUMP's MO integrals, held whole while its classes are filled
        eri = getattr(reference, "eri_mo", None)
        self.mo_eri_bytes = int(eri.nbytes) if eri is not None else 0
        threads = available_cores() if backend in ("threads", "auto") and not distributed else 1
        self.method, self.backend, self.variant = method, backend, variant
        self.nranks, self.tile, self.occ_tile = int(nranks), int(tile), occ_tile
        self.nfrozen, self.threads, self.distributed = int(nfrozen), int(threads), bool(distributed)

    def but(self, **changes) -> "RunShape":
        other = object.__new__(RunShape)
        other.__dict__.update(self.__dict__, **changes)
        return other


def estimate(shape: RunShape, baseline: int | None = None) -> MemoryEstimate:
    """The per-rank estimate of ``shape`` (``baseline``: measured now unless given)."""
    from tessera.backends.auto import memory_parts, structure_stats
    from tessera.chem.ccsd import CCSDStructure
    from pyscf.lib.parameters import MAX_MEMORY

    from tessera.chem.integrals import CLASSES, SLAB_BYTES, class_tensor, make_spaces
    from tessera.chem.scf.incore import s8_bytes

    P, T = shape.nranks, shape.threads
    nao = shape.nao
    parts = {"scf": {"matrices": 8 * (SCF_MATRICES + T) * nao * nao}}
    baseline = resident_peak() if baseline is None else baseline
    if shape.method == "hf":
        return MemoryEstimate(P, baseline, parts)
    s = structure_stats(CCSDStructure(shape.orbsym, shape.nocc, shape.nfrozen), shape.tile,
                        shape.occ_tile or shape.tile, P)
    # the executor's share: on several ranks the most of the executors the run may use
    ccsd = max((memory_parts(s, P, b, v) for b, v in _executors(shape)), key=lambda m: sum(m.values()))
    stored = ccsd["stored"]

    # the transform: half-transformed rows of every class, each thread's slabs
    o, v = make_spaces(shape.orbsym, shape.nocc, shape.nfrozen, shape.tile, shape.occ_tile)
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
        parts["transform"] = {"integrals": stored, "fcidump integrals": shape.mo_eri_bytes}
    elif not shape.distributed and s8_bytes(nao) <= MAX_MEMORY * 1e6:
        # in memory (chem/ao2mo.py, A): the rows of all active pairs, with first the 8-fold
        # AO integrals, then the MO integrals
        parts["transform"] = {"AO or MO integrals": max(s8_bytes(nao), stored),
                              "half-transformed": 8 * nact * (nact + 1) // 2 * npair,
                              "slabs": T * slabs}
    else:
        parts["transform"] = {"integrals": stored, "half-transformed": 8 * rows * npair / P, "slabs": T * slabs}
    parts["ccsd"] = dict(ccsd)
    if shape.method == "ccsd(t)":
        from tessera.chem.triples_tasks import DEFAULT_CACHE_MB
        dims = _class_bytes(o, v)
        rows_t = 2 * dims["ovvv"] + 2 * dims["t2"] + dims["ovov"] + dims["ovoo"]
        if P > 1:
            rows_t = min(rows_t, DEFAULT_CACHE_MB * 2**20 + 2 * (dims["ovvv"] + dims["t2"]) / P)
        nirrep = len(set(v.irreps.tolist())) or 1
        kernel = T * 64 * v.dim ** 3 / nirrep
        gathered = s["gathered_bytes"] if P == 1 else 0
        parts["(t)"] = {"integrals": stored, "gathered": gathered, "rows": rows_t, "kernel": kernel}
    return MemoryEstimate(P, baseline, parts)


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


def check(est: MemoryEstimate, max_memory_mib: float, shape: RunShape) -> None:
    """InputError when ``est.peak`` exceeds ``max_memory_mib`` per rank, naming what would fit."""
    allowed = max_memory_mib * 2**20
    if est.peak <= allowed:
        return
    fits = []
    if shape.method != "hf" and shape.backend in ("auto", "mpi-onesided", "mpi-collective"):
        for p in (2, 4, 8, 16, 32, 64, 128):
            if p > shape.nranks:
                e = estimate(shape.but(nranks=p, distributed=True), est.baseline)
                if e.peak <= allowed:
                    fits.append(f"mpiexec -n {p} ({_mib(e.peak)} per rank)")
                    break
    if shape.nfrozen == 0 and shape.chemcore and shape.method != "hf":
        e = estimate(shape.but(nfrozen=shape.chemcore), est.baseline)
        if e.peak <= allowed:
            fits.append(f"--frozen-core ({_mib(e.peak)})")
    for tile in (16, 8):
        if tile < shape.tile and shape.method != "hf":
            e = estimate(shape.but(tile=tile, occ_tile=None), est.baseline)
            if e.peak <= allowed:
                fits.append(f"--tile {tile} ({_mib(e.peak)})")
                break
    hint = ("; would fit: " + ", ".join(fits)) if fits else \
        "; neither more ranks, --frozen-core nor a smaller --tile would fit: use a machine with more memory or a smaller basis"
    raise InputError(f"the run needs an estimated {_mib(est.peak)} per rank ({est.largest} "
                     f"{_mib(est.phases[est.largest])} + baseline {_mib(est.baseline)}), more than "
                     f"--max-memory {_mib(allowed)}{hint}")
