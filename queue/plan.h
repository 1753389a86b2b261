/* plan.h — what the queue reads from the scheduler's plan (schemas/plan.schema.json, key
 * P plan, version announced in P plan:version): the request-size classes of a model (for
 * the submitter's routing) and the replicas a worker serves (for `medley worker
 * --follow-plan`). docs/protocol.md §5 is the contract.
 *
 * Classes: plan.classes[] entries {model, name, max_tokens}; a request goes to the smallest
 * class of its model whose max_tokens bounds its estimated size (q_estimate_tokens), the
 * largest class when none does.
 *
 * Device names: the scheduler names a heartbeat's GPUs "{W}/<i>" (one device type) or
 * "{W}#<type>/<i>" (several types): scheduler/daemon.c names one fleet pool per worker and
 * GPU type after the tail of the heartbeat key P worker:{W} (hash tag included), and
 * scheduler/milp.c numbers GPUs inside a pool. "W/<i>" (no braces) is accepted too. A
 * worker serves every replica that has one of its devices in any stage, and reads the
 * class streams those replicas list plus any class of the model no replica lists.
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
#define Q_ASSIGN_MAX 16  /* models one worker serves from a plan */

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

/* What one worker serves under a plan. */
typedef struct {
    char model[Q_MODEL_NAME];
    char classes[Q_CLASS_MAX][Q_CLASS_NAME]; /* union over the replicas; may be empty */
    int n_classes;
    char replicas[256]; /* replica ids, comma-separated, for heartbeats and logs */
} q_assign;

/* 1 when the plan's GPU id names one of worker's devices: "{W}/<i>", "{W}#<type>/<i>", or
 * the same without braces. */
int q_gpu_of_worker(const char *gpu, const char *worker);

/* The models (with their classes) of the replicas that name this worker's devices, at most
 * Q_ASSIGN_MAX (more is MD_EINVAL). Returns how many. Malformed replicas are MD_EINVAL. */
int q_plan_assignment(const json_t *plan, const char *worker, q_assign out[Q_ASSIGN_MAX],
                      md_err *e);

/* A valid class name: 1..63 chars of [A-Za-z0-9_.-]. */
int q_class_name_check(const char *name, md_err *e);

#endif
