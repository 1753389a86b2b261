/* worker_int.h — the worker daemon's state, shared by the files that implement worker.h and
 * by no one else (worker.h is the module's contract). The daemon is one thread and one `wk`
 * struct, split by concern; each file calls only the files listed below it (no circle):
 *   worker.c         the loop (wk_run): startup, the connection, polling the runners, the
 *                    periodic work, stopping
 *   worker_plan.c    model and stream slots, and following the plan
 *   worker_shard.c   sharded replicas: forming a pipeline whose stages run in other
 *                    processes, re-forming it after a failure, and the stage servers this
 *                    worker runs for other workers' replicas
 *   worker_model.c   a model slot's runner, opened under the watchdog's load limit
 *   worker_read.c    reading and claiming entries: XREADGROUP, XAUTOCLAIM, validation, the DLQ
 *   worker_lease.c   leases, hand-back and the watchdog; heartbeats
 *   worker_answer.c  answers: output lines, the completion script, XACK
 *   worker_online.c  the online lane (docs/protocol.md §9): taking an online request, its
 *                    start event, its text published as it grows, cancels, its answer
 *   worker_metrics.c the Prometheus metrics (--metrics): counted where things happen through
 *                    the wk_metrics_* hooks, served by an HTTP thread that never touches wk
 * worker_metrics.c calls nothing else of the worker, worker_answer.c only its hooks; both
 * have unit tests of their own (tests/unit/test_worker_metrics.c, test_worker_answer.c).
 * Each group of fields in `wk` below names the file that owns it: that file sets it up and
 * frees it (close_all in worker.c frees what is left at exit); the others read it, or
 * change it only as the group's comment says.
 *
 * Invariant that makes results effectively-once: an entry is XACKed only after the
 * completion script has returned for it (1 = written, 0 = already answered, -1 = batch gone).
 * Whatever breaks in between (worker crash, Redis restart, lost reply) leaves the entry
 * pending, so it is redelivered, and the script ignores the second answer. */
#ifndef MEDLEY_WORKER_WORKER_INT_H
#define MEDLEY_WORKER_WORKER_INT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "common/err.h"
#include "common/metrics.h"
#include "common/redis.h"
#include "queue/plan.h"
#include "queue/queue.h"
#include "queue/validate.h"
#include "worker/assign.h"
#include "worker/runner.h"
#include "worker/watchdog.h"
#include "worker/worker.h"

#define ENTRY_ID_MAX 48
#define WK_AUDIT_MAX 8 /* entries of a stream the ack audit follows at a time */
#define BATCH_CACHE 64
#define BATCH_CACHE_NS 500000000ull /* re-read a batch's status every 0.5 s */

/* Each job and answer names its stream (index into wk.st); a stream names its model slot.
 * Slots of both are freed only when nothing refers to them, so indices stay valid. A model
 * reads P q:{M}, its class streams and its online lane P online:{M}. */
#define MAX_STREAMS (WK_MAX_MODELS * (2 + Q_CLASS_MAX))
#define WK_STOPS_MAX 1024 /* bytes of an online request's stop strings kept for streaming */
#define WK_ONLINE_WARM_NS (300ull * 1000000000ull) /* 5 minutes */

typedef struct {
    int used;
    int s; /* stream index */
    char id[ENTRY_ID_MAX];
    char batch[Q_BATCH_ID_MAX];
    char custom_id[Q_CUSTOM_ID_MAX];
    int chat;
    long long attempt;
    double queue_ms;
    double share_s; /* this job's share of the worker's busy seconds */
    int handback;   /* its device failed: hand the entry back instead of answering it */
    /* An online request (its stream is an online lane; batch holds its request id R):
     * pieces: its text is published as it grows (stream: true, no logprobs, no tools, stop
     * strings that fit stops); sent: bytes published so far; stops: its stop strings,
     * NUL-terminated one after the other (n_stops). worker_online.c sets and reads these. */
    int online, pieces, cancelled; /* cancelled: its client went away (P cancel:{R}) */
    size_t sent;
    int n_stops;
    char stops[WK_STOPS_MAX];
} job;

typedef struct {
    int s;        /* stream index */
    int scripted; /* the completion script returned (online: the done event was written);
                     only the XACK is left */
    char id[ENTRY_ID_MAX];
    char batch[Q_BATCH_ID_MAX]; /* B; for an online lane's answer its request id R */
    char member[Q_CUSTOM_ID_MAX + ENTRY_ID_MAX]; /* {B}:done member */
    int ok;
    char *line; /* output line (malloc'd) */
} answer;

typedef struct {
    char id[Q_BATCH_ID_MAX];
    char status[24];
    long long deadline;
    int exists;
    uint64_t at_ns;
} batch_ent;

enum { SLOT_FREE = 0, SLOT_ON, SLOT_DRAIN };

/* A stream read by this worker: reading (SLOT_ON) or draining (SLOT_DRAIN: no new reads;
 * leases renewed and answers XACKed until its running entries are done). */
typedef struct {
    int state;
    int m; /* model slot */
    char key[Q_KEY_MAX];
    char cursor[ENTRY_ID_MAX]; /* XAUTOCLAIM cursor */
    int claim_more;            /* look again before the next read (wk_take_over) */
    int steal;  /* a class the plan routes elsewhere that this replica holds: read only when
                   the last read of the others gave nothing (routing is a preference) */
    int online; /* P online:{M}, the online lane: read before the others, answered into
                   P reply:{R} (worker_online.c), and its model keeps online_reserve slots
                   free of batch lines */
    /* entries seen delivered, not pending and unanswered at the last audit (worker_audit.c) */
    char suspect[WK_AUDIT_MAX][ENTRY_ID_MAX];
    int n_suspect;
} stream;

#define WK_SPEC_MAX 1400    /* a --stages list: WK_PIPE_MAX endpoints and ranges */
#define WK_ENDPOINT_MAX 320 /* "tcp://HOST:PORT/DEVICE" */
#define WK_WHY_MAX 700

/* A model run as a pipeline with stages in other processes (worker_shard.c): the replica is
 * formed when its runner is open. Not formed (runner NULL) it reads nothing, and why says
 * what it waits for; a failed step or a vanished stage hands back what it ran and un-forms
 * it. */
typedef struct {
    int on;
    wk_pipe pipe;           /* the plan's pipeline (n_stages > 0), or none: --stages */
    char spec[WK_SPEC_MAX]; /* the stages the runner is, or is to be, opened with */
    char endpoint[WK_PIPE_MAX][WK_ENDPOINT_MAX]; /* plan: stage keys' values of the last try */
    uint64_t next_try_ns; /* no forming before this (backoff after a failure) */
    int backoff_ms;
    char why[WK_WHY_MAX]; /* "" when formed */
} shard;

/* A served model: its runner and one job slot per unit of runner capacity. Draining: the
 * plan moved it away; it finishes what runs, then closes. */
typedef struct {
    int state;
    char name[Q_MODEL_NAME];
    char replicas[256]; /* plan replica ids ("" when served from the command line) */
    wk_runner *runner;  /* NULL only while a sharded replica is not formed */
    job *jobs;          /* (n_jobs) */
    int n_jobs;
    shard sh;
    /* worker_online.c: when an online request of this model was last taken (md_mono_ns; 0:
     * never). Batch lines leave the online reserve free only for WK_ONLINE_WARM_NS after it,
     * so a fleet without interactive traffic gives batch work every slot. */
    uint64_t online_ns;
} model;

/* A stage this worker serves for another worker's pipeline replica (a plan stage role): a
 * `medley stage` child process listening on a port, advertised under P replica:{R}:stage:<i>
 * once it accepts connections. */
typedef struct {
    int used;
    wk_role role;
    char key[Q_KEY_MAX];
    char endpoint[WK_ENDPOINT_MAX];
    int pid; /* the child, 0 when none runs */
    int port;
    int ready; /* it accepts connections: the key is set and refreshed */
    uint64_t started_ns, next_try_ns, probed_ns;
    int backoff_ms;
} stage_srv;

/* Redis refusing the completion script (worker_answer.c): answers are held and retried
 * after backoff_ms; reading stops meanwhile. */
typedef struct {
    int refused;        /* the last try was refused */
    char error[200];    /* Redis's error reply */
    long long since_ms; /* wall clock of the first refusal of this episode */
    long count;         /* refusals in this episode */
    int backoff_ms;
    uint64_t next_ns, logged_ns;
} wk_wr;

typedef struct {
    /* worker.c: who this worker is and what it was told, set once at startup. */
    const wk_config *cfg;
    volatile sig_atomic_t *stop;
    char prefix[80], me[160], host[128], events[Q_KEY_MAX], wkey[Q_KEY_MAX];
    int64_t started_ms;
    char gpu_name[256]; /* the CUDA device's name as its driver reports it, or "" */
    size_t gpu_bytes;   /* and its memory */

    /* worker.c: the connection. Whoever sees a command fail sets broken; the loop then
     * reconnects and sets up the scripts and groups again (sha: the completion script's
     * SHA1, which wk_flush loads again on NOSCRIPT). */
    md_redis *r;
    int broken;         /* the connection failed; reconnect before the next command */
    int resume_counted; /* the start could not resume its predecessor's entries: heal does */
    uint64_t healed_ns; /* when the last reconnect's setup succeeded */
    int flap_ms;        /* backoff of a connection that drops again right after a heal */
    unsigned gen;       /* connection generation the scripts and groups were set up for */
    char sha[41];

    /* worker.c: the loop's clocks (md_mono_ns at the last run of each periodic task);
     * apply_plan zeroes last_hb to show a switch in the heartbeat at once. */
    uint64_t last_tick, last_hb, last_lease, last_claim, last_plan;

    /* worker_plan.c: the model and stream slots. live counts used jobs over every model:
     * worker_read.c starts jobs, worker_answer.c and worker_lease.c end them. */
    model mod[WK_MAX_MODELS];
    stream st[MAX_STREAMS];
    int live;
    unsigned streams_gen; /* bumped when the stream set changes */
    int idle;             /* the last read gave nothing: the plan's steal streams are read too */
    /* --follow-plan: the version of the plan applied (-1: none yet) and the last value seen
     * in P plan:version (-2: never looked). */
    long long plan_applied, plan_seen;
    /* --model: the P plan:version whose classes the served models read (-2: never looked) */
    long long cls_seen;

    /* worker_answer.c: answers not yet written or XACKed, and what was answered. */
    answer *ans;
    int n_ans, cap_ans;
    long long n_ok, n_failed, n_tokens;
    wk_wr wr; /* Redis refusing answers */

    /* worker_read.c: batches' status and deadline, cached for BATCH_CACHE_NS. */
    batch_ent cache[BATCH_CACHE];

    /* worker_online.c: when the running online requests' cancel keys were last looked at */
    uint64_t last_cancel_check;

    /* worker.c: the step watchdog (worker/watchdog.h), started and stopped there. poll_all
     * runs steps under it and wk_add_model (worker_plan.c) loads; worker_lease.c tells it the
     * streams and takes its verdict. */
    wk_watchdog *wd;                   /* NULL once it fired and the worker took its verdict */
    unsigned wd_gen;                   /* the streams_gen the watchdog was told */
    int step_limit_ms;                 /* a step's limit (0: none) */
    int load_limit_ms;                 /* a model load's limit (0: none; kept alive regardless) */
    char load_what[Q_MODEL_NAME + 16]; /* the label of a load in progress */

    /* worker_shard.c: the stage servers of this worker's stage roles, and the clock of the
     * heads' look at their stage keys. */
    stage_srv srv[WK_ROLES_MAX];
    uint64_t last_stage_check;

    /* worker_lease.c: the heartbeat's token count and a failed device (poll_all in worker.c
     * also sets device_failed and dev_err when a runner reports one). */
    long long tokens_at_hb;
    int device_failed; /* a runner's device failed: hand back, stop, exit with dev_err */
    int drain_asked;   /* field `drain` of P worker:{W} is set: stop as on SIGTERM */
    /* P drain:{W} (an operator's drain, which outlives the process) existed at the first
     * heartbeat: read nothing and report "drained" until it is deleted. -1: not looked yet. */
    int drain_hold;
    char drain_key[Q_KEY_MAX];
    long n_handed_back;
    md_err dev_err;

    /* worker_metrics.c: the metrics and their server; NULL without --metrics (every hook
     * then returns at once). */
    struct wk_metrics *mx;
} wk;

static inline int stream_model(wk *w, int s) {
    return w->st[s].m;
}

/* The device type of heartbeats and output lines: --device-type, else the runner's, else
 * what --device says ("cpu" or "cuda"). */
static inline const char *wk_dev_type(wk *w, int m) {
    if (w->cfg->device_type && *w->cfg->device_type)
        return w->cfg->device_type;
    if (m >= 0 && m < WK_MAX_MODELS && w->mod[m].runner)
        return wk_runner_device(w->mod[m].runner);
    for (int k = 0; k < WK_MAX_MODELS; k++)
        if (w->mod[k].runner)
            return wk_runner_device(w->mod[k].runner);
    const char *d = w->cfg->runner.device;
    return d && !strncmp(d, "cuda", 4) ? "cuda" : "cpu";
}

/* ---- worker_read.c ---- */

/* XGROUP CREATE key from id 0 (a group that exists already is fine). MD_EREDIS when the
 * connection failed, MD_EINVAL when Redis refused (OOM, NOPERM). */
int wk_create_group(wk *w, const char *key, md_err *e);
/* XREADGROUP new entries for the free runner slots, blocking at most block_ms (0: not at
 * all); starts or answers each. Returns how many were read. */
int wk_read_new(wk *w, int block_ms);
/* XAUTOCLAIM entries idle past the visibility timeout: on every stream being read when due
 * (the periodic look), else on those where more may be waiting. */
void wk_take_over(wk *w, int due);
/* Take one entry read outside a delivery (the ack audit): answer it at once or start it. */
void wk_take_entry(wk *w, int s, const char *id, redisReply *fields, long long attempt);
/* 1 when this process runs entry id of stream s or holds its answer. */
int wk_holds(wk *w, int s, const char *id);
/* Free runner slots of stream s's model (0 when the stream is not read). */
int wk_free_slots(wk *w, int s);
/* The start of a request read from stream s (batch: B; an online lane: R), validated into
 * req (bad: q_validate's result, ve its error): answer it when it is refused (bad, another
 * model, a constraint that does not compile, a prompt past the context), else start it on
 * the model's runner. Returns the job started, or NULL when answered. req stays the
 * caller's (released and freed by it). */
job *wk_start_request(wk *w, int s, const char *id, const char *batch, q_request *req, int bad,
                      q_verr *ve, double queue_ms, long long attempt);
/* The value of field name of an entry's fields (*len its length), or NULL. */
const char *wk_field(redisReply *fields, const char *name, size_t *len);
/* XACK and XDEL an entry nobody is to answer. */
void wk_ack_only(wk *w, int s, const char *id);
/* Milliseconds an entry waited: now minus the time part of its id. */
double wk_waited_ms(const char *id);
/* worker_audit.c: entries of the streams read that were acknowledged without an answer (a
 * consumer that is no worker XACKed them): run them, count them, name the consumers without
 * a heartbeat. Called with the periodic takeover. */
void wk_audit_acks(wk *w);
/* Resume the entries pending for this consumer name that this process does not hold (not
 * once a device failed). counted = 1 after a crash or a hand-back (each counts a delivery),
 * 0 after a reconnect (no new delivery: a lost read's reply). */
void wk_take_own(wk *w, int counted);

/* ---- worker_answer.c ---- */

/* Queue the answer of a request that never reached a model (response null, error {code,
 * message}), or of one the API refuses (response.body.error with ve's status). */
void wk_answer_error(wk *w, int s, const char *entry_id, const char *batch, const char *custom_id,
                     const char *code, const char *message, double queue_ms, long long attempt);
void wk_answer_invalid(wk *w, int s, const char *entry_id, const char *batch, const char *custom_id,
                       const q_verr *ve, double queue_ms, long long attempt);
/* The runners' done callback (ctx: the wk, tag: the job). */
void wk_on_done(void *ctx, void *tag, const wk_result *res);
/* Write the queued answers (completion script), then XACK and XDEL them. */
void wk_flush(wk *w);
/* 1 while Redis refuses the completion script and answers wait: read nothing new. */
int wk_write_blocked(const wk *w);

/* ---- worker_online.c ---- */

/* An entry of an online lane (fields reply, line, deadline): dropped when its deadline passed
 * or its client went away (P cancel:{R}), else validated as an online request and answered or
 * started as wk_start_request says, with a start event in P reply:{R}. */
void wk_online_take(wk *w, int s, const char *id, const char *reply, const char *line, size_t len,
                    redisReply *fields, long long attempt);
/* After the runners' poll: publish the new text of the running online requests that stream
 * (delta events) and, every 200 ms, stop those whose client went away. */
void wk_online_publish(wk *w);
/* Write the done events of the queued answers of online lanes (XADD P reply:{R}, PEXPIRE)
 * and mark them scripted (*accepted set when one was). Returns how many Redis refused (why:
 * the first refusal), -1 when the connection failed (w->broken set). */
int wk_online_write(wk *w, int *accepted, char *why, size_t why_sz);

/* ---- worker_lease.c ---- */

/* XCLAIM running entries to ourselves; idle_ms > 0 hands them back instead. */
void wk_renew(wk *w, long long idle_ms, int handback_only);
/* HSET the heartbeat key P worker:{W} and renew its TTL: 0 when written, -1 when not (out of
 * memory, or the connection broke: w->broken set). */
int wk_heartbeat(wk *w, const char *state, double dt_s);
/* Hand back the requests of a failed device. */
void wk_hand_back(wk *w);
/* Tell the watchdog the streams, when they changed. */
void wk_watch_streams(wk *w);
/* Take the watchdog's verdict: forget what it handed back and stop with why. */
void wk_after_watchdog(wk *w, const char *why);

/* ---- worker_model.c ---- */

/* Open a model in a free slot; returns the slot or an error. */
int wk_add_model(wk *w, const char *name, md_err *e);
/* A free model slot for name, serving, with no runner yet; returns the slot or an error. */
int wk_new_model(wk *w, const char *name, md_err *e);
/* Open model m's runner with o under the watchdog's load limit, and its job slots (none of
 * the old ones in use). */
int wk_open_runner(wk *w, int m, const wk_runner_opts *o, md_err *e);

/* ---- worker_plan.c ---- */

/* Read a stream of model m (again). */
int wk_add_stream(wk *w, int m, const char *key, md_err *e);
/* Free drained streams and models. */
void wk_reap(wk *w);
/* --follow-plan: apply the plan when P plan:version moved. */
void wk_check_plan(wk *w);
/* --model: read the class streams the plan routes the served models' lines to. */
void wk_check_classes(wk *w);

/* ---- worker_shard.c ---- */

/* 1 when a --stages list has a stage in another process (tcp://). */
int wk_spec_remote(const char *spec);
/* Make model m (with or without a runner) a pipeline to form: from the plan (pipe, n_stages
 * > 0) or from --stages (spec); what it runs is handed back and its runner closed. */
void wk_shard_start(wk *w, int m, const wk_pipe *pipe, const char *spec);
/* Model m runs whole again (the plan stopped making it a pipeline): hand back, open whole.
 * An error leaves it without a runner (the caller drains it). */
int wk_shard_stop(wk *w, int m, md_err *e);
/* 1 when model m's pipeline is the plan's pipe already. */
int wk_shard_same(const wk *w, int m, const wk_pipe *pipe);
/* A step of model m failed: hand back what it held and un-form it (why: e). */
void wk_shard_failed(wk *w, int m, const md_err *e);
/* Each turn: form the replicas due (heads), look at their stage keys (every plan_check_ms),
 * start, probe and watch the stage servers (stage roles). */
void wk_shard_tick(wk *w);
/* The plan's stage roles: start the servers of new ones, stop those of roles gone. */
void wk_roles_apply(wk *w, const wk_role *roles, int n);
/* With the heartbeat: SET the stage keys of the ready servers again (their TTL). */
void wk_roles_refresh(wk *w);
/* On stop: end every stage server and delete its key. */
void wk_roles_stop(wk *w);

/* ---- worker_metrics.c ---- */

/* With cfg->metrics_addr: the registry and its HTTP server (a taken port is an error). */
int wk_metrics_start(wk *w, md_err *e);
void wk_metrics_stop(wk *w);
/* A request started on stream s's model after queue_ms in the queue. */
void wk_metrics_started(wk *w, int s, double queue_ms);
/* An answer queued on stream s: code NULL when it succeeded, else the line's error code. */
void wk_metrics_answered(wk *w, int s, const char *code);
/* A succeeded request's tokens, lengths, finish reason, latencies (time to first token and
 * end to end from its arrival: queue_ms in the queue, arrival_ms its entry id's time) and
 * cost share (model slot m). */
void wk_metrics_result(wk *w, int m, const wk_result *res, double queue_ms, long long arrival_ms,
                       double cost_usd);
/* A heartbeat was written (medley_worker_heartbeat_age_seconds counts from it). */
void wk_metrics_heartbeat(wk *w);
void wk_metrics_taken_over(wk *w, int s, long n);
void wk_metrics_unanswered_ack(wk *w, int s);
void wk_metrics_dead_letter(wk *w, int s);
void wk_metrics_handed_back(wk *w, int m, int n);
/* After model m's runner was polled: the step it ran, if any. */
void wk_metrics_polled(wk *w, int m);
/* Each loop turn: gauges every 200 ms, Redis's queue gauges every second. */
void wk_metrics_tick(wk *w);
/* A plan was applied: its predicted tokens/s for the replicas served here. */
void wk_metrics_plan(wk *w, const json_t *plan);

/* ---- worker_metrics_batch.c: per-batch gauges (progress, deadline at risk) ---- */
typedef struct wk_batch_mx wk_batch_mx;
wk_batch_mx *wk_batch_mx_new(md_metrics *reg, md_err *e); /* NULL with e set */
void wk_batch_mx_free(wk_batch_mx *b);
/* Read the in-progress batches of the models served from Redis and set their gauges. */
void wk_batch_mx_tick(wk_batch_mx *b, wk *w);
/* 1 when a batch (times in ms, deadline 0: none) misses its deadline at its rate so far. */
int wk_batch_at_risk(long long now, long long created, long long started, long long deadline,
                     long long total, long long done);

#endif
