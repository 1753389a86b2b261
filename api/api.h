/* api.h — `medley api`: the OpenAI Files + Batches HTTP API (docs/api.md) in front of the
 * Redis queue of docs/protocol.md, and online chat completions and completions (streamed or
 * not) through the queue's online lane. The process is stateless: files, batches and tenants'
 * indexes live in Redis (key layout in docs/api.md), so any number of API processes can
 * serve one Redis behind a load balancer.
 *
 * api_serve runs libmicrohttpd with a pool of threads, each with its own Redis connection,
 * until *stop is set; *reload (SIGHUP) re-reads the key file. */
#ifndef MEDLEY_API_API_H
#define MEDLEY_API_API_H

#include <signal.h>

#include "common/err.h"
#include "common/metrics.h"

typedef struct {
    const char *listen;    /* "HOST:PORT" or "[V6]:PORT"; port 0 picks a free one */
    const char *redis_url; /* NULL: $MEDLEY_REDIS or the default */
    const char *prefix;    /* key prefix, "medley:" */
    const char *keys_path; /* TENANT KEY lines (docs/api.md "Tenants") */
    int threads;           /* libmicrohttpd's thread pool */
    long long max_file_bytes, max_file_lines, max_line_bytes, max_json_bytes;
    /* per tenant; 0 = no limit */
    long long tenant_max_files, tenant_max_bytes, tenant_max_batches, tenant_rps;
    unsigned max_connections, timeout_s; /* open connections; idle seconds before closing one */
    unsigned per_ip_connections;         /* open connections per client address; 0 = no limit */
    unsigned header_timeout_s; /* seconds for a request's headers, however they trickle in */
    long long max_body_memory; /* bytes of request bodies held at once, all requests; 0: none */
    unsigned online_timeout_s; /* an online request not answered by then is a 504 (600) */
    md_metrics *metrics;       /* may be NULL: the api's series are registered here */
    void (*on_listen)(const char *url); /* called once listening, with http://HOST:PORT */
} api_config;

void api_config_default(api_config *c);

/* Serve until *stop. MD_EINVAL for a bad listen address or key file, MD_EIO when the server
 * cannot start, MD_EREDIS when Redis cannot be reached at start. */
int api_serve(const api_config *cfg, volatile sig_atomic_t *stop, volatile sig_atomic_t *reload,
              md_err *e);

#endif
