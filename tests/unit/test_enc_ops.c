/* test_enc_ops.c — the CPU backend's encoder ops (kernels/backend.h: layernorm, gelu_erf,
 * embed_add, attention_enc) against double-precision formulas written here: LayerNorm with
 * bias, the exact erf GELU, position rows added at an offset, and block-diagonal
 * bidirectional attention over packed sequences of 1 to 70 tokens (a token never sees another
 * sequence's keys, and sees the keys after it). Tolerance: 1e-5 relative + 1e-6, float
 * accumulation against double. Also the refusals: a position past the table, a sequence
 * longer than the reserved context. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"

static uint64_t rs = 0x2545F4914F6CDD1Dull;
static float frnd(void) {
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (float)(rs >> 40) / 16777216.0f * 2.0f - 1.0f;
}

static md_backend *be;

static md_buf *buf_of(const float *x, size_t n) {
    md_buf *b;
    md_err e = {0};
    assert_int_equal(be->ops->buf_alloc(be, n * sizeof(float), &b, &e), 0);
    assert_int_equal(be->ops->buf_upload(be, b, 0, x, n * sizeof(float), &e), 0);
    return b;
}

static void get(md_buf *b, float *x, size_t n) {
    md_err e = {0};
    assert_int_equal(be->ops->buf_download(be, b, 0, x, n * sizeof(float), &e), 0);
}

static md_tensor vec(md_buf **keep, const float *x, int64_t ne0, int64_t ne1) {
    md_err e = {0};
    assert_int_equal(be->ops->buf_wrap(be, x, (size_t)(ne0 * ne1) * sizeof(float), keep, &e), 0);
    md_tensor t = {*keep, 0, MD_TYPE_F32, ne0, ne1, (size_t)ne0 * sizeof(float)};
    return t;
}

static void close_to(double got, double want) {
    if (fabs(got - want) > 1e-5 * fabs(want) + 1e-6)
        fail_msg("got %.9g, want %.9g", got, want);
}

#define MAXT 160
static int32_t tok[MAXT], seq[MAXT], pos[MAXT], slen[MAXT];

/* n_seqs sequences of the given lengths, packed, prepared on the backend. */
static int prepare(const int *lens, int n_seqs) {
    int T = 0;
    for (int s = 0; s < n_seqs; s++) {
        for (int p = 0; p < lens[s]; p++, T++) {
            tok[T] = 0;
            seq[T] = s;
            pos[T] = p;
        }
        slen[s] = lens[s];
    }
    md_batch b = {.n_tokens = T,
                  .n_seqs = n_seqs,
                  .tokens = tok,
                  .tok_seq = seq,
                  .tok_pos = pos,
                  .seq_len = slen};
    md_err e = {0};
    assert_int_equal(be->ops->batch_prepare(be, &b, &e), 0);
    return T;
}

static void test_layernorm_gelu(void **st) {
    enum { T = 5, C = 384 };
    static float x[T * C], w[C], bb[C], out[T * C];
    for (int i = 0; i < T * C; i++)
        x[i] = frnd() * 4 + 1;
    for (int i = 0; i < C; i++)
        w[i] = frnd(), bb[i] = frnd();
    md_buf *bx = buf_of(x, T * C), *bw, *bbias;
    md_tensor tw = vec(&bw, w, C, 1), tb = vec(&bbias, bb, C, 1);
    md_err e = {0};
    assert_int_equal(be->ops->layernorm(be, bx, &tw, &tb, bx, T, C, 1e-12f, &e), 0);
    get(bx, out, T * C);
    for (int t = 0; t < T; t++) {
        double m = 0, v = 0;
        for (int i = 0; i < C; i++)
            m += x[t * C + i];
        m /= C;
        for (int i = 0; i < C; i++)
            v += (x[t * C + i] - m) * (x[t * C + i] - m);
        v /= C;
        for (int i = 0; i < C; i++)
            close_to(out[t * C + i], (x[t * C + i] - m) / sqrt(v + 1e-12) * w[i] + bb[i]);
    }
    assert_int_equal(be->ops->buf_upload(be, bx, 0, x, sizeof x, &e), 0);
    assert_int_equal(be->ops->gelu_erf(be, bx, T * C, &e), 0);
    get(bx, out, T * C);
    for (int i = 0; i < T * C; i++)
        close_to(out[i], 0.5 * x[i] * (1 + erf(x[i] / sqrt(2.0))));
    be->ops->buf_free(be, bx);
    be->ops->buf_free(be, bw);
    be->ops->buf_free(be, bbias);
}

static void test_embed_add(void **st) {
    enum { C = 16, P = 12 };
    static float table[P * C], x[MAXT * C], out[MAXT * C];
    for (int i = 0; i < P * C; i++)
        table[i] = frnd();
    int lens[] = {3, 7, 1};
    int T = prepare(lens, 3);
    for (int i = 0; i < T * C; i++)
        x[i] = frnd();
    md_buf *bx = buf_of(x, (size_t)T * C), *bt;
    md_tensor tt = vec(&bt, table, C, P);
    md_err e = {0};
    assert_int_equal(be->ops->embed_add(be, &tt, 2, bx, &e), 0);
    get(bx, out, (size_t)T * C);
    for (int t = 0; t < T; t++)
        for (int c = 0; c < C; c++)
            close_to(out[t * C + c], x[t * C + c] + table[(pos[t] + 2) * C + c]);
    assert_int_equal(be->ops->embed_add(be, &tt, 6, bx, &e), MD_ERANGE); /* 6 + 6 >= 12 */
    assert_non_null(strstr(e.msg, "position"));
    be->ops->buf_free(be, bx);
    be->ops->buf_free(be, bt);
}

/* Reference: token t's head h over every token of its sequence, in double. */
static double ref_att(const float *q, const float *k, const float *v, int t, int h, int d, int H,
                      int D) {
    int lo = t, hi = t + 1;
    while (lo > 0 && seq[lo - 1] == seq[t])
        lo--;
    while (seq[hi] == seq[t] && pos[hi] > 0)
        hi++;
    double mx = -1e300, sum = 0, acc = 0, sc[MAXT];
    for (int j = lo; j < hi; j++) {
        double s = 0;
        for (int i = 0; i < D; i++)
            s += (double)q[(t * H + h) * D + i] * k[(j * H + h) * D + i];
        sc[j] = s / sqrt((double)D);
        mx = sc[j] > mx ? sc[j] : mx;
    }
    for (int j = lo; j < hi; j++)
        sum += exp(sc[j] - mx);
    for (int j = lo; j < hi; j++)
        acc += exp(sc[j] - mx) / sum * v[(j * H + h) * D + d];
    return acc;
}

static void test_attention_enc(void **st) {
    enum { H = 3, D = 8 };
    static float q[MAXT * H * D], k[MAXT * H * D], v[MAXT * H * D], out[MAXT * H * D];
    int lens[] = {1, 70, 2, 33, 5, 40};
    int T = prepare(lens, 6);
    seq[T] = -1; /* the reference's end marker */
    for (int i = 0; i < T * H * D; i++)
        q[i] = frnd() * 3, k[i] = frnd() * 3, v[i] = frnd();
    md_buf *bq = buf_of(q, (size_t)T * H * D), *bk = buf_of(k, (size_t)T * H * D),
           *bv = buf_of(v, (size_t)T * H * D), *bo = buf_of(out, (size_t)T * H * D);
    md_err e = {0};
    assert_int_equal(be->ops->attention_enc(be, bq, bk, bv, bo, H, D, 1.0f / sqrtf(D), &e), 0);
    get(bo, out, (size_t)T * H * D);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++)
            for (int d = 0; d < D; d++)
                close_to(out[(t * H + h) * D + d], ref_att(q, k, v, t, h, d, H, D));
    int too_long[] = {100};
    prepare(too_long, 1); /* reserved max_ctx is 80 */
    assert_int_equal(be->ops->attention_enc(be, bq, bk, bv, bo, H, D, 1.0f, &e), MD_ERANGE);
    md_buf *all[] = {bq, bk, bv, bo};
    for (int i = 0; i < 4; i++)
        be->ops->buf_free(be, all[i]);
}

static int setup(void **st) {
    md_err e = {0};
    if (md_backend_open("cpu:2", 2, &be, &e))
        return -1;
    md_reserve r = {MAXT, MAXT, 384, 80, 0, 3, 8};
    return be->ops->reserve(be, &r, &e);
}

static int teardown(void **st) {
    md_backend_free(be);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layernorm_gelu),
        cmocka_unit_test(test_embed_add),
        cmocka_unit_test(test_attention_enc),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
