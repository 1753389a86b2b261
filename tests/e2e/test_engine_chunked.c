/* test_engine_chunked.c — chunked prefill on SmolLM2-135M (docs/engine.md "Chunked prefill"):
 * greedy continuations of a 320-token prompt are the same tokens whether the prompt is
 * computed in one step, in chunks of 64 or of 7 tokens, or in chunks beside other sequences
 * decoding; and while a long prompt is being prefilled in chunks, every sequence that decodes
 * gets its token in every step (a long document never stalls the batch). Skipped when the model
 * is not fetched. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "engine/engine.h"
#include "e2e/test_engine_util.h"

#define LONG 320
#define GEN 8

static md_engine *open_engine(int batch_tokens, int prefill_chunk) {
    const char *path = test_model_path();
    if (!path)
        return NULL;
    md_engine_config cfg = {.model_path = path,
                            .n_threads = 2,
                            .max_seqs = 8,
                            .max_batch_tokens = batch_tokens,
                            .prefill_chunk = prefill_chunk,
                            .n_ctx = 1024};
    md_engine *eng;
    md_err e = {0};
    if (md_engine_open(&cfg, &eng, &e))
        fail_msg("engine open: %s", e.msg);
    return eng;
}

/* A prompt of n token ids from a fixed stream (ordinary vocabulary entries). */
static void make_prompt(int32_t *p, int n, uint32_t seed) {
    uint32_t x = seed * 2654435761u + 1;
    for (int i = 0; i < n; i++) {
        x = x * 1103515245u + 12345u;
        p[i] = 200 + (int32_t)((x >> 8) % 20000);
    }
}

static uint64_t submit(md_engine *eng, const int32_t *p, int n, int max_tokens) {
    md_sampling s;
    md_sampling_default(&s);
    s.max_tokens = max_tokens;
    s.ignore_eos = 1;
    uint64_t id;
    md_err e = {0};
    if (md_engine_submit(eng, p, n, &s, &id, &e))
        fail_msg("submit: %s", e.msg);
    return id;
}

/* Step until nothing is live; the generated tokens of id into out [GEN]. */
static void finish_into(md_engine *eng, uint64_t id, int32_t *out) {
    for (int guard = 0; guard < 10000; guard++) {
        md_step_result r;
        md_err e = {0};
        if (md_engine_step(eng, &r, &e))
            fail_msg("step: %s", e.msg);
        if (r.n_live == 0)
            break;
    }
    const int32_t *t;
    int n;
    assert_int_equal(md_seq_tokens(eng, id, &t, &n), 0);
    assert_int_equal(n, GEN); /* the generated tokens */
    memcpy(out, t, GEN * sizeof *out);
    md_engine_release(eng, id);
}

static void test_greedy_same_in_one_step_and_in_chunks(void **state) {
    (void)state;
    md_engine *eng = open_engine(1024, 0);
    if (!eng)
        skip();
    int32_t prompt[LONG], other[3][40], whole[GEN], got[GEN];
    make_prompt(prompt, LONG, 1);
    for (int i = 0; i < 3; i++)
        make_prompt(other[i], 40, 10 + (uint32_t)i);
    finish_into(eng, submit(eng, prompt, LONG, GEN), whole); /* one 320-token step */
    md_engine_close(eng);
    static const int chunks[] = {64, 7};
    for (size_t c = 0; c < sizeof chunks / sizeof *chunks; c++) {
        eng = open_engine(128, chunks[c]);
        finish_into(eng, submit(eng, prompt, LONG, GEN), got);
        assert_memory_equal(whole, got, sizeof whole);
        md_engine_close(eng);
    }
    /* beside three sequences decoding: the chunks share steps with their tokens */
    eng = open_engine(128, 64);
    for (int i = 0; i < 3; i++)
        submit(eng, other[i], 40, 60);
    uint64_t id = submit(eng, prompt, LONG, GEN);
    for (int guard = 0; guard < 10000; guard++) {
        md_step_result r;
        md_err e = {0};
        if (md_engine_step(eng, &r, &e))
            fail_msg("step: %s", e.msg);
        if (md_seq_finish(eng, id) != MD_FINISH_NONE)
            break;
    }
    const int32_t *t;
    int n;
    assert_int_equal(md_seq_tokens(eng, id, &t, &n), 0);
    assert_int_equal(n, GEN);
    assert_memory_equal(whole, t, sizeof whole);
    md_engine_close(eng);
}

static void test_decodes_progress_while_a_long_prompt_prefills(void **state) {
    (void)state;
    md_engine *eng = open_engine(64, 32);
    if (!eng)
        skip();
    int32_t shortp[4][20], prompt[LONG];
    uint64_t ids[4];
    for (int i = 0; i < 4; i++) {
        make_prompt(shortp[i], 20, 20 + (uint32_t)i);
        ids[i] = submit(eng, shortp[i], 20, 40);
    }
    make_prompt(prompt, LONG, 2);
    /* the four short ones are decoding before the document arrives */
    for (int s = 0; s < 3; s++) {
        md_step_result r;
        md_err e = {0};
        assert_int_equal(md_engine_step(eng, &r, &e), 0);
    }
    uint64_t doc = submit(eng, prompt, LONG, 4);
    int prefill_steps = 0;
    for (int guard = 0; guard < 1000; guard++) {
        const int32_t *t;
        int n;
        assert_int_equal(md_seq_tokens(eng, doc, &t, &n), 0);
        if (n > 0) /* the document's first token: its prefill is over */
            break;
        md_engine_stats before, after;
        md_engine_get_stats(eng, &before);
        md_step_result r;
        md_err e = {0};
        assert_int_equal(md_engine_step(eng, &r, &e), 0);
        md_engine_get_stats(eng, &after);
        int mine = 0;
        for (int i = 0; i < r.n_tokens; i++)
            for (int k = 0; k < 4; k++)
                mine += r.tokens[i].seq_id == ids[k];
        assert_int_equal(mine, 4); /* each decoding sequence: one token, this very step */
        assert_true(after.tokens - before.tokens <= 64);
        prefill_steps++;
    }
    printf("a %d-token prompt prefilled over %d steps of at most 64 tokens (chunks of 32), "
           "4 sequences decoding one token in each of them\n",
           LONG, prefill_steps);
    assert_true(prefill_steps >= LONG / 32);
    md_engine_close(eng);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_same_in_one_step_and_in_chunks),
        cmocka_unit_test(test_decodes_progress_while_a_long_prompt_prefills),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
