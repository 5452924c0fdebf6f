"""chem.diis: DIIS and its CROP form on a linear fixed-point problem.

Reference: for x = x + (b - A x) with A symmetric, DIIS over the whole history is the
minimal-residual (GMRES/conjugate-residual) iteration; CROP keeps only three pairs and
must reproduce it (Ziolkowski et al., J. Chem. Phys. 128, 204105 (2008)), where plain
DIIS of three pairs falls behind.
"""

import numpy as np

from tessera.chem.diis import DIIS


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
