/* cmd_api.c — `medley api`: the OpenAI Files + Batches HTTP API of api/api.h over a Redis
 * (docs/api.md); SIGHUP re-reads the key file, SIGINT/SIGTERM stop. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "cli/commands.h"
#include "common/metrics_http.h"

static volatile sig_atomic_t g_stop, g_reload;

static void on_signal(int sig) {
    if (sig == SIGHUP)
        g_reload = 1;
    else
        g_stop = 1;
}

static void on_listen(const char *url) {
    printf("medley api: serving %s\n", url);
    fflush(stdout);
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: medley api --api-keys FILE [--listen ADDR:PORT] [--redis URL] [options]\n"
            "\n"
            "Serve OpenAI's Files and Batches API (POST/GET /v1/files, /v1/batches, GET\n"
            "/v1/models) and online POST /v1/chat/completions and /v1/completions (streamed\n"
            "or not, served by the same workers ahead of batch lines) over medley's Redis\n"
            "queue, for openai.OpenAI(base_url=...). Stateless: run as many as needed against\n"
            "one Redis (docs/api.md).\n"
            "\n"
            "  --api-keys FILE        `TENANT KEY` lines (# comments; KEY may be sha256:HEX);\n"
            "                         re-read on SIGHUP\n"
            "  --listen ADDR:PORT     default 127.0.0.1:8000 (port 0: a free one). No TLS:\n"
            "                         put a TLS proxy in front (docs/api.md)\n"
            "  --redis URL            default $MEDLEY_REDIS, else redis://127.0.0.1:6379/0\n"
            "  --prefix P             key prefix (default medley:)\n"
            "  --threads N            HTTP threads, each with a Redis connection (default 4)\n"
            "  --max-file-bytes N     per uploaded file (default 209715200, 200 MB)\n"
            "  --max-file-lines N     requests per file (default 50000)\n"
            "  --max-line-bytes N     per input line (default 4194304)\n"
            "  --max-json-bytes N     per JSON request body (default 1048576)\n"
            "  --tenant-max-files N, --tenant-max-bytes N, --tenant-max-batches N (in flight),\n"
            "  --tenant-rps N         per-tenant limits, answered 429 + Retry-After (0: none)\n"
            "  --max-connections N    open connections (default 16384; lowered to fit\n"
            "                         ulimit -n, which is raised to its hard limit)\n"
            "  --max-connections-per-ip N  per client address (default 4096; 0: no limit, for\n"
            "                         a proxy in front that gives every client its address)\n"
            "  --timeout S            idle seconds before a connection is closed (default 30)\n"
            "  --max-body-memory N    bytes of request bodies held at once, all requests\n"
            "                         together (default 268435456; past it 503 + Retry-After)\n"
            "  --header-timeout S     seconds for a request's headers, from the connection's\n"
            "                         opening or the last answer, however they trickle in;\n"
            "                         then a body must average 1 KiB/s (default 10; 0: off)\n"
            "  --online-timeout S     an online request (/v1/chat/completions, /v1/completions)\n"
            "                         not answered within S seconds is a 504 (default 600)\n"
            "  --metrics ADDR:PORT    serve Prometheus metrics at http://ADDR:PORT/metrics\n");
}

/* "--flag N" as an integer in [lo, hi]; -1 after saying what is wrong. */
static long long num(const char *flag, const char *v, long long lo, long long hi) {
    char *end;
    long long x = strtoll(v, &end, 10);
    if (!*v || *end || x < lo || x > hi) {
        fprintf(stderr, "medley api: %s needs an integer in %lld..%lld\n", flag, lo, hi);
        return -1;
    }
    return x;
}

/* The option a with value v into cfg; 0, or 2 (usage). */
static int option(api_config *cfg, const char **metrics, const char *a, const char *v) {
    struct {
        const char *flag;
        long long *dst, lo, hi;
    } nums[] = {{"--max-file-bytes", &cfg->max_file_bytes, 1, 1LL << 40},
                {"--max-file-lines", &cfg->max_file_lines, 1, 1LL << 30},
                {"--max-line-bytes", &cfg->max_line_bytes, 1024, 1LL << 30},
                {"--max-json-bytes", &cfg->max_json_bytes, 1024, 1LL << 30},
                {"--tenant-max-files", &cfg->tenant_max_files, 0, 1LL << 40},
                {"--tenant-max-bytes", &cfg->tenant_max_bytes, 0, 1LL << 50},
                {"--tenant-max-batches", &cfg->tenant_max_batches, 0, 1LL << 30},
                {"--tenant-rps", &cfg->tenant_rps, 0, 1LL << 30},
                {"--max-body-memory", &cfg->max_body_memory, 0, 1LL << 40}};
    for (size_t k = 0; k < sizeof nums / sizeof nums[0]; k++)
        if (!strcmp(a, nums[k].flag))
            return (*nums[k].dst = num(a, v, nums[k].lo, nums[k].hi)) < 0 ? 2 : 0;
    long long x;
    if (!strcmp(a, "--listen"))
        cfg->listen = v;
    else if (!strcmp(a, "--redis"))
        cfg->redis_url = v;
    else if (!strcmp(a, "--prefix"))
        cfg->prefix = v;
    else if (!strcmp(a, "--api-keys"))
        cfg->keys_path = v;
    else if (!strcmp(a, "--metrics"))
        *metrics = v;
    else if (!strcmp(a, "--threads") || !strcmp(a, "--max-connections") ||
             !strcmp(a, "--max-connections-per-ip") || !strcmp(a, "--timeout") ||
             !strcmp(a, "--header-timeout") || !strcmp(a, "--online-timeout")) {
        int threads = !strcmp(a, "--threads"), per_ip = !strcmp(a, "--max-connections-per-ip");
        int timeout = !strcmp(a, "--timeout"), headers = !strcmp(a, "--header-timeout");
        int online = !strcmp(a, "--online-timeout");
        if ((x = num(a, v, per_ip || headers ? 0 : 1,
                     threads              ? 32
                     : online             ? 86400
                     : timeout || headers ? 3600
                                          : 1000000)) < 0)
            return 2;
        if (online)
            cfg->online_timeout_s = (unsigned)x;
        else if (threads)
            cfg->threads = (int)x;
        else if (per_ip)
            cfg->per_ip_connections = (unsigned)x;
        else if (timeout)
            cfg->timeout_s = (unsigned)x;
        else if (headers)
            cfg->header_timeout_s = (unsigned)x;
        else
            cfg->max_connections = (unsigned)x;
    } else {
        fprintf(stderr, "medley api: unknown option %s (see --help)\n", a);
        return 2;
    }
    return 0;
}

int cmd_api(int argc, char **argv) {
    api_config cfg;
    api_config_default(&cfg);
    cfg.on_listen = on_listen;
    const char *metrics_addr = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "medley api: %s: unknown option or missing value (see --help)\n",
                    argv[i]);
            return 2;
        }
        if (option(&cfg, &metrics_addr, argv[i], argv[i + 1]))
            return 2;
        i++;
    }
    if (!cfg.keys_path) {
        fprintf(stderr, "medley api: --api-keys FILE is required (see --help)\n");
        return 2;
    }
    md_err e = {0};
    md_metrics *reg = metrics_addr ? md_metrics_new() : NULL;
    md_metrics_http *mh = NULL;
    if (metrics_addr && (!reg || md_metrics_http_start(metrics_addr, reg, &mh, &e))) {
        fprintf(stderr, "medley api: %s\n", reg ? e.msg : "out of memory");
        md_metrics_free(reg);
        return 2;
    }
    cfg.metrics = reg;
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    int rc = api_serve(&cfg, &g_stop, &g_reload, &e);
    md_metrics_http_stop(mh);
    md_metrics_free(reg);
    if (rc) {
        fprintf(stderr, "medley api: %s\n", e.msg);
        return rc == MD_EINVAL ? 2 : 1;
    }
    return 0;
}
