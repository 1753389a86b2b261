/* test_grammar_fuzz.c — hostile constraints for the grammar compiler and matcher: the
 * issue's list (10,000-deep nesting, a million enum values, $ref cycles without a base case,
 * remote $ref, a 50 MB schema, catastrophic-backtracking patterns), then mutated schemas,
 * random regexes and random EBNF texts. Each must compile, and then mask and accept random
 * bytes without a crash, or be refused with a message; each within a time bound.
 * Deterministic (fixed seeds); scripts/test.sh runs it under ASan+UBSan (label fuzz). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "engine/grammar/grammar.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static gr_vocab *vocab(void) {
    static const char *pieces[] = {"{",    "}",    "[",   "]",   "\"",   ":",        ",",
                                   "a",    "b",    "0",   "1",   "-",    ".",        "e",
                                   "true", "null", "{\"", "\":", "\",",  "\xc3\xa9", "\xc3",
                                   "\\",   "x",    " ",   "ab",  "aaaa", "\":\"",    ""};
    int n = (int)(sizeof pieces / sizeof pieces[0]);
    uint32_t len[64];
    for (int i = 0; i < n; i++)
        len[i] = (uint32_t)strlen(pieces[i]);
    int32_t eos = n - 1;
    gr_vocab *v = NULL;
    md_err e = {0};
    assert_int_equal(gr_vocab_new(n, pieces, len, &eos, 1, &v, &e), 0);
    return v;
}

/* Compile with fn, then exercise the result. Returns the status. */
typedef int (*compile_fn)(const char *text, size_t len, gr_grammar **g, md_err *e);

static int c_schema(const char *t, size_t n, gr_grammar **g, md_err *e) {
    char rel[256];
    return gr_from_json_schema(t, n, 0, g, rel, sizeof rel, e);
}
static int c_schema_strict(const char *t, size_t n, gr_grammar **g, md_err *e) {
    return gr_from_json_schema(t, n, 1, g, NULL, 0, e);
}

static int exercise(compile_fn fn, const char *text, size_t len, const gr_vocab *v, double limit_s,
                    unsigned seed) {
    double t0 = now_s();
    gr_grammar *g = NULL;
    md_err e = {0};
    int rc = fn(text, len, &g, &e);
    if (rc) {
        assert_null(g);
        assert_true(e.msg[0] != 0);
    } else {
        assert_non_null(g);
        gr_matcher *m;
        assert_int_equal(gr_matcher_new(g, v, &m, &e), 0);
        uint32_t mask[2];
        srand(seed);
        for (int s = 0; s < 40; s++) {
            gr_matcher_fill_mask(m, mask);
            int cand[64], nc = 0;
            for (int t = 0; t < gr_vocab_size(v); t++)
                if ((mask[t >> 5] >> (t & 31)) & 1)
                    cand[nc++] = t;
            if (!nc)
                break;
            assert_int_equal(gr_matcher_accept(m, cand[rand() % nc]), 0);
        }
        char junk[16];
        for (int i = 0; i < 16; i++)
            junk[i] = (char)(rand() & 0xff);
        gr_matcher_accept_bytes(m, junk, sizeof junk);
        (void)gr_matcher_can_end(m);
        (void)gr_matcher_must_end(m);
        gr_matcher_free(m);
        gr_free(g);
    }
    double dt = now_s() - t0;
    if (dt > limit_s)
        fail_msg("%.60s... took %.2f s (limit %.1f s)", text, dt, limit_s);
    return rc;
}

static void test_issue_hostile_schemas(void **st) {
    (void)st;
    gr_vocab *v = vocab();
    /* 10,000-deep nesting, as objects and as arrays */
    size_t cap = 40u << 20;
    char *s = malloc(cap);
    size_t n = 0;
    for (int i = 0; i < 10000; i++)
        n += (size_t)sprintf(s + n, "{\"type\":\"object\",\"properties\":{\"a\":");
    n += (size_t)sprintf(s + n, "{}");
    for (int i = 0; i < 10000; i++)
        n += (size_t)sprintf(s + n, "}}");
    assert_int_not_equal(exercise(c_schema_strict, s, n, v, 10, 1), 0);
    n = 0;
    for (int i = 0; i < 10000; i++)
        n += (size_t)sprintf(s + n, "{\"items\":");
    n += (size_t)sprintf(s + n, "true");
    for (int i = 0; i < 10000; i++)
        s[n++] = '}';
    assert_int_not_equal(exercise(c_schema_strict, s, n, v, 10, 2), 0);
    /* 64 levels: the deepest accepted */
    n = 0;
    for (int i = 0; i < 60; i++)
        n += (size_t)sprintf(s + n, "{\"items\":");
    n += (size_t)sprintf(s + n, "{\"type\":\"integer\"}");
    for (int i = 0; i < 60; i++)
        s[n++] = '}';
    assert_int_equal(exercise(c_schema_strict, s, n, v, 10, 3), 0);
    /* 10^6 enum values */
    n = (size_t)sprintf(s, "{\"enum\":[");
    for (int i = 0; i < 1000000; i++)
        n += (size_t)sprintf(s + n, "%s%d", i ? "," : "", i);
    n += (size_t)sprintf(s + n, "]}");
    assert_int_not_equal(exercise(c_schema_strict, s, n, v, 10, 4), 0);
    /* $ref cycles without a base case, direct and through properties */
    const char *cyc[] = {
        "{\"$ref\":\"#\"}",
        ("{\"$defs\":{\"a\":{\"$ref\":\"#/$defs/b\"},\"b\":{\"$ref\":\"#/$defs/a\"}},"
         "\"$ref\":\"#/$defs/a\"}"),
        "{\"type\":\"object\",\"properties\":{\"x\":{\"$ref\":\"#\"}},\"required\":[\"x\"]}",
        "{\"type\":\"array\",\"items\":{\"$ref\":\"#\"},\"minItems\":1}",
        "{\"$ref\":\"https://example.org/schema.json\"}",
        "{\"$ref\":\"other.json#/a\"}",
        "{\"$ref\":\"#/nowhere/at/all\"}",
        "false", /* rules without a single edge */
        "{\"enum\":[]}",
        "{\"type\":[]}",
        "{\"allOf\":[{\"type\":\"string\"},{\"type\":\"integer\"}]}",
    };
    for (size_t i = 0; i < sizeof cyc / sizeof cyc[0]; i++)
        assert_int_not_equal(exercise(c_schema_strict, cyc[i], strlen(cyc[i]), v, 5, 5), 0);
    /* a 50 MB schema */
    n = (size_t)sprintf(s, "{\"description\":\"");
    while (n < (size_t)50 << 20 && n + 100 < cap)
        s[n++] = 'x';
    n += (size_t)sprintf(s + n, "\"}");
    free(s);
    s = malloc(((size_t)50 << 20) + 64);
    n = (size_t)sprintf(s, "{\"description\":\"");
    memset(s + n, 'x', (size_t)50 << 20);
    n += (size_t)50 << 20;
    n += (size_t)sprintf(s + n, "\"}");
    assert_int_not_equal(exercise(c_schema_strict, s, n, v, 5, 6), 0);
    free(s);
    /* catastrophic-backtracking patterns: automata do not backtrack */
    const char *cat[] = {
        "{\"type\":\"string\",\"pattern\":\"^(a+)+$\"}",
        "{\"type\":\"string\",\"pattern\":\"^(a|aa)*b$\"}",
        "{\"type\":\"string\",\"pattern\":\"(x+x+)+y\"}",
        "{\"type\":\"string\",\"pattern\":\"^(a{1,1000}){1,1000}$\"}",
        "{\"type\":\"string\",\"pattern\":\"((((((a*)*)*)*)*)*)*b\"}",
    };
    for (size_t i = 0; i < sizeof cat / sizeof cat[0]; i++)
        exercise(c_schema, cat[i], strlen(cat[i]), v, 10, 7);
    gr_vocab_free(v);
}

static const char *const seeds[] = {
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":20},"
    "\"age\":{\"type\":\"integer\",\"minimum\":0},\"tags\":{\"type\":\"array\",\"items\":"
    "{\"enum\":[\"a\",\"b\"]}}},\"required\":[\"name\"],\"additionalProperties\":false}",
    "{\"$defs\":{\"n\":{\"anyOf\":[{\"type\":\"null\"},{\"type\":\"object\",\"properties\":"
    "{\"v\":{\"type\":\"number\"},\"next\":{\"$ref\":\"#/$defs/n\"}}}]}},\"$ref\":\"#/$defs/n\"}",
    "{\"allOf\":[{\"properties\":{\"a\":{\"const\":1}}},{\"required\":[\"a\"]}],\"type\":"
    "[\"object\",\"string\"],\"pattern\":\"^x+$\",\"format\":\"date\"}",
    "{\"prefixItems\":[{\"type\":\"boolean\"},{\"oneOf\":[{\"type\":\"string\"},{\"type\":"
    "\"integer\"}]}],\"items\":false,\"minItems\":1}",
};

static void test_mutated_schemas(void **st) {
    (void)st;
    gr_vocab *v = vocab();
    srand(12345);
    const char alphabet[] = "{}[]\":,0123456789-.eabtrufnl$#/\\ ";
    for (int it = 0; it < 1500; it++) {
        const char *seed = seeds[it % 4];
        size_t n = strlen(seed);
        char buf[1024];
        memcpy(buf, seed, n);
        int muts = 1 + rand() % 4;
        for (int k = 0; k < muts && n > 0; k++) {
            size_t at = (size_t)rand() % n;
            switch (rand() % 4) {
            case 0: buf[at] = alphabet[rand() % (int)(sizeof alphabet - 1)]; break;
            case 1: buf[at] = (char)(rand() & 0xff); break;
            case 2: n = at; break; /* truncate */
            default:
                if (n + 8 < sizeof buf) { /* duplicate a slice */
                    size_t l = (size_t)rand() % 8;
                    memmove(buf + at + l, buf + at, n - at);
                    n += l;
                }
            }
        }
        exercise(it & 1 ? c_schema : c_schema_strict, buf, n, v, 5, (unsigned)it);
    }
    gr_vocab_free(v);
}

static int c_regex(const char *t, size_t n, gr_grammar **g, md_err *e) {
    return gr_from_regex(t, n, g, e);
}
static int c_ebnf(const char *t, size_t n, gr_grammar **g, md_err *e) {
    return gr_from_ebnf(t, n, g, e);
}

static void test_random_regex_and_ebnf(void **st) {
    (void)st;
    gr_vocab *v = vocab();
    srand(777);
    const char ra[] = "ab()[]|*+?{}0123456789,^$.\\-dws:?=!<";
    for (int it = 0; it < 3000; it++) {
        char buf[64];
        int n = 1 + rand() % 30;
        for (int i = 0; i < n; i++)
            buf[i] = ra[rand() % (int)(sizeof ra - 1)];
        exercise(c_regex, buf, (size_t)n, v, 5, (unsigned)it);
    }
    const char *eb[] = {"root ::= ", "a", "b",    " ::= ",       "\"x\"", "[a-z]", "|",
                        "(",         ")", "*",    "+",           "?",     "{2,3}", "\n",
                        "root",      " ", "#c\n", "\"\\u00e9\"", "."};
    for (int it = 0; it < 3000; it++) {
        char buf[256];
        size_t n = 0;
        int parts = 1 + rand() % 14;
        for (int i = 0; i < parts; i++) {
            const char *p = eb[rand() % (int)(sizeof eb / sizeof eb[0])];
            size_t l = strlen(p);
            if (n + l >= sizeof buf)
                break;
            memcpy(buf + n, p, l);
            n += l;
        }
        exercise(c_ebnf, buf, n, v, 5, (unsigned)it);
    }
    gr_vocab_free(v);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_issue_hostile_schemas),
        cmocka_unit_test(test_mutated_schemas),
        cmocka_unit_test(test_random_regex_and_ebnf),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
