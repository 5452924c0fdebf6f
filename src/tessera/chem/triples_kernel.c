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
 * Plain C on plain pointers (called through ctypes, which releases the GIL): one thread
 * per call; the threads backend runs one task per worker.
 */

#ifndef TILE
#define TILE 16
#endif

static inline long lmin(long x, long y) { return x < y ? x : y; }

double tessera_t3_energy_dense(long nv, const double *A, const double *B, const double *C,
                               const double *ev, double eijk,
                               const double *t1i, const double *t1j, const double *t1k,
                               const double *Pjk, const double *Pik, const double *Pij)
{
    const long n2 = nv * nv;
    double energy = 0.0;
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
            const long ab = a * nv + b, ac = a * nv + c, ba = b * nv + a,
                       bc = b * nv + c, ca = c * nv + a, cb = c * nv + b;
            /* W at the six permutations (x, y, z): A[xyz] + B[yxz] + C[zxy] */
            const double w0 = A[abc] + B[bac] + C[cab];      /* abc */
            const double w1 = A[acb] + B[cab] + C[bac];      /* acb */
            const double w2 = A[bac] + B[abc] + C[cba];      /* bac */
            const double w3 = A[bca] + B[cba] + C[abc];      /* bca */
            const double w4 = A[cab] + B[acb] + C[bca];      /* cab */
            const double w5 = A[cba] + B[bca] + C[acb];      /* cba */
            /* V[xyz] = t1i[x] Pjk[yz] + t1j[y] Pik[xz] + t1k[z] Pij[xy] */
            const double z0 = w0 + t1i[a] * Pjk[bc] + t1j[b] * Pik[ac] + t1k[c] * Pij[ab];
            const double z1 = w1 + t1i[a] * Pjk[cb] + t1j[c] * Pik[ab] + t1k[b] * Pij[ac];
            const double z2 = w2 + t1i[b] * Pjk[ac] + t1j[a] * Pik[bc] + t1k[c] * Pij[ba];
            const double z3 = w3 + t1i[b] * Pjk[ca] + t1j[c] * Pik[ba] + t1k[a] * Pij[bc];
            const double z4 = w4 + t1i[c] * Pjk[ab] + t1j[a] * Pik[cb] + t1k[b] * Pij[ca];
            const double z5 = w5 + t1i[c] * Pjk[ba] + t1j[b] * Pik[ca] + t1k[a] * Pij[cb];
            const double se = z0 + z3 + z4, so = z1 + z2 + z5;
            const double we = w0 + w3 + w4, wo = w1 + w2 + w5;
            double e = 3.0 * (w0 * z0 + w1 * z1 + w2 * z2 + w3 * z3 + w4 * z4 + w5 * z5)
                       + we * (se - 2.0 * so) + wo * (so - 2.0 * se);
            if (a == b || b == c)
                e *= 0.5;
            energy += e / (eab - ev[c]);
        }
    }
    return energy;
}
