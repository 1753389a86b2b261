/* test_cuda_graph_cache.c — the CUDA backend's decode-graph policy (kernels/cuda/graph_cache.h),
 * pure C, runs without a GPU: a key is recorded at its second step and replayed after; the
 * least recently used graph is evicted (and freed) when the cache is full; a scratch move
 * drops every graph; a key whose capture failed twice is never recorded again; the split
 * bucket only changes at powers of two. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "kernels/cuda/graph_cache.h"

static int g_freed;
static void count_free(void *g) {
    (void)g;
    g_freed++;
}

static cuda_gc_key key(int t, int s, int l, int b) {
    cuda_gc_key k = {{t, s, l, b}};
    return k;
}

static void test_second_sighting_records_then_replays(void **state) {
    cuda_graph_cache gc;
    cuda_gc_init(&gc, count_free);
    cuda_gc_key k = key(4, 4, 4, 128);
    void *g;
    assert_int_equal(cuda_gc_lookup(&gc, &k, &g), CUDA_GC_EAGER);
    assert_int_equal(cuda_gc_lookup(&gc, &k, &g), CUDA_GC_RECORD);
    static int graph;
    cuda_gc_store(&gc, &k, &graph);
    for (int i = 0; i < 5; i++) {
        assert_int_equal(cuda_gc_lookup(&gc, &k, &g), CUDA_GC_REPLAY);
        assert_ptr_equal(g, &graph);
    }
    cuda_gc_key other = key(5, 5, 5, 128);
    assert_int_equal(cuda_gc_lookup(&gc, &other, &g), CUDA_GC_EAGER);
    assert_null(g);
    assert_int_equal(gc.recorded, 1);
    assert_int_equal(gc.replayed, 5);
    g_freed = 0;
    cuda_gc_clear(&gc);
    assert_int_equal(g_freed, 1);
    /* after a clear the key is still known: its next step records at once */
    assert_int_equal(cuda_gc_lookup(&gc, &k, &g), CUDA_GC_RECORD);
}

static void test_lru_eviction_frees_the_oldest(void **state) {
    cuda_graph_cache gc;
    cuda_gc_init(&gc, count_free);
    static int graphs[CUDA_GC_SLOTS + 1];
    void *g;
    for (int i = 0; i <= CUDA_GC_SLOTS; i++) {
        cuda_gc_key k = key(i + 1, i + 1, i + 1, 64);
        cuda_gc_lookup(&gc, &k, &g);
        assert_int_equal(cuda_gc_lookup(&gc, &k, &g), CUDA_GC_RECORD);
        if (i == CUDA_GC_SLOTS) { /* touch key 1 so key 2 is the least recently used */
            cuda_gc_key k1 = key(1, 1, 1, 64);
            assert_int_equal(cuda_gc_lookup(&gc, &k1, &g), CUDA_GC_REPLAY);
        }
        g_freed = 0;
        cuda_gc_store(&gc, &k, &graphs[i]);
        assert_int_equal(g_freed, i == CUDA_GC_SLOTS ? 1 : 0);
    }
    cuda_gc_key k1 = key(1, 1, 1, 64), k2 = key(2, 2, 2, 64);
    assert_int_equal(cuda_gc_lookup(&gc, &k1, &g), CUDA_GC_REPLAY);
    assert_int_not_equal(cuda_gc_lookup(&gc, &k2, &g), CUDA_GC_REPLAY);
    assert_int_equal(gc.evicted, 1);
    cuda_gc_clear(&gc);
}

static void test_scratch_move_drops_every_graph(void **state) {
    cuda_graph_cache gc;
    cuda_gc_init(&gc, count_free);
    static int graph;
    void *g;
    cuda_gc_key k = key(8, 8, 8, 256);
    cuda_gc_sync_gen(&gc, 0);
    cuda_gc_lookup(&gc, &k, &g);
    cuda_gc_lookup(&gc, &k, &g);
    cuda_gc_store(&gc, &k, &graph);
    g_freed = 0;
    cuda_gc_sync_gen(&gc, 0); /* unchanged: kept */
    assert_int_equal(g_freed, 0);
    assert_int_equal(cuda_gc_lookup(&gc, &k, &g), CUDA_GC_REPLAY);
    cuda_gc_sync_gen(&gc, 1); /* moved: dropped, re-recorded */
    assert_int_equal(g_freed, 1);
    assert_int_equal(cuda_gc_lookup(&gc, &k, &g), CUDA_GC_RECORD);
}

static void test_failing_key_given_up_after_two_failures(void **state) {
    cuda_graph_cache gc;
    cuda_gc_init(&gc, count_free);
    void *g;
    cuda_gc_key k = key(3, 3, 3, 64);
    cuda_gc_lookup(&gc, &k, &g);
    assert_int_equal(cuda_gc_lookup(&gc, &k, &g), CUDA_GC_RECORD);
    cuda_gc_failed(&gc, &k); /* e.g. scratch had to grow inside the capture */
    assert_int_equal(cuda_gc_lookup(&gc, &k, &g), CUDA_GC_RECORD); /* tried once more */
    cuda_gc_failed(&gc, &k);
    for (int i = 0; i < 4; i++)
        assert_int_equal(cuda_gc_lookup(&gc, &k, &g), CUDA_GC_EAGER);
}

static void test_seen_ring_forgets_oldest_keys(void **state) {
    cuda_graph_cache gc;
    cuda_gc_init(&gc, count_free);
    void *g;
    for (int i = 0; i < CUDA_GC_SEEN + 10; i++) {
        cuda_gc_key k = key(i + 1, 1, 1, 64);
        assert_int_equal(cuda_gc_lookup(&gc, &k, &g), CUDA_GC_EAGER);
    }
    cuda_gc_key first = key(1, 1, 1, 64), last = key(CUDA_GC_SEEN + 10, 1, 1, 64);
    assert_int_equal(cuda_gc_lookup(&gc, &first, &g), CUDA_GC_EAGER); /* forgotten */
    assert_int_equal(cuda_gc_lookup(&gc, &last, &g), CUDA_GC_RECORD);
}

static void test_len_bucket(void **state) {
    assert_int_equal(cuda_gc_len_bucket(0), 64);
    assert_int_equal(cuda_gc_len_bucket(64), 64);
    assert_int_equal(cuda_gc_len_bucket(65), 128);
    assert_int_equal(cuda_gc_len_bucket(1000), 1024);
    assert_int_equal(cuda_gc_len_bucket(131072), 131072);
}

/* Padded decode sizes: never below n nor above the cap, exact where n is a size already,
 * under twice n (under a quarter more beyond 64), and few of them: 19 distinct sizes for
 * every batch of 1 to 256. */
static void test_pad_rows(void **state) {
    static const int want[][2] = {{0, 0},     {1, 1},     {2, 2},     {3, 4},     {5, 8},
                                  {8, 8},     {9, 16},    {17, 24},   {63, 64},   {65, 80},
                                  {127, 128}, {129, 160}, {250, 256}, {257, 320}, {1000, 1024}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        assert_int_equal(cuda_gc_pad_rows(want[i][0], 1 << 20), want[i][1]);
    assert_int_equal(cuda_gc_pad_rows(13, 14), 14); /* capped */
    assert_int_equal(cuda_gc_pad_rows(13, 10), 13); /* a cap below n leaves n */
    int sizes = 0, last = 0;
    for (int n = 1; n <= 256; n++) {
        int p = cuda_gc_pad_rows(n, 256);
        assert_true(p >= n && p <= 256 && (p < 2 * n || n == 1) && (n <= 64 || p - n < n / 4));
        assert_int_equal(cuda_gc_pad_rows(p, 256), p);
        sizes += p != last;
        last = p;
    }
    assert_int_equal(sizes, 19);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_second_sighting_records_then_replays),
        cmocka_unit_test(test_lru_eviction_frees_the_oldest),
        cmocka_unit_test(test_scratch_move_drops_every_graph),
        cmocka_unit_test(test_failing_key_given_up_after_two_failures),
        cmocka_unit_test(test_seen_ring_forgets_oldest_keys),
        cmocka_unit_test(test_len_bucket),
        cmocka_unit_test(test_pad_rows),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
