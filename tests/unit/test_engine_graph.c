/* test_engine_graph.c — the engine's side of step recording (backend.h step_begin/step_end,
 * what the CUDA backend turns into CUDA graphs), on the CPU through tests/unit/graph_backend.c:
 * a batch run with recording and replay gives exactly the tokens of the plain CPU backend;
 * every replayed step issues the same ops with the same arguments as its recording (no
 * argument that changes between steps of one shape, no download inside a step); a recording
 * that fails halfway is redone directly (MD_STEP_RERUN) with the same tokens; with the
 * backend's sample op (":sample"), sampled, penalised and logprob-reporting sequences are
 * drawn by the backend at their own u and the tokens and logprobs are still the host
 * sampler's, bit for bit (logit_bias rows too). Runs on the
 * tiny synthetic Llama 3 model (fixtures, always) and on SmolLM2 when it is fetched. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "e2e/test_engine_util.h"
#include "engine/engine.h"
#include "unit/graph_backend.h"

#define NP 10
#define GEN 20

static md_engine *open_on(const char *model, const char *device) {
    md_engine_config cfg = {.model_path = model,
                            .device = device,
                            .n_threads = 2,
                            .max_seqs = 4, /* 10 prompts through 4 slots: the batch changes */
                            .max_batch_tokens = 64,
                            .n_ctx = 256};
    md_engine *eng;
    md_err e = {0};
    if (md_engine_open(&cfg, &eng, &e))
        fail_msg("engine open on %s: %s", device, e.msg);
    return eng;
}

/* Prompt i: a few token ids below the vocabulary size, lengths 3..40. */
static int make_prompt(int i, int vocab, int32_t *out) {
    int n = 3 + (i * 7) % 38;
    for (int k = 0; k < n; k++)
        out[k] = (int32_t)((1 + i * 131 + k * 17) % (vocab - 1)) + 1;
    return n;
}

static void sampling_for(int i, md_sampling *s) {
    md_sampling_default(s);
    s->max_tokens = GEN - (i % 3) * 4; /* sequences finish at different steps */
    s->ignore_eos = 1;
    if (i % 2) { /* seeded sampling rows next to greedy ones */
        s->temperature = 0.8f;
        s->top_k = 40;
        s->seed = 77 + (uint64_t)i;
    }
    if (i % 4 == 3) { /* sampled with every penalty and logprobs */
        s->repetition_penalty = 1.3f;
        s->presence_penalty = 0.4f;
        s->frequency_penalty = 0.2f;
        s->logprobs = 1;
    } else if (i % 4 == 2) { /* greedy, but not plain: the penalised argmax and its logprob */
        s->frequency_penalty = 0.6f;
        s->logprobs = 1;
        s->top_logprobs = 5;
    }
    if (i == 5)
        s->top_logprobs = MD_TOP_LOGPROBS;
    /* logit_bias (a repeated token, a ban) on a greedy row, a sampled one and a penalised one
     * with logprobs: drawn by the backend's op at the same tokens and logprobs as the host */
    static const md_logit_bias bias[3] = {{3, 4.0f}, {9, -100.0f}, {3, 1.5f}};
    if (i % 5 == 4 || i == 7) {
        s->logit_bias = bias;
        s->n_logit_bias = 3;
    }
}

/* Every prompt through one engine; tokens into out[i] (GEN each, zero-padded), what the
 * steps reported of them (logprobs, top logprobs) into rep[i]. */
static void run_all(const char *model, const char *device, int32_t out[NP][GEN],
                    md_step_token rep[NP][GEN]) {
    md_engine *eng = open_on(model, device);
    int vocab = md_engine_n_vocab(eng);
    uint64_t ids[NP];
    for (int i = 0; i < NP; i++) {
        int32_t p[64];
        int n = make_prompt(i, vocab, p);
        md_sampling s;
        sampling_for(i, &s);
        md_err e = {0};
        if (md_engine_submit(eng, p, n, &s, &ids[i], &e))
            fail_msg("submit: %s", e.msg);
    }
    int guard = 0, got[NP] = {0};
    memset(rep, 0, sizeof(md_step_token) * NP * GEN);
    for (;; guard++) {
        assert_true(guard < 10000);
        md_step_result r;
        md_err e = {0};
        if (md_engine_step(eng, &r, &e))
            fail_msg("step on %s: %s", device, e.msg);
        for (int k = 0; k < r.n_tokens; k++)
            for (int i = 0; i < NP; i++)
                if (ids[i] == r.tokens[k].seq_id && got[i] < GEN)
                    rep[i][got[i]++] = r.tokens[k];
        if (r.n_live == 0)
            break;
    }
    memset(out, 0, sizeof(int32_t) * NP * GEN);
    for (int i = 0; i < NP; i++) {
        const int32_t *t;
        int n;
        assert_int_equal(md_seq_tokens(eng, ids[i], &t, &n), 0);
        md_sampling s;
        sampling_for(i, &s);
        assert_int_equal(n, s.max_tokens);
        memcpy(out[i], t, (size_t)n * sizeof *t);
        for (int k = 0; s.n_logit_bias && k < n; k++) /* banned by its -100 */
            assert_int_not_equal(t[k], 9);
    }
    md_engine_close(eng);
}

static void check_device(const char *model, const char *device, int want_reruns) {
    static int32_t plain[NP][GEN], graphed[NP][GEN];
    static md_step_token plain_lp[NP][GEN], graphed_lp[NP][GEN];
    run_all(model, "cpu", plain, plain_lp);
    graph_backend_reset_stats();
    run_all(model, device, graphed, graphed_lp);
    graph_backend_stats st;
    graph_backend_get_stats(&st);
    printf("%s on %s: %ld steps run directly, %ld recorded, %ld replayed, %ld re-run after a "
           "failed recording, %ld rows drawn by the backend (%ld penalised, %ld with top "
           "logprobs), %ld contract violations%s%s\n",
           strrchr(model, '/') + 1, device, st.eager_steps, st.recorded, st.replayed, st.reruns,
           st.sampled_rows, st.penalised_rows, st.top_rows, st.violations,
           st.violations ? ": " : "", st.first_violation);
    assert_int_equal(st.violations, 0);
    assert_true(st.recorded > 0);
    assert_true(st.replayed > st.recorded); /* recordings are reused, not redone each step */
    if (want_reruns)
        assert_true(st.reruns >= 1);
    if (strstr(device, "sample")) {
        assert_true(st.sampled_rows > 0);   /* the sampled sequences were drawn by the op */
        assert_true(st.penalised_rows > 0); /* and the penalised ones penalised there */
        assert_true(st.top_rows > 0);       /* and their alternatives listed there */
    }
    int negative = 0, tops = 0;
    for (int i = 0; i < NP; i++) {
        assert_memory_equal(plain[i], graphed[i], sizeof plain[i]);
        md_sampling s;
        sampling_for(i, &s);
        for (int k = 0; k < s.max_tokens; k++) {
            const md_step_token *a = &plain_lp[i][k], *b = &graphed_lp[i][k];
            /* the same row sampler on the same logits: the same logprobs, bit for bit */
            assert_memory_equal(&a->logprob, &b->logprob, sizeof a->logprob);
            assert_int_equal(a->n_top, b->n_top);
            assert_memory_equal(a->top_token, b->top_token, (size_t)a->n_top * sizeof(int32_t));
            assert_memory_equal(a->top_logprob, b->top_logprob, (size_t)a->n_top * sizeof(float));
            /* top_logprobs reports the chosen token's logprob too */
            assert_true(s.logprobs || s.top_logprobs ? a->logprob <= 0 : a->logprob == 0);
            negative += a->logprob < 0;
            assert_int_equal(a->n_top, s.top_logprobs); /* every vocabulary entry is finite */
            for (int j = 0; j < a->n_top; j++) {
                assert_true(a->top_logprob[j] <= 0);
                if (j > 0) /* most likely first */
                    assert_true(a->top_logprob[j] <= a->top_logprob[j - 1]);
                if (a->top_token[j] == a->token) /* the chosen token's own logprob */
                    assert_true(a->top_logprob[j] == a->logprob);
            }
        }
        tops += s.top_logprobs > 0;
    }
    /* reported, not left at 0 (the tiny random model is too sure of itself: its logprobs
     * round to 0) */
    if (!strstr(model, "tiny"))
        assert_true(negative > 0);
    assert_true(tops >= 2);
}

static const char *tiny_model(void) {
    static char path[4096];
    snprintf(path, sizeof path, "%s/engine/tiny-llama3.gguf", MEDLEY_FIXTURES);
    return path;
}

static void test_tiny_decode_graphs(void **state) {
    check_device(tiny_model(), "cpu-graph", 0);
}
static void test_tiny_every_step_recorded(void **state) {
    check_device(tiny_model(), "cpu-graph:all", 0);
}
static void test_tiny_device_sampling(void **state) {
    check_device(tiny_model(), "cpu-graph:sample", 0);
}
static void test_tiny_failed_recording_reruns(void **state) {
    check_device(tiny_model(), "cpu-graph:fail=2", 1);
}
static void test_smollm2_decode_graphs(void **state) {
    const char *m = test_model_path();
    if (!m)
        skip();
    check_device(m, "cpu-graph", 0);
#ifndef __SANITIZE_ADDRESS__
    /* under ASan (-O1, every access checked) each SmolLM2 run takes minutes: these two are
     * checked there on the tiny model and here in the optimized build */
    check_device(m, "cpu-graph:all:fail=1", 1);
    check_device(m, "cpu-graph:sample", 0);
#endif
}

int main(void) {
    md_err e = {0};
    if (graph_backend_register(&e)) {
        fprintf(stderr, "%s\n", e.msg);
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiny_decode_graphs),
        cmocka_unit_test(test_tiny_every_step_recorded),
        cmocka_unit_test(test_tiny_failed_recording_reruns),
        cmocka_unit_test(test_tiny_device_sampling),
        cmocka_unit_test(test_smollm2_decode_graphs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
