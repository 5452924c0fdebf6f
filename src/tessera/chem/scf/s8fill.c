/* The 8-fold AO integrals (ij|kl), i >= j, k >= l, ij >= kl, from one shell quartet per
 * orbit of the point group (chem/scf/integrals.py drives it; no Python API, called
 * through ctypes, which releases the GIL: one call per thread).
 *
 * Every operation g of an Abelian point group maps AO k to a signed AO,
 * phi_k(g r) = s_g(k) phi_pi_g(k)(r), and shell to shell, so the integrals are invariant:
 *
 *     (pi_g a pi_g b | pi_g c pi_g d) = s_g(a) s_g(b) s_g(c) s_g(d) (ab|cd).
 *
 * The canonical shell quartets fall into orbits; libcint computes one per orbit (the
 * lowest packed index of its images) and each of its images is written from it with
 * those signs (the petite list of M. Dupuis and H. F. King, Int. J. Quantum Chem. 11,
 * 613 (1977)). Orbits are disjoint,
 * so threads that take different quartets never write the same element.
 *
 * Packed indices: pair(a, b) = a (a + 1) / 2 + b for a >= b; the element (ab|cd) is at
 * pair(pair(a, b), pair(c, d)) of the array of npair (npair + 1) / 2 doubles, PySCF's
 * ``aosym="s8"`` layout.
 */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef int (*intor_fn)(double *out, int *dims, int *shls, int *atm, int natm, int *bas,
                        int nbas, double *env, void *opt, double *cache);

static inline int64_t pair(int64_t a, int64_t b)
{
    return a >= b ? a * (a + 1) / 2 + b : b * (b + 1) / 2 + a;
}

/* The shells i >= j of the packed shell pair ij = pair(i, j). */
static void shell_pair(int64_t ij, int *i, int *j)
{
    int a = 0;
    while ((int64_t)(a + 1) * (a + 2) / 2 <= ij)
        a++;
    *i = a;
    *j = (int)(ij - (int64_t)a * (a + 1) / 2);
}

/* The next shell pair ij claimed from the shared counter ``next`` (threads take pairs in
   turn), its shells in i and j; -1 when every pair below ``end`` is taken. */
static int64_t claim_shell_pair(int64_t *next, int64_t end, int *i, int *j)
{
    int64_t ij = __atomic_fetch_add(next, 1, __ATOMIC_RELAXED);
    if (ij >= end)
        return -1;
    shell_pair(ij, i, j);
    return ij;
}

/* The size of the orbit of the canonical shell quartet (ij|kl), packed index q, when it is
 * its representative (the lowest packed index of its images), else 0; ``images[g]``: the
 * canonical quartet operation g maps it onto (filled up to the first lower one). */
static int orbit_of(int i, int j, int k, int l, int64_t q, int nbas, int nops,
                    const int *shell_map, int64_t *images)
{
    for (int g = 0; g < nops; g++) {
        const int *m = shell_map + (size_t)g * nbas;
        images[g] = pair(pair(m[i], m[j]), pair(m[k], m[l]));
        if (images[g] < q)
            return 0;
    }
    int distinct = 0;
    for (int g = 0; g < nops; g++) {
        int seen = 0;
        for (int h = 0; h < g && !seen; h++)
            seen = images[h] == images[g];
        distinct += !seen;
    }
    return distinct;
}

/* Doubles before libcint's cache in a caller's ``scratch`` (tessera_s8_fill,
 * tessera_s8_direct_jk): one shell quartet of the largest shell, rounded up to 8 doubles
 * (64 bytes). The caller sizes ``scratch`` once, this plus libcint's largest cache
 * (PySCF's GTOmax_cache_size, chem/scf/integrals.py: BlockERI.scratch), and keeps one per
 * thread: libcint, given no cache, allocates one in every call. */
int64_t tessera_s8_quartet_doubles(int nbas, const int *ao_loc)
{
    int64_t maxsh = 0;
    for (int s = 0; s < nbas; s++)
        if (ao_loc[s + 1] - ao_loc[s] > maxsh)
            maxsh = ao_loc[s + 1] - ao_loc[s];
    return (maxsh * maxsh * maxsh * maxsh + 7) / 8 * 8;
}

/* ``cost[ij - start]`` for the shell pairs ij in [start, end): the integrals of the
 * representative quartets (ij|kl), kl <= ij, that tessera_s8_fill computes and
 * tessera_s8_jk contracts for ij (the cost model of the ranks' ranges of shell pairs). */
void tessera_s8_cost(int nbas, const int *ao_loc, int nops, const int *shell_map,
                     int64_t start, int64_t end, double *cost)
{
    int64_t images[64];
    if (nops > 64) {            /* more operations than images[] holds: no quartet counted */
        for (int64_t ij = start; ij < end; ij++)
            cost[ij - start] = 0;
        return;
    }
    for (int64_t ij = start; ij < end; ij++) {
        int i, j;
        shell_pair(ij, &i, &j);
        double nij = (double)(ao_loc[i + 1] - ao_loc[i]) * (ao_loc[j + 1] - ao_loc[j]), c = 0;
        for (int k = 0; k <= i; k++)
            for (int l = 0; l <= k; l++) {
                int64_t kl = pair(k, l);
                if (kl > ij)
                    break;
                if (orbit_of(i, j, k, l, pair(ij, kl), nbas, nops, shell_map, images))
                    c += (double)(ao_loc[k + 1] - ao_loc[k]) * (ao_loc[l + 1] - ao_loc[l]);
            }
        cost[ij - start] = nij * c;
    }
}

/* Fills ``eri`` for the shell pairs ij (i >= j) below ``end`` that this caller claims from
 * ``next`` (shared by the callers: each takes the next pair with an atomic add) and every
 * kl <= ij. ``row_off`` NULL: the packed 8-fold array, every image of each representative
 * written. Else the representatives alone, compact (a rank's range of shell pairs,
 * chem/scf/integrals.py): those of pair ij one after the other in kl order from
 * eri + row_off[ij], each as libcint's block buf[a + ni (b + nj (c + nk d))] (whose
 * sizes tessera_s8_cost sums per pair).
 * ``shell_map``, ``ao_map``, ``ao_sign``: nops rows (the identity first) of nbas, nao and
 * nao entries. ``orbit[pair(ij, kl) - obase]``: the number of quartets in the orbit of
 * each representative, 0 for the others (``obase`` = pair(first pair of the range, 0): a
 * rank holds the entries of its own range only). ``scratch``: this caller's, of
 * tessera_s8_quartet_doubles + libcint's cache. Returns 0, or -1 with more than 64 operations. */
int tessera_s8_fill(void *intor, void *cintopt, int *atm, int natm, int *bas, int nbas,
                    double *env, const int *ao_loc, int nao, int nops, const int *shell_map,
                    const int *ao_map, const double *ao_sign, int64_t *next, int64_t end,
                    const int64_t *row_off, double *eri, unsigned char *orbit, int64_t obase,
                    double *scratch)
{
    intor_fn fn = (intor_fn)intor;
    if (nops > 64)
        return -1;
    double *buf = scratch, *cache = scratch + tessera_s8_quartet_doubles(nbas, ao_loc);
    int64_t ij;
    int i, j;
    while ((ij = claim_shell_pair(next, end, &i, &j)) >= 0) {
        double *row = row_off ? eri + row_off[ij] : NULL;
        for (int k = 0; k <= i; k++) {
            for (int l = 0; l <= k; l++) {
                int64_t kl = pair(k, l);
                if (kl > ij)
                    break;
                int64_t q = pair(ij, kl);
                int64_t images[64];
                int distinct = orbit_of(i, j, k, l, q, nbas, nops, shell_map, images);
                orbit[q - obase] = (unsigned char)distinct;
                if (!distinct)
                    continue;
                int shls[4] = {i, j, k, l};
                int ni = ao_loc[i + 1] - ao_loc[i], nj = ao_loc[j + 1] - ao_loc[j];
                int nk = ao_loc[k + 1] - ao_loc[k], nl = ao_loc[l + 1] - ao_loc[l];
                size_t n = (size_t)ni * nj * nk * nl;
                double *out = row ? row : buf;
                if (!fn(out, NULL, shls, atm, natm, bas, nbas, env, cintopt, cache))
                    memset(out, 0, sizeof(double) * n);
                if (row) {
                    row += n;
                    continue;
                }
                /* buf[a + ni (b + nj (c + nk d))] = (ab|cd), AOs counted from the shells'
                 * first; each image quartet written once (two operations that map the
                 * quartet onto the same one write the same elements) */
                for (int g = 0; g < nops; g++) {
                    int seen = 0;
                    for (int h = 0; h < g && !seen; h++)
                        seen = images[h] == images[g];
                    if (seen)
                        continue;
                    const int *am = ao_map + (size_t)g * nao;
                    const double *as = ao_sign + (size_t)g * nao;
                    for (int a = 0; a < ni; a++)
                        for (int b = 0; b < nj; b++) {
                            int A = ao_loc[i] + a, B = ao_loc[j] + b;
                            int64_t ab = pair(am[A], am[B]);
                            double sab = as[A] * as[B];
                            for (int c = 0; c < nk; c++) {
                                int C = ao_loc[k] + c;
                                double sabc = sab * as[C];
                                const double *v = buf + a + (size_t)ni * (b + (size_t)nj * c);
                                for (int d = 0; d < nl; d++) {
                                    int D = ao_loc[l] + d;
                                    eri[pair(ab, pair(am[C], am[D]))] = sabc * as[D] * v[(size_t)ni * nj * nk * d];
                                }
                            }
                        }
                }
            }
        }
    }
    return 0;
}

/* Adds the contribution of the representative quartet (ij|kl), weighted by ``w`` (its
 * orbit size), to this caller's vj and vk (see tessera_s8_jk): from ``blk``, the block as
 * libcint writes it (element (a, b, c, d) at a + ni (b + nj (c + nk d))), or, when blk is
 * NULL, from the packed 8-fold ``eri``. */
static void contract_quartet(const int *ao_loc, int nao, int i, int j, int k, int l, int same,
                             double w, const double *blk, const double *eri, const double *dm,
                             double *vj, double *vk)
{
    int ni = ao_loc[i + 1] - ao_loc[i], nj = ao_loc[j + 1] - ao_loc[j];
    size_t nk = ao_loc[k + 1] - ao_loc[k], sd = (size_t)ni * nj * nk;
    for (int a = ao_loc[i]; a < ao_loc[i + 1]; a++) {
        const double *da = dm + (size_t)a * nao;
        double *ka = vk + (size_t)a * nao;
        int b1 = i == j ? a + 1 : ao_loc[j + 1];
        for (int b = ao_loc[j]; b < b1; b++) {
            const double *db = dm + (size_t)b * nao;
            double *kb = vk + (size_t)b * nao;
            int64_t ab = pair(a, b);
            double wab = a == b ? 0.5 * w : w;
            double dab = da[b], jab = 0;
            for (int c = ao_loc[k]; c < ao_loc[k + 1]; c++) {
                const double *dc = dm + (size_t)c * nao;
                double *jc = vj + (size_t)c * nao;
                double kac = 0, kbc = 0, dac = da[c], dbc = db[c];
                int d1 = k == l ? c + 1 : ao_loc[l + 1];
                const double *vabc = blk ? blk + (a - ao_loc[i]) + (size_t)ni * ((b - ao_loc[j])
                                         + (size_t)nj * (c - ao_loc[k])) : NULL;
                for (int d = ao_loc[l]; d < d1; d++) {
                    int64_t cd = pair(c, d);
                    if (same && cd > ab)
                        break;
                    double v = (vabc ? vabc[sd * (size_t)(d - ao_loc[l])] : eri[pair(ab, cd)]) * wab;
                    if (c == d)
                        v *= 0.5;
                    if (cd == ab)
                        v *= 0.5;
                    jab += 2 * v * dc[d];          /* (ab|cd) D_cd, both orders of cd */
                    jc[d] += 2 * v * dab;          /* (ab|cd) D_ab, both orders of ab */
                    kac += v * db[d];              /* K_ac += (ab|cd) D_bd */
                    kbc += v * da[d];              /* K_bc += (ba|cd) D_ad */
                    ka[d] += v * dbc;              /* K_ad += (ab|dc) D_bc */
                    kb[d] += v * dac;              /* K_bd += (ba|dc) D_ac */
                }
                ka[c] += kac;
                kb[c] += kbc;
            }
            vj[(size_t)a * nao + b] += jab;
        }
    }
}

/* The skeleton J and K of a symmetric density ``dm`` (nao x nao) from the representative
 * quartets only, each weighted by its orbit: summed over the group's operations afterwards
 * (chem/scf/integrals.py, Skeleton) they are the whole J and K, as the density is
 * invariant: the sum over an orbit of a quartet's contribution = |orbit| / |G| sum over g
 * of g applied to the representative's. Each canonical element (ab|cd) stands for its 8
 * permutations, halved for each coincidence (a = b, c = d, ab = cd); of their updates only
 * half are made, the other half being the transposes (dm symmetric): J = vj + vj^T and
 * K = vk + vk^T. ``vj``, ``vk``: this caller's own nao x nao, zeroed; shell pairs below
 * ``end`` claimed from ``next``, ``eri`` packed or compact (``row_off``) as tessera_s8_fill
 * wrote it. */
void tessera_s8_jk(int nbas, const int *ao_loc, int nao, const unsigned char *orbit,
                   const double *eri, const int64_t *row_off, const double *dm, int64_t *next,
                   int64_t end, double *vj, double *vk, int64_t obase)
{
    int64_t ij;
    int i, j;
    (void)nbas;
    while ((ij = claim_shell_pair(next, end, &i, &j)) >= 0) {
        const double *row = row_off ? eri + row_off[ij] : NULL;
        int ni = ao_loc[i + 1] - ao_loc[i], nj = ao_loc[j + 1] - ao_loc[j];
        for (int k = 0; k <= i; k++) {
            for (int l = 0; l <= k; l++) {
                int64_t kl = pair(k, l);
                if (kl > ij)
                    break;
                double w = orbit[pair(ij, kl) - obase];
                if (w == 0)
                    continue;
                contract_quartet(ao_loc, nao, i, j, k, l, ij == kl, w, row, eri, dm, vj, vk);
                if (row)
                    row += (size_t)ni * nj * (ao_loc[k + 1] - ao_loc[k]) * (ao_loc[l + 1] - ao_loc[l]);
            }
        }
    }
}

/* The direct skeleton build: as tessera_s8_fill followed by tessera_s8_jk, but each
 * representative quartet (ij|kl) of the shell pairs ij below ``end`` claimed from ``next``
 * is computed by libcint into a buffer and contracted at once, nothing kept. With
 * ``thr`` > 0 a quartet is skipped when its Schwarz bound Q_ij Q_kl (``qsh``, nbas x nbas)
 * is below thr, or Q_ij Q_kl max(4|D_ij|, 4|D_kl|, |D_ik|, |D_jl|, |D_il|, |D_jk|) is, the
 * shell-pair maxima of |dm| in ``dsh`` (nbas x nbas; M. Haser and R. Ahlrichs,
 * J. Comput. Chem. 10, 104 (1989); PySCF's CVHFnrs8_prescreen): an invariant density
 * gives every image of a quartet the bound of its representative. ``counts`` (this
 * caller's): [0] quartets computed, [1] representatives screened out, [2] integrals
 * computed. ``scratch``: as tessera_s8_fill's. Returns 0, or -1 with more than 64 operations. */
int tessera_s8_direct_jk(void *intor, void *cintopt, int *atm, int natm, int *bas, int nbas,
                         double *env, const int *ao_loc, int nao, int nops, const int *shell_map,
                         const double *qsh, const double *dsh, double thr, const double *dm,
                         int64_t *next, int64_t end, double *vj, double *vk, int64_t *counts,
                         double *scratch)
{
    intor_fn fn = (intor_fn)intor;
    if (nops > 64)
        return -1;
    double *buf = scratch, *cache = scratch + tessera_s8_quartet_doubles(nbas, ao_loc);
    int64_t ij, images[64];
    int i, j;
    while ((ij = claim_shell_pair(next, end, &i, &j)) >= 0) {
        double qij = qsh[(size_t)i * nbas + j], dij = dsh[(size_t)i * nbas + j];
        for (int k = 0; k <= i; k++) {
            for (int l = 0; l <= k; l++) {
                int64_t kl = pair(k, l);
                if (kl > ij)
                    break;
                int w = orbit_of(i, j, k, l, pair(ij, kl), nbas, nops, shell_map, images);
                if (!w)
                    continue;
                if (thr > 0) {
                    double qq = qij * qsh[(size_t)k * nbas + l], dmax = 4 * dij;
                    const double *dk = dsh + (size_t)k * nbas, *dl = dsh + (size_t)l * nbas;
                    if (4 * dk[l] > dmax) dmax = 4 * dk[l];
                    if (dk[i] > dmax) dmax = dk[i];
                    if (dl[j] > dmax) dmax = dl[j];
                    if (dl[i] > dmax) dmax = dl[i];
                    if (dk[j] > dmax) dmax = dk[j];
                    if (qq < thr || qq * dmax < thr) {
                        counts[1]++;
                        continue;
                    }
                }
                int shls[4] = {i, j, k, l};
                size_t n = (size_t)(ao_loc[i + 1] - ao_loc[i]) * (ao_loc[j + 1] - ao_loc[j])
                           * (ao_loc[k + 1] - ao_loc[k]) * (ao_loc[l + 1] - ao_loc[l]);
                counts[0]++;
                counts[2] += (int64_t)n;
                if (!fn(buf, NULL, shls, atm, natm, bas, nbas, env, cintopt, cache))
                    continue;           /* libcint: all zero */
                contract_quartet(ao_loc, nao, i, j, k, l, ij == kl, w, buf, NULL, dm, vj, vk);
            }
        }
    }
    return 0;
}

/* The version of this source's functions and argument lists: chem/native.py refuses a
   library built from another (raise it with any change of an exported signature). */
int tessera_abi_version(void)
{
    return 6;
}
