/* server.c — see dash.h: libmicrohttpd with one internal thread, routing each request to
 * an asset, a document of api.h or an action, with the security headers on every answer. */
#include <ctype.h>
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "common/log.h"
#include "common/metrics_http.h"
#include "common/redis.h"
#include "dashboard/api.h"
#include "dashboard/assets.h"
#include "dashboard/dash.h"
#include "queue/queue.h"

#define LOGC "dashboard"

/* Scripts, styles and fetches from this server only; no frames, no plugins, no inline
 * script: markup that reached the DOM could still not run. data: for the empty icon. */
static const char csp[] = "default-src 'none'; script-src 'self'; style-src 'self'; "
                          "img-src 'self' data:; connect-src 'self'; base-uri 'none'; "
                          "form-action 'none'; frame-ancestors 'none'";

typedef struct {
    const dash_config *cfg;
    dash_api *api;
    int redis_down; /* the last request lost the connection: dial again first */
    char redis_desc[300];
} server;

int dash_token_ok(const char *token, const char *header) {
    if (!token || !header || strncasecmp(header, "Bearer ", 7))
        return 0;
    const char *given = header + 7;
    size_t n = strlen(token), m = strlen(given);
    /* every byte of the token is compared whatever the input, so the time says nothing about
     * how much of it matched; past the input's end, its terminating NUL stands in */
    unsigned char diff = n != m;
    for (size_t i = 0; i < n; i++)
        diff |= (unsigned char)token[i] ^ (unsigned char)given[i < m ? i : m];
    return diff == 0;
}

int dash_token_read(const char *path, char *out, size_t outsz, md_err *e) {
    FILE *f = fopen(path, "r");
    if (!f)
        return md_errf(e, MD_EIO, "admin token file %s: %s", path, strerror(errno));
    size_t n = fread(out, 1, outsz - 1, f);
    int more = fgetc(f) != EOF;
    fclose(f);
    out[n] = 0;
    while (n > 0 && isspace((unsigned char)out[n - 1]))
        out[--n] = 0;
    if (more)
        return md_errf(e, MD_EINVAL, "admin token file %s: longer than %zu bytes", path, outsz - 2);
    if (n < DASH_TOKEN_MIN)
        return md_errf(e, MD_EINVAL,
                       "admin token file %s: the token is %zu bytes; at least %d are needed "
                       "(e.g. `openssl rand -hex 24 > %s`)",
                       path, n, DASH_TOKEN_MIN, path);
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)out[i] <= ' ' || out[i] == 0x7F)
            return md_errf(e, MD_EINVAL,
                           "admin token file %s: byte %zu is a space or control character "
                           "(one line of printable characters expected)",
                           path, i + 1);
    return 0;
}

/* Queue a response with the headers every answer carries. body is copied. */
static enum MHD_Result send_body(struct MHD_Connection *c, unsigned status, const char *type,
                                 const void *body, size_t len, int cache) {
    struct MHD_Response *r =
        MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r)
        return MHD_NO;
    MHD_add_response_header(r, "Content-Type", type);
    MHD_add_response_header(r, "Content-Security-Policy", csp);
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(r, "X-Frame-Options", "DENY");
    MHD_add_response_header(r, "Referrer-Policy", "no-referrer");
    MHD_add_response_header(r, "Cache-Control", cache ? "no-cache" : "no-store");
    if (status == MHD_HTTP_METHOD_NOT_ALLOWED)
        MHD_add_response_header(r, "Allow", "GET, HEAD, POST");
    enum MHD_Result rc = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return rc;
}

/* doc as JSON (decref'd here). */
static enum MHD_Result send_json(struct MHD_Connection *c, unsigned status, json_t *doc) {
    char *s = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
    json_decref(doc);
    if (!s)
        return send_body(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "application/json",
                         "{\"error\":\"out of memory\"}", 25, 0);
    enum MHD_Result rc = send_body(c, status, "application/json", s, strlen(s), 0);
    free(s);
    return rc;
}

static enum MHD_Result send_error(struct MHD_Connection *c, unsigned status, const char *msg) {
    return send_json(c, status, json_pack("{s:o}", "error", dash_json_str(msg, strlen(msg))));
}

/* ?name=N as an integer in [1, max]; def when absent; -1 when malformed. */
static int int_arg(struct MHD_Connection *c, const char *name, int def, int max) {
    const char *v = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, name);
    if (!v)
        return def;
    char *end;
    long x = strtol(v, &end, 10);
    return *v && !*end && x >= 1 && x <= max ? (int)x : -1;
}

/* A Redis failure: say so (503) and dial again on the next request. */
static enum MHD_Result redis_failed(server *s, struct MHD_Connection *c, const md_err *e) {
    redisContext *ctx = md_redis_ctx(dash_api_redis(s->api));
    if (e->code == MD_EREDIS && (!ctx || ctx->err))
        s->redis_down = 1;
    MD_WARN(LOGC, "%s", e->msg);
    return send_error(c, MHD_HTTP_SERVICE_UNAVAILABLE, e->msg);
}

/* The documents of api.h. */
static enum MHD_Result get_api(server *s, struct MHD_Connection *c, const char *what) {
    if (!strcmp(what, "config")) {
        return send_json(c, MHD_HTTP_OK,
                         json_pack("{s:b, s:b, s:i, s:i, s:s, s:s}", "actions",
                                   s->cfg->admin_token != NULL, "read_token",
                                   s->cfg->read_token != NULL, "refresh_ms", s->cfg->refresh_ms,
                                   "heartbeat_ms", s->cfg->heartbeat_ms, "prefix", s->cfg->prefix,
                                   "redis", s->redis_desc));
    }
    if (s->cfg->read_token) {
        const char *auth = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
        if (!dash_token_ok(s->cfg->read_token, auth) && !dash_token_ok(s->cfg->admin_token, auth))
            return send_error(c, MHD_HTTP_UNAUTHORIZED,
                              "reading needs the read token (Authorization: Bearer <token>)");
    }
    int limit = 0;
    if (!strcmp(what, "batches") || !strcmp(what, "dlq")) {
        limit = int_arg(c, "limit", what[0] == 'b' ? s->cfg->batches_limit : 20, 500);
        if (limit < 0)
            return send_error(c, MHD_HTTP_BAD_REQUEST, "limit must be an integer in 1..500");
    } else if (strcmp(what, "fleet") && strcmp(what, "plan")) {
        return send_error(c, MHD_HTTP_NOT_FOUND, "no such document");
    }
    md_err e = {0};
    if (s->redis_down) {
        if (md_redis_reconnect(dash_api_redis(s->api), 1000, NULL, &e))
            return send_error(c, MHD_HTTP_SERVICE_UNAVAILABLE, e.msg);
        s->redis_down = 0;
        MD_INFO(LOGC, "reconnected to Redis at %s", md_redis_peer(dash_api_redis(s->api)));
    }
    json_t *doc = what[0] == 'b'   ? dash_api_batches(s->api, limit, &e)
                  : what[0] == 'd' ? dash_api_dlq(s->api, limit, &e)
                  : what[0] == 'f' ? dash_api_fleet(s->api, &e)
                                   : dash_api_plan(s->api, &e);
    if (!doc)
        return redis_failed(s, c, &e);
    return send_json(c, MHD_HTTP_OK, doc);
}

/* POST /api/cancel?batch=B, /api/drain?worker=W and /api/undrain?worker=W, with the admin
 * token. */
static enum MHD_Result post_action(server *s, struct MHD_Connection *c, const char *what) {
    int cancel = !strcmp(what, "cancel"), undrain = !strcmp(what, "undrain");
    if (!cancel && !undrain && strcmp(what, "drain"))
        return send_error(c, MHD_HTTP_NOT_FOUND, "no such action (cancel, drain, undrain)");
    if (!s->cfg->admin_token)
        return send_error(c, MHD_HTTP_FORBIDDEN,
                          "actions are disabled: this dashboard was started without "
                          "--admin-token-file");
    if (!dash_token_ok(s->cfg->admin_token,
                       MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization"))) {
        MD_WARN(LOGC, "refused %s: missing or wrong admin token", what);
        return send_error(c, MHD_HTTP_FORBIDDEN,
                          "missing or wrong admin token (Authorization: Bearer <token>)");
    }
    const char *arg = cancel ? "batch" : "worker";
    const char *v = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, arg);
    if (!v || !*v || strlen(v) > 200) {
        char msg[96];
        snprintf(msg, sizeof msg, "give ?%s= (1..200 bytes)", arg);
        return send_error(c, MHD_HTTP_BAD_REQUEST, msg);
    }
    md_err e = {0};
    char st[32];
    snprintf(st, sizeof st, "%s", undrain ? "undrained" : "draining");
    int rc = cancel    ? dash_api_cancel(s->api, v, st, sizeof st, &e)
             : undrain ? dash_api_undrain(s->api, v, &e)
                       : dash_api_drain(s->api, v, &e);
    if (rc == MD_EREDIS)
        return redis_failed(s, c, &e);
    if (rc)
        return send_error(c, rc == MD_ENOTFOUND ? MHD_HTTP_NOT_FOUND : MHD_HTTP_CONFLICT, e.msg);
    MD_INFO(LOGC, "%s %s: %s", what, v, st);
    return send_json(c, MHD_HTTP_OK,
                     json_pack("{s:o, s:s}", arg, dash_json_str(v, strlen(v)), "status", st));
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url,
                              const char *method, const char *version, const char *upload,
                              size_t *upload_size, void **con_cls) {
    static int started;
    if (!*con_cls) { /* the first call only has the headers */
        *con_cls = &started;
        return MHD_YES;
    }
    if (*upload_size) { /* no endpoint takes a body: read and drop it */
        *upload_size = 0;
        return MHD_YES;
    }
    server *s = cls;
    int get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
    if (!strncmp(url, "/api/", 5)) {
        if (get)
            return get_api(s, c, url + 5);
        if (!strcmp(method, "POST"))
            return post_action(s, c, url + 5);
        return send_error(c, MHD_HTTP_METHOD_NOT_ALLOWED, "GET for documents, POST for actions");
    }
    if (!get)
        return send_error(c, MHD_HTTP_METHOD_NOT_ALLOWED, "the page is read with GET");
    const char *path = !strcmp(url, "/") ? "/index.html" : url;
    for (const dash_asset *a = dash_assets; a->path; a++)
        if (!strcmp(path, a->path))
            return send_body(c, MHD_HTTP_OK, a->content_type, a->data, a->len, 1);
    return send_body(c, MHD_HTTP_NOT_FOUND, "text/plain; charset=utf-8", "not found\n", 10, 0);
}

/* libmicrohttpd's log, rate-limited (a connection flood logs each refusal otherwise). */
static md_http_log_state g_http_log = {.component = LOGC, .mu = PTHREAD_MUTEX_INITIALIZER};

/* "HOST:PORT" or "[V6]:PORT" into an address (getaddrinfo: names resolve too). */
static int parse_listen(const char *listen, struct sockaddr_storage *ss, socklen_t *len,
                        md_err *e) {
    char host[256];
    const char *port;
    if (listen[0] == '[') {
        const char *close = strchr(listen, ']');
        if (!close || close[1] != ':' || (size_t)(close - listen - 1) >= sizeof host)
            return md_errf(e, MD_EINVAL, "--listen %s: expected [IPV6]:PORT", listen);
        snprintf(host, sizeof host, "%.*s", (int)(close - listen - 1), listen + 1);
        port = close + 2;
    } else {
        const char *colon = strrchr(listen, ':');
        if (!colon || colon == listen || (size_t)(colon - listen) >= sizeof host)
            return md_errf(e, MD_EINVAL, "--listen %s: expected HOST:PORT (127.0.0.1:8080)",
                           listen);
        snprintf(host, sizeof host, "%.*s", (int)(colon - listen), listen);
        port = colon + 1;
    }
    char *end;
    long p = strtol(port, &end, 10);
    if (!*port || *end || p < 0 || p > 65535)
        return md_errf(e, MD_EINVAL, "--listen %s: port '%s' is not a number in 0..65535", listen,
                       port);
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV}, *res;
    int g = getaddrinfo(host, port, &hints, &res);
    if (g)
        return md_errf(e, MD_EINVAL, "--listen %s: %s", listen, gai_strerror(g));
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    *len = res->ai_addrlen;
    freeaddrinfo(res);
    return 0;
}

/* The operator connection (cfg->operator_url) handed to api. */
static int open_operator(dash_api *api, const dash_config *cfg, md_err *e) {
    md_redis_url u;
    md_redis *op = NULL;
    int rc;
    if ((rc = md_redis_url_parse(cfg->operator_url, &u, e)) || (rc = md_redis_open(&u, &op, e)) ||
        (rc = md_redis_check_prefix(op, cfg->prefix, e))) {
        md_redis_close(op);
        char why[sizeof e->msg];
        snprintf(why, sizeof why, "%s", e->msg);
        return md_errf(e, rc, "the operator connection (--operator-redis): %s", why);
    }
    char desc[300];
    md_redis_url_describe(&u, desc, sizeof desc);
    MD_INFO(LOGC, "actions write through the operator connection (Redis %s)", desc);
    dash_api_set_operator(api, op);
    return 0;
}

int dash_serve(const dash_config *cfg, volatile sig_atomic_t *stop, md_err *e) {
    struct sockaddr_storage ss;
    socklen_t sl = 0;
    int rc = parse_listen(cfg->listen, &ss, &sl, e);
    if (rc)
        return rc;
    md_redis_url u;
    md_redis *r = NULL;
    const char *url = cfg->redis_url ? cfg->redis_url : md_redis_default_url();
    if ((rc = md_redis_url_parse(url, &u, e)) || (rc = md_redis_open(&u, &r, e)) ||
        (rc = md_redis_check_prefix(r, cfg->prefix, e))) {
        md_redis_close(r);
        return rc;
    }
    server s = {.cfg = cfg, .api = dash_api_new(r, cfg->prefix, cfg->heartbeat_ms)};
    if (!s.api) {
        md_redis_close(r);
        return md_errf(e, MD_ENOMEM, "out of memory");
    }
    if (cfg->admin_token && cfg->operator_url && (rc = open_operator(s.api, cfg, e))) {
        dash_api_free(s.api);
        return rc;
    }
    dash_api_show_dlq_lines(s.api, cfg->dlq_lines);
    md_redis_url_describe(&u, s.redis_desc, sizeof s.redis_desc);
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO | MHD_USE_ERROR_LOG;
    if (ss.ss_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    struct MHD_Daemon *d = MHD_start_daemon(
        flags, 0, NULL, NULL, handle, &s, MHD_OPTION_EXTERNAL_LOGGER, md_http_log, &g_http_log,
        MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss, MHD_OPTION_CONNECTION_LIMIT,
        MD_HTTP_CONNECTIONS, MHD_OPTION_PER_IP_CONNECTION_LIMIT, MD_HTTP_PER_IP,
        MHD_OPTION_CONNECTION_TIMEOUT, MD_HTTP_TIMEOUT_S, MHD_OPTION_CONNECTION_MEMORY_LIMIT,
        (size_t)64 * 1024, MHD_OPTION_END);
    if (!d) {
        dash_api_free(s.api);
        return md_errf(e, MD_EIO, "cannot listen on %s (address in use or not local?)",
                       cfg->listen);
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    char host[256], where[300];
    if (getnameinfo((struct sockaddr *)&ss, sl, host, sizeof host, NULL, 0, NI_NUMERICHOST))
        snprintf(host, sizeof host, "?");
    snprintf(where, sizeof where, ss.ss_family == AF_INET6 ? "http://[%s]:%u/" : "http://%s:%u/",
             host, info ? (unsigned)info->port : 0u);
    MD_INFO(LOGC, "serving %s (Redis %s, actions %s)", where, s.redis_desc,
            cfg->admin_token ? "enabled with the admin token" : "disabled");
    if (cfg->on_listen)
        cfg->on_listen(where);
    while (!*stop) {
        struct timespec ts = {0, 100000000L};
        nanosleep(&ts, NULL);
    }
    MHD_stop_daemon(d);
    dash_api_free(s.api);
    MD_INFO(LOGC, "stopped");
    return 0;
}
