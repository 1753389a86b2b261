/* dash.h — `medley dashboard`: an HTTP server (libmicrohttpd) for the page in
 * dashboard/assets/ and the JSON of dashboard/api.h, over one Redis connection.
 *
 *   GET  /, /index.html, /app.js, /style.css      the page (compiled in)
 *   GET  /api/config: {"actions", "read_token", "refresh_ms", "heartbeat_ms", "prefix", "redis"}
 *   GET  /api/batches[?limit=N], /api/fleet, /api/plan, /api/dlq[?limit=N]: with a read
 *        token, only for "Authorization: Bearer <read or admin token>" (401 otherwise)
 *   POST /api/cancel?batch=B, /api/drain?worker=W, /api/undrain?worker=W: actions, only with
 *        an admin token, sent as "Authorization: Bearer <token>" (403 otherwise)
 *
 * The page polls the GET endpoints every refresh_ms. Every response carries a strict
 * Content-Security-Policy (scripts and styles from the server only), so even markup that got
 * into the page could not run. One thread serves every request, in turn. */
#ifndef MEDLEY_DASHBOARD_DASH_H
#define MEDLEY_DASHBOARD_DASH_H

#include <signal.h>
#include <stddef.h>

#include "common/err.h"

#define DASH_TOKEN_MIN 16 /* bytes: a shorter admin token is refused at start */

typedef struct {
    const char *listen;    /* "HOST:PORT", "[V6]:PORT"; port 0: any free port */
    const char *redis_url; /* NULL: md_redis_default_url() */
    /* The actions' writes (the medley-operator Redis user); NULL: through redis_url's
     * connection. Dialled only with an admin_token. */
    const char *operator_url;
    const char *prefix;      /* "medley:" */
    const char *admin_token; /* NULL: read-only (every action answers 403) */
    /* Non-NULL: every document (all of /api but config) needs "Authorization: Bearer" with this
     * token or the admin token (401 otherwise); NULL: reading needs no token. */
    const char *read_token;
    int dlq_lines;     /* show the start of DLQ lines (prompts); off: their length only */
    int refresh_ms;    /* how often the page polls */
    int heartbeat_ms;  /* the workers' heartbeat period (staleness: 3 of them) */
    int batches_limit; /* batches listed by default */
    /* Called once listening, with the URL ("http://127.0.0.1:8080/"); may be NULL. */
    void (*on_listen)(const char *url);
} dash_config;

/* Serve until *stop becomes non-zero. MD_EINVAL for a bad listen address, MD_EIO when the
 * port cannot be bound, MD_EREDIS when Redis is unreachable at start (later failures are
 * answered 503 and retried on the next request). */
int dash_serve(const dash_config *cfg, volatile sig_atomic_t *stop, md_err *e);

/* Whether the Authorization header value `header` is "Bearer <token>" for this token, in time
 * independent of where they differ. 0 when token is NULL (actions disabled). */
int dash_token_ok(const char *token, const char *header);

/* Read an admin token from path (trailing whitespace dropped) into out. MD_EINVAL when it is
 * shorter than DASH_TOKEN_MIN or holds whitespace or control bytes; MD_EIO when unreadable. */
int dash_token_read(const char *path, char *out, size_t outsz, md_err *e);

#endif
