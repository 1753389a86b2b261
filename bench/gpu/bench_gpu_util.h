/* bench_gpu_util.h — what the GPU benchmarks share: failing on a call's error, skipping
 * without a device, the UTC date of a result, and writing the result's JSON to --out. Header-only
 * (each benchmark is one program). */
#ifndef MEDLEY_BENCH_GPU_UTIL_H
#define MEDLEY_BENCH_GPU_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "kernels/cuda/cuda_ops.h"

/* Run call (0 on success, error in the md_err e); on failure say which call and exit 1. */
#define BENCH_TRY(prog, e, call)                                                                   \
    do {                                                                                           \
        if ((call) != 0) {                                                                         \
            fprintf(stderr, "%s: %s: %s\n", (prog), #call, (e).msg);                               \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* 0 when a CUDA device is usable; otherwise prints "SKIP: ..." and returns 77 (ctest's
 * skip code, which run-device-check.sh reports as skipped). */
static inline int bench_gpu_or_skip(void) {
    char why[256];
    if (cuda_device_count(why, sizeof why) > 0)
        return 0;
    printf("SKIP: no CUDA device (%s)\n", why);
    return 77;
}

/* Device 0 for a benchmark: 77 after "SKIP: ..." without one; else 0 with its description
 * in info and a context in *c, or 1 after saying what failed. */
static inline int bench_gpu_open(const char *prog, cuda_device_info *info, cuda_ctx **c) {
    int skip = bench_gpu_or_skip();
    if (skip)
        return skip;
    md_err e = {0};
    if (cuda_device_query(0, info, &e) || cuda_ctx_open(0, c, &e)) {
        fprintf(stderr, "%s: cuda:0: %s\n", prog, e.msg);
        return 1;
    }
    return 0;
}

static inline void bench_utc_date(char *out, size_t n) {
    time_t now = time(NULL);
    struct tm tmv;
    gmtime_r(&now, &tmv);
    strftime(out, n, "%Y-%m-%dT%H:%M:%SZ", &tmv);
}

/* Print json and, with path, write it there too. 0, or 1 after saying what failed. */
static inline int bench_emit_json(const char *prog, const char *json, const char *path) {
    printf("%s\n", json);
    if (!path)
        return 0;
    FILE *f = fopen(path, "w");
    int bad = !f || fprintf(f, "%s\n", json) < 0;
    if (f && fclose(f))
        bad = 1;
    if (bad)
        fprintf(stderr, "%s: cannot write %s\n", prog, path);
    return bad;
}

#endif
