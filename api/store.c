/* store.c — what the API keeps in Redis (docs/api.md "Redis keys"): key names, a tenant's
 * index pages, a stored file body read back as lines (the q_line_reader of q_submit_lines)
 * or streamed to a client a chunk at a time, and a batch's output stream served as the
 * output and error files. Nothing here holds a whole file in memory: one chunk (API_CHUNK)
 * or one page of output lines at a time (and the lines whose queue entry the batch's ids do
 * not hold, rare, until the end: the same check as `medley results`, q_trust of
 * queue/trust.c; the forged ones are dropped and counted in medley_forged_answers_total). */
#include <stdlib.h>
#include <string.h>

#include "api/api_int.h"
#include "queue/queue.h"

void api_key_file(char *out, const char *prefix, const char *file) {
    snprintf(out, Q_KEY_MAX, "%sfile:{%s}", prefix, file);
}
void api_key_file_data(char *out, const char *prefix, const char *file) {
    snprintf(out, Q_KEY_MAX, "%sfile:{%s}:data", prefix, file);
}
void api_key_tenant(char *out, const char *prefix, const char *tenant, const char *what) {
    snprintf(out, Q_KEY_MAX, "%stenant:{%s}:%s", prefix, tenant, what);
}
void api_key_batch(char *out, const char *prefix, const char *batch) {
    snprintf(out, Q_KEY_MAX, "%sapi:{%s}", prefix, batch);
}

json_t *api_list_page(md_redis *r, const char *zkey, long long limit, const char *after, int desc,
                      json_t *(*one)(void *ctx, const char *id), void *ctx, md_err *e) {
    long long start = 0;
    if (after) {
        redisReply *rk = desc ? md_redis_cmd(r, e, "ZREVRANK %s %s", zkey, after)
                              : md_redis_cmd(r, e, "ZRANK %s %s", zkey, after);
        if (!rk)
            return NULL;
        start = rk->type == REDIS_REPLY_INTEGER ? rk->integer + 1 : 0;
        freeReplyObject(rk);
    }
    /* ids a window at a time until limit objects and one more (has_more) are found: one()
     * may leave ids out (another purpose), and a page of fewer than limit with has_more set
     * would end a client's paging (the SDK stops at an empty page) */
    const long long window = limit + 1 > 100 ? limit + 1 : 100;
    json_t *data = json_array();
    int more = 0;
    for (;;) {
        redisReply *rep =
            desc ? md_redis_cmd(r, e, "ZREVRANGE %s %lld %lld", zkey, start, start + window - 1)
                 : md_redis_cmd(r, e, "ZRANGE %s %lld %lld", zkey, start, start + window - 1);
        if (!rep) {
            json_decref(data);
            return NULL;
        }
        size_t n = rep->type == REDIS_REPLY_ARRAY ? rep->elements : 0;
        for (size_t i = 0; i < n && !more; i++) {
            json_t *o = one(ctx, rep->element[i]->str);
            if (o && (long long)json_array_size(data) == limit) {
                more = 1;
                json_decref(o);
            } else if (o) {
                json_array_append_new(data, o);
            }
        }
        freeReplyObject(rep);
        if (more || (long long)n < window)
            break;
        start += window;
    }
    size_t k = json_array_size(data);
    json_t *first = k ? json_object_get(json_array_get(data, 0), "id") : NULL;
    json_t *last = k ? json_object_get(json_array_get(data, k - 1), "id") : NULL;
    return json_pack("{s:s, s:o, s:O?, s:O?, s:b}", "object", "list", "data", data, "first_id",
                     first, "last_id", last, "has_more", more);
}

struct api_file_reader {
    md_redis *r;
    char key[Q_KEY_MAX];
    long long max_line, chunk_i, lineno;
    redisReply *chunk; /* the chunk being read, and where */
    size_t pos;
    char *line; /* a line that spans chunks is put together here */
    size_t len, cap;
    int done;
};

api_file_reader *api_file_reader_new(md_redis *r, const char *data_key, long long max_line) {
    api_file_reader *fr = calloc(1, sizeof *fr);
    if (!fr)
        return NULL;
    fr->r = r;
    fr->max_line = max_line;
    snprintf(fr->key, sizeof fr->key, "%s", data_key);
    return fr;
}

void api_file_reader_free(api_file_reader *fr) {
    if (!fr)
        return;
    if (fr->chunk)
        freeReplyObject(fr->chunk);
    free(fr->line);
    free(fr);
}

int api_file_reader_rewind(void *ctx, md_err *e) {
    (void)e;
    api_file_reader *fr = ctx;
    if (fr->chunk)
        freeReplyObject(fr->chunk);
    fr->chunk = NULL;
    fr->chunk_i = fr->lineno = 0;
    fr->pos = fr->len = 0;
    fr->done = 0;
    return 0;
}

long long api_file_reader_lineno(const api_file_reader *fr) {
    return fr->lineno;
}

/* The next chunk; 0 and fr->done at the end. */
static int next_chunk(api_file_reader *fr, md_err *e) {
    if (fr->chunk)
        freeReplyObject(fr->chunk);
    fr->chunk = md_redis_cmd(fr->r, e, "LINDEX %s %lld", fr->key, fr->chunk_i++);
    if (!fr->chunk)
        return MD_EREDIS;
    fr->pos = 0;
    if (fr->chunk->type != REDIS_REPLY_STRING) {
        freeReplyObject(fr->chunk);
        fr->chunk = NULL;
        fr->done = 1;
    }
    return 0;
}

static int append(api_file_reader *fr, const char *s, size_t n, md_err *e) {
    if ((long long)(fr->len + n) > fr->max_line)
        return md_errf(e, MD_EINVAL, "line %lld is longer than %lld bytes", fr->lineno + 1,
                       fr->max_line);
    if (fr->len + n + 1 > fr->cap) {
        size_t cap = (fr->len + n + 1) * 2;
        char *nl = realloc(fr->line, cap);
        if (!nl)
            return md_errf(e, MD_ENOMEM, "out of memory");
        fr->line = nl;
        fr->cap = cap;
    }
    memcpy(fr->line + fr->len, s, n);
    fr->len += n;
    return 0;
}

int api_file_reader_next(void *ctx, const char **line, size_t *len, md_err *e) {
    api_file_reader *fr = ctx;
    int rc;
    fr->len = 0;
    for (;;) {
        if (!fr->done && (!fr->chunk || fr->pos >= fr->chunk->len) && (rc = next_chunk(fr, e)))
            return rc;
        if (fr->done) {
            if (!fr->len)
                return 0;
            break;
        }
        const char *s = fr->chunk->str + fr->pos;
        size_t left = fr->chunk->len - fr->pos;
        const char *nl = memchr(s, '\n', left);
        size_t n = nl ? (size_t)(nl - s) + 1 : left;
        if ((rc = append(fr, s, n, e)))
            return rc;
        fr->pos += n;
        if (nl)
            break;
    }
    fr->lineno++;
    *line = fr->line;
    *len = fr->len;
    return 1;
}

/* A streamed response: a stored body's chunks, or a batch's output entries of one kind. */
typedef struct {
    api_server *s;
    char key[Q_KEY_MAX];
    int output, ok; /* output: the key is a batch's :out stream */
    char batch[Q_BATCH_ID_MAX];
    long long chunk_i;
    char start[64];      /* output: the XRANGE cursor */
    redisReply *page;    /* what is being sent, and how far */
    size_t item, off, n; /* item of page (chunks: 0 only) */
    int done;
    q_trust *trust; /* output: which lines answer the batch's own entries */
    char emit[500]; /* output: of page, the lines to send now (q_trust_page) */
    char *tail;     /* output: the lines kept aside that pass, sent last */
    size_t tail_len, tail_cap, tail_off;
    int finished; /* output: q_trust_finish has run */
} stream;

static void stream_free(void *cls) {
    stream *st = cls;
    if (st->page)
        freeReplyObject(st->page);
    q_trust_free(st->trust);
    free(st->tail);
    free(st);
}

/* The line of XRANGE entry en when its ok field is st->ok; NULL otherwise. */
static const redisReply *entry_line(const stream *st, const redisReply *en) {
    if (en->type != REDIS_REPLY_ARRAY || en->elements < 2 ||
        en->element[1]->type != REDIS_REPLY_ARRAY)
        return NULL;
    const redisReply *fl = en->element[1], *line = NULL;
    int ok = 1;
    for (size_t k = 0; k + 1 < fl->elements; k += 2) {
        if (!strcmp(fl->element[k]->str, "line"))
            line = fl->element[k + 1];
        else if (!strcmp(fl->element[k]->str, "ok"))
            ok = !strcmp(fl->element[k + 1]->str, "1");
    }
    return ok == st->ok ? line : NULL;
}

/* q_trust_finish's lines of st's kind, appended to st->tail with their newlines. */
static int tail_add(void *ctx, const q_out_entry *o) {
    stream *st = ctx;
    if (o->ok != st->ok)
        return 0;
    if (st->tail_len + o->llen + 1 > st->tail_cap) {
        size_t cap = 2 * (st->tail_len + o->llen + 1);
        char *t = realloc(st->tail, cap);
        if (!t)
            return MD_ENOMEM;
        st->tail = t;
        st->tail_cap = cap;
    }
    memcpy(st->tail + st->tail_len, o->line, o->llen);
    st->tail_len += o->llen;
    st->tail[st->tail_len++] = '\n';
    return 0;
}

/* After the last page: the lines kept aside that pass into st->tail, the forged ones
 * counted. 0 or -1 on a Redis failure. */
static int finish_output(stream *st) {
    md_err e = {0};
    md_redis *r = api_redis(st->s, &e);
    long long forged = 0;
    st->finished = 1;
    if (!r || (st->trust && q_trust_finish(st->trust, r, tail_add, st, &forged, &e))) {
        api_redis_failed();
        return -1;
    }
    md_counter_add(md_metric_at0(st->s->m_forged), (double)forged);
    return 0;
}

/* The next page into st->page (NULL and st->done at the end); 0 or -1 on a Redis failure. */
static int next_page(stream *st) {
    md_err e = {0};
    md_redis *r = api_redis(st->s, &e);
    if (st->page)
        freeReplyObject(st->page);
    st->page = NULL;
    st->item = st->off = 0;
    if (!r)
        return -1;
    if (st->output && !st->trust && q_trust_new(r, st->s->prefix, st->batch, &st->trust, &e)) {
        api_redis_failed();
        return -1;
    }
    st->page = st->output ? md_redis_cmd(r, &e, "XRANGE %s %s + COUNT 500", st->key, st->start)
                          : md_redis_cmd(r, &e, "LINDEX %s %lld", st->key, st->chunk_i++);
    if (!st->page) {
        api_redis_failed();
        return -1;
    }
    if (st->output) {
        size_t n = st->page->type == REDIS_REPLY_ARRAY ? st->page->elements : 0;
        if (n > sizeof st->emit || (n && q_trust_page(st->trust, r, st->page, st->emit, &e))) {
            freeReplyObject(st->page);
            st->page = NULL;
            api_redis_failed();
            return -1;
        }
        if (n)
            snprintf(st->start, sizeof st->start, "(%s", st->page->element[n - 1]->element[0]->str);
        if (n < 500)
            st->done = 1; /* this page is the last; send it first */
        if (n == 0) {
            freeReplyObject(st->page);
            st->page = NULL;
        }
    } else if (st->page->type != REDIS_REPLY_STRING) {
        freeReplyObject(st->page);
        st->page = NULL;
        st->done = 1;
    }
    return 0;
}

/* Fill buf with what comes next (chunks, or output lines each with its newline), as much as
 * fits: libmicrohttpd sends what one call returns, so small returns would mean small sends. */
static ssize_t stream_cb(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    stream *st = cls;
    size_t got = 0;
    while (got < max) {
        if (!st->page) {
            if (st->done && st->output && !st->finished && finish_output(st))
                return got ? (ssize_t)got : MHD_CONTENT_READER_END_WITH_ERROR;
            if (st->done && st->tail_off < st->tail_len) {
                size_t n = st->tail_len - st->tail_off;
                n = n < max - got ? n : max - got;
                memcpy(buf + got, st->tail + st->tail_off, n);
                st->tail_off += n;
                got += n;
                continue;
            }
            if (st->done)
                break;
            if (next_page(st))
                return got ? (ssize_t)got : MHD_CONTENT_READER_END_WITH_ERROR;
            continue;
        }
        const redisReply *piece = st->page;
        if (st->output) {
            while (st->item < st->page->elements &&
                   !(st->emit[st->item] && (piece = entry_line(st, st->page->element[st->item]))))
                st->item++;
            if (st->item >= st->page->elements) {
                freeReplyObject(st->page);
                st->page = NULL;
                continue;
            }
        }
        size_t total = piece->len + (st->output ? 1 : 0);
        if (st->off >= total) {
            st->off = 0;
            if (st->output) {
                st->item++;
            } else {
                freeReplyObject(st->page);
                st->page = NULL;
            }
            continue;
        }
        if (st->off == piece->len) { /* an output line's newline */
            buf[got++] = '\n';
            st->off++;
            continue;
        }
        size_t n = piece->len - st->off < max - got ? piece->len - st->off : max - got;
        memcpy(buf + got, piece->str + st->off, n);
        st->off += n;
        got += n;
    }
    return got ? (ssize_t)got : MHD_CONTENT_READER_END_OF_STREAM;
}

static struct MHD_Response *stream_new(api_server *s, const char *key, const char *batch, int ok) {
    stream *st = calloc(1, sizeof *st);
    if (!st)
        return NULL;
    *st = (stream){.s = s, .output = batch != NULL, .ok = ok};
    snprintf(st->key, sizeof st->key, "%s", key);
    snprintf(st->batch, sizeof st->batch, "%s", batch ? batch : "");
    snprintf(st->start, sizeof st->start, "-");
    struct MHD_Response *r =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 64 * 1024, stream_cb, st, stream_free);
    if (!r)
        stream_free(st);
    return r;
}

struct MHD_Response *api_stream_data(api_server *s, const char *data_key) {
    return stream_new(s, data_key, NULL, 1);
}

struct MHD_Response *api_stream_output(api_server *s, const char *batch, int ok) {
    char key[Q_KEY_MAX];
    q_key_out(key, s->prefix, batch);
    return stream_new(s, key, batch, ok);
}
