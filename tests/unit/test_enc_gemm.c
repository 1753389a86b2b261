/* test_enc_gemm.c — the packed products of kernels/cpu/enc_gemm.c (cpu_lin_*: encoder steps,
 * and decoders' BF16 weights) against the scalar reference cpu_lin_ref: F32, F16 and BF16
 * weights in the three precisions (F32; BF16 weights and x; BF16 weights, F32 x); N and K that
 * are not multiples of the panel (32) or of the BF16 pair; 1 to 100 tokens (partial
 * micro-tiles and work items); the three epilogues (bias, bias + GELU, bias added to y); F32
 * products within 2e-5 relative of the double sums, BF16 products within 1e-4 of the reference
 * that rounds the same operands to BF16. Also: a token's row is the same bits alone or among
 * 100 others, and with 1 or 2 threads; CPU_LIN_WBF16 gives F32 panels' bits; a decoder's BF16
 * weight packed in parts reads back its rows exactly and multiplies as cpu_matmul_ref does;
 * through the CPU backend (weight_wrap), matmul_n's modes over such weights equal the separate
 * ops. Where the CPU (or MEDLEY_SIMD) is below AVX-512 cpu_lin_pack gives NULL and the test
 * checks that it says so (and that the backend keeps the plain layout); BF16 likewise without
 * AVX512-BF16. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "kernels/cpu/cpu_ops.h"

static uint64_t rs = 0x9E3779B97F4A7C15ull;
static float frnd(void) {
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (float)(rs >> 40) / 16777216.0f * 2.0f - 1.0f;
}

/* W [N, K] of type t from random floats; returns malloc'd rows. */
static void *weights(int t, int N, int K) {
    size_t rb = md_type_row_bytes(t, K);
    uint8_t *w = malloc(rb * N);
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++) {
            float v = frnd() * 0.5f;
            if (t == MD_TYPE_F32)
                ((float *)(w + n * rb))[k] = v;
            else if (t == MD_TYPE_F16)
                ((uint16_t *)(w + n * rb))[k] = md_fp32_to_fp16(v);
            else
                ((uint16_t *)(w + n * rb))[k] = md_fp32_to_bf16(v);
        }
    return w;
}

static void check_case(cpu_pool *p, int t, int N, int K, int T, int epi, int prec) {
    void *W = weights(t, N, K);
    float *x = malloc(sizeof(float) * T * K), *b = malloc(sizeof(float) * N);
    float *y = malloc(sizeof(float) * T * N), *want = malloc(sizeof(float) * T * N);
    for (int i = 0; i < T * K; i++)
        x[i] = frnd();
    for (int i = 0; i < N; i++)
        b[i] = frnd() * 0.1f;
    for (int i = 0; i < T * N; i++)
        y[i] = want[i] = frnd();
    cpu_lin *l = cpu_lin_pack(t, W, N, K, prec);
    if (!l) {
        /* only allowed where the CPU lacks the instructions */
        assert_true(cpu_simd_level() < CPU_SIMD_AVX512VNNI ||
                    (prec == CPU_LIN_BF16 && !cpu_lin_bf16_ok()));
        goto out;
    }
    size_t ss = cpu_lin_scratch_size(K, cpu_pool_size(p));
    void *scratch = malloc(ss);
    cpu_lin_run(p, l, b, x, T, y, epi, scratch);
    cpu_lin_ref(t, W, N, K, b, x, T, want, epi, prec);
    double tol = prec == CPU_LIN_BF16 ? 1e-4 : 2e-5;
    for (int i = 0; i < T * N; i++)
        if (!(fabs(y[i] - want[i]) <= tol * (fabs(want[i]) + sqrt((double)K) * 0.3)))
            fail_msg("type %d N %d K %d T %d epi %d prec %d: [%d][%d] = %.8g, want %.8g", t, N, K,
                     T, epi, prec, i / N, i % N, y[i], want[i]);
    free(scratch);
    cpu_lin_free(l);
out:
    free(W);
    free(x);
    free(b);
    free(y);
    free(want);
}

static void test_against_reference(void **state) {
    cpu_pool *p = cpu_pool_create(2);
    const int shapes[][2] = {{32, 16}, {40, 33}, {384, 384}, {97, 1536}, {1, 7}};
    const int Ts[] = {1, 5, 12, 13, 49, 100};
    const int types[] = {MD_TYPE_F32, MD_TYPE_F16, MD_TYPE_BF16};
    for (int prec = CPU_LIN_F32; prec <= CPU_LIN_WBF16; prec++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++)
                for (int epi = 0; epi < 3; epi++)
                    check_case(p, types[(s + ti + epi) % 3], shapes[s][0], shapes[s][1], Ts[ti],
                               epi, prec);
    cpu_pool_destroy(p);
}

/* Row 37 of a 100-token product equals the same token's product alone (1 thread, then 2). */
static void test_same_bits_alone_or_packed(void **state) {
    int N = 200, K = 384, T = 100;
    void *W = weights(MD_TYPE_F32, N, K);
    float *x = malloc(sizeof(float) * T * K), *b = calloc(N, sizeof(float));
    float *y = malloc(sizeof(float) * T * N), *one = malloc(sizeof(float) * N);
    for (int i = 0; i < T * K; i++)
        x[i] = frnd();
    for (int prec = CPU_LIN_F32; prec <= CPU_LIN_WBF16; prec++) {
        cpu_lin *l = cpu_lin_pack(MD_TYPE_F32, W, N, K, prec);
        if (!l)
            continue;
        cpu_pool *p2 = cpu_pool_create(2);
        void *scratch = malloc(cpu_lin_scratch_size(K, 2));
        cpu_lin_run(p2, l, b, x, T, y, CPU_LIN_GELU, scratch);
        cpu_lin_run(NULL, l, b, x + 37 * K, 1, one, CPU_LIN_GELU, scratch);
        assert_memory_equal(one, y + 37 * N, sizeof(float) * N);
        free(scratch);
        cpu_pool_destroy(p2);
        cpu_lin_free(l);
    }
    free(W);
    free(x);
    free(b);
    free(y);
    free(one);
}

/* BF16 weights packed as CPU_LIN_WBF16 multiply to the bits of the same weights in F32 panels
 * (x unrounded, the same FMAs in the same order), K even and odd, 1..100 tokens. */
static void test_wbf16_equals_f32_panels(void **state) {
    (void)state;
    cpu_pool *p = cpu_pool_create(2);
    const int shapes[][2] = {{64, 96}, {45, 37}, {100, 576}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int N = shapes[s][0], K = shapes[s][1], T = 100;
        void *W = weights(MD_TYPE_BF16, N, K);
        cpu_lin *lw = cpu_lin_pack(MD_TYPE_BF16, W, N, K, CPU_LIN_WBF16),
                *lf = cpu_lin_pack(MD_TYPE_BF16, W, N, K, CPU_LIN_F32);
        if (!lw || !lf) {
            assert_true(cpu_simd_level() < CPU_SIMD_AVX512VNNI);
            free(W);
            continue;
        }
        float *x = malloc(sizeof(float) * T * K), *a = malloc(sizeof(float) * T * N),
              *b = malloc(sizeof(float) * T * N);
        for (int i = 0; i < T * K; i++)
            x[i] = frnd();
        void *scratch = malloc(cpu_lin_scratch_size(K, 2));
        const int Ts[] = {1, 8, 13, 100};
        for (int ti = 0; ti < 4; ti++) {
            cpu_lin_run(p, lw, NULL, x, Ts[ti], a, CPU_LIN_SET, scratch);
            cpu_lin_run(p, lf, NULL, x, Ts[ti], b, CPU_LIN_SET, scratch);
            assert_memory_equal(a, b, sizeof(float) * Ts[ti] * N);
        }
        free(scratch), free(x), free(a), free(b), free(W);
        cpu_lin_free(lw);
        cpu_lin_free(lf);
    }
    cpu_pool_destroy(p);
}

/* SmolLM2's decoder shapes, BF16 weights packed in parts as backend_cpu.c does, in both of its
 * precisions (CPU_LIN_BF16 on AMX tiles where the CPU has them): each row reads back as
 * cpu_dequant_row's, the product is within float rounding of cpu_matmul_ref (double sums of
 * the same weights and x; for CPU_LIN_BF16, of cpu_lin_ref with x rounded to BF16), and token
 * 5's row is the same bits at n = 1, 8, 64 and with 1 or 2 threads. */
static void test_decoder_bf16_against_matmul_ref(void **state) {
    (void)state;
    const int shapes[][2] = {{576, 576}, {192, 576}, {1536, 576}, {576, 1536}};
    cpu_pool *p1 = cpu_pool_create(1), *p2 = cpu_pool_create(2);
    for (size_t s = 0; s < 2 * sizeof shapes / sizeof shapes[0]; s++) {
        int N = shapes[s / 2][0], K = shapes[s / 2][1], T = 64;
        int prec = s % 2 ? CPU_LIN_BF16 : CPU_LIN_WBF16; /* BF16: AMX where the CPU has it */
        void *W = weights(MD_TYPE_BF16, N, K);
        cpu_lin *l = cpu_lin_alloc(N, K, prec);
        if (!l) {
            assert_true(cpu_simd_level() < CPU_SIMD_AVX512VNNI ||
                        (prec == CPU_LIN_BF16 && !cpu_lin_bf16_ok()));
            free(W);
            continue;
        }
        for (int r = 0; r < N; r += 100) /* parts that do not end at a panel */
            assert_int_equal(cpu_lin_pack_rows(l, MD_TYPE_BF16, W, r, r + 100 < N ? r + 100 : N),
                             0);
        assert_int_equal(cpu_lin_pack_rows(l, MD_TYPE_BF16, W, 0, N + 1), -1);
        assert_int_equal(cpu_lin_pack_rows(l, MD_TYPE_Q8_0, W, 0, N), -1);
        float *row = malloc(sizeof(float) * K), *want = malloc(sizeof(float) * K);
        for (int r = 0; r < N; r += 7) {
            cpu_lin_row(l, r, row);
            cpu_dequant_row(MD_TYPE_BF16, (const uint16_t *)W + (size_t)r * K, want, K);
            assert_memory_equal(row, want, sizeof(float) * K);
        }
        float *x = malloc(sizeof(float) * T * K), *y = malloc(sizeof(float) * T * N),
              *ref = malloc(sizeof(float) * T * N), *one = malloc(sizeof(float) * N);
        for (int i = 0; i < T * K; i++)
            x[i] = frnd() * (1 + (i % 7 == 0) * 3.0f);
        void *scratch = malloc(cpu_lin_scratch_size(K, 2));
        cpu_lin_run(p2, l, NULL, x, T, y, CPU_LIN_SET, scratch);
        if (prec == CPU_LIN_WBF16)
            cpu_matmul_ref(MD_TYPE_BF16, W, N, K, x, T, ref);
        else
            cpu_lin_ref(MD_TYPE_BF16, W, N, K, NULL, x, T, ref, CPU_LIN_SET, CPU_LIN_BF16);
        for (int t = 0; t < T; t++)
            for (int n = 0; n < N; n++) {
                double s1 = 0;
                cpu_dequant_row(MD_TYPE_BF16, (const uint16_t *)W + (size_t)n * K, row, K);
                for (int k = 0; k < K; k++)
                    s1 += fabs((double)row[k] * x[(size_t)t * K + k]);
                size_t i = (size_t)t * N + n;
                if (!(fabs(y[i] - ref[i]) <= 2e-6 * s1 + 1e-6))
                    fail_msg("%d x %d: [%d][%d] = %.8g, want %.8g", N, K, t, n, y[i], ref[i]);
            }
        const int ns[] = {1, 8, 64};
        for (int ni = 0; ni < 3; ni++)
            for (int th = 1; th <= 2; th++) {
                float *yy = malloc(sizeof(float) * ns[ni] * N);
                int t0 = ns[ni] > 5 ? 0 : 5; /* token 5 first when it is alone */
                cpu_lin_run(th == 1 ? p1 : p2, l, NULL, x + (size_t)t0 * K, ns[ni], yy, CPU_LIN_SET,
                            scratch);
                memcpy(one, yy + (size_t)(5 - t0) * N, sizeof(float) * N);
                assert_memory_equal(one, y + (size_t)5 * N, sizeof(float) * N);
                free(yy);
            }
        free(scratch), free(x), free(y), free(ref), free(one), free(row), free(want), free(W);
        cpu_lin_free(l);
    }
    cpu_pool_destroy(p1);
    cpu_pool_destroy(p2);
}

/* The CPU backend's BF16 decoder weights (weight_wrap): matmul_n's SET, ACC and SWIGLU over
 * them equal the separate matmul, add and swiglu, and an embedding row is the weight's row;
 * below AVX-512 the weight is not copied (the plain layout) and the same holds. */
static void test_backend_bf16_weights(void **state) {
    (void)state;
    md_backend *be;
    md_err e = {0};
    assert_int_equal(md_backend_cpu_open(2, &be, &e), 0);
    int N = 96, K = 128, T = 20;
    md_reserve r = {.max_tokens = T,
                    .max_seqs = 1,
                    .max_cols = K,
                    .max_ctx = 16,
                    .max_blocks = 1,
                    .n_heads = 1};
    assert_int_equal(be->ops->reserve(be, &r, &e), 0);
    void *W0 = weights(MD_TYPE_BF16, N, K), *W1 = weights(MD_TYPE_BF16, N, K);
    size_t bytes = md_type_row_bytes(MD_TYPE_BF16, K) * N;
    md_buf *b0, *b1, *bx, *by[4];
    int copied;
    assert_int_equal(
        be->ops->weight_wrap(be, W0, bytes, MD_TYPE_BF16, K, N, NULL, NULL, &b0, &copied, &e), 0);
    assert_int_equal(copied, cpu_simd_level() >= CPU_SIMD_AVX512VNNI);
    assert_int_equal(
        be->ops->weight_wrap(be, W1, bytes, MD_TYPE_BF16, K, N, NULL, NULL, &b1, &copied, &e), 0);
    md_tensor w0 = {b0, 0, MD_TYPE_BF16, K, N, md_type_row_bytes(MD_TYPE_BF16, K)}, w1 = w0;
    w1.buf = b1;
    assert_int_equal(be->ops->buf_alloc(be, sizeof(float) * T * K, &bx, &e), 0);
    for (int i = 0; i < 4; i++)
        assert_int_equal(be->ops->buf_alloc(be, sizeof(float) * T * N, &by[i], &e), 0);
    float *x = malloc(sizeof(float) * T * K), *g = malloc(sizeof(float) * T * N),
          *u = malloc(sizeof(float) * T * N), *ref = malloc(sizeof(float) * T * N);
    for (int i = 0; i < T * K; i++)
        x[i] = frnd();
    assert_int_equal(be->ops->buf_upload(be, bx, 0, x, sizeof(float) * T * K, &e), 0);
    size_t ny = sizeof(float) * T * N;
    /* the separate ops */
    assert_int_equal(be->ops->matmul(be, &w0, bx, by[2], T, &e), 0);
    assert_int_equal(be->ops->matmul(be, &w1, bx, by[3], T, &e), 0);
    assert_int_equal(be->ops->buf_download(be, by[2], 0, g, ny, &e), 0);
    assert_int_equal(be->ops->buf_download(be, by[3], 0, u, ny, &e), 0);
    /* x rounded to BF16 too where the backend packs CPU_LIN_BF16 (cpu_lin_bf16_fast) */
    cpu_lin_ref(MD_TYPE_BF16, W0, N, K, NULL, x, T, ref, CPU_LIN_SET,
                cpu_lin_bf16_fast() ? CPU_LIN_BF16 : CPU_LIN_WBF16);
    for (int i = 0; i < T * N; i++)
        assert_true(fabs(g[i] - ref[i]) <= 1e-4 * (fabs(ref[i]) + 1));
    /* SET */
    const md_tensor *ws[2] = {&w0, &w1};
    md_buf *ys[2] = {by[0], by[1]};
    float *got = malloc(ny);
    assert_int_equal(be->ops->matmul_n(be, 2, ws, bx, ys, T, MD_MM_SET, &e), 0);
    assert_int_equal(be->ops->buf_download(be, by[0], 0, got, ny, &e), 0);
    assert_memory_equal(got, g, ny);
    /* ACC: y = 1 + x·W0ᵀ */
    float *ones = malloc(ny), *want = malloc(ny);
    for (int i = 0; i < T * N; i++)
        ones[i] = 1.0f, want[i] = 1.0f + g[i];
    assert_int_equal(be->ops->buf_upload(be, by[0], 0, ones, ny, &e), 0);
    assert_int_equal(be->ops->buf_upload(be, by[1], 0, ones, ny, &e), 0);
    assert_int_equal(be->ops->matmul_n(be, 2, ws, bx, ys, T, MD_MM_ACC, &e), 0);
    assert_int_equal(be->ops->buf_download(be, by[0], 0, got, ny, &e), 0);
    assert_memory_equal(got, want, ny);
    /* SWIGLU */
    for (int t = 0; t < T; t++)
        cpu_swiglu(want + (size_t)t * N, g + (size_t)t * N, u + (size_t)t * N, N);
    assert_int_equal(be->ops->matmul_n(be, 2, ws, bx, ys, T, MD_MM_SWIGLU, &e), 0);
    assert_int_equal(be->ops->buf_download(be, by[0], 0, got, ny, &e), 0);
    assert_memory_equal(got, want, ny);
    /* embedding rows from the packed copy */
    int32_t tok[2] = {0, N - 1}, zero[2] = {0, 0};
    md_batch bt = {.n_tokens = 2, .n_seqs = 1, .tokens = tok, .tok_seq = zero, .tok_pos = zero};
    assert_int_equal(be->ops->batch_prepare(be, &bt, &e), 0);
    assert_int_equal(be->ops->embed(be, &w0, by[2], &e), 0);
    assert_int_equal(be->ops->buf_download(be, by[2], 0, got, sizeof(float) * 2 * K, &e), 0);
    cpu_dequant_row(MD_TYPE_BF16, W0, want, K);
    cpu_dequant_row(MD_TYPE_BF16, (const uint16_t *)W0 + (size_t)(N - 1) * K, want + K, K);
    assert_memory_equal(got, want, sizeof(float) * 2 * K);
    free(got), free(ones), free(want), free(x), free(g), free(u), free(ref);
    be->ops->buf_free(be, bx);
    for (int i = 0; i < 4; i++)
        be->ops->buf_free(be, by[i]);
    be->ops->buf_free(be, b0);
    be->ops->buf_free(be, b1);
    free(W0);
    free(W1);
    md_backend_free(be);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_against_reference),
        cmocka_unit_test(test_same_bits_alone_or_packed),
        cmocka_unit_test(test_wbf16_equals_f32_panels),
        cmocka_unit_test(test_decoder_bf16_against_matmul_ref),
        cmocka_unit_test(test_backend_bf16_weights),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
