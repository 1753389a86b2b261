/* server.c — see api.h: the libmicrohttpd daemon (a thread pool, connection limits and
 * timeouts against floods and slowloris), each request authenticated, rate-limited per
 * tenant, bounded in size and routed to files.c / batches.c / models.c; per-thread Redis
 * connections; the request metrics. */
#include <errno.h>
#include <netdb.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "api/api_int.h"
#include "api/online.h"
#include "common/log.h"
#include "common/util.h"
#include "queue/queue.h"

#define LOGC "api"
#define CONNS_MAX 64 /* Redis connections: one per libmicrohttpd thread */

void api_config_default(api_config *c) {
    *c = (api_config){.listen = "127.0.0.1:8000",
                      .prefix = "medley:",
                      .threads = 4,
                      .max_file_bytes = 200LL * 1024 * 1024,
                      .max_file_lines = 50000,
                      .max_line_bytes = 4LL * 1024 * 1024,
                      .max_json_bytes = 1024 * 1024,
                      .max_connections = 16384,
                      .per_ip_connections = 4096,
                      .timeout_s = 30,
                      .header_timeout_s = 10,
                      .max_body_memory = 256LL * 1024 * 1024,
                      .online_timeout_s = 600};
}

static __thread md_redis *t_redis;
static __thread int t_broken;
static pthread_mutex_t conns_lock = PTHREAD_MUTEX_INITIALIZER;
static md_redis *conns[CONNS_MAX];
static int n_conns;

md_redis *api_redis(api_server *s, md_err *e) {
    if (t_redis && t_broken) {
        if (md_redis_reconnect(t_redis, 1000, NULL, e))
            return NULL;
        t_broken = 0;
    }
    if (t_redis)
        return t_redis;
    pthread_mutex_lock(&conns_lock);
    int room = n_conns < CONNS_MAX;
    pthread_mutex_unlock(&conns_lock);
    if (!room) {
        md_errf(e, MD_EREDIS, "more than %d Redis connections", CONNS_MAX);
        return NULL;
    }
    if (md_redis_open(&s->url, &t_redis, e))
        return NULL;
    pthread_mutex_lock(&conns_lock);
    conns[n_conns++] = t_redis;
    pthread_mutex_unlock(&conns_lock);
    return t_redis;
}

void api_redis_failed(void) {
    t_broken = 1;
}

/* A bounded route name for metrics and logs. */
static const char *route_of(const char *method, const char *url) {
    int get = !strcmp(method, "GET"), post = !strcmp(method, "POST");
    if (!strcmp(url, "/v1/models"))
        return "models";
    if (!strcmp(url, "/v1/chat/completions"))
        return "chat.completions";
    if (!strcmp(url, "/v1/completions"))
        return "completions";
    if (!strcmp(url, "/v1/files"))
        return post ? "files.create" : "files.list";
    if (!strncmp(url, "/v1/files/", 10)) {
        const char *end = url + strlen(url);
        if (end - url > 8 && !strcmp(end - 8, "/content"))
            return "files.content";
        return !strcmp(method, "DELETE") ? "files.delete" : "files.retrieve";
    }
    if (!strcmp(url, "/v1/batches"))
        return post ? "batches.create" : "batches.list";
    if (!strncmp(url, "/v1/batches/", 12)) {
        const char *end = url + strlen(url);
        if (post && end - url > 7 && !strcmp(end - 7, "/cancel"))
            return "batches.cancel";
        return get ? "batches.retrieve" : "batches.other";
    }
    return "other";
}

/* Requests per second per tenant, counted in Redis so that every API process shares it. */
static int over_rate(api_req *q) {
    if (q->s->cfg->tenant_rps <= 0)
        return 0;
    md_err e = {0};
    md_redis *r = api_redis(q->s, &e);
    if (!r)
        return 0; /* the request will meet the failure and answer 503 */
    char key[Q_KEY_MAX], what[40];
    snprintf(what, sizeof what, "rate:%lld", (long long)(md_wall_ms() / 1000));
    api_key_tenant(key, q->s->prefix, q->tenant, what);
    redisReply *rep = md_redis_cmd(r, &e, "INCR %s", key);
    if (!rep) {
        api_redis_failed();
        return 0;
    }
    long long n = rep->type == REDIS_REPLY_INTEGER ? rep->integer : 0;
    freeReplyObject(rep);
    if (n == 1 && (rep = md_redis_cmd(r, &e, "EXPIRE %s 2", key)))
        freeReplyObject(rep);
    return n > q->s->cfg->tenant_rps;
}

/* The first call of a request (headers only): authenticate, rate-limit, refuse a declared
 * body over its limit. Returns MHD_YES with no answer queued when the request goes on. */
static enum MHD_Result admit(api_req *q, struct MHD_Connection *c, const char *method) {
    api_server *s = q->s;
    const char *auth = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    pthread_rwlock_rdlock(&s->keys_lock);
    const char *t = api_keys_tenant(s->keys, auth);
    if (t)
        snprintf(q->tenant, sizeof q->tenant, "%s", t);
    pthread_rwlock_unlock(&s->keys_lock);
    if (!t)
        return api_send_error(q, c, MHD_HTTP_UNAUTHORIZED, NULL, "invalid_api_key",
                              auth ? "Incorrect API key provided."
                                   : "You didn't provide an API key. Give it as "
                                     "\"Authorization: Bearer KEY\".");
    md_counter_add(md_metric_at1(s->m_tenant, q->tenant), 1);
    if (over_rate(q))
        return api_send_error(q, c, MHD_HTTP_TOO_MANY_REQUESTS, NULL, "rate_limit_exceeded",
                              "tenant %s is over its %lld requests per second", q->tenant,
                              s->cfg->tenant_rps);
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
    long long len = cl ? strtoll(cl, NULL, 10) : 0;
    int upload = !strcmp(q->route, "files.create");
    /* multipart adds its boundaries and part headers: a few KiB over the file's limit */
    long long max = upload ? s->cfg->max_file_bytes + 64 * 1024 : s->cfg->max_json_bytes;
    if (len > max)
        return api_send_error(q, c, MHD_HTTP_CONTENT_TOO_LARGE, NULL, "request_too_large",
                              "the body is %lld bytes; at most %lld are taken here", len, max);
    if (strcmp(method, "GET") && strcmp(method, "POST") && strcmp(method, "DELETE") &&
        strcmp(method, "HEAD"))
        return api_send_error(q, c, MHD_HTTP_METHOD_NOT_ALLOWED, NULL, NULL,
                              "method %s is not served", method);
    return upload ? api_files_upload_begin(q, c) : MHD_YES;
}

int api_body_reserve(api_req *q, long long n) {
    long long max = q->s->cfg->max_body_memory;
    if (atomic_fetch_add(&q->s->body_mem, n) + n > max && max > 0) {
        atomic_fetch_sub(&q->s->body_mem, n);
        return -1;
    }
    q->held += n;
    return 0;
}

/* A JSON body, kept up to max_json_bytes (past it: body_too_big, answered 413 at the end; past
 * --max-body-memory with the other requests' bodies: busy, 503). */
static int take_body(api_req *q, const char *data, size_t n) {
    if (q->busy || q->body_too_big || (long long)(q->body_len + n) > q->s->cfg->max_json_bytes) {
        q->body_too_big = !q->busy;
        return -1;
    }
    if (q->body_len + n + 1 > q->body_cap) {
        size_t cap = (q->body_len + n + 1) * 2;
        if (api_body_reserve(q, (long long)(cap - q->body_cap))) {
            q->busy = 1;
            return -1;
        }
        char *nb = realloc(q->body, cap);
        if (!nb) {
            q->body_too_big = 1;
            return -1;
        }
        q->body = nb;
        q->body_cap = cap;
    }
    memcpy(q->body + q->body_len, data, n);
    q->body_len += n;
    q->body[q->body_len] = 0;
    return 0;
}

static enum MHD_Result dispatch(api_req *q, struct MHD_Connection *c, const char *url,
                                const char *method) {
    if (!strncmp(url, "/v1/files", 9) && (!url[9] || url[9] == '/'))
        return api_files_route(q, c, method, url + 9);
    if (!strncmp(url, "/v1/batches", 11) && (!url[11] || url[11] == '/'))
        return api_batches_route(q, c, method, url + 11);
    if (!strcmp(url, "/v1/models") && !strcmp(method, "GET"))
        return api_models(q, c);
    if (!strcmp(url, "/v1/chat/completions") || !strcmp(url, "/v1/completions"))
        return api_online_route(q, c, method, url[4] == 'c' && url[5] == 'h');
    return api_send_error(q, c, MHD_HTTP_NOT_FOUND, NULL, "unknown_url",
                          "Unknown request URL: %s %.200s", method, url);
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url,
                              const char *method, const char *version, const char *upload,
                              size_t *upload_size, void **con_cls) {
    (void)version;
    api_server *s = cls;
    api_req *q = *con_cls;
    if (!q) {
        if (!(q = calloc(1, sizeof *q)))
            return MHD_NO;
        *q = (api_req){.s = s, .route = route_of(method, url), .t0_ns = md_mono_ns()};
        *con_cls = q;
        api_conns_request(c);
        return admit(q, c, method);
    }
    if (*upload_size)
        api_conns_body(c, *upload_size);
    else
        api_conns_answering(c);
    if (q->answered) { /* answered early (413, 401): what still comes is dropped */
        *upload_size = 0;
        return MHD_YES;
    }
    if (*upload_size) {
        size_t n = *upload_size;
        *upload_size = 0;
        int upl = !strcmp(q->route, "files.create");
        if ((upl ? api_files_upload(q, upload, n) : take_body(q, upload, n)) < 0) {
            /* dropped until the end, where the error is answered; a body far past its limit
             * closes the connection instead */
            q->dropped += (long long)n;
            long long bound = upl ? q->s->cfg->max_file_bytes : q->s->cfg->max_json_bytes;
            return q->dropped > bound ? MHD_NO : MHD_YES;
        }
        return MHD_YES;
    }
    if (q->busy)
        return api_send_error(q, c, MHD_HTTP_SERVICE_UNAVAILABLE, NULL, "server_busy",
                              "request bodies being received hold --max-body-memory (%lld "
                              "bytes) now; try again",
                              q->s->cfg->max_body_memory);
    if (q->body_too_big)
        return api_send_error(q, c, MHD_HTTP_CONTENT_TOO_LARGE, NULL, "request_too_large",
                              "the body is over %lld bytes", q->s->cfg->max_json_bytes);
    if (q->on) /* an online request resumed by its waiter */
        return api_online_resume(q, c);
    return dispatch(q, c, url, method);
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls,
                      enum MHD_RequestTerminationCode why) {
    (void)why;
    api_server *s = cls;
    api_req *q = *con_cls;
    api_conns_done(c);
    if (!q)
        return;
    char code[8];
    snprintf(code, sizeof code, "%u", q->status ? q->status : 499);
    md_counter_add(md_metric_at2(s->m_requests, q->route, code), 1);
    md_histogram_observe(md_metric_at1(s->m_seconds, q->route),
                         (double)(md_mono_ns() - q->t0_ns) / 1e9);
    api_files_upload_end(q);
    api_online_end(q);
    free(q->body);
    atomic_fetch_sub(&s->body_mem, q->held);
    free(q);
    *con_cls = NULL;
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && msg[n - 1] == '\n')
        msg[--n] = 0;
    MD_DEBUG(LOGC, "http: %s", msg);
}

/* A listening socket on "HOST:PORT" / "[V6]:PORT"; its port to *port. */
static int listen_on(const char *addr, int *fd, int *v6, int *port, md_err *e) {
    char host[256];
    const char *colon = addr[0] == '[' ? strstr(addr, "]:") : strrchr(addr, ':');
    const char *h = addr[0] == '[' ? addr + 1 : addr;
    if (!colon || colon <= h || (size_t)(colon - h) >= sizeof host)
        return md_errf(e, MD_EINVAL, "--listen %s: expected HOST:PORT or [IPV6]:PORT", addr);
    snprintf(host, sizeof host, "%.*s", (int)(colon - h), h);
    const char *ps = colon + (addr[0] == '[' ? 2 : 1);
    char *end;
    long p = strtol(ps, &end, 10);
    if (!*ps || *end || p < 0 || p > 65535)
        return md_errf(e, MD_EINVAL, "--listen %s: port '%s' is not in 0..65535", addr, ps);
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE | AI_NUMERICSERV},
                    *res = NULL;
    int g = getaddrinfo(host, ps, &hints, &res);
    if (g)
        return md_errf(e, MD_EINVAL, "--listen %s: %s", addr, gai_strerror(g));
    *fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1, err = 0;
    if (*fd < 0 || setsockopt(*fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) ||
        bind(*fd, res->ai_addr, res->ai_addrlen) || listen(*fd, 4096))
        err = errno;
    *v6 = res->ai_family == AF_INET6;
    freeaddrinfo(res);
    if (err) {
        if (*fd >= 0)
            close(*fd);
        return md_errf(e, MD_EINVAL, "--listen %s: %s", addr, strerror(err));
    }
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    getsockname(*fd, (struct sockaddr *)&ss, &sl);
    *port = ntohs(*v6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                      : ((struct sockaddr_in *)&ss)->sin_port);
    return 0;
}

static int register_metrics(api_server *s, md_metrics *m, md_err *e) {
    static const double secs[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                  0.25,  0.5,    1,     2.5,  5,     10,   30};
    const char *rc[] = {"route", "code"}, *ro[] = {"route"}, *te[] = {"tenant"};
    if (!m)
        return 0;
    s->m_requests =
        md_metrics_counter(m, "medley_api_requests_total",
                           "API requests answered, by route and HTTP status", 2, rc, 256, e);
    s->m_seconds = md_metrics_histogram(m, "medley_api_request_seconds",
                                        "API request latency, headers in to answer done", 1, ro, 32,
                                        secs, (int)(sizeof secs / sizeof secs[0]), e);
    s->m_upload = md_metrics_counter(m, "medley_api_upload_bytes_total",
                                     "file bytes uploaded and stored, by tenant", 1, te, 256, e);
    s->m_tenant = md_metrics_counter(m, "medley_api_tenant_requests_total",
                                     "authenticated API requests, by tenant", 1, te, 256, e);
    s->m_forged = md_metrics_counter(
        m, "medley_forged_answers_total",
        "answer lines dropped from output files served: their queue entry is not the batch's "
        "(forged; counted each time a file is read)",
        0, NULL, 1, e);
    s->m_slow = md_metrics_counter(m, "medley_api_slow_connections_closed_total",
                                   "connections closed for headers not in within "
                                   "--header-timeout or a body under 1 KiB/s (slowloris)",
                                   0, NULL, 1, e);
    s->m_open =
        md_metrics_gauge(m, "medley_api_open_connections", "open HTTP connections", 0, NULL, 1, e);
    return s->m_requests && s->m_seconds && s->m_upload && s->m_tenant && s->m_forged &&
                   s->m_slow && s->m_open
               ? 0
               : MD_EINVAL;
}

static void reload_keys(api_server *s) {
    api_keys *k = NULL;
    md_err e = {0};
    if (api_keys_load(s->cfg->keys_path, &k, &e)) {
        MD_WARN(LOGC, "SIGHUP: keeping the old keys: %s", e.msg);
        return;
    }
    pthread_rwlock_wrlock(&s->keys_lock);
    api_keys *old = s->keys;
    s->keys = k;
    pthread_rwlock_unlock(&s->keys_lock);
    api_keys_free(old);
    MD_INFO(LOGC, "SIGHUP: re-read %s", s->cfg->keys_path);
}

static struct MHD_Daemon *start_daemon(api_server *s, int fd, int v6) {
    const api_config *cfg = s->cfg;
    /* suspend/resume: online requests wait for the worker's events (api/online.h) */
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO | MHD_USE_ERROR_LOG |
                     MHD_ALLOW_SUSPEND_RESUME | (v6 ? MHD_USE_IPv6 : 0);
    return MHD_start_daemon(
        flags, 0, NULL, NULL, handle, s, MHD_OPTION_LISTEN_SOCKET, fd, MHD_OPTION_THREAD_POOL_SIZE,
        (unsigned)(cfg->threads > 0 ? cfg->threads : 1), MHD_OPTION_CONNECTION_LIMIT,
        cfg->max_connections, MHD_OPTION_CONNECTION_TIMEOUT, cfg->timeout_s,
        MHD_OPTION_PER_IP_CONNECTION_LIMIT, cfg->per_ip_connections,
        /* headers beyond this answer 431 (the request line and headers live in it) */
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)64 * 1024, MHD_OPTION_NOTIFY_COMPLETED,
        completed, s, MHD_OPTION_NOTIFY_CONNECTION, api_conns_notify, s->conns,
        MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL, MHD_OPTION_END);
}

/* Open files: the soft limit raised to the hard one (a refusal, as under systemd's
 * SystemCallFilter=~@resources, keeps it), and the connection limit lowered to fit it, with a
 * warning: past it libmicrohttpd's accept() would fail with EMFILE on each try. */
static unsigned fit_connections(unsigned want) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl))
        return want;
    if (rl.rlim_cur < rl.rlim_max) {
        struct rlimit up = {rl.rlim_max, rl.rlim_max};
        if (!setrlimit(RLIMIT_NOFILE, &up))
            rl.rlim_cur = rl.rlim_max;
    }
    /* Redis connections, the listening socket, logs, metrics: 128 is ample */
    rlim_t room = rl.rlim_cur > 256 ? rl.rlim_cur - 128 : rl.rlim_cur / 2;
    if (rl.rlim_cur != RLIM_INFINITY && want > room) {
        MD_WARN(LOGC,
                "--max-connections %u lowered to %llu: %llu open files allowed (ulimit -n; "
                "LimitNOFILE= under systemd)",
                want, (unsigned long long)room, (unsigned long long)rl.rlim_cur);
        return (unsigned)room;
    }
    return want;
}

int api_serve(const api_config *cfg, volatile sig_atomic_t *stop, volatile sig_atomic_t *reload,
              md_err *e) {
    api_config fitted = *cfg;
    fitted.max_connections = fit_connections(cfg->max_connections);
    cfg = &fitted;
    api_server s = {.cfg = cfg, .prefix = cfg->prefix};
    md_redis *r = NULL;
    int fd = -1, v6 = 0, port = 0, rc;
    const char *url = cfg->redis_url ? cfg->redis_url : md_redis_default_url();
    if ((rc = q_prefix_check(cfg->prefix, e)) || (rc = api_keys_load(cfg->keys_path, &s.keys, e)))
        return rc;
    if ((rc = md_redis_url_parse(url, &s.url, e)) || (rc = md_redis_open(&s.url, &r, e)) ||
        (rc = md_redis_check_prefix(r, cfg->prefix, e)) ||
        (rc = register_metrics(&s, cfg->metrics, e)) ||
        (rc = listen_on(cfg->listen, &fd, &v6, &port, e))) {
        md_redis_close(r);
        api_keys_free(s.keys);
        return rc;
    }
    md_redis_close(r);
    if (api_conns_new(cfg->header_timeout_s, &s.conns)) {
        close(fd);
        api_keys_free(s.keys);
        return md_errf(e, MD_ENOMEM, "out of memory");
    }
    if ((rc = api_waiter_start(&s, e))) {
        close(fd);
        api_conns_free(s.conns);
        api_keys_free(s.keys);
        return rc;
    }
    pthread_rwlock_init(&s.keys_lock, NULL);
    struct MHD_Daemon *d = start_daemon(&s, fd, v6);
    if (!d) {
        api_waiter_free(&s);
        close(fd);
        api_conns_free(s.conns);
        api_keys_free(s.keys);
        return md_errf(e, MD_EIO, "the HTTP server (libmicrohttpd) did not start on %s",
                       cfg->listen);
    }
    char shown[300];
    const char *colon = strrchr(cfg->listen, ':');
    snprintf(shown, sizeof shown, "http://%.*s:%d", (int)(colon - cfg->listen), cfg->listen, port);
    MD_INFO(LOGC, "serving the OpenAI Files and Batches API on %s", shown);
    if (cfg->on_listen)
        cfg->on_listen(shown);
    for (int tick = 0; !*stop; tick++) {
        if (reload && *reload) {
            *reload = 0;
            reload_keys(&s);
        }
        if (tick % 10 == 0) { /* once a second */
            long long open = 0, slow = api_conns_reap(s.conns, &open);
            if (slow)
                MD_DEBUG(LOGC, "closed %lld connection(s) past their deadline", slow);
            if (s.m_slow) {
                md_counter_add(md_metric_at0(s.m_slow), (double)slow);
                md_gauge_set(md_metric_at0(s.m_open), (double)open);
            }
        }
        usleep(100 * 1000);
    }
    /* online requests waiting are answered 503 and resumed (a suspended connection must not
     * outlive the daemon), and given a moment to be sent */
    api_waiter_stop(&s);
    usleep(200 * 1000);
    MHD_stop_daemon(d);
    api_conns_free(s.conns);
    api_waiter_free(&s);
    close(fd);
    pthread_mutex_lock(&conns_lock);
    for (int i = 0; i < n_conns; i++)
        md_redis_close(conns[i]);
    n_conns = 0;
    pthread_mutex_unlock(&conns_lock);
    pthread_rwlock_destroy(&s.keys_lock);
    api_keys_free(s.keys);
    return 0;
}
