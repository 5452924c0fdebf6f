"""Pulay's direct inversion in the iterative subspace (DIIS).

P. Pulay, Chem. Phys. Lett. 73, 393 (1980); J. Comput. Chem. 3, 556 (1982): the error of
a Fock matrix is the commutator e = F D S - S D F (zero at self-consistency), here in the
orthonormal basis X^T e X, X = S^(-1/2).  The extrapolated Fock matrix is sum_i c_i F_i
with the c_i minimising |sum_i c_i e_i| under sum_i c_i = 1.
"""

from __future__ import annotations

from collections import deque

import numpy as np


def commutator_error(fock: np.ndarray, dm: np.ndarray, ovlp: np.ndarray,
                     x: np.ndarray) -> np.ndarray:
    """X^T (F D S - S D F) X: the SCF orbital-gradient matrix in an orthonormal basis."""
    fds = fock @ dm @ ovlp
    return x.T @ (fds - fds.T) @ x


class DIIS:
    """Keeps the last ``space`` (Fock, error) pairs and extrapolates."""

    def __init__(self, space: int = 8):
        self.space = space
        self._f = deque(maxlen=space)
        self._e = deque(maxlen=space)

    def __len__(self) -> int:
        return len(self._f)

    def update(self, fock: np.ndarray, err: np.ndarray) -> np.ndarray:
        """Store (F, e) and return the extrapolated Fock matrix."""
        self._f.append(fock)
        self._e.append(err.ravel())
        n = len(self._f)
        if n < 2:
            return fock
        while True:
            e = np.asarray(self._e)[-n:]
            b = np.empty((n + 1, n + 1))
            b[:n, :n] = e @ e.T
            b[n, :n] = b[:n, n] = -1.0
            b[n, n] = 0.0
            rhs = np.zeros(n + 1)
            rhs[n] = -1.0
            # scale for conditioning; drop the oldest vectors if still singular
            diag = np.abs(np.diag(b[:n, :n])).max()
            if diag > 0:
                b[:n, :n] /= diag
            try:
                c = np.linalg.solve(b, rhs)[:n]
                if np.all(np.isfinite(c)) and np.linalg.cond(b) < 1e14:
                    break
            except np.linalg.LinAlgError:
                pass
            n -= 1
            if n < 2:
                return fock
        fs = list(self._f)[-n:]
        return sum(ci * fi for ci, fi in zip(c, fs))
