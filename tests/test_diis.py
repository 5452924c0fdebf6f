"""chem.diis: DIIS and its CROP form on a linear fixed-point problem.

Reference: for x = x + (b - A x) with A symmetric, DIIS over the whole history is the
minimal-residual (GMRES/conjugate-residual) iteration; CROP keeps only three pairs and
must reproduce it (Ziolkowski et al., J. Chem. Phys. 128, 204105 (2008)), where plain
DIIS of three pairs falls behind.
"""

import os

import numpy as np
import pytest
import scipy.sparse

import tessera.chem.diis as diis_module
from tessera.chem.diis import CHUNK, DIIS, FileHistory
from tessera.errors import TesseraError


def _iterate(diis, A, b, steps):
    x, residuals = np.zeros(len(b)), []
    for _ in range(steps):
        new = x + (b - A @ x)
        x = diis.update(new, new - x)
        residuals.append(np.linalg.norm(b - A @ x))
    return x, np.array(residuals)


def _problem(n=40, seed=7):
    rng = np.random.default_rng(seed)
    m = rng.standard_normal((n, n))
    return np.eye(n) + 0.3 * (m + m.T) / np.sqrt(n), rng.standard_normal(n)


def _sparse_problem(n, seed=11):
    """A symmetric sparse A near the identity (A @ x on vectors of n elements) and b."""
    rng = np.random.default_rng(seed)
    rows, cols = rng.integers(0, n, (2, 4 * n))
    m = scipy.sparse.coo_matrix((rng.uniform(-1, 1, 4 * n), (rows, cols)), shape=(n, n)) / 4
    return scipy.sparse.identity(n) + 0.2 * (m + m.T), rng.standard_normal(n)


def test_crop_of_three_matches_whole_history_diis():
    A, b = _problem()
    x_full, r_full = _iterate(DIIS(100), A, b, 14)
    x_crop, r_crop = _iterate(DIIS(3, crop=True), A, b, 14)
    _, r_plain = _iterate(DIIS(3), A, b, 14)
    np.testing.assert_allclose(r_crop, r_full, rtol=1e-8, atol=1e-12)
    np.testing.assert_allclose(x_crop, x_full, atol=1e-10)
    assert r_plain[-1] > 10 * r_crop[-1]          # the pairs CROP keeps are what it gains


def test_crop_gram_is_that_of_its_errors():
    """The Gram matrix CROP derives for its replaced pairs equals the inner products of
    the errors it keeps, with a weight and a subspace that drops its oldest pairs."""
    A, b = _problem(30, seed=3)
    w = np.random.default_rng(1).integers(1, 3, len(b)).astype(float)
    d = DIIS(4, crop=True, weight=w)
    _iterate(d, A, b, 9)
    E = np.array(d.errors)
    np.testing.assert_allclose(d.gram, E @ (w * E).T, rtol=1e-10, atol=1e-14)
    assert len(d) == 4


def test_history_in_a_file_gives_the_same_iterates(tmp_path, monkeypatch):
    """A history in a temporary file (CCSD's) gives the in-memory history's iterates and
    Gram matrix, over vectors longer than one chunk (and, in the file, longer than one
    read or write), with the oldest pairs dropped, and closes its files."""
    monkeypatch.setattr(diis_module, "IO_ELEMENTS", CHUNK // 3)     # reads and writes in pieces
    A, b = _sparse_problem(3 * CHUNK + 5)
    w = np.random.default_rng(2).integers(1, 3, len(b)).astype(float)
    memory, disk = DIIS(4, crop=True, weight=w), DIIS(4, crop=True, weight=w, on_disk=True, directory=tmp_path)
    x_mem, r_mem = _iterate(memory, A, b, 8)
    x_disk, r_disk = _iterate(disk, A, b, 8)
    np.testing.assert_allclose(x_disk, x_mem, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(r_disk, r_mem, rtol=1e-12)
    np.testing.assert_allclose(disk.gram, memory.gram, rtol=1e-12)
    E = np.array(list(disk.errors))
    np.testing.assert_allclose(disk.gram, E @ (w * E).T, rtol=1e-10)
    assert len(disk) == 4 and isinstance(disk.vectors, FileHistory)
    files = [disk.vectors._file.fileno(), disk.errors._file.fileno()]
    disk.close()
    for fd in files:
        with pytest.raises(OSError):
            os.fstat(fd)


def test_history_folder_that_cannot_hold_it_is_one_line(tmp_path):
    """A folder the history's file cannot be made in is a one-line error naming it, at once."""
    missing = tmp_path / "missing"
    with pytest.raises(TesseraError, match=f"DIIS history: cannot make its temporary file in {missing}"):
        DIIS(4, on_disk=True, directory=missing)
