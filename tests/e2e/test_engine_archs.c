/* test_engine_archs.c — architecture variants SmolLM2 does not cover, on tiny synthetic GGUFs
 * (tests/fixtures/engine/make_tiny_models.py) against a float64 numpy forward pass:
 * Qwen2 (NeoX RoPE, QKV biases, separate output head, linear RoPE scaling; F32/F16/BF16/
 * Q8_0/Q4_0/Q4_1 weights), Llama 3.1-style (rope_freqs divisors, multi-query attention, tied
 * head; Q4_K/Q6_K/Q8_0 weights; again with Q5_K_M's Q5_K mix, and refused by a backend
 * without Q5_K), Qwen3 (QK-norm), Mistral with a sliding window and Gemma 3
 * (sliding and global layers, GeGLU, extra norms, scaled embeddings; Q5_0 weights), the
 * sliding ones also fed token by token so the window is applied over the KV cache; three of
 * them again as transformers 5 Hugging Face directories (tests/fixtures/hf). Also that a
 * model file whose tensors do not fit the metadata is refused with a reason, device selection
 * ("auto") without a GPU, and the CPU backend's fit check and argmax op. No real model needed: runs
 * with the unit tests. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "engine/weights/gguf.h"
#include "engine/model/model.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/weights/hf_model.h"
#include "kernels/backend.h"
#ifdef MEDLEY_HAVE_CUDA
#include "kernels/cuda/backend_cuda.h"
#endif
#include "e2e/test_engine_util.h"

/* cpu-exact: float32 accumulation of exact products vs float64 (logits of magnitude ~1-5). */
#define EXACT_TOL 2e-3
/* cpu: activations quantized to 8 bits per block; relative to the logits' spread. */
#define FAST_REL_TOL 0.05

/* chunk 0: the whole prompt in one step; else the first `chunk` tokens in one step and the
 * rest one per step (decode over the cache). */
/* rel: the model under tests/fixtures (a GGUF file or an HF directory); file: its entry in
 * tiny_logits.json. */
static void check_model_at(const char *rel, const char *file, const char *device, double tol,
                           int relative, int chunk) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", MEDLEY_FIXTURES, rel);
    json_t *fx = test_fixture("tiny_logits.json");
    assert_non_null(fx);
    json_t *ref = json_object_get(json_object_get(fx, "models"), file);
    assert_non_null(ref);
    gguf_file *gf;
    md_backend *be;
    md_model *m;
    md_err e = {0};
    if (md_model_open(path, &gf, &e) || md_backend_open(device, 2, &be, &e) ||
        md_model_load(gf, be, &m, &e))
        fail_msg("%s: %s", file, e.msg);
    int n, V = m->hp.n_vocab;
    int32_t *toks = test_ids(json_object_get(ref, "tokens"), &n);
    json_t *pos = json_object_get(ref, "positions"), *lref = json_object_get(ref, "logits");
    int nl = (int)json_array_size(pos);
    md_kv_bufs kv;
    md_fwd f;
    md_reserve res = {.max_tokens = n,
                      .max_seqs = 1,
                      .max_cols = 512,
                      .max_ctx = 64,
                      .max_blocks = 8,
                      .n_heads = m->hp.n_head};
    if (md_kv_bufs_alloc(m, 64, &kv, &e) || md_fwd_alloc(m, n, nl, &f, &e) ||
        be->ops->reserve(be, &res, &e))
        fail_msg("%s", e.msg);
    int32_t tpos[64], tseq[64], slot[64], table[8] = {3, 1, 2, 0, 4, 5, 6, 7}, rows[16];
    for (int t = 0; t < n; t++) {
        tpos[t] = t;
        tseq[t] = 0;
        slot[t] = table[t / 8] * 8 + t % 8;
    }
    for (int i = 0; i < nl; i++)
        rows[i] = (int32_t)json_integer_value(json_array_get(pos, i));
    float *lg = malloc((size_t)nl * V * sizeof(float));
    int done = 0; /* logit rows gathered so far (positions ascend) */
    for (int s0 = 0; s0 < n;) {
        int s1 = chunk <= 0 ? n : s0 == 0 ? chunk : s0 + 1, k = 0;
        int32_t seq_len = s1, step_rows[16];
        for (int i = done; i < nl && rows[i] < s1; i++)
            step_rows[k++] = rows[i] - s0;
        md_batch b = {.n_tokens = s1 - s0,
                      .n_seqs = 1,
                      .tokens = toks + s0,
                      .tok_seq = tseq + s0,
                      .tok_pos = tpos + s0,
                      .slot = slot + s0,
                      .seq_len = &seq_len,
                      .block_table = table,
                      .max_blocks = 8,
                      .block_tokens = 8,
                      .logit_rows = step_rows,
                      .n_logits = k};
        if (md_model_forward(m, &f, &kv, &b, lg + (size_t)done * V, &e))
            fail_msg("forward: %s", e.msg);
        done += k;
        s0 = s1;
    }
    assert_int_equal(done, nl);
    double max_err = 0, lo = INFINITY, hi = -INFINITY;
    for (int i = 0; i < nl; i++)
        for (int v = 0; v < V; v++) {
            double r = json_real_value(json_array_get(json_array_get(lref, i), v));
            double d = fabs(lg[(size_t)i * V + v] - r);
            if (d > max_err)
                max_err = d;
            lo = r < lo ? r : lo;
            hi = r > hi ? r : hi;
        }
    double limit = relative ? tol * (hi - lo) : tol;
    printf("%s on %s%s: max |logit error| %.2e over %d x %d logits (limit %.2e, logits in "
           "[%.2f, %.2f])\n",
           rel, device, chunk ? " token by token" : "", max_err, nl, V, limit, lo, hi);
    assert_true(max_err <= limit);
    free(lg);
    free(toks);
    md_fwd_free(m, &f);
    md_kv_bufs_free(m, &kv);
    md_model_free(m);
    md_backend_free(be);
    gguf_close(gf);
    json_decref(fx);
}

static void check_model_steps(const char *file, const char *device, double tol, int relative,
                              int chunk) {
    char rel[256];
    snprintf(rel, sizeof rel, "engine/%s", file);
    check_model_at(rel, file, device, tol, relative, chunk);
}

static void check_model(const char *file, const char *device, double tol, int relative) {
    check_model_steps(file, device, tol, relative, 0);
}

static void test_qwen2_neox_bias_untied_exact(void **state) {
    check_model("tiny-qwen2.gguf", "cpu-exact", EXACT_TOL, 0);
}
static void test_qwen2_fast_kernels(void **state) {
    check_model("tiny-qwen2.gguf", "cpu", FAST_REL_TOL, 1);
}
static void test_llama3_rope_freqs_mqa_kquants_exact(void **state) {
    check_model("tiny-llama3.gguf", "cpu-exact", EXACT_TOL, 0);
}
static void test_llama3_fast_kernels(void **state) {
    check_model("tiny-llama3.gguf", "cpu", FAST_REL_TOL, 1);
}

/* Q5_K weights (V, output, gate, up, down; Q6_K Q and K): the CPU's Q5_K kernels against the
 * float64 forward of the gguf package's dequantization, whole prompt and token by token
 * (one-row decode tiles). The model's attention is smooth enough that the fast kernels' 8-bit
 * activations stay within 1% of the logits' spread (0.3% measured), not FAST_REL_TOL's 5%. */
static void test_llama3_q5_k_exact(void **state) {
    check_model("tiny-llama3-q5k.gguf", "cpu-exact", EXACT_TOL, 0);
}
static void test_llama3_q5_k_fast_kernels(void **state) {
    check_model("tiny-llama3-q5k.gguf", "cpu", 0.01, 1);
    check_model_steps("tiny-llama3-q5k.gguf", "cpu", 0.01, 1, 5);
}

/* A backend without Q5_K kernels (the CPU's ops with Q5_K taken out of extra_weight_types, as
 * CUDA's) refuses a Q5_K file at load, naming the tensor and the type. */
static void test_q5_k_refused_by_backend_without_it(void **state) {
    char path[4096];
    snprintf(path, sizeof path, "%s/engine/tiny-llama3-q5k.gguf", MEDLEY_FIXTURES);
    gguf_file *gf;
    md_backend *be;
    md_model *m = NULL;
    md_err e = {0};
    assert_int_equal(gguf_open(path, &gf, &e), 0);
    assert_int_equal(md_backend_open("cpu", 1, &be, &e), 0);
    const md_backend_ops *cpu_ops = be->ops;
    md_backend_ops ops = *cpu_ops;
    ops.extra_weight_types &= ~(1ull << MD_TYPE_Q5_K);
    be->ops = &ops;
    assert_int_equal(md_model_load(gf, be, &m, &e), MD_EUNSUPP);
    assert_null(m);
    printf("refused: %s\n", e.msg);
    assert_non_null(strstr(e.msg, "tensor blk.0.attn_v.weight"));
    assert_non_null(strstr(e.msg, "Q5_K"));
    be->ops = cpu_ops;
    md_backend_free(be);
    gguf_close(gf);
}

static void test_qwen3_qk_norm_exact(void **state) {
    check_model("tiny-qwen3.gguf", "cpu-exact", EXACT_TOL, 0);
}
static void test_qwen3_fast_kernels(void **state) {
    check_model("tiny-qwen3.gguf", "cpu", FAST_REL_TOL, 1);
}
/* window 8 over a 40-token prompt: positions before p - 7 must not count */
static void test_mistral_sliding_window_exact(void **state) {
    check_model("tiny-mistral-swa.gguf", "cpu-exact", EXACT_TOL, 0);
}
static void test_mistral_sliding_window_over_kv_cache(void **state) {
    check_model_steps("tiny-mistral-swa.gguf", "cpu-exact", EXACT_TOL, 0, 5);
    check_model_steps("tiny-mistral-swa.gguf", "cpu", FAST_REL_TOL, 1, 11);
}
static void test_gemma3_exact(void **state) {
    check_model("tiny-gemma3.gguf", "cpu-exact", EXACT_TOL, 0);
}
static void test_gemma3_fast_kernels(void **state) {
    check_model("tiny-gemma3.gguf", "cpu", FAST_REL_TOL, 1);
}
static void test_gemma3_over_kv_cache(void **state) {
    check_model_steps("tiny-gemma3.gguf", "cpu-exact", EXACT_TOL, 0, 3);
}

/* The same weights as Hugging Face directories written by transformers 5
 * (tests/fixtures/hf/make_hf_tiny.py): RoPE only in rope_parameters (Qwen2: theta 1e6, linear
 * factor 2; Gemma 3: per layer type), Gemma 3's pattern only in layer_types (beside a stale
 * "_sliding_window_pattern": 6), Mistral's window sliding over a prompt five windows long. */
static void test_hf_qwen2_rope_parameters_exact(void **state) {
    check_model_at("hf/tiny-qwen2", "tiny-qwen2.gguf", "cpu-exact", EXACT_TOL, 0, 0);
}
static void test_hf_mistral_slides_like_gguf(void **state) {
    check_model_at("hf/tiny-mistral", "tiny-mistral-swa.gguf", "cpu-exact", EXACT_TOL, 0, 0);
    check_model_at("hf/tiny-mistral", "tiny-mistral-swa.gguf", "cpu-exact", EXACT_TOL, 0, 5);
}
static void test_hf_gemma3_layer_types_exact(void **state) {
    check_model_at("hf/tiny-gemma3", "tiny-gemma3.gguf", "cpu-exact", EXACT_TOL, 0, 0);
    check_model_at("hf/tiny-gemma3", "tiny-gemma3.gguf", "cpu-exact", EXACT_TOL, 0, 3);
}

/* Their tokenizers, saved by PreTrainedTokenizerFast.save_pretrained (tokenizer_config.json
 * holds model_max_length 1e30 as an integer): they load, and encode as the tokenizers package
 * did. */
static void test_hf_save_pretrained_tokenizers(void **state) {
    char path[4096];
    snprintf(path, sizeof path, "%s/hf/tiny_hf.json", MEDLEY_FIXTURES);
    json_error_t je;
    json_t *fx = json_load_file(path, 0, &je), *v;
    assert_non_null(fx);
    const char *name;
    json_object_foreach(json_object_get(fx, "models"), name, v) {
        snprintf(path, sizeof path, "%s/hf/%s", MEDLEY_FIXTURES, name);
        gguf_file *gf;
        tok_tokenizer *t;
        md_err e = {0};
        if (md_model_open(path, &gf, &e) || md_model_tokenizer(gf, &t, &e))
            fail_msg("%s: %s", name, e.msg);
        assert_int_equal(tok_n_vocab(t), 300);
        const char *text = json_string_value(json_object_get(v, "sample"));
        int n_want, n;
        int32_t *want = test_ids(json_object_get(v, "sample_ids"), &n_want), *ids;
        assert_int_equal(tok_encode(t, text, strlen(text), 0, 0, &ids, &n, &e), 0);
        assert_int_equal(n, n_want);
        assert_memory_equal(ids, want, (size_t)n * sizeof *ids);
        free(ids);
        free(want);
        tok_free(t);
        gguf_close(gf);
    }
    json_decref(fx);
}

/* What the sliding-window and Gemma 3 hyperparameters read as, and their refusal on a
 * backend without the ops they need. */
static void test_gemma3_hparams_and_missing_ops(void **state) {
    char path[4096];
    snprintf(path, sizeof path, "%s/engine/tiny-gemma3.gguf", MEDLEY_FIXTURES);
    gguf_file *gf;
    md_hparams hp;
    md_err e = {0};
    assert_int_equal(gguf_open(path, &gf, &e), 0);
    assert_int_equal(md_hparams_read(gf, &hp, &e), 0);
    assert_string_equal(hp.arch, "gemma3");
    assert_int_equal(hp.head_dim, 32);
    assert_int_equal(hp.n_swa, 8);
    assert_int_equal(hp.swa_pattern, 3);
    assert_true(md_layer_is_swa(&hp, 0) && md_layer_is_swa(&hp, 1) && !md_layer_is_swa(&hp, 2));
    assert_true(hp.rope_neox && hp.qk_norm && hp.post_norms && hp.ffn_gelu);
    assert_true(fabsf(hp.embd_scale - 8.0f) < 1e-6f);
    assert_true(hp.rope_theta_swa == 1e4f && hp.rope.theta == 1e6f);
    md_backend *be;
    assert_int_equal(md_backend_open("cpu", 1, &be, &e), 0);
    md_backend_ops ops = *be->ops; /* the cpu backend less its geglu op */
    ops.geglu = NULL;
    const md_backend_ops *keep = be->ops;
    be->ops = &ops;
    md_model *m = NULL;
    assert_int_equal(md_model_load(gf, be, &m, &e), MD_EUNSUPP);
    assert_null(m);
    assert_non_null(strstr(e.msg, "lacks the geglu op"));
    be->ops = keep;
    md_backend_free(be);
    gguf_close(gf);
}

/* A file that is valid GGUF but not a usable model is refused, naming the tensor; devices
 * that do not exist are refused by name. */
static void test_unusable_model_refused_with_reason(void **state) {
    char path[4096];
    snprintf(path, sizeof path, "%s/engine/tiny-bad-shape.gguf", MEDLEY_FIXTURES);
    gguf_file *gf;
    md_backend *be;
    md_model *m = NULL;
    md_err e = {0};
    assert_int_equal(gguf_open(path, &gf, &e), 0);
    assert_int_equal(md_backend_open("cpu", 1, &be, &e), 0);
    assert_int_equal(md_model_load(gf, be, &m, &e), MD_EFORMAT);
    assert_null(m);
    assert_non_null(strstr(e.msg, "blk.0.attn_k.weight"));
    md_backend *other;
    assert_int_not_equal(md_backend_open("tpu:0", 1, &other, &e), 0);
    assert_non_null(strstr(e.msg, "unknown device"));
#ifndef MEDLEY_HAVE_CUDA
    assert_int_equal(md_backend_open("cuda:0", 1, &other, &e), MD_EUNSUPP);
    assert_non_null(strstr(e.msg, "without CUDA"));
#endif
    md_backend_free(be);
    gguf_close(gf);
}

/* "auto" is cuda:0 only when a GPU is usable, else cpu (not an error); a named GPU that is
 * not usable is an error with the reason; other names pass through. */
static void test_auto_device_picks_cpu_without_gpu(void **state) {
    char dev[32];
    md_err e = {0};
    int gpus = 0;
#ifdef MEDLEY_HAVE_CUDA
    gpus = md_cuda_device_count(NULL, 0);
#endif
    assert_int_equal(md_backend_resolve("auto", dev, sizeof dev, &e), 0);
    assert_string_equal(dev, gpus > 0 ? "cuda:0" : "cpu");
    assert_int_equal(md_backend_resolve(NULL, dev, sizeof dev, &e), 0);
    assert_string_equal(dev, "cpu");
    assert_int_equal(md_backend_resolve("cpu:3", dev, sizeof dev, &e), 0);
    assert_string_equal(dev, "cpu:3");
    assert_int_equal(md_backend_resolve("cuda:x", dev, sizeof dev, &e), MD_EINVAL);
    if (gpus == 0) {
        int rc = md_backend_resolve("cuda:0", dev, sizeof dev, &e);
#ifdef MEDLEY_HAVE_CUDA
        assert_int_equal(rc, MD_EDEVICE);
        assert_non_null(strstr(e.msg, "no CUDA device is usable"));
#else
        assert_int_equal(rc, MD_EUNSUPP);
        assert_non_null(strstr(e.msg, "built without CUDA"));
#endif
    }
    md_backend *be;
    assert_int_equal(md_backend_open("auto", 1, &be, &e), 0);
    assert_string_equal(be->ops->name, gpus > 0 ? "cuda" : "cpu");
    md_backend_free(be);
}

/* The CPU backend's fit check: more than the host's RAM is refused with the numbers. */
static void test_cpu_check_fits_refuses_more_than_ram(void **state) {
    md_backend *be;
    md_err e = {0};
    assert_int_equal(md_backend_open("cpu", 1, &be, &e), 0);
    assert_non_null(be->ops->check_fits);
    assert_int_equal(be->ops->check_fits(be, (size_t)1 << 20, "a small model", &e), 0);
    assert_int_equal(be->ops->check_fits(be, (size_t)1 << 60, "a huge model", &e), MD_ENOMEM);
    assert_non_null(strstr(e.msg, "a huge model does not fit on cpu: needs 1073741824.00 GiB"));
    md_backend_free(be);
}

/* The argmax op (device greedy sampling): the largest of each row, lowest index on ties as
 * the host sampler; a shape past the buffer is refused. */
static void test_argmax_op_picks_lowest_index_of_max(void **state) {
    md_backend *be;
    md_buf *x;
    md_err e = {0};
    assert_int_equal(md_backend_open("cpu", 1, &be, &e), 0);
    assert_non_null(be->ops->argmax);
    float rows[3][5] = {{0, 2, 7, 7, -1}, {-3, -2, -9, -2, -5}, {1, 1, 1, 1, 1}};
    assert_int_equal(be->ops->buf_alloc(be, sizeof rows, &x, &e), 0);
    assert_int_equal(be->ops->buf_upload(be, x, 0, rows, sizeof rows, &e), 0);
    int32_t out[3] = {-1, -1, -1};
    assert_int_equal(be->ops->argmax(be, x, 3, 5, out, &e), 0);
    assert_int_equal(out[0], 2);
    assert_int_equal(out[1], 1);
    assert_int_equal(out[2], 0);
    assert_int_equal(be->ops->argmax(be, x, 4, 5, out, &e), MD_ERANGE);
    be->ops->buf_free(be, x);
    md_backend_free(be);
}

/* The argmax op on a 3-thread pool: rows of a large vocabulary are split between threads
 * when there are fewer rows than threads; the pick is still the lowest index of the row's
 * maximum (a tie across parts, a maximum in the last part) and -1 for a NaN in any part. */
static void test_argmax_op_split_rows_same_pick(void **state) {
    enum { N = 50001, R = 2 };
    md_backend *be;
    md_buf *x;
    md_err e = {0};
    assert_int_equal(md_backend_open("cpu", 3, &be, &e), 0);
    static float rows[R * N];
    assert_int_equal(be->ops->buf_alloc(be, sizeof rows, &x, &e), 0);
    static const int first[] = {0, 16666, 16667, 33334, 49999, 50000};
    for (int c = 0; c < 6; c++) {
        for (int i = 0; i < R * N; i++)
            rows[i] = (float)(i % 97) * 0.01f;
        rows[first[c]] = 5;                    /* row 0: the maximum, tied later */
        rows[N - 1] = 5;                       /* ... in the last part */
        rows[N + N - 1 - first[c] / 2] = 4.5f; /* row 1: one maximum */
        if (c == 5)
            rows[N + 3] = NAN; /* row 1: a NaN in its first part */
        assert_int_equal(be->ops->buf_upload(be, x, 0, rows, sizeof rows, &e), 0);
        for (int nr = 1; nr <= R; nr++) {
            int32_t out[R] = {-7, -7};
            assert_int_equal(be->ops->argmax(be, x, nr, N, out, &e), 0);
            assert_int_equal(out[0], first[c]);
            if (nr == 2)
                assert_int_equal(out[1], c == 5 ? -1 : N - 1 - first[c] / 2);
        }
    }
    be->ops->buf_free(be, x);
    md_backend_free(be);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qwen2_neox_bias_untied_exact),
        cmocka_unit_test(test_qwen2_fast_kernels),
        cmocka_unit_test(test_llama3_rope_freqs_mqa_kquants_exact),
        cmocka_unit_test(test_llama3_fast_kernels),
        cmocka_unit_test(test_llama3_q5_k_exact),
        cmocka_unit_test(test_llama3_q5_k_fast_kernels),
        cmocka_unit_test(test_q5_k_refused_by_backend_without_it),
        cmocka_unit_test(test_qwen3_qk_norm_exact),
        cmocka_unit_test(test_qwen3_fast_kernels),
        cmocka_unit_test(test_mistral_sliding_window_exact),
        cmocka_unit_test(test_mistral_sliding_window_over_kv_cache),
        cmocka_unit_test(test_gemma3_exact),
        cmocka_unit_test(test_gemma3_fast_kernels),
        cmocka_unit_test(test_gemma3_over_kv_cache),
        cmocka_unit_test(test_gemma3_hparams_and_missing_ops),
        cmocka_unit_test(test_hf_qwen2_rope_parameters_exact),
        cmocka_unit_test(test_hf_mistral_slides_like_gguf),
        cmocka_unit_test(test_hf_gemma3_layer_types_exact),
        cmocka_unit_test(test_hf_save_pretrained_tokenizers),
        cmocka_unit_test(test_unusable_model_refused_with_reason),
        cmocka_unit_test(test_auto_device_picks_cpu_without_gpu),
        cmocka_unit_test(test_cpu_check_fits_refuses_more_than_ram),
        cmocka_unit_test(test_argmax_op_picks_lowest_index_of_max),
        cmocka_unit_test(test_argmax_op_split_rows_same_pick),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
