"""Checkpoint and restart of a run: the orbitals, T1, T2 and the CCSD DIIS state, in HDF5.

Files (h5py), for ``--checkpoint FILE``:

- ``FILE``, the manifest, written by rank 0: the run's fingerprint (molecule, charge,
  basis, symmetry, frozen core, tile layout), the reference (``mo_coeff``,
  ``mo_energy``, ``orbsym``, ...), the last written CCSD iteration with its energy and
  the iteration table, the DIIS Gram matrix, and the names of that iteration's block
  files.
- ``FILE.it<N>.rank<R>``, one per rank and written iteration: the T1 and T2 blocks rank
  ``R`` holds (or its pieces of them, for a tensor stored in pieces) and its part of
  each DIIS vector and error, stored by block key (one dataset per group and tensor,
  blocks side by side, and an index of block keys, first elements of pieces, offsets
  and sizes; files of earlier versions hold one dataset per block and are read too). A
  restart assembles the blocks or pieces each rank holds then from whichever files hold
  them, so it may run on another number of ranks, with or without pieces; no tensor is
  ever gathered onto one rank.

Which iterations are written: the first, the last (converged, or the last allowed) and
in between one whenever the time since the last write reaches ``interval`` seconds, or
by default ``WRITE_SHARE_INVERSE`` times the last write's duration (the writes then cost
at most ~2% of the CCSD time; ``interval=0`` writes every iteration). Rank 0 decides
for all ranks.

Every file is written under a temporary name and renamed (``os.replace``, atomic); the
manifest is written after every rank's block file of its iteration is in place, and
older block files are removed only after it. A process killed at any moment therefore
leaves the last written iteration complete. All ranks must see the same filesystem.

Flushed to disk (fsync) are the writes at the end of a phase: the manifest with the
SCF's orbitals (``start``) and the last CCSD iteration (``final``). The iterations in
between are renamed into place without an fsync: a killed or failed process loses none
of them (the kernel holds the data and writes it back), and none is worth a wait on the
disk (the fsync was about a quarter of a block file's write, measured on benzene
cc-pVDZ). Only a crash of the operating system within the kernel's write-back delay
(seconds) could leave a damaged checkpoint: the older iterations' block files are
removed once the newer one is in place, so a restart then says the checkpoint cannot
be read.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tessera.chem.outcome import atomic_file
from tessera.chem.reference import Reference
from tessera.errors import InputError

FORMAT = "tessera-checkpoint-1"
# by default a CCSD iteration is written once the time since the last write is this many
# times that write's duration: writing then takes at most ~2% of the run
WRITE_SHARE_INVERSE = 50


def fingerprint(molecule: dict, basis: str, symmetry: bool, nfrozen: int, reference=None) -> dict:
    """What a checkpoint must share with the run that resumes from it (the tile layout
    is added once the tiles are known): ``molecule`` as the job reports it (atoms in Å,
    charge); a ``reference`` given with the input (an FCIDUMP, a PySCF mean field) adds
    its energy and orbital counts."""
    out = {"atoms": [[s, [round(float(x), 8) for x in xyz]] for s, xyz in molecule["atoms"]],
           "charge": int(molecule["charge"]), "basis": str(basis).strip().lower(),
           "symmetry": bool(symmetry), "frozen_core": int(nfrozen)}
    if reference is not None:
        out["reference"] = [round(float(reference.e_hf), 8), int(reference.nocc), int(reference.nmo)]
    return out


@dataclass
class Resumed:
    """The CCSD state of a checkpoint in this rank's block layout."""
    iteration: int
    e_corr: float
    history: list
    vector: np.ndarray          # T1 and T2 blocks packed in the layout's order
    diis_vectors: list
    diis_errors: list
    diis_gram: np.ndarray


def _atomic_h5(path: Path, write, durable: bool = True) -> None:
    """``write(h5file)`` into ``path`` atomically (``outcome.atomic_file``: a temporary
    file in the same folder, fsync when ``durable``, rename; an interrupt waits for it)."""
    import h5py
    try:
        with atomic_file(path, durable) as tmp:
            with h5py.File(tmp, "w") as f:
                write(f)
    except OSError as err:
        raise InputError(f"cannot write checkpoint {path}: {err.strerror or err}; free disk "
                         "space or choose another --checkpoint") from None


def _name(key) -> str:
    return "_".join(str(k) for k in key)


def _read_manifest(path: Path) -> dict:
    import h5py
    try:
        with h5py.File(path, "r") as f:
            if f.attrs.get("format") != FORMAT:
                raise InputError(f"{path} is not a Tessera checkpoint (format "
                                 f"{f.attrs.get('format')!r}); give the file --checkpoint wrote")
            ref = f["reference"]
            out = {"fingerprint": json.loads(f.attrs["fingerprint"]),
                   "iteration": int(f.attrs["iteration"]), "e_corr": float(f.attrs["e_corr"]),
                   "history": json.loads(f.attrs["history"]), "parts": json.loads(f.attrs["parts"]),
                   "diis_gram": f["diis_gram"][()],
                   "reference": {"mo_coeff": ref["mo_coeff"][()], "mo_energy": ref["mo_energy"][()],
                                 "orbsym": ref["orbsym"][()], **json.loads(ref.attrs["scalars"])}}
    except OSError as err:
        raise InputError(f"cannot read checkpoint {path}: {err}; give the file --checkpoint wrote") from None
    except KeyError as err:
        raise InputError(f"checkpoint {path} is incomplete (no {err}); run without --restart") from None
    return out


class Checkpoint:
    """The checkpoint of one run (collective under MPI: every rank makes one and calls
    ``start`` and ``save`` alike). ``restart``: resume from the file at ``path``."""

    def __init__(self, path, ranks, *, restart: bool = False, interval: float | None = None):
        self.path = Path(path)
        self.ranks = ranks
        self.interval = interval          # seconds between writes; None: by the write's cost
        self._written = None              # when the last write ended (time.monotonic)
        self._cost = 0.0                  # how long it took
        self.stored = ranks.share(lambda: _read_manifest(self.path)) if restart else None
        self.fingerprint: dict = {}
        self._reference: dict = {}

    # ------------------------------------------------------------------ identity
    def check(self, fields: dict) -> None:
        """Add ``fields`` to the fingerprint; on restart refuse a checkpoint whose
        fields differ."""
        self.fingerprint.update(fields)
        if self.stored is None:
            return
        theirs = self.stored["fingerprint"]
        for k, mine in fields.items():
            if theirs.get(k) != json.loads(json.dumps(mine)):
                what = "molecule" if k == "atoms" else k.replace("_", " ")
                raise InputError(f"checkpoint {self.path} is of another run ({what}: {_short(theirs.get(k))} "
                                 f"there, {_short(mine)} here); resume with the same input, or run "
                                 "without --restart")

    def stored_tiles(self) -> tuple | None:
        """(tile, occupied tile) the checkpoint was written with; None without one."""
        return None if self.stored is None else tuple(self.stored["fingerprint"]["tiles"])

    def tiles(self, tile: int, occ_tile: int | None, given: bool) -> tuple:
        """(tile, occupied tile) of this run: on restart the checkpoint's unless --tile was
        given (then they must agree); recorded in the fingerprint."""
        occ_tile = occ_tile or tile
        if self.stored is not None and not given:
            tile, occ_tile = self.stored_tiles()
        self.check({"tiles": [int(tile), int(occ_tile)]})
        return int(tile), int(occ_tile)

    # ------------------------------------------------------------------ reference
    def reference(self, mol) -> Reference:
        """The stored reference, for ``mol`` (restart: no SCF)."""
        r = dict(self.stored["reference"])
        return Reference(mol=mol, e_hf=r["e_hf"], e_nuc=r["e_nuc"], mo_coeff=r["mo_coeff"],
                         mo_energy=r["mo_energy"], orbsym=np.asarray(r["orbsym"]), nocc=r["nocc"],
                         point_group=r["point_group"],
                         irrep_names={int(k): v for k, v in r["irrep_names"].items()},
                         converged=True, iterations=r["iterations"], source=f"{r['source']}, from checkpoint")

    def start(self, ref) -> None:
        """Keep the reference; a new run writes the manifest now (no CCSD iteration yet)
        and removes block files of an earlier run at this path."""
        self._reference = {
            "mo_coeff": np.asarray(ref.mo_coeff), "mo_energy": np.asarray(ref.mo_energy),
            "orbsym": np.asarray(ref.orbsym),
            "scalars": {"e_hf": float(ref.e_hf), "e_nuc": float(ref.e_nuc), "nocc": int(ref.nocc),
                        "point_group": ref.point_group, "source": ref.source.split(", from")[0],
                        "irrep_names": {str(k): v for k, v in ref.irrep_names.items()},
                        "iterations": int(ref.iterations)}}
        if self.stored is not None:
            return
        if self.ranks.rank == 0:
            self._write_manifest(0, 0.0, [], np.zeros((0, 0)), [])
            self._remove_parts(keep=None)

    # ------------------------------------------------------------------ CCSD state
    def save(self, iteration: int, e_corr: float, history: list, layout: list, vector, diis,
             final: bool = False) -> bool:
        """After CCSD iteration ``iteration`` (collective): when the policy says so (always
        when ``final``), this rank's blocks of T1, T2 (``vector`` packed in ``layout``:
        (name, key, shape) per block or piece, ``_run``) and of the DIIS history, then the manifest.
        Returns whether it wrote; only the ``final`` write is flushed to disk (module
        docstring)."""
        if not final and not self.ranks.share(self._due):
            return False
        t0 = time.monotonic()
        part = self.path.with_name(f"{self.path.name}.it{iteration}.rank{self.ranks.rank}")
        _atomic_h5(part, lambda f: _write_blocks(f, layout, vector, diis), durable=final)
        parts = [p.name for p in self.ranks.allgather(part)]      # every rank's file is in place
        if self.ranks.rank == 0:
            self._write_manifest(iteration, e_corr, history, diis.gram, parts, durable=final)
            self._remove_parts(keep=iteration)
        self._written = time.monotonic()
        self._cost = self._written - t0
        return True

    def _due(self) -> bool:
        """The write policy: the first iteration; then once ``interval`` seconds have passed
        since the last write, or (``interval`` None) WRITE_SHARE_INVERSE times the last
        write's duration, so that writing costs at most ~1/WRITE_SHARE_INVERSE of the run."""
        if self._written is None:
            return True
        wait = self.interval if self.interval is not None else WRITE_SHARE_INVERSE * self._cost
        return time.monotonic() - self._written >= wait

    def resume(self, layout: list) -> Resumed | None:
        """The stored CCSD state for this rank's ``layout``, or None when the checkpoint
        holds no finished iteration (or this is not a restart)."""
        if self.stored is None or self.stored["iteration"] == 0:
            return None
        import h5py
        runs = [_run(*entry) for entry in layout]
        need = {(name, _name(key)) for name, key, _, _ in runs}
        found: dict = {}
        for part in self.stored["parts"]:
            try:
                with h5py.File(self.path.with_name(part), "r") as f:
                    for k, stored in _read_blocks(f, need).items():
                        found.setdefault(k, []).extend(stored)
            except OSError as err:
                raise InputError(f"cannot read checkpoint block file {part}: {err}; run without "
                                 "--restart") from None
        ndiis = len(self.stored["diis_gram"])

        def stack(group, n):
            cols = []
            for name, key, start, size in runs:
                got = _assemble(found.get((group, name, _name(key)), ()), start, size, n)
                if got is None:
                    raise InputError(f"checkpoint {self.path} lacks elements {start}..{start + size - 1} of "
                                     f"block {_name(key)} of {name} ({group}); run without --restart")
                cols.append(got)
            return list(np.concatenate([np.zeros((n, 0))] + cols, axis=1))
        return Resumed(self.stored["iteration"], self.stored["e_corr"], self.stored["history"],
                       stack("amplitudes", 1)[0], stack("diis_vectors", ndiis), stack("diis_errors", ndiis),
                       np.asarray(self.stored["diis_gram"]))

    # ------------------------------------------------------------------ files
    def _write_manifest(self, iteration, e_corr, history, gram, parts, durable: bool = True) -> None:
        def write(f):
            f.attrs["format"] = FORMAT
            f.attrs["fingerprint"] = json.dumps(self.fingerprint)
            f.attrs["iteration"] = int(iteration)
            f.attrs["e_corr"] = float(e_corr)
            f.attrs["history"] = json.dumps(history)
            f.attrs["parts"] = json.dumps(parts)
            f.create_dataset("diis_gram", data=np.asarray(gram, dtype=np.float64).reshape(len(gram), len(gram)))
            ref = f.create_group("reference")
            for k in ("mo_coeff", "mo_energy", "orbsym"):
                ref.create_dataset(k, data=self._reference[k])
            ref.attrs["scalars"] = json.dumps(self._reference["scalars"])
        _atomic_h5(self.path, write, durable)

    def _remove_parts(self, keep: int | None) -> None:
        """Remove block files (and left-over temporary files) of iterations before
        ``keep``; all of them when ``keep`` is None."""
        pattern = re.compile(r"\.?" + re.escape(self.path.name) + r"\.it(\d+)\.rank\d+(\..+\.tmp)?$")
        folder = self.path.parent if str(self.path.parent) else Path(".")
        for p in folder.iterdir():
            m = pattern.match(p.name)
            if m and (keep is None or int(m.group(1)) < keep):
                p.unlink(missing_ok=True)


def _write_blocks(f, layout, vector, diis) -> None:
    """One dataset per group and tensor: ``group/name`` holds the group's vectors (rows)
    restricted to the tensor's blocks, which lie side by side in ``layout`` order;
    ``index/name`` holds per block its key, offset and size within a row. Each vector is
    read once (a DIIS history in a file reads it from there) and cut into its tensors."""
    bounds = np.cumsum([0] + [int(np.prod(shape)) for _, _, shape in layout])
    spans = {}                      # name -> (lo, hi) of its blocks within a row
    for name in dict.fromkeys(n for n, _, _ in layout):
        rows = [j for j, (n, _, _) in enumerate(layout) if n == name]
        lo, hi = spans[name] = bounds[rows[0]], bounds[rows[-1] + 1]
        f.create_dataset(f"index/{name}", data=np.array(
            [[*layout[j][1], bounds[j] - lo, bounds[j + 1] - bounds[j]] for j in rows], dtype=np.int64))
    for group, vecs in (("amplitudes", [vector]), ("diis_vectors", diis.vectors),
                        ("diis_errors", diis.errors)):
        datasets = {name: f.create_dataset(f"{group}/{name}", shape=(len(vecs), hi - lo), dtype=np.float64)
                    for name, (lo, hi) in spans.items()}
        for j, v in enumerate(vecs):
            for name, (lo, hi) in spans.items():
                datasets[name][j] = v[lo:hi]


NDIM = {"t1": 2, "t2": 4}    # indices of each tensor: a longer key names a piece of a block


def _run(name, key, shape) -> tuple:
    """(name, block key, first element, elements) of a layout entry (name, key, shape): a
    block, or a piece of one (of a tensor stored in pieces: ``key`` is the block's key and
    the piece's first element, ``shape`` its (elements,))."""
    n = NDIM[name]
    return name, tuple(key[:n]), int(key[n]) if len(key) > n else 0, int(np.prod(shape))


def _assemble(stored, start: int, size: int, rows: int):
    """Elements [start, start + size) of a block, (rows, size), from ``stored`` runs of it
    [(first element, (rows, elements) array), ...]: blocks or pieces, whichever the
    writing run held (so a restart may have other ranks or pieces); None when they do not
    cover it."""
    out, covered = np.empty((rows, size)), np.zeros(size, dtype=bool)
    for first, data in stored:
        lo, hi = max(first, start), min(first + data.shape[1], start + size)
        if lo < hi:
            out[:, lo - start:hi - start] = data[:, lo - first:hi - first]
            covered[lo - start:hi - start] = True
    return out if covered.all() else None


def _read_blocks(f, need: set) -> dict:
    """{(group, name, block name): [(first element, array (vectors, elements))]} of the
    blocks in ``need`` that block file ``f`` holds, whole or in pieces: ``_write_blocks``'
    layout, or one dataset per block (files written before it)."""
    found = {}
    for group in ("amplitudes", "diis_vectors", "diis_errors"):
        for name in ("t1", "t2"):
            if group not in f or name not in f[group]:       # (a rank that held no block)
                continue
            if "index" not in f:                    # one dataset per block
                for k in f[group][name]:
                    if (name, k) in need:
                        data = f[group][name][k][()]
                        found[(group, name, k)] = [(0, data.reshape(len(data), -1))]
                continue
            data = f[group][name][()]
            for *key, start, size in f["index"][name][()].tolist():
                _, block, first, _ = _run(name, key, ())
                if (name, _name(block)) in need:
                    found.setdefault((group, name, _name(block)), []).append((first, data[:, start:start + size]))
    return found


def _short(value) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."
