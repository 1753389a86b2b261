/* submit.c — the line-queuing core of submission (q_submit_lines, see client.h): scan the
 * lines (custom_id uniqueness, model, endpoint), create the batch, route each line to its
 * stream, seal, confirm replication. Where the lines come from is the caller's reader. */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>

#include "common/log.h"
#include "common/util.h"
#include "queue/client.h"
#include "queue/plan.h"
#include "queue/resume.h"
#include "queue/validate.h"

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
/* SHA-256 of the request lines (each without its line end, then a newline) as hex into
 * sha: what identifies an input when a --batch-id is submitted again. */
static void hash_line(EVP_MD_CTX *h, const char *line, size_t len) {
    while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
        len--;
    EVP_DigestUpdate(h, line, len);
    EVP_DigestUpdate(h, "\n", 1);
}

static void hash_hex(EVP_MD_CTX *h, char sha[65]) {
    unsigned char d[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    EVP_DigestFinal_ex(h, d, &n);
    for (unsigned int i = 0; i < n && i < 32; i++)
        snprintf(sha + 2 * i, 3, "%02x", d[i]);
}

static int scan_lines(const q_line_reader *rd, const char *path, char *model, size_t msz,
                      char *endpoint, size_t esz, long long *n_lines, char sha[65], md_err *e) {
    EVP_MD_CTX *h = EVP_MD_CTX_new();
    if (!h || !EVP_DigestInit_ex(h, EVP_sha256(), NULL)) {
        EVP_MD_CTX_free(h);
        return md_errf(e, MD_ENOMEM, "cannot start a SHA-256");
    }
    const char *line;
    size_t len;
    long long n = 0;
    size_t nids = 0, capids = 0;
    char **idsv = NULL;
    int rc = 0, got;
    while ((got = rd->next(rd->ctx, &line, &len, e)) > 0) {
        if (blank(line, len))
            continue;
        n++;
        hash_line(h, line, len);
        json_t *j = json_loadb(line, len, 0, NULL);
        if (rd->check)
            rd->check(rd->ctx, j, line, len);
        /* Two ids per line may be in play: the parsed custom_id (a worker that can parse the
         * line answers under it) and the one a worker recovers from a line longer than its
         * --max-line-bytes (q_scan_custom_id). Both count, so no answer of this batch can
         * fall on another line's custom_id and be dropped as a redelivery. */
        const char *cids[2] = {json_string_value(json_object_get(j, "custom_id")), NULL};
        char scanned[Q_CUSTOM_ID_MAX];
        cids[1] = q_scan_custom_id(line, len, scanned);
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
    if (!rc && got < 0)
        rc = got;
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
    hash_hex(h, sha);
    EVP_MD_CTX_free(h);
    if (!rc && n == 0)
        rc = md_errf(e, MD_EINVAL, "%s has no request lines", path);
    *n_lines = n;
    return rc;
}

/* Replication is asynchronous: a sealed batch that only the primary holds is lost, lines
 * and all, if the primary dies before its replicas copy it and one of them is promoted. So
 * a submission is reported only once every connected replica holds it (WAIT); with no
 * replica there is nothing to wait for. One replica short is a warning (the promoted
 * replica is usually the most up to date); none at all is an error naming the batch.
 * A user refused ROLE/WAIT gets the sentence saying so and how to do without. */
#define SUBMIT_WAIT_MS 5000
static int wait_replicas(md_redis *r, const char *batch, md_err *e) {
    int replicas = 0, acked = 0;
    int rc = md_redis_wait_replicas(r, SUBMIT_WAIT_MS, &replicas, &acked, e);
    if (rc && strstr(e->msg, "NOPERM"))
        return md_errf(e, MD_EREDIS,
                       "batch %s is sealed on the primary %s, but this Redis user may not run "
                       "ROLE and WAIT, which confirm that a replica holds it: grant it +role "
                       "+wait (the medley-client user of deploy/redis/users.acl has both), or "
                       "pass --no-replica-check to accept that a failover may lose the batch "
                       "(`medley submit --batch-id %s` again is safe either way)",
                       batch, md_redis_peer(r), batch);
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

/* With Sentinel, a failover may have begun while the batch was written: the replica being
 * promoted stops copying the old primary before anyone is told, and what the old primary
 * takes meanwhile is discarded. So ask the Sentinels again once no failover is under way:
 * the batch counts only when the primary they name holds it sealed. */
#define SUBMIT_FAILOVER_MS 30000
static int confirm_primary(md_redis *r, const char *prefix, const char *batch, md_err *e) {
    md_err fe = {0};
    int rc = md_redis_confirm_primary(r, SUBMIT_FAILOVER_MS, &fe);
    if (rc == 0)
        return 0;
    if (rc != MD_ENOTFOUND)
        return md_errf(e, MD_EREDIS,
                       "batch %s is sealed, but whether it outlived a failover "
                       "cannot be told (%s): see `medley status %s`",
                       batch, fe.msg, batch);
    char was[300];
    snprintf(was, sizeof was, "%s", md_redis_peer(r));
    q_batch_info b;
    if (md_redis_reconnect(r, 10000, NULL, e) == 0 && q_batch_get(r, prefix, batch, &b, e) == 0 &&
        b.total > 0 && strcmp(b.status, "validating") && strcmp(b.status, "failed")) {
        MD_WARN("submit",
                "batch %s: a failover moved the primary from %s to %s; the batch is "
                "sealed there",
                batch, was, md_redis_peer(r));
        return 0;
    }
    return md_errf(e, MD_EREDIS,
                   "batch %s was lost in a failover (%s, where it was sealed): "
                   "submit it again; `--batch-id %s` finishes it without doubling a line",
                   batch, fe.msg, batch);
}

static int confirm_replicated(md_redis *r, const q_submit_opts *o, const char *prefix,
                              const char *batch, md_err *e) {
    int rc = o->no_replica_check ? 0 : wait_replicas(r, batch, e);
    return rc ? rc : confirm_primary(r, prefix, batch, e);
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

/* Every request line of rd to the submitter: to the plain stream without classes, else to
 * the class its estimated size picks (routed[k] counts class k's lines). Lines whose
 * custom_id an earlier submission queued (sent) are skipped and counted in *skipped. */
static int send_lines(q_submitter *s, const q_line_reader *rd, const q_class *cls, int ncls,
                      char ckey[][Q_KEY_MAX], long long *routed, const q_sent_set *sent,
                      long long *skipped, md_err *e) {
    const char *line;
    size_t len;
    int rc = 0, got = 0;
    q_limits lim;
    q_limits_default(&lim);
    while (!rc && (got = rd->next(rd->ctx, &line, &len, e)) > 0) {
        if (blank(line, len))
            continue;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
            len--;
        char cbuf[Q_CUSTOM_ID_MAX];
        const char *cid = q_scan_custom_id(line, len, cbuf);
        if (q_sent_has(sent, cid)) {
            (*skipped)++;
            continue;
        }
        if (ncls == 0) {
            rc = q_submit_line_cid(s, NULL, line, len, cid, e);
            continue;
        }
        /* A line that is not JSON is estimated at the default size: the worker answers it
         * with an error line from whichever class stream it is in. */
        json_t *doc = json_loadb(line, len, 0, NULL);
        long long est = q_estimate_tokens(json_object_get(doc, "body"), lim.max_tokens_default);
        json_decref(doc);
        const q_class *c = q_class_pick(cls, ncls, est);
        routed[c - cls]++;
        rc = q_submit_line_cid(s, ckey[c - cls], line, len, cid, e);
    }
    return rc ? rc : got;
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

/* A resumed batch into P batches again: the earlier run may have been killed between
 * creating its meta and indexing it (q_batch_create). NX keeps an existing entry's time. */
static int index_again(md_redis *r, const char *prefix, const char *batch, md_err *e) {
    char idx[Q_KEY_MAX];
    q_key_batches(idx, prefix);
    redisReply *rep = md_redis_cmd(r, e, "ZADD %s NX %lld %s", idx, md_wall_ms(), batch);
    if (!rep)
        return MD_EREDIS;
    int rc = rep->type == REDIS_REPLY_ERROR
                 ? md_errf(e, MD_EREDIS, "indexing the batch: %s", rep->str)
                 : 0;
    freeReplyObject(rep);
    return rc;
}

int q_submit_lines(md_redis *r, const q_submit_opts *o, const q_line_reader *rd,
                   char batch_out[Q_BATCH_ID_MAX], long long *n_lines, md_err *e) {
    const char *prefix = o->prefix ? o->prefix : "medley:";
    int rc = q_prefix_check(prefix, e);
    if (rc)
        return rc;
    char model[128] = "", endpoint[64] = "";
    if (o->model)
        snprintf(model, sizeof model, "%s", o->model);
    long long expect = 0, plan_version = -1;
    q_class cls[Q_CLASS_MAX];
    int ncls = 0;
    char qkey[Q_KEY_MAX], ckey[Q_CLASS_MAX][Q_KEY_MAX];
    q_submitter *s = NULL;
    char sha[65] = "";
    if ((rc = scan_lines(rd, o->path, model, sizeof model, endpoint, sizeof endpoint, &expect, sha,
                         e)) ||
        (rc = check_model(model, o->path, e)) || (rc = choose_batch_id(o, batch_out, e)))
        return rc;
    /* The same --batch-id again: report a sealed batch, finish a half-written one, refuse
     * another input (resume.h). */
    int resume = 0;
    q_sent_set sent = {0};
    if (o->batch_id) {
        long long had = 0;
        rc = q_batch_existing(r, prefix, batch_out, sha, &resume, &had, e);
        if (rc == 0 && !resume) {
            MD_INFO("submit", "batch %s was submitted before with this input (%lld lines)",
                    batch_out, had);
            *n_lines = had;
            return confirm_replicated(r, o, prefix, batch_out, e);
        }
        if (rc == MD_ENOTFOUND)
            rc = 0;
        else if (rc == 0)
            rc = q_sent_load(r, prefix, batch_out, &sent, e);
        if (rc)
            return rc;
    }
    if ((rc = plan_classes(r, prefix, model, cls, &ncls, &plan_version, e)) ||
        (rc = create_groups(r, prefix, model, cls, ncls, qkey, ckey, e))) {
        q_sent_free(&sent);
        return rc;
    }
    q_batch_spec spec = {.prefix = prefix,
                         .batch = batch_out,
                         .model = model,
                         .endpoint = endpoint[0] ? endpoint : "/v1/chat/completions",
                         .input_file = o->path,
                         .input_sha = sha,
                         .window_s = o->window_s,
                         .priority = o->priority,
                         .tenant = o->tenant};
    if ((!resume && (rc = q_batch_create(r, &spec, e))) ||
        (resume && (rc = index_again(r, prefix, batch_out, e))) ||
        (rc = q_submitter_open(r, prefix, batch_out, model, &s, e))) {
        q_sent_free(&sent);
        return rc;
    }
    long long total = 0, skipped = 0, routed[Q_CLASS_MAX] = {0};
    rc = rd->rewind(rd->ctx, e);
    if (!rc)
        rc = send_lines(s, rd, cls, ncls, ckey, routed, &sent, &skipped, e);
    if (!rc)
        rc = q_submitter_flush(s, &total, e);
    q_submitter_free(s);
    q_sent_free(&sent);
    if (!rc && total + skipped != expect)
        rc = md_errf(e, MD_EIO, "%s changed while it was being submitted (%lld lines, then %lld)",
                     o->path, expect, total + skipped);
    if (resume)
        MD_INFO("submit",
                "batch %s: finishing an earlier submission: %lld line(s) were queued, "
                "%lld more now",
                batch_out, skipped, total);
    total += skipped;
    if (rc && o->batch_id)
        return md_errctx(
            e, "batch %s is half-submitted; the same command again finishes it: ", batch_out);
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
    return confirm_replicated(r, o, prefix, batch_out, e);
}
