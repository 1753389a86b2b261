/* test_cuda_device_select.c — choosing a CUDA device, on any host. A malformed name
 * ("cuda:x", "cuda-exact:") is refused by name. Without a GPU (or without a driver),
 * "cuda:0" and "cuda-exact:0" are refused with a sentence that says there is no usable CUDA
 * device and why, never a crash; with GPUs, an ordinal past the last one is refused naming
 * how many there are, a model larger than the free memory is refused before loading with
 * both numbers, and cuda-exact:0 opens with F32 weights and KV cache. Runs in the unit
 * suite. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <string.h>

#include "kernels/backend.h"
#include "kernels/cuda/backend_cuda.h"

/* Malformed CUDA device names are refused by name, whatever the host has. */
static void test_cuda_device_names(void **state) {
    static const char *const bad[] = {"cuda:", "cuda:x", "cuda-exact:", "cuda-exact:-1",
                                      "cuda-exactly", "cudax"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        md_backend *be = NULL;
        md_err e = {0};
        assert_int_equal(md_backend_open(bad[i], 0, &be, &e), MD_EINVAL);
        assert_null(be);
        assert_non_null(strstr(e.msg, bad[i]));
        printf("%-14s refused: %s\n", bad[i], e.msg);
    }
}

static void test_cuda_device_selection(void **state) {
    char why[256] = "";
    int n = md_cuda_device_count(why, sizeof why);
    md_backend *be = NULL;
    md_err e = {0};
    if (n == 0) {
        assert_true(strlen(why) > 0);
        assert_int_equal(md_backend_open("cuda:0", 0, &be, &e), MD_EDEVICE);
        assert_null(be);
        assert_non_null(strstr(e.msg, "no CUDA device"));
        printf("no GPU here: %s\n", e.msg);
        assert_int_equal(md_backend_open("cuda-exact:0", 0, &be, &e), MD_EDEVICE);
        assert_null(be);
        assert_non_null(strstr(e.msg, "no CUDA device"));
        char rn[32];
        assert_int_equal(md_backend_resolve("cuda-exact", rn, sizeof rn, &e), MD_EDEVICE);
        md_device_info dev;
        assert_int_equal(md_cuda_device_get(0, &dev, &e), MD_EDEVICE);
        assert_int_equal(md_cuda_check_fits(0, 1, "a model", &e), MD_EDEVICE);
        return;
    }
    char name[32];
    snprintf(name, sizeof name, "cuda:%d", n);
    assert_int_equal(md_backend_open(name, 0, &be, &e), MD_EDEVICE);
    assert_null(be);
    char count[64];
    snprintf(count, sizeof count, "%d CUDA device", n);
    assert_non_null(strstr(e.msg, count));
    printf("%s refused: %s\n", name, e.msg);
    md_device_info dev;
    assert_int_equal(md_cuda_device_get(0, &dev, &e), 0);
    assert_true(dev.total_bytes > 0 && dev.free_bytes <= dev.total_bytes);
    printf("cuda:0 = %s, sm_%d%d, %d SMs, %zu bytes, peak %.0f GB/s\n", dev.name, dev.cc_major,
           dev.cc_minor, dev.n_sm, dev.total_bytes, dev.hbm_gbps);
    assert_int_equal(md_cuda_check_fits(0, dev.total_bytes * 2, "a huge model", &e), MD_ENOMEM);
    assert_non_null(strstr(e.msg, "needs"));
    assert_non_null(strstr(e.msg, "free of"));
    printf("refused: %s\n", e.msg);
    assert_int_equal(md_cuda_check_fits(0, 1 << 20, "a small model", &e), 0);
    snprintf(name, sizeof name, "cuda-exact:%d", n);
    assert_int_equal(md_backend_open(name, 0, &be, &e), MD_EDEVICE);
    assert_non_null(strstr(e.msg, count));
    /* cuda-exact:0: F32 weights and KV cache, said in its description */
    assert_int_equal(md_backend_open("cuda-exact:0", 0, &be, &e), 0);
    assert_true(be->ops->weights_f32 && be->ops->kv_cache_type == MD_TYPE_F32);
    assert_non_null(strstr(be->ops->describe(be), "cuda-exact:0"));
    md_backend_free(be);
    assert_int_equal(md_backend_open("cuda:0", 0, &be, &e), 0);
    assert_false(be->ops->weights_f32);
    assert_non_null(strstr(be->ops->describe(be), dev.name));
    /* weights larger than the device: refused by buf_wrap with the numbers, nothing read */
    md_buf *b = NULL;
    static const char host[1];
    assert_int_equal(be->ops->buf_wrap(be, host, dev.total_bytes * 2, &b, &e), MD_ENOMEM);
    assert_null(b);
    printf("refused: %s\n", e.msg);
    md_backend_free(be);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_cuda_device_names),
                                       cmocka_unit_test(test_cuda_device_selection)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
