/* gr_schema_scalar.c — the scalar parts of a JSON Schema: the shared JSON value, string and
 * number grammars, strings with length bounds, formats and patterns, and numbers and integers
 * with bounds (decimal ranges expanded digit by digit). */
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/grammar/gr_schema_int.h"

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

int sc_string_expr(sc *c, int lo, int hi) {
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
int sc_value_expr(sc *c) {
    gr_builder *b = &c->b;
    if (c->r_value < 0) {
        c->r_value = gb_rule(b, "value");
        int robj = gb_rule(b, "object");
        int rarr = gb_rule(b, "array");
        int v = gb_ref(b, c->r_value);
        int kv = gb_seq3(b, sc_string_expr(c, 0, -1), gb_byte(b, ':'), v);
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
        x = gb_alt(b, x, sc_string_expr(c, 0, -1));
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

/* ---- type parts -------------------------------------------------------------------------- */

int sc_get_count(sc *c, json_t *s, const char *kw, const char *ptr, int *out) {
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
int sc_string_part(sc *c, json_t *s, const char *ptr) {
    gr_builder *b = &c->b;
    json_t *key = json_object();
    const char *kws[] = {"minLength", "maxLength", "pattern", "format"};
    for (int i = 0; i < 4; i++)
        if (json_object_get(s, kws[i]))
            json_object_set(key, kws[i], json_object_get(s, kws[i]));
    if (!json_object_size(key)) {
        json_decref(key);
        return sc_string_expr(c, 0, -1);
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
    if (sc_get_count(c, s, "minLength", ptr, &lo) < 0 ||
        sc_get_count(c, s, "maxLength", ptr, &hi) < 0)
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
    return sc_string_expr(c, lo, hi);
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

int sc_numeric_part(sc *c, json_t *s, const char *ptr, int integer) {
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
