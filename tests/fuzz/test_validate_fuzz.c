/* test_validate_fuzz.c — mutated input lines through what a worker does with a line before
 * any model sees it: q_validate (queue/validate.c), then, when it passes, the constraint
 * compiled through the grammar cache (worker/grammars.c) and, when that passes, a matcher's
 * first masks over a small vocabulary.
 *
 * Seeds: lines with response_format json_schema ($defs, recursion, anyOf, patterns, formats,
 * enums), json_object, tools with tool_choice required / named, medley regex / choice /
 * grammar, logit_bias, tool turns. Mutations: bit flips, byte changes, truncation, a slice
 * duplicated, and JSON fragments spliced in ("{\"$ref\":\"#\"}", "[[[[", "{\"anyOf\":[",
 * "\"pattern\":\"(a+)+\"", deep nesting...). Every buffer is a malloc of its exact size (ASan
 * sees a read past it). A line must be accepted or refused with a code, a message and status
 * 400 (500 only for out of memory), and each line must finish within 2 s.
 *
 * MEDLEY_FUZZ_ITERS scales the rounds (default 3000); the seed is fixed so a failure
 * reproduces; MEDLEY_FUZZ_SEED overrides it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "common/util.h"
#include "engine/grammar/grammar.h"
#include "worker/grammars.h"

static uint64_t rng_state;

static uint64_t rnd(void) { /* splitmix64 */
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}
static size_t rnd_below(size_t n) {
    return n ? (size_t)(rnd() % n) : 0;
}

#define HEAD "{\"custom_id\":\"f\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{"
#define MSG "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]"

static const char *seeds[] = {
    HEAD MSG
    ",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"p\","
    "\"strict\":true,\"schema\":{\"type\":\"object\",\"properties\":{\"name\":{\"type\":"
    "\"string\",\"maxLength\":8},\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":"
    "120},\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"b\"]},\"maxItems\":3}},"
    "\"required\":[\"name\",\"age\"],\"additionalProperties\":false}}}}}",
    HEAD MSG ",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"t\","
             "\"strict\":false,\"schema\":{\"$defs\":{\"n\":{\"type\":\"object\",\"properties\":{"
             "\"v\":{\"type\":[\"integer\",\"null\"]},\"kids\":{\"type\":\"array\",\"items\":{"
             "\"$ref\":\"#/$defs/n\"}}}}},\"$ref\":\"#/$defs/n\"}}}}}",
    HEAD MSG
    ",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"u\","
    "\"schema\":{\"anyOf\":[{\"type\":\"object\",\"properties\":{\"ok\":{\"const\":true}}},"
    "{\"type\":\"string\",\"pattern\":\"^[a-z]{2,4}-[0-9]+$\",\"format\":\"date\"}]}}}}}",
    HEAD MSG
    ",\"response_format\":{\"type\":\"json_object\"},\"logit_bias\":{\"5\":-100,\"7\":3}}}",
    HEAD MSG ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"strict\":true,"
             "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},"
             "\"required\":[\"city\"],\"additionalProperties\":false}}},{\"type\":\"function\","
             "\"function\":{\"name\":\"g\"}}],\"tool_choice\":\"required\"}}",
    HEAD MSG ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{"
             "\"$defs\":{\"x\":{\"type\":\"integer\"}},\"type\":\"object\",\"properties\":{\"a\":{"
             "\"$ref\":\"#/$defs/x\"}}}}}],\"tool_choice\":{\"type\":\"function\",\"function\":{"
             "\"name\":\"f\"}}}}",
    HEAD MSG ",\"medley\":{\"regex\":\"(yes|no|[0-9]{1,3}(\\\\.[0-9]+)?)\"}}}",
    HEAD MSG ",\"medley\":{\"choice\":[\"positive\",\"negative\",\"neutral\"]}}}",
    HEAD MSG ",\"medley\":{\"grammar\":\"root ::= \\\"a\\\" b | \\\"c\\\"\\nb ::= [0-9]+\"}}}",
    HEAD "\"messages\":[{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c\","
         "\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]},{\"role\":\"tool\","
         "\"tool_call_id\":\"c\",\"content\":\"ok\"}],\"n\":1,\"stream\":false}}",
};

static const char *frags[] = {
    "{\"$ref\":\"#\"}",
    "[[[[[[",
    "{\"anyOf\":[",
    "\"pattern\":\"(a+)+$\"",
    "{\"enum\":[1,2,3]}",
    "\"$defs\":{\"a\":{\"$ref\":\"#/$defs/a\"}}",
    "\"type\":[\"null\",\"string\"]",
    "\\u0000",
    "{\"allOf\":[{},{}]}",
    "\"minItems\":99999999",
    "\"maxLength\":-1",
    "\"format\":\"uuid\"",
    "\"additionalProperties\":{\"type\":\"integer\"}",
    "\"prefixItems\":[{},{}]",
    "9e999",
    "\"pattern\":\"[\"",
    "\"$ref\":\"#/$defs/\"",
    "{\"not\":{}}",
    ",",
    ":",
    "\"",
    "}",
    "]",
};

/* tokens of the test vocabulary: enough to start most constraints' outputs */
static const char *vocab_toks[] = {"{", "}", "[",    "]",         "\"",   ":",   ",",
                                   "a", "0", "1",    "true",      "null", "yes", "no",
                                   "-", " ", "name", "\"name\":", ""};

/* JSON-level mutations keep the line parsable so they reach the schema compiler: a keyword
 * set on a random object to a random value, a key deleted, a value appended to an array. */
static const char *keys[] = {"type",      "properties",  "items",       "$ref",
                             "anyOf",     "oneOf",       "allOf",       "enum",
                             "const",     "pattern",     "minimum",     "maximum",
                             "maxLength", "minLength",   "required",    "additionalProperties",
                             "format",    "$defs",       "prefixItems", "minItems",
                             "maxItems",  "not",         "strict",      "choice",
                             "regex",     "tool_choice", "logit_bias"};
static const char *values[] = {"\"string\"",
                               "\"integer\"",
                               "[\"integer\",\"null\"]",
                               "{\"$ref\":\"#\"}",
                               "{\"type\":\"object\"}",
                               "[{},{\"type\":\"string\"}]",
                               "\"^(a|b)*c{2,5}$\"",
                               "-1",
                               "1e308",
                               "true",
                               "false",
                               "{}",
                               "[]",
                               "\"#/$defs/a\"",
                               "[\"a\",\"b\"]",
                               "\"date-time\"",
                               "0",
                               "3",
                               "{\"a\":{\"$ref\":\"#/properties/a\"}}",
                               "\"required\"",
                               "null",
                               "\"(a+)+b\"",
                               "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]",
                               "\"\\\\d{1,3}\""};

static void collect(json_t *v, json_t **nodes, int *n, int depth) {
    if (*n >= 256 || depth > 64 || !(json_is_object(v) || json_is_array(v)))
        return;
    nodes[(*n)++] = v;
    if (json_is_object(v)) {
        const char *k;
        json_t *x;
        json_object_foreach(v, k, x) collect(x, nodes, n, depth + 1);
    } else {
        size_t i;
        json_t *x;
        json_array_foreach(v, i, x) collect(x, nodes, n, depth + 1);
    }
}

static char *mutate_json(const char *seed, size_t *len) {
    json_error_t err;
    json_t *root = json_loads(seed, 0, &err);
    if (!root)
        fail_msg("seed %s: %s", seed, err.text);
    int rounds = 1 + (int)rnd_below(3);
    for (int r = 0; r < rounds; r++) {
        json_t *nodes[256];
        int n = 0;
        collect(root, nodes, &n, 0);
        json_t *at = nodes[rnd_below((size_t)n)];
        json_t *val =
            json_loads(values[rnd_below(sizeof values / sizeof values[0])], JSON_DECODE_ANY, NULL);
        assert_non_null(val);
        if (json_is_array(at)) {
            json_array_append_new(at, val);
        } else if (rnd_below(4) == 0 && json_object_size(at)) {
            json_decref(val);
            void *iter = json_object_iter(at);
            for (size_t k = rnd_below(json_object_size(at)); k > 0; k--)
                iter = json_object_iter_next(at, iter);
            json_object_del(at, json_object_iter_key(iter));
        } else {
            json_object_set_new(at, keys[rnd_below(sizeof keys / sizeof keys[0])], val);
        }
    }
    char *txt = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    *len = strlen(txt);
    char *exact = malloc(*len ? *len : 1);
    memcpy(exact, txt, *len);
    free(txt);
    return exact;
}

static char *mutate(const char *seed, size_t *len) {
    if (rnd_below(3))
        return mutate_json(seed, len);
    size_t n = strlen(seed), cap = 2 * n + 256;
    char *b = malloc(cap);
    memcpy(b, seed, n);
    int rounds = 1 + (int)rnd_below(4);
    for (int r = 0; r < rounds; r++) {
        switch (rnd_below(6)) {
        case 0:
            if (n)
                b[rnd_below(n)] ^= (char)(1u << rnd_below(8));
            break;
        case 1:
            if (n)
                b[rnd_below(n)] = (char)rnd_below(256);
            break;
        case 2: n = rnd_below(n + 1); break;
        case 3: { /* a slice duplicated in place */
            size_t a = rnd_below(n + 1), l = rnd_below(n - a + 1);
            if (l > cap - n)
                l = cap - n;
            memmove(b + a + l, b + a, n - a);
            n += l;
            break;
        }
        default: { /* a fragment spliced in */
            const char *f = frags[rnd_below(sizeof frags / sizeof frags[0])];
            size_t fl = strlen(f), at = rnd_below(n + 1);
            if (fl > cap - n)
                break;
            memmove(b + at + fl, b + at, n - at);
            memcpy(b + at, f, fl);
            n += fl;
            break;
        }
        }
    }
    char *exact = malloc(n ? n : 1); /* ASan: exactly n bytes, no NUL after them */
    memcpy(exact, b, n);
    free(b);
    *len = n;
    return exact;
}

static void mutated_lines_are_accepted_or_refused_by_name(void **st) {
    (void)st;
    const char *s = getenv("MEDLEY_FUZZ_SEED");
    rng_state = s ? strtoull(s, NULL, 10) : 36;
    const char *it = getenv("MEDLEY_FUZZ_ITERS");
    int iters = it ? atoi(it) : 3000;
    q_limits lim;
    q_limits_default(&lim);
    wk_grammars *c;
    assert_int_equal(wk_grammars_new(8, &c, NULL), 0);
    int nv = (int)(sizeof vocab_toks / sizeof vocab_toks[0]);
    uint32_t lens[32];
    for (int i = 0; i < nv; i++)
        lens[i] = (uint32_t)strlen(vocab_toks[i]);
    int32_t eos = nv - 1;
    gr_vocab *v;
    assert_int_equal(gr_vocab_new(nv, vocab_toks, lens, &eos, 1, &v, NULL), 0);
    int accepted = 0, compiled = 0;
    for (int i = 0; i < iters; i++) {
        size_t len;
        char *line = mutate(seeds[rnd_below(sizeof seeds / sizeof seeds[0])], &len);
        uint64_t t0 = md_mono_ns();
        q_request req;
        q_verr ve;
        char buf[Q_CUSTOM_ID_MAX];
        int rc = q_validate(line, len, &lim, &req, buf, &ve);
        if (!rc) {
            accepted++;
            rc = wk_grammars_prepare(c, &req, &ve);
            if (!rc && req.grammar) {
                compiled++;
                gr_matcher *m;
                assert_int_equal(gr_matcher_new(req.grammar, v, &m, NULL), 0);
                uint32_t mask[1];
                for (int step = 0; step < 4; step++) {
                    gr_matcher_fill_mask(m, mask);
                    int t = -1;
                    for (int k = 0; k < nv && t < 0; k++)
                        if (mask[0] >> k & 1)
                            t = k;
                    if (t < 0 || gr_matcher_accept(m, t))
                        break;
                }
                gr_matcher_free(m);
            }
        }
        if (rc && (!ve.code[0] || !ve.message[0] || (ve.status != 400 && ve.status != 500)))
            fail_msg("line %d refused without a code/message/status: '%s' '%s' %d", i, ve.code,
                     ve.message, ve.status);
        double secs = (double)(md_mono_ns() - t0) / 1e9;
        if (secs > 2.0)
            fail_msg("line %d took %.2f s: %.*s", i, secs, (int)(len < 400 ? len : 400), line);
        wk_grammars_release(req.gentry);
        q_request_free(&req);
        free(line);
    }
    print_message("%d lines: %d accepted by validation, %d compiled\n", iters, accepted, compiled);
    assert_true(accepted > 0 && compiled > 0);
    gr_vocab_free(v);
    wk_grammars_free(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(mutated_lines_are_accepted_or_refused_by_name),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
