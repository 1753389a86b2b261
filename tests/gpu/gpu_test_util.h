/* gpu_test_util.h — what the GPU tests share: skipping (exit 77, ctest's SKIP_RETURN_CODE)
 * with the driver's reason when no CUDA device is usable. */
#ifndef MEDLEY_TESTS_GPU_UTIL_H
#define MEDLEY_TESTS_GPU_UTIL_H

#include <stdio.h>
#include <stdlib.h>

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

#endif
