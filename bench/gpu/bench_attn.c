/* bench_attn.c — attention on one GPU over the paged KV cache at Llama-3-8B's shape (32
 * query heads over 8 kv heads, head_dim 128, f16 cache, 16-token blocks, blocks out of
 * order):
 *
 * - prefill: one sequence's whole prompt of L tokens attending causally to itself, on the
 *   tensor cores (k_attn_pf_tc) and on the f32 path (k_attn_pf) in the same run, with the
 *   largest difference between the two (relative to the output's rms); FLOPs 4 * head_dim *
 *   heads * L (L + 1) / 2 (the causal half of Q K^T and P V);
 * - decode: B sequences of L keys each, one query per sequence (k_attn_dec + merge, split
 *   as the backend splits: enough blocks for twice the SMs, at least 64 keys a split), as
 *   bytes of K and V read per second, and its largest difference from one split.
 *
 * The peer on the same shapes is PyTorch's scaled_dot_product_attention
 * (bench/gpu/torch_sdpa.py); run-device-check.sh prints the ratios.
 *
 *   medley_attn_bench [--lens 512,2048,8192] [--decode 256:512,256:2048,1:32768]
 *                     [--out FILE.json]
 *
 * A prefill figure is the best of 5 timed launches after a warm-up; a decode figure the best
 * of 5 rounds of 20 launches. Prints one JSON object (and writes it to --out). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/gpu/bench_gpu_util.h"
#include "common/util.h"
#include "kernels/cuda/cuda_ops.h"

#define NH 32
#define NKV 8
#define HD 128
#define BLOCK 16
#define REPS 5

static md_err e;
#define TRY(call) BENCH_TRY("medley_attn_bench", e, call)

static void free_all(cuda_ctx *c, void *const *p, int n) {
    for (int i = 0; i < n; i++)
        cuda_pool_free(c, p[i]);
}

/* Best seconds of REPS launches of cuda_attn_prefill. */
static double time_prefill(cuda_ctx *c, const cuda_kv_layer *kv, const float *q,
                           const int32_t *tiles, int n_tiles, const int32_t *bt, int max_blocks,
                           float *out) {
    float scale = 1.0f / sqrtf((float)HD);
    TRY(cuda_attn_prefill(c, kv, q, tiles, n_tiles, bt, max_blocks, NH, scale, out, &e));
    TRY(cuda_sync(c, &e));
    double best = 1e30;
    for (int r = 0; r < REPS; r++) {
        uint64_t t0 = md_mono_ns();
        TRY(cuda_attn_prefill(c, kv, q, tiles, n_tiles, bt, max_blocks, NH, scale, out, &e));
        TRY(cuda_sync(c, &e));
        double t = (md_mono_ns() - t0) / 1e9;
        best = t < best ? t : best;
    }
    return best;
}

/* Splits for n decode entries of L keys, as backend_cuda.c's dec_splits. */
static int decode_splits(int n_sm, int n, int L) {
    int bucket = 64;
    while (bucket < L)
        bucket <<= 1;
    int blocks = n * NKV, want = (2 * n_sm + blocks - 1) / blocks, by_len = (bucket + 63) / 64;
    want = want > by_len ? by_len : want;
    want = want > 32 ? 32 : want;
    return want < 1 ? 1 : want;
}

/* Decode attention of B sequences of L keys: appends its JSON object to json. */
static int bench_decode(cuda_ctx *c, const cuda_device_info *info, int B, int L, char *json,
                        size_t cap, int *used) {
    int nb = L / BLOCK, splits = decode_splits(info->n_sm, B, L);
    size_t kvd = (size_t)NKV * HD, qn = (size_t)B * NH * HD, slots = (size_t)B * L;
    float *o1 = malloc(qn * 4), *o2 = malloc(qn * 4);
    int32_t *dec = malloc((size_t)B * 12), *bt = malloc((size_t)B * nb * 4);
    if (!o1 || !o2 || !dec || !bt) {
        fprintf(stderr, "medley_attn_bench: out of host memory at decode %d x %d\n", B, L);
        return 1;
    }
    for (int s = 0; s < B; s++) {
        dec[3 * s] = s, dec[3 * s + 1] = s, dec[3 * s + 2] = L;
        for (int b = 0; b < nb; b++) /* sequence s owns blocks [s nb, (s + 1) nb), shuffled */
            bt[(size_t)s * nb + b] = (int32_t)((size_t)s * nb + (b * 7 + 3) % nb);
    }
    void *dk, *dv, *dq, *dout, *ddec, *dbt, *work1, *workn;
    TRY(cuda_pool_alloc(c, slots * kvd * 2, &dk, &e));
    TRY(cuda_pool_alloc(c, slots * kvd * 2, &dv, &e));
    TRY(cuda_pool_alloc(c, qn * 4, &dq, &e));
    TRY(cuda_pool_alloc(c, qn * 4, &dout, &e));
    TRY(cuda_pool_alloc(c, (size_t)B * 12, &ddec, &e));
    TRY(cuda_pool_alloc(c, (size_t)B * nb * 4, &dbt, &e));
    TRY(cuda_pool_alloc(c, cuda_attn_decode_work_bytes(B, NH, HD, 1), &work1, &e));
    TRY(cuda_pool_alloc(c, cuda_attn_decode_work_bytes(B, NH, HD, splits), &workn, &e));
    TRY(cuda_fill_random(c, dk, CUDA_F16, (int64_t)(slots * kvd), 2.0f, 4, &e));
    TRY(cuda_fill_random(c, dv, CUDA_F16, (int64_t)(slots * kvd), 1.0f, 5, &e));
    TRY(cuda_fill_random(c, dq, CUDA_F32, (int64_t)qn, 1.0f, 6, &e));
    TRY(cuda_upload(c, ddec, dec, (size_t)B * 12, &e));
    TRY(cuda_upload(c, dbt, bt, (size_t)B * nb * 4, &e));
    cuda_kv_layer kv = {dk, dv, CUDA_F16, NKV, HD, BLOCK};
    float scale = 1.0f / sqrtf((float)HD);
    TRY(cuda_attn_decode(c, &kv, dq, ddec, B, dbt, nb, NH, scale, 1, work1, dout, &e));
    TRY(cuda_download(c, o1, dout, qn * 4, &e));
    TRY(cuda_attn_decode(c, &kv, dq, ddec, B, dbt, nb, NH, scale, splits, workn, dout, &e));
    TRY(cuda_download(c, o2, dout, qn * 4, &e));
    TRY(cuda_sync(c, &e));
    double best = 1e30;
    for (int r = 0; r < REPS; r++) {
        uint64_t t0 = md_mono_ns();
        for (int k = 0; k < 20; k++)
            TRY(cuda_attn_decode(c, &kv, dq, ddec, B, dbt, nb, NH, scale, splits, workn, dout,
                                 &e));
        TRY(cuda_sync(c, &e));
        double t = (md_mono_ns() - t0) / 1e9 / 20;
        best = t < best ? t : best;
    }
    double ss = 0, worst = 0;
    for (size_t i = 0; i < qn; i++) {
        ss += (double)o1[i] * o1[i];
        double d = fabs((double)o1[i] - o2[i]);
        worst = d > worst || d != d ? d : worst;
    }
    double rel = worst / sqrt(ss / qn), bytes = 2.0 * slots * kvd * 2;
    fprintf(stderr,
            "decode %d x %d keys: %d split(s), %.1f us, %.0f GB/s of K/V; largest difference "
            "from one split %.2e of rms\n",
            B, L, splits, best * 1e6, bytes / best / 1e9, rel);
    *used += snprintf(json + *used, cap - *used,
                      "%s{\"batch\": %d, \"len\": %d, \"splits\": %d, \"us\": %.2f, "
                      "\"kv_gbps\": %.1f, \"max_diff_rel\": %.3g}",
                      json[*used - 1] == '[' ? "" : ", ", B, L, splits, best * 1e6,
                      bytes / best / 1e9, rel);
    free_all(c, (void *[]){dk, dv, dq, dout, ddec, dbt, work1, workn}, 8);
    free(o1), free(o2), free(dec), free(bt);
    if (!(rel <= 1e-4)) {
        fprintf(stderr, "medley_attn_bench: decode with %d splits differs from one split by %.3g "
                        "of rms\n",
                splits, rel);
        return 1;
    }
    return 0;
}

int main(int argc, char **argv) {
    int lens[8] = {512, 2048, 8192}, n_lens = 3;
    int dec_b[8] = {256, 256, 1}, dec_l[8] = {512, 2048, 32768}, n_dec = 3;
    const char *out_path = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--lens") && i + 1 < argc) {
            n_lens = 0;
            for (char *t = strtok(argv[++i], ","); t && n_lens < 8; t = strtok(NULL, ","))
                lens[n_lens++] = atoi(t);
        } else if (!strcmp(argv[i], "--decode") && i + 1 < argc) {
            n_dec = 0;
            for (char *t = strtok(argv[++i], ","); t && n_dec < 8; t = strtok(NULL, ",")) {
                if (sscanf(t, "%d:%d", &dec_b[n_dec], &dec_l[n_dec]) != 2 || dec_b[n_dec] < 1 ||
                    dec_b[n_dec] > 1024 || dec_l[n_dec] < 16 || dec_l[n_dec] > 131072 ||
                    dec_l[n_dec] % 16) {
                    fprintf(stderr, "medley_attn_bench: --decode takes BATCH:LEN pairs (batch "
                                    "1..1024, length a multiple of 16 in 16..131072)\n");
                    return 2;
                }
                n_dec++;
            }
        } else if (!strcmp(argv[i], "--out") && i + 1 < argc) {
            out_path = argv[++i];
        } else {
            fprintf(stderr, "usage: medley_attn_bench [--lens L,L,...] [--decode B:L,...] "
                            "[--out FILE.json]\n");
            return 2;
        }
    }
    for (int i = 0; i < n_lens; i++)
        if (lens[i] < 16 || lens[i] > 65536 || lens[i] % 16) {
            fprintf(stderr, "medley_attn_bench: lengths must be multiples of 16 in 16..65536\n");
            return 2;
        }
    cuda_device_info info;
    cuda_ctx *c;
    int rc = bench_gpu_open("medley_attn_bench", &info, &c);
    if (rc)
        return rc;
    char json[8192], date[32];
    bench_utc_date(date, sizeof date);
    int used = snprintf(json, sizeof json,
                        "{\"bench\": \"attn_prefill\", \"date\": \"%s\", \"device\": \"%s\", "
                        "\"heads\": %d, \"kv_heads\": %d, \"head_dim\": %d, \"cache\": \"f16\", "
                        "\"results\": [",
                        date, info.name, NH, NKV, HD);
    for (int li = 0; li < n_lens; li++) {
        int L = lens[li], n_tiles = L / CUDA_ATTN_TILE_Q, nb = L / BLOCK;
        size_t kvd = (size_t)NKV * HD, qn = (size_t)L * NH * HD;
        float *o1 = malloc(qn * 4), *o2 = malloc(qn * 4);
        int32_t *tiles = malloc((size_t)n_tiles * 16), *bt = malloc((size_t)nb * 4);
        if (!o1 || !o2 || !tiles || !bt) {
            fprintf(stderr, "medley_attn_bench: out of host memory at L=%d\n", L);
            return 1;
        }
        for (int t = 0; t < n_tiles; t++) {
            int32_t tl[4] = {0, t * CUDA_ATTN_TILE_Q, CUDA_ATTN_TILE_Q, t * CUDA_ATTN_TILE_Q};
            memcpy(tiles + 4 * t, tl, sizeof tl);
        }
        for (int b = 0; b < nb; b++)
            bt[b] = (int32_t)((b * 7 + 3) % nb); /* blocks out of order, as a real cache */
        void *dk, *dv, *dq, *dout, *dtiles, *dbt;
        TRY(cuda_pool_alloc(c, (size_t)L * kvd * 2, &dk, &e));
        TRY(cuda_pool_alloc(c, (size_t)L * kvd * 2, &dv, &e));
        TRY(cuda_pool_alloc(c, qn * 4, &dq, &e));
        TRY(cuda_pool_alloc(c, qn * 4, &dout, &e));
        TRY(cuda_pool_alloc(c, (size_t)n_tiles * 16, &dtiles, &e));
        TRY(cuda_pool_alloc(c, (size_t)nb * 4, &dbt, &e));
        TRY(cuda_fill_random(c, dk, CUDA_F16, (int64_t)L * kvd, 2.0f, 1, &e));
        TRY(cuda_fill_random(c, dv, CUDA_F16, (int64_t)L * kvd, 1.0f, 2, &e));
        TRY(cuda_fill_random(c, dq, CUDA_F32, (int64_t)qn, 1.0f, 3, &e));
        TRY(cuda_upload(c, dtiles, tiles, (size_t)n_tiles * 16, &e));
        TRY(cuda_upload(c, dbt, bt, (size_t)nb * 4, &e));
        cuda_kv_layer kv = {dk, dv, CUDA_F16, NKV, HD, BLOCK};
        cuda_ctx_set_attn_tc(c, 1);
        double t_tc = time_prefill(c, &kv, dq, dtiles, n_tiles, dbt, nb, dout);
        TRY(cuda_download(c, o1, dout, qn * 4, &e));
        cuda_ctx_set_attn_tc(c, 0);
        double t_f32 = time_prefill(c, &kv, dq, dtiles, n_tiles, dbt, nb, dout);
        TRY(cuda_download(c, o2, dout, qn * 4, &e));
        TRY(cuda_sync(c, &e));
        double ss = 0, worst = 0;
        for (size_t i = 0; i < qn; i++) {
            ss += (double)o2[i] * o2[i];
            double d = fabs((double)o1[i] - o2[i]);
            worst = d > worst || d != d ? d : worst;
        }
        double rel = worst / sqrt(ss / qn);
        double flops = 4.0 * HD * NH * (double)L * (L + 1) / 2;
        fprintf(stderr,
                "L=%5d: tensor cores %.3f ms (%.1f TFLOP/s), f32 %.3f ms (%.1f TFLOP/s), %.1fx; "
                "largest difference %.2e of rms\n",
                L, t_tc * 1e3, flops / t_tc / 1e12, t_f32 * 1e3, flops / t_f32 / 1e12, t_f32 / t_tc,
                rel);
        used += snprintf(json + used, sizeof json - used,
                         "%s{\"len\": %d, \"tc_ms\": %.4f, \"f32_ms\": %.4f, \"tc_tflops\": %.2f, "
                         "\"f32_tflops\": %.2f, \"tc_over_f32\": %.2f, \"max_diff_rel\": %.3g}",
                         li ? ", " : "", L, t_tc * 1e3, t_f32 * 1e3, flops / t_tc / 1e12,
                         flops / t_f32 / 1e12, t_f32 / t_tc, rel);
        free_all(c, (void *[]){dk, dv, dq, dout, dtiles, dbt}, 6);
        free(o1), free(o2), free(tiles), free(bt);
        if (!(rel <= 4e-3)) {
            fprintf(stderr, "medley_attn_bench: the two paths differ by %.3g of rms at L=%d\n", rel,
                    L);
            return 1;
        }
    }
    used += snprintf(json + used, sizeof json - used, "], \"decode\": [");
    for (int i = 0; i < n_dec; i++)
        if ((rc = bench_decode(c, &info, dec_b[i], dec_l[i], json, sizeof json, &used)))
            return rc;
    snprintf(json + used, sizeof json - used, "]}");
    cuda_ctx_close(c);
    return bench_emit_json("medley_attn_bench", json, out_path);
}
