"""Pulay's direct inversion in the iterative subspace (DIIS), for the SCF and for CCSD.

P. Pulay, Chem. Phys. Lett. 73, 393 (1980); J. Comput. Chem. 3, 556 (1982). Keeps the
last ``space`` (vector, error) pairs; the extrapolated vector is sum_i c_i v_i with the
c_i minimising |sum_i c_i e_i| under sum_i c_i = 1 (a bordered Gram system). Vectors and
errors are any NumPy arrays (Fock matrices, amplitude vectors). With distributed vectors
each process passes the part it holds and ``reduce`` sums a local array of inner
products over the processes, so every process gets the same coefficients.

With ``crop`` the newest pair is then replaced by the extrapolated one (sum_i c_i v_i,
sum_i c_i e_i): the conjugate residual with optimal vectors (CROP) of M. Ziolkowski,
V. Weijo, P. Jorgensen, J. Olsen, J. Chem. Phys. 128, 204105 (2008), for coupled cluster
C. Ettenhuber, P. Jorgensen, J. Chem. Theory Comput. 11, 1518 (2015). The subspace then
holds the best vectors found, not the raw iterates; for linear equations with a symmetric
matrix a CROP subspace of three matches the whole history's DIIS.

The stored pairs live in memory (``MemoryHistory``) or, with ``on_disk``, in a temporary
file (``FileHistory``), as PySCF's ``lib.diis`` keeps CCSD's: the history is then no part
of the process's resident memory (glycine cc-pVDZ CCSD: 7 pairs of 11.4 MiB vectors, 160
MiB), and each update reads it once for the inner products and once for the linear
combinations, CHUNK elements at a time into one buffer that stays in cache. That costs
the copies out of the page cache: an update of 7 pairs of 1.5 M elements 46-51 ms of CPU
in memory, 70-75 ms from the file (measured under load 10).
"""

from __future__ import annotations

import logging
import os
import tempfile

import numpy as np
from scipy.linalg.blas import daxpy

from tessera.backends.context import one_blas_thread
from tessera.errors import TesseraError

log = logging.getLogger(__name__)

CHUNK = 1 << 15         # elements of a vector a pass reads at a time (256 KiB: in L2 beside its output)
IO_ELEMENTS = 1 << 27   # elements one read or write of a history file moves at most (1 GiB)


class MemoryHistory(list):
    """Stored vectors (errors) in memory, oldest first."""

    def chunk(self, i: int, start: int, buf: np.ndarray) -> np.ndarray:
        """Elements ``start`` to ``start + buf.size`` of entry ``i`` (a view; ``buf`` unused)."""
        return np.ravel(self[i])[start:start + buf.size]


class FileHistory:
    """Stored vectors (errors) of one shape in an unnamed temporary file in ``directory``
    (the system's temporary folder when None), one slot per entry, oldest first: a list
    of arrays to read (``h[i]`` reads a copy) and ``chunk`` to read part of one. The file
    is opened at once; a folder that cannot hold it, a full disk or a failed read or
    write is a one-line ``TesseraError``."""

    def __init__(self, directory: str | None = None):
        self.directory = str(directory or tempfile.gettempdir())
        asked = os.environ.get("TMPDIR")
        if directory is None and asked and os.path.realpath(asked) != os.path.realpath(self.directory):
            log.warning("TMPDIR=%s cannot be used: the DIIS history goes to %s", asked, self.directory)
        try:
            self._file = tempfile.TemporaryFile(dir=self.directory)
        except OSError as exc:
            raise self._error("cannot make", exc) from None
        self._slots: list = []      # file slot of each entry, oldest first
        self._shape: tuple = ()
        self._size = 0

    def __len__(self) -> int:
        return len(self._slots)

    def __getitem__(self, i: int) -> np.ndarray:
        out = np.empty(self._size)
        self.chunk(i, 0, out)
        return out.reshape(self._shape)

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def append(self, vector) -> None:
        vector = np.asarray(vector, dtype=np.float64)
        if not self._slots and not self._size:
            self._shape, self._size = vector.shape, vector.size
        slot = min(set(range(len(self._slots) + 1)) - set(self._slots))
        self._write(slot, vector)
        self._slots.append(slot)

    def pop(self, i: int = -1) -> None:
        self._slots.pop(i)

    def chunk(self, i: int, start: int, buf: np.ndarray) -> np.ndarray:
        """Elements ``start`` to ``start + buf.size`` of entry ``i``, read into ``buf``."""
        offset = 8 * (self._slots[i] * self._size + start)
        for lo in range(0, buf.size, IO_ELEMENTS):      # one call moves at most ~2 GiB on Linux
            part = buf[lo:lo + IO_ELEMENTS]
            try:
                done = os.preadv(self._file.fileno(), [part], offset + 8 * lo)
            except OSError as exc:
                raise self._error("cannot read", exc) from None
            if done != part.nbytes:
                raise self._error("cannot read", f"{done} of {part.nbytes} bytes read")
        return buf

    def _write(self, slot: int, vector) -> None:
        data = np.ascontiguousarray(vector, dtype=np.float64).reshape(-1)
        if data.size != self._size:
            raise ValueError(f"DIIS history holds vectors of {self._size} elements, got {data.size}")
        for lo in range(0, data.size, IO_ELEMENTS):
            part = data[lo:lo + IO_ELEMENTS]
            try:
                done = os.pwrite(self._file.fileno(), part, 8 * (slot * self._size + lo))
            except OSError as exc:
                raise self._error("cannot write", exc) from None
            if done != part.nbytes:
                raise self._error("cannot write", f"{done} of {part.nbytes} bytes written (disk full?)")

    def _error(self, what: str, why) -> TesseraError:
        why = why.strerror or str(why) if isinstance(why, OSError) else why
        return TesseraError(f"DIIS history: {what} its temporary file in {self.directory} ({why}); "
                            "set TMPDIR to a folder with room for it")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file, self._slots = None, []


class DIIS:
    """``update(vector, error)`` stores the pair and returns the extrapolated vector.

    ``reduce``: sums an array of local inner products over processes (identity when the
    vectors are whole). ``max_condition``: when set, the oldest pairs are dropped while
    the (scaled) Gram system is worse conditioned than this; a singular system always
    drops the oldest pair. Fewer than two pairs: the vector itself. ``weight``: per
    element, how many elements of the whole vector it stands for (a vector of canonical
    blocks of a symmetric tensor), so that inner products are those of the whole vectors.
    ``error_norm``: the norm of the last error passed to ``update`` (weighted, summed over
    processes), a by-product of its inner products. ``crop``: keep the extrapolated pair
    in place of the newest (CROP, above); its inner products follow from the Gram matrix.
    ``on_disk``: the pairs in a temporary file (module docstring), in ``directory``.
    """

    def __init__(self, space: int = 8, reduce=None, max_condition: float | None = None, weight=None,
                 crop: bool = False, on_disk: bool = False, directory: str | None = None):
        self.space = space
        self.crop = crop
        self.reduce = reduce or (lambda x: x)
        self.weight = weight
        self.max_condition = max_condition
        history = (lambda: FileHistory(directory)) if on_disk else MemoryHistory
        self.vectors, self.errors = history(), history()
        self.gram = np.zeros((0, 0))
        self.error_norm = 0.0

    def __len__(self) -> int:
        return len(self.vectors)

    def restore(self, vectors, errors, gram) -> None:
        """Resume from stored pairs (oldest first) and their Gram matrix."""
        for v, e in zip(vectors, errors):
            self.vectors.append(v)
            self.errors.append(np.ravel(e))
        self.gram = np.asarray(gram)

    def close(self) -> None:
        """Remove a history file (nothing for one in memory)."""
        for h in (self.vectors, self.errors):
            if isinstance(h, FileHistory):
                h.close()

    # inner products and a linear combination of long vectors, bound by memory: one BLAS
    # thread (beside the executor's threads on a loaded machine, the pool's barriers
    # made 12 CCSD updates of benzene cc-pVDZ 0.18-0.79 s against 0.17 s, measured)
    @one_blas_thread
    def update(self, vector: np.ndarray, error: np.ndarray) -> np.ndarray:
        """The stored pairs and the new one (held aside until the update ends, so a history
        in a file is written once per update)."""
        error = np.ravel(error)
        werr = error if self.weight is None else self.weight * error
        row = self.reduce(np.append(_dots(self.errors, werr), np.dot(error, werr)))
        self.error_norm = float(np.sqrt(row[-1]))
        n_old = self.gram.shape[0]
        gram = np.zeros((n_old + 1, n_old + 1))
        gram[:n_old, :n_old] = self.gram
        gram[n_old, :] = gram[:, n_old] = row
        if n_old + 1 > self.space:
            self.vectors.pop(0)
            self.errors.pop(0)
            gram = gram[1:, 1:]
        self.gram = gram
        n = len(self.vectors) + 1
        while n >= 2:
            b = -np.ones((n + 1, n + 1))
            b[n, n] = 0.0
            b[:n, :n] = gram[-n:, -n:]
            scale = np.abs(np.diag(b[:n, :n])).max()
            if scale > 0:                      # for conditioning; c does not change
                b[:n, :n] /= scale
            rhs = np.zeros(n + 1)
            rhs[n] = -1.0
            try:
                c = np.linalg.solve(b, rhs)[:n]
                if np.all(np.isfinite(c)) and (self.max_condition is None
                                               or np.linalg.cond(b) < self.max_condition):
                    out = _combine(c, self.vectors, vector)
                    if self.crop:
                        vector, error = out, self._optimal_error(c, error)
                    self.vectors.append(vector)
                    self.errors.append(error)
                    return out
            except np.linalg.LinAlgError:
                pass
            n -= 1
        self.vectors.append(vector)
        self.errors.append(error)
        return vector

    def _optimal_error(self, c, error) -> np.ndarray:
        """sum_i c_i e_i over the last len(c) errors (the newest ``error``), the error CROP
        keeps with its vector; its Gram row is c^T G (c^T G c on the diagonal): no inner
        products."""
        n = len(c)
        row = c @ self.gram[-n:, :]
        row[-1] = row[-n:] @ c
        self.gram[-1, :] = self.gram[:, -1] = row
        return _combine(c, self.errors, error)


def _dots(history, werr: np.ndarray) -> np.ndarray:
    """<e_i, werr> of each stored error, CHUNK elements at a time."""
    out = np.zeros(len(history))
    buf = np.empty(min(CHUNK, werr.size))
    for start in range(0, werr.size, CHUNK):
        part = buf[:min(CHUNK, werr.size - start)]
        w = werr[start:start + part.size]
        for i in range(len(history)):
            out[i] += np.dot(history.chunk(i, start, part), w)
    return out


def _combine(c, history, newest: np.ndarray) -> np.ndarray:
    """sum_i c_i v_i over the last len(c) - 1 >= 1 stored vectors of ``history`` and
    ``newest`` (last), CHUNK elements at a time: each part of the result is accumulated by BLAS axpy
    while it is in cache, each stored vector read once (``sum(c_i * v_i)`` made two
    temporaries per term and passed over the whole result once per term)."""
    shape, newest = np.shape(newest), np.ravel(newest)
    k = len(c) - 1
    stored = range(len(history) - k, len(history))
    out = np.empty(newest.size)
    buf = np.empty(min(CHUNK, newest.size))
    for start in range(0, newest.size, CHUNK):
        part = out[start:start + CHUNK]
        np.multiply(history.chunk(stored[0], start, buf[:part.size]), c[0], out=part)
        for ci, i in zip(c[1:], stored[1:]):
            _axpy(ci, history.chunk(i, start, buf[:part.size]), part)
        _axpy(c[-1], newest[start:start + part.size], part)
    return out.reshape(shape)


def _axpy(a: float, x: np.ndarray, y: np.ndarray) -> None:
    """y += a x in place (BLAS daxpy updates a contiguous float64 ``y`` of at most CHUNK
    elements in place)."""
    if y.size:
        daxpy(x, y, a=a)
