/* test_worker_logprobs.c — worker/logprobs.c: a runner's logprob entries and their
 * alternatives become OpenAI's chat and completions shapes; a token's bytes that are not
 * (whole) UTF-8 characters come out exactly in `bytes` and as U+FFFD in the `token` string,
 * so the document is valid JSON. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "worker/logprobs.h"

static void sanitize_is(const char *in, size_t n, const char *want, size_t want_n) {
    char out[64];
    size_t got = wk_utf8_sanitize(in, n, out);
    if (got != want_n || memcmp(out, want, want_n) || out[got] != 0)
        fail_msg("sanitizing %zu bytes: got %zu bytes '%.*s', expected %zu '%.*s'", n, got,
                 (int)got, out, want_n, (int)want_n, want);
}
#define SAN(in, want) sanitize_is(in, sizeof in - 1, want, sizeof want - 1)

static void whole_characters_are_kept(void **st) {
    SAN("", "");
    SAN("Hello", "Hello");
    SAN("\xc3\xa9", "\xc3\xa9");                 /* é */
    SAN("\xe2\x82\xac", "\xe2\x82\xac");         /* € */
    SAN("\xf0\x9f\x98\x80", "\xf0\x9f\x98\x80"); /* U+1F600 */
    SAN("a\0b", "a\0b");                         /* NUL is a character */
}

#define R "\xef\xbf\xbd" /* U+FFFD */
static void each_maximal_invalid_subpart_is_one_replacement(void **st) {
    SAN("\xe2\x82", R);               /* the start of € (a token holding part of it) */
    SAN("\x82\xac", R R);             /* the rest of it: two lone continuation bytes */
    SAN("\xf0\x9f\x98", R);           /* a truncated 4-byte character */
    SAN("\xc3", R);                   /* half of é */
    SAN("\xff", R);                   /* never UTF-8 */
    SAN("\xc0\xaf", R R);             /* overlong: C0 never starts a character */
    SAN("\xed\xa0\x80", R R R);       /* a surrogate */
    SAN("\xf4\x90\x80\x80", R R R R); /* past U+10FFFF */
    SAN("a\xe2\x82z", "a" R "z");
    SAN("\xe2\x82\xe2\x82\xac", R "\xe2\x82\xac");
}

static json_t *roundtrip(json_t *v) {
    /* what a client reads: dumped, then parsed back (jansson refuses invalid UTF-8) */
    assert_non_null(v);
    char *s = json_dumps(v, JSON_COMPACT);
    assert_non_null(s);
    json_error_t je;
    json_t *back = json_loads(s, 0, &je);
    if (!back)
        fail_msg("not valid JSON: %s: %s", je.text, s);
    free(s);
    json_decref(v);
    return back;
}

/* "Hé" as a byte-level tokenizer may split it: "H", the first byte of é, the second. */
static const wk_token_lp split[] = {
    {.bytes = "H", .n_bytes = 1, .text_offset = 0, .logprob = -0.5f},
    {.bytes = "\xc3", .n_bytes = 1, .text_offset = 1, .logprob = -1.25f},
    {.bytes = "\xa9", .n_bytes = 1, .text_offset = 1, .logprob = -0.0f},
};

static void chat_shape_has_exact_bytes_and_valid_tokens(void **st) {
    wk_result res = {.text = "H\xc3\xa9", .logprobs = 1, .lp = split, .n_lp = 3};
    json_t *v = roundtrip(wk_logprobs_json(&res, 1));
    json_t *content = json_object_get(v, "content");
    assert_int_equal(json_object_size(v), 1);
    assert_int_equal(json_array_size(content), 3);
    const char *want_tok[] = {"H", R, R};
    int want_byte[] = {72, 0xc3, 0xa9};
    for (size_t i = 0; i < 3; i++) {
        json_t *e = json_array_get(content, i);
        assert_int_equal(json_object_size(e), 4);
        assert_string_equal(json_string_value(json_object_get(e, "token")), want_tok[i]);
        assert_true(json_real_value(json_object_get(e, "logprob")) == split[i].logprob);
        json_t *bytes = json_object_get(e, "bytes");
        assert_int_equal(json_array_size(bytes), 1);
        assert_int_equal(json_integer_value(json_array_get(bytes, 0)), want_byte[i]);
        json_t *top = json_object_get(e, "top_logprobs");
        assert_true(json_is_array(top) && json_array_size(top) == 0);
    }
    json_decref(v);
}

static void completion_shape_has_offsets_and_null_top(void **st) {
    static const wk_token_lp toks[] = {
        {.bytes = " Paris", .n_bytes = 6, .text_offset = 0, .logprob = -0.25f},
        {.bytes = " is", .n_bytes = 3, .text_offset = 6, .logprob = -1.5f}};
    wk_result res = {.text = " Paris is", .logprobs = 1, .lp = toks, .n_lp = 2};
    json_t *v = roundtrip(wk_logprobs_json(&res, 0));
    assert_int_equal(json_object_size(v), 4);
    json_t *t = json_object_get(v, "tokens"), *l = json_object_get(v, "token_logprobs"),
           *o = json_object_get(v, "text_offset");
    assert_true(json_is_null(json_object_get(v, "top_logprobs")));
    assert_int_equal(json_array_size(t), 2);
    assert_string_equal(json_string_value(json_array_get(t, 0)), " Paris");
    assert_string_equal(json_string_value(json_array_get(t, 1)), " is");
    assert_true(json_real_value(json_array_get(l, 0)) == -0.25 &&
                json_real_value(json_array_get(l, 1)) == -1.5);
    assert_int_equal(json_integer_value(json_array_get(o, 0)), 0);
    assert_int_equal(json_integer_value(json_array_get(o, 1)), 6);
    json_decref(v);

    res = (wk_result){.text = "H\xc3\xa9", .logprobs = 1, .lp = split, .n_lp = 3};
    v = roundtrip(wk_logprobs_json(&res, 0));
    t = json_object_get(v, "tokens");
    assert_string_equal(json_string_value(json_array_get(t, 1)), R);
    assert_int_equal(json_integer_value(json_array_get(json_object_get(v, "text_offset"), 2)), 1);
    json_decref(v);
}

static void not_asked_is_null_and_none_is_empty(void **st) {
    wk_result res = {.text = "x"};
    json_t *v = wk_logprobs_json(&res, 1);
    assert_true(json_is_null(v));
    json_decref(v);
    res.logprobs = 1; /* asked, but the text has no tokens (an immediate end of generation) */
    v = roundtrip(wk_logprobs_json(&res, 1));
    assert_int_equal(json_array_size(json_object_get(v, "content")), 0);
    json_decref(v);
    v = roundtrip(wk_logprobs_json(&res, 0));
    assert_int_equal(json_array_size(json_object_get(v, "tokens")), 0);
    json_decref(v);
}

static void an_impossible_token_gets_minus_9999(void **st) {
    /* JSON has no infinity: a token whose raw logit was -inf must not make the line fail */
    wk_token_lp t = {.bytes = "a", .n_bytes = 1, .logprob = -INFINITY};
    wk_result res = {.text = "a", .logprobs = 1, .lp = &t, .n_lp = 1};
    json_t *v = roundtrip(wk_logprobs_json(&res, 1));
    json_t *e = json_array_get(json_object_get(v, "content"), 0);
    assert_true(json_real_value(json_object_get(e, "logprob")) == -9999.0);
    json_decref(v);
}

/* " Paris" with its alternatives: itself, half of é, the other half (both U+FFFD as text),
 * and a token holding NUL. */
static const wk_alt_lp paris_top[] = {
    {" Paris", 6, -0.25f}, {"\xc3", 1, -2.0f}, {"\xa9", 1, -3.0f}, {"a\0b", 3, -4.0f}};

static const char *str_at(json_t *arr, size_t i, const char *key) {
    return json_string_value(json_object_get(json_array_get(arr, i), key));
}
static double real_at(json_t *arr, size_t i, const char *key) {
    return json_real_value(json_object_get(json_array_get(arr, i), key));
}

static void chat_alternatives_are_token_objects_most_likely_first(void **st) {
    /* the first three: jansson's parser refuses the \u0000 the fourth would write */
    wk_token_lp t = {
        .bytes = " Paris", .n_bytes = 6, .logprob = -0.25f, .top = paris_top, .n_top = 3};
    wk_result res = {.text = " Paris", .logprobs = 1, .top_logprobs = 3, .lp = &t, .n_lp = 1};
    json_t *v = roundtrip(wk_logprobs_json(&res, 1));
    json_t *e = json_array_get(json_object_get(v, "content"), 0);
    json_t *top = json_object_get(e, "top_logprobs");
    assert_int_equal(json_array_size(top), 3);
    for (size_t i = 0; i < 3; i++)
        assert_int_equal(json_object_size(json_array_get(top, i)), 3); /* token logprob bytes */
    assert_string_equal(str_at(top, 0, "token"), " Paris");
    assert_string_equal(str_at(top, 1, "token"), R);
    assert_string_equal(str_at(top, 2, "token"), R);
    assert_true(real_at(top, 0, "logprob") == -0.25 && real_at(top, 1, "logprob") == -2.0 &&
                real_at(top, 2, "logprob") == -3.0);
    json_t *b0 = json_object_get(json_array_get(top, 0), "bytes");
    json_t *b2 = json_object_get(json_array_get(top, 2), "bytes");
    assert_int_equal(json_array_size(b0), 6);
    assert_int_equal(json_integer_value(json_array_get(b0, 1)), 'P');
    assert_int_equal(json_array_size(b2), 1);
    assert_int_equal(json_integer_value(json_array_get(b2, 0)), 0xa9);
    json_decref(v);

    /* fewer than asked (the engine listed fewer): as many as given */
    t.n_top = 1;
    v = roundtrip(wk_logprobs_json(&res, 1));
    e = json_array_get(json_object_get(v, "content"), 0);
    assert_int_equal(json_array_size(json_object_get(e, "top_logprobs")), 1);
    json_decref(v);
}

static void chat_alternative_with_nul_keeps_its_bytes(void **st) {
    wk_token_lp t = {
        .bytes = "a", .n_bytes = 1, .logprob = -4.0f, .top = paris_top + 3, .n_top = 1};
    wk_result res = {.text = "a", .logprobs = 1, .top_logprobs = 1, .lp = &t, .n_lp = 1};
    json_t *v = wk_logprobs_json(&res, 1);
    assert_non_null(v);
    char *s = json_dumps(v, JSON_COMPACT);
    assert_non_null(strstr(s, "{\"token\":\"a\\u0000b\",\"logprob\":-4.0,\"bytes\":[97,0,98]}"));
    free(s);
    json_decref(v);
}

static void completion_alternatives_map_text_to_logprob_keeping_the_likelier(void **st) {
    wk_token_lp t = {
        .bytes = " Paris", .n_bytes = 6, .logprob = -0.25f, .top = paris_top, .n_top = 4};
    wk_result res = {.text = " Paris", .logprobs = 1, .top_logprobs = 4, .lp = &t, .n_lp = 1};
    json_t *v = roundtrip(wk_logprobs_json(&res, 0));
    json_t *tops = json_object_get(v, "top_logprobs");
    assert_int_equal(json_array_size(tops), 1); /* one object per token */
    json_t *o = json_array_get(tops, 0);
    /* " Paris" and one U+FFFD: the two halves read alike, the text with NUL has no key */
    assert_int_equal(json_object_size(o), 2);
    assert_true(json_real_value(json_object_get(o, " Paris")) == -0.25);
    assert_true(json_real_value(json_object_get(o, R)) == -2.0); /* the more likely */
    json_decref(v);

    /* asked, none listed at a token: an empty object there, the array stays parallel */
    wk_token_lp two[2] = {t, {.bytes = "!", .n_bytes = 1, .text_offset = 6, .logprob = -1.0f}};
    res = (wk_result){.text = " Paris!", .logprobs = 1, .top_logprobs = 2, .lp = two, .n_lp = 2};
    two[0].n_top = 2;
    v = roundtrip(wk_logprobs_json(&res, 0));
    tops = json_object_get(v, "top_logprobs");
    assert_int_equal(json_array_size(tops), 2);
    assert_int_equal(json_object_size(json_array_get(tops, 0)), 2);
    assert_int_equal(json_object_size(json_array_get(tops, 1)), 0);
    json_decref(v);

    /* logprobs 0: null, whatever the entries hold */
    res.top_logprobs = 0;
    v = roundtrip(wk_logprobs_json(&res, 0));
    assert_true(json_is_null(json_object_get(v, "top_logprobs")));
    json_decref(v);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(whole_characters_are_kept),
        cmocka_unit_test(each_maximal_invalid_subpart_is_one_replacement),
        cmocka_unit_test(chat_shape_has_exact_bytes_and_valid_tokens),
        cmocka_unit_test(completion_shape_has_offsets_and_null_top),
        cmocka_unit_test(not_asked_is_null_and_none_is_empty),
        cmocka_unit_test(an_impossible_token_gets_minus_9999),
        cmocka_unit_test(chat_alternatives_are_token_objects_most_likely_first),
        cmocka_unit_test(chat_alternative_with_nul_keeps_its_bytes),
        cmocka_unit_test(completion_alternatives_map_text_to_logprob_keeping_the_likelier),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
