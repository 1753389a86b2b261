/* stage_accept.h — the connections a stage server (engine/shard/stage_server.c) has accepted
 * and not yet authenticated: each is sent a CHALLENGE at once, then its HELLO is read as it
 * arrives, never waiting on one peer, until it is whole and signed with the secret
 * (md_wire_hello_verify), or its handshake deadline passes, or it breaks the format. Nothing
 * of a HELLO but its signature is looked at before that, so a peer without the secret makes
 * the server open no model and touch no path.
 *
 * At most `cap` connections wait at once; a new one pushes out the oldest, so idle and
 * trickling peers (slowloris) can delay a real head by no more than its own handshake's round
 * trips. The caller polls the descriptors (md_accept_fds) with its own and calls
 * md_accept_ready for each that is readable.
 *
 * Ownership: the set owns its sockets and buffers until a handshake completes; then the
 * socket and HELLO payload pass to the caller (md_authed: close fd, free payload). */
#ifndef MEDLEY_ENGINE_STAGE_ACCEPT_H
#define MEDLEY_ENGINE_STAGE_ACCEPT_H

#include <poll.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "engine/shard/stage_auth.h"
#include "engine/shard/wire.h"

typedef struct {
    int fd;
    char peer[96];
    uint64_t deadline; /* md_mono_ns() by which the HELLO must be whole */
    md_wire_auth auth; /* the nonce sent; the head's once verified */
    uint8_t hdr[MD_WIRE_HDR];
    size_t got; /* bytes of header, then of payload, received */
    md_wire_hdr h;
    uint8_t *payload; /* h.len bytes once the header is checked */
} md_pending;

typedef struct {
    md_pending *v;
    int n, cap;
    const md_stage_secret *secret;
    int handshake_ms;
    md_wire_buf tx; /* CHALLENGE and ERROR frames */
} md_accept;

/* An authenticated HELLO: its socket, the peer, the nonces, the payload (malloc'd). */
typedef struct {
    int fd;
    char peer[96];
    md_wire_auth auth;
    uint8_t *payload;
    size_t len;
} md_authed;

int md_accept_init(md_accept *a, int cap, const md_stage_secret *s, int handshake_ms, md_err *e);
void md_accept_free(md_accept *a); /* closes every waiting connection */

/* Accept every connection waiting on listening socket lfd and send each its CHALLENGE. */
void md_accept_new(md_accept *a, int lfd);

/* Fill p[0..a->n) with the waiting descriptors (POLLIN); returns a->n. */
int md_accept_fds(const md_accept *a, struct pollfd *p);

/* Read what connection i (readable) has sent: 0 still waiting; 1 its HELLO is whole and
 * signed: it leaves the set into *out; -1 it was refused (ERROR sent where it says why) and
 * closed. Either of the last two moves the set's last connection into slot i. */
int md_accept_ready(md_accept *a, int i, md_authed *out);

/* Drop the connections whose handshake deadline has passed; the earliest deadline left
 * (0: none). */
uint64_t md_accept_expire(md_accept *a, uint64_t now);

#endif
