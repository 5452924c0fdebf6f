/* Peer measurements for bench/runtime_bench.py: the Global Arrays toolkit itself.
 *
 * Same three measurements as Tessera's runtime benchmark, with GA's C API:
 *   flood   every rank does N NGA_Read_inc on its own element, then N on random remote
 *           elements (one counter element per rank); ops/s local vs remote.
 *   latency rank 0 does NGA_Get / NGA_Acc of n doubles owned by rank 1, n = 4^k from 1
 *           (8 B) to 2^20 (8 MiB); time per op and bandwidth. NGA_Acc returns at local
 *           completion; the loop ends with GA_Fence (remote completion of all).
 *   busy    rank 1 computes for SECONDS without calling MPI/GA; rank 0 waits 0.1 s, then
 *           times one NGA_Get and (in a second busy phase) one NGA_Acc of 1 MiB owned
 *           by rank 1.
 * Rank 0 prints one JSON object per run on stdout.
 *
 * Build: see bench/runtime_bench.py (mpicc.openmpi ... -lga-openmpi -larmci-openmpi),
 * Debian packages libglobalarrays-dev libarmci-mpi-dev libopenmpi-dev.
 * Usage: mpirun -n 2 ga_bench flood|latency|busy [N|SECONDS]
 */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ga.h"
#include "macdecls.h"

static double now(void) { return MPI_Wtime(); }

static double compute_for(double seconds) {
    /* A compute loop that never calls MPI: naive dense matrix products. */
    enum { M = 160 };
    static double a[M * M], b[M * M], c[M * M];
    for (int i = 0; i < M * M; i++) { a[i] = 1.0 / (i + 1); b[i] = 1.0 - a[i]; }
    double t0 = now(), x = 0.0;
    while (now() - t0 < seconds) {
        for (int i = 0; i < M; i++)
            for (int k = 0; k < M; k++) {
                double aik = a[i * M + k];
                for (int j = 0; j < M; j++) c[i * M + j] += aik * b[k * M + j];
            }
        x += c[7];
    }
    return x;
}

static void flood(int me, int np, long n) {
    int dims[1] = {np}, block[1] = {np}, *map = malloc(sizeof(int) * np);
    for (int i = 0; i < np; i++) map[i] = i;
    int g = NGA_Create_irreg(C_LONG, 1, dims, "flood", block, map);
    GA_Zero(g);
    GA_Sync();
    int sub[1] = {me};
    double t0 = now();
    for (long i = 0; i < n; i++) NGA_Read_inc(g, sub, 1);
    double t_local = now() - t0;
    GA_Sync();
    srand(1234 + me);
    t0 = now();
    for (long i = 0; i < n; i++) {
        int peer = np > 1 ? (me + 1 + rand() % (np - 1)) % np : me;
        sub[0] = peer;
        NGA_Read_inc(g, sub, 1);
    }
    double t_remote = now() - t0;
    GA_Sync();
    double tl_max, tr_max;
    MPI_Reduce(&t_local, &tl_max, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    MPI_Reduce(&t_remote, &tr_max, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    long total = 0;
    for (int p = 0; p < np; p++) { sub[0] = p; total += NGA_Read_inc(g, sub, 0); }
    if (me == 0)
        printf("{\"kind\": \"flood\", \"ranks\": %d, \"n\": %ld, \"local_seconds\": %.6f, "
               "\"remote_seconds\": %.6f, \"local_ops_per_s\": %.1f, \"remote_ops_per_s\": %.1f, "
               "\"total\": %ld}\n", np, n, tl_max, tr_max, np * n / tl_max, np * n / tr_max, total);
    GA_Destroy(g);
    free(map);
}

static int make_array(int np, int per_rank) {
    int dims[1] = {np * per_rank}, block[1] = {np}, *map = malloc(sizeof(int) * np);
    for (int i = 0; i < np; i++) map[i] = i * per_rank;
    int g = NGA_Create_irreg(C_DBL, 1, dims, "data", block, map);
    free(map);
    GA_Zero(g);
    return g;
}

static void latency(int me, int np) {
    const int maxn = 1 << 20; /* 8 MiB of doubles */
    int g = make_array(np, maxn);
    double *buf = malloc(sizeof(double) * maxn);
    for (int i = 0; i < maxn; i++) buf[i] = 1.0;
    double alpha = 1.0;
    GA_Sync();
    if (me == 0) printf("{\"kind\": \"latency\", \"ranks\": %d, \"rows\": [", np);
    int first = 1;
    for (long n = 1; n <= maxn; n *= 4) {
        for (int op = 0; op < 2; op++) {
            int lo[1] = {maxn}, hi[1] = {maxn + (int)n - 1}, ld[1] = {1};
            double t = 0.0;
            long reps = 0;
            if (me == 0) {
                /* best of 3 trials of about 0.05 s each (the machine may be shared) */
                long target = 5;
                for (int w = 0; w < 10; w++) /* warm-up */
                    op == 0 ? NGA_Get(g, lo, hi, buf, ld) : NGA_Acc(g, lo, hi, buf, ld, &alpha);
                double t0 = now();
                op == 0 ? NGA_Get(g, lo, hi, buf, ld) : NGA_Acc(g, lo, hi, buf, ld, &alpha);
                double one = now() - t0;
                target = (long)(0.05 / (one > 1e-7 ? one : 1e-7));
                if (target < 5) target = 5;
                if (target > 200000) target = 200000;
                t = 1e30;
                for (int trial = 0; trial < 3; trial++) {
                    if (op == 1) GA_Init_fence();
                    t0 = now();
                    for (reps = 0; reps < target; reps++)
                        op == 0 ? NGA_Get(g, lo, hi, buf, ld) : NGA_Acc(g, lo, hi, buf, ld, &alpha);
                    if (op == 1) GA_Fence(); /* remote completion of the accumulates */
                    double tt = (now() - t0) / reps;
                    if (tt < t) t = tt;
                }
                printf("%s{\"op\": \"%s\", \"bytes\": %ld, \"seconds\": %.9f, \"reps\": %ld}",
                       first ? "" : ", ", op == 0 ? "get" : "acc", n * 8, t, reps);
                first = 0;
            }
            GA_Sync();
        }
    }
    if (me == 0) printf("]}\n");
    free(buf);
    GA_Destroy(g);
}

static void busy(int me, int np, double seconds) {
    const int n = 1 << 17; /* 1 MiB of doubles */
    int g = make_array(np, n);
    double *buf = malloc(sizeof(double) * n), alpha = 1.0, waited[2] = {0, 0}, sink = 0.0;
    for (int i = 0; i < n; i++) buf[i] = 1.0;
    for (int op = 0; op < 2; op++) {
        GA_Sync();
        if (me == 1) {
            sink += compute_for(seconds);
        } else if (me == 0) {
            usleep(100000);
            int lo[1] = {n}, hi[1] = {2 * n - 1}, ld[1] = {1};
            double t0 = now();
            if (op == 0) NGA_Get(g, lo, hi, buf, ld);
            else { GA_Init_fence(); NGA_Acc(g, lo, hi, buf, ld, &alpha); GA_Fence(); }
            waited[op] = now() - t0;
        }
    }
    GA_Sync();
    if (me == 0)
        printf("{\"kind\": \"busy\", \"ranks\": %d, \"compute_seconds\": %.3f, \"bytes\": %d, "
               "\"get_wait\": %.6f, \"acc_wait\": %.6f}\n", np, seconds, n * 8, waited[0],
               waited[1]);
    if (sink == 42.0) printf("#\n");
    free(buf);
    GA_Destroy(g);
}

int main(int argc, char **argv) {
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    GA_Initialize();
    MA_init(C_DBL, 1000000, 1000000);
    int me = GA_Nodeid(), np = GA_Nnodes();
    const char *what = argc > 1 ? argv[1] : "latency";
    if (np < 2) {
        if (me == 0) fprintf(stderr, "ga_bench needs at least 2 ranks\n");
    } else if (!strcmp(what, "flood")) {
        flood(me, np, argc > 2 ? atol(argv[2]) : 100000);
    } else if (!strcmp(what, "latency")) {
        latency(me, np);
    } else if (!strcmp(what, "busy")) {
        busy(me, np, argc > 2 ? atof(argv[2]) : 2.0);
    } else if (me == 0) {
        fprintf(stderr, "unknown measurement %s (flood|latency|busy)\n", what);
    }
    GA_Terminate();
    MPI_Finalize();
    return 0;
}
