/* assign.h — what one worker serves under the scheduler's plan (schemas/plan.schema.json,
 * key P plan; docs/protocol.md §6): the replicas that name its devices, their models and the
 * class streams each model is read from (`medley worker --follow-plan`). Routing a request
 * to a class stream is the queue's (queue/plan.h).
 *
 * Device names: the scheduler names a heartbeat's GPUs "{W}/<i>" (one device type) or
 * "{W}#<type>/<i>" (several types): scheduler/daemon.c names one fleet pool per worker and
 * GPU type after the tail of the heartbeat key P worker:{W} (hash tag included), and
 * scheduler/milp.c numbers GPUs inside a pool. "W/<i>" (no braces) is accepted too. A
 * worker serves every replica that has one of its devices in any stage, and reads the
 * class streams those replicas list plus any class of the model no replica lists.
 *
 * Documents are the caller's (jansson references); nothing here keeps a pointer into them. */
#ifndef MEDLEY_WORKER_ASSIGN_H
#define MEDLEY_WORKER_ASSIGN_H

#include <jansson.h>

#include "common/err.h"
#include "queue/plan.h"

#define WK_ASSIGN_MAX 16 /* models one worker serves from a plan */

/* What one worker serves under a plan. */
typedef struct {
    char model[Q_MODEL_NAME];
    char classes[Q_CLASS_MAX][Q_CLASS_NAME]; /* union over the replicas; may be empty */
    int n_classes;
    char replicas[256]; /* replica ids, comma-separated, for heartbeats and logs */
} wk_assign;

/* 1 when the plan's GPU id names one of worker's devices: "{W}/<i>", "{W}#<type>/<i>", or
 * the same without braces. */
int wk_gpu_of_worker(const char *gpu, const char *worker);

/* The models (with their classes) of the replicas that name this worker's devices, at most
 * WK_ASSIGN_MAX (more is MD_EINVAL). Returns how many. Malformed replicas are MD_EINVAL. */
int wk_plan_assignment(const json_t *plan, const char *worker, wk_assign out[WK_ASSIGN_MAX],
                       md_err *e);

#endif
