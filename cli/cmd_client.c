/* cmd_client.c — the queue's client commands: `medley submit`, `status`, `results`,
 * `cancel`, `batches` (docs/protocol.md). Every command takes --redis URL and --prefix P. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/commands.h"
#include "common/redis.h"
#include "common/util.h"
#include "queue/client.h"
#include "queue/queue.h"

typedef struct {
    const char *redis, *prefix;
    const char *pos[4]; /* positional arguments */
    int n_pos;
} common_args;

/* Split argv into --redis/--prefix, known flags (handled by on_flag) and positionals.
 * on_flag returns 1 if it consumed the value, 0 if the flag takes none, -1 if unknown, -2
 * if the value is bad (it said why). */
typedef int (*flag_fn)(void *ctx, const char *flag, const char *value);

static int parse(const char *cmd, int argc, char **argv, common_args *c, flag_fn on_flag,
                 void *ctx) {
    memset(c, 0, sizeof *c);
    c->prefix = "medley:";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (a[0] != '-' || !a[1]) {
            if (c->n_pos == 4) {
                fprintf(stderr, "medley %s: too many arguments\n", cmd);
                return -1;
            }
            c->pos[c->n_pos++] = a;
        } else if (!strcmp(a, "--redis") || !strcmp(a, "--prefix")) {
            if (!v) {
                fprintf(stderr, "medley %s: %s needs a value\n", cmd, a);
                return -1;
            }
            *(a[2] == 'r' ? &c->redis : &c->prefix) = v;
            i++;
        } else {
            int r = on_flag ? on_flag(ctx, a, v) : -1;
            if (r == -2)
                return -1; /* a bad value, already reported */
            if (r < 0) {
                fprintf(stderr, "medley %s: unknown option %s (see medley %s --help)\n", cmd, a,
                        cmd);
                return -1;
            }
            if (r == 1 && !v) {
                fprintf(stderr, "medley %s: %s needs a value\n", cmd, a);
                return -1;
            }
            i += r;
        }
    }
    return 0;
}

static md_redis *connect_or_say(const char *cmd, const common_args *c) {
    md_redis_url u;
    md_err e = {0};
    md_redis *r = NULL;
    if (md_redis_url_parse(c->redis ? c->redis : md_redis_default_url(), &u, &e) ||
        md_redis_open(&u, &r, &e) || md_redis_check_prefix(r, c->prefix, &e)) {
        fprintf(stderr, "medley %s: %s\n", cmd, e.msg);
        md_redis_close(r);
        return NULL;
    }
    return r;
}

/* A --watch / --wait loop outlives a Redis restart or a Sentinel failover: when the
 * connection is gone, dial again (through the Sentinels for sentinel://) for up to 30 s
 * instead of giving up. 1 when reconnected. */
static int redial(const char *cmd, md_redis *r, const md_err *why) {
    redisContext *ctx = md_redis_ctx(r);
    if (why->code != MD_EREDIS || (ctx && !ctx->err))
        return 0;
    fprintf(stderr, "medley %s: %s; reconnecting\n", cmd, why->msg);
    md_err e = {0};
    if (md_redis_reconnect(r, 30000, NULL, &e)) {
        fprintf(stderr, "medley %s: %s\n", cmd, e.msg);
        return 0;
    }
    return 1;
}

static int wants_help(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help"))
            return 1;
    return 0;
}

#define COMMON_HELP                                                                                \
    "  --redis URL        redis://[user:pass@]host:port/db, unix:///path or\n"                     \
    "                     sentinel://host:26379,host:26379/master[/db] ($MEDLEY_REDIS)\n"          \
    "  --prefix P         key prefix (default medley:)\n"

/* ---- submit ----------------------------------------------------------------------------- */

typedef struct {
    q_submit_opts o;
    int json;
} submit_args;

static int submit_flag(void *ctx, const char *f, const char *v) {
    submit_args *s = ctx;
    md_err e = {0};
    if (!strcmp(f, "--model") || !strcmp(f, "-m")) {
        s->o.model = v;
    } else if (!strcmp(f, "--batch-id")) {
        s->o.batch_id = v;
    } else if (!strcmp(f, "--completion-window")) {
        if (v && q_parse_duration(v, &s->o.window_s, &e)) {
            fprintf(stderr, "medley submit: --completion-window: %s\n", e.msg);
            return -2;
        }
    } else if (!strcmp(f, "--priority")) {
        s->o.priority = v ? atoi(v) : 0;
    } else if (!strcmp(f, "--json")) {
        s->json = 1;
        return 0;
    } else if (!strcmp(f, "--no-replica-check")) {
        s->o.no_replica_check = 1;
        return 0;
    } else {
        return -1;
    }
    return 1;
}

int cmd_submit(int argc, char **argv) {
    if (wants_help(argc, argv)) {
        printf("usage: medley submit FILE [--model M] [options]\n\n"
               "Queue every line of FILE (OpenAI Batch JSONL) as one batch; prints its id.\n\n"
               "  --model M              queue model (default: the first line's body.model)\n"
               "  --batch-id ID          batch id (default batch_<random>)\n"
               "  --completion-window D  deadline after submission: 90s, 15m, 24h (default 24h)\n"
               "  --priority N           stored with the batch for the scheduler (default 0)\n"
               "  --json                 print the batch as JSON instead of its id\n"
               "  --no-replica-check     do not confirm with ROLE/WAIT that a replica holds\n"
               "                         the batch (for a user without them)\n" COMMON_HELP);
        return 0;
    }
    submit_args s = {.o = {.window_s = 86400}};
    common_args c;
    if (parse("submit", argc, argv, &c, submit_flag, &s))
        return 2;
    if (c.n_pos != 1) {
        fprintf(stderr, "medley submit: give exactly one input FILE\n");
        return 2;
    }
    s.o.path = c.pos[0];
    s.o.prefix = c.prefix;
    md_redis *r = connect_or_say("submit", &c);
    if (!r)
        return 1;
    md_err e = {0};
    char batch[Q_BATCH_ID_MAX];
    long long n = 0;
    uint64_t t0 = md_mono_ns();
    int rc = q_submit_file(r, &s.o, batch, &n, &e);
    if (rc) {
        fprintf(stderr, "medley submit: %s\n", e.msg);
        md_redis_close(r);
        return 1;
    }
    double dt = (double)(md_mono_ns() - t0) / 1e9;
    fprintf(stderr, "medley submit: %lld requests queued in %.2f s (%.0f/s)\n", n, dt,
            dt > 0 ? n / dt : 0);
    if (s.json) {
        q_batch_info b;
        if (q_batch_get(r, c.prefix, batch, &b, &e) == 0) {
            json_t *j = q_batch_json(&b);
            json_dumpf(j, stdout, JSON_COMPACT);
            putchar('\n');
            json_decref(j);
        }
    } else {
        printf("%s\n", batch);
    }
    md_redis_close(r);
    return 0;
}

/* ---- status ----------------------------------------------------------------------------- */

typedef struct {
    int json, watch;
} status_args;

static int status_flag(void *ctx, const char *f, const char *v) {
    status_args *s = ctx;
    if (!strcmp(f, "--json"))
        s->json = 1;
    else if (!strcmp(f, "--watch") || !strcmp(f, "-w"))
        s->watch = 1;
    else
        return -1;
    return 0;
}

static void fmt_secs(char *out, size_t n, double s) {
    if (s < 0 || s > 1e8)
        snprintf(out, n, "--");
    else if (s < 60)
        snprintf(out, n, "%.0fs", s);
    else if (s < 3600)
        snprintf(out, n, "%dm%02ds", (int)s / 60, (int)s % 60);
    else
        snprintf(out, n, "%dh%02dm", (int)s / 3600, ((int)s % 3600) / 60);
}

/* One status line: a bar on a terminal, plain text otherwise. */
static void print_progress(FILE *f, const q_batch_info *b, int tty) {
    long long done = b->completed + b->failed;
    double frac = b->total > 0 ? (double)done / (double)b->total : 0;
    double now_ms = (double)md_wall_ms();
    double since = b->started_at > 0 ? (now_ms - (double)b->started_at) / 1000.0 : 0;
    if (b->finished_at > 0 && b->started_at > 0)
        since = (double)(b->finished_at - b->started_at) / 1000.0;
    double rate = since > 0 ? (double)done / since : 0;
    char eta[32];
    fmt_secs(eta, sizeof eta, rate > 0 ? (double)(b->total - done) / rate : -1);
    if (tty) {
        char bar[31];
        int fill = (int)(frac * 30);
        for (int i = 0; i < 30; i++)
            bar[i] = i < fill ? '#' : '.';
        bar[30] = 0;
        fprintf(f, "\r%s %-11s [%s] %5.1f%% %lld/%lld (%lld failed) %.1f req/s ETA %s\033[K", b->id,
                b->status, bar, 100 * frac, done, b->total, b->failed, rate, eta);
    } else {
        fprintf(f, "%s %s %lld/%lld done (%lld failed) %.1f req/s ETA %s\n", b->id, b->status, done,
                b->total, b->failed, rate, eta);
    }
    fflush(f);
}

int cmd_status(int argc, char **argv) {
    if (wants_help(argc, argv)) {
        printf("usage: medley status [BATCH] [--json] [--watch]\n\n"
               "Show a batch's progress (a bar with rate and ETA on a terminal), or every batch.\n"
               "  --json     the batch meta as JSON (schemas/batch-meta.schema.json)\n"
               "  --watch    refresh until the batch finishes\n" COMMON_HELP);
        return 0;
    }
    status_args s = {0};
    common_args c;
    if (parse("status", argc, argv, &c, status_flag, &s))
        return 2;
    if (c.n_pos == 0) {
        char *pv[] = {
            "batches",  "--redis",        (char *)(c.redis ? c.redis : md_redis_default_url()),
            "--prefix", (char *)c.prefix, "--json",
            NULL};
        return cmd_batches(s.json ? 6 : 5, pv);
    }
    md_redis *r = connect_or_say("status", &c);
    if (!r)
        return 1;
    md_err e = {0};
    int tty = isatty(STDOUT_FILENO);
    for (;;) {
        q_batch_info b;
        if (q_batch_get(r, c.prefix, c.pos[0], &b, &e)) {
            if (s.watch && redial("status", r, &e))
                continue;
            fprintf(stderr, "medley status: %s\n", e.msg);
            md_redis_close(r);
            return 1;
        }
        if (s.json) {
            json_t *j = q_batch_json(&b);
            json_dumpf(j, stdout, JSON_COMPACT);
            putchar('\n');
            json_decref(j);
        } else {
            print_progress(stdout, &b, tty);
        }
        if (!s.watch || q_status_terminal(b.status))
            break;
        struct timespec ts = {0, 500000000L};
        nanosleep(&ts, NULL);
    }
    if (tty && !s.json)
        putchar('\n');
    md_redis_close(r);
    return 0;
}

/* ---- results ---------------------------------------------------------------------------- */

typedef struct {
    const char *out, *err;
    int wait;
} results_args;

static int results_flag(void *ctx, const char *f, const char *v) {
    results_args *s = ctx;
    if (!strcmp(f, "-o") || !strcmp(f, "--output"))
        s->out = v;
    else if (!strcmp(f, "--errors"))
        s->err = v;
    else if (!strcmp(f, "--wait")) {
        s->wait = 1;
        return 0;
    } else
        return -1;
    return 1;
}

int cmd_results(int argc, char **argv) {
    if (wants_help(argc, argv)) {
        printf("usage: medley results BATCH -o out.jsonl [--errors err.jsonl] [--wait]\n\n"
               "Write a batch's output lines (OpenAI Batch output format), in completion order.\n"
               "  -o FILE          output lines ('-' = stdout)\n"
               "  --errors FILE    failed requests go here instead of into -o\n"
               "  --wait           wait until the batch finishes first\n" COMMON_HELP);
        return 0;
    }
    results_args s = {0};
    common_args c;
    if (parse("results", argc, argv, &c, results_flag, &s))
        return 2;
    if (c.n_pos != 1 || !s.out) {
        fprintf(stderr, "medley results: usage: medley results BATCH -o out.jsonl\n");
        return 2;
    }
    md_redis *r = connect_or_say("results", &c);
    if (!r)
        return 1;
    md_err e = {0};
    q_batch_info b;
    for (;;) {
        if (q_batch_get(r, c.prefix, c.pos[0], &b, &e)) {
            if (s.wait && redial("results", r, &e))
                continue;
            fprintf(stderr, "medley results: %s\n", e.msg);
            md_redis_close(r);
            return 1;
        }
        if (!s.wait || q_status_terminal(b.status))
            break;
        struct timespec ts = {0, 200000000L};
        nanosleep(&ts, NULL);
    }
    FILE *out = strcmp(s.out, "-") ? fopen(s.out, "w") : stdout;
    FILE *err = s.err ? fopen(s.err, "w") : NULL;
    if (!out || (s.err && !err)) {
        fprintf(stderr, "medley results: cannot write %s: %s\n", !out ? s.out : s.err,
                strerror(errno));
        if (out && out != stdout)
            fclose(out);
        md_redis_close(r);
        return 1;
    }
    long long n_ok = 0, n_err = 0;
    int rc = q_results_write(r, c.prefix, c.pos[0], out, err, &n_ok, &n_err, &e);
    if (out != stdout && fclose(out) && !rc)
        rc = md_errf(&e, MD_EIO, "closing %s: %s", s.out, strerror(errno));
    if (err && fclose(err) && !rc)
        rc = md_errf(&e, MD_EIO, "closing %s: %s", s.err, strerror(errno));
    md_redis_close(r);
    if (rc) {
        fprintf(stderr, "medley results: %s\n", e.msg);
        return 1;
    }
    fprintf(stderr, "medley results: %lld succeeded, %lld failed%s (batch %s, %lld/%lld done)\n",
            n_ok, n_err, q_status_terminal(b.status) ? "" : " so far", b.status,
            b.completed + b.failed, b.total);
    return 0;
}

/* ---- cancel ----------------------------------------------------------------------------- */

int cmd_cancel(int argc, char **argv) {
    if (wants_help(argc, argv)) {
        printf("usage: medley cancel BATCH\n\n"
               "Cancel a batch: workers answer its remaining requests as cancelled.\n" COMMON_HELP);
        return 0;
    }
    common_args c;
    if (parse("cancel", argc, argv, &c, NULL, NULL))
        return 2;
    if (c.n_pos != 1) {
        fprintf(stderr, "medley cancel: give one BATCH id\n");
        return 2;
    }
    md_redis *r = connect_or_say("cancel", &c);
    if (!r)
        return 1;
    md_err e = {0};
    char st[32] = "";
    int rc = q_batch_cancel(r, c.prefix, c.pos[0], st, sizeof st, &e);
    md_redis_close(r);
    if (rc) {
        fprintf(stderr, "medley cancel: %s\n", e.msg);
        return 1;
    }
    printf("%s %s\n", c.pos[0], st);
    return 0;
}

/* ---- batches ---------------------------------------------------------------------------- */

typedef struct {
    int json;
    long limit;
} batches_args;

static int batches_flag(void *ctx, const char *f, const char *v) {
    batches_args *s = ctx;
    if (!strcmp(f, "--json")) {
        s->json = 1;
        return 0;
    }
    if (!strcmp(f, "--limit")) {
        s->limit = v ? atol(v) : 0;
        if (s->limit < 1) {
            fprintf(stderr, "medley batches: --limit needs a number >= 1\n");
            return -2;
        }
        return 1;
    }
    return -1;
}

int cmd_batches(int argc, char **argv) {
    if (wants_help(argc, argv)) {
        printf("usage: medley batches [--json] [--limit N]\n\n"
               "List batches, newest first (default 20).\n" COMMON_HELP);
        return 0;
    }
    batches_args s = {.limit = 20};
    common_args c;
    if (parse("batches", argc, argv, &c, batches_flag, &s))
        return 2;
    md_redis *r = connect_or_say("batches", &c);
    if (!r)
        return 1;
    char idx[Q_KEY_MAX];
    q_key_batches(idx, c.prefix);
    md_err e = {0};
    redisReply *rep = md_redis_cmd(r, &e, "ZREVRANGE %s 0 %ld", idx, s.limit - 1);
    if (!rep || rep->type != REDIS_REPLY_ARRAY) {
        fprintf(stderr, "medley batches: %s\n", rep ? rep->str : e.msg);
        if (rep)
            freeReplyObject(rep);
        md_redis_close(r);
        return 1;
    }
    if (!s.json)
        printf("%-31s %-11s %-16s %9s %9s %9s  %s\n", "BATCH", "STATUS", "MODEL", "TOTAL", "DONE",
               "FAILED", "CREATED (UTC)");
    for (size_t i = 0; i < rep->elements; i++) {
        q_batch_info b;
        if (q_batch_get(r, c.prefix, rep->element[i]->str, &b, &e))
            continue; /* deleted since it was indexed */
        if (s.json) {
            json_t *j = q_batch_json(&b);
            json_dumpf(j, stdout, JSON_COMPACT);
            putchar('\n');
            json_decref(j);
        } else {
            time_t t = (time_t)(b.created_at / 1000);
            struct tm tm;
            gmtime_r(&t, &tm);
            char when[32];
            strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", &tm);
            printf("%-31s %-11s %-16.16s %9lld %9lld %9lld  %s\n", b.id, b.status, b.model, b.total,
                   b.completed, b.failed, when);
        }
    }
    freeReplyObject(rep);
    md_redis_close(r);
    return 0;
}
