/* gpu_test_util.h — what the GPU tests share: skipping (exit 77, ctest's SKIP_RETURN_CODE)
 * with the driver's reason when no CUDA device is usable, the test model and prompts, and
 * (after <cmocka.h>) the test filter and CHK. */
#ifndef MEDLEY_TESTS_GPU_UTIL_H
#define MEDLEY_TESTS_GPU_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/backend_cuda.h"

#define GPU_TEST_SKIP 77

/* 0 when a device is there, else prints why and returns GPU_TEST_SKIP. */
static inline int gpu_test_skip_without_device(void) {
    char why[256] = "";
    if (md_cuda_device_count(why, sizeof why) > 0)
        return 0;
    printf("SKIP: no CUDA device (%s)\n", why);
    return GPU_TEST_SKIP;
}

/* tests/fixtures: $MEDLEY_FIXTURES_DIR when set (binaries built on one machine and run on a
 * GPU host from another checkout), else the path compiled in. */
static inline const char *gpu_fixtures_dir(void) {
    const char *d = getenv("MEDLEY_FIXTURES_DIR");
    return d && *d ? d : MEDLEY_FIXTURES;
}

/* The model the engine-level GPU tests run: $MEDLEY_GPU_TEST_MODEL when set (e.g.
 * synthetic:tiny-hd64:q4_0 for the CPU emulator's runs, tests/cuda_emu_rt.cmake), else `dflt`
 * (the fetched SmolLM2 file, NULL when absent). */
static inline const char *gpu_test_model(const char *dflt) {
    const char *m = getenv("MEDLEY_GPU_TEST_MODEL");
    return m && *m ? m : dflt;
}

/* Prompt token k of prompt i, 100 + (i * 131 + k * 17) mod 20000 as the tests were written
 * for SmolLM2 (49152 tokens), folded into smaller vocabularies. */
static inline int32_t gpu_test_token(int i, int k, int n_vocab) {
    int span = n_vocab > 20100 ? 20000 : n_vocab - 100;
    return (int32_t)(100 + (i * 131 + k * 17) % span);
}

/* Whether environment flag `name` is on: set, not empty and not "0". */
static inline int gpu_test_env_on(const char *name) {
    const char *v = getenv(name);
    return v && *v && strcmp(v, "0");
}

/* A greedy choice one backend made by a top-2 logit (or logprob) gap under this is a tie
 * either backend may break its own way: twice the largest vocabulary-centered logit
 * difference measured between CUDA and the CPU on the emulator (0.98), as the top two may
 * move apart by both. test_cuda_e2e (greedy) and test_cuda_graphs (penalised greedy). */
#define GPU_NEAR_TIE 2.0

#ifdef CMOCKA_H_
/* MEDLEY_TEST_FILTER: run only the cases matching it (cmocka's pattern, e.g.
 * "*penalties*"), for the emulator's runs by hand and its ctest entries of one case. */
static inline void gpu_test_filter_from_env(void) {
    const char *only = getenv("MEDLEY_TEST_FILTER");
    if (only && *only)
        cmocka_set_test_filter(only);
}

/* CHK(call) fails the test with the error's sentence when call, given E for its md_err *,
 * does not return 0. */
#define CHK(call)                                                                                  \
    do {                                                                                           \
        md_err e_ = {0};                                                                           \
        if ((call) != 0)                                                                           \
            fail_msg("%s: %s", #call, e_.msg);                                                     \
    } while (0)
#define E (&e_)
#endif

#endif
