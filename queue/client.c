/* client.c — see client.h. */
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
