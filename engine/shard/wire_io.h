/* wire_io.h — engine/shard/wire.h frames over TCP sockets: connect and listen, whole sends and
 * receives bounded by a deadline, a frame's header and payload checked as they arrive. The
 * socket half of the stage link, shared by engine/shard/link_tcp.c (the head's side) and
 * engine/shard/stage_server.c (the stage's side).
 *
 * Every socket made here is non-blocking with TCP_NODELAY (a step's frame goes out at once,
 * not after Nagle's delay) and close-on-exec; every wait is a poll() bounded by a deadline
 * (md_mono_ns() nanoseconds, 0 = none) and, where given, a stop flag looked at every 100 ms.
 * Sends and receives never block (MSG_DONTWAIT, whatever the descriptor's mode) and never
 * raise SIGPIPE. Errors: MD_EIO with what happened (refused, closed by the peer
 * after k of n bytes, timed out), MD_ECANCEL when the stop flag was raised, MD_EFORMAT for a
 * malformed frame (wire.h). The caller owns every descriptor it is given and closes it. */
#ifndef MEDLEY_ENGINE_WIRE_IO_H
#define MEDLEY_ENGINE_WIRE_IO_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "engine/shard/wire.h"

/* md_mono_ns() + timeout_ms; 0 (no deadline) when timeout_ms <= 0. */
uint64_t md_wire_deadline(int timeout_ms);

/* Connect to host:port (a name or an address, IPv4 or IPv6) within timeout_ms. */
int md_wire_connect(const char *host, int port, int timeout_ms, int *fd, md_err *e);
/* Listen on host:port (host NULL, "" or "*": every IPv4 address, "::" every address; port 0:
 * one the kernel picks, returned in *bound_port). */
int md_wire_listen(const char *host, int port, int *fd, int *bound_port, md_err *e);
/* Accept a waiting connection of a listening socket made by md_wire_listen, set up as every
 * socket here, with the peer's address as "host:port" in peer. MD_EIO when none waits. */
int md_wire_accept(int lfd, int *fd, char *peer, size_t peersz, md_err *e);

/* Send or receive exactly n bytes by the deadline. */
int md_wire_send(int fd, const void *p, size_t n, uint64_t deadline, md_err *e);
int md_wire_recv(int fd, void *p, size_t n, uint64_t deadline, volatile sig_atomic_t *stop,
                 md_err *e);

/* Receive a frame's header and check it (md_wire_hdr_get, md_wire_hdr_check with allowed and
 * max_payload); the payload is still to be read. When the peer closed the connection before
 * the header's first byte, MD_EIO with *eof (may be NULL) set to 1: a clean goodbye. */
int md_wire_recv_hdr(int fd, unsigned allowed, uint64_t max_payload, uint64_t deadline,
                     volatile sig_atomic_t *stop, md_wire_hdr *h, int *eof, md_err *e);
/* A whole frame: the header as above, then the payload into b (b->len = its length), its CRC
 * checked. */
int md_wire_recv_frame(int fd, unsigned allowed, uint64_t max_payload, uint64_t deadline,
                       volatile sig_atomic_t *stop, md_wire_hdr *h, md_wire_buf *b, int *eof,
                       md_err *e);

#endif
