/* test_kvcache.c — block accounting of the paged KV cache: allocation under the budget,
 * refcounts, the LRU of released blocks, and the exact prefix index. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "engine/kvcache.h"

static void test_alloc_until_exhausted_then_reuse(void **state) {
    kv_cache *c;
    md_err e = {0};
    assert_int_equal(kv_create(4, 16, &c, &e), 0);
    int32_t b[4];
    for (int i = 0; i < 4; i++) {
        b[i] = kv_alloc(c);
        assert_true(b[i] >= 0 && b[i] < 4);
        for (int j = 0; j < i; j++)
            assert_int_not_equal(b[i], b[j]);
    }
    assert_int_equal(kv_n_available(c), 0);
    assert_int_equal(kv_alloc(c), -1);
    kv_unref(c, b[2]);
    assert_int_equal(kv_n_available(c), 1);
    assert_int_equal(kv_alloc(c), b[2]);
    kv_free(c);
}

static void test_shared_block_freed_only_by_last_reference(void **state) {
    kv_cache *c;
    md_err e = {0};
    assert_int_equal(kv_create(2, 4, &c, &e), 0);
    int32_t b = kv_alloc(c);
    kv_ref(c, b);
    assert_int_equal(kv_refcount(c, b), 2);
    kv_unref(c, b);
    assert_int_equal(kv_n_available(c), 1);
    kv_unref(c, b);
    assert_int_equal(kv_n_available(c), 2);
    kv_free(c);
}

static void test_prefix_index_is_exact_and_chained(void **state) {
    kv_cache *c;
    md_err e = {0};
    assert_int_equal(kv_create(8, 4, &c, &e), 0);
    int32_t t1[4] = {1, 2, 3, 4}, t2[4] = {5, 6, 7, 8}, t3[4] = {1, 2, 3, 5};
    int32_t a = kv_alloc(c), b = kv_alloc(c);
    uint64_t ha = kv_publish(c, a, 0, t1);
    kv_publish(c, b, ha, t2);
    assert_int_equal(kv_lookup(c, 0, t1), a);
    assert_int_equal(kv_lookup(c, ha, t2), b);
    assert_int_equal(kv_lookup(c, 0, t2), -1);  /* same tokens, other prefix */
    assert_int_equal(kv_lookup(c, 0, t3), -1);  /* other tokens */
    assert_int_equal(kv_lookup(c, 99, t2), -1); /* other parent */
    assert_int_equal(kv_n_indexed(c), 2);
    kv_free(c);
}

/* A released indexed block stays shareable until memory is needed; free blocks go first, then
 * the least recently released cached block is evicted (and leaves the index). */
static void test_cached_blocks_evicted_last_and_oldest_first(void **state) {
    kv_cache *c;
    md_err e = {0};
    assert_int_equal(kv_create(3, 2, &c, &e), 0);
    int32_t t1[2] = {1, 2}, t2[2] = {3, 4};
    int32_t a = kv_alloc(c), b = kv_alloc(c);
    kv_publish(c, a, 0, t1);
    kv_publish(c, b, 0, t2);
    kv_unref(c, a);
    kv_unref(c, b);
    assert_int_equal(kv_n_available(c), 3);
    assert_int_equal(kv_lookup(c, 0, t1), a);
    int32_t x = kv_alloc(c); /* the never-used block */
    assert_true(x != a && x != b);
    assert_int_equal(kv_n_indexed(c), 2);
    int32_t y = kv_alloc(c); /* evicts a, released first */
    assert_int_equal(y, a);
    assert_int_equal(kv_lookup(c, 0, t1), -1);
    assert_int_equal(kv_lookup(c, 0, t2), b);
    kv_ref(c, b); /* shared again: no longer evictable */
    assert_int_equal(kv_alloc(c), -1);
    kv_free(c);
}

static void test_clear_index_keeps_blocks_in_use(void **state) {
    kv_cache *c;
    md_err e = {0};
    assert_int_equal(kv_create(2, 2, &c, &e), 0);
    int32_t t1[2] = {1, 2}, t2[2] = {3, 4};
    int32_t a = kv_alloc(c), b = kv_alloc(c);
    kv_publish(c, a, 0, t1);
    kv_publish(c, b, 0, t2);
    kv_unref(c, a);
    kv_clear_index(c);
    assert_int_equal(kv_lookup(c, 0, t1), -1);
    assert_int_equal(kv_lookup(c, 0, t2), b);
    kv_free(c);
}

static void test_bad_sizes_rejected(void **state) {
    kv_cache *c;
    md_err e = {0};
    assert_int_equal(kv_create(0, 16, &c, &e), MD_EINVAL);
    assert_int_equal(kv_create(4, 0, &c, &e), MD_EINVAL);
    assert_null(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_alloc_until_exhausted_then_reuse),
        cmocka_unit_test(test_shared_block_freed_only_by_last_reference),
        cmocka_unit_test(test_prefix_index_is_exact_and_chained),
        cmocka_unit_test(test_cached_blocks_evicted_last_and_oldest_first),
        cmocka_unit_test(test_clear_index_keeps_blocks_in_use),
        cmocka_unit_test(test_bad_sizes_rejected),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
