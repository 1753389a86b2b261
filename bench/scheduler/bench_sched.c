/* bench_sched.c — the scheduler's scenario suite, scored by the fleet simulator.
 *
 *   build-dir/bench/bench_sched [bench/scheduler/scenarios.json]
 *
 * Fixed fleets: medley's plan against the best single-GPU-type plan (the same optimiser
 * restricted to one type, best simulated tokens per dollar among those that serve every
 * request) and against proportional splitting (GPUs per model in proportion to demand,
 * every GPU on, requests to any replica). Rentals: medley's plan against the cheapest
 * single-type rental that meets the deadlines. Scale: 1,000 GPUs x 10 models, planning time.
 * Ratios > 1 favour medley. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "scheduler/sched.h"

typedef struct world {
    sched_catalog cat;
    sched_fleet f;
    sched_workload w;
    sched_cands cs;
    sched_perf_params pp;
} world;

static char dir[4096];

static int load(world *x, const char *fleet, const char *workload, md_err *e) {
    char fp[8192], wp[8192];
    snprintf(fp, sizeof fp, "%s/%s", dir, fleet);
    snprintf(wp, sizeof wp, "%s/%s", dir, workload);
    memset(x, 0, sizeof *x);
    sched_perf_defaults(&x->pp);
    if (sched_catalog_load(&x->cat, NULL, e) || sched_fleet_load(&x->f, fp, &x->cat, e) ||
        sched_workload_load(&x->w, wp, e) ||
        sched_cands_build(&x->cs, &x->w, &x->f, &x->cat, NULL, &x->pp, e))
        return e->code;
    return 0;
}

static void unload(world *x) {
    sched_cands_free(&x->cs);
    sched_workload_free(&x->w);
    sched_fleet_free(&x->f);
    sched_catalog_free(&x->cat);
}

static double max_deadline(const sched_workload *w) {
    double d = 0;
    for (int m = 0; m < w->n; m++)
        d = fmax(d, w->models[m].deadline_s);
    return d;
}

/* Plan (mode 0 optimiser, 1 proportional) restricted to type (-1 all), then simulate. */
static int run(world *x, int mode, int type, sched_plan *p, sched_sim_result *r) {
    md_err e = {0};
    sched_opts o;
    sched_opts_defaults(&o);
    o.only_type = type;
    int rc = mode ? sched_plan_proportional(p, &x->w, &x->f, &x->cat, &x->cs, &e)
                  : sched_plan_solve(p, &x->w, &x->f, &x->cat, &x->cs, &o, &e);
    if (rc)
        return rc;
    if (sched_plan_validate(p, &x->w, &x->f, &x->cat, &x->cs, &x->pp, &e)) {
        fprintf(stderr, "invalid plan: %s\n", e.msg);
        sched_plan_free(p);
        return -1;
    }
    rc = sched_simulate(p, &x->w, &x->f, &x->cat, &x->cs, &x->pp, NULL, 0, r, &e);
    if (rc)
        sched_plan_free(p);
    return rc;
}

static int all_met(const sched_plan *p) {
    for (int m = 0; m < p->nmodels; m++)
        if (!p->models[m].deadline_met)
            return 0;
    return 1;
}

static void fixed(json_t *sc, double *geo, int *ngeo) {
    const char *name = json_string_value(json_object_get(sc, "name"));
    world x;
    md_err e = {0};
    if (load(&x, json_string_value(json_object_get(sc, "fleet")),
             json_string_value(json_object_get(sc, "workload")), &e)) {
        printf("%-40s error: %s\n", name, e.msg);
        unload(&x);
        return;
    }
    sched_plan p;
    sched_sim_result h, best = {0}, prop;
    if (run(&x, 0, -1, &p, &h)) {
        printf("%-40s medley plan failed\n", name);
        unload(&x);
        return;
    }
    int met = all_met(&p);
    sched_plan_free(&p);
    const char *best_t = "none";
    int best_met = 0;
    for (int i = 0; i < x.f.n; i++) {
        int t = x.f.pools[i].type, seen = 0;
        for (int j = 0; j < i; j++)
            seen |= x.f.pools[j].type == t;
        sched_sim_result r;
        if (seen || run(&x, 0, t, &p, &r))
            continue;
        int m = all_met(&p);
        sched_plan_free(&p);
        if (r.requests_unserved)
            continue;
        /* A type that meets the deadlines beats one that does not; then tokens per dollar. */
        if ((m && !best_met) || (m == best_met && r.tokens_per_usd > best.tokens_per_usd)) {
            best = r;
            best_t = x.cat.gpus[t].name;
            best_met = m;
        }
    }
    int have_prop = run(&x, 1, -1, &p, &prop) == 0;
    if (have_prop)
        sched_plan_free(&p);
    double dl = max_deadline(&x.w);
    printf("%-40s %9.0f %8.0fs%s | %-13s %9.0f %8.0fs%s %6.2fx | %9.0f %8.0fs %6.2fx\n", name,
           h.tokens_per_usd, h.makespan_s, dl > 0 ? (met ? " ok" : " MISS") : "", best_t,
           best.tokens_per_usd, best.makespan_s, dl > 0 ? (best_met ? " ok" : " MISS") : "",
           best.tokens_per_usd > 0 ? h.tokens_per_usd / best.tokens_per_usd : 0,
           have_prop ? prop.tokens_per_usd : 0, have_prop ? prop.makespan_s : 0,
           have_prop && prop.tokens_per_usd > 0 ? h.tokens_per_usd / prop.tokens_per_usd : 0);
    if (best.tokens_per_usd > 0 && (best_met || dl <= 0)) {
        *geo += log(h.tokens_per_usd / best.tokens_per_usd);
        (*ngeo)++;
    }
    unload(&x);
}

static void rent(json_t *sc) {
    const char *name = json_string_value(json_object_get(sc, "name"));
    world x;
    md_err e = {0};
    if (load(&x, json_string_value(json_object_get(sc, "fleet")),
             json_string_value(json_object_get(sc, "workload")), &e)) {
        printf("%-34s error: %s\n", name, e.msg);
        unload(&x);
        return;
    }
    sched_plan p;
    sched_sim_result h, r, best = {0};
    if (run(&x, 0, -1, &p, &h)) {
        printf("%-34s medley plan failed\n", name);
        unload(&x);
        return;
    }
    double plan_usd = p.busy_usd_per_hour;
    int met = all_met(&p);
    sched_plan_free(&p);
    const char *best_t = "none";
    double best_plan_usd = 0;
    for (int i = 0; i < x.f.n; i++) {
        if (run(&x, 0, x.f.pools[i].type, &p, &r))
            continue;
        int m = all_met(&p);
        double u = p.busy_usd_per_hour;
        sched_plan_free(&p);
        if (!m || r.requests_unserved)
            continue;
        if (!best_plan_usd || r.usd < best.usd) {
            best_plan_usd = u;
            best = r;
            best_t = x.cat.gpus[x.f.pools[i].type].name;
        }
    }
    printf("%-34s $%7.2f %7.0fs %s | %-13s $%7.2f %7.0fs | %5.2fx cheaper (plan: $%.2f vs "
           "$%.2f per hour of work)\n",
           name, h.usd, h.makespan_s, met ? "ok  " : "MISS", best_t, best.usd, best.makespan_s,
           h.usd > 0 ? best.usd / h.usd : 0, plan_usd, best_plan_usd);
    unload(&x);
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void scale(json_t *sc) {
    double t[5];
    int ncand = 0, nrep = 0, gpus = 0;
    for (int i = 0; i < 5; i++) {
        world x;
        md_err e = {0};
        uint64_t t0 = md_mono_ns();
        if (load(&x, json_string_value(json_object_get(sc, "fleet")),
                 json_string_value(json_object_get(sc, "workload")), &e)) {
            printf("scale: %s\n", e.msg);
            unload(&x);
            return;
        }
        sched_plan p;
        sched_opts o;
        sched_opts_defaults(&o);
        if (sched_plan_solve(&p, &x.w, &x.f, &x.cat, &x.cs, &o, &e)) {
            printf("scale: %s\n", e.msg);
            unload(&x);
            return;
        }
        t[i] = (md_mono_ns() - t0) / 1e9;
        ncand = x.cs.n;
        nrep = p.n;
        gpus = sched_fleet_gpus(&x.f);
        sched_plan_free(&p);
        unload(&x);
    }
    qsort(t, 5, sizeof *t, cmp_d);
    printf("\nscale: %d GPUs x 10 models: %d candidates, %d replicas, plan in %.3f s (median of "
           "5, wall clock, loading + candidates + MILP)\n",
           gpus, ncand, nrep, t[2]);
}

int main(int argc, char **argv) {
    const char *path = argc > 1 ? argv[1] : MEDLEY_SOURCE_DIR "/bench/scheduler/scenarios.json";
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash)
        *slash = 0;
    else
        snprintf(dir, sizeof dir, ".");
    md_err e = {0};
    json_t *doc = md_json_load(path, &e);
    if (!doc) {
        fprintf(stderr, "bench_sched: %s\n", e.msg);
        return 1;
    }
    printf("fixed fleets: simulated tokens per dollar (makespan; deadline ok/MISS)\n");
    printf("%-40s %9s %9s    | %-13s %9s %9s     %7s | %9s %9s %7s\n", "scenario", "medley",
           "makespan", "best 1-type", "tok/$", "makespan", "ratio", "proport.", "makespan",
           "ratio");
    double geo = 0;
    int ngeo = 0;
    size_t i;
    json_t *sc;
    json_array_foreach(json_object_get(doc, "fixed"), i, sc) fixed(sc, &geo, &ngeo);
    if (ngeo)
        printf(
            "geometric mean vs best single type, over the %d scenarios where that type meets the "
            "deadlines: %.2fx\n",
            ngeo, exp(geo / ngeo));
    printf(
        "\nrentals to deadline: simulated $ spent and makespan; medley vs the cheapest single-type "
        "rental that meets the deadlines\n");
    json_array_foreach(json_object_get(doc, "rent"), i, sc) rent(sc);
    scale(json_object_get(doc, "scale"));
    json_decref(doc);
    return 0;
}
