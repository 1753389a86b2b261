/* tool_calls.c — see tool_calls.h. */
#include "worker/tool_calls.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* medley's own call format (docs/structured.md "Tool calls"): the functions are listed as
 * JSON and the model is asked for {"name", "arguments"}; the grammar enforces the shape,
 * this text tells the model what the names and arguments mean. */
/* One function as the tool formats list it: {name, description, parameters} (NULL when out
 * of memory). */
static json_t *function_obj(const q_tool *t) {
    json_t *f = json_pack("{s:s}", "name", t->name);
    if (f && t->description)
        json_object_set_new(f, "description", json_string(t->description));
    if (f && t->parameters)
        json_object_set(f, "parameters", t->parameters);
    return f;
}

int wk_tools_system_text(const q_request *req, const char *own, char **out, md_err *e) {
    json_t *list = json_array();
    for (int i = 0; list && i < req->n_tools; i++) {
        const q_tool *t = &req->tools[i];
        if (req->tool_choice == Q_TOOLS_NAMED && i != req->tool_named)
            continue;
        json_t *f = function_obj(t);
        if (!f || json_array_append_new(list, f)) {
            json_decref(list);
            list = NULL;
        }
    }
    char *fns = list ? json_dumps(list, JSON_COMPACT) : NULL;
    json_decref(list);
    if (!fns)
        return md_errf(e, MD_ENOMEM, "out of memory describing the tools");
    static const char head[] =
        "You can call the following functions. Answer with exactly one call, written as a JSON "
        "object {\"name\": <the function's name>, \"arguments\": <an object of its "
        "arguments>} and nothing else.\nFunctions: ";
    size_t n = sizeof head + strlen(fns) + (own ? strlen(own) + 2 : 0);
    *out = malloc(n);
    if (*out)
        snprintf(*out, n, "%s%s%s%s", head, fns, own ? "\n\n" : "", own ? own : "");
    free(fns);
    return *out ? 0 : md_errf(e, MD_ENOMEM, "out of memory describing the tools");
}

json_t *wk_tools_array(const q_request *req) {
    json_t *list = json_array();
    for (int i = 0; list && i < req->n_tools; i++) {
        json_t *f = function_obj(&req->tools[i]);
        json_t *tool = f ? json_pack("{s:s, s:o}", "type", "function", "function", f) : NULL;
        if (!tool || json_array_append_new(list, tool)) {
            json_decref(list);
            list = NULL;
        }
    }
    return list;
}

/* One call branch {"properties": {"name", "arguments"}, "required": [...]}: the member
 * renamed. */
static void rename_branch(json_t *br, const char *key) {
    json_t *props = json_object_get(br, "properties");
    json_t *a = json_object_get(props, "arguments");
    if (a) {
        json_object_set(props, key, a);
        json_object_del(props, "arguments");
    }
    size_t i;
    json_t *x;
    json_array_foreach(json_object_get(br, "required"), i, x) {
        if (!strcmp(json_string_value(x) ? json_string_value(x) : "", "arguments"))
            json_array_set_new(json_object_get(br, "required"), i, json_string(key));
    }
}

int wk_tools_rename_args(q_request *req, const char *key) {
    json_t *s = json_loadb(req->con_text, req->con_len, JSON_DECODE_ANY, NULL);
    if (!s)
        return -1;
    json_t *any = json_object_get(s, "anyOf");
    size_t i;
    json_t *br;
    if (any) {
        json_array_foreach(any, i, br) {
            rename_branch(br, key);
        }
    } else {
        rename_branch(s, key);
    }
    char *txt = json_dumps(s, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(s);
    if (!txt)
        return -1;
    free(req->con_text);
    req->con_text = txt;
    req->con_len = strlen(txt);
    return 0;
}

int wk_calls_read(wk_calls *c, const char *text, tok_tool_format format) {
    memset(c, 0, sizeof *c);
    size_t content_len = 0;
    if (format == TOK_TOOLS_NONE) { /* medley's own: the text is one call */
        json_t *one = json_loads(text, 0, NULL);
        if (json_is_string(json_object_get(one, "name")) && json_object_get(one, "arguments")) {
            c->doc = json_array();
            json_array_append_new(c->doc, one);
        } else {
            json_decref(one);
        }
    } else if (!tok_tool_calls_parse(format, text, &content_len, &c->doc)) {
        c->doc = NULL;
    }
    size_t n = json_array_size(c->doc);
    if (!n)
        goto none;
    c->calls = calloc(n, sizeof *c->calls);
    c->content = strndup(text, content_len);
    if (!c->calls || !c->content)
        goto none;
    for (size_t i = 0; i < n; i++) {
        json_t *x = json_array_get(c->doc, i);
        char *args = json_dumps(json_object_get(x, "arguments"), JSON_COMPACT | JSON_ENCODE_ANY);
        if (!args)
            goto none;
        /* kept in the document, freed with it */
        json_object_set_new(x, "_args", json_string(args));
        free(args);
        c->calls[i].name = json_string_value(json_object_get(x, "name"));
        c->calls[i].arguments = json_string_value(json_object_get(x, "_args"));
        if (!c->calls[i].arguments)
            goto none;
        c->n++;
    }
    return 1;
none:
    wk_calls_free(c);
    return 0;
}

void wk_calls_free(wk_calls *c) {
    free(c->calls);
    free(c->content);
    json_decref(c->doc);
    memset(c, 0, sizeof *c);
}
