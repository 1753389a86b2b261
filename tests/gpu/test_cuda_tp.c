/* test_cuda_tp.c — collectives (backend.h comm_*, all_reduce, send, recv; NCCL) and
 * tensor-parallel stages on GPUs. Label gpu: skips without a CUDA device; the NCCL cases skip,
 * saying why, on a build without NCCL (no comm ops) or a host where libnccl cannot be loaded,
 * and the two-GPU case on a host with one.
 *  - One GPU, a communicator of one rank: all_reduce of 1M floats is the identity (bit for
 *    bit), a send to itself and a receive from itself in one group copy the bytes; a count
 *    past the buffer, a peer outside the communicator and a rank past n are refused.
 *  - TP 2 on one GPU ("cuda:0+cuda:0": ranks sharing a GPU sum through host memory) against
 *    the whole model on cuda:0, over a prefill step and a padded decode step.
 *  - TP 2 on two GPUs ("cuda:0+cuda:1": NCCL's all-reduce) against one GPU, and against TP 2
 *    on one GPU, whose partial products are the same: a sum of two floats does not depend on
 *    the order, so they should agree to the bit.
 * On synthetic:tiny-tp-hd64 (8 heads, 4 KV heads, head_dim 64, 4 layers). MEDLEY_TEST_FILTER
 * picks cases. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/shard/stage.h"
#include "gpu/gpu_test_util.h"
#include "kernels/backend.h"

/* 0 when be can make a communicator (the comm ops are built and libnccl loads); else prints
 * why and returns 1. */
static int no_nccl(md_backend *be, uint8_t id[MD_COMM_ID_BYTES]) {
    if (!be->ops->all_reduce) {
        printf("SKIP: the CUDA backend was built without NCCL (no nccl.h found at configure)\n");
        return 1;
    }
    md_err e = {0};
    int rc = be->ops->comm_unique_id(be, id, &e);
    if (rc == MD_EUNSUPP) {
        printf("SKIP: %s\n", e.msg);
        return 1;
    }
    if (rc)
        fail_msg("comm_unique_id: %s", e.msg);
    return 0;
}

static void test_nccl_one_rank(void **st) {
    md_err e = {0};
    md_backend *be = NULL;
    if (md_backend_open("cuda:0", 0, &be, &e))
        fail_msg("open cuda:0: %s", e.msg);
    const md_backend_ops *o = be->ops;
    uint8_t id[MD_COMM_ID_BYTES];
    if (no_nccl(be, id)) {
        md_backend_free(be);
        skip();
    }
    md_comm *c = NULL;
    if (o->comm_init(be, id, 0, 1, &c, &e))
        fail_msg("comm_init rank 0 of 1: %s", e.msg);
    const int64_t N = 1 << 20;
    size_t bytes = (size_t)N * sizeof(float);
    float *x = malloc(bytes), *y = malloc(bytes);
    for (int64_t i = 0; i < N; i++)
        x[i] = (float)((i * 2654435761u) % 100003) * 1e-3f - 50.0f;
    md_buf *a = NULL, *b = NULL;
    assert_int_equal(o->buf_alloc(be, bytes, &a, &e), 0);
    assert_int_equal(o->buf_alloc(be, bytes, &b, &e), 0);
    assert_int_equal(o->buf_upload(be, a, 0, x, bytes, &e), 0);

    /* one rank: the sum is its own buffer */
    if (o->all_reduce(be, c, a, N, &e))
        fail_msg("all_reduce: %s", e.msg);
    assert_int_equal(o->buf_download(be, a, 0, y, bytes, &e), 0);
    assert_memory_equal(x, y, bytes);
    printf("all-reduce of %lld floats over 1 rank: identical\n", (long long)N);

    /* to itself: a send and a receive that wait for each other, issued together */
    size_t off = 4096, n = bytes - 2 * off;
    assert_int_equal(o->buf_zero(be, b, 0, bytes, &e), 0);
    assert_int_equal(o->comm_group_start(be, &e), 0);
    if (o->send(be, c, a, off, n, 0, &e) || o->recv(be, c, b, off, n, 0, &e))
        fail_msg("send / recv to itself: %s", e.msg);
    if (o->comm_group_end(be, &e))
        fail_msg("group end: %s", e.msg);
    memset(y, 0xff, bytes);
    assert_int_equal(o->buf_download(be, b, 0, y, bytes, &e), 0);
    assert_memory_equal((char *)x + off, (char *)y + off, n);
    for (size_t i = 0; i < off; i++)
        assert_int_equal(((unsigned char *)y)[i], 0);
    printf("send / recv of %zu bytes to itself: identical\n", n);

    /* refusals, before anything reaches NCCL (the communicator stays usable) */
    assert_int_equal(o->all_reduce(be, c, a, N + 1, &e), MD_ERANGE);
    printf("refused: %s\n", e.msg);
    assert_int_equal(o->send(be, c, a, 0, 64, 1, &e), MD_EINVAL);
    printf("refused: %s\n", e.msg);
    assert_non_null(strstr(e.msg, "peer 1"));
    assert_int_equal(o->recv(be, c, b, bytes - 8, 64, 0, &e), MD_ERANGE);
    printf("refused: %s\n", e.msg);
    md_comm *c2 = NULL;
    assert_int_equal(o->comm_init(be, id, 1, 1, &c2, &e), MD_EINVAL);
    printf("refused: %s\n", e.msg);
    assert_null(c2);
    assert_int_equal(o->all_reduce(be, c, a, N, &e), 0);
    assert_int_equal(o->sync(be, &e), 0);

    o->comm_free(be, c);
    o->buf_free(be, a);
    o->buf_free(be, b);
    md_backend_free(be);
    free(x);
    free(y);
}

/* ---- tensor-parallel stages ------------------------------------------------------------- */

#define MODEL "synthetic:tiny-tp-hd64"
#define BT 16  /* block tokens */
#define MAXB 8 /* blocks per sequence */
#define NSEQ 3

typedef struct {
    float *prefill, *decode; /* every token's logits, of the two steps */
    size_t n_prefill, n_decode;
    char desc[512];
} answer;

/* A step of NSEQ sequences of len[s] tokens from position pos0[s], every token's logits;
 * sequence s owns blocks s * MAXB ... */
typedef struct {
    int32_t tok[64], seq[64], pos[64], slot[64], logit_rows[64];
    int32_t seq_len[NSEQ], bt[NSEQ * MAXB];
    md_batch b;
} step;

static void make_step(step *st, const int *len, const int *pos0) {
    int T = 0;
    for (int s = 0; s < NSEQ; s++) {
        for (int k = 0; k < len[s]; k++, T++) {
            int p = pos0[s] + k;
            st->tok[T] = (int32_t)((s * 131 + p * 17) % 500 + 1);
            st->seq[T] = s;
            st->pos[T] = p;
            st->slot[T] = (s * MAXB + p / BT) * BT + p % BT;
            st->logit_rows[T] = T;
        }
        st->seq_len[s] = pos0[s] + len[s];
        for (int i = 0; i < MAXB; i++)
            st->bt[s * MAXB + i] = s * MAXB + i;
    }
    st->b = (md_batch){.n_tokens = T,
                       .n_seqs = NSEQ,
                       .tokens = st->tok,
                       .tok_seq = st->seq,
                       .tok_pos = st->pos,
                       .slot = st->slot,
                       .seq_len = st->seq_len,
                       .block_table = st->bt,
                       .max_blocks = MAXB,
                       .block_tokens = BT,
                       .logit_rows = st->logit_rows,
                       .n_logits = T};
}

/* The model on `device` (tp ranks when tp > 1): a prefill step of 17 tokens, then a decode
 * step of one token per sequence (three rows, run padded to four). */
static void run(const char *device, int tp, answer *a) {
    md_err e = {0};
    md_stage_config c = {.lo = 0,
                         .hi = 4,
                         .tp = tp,
                         .n_slots = NSEQ * MAXB * BT,
                         .max_tokens = 64,
                         .max_seqs = 64, /* logits of every token */
                         .max_blocks = MAXB,
                         .block_tokens = BT,
                         .n_ctx = MAXB * BT};
    snprintf(c.model, sizeof c.model, "%s", MODEL);
    snprintf(c.device, sizeof c.device, "%s", device);
    md_stage *s = NULL;
    if (md_stage_open(&c, &s, &e))
        fail_msg("open %s (tp %d): %s", device, tp, e.msg);
    snprintf(a->desc, sizeof a->desc, "%s", md_stage_describe(s));
    printf("%s\n", a->desc);
    const int plen[NSEQ] = {5, 3, 9}, p0[NSEQ] = {0, 0, 0};
    const int dlen[NSEQ] = {1, 1, 1}, d0[NSEQ] = {5, 3, 9};
    step st;
    make_step(&st, plen, p0);
    a->n_prefill = md_stage_out_floats(s, &st.b);
    a->prefill = malloc(a->n_prefill * sizeof(float));
    if (md_stage_run(s, &st.b, NULL, a->prefill, &e))
        fail_msg("prefill on %s: %s", device, e.msg);
    make_step(&st, dlen, d0);
    a->n_decode = md_stage_out_floats(s, &st.b);
    a->decode = malloc(a->n_decode * sizeof(float));
    if (md_stage_run(s, &st.b, NULL, a->decode, &e))
        fail_msg("decode on %s: %s", device, e.msg);
    md_stage_close(s);
}

static void answer_free(answer *a) {
    free(a->prefill);
    free(a->decode);
}

/* Largest |a - b| over both steps' logits, against tol * max(1, largest |a|). */
static void compare(const answer *a, const answer *b, double tol, const char *what) {
    assert_int_equal(a->n_prefill, b->n_prefill);
    assert_int_equal(a->n_decode, b->n_decode);
    double worst = 0, scale = 1;
    const float *pa[2] = {a->prefill, a->decode}, *pb[2] = {b->prefill, b->decode};
    size_t n[2] = {a->n_prefill, a->n_decode};
    for (int k = 0; k < 2; k++)
        for (size_t i = 0; i < n[k]; i++) {
            double d = fabs((double)pa[k][i] - pb[k][i]);
            if (!(d <= worst)) /* a NaN is the worst */
                worst = d;
            if (fabs(pa[k][i]) > scale)
                scale = fabs(pa[k][i]);
        }
    printf("logits: %s: largest difference %.3e (largest logit %.3f)\n", what, worst, scale);
    if (!(worst <= tol * scale))
        fail_msg("%s: logits differ by %.3e, more than %.1e x %.3f", what, worst, tol, scale);
}

static void test_tp2_one_gpu_host_allreduce(void **st) {
    answer one, tp2;
    run("cuda:0", 1, &one);
    run("cuda:0+cuda:0", 2, &tp2);
    assert_non_null(strstr(tp2.desc, "shared-memory all-reduce"));
    compare(&one, &tp2, 2e-2, "TP 2 on cuda:0 (host all-reduce) vs cuda:0");
    answer_free(&one);
    answer_free(&tp2);
}

static void test_tp2_two_gpus_nccl(void **st) {
    char why[256] = "";
    int n = md_device_count(why, sizeof why);
    if (n < 2) {
        printf("SKIP: TP 2 over NCCL needs two CUDA devices, this host has %d\n", n);
        skip();
    }
    md_err e = {0};
    md_backend *be = NULL;
    if (md_backend_open("cuda:0", 0, &be, &e))
        fail_msg("open cuda:0: %s", e.msg);
    uint8_t id[MD_COMM_ID_BYTES];
    int none = no_nccl(be, id);
    md_backend_free(be);
    if (none)
        skip();
    answer one, shared, nccl;
    run("cuda:0", 1, &one);
    run("cuda:0+cuda:0", 2, &shared);
    run("cuda:0+cuda:1", 2, &nccl);
    assert_non_null(strstr(nccl.desc, "NCCL all-reduce"));
    compare(&one, &nccl, 2e-2, "TP 2 on cuda:0 + cuda:1 (NCCL) vs cuda:0");
    compare(&shared, &nccl, 1e-5, "TP 2 on cuda:0 + cuda:1 (NCCL) vs TP 2 on cuda:0 (host)");
    answer_free(&one);
    answer_free(&shared);
    answer_free(&nccl);
}

int main(void) {
    int skip = gpu_test_skip_without_device();
    if (skip)
        return skip;
    gpu_test_filter_from_env();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nccl_one_rank),
        cmocka_unit_test(test_tp2_one_gpu_host_allreduce),
        cmocka_unit_test(test_tp2_two_gpus_nccl),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
