/* bench_sched.c — the scheduler's scenario suite, scored by the fleet simulator.
 *
 *   build-dir/tests/bench_sched [bench/scheduler/scenarios.json [--owned]]
 *   build-dir/tests/bench_sched --fair    fair share at 10,000 GPUs, 200x-500x (issue 39 item 10)
 *   build-dir/tests/bench_sched --slo     Melange's setting with TPOT SLOs (issue 39 item 12)
 *   --owned: section (a) alone, routing vs work stealing (issue 39 item 11)
 *
 * Fixed fleets: medley's plan against the best single-GPU-type plan (the same optimiser
 * restricted to one type, best simulated tokens per dollar among those that serve every
 * request) and against proportional splitting (GPUs per model in proportion to demand,
 * every GPU on, requests to any replica). Rentals: medley's plan against the cheapest
 * single-type rental that meets the deadlines. Scale: 1,000 GPUs x 10 models, planning time.
 * Ratios > 1 favour medley. */
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/util.h"
#include "scheduler/sched.h"
#include "unit/sched_world.h"

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
        sched_fleet_aggregate(&x->f, e) || sched_workload_load(&x->w, wp, e) ||
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

/* What a user does today on an owned mixed fleet: on every pool, each model that fits gets one
 * replica of its smallest single-type candidate there, then the pool's other GPUs go one
 * replica at a time to the model with the most demand (tokens) per GPU it already has there
 * (D'Hondt: GPUs in proportion to demand). Every replica takes all classes it can hold, and a
 * load balancer deals requests to replicas evenly (route_even). GPU ids are given in order,
 * larger TP groups first, so that groups stay inside hosts. 0, or -1 when out of memory. */
static int plan_per_type_even(sched_plan *p, const world *x) {
    const sched_workload *w = &x->w;
    const sched_cands *cs = &x->cs;
    memset(p, 0, sizeof *p);
    p->notes = json_array();
    p->route_even = 1;
    p->nmodels = w->n;
    p->ncands = cs->n;
    p->models = calloc((size_t)w->n + 1, sizeof *p->models);
    p->r = calloc((size_t)sched_fleet_gpus(&x->f) + 1, sizeof *p->r);
    int *cand = calloc((size_t)w->n + 1, sizeof *cand),
        *got = calloc((size_t)w->n + 1, sizeof *got);
    if (!p->models || !p->r || !cand || !got) {
        free(cand), free(got);
        sched_plan_free(p);
        return -1;
    }
    for (int q = 0; q < x->f.n; q++) {
        const sched_pool *pool = &x->f.pools[q];
        int left = pool->count;
        for (int m = 0; m < w->n; m++) {
            cand[m] = -1;
            got[m] = 0;
            for (int c = 0; c < cs->n; c++)
                if (cs->c[c].model == m && cs->c[c].nstages == 1 && cs->c[c].stages[0].pool == q &&
                    (cand[m] < 0 || cs->c[c].gpus < cs->c[cand[m]].gpus))
                    cand[m] = c;
        }
        for (int first = 1;; first = 0) {
            int any = 0;
            for (;;) {
                int best = -1;
                double bv = -1;
                for (int m = 0; m < w->n; m++) {
                    if (cand[m] < 0 || cs->c[cand[m]].gpus > left || (first && got[m]))
                        continue;
                    const sched_demand *d = &w->models[m];
                    double v = (d->requests + d->rate_rps * w->horizon_s) *
                               sched_demand_tokens_per_request(d) / (got[m] + cs->c[cand[m]].gpus);
                    if (v > bv)
                        bv = v, best = m;
                }
                if (best < 0)
                    break;
                got[best] += cs->c[cand[best]].gpus;
                left -= cs->c[cand[best]].gpus;
                sched_replica *r = &p->r[p->n++];
                r->cand = cand[best];
                r->busy = 1;
                any = 1;
            }
            if (!first || !any)
                break;
        }
    }
    free(cand), free(got);
    /* GPU ids: per pool, larger TP groups first, each from the next free index. */
    for (int q = 0; q < x->f.n; q++) {
        int at = 0;
        for (int tp = 8; tp >= 1; tp /= 2)
            for (int i = 0; i < p->n; i++) {
                const sched_cand *c = &cs->c[p->r[i].cand];
                if (c->stages[0].pool != q || c->stages[0].tp != tp)
                    continue;
                int per = x->f.pools[q].gpus_per_host;
                if (at % per + tp > per)
                    at += per - at % per; /* next host */
                p->r[i].gpu_ids = calloc((size_t)tp, sizeof *p->r[i].gpu_ids);
                if (!p->r[i].gpu_ids) {
                    sched_plan_free(p);
                    return -1;
                }
                for (int g = 0; g < tp; g++)
                    snprintf(p->r[i].gpu_ids[g], SCHED_ID, "%s/%d", x->f.pools[q].name, at++);
            }
    }
    for (int i = 0; i < p->n; i++) {
        const sched_cand *c = &cs->c[p->r[i].cand];
        const sched_demand *d = &w->models[c->model];
        for (int k = 0; k < d->nclasses; k++)
            p->r[i].share[k] = c->serves[k] ? d->classes[k].share : 0;
        p->usd_per_hour += c->usd_per_hour;
    }
    p->busy_usd_per_hour = p->usd_per_hour;
    return 0;
}

/* (a) An owned mixed fleet: medley's plan against what a user does today — each GPU type runs
 * whole replicas of every model, GPUs per model in proportion to its demand
 * (plan_per_type_even), and a load balancer deals each model's requests evenly to its
 * replicas (route_even), whatever their speed. The GPUs are paid for either way, so the
 * score is simulated tokens per second over the whole backlog. */
static void owned(json_t *sc) {
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
    sched_sim_result h, lb = {0}, pull = {0}, own = {0};
    if (run(&x, 0, -1, &p, &h)) {
        printf("%-34s medley plan failed\n", name);
        unload(&x);
        return;
    }
    int met = all_met(&p), nrep = p.n;
    /* medley's replicas again, as plain work stealing (its routing ignored) */
    p.route_pull = 1;
    sched_simulate(&p, &x.w, &x.f, &x.cat, &x.cs, &x.pp, NULL, 0, &own, &e);
    sched_plan_free(&p);
    /* The baseline's plan, scored twice: dealt evenly, and pulled from shared queues. */
    int have = plan_per_type_even(&p, &x) == 0;
    if (have && sched_plan_validate(&p, &x.w, &x.f, &x.cat, &x.cs, &x.pp, &e)) {
        printf("%-34s invalid baseline plan: %s\n", name, e.msg);
        sched_plan_free(&p);
        have = 0;
    }
    int nlb = have ? p.n : 0;
    if (have) {
        p.route_even = 1;
        have = sched_simulate(&p, &x.w, &x.f, &x.cat, &x.cs, &x.pp, NULL, 0, &lb, &e) == 0;
        p.route_even = 0;
        have =
            have && sched_simulate(&p, &x.w, &x.f, &x.cat, &x.cs, &x.pp, NULL, 0, &pull, &e) == 0;
        sched_plan_free(&p);
    }
    printf("%-34s %8.0f %7.0fs %-4s %3d | %8.0f %7.0fs %3d %5.2fx | %8.0f %7.0fs %5.2fx | %8.0f "
           "%7.0fs %5.2fx%s\n",
           name, h.tokens_per_s, h.makespan_s, met ? "ok" : "MISS", nrep, lb.tokens_per_s,
           lb.makespan_s, nlb, lb.tokens_per_s > 0 ? h.tokens_per_s / lb.tokens_per_s : 0,
           pull.tokens_per_s, pull.makespan_s,
           pull.tokens_per_s > 0 ? h.tokens_per_s / pull.tokens_per_s : 0, own.tokens_per_s,
           own.makespan_s, own.tokens_per_s > 0 ? h.tokens_per_s / own.tokens_per_s : 0,
           h.requests_unserved + lb.requests_unserved + pull.requests_unserved ? " (unserved)"
                                                                               : "");
    /* issue 39 item 11: routing must never lose to plain stealing over the same replicas */
    printf("  routing+steal vs plain stealing, same replicas: %.3fx (%.0f s vs %.0f s)%s\n",
           own.tokens_per_s > 0 ? h.tokens_per_s / own.tokens_per_s : 0, h.makespan_s,
           own.makespan_s, h.tokens_per_s >= own.tokens_per_s ? "" : "  BELOW 1.0x");
    if (h.requests_unserved + lb.requests_unserved + pull.requests_unserved)
        printf("  unserved: medley %lld, even %lld, pull %lld\n", h.requests_unserved,
               lb.requests_unserved, pull.requests_unserved);
    unload(&x);
}

/* (b) Renting under per-type caps (fleet "rent": {"max": {...}}) to a deadline: medley's
 * rental against the cheapest single-type rental within that type's cap that meets the
 * deadlines; when no single type can, the one that comes closest (shortest makespan). */
static void capped(json_t *sc) {
    const char *name = json_string_value(json_object_get(sc, "name"));
    world x;
    md_err e = {0};
    if (load(&x, json_string_value(json_object_get(sc, "fleet")),
             json_string_value(json_object_get(sc, "workload")), &e)) {
        printf("%-30s error: %s\n", name, e.msg);
        unload(&x);
        return;
    }
    sched_plan p;
    sched_sim_result h, r, best = {0}, near = {0};
    if (run(&x, 0, -1, &p, &h)) {
        printf("%-30s medley plan failed\n", name);
        unload(&x);
        return;
    }
    int met = all_met(&p), ng = 0;
    for (int i = 0; i < p.n; i++)
        ng += x.cs.c[p.r[i].cand].gpus;
    sched_plan_free(&p);
    const char *best_t = NULL, *near_t = "none";
    for (int i = 0; i < x.f.n; i++) {
        if (x.f.pools[i].count < 1 || run(&x, 0, x.f.pools[i].type, &p, &r))
            continue;
        int m = all_met(&p);
        sched_plan_free(&p);
        const char *t = x.cat.gpus[x.f.pools[i].type].name;
        if (m && !r.requests_unserved && (!best_t || r.usd < best.usd))
            best = r, best_t = t;
        if (!r.requests_unserved && (!near.makespan_s || r.makespan_s < near.makespan_s))
            near = r, near_t = t;
    }
    if (best_t)
        printf("%-30s $%7.2f %6.0fs %-4s %3d GPUs | %-13s $%7.2f %6.0fs | %5.2fx cheaper\n", name,
               h.usd, h.makespan_s, met ? "ok" : "MISS", ng, best_t, best.usd, best.makespan_s,
               h.usd > 0 ? best.usd / h.usd : 0);
    else
        printf("%-30s $%7.2f %6.0fs %-4s %3d GPUs | no single type meets the deadline within its "
               "cap (closest: %s, %.0f s)\n",
               name, h.usd, h.makespan_s, met ? "ok" : "MISS", ng, near_t, near.makespan_s);
    unload(&x);
}

/* (c) Melange's published setting (Griggs et al., arXiv:2404.14527; blog Plot 5, "Llama2-7b
 * on A10G and A100 across rates"): Llama-2-7B served at a request rate on A10G ($1.01/h) and
 * A100-80GB ($3.67/h), one GPU's capacity read off the figure as profiles (2.0 and 0.366
 * requests/s, profile-melange-*.json). Melange reports 24% savings over the best single type
 * at ~4.35 requests/s with {2 A100, 1 A10G}. Medley's rental against the single-type
 * rentals at the same rates; the simulator checks that the plan serves every request. */
static void melange(json_t *sc) {
    json_t *rates = json_object_get(sc, "rates_rps");
    size_t i;
    json_t *rv;
    json_array_foreach(rates, i, rv) {
        double rate = json_number_value(rv);
        world x;
        md_err e = {0};
        char fp[8192];
        memset(&x, 0, sizeof x);
        sched_perf_defaults(&x.pp);
        sched_profiles prof = {0};
        json_t *wd = json_pack("{s:i, s:f, s:[{s:s, s:f, s:[{s:s, s:f, s:f, s:i, s:f}]}]}", "seed",
                               5, "horizon_s", 3600.0, "models", "model", "llama-2-7b", "rate_rps",
                               rate, "classes", "name", "all", "input_mean", 256.0, "output_mean",
                               256.0, "max_tokens", 2048, "share", 1.0);
        snprintf(fp, sizeof fp, "%s/%s", dir, json_string_value(json_object_get(sc, "fleet")));
        int rc = sched_catalog_load(&x.cat, NULL, &e) || sched_fleet_load(&x.f, fp, &x.cat, &e) ||
                 sched_workload_from_json(&x.w, wd, &e);
        json_t *pv;
        size_t j;
        json_array_foreach(json_object_get(sc, "profiles"), j, pv) {
            snprintf(fp, sizeof fp, "%s/%s", dir, json_string_value(pv));
            rc = rc || sched_profile_load(&prof, fp, &e);
        }
        rc = rc || sched_cands_build(&x.cs, &x.w, &x.f, &x.cat, &prof, &x.pp, &e);
        json_decref(wd);
        if (rc) {
            printf("melange %.2f req/s: %s\n", rate, e.msg);
            sched_profiles_free(&prof);
            unload(&x);
            return;
        }
        /* Like for like: Melange places single GPUs with the profiled figures. */
        int k = 0;
        for (int c = 0; c < x.cs.n; c++)
            if (x.cs.c[c].nstages == 1 && x.cs.c[c].stages[0].tp == 1 &&
                !strcmp(x.cs.c[c].perf[0].bound, "profile"))
                x.cs.c[k++] = x.cs.c[c];
        x.cs.n = k;
        sched_plan p;
        sched_sim_result h, r;
        double usd[3] = {0, 0, 0};
        char mix[64] = "";
        int ok = run(&x, 0, -1, &p, &h) == 0;
        if (ok) {
            usd[0] = p.usd_per_hour;
            int n[2] = {0, 0};
            for (int q = 0; q < p.n; q++)
                n[x.cs.c[p.r[q].cand].stages[0].type == x.f.pools[0].type ? 0 : 1]++;
            snprintf(mix, sizeof mix, "%d %s + %d %s", n[1], x.cat.gpus[x.f.pools[1].type].name,
                     n[0], x.cat.gpus[x.f.pools[0].type].name);
            sched_plan_free(&p);
        }
        for (int t = 0; t < 2 && ok; t++)
            if (run(&x, 0, x.f.pools[t].type, &p, &r) == 0) {
                usd[1 + t] = all_met(&p) ? p.usd_per_hour : 0;
                sched_plan_free(&p);
            }
        double single = usd[1] > 0 && (usd[2] <= 0 || usd[1] < usd[2]) ? usd[1] : usd[2];
        printf("%5.2f req/s  medley $%6.2f/h (%-22s unserved %lld) | A10G-only $%6.2f/h  "
               "A100-only $%6.2f/h | saving vs best single type %3.0f%%\n",
               rate, usd[0], mix, ok ? h.requests_unserved : -1, usd[1], usd[2],
               single > 0 ? 100 * (1 - usd[0] / single) : 0);
        sched_profiles_free(&prof);
        unload(&x);
    }
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

/* ---- scale by hosts: 10,000 GPUs as the daemon sees them (one pool per 8-GPU host) ---- */

/* Load the fleet (merged when aggregate), the workload and the candidates, and plan. Returns
 * the wall time in seconds, or -1 with the error printed. */
static double hosts_plan_once(int aggregate, const sched_opts *o, int *ncand, int *nrep,
                              int *npools, int *limited) {
    world x;
    md_err e = {0};
    memset(&x, 0, sizeof x);
    sched_perf_defaults(&x.pp);
    json_t *fd = sched_world_fleet1000(10, 8), *wd = sched_world_backlog(20, 10);
    uint64_t t0 = md_mono_ns();
    sched_plan p;
    int rc = sched_catalog_load(&x.cat, NULL, &e) || sched_fleet_from_json(&x.f, fd, &x.cat, &e) ||
             (aggregate && sched_fleet_aggregate(&x.f, &e)) ||
             sched_workload_from_json(&x.w, wd, &e) ||
             sched_cands_build(&x.cs, &x.w, &x.f, &x.cat, NULL, &x.pp, &e) ||
             sched_plan_solve(&p, &x.w, &x.f, &x.cat, &x.cs, o, &e);
    double dt = (md_mono_ns() - t0) / 1e9;
    json_decref(fd);
    json_decref(wd);
    if (rc) {
        printf("scale by hosts (%s): %s\n", aggregate ? "merged" : "one pool per host", e.msg);
        unload(&x);
        return -1;
    }
    *ncand = x.cs.n;
    *nrep = p.n;
    *npools = x.f.n;
    *limited = 0;
    size_t i;
    json_t *n;
    json_array_foreach(p.notes, i, n) *limited |= strstr(json_string_value(n), "limit") != NULL;
    sched_plan_free(&p);
    unload(&x);
    return dt;
}

/* One pool per host, in a child process stopped after cap_s: with 1,250 pools the candidate
 * search over pairs of pools alone runs for minutes. Returns the wall time, or -1 when the
 * child was stopped (or failed). */
static double hosts_unmerged(double cap_s, int *ncand, int *nrep, int *npools, int *limited) {
    int fd[2];
    if (pipe(fd))
        return -1;
    uint64_t t0 = md_mono_ns();
    pid_t pid = fork();
    if (pid == 0) {
        close(fd[0]);
        sched_opts o;
        sched_opts_defaults(&o);
        int out[4] = {0};
        double t = hosts_plan_once(0, &o, &out[0], &out[1], &out[2], &out[3]);
        ssize_t w = t >= 0 ? write(fd[1], out, sizeof out) : 0;
        _exit(w == (ssize_t)sizeof out ? 0 : 1);
    }
    close(fd[1]);
    struct pollfd pf = {fd[0], POLLIN, 0};
    int out[4], got = pid > 0 && poll(&pf, 1, (int)(cap_s * 1000)) == 1 &&
                      read(fd[0], out, sizeof out) == (ssize_t)sizeof out;
    double dt = (md_mono_ns() - t0) / 1e9;
    if (pid > 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
    }
    close(fd[0]);
    if (!got)
        return -1;
    *ncand = out[0], *nrep = out[1], *npools = out[2], *limited = out[3];
    return dt;
}

/* 10,000 GPUs as 1,250 hosts x 20 models: the median of 5 plans with the hosts merged, and
 * one plan with one pool per host (as the daemon built them before merging), stopped after
 * 120 s so that the bench ends in minutes. */
static void scale_hosts(void) {
    sched_opts o;
    sched_opts_defaults(&o);
    double t[5], cap_s = 120;
    int ncand = 0, nrep = 0, npools = 0, lim = 0;
    for (int i = 0; i < 5; i++)
        if ((t[i] = hosts_plan_once(1, &o, &ncand, &nrep, &npools, &lim)) < 0)
            return;
    qsort(t, 5, sizeof *t, cmp_d);
    printf("\nscale by hosts: 10000 GPUs as 1250 hosts x 20 models, merged into %d pools: %d "
           "candidates, %d replicas, plan in %.3f s (median of 5, wall clock, loading + "
           "candidates + MILP)%s\n",
           npools, ncand, nrep, t[2], lim ? "; the MILP stopped at a limit" : "");
    fflush(stdout);
    int c1 = 0, r1 = 0, p1 = 0, lim1 = 0;
    double u = hosts_unmerged(cap_s, &c1, &r1, &p1, &lim1);
    if (u < 0)
        printf("  the same with one pool per host (1250 pools): no plan within %.0f s (stopped "
               "there; building the candidates alone takes longer): merging is > %.0fx faster\n",
               cap_s, cap_s / t[2]);
    else
        printf("  the same with one pool per host (%d pools, %d candidates): %d replicas in %.1f "
               "s%s: merging is %.0fx faster\n",
               p1, c1, r1, u, lim1 ? " (the MILP stopped at a limit)" : "", u / t[2]);
}

/* ---- Melange's serving setting through `medley plan` alone (issue 39 item 12) ---- */

/* Llama-2-7B served at rate_rps with a TPOT SLO, in one of Melange's request-size mixes:
 * 0 short (Chatbot Arena), 1 long (PubMed), 2 mixed (80% short, 20% long). */
static json_t *slo_workload_doc(int mix, double rate, double tpot_ms) {
    /* Arena: LMSYS-Chat-1M's mean prompt and response per turn (69.5 / 214.5 tokens, its
     * paper's Table 1); PubMed: ccdv/pubmed-summarization's mean article / abstract (3043 /
     * 215 whitespace tokens, its dataset card). */
    json_t *arena = json_pack("{s:s, s:f, s:f, s:i, s:f, s:f}", "name", "arena", "input_mean", 69.5,
                              "output_mean", 214.5, "max_tokens", 1024, "share",
                              mix == 2 ? 0.8 : 1.0, "tpot_ms", tpot_ms);
    json_t *pubmed = json_pack("{s:s, s:f, s:f, s:i, s:f, s:f}", "name", "pubmed", "input_mean",
                               3043.0, "output_mean", 215.0, "max_tokens", 4096, "share",
                               mix == 2 ? 0.2 : 1.0, "tpot_ms", tpot_ms);
    json_t *cls = json_array();
    if (mix != 1)
        json_array_append_new(cls, arena);
    else
        json_decref(arena);
    if (mix != 0)
        json_array_append_new(cls, pubmed);
    else
        json_decref(pubmed);
    return json_pack("{s:[{s:s, s:f, s:o}]}", "models", "model", "llama-2-7b", "rate_rps", rate,
                     "classes", cls);
}

/* $/h of the rental plan for x restricted to type (-1: any mix); INFINITY when it does not
 * serve the whole rate. */
static double slo_rent_usd(world *x, int type) {
    sched_opts o;
    sched_opts_defaults(&o);
    o.only_type = type;
    sched_plan p;
    md_err e = {0};
    if (sched_plan_solve(&p, &x->w, &x->f, &x->cat, &x->cs, &o, &e))
        return INFINITY;
    double usd = all_met(&p) ? p.usd_per_hour : INFINITY;
    sched_plan_free(&p);
    return usd;
}

static void melange_slo(void) {
    static const char *mixes[] = {"short (Arena)", "long (PubMed)", "mixed 80/20"};
    static const char *types[] = {"L4", "A10G", "A100-80GB-SXM", "H100-SXM"};
    static const double rates[] = {1, 2, 4, 8, 16, 32}, slos[] = {120, 40};
    printf("\n(d) Melange's serving setting through medley plan alone (issue 39 item 12): "
           "Llama-2-7B, TPOT SLO per class, L4 $0.70, A10G $1.01, A100 $3.67, H100 $7.52 per hour "
           "(roofline, no profiles); rental $/h, medley vs the cheapest single type\n");
    printf("%-15s %5s %6s | %8s | %8s %8s %8s %8s | %-13s %7s\n", "mix", "SLO", "req/s", "medley",
           "L4", "A10G", "A100", "H100", "best single", "saving");
    for (int mi = 0; mi < 3; mi++)
        for (int si = 0; si < 2; si++)
            for (int ri = 0; ri < 6; ri++) {
                world x;
                md_err e = {0};
                memset(&x, 0, sizeof x);
                sched_perf_defaults(&x.pp);
                char fp[8192];
                snprintf(fp, sizeof fp, "%s/fleet-rent5-melange-prices.json", dir);
                json_t *wd = slo_workload_doc(mi, rates[ri], slos[si]);
                int rc = sched_catalog_load(&x.cat, NULL, &e) ||
                         sched_fleet_load(&x.f, fp, &x.cat, &e) ||
                         sched_workload_from_json(&x.w, wd, &e) ||
                         sched_cands_build(&x.cs, &x.w, &x.f, &x.cat, NULL, &x.pp, &e);
                json_decref(wd);
                if (rc) {
                    printf("%-15s error: %s\n", mixes[mi], e.msg);
                    unload(&x);
                    continue;
                }
                double med = slo_rent_usd(&x, -1), one[4], best = INFINITY;
                int bi = -1;
                for (int t = 0; t < 4; t++) {
                    one[t] = slo_rent_usd(&x, sched_catalog_find(&x.cat, types[t]));
                    if (one[t] < best)
                        best = one[t], bi = t;
                }
                printf("%-15s %3.0fms %6.0f | %8.2f | %8.2f %8.2f %8.2f %8.2f | %-13s %6.0f%%\n",
                       mixes[mi], slos[si], rates[ri], med, one[0], one[1], one[2], one[3],
                       bi >= 0 ? types[bi] : "none", isfinite(best) ? 100 * (1 - med / best) : 0);
                unload(&x);
            }
}

/* Issue 39 item 10: the same 10,000 GPUs under over-demand (mult x the bench backlog): each
 * model's served fraction of its demand; the least of them, and least / most (1.0: every
 * model gets the same fraction, as phase 1's common lambda asks). */
static void fair_hosts(int mult) {
    world x;
    md_err e = {0};
    memset(&x, 0, sizeof x);
    sched_perf_defaults(&x.pp);
    sched_opts o;
    sched_opts_defaults(&o);
    json_t *fd = sched_world_fleet1000(10, 8), *wd = sched_world_backlog(20, mult);
    uint64_t t0 = md_mono_ns();
    sched_plan p;
    int rc = sched_catalog_load(&x.cat, NULL, &e) || sched_fleet_from_json(&x.f, fd, &x.cat, &e) ||
             sched_fleet_aggregate(&x.f, &e) || sched_workload_from_json(&x.w, wd, &e) ||
             sched_cands_build(&x.cs, &x.w, &x.f, &x.cat, NULL, &x.pp, &e) ||
             sched_plan_solve(&p, &x.w, &x.f, &x.cat, &x.cs, &o, &e);
    double dt = (md_mono_ns() - t0) / 1e9;
    json_decref(fd);
    json_decref(wd);
    if (rc) {
        printf("  %dx: %s\n", mult, e.msg);
        unload(&x);
        return;
    }
    double lo = INFINITY, hi = 0;
    int starved = 0;
    for (int m = 0; m < p.nmodels; m++) {
        double f = p.models[m].served_tps / p.models[m].demand_tps;
        lo = fmin(lo, f);
        hi = fmax(hi, f);
        starved += f < 0.01;
    }
    printf("  %3dx demand: min share %.3f, max %.3f, fairness (min/max) %.2f, %d of %d models "
           "under 1%%, %d replicas, plan in %.1f s\n",
           mult, lo, hi, hi > 0 ? lo / hi : 0, starved, p.nmodels, p.n, dt);
    size_t i;
    json_t *n;
    json_array_foreach(p.notes, i, n) if (getenv("BENCH_NOTES"))
        printf("    note: %s\n", json_string_value(n));
    sched_plan_free(&p);
    unload(&x);
}

static void fair_scale(void) {
    printf("\nfair share at 10000 GPUs (1250 hosts x 8, 20 models) under over-demand (issue 39 "
           "item 10): served / demand per model\n");
    int mults[] = {200, 300, 500};
    for (int i = 0; i < 3; i++)
        fair_hosts(mults[i]);
}

/* Loading a fleet of n single-GPU pools (the daemon's view of n workers): seconds, or -1. */
static double load_pools_s(int n) {
    json_t *doc = sched_world_workers(n, "L4");
    sched_catalog cat;
    sched_fleet f;
    md_err e = {0};
    double s = -1;
    if (!sched_catalog_load(&cat, NULL, &e)) {
        uint64_t t0 = md_mono_ns();
        if (!sched_fleet_from_json(&f, doc, &cat, &e))
            s = (double)(md_mono_ns() - t0) / 1e9;
        sched_fleet_free(&f);
        sched_catalog_free(&cat);
    }
    json_decref(doc);
    return s;
}

/* Issue 39 item 9: the duplicate-name check was a scan of the earlier pools (quadratic);
 * now a hash set. Before (d2d350a): 40,000 pools 3.8-4.5 s on the 2-core dev machine, 10 s
 * in the report; 160,000 pools over 120 s there. */
static void load_scale(void) {
    printf("\nloading pools (issue 39 item 9; before, quadratic: 40000 pools 3.8 s here, 160000 "
           "over 120 s in the report):");
    int ns[] = {40000, 160000};
    for (int i = 0; i < 2; i++)
        printf(" %d pools %.3f s%s", ns[i], load_pools_s(ns[i]), i ? "\n" : ",");
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "--fair")) {
        fair_scale();
        return 0;
    }
    if (argc > 1 && !strcmp(argv[1], "--slo")) {
        snprintf(dir, sizeof dir, "%s/bench/scheduler", MEDLEY_SOURCE_DIR);
        melange_slo();
        return 0;
    }
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
    /* --owned after the scenarios file: section (a) alone */
    int owned_only = argc > 2 && !strcmp(argv[2], "--owned");
    json_array_foreach(json_object_get(doc, "fixed"), i, sc) if (!owned_only)
        fixed(sc, &geo, &ngeo);
    if (ngeo)
        printf(
            "geometric mean vs best single type, over the %d scenarios where that type meets the "
            "deadlines: %.2fx\n",
            ngeo, exp(geo / ngeo));
    printf(
        "\nrentals to deadline: simulated $ spent and makespan; medley vs the cheapest single-type "
        "rental that meets the deadlines\n");
    json_array_foreach(json_object_get(doc, "rent"), i, sc) if (!owned_only) rent(sc);
    printf(
        "\n(a) owned mixed fleet: simulated tokens/s over the whole backlog (makespan; replicas); "
        "medley (routed classes first, stealing when they are empty) vs whole replicas per GPU "
        "type with an even load balancer, the same replicas pulling from shared queues, and "
        "medley's own replicas as plain work stealing (routing ignored)\n");
    printf("%-34s %8s %8s %4s %3s | %8s %8s %3s %6s | %8s %8s %6s | %8s %8s %6s\n", "scenario",
           "tok/s", "makespan", "dl", "rep", "even LB", "makespan", "rep", "ratio", "pull",
           "makespan", "ratio", "own pull", "makespan", "ratio");
    json_array_foreach(json_object_get(doc, "owned"), i, sc) owned(sc);
    if (owned_only) {
        json_decref(doc);
        return 0;
    }
    printf(
        "\n(b) rent with per-type caps (H100 2, A100 8, A10G 16, L4 24) to a deadline: simulated "
        "$ and makespan; medley vs the cheapest single type within its cap that meets it\n");
    json_array_foreach(json_object_get(doc, "capped"), i, sc) capped(sc);
    printf("\n(c) Melange's setting (Llama-2-7B, A10G $1.01/h + A100 $3.67/h, its published "
           "per-GPU capacities as profiles): rental $/h; Melange reports 24%% saving at ~4.35 "
           "req/s with 2 A100 + 1 A10G\n");
    if (json_object_get(doc, "melange"))
        melange(json_object_get(doc, "melange"));
    melange_slo();
    scale(json_object_get(doc, "scale"));
    scale_hosts();
    fair_scale();
    load_scale();
    json_decref(doc);
    return 0;
}
