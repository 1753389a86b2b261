/* link_tcp.c — md_link to a stage in another process or host (`medley stage --listen`),
 * over engine/shard/wire.h frames (engine/shard/wire_io.h moves them).
 *
 * Open: read the model's widths on the head (its metadata only), connect, take the stage's
 * CHALLENGE, send a HELLO signed over it with the secret (engine/shard/stage_auth.h), wait for
 * READY — the stage may be loading its weights: the load's timeout — check its signature and
 * that it holds what was asked (model hash, layers, n_embd, n_vocab). A step: one RUN frame
 * out (the layout and, past the first stage, the hidden states), one RESULT back with the
 * same sequence number, written straight into the caller's out; both within the step's
 * timeout. Idle: a thread of the link sends PING when nothing went out for a third of the
 * READY's idle_ms (the stage drops a head silent for idle_ms), under the lock a step holds.
 *
 * Failure: any error in a step (peer closed, timeout, a malformed or mismatched answer, the
 * stage's ERROR) names "tcp://host:port layers lo-last", closes the connection and breaks the
 * link: every later run() fails at once with the first error. Ownership: the link owns its
 * socket, a copy of the secret, its pinging thread and three frame buffers, which grow to the
 * largest step and are then reused, so a step allocates nothing; md_link_free (ops->free)
 * releases them. run() from one thread at a time. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include "engine/shard/link.h"
#include "engine/model/model.h"
#include "engine/shard/wire.h"
#include "engine/shard/wire_io.h"

#define STEP_MS_DEFAULT 60000 /* link.h: timeout_ms 0 */
#define LOAD_MS_DEFAULT 60000 /* link.h: load_timeout_ms 0 */
#define PING_MIN_MS 10

typedef struct {
    md_link base;
    int fd;          /* -1 once broken */
    char addr[280];  /* "tcp://host:port" */
    char where[320]; /* "tcp://host:port layers lo-last" */
    char desc[640];  /* "tcp://host:port layers lo-last on cpu: ..." */
    int n_embd, n_vocab;
    int last; /* hi == n_layer: answers logits */
    int step_ms;
    uint32_t seq; /* the last RUN's */
    md_wire_limits lim;
    md_wire_buf tx, rx; /* RUN frames out, ERROR payloads in */
    int broken;         /* the code of the error that broke it, 0 while healthy */
    char broken_msg[sizeof(((md_err *)0)->msg)];
    md_stage_secret secret;
    md_wire_auth auth;
    /* keepalive: mu is held by a step and by a PING; last_ns is when a frame last went out */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t pinger;
    int pinging, quit, ping_ms;
    uint64_t last_ns;
    md_wire_buf ping;
} tcp_link;

/* Break the link with e's error (prefixed with where and what): the connection is closed
 * and every later run fails with this message. Returns e's code. */
static int fail(tcp_link *t, md_err *e, const char *what) {
    md_errctx(e, "stage %s: %s: ", t->where, what);
    if (t->fd >= 0)
        close(t->fd);
    t->fd = -1;
    t->broken = e->code ? e->code : MD_EIO;
    snprintf(t->broken_msg, sizeof t->broken_msg, "%s", e->msg);
    return t->broken;
}

/* The ERROR frame of header h: its code and message into e. */
static int read_error(tcp_link *t, const md_wire_hdr *h, uint64_t deadline, md_err *e) {
    md_err ie = {0};
    int rc = md_wire_buf_reserve(&t->rx, h->len ? (size_t)h->len : 1, &ie);
    if (rc == 0)
        rc = md_wire_recv(t->fd, t->rx.p, (size_t)h->len, deadline, NULL, &ie);
    if (rc == 0)
        rc = md_wire_payload_check(h, t->rx.p, &ie);
    int code = MD_EIO;
    char msg[MD_WIRE_MSG_MAX + 1];
    if (rc == 0)
        rc = md_wire_get_error(t->rx.p, (size_t)h->len, &code, msg, sizeof msg, &ie);
    if (rc) {
        *e = ie;
        return md_errctx(e, "its ERROR frame unreadable: ");
    }
    return md_errf(e, code, "%s", msg);
}

static int run_locked(tcp_link *t, const md_batch *b, const float *in, float *out, md_err *e) {
    if (t->broken)
        return md_errf(e, t->broken, "stage %s is down since an earlier step: %s", t->where,
                       t->broken_msg);
    if (b->n_tokens < 1 || b->n_tokens > t->lim.max_tokens || b->n_seqs < 1 ||
        b->n_seqs > t->lim.max_seqs || b->n_logits < 0 || b->n_logits > t->lim.max_seqs ||
        b->max_blocks < 1 || b->max_blocks > t->lim.max_blocks || (t->lim.hidden && !in))
        return md_errf(e, MD_EINVAL,
                       "stage %s: a step of %d tokens, %d sequences, %d logit rows, %d blocks "
                       "each%s is outside the sizes the link was opened with (%d, %d, %d, %d)",
                       t->where, b->n_tokens, b->n_seqs, b->n_logits, b->max_blocks,
                       t->lim.hidden && !in ? " and no hidden states" : "", t->lim.max_tokens,
                       t->lim.max_seqs, t->lim.max_seqs, t->lim.max_blocks);
    uint32_t seq = t->seq + 1;
    int rc = md_wire_put_run(&t->tx, seq, b, t->lim.hidden ? in : NULL, t->lim.hidden, e);
    if (rc)
        return rc; /* nothing sent: the link stays up */
    t->seq = seq;
    char what[96];
    snprintf(what, sizeof what, "step %u", seq);
    uint64_t deadline = md_wire_deadline(t->step_ms);
    if ((rc = md_wire_send(t->fd, t->tx.p, t->tx.len, deadline, e)))
        return fail(t, e, what);
    md_wire_hdr h;
    rc = md_wire_recv_hdr(t->fd, 1u << MD_WIRE_RESULT | 1u << MD_WIRE_ERROR, t->lim.max_payload,
                          deadline, NULL, &h, NULL, e);
    if (rc) {
        snprintf(what, sizeof what, "step %u, waiting for its answer (timeout %d ms)", seq,
                 t->step_ms);
        return fail(t, e, what);
    }
    if (h.type == MD_WIRE_ERROR) {
        read_error(t, &h, deadline, e);
        return fail(t, e, what);
    }
    if (h.seq != seq) {
        md_errf(e, MD_EFORMAT, "answered step %u", h.seq);
        return fail(t, e, what);
    }
    size_t n_out = !t->last         ? (size_t)b->n_tokens * (size_t)t->n_embd
                   : b->argmax_only ? (size_t)b->n_logits
                                    : (size_t)b->n_logits * (size_t)t->n_vocab;
    if (h.len != 4 * (uint64_t)n_out) {
        md_errf(e, MD_EFORMAT, "RESULT of %llu bytes, expected %zu floats",
                (unsigned long long)h.len, n_out);
        return fail(t, e, what);
    }
    if ((rc = md_wire_recv(t->fd, out, (size_t)h.len, deadline, NULL, e)) ||
        (rc = md_wire_payload_check(&h, out, e)) ||
        (rc = md_wire_get_result((const uint8_t *)out, (size_t)h.len, out, n_out, e)))
        return fail(t, e, what);
    return 0;
}

static int tcp_run(md_link *l, const md_batch *b, const float *in, float *out, md_err *e) {
    tcp_link *t = (tcp_link *)l;
    md_err local;
    if (!e)
        e = &local;
    pthread_mutex_lock(&t->mu);
    int rc = run_locked(t, b, in, out, e);
    t->last_ns = md_mono_ns();
    pthread_mutex_unlock(&t->mu);
    return rc;
}

/* The keepalive thread: a PING whenever ping_ms passed since the last frame out. A PING that
 * cannot be sent breaks the link as a failed step would. */
static void *ping_main(void *arg) {
    tcp_link *t = arg;
    pthread_mutex_lock(&t->mu);
    while (!t->quit) {
        uint64_t due = t->last_ns + (uint64_t)t->ping_ms * 1000000ull, now = md_mono_ns();
        if (now < due) {
            struct timespec ts = {.tv_sec = (time_t)(due / 1000000000ull),
                                  .tv_nsec = (long)(due % 1000000000ull)};
            pthread_cond_timedwait(&t->cv, &t->mu, &ts);
            continue;
        }
        t->last_ns = now;
        md_err e = {0};
        if (!t->broken &&
            md_wire_send(t->fd, t->ping.p, t->ping.len, md_wire_deadline(t->step_ms), &e))
            fail(t, &e, "keepalive PING while idle");
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

static const char *tcp_describe(md_link *l) {
    return ((tcp_link *)l)->desc;
}

static void tcp_free(md_link *l) {
    tcp_link *t = (tcp_link *)l;
    if (!t)
        return;
    if (t->pinging) {
        pthread_mutex_lock(&t->mu);
        t->quit = 1;
        pthread_cond_signal(&t->cv);
        pthread_mutex_unlock(&t->mu);
        pthread_join(t->pinger, NULL);
    }
    if (t->fd >= 0)
        close(t->fd);
    md_wire_buf_free(&t->tx);
    md_wire_buf_free(&t->rx);
    md_wire_buf_free(&t->ping);
    md_stage_secret_clear(&t->secret);
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->cv);
    free(t);
}

static const md_link_ops tcp_ops = {
    .kind = "tcp", .run = tcp_run, .describe = tcp_describe, .free = tcp_free};

/* The stage's CHALLENGE: its nonce into t->auth. */
static int take_challenge(tcp_link *t, uint64_t deadline, int load_ms, md_err *e) {
    md_wire_hdr h;
    int rc =
        md_wire_recv_frame(t->fd, 1u << MD_WIRE_CHALLENGE, 0, deadline, NULL, &h, &t->rx, NULL, e);
    if (rc == 0)
        rc = md_wire_get_challenge(t->rx.p, t->rx.len, t->auth.stage_nonce, e);
    if (rc)
        return md_errctx(e,
                         "stage %s: no CHALLENGE within %d ms (a stage of another medley "
                         "release, or not a stage?): ",
                         t->where, load_ms);
    return 0;
}

/* CHALLENGE in, signed HELLO out, signed READY (or the stage's ERROR) back, checked against
 * what c asks. */
static int handshake(tcp_link *t, const md_stage_config *c, int load_ms, md_err *e) {
    uint64_t deadline = md_wire_deadline(load_ms);
    int rc = take_challenge(t, deadline, load_ms, e);
    if (rc || (rc = md_stage_nonce(t->auth.head_nonce, e)) ||
        (rc = md_wire_put_hello(&t->tx, c, t->n_vocab, t->n_embd, &t->auth, e)))
        return rc;
    if ((rc = md_wire_send(t->fd, t->tx.p, t->tx.len, md_wire_deadline(t->step_ms), e)))
        return md_errctx(e, "stage %s: sending HELLO: ", t->where);
    md_wire_hdr h;
    rc = md_wire_recv_hdr(t->fd, 1u << MD_WIRE_READY | 1u << MD_WIRE_ERROR, 0, deadline, NULL, &h,
                          NULL, e);
    if (rc)
        return md_errctx(e, "stage %s: no READY within %d ms: ", t->where, load_ms);
    if (h.type == MD_WIRE_ERROR) {
        read_error(t, &h, deadline, e);
        return md_errctx(e, "stage %s refused (asked for model %s): ", t->where, c->model);
    }
    md_wire_ready r;
    if ((rc = md_wire_buf_reserve(&t->rx, h.len ? (size_t)h.len : 1, e)) ||
        (rc = md_wire_recv(t->fd, t->rx.p, (size_t)h.len, deadline, NULL, e)) ||
        (rc = md_wire_payload_check(&h, t->rx.p, e)) ||
        (rc = md_wire_get_ready(t->rx.p, (size_t)h.len, &t->auth, &r, e)))
        return md_errctx(e, "stage %s: reading READY: ", t->where);
    if ((rc = md_wire_ready_check(&r, c, t->n_embd, t->n_vocab, t->where, e)))
        return rc;
    t->last = r.hi == r.n_layer;
    t->ping_ms = r.idle_ms / 3 > PING_MIN_MS ? r.idle_ms / 3 : PING_MIN_MS;
    snprintf(t->desc, sizeof t->desc, "%s %s", t->addr, r.describe);
    return 0;
}

/* Start the keepalive thread once the link is up. */
static int start_pinger(tcp_link *t, md_err *e) {
    int rc = md_wire_put_ping(&t->ping, e);
    if (rc)
        return rc;
    t->last_ns = md_mono_ns();
    if (pthread_create(&t->pinger, NULL, ping_main, t))
        return md_errf(e, MD_ENOMEM, "stage %s: cannot start its keepalive thread", t->where);
    t->pinging = 1;
    return 0;
}

/* A condition variable timed on CLOCK_MONOTONIC (md_mono_ns's clock). */
static void mono_cond_init(pthread_cond_t *cv) {
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(cv, &a);
    pthread_condattr_destroy(&a);
}

int md_link_tcp_open(const char *host, int port, const md_stage_config *c,
                     const md_link_tcp_opts *o, md_link **out, md_err *e) {
    md_err local;
    if (!e)
        e = &local;
    *out = NULL;
    if (!host || !*host || port < 1 || port > 65535)
        return md_errf(e, MD_EINVAL, "stage link: bad address %s:%d", host ? host : "(null)", port);
    tcp_link *t = calloc(1, sizeof *t);
    if (!t)
        return md_errf(e, MD_ENOMEM, "stage link: out of memory");
    t->base.ops = &tcp_ops;
    t->fd = -1;
    pthread_mutex_init(&t->mu, NULL);
    mono_cond_init(&t->cv);
    int v6 = strchr(host, ':') != NULL;
    snprintf(t->addr, sizeof t->addr, "tcp://%s%.256s%s:%d", v6 ? "[" : "", host, v6 ? "]" : "",
             port);
    snprintf(t->where, sizeof t->where, "%s layers %d-%d", t->addr, c->lo, c->hi - 1);
    snprintf(t->desc, sizeof t->desc, "%s", t->where);
    t->step_ms = o && o->timeout_ms > 0 ? o->timeout_ms : STEP_MS_DEFAULT;
    int load_ms = o && o->load_timeout_ms > 0 ? o->load_timeout_ms : LOAD_MS_DEFAULT;
    int rc;
    if (!o || !o->secret || !o->secret->len) {
        rc = md_errf(e, MD_EINVAL,
                     "stage %s: no stage secret to sign the HELLO with (--stage-secret-file or "
                     "$%s)",
                     t->where, MD_STAGE_SECRET_ENV);
        goto fail;
    }
    t->secret = *o->secret;
    t->auth.secret = &t->secret;
    md_hparams hp;
    rc = md_model_shape(c->model, &hp, e);
    if (rc) {
        md_errctx(e, "stage %s: the head cannot read the model's sizes: ", t->where);
        goto fail;
    }
    if (c->hi > hp.n_layer || c->lo < 0 || c->lo >= c->hi) {
        rc = md_errf(e, MD_EINVAL, "stage %s: not a range of the model's %d layers", t->where,
                     hp.n_layer);
        goto fail;
    }
    t->n_embd = hp.n_embd;
    t->n_vocab = hp.n_vocab;
    if ((rc = md_wire_limits_for(c, t->n_embd, t->n_vocab, &t->lim, e))) {
        md_errctx(e, "stage %s: ", t->where);
        goto fail;
    }
    if ((rc = md_wire_connect(host, port, t->step_ms, &t->fd, e))) {
        md_errctx(e, "stage %s: cannot connect: ", t->where);
        goto fail;
    }
    if ((rc = handshake(t, c, load_ms, e)) || (rc = start_pinger(t, e)))
        goto fail;
    MD_INFO("stage", "link to %s", t->desc);
    *out = &t->base;
    return 0;
fail:
    tcp_free(&t->base);
    return rc;
}
