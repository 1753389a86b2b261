/* bench_matmul.c — cpu_matmul throughput per weight type and batch size n, for each SIMD
 * level against the scalar level, measured in the same run.
 *
 *   build-x/bench_kernels [threads] [rows cols] [seconds_per_case]
 *
 * Prints one line per (type, n): GFLOP/s (2·rows·cols·n per product) of the scalar level and
 * of every SIMD level the CPU has, and each level's ratio to scalar. Default shape is
 * SmolLM2-135M's FFN up-projection (1536 × 576). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/bench_weights.h"
#include "common/dtype.h"
#include "kernels/cpu/cpu_ops.h"

/* With one thread, CPU time of the process: the machine this runs on is shared, and CPU
 * time measures the kernel rather than the neighbours. With more threads, wall time. */
static clockid_t g_clock = CLOCK_MONOTONIC;
static double now_s(void) {
    struct timespec ts;
    clock_gettime(g_clock, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t rs = 88172645463325252ull;
static uint32_t rnd(void) {
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (uint32_t)(rs >> 11);
}

/* Random weights with small, valid half scales at every 16-bit field a block type uses. */
static void *make_weights(int t, int rows, int cols) {
    size_t n = md_type_row_bytes(t, cols) * (size_t)rows;
    uint8_t *w = malloc(n);
    if (w)
        bench_random_weights(t, w, n, rnd);
    return w;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 1;
    int rows = argc > 3 ? atoi(argv[2]) : 1536, cols = argc > 3 ? atoi(argv[3]) : 576;
    double secs = argc > 4 ? atof(argv[4]) : 0.3;
    static const int types[] = {MD_TYPE_Q4_1, MD_TYPE_Q8_0, MD_TYPE_Q4_0,
                                MD_TYPE_Q5_0, MD_TYPE_Q4_K, MD_TYPE_Q6_K,
                                MD_TYPE_F16,  MD_TYPE_BF16, MD_TYPE_F32};
    static const int ns[] = {1, 4, 16, 64, 256};
    if (threads == 1)
        g_clock = CLOCK_PROCESS_CPUTIME_ID;
    const char *only = getenv("BENCH_TYPE"); /* e.g. BENCH_TYPE=Q4_1 */
    cpu_pool *pool = cpu_pool_create(threads);
    if (!pool) {
        fprintf(stderr, "bench_kernels: cannot start %d threads\n", threads);
        return 1;
    }
    int best = cpu_simd_detect();
    printf("# cpu_matmul %d x %d, %d thread(s), best SIMD level %d; GFLOP/s per %s second\n", rows,
           cols, threads, best, threads == 1 ? "CPU" : "wall");
    printf("%-6s %5s %10s %10s %8s %10s %8s\n", "type", "n", "scalar", "avx2", "ratio",
           "avx512vnni", "ratio");
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        int t = types[ti];
        if (cpu_matmul_check(t, cols) != 0)
            continue;
        const char *name = md_type_name(t);
        if (only && strcmp(only, name) != 0)
            continue;
        void *W = make_weights(t, rows, cols);
        for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
            int n = ns[ni];
            float *x = malloc(sizeof(float) * (size_t)n * cols);
            float *y = malloc(sizeof(float) * (size_t)n * rows);
            size_t ss = cpu_matmul_scratch_size(t, cols, n);
            void *scratch = ss ? aligned_alloc(64, (ss + 63) / 64 * 64) : NULL;
            for (int i = 0; i < n * cols; i++)
                x[i] = (float)(rnd() % 2001) / 1000.0f - 1.0f;
            double gf[3] = {0, 0, 0};
            for (int lvl = 0; lvl <= best; lvl++) {
                cpu_simd_set(lvl);
                /* the scalar level is slow: give it fewer reps, same time budget */
                cpu_matmul(pool, t, W, rows, cols, x, n, y, scratch);
                int reps = 0;
                double t0 = now_s(), el;
                do {
                    cpu_matmul(pool, t, W, rows, cols, x, n, y, scratch);
                    reps++;
                    el = now_s() - t0;
                } while (el < (lvl == 0 ? secs / 3 : secs));
                gf[lvl] = 2.0 * rows * cols * (double)n * reps / el / 1e9;
            }
            printf("%-6s %5d %10.2f %10.2f %7.1fx", name, n, gf[0], gf[1], gf[1] / gf[0]);
            if (best >= 2)
                printf(" %10.2f %7.1fx", gf[2], gf[2] / gf[0]);
            printf("\n");
            fflush(stdout);
            free(x);
            free(y);
            free(scratch);
        }
        free(W);
    }
    cpu_simd_set(best);
    cpu_pool_destroy(pool);
    return 0;
}
