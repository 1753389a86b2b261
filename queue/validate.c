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
#include "queue/validate_int.h"

void q_limits_default(q_limits *l) {
    l->max_line_bytes = 1u << 20;
    l->max_tokens_default = 256;
    l->max_tokens_limit = 32768;
    l->online = 0;
}

int q_vfail(q_verr *ve, const char *code, const char *param, const char *fmt, ...) {
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
        return q_vfail(ve, "invalid_type", param,
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
            return q_vfail(ve, "invalid_type", param, "%s[%zu] must be an object with a \"type\"",
                           param, i);
        if (strcmp(type, "text"))
            return q_vfail(ve, "unsupported_value", param,
                           "%s[%zu] has type \"%s\"; only \"text\" parts are supported", param, i,
                           type);
        if (!json_is_string(text))
            return q_vfail(ve, "invalid_type", param, "%s[%zu].text must be a string", param, i);
        size_t tl = json_string_length(text);
        if (*used + n + tl + 1 > cap)
            return q_vfail(ve, "invalid_value", param, "%s is too large", param);
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
        return q_vfail(ve, "invalid_type", param, "%s must be a number, not %s", param,
                       md_json_type_name(v));
    double x = json_number_value(v);
    if (!isfinite(x) || x < lo || x > hi || (lo_open && x <= lo))
        return q_vfail(ve, "invalid_value", param, "%s is %g; expected a number in %s%g, %g]",
                       param, x, lo_open ? "(" : "[", lo, hi);
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
        return q_vfail(ve, "invalid_type", param, "%s must be %s, not %s", param, expect,
                       md_json_type_name(v));
    long long x = (long long)json_integer_value(v);
    if (x < lo || x > hi)
        return q_vfail(ve, "invalid_value", param, "%s is %lld; expected %s", param, x, expect);
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
            return q_vfail(ve, "invalid_type", "body.logprobs",
                           "body.logprobs must be a boolean for a chat completion, not %s",
                           md_json_type_name(lp));
        req->logprobs = json_is_true(lp);
    }
    long long top = 0;
    int has = get_int(body, "top_logprobs", 0, Q_MAX_TOP_LOGPROBS, "an integer in 0..20", &top, ve);
    if (has < 0)
        return -1;
    if (has && !req->logprobs)
        return q_vfail(ve, "invalid_value", "body.top_logprobs",
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
        return q_vfail(ve, "missing_required_parameter", "custom_id",
                       "the line has no custom_id (a string unique within the batch)");
    if (!req->custom_id)
        return q_vfail(
            ve, "invalid_value", "custom_id",
            "custom_id must be a non-empty string of at most %d bytes without NUL, not %s",
            Q_CUSTOM_ID_MAX - 1, md_json_type_name(cid));

    json_t *method = json_object_get(root, "method");
    if (!method)
        return q_vfail(ve, "missing_required_parameter", "method",
                       "the line has no method (\"POST\")");
    if (!json_is_string(method) || strcmp(json_string_value(method), "POST"))
        return q_vfail(ve, "invalid_value", "method", "method must be \"POST\"");
    json_t *url = json_object_get(root, "url");
    if (!url)
        return q_vfail(ve, "missing_required_parameter", "url",
                       "the line has no url (\"/v1/chat/completions\" or \"/v1/completions\")");
    req->url = json_string_value(url);
    if (req->url && !strcmp(req->url, "/v1/chat/completions"))
        req->chat = 1;
    else if (req->url && !strcmp(req->url, "/v1/completions"))
        req->chat = 0;
    else if (req->url && !strcmp(req->url, "/v1/embeddings"))
        req->embed = 1;
    else
        return q_vfail(ve, "invalid_url", "url",
                       "url must be \"/v1/chat/completions\", \"/v1/completions\" or "
                       "\"/v1/embeddings\"");
    *body = json_object_get(root, "body");
    if (!*body)
        return q_vfail(ve, "missing_required_parameter", "body", "the line has no body");
    if (!json_is_object(*body))
        return q_vfail(ve, "invalid_type", "body", "body must be an object, not %s",
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
        return q_vfail(ve, "invalid_value", "body.messages", "body.messages is too large");
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
        return q_vfail(ve, "invalid_type", param, "%s.tool_calls must be a non-empty array", param);
    const char *text = content && json_is_string(content) ? json_string_value(content) : "";
    if (content && !json_is_null(content) && !json_is_string(content))
        return q_vfail(ve, "invalid_type", param,
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
            return q_vfail(ve, "invalid_value", param,
                           "%s.tool_calls[%zu] must be {\"type\": \"function\", \"function\": "
                           "{\"name\", \"arguments\": <JSON text>}}",
                           param, k);
        }
        json_t *call = json_pack("{s:s, s:o}", "name", name, "arguments", parsed);
        char *js = call ? json_dumps(call, JSON_COMPACT) : NULL;
        json_decref(call);
        if (!js)
            return q_vfail(ve, "server_error", NULL, "out of memory");
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
        return q_vfail(ve, "missing_required_parameter", param,
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
        return q_vfail(ve, "missing_required_parameter", "body.messages",
                       "a chat completion needs body.messages");
    if (!json_is_array(msgs) || json_array_size(msgs) == 0)
        return q_vfail(ve, "invalid_type", "body.messages",
                       "body.messages must be a non-empty array of {role, content}");
    if (json_array_size(msgs) > Q_MAX_MSGS)
        return q_vfail(ve, "invalid_value", "body.messages",
                       "body.messages has %zu messages; at most %d are accepted",
                       json_array_size(msgs), Q_MAX_MSGS);
    /* the text parts joined, and the tool turns rewritten (at most the line's bytes again,
     * plus a fixed wording per message) */
    size_t cap = 2 * len + 256 * Q_MAX_MSGS, used = 0;
    req->text = malloc(cap);
    if (!req->text)
        return q_vfail(ve, "server_error", NULL, "out of memory");
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m) {
        char param[64];
        snprintf(param, sizeof param, "body.messages[%zu]", i);
        if (!json_is_object(m))
            return q_vfail(ve, "invalid_type", param, "%s must be an object, not %s", param,
                           md_json_type_name(m));
        const char *role = json_string_value(json_object_get(m, "role"));
        if (!role)
            return q_vfail(ve, "missing_required_parameter", param,
                           "%s.role must be a string (system, user, assistant or tool)", param);
        if (!strcmp(role, "developer"))
            role = "system";
        if (strcmp(role, "system") && strcmp(role, "user") && strcmp(role, "assistant") &&
            strcmp(role, "tool"))
            return q_vfail(ve, "invalid_value", param,
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
            return q_vfail(ve, "missing_required_parameter", param, "%s has no content", param);
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
        return q_vfail(ve, "missing_required_parameter", "body.prompt",
                       "a completion needs body.prompt");
    if (json_is_array(prompt) && json_array_size(prompt) == 1 &&
        json_is_string(json_array_get(prompt, 0)))
        prompt = json_array_get(prompt, 0);
    if (!json_is_string(prompt))
        return q_vfail(ve, "invalid_type", "body.prompt",
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
            return q_vfail(ve, "invalid_type", mtname, "%s must be an integer, not %s", mtname,
                           md_json_type_name(mt));
        json_int_t v = json_integer_value(mt);
        if (v < 1 || v > lim->max_tokens_limit)
            return q_vfail(ve, "invalid_value", mtname, "%s is %lld; expected 1..%d", mtname,
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
                return q_vfail(ve, "invalid_value", "body.stop",
                               "body.stop has %zu sequences; at most %d are allowed",
                               json_array_size(stop), Q_MAX_STOP);
            size_t i;
            json_t *s;
            json_array_foreach(stop, i, s) {
                if (!json_is_string(s))
                    return q_vfail(ve, "invalid_type", "body.stop",
                                   "body.stop[%zu] must be a string, not %s", i,
                                   md_json_type_name(s));
                req->stop[req->n_stop++] = json_string_value(s);
            }
        } else {
            return q_vfail(ve, "invalid_type", "body.stop",
                           "body.stop must be a string or an array of strings, not %s",
                           md_json_type_name(stop));
        }
        for (int i = 0; i < req->n_stop; i++)
            if (!req->stop[i][0])
                return q_vfail(ve, "invalid_value", "body.stop", "body.stop holds an empty string");
    }
    req->stop[req->n_stop] = NULL;
    return 0;
}

int q_validate(const char *line, size_t len, const q_limits *lim, q_request *req,
               char custom_id_buf[Q_CUSTOM_ID_MAX], q_verr *ve) {
    memset(req, 0, sizeof *req);
    memset(ve, 0, sizeof *ve);
    if (len > lim->max_line_bytes) {
        req->custom_id = q_scan_custom_id(line, len, custom_id_buf);
        return q_vfail(
            ve, "line_too_large", NULL,
            "the input line is %zu bytes; this worker accepts lines of at most %zu bytes", len,
            lim->max_line_bytes);
    }
    json_error_t jerr;
    req->root = json_loadb(line, len, 0, &jerr);
    if (!req->root) {
        req->custom_id = q_scan_custom_id(line, len, custom_id_buf);
        return q_vfail(ve, "invalid_json", NULL, "the input line is not valid JSON: %s (column %d)",
                       jerr.text, jerr.column);
    }
    json_t *root = req->root;
    if (!json_is_object(root))
        return q_vfail(ve, "invalid_type", NULL, "the input line must be a JSON object, not %s",
                       md_json_type_name(root));
    json_t *body = NULL;
    if (check_envelope(root, req, &body, ve))
        return -1;
    json_t *model = json_object_get(body, "model");
    if (model && !json_is_string(model))
        return q_vfail(ve, "invalid_type", "body.model", "body.model must be a string, not %s",
                       md_json_type_name(model));
    req->model = json_string_value(model);
    if (req->embed)
        return q_vget_embeddings(body, req, ve);
    if (q_vcheck_fields(body, req->chat, lim->online, req, ve))
        return -1;

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
            return q_vfail(ve, "invalid_type", "body.seed", "body.seed must be an integer, not %s",
                           md_json_type_name(seed));
        req->seed = json_integer_value(seed);
        req->has_seed = 1;
    }
    if (get_stop(body, req, ve))
        return -1;
    if (q_vget_logit_bias(body, req, ve) || q_vget_response_format(body, req, ve) ||
        q_vget_tools(body, req, ve) || q_vget_medley(body, req, ve))
        return -1;
    /* a stop string would cut a constrained answer mid-sentence and still say "stop", where
     * the contract is that a stopped answer is a complete sentence of the constraint */
    if (req->con != Q_CON_NONE && !req->con_lazy && req->n_stop)
        return q_vfail(ve, "unsupported_parameter", "body.stop",
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
    free(req->emb_in);
    free(req->emb_ids);
    req->emb_in = NULL;
    req->emb_ids = NULL;
    req->root = NULL;
    req->text = NULL;
    req->bias_ids = NULL;
    req->bias = NULL;
    req->con_text = NULL;
}

const char *q_request_prompt_text(const q_request *req) {
    if (req->embed)
        return req->emb_in[0].text ? req->emb_in[0].text : "";
    if (!req->chat)
        return req->prompt;
    for (int i = req->n_msgs - 1; i >= 0; i--)
        if (!strcmp(req->msgs[i].role, "user"))
            return req->msgs[i].content;
    return req->msgs[req->n_msgs - 1].content;
}
