/* daemon_metrics.c — see daemon_metrics.h. Gauges of things that come and go (GPU types,
 * models, replicas) are hidden when the next round or plan no longer names them, so the
 * scrape shows the current fleet and plan only. */
#include "scheduler/daemon_metrics.h"

#include <stdlib.h>
#include <string.h>

#include "common/log.h"

#define KEEP_MAX 256 /* series of one round or plan remembered for hiding */

/* The series set last time in one family, to hide those not set this time. */
typedef struct {
    md_series *s[KEEP_MAX];
    int n;
} kept;

struct sched_dm {
    md_metric *leader, *rounds, *version, *published, *solve, *workers, *gpus, *backlog;
    md_metric *rep_tps, *model_tps, *plan_tps, *plan_usd;
    kept k_gpus, k_backlog, k_rep, k_model;
};

static const double SOLVE_BOUNDS[] = {0.001, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60};

sched_dm *sched_dm_new(md_metrics *g) {
    if (!g)
        return NULL;
    sched_dm *d = calloc(1, sizeof *d);
    if (!d)
        return NULL;
    md_err e = {0};
    const char *reason[] = {"reason"}, *type[] = {"gpu_type"}, *model[] = {"model"};
    const char *rm[] = {"replica", "model"};
    /* clang-format off */
    if (!(d->leader = md_metrics_gauge(g, "medley_scheduler_leader", "1 while this scheduler holds the lease.", 0, NULL, 1, &e)) ||
        !(d->rounds = md_metrics_counter(g, "medley_scheduler_rounds_total", "Planning rounds run as the leader.", 0, NULL, 1, &e)) ||
        !(d->version = md_metrics_gauge(g, "medley_scheduler_plan_version", "Version of the last plan published (-1: none).", 0, NULL, 1, &e)) ||
        !(d->published = md_metrics_counter(g, "medley_scheduler_plans_published_total", "Plans published, by reason.", 1, reason, 16, &e)) ||
        !(d->solve = md_metrics_histogram(g, "medley_scheduler_solve_duration_seconds", "Building the candidates and solving the placement, per round.", 0, NULL, 1, SOLVE_BOUNDS, (int)(sizeof SOLVE_BOUNDS / sizeof *SOLVE_BOUNDS), &e)) ||
        !(d->workers = md_metrics_gauge(g, "medley_scheduler_fleet_workers", "Workers whose heartbeats name a catalog GPU type.", 0, NULL, 1, &e)) ||
        !(d->gpus = md_metrics_gauge(g, "medley_scheduler_fleet_gpus", "GPUs in the fleet by catalog type.", 1, type, 128, &e)) ||
        !(d->backlog = md_metrics_gauge(g, "medley_scheduler_backlog_requests", "Entries waiting or running per model.", 1, model, 256, &e)) ||
        !(d->rep_tps = md_metrics_gauge(g, "medley_scheduler_replica_predicted_tokens_per_second", "Predicted tokens/s of each replica of the published plan.", 2, rm, 1024, &e)) ||
        !(d->model_tps = md_metrics_gauge(g, "medley_scheduler_model_predicted_tokens_per_second", "Predicted tokens/s of each model of the published plan.", 1, model, 256, &e)) ||
        !(d->plan_tps = md_metrics_gauge(g, "medley_scheduler_plan_tokens_per_second", "The published plan's predicted tokens/s.", 0, NULL, 1, &e)) ||
        !(d->plan_usd = md_metrics_gauge(g, "medley_scheduler_plan_usd_per_hour", "The published plan's dollars per hour.", 0, NULL, 1, &e))) {
        /* clang-format on */
        MD_ERROR("scheduler", "metrics: %s; running without them", e.msg);
        free(d);
        return NULL;
    }
    md_gauge_set(md_metric_at0(d->version), -1);
    return d;
}

void sched_dm_free(sched_dm *dm) {
    free(dm);
}

/* Hide last time's series of k that now does not hold; now becomes k. */
static void rekeep(kept *k, const kept *now) {
    for (int i = 0; i < k->n; i++) {
        int still = 0;
        for (int j = 0; j < now->n && !still; j++)
            still = k->s[i] == now->s[j];
        if (!still)
            md_series_hide(k->s[i]);
    }
    *k = *now;
}

static void keep(kept *k, md_series *s) {
    if (s && k->n < KEEP_MAX)
        k->s[k->n++] = s;
}

void sched_dm_leader(sched_dm *dm, int leader) {
    if (dm)
        md_gauge_set(md_metric_at0(dm->leader), leader);
}

void sched_dm_round(sched_dm *dm, const json_t *pools, const json_t *workers,
                    const json_t *backlog) {
    if (!dm)
        return;
    md_counter_add(md_metric_at0(dm->rounds), 1);
    md_gauge_set(md_metric_at0(dm->workers), (double)json_array_size(workers));
    json_t *by_type = json_object();
    size_t i;
    json_t *p;
    json_array_foreach(pools, i, p) {
        const char *t = json_string_value(json_object_get(p, "type"));
        if (t)
            json_object_set_new(by_type, t,
                                json_integer(json_integer_value(json_object_get(by_type, t)) +
                                             json_integer_value(json_object_get(p, "count"))));
    }
    kept now = {0};
    const char *k;
    json_t *v;
    json_object_foreach(by_type, k, v) {
        md_series *s = md_metric_at1(dm->gpus, k);
        md_gauge_set(s, (double)json_integer_value(v));
        keep(&now, s);
    }
    rekeep(&dm->k_gpus, &now);
    json_decref(by_type);
    now.n = 0;
    json_object_foreach((json_t *)backlog, k, v) {
        md_series *s = md_metric_at1(dm->backlog, k);
        md_gauge_set(s, (double)json_integer_value(v));
        keep(&now, s);
    }
    rekeep(&dm->k_backlog, &now);
}

void sched_dm_solved(sched_dm *dm, double solve_s) {
    if (dm)
        md_histogram_observe(md_metric_at0(dm->solve), solve_s);
}

void sched_dm_published(sched_dm *dm, const json_t *doc, const char *reason) {
    if (!dm)
        return;
    md_counter_add(md_metric_at1(dm->published, reason), 1);
    md_gauge_set(md_metric_at0(dm->version),
                 (double)json_integer_value(json_object_get(doc, "version")));
    const json_t *totals = json_object_get(doc, "totals");
    md_gauge_set(md_metric_at0(dm->plan_tps),
                 json_number_value(json_object_get(totals, "tokens_per_s")));
    md_gauge_set(md_metric_at0(dm->plan_usd),
                 json_number_value(json_object_get(totals, "usd_per_hour")));
    kept now = {0};
    size_t i;
    json_t *r;
    json_array_foreach(json_object_get(doc, "replicas"), i, r) {
        const char *id = json_string_value(json_object_get(r, "id"));
        const char *m = json_string_value(json_object_get(r, "model"));
        if (!id || !m)
            continue;
        md_series *s = md_metric_at2(dm->rep_tps, id, m);
        md_gauge_set(s, json_number_value(json_object_get(r, "predicted_tokens_per_s")));
        keep(&now, s);
    }
    rekeep(&dm->k_rep, &now);
    now.n = 0;
    json_array_foreach(json_object_get(doc, "models"), i, r) {
        const char *m = json_string_value(json_object_get(r, "model"));
        if (!m)
            continue;
        md_series *s = md_metric_at1(dm->model_tps, m);
        md_gauge_set(s, json_number_value(json_object_get(r, "predicted_tokens_per_s")));
        keep(&now, s);
    }
    rekeep(&dm->k_model, &now);
}
