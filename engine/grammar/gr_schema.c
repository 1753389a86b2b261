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

#include "engine/grammar/grammar.h"
#include "engine/grammar/grammar_int.h"

#define SC_MAX_TEXT (4u << 20) /* bytes of schema text */
#define SC_MAX_DEPTH 64        /* nested subschemas */
#define SC_MAX_ENUM 100000
#define SC_MAX_LEN 10000 /* minLength / maxLength / minItems / maxItems we expand */

typedef struct {
    char *ptr;
    int rule;
} sc_refent;

typedef struct {
    gr_builder b;
    json_t *doc;
    int strict;
    char *relaxed;
    size_t relaxedsz, rlen;
    sc_refent *refs;
    int nrefs, crefs;
    sc_refent *strs; /* string constraints (canonical JSON of their keywords) -> rule */
    int nstr, cstr;
    int depth;
    int r_value, r_string, r_number; /* shared rules, -1 until first used */
} sc;

enum {
    T_NULL = 1,
    T_BOOL = 2,
    T_OBJECT = 4,
    T_ARRAY = 8,
    T_NUMBER = 16,
    T_STRING = 32,
    T_INTEGER = 64,
    T_ALL = 127
};

/* ---- growable text ----------------------------------------------------------------------- */

typedef struct {
    char *p;
    size_t n, c;
    int oom;
} sbuf;

static void sb_put(sbuf *s, const char *x, size_t n) {
    if (s->oom)
        return;
    if (s->n + n + 1 > s->c) {
        size_t nc = s->c ? s->c * 2 : 64;
        while (nc < s->n + n + 1)
            nc *= 2;
        char *q = realloc(s->p, nc);
        if (!q) {
            s->oom = 1;
            return;
        }
        s->p = q;
        s->c = nc;
    }
    memcpy(s->p + s->n, x, n);
    s->n += n;
    s->p[s->n] = 0;
}

static void sb_puts(sbuf *s, const char *x) {
    sb_put(s, x, strlen(x));
}

static void sb_json_str(sbuf *s, const char *x, size_t n) {
    sb_put(s, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)x[i];
        char esc[8];
        switch (c) {
        case '"': sb_put(s, "\\\"", 2); break;
        case '\\': sb_put(s, "\\\\", 2); break;
        case '\n': sb_put(s, "\\n", 2); break;
        case '\r': sb_put(s, "\\r", 2); break;
        case '\t': sb_put(s, "\\t", 2); break;
        case '\b': sb_put(s, "\\b", 2); break;
        case '\f': sb_put(s, "\\f", 2); break;
        default:
            if (c < 0x20) {
                snprintf(esc, sizeof esc, "\\u%04x", c);
                sb_put(s, esc, 6);
            } else
                sb_put(s, (const char *)&c, 1);
        }
    }
    sb_put(s, "\"", 1);
}

static void sb_real(sbuf *s, double v) {
    char buf[64];
    if (v == floor(v) && fabs(v) < 9.2e18) {
        snprintf(buf, sizeof buf, "%.0f", v);
        if (!strcmp(buf, "-0"))
            strcpy(buf, "0");
    } else {
        for (int p = 1; p <= 17; p++) {
            snprintf(buf, sizeof buf, "%.*g", p, v);
            if (strtod(buf, NULL) == v)
                break;
        }
    }
    sb_puts(s, buf);
}

/* The canonical compact serialization (the policy above) of a JSON value. */
static void sb_json(sbuf *s, const json_t *v, int depth) {
    if (depth > 1000) {
        s->oom = 1;
        return;
    }
    char buf[32];
    switch (json_typeof(v)) {
    case JSON_NULL: sb_puts(s, "null"); break;
    case JSON_TRUE: sb_puts(s, "true"); break;
    case JSON_FALSE: sb_puts(s, "false"); break;
    case JSON_INTEGER:
        snprintf(buf, sizeof buf, "%lld", (long long)json_integer_value(v));
        sb_puts(s, buf);
        break;
    case JSON_REAL: sb_real(s, json_real_value(v)); break;
    case JSON_STRING: sb_json_str(s, json_string_value(v), json_string_length(v)); break;
    case JSON_ARRAY: {
        sb_put(s, "[", 1);
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (i)
                sb_put(s, ",", 1);
            sb_json(s, json_array_get(v, i), depth + 1);
        }
        sb_put(s, "]", 1);
        break;
    }
    case JSON_OBJECT: {
        sb_put(s, "{", 1);
        const char *k;
        json_t *x;
        int first = 1;
        json_object_foreach((json_t *)v, k, x) {
            if (!first)
                sb_put(s, ",", 1);
            first = 0;
            sb_json_str(s, k, strlen(k));
            sb_put(s, ":", 1);
            sb_json(s, x, depth + 1);
        }
        sb_put(s, "}", 1);
        break;
    }
    }
}

/* ---- errors and relaxed keywords ---------------------------------------------------------- */

static int sc_fail(sc *c, int code, const char *kw, const char *ptr, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static int sc_fail(sc *c, int code, const char *kw, const char *ptr, const char *fmt, ...) {
    char why[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    return gb_fail(&c->b, code, "'%s' at %s: %s", kw, *ptr ? ptr : "/", why);
}

/* An unsupported keyword: an error under strict, else noted in relaxed. Returns 0 when
 * relaxed (go on without it), -1 when failed. */
static int sc_unsupp(sc *c, const char *kw, const char *ptr, const char *why) {
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
static char *ptr_join(const char *ptr, const char *key) {
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

static char *ptr_idx(const char *ptr, const char *key, size_t i) {
    char num[32];
    snprintf(num, sizeof num, "%zu", i);
    char *a = ptr_join(ptr, key);
    if (!a)
        return NULL;
    char *r = ptr_join(a, num);
    free(a);
    return r;
}

/* ---- shared scalar grammars ----------------------------------------------------------------- */

/* One character of a JSON string: unescaped UTF-8 other than `"`, `\` and controls, or any
 * escape JSON allows. */
static int json_char(gr_builder *b) {
    gr_cls ex = {{0}};
    for (unsigned i = 0; i < 0x20; i++)
        gr_cls_set(&ex, i);
    gr_cls_set(&ex, '"');
    gr_cls_set(&ex, '\\');
    int raw = gb_utf8_char(b, &ex);
    gr_cls hx = {{0}};
    for (unsigned i = 0; i < 256; i++)
        if ((i >= '0' && i <= '9') || (i >= 'a' && i <= 'f') || (i >= 'A' && i <= 'F'))
            gr_cls_set(&hx, i);
    int h = gb_cls(b, &hx);
    gr_cls se = {{0}};
    for (const char *p = "\"\\/bfnrt"; *p; p++)
        gr_cls_set(&se, (unsigned char)*p);
    int esc = gb_seq(b, gb_byte(b, '\\'),
                     gb_alt(b, gb_cls(b, &se), gb_seq(b, gb_byte(b, 'u'), gb_rep(b, h, 4, 4))));
    return gb_alt(b, raw, esc);
}

static int string_expr(sc *c, int lo, int hi) {
    gr_builder *b = &c->b;
    if (lo == 0 && hi < 0) {
        if (c->r_string < 0) {
            c->r_string = gb_rule(b, "string");
            gb_rule_set(
                b, c->r_string,
                gb_seq3(b, gb_byte(b, '"'), gb_rep(b, json_char(b), 0, -1), gb_byte(b, '"')));
        }
        return gb_ref(b, c->r_string);
    }
    return gb_seq3(b, gb_byte(b, '"'), gb_rep(b, json_char(b), lo, hi), gb_byte(b, '"'));
}

static int digits(gr_builder *b, int lo, int hi) {
    return gb_rep(b, gb_range(b, '0', '9'), lo, hi);
}

/* -?(0|[1-9][0-9]*) */
static int integer_expr(gr_builder *b) {
    return gb_seq(b, gb_opt(b, gb_byte(b, '-')),
                  gb_alt(b, gb_byte(b, '0'), gb_seq(b, gb_range(b, '1', '9'), digits(b, 0, -1))));
}

static int number_expr(sc *c) {
    gr_builder *b = &c->b;
    if (c->r_number < 0) {
        c->r_number = gb_rule(b, "number");
        int frac = gb_opt(b, gb_seq(b, gb_byte(b, '.'), digits(b, 1, -1)));
        int ex = gb_opt(b, gb_seq3(b, gb_alt(b, gb_byte(b, 'e'), gb_byte(b, 'E')),
                                   gb_opt(b, gb_alt(b, gb_byte(b, '+'), gb_byte(b, '-'))),
                                   digits(b, 1, -1)));
        gb_rule_set(b, c->r_number, gb_seq3(b, integer_expr(b), frac, ex));
    }
    return gb_ref(b, c->r_number);
}

/* Any JSON value, compact. */
static int value_expr(sc *c) {
    gr_builder *b = &c->b;
    if (c->r_value < 0) {
        c->r_value = gb_rule(b, "value");
        int robj = gb_rule(b, "object");
        int rarr = gb_rule(b, "array");
        int v = gb_ref(b, c->r_value);
        int kv = gb_seq3(b, string_expr(c, 0, -1), gb_byte(b, ':'), v);
        gb_rule_set(
            b, robj,
            gb_seq3(b, gb_byte(b, '{'),
                    gb_opt(b, gb_seq(b, kv, gb_rep(b, gb_seq(b, gb_byte(b, ','), kv), 0, -1))),
                    gb_byte(b, '}')));
        gb_rule_set(
            b, rarr,
            gb_seq3(b, gb_byte(b, '['),
                    gb_opt(b, gb_seq(b, v, gb_rep(b, gb_seq(b, gb_byte(b, ','), v), 0, -1))),
                    gb_byte(b, ']')));
        int x = gb_alt(b, gb_ref(b, robj), gb_ref(b, rarr));
        x = gb_alt(b, x, string_expr(c, 0, -1));
        x = gb_alt(b, x, number_expr(c));
        x = gb_alt(b, x, gb_str(b, "true"));
        x = gb_alt(b, x, gb_str(b, "false"));
        x = gb_alt(b, x, gb_str(b, "null"));
        gb_rule_set(b, c->r_value, x);
    }
    return gb_ref(b, c->r_value);
}

/* ---- integer ranges ---------------------------------------------------------------------- */

/* Decimal strings of the same length n, lo <= x <= hi digit-wise (a, z: digit strings). */
static int range_same_len(gr_builder *b, const char *a, const char *z, int n) {
    if (n == 0)
        return gb_empty(b);
    int full = 1;
    for (int i = 0; i < n && full; i++)
        full = a[i] == '0' && z[i] == '9';
    if (full)
        return digits(b, n, n);
    if (a[0] == z[0])
        return gb_seq(b, gb_byte(b, (unsigned char)a[0]), range_same_len(b, a + 1, z + 1, n - 1));
    /* a0 a' .. a0 999 | (a0+1 .. z0-1) any | z0 000 .. z0 z' */
    char nines[24], zeros[24];
    memset(nines, '9', (size_t)n);
    memset(zeros, '0', (size_t)n);
    int x = gb_seq(b, gb_byte(b, (unsigned char)a[0]), range_same_len(b, a + 1, nines, n - 1));
    if (z[0] - a[0] > 1)
        x = gb_alt(b, x,
                   gb_seq(b, gb_range(b, (unsigned char)(a[0] + 1), (unsigned char)(z[0] - 1)),
                          digits(b, n - 1, n - 1)));
    return gb_alt(
        b, x, gb_seq(b, gb_byte(b, (unsigned char)z[0]), range_same_len(b, zeros, z + 1, n - 1)));
}

/* Non-negative integers in [lo, hi] written without leading zeros; hi < 0: unbounded. */
static int range_nonneg(gr_builder *b, long long lo, long long hi) {
    char a[24], z[24];
    int x = gb_none(b);
    int la = snprintf(a, sizeof a, "%lld", lo);
    int lz = hi < 0 ? 19 : snprintf(z, sizeof z, "%lld", hi);
    for (int n = la; n <= lz; n++) {
        char lo_s[24], hi_s[24];
        if (n == la)
            memcpy(lo_s, a, (size_t)n + 1);
        else {
            lo_s[0] = '1';
            memset(lo_s + 1, '0', (size_t)n - 1);
        }
        if (hi >= 0 && n == lz)
            memcpy(hi_s, z, (size_t)n + 1);
        else
            memset(hi_s, '9', (size_t)n);
        x = gb_alt(b, x, range_same_len(b, lo_s, hi_s, n));
    }
    if (hi < 0) /* more digits than any int64: unbounded above */
        x = gb_alt(b, x, gb_seq(b, gb_range(b, '1', '9'), digits(b, 19, -1)));
    return x;
}

/* Integers in [lo, hi]; has_lo/has_hi say whether each bound exists. */
static int int_range_expr(gr_builder *b, int has_lo, long long lo, int has_hi, long long hi) {
    if (has_lo && has_hi && lo > hi)
        return gb_none(b);
    int x = gb_none(b);
    /* non-negative part */
    if (!has_hi || hi >= 0)
        x = gb_alt(b, x, range_nonneg(b, has_lo && lo > 0 ? lo : 0, has_hi ? hi : -1));
    /* negative part: -m with m in [max(1,-hi), -lo] */
    if (!has_lo || lo < 0) {
        long long mlo = has_hi && hi < 0 ? -hi : 1;
        long long mhi = has_lo ? -lo : -1;
        x = gb_alt(b, x, gb_seq(b, gb_byte(b, '-'), range_nonneg(b, mlo, mhi)));
    }
    return x;
}

/* ---- schema walking ---------------------------------------------------------------------- */

static int sc_schema(sc *c, json_t *s, const char *ptr);

static const char *const annotations[] = {
    "title",       "description",      "$comment",        "examples",      "default",
    "$schema",     "deprecated",       "readOnly",        "writeOnly",     "$defs",
    "definitions", "contentMediaType", "contentEncoding", "contentSchema", "$vocabulary",
    "$id",         "$anchor",          "$dynamicAnchor",  "name",          "strict",
    NULL};

static int is_annotation(const char *k) {
    for (int i = 0; annotations[i]; i++)
        if (!strcmp(k, annotations[i]))
            return 1;
    return 0;
}

static int type_bits_of_value(const json_t *v) {
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
static int type_bits(sc *c, json_t *s, const char *ptr) {
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

/* ---- allOf: merge into one schema where the keywords allow it ---------------------------------
 */

static int merge_into(sc *c, json_t *dst, json_t *src, const char *ptr);

static json_t *deref_shallow(sc *c, json_t *s, const char *ptr) {
    /* A subschema that is only a $ref (plus annotations) is merged as its target. */
    for (int hops = 0; hops < 32 && json_is_object(s); hops++) {
        json_t *r = json_object_get(s, "$ref");
        if (!json_is_string(r))
            return s;
        const char *k;
        json_t *v;
        json_object_foreach(s, k, v) {
            if (strcmp(k, "$ref") && !is_annotation(k))
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

static int merge_into(sc *c, json_t *dst, json_t *src, const char *ptr) {
    src = deref_shallow(c, src, ptr);
    if (!src)
        return -1;
    if (json_is_true(src))
        return 0;
    if (json_is_false(src))
        return json_object_set_new(dst, "not", json_object()) ? -1 : 0;
    if (!json_is_object(src))
        return sc_fail(c, MD_EINVAL, "allOf", ptr, "a subschema must be an object or a boolean");
    /* additionalProperties only sees its own schema's properties: merging is exact only
     * when the other side names no property it lacks. */
    for (int side = 0; side < 2; side++) {
        json_t *x = side ? src : dst, *y = side ? dst : src;
        json_t *ap = json_object_get(x, "additionalProperties");
        if (!ap || json_is_true(ap))
            continue;
        json_t *px = json_object_get(x, "properties"), *py = json_object_get(y, "properties");
        const char *pk;
        json_t *pv;
        json_object_foreach(py, pk, pv) {
            if (!json_object_get(px, pk))
                return sc_fail(c, MD_EUNSUPP, "allOf", ptr,
                               "cannot merge 'additionalProperties' with properties of another "
                               "subschema ('%s')",
                               pk);
        }
    }
    /* items only applies after its own schema's prefixItems: the same rule. */
    for (int side = 0; side < 2; side++) {
        json_t *x = side ? src : dst, *y = side ? dst : src;
        json_t *it = json_object_get(x, "items");
        json_t *py = json_object_get(y, "prefixItems");
        if (it && !json_is_true(it) && py && !json_equal(py, json_object_get(x, "prefixItems")))
            return sc_fail(c, MD_EUNSUPP, "allOf", ptr,
                           "cannot merge 'items' with 'prefixItems' of another subschema");
    }
    const char *k;
    json_t *v;
    json_object_foreach(src, k, v) {
        if (is_annotation(k))
            continue;
        json_t *old = json_object_get(dst, k);
        if (!strcmp(k, "allOf")) {
            for (size_t i = 0; i < json_array_size(v); i++)
                if (merge_into(c, dst, json_array_get(v, i), ptr))
                    return -1;
            continue;
        }
        if (!old) {
            json_object_set(dst, k, v);
            continue;
        }
        if (json_equal(old, v))
            continue;
        if (!strcmp(k, "properties") && json_is_object(old) && json_is_object(v)) {
            json_t *np = json_deep_copy(old);
            const char *pk;
            json_t *pv;
            json_object_foreach(v, pk, pv) {
                json_t *o = json_object_get(np, pk);
                if (!o)
                    json_object_set(np, pk, pv);
                else {
                    json_t *both = json_pack("{s:[OO]}", "allOf", o, pv);
                    json_object_set_new(np, pk, both);
                }
            }
            json_object_set_new(dst, k, np);
        } else if (!strcmp(k, "required") && json_is_array(old) && json_is_array(v)) {
            json_t *nr = json_copy(old);
            for (size_t i = 0; i < json_array_size(v); i++) {
                int have = 0;
                for (size_t j = 0; j < json_array_size(old); j++)
                    have |= json_equal(json_array_get(old, j), json_array_get(v, i));
                if (!have)
                    json_array_append(nr, json_array_get(v, i));
            }
            json_object_set_new(dst, k, nr);
        } else if (!strcmp(k, "minimum") || !strcmp(k, "exclusiveMinimum") ||
                   !strcmp(k, "minLength") || !strcmp(k, "minItems") ||
                   !strcmp(k, "minProperties")) {
            if (json_is_number(old) && json_is_number(v) &&
                json_number_value(v) > json_number_value(old))
                json_object_set(dst, k, v);
        } else if (!strcmp(k, "maximum") || !strcmp(k, "exclusiveMaximum") ||
                   !strcmp(k, "maxLength") || !strcmp(k, "maxItems") ||
                   !strcmp(k, "maxProperties")) {
            if (json_is_number(old) && json_is_number(v) &&
                json_number_value(v) < json_number_value(old))
                json_object_set(dst, k, v);
        } else if (!strcmp(k, "type")) {
            json_t *tmp = json_object();
            json_object_set(tmp, "type", old);
            int a = type_bits(c, tmp, ptr);
            json_object_set(tmp, "type", v);
            int bb = type_bits(c, tmp, ptr);
            json_decref(tmp);
            if (a < 0 || bb < 0)
                return -1;
            int m = a & bb;
            if ((a & T_NUMBER) && !(bb & T_NUMBER) && (bb & T_INTEGER))
                m |= T_INTEGER;
            static const char *const names[] = {"null",   "boolean", "object", "array",
                                                "number", "string",  "integer"};
            json_t *arr = json_array();
            for (int i = 0; i < 7; i++)
                if ((m & (1 << i)) && !(i == 6 && (m & T_NUMBER)))
                    json_array_append_new(arr, json_string(names[i]));
            json_object_set_new(dst, k, arr);
        } else if (!strcmp(k, "additionalProperties") && (json_is_false(old) || json_is_false(v))) {
            /* false with other properties would differ; only when properties agree */
            if (json_object_get(dst, "properties") || json_object_get(src, "properties"))
                return sc_fail(c, MD_EUNSUPP, "allOf", ptr,
                               "cannot merge 'additionalProperties' across subschemas");
            json_object_set_new(dst, k, json_false());
        } else
            return sc_fail(c, MD_EUNSUPP, "allOf", ptr,
                           "cannot merge two different '%s' into one schema", k);
    }
    return 0;
}

/* ---- type parts -------------------------------------------------------------------------- */

static int get_count(sc *c, json_t *s, const char *kw, const char *ptr, int *out) {
    json_t *v = json_object_get(s, kw);
    if (!v)
        return 0;
    double d = json_number_value(v);
    if (!json_is_number(v) || d < 0 || d != floor(d))
        return sc_fail(c, MD_EINVAL, kw, ptr, "expected a non-negative integer");
    if (d > SC_MAX_LEN) {
        if (!strncmp(kw, "max", 3))
            return 0; /* a larger maximum is as good as none */
        return sc_fail(c, MD_EUNSUPP, kw, ptr, "values above %d are not supported", SC_MAX_LEN);
    }
    *out = (int)d;
    return 1;
}

static const struct {
    const char *name, *re;
} formats[] = {
    {"date", "^[0-9]{4}-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|"
             "30)|02-(0[1-9]|1[0-9]|2[0-9]))$"},
    {"time", "^([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)(\\.[0-9]{1,9})?(Z|[+-]([01][0-9]|2[0-"
             "3]):[0-5][0-9])$"},
    {"date-time", "^[0-9]{4}-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-"
                  "9]|30)|02-(0[1-9]|1[0-9]|2[0-9]))T([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)("
                  "\\.[0-9]{1,9})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$"},
    {"email", "^[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(\\.[A-Za-z0-9!#$%&'*+/"
              "=?^_`{|}~-]+)*@[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\\.[A-Za-z0-9]([A-Za-z0-"
              "9-]{0,61}[A-Za-z0-9])?)+$"},
    {"uuid", "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"},
    {"ipv4", "^((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\\.){3}(25[0-5]|2[0-4][0-9]|1[0-9][0-"
             "9]|[1-9]?[0-9])$"},
    {"uri", "^[A-Za-z][A-Za-z0-9+.-]*:[!#-;=?-\\[\\]_a-z~]+$"},
    {"hostname", "^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-"
                 "Za-z0-9])?)*$"},
    {NULL, NULL},
};

static int string_part_expr(sc *c, json_t *s, const char *ptr);

/* Strings with the same length bounds, format and pattern share one rule: large schemas
 * repeat them (maxLength 255 on every field), and a shared rule is one set of cache entries. */
static int string_part(sc *c, json_t *s, const char *ptr) {
    gr_builder *b = &c->b;
    json_t *key = json_object();
    const char *kws[] = {"minLength", "maxLength", "pattern", "format"};
    for (int i = 0; i < 4; i++)
        if (json_object_get(s, kws[i]))
            json_object_set(key, kws[i], json_object_get(s, kws[i]));
    if (!json_object_size(key)) {
        json_decref(key);
        return string_expr(c, 0, -1);
    }
    char *text = json_dumps(key, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(key);
    if (!text)
        return gb_fail(b, MD_ENOMEM, "out of memory compiling a schema");
    for (int i = 0; i < c->nstr; i++)
        if (!strcmp(c->strs[i].ptr, text)) {
            free(text);
            return gb_ref(b, c->strs[i].rule);
        }
    size_t rl = c->rlen;
    int x = string_part_expr(c, s, ptr);
    if (x < 0 || c->rlen != rl) { /* relaxed something here: keep it local (messages) */
        free(text);
        return x;
    }
    if (c->nstr == c->cstr) {
        int nc = c->cstr ? c->cstr * 2 : 16;
        sc_refent *q = realloc(c->strs, sizeof *q * (size_t)nc);
        if (!q) {
            free(text);
            return gb_fail(b, MD_ENOMEM, "out of memory compiling a schema");
        }
        c->strs = q;
        c->cstr = nc;
    }
    int r = gb_rule_new(b, "str");
    gb_rule_set(b, r, x);
    c->strs[c->nstr].ptr = text;
    c->strs[c->nstr++].rule = r;
    return gb_ref(b, r);
}

static int string_part_expr(sc *c, json_t *s, const char *ptr) {
    gr_builder *b = &c->b;
    int lo = 0, hi = -1;
    if (get_count(c, s, "minLength", ptr, &lo) < 0 || get_count(c, s, "maxLength", ptr, &hi) < 0)
        return -1;
    json_t *pat = json_object_get(s, "pattern");
    json_t *fmt = json_object_get(s, "format");
    int x = -1;
    if (fmt && !json_is_string(fmt))
        return sc_fail(c, MD_EINVAL, "format", ptr, "expected a string");
    if (fmt) {
        int k;
        for (k = 0; formats[k].name; k++)
            if (!strcmp(formats[k].name, json_string_value(fmt)))
                break;
        if (!formats[k].name) {
            char why[128];
            snprintf(why, sizeof why, "format '%.60s' is not supported", json_string_value(fmt));
            if (sc_unsupp(c, "format", ptr, why))
                return -1;
        } else {
            x = gb_seq3(b, gb_byte(b, '"'),
                        gr_regex_json_expr(b, formats[k].re, strlen(formats[k].re)),
                        gb_byte(b, '"'));
        }
    }
    if (pat) {
        if (!json_is_string(pat))
            return sc_fail(c, MD_EINVAL, "pattern", ptr, "expected a string");
        if (x >= 0) {
            if (sc_unsupp(c, "pattern", ptr, "'pattern' together with 'format' is not supported"))
                return -1;
        } else {
            md_err sub = {0};
            md_err *save = b->e;
            b->e = &sub;
            x = gr_regex_json_expr(b, json_string_value(pat), json_string_length(pat));
            b->e = save;
            if (x < 0) {
                b->failed = 0;
                if (sub.code != MD_EUNSUPP || c->strict)
                    return sc_fail(c, sub.code ? sub.code : MD_EINVAL, "pattern", ptr, "%s",
                                   sub.msg);
                if (sc_unsupp(c, "pattern", ptr, sub.msg))
                    return -1;
                x = -1;
            } else
                x = gb_seq3(b, gb_byte(b, '"'), x, gb_byte(b, '"'));
        }
    }
    if (x >= 0) {
        if ((lo > 0 || hi >= 0) &&
            sc_unsupp(c, lo > 0 ? "minLength" : "maxLength", ptr,
                      "a length bound together with 'pattern' or 'format' is not supported"))
            return -1;
        return x;
    }
    return string_expr(c, lo, hi);
}

static int get_bound(sc *c, json_t *s, const char *kw, const char *ptr, double *out) {
    json_t *v = json_object_get(s, kw);
    if (!v)
        return 0;
    if (!json_is_number(v))
        return sc_fail(c, MD_EINVAL, kw, ptr, "expected a number");
    *out = json_number_value(v);
    return 1;
}

static int number_range(sc *c, const char *ptr, int hmn, double mn, int hmx, double mx, int hemn,
                        double emn, int hemx, double emx);

static int numeric_part(sc *c, json_t *s, const char *ptr, int integer) {
    gr_builder *b = &c->b;
    double mn = 0, mx = 0, emn = 0, emx = 0;
    int hmn = get_bound(c, s, "minimum", ptr, &mn), hmx = get_bound(c, s, "maximum", ptr, &mx);
    int hemn = get_bound(c, s, "exclusiveMinimum", ptr, &emn);
    int hemx = get_bound(c, s, "exclusiveMaximum", ptr, &emx);
    if (hmn < 0 || hmx < 0 || hemn < 0 || hemx < 0)
        return -1;
    if (json_object_get(s, "multipleOf")) {
        json_t *m = json_object_get(s, "multipleOf");
        if (!(integer && json_is_number(m) && json_number_value(m) == 1) &&
            sc_unsupp(c, "multipleOf", ptr, "'multipleOf' is not supported"))
            return -1;
    }
    if (!hmn && !hmx && !hemn && !hemx)
        return integer ? integer_expr(b) : number_expr(c);
    if (!integer)
        return number_range(c, ptr, hmn, mn, hmx, mx, hemn, emn, hemx, emx);
    /* Integer bounds, exact: the tightest of the inclusive and exclusive forms. */
    const double lim = 9.0e18;
    int has_lo = 0, has_hi = 0;
    double lo = -INFINITY, hi = INFINITY;
    if (hmn)
        lo = ceil(mn);
    if (hemn)
        lo = fmax(lo, floor(emn) + 1);
    if (hmx)
        hi = floor(mx);
    if (hemx)
        hi = fmin(hi, ceil(emx) - 1);
    if (lo > -lim)
        has_lo = 1;
    if (hi < lim)
        has_hi = 1;
    if (lo > lim || hi < -lim)
        return gb_none(b);
    return int_range_expr(b, has_lo, has_lo ? (long long)lo : 0, has_hi,
                          has_hi ? (long long)hi : 0);
}

/* ---- number ranges ----------------------------------------------------------------------
 * A bounded number is written without exponent: -?I(.D)? . A bound is split into its
 * integer part I and fraction digits F (shortest round-trip decimal, no trailing zeros), and
 * the fraction digits D are constrained digit by digit while they stay equal to a bound's. */

typedef struct {
    long long I;
    char F[40];
    int flen;
} decb;

/* |v| as I.F; -1 when it does not fit (over 9e18, more than 30 fraction digits). */
static int dec_of(double v, decb *d) {
    v = fabs(v);
    if (v >= 9e18)
        return -1;
    char buf[64];
    for (int p = 1; p <= 17; p++) {
        snprintf(buf, sizeof buf, "%.*e", p - 1, v);
        if (strtod(buf, NULL) == v)
            break;
    }
    /* buf: d.ddddde[+-]xx */
    char digs[40];
    int nd = 0;
    char *e = strchr(buf, 'e');
    int ex = atoi(e + 1);
    for (char *q = buf; q < e; q++)
        if (*q >= '0' && *q <= '9')
            digs[nd++] = *q;
    /* value = 0.digs * 10^(ex+1) */
    int point = ex + 1; /* digits before the decimal point */
    d->I = 0;
    d->flen = 0;
    for (int i = 0; i < point && i < nd; i++)
        d->I = d->I * 10 + (digs[i] - '0');
    for (int i = nd; i < point; i++)
        d->I *= 10;
    for (int i = point; i < nd; i++) {
        if (d->flen >= 30)
            return -1;
        d->F[d->flen++] = i < 0 ? '0' : digs[i];
    }
    if (point < 0) { /* leading zeros after the point */
        int z = -point;
        if (z + nd > 30)
            return -1;
        memmove(d->F + z, digs, (size_t)nd);
        memset(d->F, '0', (size_t)z);
        d->flen = z + nd;
    }
    while (d->flen > 0 && d->F[d->flen - 1] == '0')
        d->flen--;
    return 0;
}

/* Fraction digits from position i on that keep the value within the bounds still tight:
 * lo (a->F, incl ia) while tlo, hi (b->F, incl ib) while thi. `nonempty`: at least one
 * digit must follow (the caller wrote the point). */
static int frac_digits(gr_builder *b, const decb *a, int ia, int tlo, const decb *z, int ib,
                       int thi, int i, int nonempty) {
    int any = digits(b, 0, -1);
    /* May the digits end here? */
    int end_lo = !tlo || (i >= a->flen && ia);
    int end_hi = !thi || i < z->flen || ib;
    int x = gb_none(b);
    if (!nonempty && end_lo && end_hi)
        x = gb_empty(b);
    if (!tlo && !thi)
        return gb_alt(b, x, nonempty ? digits(b, 1, -1) : any);
    if (thi && i >= z->flen) /* only zeros keep the value at the upper bound */
        return end_lo && ib ? gb_alt(b, x, gb_rep(b, gb_byte(b, '0'), nonempty, -1)) : x;
    if (tlo && !thi && i >= a->flen) {
        /* equal to the lower bound so far: more digits only raise it */
        int more = ia ? gb_rep(b, gb_range(b, '0', '9'), nonempty, -1)
                      : gb_seq3(b, digits(b, 0, -1), gb_range(b, '1', '9'), digits(b, 0, -1));
        return gb_alt(b, x, more);
    }
    int lod = tlo && i < a->flen ? a->F[i] : '0';
    int hid = thi ? z->F[i] : '9';
    if (lod > hid)
        return x;
    if (lod == hid)
        return gb_alt(b, x,
                      gb_seq(b, gb_byte(b, (unsigned char)lod),
                             frac_digits(b, a, ia, tlo, z, ib, thi, i + 1, 0)));
    x = gb_alt(
        b, x,
        gb_seq(b, gb_byte(b, (unsigned char)lod), frac_digits(b, a, ia, tlo, z, ib, 0, i + 1, 0)));
    if (hid - lod > 1)
        x = gb_alt(b, x, gb_seq(b, gb_range(b, (unsigned)lod + 1, (unsigned)hid - 1), any));
    return gb_alt(
        b, x,
        gb_seq(b, gb_byte(b, (unsigned char)hid), frac_digits(b, a, ia, 0, z, ib, thi, i + 1, 0)));
}

/* The optional fraction ("" or "." digits) of a number whose integer part equals the
 * bounds' where tlo / thi say. */
static int frac_part(gr_builder *b, const decb *a, int ia, int tlo, const decb *z, int ib,
                     int thi) {
    int none_ok = (!tlo || (a->flen == 0 && ia)) && (!thi || z->flen > 0 || ib);
    int x = none_ok ? gb_empty(b) : gb_none(b);
    return gb_alt(b, x, gb_seq(b, gb_byte(b, '.'), frac_digits(b, a, ia, tlo, z, ib, thi, 0, 1)));
}

/* Magnitudes M (written I(.D)?) with a <= M <= z (strict where ia / iz are 0); no upper
 * bound when z is NULL. */
static int magnitude(gr_builder *b, const decb *a, int ia, const decb *z, int iz) {
    static const decb zero = {0, "", 0};
    if (z && (a->I > z->I))
        return gb_none(b);
    int x = gb_none(b);
    if (z && a->I == z->I)
        return gb_seq(b, range_nonneg(b, a->I, a->I), frac_part(b, a, ia, 1, z, iz, 1));
    x = gb_seq(b, range_nonneg(b, a->I, a->I), frac_part(b, a, ia, 1, &zero, 1, 0));
    long long mid_lo = a->I + 1, mid_hi = z ? z->I - 1 : -1;
    if (!z || mid_hi >= mid_lo)
        x = gb_alt(
            b, x,
            gb_seq(b, range_nonneg(b, mid_lo, mid_hi), frac_part(b, &zero, 1, 0, &zero, 1, 0)));
    if (z)
        x = gb_alt(b, x,
                   gb_seq(b, range_nonneg(b, z->I, z->I), frac_part(b, &zero, 1, 0, z, iz, 1)));
    return x;
}

static int number_range(sc *c, const char *ptr, int hmn, double mn, int hmx, double mx, int hemn,
                        double emn, int hemx, double emx) {
    gr_builder *b = &c->b;
    /* The tightest lower and upper bounds, and whether each is inclusive. */
    int has_lo = 0, has_hi = 0, ilo = 1, ihi = 1;
    double lo = 0, hi = 0;
    if (hmn) {
        has_lo = 1;
        lo = mn;
    }
    if (hemn && (!has_lo || emn >= lo)) {
        has_lo = 1;
        lo = emn;
        ilo = 0;
    }
    if (hmx) {
        has_hi = 1;
        hi = mx;
    }
    if (hemx && (!has_hi || emx <= hi)) {
        has_hi = 1;
        hi = emx;
        ihi = 0;
    }
    decb dl, dh;
    if ((has_lo && dec_of(lo, &dl)) || (has_hi && dec_of(hi, &dh))) {
        const char *kw = has_lo && dec_of(lo, &dl) ? (ilo ? "minimum" : "exclusiveMinimum")
                                                   : (ihi ? "maximum" : "exclusiveMaximum");
        if (sc_unsupp(c, kw, ptr, "number bounds beyond 9e18 or 30 decimals are not supported"))
            return -1;
        return number_expr(c);
    }
    if (has_lo && has_hi && (lo > hi || (lo == hi && !(ilo && ihi))))
        return gb_none(b);
    static const decb zero = {0, "", 0};
    int x = gb_none(b);
    /* x >= 0: M in [max(lo, 0), hi] */
    if (!has_hi || hi >= 0) {
        const decb *a = has_lo && lo >= 0 ? &dl : &zero;
        int ia = has_lo && lo >= 0 ? ilo : 1;
        if (!(has_hi && hi == 0 && !ihi))
            x = gb_alt(b, x, magnitude(b, a, ia, has_hi ? &dh : NULL, ihi));
    }
    /* x < 0: -M with M in [max(-hi, 0), -lo], M > 0 */
    if (!has_lo || lo < 0) {
        const decb *a = has_hi && hi < 0 ? &dh : &zero;
        int ia = has_hi && hi < 0 ? ihi : 0;
        x = gb_alt(b, x, gb_seq(b, gb_byte(b, '-'), magnitude(b, a, ia, has_lo ? &dl : NULL, ilo)));
    }
    return x;
}

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

static int object_part(sc *c, json_t *s, const char *ptr) {
    gr_builder *b = &c->b;
    json_t *props = json_object_get(s, "properties");
    json_t *req = json_object_get(s, "required");
    json_t *addl = json_object_get(s, "additionalProperties");
    if (props && !json_is_object(props))
        return sc_fail(c, MD_EINVAL, "properties", ptr, "expected an object");
    if (req && !json_is_array(req))
        return sc_fail(c, MD_EINVAL, "required", ptr, "expected an array of names");
    int minp = 0, maxp = -1;
    if (get_count(c, s, "minProperties", ptr, &minp) < 0 ||
        get_count(c, s, "maxProperties", ptr, &maxp) < 0)
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
    /* Each property: "key":value */
    for (int i = 0; i < n; i++) {
        sbuf key = {0};
        sb_json_str(&key, names[i], strlen(names[i]));
        sb_put(&key, ":", 1);
        if (key.oom) {
            free(key.p);
            rc = gb_fail(b, MD_ENOMEM, "out of memory compiling a schema");
            goto out;
        }
        int v;
        if (schemas[i]) {
            char *pp = ptr_join(ptr, "properties");
            char *p2 = pp ? ptr_join(pp, names[i]) : NULL;
            free(pp);
            v = p2 ? sc_schema(c, schemas[i], p2) : gb_fail(b, MD_ENOMEM, "out of memory");
            free(p2);
        } else if (addl && !json_is_boolean(addl)) {
            char *pp = ptr_join(ptr, "additionalProperties");
            v = pp ? sc_schema(c, addl, pp) : gb_fail(b, MD_ENOMEM, "out of memory");
            free(pp);
        } else
            v = extra_ok ? value_expr(c) : gb_none(b);
        vals[i] = gb_seq(b, gb_lit(b, key.p, key.n), v);
        free(key.p);
        if (vals[i] < 0)
            goto fail;
        if (b->ex[v].kind == GX_NONE && required[i]) {
            rc = gb_none(b);
            goto out;
        }
    }
    /* Additional properties: "key":value with key not among the names. */
    int extra = -1;
    if (extra_ok) {
        char **sorted = malloc(sizeof(char *) * (size_t)(n + 1));
        size_t *lens = malloc(sizeof(size_t) * (size_t)(n + 1));
        if (!sorted || !lens) {
            free(sorted);
            free(lens);
            rc = gb_fail(b, MD_ENOMEM, "out of memory compiling a schema");
            goto out;
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
        int key =
            n ? gb_seq3(b, gb_byte(b, '"'), key_except(c, sorted, lens, n, 0), gb_byte(b, '"'))
              : string_expr(c, 0, -1);
        for (int i = 0; i < n; i++)
            free(enc[i].p);
        free(sorted);
        free(lens);
        int v;
        if (addl && !json_is_boolean(addl)) {
            char *pp = ptr_join(ptr, "additionalProperties");
            v = pp ? sc_schema(c, addl, pp) : gb_fail(b, MD_ENOMEM, "out of memory");
            free(pp);
        } else
            v = value_expr(c);
        extra = gb_seq3(b, key, gb_byte(b, ':'), v);
        if (extra < 0)
            goto fail;
    }
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
    rc = gb_seq3(b, gb_byte(b, '{'), A, gb_byte(b, '}'));
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

static int array_part(sc *c, json_t *s, const char *ptr) {
    gr_builder *b = &c->b;
    json_t *prefix = json_object_get(s, "prefixItems");
    json_t *items = json_object_get(s, "items");
    int mn = 0, mx = -1;
    if (get_count(c, s, "minItems", ptr, &mn) < 0 || get_count(c, s, "maxItems", ptr, &mx) < 0)
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
        char *pp = ptr_join(ptr, "items");
        rest = pp ? sc_schema(c, items, pp) : gb_fail(b, MD_ENOMEM, "out of memory");
        free(pp);
    } else
        rest = value_expr(c);
    if (rest < 0)
        return -1;
    int *pe = malloc(sizeof(int) * (size_t)(k + 1));
    if (!pe)
        return gb_fail(b, MD_ENOMEM, "out of memory compiling a schema");
    for (int i = 0; i < k; i++) {
        char *pp = ptr_idx(ptr, "prefixItems", (size_t)i);
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

/* enum / const: literal alternatives, filtered by type. */
static int enum_part(sc *c, json_t *s, const char *ptr, int types) {
    gr_builder *b = &c->b;
    json_t *en = json_object_get(s, "enum");
    json_t *cn = json_object_get(s, "const");
    if (en && !json_is_array(en))
        return sc_fail(c, MD_EINVAL, "enum", ptr, "expected an array");
    if (en && json_array_size(en) > SC_MAX_ENUM)
        return sc_fail(c, MD_EUNSUPP, "enum", ptr, "%zu values, over the %d supported",
                       json_array_size(en), SC_MAX_ENUM);
    int x = gb_none(b);
    size_t n = en ? json_array_size(en) : 1;
    for (size_t i = 0; i < n && x >= 0; i++) {
        json_t *v = en ? json_array_get(en, i) : cn;
        if (cn && en && !json_equal(v, cn))
            continue;
        int tb = type_bits_of_value(v);
        if (!(tb & types))
            continue;
        sbuf t = {0};
        sb_json(&t, v, 0);
        if (t.oom) {
            free(t.p);
            return gb_fail(b, MD_ENOMEM, "out of memory compiling a schema");
        }
        x = gb_alt(b, x, gb_lit(b, t.p, t.n));
        free(t.p);
    }
    return x;
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
    s = deref_shallow(c, s, ptr);
    if (!s)
        return -1;
    if (json_is_false(s))
        return 0;
    if (!json_is_object(s))
        return T_ALL;
    int t = type_bits(c, s, ptr);
    if (t < 0)
        return -1;
    json_t *cn = json_object_get(s, "const"), *en = json_object_get(s, "enum");
    if (cn)
        t &= type_bits_of_value(cn);
    else if (json_is_array(en)) {
        int u = 0;
        for (size_t i = 0; i < json_array_size(en); i++)
            u |= type_bits_of_value(json_array_get(en, i));
        t &= u;
    }
    return t;
}

static int sc_schema(sc *c, json_t *s, const char *ptr) {
    gr_builder *b = &c->b;
    if (b->failed)
        return -1;
    if (json_is_true(s))
        return value_expr(c);
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
    const char *k;
    json_t *v;
    /* Assertion keywords medley does not enforce: strict refuses, relaxed lists them.
     * Keywords outside JSON Schema's vocabularies (x-*, markdownDescription, example, ...)
     * are annotations by the specification and ignored. */
    json_object_foreach(s, k, v) {
        if (is_known(k) || is_annotation(k) || !is_unsupported(k))
            continue;
        char why[160];
        snprintf(why, sizeof why, "keyword '%.60s' is not supported", k);
        if (sc_unsupp(c, k, ptr, why))
            goto done;
    }
    if (json_object_get(s, "$id") && *ptr && strcmp(ptr, "/")) {
        if (sc_unsupp(c, "$id", ptr, "'$id' below the root (a new base URI) is not supported"))
            goto done;
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
            goto done;
    }
    json_t *ref = json_object_get(s, "$ref");
    if (ref) {
        if (!json_is_string(ref)) {
            x = sc_fail(c, MD_EINVAL, "$ref", ptr, "expected a string");
            goto done;
        }
        int siblings = 0;
        json_object_foreach(s, k, v) {
            if (strcmp(k, "$ref") && is_known(k))
                siblings = 1;
        }
        if (!siblings) {
            char *pp = ptr_join(ptr, "$ref");
            x = pp ? sc_ref(c, json_string_value(ref), pp) : gb_fail(b, MD_ENOMEM, "oom");
            free(pp);
            goto done;
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
        goto done;
    }
    json_t *allof = json_object_get(s, "allOf");
    if (allof) {
        if (!json_is_array(allof) || !json_array_size(allof)) {
            x = sc_fail(c, MD_EINVAL, "allOf", ptr, "expected a non-empty array");
            goto done;
        }
        json_t *m = json_copy(s);
        json_object_del(m, "allOf");
        char *pp = ptr_join(ptr, "allOf");
        int rc = 0;
        for (size_t i = 0; i < json_array_size(allof) && !rc; i++)
            rc = merge_into(c, m, json_array_get(allof, i), pp ? pp : "");
        free(pp);
        if (rc || b->failed) {
            json_decref(m);
            x = -1;
            goto done;
        }
        if (json_object_get(m, "not")) {
            json_decref(m);
            x = gb_none(b);
            goto done;
        }
        x = sc_schema(c, m, ptr);
        json_decref(m);
        goto done;
    }
    const char *comb = json_object_get(s, "anyOf")   ? "anyOf"
                       : json_object_get(s, "oneOf") ? "oneOf"
                                                     : NULL;
    if (comb) {
        json_t *arr = json_object_get(s, comb);
        if (!json_is_array(arr) || !json_array_size(arr)) {
            x = sc_fail(c, MD_EINVAL, comb, ptr, "expected a non-empty array");
            goto done;
        }
        if (json_object_get(s, "anyOf") && json_object_get(s, "oneOf")) {
            x = sc_fail(c, MD_EUNSUPP, "oneOf", ptr, "'anyOf' and 'oneOf' together");
            goto done;
        }
        char *pp = ptr_join(ptr, comb);
        if (!strcmp(comb, "oneOf")) {
            /* Exact only when no instance can match two branches: require disjoint types. */
            int seen = 0, overlap = 0;
            for (size_t i = 0; i < json_array_size(arr); i++) {
                int t = branch_types(c, json_array_get(arr, i), ptr);
                if (t < 0) {
                    free(pp);
                    goto done;
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
                goto done;
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
            char *bp = ptr_idx(ptr, comb, i);
            int y;
            if (has_sib) {
                json_t *m = json_copy(sib);
                y = merge_into(c, m, json_array_get(arr, i), bp ? bp : "") ? -1
                                                                           : sc_schema(c, m, bp);
                json_decref(m);
            } else
                y = sc_schema(c, json_array_get(arr, i), bp ? bp : "");
            free(bp);
            x = gb_alt(b, x, y);
        }
        json_decref(sib);
        free(pp);
        goto done;
    }
    if (json_object_get(s, "not")) {
        if (sc_unsupp(c, "not", ptr, "'not' is not supported"))
            goto done;
    }
    int types = type_bits(c, s, ptr);
    if (types < 0)
        goto done;
    if (json_object_get(s, "enum") || json_object_get(s, "const")) {
        json_object_foreach(s, k, v) {
            if (is_known(k) && strcmp(k, "enum") && strcmp(k, "const") && strcmp(k, "type")) {
                char why[160];
                snprintf(why, sizeof why, "'%s' beside 'enum'/'const' is not supported", k);
                if (sc_unsupp(c, k, ptr, why))
                    goto done;
            }
        }
        x = enum_part(c, s, ptr, types);
        goto done;
    }
    x = gb_none(b);
    if (types & T_NULL)
        x = gb_alt(b, x, gb_str(b, "null"));
    if (types & T_BOOL)
        x = gb_alt(b, x, gb_alt(b, gb_str(b, "true"), gb_str(b, "false")));
    if (types & T_STRING)
        x = gb_alt(b, x, string_part(c, s, ptr));
    if (types & T_NUMBER)
        x = gb_alt(b, x, numeric_part(c, s, ptr, 0));
    else if (types & T_INTEGER)
        x = gb_alt(b, x, numeric_part(c, s, ptr, 1));
    if (types & T_OBJECT) {
        int r = gb_rule_new(b, "obj");
        int y = object_part(c, s, ptr);
        gb_rule_set(b, r, y);
        x = gb_alt(b, x, y < 0 ? -1 : gb_ref(b, r));
    }
    if (types & T_ARRAY) {
        int r = gb_rule_new(b, "arr");
        int y = array_part(c, s, ptr);
        gb_rule_set(b, r, y);
        x = gb_alt(b, x, y < 0 ? -1 : gb_ref(b, r));
    }
done:
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

int gr_from_json_schema(const char *schema, size_t len, int strict, gr_grammar **out, char *relaxed,
                        size_t relaxedsz, md_err *e) {
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
    gb_rule_set(&c.b, root, x);
    int rc = c.b.failed ? (e && e->code ? e->code : MD_EINVAL) : gb_finish(&c.b, root, out, e);
    sc_free(&c);
    json_decref(doc);
    return rc;
}

int gr_from_json_object(gr_grammar **out, md_err *e) {
    return gr_from_json_schema("{\"type\":\"object\"}", 17, 1, out, NULL, 0, e);
}
