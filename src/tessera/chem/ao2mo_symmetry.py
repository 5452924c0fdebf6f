"""Point-group symmetry in the AO->MO transform (``chem/ao2mo.py``, both ways).

Every operation g of an Abelian group (D2h and its subgroups: g flips signs of axes,
g = g^-1) maps AO k to a signed AO, phi_k(g r) = s_g(k) phi_pi_g(k)(r), and each orbital
p of irrep P to chi_P(g) phi_p. The integrals are invariant under r -> g r, so for a
first pair (p q) of irrep G = P x Q and an AO pair t = (k l)

    (pq|pi_g k pi_g l) = chi_G(g) s_g(k) s_g(l) (pq|k l).

The AO pairs fall into orbits under the group; the half transform (pq| is done for one
*representative* pair u of each orbit only (about npair / |orbit|: 4x fewer rows for a
planar D2h molecule, 8x for a non-planar one; by AO units, whose integrals come in shell
pairs, the AO pairs of one shell pair per orbit of shell pairs, a few more), and the
second half goes through the
symmetry-adapted (SO) basis U (``mol.symm_orb``, orthogonal, each SO a signed combination
of one AO orbit): with C_R = U_R c_R for the orbitals of irrep R,

    (pq|rs) = c_R^T Y_RS c_S,   Y_RS = U_R^T X U_S = sum_u (pq|u) M_RS[u],

where X = (pq|k l) over all AO pairs and M_RS[u] = sum over the pairs t of u's orbit of
chi_G(g_t) s(t) (U_kR U_lS + U_lR U_kS) -- a sparse matrix of about |orbit| entries per
representative, built once (``PairOrbits.so_map``). Only SO blocks with R x S = G exist;
each is a sparse product and two small dense transforms (c_R has the SOs of one irrep as
rows), so the second half costs a fraction of the dense one.

The operations are found numerically (AO values at points and at their images) and kept
when they map every SO onto itself: the group is the one the orbitals are labelled in.
"""

from __future__ import annotations

import weakref

import numpy as np
import scipy.sparse
from pyscf import lib

from tessera.backends.context import thread_limit

_AXIS_FLIPS = [np.array(s) for s in ((-1, -1, 1), (-1, 1, -1), (1, -1, -1), (-1, -1, -1),
                                    (1, 1, -1), (1, -1, 1), (-1, 1, 1))]


_KEPT_OPS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # mol -> (key arrays, ops)


def ao_operations(mol, U: np.ndarray) -> list:
    """[(perm, sign)] of the group's operations other than E: phi_k(g r) = sign[k]
    phi_perm[k](r), for the flips of the group's axes that map each SO (column of U)
    onto +-itself. Worked out once per molecule (the SCF, its memory estimate and the
    transform all ask; kept while its SOs, geometry and shells are the same; read-only)."""
    key = (U, mol.atom_coords(), np.asarray(mol.ao_loc_nr()))
    kept = _KEPT_OPS.get(mol)
    if kept is not None and all(a.shape == b.shape and np.array_equal(a, b) for a, b in zip(kept[0], key)):
        return kept[1]
    ops = _operations(mol, U)
    _KEPT_OPS[mol] = (tuple(a.copy() for a in key), ops)
    return ops


def _operations(mol, U: np.ndarray) -> list:
    rng = np.random.default_rng(7)
    coords = mol.atom_coords()
    pts = (coords[:, None, :] + rng.normal(scale=0.7, size=(len(coords), 8, 3))).reshape(-1, 3)
    with lib.with_omp_threads(1):      # a few points: waking OpenMP threads costs more
        ao = mol.eval_gto("GTOval", np.vstack([pts] + [_image(pts, mol, flip) for flip in _AXIS_FLIPS]))
    ao, images = ao[:len(pts)], ao[len(pts):].reshape(len(_AXIS_FLIPS), len(pts), -1)
    norm = np.linalg.norm(ao, axis=0)
    ops = []
    for aog in images:
        overlap = (aog.T @ ao) / np.outer(np.linalg.norm(aog, axis=0), norm)
        perm = np.abs(overlap).argmax(axis=1)
        best = overlap[np.arange(mol.nao), perm]
        if not np.allclose(np.abs(best), 1.0, atol=1e-8) or len(set(perm.tolist())) != mol.nao:
            continue                                    # not a symmetry of the molecule
        sign = np.sign(best)
        # maps every SO onto +-itself: D^T U = U diag(d) (U is orthogonal, so D^T U in the
        # SO basis is diagonal), checked in O(nao^2), not by the O(nao^3) product
        image = sign[:, None] * U[perm]
        if np.abs(image - U * np.einsum("kK,kK->K", U, image)).max() < 1e-8:
            ops.append((perm, sign))
    return ops


def _image(pts: np.ndarray, mol, flip: np.ndarray) -> np.ndarray:
    """The points mapped by the flip of the point group's axes (PySCF keeps the input
    frame: the group's origin and axes are mol._symm_orig/_symm_axes)."""
    orig = np.asarray(getattr(mol, "_symm_orig", np.zeros(3)))
    axes = np.asarray(getattr(mol, "_symm_axes", np.eye(3)))
    return orig + (((pts - orig) @ axes.T) * flip) @ axes


class PairOrbits:
    """The AO pairs of ``mol`` up to its point group, and the SO coefficients of the
    orbitals ``coeff`` when given (module docstring)."""

    def __init__(self, mol, coeff: np.ndarray | None = None, by_shell_pair: bool = False):
        U = np.hstack(mol.symm_orb)
        # PySCF's SO table carries rounding noise (~1e-16) on AOs an SO does not contain in
        # some orientations (water or ethylene in the xz / xy plane): exact zeros there, or
        # a representative pair would seem to meet irreps of the other class (``reps_of``)
        U[np.abs(U) < 1e-12] = 0.0
        so_irrep = np.concatenate([np.full(c.shape[1], i, dtype=np.int64)
                                   for i, c in zip(mol.irrep_id, mol.symm_orb)])
        nao = mol.nao
        self.ops = ao_operations(mol, U)
        # characters chi[irrep] over (E, ops) from the SOs (D^T U_K = chi U_K)
        diag = np.array([np.ones(nao)] + [np.einsum("kK,kK->K", U, sign[:, None] * U[perm])
                                          for perm, sign in self.ops])
        self.chi = {lab: np.round(diag[:, np.flatnonzero(so_irrep == lab)[0]])
                    for lab in set(so_irrep.tolist())}
        k, l = np.tril_indices(nao)
        self.npair = npair = k.size
        images = np.array([np.arange(npair)] + [_pair(perm[k], perm[l]) for perm, _ in self.ops])
        signs = [np.ones(npair)] + [sign[k] * sign[l] for _, sign in self.ops]
        if by_shell_pair:
            # representatives: the AO pairs of one shell pair per orbit of shell pairs (the
            # units of AO integrals are shell pairs); g_t maps t's shell pair onto it
            shell = np.repeat(np.arange(mol.nbas), np.diff(mol.ao_loc_nr()))
            nsp = mol.nbas * (mol.nbas + 1) // 2
            sp = np.array([_pair(shell[k], shell[l])] + [_pair(shell[perm[k]], shell[perm[l]])
                                                          for perm, _ in self.ops])
            best = sp.argmin(axis=0)
            rep_sp = np.zeros(nsp, dtype=bool)
            rep_sp[sp[best, np.arange(npair)]] = True
            L, S = np.tril_indices(mol.nbas)
            self.rep_shell_pairs = np.zeros((mol.nbas, mol.nbas), dtype=bool)
            self.rep_shell_pairs[L, S] = rep_sp[_pair(L, S)]
        else:
            # the op g_t mapping t to rep(t), the orbit's highest pair: the in-memory half
            # reads its row of the 8-fold integrals mostly contiguously (below the diagonal),
            # 4% faster than from the lowest (benzene cc-pVDZ, measured)
            best = images.argmax(axis=0)
        rep_of = images[best, np.arange(npair)]
        self.reps = np.unique(rep_of)                    # representative pairs, ascending
        self.row_of = np.searchsorted(self.reps, rep_of)
        self.op_of = best                                # 0: E, else ops[best - 1]
        self.sign_of = np.array(signs)[best, np.arange(npair)]
        self.U, self.so_irrep, self.nao = U, so_irrep, nao
        self.c = None if coeff is None else U.T @ coeff   # SO basis (c_R: the rows of irrep R)
        self._maps: dict = {}
        self._reps_of: dict = {}
        # the operations that map every AO onto +-itself (e.g. the plane of a planar
        # molecule): each AO, AO pair and irrep has a sign under each, its *class*; an
        # orbital's coefficients lie on the AOs of its class, and (pq|u) vanishes unless
        # class(p) x class(q) = class(u)
        fixed = [i for i, (perm, _) in enumerate(self.ops) if np.array_equal(perm, np.arange(nao))]
        ao_sign = np.array([self.ops[i][1] for i in fixed]).reshape(len(fixed), nao)
        self.irrep_class = {lab: int(self._classes(ch[1:][fixed][:, None])[0]) for lab, ch in self.chi.items()}
        self.ao_class = self._classes(ao_sign)
        k, l = _unpair(self.reps)
        self.rep_class = self.ao_class[k] ^ self.ao_class[l]

    def half_doubles(self, orbsym) -> int:
        """Doubles of the in-memory half-transformed rows (``ClassTransform.half_in_memory``)
        for active orbitals of irreps ``orbsym``: per representative pair the blocks (p in
        class a, q in class b, a <= b) its class meets, or all p >= q with one class."""
        cls = np.array([self.irrep_class[int(r)] for r in orbsym], dtype=np.int64)
        n = {a: int(np.sum(cls == a)) for a in np.unique(cls).tolist()}
        if len(n) == 1:
            return len(self.reps) * len(cls) * (len(cls) + 1) // 2
        return int(sum(np.sum(self.rep_class == k) * sum(n[a] * n[a ^ k] for a in n if a ^ k in n and a <= a ^ k)
                       for k in np.unique(self.rep_class).tolist()))

    @staticmethod
    def _classes(signs) -> np.ndarray:
        """The class of each column of signs (fixing operation, item), as bits (bit i: sign
        -1 under operation i): the product of classes is their XOR."""
        return (np.asarray(signs) < 0).T.astype(np.int64) @ (1 << np.arange(len(signs), dtype=np.int64))

    def reps_of(self, R: int, S: int) -> np.ndarray:
        """The representative pairs (rows of ``reps``) whose (pq|u) can be non-zero for pq
        of irrep G = R x S: those some SO block of G maps (M_R'S' column not all zero). The
        others vanish by symmetry -- a pair u fixed by an operation g up to a sign s has
        (pq|u) = chi_G(g) s (pq|u) -- e.g. in a planar molecule the plane fixes every AO pair,
        so each pair enters the irreps G of one parity only, about half of them."""
        G = tuple(self.chi[R] * self.chi[S])            # G by its characters
        if G not in self._reps_of:
            cols = [np.unique(self._full_map(R2, S2)[0].indices) for R2 in self.chi for S2 in self.chi
                    if tuple(self.chi[R2] * self.chi[S2]) == G]
            self._reps_of[G] = np.unique(np.concatenate(cols))
        return self._reps_of[G]

    def so_map(self, R: int, S: int) -> tuple:
        """(M, SOs of R, SOs of S): M = M_RS^T as a sparse (nso_R * nso_S, len(reps_of(R,
        S))) matrix, Y_RS (flattened) = M @ H for H[u] = (pq|u) over the representative
        pairs u = reps_of(R, S) (rows of one irrep G = R x S). Built once per irrep pair."""
        key = (R, S, "G")
        if key not in self._maps:
            m, KR, KS = self._full_map(R, S)
            reps = self.reps_of(R, S)      # holds every non-zero column of m: renumbered,
            # not sliced (scipy's column indexing cost 5x the rest of the map)
            self._maps[key] = (scipy.sparse.csr_matrix((m.data, np.searchsorted(reps, m.indices), m.indptr),
                                                       shape=(m.shape[0], len(reps))), KR, KS)
        return self._maps[key]

    def _full_map(self, R: int, S: int) -> tuple:
        """``so_map`` over all representative pairs."""
        key = (R, S)
        if key not in self._maps:
            chi = self.chi[R] * self.chi[S]             # chi_G, G = R x S
            KR, KS = np.flatnonzero(self.so_irrep == R), np.flatnonzero(self.so_irrep == S)
            kr, cr = np.nonzero(self.U[:, KR])           # AO k, SO column (within R)
            ks, cs = np.nonzero(self.U[:, KS])
            vr, vs = self.U[kr, KR[cr]], self.U[ks, KS[cs]]
            k, l = np.repeat(kr, len(ks)), np.tile(ks, len(kr))
            t = _pair(k, l)
            val = (np.repeat(vr, len(ks)) * np.tile(vs, len(kr))
                   * chi[self.op_of[t]] * self.sign_of[t])
            col = np.repeat(cr, len(ks)) * len(KS) + np.tile(cs, len(kr))
            m = scipy.sparse.coo_matrix((val, (col, self.row_of[t])),
                                        shape=(len(KR) * len(KS), len(self.reps))).tocsr()
            m.sum_duplicates()
            m.eliminate_zeros()
            self._maps[key] = (m, KR, KS)
        return self._maps[key]

    def so_rows(self, H: np.ndarray, R: int, S: int) -> np.ndarray:
        """Y_RS for the rows of H (reps_of(R, S), nrows; one irrep R x S): (nsoR, nsoS *
        nrows), the same for every class whose first pairs are these rows (``finish``)."""
        m, KR, _ = self.so_map(R, S)
        return (m @ H).reshape(len(KR), -1)

    def finish(self, y: np.ndarray, R: int, S: int, r_orbs, s_orbs) -> np.ndarray:
        """(pq|rs) from Y_RS (``so_rows``) for the orbitals r_orbs (irrep R), s_orbs (irrep
        S): (nrows, len(r_orbs), len(s_orbs))."""
        KR, KS = self.so_map(R, S)[1:]
        # the SOs of an irrep are contiguous (U is mol.symm_orb side by side): slices, not
        # np.ix_, and plain products, not tensordot -- these calls are many and small
        z = (self.c[KR[0]:KR[-1] + 1, r_orbs].T @ y).reshape(len(r_orbs), len(KS), -1)   # (nr, nsoS, rows)
        return np.matmul(self.c[KS[0]:KS[-1] + 1, s_orbs].T, z).transpose(2, 0, 1)


    def so_rows_flops(self, R: int, S: int, nrows: int) -> int:
        """Flops (multiply-adds x 2) of ``so_rows`` for ``nrows`` rows."""
        return 2 * nrows * self.so_map(R, S)[0].nnz

    def finish_flops(self, R: int, S: int, nr: int, ns: int, nrows: int) -> int:
        """Flops of ``finish`` for ``nrows`` rows and nr, ns orbitals of irreps R, S."""
        _, KR, KS = self.so_map(R, S)
        return 2 * nrows * (nr * len(KR) * len(KS) + nr * len(KS) * ns)


def pair_orbits(mol, coeff: np.ndarray | None = None, by_shell_pair: bool = False,
                orbsym=None) -> PairOrbits | None:
    """The AO pair orbits of ``mol`` when its point group has fewer of them than AO
    pairs (None: no symmetry, or none that maps AOs onto signed AOs -- axes of the group
    other than the input's -- or orbitals ``coeff`` that mix irreps beyond 1e-8 or whose
    irreps are not their labels ``orbsym``, so the transform takes every AO pair)."""
    if not getattr(mol, "symmetry", False) or mol.symm_orb is None or mol.groupname == "C1":
        return None
    # one BLAS thread: the products here are small (nao^3 at most), and BLAS threads
    # woken on a loaded machine cost more than all of them (U^T C alone took 12 ms on
    # benzene cc-pVDZ under load; all of PairOrbits 3.5 ms CPU so, measured)
    with thread_limit(1):
        orbits = PairOrbits(mol, coeff, by_shell_pair)
    if len(orbits.reps) == orbits.npair:
        return None
    if coeff is not None:      # orbitals of one irrep each, their label (the finish takes c_R)
        weight = np.zeros((max(orbits.chi) + 1, coeff.shape[1]))
        np.add.at(weight, orbits.so_irrep, orbits.c ** 2)
        if np.any(weight.sum(axis=0) - weight.max(axis=0) > 1e-16):
            return None
        orbits.orbital_irrep = weight.argmax(axis=0)
        if orbsym is not None and np.any(orbits.orbital_irrep != np.asarray(orbsym)):
            return None
    return orbits


def _unpair(t) -> tuple:
    """(k, l), k >= l, of packed pair indices t = k (k + 1) / 2 + l."""
    k = ((np.sqrt(8 * np.asarray(t, dtype=np.float64) + 1) - 1) // 2).astype(np.int64)
    k -= (k * (k + 1) // 2 > t)                   # guard the float square root
    k += ((k + 1) * (k + 2) // 2 <= t)
    return k, t - k * (k + 1) // 2


def _pair(k, l) -> np.ndarray:
    hi, lo = np.maximum(k, l), np.minimum(k, l)
    return hi * (hi + 1) // 2 + lo
