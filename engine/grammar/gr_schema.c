/* gr_schema.c — JSON Schema (draft 2020-12, the subset in docs/structured.md) into a grammar
 * of its compact serialization, and the "any JSON object" grammar.
 *
 * Serialization policy (what the grammar generates, and what a validator must feed it):
 * no whitespace anywhere; object properties in the schema's `properties` order, then
 * required names that `properties` lacks, then additional properties; integral numbers
 * written as integers, others in shortest round-trip form; strings with `"`, `\` and control
 * characters escaped (\n-style or \u00xx), everything else as raw UTF-8 (the generic string
 * grammar also accepts any other valid escape, a `pattern` or enum string only this form).
 *
 * Objects and arrays become rules of their own (shared where a `$ref` points at them, which
 * is how recursion works); scalars are inlined into their parent's rule so that the mask
 * cache sees long stretches of one rule. */
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/grammar/gr_schema_int.h"

/* ---- errors and relaxed keywords ---------------------------------------------------------- */

int sc_fail(sc *c, int code, const char *kw, const char *ptr, const char *fmt, ...) {
    char why[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    return gb_fail(&c->b, code, "'%s' at %s: %s", kw, *ptr ? ptr : "/", why);
}

/* An unsupported keyword: an error under strict, else noted in relaxed. Returns 0 when
 * relaxed (go on without it), -1 when failed. */
int sc_unsupp(sc *c, const char *kw, const char *ptr, const char *why) {
    if (c->strict)
        return sc_fail(c, MD_EUNSUPP, kw, ptr, "%s", why);
    if (c->relaxed && c->relaxedsz) {
        char ent[300];
        int n = snprintf(ent, sizeof ent, "%s%s at %s", c->rlen ? "," : "", kw, *ptr ? ptr : "/");
        if (n > 0 && c->rlen + (size_t)n < c->relaxedsz) {
            memcpy(c->relaxed + c->rlen, ent, (size_t)n + 1);
            c->rlen += (size_t)n;
        }
    }
    return 0;
}

/* ptr + "/" + escaped key, into a malloc'd string (NULL on OOM). */
char *sc_ptr_join(const char *ptr, const char *key) {
    sbuf s = {0};
    sb_puts(&s, ptr);
    sb_put(&s, "/", 1);
    for (const char *k = key; *k; k++) {
        if (*k == '~')
            sb_put(&s, "~0", 2);
        else if (*k == '/')
            sb_put(&s, "~1", 2);
        else
            sb_put(&s, k, 1);
    }
    if (s.oom) {
        free(s.p);
        return NULL;
    }
    return s.p ? s.p : strdup("");
}

char *sc_ptr_idx(const char *ptr, const char *key, size_t i) {
    char num[32];
    snprintf(num, sizeof num, "%zu", i);
    char *a = sc_ptr_join(ptr, key);
    if (!a)
        return NULL;
    char *r = sc_ptr_join(a, num);
    free(a);
    return r;
}
/* ---- schema walking ---------------------------------------------------------------------- */

static const char *const annotations[] = {
    "title",       "description",      "$comment",        "examples",      "default",
    "$schema",     "deprecated",       "readOnly",        "writeOnly",     "$defs",
    "definitions", "contentMediaType", "contentEncoding", "contentSchema", "$vocabulary",
    "$id",         "$anchor",          "$dynamicAnchor",  "name",          "strict",
    NULL};

int sc_is_annotation(const char *k) {
    for (int i = 0; annotations[i]; i++)
        if (!strcmp(k, annotations[i]))
            return 1;
    return 0;
}

int sc_type_bits_of_value(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_NULL: return T_NULL;
    case JSON_TRUE:
    case JSON_FALSE: return T_BOOL;
    case JSON_OBJECT: return T_OBJECT;
    case JSON_ARRAY: return T_ARRAY;
    case JSON_STRING: return T_STRING;
    case JSON_INTEGER: return T_NUMBER | T_INTEGER;
    case JSON_REAL: {
        double d = json_real_value(v);
        return d == floor(d) && fabs(d) < 9.2e18 ? T_NUMBER | T_INTEGER : T_NUMBER;
    }
    }
    return 0;
}

/* Type set of a schema's "type" keyword; T_ALL when absent; -1 on error. */
int sc_type_bits(sc *c, json_t *s, const char *ptr) {
    json_t *t = json_object_get(s, "type");
    if (!t)
        return T_ALL;
    static const char *const names[] = {"null",   "boolean", "object", "array",
                                        "number", "string",  "integer"};
    int bits = 0;
    size_t n = json_is_array(t) ? json_array_size(t) : 1;
    for (size_t i = 0; i < n; i++) {
        json_t *x = json_is_array(t) ? json_array_get(t, i) : t;
        if (!json_is_string(x))
            return sc_fail(c, MD_EINVAL, "type", ptr, "expected a type name or a list of them");
        int k;
        for (k = 0; k < 7; k++)
            if (!strcmp(json_string_value(x), names[k]))
                break;
        if (k == 7)
            return sc_fail(c, MD_EINVAL, "type", ptr, "unknown type '%s'", json_string_value(x));
        bits |= 1 << k;
    }
    if (bits & T_NUMBER)
        bits |= T_INTEGER;
    return bits;
}

static int resolve_ptr(sc *c, const char *ref, const char *ptr, json_t **out) {
    /* ref is "#..." */
    json_t *cur = c->doc;
    const char *p = ref + 1;
    while (*p) {
        if (*p != '/')
            return sc_fail(c, MD_EUNSUPP, "$ref", ptr,
                           "'%s': only JSON-pointer references within the document are supported",
                           ref);
        p++;
        char key[512];
        size_t n = 0;
        while (*p && *p != '/') {
            char ch = *p++;
            if (ch == '~' && *p == '0') {
                ch = '~';
                p++;
            } else if (ch == '~' && *p == '1') {
                ch = '/';
                p++;
            } else if (ch == '%' && p[0] && p[1]) {
                char hx[3] = {p[0], p[1], 0};
                ch = (char)strtol(hx, NULL, 16);
                p += 2;
            }
            if (n + 1 >= sizeof key)
                return sc_fail(c, MD_EINVAL, "$ref", ptr, "a reference segment is too long");
            key[n++] = ch;
        }
        key[n] = 0;
        if (json_is_object(cur))
            cur = json_object_get(cur, key);
        else if (json_is_array(cur)) {
            char *end;
            long i = strtol(key, &end, 10);
            cur = *end || i < 0 ? NULL : json_array_get(cur, (size_t)i);
        } else
            cur = NULL;
        if (!cur)
            return sc_fail(c, MD_EINVAL, "$ref", ptr, "'%s' points at nothing", ref);
    }
    *out = cur;
    return 0;
}

static int sc_ref(sc *c, const char *ref, const char *ptr) {
    if (ref[0] != '#')
        return sc_fail(c, MD_EUNSUPP, "$ref", ptr,
                       "'%s': remote references are not supported (local '#/...' only)", ref);
    for (int i = 0; i < c->nrefs; i++)
        if (!strcmp(c->refs[i].ptr, ref))
            return gb_ref(&c->b, c->refs[i].rule);
    json_t *target;
    if (resolve_ptr(c, ref, ptr, &target))
        return -1;
    if (c->nrefs == c->crefs) {
        int nc = c->crefs ? c->crefs * 2 : 16;
        sc_refent *q = realloc(c->refs, sizeof *q * (size_t)nc);
        if (!q)
            return gb_fail(&c->b, MD_ENOMEM, "out of memory compiling a schema");
        c->refs = q;
        c->crefs = nc;
    }
    int r = gb_rule_new(&c->b, "ref");
    char *dup = strdup(ref);
    if (r < 0 || !dup) {
        free(dup);
        return gb_fail(&c->b, MD_ENOMEM, "out of memory compiling a schema");
    }
    c->refs[c->nrefs].ptr = dup;
    c->refs[c->nrefs++].rule = r;
    /* Pointer of the target, for messages: the reference without '#'. */
    int x = sc_schema(c, target, ref + 1);
    gb_rule_set(&c->b, r, x);
    return x < 0 ? -1 : gb_ref(&c->b, r);
}

json_t *sc_deref_shallow(sc *c, json_t *s, const char *ptr) {
    /* A subschema that is only a $ref (plus annotations) is merged as its target. */
    for (int hops = 0; hops < 32 && json_is_object(s); hops++) {
        json_t *r = json_object_get(s, "$ref");
        if (!json_is_string(r))
            return s;
        const char *k;
        json_t *v;
        json_object_foreach(s, k, v) {
            if (strcmp(k, "$ref") && !sc_is_annotation(k))
                return s;
        }
        const char *ref = json_string_value(r);
        if (ref[0] != '#') {
            sc_fail(c, MD_EUNSUPP, "$ref", ptr,
                    "'%s': remote references are not supported (local '#/...' only)", ref);
            return NULL;
        }
        json_t *t;
        if (resolve_ptr(c, ref, ptr, &t))
            return NULL;
        s = t;
    }
    return s;
}

static const char *const known_assertions[] = {"type",
                                               "enum",
                                               "const",
                                               "properties",
                                               "required",
                                               "additionalProperties",
                                               "items",
                                               "prefixItems",
                                               "minItems",
                                               "maxItems",
                                               "minLength",
                                               "maxLength",
                                               "pattern",
                                               "format",
                                               "minimum",
                                               "maximum",
                                               "exclusiveMinimum",
                                               "exclusiveMaximum",
                                               "anyOf",
                                               "oneOf",
                                               "allOf",
                                               "$ref",
                                               "minProperties",
                                               "maxProperties",
                                               "uniqueItems",
                                               "contains",
                                               "multipleOf",
                                               NULL};

static const char *const unsupported_kw[] = {"not",
                                             "if",
                                             "then",
                                             "else",
                                             "patternProperties",
                                             "propertyNames",
                                             "dependentRequired",
                                             "dependentSchemas",
                                             "dependencies",
                                             "unevaluatedProperties",
                                             "unevaluatedItems",
                                             "minContains",
                                             "maxContains",
                                             "$dynamicRef",
                                             "$recursiveRef",
                                             "$dynamicAnchor",
                                             "$recursiveAnchor",
                                             NULL};

static int is_unsupported(const char *k) {
    for (int i = 0; unsupported_kw[i]; i++)
        if (!strcmp(k, unsupported_kw[i]))
            return 1;
    return 0;
}

static int is_known(const char *k) {
    for (int i = 0; known_assertions[i]; i++)
        if (!strcmp(k, known_assertions[i]))
            return 1;
    return 0;
}

/* Types an "anyOf"/"oneOf" branch can take (for oneOf's disjointness check). */
static int branch_types(sc *c, json_t *s, const char *ptr) {
    s = sc_deref_shallow(c, s, ptr);
    if (!s)
        return -1;
    if (json_is_false(s))
        return 0;
    if (!json_is_object(s))
        return T_ALL;
    int t = sc_type_bits(c, s, ptr);
    if (t < 0)
        return -1;
    json_t *cn = json_object_get(s, "const"), *en = json_object_get(s, "enum");
    if (cn)
        t &= sc_type_bits_of_value(cn);
    else if (json_is_array(en)) {
        int u = 0;
        for (size_t i = 0; i < json_array_size(en); i++)
            u |= sc_type_bits_of_value(json_array_get(en, i));
        t &= u;
    }
    return t;
}

/* Keywords a schema may not carry here: strict refuses them, relaxed notes them. Returns -1
 * when refused. */
static int check_keywords(sc *c, json_t *s, const char *ptr) {
    const char *k;
    json_t *v;
    /* Assertion keywords medley does not enforce: strict refuses, relaxed lists them.
     * Keywords outside JSON Schema's vocabularies (x-*, markdownDescription, example, ...)
     * are annotations by the specification and ignored. */
    json_object_foreach(s, k, v) {
        if (is_known(k) || sc_is_annotation(k) || !is_unsupported(k))
            continue;
        char why[160];
        snprintf(why, sizeof why, "keyword '%.60s' is not supported", k);
        if (sc_unsupp(c, k, ptr, why))
            return -1;
    }
    if (json_object_get(s, "$id") && *ptr && strcmp(ptr, "/")) {
        if (sc_unsupp(c, "$id", ptr, "'$id' below the root (a new base URI) is not supported"))
            return -1;
    }
    json_t *meta = json_object_get(s, "$schema");
    if (meta) {
        static const char *const known[] = {"https://json-schema.org/draft/2020-12/schema",
                                            "https://json-schema.org/draft/2019-09/schema",
                                            "http://json-schema.org/draft-07/schema#",
                                            "http://json-schema.org/draft-07/schema",
                                            "http://json-schema.org/draft-06/schema#",
                                            "http://json-schema.org/draft-04/schema#",
                                            NULL};
        int ok = 0;
        for (int i = 0; known[i] && json_is_string(meta); i++)
            ok |= !strcmp(known[i], json_string_value(meta));
        if (!ok && sc_unsupp(c, "$schema", ptr,
                             "only the published JSON Schema metaschemas are supported"))
            return -1;
    }
    return 0;
}

/* A "$ref": the shared rule of its target, or, beside assertions, the conjunction. */
static int ref_part(sc *c, json_t *s, const char *ptr, json_t *ref) {
    gr_builder *b = &c->b;
    int x = -1;
    const char *k;
    json_t *v;
    if (!json_is_string(ref)) {
        x = sc_fail(c, MD_EINVAL, "$ref", ptr, "expected a string");
        return x;
    }
    int siblings = 0;
    json_object_foreach(s, k, v) {
        if (strcmp(k, "$ref") && is_known(k))
            siblings = 1;
    }
    if (!siblings) {
        char *pp = sc_ptr_join(ptr, "$ref");
        x = pp ? sc_ref(c, json_string_value(ref), pp) : gb_fail(b, MD_ENOMEM, "oom");
        free(pp);
        return x;
    }
    /* $ref beside assertions: the conjunction, merged as allOf. */
    json_t *m = json_object();
    json_t *rest = json_copy(s);
    json_object_del(rest, "$ref");
    json_t *refonly = json_pack("{s:O}", "$ref", ref);
    json_t *all = json_pack("[oo]", refonly, rest);
    json_object_set_new(m, "allOf", all);
    x = sc_schema(c, m, ptr);
    json_decref(m);
    return x;
}

/* "allOf": the branches merged into one schema, then compiled. */
static int allof_part(sc *c, json_t *s, const char *ptr, json_t *allof) {
    gr_builder *b = &c->b;
    int x = -1;
    if (!json_is_array(allof) || !json_array_size(allof)) {
        x = sc_fail(c, MD_EINVAL, "allOf", ptr, "expected a non-empty array");
        return x;
    }
    json_t *m = json_copy(s);
    json_object_del(m, "allOf");
    char *pp = sc_ptr_join(ptr, "allOf");
    int rc = 0;
    for (size_t i = 0; i < json_array_size(allof) && !rc; i++)
        rc = sc_merge_into(c, m, json_array_get(allof, i), pp ? pp : "");
    free(pp);
    if (rc || b->failed) {
        json_decref(m);
        x = -1;
        return x;
    }
    if (json_object_get(m, "not")) {
        json_decref(m);
        x = gb_none(b);
        return x;
    }
    x = sc_schema(c, m, ptr);
    json_decref(m);
    return x;
}

/* "anyOf" / "oneOf": the alternatives, each merged with the sibling assertions. */
static int comb_part(sc *c, json_t *s, const char *ptr, const char *comb) {
    gr_builder *b = &c->b;
    int x = -1;
    const char *k;
    json_t *v;
    json_t *arr = json_object_get(s, comb);
    if (!json_is_array(arr) || !json_array_size(arr)) {
        x = sc_fail(c, MD_EINVAL, comb, ptr, "expected a non-empty array");
        return x;
    }
    if (json_object_get(s, "anyOf") && json_object_get(s, "oneOf")) {
        x = sc_fail(c, MD_EUNSUPP, "oneOf", ptr, "'anyOf' and 'oneOf' together");
        return x;
    }
    char *pp = sc_ptr_join(ptr, comb);
    if (!strcmp(comb, "oneOf")) {
        /* Exact only when no instance can match two branches: require disjoint types. */
        int seen = 0, overlap = 0;
        for (size_t i = 0; i < json_array_size(arr); i++) {
            int t = branch_types(c, json_array_get(arr, i), ptr);
            if (t < 0) {
                free(pp);
                return x;
            }
            if (t & T_NUMBER)
                t |= T_INTEGER;
            if (seen & t)
                overlap = 1;
            seen |= t;
        }
        if (overlap && sc_unsupp(c, "oneOf", ptr,
                                 "'oneOf' branches that can match the same value are not "
                                 "supported (use anyOf, or disjoint types)")) {
            free(pp);
            return x;
        }
    }
    json_t *sib = json_copy(s);
    json_object_del(sib, comb);
    int has_sib = 0;
    json_object_foreach(sib, k, v) {
        if (is_known(k))
            has_sib = 1;
    }
    x = gb_none(b);
    for (size_t i = 0; i < json_array_size(arr) && x >= 0; i++) {
        char *bp = sc_ptr_idx(ptr, comb, i);
        int y;
        if (has_sib) {
            json_t *m = json_copy(sib);
            y = sc_merge_into(c, m, json_array_get(arr, i), bp ? bp : "") ? -1
                                                                          : sc_schema(c, m, bp);
            json_decref(m);
        } else
            y = sc_schema(c, json_array_get(arr, i), bp ? bp : "");
        free(bp);
        x = gb_alt(b, x, y);
    }
    json_decref(sib);
    free(pp);
    return x;
}

/* The rest: enum/const, or the alternatives of the allowed types. */
static int typed_part(sc *c, json_t *s, const char *ptr) {
    gr_builder *b = &c->b;
    int x = -1;
    const char *k;
    json_t *v;
    if (json_object_get(s, "not")) {
        if (sc_unsupp(c, "not", ptr, "'not' is not supported"))
            return x;
    }
    int types = sc_type_bits(c, s, ptr);
    if (types < 0)
        return x;
    if (json_object_get(s, "enum") || json_object_get(s, "const")) {
        json_object_foreach(s, k, v) {
            if (is_known(k) && strcmp(k, "enum") && strcmp(k, "const") && strcmp(k, "type")) {
                char why[160];
                snprintf(why, sizeof why, "'%s' beside 'enum'/'const' is not supported", k);
                if (sc_unsupp(c, k, ptr, why))
                    return x;
            }
        }
        x = sc_enum_part(c, s, ptr, types);
        return x;
    }
    x = gb_none(b);
    if (types & T_NULL)
        x = gb_alt(b, x, gb_str(b, "null"));
    if (types & T_BOOL)
        x = gb_alt(b, x, gb_alt(b, gb_str(b, "true"), gb_str(b, "false")));
    if (types & T_STRING)
        x = gb_alt(b, x, sc_string_part(c, s, ptr));
    if (types & T_NUMBER)
        x = gb_alt(b, x, sc_numeric_part(c, s, ptr, 0));
    else if (types & T_INTEGER)
        x = gb_alt(b, x, sc_numeric_part(c, s, ptr, 1));
    if (types & T_OBJECT) {
        int r = gb_rule_new(b, "obj");
        int y = sc_object_part(c, s, ptr);
        gb_rule_set(b, r, y);
        x = gb_alt(b, x, y < 0 ? -1 : gb_ref(b, r));
    }
    if (types & T_ARRAY) {
        int r = gb_rule_new(b, "arr");
        int y = sc_array_part(c, s, ptr);
        gb_rule_set(b, r, y);
        x = gb_alt(b, x, y < 0 ? -1 : gb_ref(b, r));
    }
    return x;
}

int sc_schema(sc *c, json_t *s, const char *ptr) {
    gr_builder *b = &c->b;
    if (b->failed)
        return -1;
    if (json_is_true(s))
        return sc_value_expr(c);
    if (json_is_false(s))
        return gb_none(b);
    if (!json_is_object(s))
        return sc_fail(c, MD_EINVAL, "schema", ptr, "expected an object or a boolean");
    if (++c->depth > SC_MAX_DEPTH) {
        c->depth--;
        return sc_fail(c, MD_EUNSUPP, "schema", ptr, "subschemas nest deeper than %d",
                       SC_MAX_DEPTH);
    }
    int x = -1;
    json_t *ref = json_object_get(s, "$ref"), *allof = json_object_get(s, "allOf");
    const char *comb = json_object_get(s, "anyOf")   ? "anyOf"
                       : json_object_get(s, "oneOf") ? "oneOf"
                                                     : NULL;
    if (check_keywords(c, s, ptr))
        x = -1;
    else if (ref)
        x = ref_part(c, s, ptr, ref);
    else if (allof)
        x = allof_part(c, s, ptr, allof);
    else if (comb)
        x = comb_part(c, s, ptr, comb);
    else
        x = typed_part(c, s, ptr);
    c->depth--;
    return b->failed ? -1 : x;
}

static void sc_free(sc *c) {
    for (int i = 0; i < c->nrefs; i++)
        free(c->refs[i].ptr);
    free(c->refs);
    for (int i = 0; i < c->nstr; i++)
        free(c->strs[i].ptr);
    free(c->strs);
    gb_free(&c->b);
}

/* Markup text of a frame (grammar.h gr_frame): its bytes, each space standing for 0 to 8 of
 * space, tab and newline. */
static int frame_lit(gr_builder *b, const char *s) {
    int x = gb_empty(b);
    if (!s)
        return x;
    gr_cls ws;
    memset(&ws, 0, sizeof ws);
    gr_cls_set(&ws, ' ');
    gr_cls_set(&ws, '\t');
    gr_cls_set(&ws, '\n');
    for (; *s; s++)
        x = gb_seq(b, x, *s == ' ' ? gb_rep(b, gb_cls(b, &ws), 0, 8)
                                   : gb_byte(b, (unsigned char)*s));
    return x;
}

/* root: the schema's sentence x alone, or framed: prefix, item (sep item){0, max - 1},
 * suffix, where item is item_open x item_close. */
static int frame_root(gr_builder *b, int x, const gr_frame *f) {
    if (!f)
        return x;
    int item = gb_rule_new(b, "item");
    gb_rule_set(b, item, gb_seq3(b, frame_lit(b, f->item_open), x, frame_lit(b, f->item_close)));
    int max = f->max_items > 0 ? f->max_items : 1;
    int more = gb_rep(b, gb_seq(b, frame_lit(b, f->sep), gb_ref(b, item)), 0, max - 1);
    return gb_seq3(b, frame_lit(b, f->prefix), gb_seq(b, gb_ref(b, item), more),
                   frame_lit(b, f->suffix));
}

static int from_schema(const char *schema, size_t len, int strict, const gr_frame *f,
                       gr_grammar **out, char *relaxed, size_t relaxedsz, md_err *e) {
    *out = NULL;
    if (relaxed && relaxedsz)
        relaxed[0] = 0;
    if (!schema)
        return md_errf(e, MD_EINVAL, "no schema given");
    if (len > SC_MAX_TEXT)
        return md_errf(e, MD_ERANGE, "schema is %zu bytes, over the %u-byte limit", len,
                       SC_MAX_TEXT);
    json_error_t je;
    json_t *doc =
        json_loadb(schema, len, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &je);
    if (!doc)
        return md_errf(e, MD_EINVAL, "schema is not valid JSON: %s at line %d column %d", je.text,
                       je.line, je.column);
    sc c;
    memset(&c, 0, sizeof c);
    gb_init(&c.b, e);
    c.doc = doc;
    c.strict = strict;
    c.relaxed = relaxed;
    c.relaxedsz = relaxedsz;
    c.r_value = c.r_string = c.r_number = -1;
    int root = gb_rule(&c.b, "root");
    int x = sc_schema(&c, doc, "");
    gb_rule_set(&c.b, root, frame_root(&c.b, x, f));
    int rc = c.b.failed ? (e && e->code ? e->code : MD_EINVAL) : gb_finish(&c.b, root, out, e);
    sc_free(&c);
    json_decref(doc);
    return rc;
}

int gr_from_json_schema(const char *schema, size_t len, int strict, gr_grammar **out, char *relaxed,
                        size_t relaxedsz, md_err *e) {
    return from_schema(schema, len, strict, NULL, out, relaxed, relaxedsz, e);
}

int gr_from_json_schema_framed(const char *schema, size_t len, int strict, const gr_frame *f,
                               gr_grammar **out, char *relaxed, size_t relaxedsz, md_err *e) {
    if (!f) {
        *out = NULL;
        return md_errf(e, MD_EINVAL, "no frame given");
    }
    return from_schema(schema, len, strict, f, out, relaxed, relaxedsz, e);
}

int gr_from_json_object(gr_grammar **out, md_err *e) {
    return gr_from_json_schema("{\"type\":\"object\"}", 17, 1, out, NULL, 0, e);
}
