/* tp.c — a tensor-parallel stage: tp ranks, each a thread with its own backend and its share
 * of every layer (model.c md_model_load_tp), summing their partial products through shared
 * host memory, or through the backends' all_reduce (NCCL between GPUs) when every rank's
 * backend has one and no two ranks share a device (tp.h). */
#include "engine/shard/tp.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"

typedef struct md_tp md_tp;

typedef struct {
    md_tp *t;
    int rank;
    md_backend *be;
    md_model *m;
    md_kv_bufs kv;
    md_fwd f;
    pthread_t thread;
    int started;
    float *sum;    /* [max_tokens * n_embd] this rank's copy of the reduced sum */
    md_comm *comm; /* with t->nccl: this rank's communicator (joined and freed by its thread) */
    int rc;
    md_err err;
} rank_t;

struct md_tp {
    int n;
    rank_t r[MD_TP_MAX];
    md_stage_config c;
    int n_embd;
    float *slot[MD_TP_MAX]; /* [max_tokens * n_embd] each rank's partial product */
    /* the ranks' rendezvous: a job generation to start a pass, a barrier for the sums */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    long job, done_job;
    int n_done, quit;
    int bar_count;
    long bar_gen;
    int aborted; /* a rank failed: the others leave their barrier with an error */
    const md_batch *b;
    const float *in;
    float *out;
    /* the backends' all-reduce (nccl_group_init): the communicator's id, and the job that
     * has every rank join it instead of running a pass */
    int nccl, joining;
    uint8_t comm_id[MD_COMM_ID_BYTES];
    char desc[320];
};

/* Wait until every rank arrives; MD_EDEVICE when a rank failed during this pass. */
static int barrier(md_tp *t, int rank, md_err *e) {
    pthread_mutex_lock(&t->mu);
    long gen = t->bar_gen;
    if (++t->bar_count == t->n) {
        t->bar_count = 0;
        t->bar_gen++;
        pthread_cond_broadcast(&t->cv);
    } else {
        while (gen == t->bar_gen && !t->aborted)
            pthread_cond_wait(&t->cv, &t->mu);
    }
    int ab = t->aborted;
    pthread_mutex_unlock(&t->mu);
    return ab ? md_errf(e, MD_EDEVICE, "tensor-parallel rank %d: another rank failed", rank) : 0;
}

/* buf [n] (rank's partial) = the sum over the ranks, added in rank order on every rank so all
 * hold the same bits. */
static int allreduce(void *ctx, int rank, md_buf *buf, int64_t n, md_err *e) {
    md_tp *t = ctx;
    rank_t *r = &t->r[rank];
    size_t bytes = (size_t)n * sizeof(float);
    int rc = r->be->ops->buf_download(r->be, buf, 0, t->slot[rank], bytes, e);
    if (rc || (rc = barrier(t, rank, e)))
        return rc;
    float *s = r->sum;
    memcpy(s, t->slot[0], bytes);
    for (int k = 1; k < t->n; k++) {
        const float *p = t->slot[k];
        for (int64_t i = 0; i < n; i++)
            s[i] += p[i];
    }
    /* nobody overwrites a slot before every rank has read them all */
    if ((rc = barrier(t, rank, e)))
        return rc;
    return r->be->ops->buf_upload(r->be, buf, 0, s, bytes, e);
}

/* The all-reduce over the backends' collectives: queued on the rank's device like its other
 * ops, so a pass's ranks meet on their devices, not on the host. */
static int nccl_allreduce(void *ctx, int rank, md_buf *buf, int64_t n, md_err *e) {
    rank_t *r = &((md_tp *)ctx)->r[rank];
    return r->be->ops->all_reduce(r->be, r->comm, buf, n, e);
}

static void *rank_main(void *arg) {
    rank_t *r = arg;
    md_tp *t = r->t;
    long seen = 0;
    pthread_mutex_lock(&t->mu);
    for (;;) {
        while (!t->quit && t->job == seen)
            pthread_cond_wait(&t->cv, &t->mu);
        if (t->quit)
            break;
        seen = t->job;
        pthread_mutex_unlock(&t->mu);
        md_err_clear(&r->err);
        if (t->joining) /* comm_init returns once every rank joined: one thread each */
            r->rc = r->be->ops->comm_init(r->be, t->comm_id, r->rank, t->n, &r->comm, &r->err);
        else
            r->rc = md_model_forward_stage(r->m, &r->f, &r->kv, t->b, t->in,
                                           r->rank == 0 ? t->out : NULL, &r->err);
        pthread_mutex_lock(&t->mu);
        if (r->rc) {
            t->aborted = 1;
            pthread_cond_broadcast(&t->cv);
        }
        if (++t->n_done == t->n) {
            t->done_job = seen;
            pthread_cond_broadcast(&t->cv);
        }
    }
    pthread_mutex_unlock(&t->mu);
    if (r->comm) /* each rank's in its own thread, at once: NCCL may wait for the peers' */
        r->be->ops->comm_free(r->be, r->comm);
    return NULL;
}

void md_tp_close(md_tp *t) {
    if (!t)
        return;
    pthread_mutex_lock(&t->mu);
    t->quit = 1;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
    for (int i = 0; i < t->n; i++) {
        rank_t *r = &t->r[i];
        if (r->started)
            pthread_join(r->thread, NULL);
        if (r->m) {
            md_fwd_free(r->m, &r->f);
            md_kv_bufs_free(r->m, &r->kv);
            md_model_free(r->m);
        }
        md_backend_free(r->be);
        free(r->sum);
        free(t->slot[i]);
    }
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->cv);
    free(t);
}

/* Rank i's device: the i-th of a '+' list, or the one name. */
static void rank_device(const char *list, int i, char *out, size_t n) {
    const char *p = list;
    if (!strchr(list, '+')) {
        snprintf(out, n, "%s", *list ? list : "cpu");
        return;
    }
    for (int k = 0; k < i && p; k++)
        if ((p = strchr(p, '+')))
            p++;
    const char *end = p ? strchr(p, '+') : NULL;
    int len = p ? (end ? (int)(end - p) : (int)strlen(p)) : 0;
    snprintf(out, n, "%.*s", len, p ? p : "");
}

static int open_rank(md_tp *t, int i, const gguf_file *gf, int threads, md_err *e) {
    rank_t *r = &t->r[i];
    const md_stage_config *c = &t->c;
    char dev[64];
    rank_device(c->device, i, dev, sizeof dev);
    r->t = t;
    r->rank = i;
    int rc;
    if ((rc = md_backend_open(dev, threads, &r->be, e)) ||
        (rc = md_model_load_tp(gf, r->be, c->lo, c->hi, i, t->n, &r->m, e)))
        return md_errctx(e, "tensor-parallel rank %d on %s: ", i, dev);
    r->m->allreduce = allreduce;
    r->m->allreduce_ctx = t;
    const md_hparams *hp = &r->m->hp; /* the rank's heads and FFN width */
    int cols = hp->n_ff > hp->n_embd ? hp->n_ff : hp->n_embd;
    if (hp->n_head * hp->head_dim > cols)
        cols = hp->n_head * hp->head_dim;
    md_reserve rs = {.max_tokens = c->max_tokens,
                     .max_seqs = c->max_seqs,
                     .max_cols = cols,
                     .max_ctx = c->n_ctx,
                     .max_blocks = c->max_blocks,
                     .n_heads = hp->n_head};
    size_t fl = (size_t)c->max_tokens * hp->n_embd;
    if ((rc = md_kv_bufs_alloc_type(r->m, c->n_slots,
                                    md_stage_kv_type(c->kv_type, r->be->ops->kv_cache_type), &r->kv,
                                    e)) ||
        (rc = md_fwd_alloc(r->m, c->max_tokens, c->max_seqs, &r->f, e)) ||
        (rc = r->be->ops->reserve(r->be, &rs, e)))
        return md_errctx(e, "tensor-parallel rank %d: ", i);
    r->sum = malloc(fl * sizeof(float));
    t->slot[i] = malloc(fl * sizeof(float));
    if (!r->sum || !t->slot[i])
        return md_errf(e, MD_ENOMEM, "tensor-parallel rank %d: no memory for the all-reduce", i);
    t->n_embd = hp->n_embd;
    return 0;
}

/* Sum through the backends' all_reduce (NCCL) when every rank's backend has one and no two
 * ranks name one CUDA device (NCCL takes a GPU once; ranks sharing one sum through the host):
 * rank 0's backend makes the communicator's id and every rank joins it from its own thread
 * (a joining job). Where the library cannot be loaded (MD_EUNSUPP) the host path stays, with
 * a warning; a failed join fails the open. Called with the rank threads running. */
static int nccl_group_init(md_tp *t, md_err *e) {
    md_device_id id[MD_TP_MAX];
    for (int i = 0; i < t->n; i++) {
        if (!t->r[i].be->ops->all_reduce)
            return 0;
        char dev[64];
        md_err pe;
        rank_device(t->c.device, i, dev, sizeof dev);
        if (md_device_parse(dev, &id[i], &pe)) /* a registered test device: its own */
            id[i].kind = MD_DEVICE_CPU;
        for (int k = 0; k < i; k++)
            if (id[i].kind == MD_DEVICE_CUDA && id[k].kind == MD_DEVICE_CUDA &&
                id[i].index == id[k].index)
                return 0;
    }
    md_backend *be0 = t->r[0].be;
    md_err ie = {0};
    int rc = be0->ops->comm_unique_id(be0, t->comm_id, &ie);
    if (rc == MD_EUNSUPP) {
        MD_WARN("tp", "tensor-parallel ranks sum through host memory: %s", ie.msg);
        return 0;
    }
    if (rc) {
        if (e)
            *e = ie;
        return rc;
    }
    t->joining = 1;
    rc = md_tp_run(t, NULL, NULL, NULL, e);
    t->joining = 0;
    if (rc)
        return md_errctx(e, "tensor-parallel ranks joining their NCCL communicator: ");
    t->nccl = 1;
    for (int i = 0; i < t->n; i++)
        t->r[i].m->allreduce = nccl_allreduce;
    return 0;
}

int md_tp_open(const md_stage_config *c, const gguf_file *gf, md_tp **out, md_err *e) {
    *out = NULL;
    md_tp *t = calloc(1, sizeof *t);
    if (!t)
        return md_errf(e, MD_ENOMEM, "out of memory");
    t->c = *c;
    t->n = c->tp;
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv, NULL);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int threads = c->n_threads > 0 ? c->n_threads / t->n : (int)(cores / t->n);
    if (threads < 1)
        threads = 1;
    int rc = 0;
    for (int i = 0; i < t->n && rc == 0; i++)
        rc = open_rank(t, i, gf, threads, e);
    for (int i = 0; i < t->n && rc == 0; i++) {
        if (pthread_create(&t->r[i].thread, NULL, rank_main, &t->r[i]))
            rc = md_errf(e, MD_ENOMEM, "cannot start tensor-parallel rank %d", i);
        else
            t->r[i].started = 1;
    }
    if (rc == 0)
        rc = nccl_group_init(t, e);
    if (rc) {
        md_tp_close(t);
        return rc;
    }
    snprintf(t->desc, sizeof t->desc, "%d tensor-parallel ranks (%s, %s all-reduce)", t->n,
             t->r[0].be->ops->describe(t->r[0].be), t->nccl ? "NCCL" : "shared-memory");
    *out = t;
    return 0;
}

int md_tp_run(md_tp *t, const md_batch *b, const float *in, float *out, md_err *e) {
    pthread_mutex_lock(&t->mu);
    t->b = b;
    t->in = in;
    t->out = out;
    t->n_done = 0;
    t->aborted = 0;
    t->bar_count = 0;
    long job = ++t->job;
    pthread_cond_broadcast(&t->cv);
    while (t->done_job != job)
        pthread_cond_wait(&t->cv, &t->mu);
    pthread_mutex_unlock(&t->mu);
    for (int i = 0; i < t->n; i++) /* the first failure, not a rank that only saw it */
        if (t->r[i].rc && t->r[i].err.code != MD_EDEVICE) {
            if (e)
                *e = t->r[i].err;
            return t->r[i].rc;
        }
    for (int i = 0; i < t->n; i++)
        if (t->r[i].rc) {
            if (e)
                *e = t->r[i].err;
            return t->r[i].rc;
        }
    return 0;
}

const char *md_tp_describe(md_tp *t) {
    return t->desc;
}
