/* conns.c — deadlines on the open connections, against slowloris (docs/api.md "Limits").
 * libmicrohttpd's own timeout (--timeout) closes a connection only after that long with no
 * byte at all, so a client that trickles a header byte every few seconds keeps a connection
 * (and its memory) forever. Here every connection is tracked from its opening
 * (MHD_OPTION_NOTIFY_CONNECTION): its request line and headers must be in within
 * --header-timeout of the opening or of the previous answer, and a body must then keep
 * coming at 1 KiB/s on average after that grace. api_conns_reap (about once a second) shuts
 * down the socket of a connection past its deadline (after a 408 when it was waiting for
 * headers); libmicrohttpd sees the end of the stream and closes it as it closes any other. A
 * request whose body is in (being answered, or waiting for its answer) has no deadline here. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/socket.h>

#include "api/api_int.h"
#include "common/util.h"

#define BODY_RATE 1024 /* bytes a second a body must average, after the grace */

enum { WAIT_HEADERS, IN_BODY, ANSWERING };

typedef struct conn {
    struct conn *prev, *next;
    int fd;
    _Atomic int state;
    _Atomic uint64_t since_ns; /* the start of the state */
    _Atomic long long body;    /* body bytes received (IN_BODY) */
} conn;

struct api_conns {
    pthread_mutex_t lock; /* the list; a conn leaves it (CLOSED) before its fd is closed */
    conn *head;
    uint64_t grace_ns;
    long long open, closed;
};

int api_conns_new(unsigned header_timeout_s, api_conns **out) {
    api_conns *t = calloc(1, sizeof *t);
    if (!t)
        return MD_ENOMEM;
    pthread_mutex_init(&t->lock, NULL);
    t->grace_ns = (uint64_t)header_timeout_s * 1000000000ull;
    *out = t;
    return 0;
}

void api_conns_free(api_conns *t) {
    if (!t)
        return;
    for (conn *c = t->head, *n; c; c = n) {
        n = c->next;
        free(c);
    }
    pthread_mutex_destroy(&t->lock);
    free(t);
}

void api_conns_notify(void *cls, struct MHD_Connection *mc, void **socket_context,
                      enum MHD_ConnectionNotificationCode code) {
    api_conns *t = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        conn *c = calloc(1, sizeof *c);
        const union MHD_ConnectionInfo *fd =
            MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
        *socket_context = c;
        if (!c)
            return; /* not tracked: only libmicrohttpd's own timeout applies to it */
        c->fd = fd ? fd->connect_fd : -1;
        atomic_store(&c->since_ns, md_mono_ns());
        pthread_mutex_lock(&t->lock);
        c->next = t->head;
        if (t->head)
            t->head->prev = c;
        t->head = c;
        t->open++;
        pthread_mutex_unlock(&t->lock);
        return;
    }
    conn *c = *socket_context;
    if (!c)
        return;
    pthread_mutex_lock(&t->lock);
    if (c->prev)
        c->prev->next = c->next;
    else
        t->head = c->next;
    if (c->next)
        c->next->prev = c->prev;
    t->open--;
    pthread_mutex_unlock(&t->lock);
    free(c);
    *socket_context = NULL;
}

static conn *conn_of(struct MHD_Connection *mc) {
    const union MHD_ConnectionInfo *i =
        MHD_get_connection_info(mc, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return i ? i->socket_context : NULL;
}

static void set_state(struct MHD_Connection *mc, int state) {
    conn *c = conn_of(mc);
    if (!c)
        return;
    atomic_store(&c->body, 0);
    atomic_store(&c->since_ns, md_mono_ns());
    atomic_store(&c->state, state);
}

void api_conns_request(struct MHD_Connection *mc) {
    set_state(mc, IN_BODY);
}

void api_conns_body(struct MHD_Connection *mc, size_t n) {
    conn *c = conn_of(mc);
    if (c)
        atomic_fetch_add(&c->body, (long long)n);
}

void api_conns_answering(struct MHD_Connection *mc) {
    set_state(mc, ANSWERING);
}

void api_conns_done(struct MHD_Connection *mc) {
    set_state(mc, WAIT_HEADERS);
}

long long api_conns_reap(api_conns *t, long long *open) {
    uint64_t now = md_mono_ns();
    long long n = 0;
    pthread_mutex_lock(&t->lock);
    for (conn *c = t->grace_ns ? t->head : NULL; c; c = c->next) { /* 0: no deadlines */
        int st = atomic_load(&c->state);
        uint64_t since = atomic_load(&c->since_ns), deadline = since + t->grace_ns;
        if (st == IN_BODY)
            deadline += (uint64_t)atomic_load(&c->body) * (1000000000ull / BODY_RATE);
        if (st == ANSWERING || now <= deadline || c->fd < 0)
            continue;
        /* waiting for headers, libmicrohttpd writes nothing: the client may be told why (a
         * body's sender may be sent an early answer, so it is only cut off) */
        static const char timeout[] = "HTTP/1.1 408 Request Timeout\r\nConnection: close\r\n"
                                      "Content-Length: 0\r\n\r\n";
        if (st == WAIT_HEADERS)
            (void)!send(c->fd, timeout, sizeof timeout - 1, MSG_DONTWAIT | MSG_NOSIGNAL);
        /* the fd is still open: CLOSED takes c out of the list first */
        shutdown(c->fd, SHUT_RDWR);
        atomic_store(&c->state, ANSWERING); /* once */
        n++;
    }
    t->closed += n;
    if (open)
        *open = t->open;
    pthread_mutex_unlock(&t->lock);
    return n;
}
