/* bench_dequant.c — medley's scalar dequantization (engine/weights/quant.c) against llama.cpp's
 * (dequantize_row_* in libggml-base, loaded with dlopen), on the same blocks, in the same
 * run. Prints elements/s for both, the ratio, and the largest difference in the outputs
 * (a second, independent check of the formats). See run.sh for how to build and run it.
 *
 *   bench_dequant LIBGGML_BASE_SO [MODEL.gguf]
 *
 * Blocks: F16/BF16/Q8_0/Q4_0/Q4_1 quantized from random normals by medley's quantizer;
 * Q4_K/Q6_K random bytes with small finite fp16 scales; with a model, its largest Q4_1 and
 * Q8_0 tensors as well. */
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "engine/weights/gguf.h"
#include "engine/weights/quant.h"

typedef void (*row_fn)(const void *src, float *dst, int64_t n);

#define N_EL (1 << 22) /* 4M elements per synthetic type: larger than the caches */
#define REPS 7

static uint64_t rs = 88172645463325252ULL;
static uint64_t xr(void) {
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return rs;
}
static float normal(void) {
    double u = ((double)(xr() >> 11) + 1) / 9007199254740993.0,
           v = (double)(xr() >> 11) / 9007199254740992.0;
    return (float)(sqrt(-2 * log(u)) * cos(6.283185307179586 * v)) * 0.05f;
}

/* Best of REPS, seconds. */
static double time_ours(int type, const void *src, float *dst, int64_t n) {
    double best = 1e9;
    md_err e;
    for (int r = 0; r < REPS; r++) {
        uint64_t t0 = md_mono_ns();
        if (md_dequantize(type, src, dst, n, &e)) {
            fprintf(stderr, "%s\n", e.msg);
            exit(1);
        }
        double s = (double)(md_mono_ns() - t0) / 1e9;
        best = s < best ? s : best;
    }
    return best;
}

static double time_peer(row_fn fn, const void *src, float *dst, int64_t n) {
    double best = 1e9;
    for (int r = 0; r < REPS; r++) {
        uint64_t t0 = md_mono_ns();
        fn(src, dst, n);
        double s = (double)(md_mono_ns() - t0) / 1e9;
        best = s < best ? s : best;
    }
    return best;
}

static void run(const char *label, int type, row_fn peer, const void *src, int64_t n) {
    float *a = malloc((size_t)n * 4), *b = malloc((size_t)n * 4);
    double to = time_ours(type, src, a, n), tp = time_peer(peer, src, b, n);
    double maxdiff = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (d > maxdiff || isnan(a[i]) != isnan(b[i]))
            maxdiff = isnan(d) ? INFINITY : d;
    }
    printf("%-24s %-5s %10lld %12.0f %12.0f %8.2f %12.3g\n", label, md_type_name(type),
           (long long)n, n / to / 1e6, n / tp / 1e6, tp / to, maxdiff);
    free(a);
    free(b);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: bench_dequant LIBGGML_BASE_SO [MODEL.gguf]\n");
        return 2;
    }
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "dlopen %s: %s\n", argv[1], dlerror());
        return 1;
    }
    struct {
        int type;
        const char *sym;
    } types[] = {{MD_TYPE_F16, "ggml_fp16_to_fp32_row"}, {MD_TYPE_BF16, "ggml_bf16_to_fp32_row"},
                 {MD_TYPE_Q8_0, "dequantize_row_q8_0"},  {MD_TYPE_Q4_0, "dequantize_row_q4_0"},
                 {MD_TYPE_Q4_1, "dequantize_row_q4_1"},  {MD_TYPE_Q4_K, "dequantize_row_q4_K"},
                 {MD_TYPE_Q6_K, "dequantize_row_q6_K"}};
    printf("%-24s %-5s %10s %12s %12s %8s %12s\n", "blocks", "type", "elements", "medley Me/s",
           "ggml Me/s", "ratio", "max |diff|");
    float *x = malloc((size_t)N_EL * 4);
    for (int64_t i = 0; i < N_EL; i++)
        x[i] = normal();
    uint8_t *q = malloc((size_t)N_EL * 4);
    md_err e;
    row_fn peers[64] = {0};
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        int ty = types[t].type;
        row_fn fn = (row_fn)dlsym(lib, types[t].sym);
        if (!fn) {
            fprintf(stderr, "%s not found in %s\n", types[t].sym, argv[1]);
            return 1;
        }
        peers[ty] = fn;
        if (ty == MD_TYPE_Q4_K || ty == MD_TYPE_Q6_K) {
            size_t bs = md_type_block_bytes(ty), nb = N_EL / 256;
            for (size_t i = 0; i < nb * bs; i++)
                q[i] = (uint8_t)xr();
            for (size_t b = 0; b < nb; b++) { /* finite scales: d (and dmin) in [0, 0.002) */
                uint16_t d = md_fp32_to_fp16((float)(xr() % 1000) * 2e-6f);
                uint16_t m = md_fp32_to_fp16((float)(xr() % 1000) * 2e-6f);
                memcpy(q + b * bs + (ty == MD_TYPE_Q4_K ? 0 : 208), &d, 2);
                if (ty == MD_TYPE_Q4_K)
                    memcpy(q + b * bs + 2, &m, 2);
            }
        } else if (md_quantize(ty, x, q, N_EL, &e)) {
            fprintf(stderr, "%s\n", e.msg);
            return 1;
        }
        run("synthetic", ty, fn, q, N_EL);
    }
    if (argc > 2) {
        gguf_file *f;
        if (gguf_open(argv[2], &f, &e)) {
            fprintf(stderr, "%s\n", e.msg);
            return 1;
        }
        const gguf_tensor *big[64] = {0};
        for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
            const gguf_tensor *t = gguf_tensor_at(f, i);
            if (t->type < 64 && peers[t->type] &&
                (!big[t->type] || t->n_elements > big[t->type]->n_elements))
                big[t->type] = t;
        }
        for (int t = 0; t < 64; t++)
            if (big[t])
                run(big[t]->name, t, peers[t], big[t]->data, big[t]->n_elements);
        gguf_close(f);
    }
    free(x);
    free(q);
    return 0;
}
