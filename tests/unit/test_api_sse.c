/* test_api_sse.c — api/sse.c: the end of a stream made from a worker's output line (the text
 * not streamed yet, tool calls, finish_reason, usage, [DONE]) in OpenAI's chunk shapes, an
 * error event when the line is an error or disagrees with what was streamed, and the JSON
 * answer of a line (status, body or error envelope without the batch line's "body."). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "api/online.h"

/* The events of b as JSON documents (an array); [DONE] as the string "[DONE]". */
static json_t *events(const api_buf *b) {
    json_t *out = json_array();
    const char *p = b->p;
    while (p && *p) {
        assert_memory_equal(p, "data: ", 6);
        const char *end = strstr(p, "\n\n");
        assert_non_null(end);
        json_t *doc = !strncmp(p + 6, "[DONE]", 6)
                          ? json_string("[DONE]")
                          : json_loadb(p + 6, (size_t)(end - p - 6), 0, NULL);
        assert_non_null(doc);
        json_array_append_new(out, doc);
        p = end + 2;
    }
    return out;
}

static json_t *line_of(const char *s) {
    json_t *l = json_loads(s, 0, NULL);
    assert_non_null(l);
    return l;
}

static const char *delta_content(json_t *ev) {
    json_t *c = json_array_get(json_object_get(ev, "choices"), 0);
    return json_string_value(json_object_get(json_object_get(c, "delta"), "content"));
}

#define OK_CHAT(content, finish, extra)                                                            \
    "{\"custom_id\":\"r\",\"response\":{\"status_code\":200,\"body\":{\"id\":\"chatcmpl-r\","      \
    "\"object\":\"chat.completion\",\"choices\":[{\"index\":0,\"message\":{\"role\":"              \
    "\"assistant\",\"content\":" content extra "},\"finish_reason\":\"" finish "\","               \
    "\"logprobs\":null}],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":5,"                  \
    "\"total_tokens\":8}}},\"error\":null}"

static void the_rest_of_the_text_then_finish_usage_done(void **st) {
    (void)st;
    api_sse m = {.chat = 1, .id = "chatcmpl-r", .model = "echo", .created = 7, .include_usage = 1};
    api_buf b = {0};
    json_t *line = line_of(OK_CHAT("\"Hello\"", "length", ""));
    assert_int_equal(api_sse_answer(&b, &m, line, "Hel", 3), 0);
    json_t *ev = events(&b);
    assert_int_equal(json_array_size(ev), 4);
    assert_string_equal(delta_content(json_array_get(ev, 0)), "lo");
    json_t *fin = json_array_get(json_object_get(json_array_get(ev, 1), "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(fin, "finish_reason")), "length");
    assert_int_equal(json_object_size(json_object_get(fin, "delta")), 0);
    assert_true(json_is_null(json_object_get(json_array_get(ev, 1), "usage")));
    json_t *usage = json_array_get(ev, 2);
    assert_int_equal(json_array_size(json_object_get(usage, "choices")), 0);
    assert_int_equal(
        json_integer_value(json_object_get(json_object_get(usage, "usage"), "total_tokens")), 8);
    assert_string_equal(json_string_value(json_object_get(usage, "object")),
                        "chat.completion.chunk");
    assert_string_equal(json_string_value(json_array_get(ev, 3)), "[DONE]");
    json_decref(ev);
    api_buf_free(&b);
    /* everything streamed already, no usage asked: finish and [DONE] only */
    m.include_usage = 0;
    assert_int_equal(api_sse_answer(&b, &m, line, "Hello", 5), 0);
    ev = events(&b);
    assert_int_equal(json_array_size(ev), 2);
    assert_null(json_object_get(json_array_get(ev, 0), "usage"));
    json_decref(ev);
    api_buf_free(&b);
    json_decref(line);
}

static void text_that_disagrees_with_the_stream_is_an_error(void **st) {
    (void)st;
    api_sse m = {.chat = 1, .id = "chatcmpl-r", .model = "echo", .created = 7};
    api_buf b = {0};
    json_t *line = line_of(OK_CHAT("\"Hello\"", "stop", ""));
    assert_int_equal(api_sse_answer(&b, &m, line, "Help", 4), 0);
    json_t *ev = events(&b);
    assert_int_equal(json_array_size(ev), 1); /* no [DONE] after an error */
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(json_array_get(ev, 0), "error"), "type")),
        "server_error");
    json_decref(ev);
    api_buf_free(&b);
    json_decref(line);
}

static void an_error_line_is_an_error_event_and_a_status(void **st) {
    (void)st;
    json_t *line = line_of("{\"custom_id\":\"r\",\"response\":{\"status_code\":400,\"body\":"
                           "{\"error\":{\"message\":\"too long\",\"type\":\"invalid_request_"
                           "error\",\"param\":\"body.messages\",\"code\":\"context_length_"
                           "exceeded\"}}},\"error\":null}");
    unsigned status = 0;
    json_t *doc = api_answer_doc(line, &status);
    assert_int_equal(status, 400);
    json_t *err = json_object_get(doc, "error");
    assert_string_equal(json_string_value(json_object_get(err, "param")), "messages");
    assert_string_equal(json_string_value(json_object_get(err, "code")), "context_length_exceeded");
    json_decref(doc);
    api_sse m = {.chat = 0, .id = "cmpl-r", .model = "echo", .created = 7};
    api_buf b = {0};
    assert_int_equal(api_sse_answer(&b, &m, line, "", 0), 0);
    json_t *ev = events(&b);
    assert_int_equal(json_array_size(ev), 1);
    assert_non_null(json_object_get(json_array_get(ev, 0), "error"));
    json_decref(ev);
    api_buf_free(&b);
    json_decref(line);
    /* a request that never reached a model: 500, its code kept */
    line = line_of("{\"custom_id\":\"r\",\"response\":null,\"error\":{\"code\":"
                   "\"max_attempts_exceeded\",\"message\":\"delivered 4 times\"}}");
    doc = api_answer_doc(line, &status);
    assert_int_equal(status, 500);
    assert_string_equal(json_string_value(json_object_get(json_object_get(doc, "error"), "code")),
                        "max_attempts_exceeded");
    json_decref(doc);
    json_decref(line);
}

static void tool_calls_and_logprobs_come_whole(void **st) {
    (void)st;
    api_sse m = {.chat = 1, .id = "chatcmpl-r", .model = "m", .created = 7};
    api_buf b = {0};
    json_t *line = line_of(OK_CHAT("null", "tool_calls",
                                   ",\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"function\","
                                   "\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]"));
    assert_int_equal(api_sse_answer(&b, &m, line, "", 0), 0);
    json_t *ev = events(&b);
    assert_int_equal(json_array_size(ev), 3); /* tool calls, finish, [DONE] */
    json_t *c0 = json_array_get(json_object_get(json_array_get(ev, 0), "choices"), 0);
    json_t *call = json_array_get(json_object_get(json_object_get(c0, "delta"), "tool_calls"), 0);
    assert_int_equal(json_integer_value(json_object_get(call, "index")), 0);
    assert_string_equal(json_string_value(json_object_get(call, "id")), "call_1");
    json_decref(ev);
    api_buf_free(&b);
    json_decref(line);
    /* a completion with logprobs: the text and its logprobs in one chunk */
    m.chat = 0;
    m.id = "cmpl-r";
    line = line_of("{\"custom_id\":\"r\",\"response\":{\"status_code\":200,\"body\":{\"choices\":"
                   "[{\"index\":0,\"text\":\"ab\",\"finish_reason\":\"stop\",\"logprobs\":{"
                   "\"tokens\":[\"a\",\"b\"],\"token_logprobs\":[0,0]}}],\"usage\":{}}}}");
    assert_int_equal(api_sse_answer(&b, &m, line, "", 0), 0);
    ev = events(&b);
    assert_int_equal(json_array_size(ev), 3);
    c0 = json_array_get(json_object_get(json_array_get(ev, 0), "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(c0, "text")), "ab");
    assert_int_equal(json_array_size(json_object_get(json_object_get(c0, "logprobs"), "tokens")),
                     2);
    assert_string_equal(json_string_value(json_object_get(json_array_get(ev, 0), "object")),
                        "text_completion");
    json_decref(ev);
    api_buf_free(&b);
    json_decref(line);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(the_rest_of_the_text_then_finish_usage_done),
        cmocka_unit_test(text_that_disagrees_with_the_stream_is_an_error),
        cmocka_unit_test(an_error_line_is_an_error_event_and_a_status),
        cmocka_unit_test(tool_calls_and_logprobs_come_whole),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
