/* test_enc_gemm.c — the packed products of encoder steps (kernels/cpu/enc_gemm.c, cpu_lin_*)
 * against the scalar reference cpu_lin_ref: F32, F16 and BF16 weights; N and K that are not
 * multiples of the panel (32) or of the BF16 pair; 1 to 100 tokens (partial micro-tiles and
 * work items); the three epilogues (bias, bias + GELU, bias added to y); F32 products within
 * 2e-5 relative of the double sums, BF16 products within 1e-4 of the reference that rounds
 * the same operands to BF16. Also: a token's row is the same bits alone or among 100 others,
 * and with 1 or 2 threads. Where the CPU (or MEDLEY_SIMD) is below AVX-512 cpu_lin_pack
 * gives NULL and the test checks that it says so; BF16 likewise without AVX512-BF16. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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

static void check_case(cpu_pool *p, int t, int N, int K, int T, int epi, int bf16) {
    void *W = weights(t, N, K);
    float *x = malloc(sizeof(float) * T * K), *b = malloc(sizeof(float) * N);
    float *y = malloc(sizeof(float) * T * N), *want = malloc(sizeof(float) * T * N);
    for (int i = 0; i < T * K; i++)
        x[i] = frnd();
    for (int i = 0; i < N; i++)
        b[i] = frnd() * 0.1f;
    for (int i = 0; i < T * N; i++)
        y[i] = want[i] = frnd();
    cpu_lin *l = cpu_lin_pack(t, W, N, K, bf16);
    if (!l) {
        /* only allowed where the CPU lacks the instructions */
        assert_true(cpu_simd_level() < CPU_SIMD_AVX512VNNI || (bf16 && !cpu_lin_bf16_ok()));
        goto out;
    }
    size_t ss = cpu_lin_scratch_size(K, cpu_pool_size(p));
    void *scratch = malloc(ss);
    cpu_lin_run(p, l, b, x, T, y, epi, scratch);
    cpu_lin_ref(t, W, N, K, b, x, T, want, epi, bf16);
    double tol = bf16 ? 1e-4 : 2e-5;
    for (int i = 0; i < T * N; i++)
        if (!(fabs(y[i] - want[i]) <= tol * (fabs(want[i]) + sqrt((double)K) * 0.3)))
            fail_msg("type %d N %d K %d T %d epi %d bf16 %d: [%d][%d] = %.8g, want %.8g", t, N, K,
                     T, epi, bf16, i / N, i % N, y[i], want[i]);
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
    for (int bf16 = 0; bf16 < 2; bf16++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++)
                for (int epi = 0; epi < 3; epi++)
                    check_case(p, types[(s + ti + epi) % 3], shapes[s][0], shapes[s][1], Ts[ti],
                               epi, bf16);
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
    for (int bf16 = 0; bf16 < 2; bf16++) {
        cpu_lin *l = cpu_lin_pack(MD_TYPE_F32, W, N, K, bf16);
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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_against_reference),
        cmocka_unit_test(test_same_bits_alone_or_packed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
