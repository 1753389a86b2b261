/* gr_ebnf.c — medley's EBNF notation (GBNF-like, docs/structured.md):
 *
 *     root   ::= "yes" | "no" | answer
 *     answer ::= [0-9]+ ("." [0-9]{1,2})?   # comments run to the end of the line
 *
 * A rule is `name ::= alternatives`; names are [A-Za-z0-9_-]+. Terms: "string" (escapes
 * \n \t \r \\ \" \xHH \uHHHH), [class] (the regex class syntax: ranges, ^, \d \w \s), '.'
 * (any code point but newline), a rule name, ( ... ); postfix ? * + {m} {m,} {m,n}; '|'
 * separates alternatives. The start rule is `root`. Left recursion is refused (rewrite it
 * with repetition). */
#include <stdlib.h>
#include <string.h>

#include "engine/grammar/grammar.h"
#include "engine/grammar/grammar_int.h"

typedef struct {
    gr_builder *b;
    const char *s;
    size_t n, i;
    int line;
    int depth;
} eparser;

static int efail(eparser *p, int code, const char *what) {
    return gb_fail(p->b, code, "grammar line %d: %s", p->line, what);
}

static void skip_ws(eparser *p, int newlines) {
    while (p->i < p->n) {
        char c = p->s[p->i];
        if (c == '#') {
            while (p->i < p->n && p->s[p->i] != '\n')
                p->i++;
        } else if (c == ' ' || c == '\t' || c == '\r' || (newlines && c == '\n')) {
            p->i++;
        } else if (c == '\n') {
            return;
        } else
            return;
        if (c == '\n')
            p->line++;
    }
}

static int is_name(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-';
}

/* At a rule header "name ::="? (does not move) */
static int at_header(eparser *p) {
    size_t j = p->i;
    if (j >= p->n || !is_name(p->s[j]))
        return 0;
    while (j < p->n && is_name(p->s[j]))
        j++;
    while (j < p->n && (p->s[j] == ' ' || p->s[j] == '\t'))
        j++;
    return j + 2 < p->n && !memcmp(p->s + j, "::=", 3);
}

static int parse_string(eparser *p) {
    /* p->i after the opening quote */
    char *buf = malloc(p->n - p->i + 4);
    if (!buf)
        return efail(p, MD_ENOMEM, "out of memory");
    size_t k = 0;
    while (1) {
        if (p->i >= p->n || p->s[p->i] == '\n') {
            free(buf);
            return efail(p, MD_EINVAL, "an unterminated string");
        }
        char c = p->s[p->i++];
        if (c == '"')
            break;
        if (c != '\\') {
            buf[k++] = c;
            continue;
        }
        if (p->i >= p->n) {
            free(buf);
            return efail(p, MD_EINVAL, "a trailing backslash");
        }
        char e = p->s[p->i++];
        int nd = 0;
        switch (e) {
        case 'n': buf[k++] = '\n'; break;
        case 't': buf[k++] = '\t'; break;
        case 'r': buf[k++] = '\r'; break;
        case '\\': buf[k++] = '\\'; break;
        case '"': buf[k++] = '"'; break;
        case '\'': buf[k++] = '\''; break;
        case 'x': nd = 2; break;
        case 'u': nd = 4; break;
        case 'U': nd = 8; break;
        default: free(buf); return efail(p, MD_EINVAL, "an unknown escape in a string");
        }
        if (nd) {
            unsigned long v = 0;
            for (int d = 0; d < nd; d++) {
                if (p->i >= p->n || gr_hex_digit(p->s[p->i]) < 0) {
                    free(buf);
                    return efail(p, MD_EINVAL, "a malformed hexadecimal escape");
                }
                v = v * 16 + (unsigned long)gr_hex_digit(p->s[p->i++]);
            }
            if (v > 0x10FFFF) {
                free(buf);
                return efail(p, MD_EINVAL, "an escape beyond U+10FFFF");
            }
            if (nd == 2)
                buf[k++] = (char)v; /* \xHH is a raw byte */
            else
                k += (size_t)gr_utf8_put((uint32_t)v, (uint8_t *)buf + k);
        }
    }
    int x = gb_lit(p->b, buf, k);
    free(buf);
    return x;
}

static int parse_alts(eparser *p);

static int parse_primary(eparser *p) {
    char c = p->s[p->i];
    if (c == '"') {
        p->i++;
        return parse_string(p);
    }
    if (c == '[' || c == '.') {
        size_t start = p->i;
        if (c == '[') {
            size_t j = p->i + 1;
            if (j < p->n && p->s[j] == '^')
                j++;
            if (j < p->n && p->s[j] == ']')
                j++;
            while (j < p->n && p->s[j] != ']' && p->s[j] != '\n')
                j += p->s[j] == '\\' ? 2 : 1;
            if (j >= p->n || p->s[j] != ']')
                return efail(p, MD_EINVAL, "an unterminated character class");
            p->i = j + 1;
        } else
            p->i++;
        md_err sub = {0};
        md_err *save = p->b->e;
        p->b->e = &sub;
        int x = gr_regex_expr(p->b, p->s + start, p->i - start);
        p->b->e = save;
        if (x < 0) {
            p->b->failed = 0;
            return efail(p, sub.code ? sub.code : MD_EINVAL, sub.msg);
        }
        return x;
    }
    if (c == '(') {
        p->i++;
        if (++p->depth > 200)
            return efail(p, MD_EUNSUPP, "groups nest deeper than 200");
        int x = parse_alts(p);
        p->depth--;
        skip_ws(p, 1);
        if (x < 0)
            return -1;
        if (p->i >= p->n || p->s[p->i] != ')')
            return efail(p, MD_EINVAL, "an unclosed '('");
        p->i++;
        return x;
    }
    if (is_name(c)) {
        size_t j = p->i;
        while (j < p->n && is_name(p->s[j]))
            j++;
        char name[128];
        if (j - p->i >= sizeof name)
            return efail(p, MD_EINVAL, "a rule name longer than 127 bytes");
        memcpy(name, p->s + p->i, j - p->i);
        name[j - p->i] = 0;
        p->i = j;
        return gb_ref(p->b, gb_rule(p->b, name));
    }
    return efail(p, MD_EINVAL, "expected a string, a class, a rule name or '('");
}

static int parse_seq(eparser *p) {
    gr_builder *b = p->b;
    int x = gb_empty(b);
    while (1) {
        skip_ws(p, 1);
        if (p->i >= p->n || p->s[p->i] == '|' || p->s[p->i] == ')' || at_header(p))
            return x;
        int a = parse_primary(p);
        if (a < 0)
            return -1;
        static const char *bad[] = {"expected a count after '{'", "expected a count after ','",
                                    "expected '}'"};
        int lo, hi, q;
        while ((q = gr_parse_quant(p->s, p->n, &p->i, 100000, &lo, &hi)) != 0) {
            if (q < 0)
                return efail(p, MD_EINVAL, bad[-q - 1]);
            if (hi >= 0 && hi < lo)
                return efail(p, MD_EINVAL, "a repetition {m,n} with n < m");
            if (lo > 10000 || hi > 10000)
                return efail(p, MD_EUNSUPP, "repetition counts above 10000");
            a = gb_rep(b, a, lo, hi);
        }
        x = gb_seq(b, x, a);
    }
}

static int parse_alts(eparser *p) {
    int x = parse_seq(p);
    while (x >= 0 && p->i < p->n && p->s[p->i] == '|') {
        p->i++;
        x = gb_alt(p->b, x, parse_seq(p));
    }
    return x;
}

int gr_from_ebnf(const char *text, size_t len, gr_grammar **out, md_err *e) {
    *out = NULL;
    if (!text)
        return md_errf(e, MD_EINVAL, "no grammar given");
    gr_builder b;
    gb_init(&b, e);
    eparser p = {&b, text, len, 0, 1, 0};
    int rc = 0;
    while (!b.failed) {
        skip_ws(&p, 1);
        if (p.i >= p.n)
            break;
        if (!at_header(&p)) {
            efail(&p, MD_EINVAL, "expected 'name ::= ...'");
            break;
        }
        size_t j = p.i;
        while (is_name(text[j]))
            j++;
        char name[128];
        if (j - p.i >= sizeof name) {
            efail(&p, MD_EINVAL, "a rule name longer than 127 bytes");
            break;
        }
        memcpy(name, text + p.i, j - p.i);
        name[j - p.i] = 0;
        int r = gb_rule(&b, name);
        if (r >= 0 && b.rules[r].expr >= 0) {
            efail(&p, MD_EINVAL, "a rule defined twice");
            break;
        }
        p.i = j;
        skip_ws(&p, 0);
        p.i += 3;
        int x = parse_alts(&p);
        if (x >= 0 && p.i < p.n && p.s[p.i] == ')') {
            efail(&p, MD_EINVAL, "an unmatched ')'");
            break;
        }
        gb_rule_set(&b, r, x);
    }
    int root = -1;
    for (int i = 0; i < b.nrules && !b.failed; i++)
        if (!strcmp(b.rules[i].name, "root"))
            root = i;
    if (b.failed)
        rc = e && e->code ? e->code : MD_EINVAL;
    else if (root < 0)
        rc = md_errf(e, MD_EINVAL, "the grammar has no 'root' rule");
    else
        rc = gb_finish(&b, root, out, e);
    gb_free(&b);
    return rc;
}
