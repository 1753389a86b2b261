/* validate_fields.c — the body-field table (every field OpenAI documents, and what medley does
 * with it), the check of a body's keys against it, and body.logit_bias. */
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "queue/validate.h"
#include "queue/validate_int.h"

/* ---- body fields -------------------------------------------------------------------- */

enum { EP_CHAT = 1, EP_COMP = 2, EP_BOTH = 3 };
enum {
    F_USED,      /* parsed by its own function below */
    F_NO_EFFECT, /* accepted and checked for type; changes nothing in a batch (documented) */
    F_NULL_ONLY, /* refused unless null */
    F_FALSE,     /* refused unless false or null */
    F_ONE,       /* refused unless 1 or null */
    F_STREAM,    /* online requests: taken (get_stream); batch lines: refused unless null/false */
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
    {"stream", EP_BOTH, F_STREAM, "a batch is not streamed; online requests are"},
    {"store", EP_CHAT, F_FALSE, "medley does not store completions"},
    {"echo", EP_COMP, F_FALSE, "medley does not echo the prompt"},
    {"stream_options", EP_BOTH, F_STREAM, "a batch is not streamed; online requests are"},
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

/* body.stream (a boolean) and body.stream_options ({"include_usage": bool,
 * "include_obfuscation": false}, only with stream: true, as OpenAI answers) of an online
 * request, into req. A batch line takes neither (q_vcheck_fields refuses them). */
static int get_stream(json_t *body, q_request *req, q_verr *ve) {
    json_t *st = json_object_get(body, "stream");
    if (st && !json_is_null(st)) {
        if (!json_is_boolean(st))
            return q_vfail(ve, "invalid_type", "body.stream",
                           "body.stream must be a boolean, not %s", md_json_type_name(st));
        req->stream = json_is_true(st);
    }
    json_t *so = json_object_get(body, "stream_options");
    if (!so || json_is_null(so))
        return 0;
    if (!req->stream)
        return q_vfail(ve, "invalid_value", "body.stream_options",
                       "body.stream_options is only allowed when body.stream is true");
    if (!json_is_object(so))
        return q_vfail(ve, "invalid_type", "body.stream_options",
                       "body.stream_options must be an object, not %s", md_json_type_name(so));
    const char *key;
    json_t *v;
    json_object_foreach(so, key, v) {
        char param[64];
        snprintf(param, sizeof param, "body.stream_options.%.40s", key);
        int usage = !strcmp(key, "include_usage");
        if (!usage && strcmp(key, "include_obfuscation"))
            return q_vfail(ve, "unsupported_parameter", param,
                           "Unrecognized request argument supplied: %s", param);
        if (json_is_null(v))
            continue;
        if (!json_is_boolean(v))
            return q_vfail(ve, "invalid_type", param, "%s must be a boolean, not %s", param,
                           md_json_type_name(v));
        if (usage)
            req->include_usage = json_is_true(v);
        else if (json_is_true(v))
            return q_vfail(ve, "unsupported_value", param,
                           "%s: true is not supported (medley's chunks carry no obfuscation "
                           "padding); remove it or set it to false",
                           param);
    }
    return 0;
}

/* Each key of the body: known for this endpoint, and when medley does not do what it asks,
 * null or its default. */
int q_vcheck_fields(json_t *body, int chat, int online, q_request *req, q_verr *ve) {
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
            return q_vfail(ve, "unsupported_parameter", param,
                           "Unrecognized request argument supplied: %s (medley's parameters: "
                           "docs/protocol.md)",
                           key);
        if (!(fields[k].ep & (chat ? EP_CHAT : EP_COMP)))
            return q_vfail(ve, "unsupported_parameter", param, "%s is a parameter of %s, not of %s",
                           param, chat ? "/v1/completions" : "/v1/chat/completions",
                           chat ? "/v1/chat/completions" : "/v1/completions");
        if (json_is_null(v))
            continue;
        switch (fields[k].rule) {
        case F_NO_EFFECT:
            if (!strcmp(key, "metadata")) {
                if (!json_is_object(v) || json_object_size(v) > 16)
                    return q_vfail(ve, "invalid_type", param,
                                   "%s must be an object of at most 16 string values", param);
                const char *mk;
                json_t *mv;
                json_object_foreach(v, mk, mv) if (!json_is_string(mv)) return q_vfail(
                    ve, "invalid_type", param, "%s.%.40s must be a string, not %s", param, mk,
                    md_json_type_name(mv));
            } else if (!json_is_string(v)) {
                return q_vfail(ve, "invalid_type", param, "%s must be a string, not %s", param,
                               md_json_type_name(v));
            }
            break;
        case F_NULL_ONLY:
            return q_vfail(ve, "unsupported_parameter", param,
                           "%s is not supported (%s); remove it or set it to null", param,
                           fields[k].why);
        case F_STREAM:
            if (online)
                break; /* get_stream below */
            if (!strcmp(key, "stream_options"))
                return q_vfail(ve, "unsupported_parameter", param,
                               "%s is not supported (%s); remove it or set it to null", param,
                               fields[k].why);
            /* stream: false or null in a batch, as F_FALSE says */
            __attribute__((fallthrough));
        case F_FALSE:
            if (!json_is_boolean(v))
                return q_vfail(ve, "invalid_type", param, "%s must be a boolean, not %s", param,
                               md_json_type_name(v));
            if (json_is_true(v))
                return q_vfail(ve, "unsupported_value", param,
                               "%s: true is not supported (%s); remove it", param, fields[k].why);
            break;
        case F_ONE:
            if (!json_is_integer(v))
                return q_vfail(ve, "invalid_type", param, "%s must be an integer, not %s", param,
                               md_json_type_name(v));
            if (json_integer_value(v) != 1)
                return q_vfail(ve, "unsupported_value", param, "only %s = 1 is supported (%s)",
                               param, fields[k].why);
            break;
        default: break;
        }
    }
    if (online && get_stream(body, req, ve))
        return -1;
    json_t *mod = json_object_get(body, "modalities");
    if (mod && !json_is_null(mod)) {
        if (!json_is_array(mod))
            return q_vfail(ve, "invalid_type", "body.modalities",
                           "body.modalities must be an array, not %s", md_json_type_name(mod));
        size_t i;
        json_t *m;
        json_array_foreach(mod, i, m) {
            if (!json_is_string(m) || strcmp(json_string_value(m), "text"))
                return q_vfail(ve, "unsupported_value", "body.modalities",
                               "body.modalities[%zu]: only \"text\" output is supported", i);
        }
    }
    return 0;
}

/* body.logit_bias: {"<token id>": bias in [-100, 100]}, keys as OpenAI sends them (decimal
 * strings). Whether an id exists in the model's vocabulary is the runner's check. */
int q_vget_logit_bias(json_t *body, q_request *req, q_verr *ve) {
    json_t *lb = json_object_get(body, "logit_bias");
    if (!lb || json_is_null(lb))
        return 0;
    if (!json_is_object(lb))
        return q_vfail(ve, "invalid_type", "body.logit_bias",
                       "body.logit_bias must be an object mapping token ids to biases, not %s",
                       md_json_type_name(lb));
    size_t n = json_object_size(lb);
    if (n > Q_MAX_LOGIT_BIAS)
        return q_vfail(ve, "invalid_value", "body.logit_bias",
                       "body.logit_bias has %zu entries; at most %d are accepted", n,
                       Q_MAX_LOGIT_BIAS);
    if (n == 0)
        return 0;
    req->bias_ids = malloc(n * sizeof *req->bias_ids);
    req->bias = malloc(n * sizeof *req->bias);
    if (!req->bias_ids || !req->bias)
        return q_vfail(ve, "server_error", NULL, "out of memory");
    const char *key;
    json_t *v;
    json_object_foreach(lb, key, v) {
        char *end = NULL;
        long long id = strtoll(key, &end, 10);
        if (!*key || *end || id < 0 || id > INT32_MAX || key[0] == '+' || key[0] == ' ')
            return q_vfail(ve, "invalid_value", "body.logit_bias",
                           "body.logit_bias key \"%.40s\" is not a token id (a non-negative "
                           "decimal integer)",
                           key);
        if (!json_is_number(v))
            return q_vfail(ve, "invalid_type", "body.logit_bias",
                           "body.logit_bias[\"%.40s\"] must be a number, not %s", key,
                           md_json_type_name(v));
        double b = json_number_value(v);
        if (!isfinite(b) || b < -100 || b > 100)
            return q_vfail(ve, "invalid_value", "body.logit_bias",
                           "body.logit_bias[\"%.40s\"] is %g; expected a number in [-100, 100]",
                           key, b);
        req->bias_ids[req->n_bias] = (int32_t)id;
        req->bias[req->n_bias++] = (float)b;
    }
    return 0;
}
