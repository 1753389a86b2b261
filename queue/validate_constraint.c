/* validate_constraint.c — response_format, tools / tool_choice and medley.* into the line's one
 * constraint (json_schema, json_object, regex, choice, grammar), and the tool-call schema. */
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "queue/validate.h"
#include "queue/validate_int.h"

/* Set the line's constraint; a second one is refused (one constraint per line). text is
 * copied (len bytes). */
static int set_constraint(q_request *req, q_con_kind kind, const char *param, const char *text,
                          size_t len, int strict, q_verr *ve) {
    if (req->con != Q_CON_NONE)
        return q_vfail(ve, "invalid_request_error", param,
                       "%s and %s both constrain the output; a line takes at most one of "
                       "response_format (json_object, json_schema), tools (unless tool_choice "
                       "is \"none\"), medley.regex, medley.choice, medley.grammar",
                       req->con_param, param);
    req->con_text = malloc(len + 1);
    if (!req->con_text)
        return q_vfail(ve, "server_error", NULL, "out of memory");
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
        return q_vfail(ve, "server_error", NULL, "out of memory");
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
        return q_vfail(ve, "invalid_type", param, "%s must be a boolean, not %s", param,
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
            return q_vfail(ve, "unsupported_parameter", param, "%s.%.60s is not supported", param,
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
int q_vget_response_format(json_t *body, q_request *req, q_verr *ve) {
    static const char *P = "body.response_format";
    json_t *rf = json_object_get(body, "response_format");
    if (!rf || json_is_null(rf))
        return 0;
    if (!json_is_object(rf))
        return q_vfail(ve, "invalid_type", P, "%s must be an object, not %s", P,
                       md_json_type_name(rf));
    const char *type = json_string_value(json_object_get(rf, "type"));
    if (!type)
        return q_vfail(ve, "missing_required_parameter", P,
                       "%s.type must be \"text\", \"json_object\" or \"json_schema\"", P);
    if (!strcmp(type, "text") || !strcmp(type, "json_object")) {
        static const char *const keys[] = {"type", NULL};
        if (only_keys(rf, P, keys, ve))
            return -1;
        return strcmp(type, "text") ? set_constraint(req, Q_CON_JSON_OBJECT, P, "", 0, 1, ve) : 0;
    }
    if (strcmp(type, "json_schema"))
        return q_vfail(
            ve, "unsupported_value", P,
            "%s.type is \"%.40s\"; expected \"text\", \"json_object\" or \"json_schema\"", P, type);
    static const char *const keys[] = {"type", "json_schema", NULL};
    if (only_keys(rf, P, keys, ve))
        return -1;
    json_t *js = json_object_get(rf, "json_schema");
    static const char *PJ = "body.response_format.json_schema";
    if (!json_is_object(js))
        return q_vfail(ve, js ? "invalid_type" : "missing_required_parameter", PJ,
                       "%s must be an object {name, description, schema, strict}", PJ);
    static const char *const jkeys[] = {"name", "description", "schema", "strict", NULL};
    if (only_keys(js, PJ, jkeys, ve))
        return -1;
    json_t *name = json_object_get(js, "name");
    if (!name)
        return q_vfail(ve, "missing_required_parameter", "body.response_format.json_schema.name",
                       "%s.name is required", PJ);
    if (!name_ok(json_string_value(name)))
        return q_vfail(ve, "invalid_value", "body.response_format.json_schema.name",
                       "%s.name must be 1 to 64 letters, digits, '_' or '-'", PJ);
    json_t *desc = json_object_get(js, "description");
    if (desc && !json_is_null(desc) && !json_is_string(desc))
        return q_vfail(ve, "invalid_type", "body.response_format.json_schema.description",
                       "%s.description must be a string, not %s", PJ, md_json_type_name(desc));
    int strict;
    if (get_bool(js, "strict", "body.response_format.json_schema.strict", 0, &strict, ve))
        return -1;
    json_t *schema = json_object_get(js, "schema");
    if (!schema || json_is_null(schema)) /* OpenAI: no schema is any JSON object */
        return set_constraint(req, Q_CON_JSON_OBJECT, P, "", 0, 1, ve);
    if (!json_is_object(schema) && !json_is_boolean(schema))
        return q_vfail(ve, "invalid_type", "body.response_format.json_schema.schema",
                       "%s.schema must be a JSON Schema object, not %s", PJ,
                       md_json_type_name(schema));
    return set_json_constraint(req, Q_CON_JSON_SCHEMA, P, schema, strict, ve);
}

/* body.medley: {"regex": "...", "choice": ["a", "b"], "grammar": "root ::= ..."} (vLLM's
 * guided_regex / guided_choice / guided_grammar under medley's name). */
int q_vget_medley(json_t *body, q_request *req, q_verr *ve) {
    json_t *m = json_object_get(body, "medley");
    if (!m || json_is_null(m))
        return 0;
    if (!json_is_object(m))
        return q_vfail(ve, "invalid_type", "body.medley", "body.medley must be an object, not %s",
                       md_json_type_name(m));
    static const char *const keys[] = {"regex", "choice", "grammar", NULL};
    if (only_keys(m, "body.medley", keys, ve))
        return -1;
    json_t *re = json_object_get(m, "regex");
    if (re && !json_is_null(re)) {
        if (!json_is_string(re) || json_string_length(re) == 0)
            return q_vfail(ve, "invalid_type", "body.medley.regex",
                           "body.medley.regex must be a non-empty string");
        if (set_constraint(req, Q_CON_REGEX, "body.medley.regex", json_string_value(re),
                           json_string_length(re), 1, ve))
            return -1;
    }
    json_t *ch = json_object_get(m, "choice");
    if (ch && !json_is_null(ch)) {
        if (!json_is_array(ch) || json_array_size(ch) == 0 || json_array_size(ch) > Q_MAX_CHOICES)
            return q_vfail(ve, "invalid_type", "body.medley.choice",
                           "body.medley.choice must be an array of 1 to %d strings", Q_MAX_CHOICES);
        size_t i;
        json_t *c;
        json_array_foreach(ch, i, c) {
            if (!json_is_string(c) || json_string_length(c) == 0)
                return q_vfail(ve, "invalid_type", "body.medley.choice",
                               "body.medley.choice[%zu] must be a non-empty string", i);
        }
        if (set_json_constraint(req, Q_CON_CHOICE, "body.medley.choice", ch, 1, ve))
            return -1;
    }
    json_t *g = json_object_get(m, "grammar");
    if (g && !json_is_null(g)) {
        if (!json_is_string(g) || json_string_length(g) == 0)
            return q_vfail(ve, "invalid_type", "body.medley.grammar",
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
        return q_vfail(ve, "server_error", NULL, "out of memory building the tool-call schema");
    }
    rc = set_json_constraint(req, Q_CON_JSON_SCHEMA, "body.tools", schema, strict, ve);
    json_decref(schema);
    return rc;
}

/* body.tools, body.tool_choice, body.parallel_tool_calls. */
int q_vget_tools(json_t *body, q_request *req, q_verr *ve) {
    json_t *tools = json_object_get(body, "tools");
    json_t *tc = json_object_get(body, "tool_choice");
    if (get_bool(body, "parallel_tool_calls", "body.parallel_tool_calls", 1, &req->parallel_tools,
                 ve))
        return -1;
    if (tools && !json_is_null(tools)) {
        if (!json_is_array(tools) || json_array_size(tools) == 0)
            return q_vfail(ve, "invalid_type", "body.tools",
                           "body.tools must be a non-empty array of {type: \"function\", "
                           "function}");
        if (json_array_size(tools) > Q_MAX_TOOLS)
            return q_vfail(ve, "invalid_value", "body.tools",
                           "body.tools has %zu tools; at most %d are accepted",
                           json_array_size(tools), Q_MAX_TOOLS);
        size_t i;
        json_t *t;
        json_array_foreach(tools, i, t) {
            char param[64];
            snprintf(param, sizeof param, "body.tools[%zu]", i);
            const char *type = json_string_value(json_object_get(t, "type"));
            if (!json_is_object(t) || !type)
                return q_vfail(ve, "invalid_type", param,
                               "%s must be an object {type: \"function\", function}", param);
            if (strcmp(type, "function"))
                return q_vfail(ve, "unsupported_value", param,
                               "%s.type is \"%.40s\"; only \"function\" tools are supported", param,
                               type);
            json_t *f = json_object_get(t, "function");
            if (!json_is_object(f))
                return q_vfail(ve, "invalid_type", param,
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
                return q_vfail(ve, "invalid_value", param,
                               "%s.function.name must be 1 to 64 letters, digits, '_' or '-'",
                               param);
            for (size_t k = 0; k < i; k++)
                if (!strcmp(req->tools[k].name, qt->name))
                    return q_vfail(ve, "invalid_value", param,
                                   "%s.function.name \"%s\" is already the name of body.tools[%zu]",
                                   param, qt->name, k);
            json_t *d = json_object_get(f, "description");
            if (d && !json_is_null(d) && !json_is_string(d))
                return q_vfail(ve, "invalid_type", param,
                               "%s.function.description must be a string", param);
            qt->description = json_string_value(d);
            json_t *p = json_object_get(f, "parameters");
            if (p && !json_is_null(p) && !json_is_object(p))
                return q_vfail(ve, "invalid_type", param,
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
                return q_vfail(ve, "invalid_value", "body.tool_choice",
                               "body.tool_choice must be \"none\", \"auto\", \"required\" or "
                               "{\"type\": \"function\", \"function\": {\"name\": ...}}");
            req->tool_choice = Q_TOOLS_NAMED;
            req->tool_named = -1;
            for (int i = 0; i < req->n_tools; i++)
                if (!strcmp(req->tools[i].name, name))
                    req->tool_named = i;
            if (req->tool_named < 0)
                return q_vfail(ve, "invalid_value", "body.tool_choice",
                               "body.tool_choice names the function \"%.64s\", which is not in "
                               "body.tools",
                               name);
        } else {
            return q_vfail(ve, "invalid_value", "body.tool_choice",
                           "body.tool_choice must be \"none\", \"auto\", \"required\" or "
                           "{\"type\": \"function\", \"function\": {\"name\": ...}}");
        }
        if (req->tool_choice != Q_TOOLS_NONE && !req->n_tools)
            return q_vfail(ve, "invalid_value", "body.tool_choice",
                           "body.tool_choice asks for a tool call, but body.tools is empty");
    }
    if (req->tool_choice == Q_TOOLS_AUTO)
        req->con_lazy = 1; /* text, or calls in the template's format */
    if (req->tool_choice != Q_TOOLS_NONE)
        return build_tool_schema(req, ve);
    return 0;
}
