/* cmd_worker.c — `medley worker`: serve models from their Redis streams (worker/worker.h).
 * JSON-line logs by default (a daemon's logs go to a collector); SIGTERM/SIGINT stop it
 * gracefully: it stops reading, finishes or hands back what it runs, and exits 0. Without
 * --model it follows the scheduler's plan (--follow-plan). With --devices D0,...,Dn-1 (n > 1)
 * it supervises n one-device workers <id>.0 ... <id>.n-1, each this same command run with
 * --device Di (worker/supervise.h). With --stages the model runs as pipeline stages, some
 * possibly in `medley stage` processes elsewhere (docs/protocol.md §6, "Sharded replicas"). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/commands.h"
#include "common/log.h"
#include "common/util.h"
#include "engine/shard/stage_auth.h"
#include "kernels/backend.h"
#include "scheduler/sched.h"
#include "worker/supervise.h"
#include "worker/worker.h"

static volatile sig_atomic_t g_stop = 0;
static char g_device[32]; /* the resolved --device, referenced by the worker's config */
static char g_devs[SV_MAX_CHILDREN][SV_DEVICE_MAX]; /* the --devices list */
static char g_metrics[SV_MAX_CHILDREN][300];        /* --metrics of each --devices child */

static void on_signal(int sig) {
    (void)sig;
    g_stop = 1;
}

static void on_stop_signals(void) {
    struct sigaction sa = {0};
    sa.sa_handler = on_signal; /* no SA_RESTART: the supervisor's poll must wake up */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: medley worker [--model M]... [options]\n"
            "       medley worker [--follow-plan] [options]\n"
            "\n"
            "Serve models from Redis: read requests of the named models, run them, write the\n"
            "output lines. Without --model the worker follows the scheduler's plan: it serves\n"
            "the replicas whose stages name its device \"{<id>}/0\" and switches when the plan\n"
            "changes. Stops gracefully on SIGTERM or Ctrl-C.\n"
            "\n"
            "  --model M              model to serve (repeatable): 'echo' or a registered model\n"
            "  --follow-plan          serve what the plan (<prefix>plan) gives this worker (the\n"
            "                         default without --model); give --id so plans can name it\n"
            "  --plan-check-ms MS     how often to look at <prefix>plan:version (default 1000)\n"
            "  --redis URL            redis://[user:pass@]host:port/db, unix:///path or\n"
            "                         sentinel://host:26379,host:26379/master[/db] (Sentinel)\n"
            "                         (default $MEDLEY_REDIS, else redis://127.0.0.1:6379/0)\n"
            "  --prefix P             key prefix (default medley:)\n"
            "  --id NAME              consumer name (default host-pid-random; with --devices\n"
            "                         the children are NAME.0, NAME.1, ...)\n"
            "  --max-seqs N           concurrent requests per model (echo 256, engine 64 on cpu,\n"
            "                         256 on cuda)\n"
            "  --online-reserve N     slots per model batch lines leave free for online requests\n"
            "                         (medley api's /v1/chat/completions) for 5 minutes after\n"
            "                         the last one (default 1, at most --max-seqs - 1)\n"
            "  --device D             engine device: auto (default: cuda:0 when a GPU is\n"
            "                         usable, else cpu), cpu, cpu:N, cuda:K\n"
            "  --devices D,D...       one worker per device, supervised by this process: child\n"
            "                         i runs on Di as worker <id>.i (its own heartbeat, plan\n"
            "                         device \"{<id>.i}/0\"), restarted if it dies; every\n"
            "                         device is checked first; one entry is --device\n"
            "  --device-type T        device type for heartbeats and output lines, as the GPU\n"
            "                         catalog names it (H200, L4; default cpu or cuda)\n"
            "  --threads N            engine CPU threads (default all cores)\n"
            "  --kv-type T            engine KV cache: f16 (default) or f32\n"
            "  --bf16-weights M       GPU: BF16 copies of quantized weights for batched\n"
            "                         steps: auto (default), on, off\n"
            "  --embed-precision P    embedding models' products: f32 (default) or bf16\n"
            "                         (AVX512-BF16 CPUs, about 1.5x; docs/embeddings.md)\n"
            "  --chat-template NAME   chat template for /v1/chat/completions instead of the\n"
            "                         model's: chatml, hermes (ChatML + <tool_call> tools),\n"
            "                         llama3, llama3-json (+ JSON tool calls), llama2,\n"
            "                         mistral, gemma, or none (raw prompts only); needed\n"
            "                         when medley does not know\n"
            "                         the model's template\n"
            "  --stages SPEC          run the --model as pipeline stages, a comma list of\n"
            "                         [tcp://HOST:PORT/]DEVICE:LO-HI (layers LO to HI), e.g.\n"
            "                         cpu:0-11,tcp://10.0.0.2:7701/cpu:12-29 (remote stages\n"
            "                         from `medley stage --listen`). The model reads nothing\n"
            "                         until every stage answers; when one fails, what it ran\n"
            "                         is handed back and the replica formed again\n"
            "  --tp N                 tensor-parallel ranks of each local stage\n"
            "  --mem-cap SIZE         refuse a local stage whose weights + KV cache exceed SIZE\n"
            "                         (e.g. 512M; also passed to the stage servers below)\n"
            "  --stage-listen H:P     under a plan, where this worker's stage servers listen\n"
            "                         for the head of a pipeline replica naming its device in a\n"
            "                         later stage (default 127.0.0.1:0: a free port; 0.0.0.0:P\n"
            "                         advertises the host name; a fixed port P serves the\n"
            "                         first stage, P+1 the next; with --devices keep port 0)\n"
            "  --stage-secret-file F  the secret shared with the replica's stages and head\n"
            "                         (docs/sharding.md \"Authentication\"; default\n"
            "                         $MEDLEY_STAGE_SECRET_FILE): needed by a remote --stages\n"
            "                         and by plan pipeline replicas\n"
            "  --echo-delay-ms MS     echo model: delay per answer ($MEDLEY_ECHO_DELAY_MS)\n"
            "  --echo-ctx N           echo model: context length in bytes (default 8192)\n"
            "  --visibility-ms MS     take over entries idle this long (default 60000)\n"
            "  --max-attempts N       deliveries before the DLQ (default 3)\n"
            "  --block-ms MS          XREADGROUP BLOCK when idle (default 1000)\n"
            "  --heartbeat-ms MS      heartbeat period (default 5000)\n"
            "  --grace-ms MS          on SIGTERM, time to finish running requests (default 30000)\n"
            "  --step-timeout-ms MS   a device step running longer means a hung device: hand back\n"
            "                         every request held and exit 1 for a restart (default:\n"
            "                         120000 on a CUDA device, none on the CPU; 0: none)\n"
            "  --load-timeout-ms MS   the same for loading a model (default: 600000 on a CUDA\n"
            "                         device, none on the CPU; 0: none); the heartbeat and\n"
            "                         leases are kept alive while a model loads\n"
            "  --max-line-bytes N     largest input line accepted (default 1048576)\n"
            "  --usd-per-hour X       cost of this worker's devices, for each line's cost share\n"
            "                         (with --devices, split evenly between the children;\n"
            "                         default: the GPU catalog's price of --device-type)\n"
            "  --connect-timeout-ms MS, --command-timeout-ms MS   Redis timeouts (2000, 10000)\n"
            "  --metrics ADDR:PORT    serve Prometheus metrics at http://ADDR:PORT/metrics\n"
            "                         (docs/operations.md, Metrics; port 0: a free one; with\n"
            "                         --devices child i serves on PORT+i)\n"
            "  --log-text             human-readable logs instead of JSON lines\n");
}

/* Integer flag value in [lo, hi]; exits through the caller's usage error on bad input. */
static int int_arg(const char *flag, const char *v, long lo, long hi, long *out) {
    char *end;
    long x = v ? strtol(v, &end, 10) : 0;
    if (!v || *end || x < lo || x > hi) {
        fprintf(stderr, "medley worker: %s needs an integer in %ld..%ld\n", flag, lo, hi);
        return -1;
    }
    *out = x;
    return 0;
}

/* --metrics HOST:PORT of child i of --devices: PORT + i (port 0 stays 0: each a free one).
 * Returns 0, or -1 when addr has no port or PORT + i is past 65535. */
static int child_metrics(const char *addr, int i, char *out, size_t cap) {
    const char *colon = strrchr(addr, ':');
    char *end;
    long port = colon ? strtol(colon + 1, &end, 10) : -1;
    if (!colon || !colon[1] || *end || port < 0 || port + i > 65535)
        return -1;
    snprintf(out, cap, "%.*s:%ld", (int)(colon - addr), addr, port ? port + i : 0);
    return 0;
}

/* `--devices` with n > 1 entries (in g_devs): check every device, then run n children, each
 * this command's argv without the flags marked in skip (--devices, --id, --usd-per-hour,
 * --metrics) plus --device Di --id <id>.i --usd-per-hour X/n [--metrics HOST:PORT+i].
 * Returns the exit status. */
static int run_devices(int argc, char **argv, const unsigned char *skip, const wk_config *cfg,
                       int n, int log_json) {
    /* the worker keeps 159 bytes of its id: longer ones would make the children's <id>.<i>
     * names collide */
    if (cfg->id && strlen(cfg->id) > 150) {
        fprintf(stderr,
                "medley worker: --id is %zu bytes; with --devices at most 150 (the children are "
                "<id>.<i>)\n",
                strlen(cfg->id));
        return 2;
    }
    md_err e = {0};
    if (sv_devices_check(g_devs, n, &e)) {
        MD_ERROR("worker", "%s; nothing started", e.msg);
        return 1;
    }
    char id[160];
    if (cfg->id && *cfg->id) {
        snprintf(id, sizeof id, "%s", cfg->id);
    } else { /* the worker's default id, made once here so the children share its stem */
        char host[128] = "", hex[9];
        gethostname(host, sizeof host - 1);
        md_random_hex(hex, sizeof hex, 8);
        snprintf(id, sizeof id, "%s-%d-%s", host, (int)getpid(), hex);
    }
    static char names[SV_MAX_CHILDREN][176];
    char usd[40];
    snprintf(usd, sizeof usd, "%.17g", cfg->usd_per_hour / n);
    int per = argc + 12; /* "medley", argv minus skipped, 8 added, NULL */
    char **av = calloc((size_t)n * (size_t)per, sizeof *av);
    if (!av) {
        MD_ERROR("worker", "out of memory");
        return 1;
    }
    sv_child kids[SV_MAX_CHILDREN];
    for (int i = 0; i < n; i++) {
        char **a = av + (size_t)i * (size_t)per;
        int k = 0;
        snprintf(names[i], sizeof names[i], "%s.%d", id, i);
        a[k++] = "medley";
        for (int j = 0; j < argc; j++) /* argv[0] is "worker" */
            if (!skip[j])
                a[k++] = argv[j];
        a[k++] = "--device";
        a[k++] = g_devs[i];
        a[k++] = "--id";
        a[k++] = names[i];
        a[k++] = "--usd-per-hour"; /* always: without it a child prices from the catalog */
        a[k++] = usd;
        if (cfg->metrics_addr) {
            if (child_metrics(cfg->metrics_addr, i, g_metrics[i], sizeof g_metrics[i])) {
                MD_ERROR("worker", "--metrics %s: want HOST:PORT with PORT + %d <= 65535",
                         cfg->metrics_addr, n - 1);
                free(av);
                return 2;
            }
            a[k++] = "--metrics";
            a[k++] = g_metrics[i];
        }
        a[k] = NULL;
        kids[i] = (sv_child){.name = names[i], .what = g_devs[i], .argv = a};
    }
    sv_config sc;
    sv_config_default(&sc);
    sc.children = kids;
    sc.n = n;
    sc.json = log_json;
    sc.drained_code = WK_EXIT_DRAINED;
    if (access(sc.exe, X_OK)) {
        MD_ERROR("worker", "--devices: cannot run %s to start the per-device workers", sc.exe);
        free(av);
        return 1;
    }
    on_stop_signals();
    char list[SV_MAX_CHILDREN * (SV_DEVICE_MAX + 1)];
    size_t used = 0;
    for (int i = 0; i < n; i++)
        used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", i ? "," : "", g_devs[i]);
    MD_INFO("worker", "supervising %d workers %s.0..%s.%d, one per device (%s)", n, id, id, n - 1,
            list);
    int rc = sv_run(&sc, &g_stop, &e);
    free(av);
    if (rc == SV_DRAINED) {
        MD_INFO("worker", "every per-device worker was drained: exit %d", WK_EXIT_DRAINED);
        return WK_EXIT_DRAINED;
    }
    if (rc) {
        MD_ERROR("worker", "%s", e.msg);
        return 1;
    }
    MD_INFO("worker", "every per-device worker stopped cleanly");
    return 0;
}

/* What the flags say beyond wk_config. */
typedef struct {
    int log_json;                 /* JSON-line logs (no --log-text) */
    const char *device, *devices; /* --device, --devices as given */
    int usd_given;                /* --usd-per-hour was given (0 included) */
} worker_flags;

/* An integer flag (--max-seqs, --visibility-ms, ...) with its value v into cfg. Returns 0, 1
 * when a is not one of them, or 2 when v is not a valid value (said on stderr). */
static int int_flag(wk_config *cfg, const char *a, const char *v) {
    static const struct {
        const char *flag;
        long lo, hi;
    } ints[] = {{"--max-seqs", 1, 65536},
                {"--threads", 0, 4096},
                {"--echo-delay-ms", 0, 3600000},
                {"--echo-ctx", 1, 1 << 30},
                {"--visibility-ms", 100, 86400000},
                {"--max-attempts", 1, 1000},
                {"--block-ms", 1, 60000},
                {"--heartbeat-ms", 100, 3600000},
                {"--grace-ms", 0, 86400000},
                {"--max-line-bytes", 1024, 1 << 30},
                {"--connect-timeout-ms", 1, 600000},
                {"--command-timeout-ms", 0, 3600000},
                {"--plan-check-ms", 10, 3600000},
                {"--step-timeout-ms", 0, 86400000},
                {"--load-timeout-ms", 0, 86400000},
                {"--tp", 1, 8},
                {"--online-reserve", 0, 65536}};
    int k = -1;
    for (size_t j = 0; j < sizeof ints / sizeof *ints; j++)
        if (!strcmp(a, ints[j].flag))
            k = (int)j;
    if (k < 0)
        return 1;
    long x = 0;
    if (int_arg(a, v, ints[k].lo, ints[k].hi, &x))
        return 2;
    switch (k) {
    case 0: cfg->runner.max_seqs = (int)x; break;
    case 1: cfg->runner.n_threads = (int)x; break;
    case 2: cfg->runner.echo_delay_ms = (int)x; break;
    case 3: cfg->runner.echo_ctx = (int)x; break;
    case 4: cfg->visibility_ms = (int)x; break;
    case 5: cfg->max_attempts = (int)x; break;
    case 6: cfg->block_ms = (int)x; break;
    case 7: cfg->heartbeat_ms = (int)x; break;
    case 8: cfg->grace_ms = (int)x; break;
    case 9: cfg->limits.max_line_bytes = (size_t)x; break;
    case 10: cfg->connect_timeout_ms = (int)x; break;
    case 11: cfg->command_timeout_ms = (int)x; break;
    case 12: cfg->plan_check_ms = (int)x; break;
    case 13: cfg->step_timeout_ms = (int)x; break;
    case 14: cfg->load_timeout_ms = (int)x; break;
    case 15: cfg->runner.tp = (int)x; break;
    case 16: cfg->online_reserve = (int)x; break;
    }
    return 0;
}

/* argv into cfg and fl; skip (argc entries, zeroed) gets the entries that children started
 * for --devices do not get. Returns -1 to go on, else the exit status: 0 after --help, 2 on
 * a usage error (said on stderr). */
/* --stage-secret-file F: read now, so a bad file stops the worker at start (-1, said on
 * stderr); the head's links and the stage servers it starts read it through
 * $MEDLEY_STAGE_SECRET_FILE, which this sets. */
static int stage_secret_flag(const char *path) {
    md_stage_secret sec;
    md_err e = {0};
    int bad = md_stage_secret_load(path, &sec, &e);
    md_stage_secret_clear(&sec);
    if (bad) {
        fprintf(stderr, "medley worker: --stage-secret-file: %s\n", e.msg);
        return -1;
    }
    setenv(MD_STAGE_SECRET_ENV, path, 1);
    return 0;
}

static int parse_flags(int argc, char **argv, unsigned char *skip, wk_config *cfg,
                       worker_flags *fl) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int used = 1; /* consumes v */
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--log-text")) {
            fl->log_json = 0;
            used = 0;
        } else if (!strcmp(a, "--follow-plan")) {
            cfg->follow_plan = 1;
            used = 0;
        } else if (!v) {
            fprintf(stderr, "medley worker: %s needs a value (or is unknown)\n", a);
            usage(stderr);
            return 2;
        } else if (!strcmp(a, "--model") || !strcmp(a, "-m")) {
            if (cfg->n_models == WK_MAX_MODELS) {
                fprintf(stderr, "medley worker: at most %d models\n", WK_MAX_MODELS);
                return 2;
            }
            cfg->models[cfg->n_models++] = v;
        } else if (!strcmp(a, "--redis")) {
            cfg->redis_url = v;
        } else if (!strcmp(a, "--prefix")) {
            cfg->prefix = v;
        } else if (!strcmp(a, "--id")) {
            cfg->id = v;
            skip[i] = skip[i + 1] = 1;
        } else if (!strcmp(a, "--device")) {
            if (strchr(v, ',')) {
                fprintf(stderr,
                        "medley worker: --device %s: --device names one device; give "
                        "several with --devices D,D,...\n",
                        v);
                return 2;
            }
            fl->device = v;
        } else if (!strcmp(a, "--devices")) {
            fl->devices = v;
            skip[i] = skip[i + 1] = 1;
        } else if (!strcmp(a, "--kv-type")) {
            cfg->runner.kv_type = v;
        } else if (!strcmp(a, "--bf16-weights")) {
            cfg->runner.bf16_weights = v;
        } else if (!strcmp(a, "--embed-precision")) {
            cfg->runner.embed_precision = v;
        } else if (!strcmp(a, "--chat-template")) {
            cfg->runner.chat_template = v;
        } else if (!strcmp(a, "--device-type")) {
            cfg->device_type = v;
        } else if (!strcmp(a, "--stages")) {
            cfg->runner.stages = v;
        } else if (!strcmp(a, "--stage-listen")) {
            cfg->stage_listen = v;
        } else if (!strcmp(a, "--stage-secret-file")) {
            if (stage_secret_flag(v))
                return 2;
        } else if (!strcmp(a, "--metrics")) {
            cfg->metrics_addr = v;
            skip[i] = skip[i + 1] = 1;
        } else if (!strcmp(a, "--mem-cap")) {
            long long cap = md_parse_size(v);
            if (cap <= 0) {
                fprintf(stderr,
                        "medley worker: --mem-cap must be a size such as 512M, got \"%s\"\n", v);
                return 2;
            }
            cfg->runner.mem_cap = (size_t)cap;
        } else if (!strcmp(a, "--usd-per-hour")) {
            char *end;
            cfg->usd_per_hour = strtod(v, &end);
            if (*end || !(cfg->usd_per_hour >= 0)) {
                fprintf(stderr, "medley worker: --usd-per-hour needs a number >= 0\n");
                return 2;
            }
            fl->usd_given = 1;
            skip[i] = skip[i + 1] = 1;
        } else {
            int rc = int_flag(cfg, a, v);
            if (rc == 1) {
                fprintf(stderr, "medley worker: unknown option %s\n", a);
                usage(stderr);
                return 2;
            }
            if (rc)
                return rc;
        }
        i += used;
    }
    if (cfg->n_models > 0 && cfg->follow_plan) {
        fprintf(stderr, "medley worker: --model and --follow-plan exclude each other\n");
        return 2;
    }
    if (cfg->runner.stages && (cfg->n_models != 1 || cfg->follow_plan || fl->devices)) {
        fprintf(stderr, "medley worker: --stages runs one --model as one replica (not with "
                        "--follow-plan, where the plan says the stages, nor with --devices)\n");
        return 2;
    }
    if (fl->device && fl->devices) {
        fprintf(stderr, "medley worker: --device and --devices exclude each other (--devices D "
                        "with one entry is --device D)\n");
        return 2;
    }
    return -1;
}

/* Without --usd-per-hour, the price of n devices of --device-type from the GPU catalog
 * (scheduler/catalog/gpus.json, or $MEDLEY_SCHED_CATALOG): so a fleet whose manifests name
 * only device types still reports its cost (docs/operations.md, "Metrics"). A type the
 * catalog does not know leaves 0, said once. */
static void default_price(wk_config *cfg, const worker_flags *fl, int n) {
    if (fl->usd_given || !cfg->device_type)
        return;
    sched_catalog cat = {0};
    md_err e = {0};
    if (sched_catalog_load(&cat, NULL, &e)) {
        MD_WARN("worker", "no --usd-per-hour and the GPU catalog does not load (%s): cost 0",
                e.msg);
        return;
    }
    int t = sched_catalog_find(&cat, cfg->device_type);
    if (t < 0) {
        MD_WARN("worker",
                "no --usd-per-hour and the GPU catalog has no type '%s': cost 0 (give "
                "--usd-per-hour)",
                cfg->device_type);
    } else {
        cfg->usd_per_hour = cat.gpus[t].usd_per_hour * n;
        MD_INFO("worker",
                "no --usd-per-hour: %.4g USD/h, the catalog's price of %s x %d device(s) "
                "(--usd-per-hour overrides it)",
                cfg->usd_per_hour, cat.gpus[t].name, n);
    }
    sched_catalog_free(&cat);
}

/* The device, before any Redis work: "auto" (the default) picks cuda:0 or cpu and says
 * why; a named GPU that is not usable is an error here. Workers serving only the echo
 * model have no device. Returns 0, or 1 (said in the log). */
static int resolve_device(wk_config *cfg) {
    int echo_only = cfg->n_models > 0;
    for (int m = 0; m < cfg->n_models; m++)
        if (strcmp(cfg->models[m], "echo"))
            echo_only = 0;
    md_err de = {0};
    if (!echo_only && md_backend_resolve(cfg->runner.device ? cfg->runner.device : "auto", g_device,
                                         sizeof g_device, &de)) {
        MD_ERROR("worker", "%s", de.msg);
        return 1;
    }
    if (!echo_only)
        cfg->runner.device = g_device;
    return 0;
}

/* cmd_worker's body; skip (argc entries, zeroed) marks the argv entries that children
 * started for --devices do not get. */
static int worker_main(int argc, char **argv, unsigned char *skip) {
    wk_config cfg;
    wk_config_default(&cfg);
    worker_flags fl = {.log_json = 1};
    const char *env_delay = getenv("MEDLEY_ECHO_DELAY_MS");
    if (env_delay && *env_delay)
        cfg.runner.echo_delay_ms = atoi(env_delay);
    int rc = parse_flags(argc, argv, skip, &cfg, &fl);
    if (rc >= 0)
        return rc;
    md_log_set_json(fl.log_json);
    if (fl.devices) {
        md_err se = {0};
        int n = sv_devices_split(fl.devices, g_devs, SV_MAX_CHILDREN, &se);
        if (n < 0) {
            fprintf(stderr, "medley worker: %s\n", se.msg);
            return 2;
        }
        default_price(&cfg, &fl, n);
        if (n > 1)
            return run_devices(argc, argv, skip, &cfg, n, fl.log_json);
        fl.device = g_devs[0];
    }
    cfg.runner.device = fl.device;
    if (cfg.n_models == 0)
        cfg.follow_plan = 1;
    if (!fl.devices)
        default_price(&cfg, &fl, 1);
    if (resolve_device(&cfg))
        return 1;
    on_stop_signals();
    md_err e = {0};
    rc = wk_run(&cfg, &g_stop, &e);
    if (rc == WK_DRAINED)
        return WK_EXIT_DRAINED; /* final: the unit does not restart it */
    if (rc) {
        MD_ERROR("worker", "%s", e.msg);
        return 1;
    }
    return 0;
}

int cmd_worker(int argc, char **argv) {
    unsigned char *skip = calloc((size_t)argc + 1, 1);
    if (!skip) {
        fprintf(stderr, "medley worker: out of memory\n");
        return 1;
    }
    int rc = worker_main(argc, argv, skip);
    free(skip);
    return rc;
}
