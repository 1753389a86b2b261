/* gr_check.c — drives the grammar library from scripts (tests/integration/
 * grammar_conformance.py, bench/structured): one JSON request per input line, one JSON
 * answer per output line.
 *
 *   {"schema": {...}, "strict": true, "instances": ["text", ...]}
 *   {"regex": "...", "instances": [...]}       {"ebnf": "...", "instances": [...]}
 *   {"choice": ["a", "b"], "instances": [...]}
 *   -> {"ok": true, "compile_ms": 1.2, "relaxed": "...", "accept": [true, false, ...]}
 *   -> {"ok": false, "code": "unsupported", "error": "'pattern' at /x: ..."}
 *
 * An instance is accepted when its bytes are a complete sentence of the grammar. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/grammar/grammar.h"

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

int main(void) {
    /* A byte vocabulary: token i < 256 is byte i, token 256 the end. */
    static char bytes[256];
    const char *tok[257];
    uint32_t len[257];
    for (int i = 0; i < 256; i++) {
        bytes[i] = (char)i;
        tok[i] = &bytes[i];
        len[i] = 1;
    }
    tok[256] = "";
    len[256] = 0;
    int32_t eos = 256;
    gr_vocab *v;
    md_err e = {0};
    if (gr_vocab_new(257, tok, len, &eos, 1, &v, &e)) {
        fprintf(stderr, "gr_check: %s\n", e.msg);
        return 1;
    }
    size_t cap = 1 << 20;
    char *line = malloc(cap);
    ssize_t n;
    size_t lcap = cap;
    while ((n = getline(&line, &lcap, stdin)) > 0) {
        json_error_t je;
        json_t *req = json_loadb(line, (size_t)n, 0, &je);
        json_t *ans = json_object();
        if (!req) {
            json_object_set_new(ans, "ok", json_false());
            json_object_set_new(ans, "error", json_string(je.text));
            goto reply;
        }
        gr_grammar *g = NULL;
        char relaxed[4096] = "";
        md_err_clear(&e);
        int rc;
        double t0 = now_ms();
        json_t *x;
        if ((x = json_object_get(req, "schema"))) {
            char *text = json_string_value(x) ? strdup(json_string_value(x))
                                              : json_dumps(x, JSON_COMPACT | JSON_ENCODE_ANY);
            int strict = !json_is_false(json_object_get(req, "strict"));
            rc = gr_from_json_schema(text, strlen(text), strict, &g, relaxed, sizeof relaxed, &e);
            free(text);
        } else if ((x = json_object_get(req, "regex"))) {
            rc = gr_from_regex(json_string_value(x), json_string_length(x), &g, &e);
        } else if ((x = json_object_get(req, "ebnf"))) {
            rc = gr_from_ebnf(json_string_value(x), json_string_length(x), &g, &e);
        } else if ((x = json_object_get(req, "choice"))) {
            size_t k = json_array_size(x);
            const char **ch = calloc(k + 1, sizeof *ch);
            size_t *cl = calloc(k + 1, sizeof *cl);
            for (size_t i = 0; i < k; i++) {
                ch[i] = json_string_value(json_array_get(x, i));
                cl[i] = json_string_length(json_array_get(x, i));
            }
            rc = gr_from_choice(ch, cl, (int)k, &g, &e);
            free(ch);
            free(cl);
        } else if (json_object_get(req, "json_object")) {
            rc = gr_from_json_object(&g, &e);
        } else {
            rc = md_errf(&e, MD_EINVAL, "request has no schema/regex/ebnf/choice");
        }
        double t1 = now_ms();
        if (rc) {
            json_object_set_new(ans, "ok", json_false());
            json_object_set_new(ans, "code", json_string(md_strerror(rc)));
            json_object_set_new(ans, "error", json_string(e.msg));
            json_decref(req);
            goto reply;
        }
        json_object_set_new(ans, "ok", json_true());
        json_object_set_new(ans, "compile_ms", json_real(t1 - t0));
        json_object_set_new(ans, "relaxed", json_string(relaxed));
        json_t *acc = json_array();
        json_t *inst = json_object_get(req, "instances");
        for (size_t i = 0; i < json_array_size(inst); i++) {
            json_t *s = json_array_get(inst, i);
            gr_matcher *m;
            int ok = 0;
            if (gr_matcher_new(g, v, &m, &e) == 0) {
                ok = gr_matcher_accept_bytes(m, json_string_value(s), json_string_length(s)) == 0 &&
                     gr_matcher_can_end(m);
                gr_matcher_free(m);
            }
            json_array_append_new(acc, json_boolean(ok));
        }
        json_object_set_new(ans, "accept", acc);
        gr_free(g);
        json_decref(req);
    reply:;
        char *out = json_dumps(ans, JSON_COMPACT);
        printf("%s\n", out);
        fflush(stdout);
        free(out);
        json_decref(ans);
    }
    free(line);
    gr_vocab_free(v);
    return 0;
}
