/* stage_accept.c — a stage server's connections in their handshake. See stage_accept.h. */
#include "engine/shard/stage_accept.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include "engine/shard/wire_io.h"

#define REFUSE_MS 200 /* the time a refused peer gets to take its ERROR */

int md_accept_init(md_accept *a, int cap, const md_stage_secret *s, int handshake_ms, md_err *e) {
    *a = (md_accept){.cap = cap, .secret = s, .handshake_ms = handshake_ms};
    a->v = calloc((size_t)cap, sizeof *a->v);
    if (!a->v)
        return md_errf(e, MD_ENOMEM, "stage server: no memory for %d pending connections", cap);
    return 0;
}

/* Close connection i and move the last into its place. */
static void drop(md_accept *a, int i) {
    close(a->v[i].fd);
    free(a->v[i].payload);
    a->v[i] = a->v[--a->n];
}

/* Say why on connection i (best effort), then drop it. */
static void refuse(md_accept *a, int i, int code, const char *msg) {
    md_err e = {0};
    MD_WARN("stage", "connection from %s refused: %s", a->v[i].peer, msg);
    if (md_wire_put_error(&a->tx, 0, code, msg, &e) == 0)
        md_wire_send(a->v[i].fd, a->tx.p, a->tx.len, md_wire_deadline(REFUSE_MS), &e);
    drop(a, i);
}

void md_accept_free(md_accept *a) {
    while (a->n > 0)
        drop(a, a->n - 1);
    free(a->v);
    md_wire_buf_free(&a->tx);
    *a = (md_accept){0};
}

void md_accept_new(md_accept *a, int lfd) {
    for (;;) {
        md_pending p = {0};
        md_err e = {0};
        if (md_wire_accept(lfd, &p.fd, p.peer, sizeof p.peer, &e))
            return;           /* none left waiting (or it went away before we took it) */
        if (a->n == a->cap) { /* full: the oldest deadline goes */
            int old = 0;
            for (int i = 1; i < a->n; i++)
                if (a->v[i].deadline < a->v[old].deadline)
                    old = i;
            MD_WARN("stage", "%d connections in their handshake: dropping the oldest, from %s",
                    a->cap, a->v[old].peer);
            drop(a, old);
        }
        p.deadline = md_mono_ns() + (uint64_t)a->handshake_ms * 1000000ull;
        p.auth.secret = a->secret;
        if (md_stage_nonce(p.auth.stage_nonce, &e) ||
            md_wire_put_challenge(&a->tx, p.auth.stage_nonce, &e) ||
            md_wire_send(p.fd, a->tx.p, a->tx.len, md_wire_deadline(REFUSE_MS), &e)) {
            MD_WARN("stage", "connection from %s: sending its CHALLENGE: %s", p.peer, e.msg);
            close(p.fd);
            continue;
        }
        a->v[a->n++] = p;
    }
}

int md_accept_fds(const md_accept *a, struct pollfd *p) {
    for (int i = 0; i < a->n; i++)
        p[i] = (struct pollfd){.fd = a->v[i].fd, .events = POLLIN};
    return a->n;
}

/* Receive what is there into dst[*got..n): 1 when dst is full, 0 when more is to come, -1
 * when the peer closed or failed. */
static int take(int fd, uint8_t *dst, size_t n, size_t *got) {
    while (*got < n) {
        ssize_t k = recv(fd, dst + *got, n - *got, MSG_DONTWAIT);
        if (k > 0) {
            *got += (size_t)k;
            continue;
        }
        if (k < 0 && errno == EINTR)
            continue;
        return k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) ? 0 : -1;
    }
    return 1;
}

int md_accept_ready(md_accept *a, int i, md_authed *out) {
    md_pending *p = &a->v[i];
    md_err e = {0};
    int r;
    if (!p->payload) { /* the header */
        r = take(p->fd, p->hdr, MD_WIRE_HDR, &p->got);
        if (r <= 0)
            goto gone;
        int rc = md_wire_hdr_get(p->hdr, &p->h, &e);
        if (rc == 0)
            rc = md_wire_hdr_check(&p->h, 1u << MD_WIRE_HELLO, 0, &e);
        if (rc) {
            refuse(a, i, rc, e.msg);
            return -1;
        }
        p->payload = malloc(p->h.len ? (size_t)p->h.len : 1);
        if (!p->payload) {
            refuse(a, i, MD_ENOMEM, "stage server: out of memory for a HELLO");
            return -1;
        }
        p->got = 0;
    }
    r = take(p->fd, p->payload, (size_t)p->h.len, &p->got);
    if (r <= 0)
        goto gone;
    int rc = md_wire_payload_check(&p->h, p->payload, &e);
    if (rc == 0)
        rc = md_wire_hello_verify(p->payload, (size_t)p->h.len, &p->auth, &e);
    if (rc) {
        refuse(a, i, rc, e.msg);
        return -1;
    }
    *out = (md_authed){.fd = p->fd, .auth = p->auth, .payload = p->payload, .len = p->h.len};
    memcpy(out->peer, p->peer, sizeof out->peer);
    a->v[i] = a->v[--a->n];
    return 1;
gone:
    if (r == 0)
        return 0;
    MD_INFO("stage", "connection from %s closed before its HELLO was whole", p->peer);
    drop(a, i);
    return -1;
}

uint64_t md_accept_expire(md_accept *a, uint64_t now) {
    uint64_t next = 0;
    for (int i = a->n - 1; i >= 0; i--) {
        if (a->v[i].deadline <= now) {
            refuse(a, i, MD_EIO, "no signed HELLO within the handshake deadline (--handshake-ms)");
            continue;
        }
        if (!next || a->v[i].deadline < next)
            next = a->v[i].deadline;
    }
    return next;
}
