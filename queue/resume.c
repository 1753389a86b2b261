/* resume.c — see resume.h. A submission killed half-way leaves its batch `validating` with
 * the lines it queued recorded in P {B}:sent (queue.c records each custom_id once its XADD
 * is confirmed); the same input submitted again under the same id queues only the others
 * and seals. The input is recognised by the SHA-256 of its lines, stored in the batch hash
 * as input_sha when it is created. */
#include "queue/resume.h"

#include <stdlib.h>
#include <string.h>

#include "queue/queue.h"

int q_batch_existing(md_redis *r, const char *prefix, const char *batch, const char *sha,
                     int *resume, long long *total, md_err *e) {
    q_batch_info b;
    *resume = 0;
    *total = 0;
    int rc = q_batch_get(r, prefix, batch, &b, e);
    if (rc)
        return rc;
    if (strcmp(b.input_sha, sha))
        return md_errf(e, MD_EINVAL,
                       "batch %s exists with another input (%s, SHA-256 %.12s…, this one "
                       "%.12s…): choose another --batch-id",
                       batch, b.status, b.input_sha[0] ? b.input_sha : "not recorded", sha);
    if (!strcmp(b.status, "failed"))
        return md_errf(e, MD_EINVAL,
                       "batch %s failed during its submission (%s): choose another "
                       "--batch-id",
                       batch, b.errors);
    *resume = !strcmp(b.status, "validating");
    *total = b.total;
    return 0;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int q_sent_load(md_redis *r, const char *prefix, const char *batch, q_sent_set *out, md_err *e) {
    memset(out, 0, sizeof *out);
    char key[Q_KEY_MAX];
    q_key_sent(key, prefix, batch);
    redisReply *rep = md_redis_cmd(r, e, "SMEMBERS %s", key);
    if (!rep)
        return MD_EREDIS;
    int rc = 0;
    if (rep->type != REDIS_REPLY_ARRAY)
        rc = md_errf(e, MD_EREDIS, "SMEMBERS %s: %s", key,
                     rep->type == REDIS_REPLY_ERROR ? rep->str : "unexpected reply");
    else if (rep->elements && !(out->ids = calloc(rep->elements, sizeof *out->ids)))
        rc = md_errf(e, MD_ENOMEM, "out of memory");
    else
        out->cap = rep->elements;
    for (size_t i = 0; !rc && i < rep->elements; i++) {
        if (!rep->element[i]->str)
            continue;
        if (!(out->ids[out->n] = strdup(rep->element[i]->str)))
            rc = md_errf(e, MD_ENOMEM, "out of memory");
        else
            out->n++;
    }
    freeReplyObject(rep);
    if (rc) {
        q_sent_free(out);
        return rc;
    }
    if (out->n > 1)
        qsort(out->ids, out->n, sizeof *out->ids, cmp_str);
    return 0;
}

int q_sent_add(q_sent_set *s, const char *cid) {
    if (s->n == s->cap) {
        size_t cap = s->cap > s->n ? s->cap : (s->n ? 2 * s->n : 256);
        char **v = realloc(s->ids, cap * sizeof *v);
        if (!v)
            return MD_ENOMEM;
        s->ids = v;
        s->cap = cap;
    }
    if (!(s->ids[s->n] = strdup(cid)))
        return MD_ENOMEM;
    s->n++;
    return 0;
}

void q_sent_sort(q_sent_set *s) {
    if (s->n > 1)
        qsort(s->ids, s->n, sizeof *s->ids, cmp_str);
}

int q_sent_has(const q_sent_set *s, const char *cid) {
    return s->n && cid && bsearch(&cid, s->ids, s->n, sizeof *s->ids, cmp_str) != NULL;
}

void q_sent_free(q_sent_set *s) {
    for (size_t i = 0; i < s->n; i++)
        free(s->ids[i]);
    free(s->ids);
    memset(s, 0, sizeof *s);
}
