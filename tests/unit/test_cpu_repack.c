/* test_cpu_repack.c — kernels/cpu/repack.c and repack_k.c: the packed layout of Q4_0, Q4_1,
 * Q5_0, Q8_0, Q4_K, Q5_K and Q6_K (a packed row dequantizes to the GGUF row's values exactly), the packed
 * product at every SIMD level against the scalar reference (cpu_matmul_ref) and against the plain
 * layout's scalar level, its independence from the batch size, the tiles and the thread count (bit
 * for bit), the fused modes over packed weights, and the refusals. Runs the same on a CPU with or
 * without AVX-512: every level the CPU has is forced in turn, and the scalar packed kernel is
 * always among them.
 *
 * Tolerances are test_cpu_kernels.c's (docs/kernels.md "Tolerances"):
 *  - vs cpu_matmul_ref: 0.5·Σ|w_i|·d_i + 1e-5·Σ|w_i·x_i| + 1e-6 (activation rounding);
 *  - vs the plain layout's scalar level (same quantized x): 2e-5·Σ|w_i·x_i| + 1e-6. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/dtype.h"
#include "kernels/cpu/cpu_ops.h"

static const int TYPES[] = {MD_TYPE_Q4_0, MD_TYPE_Q4_1, MD_TYPE_Q5_0, MD_TYPE_Q8_0,
                            MD_TYPE_Q4_K, MD_TYPE_Q5_K, MD_TYPE_Q6_K};
#define N_TYPES (int)(sizeof TYPES / sizeof TYPES[0])

static uint64_t rng_state = 0x2545F4914F6CDD1Dull;
static uint32_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}
static float frnd(void) {
    return (float)rnd() / 4294967296.0f * 2.0f - 1.0f;
}

static int is_k(int t) {
    return t == MD_TYPE_Q4_K || t == MD_TYPE_Q5_K || t == MD_TYPE_Q6_K;
}
/* Block size of t, which is also the activations' block (one scale per 32 or 256 of x). */
static int blk(int t) {
    return is_k(t) ? 256 : 32;
}

/* Random blocks with half scales (and Q4_1's m, Q4_K's dmin) of either sign in [2^-8, 2^-4)
 * (K types below 2^-6: their sub-block scales multiply it); the rest random bytes (Q6_K's
 * int8 scales, -128 included; Q4_K's packed six-bit scales and mins). */
static void *rand_matrix(int t, int rows, int cols) {
    size_t rs = md_type_row_bytes(t, cols), total = rs * (size_t)rows, bb = rs / (cols / blk(t));
    uint8_t *w = malloc(total);
    assert_non_null(w);
    for (size_t i = 0; i < total; i++)
        w[i] = (uint8_t)rnd();
    size_t d_at = t == MD_TYPE_Q6_K ? 208 : 0;
    for (size_t off = 0; off < total; off += bb)
        for (int k = 0; k < (t == MD_TYPE_Q4_1 || t == MD_TYPE_Q4_K || t == MD_TYPE_Q5_K ? 2 : 1);
             k++) {
            uint16_t h = (uint16_t)(((rnd() & 1) << 15) | ((7 + rnd() % (is_k(t) ? 2 : 4)) << 10) |
                                    (rnd() & 0x3ff));
            memcpy(w + off + d_at + 2 * k, &h, 2);
        }
    return w;
}

static float *rand_x(int n, int cols) {
    float *x = malloc(sizeof(float) * (size_t)n * cols);
    assert_non_null(x);
    for (int i = 0; i < n * cols; i++)
        x[i] = frnd() * (1 + (i % 7 == 0) * 3.0f);
    return x;
}

static void *packed(int t, const void *W, int rows, int cols) {
    size_t n = cpu_pack_size(t, rows, cols);
    assert_true(n >= md_type_row_bytes(t, cols) * (size_t)rows);
    void *p = aligned_alloc(64, (n + 63) / 64 * 64);
    assert_non_null(p);
    assert_int_equal(cpu_pack(t, W, rows, cols, p), 0);
    return p;
}

static void *scratch_for(int t, int cols, int n) {
    size_t ss = cpu_matmul_scratch_size(CPU_PACKED(t), cols, n);
    assert_int_equal(ss, cpu_matmul_scratch_size(t, cols, n));
    void *s = aligned_alloc(64, (ss + 63) / 64 * 64);
    assert_non_null(s);
    return s;
}

static void test_packed_row_equals_plain_row_whole_or_in_parts(void **state) {
    (void)state;
    static const int rows_list[] = {1, 15, 16, 17, 40};
    for (int ti = 0; ti < N_TYPES; ti++)
        for (int ri = 0; ri < 5; ri++) {
            int t = TYPES[ti], rows = rows_list[ri], cols = is_k(t) ? 512 : 96;
            void *W = rand_matrix(t, rows, cols), *P = packed(t, W, rows, cols);
            float a[512], b[512];
            for (int r = 0; r < rows; r++) {
                cpu_dequant_row(t, (const uint8_t *)W + (size_t)r * md_type_row_bytes(t, cols), a,
                                cols);
                cpu_packed_dequant_row(t, P, rows, cols, r, b);
                if (memcmp(a, b, sizeof(float) * cols))
                    fail_msg("type %d row %d of %d: the packed row differs", t, r, rows);
            }
            /* packed a group at a time (cpu_pack_groups, the backend's parts): the same bytes */
            size_t n = cpu_pack_size(t, rows, cols);
            uint8_t *Q = malloc(n);
            assert_non_null(Q);
            memset(Q, 0xA5, n);
            for (int g = 0; g < (rows + CPU_PACK_ROWS - 1) / CPU_PACK_ROWS; g++)
                assert_int_equal(cpu_pack_groups(t, W, rows, cols, g, g + 1, Q), 0);
            assert_memory_equal(P, Q, n);
            assert_int_equal(cpu_pack_groups(t, W, rows, cols, 0, 99, Q), -1);
            free(Q);
            free(W);
            free(P);
        }
}

/* Per output: Σ|w_i·x_i| (mag) and the activation rounding bound Σ_blocks 0.5·Σ|w|·amax/127
 * (qerr), the terms of the tolerances above. */
static void error_bounds(int t, const void *W, int rows, int cols, const float *x, int n,
                         double *mag, double *qerr) {
    float *wr = malloc(sizeof(float) * cols);
    assert_non_null(wr);
    for (int r = 0; r < rows; r++) {
        cpu_dequant_row(t, (const uint8_t *)W + (size_t)r * md_type_row_bytes(t, cols), wr, cols);
        for (int c = 0; c < n; c++) {
            double m = 0, q = 0;
            for (int b = 0; b < cols; b += blk(t)) {
                double amax = 0, sw = 0;
                for (int i = b; i < b + blk(t); i++) {
                    amax = fmax(amax, fabs(x[(size_t)c * cols + i]));
                    sw += fabs(wr[i]);
                    m += fabs((double)wr[i] * x[(size_t)c * cols + i]);
                }
                q += 0.5 * sw * amax / 127.0;
            }
            mag[(size_t)c * rows + r] = m;
            qerr[(size_t)c * rows + r] = q;
        }
    }
    free(wr);
}

/* One shape at every level: packed against the reference and the plain scalar level. */
static void check_packed(cpu_pool *pool, int t, int rows, int cols, int n) {
    void *W = rand_matrix(t, rows, cols), *P = packed(t, W, rows, cols);
    float *x = rand_x(n, cols);
    size_t ny = (size_t)rows * n;
    float *ref = malloc(ny * 4), *ys = malloc(ny * 4), *y = malloc(ny * 4);
    float *yp = malloc(ny * 4); /* the packed scalar kernel's: the SIMD packed kernels' reference */
    double *mag = malloc(ny * 8), *qerr = malloc(ny * 8);
    void *scratch = scratch_for(t, cols, n);
    assert_true(ref && ys && y && yp && mag && qerr);
    cpu_matmul_ref(t, W, rows, cols, x, n, ref);
    error_bounds(t, W, rows, cols, x, n, mag, qerr);
    assert_int_equal(cpu_simd_set(CPU_SIMD_SCALAR), 0);
    cpu_matmul(NULL, t, W, rows, cols, x, n, ys, scratch);
    for (int lv = 0; lv <= cpu_simd_detect(); lv++) {
        assert_int_equal(cpu_simd_set(lv), 0);
        for (size_t i = 0; i < ny; i++)
            y[i] = NAN;
        cpu_matmul(lv ? pool : NULL, CPU_PACKED(t), P, rows, cols, x, n, y, scratch);
        if (lv == 0)
            memcpy(yp, y, ny * 4);
        for (size_t i = 0; i < ny; i++) {
            double tol_ref = qerr[i] + 1e-5 * mag[i] + 1e-6, tol_lvl = 2e-5 * mag[i] + 1e-6;
            if (!(fabs(y[i] - ref[i]) <= tol_ref) || !(fabs(y[i] - ys[i]) <= tol_lvl) ||
                !(fabs(y[i] - yp[i]) <= tol_lvl))
                fail_msg("packed type %d level %s rows %d cols %d n %d: y[%zu] = %.7g, ref %.7g "
                         "(tol %.3g), plain scalar %.7g, packed scalar %.7g (tol %.3g)",
                         t, cpu_simd_name(), rows, cols, n, i, y[i], ref[i], tol_ref, ys[i], yp[i],
                         tol_lvl);
        }
    }
    cpu_simd_set(cpu_simd_detect());
    free(W);
    free(P);
    free(x);
    free(ref);
    free(ys);
    free(y);
    free(yp);
    free(mag);
    free(qerr);
    free(scratch);
}

static void test_packed_matmul_every_type_level_and_shape(void **state) {
    (void)state;
    cpu_pool *pool = cpu_pool_create(3);
    assert_non_null(pool);
    static const int rows_list[] = {1, 5, 16, 17, 67};
    static const int cols_list[] = {32, 96, 576}, cols_k[] = {256, 512, 1280};
    static const int ns[] = {1, 2, 3, 8, 9, 17, 70};
    for (int ti = 0; ti < N_TYPES; ti++)
        for (int ri = 0; ri < 5; ri++)
            for (int ci = 0; ci < 3; ci++)
                check_packed(pool, TYPES[ti], rows_list[ri],
                             is_k(TYPES[ti]) ? cols_k[ci] : cols_list[ci],
                             ns[(ri * 3 + ci + ti) % 7]);
    /* SmolLM2's shapes at a prompt-sized batch (two activation chunks) */
    check_packed(pool, MD_TYPE_Q4_1, 1536, 576, 70);
    check_packed(pool, MD_TYPE_Q4_1, 576, 1536, 9);
    /* Gemma 3 270M's Q6_K ffn_down and Q4_K attn_output columns, rows not a multiple of 16 */
    check_packed(pool, MD_TYPE_Q6_K, 90, 2048, 70);
    check_packed(pool, MD_TYPE_Q4_K, 93, 1024, 66);
    check_packed(pool, MD_TYPE_Q5_K, 93, 1024, 66);
    cpu_pool_destroy(pool);
}

/* A row's result is the same bits alone (decode), inside any batch (prefill) and over any
 * number of threads: the engine's seeded-sampling guarantee (docs/design.md) needs it. */
static void test_packed_independent_of_batch_and_threads(void **state) {
    (void)state;
    int rows = 203, n = 70;
    for (int ti = 0; ti < N_TYPES; ti++) {
        int t = TYPES[ti], cols = is_k(t) ? 512 : 192;
        void *W = rand_matrix(t, rows, cols), *P = packed(t, W, rows, cols);
        float *x = rand_x(n, cols);
        float *y1 = malloc(sizeof(float) * rows * n), *y2 = malloc(sizeof(float) * rows * n);
        void *scratch = scratch_for(t, cols, n);
        for (int lv = 0; lv <= cpu_simd_detect(); lv++) {
            assert_int_equal(cpu_simd_set(lv), 0);
            cpu_matmul(NULL, CPU_PACKED(t), P, rows, cols, x, n, y1, scratch);
            for (int c = 0; c < n; c += 23) {
                cpu_matmul(NULL, CPU_PACKED(t), P, rows, cols, x + (size_t)c * cols, 1, y2,
                           scratch);
                if (memcmp(y2, y1 + (size_t)c * rows, sizeof(float) * rows))
                    fail_msg("type %d level %s: row %d alone differs from the batch", t,
                             cpu_simd_name(), c);
            }
            for (int nt = 2; nt <= 4; nt++) {
                cpu_pool *pool = cpu_pool_create(nt);
                assert_non_null(pool);
                memset(y2, 0, sizeof(float) * rows * n);
                cpu_matmul(pool, CPU_PACKED(t), P, rows, cols, x, n, y2, scratch);
                if (memcmp(y1, y2, sizeof(float) * rows * n))
                    fail_msg("type %d level %s: %d threads differ from one", t, cpu_simd_name(),
                             nt);
                cpu_pool_destroy(pool);
            }
        }
        cpu_simd_set(cpu_simd_detect());
        free(W);
        free(P);
        free(x);
        free(y1);
        free(y2);
        free(scratch);
    }
}

/* cpu_matmul_n over packed weights (and packed beside plain ones) equals the unfused ops bit
 * for bit: ACC is cpu_matmul then cpu_add, SWIGLU two products then cpu_swiglu. */
static void test_packed_matmul_n_equals_unfused_ops(void **state) {
    (void)state;
    int rows = 37;
    static const int ns[] = {1, 9, 70};
    /* the 32-element types (Q4_1 beside Q8_0) and the K types (Q4_K beside Q6_K, Q5_K beside
     * Q4_K) */
    static const int pairs[3][3] = {{MD_TYPE_Q4_1, MD_TYPE_Q8_0, 96},
                                    {MD_TYPE_Q4_K, MD_TYPE_Q6_K, 256},
                                    {MD_TYPE_Q5_K, MD_TYPE_Q4_K, 512}};
    for (int lv = 0; lv <= cpu_simd_detect(); lv++)
        for (int pi = 0; pi < 3; pi++) {
            const int T0 = pairs[pi][0], T1 = pairs[pi][1], cols = pairs[pi][2];
            assert_int_equal(cpu_simd_set(lv), 0);
            cpu_pool *pool = cpu_pool_create(2);
            for (int ni = 0; ni < 3; ni++) {
                int n = ns[ni];
                void *W0 = rand_matrix(T0, rows, cols), *W1 = rand_matrix(T1, rows, cols);
                void *P0 = packed(T0, W0, rows, cols), *P1 = packed(T1, W1, rows, cols);
                float *x = rand_x(n, cols);
                size_t ny = (size_t)rows * n;
                float *g = malloc(ny * 4), *u = malloc(ny * 4), *wg = malloc(ny * 4),
                      *wu = malloc(ny * 4);
                void *scratch = scratch_for(T0, cols, n);
                /* SWIGLU: packed gate, plain up */
                cpu_matmul(pool, CPU_PACKED(T0), P0, rows, cols, x, n, wg, scratch);
                cpu_matmul(pool, T1, W1, rows, cols, x, n, wu, scratch);
                for (int c = 0; c < n; c++)
                    cpu_swiglu(wg + (size_t)c * rows, wg + (size_t)c * rows, wu + (size_t)c * rows,
                               rows);
                cpu_mm_seg sw[2] = {{CPU_PACKED(T0), P0, rows, g}, {T1, W1, rows, u}};
                cpu_matmul_n(pool, sw, 2, cols, x, n, CPU_MM_SWIGLU, scratch);
                assert_memory_equal(g, wg, ny * 4);
                /* ACC: both packed */
                for (size_t i = 0; i < ny; i++)
                    g[i] = wg[i] = frnd(), u[i] = wu[i] = frnd();
                float *tmp = malloc(ny * 4);
                cpu_matmul(pool, CPU_PACKED(T0), P0, rows, cols, x, n, tmp, scratch);
                cpu_add(wg, wg, tmp, (int)ny);
                cpu_matmul(pool, CPU_PACKED(T1), P1, rows, cols, x, n, tmp, scratch);
                cpu_add(wu, wu, tmp, (int)ny);
                cpu_mm_seg sa[2] = {{CPU_PACKED(T0), P0, rows, g}, {CPU_PACKED(T1), P1, rows, u}};
                cpu_matmul_n(pool, sa, 2, cols, x, n, CPU_MM_ACC, scratch);
                assert_memory_equal(g, wg, ny * 4);
                assert_memory_equal(u, wu, ny * 4);
                free(tmp);
                free(W0);
                free(W1);
                free(P0);
                free(P1);
                free(x);
                free(g);
                free(u);
                free(wg);
                free(wu);
                free(scratch);
            }
            cpu_pool_destroy(pool);
        }
    cpu_simd_set(cpu_simd_detect());
}

/* The 32-element block types, the ones with AMX kernels. */
static const int B32[] = {MD_TYPE_Q4_0, MD_TYPE_Q4_1, MD_TYPE_Q5_0, MD_TYPE_Q8_0};
#define N_B32 (int)(sizeof B32 / sizeof B32[0])

/* The AMX kernels (kernels/cpu/matmul_amx.c) give the AVX-512 packed kernels' bits for every
 * type, n (the tiles of 16, the rest on VNNI, two activation chunks) and thread count, set and
 * accumulated, and so stay within the reference's tolerance; the scalar packed level, forced,
 * and MEDLEY_SIMD-style lower levels turn AMX off. Skipped where the CPU or the OS lacks AMX. */
static void test_amx_packed_equals_vnni_bit_for_bit(void **state) {
    (void)state;
    if (!cpu_amx_detect() || cpu_simd_detect() < CPU_SIMD_AVX512VNNI) {
        print_message("[  SKIPPED ] no AMX-INT8 (or the OS refused the tile state): the AMX "
                      "kernels are not tested on this machine\n");
        assert_int_equal(cpu_amx_set(1), cpu_amx_detect() ? 0 : -1);
        return;
    }
    static const int ns[] = {1, 15, 16, 17, 64, 200};
    static const int shapes[][2] = {{37, 96}, {203, 576}, {16, 1056}};
    cpu_pool *pool = cpu_pool_create(3);
    assert_non_null(pool);
    assert_int_equal(cpu_simd_set(CPU_SIMD_AVX2), 0);
    assert_int_equal(cpu_amx_use(), 0);
    assert_int_equal(cpu_simd_set(CPU_SIMD_AVX512VNNI), 0);
    for (int ti = 0; ti < N_B32; ti++)
        for (int si = 0; si < 3; si++) {
            int t = B32[ti], rows = shapes[si][0], cols = shapes[si][1], n = 200;
            void *W = rand_matrix(t, rows, cols), *P = packed(t, W, rows, cols);
            float *x = rand_x(n, cols), *ref = malloc(sizeof(float) * rows * n);
            float *yv = malloc(sizeof(float) * rows * n), *ya = malloc(sizeof(float) * rows * n);
            float *ys = malloc(sizeof(float) * rows * n);
            void *scratch = scratch_for(t, cols, n);
            assert_true(ref && yv && ya && ys);
            cpu_matmul_ref(t, W, rows, cols, x, n, ref);
            double *mag = malloc(sizeof(double) * rows * n),
                   *qerr = malloc(sizeof(double) * rows * n);
            assert_true(mag && qerr);
            error_bounds(t, W, rows, cols, x, n, mag, qerr);
            for (int k = 0; k < 6; k++) {
                int nn = ns[k];
                assert_int_equal(cpu_simd_set(CPU_SIMD_SCALAR), 0);
                cpu_matmul(NULL, CPU_PACKED(t), P, rows, cols, x, nn, ys, scratch);
                assert_int_equal(cpu_simd_set(CPU_SIMD_AVX512VNNI), 0);
                assert_int_equal(cpu_amx_set(0), 0);
                assert_int_equal(cpu_amx_use(), 0);
                cpu_matmul(pool, CPU_PACKED(t), P, rows, cols, x, nn, yv, scratch);
                assert_int_equal(cpu_amx_set(1), 0);
                assert_int_equal(cpu_amx_use(), 1);
                for (int th = 0; th < 2; th++) {
                    for (size_t i = 0; i < (size_t)rows * nn; i++)
                        ya[i] = NAN;
                    cpu_matmul(th ? pool : NULL, CPU_PACKED(t), P, rows, cols, x, nn, ya, scratch);
                    if (memcmp(ya, yv, sizeof(float) * rows * nn))
                        fail_msg("AMX type %d rows %d cols %d n %d threads %d: differs from VNNI",
                                 t, rows, cols, nn, th ? 3 : 1);
                }
                for (size_t i = 0; i < (size_t)rows * nn; i++) {
                    double tol_ref = qerr[i] + 1e-5 * mag[i] + 1e-6, tol_lvl = 2e-5 * mag[i] + 1e-6;
                    if (!(fabs(ya[i] - ref[i]) <= tol_ref) || !(fabs(ya[i] - ys[i]) <= tol_lvl))
                        fail_msg("AMX type %d rows %d cols %d n %d: y[%zu] = %.7g, ref %.7g, "
                                 "scalar packed %.7g",
                                 t, rows, cols, nn, i, ya[i], ref[i], ys[i]);
                }
                /* accumulate: y += x·W^T, on VNNI and on AMX, from the same y */
                for (int amx = 0; amx < 2; amx++) {
                    float *dst = amx ? ya : yv;
                    for (size_t i = 0; i < (size_t)rows * nn; i++)
                        dst[i] = (float)(i % 13) * 0.25f;
                    assert_int_equal(cpu_amx_set(amx), 0);
                    cpu_mm_seg seg = {CPU_PACKED(t), P, rows, dst};
                    cpu_matmul_n(pool, &seg, 1, cols, x, nn, CPU_MM_ACC, scratch);
                }
                if (memcmp(ya, yv, sizeof(float) * rows * nn))
                    fail_msg("AMX type %d rows %d cols %d n %d: ACC differs from VNNI", t, rows,
                             cols, nn);
            }
            free(W);
            free(P);
            free(x);
            free(ref);
            free(yv);
            free(ya);
            free(ys);
            free(mag);
            free(qerr);
            free(scratch);
        }
    assert_int_equal(cpu_amx_set(1), 0);
    cpu_simd_set(cpu_simd_detect());
    cpu_pool_destroy(pool);
}

/* The two AMX users share a thread's tile registers: cpu_lin's BF16 tiles (enc_gemm.c, other
 * shapes) run between two int8 products, and each gives the bits it gives alone. */
static void test_amx_int8_and_bf16_tiles_interleaved(void **state) {
    (void)state;
    if (!cpu_amx_use() || !cpu_lin_amx_ok()) {
        print_message("[  SKIPPED ] no AMX-INT8/BF16 here: the shared tile state is not tested\n");
        return;
    }
    int rows = 48, cols = 576, n = 32, t = MD_TYPE_Q4_1;
    void *W = rand_matrix(t, rows, cols), *P = packed(t, W, rows, cols);
    float *x = rand_x(n, cols), *y0 = malloc(sizeof(float) * rows * n);
    float *y1 = malloc(sizeof(float) * rows * n), *wf = malloc(sizeof(float) * rows * cols);
    float *z0 = malloc(sizeof(float) * rows * n), *z1 = malloc(sizeof(float) * rows * n);
    void *scratch = scratch_for(t, cols, n), *ls = malloc(cpu_lin_scratch_size(cols, 1));
    assert_true(y0 && y1 && wf && z0 && z1 && ls);
    for (int i = 0; i < rows * cols; i++)
        wf[i] = frnd();
    cpu_lin *l = cpu_lin_pack(MD_TYPE_F32, wf, rows, cols, CPU_LIN_BF16);
    assert_non_null(l);
    cpu_matmul(NULL, CPU_PACKED(t), P, rows, cols, x, n, y0, scratch);
    cpu_lin_run(NULL, l, NULL, x, n, z0, CPU_LIN_SET, ls);
    cpu_matmul(NULL, CPU_PACKED(t), P, rows, cols, x, n, y1, scratch);
    cpu_lin_run(NULL, l, NULL, x, n, z1, CPU_LIN_SET, ls);
    assert_memory_equal(y0, y1, sizeof(float) * rows * n);
    assert_memory_equal(z0, z1, sizeof(float) * rows * n);
    cpu_lin_free(l);
    free(W);
    free(P);
    free(x);
    free(y0);
    free(y1);
    free(wf);
    free(z0);
    free(z1);
    free(scratch);
    free(ls);
}

/* Q5_K at its extremes: every quant 31 (nibbles and fifth bits all set), every six-bit scale
 * and min 63, against activations that quantize to ±127 everywhere: a sub-block's 32 products
 * reach 31·127·32 = 125,984, past int16, so a kernel that sums more than 4 maddubs groups in
 * int16 (the AVX2 packed kernel does 8 for Q4_K) is caught here where random data is not.
 * Plain and packed, every level, against the reference. */
static void test_q5_k_extreme_quants_every_level(void **state) {
    (void)state;
    int t = MD_TYPE_Q5_K, rows = 21, cols = 512, n = 3;
    size_t rs = md_type_row_bytes(t, cols);
    uint8_t *W = malloc(rs * rows);
    assert_non_null(W);
    memset(W, 0xFF, rs * rows);
    for (size_t off = 0; off < rs * rows; off += 176) {
        uint16_t d = 0x2000 | (uint16_t)(rnd() & 0x3ff), dmin = 0x1c00; /* ~2^-7, 2^-8 */
        memcpy(W + off, &d, 2);
        memcpy(W + off + 2, &dmin, 2);
    }
    float *x = malloc(sizeof(float) * n * cols), *ref = malloc(sizeof(float) * rows * n),
          *y = malloc(sizeof(float) * rows * n);
    assert_true(x && ref && y);
    for (int i = 0; i < n * cols; i++)
        x[i] = i / cols == 1 ? -0.5f : 0.75f; /* rows 0, 2: +127; row 1: -127 */
    void *P = packed(t, W, rows, cols), *scratch = scratch_for(t, cols, n);
    cpu_matmul_ref(t, W, rows, cols, x, n, ref);
    for (int lv = 0; lv <= cpu_simd_detect(); lv++) {
        assert_int_equal(cpu_simd_set(lv), 0);
        for (int pk = 0; pk < 2; pk++) {
            cpu_matmul(NULL, pk ? CPU_PACKED(t) : t, pk ? P : W, rows, cols, x, n, y, scratch);
            for (int i = 0; i < rows * n; i++)
                if (!(fabsf(y[i] - ref[i]) <= 1e-5f * fabsf(ref[i]) + 1e-4f))
                    fail_msg("Q5_K %s level %s: y[%d] = %.7g, reference %.7g",
                             pk ? "packed" : "plain", cpu_simd_name(), i, y[i], ref[i]);
        }
    }
    cpu_simd_set(cpu_simd_detect());
    free(W);
    free(P);
    free(x);
    free(ref);
    free(y);
    free(scratch);
}

static void test_pack_refuses_types_and_shapes_without_a_layout(void **state) {
    (void)state;
    uint8_t buf[4096] = {0}, dst[4096];
    assert_int_equal(cpu_pack_size(MD_TYPE_F16, 16, 256), 0);
    assert_int_equal(cpu_pack_size(MD_TYPE_BF16, 16, 64), 0);
    assert_int_equal(cpu_pack_size(MD_TYPE_Q4_1, 16, 48), 0);
    assert_int_equal(cpu_pack_size(MD_TYPE_Q4_1, 0, 64), 0);
    assert_int_equal(cpu_pack_size(MD_TYPE_Q4_K, 16, 128), 0);
    assert_int_equal(cpu_pack(MD_TYPE_Q6_K, buf, 1, 320, dst), -1);
    assert_int_equal(cpu_pack(MD_TYPE_F32, buf, 1, 256, dst), -1);
    assert_int_equal(cpu_pack(MD_TYPE_Q8_0, buf, 1, 33, dst), -1);
    assert_int_equal(cpu_pack_size(MD_TYPE_Q4_1, 17, 64), 2 * 2 * 320);
    assert_int_equal(cpu_pack_size(MD_TYPE_Q4_K, 17, 512), 2 * 2 * 2368);
    assert_int_equal(cpu_pack_size(MD_TYPE_Q5_K, 17, 512), 2 * 2 * 2880);
    assert_int_equal(cpu_pack_size(MD_TYPE_Q5_K, 16, 320), 0);
    assert_int_equal(cpu_pack_wanted(MD_TYPE_Q5_K), cpu_simd_level() >= CPU_SIMD_AVX2);
    assert_int_equal(cpu_pack_size(MD_TYPE_Q6_K, 16, 256), 16 * 210);
    assert_int_equal(cpu_matmul_check(CPU_PACKED(MD_TYPE_Q4_K), 256), 0);
    assert_int_equal(cpu_matmul_check(CPU_PACKED(MD_TYPE_Q6_K), 128), -1);
    assert_int_equal(cpu_matmul_check(CPU_PACKED(MD_TYPE_Q5_0), 64), 0);
    assert_int_equal(cpu_matmul_check(CPU_PACKED(MD_TYPE_F16), 64), -1);
    assert_int_equal(cpu_pack_wanted(MD_TYPE_Q6_K), cpu_simd_level() >= CPU_SIMD_AVX2);
    assert_int_equal(cpu_pack_wanted(MD_TYPE_BF16), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_packed_row_equals_plain_row_whole_or_in_parts),
        cmocka_unit_test(test_q5_k_extreme_quants_every_level),
        cmocka_unit_test(test_packed_matmul_every_type_level_and_shape),
        cmocka_unit_test(test_packed_independent_of_batch_and_threads),
        cmocka_unit_test(test_packed_matmul_n_equals_unfused_ops),
        cmocka_unit_test(test_pack_refuses_types_and_shapes_without_a_layout),
        cmocka_unit_test(test_amx_packed_equals_vnni_bit_for_bit),
        cmocka_unit_test(test_amx_int8_and_bf16_tiles_interleaved),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
