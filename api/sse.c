/* sse.c — see online.h: OpenAI's streamed chunks as server-sent events, and the answer
 * documents made from a worker's output line (schemas/output-line, schemas/error-line).
 *
 * Chat (`chat.completion.chunk`): the role first (delta {role, content ""}), then content
 * pieces (delta {content}), tool calls in one chunk (delta {tool_calls: [{index, id, type,
 * function {name, arguments}}]}), a last chunk with an empty delta and the finish_reason, with
 * stream_options.include_usage a chunk with no choices and the usage (every chunk before it
 * carries "usage": null), then `data: [DONE]`. Completions (`text_completion`): the same
 * without a role chunk, each choice {text, index, logprobs, finish_reason}. An error after
 * the stream began is an event {"error": {...}} and the end of the stream, without [DONE]
 * (the openai SDK raises it as an APIError). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/online.h"

int api_buf_add(api_buf *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t cap = (b->len + n + 1) * 2;
        char *p = realloc(b->p, cap);
        if (!p)
            return -1;
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
    return 0;
}

void api_buf_free(api_buf *b) {
    free(b->p);
    *b = (api_buf){0};
}

/* `data: <doc>\n\n`; doc is consumed. */
static int event(api_buf *b, json_t *doc) {
    char *s = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
    json_decref(doc);
    if (!s)
        return -1;
    int rc =
        api_buf_add(b, "data: ", 6) || api_buf_add(b, s, strlen(s)) || api_buf_add(b, "\n\n", 2)
            ? -1
            : 0;
    free(s);
    return rc;
}

/* A chunk with one choice: chat's {index, delta, logprobs, finish_reason} or completions'
 * {text, index, logprobs, finish_reason}. delta (chat) and logprobs are consumed. */
static json_t *chunk(const api_sse *m, json_t *delta, const char *text, size_t n, json_t *logprobs,
                     const char *finish) {
    json_t *choice =
        m->chat ? json_pack("{s:i, s:o, s:o, s:o}", "index", 0, "delta", delta, "logprobs",
                            logprobs ? logprobs : json_null(), "finish_reason",
                            finish ? json_string(finish) : json_null())
                : json_pack("{s:s%, s:i, s:o, s:o}", "text", text ? text : "", text ? n : 0,
                            "index", 0, "logprobs", logprobs ? logprobs : json_null(),
                            "finish_reason", finish ? json_string(finish) : json_null());
    json_t *doc = json_pack("{s:s, s:s, s:I, s:s, s:n, s:[o]}", "id", m->id, "object",
                            m->chat ? "chat.completion.chunk" : "text_completion", "created",
                            (json_int_t)m->created, "model", m->model, "system_fingerprint",
                            "choices", choice);
    if (doc && m->include_usage)
        json_object_set_new(doc, "usage", json_null());
    return doc;
}

int api_sse_role(api_buf *b, const api_sse *m) {
    return event(b, chunk(m, json_pack("{s:s, s:s}", "role", "assistant", "content", ""), NULL, 0,
                          NULL, NULL));
}

int api_sse_text(api_buf *b, const api_sse *m, const char *text, size_t n, json_t *logprobs) {
    json_t *lp = logprobs ? json_incref(logprobs) : NULL;
    json_t *delta = m->chat ? json_pack("{s:s%}", "content", text, n) : NULL;
    return event(b, chunk(m, delta, text, n, lp, NULL));
}

int api_sse_error(api_buf *b, json_t *error) {
    return event(b, json_pack("{s:O}", "error", error));
}

/* The tool calls of a chat answer as one delta, each with its index. */
static int tool_calls(api_buf *b, const api_sse *m, json_t *calls) {
    json_t *list = json_array();
    size_t i;
    json_t *call;
    json_array_foreach(calls, i, call) {
        json_t *c = json_deep_copy(call);
        if (c)
            json_object_set_new(c, "index", json_integer((json_int_t)i));
        json_array_append_new(list, c);
    }
    return event(b, chunk(m, json_pack("{s:o}", "tool_calls", list), NULL, 0, NULL, NULL));
}

/* OpenAI's error object of an output line that is not a success; NULL for a success.
 * *status: the HTTP status it stands for. */
static json_t *line_error(json_t *line, unsigned *status) {
    json_t *resp = json_object_get(line, "response");
    json_int_t code = json_integer_value(json_object_get(resp, "status_code"));
    if (json_is_object(resp) && code == 200)
        return NULL;
    json_t *err = json_object_get(json_object_get(resp, "body"), "error");
    if (json_is_object(err)) {
        *status = code >= 400 && code < 600 ? (unsigned)code : 500;
        json_t *out = json_deep_copy(err);
        const char *param = json_string_value(json_object_get(out, "param"));
        if (out && param && !strncmp(param, "body.", 5)) /* the request's own field names */
            json_object_set_new(out, "param", json_string(param + 5));
        return out;
    }
    /* never reached a model: {code, message} (server_error, max_attempts_exceeded, ...) */
    json_t *e = json_object_get(line, "error");
    const char *c = json_string_value(json_object_get(e, "code"));
    const char *msg = json_string_value(json_object_get(e, "message"));
    *status = 500;
    return json_pack("{s:s, s:s, s:n, s:s}", "message", msg ? msg : "the worker failed", "type",
                     "server_error", "param", "code", c ? c : "server_error");
}

json_t *api_answer_doc(json_t *line, unsigned *status) {
    json_t *err = line_error(line, status);
    if (err)
        return json_pack("{s:o}", "error", err);
    *status = 200;
    json_t *body = json_object_get(json_object_get(line, "response"), "body");
    return json_is_object(body) ? json_incref(body)
                                : json_pack("{s:{s:s, s:s, s:n, s:s}}", "error", "message",
                                            "the worker's answer has no body", "type",
                                            "server_error", "param", "code", "server_error");
}

static int error_event(api_buf *b, const char *code, const char *msg) {
    json_t *err = json_pack("{s:s, s:s, s:n, s:s}", "message", msg, "type", "server_error", "param",
                            "code", code);
    int rc = err ? api_sse_error(b, err) : -1;
    json_decref(err);
    return rc;
}

int api_sse_answer(api_buf *b, const api_sse *m, json_t *line, const char *streamed, size_t n) {
    unsigned status;
    json_t *err = line_error(line, &status);
    if (err) {
        int rc = api_sse_error(b, err);
        json_decref(err);
        return rc;
    }
    json_t *body = json_object_get(json_object_get(line, "response"), "body");
    json_t *choice = json_array_get(json_object_get(body, "choices"), 0);
    json_t *msg = json_object_get(choice, "message");
    const char *content = json_string_value(m->chat ? json_object_get(msg, "content")
                                                    : json_object_get(choice, "text"));
    size_t clen = content ? strlen(content) : 0;
    if (n > clen || (n && memcmp(content, streamed, n)))
        return error_event(b, "server_error",
                           "the request was run again after a worker failed, and its answer "
                           "differs from the text already streamed");
    json_t *lp = json_object_get(choice, "logprobs");
    lp = json_is_null(lp) ? NULL : lp;
    if ((clen > n || lp) && api_sse_text(b, m, content ? content + n : "", clen - n, lp))
        return -1;
    json_t *calls = m->chat ? json_object_get(msg, "tool_calls") : NULL;
    if (json_is_array(calls) && json_array_size(calls) && tool_calls(b, m, calls))
        return -1;
    const char *finish = json_string_value(json_object_get(choice, "finish_reason"));
    json_t *delta = m->chat ? json_object() : NULL;
    if (event(b, chunk(m, delta, "", 0, NULL, finish ? finish : "stop")))
        return -1;
    if (m->include_usage) {
        json_t *u = json_pack("{s:s, s:s, s:I, s:s, s:n, s:[], s:O*}", "id", m->id, "object",
                              m->chat ? "chat.completion.chunk" : "text_completion", "created",
                              (json_int_t)m->created, "model", m->model, "system_fingerprint",
                              "choices", "usage", json_object_get(body, "usage"));
        if (event(b, u))
            return -1;
    }
    return api_buf_add(b, "data: [DONE]\n\n", 14);
}
