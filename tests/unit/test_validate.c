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

#define EMB(body)                                                                                  \
    "{\"custom_id\":\"a\",\"method\":\"POST\",\"url\":\"/v1/embeddings\",\"body\":" body "}"

/* /v1/embeddings: the four input shapes, the options, and each refusal naming its field. */
static void embeddings_inputs_are_parsed_or_named(void **st) {
    q_request req;
    q_verr ve;
    char buf[Q_CUSTOM_ID_MAX];
    assert_int_equal(check(EMB("{\"input\":\"hi\",\"user\":\"u\",\"encoding_format\":\"base64\","
                               "\"dimensions\":8,\"medley\":{\"truncate\":true}}"),
                           &req, &ve, buf),
                     0);
    assert_true(req.embed && req.n_emb_in == 1 && req.emb_in[0].len == 2 && req.emb_base64 &&
                req.emb_dimensions == 8 && req.emb_truncate);
    q_request_free(&req);
    assert_int_equal(check(EMB("{\"input\":[\"a\",[1,2],\"bc\"]}"), &req, &ve, buf), 0);
    assert_int_equal(req.n_emb_in, 3);
    assert_true(req.emb_in[1].n_ids == 2 && req.emb_in[1].ids[1] == 2 && req.emb_in[2].len == 2);
    q_request_free(&req);
    assert_int_equal(check(EMB("{\"input\":[5,6,7]}"), &req, &ve, buf), 0);
    assert_true(req.n_emb_in == 1 && req.emb_in[0].n_ids == 3 && req.emb_in[0].ids[2] == 7);
    q_request_free(&req);
    expect_error(EMB("{}"), "missing_required_parameter", "body.input");
    expect_error(EMB("{\"input\":5}"), "invalid_type", "body.input");
    expect_error(EMB("{\"input\":[]}"), "invalid_value", "body.input");
    expect_error(EMB("{\"input\":\"\"}"), "invalid_value", "body.input");
    expect_error(EMB("{\"input\":[\"a\",\"\"]}"), "invalid_value", "body.input[1]");
    expect_error(EMB("{\"input\":[[]]}"), "invalid_value", "body.input[0]");
    expect_error(EMB("{\"input\":[[[1]]]}"), "invalid_type", "body.input[0]");
    expect_error(EMB("{\"input\":[1,\"a\"]}"), "invalid_type", "body.input");
    expect_error(EMB("{\"input\":[1099511627776]}"), "invalid_value", "body.input");
    expect_error(EMB("{\"input\":[-1]}"), "invalid_value", "body.input");
    expect_error(EMB("{\"input\":\"a\",\"encoding_format\":\"int8\"}"), "invalid_value",
                 "body.encoding_format");
    expect_error(EMB("{\"input\":\"a\",\"dimensions\":0}"), "invalid_value", "body.dimensions");
    expect_error(EMB("{\"input\":\"a\",\"user\":5}"), "invalid_type", "body.user");
    expect_error(EMB("{\"input\":\"a\",\"medley\":{\"regex\":\"x\"}}"), "unsupported_parameter",
                 "body.medley");
    expect_error(EMB("{\"input\":\"a\",\"max_tokens\":5}"), "unsupported_parameter",
                 "body.max_tokens");
    /* 2,049 inputs: one more than OpenAI takes */
    size_t n = 2049, cap = n * 4 + 256, k = 0;
    char *l = malloc(cap);
    assert_non_null(l);
    k += (size_t)snprintf(l, cap, "%s", EMB("{\"input\":["));
    k -= 1; /* drop the "}" the macro added after the open array */
    for (size_t i = 0; i < n; i++)
        k += (size_t)snprintf(l + k, cap - k, i ? ",\"x\"" : "\"x\"");
    snprintf(l + k, cap - k, "]}}");
    expect_error(l, "invalid_value", "body.input");
    free(l);
}

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
    /* top_logprobs is not a completions parameter: refused there, naming it */
    expect_error(COMPLETION("{" P ",\"top_logprobs\":3}"), "unsupported_parameter",
                 "body.top_logprobs");
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
    expect_error("{\"custom_id\":\"a\",\"method\":\"POST\",\"url\":\"/v1/images\",\"body\":{}}",
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
        {"{\"body\":{\"custom_id\":\"victim\"}", NULL},  /* only a nested one */
        {"[{\"custom_id\":\"a\"}]", NULL},               /* not an object */
        {"{\"custom_id\":\"a\\u0062\"}", NULL},          /* escapes: no guess */
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

/* Validate a line that must pass; the caller frees req. */
static void expect_ok(const char *line, q_request *req) {
    q_verr ve;
    char buf[Q_CUSTOM_ID_MAX];
    if (check(line, req, &ve, buf))
        fail_msg("line %s: refused with %s %s (%s)", line, ve.code, ve.param, ve.message);
}

static void every_openai_field_works_or_is_refused_by_name(void **st) {
    (void)st;
    expect_error(CHAT("{" M ",\"wibble\":1}"), "unsupported_parameter", "body.wibble");
    expect_error(CHAT("{" M ",\"stream_options\":{\"include_usage\":true}}"),
                 "unsupported_parameter", "body.stream_options");
    expect_error(CHAT("{" M ",\"audio\":{\"voice\":\"x\"}}"), "unsupported_parameter",
                 "body.audio");
    expect_error(CHAT("{" M ",\"prediction\":{\"type\":\"content\"}}"), "unsupported_parameter",
                 "body.prediction");
    expect_error(CHAT("{" M ",\"reasoning_effort\":\"low\"}"), "unsupported_parameter",
                 "body.reasoning_effort");
    expect_error(CHAT("{" M ",\"web_search_options\":{}}"), "unsupported_parameter",
                 "body.web_search_options");
    expect_error(CHAT("{" M ",\"functions\":[]}"), "unsupported_parameter", "body.functions");
    expect_error(CHAT("{" M ",\"function_call\":\"auto\"}"), "unsupported_parameter",
                 "body.function_call");
    expect_error(CHAT("{" M ",\"store\":true}"), "unsupported_value", "body.store");
    expect_error(CHAT("{" M ",\"modalities\":[\"text\",\"audio\"]}"), "unsupported_value",
                 "body.modalities");
    expect_error(CHAT("{" M ",\"metadata\":{\"a\":1}}"), "invalid_type", "body.metadata");
    expect_error(CHAT("{" M ",\"user\":5}"), "invalid_type", "body.user");
    expect_error(CHAT("{" M ",\"n\":2}"), "unsupported_value", "body.n");
    expect_error(CHAT("{" M ",\"prompt\":\"x\"}"), "unsupported_parameter", "body.prompt");
    expect_error(CHAT("{" M ",\"suffix\":\"x\"}"), "unsupported_parameter", "body.suffix");
    expect_error(COMPLETION("{" P ",\"echo\":true}"), "unsupported_value", "body.echo");
    expect_error(COMPLETION("{" P ",\"best_of\":3}"), "unsupported_value", "body.best_of");
    expect_error(COMPLETION("{" P ",\"suffix\":\"end\"}"), "unsupported_parameter", "body.suffix");
    expect_error(COMPLETION("{" P ",\"tools\":[]}"), "unsupported_parameter", "body.tools");
    expect_error(COMPLETION("{" P ",\"messages\":[]}"), "unsupported_parameter", "body.messages");
    /* defaults and no-effect identifiers pass */
    q_request req;
    expect_ok(CHAT("{" M ",\"n\":1,\"stream\":false,\"store\":false,\"stream_options\":null,"
                   "\"user\":\"u\",\"metadata\":{\"k\":\"v\"},\"modalities\":[\"text\"],"
                   "\"parallel_tool_calls\":false,\"service_tier\":\"auto\","
                   "\"prompt_cache_key\":\"p\",\"safety_identifier\":\"s\",\"audio\":null}"),
              &req);
    assert_int_equal(req.con, Q_CON_NONE);
    q_request_free(&req);
    expect_ok(COMPLETION("{" P ",\"echo\":false,\"best_of\":1,\"suffix\":null,\"user\":\"u\"}"),
              &req);
    q_request_free(&req);
}

static void logit_bias_is_parsed_and_bounded(void **st) {
    (void)st;
    q_request req;
    expect_ok(CHAT("{" M ",\"logit_bias\":{\"50256\":-100,\"7\":2.5}}"), &req);
    assert_int_equal(req.n_bias, 2);
    assert_int_equal(req.bias_ids[0], 50256);
    assert_true(req.bias[0] == -100.0f && req.bias[1] == 2.5f);
    q_request_free(&req);
    expect_error(CHAT("{" M ",\"logit_bias\":{\"7\":101}}"), "invalid_value", "body.logit_bias");
    expect_error(CHAT("{" M ",\"logit_bias\":{\"x\":1}}"), "invalid_value", "body.logit_bias");
    expect_error(CHAT("{" M ",\"logit_bias\":{\"-1\":1}}"), "invalid_value", "body.logit_bias");
    expect_error(CHAT("{" M ",\"logit_bias\":{\"1\":\"1\"}}"), "invalid_type", "body.logit_bias");
    expect_error(CHAT("{" M ",\"logit_bias\":[1]}"), "invalid_type", "body.logit_bias");
}

#define SCHEMA "{\"type\":\"object\",\"properties\":{\"b\":{\"type\":\"string\"},\"a\":{}}}"

static void response_format_sets_the_constraint(void **st) {
    (void)st;
    q_request req;
    expect_ok(CHAT("{" M ",\"response_format\":{\"type\":\"text\"}}"), &req);
    assert_int_equal(req.con, Q_CON_NONE);
    q_request_free(&req);
    expect_ok(CHAT("{" M ",\"response_format\":{\"type\":\"json_object\"}}"), &req);
    assert_int_equal(req.con, Q_CON_JSON_OBJECT);
    q_request_free(&req);
    expect_ok(CHAT("{" M ",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":"
                   "\"p\",\"strict\":true,\"schema\":" SCHEMA "}}}"),
              &req);
    assert_int_equal(req.con, Q_CON_JSON_SCHEMA);
    assert_int_equal(req.con_strict, 1);
    assert_string_equal(req.con_text, SCHEMA); /* compact, property order kept */
    assert_string_equal(req.con_param, "body.response_format");
    q_request_free(&req);
    expect_ok(COMPLETION("{" P ",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{"
                         "\"name\":\"p\",\"schema\":" SCHEMA "}}}"),
              &req);
    assert_int_equal(req.con_strict, 0);
    q_request_free(&req);
    expect_error(CHAT("{" M ",\"response_format\":{\"type\":\"yaml\"}}"), "unsupported_value",
                 "body.response_format");
    expect_error(CHAT("{" M ",\"response_format\":\"json\"}"), "invalid_type",
                 "body.response_format");
    expect_error(CHAT("{" M ",\"response_format\":{\"type\":\"json_schema\"}}"),
                 "missing_required_parameter", "body.response_format.json_schema");
    expect_error(CHAT("{" M ",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{"
                      "\"schema\":{}}}}"),
                 "missing_required_parameter", "body.response_format.json_schema.name");
    expect_error(CHAT("{" M ",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{"
                      "\"name\":\"a b\",\"schema\":{}}}}"),
                 "invalid_value", "body.response_format.json_schema.name");
    expect_error(CHAT("{" M ",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{"
                      "\"name\":\"a\",\"schema\":[]}}}"),
                 "invalid_type", "body.response_format.json_schema.schema");
    expect_error(CHAT("{" M ",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{"
                      "\"name\":\"a\",\"strict\":1,\"schema\":{}}}}"),
                 "invalid_type", "body.response_format.json_schema.strict");
    expect_error(CHAT("{" M ",\"response_format\":{\"type\":\"json_object\",\"schema\":{}}}"),
                 "unsupported_parameter", "body.response_format");
}

static void medley_extras_take_one_constraint(void **st) {
    (void)st;
    q_request req;
    expect_ok(CHAT("{" M ",\"medley\":{\"choice\":[\"yes\",\"no\"]}}"), &req);
    assert_int_equal(req.con, Q_CON_CHOICE);
    assert_string_equal(req.con_text, "[\"yes\",\"no\"]");
    q_request_free(&req);
    expect_ok(COMPLETION("{" P ",\"medley\":{\"regex\":\"[0-9]+\"}}"), &req);
    assert_int_equal(req.con, Q_CON_REGEX);
    assert_string_equal(req.con_text, "[0-9]+");
    q_request_free(&req);
    expect_ok(CHAT("{" M ",\"medley\":{\"grammar\":\"root ::= \\\"a\\\"\"}}"), &req);
    assert_int_equal(req.con, Q_CON_GRAMMAR);
    q_request_free(&req);
    expect_error(CHAT("{" M ",\"medley\":{\"regex\":\"a\",\"choice\":[\"b\"]}}"),
                 "invalid_request_error", "body.medley.choice");
    expect_error(CHAT("{" M ",\"response_format\":{\"type\":\"json_object\"},\"medley\":{"
                      "\"regex\":\"a\"}}"),
                 "invalid_request_error", "body.medley.regex");
    expect_error(CHAT("{" M ",\"medley\":{\"choice\":[]}}"), "invalid_type", "body.medley.choice");
    expect_error(CHAT("{" M ",\"medley\":{\"choice\":[\"\"]}}"), "invalid_type",
                 "body.medley.choice");
    expect_error(CHAT("{" M ",\"medley\":{\"guided_json\":{}}}"), "unsupported_parameter",
                 "body.medley");
    expect_error(CHAT("{" M ",\"medley\":[]}"), "invalid_type", "body.medley");
    expect_error(CHAT("{" M ",\"stop\":\"}\",\"response_format\":{\"type\":\"json_object\"}}"),
                 "unsupported_parameter", "body.stop");
}

#define TOOL(name, params)                                                                         \
    "{\"type\":\"function\",\"function\":{\"name\":\"" name "\",\"parameters\":" params "}}"
#define TP                                                                                         \
    "{\"type\":\"object\",\"properties\":{\"n\":{\"$ref\":\"#/$defs/n\"}},\"$defs\":{\"n\":{}}}"

static void tools_build_a_call_schema(void **st) {
    (void)st;
    q_request req;
    /* no tool_choice with tools: auto (the runner decides whether the model can), the call
     * schema built but lazy (it holds once the model starts a call) */
    expect_ok(CHAT("{" M ",\"tools\":[" TOOL("f", "{}") "]}"), &req);
    assert_int_equal(req.tool_choice, Q_TOOLS_AUTO);
    assert_int_equal(req.con, Q_CON_JSON_SCHEMA);
    assert_int_equal(req.con_lazy, 1);
    assert_int_equal(req.parallel_tools, 1);
    q_request_free(&req);
    expect_ok(CHAT("{" M ",\"tools\":[" TOOL("f", "{}") "],\"tool_choice\":\"none\"}"), &req);
    assert_int_equal(req.tool_choice, Q_TOOLS_NONE);
    assert_int_equal(req.con, Q_CON_NONE);
    q_request_free(&req);
    expect_ok(CHAT("{" M ",\"tools\":[" TOOL("f", TP) "],\"tool_choice\":{\"type\":\"function\","
                                                      "\"function\":{\"name\":\"f\"}}}"),
              &req);
    assert_int_equal(req.tool_choice, Q_TOOLS_NAMED);
    assert_int_equal(req.con, Q_CON_JSON_SCHEMA);
    assert_string_equal(req.con_param, "body.tools");
    /* one function: no anyOf; its parameters at #/$defs/f0 with their $refs rebased */
    assert_string_equal(
        req.con_text,
        "{\"type\":\"object\",\"properties\":{\"name\":{\"const\":\"f\"},\"arguments\":{\"$ref\":"
        "\"#/$defs/f0\"}},\"required\":[\"name\",\"arguments\"],\"additionalProperties\":false,"
        "\"$defs\":{\"f0\":{\"type\":\"object\",\"properties\":{\"n\":{\"$ref\":\"#/$defs/f0/$defs/"
        "n\"}},\"$defs\":{\"n\":{}}}}}");
    q_request_free(&req);
    expect_ok(CHAT("{" M ",\"tools\":[" TOOL("f", "{}") "," TOOL("g", "null") "],\"tool_choice\":"
                                                                              "\"required\"}"),
              &req);
    assert_int_equal(req.n_tools, 2);
    assert_non_null(strstr(req.con_text, "\"anyOf\":["));
    assert_non_null(strstr(req.con_text, "{\"const\":\"g\"}"));
    assert_int_equal(req.con_strict, 0);
    q_request_free(&req);
    expect_error(CHAT("{" M ",\"tools\":[" TOOL("f", "{}") "," TOOL("f", "{}") "]}"),
                 "invalid_value", "body.tools[1]");
    expect_error(CHAT("{" M ",\"tools\":[{\"type\":\"code_interpreter\"}]}"), "unsupported_value",
                 "body.tools[0]");
    expect_error(CHAT("{" M ",\"tools\":[" TOOL("a b", "{}") "]}"), "invalid_value",
                 "body.tools[0]");
    expect_error(CHAT("{" M ",\"tools\":[" TOOL("f", "[]") "]}"), "invalid_type", "body.tools[0]");
    expect_error(
        CHAT("{" M ",\"tools\":[" TOOL("f", "{}") "],\"tool_choice\":{\"type\":"
                                                  "\"function\",\"function\":{\"name\":\"g\"}}}"),
        "invalid_value", "body.tool_choice");
    expect_error(CHAT("{" M ",\"tool_choice\":\"required\"}"), "invalid_value", "body.tool_choice");
    expect_error(CHAT("{" M ",\"tools\":[" TOOL("f", "{}") "],\"tool_choice\":\"maybe\"}"),
                 "invalid_value", "body.tool_choice");
    expect_error(CHAT("{" M ",\"parallel_tool_calls\":\"yes\"}"), "invalid_type",
                 "body.parallel_tool_calls");
    expect_error(CHAT("{" M ",\"tools\":[" TOOL(
                     "f", "{}") "],\"tool_choice\":\"required\","
                                "\"response_format\":{\"type\":\"json_object\"}}"),
                 "invalid_request_error", "body.tools");
}

static void unparsable_line_keeps_its_custom_id(void **st) {
    (void)st;
    q_request req;
    q_verr ve;
    char buf[Q_CUSTOM_ID_MAX];
    assert_int_equal(check("{\"custom_id\":\"k7\",\"body\":[[[", &req, &ve, buf), -1);
    assert_string_equal(ve.code, "invalid_json");
    assert_string_equal(req.custom_id, "k7");
    q_request_free(&req);
}

static void tool_turns_are_rendered_as_text(void **st) {
    (void)st;
    q_request req;
    expect_ok(CHAT("{\"messages\":[{\"role\":\"user\",\"content\":\"weather?\"},{\"role\":"
                   "\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"call_1\",\"type\":"
                   "\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":"
                   "\"{\\\"city\\\": \\\"Paris\\\"}\"}}]},{\"role\":\"tool\",\"tool_call_id\":"
                   "\"call_1\",\"content\":\"21 C\"}]}"),
              &req);
    assert_int_equal(req.n_msgs, 3);
    assert_string_equal(req.msgs[1].role, "assistant");
    assert_string_equal(req.msgs[1].content,
                        "{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"}}");
    assert_string_equal(req.msgs[2].role, "user");
    assert_string_equal(req.msgs[2].content, "Result of the call call_1 of get_weather: 21 C");
    q_request_free(&req);
    expect_error(CHAT("{\"messages\":[{\"role\":\"tool\",\"content\":\"x\"}]}"),
                 "missing_required_parameter", "body.messages[0]");
    expect_error(CHAT("{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{"
                      "\"name\":\"f\",\"arguments\":\"{bad\"}}]}]}"),
                 "invalid_value", "body.messages[0]");
}

/* An online request (q_limits.online, `medley api`'s routes) takes stream and stream_options;
 * a batch line refuses them, as before. */
static void online_requests_take_stream_options(void **st) {
    (void)st;
    q_request req;
    lim.online = 1;
    expect_ok(CHAT("{" M ",\"stream\":true,\"stream_options\":{\"include_usage\":true}}"), &req);
    assert_true(req.stream && req.include_usage);
    q_request_free(&req);
    expect_ok(CHAT("{" M ",\"stream\":false,\"stream_options\":null}"), &req);
    assert_true(!req.stream && !req.include_usage);
    q_request_free(&req);
    expect_ok(CHAT("{" M ",\"stream\":true,\"stream_options\":{\"include_obfuscation\":false}}"),
              &req);
    q_request_free(&req);
    expect_error(CHAT("{" M ",\"stream\":\"yes\"}"), "invalid_type", "body.stream");
    expect_error(CHAT("{" M ",\"stream_options\":{\"include_usage\":true}}"), "invalid_value",
                 "body.stream_options");
    expect_error(CHAT("{" M ",\"stream\":true,\"stream_options\":[]}"), "invalid_type",
                 "body.stream_options");
    expect_error(CHAT("{" M ",\"stream\":true,\"stream_options\":{\"x\":1}}"),
                 "unsupported_parameter", "body.stream_options.x");
    expect_error(CHAT("{" M ",\"stream\":true,\"stream_options\":{\"include_usage\":1}}"),
                 "invalid_type", "body.stream_options.include_usage");
    expect_error(CHAT("{" M ",\"stream\":true,\"stream_options\":{\"include_obfuscation\":true}}"),
                 "unsupported_value", "body.stream_options.include_obfuscation");
    expect_error(CHAT("{" M ",\"n\":2,\"stream\":true}"), "unsupported_value", "body.n");
    lim.online = 0;
    expect_error(CHAT("{" M ",\"stream\":true}"), "unsupported_value", "body.stream");
    expect_error(CHAT("{" M ",\"stream_options\":{\"include_usage\":true}}"),
                 "unsupported_parameter", "body.stream_options");
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
        cmocka_unit_test(every_openai_field_works_or_is_refused_by_name),
        cmocka_unit_test(logit_bias_is_parsed_and_bounded),
        cmocka_unit_test(response_format_sets_the_constraint),
        cmocka_unit_test(medley_extras_take_one_constraint),
        cmocka_unit_test(tools_build_a_call_schema),
        cmocka_unit_test(unparsable_line_keeps_its_custom_id),
        cmocka_unit_test(tool_turns_are_rendered_as_text),
        cmocka_unit_test(embeddings_inputs_are_parsed_or_named),
        cmocka_unit_test(online_requests_take_stream_options),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
