/* pipeline.c — the head's stages and the micro-batch pipeline over them (pipeline.h). */
#define _GNU_SOURCE /* memrchr */
#include "engine/shard/pipeline.h"

#include "common/util.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MB_MAX 64 /* micro-batches in one step */
/* The default count (docs/sharding.md "Pipelining"): the CPU kernels lose little on products
 * of a few rows, so many small micro-batches shrink the bubble; a GPU reads every weight once
 * per product whatever its rows, so each micro-batch costs a full weight read there. */
#define MB_PER_STAGE 8
#define MB_PER_STAGE_GPU 2

typedef struct md_pipe md_pipe;

/* A link and the thread that feeds it. */
typedef struct {
    md_pipe *p;
    int idx;
    md_link *link;
    pthread_t thread;
    int started;
    int q[MB_MAX]; /* micro-batches waiting, FIFO */
    int q_head, q_len;
    pthread_cond_t cv;
} hop;

/* One micro-batch of the current step: a token range of the step's batch, re-based. */
typedef struct {
    md_batch b;
    int t0; /* first token in the step */
    int l0; /* logit rows before it */
} mbatch;

struct md_pipe {
    int n;
    hop hops[MD_STAGE_MAX];
    md_stage_config base;
    md_pipe_opts o;
    int n_embd, n_vocab;
    int gpu; /* a stage runs on a GPU */
    pthread_mutex_t mu;
    pthread_cond_t done_cv;
    int quit;
    /* the step in flight */
    mbatch mb[MB_MAX];
    int n_mb, n_done, failed;
    float *logits;
    md_err err; /* the first failure; kept while broken */
    int broken;
    /* scratch sized at open */
    float *hid[2];  /* [max_tokens * n_embd] each: a micro-batch's input and output */
    int32_t *seq;   /* [max_tokens] re-based tok_seq */
    int32_t *slen;  /* [max_seqs + MB_MAX] */
    int32_t *table; /* [(max_seqs + MB_MAX) * max_blocks] */
    int32_t *lrows; /* [max_seqs] */
    md_pipe_stats st;
    char desc[MD_STAGE_MAX * 480];
};

/* ---- spec ---- */

static int parse_one(const char *s, size_t len, md_stage_spec *sp, md_err *e) {
    char buf[512];
    if (len == 0 || len >= sizeof buf)
        return md_errf(e, MD_EINVAL, "stage \"%.*s\": empty or too long", (int)len, s);
    memcpy(buf, s, len);
    buf[len] = 0;
    memset(sp, 0, sizeof *sp);
    char *dev = buf;
    if (!strncmp(buf, "tcp://", 6)) {
        char *hp = buf + 6, *slash = strchr(hp, '/');
        char *colon = slash ? memrchr(hp, ':', (size_t)(slash - hp)) : NULL;
        if (!slash || !colon || colon == hp)
            return md_errf(e, MD_EINVAL, "stage \"%s\": expected tcp://HOST:PORT/DEVICE:LO-HI",
                           buf);
        char *end;
        long port = strtol(colon + 1, &end, 10);
        if (end != slash || port < 1 || port > 65535)
            return md_errf(e, MD_EINVAL, "stage \"%s\": port is not 1-65535", buf);
        if ((size_t)(colon - hp) >= sizeof sp->host)
            return md_errf(e, MD_EINVAL, "stage \"%s\": host name too long", buf);
        memcpy(sp->host, hp, (size_t)(colon - hp));
        if (sp->host[0] == '[' && sp->host[strlen(sp->host) - 1] == ']') { /* [::1] */
            memmove(sp->host, sp->host + 1, strlen(sp->host));
            sp->host[strlen(sp->host) - 1] = 0;
        }
        sp->port = (int)port;
        dev = slash + 1;
    }
    char *colon = strrchr(dev, ':');
    if (!colon || colon == dev)
        return md_errf(e, MD_EINVAL, "stage \"%s\": expected DEVICE:LO-HI (e.g. cpu:0-11)", buf);
    char *end;
    long lo = strtol(colon + 1, &end, 10), hi;
    if (end == colon + 1 || *end != '-' || lo < 0)
        return md_errf(e, MD_EINVAL, "stage \"%s\": layers \"%s\" are not LO-HI", buf, colon + 1);
    char *h = end + 1;
    hi = strtol(h, &end, 10);
    if (end == h || *end || hi < lo || hi > 100000)
        return md_errf(e, MD_EINVAL, "stage \"%s\": layers \"%s\" are not LO-HI with LO <= HI", buf,
                       colon + 1);
    if ((size_t)(colon - dev) >= sizeof sp->device)
        return md_errf(e, MD_EINVAL, "stage \"%s\": device name too long", buf);
    memcpy(sp->device, dev, (size_t)(colon - dev));
    sp->lo = (int)lo;
    sp->hi = (int)hi + 1;
    return 0;
}

int md_stages_parse(const char *spec, int n_layer, md_stage_spec *out, int max, int *n, md_err *e) {
    *n = 0;
    if (!spec || !*spec)
        return md_errf(e, MD_EINVAL, "no stages given");
    const char *s = spec;
    for (;;) {
        const char *comma = strchr(s, ',');
        size_t len = comma ? (size_t)(comma - s) : strlen(s);
        if (*n == max)
            return md_errf(e, MD_EINVAL, "more than %d stages in \"%s\"", max, spec);
        int rc = parse_one(s, len, &out[*n], e);
        if (rc)
            return rc;
        int want = *n ? out[*n - 1].hi : 0;
        if (out[*n].lo != want)
            return md_errf(e, MD_EINVAL,
                           "stage %d starts at layer %d; the layers before end at %d "
                           "(stages must cover the layers in order, without gaps or overlaps)",
                           *n + 1, out[*n].lo, want - 1);
        (*n)++;
        if (!comma)
            break;
        s = comma + 1;
    }
    if (n_layer >= 0 && out[*n - 1].hi != n_layer)
        return md_errf(e, MD_EINVAL, "the stages end at layer %d; the model has layers 0-%d",
                       out[*n - 1].hi - 1, n_layer - 1);
    return 0;
}

/* ---- threads ---- */

static void push(md_pipe *p, int i, int mb) {
    hop *h = &p->hops[i];
    h->q[(h->q_head + h->q_len++) % MB_MAX] = mb;
    pthread_cond_signal(&h->cv);
}

static void *hop_main(void *arg) {
    hop *h = arg;
    md_pipe *p = h->p;
    int last = h->idx == p->n - 1;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->quit && h->q_len == 0)
            pthread_cond_wait(&h->cv, &p->mu);
        if (p->quit)
            break;
        int k = h->q[h->q_head];
        h->q_head = (h->q_head + 1) % MB_MAX;
        h->q_len--;
        int skip = p->failed;
        pthread_mutex_unlock(&p->mu);
        mbatch *m = &p->mb[k];
        int rc = 0;
        md_err e = {0};
        uint64_t t0 = md_mono_ns();
        if (!skip) {
            size_t off = (size_t)m->t0 * p->n_embd;
            const float *in = h->idx == 0 ? NULL : p->hid[h->idx % 2] + off;
            float *out = last ? p->logits + (size_t)m->l0 * (m->b.argmax_only ? 1 : p->n_vocab)
                              : p->hid[(h->idx + 1) % 2] + off;
            rc = h->link->ops->run(h->link, &m->b, in, out, &e);
        }
        pthread_mutex_lock(&p->mu);
        p->st.busy_s[h->idx] += (double)(md_mono_ns() - t0) / 1e9;
        if (rc && !p->failed) {
            p->failed = 1;
            p->err = e;
            md_errctx(&p->err, "pipeline stage %d (%s): ", h->idx + 1,
                      h->link->ops->describe(h->link));
            p->err.code = rc;
        }
        if (!skip && !rc && !last && !p->failed) {
            push(p, h->idx + 1, k);
        } else if (++p->n_done == p->n_mb) {
            pthread_cond_signal(&p->done_cv);
        }
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

/* ---- open / close ---- */

void md_pipe_close(md_pipe *p) {
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->quit = 1;
    for (int i = 0; i < p->n; i++)
        pthread_cond_signal(&p->hops[i].cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n; i++) {
        if (p->hops[i].started)
            pthread_join(p->hops[i].thread, NULL);
        md_link_free(p->hops[i].link);
        pthread_cond_destroy(&p->hops[i].cv);
    }
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->done_cv);
    free(p->hid[0]);
    free(p->hid[1]);
    free(p->seq);
    free(p->slen);
    free(p->table);
    free(p->lrows);
    free(p);
}

int md_pipe_open(const md_stage_spec *sp, int n, const md_stage_config *base, const md_pipe_opts *o,
                 md_pipe **out, md_err *e) {
    *out = NULL;
    if (n < 1 || n > MD_STAGE_MAX)
        return md_errf(e, MD_EINVAL, "a pipeline has 1-%d stages, not %d", MD_STAGE_MAX, n);
    md_pipe *p = calloc(1, sizeof *p);
    if (!p)
        return md_errf(e, MD_ENOMEM, "out of memory");
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->done_cv, NULL);
    p->n = n;
    p->base = *base;
    if (o)
        p->o = *o;
    for (int i = 0; i < n; i++)
        pthread_cond_init(&p->hops[i].cv, NULL);
    int rc = 0, n_local = 0;
    size_t desc_len = 0;
    for (int i = 0; i < n; i++)
        n_local += !sp[i].host[0];
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    md_stage_secret secret = {0};
    if (n_local < n)
        rc = md_stage_secret_from(p->o.secret_file, "a head with remote stages", &secret, e);
    md_link_tcp_opts lo = {
        .secret = &secret, .timeout_ms = p->o.timeout_ms, .load_timeout_ms = p->o.load_timeout_ms};
    for (int i = 0; i < n && rc == 0; i++) {
        md_stage_config c = *base;
        /* local stages run side by side: they share the cores unless told otherwise */
        if (c.n_threads == 0 && n_local > 1)
            c.n_threads = cores > n_local ? (int)(cores / n_local) : 1;
        c.lo = sp[i].lo;
        c.hi = sp[i].hi;
        snprintf(c.device, sizeof c.device, "%s", sp[i].device);
        c.tp = p->o.tp;
        if (strchr(c.device, '+')) { /* "cpu+cpu": one rank per device */
            c.tp = 1;
            for (const char *d = c.device; (d = strchr(d, '+')); d++)
                c.tp++;
        }
        c.mem_cap = p->o.mem_cap;
        p->gpu |= strstr(c.device, "cuda") != NULL;
        hop *h = &p->hops[i];
        h->p = p;
        h->idx = i;
        if (sp[i].host[0])
            rc = md_link_tcp_open(sp[i].host, sp[i].port, &c, &lo, &h->link, e);
        else
            rc = md_link_local_open(&c, &h->link, e);
        if (rc) {
            md_errctx(e, "stage %d of %d: ", i + 1, n);
            break;
        }
        desc_len += (size_t)snprintf(p->desc + desc_len, sizeof p->desc - desc_len, "%s%s",
                                     i ? "; " : "", h->link->ops->describe(h->link));
        if (desc_len >= sizeof p->desc)
            desc_len = sizeof p->desc - 1;
    }
    md_stage_secret_clear(&secret);
    /* the model's widths, from the head's view of its metadata */
    p->n_embd = p->o.n_embd;
    p->n_vocab = p->o.n_vocab;
    if (rc == 0 && (p->n_embd < 1 || p->n_vocab < 1))
        rc = md_errf(e, MD_EINVAL, "pipeline: width %d and vocabulary %d of %s are not usable",
                     p->n_embd, p->n_vocab, base->model);
    size_t T = (size_t)base->max_tokens, S = (size_t)base->max_seqs;
    if (rc == 0) {
        p->hid[0] = malloc(T * p->n_embd * sizeof(float));
        p->hid[1] = malloc(T * p->n_embd * sizeof(float));
        p->seq = malloc(T * sizeof(int32_t));
        p->slen = malloc((S + MB_MAX) * sizeof(int32_t));
        p->table = calloc((S + MB_MAX) * (size_t)base->max_blocks, sizeof(int32_t));
        p->lrows = malloc(S * sizeof(int32_t));
        if (!p->hid[0] || !p->hid[1] || !p->seq || !p->slen || !p->table || !p->lrows)
            rc = md_errf(e, MD_ENOMEM, "pipeline: out of memory for step buffers");
    }
    for (int i = 0; i < n && rc == 0; i++) {
        if (pthread_create(&p->hops[i].thread, NULL, hop_main, &p->hops[i]))
            rc = md_errf(e, MD_ENOMEM, "pipeline: cannot start the thread of stage %d", i + 1);
        else
            p->hops[i].started = 1;
    }
    if (rc) {
        md_pipe_close(p);
        return rc;
    }
    *out = p;
    return 0;
}

/* ---- steps ---- */

/* Cut b into k micro-batches of about equal token counts. */
static int split(md_pipe *p, const md_batch *b, int k) {
    int T = b->n_tokens, si = 0, li = 0, n = 0;
    for (int j = 0; j < k; j++) {
        int t0 = (int)((long)T * j / k), t1 = (int)((long)T * (j + 1) / k);
        if (t1 <= t0)
            continue;
        mbatch *m = &p->mb[n++];
        int s_first = b->tok_seq[t0], s_last = b->tok_seq[t1 - 1], ns = s_last - s_first + 1;
        m->t0 = t0;
        m->l0 = 0;
        for (int i = 0; i < b->n_logits && b->logit_rows[i] < t0; i++)
            m->l0++;
        int nl = 0;
        for (int i = m->l0; i < b->n_logits && b->logit_rows[i] < t1; i++)
            p->lrows[li + nl++] = b->logit_rows[i] - t0;
        for (int t = t0; t < t1; t++)
            p->seq[t] = b->tok_seq[t] - s_first;
        for (int s = 0; s < ns; s++) {
            /* the K/V length after this micro-batch: its last token of the sequence + 1 */
            int last = t1 - 1;
            while (b->tok_seq[last] != s_first + s)
                last--;
            p->slen[si + s] = b->tok_pos[last] + 1;
            memcpy(p->table + (size_t)(si + s) * b->max_blocks,
                   b->block_table + (size_t)(s_first + s) * b->max_blocks,
                   (size_t)b->max_blocks * sizeof(int32_t));
        }
        m->b = (md_batch){.n_tokens = t1 - t0,
                          .n_seqs = ns,
                          .tokens = b->tokens + t0,
                          .tok_seq = p->seq + t0,
                          .tok_pos = b->tok_pos + t0,
                          .slot = b->slot + t0,
                          .seq_len = p->slen + si,
                          .block_table = p->table + (size_t)si * b->max_blocks,
                          .max_blocks = b->max_blocks,
                          .block_tokens = b->block_tokens,
                          .logit_rows = p->lrows + li,
                          .n_logits = nl,
                          .argmax_only = b->argmax_only};
        si += ns;
        li += nl;
    }
    return n;
}

int md_pipe_forward(md_pipe *p, const md_batch *b, float *logits, md_err *e) {
    if (p->broken) {
        if (e)
            *e = p->err;
        return p->err.code ? p->err.code : MD_EIO;
    }
    int k = p->o.microbatches > 0 ? p->o.microbatches
            : p->n == 1           ? 1
                                  : (p->gpu ? MB_PER_STAGE_GPU : MB_PER_STAGE) * p->n;
    if (k > MB_MAX)
        k = MB_MAX;
    if (k > b->n_tokens)
        k = b->n_tokens;
    uint64_t t0 = md_mono_ns();
    pthread_mutex_lock(&p->mu);
    p->n_mb = split(p, b, k);
    p->n_done = 0;
    p->failed = 0;
    p->logits = logits;
    for (int j = 0; j < p->n_mb; j++)
        push(p, 0, j);
    while (p->n_done < p->n_mb)
        pthread_cond_wait(&p->done_cv, &p->mu);
    int failed = p->failed;
    pthread_mutex_unlock(&p->mu);
    p->st.forward_s += (double)(md_mono_ns() - t0) / 1e9;
    p->st.steps++;
    p->st.microbatches += p->n_mb;
    size_t layout = (size_t)b->n_tokens * 16 + (size_t)b->n_seqs * (4 + 4 * b->max_blocks) +
                    (size_t)b->n_logits * 4;
    p->st.bytes_layout += layout * (size_t)p->n;
    p->st.bytes_hidden += (size_t)b->n_tokens * p->n_embd * sizeof(float) * 2 * (size_t)(p->n - 1) +
                          (size_t)b->n_logits * (b->argmax_only ? 1 : p->n_vocab) * sizeof(float);
    if (failed) {
        p->broken = 1;
        if (e)
            *e = p->err;
        return p->err.code ? p->err.code : MD_EIO;
    }
    return 0;
}

int md_pipe_n_stages(const md_pipe *p) {
    return p->n;
}

const char *md_pipe_describe(md_pipe *p) {
    return p->desc;
}

void md_pipe_get_stats(const md_pipe *p, md_pipe_stats *st) {
    *st = p->st;
}
