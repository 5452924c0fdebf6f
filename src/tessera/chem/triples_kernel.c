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
 * One pass: virtual triples are visited by orbits a >= b >= c, each orbit's six
 * permutations read once, tile triple by tile triple (below).  With Z = W + V, S_e and S_o
 * the sums of Z over the even (abc, bca, cab) and odd (acb, bac, cba) permutations, r3(Z)
 * at an even permutation p is 3 Z_p + S_e - 2 S_o (odd: 3 Z_p + S_o - 2 S_e), so an orbit
 * gives (3 sum_p W_p Z_p + W_e (S_e - 2 S_o) + W_o (S_o - 2 S_e)) / D, halved when two
 * indices are equal (each element counted twice) and zero when all three are (r3 = 0).
 *
 * With point-group symmetry the three layouts are packed (blocks of allowed irreps), whose
 * irrep sub-blocks are dense strided arrays: W is formed once per triple and the same tile
 * sweep, over tiles within irreps, reads it in place through strides.
 *
 * Plain C on plain pointers (called through ctypes, which releases the GIL): one thread
 * per call; the threads backend runs one task per worker.
 */

static inline long lmin(long x, long y) { return x < y ? x : y; }

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* The sweeps' orbit loops run on short unit-stride rows: with AVX2 and FMA (x86-64-v3) the
 * compiler vectorises them four wide, a third of their instructions (callgrind, v = 75).
 * GCC >= 11 on x86-64 with glibc (whose ifunc picks the clone at load) builds that clone
 * beside the baseline one; elsewhere (clang, musl, macOS) the baseline alone. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11 && defined(__GLIBC__)
#define SWEEP_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define SWEEP_CLONES
#endif

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


/* ------------------------------------------------------------------ one virtual irrep
 *
 * The dense sweep first forms W = A + B[bac] + C[cab] once per triple, slab a by slab a
 * in one pass (A and B read along c, C strided within its L1-resident [c, b] block of a:
 * each element of the three layouts read once, W written once), then visits tile triples (ta >= tb >= tc, DTILE orbitals per tile): W at abc and
 * bac is read in place (c contiguous), at acb, bca, cab and cba gathered along its
 * contiguous index into four local tiles L[a][b][c] (plain copies); then the orbit
 * energies run c innermost on contiguous rows and on transposed copies of the (x t|y u)
 * matrices.  (Gathering the eighteen sub-blocks of A, B and C at the six permutations,
 * twelve of them added into the tiles, took 20% more instructions and 26% more L1 misses
 * per triple at v = 75 (callgrind); strided reads of a per-orbit sweep were cache-latency
 * bound: 50 ns per orbit against 21 ns in cache.)
 * Scratch (tessera_t3_dense_scratch): the four tiles, the three transposes and W. */
#ifndef DTILE
#define DTILE 16
#endif
#define DT3 (DTILE * DTILE * DTILE)

long tessera_t3_dense_scratch(long nv)
{
    return 4 * DT3 + 3 * nv * nv + nv * nv * nv;
}

/* dst[x][y][z] = src[x sx + y sy + z sz], x < nx, y < ny, z < nz, dst DTILE^3 row-major;
 * the loop whose source stride is 1 innermost.  On a diagonal tile pair only what the
 * orbits a >= b >= c read: y <= x when eq_xy, z <= y when eq_yz (39% fewer copies at
 * v = 75). */
static void gather(double *restrict dst, const double *restrict src, long sx, long sy, long sz,
                   long nx, long ny, long nz, int eq_xy, int eq_yz)
{
#define GATHER(O, O0, O1, M, M0, M1, I, I0, I1, DO, DM, DI, SO, SM)                          \
    for (long O = (O0); O < (O1); O++)                                                   \
        for (long M = (M0); M < (M1); M++) {                                             \
            double *d = dst + O * DO + M * DM;                                           \
            const double *s = src + O * SO + M * SM;                                     \
            for (long I = (I0); I < (I1); I++) d[I * DI] = s[I];                         \
        }
    const long dx = DTILE * DTILE, dy = DTILE, dz = 1;
    if (sz == 1) {
        GATHER(x, 0, nx, y, 0, eq_xy ? x + 1 : ny, z, 0, eq_yz ? y + 1 : nz, dx, dy, dz, sx, sy)
    } else if (sy == 1) {
        GATHER(x, 0, nx, z, 0, nz, y, eq_yz ? z : 0, eq_xy ? lmin(x + 1, ny) : ny, dx, dz, dy, sx, sz)
    } else {
        GATHER(y, 0, ny, z, 0, eq_yz ? lmin(y + 1, nz) : nz, x, eq_xy ? y : 0, nx, dy, dz, dx, sy, sz)
    }
#undef GATHER
}

/* The energy of the orbits (a, b, c) of one tile triple, a >= b >= c, from W at the six
 * permutations p (abc, acb, bac, bca, cab, cba): W_p(a, b, c) at L[p][(a - ta) sa[p] +
 * (b - tb) sb[p] + (c - tc) sc[p]] (the dense sweep's local tiles, or the packed sweep's W
 * read in place), and the transposes PT[x][yz] = P[x][zy].  Inlined, so a caller with
 * constant strides gets its own (vectorised) copy. */
static inline __attribute__((always_inline)) double
tile_energy(long nv, long ta, long na, long tb, long nb, long tc, long nc,
            const double *const L[6], const long sa[6], const long sb[6], const long sc[6],
            const double *ev, double eijk, const double *t1i, const double *t1j, const double *t1k,
            const double *Pjk, const double *Pik, const double *Pij,
            const double *Tjk, const double *Tik, const double *Tij)
{
    double energy = 0.0;
    const long s0 = sc[0], s1 = sc[1], s2 = sc[2], s3 = sc[3], s4 = sc[4], s5 = sc[5];
    for (long a = ta; a < ta + na; a++)
    for (long b = tb; b < lmin(tb + nb, a + 1); b++) {
        const long ra = a - ta, rb = b - tb;     /* c at [(c - tc) sc[p]] */
        const double *L0 = L[0] + ra * sa[0] + rb * sb[0], *L1 = L[1] + ra * sa[1] + rb * sb[1],
                     *L2 = L[2] + ra * sa[2] + rb * sb[2], *L3 = L[3] + ra * sa[3] + rb * sb[3],
                     *L4 = L[4] + ra * sa[4] + rb * sb[4], *L5 = L[5] + ra * sa[5] + rb * sb[5];
        const double eab = eijk - ev[a] - ev[b], tia = t1i[a], tib = t1i[b], tja = t1j[a],
                     tjb = t1j[b], tka = t1k[a], tkb = t1k[b], pij_ab = Pij[a * nv + b],
                     pij_ba = Pij[b * nv + a], pik_ab = Pik[a * nv + b],
                     pik_ba = Pik[b * nv + a], pjk_ab = Pjk[a * nv + b],
                     pjk_ba = Pjk[b * nv + a];
        const double *pjk_b = Pjk + b * nv, *pik_a = Pik + a * nv, *pij_a = Pij + a * nv,
                     *tjk_b = Tjk + b * nv, *pjk_a = Pjk + a * nv, *pik_b = Pik + b * nv,
                     *tjk_a = Tjk + a * nv, *pij_b = Pij + b * nv, *tik_b = Tik + b * nv,
                     *tij_a = Tij + a * nv, *tik_a = Tik + a * nv, *tij_b = Tij + b * nv;
        /* c < b: weight 1 (a > b) or 1/2 (a == b); c == b: 1/2 (a > b) or none (a == b == c) */
        const long cend = lmin(tc + nc, b + 1), cfull = lmin(cend, b);
        double row_sum = 0.0, diag = 0.0;
#define ORBIT(c, OUT)                                                                          \
        {                                                                                      \
            const long lc = (c) - tc;                                                          \
            const double w0 = L0[lc * s0], w1 = L1[lc * s1], w2 = L2[lc * s2], w3 = L3[lc * s3],   \
                         w4 = L4[lc * s4], w5 = L5[lc * s5];                                           \
            const double z0 = w0 + tia * pjk_b[c] + tjb * pik_a[c] + t1k[c] * pij_ab;          \
            const double z1 = w1 + tia * tjk_b[c] + t1j[c] * pik_ab + tkb * pij_a[c];  \
            const double z2 = w2 + tib * pjk_a[c] + tja * pik_b[c] + t1k[c] * pij_ba;          \
            const double z3 = w3 + tib * tjk_a[c] + t1j[c] * pik_ba + tka * pij_b[c];          \
            const double z4 = w4 + t1i[c] * pjk_ab + tja * tik_b[c] + tkb * tij_a[c];          \
            const double z5 = w5 + t1i[c] * pjk_ba + tjb * tik_a[c] + tka * tij_b[c];          \
            const double se = z0 + z3 + z4, so = z1 + z2 + z5;                                 \
            const double we = w0 + w3 + w4, wo = w1 + w2 + w5;                                 \
            OUT (3.0 * (w0 * z0 + w1 * z1 + w2 * z2 + w3 * z3 + w4 * z4 + w5 * z5)            \
                 + we * (se - 2.0 * so) + wo * (so - 2.0 * se)) / (eab - ev[c]);               \
        }
        for (long c = tc; c < cfull; c++)
            ORBIT(c, row_sum +=)
        if (cend > cfull && a != b)
            ORBIT(b, diag =)
#undef ORBIT
        energy += (a == b ? 0.5 * row_sum : row_sum) + 0.5 * diag;
    }
    return energy;
}

/* Zero n doubles of each of nr rows at stride ld. */
static void zero_rows(double *x, long nr, long ld, long n)
{
    for (long r = 0; r < nr; r++)
        memset(x + r * ld, 0, n * sizeof(double));
}

/* One virtual irrep: A, B, C [nv, nv, nv], their last two indices contiguous [nv, nv] and
 * the first of stride ld; P dense [nv, nv]; scratch tessera_t3_dense_scratch(nv) doubles.
 * clear: A, B and C are left zero, each element zeroed when its last read is done, while
 * its line is in cache (the compiled batch's GEMMs then accumulate into them: beta = 1, no
 * separate zeroing pass).  A distinct layout is zeroed as read; B shared with A (i == j)
 * is read at slab a as A[a, b, :] and at slab b as B[a, b, :], so its rows (a, b) and (b, a),
 * b <= a, are zeroed after slab a; B shared with C alone (j == k) is read as B[:, a, :] and
 * C[:, a, :] at slab a only, zeroed after it. */
SWEEP_CLONES
static double dense_energy(long nv, long ld, double *A, double *B, double *C, const double *ev, double eijk,
                           const double *t1i, const double *t1j, const double *t1k,
                           const double *Pjk, const double *Pik, const double *Pij, double *scratch, int clear)
{
    const long n2 = nv * nv;
    double *L = scratch, *T = scratch + 4 * DT3, *W = T + 3 * n2;
    const double *P[3] = {Pjk, Pik, Pij};
    for (int l = 0; l < 3; l++)
        for (long x = 0; x < nv; x++)
            for (long y = 0; y < nv; y++)
                T[l * n2 + y * nv + x] = P[l][x * nv + y];
    /* W[abc] = A[abc] + B[bac] + C[cab], slab a by slab a in one pass: A and B along c,
     * C strided within its [c, b] block of a (v rows of v, L1-resident across b) */
    const int a_own = A != B, c_own = C != B, b_own = a_own && c_own;
    for (long a = 0; a < nv; a++) {
        double *restrict wa = W + a * n2;
        for (long b = 0; b < nv; b++) {
            double *x = A + a * ld + b * nv, *y = B + b * ld + a * nv, *z = C + a * nv + b;
            if (a + 1 < nv) {   /* row b of slab a + 1's B and C blocks (2 v strided rows: too many
                                   streams for the hardware prefetcher; A's slab is contiguous) */
                const char *pb = (const char *) (y + nv), *pc = (const char *) (C + b * ld + (a + 1) * nv);
                for (long o = 0; o < nv * (long) sizeof(double); o += 64) {
                    __builtin_prefetch(pb + o, 0, 2);
                    __builtin_prefetch(pc + o, 0, 2);
                }
            }
            for (long c = 0; c < nv; c++)
                wa[b * nv + c] = x[c] + y[c] + z[c * ld];
            if (clear) {
                if (a_own)
                    memset(x, 0, nv * sizeof(double));
                if (b_own)
                    memset(y, 0, nv * sizeof(double));
                if (c_own)
                    for (long c = 0; c < nv; c++)
                        z[c * ld] = 0.0;
            }
        }
        if (clear && !a_own) {               /* B is A's: rows (a, b) and (b, a), b <= a, read */
            zero_rows(B + a * ld, 1, nv, (a + 1) * nv);
            zero_rows(B + a * nv, a + 1, ld, nv);
        } else if (clear && !c_own)          /* B is C's alone: B[:, a, :] read */
            zero_rows(B + a * nv, nv, ld, nv);
    }
    /* W at permutation p (abc acb bac bca cab cba): abc and bac read in place (c
     * contiguous), the other four gathered into local tiles [a][b][c] */
    static const long sc[6] = {1, 1, 1, 1, 1, 1};
    const long sa[6] = {n2, DTILE * DTILE, nv, DTILE * DTILE, DTILE * DTILE, DTILE * DTILE},
               sb[6] = {nv, DTILE, n2, DTILE, DTILE, DTILE};
    /* the strides of a, b, c in W of the gathered permutations acb, bca, cab, cba */
    const long gs[4][3] = {{n2, 1, nv}, {1, n2, nv}, {nv, 1, n2}, {1, nv, n2}};
    double energy = 0.0;
    for (long ta = 0; ta < nv; ta += DTILE)
    for (long tb = 0; tb <= ta; tb += DTILE)
    for (long tc = 0; tc <= tb; tc += DTILE) {
        const long na = lmin(DTILE, nv - ta), nb = lmin(DTILE, nv - tb), nc = lmin(DTILE, nv - tc);
        for (int q = 0; q < 4; q++)
            gather(L + q * DT3, W + ta * gs[q][0] + tb * gs[q][1] + tc * gs[q][2], gs[q][0], gs[q][1], gs[q][2],
                   na, nb, nc, ta == tb, tb == tc);
        const double *const Lp[6] = {W + ta * n2 + tb * nv + tc, L, W + tb * n2 + ta * nv + tc, L + DT3,
                                     L + 2 * DT3, L + 3 * DT3};
        energy += tile_energy(nv, ta, na, tb, nb, tc, nc, Lp, sa, sb, sc, ev, eijk, t1i, t1j, t1k,
                              Pjk, Pik, Pij, T, T + n2, T + 2 * n2);
    }
    return energy;
}

/* One virtual irrep: A, B, C [nv, nv, nv], their last two indices contiguous [nv, nv] and
 * the first of stride ld (nv * nv: dense; the compiled batch's layout: nk nv^2); P dense
 * [nv, nv]; scratch tessera_t3_dense_scratch(nv) doubles. */
double tessera_t3_energy_dense(long nv, long ld, const double *A, const double *B, const double *C,
                               const double *ev, double eijk,
                               const double *t1i, const double *t1j, const double *t1k,
                               const double *Pjk, const double *Pik, const double *Pij,
                               double *scratch)
{
    return dense_energy(nv, ld, (double *) A, (double *) B, (double *) C, ev, eijk, t1i, t1j, t1k, Pjk, Pik, Pij,
                        scratch, 0);
}

/* ------------------------------------------------------------------ point-group symmetry
 *
 * The packed layouts of one orbital triple of total irrep G (tessera.chem.triples.
 * VirtualLayout): per irrep g_s of the single index a block [s, pairs of G^g_s] at
 * base[g_s], the pairs (t, u) by g_t, then t, then u (offset poff[G^g_s][g_t]).  Layout a
 * holds (a; b, c), layout b (b; a, c) (the batch's slot of its GEMMs with the pairs
 * swapped), layout c (c; a, b):
 *
 *   W[xyz] = A[x; y, z] + Bs[y; x, z] + C[z; x, y].
 *
 * For irreps (g_x, g_y, g_z) each term is a dense [n_x, n_y, n_z] array with strides
 * (npair, n of the last, 1) in its own index order.  W is formed once per triple, block by
 * ordered irrep triple, in layout a's packed order (form_w: one pass along z, A and Bs
 * contiguous, C strided within its [n_z, n_y] block of x): each element of the three
 * layouts read once, W written once.  The sweep then visits virtual tiles that never
 * cross an irrep (each irrep's orbitals in runs of DTILE at most, in position order):
 * every tile triple ta >= tb >= tc whose irreps multiply to G reads W at the six
 * permutations in place, through the strides of its six ordered irrep blocks (a tile
 * triple's six sub-blocks stay in cache), in tile_energy.  No local copies, no table of
 * positions.
 *
 * The irrep tables (int64, VirtualLayout.batch_table): n[8], no[8], vstart[8], npair[8],
 * nleft[8], nfm[8], poff[8][8], loff[8][8], foff[8][8]. */
enum { T_N = 0, T_NO = 8, T_VSTART = 16, T_NPAIR = 24, T_NLEFT = 32, T_NFM = 40,
       T_POFF = 48, T_LOFF = 112, T_FOFF = 176 };

/* Doubles of the packed sweep's scratch: three (x t|y u) rows made dense [nv, nv] and
 * their transposes, then W of one triple (ntrip: the most virtual triples of one total
 * irrep, VirtualLayout.ntrip). */
long tessera_t3_packed_scratch(long nv, long ntrip)
{
    return 6 * nv * nv + ntrip;
}

/* out [nv, nv] = the packed pairs (t, u) of irrep h (a row of (x t|y u), pairs by irrep of
 * t, then t, then u: offset poff[8 h + g_t]) at (vstart[g_t] + t, vstart[g_u] + u), zero
 * elsewhere, and outT its transpose; row NULL: all zero.  zero = 0: both already hold a
 * row of irrep h (their zeros are in place, only the pairs are written). */
static void dense_pairs(long nv, const int64_t *tab, long h, const double *row, double *out,
                        double *outT, int zero)
{
    const int64_t *n = tab + T_N, *vstart = tab + T_VSTART, *poff = tab + T_POFF;
    if (zero)
        for (long x = 0; x < nv * nv; x++)
            out[x] = outT[x] = 0.0;
    if (!row)
        return;
    for (long gt = 0; gt < 8; gt++) {
        const long gu = gt ^ h, nt = n[gt], nu = n[gu];
        const double *src = row + poff[8 * h + gt];
        for (long t = 0; t < nt; t++)
            for (long u = 0; u < nu; u++) {
                const long x = vstart[gt] + t, y = vstart[gu] + u;
                out[x * nv + y] = outT[y * nv + x] = src[t * nu + u];
            }
    }
}

/* W[x; y, z] = A[x; y, z] + Bs[y; x, z] + C[z; x, y] of one triple of irrep G, in layout
 * a's packed order (block g_x at foff[G][g_x], pairs (y, z) by g_y at poff[G^g_x][g_y]),
 * from the three layouts, base[l][g_s] the block of single irrep g_s of layout l. */
static void form_w(long G, const int64_t *tab, const double *const base[3][8], double *W)
{
    const int64_t *n = tab + T_N, *npair = tab + T_NPAIR, *poff = tab + T_POFF, *foff = tab + T_FOFF + 8 * G;
    for (long gx = 0; gx < 8; gx++)
        for (long gy = 0; gy < 8; gy++) {
            const long gz = G ^ gx ^ gy, nx = n[gx], ny = n[gy], nz = n[gz];
            if (!nx || !ny || !nz)
                continue;
            const long hx = G ^ gx, hy = G ^ gy, hz = G ^ gz, px = npair[hx], py = npair[hy], pz = npair[hz];
            double *w = W + foff[gx] + poff[8 * hx + gy];
            const double *A = base[0][gx] + poff[8 * hx + gy], *Bs = base[1][gy] + poff[8 * hy + gx],
                         *C = base[2][gz] + poff[8 * hz + gx];
            for (long x = 0; x < nx; x++) {
                double *restrict wx = w + x * px;
                const double *ax = A + x * px, *cx = C + x * ny;
                for (long y = 0; y < ny; y++) {           /* C's [n_z, n_y] block of x stays in L1 */
                    const double *by = Bs + y * py + x * nz, *cy = cx + y;
                    for (long z = 0; z < nz; z++)
                        wx[y * nz + z] = ax[y * nz + z] + by[z] + cy[z * pz];
                }
            }
        }
}

/* sum_abc W r3(W + V) / D of one triple from its packed layouts, base[l][g_s] the block of
 * single irrep g_s of layout l (a, b pair-swapped, c); P[3] the rows (jb|kc), (ia|kc),
 * (ia|jb) made dense [nv, nv] and T[3] their transposes (dense_pairs); W ntrip[G] doubles. */
SWEEP_CLONES
static double sweep_packed(long G, const int64_t *tab, const double *const base[3][8], long nv,
                           const double *ev, double eijk,
                           const double *t1i, const double *t1j, const double *t1k,
                           const double *const P[3], const double *const T[3], double *W)
{
    const int64_t *n = tab + T_N, *vstart = tab + T_VSTART, *npair = tab + T_NPAIR, *poff = tab + T_POFF,
                  *foff = tab + T_FOFF + 8 * G;
    form_w(G, tab, base, W);
    /* the virtual tiles: start, size and irrep, in position order */
    long start[nv], size[nv], irr[nv], nt = 0;
    for (long x = 0; x < nv;) {
        long g = 0;
        while (!(vstart[g] <= x && x < vstart[g] + n[g]))
            g++;
        for (const long end = vstart[g] + n[g]; x < end; x += size[nt++])
            start[nt] = x, size[nt] = lmin(DTILE, end - x), irr[nt] = g;
    }
    /* permutation p (abc acb bac bca cab cba): which of a, b, c stands at each index of W */
    static const int perm[6][3] = {{0, 1, 2}, {0, 2, 1}, {1, 0, 2}, {1, 2, 0}, {2, 0, 1}, {2, 1, 0}};
    double energy = 0.0;
    for (long ta = 0; ta < nt; ta++)
    for (long tb = 0; tb <= ta; tb++)
    for (long tc = 0; tc <= tb; tc++) {
        if ((irr[ta] ^ irr[tb] ^ irr[tc]) != G)
            continue;
        const long t[3] = {ta, tb, tc};
        long g[3], rel[3];
        for (int q = 0; q < 3; q++)
            g[q] = irr[t[q]], rel[q] = start[t[q]] - vstart[g[q]];
        /* W at permutation p: the ordered irrep block (g of x, y, z = perm[p]) and the
         * strides of a, b, c in it; L[p] at the tile triple's first element */
        const double *L[6];
        long sa[6], sb[6], sc[6];
        for (int p = 0; p < 6; p++) {
            const int x = perm[p][0], y = perm[p][1], z = perm[p][2];
            const long hx = G ^ g[x];
            long st[3];
            st[x] = npair[hx], st[y] = n[g[z]], st[z] = 1;
            L[p] = W + foff[g[x]] + poff[8 * hx + g[y]] + rel[0] * st[0] + rel[1] * st[1] + rel[2] * st[2];
            sa[p] = st[0], sb[p] = st[1], sc[p] = st[2];
        }
        energy += tile_energy(nv, start[ta], size[ta], start[tb], size[tb], start[tc], size[tc], L, sa, sb, sc,
                              ev, eijk, t1i, t1j, t1k, P[0], P[1], P[2], T[0], T[1], T[2]);
    }
    return energy;
}

/* One triple, point-group symmetry: A, Bs, C its packed layouts a, b (pairs swapped) and c;
 * rows: the packed (jb|kc), (ia|kc), (ia|jb) of pair irreps h[0..2] (NULL: zero by
 * symmetry); scratch tessera_t3_packed_scratch(nv, ntrip[G]) doubles. */
double tessera_t3_energy_packed(long G, const int64_t *tab, long nv,
                                const double *A, const double *Bs, const double *C,
                                const double *ev, double eijk,
                                const double *t1i, const double *t1j, const double *t1k,
                                const double *Pjk, const double *Pik, const double *Pij,
                                const int64_t *h, double *scratch)
{
    const double *rows[3] = {Pjk, Pik, Pij}, *X[3] = {A, Bs, C};
    const double *P[3], *T[3], *base[3][8];
    for (int l = 0; l < 3; l++) {
        double *p = scratch + 2 * l * nv * nv;
        dense_pairs(nv, tab, h[l], rows[l], p, p + nv * nv, 1);
        P[l] = p, T[l] = p + nv * nv;
        for (int g = 0; g < 8; g++)
            base[l][g] = X[l] + tab[T_FOFF + 8 * G + g];
    }
    return sweep_packed(G, tab, (const double *const (*)[8]) base, nv, ev, eijk, t1i, t1j, t1k, P, T,
                        scratch + 6 * nv * nv);
}

/* The version of this source's functions and argument lists: chem/native.py refuses a
   library built from another (raise it with any change of an exported signature). */
int tessera_abi_version(void)
{
    return 9;
}

/* ------------------------------------------------------------------ the blocked kernel's sweep
 *
 * tessera.chem.triples_blocked visits the virtual triples of a batch (i, j, k in ks) by
 * block triples: the ordered blocks (X, Y, Z) of one unordered triple of virtual blocks,
 * W of each [nk, n_X, n_Y, n_Z] (C order).
 *
 * tessera_t3_block_w: W of one ordered block from the GEMM outputs of the three
 * single-index layouts, W[k, a, b, c] = Sa[k, a, b, c] + Sb[k, b, c, a] + Sc[k, c, a, b];
 * each term given as its address and its element strides in the order (k, a, b, c)
 * (terms[3][5]: address, s_k, s_a, s_b, s_c; address 0: no term); add: W += instead of =.
 */
void tessera_t3_block_w(long nk, long nx, long ny, long nz, const int64_t *terms, double *W, int add)
{
    const double *p[3];
    int64_t st[3][4];
    int nt = 0;
    for (int t = 0; t < 3; t++)
        if (terms[5 * t]) {
            p[nt] = (const double *) (intptr_t) terms[5 * t];
            for (int d = 0; d < 4; d++)
                st[nt][d] = terms[5 * t + 1 + d];
            nt++;
        }
    for (long k = 0; k < nk; k++)
        for (long a = 0; a < nx; a++)
            for (long b = 0; b < ny; b++) {
                double *w = W + ((k * nx + a) * ny + b) * nz;
                if (!add)
                    for (long c = 0; c < nz; c++)
                        w[c] = 0.0;
                for (int t = 0; t < nt; t++) {
                    const double *s = p[t] + k * st[t][0] + a * st[t][1] + b * st[t][2];
                    const int64_t sc = st[t][3];
                    for (long c = 0; c < nz; c++)
                        w[c] += s[c * sc];
                }
            }
}

/* tessera_t3_block_energy: sum_k sum_abc W r3(W + V) / D over one unordered block triple,
 * orbit by orbit as the sweeps above (each orbit's six permutations read once).  The
 * triple's distinct blocks (nb <= 3) have sizes size[nb] and positions off[nb] in a
 * *frame* of nf virtuals (the window's, or all); tri[3]: the triple's block ids, equal
 * ids adjacent; its ordered blocks: ids[norder][3] and W[norder] (addresses).  In frame
 * positions: ev[nf], t1i[nf], t1j[nf], t1k[nk][nf], Pjk, Pik [nk][nf][nf] ((jb|kc),
 * (ia|kc)), Pij [nf][nf] ((ia|jb)); eijk[nk] = e_i + e_j + e_k.  Orbit representatives:
 * a in block tri[0], b in tri[1], c in tri[2], b <= a where the first two blocks are one,
 * c <= b where the last two are; an orbit with two equal orbitals counts half, with three
 * none. */
double tessera_t3_block_energy(long nk, long nb, const int64_t *size, const int64_t *off, const int64_t *tri,
                               long norder, const int64_t *ids, const int64_t *W, long nf,
                               const double *ev, const double *eijk, const double *t1i, const double *t1j,
                               const double *t1k, const double *Pjk, const double *Pik, const double *Pij)
{
    long which[3][3][3];
    for (int x = 0; x < 27; x++)
        (&which[0][0][0])[x] = -1;
    for (long o = 0; o < norder; o++)
        which[ids[3 * o]][ids[3 * o + 1]][ids[3 * o + 2]] = o;
    const long A = tri[0], B = tri[1], C = tri[2];
    /* permutation p (abc acb bac bca cab cba) of (a, b, c): the positions of a, b, c */
    static const int pos[6][3] = {{0, 1, 2}, {0, 2, 1}, {1, 0, 2}, {2, 0, 1}, {1, 2, 0}, {2, 1, 0}};
    const long blk[3] = {A, B, C};
    const double *base[6];
    long sa[6], sb[6], sc[6];
    for (int p = 0; p < 6; p++) {
        long at[3];                       /* the block at each position of the permutation */
        for (int r = 0; r < 3; r++)
            at[pos[p][r]] = blk[r];
        const long o = at[0] < nb && at[1] < nb && at[2] < nb ? which[at[0]][at[1]][at[2]] : -1;
        if (o < 0)
            return NAN;                   /* an ordered block missing: NaN, never a wrong energy */
        const long stride[3] = {size[at[1]] * size[at[2]], size[at[2]], 1};
        base[p] = (const double *) (intptr_t) W[o];
        sa[p] = stride[pos[p][0]], sb[p] = stride[pos[p][1]], sc[p] = stride[pos[p][2]];
    }
    const long na = size[A], nbb = size[B], nc = size[C];
    const int eq_ab = A == B, eq_bc = B == C;
    const long vol = size[A] * size[B] * size[C];
    double energy = 0.0, w[6], z[6];
    for (long k = 0; k < nk; k++) {
        const double *tk = t1k + k * nf, *Djk = Pjk + k * nf * nf, *Dik = Pik + k * nf * nf;
        for (long a = 0; a < na; a++)
            for (long b = 0; b < (eq_ab ? a + 1 : nbb); b++)
                for (long c = 0; c < (eq_bc ? b + 1 : nc); c++) {
                    const int half = (eq_ab && a == b) + (eq_bc && b == c);
                    if (half == 2)
                        continue;
                    for (int p = 0; p < 6; p++)
                        w[p] = base[p][k * vol + a * sa[p] + b * sb[p] + c * sc[p]];
                    const long fa = off[A] + a, fb = off[B] + b, fc = off[C] + c;
                    add_v(nf, fa, fb, fc, t1i, t1j, tk, Djk, Dik, Pij, w, z);
                    const double e = orbit_energy(w, z) / (eijk[k] - ev[fa] - ev[fb] - ev[fc]);
                    energy += half ? 0.5 * e : e;
                }
    }
    return energy;
}

/* ------------------------------------------------------------------ one batch, GEMMs in C
 *
 * tessera_t3_batch_packed: what TripleKernel._energy_packed does for a batch (i, j, ks =
 * k0 .. k0 + nk - 1) on the fused operands of RowSlab.add_swapped, with its GEMMs called
 * here (BLAS dgemm, Fortran convention, its address given once by tessera_t3_set_dgemm:
 * SciPy's cython_blas, so no link-time BLAS), then per k the packed sweep above, reading
 * the three layouts in the batch buffer in place (the base of each layout's single-irrep
 * block of k: no copies out of it).
 *
 * The batch buffer B holds, per virtual block g_s of G (offset foff[G, g_s], n_s singles,
 * np pairs), three slots [k, s, pairs]: 0 layout a (i; j, k), 1 layout b pair-swapped
 * (j; i, k), 2 layout c (k; i, j); slot 1 is a's when i == j and slot 2 b's when j == k.
 * A slot (single o_s, pair o_t, o_u) is the sum of two fused terms:
 *   kind 0: left[o_s][o_u] right_a[o_t],   kind 1: left[o_s][o_t] right_b[o_u],
 * left[x][y] the row of y in x's fused left operand (block g_s at loff[h, g_s], [n_s, K],
 * h = g_x ^ g_y, K = n_c + o_c of g_c = g_s ^ h) and right_*[x] x's [K, np] of irrep g_c.
 * Terms of one kind in adjacent slots with the same right orbital are one GEMM (left rows
 * stacked over slots and k into lbuf: at most two slots share a GEMM, so lbuf needs
 * 2 nk max_s n_s max_c K doubles, TripleKernel.pool_sizes' last buffer); a right orbital
 * that is k is one GEMM per k and slot, accumulated in place (beta).
 *
 * tab (int64): n[8], no[8], vstart[8], npair[8], nleft[8], nfm[8], poff[8][8],
 * loff[8][8], foff[8][8]; occ: irrep[nocc], rel[nocc]; ptr: addresses of the rows of
 * left, right_a, right_b, ovov per orbital and irrep ([4][nocc][8], 0: none).
 */

typedef void dgemm_fn(const char *, const char *, const int *, const int *, const int *,
                      const double *, const double *, const int *, const double *, const int *,
                      const double *, double *, const int *);
static dgemm_fn *dgemm_ptr;

void tessera_t3_set_dgemm(void *fn) { dgemm_ptr = (dgemm_fn *) fn; }

enum { P_LEFT = 0, P_RA = 1, P_RB = 2, P_OVOV = 3 };

/* row-major C[n, m] = alpha L[n, k] R[k, m] + beta C (leading dimensions k, m, ldc) */
static void gemm_rm(long m, long n, long k, double alpha, const double *R, const double *L,
                    double beta, double *C, long ldc)
{
    const int mi = (int) m, ni = (int) n, ki = (int) k, ldci = (int) ldc;
    dgemm_ptr("N", "N", &mi, &ni, &ki, &alpha, R, &mi, L, &ki, &beta, C, &ldci);
}

#define PTR(t, x, g) ((const double *) (intptr_t) ptr[((t) * nocc + (x)) * 8 + (g)])

double tessera_t3_batch_packed(long G, long i, long j, long k0, long nk, long nocc,
                               const int64_t *tab, const int64_t *occ, const int64_t *ptr,
                               const double *t1, const double *eo, const double *ev, long nv,
                               double *B, double *lbuf, double *scratch, int64_t *flops)
{
    const int64_t *n = tab + T_N, *npair = tab + T_NPAIR, *nleft = tab + T_NLEFT, *nfm = tab + T_NFM,
                  *loff = tab + T_LOFF, *foff = tab + T_FOFF + 8 * G;
    const int64_t *irr = occ, *rel = occ + nocc;
    const long gk = irr[k0];
    /* layouts: (slot, o_s, o_t, o_u), -1 for k */
    long lay[3][4], nlay = 0;
    lay[nlay][0] = 0, lay[nlay][1] = i, lay[nlay][2] = j, lay[nlay][3] = -1, nlay++;
    if (i != j)
        lay[nlay][0] = 1, lay[nlay][1] = j, lay[nlay][2] = i, lay[nlay][3] = -1, nlay++;
    if (k0 != j)
        lay[nlay][0] = 2, lay[nlay][1] = -1, lay[nlay][2] = i, lay[nlay][3] = j, nlay++;
    int init[3][8] = {{0}};
    const long nslot = 3;
    int64_t fl = 0;
#define IRR(x) ((x) < 0 ? gk : irr[x])
    for (int kind = 0; kind < 2; kind++) {
        const int rt = kind ? P_RB : P_RA;
        /* per layout: left orbital, its row orbital, right orbital (-1: k, unless nk == 1) */
        long lo[3], ly[3], r[3];
        for (long l = 0; l < nlay; l++) {
            lo[l] = lay[l][1];
            ly[l] = kind ? lay[l][2] : lay[l][3];
            r[l] = kind ? lay[l][3] : lay[l][2];
            if (r[l] < 0 && nk == 1)
                r[l] = k0;
        }
        for (int varying = 0; varying < 2; varying++)
        for (long l0 = 0; l0 < nlay;) {
            long l1 = l0 + 1;          /* the group: adjacent slots with the same right orbital */
            while (l1 < nlay && r[l1] == r[l0] && lay[l1][0] == lay[l1 - 1][0] + 1)
                l1++;
            if ((r[l0] < 0) != varying) {
                l0 = l1;
                continue;
            }
            const long nm = l1 - l0, h = IRR(lo[l0]) ^ IRR(ly[l0]);
            for (long gs = 0; gs < 8; gs++) {
                const long np = npair[G ^ gs], ns = n[gs], gc = gs ^ h, K = nfm[gc];
                if (!ns || !np || !K)
                    continue;
                const long size = ns * np, width = ns * K, lo_off = loff[8 * h + gs];
                double *blk = B + nslot * nk * foff[gs];
                if (!varying) {
                    /* one GEMM: left rows of every slot and k stacked */
                    int mixed = 0, any = 0;
                    for (long l = l0; l < l1; l++)
                        any |= init[lay[l][0]][gs], mixed |= init[lay[l][0]][gs] != init[lay[l0][0]][gs];
                    if (mixed)
                        for (long l = l0; l < l1; l++)
                            if (!init[lay[l][0]][gs])
                                for (long e = 0; e < nk * size; e++)
                                    blk[lay[l][0] * nk * size + e] = 0.0;
                    const double *L = NULL;
                    for (long l = l0; l < l1; l++)
                        for (long q = 0; q < nk; q++) {
                            const long x = lo[l] < 0 ? k0 + q : lo[l], y = ly[l] < 0 ? k0 + q : ly[l];
                            const double *row = PTR(P_LEFT, x, irr[y]) + rel[y] * nleft[h] + lo_off;
                            if (nm * nk == 1)
                                L = row;
                            else
                                for (long e = 0; e < width; e++)
                                    lbuf[((l - l0) * nk + q) * width + e] = row[e];
                        }
                    gemm_rm(np, nm * nk * ns, K, 1.0, PTR(rt, r[l0], gc), L ? L : lbuf, any ? 1.0 : 0.0,
                            blk + lay[l0][0] * nk * size, np);
                    fl += 2 * nm * nk * size * K;
                } else {
                    /* a GEMM per k and slot: the right operand is k's */
                    for (long q = 0; q < nk; q++)
                        for (long l = l0; l < l1; l++) {
                            const long sl = lay[l][0];
                            const double *L = PTR(P_LEFT, lo[l], irr[ly[l]]) + rel[ly[l]] * nleft[h] + lo_off;
                            gemm_rm(np, ns, K, 1.0, PTR(rt, k0 + q, gc), L, init[sl][gs] ? 1.0 : 0.0,
                                    blk + (sl * nk + q) * size, np);
                        }
                    fl += 2 * nm * nk * size * K;
                }
                for (long l = l0; l < l1; l++)
                    init[lay[l][0]][gs] = 1;
            }
            l0 = l1;
        }
    }
    for (long l = 0; l < nlay; l++)               /* a block no term reached is zero */
        for (long gs = 0; gs < 8; gs++)
            if (n[gs] && npair[G ^ gs] && !init[lay[l][0]][gs]) {
                double *c = B + nslot * nk * foff[gs] + lay[l][0] * nk * n[gs] * npair[G ^ gs];
                for (long e = 0; e < nk * n[gs] * npair[G ^ gs]; e++)
                    c[e] = 0.0;
            }
    *flops += fl;
    /* per k: the sweep, reading the three layouts in the batch buffer in place */
    const int64_t h3[3] = {irr[j] ^ gk, irr[i] ^ gk, irr[i] ^ irr[j]};
    const long slot_b = i == j ? 0 : 1;          /* on a diagonal b is a's, c is b's */
    const double *P[3], *T[3];                   /* (jb|kc), (ia|kc), (ia|jb) dense, transposed */
    for (int l = 0; l < 3; l++) {
        P[l] = scratch + 2 * l * nv * nv;
        T[l] = P[l] + nv * nv;
    }
    /* (ia|jb) is the same for every k of the batch: made dense once; the ks are of one
     * irrep, so the pair irreps of (jb|kc) and (ia|kc) are too: their zeros are written once */
    dense_pairs(nv, tab, h3[2], npair[h3[2]] ? PTR(P_OVOV, i, irr[j]) + rel[j] * npair[h3[2]] : NULL,
                (double *) P[2], (double *) T[2], 1);
    double energy = 0.0;
    for (long q = 0; q < nk; q++) {
        const long k = k0 + q, slots[3] = {0, slot_b, j == k ? slot_b : 2};
        const double *base[3][8];
        for (int l = 0; l < 3; l++)
            for (long g = 0; g < 8; g++)
                base[l][g] = B + nslot * nk * foff[g] + (slots[l] * nk + q) * n[g] * npair[G ^ g];
        const long pair_of[2][2] = {{j, k}, {i, k}};           /* (jb|kc), (ia|kc) */
        for (int l = 0; l < 2; l++) {
            const long x = pair_of[l][0], y = pair_of[l][1];
            dense_pairs(nv, tab, h3[l], npair[h3[l]] ? PTR(P_OVOV, x, irr[y]) + rel[y] * npair[h3[l]] : NULL,
                        (double *) P[l], (double *) T[l], q == 0);
        }
        energy += sweep_packed(G, tab, (const double *const (*)[8]) base, nv, ev, eo[i] + eo[j] + eo[k],
                               t1 + i * nv, t1 + j * nv, t1 + k * nv, P, T, scratch + 6 * nv * nv);
    }
    return energy;
#undef IRR
}

/* ------------------------------------------------------------------ one batch, one virtual irrep
 *
 * tessera_t3_batch_dense: a batch (i, j, ks = k0 .. k0 + nk - 1) of the C1 kernel (every
 * orbital of irrep 0) on the fused operands of RowSlab.add_swapped (rows as for
 * tessera_t3_batch_packed: left[x][y] [nv, K], right_a[x] and right_b[x] [K, nv^2],
 * K = nv + no), GEMMs and sweeps in one call.  A layout (single o_s, pair o_t, o_u) is
 * left[o_s][o_u] right_a[o_t] + left[o_s][o_t] right_b[o_u]; a: (i; j, k), b: (j; i, k),
 * c: (k; i, j); a is b's when i == j, c is b's when ks = [j].  The batch buffer B holds the
 * three layouts as [slot][s][k][pairs], so that
 *   - a right operand fixed over the batch is one GEMM over every k (columns (s, k), their
 *     left rows copied into lbuf), and layouts b and c share right_a[i]: one GEMM of
 *     2 nk nv columns;
 *   - right_b[k], of layouts a and b, is one GEMM per k over both (columns (slot, s),
 *     ldc = nk nv^2),
 * 3 + nk GEMMs per batch instead of 4 + 2 nk, so that OpenBLAS packs the v^2 x K right
 * operand of k once per k, not twice.  The sweep (dense_energy) reads each k's layouts in
 * place (first-index stride nk nv^2) and zeroes them behind it: B must be all zero on entry
 * and is left so, and every GEMM accumulates (beta = 1), so OpenBLAS runs no zeroing pass
 * over a cold C of its own.  B: 3 nk nv^3 doubles, lbuf: 2 nk nv K, scratch:
 * tessera_t3_dense_scratch(nv). */
double tessera_t3_batch_dense(long i, long j, long k0, long nk, long nocc, const int64_t *occ,
                              const int64_t *ptr, const double *t1, const double *eo, const double *ev,
                              long nv, long K, double *B, double *lbuf, double *scratch, int64_t *flops)
{
    const int64_t *rel = occ + nocc;
    const long n2 = nv * nv, rows = nv * K, slot = nk * nv * n2;
    const int has_a = i != j, has_c = k0 != j;
#define LEFT(x, y) (PTR(P_LEFT, x, 0) + rel[y] * rows)
    /* lbuf [s, k, K] (layouts of one left orbital per k): right_a[i] of b (left[j][k]) and
     * c (left[k][j]) in one GEMM; then right_a[j] of a (left[i][k]), right_b[j] of c
     * (left[k][i]) */
    const long fixed[3][4] = {{P_RA, i, 1, 1 + has_c}, {P_RA, j, 0, has_a}, {P_RB, j, 2, has_c}};
    int64_t fl = 0;
    for (int f = 0; f < 3; f++) {
        const long first = fixed[f][2], nslot = fixed[f][3];
        if (!nslot)
            continue;
        double *L = lbuf;
        for (long l = first; l < first + nslot; l++)
            for (long s = 0; s < nv; s++)
                for (long q = 0; q < nk; q++, L += K) {
                    const long k = k0 + q;
                    const double *src = l == 0 ? LEFT(i, k) : l == 1 ? LEFT(j, k) : f == 0 ? LEFT(k, j) : LEFT(k, i);
                    memcpy(L, src + s * K, K * sizeof(double));
                }
        gemm_rm(n2, nslot * nv * nk, K, 1.0, PTR(fixed[f][0], fixed[f][1], 0), lbuf, 1.0, B + first * slot, n2);
        fl += 2 * n2 * nslot * nv * nk * K;
    }
    /* right_b[k] of a (left[i][j]) and b (left[j][i]): [slot, s] columns, one GEMM per k */
    const double *L = LEFT(j, i);
    if (has_a) {
        memcpy(lbuf, LEFT(i, j), rows * sizeof(double));
        memcpy(lbuf + rows, L, rows * sizeof(double));
        L = lbuf;
    }
    for (long q = 0; q < nk; q++)
        gemm_rm(n2, (1 + has_a) * nv, K, 1.0, PTR(P_RB, k0 + q, 0), L, 1.0, B + (has_a ? 0 : slot) + q * n2,
                nk * n2);
    fl += 2 * n2 * (1 + has_a) * nv * nk * K;
    *flops += fl;
    const double *Pij = PTR(P_OVOV, i, 0) + rel[j] * n2;
    double energy = 0.0;
    for (long q = 0; q < nk; q++) {
        const long k = k0 + q;
        double *b = B + slot + q * n2;
        energy += dense_energy(nv, nk * n2, has_a ? B + q * n2 : b, b, has_c ? b + slot : b, ev, eo[i] + eo[j] + eo[k],
                               t1 + i * nv, t1 + j * nv, t1 + k * nv, PTR(P_OVOV, j, 0) + rel[k] * n2,
                               PTR(P_OVOV, i, 0) + rel[k] * n2, Pij, scratch, 1);
    }
    return energy;
#undef LEFT
}
#undef PTR
