/* grammars.c — see grammars.h. */
#include "worker/grammars.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "engine/grammar/grammar.h"
#include "engine/tokenizer/chat_tools.h"

typedef struct gentry {
    int refs;
    uint64_t hash;
    q_con_kind kind;
    int strict;
    const void *markup; /* an "auto" call's framing (q_request.con_markup), NULL: none */
    int calls;          /* the most calls the framing allows */
    char *text; /* the constraint (len bytes), compared on a hash hit */
    size_t len;
    gr_grammar *g; /* NULL: refused, and ve says why */
    q_verr ve;
    double compile_ms;
    char relaxed[512];
    uint64_t used; /* LRU tick */
} gentry;

struct wk_grammars {
    gentry **e; /* (cap) NULL: a free slot */
    int cap;
    uint64_t tick;
    long compiles, hits;
};

int wk_grammars_new(int cap, wk_grammars **out, md_err *e) {
    wk_grammars *c = calloc(1, sizeof *c);
    if (c)
        c->e = calloc((size_t)(cap > 0 ? cap : 1), sizeof *c->e);
    if (!c || !c->e) {
        free(c);
        return md_errf(e, MD_ENOMEM, "out of memory for the grammar cache");
    }
    c->cap = cap > 0 ? cap : 1;
    *out = c;
    return 0;
}

void wk_grammars_hold(void *entry) {
    if (entry)
        ((gentry *)entry)->refs++;
}

void wk_grammars_release(void *entry) {
    gentry *g = entry;
    if (!g || --g->refs > 0)
        return;
    gr_free(g->g);
    free(g->text);
    free(g);
}

void wk_grammars_free(wk_grammars *c) {
    if (!c)
        return;
    for (int i = 0; i < c->cap; i++)
        wk_grammars_release(c->e[i]);
    free(c->e);
    free(c);
}

void wk_grammars_get_stats(const wk_grammars *c, wk_grammars_stats *st) {
    st->compiles = c->compiles;
    st->hits = c->hits;
    st->entries = 0;
    for (int i = 0; i < c->cap; i++)
        st->entries += c->e[i] != NULL;
}

/* FNV-1a over the kind, the strictness and the text. */
static uint64_t con_hash(q_con_kind kind, int strict, const char *text, size_t len) {
    uint64_t h = 1469598103934665603ull;
    unsigned char pre[2] = {(unsigned char)kind, (unsigned char)strict};
    for (int i = 0; i < 2; i++)
        h = (h ^ pre[i]) * 1099511628211ull;
    for (size_t i = 0; i < len; i++)
        h = (h ^ (unsigned char)text[i]) * 1099511628211ull;
    return h;
}

/* The body field a compile error is reported under. */
static const char *error_param(const q_request *req) {
    return req->con == Q_CON_JSON_SCHEMA && !strcmp(req->con_param, "body.response_format")
               ? "body.response_format.json_schema.schema"
               : req->con_param;
}

/* Compile req's constraint into g (refusal: e). */
static int compile(const q_request *req, gentry *g, md_err *e) {
    switch (req->con) {
    case Q_CON_JSON_OBJECT: return gr_from_json_object(&g->g, e);
    case Q_CON_JSON_SCHEMA:
        if (req->con_lazy && req->con_markup) { /* an "auto" call in the template's markup */
            const tok_tool_markup *m = req->con_markup;
            gr_frame f = {m->prefix, m->item_open, m->item_close, m->sep, m->suffix,
                          req->parallel_tools ? m->max_calls : 1};
            return gr_from_json_schema_framed(req->con_text, req->con_len, req->con_strict, &f,
                                              &g->g, g->relaxed, sizeof g->relaxed, e);
        }
        return gr_from_json_schema(req->con_text, req->con_len, req->con_strict, &g->g, g->relaxed,
                                   sizeof g->relaxed, e);
    case Q_CON_REGEX: return gr_from_regex(req->con_text, req->con_len, &g->g, e);
    case Q_CON_GRAMMAR: return gr_from_ebnf(req->con_text, req->con_len, &g->g, e);
    case Q_CON_CHOICE: {
        /* con_text is a JSON array of non-empty strings (validate.c made it) */
        json_t *arr = json_loadb(req->con_text, req->con_len, 0, NULL);
        int n = arr ? (int)json_array_size(arr) : 0;
        const char **s = calloc((size_t)n + 1, sizeof *s);
        size_t *lens = calloc((size_t)n + 1, sizeof *lens);
        int rc = arr && s && lens ? 0 : md_errf(e, MD_ENOMEM, "out of memory for the choices");
        for (int i = 0; i < n && !rc; i++) {
            s[i] = json_string_value(json_array_get(arr, (size_t)i));
            lens[i] = json_string_length(json_array_get(arr, (size_t)i));
        }
        if (!rc)
            rc = gr_from_choice(s, lens, n, &g->g, e);
        free(s);
        free(lens);
        json_decref(arr);
        return rc;
    }
    default: return md_errf(e, MD_EINVAL, "no constraint to compile");
    }
}

int wk_grammars_prepare(wk_grammars *c, q_request *req, q_verr *ve) {
    if (req->con == Q_CON_NONE)
        return 0;
    uint64_t h = con_hash(req->con, req->con_strict, req->con_text, req->con_len);
    const void *markup = req->con_lazy ? req->con_markup : NULL;
    int calls = markup && req->parallel_tools ? ((const tok_tool_markup *)markup)->max_calls : 1;
    gentry *g = NULL;
    int free_slot = -1, lru = -1;
    for (int i = 0; i < c->cap && !g; i++) {
        gentry *x = c->e[i];
        if (!x) {
            free_slot = free_slot < 0 ? i : free_slot;
        } else if (x->hash == h && x->kind == req->con && x->strict == req->con_strict &&
                   x->markup == markup && x->calls == calls &&
                   x->len == req->con_len && !memcmp(x->text, req->con_text, x->len)) {
            g = x;
        } else if (lru < 0 || x->used < c->e[lru]->used) {
            lru = i;
        }
    }
    if (g) {
        c->hits++;
        req->compile_cached = 1;
    } else {
        g = calloc(1, sizeof *g);
        char *text = g ? malloc(req->con_len + 1) : NULL;
        if (!text) {
            free(g);
            snprintf(ve->code, sizeof ve->code, "server_error");
            snprintf(ve->message, sizeof ve->message, "out of memory compiling %s", req->con_param);
            ve->status = 500;
            return -1;
        }
        memcpy(text, req->con_text, req->con_len + 1);
        *g = (gentry){.refs = 1,
                      .hash = h,
                      .kind = req->con,
                      .strict = req->con_strict,
                      .markup = markup,
                      .calls = calls,
                      .text = text,
                      .len = req->con_len};
        md_err e = {0};
        uint64_t t0 = md_mono_ns();
        int rc = compile(req, g, &e);
        g->compile_ms = (double)(md_mono_ns() - t0) / 1e6;
        c->compiles++;
        if (rc) {
            gr_free(g->g);
            g->g = NULL;
            g->ve.status = 400;
            snprintf(g->ve.code, sizeof g->ve.code, "%s",
                     rc == MD_EUNSUPP ? "unsupported_value" : "invalid_value");
            snprintf(g->ve.param, sizeof g->ve.param, "%s", error_param(req));
            if (!strcmp(req->con_param, "body.tools"))
                snprintf(g->ve.message, sizeof g->ve.message,
                         "%s cannot be enforced: %s (the call schema holds body.tools[N]."
                         "function.parameters at /$defs/fN)",
                         req->con_param, e.msg);
            else
                snprintf(g->ve.message, sizeof g->ve.message, "%s cannot be enforced: %s",
                         error_param(req), e.msg);
        }
        int at = free_slot >= 0 ? free_slot : lru;
        if (c->e[at])
            wk_grammars_release(c->e[at]); /* evicted: lives on while sequences hold it */
        c->e[at] = g;
    }
    g->used = ++c->tick;
    if (!g->g) {
        *ve = g->ve;
        return -1;
    }
    g->refs++;
    req->grammar = g->g;
    req->gentry = g;
    req->compile_ms = req->compile_cached ? 0 : g->compile_ms;
    snprintf(req->relaxed, sizeof req->relaxed, "%s", g->relaxed);
    return 0;
}
