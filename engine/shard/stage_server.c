/* stage_server.c — serving one pipeline stage to a head over TCP. See stage_server.h; the
 * frames are engine/shard/wire.h's. */
#include "engine/shard/stage_server.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/log.h"
#include "engine/shard/stage.h"
#include "engine/shard/wire.h"
#include "engine/shard/wire_io.h"

#define HANDSHAKE_MS_DEFAULT 10000
#define IO_MS_DEFAULT 60000
#define IDLE_POLL_MS 100 /* how often an idle server looks at its stop flag */
#define REFUSE_MS 200    /* the time a refused second head gets to take its ERROR */

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

/* Accept the waiting connection and turn it away: one head at a time. */
static void refuse_busy(server *s, const char *serving) {
    int fd;
    char peer[96], msg[160];
    md_err e = {0};
    if (md_wire_accept(s->lfd, &fd, peer, sizeof peer, &e))
        return;
    snprintf(msg, sizeof msg, "stage busy serving head %s", serving);
    MD_WARN("stage", "head %s refused: busy serving head %s", peer, serving);
    send_error(s, fd, 0, MD_EIO, msg, REFUSE_MS);
    close(fd);
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

/* Wait until the head's socket has something (a frame or its close): 0, or 1 when stopped.
 * Second heads connecting meanwhile are turned away. */
static int wait_head(server *s, int fd, const char *peer) {
    while (!*s->stop) {
        struct pollfd p[2] = {{.fd = fd, .events = POLLIN}, {.fd = s->lfd, .events = POLLIN}};
        int n = poll(p, 2, IDLE_POLL_MS);
        if (n < 0 && errno != EINTR)
            return 0; /* the read that follows reports the fault */
        if (n <= 0)
            continue;
        if (p[0].revents) /* the head first: its goodbye may race a new head's hello */
            return 0;
        if (p[1].revents)
            refuse_busy(s, peer);
    }
    return 1;
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

/* A head's whole conversation on fd. */
static void serve_head(server *s, int fd, const char *peer) {
    md_err e = {0};
    md_wire_hdr h;
    int eof = 0;
    MD_INFO("stage", "head %s connected", peer);
    int rc = md_wire_recv_frame(fd, 1u << MD_WIRE_HELLO, 0, md_wire_deadline(s->o->handshake_ms),
                                s->stop, &h, &s->rx, &eof, &e);
    md_stage_config c;
    int n_vocab = 0, n_embd = 0;
    if (rc == 0)
        rc = md_wire_get_hello(s->rx.p, s->rx.len, &c, &n_vocab, &n_embd, &e);
    if (rc == 0) {
        apply_overrides(s, &c);
        rc = load_stage(s, &c, n_vocab, n_embd, peer, &e);
    }
    if (rc) {
        if (rc != MD_ECANCEL && !eof) {
            MD_WARN("stage", "head %s refused: %s", peer, e.msg);
            send_error(s, fd, 0, rc, e.msg, s->o->io_ms);
        }
        return;
    }
    const md_hparams *hp = md_stage_hparams(s->st);
    md_wire_ready r = {.model_hash = s->hash,
                       .lo = s->cfg.lo,
                       .hi = s->cfg.hi,
                       .n_layer = hp->n_layer,
                       .n_embd = hp->n_embd,
                       .n_vocab = hp->n_vocab};
    snprintf(r.describe, sizeof r.describe, "%s", md_stage_describe(s->st));
    if ((rc = md_wire_put_ready(&s->tx, &r, &e)) ||
        (rc = md_wire_send(fd, s->tx.p, s->tx.len, md_wire_deadline(s->o->io_ms), &e))) {
        MD_WARN("stage", "head %s: sending READY: %s", peer, e.msg);
        return;
    }
    MD_INFO("stage", "head %s: ready, %s", peer, r.describe);
    long steps = 0;
    for (;;) {
        if (wait_head(s, fd, peer)) {
            MD_INFO("stage", "head %s: closing its connection after %ld steps: stopping", peer,
                    steps);
            return;
        }
        rc = md_wire_recv_frame(fd, 1u << MD_WIRE_RUN, s->lim.max_payload,
                                md_wire_deadline(s->o->io_ms), s->stop, &h, &s->rx, &eof, &e);
        if (rc) {
            if (eof)
                MD_INFO("stage", "head %s left after %ld steps", peer, steps);
            else if (rc != MD_ECANCEL) {
                MD_WARN("stage", "head %s: %s; closing its connection", peer, e.msg);
                send_error(s, fd, 0, rc, e.msg, s->o->io_ms);
            }
            return;
        }
        if (serve_run(s, fd, &h, peer))
            return;
        steps++;
    }
}

int md_stage_serve(const char *listen_host, int port, const md_stage_server_opts *opts,
                   volatile sig_atomic_t *stop, md_err *e) {
    static volatile sig_atomic_t never = 0;
    md_stage_server_opts o = *opts;
    if (o.handshake_ms <= 0)
        o.handshake_ms = HANDSHAKE_MS_DEFAULT;
    if (o.io_ms <= 0)
        o.io_ms = IO_MS_DEFAULT;
    server s = {.o = &o, .stop = stop ? stop : &never, .lfd = -1};
    int bound = port;
    int rc = md_wire_listen(listen_host, port, &s.lfd, &bound, e);
    if (rc)
        return rc;
    const char *h = listen_host && *listen_host ? listen_host : "*";
    int v6 = strchr(h, ':') != NULL;
    MD_INFO("stage", "listening on %s%s%s:%d", v6 ? "[" : "", h, v6 ? "]" : "", bound);
    if (o.on_listen)
        o.on_listen(o.arg, bound);
    while (!*s.stop) {
        struct pollfd p = {.fd = s.lfd, .events = POLLIN};
        if (poll(&p, 1, IDLE_POLL_MS) <= 0)
            continue;
        int fd;
        char peer[96];
        md_err ae = {0};
        if (md_wire_accept(s.lfd, &fd, peer, sizeof peer, &ae))
            continue; /* the connection went away before we took it */
        keepalive(fd);
        serve_head(&s, fd, peer);
        close(fd);
    }
    MD_INFO("stage", "stopping%s", s.st ? ": unloading the stage" : "");
    md_stage_close(s.st);
    md_wire_buf_free(&s.rx);
    md_wire_buf_free(&s.tx);
    close(s.lfd);
    return 0;
}
