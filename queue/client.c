/* client.c — see client.h. */
#include "queue/client.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "queue/resume.h"

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

/* The FILE behind q_submit_file as a q_line_reader. */
typedef struct {
    FILE *f;
    const char *path;
    char *line;
    size_t cap;
} file_reader;

static int file_next(void *ctx, const char **line, size_t *len, md_err *e) {
    file_reader *fr = ctx;
    ssize_t n = getline(&fr->line, &fr->cap, fr->f);
    if (n >= 0) {
        *line = fr->line;
        *len = (size_t)n;
        return 1;
    }
    if (ferror(fr->f))
        return md_errf(e, MD_EIO, "reading %s: %s", fr->path, strerror(errno));
    return 0;
}

static int file_rewind(void *ctx, md_err *e) {
    file_reader *fr = ctx;
    if (fseek(fr->f, 0, SEEK_SET))
        return md_errf(e, MD_EIO, "rewinding %s: %s", fr->path, strerror(errno));
    clearerr(fr->f);
    return 0;
}

int q_submit_file(md_redis *r, const q_submit_opts *o, char batch_out[Q_BATCH_ID_MAX],
                  long long *n_lines, md_err *e) {
    file_reader fr = {.path = o->path};
    fr.f = fopen(o->path, "rb");
    if (!fr.f)
        return md_errf(e, MD_EIO, "cannot open %s: %s", o->path, strerror(errno));
    q_line_reader rd = {.next = file_next, .rewind = file_rewind, .ctx = &fr};
    int rc = q_submit_lines(r, o, &rd, batch_out, n_lines, e);
    free(fr.line);
    fclose(fr.f);
    return rc;
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

/* One output entry's fields (pointers into the reply). */
typedef struct {
    const char *line, *ok, *cid;
    size_t llen;
} out_entry;

static int parse_entry(redisReply *en, out_entry *o) {
    memset(o, 0, sizeof *o);
    o->ok = "1";
    if (en->type != REDIS_REPLY_ARRAY || en->elements < 2)
        return 0;
    redisReply *fl = en->element[1];
    for (size_t k = 0; fl->type == REDIS_REPLY_ARRAY && k + 1 < fl->elements; k += 2) {
        const char *f = fl->element[k]->str;
        if (!strcmp(f, "line")) {
            o->line = fl->element[k + 1]->str;
            o->llen = fl->element[k + 1]->len;
        } else if (!strcmp(f, "ok")) {
            o->ok = fl->element[k + 1]->str;
        } else if (!strcmp(f, "custom_id")) {
            o->cid = fl->element[k + 1]->str;
        }
    }
    return o->line != NULL;
}

/* Write one output line to out (ok = 1) or err; counts in n_out / n_err. */
static int write_line(const out_entry *o, FILE *out, FILE *err, long long *n_out, long long *n_err,
                      md_err *e) {
    int good = !strcmp(o->ok, "1");
    FILE *dst = good || !err ? out : err;
    if (fwrite(o->line, 1, o->llen, dst) != o->llen || fputc('\n', dst) == EOF)
        return md_errf(e, MD_EIO, "writing results: %s", strerror(errno));
    if (good)
        (*n_out)++;
    else
        (*n_err)++;
    return 0;
}

/* Lines whose entry the batch's ids do not hold: kept aside until every trusted line is
 * written (a custom_id, the line, ok). */
typedef struct {
    char **cid, **line;
    int *ok;
    size_t n, cap;
} held_lines;

static int hold(held_lines *h, const out_entry *o) {
    if (h->n == h->cap) {
        size_t cap = h->cap ? 2 * h->cap : 64;
        char **c = realloc(h->cid, cap * sizeof *c),
             **l = c ? realloc(h->line, cap * sizeof *l) : NULL;
        int *k = l ? realloc(h->ok, cap * sizeof *k) : NULL;
        if (c)
            h->cid = c;
        if (l)
            h->line = l;
        if (k)
            h->ok = k;
        if (!c || !l || !k)
            return MD_ENOMEM;
        h->cap = cap;
    }
    h->cid[h->n] = strdup(o->cid ? o->cid : "");
    h->line[h->n] = strndup(o->line, o->llen);
    h->ok[h->n] = !strcmp(o->ok, "1");
    if (!h->cid[h->n] || !h->line[h->n])
        return MD_ENOMEM;
    h->n++;
    return 0;
}

static void held_free(held_lines *h) {
    for (size_t i = 0; i < h->n; i++) {
        free(h->cid[i]);
        free(h->line[i]);
    }
    free(h->cid);
    free(h->line);
    free(h->ok);
}

/* The lines held aside: one is written when its custom_id is one the batch's submissions
 * queued (P {B}:sent) and no trusted line answered it (a line whose entry a killed submit
 * queued without recording it: docs/protocol.md §5); the others are forged. seen: the
 * custom_ids written (q_sent_set, sorted here). */
static int write_held(md_redis *r, const char *prefix, const char *batch, held_lines *h,
                      q_sent_set *seen, FILE *out, FILE *err, long long *n_out, long long *n_err,
                      long long *forged, md_err *e) {
    q_sent_set sent;
    int rc = q_sent_load(r, prefix, batch, &sent, e);
    q_sent_sort(seen);
    for (size_t i = 0; !rc && i < h->n; i++) {
        if (!q_sent_has(&sent, h->cid[i]) || q_sent_has(seen, h->cid[i])) {
            (*forged)++;
            continue;
        }
        out_entry o = {.line = h->line[i],
                       .llen = strlen(h->line[i]),
                       .ok = h->ok[i] ? "1" : "0",
                       .cid = h->cid[i]};
        if (!(rc = write_line(&o, out, err, n_out, n_err, e)))
            rc = q_sent_add(seen, h->cid[i]);
        q_sent_sort(seen);
    }
    q_sent_free(&sent);
    return rc;
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
    held_lines held = {0};
    q_sent_set seen = {0};
    int rc = 0;
    for (;;) {
        redisReply *rep = md_redis_cmd(r, e, "XRANGE %s %s + COUNT 2000", key, start);
        if (!rep) {
            rc = MD_EREDIS;
            break;
        }
        rc = rep->type != REDIS_REPLY_ARRAY
                 ? md_errf(e, MD_EREDIS, "XRANGE %s: %s", key,
                           rep->type == REDIS_REPLY_ERROR ? rep->str : "unexpected reply")
                 : trusted_entries(r, ids, have_ids, rep, ok, e);
        size_t n = rc ? 0 : rep->elements;
        for (size_t i = 0; i < n && !rc; i++) {
            out_entry o;
            if (!parse_entry(rep->element[i], &o))
                continue;
            if (!ok[i])
                rc = hold(&held, &o) ? md_errf(e, MD_ENOMEM, "out of memory") : 0;
            else if (!(rc = write_line(&o, out, err, n_out, n_err, e)) && have_ids && o.cid)
                rc = q_sent_add(&seen, o.cid) ? md_errf(e, MD_ENOMEM, "out of memory") : 0;
        }
        if (!rc && n > 0)
            snprintf(start, sizeof start, "(%s", rep->element[n - 1]->element[0]->str);
        freeReplyObject(rep);
        if (rc || n < 2000)
            break;
    }
    if (!rc && held.n)
        rc = write_held(r, prefix, batch, &held, &seen, out, err, n_out, n_err, &forged, e);
    held_free(&held);
    q_sent_free(&seen);
    if (!rc && forged)
        MD_WARN("results",
                "batch %s: dropped %lld line(s) of %s whose queue entry the batch never "
                "had (forged answers; docs/operations.md, \"Threat model\")",
                batch, forged, key);
    return rc;
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
