/* test_engine_constrained.c — structured outputs in the engine on SmolLM2-135M (skipped when
 * the model is not fetched): logit_bias steering greedy decoding and its logprobs; grammar-
 * constrained answers (a choice, a JSON schema) that the grammar accepts and that parse,
 * under every sampler setting, alongside unconstrained sequences in one batch; the same
 * answers with a KV budget small enough to preempt (the matcher keeps its state, recomputed
 * prefill accepts nothing) and through two pipeline stages (the head applies the mask); top
 * logprobs that list allowed tokens only. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "engine/engine.h"
#include "engine/grammar/grammar.h"
#include "engine/grammar_vocab.h"
#include "engine/tokenizer/tokenizer.h"
#include "e2e/test_engine_util.h"

static const char SCHEMA[] =
    "{\"type\": \"object\", \"properties\": {\"name\": {\"type\": \"string\", \"maxLength\": 12}, "
    "\"age\": {\"type\": \"integer\", \"minimum\": 0, \"maximum\": 120}, "
    "\"pet\": {\"enum\": [\"cat\", \"dog\", \"none\"]}}, "
    "\"required\": [\"name\", \"age\", \"pet\"], \"additionalProperties\": false}";

static md_engine *open_engine(size_t kv_bytes, int max_seqs, const char *stages) {
    const char *path = test_model_path();
    if (!path)
        return NULL;
    md_engine_config cfg = {.model_path = path,
                            .n_threads = 2,
                            .max_seqs = max_seqs,
                            .max_batch_tokens = 256,
                            .kv_budget_bytes = kv_bytes,
                            .n_ctx = 512,
                            .stages = stages};
    md_engine *eng;
    md_err e = {0};
    if (md_engine_open(&cfg, &eng, &e))
        fail_msg("engine open: %s", e.msg);
    return eng;
}

static int32_t *prompt(md_engine *eng, const char *user, int *n) {
    tok_tokenizer *t = md_engine_tokenizer(eng);
    tok_chat_msg m = {"user", user};
    char *p;
    int32_t *ids;
    md_err e = {0};
    if (tok_chat_apply(t, &m, 1, 1, &p, &e) || tok_encode(t, p, strlen(p), 1, 1, &ids, n, &e))
        fail_msg("prompt: %s", e.msg);
    free(p);
    return ids;
}

static void drain(md_engine *eng, md_step_token *log, int *n_log, int cap) {
    for (int guard = 0; guard < 100000; guard++) {
        md_step_result r;
        md_err e = {0};
        if (md_engine_step(eng, &r, &e))
            fail_msg("step: %s", e.msg);
        for (int i = 0; log && i < r.n_tokens && *n_log < cap; i++)
            log[(*n_log)++] = r.tokens[i];
        if (r.n_live == 0)
            return;
    }
    fail_msg("engine did not finish");
}

/* A fresh matcher walks q's generated tokens as the engine does (mask, then accept): each
 * token in its mask and accepted, and the grammar may end where the answer does. */
static void assert_in_grammar(md_engine *eng, const gr_grammar *g, const gr_vocab *v, uint64_t id) {
    const int32_t *toks;
    int n;
    md_err e = {0};
    assert_int_equal(md_seq_tokens(eng, id, &toks, &n), 0);
    gr_matcher *m;
    assert_int_equal(gr_matcher_new(g, v, &m, &e), 0);
    tok_tokenizer *t = md_engine_tokenizer(eng);
    uint32_t *mask = malloc((size_t)(md_engine_n_vocab(eng) + 31) / 32 * sizeof *mask);
    int ended = 0;
    for (int i = 0; i < n && !ended; i++) {
        gr_matcher_fill_mask(m, mask);
        if (!(mask[toks[i] / 32] >> (toks[i] % 32) & 1u))
            fail_msg("token %d at %d is not in the grammar's mask; text '%s'", toks[i], i,
                     md_seq_text(eng, id));
        if (tok_is_eog(t, toks[i])) { /* an end token: only where the grammar may end */
            if (!gr_matcher_can_end(m))
                fail_msg("end token at %d where the grammar cannot end; text '%s'", i,
                         md_seq_text(eng, id));
            ended = 1;
        }
        if (gr_matcher_accept(m, toks[i]))
            fail_msg("token %d at %d outside the grammar; text '%s'", toks[i], i,
                     md_seq_text(eng, id));
    }
    if (!ended && !gr_matcher_can_end(m))
        fail_msg("the answer stops where the grammar cannot end: '%s'", md_seq_text(eng, id));
    free(mask);
    gr_matcher_free(m);
}

static gr_vocab *vocab_of(md_engine *eng) {
    gr_vocab *v;
    md_err e = {0};
    if (md_grammar_vocab_new(md_engine_tokenizer(eng), &v, &e))
        fail_msg("vocab: %s", e.msg);
    return v;
}

static void test_logit_bias_steers_greedy_and_its_logprobs(void **state) {
    md_engine *eng = open_engine(0, 4, NULL);
    if (!eng)
        skip();
    int np;
    int32_t *p = prompt(eng, "Name a colour.", &np);
    md_sampling s;
    md_sampling_default(&s);
    s.max_tokens = 6;
    s.logprobs = 1;
    s.top_logprobs = 3;
    uint64_t plain, banned, forced;
    md_err e = {0};
    assert_int_equal(md_engine_submit(eng, p, np, &s, &plain, &e), 0);
    md_step_token log[64];
    int n_log = 0;
    drain(eng, log, &n_log, 64);
    int32_t first = log[0].token;
    /* -100 on the greedy first token: another one comes first */
    md_logit_bias ban = {first, -100.0f};
    s.logit_bias = &ban;
    s.n_logit_bias = 1;
    assert_int_equal(md_engine_submit(eng, p, np, &s, &banned, &e), 0);
    /* +100 on a token: greedy picks it every time, with a logprob near 0 */
    int32_t x = tok_find(md_engine_tokenizer(eng), "x", 1);
    assert_true(x >= 0);
    md_logit_bias force[2] = {{x, 60.0f}, {x, 40.0f}}; /* repeated entries add up */
    s.logit_bias = force;
    s.n_logit_bias = 2;
    assert_int_equal(md_engine_submit(eng, p, np, &s, &forced, &e), 0);
    n_log = 0;
    drain(eng, log, &n_log, 64);
    int seen_b = 0, seen_f = 0;
    for (int i = 0; i < n_log; i++) {
        if (log[i].seq_id == banned && seen_b++ == 0) {
            assert_int_not_equal(log[i].token, first);
            for (int j = 0; j < log[i].n_top; j++)
                assert_int_not_equal(log[i].top_token[j], first); /* -100: far below */
        }
        if (log[i].seq_id == forced) {
            assert_int_equal(log[i].token, x);
            assert_true(log[i].logprob > -1e-3f && log[i].logprob <= 0);
            assert_int_equal(log[i].top_token[0], x);
            seen_f++;
        }
    }
    assert_int_equal(seen_f, 6);
    /* a token outside the vocabulary and a bias out of range are refused, naming them */
    md_logit_bias bad = {md_engine_n_vocab(eng), 1.0f};
    s.logit_bias = &bad;
    s.n_logit_bias = 1;
    uint64_t id;
    assert_int_equal(md_engine_submit(eng, p, np, &s, &id, &e), MD_EINVAL);
    assert_non_null(strstr(e.msg, "logit_bias"));
    bad = (md_logit_bias){1, 101.0f};
    assert_int_equal(md_engine_submit(eng, p, np, &s, &id, &e), MD_EINVAL);
    free(p);
    md_engine_close(eng);
}

/* 12 sequences in one batch: constrained by a choice and by a JSON schema under greedy,
 * temperature with filters, penalties, logprobs; unconstrained ones beside them. Returns the
 * constrained answers' texts (malloc'd) for a second run to compare. */
static void run_mix(md_engine *eng, const gr_grammar *choice, const gr_grammar *schema,
                    const gr_vocab *v, char **texts, md_finish *fin) {
    const char *asks[3] = {"Is the sky blue? Answer yes or no.",
                           "Give a JSON record of a person called Ada, 36, who has a cat.",
                           "Write one sentence about rivers."};
    int32_t *p[3];
    int np[3];
    for (int i = 0; i < 3; i++)
        p[i] = prompt(eng, asks[i], &np[i]);
    uint64_t ids[12];
    int kind[12];
    md_err e = {0};
    for (int i = 0; i < 12; i++) {
        md_sampling s;
        md_sampling_default(&s);
        kind[i] = i % 3;
        s.max_tokens = kind[i] == 1 ? 80 : 24;
        s.grammar = kind[i] == 0 ? choice : kind[i] == 1 ? schema : NULL;
        s.seed = 1000 + (uint64_t)i;
        switch (i / 3) {
        case 1: s.temperature = 0.9f, s.top_p = 0.9f, s.top_k = 40; break;
        case 2:
            s.temperature = 1.3f, s.min_p = 0.05f, s.repetition_penalty = 1.2f,
            s.frequency_penalty = 0.5f;
            break;
        case 3: s.logprobs = 1, s.top_logprobs = 5, s.presence_penalty = 1.0f; break;
        }
        assert_int_equal(md_engine_submit(eng, p[kind[i]], np[kind[i]], &s, &ids[i], &e), 0);
    }
    md_step_token log[4096];
    int n_log = 0;
    drain(eng, log, &n_log, 4096);
    for (int i = 0; i < 12; i++) {
        const char *txt = md_seq_text(eng, ids[i]);
        fin[i] = md_seq_finish(eng, ids[i]);
        texts[i] = strdup(txt);
        printf("seq %2d (%s, settings %d): %s '%s'\n", i,
               kind[i] == 0   ? "choice"
               : kind[i] == 1 ? "schema"
                              : "free",
               i / 3, fin[i] == MD_FINISH_STOP ? "stop" : "length", txt);
        if (kind[i] == 2)
            continue;
        assert_in_grammar(eng, kind[i] == 0 ? choice : schema, v, ids[i]);
        if (kind[i] == 0) {
            assert_int_equal(fin[i], MD_FINISH_STOP);
            assert_true(!strcmp(txt, "yes") || !strcmp(txt, "no"));
        } else if (fin[i] == MD_FINISH_STOP) {
            json_error_t je;
            json_t *j = json_loads(txt, 0, &je);
            if (!j)
                fail_msg("seq %d: '%s' does not parse: %s", i, txt, je.text);
            assert_true(json_is_object(j) && json_is_string(json_object_get(j, "name")) &&
                        json_is_integer(json_object_get(j, "age")) &&
                        json_is_string(json_object_get(j, "pet")));
            json_decref(j);
        }
    }
    /* the top logprobs of a constrained sequence list allowed tokens only: each alternative
     * must be accepted where the chosen token was */
    for (int i = 9; i < 12; i++) {
        if (kind[i] == 2)
            continue;
        gr_matcher *m;
        assert_int_equal(gr_matcher_new(kind[i] == 0 ? choice : schema, v, &m, &e), 0);
        uint32_t *mask = malloc((size_t)(md_engine_n_vocab(eng) + 31) / 32 * sizeof *mask);
        for (int k = 0; k < n_log; k++) {
            if (log[k].seq_id != ids[i])
                continue;
            gr_matcher_fill_mask(m, mask);
            assert_true(log[k].n_top > 0);
            for (int j = 0; j < log[k].n_top; j++) {
                int32_t t = log[k].top_token[j];
                assert_true(mask[t / 32] >> (t % 32) & 1u);
            }
            if (gr_matcher_accept(m, log[k].token))
                break; /* the last token may be an end token the matcher takes as such */
        }
        free(mask);
        gr_matcher_free(m);
    }
    for (int i = 0; i < 12; i++)
        md_engine_release(eng, ids[i]);
    for (int i = 0; i < 3; i++)
        free(p[i]);
}

static void test_constrained_answers_follow_the_grammar_even_when_preempted(void **state) {
    md_engine *big = open_engine(0, 16, NULL);
    if (!big)
        skip();
    md_err e = {0};
    gr_grammar *choice, *schema;
    const char *ch[2] = {"yes", "no"};
    size_t cl[2] = {3, 2};
    assert_int_equal(gr_from_choice(ch, cl, 2, &choice, &e), 0);
    if (gr_from_json_schema(SCHEMA, sizeof SCHEMA - 1, 1, &schema, NULL, 0, &e))
        fail_msg("schema: %s", e.msg);
    gr_vocab *v = vocab_of(big);
    char *want[12], *got[12];
    md_finish fw[12], fg[12];
    run_mix(big, choice, schema, v, want, fw);
    md_engine_close(big);
    /* 12 blocks of 16 tokens: a few of the ~50..130-token sequences at once */
    size_t per_token = 30 * 2 * 192 * sizeof(uint16_t); /* the CPU backend's F16 cache */
    md_engine *small = open_engine(12 * 16 * per_token, 16, NULL);
    run_mix(small, choice, schema, v, got, fg);
    md_engine_stats st;
    md_engine_get_stats(small, &st);
    printf("KV budget of %d blocks: %ld preemptions, %ld masks in %.2f ms\n", st.kv_blocks,
           st.preemptions, st.masks, st.mask_ns / 1e6);
    assert_true(st.preemptions > 0);
    assert_true(st.masks > 0);
    for (int i = 0; i < 12; i++) {
        assert_string_equal(want[i], got[i]); /* same seeds, same answers, preempted or not */
        assert_int_equal(fw[i], fg[i]);
        free(got[i]);
    }
    md_engine_close(small);
    /* two pipeline stages: the head samples under the constraint, as one device does */
    md_engine *piped = open_engine(0, 16, "cpu:0-14,cpu:15-29");
    run_mix(piped, choice, schema, v, got, fg);
    for (int i = 0; i < 12; i++) {
        assert_string_equal(want[i], got[i]);
        assert_int_equal(fw[i], fg[i]);
        free(want[i]);
        free(got[i]);
    }
    md_engine_close(piped);
    gr_vocab_free(v);
    gr_free(choice);
    gr_free(schema);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_logit_bias_steers_greedy_and_its_logprobs),
        cmocka_unit_test(test_constrained_answers_follow_the_grammar_even_when_preempted),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
