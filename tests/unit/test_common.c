/* test_common.c — common/: error messages, JSON getters, file reads, ids, host memory. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/err.h"
#include "common/util.h"

static void errf_fills_message_and_returns_code(void **st) {
    md_err e;
    int rc = md_errf(&e, MD_EFORMAT, "key %s: expected %d", "general.name", 3);
    assert_int_equal(rc, MD_EFORMAT);
    assert_int_equal(e.code, MD_EFORMAT);
    assert_string_equal(e.msg, "key general.name: expected 3");
    md_errctx(&e, "loading %s: ", "m.gguf");
    assert_string_equal(e.msg, "loading m.gguf: key general.name: expected 3");
}

static void json_getters_name_the_field(void **st) {
    md_err e = {0};
    json_t *o = json_loads("{\"a\":\"x\",\"n\":3,\"f\":2.5,\"b\":true}", 0, NULL);
    const char *s = NULL;
    long long n = 0;
    double f = 0;
    int b = 0;
    assert_int_equal(md_json_get_str(o, "a", 1, &s, "body", &e), 0);
    assert_string_equal(s, "x");
    assert_int_equal(md_json_get_int(o, "n", 1, &n, "body", &e), 0);
    assert_int_equal(n, 3);
    assert_int_equal(md_json_get_num(o, "f", 1, &f, "body", &e), 0);
    assert_true(f == 2.5);
    assert_int_equal(md_json_get_bool(o, "b", 1, &b, "body", &e), 0);
    assert_true(b);
    assert_int_equal(md_json_get_int(o, "a", 1, &n, "body", &e), MD_EINVAL);
    assert_string_equal(e.msg, "body.a must be an integer");
    assert_int_equal(md_json_get_int(o, "zz", 1, &n, "body", &e), MD_EINVAL);
    assert_string_equal(e.msg, "body.zz is required");
    assert_int_equal(md_json_get_int(o, "zz", 0, &n, "body", &e), 0);
    json_decref(o);
}

static void random_hex_has_length_and_varies(void **st) {
    char a[33], b[33];
    md_random_hex(a, sizeof a, 32);
    md_random_hex(b, sizeof b, 32);
    assert_int_equal(strlen(a), 32);
    assert_string_not_equal(a, b);
}

static void read_file_reports_missing_path(void **st) {
    md_err e = {0};
    char *d;
    size_t n;
    assert_int_equal(md_read_file("/nonexistent/x", 0, &d, &n, &e), MD_EIO);
    assert_non_null(strstr(e.msg, "/nonexistent/x"));
}

/* Write text to root/rel, making its folders. */
static void put(const char *root, const char *rel, const char *text) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    md_err e = {0};
    char *slash = strrchr(path, '/');
    *slash = 0;
    assert_int_equal(md_mkdirs(path, &e), 0);
    *slash = '/';
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* MemTotal, lowered by a cgroup limit (v2, v1) but never raised by one; "max" is no limit;
 * no meminfo is 0. */
static void host_memory_is_memtotal_or_the_cgroup_limit(void **st) {
    char root[] = "/tmp/medley-hostmem-XXXXXX";
    assert_non_null(mkdtemp(root));
    assert_int_equal(md_host_memory_bytes(root), 0);
    put(root, "proc/meminfo",
        "MemTotal:       65536000 kB\nMemFree:  100 kB\n"
        "MemAvailable:   60000000 kB\n");
    assert_int_equal(md_host_memory_bytes(root), 65536000LL * 1024);
    put(root, "sys/fs/cgroup/memory.max", "max\n");
    assert_int_equal(md_host_memory_bytes(root), 65536000LL * 1024);
    put(root, "sys/fs/cgroup/memory.max", "17179869184\n");
    assert_int_equal(md_host_memory_bytes(root), 17179869184LL);
    put(root, "sys/fs/cgroup/memory.max", "999999999999999\n");
    assert_int_equal(md_host_memory_bytes(root), 65536000LL * 1024);
    put(root, "sys/fs/cgroup/memory/memory.limit_in_bytes", "8589934592\n");
    assert_int_equal(md_host_memory_bytes(root), 8589934592LL);
    /* the real host: something, and no more than sysconf's physical memory */
    long long here = md_host_memory_bytes(NULL);
    assert_true(here > 0);
    assert_true(here <= (long long)sysconf(_SC_PHYS_PAGES) * sysconf(_SC_PAGE_SIZE));
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    assert_int_equal(system(cmd), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(errf_fills_message_and_returns_code),
        cmocka_unit_test(json_getters_name_the_field),
        cmocka_unit_test(random_hex_has_length_and_varies),
        cmocka_unit_test(read_file_reports_missing_path),
        cmocka_unit_test(host_memory_is_memtotal_or_the_cgroup_limit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
