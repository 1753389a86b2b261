/* bench_gemv.c — the decode GEMV of every weight type on one GPU: the weight bandwidth it
 * reaches (weight bytes / time, and the fraction of the device's peak HBM bandwidth) and,
 * in the same run, cuBLAS on the same product (BF16 weights: GemmEx directly; quantized
 * weights: GemmEx on a BF16 copy, what `--bf16-weights on` gives), so the figures say where
 * the GEMV path (m <= CUDA_GEMV_MAX_M) stops paying and what the quantized kernels reach.
 *
 * m = 1..8 is the GEMV path; m = 16 and 32 on quantized weights without a copy the int8
 * tiled product on __dp4a (k_mmq), m = 64, 128, 256 the one on the tensor cores (k_mmq_tc),
 * each also timed against expanding the weight at every product (what those steps cost
 * before them); TFLOP/s (2 m n k / time) beside the bandwidth for the larger m.
 *
 *   medley_gemv_bench [--n ROWS] [--k COLS] [--ms M,M,...] [--per-graph P] [--out FILE.json]
 *
 * Shape: Llama-3-8B's gate/up (14336 x 4096) by default. Eight distinct weights are used
 * in turn so the product streams from HBM, not from the 50 MB L2. Each figure is one CUDA
 * graph of 64 products (x quantization included for quantized weights; --per-graph),
 * replayed 5 times, after a warm-up. --ms picks the batch sizes (default 1, 2, 4, ..., 256;
 * the device check's rehearsal on the CPU emulator takes a few at small shapes). Prints one
 * JSON object (and writes it to --out). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/bench_weights.h"
#include "bench/gpu/bench_gpu_util.h"
#include "common/dtype.h"
#include "common/util.h"
#include "kernels/cuda/cuda_ops.h"

#define N_COPIES 8
#define PER_GRAPH 64
#define REPLAYS 5
#define MAX_MS 16

static md_err e;
#define TRY(call) BENCH_TRY("medley_gemv_bench", e, call)

static const int TYPES[] = {MD_TYPE_BF16, MD_TYPE_F16,  MD_TYPE_Q8_0, MD_TYPE_Q4_0,
                            MD_TYPE_Q4_1, MD_TYPE_Q4_K, MD_TYPE_Q6_K};

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static uint32_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}

static int per_graph = PER_GRAPH;

/* Seconds per product: per_graph products in one graph, replayed REPLAYS times. */
static double time_products(cuda_ctx *c, cuda_mm_w *w, const float *x, int m, int k, int force) {
    for (int i = 0; i < N_COPIES; i++) /* warm-up: scratch sized, cuBLAS initialised */
        TRY(cuda_matmul_n(c, &w[i], 1, x, m, k, CUDA_MM_SET, force, &e));
    TRY(cuda_sync(c, &e));
    cuda_graph *g = NULL;
    TRY(cuda_graph_begin(c, &e));
    for (int i = 0; i < per_graph; i++)
        TRY(cuda_matmul_n(c, &w[i % N_COPIES], 1, x, m, k, CUDA_MM_SET, force, &e));
    TRY(cuda_graph_end(c, &g, &e));
    TRY(cuda_graph_launch(c, g, &e));
    TRY(cuda_sync(c, &e));
    uint64_t t0 = md_mono_ns();
    for (int r = 0; r < REPLAYS; r++)
        TRY(cuda_graph_launch(c, g, &e));
    TRY(cuda_sync(c, &e));
    double t = (md_mono_ns() - t0) / 1e9 / (REPLAYS * per_graph);
    cuda_graph_free(g);
    return t;
}

int main(int argc, char **argv) {
    int n = 14336, k = 4096;
    int ms[MAX_MS] = {1, 2, 4, 8, 16, 32, 64, 128, 256}, n_m = 9;
    const char *out = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--n") && i + 1 < argc)
            n = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--k") && i + 1 < argc)
            k = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--per-graph") && i + 1 < argc)
            per_graph = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--ms") && i + 1 < argc) {
            n_m = 0;
            for (char *t = strtok(argv[++i], ","); t; t = strtok(NULL, ",")) {
                int m = atoi(t);
                if (n_m == MAX_MS || m < 1 || m > 256) {
                    fprintf(stderr, "medley_gemv_bench: --ms takes up to %d sizes in 1..256\n",
                            MAX_MS);
                    return 2;
                }
                ms[n_m++] = m;
            }
        } else if (!strcmp(argv[i], "--out") && i + 1 < argc)
            out = argv[++i];
        else {
            fprintf(stderr, "usage: medley_gemv_bench [--n ROWS] [--k COLS] [--ms M,M,...] "
                            "[--per-graph P] [--out FILE]\n");
            return 2;
        }
    }
    if (n < 1 || k < 256 || k % 256 || n_m < 1 || per_graph < 1) {
        fprintf(stderr, "medley_gemv_bench: need n >= 1, k a multiple of 256, at least one "
                        "batch size and per-graph >= 1\n");
        return 2;
    }
    cuda_device_info info;
    cuda_ctx *c;
    int rc = bench_gpu_open("medley_gemv_bench", &info, &c);
    if (rc)
        return rc;
    double peak = info.hbm_gbps > 0 ? info.hbm_gbps : 4800.0;
    int m_max = 1;
    for (int i = 0; i < n_m; i++)
        m_max = ms[i] > m_max ? ms[i] : m_max;
    const int n_t = sizeof TYPES / sizeof TYPES[0];
    float *x, *y[N_COPIES];
    TRY(cuda_pool_alloc(c, (size_t)m_max * k * 4, (void **)&x, &e));
    TRY(cuda_fill_random(c, x, CUDA_F32, (int64_t)m_max * k, 1.0f, 5, &e));
    for (int i = 0; i < N_COPIES; i++)
        TRY(cuda_pool_alloc(c, (size_t)m_max * n * 4, (void **)&y[i], &e));
    static char json[32768];
    size_t jl = 0;
    jl += snprintf(json + jl, sizeof json - jl,
                   "{\"bench\": \"medley_gemv_bench\", \"device\": \"%s\", \"n\": %d, \"k\": %d, "
                   "\"peak_gbps\": %.0f, \"rows\": [",
                   info.name, n, k, peak);
    fprintf(stderr, "%-5s %3s %10s %9s %7s %8s %12s %8s %10s\n", "type", "m", "medley us", "GB/s",
            "of HBM", "TFLOP/s", "cublas us", "med/cb", "expand us");
    for (int ti = 0; ti < n_t; ti++) {
        int gtype = TYPES[ti];
        const char *name = md_type_name(gtype);
        int quant = gtype != MD_TYPE_BF16 && gtype != MD_TYPE_F16;
        size_t rb = cuda_ggml_bytes(gtype, k), bytes = rb * n;
        uint8_t *h = malloc(bytes);
        cuda_mm_w w[N_COPIES], wn[N_COPIES]; /* with the BF16 copy / without */
        void *copies[N_COPIES] = {0};
        /* the same bytes at N_COPIES addresses: L2 cannot hold them */
        bench_random_weights(gtype, h, bytes, rnd);
        for (int i = 0; i < N_COPIES; i++) {
            void *d;
            TRY(cuda_pool_alloc(c, bytes, &d, &e));
            TRY(cuda_upload(c, d, h, bytes, &e));
            w[i] = wn[i] = (cuda_mm_w){d, gtype, rb, n, y[i], NULL};
            if (quant) { /* the BF16 copy cuBLAS multiplies by */
                TRY(cuda_pool_alloc(c, (size_t)n * k * 2, &copies[i], &e));
                TRY(cuda_dequantize(c, gtype, d, copies[i], CUDA_BF16, (int64_t)n * k, &e));
                w[i].bf16 = copies[i];
            }
        }
        free(h);
        TRY(cuda_sync(c, &e));
        for (int mi = 0; mi < n_m; mi++) {
            int m = ms[mi];
            /* medley's own path without a copy (GEMV; k_mmq / k_mmq_tc for quantized m > 8;
             * cuBLAS for 16-bit m > 8), cuBLAS on the BF16 copy, and cuBLAS expanding at
             * each product */
            double tg = time_products(c, wn, x, m, k, 0), tb = time_products(c, w, x, m, k, 1);
            double tx = quant && m > 8 ? time_products(c, wn, x, m, k, 1) : 0.0;
            double gbps = bytes / tg / 1e9, tflops = 2.0 * m * n * k / tg / 1e12;
            fprintf(stderr, "%-5s %3d %10.2f %9.0f %6.1f%% %8.1f %12.2f %8.2f %10.2f\n", name, m,
                    tg * 1e6, gbps, 100 * gbps / peak, tflops, tb * 1e6, tg / tb, tx * 1e6);
            jl += snprintf(json + jl, sizeof json - jl,
                           "%s{\"type\": \"%s\", \"m\": %d, \"weight_bytes\": %zu, "
                           "\"medley_us\": %.3f, \"medley_gbps\": %.1f, \"hbm_fraction\": %.4f, "
                           "\"medley_tflops\": %.2f, \"cublas_us\": %.3f, "
                           "\"medley_over_cublas\": %.3f, \"cublas_expand_us\": %.3f}",
                           ti || mi ? ", " : "", name, m, bytes, tg * 1e6, gbps, gbps / peak,
                           tflops, tb * 1e6, tg / tb, tx * 1e6);
        }
        for (int i = 0; i < N_COPIES; i++) {
            cuda_pool_free(c, (void *)w[i].w);
            if (copies[i])
                cuda_pool_free(c, copies[i]);
        }
    }
    char date[64];
    bench_utc_date(date, sizeof date);
    jl += snprintf(json + jl, sizeof json - jl, "], \"date\": \"%s\"}", date);
    if (bench_emit_json("medley_gemv_bench", json, out))
        return 1;
    cuda_ctx_close(c);
    return 0;
}
