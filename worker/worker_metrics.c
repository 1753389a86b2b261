/* worker_metrics.c — the worker's Prometheus metrics (`medley worker --metrics ADDR:PORT`;
 * every name, label and meaning in docs/operations.md, "Metrics"). The loop's thread updates
 * them through the wk_metrics_* hooks (worker_int.h), at the places where requests start and
 * are answered, entries are taken over or dead-lettered, and runners step; the gauges are
 * refreshed on the loop's clock (every 200 ms, Redis's queue gauges every second), never per
 * request and never by the HTTP thread, which only renders (common/metrics_http.h). Series
 * pointers are kept per model and stream slot, so a request's updates look nothing up but
 * its error code. It owns wk.mx. */
#include <jansson.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "common/metrics.h"
#include "common/metrics_http.h"
#include "common/util.h"
#include "worker/worker_int.h"

#define FAST_NS 200000000ull     /* gauges */
#define REDIS_NS 1000000000ull   /* queue gauges read from Redis */
#define MEASURE_NS 5000000000ull /* measured tokens/s window */
#define BATCH_NS 5000000000ull   /* per-batch gauges read from Redis */
#define REPS_MAX 64              /* replica series of one plan kept for hiding */

/* The series of one model slot, for the model named name ("" when none yet). */
typedef struct {
    char name[Q_MODEL_NAME];
    md_series *started, *succeeded, *handed_back, *prompt, *completion, *wait, *ttft, *step;
    md_series *e2e, *tpot, *plen, *glen;
    md_series *running, *slots, *kv_used, *kv_free, *preempt, *takeovers, *dead, *dlq, *cost;
    md_series *orphans, *emb_lines, *emb_inputs, *emb_tokens;
    long steps_seen, preempt_seen;
    long long tokens, tokens_measured; /* completion tokens, and at the last measurement */
} mslot;

/* The queue gauges of one stream slot, for the stream key ("" when none). */
typedef struct {
    char key[Q_KEY_MAX];
    md_series *lag, *pending, *lag_s;
} sslot;

typedef struct {
    char replica[WK_REPLICA_ID];
    int m; /* model slot */
    md_series *pred, *meas;
} rep;

struct wk_metrics {
    md_metrics *reg;
    md_metrics_http *http;
    md_metric *started, *succeeded, *failed, *handed_back, *prompt, *completion, *wait, *ttft;
    md_metric *step, *running, *slots, *kv_used, *kv_free, *preempt, *takeovers, *dead, *dlq;
    md_metric *orphans;
    md_metric *lag, *pending, *lag_s, *held, *dev_info, *dev_mem, *usd_h, *dev_cost, *req_cost;
    md_metric *plan_version, *rep_pred, *rep_meas, *worker_info;
    md_metric *e2e, *tpot, *finished, *plen, *glen, *hb_age;
    md_metric *emb_lines, *emb_inputs, *emb_tokens;
    md_series *hb_age_s;
    _Atomic long long last_hb_ms; /* wall clock of the last heartbeat written (0: none yet) */
    long long started_ms;
    uint64_t started_ns; /* monotonic clock at the start: the device's cost counts from it */
    wk_batch_mx *batch;
    mslot mod[WK_MAX_MODELS];
    sslot st[MAX_STREAMS];
    rep reps[REPS_MAX];
    int n_reps;
    md_series *dev_info_s;
    char dev_type[64];
    uint64_t last_fast, last_redis, last_measure, last_batch;
};

static const double WAIT_BOUNDS[] = {0.01, 0.1, 1, 10, 60, 300, 1800, 3600, 21600, 86400};
/* from arrival: a batch's requests wait in the queue, so up to a day */
static const double TTFT_BOUNDS[] = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5,  1,    2.5,   5,    10,
                                     30,   60,    300,  900, 1800, 3600, 7200, 21600, 86400};
static const double E2E_BOUNDS[] = {0.1, 0.25, 0.5, 1,    2.5,  5,    10,    30,   60,
                                    120, 300,  900, 1800, 3600, 7200, 21600, 86400};
static const double TPOT_BOUNDS[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075,
                                     0.1,   0.15,   0.2,   0.3,  0.5,   1,    2.5};
static const double LEN_BOUNDS[] = {1,    2,    5,    10,    20,    50,    100,    200,   500,
                                    1000, 2000, 5000, 10000, 20000, 50000, 100000, 200000};
static const double STEP_BOUNDS[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                     0.1,   0.25,   0.5,   1,    2.5,   10};
#define NB(a) ((int)(sizeof a / sizeof *a))

/* The families (docs/operations.md lists the same). Returns 0 or the first error. */
static int define(struct wk_metrics *x, md_err *e) {
    md_metrics *g = x->reg;
    const char *model[] = {"model"}, *mc[] = {"model", "code"}, *stream[] = {"stream"};
    const char *mf[] = {"model", "finish_reason"};
    const char *rm[] = {"replica", "model"}, *dev[] = {"device_type", "name"};
    const char *wk_[] = {"worker"}, *dt[] = {"device_type"};
    enum { M = 64, S = 256 }; /* room for series: models over time, streams over time */
    /* clang-format off */
    if (!(x->worker_info = md_metrics_gauge(g, "medley_worker_info", "The worker's consumer name (1).", 1, wk_, 1, e)) ||
        !(x->started = md_metrics_counter(g, "medley_requests_started_total", "Requests started on a model's runner (each delivery counts).", 1, model, M, e)) ||
        !(x->succeeded = md_metrics_counter(g, "medley_requests_succeeded_total", "Requests answered with a 200 output line.", 1, model, M, e)) ||
        !(x->failed = md_metrics_counter(g, "medley_requests_failed_total", "Requests answered with an error line, by its error code.", 2, mc, 512, e)) ||
        !(x->handed_back = md_metrics_counter(g, "medley_requests_handed_back_total", "Running requests handed back to the queue (a failed device or stage).", 1, model, M, e)) ||
        !(x->prompt = md_metrics_counter(g, "medley_prompt_tokens_total", "Prompt tokens of succeeded requests.", 1, model, M, e)) ||
        !(x->completion = md_metrics_counter(g, "medley_completion_tokens_total", "Generated tokens of succeeded requests.", 1, model, M, e)) ||
        !(x->wait = md_metrics_histogram(g, "medley_queue_wait_seconds", "Time from submission to the start on this worker.", 1, model, M, WAIT_BOUNDS, NB(WAIT_BOUNDS), e)) ||
        !(x->ttft = md_metrics_histogram(g, "medley_time_to_first_token_seconds", "Time from the request's arrival (submission) to its first generated token.", 1, model, M, TTFT_BOUNDS, NB(TTFT_BOUNDS), e)) ||
        !(x->e2e = md_metrics_histogram(g, "medley_e2e_request_latency_seconds", "Time from the request's arrival (submission) to its answer.", 1, model, M, E2E_BOUNDS, NB(E2E_BOUNDS), e)) ||
        !(x->tpot = md_metrics_histogram(g, "medley_time_per_output_token_seconds", "Time per generated token after the first (requests of 2 or more tokens).", 1, model, M, TPOT_BOUNDS, NB(TPOT_BOUNDS), e)) ||
        !(x->finished = md_metrics_counter(g, "medley_requests_finished_total", "Succeeded requests by finish reason (stop, length, tool_calls).", 2, mf, 64, e)) ||
        !(x->plen = md_metrics_histogram(g, "medley_request_prompt_tokens", "Prompt length of succeeded requests, in tokens.", 1, model, M, LEN_BOUNDS, NB(LEN_BOUNDS), e)) ||
        !(x->glen = md_metrics_histogram(g, "medley_request_generation_tokens", "Generated length of succeeded requests, in tokens.", 1, model, M, LEN_BOUNDS, NB(LEN_BOUNDS), e)) ||
        !(x->emb_lines = md_metrics_counter(g, "medley_embedding_requests_total", "/v1/embeddings requests answered with vectors.", 1, model, M, e)) ||
        !(x->emb_inputs = md_metrics_counter(g, "medley_embedding_inputs_total", "Inputs embedded (one vector each) by succeeded /v1/embeddings requests.", 1, model, M, e)) ||
        !(x->emb_tokens = md_metrics_counter(g, "medley_embedding_tokens_total", "Tokens embedded by succeeded /v1/embeddings requests (usage.total_tokens, special tokens included).", 1, model, M, e)) ||
        !(x->hb_age = md_metrics_gauge(g, "medley_worker_heartbeat_age_seconds", "Seconds since the worker's loop last wrote its heartbeat (read at scrape time: it grows while the loop hangs).", 0, NULL, 1, e)) ||
        !(x->step = md_metrics_histogram(g, "medley_step_duration_seconds", "One engine step over every live sequence.", 1, model, M, STEP_BOUNDS, NB(STEP_BOUNDS), e)) ||
        !(x->running = md_metrics_gauge(g, "medley_running_sequences", "Requests running on the model's runner.", 1, model, M, e)) ||
        !(x->slots = md_metrics_gauge(g, "medley_sequence_slots", "The runner's capacity in concurrent requests.", 1, model, M, e)) ||
        !(x->kv_used = md_metrics_gauge(g, "medley_kv_blocks_used", "KV-cache blocks in use.", 1, model, M, e)) ||
        !(x->kv_free = md_metrics_gauge(g, "medley_kv_blocks_free", "KV-cache blocks free.", 1, model, M, e)) ||
        !(x->preempt = md_metrics_counter(g, "medley_preemptions_total", "Sequences the engine sent back to wait, their K/V dropped.", 1, model, M, e)) ||
        !(x->takeovers = md_metrics_counter(g, "medley_takeovers_total", "Entries taken over from other workers (idle past the visibility timeout).", 1, model, M, e)) ||
        !(x->orphans = md_metrics_counter(g, "medley_unanswered_acks_total", "Entries found acknowledged without an answer (an XACK by a consumer that is no worker: docs/operations.md, Threat model) and run again.", 1, model, M, e)) ||
        !(x->dead = md_metrics_counter(g, "medley_dead_letters_total", "Entries this worker moved to the dead-letter stream.", 1, model, M, e)) ||
        !(x->dlq = md_metrics_gauge(g, "medley_dlq_entries", "Entries in the model's dead-letter stream.", 1, model, M, e)) ||
        !(x->lag = md_metrics_gauge(g, "medley_queue_lag_entries", "Entries of the stream not yet delivered to any worker.", 1, stream, S, e)) ||
        !(x->pending = md_metrics_gauge(g, "medley_queue_pending_entries", "Entries of the stream delivered and not yet answered.", 1, stream, S, e)) ||
        !(x->lag_s = md_metrics_gauge(g, "medley_queue_lag_seconds", "Age of the oldest entry of the stream not yet delivered (0: none).", 1, stream, S, e)) ||
        !(x->held = md_metrics_gauge(g, "medley_answers_held", "Answers waiting to be written.", 0, NULL, 1, e)) ||
        !(x->dev_info = md_metrics_gauge(g, "medley_device_info", "The worker's device type and GPU name (1).", 2, dev, 8, e)) ||
        !(x->dev_mem = md_metrics_gauge(g, "medley_device_memory_bytes", "The GPU's memory, or the host's on the CPU.", 1, dt, 8, e)) ||
        !(x->usd_h = md_metrics_gauge(g, "medley_device_usd_per_hour", "The device's price (--usd-per-hour).", 0, NULL, 1, e)) ||
        !(x->dev_cost = md_metrics_counter(g, "medley_device_cost_usd_total", "Dollars spent: the device's price times the time since the worker started.", 0, NULL, 1, e)) ||
        !(x->req_cost = md_metrics_counter(g, "medley_request_cost_usd_total", "Sum of the answers' cost shares.", 1, model, M, e)) ||
        !(x->plan_version = md_metrics_gauge(g, "medley_plan_version", "The plan version followed (-1: none).", 0, NULL, 1, e)) ||
        !(x->rep_pred = md_metrics_gauge(g, "medley_replica_predicted_tokens_per_second", "The plan's predicted tokens/s of each replica served here.", 2, rm, S, e)) ||
        !(x->rep_meas = md_metrics_gauge(g, "medley_replica_measured_tokens_per_second", "Tokens/s generated here for the replica's model over the last 5 s.", 2, rm, S, e)))
        return e->code;
    /* clang-format on */
    return 0;
}

/* At scrape time, on the HTTP thread: the age of the last heartbeat (since the start while
 * none was written), which keeps growing when the loop hangs. */
static void heartbeat_age(void *arg) {
    struct wk_metrics *x = arg;
    long long last = atomic_load_explicit(&x->last_hb_ms, memory_order_relaxed);
    long long age = md_wall_ms() - (last ? last : x->started_ms);
    md_gauge_set(x->hb_age_s, age > 0 ? (double)age / 1e3 : 0);
}

void wk_metrics_heartbeat(wk *w) {
    if (w->mx)
        atomic_store_explicit(&w->mx->last_hb_ms, md_wall_ms(), memory_order_relaxed);
}

int wk_metrics_start(wk *w, md_err *e) {
    const char *addr = w->cfg->metrics_addr;
    if (!addr || !*addr)
        return 0;
    struct wk_metrics *x = calloc(1, sizeof *x);
    if (!x || !(x->reg = md_metrics_new())) {
        free(x);
        return md_errf(e, MD_ENOMEM, "out of memory");
    }
    int rc = define(x, e);
    if (!rc && !(x->batch = wk_batch_mx_new(x->reg, e)))
        rc = e->code;
    x->hb_age_s = md_metric_at0(x->hb_age);
    x->started_ms = md_wall_ms();
    x->started_ns = md_mono_ns();
    if (!rc && md_metrics_on_render(x->reg, heartbeat_age, x, NULL))
        rc = md_errf(e, MD_EINVAL, "metrics registry: no room for a render hook");
    if (!rc)
        rc = md_metrics_http_start(addr, x->reg, &x->http, e);
    if (rc) {
        md_metrics_free(x->reg);
        wk_batch_mx_free(x->batch);
        free(x);
        return md_errctx(e, "--metrics: ");
    }
    md_gauge_set(md_metric_at1(x->worker_info, w->me), 1);
    md_gauge_set(md_metric_at0(x->usd_h), w->cfg->usd_per_hour);
    md_gauge_set(md_metric_at0(x->plan_version), -1);
    x->last_measure = md_mono_ns(); /* last_fast, last_redis 0: the first turn sets gauges */
    w->mx = x;
    MD_INFO("worker", "metrics at http://%s/metrics (port %d)", addr,
            md_metrics_http_port(x->http));
    return 0;
}

void wk_metrics_stop(wk *w) {
    if (!w->mx)
        return;
    md_metrics_http_stop(w->mx->http);
    md_metrics_free(w->mx->reg);
    wk_batch_mx_free(w->mx->batch);
    free(w->mx);
    w->mx = NULL;
}

static void hide_model(mslot *ms) {
    md_series_hide(ms->running);
    md_series_hide(ms->slots);
    md_series_hide(ms->kv_used);
    md_series_hide(ms->kv_free);
    md_series_hide(ms->dlq);
}

/* Model slot m's series, (re)bound when the slot serves another model than last time. */
static mslot *mod(wk *w, int m) {
    struct wk_metrics *x = w->mx;
    mslot *ms = &x->mod[m];
    const char *name = w->mod[m].name;
    if (!strcmp(ms->name, name))
        return ms;
    hide_model(ms);
    memset(ms, 0, sizeof *ms);
    snprintf(ms->name, sizeof ms->name, "%s", name);
    ms->started = md_metric_at1(x->started, name);
    ms->succeeded = md_metric_at1(x->succeeded, name);
    ms->handed_back = md_metric_at1(x->handed_back, name);
    ms->prompt = md_metric_at1(x->prompt, name);
    ms->completion = md_metric_at1(x->completion, name);
    ms->wait = md_metric_at1(x->wait, name);
    ms->ttft = md_metric_at1(x->ttft, name);
    ms->step = md_metric_at1(x->step, name);
    ms->e2e = md_metric_at1(x->e2e, name);
    ms->tpot = md_metric_at1(x->tpot, name);
    ms->plen = md_metric_at1(x->plen, name);
    ms->glen = md_metric_at1(x->glen, name);
    ms->running = md_metric_at1(x->running, name);
    ms->slots = md_metric_at1(x->slots, name);
    ms->preempt = md_metric_at1(x->preempt, name);
    ms->takeovers = md_metric_at1(x->takeovers, name);
    ms->orphans = md_metric_at1(x->orphans, name);
    ms->dead = md_metric_at1(x->dead, name);
    ms->dlq = md_metric_at1(x->dlq, name);
    ms->cost = md_metric_at1(x->req_cost, name);
    ms->emb_lines = md_metric_at1(x->emb_lines, name);
    ms->emb_inputs = md_metric_at1(x->emb_inputs, name);
    ms->emb_tokens = md_metric_at1(x->emb_tokens, name);
    /* KV series only for runners with a KV cache (bound in fast_tick) */
    return ms;
}

void wk_metrics_started(wk *w, int s, double queue_ms) {
    if (!w->mx)
        return;
    mslot *ms = mod(w, stream_model(w, s));
    md_counter_add(ms->started, 1);
    md_histogram_observe(ms->wait, queue_ms / 1e3);
}

void wk_metrics_answered(wk *w, int s, const char *code) {
    if (!w->mx)
        return;
    int m = stream_model(w, s);
    if (!code)
        md_counter_add(mod(w, m)->succeeded, 1);
    else
        md_counter_add(md_metric_at2(w->mx->failed, w->mod[m].name, code), 1);
}

void wk_metrics_result(wk *w, int m, const wk_result *res, double queue_ms, long long arrival_ms,
                       double cost_usd) {
    if (!w->mx)
        return;
    mslot *ms = mod(w, m);
    md_counter_add(ms->prompt, res->prompt_tokens);
    md_counter_add(ms->completion, res->completion_tokens);
    double e2e_ms = (double)(md_wall_ms() - arrival_ms);
    if (e2e_ms < queue_ms)
        e2e_ms = queue_ms;
    md_histogram_observe(ms->e2e, e2e_ms / 1e3);
    md_histogram_observe(ms->plen, res->prompt_tokens);
    md_counter_add(ms->cost, cost_usd);
    if (res->body) { /* an embedding: no generated token, so no TTFT, TPOT or finish reason */
        md_counter_add(ms->emb_lines, 1);
        md_counter_add(ms->emb_inputs, (double)json_array_size(json_object_get(res->body, "data")));
        md_counter_add(ms->emb_tokens, res->prompt_tokens);
        ms->tokens += res->prompt_tokens; /* an embedding replica's tokens/s are its inputs' */
        return;
    }
    md_histogram_observe(ms->ttft, (queue_ms + res->first_token_ms) / 1e3);
    double run_ms = e2e_ms - queue_ms; /* from the start on the runner to the answer */
    if (res->completion_tokens >= 2 && run_ms >= res->first_token_ms)
        md_histogram_observe(ms->tpot,
                             (run_ms - res->first_token_ms) / 1e3 / (res->completion_tokens - 1));
    md_histogram_observe(ms->glen, res->completion_tokens);
    md_counter_add(md_metric_at2(w->mx->finished, ms->name,
                                 res->finish_reason ? res->finish_reason : "unknown"),
                   1);
    ms->tokens += res->completion_tokens;
}

void wk_metrics_taken_over(wk *w, int s, long n) {
    if (w->mx)
        md_counter_add(mod(w, stream_model(w, s))->takeovers, (double)n);
}

void wk_metrics_unanswered_ack(wk *w, int s) {
    if (w->mx)
        md_counter_add(mod(w, stream_model(w, s))->orphans, 1);
}

void wk_metrics_dead_letter(wk *w, int s) {
    if (w->mx)
        md_counter_add(mod(w, stream_model(w, s))->dead, 1);
}

void wk_metrics_handed_back(wk *w, int m, int n) {
    if (w->mx)
        md_counter_add(mod(w, m)->handed_back, n);
}

void wk_metrics_polled(wk *w, int m) {
    if (!w->mx || !w->mod[m].runner)
        return;
    wk_runner_stats rs;
    wk_runner_get_stats(w->mod[m].runner, &rs);
    mslot *ms = mod(w, m);
    if (rs.steps != ms->steps_seen) {
        ms->steps_seen = rs.steps;
        md_histogram_observe(ms->step, rs.last_step_s);
    }
}

/* The gauges the loop knows: per model, answers held, the device, the cost, the plan. */
static void fast_tick(wk *w, double dt_s) {
    struct wk_metrics *x = w->mx;
    for (int m = 0; m < WK_MAX_MODELS; m++) {
        model *md = &w->mod[m];
        if (md->state == SLOT_FREE) {
            if (x->mod[m].name[0]) {
                hide_model(&x->mod[m]);
                x->mod[m].name[0] = '\0';
            }
            continue;
        }
        mslot *ms = mod(w, m);
        wk_runner_stats rs = {0};
        if (md->runner)
            wk_runner_get_stats(md->runner, &rs);
        md_gauge_set(ms->running, md->runner ? wk_runner_live(md->runner) : 0);
        md_gauge_set(ms->slots, md->runner ? wk_runner_capacity(md->runner) : 0);
        if (rs.kv_blocks > 0) {
            if (!ms->kv_used) {
                ms->kv_used = md_metric_at1(x->kv_used, ms->name);
                ms->kv_free = md_metric_at1(x->kv_free, ms->name);
            }
            md_gauge_set(ms->kv_used, rs.kv_blocks - rs.kv_blocks_free);
            md_gauge_set(ms->kv_free, rs.kv_blocks_free);
        }
        if (rs.preemptions > ms->preempt_seen)
            md_counter_add(ms->preempt, (double)(rs.preemptions - ms->preempt_seen));
        ms->preempt_seen = rs.preemptions;
    }
    md_gauge_set(md_metric_at0(x->held), w->n_ans);
    const char *type = wk_dev_type(w, -1);
    if (strcmp(type, x->dev_type)) { /* the runner's type, known once a model is open */
        md_series_hide(x->dev_info_s);
        snprintf(x->dev_type, sizeof x->dev_type, "%s", type);
        x->dev_info_s = md_metric_at2(x->dev_info, type, w->gpu_name);
        md_gauge_set(x->dev_info_s, 1);
        double bytes = w->gpu_name[0] ? (double)w->gpu_bytes : (double)md_host_memory_bytes(NULL);
        md_gauge_set(md_metric_at1(x->dev_mem, type), bytes);
    }
    md_counter_add(md_metric_at0(x->dev_cost), w->cfg->usd_per_hour * dt_s / 3600.0);
    long long v = w->cfg->follow_plan ? w->plan_applied : w->cls_seen >= 0 ? w->cls_seen : -1;
    md_gauge_set(md_metric_at0(x->plan_version), (double)v);
}

/* Tokens/s of each replica's model over the window since the last measurement. */
static void measure(wk *w, double dt_s) {
    struct wk_metrics *x = w->mx;
    for (int k = 0; k < x->n_reps; k++) {
        mslot *ms = &x->mod[x->reps[k].m];
        md_gauge_set(x->reps[k].meas,
                     dt_s > 0 ? (double)(ms->tokens - ms->tokens_measured) / dt_s : 0);
    }
    for (int m = 0; m < WK_MAX_MODELS; m++)
        x->mod[m].tokens_measured = x->mod[m].tokens;
}

static long long int_field(redisReply *pairs, const char *name, int *found) {
    *found = 0;
    if (!pairs || pairs->type != REDIS_REPLY_ARRAY)
        return 0;
    for (size_t i = 0; i + 1 < pairs->elements; i += 2)
        if (pairs->element[i]->str && !strcmp(pairs->element[i]->str, name) &&
            pairs->element[i + 1]->type == REDIS_REPLY_INTEGER) {
            *found = 1;
            return pairs->element[i + 1]->integer;
        }
    return 0;
}

static const char *str_field(redisReply *pairs, const char *name) {
    if (!pairs || pairs->type != REDIS_REPLY_ARRAY)
        return NULL;
    for (size_t i = 0; i + 1 < pairs->elements; i += 2)
        if (pairs->element[i]->str && !strcmp(pairs->element[i]->str, name))
            return pairs->element[i + 1]->str;
    return NULL;
}

/* The workers group's entry of an XINFO GROUPS reply. */
static redisReply *our_group(redisReply *groups) {
    if (!groups || groups->type != REDIS_REPLY_ARRAY)
        return NULL;
    for (size_t i = 0; i < groups->elements; i++) {
        const char *name = str_field(groups->element[i], "name");
        if (name && !strcmp(name, Q_GROUP))
            return groups->element[i];
    }
    return NULL;
}

/* Stream slot s's gauges, bound to its key (the old key's hidden). */
static sslot *stream_slot(wk *w, int s) {
    struct wk_metrics *x = w->mx;
    sslot *ss = &x->st[s];
    if (ss->key[0] && !strcmp(ss->key, w->st[s].key))
        return ss;
    md_series_hide(ss->lag);
    md_series_hide(ss->pending);
    md_series_hide(ss->lag_s);
    snprintf(ss->key, sizeof ss->key, "%s", w->st[s].key);
    ss->lag = md_metric_at1(x->lag, ss->key);
    ss->pending = md_metric_at1(x->pending, ss->key);
    ss->lag_s = md_metric_at1(x->lag_s, ss->key);
    return ss;
}

/* Queue gauges from Redis, pipelined: XINFO GROUPS and XLEN of every stream read and XLEN of
 * every model's DLQ; then XRANGE of the first undelivered entry of streams with a lag (its
 * id's time is its age). */
static void redis_tick(wk *w) {
    struct wk_metrics *x = w->mx;
    redisContext *c = md_redis_ctx(w->r);
    md_err e = {0};
    int n = 0;
    for (int s = 0; s < MAX_STREAMS; s++) {
        if (w->st[s].state == SLOT_FREE) {
            if (x->st[s].key[0]) {
                md_series_hide(x->st[s].lag);
                md_series_hide(x->st[s].pending);
                md_series_hide(x->st[s].lag_s);
                x->st[s].key[0] = '\0';
            }
            continue;
        }
        redisAppendCommand(c, "XINFO GROUPS %s", w->st[s].key);
        redisAppendCommand(c, "XLEN %s", w->st[s].key);
        n += 2;
    }
    for (int m = 0; m < WK_MAX_MODELS; m++) {
        if (w->mod[m].state == SLOT_FREE)
            continue;
        char dlq[Q_KEY_MAX];
        q_key_dlq(dlq, w->prefix, w->mod[m].name);
        redisAppendCommand(c, "XLEN %s", dlq);
        n++;
    }
    char last_id[MAX_STREAMS][ENTRY_ID_MAX];
    int want_age[MAX_STREAMS] = {0};
    for (int s = 0; s < MAX_STREAMS && n > 0; s++) {
        if (w->st[s].state == SLOT_FREE)
            continue;
        redisReply *groups = md_redis_get_reply(w->r, &e);
        redisReply *len = groups ? md_redis_get_reply(w->r, &e) : NULL;
        n -= 2;
        if (!groups || !len) {
            freeReplyObject(groups);
            w->broken = 1;
            return;
        }
        sslot *ss = stream_slot(w, s);
        redisReply *g = our_group(groups);
        int has_lag = 0, has_pending = 0;
        long long lag = int_field(g, "lag", &has_lag);
        long long pending = int_field(g, "pending", &has_pending);
        long long xlen = len->type == REDIS_REPLY_INTEGER ? len->integer : 0;
        /* lag is nil when Redis cannot tell (deletions in the undelivered range): answered
         * entries are deleted, so what is in the stream and not pending is undelivered */
        if (!has_lag)
            lag = xlen > pending ? xlen - pending : 0;
        md_gauge_set(ss->lag, (double)lag);
        md_gauge_set(ss->pending, (double)pending);
        const char *ld = str_field(g, "last-delivered-id");
        snprintf(last_id[s], ENTRY_ID_MAX, "%s", ld ? ld : "0-0");
        want_age[s] = lag > 0;
        if (!want_age[s])
            md_gauge_set(ss->lag_s, 0);
        freeReplyObject(groups);
        freeReplyObject(len);
    }
    for (int m = 0; m < WK_MAX_MODELS && n > 0; m++) {
        if (w->mod[m].state == SLOT_FREE)
            continue;
        redisReply *r = md_redis_get_reply(w->r, &e);
        n--;
        if (!r) {
            w->broken = 1;
            return;
        }
        md_gauge_set(mod(w, m)->dlq, r->type == REDIS_REPLY_INTEGER ? (double)r->integer : 0);
        freeReplyObject(r);
    }
    int k = 0;
    for (int s = 0; s < MAX_STREAMS; s++)
        if (want_age[s]) {
            redisAppendCommand(c, "XRANGE %s (%s + COUNT 1", w->st[s].key, last_id[s]);
            k++;
        }
    for (int s = 0; s < MAX_STREAMS && k > 0; s++) {
        if (!want_age[s])
            continue;
        redisReply *r = md_redis_get_reply(w->r, &e);
        k--;
        if (!r) {
            w->broken = 1;
            return;
        }
        double age = 0;
        if (r->type == REDIS_REPLY_ARRAY && r->elements > 0 &&
            r->element[0]->type == REDIS_REPLY_ARRAY && r->element[0]->elements > 0 &&
            r->element[0]->element[0]->str) {
            double d = (double)(md_wall_ms() - atoll(r->element[0]->element[0]->str)) / 1e3;
            age = d > 0 ? d : 0;
        }
        md_gauge_set(x->st[s].lag_s, age);
        freeReplyObject(r);
    }
}

void wk_metrics_tick(wk *w) {
    struct wk_metrics *x = w->mx;
    if (!x)
        return;
    uint64_t now = md_mono_ns();
    if (now - x->last_fast >= FAST_NS) {
        /* the first turn counts from the start, not from the clock's zero (the host's boot:
         * the device's cost began at the host's uptime times its price) */
        fast_tick(w, (double)(now - (x->last_fast ? x->last_fast : x->started_ns)) / 1e9);
        x->last_fast = now;
    }
    if (now - x->last_measure >= MEASURE_NS) {
        measure(w, (double)(now - x->last_measure) / 1e9);
        x->last_measure = now;
    }
    if (!w->broken && now - x->last_redis >= REDIS_NS) {
        redis_tick(w);
        x->last_redis = md_mono_ns();
    }
    if (!w->broken && now - x->last_batch >= BATCH_NS) {
        wk_batch_mx_tick(x->batch, w);
        x->last_batch = md_mono_ns();
    }
}

/* The replica's predicted tokens/s in the plan, or -1. */
static double predicted(const json_t *plan, const char *id) {
    size_t i;
    json_t *r;
    json_array_foreach(json_object_get(plan, "replicas"), i, r) {
        const char *rid = json_string_value(json_object_get(r, "id"));
        if (rid && !strcmp(rid, id))
            return json_number_value(json_object_get(r, "predicted_tokens_per_s"));
    }
    return -1;
}

void wk_metrics_plan(wk *w, const json_t *plan) {
    struct wk_metrics *x = w->mx;
    if (!x)
        return;
    for (int k = 0; k < x->n_reps; k++) {
        md_series_hide(x->reps[k].pred);
        md_series_hide(x->reps[k].meas);
    }
    x->n_reps = 0;
    for (int m = 0; m < WK_MAX_MODELS && plan; m++) {
        model *md = &w->mod[m];
        if (md->state != SLOT_ON || !md->replicas[0])
            continue;
        mod(w, m);
        char list[sizeof md->replicas];
        snprintf(list, sizeof list, "%s", md->replicas);
        char *save = NULL;
        for (char *id = strtok_r(list, ",", &save); id && x->n_reps < REPS_MAX;
             id = strtok_r(NULL, ",", &save)) {
            double p = predicted(plan, id);
            if (p < 0)
                continue;
            rep *r = &x->reps[x->n_reps++];
            snprintf(r->replica, sizeof r->replica, "%s", id);
            r->m = m;
            r->pred = md_metric_at2(x->rep_pred, id, md->name);
            r->meas = md_metric_at2(x->rep_meas, id, md->name);
            md_gauge_set(r->pred, p);
            md_gauge_set(r->meas, 0);
        }
    }
}
