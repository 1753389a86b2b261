/* test_cpu_kernels.c — kernels/cpu: block layouts against llama.cpp's reference
 * dequantization (fixture made by the gguf Python package), every SIMD level's matmul
 * against the scalar reference for every weight type, odd shapes and n = 1..70, thread
 * counts, the threaded reference (cpu-exact) against the single-threaded one bit for bit,
 * vector ops against double-precision formulas, and the pool's synchronisation.
 *
 * Tolerances (stated, not tuned to pass):
 *  - quantized types vs cpu_matmul_ref (unquantized x, double): activation rounding adds
 *    at most |w_i|·d_i/2 per element (d_i = amax of x's block / 127), so
 *    |y - ref| <= 0.5·Σ|w_i|·d_i + 1e-5·Σ|w_i·x_i| + 1e-6;
 *  - same quantized x, SIMD level vs scalar level: float reassociation only,
 *    |y - y_scalar| <= 2e-5·Σ|w_i·x_i| + 1e-6 (Σ over the row; scales are the same);
 *  - float weight types vs ref: 1e-5·Σ|w_i·x_i| + 1e-6. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/dtype.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/quant_blocks.h"

static const int TYPES[] = {MD_TYPE_F32,  MD_TYPE_F16,  MD_TYPE_BF16, MD_TYPE_Q4_0, MD_TYPE_Q4_1,
                            MD_TYPE_Q5_0, MD_TYPE_Q8_0, MD_TYPE_Q4_K, MD_TYPE_Q5_K, MD_TYPE_Q6_K};
#define N_TYPES (int)(sizeof TYPES / sizeof TYPES[0])

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}
static float frnd(void) { return (float)rnd() / 4294967296.0f * 2.0f - 1.0f; } /* [-1,1) */

/* A positive or negative half in [2^-8, 2^-4): exponent 7..10, random mantissa. */
static uint16_t rnd_half_scale(void) {
    return (uint16_t)(((rnd() & 1) << 15) | ((7 + rnd() % 4) << 10) | (rnd() & 0x3ff));
}

static void put16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }

/* Fill a rows×cols matrix of type t with random but valid data. */
static void *rand_matrix(int t, int rows, int cols) {
    size_t rs = md_type_row_bytes(t, cols), total = rs * (size_t)rows;
    uint8_t *w = malloc(total);
    assert_non_null(w);
    for (size_t i = 0; i < total; i++)
        w[i] = (uint8_t)rnd();
    int bs = md_type_block(t);
    size_t bb = bs == 1 ? 0 : rs / (size_t)(cols / bs);
    for (size_t off = 0; off < total;) {
        switch (t) {
        case MD_TYPE_F32: {
            float f = frnd();
            memcpy(w + off, &f, 4);
            off += 4;
            break;
        }
        case MD_TYPE_F16: put16(w + off, (uint16_t)((rnd() & 0x8000) | ((12 + rnd() % 4) << 10) | (rnd() & 0x3ff))); off += 2; break;
        case MD_TYPE_BF16: {
            float f = frnd();
            uint32_t u;
            memcpy(&u, &f, 4);
            put16(w + off, (uint16_t)(u >> 16));
            off += 2;
            break;
        }
        case MD_TYPE_Q4_0:
        case MD_TYPE_Q5_0:
        case MD_TYPE_Q8_0: put16(w + off, rnd_half_scale()); off += bb; break;
        case MD_TYPE_Q4_1:
        case MD_TYPE_Q4_K:
        case MD_TYPE_Q5_K:
            put16(w + off, rnd_half_scale());
            put16(w + off + 2, rnd_half_scale());
            off += bb;
            break;
        case MD_TYPE_Q6_K: put16(w + off + 208, rnd_half_scale()); off += bb; break;
        default: fail();
        }
    }
    return w;
}

static float *rand_x(int n, int cols) {
    float *x = malloc(sizeof(float) * (size_t)n * cols);
    assert_non_null(x);
    for (int i = 0; i < n * cols; i++)
        x[i] = frnd() * (1 + (i % 7 == 0) * 3.0f); /* uneven magnitudes within a block */
    return x;
}

/* Per output: sum |w_i x_i| and the activation-rounding bound 0.5 Σ|w_i| d_i. */
static void bounds(int t, const void *W, int rows, int cols, const float *x, int n, double *mag,
                   double *qerr) {
    int qb = md_type_block(t) == 256 ? 256 : 32;
    int quant = md_type_block(t) > 1;
    float *wr = malloc(sizeof(float) * cols);
    for (int r = 0; r < rows; r++) {
        cpu_dequant_row(t, (const uint8_t *)W + (size_t)r * md_type_row_bytes(t, cols), wr, cols);
        for (int c = 0; c < n; c++) {
            const float *xr = x + (size_t)c * cols;
            double m = 0, q = 0;
            for (int b = 0; b < cols; b += qb) {
                double amax = 0, sw = 0;
                for (int i = b; i < b + qb && i < cols; i++) {
                    amax = fmax(amax, fabs(xr[i]));
                    sw += fabs(wr[i]);
                    m += fabs((double)wr[i] * xr[i]);
                }
                q += quant ? 0.5 * sw * amax / 127.0 : 0;
            }
            mag[(size_t)c * rows + r] = m;
            qerr[(size_t)c * rows + r] = q;
        }
    }
    free(wr);
}

static int levels[3], n_levels;

static int setup(void **state) {
    n_levels = 0;
    for (int l = CPU_SIMD_SCALAR; l <= cpu_simd_detect(); l++)
        levels[n_levels++] = l;
    return 0;
}

static int teardown(void **state) {
    cpu_simd_set(cpu_simd_detect());
    return 0;
}

/* One shape: every level against ref and against the scalar level. */
static void check_shape(cpu_pool *pool, int t, int rows, int cols, int n) {
    void *W = rand_matrix(t, rows, cols);
    float *x = rand_x(n, cols);
    size_t ny = (size_t)rows * n;
    float *ref = malloc(ny * 4), *ys = malloc(ny * 4), *y = malloc(ny * 4);
    double *mag = malloc(ny * 8), *qerr = malloc(ny * 8);
    size_t ss = cpu_matmul_scratch_size(t, cols, n);
    void *scratch = ss ? aligned_alloc(64, (ss + 63) / 64 * 64) : NULL;
    assert_true(ref && ys && y && mag && qerr && (ss == 0 || scratch));
    cpu_matmul_ref(t, W, rows, cols, x, n, ref);
    /* the threaded reference (cpu-exact's) is the same bits */
    for (size_t i = 0; i < ny; i++)
        y[i] = NAN;
    cpu_matmul_ref_mt(pool, t, W, rows, cols, x, n, y);
    assert_memory_equal(y, ref, ny * 4);
    bounds(t, W, rows, cols, x, n, mag, qerr);
    assert_int_equal(cpu_simd_set(CPU_SIMD_SCALAR), 0);
    cpu_matmul(NULL, t, W, rows, cols, x, n, ys, scratch);
    for (int li = 0; li < n_levels; li++) {
        assert_int_equal(cpu_simd_set(levels[li]), 0);
        for (size_t i = 0; i < ny; i++)
            y[i] = NAN;
        cpu_matmul(li == 0 ? NULL : pool, t, W, rows, cols, x, n, y, scratch);
        for (size_t i = 0; i < ny; i++) {
            double tol_ref = qerr[i] + 1e-5 * mag[i] + 1e-6;
            double tol_lvl = 2e-5 * mag[i] + 1e-6;
            if (!(fabs(y[i] - ref[i]) <= tol_ref) || !(fabs(y[i] - ys[i]) <= tol_lvl)) {
                print_error("type %d level %s rows %d cols %d n %d: y[%zu] = %.7g, ref %.7g "
                            "(tol %.3g), scalar %.7g (tol %.3g)\n",
                            t, cpu_simd_name(), rows, cols, n, i, y[i], ref[i], tol_ref, ys[i],
                            tol_lvl);
                fail();
            }
        }
    }
    free(W);
    free(x);
    free(ref);
    free(ys);
    free(y);
    free(mag);
    free(qerr);
    free(scratch);
}

static void test_matmul_every_type_level_and_odd_shape(void **state) {
    cpu_pool *pool = cpu_pool_create(3);
    assert_non_null(pool);
    static const int rows_list[] = {1, 3, 5, 17, 67};
    for (int ti = 0; ti < N_TYPES; ti++) {
        int t = TYPES[ti], bs = md_type_block(t);
        int cols_list[] = {bs == 256 ? 256 : 32, bs == 256 ? 768 : 96, bs == 256 ? 1280 : 576,
                           bs == 1 ? 13 : 3 * bs};
        for (int ri = 0; ri < 5; ri++)
            for (int ci = 0; ci < 4; ci++)
                check_shape(pool, t, rows_list[ri], cols_list[ci], 1 + (ri * 4 + ci) % 6);
    }
    cpu_pool_destroy(pool);
}

static void test_matmul_batch_sizes_1_to_70(void **state) {
    cpu_pool *pool = cpu_pool_create(2);
    assert_non_null(pool);
    for (int ti = 0; ti < N_TYPES; ti++) {
        int t = TYPES[ti], cols = md_type_block(t) == 256 ? 512 : 64;
        for (int n = 1; n <= 70; n++)
            check_shape(pool, t, 9, cols, n);
    }
    cpu_pool_destroy(pool);
}

/* The SmolLM2 shapes (Q4_1 layers, Q8_0 output head) at a prompt-sized batch. */
static void test_matmul_model_shapes_large_batch(void **state) {
    cpu_pool *pool = cpu_pool_create(2);
    assert_non_null(pool);
    check_shape(pool, MD_TYPE_Q4_1, 1536, 576, 37);
    check_shape(pool, MD_TYPE_Q4_1, 576, 1536, 70);
    check_shape(pool, MD_TYPE_Q8_0, 1000, 576, 3);
    cpu_pool_destroy(pool);
}

/* Gemma 3 270M's Q5_0 matrices (640 columns) with a row count off the 4-row tile and an odd
 * batch (a 1-row activation tail). */
static void test_matmul_q5_0_gemma3_shapes(void **state) {
    cpu_pool *pool = cpu_pool_create(2);
    check_shape(pool, MD_TYPE_Q5_0, 1026, 640, 3);
    check_shape(pool, MD_TYPE_Q5_0, 639, 2048, 1);
    cpu_pool_destroy(pool);
    cpu_simd_set(cpu_simd_detect());
}

/* Threads split rows, and results do not depend on how many threads there are. */
static void same_result_for_any_thread_count(int t, int cols) {
    int rows = 203, n = 11;
    void *W = rand_matrix(t, rows, cols);
    float *x = rand_x(n, cols);
    size_t ss = cpu_matmul_scratch_size(t, cols, n);
    void *scratch = aligned_alloc(64, (ss + 63) / 64 * 64);
    float *y1 = malloc(sizeof(float) * rows * n), *y2 = malloc(sizeof(float) * rows * n);
    cpu_matmul(NULL, t, W, rows, cols, x, n, y1, scratch);
    for (int nt = 2; nt <= 5; nt++) {
        cpu_pool *pool = cpu_pool_create(nt);
        assert_non_null(pool);
        assert_int_equal(cpu_pool_size(pool), nt);
        for (int rep = 0; rep < 20; rep++) {
            memset(y2, 0, sizeof(float) * rows * n);
            cpu_matmul(pool, t, W, rows, cols, x, n, y2, scratch);
            assert_memory_equal(y1, y2, sizeof(float) * rows * n);
        }
        cpu_pool_destroy(pool);
    }
    free(W);
    free(x);
    free(scratch);
    free(y1);
    free(y2);
}

static void test_matmul_same_result_for_any_thread_count(void **state) {
    same_result_for_any_thread_count(MD_TYPE_Q4_1, 192);
    same_result_for_any_thread_count(MD_TYPE_Q5_K, 512);
}

/* cpu_matmul_n against the unfused ops, bit for bit: SET is cpu_matmul per weight, ACC is
 * cpu_matmul then cpu_add, SWIGLU is two cpu_matmul then cpu_swiglu over each whole row. For
 * one activation class (Q/K/V of one type, a Q4_K/Q6_K mix) and mixed classes (the
 * one-product-per-weight fallback), decode and prompt batch sizes (n > 64: several
 * activation chunks), 1 and 3 threads, at every SIMD level. */
static void check_matmul_n(cpu_pool *pool, const int *types, const int *rows, int n_w, int cols,
                           int n, int mode) {
    void *W[CPU_MM_MAX];
    float *y[CPU_MM_MAX], *want[CPU_MM_MAX];
    cpu_mm_seg seg[CPU_MM_MAX];
    float *x = rand_x(n, cols);
    size_t ss = 64;
    for (int i = 0; i < n_w; i++) {
        size_t s = cpu_matmul_scratch_size(types[i], cols, n);
        ss = s > ss ? s : ss;
    }
    void *scratch = aligned_alloc(64, (ss + 63) / 64 * 64);
    float *tmp = malloc(sizeof(float) * (size_t)n * 4096);
    for (int i = 0; i < n_w; i++) {
        W[i] = rand_matrix(types[i], rows[i], cols);
        y[i] = malloc(sizeof(float) * (size_t)n * rows[i]);
        want[i] = malloc(sizeof(float) * (size_t)n * rows[i]);
        for (size_t k = 0; k < (size_t)n * rows[i]; k++)
            y[i][k] = want[i][k] = frnd(); /* the residual ACC adds to */
        seg[i] = (cpu_mm_seg){types[i], W[i], rows[i], y[i]};
    }
    for (int i = 0; i < n_w; i++) {
        size_t len = (size_t)n * rows[i];
        if (mode == CPU_MM_ACC) {
            cpu_matmul(pool, types[i], W[i], rows[i], cols, x, n, tmp, scratch);
            cpu_add(want[i], want[i], tmp, (int)len);
        } else
            cpu_matmul(pool, types[i], W[i], rows[i], cols, x, n, want[i], scratch);
    }
    if (mode == CPU_MM_SWIGLU)
        for (int c = 0; c < n; c++)
            cpu_swiglu(want[0] + (size_t)c * rows[0], want[0] + (size_t)c * rows[0],
                       want[1] + (size_t)c * rows[1], rows[0]);
    cpu_matmul_n(pool, seg, n_w, cols, x, n, mode, scratch);
    for (int i = 0; i < (mode == CPU_MM_SWIGLU ? 1 : n_w); i++) {
        if (memcmp(y[i], want[i], sizeof(float) * (size_t)n * rows[i]))
            fail_msg("matmul_n mode %d weight %d (type %d, %d x %d) n %d differs from the "
                     "unfused ops",
                     mode, i, types[i], rows[i], cols, n);
    }
    for (int i = 0; i < n_w; i++) {
        free(W[i]);
        free(y[i]);
        free(want[i]);
    }
    free(x);
    free(tmp);
    free(scratch);
}

static void test_matmul_n_equals_unfused_ops(void **state) {
    static const struct {
        int n_w, mode, types[3], rows[3], cols;
    } cases[] = {
        {3, CPU_MM_SET, {MD_TYPE_Q4_1, MD_TYPE_Q4_1, MD_TYPE_Q4_1}, {96, 32, 32}, 96}, /* Q/K/V */
        {3, CPU_MM_SET, {MD_TYPE_Q4_K, MD_TYPE_Q4_K, MD_TYPE_Q6_K}, {64, 20, 20}, 256},
        {3, CPU_MM_SET, {MD_TYPE_Q5_K, MD_TYPE_Q4_K, MD_TYPE_Q6_K}, {36, 12, 12}, 512},
        {3, CPU_MM_SET, {MD_TYPE_Q8_0, MD_TYPE_BF16, MD_TYPE_Q6_K}, {40, 8, 8}, 256},  /* mixed */
        {2, CPU_MM_SET, {MD_TYPE_F16, MD_TYPE_BF16}, {33, 7}, 64},
        {1, CPU_MM_ACC, {MD_TYPE_Q4_0}, {70}, 160},                                    /* wo */
        {3, CPU_MM_SET, {MD_TYPE_Q5_0, MD_TYPE_Q5_0, MD_TYPE_Q8_0}, {41, 9, 9}, 96},   /* Gemma 3 */
        {2, CPU_MM_SWIGLU, {MD_TYPE_Q5_0, MD_TYPE_Q4_K}, {21, 21}, 256},               /* mixed */
        {1, CPU_MM_ACC, {MD_TYPE_F32}, {13}, 32},
        {2, CPU_MM_ACC, {MD_TYPE_Q4_K, MD_TYPE_Q8_0}, {24, 16}, 256},
        {2, CPU_MM_SWIGLU, {MD_TYPE_Q4_1, MD_TYPE_Q4_1}, {150, 150}, 64},              /* gate/up */
        {2, CPU_MM_SWIGLU, {MD_TYPE_BF16, MD_TYPE_BF16}, {37, 37}, 32},
        {2, CPU_MM_SWIGLU, {MD_TYPE_Q4_K, MD_TYPE_Q8_0}, {45, 45}, 256},               /* mixed */
    };
    static const int ns[] = {1, 3, 8, 70};
    int n_levels = cpu_simd_detect() + 1;
    for (int th = 1; th <= 3; th += 2) {
        cpu_pool *pool = th > 1 ? cpu_pool_create(th) : NULL;
        for (int lv = 0; lv < n_levels; lv++) {
            assert_int_equal(cpu_simd_set(lv), 0);
            for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
                for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++)
                    check_matmul_n(pool, cases[k].types, cases[k].rows, cases[k].n_w,
                                   cases[k].cols, ns[ni], cases[k].mode);
        }
        cpu_pool_destroy(pool);
    }
    cpu_simd_set(cpu_simd_detect());
}

/* cpu_swiglu gives each element the same value wherever a span starts (the fused gate/up
 * product applies it to row ranges, the unfused op to thread ranges). */
static void test_swiglu_independent_of_span(void **state) {
    int n = 61;
    float g[61], u[61], whole[61], part[61];
    for (int i = 0; i < n; i++) {
        g[i] = 8.0f * frnd();
        u[i] = frnd();
    }
    int n_levels = cpu_simd_detect() + 1;
    for (int lv = 0; lv < n_levels; lv++) {
        assert_int_equal(cpu_simd_set(lv), 0);
        cpu_swiglu(whole, g, u, n);
        for (int cut = 1; cut < n; cut += 3) {
            cpu_swiglu(part, g, u, cut);
            cpu_swiglu(part + cut, g + cut, u + cut, n - cut);
            assert_memory_equal(part, whole, sizeof whole);
        }
    }
    cpu_simd_set(cpu_simd_detect());
}

/* Layouts: medley's dequantization equals the gguf package's on random blocks. */
static void test_dequant_matches_gguf_reference(void **state) {
    FILE *f = fopen(MEDLEY_FIXTURES "/kernels/blocks.bin", "rb");
    assert_non_null(f);
    int seen = 0;
    int32_t hdr[3];
    while (fread(hdr, 4, 3, f) == 3) {
        int t = hdr[0], ne = hdr[1], nb = hdr[2];
        assert_true(md_type_supported(t));
        assert_int_equal(md_type_row_bytes(t, ne), (size_t)nb);
        uint8_t *raw = malloc(nb);
        float *want = malloc(sizeof(float) * ne), *got = malloc(sizeof(float) * ne);
        assert_int_equal(fread(raw, 1, nb, f), (size_t)nb);
        assert_int_equal(fread(want, 4, ne, f), (size_t)ne);
        cpu_dequant_row(t, raw, got, ne);
        for (int i = 0; i < ne; i++) {
            if (fabsf(got[i] - want[i]) > 1e-6f * fabsf(want[i]) + 1e-12f) {
                print_error("type %d element %d: %g, gguf says %g\n", t, i, got[i], want[i]);
                fail();
            }
        }
        free(raw);
        free(want);
        free(got);
        seen++;
    }
    fclose(f);
    assert_int_equal(seen, 7);
}

/* Q5_0 as GGUF lays it out (ggml's block_q5_0): element j < 16 is the low nibble of qs[j],
 * element j + 16 its high nibble, and bit j of the little-endian uint32 qh is the fifth bit of
 * element j; the value is (q - 16)·d. Each element gets its own nibble and bit pattern here,
 * so a swapped half or a misplaced bit shows. */
static void test_dequant_q5_0_layout(void **state) {
    uint8_t blk[2 * 22];
    for (int b = 0; b < 2; b++) {
        uint8_t *p = blk + 22 * b;
        put16(p, b ? 0xC000 /* -2.0 */ : 0x3800 /* 0.5 */);
        uint32_t qh = b ? 0x0F0FA5C3u : 0x80000001u;
        memcpy(p + 2, &qh, 4); /* little-endian host: the file's order */
        for (int j = 0; j < 16; j++)
            p[6 + j] = (uint8_t)(((j * 7 + b) & 15) | ((15 - j) << 4));
    }
    float got[64];
    cpu_dequant_row(MD_TYPE_Q5_0, blk, got, 64);
    for (int b = 0; b < 2; b++) {
        uint32_t qh = b ? 0x0F0FA5C3u : 0x80000001u;
        float d = b ? -2.0f : 0.5f;
        for (int e = 0; e < 32; e++) {
            int nib = e < 16 ? (e * 7 + b) & 15 : 15 - (e - 16);
            int q = nib + 16 * (int)((qh >> e) & 1);
            assert_true(got[32 * b + e] == (float)(q - 16) * d);
        }
    }
    /* by hand: elements 0 and 31 are nibble 0 with the fifth bit, 16 is nibble 15 without */
    assert_true(got[0] == 0.0f && got[31] == 0.0f && got[16] == -0.5f);
}

/* Q5_K's reference dequantization (cpu_dequant_row, which the kernels are checked against)
 * equals the gguf package's on the blocks of tests/fixtures/gguf/dequant_Q5_K.bin (random
 * blocks with sane scales; edge blocks with zero, subnormal and maximal scales, every and
 * every other fifth bit set). File: "MDQF" | u32 type | u32 n | u32 0 | blocks | f32 ref[n]. */
static void test_dequant_q5_k_matches_gguf_package(void **state) {
    FILE *f = fopen(MEDLEY_FIXTURES "/gguf/dequant_Q5_K.bin", "rb");
    assert_non_null(f);
    char magic[4];
    uint32_t hdr[3];
    assert_int_equal(fread(magic, 1, 4, f), 4);
    assert_memory_equal(magic, "MDQF", 4);
    assert_int_equal(fread(hdr, 4, 3, f), 3);
    assert_int_equal(hdr[0], MD_TYPE_Q5_K);
    assert_int_equal(hdr[2], 0);
    int ne = (int)hdr[1];
    size_t nb = md_type_row_bytes(MD_TYPE_Q5_K, ne);
    assert_true(nb > 0);
    uint8_t *raw = malloc(nb);
    float *want = malloc(sizeof(float) * ne), *got = malloc(sizeof(float) * ne);
    assert_true(raw && want && got);
    assert_int_equal(fread(raw, 1, nb, f), nb);
    assert_int_equal(fread(want, 4, ne, f), (size_t)ne);
    fclose(f);
    cpu_dequant_row(MD_TYPE_Q5_K, raw, got, ne);
    for (int i = 0; i < ne; i++)
        if (!(fabsf(got[i] - want[i]) <= 4e-7f * fabsf(want[i]) + 1e-12f)) {
            print_error("Q5_K element %d: %.9g, gguf says %.9g\n", i, got[i], want[i]);
            fail();
        }
    free(raw);
    free(want);
    free(got);
}

static void test_matmul_check_rejects_bad_shapes(void **state) {
    assert_int_equal(cpu_matmul_check(MD_TYPE_Q5_0, 640), 0);
    assert_int_equal(cpu_matmul_check(MD_TYPE_Q5_0, 630), -1);
    assert_true(cpu_weight_type(MD_TYPE_Q5_0) && !cpu_weight_type(MD_TYPE_Q5_1));
    assert_true(cpu_matmul_scratch_size(MD_TYPE_Q5_0, 64, 3) >= 3 * (64 + 2 * 8));
    assert_int_equal(cpu_matmul_check(MD_TYPE_Q4_1, 576), 0);
    assert_int_equal(cpu_matmul_check(MD_TYPE_Q4_1, 570), -1);
    assert_int_equal(cpu_matmul_check(MD_TYPE_Q4_K, 576), -1);
    assert_int_equal(cpu_matmul_check(MD_TYPE_Q5_K, 512), 0);
    assert_int_equal(cpu_matmul_check(MD_TYPE_Q5_K, 576), -1);
    assert_int_equal(cpu_matmul_check(MD_TYPE_F32, 7), 0);
    assert_int_equal(cpu_matmul_check(MD_TYPE_F32, 0), -1);
    assert_int_equal(cpu_matmul_check(7 /* Q5_1: not supported */, 64), -1);
    assert_int_equal(cpu_matmul_check(-1, 64), -1);
    assert_int_equal(cpu_matmul_scratch_size(MD_TYPE_F16, 64, 3), 0);
    assert_true(cpu_matmul_scratch_size(MD_TYPE_Q4_0, 64, 3) >= 3 * (64 + 2 * 8));
}

/* MEDLEY_SIMD (set by test_cpu_kernels_scalar and by scripts/test.sh's per-level runs) caps
 * the level chosen at load; without it the level is the CPU's best. */
static void test_simd_env_caps_level(void **state) {
    const char *env = getenv("MEDLEY_SIMD");
    int want = cpu_simd_detect();
    if (env && !strcmp(env, "scalar"))
        want = CPU_SIMD_SCALAR;
    else if (env && !strcmp(env, "avx2") && want > CPU_SIMD_AVX2)
        want = CPU_SIMD_AVX2;
    static const char *const names[] = {"scalar", "avx2", "avx512vnni"};
    printf("MEDLEY_SIMD=%s: level %s (this CPU: up to %s)\n", env ? env : "(unset)",
           cpu_simd_name(), names[cpu_simd_detect()]);
    assert_int_equal(cpu_simd_level(), want);
}

static void test_simd_set_refuses_unsupported_level(void **state) {
    int was = cpu_simd_level();
    assert_int_equal(cpu_simd_set(-1), -1);
    assert_int_equal(cpu_simd_set(CPU_SIMD_AVX512VNNI + 1), -1);
    assert_int_equal(cpu_simd_set(CPU_SIMD_SCALAR), 0);
    assert_string_equal(cpu_simd_name(), "scalar");
    assert_int_equal(cpu_simd_set(was), 0); /* the rest of the run keeps the level it had */
    assert_int_equal(cpu_simd_level(), was);
}

/* ---- vector ops ---- */

static void check_close(const float *got, const double *want, int n, double rel, const char *what) {
    for (int i = 0; i < n; i++) {
        if (!(fabs(got[i] - want[i]) <= rel * fabs(want[i]) + 1e-7)) {
            print_error("%s (%s) [%d]: %.9g, want %.9g\n", what, cpu_simd_name(), i, got[i],
                        want[i]);
            fail();
        }
    }
}

static void test_vector_ops_match_double_formulas(void **state) {
    enum { MAXN = 1031 };
    static float a[MAXN], b[MAXN], w[MAXN], out[MAXN];
    static double want[MAXN];
    static const int sizes[] = {1, 7, 8, 9, 576, 1031};
    for (int li = 0; li < n_levels; li++) {
        assert_int_equal(cpu_simd_set(levels[li]), 0);
        for (int si = 0; si < 6; si++) {
            int n = sizes[si];
            for (int i = 0; i < n; i++) {
                a[i] = frnd() * 12; /* silu/exp over a wide range */
                b[i] = frnd();
                w[i] = frnd() + 1;
            }
            double ss = 0, dot = 0, mx = -INFINITY, se = 0;
            for (int i = 0; i < n; i++) {
                ss += (double)a[i] * a[i];
                dot += (double)a[i] * b[i];
                mx = fmax(mx, a[i]);
            }
            for (int i = 0; i < n; i++)
                want[i] = a[i] / sqrt(ss / n + 1e-5) * w[i];
            cpu_rmsnorm(out, a, w, n, 1e-5f);
            check_close(out, want, n, 1e-5, "rmsnorm");
            for (int i = 0; i < n; i++)
                want[i] = a[i] / (1 + exp(-(double)a[i])) * b[i];
            cpu_swiglu(out, a, b, n);
            check_close(out, want, n, 1e-5, "swiglu");
            for (int i = 0; i < n; i++) {
                double g = a[i];
                double z = 0.79788456080286535588 * (g + 0.044715 * g * g * g);
                want[i] = 0.5 * g * (1 + tanh(z)) * b[i];
            }
            cpu_geglu(out, a, b, n);
            check_close(out, want, n, 1e-5, "geglu");
            for (int i = 0; i < n; i++)
                want[i] = (double)a[i] + b[i];
            cpu_add(out, a, b, n);
            check_close(out, want, n, 1e-6, "add");
            double gotdot = cpu_dot_f32(a, b, n);
            double sabs = 0;
            for (int i = 0; i < n; i++)
                sabs += fabs((double)a[i] * b[i]);
            assert_true(fabs(gotdot - dot) <= 1e-6 * sabs + 1e-6);
            memcpy(out, b, sizeof(float) * n);
            cpu_axpy(out, 0.75f, a, n);
            for (int i = 0; i < n; i++)
                want[i] = b[i] + 0.75 * a[i];
            check_close(out, want, n, 1e-6, "axpy");
            memcpy(out, a, sizeof(float) * n);
            cpu_scale(out, -0.5f, n);
            for (int i = 0; i < n; i++)
                want[i] = -0.5 * a[i];
            check_close(out, want, n, 1e-7, "scale");
            for (int i = 0; i < n; i++)
                se += exp(a[i] - mx);
            for (int i = 0; i < n; i++)
                want[i] = exp(a[i] - mx) / se;
            memcpy(out, a, sizeof(float) * n);
            cpu_softmax(out, n);
            check_close(out, want, n, 1e-5, "softmax");
        }
    }
}

static void test_softmax_handles_extremes(void **state) {
    for (int li = 0; li < n_levels; li++) {
        assert_int_equal(cpu_simd_set(levels[li]), 0);
        float x[10] = {-INFINITY, 0, -1e30f, 1e30f, 88, -88, -200, 3, 3, -INFINITY};
        cpu_softmax(x, 10);
        double s = 0;
        for (int i = 0; i < 10; i++) {
            assert_true(isfinite(x[i]) && x[i] >= 0);
            s += x[i];
        }
        assert_true(fabs(s - 1) < 1e-6);
        assert_true(x[3] > 0.999f);
        float g[9] = {-100, -90, -20, 0, 20, 90, 100, 1e-30f, -1e-30f}, u[9], o[9];
        for (int i = 0; i < 9; i++)
            u[i] = 1;
        cpu_swiglu(o, g, u, 9);
        for (int i = 0; i < 9; i++) {
            double want = g[i] / (1 + exp(-(double)g[i]));
            assert_true(isfinite(o[i]) && fabs(o[i] - want) <= 1e-5 * fabs(want) + 1e-30);
        }
    }
}

/* The lowest index of the maximum, -1 for a NaN anywhere: every level against a plain loop, on
 * lengths around the vector widths, ties (also +0 / -0), -inf rows and a NaN at each end. */
static int argmax_want(const float *x, int n) {
    int best = 0;
    for (int i = 0; i < n; i++) {
        if (x[i] != x[i])
            return -1;
        if (x[i] > x[best])
            best = i;
    }
    return best;
}

static void test_argmax_lowest_index_of_max_every_level(void **state) {
    enum { MAXN = 1000 };
    static float x[MAXN];
    static const int sizes[] = {1, 7, 8, 9, 31, 32, 33, 40, 577, 1000};
    uint64_t rng = 7;
    for (int li = 0; li < n_levels; li++) {
        assert_int_equal(cpu_simd_set(levels[li]), 0);
        for (int si = 0; si < 10; si++) {
            int n = sizes[si];
            for (int trial = 0; trial < 40; trial++) {
                for (int i = 0; i < n; i++) {
                    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
                    /* few distinct values, so that ties are common */
                    x[i] = (float)((int)(rng >> 59) - 16) * (trial % 2 ? 0.5f : -1.0f);
                }
                if (trial == 3)
                    for (int i = 0; i < n; i++)
                        x[i] = -INFINITY;
                if (trial == 5)
                    for (int i = 0; i < n; i++)
                        x[i] = i % 3 ? -0.0f : 0.0f;
                if (trial == 7)
                    x[n - 1] = NAN;
                if (trial == 9)
                    x[0] = NAN;
                if (trial == 11)
                    x[n / 2] = INFINITY;
                int got = cpu_argmax_f32(x, n), want = argmax_want(x, n);
                if (got != want) {
                    print_error("argmax (%s) n %d trial %d: %d, want %d\n", cpu_simd_name(), n,
                                trial, got, want);
                    fail();
                }
            }
        }
        assert_int_equal(cpu_argmax_f32(x, 0), -1);
    }
    cpu_simd_set(cpu_simd_detect());
}

/* Paged attention: blocks out of order in the cache, against a double-precision formula. */
static void test_attention_paged_matches_double_formula(void **state) {
    enum { BT = 16, NBLK = 12, MAXPOS = NBLK * BT };
    static const int hds[] = {64, 128, 12, 8};
    static const int nposs[] = {1, 5, 16, 17, 100, MAXPOS};
    for (int li = 0; li < n_levels; li++) {
        assert_int_equal(cpu_simd_set(levels[li]), 0);
        for (int hi = 0; hi < 4; hi++) {
            int hd = hds[hi], kvh = 2, stride = 3 * hd; /* 3 KV heads per row, use head 2 */
            float *k = malloc(sizeof(float) * (size_t)MAXPOS * stride);
            float *v = malloc(sizeof(float) * (size_t)MAXPOS * stride);
            float q[128], out[128], sc[MAXPOS];
            double want[128], w[MAXPOS];
            int32_t bt[NBLK];
            for (int b = 0; b < NBLK; b++)
                bt[b] = (b * 5 + 3) % NBLK; /* a permutation: blocks scattered */
            for (int i = 0; i < MAXPOS * stride; i++) {
                k[i] = frnd();
                v[i] = frnd();
            }
            for (int i = 0; i < hd; i++)
                q[i] = frnd() * 2;
            for (int ni = 0; ni < 6; ni++) {
                /* odd cases slide: keys before p0 are masked (a window of npos - p0) */
                int npos = nposs[ni], p0 = ni % 2 ? npos / 3 : 0;
                double mx = -INFINITY, sum = 0;
                for (int p = p0; p < npos; p++) {
                    size_t slot = (size_t)bt[p / BT] * BT + p % BT;
                    double d = 0;
                    for (int i = 0; i < hd; i++)
                        d += (double)q[i] * k[slot * stride + kvh * hd + i];
                    w[p] = d * 0.125;
                    mx = fmax(mx, w[p]);
                }
                for (int p = p0; p < npos; p++)
                    sum += (w[p] = exp(w[p] - mx));
                for (int i = 0; i < hd; i++) {
                    want[i] = 0;
                    for (int p = p0; p < npos; p++) {
                        size_t slot = (size_t)bt[p / BT] * BT + p % BT;
                        want[i] += w[p] / sum * v[slot * stride + kvh * hd + i];
                    }
                }
                cpu_attention_paged(out, q, k + kvh * hd, v + kvh * hd, (size_t)stride, bt, BT, p0,
                                    npos, hd, 0.125f, sc);
                for (int i = 0; i < hd; i++) {
                    if (!(fabs(out[i] - want[i]) <= 1e-5)) {
                        print_error("attention (%s) hd %d p0 %d npos %d [%d]: %.7g want %.7g\n",
                                    cpu_simd_name(), hd, p0, npos, i, out[i], want[i]);
                        fail();
                    }
                }
            }
            free(k);
            free(v);
        }
    }
}

/* The F16 cache: conversion rounds to nearest even (F16C and C agree); halfway cases,
 * subnormals, overflow. (Attention over F16 rows: tests/unit/test_cpu_attention.c.) */
static void test_f16_rows_round_to_nearest_even(void **state) {
    for (int li = 0; li < n_levels; li++) {
        assert_int_equal(cpu_simd_set(levels[li]), 0);
        static const float edge[] = {1.0f, 1.00048828125f, 1.000732421875f, 65504.0f, 65520.0f,
                                     1e-7f, 6e-8f, 3e-8f, -2.5f, 0.0f, -0.0f, 1e30f};
        uint16_t h[12];
        cpu_f32_to_f16_row(h, edge, 12);
        for (int i = 0; i < 12; i++)
            assert_int_equal(h[i], md_fp32_to_fp16(edge[i]));
        assert_int_equal(md_fp32_to_fp16(1.00048828125f), 0x3c00); /* tie to even: down */
        assert_int_equal(md_fp32_to_fp16(1.000732421875f), 0x3c01);
        assert_int_equal(md_fp32_to_fp16(65520.0f), 0x7c00);      /* rounds to inf */
        float x[37];
        uint16_t y[37];
        for (int i = 0; i < 37; i++)
            x[i] = frnd() * 100;
        cpu_f32_to_f16_row(y, x, 37); /* a vector body and a tail */
        for (int i = 0; i < 37; i++)
            assert_int_equal(y[i], md_fp32_to_fp16(x[i]));
    }
}

/* ---- pool ---- */

typedef struct {
    atomic_int calls;
    atomic_int per_thread[8];
    int nth_seen;
} pool_ctx;

static void count_fn(void *vctx, int ith, int nth) {
    pool_ctx *c = vctx;
    atomic_fetch_add(&c->calls, 1);
    atomic_fetch_add(&c->per_thread[ith], 1);
    c->nth_seen = nth;
}

static void test_pool_runs_each_thread_once_per_job(void **state) {
    for (int nt = 1; nt <= 4; nt++) {
        cpu_pool *p = cpu_pool_create(nt);
        assert_non_null(p);
        pool_ctx c = {0};
        for (int job = 0; job < 5000; job++) {
            cpu_pool_run(p, count_fn, &c);
            /* every thread finished this job before run returned */
            assert_int_equal(atomic_load(&c.calls), (job + 1) * nt);
        }
        for (int i = 0; i < nt; i++)
            assert_int_equal(atomic_load(&c.per_thread[i]), 5000);
        assert_int_equal(c.nth_seen, nt);
        cpu_pool_destroy(p);
    }
    pool_ctx c = {0};
    cpu_pool_run(NULL, count_fn, &c);
    assert_int_equal(atomic_load(&c.calls), 1);
    assert_int_equal(cpu_pool_size(NULL), 1);
    cpu_pool_destroy(NULL);
}

/* Workers that went to sleep (idle past the spin window) wake for the next job. */
static void test_pool_wakes_sleeping_workers(void **state) {
    cpu_pool *p = cpu_pool_create(3);
    assert_non_null(p);
    pool_ctx c = {0};
    for (int job = 0; job < 4; job++) {
        struct timespec ts = {0, 3000000}; /* 3 ms > spin window */
        nanosleep(&ts, NULL);
        cpu_pool_run(p, count_fn, &c);
        assert_int_equal(atomic_load(&c.calls), (job + 1) * 3);
    }
    cpu_pool_destroy(p);
    p = cpu_pool_create(0);
    assert_non_null(p);
    assert_true(cpu_pool_size(p) >= 1);
    cpu_pool_destroy(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dequant_matches_gguf_reference),
        cmocka_unit_test(test_dequant_q5_0_layout),
        cmocka_unit_test(test_dequant_q5_k_matches_gguf_package),
        cmocka_unit_test(test_matmul_check_rejects_bad_shapes),
        cmocka_unit_test(test_simd_env_caps_level),
        cmocka_unit_test(test_simd_set_refuses_unsupported_level),
        cmocka_unit_test(test_matmul_every_type_level_and_odd_shape),
        cmocka_unit_test(test_matmul_batch_sizes_1_to_70),
        cmocka_unit_test(test_matmul_model_shapes_large_batch),
        cmocka_unit_test(test_matmul_q5_0_gemma3_shapes),
        cmocka_unit_test(test_matmul_same_result_for_any_thread_count),
        cmocka_unit_test(test_matmul_n_equals_unfused_ops),
        cmocka_unit_test(test_swiglu_independent_of_span),
        cmocka_unit_test(test_vector_ops_match_double_formulas),
        cmocka_unit_test(test_softmax_handles_extremes),
        cmocka_unit_test(test_argmax_lowest_index_of_max_every_level),
        cmocka_unit_test(test_attention_paged_matches_double_formula),
        cmocka_unit_test(test_f16_rows_round_to_nearest_even),
        cmocka_unit_test(test_pool_runs_each_thread_once_per_job),
        cmocka_unit_test(test_pool_wakes_sleeping_workers),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
