/* bench_attention.c — the blocked F16 attention (kernels/cpu/attn_tiled.c) at every SIMD level
 * against the scalar level, on the shapes the engine gives it: a 512-token prefill chunk at the
 * end of a 2,048-token document (query tiles of 32 tokens, as the CPU backend cuts them), and
 * decode (one token) at 2,048 positions; SmolLM2-135M's heads (3 KV heads of 64, 3 query heads
 * each) and Gemma 3 270M's (1 KV head of 256, 4 query heads; a 512-position sliding window).
 * One thread, process CPU time (the machine is shared). GFLOP/s counts 4 * hd per (query row,
 * key) visited (QK^T and PV).
 *
 *   cmake --build build --target bench_attention && build/bench_attention [seconds_per_case] [case]
 *
 * case: "prefill" or "decode" only (default both). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/dtype.h"
#include "kernels/cpu/cpu_ops.h"

#define CTX 2048
#define BT 16
#define TILE 32

static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef struct {
    const char *name;
    int n_kv, G, hd, window;
} shape;

/* Seconds per call of the case: query tokens [p0, p0 + nq) of every KV head, in tiles. */
static double run_case(const shape *s, int p0, int nq, double budget, double *flop) {
    size_t stride = (size_t)s->n_kv * s->hd, qd = stride * s->G;
    uint16_t *k = malloc((size_t)CTX * stride * 2), *v = malloc((size_t)CTX * stride * 2);
    float *q = malloc((size_t)nq * qd * sizeof(float)),
          *out = malloc((size_t)nq * qd * sizeof(float));
    float *scratch = malloc(cpu_attention_tiled_scratch(s->hd, TILE * s->G) * sizeof(float));
    int32_t table[CTX / BT], pos[CTX];
    if (!k || !v || !q || !out || !scratch) {
        fprintf(stderr, "bench_attention: out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < (size_t)CTX * stride; i++) {
        k[i] = md_fp32_to_fp16((float)((i * 2654435761u) % 2001) / 1000.0f - 1.0f);
        v[i] = md_fp32_to_fp16((float)((i * 40503u) % 2001) / 1000.0f - 1.0f);
    }
    for (size_t i = 0; i < (size_t)nq * qd; i++)
        q[i] = (float)((i * 2246822519u) % 2001) / 1000.0f - 1.0f;
    for (int i = 0; i < CTX / BT; i++)
        table[i] = (i * 37) % (CTX / BT);
    for (int i = 0; i < nq; i++)
        pos[i] = p0 + i;
    *flop = 0;
    for (int i = 0; i < nq; i++) {
        int lo = s->window > 0 && pos[i] + 1 > s->window ? pos[i] + 1 - s->window : 0;
        *flop += 4.0 * s->hd * (pos[i] + 1 - lo) * s->G * s->n_kv;
    }
    int reps = 0;
    double t0 = cpu_s(), t;
    do {
        for (int h = 0; h < s->n_kv; h++)
            for (int i0 = 0; i0 < nq; i0 += TILE) {
                int nt = nq - i0 < TILE ? nq - i0 : TILE;
                size_t off = (size_t)i0 * qd + (size_t)h * s->G * s->hd;
                cpu_attention_tiled_f16(out + off, qd, q + off, qd, nt, pos + i0, s->G,
                                        k + (size_t)h * s->hd, v + (size_t)h * s->hd, stride, table,
                                        BT, s->window, s->hd, 0.125f, scratch);
            }
        reps++;
        t = cpu_s() - t0;
    } while (t < budget);
    free(k);
    free(v);
    free(q);
    free(out);
    free(scratch);
    return t / reps;
}

int main(int argc, char **argv) {
    double budget = argc > 1 ? atof(argv[1]) : 0.5;
    const char *only = argc > 2 ? argv[2] : "";
    static const shape shapes[] = {
        {"smollm2", 3, 3, 64, 0}, {"gemma3-swa", 1, 4, 256, 512}, {"gemma3-global", 1, 4, 256, 0}};
    static const char *lvname[] = {"scalar", "avx2", "avx512"};
    int best = cpu_simd_detect();
    printf("# bench_attention: blocked F16 attention, 1 thread, CPU time, context %d\n", CTX);
    printf("%-14s %-22s %-7s %10s %9s %8s\n", "heads", "case", "level", "ms/call", "GFLOP/s",
           "x scalar");
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++)
        for (int c = 0; c < 2; c++) {
            if ((!strcmp(only, "prefill") && c == 1) || (!strcmp(only, "decode") && c == 0))
                continue;
            int nq = c == 0 ? 512 : 1, p0 = CTX - nq;
            double base = 0;
            for (int lv = CPU_SIMD_SCALAR; lv <= best; lv++) {
                if (cpu_simd_set(lv))
                    continue;
                double flop, sec = run_case(&shapes[si], p0, nq, budget, &flop);
                if (lv == CPU_SIMD_SCALAR)
                    base = sec;
                printf("%-14s %-22s %-7s %10.3f %9.2f %7.2fx\n", shapes[si].name,
                       c == 0 ? "prefill 512 @ 1536" : "decode 1 @ 2047", lvname[lv], sec * 1e3,
                       flop / sec * 1e-9, base / sec);
                fflush(stdout);
            }
        }
    return 0;
}
