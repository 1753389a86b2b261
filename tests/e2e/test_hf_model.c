/* test_hf_model.c — a Hugging Face directory (SmolLM2-135M as BF16 safetensors, made at test
 * time by tests/fixtures/hf/make_hf_smollm2.py into $MEDLEY_HF_DIR) loaded through
 * md_model_open: its logits against the float64 reference computed by that script over the
 * same BF16 weights with transformers' rotate-half RoPE on the HF q/k layout.
 *
 * Tolerance. The weights are the same BF16 numbers on both sides, so the only difference is
 * arithmetic: float32 accumulation and the F16 KV cache here vs float64 there. The CPU paths
 * multiply BF16 weights by float activations (no 8-bit activation quantization, unlike the
 * quantized kernels), so the logits stay close: measured max |error| over the top-20 values
 * of every position < 5e-5 (cpu-exact, F32 KV) and 0.019 (cpu, F16 KV, AVX2; 0.011 scalar) on
 * magnitudes ~20; AVX-512's packed BF16 weights (kernels/cpu/enc_gemm.c) 0.0116. On AMD CPUs
 * with AVX512-BF16 the packed products round x to BF16 too (cpu_lin_bf16_fast): 0.209,
 * measured by forcing that path on an Intel one; BF16_TOL leaves room for it. A layout
 * mistake (q/k read as GGUF-permuted pairs) moves logits by 14.6 and flips 12 of 36 argmaxes
 * (measured), which the argmax check catches too. The test is skipped when the SmolLM2 GGUF
 * is not fetched (no directory). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "engine/weights/gguf.h"
#include "engine/weights/hf_model.h"
#include "engine/model/model.h"
#include "kernels/backend.h"
#include "scheduler/sched.h"
#include "e2e/test_engine_util.h"

#define EXACT_TOL 0.02
#define BF16_TOL 0.25

static const char *hf_dir(void) {
    static char cfg[4096];
    const char *d = getenv("MEDLEY_HF_DIR");
    if (!d || !*d)
        return NULL;
    snprintf(cfg, sizeof cfg, "%s/config.json", d);
    return access(cfg, R_OK) == 0 ? d : NULL;
}

static void check_device(const char *device, int kv_type, double tol) {
    const char *dir = hf_dir();
    if (!dir)
        skip();
    char rp[4200];
    snprintf(rp, sizeof rp, "%s/reference.json", dir);
    json_error_t je;
    json_t *ref = json_load_file(rp, 0, &je);
    if (!ref)
        fail_msg("%s: %s", rp, je.text);
    md_err e = {0};
    gguf_file *gf = NULL;
    md_backend *be = NULL;
    md_model *m = NULL;
    md_kv_bufs kv = {0};
    md_fwd f = {0};
    if (md_model_open(dir, &gf, &e) || md_backend_open(device, 2, &be, &e) ||
        md_model_load(gf, be, &m, &e))
        fail_msg("%s", e.msg);
    assert_int_equal(m->hp.rope_neox, 1);
    md_reserve res = {.max_tokens = 64,
                      .max_seqs = 1,
                      .max_cols = m->hp.n_ff,
                      .max_ctx = 256,
                      .max_blocks = 16,
                      .n_heads = m->hp.n_head};
    if (md_kv_bufs_alloc_type(m, 256, kv_type, &kv, &e) || md_fwd_alloc(m, 64, 64, &f, &e) ||
        be->ops->reserve(be, &res, &e))
        fail_msg("%s", e.msg);
    int V = m->hp.n_vocab;
    float *lg = malloc((size_t)64 * V * sizeof *lg);
    assert_non_null(lg);
    double max_err = 0;
    int n_rows = 0, n_argmax = 0;
    json_t *row;
    size_t ri;
    /* rows come per prompt, one per position: the row with the longest tokens of a run of
     * prefixes is the whole prompt; run it once in one step with every position's logits */
    json_t *rows = json_object_get(ref, "rows");
    for (ri = 0; ri < json_array_size(rows);) {
        size_t end = ri;
        while (end + 1 < json_array_size(rows) &&
               json_array_size(json_object_get(json_array_get(rows, end + 1), "tokens")) >
                   json_array_size(json_object_get(json_array_get(rows, end), "tokens")))
            end++;
        int n;
        int32_t *ids = test_ids(json_object_get(json_array_get(rows, end), "tokens"), &n);
        assert_true(n <= 64);
        int32_t pos[64], seqi[64], slot[64], lrows[64], table[16], seq_len = n;
        for (int i = 0; i < 16; i++)
            table[i] = i;
        for (int t = 0; t < n; t++)
            pos[t] = t, seqi[t] = 0, slot[t] = t, lrows[t] = t;
        md_batch b = {.n_tokens = n,
                      .n_seqs = 1,
                      .tokens = ids,
                      .tok_seq = seqi,
                      .tok_pos = pos,
                      .slot = slot,
                      .seq_len = &seq_len,
                      .block_table = table,
                      .max_blocks = 16,
                      .block_tokens = 16,
                      .logit_rows = lrows,
                      .n_logits = n};
        if (md_model_forward(m, &f, &kv, &b, lg, &e))
            fail_msg("forward: %s", e.msg);
        for (int t = 0; t < n; t++, ri++) {
            row = json_array_get(rows, ri);
            json_t *tid = json_object_get(row, "top_ids"), *tv = json_object_get(row, "top_values");
            const float *l = lg + (size_t)t * V;
            int am = 0;
            for (int v = 1; v < V; v++)
                if (l[v] > l[am])
                    am = v;
            n_argmax += am == (int)json_integer_value(json_object_get(row, "argmax"));
            for (size_t k = 0; k < json_array_size(tid); k++) {
                int id = (int)json_integer_value(json_array_get(tid, k));
                double d = fabs(l[id] - json_real_value(json_array_get(tv, k)));
                if (d > max_err)
                    max_err = d;
            }
            n_rows++;
        }
        free(ids);
    }
    printf("%s: %d positions, max |logit error| over the top-20 %.4f (tolerance %.2f), argmax "
           "equal on %d\n",
           device, n_rows, max_err, tol, n_argmax);
    assert_true(n_rows >= 30);
    assert_true(max_err < tol);
    assert_int_equal(n_argmax, n_rows);
    free(lg);
    md_fwd_free(m, &f);
    md_kv_bufs_free(m, &kv);
    md_model_free(m);
    md_backend_free(be);
    gguf_close(gf);
    json_decref(ref);
}

/* The reference matmul (BF16 rows dequantized, dot in double) and an F32 KV cache. */
static void hf_logits_exact(void **state) {
    (void)state;
    check_device("cpu-exact", MD_TYPE_F32, EXACT_TOL);
}

/* The fast kernels at this machine's SIMD level, F16 KV cache as served. */
static void hf_logits_fast(void **state) {
    (void)state;
    check_device("cpu", MD_TYPE_F16, BF16_TOL);
}

/* The directory is what md_model_open presents: BF16 matrices kept BF16 (not widened), the
 * tied head absent, norms F32, the llama metadata from config.json. */
static void hf_directory_as_gguf(void **state) {
    (void)state;
    const char *dir = hf_dir();
    if (!dir)
        skip();
    md_err e = {0};
    gguf_file *gf = NULL;
    if (md_model_open(dir, &gf, &e))
        fail_msg("%s", e.msg);
    const gguf_tensor *q = gguf_find_tensor(gf, "blk.0.attn_q.weight");
    assert_non_null(q);
    assert_int_equal(q->type, MD_TYPE_BF16);
    assert_int_equal(q->ne[0], 576);
    assert_int_equal(q->ne[1], 576);
    assert_null(gguf_find_tensor(gf, "output.weight"));
    assert_int_equal(gguf_find_tensor(gf, "blk.29.ffn_norm.weight")->type, MD_TYPE_F32);
    md_hparams hp;
    assert_int_equal(md_hparams_read(gf, &hp, &e), 0);
    assert_int_equal(hp.n_layer, 30);
    assert_int_equal(hp.n_head_kv, 3);
    assert_true(fabsf(hp.rope.theta - 100000.0f) < 1);
    assert_non_null(hf_dir_of(gf, NULL));
    gguf_close(gf);
}

/* The scheduler's model card from the directory (workload "model_file" naming it): the shape
 * of the built-in SmolLM2 card, BF16's 2 bytes per weight. */
static void hf_model_card(void **state) {
    (void)state;
    const char *dir = hf_dir();
    if (!dir)
        skip();
    sched_model m, ref;
    md_err e = {0};
    if (sched_model_from_gguf(dir, NULL, &m, &e))
        fail_msg("%s", e.msg);
    assert_int_equal(sched_model_builtin("smollm2-135m", &ref, NULL), 0);
    assert_int_equal(m.layers, ref.layers);
    assert_int_equal(m.hidden, ref.hidden);
    assert_int_equal(m.heads, ref.heads);
    assert_int_equal(m.kv_heads, ref.kv_heads);
    assert_int_equal(m.ffn, ref.ffn);
    assert_int_equal(m.vocab, ref.vocab);
    assert_int_equal(m.tied_embeddings, 1);
    assert_true(m.bytes_per_weight > 1.99 && m.bytes_per_weight < 2.01);
    printf("HF card: %s, %.1fM parameters, %.4f bytes/weight\n", m.name,
           sched_model_params(&m) / 1e6, m.bytes_per_weight);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(hf_directory_as_gguf),
        cmocka_unit_test(hf_model_card),
        cmocka_unit_test(hf_logits_exact),
        cmocka_unit_test(hf_logits_fast),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
