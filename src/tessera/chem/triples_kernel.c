/* The memory passes of the (T) kernel of tessera.chem.triples, fused per orbital triple.
 *
 * Raghavachari, Trucks, Pople, Head-Gordon, Chem. Phys. Lett. 157, 479 (1989); closed-shell
 * form of Rendell, Lee, Komornicki, Chem. Phys. Lett. 178, 462 (1991), as PySCF's
 * cc/ccsd_t.py.  For one occupied triple (i, j, k), with the GEMM outputs of the three
 * single-index layouts A[a, b, c], B[b, a, c], C[c, a, b] (four W0 terms each):
 *
 *   W[abc] = A[abc] + B[bac] + C[cab]                       (the six permutations of W0)
 *   V[abc] = t1[ia] (jb|kc) + t1[jb] (ia|kc) + t1[kc] (ia|jb)
 *   D[abc] = e_i + e_j + e_k - e_a - e_b - e_c
 *   r3(X)[abc] = 4X[abc] + X[bca] + X[cab] - 2X[acb] - 2X[cba] - 2X[bac]
 *   E_ijk = sum_abc W r3(W + V) / D
 *
 * One pass, cache-blocked: virtual triples are visited by orbits a >= b >= c (tiles of
 * TILE per index), each orbit's six permutations read once.  With Z = W + V, S_e and S_o
 * the sums of Z over the even (abc, bca, cab) and odd (acb, bac, cba) permutations, r3(Z)
 * at an even permutation p is 3 Z_p + S_e - 2 S_o (odd: 3 Z_p + S_o - 2 S_e), so an orbit
 * gives (3 sum_p W_p Z_p + W_e (S_e - 2 S_o) + W_o (S_o - 2 S_e)) / D, halved when two
 * indices are equal (each element counted twice) and zero when all three are (r3 = 0).
 *
 * With point-group symmetry the three layouts are packed (blocks of allowed irreps) and
 * the orbits come as a table of their positions (tessera.chem.triples.VirtualLayout).
 *
 * Plain C on plain pointers (called through ctypes, which releases the GIL): one thread
 * per call; the threads backend runs one task per worker.
 */

#ifndef TILE
#define TILE 16
#endif

static inline long lmin(long x, long y) { return x < y ? x : y; }

#include <stdint.h>

/* One orbit: W and Z = W + V at its six permutations (abc, acb, bac, bca, cab, cba), the
 * orbit's weight and 1 / D folded into scale. */
static inline double orbit_energy(const double w[6], const double z[6])
{
    const double se = z[0] + z[3] + z[4], so = z[1] + z[2] + z[5];
    const double we = w[0] + w[3] + w[4], wo = w[1] + w[2] + w[5];
    return 3.0 * (w[0] * z[0] + w[1] * z[1] + w[2] * z[2] + w[3] * z[3] + w[4] * z[4] + w[5] * z[5])
           + we * (se - 2.0 * so) + wo * (so - 2.0 * se);
}

/* V at the six permutations of (a, b, c), added to w into z:
 * V[xyz] = t1i[x] Pjk[yz] + t1j[y] Pik[xz] + t1k[z] Pij[xy], P dense [nv, nv]. */
static inline void add_v(long nv, long a, long b, long c, const double *t1i, const double *t1j,
                         const double *t1k, const double *Pjk, const double *Pik, const double *Pij,
                         const double w[6], double z[6])
{
    const long ab = a * nv + b, ac = a * nv + c, ba = b * nv + a,
               bc = b * nv + c, ca = c * nv + a, cb = c * nv + b;
    z[0] = w[0] + t1i[a] * Pjk[bc] + t1j[b] * Pik[ac] + t1k[c] * Pij[ab];
    z[1] = w[1] + t1i[a] * Pjk[cb] + t1j[c] * Pik[ab] + t1k[b] * Pij[ac];
    z[2] = w[2] + t1i[b] * Pjk[ac] + t1j[a] * Pik[bc] + t1k[c] * Pij[ba];
    z[3] = w[3] + t1i[b] * Pjk[ca] + t1j[c] * Pik[ba] + t1k[a] * Pij[bc];
    z[4] = w[4] + t1i[c] * Pjk[ab] + t1j[a] * Pik[cb] + t1k[b] * Pij[ca];
    z[5] = w[5] + t1i[c] * Pjk[ba] + t1j[b] * Pik[ca] + t1k[a] * Pij[cb];
}


/* One virtual irrep: A, B, C dense [nv, nv, nv]; P dense [nv, nv]. */
double tessera_t3_energy_dense(long nv, const double *A, const double *B, const double *C,
                               const double *ev, double eijk,
                               const double *t1i, const double *t1j, const double *t1k,
                               const double *Pjk, const double *Pik, const double *Pij)
{
    const long n2 = nv * nv;
    double energy = 0.0, w[6], z[6];
    for (long ta = 0; ta < nv; ta += TILE)
    for (long tb = 0; tb <= ta; tb += TILE)
    for (long tc = 0; tc <= tb; tc += TILE)
    for (long a = ta; a < lmin(ta + TILE, nv); a++)
    for (long b = tb; b < lmin(tb + TILE, a + 1); b++) {
        const double eab = eijk - ev[a] - ev[b];
        for (long c = tc; c < lmin(tc + TILE, b + 1); c++) {
            if (a == c)                    /* a == b == c: r3 vanishes */
                continue;
            const long abc = a * n2 + b * nv + c, acb = a * n2 + c * nv + b,
                       bac = b * n2 + a * nv + c, bca = b * n2 + c * nv + a,
                       cab = c * n2 + a * nv + b, cba = c * n2 + b * nv + a;
            /* W at the six permutations (x, y, z): A[xyz] + B[yxz] + C[zxy] */
            w[0] = A[abc] + B[bac] + C[cab];
            w[1] = A[acb] + B[cab] + C[bac];
            w[2] = A[bac] + B[abc] + C[cba];
            w[3] = A[bca] + B[cba] + C[abc];
            w[4] = A[cab] + B[acb] + C[bca];
            w[5] = A[cba] + B[bca] + C[acb];
            add_v(nv, a, b, c, t1i, t1j, t1k, Pjk, Pik, Pij, w, z);
            const double e = orbit_energy(w, z);
            energy += (a == b || b == c ? 0.5 * e : e) / (eab - ev[c]);
        }
    }
    return energy;
}

/* out [nv, nv] = the packed pairs (t, u) of irrep h (row of (x t|y u), pairs by irrep of t,
 * then t, then u: offset poff[8 h + g_t]) at (vstart[g_t] + t, vstart[g_u] + u), zero
 * elsewhere; row NULL: all zero. */
static void dense_pairs(long nv, const int64_t *vstart, const int64_t *n, const int64_t *poff,
                        long h, const double *row, double *out)
{
    for (long x = 0; x < nv * nv; x++)
        out[x] = 0.0;
    if (!row)
        return;
    for (long gt = 0; gt < 8; gt++) {
        const long gu = gt ^ h, nt = n[gt], nu = n[gu];
        const double *src = row + poff[8 * h + gt];
        for (long t = 0; t < nt; t++)
            for (long u = 0; u < nu; u++)
                out[(vstart[gt] + t) * nv + vstart[gu] + u] = src[t * nu + u];
    }
}

/* Point-group symmetry: A (layout a: single a, pair (b, c)), Bs (layout b, pairs swapped)
 * and C (layout c) packed; orbits[norb][21]: the six permutations' positions in A, then
 * in Bs, then in C (W at permutation p = A[.] + Bs[.] + C[.]), then a, b, c (positions in
 * the virtual space, a >= b >= c, not all equal).  Prow: the packed rows (jb|kc), (ia|kc),
 * (ia|jb) of pair irreps h[0..2] (NULL: zero by symmetry), made dense in scratch
 * [3 nv nv] from the irrep tables vstart[8], n[8], poff[8][8]. */
double tessera_t3_energy_packed(long norb, const int32_t *orbits, long nv,
                                const double *A, const double *Bs, const double *C,
                                const double *ev, double eijk,
                                const double *t1i, const double *t1j, const double *t1k,
                                const double *Pjk, const double *Pik, const double *Pij,
                                const int64_t *h, const int64_t *vstart, const int64_t *n,
                                const int64_t *poff, double *scratch)
{
    const double *rows[3] = {Pjk, Pik, Pij};
    for (int l = 0; l < 3; l++)
        dense_pairs(nv, vstart, n, poff, h[l], rows[l], scratch + l * nv * nv);
    const double *Djk = scratch, *Dik = scratch + nv * nv, *Dij = scratch + 2 * nv * nv;
    double energy = 0.0, w[6], z[6];
    for (long q = 0; q < norb; q++) {
        const int32_t *o = orbits + 21 * q;
        for (int p = 0; p < 6; p++)
            w[p] = A[o[p]] + Bs[o[6 + p]] + C[o[12 + p]];
        const long a = o[18], b = o[19], c = o[20];
        add_v(nv, a, b, c, t1i, t1j, t1k, Djk, Dik, Dij, w, z);
        const double e = orbit_energy(w, z);
        energy += (a == b || b == c ? 0.5 * e : e) / (eijk - ev[a] - ev[b] - ev[c]);
    }
    return energy;
}

/* The version of this source's functions and argument lists: chem/native.py refuses a
   library built from another (raise it with any change of an exported signature). */
int tessera_abi_version(void)
{
    return 1;
}
