/* gr_schema_object.c — objects (properties in schema order, required names, additional
 * properties with keys other than the named ones) and arrays (prefixItems, items, bounds). */
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/grammar/gr_schema_int.h"

/* Key content of an additional property: any canonical JSON string but the given names. */
static int key_except(sc *c, char **names, size_t *lens, int n, size_t depth) {
    gr_builder *b = &c->b;
    /* names all share their first `depth` bytes; branch on the next one. */
    int x = gb_none(b);
    int terminal = 0;
    gr_cls seen = {{0}};
    for (int i = 0; i < n; i++) {
        if (lens[i] == depth) {
            terminal = 1;
            continue;
        }
        unsigned ch = (unsigned char)names[i][depth];
        if (gr_cls_has(&seen, ch))
            continue;
        gr_cls_set(&seen, ch);
        char *sub[n];
        size_t sl[n];
        int k = 0;
        for (int j = 0; j < n; j++)
            if (lens[j] > depth && (unsigned char)names[j][depth] == ch) {
                sub[k] = names[j];
                sl[k++] = lens[j];
            }
        x = gb_alt(b, x, gb_seq(b, gb_byte(b, ch), key_except(c, sub, sl, k, depth + 1)));
    }
    if (!terminal)
        x = gb_alt(b, x, gb_empty(b));
    /* Or leave the tree here with a code point whose first byte no name continues with,
     * then anything. Keys are written canonically (gr_regex_json_expr's form). Inside a
     * multi-byte code point `seen` holds continuation bytes only, which no alternative
     * below starts with, so the tree is never left mid code point. */
    int rest = gr_regex_json_expr(b, "^(?:.|\\n)*$", sizeof "^(?:.|\\n)*$" - 1);
    gr_cls lead = {{0}};
    for (unsigned i = 0x20; i < 0x80; i++)
        if (i != '"' && i != '\\' && !gr_cls_has(&seen, i))
            gr_cls_set(&lead, i);
    int alt = gb_cls(b, &lead);
    /* escapes of controls, quote and backslash all begin with '\\' */
    if (!gr_cls_has(&seen, '\\')) {
        int esc = gb_none(b);
        for (unsigned i = 0; i < 0x20; i++) {
            char buf[8];
            switch (i) {
            case '\n': strcpy(buf, "\\n"); break;
            case '\r': strcpy(buf, "\\r"); break;
            case '\t': strcpy(buf, "\\t"); break;
            case '\b': strcpy(buf, "\\b"); break;
            case '\f': strcpy(buf, "\\f"); break;
            default: snprintf(buf, sizeof buf, "\\u%04x", i);
            }
            esc = gb_alt(b, esc, gb_str(b, buf));
        }
        esc = gb_alt(b, esc, gb_str(b, "\\\""));
        esc = gb_alt(b, esc, gb_str(b, "\\\\"));
        alt = gb_alt(b, alt, esc);
    }
    /* multi-byte code points by lead byte */
    int cont = gb_range(b, 0x80, 0xbf);
    for (unsigned l = 0xc2; l <= 0xf4; l++) {
        if (gr_cls_has(&seen, l))
            continue;
        int tail;
        if (l <= 0xdf)
            tail = cont;
        else if (l == 0xe0)
            tail = gb_seq(b, gb_range(b, 0xa0, 0xbf), cont);
        else if (l == 0xed)
            tail = gb_seq(b, gb_range(b, 0x80, 0x9f), cont);
        else if (l <= 0xef)
            tail = gb_seq(b, cont, cont);
        else if (l == 0xf0)
            tail = gb_seq3(b, gb_range(b, 0x90, 0xbf), cont, cont);
        else if (l == 0xf4)
            tail = gb_seq3(b, gb_range(b, 0x80, 0x8f), cont, cont);
        else
            tail = gb_seq3(b, cont, cont, cont);
        alt = gb_alt(b, alt, gb_seq(b, gb_byte(b, (unsigned char)l), tail));
    }
    return gb_alt(b, x, gb_seq(b, alt, rest));
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Each named property as "key":value into vals[]. Returns 0, -1 when failed, or 1 when a
 * required property can take no value (the object can then not be written at all). */
static int props_exprs(sc *c, const char *ptr, const char **names, json_t **schemas,
                       const uint8_t *required, int n, json_t *addl, int extra_ok, int *vals) {
    gr_builder *b = &c->b;
    for (int i = 0; i < n; i++) {
        sbuf key = {0};
        sb_json_str(&key, names[i], strlen(names[i]));
        sb_put(&key, ":", 1);
        if (key.oom) {
            free(key.p);
            return gb_fail(b, MD_ENOMEM, "out of memory compiling a schema");
        }
        int v;
        if (schemas[i]) {
            char *pp = sc_ptr_join(ptr, "properties");
            char *p2 = pp ? sc_ptr_join(pp, names[i]) : NULL;
            free(pp);
            v = p2 ? sc_schema(c, schemas[i], p2) : gb_fail(b, MD_ENOMEM, "out of memory");
            free(p2);
        } else if (addl && !json_is_boolean(addl)) {
            char *pp = sc_ptr_join(ptr, "additionalProperties");
            v = pp ? sc_schema(c, addl, pp) : gb_fail(b, MD_ENOMEM, "out of memory");
            free(pp);
        } else
            v = extra_ok ? sc_value_expr(c) : gb_none(b);
        vals[i] = gb_seq(b, gb_lit(b, key.p, key.n), v);
        free(key.p);
        if (vals[i] < 0)
            return -1;
        if (b->ex[v].kind == GX_NONE && required[i]) {
            return 1;
        }
    }
    return 0;
}

/* Additional properties: "key":value with key not among the n names. */
static int extra_expr(sc *c, const char *ptr, const char **names, int n, json_t *addl) {
    gr_builder *b = &c->b;
    char **sorted = malloc(sizeof(char *) * (size_t)(n + 1));
    size_t *lens = malloc(sizeof(size_t) * (size_t)(n + 1));
    if (!sorted || !lens) {
        free(sorted);
        free(lens);
        return gb_fail(b, MD_ENOMEM, "out of memory compiling a schema");
    }
    sbuf enc[n > 0 ? n : 1];
    memset(enc, 0, sizeof enc);
    for (int i = 0; i < n; i++) {
        sb_json_str(&enc[i], names[i], strlen(names[i]));
        /* strip the quotes: the tree is over the content */
        enc[i].p[enc[i].n - 1] = 0;
        sorted[i] = enc[i].p + 1;
        lens[i] = enc[i].n - 2;
    }
    qsort(sorted, (size_t)n, sizeof *sorted, cmp_str);
    for (int i = 0; i < n; i++)
        lens[i] = strlen(sorted[i]);
    /* No names to avoid: any string, through the shared rule (one cache entry). */
    int key = n ? gb_seq3(b, gb_byte(b, '"'), key_except(c, sorted, lens, n, 0), gb_byte(b, '"'))
                : sc_string_expr(c, 0, -1);
    for (int i = 0; i < n; i++)
        free(enc[i].p);
    free(sorted);
    free(lens);
    int v;
    if (addl && !json_is_boolean(addl)) {
        char *pp = sc_ptr_join(ptr, "additionalProperties");
        v = pp ? sc_schema(c, addl, pp) : gb_fail(b, MD_ENOMEM, "out of memory");
        free(pp);
    } else
        v = sc_value_expr(c);
    return gb_seq3(b, key, gb_byte(b, ':'), v);
}

/* The property list from vals[] (required or optional, in order) and the additional
 * properties' expression (extra, -1 when none are allowed). */
static int props_list(gr_builder *b, const int *vals, const uint8_t *required, int n, int nrequired,
                      int extra, int count_extra, int minp, int maxp) {
    /* A_i: nothing written yet, at property i; B_i: something written. Built from the end.
     * With many optional properties the B_i become rules so the size stays linear. */
    int nopt = n - nrequired;
    int comma = gb_byte(b, ',');
    int A = extra >= 0 ? gb_opt(b, gb_seq(b, extra, gb_rep(b, gb_seq(b, comma, extra), 0, -1)))
                       : gb_empty(b);
    if (count_extra) { /* only additional properties: count them */
        int more =
            gb_rep(b, gb_seq(b, comma, extra), minp > 1 ? minp - 1 : 0, maxp >= 0 ? maxp - 1 : -1);
        A = gb_seq(b, extra, more);
        if (minp == 0)
            A = gb_opt(b, A);
    }
    int B = extra >= 0 ? gb_rep(b, gb_seq(b, comma, extra), 0, -1) : gb_empty(b);
    for (int i = n - 1; i >= 0; i--) {
        if (nopt > 6) {
            int rb = gb_rule_new(b, "props");
            gb_rule_set(b, rb, B);
            B = gb_ref(b, rb);
        }
        int withp_a = gb_seq(b, vals[i], B);
        int withp_b = gb_seq3(b, comma, vals[i], B);
        if (required[i]) {
            A = withp_a;
            B = withp_b;
        } else {
            A = gb_alt(b, withp_a, A);
            B = gb_alt(b, withp_b, B);
        }
    }
    return gb_seq3(b, gb_byte(b, '{'), A, gb_byte(b, '}'));
}

int sc_object_part(sc *c, json_t *s, const char *ptr) {
    gr_builder *b = &c->b;
    json_t *props = json_object_get(s, "properties");
    json_t *req = json_object_get(s, "required");
    json_t *addl = json_object_get(s, "additionalProperties");
    if (props && !json_is_object(props))
        return sc_fail(c, MD_EINVAL, "properties", ptr, "expected an object");
    if (req && !json_is_array(req))
        return sc_fail(c, MD_EINVAL, "required", ptr, "expected an array of names");
    int minp = 0, maxp = -1;
    if (sc_get_count(c, s, "minProperties", ptr, &minp) < 0 ||
        sc_get_count(c, s, "maxProperties", ptr, &maxp) < 0)
        return -1;
    size_t np = props ? json_object_size(props) : 0;
    size_t nreq = req ? json_array_size(req) : 0;
    size_t cap = np + nreq + 1;
    const char **names = calloc(cap, sizeof *names);
    json_t **schemas = calloc(cap, sizeof *schemas);
    uint8_t *required = calloc(cap, 1);
    int *vals = calloc(cap, sizeof *vals);
    int n = 0, rc = 0;
    if (!names || !schemas || !required || !vals) {
        rc = gb_fail(b, MD_ENOMEM, "out of memory compiling a schema");
        goto out;
    }
    if (props) {
        const char *k;
        json_t *v;
        json_object_foreach(props, k, v) {
            names[n] = k;
            schemas[n++] = v;
        }
    }
    for (size_t i = 0; i < nreq; i++) {
        json_t *r = json_array_get(req, i);
        if (!json_is_string(r)) {
            rc = sc_fail(c, MD_EINVAL, "required", ptr, "expected an array of names");
            goto out;
        }
        int k;
        for (k = 0; k < n; k++)
            if (!strcmp(names[k], json_string_value(r)))
                break;
        if (k == n) {
            names[n] = json_string_value(r);
            schemas[n++] = NULL; /* any value (or additionalProperties, below) */
        }
        required[k] = 1;
    }
    int nrequired = 0;
    for (int i = 0; i < n; i++)
        nrequired += required[i];
    int extra_ok = !json_is_false(addl);
    int count_extra = n == 0 && extra_ok && (minp > 0 || maxp >= 0);
    if (!count_extra && minp > nrequired &&
        sc_unsupp(c, "minProperties", ptr,
                  "'minProperties' above the number of required properties is not supported"))
        goto fail;
    if (maxp >= 0 && maxp < nrequired) {
        rc = gb_none(b);
        goto out;
    }
    if (maxp == 0) {
        rc = gb_str(b, "{}");
        goto out;
    }
    if (!count_extra && maxp >= 0 && (extra_ok || maxp < n) &&
        sc_unsupp(c, "maxProperties", ptr,
                  "'maxProperties' below the number of possible properties is not supported"))
        goto fail;
    if (extra_ok)
        for (int i = 0; i < n; i++)
            if (strlen(names[i]) > 256) {
                rc = sc_fail(c, MD_EUNSUPP, "properties", ptr,
                             "names over 256 bytes beside additional properties");
                goto out;
            }
    int pr = props_exprs(c, ptr, names, schemas, required, n, addl, extra_ok, vals);
    if (pr) {
        rc = pr < 0 ? -1 : gb_none(b);
        goto out;
    }
    /* Additional properties: "key":value with key not among the names. */
    int extra = -1;
    if (extra_ok) {
        extra = extra_expr(c, ptr, names, n, addl);
        if (extra < 0)
            goto fail;
    }
    rc = props_list(b, vals, required, n, nrequired, extra, count_extra, minp, maxp);
    goto out;
fail:
    rc = -1;
out:
    free(names);
    free(schemas);
    free(required);
    free(vals);
    return rc;
}

int sc_array_part(sc *c, json_t *s, const char *ptr) {
    gr_builder *b = &c->b;
    json_t *prefix = json_object_get(s, "prefixItems");
    json_t *items = json_object_get(s, "items");
    int mn = 0, mx = -1;
    if (sc_get_count(c, s, "minItems", ptr, &mn) < 0 ||
        sc_get_count(c, s, "maxItems", ptr, &mx) < 0)
        return -1;
    json_t *uniq = json_object_get(s, "uniqueItems");
    if (json_is_true(uniq) && (mx < 0 || mx > 1) &&
        sc_unsupp(c, "uniqueItems", ptr, "'uniqueItems' is not supported"))
        return -1;
    if (json_object_get(s, "contains") &&
        sc_unsupp(c, "contains", ptr, "'contains' is not supported"))
        return -1;
    if (json_is_array(items) && !prefix) {
        /* draft-07 tuples: items [...] with additionalItems for the rest */
        prefix = items;
        items = json_object_get(s, "additionalItems");
    }
    if (prefix && !json_is_array(prefix))
        return sc_fail(c, MD_EINVAL, "prefixItems", ptr, "expected an array of schemas");
    int k = prefix ? (int)json_array_size(prefix) : 0;
    if (k > SC_MAX_LEN)
        return sc_fail(c, MD_EUNSUPP, "prefixItems", ptr, "more than %d entries", SC_MAX_LEN);
    if (mx >= 0 && mn > mx)
        return gb_none(b);
    int rest;
    if (json_is_false(items))
        rest = gb_none(b);
    else if (items) {
        char *pp = sc_ptr_join(ptr, "items");
        rest = pp ? sc_schema(c, items, pp) : gb_fail(b, MD_ENOMEM, "out of memory");
        free(pp);
    } else
        rest = sc_value_expr(c);
    if (rest < 0)
        return -1;
    int *pe = malloc(sizeof(int) * (size_t)(k + 1));
    if (!pe)
        return gb_fail(b, MD_ENOMEM, "out of memory compiling a schema");
    for (int i = 0; i < k; i++) {
        char *pp = sc_ptr_idx(ptr, "prefixItems", (size_t)i);
        pe[i] = pp ? sc_schema(c, json_array_get(prefix, (size_t)i), pp)
                   : gb_fail(b, MD_ENOMEM, "out of memory");
        free(pp);
        if (pe[i] < 0) {
            free(pe);
            return -1;
        }
    }
    int comma = gb_byte(b, ',');
    /* T_j: the elements from index j on, each preceded by a comma when j > 0. */
    int T;
    {
        int j = k;
        int need = mn > j ? mn - j : 0;
        int maxr = mx < 0 ? -1 : (mx > j ? mx - j : 0);
        int unit = j > 0 ? gb_seq(b, comma, rest) : rest;
        if (j > 0 || b->ex[rest].kind == GX_NONE)
            T = gb_rep(b, unit, need, maxr);
        else {
            /* no prefix: first element without comma */
            int more = gb_rep(b, gb_seq(b, comma, rest), need > 0 ? need - 1 : 0,
                              maxr < 0 ? -1 : maxr - 1);
            int some = maxr == 0 ? gb_none(b) : gb_seq(b, rest, more);
            T = need > 0 ? some : gb_alt(b, gb_empty(b), some);
        }
    }
    for (int j = k - 1; j >= 0; j--) {
        int elem = j > 0 ? gb_seq(b, comma, pe[j]) : pe[j];
        int go = (mx >= 0 && j >= mx) ? gb_none(b) : gb_seq(b, elem, T);
        T = j >= mn ? gb_alt(b, gb_empty(b), go) : go;
    }
    free(pe);
    return gb_seq3(b, gb_byte(b, '['), T, gb_byte(b, ']'));
}
