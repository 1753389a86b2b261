/* worker.c — see worker.h. One thread: a loop that polls the runners, writes finished answers
 * (completion script, then XACK), does the periodic work (lease renewal, takeover, heartbeat)
 * and reads as many new entries as the runners have free slots, blocking only when idle.
 *
 * Invariant that makes results effectively-once: an entry is XACKed only after the
 * completion script has returned for it (1 = written, 0 = already answered, -1 = batch gone).
 * Whatever breaks in between (worker crash, Redis restart, lost reply) leaves the entry
 * pending, so it is redelivered, and the script ignores the second answer. */
#include "worker/worker.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "common/redis.h"
#include "common/util.h"
#include "kernels/backend.h"
#include "worker/logprobs.h"
#include "worker/plan.h"
#include "worker/queue.h"
#include "worker/watchdog.h"

#define ENTRY_ID_MAX 48
#define BATCH_CACHE 64
#define BATCH_CACHE_NS 500000000ull /* re-read a batch's status every 0.5 s */

/* Each job and answer names its stream (index into wk.st); a stream names its model slot.
 * Slots of both are freed only when nothing refers to them, so indices stay valid. */
#define MAX_STREAMS (WK_MAX_MODELS * (1 + Q_CLASS_MAX))

typedef struct {
    int used;
    int s; /* stream index */
    char id[ENTRY_ID_MAX];
    char batch[Q_BATCH_ID_MAX];
    char custom_id[WK_CUSTOM_ID_MAX];
    int chat;
    long long attempt;
    double queue_ms;
    double share_s; /* this job's share of the worker's busy seconds */
    int handback;   /* its device failed: hand the entry back instead of answering it */
} job;

typedef struct {
    int s;        /* stream index */
    int scripted; /* the completion script returned; only the XACK is left */
    char id[ENTRY_ID_MAX];
    char batch[Q_BATCH_ID_MAX];
    char member[WK_CUSTOM_ID_MAX + ENTRY_ID_MAX]; /* {B}:done member */
    int ok;
    char *line; /* output line (malloc'd) */
} answer;

typedef struct {
    char id[Q_BATCH_ID_MAX];
    char status[24];
    long long deadline;
    int exists;
    uint64_t at_ns;
} batch_ent;

enum { SLOT_FREE = 0, SLOT_ON, SLOT_DRAIN };

/* A stream read by this worker: reading (SLOT_ON) or draining (SLOT_DRAIN: no new reads;
 * leases renewed and answers XACKed until its running entries are done). */
typedef struct {
    int state;
    int m; /* model slot */
    char key[Q_KEY_MAX];
    char cursor[ENTRY_ID_MAX]; /* XAUTOCLAIM cursor */
} stream;

/* A served model: its runner and one job slot per unit of runner capacity. Draining: the
 * plan moved it away; it finishes what runs, then closes. */
typedef struct {
    int state;
    char name[Q_MODEL_NAME];
    char replicas[256]; /* plan replica ids ("" when served from the command line) */
    wk_runner *runner;
    job *jobs; /* (n_jobs) */
    int n_jobs;
} model;

typedef struct {
    const wk_config *cfg;
    volatile sig_atomic_t *stop;
    md_redis *r;
    int broken;   /* the connection failed; reconnect before the next command */
    unsigned gen; /* connection generation the scripts and groups were set up for */
    char prefix[80], me[160], host[128], events[Q_KEY_MAX], wkey[Q_KEY_MAX];
    char sha[41];
    model mod[WK_MAX_MODELS];
    stream st[MAX_STREAMS];
    int live;
    /* --follow-plan: the version of the plan applied (-1: none yet) and the last value seen
     * in P plan:version (-2: never looked). */
    long long plan_applied, plan_seen;
    uint64_t last_plan;
    answer *ans;
    int n_ans, cap_ans;
    batch_ent cache[BATCH_CACHE];
    long long n_ok, n_failed, n_tokens, tokens_at_hb;
    int64_t started_ms;
    uint64_t last_tick, last_hb, last_lease, last_claim;
    char gpu_name[256]; /* the CUDA device's name as its driver reports it, or "" */
    size_t gpu_bytes;   /* and its memory */
    int device_failed;  /* a runner's device failed: hand back, stop, exit with dev_err */
    long n_handed_back;
    md_err dev_err;
    wk_watchdog *wd;   /* NULL once it fired and the worker took its verdict */
    int step_limit_ms; /* a step's limit (0: none) */
    int load_limit_ms; /* a model load's limit (0: none; kept alive regardless) */
    char load_what[Q_MODEL_NAME + 16];
    unsigned streams_gen, wd_gen; /* stream set changes / the one the watchdog was told */
} wk;

void wk_config_default(wk_config *c) {
    memset(c, 0, sizeof *c);
    c->prefix = "medley:";
    wk_limits_default(&c->limits);
    c->visibility_ms = 60000;
    c->max_attempts = 3;
    c->block_ms = 1000;
    c->heartbeat_ms = 5000;
    c->step_timeout_ms = -1;
    c->step_timeout_exit = 1;
    c->load_timeout_ms = -1;
    c->grace_ms = 30000;
    c->connect_timeout_ms = 2000;
    c->command_timeout_ms = 10000;
    c->plan_check_ms = 1000;
}

/* ---- answers ---------------------------------------------------------------------------- */

static answer *new_answer(wk *w) {
    if (w->n_ans == w->cap_ans) {
        int nc = w->cap_ans ? w->cap_ans * 2 : 256;
        answer *na = realloc(w->ans, (size_t)nc * sizeof *na);
        if (!na)
            return NULL;
        w->ans = na;
        w->cap_ans = nc;
    }
    answer *a = &w->ans[w->n_ans++];
    memset(a, 0, sizeof *a);
    return a;
}

/* The device type of heartbeats and output lines: --device-type, else the runner's, else
 * what --device says ("cpu" or "cuda"). */
static const char *dev_type(wk *w, int m) {
    if (w->cfg->device_type && *w->cfg->device_type)
        return w->cfg->device_type;
    if (m >= 0 && m < WK_MAX_MODELS && w->mod[m].runner)
        return wk_runner_device(w->mod[m].runner);
    for (int k = 0; k < WK_MAX_MODELS; k++)
        if (w->mod[k].runner)
            return wk_runner_device(w->mod[k].runner);
    const char *d = w->cfg->runner.device;
    return d && !strncmp(d, "cuda", 4) ? "cuda" : "cpu";
}

static int stream_model(wk *w, int s) {
    return w->st[s].m;
}

static json_t *medley_obj(wk *w, int m, double queue_ms, double prefill_ms, double decode_ms,
                          double share_s, long long attempt) {
    double cost = w->cfg->usd_per_hour * share_s / 3600.0;
    return json_pack("{s:s, s:[s], s:f, s:f, s:f, s:f, s:I}", "worker", w->me, "device_types",
                     dev_type(w, m), "queue_ms", queue_ms, "prefill_ms", prefill_ms, "decode_ms",
                     decode_ms, "cost_usd", cost, "attempt", (json_int_t)attempt);
}

/* Queue an answer whose document is doc (stolen). */
static void push_answer(wk *w, int s, const char *entry_id, const char *batch,
                        const char *custom_id, int ok, json_t *doc) {
    char *line = json_dumps(doc, JSON_COMPACT);
    json_decref(doc);
    answer *a = line ? new_answer(w) : NULL;
    if (!a) {
        /* Out of memory: leave the entry pending; it is taken over after the visibility
         * timeout. Nothing is lost, only delayed. */
        MD_ERROR("worker", "out of memory answering entry %s; it will be redelivered", entry_id);
        free(line);
        return;
    }
    a->s = s;
    snprintf(a->id, sizeof a->id, "%s", entry_id);
    snprintf(a->batch, sizeof a->batch, "%s", batch);
    if (custom_id)
        snprintf(a->member, sizeof a->member, "%s", custom_id);
    else
        snprintf(a->member, sizeof a->member, "#%s", entry_id);
    a->ok = ok;
    a->line = line;
    if (ok)
        w->n_ok++;
    else
        w->n_failed++;
}

static json_t *cid_json(const char *custom_id) {
    return custom_id ? json_string(custom_id) : json_null();
}

static void ids(char *out, const char *prefix) {
    char hex[25];
    md_random_hex(hex, sizeof hex, 24);
    snprintf(out, 48, "%s%s", prefix, hex);
}

/* A request the API refused (400): response.body.error, as OpenAI's Batch output has it. */
static void answer_invalid(wk *w, int s, const char *entry_id, const char *batch,
                           const char *custom_id, const wk_verr *ve, double queue_ms,
                           long long attempt) {
    char id[48], rid[48];
    ids(id, "batch_req_");
    ids(rid, "req_");
    json_t *err =
        json_pack("{s:s, s:s, s:o, s:s}", "message", ve->message, "type", "invalid_request_error",
                  "param", ve->param[0] ? json_string(ve->param) : json_null(), "code", ve->code);
    json_t *doc = json_pack("{s:s, s:o, s:{s:i, s:s, s:{s:o}}, s:n, s:o}", "id", id, "custom_id",
                            cid_json(custom_id), "response", "status_code", ve->status,
                            "request_id", rid, "body", "error", err, "error", "medley",
                            medley_obj(w, stream_model(w, s), queue_ms, 0, 0, 0, attempt));
    push_answer(w, s, entry_id, batch, custom_id, 0, doc);
}

/* A request that never reached a model (cancelled, expired, dead-lettered, server error):
 * response null, error {code, message}. */
static void answer_error(wk *w, int s, const char *entry_id, const char *batch,
                         const char *custom_id, const char *code, const char *message,
                         double queue_ms, long long attempt) {
    char id[48];
    ids(id, "batch_req_");
    json_t *doc =
        json_pack("{s:s, s:o, s:n, s:{s:s, s:s}, s:o}", "id", id, "custom_id", cid_json(custom_id),
                  "response", "error", "code", code, "message", message, "medley",
                  medley_obj(w, stream_model(w, s), queue_ms, 0, 0, 0, attempt));
    push_answer(w, s, entry_id, batch, custom_id, 0, doc);
}

static void on_done(void *ctx, void *tag, const wk_result *res) {
    wk *w = ctx;
    job *j = tag;
    if (!j->used)
        return; /* dropped after the watchdog handed it back (a step that outran its limit) */
    if (res->device_lost && j->attempt < w->cfg->max_attempts) {
        j->handback = 1; /* stays used until hand_back() gives the entry to others */
        return;
    }
    if (res->device_lost) {
        /* its last delivery: answered with the device's failure, not left to the DLQ with
         * only "delivered N times" */
        char msg[1200];
        snprintf(msg, sizeof msg, "the device failed on the last of %d attempts: %s",
                 w->cfg->max_attempts, res->error ? res->error : "device error");
        answer_error(w, j->s, j->id, j->batch, j->custom_id, "server_error", msg, j->queue_ms,
                     j->attempt);
    } else if (res->error) {
        answer_error(w, j->s, j->id, j->batch, j->custom_id, "server_error", res->error,
                     j->queue_ms, j->attempt);
    } else {
        char id[48], rid[48], cid[48];
        ids(id, "batch_req_");
        ids(rid, "req_");
        ids(cid, j->chat ? "chatcmpl-" : "cmpl-");
        int m = stream_model(w, j->s);
        const char *model = w->mod[m].name;
        json_t *lp = wk_logprobs_json(res, j->chat);
        json_t *choice = j->chat ? json_pack("{s:i, s:{s:s, s:s}, s:s, s:o}", "index", 0, "message",
                                             "role", "assistant", "content", res->text,
                                             "finish_reason", res->finish_reason, "logprobs", lp)
                                 : json_pack("{s:i, s:s, s:s, s:o}", "index", 0, "text", res->text,
                                             "finish_reason", res->finish_reason, "logprobs", lp);
        json_t *body = json_pack("{s:s, s:s, s:I, s:s, s:[o], s:{s:i, s:i, s:i}}", "id", cid,
                                 "object", j->chat ? "chat.completion" : "text_completion",
                                 "created", (json_int_t)(md_wall_ms() / 1000), "model", model,
                                 "choices", choice, "usage", "prompt_tokens", res->prompt_tokens,
                                 "completion_tokens", res->completion_tokens, "total_tokens",
                                 res->prompt_tokens + res->completion_tokens);
        json_t *doc = json_pack(
            "{s:s, s:s, s:{s:i, s:s, s:o}, s:n, s:o}", "id", id, "custom_id", j->custom_id,
            "response", "status_code", 200, "request_id", rid, "body", body, "error", "medley",
            medley_obj(w, m, j->queue_ms, res->prefill_ms, res->decode_ms, j->share_s, j->attempt));
        w->n_tokens += res->completion_tokens;
        push_answer(w, j->s, j->id, j->batch, j->custom_id, 1, doc);
    }
    j->used = 0;
    w->live--;
}

/* ---- Redis setup ------------------------------------------------------------------------ */

/* XGROUP CREATE from id 0, so entries submitted before any worker existed are delivered. */
static int create_group(wk *w, const char *key, md_err *e) {
    redisReply *rep = md_redis_cmd(w->r, e, "XGROUP CREATE %s %s 0 MKSTREAM", key, Q_GROUP);
    if (!rep)
        return MD_EREDIS;
    int rc = 0;
    if (rep->type == REDIS_REPLY_ERROR && strncmp(rep->str, "BUSYGROUP", 9))
        rc = md_errf(e, MD_EREDIS, "XGROUP CREATE %s: %s", key, rep->str);
    freeReplyObject(rep);
    return rc;
}

static int setup_conn(wk *w, md_err *e) {
    int rc = q_script_load(w->r, q_complete_lua, w->sha, e);
    if (rc)
        return rc;
    for (int s = 0; s < MAX_STREAMS; s++)
        if (w->st[s].state != SLOT_FREE && (rc = create_group(w, w->st[s].key, e)))
            return rc;
    w->gen = md_redis_generation(w->r);
    return 0;
}

static void take_own(wk *w);

/* Reconnect (forever, until stop) and set up again; then resume what is pending for us (a
 * read whose reply was lost with the connection left entries we never saw). */
static int heal(wk *w, int until_stop) {
    md_err e = {0};
    for (;;) {
        if (md_redis_reconnect(w->r, -1, until_stop ? w->stop : NULL, &e))
            return -1;
        if (setup_conn(w, &e) == 0) {
            w->broken = 0;
            for (int s = 0; s < MAX_STREAMS; s++)
                snprintf(w->st[s].cursor, ENTRY_ID_MAX, "0-0");
            /* Run the script again for answers not yet XACKed: a Redis that restarted with
             * `appendfsync everysec` may have lost the script's writes of the last second.
             * Harmless when they survived (the script returns 0). */
            for (int i = 0; i < w->n_ans; i++)
                w->ans[i].scripted = 0;
            if (!*w->stop)
                take_own(w);
            return 0;
        }
        MD_WARN("worker", "after reconnecting: %s", e.msg);
    }
}

/* ---- writing answers -------------------------------------------------------------------- */

/* Run the completion script for every unscripted answer, then XACK every scripted one.
 * On a lost connection the answers stay queued for the next try (the script is idempotent). */
static void flush(wk *w) {
    if (!w->n_ans || w->broken)
        return;
    redisContext *c = md_redis_ctx(w->r);
    char now[32];
    snprintf(now, sizeof now, "%lld", (long long)md_wall_ms());
    int sent = 0;
    for (int i = 0; i < w->n_ans; i++) {
        answer *a = &w->ans[i];
        if (a->scripted)
            continue;
        char meta[Q_KEY_MAX], done[Q_KEY_MAX], out[Q_KEY_MAX];
        q_key_meta(meta, w->prefix, a->batch);
        q_key_done(done, w->prefix, a->batch);
        q_key_out(out, w->prefix, a->batch);
        const char *argv[] = {"EVALSHA",         w->sha,  "3", meta,      done,    out, a->member,
                              a->ok ? "1" : "0", a->line, now, w->events, a->batch};
        size_t lens[12];
        for (int k = 0; k < 12; k++)
            lens[k] = strlen(argv[k]);
        redisAppendCommandArgv(c, 12, argv, lens);
        sent++;
    }
    int noscript = 0;
    md_err e = {0};
    for (int i = 0; i < w->n_ans && sent > 0; i++) {
        answer *a = &w->ans[i];
        if (a->scripted)
            continue;
        sent--;
        redisReply *rep = md_redis_get_reply(w->r, &e);
        if (!rep) {
            w->broken = 1;
            return;
        }
        if (rep->type == REDIS_REPLY_INTEGER) {
            a->scripted = 1;
            if (rep->integer < 0)
                MD_WARN("worker", "batch %s no longer exists; dropping entry %s", a->batch, a->id);
        } else if (rep->type == REDIS_REPLY_ERROR && !strncmp(rep->str, "NOSCRIPT", 8)) {
            noscript = 1;
        } else {
            MD_ERROR("worker", "completion script for %s: %s", a->id,
                     rep->type == REDIS_REPLY_ERROR ? rep->str : "unexpected reply");
        }
        freeReplyObject(rep);
    }
    if (noscript && q_script_load(w->r, q_complete_lua, w->sha, &e)) {
        w->broken = e.code == MD_EREDIS;
        return;
    }
    /* XACK, then XDEL (an answered entry is never read again; deleting it keeps the queue
     * stream as small as the backlog), one command each per stream. */
    int acks = 0;
    for (int m = 0; m < MAX_STREAMS; m++) {
        int n = 0;
        for (int i = 0; i < w->n_ans; i++)
            n += w->ans[i].scripted && w->ans[i].s == m;
        if (!n)
            continue;
        const char **argv = malloc((size_t)(n + 3) * sizeof *argv);
        size_t *lens = malloc((size_t)(n + 3) * sizeof *lens);
        if (!argv || !lens) {
            free(argv);
            free(lens);
            return;
        }
        argv[0] = "XACK";
        argv[1] = w->st[m].key;
        argv[2] = Q_GROUP;
        int k = 3;
        for (int i = 0; i < w->n_ans; i++)
            if (w->ans[i].scripted && w->ans[i].s == m)
                argv[k++] = w->ans[i].id;
        for (int i = 0; i < k; i++)
            lens[i] = strlen(argv[i]);
        redisAppendCommandArgv(c, k, argv, lens);
        argv[1] = "XDEL"; /* XDEL key id... reuses the id list */
        argv[2] = w->st[m].key;
        lens[1] = 4;
        lens[2] = strlen(w->st[m].key);
        redisAppendCommandArgv(c, k - 1, argv + 1, lens + 1);
        free(argv);
        free(lens);
        acks += 2;
    }
    for (int i = 0; i < acks; i++) {
        redisReply *rep = md_redis_get_reply(w->r, &e);
        if (!rep) {
            w->broken = 1;
            return; /* the scripted answers are XACKed after the reconnect */
        }
        freeReplyObject(rep);
    }
    int k = 0;
    for (int i = 0; i < w->n_ans; i++) {
        if (w->ans[i].scripted)
            free(w->ans[i].line);
        else
            w->ans[k++] = w->ans[i];
    }
    w->n_ans = k;
}

/* ---- batches ---------------------------------------------------------------------------- */

/* The batch's status and deadline, cached for half a second. NULL on a Redis failure. */
static batch_ent *batch_state(wk *w, const char *batch) {
    uint64_t now = md_mono_ns();
    batch_ent *slot = NULL, *oldest = &w->cache[0];
    for (int i = 0; i < BATCH_CACHE; i++) {
        batch_ent *b = &w->cache[i];
        if (b->id[0] && !strcmp(b->id, batch)) {
            slot = b;
            break;
        }
        if (b->at_ns < oldest->at_ns)
            oldest = b;
    }
    if (slot && now - slot->at_ns < BATCH_CACHE_NS)
        return slot;
    if (!slot)
        slot = oldest;
    char meta[Q_KEY_MAX];
    q_key_meta(meta, w->prefix, batch);
    md_err e = {0};
    redisReply *rep = md_redis_cmd(w->r, &e, "HMGET %s status deadline", meta);
    if (!rep) {
        w->broken = 1;
        return NULL;
    }
    memset(slot, 0, sizeof *slot);
    snprintf(slot->id, sizeof slot->id, "%s", batch);
    if (rep->type == REDIS_REPLY_ARRAY && rep->elements == 2 && rep->element[0]->str) {
        slot->exists = 1;
        snprintf(slot->status, sizeof slot->status, "%s", rep->element[0]->str);
        slot->deadline = rep->element[1]->str ? atoll(rep->element[1]->str) : 0;
    }
    slot->at_ns = now;
    freeReplyObject(rep);
    return slot;
}

/* ---- taking entries --------------------------------------------------------------------- */

/* Free runner slots of a stream's model; 0 unless the stream is being read. */
static int free_slots(wk *w, int s) {
    if (w->st[s].state != SLOT_ON)
        return 0;
    wk_runner *r = w->mod[w->st[s].m].runner;
    return wk_runner_capacity(r) - wk_runner_live(r);
}

/* The entry is ours already: running, or answered and waiting to be written/XACKed. */
static int running(wk *w, int s, const char *id) {
    model *md = &w->mod[w->st[s].m];
    for (int i = 0; i < md->n_jobs; i++)
        if (md->jobs[i].used && md->jobs[i].s == s && !strcmp(md->jobs[i].id, id))
            return 1;
    for (int i = 0; i < w->n_ans; i++)
        if (w->ans[i].s == s && !strcmp(w->ans[i].id, id))
            return 1;
    return 0;
}

static const char *field(redisReply *fields, const char *name, size_t *len) {
    if (!fields || fields->type != REDIS_REPLY_ARRAY)
        return NULL;
    for (size_t i = 0; i + 1 < fields->elements; i += 2)
        if (fields->element[i]->str && !strcmp(fields->element[i]->str, name)) {
            *len = fields->element[i + 1]->len;
            return fields->element[i + 1]->str;
        }
    return NULL;
}

/* Milliseconds the entry waited: now minus the time part of its id. */
static double waited_ms(const char *id) {
    long long t = atoll(id);
    double d = (double)(md_wall_ms() - t);
    return d > 0 ? d : 0;
}

static void ack_only(wk *w, int s, const char *id) {
    md_err e = {0};
    redisReply *rep = md_redis_cmd(w->r, &e, "XACK %s %s %s", w->st[s].key, Q_GROUP, id);
    if (!rep)
        w->broken = 1;
    else
        freeReplyObject(rep);
}

/* One entry: answer it at once (bad input, cancelled/expired batch) or start it. */
static void take(wk *w, int s, const char *id, redisReply *fields, long long attempt) {
    int m = stream_model(w, s);
    model *md = &w->mod[m];
    size_t blen = 0, llen = 0;
    const char *batch = field(fields, "batch", &blen);
    const char *line = field(fields, "line", &llen);
    md_err e = {0};
    if (!batch || !line || q_batch_id_check(batch, &e)) {
        /* Not a medley entry: no batch to answer to. Keep it in the DLQ for a human. */
        char dlq[Q_KEY_MAX];
        q_key_dlq(dlq, w->prefix, md->name);
        redisReply *rep =
            md_redis_cmd(w->r, &e, "XADD %s * id %s reason %s worker %s stream %s", dlq, id,
                         "entry has no valid batch or line field", w->me, w->st[s].key);
        if (!rep) {
            w->broken = 1;
            return;
        }
        freeReplyObject(rep);
        MD_WARN("worker", "entry %s of %s has no valid batch/line field; moved to the DLQ", id,
                w->st[s].key);
        ack_only(w, s, id);
        return;
    }
    batch_ent *b = batch_state(w, batch);
    if (!b)
        return; /* Redis lost: the entry stays pending and is redelivered */
    double qms = waited_ms(id);
    char cidbuf[WK_CUSTOM_ID_MAX];
    wk_request req;
    wk_verr ve;
    int bad = wk_validate(line, llen, &w->cfg->limits, &req, cidbuf, &ve);
    const char *cid = req.custom_id;
    if (!b->exists) {
        MD_WARN("worker", "entry %s names batch %s, which does not exist; dropped", id, batch);
        ack_only(w, s, id);
    } else if (!strcmp(b->status, "cancelling") || !strcmp(b->status, "cancelled")) {
        answer_error(w, s, id, batch, cid, "batch_cancelled", "the batch was cancelled", qms,
                     attempt);
    } else if (!strcmp(b->status, "failed")) {
        answer_error(w, s, id, batch, cid, "batch_failed",
                     "the batch failed before this request "
                     "was run",
                     qms, attempt);
    } else if (b->deadline > 0 && md_wall_ms() > b->deadline) {
        answer_error(w, s, id, batch, cid, "batch_expired",
                     "the batch's completion window ended before this request was run", qms,
                     attempt);
    } else if (bad) {
        answer_invalid(w, s, id, batch, cid, &ve, qms, attempt);
    } else if (req.model && strcmp(req.model, md->name)) {
        snprintf(ve.code, sizeof ve.code, "model_not_found");
        snprintf(ve.param, sizeof ve.param, "body.model");
        snprintf(ve.message, sizeof ve.message,
                 "The model '%s' does not exist or is not this batch's model ('%s').", req.model,
                 md->name);
        ve.status = 404;
        answer_invalid(w, s, id, batch, cid, &ve, qms, attempt);
    } else {
        job *j = NULL;
        for (int i = 0; i < md->n_jobs && !j; i++)
            if (!md->jobs[i].used)
                j = &md->jobs[i];
        if (!j) { /* cannot happen (reads never exceed free slots); left pending if it does */
            MD_ERROR("worker", "no free slot for entry %s; it will be taken over later", id);
            wk_request_free(&req);
            return;
        }
        memset(j, 0, sizeof *j);
        j->s = s;
        snprintf(j->id, sizeof j->id, "%s", id);
        snprintf(j->batch, sizeof j->batch, "%s", batch);
        snprintf(j->custom_id, sizeof j->custom_id, "%s", cid);
        j->chat = req.chat;
        j->attempt = attempt;
        j->queue_ms = qms;
        int rc = wk_runner_start(md->runner, &req, j, &e);
        if (rc == 0) {
            j->used = 1;
            w->live++;
        } else if (rc == MD_ERANGE) {
            snprintf(ve.code, sizeof ve.code, "context_length_exceeded");
            snprintf(ve.param, sizeof ve.param, "%s", req.chat ? "messages" : "prompt");
            snprintf(ve.message, sizeof ve.message, "%s", e.msg);
            ve.status = 400;
            answer_invalid(w, s, id, batch, cid, &ve, qms, attempt);
        } else {
            answer_error(w, s, id, batch, cid, "server_error", e.msg, qms, attempt);
        }
    }
    wk_request_free(&req);
}

/* Delivery counts of entries (XPENDING id id 1 each, pipelined); 0 when unknown. */
static int delivery_counts(wk *w, int s, redisReply *entries, long long *counts) {
    redisContext *c = md_redis_ctx(w->r);
    int n = 0;
    for (size_t i = 0; i < entries->elements; i++) {
        redisReply *en = entries->element[i];
        if (en->type != REDIS_REPLY_ARRAY || en->elements < 1 || !en->element[0]->str)
            continue;
        redisAppendCommand(c, "XPENDING %s %s %s %s 1", w->st[s].key, Q_GROUP, en->element[0]->str,
                           en->element[0]->str);
        n++;
    }
    md_err e = {0};
    int k = 0;
    for (size_t i = 0; i < entries->elements; i++) {
        redisReply *en = entries->element[i];
        counts[i] = 0;
        if (en->type != REDIS_REPLY_ARRAY || en->elements < 1 || !en->element[0]->str)
            continue;
        redisReply *rep = md_redis_get_reply(w->r, &e);
        k++;
        if (!rep) {
            w->broken = 1;
            return -1;
        }
        if (rep->type == REDIS_REPLY_ARRAY && rep->elements == 1 &&
            rep->element[0]->type == REDIS_REPLY_ARRAY && rep->element[0]->elements == 4)
            counts[i] = rep->element[0]->element[3]->integer;
        freeReplyObject(rep);
    }
    return k == n ? 0 : -1;
}

/* Entries of one stream (an array of [id, fields]); claimed ones check max_attempts. */
static void take_all(wk *w, int s, redisReply *entries, int claimed) {
    if (!entries || entries->type != REDIS_REPLY_ARRAY || entries->elements == 0)
        return;
    long long *counts = NULL;
    if (claimed) {
        counts = calloc(entries->elements, sizeof *counts);
        if (!counts || delivery_counts(w, s, entries, counts)) {
            free(counts);
            return; /* left pending; taken over again later */
        }
    }
    for (size_t i = 0; i < entries->elements && !w->broken; i++) {
        redisReply *en = entries->element[i];
        if (en->type != REDIS_REPLY_ARRAY || en->elements < 2 || !en->element[0]->str)
            continue;
        const char *id = en->element[0]->str;
        redisReply *fields = en->element[1];
        if (claimed && running(w, s, id))
            continue; /* ours already (a lapsed lease, or a resume after reconnecting) */
        long long attempt = claimed ? (counts[i] > 0 ? counts[i] : 2) : 1;
        if (fields->type != REDIS_REPLY_ARRAY) {
            ack_only(w, s, id); /* deleted from the stream (XDEL/XTRIM): nothing to answer */
            continue;
        }
        if (claimed && attempt > w->cfg->max_attempts) {
            size_t blen = 0, llen = 0;
            const char *batch = field(fields, "batch", &blen);
            const char *line = field(fields, "line", &llen);
            char dlq[Q_KEY_MAX], reason[160];
            q_key_dlq(dlq, w->prefix, w->mod[stream_model(w, s)].name);
            snprintf(reason, sizeof reason,
                     "delivered %lld times without an answer (max_attempts %d)", attempt,
                     w->cfg->max_attempts);
            md_err e = {0};
            const char *argv[] = {"XADD",
                                  dlq,
                                  "*",
                                  "id",
                                  id,
                                  "batch",
                                  batch ? batch : "",
                                  "line",
                                  line ? line : "",
                                  "reason",
                                  reason,
                                  "worker",
                                  w->me,
                                  "stream",
                                  w->st[s].key};
            size_t lens[15];
            for (int k = 0; k < 15; k++)
                lens[k] = strlen(argv[k]);
            if (line)
                lens[8] = llen;
            redisReply *rep = md_redis_cmd_argv(w->r, 15, argv, lens, &e);
            if (!rep) {
                w->broken = 1;
                break;
            }
            freeReplyObject(rep);
            MD_WARN("worker", "entry %s: %s; moved to %s", id, reason, dlq);
            char cidbuf[WK_CUSTOM_ID_MAX];
            wk_request req;
            wk_verr ve;
            wk_validate(line ? line : "", line ? llen : 0, &w->cfg->limits, &req, cidbuf, &ve);
            if (batch && !q_batch_id_check(batch, &e))
                answer_error(w, s, id, batch, req.custom_id, "max_attempts_exceeded", reason,
                             waited_ms(id), attempt);
            else
                ack_only(w, s, id);
            wk_request_free(&req);
            continue;
        }
        take(w, s, id, fields, attempt);
    }
    free(counts);
}

/* XREADGROUP over every stream being read whose model has free slots. A model's free slots
 * are shared out over its streams (one COUNT applies to every stream of the command, so it
 * is the smallest share), so a read never returns more entries than the runners take. */
static int read_new(wk *w, int block_ms) {
    const char *argv[8 + 2 * MAX_STREAMS];
    int which[MAX_STREAMS], n = 0, count = 0;
    for (int m = 0; m < WK_MAX_MODELS; m++) {
        if (w->mod[m].state != SLOT_ON)
            continue;
        int k = 0, first = -1;
        for (int s = 0; s < MAX_STREAMS; s++)
            if (w->st[s].state == SLOT_ON && w->st[s].m == m) {
                k++;
                if (first < 0)
                    first = s;
            }
        if (!k)
            continue;
        int f = free_slots(w, first);
        int share = f / k;
        if (share <= 0) {
            /* Fewer free slots than streams: read one stream, rotating by the clock. */
            if (f <= 0)
                continue;
            int pick = (int)((md_mono_ns() / 1000000u) % (uint64_t)k);
            for (int s = 0; s < MAX_STREAMS; s++)
                if (w->st[s].state == SLOT_ON && w->st[s].m == m && pick-- == 0)
                    which[n++] = s;
            share = 1;
        } else {
            for (int s = 0; s < MAX_STREAMS; s++)
                if (w->st[s].state == SLOT_ON && w->st[s].m == m)
                    which[n++] = s;
        }
        count = count == 0 || share < count ? share : count;
    }
    if (!n) {
        /* Nothing to read (no model, or every slot busy): wait as a blocked read would. */
        for (int t = 0; t < block_ms && !*w->stop; t += 20)
            usleep(20000);
        return 0;
    }
    char cnt[16], blk[16];
    snprintf(cnt, sizeof cnt, "%d", count);
    snprintf(blk, sizeof blk, "%d", block_ms);
    int k = 0;
    argv[k++] = "XREADGROUP";
    argv[k++] = "GROUP";
    argv[k++] = Q_GROUP;
    argv[k++] = w->me;
    argv[k++] = "COUNT";
    argv[k++] = cnt;
    if (block_ms > 0) {
        argv[k++] = "BLOCK";
        argv[k++] = blk;
    }
    argv[k++] = "STREAMS";
    for (int i = 0; i < n; i++)
        argv[k++] = w->st[which[i]].key;
    for (int i = 0; i < n; i++)
        argv[k++] = ">";
    size_t lens[8 + 2 * MAX_STREAMS];
    for (int i = 0; i < k; i++)
        lens[i] = strlen(argv[i]);
    md_err e = {0};
    redisReply *rep = md_redis_cmd_argv(w->r, k, argv, lens, &e);
    if (!rep) {
        w->broken = 1;
        return 0;
    }
    int got = 0;
    if (rep->type == REDIS_REPLY_ERROR) {
        MD_WARN("worker", "XREADGROUP: %s", rep->str);
        if (!strncmp(rep->str, "NOGROUP", 7))
            w->gen = 0; /* the stream or group vanished: set it up again */
    } else if (rep->type == REDIS_REPLY_ARRAY) {
        for (size_t i = 0; i < rep->elements; i++) {
            redisReply *st = rep->element[i];
            if (st->type != REDIS_REPLY_ARRAY || st->elements != 2)
                continue;
            int s = -1;
            for (int j = 0; j < n && s < 0; j++)
                if (!strcmp(w->st[which[j]].key, st->element[0]->str))
                    s = which[j];
            if (s < 0)
                continue;
            got += (int)st->element[1]->elements;
            take_all(w, s, st->element[1], 0);
        }
    }
    freeReplyObject(rep);
    return got;
}

/* XAUTOCLAIM entries idle past the visibility timeout (a crashed or stuck worker's), on every
 * stream being read: the plain and the class streams alike. */
static void take_over(wk *w) {
    md_err e = {0};
    for (int s = 0; s < MAX_STREAMS && !w->broken; s++) {
        int f = free_slots(w, s);
        if (f <= 0)
            continue;
        redisReply *rep = md_redis_cmd(w->r, &e, "XAUTOCLAIM %s %s %s %d %s COUNT %d", w->st[s].key,
                                       Q_GROUP, w->me, w->cfg->visibility_ms, w->st[s].cursor, f);
        if (!rep) {
            w->broken = 1;
            return;
        }
        if (rep->type == REDIS_REPLY_ARRAY && rep->elements >= 2) {
            if (rep->element[0]->str)
                snprintf(w->st[s].cursor, ENTRY_ID_MAX, "%s", rep->element[0]->str);
            redisReply *entries = rep->element[1];
            if (entries->elements)
                MD_INFO("worker", "took over %zu entries of %s idle past %d ms", entries->elements,
                        w->st[s].key, w->cfg->visibility_ms);
            take_all(w, s, entries, 1);
            /* Redis 7 lists entries deleted from the stream: ack them away. */
            if (rep->elements >= 3 && rep->element[2]->type == REDIS_REPLY_ARRAY)
                for (size_t i = 0; i < rep->element[2]->elements && !w->broken; i++)
                    ack_only(w, s, rep->element[2]->element[i]->str);
        } else if (rep->type == REDIS_REPLY_ERROR) {
            MD_WARN("worker", "XAUTOCLAIM %s: %s", w->st[s].key, rep->str);
        }
        freeReplyObject(rep);
    }
}

/* Entries still pending for our own consumer name: a worker restarted with the same --id
 * after a crash resumes them at once instead of waiting out the visibility timeout. */
static void take_own(wk *w) {
    if (w->device_failed)
        return; /* stopping: what was handed back is others' now, not to be resumed */
    md_err e = {0};
    for (int s = 0; s < MAX_STREAMS && !w->broken; s++) {
        char start[ENTRY_ID_MAX] = "0";
        for (;;) {
            int f = free_slots(w, s);
            if (f <= 0)
                break;
            redisReply *rep =
                md_redis_cmd(w->r, &e, "XREADGROUP GROUP %s %s COUNT %d STREAMS %s %s", Q_GROUP,
                             w->me, f, w->st[s].key, start);
            if (!rep) {
                w->broken = 1;
                return;
            }
            redisReply *entries = NULL;
            if (rep->type == REDIS_REPLY_ARRAY && rep->elements == 1 &&
                rep->element[0]->type == REDIS_REPLY_ARRAY && rep->element[0]->elements == 2)
                entries = rep->element[0]->element[1];
            size_t n = entries && entries->type == REDIS_REPLY_ARRAY ? entries->elements : 0;
            if (n) {
                MD_INFO("worker", "resuming %zu entries of %s left pending by a previous %s", n,
                        w->st[s].key, w->me);
                redisReply *last = entries->element[n - 1];
                if (last->type == REDIS_REPLY_ARRAY && last->elements >= 1 && last->element[0]->str)
                    snprintf(start, sizeof start, "%s", last->element[0]->str);
                take_all(w, s, entries, 1);
            }
            freeReplyObject(rep);
            if (!n)
                break;
        }
    }
}

/* XCLAIM our running entries to ourselves (JUSTID: no delivery count bump), resetting their
 * idle time so nobody takes them over; draining streams included. idle_ms > 0 instead marks
 * them idle that long: the hand-back on stop, so another worker takes them over at once. */
static void renew(wk *w, long long idle_ms, int handback_only) {
    redisContext *c = md_redis_ctx(w->r);
    int sent = 0;
    for (int s = 0; s < MAX_STREAMS; s++) {
        if (w->st[s].state == SLOT_FREE)
            continue;
        model *md = &w->mod[w->st[s].m];
        int n = 0;
        for (int i = 0; i < md->n_jobs; i++)
            n += md->jobs[i].used && md->jobs[i].s == s && (!handback_only || md->jobs[i].handback);
        if (!n)
            continue;
        const char **argv = malloc((size_t)(n + 8) * sizeof *argv);
        size_t *lens = malloc((size_t)(n + 8) * sizeof *lens);
        if (!argv || !lens) {
            free(argv);
            free(lens);
            return;
        }
        char idle[32];
        snprintf(idle, sizeof idle, "%lld", idle_ms);
        int k = 0;
        argv[k++] = "XCLAIM";
        argv[k++] = w->st[s].key;
        argv[k++] = Q_GROUP;
        argv[k++] = w->me;
        argv[k++] = "0";
        for (int i = 0; i < md->n_jobs; i++)
            if (md->jobs[i].used && md->jobs[i].s == s && (!handback_only || md->jobs[i].handback))
                argv[k++] = md->jobs[i].id;
        if (idle_ms > 0) {
            argv[k++] = "IDLE";
            argv[k++] = idle;
        }
        argv[k++] = "JUSTID";
        for (int i = 0; i < k; i++)
            lens[i] = strlen(argv[i]);
        redisAppendCommandArgv(c, k, argv, lens);
        free(argv);
        free(lens);
        sent++;
    }
    md_err e = {0};
    for (int i = 0; i < sent; i++) {
        redisReply *rep = md_redis_get_reply(w->r, &e);
        if (!rep) {
            w->broken = 1;
            return;
        }
        freeReplyObject(rep);
    }
}

static void heartbeat(wk *w, const char *state, double dt_s) {
    json_t *models = json_array(), *devices = json_array();
    char replicas[1024] = "";
    size_t used = 0;
    for (int m = 0; m < WK_MAX_MODELS; m++) {
        model *md = &w->mod[m];
        if (md->state == SLOT_FREE)
            continue;
        json_array_append_new(models, json_pack("{s:s, s:s, s:i, s:i}", "model", md->name, "runner",
                                                wk_runner_kind(md->runner), "capacity",
                                                wk_runner_capacity(md->runner), "live",
                                                wk_runner_live(md->runner)));
        if (md->state == SLOT_ON && md->replicas[0] && used < sizeof replicas)
            used += (size_t)snprintf(replicas + used, sizeof replicas - used, "%s%s",
                                     used ? "," : "", md->replicas);
    }
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGE_SIZE);
    double tps = dt_s > 0 ? (double)(w->n_tokens - w->tokens_at_hb) / dt_s : 0;
    w->tokens_at_hb = w->n_tokens;
    json_t *dev = json_pack("{s:s, s:I, s:f}", "type", dev_type(w, -1), "memory_bytes",
                            w->gpu_name[0]         ? (json_int_t)w->gpu_bytes
                            : pages > 0 && psz > 0 ? (json_int_t)pages * psz
                                                   : 0,
                            "tokens_per_s", tps);
    if (dev && w->gpu_name[0]) /* the scheduler recognises the type by the driver's name */
        json_object_set_new(dev, "name", json_string(w->gpu_name));
    json_array_append_new(devices, dev);
    json_t *doc = json_pack(
        "{s:s, s:s, s:I, s:s, s:o, s:o, s:I, s:I, s:I, s:I, s:i, s:f, s:f}", "worker", w->me,
        "host", w->host, "pid", (json_int_t)getpid(), "state", state, "models", models, "devices",
        devices, "started_at", (json_int_t)w->started_ms, "last_seen", (json_int_t)md_wall_ms(),
        "completed", (json_int_t)w->n_ok, "failed", (json_int_t)w->n_failed, "in_flight", w->live,
        "tokens_per_s", tps, "usd_per_hour", w->cfg->usd_per_hour);
    /* `devices` and `state` also as fields of their own: the scheduler reads those two.
     * `plan_version` and `replicas`: what this worker follows (--follow-plan). */
    char *s = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
    char *ds = doc ? json_dumps(json_object_get(doc, "devices"), JSON_COMPACT) : NULL;
    json_decref(doc);
    if (!s || !ds) {
        free(s);
        free(ds);
        return;
    }
    md_err e = {0};
    redisReply *rep = md_redis_cmd(
        w->r, &e,
        "HSET %s json %s devices %s state %s last_seen %lld plan_version %lld replicas %s", w->wkey,
        s, ds, state, (long long)md_wall_ms(), w->plan_applied, replicas);
    free(s);
    free(ds);
    if (!rep) {
        w->broken = 1;
        return;
    }
    freeReplyObject(rep);
    rep = md_redis_cmd(w->r, &e, "PEXPIRE %s %d", w->wkey, 3 * w->cfg->heartbeat_ms);
    if (!rep)
        w->broken = 1;
    else
        freeReplyObject(rep);
}

/* ---- models and streams ----------------------------------------------------------------- */

static int find_model(wk *w, const char *name) {
    for (int m = 0; m < WK_MAX_MODELS; m++)
        if (w->mod[m].state != SLOT_FREE && !strcmp(w->mod[m].name, name))
            return m;
    return -1;
}

static void after_watchdog(wk *w, const char *why);
static void watch_streams(wk *w);

/* Open a model's runner and job slots in a free model slot, under the watchdog (its load
 * limit; heartbeat and leases kept alive meanwhile). Returns the slot or an error. */
static int add_model(wk *w, const char *name, md_err *e) {
    int m = -1;
    for (int k = 0; k < WK_MAX_MODELS && m < 0; k++)
        if (w->mod[k].state == SLOT_FREE)
            m = k;
    if (m < 0)
        return md_errf(e, MD_EINVAL, "at most %d models at a time", WK_MAX_MODELS);
    model *md = &w->mod[m];
    memset(md, 0, sizeof *md);
    if (w->wd) {
        watch_streams(w); /* what it hands back or keeps leased: the streams served so far */
        snprintf(w->load_what, sizeof w->load_what, "loading %s", name);
        wk_watchdog_enter(w->wd, w->load_what, w->load_limit_ms, 1);
    }
    int rc = wk_runner_open(name, &w->cfg->runner, &md->runner, e);
    if (w->wd) {
        wk_watchdog_leave(w->wd);
        if (wk_watchdog_fired(w->wd)) { /* it gave up on the load: so does the worker */
            if (!rc)
                wk_runner_close(md->runner);
            md->runner = NULL;
            char why[sizeof w->dev_err.msg];
            snprintf(why, sizeof why,
                     "loading %s ran past the %d ms limit (--load-timeout-ms): the device looks "
                     "hung",
                     name, w->load_limit_ms);
            after_watchdog(w, why);
            return md_errf(e, MD_EDEVICE, "%s", why);
        }
    }
    if (rc)
        return rc;
    md->n_jobs = wk_runner_capacity(md->runner);
    md->jobs = calloc((size_t)md->n_jobs, sizeof *md->jobs);
    if (!md->jobs) {
        wk_runner_close(md->runner);
        md->runner = NULL;
        return md_errf(e, MD_ENOMEM, "out of memory");
    }
    snprintf(md->name, sizeof md->name, "%s", name);
    md->state = SLOT_ON;
    return m;
}

/* Start reading a stream of model m (again, when it was draining). */
static int add_stream(wk *w, int m, const char *key, md_err *e) {
    int s = -1;
    for (int k = 0; k < MAX_STREAMS; k++)
        if (w->st[k].state != SLOT_FREE && w->st[k].m == m && !strcmp(w->st[k].key, key)) {
            w->st[k].state = SLOT_ON;
            return 0;
        }
    for (int k = 0; k < MAX_STREAMS && s < 0; k++)
        if (w->st[k].state == SLOT_FREE)
            s = k;
    if (s < 0)
        return md_errf(e, MD_EINVAL, "more than %d streams", MAX_STREAMS);
    int rc = w->r ? create_group(w, key, e) : 0;
    if (rc)
        return rc;
    w->st[s].state = SLOT_ON;
    w->st[s].m = m;
    w->streams_gen++;
    snprintf(w->st[s].key, sizeof w->st[s].key, "%s", key);
    snprintf(w->st[s].cursor, ENTRY_ID_MAX, "0-0");
    return 0;
}

/* Free what draining left behind: streams with no running entry and no unwritten answer,
 * then models with no stream left. */
static void reap(wk *w) {
    for (int s = 0; s < MAX_STREAMS; s++) {
        if (w->st[s].state != SLOT_DRAIN)
            continue;
        model *md = &w->mod[w->st[s].m];
        int busy = 0;
        for (int i = 0; i < md->n_jobs && !busy; i++)
            busy = md->jobs[i].used && md->jobs[i].s == s;
        for (int i = 0; i < w->n_ans && !busy; i++)
            busy = w->ans[i].s == s;
        if (!busy) {
            w->st[s].state = SLOT_FREE;
            w->streams_gen++;
        }
    }
    for (int m = 0; m < WK_MAX_MODELS; m++) {
        model *md = &w->mod[m];
        if (md->state != SLOT_DRAIN)
            continue;
        int streams = 0;
        for (int s = 0; s < MAX_STREAMS; s++)
            streams += w->st[s].state != SLOT_FREE && w->st[s].m == m;
        if (streams)
            continue;
        MD_INFO("worker", "model %s drained and closed", md->name);
        wk_runner_close(md->runner);
        free(md->jobs);
        memset(md, 0, sizeof *md);
    }
}

/* Serve what the plan gives this worker: models no longer named drain (their running
 * requests finish and are written; nothing new is read), new ones are opened, and each
 * served model reads P q:{M} plus the class streams of its replicas. */
static void apply_plan(wk *w, const json_t *plan) {
    q_assign as[Q_ASSIGN_MAX];
    md_err e = {0};
    int n = plan ? q_plan_assignment(plan, w->me, as, &e) : 0;
    long long version = plan ? q_plan_version(plan) : -1;
    if (n < 0) {
        MD_ERROR("worker", "plan v%lld: %s; keeping what is served", version, e.msg);
        w->plan_applied = version;
        return;
    }
    for (int m = 0; m < WK_MAX_MODELS; m++) {
        model *md = &w->mod[m];
        if (md->state == SLOT_FREE)
            continue;
        int keep = 0;
        for (int a = 0; a < n; a++)
            keep |= !strcmp(as[a].model, md->name);
        if (!keep && md->state == SLOT_ON) {
            MD_INFO("worker", "plan v%lld moves %s away: finishing %d running request(s)", version,
                    md->name, wk_runner_live(md->runner));
            md->state = SLOT_DRAIN;
        }
        for (int s = 0; s < MAX_STREAMS; s++)
            if (w->st[s].state != SLOT_FREE && w->st[s].m == m)
                w->st[s].state = SLOT_DRAIN; /* re-enabled below when still wanted */
    }
    for (int a = 0; a < n && !w->device_failed; a++) {
        int m = find_model(w, as[a].model);
        if (m < 0) {
            MD_INFO("worker", "plan v%lld: loading %s (replicas %s)", version, as[a].model,
                    as[a].replicas);
            if ((m = add_model(w, as[a].model, &e)) < 0) {
                MD_ERROR("worker", "plan v%lld: cannot serve %s: %s", version, as[a].model, e.msg);
                continue;
            }
        }
        model *md = &w->mod[m];
        md->state = SLOT_ON;
        snprintf(md->replicas, sizeof md->replicas, "%s", as[a].replicas);
        char key[Q_KEY_MAX];
        q_key_queue(key, w->prefix, md->name);
        int rc = add_stream(w, m, key, &e);
        for (int c = 0; c < as[a].n_classes && !rc; c++) {
            q_key_class(key, w->prefix, md->name, as[a].classes[c]);
            rc = add_stream(w, m, key, &e);
        }
        if (rc) {
            MD_ERROR("worker", "plan v%lld: %s: %s", version, md->name, e.msg);
            if (e.code == MD_EREDIS)
                w->broken = 1;
        }
    }
    w->plan_applied = version;
    w->last_hb = 0; /* show the switch in the heartbeat at once */
    int served = 0;
    for (int m = 0; m < WK_MAX_MODELS; m++)
        served += w->mod[m].state == SLOT_ON;
    MD_INFO("worker", "following plan v%lld: %d model(s) here", version, served);
    reap(w);
    take_own(w);
}

/* --follow-plan: look at P plan:version; when it differs from what was applied, read the plan
 * and apply it. A plan:version ahead of the plan document (the scheduler bumps it first) is
 * looked at again next time. */
static void check_plan(wk *w) {
    char vkey[Q_KEY_MAX];
    snprintf(vkey, sizeof vkey, "%splan:version", w->prefix);
    md_err e = {0};
    redisReply *rep = md_redis_cmd(w->r, &e, "GET %s", vkey);
    if (!rep) {
        w->broken = 1;
        return;
    }
    long long seen = rep->type == REDIS_REPLY_STRING ? atoll(rep->str) : -1;
    freeReplyObject(rep);
    if (seen == w->plan_seen)
        return;
    json_t *plan = NULL;
    int rc = q_plan_get(w->r, w->prefix, &plan, &e);
    if (rc == MD_EREDIS) {
        w->broken = 1;
        return;
    }
    if (rc) {
        MD_ERROR("worker", "%s; keeping what is served", e.msg);
        w->plan_seen = seen;
        return;
    }
    long long v = plan ? q_plan_version(plan) : -1;
    if (v != w->plan_applied)
        apply_plan(w, plan);
    if (v >= seen)
        w->plan_seen = seen;
    json_decref(plan);
}

/* ---- the loop --------------------------------------------------------------------------- */

static int n_served(wk *w) {
    int n = 0;
    for (int m = 0; m < WK_MAX_MODELS; m++)
        n += w->mod[m].state != SLOT_FREE;
    return n;
}

/* Requests whose device failed go back to the stream marked idle past the visibility
 * timeout (as on stop), so another worker takes them over at once; the takeover counts a
 * delivery, so a request that breaks every device it runs on ends in the DLQ. */
static void hand_back(wk *w) {
    int n = 0;
    for (int m = 0; m < WK_MAX_MODELS; m++)
        for (int i = 0; i < w->mod[m].n_jobs; i++)
            n += w->mod[m].jobs[i].used && w->mod[m].jobs[i].handback;
    if (!n)
        return;
    if (!w->broken)
        renew(w, (long long)w->cfg->visibility_ms + 1000, 1);
    for (int m = 0; m < WK_MAX_MODELS; m++)
        for (int i = 0; i < w->mod[m].n_jobs; i++) {
            job *j = &w->mod[m].jobs[i];
            if (j->used && j->handback) {
                j->used = 0;
                j->handback = 0;
                w->live--;
            }
        }
    w->n_handed_back += n;
    MD_WARN("worker", "handed back %d request(s) of a failed device to other workers", n);
}

/* Tell the watchdog which streams hold this worker's entries, when that changed. */
static void watch_streams(wk *w) {
    if (!w->wd || w->wd_gen == w->streams_gen)
        return;
    const char *keys[MAX_STREAMS];
    int n = 0;
    for (int s = 0; s < MAX_STREAMS; s++)
        if (w->st[s].state != SLOT_FREE)
            keys[n++] = w->st[s].key;
    wk_watchdog_set_streams(w->wd, keys, n);
    w->wd_gen = w->streams_gen;
}

/* The watchdog fired while a step ran and has handed back every entry this worker held:
 * forget them (renewing or handing them back again would take them from whoever has them
 * now), retire the watchdog (its work is done) and stop with the device's failure. */
static void after_watchdog(wk *w, const char *why) {
    long n = 0;
    for (int m = 0; m < WK_MAX_MODELS; m++)
        for (int i = 0; i < w->mod[m].n_jobs; i++) {
            job *j = &w->mod[m].jobs[i];
            n += j->used;
            j->used = 0;
            j->handback = 0;
        }
    w->live = 0;
    w->n_handed_back += wk_watchdog_handed_back(w->wd);
    wk_watchdog_stop(w->wd);
    w->wd = NULL;
    if (!w->device_failed) {
        w->device_failed = 1;
        md_errf(&w->dev_err, MD_EDEVICE, "%s", why);
    }
    MD_ERROR("worker",
             "what the watchdog gave up on returned (%s); %ld request(s) running were "
             "already handed back",
             why, n);
}

static void poll_all(wk *w, int wait_ms) {
    md_err e = {0};
    int one = n_served(w) == 1;
    watch_streams(w);
    for (int m = 0; m < WK_MAX_MODELS; m++) {
        model *md = &w->mod[m];
        if (md->state == SLOT_FREE || wk_runner_live(md->runner) <= 0)
            continue;
        int guard = w->wd && w->step_limit_ms > 0;
        if (guard)
            wk_watchdog_enter(w->wd, "a device step", w->step_limit_ms, 0);
        int rc = wk_runner_poll(md->runner, one ? wait_ms : 0, on_done, w, &e);
        if (guard) {
            wk_watchdog_leave(w->wd);
            if (wk_watchdog_fired(w->wd)) {
                char why[128];
                snprintf(why, sizeof why,
                         "a device step ran past the %d ms limit: the device looks hung",
                         w->step_limit_ms);
                after_watchdog(w, why);
                return;
            }
        }
        if (rc) {
            MD_ERROR("worker", "model %s: %s", md->name, e.msg);
            if (!w->device_failed) {
                w->device_failed = 1;
                md_errf(&w->dev_err, e.code ? e.code : MD_EDEVICE, "model %s: %s", md->name, e.msg);
            }
        }
    }
    hand_back(w);
}

/* Spread the wall time since the last tick over the running jobs (the cost share). */
static void tick(wk *w) {
    uint64_t now = md_mono_ns();
    double dt = (double)(now - w->last_tick) / 1e9;
    w->last_tick = now;
    if (w->live <= 0)
        return;
    double each = dt / w->live;
    for (int m = 0; m < WK_MAX_MODELS; m++)
        for (int i = 0; i < w->mod[m].n_jobs; i++)
            if (w->mod[m].jobs[i].used)
                w->mod[m].jobs[i].share_s += each;
}

static void periodic(wk *w, int stopping) {
    uint64_t now = md_mono_ns();
    uint64_t vis = (uint64_t)w->cfg->visibility_ms * 1000000ull;
    if (w->live > 0 && now - w->last_lease > vis / 3) {
        renew(w, 0, 0);
        w->last_lease = now;
    }
    if (!stopping && !w->broken && w->cfg->follow_plan &&
        now - w->last_plan > (uint64_t)w->cfg->plan_check_ms * 1000000ull) {
        check_plan(w);
        w->last_plan = md_mono_ns();
    }
    if (!w->broken)
        reap(w);
    if (!w->broken && now - w->last_hb > (uint64_t)w->cfg->heartbeat_ms * 1000000ull) {
        heartbeat(w, stopping ? "draining" : "running", (double)(now - w->last_hb) / 1e9);
        w->last_hb = now;
    }
    uint64_t claim_every = vis / 2 < 5000000000ull ? vis / 2 : 5000000000ull;
    if (!stopping && !w->broken && now - w->last_claim > claim_every) {
        take_over(w);
        w->last_claim = md_mono_ns();
    }
}

/* The models of the command line, each read from P q:{M}. */
static int open_all(wk *w, const wk_config *cfg, md_err *e) {
    for (int i = 0; i < cfg->n_models; i++) {
        int m = add_model(w, cfg->models[i], e);
        if (m < 0)
            return m;
        char key[Q_KEY_MAX];
        q_key_queue(key, w->prefix, cfg->models[i]);
        int rc = add_stream(w, m, key, e);
        if (rc)
            return rc;
    }
    return 0;
}

static void close_all(wk *w) {
    wk_watchdog_stop(w->wd);
    w->wd = NULL;
    for (int m = 0; m < WK_MAX_MODELS; m++) {
        if (w->mod[m].runner)
            wk_runner_close(w->mod[m].runner);
        free(w->mod[m].jobs);
    }
    for (int i = 0; i < w->n_ans; i++)
        free(w->ans[i].line);
    free(w->ans);
    md_redis_close(w->r);
}

int wk_run(const wk_config *cfg, volatile sig_atomic_t *stop, md_err *e) {
    if (cfg->n_models <= 0 && !cfg->follow_plan)
        return md_errf(e, MD_EINVAL,
                       "no model to serve (give --model NAME, e.g. --model echo, or "
                       "--follow-plan)");
    if (cfg->n_models > 0 && cfg->follow_plan)
        return md_errf(e, MD_EINVAL,
                       "--model and --follow-plan exclude each other: a worker serves either "
                       "the models it is given or those the plan gives it");
    if (cfg->visibility_ms < 100 || cfg->max_attempts < 1 || cfg->heartbeat_ms < 100 ||
        (cfg->follow_plan && cfg->plan_check_ms < 10))
        return md_errf(e, MD_EINVAL,
                       "visibility must be >= 100 ms, max_attempts >= 1, the heartbeat >= 100 ms "
                       "and the plan check >= 10 ms");
    wk w = {0};
    w.cfg = cfg;
    w.stop = stop;
    w.plan_applied = -1;
    w.plan_seen = -2;
    snprintf(w.prefix, sizeof w.prefix, "%s", cfg->prefix ? cfg->prefix : "medley:");
    int rc = q_prefix_check(w.prefix, e);
    if (rc)
        return rc;
    gethostname(w.host, sizeof w.host - 1);
    if (cfg->id && *cfg->id) {
        snprintf(w.me, sizeof w.me, "%s", cfg->id);
    } else {
        char hex[9];
        md_random_hex(hex, sizeof hex, 8);
        snprintf(w.me, sizeof w.me, "%s-%d-%s", w.host, (int)getpid(), hex);
    }
    q_key_events(w.events, w.prefix);
    q_key_worker(w.wkey, w.prefix, w.me);
    w.started_ms = md_wall_ms();
    md_device_id did;
    md_device_info cd;
    md_err ce = {0};
    if (md_device_parse(cfg->runner.device, &did, &ce) == 0 && did.kind == MD_DEVICE_CUDA &&
        md_device_get(did.index, &cd, &ce) == 0) {
        snprintf(w.gpu_name, sizeof w.gpu_name, "%s", cd.name);
        w.gpu_bytes = cd.total_bytes;
    }

    /* The watchdog: a step past its limit (auto: 2 minutes on a CUDA device, none on the CPU)
     * or a load past its limit (auto: 10 minutes on a CUDA device, none on the CPU) means a
     * hung device; loads keep the heartbeat and leases alive. It runs from the first load on
     * and gets its Redis connection once the worker has one. */
    const char *dev = cfg->runner.device;
    int on_cuda = dev && !strncmp(dev, "cuda", 4);
    w.step_limit_ms = cfg->step_timeout_ms >= 0 ? cfg->step_timeout_ms : on_cuda ? 120000 : 0;
    w.load_limit_ms = cfg->load_timeout_ms >= 0 ? cfg->load_timeout_ms : on_cuda ? 600000 : 0;
    if ((rc = wk_watchdog_start(Q_GROUP, w.me, (long long)cfg->visibility_ms + 1000,
                                cfg->step_timeout_exit, &w.wd, e)))
        return rc;
    if ((rc = open_all(&w, cfg, e))) {
        close_all(&w);
        return rc;
    }
    md_redis_url u;
    if ((rc =
             md_redis_url_parse(cfg->redis_url ? cfg->redis_url : md_redis_default_url(), &u, e))) {
        close_all(&w);
        return rc;
    }
    if (cfg->connect_timeout_ms > 0)
        u.connect_timeout_ms = cfg->connect_timeout_ms;
    if (cfg->command_timeout_ms > 0)
        u.command_timeout_ms = cfg->command_timeout_ms;
    if (u.command_timeout_ms > 0 && u.command_timeout_ms <= cfg->block_ms + 1000)
        u.command_timeout_ms = cfg->block_ms + 1000; /* a BLOCKed read must not time out */
    if ((rc = md_redis_open(&u, &w.r, e)) || (rc = setup_conn(&w, e))) {
        close_all(&w);
        return rc;
    }
    if ((rc = wk_watchdog_connect(w.wd, &u, e))) {
        close_all(&w);
        return rc;
    }
    wk_watchdog_set_keepalive(w.wd, w.wkey, cfg->heartbeat_ms, 3 * cfg->heartbeat_ms,
                              cfg->visibility_ms / 3, cfg->visibility_ms);
    char where[700];
    md_redis_url_describe(&u, where, sizeof where);
    if (cfg->follow_plan)
        MD_INFO("worker", "worker %s following the plan at %splan from %s (device {%s}/0, type %s)",
                w.me, w.prefix, where, w.me, dev_type(&w, -1));
    else
        MD_INFO("worker", "worker %s serving %d model(s) from %s (first: %s, %s runner, %d slots)",
                w.me, cfg->n_models, where, w.mod[0].name, wk_runner_kind(w.mod[0].runner),
                wk_runner_capacity(w.mod[0].runner));

    if (w.step_limit_ms > 0 || w.load_limit_ms > 0)
        MD_INFO("worker",
                "watchdog: a step running over %d ms or a model load over %d ms (0: no "
                "limit) hands back every request and %s",
                w.step_limit_ms, w.load_limit_ms,
                cfg->step_timeout_exit ? "exits 1" : "stops the worker");
    take_own(&w);
    uint64_t t = md_mono_ns();
    w.last_tick = t;
    w.last_lease = t;
    w.last_claim = 0; /* take over at once: a restarted worker finds its predecessors' work */
    w.last_hb = 0;
    w.last_plan = 0;
    uint64_t stop_at = 0;
    int idle_reads = 0;
    for (;;) {
        if (w.broken || w.gen != md_redis_generation(w.r)) {
            if (w.broken)
                MD_WARN("worker", "lost Redis; reconnecting (%d answers held)", w.n_ans);
            if (heal(&w, 1))
                break; /* stopped while Redis is away: unacked entries are redelivered */
        }
        int stopping = *stop != 0 || w.device_failed;
        if (stopping && !stop_at) {
            stop_at = md_mono_ns();
            MD_INFO("worker", "stopping%s: finishing %d running request(s), grace %d ms",
                    w.device_failed ? " (a device failed)" : "", w.live, cfg->grace_ms);
        }
        tick(&w);
        poll_all(&w, idle_reads > 0 ? 5 : 0);
        flush(&w);
        if (w.broken)
            continue;
        periodic(&w, stopping);
        if (w.broken)
            continue;
        if (w.device_failed && !stopping)
            continue; /* read nothing more: the next turn stops */
        if (stopping) {
            if (w.live == 0 && w.n_ans == 0)
                break;
            if (md_mono_ns() - stop_at > (uint64_t)cfg->grace_ms * 1000000ull) {
                MD_WARN("worker", "grace period over: handing back %d running request(s)", w.live);
                renew(&w, (long long)cfg->visibility_ms + 1000, 0);
                flush(&w);
                break;
            }
            if (w.live > 0)
                poll_all(&w, 10);
            continue;
        }
        /* A blocked read must not outlast half a heartbeat period (the heartbeat key lives 3
         * periods) nor the plan check period while following a plan. */
        int block_max =
            cfg->block_ms < cfg->heartbeat_ms / 2 ? cfg->block_ms : cfg->heartbeat_ms / 2;
        if (cfg->follow_plan && cfg->plan_check_ms < block_max)
            block_max = cfg->plan_check_ms;
        int block = (w.live == 0 && w.n_ans == 0) ? block_max : 0;
        int got = read_new(&w, block);
        idle_reads = got == 0 ? idle_reads + 1 : 0;
    }
    if (!w.broken) {
        md_err e2 = {0};
        redisReply *rep = md_redis_cmd(w.r, &e2, "DEL %s", w.wkey);
        if (rep)
            freeReplyObject(rep);
    }
    MD_INFO("worker",
            "worker %s stopped: %lld completed, %lld failed, %d answer(s) not written "
            "(they will be redelivered)",
            w.me, w.n_ok, w.n_failed, w.n_ans);
    close_all(&w);
    if (w.device_failed)
        return md_errf(e, w.dev_err.code,
                       "%s (%ld request(s) it was running handed back to other "
                       "workers)",
                       w.dev_err.msg, w.n_handed_back);
    return 0;
}
