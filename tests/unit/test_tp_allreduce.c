/* test_tp_allreduce.c — a tensor-parallel stage sums its ranks' partial products through the
 * backends' all_reduce op (backend.h collectives; NCCL between GPUs) when every rank's backend
 * has one, and through host memory otherwise: engine/shard/tp.c's choice, its join of every rank
 * from the rank's own thread, and the answers, on the CPU.
 *
 * "commcpu" is the CPU backend with backend.h's collectives imitated in host memory (no GPU,
 * no NCCL here): comm_init blocks until every rank of the id joined, as ncclCommInitRank does;
 * all_reduce adds the ranks' buffers in rank order, as tp.c's host path does, so the two paths
 * give the same bits and any difference is tp.c's plumbing. "commcpu:nolib" has the ops but
 * cannot make an id (MD_EUNSUPP, as a host without libnccl). send / recv are not imitated.
 *
 * On synthetic:tiny-tp (8 heads, 4 KV heads, 4 layers) over a prefill step and a decode step:
 * TP 2 and TP 4 through the ops give logits bit-equal to the host path, with the ops called
 * twice per layer per step and md_tp_describe saying "NCCL all-reduce"; a group with one rank
 * without the ops, or whose backend cannot load the library, sums through host memory. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/shard/stage.h"
#include "kernels/backend.h"

/* ---- the imitation ------------------------------------------------------------------- */

/* One communicator's shared state, found by its id; freed when its last rank leaves. */
typedef struct group {
    uint8_t id[MD_COMM_ID_BYTES];
    int n, joined, left;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int bar_count;
    long bar_gen;
    float *slot[MD_TP_MAX];
    int64_t cap[MD_TP_MAX];
    struct group *next;
} group;

struct md_comm {
    group *g;
    int rank;
    float *sum;
    int64_t cap;
};

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static group *g_groups;
static int g_next_id;
static long g_reduces; /* all_reduce calls, every rank's */
static md_backend_ops g_ops, g_ops_nolib;

static void barrier(group *g) {
    pthread_mutex_lock(&g->mu);
    long gen = g->bar_gen;
    if (++g->bar_count == g->n) {
        g->bar_count = 0;
        g->bar_gen++;
        pthread_cond_broadcast(&g->cv);
    } else {
        while (gen == g->bar_gen)
            pthread_cond_wait(&g->cv, &g->mu);
    }
    pthread_mutex_unlock(&g->mu);
}

static int c_unique_id(md_backend *be, uint8_t id[MD_COMM_ID_BYTES], md_err *e) {
    memset(id, 0, MD_COMM_ID_BYTES);
    pthread_mutex_lock(&g_mu);
    snprintf((char *)id, MD_COMM_ID_BYTES, "commcpu-%d", ++g_next_id);
    pthread_mutex_unlock(&g_mu);
    return 0;
}

static int c_unique_id_nolib(md_backend *be, uint8_t id[MD_COMM_ID_BYTES], md_err *e) {
    return md_errf(e, MD_EUNSUPP, "NCCL cannot be loaded (imitated: commcpu:nolib)");
}

static int c_init(md_backend *be, const uint8_t id[MD_COMM_ID_BYTES], int rank, int n,
                  md_comm **out, md_err *e) {
    if (n < 1 || n > MD_TP_MAX || rank < 0 || rank >= n)
        return md_errf(e, MD_EINVAL, "commcpu: rank %d of %d", rank, n);
    pthread_mutex_lock(&g_mu);
    group *g = g_groups;
    while (g && memcmp(g->id, id, MD_COMM_ID_BYTES))
        g = g->next;
    if (!g) {
        g = calloc(1, sizeof *g);
        memcpy(g->id, id, MD_COMM_ID_BYTES);
        g->n = n;
        pthread_mutex_init(&g->mu, NULL);
        pthread_cond_init(&g->cv, NULL);
        g->next = g_groups;
        g_groups = g;
    }
    pthread_mutex_unlock(&g_mu);
    pthread_mutex_lock(&g->mu);
    g->joined++;
    pthread_cond_broadcast(&g->cv);
    while (g->joined < g->n) /* as ncclCommInitRank: back once every rank came */
        pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
    md_comm *m = calloc(1, sizeof *m);
    m->g = g;
    m->rank = rank;
    *out = m;
    return 0;
}

static void c_free(md_backend *be, md_comm *m) {
    group *g = m->g;
    pthread_mutex_lock(&g_mu);
    if (++g->left == g->n) {
        group **p = &g_groups;
        while (*p != g)
            p = &(*p)->next;
        *p = g->next;
        for (int i = 0; i < g->n; i++)
            free(g->slot[i]);
        pthread_mutex_destroy(&g->mu);
        pthread_cond_destroy(&g->cv);
        free(g);
    }
    pthread_mutex_unlock(&g_mu);
    free(m->sum);
    free(m);
}

static int grow(float **p, int64_t *cap, int64_t n) {
    if (n <= *cap)
        return 0;
    float *q = realloc(*p, (size_t)n * sizeof(float));
    if (!q)
        return -1;
    *p = q;
    *cap = n;
    return 0;
}

/* tp.c's host sum, rank order, between two barriers. */
static int c_all_reduce(md_backend *be, md_comm *m, md_buf *buf, int64_t n, md_err *e) {
    group *g = m->g;
    size_t bytes = (size_t)n * sizeof(float);
    if (grow(&g->slot[m->rank], &g->cap[m->rank], n) || grow(&m->sum, &m->cap, n))
        return md_errf(e, MD_ENOMEM, "commcpu: all-reduce of %lld floats", (long long)n);
    int rc = be->ops->buf_download(be, buf, 0, g->slot[m->rank], bytes, e);
    if (rc)
        return rc;
    pthread_mutex_lock(&g_mu);
    g_reduces++;
    pthread_mutex_unlock(&g_mu);
    barrier(g);
    memcpy(m->sum, g->slot[0], bytes);
    for (int k = 1; k < g->n; k++)
        for (int64_t i = 0; i < n; i++)
            m->sum[i] += g->slot[k][i];
    barrier(g);
    return be->ops->buf_upload(be, buf, 0, m->sum, bytes, e);
}

static int c_send(md_backend *be, md_comm *m, const md_buf *buf, size_t off, size_t bytes, int peer,
                  md_err *e) {
    return md_errf(e, MD_EUNSUPP, "commcpu: send is not imitated");
}

static int c_recv(md_backend *be, md_comm *m, md_buf *buf, size_t off, size_t bytes, int peer,
                  md_err *e) {
    return md_errf(e, MD_EUNSUPP, "commcpu: recv is not imitated");
}

static int c_group(md_backend *be, md_err *e) {
    return 0;
}

/* "commcpu" / "commcpu:nolib": a CPU backend whose ops table is a copy of its own with the
 * collectives added (every CPU op still gets the CPU backend it was made for). */
static int commcpu_open(const char *device, int n_threads, md_backend **out, md_err *e) {
    int rc = md_backend_cpu_open(n_threads, out, e);
    if (rc)
        return rc;
    pthread_mutex_lock(&g_mu);
    if (!g_ops.name) {
        g_ops = *(*out)->ops;
        g_ops.comm_unique_id = c_unique_id;
        g_ops.comm_init = c_init;
        g_ops.comm_free = c_free;
        g_ops.all_reduce = c_all_reduce;
        g_ops.send = c_send;
        g_ops.recv = c_recv;
        g_ops.comm_group_start = c_group;
        g_ops.comm_group_end = c_group;
        g_ops_nolib = g_ops;
        g_ops_nolib.comm_unique_id = c_unique_id_nolib;
    }
    pthread_mutex_unlock(&g_mu);
    (*out)->ops = strcmp(device, "commcpu:nolib") ? &g_ops : &g_ops_nolib;
    return 0;
}

/* ---- the stage ------------------------------------------------------------------------ */

#define MODEL "synthetic:tiny-tp:q8_0"
#define BT 16  /* block tokens */
#define MAXB 8 /* blocks per sequence */
#define NSEQ 3

typedef struct {
    float *prefill, *decode; /* logits of the two steps */
    size_t n_prefill, n_decode;
    char desc[512];
    long reduces;
} answer;

static md_stage_config config(const char *device, int tp) {
    md_stage_config c = {.lo = 0,
                         .hi = 4,
                         .n_threads = 1,
                         .tp = tp,
                         .n_slots = NSEQ * MAXB * BT,
                         .max_tokens = 64,
                         .max_seqs = 64, /* logits of every token */
                         .max_blocks = MAXB,
                         .block_tokens = BT,
                         .n_ctx = MAXB * BT};
    snprintf(c.model, sizeof c.model, "%s", MODEL);
    snprintf(c.device, sizeof c.device, "%s", device);
    return c;
}

/* A step of NSEQ sequences: prompts of len[s] tokens from position pos0[s]; every token's
 * logits. Sequence s owns blocks s * MAXB ... */
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

/* Open the stage, run a prefill step and a decode step, keep their logits. */
static void run(const char *device, int tp, answer *a) {
    md_err e = {0};
    md_stage_config c = config(device, tp);
    md_stage *s = NULL;
    long before = g_reduces;
    if (md_stage_open(&c, &s, &e))
        fail_msg("open %s (tp %d): %s", device, tp, e.msg);
    snprintf(a->desc, sizeof a->desc, "%s", md_stage_describe(s));
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
    a->reduces = g_reduces - before;
    printf("  %s: %s; %ld all_reduce calls\n", device, a->desc, a->reduces);
}

static void answer_free(answer *a) {
    free(a->prefill);
    free(a->decode);
}

static void assert_same_logits(const answer *a, const answer *b) {
    assert_int_equal(a->n_prefill, b->n_prefill);
    assert_int_equal(a->n_decode, b->n_decode);
    assert_memory_equal(a->prefill, b->prefill, a->n_prefill * sizeof(float));
    assert_memory_equal(a->decode, b->decode, a->n_decode * sizeof(float));
}

/* ---- the cases ------------------------------------------------------------------------ */

static void test_ops_path_equals_host_path(void **st) {
    const char *ops[] = {"commcpu+commcpu", "commcpu+commcpu+commcpu+commcpu"};
    const char *host[] = {"cpu+cpu", "cpu+cpu+cpu+cpu"};
    for (int i = 0; i < 2; i++) {
        int tp = 2 << i;
        answer h, o;
        run(host[i], tp, &h);
        run(ops[i], tp, &o);
        assert_non_null(strstr(h.desc, "shared-memory all-reduce"));
        assert_non_null(strstr(o.desc, "NCCL all-reduce"));
        assert_int_equal(h.reduces, 0);
        /* two per layer (attention, FFN), four layers, two steps, every rank */
        assert_int_equal(o.reduces, 2 * 4 * 2 * tp);
        assert_same_logits(&h, &o);
        answer_free(&h);
        answer_free(&o);
    }
}

static void test_host_path_unless_every_rank_has_the_ops(void **st) {
    answer h, mixed, nolib;
    run("cpu+cpu", 2, &h);
    run("commcpu+cpu", 2, &mixed);
    assert_non_null(strstr(mixed.desc, "shared-memory all-reduce"));
    assert_int_equal(mixed.reduces, 0);
    assert_same_logits(&h, &mixed);
    run("commcpu:nolib+commcpu:nolib", 2, &nolib); /* a warning, then the host path */
    assert_non_null(strstr(nolib.desc, "shared-memory all-reduce"));
    assert_int_equal(nolib.reduces, 0);
    assert_same_logits(&h, &nolib);
    answer_free(&h);
    answer_free(&mixed);
    answer_free(&nolib);
}

int main(void) {
    md_err e = {0};
    if (md_backend_register("commcpu", commcpu_open, &e)) {
        fprintf(stderr, "register: %s\n", e.msg);
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ops_path_equals_host_path),
        cmocka_unit_test(test_host_path_unless_every_rank_has_the_ops),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
