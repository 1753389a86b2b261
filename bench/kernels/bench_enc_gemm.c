/* bench_enc_gemm.c — the packed products of encoder steps (kernels/cpu/enc_gemm.c) against
 * cpu_matmul (matmul.c's dot-product tiles) on all-MiniLM-L6-v2's shapes, F32 weights:
 * GFLOP/s (2·N·K·T per product) per CPU second of the process (the machine is shared: CPU
 * time measures the kernel, not the neighbours), for cpu_matmul + bias, cpu_lin F32 and
 * cpu_lin BF16 (where the CPU has AVX512-BF16).
 *
 *     cmake --build build --target bench_enc_gemm && build/bench_enc_gemm [threads] [T]
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "kernels/cpu/cpu_ops.h"

static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    int nth = argc > 1 ? atoi(argv[1]) : 1, T = argc > 2 ? atoi(argv[2]) : 512;
    cpu_pool *p = cpu_pool_create(nth);
    const int shapes[][2] = {{384, 384}, {1536, 384}, {384, 1536}}; /* N, K */
    printf("# T = %d tokens, %d thread(s), level %s; GFLOP/s per CPU second\n", T, nth,
           cpu_simd_name());
    printf("%-10s %10s %10s %10s %8s %8s\n", "N x K", "matmul", "lin f32", "lin bf16", "f32 x",
           "bf16 x");
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int N = shapes[s][0], K = shapes[s][1];
        float *W = malloc(sizeof(float) * N * K), *x = malloc(sizeof(float) * T * K);
        float *y = malloc(sizeof(float) * T * N), *b = calloc(N, sizeof(float));
        for (int i = 0; i < N * K; i++)
            W[i] = (float)((i * 7919) % 1000) / 1000.0f - 0.5f;
        for (int i = 0; i < T * K; i++)
            x[i] = (float)((i * 104729) % 1000) / 1000.0f - 0.5f;
        void *scratch = malloc(cpu_lin_scratch_size(K, nth));
        double g[3] = {0, 0, 0}, flop = 2.0 * N * K * T;
        for (int v = 0; v < 3; v++) {
            cpu_lin *l = v ? cpu_lin_pack(MD_TYPE_F32, W, N, K, v == 2) : NULL;
            if (v && !l)
                continue;
            int reps = 0;
            double t0 = cpu_s(), t;
            do {
                if (v)
                    cpu_lin_run(p, l, b, x, T, y, CPU_LIN_SET, scratch);
                else {
                    cpu_matmul(p, MD_TYPE_F32, W, N, K, x, T, y, NULL);
                    for (int r = 0; r < T; r++)
                        cpu_add(y + (size_t)r * N, y + (size_t)r * N, b, N);
                }
                reps++;
            } while ((t = cpu_s() - t0) < 0.5);
            g[v] = flop * reps / t / 1e9;
            cpu_lin_free(l);
        }
        printf("%4d x %-4d %10.1f %10.1f %10.1f %7.2fx %7.2fx\n", N, K, g[0], g[1], g[2],
               g[1] / g[0], g[2] / g[0]);
        free(W), free(x), free(y), free(b), free(scratch);
    }
    cpu_pool_destroy(p);
    return 0;
}
