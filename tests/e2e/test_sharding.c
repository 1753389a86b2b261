/* test_sharding.c — sharded replicas in one process (docs/sharding.md): pipeline stages and
 * tensor-parallel ranks give the single-device answers.
 *
 * Every run decodes a batch of prompts greedily with top-5 logprobs (and plainly greedy, where
 * the last stage answers argmax ids instead of logits: the same tokens); a sharded run is
 * compared with the whole model on one CPU backend, token for token, and by the largest
 * difference of any reported logprob while the tokens agree.
 *  - Pipelines (the same kernels on the same rows, cut into micro-batches): the same tokens
 *    and logprobs equal to 1e-4 (measured: 0 — bit-equal — here).
 *  - Tensor parallelism (partial products summed in another order, activations quantized per
 *    slice): logprobs within 0.05 where tokens agree; tokens may part only at a near tie
 *    (the single run's top-2 logprob gap < 0.3 there).
 * On synthetic:tiny-tp (random weights, 8 heads / 4 KV heads, 4 layers; always) and on
 * SmolLM2-135M (the engine fixture prompts; when fetched): 2 stages uneven (7 + 23 layers), 3
 * stages, TP 3 (9 heads, 3 KV heads); in this process and through `medley stage` processes
 * over loopback TCP. Also: a model over one stage's memory cap runs on two
 * and is refused on one; heads that do not divide and malformed stage lists are refused with
 * the numbers. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "engine/shard/pipeline.h"
#include "engine/tokenizer/tokenizer.h"
#include "e2e/stage_proc.h"
#include "e2e/test_engine_util.h"

#define MAX_P 32
#define GEN 12
#define NTOP 5

typedef struct {
    int n_prompts;
    int32_t tok[MAX_P][GEN];
    int n_tok[MAX_P];
    float lp[MAX_P][GEN][NTOP];
    int32_t top[MAX_P][GEN][NTOP];
} answers;

typedef struct {
    int n;
    int32_t *ids[MAX_P];
    int len[MAX_P];
} prompts;

static void prompts_free(prompts *p) {
    for (int i = 0; i < p->n; i++)
        free(p->ids[i]);
}

/* Open an engine on model with these stages / tp (NULL / 0: one CPU backend). */
static const char *one_device = "cpu";
static int want_lp = 1; /* 0: plain greedy, the last stage answers argmax ids */

static md_engine *open_engine(const char *model, const char *stages, int tp, int micro,
                              size_t cap, md_err *e) {
    md_engine_config cfg = {.model_path = model,
                            .device = one_device,
                            .n_threads = 2,
                            .max_seqs = MAX_P,
                            .max_batch_tokens = 256,
                            .kv_budget_bytes = 8u << 20,
                            .n_ctx = 512,
                            .stages = stages,
                            .tp = tp,
                            .microbatches = micro,
                            .stage_mem_cap = cap};
    md_engine *eng = NULL;
    if (md_engine_open(&cfg, &eng, e))
        return NULL;
    return eng;
}

static void run(const char *model, const char *stages, int tp, int micro, const prompts *p,
                answers *a) {
    md_err e = {0};
    md_engine *eng = open_engine(model, stages, tp, micro, 0, &e);
    if (!eng)
        fail_msg("open %s stages %s tp %d: %s", model, stages ? stages : "-", tp, e.msg);
    memset(a, 0, sizeof *a);
    a->n_prompts = p->n;
    md_sampling s;
    md_sampling_default(&s);
    s.max_tokens = GEN;
    s.ignore_eos = 1;
    s.logprobs = want_lp;
    s.top_logprobs = want_lp ? NTOP : 0;
    uint64_t ids[MAX_P];
    for (int i = 0; i < p->n; i++)
        if (md_engine_submit(eng, p->ids[i], p->len[i], &s, &ids[i], &e))
            fail_msg("submit: %s", e.msg);
    for (int guard = 0; guard < 1000; guard++) {
        md_step_result r;
        if (md_engine_step(eng, &r, &e))
            fail_msg("step (stages %s tp %d): %s", stages ? stages : "-", tp, e.msg);
        for (int k = 0; k < r.n_tokens; k++) {
            int i = 0;
            while (i < p->n && ids[i] != r.tokens[k].seq_id)
                i++;
            assert_true(i < p->n);
            int j = a->n_tok[i]++;
            assert_true(j < GEN);
            a->tok[i][j] = r.tokens[k].token;
            for (int t = 0; t < NTOP && t < r.tokens[k].n_top; t++) {
                a->lp[i][j][t] = r.tokens[k].top_logprob[t];
                a->top[i][j][t] = r.tokens[k].top_token[t];
            }
        }
        if (r.n_live == 0)
            break;
    }
    md_engine_close(eng);
}

/* Compare b (sharded) with a (one device). exact: tokens must agree; else they may part
 * where a's top-2 gap is under 0.3. Returns the largest logprob difference seen. */
static double compare(const answers *a, const answers *b, int exact, const char *what) {
    double worst = 0;
    int parted = 0;
    for (int i = 0; i < a->n_prompts; i++) {
        assert_int_equal(a->n_tok[i], b->n_tok[i]);
        for (int j = 0; j < a->n_tok[i]; j++) {
            for (int t = 0; t < NTOP; t++) {
                if (a->top[i][j][t] != b->top[i][j][t])
                    continue; /* reordered near-equal alternatives */
                double d = fabs((double)a->lp[i][j][t] - b->lp[i][j][t]);
                if (d > worst)
                    worst = d;
            }
            if (a->tok[i][j] != b->tok[i][j]) {
                double gap = a->lp[i][j][0] - a->lp[i][j][1];
                printf("  %s: prompt %d parts at token %d (%d vs %d), top-2 gap %.3f\n", what, i,
                       j, a->tok[i][j], b->tok[i][j], gap);
                if (exact || gap >= 0.3)
                    fail_msg("%s: prompt %d token %d differs (%d vs %d), gap %.3f", what, i, j,
                             a->tok[i][j], b->tok[i][j], gap);
                parted++;
                break; /* the continuations differ from here on */
            }
        }
    }
    printf("  %s: largest logprob difference %.2e, %d of %d prompts part at a near tie\n", what,
           worst, parted, a->n_prompts);
    return worst;
}

/* Tokenized prompts: the engine fixture texts for SmolLM2, short token runs for synthetic. */
static void load_prompts(const char *model, int synthetic, prompts *p) {
    memset(p, 0, sizeof *p);
    if (synthetic) {
        for (int i = 0; i < 12; i++) {
            p->len[i] = 3 + i * 7;
            p->ids[i] = malloc((size_t)p->len[i] * sizeof(int32_t));
            for (int k = 0; k < p->len[i]; k++)
                p->ids[i][k] = (int32_t)((i * 131 + k * 17) % 500 + 1);
        }
        p->n = 12;
        return;
    }
    (void)model;
    json_t *fx = test_fixture("greedy.json");
    assert_non_null(fx);
    json_t *arr = json_object_get(fx, "prompts");
    for (size_t i = 0; i < json_array_size(arr) && p->n < MAX_P; i++) {
        json_t *pr = json_array_get(arr, i);
        p->ids[p->n] = test_ids(json_object_get(pr, "tokens"), &p->len[p->n]);
        p->n++;
    }
    json_decref(fx);
}

#define TINY "synthetic:tiny-tp:q8_0"

static void test_synthetic_pipeline(void **st) {
    (void)st;
    prompts p;
    load_prompts(TINY, 1, &p);
    answers one, two, three;
    run(TINY, NULL, 0, 0, &p, &one);
    run(TINY, "cpu:0-0,cpu:1-3", 0, 0, &p, &two);
    assert_true(compare(&one, &two, 1, "tiny 1+3 layers") <= 1e-4);
    run(TINY, "cpu:0-1,cpu:2-2,cpu:3-3", 0, 5, &p, &three);
    assert_true(compare(&one, &three, 1, "tiny 2+1+1 layers, 5 micro-batches") <= 1e-4);
    want_lp = 0;
    run(TINY, NULL, 0, 0, &p, &one);
    run(TINY, "cpu:0-1,cpu:2-2,cpu:3-3", 0, 5, &p, &three);
    compare(&one, &three, 1, "tiny 2+1+1 layers, greedy ids");
    want_lp = 1;
    prompts_free(&p);
}

static void test_synthetic_tp(void **st) {
    (void)st;
    prompts p;
    load_prompts(TINY, 1, &p);
    answers one, tp2, tp4, mixed;
    run(TINY, NULL, 0, 0, &p, &one);
    run(TINY, NULL, 2, 0, &p, &tp2);
    assert_true(compare(&one, &tp2, 0, "tiny TP 2") <= 0.05);
    run(TINY, NULL, 4, 0, &p, &tp4);
    assert_true(compare(&one, &tp4, 0, "tiny TP 4") <= 0.05);
    run(TINY, "cpu:0-1,cpu+cpu:2-3", 0, 0, &p, &mixed); /* a pipeline with a TP 2 stage */
    assert_true(compare(&one, &mixed, 0, "tiny 2 layers + 2 layers at TP 2") <= 0.05);
    prompts_free(&p);
}

static void test_smollm2(void **st) {
    (void)st;
    const char *model = test_model_path();
    if (!model)
        skip();
    prompts p;
    load_prompts(model, 0, &p);
    answers one, two, three;
    run(model, NULL, 0, 0, &p, &one);
    run(model, "cpu:0-6,cpu:7-29", 0, 0, &p, &two);
    assert_true(compare(&one, &two, 1, "SmolLM2 7 + 23 layers") <= 1e-4);
    run(model, "cpu:0-6,cpu:7-19,cpu:20-29", 0, 0, &p, &three);
    assert_true(compare(&one, &three, 1, "SmolLM2 7 + 13 + 10 layers") <= 1e-4);
    prompts_free(&p);
}

/* TP 3 on SmolLM2 with the exact kernels on both sides: the fast kernels round activations
 * to int8 per product, and a slice that is not whole quantization blocks is multiplied as
 * F32, so fast TP and fast single-device part by that rounding, not by the sharding. */
static void test_smollm2_tp3(void **st) {
    (void)st;
    const char *model = test_model_path();
    if (!model)
        skip();
    prompts p;
    load_prompts(model, 0, &p);
    p.n = 4; /* cpu-exact multiplies in double: a few prompts */
    answers one, tp3;
    one_device = "cpu-exact";
    run(model, NULL, 0, 0, &p, &one);
    run(model, NULL, 3, 0, &p, &tp3);
    one_device = "cpu";
    assert_true(compare(&one, &tp3, 0, "SmolLM2 TP 3, cpu-exact") <= 1e-3);
    prompts_free(&p);
}

/* The same through `medley stage` processes over loopback TCP: a remote last stage, a remote
 * inner and last stage, and a remote tensor-parallel stage. */
static void test_tcp(void **st) {
    (void)st;
    if (!stage_bin())
        skip();
    stage_proc a, b;
    assert_int_equal(stage_start(&a, "127.0.0.1:0"), 0);
    assert_int_equal(stage_start(&b, "127.0.0.1:0"), 0);
    char spec[256];
    prompts p;
    answers one, got;
    load_prompts(TINY, 1, &p);
    run(TINY, NULL, 0, 0, &p, &one);
    snprintf(spec, sizeof spec, "cpu:0-0,tcp://127.0.0.1:%d/cpu:1-3", a.port);
    run(TINY, spec, 0, 0, &p, &got);
    assert_true(compare(&one, &got, 1, "tiny 1 + 3 layers over TCP") <= 1e-4);
    want_lp = 0; /* plain greedy: ids come back instead of logits */
    run(TINY, NULL, 0, 0, &p, &one);
    run(TINY, spec, 0, 0, &p, &got);
    compare(&one, &got, 1, "tiny 1 + 3 layers over TCP, greedy ids");
    want_lp = 1;
    run(TINY, NULL, 0, 0, &p, &one);
    snprintf(spec, sizeof spec, "cpu:0-1,tcp://127.0.0.1:%d/cpu:2-3", b.port);
    run(TINY, spec, 2, 0, &p, &got);
    assert_true(compare(&one, &got, 0, "tiny TP 2 in both stages, the second over TCP") <= 0.05);
    prompts_free(&p);
    const char *model = test_model_path();
    if (model) {
        load_prompts(model, 0, &p);
        run(model, NULL, 0, 0, &p, &one);
        snprintf(spec, sizeof spec, "cpu:0-6,tcp://127.0.0.1:%d/cpu:7-29", a.port);
        run(model, spec, 0, 0, &p, &got);
        assert_true(compare(&one, &got, 1, "SmolLM2 7 + 23 layers over TCP") <= 1e-4);
        snprintf(spec, sizeof spec,
                 "cpu:0-6,tcp://127.0.0.1:%d/cpu:7-19,tcp://127.0.0.1:%d/cpu:20-29", a.port,
                 b.port);
        run(model, spec, 0, 0, &p, &got);
        assert_true(compare(&one, &got, 1, "SmolLM2 7 + 13 + 10 layers, two over TCP") <= 1e-4);
        want_lp = 0;
        run(model, NULL, 0, 0, &p, &one);
        run(model, spec, 0, 0, &p, &got);
        compare(&one, &got, 1, "SmolLM2 7 + 13 + 10 layers, two over TCP, greedy ids");
        want_lp = 1;
        prompts_free(&p);
    }
    assert_int_equal(stage_stop(&a), 0);
    assert_int_equal(stage_stop(&b), 0);
}

static void test_mem_cap(void **st) {
    (void)st;
    size_t w_all, kv_all, w_half, kv_half;
    md_err e = {0};
    assert_int_equal(md_stage_bytes(TINY, 0, 4, 0, &w_all, &kv_all, &e), 0);
    assert_int_equal(md_stage_bytes(TINY, 0, 2, 0, &w_half, &kv_half, &e), 0);
    /* the cap: every layer's weights + KV cache (the 8 MiB budget of open_engine) + one
     * stage's activations do not fit, half of the layers do */
    size_t kv = 8u << 20, cap = w_all + kv;
    assert_true(w_half + kv / 2 < cap / 2 + (1u << 20));
    md_engine *eng = open_engine(TINY, "cpu:0-3", 0, 0, cap, &e);
    assert_null(eng);
    printf("  one stage refused: %s\n", e.msg);
    assert_int_equal(e.code, MD_ENOMEM);
    assert_non_null(strstr(e.msg, "memory cap"));
    eng = open_engine(TINY, "cpu:0-1,cpu:2-3", 0, 0, cap, &e);
    if (!eng)
        fail_msg("two stages under the cap: %s", e.msg);
    md_engine_close(eng);
}

static void test_refusals(void **st) {
    (void)st;
    md_err e = {0};
    const char *model = test_model_path();
    if (model) {
        assert_null(open_engine(model, NULL, 2, 0, 0, &e));
        printf("  TP 2 on SmolLM2: %s\n", e.msg);
        assert_non_null(strstr(e.msg, "heads (9)"));
    }
    const char *bad[] = {"cpu:0-1,cpu:3-3",        /* gap */
                         "cpu:0-2,cpu:2-3",        /* overlap */
                         "cpu:0-4",                /* past the last layer */
                         "cpu:0-2",                /* short of it */
                         "cpu:1-3",                /* not from 0 */
                         "cpu:3-1",                /* backwards */
                         "cpu",                    /* no range */
                         "tcp://h/cpu:0-3",        /* no port */
                         "tcp://h:99999/cpu:0-3",  /* bad port */
                         "cpu:0-1,,cpu:2-3",       /* empty */
                         "nodevice:0-3"};          /* unknown device */
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        md_err_clear(&e);
        md_engine *eng = open_engine(TINY, bad[i], 0, 0, 0, &e);
        if (eng)
            fail_msg("stages \"%s\" accepted", bad[i]);
        printf("  \"%s\": %s\n", bad[i], e.msg);
        assert_true(e.msg[0] != 0);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_synthetic_pipeline), cmocka_unit_test(test_synthetic_tp),
        cmocka_unit_test(test_mem_cap),            cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_tcp),
        cmocka_unit_test(test_smollm2),            cmocka_unit_test(test_smollm2_tp3),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
