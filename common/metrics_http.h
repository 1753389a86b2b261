/* metrics_http.h — serving a metrics registry (common/metrics.h) to Prometheus: an HTTP server
 * on libmicrohttpd's own thread that answers GET (and HEAD) /metrics with the registry in the
 * text format 0.0.4, 404 on any other path and 405 (Allow: GET, HEAD) on any other method
 * (docs/operations.md, "Metrics"). No HTTP is parsed here: libmicrohttpd does it.
 *
 * The registry stays the caller's and must outlive the server. */
#ifndef MEDLEY_COMMON_METRICS_HTTP_H
#define MEDLEY_COMMON_METRICS_HTTP_H

#include "common/err.h"
#include "common/metrics.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>

typedef struct md_metrics_http md_metrics_http;

/* What a libmicrohttpd server of medley (this one, the dashboard's) accepts, so that slow
 * or idle clients (slowloris) cannot take every connection: at most MD_HTTP_PER_IP from one
 * address, MD_HTTP_CONNECTIONS in all, and a connection silent for MD_HTTP_TIMEOUT_S seconds
 * is closed. The server thread polls (epoll), so a slow connection delays no other. */
#define MD_HTTP_CONNECTIONS 512u
#define MD_HTTP_PER_IP 16u
#define MD_HTTP_TIMEOUT_S 10u

/* libmicrohttpd's error log (MHD_OPTION_EXTERNAL_LOGGER with a md_http_log_state as cls),
 * rate-limited: a connection flood makes it say "Server reached connection limit" per
 * refused connection; this logs the first, then at most one line every 10 s with how many
 * it left out. component names the log's component. Zero-initialise, set component. */
typedef struct {
    const char *component;
    pthread_mutex_t mu; /* PTHREAD_MUTEX_INITIALIZER or pthread_mutex_init */
    uint64_t last_ns;
    long left_out;
} md_http_log_state;
void md_http_log(void *cls, const char *fmt, va_list ap);

/* Listen on addr ("HOST:PORT", "[IPv6]:PORT"; HOST a name or a numeric address, PORT 0..65535,
 * 0 a free port) and serve reg. Errors say which: a malformed addr, a host that does not
 * resolve, a port already in use or not allowed (MD_EINVAL), the server failing to start
 * (MD_EIO). */
int md_metrics_http_start(const char *addr, md_metrics *reg, md_metrics_http **out, md_err *e);
int md_metrics_http_port(const md_metrics_http *h); /* the port it listens on */
/* Stop serving (waits for the server's thread) and free; NULL is fine. */
void md_metrics_http_stop(md_metrics_http *h);

#endif
