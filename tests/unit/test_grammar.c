/* test_grammar.c — the grammar library (engine/grammar): each front end and JSON Schema
 * keyword on texts it must accept and reject; token masks against brute force (every token
 * of a small vocabulary simulated on its own) and against the uncached trie walk, along
 * random walks that sample only masked tokens and must end in text the grammar accepts. */
#include <jansson.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine/grammar/grammar.h"
#include "engine/grammar/grammar_int.h"

/* ---- helpers ------------------------------------------------------------------------------ */

static gr_vocab *byte_vocab(void) {
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
    gr_vocab *v = NULL;
    md_err e = {0};
    assert_int_equal(gr_vocab_new(257, tok, len, &eos, 1, &v, &e), 0);
    return v;
}

static int accepts(const gr_grammar *g, const char *text) {
    static gr_vocab *v;
    if (!v)
        v = byte_vocab();
    gr_matcher *m;
    md_err e = {0};
    assert_int_equal(gr_matcher_new(g, v, &m, &e), 0);
    int ok = gr_matcher_accept_bytes(m, text, strlen(text)) == 0 && gr_matcher_can_end(m);
    gr_matcher_free(m);
    return ok;
}

static gr_grammar *schema(const char *s) {
    gr_grammar *g = NULL;
    md_err e = {0};
    int rc = gr_from_json_schema(s, strlen(s), 1, &g, NULL, 0, &e);
    if (rc)
        fail_msg("schema %s: %s", s, e.msg);
    return g;
}

static int schema_err(const char *s, int strict, char *msg, size_t msgsz, char *relaxed,
                      size_t rsz) {
    gr_grammar *g = NULL;
    md_err e = {0};
    int rc = gr_from_json_schema(s, strlen(s), strict, &g, relaxed, rsz, &e);
    gr_free(g);
    if (msg)
        snprintf(msg, msgsz, "%s", e.msg);
    return rc;
}

/* Every text in yes is accepted, every one in no refused. NULL-terminated lists. */
static void check(const gr_grammar *g, const char *const *yes, const char *const *no) {
    for (int i = 0; yes && yes[i]; i++)
        if (!accepts(g, yes[i]))
            fail_msg("refused %s", yes[i]);
    for (int i = 0; no && no[i]; i++)
        if (accepts(g, no[i]))
            fail_msg("accepted %s", no[i]);
}

static void check_schema(const char *s, const char *const *yes, const char *const *no) {
    gr_grammar *g = schema(s);
    check(g, yes, no);
    gr_free(g);
}

#define L(...) ((const char *const[]){__VA_ARGS__, NULL})

/* ---- front ends ----------------------------------------------------------------------------- */

static void test_regex_subset(void **st) {
    (void)st;
    struct {
        const char *re;
        const char *const *yes, *const *no;
    } cases[] = {
        {"a[0-9]+(b|c)?", L("a1", "a12b", "a0c"), L("a", "ab", "a1bc", "")},
        {"\\d{2,3}-\\w*", L("12-", "123-ab_9"), L("1-", "1234-", "12-!")},
        {"[^a-c]x", L("dx", "\xc3\xa9x"), L("ax", "x")},
        {"(?:ab|cd){2}", L("abcd", "cdcd"), L("ab", "abcdab")},
        {"^.\\s?$", L("\xe2\x82\xac", "a ", "b\t"), L("\n", "ab")},
        {"[\\u00e0-\\u00ff]+", L("\xc3\xa0\xc3\xbf"), L("a", "\xc3\x9f")},
        {"x*?y+?", L("y", "xxyy"), L("x")},
        {"(a|b)*c{0}", L("", "abab"), L("c")},
        {"\\.\\*\\\\", L(".*\\"), L("a*\\")},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        gr_grammar *g = NULL;
        md_err e = {0};
        if (gr_from_regex(cases[i].re, strlen(cases[i].re), &g, &e))
            fail_msg("regex %s: %s", cases[i].re, e.msg);
        check(g, cases[i].yes, cases[i].no);
        gr_free(g);
    }
}

static void test_regex_refuses_beyond_the_subset(void **st) {
    (void)st;
    const char *bad[] = {"(?=a)b",  "(?!a)", "(?<=a)b",     "(a)\\1",
                         "\\bword", "a++",   "[[:alpha:]]", "\\p{L}"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        gr_grammar *g = NULL;
        md_err e = {0};
        assert_int_equal(gr_from_regex(bad[i], strlen(bad[i]), &g, &e), MD_EUNSUPP);
        assert_null(g);
        assert_non_null(strstr(e.msg, "regex at offset"));
    }
    const char *wrong[] = {"(ab", "ab)", "[a-", "a{3,1}", "*a", "[z-a]"};
    for (size_t i = 0; i < sizeof wrong / sizeof wrong[0]; i++) {
        gr_grammar *g = NULL;
        md_err e = {0};
        assert_int_equal(gr_from_regex(wrong[i], strlen(wrong[i]), &g, &e), MD_EINVAL);
    }
}

static void test_choice_and_ebnf(void **st) {
    (void)st;
    const char *ch[] = {"positive", "negative", "neutral", "pos"};
    size_t cl[] = {8, 8, 7, 3};
    gr_grammar *g = NULL;
    md_err e = {0};
    assert_int_equal(gr_from_choice(ch, cl, 4, &g, &e), 0);
    check(g, L("positive", "pos", "neutral"), L("posi", "", "negative "));
    gr_free(g);

    const char *eb = "# a list of numbers or a word\n"
                     "root ::= \"[\" (num (\",\" num)*)? \"]\" | word\n"
                     "num  ::= \"-\"? [0-9]+ (\".\" [0-9]{1,2})?\n"
                     "word ::= [a-z]+ \"\\u00e9\"?\n";
    assert_int_equal(gr_from_ebnf(eb, strlen(eb), &g, &e), 0);
    check(g, L("[]", "[1,-2.5,3.25]", "abc", "caf\xc3\xa9"), L("[1,]", "[1.234]", "ABC", "["));
    gr_free(g);

    const char *lr = "root ::= root \"a\" | \"b\"";
    assert_int_equal(gr_from_ebnf(lr, strlen(lr), &g, &e), MD_EUNSUPP);
    assert_non_null(strstr(e.msg, "left-recursive"));
    const char *undef = "root ::= missing";
    assert_int_equal(gr_from_ebnf(undef, strlen(undef), &g, &e), MD_EINVAL);
    assert_non_null(strstr(e.msg, "missing"));
    const char *noroot = "a ::= \"x\"";
    assert_int_equal(gr_from_ebnf(noroot, strlen(noroot), &g, &e), MD_EINVAL);
}

/* ---- JSON Schema keywords ---------------------------------------------------------------------
 */

static void test_schema_types_and_unions(void **st) {
    (void)st;
    check_schema("{\"type\":\"string\"}", L("\"\"", "\"a\\\"b\\u00e9\"", "\"\xc3\xa9\""),
                 L("a", "\"\n\"", "\"\\x\"", "\"\xc3\""));
    check_schema("{\"type\":\"number\"}", L("0", "-1.5", "1e+30", "2.5E-3"),
                 L("01", "1.", ".5", "+1", "- 1"));
    check_schema("{\"type\":\"integer\"}", L("0", "-12", "9007199254740993"), L("1.5", "-", "00"));
    check_schema("{\"type\":[\"string\",\"null\"]}", L("null", "\"x\""), L("1", "nul"));
    check_schema("{\"type\":\"boolean\"}", L("true", "false"), L("null", "1"));
    check_schema("{}", L("1", "{\"a\":[null,true]}", "\"s\""), L("", "{a:1}"));
    check_schema("{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"object\",\"properties\":"
                 "{\"x\":{\"type\":\"string\"}},\"required\":[\"x\"],"
                 "\"additionalProperties\":false}]}",
                 L("5", "{\"x\":\"y\"}"), L("{}", "\"5\""));
    check_schema("{\"oneOf\":[{\"type\":\"string\"},{\"type\":\"boolean\"}]}", L("\"a\"", "true"),
                 L("1"));
}

static void test_schema_objects(void **st) {
    (void)st;
    const char *s = "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},"
                    "\"age\":{\"type\":\"integer\"}},\"required\":[\"name\",\"age\"],"
                    "\"additionalProperties\":false}";
    check_schema(s, L("{\"name\":\"Jo\",\"age\":30}"),
                 L("{\"age\":30,\"name\":\"Jo\"}", "{\"name\":\"Jo\"}",
                   "{\"name\":\"Jo\",\"age\":30,"
                   "\"x\":1}",
                   "{ \"name\":\"Jo\",\"age\":30}"));
    /* optional properties: any subset, in schema order, commas right */
    check_schema(
        "{\"properties\":{\"a\":{\"const\":1},\"b\":{\"const\":2},\"c\":{\"const\":3}},"
        "\"additionalProperties\":false}",
        L("{}", "{\"a\":1}", "{\"b\":2}", "{\"a\":1,\"c\":3}", "{\"a\":1,\"b\":2,\"c\":3}"),
        L("{,\"b\":2}", "{\"a\":1,}", "{\"b\":2,\"a\":1}", "{\"a\":2}"));
    /* additional properties: after the named ones, never repeating a name */
    check_schema("{\"properties\":{\"a\":{\"type\":\"integer\"}},"
                 "\"additionalProperties\":{\"type\":\"boolean\"}}",
                 L("{\"a\":1,\"b\":true}", "{\"ab\":false}", "{\"\":true}", "{\"\xc3\xa9\":true}"),
                 L("{\"a\":true}", "{\"b\":1}", "{\"b\":true,\"a\":1}"));
    /* required names that properties lacks */
    check_schema("{\"required\":[\"id\"]}", L("{\"id\":[1]}", "{\"id\":1,\"x\":2}"),
                 L("{}", "{\"x\":1}"));
    /* many optional properties (rules instead of inlining) */
    check_schema("{\"properties\":{\"a\":{},\"b\":{},\"c\":{},\"d\":{},\"e\":{},\"f\":{},"
                 "\"g\":{},\"h\":{}},\"additionalProperties\":false}",
                 L("{}", "{\"h\":1}", "{\"a\":1,\"d\":2,\"h\":3}"), L("{\"h\":1,\"a\":1}"));
    check_schema("{\"type\":\"object\",\"maxProperties\":0}", L("{}"), L("{\"a\":1}"));
}

static void test_schema_arrays(void **st) {
    (void)st;
    check_schema("{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":1,"
                 "\"maxItems\":3}",
                 L("[1]", "[1,2,3]"), L("[]", "[1,2,3,4]", "[1,]", "[\"a\"]"));
    check_schema("{\"prefixItems\":[{\"type\":\"string\"},{\"type\":\"integer\"}],"
                 "\"items\":false}",
                 L("[]", "[\"a\"]", "[\"a\",1]"), L("[1]", "[\"a\",1,2]"));
    check_schema("{\"prefixItems\":[{\"type\":\"string\"}],\"items\":{\"type\":\"null\"},"
                 "\"minItems\":2}",
                 L("[\"a\",null]", "[\"a\",null,null]"), L("[\"a\"]", "[]"));
    check_schema("{\"type\":\"array\"}", L("[]", "[1,\"a\",[{}]]"), L("[", "[1 ,2]"));
}

static void test_schema_strings(void **st) {
    (void)st;
    check_schema("{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}",
                 L("\"ab\"", "\"a\xc3\xa9\"", "\"abc\"", "\"a\\n\""), L("\"a\"", "\"abcd\""));
    check_schema("{\"type\":\"string\",\"pattern\":\"^[A-Z]{2}-\\\\d+$\"}", L("\"AB-12\""),
                 L("\"AB-\"", "\"xAB-1\""));
    /* patterns search unless anchored */
    check_schema("{\"type\":\"string\",\"pattern\":\"ab\"}", L("\"xxabyy\"", "\"ab\""),
                 L("\"a b\""));
    check_schema("{\"type\":\"string\",\"pattern\":\"q\\\"\"}", L("\"q\\\"\""), L("\"q\""));
    struct {
        const char *fmt;
        const char *const *yes, *const *no;
    } f[] = {
        {"date", L("\"2024-02-29\""), L("\"2024-2-29\"", "\"2024-13-01\"")},
        {"time", L("\"23:59:60Z\"", "\"08:30:00.5+02:00\""), L("\"24:00:00Z\"", "\"08:30\"")},
        {"date-time", L("\"2024-01-01T00:00:00Z\""), L("\"2024-01-01 00:00:00Z\"")},
        {"email", L("\"a.b+c@ex-ample.org\""), L("\"a@b\"", "\"@x.org\"")},
        {"uuid", L("\"123e4567-e89b-12d3-a456-426614174000\""), L("\"123e4567e89b\"")},
        {"ipv4", L("\"192.168.0.255\""), L("\"256.1.1.1\"", "\"01.1.1.1\"")},
        {"uri", L("\"https://example.org/a?b=c#d\""), L("\"no scheme\"", "\"http://a b\"")},
    };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        char s[128];
        snprintf(s, sizeof s, "{\"type\":\"string\",\"format\":\"%s\"}", f[i].fmt);
        check_schema(s, f[i].yes, f[i].no);
    }
}

static void test_schema_integer_bounds_exact(void **st) {
    (void)st;
    static const long long b[][2] = {{-15, 123}, {0, 9},       {7, 7}, {-1000, -999},
                                     {95, 1005}, {1, 1000000}, {-9, 0}};
    for (size_t i = 0; i < sizeof b / sizeof b[0]; i++) {
        char s[128];
        snprintf(s, sizeof s, "{\"type\":\"integer\",\"minimum\":%lld,\"maximum\":%lld}", b[i][0],
                 b[i][1]);
        gr_grammar *g = schema(s);
        for (long long x = b[i][0] - 150; x <= b[i][1] + 150; x++) {
            if (x > b[i][0] + 2000 && x < b[i][1] - 2000)
                x = b[i][1] - 2000; /* every value near both ends; skip a huge middle */
            char t[32];
            snprintf(t, sizeof t, "%lld", x);
            int want = x >= b[i][0] && x <= b[i][1];
            if (accepts(g, t) != want)
                fail_msg("[%lld,%lld]: %s %s", b[i][0], b[i][1], t, want ? "refused" : "accepted");
        }
        gr_free(g);
    }
    check_schema("{\"type\":\"integer\",\"exclusiveMinimum\":1.5,\"exclusiveMaximum\":4}",
                 L("2", "3"), L("1", "4"));
    check_schema("{\"type\":\"integer\",\"minimum\":10}", L("10", "99999999999999999999999"),
                 L("9", "-10"));
    check_schema("{\"type\":\"integer\",\"maximum\":-3}", L("-3", "-100000"), L("-2", "0"));
}

static void test_schema_enum_const_refs(void **st) {
    (void)st;
    check_schema("{\"enum\":[\"red\",\"green\",1.5,null,{\"k\":[1]}]}",
                 L("\"red\"", "1.5", "null", "{\"k\":[1]}"), L("\"blue\"", "1.50", "{\"k\":[2]}"));
    check_schema("{\"type\":\"string\",\"enum\":[\"a\",1]}", L("\"a\""), L("1"));
    check_schema("{\"const\":\"a\\nb\"}", L("\"a\\nb\""), L("\"ab\""));
    /* recursion through $defs */
    check_schema("{\"$defs\":{\"t\":{\"type\":\"object\",\"properties\":{\"kids\":{\"type\":"
                 "\"array\",\"items\":{\"$ref\":\"#/$defs/t\"}}},\"required\":[\"kids\"],"
                 "\"additionalProperties\":false}},\"$ref\":\"#/$defs/t\"}",
                 L("{\"kids\":[]}", "{\"kids\":[{\"kids\":[]},{\"kids\":[{\"kids\":[]}]}]}"),
                 L("{}", "{\"kids\":[{}]}"));
    /* allOf merged; additionalProperties does not see a sibling's properties */
    check_schema("{\"allOf\":[{\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]},"
                 "{\"properties\":{\"b\":{\"type\":\"string\"}},\"required\":[\"b\"]}]}",
                 L("{\"a\":1,\"b\":\"x\"}"),
                 L("{\"a\":1}", "{\"b\":\"x\"}", "{\"a\":\"s\",\"b\":\"x\"}"));
    char msg[512];
    assert_int_equal(schema_err("{\"allOf\":[{\"properties\":{\"a\":{}}}],"
                                "\"additionalProperties\":false}",
                                1, msg, sizeof msg, NULL, 0),
                     MD_EUNSUPP);
    assert_non_null(strstr(msg, "'allOf' at /allOf"));
}

static void test_schema_errors_name_keyword_and_pointer(void **st) {
    (void)st;
    char msg[512], rel[256];
    assert_int_equal(schema_err("{\"properties\":{\"id\":{\"type\":\"string\",\"pattern\":"
                                "\"(?=x)\"}}}",
                                1, msg, sizeof msg, NULL, 0),
                     MD_EUNSUPP);
    assert_non_null(strstr(msg, "'pattern' at /properties/id"));
    assert_int_equal(
        schema_err("{\"$ref\":\"https://example.org/s.json\"}", 1, msg, sizeof msg, NULL, 0),
        MD_EUNSUPP);
    assert_non_null(strstr(msg, "remote"));
    assert_int_equal(schema_err("{\"items\":{\"uniqueItems\":true}}", 1, msg, sizeof msg, NULL, 0),
                     MD_EUNSUPP);
    assert_non_null(strstr(msg, "'uniqueItems' at /items"));
    assert_int_equal(schema_err("{\"type\":\"strin\"}", 1, msg, sizeof msg, NULL, 0), MD_EINVAL);
    assert_int_equal(schema_err("{\"$ref\":\"#/$defs/nope\"}", 1, msg, sizeof msg, NULL, 0),
                     MD_EINVAL);
    /* relaxed: compiled, the keywords listed */
    assert_int_equal(schema_err("{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"string\","
                                "\"format\":\"hostname-idn\"}},\"patternProperties\":{}}",
                                0, msg, sizeof msg, rel, sizeof rel),
                     0);
    assert_non_null(strstr(rel, "format at /properties/x"));
    assert_non_null(strstr(rel, "patternProperties at /"));
}

/* ---- masks ---------------------------------------------------------------------------------- */

/* A small vocabulary with single bytes, JSON-ish multi-terminal pieces and split UTF-8. */
typedef struct {
    int n;
    char *tok[600];
    uint32_t len[600];
    gr_vocab *v;
} tvocab;

static void tv_add(tvocab *t, const char *s, size_t n) {
    t->tok[t->n] = malloc(n + 1);
    memcpy(t->tok[t->n], s, n);
    t->len[t->n++] = (uint32_t)n;
}

static void tv_build(tvocab *t, unsigned seed) {
    memset(t, 0, sizeof *t);
    for (int c = 0x20; c < 0x7f; c++) {
        char b = (char)c;
        tv_add(t, &b, 1);
    }
    const char *pieces[] = {
        "{\"",    "\":",      "\",",      "\"}",      "\":\"",  ",\"",      "true", "null",
        "false",  "12",       "3.",       ".5",       "e+",     "\xc3\xa9", "\xc3", "\xa9",
        "a\xe2",  "\x82\xac", "\xe2\x82", "\"}]",     "},{\"",  "\":[",     "]}",   "\\n",
        "\\\"",   "\\u00",    "name",     "age",      "\":{\"", "\"},",     "\n",   "00",
        "-1",     "2024-",    "T12",      ":00Z",     "\"a\"",  "ab",       "cd",   "posit",
        "ive",    "neg",      "ative",    "[1",       ",2]",    "\x01",     "\xff", "kids",
        "\":[]}", "\":1",     "\":true",  "\":\"x\"", "xyz\"",  "1,\"",     "5}",   "@ex",
        ".org"};
    for (size_t i = 0; i < sizeof pieces / sizeof pieces[0]; i++)
        tv_add(t, pieces[i], strlen(pieces[i]));
    /* random concatenations of the above */
    srand(seed);
    int base = t->n;
    for (int i = 0; i < 150; i++) {
        char buf[16];
        int a = rand() % base, b = rand() % base;
        if (t->len[a] + t->len[b] >= sizeof buf)
            continue;
        memcpy(buf, t->tok[a], t->len[a]);
        memcpy(buf + t->len[a], t->tok[b], t->len[b]);
        tv_add(t, buf, t->len[a] + t->len[b]);
    }
    tv_add(t, "x", 1); /* a duplicate of a single byte: both ids must agree */
    tv_add(t, "", 0);  /* a control token: never allowed */
    tv_add(t, "", 0);  /* the end token */
    int32_t eos = t->n - 1;
    md_err e = {0};
    assert_int_equal(gr_vocab_new(t->n, (const char *const *)t->tok, t->len, &eos, 1, &t->v, &e),
                     0);
}

static void tv_free(tvocab *t) {
    gr_vocab_free(t->v);
    for (int i = 0; i < t->n; i++)
        free(t->tok[i]);
}

/* Walk: at each step the cached mask, the uncached walk and brute force (a fresh matcher per
 * token replaying the history) agree; then a masked token is drawn. Returns the text when
 * the walk ended with the end token, else NULL. */
static char *walk(const gr_grammar *g, tvocab *t, unsigned seed, int steps, int check_every) {
    gr_matcher *m;
    md_err e = {0};
    assert_int_equal(gr_matcher_new(g, t->v, &m, &e), 0);
    int words = (t->n + 31) / 32;
    uint32_t mask[32], slow[32];
    int32_t hist[512];
    int nh = 0;
    char *text = calloc(1, 8192);
    size_t tl = 0;
    srand(seed);
    int eos = t->n - 1;
    for (int s = 0; s < steps; s++) {
        gr_matcher_fill_mask(m, mask);
        gr_matcher_fill_mask_slow(m, slow);
        for (int w = 0; w < words; w++)
            if (mask[w] != slow[w])
                fail_msg("step %d: cached and uncached masks differ in word %d", s, w);
        if (s % check_every == 0 && s < 64) {
            for (int tok = 0; tok < t->n; tok++) {
                gr_matcher *b;
                assert_int_equal(gr_matcher_new(g, t->v, &b, &e), 0);
                for (int i = 0; i < nh; i++)
                    assert_int_equal(gr_matcher_accept(b, hist[i]), 0);
                int ok = gr_matcher_accept(b, tok) == 0;
                gr_matcher_free(b);
                int bit = (mask[tok >> 5] >> (tok & 31)) & 1;
                if (ok != bit)
                    fail_msg("step %d after \"%.*s\": token %d \"%.*s\": mask %d, brute force %d",
                             s, (int)tl, text, tok, (int)t->len[tok], t->tok[tok], bit, ok);
            }
        }
        int cand[600], nc = 0;
        for (int tok = 0; tok < t->n; tok++)
            if ((mask[tok >> 5] >> (tok & 31)) & 1)
                cand[nc++] = tok;
        assert_true(nc > 0); /* a live state always has a way on */
        assert_int_equal(gr_matcher_must_end(m), nc == 1 && cand[0] == eos);
        int pick = cand[rand() % nc];
        /* Drift towards the end: prefer the end token, and closing brackets. */
        if ((mask[eos >> 5] >> (eos & 31)) & 1 && (rand() % 3 == 0 || s > steps - 40))
            pick = eos;
        else if (s > steps / 2)
            for (int i = 0; i < nc; i++)
                if (t->len[cand[i]] && strchr("]}\"", t->tok[cand[i]][0]) && rand() % 2) {
                    pick = cand[i];
                    break;
                }
        assert_int_equal(gr_matcher_accept(m, pick), 0);
        if (pick == eos) {
            gr_matcher_fill_mask(m, mask);
            for (int w = 0; w < words; w++)
                assert_int_equal(mask[w], 0);
            gr_matcher_free(m);
            return text;
        }
        if (nh < 512)
            hist[nh++] = pick;
        if (tl + t->len[pick] < 8191) {
            memcpy(text + tl, t->tok[pick], t->len[pick]);
            tl += t->len[pick];
        }
    }
    gr_matcher_free(m);
    free(text);
    return NULL;
}

static void test_masks_match_brute_force(void **st) {
    (void)st;
    const char *schemas[] = {
        "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":"
        "\"integer\",\"minimum\":0,\"maximum\":120}},\"required\":[\"name\",\"age\"],"
        "\"additionalProperties\":false}",
        "{\"type\":\"array\",\"items\":{\"type\":\"number\"}}",
        "{\"$defs\":{\"t\":{\"type\":\"object\",\"properties\":{\"kids\":{\"type\":\"array\","
        "\"items\":{\"$ref\":\"#/$defs/t\"}}},\"required\":[\"kids\"],\"additionalProperties\":"
        "false}},\"$ref\":\"#/$defs/t\"}",
        "{\"type\":\"object\"}",
        "{\"enum\":[\"positive\",\"negative\",\"neutral\"]}",
        "{\"type\":\"string\",\"format\":\"date-time\"}",
        "{\"type\":\"string\",\"pattern\":\"^\\u00e9+a?$\"}",
    };
    tvocab t;
    tv_build(&t, 7);
    for (size_t i = 0; i < sizeof schemas / sizeof schemas[0]; i++) {
        gr_grammar *g = schema(schemas[i]);
        int ended = 0;
        for (unsigned seed = 1; seed <= 4; seed++) {
            char *text = walk(g, &t, seed * 31 + (unsigned)i, 100, 4);
            if (text) {
                ended++;
                if (!accepts(g, text))
                    fail_msg("schema %zu: walk produced \"%s\" which the grammar refuses", i, text);
                /* JSON grammars produce JSON */
                json_error_t je;
                json_t *j = json_loads(text, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
                /* jansson refuses 1e999 and NUL in keys, which JSON allows */
                if (!j && !strstr(je.text, "overflow") && !strstr(je.text, "NUL"))
                    fail_msg("schema %zu: walk produced invalid JSON \"%s\": %s", i, text, je.text);
                json_decref(j);
                free(text);
            }
        }
        assert_true(ended > 0);
        gr_free(g);
    }
    /* regex, choice and EBNF grammars too */
    gr_grammar *g = NULL;
    md_err e = {0};
    const char *re = "(ab|cd)*[0-9]{1,3}";
    assert_int_equal(gr_from_regex(re, strlen(re), &g, &e), 0);
    for (unsigned seed = 1; seed <= 4; seed++)
        free(walk(g, &t, seed, 60, 1));
    gr_free(g);
    const char *ch[] = {"positive", "negative", "pos"};
    size_t cl[] = {8, 8, 3};
    assert_int_equal(gr_from_choice(ch, cl, 3, &g, &e), 0);
    for (unsigned seed = 1; seed <= 4; seed++)
        free(walk(g, &t, seed, 30, 1));
    gr_free(g);
    tv_free(&t);
}

/* Several threads share one grammar and vocabulary; cache entries are computed lazily by
 * whichever thread needs them first. Each thread's cached masks equal its uncached ones. */
typedef struct {
    const gr_grammar *g;
    tvocab *t;
    unsigned seed;
    int bad;
} thr_arg;

static void *thr_walk(void *p) {
    thr_arg *a = p;
    gr_matcher *m;
    md_err e = {0};
    if (gr_matcher_new(a->g, a->t->v, &m, &e)) {
        a->bad = 1;
        return NULL;
    }
    uint32_t mask[32], slow[32];
    int words = (a->t->n + 31) / 32;
    unsigned r = a->seed;
    for (int s = 0; s < 200; s++) {
        gr_matcher_fill_mask(m, mask);
        gr_matcher_fill_mask_slow(m, slow);
        if (memcmp(mask, slow, sizeof(uint32_t) * (size_t)words))
            a->bad = 1;
        int cand[600], nc = 0;
        for (int tok = 0; tok < a->t->n; tok++)
            if ((mask[tok >> 5] >> (tok & 31)) & 1)
                cand[nc++] = tok;
        if (!nc)
            break;
        r = r * 1103515245u + 12345u;
        int pick = cand[(r >> 8) % (unsigned)nc];
        if (pick == a->t->n - 1)
            break;
        if (gr_matcher_accept(m, pick))
            a->bad = 1;
    }
    gr_matcher_free(m);
    return NULL;
}

static void test_shared_grammar_threads(void **st) {
    (void)st;
    tvocab t;
    tv_build(&t, 11);
    gr_grammar *g = schema("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"array\","
                           "\"items\":{\"type\":\"number\"}},\"b\":{\"type\":\"string\"}}}");
    pthread_t th[4];
    thr_arg args[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (thr_arg){g, &t, (unsigned)i * 7919u + 1u, 0};
        assert_int_equal(pthread_create(&th[i], NULL, thr_walk, &args[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(args[i].bad, 0);
    }
    gr_free(g);
    tv_free(&t);
}

static void test_vocab_edge_cases(void **st) {
    (void)st;
    gr_vocab *v = NULL;
    md_err e = {0};
    const char *tok[] = {"a", "b"};
    uint32_t len[] = {1, 1};
    int32_t bad = 5;
    assert_int_equal(gr_vocab_new(2, tok, len, &bad, 1, &v, &e), MD_EINVAL);
    assert_int_equal(gr_vocab_new(0, tok, len, NULL, 0, &v, &e), MD_EINVAL);
    int32_t eos = 1;
    assert_int_equal(gr_vocab_new(2, tok, len, &eos, 1, &v, &e), 0);
    assert_int_equal(gr_vocab_size(v), 2);
    gr_grammar *g;
    assert_int_equal(gr_from_regex("a*", 2, &g, &e), 0);
    gr_matcher *m;
    assert_int_equal(gr_matcher_new(g, v, &m, &e), 0);
    assert_true(gr_matcher_can_end(m));
    assert_false(gr_matcher_must_end(m));
    assert_int_equal(gr_matcher_accept(m, 7), MD_EINVAL);
    assert_int_equal(gr_matcher_accept(m, -1), MD_EINVAL);
    assert_int_equal(gr_matcher_accept(m, 0), 0);
    assert_int_equal(gr_matcher_accept(m, 1), 0); /* end */
    assert_int_equal(gr_matcher_accept(m, 0), MD_EINVAL);
    gr_matcher_free(m);
    /* must_end: a fixed string, complete */
    gr_free(g);
    assert_int_equal(gr_from_regex("a", 1, &g, &e), 0);
    assert_int_equal(gr_matcher_new(g, v, &m, &e), 0);
    assert_false(gr_matcher_can_end(m));
    assert_int_equal(gr_matcher_accept(m, 1), MD_EINVAL); /* end not allowed yet */
    assert_int_equal(gr_matcher_accept(m, 0), 0);
    assert_true(gr_matcher_must_end(m));
    uint32_t mask[1];
    gr_matcher_fill_mask(m, mask);
    assert_int_equal(mask[0], 2u);
    gr_matcher_free(m);
    gr_free(g);
    gr_vocab_free(v);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_regex_subset),
        cmocka_unit_test(test_regex_refuses_beyond_the_subset),
        cmocka_unit_test(test_choice_and_ebnf),
        cmocka_unit_test(test_schema_types_and_unions),
        cmocka_unit_test(test_schema_objects),
        cmocka_unit_test(test_schema_arrays),
        cmocka_unit_test(test_schema_strings),
        cmocka_unit_test(test_schema_integer_bounds_exact),
        cmocka_unit_test(test_schema_enum_const_refs),
        cmocka_unit_test(test_schema_errors_name_keyword_and_pointer),
        cmocka_unit_test(test_masks_match_brute_force),
        cmocka_unit_test(test_shared_grammar_threads),
        cmocka_unit_test(test_vocab_edge_cases),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
