/* gpu_pair.h — what the op-by-op GPU tests (test_cuda_backend.c, test_cuda_encoder.c) share:
 * the CPU backend (the reference) and cuda:0 opened side by side as `cpu` and `gpu`, buffers
 * made on both from the same host data, and a result compared between them relative to the rms
 * of the CPU's. Include once per test program, after <cmocka.h>. */
#ifndef MEDLEY_TESTS_GPU_PAIR_H
#define MEDLEY_TESTS_GPU_PAIR_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "gpu/gpu_test_util.h"
#include "kernels/backend.h"

static md_backend *cpu, *gpu;

/* 0 with cpu ("cpu:2") and gpu ("cuda:0") open and described on stdout; GPU_TEST_SKIP
 * without a device; 1 (and why on stderr) when one does not open. */
static inline int gpu_pair_open(void) {
    int skip = gpu_test_skip_without_device();
    if (skip)
        return skip;
    md_err e = {0};
    if (md_backend_open("cpu:2", 0, &cpu, &e) || md_backend_open("cuda:0", 0, &gpu, &e)) {
        fprintf(stderr, "open: %s\n", e.msg);
        return 1;
    }
    printf("%s\n%s\n", cpu->ops->describe(cpu), gpu->ops->describe(gpu));
    return 0;
}

static inline void gpu_pair_close(void) {
    md_backend_free(gpu);
    md_backend_free(cpu);
}

static uint64_t gpu_pair_rng = 0x9E3779B97F4A7C15ull;
/* Uniform in [-1, 1): the same sequence in every run. */
static inline float frand(void) {
    gpu_pair_rng ^= gpu_pair_rng << 13;
    gpu_pair_rng ^= gpu_pair_rng >> 7;
    gpu_pair_rng ^= gpu_pair_rng << 17;
    return (float)((gpu_pair_rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}
/* x[i] = shift + scale * frand() */
static inline void fill(float *x, size_t n, float scale, float shift) {
    for (size_t i = 0; i < n; i++)
        x[i] = shift + scale * frand();
}

/* n bytes on be, filled from h when h is not NULL. */
static inline md_buf *mk(md_backend *be, const void *h, size_t n) {
    md_buf *b;
    CHK(be->ops->buf_alloc(be, n, &b, E));
    if (h)
        CHK(be->ops->buf_upload(be, b, 0, h, n, E));
    return b;
}
static inline void dl(md_backend *be, md_buf *b, void *h, size_t n) {
    CHK(be->ops->buf_download(be, b, 0, h, n, E));
}
/* The host's data as a tensor of be (ne1 rows of ne0 elements of type), wrapped, not copied;
 * *keep is the buffer to free. */
static inline md_tensor wrap(md_backend *be, const void *data, int type, int64_t ne0, int64_t ne1,
                             md_buf **keep) {
    size_t rb = md_type_row_bytes(type, ne0);
    CHK(be->ops->buf_wrap(be, data, rb * ne1, keep, E));
    return (md_tensor){*keep, 0, type, ne0, ne1, rb};
}

/* Both sides get the same data in one call. */
typedef struct {
    md_buf *c, *g;
} pair;
static inline pair mk2(const void *h, size_t n) {
    return (pair){mk(cpu, h, n), mk(gpu, h, n)};
}
static inline void free2(pair p) {
    cpu->ops->buf_free(cpu, p.c);
    gpu->ops->buf_free(gpu, p.g);
}

/* Every one of the n_floats of p within rel * rms(cpu's) of the CPU's; the worst printed
 * after `what`. */
static inline void compare(pair p, size_t n_floats, double rel, const char *what) {
    float *a = malloc(n_floats * 4), *b = malloc(n_floats * 4);
    assert_true(a && b);
    dl(cpu, p.c, a, n_floats * 4);
    dl(gpu, p.g, b, n_floats * 4);
    double ss = 0, worst = 0;
    for (size_t i = 0; i < n_floats; i++)
        ss += (double)a[i] * a[i];
    double rms = sqrt(ss / n_floats), tol = rel * (rms > 0 ? rms : 1);
    for (size_t i = 0; i < n_floats; i++) {
        double err = fabs((double)a[i] - b[i]);
        if (!(err <= tol))
            fail_msg("%s[%zu]: cpu %.7g, cuda %.7g (tolerance %.3g)", what, i, a[i], b[i], tol);
        if (err > worst)
            worst = err;
    }
    printf("%-28s max |cpu - cuda| %.2e (rms %.2e)\n", what, worst, rms);
    free(a);
    free(b);
}

#endif
