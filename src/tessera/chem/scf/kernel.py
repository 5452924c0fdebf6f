"""Coulomb and exchange contributions of one block quartet to the Fock matrix.

For a canonical block quartet (AB|CD) with degeneracy weight s = (orbit size)/8, summing
the eight permutations (ab|cd), (ba|cd), (ab|dc), (ba|dc), (cd|ab), ... each with weight s
counts every distinct quartet of the full sum exactly once.  Using D = D^T, the eight
permutations collapse to six updates (the other six are their transposes):

    M[A,B] += 4 s (ab|cd) D[c,d]      M[C,D] += 4 s D[a,b] (ab|cd)        (Coulomb)
    M[A,C] -=   s (ab|cd) D[b,d]      M[B,D] -=   s D[a,c] (ab|cd)        (exchange,
    M[A,D] -=   s (ab|cd) D[b,c]      M[B,C] -=   s D[a,d] (ab|cd)         G = J - K/2)

and the two-electron Fock matrix is G = (M + M^T)/2.  An update to an upper tile (X < Y)
is stored transposed in tile (Y, X), which leaves (M + M^T)/2 unchanged; so only the lower
tiles (row >= col) of M and D are ever touched.  This is the symmetric Fock update of
GTFock (Liu, Patel, Chow, IPDPS 2014, Alg. 1) at block granularity.
"""

from __future__ import annotations

import numpy as np


def lower(tiles: dict, x: int, y: int) -> np.ndarray:
    """Density tile (x, y) from a dict of lower tiles (D symmetric)."""
    return tiles[(x, y)] if x >= y else tiles[(y, x)].T


def _add(buf: dict, x: int, y: int, m: np.ndarray) -> None:
    """buf[x, y] += m, stored in the lower tile (transposed when x < y)."""
    if x < y:
        x, y, m = y, x, m.T
    acc = buf.get((x, y))
    if acc is None:
        buf[(x, y)] = m.copy() if m.base is not None else m
    else:
        acc += m


def contract_block(g: np.ndarray, scale: float, quartet: tuple, dens: dict,
                   buf: dict) -> None:
    """Add the Fock contributions of the integral block ``g = (AB|CD)`` to ``buf``.

    ``dens`` maps lower tiles (x, y), x >= y, to density blocks; ``buf`` maps lower tiles
    to accumulated blocks of M (created on first touch).  ``g`` is not modified.
    """
    a, b, c, d = quartet
    na, nb, nc, nd = g.shape
    g2 = g.reshape(na * nb, nc * nd)
    j = 4.0 * scale
    _add(buf, a, b, (g2 @ lower(dens, c, d).ravel()).reshape(na, nb) * j)
    _add(buf, c, d, (lower(dens, a, b).ravel() @ g2).reshape(nc, nd) * j)

    k = -scale
    gac = np.ascontiguousarray(g.transpose(0, 2, 1, 3)).reshape(na * nc, nb * nd)
    _add(buf, a, c, (gac @ lower(dens, b, d).ravel()).reshape(na, nc) * k)
    _add(buf, b, d, (lower(dens, a, c).ravel() @ gac).reshape(nb, nd) * k)
    gad = np.ascontiguousarray(g.transpose(0, 3, 1, 2)).reshape(na * nd, nb * nc)
    _add(buf, a, d, (gad @ lower(dens, b, c).ravel()).reshape(na, nd) * k)
    _add(buf, b, c, (lower(dens, a, d).ravel() @ gad).reshape(nb, nc) * k)


def assemble(tiles: dict, ao_ranges) -> np.ndarray:
    """G = (M + M^T)/2 from lower tiles of M."""
    nao = ao_ranges[-1][1] if ao_ranges else 0
    m = np.zeros((nao, nao))
    for (x, y), blk in tiles.items():
        m[slice(*ao_ranges[x]), slice(*ao_ranges[y])] += blk
    return 0.5 * (m + m.T)
