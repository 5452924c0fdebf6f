"""The (T) energy sweep of one orbital triple in C1, fused (numba).

With NumPy the sweep after the GEMMs (X = W + V, Y = W / D, r3 and the dot products) is
about fourteen passes over v^3 arrays, three of them transposes; on glycine they cost
as much time as a third of the GEMMs.  Here it is two passes: X = W + V written once,
then sum_abc W/D r3(X) reading X at the six permutations of (a, b, c), which stay in
cache along the innermost index.  Compiled once (cached on disk), releases the GIL so
that the threads executor runs sweeps side by side.
"""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(nogil=True, cache=True)
def dense_triple_energy(W, X, ev, eijk, t1i, t1j, t1k, Pjk, Pik, Pij) -> float:
    """sum_abc W/D r3(W + V) for one (i, j, k); W, X [v, v, v] (X is scratch),
    V[abc] = t1[ia] (jb|kc) + t1[jb] (ia|kc) + t1[kc] (ia|jb), D = e_ijk - e_a - e_b - e_c."""
    nv = W.shape[0]
    for a in range(nv):
        for b in range(nv):
            pij, ti, tj = Pij[a, b], t1i[a], t1j[b]
            for c in range(nv):
                X[a, b, c] = W[a, b, c] + ti * Pjk[b, c] + tj * Pik[a, c] + t1k[c] * pij
    energy = 0.0
    for a in range(nv):
        for b in range(nv):
            dab = eijk - ev[a] - ev[b]
            part = 0.0
            for c in range(nv):
                r3 = (4.0 * X[a, b, c] + X[b, c, a] + X[c, a, b]
                      - 2.0 * (X[a, c, b] + X[c, b, a] + X[b, a, c]))
                part += W[a, b, c] * r3 / (dab - ev[c])
            energy += part
    return energy


def dense_energy(W: np.ndarray, X: np.ndarray, ev, eijk: float, t1, i: int, j: int, k: int, ovov_rows) -> float:
    """``dense_triple_energy`` with V's pair matrices from the (ov|ov) rows: ``ovov_rows(x, y)``
    is (x a|y b) as [v, v]."""
    return dense_triple_energy(W, X, ev, eijk, t1[i], t1[j], t1[k],
                               ovov_rows(j, k), ovov_rows(i, k), ovov_rows(i, j))
