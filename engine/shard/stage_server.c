/* stage_server.c — serving one pipeline stage to a head over TCP. See stage_server.h; the
 * frames are engine/shard/wire.h's. */
#include "engine/shard/stage_server.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include "engine/shard/stage.h"
#include "engine/shard/stage_accept.h"
#include "engine/shard/wire.h"
#include "engine/shard/wire_io.h"

#define HANDSHAKE_MS_DEFAULT 10000
#define IO_MS_DEFAULT 60000
#define MAX_PENDING_DEFAULT 256
#define IDLE_POLL_MS 100 /* how often an idle server looks at its stop flag */
#define REFUSE_MS 200    /* the time a refused head gets to take its ERROR */

/* The one answer to a HELLO naming a model outside --model, whatever it names: a path that
 * exists, one that does not, a registry name. */
static const char NOT_SERVED[] =
    "model not served: this stage serves only the models named by its --model flags";

typedef struct {
    const md_stage_server_opts *o;
    volatile sig_atomic_t *stop;
    int lfd;
    md_stage *st;        /* the loaded stage, kept across connections; NULL when none */
    md_stage_config cfg; /* what st was opened with (after the server's overrides) */
    uint64_t hash;       /* md_model_hash of cfg.model */
    md_hparams hp;       /* the model's */
    md_wire_limits lim;
    md_wire_buf rx, tx;
    md_accept acc;      /* connections in their handshake */
    struct pollfd *pfd; /* [2 + max_pending]: listener, head, pending */
    int head;           /* the head being served, -1 when none */
    char head_peer[96];
    uint64_t head_last; /* md_mono_ns() of its last frame, or of our last answer */
    long steps;
} server;

/* Send an ERROR frame answering seq; best effort (the peer may be gone), within ms. */
static void send_error(server *s, int fd, uint32_t seq, int code, const char *msg, int ms) {
    md_err e = {0};
    if (md_wire_put_error(&s->tx, seq, code, msg, &e) == 0)
        md_wire_send(fd, s->tx.p, s->tx.len, md_wire_deadline(ms), &e);
}

/* Detect a head that vanished without closing (its host died) while it is idle between
 * steps: keepalive probes after 30 s of silence, every 10 s, 3 of them. */
static void keepalive(int fd) {
    int one = 1, idle = 30, intvl = 10, cnt = 3;
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
}

/* The configuration the server opens for a HELLO: its own device, threads and cap. */
static void apply_overrides(const server *s, md_stage_config *c) {
    const md_stage_server_opts *o = s->o;
    if (o->device && *o->device)
        snprintf(c->device, sizeof c->device, "%s", o->device);
    c->n_threads = o->n_threads;
    if (o->mem_cap && (!c->mem_cap || o->mem_cap < c->mem_cap))
        c->mem_cap = o->mem_cap;
}

/* Whether the loaded stage is what c asks (hash checked separately). */
static int same_stage(const md_stage_config *a, const md_stage_config *b) {
    return !strcmp(a->model, b->model) && !strcmp(a->device, b->device) && a->lo == b->lo &&
           a->hi == b->hi && a->n_threads == b->n_threads && a->tp == b->tp &&
           a->n_slots == b->n_slots && a->kv_type == b->kv_type && a->max_tokens == b->max_tokens &&
           a->max_seqs == b->max_seqs && a->max_blocks == b->max_blocks &&
           a->block_tokens == b->block_tokens && a->n_ctx == b->n_ctx && a->mem_cap == b->mem_cap;
}

/* Have the stage c asks loaded (kept or newly opened), checked against the head's widths
 * (0 = unknown), with s->lim for its frames. */
static int load_stage(server *s, const md_stage_config *c, int n_vocab, int n_embd,
                      const char *peer, md_err *e) {
    uint64_t hash;
    md_hparams hp;
    int rc;
    if ((rc = md_model_hash(c->model, &hash, e)) || (rc = md_model_shape(c->model, &hp, e)))
        return rc;
    if (c->model_hash && c->model_hash != hash)
        return md_errf(e, MD_EINVAL,
                       "model %s here has hash %016llx, the head's has %016llx: not the same "
                       "model file",
                       c->model, (unsigned long long)hash, (unsigned long long)c->model_hash);
    if ((n_embd && n_embd != hp.n_embd) || (n_vocab && n_vocab != hp.n_vocab))
        return md_errf(e, MD_EINVAL,
                       "model %s here has n_embd %d and n_vocab %d, the head expects %d and %d",
                       c->model, hp.n_embd, hp.n_vocab, n_embd, n_vocab);
    md_wire_limits lim;
    if ((rc = md_wire_limits_for(c, hp.n_embd, hp.n_vocab, &lim, e)))
        return rc;
    if (s->st && s->hash == hash && same_stage(&s->cfg, c)) {
        MD_INFO("stage", "head %s: %s already loaded", peer, md_stage_describe(s->st));
    } else {
        if (s->st)
            MD_INFO("stage", "head %s asks for another stage: unloading %s", peer,
                    md_stage_describe(s->st));
        md_stage_close(s->st);
        s->st = NULL;
        MD_INFO("stage", "head %s: loading %s layers %d-%d on %s", peer, c->model, c->lo, c->hi - 1,
                c->device[0] ? c->device : "cpu");
        if ((rc = md_stage_open(c, &s->st, e)))
            return rc;
        s->cfg = *c;
        s->hash = hash;
        s->hp = hp;
    }
    s->lim = lim;
    return 0;
}

/* One step: RUN payload in s->rx, RESULT (or ERROR) out. Returns 0 to go on with this head. */
static int serve_run(server *s, int fd, const md_wire_hdr *h, const char *peer) {
    md_err e = {0};
    md_batch b;
    const float *hidden;
    int rc = md_wire_get_run(s->rx.p, s->rx.len, &s->lim, &b, &hidden, &e);
    if (rc == 0)
        rc = md_batch_check(&b, &s->cfg, s->hp.n_vocab, &e);
    if (rc) {
        MD_WARN("stage", "head %s: step %u refused: %s", peer, h->seq, e.msg);
        send_error(s, fd, h->seq, rc, e.msg, s->o->io_ms);
        return rc;
    }
    float *out = md_wire_result_begin(&s->tx, md_stage_out_floats(s->st, &b), &e);
    if (!out || (rc = md_stage_run(s->st, &b, hidden, out, &e))) {
        rc = rc ? rc : e.code;
        MD_WARN("stage", "head %s: step %u failed: %s; unloading the stage", peer, h->seq, e.msg);
        send_error(s, fd, h->seq, rc, e.msg, s->o->io_ms);
        md_stage_close(s->st);
        s->st = NULL;
        return rc;
    }
    md_wire_result_end(&s->tx, h->seq);
    if ((rc = md_wire_send(fd, s->tx.p, s->tx.len, md_wire_deadline(s->o->io_ms), &e))) {
        MD_WARN("stage", "head %s: step %u: sending the result: %s", peer, h->seq, e.msg);
        return rc;
    }
    return 0;
}

/* Whether a HELLO may ask for model m: one of --model, exactly. */
static int model_allowed(const server *s, const char *m) {
    for (int i = 0; i < s->o->n_models; i++)
        if (!strcmp(s->o->models[i], m))
            return 1;
    return 0;
}

/* The signed READY for the stage loaded, answering the handshake of a. */
static int send_ready(server *s, const md_authed *a, md_err *e) {
    const md_hparams *hp = md_stage_hparams(s->st);
    md_wire_ready r = {.model_hash = s->hash,
                       .lo = s->cfg.lo,
                       .hi = s->cfg.hi,
                       .n_layer = hp->n_layer,
                       .n_embd = hp->n_embd,
                       .n_vocab = hp->n_vocab,
                       .idle_ms = s->o->io_ms};
    snprintf(r.describe, sizeof r.describe, "%s", md_stage_describe(s->st));
    int rc = md_wire_put_ready(&s->tx, &r, &a->auth, e);
    if (rc == 0)
        rc = md_wire_send(a->fd, s->tx.p, s->tx.len, md_wire_deadline(s->o->io_ms), e);
    if (rc == 0)
        MD_INFO("stage", "head %s: ready, %s", a->peer, r.describe);
    return rc;
}

/* A connection whose HELLO is signed: it becomes the head (the stage it asks for loaded, READY
 * sent), or is refused with an ERROR and closed. Takes a's socket and payload. */
static void admit(server *s, md_authed *a) {
    md_err e = {0};
    md_stage_config c;
    int n_vocab = 0, n_embd = 0, rc;
    if (s->head >= 0)
        rc = md_errf(&e, MD_EIO, "stage busy serving head %s", s->head_peer);
    else
        rc = md_wire_get_hello(a->payload, a->len, &c, &n_vocab, &n_embd, &e);
    if (rc == 0 && !model_allowed(s, c.model))
        rc = md_errf(&e, MD_ENOTFOUND, "%s", NOT_SERVED);
    if (rc == 0) {
        apply_overrides(s, &c);
        rc = load_stage(s, &c, n_vocab, n_embd, a->peer, &e);
    }
    if (rc == 0)
        rc = send_ready(s, a, &e);
    free(a->payload);
    if (rc) {
        MD_WARN("stage", "head %s refused: %s", a->peer, e.msg);
        send_error(s, a->fd, 0, rc, e.msg, REFUSE_MS);
        close(a->fd);
        return;
    }
    s->head = a->fd;
    snprintf(s->head_peer, sizeof s->head_peer, "%s", a->peer);
    s->head_last = md_mono_ns();
    s->steps = 0;
    keepalive(s->head);
}

static void head_close(server *s) {
    close(s->head);
    s->head = -1;
}

/* The head's socket is readable: take its frame (RUN or PING) and answer. 0 to go on with
 * this head; otherwise the connection is to be closed (said in the log, ERROR sent). */
static int head_frame(server *s) {
    md_err e = {0};
    md_wire_hdr h;
    int eof = 0;
    int rc = md_wire_recv_frame(s->head, 1u << MD_WIRE_RUN | 1u << MD_WIRE_PING, s->lim.max_payload,
                                md_wire_deadline(s->o->io_ms), s->stop, &h, &s->rx, &eof, &e);
    if (rc) {
        if (eof)
            MD_INFO("stage", "head %s left after %ld steps", s->head_peer, s->steps);
        else if (rc == MD_ECANCEL)
            MD_INFO("stage", "head %s: closing its connection after %ld steps: stopping",
                    s->head_peer, s->steps);
        else {
            MD_WARN("stage", "head %s: %s; closing its connection", s->head_peer, e.msg);
            send_error(s, s->head, 0, rc, e.msg, s->o->io_ms);
        }
        return rc;
    }
    if (h.type == MD_WIRE_RUN) {
        if ((rc = serve_run(s, s->head, &h, s->head_peer)))
            return rc;
        s->steps++;
    }
    s->head_last = md_mono_ns();
    return 0;
}

/* Drop the head when it has been silent past io_ms; the ms until it would be, else -1. */
static int head_idle(server *s, uint64_t now) {
    if (s->head < 0)
        return -1;
    uint64_t limit = (uint64_t)s->o->io_ms * 1000000ull;
    if (now - s->head_last < limit)
        return (int)((s->head_last + limit - now + 999999) / 1000000);
    MD_WARN("stage",
            "head %s silent for %d ms (--io-timeout-ms) after %ld steps: closing its connection",
            s->head_peer, s->o->io_ms, s->steps);
    send_error(s, s->head, 0, MD_EIO, "silent past the stage's --io-timeout-ms", REFUSE_MS);
    head_close(s);
    return -1;
}

/* One round of the loop: wait (at most until the next deadline) and serve what is ready. */
static void serve_round(server *s) {
    uint64_t now = md_mono_ns();
    uint64_t next = md_accept_expire(&s->acc, now);
    int ms = IDLE_POLL_MS, h = head_idle(s, now);
    if (h >= 0 && h < ms)
        ms = h;
    if (next) {
        uint64_t left = next > now ? (next - now + 999999) / 1000000 : 0;
        if (left < (uint64_t)ms)
            ms = (int)left;
    }
    s->pfd[0] = (struct pollfd){.fd = s->lfd, .events = POLLIN};
    s->pfd[1] = (struct pollfd){.fd = s->head, .events = POLLIN}; /* -1: ignored by poll */
    int np = md_accept_fds(&s->acc, s->pfd + 2);
    if (poll(s->pfd, (nfds_t)(2 + np), ms) <= 0)
        return;
    /* the head first: its goodbye may race a new head's hello */
    if (s->head >= 0 && s->pfd[1].revents && head_frame(s))
        head_close(s);
    for (int i = np - 1; i >= 0; i--) { /* descending: a finished one swaps in the last */
        md_authed a;
        if (s->pfd[2 + i].revents && md_accept_ready(&s->acc, i, &a) == 1)
            admit(s, &a);
    }
    if (s->pfd[0].revents)
        md_accept_new(&s->acc, s->lfd);
}

int md_stage_serve(const char *listen_host, int port, const md_stage_server_opts *opts,
                   volatile sig_atomic_t *stop, md_err *e) {
    static volatile sig_atomic_t never = 0;
    md_stage_server_opts o = *opts;
    if (!o.secret || !o.secret->len)
        return md_errf(e, MD_EINVAL,
                       "a stage server needs a secret (docs/sharding.md "
                       "\"Authentication\")");
    if (o.n_models < 1 || !o.models)
        return md_errf(e, MD_EINVAL, "a stage server needs the models it may serve (--model)");
    if (o.handshake_ms <= 0)
        o.handshake_ms = HANDSHAKE_MS_DEFAULT;
    if (o.io_ms <= 0)
        o.io_ms = IO_MS_DEFAULT;
    if (o.max_pending <= 0)
        o.max_pending = MAX_PENDING_DEFAULT;
    server s = {.o = &o, .stop = stop ? stop : &never, .lfd = -1, .head = -1};
    s.pfd = calloc((size_t)o.max_pending + 2, sizeof *s.pfd);
    int rc = s.pfd ? md_accept_init(&s.acc, o.max_pending, o.secret, o.handshake_ms, e)
                   : md_errf(e, MD_ENOMEM, "stage server: out of memory");
    int bound = port;
    if (rc == 0)
        rc = md_wire_listen(listen_host, port, &s.lfd, &bound, e);
    if (rc) {
        md_accept_free(&s.acc);
        free(s.pfd);
        return rc;
    }
    const char *h = listen_host && *listen_host ? listen_host : "*";
    int v6 = strchr(h, ':') != NULL;
    MD_INFO("stage", "listening on %s%s%s:%d", v6 ? "[" : "", h, v6 ? "]" : "", bound);
    if (o.on_listen)
        o.on_listen(o.arg, bound);
    while (!*s.stop)
        serve_round(&s);
    if (s.head >= 0) {
        MD_INFO("stage", "head %s: closing its connection after %ld steps: stopping", s.head_peer,
                s.steps);
        head_close(&s);
    }
    MD_INFO("stage", "stopping%s", s.st ? ": unloading the stage" : "");
    md_stage_close(s.st);
    md_accept_free(&s.acc);
    free(s.pfd);
    md_wire_buf_free(&s.rx);
    md_wire_buf_free(&s.tx);
    close(s.lfd);
    return 0;
}
