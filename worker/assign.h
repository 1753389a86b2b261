/* assign.h — what one worker serves under the scheduler's plan (schemas/plan.schema.json,
 * key P plan; docs/protocol.md §6): the replicas that name its devices, their models and the
 * class streams each model is read from (`medley worker --follow-plan`). Routing a request
 * to a class stream is the queue's (queue/plan.h).
 *
 * Device names: the scheduler names a heartbeat's GPUs "{W}/<i>" (one device type) or
 * "{W}#<type>/<i>" (several types): scheduler/daemon.c names one fleet pool per worker and
 * GPU type after the tail of the heartbeat key P worker:{W} (hash tag included), and
 * scheduler/milp.c numbers GPUs inside a pool. "W/<i>" (no braces) is accepted too.
 *
 * Roles (docs/protocol.md §6, "Sharded replicas"). A replica of two or more stages that each
 * name one GPU is a pipeline over workers: the worker of stage 0 is its head (it serves the
 * model, reading the replica's streams, through an engine whose later stages are remote),
 * and the worker of a later stage serves that stage to the head (a stage role) and reads
 * nothing for it. Any other replica (one stage, or a stage naming several GPUs: tensor
 * parallelism over workers, which is not built) is served whole by every worker it names.
 * A worker reads the class streams of the replicas it serves plus any class of the model no
 * replica lists, and, when those have nothing, the replicas' `steal` classes (classes they
 * hold that the plan routes to other replicas: routing is a preference, issue 39 item 11).
 *
 * Documents are the caller's (jansson references); nothing here keeps a pointer into them. */
#ifndef MEDLEY_WORKER_ASSIGN_H
#define MEDLEY_WORKER_ASSIGN_H

#include <jansson.h>

#include "common/err.h"
#include "queue/plan.h"

#define WK_ASSIGN_MAX 16 /* models one worker serves from a plan */
#define WK_PIPE_MAX 4    /* stages of a pipeline replica (plan.schema.json: stages maxItems) */
#define WK_ROLES_MAX 8   /* stage roles of one worker */
#define WK_REPLICA_ID 64 /* replica ids: 1..63 printable bytes, no braces, as keys take them */

/* A pipeline replica: its id and each stage's layers [lo, hi), in order from layer 0. */
typedef struct {
    char replica[WK_REPLICA_ID];
    int n_stages; /* 0: not a pipeline */
    int lo[WK_PIPE_MAX], hi[WK_PIPE_MAX];
} wk_pipe;

/* What one worker serves under a plan. */
typedef struct {
    char model[Q_MODEL_NAME];
    char classes[Q_CLASS_MAX][Q_CLASS_NAME]; /* union over the replicas; may be empty */
    int n_classes;
    char replicas[256]; /* replica ids, comma-separated, for heartbeats and logs */
    /* classes the replicas hold but are not routed ("steal" in the plan), none of classes:
     * read only when the routed streams have nothing */
    char steal[Q_CLASS_MAX][Q_CLASS_NAME];
    int n_steal;
    /* n_stages > 0: the model runs as this pipeline, headed here (the first pipeline replica
     * the worker heads, when no replica gives it the model whole) */
    wk_pipe pipe;
} wk_assign;

/* A later stage of a pipeline replica, served by this worker to the replica's head. */
typedef struct {
    char model[Q_MODEL_NAME];
    char replica[WK_REPLICA_ID];
    int stage; /* index in the replica's stages, >= 1 */
    int lo, hi;
} wk_role;

/* 1 when the plan's GPU id names one of worker's devices: "{W}/<i>", "{W}#<type>/<i>", or
 * the same without braces. */
int wk_gpu_of_worker(const char *gpu, const char *worker);

/* The models (with their classes) of the replicas that name this worker's devices, at most
 * WK_ASSIGN_MAX (more is MD_EINVAL). Returns how many. Malformed replicas are MD_EINVAL. */
int wk_plan_assignment(const json_t *plan, const char *worker, wk_assign out[WK_ASSIGN_MAX],
                       md_err *e);

/* The stage roles of this worker: the later stages of pipeline replicas that name its
 * devices, at most WK_ROLES_MAX (more is MD_EINVAL). Returns how many. */
int wk_plan_roles(const json_t *plan, const char *worker, wk_role out[WK_ROLES_MAX], md_err *e);

#endif
