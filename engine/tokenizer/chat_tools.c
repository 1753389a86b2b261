/* chat_tools.c — see chat_tools.h. The formats are facts of the templates that define them:
 *   hermes   (Qwen2.5/3's templates, and any ChatML template that writes <tool_call>): the
 *            functions as JSON lines inside <tools></tools> in the system turn; each call
 *            <tool_call>\n{"name": <name>, "arguments": <object>}\n</tool_call>
 *   mistral  (templates that write [TOOL_CALLS]): [AVAILABLE_TOOLS] [<functions>]
 *            [/AVAILABLE_TOOLS] right before the last [INST]; the calls
 *            [TOOL_CALLS] [{"name": <name>, "arguments": <object>}, ...]
 *   llama3   (<|python_tag|> or "Environment: ipython" in a Llama 3 template; Llama 3.1's
 *            JSON tool calling, functions in the first user turn): the functions as indented
 *            JSON after an instruction, before the user's text; the answer one bare call
 *            {"name": <name>, "parameters": <object>}, nothing before it. */
#define _GNU_SOURCE /* memmem */
#include "engine/tokenizer/chat_tools.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "engine/tokenizer/vocab.h"

static const tok_tool_markup k_hermes = {
    "<tool_call>", "", "<tool_call> ", " </tool_call>", " ", " ", 0, 16, "arguments"};
static const tok_tool_markup k_mistral = {
    "[TOOL_CALLS]", "[TOOL_CALLS] [ ", "", "", " , ", " ]", 0, 16, "arguments"};
static const tok_tool_markup k_llama3 = {"{", "", "", "", "", " ", 1, 1, "parameters"};

static int has(const char *t, size_t n, const char *needle) {
    return t && memmem(t, n, needle, strlen(needle)) != NULL;
}

tok_tool_format tok_tool_format_of(const tok_tokenizer *t) {
    if (!t)
        return TOK_TOOLS_NONE;
    if (t->chat_forced && t->tools_forced)
        return t->chat_forced_tmpl == TOK_TMPL_LLAMA3 ? TOK_TOOLS_LLAMA3 : TOK_TOOLS_HERMES;
    size_t n = 0;
    const char *s = tok_chat_template_text(t, &n);
    switch (tok_chat_template(t)) {
    case TOK_TMPL_CHATML: return has(s, n, "<tool_call>") ? TOK_TOOLS_HERMES : TOK_TOOLS_NONE;
    case TOK_TMPL_MISTRAL: return has(s, n, "[TOOL_CALLS]") ? TOK_TOOLS_MISTRAL : TOK_TOOLS_NONE;
    case TOK_TMPL_LLAMA3:
        return has(s, n, "<|python_tag|>") || has(s, n, "Environment: ipython") ? TOK_TOOLS_LLAMA3
                                                                                : TOK_TOOLS_NONE;
    default: return TOK_TOOLS_NONE;
    }
}

const char *tok_tool_format_name(tok_tool_format f) {
    switch (f) {
    case TOK_TOOLS_HERMES: return "hermes";
    case TOK_TOOLS_MISTRAL: return "mistral";
    case TOK_TOOLS_LLAMA3: return "llama3";
    default: return "none";
    }
}

const tok_tool_markup *tok_tool_markup_of(tok_tool_format f) {
    switch (f) {
    case TOK_TOOLS_HERMES: return &k_hermes;
    case TOK_TOOLS_MISTRAL: return &k_mistral;
    case TOK_TOOLS_LLAMA3: return &k_llama3;
    default: return NULL;
    }
}

int tok_chat_apply_tools(const tok_tokenizer *t, const tok_chat_msg *msgs, int n_msgs,
                         const json_t *tools, char **out, md_err *e) {
    *out = NULL;
    tok_tool_format f = tok_tool_format_of(t);
    if (!tok_tool_markup_of(f))
        return md_errf(e, MD_EUNSUPP,
                       "the model's chat template has no tool-call format medley "
                       "implements (hermes <tool_call>, mistral [TOOL_CALLS], "
                       "llama3 JSON)");
    return tok_chat_render(t, tok_chat_template(t), msgs, n_msgs, 1, tools, out, e);
}

static const char *skip_ws(const char *p) {
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
        p++;
    return p;
}

static int lit(const char **p, const char *s) {
    *p = skip_ws(*p);
    size_t n = strlen(s);
    if (strncmp(*p, s, n))
        return 0;
    *p += n;
    return 1;
}

/* One JSON value at *p (whitespace before it skipped); NULL when there is none. */
static json_t *value_at(const char **p) {
    *p = skip_ws(*p);
    json_error_t je;
    json_t *v = json_loadb(*p, strlen(*p), JSON_DISABLE_EOF_CHECK | JSON_DECODE_ANY, &je);
    if (v)
        *p += je.position;
    return v;
}

static int call_ok(const json_t *c) {
    return json_is_object(c) && json_is_string(json_object_get(c, "name")) &&
           json_is_object(json_object_get(c, "arguments"));
}

/* Llama 3's one call {"name", "parameters"} as {"name", "arguments"}; NULL if not one. */
static json_t *llama3_call(const char *p) {
    json_t *c = value_at(&p);
    json_t *args = json_object_get(c, "parameters");
    json_t *out =
        json_is_object(args) && json_is_string(json_object_get(c, "name")) && !*skip_ws(p)
            ? json_pack("[{s:O, s:O}]", "name", json_object_get(c, "name"), "arguments", args)
            : NULL;
    json_decref(c);
    return out;
}

/* The calls from the trigger at p on, in markup m's shape; NULL when they are not all
 * well formed. */
static json_t *read_calls(tok_tool_format f, const char *p) {
    json_t *calls = json_array();
    if (f == TOK_TOOLS_HERMES) {
        while (calls && lit(&p, "<tool_call>")) {
            json_t *c = value_at(&p);
            if (!call_ok(c) || !lit(&p, "</tool_call>")) {
                json_decref(c);
                json_decref(calls);
                return NULL;
            }
            json_array_append_new(calls, c);
        }
    } else if (calls && lit(&p, "[TOOL_CALLS]")) {
        json_t *arr = value_at(&p);
        size_t i;
        json_t *c;
        json_array_foreach(arr, i, c) {
            if (call_ok(c))
                json_array_append(calls, c);
        }
        if (!json_is_array(arr) || json_array_size(calls) != json_array_size(arr))
            json_array_clear(calls);
        json_decref(arr);
    }
    if (!calls || json_array_size(calls) == 0 || *skip_ws(p)) {
        json_decref(calls);
        return NULL;
    }
    return calls;
}

int tok_tool_calls_parse(tok_tool_format f, const char *text, size_t *content_len, json_t **calls) {
    *calls = NULL;
    *content_len = text ? strlen(text) : 0;
    const tok_tool_markup *m = tok_tool_markup_of(f);
    if (f == TOK_TOOLS_LLAMA3) { /* the whole answer is the call, or there is none */
        if (text && (*calls = llama3_call(text)))
            *content_len = 0;
        return *calls != NULL;
    }
    const char *at = m && text ? strstr(text, m->trigger) : NULL;
    if (!at || !(*calls = read_calls(f, at)))
        return 0;
    size_t n = (size_t)(at - text);
    while (n && isspace((unsigned char)text[n - 1]))
        n--;
    *content_len = n;
    return 1;
}
