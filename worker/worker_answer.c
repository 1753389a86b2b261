/* worker_answer.c — answers: each request the worker finishes or refuses becomes an OpenAI
 * Batch output line (with medley's fields: worker, device type, timings, cost share,
 * attempt) queued in wk.ans; wk_flush writes the queue with the completion script
 * (queue/queue.h), then XACKs and XDELs what the script took. It owns wk's ans, n_ans,
 * cap_ans and the counts n_ok, n_failed, n_tokens, and it keeps worker_int.h's invariant: an
 * entry is XACKed only after the script returned for it. */
#include "worker/worker_int.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"
#include "worker/logprobs.h"
#include "worker/tool_calls.h"

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

static json_t *medley_obj(wk *w, int m, double queue_ms, double prefill_ms, double decode_ms,
                          double share_s, long long attempt) {
    double cost = w->cfg->usd_per_hour * share_s / 3600.0;
    return json_pack("{s:s, s:[s], s:f, s:f, s:f, s:f, s:I}", "worker", w->me, "device_types",
                     wk_dev_type(w, m), "queue_ms", queue_ms, "prefill_ms", prefill_ms, "decode_ms",
                     decode_ms, "cost_usd", cost, "attempt", (json_int_t)attempt);
}

/* Queue an answer whose document is doc (stolen), written with json_dumps flags; code: the
 * error code of a failed one. */
static void push_line(wk *w, int s, const char *entry_id, const char *batch, const char *custom_id,
                      const char *code, json_t *doc, size_t flags) {
    int ok = code == NULL;
    char *line = json_dumps(doc, flags);
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
    wk_metrics_answered(w, s, code);
}

static void push_answer(wk *w, int s, const char *entry_id, const char *batch,
                        const char *custom_id, const char *code, json_t *doc) {
    push_line(w, s, entry_id, batch, custom_id, code, doc, JSON_COMPACT);
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
void wk_answer_invalid(wk *w, int s, const char *entry_id, const char *batch, const char *custom_id,
                       const q_verr *ve, double queue_ms, long long attempt) {
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
    push_answer(w, s, entry_id, batch, custom_id, ve->code, doc);
}

/* A request that never reached a model (cancelled, expired, dead-lettered, server error):
 * response null, error {code, message}. */
void wk_answer_error(wk *w, int s, const char *entry_id, const char *batch, const char *custom_id,
                     const char *code, const char *message, double queue_ms, long long attempt) {
    char id[48];
    ids(id, "batch_req_");
    json_t *doc =
        json_pack("{s:s, s:o, s:n, s:{s:s, s:s}, s:o}", "id", id, "custom_id", cid_json(custom_id),
                  "response", "error", "code", code, "message", message, "medley",
                  medley_obj(w, stream_model(w, s), queue_ms, 0, 0, 0, attempt));
    push_answer(w, s, entry_id, batch, custom_id, code, doc);
}

/* A chat answer's message: the text as content, or function calls as OpenAI writes them
 * (tool_calls [{id, type, function {name, arguments}}], content null unless the model wrote
 * text before its calls). */
static json_t *chat_message(const wk_result *res) {
    if (res->n_calls <= 0)
        return json_pack("{s:s, s:s}", "role", "assistant", "content", res->text);
    json_t *list = json_array();
    for (int i = 0; list && i < res->n_calls; i++) {
        char cid[48];
        ids(cid, "call_");
        json_array_append_new(list, json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", cid, "type",
                                              "function", "function", "name", res->calls[i].name,
                                              "arguments", res->calls[i].arguments));
    }
    json_t *content = res->text && res->text[0] ? json_string(res->text) : json_null();
    return json_pack("{s:s, s:o, s:o}", "role", "assistant", "content", content, "tool_calls",
                     list ? list : json_array());
}

/* A constrained answer's report in its medley object: compile_ms (0 when the grammar was
 * in the worker's cache), compile_cached, and schema_relaxed: the keywords not enforced
 * under strict: false, as "keyword at pointer" strings. */
static void constraint_report(json_t *med, const wk_result *res) {
    json_t *relaxed = json_array();
    const char *p = res->schema_relaxed ? res->schema_relaxed : "";
    while (relaxed && *p) {
        size_t n = strcspn(p, ",");
        size_t a = 0;
        while (a < n && p[a] == ' ')
            a++;
        if (n > a)
            json_array_append_new(relaxed, json_stringn(p + a, n - a));
        p += n + (p[n] == ',');
    }
    json_object_set_new(med, "compile_ms", json_real(res->compile_ms));
    json_object_set_new(med, "compile_cached", json_boolean(res->compile_cached));
    json_object_set_new(med, "schema_relaxed", relaxed ? relaxed : json_array());
}

/* An embeddings answer: the runner's body with the served model's name. */
static void answer_embedding(wk *w, job *j, const wk_result *res) {
    char id[48], rid[48];
    ids(id, "batch_req_");
    ids(rid, "req_");
    int m = stream_model(w, j->s);
    json_t *body = json_copy(res->body); /* shallow: the runner's arrays are shared, not changed */
    if (body)
        json_object_set_new(body, "model", json_string(w->mod[m].name));
    json_t *med = medley_obj(w, m, j->queue_ms, res->prefill_ms, 0, j->share_s, j->attempt);
    json_t *doc = json_pack("{s:s, s:s, s:{s:i, s:s, s:o*}, s:n, s:o*}", "id", id, "custom_id",
                            j->custom_id, "response", "status_code", 200, "request_id", rid, "body",
                            body, "error", "medley", med);
    if (!doc) {
        wk_answer_error(w, j->s, j->id, j->batch, j->custom_id, "server_error",
                        "out of memory writing the answer", j->queue_ms, j->attempt);
        return;
    }
    w->n_tokens += res->prompt_tokens; /* the heartbeat's tokens/s: tokens embedded */
    /* 9 significant digits: every float32 of the vectors exactly, in about half the bytes
     * and formatting time of jansson's default 17 (docs/embeddings.md, "Bulk runs") */
    push_line(w, j->s, j->id, j->batch, j->custom_id, NULL, doc,
              JSON_COMPACT | JSON_REAL_PRECISION(9));
    wk_metrics_result(w, m, res, j->queue_ms, atoll(j->id),
                      w->cfg->usd_per_hour * j->share_s / 3600.0);
}

void wk_on_done(void *ctx, void *tag, const wk_result *res) {
    wk *w = ctx;
    job *j = tag;
    if (!j->used)
        return; /* dropped after the watchdog handed it back (a step that outran its limit) */
    if (res->device_lost && j->attempt < w->cfg->max_attempts) {
        j->handback = 1; /* stays used until wk_hand_back() gives the entry to others */
        return;
    }
    if (res->device_lost) {
        /* its last delivery: answered with the device's failure, not left to the DLQ with
         * only "delivered N times" */
        char msg[1200];
        snprintf(msg, sizeof msg, "the device failed on the last of %d attempts: %s",
                 w->cfg->max_attempts, res->error ? res->error : "device error");
        wk_answer_error(w, j->s, j->id, j->batch, j->custom_id, "server_error", msg, j->queue_ms,
                        j->attempt);
    } else if (j->cancelled) { /* an online request cancelled (P cancel:{R}) */
        wk_answer_error(w, j->s, j->id, j->batch, j->custom_id, "request_cancelled",
                        "the request was cancelled: its client went away, or the API gave up on it",
                        j->queue_ms, j->attempt);
    } else if (res->error) {
        wk_answer_error(w, j->s, j->id, j->batch, j->custom_id, "server_error", res->error,
                        j->queue_ms, j->attempt);
    } else if (res->body) {
        answer_embedding(w, j, res);
    } else {
        char id[48], rid[48], cid[48 + Q_BATCH_ID_MAX];
        ids(id, "batch_req_");
        ids(rid, "req_");
        if (j->online) /* the id the API's chunks carry from the start: its request id */
            snprintf(cid, sizeof cid, "%s%s", j->chat ? "chatcmpl-" : "cmpl-", j->batch);
        else
            ids(cid, j->chat ? "chatcmpl-" : "cmpl-");
        int m = stream_model(w, j->s);
        const char *model = w->mod[m].name;
        json_t *lp = wk_logprobs_json(res, j->chat);
        json_t *choice =
            j->chat ? json_pack("{s:i, s:o, s:s, s:o}", "index", 0, "message", chat_message(res),
                                "finish_reason", res->finish_reason, "logprobs", lp)
                    : json_pack("{s:i, s:s, s:s, s:o}", "index", 0, "text", res->text,
                                "finish_reason", res->finish_reason, "logprobs", lp);
        json_t *body = json_pack("{s:s, s:s, s:I, s:s, s:[o], s:{s:i, s:i, s:i}}", "id", cid,
                                 "object", j->chat ? "chat.completion" : "text_completion",
                                 "created", (json_int_t)(md_wall_ms() / 1000), "model", model,
                                 "choices", choice, "usage", "prompt_tokens", res->prompt_tokens,
                                 "completion_tokens", res->completion_tokens, "total_tokens",
                                 res->prompt_tokens + res->completion_tokens);
        json_t *med =
            medley_obj(w, m, j->queue_ms, res->prefill_ms, res->decode_ms, j->share_s, j->attempt);
        if (med && res->constrained)
            constraint_report(med, res);
        json_t *doc = json_pack("{s:s, s:s, s:{s:i, s:s, s:o}, s:n, s:o}", "id", id, "custom_id",
                                j->custom_id, "response", "status_code", 200, "request_id", rid,
                                "body", body, "error", "medley", med);
        w->n_tokens += res->completion_tokens;
        push_answer(w, j->s, j->id, j->batch, j->custom_id, NULL, doc);
        wk_metrics_result(w, m, res, j->queue_ms, atoll(j->id),
                          w->cfg->usd_per_hour * j->share_s / 3600.0);
    }
    j->used = 0;
    w->live--;
}

/* Run the completion script for every unscripted answer, then XACK every scripted one.
 * On a lost connection the answers stay queued for the next try (the script is idempotent). */
/* Redis refused the completion script (OOM under noeviction, NOPERM, READONLY...): hold
 * the answers and try again after a backoff (100 ms doubling to 5 s), logging the refusal
 * once and then at most every 10 s with the count; the heartbeat shows it (wk.wr). */
static void write_refused(wk *w, const char *why) {
    uint64_t now = md_mono_ns();
    wk_wr *wr = &w->wr;
    if (!wr->refused) {
        wr->refused = 1;
        wr->since_ms = md_wall_ms();
        wr->backoff_ms = 0;
        wr->count = 0;
        wr->logged_ns = 0;
    }
    wr->count++;
    snprintf(wr->error, sizeof wr->error, "%s", why);
    wr->backoff_ms = wr->backoff_ms ? (wr->backoff_ms * 2 > 5000 ? 5000 : wr->backoff_ms * 2) : 100;
    wr->next_ns = now + (uint64_t)wr->backoff_ms * 1000000ull;
    if (!wr->logged_ns || now - wr->logged_ns >= 10000000000ull) {
        MD_ERROR("worker",
                 "Redis refuses answers: %s (%ld refusal(s) since %.1f s ago); holding %d "
                 "answer(s) and reading nothing new, next try in %d ms",
                 why, wr->count, (double)(md_wall_ms() - wr->since_ms) / 1e3, w->n_ans,
                 wr->backoff_ms);
        wr->logged_ns = now;
    }
}

/* The completion script ran again: say so once if it had been refused. */
static void write_accepted(wk *w) {
    wk_wr *wr = &w->wr;
    if (!wr->refused)
        return;
    MD_INFO("worker", "Redis accepts answers again after %.1f s (%ld refusal(s): %s)",
            (double)(md_wall_ms() - wr->since_ms) / 1e3, wr->count, wr->error);
    wr->refused = 0;
    wr->backoff_ms = 0;
    wr->next_ns = 0;
}

int wk_write_blocked(const wk *w) {
    return w->wr.refused && w->n_ans > 0;
}

void wk_flush(wk *w) {
    if (!w->n_ans || w->broken)
        return;
    if (w->wr.refused && md_mono_ns() < w->wr.next_ns)
        return; /* backing off: Redis refused the last try */
    char why[sizeof w->wr.error] = "";
    int accepted = 0; /* the online lanes' answers first */
    int refused = wk_online_write(w, &accepted, why, sizeof why);
    if (refused < 0)
        return;
    redisContext *c = md_redis_ctx(w->r);
    char now[32];
    snprintf(now, sizeof now, "%lld", (long long)md_wall_ms());
    int sent = 0;
    for (int i = 0; i < w->n_ans; i++) {
        answer *a = &w->ans[i];
        if (a->scripted || w->st[a->s].online)
            continue;
        char meta[Q_KEY_MAX], done[Q_KEY_MAX], out[Q_KEY_MAX];
        q_key_meta(meta, w->prefix, a->batch);
        q_key_done(done, w->prefix, a->batch);
        q_key_out(out, w->prefix, a->batch);
        const char *argv[] = {"EVALSHA",         w->sha,  "3", meta,      done,     out,  a->member,
                              a->ok ? "1" : "0", a->line, now, w->events, a->batch, a->id};
        size_t lens[13];
        for (int k = 0; k < 13; k++)
            lens[k] = strlen(argv[k]);
        redisAppendCommandArgv(c, 13, argv, lens);
        sent++;
    }
    int noscript = 0;
    md_err e = {0};
    for (int i = 0; i < w->n_ans && sent > 0; i++) {
        answer *a = &w->ans[i];
        if (a->scripted || w->st[a->s].online)
            continue;
        sent--;
        redisReply *rep = md_redis_get_reply(w->r, &e);
        if (!rep) {
            w->broken = 1;
            return;
        }
        if (rep->type == REDIS_REPLY_INTEGER) {
            a->scripted = 1;
            accepted = 1;
            if (rep->integer < 0)
                MD_WARN("worker", "batch %s no longer exists; dropping entry %s", a->batch, a->id);
        } else if (rep->type == REDIS_REPLY_ERROR && !strncmp(rep->str, "NOSCRIPT", 8)) {
            noscript = 1;
        } else if (!refused++) {
            snprintf(why, sizeof why, "%s",
                     rep->type == REDIS_REPLY_ERROR ? rep->str : "unexpected reply to EVALSHA");
        }
        freeReplyObject(rep);
    }
    if (refused)
        write_refused(w, why);
    else if (accepted)
        write_accepted(w);
    if (noscript && q_script_load(w->r, q_complete_lua, w->sha, &e)) {
        if (e.code == MD_EREDIS)
            w->broken = 1;
        else
            write_refused(w, e.msg);
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
