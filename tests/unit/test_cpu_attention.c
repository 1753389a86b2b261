/* test_cpu_attention.c — kernels/cpu/attn_tiled.c: the blocked attention against the double
 * reference (cpu_attention_ref_f16) at every SIMD level the CPU has, over sequence lengths that
 * start and end inside key tiles, sliding windows shorter and longer than a tile, GQA ratios of
 * 1 to 6 query heads per KV head, head dimensions of every version (40: AVX2 and scalar only;
 * 64, 256) and a shuffled block table; then the property chunked prefill rests on: a row's
 * bits do not depend on the query tile it was computed in.
 *
 * Tolerance (stated, not tuned to pass): the kernel differs from the reference by F32
 * rounding of the scores and of the sums, and by the vector exponential (relative error below
 * 2e-7): |out - ref| <= 2e-5 * max|v| + 1e-6 per element, for |q·k| * scale below ~10 as the
 * data here (q, k, v uniform in [-1, 1)). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dtype.h"
#include "kernels/cpu/cpu_ops.h"

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

/* A paged F16 cache of n_kv heads of hd for `len` positions in blocks of bt tokens, the
 * blocks in shuffled order; queries for n_head heads at every position. */
typedef struct {
    int len, n_kv, G, hd, bt, nblk;
    size_t stride; /* halves per slot */
    uint16_t *k, *v;
    int32_t *table;
    float *q; /* [len][n_kv * G * hd] */
} cache;

static void cache_make(cache *c, int len, int n_kv, int G, int hd, int bt) {
    c->len = len;
    c->n_kv = n_kv;
    c->G = G;
    c->hd = hd;
    c->bt = bt;
    c->nblk = (len + bt - 1) / bt + 2;
    c->stride = (size_t)n_kv * hd;
    size_t slots = (size_t)c->nblk * bt;
    c->k = malloc(slots * c->stride * 2);
    c->v = malloc(slots * c->stride * 2);
    c->table = malloc((size_t)c->nblk * sizeof(int32_t));
    c->q = malloc((size_t)len * n_kv * G * hd * sizeof(float));
    assert_true(c->k && c->v && c->table && c->q);
    for (size_t i = 0; i < slots * c->stride; i++) {
        c->k[i] = md_fp32_to_fp16(frnd());
        c->v[i] = md_fp32_to_fp16(frnd());
    }
    for (int i = 0; i < c->nblk; i++)
        c->table[i] = i;
    for (int i = c->nblk - 1; i > 0; i--) {
        int j = (int)(rnd() % (uint32_t)(i + 1)), t = c->table[i];
        c->table[i] = c->table[j];
        c->table[j] = t;
    }
    for (size_t i = 0; i < (size_t)len * n_kv * G * hd; i++)
        c->q[i] = frnd();
}

static void cache_free(cache *c) {
    free(c->k);
    free(c->v);
    free(c->table);
    free(c->q);
}

/* Query tokens [t0, t0 + nt) of KV head h through the tiled kernel into out
 * rows [t0, t0 + nt) of [len][n_kv * G * hd] (the heads of h only). */
static void run_tile(const cache *c, int h, int t0, int nt, int window, float scale, float *out) {
    int qd = c->n_kv * c->G * c->hd;
    int32_t *pos = malloc((size_t)nt * sizeof *pos);
    float *scratch = malloc(cpu_attention_tiled_scratch(c->hd, nt * c->G) * sizeof(float));
    assert_true(pos && scratch);
    for (int i = 0; i < nt; i++)
        pos[i] = t0 + i;
    size_t off = (size_t)h * c->G * c->hd;
    cpu_attention_tiled_f16(out + (size_t)t0 * qd + off, (size_t)qd, c->q + (size_t)t0 * qd + off,
                            (size_t)qd, nt, pos, c->G, c->k + (size_t)h * c->hd,
                            c->v + (size_t)h * c->hd, c->stride, c->table, c->bt, window, c->hd,
                            scale, scratch);
    free(pos);
    free(scratch);
}

/* Every level this CPU runs (the level in use restored after). */
static int levels(int *out) {
    int n = 0, best = cpu_simd_detect();
    for (int lv = CPU_SIMD_SCALAR; lv <= best; lv++)
        out[n++] = lv;
    return n;
}

static void check_case(int len, int window, int n_kv, int G, int hd, int chunk) {
    cache c;
    cache_make(&c, len, n_kv, G, hd, 16);
    int qd = n_kv * G * hd, lv[3], nlv = levels(lv), keep = cpu_simd_level();
    float scale = 1.0f / sqrtf((float)hd);
    size_t n = (size_t)len * qd;
    float *out = malloc(n * sizeof(float)), *ref = malloc(n * sizeof(float));
    assert_true(out && ref);
    for (int t = 0; t < len; t++)
        for (int hq = 0; hq < n_kv * G; hq++)
            cpu_attention_ref_f16(ref + (size_t)t * qd + (size_t)hq * hd,
                                  c.q + (size_t)t * qd + (size_t)hq * hd,
                                  c.k + (size_t)(hq / G) * hd, c.v + (size_t)(hq / G) * hd,
                                  c.stride, c.table, c.bt, t, window, hd, scale);
    for (int li = 0; li < nlv; li++) {
        assert_int_equal(cpu_simd_set(lv[li]), 0);
        for (int h = 0; h < n_kv; h++)
            for (int t0 = 0; t0 < len; t0 += chunk)
                run_tile(&c, h, t0, len - t0 < chunk ? len - t0 : chunk, window, scale, out);
        double worst = 0;
        for (size_t i = 0; i < n; i++) {
            double err = fabs((double)out[i] - ref[i]);
            worst = err > worst ? err : worst;
        }
        if (worst > 2e-5 + 1e-6)
            fail_msg("len %d window %d kv %d G %d hd %d chunk %d level %d: error %g", len, window,
                     n_kv, G, hd, chunk, lv[li], worst);
    }
    cpu_simd_set(keep);
    free(out);
    free(ref);
    cache_free(&c);
}

static void test_tiled_matches_reference(void **state) {
    (void)state;
    static const int lens[] = {1, 17, 64, 100, 301};
    static const int windows[] = {0, 7, 64, 90};
    static const int gs[][2] = {{1, 1}, {3, 3}, {1, 4}, {2, 6}}; /* n_kv, G */
    static const int hds[] = {64, 256, 40};
    for (size_t a = 0; a < sizeof lens / sizeof *lens; a++)
        for (size_t w = 0; w < sizeof windows / sizeof *windows; w++)
            for (size_t g = 0; g < sizeof gs / sizeof *gs; g++)
                for (size_t h = 0; h < sizeof hds / sizeof *hds; h++) {
                    if (hds[h] == 256 && (lens[a] > 100 || gs[g][1] == 6))
                        continue; /* enough of the widest heads; keeps the test fast */
                    check_case(lens[a], windows[w], gs[g][0], gs[g][1], hds[h], 32);
                }
}

/* The rows of a 301-token prompt computed in tiles of 32, of 7, one at a time (decode) and in
 * one tile of all 301: the same bits at each level. */
static void test_row_bits_do_not_depend_on_the_tile(void **state) {
    (void)state;
    static const int chunks[] = {7, 1, 301};
    static const int hds[] = {64, 256, 40};
    for (size_t h = 0; h < sizeof hds / sizeof *hds; h++)
        for (int window = 0; window <= 90; window += 90) {
            cache c;
            cache_make(&c, 301, 1, 3, hds[h], 16);
            int qd = 3 * hds[h], lv[3], nlv = levels(lv), keep = cpu_simd_level();
            size_t n = (size_t)301 * qd;
            float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float));
            assert_true(a && b);
            for (int li = 0; li < nlv; li++) {
                assert_int_equal(cpu_simd_set(lv[li]), 0);
                for (int t0 = 0; t0 < 301; t0 += 32)
                    run_tile(&c, 0, t0, 301 - t0 < 32 ? 301 - t0 : 32, window, 0.125f, a);
                for (size_t ci = 0; ci < sizeof chunks / sizeof *chunks; ci++) {
                    memset(b, 0xff, n * sizeof(float));
                    for (int t0 = 0; t0 < 301; t0 += chunks[ci])
                        run_tile(&c, 0, t0, 301 - t0 < chunks[ci] ? 301 - t0 : chunks[ci], window,
                                 0.125f, b);
                    if (memcmp(a, b, n * sizeof(float)))
                        fail_msg("hd %d window %d level %d: tiles of %d differ from tiles of 32",
                                 hds[h], window, lv[li], chunks[ci]);
                }
            }
            cpu_simd_set(keep);
            free(a);
            free(b);
            cache_free(&c);
        }
}

/* Positions need not be consecutive, and a window of 1 reads the token itself only:
 * out = v of its own position. */
static void test_window_of_one_is_own_value(void **state) {
    (void)state;
    cache c;
    cache_make(&c, 80, 1, 2, 64, 16);
    int32_t pos[3] = {5, 40, 79};
    float q[3 * 2 * 64], out[3 * 2 * 64];
    for (int i = 0; i < 3; i++)
        memcpy(q + i * 128, c.q + (size_t)pos[i] * 128, 128 * sizeof(float));
    float *scratch = malloc(cpu_attention_tiled_scratch(64, 6) * sizeof(float));
    assert_non_null(scratch);
    cpu_attention_tiled_f16(out, 128, q, 128, 3, pos, 2, c.k, c.v, c.stride, c.table, 16, 1, 64,
                            0.125f, scratch);
    for (int i = 0; i < 3; i++) {
        size_t slot = (size_t)c.table[pos[i] / 16] * 16 + (size_t)(pos[i] % 16);
        for (int g = 0; g < 2; g++)
            for (int d = 0; d < 64; d++)
                assert_float_equal(out[i * 128 + g * 64 + d],
                                   md_fp16_to_fp32(c.v[slot * c.stride + (size_t)d]), 1e-6);
    }
    free(scratch);
    cache_free(&c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiled_matches_reference),
        cmocka_unit_test(test_row_bits_do_not_depend_on_the_tile),
        cmocka_unit_test(test_window_of_one_is_own_value),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
