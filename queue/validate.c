/* validate.c — see validate.h. Every rejection names the field and what was expected, in
 * the words of OpenAI's API errors, so a client can fix its line without reading code. */
#include "queue/validate.h"

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"

void q_limits_default(q_limits *l) {
    l->max_line_bytes = 1u << 20;
    l->max_tokens_default = 256;
    l->max_tokens_limit = 32768;
}

static int fail(q_verr *ve, const char *code, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fail(q_verr *ve, const char *code, const char *param, const char *fmt, ...) {
    snprintf(ve->code, sizeof ve->code, "%s", code);
    snprintf(ve->param, sizeof ve->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ve->message, sizeof ve->message, fmt, ap);
    va_end(ap);
    ve->status = 400;
    return -1;
}

/* Skip a JSON string starting after its opening quote at line[k]; returns the index after
 * the closing quote, or lim when the window ends inside it. */
static size_t skip_string(const char *line, size_t k, size_t lim) {
    while (k < lim && line[k] != '"')
        k += line[k] == '\\' ? 2 : 1;
    return k < lim ? k + 1 : lim;
}

static size_t skip_ws(const char *line, size_t k, size_t lim) {
    while (k < lim && (line[k] == ' ' || line[k] == '\t' || line[k] == '\n' || line[k] == '\r'))
        k++;
    return k;
}

const char *q_scan_custom_id(const char *line, size_t len, char buf[Q_CUSTOM_ID_MAX]) {
    size_t lim = len < Q_SCAN_WINDOW ? len : Q_SCAN_WINDOW;
    static const char key[] = "custom_id";
    size_t k = skip_ws(line, 0, lim);
    if (k >= lim || line[k] != '{')
        return NULL; /* not an object: no top-level key */
    int depth = 1, expect_key = 1;
    for (k++; k < lim;) {
        char ch = line[k];
        if (ch == '"') {
            size_t start = k + 1, end = skip_string(line, start, lim);
            if (end >= lim)
                return NULL;
            if (depth == 1 && expect_key) {
                expect_key = 0;
                size_t v = skip_ws(line, end, lim);
                if (v >= lim || line[v] != ':')
                    return NULL; /* not JSON: stop guessing */
                if (end - 1 - start == sizeof key - 1 &&
                    !memcmp(line + start, key, sizeof key - 1)) {
                    v = skip_ws(line, v + 1, lim);
                    if (v >= lim || line[v] != '"')
                        return NULL; /* the top-level custom_id is not a string */
                    size_t a = v + 1, b = a;
                    while (b < lim && line[b] != '"' && line[b] != '\\' &&
                           (unsigned char)line[b] >= 0x20)
                        b++;
                    if (b >= lim || line[b] != '"' || b == a || b - a >= Q_CUSTOM_ID_MAX)
                        return NULL; /* escapes, control bytes, empty or too long: no guess */
                    memcpy(buf, line + a, b - a);
                    buf[b - a] = 0;
                    return buf;
                }
                k = v + 1;
                continue;
            }
            k = end;
            continue;
        }
        if (ch == '{' || ch == '[') {
            depth++;
        } else if (ch == '}' || ch == ']') {
            if (--depth == 0)
                return NULL; /* the object ended without a custom_id */
        } else if (ch == ',' && depth == 1) {
            expect_key = 1;
        }
        k++;
    }
    return NULL;
}

/* Content of a message: a string, or an array of {"type":"text","text":...} parts joined
 * into req->text at *used. */
static int message_content(q_request *req, json_t *content, int idx, size_t *used, size_t cap,
                           const char **out, q_verr *ve) {
    char param[64];
    snprintf(param, sizeof param, "body.messages[%d].content", idx);
    if (json_is_string(content)) {
        *out = json_string_value(content);
        return 0;
    }
    if (!json_is_array(content))
        return fail(ve, "invalid_type", param,
                    "%s must be a string or an array of text parts, "
                    "not %s",
                    param, md_json_type_name(content));
    char *dst = req->text + *used;
    size_t n = 0;
    size_t i;
    json_t *part;
    json_array_foreach(content, i, part) {
        const char *type = json_string_value(json_object_get(part, "type"));
        json_t *text = json_object_get(part, "text");
        if (!json_is_object(part) || !type)
            return fail(ve, "invalid_type", param, "%s[%zu] must be an object with a \"type\"",
                        param, i);
        if (strcmp(type, "text"))
            return fail(ve, "unsupported_value", param,
                        "%s[%zu] has type \"%s\"; only \"text\" parts are supported", param, i,
                        type);
        if (!json_is_string(text))
            return fail(ve, "invalid_type", param, "%s[%zu].text must be a string", param, i);
        size_t tl = json_string_length(text);
        if (*used + n + tl + 1 > cap)
            return fail(ve, "invalid_value", param, "%s is too large", param);
        memcpy(dst + n, json_string_value(text), tl);
        n += tl;
    }
    dst[n] = 0;
    *used += n + 1;
    *out = dst;
    return 0;
}

static int get_number(json_t *body, const char *key, double lo, double hi, int lo_open, double *out,
                      q_verr *ve) {
    json_t *v = json_object_get(body, key);
    if (!v || json_is_null(v))
        return 0;
    char param[64];
    snprintf(param, sizeof param, "body.%s", key);
    if (!json_is_number(v))
        return fail(ve, "invalid_type", param, "%s must be a number, not %s", param,
                    md_json_type_name(v));
    double x = json_number_value(v);
    if (!isfinite(x) || x < lo || x > hi || (lo_open && x <= lo))
        return fail(ve, "invalid_value", param, "%s is %g; expected a number in %s%g, %g]", param,
                    x, lo_open ? "(" : "[", lo, hi);
    *out = x;
    return 0;
}

/* An integer field within [lo, hi]; expect says what is accepted, for both errors. Returns 1
 * with *out set, 0 when absent or null (*out untouched), -1 with *ve filled. */
static int get_int(json_t *body, const char *key, long long lo, long long hi, const char *expect,
                   long long *out, q_verr *ve) {
    json_t *v = json_object_get(body, key);
    if (!v || json_is_null(v))
        return 0;
    char param[64];
    snprintf(param, sizeof param, "body.%s", key);
    if (!json_is_integer(v))
        return fail(ve, "invalid_type", param, "%s must be %s, not %s", param, expect,
                    md_json_type_name(v));
    long long x = (long long)json_integer_value(v);
    if (x < lo || x > hi)
        return fail(ve, "invalid_value", param, "%s is %lld; expected %s", param, x, expect);
    *out = x;
    return 1;
}

/* logprobs as each endpoint spells it: chat's logprobs (boolean) and top_logprobs (0..20,
 * needs logprobs: true), completions' logprobs (0..5: the number of alternatives). */
static int get_logprobs(json_t *body, q_request *req, q_verr *ve) {
    if (!req->chat) {
        long long n = 0;
        int has = get_int(body, "logprobs", 0, Q_MAX_COMPLETION_LOGPROBS,
                          "an integer in 0..5 (or null) for a completion", &n, ve);
        if (has < 0)
            return -1;
        req->logprobs = has;
        req->top_logprobs = (int)n;
        return 0;
    }
    json_t *lp = json_object_get(body, "logprobs");
    if (lp && !json_is_null(lp)) {
        if (!json_is_boolean(lp))
            return fail(ve, "invalid_type", "body.logprobs",
                        "body.logprobs must be a boolean for a chat completion, not %s",
                        md_json_type_name(lp));
        req->logprobs = json_is_true(lp);
    }
    long long top = 0;
    int has = get_int(body, "top_logprobs", 0, Q_MAX_TOP_LOGPROBS, "an integer in 0..20", &top, ve);
    if (has < 0)
        return -1;
    if (has && !req->logprobs)
        return fail(ve, "invalid_value", "body.top_logprobs",
                    "body.top_logprobs is given, so body.logprobs must be true");
    req->top_logprobs = (int)top;
    return 0;
}

/* The line's envelope: custom_id, method "POST", the url (sets req->chat) and the body
 * object, into *body. Returns 0, or -1 with *ve filled. */
static int check_envelope(json_t *root, q_request *req, json_t **body, q_verr *ve) {
    json_t *cid = json_object_get(root, "custom_id");
    if (json_is_string(cid) && json_string_length(cid) > 0 &&
        json_string_length(cid) < Q_CUSTOM_ID_MAX &&
        strlen(json_string_value(cid)) == json_string_length(cid))
        req->custom_id = json_string_value(cid);
    if (!cid)
        return fail(ve, "missing_required_parameter", "custom_id",
                    "the line has no custom_id (a string unique within the batch)");
    if (!req->custom_id)
        return fail(ve, "invalid_value", "custom_id",
                    "custom_id must be a non-empty string of at most %d bytes without NUL, not %s",
                    Q_CUSTOM_ID_MAX - 1, md_json_type_name(cid));

    json_t *method = json_object_get(root, "method");
    if (!method)
        return fail(ve, "missing_required_parameter", "method",
                    "the line has no method (\"POST\")");
    if (!json_is_string(method) || strcmp(json_string_value(method), "POST"))
        return fail(ve, "invalid_value", "method", "method must be \"POST\"");
    json_t *url = json_object_get(root, "url");
    if (!url)
        return fail(ve, "missing_required_parameter", "url",
                    "the line has no url (\"/v1/chat/completions\" or \"/v1/completions\")");
    req->url = json_string_value(url);
    if (req->url && !strcmp(req->url, "/v1/chat/completions"))
        req->chat = 1;
    else if (req->url && !strcmp(req->url, "/v1/completions"))
        req->chat = 0;
    else
        return fail(ve, "invalid_url", "url",
                    "url must be \"/v1/chat/completions\" or \"/v1/completions\"");
    *body = json_object_get(root, "body");
    if (!*body)
        return fail(ve, "missing_required_parameter", "body", "the line has no body");
    if (!json_is_object(*body))
        return fail(ve, "invalid_type", "body", "body must be an object, not %s",
                    md_json_type_name(*body));
    return 0;
}

/* Append printf text to req->text at *used (NUL-terminated); its start in *out. */
static int text_append(q_request *req, size_t *used, size_t cap, const char **out, q_verr *ve,
                       const char *fmt, ...) __attribute__((format(printf, 6, 7)));
static int text_append(q_request *req, size_t *used, size_t cap, const char **out, q_verr *ve,
                       const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(req->text + *used, cap - *used, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= cap - *used)
        return fail(ve, "invalid_value", "body.messages", "body.messages is too large");
    *out = req->text + *used;
    *used += (size_t)n + 1;
    return 0;
}

/* An assistant turn that called functions (tool_calls, content null or text): rendered as
 * the calls the model would have written under medley's tool prompt (runner_engine.c),
 * {"name": ..., "arguments": {...}} one per line, after the content when there is some. */
static int assistant_calls(q_request *req, json_t *calls, json_t *content, const char *param,
                           size_t *used, size_t cap, const char **out, q_verr *ve) {
    if (!json_is_array(calls) || json_array_size(calls) == 0)
        return fail(ve, "invalid_type", param, "%s.tool_calls must be a non-empty array", param);
    const char *text = content && json_is_string(content) ? json_string_value(content) : "";
    if (content && !json_is_null(content) && !json_is_string(content))
        return fail(ve, "invalid_type", param,
                    "%s.content must be a string or null next to tool_calls", param);
    size_t start = *used;
    const char *piece;
    if (text_append(req, used, cap, &piece, ve, "%s", text))
        return -1;
    size_t k;
    json_t *c;
    json_array_foreach(calls, k, c) {
        json_t *f = json_object_get(c, "function");
        const char *name = json_string_value(json_object_get(f, "name"));
        const char *args = json_string_value(json_object_get(f, "arguments"));
        json_t *parsed = args ? json_loads(args, JSON_DECODE_ANY, NULL) : NULL;
        if (!name || !parsed) {
            json_decref(parsed);
            return fail(ve, "invalid_value", param,
                        "%s.tool_calls[%zu] must be {\"type\": \"function\", \"function\": "
                        "{\"name\", \"arguments\": <JSON text>}}",
                        param, k);
        }
        json_t *call = json_pack("{s:s, s:o}", "name", name, "arguments", parsed);
        char *js = call ? json_dumps(call, JSON_COMPACT) : NULL;
        json_decref(call);
        if (!js)
            return fail(ve, "server_error", NULL, "out of memory");
        *used -= 1; /* continue the same string: drop its NUL */
        int rc = text_append(req, used, cap, &piece, ve, "%s%s", *used > start ? "\n" : "", js);
        free(js);
        if (rc)
            return -1;
    }
    *out = req->text + start;
    return 0;
}

/* A tool turn (role "tool", tool_call_id, content: the function's result): rendered as a user
 * turn saying which call it answers, since the templates medley serves have no tool role. */
static int tool_result(q_request *req, json_t *msgs, size_t i, const char *param, size_t *used,
                       size_t cap, q_msg *msg, q_verr *ve) {
    const char *id = json_string_value(json_object_get(json_array_get(msgs, i), "tool_call_id"));
    if (!id)
        return fail(ve, "missing_required_parameter", param,
                    "%s.tool_call_id must name the call this result answers", param);
    const char *name = NULL;
    for (size_t j = 0; j < i && !name; j++) {
        size_t k;
        json_t *c;
        json_array_foreach(json_object_get(json_array_get(msgs, j), "tool_calls"), k, c) {
            const char *cid = json_string_value(json_object_get(c, "id"));
            if (cid && !strcmp(cid, id))
                name = json_string_value(json_object_get(json_object_get(c, "function"), "name"));
        }
    }
    msg->role = "user";
    return text_append(req, used, cap, &msg->content, ve, "Result of the call %.64s%s%.64s: %s", id,
                       name ? " of " : "", name ? name : "", msg->content);
}

/* A chat completion's body.messages into req->msgs, their text in req->text (sized from the
 * line's length len). */
static int get_messages(json_t *body, size_t len, q_request *req, q_verr *ve) {
    json_t *msgs = json_object_get(body, "messages");
    if (!msgs)
        return fail(ve, "missing_required_parameter", "body.messages",
                    "a chat completion needs body.messages");
    if (!json_is_array(msgs) || json_array_size(msgs) == 0)
        return fail(ve, "invalid_type", "body.messages",
                    "body.messages must be a non-empty array of {role, content}");
    if (json_array_size(msgs) > Q_MAX_MSGS)
        return fail(ve, "invalid_value", "body.messages",
                    "body.messages has %zu messages; at most %d are accepted",
                    json_array_size(msgs), Q_MAX_MSGS);
    /* the text parts joined, and the tool turns rewritten (at most the line's bytes again,
     * plus a fixed wording per message) */
    size_t cap = 2 * len + 256 * Q_MAX_MSGS, used = 0;
    req->text = malloc(cap);
    if (!req->text)
        return fail(ve, "server_error", NULL, "out of memory");
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m) {
        char param[64];
        snprintf(param, sizeof param, "body.messages[%zu]", i);
        if (!json_is_object(m))
            return fail(ve, "invalid_type", param, "%s must be an object, not %s", param,
                        md_json_type_name(m));
        const char *role = json_string_value(json_object_get(m, "role"));
        if (!role)
            return fail(ve, "missing_required_parameter", param,
                        "%s.role must be a string (system, user, assistant or tool)", param);
        if (!strcmp(role, "developer"))
            role = "system";
        if (strcmp(role, "system") && strcmp(role, "user") && strcmp(role, "assistant") &&
            strcmp(role, "tool"))
            return fail(ve, "invalid_value", param,
                        "%s.role is \"%s\"; expected system, developer, user, assistant or tool",
                        param, role);
        json_t *content = json_object_get(m, "content");
        json_t *calls = json_object_get(m, "tool_calls");
        if (!strcmp(role, "assistant") && calls && !json_is_null(calls)) {
            req->msgs[i].role = role;
            if (assistant_calls(req, calls, content, param, &used, cap, &req->msgs[i].content, ve))
                return -1;
            continue;
        }
        if (!content)
            return fail(ve, "missing_required_parameter", param, "%s has no content", param);
        req->msgs[i].role = role;
        if (message_content(req, content, (int)i, &used, cap, &req->msgs[i].content, ve))
            return -1;
        if (!strcmp(role, "tool") &&
            tool_result(req, msgs, i, param, &used, cap, &req->msgs[i], ve))
            return -1;
    }
    req->n_msgs = (int)json_array_size(msgs);
    return 0;
}

/* A completion's body.prompt: a string, or an array of one string. */
static int get_prompt(json_t *body, q_request *req, q_verr *ve) {
    json_t *prompt = json_object_get(body, "prompt");
    if (!prompt)
        return fail(ve, "missing_required_parameter", "body.prompt",
                    "a completion needs body.prompt");
    if (json_is_array(prompt) && json_array_size(prompt) == 1 &&
        json_is_string(json_array_get(prompt, 0)))
        prompt = json_array_get(prompt, 0);
    if (!json_is_string(prompt))
        return fail(ve, "invalid_type", "body.prompt",
                    "body.prompt must be a string (or an array of one string), not %s",
                    md_json_type_name(prompt));
    req->prompt = json_string_value(prompt);
    return 0;
}

/* body.max_completion_tokens, else body.max_tokens, else the limits' default. */
static int get_max_tokens(json_t *body, const q_limits *lim, q_request *req, q_verr *ve) {
    json_t *mt = json_object_get(body, "max_completion_tokens");
    const char *mtname = "body.max_completion_tokens";
    if (!mt || json_is_null(mt)) {
        mt = json_object_get(body, "max_tokens");
        mtname = "body.max_tokens";
    }
    req->max_tokens = lim->max_tokens_default;
    if (mt && !json_is_null(mt)) {
        if (!json_is_integer(mt))
            return fail(ve, "invalid_type", mtname, "%s must be an integer, not %s", mtname,
                        md_json_type_name(mt));
        json_int_t v = json_integer_value(mt);
        if (v < 1 || v > lim->max_tokens_limit)
            return fail(ve, "invalid_value", mtname, "%s is %lld; expected 1..%d", mtname,
                        (long long)v, lim->max_tokens_limit);
        req->max_tokens = (int)v;
    }
    return 0;
}

/* body.stop: a string or an array of at most Q_MAX_STOP non-empty strings, into req->stop
 * (NULL-terminated). */
static int get_stop(json_t *body, q_request *req, q_verr *ve) {
    json_t *stop = json_object_get(body, "stop");
    if (stop && !json_is_null(stop)) {
        if (json_is_string(stop)) {
            req->stop[req->n_stop++] = json_string_value(stop);
        } else if (json_is_array(stop)) {
            if (json_array_size(stop) > Q_MAX_STOP)
                return fail(ve, "invalid_value", "body.stop",
                            "body.stop has %zu sequences; at most %d are allowed",
                            json_array_size(stop), Q_MAX_STOP);
            size_t i;
            json_t *s;
            json_array_foreach(stop, i, s) {
                if (!json_is_string(s))
                    return fail(ve, "invalid_type", "body.stop",
                                "body.stop[%zu] must be a string, not %s", i, md_json_type_name(s));
                req->stop[req->n_stop++] = json_string_value(s);
            }
        } else {
            return fail(ve, "invalid_type", "body.stop",
                        "body.stop must be a string or an array of strings, not %s",
                        md_json_type_name(stop));
        }
        for (int i = 0; i < req->n_stop; i++)
            if (!req->stop[i][0])
                return fail(ve, "invalid_value", "body.stop", "body.stop holds an empty string");
    }
    req->stop[req->n_stop] = NULL;
    return 0;
}

/* ---- body fields -------------------------------------------------------------------- */

enum { EP_CHAT = 1, EP_COMP = 2, EP_BOTH = 3 };
enum {
    F_USED,      /* parsed by its own function below */
    F_NO_EFFECT, /* accepted and checked for type; changes nothing in a batch (documented) */
    F_NULL_ONLY, /* refused unless null */
    F_FALSE,     /* refused unless false or null */
    F_ONE,       /* refused unless 1 or null */
};

/* Every body field OpenAI documents for /v1/chat/completions and /v1/completions (and the
 * vLLM sampling extras medley takes), with what medley does with it. docs/protocol.md §4
 * has the same table with the reasons. */
static const struct {
    const char *name;
    int ep, rule;
    const char *why; /* for refusals: what medley lacks */
} fields[] = {
    {"model", EP_BOTH, F_USED, NULL},
    {"messages", EP_CHAT, F_USED, NULL},
    {"prompt", EP_COMP, F_USED, NULL},
    {"max_tokens", EP_BOTH, F_USED, NULL},
    {"max_completion_tokens", EP_CHAT, F_USED, NULL},
    {"temperature", EP_BOTH, F_USED, NULL},
    {"top_p", EP_BOTH, F_USED, NULL},
    {"top_k", EP_BOTH, F_USED, NULL},
    {"min_p", EP_BOTH, F_USED, NULL},
    {"repetition_penalty", EP_BOTH, F_USED, NULL},
    {"presence_penalty", EP_BOTH, F_USED, NULL},
    {"frequency_penalty", EP_BOTH, F_USED, NULL},
    {"logprobs", EP_BOTH, F_USED, NULL},
    {"top_logprobs", EP_CHAT, F_USED, NULL},
    {"seed", EP_BOTH, F_USED, NULL},
    {"stop", EP_BOTH, F_USED, NULL},
    {"logit_bias", EP_BOTH, F_USED, NULL},
    {"response_format", EP_BOTH, F_USED, NULL},
    {"tools", EP_CHAT, F_USED, NULL},
    {"tool_choice", EP_CHAT, F_USED, NULL},
    {"parallel_tool_calls", EP_CHAT, F_USED, NULL},
    {"medley", EP_BOTH, F_USED, NULL},
    {"user", EP_BOTH, F_NO_EFFECT, NULL},
    {"safety_identifier", EP_CHAT, F_NO_EFFECT, NULL},
    {"prompt_cache_key", EP_CHAT, F_NO_EFFECT, NULL},
    {"metadata", EP_CHAT, F_NO_EFFECT, NULL},
    {"service_tier", EP_CHAT, F_NO_EFFECT, NULL},
    {"n", EP_BOTH, F_ONE, "a batch answer holds one choice"},
    {"best_of", EP_COMP, F_ONE, "medley generates one candidate per request"},
    {"stream", EP_BOTH, F_FALSE, "a batch is not streamed"},
    {"store", EP_CHAT, F_FALSE, "medley does not store completions"},
    {"echo", EP_COMP, F_FALSE, "medley does not echo the prompt"},
    {"stream_options", EP_BOTH, F_NULL_ONLY, "a batch is not streamed"},
    {"suffix", EP_COMP, F_NULL_ONLY, "medley does not insert between a prompt and a suffix"},
    {"modalities", EP_CHAT, F_USED, NULL},
    {"audio", EP_CHAT, F_NULL_ONLY, "medley has no audio output"},
    {"prediction", EP_CHAT, F_NULL_ONLY, "medley has no predicted outputs"},
    {"reasoning_effort", EP_CHAT, F_NULL_ONLY, "the models medley serves do not reason"},
    {"verbosity", EP_CHAT, F_NULL_ONLY, "medley has no verbosity control"},
    {"web_search_options", EP_CHAT, F_NULL_ONLY, "medley has no web search"},
    {"functions", EP_CHAT, F_NULL_ONLY, "the deprecated form of tools: use tools"},
    {"function_call", EP_CHAT, F_NULL_ONLY, "the deprecated form of tool_choice: use tool_choice"},
};

/* Each key of the body: known for this endpoint, and when medley does not do what it asks,
 * null or its default. */
static int check_fields(json_t *body, int chat, q_verr *ve) {
    const char *key;
    json_t *v;
    json_object_foreach(body, key, v) {
        char param[64];
        snprintf(param, sizeof param, "body.%.58s", key);
        int k = -1;
        for (size_t i = 0; i < sizeof fields / sizeof fields[0] && k < 0; i++)
            if (!strcmp(fields[i].name, key))
                k = (int)i;
        if (k < 0)
            return fail(ve, "unsupported_parameter", param,
                        "Unrecognized request argument supplied: %s (medley's parameters: "
                        "docs/protocol.md)",
                        key);
        if (!(fields[k].ep & (chat ? EP_CHAT : EP_COMP)))
            return fail(ve, "unsupported_parameter", param, "%s is a parameter of %s, not of %s",
                        param, chat ? "/v1/completions" : "/v1/chat/completions",
                        chat ? "/v1/chat/completions" : "/v1/completions");
        if (json_is_null(v))
            continue;
        switch (fields[k].rule) {
        case F_NO_EFFECT:
            if (!strcmp(key, "metadata")) {
                if (!json_is_object(v) || json_object_size(v) > 16)
                    return fail(ve, "invalid_type", param,
                                "%s must be an object of at most 16 string values", param);
                const char *mk;
                json_t *mv;
                json_object_foreach(v, mk, mv) if (!json_is_string(mv)) return fail(
                    ve, "invalid_type", param, "%s.%.40s must be a string, not %s", param, mk,
                    md_json_type_name(mv));
            } else if (!json_is_string(v)) {
                return fail(ve, "invalid_type", param, "%s must be a string, not %s", param,
                            md_json_type_name(v));
            }
            break;
        case F_NULL_ONLY:
            return fail(ve, "unsupported_parameter", param,
                        "%s is not supported (%s); remove it or set it to null", param,
                        fields[k].why);
        case F_FALSE:
            if (!json_is_boolean(v))
                return fail(ve, "invalid_type", param, "%s must be a boolean, not %s", param,
                            md_json_type_name(v));
            if (json_is_true(v))
                return fail(ve, "unsupported_value", param,
                            "%s: true is not supported (%s); remove it", param, fields[k].why);
            break;
        case F_ONE:
            if (!json_is_integer(v))
                return fail(ve, "invalid_type", param, "%s must be an integer, not %s", param,
                            md_json_type_name(v));
            if (json_integer_value(v) != 1)
                return fail(ve, "unsupported_value", param, "only %s = 1 is supported (%s)", param,
                            fields[k].why);
            break;
        default: break;
        }
    }
    json_t *mod = json_object_get(body, "modalities");
    if (mod && !json_is_null(mod)) {
        if (!json_is_array(mod))
            return fail(ve, "invalid_type", "body.modalities",
                        "body.modalities must be an array, not %s", md_json_type_name(mod));
        size_t i;
        json_t *m;
        json_array_foreach(mod, i, m) {
            if (!json_is_string(m) || strcmp(json_string_value(m), "text"))
                return fail(ve, "unsupported_value", "body.modalities",
                            "body.modalities[%zu]: only \"text\" output is supported", i);
        }
    }
    return 0;
}

/* body.logit_bias: {"<token id>": bias in [-100, 100]}, keys as OpenAI sends them (decimal
 * strings). Whether an id exists in the model's vocabulary is the runner's check. */
static int get_logit_bias(json_t *body, q_request *req, q_verr *ve) {
    json_t *lb = json_object_get(body, "logit_bias");
    if (!lb || json_is_null(lb))
        return 0;
    if (!json_is_object(lb))
        return fail(ve, "invalid_type", "body.logit_bias",
                    "body.logit_bias must be an object mapping token ids to biases, not %s",
                    md_json_type_name(lb));
    size_t n = json_object_size(lb);
    if (n > Q_MAX_LOGIT_BIAS)
        return fail(ve, "invalid_value", "body.logit_bias",
                    "body.logit_bias has %zu entries; at most %d are accepted", n,
                    Q_MAX_LOGIT_BIAS);
    if (n == 0)
        return 0;
    req->bias_ids = malloc(n * sizeof *req->bias_ids);
    req->bias = malloc(n * sizeof *req->bias);
    if (!req->bias_ids || !req->bias)
        return fail(ve, "server_error", NULL, "out of memory");
    const char *key;
    json_t *v;
    json_object_foreach(lb, key, v) {
        char *end = NULL;
        long long id = strtoll(key, &end, 10);
        if (!*key || *end || id < 0 || id > INT32_MAX || key[0] == '+' || key[0] == ' ')
            return fail(ve, "invalid_value", "body.logit_bias",
                        "body.logit_bias key \"%.40s\" is not a token id (a non-negative "
                        "decimal integer)",
                        key);
        if (!json_is_number(v))
            return fail(ve, "invalid_type", "body.logit_bias",
                        "body.logit_bias[\"%.40s\"] must be a number, not %s", key,
                        md_json_type_name(v));
        double b = json_number_value(v);
        if (!isfinite(b) || b < -100 || b > 100)
            return fail(ve, "invalid_value", "body.logit_bias",
                        "body.logit_bias[\"%.40s\"] is %g; expected a number in [-100, 100]", key,
                        b);
        req->bias_ids[req->n_bias] = (int32_t)id;
        req->bias[req->n_bias++] = (float)b;
    }
    return 0;
}

/* Set the line's constraint; a second one is refused (one constraint per line). text is
 * copied (len bytes). */
static int set_constraint(q_request *req, q_con_kind kind, const char *param, const char *text,
                          size_t len, int strict, q_verr *ve) {
    if (req->con != Q_CON_NONE)
        return fail(ve, "invalid_request_error", param,
                    "%s and %s both constrain the output; a line takes at most one of "
                    "response_format (json_object, json_schema), tools with tool_choice "
                    "\"required\" or a named function, medley.regex, medley.choice, "
                    "medley.grammar",
                    req->con_param, param);
    req->con_text = malloc(len + 1);
    if (!req->con_text)
        return fail(ve, "server_error", NULL, "out of memory");
    memcpy(req->con_text, text, len);
    req->con_text[len] = 0;
    req->con_len = len;
    req->con = kind;
    req->con_param = param;
    req->con_strict = strict;
    return 0;
}

/* A JSON value as compact text into the constraint (order of keys kept: property order
 * follows the schema). */
static int set_json_constraint(q_request *req, q_con_kind kind, const char *param, json_t *v,
                               int strict, q_verr *ve) {
    char *txt = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!txt)
        return fail(ve, "server_error", NULL, "out of memory");
    int rc = set_constraint(req, kind, param, txt, strlen(txt), strict, ve);
    free(txt);
    return rc;
}

static int get_bool(json_t *obj, const char *key, const char *param, int dflt, int *out,
                    q_verr *ve) {
    json_t *v = json_object_get(obj, key);
    *out = dflt;
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_boolean(v))
        return fail(ve, "invalid_type", param, "%s must be a boolean, not %s", param,
                    md_json_type_name(v));
    *out = json_is_true(v);
    return 0;
}

/* Keys of obj outside allowed (NULL-terminated) are refused, naming them under param. */
static int only_keys(json_t *obj, const char *param, const char *const *allowed, q_verr *ve) {
    const char *key;
    json_t *v;
    json_object_foreach(obj, key, v) {
        int ok = 0;
        for (int i = 0; allowed[i] && !ok; i++)
            ok = !strcmp(allowed[i], key);
        if (!ok)
            return fail(ve, "unsupported_parameter", param, "%s.%.60s is not supported", param,
                        key);
    }
    (void)v;
    return 0;
}

/* A name of a schema or a function: ^[A-Za-z0-9_-]{1,64}$, as OpenAI requires. */
static int name_ok(const char *s) {
    size_t n = s ? strlen(s) : 0;
    if (n < 1 || n > 64)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') ||
              (s[i] >= '0' && s[i] <= '9') || s[i] == '_' || s[i] == '-'))
            return 0;
    return 1;
}

/* body.response_format: {"type": "text"}, {"type": "json_object"} or {"type": "json_schema",
 * "json_schema": {"name", "description", "schema", "strict"}}. */
static int get_response_format(json_t *body, q_request *req, q_verr *ve) {
    static const char *P = "body.response_format";
    json_t *rf = json_object_get(body, "response_format");
    if (!rf || json_is_null(rf))
        return 0;
    if (!json_is_object(rf))
        return fail(ve, "invalid_type", P, "%s must be an object, not %s", P,
                    md_json_type_name(rf));
    const char *type = json_string_value(json_object_get(rf, "type"));
    if (!type)
        return fail(ve, "missing_required_parameter", P,
                    "%s.type must be \"text\", \"json_object\" or \"json_schema\"", P);
    if (!strcmp(type, "text") || !strcmp(type, "json_object")) {
        static const char *const keys[] = {"type", NULL};
        if (only_keys(rf, P, keys, ve))
            return -1;
        return strcmp(type, "text") ? set_constraint(req, Q_CON_JSON_OBJECT, P, "", 0, 1, ve) : 0;
    }
    if (strcmp(type, "json_schema"))
        return fail(ve, "unsupported_value", P,
                    "%s.type is \"%.40s\"; expected \"text\", \"json_object\" or \"json_schema\"",
                    P, type);
    static const char *const keys[] = {"type", "json_schema", NULL};
    if (only_keys(rf, P, keys, ve))
        return -1;
    json_t *js = json_object_get(rf, "json_schema");
    static const char *PJ = "body.response_format.json_schema";
    if (!json_is_object(js))
        return fail(ve, js ? "invalid_type" : "missing_required_parameter", PJ,
                    "%s must be an object {name, description, schema, strict}", PJ);
    static const char *const jkeys[] = {"name", "description", "schema", "strict", NULL};
    if (only_keys(js, PJ, jkeys, ve))
        return -1;
    json_t *name = json_object_get(js, "name");
    if (!name)
        return fail(ve, "missing_required_parameter", "body.response_format.json_schema.name",
                    "%s.name is required", PJ);
    if (!name_ok(json_string_value(name)))
        return fail(ve, "invalid_value", "body.response_format.json_schema.name",
                    "%s.name must be 1 to 64 letters, digits, '_' or '-'", PJ);
    json_t *desc = json_object_get(js, "description");
    if (desc && !json_is_null(desc) && !json_is_string(desc))
        return fail(ve, "invalid_type", "body.response_format.json_schema.description",
                    "%s.description must be a string, not %s", PJ, md_json_type_name(desc));
    int strict;
    if (get_bool(js, "strict", "body.response_format.json_schema.strict", 0, &strict, ve))
        return -1;
    json_t *schema = json_object_get(js, "schema");
    if (!schema || json_is_null(schema)) /* OpenAI: no schema is any JSON object */
        return set_constraint(req, Q_CON_JSON_OBJECT, P, "", 0, 1, ve);
    if (!json_is_object(schema) && !json_is_boolean(schema))
        return fail(ve, "invalid_type", "body.response_format.json_schema.schema",
                    "%s.schema must be a JSON Schema object, not %s", PJ,
                    md_json_type_name(schema));
    return set_json_constraint(req, Q_CON_JSON_SCHEMA, P, schema, strict, ve);
}

/* body.medley: {"regex": "...", "choice": ["a", "b"], "grammar": "root ::= ..."} (vLLM's
 * guided_regex / guided_choice / guided_grammar under medley's name). */
static int get_medley(json_t *body, q_request *req, q_verr *ve) {
    json_t *m = json_object_get(body, "medley");
    if (!m || json_is_null(m))
        return 0;
    if (!json_is_object(m))
        return fail(ve, "invalid_type", "body.medley", "body.medley must be an object, not %s",
                    md_json_type_name(m));
    static const char *const keys[] = {"regex", "choice", "grammar", NULL};
    if (only_keys(m, "body.medley", keys, ve))
        return -1;
    json_t *re = json_object_get(m, "regex");
    if (re && !json_is_null(re)) {
        if (!json_is_string(re) || json_string_length(re) == 0)
            return fail(ve, "invalid_type", "body.medley.regex",
                        "body.medley.regex must be a non-empty string");
        if (set_constraint(req, Q_CON_REGEX, "body.medley.regex", json_string_value(re),
                           json_string_length(re), 1, ve))
            return -1;
    }
    json_t *ch = json_object_get(m, "choice");
    if (ch && !json_is_null(ch)) {
        if (!json_is_array(ch) || json_array_size(ch) == 0 || json_array_size(ch) > Q_MAX_CHOICES)
            return fail(ve, "invalid_type", "body.medley.choice",
                        "body.medley.choice must be an array of 1 to %d strings", Q_MAX_CHOICES);
        size_t i;
        json_t *c;
        json_array_foreach(ch, i, c) {
            if (!json_is_string(c) || json_string_length(c) == 0)
                return fail(ve, "invalid_type", "body.medley.choice",
                            "body.medley.choice[%zu] must be a non-empty string", i);
        }
        if (set_json_constraint(req, Q_CON_CHOICE, "body.medley.choice", ch, 1, ve))
            return -1;
    }
    json_t *g = json_object_get(m, "grammar");
    if (g && !json_is_null(g)) {
        if (!json_is_string(g) || json_string_length(g) == 0)
            return fail(ve, "invalid_type", "body.medley.grammar",
                        "body.medley.grammar must be a non-empty string (EBNF, start rule "
                        "\"root\")");
        if (set_constraint(req, Q_CON_GRAMMAR, "body.medley.grammar", json_string_value(g),
                           json_string_length(g), 1, ve))
            return -1;
    }
    return 0;
}

/* Prefix every local "$ref" ("#...") in v with at, so that a function's parameters schema
 * still resolves once it sits at #/$defs/<name> of the tool-call schema. depth bounds the
 * walk (jansson already bounds nesting at parse time). */
static int rebase_refs(json_t *v, const char *at, int depth) {
    if (depth > 4096)
        return -1;
    if (json_is_array(v)) {
        size_t i;
        json_t *x;
        json_array_foreach(v, i, x) if (rebase_refs(x, at, depth + 1)) return -1;
        return 0;
    }
    if (!json_is_object(v))
        return 0;
    const char *key;
    json_t *x;
    json_object_foreach(v, key, x) {
        if (!strcmp(key, "$ref") && json_is_string(x) && json_string_value(x)[0] == '#') {
            const char *r = json_string_value(x);
            size_t n = strlen(at) + strlen(r) + 1;
            char *nr = malloc(n);
            if (!nr)
                return -1;
            snprintf(nr, n, "%s%s", at, r + 1);
            int rc = json_string_set(x, nr);
            free(nr);
            if (rc)
                return -1;
        } else if (rebase_refs(x, at, depth + 1)) {
            return -1;
        }
    }
    return 0;
}

/* The schema of a call of one of the functions (only the one tool_choice names, when it
 * does): {"name": <the function's name>, "arguments": <its parameters>}, one anyOf branch
 * per function. Each function's parameters move to #/$defs/f<i> (their own local $refs
 * rebased there), so $defs and recursion inside them keep working. */
static int build_tool_schema(q_request *req, q_verr *ve) {
    json_t *schema = json_object(), *defs = json_object(), *any = json_array();
    int rc = schema && defs && any ? 0 : -1;
    for (int i = 0; i < req->n_tools && !rc; i++) {
        if (req->tool_choice == Q_TOOLS_NAMED && i != req->tool_named)
            continue;
        const q_tool *t = &req->tools[i];
        char at[32];
        snprintf(at, sizeof at, "#/$defs/f%d", i);
        json_t *params = t->parameters ? json_deep_copy(t->parameters)
                                       : json_pack("{s:s, s:{}}", "type", "object", "properties");
        if (!params || rebase_refs(params, at, 0) || json_object_set_new(defs, at + 8, params)) {
            rc = -1;
            break;
        }
        json_t *br = json_pack("{s:s, s:{s:{s:s}, s:{s:s}}, s:[s, s], s:b}", "type", "object",
                               "properties", "name", "const", t->name, "arguments", "$ref", at,
                               "required", "name", "arguments", "additionalProperties", 0);
        if (!br || json_array_append_new(any, br))
            rc = -1;
    }
    if (!rc && json_array_size(any) == 1) {
        json_t *only = json_incref(json_array_get(any, 0));
        rc = json_object_update(schema, only);
        json_decref(only);
    } else if (!rc) {
        rc = json_object_set(schema, "anyOf", any);
    }
    if (!rc)
        rc = json_object_set(schema, "$defs", defs);
    json_decref(any);
    json_decref(defs);
    /* a call is strict when every function it may call is (OpenAI's function.strict) */
    int strict = 1;
    for (int i = 0; i < req->n_tools; i++)
        if (req->tool_choice != Q_TOOLS_NAMED || i == req->tool_named)
            strict &= req->tools[i].strict;
    if (rc) {
        json_decref(schema);
        return fail(ve, "server_error", NULL, "out of memory building the tool-call schema");
    }
    rc = set_json_constraint(req, Q_CON_JSON_SCHEMA, "body.tools", schema, strict, ve);
    json_decref(schema);
    return rc;
}

/* body.tools, body.tool_choice, body.parallel_tool_calls. */
static int get_tools(json_t *body, q_request *req, q_verr *ve) {
    json_t *tools = json_object_get(body, "tools");
    json_t *tc = json_object_get(body, "tool_choice");
    int parallel;
    if (get_bool(body, "parallel_tool_calls", "body.parallel_tool_calls", 1, &parallel, ve))
        return -1;
    if (tools && !json_is_null(tools)) {
        if (!json_is_array(tools) || json_array_size(tools) == 0)
            return fail(ve, "invalid_type", "body.tools",
                        "body.tools must be a non-empty array of {type: \"function\", "
                        "function}");
        if (json_array_size(tools) > Q_MAX_TOOLS)
            return fail(ve, "invalid_value", "body.tools",
                        "body.tools has %zu tools; at most %d are accepted", json_array_size(tools),
                        Q_MAX_TOOLS);
        size_t i;
        json_t *t;
        json_array_foreach(tools, i, t) {
            char param[64];
            snprintf(param, sizeof param, "body.tools[%zu]", i);
            const char *type = json_string_value(json_object_get(t, "type"));
            if (!json_is_object(t) || !type)
                return fail(ve, "invalid_type", param,
                            "%s must be an object {type: \"function\", function}", param);
            if (strcmp(type, "function"))
                return fail(ve, "unsupported_value", param,
                            "%s.type is \"%.40s\"; only \"function\" tools are supported", param,
                            type);
            json_t *f = json_object_get(t, "function");
            if (!json_is_object(f))
                return fail(ve, "invalid_type", param,
                            "%s.function must be an object {name, description, parameters, "
                            "strict}",
                            param);
            static const char *const fkeys[] = {"name", "description", "parameters", "strict",
                                                NULL};
            if (only_keys(f, param, fkeys, ve))
                return -1;
            q_tool *qt = &req->tools[i];
            qt->name = json_string_value(json_object_get(f, "name"));
            if (!name_ok(qt->name))
                return fail(ve, "invalid_value", param,
                            "%s.function.name must be 1 to 64 letters, digits, '_' or '-'", param);
            for (size_t k = 0; k < i; k++)
                if (!strcmp(req->tools[k].name, qt->name))
                    return fail(ve, "invalid_value", param,
                                "%s.function.name \"%s\" is already the name of body.tools[%zu]",
                                param, qt->name, k);
            json_t *d = json_object_get(f, "description");
            if (d && !json_is_null(d) && !json_is_string(d))
                return fail(ve, "invalid_type", param, "%s.function.description must be a string",
                            param);
            qt->description = json_string_value(d);
            json_t *p = json_object_get(f, "parameters");
            if (p && !json_is_null(p) && !json_is_object(p))
                return fail(ve, "invalid_type", param,
                            "%s.function.parameters must be a JSON Schema object, not %s", param,
                            md_json_type_name(p));
            qt->parameters = json_is_object(p) ? p : NULL;
            if (get_bool(f, "strict", param, 0, &qt->strict, ve))
                return -1;
        }
        req->n_tools = (int)json_array_size(tools);
    }
    req->tool_choice = req->n_tools ? Q_TOOLS_AUTO : Q_TOOLS_NONE;
    if (tc && !json_is_null(tc)) {
        const char *s = json_string_value(tc);
        if (s && !strcmp(s, "none")) {
            req->tool_choice = Q_TOOLS_NONE;
        } else if (s && !strcmp(s, "auto")) {
            req->tool_choice = Q_TOOLS_AUTO;
        } else if (s && !strcmp(s, "required")) {
            req->tool_choice = Q_TOOLS_REQUIRED;
        } else if (json_is_object(tc)) {
            const char *type = json_string_value(json_object_get(tc, "type"));
            const char *name =
                json_string_value(json_object_get(json_object_get(tc, "function"), "name"));
            if (!type || strcmp(type, "function") || !name)
                return fail(ve, "invalid_value", "body.tool_choice",
                            "body.tool_choice must be \"none\", \"auto\", \"required\" or "
                            "{\"type\": \"function\", \"function\": {\"name\": ...}}");
            req->tool_choice = Q_TOOLS_NAMED;
            req->tool_named = -1;
            for (int i = 0; i < req->n_tools; i++)
                if (!strcmp(req->tools[i].name, name))
                    req->tool_named = i;
            if (req->tool_named < 0)
                return fail(ve, "invalid_value", "body.tool_choice",
                            "body.tool_choice names the function \"%.64s\", which is not in "
                            "body.tools",
                            name);
        } else {
            return fail(ve, "invalid_value", "body.tool_choice",
                        "body.tool_choice must be \"none\", \"auto\", \"required\" or "
                        "{\"type\": \"function\", \"function\": {\"name\": ...}}");
        }
        if (req->tool_choice != Q_TOOLS_NONE && !req->n_tools)
            return fail(ve, "invalid_value", "body.tool_choice",
                        "body.tool_choice asks for a tool call, but body.tools is empty");
    }
    if (req->tool_choice == Q_TOOLS_REQUIRED || req->tool_choice == Q_TOOLS_NAMED)
        return build_tool_schema(req, ve);
    return 0;
}

int q_validate(const char *line, size_t len, const q_limits *lim, q_request *req,
               char custom_id_buf[Q_CUSTOM_ID_MAX], q_verr *ve) {
    memset(req, 0, sizeof *req);
    memset(ve, 0, sizeof *ve);
    if (len > lim->max_line_bytes) {
        req->custom_id = q_scan_custom_id(line, len, custom_id_buf);
        return fail(ve, "line_too_large", NULL,
                    "the input line is %zu bytes; this worker accepts lines of at most %zu bytes",
                    len, lim->max_line_bytes);
    }
    json_error_t jerr;
    req->root = json_loadb(line, len, 0, &jerr);
    if (!req->root) {
        req->custom_id = q_scan_custom_id(line, len, custom_id_buf);
        return fail(ve, "invalid_json", NULL, "the input line is not valid JSON: %s (column %d)",
                    jerr.text, jerr.column);
    }
    json_t *root = req->root;
    if (!json_is_object(root))
        return fail(ve, "invalid_type", NULL, "the input line must be a JSON object, not %s",
                    md_json_type_name(root));
    json_t *body = NULL;
    if (check_envelope(root, req, &body, ve))
        return -1;
    if (check_fields(body, req->chat, ve))
        return -1;

    json_t *model = json_object_get(body, "model");
    if (model && !json_is_string(model))
        return fail(ve, "invalid_type", "body.model", "body.model must be a string, not %s",
                    md_json_type_name(model));
    req->model = json_string_value(model);

    if (req->chat ? get_messages(body, len, req, ve) : get_prompt(body, req, ve))
        return -1;
    if (get_max_tokens(body, lim, req, ve))
        return -1;
    req->temperature = 1.0;
    req->top_p = 1.0;
    req->repetition_penalty = 1.0;
    /* the bounds are OpenAI's, and for vLLM's extras the engine's (md_sampling_validate) */
    if (get_number(body, "temperature", 0, 2, 0, &req->temperature, ve) ||
        get_number(body, "top_p", 0, 1, 1, &req->top_p, ve) ||
        get_number(body, "min_p", 0, 1, 0, &req->min_p, ve) ||
        get_number(body, "repetition_penalty", 0, 100, 1, &req->repetition_penalty, ve) ||
        get_number(body, "presence_penalty", -2, 2, 0, &req->presence_penalty, ve) ||
        get_number(body, "frequency_penalty", -2, 2, 0, &req->frequency_penalty, ve))
        return -1;
    long long top_k = 0;
    if (get_int(body, "top_k", -1, INT_MAX, "-1 or 0 (off) or an integer in 1..2147483647", &top_k,
                ve) < 0)
        return -1;
    req->top_k = top_k < 0 ? 0 : (int)top_k;
    if (get_logprobs(body, req, ve))
        return -1;
    json_t *seed = json_object_get(body, "seed");
    if (seed && !json_is_null(seed)) {
        if (!json_is_integer(seed))
            return fail(ve, "invalid_type", "body.seed", "body.seed must be an integer, not %s",
                        md_json_type_name(seed));
        req->seed = json_integer_value(seed);
        req->has_seed = 1;
    }
    if (get_stop(body, req, ve))
        return -1;
    if (get_logit_bias(body, req, ve) || get_response_format(body, req, ve) ||
        get_tools(body, req, ve) || get_medley(body, req, ve))
        return -1;
    /* a stop string would cut a constrained answer mid-sentence and still say "stop", where
     * the contract is that a stopped answer is a complete sentence of the constraint */
    if (req->con != Q_CON_NONE && req->n_stop)
        return fail(ve, "unsupported_parameter", "body.stop",
                    "body.stop cannot be combined with %s: a stop string would cut the "
                    "constrained output; remove body.stop (the constraint decides where the "
                    "answer ends)",
                    req->con_param);
    return 0;
}

void q_request_free(q_request *req) {
    json_decref(req->root);
    free(req->text);
    free(req->bias_ids);
    free(req->bias);
    free(req->con_text);
    req->root = NULL;
    req->text = NULL;
    req->bias_ids = NULL;
    req->bias = NULL;
    req->con_text = NULL;
}

const char *q_request_prompt_text(const q_request *req) {
    if (!req->chat)
        return req->prompt;
    for (int i = req->n_msgs - 1; i >= 0; i--)
        if (!strcmp(req->msgs[i].role, "user"))
            return req->msgs[i].content;
    return req->msgs[req->n_msgs - 1].content;
}
