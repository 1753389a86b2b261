/* test_api_keys.c — api/keys.c without a network: `TENANT KEY` files with plain and
 * sha256:HEX keys and comments, the bearer token matched (scheme, one byte off, a prefix, the
 * other tenant's key), and every malformed line refused with its line number. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "api/api_int.h"

/* 64 hex digits, a well-formed sha256: entry */
#define HEX64 "c0a9b1ba0a6fd4bcc5c4aa3d7e3d1a7cc0d4c2e8b1ba1c1f2ab8b0d5f3f1e0a9"

static char path[64];

static api_keys *load(const char *text, md_err *e) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    api_keys *k = NULL;
    return api_keys_load(path, &k, e) ? NULL : k;
}

static void plain_and_hashed_keys_name_their_tenant(void **st) {
    (void)st;
    char text[512];
    FILE *p = popen("printf %s sk-beta-0123456789abcdef | sha256sum | cut -c1-64", "r");
    char hex[80] = "";
    assert_non_null(p);
    assert_non_null(fgets(hex, sizeof hex, p));
    pclose(p);
    hex[strcspn(hex, "\n")] = 0;
    snprintf(text, sizeof text,
             "# tenants\n\n  acme   sk-acme-0123456789abcdef  \nbeta sha256:%s\n", hex);
    md_err e = {0};
    api_keys *k = load(text, &e);
    assert_non_null(k);
    assert_string_equal(api_keys_tenant(k, "Bearer sk-acme-0123456789abcdef"), "acme");
    assert_string_equal(api_keys_tenant(k, "bearer sk-acme-0123456789abcdef"), "acme");
    assert_string_equal(api_keys_tenant(k, "Bearer sk-beta-0123456789abcdef"), "beta");
    assert_null(api_keys_tenant(k, "Bearer sk-acme-0123456789abcde"));   /* a prefix */
    assert_null(api_keys_tenant(k, "Bearer sk-acme-0123456789abcdeF"));  /* one byte off */
    assert_null(api_keys_tenant(k, "Bearer sk-acme-0123456789abcdef ")); /* one byte more */
    assert_null(api_keys_tenant(k, "Basic sk-acme-0123456789abcdef"));
    assert_null(api_keys_tenant(k, "sk-acme-0123456789abcdef"));
    assert_null(api_keys_tenant(k, "Bearer "));
    assert_null(api_keys_tenant(k, NULL));
    /* the hash itself is not a key */
    char h[128];
    snprintf(h, sizeof h, "Bearer sha256:%s", hex);
    assert_null(api_keys_tenant(k, h));
    api_keys_free(k);
}

static void bad_lines_are_refused_with_their_number(void **st) {
    (void)st;
    struct {
        const char *text, *want;
    } cases[] = {
        {"acme\n", ":1: expected `TENANT KEY`"},
        {"# c\nacme k1 k2\n", ":2: expected `TENANT KEY`"},
        {"ac/me sk-acme-0123456789abcdef\n", ":1: tenant 'ac/me'"},
        {"acme short\n", ":1: a key must be 16..255 bytes"},
        {"acme sha256:abcd\n", ":1: sha256: needs 64 hex digits"},
        /* a well-formed line, then one with two non-hex digits among 64 */
        {"acme sha256:" HEX64
         "\nbeta sha256:zza9b1ba0a6fd4bcc5c4aa3d7e3d1a7cc0d4c2e8b1ba1c1f2ab8b0d5f3f1e0a9\n",
         ":2: sha256:"},
        {"# only a comment\n", "holds no `TENANT KEY` line"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        md_err e = {0};
        assert_null(load(cases[i].text, &e));
        if (!strstr(e.msg, cases[i].want))
            fail_msg("case %zu: '%s' does not say '%s'", i, e.msg, cases[i].want);
    }
    md_err e = {0};
    api_keys *k = NULL;
    assert_int_equal(api_keys_load("/nonexistent/api-keys", &k, &e), MD_EIO);
    assert_non_null(strstr(e.msg, "/nonexistent/api-keys"));
}

int main(void) {
    snprintf(path, sizeof path, "/tmp/test_api_keys.%d", (int)getpid());
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(plain_and_hashed_keys_name_their_tenant),
        cmocka_unit_test(bad_lines_are_refused_with_their_number),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    unlink(path);
    return rc;
}
