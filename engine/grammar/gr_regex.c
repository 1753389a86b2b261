/* gr_regex.c — the regex subset (docs/structured.md) into builder expressions over UTF-8
 * bytes: literals, escapes (\d \w \s and their negations, \n \t \r \f \v \0 \xHH \uHHHH,
 * escaped punctuation), classes with ranges and negation, '.', groups ((...), (?:...),
 * (?<name>...)), alternation, the quantifiers ? * + {m} {m,} {m,n} (lazy forms accepted: a
 * whole-output match does not depend on laziness), '^' at the start and '$' at the end of a
 * top-level branch. Lookaround, backreferences, word boundaries and possessive quantifiers
 * are refused. Matching is by automaton, so no pattern backtracks.
 *
 * Two modes: whole output (gr_from_regex), and JSON string content for a schema's `pattern`
 * (gr_regex_json_expr): unanchored branches gain `.*` at the open ends as JSON Schema
 * searches, and each code point is written the way a compact JSON serializer writes it
 * (`"` and `\` escaped, control characters as \n-style or \u00XX escapes). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/grammar/grammar.h"
#include "engine/grammar/grammar_int.h"

#define RE_MAX_REPEAT 1000
#define RE_MAX_DEPTH 200
#define CP_MAX 0x10FFFF

typedef struct {
    uint32_t lo, hi;
} cpr;

typedef struct {
    cpr *r;
    int n, c;
} cpset;

typedef struct {
    gr_builder *b;
    const char *s;
    size_t n, i;
    int json;
    int depth;
} rparser;

static int rfail(rparser *p, int code, const char *what) {
    return gb_fail(p->b, code, "regex at offset %zu: %s", p->i, what);
}

static int cps_add(cpset *s, uint32_t lo, uint32_t hi) {
    if (s->n == s->c) {
        int nc = s->c ? s->c * 2 : 8;
        cpr *q = realloc(s->r, sizeof(cpr) * (size_t)nc);
        if (!q)
            return -1;
        s->r = q;
        s->c = nc;
    }
    s->r[s->n++] = (cpr){lo, hi};
    return 0;
}

static int cmp_cpr(const void *a, const void *b) {
    const cpr *x = a, *y = b;
    return (x->lo > y->lo) - (x->lo < y->lo);
}

static void cps_norm(cpset *s) {
    if (!s->n)
        return;
    qsort(s->r, (size_t)s->n, sizeof(cpr), cmp_cpr);
    int w = 0;
    for (int i = 1; i < s->n; i++) {
        if (s->r[i].lo <= s->r[w].hi + 1) {
            if (s->r[i].hi > s->r[w].hi)
                s->r[w].hi = s->r[i].hi;
        } else
            s->r[++w] = s->r[i];
    }
    s->n = w + 1;
}

static int cps_negate(cpset *s) {
    cps_norm(s);
    cpset o = {0};
    uint32_t next = 0;
    for (int i = 0; i < s->n; i++) {
        if (s->r[i].lo > next && cps_add(&o, next, s->r[i].lo - 1))
            goto oom;
        next = s->r[i].hi + 1;
    }
    if (next <= CP_MAX && cps_add(&o, next, CP_MAX))
        goto oom;
    free(s->r);
    *s = o;
    return 0;
oom:
    free(o.r);
    return -1;
}

int gr_utf8_put(uint32_t c, uint8_t *o) {
    if (c < 0x80) {
        o[0] = (uint8_t)c;
        return 1;
    }
    if (c < 0x800) {
        o[0] = (uint8_t)(0xc0 | (c >> 6));
        o[1] = (uint8_t)(0x80 | (c & 63));
        return 2;
    }
    if (c < 0x10000) {
        o[0] = (uint8_t)(0xe0 | (c >> 12));
        o[1] = (uint8_t)(0x80 | ((c >> 6) & 63));
        o[2] = (uint8_t)(0x80 | (c & 63));
        return 3;
    }
    o[0] = (uint8_t)(0xf0 | (c >> 18));
    o[1] = (uint8_t)(0x80 | ((c >> 12) & 63));
    o[2] = (uint8_t)(0x80 | ((c >> 6) & 63));
    o[3] = (uint8_t)(0x80 | (c & 63));
    return 4;
}

/* Code points lo..hi that share an encoded length n (>= 2), as byte-range sequences. */
static int utf8_split(gr_builder *b, uint32_t lo, uint32_t hi, int n) {
    for (int i = 1; i < n; i++) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if (lo & m)
                return gb_alt(b, utf8_split(b, lo, lo | m, n), utf8_split(b, (lo | m) + 1, hi, n));
            if ((hi & m) != m)
                return gb_alt(b, utf8_split(b, lo, (hi & ~m) - 1, n),
                              utf8_split(b, hi & ~m, hi, n));
        }
    }
    uint8_t x[4], y[4];
    gr_utf8_put(lo, x);
    gr_utf8_put(hi, y);
    int e = gb_empty(b);
    for (int i = 0; i < n; i++)
        e = gb_seq(b, e, gb_range(b, x[i], y[i]));
    return e;
}

/* JSON's escape of a control character, a quote or a backslash, as Python's json.dumps
 * writes it (ensure_ascii=False). */
static int json_escape_lit(gr_builder *b, uint32_t c) {
    char buf[8];
    switch (c) {
    case '"': return gb_str(b, "\\\"");
    case '\\': return gb_str(b, "\\\\");
    case '\n': return gb_str(b, "\\n");
    case '\r': return gb_str(b, "\\r");
    case '\t': return gb_str(b, "\\t");
    case '\b': return gb_str(b, "\\b");
    case '\f': return gb_str(b, "\\f");
    default: snprintf(buf, sizeof buf, "\\u%04x", c); return gb_str(b, buf);
    }
}

/* A set of code points as an expression (UTF-8; JSON-escaped in json mode). */
static int cps_expr(gr_builder *b, cpset *s, int json) {
    cps_norm(s);
    gr_cls ascii = {{0}};
    int x = gb_none(b);
    /* \u00XX escapes grouped by their first hex digit: two alternatives, not 27 */
    gr_cls u0 = {{0}}, u1 = {{0}};
    for (int i = 0; i < s->n; i++) {
        uint32_t lo = s->r[i].lo, hi = s->r[i].hi;
        for (uint32_t c = lo; c <= hi && c < 0x80; c++) {
            if (json && c < 0x20 && (c == 0 || !strchr("\n\r\t\b\f", (int)c)))
                gr_cls_set(c < 0x10 ? &u0 : &u1, (unsigned char)"0123456789abcdef"[c & 15]);
            else if (json && (c == '"' || c == '\\' || c < 0x20))
                x = gb_alt(b, x, json_escape_lit(b, c));
            else
                gr_cls_set(&ascii, c);
        }
        if (hi < 0x80)
            continue;
        if (lo < 0x80)
            lo = 0x80;
        static const uint32_t bound[3][2] = {{0x80, 0x7ff}, {0x800, 0xffff}, {0x10000, CP_MAX}};
        for (int k = 0; k < 3; k++) {
            uint32_t a = lo > bound[k][0] ? lo : bound[k][0];
            uint32_t z = hi < bound[k][1] ? hi : bound[k][1];
            if (a > z)
                continue;
            if (k == 1 && a <= 0xdfff && z >= 0xd800) { /* no surrogates in UTF-8 */
                if (a < 0xd800)
                    x = gb_alt(b, x, utf8_split(b, a, 0xd7ff, 3));
                if (z > 0xdfff)
                    x = gb_alt(b, x, utf8_split(b, 0xe000, z, 3));
                continue;
            }
            x = gb_alt(b, x, utf8_split(b, a, z, k + 2));
        }
    }
    int u = gb_alt(b, gb_seq(b, gb_byte(b, '0'), gb_cls(b, &u0)),
                   gb_seq(b, gb_byte(b, '1'), gb_cls(b, &u1)));
    if (b->ex[u].kind != GX_NONE)
        x = gb_alt(b, x, gb_seq(b, gb_str(b, "\\u00"), u));
    return gb_alt(b, gb_cls(b, &ascii), x);
}

static int cp_single(gr_builder *b, uint32_t c, int json) {
    cpset s = {0};
    if (cps_add(&s, c, c))
        return gb_fail(b, MD_ENOMEM, "out of memory compiling a regex");
    int x = cps_expr(b, &s, json);
    free(s.r);
    return x;
}

int gr_hex_digit(int c) {
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Decode one UTF-8 code point at p->i (invalid bytes are taken as Latin-1). */
static uint32_t next_cp(rparser *p) {
    const uint8_t *s = (const uint8_t *)p->s;
    uint32_t c = s[p->i];
    int n = c < 0x80 ? 1 : c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 1;
    if (n > 1 && p->i + (size_t)n <= p->n) {
        uint32_t v = c & (0xff >> (n + 1));
        for (int k = 1; k < n; k++)
            v = (v << 6) | (s[p->i + (size_t)k] & 63);
        p->i += (size_t)n;
        return v;
    }
    p->i++;
    return c;
}

/* Escape after '\' (p->i at the escaped char). Adds to set; returns 0, or -1 on error. */
static int parse_escape(rparser *p, cpset *set) {
    if (p->i >= p->n)
        return rfail(p, MD_EINVAL, "a trailing backslash");
    char c = p->s[p->i++];
    switch (c) {
    case 'd': return cps_add(set, '0', '9');
    case 'w':
        return cps_add(set, '0', '9') | cps_add(set, 'A', 'Z') | cps_add(set, 'a', 'z') |
               cps_add(set, '_', '_');
    case 's': return cps_add(set, '\t', '\r') | cps_add(set, ' ', ' ');
    case 'D':
    case 'W':
    case 'S': {
        cpset t = {0};
        int rc;
        if (c == 'D')
            rc = cps_add(&t, '0', '9');
        else if (c == 'S')
            rc = cps_add(&t, '\t', '\r') | cps_add(&t, ' ', ' ');
        else
            rc = cps_add(&t, '0', '9') | cps_add(&t, 'A', 'Z') | cps_add(&t, 'a', 'z') |
                 cps_add(&t, '_', '_');
        if (rc || cps_negate(&t)) {
            free(t.r);
            return -1;
        }
        for (int i = 0; i < t.n && !rc; i++)
            rc = cps_add(set, t.r[i].lo, t.r[i].hi);
        free(t.r);
        return rc;
    }
    case 'n': return cps_add(set, '\n', '\n');
    case 't': return cps_add(set, '\t', '\t');
    case 'r': return cps_add(set, '\r', '\r');
    case 'f': return cps_add(set, '\f', '\f');
    case 'v': return cps_add(set, '\v', '\v');
    case '0': return cps_add(set, 0, 0);
    case 'x':
    case 'u': {
        int nd = c == 'x' ? 2 : 4;
        uint32_t v = 0;
        if (c == 'u' && p->i < p->n && p->s[p->i] == '{') {
            p->i++;
            int k = 0;
            while (p->i < p->n && gr_hex_digit(p->s[p->i]) >= 0 && k < 6) {
                v = v * 16 + (uint32_t)gr_hex_digit(p->s[p->i++]);
                k++;
            }
            if (!k || p->i >= p->n || p->s[p->i] != '}' || v > CP_MAX)
                return rfail(p, MD_EINVAL, "a malformed \\u{...} escape");
            p->i++;
            return cps_add(set, v, v);
        }
        for (int k = 0; k < nd; k++) {
            if (p->i >= p->n || gr_hex_digit(p->s[p->i]) < 0)
                return rfail(p, MD_EINVAL, "a malformed hexadecimal escape");
            v = v * 16 + (uint32_t)gr_hex_digit(p->s[p->i++]);
        }
        return cps_add(set, v, v);
    }
    case 'b':
    case 'B': return rfail(p, MD_EUNSUPP, "word boundaries (\\b, \\B) are not supported");
    case 'A':
    case 'z':
    case 'Z':
    case 'G': return rfail(p, MD_EUNSUPP, "anchors other than ^ and $ are not supported");
    case 'p':
    case 'P': return rfail(p, MD_EUNSUPP, "Unicode property classes (\\p) are not supported");
    case 'k': return rfail(p, MD_EUNSUPP, "backreferences are not supported");
    default:
        if (c >= '1' && c <= '9')
            return rfail(p, MD_EUNSUPP, "backreferences are not supported");
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
            return rfail(p, MD_EUNSUPP, "an unknown escape");
        p->i--;
        uint32_t v = next_cp(p);
        return cps_add(set, v, v);
    }
}

static int parse_class(rparser *p, cpset *set) {
    /* p->i just after '[' */
    int neg = 0;
    if (p->i < p->n && p->s[p->i] == '^') {
        neg = 1;
        p->i++;
    }
    int first = 1;
    while (1) {
        if (p->i >= p->n)
            return rfail(p, MD_EINVAL, "an unterminated character class");
        char c = p->s[p->i];
        if (c == ']' && !first) {
            p->i++;
            break;
        }
        first = 0;
        if (c == '[' && p->i + 1 < p->n && p->s[p->i + 1] == ':')
            return rfail(p, MD_EUNSUPP, "POSIX classes ([:alpha:]) are not supported");
        uint32_t lo;
        if (c == '\\') {
            p->i++;
            cpset t = {0};
            if (parse_escape(p, &t) < 0) {
                free(t.r);
                return -1;
            }
            if (t.n != 1 || t.r[0].lo != t.r[0].hi) {
                for (int i = 0; i < t.n; i++)
                    cps_add(set, t.r[i].lo, t.r[i].hi);
                free(t.r);
                continue;
            }
            lo = t.r[0].lo;
            free(t.r);
        } else
            lo = next_cp(p);
        uint32_t hi = lo;
        if (p->i + 1 < p->n && p->s[p->i] == '-' && p->s[p->i + 1] != ']') {
            p->i++;
            if (p->s[p->i] == '\\') {
                p->i++;
                cpset t = {0};
                if (parse_escape(p, &t) < 0) {
                    free(t.r);
                    return -1;
                }
                if (t.n != 1 || t.r[0].lo != t.r[0].hi) {
                    free(t.r);
                    return rfail(p, MD_EINVAL, "a class escape as a range end");
                }
                hi = t.r[0].lo;
                free(t.r);
            } else
                hi = next_cp(p);
            if (hi < lo)
                return rfail(p, MD_EINVAL, "a range out of order in a character class");
        }
        if (cps_add(set, lo, hi))
            return rfail(p, MD_ENOMEM, "out of memory");
    }
    if (neg && cps_negate(set))
        return rfail(p, MD_ENOMEM, "out of memory");
    return 0;
}

static int parse_alt(rparser *p, int top);

/* The decimal number at s[*i], saturated at cap, into *v; *i moves past it. -1 when no digit
 * is there. */
static int parse_count(const char *s, size_t n, size_t *i, long cap, int *v) {
    if (*i >= n || s[*i] < '0' || s[*i] > '9')
        return -1;
    long x = 0;
    while (*i < n && s[*i] >= '0' && s[*i] <= '9') {
        x = x * 10 + (s[(*i)++] - '0');
        if (x > cap)
            x = cap;
    }
    *v = (int)x;
    return 0;
}

/* The {m}, {m,} or {m,n} at s[*i] (a '{'): 0 with *i past the '}', or -1 / -2 / -3 as
 * gr_parse_quant says, *i unchanged. */
static int parse_braces(const char *s, size_t n, size_t *i, long cap, int *lo, int *hi) {
    size_t j = *i + 1; /* past '{' */
    if (parse_count(s, n, &j, cap, lo))
        return -1;
    *hi = *lo;
    if (j < n && s[j] == ',') {
        j++;
        if (j < n && s[j] == '}')
            *hi = -1;
        else if (parse_count(s, n, &j, cap, hi))
            return -2;
    }
    if (j >= n || s[j] != '}')
        return -3;
    *i = j + 1;
    return 0;
}

int gr_parse_quant(const char *s, size_t n, size_t *i, long cap, int *lo, int *hi) {
    if (*i >= n)
        return 0;
    switch (s[*i]) {
    case '*': *lo = 0, *hi = -1; break;
    case '+': *lo = 1, *hi = -1; break;
    case '?': *lo = 0, *hi = 1; break;
    case '{': {
        int rc = parse_braces(s, n, i, cap, lo, hi);
        return rc ? rc : 1;
    }
    default: return 0;
    }
    (*i)++;
    return 1;
}

static int parse_atom(rparser *p) {
    gr_builder *b = p->b;
    char c = p->s[p->i];
    if (c == '(') {
        p->i++;
        if (p->i < p->n && p->s[p->i] == '?') {
            if (p->i + 1 < p->n && p->s[p->i + 1] == ':')
                p->i += 2;
            else if (p->i + 2 < p->n && p->s[p->i + 1] == '<' && p->s[p->i + 2] != '=' &&
                     p->s[p->i + 2] != '!') {
                while (p->i < p->n && p->s[p->i] != '>')
                    p->i++;
                p->i++;
            } else if (p->i + 1 < p->n && p->s[p->i + 1] == 'P' && p->i + 2 < p->n &&
                       p->s[p->i + 2] == '<') {
                while (p->i < p->n && p->s[p->i] != '>')
                    p->i++;
                p->i++;
            } else if (p->i + 1 < p->n &&
                       (p->s[p->i + 1] == '=' || p->s[p->i + 1] == '!' || p->s[p->i + 1] == '<'))
                return rfail(p, MD_EUNSUPP, "lookaround is not supported");
            else
                return rfail(p, MD_EUNSUPP, "group flags (?...) are not supported");
        }
        if (++p->depth > RE_MAX_DEPTH)
            return rfail(p, MD_EUNSUPP, "groups nest deeper than 200");
        int x = parse_alt(p, 0);
        p->depth--;
        if (x < 0)
            return -1;
        if (p->i >= p->n || p->s[p->i] != ')')
            return rfail(p, MD_EINVAL, "an unclosed group");
        p->i++;
        return x;
    }
    cpset set = {0};
    int rc = 0;
    if (c == '[') {
        p->i++;
        rc = parse_class(p, &set);
    } else if (c == '.') {
        p->i++;
        rc = cps_add(&set, '\n', '\n') || cps_negate(&set) ? -1 : 0;
    } else if (c == '\\') {
        p->i++;
        rc = parse_escape(p, &set);
    } else if (c == '*' || c == '+' || c == '?' || c == '{') {
        if (c == '{') {
            /* A '{' not starting a valid quantifier is a literal (as in ECMA-262 Annex B). */
            size_t j = p->i + 1;
            while (j < p->n && ((p->s[j] >= '0' && p->s[j] <= '9') || p->s[j] == ','))
                j++;
            if (j >= p->n || p->s[j] != '}' || j == p->i + 1) {
                p->i++;
                return cp_single(b, '{', p->json);
            }
        }
        return rfail(p, MD_EINVAL, "a quantifier with nothing to repeat");
    } else {
        uint32_t v = next_cp(p);
        rc = cps_add(&set, v, v);
    }
    if (rc) {
        free(set.r);
        if (!b->failed)
            rfail(p, MD_ENOMEM, "out of memory");
        return -1;
    }
    int x = cps_expr(b, &set, p->json);
    free(set.r);
    return x;
}

static int parse_seq(rparser *p, int top, int *anch_start, int *anch_end) {
    gr_builder *b = p->b;
    int x = gb_empty(b);
    *anch_start = *anch_end = 0;
    if (p->i < p->n && p->s[p->i] == '^') {
        if (!top)
            return rfail(p, MD_EUNSUPP, "'^' is only supported at the start of the pattern");
        *anch_start = 1;
        p->i++;
    }
    while (p->i < p->n && p->s[p->i] != '|' && p->s[p->i] != ')' && x >= 0) {
        if (p->s[p->i] == '$') {
            p->i++;
            if (!top || (p->i < p->n && p->s[p->i] != '|'))
                return rfail(p, MD_EUNSUPP, "'$' is only supported at the end of the pattern");
            *anch_end = 1;
            break;
        }
        if (p->s[p->i] == '^')
            return rfail(p, MD_EUNSUPP, "'^' is only supported at the start of the pattern");
        int a = parse_atom(p);
        if (a < 0)
            return -1;
        int lo, hi, q;
        /* a '{' not starting a well-formed {m,n} (q < 0) is a literal */
        while ((q = gr_parse_quant(p->s, p->n, &p->i, 1000000, &lo, &hi)) > 0) {
            if (hi >= 0 && hi < lo)
                return rfail(p, MD_EINVAL, "a repetition {m,n} with n < m");
            if (lo > RE_MAX_REPEAT || hi > RE_MAX_REPEAT)
                return rfail(p, MD_EUNSUPP, "repetition counts above 1000 are not supported");
            if (p->i < p->n && p->s[p->i] == '?')
                p->i++; /* lazy: same language */
            else if (p->i < p->n && p->s[p->i] == '+')
                return rfail(p, MD_EUNSUPP, "possessive quantifiers are not supported");
            a = gb_rep(b, a, lo, hi);
        }
        x = gb_seq(b, x, a);
    }
    return x;
}

static int any_json_char(gr_builder *b) {
    cpset s = {0};
    if (cps_add(&s, 0, CP_MAX))
        return gb_fail(b, MD_ENOMEM, "out of memory compiling a regex");
    int x = cps_expr(b, &s, 1);
    free(s.r);
    return x;
}

static int parse_alt(rparser *p, int top) {
    gr_builder *b = p->b;
    int x = gb_none(b);
    while (1) {
        int as, ae;
        int s = parse_seq(p, top, &as, &ae);
        if (s < 0)
            return -1;
        if (top && p->json) {
            /* JSON Schema patterns search: open ends match anything. */
            int any = gb_rep(b, any_json_char(b), 0, -1);
            if (!as)
                s = gb_seq(b, any, s);
            if (!ae)
                s = gb_seq(b, s, gb_rep(b, any_json_char(b), 0, -1));
        }
        x = gb_alt(b, x, s);
        if (p->i < p->n && p->s[p->i] == '|') {
            p->i++;
            continue;
        }
        break;
    }
    return x;
}

static int regex_expr(gr_builder *b, const char *re, size_t len, int json) {
    rparser p = {b, re, len, 0, json, 0};
    int x = parse_alt(&p, 1);
    if (x >= 0 && p.i < p.n)
        return rfail(&p, MD_EINVAL, "an unmatched ')'");
    return x;
}

int gr_regex_expr(gr_builder *b, const char *re, size_t len) {
    return regex_expr(b, re, len, 0);
}

int gr_regex_json_expr(gr_builder *b, const char *re, size_t len) {
    return regex_expr(b, re, len, 1);
}

int gr_from_regex(const char *re, size_t len, gr_grammar **out, md_err *e) {
    *out = NULL;
    gr_builder b;
    gb_init(&b, e);
    int r = gb_rule(&b, "root");
    int x = gr_regex_expr(&b, re ? re : "", re ? len : 0);
    gb_rule_set(&b, r, x);
    int rc = b.failed ? (e && e->code ? e->code : MD_EINVAL) : gb_finish(&b, r, out, e);
    gb_free(&b);
    return rc;
}

int gr_from_choice(const char *const *choices, const size_t *lens, int n, gr_grammar **out,
                   md_err *e) {
    *out = NULL;
    if (n <= 0 || !choices || !lens)
        return md_errf(e, MD_EINVAL, "a choice needs at least one string");
    gr_builder b;
    gb_init(&b, e);
    int r = gb_rule(&b, "root");
    int x = gb_none(&b);
    for (int i = 0; i < n && x >= 0; i++) {
        if (!choices[i] && lens[i])
            return gb_free(&b), md_errf(e, MD_EINVAL, "choice %d is NULL", i);
        x = gb_alt(&b, x, gb_lit(&b, choices[i], lens[i]));
    }
    gb_rule_set(&b, r, x);
    int rc = b.failed ? (e && e->code ? e->code : MD_EINVAL) : gb_finish(&b, r, out, e);
    gb_free(&b);
    return rc;
}
