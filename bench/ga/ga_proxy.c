/* Peer of bench/proxy_matmul.py: TCE's 2-D block matrix multiplication with Global Arrays.
 *
 * C = A B, n x n doubles in GA's default distribution, in b x b blocks. Tasks come from a
 * shared counter (NGA_Read_inc), as in NWChem's TCE:
 *   original  task (i, j): for every k NGA_Get A(i,k) and B(k,j), multiply (dgemm),
 *             NGA_Acc C(i,j) once;
 *   inverted  task (i, k): NGA_Get A(i,k) once, then for every j NGA_Get B(k,j),
 *             multiply, NGA_Acc C(i,j).
 * A(r,c) = 1/(1+r+2c), B(r,c) = 1/(2+2r+c); rank 0 checks 16 rows of C against a direct
 * sum. Rank 0 prints one JSON object: seconds (max over ranks), gets and accs (summed),
 * bytes requested per rank (gets + accs, b*b*8 each; GA does not say which were local),
 * max abs error.
 * Build and run: bench/proxy_matmul.py (mpicc.openmpi ... -lga-openmpi -larmci-openmpi).
 * Usage: mpirun -n P ga_proxy original|inverted N B
 */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ga.h"
#include "macdecls.h"

void dgemm_(const char *, const char *, const int *, const int *, const int *, const double *,
            const double *, const int *, const double *, const int *, const double *, double *,
            const int *);

static double a_of(int r, int c) { return 1.0 / (1 + r + 2 * c); }
static double b_of(int r, int c) { return 1.0 / (2 + 2 * r + c); }

static void patch(int i, int j, int b, int lo[2], int hi[2]) {
    lo[0] = i * b; lo[1] = j * b; hi[0] = lo[0] + b - 1; hi[1] = lo[1] + b - 1;
}

/* c += a b for row-major b x b blocks (column-major dgemm of the transposes) */
static void gemm(int b, const double *a, const double *bb, double *c) {
    const double one = 1.0;
    dgemm_("N", "N", &b, &b, &b, &one, bb, &b, a, &b, &one, c, &b);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    GA_Initialize();
    MA_init(C_DBL, 1000000, 1000000);
    int me = GA_Nodeid(), np = GA_Nnodes();
    if (argc != 4) {
        if (me == 0) fprintf(stderr, "usage: ga_proxy original|inverted N B\n");
        GA_Terminate(); MPI_Finalize(); return 2;
    }
    int inverted = strcmp(argv[1], "inverted") == 0;
    int n = atoi(argv[2]), b = atoi(argv[3]), nb = n / b, ld = b;
    int dims[2] = {n, n}, one_dim[1] = {1};
    int A = NGA_Create(C_DBL, 2, dims, "A", NULL), B = NGA_Create(C_DBL, 2, dims, "B", NULL);
    int C = NGA_Create(C_DBL, 2, dims, "C", NULL), cnt = NGA_Create(C_LONG, 1, one_dim, "cnt", NULL);
    GA_Zero(C); GA_Zero(cnt);
    int lo[2], hi[2], ldl;
    NGA_Distribution(A, me, lo, hi);
    if (lo[0] >= 0 && lo[0] <= hi[0]) {       /* fill my patches of A and B in place */
        double *pa, *pb;
        NGA_Access(A, lo, hi, &pa, &ldl);
        for (int r = lo[0]; r <= hi[0]; r++)
            for (int c = lo[1]; c <= hi[1]; c++) pa[(r - lo[0]) * ldl + (c - lo[1])] = a_of(r, c);
        NGA_Release_update(A, lo, hi);
        NGA_Distribution(B, me, lo, hi);
        NGA_Access(B, lo, hi, &pb, &ldl);
        for (int r = lo[0]; r <= hi[0]; r++)
            for (int c = lo[1]; c <= hi[1]; c++) pb[(r - lo[0]) * ldl + (c - lo[1])] = b_of(r, c);
        NGA_Release_update(B, lo, hi);
    }
    GA_Sync();
    double *abuf = malloc(sizeof(double) * b * b), *bbuf = malloc(sizeof(double) * b * b);
    double *cbuf = malloc(sizeof(double) * b * b), alpha = 1.0;
    long gets = 0, accs = 0;
    int zero[1] = {0};
    double t0 = MPI_Wtime();
    for (long t = NGA_Read_inc(cnt, zero, 1); t < (long)nb * nb; t = NGA_Read_inc(cnt, zero, 1)) {
        int i = (int)(t / nb), x = (int)(t % nb);
        if (!inverted) {                       /* x = j */
            memset(cbuf, 0, sizeof(double) * b * b);
            for (int k = 0; k < nb; k++) {
                patch(i, k, b, lo, hi); NGA_Get(A, lo, hi, abuf, &ld);
                patch(k, x, b, lo, hi); NGA_Get(B, lo, hi, bbuf, &ld);
                gets += 2;
                gemm(b, abuf, bbuf, cbuf);
            }
            patch(i, x, b, lo, hi); NGA_Acc(C, lo, hi, cbuf, &ld, &alpha);
            accs++;
        } else {                               /* x = k */
            patch(i, x, b, lo, hi); NGA_Get(A, lo, hi, abuf, &ld);
            gets++;
            for (int j = 0; j < nb; j++) {
                patch(x, j, b, lo, hi); NGA_Get(B, lo, hi, bbuf, &ld);
                gets++;
                memset(cbuf, 0, sizeof(double) * b * b);
                gemm(b, abuf, bbuf, cbuf);
                patch(i, j, b, lo, hi); NGA_Acc(C, lo, hi, cbuf, &ld, &alpha);
                accs++;
            }
        }
    }
    GA_Sync();
    double seconds = MPI_Wtime() - t0, tmax;
    long sums[2] = {gets, accs}, tot[2];
    MPI_Allreduce(&seconds, &tmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(sums, tot, 2, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    if (me == 0) {
        double err = 0.0, *row = malloc(sizeof(double) * n);
        for (int s = 0; s < 16; s++) {
            int r = (int)((long)s * (n - 1) / 15);
            int rlo[2] = {r, 0}, rhi[2] = {r, n - 1}, ldr = n;
            NGA_Get(C, rlo, rhi, row, &ldr);
            for (int c = 0; c < n; c++) {
                double want = 0.0;
                for (int k = 0; k < n; k++) want += a_of(r, k) * b_of(k, c);
                err = fmax(err, fabs(row[c] - want));
            }
        }
        printf("{\"kernel\": \"ga-%s\", \"n\": %d, \"block\": %d, \"ranks\": %d, \"seconds\": %.6f, "
               "\"gets\": %ld, \"accs\": %ld, \"bytes_per_rank\": %.1f, \"max_error\": %.3e}\n",
               argv[1], n, b, np, tmax, tot[0], tot[1], (double)(tot[0] + tot[1]) * b * b * 8 / np, err);
        free(row);
    }
    free(abuf); free(bbuf); free(cbuf);
    GA_Destroy(A); GA_Destroy(B); GA_Destroy(C); GA_Destroy(cnt);
    GA_Terminate();
    MPI_Finalize();
    return 0;
}
