/* test_backend_devices.c — kernels/backend.h's device names and facts, on any build and host:
 * md_device_parse takes apart every name md_backend_open takes and refuses the others with
 * md_backend_open's own sentence; md_device_count / md_device_get answer without a GPU (and
 * without CUDA) with a reason instead of a crash, and agree with each other with GPUs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <string.h>

#include "kernels/backend.h"

static void test_device_names_parse(void **state) {
    static const struct {
        const char *name;
        md_device_kind kind;
        int index, exact;
    } good[] = {
        {NULL, MD_DEVICE_CPU, 0, 0},
        {"", MD_DEVICE_CPU, 0, 0},
        {"cpu", MD_DEVICE_CPU, 0, 0},
        {"cpu:3", MD_DEVICE_CPU, 3, 0},
        {"cpu-exact", MD_DEVICE_CPU, 0, 1},
        {"cuda", MD_DEVICE_CUDA, 0, 0},
        {"cuda:2", MD_DEVICE_CUDA, 2, 0},
        {"cuda-exact", MD_DEVICE_CUDA, 0, 1},
        {"cuda-exact:1", MD_DEVICE_CUDA, 1, 1},
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        md_device_id id;
        md_err e = {0};
        assert_int_equal(md_device_parse(good[i].name, &id, &e), 0);
        assert_int_equal(id.kind, good[i].kind);
        assert_int_equal(id.index, good[i].index);
        assert_int_equal(id.exact, good[i].exact);
    }
}

/* A name md_device_parse refuses, md_backend_open refuses with the same code and sentence. */
static void test_bad_device_names_refused_as_open_refuses_them(void **state) {
    static const char *const bad[] = {"auto",     "gpu",         "cpu:0",         "cpu:x",
                                      "cpu:",     "cpu-exact:2", "cuda:",         "cuda:x",
                                      "cudax",    "cuda-exact:", "cuda-exact:-1", "cuda-exactly",
                                      "cuda:5000"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        md_device_id id;
        md_err pe = {0}, oe = {0};
        int rc = md_device_parse(bad[i], &id, &pe);
        assert_int_equal(rc, MD_EINVAL);
        assert_non_null(strstr(pe.msg, bad[i]));
        if (strcmp(bad[i], "auto")) { /* open resolves "auto" itself */
            md_backend *be = NULL;
            assert_int_equal(md_backend_open(bad[i], 1, &be, &oe), rc);
            assert_null(be);
            assert_string_equal(oe.msg, pe.msg);
        }
        printf("%-14s refused: %s\n", bad[i], pe.msg);
    }
}

/* Count and describe: none with a reason, or as many as md_device_get describes. */
static void test_device_count_and_info_agree(void **state) {
    char why[256] = "";
    int n = md_device_count(why, sizeof why);
    assert_true(n >= 0);
    md_device_info d;
    md_err e = {0};
    if (n == 0) {
        assert_true(strlen(why) > 0);
        int rc = md_device_get(0, &d, &e);
        assert_true(rc == MD_EDEVICE || rc == MD_EUNSUPP);
        assert_true(strlen(e.msg) > 0);
        printf("no CUDA device: %s; md_device_get(0): %s\n", why, e.msg);
        return;
    }
    for (int i = 0; i < n; i++) {
        assert_int_equal(md_device_get(i, &d, &e), 0);
        assert_int_equal(d.ordinal, i);
        assert_true(strlen(d.name) > 0 && d.total_bytes > 0 && d.cc_major >= 8);
        printf("cuda:%d = %s, sm_%d%d, %zu bytes\n", i, d.name, d.cc_major, d.cc_minor,
               d.total_bytes);
    }
    assert_int_equal(md_device_get(n, &d, &e), MD_EDEVICE);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_device_names_parse),
        cmocka_unit_test(test_bad_device_names_refused_as_open_refuses_them),
        cmocka_unit_test(test_device_count_and_info_agree),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
