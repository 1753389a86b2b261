/* metrics_http.c — see metrics_http.h. The listening socket is made here (so a taken port or
 * a foreign address is said plainly, before any thread starts) and handed to libmicrohttpd,
 * which runs its own polling thread and parses HTTP. */
#include "common/metrics_http.h"

#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/log.h"
#include "common/metrics_process.h"
#include "common/util.h"

struct md_metrics_http {
    struct MHD_Daemon *d;
    md_metrics *reg;
    int fd;
    int port;
    md_http_log_state log;
};

static const char CONTENT_TYPE[] = "text/plain; version=0.0.4; charset=utf-8";

static enum MHD_Result reply(struct MHD_Connection *c, unsigned status, const char *text) {
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(text), (void *)text, MHD_RESPMEM_PERSISTENT);
    if (!r)
        return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; charset=utf-8");
    if (status == MHD_HTTP_METHOD_NOT_ALLOWED)
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
    enum MHD_Result ok = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload,
                                  size_t *upload_size, void **con_cls) {
    md_metrics_http *h = cls;
    (void)version;
    (void)upload;
    (void)upload_size;
    (void)con_cls;
    if (strcmp(method, MHD_HTTP_METHOD_GET) && strcmp(method, MHD_HTTP_METHOD_HEAD))
        return reply(c, MHD_HTTP_METHOD_NOT_ALLOWED, "method not allowed: GET /metrics\n");
    if (strcmp(url, "/metrics"))
        return reply(c, MHD_HTTP_NOT_FOUND, "not found: the metrics are at /metrics\n");
    size_t len = 0;
    char *text = md_metrics_render(h->reg, &len);
    if (!text)
        return reply(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory rendering the metrics\n");
    struct MHD_Response *r = MHD_create_response_from_buffer(len, text, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(text);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, CONTENT_TYPE);
    enum MHD_Result ok = MHD_queue_response(c, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    return ok;
}

#define LOG_EVERY_NS 10000000000ull

void md_http_log(void *cls, const char *fmt, va_list ap) {
    md_http_log_state *st = cls;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    msg[strcspn(msg, "\n")] = '\0';
    uint64_t now = md_mono_ns();
    pthread_mutex_lock(&st->mu);
    long left = -1;
    if (!st->last_ns || now - st->last_ns >= LOG_EVERY_NS) {
        left = st->left_out;
        st->left_out = 0;
        st->last_ns = now;
    } else {
        st->left_out++;
    }
    pthread_mutex_unlock(&st->mu);
    if (left == 0)
        MD_WARN(st->component, "HTTP server: %s", msg);
    else if (left > 0)
        MD_WARN(st->component, "HTTP server: %s (and %ld more such messages in the last %.0f s)",
                msg, left, LOG_EVERY_NS / 1e9);
}

/* "HOST:PORT" or "[V6]:PORT" into host and port. */
static int split_addr(const char *addr, char *host, size_t host_cap, char *port, size_t port_cap,
                      md_err *e) {
    const char *colon = addr ? strrchr(addr, ':') : NULL;
    if (!colon || colon == addr || !colon[1])
        return md_errf(e, MD_EINVAL, "metrics address '%s' is not HOST:PORT (e.g. 127.0.0.1:9100)",
                       addr ? addr : "");
    const char *h = addr;
    size_t hl = (size_t)(colon - addr);
    if (*h == '[') { /* [::1]:9100 */
        if (hl < 2 || h[hl - 1] != ']')
            return md_errf(e, MD_EINVAL,
                           "metrics address '%s': an IPv6 host is written [ADDR]:PORT", addr);
        h++;
        hl -= 2;
    } else if (memchr(h, ':', hl)) {
        return md_errf(e, MD_EINVAL, "metrics address '%s': write an IPv6 host as [ADDR]:PORT",
                       addr);
    }
    char *end;
    long p = strtol(colon + 1, &end, 10);
    if (*end || p < 0 || p > 65535 || hl == 0 || hl >= host_cap)
        return md_errf(e, MD_EINVAL, "metrics address '%s': want HOST:PORT with PORT in 0..65535",
                       addr);
    snprintf(host, host_cap, "%.*s", (int)hl, h);
    snprintf(port, port_cap, "%ld", p);
    return 0;
}

/* A listening socket on addr; fills *fd, *v6. */
static int listen_on(const char *addr, int *fd, int *v6, md_err *e) {
    char host[256], port[8];
    int rc = split_addr(addr, host, sizeof host, port, sizeof port, e);
    if (rc)
        return rc;
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    int g = getaddrinfo(host, port, &hints, &res);
    if (g)
        return md_errf(e, MD_EINVAL, "metrics address %s: host '%s' does not resolve (%s)", addr,
                       host, gai_strerror(g));
    int err = 0;
    *fd = -1;
    for (struct addrinfo *a = res; a && *fd < 0; a = a->ai_next) {
        int s = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (s < 0) {
            err = errno;
            continue;
        }
        int one = 1;
        setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(s, a->ai_addr, a->ai_addrlen) || listen(s, 64)) {
            err = errno;
            close(s);
            continue;
        }
        *fd = s;
        *v6 = a->ai_family == AF_INET6;
    }
    freeaddrinfo(res);
    if (*fd >= 0)
        return 0;
    if (err == EADDRINUSE)
        return md_errf(e, MD_EINVAL,
                       "metrics address %s: port %s is taken (another process listens there)", addr,
                       port);
    if (err == EADDRNOTAVAIL)
        return md_errf(e, MD_EINVAL, "metrics address %s: %s is not an address of this machine",
                       addr, host);
    if (err == EACCES)
        return md_errf(e, MD_EINVAL, "metrics address %s: port %s needs privileges", addr, port);
    return md_errf(e, MD_EINVAL, "metrics address %s: cannot listen: %s", addr, strerror(err));
}

int md_metrics_http_start(const char *addr, md_metrics *reg, md_metrics_http **out, md_err *e) {
    *out = NULL;
    if (!reg)
        return md_errf(e, MD_EINVAL, "metrics server: no registry");
    md_metrics_http *h = calloc(1, sizeof *h);
    if (!h)
        return md_errf(e, MD_ENOMEM, "out of memory");
    int v6 = 0, rc = listen_on(addr, &h->fd, &v6, e);
    if (rc) {
        free(h);
        return rc;
    }
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getsockname(h->fd, (struct sockaddr *)&ss, &sl) == 0)
        h->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                                 : ((struct sockaddr_in *)&ss)->sin_port);
    h->reg = reg;
    h->log.component = "metrics";
    pthread_mutex_init(&h->log.mu, NULL);
    rc = md_metrics_process_add(reg, e);
    if (rc) {
        close(h->fd);
        pthread_mutex_destroy(&h->log.mu);
        free(h);
        return rc;
    }
    h->d = MHD_start_daemon(
        MHD_USE_AUTO_INTERNAL_THREAD | MHD_USE_ERROR_LOG | (v6 ? MHD_USE_IPv6 : 0), 0, NULL, NULL,
        on_request, h, MHD_OPTION_LISTEN_SOCKET, h->fd, MHD_OPTION_CONNECTION_LIMIT,
        MD_HTTP_CONNECTIONS, MHD_OPTION_PER_IP_CONNECTION_LIMIT, MD_HTTP_PER_IP,
        MHD_OPTION_CONNECTION_TIMEOUT, MD_HTTP_TIMEOUT_S, MHD_OPTION_EXTERNAL_LOGGER, md_http_log,
        &h->log, MHD_OPTION_END);
    if (!h->d) {
        close(h->fd);
        pthread_mutex_destroy(&h->log.mu);
        free(h);
        return md_errf(e, MD_EIO,
                       "metrics address %s: the HTTP server (libmicrohttpd) did not start", addr);
    }
    *out = h;
    return 0;
}

int md_metrics_http_port(const md_metrics_http *h) {
    return h ? h->port : 0;
}

void md_metrics_http_stop(md_metrics_http *h) {
    if (!h)
        return;
    MHD_stop_daemon(h->d); /* leaves the listening socket it was given open */
    close(h->fd);
    pthread_mutex_destroy(&h->log.mu);
    free(h);
}
