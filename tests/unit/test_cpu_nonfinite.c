/* test_cpu_nonfinite.c — kernels/cpu's exponential-based ops on NaN, +-inf, and very large and
 * very small arguments, at every SIMD level the CPU has (cpu_simd_set): cpu_softmax,
 * cpu_swiglu, cpu_geglu, cpu_gelu_erf against their scalar level, and the tiled attention
 * (cpu_attention_tiled_f16) against its double reference.
 *
 * What is pinned down: a NaN input gives NaN where the scalar path gives NaN (vexp.h's clamps
 * once turned a NaN into e^-87.3 = 0, so a softmax over a NaN score became finite and a
 * faulty kernel went unnoticed); an infinity gives the scalar path's infinity or NaN; finite
 * results agree with the scalar path within the ops' stated tolerance (docs/kernels.md):
 *   |simd - scalar| <= 2e-5 |scalar| + 1e-6 * size
 * with size the magnitude the op's rounding is relative to (|g u| for the GLUs, whose scalar
 * tanh form loses digits in 1 + tanh z near -1; |x| for GELU; 1 for softmax weights). The
 * attention's data make every score exact in F32 (q a power of two times small integers,
 * k multiples of 1/16 in F16), so the only error is the exponential's and the sums'. */
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

#define N 19 /* two 8-lane chunks and a 3-element tail: both the vector and the tail path */

/* Specials and extremes, in vector lanes (0..15) and in the tail (16..18); 88.8 and -88.8
 * are just past expf's overflow, 87.5 just past the vector exp's underflow. */
static const float specials[N] = {0.5f,    -1.0f,  1e-30f, NAN,       INFINITY, -INFINITY, 88.8f,
                                  -88.8f,  87.5f,  -87.5f, 1e20f,     -1e20f,   -30.0f,    30.0f,
                                  -1e-30f, 200.0f, NAN,    -INFINITY, 3.0f};

static int levels(int *out) {
    int n = 0, best = cpu_simd_detect();
    for (int lv = CPU_SIMD_SCALAR; lv <= best; lv++)
        out[n++] = lv;
    return n;
}

/* got (level lv) against want (scalar level) element by element. */
static void check_like(const char *op, int lv, const float *got, const float *want,
                       const float *size, int n) {
    for (int i = 0; i < n; i++) {
        if (isnan(want[i])) {
            if (!isnan(got[i]))
                fail_msg("%s level %d [%d]: %g where the scalar path gives NaN", op, lv, i,
                         (double)got[i]);
        } else if (isinf(want[i])) {
            if (got[i] != want[i])
                fail_msg("%s level %d [%d]: %g where the scalar path gives %g", op, lv, i,
                         (double)got[i], (double)want[i]);
        } else {
            double tol = 2e-5 * fabs(want[i]) + 1e-6 * size[i];
            if (!isfinite(got[i]) || fabs((double)got[i] - want[i]) > tol)
                fail_msg("%s level %d [%d]: %.9g, scalar %.9g (tolerance %g)", op, lv, i,
                         (double)got[i], (double)want[i], tol);
        }
    }
}

enum { OP_SWIGLU, OP_GEGLU, OP_GELU };

/* out = op(g, u) at the level in use (GELU: of g alone, in place). */
static void run_op(int op, float *out, const float *g, const float *u) {
    switch (op) {
    case OP_SWIGLU: cpu_swiglu(out, g, u, N); break;
    case OP_GEGLU: cpu_geglu(out, g, u, N); break;
    default: memcpy(out, g, sizeof(float) * N); cpu_gelu_erf(out, N);
    }
}

static void test_activations_keep_nan_and_inf(void **state) {
    (void)state;
    static const char *names[] = {"swiglu", "geglu", "gelu_erf"};
    float u[N], size[N];
    int lv[3], nlv = levels(lv), keep = cpu_simd_level();
    for (int i = 0; i < N; i++)
        u[i] = i % 3 == 0 ? 2.0f : -0.5f;
    for (int op = OP_SWIGLU; op <= OP_GELU; op++) {
        float want[N], got[N];
        assert_int_equal(cpu_simd_set(CPU_SIMD_SCALAR), 0);
        run_op(op, want, specials, u);
        for (int i = 0; i < N; i++) {
            size[i] = fabsf(specials[i]) * (op == OP_GELU ? 1.0f : fabsf(u[i]));
            if (isnan(specials[i]) && !isnan(want[i]))
                fail_msg("%s scalar [%d]: NaN in, %g out", names[op], i, (double)want[i]);
        }
        for (int li = 0; li < nlv; li++) {
            assert_int_equal(cpu_simd_set(lv[li]), 0);
            run_op(op, got, specials, u);
            check_like(names[op], lv[li], got, want, size, N);
        }
    }
    /* a NaN in up only: the product is NaN whatever the gate */
    for (int li = 0; li < nlv; li++) {
        float g[N], un[N], out[N];
        assert_int_equal(cpu_simd_set(lv[li]), 0);
        for (int i = 0; i < N; i++) {
            g[i] = 0.25f * (float)(i - 9);
            un[i] = i == 5 || i == 17 ? NAN : 1.0f;
        }
        for (int op = OP_SWIGLU; op <= OP_GEGLU; op++) {
            run_op(op, out, g, un);
            if (!isnan(out[5]) || !isnan(out[17]))
                fail_msg("%s level %d: NaN up gave %g, %g", names[op], lv[li], (double)out[5],
                         (double)out[17]);
        }
    }
    cpu_simd_set(keep);
}

/* cpu_softmax over rows with one special each; a row of finite extremes against the scalar
 * weights; a NaN or +inf anywhere makes every weight NaN (the scalar path's answer), -inf is
 * a weight of 0. */
static void test_softmax_keeps_nan(void **state) {
    (void)state;
    static const float special[] = {NAN, INFINITY, -INFINITY};
    static const int at[] = {0, 3, 9, 15, 17}; /* vector lanes and the tail */
    int lv[3], nlv = levels(lv), keep = cpu_simd_level();
    float base[N], ones[N];
    for (int i = 0; i < N; i++) {
        base[i] = i % 2 ? -100.0f + 7.0f * (float)i : 1e-30f * (float)i; /* e^-100 .. e^26 */
        ones[i] = 1.0f;
    }
    for (size_t si = 0; si <= sizeof special / sizeof *special; si++)
        for (size_t ai = 0; ai < sizeof at / sizeof *at; ai++) {
            float want[N], got[N];
            memcpy(want, base, sizeof want);
            if (si < sizeof special / sizeof *special)
                want[at[ai]] = special[si];
            memcpy(got, want, sizeof got);
            assert_int_equal(cpu_simd_set(CPU_SIMD_SCALAR), 0);
            cpu_softmax(want, N);
            for (int i = 0; i < N; i++)
                if (si < 2 && !isnan(want[i]))
                    fail_msg("softmax scalar: %s at %d, weight %d is %g", si ? "+inf" : "NaN",
                             at[ai], i, (double)want[i]);
            float in[N];
            memcpy(in, got, sizeof in);
            for (int li = 0; li < nlv; li++) {
                memcpy(got, in, sizeof got);
                assert_int_equal(cpu_simd_set(lv[li]), 0);
                cpu_softmax(got, N);
                check_like("softmax", lv[li], got, want, ones, N);
            }
        }
    cpu_simd_set(keep);
}

/* The tiled attention over LEN positions of one KV head and G = 2 query heads (hd 64: every
 * level's own version), every token in one call, against the double reference. */
#define LEN 40
#define HD 64
#define G 2

typedef struct {
    uint16_t k[LEN * HD], v[LEN * HD];
    float q[LEN * G * HD];
} att_data;

static void att_fill(att_data *a, float qmag) {
    uint32_t s = 12345;
    for (int i = 0; i < LEN * HD; i++) {
        s = s * 1664525u + 1013904223u;
        a->k[i] = md_fp32_to_fp16((float)((int)(s >> 27) - 16) / 16.0f); /* [-1, 1) by 1/16 */
        s = s * 1664525u + 1013904223u;
        a->v[i] = md_fp32_to_fp16((float)(s >> 8) / 16777216.0f * 2.0f - 1.0f);
    }
    for (int i = 0; i < LEN * G * HD; i++) {
        s = s * 1664525u + 1013904223u;
        a->q[i] = qmag * (float)((int)(s >> 29) - 4); /* qmag x {-4..3} */
    }
}

/* Run every level on a; each output against the reference: NaN where it is NaN, within
 * 2e-5 * max|v| + 1e-6 where it is finite. Returns how many outputs were NaN. */
static int att_check(const att_data *a, const char *what) {
    static int32_t table[(LEN + 15) / 16];
    int32_t pos[LEN];
    float *out = malloc(sizeof(float) * LEN * G * HD), *ref = malloc(sizeof(float) * LEN * G * HD);
    float *scratch = malloc(cpu_attention_tiled_scratch(HD, LEN * G) * sizeof(float));
    assert_true(out && ref && scratch);
    for (int i = 0; i < (LEN + 15) / 16; i++)
        table[i] = i;
    for (int i = 0; i < LEN; i++)
        pos[i] = i;
    for (int t = 0; t < LEN; t++)
        for (int h = 0; h < G; h++)
            cpu_attention_ref_f16(ref + (size_t)(t * G + h) * HD, a->q + (size_t)(t * G + h) * HD,
                                  a->k, a->v, HD, table, 16, t, 0, HD, 0.125f);
    int lv[3], nlv = levels(lv), keep = cpu_simd_level(), nans = 0;
    for (int li = 0; li < nlv; li++) {
        assert_int_equal(cpu_simd_set(lv[li]), 0);
        memset(out, 0, sizeof(float) * LEN * G * HD);
        cpu_attention_tiled_f16(out, G * HD, a->q, G * HD, LEN, pos, G, a->k, a->v, HD, table, 16,
                                0, HD, 0.125f, scratch);
        for (int i = 0; i < LEN * G * HD; i++) {
            if (isnan(ref[i])) {
                nans += li == 0;
                if (!isnan(out[i]))
                    fail_msg("attention %s level %d: token %d: %g where the reference is NaN", what,
                             lv[li], i / (G * HD), (double)out[i]);
            } else if (!(fabs((double)out[i] - ref[i]) <= 2e-5 + 1e-6)) {
                fail_msg("attention %s level %d: token %d: %g, reference %g", what, lv[li],
                         i / (G * HD), (double)out[i], (double)ref[i]);
            }
        }
    }
    cpu_simd_set(keep);
    free(out);
    free(ref);
    free(scratch);
    return nans;
}

static void test_attention_keeps_nan(void **state) {
    (void)state;
    static att_data a;
    /* finite extremes: scores in the hundreds (most weights below e^-87.3: 0), and ~1e-30 */
    att_fill(&a, 64.0f);
    assert_int_equal(att_check(&a, "large scores"), 0);
    att_fill(&a, 0x1p-100f);
    assert_int_equal(att_check(&a, "tiny scores"), 0);
    /* a NaN in key 7: every token from 7 on is NaN in every head, the ones before are not */
    att_fill(&a, 1.0f);
    a.k[7 * HD + 3] = 0x7e00;
    assert_int_equal(att_check(&a, "NaN key"), (LEN - 7) * G * HD);
    /* a NaN in value 20's dimension 5: that dimension of tokens from 20 on */
    att_fill(&a, 1.0f);
    a.v[20 * HD + 5] = 0x7e00;
    assert_int_equal(att_check(&a, "NaN value"), (LEN - 20) * G);
    /* a NaN in one query row: that row only */
    att_fill(&a, 1.0f);
    a.q[(30 * G + 1) * HD + 9] = NAN;
    assert_int_equal(att_check(&a, "NaN query"), HD);
    /* key 12 of -inf against positive queries: a weight of 0 (finite); of +inf: NaN from 12 on */
    att_fill(&a, 1.0f);
    for (int i = 0; i < LEN * G * HD; i++)
        a.q[i] = fabsf(a.q[i]) + 0.5f;
    for (int d = 0; d < HD; d++)
        a.k[12 * HD + d] = 0xfc00; /* -inf */
    assert_int_equal(att_check(&a, "-inf key"), 0);
    for (int d = 0; d < HD; d++)
        a.k[12 * HD + d] = 0x7c00; /* +inf */
    assert_int_equal(att_check(&a, "+inf key"), (LEN - 12) * G * HD);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_activations_keep_nan_and_inf),
        cmocka_unit_test(test_softmax_keeps_nan),
        cmocka_unit_test(test_attention_keeps_nan),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
