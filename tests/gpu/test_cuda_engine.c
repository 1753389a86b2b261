/* test_cuda_engine.c — opening the engine on a CUDA device, on synthetic models (no file
 * needed). A model whose heads the CUDA attention kernels cannot take (synthetic:tiny,
 * head_dim 32) is refused by md_engine_open itself, before anything is loaded, with
 * MD_EUNSUPP naming the model and the supported head sizes; not accepted and then failed at
 * its first step, as it was. One they take (synthetic:tiny-hd64, the same model with
 * head_dim 64) opens and generates greedily, twice the same. Runs on a GPU (label gpu, skips
 * without one) and on the CPU emulator as test_cuda_engine_emu. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <string.h>

#include "engine/engine.h"
#include "gpu/gpu_test_util.h"

static void test_unsupported_head_dim_refused_at_open(void **state) {
    md_engine_config cfg = {.model_path = "synthetic:tiny:f16", .device = "cuda:0",
                            .max_seqs = 2, .n_ctx = 64};
    md_engine *eng = NULL;
    md_err e = {0};
    assert_int_equal(md_engine_open(&cfg, &eng, &e), MD_EUNSUPP);
    assert_null(eng);
    printf("refused: %s\n", e.msg);
    assert_non_null(strstr(e.msg, "synthetic:tiny:f16"));
    assert_non_null(strstr(e.msg, "head_dim 32"));
    assert_non_null(strstr(e.msg, "64, 128 or 256"));
    /* the CPU backend takes it */
    cfg.device = "cpu";
    assert_int_equal(md_engine_open(&cfg, &eng, &e), 0);
    md_engine_close(eng);
}

#define NP 2
#define GEN 6

static void generate(int32_t out[NP][GEN]) {
    md_engine_config cfg = {.model_path = "synthetic:tiny-hd64:q4_0", .device = "cuda:0",
                            .max_seqs = NP, .n_ctx = 64};
    md_engine *eng;
    md_err e = {0};
    if (md_engine_open(&cfg, &eng, &e))
        fail_msg("engine open: %s", e.msg);
    uint64_t ids[NP];
    for (int i = 0; i < NP; i++) {
        int32_t p[12];
        for (int k = 0; k < 12; k++)
            p[k] = gpu_test_token(i, k, md_engine_n_vocab(eng));
        md_sampling s;
        md_sampling_default(&s);
        s.max_tokens = GEN;
        s.ignore_eos = 1;
        if (md_engine_submit(eng, p, 6 + 6 * i, &s, &ids[i], &e))
            fail_msg("submit: %s", e.msg);
    }
    for (int guard = 0;; guard++) {
        assert_true(guard < 100);
        md_step_result r;
        if (md_engine_step(eng, &r, &e))
            fail_msg("step: %s", e.msg);
        if (r.n_live == 0)
            break;
    }
    for (int i = 0; i < NP; i++) {
        const int32_t *t;
        int n;
        assert_int_equal(md_seq_tokens(eng, ids[i], &t, &n), 0);
        assert_int_equal(n, GEN);
        for (int k = 0; k < n; k++)
            assert_true(t[k] >= 0 && t[k] < md_engine_n_vocab(eng));
        memcpy(out[i], t, sizeof out[i]);
    }
    md_engine_close(eng);
}

static void test_supported_head_dim_runs(void **state) {
    int32_t a[NP][GEN], b[NP][GEN];
    generate(a);
    generate(b);
    for (int i = 0; i < NP; i++) {
        printf("prompt %d:", i);
        for (int k = 0; k < GEN; k++)
            printf(" %d", a[i][k]);
        printf("\n");
        assert_memory_equal(a[i], b[i], sizeof a[i]);
    }
}

int main(void) {
    int skip = gpu_test_skip_without_device();
    if (skip)
        return skip;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unsupported_head_dim_refused_at_open),
        cmocka_unit_test(test_supported_head_dim_runs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
