/* wire_io.c — stage link frames over TCP sockets. See wire_io.h. */
#define _GNU_SOURCE /* accept4 */
#include "engine/shard/wire_io.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/util.h"

#define STOP_SLICE_MS 100 /* how often a wait looks at its stop flag */

uint64_t md_wire_deadline(int timeout_ms) {
    return timeout_ms > 0 ? md_mono_ns() + (uint64_t)timeout_ms * 1000000ull : 0;
}

/* Milliseconds poll() may wait before the deadline or the next look at stop: -1 = forever,
 * 0 = the deadline has passed. */
static int wait_ms(uint64_t deadline, volatile sig_atomic_t *stop) {
    int ms = -1;
    if (deadline) {
        uint64_t now = md_mono_ns();
        if (now >= deadline)
            return 0;
        uint64_t left = (deadline - now + 999999) / 1000000;
        ms = left > 1000000000ull ? 1000000000 : (int)left;
    }
    if (stop && (ms < 0 || ms > STOP_SLICE_MS))
        ms = STOP_SLICE_MS;
    return ms;
}

/* Wait until fd is ready for events: 0, MD_EIO on a timeout (saying what was awaited),
 * MD_ECANCEL on stop. */
static int wait_fd(int fd, short events, uint64_t deadline, volatile sig_atomic_t *stop,
                   const char *what, md_err *e) {
    for (;;) {
        if (stop && *stop)
            return md_errf(e, MD_ECANCEL, "stopped while %s", what);
        int ms = wait_ms(deadline, stop);
        if (ms == 0 && deadline)
            return md_errf(e, MD_EIO, "timed out %s", what);
        struct pollfd p = {.fd = fd, .events = events};
        int n = poll(&p, 1, ms);
        if (n < 0 && errno != EINTR)
            return md_errf(e, MD_EIO, "poll failed %s: %s", what, strerror(errno));
        if (n > 0)
            return 0; /* readable, writable, or an error/hangup the next call reports */
    }
}

static int sock_setup(int fd) {
    int one = 1;
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
        return -1;
    /* not every socket is TCP (a socketpair in a test): ignore the answer */
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return 0;
}

static void addr_name(const struct sockaddr *sa, socklen_t len, char *out, size_t outsz) {
    char h[NI_MAXHOST], s[NI_MAXSERV];
    if (getnameinfo(sa, len, h, sizeof h, s, sizeof s, NI_NUMERICHOST | NI_NUMERICSERV)) {
        snprintf(out, outsz, "?");
        return;
    }
    snprintf(out, outsz, sa->sa_family == AF_INET6 ? "[%s]:%s" : "%s:%s", h, s);
}

int md_wire_connect(const char *host, int port, int timeout_ms, int *fd, md_err *e) {
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    int g = getaddrinfo(host, ps, &hints, &ai);
    if (g)
        return md_errf(e, MD_EIO, "cannot resolve %s: %s", host, gai_strerror(g));
    uint64_t deadline = md_wire_deadline(timeout_ms);
    int rc = md_errf(e, MD_EIO, "no address for %s", host);
    for (struct addrinfo *a = ai; a; a = a->ai_next) {
        int s = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (s < 0) {
            rc = md_errf(e, MD_EIO, "socket: %s", strerror(errno));
            continue;
        }
        if (sock_setup(s)) {
            rc = md_errf(e, MD_EIO, "socket setup: %s", strerror(errno));
            close(s);
            continue;
        }
        int err = 0;
        if (connect(s, a->ai_addr, a->ai_addrlen) < 0) {
            err = errno;
            if (err == EINPROGRESS) {
                rc = wait_fd(s, POLLOUT, deadline, NULL, "connecting", e);
                socklen_t l = sizeof err;
                if (rc == 0 && getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &l) < 0)
                    err = errno;
                if (rc) {
                    close(s);
                    break; /* the time is spent: no other address gets a try */
                }
            }
        }
        if (err == 0) {
            freeaddrinfo(ai);
            *fd = s;
            return 0;
        }
        rc = md_errf(e, MD_EIO, "%s", strerror(err));
        close(s);
    }
    freeaddrinfo(ai);
    return rc;
}

int md_wire_listen(const char *host, int port, int *fd, int *bound_port, md_err *e) {
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    if (host && (!*host || !strcmp(host, "*")))
        host = NULL;
    /* no host: the IPv4 wildcard, whatever order getaddrinfo would give */
    struct addrinfo hints = {.ai_family = host ? AF_UNSPEC : AF_INET,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE},
                    *ai = NULL;
    int g = getaddrinfo(host, ps, &hints, &ai);
    if (g)
        return md_errf(e, MD_EIO, "cannot resolve %s: %s", host ? host : "*", gai_strerror(g));
    int rc = md_errf(e, MD_EIO, "no address to listen on for %s", host ? host : "*");
    for (struct addrinfo *a = ai; a; a = a->ai_next) {
        int s = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (s < 0) {
            rc = md_errf(e, MD_EIO, "socket: %s", strerror(errno));
            continue;
        }
        int one = 1;
        setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(s, a->ai_addr, a->ai_addrlen) < 0 || listen(s, SOMAXCONN) < 0 ||
            sock_setup(s) < 0) {
            rc = md_errf(e, MD_EIO, "cannot listen on %s:%d: %s", host ? host : "*", port,
                         strerror(errno));
            close(s);
            continue;
        }
        struct sockaddr_storage ss;
        socklen_t l = sizeof ss;
        int p = port;
        if (getsockname(s, (struct sockaddr *)&ss, &l) == 0)
            p = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                               : ((struct sockaddr_in *)&ss)->sin_port);
        freeaddrinfo(ai);
        *fd = s;
        if (bound_port)
            *bound_port = p;
        return 0;
    }
    freeaddrinfo(ai);
    return rc;
}

int md_wire_accept(int lfd, int *fd, char *peer, size_t peersz, md_err *e) {
    struct sockaddr_storage ss;
    socklen_t l = sizeof ss;
    int s = accept4(lfd, (struct sockaddr *)&ss, &l, SOCK_CLOEXEC);
    if (s < 0)
        return md_errf(e, MD_EIO, "accept: %s", strerror(errno));
    if (sock_setup(s)) {
        int err = errno;
        close(s);
        return md_errf(e, MD_EIO, "socket setup: %s", strerror(err));
    }
    addr_name((struct sockaddr *)&ss, l, peer, peersz);
    *fd = s;
    return 0;
}

int md_wire_send(int fd, const void *p, size_t n, uint64_t deadline, md_err *e) {
    const uint8_t *q = p;
    size_t done = 0;
    while (done < n) {
        ssize_t k = send(fd, q + done, n - done, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k > 0) {
            done += (size_t)k;
            continue;
        }
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            char what[64];
            snprintf(what, sizeof what, "sending (%zu of %zu bytes sent)", done, n);
            int rc = wait_fd(fd, POLLOUT, deadline, NULL, what, e);
            if (rc)
                return rc;
            continue;
        }
        return md_errf(e, MD_EIO, "send failed after %zu of %zu bytes: %s", done, n,
                       k < 0 ? strerror(errno) : "nothing written");
    }
    return 0;
}

/* As md_wire_recv, with *got the bytes received and *closed 1 when the peer closed the
 * connection. */
static int recv_n(int fd, void *p, size_t n, uint64_t deadline, volatile sig_atomic_t *stop,
                  size_t *got, int *closed, md_err *e) {
    uint8_t *q = p;
    size_t done = 0;
    int rc = 0;
    *closed = 0;
    while (done < n) {
        ssize_t k = recv(fd, q + done, n - done, MSG_DONTWAIT);
        if (k > 0) {
            done += (size_t)k;
            continue;
        }
        if (k == 0) {
            *closed = 1;
            rc = md_errf(e, MD_EIO, "connection closed by the peer (%zu of %zu bytes received)",
                         done, n);
            break;
        }
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            char what[80];
            snprintf(what, sizeof what, "receiving (%zu of %zu bytes received)", done, n);
            if ((rc = wait_fd(fd, POLLIN, deadline, stop, what, e)))
                break;
            continue;
        }
        rc = md_errf(e, MD_EIO, "recv failed after %zu of %zu bytes: %s", done, n, strerror(errno));
        break;
    }
    *got = done;
    return rc;
}

int md_wire_recv(int fd, void *p, size_t n, uint64_t deadline, volatile sig_atomic_t *stop,
                 md_err *e) {
    size_t got;
    int closed;
    return recv_n(fd, p, n, deadline, stop, &got, &closed, e);
}

int md_wire_recv_hdr(int fd, unsigned allowed, uint64_t max_payload, uint64_t deadline,
                     volatile sig_atomic_t *stop, md_wire_hdr *h, int *eof, md_err *e) {
    uint8_t raw[MD_WIRE_HDR];
    size_t got = 0;
    int closed = 0;
    int rc = recv_n(fd, raw, sizeof raw, deadline, stop, &got, &closed, e);
    if (eof)
        *eof = rc && closed && got == 0;
    if (rc)
        return rc;
    if ((rc = md_wire_hdr_get(raw, h, e)))
        return rc;
    return md_wire_hdr_check(h, allowed, max_payload, e);
}

int md_wire_recv_frame(int fd, unsigned allowed, uint64_t max_payload, uint64_t deadline,
                       volatile sig_atomic_t *stop, md_wire_hdr *h, md_wire_buf *b, int *eof,
                       md_err *e) {
    int rc = md_wire_recv_hdr(fd, allowed, max_payload, deadline, stop, h, eof, e);
    if (rc)
        return rc;
    if ((rc = md_wire_buf_reserve(b, (size_t)h->len ? (size_t)h->len : 1, e)))
        return rc;
    b->len = (size_t)h->len;
    if ((rc = md_wire_recv(fd, b->p, b->len, deadline, stop, e)))
        return rc;
    return md_wire_payload_check(h, b->p, e);
}
