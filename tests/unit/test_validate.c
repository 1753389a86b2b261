/* test_validate.c — queue/validate.c: every kind of bad input line gets the right OpenAI
 * error code and names its field; good lines come out with their parameters (the sampling
 * extras and logprobs too, off when absent or null). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "queue/validate.h"

static q_limits lim;

/* Validate s; return 0/-1 and leave req/ve for the caller (who frees req). */
static int check(const char *s, q_request *req, q_verr *ve, char *buf) {
    return q_validate(s, strlen(s), &lim, req, buf, ve);
}

static void expect_error(const char *line, const char *code, const char *param) {
    q_request req;
    q_verr ve;
    char buf[Q_CUSTOM_ID_MAX];
    int rc = check(line, &req, &ve, buf);
    if (rc != -1 || strcmp(ve.code, code) || (param && strcmp(ve.param, param)))
        fail_msg("line %s: got rc %d code '%s' param '%s' (%s); expected code '%s' param '%s'",
                 line, rc, ve.code, ve.param, ve.message, code, param ? param : "(any)");
    assert_true(ve.message[0] != 0);
    assert_int_equal(ve.status, 400);
    q_request_free(&req);
}

#define CHAT(body)                                                                                 \
    "{\"custom_id\":\"a\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":" body "}"

static void good_chat_line_is_parsed(void **st) {
    q_request req;
    q_verr ve;
    char buf[Q_CUSTOM_ID_MAX];
    const char *l = CHAT("{\"model\":\"echo\",\"messages\":[{\"role\":\"system\",\"content\":\"be "
                         "brief\"},{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":"
                         "\"hel\"},{\"type\":\"text\",\"text\":\"lo\"}]}],\"max_tokens\":12,"
                         "\"temperature\":0.5,\"top_p\":0.9,\"seed\":7,\"stop\":[\"x\",\"y\"]}");
    assert_int_equal(check(l, &req, &ve, buf), 0);
    assert_string_equal(req.custom_id, "a");
    assert_int_equal(req.chat, 1);
    assert_string_equal(req.model, "echo");
    assert_int_equal(req.n_msgs, 2);
    assert_string_equal(req.msgs[1].content, "hello");
    assert_string_equal(q_request_prompt_text(&req), "hello");
    assert_int_equal(req.max_tokens, 12);
    assert_true(req.temperature == 0.5 && req.top_p == 0.9);
    assert_int_equal(req.has_seed, 1);
    assert_int_equal(req.seed, 7);
    assert_int_equal(req.n_stop, 2);
    assert_null(req.stop[2]);
    q_request_free(&req);
}

static void good_completion_line_is_parsed(void **st) {
    q_request req;
    q_verr ve;
    char buf[Q_CUSTOM_ID_MAX];
    const char *l = "{\"custom_id\":\"c1\",\"method\":\"POST\",\"url\":\"/v1/completions\","
                    "\"body\":{\"prompt\":[\"once upon\"],\"stop\":\"\\n\"}}";
    assert_int_equal(check(l, &req, &ve, buf), 0);
    assert_int_equal(req.chat, 0);
    assert_null(req.model);
    assert_string_equal(req.prompt, "once upon");
    assert_int_equal(req.max_tokens, lim.max_tokens_default);
    assert_int_equal(req.n_stop, 1);
    q_request_free(&req);
}

#define COMPLETION(body)                                                                           \
    "{\"custom_id\":\"a\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":" body "}"
#define M "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]"
#define P "\"prompt\":\"x\""

static void sampling_extras_are_parsed(void **st) {
    q_request req;
    q_verr ve;
    char buf[Q_CUSTOM_ID_MAX];
    assert_int_equal(check(CHAT("{" M ",\"top_k\":40,\"min_p\":0.05,\"repetition_penalty\":1.1,"
                                "\"presence_penalty\":0.5,\"frequency_penalty\":-0.5,"
                                "\"logprobs\":true,\"top_logprobs\":0}"),
                           &req, &ve, buf),
                     0);
    assert_int_equal(req.top_k, 40);
    assert_true(req.min_p == 0.05 && req.repetition_penalty == 1.1);
    assert_true(req.presence_penalty == 0.5 && req.frequency_penalty == -0.5);
    assert_int_equal(req.logprobs, 1);
    q_request_free(&req);
    /* the bounds themselves are accepted; integers are numbers */
    assert_int_equal(check(CHAT("{" M ",\"top_k\":1,\"min_p\":1,\"repetition_penalty\":100,"
                                "\"presence_penalty\":-2,\"frequency_penalty\":2}"),
                           &req, &ve, buf),
                     0);
    assert_int_equal(req.top_k, 1);
    assert_true(req.min_p == 1 && req.repetition_penalty == 100);
    assert_true(req.presence_penalty == -2 && req.frequency_penalty == 2);
    assert_int_equal(req.logprobs, 0);
    q_request_free(&req);
}

static void absent_or_null_extras_are_off(void **st) {
    const char *lines[] = {
        CHAT("{" M "}"),
        CHAT("{" M ",\"top_k\":null,\"min_p\":null,\"repetition_penalty\":null,"
             "\"presence_penalty\":null,\"frequency_penalty\":null,\"logprobs\":null,"
             "\"top_logprobs\":null}"),
        CHAT("{" M ",\"top_k\":-1,\"logprobs\":false}"),
        CHAT("{" M ",\"top_k\":0}"),
        COMPLETION("{" P "}"),
        COMPLETION("{" P ",\"logprobs\":null,\"top_k\":-1}"),
    };
    for (size_t i = 0; i < sizeof lines / sizeof *lines; i++) {
        q_request req;
        q_verr ve;
        char buf[Q_CUSTOM_ID_MAX];
        if (check(lines[i], &req, &ve, buf))
            fail_msg("line %s refused: %s", lines[i], ve.message);
        assert_int_equal(req.top_k, 0);
        assert_true(req.min_p == 0 && req.repetition_penalty == 1);
        assert_true(req.presence_penalty == 0 && req.frequency_penalty == 0);
        assert_int_equal(req.logprobs, 0);
        q_request_free(&req);
    }
}

static void completion_logprobs_zero_asks_for_the_chosen_tokens(void **st) {
    q_request req;
    q_verr ve;
    char buf[Q_CUSTOM_ID_MAX];
    assert_int_equal(check(COMPLETION("{" P ",\"logprobs\":0}"), &req, &ve, buf), 0);
    assert_int_equal(req.logprobs, 1);
    q_request_free(&req);
    /* top_logprobs is not a completions parameter: ignored there like other unknown fields */
    assert_int_equal(check(COMPLETION("{" P ",\"top_logprobs\":3}"), &req, &ve, buf), 0);
    assert_int_equal(req.logprobs, 0);
    q_request_free(&req);
}

static void bad_sampling_extras_are_named(void **st) {
    expect_error(CHAT("{" M ",\"frequency_penalty\":2.5}"), "invalid_value",
                 "body.frequency_penalty");
    expect_error(CHAT("{" M ",\"frequency_penalty\":-2.01}"), "invalid_value",
                 "body.frequency_penalty");
    expect_error(CHAT("{" M ",\"frequency_penalty\":\"0.5\"}"), "invalid_type",
                 "body.frequency_penalty");
    expect_error(CHAT("{" M ",\"presence_penalty\":-3}"), "invalid_value", "body.presence_penalty");
    expect_error(CHAT("{" M ",\"presence_penalty\":true}"), "invalid_type",
                 "body.presence_penalty");
    expect_error(CHAT("{" M ",\"top_k\":-2}"), "invalid_value", "body.top_k");
    expect_error(CHAT("{" M ",\"top_k\":3000000000}"), "invalid_value", "body.top_k");
    expect_error(CHAT("{" M ",\"top_k\":1.5}"), "invalid_type", "body.top_k");
    expect_error(CHAT("{" M ",\"top_k\":\"5\"}"), "invalid_type", "body.top_k");
    expect_error(CHAT("{" M ",\"min_p\":1.5}"), "invalid_value", "body.min_p");
    expect_error(CHAT("{" M ",\"min_p\":-0.1}"), "invalid_value", "body.min_p");
    expect_error(CHAT("{" M ",\"min_p\":[0]}"), "invalid_type", "body.min_p");
    expect_error(CHAT("{" M ",\"repetition_penalty\":0}"), "invalid_value",
                 "body.repetition_penalty");
    expect_error(CHAT("{" M ",\"repetition_penalty\":100.5}"), "invalid_value",
                 "body.repetition_penalty");
    expect_error(CHAT("{" M ",\"repetition_penalty\":{}}"), "invalid_type",
                 "body.repetition_penalty");
    expect_error(COMPLETION("{" P ",\"frequency_penalty\":9}"), "invalid_value",
                 "body.frequency_penalty");
}

static void bad_logprobs_are_named(void **st) {
    /* chat: a boolean, with top_logprobs 0..20 beside logprobs: true */
    expect_error(CHAT("{" M ",\"logprobs\":1}"), "invalid_type", "body.logprobs");
    expect_error(CHAT("{" M ",\"logprobs\":\"yes\"}"), "invalid_type", "body.logprobs");
    expect_error(CHAT("{" M ",\"logprobs\":true,\"top_logprobs\":21}"), "invalid_value",
                 "body.top_logprobs");
    expect_error(CHAT("{" M ",\"logprobs\":true,\"top_logprobs\":-1}"), "invalid_value",
                 "body.top_logprobs");
    expect_error(CHAT("{" M ",\"logprobs\":true,\"top_logprobs\":2.5}"), "invalid_type",
                 "body.top_logprobs");
    expect_error(CHAT("{" M ",\"top_logprobs\":0}"), "invalid_value", "body.top_logprobs");
    expect_error(CHAT("{" M ",\"logprobs\":false,\"top_logprobs\":0}"), "invalid_value",
                 "body.top_logprobs");
    /* completions: an integer 0..5 */
    expect_error(COMPLETION("{" P ",\"logprobs\":true}"), "invalid_type", "body.logprobs");
    expect_error(COMPLETION("{" P ",\"logprobs\":0.5}"), "invalid_type", "body.logprobs");
    expect_error(COMPLETION("{" P ",\"logprobs\":6}"), "invalid_value", "body.logprobs");
    expect_error(COMPLETION("{" P ",\"logprobs\":-1}"), "invalid_value", "body.logprobs");
}

/* Alternatives are served: chat's top_logprobs 1..20, completions' logprobs 1..5. */
static void alternatives_are_served(void **st) {
    q_request req;
    q_verr ve;
    char buf[Q_CUSTOM_ID_MAX];
    const char *chat[] = {CHAT("{" M ",\"logprobs\":true,\"top_logprobs\":3}"),
                          CHAT("{" M ",\"logprobs\":true,\"top_logprobs\":20}"),
                          COMPLETION("{" P ",\"logprobs\":1}"),
                          COMPLETION("{" P ",\"logprobs\":5}")};
    int want[] = {3, 20, 1, 5};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(check(chat[i], &req, &ve, buf), 0);
        assert_int_equal(req.logprobs, 1);
        assert_int_equal(req.top_logprobs, want[i]);
        q_request_free(&req);
    }
    assert_int_equal(check(COMPLETION("{" P ",\"logprobs\":0}"), &req, &ve, buf), 0);
    assert_int_equal(req.logprobs, 1);
    assert_int_equal(req.top_logprobs, 0);
    q_request_free(&req);
}

static void bad_json_and_shapes_are_named(void **st) {
    expect_error("not json", "invalid_json", NULL);
    expect_error("{\"custom_id\":\"a\"", "invalid_json", NULL);
    expect_error("[1,2]", "invalid_type", NULL);
    expect_error("{\"method\":\"POST\"}", "missing_required_parameter", "custom_id");
    expect_error("{\"custom_id\":5}", "invalid_value", "custom_id");
    expect_error("{\"custom_id\":\"\"}", "invalid_value", "custom_id");
    expect_error("{\"custom_id\":\"a\",\"url\":\"/v1/completions\"}", "missing_required_parameter",
                 "method");
    expect_error("{\"custom_id\":\"a\",\"method\":\"GET\",\"url\":\"/v1/completions\"}",
                 "invalid_value", "method");
    expect_error("{\"custom_id\":\"a\",\"method\":\"POST\",\"url\":\"/v1/embeddings\",\"body\":{}}",
                 "invalid_url", "url");
    expect_error("{\"custom_id\":\"a\",\"method\":\"POST\",\"url\":\"/v1/completions\"}",
                 "missing_required_parameter", "body");
    expect_error("{\"custom_id\":\"a\",\"method\":\"POST\",\"url\":\"/v1/completions\","
                 "\"body\":[]}",
                 "invalid_type", "body");
}

static void bad_body_fields_are_named(void **st) {
    expect_error(CHAT("{}"), "missing_required_parameter", "body.messages");
    expect_error(CHAT("{\"messages\":[]}"), "invalid_type", "body.messages");
    expect_error(CHAT("{\"messages\":\"hi\"}"), "invalid_type", "body.messages");
    expect_error(CHAT("{\"messages\":[3]}"), "invalid_type", "body.messages[0]");
    expect_error(CHAT("{\"messages\":[{\"content\":\"x\"}]}"), "missing_required_parameter",
                 "body.messages[0]");
    expect_error(CHAT("{\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}"), "invalid_value",
                 "body.messages[0]");
    expect_error(CHAT("{\"messages\":[{\"role\":\"user\"}]}"), "missing_required_parameter",
                 "body.messages[0]");
    expect_error(CHAT("{\"messages\":[{\"role\":\"user\",\"content\":7}]}"), "invalid_type",
                 "body.messages[0].content");
    expect_error(
        CHAT("{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}"),
        "unsupported_value", "body.messages[0].content");
    expect_error(CHAT("{\"model\":3,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}"),
                 "invalid_type", "body.model");
    expect_error(CHAT("{" M ",\"max_tokens\":0}"), "invalid_value", "body.max_tokens");
    expect_error(CHAT("{" M ",\"max_tokens\":1e9}"), "invalid_type", "body.max_tokens");
    expect_error(CHAT("{" M ",\"max_tokens\":\"5\"}"), "invalid_type", "body.max_tokens");
    expect_error(CHAT("{" M ",\"max_completion_tokens\":99999999}"), "invalid_value",
                 "body.max_completion_tokens");
    expect_error(CHAT("{" M ",\"temperature\":2.5}"), "invalid_value", "body.temperature");
    expect_error(CHAT("{" M ",\"temperature\":\"hot\"}"), "invalid_type", "body.temperature");
    expect_error(CHAT("{" M ",\"top_p\":0}"), "invalid_value", "body.top_p");
    expect_error(CHAT("{" M ",\"seed\":1.5}"), "invalid_type", "body.seed");
    expect_error(CHAT("{" M ",\"stop\":5}"), "invalid_type", "body.stop");
    expect_error(CHAT("{" M ",\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}"), "invalid_value",
                 "body.stop");
    expect_error(CHAT("{" M ",\"stop\":[\"a\",1]}"), "invalid_type", "body.stop");
    expect_error(CHAT("{" M ",\"n\":2}"), "unsupported_value", "body.n");
    expect_error(CHAT("{" M ",\"stream\":true}"), "unsupported_value", "body.stream");
    expect_error("{\"custom_id\":\"a\",\"method\":\"POST\",\"url\":\"/v1/completions\","
                 "\"body\":{\"prompt\":{\"x\":1}}}",
                 "invalid_type", "body.prompt");
}

static void oversize_line_is_refused_with_its_custom_id(void **st) {
    size_t n = lim.max_line_bytes + 100;
    char *big = malloc(n + 1);
    int k = snprintf(big, n, "{\"custom_id\": \"big-1\",\"x\":\"");
    memset(big + k, 'a', n - (size_t)k);
    big[n] = 0;
    q_request req;
    q_verr ve;
    char buf[Q_CUSTOM_ID_MAX];
    assert_int_equal(q_validate(big, n, &lim, &req, buf, &ve), -1);
    assert_string_equal(ve.code, "line_too_large");
    assert_non_null(req.custom_id);
    assert_string_equal(req.custom_id, "big-1");
    q_request_free(&req);
    free(big);
}

/* The id a worker recovers from a line it does not parse: only the top-level key counts
 * (issue 25: a nested body's "custom_id" was taken for the line's own, so the answer fell on
 * another line's custom_id and the batch never finished). */
static void scanned_custom_id_is_the_top_level_one(void **st) {
    char buf[Q_CUSTOM_ID_MAX];
    static const struct {
        const char *line, *want;
    } cases[] = {
        {"{\"custom_id\":\"a\"}", "a"},
        {" \n{ \"custom_id\" :\t\"a-1\" , \"x\": 1}", "a-1"},
        {"{\"body\":{\"custom_id\":\"victim\"},\"custom_id\":\"mine\",\"pad\":\"", "mine"},
        {"{\"x\":[{\"custom_id\":\"v\"},\"custom_id\"],\"custom_id\":\"m\"", "m"},
        {"{\"s\":\"\\\"custom_id\\\":\\\"v\\\"\",\"custom_id\":\"m\"", "m"},
        {"{\"custom_id\": \"x\", \"pad\": \"PPPP", "x"}, /* truncated after the id */
        {"{\"body\":{\"custom_id\":\"victim\"}", NULL},   /* only a nested one */
        {"[{\"custom_id\":\"a\"}]", NULL},                /* not an object */
        {"{\"custom_id\":\"a\\u0062\"}", NULL},           /* escapes: no guess */
        {"{\"custom_id\":5}", NULL},
        {"{\"custom_id\":\"\"}", NULL},
        {"{\"custom_id\"", NULL},
        {"{\"a\" \"custom_id\":\"x\"}", NULL}, /* not JSON: no guess */
        {"", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *got = q_scan_custom_id(cases[i].line, strlen(cases[i].line), buf);
        if (!cases[i].want)
            assert_null(got);
        else
            assert_string_equal(got, cases[i].want);
    }
    /* past the window: not found, even when the line goes on to name one */
    size_t n = Q_SCAN_WINDOW + 100;
    char *big = malloc(n + 40);
    int k = snprintf(big, n, "{\"pad\":\"");
    memset(big + k, 'a', n - (size_t)k);
    memcpy(big + n - 20, "\",\"custom_id\":\"z\"}", 18);
    assert_null(q_scan_custom_id(big, n, buf));
    free(big);
}

static void custom_id_survives_a_later_error(void **st) {
    q_request req;
    q_verr ve;
    char buf[Q_CUSTOM_ID_MAX];
    assert_int_equal(check(CHAT("{\"messages\":5}"), &req, &ve, buf), -1);
    assert_string_equal(req.custom_id, "a");
    q_request_free(&req);
}

static void random_bytes_never_crash(void **st) {
    /* Mutations of good lines: every result is a clean accept or a named error. */
    const char *goods[] = {
        CHAT("{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"stop\":[\"z\"]}"),
        CHAT("{" M ",\"top_k\":3,\"frequency_penalty\":0.5,\"logprobs\":true,"
             "\"top_logprobs\":0}"),
        COMPLETION("{" P ",\"min_p\":0.1,\"repetition_penalty\":1.2,\"logprobs\":0}"),
    };
    char *buf = malloc(256);
    unsigned seed = 12345;
    for (int it = 0; it < 30000; it++) {
        const char *good = goods[it % 3];
        size_t n = strlen(good);
        assert_true(n < 256);
        memcpy(buf, good, n + 1);
        int flips = 1 + it % 4;
        for (int f = 0; f < flips; f++) {
            seed = seed * 1103515245u + 12345u;
            buf[(seed >> 8) % n] = (char)(seed >> 20);
        }
        size_t len = (seed >> 3) % 4 == 0 ? (seed >> 5) % n : n;
        q_request req;
        q_verr ve;
        char cid[Q_CUSTOM_ID_MAX];
        int rc = q_validate(buf, len, &lim, &req, cid, &ve);
        assert_true(rc == 0 || (rc == -1 && ve.code[0] && ve.message[0]));
        q_request_free(&req);
    }
    free(buf);
}

int main(void) {
    q_limits_default(&lim);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(good_chat_line_is_parsed),
        cmocka_unit_test(good_completion_line_is_parsed),
        cmocka_unit_test(bad_json_and_shapes_are_named),
        cmocka_unit_test(bad_body_fields_are_named),
        cmocka_unit_test(sampling_extras_are_parsed),
        cmocka_unit_test(absent_or_null_extras_are_off),
        cmocka_unit_test(completion_logprobs_zero_asks_for_the_chosen_tokens),
        cmocka_unit_test(bad_sampling_extras_are_named),
        cmocka_unit_test(bad_logprobs_are_named),
        cmocka_unit_test(alternatives_are_served),
        cmocka_unit_test(oversize_line_is_refused_with_its_custom_id),
        cmocka_unit_test(custom_id_survives_a_later_error),
        cmocka_unit_test(scanned_custom_id_is_the_top_level_one),
        cmocka_unit_test(random_bytes_never_crash),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
