/* client.c — see client.h (which answers to trust: trust.c). */
#include "queue/client.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"

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

/* Write one output line to out (ok = 1) or err; counts in n_out / n_err. */
typedef struct {
    FILE *out, *err;
    long long *n_out, *n_err;
    md_err *e;
} line_sink;

static int write_line(void *ctx, const q_out_entry *o) {
    line_sink *k = ctx;
    FILE *dst = o->ok || !k->err ? k->out : k->err;
    if (fwrite(o->line, 1, o->llen, dst) != o->llen || fputc('\n', dst) == EOF)
        return md_errf(k->e, MD_EIO, "writing results: %s", strerror(errno));
    if (o->ok)
        (*k->n_out)++;
    else
        (*k->n_err)++;
    return 0;
}

int q_results_write(md_redis *r, const char *prefix, const char *batch, FILE *out, FILE *err,
                    long long *n_out, long long *n_err, md_err *e) {
    char key[Q_KEY_MAX], start[64] = "-", emit[2000];
    q_key_out(key, prefix, batch);
    *n_out = *n_err = 0;
    line_sink sink = {out, err, n_out, n_err, e};
    q_trust *t = NULL;
    int rc = q_trust_new(r, prefix, batch, &t, e);
    for (; !rc;) {
        redisReply *rep = md_redis_cmd(r, e, "XRANGE %s %s + COUNT 2000", key, start);
        if (!rep) {
            rc = MD_EREDIS;
            break;
        }
        rc = rep->type != REDIS_REPLY_ARRAY
                 ? md_errf(e, MD_EREDIS, "XRANGE %s: %s", key,
                           rep->type == REDIS_REPLY_ERROR ? rep->str : "unexpected reply")
                 : q_trust_page(t, r, rep, emit, e);
        size_t n = rc ? 0 : rep->elements;
        for (size_t i = 0; i < n && !rc; i++) {
            q_out_entry o;
            if (emit[i] && q_out_entry_parse(rep->element[i], &o))
                rc = write_line(&sink, &o);
        }
        if (!rc && n > 0)
            snprintf(start, sizeof start, "(%s", rep->element[n - 1]->element[0]->str);
        freeReplyObject(rep);
        if (rc || n < 2000)
            break;
    }
    long long forged = 0;
    if (!rc)
        rc = q_trust_finish(t, r, write_line, &sink, &forged, e);
    q_trust_free(t);
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
