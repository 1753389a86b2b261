/* outputs.c — a batch's output and error files (file-out-B, file-err-B, purpose
 * "batch_output"): the batch's output stream P {B}:out (docs/protocol.md §2) seen as two files
 * of the Files API (docs/api.md "Output and error files"). Their file objects (sizes counted
 * page by page, kept in P api:{B} once the batch has ended, since its stream no longer
 * changes then), their entry in the tenant's file list once the batch has ended (settle), and
 * their deletion (the stream entries of that kind removed, page by page). */
#include <stdlib.h>
#include <string.h>

#include "api/api_int.h"
#include "common/util.h"
#include "queue/queue.h"

#define PAGE 1000 /* output entries per XRANGE */

int api_output_file_batch(const char *file_id, char batch[API_ID_MAX], int *ok) {
    int out = !strncmp(file_id, "file-out-", 9), err = !strncmp(file_id, "file-err-", 9);
    if ((!out && !err) || !api_id_ok(file_id + 9))
        return 0;
    snprintf(batch, API_ID_MAX, "%s", file_id + 9);
    *ok = out;
    return 1;
}

/* The stream of batch B no longer changes: every line is answered (completed, expired,
 * cancelled). A `failed` batch (its submission aborted) still has queued lines that workers
 * answer `batch_failed`. */
static int ended(const char *status) {
    return !strcmp(status, "completed") || !strcmp(status, "expired") ||
           !strcmp(status, "cancelled");
}

/* What output_sizes sums: [0] the error file, [1] the output file. */
typedef struct {
    long long bytes[2], lines[2];
} sizes;

static int size_add(void *ctx, const q_out_entry *o) {
    sizes *z = ctx;
    z->bytes[o->ok] += (long long)o->llen + 1;
    z->lines[o->ok]++;
    return 0;
}

/* Both files' bytes and lines, the stream read a page at a time through q_trust (the lines
 * `medley results` and the content stream give). */
static int output_sizes(md_redis *r, const char *prefix, const char *batch, sizes *z, md_err *e) {
    char key[Q_KEY_MAX], start[64] = "-", emit[PAGE];
    q_key_out(key, prefix, batch);
    memset(z, 0, sizeof *z);
    q_trust *t = NULL;
    int rc = q_trust_new(r, prefix, batch, &t, e);
    while (!rc) {
        redisReply *rep = md_redis_cmd(r, e, "XRANGE %s %s + COUNT %d", key, start, PAGE);
        if (!rep) {
            rc = MD_EREDIS;
            break;
        }
        size_t n = rep->type == REDIS_REPLY_ARRAY ? rep->elements : 0;
        if (n && (rc = q_trust_page(t, r, rep, emit, e)))
            n = 0;
        for (size_t i = 0; i < n; i++) {
            q_out_entry o;
            if (emit[i] && q_out_entry_parse(rep->element[i], &o))
                size_add(z, &o);
        }
        if (n)
            snprintf(start, sizeof start, "(%s", rep->element[n - 1]->element[0]->str);
        freeReplyObject(rep);
        if (n < PAGE)
            break;
    }
    long long forged = 0;
    if (!rc)
        rc = q_trust_finish(t, r, size_add, z, &forged, e);
    q_trust_free(t);
    return rc;
}

/* P api:{B}'s fields this file reads (batch_fields' HMGET), in this order. */
enum { F_TENANT, F_OUT_BYTES, F_OUT_LINES, F_ERR_BYTES, F_ERR_LINES, F_OUT_DEL, F_ERR_DEL };

static const char *field(const redisReply *h, int i) {
    return h->type == REDIS_REPLY_ARRAY && (size_t)i < h->elements &&
                   h->element[i]->type == REDIS_REPLY_STRING
               ? h->element[i]->str
               : NULL;
}

/* The API's fields of batch B when it is the tenant's and its file of kind ok is not
 * deleted; NULL with *rc MD_ENOTFOUND or MD_EREDIS. */
static redisReply *batch_fields(md_redis *r, const char *prefix, const char *tenant,
                                const char *batch, int ok, int *rc, md_err *e) {
    char key[Q_KEY_MAX];
    api_key_batch(key, prefix, batch);
    redisReply *h = md_redis_cmd(
        r, e, "HMGET %s tenant out_bytes out_lines err_bytes err_lines out_deleted err_deleted",
        key);
    if (!h) {
        *rc = MD_EREDIS;
        return NULL;
    }
    const char *t = field(h, F_TENANT);
    if (!t || strcmp(t, tenant) || field(h, ok ? F_OUT_DEL : F_ERR_DEL)) {
        freeReplyObject(h);
        *rc = MD_ENOTFOUND;
        return NULL;
    }
    *rc = 0;
    return h;
}

json_t *api_output_object(md_redis *r, const char *prefix, const char *tenant, const char *batch,
                          int ok, int sized, int *rc, md_err *e) {
    redisReply *h = batch_fields(r, prefix, tenant, batch, ok, rc, e);
    if (!h)
        return NULL;
    q_batch_info b;
    if ((*rc = q_batch_get(r, prefix, batch, &b, e))) { /* refused by validation: no stream */
        freeReplyObject(h);
        return NULL;
    }
    int done = ended(b.status), cached = field(h, ok ? F_OUT_BYTES : F_ERR_BYTES) != NULL;
    sizes z = {{0, 0}, {0, 0}};
    if (sized && done && cached) {
        z.bytes[1] = atoll(field(h, F_OUT_BYTES));
        z.lines[1] = atoll(field(h, F_OUT_LINES) ? field(h, F_OUT_LINES) : "0");
        z.bytes[0] = atoll(field(h, F_ERR_BYTES) ? field(h, F_ERR_BYTES) : "0");
        z.lines[0] = atoll(field(h, F_ERR_LINES) ? field(h, F_ERR_LINES) : "0");
    } else if (sized) {
        if ((*rc = output_sizes(r, prefix, batch, &z, e))) {
            freeReplyObject(h);
            return NULL;
        }
        char key[Q_KEY_MAX];
        api_key_batch(key, prefix, batch);
        redisReply *set = done ? md_redis_cmd(r, e,
                                              "HSET %s out_bytes %lld out_lines %lld err_bytes "
                                              "%lld err_lines %lld",
                                              key, z.bytes[1], z.lines[1], z.bytes[0], z.lines[0])
                               : NULL;
        if (set)
            freeReplyObject(set); /* a failure here only means counting again next time */
    }
    freeReplyObject(h);
    /* OpenAI's file is made when its batch ends; while it runs, the batch's start */
    long long ms = done && b.finished_at ? b.finished_at
                   : b.started_at        ? b.started_at
                                         : b.created_at;
    char id[API_ID_MAX + 16], name[API_ID_MAX + 32];
    snprintf(id, sizeof id, "file-%s-%s", ok ? "out" : "err", batch);
    snprintf(name, sizeof name, "%s_%s.jsonl", batch, ok ? "output" : "error");
    *rc = 0;
    json_t *o = json_pack("{s:s, s:s, s:I, s:I, s:s, s:s, s:s, s:n, s:n}", "id", id, "object",
                          "file", "bytes", (json_int_t)z.bytes[ok], "created_at",
                          (json_int_t)(ms / 1000), "filename", name, "purpose", "batch_output",
                          "status", "processed", "status_details", "expires_at");
    if (!sized)
        json_object_del(o, "bytes");
    return o;
}

int api_outputs_settle(md_redis *r, const char *prefix, const char *tenant, md_err *e) {
    char running[Q_KEY_MAX], files[Q_KEY_MAX], key[Q_KEY_MAX];
    api_key_tenant(running, prefix, tenant, "running");
    api_key_tenant(files, prefix, tenant, "files");
    redisReply *ids = md_redis_cmd(r, e, "SMEMBERS %s", running);
    if (!ids)
        return MD_EREDIS;
    size_t n = ids->type == REDIS_REPLY_ARRAY ? ids->elements : 0;
    redisContext *ctx = md_redis_ctx(r);
    for (size_t i = 0; i < n; i++) {
        q_key_meta(key, prefix, ids->element[i]->str);
        redisAppendCommand(ctx, "HMGET %s status completed failed finished_at", key);
        api_key_batch(key, prefix, ids->element[i]->str);
        redisAppendCommand(ctx, "HMGET %s out_deleted err_deleted", key);
    }
    size_t queued = 0; /* commands appended after the reads, whose replies are owed */
    for (size_t i = 0; i < n; i++) {
        redisReply *m = md_redis_get_reply(r, e), *d = m ? md_redis_get_reply(r, e) : NULL;
        if (!d) {
            if (m)
                freeReplyObject(m);
            freeReplyObject(ids);
            return MD_EREDIS; /* the caller marks the connection broken */
        }
        const char *st = field(m, 0), *batch = ids->element[i]->str;
        if (!st || ended(st) || !strcmp(st, "failed")) {
            /* ended (or never queued: refused by validation) */
            long long ms = field(m, 3) ? atoll(field(m, 3)) : 0;
            ms = ms ? ms : (long long)md_wall_ms();
            if (st && field(m, 1) && atoll(field(m, 1)) > 0 && !field(d, 0)) {
                redisAppendCommand(ctx, "ZADD %s NX %lld file-out-%s", files, ms, batch);
                queued++;
            }
            if (st && field(m, 2) && atoll(field(m, 2)) > 0 && !field(d, 1)) {
                redisAppendCommand(ctx, "ZADD %s NX %lld file-err-%s", files, ms, batch);
                queued++;
            }
            redisAppendCommand(ctx, "SREM %s %s", running, batch);
            queued++;
        }
        freeReplyObject(m);
        freeReplyObject(d);
    }
    freeReplyObject(ids);
    for (size_t i = 0; i < queued; i++) {
        redisReply *rep = md_redis_get_reply(r, e);
        if (!rep)
            return MD_EREDIS;
        freeReplyObject(rep);
    }
    return 0;
}

int api_output_delete(md_redis *r, const char *prefix, const char *tenant, const char *batch,
                      int ok, md_err *e) {
    int rc;
    redisReply *h = batch_fields(r, prefix, tenant, batch, ok, &rc, e);
    if (!h)
        return rc == MD_ENOTFOUND ? md_errf(e, MD_ENOTFOUND, "no such file") : rc;
    freeReplyObject(h);
    q_batch_info b;
    if ((rc = q_batch_get(r, prefix, batch, &b, e)))
        return rc;
    if (!q_status_terminal(b.status))
        return md_errf(e, MD_EINVAL,
                       "batch %s is %s: its %s file can be deleted once the batch has ended "
                       "(cancel it first)",
                       batch, b.status, ok ? "output" : "error");
    char key[Q_KEY_MAX], files[Q_KEY_MAX], id[API_ID_MAX + 16];
    api_key_batch(key, prefix, batch);
    api_key_tenant(files, prefix, tenant, "files");
    snprintf(id, sizeof id, "file-%s-%s", ok ? "out" : "err", batch);
    /* marked first: a settle that runs meanwhile does not list it again */
    redisReply *rep = md_redis_cmd(r, e, "HSET %s %s %lld", key, ok ? "out_deleted" : "err_deleted",
                                   (long long)(md_wall_ms() / 1000));
    if (!rep)
        return MD_EREDIS;
    freeReplyObject(rep);
    if (!(rep = md_redis_cmd(r, e, "ZREM %s %s", files, id)))
        return MD_EREDIS;
    freeReplyObject(rep);
    /* the stream entries of this kind, a page at a time; the stream's nodes are freed by
     * Redis as their entries go */
    char out[Q_KEY_MAX], start[64] = "-";
    q_key_out(out, prefix, batch);
    const char *argv[PAGE + 2];
    size_t argl[PAGE + 2];
    for (;;) {
        redisReply *page = md_redis_cmd(r, e, "XRANGE %s %s + COUNT %d", out, start, PAGE);
        if (!page)
            return MD_EREDIS;
        size_t n = page->type == REDIS_REPLY_ARRAY ? page->elements : 0, k = 2;
        argv[0] = "XDEL";
        argl[0] = 4;
        argv[1] = out;
        argl[1] = strlen(out);
        for (size_t i = 0; i < n; i++) {
            q_out_entry o;
            q_out_entry_parse(page->element[i], &o);
            if (o.ok == ok) {
                argv[k] = page->element[i]->element[0]->str;
                argl[k++] = page->element[i]->element[0]->len;
            }
        }
        if (n)
            snprintf(start, sizeof start, "(%s", page->element[n - 1]->element[0]->str);
        rep = k > 2 ? md_redis_cmd_argv(r, (int)k, argv, argl, e) : NULL;
        int bad = k > 2 && !rep;
        if (rep)
            freeReplyObject(rep);
        freeReplyObject(page);
        if (bad)
            return MD_EREDIS;
        if (n < PAGE)
            return 0;
    }
}
