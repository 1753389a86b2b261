/* worker.h — the medley worker daemon (docs/design.md §2-3, docs/protocol.md): reads requests of
 * the models it serves from their Redis streams (consumer group `workers`), validates them,
 * runs them through a runner (echo or engine), writes each output line with the completion
 * script and only then XACKs; renews leases on what it runs, takes over entries idle past
 * the visibility timeout, moves entries past max_attempts to the DLQ, answers cancelled and
 * expired batches, heartbeats, reconnects with backoff without losing a result, and on stop
 * finishes (or hands back) what it runs and exits. With follow_plan it serves what the
 * scheduler's plan gives it and switches when the plan changes: models moved away finish
 * what they run (written and XACKed, nothing handed over half-done), new ones are loaded.
 *
 * Each model is also read from its online lane (docs/protocol.md §9): `medley api`'s
 * interactive requests, read before batch lines, their text published as it is generated.
 *
 * wk_run() blocks until *stop is set (SIGTERM) or a fatal error; the caller owns cfg. */
#ifndef MEDLEY_WORKER_WORKER_H
#define MEDLEY_WORKER_WORKER_H

#include <signal.h>

#include "common/err.h"
#include "queue/validate.h"
#include "worker/runner.h"

#define WK_MAX_MODELS 16

typedef struct {
    const char *redis_url; /* NULL: md_redis_default_url() */
    const char *prefix;    /* key prefix, default "medley:" */
    const char *id;        /* consumer name; NULL: <host>-<pid>-<random> */
    const char *models[WK_MAX_MODELS];
    int n_models;
    wk_runner_opts runner;
    q_limits limits;
    int visibility_ms; /* entries idle longer are taken over (default 60000) */
    int max_attempts;  /* deliveries before the DLQ (default 3) */
    int block_ms;      /* XREADGROUP BLOCK when idle (default 1000) */
    int heartbeat_ms;  /* heartbeat period; the key lives 3 periods (default 5000) */
    int grace_ms;      /* on stop: time to finish running requests (default 30000) */
    int connect_timeout_ms, command_timeout_ms;
    double usd_per_hour; /* cost of this worker's devices, for the cost share */
    /* Device type in heartbeats and output lines, as the scheduler's GPU catalog names it
     * ("H200", "L4"); NULL: the runner's ("cpu", "cuda"). */
    const char *device_type;
    /* Serve what the scheduler's plan (P plan) gives this worker instead of `models`: the
     * replicas whose stages name its device "{<id>}/0" (worker/assign.h), each model read from
     * P q:{M} and the class streams P q:{M}:<class> of its replicas. The plan is looked at
     * every plan_check_ms (default 1000) through P plan:version. */
    int follow_plan;
    int plan_check_ms;
    /* A runner step (one engine step over every live sequence) running longer than this
     * means a hung device: the watchdog (worker/watchdog.h) hands back every entry this
     * worker holds and, with step_timeout_exit, ends the process with status 1 for a
     * restart. 0: no limit; -1 (default): 120000 on a CUDA device, no limit on the CPU (a slow CPU
     * step is slow, not hung). */
    int step_timeout_ms;
    /* Loading a model (reading it, uploading its weights) running longer than this means a
     * hung device, handled as a step past its limit. While a load runs, the watchdog keeps
     * the worker's heartbeat key and the leases of what it holds alive (a large model takes
     * tens of seconds; the scheduler must not take the worker for dead meanwhile). 0: no
     * limit; -1 (default): 600000 on a CUDA device, no limit on the CPU. */
    int load_timeout_ms;
    /* 1 (default): the watchdog ends the process with status 1 after handing back; 0: the
     * worker stops with an error once the step or load returns (tests). */
    int step_timeout_exit;
    /* Sharded replicas (docs/protocol.md §6, "Sharded replicas"). runner.stages with a
     * remote (tcp://) stage, or a plan pipeline this worker heads: the model reads nothing
     * until every stage answers; a failed step hands back what it ran and the worker forms
     * the replica again (backoff 0.5 s doubling to 10 s). A plan stage this worker serves
     * for another's replica runs as a child `<stage_exe> stage --listen HOST:PORT` on
     * stage_listen ("HOST:PORT", default "127.0.0.1:0": a free port), advertised in Redis. */
    const char *stage_listen;
    const char *stage_exe; /* the medley binary (default "/proc/self/exe") */
    /* Serve Prometheus metrics at http://<metrics_addr>/metrics ("HOST:PORT"; NULL: none;
     * docs/operations.md, "Metrics"). A port that is taken fails the start. */
    const char *metrics_addr;
    /* Runner slots of each model that batch lines leave free for online requests (the online
     * lane P online:{M}, docs/protocol.md §9), so that one starts at once however full of
     * batch work the worker is: default 1; at most the runner's capacity - 1. Kept only for
     * 5 minutes after the model's last online request: without interactive traffic batch
     * lines have every slot. */
    int online_reserve;
} wk_config;

void wk_config_default(wk_config *c);

/* The exit code of `medley worker` after an operator's drain (and of a --devices supervisor
 * whose children were all drained): final for systemd (RestartPreventExitStatus= and
 * SuccessExitStatus= of deploy/systemd/medley-worker.service), so a drain sticks. */
#define WK_EXIT_DRAINED 10
#define WK_DRAINED 1 /* wk_run's positive result: stopped by an operator's drain */

/* Serve until *stop. Returns 0 after a clean stop, WK_DRAINED after a stop an operator's
 * drain asked for (docs/operations.md, "Drain a node"), or an error (startup failure: Redis
 * unreachable, a model that cannot be served). */
int wk_run(const wk_config *cfg, volatile sig_atomic_t *stop, md_err *e);

#endif
