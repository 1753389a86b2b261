/* cmd_run.c — `medley run in.jsonl -o out.jsonl`: the embedded default (docs/design.md §7). Starts
 * a private redis-server on a unix socket in a temp dir (unless --redis is given), runs a
 * worker in a thread of this process, submits the file as a batch, shows progress on stderr,
 * writes the output, and stops everything it started, also on Ctrl-C. Same code path as a
 * fleet: the worker and the client speak the queue protocol through Redis. */
#define _GNU_SOURCE /* mkdtemp, prctl */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli/commands.h"
#include "common/log.h"
#include "common/redis.h"
#include "common/util.h"
#include "kernels/backend.h"
#include "queue/client.h"
#include "worker/worker.h"

static volatile sig_atomic_t g_interrupted = 0;
static volatile sig_atomic_t g_worker_stop = 0;
static void on_signal(int sig) {
    g_interrupted = 1;
}

typedef struct {
    wk_config cfg;
    int rc;
    int done;
    md_err e;
} worker_thread;

static void *run_worker(void *arg) {
    worker_thread *t = arg;
    t->rc = wk_run(&t->cfg, &g_worker_stop, &t->e);
    __atomic_store_n(&t->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* redis-server from $MEDLEY_REDIS_SERVER or PATH. */
static int find_redis_server(char *out, size_t n) {
    const char *env = getenv("MEDLEY_REDIS_SERVER");
    if (env && *env) {
        snprintf(out, n, "%s", env);
        return access(out, X_OK);
    }
    const char *path = getenv("PATH");
    if (!path)
        path = "/usr/local/bin:/usr/bin:/bin";
    while (*path) {
        const char *c = strchr(path, ':');
        size_t len = c ? (size_t)(c - path) : strlen(path);
        snprintf(out, n, "%.*s/redis-server", (int)len, path);
        if (len && access(out, X_OK) == 0)
            return 0;
        path += len + (c ? 1 : 0);
    }
    return -1;
}

/* Start redis-server on dir/redis.sock; wait until it answers PING. */
static int start_redis(const char *dir, pid_t *pid, char *url, size_t urlsz, md_err *e) {
    char bin[4096];
    if (find_redis_server(bin, sizeof bin))
        return md_errf(e, MD_ENOTFOUND,
                       "medley run needs redis-server (apt-get install redis-server, or set "
                       "MEDLEY_REDIS_SERVER, or give --redis URL)");
    char sock[600], logf[600];
    snprintf(sock, sizeof sock, "%s/redis.sock", dir);
    snprintf(logf, sizeof logf, "%s/redis.log", dir);
    pid_t p = fork();
    if (p < 0)
        return md_errf(e, MD_EIO, "fork: %s", strerror(errno));
    if (p == 0) {
        prctl(PR_SET_PDEATHSIG, SIGTERM); /* never outlive medley run, even on SIGKILL */
        execl(bin, bin, "--port", "0", "--unixsocket", sock, "--unixsocketperm", "700", "--dir",
              dir, "--save", "", "--appendonly", "no", "--logfile", logf, (char *)NULL);
        _exit(127);
    }
    *pid = p;
    snprintf(url, urlsz, "unix://%s", sock);
    md_redis_url u;
    md_redis_url_parse(url, &u, e);
    for (int i = 0; i < 250; i++) { /* 5 s */
        md_redis *r = NULL;
        md_err e2 = {0};
        if (md_redis_open(&u, &r, &e2) == 0) {
            redisReply *rep = md_redis_cmd(r, &e2, "PING");
            int ok = rep && rep->type == REDIS_REPLY_STATUS;
            if (rep)
                freeReplyObject(rep);
            md_redis_close(r);
            if (ok)
                return 0;
        }
        int st;
        if (waitpid(p, &st, WNOHANG) == p) {
            *pid = 0;
            return md_errf(e, MD_EIO, "redis-server (%s) exited at startup; see %s", bin, logf);
        }
        sleep_ms(20);
    }
    return md_errf(e, MD_EIO, "redis-server did not answer on %s within 5 s", sock);
}

static void stop_redis(pid_t pid, const char *dir) {
    if (pid > 0) {
        kill(pid, SIGTERM);
        int st;
        for (int i = 0; i < 250 && waitpid(pid, &st, WNOHANG) == 0; i++)
            sleep_ms(20);
        if (waitpid(pid, &st, WNOHANG) == 0) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
        }
    }
    if (dir[0]) {
        char p[700];
        const char *files[] = {"redis.sock", "redis.log", "dump.rdb"};
        for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
            snprintf(p, sizeof p, "%s/%s", dir, files[i]);
            unlink(p);
        }
        rmdir(dir);
    }
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: medley run IN.jsonl -o OUT.jsonl [options]\n"
            "\n"
            "Run an OpenAI Batch JSONL file end to end on this machine: a private redis-server,\n"
            "a worker on the local devices, progress on stderr, the output lines in OUT.\n"
            "\n"
            "  -o, --output FILE    output lines (OpenAI Batch output format)\n"
            "  --errors FILE        failed requests go here instead of into --output\n"
            "  -m, --model M        model: a registered or added name, or the path of a GGUF\n"
            "                       file or HF directory (default: the first line's body.model)\n"
            "  --redis URL          use this Redis instead of a private one\n"
            "  --prefix P           key prefix (default medley:)\n"
            "  --max-seqs N         concurrent requests (echo 256, engine 64 on cpu, 256 on cuda)\n"
            "  --device D           engine device: auto (default: cuda:0 when a GPU is usable,\n"
            "                       else cpu), cpu, cpu:N, cuda:K\n"
            "  --threads N          engine CPU threads (default all cores)\n"
            "  --chat-template T    chat template instead of the model's: chatml, hermes\n"
            "                       (ChatML + <tool_call> tools), llama3, llama3-json (+ JSON\n"
            "                       tool calls), llama2, mistral, gemma, or none (raw prompts)\n"
            "  --embed-precision P  embedding models' products: f32 (default) or bf16\n"
            "  --echo-delay-ms MS   echo model: delay per answer\n"
            "  --usd-per-hour X     device cost, for each line's cost share\n"
            "  --max-line-bytes N   longer input lines are refused unparsed (default 1 MiB)\n"
            "  --quiet              no progress\n");
}

/* Progress on stderr: a bar on a terminal, a plain line every 5 s otherwise. */
static void progress(const q_batch_info *b, int tty, uint64_t t0, uint64_t *last_plain) {
    long long done = b->completed + b->failed;
    double el = (double)(md_mono_ns() - t0) / 1e9;
    double rate = el > 0 ? (double)done / el : 0;
    double eta = rate > 0 ? (double)(b->total - done) / rate : -1;
    if (tty) {
        char bar[31];
        int fill = b->total > 0 ? (int)(30.0 * (double)done / (double)b->total) : 0;
        for (int i = 0; i < 30; i++)
            bar[i] = i < fill ? '#' : '.';
        bar[30] = 0;
        fprintf(stderr, "\r[%s] %lld/%lld (%lld failed) %.1f req/s ETA %.0fs\033[K", bar, done,
                b->total, b->failed, rate, eta < 0 ? 0 : eta);
    } else if (md_mono_ns() - *last_plain > 5000000000ull || q_status_terminal(b->status)) {
        fprintf(stderr, "medley run: %s %lld/%lld done (%lld failed) %.1f req/s\n", b->status, done,
                b->total, b->failed, rate);
        *last_plain = md_mono_ns();
    }
}

typedef struct {
    const char *in, *out, *errp, *redis, *prefix, *model;
    int quiet;
} run_opts;

/* The command line into *o and cfg. Returns -1 to go on, else cmd_run's exit status (0 after
 * --help, 2 on bad usage, which it has reported). */
static int parse_args(int argc, char **argv, run_opts *o, wk_config *cfg) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--quiet") || !strcmp(a, "-q")) {
            o->quiet = 1;
            continue;
        } else if (a[0] != '-') {
            if (o->in) {
                fprintf(stderr, "medley run: one input file only\n");
                return 2;
            }
            o->in = a;
            continue;
        }
        if (!v) {
            fprintf(stderr, "medley run: %s needs a value (or is unknown)\n", a);
            return 2;
        }
        if (!strcmp(a, "-o") || !strcmp(a, "--output"))
            o->out = v;
        else if (!strcmp(a, "--errors"))
            o->errp = v;
        else if (!strcmp(a, "--model") || !strcmp(a, "-m"))
            o->model = v;
        else if (!strcmp(a, "--redis"))
            o->redis = v;
        else if (!strcmp(a, "--prefix"))
            o->prefix = v;
        else if (!strcmp(a, "--device"))
            cfg->runner.device = v;
        else if (!strcmp(a, "--chat-template"))
            cfg->runner.chat_template = v;
        else if (!strcmp(a, "--embed-precision"))
            cfg->runner.embed_precision = v;
        else if (!strcmp(a, "--max-seqs") || !strcmp(a, "--threads") ||
                 !strcmp(a, "--echo-delay-ms")) {
            char *end;
            long x = strtol(v, &end, 10);
            if (*end || x < 0 || x > 3600000) {
                fprintf(stderr, "medley run: %s needs a number >= 0\n", a);
                return 2;
            }
            if (a[2] == 'm')
                cfg->runner.max_seqs = (int)x;
            else if (a[2] == 't')
                cfg->runner.n_threads = (int)x;
            else
                cfg->runner.echo_delay_ms = (int)x;
        } else if (!strcmp(a, "--usd-per-hour")) {
            cfg->usd_per_hour = atof(v);
        } else if (!strcmp(a, "--max-line-bytes")) {
            char *end;
            long long x = strtoll(v, &end, 10);
            if (*end || x < 1024 || x > (1ll << 30)) {
                fprintf(stderr, "medley run: --max-line-bytes needs a number in 1024..2^30\n");
                return 2;
            }
            cfg->limits.max_line_bytes = (size_t)x;
        } else {
            fprintf(stderr, "medley run: unknown option %s\n", a);
            usage(stderr);
            return 2;
        }
        i++;
    }
    if (!o->in || !o->out) {
        usage(stderr);
        return 2;
    }
    return -1;
}

/* The first line's body.model of file in, into mbuf. Returns 0, or the exit status (1: the
 * file cannot be read, 2: no line names a model), reported. */
static int first_line_model(const char *in, char *mbuf, size_t mlen) {
    FILE *f = fopen(in, "rb");
    if (!f) {
        fprintf(stderr, "medley run: cannot open %s: %s\n", in, strerror(errno));
        return 1;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    while (!mbuf[0] && (n = getline(&line, &cap, f)) >= 0) {
        json_t *j = json_loadb(line, (size_t)n, 0, NULL);
        const char *m = json_string_value(json_object_get(json_object_get(j, "body"), "model"));
        if (m)
            snprintf(mbuf, mlen, "%s", m);
        json_decref(j);
    }
    free(line);
    fclose(f);
    if (!mbuf[0]) {
        fprintf(stderr, "medley run: give --model M (the first line has no body.model)\n");
        return 2;
    }
    return 0;
}

/* Ctrl-C and SIGTERM end the run (g_interrupted); a closed output pipe is an error, not a
 * signal. */
static void catch_signals(void) {
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
}

/* Poll the batch into *b, with progress, until it is finished or Ctrl-C. Returns 0, or -1
 * when the queue or the worker failed (reported). */
static int follow_batch(md_redis *r, const run_opts *o, const char *batch, const worker_thread *wt,
                        int tty, uint64_t t0, q_batch_info *b, md_err *e) {
    uint64_t last_plain = t0;
    memset(b, 0, sizeof *b);
    for (;;) {
        if (q_batch_get(r, o->prefix, batch, b, e)) {
            fprintf(stderr, "\nmedley run: %s\n", e->msg);
            return -1;
        }
        if (!o->quiet)
            progress(b, tty, t0, &last_plain);
        if (q_status_terminal(b->status))
            break;
        if (__atomic_load_n(&wt->done, __ATOMIC_ACQUIRE)) {
            fprintf(stderr, "%smedley run: the worker stopped: %s\n", tty ? "\n" : "",
                    wt->rc == WK_DRAINED ? "drained by an operator (medley dashboard)"
                    : wt->rc             ? wt->e.msg
                                         : "(no error)");
            return -1;
        }
        if (g_interrupted) {
            fprintf(stderr, "%smedley run: interrupted; writing the %lld answers so far\n",
                    tty ? "\n" : "", b->completed + b->failed);
            break;
        }
        sleep_ms(100);
    }
    return 0;
}

/* Submit the input, follow it, write the answers to *fo and *fe and close them (set to NULL).
 * Returns cmd_run's exit status: 0, 130 after Ctrl-C, 1 on a failure (reported). */
static int submit_and_collect(md_redis *r, const run_opts *o, const worker_thread *wt, FILE **fo,
                              FILE **fe, md_err *e) {
    q_submit_opts so = {.prefix = o->prefix, .path = o->in, .model = o->model, .window_s = 0};
    char batch[Q_BATCH_ID_MAX];
    long long n = 0;
    if (q_submit_file(r, &so, batch, &n, e)) {
        fprintf(stderr, "medley run: %s\n", e->msg);
        return 1;
    }
    int tty = isatty(STDERR_FILENO) && !o->quiet;
    if (!o->quiet)
        fprintf(stderr, "medley run: %lld requests for %s (batch %s)\n", n, o->model, batch);
    uint64_t t0 = md_mono_ns();
    q_batch_info b;
    if (follow_batch(r, o, batch, wt, tty, t0, &b, e))
        return 1;
    if (tty)
        fputc('\n', stderr);

    long long n_ok = 0, n_err = 0;
    int rc = q_results_write(r, o->prefix, batch, *fo, *fe, &n_ok, &n_err, e);
    if (*fo != stdout && fclose(*fo) && !rc)
        rc = md_errf(e, MD_EIO, "closing %s: %s", o->out, strerror(errno));
    *fo = NULL;
    if (*fe && fclose(*fe) && !rc)
        rc = md_errf(e, MD_EIO, "closing %s: %s", o->errp, strerror(errno));
    *fe = NULL;
    if (rc) {
        fprintf(stderr, "medley run: %s\n", e->msg);
        return 1;
    }
    double el = (double)(md_mono_ns() - t0) / 1e9;
    if (!o->quiet)
        fprintf(stderr, "medley run: %s: %lld succeeded, %lld failed in %.1f s; wrote %s%s%s\n",
                b.status, n_ok, n_err, el, o->out, o->errp ? " and " : "", o->errp ? o->errp : "");
    return g_interrupted ? 130 : 0;
}

int cmd_run(int argc, char **argv) {
    run_opts o = {.prefix = "medley:"};
    worker_thread wt;
    memset(&wt, 0, sizeof wt);
    wk_config_default(&wt.cfg);
    const char *env_delay = getenv("MEDLEY_ECHO_DELAY_MS");
    if (env_delay && *env_delay)
        wt.cfg.runner.echo_delay_ms = atoi(env_delay);
    int rc = parse_args(argc, argv, &o, &wt.cfg);
    if (rc >= 0)
        return rc;

    md_err e = {0};
    /* The model: the flag, else the first line's body.model. */
    char mbuf[128] = "";
    if (!o.model) {
        if ((rc = first_line_model(o.in, mbuf, sizeof mbuf)))
            return rc;
        o.model = mbuf;
    }
    /* The device: "auto" (the default) picks cuda:0 or cpu and says why; a named GPU that is
     * not usable fails here, before any work. */
    char device[32] = "cpu";
    if (strcmp(o.model, "echo") &&
        md_backend_resolve(wt.cfg.runner.device ? wt.cfg.runner.device : "auto", device,
                           sizeof device, &e)) {
        fprintf(stderr, "medley run: %s\n", e.msg);
        return 1;
    }
    wt.cfg.runner.device = device;
    wt.cfg.runner.allow_path = 1; /* this worker is private to the run: -m may be a path */
    /* Open the outputs first: a bad path should fail before any work, not after. */
    FILE *fo = strcmp(o.out, "-") ? fopen(o.out, "w") : stdout;
    FILE *fe = o.errp ? fopen(o.errp, "w") : NULL;
    if (!fo || (o.errp && !fe)) {
        fprintf(stderr, "medley run: cannot write %s: %s\n", !fo ? o.out : o.errp, strerror(errno));
        if (fo && fo != stdout)
            fclose(fo);
        return 1;
    }

    catch_signals();
    if (!getenv("MEDLEY_LOG_LEVEL"))
        md_log_set_level(MD_LOG_WARN); /* the progress bar is the output; warnings still show */

    char dir[512] = "", url[700];
    pid_t redis_pid = 0;
    int status = 1, worker_started = 0;
    md_redis *r = NULL;
    pthread_t th;
    if (!o.redis) {
        const char *tmp = getenv("TMPDIR");
        snprintf(dir, sizeof dir, "%s/medley-run-XXXXXX", tmp && *tmp ? tmp : "/tmp");
        if (!mkdtemp(dir)) {
            fprintf(stderr, "medley run: cannot create a temp dir: %s\n", strerror(errno));
            return 1;
        }
        if (start_redis(dir, &redis_pid, url, sizeof url, &e)) {
            fprintf(stderr, "medley run: %s\n", e.msg);
            goto done;
        }
        o.redis = url;
    }
    md_redis_url u;
    if (md_redis_url_parse(o.redis, &u, &e) || md_redis_open(&u, &r, &e) ||
        md_redis_check_prefix(r, o.prefix, &e)) {
        fprintf(stderr, "medley run: %s\n", e.msg);
        goto done;
    }

    wt.cfg.redis_url = o.redis;
    wt.cfg.prefix = o.prefix;
    wt.cfg.models[0] = o.model;
    wt.cfg.n_models = 1;
    wt.cfg.block_ms = 200;
    wt.cfg.grace_ms = 5000; /* Ctrl-C should not wait long */
    if (pthread_create(&th, NULL, run_worker, &wt)) {
        fprintf(stderr, "medley run: cannot start the worker thread\n");
        goto done;
    }
    worker_started = 1;
    status = submit_and_collect(r, &o, &wt, &fo, &fe, &e);

done:
    if (fo && fo != stdout)
        fclose(fo);
    if (fe)
        fclose(fe);
    g_worker_stop = 1;
    if (worker_started)
        pthread_join(th, NULL);
    md_redis_close(r);
    stop_redis(redis_pid, dir);
    return status;
}
