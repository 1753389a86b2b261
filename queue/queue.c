/* queue.c — see queue.h: keys, the Lua scripts of the batch lifecycle, submission. */
#include "queue/queue.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/sha.h>

#include "common/util.h"

void q_key_queue(char *out, const char *p, const char *m) {
    snprintf(out, Q_KEY_MAX, "%sq:{%s}", p, m);
}
void q_key_meta(char *out, const char *p, const char *b) {
    snprintf(out, Q_KEY_MAX, "%s{%s}:meta", p, b);
}
void q_key_out(char *out, const char *p, const char *b) {
    snprintf(out, Q_KEY_MAX, "%s{%s}:out", p, b);
}
void q_key_done(char *out, const char *p, const char *b) {
    snprintf(out, Q_KEY_MAX, "%s{%s}:done", p, b);
}
void q_key_ids(char *out, const char *p, const char *b) {
    snprintf(out, Q_KEY_MAX, "%s{%s}:ids", p, b);
}
void q_key_sent(char *out, const char *p, const char *b) {
    snprintf(out, Q_KEY_MAX, "%s{%s}:sent", p, b);
}
void q_key_class(char *out, const char *p, const char *m, const char *cls) {
    snprintf(out, Q_KEY_MAX, "%sq:{%s}:%s", p, m, cls);
}
void q_key_dlq(char *out, const char *p, const char *m) {
    snprintf(out, Q_KEY_MAX, "%sdlq:{%s}", p, m);
}
void q_key_worker(char *out, const char *p, const char *w) {
    snprintf(out, Q_KEY_MAX, "%sworker:{%s}", p, w);
}
void q_key_stage(char *out, const char *p, const char *replica, int stage) {
    snprintf(out, Q_KEY_MAX, "%sreplica:{%s}:stage:%d", p, replica, stage);
}
void q_key_batches(char *out, const char *p) {
    snprintf(out, Q_KEY_MAX, "%sbatches", p);
}
void q_key_events(char *out, const char *p) {
    snprintf(out, Q_KEY_MAX, "%sevents", p);
}

int q_prefix_check(const char *prefix, md_err *e) {
    size_t n = strlen(prefix);
    if (n > 64)
        return md_errf(e, MD_EINVAL, "key prefix '%s' is longer than 64 bytes", prefix);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)prefix[i];
        if (!isgraph(c) || c == '{' || c == '}')
            return md_errf(e, MD_EINVAL,
                           "key prefix '%s' may hold only printable characters without spaces "
                           "or braces",
                           prefix);
    }
    return 0;
}

void q_new_batch_id(char *out, size_t outsz) {
    char hex[25];
    md_random_hex(hex, sizeof hex, 24);
    snprintf(out, outsz, "batch_%s", hex);
}

int q_batch_id_check(const char *id, md_err *e) {
    size_t n = strlen(id);
    if (n == 0 || n >= Q_BATCH_ID_MAX)
        return md_errf(e, MD_EINVAL, "batch id '%s' must be 1..%d characters", id,
                       Q_BATCH_ID_MAX - 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)id[i];
        if (!isalnum(c) && c != '_' && c != '-' && c != '.')
            return md_errf(e, MD_EINVAL, "batch id '%s' may hold only [A-Za-z0-9_.-]", id);
    }
    return 0;
}

/* finish(st, m, now, channel, batch): the terminal state of a batch whose every line is
 * answered. Shared by the completion and seal scripts. */
#define Q_LUA_FINISH                                                                               \
    "local function finish(meta, st, deadline, now, channel, batch)\n"                             \
    "  local final = 'completed'\n"                                                                \
    "  if st == 'cancelling' then final = 'cancelled'\n"                                           \
    "  elseif tonumber(deadline) and tonumber(deadline) > 0 and tonumber(now) > "                  \
    "tonumber(deadline) then final = 'expired' end\n"                                              \
    "  redis.call('HSET', meta, 'status', final, 'finished_at', now)\n"                            \
    "  redis.call('PUBLISH', channel, cjson.encode({type='batch', batch=batch, "                   \
    "status=final}))\n"                                                                            \
    "  return final\n"                                                                             \
    "end\n"

/* KEYS: meta done out. ARGV: custom_id ok(1|0) line now_ms events_channel batch. */
const char q_complete_lua[] = Q_LUA_FINISH
    "if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end\n"
    "if redis.call('SADD', KEYS[2], ARGV[1]) == 0 then return 0 end\n"
    "redis.call('XADD', KEYS[3], '*', 'custom_id', ARGV[1], 'ok', ARGV[2], 'line', ARGV[3], "
    "'entry', ARGV[7] or '')\n"
    "if ARGV[2] == '1' then redis.call('HINCRBY', KEYS[1], 'completed', 1)\n"
    "else redis.call('HINCRBY', KEYS[1], 'failed', 1) end\n"
    "local m = redis.call('HMGET', KEYS[1], 'status', 'total', 'completed', 'failed', "
    "'started_at', 'deadline')\n"
    "if not m[5] or m[5] == '' or m[5] == '0' then redis.call('HSET', KEYS[1], 'started_at', "
    "ARGV[4]) end\n"
    "if (m[1] == 'in_progress' or m[1] == 'cancelling') and (tonumber(m[3]) or 0) + "
    "(tonumber(m[4]) or 0) >= (tonumber(m[2]) or 0) then\n"
    "  finish(KEYS[1], m[1], m[6], ARGV[4], ARGV[5], ARGV[6])\n"
    "end\n"
    "return 1\n";

/* KEYS: meta. ARGV: field value ... of the new batch hash. 1 when created, 0 when it
 * exists already. */
const char q_create_lua[] = "if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end\n"
                            "redis.call('HSET', KEYS[1], unpack(ARGV))\n"
                            "return 1\n";

/* KEYS: meta. ARGV: total now_ms events_channel batch. */
const char q_seal_lua[] = Q_LUA_FINISH
    "local m = redis.call('HMGET', KEYS[1], 'status', 'completed', 'failed', 'deadline')\n"
    "if not m[1] then return redis.error_reply('NOBATCH no such batch') end\n"
    "if m[1] ~= 'validating' and m[1] ~= 'cancelling' then\n"
    "  return redis.error_reply('BADSTATE batch is ' .. m[1]) end\n"
    "local st = m[1]\n"
    "if st == 'validating' then st = 'in_progress' end\n"
    "redis.call('HSET', KEYS[1], 'total', ARGV[1], 'status', st)\n"
    "if (tonumber(m[2]) or 0) + (tonumber(m[3]) or 0) >= tonumber(ARGV[1]) then\n"
    "  return finish(KEYS[1], st, m[4], ARGV[2], ARGV[3], ARGV[4])\n"
    "end\n"
    "redis.call('PUBLISH', ARGV[3], cjson.encode({type='batch', batch=ARGV[4], status=st}))\n"
    "return st\n";

/* KEYS: meta. ARGV: now_ms events_channel batch. */
const char q_cancel_lua[] = Q_LUA_FINISH
    "local m = redis.call('HMGET', KEYS[1], 'status', 'total', 'completed', 'failed', "
    "'deadline')\n"
    "if not m[1] then return redis.error_reply('NOBATCH no such batch') end\n"
    "local st = m[1]\n"
    "if st == 'completed' or st == 'failed' or st == 'cancelled' or st == 'expired' then\n"
    "  return redis.error_reply('BADSTATE batch is already ' .. st) end\n"
    "if st == 'cancelling' then return st end\n"
    "redis.call('HSET', KEYS[1], 'status', 'cancelling')\n"
    "if st == 'in_progress' and (tonumber(m[3]) or 0) + (tonumber(m[4]) or 0) >= "
    "(tonumber(m[2]) or 0) then\n"
    "  return finish(KEYS[1], 'cancelling', m[5], ARGV[1], ARGV[2], ARGV[3])\n"
    "end\n"
    "redis.call('PUBLISH', ARGV[2], cjson.encode({type='batch', batch=ARGV[3], "
    "status='cancelling'}))\n"
    "return 'cancelling'\n";

const char q_stage_del_lua[] =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end "
    "return 0";

void q_script_sha(const char *script, char out[41]) {
    unsigned char d[SHA_DIGEST_LENGTH];
    SHA1((const unsigned char *)script, strlen(script), d);
    for (int i = 0; i < SHA_DIGEST_LENGTH; i++)
        snprintf(out + 2 * i, 3, "%02x", d[i]);
}

int q_script_load(md_redis *r, const char *script, char out[41], md_err *e) {
    redisReply *rep = md_redis_cmd(r, e, "SCRIPT LOAD %s", script);
    if (!rep)
        return MD_EREDIS;
    int rc = 0;
    if (rep->type == REDIS_REPLY_ERROR && !strncmp(rep->str, "NOPERM", 6)) {
        /* A role without SCRIPT LOAD (medley-worker): EVALSHA by the SHA1 Redis would give
         * it, which works once a role that may load it did (docs/operations.md). */
        q_script_sha(script, out);
        rc = MD_ENOTFOUND;
        md_errf(e, rc, "SCRIPT LOAD refused (%s): medley's scripts must be loaded by a role "
                "that may (any `medley submit`, or medley-admin)", rep->str);
    } else if (rep->type != REDIS_REPLY_STRING || rep->len != 40) {
        rc = md_errf(e, MD_EINVAL, "SCRIPT LOAD failed: %s",
                     rep->type == REDIS_REPLY_ERROR ? rep->str : "unexpected reply");
    } else {
        memcpy(out, rep->str, 41);
    }
    freeReplyObject(rep);
    return rc;
}

int q_scripts_load_all(md_redis *r, md_err *e) {
    const char *all[] = {q_complete_lua, q_stage_del_lua};
    char sha[41];
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        int rc = q_script_load(r, all[i], sha, e);
        if (rc)
            return rc;
    }
    return 0;
}

static int reply_ok(redisReply *rep, const char *what, md_err *e) {
    if (!rep)
        return MD_EREDIS;
    if (rep->type == REDIS_REPLY_ERROR) {
        int rc = md_errf(e, MD_EREDIS, "%s: %s", what, rep->str);
        freeReplyObject(rep);
        return rc;
    }
    freeReplyObject(rep);
    return 0;
}

int q_batch_create(md_redis *r, const q_batch_spec *s, md_err *e) {
    char meta[Q_KEY_MAX], idx[Q_KEY_MAX];
    /* The workers' scripts, for a worker role that may run them (EVALSHA) but not load them. */
    int lrc = q_scripts_load_all(r, e);
    if (lrc)
        return lrc;
    q_key_meta(meta, s->prefix, s->batch);
    q_key_batches(idx, s->prefix);
    long long now = md_wall_ms();
    long long deadline = s->window_s > 0 ? now + s->window_s * 1000 : 0;
    /* EXISTS and HSET in one script, so two submitters of one --batch-id cannot both
     * create it (docs/protocol.md §3 step 3). */
    char nows[24], dls[24], prio[16];
    snprintf(nows, sizeof nows, "%lld", now);
    snprintf(dls, sizeof dls, "%lld", deadline);
    snprintf(prio, sizeof prio, "%d", s->priority);
    const char *argv[] = {"EVAL",      q_create_lua,  "1",        meta,
                          "status",    "validating",  "model",    s->model,
                          "endpoint",  s->endpoint ? s->endpoint : "",
                          "total",     "0",           "completed", "0",
                          "failed",    "0",           "created_at", nows,
                          "started_at", "0",          "finished_at", "0",
                          "deadline",  dls,           "priority", prio,
                          "input_file", s->input_file ? s->input_file : "",
                          "tenant",    s->tenant ? s->tenant : "default",
                          "input_sha", s->input_sha ? s->input_sha : ""};
    size_t n = sizeof argv / sizeof argv[0], lens[sizeof argv / sizeof argv[0]];
    for (size_t i = 0; i < n; i++)
        lens[i] = strlen(argv[i]);
    redisReply *rep = md_redis_cmd_argv(r, (int)n, argv, lens, e);
    if (!rep)
        return MD_EREDIS;
    int made = rep->type == REDIS_REPLY_INTEGER && rep->integer == 1;
    int rc = made ? 0 : rep->type == REDIS_REPLY_ERROR
                            ? md_errf(e, MD_EREDIS, "creating the batch: %s", rep->str)
                            : md_errf(e, MD_EINVAL, "batch %s already exists", s->batch);
    freeReplyObject(rep);
    if (rc)
        return rc;
    return reply_ok(md_redis_cmd(r, e, "ZADD %s %lld %s", idx, now, s->batch), "indexing the batch",
                    e);
}

#define Q_SUBMIT_CHUNK 1000 /* XADDs per round trip */

struct q_submitter {
    md_redis *r;
    char key[Q_KEY_MAX];
    char ids[Q_KEY_MAX]; /* P {B}:ids, the entry ids the batch has (readers check answers) */
    char sent[Q_KEY_MAX]; /* P {B}:sent, the custom_ids queued (a retry skips them) */
    char *cids[Q_SUBMIT_CHUNK]; /* custom_id of each pending XADD (malloc'd, or NULL) */
    char batch[Q_BATCH_ID_MAX];
    int pending;     /* appended, replies not read yet */
    long long total; /* confirmed queued */
};

int q_submitter_open(md_redis *r, const char *prefix, const char *batch, const char *model,
                     q_submitter **out, md_err *e) {
    q_submitter *s = calloc(1, sizeof *s);
    if (!s)
        return md_errf(e, MD_ENOMEM, "out of memory");
    s->r = r;
    q_key_queue(s->key, prefix, model);
    q_key_ids(s->ids, prefix, batch);
    q_key_sent(s->sent, prefix, batch);
    snprintf(s->batch, sizeof s->batch, "%s", batch);
    *out = s;
    return 0;
}

/* SADD key ids[2..n+1] in one command (ids[0..1] are filled here); 0 or the refusal. */
static int record_ids(q_submitter *s, const char *key, const char **ids, size_t *lens, int n,
                      md_err *e) {
    if (n == 0)
        return 0;
    ids[0] = "SADD";
    ids[1] = key;
    lens[0] = 4;
    lens[1] = strlen(key);
    redisReply *rep = md_redis_cmd_argv(s->r, n + 2, ids, lens, e);
    if (!rep)
        return MD_EREDIS;
    int rc = rep->type == REDIS_REPLY_ERROR
                 ? md_errf(e, MD_EREDIS, "recording the entries of batch %s: %s", s->batch,
                           rep->str)
                 : 0;
    freeReplyObject(rep);
    return rc;
}

int q_submitter_flush(q_submitter *s, long long *n_total, md_err *e) {
    int rc = 0, n = 0, nc = 0, want = s->pending, k = 0;
    redisReply **reps = calloc((size_t)want + 1, sizeof *reps);
    const char **ids = calloc((size_t)want + 2, sizeof *ids);
    const char **cids = calloc((size_t)want + 2, sizeof *cids);
    size_t *lens = calloc((size_t)want + 2, sizeof *lens);
    size_t *clens = calloc((size_t)want + 2, sizeof *clens);
    if (!reps || !ids || !lens || !cids || !clens)
        rc = md_errf(e, MD_ENOMEM, "out of memory");
    for (; s->pending > 0; s->pending--, k++) {
        redisReply *rep = md_redis_get_reply(s->r, e);
        if (!rep) {
            s->pending = 0;
            rc = MD_EREDIS;
            break;
        }
        if (rep->type == REDIS_REPLY_ERROR && !rc)
            rc = md_errf(e, MD_EREDIS, "XADD of batch %s failed: %s", s->batch, rep->str);
        if (rep->type == REDIS_REPLY_STRING && reps && cids) {
            ids[2 + n] = rep->str;
            lens[2 + n] = rep->len;
            reps[n++] = rep;
            if (s->cids[k]) {
                cids[2 + nc] = s->cids[k];
                clens[2 + nc++] = strlen(s->cids[k]);
            }
        } else {
            freeReplyObject(rep);
        }
    }
    /* Entries are counted once recorded: a line the batch has but readers would not trust
     * is not queued. */
    /* The entry ids first: a line recorded as sent but not as the batch's would be skipped by
     * a retry and its answer distrusted. A kill between the two SADDs leaves lines that a
     * retry queues again: the completion script answers each custom_id once. */
    if (!rc && !(rc = record_ids(s, s->ids, ids, lens, n, e)) &&
        !(rc = record_ids(s, s->sent, cids, clens, nc, e)))
        s->total += n;
    for (int i = 0; i < n; i++)
        freeReplyObject(reps[i]);
    for (int i = 0; i < k && i < Q_SUBMIT_CHUNK; i++) {
        free(s->cids[i]);
        s->cids[i] = NULL;
    }
    free(reps);
    free(ids);
    free(lens);
    free(cids);
    free(clens);
    if (n_total)
        *n_total = s->total;
    return rc;
}

int q_submit_line(q_submitter *s, const char *line, size_t len, md_err *e) {
    return q_submit_line_to(s, s->key, line, len, e);
}

int q_submit_line_to(q_submitter *s, const char *key, const char *line, size_t len, md_err *e) {
    return q_submit_line_cid(s, key, line, len, NULL, e);
}

int q_submit_line_cid(q_submitter *s, const char *key, const char *line, size_t len,
                      const char *cid, md_err *e) {
    if (!key)
        key = s->key;
    const char *argv[] = {"XADD", key, "*", "batch", s->batch, "line", line};
    size_t lens[] = {4, strlen(key), 1, 5, strlen(s->batch), 4, len};
    if (redisAppendCommandArgv(md_redis_ctx(s->r), 7, argv, lens) != REDIS_OK)
        return md_errf(e, MD_ENOMEM, "cannot buffer a Redis command");
    s->cids[s->pending] = cid ? strdup(cid) : NULL;
    /* 1000 commands per round trip: the pipeline stays a few MB at most and a 100k-line
     * file takes ~100 round trips. */
    if (++s->pending >= Q_SUBMIT_CHUNK)
        return q_submitter_flush(s, NULL, e);
    return 0;
}

void q_submitter_free(q_submitter *s) {
    if (!s)
        return;
    for (int i = 0; i < Q_SUBMIT_CHUNK; i++)
        free(s->cids[i]);
    free(s);
}

static int eval_status(md_redis *r, const char *script, const char *meta, int nargs,
                       const char **args, char *status_out, size_t status_sz, const char *what,
                       md_err *e) {
    const char *argv[10];
    size_t lens[10];
    argv[0] = "EVAL";
    argv[1] = script;
    argv[2] = "1";
    argv[3] = meta;
    for (int i = 0; i < nargs; i++)
        argv[4 + i] = args[i];
    for (int i = 0; i < 4 + nargs; i++)
        lens[i] = strlen(argv[i]);
    redisReply *rep = md_redis_cmd_argv(r, 4 + nargs, argv, lens, e);
    if (!rep)
        return MD_EREDIS;
    int rc = 0;
    if (rep->type == REDIS_REPLY_ERROR) {
        if (!strncmp(rep->str, "NOBATCH", 7))
            rc = md_errf(e, MD_ENOTFOUND, "%s: no such batch", what);
        else
            rc = md_errf(e, MD_EINVAL, "%s: %s", what,
                         !strncmp(rep->str, "BADSTATE ", 9) ? rep->str + 9 : rep->str);
    } else if (status_out && rep->type == REDIS_REPLY_STRING) {
        snprintf(status_out, status_sz, "%s", rep->str);
    }
    freeReplyObject(rep);
    return rc;
}

int q_batch_seal(md_redis *r, const char *prefix, const char *batch, long long total, md_err *e) {
    char meta[Q_KEY_MAX], ev[Q_KEY_MAX], tot[32], now[32];
    q_key_meta(meta, prefix, batch);
    q_key_events(ev, prefix);
    snprintf(tot, sizeof tot, "%lld", total);
    snprintf(now, sizeof now, "%lld", (long long)md_wall_ms());
    const char *args[] = {tot, now, ev, batch};
    return eval_status(r, q_seal_lua, meta, 4, args, NULL, 0, "sealing the batch", e);
}

int q_batch_cancel(md_redis *r, const char *prefix, const char *batch, char *status_out,
                   size_t status_sz, md_err *e) {
    char meta[Q_KEY_MAX], ev[Q_KEY_MAX], now[32];
    q_key_meta(meta, prefix, batch);
    q_key_events(ev, prefix);
    snprintf(now, sizeof now, "%lld", (long long)md_wall_ms());
    const char *args[] = {now, ev, batch};
    char what[128];
    snprintf(what, sizeof what, "cancelling %s", batch);
    return eval_status(r, q_cancel_lua, meta, 3, args, status_out, status_sz, what, e);
}

int q_batch_fail(md_redis *r, const char *prefix, const char *batch, const char *reason,
                 md_err *e) {
    char meta[Q_KEY_MAX], ev[Q_KEY_MAX];
    q_key_meta(meta, prefix, batch);
    q_key_events(ev, prefix);
    int rc = reply_ok(md_redis_cmd(r, e, "HSET %s status failed errors %s finished_at %lld", meta,
                                   reason, (long long)md_wall_ms()),
                      "marking the batch failed", e);
    if (rc)
        return rc;
    char msg[256];
    snprintf(msg, sizeof msg, "{\"type\":\"batch\",\"batch\":\"%s\",\"status\":\"failed\"}", batch);
    return reply_ok(md_redis_cmd(r, e, "PUBLISH %s %s", ev, msg), "publishing", e);
}

int q_status_terminal(const char *s) {
    return !strcmp(s, "completed") || !strcmp(s, "failed") || !strcmp(s, "cancelled") ||
           !strcmp(s, "expired");
}

int q_batch_get(md_redis *r, const char *prefix, const char *batch, q_batch_info *out, md_err *e) {
    memset(out, 0, sizeof *out);
    char meta[Q_KEY_MAX];
    q_key_meta(meta, prefix, batch);
    redisReply *rep = md_redis_cmd(r, e, "HGETALL %s", meta);
    if (!rep)
        return MD_EREDIS;
    if (rep->type != REDIS_REPLY_ARRAY || rep->elements == 0) {
        int rc = rep->type == REDIS_REPLY_ERROR
                     ? md_errf(e, MD_EREDIS, "HGETALL %s: %s", meta, rep->str)
                     : md_errf(e, MD_ENOTFOUND, "no batch %s", batch);
        freeReplyObject(rep);
        return rc;
    }
    snprintf(out->id, sizeof out->id, "%s", batch);
    snprintf(out->tenant, sizeof out->tenant, "default"); /* a hash without the field */
    for (size_t i = 0; i + 1 < rep->elements; i += 2) {
        const char *k = rep->element[i]->str, *v = rep->element[i + 1]->str;
        if (!k || !v)
            continue;
        if (!strcmp(k, "status"))
            snprintf(out->status, sizeof out->status, "%s", v);
        else if (!strcmp(k, "model"))
            snprintf(out->model, sizeof out->model, "%s", v);
        else if (!strcmp(k, "tenant"))
            snprintf(out->tenant, sizeof out->tenant, "%s", v);
        else if (!strcmp(k, "endpoint"))
            snprintf(out->endpoint, sizeof out->endpoint, "%s", v);
        else if (!strcmp(k, "errors"))
            snprintf(out->errors, sizeof out->errors, "%s", v);
        else if (!strcmp(k, "total"))
            out->total = atoll(v);
        else if (!strcmp(k, "completed"))
            out->completed = atoll(v);
        else if (!strcmp(k, "failed"))
            out->failed = atoll(v);
        else if (!strcmp(k, "created_at"))
            out->created_at = atoll(v);
        else if (!strcmp(k, "started_at"))
            out->started_at = atoll(v);
        else if (!strcmp(k, "finished_at"))
            out->finished_at = atoll(v);
        else if (!strcmp(k, "deadline"))
            out->deadline = atoll(v);
        else if (!strcmp(k, "priority"))
            out->priority = atoi(v);
        else if (!strcmp(k, "input_sha"))
            snprintf(out->input_sha, sizeof out->input_sha, "%s", v);
    }
    freeReplyObject(rep);
    return 0;
}
