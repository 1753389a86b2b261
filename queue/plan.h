/* plan.h — the scheduler's plan as the queue reads it (schemas/plan.schema.json, key
 * P plan, version announced in P plan:version): the document and its version, and the
 * request-size classes of a model, which route each submitted line to a stream (the
 * submitter's routing). docs/protocol.md §3 (routing) and §6 are the contract. Which
 * replicas a worker serves (`medley worker --follow-plan`) is worker/assign.h's.
 *
 * Classes: plan.classes[] entries {model, name, max_tokens}; a request goes to the smallest
 * class of its model whose max_tokens bounds its estimated size (q_estimate_tokens), the
 * largest class when none does.
 *
 * Documents are the caller's (jansson references); nothing here keeps a pointer into them. */
#ifndef MEDLEY_QUEUE_PLAN_H
#define MEDLEY_QUEUE_PLAN_H

#include <jansson.h>

#include "common/err.h"
#include "common/redis.h"

#define Q_CLASS_MAX 8    /* classes per model, as the scheduler's SCHED_MAX_CLASSES */
#define Q_CLASS_NAME 64  /* class names: 1..63 chars of [A-Za-z0-9_.-] */
#define Q_MODEL_NAME 128 /* model names as queue keys take them */

typedef struct {
    char name[Q_CLASS_NAME];
    long long max_tokens; /* bound on estimated prompt + max output tokens */
} q_class;

/* GET P plan. *plan is the parsed document (caller decrefs) or NULL when there is no plan
 * key. A plan that is not JSON, or has no integer version, is an error (MD_EINVAL). */
int q_plan_get(md_redis *r, const char *prefix, json_t **plan, md_err *e);
/* The plan's version (-1 when absent or not an integer). */
long long q_plan_version(const json_t *plan);

/* A model's classes, sorted by max_tokens ascending. Returns how many (0: the plan defines
 * none for it: route to P q:{M}), or MD_EINVAL when an entry is malformed (bad name, missing
 * or non-positive max_tokens, a name twice, more than Q_CLASS_MAX). */
int q_plan_classes(const json_t *plan, const char *model, q_class out[Q_CLASS_MAX], md_err *e);

/* Estimated tokens of one input line's body: ceil(prompt bytes / 4) + max_tokens, where
 * prompt bytes sum every string content (chat messages, text parts) or the prompt, and
 * max_tokens is body.max_tokens (else max_completion_tokens, else default_max_tokens). A
 * body that is not an object counts as default_max_tokens. */
long long q_estimate_tokens(const json_t *body, int default_max_tokens);

/* The class for an estimate: the smallest (classes are sorted) whose max_tokens >= tokens,
 * else the largest. n must be > 0. */
const q_class *q_class_pick(const q_class *c, int n, long long tokens);

/* A valid class name: 1..63 chars of [A-Za-z0-9_.-]. */
int q_class_name_check(const char *name, md_err *e);

#endif
