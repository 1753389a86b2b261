/* gr_schema_value.c — JSON values as canonical text (the growable buffer the schema compiler
 * writes keys, enum and const literals with), and enum/const as literal alternatives. */
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/grammar/gr_schema_int.h"

void sb_put(sbuf *s, const char *x, size_t n) {
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

void sb_puts(sbuf *s, const char *x) {
    sb_put(s, x, strlen(x));
}

void sb_json_str(sbuf *s, const char *x, size_t n) {
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

/* enum / const: literal alternatives, filtered by type. */
int sc_enum_part(sc *c, json_t *s, const char *ptr, int types) {
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
        int tb = sc_type_bits_of_value(v);
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
