/* test_cuda_kernels.c — each CUDA kernel against a reference computed on the host:
 * dequantization against the gguf Python package's output (tests/fixtures/gguf), GEMV and
 * cuBLAS GEMM paths for every weight type against a double-precision product of the
 * reference-dequantized weights, the fused cuda_matmul_n against the unfused launches, products
 * on a quantized weight's BF16 copy against expanding it, the fused rope_kv against rope +
 * rope + kv_write, sampling
 * against exact host arithmetic, CUDA graph replay against direct launches, the memory pool, and
 * the sticky device error.
 *
 * Needs a CUDA device: without one it prints why and exits 77 (ctest SKIP). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dtype.h"
#include "common/util.h"
#include "engine/weights/gguf.h"
#include "engine/weights/quant.h"
#include "engine/sampler.h"
#include "gpu/gpu_test_util.h"
#include "kernels/cuda/cuda_ops.h"

static cuda_ctx *C;

static void *dev(size_t n) {
    void *p = NULL;
    md_err e = {0};
    if (cuda_pool_alloc(C, n, &p, &e))
        fail_msg("%s", e.msg);
    return p;
}
static void put(void *d, const void *h, size_t n) {
    md_err e = {0};
    if (cuda_upload(C, d, h, n, &e))
        fail_msg("%s", e.msg);
}
static void get(void *h, const void *d, size_t n) {
    md_err e = {0};
    if (cuda_download(C, h, d, n, &e))
        fail_msg("%s", e.msg);
}

typedef struct {
    int type;
    uint32_t n;
    const uint8_t *raw;
    const float *ref;
    char *buf;
} fixture;

/* Same file format as test_gguf_dequant.c: "MDQF", type, n, has_src, [src], raw, ref. */
static void load_fixture(const char *name, fixture *fx) {
    char path[1024];
    snprintf(path, sizeof path, "%s/gguf/dequant_%s.bin", gpu_fixtures_dir(), name);
    size_t len;
    md_err e = {0};
    if (md_read_file(path, 0, &fx->buf, &len, &e))
        fail_msg("%s", e.msg);
    uint32_t hdr[3];
    memcpy(hdr, fx->buf + 4, 12);
    fx->type = (int)hdr[0];
    fx->n = hdr[1];
    size_t off = 16 + (hdr[2] ? (size_t)fx->n * 4 : 0);
    fx->raw = (const uint8_t *)fx->buf + off;
    off += md_type_row_bytes(fx->type, fx->n);
    fx->ref = (const float *)(fx->buf + off);
    assert_int_equal(off + (size_t)fx->n * 4, len);
}

static const char *TYPES[] = {"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q6_K"};

/* Dequantize to f32 on the device: equal to the gguf package within float rounding (a few
 * ulps: the device may fuse a multiply-add the reference rounds twice). To bf16: within
 * bf16 rounding of the reference. */
static void test_dequant_matches_gguf_package(void **state) {
    for (size_t t = 0; t < sizeof TYPES / sizeof TYPES[0]; t++) {
        fixture fx;
        load_fixture(TYPES[t], &fx);
        size_t rb = md_type_row_bytes(fx.type, fx.n);
        assert_int_equal(cuda_ggml_bytes(fx.type, fx.n), rb);
        void *src = dev(rb);
        float *d32 = dev(fx.n * 4);
        uint16_t *d16 = dev(fx.n * 2);
        put(src, fx.raw, rb);
        CHK(cuda_dequantize(C, fx.type, src, d32, CUDA_F32, fx.n, E));
        CHK(cuda_dequantize(C, fx.type, src, d16, CUDA_BF16, fx.n, E));
        float *y = malloc(fx.n * 4);
        uint16_t *yb = malloc(fx.n * 2);
        get(y, d32, fx.n * 4);
        get(yb, d16, fx.n * 2);
        for (uint32_t i = 0; i < fx.n; i++) {
            float want = fx.ref[i];
            if (!(fabsf(y[i] - want) <= 1e-6f * fabsf(want) + 1e-12f))
                fail_msg("%s element %u: device %.9g, gguf package %.9g", TYPES[t], i, y[i], want);
            float b = md_bf16_to_fp32(yb[i]);
            if (!(fabsf(b - want) <= 4e-3f * fabsf(want) + 1e-30f))
                fail_msg("%s element %u as bf16: %.9g vs %.9g", TYPES[t], i, b, want);
        }
        printf("dequant %-5s %u elements: f32 and bf16 match the gguf package\n", TYPES[t], fx.n);
        cuda_pool_free(C, src);
        cuda_pool_free(C, d32);
        cuda_pool_free(C, d16);
        free(y);
        free(yb);
        free(fx.buf);
    }
}

static uint64_t rng = 88172645463325252ull;
static float frand(void) { /* uniform in [-1, 1) */
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

/* x as the GEMV of quantized weights sees it (gemm.cu's k_quant_x, the CPU backend's
 * activation quantization): per block of 32, d = amax / 127, q = rint(x * 127 / amax),
 * x' = q d. */
static void x_seen_q8(const float *x, int n, float *xs) {
    for (int b = 0; b < n / 32; b++) {
        const float *xb = x + 32 * b;
        float amax = 0.0f;
        for (int i = 0; i < 32; i++)
            amax = fmaxf(amax, fabsf(xb[i]));
        float id = amax > 0 ? 127.0f / amax : 0.0f, d = amax / 127.0f;
        for (int i = 0; i < 32; i++)
            xs[32 * b + i] = (float)lrintf(xb[i] * id) * d;
    }
}

/* y = x . W^T for weights of every type, through the GEMV kernels (m <= 8), the int8 tiled
 * product (quantized weights, 8 < m <= 32) and cuBLAS (above, F16/BF16/F32, or forced). Reference:
 * double-precision product of the host-dequantized weights with x, or on the GEMV and tiled paths
 * of a quantized weight with x quantized to int8 as the kernels quantize it (so the check sees the
 * kernel's arithmetic, not the quantization's error). Tolerance, relative to rms(y): 1e-4 for the
 * GEMV path (the same products summed in another order); 2e-2 for cuBLAS, whose inputs are rounded
 * to bf16/f16 (8 significant bits: ~2^-9 per product, growing as sqrt(k) like y itself). */
static void test_matmul_every_type_and_path(void **state) {
    const int types[] = {MD_TYPE_F32,  MD_TYPE_F16,  MD_TYPE_BF16, MD_TYPE_Q4_0,
                         MD_TYPE_Q4_1, MD_TYPE_Q8_0, MD_TYPE_Q4_K, MD_TYPE_Q6_K};
    const int n = 72, k = 512, ms[] = {1, 3, 8, 9, 40, 100, 300};
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        int type = types[ti];
        float *wf = malloc((size_t)n * k * 4), *wd = malloc((size_t)n * k * 4);
        size_t rb = md_type_row_bytes(type, k);
        uint8_t *wq = malloc(rb * n);
        md_err e = {0};
        for (int i = 0; i < n * k; i++)
            wf[i] = frand();
        if (type == MD_TYPE_Q4_K || type == MD_TYPE_Q6_K) {
            /* No quantizer for K types here: random blocks with a sane scale are valid data. */
            for (size_t i = 0; i < rb * n; i++)
                wq[i] = (uint8_t)(frand() * 127 + 128);
            size_t bb = type == MD_TYPE_Q4_K ? 144 : 210;
            for (size_t b = 0; b < rb * n / bb; b++) {
                uint16_t d = md_fp32_to_fp16(0.01f + 0.001f * (float)(b % 7));
                uint8_t *p = wq + b * bb + (type == MD_TYPE_Q4_K ? 0 : 208);
                memcpy(p, &d, 2);
                if (type == MD_TYPE_Q4_K)
                    memcpy(p + 2, &d, 2);
            }
        } else if (md_quantize(type, wf, wq, (int64_t)n * k, &e)) {
            fail_msg("%s", e.msg);
        }
        if (md_dequantize(type, wq, wd, (int64_t)n * k, &e))
            fail_msg("%s", e.msg);
        void *dw = dev(rb * n);
        put(dw, wq, rb * n);
        for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++) {
            int m = ms[mi];
            float *x = malloc((size_t)m * k * 4), *y = malloc((size_t)m * n * 4);
            float *xs = malloc((size_t)m * k * 4);
            double *ref = malloc((size_t)m * n * sizeof(double)), ss = 0;
            for (int i = 0; i < m * k; i++)
                x[i] = frand();
            x_seen_q8(x, m * k, xs);
            float *dx = dev((size_t)m * k * 4), *dy = dev((size_t)m * n * 4);
            put(dx, x, (size_t)m * k * 4);
            for (int force = 0; force < 2; force++) {
                if (force && m > CUDA_GEMV_MAX_M)
                    continue;
                int gemv = m <= CUDA_GEMV_MAX_M && !force;
                int quant = type != MD_TYPE_F32 && type != MD_TYPE_F16 && type != MD_TYPE_BF16;
                int mmq = quant && !gemv && !force && m <= CUDA_MMQ_MAX_M; /* int8 tiled */
                const char *path = gemv  ? "gemv"
                                   : mmq ? (m > CUDA_MMQ_DP4A_MAX_M ? "mmq-tc" : "mmq")
                                         : "cublas";
                const float *xr = (gemv || mmq) && quant ? xs : x;
                ss = 0;
                for (int r = 0; r < m; r++)
                    for (int j = 0; j < n; j++) {
                        double s = 0;
                        for (int i = 0; i < k; i++)
                            s += (double)xr[r * k + i] * wd[(size_t)j * k + i];
                        ref[r * n + j] = s;
                        ss += s * s;
                    }
                double rms = sqrt(ss / (m * n));
                CHK(cuda_matmul(C, dw, type, rb, dx, dy, m, n, k, 0.0f, force, E));
                get(y, dy, (size_t)m * n * 4);
                double tol = (gemv || mmq || type == MD_TYPE_F32 ? 1e-4 : 2e-2) * rms, worst = 0;
                for (int i = 0; i < m * n; i++) {
                    double err = fabs(y[i] - ref[i]);
                    if (!(err <= tol))
                        fail_msg("%s m=%d %s: y[%d] = %.6g, reference %.6g (tolerance %.3g)",
                                 md_type_name(type), m, path, i, y[i], ref[i], tol);
                    if (err > worst)
                        worst = err;
                }
                printf("matmul %-5s m=%-3d %-6s max error %.2e of rms %.2e\n", md_type_name(type),
                       m, path, worst, rms);
            }
            cuda_pool_free(C, dx);
            cuda_pool_free(C, dy);
            free(x);
            free(xs);
            free(y);
            free(ref);
        }
        cuda_pool_free(C, dw);
        free(wf);
        free(wd);
        free(wq);
    }
}

/* Random weights of a type, uploaded: n rows of k. */
static void *random_weight(int type, int n, int k) {
    size_t rb = md_type_row_bytes(type, k);
    float *wf = malloc((size_t)n * k * 4);
    uint8_t *wq = malloc(rb * n);
    md_err e = {0};
    for (int i = 0; i < n * k; i++)
        wf[i] = frand();
    if (type == MD_TYPE_Q4_K || type == MD_TYPE_Q6_K) { /* random blocks with a sane scale */
        for (size_t i = 0; i < rb * n; i++)
            wq[i] = (uint8_t)(frand() * 127 + 128);
        size_t bb = type == MD_TYPE_Q4_K ? 144 : 210;
        for (size_t b = 0; b < rb * n / bb; b++) {
            uint16_t d = md_fp32_to_fp16(0.01f + 0.001f * (float)(b % 7));
            uint8_t *p = wq + b * bb + (type == MD_TYPE_Q4_K ? 0 : 208);
            memcpy(p, &d, 2);
            if (type == MD_TYPE_Q4_K)
                memcpy(p + 2, &d, 2);
        }
    } else if (md_quantize(type, wf, wq, (int64_t)n * k, &e)) {
        fail_msg("%s", e.msg);
    }
    void *dw = dev(rb * n);
    put(dw, wq, rb * n);
    free(wf);
    free(wq);
    return dw;
}

/* cuda_matmul_n against the unfused launches on the device: cuda_matmul of each weight, then
 * cuda_add (ACC) or cuda_swiglu (SWIGLU). SET on the GEMV path runs the same rows, so it must
 * be equal bit for bit; the rest within 1e-6 of rms on the GEMV path (equal too unless the
 * compiler contracted the fused epilogue differently; the count of differing values is
 * printed) and 1e-5 on cuBLAS (beta 1 may pick another GEMM algorithm than beta 0). Q/K/V-shaped
 * segments (Llama-3-8B's 4096/1024/1024 scaled down), types alone and mixed, m on both
 * paths. */
static void test_matmul_n_equals_unfused_ops(void **state) {
    const int k = 512, F = 352;
    const int rows[3] = {256, 64, 64};
    const int sets[][3] = {{MD_TYPE_BF16, MD_TYPE_BF16, MD_TYPE_BF16},
                           {MD_TYPE_Q4_K, MD_TYPE_Q4_K, MD_TYPE_Q4_K},
                           {MD_TYPE_Q4_K, MD_TYPE_Q4_K, MD_TYPE_Q6_K},
                           {MD_TYPE_Q8_0, MD_TYPE_F16, MD_TYPE_Q4_0}};
    const int ms[] = {1, 5, 8, 40};
    for (size_t si = 0; si < sizeof sets / sizeof sets[0]; si++) {
        cuda_mm_w w[3], g[2];
        for (int i = 0; i < 3; i++)
            w[i] = (cuda_mm_w){random_weight(sets[si][i], rows[i], k),
                               sets[si][i],
                               md_type_row_bytes(sets[si][i], k),
                               rows[i],
                               NULL,
                               NULL};
        for (int i = 0; i < 2; i++) /* gate of the first type, up of the last */
            g[i] = (cuda_mm_w){random_weight(sets[si][2 * i], F, k),
                               sets[si][2 * i],
                               md_type_row_bytes(sets[si][2 * i], k),
                               F,
                               NULL,
                               NULL};
        for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++) {
            int m = ms[mi], maxn = F;
            float *x = malloc((size_t)m * k * 4), *init = malloc((size_t)m * maxn * 4);
            float *a = malloc((size_t)m * maxn * 4), *b = malloc((size_t)m * maxn * 4);
            for (int i = 0; i < m * k; i++)
                x[i] = frand();
            for (int i = 0; i < m * maxn; i++)
                init[i] = 4.0f * frand();
            float *dx = dev((size_t)m * k * 4), *tmp = dev((size_t)m * maxn * 4);
            float *yf[3], *yu[3];
            put(dx, x, (size_t)m * k * 4);
            for (int i = 0; i < 3; i++) {
                yf[i] = dev((size_t)m * maxn * 4);
                yu[i] = dev((size_t)m * maxn * 4);
            }
            for (int mode = CUDA_MM_SET; mode <= CUDA_MM_SWIGLU; mode++) {
                int nw = mode == CUDA_MM_SWIGLU ? 2 : 3;
                cuda_mm_w cw[3];
                for (int i = 0; i < nw; i++) {
                    cw[i] = mode == CUDA_MM_SWIGLU ? g[i] : w[i];
                    put(yf[i], init, (size_t)m * cw[i].n * 4);
                    put(yu[i], init, (size_t)m * cw[i].n * 4);
                    cw[i].y = yf[i];
                }
                CHK(cuda_matmul_n(C, cw, nw, dx, m, k, mode, 0, E));
                for (int i = 0; i < nw; i++) {
                    float *dst = mode == CUDA_MM_ACC ? tmp : yu[i];
                    CHK(cuda_matmul(C, cw[i].w, cw[i].wtype, cw[i].row_bytes, dx, dst, m, cw[i].n,
                                    k, 0.0f, 0, E));
                    if (mode == CUDA_MM_ACC)
                        CHK(cuda_add(C, yu[i], tmp, (int64_t)m * cw[i].n, E));
                }
                if (mode == CUDA_MM_SWIGLU)
                    CHK(cuda_swiglu(C, yu[0], yu[1], yu[0], CUDA_F32, (int64_t)m * F, E));
                double ss = 0, worst = 0;
                long differ = 0, cnt = 0;
                for (int i = 0; i < (mode == CUDA_MM_SWIGLU ? 1 : nw); i++) {
                    get(a, yf[i], (size_t)m * cw[i].n * 4);
                    get(b, yu[i], (size_t)m * cw[i].n * 4);
                    for (int j = 0; j < m * cw[i].n; j++, cnt++) {
                        ss += (double)b[j] * b[j];
                        worst = fmax(worst, fabs((double)a[j] - b[j]));
                        differ += memcmp(&a[j], &b[j], 4) != 0;
                    }
                }
                double rms = sqrt(ss / cnt);
                const char *mn[] = {"SET", "ACC", "SWIGLU"};
                printf("matmul_n %-6s [%s,%s,%s] m=%-2d: %ld of %ld differ from unfused, worst "
                       "%.2e of rms %.2e\n",
                       mn[mode], md_type_name(cw[0].wtype), md_type_name(cw[1].wtype),
                       nw > 2 ? md_type_name(cw[2].wtype) : "-", m, differ, cnt, worst, rms);
                if (mode == CUDA_MM_SET && m <= CUDA_GEMV_MAX_M)
                    assert_int_equal(differ, 0);
                if (!(worst <= (m <= CUDA_GEMV_MAX_M ? 1e-6 : 1e-5) * rms))
                    fail_msg("matmul_n mode %d m=%d: worst %.3g of rms %.3g", mode, m, worst, rms);
            }
            for (int i = 0; i < 3; i++) {
                cuda_pool_free(C, yf[i]);
                cuda_pool_free(C, yu[i]);
            }
            cuda_pool_free(C, dx);
            cuda_pool_free(C, tmp);
            free(x);
            free(init);
            free(a);
            free(b);
        }
        for (int i = 0; i < 3; i++)
            cuda_pool_free(C, (void *)w[i].w);
        for (int i = 0; i < 2; i++)
            cuda_pool_free(C, (void *)g[i].w);
    }
}

static void host_probs(const float *l, int V, float temp, double *p) {
    double mx = -INFINITY, z = 0;
    for (int i = 0; i < V; i++)
        mx = l[i] > mx ? l[i] : mx;
    for (int i = 0; i < V; i++)
        z += p[i] = exp((l[i] - mx) / temp);
    for (int i = 0; i < V; i++)
        p[i] /= z;
}

/* Inverse-CDF sampling is deterministic in u: over the grid u_j = (j + 0.5) / N each token
 * is drawn N * p_i times, +-1. Checked plain, with top-k, with top-p and with min-p, where
 * p is the host's renormalised distribution over the kept tokens. */
static void test_sampling_distribution_and_filters(void **state) {
    /* The draws are stratified (row r draws at u = (r + 0.5) / N), so each token's count is
     * within one of N times its probability for any N: the emulator's short run
     * (MEDLEY_GPU_TEST_SMALL) draws 250 rows a case instead of 2,000 (146 s -> 18 s there). */
    enum { V = 1000, N_MAX = 2000 };
    const int N = gpu_test_env_on("MEDLEY_GPU_TEST_SMALL") ? 250 : N_MAX;
    float *l = malloc(V * 4);
    for (int i = 0; i < V; i++)
        l[i] = 3.0f * frand();
    l[17] = l[523] = 9.0f; /* a tie at the top: argmax must say 17 */
    float *dl = dev(V * 4);
    put(dl, l, V * 4);
    int32_t *dtok = dev(N * 4), tok[N_MAX];
    float *dlp = dev(N * 4), lp[N_MAX];
    CHK(cuda_argmax(C, dl, 1, V, dtok, E));
    get(tok, dtok, 4);
    assert_int_equal(tok[0], 17);

    struct {
        float temp, top_p, min_p;
        int top_k;
    } cases[] = {{1.0f, 1.0f, 0.0f, 0},
                 {0.7f, 1.0f, 0.0f, 5},
                 {1.3f, 0.5f, 0.0f, 0},
                 {1.0f, 1.0f, 0.05f, 0}};
    double *p = malloc(V * sizeof(double)), *raw = malloc(V * sizeof(double));
    host_probs(l, V, 1.0f, raw);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        /* N rows of the same logits, one u each */
        float *dl_n = dev((size_t)N * V * 4);
        for (int r = 0; r < N; r++)
            put(dl_n + (size_t)r * V, l, V * 4);
        cuda_sample_params *prm = malloc(N * sizeof *prm);
        for (int r = 0; r < N; r++)
            prm[r] = (cuda_sample_params){.temperature = cases[c].temp,
                                          .top_k = cases[c].top_k,
                                          .top_p = cases[c].top_p,
                                          .min_p = cases[c].min_p,
                                          .u = (r + 0.5f) / N,
                                          .repetition = 1.0f};
        cuda_sample_params *dp = dev(N * sizeof *prm);
        put(dp, prm, N * sizeof *prm);
        CHK(cuda_sample(C, dl_n, N, V, dp, NULL, NULL, dtok, dlp, NULL, NULL, E));
        get(tok, dtok, N * 4);
        get(lp, dlp, N * 4);
        host_probs(l, V, cases[c].temp, p);
        /* host filter: keep top-k, then smallest prefix (by probability) reaching top_p,
         * then p >= min_p * pmax */
        int *order = malloc(V * sizeof(int)), keep[V];
        for (int i = 0; i < V; i++)
            order[i] = i;
        for (int i = 0; i < V; i++) /* selection sort by p descending: V is small */
            for (int j = i + 1; j < V; j++)
                if (p[order[j]] > p[order[i]]) {
                    int t = order[i];
                    order[i] = order[j];
                    order[j] = t;
                }
        int nk = cases[c].top_k > 0 ? cases[c].top_k : V;
        double cum = 0, mass_k = 0;
        for (int i = 0; i < nk; i++)
            mass_k += p[order[i]];
        int np = 0;
        for (int i = 0; i < nk; i++) {
            np++;
            cum += p[order[i]];
            if (cases[c].top_p < 1.0f && cum >= cases[c].top_p * mass_k)
                break;
        }
        memset(keep, 0, sizeof keep);
        double kept = 0, pmax = p[order[0]];
        for (int i = 0; i < np; i++)
            if (p[order[i]] >= cases[c].min_p * pmax) {
                keep[order[i]] = 1;
                kept += p[order[i]];
            }
        int *count = calloc(V, sizeof(int));
        for (int r = 0; r < N; r++) {
            assert_true(tok[r] >= 0 && tok[r] < V);
            if (!keep[tok[r]])
                fail_msg("case %zu: token %d (p %.4g) drawn but filtered out", c, tok[r],
                         p[tok[r]]);
            count[tok[r]]++;
            double want_lp = log(raw[tok[r]]); /* the raw row's, not the temperature's */
            if (fabs(lp[r] - want_lp) > 1e-3)
                fail_msg("case %zu: logprob %.6f, host %.6f", c, lp[r], want_lp);
        }
        for (int i = 0; i < V; i++) {
            double want = keep[i] ? N * p[i] / kept : 0;
            if (fabs(count[i] - want) > 1.5)
                fail_msg("case %zu: token %d drawn %d times, expected %.2f", c, i, count[i], want);
        }
        printf("sampling case %zu: %d tokens kept, draws match the distribution\n", c, np);
        free(count);
        free(order);
        free(prm);
        cuda_pool_free(C, dp);
        cuda_pool_free(C, dl_n);
    }
    /* greedy through cuda_sample (temperature 0) */
    cuda_sample_params g = {.temperature = 0.0f, .top_p = 1.0f, .u = 0.9f, .repetition = 1.0f};
    cuda_sample_params *dg = dev(sizeof g);
    put(dg, &g, sizeof g);
    CHK(cuda_sample(C, dl, 1, V, dg, NULL, NULL, dtok, NULL, NULL, NULL, E));
    get(tok, dtok, 4);
    assert_int_equal(tok[0], 17);
    free(raw);
    free(p);
    free(l);
}

/* Penalties, logprobs and top logprobs on the GPU against engine/sampler.c's row sampler, as
 * test_cuda_emu's "samplehost" checks them on the emulator: a vocabulary of 49152 (SmolLM2's),
 * one sequence history, rows under different penalties and filters. The penalised row is
 * the host's bit for bit, the token the host's, the logprob the host's raw one within 1e-4. */
static void test_sampling_penalties_and_logprobs(void **state) {
    enum { V = 49152, R = 6 };
    float *l = malloc(V * 4), *row = malloc(V * 4), *got = malloc((size_t)R * V * 4);
    for (int i = 0; i < V; i++)
        l[i] = 6.0f * frand() - 3.0f;
    int top = 0;
    for (int i = 1; i < V; i++)
        if (l[i] > l[top])
            top = i;
    int32_t toks[400];
    int n_prompt = 300, n = 0;
    for (; n < n_prompt; n++)
        toks[n] = (int32_t)((n * 7919) % V);
    for (; n < 397; n++)
        toks[n] = (int32_t)((n * 13) % 200);
    toks[n++] = top; /* the raw argmax in the output three times */
    toks[n++] = top;
    toks[n++] = top;
    struct {
        float temp, top_p, min_p;
        int top_k;
        float rep, pres, freq;
    } cases[R] = {
        {0.0f, 1.0f, 0.0f, 0, 1.0f, 0.0f, 2.0f},  {0.0f, 1.0f, 0.0f, 0, 1.3f, 0.5f, 0.3f},
        {0.8f, 1.0f, 0.0f, 0, 1.2f, 0.0f, 0.0f},  {1.0f, 0.9f, 0.0f, 40, 1.0f, -1.5f, 0.7f},
        {1.2f, 1.0f, 0.05f, 0, 1.5f, 0.2f, 0.2f}, {1.0f, 1.0f, 0.0f, 0, 0.8f, 0.0f, -2.0f}};
    smp_scratch *sc = smp_scratch_new(V);
    md_sample_pen *pen = malloc((size_t)R * 400 * sizeof *pen);
    md_sample_params hp[R];
    cuda_sample_params prm[R];
    int n_pen = 0;
    for (int r = 0; r < R; r++) {
        md_sampling s;
        md_sampling_default(&s);
        s.temperature = cases[r].temp;
        s.top_k = cases[r].top_k;
        s.top_p = cases[r].top_p;
        s.min_p = cases[r].min_p;
        s.repetition_penalty = cases[r].rep;
        s.presence_penalty = cases[r].pres;
        s.frequency_penalty = cases[r].freq;
        hp[r] = smp_params(&s, (float)((r + 0.5) / R));
        hp[r].pen_off = n_pen;
        hp[r].pen_n =
            smp_pen_list(&s, toks, n_prompt, toks + n_prompt, n - n_prompt, V, sc, pen + n_pen);
        n_pen += hp[r].pen_n;
        hp[r].n_top = r == 0 ? 3 : r == 3 ? CUDA_SAMPLE_TOP : 0;
        prm[r] = (cuda_sample_params){.temperature = hp[r].temperature,
                                      .top_k = hp[r].top_k,
                                      .top_p = hp[r].top_p,
                                      .min_p = hp[r].min_p,
                                      .u = (float)hp[r].u,
                                      .repetition = hp[r].repetition,
                                      .presence = hp[r].presence,
                                      .frequency = hp[r].frequency,
                                      .pen_off = hp[r].pen_off,
                                      .pen_n = hp[r].pen_n,
                                      .n_top = hp[r].n_top};
    }
    float *dl = dev((size_t)R * V * 4), *dlp = dev(R * 4), *draw = dev((size_t)n_pen * 4);
    int32_t *dtok = dev(R * 4), tok[R], *dtt = dev(R * CUDA_SAMPLE_TOP * 4),
            tt[R * CUDA_SAMPLE_TOP];
    float lp[R], *dtl = dev(R * CUDA_SAMPLE_TOP * 4), tl[R * CUDA_SAMPLE_TOP];
    cuda_sample_params *dp = dev(sizeof prm);
    cuda_sample_pen *dpen = dev((size_t)n_pen * sizeof *dpen);
    for (int r = 0; r < R; r++)
        put(dl + (size_t)r * V, l, V * 4);
    put(dp, prm, sizeof prm);
    put(dpen, pen, (size_t)n_pen * sizeof *pen);
    CHK(cuda_sample(C, dl, R, V, dp, dpen, draw, dtok, dlp, dtt, dtl, E));
    get(tok, dtok, sizeof tok);
    get(tt, dtt, sizeof tt);
    get(tl, dtl, sizeof tl);
    get(lp, dlp, sizeof lp);
    get(got, dl, (size_t)R * V * 4);
    for (int r = 0; r < R; r++) {
        md_sample_params g = hp[r];
        g.temperature = 0; /* the row sampler at temperature 0 only penalises */
        memcpy(row, l, V * 4);
        smp_sample_row(&g, pen, row, V, sc, NULL);
        if (memcmp(row, got + (size_t)r * V, V * 4))
            fail_msg("row %d: the GPU's penalised logits differ from the host's", r);
        memcpy(row, l, V * 4);
        float hlp = 0;
        int32_t h = smp_sample_row(&hp[r], pen, row, V, sc, &hlp);
        printf("penalties row %d (%d entries): token %d, host %d; logprob %.6f, host %.6f\n", r,
               hp[r].pen_n, tok[r], h, lp[r], hlp);
        assert_int_equal(tok[r], h);
        assert_true(fabsf(lp[r] - hlp) < 1e-4f);
        int32_t ht[MD_TOP_LOGPROBS];
        float hl[MD_TOP_LOGPROBS];
        int m = smp_top_logprobs(l, V, hp[r].n_top, ht, hl);
        for (int j = 0; j < CUDA_SAMPLE_TOP; j++) {
            assert_int_equal(tt[r * CUDA_SAMPLE_TOP + j], j < m ? ht[j] : -1);
            if (j < m)
                assert_true(fabsf(tl[r * CUDA_SAMPLE_TOP + j] - hl[j]) < 1e-4f);
        }
    }
    assert_true(tok[0] != top); /* the frequency penalty moved the greedy row */
    void *bufs[] = {dl, dlp, draw, dtok, dp, dpen, dtt, dtl};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        cuda_pool_free(C, bufs[i]);
    smp_scratch_free(sc);
    free(pen);
    free(got);
    free(row);
    free(l);
}

/* Structured outputs on the GPU: cuda_constrain (token masks packed one row per constrained
 * row, logit_bias with a repeated token) then cuda_sample, against smp_sample_row with the
 * same constraint, on SmolLM2's vocabulary size: the constrained rows bit for bit, the tokens
 * the host's and allowed, logprobs within 1e-4. test_cuda_emu "samplehost" checks the same
 * kernels on the emulator. */
static void test_sampling_constrained(void **state) {
    enum { V = 49152, R = 4, W = (V + 31) / 32 };
    float *l = malloc(V * 4), *row = malloc(V * 4), *got = malloc((size_t)R * V * 4);
    for (int i = 0; i < V; i++)
        l[i] = 6.0f * frand() - 3.0f;
    uint32_t *mask = calloc((size_t)2 * W, 4);
    for (int t = 0; t < V; t++) {
        if (t % 5 == 1)
            mask[t / 32] |= 1u << (t % 32); /* row 0: a fifth of the vocabulary */
        if (t == 77 || t == 40000 || t == V - 1)
            mask[W + t / 32] |= 1u << (t % 32); /* row 2: three tokens */
    }
    md_sample_bias bias[3] = {{12, 5.0f}, {12, -0.25f}, {V - 1, 30.0f}};
    float temps[R] = {0.0f, 1.0f, 0.8f, 0.0f};
    md_sample_params hp[R];
    cuda_sample_params prm[R];
    smp_scratch *sc = smp_scratch_new(V);
    for (int r = 0; r < R; r++) {
        md_sampling s;
        md_sampling_default(&s);
        s.temperature = temps[r];
        s.top_k = r == 2 ? 50 : 0;
        hp[r] = smp_params(&s, (float)((r + 0.5) / R));
        hp[r].n_top = 5;
        hp[r].mask = r == 0 ? mask : r == 2 ? mask + W : NULL;
        hp[r].bias = r >= 1 ? bias : NULL;
        hp[r].n_bias = r >= 1 ? 3 : 0;
        prm[r] = (cuda_sample_params){.temperature = hp[r].temperature,
                                      .top_k = hp[r].top_k,
                                      .top_p = hp[r].top_p,
                                      .u = (float)hp[r].u,
                                      .repetition = 1.0f,
                                      .n_top = 5,
                                      .mask_row = r == 0   ? 1
                                                  : r == 2 ? 2
                                                           : 0,
                                      .bias_n = hp[r].n_bias};
    }
    float *dl = dev((size_t)R * V * 4), *dlp = dev(R * 4), *dtl = dev(R * CUDA_SAMPLE_TOP * 4);
    int32_t *dtok = dev(R * 4), *dtt = dev(R * CUDA_SAMPLE_TOP * 4), tok[R],
            tt[R * CUDA_SAMPLE_TOP];
    float lp[R], tl[R * CUDA_SAMPLE_TOP];
    cuda_sample_params *dp = dev(sizeof prm);
    uint32_t *dm = dev((size_t)2 * W * 4);
    cuda_sample_bias *db = dev(sizeof bias);
    for (int r = 0; r < R; r++)
        put(dl + (size_t)r * V, l, V * 4);
    put(dp, prm, sizeof prm);
    put(dm, mask, (size_t)2 * W * 4);
    put(db, bias, sizeof bias);
    CHK(cuda_constrain(C, dl, R, V, dp, dm, db, E));
    get(got, dl, (size_t)R * V * 4);
    CHK(cuda_sample(C, dl, R, V, dp, NULL, NULL, dtok, dlp, dtt, dtl, E));
    get(tok, dtok, sizeof tok);
    get(lp, dlp, sizeof lp);
    get(tt, dtt, sizeof tt);
    get(tl, dtl, sizeof tl);
    for (int r = 0; r < R; r++) {
        memcpy(row, l, V * 4);
        smp_constrain(&hp[r], row, V);
        if (memcmp(row, got + (size_t)r * V, V * 4))
            fail_msg("row %d: the GPU's constrained logits differ from the host's", r);
        int32_t ht[MD_TOP_LOGPROBS];
        float hl[MD_TOP_LOGPROBS];
        int m = smp_top_logprobs(row, V, 5, ht, hl);
        memcpy(row, l, V * 4);
        float hlp = 0;
        int32_t h = smp_sample_row(&hp[r], NULL, row, V, sc, &hlp);
        printf("constrained row %d: token %d, host %d; logprob %.6f, host %.6f\n", r, tok[r], h,
               lp[r], hlp);
        assert_int_equal(tok[r], h);
        assert_true(!hp[r].mask || (hp[r].mask[h / 32] >> (h % 32) & 1u));
        assert_true(fabsf(lp[r] - hlp) < 1e-4f);
        for (int j = 0; j < m; j++)
            assert_int_equal(tt[r * CUDA_SAMPLE_TOP + j], ht[j]);
    }
    assert_int_equal(tok[3], V - 1); /* the +30 bias wins the unmasked greedy row */
    void *bufs[] = {dl, dlp, dtok, dp, dtt, dtl, dm, db};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        cuda_pool_free(C, bufs[i]);
    smp_scratch_free(sc);
    free(mask);
    free(got);
    free(row);
    free(l);
}

/* A captured rmsnorm + add replays to the same bytes as direct launches, and follows new
 * input data written between replays (pointers are fixed, contents are not). */
static void test_graph_replay_equals_direct(void **state) {
    enum { R = 4, D = 1024 };
    float x[R * D], w[D], y0[R * D], y1[R * D];
    for (int i = 0; i < R * D; i++)
        x[i] = frand();
    for (int i = 0; i < D; i++)
        w[i] = 1.0f + 0.1f * frand();
    float *dx = dev(sizeof x), *dw = dev(sizeof w), *dy = dev(sizeof x);
    put(dw, w, sizeof w);
    put(dx, x, sizeof x);
    CHK(cuda_rmsnorm(C, dx, dw, 1e-5f, R, D, dy, CUDA_F32, E));
    CHK(cuda_add(C, dy, dx, R * D, E));
    get(y0, dy, sizeof y0);
    cuda_graph *g = NULL;
    CHK(cuda_graph_begin(C, E));
    CHK(cuda_rmsnorm(C, dx, dw, 1e-5f, R, D, dy, CUDA_F32, E));
    CHK(cuda_add(C, dy, dx, R * D, E));
    CHK(cuda_graph_end(C, &g, E));
    CHK(cuda_memset0(C, dy, sizeof x, E));
    CHK(cuda_graph_launch(C, g, E));
    get(y1, dy, sizeof y1);
    assert_memory_equal(y0, y1, sizeof y0);
    for (int i = 0; i < R * D; i++)
        x[i] *= 2.0f;
    put(dx, x, sizeof x);
    CHK(cuda_graph_launch(C, g, E));
    get(y1, dy, sizeof y1);
    for (int i = 0; i < R * D; i++)
        assert_true(fabsf(y1[i] - (y0[i] + x[i] / 2)) < 1e-4f);
    cuda_graph_free(g);
}

/* The pool reuses a freed block; with MEDLEY_CUDA_POOL_EXACT=1 (for memory checkers) it
 * gives each block back to the driver instead, and exactly as many bytes as it held. */
static void test_pool_reuses_freed_blocks(void **state) {
    void *a = dev(1000), *b = dev(5000), *c = dev(1000);
    size_t used = cuda_pool_used(C), reserved = cuda_pool_reserved(C);
    cuda_pool_free(C, b);
    assert_true(cuda_pool_used(C) < used);
    if (gpu_test_env_on("MEDLEY_CUDA_POOL_EXACT")) {
        assert_int_equal(cuda_pool_used(C), used - 5000);
        assert_int_equal(cuda_pool_reserved(C), reserved - 5000);
        assert_int_equal((uintptr_t)a % 256, 0);
        assert_int_equal((uintptr_t)c % 256, 0);
        cuda_pool_free(C, a);
        cuda_pool_free(C, c);
        assert_int_equal(cuda_pool_reserved(C), reserved - 7000);
        return;
    }
    void *b2 = dev(4096); /* fits the hole b left */
    assert_ptr_equal(b, b2);
    assert_int_equal(cuda_pool_reserved(C), reserved);
    assert_int_equal((uintptr_t)a % 256, 0);
    assert_int_equal((uintptr_t)c % 256, 0);
    cuda_pool_free(C, a);
    cuda_pool_free(C, b2);
    cuda_pool_free(C, c);
}

/* A failed CUDA call becomes an MD_EDEVICE sentence, and every later call on that context
 * returns the same error instead of running on a poisoned device. Runs last: it kills C. */
static void test_device_error_is_sticky(void **state) {
    md_err e = {0};
    char h[64];
    int rc = cuda_download(C, h, (void *)(uintptr_t)0x10, sizeof h, &e);
    assert_int_equal(rc, MD_EDEVICE);
    assert_non_null(strstr(e.msg, "device-to-host copy failed"));
    md_err e2 = {0};
    assert_int_equal(cuda_add(C, NULL, NULL, 16, &e2), MD_EDEVICE);
    assert_string_equal(e.msg, e2.msg);
    printf("sticky error: %s\n", e.msg);
}

/* A quantized weight's BF16 copy (cuda_dequantize into BF16, as backend weight_shadow makes
 * it) on the cuBLAS path, m = 64: the same product as expanding the weight into scratch at
 * every call (cuBLAS forced for the weight without a copy, which would otherwise take the
 * int8 tiled path at this m; bit for bit expected: the same GemmEx on the same BF16 values;
 * printed and held to 1e-6 of rms in case cuBLAS picks another algorithm for another
 * address), and the time of both and of the int8 tiled path the engine takes without a copy
 * (Llama-3-8B's w_gate shape, 14336 x 4096, Q4_K): the crossover docs/cuda.md leaves
 * unmeasured. */
static void test_matmul_bf16_copy_equals_expansion(void **state) {
    /* MEDLEY_GPU_TEST_SMALL (the emulator's ctest entry): every type at the small shape,
     * one repetition; the timing means nothing there */
    int small = gpu_test_env_on("MEDLEY_GPU_TEST_SMALL");
    const int n = small ? 1024 : 14336, k = small ? 1024 : 4096, m = 64, reps = small ? 1 : 20;
    const int types[] = {MD_TYPE_Q4_K, MD_TYPE_Q6_K, MD_TYPE_Q4_0};
    for (int ti = 0; ti < 3; ti++) {
        int type = types[ti];
        int nn = ti == 0 ? n : 1024; /* the full shape for the timing, small for the others */
        void *w = random_weight(type, nn, k);
        void *copy = dev((size_t)nn * k * 2);
        CHK(cuda_dequantize(C, type, w, copy, CUDA_BF16, (int64_t)nn * k, E));
        size_t ybytes = (size_t)m * nn * 4;
        float *x = malloc((size_t)m * k * 4), *a = malloc(ybytes), *b = malloc(ybytes),
              *q = malloc(ybytes);
        for (int i = 0; i < m * k; i++)
            x[i] = frand();
        float *dx = dev((size_t)m * k * 4), *ya = dev(ybytes), *yb = dev(ybytes), *yq = dev(ybytes);
        put(dx, x, (size_t)m * k * 4);
        /* v 0: expanded at every call (cuBLAS forced); 1: the BF16 copy; 2: int8 tiled */
        cuda_mm_w wv[3] = {{w, type, md_type_row_bytes(type, k), nn, ya, NULL},
                           {w, type, md_type_row_bytes(type, k), nn, yb, copy},
                           {w, type, md_type_row_bytes(type, k), nn, yq, NULL}};
        double t[3];
        for (int v = 0; v < 3; v++) {
            int force = v == 0;
            CHK(cuda_matmul_n(C, &wv[v], 1, dx, m, k, CUDA_MM_SET, force, E)); /* warm */
            CHK(cuda_sync(C, E));
            uint64_t t0 = md_mono_ns();
            for (int r = 0; r < reps; r++)
                CHK(cuda_matmul_n(C, &wv[v], 1, dx, m, k, CUDA_MM_SET, force, E));
            CHK(cuda_sync(C, E));
            t[v] = (md_mono_ns() - t0) / 1e6 / reps;
        }
        get(a, ya, ybytes);
        get(b, yb, ybytes);
        get(q, yq, ybytes);
        double ss = 0, worst = 0, worst_q = 0;
        long differ = 0;
        for (long i = 0; i < (long)m * nn; i++) {
            ss += (double)a[i] * a[i];
            worst = fmax(worst, fabs((double)a[i] - b[i]));
            worst_q = fmax(worst_q, fabs((double)a[i] - q[i]));
            differ += memcmp(&a[i], &b[i], 4) != 0;
        }
        double rms = sqrt(ss / ((double)m * nn));
        printf("matmul %s [%d x %d] m=%d: expanded each call %.3f ms, BF16 copy %.3f ms (%.2fx), "
               "int8 tiled %.3f ms (%.2fx); copy: %ld of %ld differ, worst %.2e of rms %.2e; "
               "int8 tiled worst %.2e\n",
               md_type_name(type), nn, k, m, t[0], t[1], t[0] / t[1], t[2], t[0] / t[2], differ,
               (long)m * nn, worst, rms, worst_q);
        if (!(worst <= 1e-6 * rms))
            fail_msg("BF16 copy of %s: worst %.3g of rms %.3g", md_type_name(type), worst, rms);
        cuda_pool_free(C, w);
        cuda_pool_free(C, copy);
        cuda_pool_free(C, dx);
        cuda_pool_free(C, ya);
        cuda_pool_free(C, yb);
        cuda_pool_free(C, yq);
        free(x);
        free(a);
        free(b);
        free(q);
    }
}

/* cuda_rope_kv against cuda_rope on q, cuda_rope on k and cuda_kv_write, bit for bit (q and
 * every byte of both caches): caches f32/f16/bf16, neox and not, Llama-3-8B's heads (32/8 of
 * 128, full rotary) and a partial-rotary GQA shape (8/2 of 64, 32 rotated); positions up to
 * 8k, slots scattered. */
static void test_rope_kv_equals_rope_then_kv_write(void **state) {
    enum { T = 37, NSLOT = 512 };
    const struct { int hd, nh, nkv, rot; } shapes[] = {{128, 32, 8, 128}, {64, 8, 2, 32}};
    int32_t pos[T], slots[T];
    for (int t = 0; t < T; t++) {
        pos[t] = (t * 977) % 8192;
        slots[t] = (t * 131 + 7) % NSLOT;
    }
    int32_t *dpos = dev(sizeof pos), *dslot = dev(sizeof slots);
    put(dpos, pos, sizeof pos);
    put(dslot, slots, sizeof slots);
    for (int si = 0; si < 2; si++) {
        int hd = shapes[si].hd, nh = shapes[si].nh, nkv = shapes[si].nkv, rot = shapes[si].rot;
        int kvd = nkv * hd;
        float inv[64];
        for (int i = 0; i < rot / 2; i++)
            inv[i] = powf(500000.0f, -2.0f * i / rot);
        size_t qn = (size_t)T * nh * hd, kn = (size_t)T * kvd;
        float *q = malloc(qn * 4), *k = malloc(kn * 4), *v = malloc(kn * 4);
        for (size_t i = 0; i < qn; i++)
            q[i] = 4 * frand();
        for (size_t i = 0; i < kn; i++)
            k[i] = 4 * frand(), v[i] = frand();
        float *dinv = dev(sizeof inv), *qa = dev(qn * 4), *qb = dev(qn * 4), *ka = dev(kn * 4),
              *kb = dev(kn * 4), *dv = dev(kn * 4);
        put(dinv, inv, sizeof inv);
        put(dv, v, kn * 4);
        size_t cb = (size_t)NSLOT * kvd * 4;
        void *kca = dev(cb), *vca = dev(cb), *kcb = dev(cb), *vcb = dev(cb);
        uint8_t *ha = malloc(cb), *hb = malloc(cb);
        for (int ct = CUDA_F32; ct <= CUDA_BF16; ct++)
            for (int neox = 0; neox < 2; neox++) {
                put(qa, q, qn * 4);
                put(qb, q, qn * 4);
                put(ka, k, kn * 4);
                put(kb, k, kn * 4);
                void *cs[] = {kca, vca, kcb, vcb};
                for (int i = 0; i < 4; i++)
                    CHK(cuda_memset0(C, cs[i], cb, E));
                CHK(cuda_rope(C, qa, dpos, T, nh, hd, rot, dinv, neox, E));
                CHK(cuda_rope(C, ka, dpos, T, nkv, hd, rot, dinv, neox, E));
                CHK(cuda_kv_write(C, kca, vca, (cuda_dtype)ct, kvd, ka, dv, dslot, T, E));
                CHK(cuda_rope_kv(C, qb, kb, dv, kcb, vcb, (cuda_dtype)ct, dpos, dslot, T, nh, nkv,
                                 hd, rot, dinv, neox, E));
                get(ha, qa, qn * 4);
                get(hb, qb, qn * 4);
                assert_memory_equal(ha, hb, qn * 4);
                get(ha, kca, cb);
                get(hb, kcb, cb);
                assert_memory_equal(ha, hb, cb);
                get(ha, vca, cb);
                get(hb, vcb, cb);
                assert_memory_equal(ha, hb, cb);
                get(hb, kb, kn * 4); /* k is left as it was */
                assert_memory_equal(hb, k, kn * 4);
                printf("rope_kv %s heads %d/%d of %d, %d rotated, neox %d: bit-equal to rope + "
                       "rope + kv_write\n",
                       ct == CUDA_F32   ? "f32"
                       : ct == CUDA_F16 ? "f16"
                                        : "bf16",
                       nh, nkv, hd, rot, neox);
            }
        void *all[] = {dinv, qa, qb, ka, kb, dv, kca, vca, kcb, vcb};
        for (int i = 0; i < 10; i++)
            cuda_pool_free(C, all[i]);
        free(q);
        free(k);
        free(v);
        free(ha);
        free(hb);
    }
    cuda_pool_free(C, dpos);
    cuda_pool_free(C, dslot);
}

int main(void) {
    int skip = gpu_test_skip_without_device();
    if (skip)
        return skip;
    md_err e = {0};
    if (cuda_ctx_open(0, &C, &e)) {
        fprintf(stderr, "cuda_ctx_open: %s\n", e.msg);
        return 1;
    }
    gpu_test_filter_from_env();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dequant_matches_gguf_package),
        cmocka_unit_test(test_matmul_every_type_and_path),
        cmocka_unit_test(test_matmul_n_equals_unfused_ops),
        cmocka_unit_test(test_matmul_bf16_copy_equals_expansion),
        cmocka_unit_test(test_rope_kv_equals_rope_then_kv_write),
        cmocka_unit_test(test_sampling_distribution_and_filters),
        cmocka_unit_test(test_sampling_penalties_and_logprobs),
        cmocka_unit_test(test_sampling_constrained),
        cmocka_unit_test(test_graph_replay_equals_direct),
        cmocka_unit_test(test_pool_reuses_freed_blocks),
        cmocka_unit_test(test_device_error_is_sticky),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    cuda_ctx_close(C);
    return rc;
}
