/* test_cuda_encoder.c — encoder models on the CUDA backend against the CPU backend (the
 * reference, itself checked against double formulas by tests/unit/test_enc_ops.c).
 *
 * Op by op through backend.h, on one packed encoder step (sequences of 1, 5, 16, 17, 33 and 70
 * tokens end to end, no KV blocks): layernorm (rows of mean 3, in place and not), gelu_erf
 * (-6..6), embed_add (F32 and F16 position tables at an offset), attention_enc at head
 * dimensions 32, 48 (zero-padded in the kernel), 64 and 128, and the products around them
 * (matmul of F32 weights past the GEMV: cuBLAS SGEMM, add_bias); pool_enc in every mode,
 * normalised and not, against the host pooling (engine/embedder.h md_pool, md_l2_normalize).
 * Tolerance: 1e-5 of the rms of the reference (same math in float, other summation order;
 * pooling: 1e-6 relative). Refusals: a position outside the
 * table, a head dimension over the reserved one, a sequence whose tokens are not contiguous,
 * a reserve of head dimension 256.
 *
 * Then the whole path (engine/embedder.h: packing, forward, pooling, normalising) on
 * $MEDLEY_GPU_TEST_ENCODER (default synthetic:minilm-l6:f32, all-MiniLM-L6-v2's shape with
 * random weights; synthetic:bert-tiny:f32 with MEDLEY_GPU_TEST_SMALL, the emulator's), 48
 * inputs of 1 to 128 tokens (12 of 1 to 40 with MEDLEY_GPU_TEST_SMALL) packed into steps of
 * the model's context (512, 128) on cpu and on cuda:0: every
 * vector's cosine with the CPU's >= 0.9999 (the bar), the worst printed; and the same
 * model's F16 weights (cuBLAS GemmEx on F16 inputs) with its figure printed (>= 0.999).
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
#include <time.h>

#include "engine/embedder.h"
#include "engine/weights/quant.h"
#include "gpu/gpu_pair.h"
#include "kernels/backend.h"

enum { S = 6, T = 1 + 5 + 16 + 17 + 33 + 70, C = 384, NPOS = 130, MAXW = 512 };
static const int lens[S] = {1, 5, 16, 17, 33, 70};

static int32_t tokens[T], tok_seq[T], tok_pos[T];

typedef struct {
    md_tensor c, g;
} tpair;
static tpair wrap2(const void *data, int type, int64_t ne0, int64_t ne1) {
    md_buf *bc, *bg;
    return (tpair){wrap(cpu, data, type, ne0, ne1, &bc), wrap(gpu, data, type, ne0, ne1, &bg)};
}
static void unwrap2(tpair t) {
    cpu->ops->buf_free(cpu, t.c.buf);
    gpu->ops->buf_free(gpu, t.g.buf);
}

/* Both backends reserved for an encoder of head dimension up to 128 and prepared with the
 * packed step (positions 0.. within each sequence). */
static void prepare(void) {
    int t = 0;
    for (int s = 0; s < S; s++)
        for (int p = 0; p < lens[s]; p++, t++) {
            tok_seq[t] = s;
            tok_pos[t] = p;
            tokens[t] = (t * 37 + 11) % 300;
        }
    assert_int_equal(t, T);
    md_reserve r = {.max_tokens = T,
                    .max_seqs = S,
                    .max_cols = MAXW,
                    .max_ctx = C, /* as the encoder reserves it: the CPU's row scratch */
                    .n_heads = 12,
                    .enc_head_dim = 128};
    md_batch b = {
        .n_tokens = T, .n_seqs = S, .tokens = tokens, .tok_seq = tok_seq, .tok_pos = tok_pos};
    CHK(cpu->ops->reserve(cpu, &r, E));
    CHK(gpu->ops->reserve(gpu, &r, E));
    CHK(cpu->ops->batch_prepare(cpu, &b, E));
    CHK(gpu->ops->batch_prepare(gpu, &b, E));
}

static void test_layernorm_gelu_embed_add(void **state) {
    prepare();
    float *x = malloc((size_t)T * MAXW * 4), w[C], bias[C];
    fill(x, (size_t)T * C, 1.5f, 3.0f); /* rows of mean 3: the two-pass variance matters */
    fill(w, C, 0.5f, 1.0f);
    fill(bias, C, 0.2f, 0.0f);
    tpair tw = wrap2(w, MD_TYPE_F32, C, 1), tb = wrap2(bias, MD_TYPE_F32, C, 1);
    pair px = mk2(x, (size_t)T * C * 4), po = mk2(NULL, (size_t)T * C * 4);
    CHK(cpu->ops->layernorm(cpu, px.c, &tw.c, &tb.c, po.c, T, C, 1e-12f, E));
    CHK(gpu->ops->layernorm(gpu, px.g, &tw.g, &tb.g, po.g, T, C, 1e-12f, E));
    compare(po, (size_t)T * C, 1e-5, "layernorm");
    CHK(cpu->ops->layernorm(cpu, px.c, &tw.c, &tb.c, px.c, T, C, 1e-12f, E));
    CHK(gpu->ops->layernorm(gpu, px.g, &tw.g, &tb.g, px.g, T, C, 1e-12f, E));
    compare(px, (size_t)T * C, 1e-5, "layernorm in place");
    free2(po);
    unwrap2(tw);
    unwrap2(tb);

    fill(x, (size_t)T * C, 6.0f, 0.0f);
    CHK(cpu->ops->buf_upload(cpu, px.c, 0, x, (size_t)T * C * 4, E));
    CHK(gpu->ops->buf_upload(gpu, px.g, 0, x, (size_t)T * C * 4, E));
    CHK(cpu->ops->gelu_erf(cpu, px.c, (int64_t)T * C, E));
    CHK(gpu->ops->gelu_erf(gpu, px.g, (int64_t)T * C, E));
    compare(px, (size_t)T * C, 1e-5, "gelu_erf");

    /* position rows at offset 2 of a table of NPOS rows, F32 and F16 */
    float *pos = malloc((size_t)NPOS * C * 4);
    uint16_t *pos16 = malloc((size_t)NPOS * C * 2);
    fill(pos, (size_t)NPOS * C, 1.0f, 0.0f);
    md_err qe = {0};
    if (md_quantize(MD_TYPE_F16, pos, pos16, (int64_t)NPOS * C, &qe))
        fail_msg("%s", qe.msg);
    for (int f16 = 0; f16 <= 1; f16++) {
        tpair tp = wrap2(f16 ? (const void *)pos16 : pos, f16 ? MD_TYPE_F16 : MD_TYPE_F32, C, NPOS);
        CHK(cpu->ops->buf_upload(cpu, px.c, 0, x, (size_t)T * C * 4, E));
        CHK(gpu->ops->buf_upload(gpu, px.g, 0, x, (size_t)T * C * 4, E));
        CHK(cpu->ops->embed_add(cpu, &tp.c, 2, px.c, E));
        CHK(gpu->ops->embed_add(gpu, &tp.g, 2, px.g, E));
        compare(px, (size_t)T * C, 1e-6, f16 ? "embed_add F16" : "embed_add F32");
        md_err e = {0};
        /* sequence 5's position 69 + 61 = 130: one past the table */
        assert_int_equal(gpu->ops->embed_add(gpu, &tp.g, 61, px.g, &e), MD_ERANGE);
        assert_non_null(strstr(e.msg, "position 130"));
        unwrap2(tp);
    }
    free(pos);
    free(pos16);
    free2(px);
    free(x);
}

/* q, k, v [T, H * hd] random; the CUDA kernel against the CPU's per (sequence, head). */
static void test_attention_enc(void **state) {
    prepare();
    const int shapes[][2] = {{12, 32}, {4, 48}, {6, 64}, {3, 128}};
    float *h = malloc((size_t)T * C * 4);
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        int H = shapes[i][0], hd = shapes[i][1], W = H * hd;
        pair pq, pk, pv, po = mk2(NULL, (size_t)T * W * 4);
        fill(h, (size_t)T * W, 2.0f, 0.0f);
        pq = mk2(h, (size_t)T * W * 4);
        fill(h, (size_t)T * W, 2.0f, 0.0f);
        pk = mk2(h, (size_t)T * W * 4);
        fill(h, (size_t)T * W, 1.0f, 0.0f);
        pv = mk2(h, (size_t)T * W * 4);
        float scale = 1.0f / sqrtf((float)hd);
        CHK(cpu->ops->attention_enc(cpu, pq.c, pk.c, pv.c, po.c, H, hd, scale, E));
        CHK(gpu->ops->attention_enc(gpu, pq.g, pk.g, pv.g, po.g, H, hd, scale, E));
        char what[64];
        snprintf(what, sizeof what, "attention_enc %dx%d", H, hd);
        compare(po, (size_t)T * W, 1e-5, what);
        free2(pq);
        free2(pk);
        free2(pv);
        free2(po);
    }
    free(h);
}

/* Pooling on the device against the host's md_pool and md_l2_normalize (engine/embedder.h),
 * every mode, normalised and not. */
static void test_pool_enc(void **state) {
    prepare();
    float *x = malloc((size_t)T * C * 4), *want = malloc((size_t)S * C * 4),
          *got = malloc((size_t)S * C * 4);
    fill(x, (size_t)T * C, 1.0f, 0.1f);
    md_buf *bx = mk(gpu, x, (size_t)T * C * 4), *bo = mk(gpu, NULL, (size_t)S * C * 4);
    static const char *names[] = {"mean", "cls", "max", "mean-sqrt-len", "last"};
    for (int mode = MD_POOL_MEAN; mode <= MD_POOL_LAST; mode++)
        for (int norm = 0; norm <= 1; norm++) {
            for (int s = 0, t0 = 0; s < S; t0 += lens[s], s++) {
                md_pool((st_pooling)mode, x + (size_t)t0 * C, lens[s], C, want + (size_t)s * C);
                if (norm)
                    md_l2_normalize(want + (size_t)s * C, C);
            }
            CHK(gpu->ops->pool_enc(gpu, bx, bo, C, mode, norm, E));
            CHK(gpu->ops->buf_download(gpu, bo, 0, got, (size_t)S * C * 4, E));
            double worst = 0;
            for (size_t i = 0; i < (size_t)S * C; i++) {
                double d = fabs((double)want[i] - got[i]);
                if (!(d <= 4e-6 * (fabs(want[i]) + 1e-3)))
                    fail_msg("pool %s%s [%zu]: host %.9g, cuda %.9g", names[mode],
                             norm ? " normalised" : "", i, want[i], got[i]);
                worst = d > worst ? d : worst;
            }
            printf("encoder pool %s%s: max |host - cuda| %.2e\n", names[mode],
                   norm ? " normalised" : "", worst);
        }
    md_err e = {0};
    assert_int_equal(gpu->ops->pool_enc(gpu, bx, bo, C, 5, 0, &e), MD_EINVAL);
    gpu->ops->buf_free(gpu, bx);
    gpu->ops->buf_free(gpu, bo);
    free(x);
    free(want);
    free(got);
}

/* The products of an encoder layer: F32 weights past the GEMV (cuBLAS SGEMM) and a bias. */
static void test_linear_f32(void **state) {
    prepare();
    float *w = malloc((size_t)MAXW * C * 4), *x = malloc((size_t)T * C * 4), b[MAXW];
    fill(w, (size_t)MAXW * C, 0.05f, 0.0f);
    fill(x, (size_t)T * C, 1.0f, 0.0f);
    fill(b, MAXW, 0.1f, 0.0f);
    tpair tw = wrap2(w, MD_TYPE_F32, C, MAXW), tb = wrap2(b, MD_TYPE_F32, MAXW, 1);
    pair px = mk2(x, (size_t)T * C * 4), py = mk2(NULL, (size_t)T * MAXW * 4);
    CHK(cpu->ops->matmul(cpu, &tw.c, px.c, py.c, T, E));
    CHK(gpu->ops->matmul(gpu, &tw.g, px.g, py.g, T, E));
    CHK(cpu->ops->add_bias(cpu, py.c, &tb.c, T, E));
    CHK(gpu->ops->add_bias(gpu, py.g, &tb.g, T, E));
    compare(py, (size_t)T * MAXW, 1e-5, "matmul F32 + bias");
    free2(px);
    free2(py);
    unwrap2(tw);
    unwrap2(tb);
    free(w);
    free(x);
}

static void test_bad_steps_are_refused(void **state) {
    prepare();
    md_err e = {0};
    md_buf *q = mk(gpu, NULL, (size_t)T * 256 * 4);
    assert_int_equal(gpu->ops->attention_enc(gpu, q, q, q, q, 1, 256, 1.0f, &e), MD_ERANGE);
    assert_non_null(strstr(e.msg, "128 reserved"));
    gpu->ops->buf_free(gpu, q);
    /* sequence 0's tokens in two runs: more runs than sequences */
    int32_t seq[4] = {0, 1, 0, 1}, pos[4] = {0, 0, 1, 1};
    md_batch b = {.n_tokens = 4, .n_seqs = 2, .tokens = tokens, .tok_seq = seq, .tok_pos = pos};
    assert_int_equal(gpu->ops->batch_prepare(gpu, &b, &e), MD_ERANGE);
    assert_non_null(strstr(e.msg, "contiguous"));
    md_reserve r = {.max_tokens = 8,
                    .max_seqs = 2,
                    .max_cols = 64,
                    .max_ctx = 8,
                    .n_heads = 1,
                    .enc_head_dim = 256};
    assert_int_equal(gpu->ops->reserve(gpu, &r, &e), MD_EUNSUPP);
    assert_non_null(strstr(e.msg, "at most 128"));
}

/* cosine of two vectors of n */
static double cosine(const float *a, const float *b, int n) {
    double ab = 0, aa = 0, bb = 0;
    for (int i = 0; i < n; i++) {
        ab += (double)a[i] * b[i];
        aa += (double)a[i] * a[i];
        bb += (double)b[i] * b[i];
    }
    return ab / sqrt(aa * bb);
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The embedder on cpu and on device dev: the worst cosine over N inputs of 1..128 tokens. */
static double embed_both(const char *model, const char *dev, int n_in, int max_len,
                         double *cuda_s) {
    md_err e = {0};
    md_embedder *mc = NULL, *mg = NULL;
    /* steps of at least the model's context: 128 tokens for bert-tiny, so several here */
    md_embedder_opts oc = {.device = "cpu", .max_tokens = 128},
                     og = {.device = dev, .max_tokens = 128};
    if (md_embedder_open(model, &oc, &mc, &e) || md_embedder_open(model, &og, &mg, &e))
        fail_msg("%s", e.msg);
    assert_string_equal(md_embedder_device(mg), "cuda");
    int dim = md_embedder_dim(mc), V = md_embedder_n_vocab(mc), L = md_embedder_max_len(mc);
    if (L > max_len)
        L = max_len;
    int32_t **ids = calloc((size_t)n_in, sizeof *ids);
    int *ln = calloc((size_t)n_in, sizeof *ln);
    for (int i = 0; i < n_in; i++) {
        ln[i] = 1 + (i * 53 + 7) % L;
        ids[i] = malloc((size_t)ln[i] * sizeof **ids);
        for (int p = 0; p < ln[i]; p++)
            ids[i][p] = (int32_t)((i * 7919 + p * 104729 + 13) % V);
    }
    float *vc = malloc((size_t)n_in * dim * 4), *vg = malloc((size_t)n_in * dim * 4);
    if (md_embedder_run(mc, (const int32_t *const *)ids, ln, n_in, vc, &e))
        fail_msg("cpu: %s", e.msg);
    double t0 = now();
    if (md_embedder_run(mg, (const int32_t *const *)ids, ln, n_in, vg, &e))
        fail_msg("%s: %s", dev, e.msg);
    *cuda_s = now() - t0;
    double worst = 1;
    for (int i = 0; i < n_in; i++) {
        double c = cosine(vc + (size_t)i * dim, vg + (size_t)i * dim, dim);
        if (!(c >= worst))
            worst = c;
    }
    for (int i = 0; i < n_in; i++)
        free(ids[i]);
    free(ids);
    free(ln);
    free(vc);
    free(vg);
    md_embedder_close(mc);
    md_embedder_close(mg);
    return worst;
}

static void test_embedder_matches_cpu(void **state) {
    const char *dflt = gpu_test_env_on("MEDLEY_GPU_TEST_SMALL") ? "synthetic:bert-tiny:f32"
                                                                : "synthetic:minilm-l6:f32";
    const char *model = getenv("MEDLEY_GPU_TEST_ENCODER");
    if (!model || !*model)
        model = dflt;
    /* the emulator runs a few short inputs (a fiber per CUDA thread); a device 48 of up to 128 */
    int small = gpu_test_env_on("MEDLEY_GPU_TEST_SMALL"), n_in = small ? 12 : 48,
        max_len = small ? 40 : 128;
    double s = 0, worst = embed_both(model, "cuda:0", n_in, max_len, &s);
    printf("embed %s: cuda:0 vs cpu, %d inputs of 1 to %d tokens, worst cosine %.9f (1 - cos "
           "%.1e; %.3f s on cuda:0)\n",
           model, n_in, max_len, worst, 1 - worst, s);
    assert_true(worst >= 0.9999);
    size_t n = strlen(model);
    if (!strncmp(model, "synthetic:", 10) && n > 4 && !strcmp(model + n - 4, ":f32")) {
        char m16[256];
        snprintf(m16, sizeof m16, "%.*s:f16", (int)(n - 4), model);
        worst = embed_both(m16, "cuda:0", n_in, max_len, &s);
        printf("embed %s: cuda:0 vs cpu, %d inputs, worst cosine %.9f (1 - cos %.1e; F16 "
               "weights)\n",
               m16, n_in, worst, 1 - worst);
        assert_true(worst >= 0.999);
    }
}

int main(void) {
    int rc = gpu_pair_open();
    if (rc)
        return rc;
    gpu_test_filter_from_env();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layernorm_gelu_embed_add),
        cmocka_unit_test(test_attention_enc),
        cmocka_unit_test(test_linear_f32),
        cmocka_unit_test(test_pool_enc),
        cmocka_unit_test(test_bad_steps_are_refused),
        cmocka_unit_test(test_embedder_matches_cpu),
    };
    rc = cmocka_run_group_tests(tests, NULL, NULL);
    gpu_pair_close();
    return rc;
}
