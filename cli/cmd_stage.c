/* cmd_stage.c — `medley stage`: serve one pipeline stage of a sharded replica to a head over
 * TCP (engine/shard/stage_server.h). The head names this process in its --stages spec as
 * tcp://HOST:PORT/DEVICE:LO-HI; what to load comes with its HELLO, signed with the secret of
 * --secret-file and naming one of the --model flags. SIGTERM/SIGINT stop it: the step running
 * finishes, the connection closes, the stage is unloaded, exit 0. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "common/log.h"
#include "common/util.h"
#include "engine/shard/stage_auth.h"
#include "engine/shard/stage_server.h"
#include "kernels/backend.h"

#define MAX_MODELS 64

static volatile sig_atomic_t g_stop = 0;

static void on_signal(int sig) {
    (void)sig;
    g_stop = 1;
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: medley stage --listen HOST:PORT --secret-file FILE --model M [options]\n"
            "\n"
            "Serve one pipeline stage to a head (medley generate --stages\n"
            "tcp://HOST:PORT/DEVICE:LO-HI,...): the head says which model, layers and sizes;\n"
            "this process loads them and runs the head's micro-batches through them. One head\n"
            "at a time; the loaded layers stay when a head leaves, for the next one that asks\n"
            "for the same. Stops on SIGTERM or Ctrl-C.\n"
            "\n"
            "  --listen HOST:PORT     address to listen on (HOST * = every IPv4 address, [::]\n"
            "                         every address; PORT 0 = any free port, printed in the\n"
            "                         log)\n"
            "  --secret-file FILE     the replica's shared secret (16-1024 bytes; default\n"
            "                         $MEDLEY_STAGE_SECRET_FILE): a head must sign its HELLO\n"
            "                         with it, or is refused before anything is opened\n"
            "  --model M              a model heads may ask for: a registry name, synthetic:...,\n"
            "                         or a path, as the heads name it (-m); repeat for several.\n"
            "                         Any other name is refused, whatever it names\n"
            "  --device D             device of the stage: auto (cuda:0 if a GPU is usable,\n"
            "                         else cpu), cpu, cpu:N, cuda:K (default: the device the\n"
            "                         head's --stages names for this stage)\n"
            "  --threads N            CPU threads (default every core)\n"
            "  --mem-cap SIZE         refuse a stage whose weights + KV cache exceed SIZE (k, M,\n"
            "                         G; default none; the head's cap, if smaller, holds)\n"
            "  --handshake-ms MS      a new connection's signed HELLO must arrive within\n"
            "                         (default 10000)\n"
            "  --io-timeout-ms MS     a frame, once begun, must arrive whole within, the head\n"
            "                         take each result, and send something at least this\n"
            "                         often (heads PING at a third of it; default 60000)\n"
            "  --max-pending N        connections in their handshake at once; a new one\n"
            "                         pushes out the oldest (default 256)\n"
            "  --log-json             one JSON object per log line\n");
}

/* An integer flag value in [lo, hi]; -1 (said on stderr) otherwise. */
static int int_arg(const char *flag, const char *v, long lo, long hi, int *out) {
    char *end;
    long x = strtol(v, &end, 10);
    if (!*v || *end || x < lo || x > hi) {
        fprintf(stderr, "medley stage: %s needs an integer in %ld..%ld\n", flag, lo, hi);
        return -1;
    }
    *out = (int)x;
    return 0;
}

/* "HOST:PORT" or "[V6]:PORT" into host (NUL-terminated) and port; -1 when malformed. */
static int split_listen(const char *s, char *host, size_t hostsz, int *port) {
    const char *colon;
    size_t hl;
    if (s[0] == '[') {
        const char *close = strchr(s, ']');
        if (!close || close[1] != ':')
            return -1;
        hl = (size_t)(close - s - 1);
        s++;
        colon = close + 1;
    } else {
        colon = strrchr(s, ':');
        if (!colon)
            return -1;
        hl = (size_t)(colon - s);
    }
    if (hl == 0 || hl >= hostsz)
        return -1;
    memcpy(host, s, hl);
    host[hl] = '\0';
    char *end;
    long p = strtol(colon + 1, &end, 10);
    if (!colon[1] || *end || p < 0 || p > 65535)
        return -1;
    *port = (int)p;
    return 0;
}

int cmd_stage(int argc, char **argv) {
    const char *listen = NULL, *device = NULL, *secret_file = NULL;
    const char *models[MAX_MODELS];
    md_stage_server_opts o = {.models = models};
    int log_json = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--log-json")) {
            log_json = 1;
            continue;
        }
        if (!v) {
            fprintf(stderr, "medley stage: %s needs a value (or is unknown)\n", a);
            usage(stderr);
            return 2;
        }
        i++;
        if (!strcmp(a, "--listen")) {
            listen = v;
        } else if (!strcmp(a, "--device")) {
            device = v;
        } else if (!strcmp(a, "--secret-file")) {
            secret_file = v;
        } else if (!strcmp(a, "--model")) {
            if (o.n_models == MAX_MODELS || !*v) {
                fprintf(stderr, "medley stage: --model needs a name, at most %d of them\n",
                        MAX_MODELS);
                return 2;
            }
            models[o.n_models++] = v;
        } else if (!strcmp(a, "--max-pending")) {
            if (int_arg(a, v, 1, 65536, &o.max_pending))
                return 2;
        } else if (!strcmp(a, "--threads")) {
            if (int_arg(a, v, 0, 4096, &o.n_threads))
                return 2;
        } else if (!strcmp(a, "--handshake-ms")) {
            if (int_arg(a, v, 1, 3600000, &o.handshake_ms))
                return 2;
        } else if (!strcmp(a, "--io-timeout-ms")) {
            if (int_arg(a, v, 1, 86400000, &o.io_ms))
                return 2;
        } else if (!strcmp(a, "--mem-cap")) {
            long long cap = md_parse_size(v);
            if (cap <= 0) {
                fprintf(stderr, "medley stage: --mem-cap needs a size such as 512M or 20G\n");
                return 2;
            }
            o.mem_cap = (size_t)cap;
        } else {
            fprintf(stderr, "medley stage: unknown option %s\n", a);
            usage(stderr);
            return 2;
        }
    }
    char host[256];
    int port;
    if (!listen) {
        fprintf(stderr, "medley stage: --listen HOST:PORT is required\n");
        usage(stderr);
        return 2;
    }
    if (split_listen(listen, host, sizeof host, &port)) {
        fprintf(stderr, "medley stage: --listen %s: expected HOST:PORT or [IPV6]:PORT\n", listen);
        return 2;
    }
    if (o.n_models == 0) {
        fprintf(stderr, "medley stage: --model M is required (the models heads may ask for)\n");
        return 2;
    }
    md_log_set_json(log_json);
    md_err e = {0};
    static md_stage_secret secret;
    if (md_stage_secret_from(secret_file, "medley stage", &secret, &e)) {
        fprintf(stderr, "medley stage: %s\n", e.msg);
        return 2;
    }
    o.secret = &secret;
    char dev[64];
    if (device) { /* a device that cannot be used is an error now, not at the first head */
        md_device_id id;
        if (md_backend_resolve(device, dev, sizeof dev, &e)) {
            MD_ERROR("stage", "%s", e.msg);
            return 1;
        }
        if (md_device_parse(dev, &id, &e)) {
            fprintf(stderr, "medley stage: --device %s: %s\n", device, e.msg);
            return 2;
        }
        o.device = dev;
    }
    struct sigaction sa = {0};
    sa.sa_handler = on_signal; /* no SA_RESTART: the server's poll must wake up */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    int rc = md_stage_serve(host, port, &o, &g_stop, &e);
    md_stage_secret_clear(&secret);
    if (rc) {
        MD_ERROR("stage", "%s", e.msg);
        return 1;
    }
    return 0;
}
