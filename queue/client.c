/* client.c — see client.h. */
#include "queue/client.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"
#include "queue/plan.h"
#include "queue/validate.h"

int q_parse_duration(const char *s, long long *seconds, md_err *e) {
    char *end;
    errno = 0;
    double v = s ? strtod(s, &end) : 0;
    if (!s || end == s || errno || v < 0)
        return md_errf(e, MD_EINVAL, "'%s' is not a duration (e.g. 90s, 15m, 24h, 7d)", s ? s : "");
    double mul = 1;
    if (!strcmp(end, "") || !strcmp(end, "s"))
        mul = 1;
    else if (!strcmp(end, "m"))
        mul = 60;
    else if (!strcmp(end, "h"))
        mul = 3600;
    else if (!strcmp(end, "d"))
        mul = 86400;
    else
        return md_errf(e, MD_EINVAL, "'%s': unknown unit '%s' (s, m, h, d)", s, end);
    if (v * mul > 1e10)
        return md_errf(e, MD_EINVAL, "'%s' is too long a duration", s);
    *seconds = (long long)(v * mul);
    return 0;
}

static int blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isspace((unsigned char)s[i]))
            return 0;
    return 1;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* First pass: count lines, check custom_id uniqueness, find the model and endpoint. */
static int scan_file(FILE *f, const char *path, char *model, size_t msz, char *endpoint, size_t esz,
                     long long *n_lines, md_err *e) {
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    long long n = 0, lineno = 0;
    size_t nids = 0, capids = 0;
    char **idsv = NULL;
    int rc = 0;
    while ((len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        if (blank(line, (size_t)len))
            continue;
        n++;
        json_t *j = json_loadb(line, (size_t)len, 0, NULL);
        /* Two ids per line may be in play: the parsed custom_id (a worker that can parse the
         * line answers under it) and the one a worker recovers from a line longer than its
         * --max-line-bytes (q_scan_custom_id). Both count, so no answer of this batch can
         * fall on another line's custom_id and be dropped as a redelivery. */
        const char *cids[2] = {json_string_value(json_object_get(j, "custom_id")), NULL};
        char scanned[Q_CUSTOM_ID_MAX];
        cids[1] = q_scan_custom_id(line, (size_t)len, scanned);
        if (cids[0] && cids[1] && !strcmp(cids[0], cids[1]))
            cids[1] = NULL;
        if (n == 1 || !model[0] || !endpoint[0]) {
            json_t *body = json_object_get(j, "body");
            const char *m = json_string_value(json_object_get(body, "model"));
            const char *u = json_string_value(json_object_get(j, "url"));
            if (m && !model[0])
                snprintf(model, msz, "%s", m);
            if (u && !endpoint[0])
                snprintf(endpoint, esz, "%s", u);
        }
        for (int c = 0; c < 2 && !rc; c++) {
            const char *cid = cids[c];
            if (!cid)
                continue;
            if (nids == capids) {
                capids = capids ? capids * 2 : 1024;
                char **nv = realloc(idsv, capids * sizeof *nv);
                if (!nv) {
                    rc = md_errf(e, MD_ENOMEM, "out of memory reading %s", path);
                    break;
                }
                idsv = nv;
            }
            idsv[nids] = strdup(cid);
            if (!idsv[nids]) {
                rc = md_errf(e, MD_ENOMEM, "out of memory reading %s", path);
                break;
            }
            nids++;
        }
        json_decref(j);
        if (rc)
            break;
    }
    if (!rc && ferror(f))
        rc = md_errf(e, MD_EIO, "reading %s: %s", path, strerror(errno));
    if (!rc && nids > 1) {
        qsort(idsv, nids, sizeof *idsv, cmp_str);
        for (size_t i = 1; i < nids; i++)
            if (!strcmp(idsv[i - 1], idsv[i])) {
                rc = md_errf(e, MD_EINVAL,
                             "%s: custom_id '%.100s' appears more than once; custom_ids must be "
                             "unique within a batch (a line too large to parse counts under the "
                             "custom_id a worker finds in it: docs/protocol.md §3)",
                             path, idsv[i]);
                break;
            }
    }
    for (size_t i = 0; i < nids; i++)
        free(idsv[i]);
    free(idsv);
    free(line);
    if (!rc && n == 0)
        rc = md_errf(e, MD_EINVAL, "%s has no request lines", path);
    *n_lines = n;
    return rc;
}

/* Replication is asynchronous: a sealed batch that only the primary holds is lost, lines
 * and all, if the primary dies before its replicas copy it and one of them is promoted. So
 * a submission is reported only once every connected replica holds it (WAIT); with no
 * replica there is nothing to wait for. One replica short is a warning (the promoted
 * replica is usually the most up to date); none at all is an error naming the batch. */
#define SUBMIT_WAIT_MS 5000
static int confirm_replicated(md_redis *r, const char *batch, md_err *e) {
    int replicas = 0, acked = 0;
    int rc = md_redis_wait_replicas(r, SUBMIT_WAIT_MS, &replicas, &acked, e);
    if (rc)
        return md_errctx(e, "batch %s is sealed, but confirming its replication failed: ", batch);
    if (replicas > 0 && acked == 0)
        return md_errf(e, MD_EREDIS,
                       "batch %s is sealed on the primary %s, but none of its %d replica(s) "
                       "acknowledged it within %d ms: a failover now could lose it "
                       "(see `medley status %s`)",
                       batch, md_redis_peer(r), replicas, SUBMIT_WAIT_MS, batch);
    if (acked < replicas)
        MD_WARN("submit", "batch %s: %d of %d replica(s) acknowledged it within %d ms", batch,
                acked, replicas, SUBMIT_WAIT_MS);
    return 0;
}

/* The model the batch is for: usable as a key part (no braces, no spaces). */
static int check_model(const char *model, const char *path, md_err *e) {
    if (!model[0])
        return md_errf(e, MD_EINVAL, "%s: no --model given and the first line has no body.model",
                       path);
    for (const char *p = model; *p; p++)
        if (*p == '{' || *p == '}' || isspace((unsigned char)*p))
            return md_errf(e, MD_EINVAL, "model name '%s' may not hold braces or spaces", model);
    return 0;
}

/* The batch id: the one asked for (refused as given: never shortened to an id that was not
 * asked for), else a new one. */
static int choose_batch_id(const q_submit_opts *o, char batch_out[Q_BATCH_ID_MAX], md_err *e) {
    int rc;
    if (o->batch_id && (rc = q_batch_id_check(o->batch_id, e)))
        return rc;
    if (o->batch_id)
        snprintf(batch_out, Q_BATCH_ID_MAX, "%s", o->batch_id);
    else
        q_new_batch_id(batch_out, Q_BATCH_ID_MAX);
    return q_batch_id_check(batch_out, e);
}

/* The plan's classes for the model decide the streams; no plan (or no classes, or a plan
 * that does not parse: a warning): none, and the lines go to q:{M}. Fails only when Redis
 * does. */
static int plan_classes(md_redis *r, const char *prefix, const char *model,
                        q_class cls[Q_CLASS_MAX], int *ncls, long long *plan_version, md_err *e) {
    json_t *plan = NULL;
    md_err pe = {0};
    int rc;
    *ncls = 0;
    if ((rc = q_plan_get(r, prefix, &plan, &pe)) == MD_EREDIS) {
        *e = pe;
        return rc;
    }
    if (rc || (plan && (*ncls = q_plan_classes(plan, model, cls, &pe)) < 0)) {
        MD_WARN("submit", "ignoring the plan (%s); requests go to the model's plain stream",
                pe.msg);
        *ncls = 0;
    }
    *plan_version = plan ? q_plan_version(plan) : -1;
    json_decref(plan);
    return 0;
}

/* The consumer group on the model's plain stream (qkey) and on each class stream (ckey). */
static int create_groups(md_redis *r, const char *prefix, const char *model, const q_class *cls,
                         int ncls, char qkey[Q_KEY_MAX], char ckey[][Q_KEY_MAX], md_err *e) {
    q_key_queue(qkey, prefix, model);
    for (int k = 0; k < ncls; k++)
        q_key_class(ckey[k], prefix, model, cls[k].name);
    for (int k = -1; k < ncls; k++) {
        const char *key = k < 0 ? qkey : ckey[k];
        redisReply *rep = md_redis_cmd(r, e, "XGROUP CREATE %s %s 0 MKSTREAM", key, Q_GROUP);
        if (!rep)
            return MD_EREDIS;
        if (rep->type == REDIS_REPLY_ERROR && strncmp(rep->str, "BUSYGROUP", 9)) {
            int rc = md_errf(e, MD_EREDIS, "XGROUP CREATE %s: %s", key, rep->str);
            freeReplyObject(rep);
            return rc;
        }
        freeReplyObject(rep);
    }
    return 0;
}

/* Every request line of f to the submitter: to the plain stream without classes, else to
 * the class its estimated size picks (routed[k] counts class k's lines). */
static int send_lines(q_submitter *s, FILE *f, const q_class *cls, int ncls, char ckey[][Q_KEY_MAX],
                      long long *routed, md_err *e) {
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int rc = 0;
    q_limits lim;
    q_limits_default(&lim);
    while (!rc && (len = getline(&line, &cap, f)) >= 0) {
        if (blank(line, (size_t)len))
            continue;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
            len--;
        if (ncls == 0) {
            rc = q_submit_line(s, line, (size_t)len, e);
            continue;
        }
        /* A line that is not JSON is estimated at the default size: the worker answers it
         * with an error line from whichever class stream it is in. */
        json_t *doc = json_loadb(line, (size_t)len, 0, NULL);
        long long est = q_estimate_tokens(json_object_get(doc, "body"), lim.max_tokens_default);
        json_decref(doc);
        const q_class *c = q_class_pick(cls, ncls, est);
        routed[c - cls]++;
        rc = q_submit_line_to(s, ckey[c - cls], line, (size_t)len, e);
    }
    free(line);
    return rc;
}

/* Which plan routed the batch, and how many lines each class stream got, in its meta hash. */
static int record_routing(md_redis *r, const char *prefix, const char *batch, const q_class *cls,
                          int ncls, const long long *routed, long long plan_version, md_err *e) {
    json_t *rt = json_object();
    for (int k = 0; k < ncls; k++)
        json_object_set_new(rt, cls[k].name, json_integer(routed[k]));
    char *rts = json_dumps(rt, JSON_COMPACT);
    json_decref(rt);
    char meta[Q_KEY_MAX];
    q_key_meta(meta, prefix, batch);
    redisReply *rep =
        rts ? md_redis_cmd(r, e, "HSET %s plan_version %lld routing %s", meta, plan_version, rts)
            : NULL;
    int dumped = rts != NULL;
    free(rts);
    if (!rep)
        return dumped ? MD_EREDIS : md_errf(e, MD_ENOMEM, "out of memory");
    freeReplyObject(rep);
    return 0;
}

int q_submit_file(md_redis *r, const q_submit_opts *o, char batch_out[Q_BATCH_ID_MAX],
                  long long *n_lines, md_err *e) {
    const char *prefix = o->prefix ? o->prefix : "medley:";
    int rc = q_prefix_check(prefix, e);
    if (rc)
        return rc;
    FILE *f = fopen(o->path, "rb");
    if (!f)
        return md_errf(e, MD_EIO, "cannot open %s: %s", o->path, strerror(errno));
    char model[128] = "", endpoint[64] = "";
    if (o->model)
        snprintf(model, sizeof model, "%s", o->model);
    long long expect = 0, plan_version = -1;
    q_class cls[Q_CLASS_MAX];
    int ncls = 0;
    char qkey[Q_KEY_MAX], ckey[Q_CLASS_MAX][Q_KEY_MAX];
    q_submitter *s = NULL;
    if ((rc = scan_file(f, o->path, model, sizeof model, endpoint, sizeof endpoint, &expect, e)) ||
        (rc = check_model(model, o->path, e)) || (rc = choose_batch_id(o, batch_out, e)) ||
        (rc = plan_classes(r, prefix, model, cls, &ncls, &plan_version, e)) ||
        (rc = create_groups(r, prefix, model, cls, ncls, qkey, ckey, e))) {
        fclose(f);
        return rc;
    }
    q_batch_spec spec = {.prefix = prefix,
                         .batch = batch_out,
                         .model = model,
                         .endpoint = endpoint[0] ? endpoint : "/v1/chat/completions",
                         .input_file = o->path,
                         .window_s = o->window_s,
                         .priority = o->priority};
    if ((rc = q_batch_create(r, &spec, e)) ||
        (rc = q_submitter_open(r, prefix, batch_out, model, &s, e))) {
        fclose(f);
        return rc;
    }
    rewind(f);
    long long total = 0, routed[Q_CLASS_MAX] = {0};
    rc = send_lines(s, f, cls, ncls, ckey, routed, e);
    if (!rc)
        rc = q_submitter_flush(s, &total, e);
    q_submitter_free(s);
    fclose(f);
    if (!rc && total != expect)
        rc = md_errf(e, MD_EIO, "%s changed while it was being submitted (%lld lines, then %lld)",
                     o->path, expect, total);
    if (rc) {
        md_err e2 = {0};
        char reason[600];
        snprintf(reason, sizeof reason, "submission failed: %s", e->msg);
        /* best effort: the connection may be the reason */
        q_batch_fail(r, prefix, batch_out, reason, &e2);
        return rc;
    }
    if ((rc = record_routing(r, prefix, batch_out, cls, ncls, routed, plan_version, e)))
        return rc;
    *n_lines = total;
    if ((rc = q_batch_seal(r, prefix, batch_out, total, e)))
        return rc;
    return confirm_replicated(r, batch_out, e);
}

/* For each entry of an XRANGE page, 1 when its `entry` field is a queue entry the batch had
 * (SMISMEMBER P {B}:ids), else 0; all 1 when the batch keeps no ids (submitted by a client
 * before they existed). 0 or MD_EREDIS. */
static int trusted_entries(md_redis *r, const char *ids_key, int have_ids, redisReply *page,
                           char *ok, md_err *e) {
    size_t n = page->elements;
    memset(ok, 1, n);
    if (!have_ids || n == 0)
        return 0;
    const char **argv = calloc(n + 2, sizeof *argv);
    size_t *lens = calloc(n + 2, sizeof *lens);
    if (!argv || !lens) {
        free(argv);
        free(lens);
        return md_errf(e, MD_ENOMEM, "out of memory");
    }
    argv[0] = "SMISMEMBER";
    argv[1] = ids_key;
    for (size_t i = 0; i < n; i++) {
        redisReply *en = page->element[i];
        argv[2 + i] = "";
        if (en->type != REDIS_REPLY_ARRAY || en->elements < 2)
            continue;
        redisReply *fl = en->element[1];
        for (size_t k = 0; fl->type == REDIS_REPLY_ARRAY && k + 1 < fl->elements; k += 2)
            if (!strcmp(fl->element[k]->str, "entry"))
                argv[2 + i] = fl->element[k + 1]->str;
    }
    for (size_t i = 0; i < n + 2; i++)
        lens[i] = strlen(argv[i]);
    redisReply *rep = md_redis_cmd_argv(r, (int)n + 2, argv, lens, e);
    free(argv);
    free(lens);
    if (!rep)
        return MD_EREDIS;
    int rc = 0;
    if (rep->type != REDIS_REPLY_ARRAY || rep->elements != n)
        rc = md_errf(e, MD_EREDIS, "SMISMEMBER %s: %s", ids_key,
                     rep->type == REDIS_REPLY_ERROR ? rep->str : "unexpected reply");
    for (size_t i = 0; !rc && i < n; i++)
        ok[i] = rep->element[i]->integer == 1;
    freeReplyObject(rep);
    return rc;
}

/* Write one output entry's line to out (ok = 1) or err; counts in n_out / n_err. */
static int write_entry(redisReply *en, FILE *out, FILE *err, long long *n_out,
                       long long *n_err, md_err *e) {
    if (en->type != REDIS_REPLY_ARRAY || en->elements < 2)
        return 0;
    redisReply *fl = en->element[1];
    const char *line = NULL, *ok = "1";
    size_t llen = 0;
    for (size_t k = 0; fl->type == REDIS_REPLY_ARRAY && k + 1 < fl->elements; k += 2) {
        if (!strcmp(fl->element[k]->str, "line")) {
            line = fl->element[k + 1]->str;
            llen = fl->element[k + 1]->len;
        } else if (!strcmp(fl->element[k]->str, "ok")) {
            ok = fl->element[k + 1]->str;
        }
    }
    if (!line)
        return 0;
    int good = !strcmp(ok, "1");
    FILE *dst = good || !err ? out : err;
    if (fwrite(line, 1, llen, dst) != llen || fputc('\n', dst) == EOF)
        return md_errf(e, MD_EIO, "writing results: %s", strerror(errno));
    if (good)
        (*n_out)++;
    else
        (*n_err)++;
    return 0;
}

int q_results_write(md_redis *r, const char *prefix, const char *batch, FILE *out, FILE *err,
                    long long *n_out, long long *n_err, md_err *e) {
    char key[Q_KEY_MAX], ids[Q_KEY_MAX], start[64] = "-";
    q_key_out(key, prefix, batch);
    q_key_ids(ids, prefix, batch);
    *n_out = *n_err = 0;
    redisReply *ex = md_redis_cmd(r, e, "EXISTS %s", ids);
    if (!ex)
        return MD_EREDIS;
    int have_ids = ex->type == REDIS_REPLY_INTEGER && ex->integer == 1;
    freeReplyObject(ex);
    long long forged = 0;
    char ok[2000];
    for (;;) {
        redisReply *rep = md_redis_cmd(r, e, "XRANGE %s %s + COUNT 2000", key, start);
        if (!rep)
            return MD_EREDIS;
        int rc = rep->type != REDIS_REPLY_ARRAY
                     ? md_errf(e, MD_EREDIS, "XRANGE %s: %s", key,
                               rep->type == REDIS_REPLY_ERROR ? rep->str : "unexpected reply")
                     : trusted_entries(r, ids, have_ids, rep, ok, e);
        size_t n = rc ? 0 : rep->elements;
        for (size_t i = 0; i < n && !rc; i++) {
            if (ok[i])
                rc = write_entry(rep->element[i], out, err, n_out, n_err, e);
            else
                forged++;
        }
        if (!rc && n > 0)
            snprintf(start, sizeof start, "(%s", rep->element[n - 1]->element[0]->str);
        freeReplyObject(rep);
        if (rc)
            return rc;
        if (n < 2000)
            break;
    }
    if (forged)
        MD_WARN("results", "batch %s: dropped %lld line(s) of %s whose queue entry the batch never "
                "had (forged answers; docs/operations.md, \"Threat model\")", batch, forged, key);
    return 0;
}

json_t *q_batch_json(const q_batch_info *b) {
    json_t *j =
        json_pack("{s:s, s:s, s:s, s:s, s:{s:I, s:I, s:I}, s:I, s:I, s:I, s:I, s:i}", "id", b->id,
                  "status", b->status, "model", b->model, "endpoint", b->endpoint, "request_counts",
                  "total", (json_int_t)b->total, "completed", (json_int_t)b->completed, "failed",
                  (json_int_t)b->failed, "created_at", (json_int_t)b->created_at, "started_at",
                  (json_int_t)b->started_at, "finished_at", (json_int_t)b->finished_at, "deadline",
                  (json_int_t)b->deadline, "priority", b->priority);
    if (j && b->errors[0])
        json_object_set_new(j, "errors", json_string(b->errors));
    return j;
}
