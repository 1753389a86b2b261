/* test_dashboard.c — dashboard/ without a network: the admin token check (scheme, length,
 * one byte off, prefix), token files (short, spaces, trailing newline) and the UTF-8 repair
 * every string from Redis goes through before it is JSON (overlong forms, surrogates, cut
 * sequences, code points past U+10FFFF, NUL). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dashboard/api.h"
#include "dashboard/dash.h"

#define TOK "0123456789abcdef-token"

static void token_needs_bearer_and_every_byte(void **st) {
    assert_true(dash_token_ok(TOK, "Bearer " TOK));
    assert_true(dash_token_ok(TOK, "bearer " TOK)); /* the scheme is case-insensitive */
    assert_false(dash_token_ok(NULL, "Bearer " TOK));
    assert_false(dash_token_ok(TOK, NULL));
    assert_false(dash_token_ok(TOK, ""));
    assert_false(dash_token_ok(TOK, TOK));
    assert_false(dash_token_ok(TOK, "Basic " TOK));
    assert_false(dash_token_ok(TOK, "Bearer "));
    assert_false(dash_token_ok(TOK, "Bearer 0123456789abcdef-toke"));  /* a prefix */
    assert_false(dash_token_ok(TOK, "Bearer " TOK "n"));               /* one byte more */
    assert_false(dash_token_ok(TOK, "Bearer 0123456789abcdef-tokem")); /* last byte off */
    assert_false(dash_token_ok(TOK, "Bearer x123456789abcdef-token")); /* first byte off */
    assert_false(dash_token_ok(TOK, "Bearer  " TOK));                  /* two spaces */
}

static int write_file(const char *path, const char *s) {
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    fputs(s, f);
    return fclose(f);
}

static void token_file_rules(void **st) {
    char path[] = "/tmp/medley-dash-token-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    char tok[128];
    md_err e = {0};
    assert_int_equal(write_file(path, TOK "\n"), 0);
    assert_int_equal(dash_token_read(path, tok, sizeof tok, &e), 0);
    assert_string_equal(tok, TOK);
    assert_int_equal(write_file(path, "short\n"), 0);
    assert_int_equal(dash_token_read(path, tok, sizeof tok, &e), MD_EINVAL);
    assert_non_null(strstr(e.msg, "at least 16"));
    assert_int_equal(write_file(path, "0123456789 abcdef-token\n"), 0);
    assert_int_equal(dash_token_read(path, tok, sizeof tok, &e), MD_EINVAL);
    assert_non_null(strstr(e.msg, "byte 11"));
    char big[300];
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = 0;
    assert_int_equal(write_file(path, big), 0);
    assert_int_equal(dash_token_read(path, tok, sizeof tok, &e), MD_EINVAL);
    unlink(path);
    assert_int_equal(dash_token_read(path, tok, sizeof tok, &e), MD_EIO);
    assert_non_null(strstr(e.msg, path));
}

/* dash_json_str(in) as its JSON text. */
static void check_str(const char *in, size_t n, const char *want) {
    json_t *j = dash_json_str(in, n);
    assert_non_null(j);
    assert_int_equal(json_string_length(j), strlen(want));
    assert_memory_equal(json_string_value(j), want, strlen(want));
    char *s = json_dumps(j, JSON_ENCODE_ANY);
    assert_non_null(s); /* always encodable */
    free(s);
    json_decref(j);
}

#define R "\xEF\xBF\xBD" /* U+FFFD */

static void invalid_utf8_becomes_replacement_characters(void **st) {
    check_str("plain <b>", 9, "plain <b>");
    check_str("caf\xC3\xA9 \xF0\x9F\x98\x80", 10, "caf\xC3\xA9 \xF0\x9F\x98\x80");
    check_str("a\xFF"
              "b",
              3, "a" R "b");
    check_str("\xC0\xAF", 2, R R);             /* overlong '/' */
    check_str("\xE0\x80\xAF", 3, R R R);       /* overlong, 3 bytes */
    check_str("\xED\xA0\x80", 3, R R R);       /* a UTF-16 surrogate */
    check_str("\xF4\x90\x80\x80", 4, R R R R); /* past U+10FFFF */
    check_str("ok\xE2\x82", 4, "ok" R R);      /* cut at the end */
    check_str("\xE2\x82"
              "x",
              3, R R "x");                /* cut in the middle */
    json_t *j = dash_json_str("a\0b", 3); /* NUL kept, escaped by jansson */
    assert_int_equal(json_string_length(j), 3);
    char *s = json_dumps(j, JSON_ENCODE_ANY);
    assert_string_equal(s, "\"a\\u0000b\"");
    free(s);
    json_decref(j);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(token_needs_bearer_and_every_byte),
        cmocka_unit_test(token_file_rules),
        cmocka_unit_test(invalid_utf8_becomes_replacement_characters),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
