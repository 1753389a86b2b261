/* cmd_dashboard.c — `medley dashboard`: the web page of dashboard/dash.h over a Redis
 * (docs/operations.md "Dashboard"). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "common/redis.h"
#include "dashboard/dash.h"

static volatile sig_atomic_t g_stop;

static void on_signal(int sig) {
    (void)sig;
    g_stop = 1;
}

static void on_listen(const char *url) {
    printf("medley dashboard: serving %s\n", url);
    fflush(stdout);
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: medley dashboard [--listen ADDR:PORT] [--redis URL] [options]\n"
            "\n"
            "Serve a web page of the batches (progress, ETA, failures, cost), the fleet\n"
            "(workers, devices, heartbeats, what each serves; stale ones marked), the plan\n"
            "(replicas on GPUs, predicted vs measured tokens/s) and the DLQ, updated live.\n"
            "Read-only unless an admin token enables cancelling batches and draining workers.\n"
            "\n"
            "  --listen ADDR:PORT     where to listen (default 127.0.0.1:8080; [::1]:8080 for\n"
            "                         IPv6; port 0 picks a free one). No TLS: keep it on\n"
            "                         localhost or behind a TLS proxy\n"
            "  --redis URL            redis://[user:pass@]host:port/db, unix:///path or\n"
            "                         sentinel://host:26379,host:26379/master[/db]\n"
            "                         (default $MEDLEY_REDIS, else redis://127.0.0.1:6379/0)\n"
            "  --operator-redis URL   the actions' writes go through this connection: the\n"
            "                         medley-operator Redis user, while --redis is the\n"
            "                         read-only medley-dashboard (default $MEDLEY_OPERATOR_REDIS,\n"
            "                         else the --redis connection)\n"
            "  --prefix P             key prefix (default medley:)\n"
            "  --admin-token-file F   enable actions for requests carrying the token in F\n"
            "                         (\"Authorization: Bearer <token>\"; at least %d bytes);\n"
            "                         or the token itself in $MEDLEY_DASHBOARD_TOKEN\n"
            "  --read-token-file F    reading (every /api document) needs the token in F or\n"
            "                         the admin token (at least %d bytes); or the token\n"
            "                         itself in $MEDLEY_DASHBOARD_READ_TOKEN. Default: none\n"
            "  --dlq-lines            show the start of dead-lettered lines (their prompts);\n"
            "                         default: their length only\n"
            "  --refresh-ms MS        how often the page updates (default 1000)\n"
            "  --heartbeat-ms MS      the workers' --heartbeat-ms; a worker whose last heartbeat\n"
            "                         is older than 3 of them is marked stale (default 5000)\n"
            "  --limit N              batches listed, newest first (default 50, at most 500)\n",
            DASH_TOKEN_MIN, DASH_TOKEN_MIN);
}

/* A flag's integer value in [lo, hi], or -1 after saying what is wrong. */
static long int_flag(const char *flag, const char *v, long lo, long hi) {
    char *end;
    long x = v ? strtol(v, &end, 10) : 0;
    if (!v || !*v || *end || x < lo || x > hi) {
        fprintf(stderr, "medley dashboard: %s needs an integer in %ld..%ld\n", flag, lo, hi);
        return -1;
    }
    return x;
}

int cmd_dashboard(int argc, char **argv) {
    dash_config cfg = {.listen = "127.0.0.1:8080",
                       .prefix = "medley:",
                       .refresh_ms = 1000,
                       .heartbeat_ms = 5000,
                       .batches_limit = 50,
                       .on_listen = on_listen};
    const char *token_file = NULL, *read_file = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        long x = 0;
        if (!strcmp(a, "--dlq-lines")) {
            cfg.dlq_lines = 1;
            continue;
        }
        if (!v) {
            fprintf(stderr, "medley dashboard: %s: unknown option or missing value (see --help)\n",
                    a);
            return 2;
        }
        if (!strcmp(a, "--listen"))
            cfg.listen = v;
        else if (!strcmp(a, "--redis"))
            cfg.redis_url = v;
        else if (!strcmp(a, "--operator-redis"))
            cfg.operator_url = v;
        else if (!strcmp(a, "--prefix"))
            cfg.prefix = v;
        else if (!strcmp(a, "--admin-token-file"))
            token_file = v;
        else if (!strcmp(a, "--read-token-file"))
            read_file = v;
        else if (!strcmp(a, "--refresh-ms") && (x = int_flag(a, v, 100, 3600000)) > 0)
            cfg.refresh_ms = (int)x;
        else if (!strcmp(a, "--heartbeat-ms") && (x = int_flag(a, v, 100, 3600000)) > 0)
            cfg.heartbeat_ms = (int)x;
        else if (!strcmp(a, "--limit") && (x = int_flag(a, v, 1, 500)) > 0)
            cfg.batches_limit = (int)x;
        else if (x < 0)
            return 2;
        else {
            fprintf(stderr, "medley dashboard: unknown option %s (see --help)\n", a);
            return 2;
        }
        i++;
    }
    const char *openv = getenv("MEDLEY_OPERATOR_REDIS");
    if (!cfg.operator_url && openv && *openv)
        cfg.operator_url = openv;
    md_err e = {0};
    static char token[512];
    const char *env = getenv("MEDLEY_DASHBOARD_TOKEN");
    if (token_file) {
        if (dash_token_read(token_file, token, sizeof token, &e)) {
            fprintf(stderr, "medley dashboard: %s\n", e.msg);
            return 2;
        }
        cfg.admin_token = token;
    } else if (env && *env) {
        if (strlen(env) < DASH_TOKEN_MIN || strlen(env) >= sizeof token) {
            fprintf(stderr, "medley dashboard: $MEDLEY_DASHBOARD_TOKEN must hold %d..%zu bytes\n",
                    DASH_TOKEN_MIN, sizeof token - 1);
            return 2;
        }
        snprintf(token, sizeof token, "%s", env);
        cfg.admin_token = token;
    }
    static char read_token[512];
    const char *renv = getenv("MEDLEY_DASHBOARD_READ_TOKEN");
    if (read_file) {
        if (dash_token_read(read_file, read_token, sizeof read_token, &e)) {
            fprintf(stderr, "medley dashboard: --read-token-file: %s\n", e.msg);
            return 2;
        }
        cfg.read_token = read_token;
    } else if (renv && *renv) {
        if (strlen(renv) < DASH_TOKEN_MIN || strlen(renv) >= sizeof read_token) {
            fprintf(stderr,
                    "medley dashboard: $MEDLEY_DASHBOARD_READ_TOKEN must hold %d..%zu bytes\n",
                    DASH_TOKEN_MIN, sizeof read_token - 1);
            return 2;
        }
        snprintf(read_token, sizeof read_token, "%s", renv);
        cfg.read_token = read_token;
    }
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    int rc = dash_serve(&cfg, &g_stop, &e);
    if (rc) {
        fprintf(stderr, "medley dashboard: %s\n", e.msg);
        return rc == MD_EINVAL ? 2 : 1; /* a bad --listen is a usage error */
    }
    return 0;
}
