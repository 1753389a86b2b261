/* resume.h — submitting a batch again under its --batch-id (resume.c): what the batch
 * already holds decides whether a retry does nothing, finishes a half-written submission,
 * or is refused (docs/protocol.md §3, "Submitting again"). */
#ifndef MEDLEY_QUEUE_RESUME_H
#define MEDLEY_QUEUE_RESUME_H
#include <stddef.h>
#include "common/err.h"
#include "common/redis.h"

/* The custom_ids a batch's earlier submissions queued (P {B}:sent), sorted. */
typedef struct {
    char **ids;
    size_t n, cap;
} q_sent_set;

/* A batch B submitted before, against this input (sha: SHA-256 hex of the lines):
 * MD_ENOTFOUND when there is no batch B; 0 with *resume = 0 and *total its line count when
 * B is sealed with this input (nothing to queue); 0 with *resume = 1 when B is still being
 * submitted (validating) with this input; MD_EINVAL naming why when B holds another input or
 * its submission failed. */
int q_batch_existing(md_redis *r, const char *prefix, const char *batch, const char *sha,
                     int *resume, long long *total, md_err *e);
/* Load P {B}:sent into *out (caller frees with q_sent_free). */
int q_sent_load(md_redis *r, const char *prefix, const char *batch, q_sent_set *out, md_err *e);
/* Add cid at the end (0, or MD_ENOMEM); q_sent_sort before q_sent_has. */
int q_sent_add(q_sent_set *s, const char *cid);
void q_sent_sort(q_sent_set *s);
/* 1 when cid is in the set (sorted). */
int q_sent_has(const q_sent_set *s, const char *cid);
void q_sent_free(q_sent_set *s);
#endif
