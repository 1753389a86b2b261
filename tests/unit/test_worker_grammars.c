/* test_worker_grammars.c — worker/grammars.c with the real grammar compiler: a constraint is
 * compiled once per distinct text and strictness, a refusal is cached and answered as a 400
 * naming the field, eviction keeps the grammars running sequences hold, and validated lines
 * (queue/validate.c) come out with their grammar. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "engine/grammar/grammar.h"
#include "worker/grammars.h"

#define CHAT(body)                                                                                 \
    "{\"custom_id\":\"a\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{"         \
    "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]," body "}}"
#define RF(schema, strict)                                                                         \
    "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"s\","               \
    "\"strict\":" strict ",\"schema\":" schema "}}"
#define PERSON                                                                                     \
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"}},\"required\":[\"name\"]" \
    ","                                                                                            \
    "\"additionalProperties\":false}"

static q_limits lim;

static void validate(const char *line, q_request *req) {
    q_verr ve;
    char buf[Q_CUSTOM_ID_MAX];
    if (q_validate(line, strlen(line), &lim, req, buf, &ve))
        fail_msg("%s refused: %s", line, ve.message);
}

/* prepare line in c: 0 or -1 (ve); req left for the caller to release and free */
static int prepare(wk_grammars *c, const char *line, q_request *req, q_verr *ve) {
    validate(line, req);
    memset(ve, 0, sizeof *ve);
    return wk_grammars_prepare(c, req, ve);
}

static void done(q_request *req) {
    wk_grammars_release(req->gentry);
    q_request_free(req);
}

static void same_constraint_is_compiled_once(void **st) {
    (void)st;
    wk_grammars *c;
    assert_int_equal(wk_grammars_new(8, &c, NULL), 0);
    q_request a, b, d;
    q_verr ve;
    assert_int_equal(prepare(c, CHAT(RF(PERSON, "true")), &a, &ve), 0);
    assert_non_null(a.grammar);
    assert_int_equal(a.compile_cached, 0);
    assert_int_equal(prepare(c, CHAT(RF(PERSON, "true")), &b, &ve), 0);
    assert_ptr_equal(a.grammar, b.grammar);
    assert_int_equal(b.compile_cached, 1);
    assert_true(b.compile_ms == 0);
    /* the same schema under strict: false is another constraint */
    assert_int_equal(prepare(c, CHAT(RF(PERSON, "false")), &d, &ve), 0);
    assert_ptr_not_equal(a.grammar, d.grammar);
    wk_grammars_stats s;
    wk_grammars_get_stats(c, &s);
    assert_int_equal(s.compiles, 2);
    assert_int_equal(s.hits, 1);
    assert_int_equal(s.entries, 2);
    done(&a);
    done(&b);
    done(&d);
    wk_grammars_free(c);
}

static void refusal_is_a_400_cached_and_named(void **st) {
    (void)st;
    wk_grammars *c;
    assert_int_equal(wk_grammars_new(8, &c, NULL), 0);
    const char *line = CHAT(RF("{\"$ref\":\"https://example.com/s.json\"}", "true"));
    for (int i = 0; i < 3; i++) {
        q_request r;
        q_verr ve;
        assert_int_equal(prepare(c, line, &r, &ve), -1);
        assert_int_equal(ve.status, 400);
        assert_string_equal(ve.param, "body.response_format.json_schema.schema");
        assert_non_null(strstr(ve.message, "$ref"));
        assert_null(r.grammar);
        done(&r);
    }
    wk_grammars_stats s;
    wk_grammars_get_stats(c, &s);
    assert_int_equal(s.compiles, 1);
    wk_grammars_free(c);
}

static void evicted_grammar_lives_while_held(void **st) {
    (void)st;
    wk_grammars *c;
    assert_int_equal(wk_grammars_new(1, &c, NULL), 0);
    q_request a, b;
    q_verr ve;
    assert_int_equal(prepare(c, CHAT("\"medley\":{\"choice\":[\"yes\",\"no\"]}"), &a, &ve), 0);
    void *held = a.gentry;
    const gr_grammar *g = a.grammar;
    wk_grammars_hold(held); /* a running sequence */
    done(&a);
    /* a second constraint evicts the first from the one-entry cache */
    assert_int_equal(prepare(c, CHAT("\"medley\":{\"regex\":\"[0-9]+\"}"), &b, &ve), 0);
    /* the held grammar still works (ASan would catch a use after free): "yes" and "no"
     * may start, "maybe" may not */
    const char *toks[] = {"yes", "no", "maybe", ""};
    uint32_t lens[] = {3, 2, 5, 0};
    int32_t eos = 3;
    gr_vocab *v;
    gr_matcher *m;
    assert_int_equal(gr_vocab_new(4, toks, lens, &eos, 1, &v, NULL), 0);
    assert_int_equal(gr_matcher_new(g, v, &m, NULL), 0);
    uint32_t mask[1] = {0};
    gr_matcher_fill_mask(m, mask);
    assert_int_equal(mask[0] & 7u, 3u);
    gr_matcher_free(m);
    gr_vocab_free(v);
    wk_grammars_release(held);
    done(&b);
    wk_grammars_free(c);
}

static void tool_call_errors_name_the_tools(void **st) {
    (void)st;
    wk_grammars *c;
    assert_int_equal(wk_grammars_new(4, &c, NULL), 0);
    q_request r;
    q_verr ve;
    int rc = prepare(c,
                     CHAT("\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\","
                          "\"strict\":true,\"parameters\":{\"$ref\":\"https://x.org/p\"}}}],"
                          "\"tool_choice\":\"required\""),
                     &r, &ve);
    assert_int_equal(rc, -1);
    assert_string_equal(ve.param, "body.tools");
    assert_non_null(strstr(ve.message, "body.tools[N].function.parameters"));
    done(&r);
    wk_grammars_free(c);
}

int main(void) {
    q_limits_default(&lim);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(same_constraint_is_compiled_once),
        cmocka_unit_test(refusal_is_a_400_cached_and_named),
        cmocka_unit_test(evicted_grammar_lives_while_held),
        cmocka_unit_test(tool_call_errors_name_the_tools),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
