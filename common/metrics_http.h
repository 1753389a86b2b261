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

typedef struct md_metrics_http md_metrics_http;

/* Listen on addr ("HOST:PORT", "[IPv6]:PORT"; HOST a name or a numeric address, PORT 0..65535,
 * 0 a free port) and serve reg. Errors say which: a malformed addr, a host that does not
 * resolve, a port already in use or not allowed (MD_EINVAL), the server failing to start
 * (MD_EIO). */
int md_metrics_http_start(const char *addr, md_metrics *reg, md_metrics_http **out, md_err *e);
int md_metrics_http_port(const md_metrics_http *h); /* the port it listens on */
/* Stop serving (waits for the server's thread) and free; NULL is fine. */
void md_metrics_http_stop(md_metrics_http *h);

#endif
