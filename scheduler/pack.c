/* pack.c — replicas onto GPUs: the integer replica counts of a plan packed into the fleet's
 * hosts (groups of tp GPUs inside one host, first fit, largest groups first), and the
 * proportional baseline plan (every GPU on, each model's share in proportion to its demand;
 * bench/scheduler compares the MILP against it). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "scheduler/pack.h"
#include "scheduler/sched.h"

/* Assign GPU ids to n replicas of candidate c: groups of tp inside one host, first fit over
 * the hosts in their order (name order in a merged pool), so the ids are the same on every
 * run. */
#define ALLOC_TP_MAX 64
typedef struct alloc {
    int *used; /* per pool: count entries, 1 = taken */
    int *base; /* offset of each pool in used */
    /* per pool and group size: hosts before it have no free group of that size (GPUs are
     * only taken, so it only moves forward) */
    int (*from)[ALLOC_TP_MAX + 1];
} alloc;

static int take_group(alloc *A, const sched_pool *p, int pool, int tp, char (*ids)[SCHED_ID]) {
    int *u = A->used + A->base[pool];
    int *from = tp <= ALLOC_TP_MAX ? &A->from[pool][tp] : NULL;
    for (int h = from ? *from : 0; h < sched_pool_nhosts(p); h++) {
        int lo, gpus = sched_pool_host(p, h, &lo);
        for (int s = lo; s + tp <= lo + gpus; s += tp) {
            int free_ = 1;
            for (int i = s; i < s + tp && free_; i++)
                free_ = !u[i];
            if (!free_)
                continue;
            for (int i = 0; i < tp; i++) {
                u[s + i] = 1;
                sched_pool_gpu_id(p, s + i, ids[i]);
            }
            if (from)
                *from = h;
            return 0;
        }
    }
    if (from)
        *from = sched_pool_nhosts(p);
    return -1;
}

typedef struct order_item {
    int cand, maxtp;
} order_item;

/* Largest groups first (they need whole hosts), then in candidate order. */
static int cmp_order(const void *a, const void *b) {
    const order_item *x = a, *y = b;
    return x->maxtp != y->maxtp ? y->maxtp - x->maxtp : x->cand - y->cand;
}

/* Instantiate counts[c] replicas of each candidate with shares y[c][k] (replica-
 * equivalents); GPUs not taken become idle. */
int sched_materialise(sched_plan *p, const sched_fleet *f, const sched_workload *w,
                      const sched_cands *cs, const double *counts, double (*y)[SCHED_MAX_CLASSES],
                      md_err *e) {
    int total = 0;
    for (int c = 0; c < cs->n; c++)
        total += (int)llround(counts[c]);
    alloc A = {0};
    A.base = calloc((size_t)f->n + 1, sizeof *A.base);
    A.from = calloc((size_t)f->n + 1, sizeof *A.from);
    for (int i = 0; A.base && i < f->n; i++)
        A.base[i + 1] = A.base[i] + f->pools[i].count;
    A.used = A.base ? calloc((size_t)A.base[f->n] + 1, sizeof *A.used) : NULL;
    p->r = calloc((size_t)total + 1, sizeof *p->r);
    order_item *ord = calloc((size_t)cs->n + 1, sizeof *ord);
    if (!A.base || !A.from || !A.used || !p->r || !ord) {
        free(A.base);
        free(A.from);
        free(A.used);
        free(ord);
        return md_errf(e, MD_ENOMEM, "out of memory placing %d replicas", total);
    }
    for (int c = 0; c < cs->n; c++) {
        ord[c].cand = c;
        for (int s = 0; s < cs->c[c].nstages; s++)
            if (cs->c[c].stages[s].tp > ord[c].maxtp)
                ord[c].maxtp = cs->c[c].stages[s].tp;
    }
    qsort(ord, (size_t)cs->n, sizeof *ord, cmp_order);
    int rc = 0;
    for (int oi = 0; oi < cs->n && !rc; oi++) {
        int c = ord[oi].cand;
        int n = (int)llround(counts[c]);
        const sched_cand *k = &cs->c[c];
        for (int i = 0; i < n; i++) {
            sched_replica *r = &p->r[p->n];
            r->cand = c;
            r->gpu_ids = calloc((size_t)k->gpus, sizeof *r->gpu_ids);
            if (!r->gpu_ids) {
                rc = md_errf(e, MD_ENOMEM, "out of memory");
                break;
            }
            int at = 0, ok = 1;
            for (int s = 0; s < k->nstages && ok; s++) {
                const sched_stage *st = &k->stages[s];
                ok = !take_group(&A, &f->pools[st->pool], st->pool, st->tp, r->gpu_ids + at);
                at += st->tp;
            }
            if (!ok) {
                /* Host fragmentation the MILP's packing rows did not rule out: skip it. */
                free(r->gpu_ids);
                r->gpu_ids = NULL;
                json_array_append_new(p->notes,
                                      json_sprintf("a replica of %s (%s) could not be packed "
                                                   "into hosts and was dropped",
                                                   w->models[k->model].model.name, k->label));
                continue;
            }
            double tot = 0;
            for (int j = 0; j < SCHED_MAX_CLASSES; j++)
                tot += y[c][j];
            for (int j = 0; j < SCHED_MAX_CLASSES; j++)
                r->share[j] = tot > 0 ? y[c][j] / tot : 0;
            r->load = fmin(1, tot / n);
            r->busy = w->models[k->model].rate_rps > 0 || w->bill_to_finish ? 1 : r->load;
            p->n++;
        }
    }
    /* Rented types have no idle GPUs: what is not rented does not exist. */
    int nidle = 0;
    for (int i = 0; i < A.base[f->n] && !f->rent; i++)
        nidle += !A.used[i];
    if (!rc && nidle && !(p->idle = calloc((size_t)nidle, sizeof *p->idle)))
        rc = md_errf(e, MD_ENOMEM, "out of memory listing %d idle GPUs", nidle);
    for (int q = 0; q < f->n && !rc && nidle; q++)
        for (int i = 0; i < f->pools[q].count; i++)
            if (!A.used[A.base[q] + i])
                sched_pool_gpu_id(&f->pools[q], i, p->idle[p->nidle++]);
    free(A.base);
    free(A.from);
    free(A.used);
    free(ord);
    return rc;
}

int sched_plan_proportional(sched_plan *p, const sched_workload *w, const sched_fleet *f,
                            const sched_catalog *cat, const sched_cands *cs, md_err *e) {
    memset(p, 0, sizeof *p);
    p->notes = cs->notes ? json_deep_copy(cs->notes) : json_array();
    p->nmodels = w->n;
    p->ncands = cs->n;
    p->models = calloc((size_t)w->n + 1, sizeof *p->models);
    double *counts = calloc((size_t)cs->n + 1, sizeof *counts);
    double(*y)[SCHED_MAX_CLASSES] = calloc((size_t)cs->n + 1, sizeof *y);
    double *weight = calloc((size_t)w->n + 1, sizeof *weight);
    if (!p->models || !counts || !y || !weight) {
        free(counts);
        free(y);
        free(weight);
        sched_plan_free(p);
        return md_errf(e, MD_ENOMEM, "out of memory");
    }
    double wsum = 0;
    for (int m = 0; m < w->n; m++) {
        const sched_demand *d = &w->models[m];
        weight[m] = (d->requests + d->rate_rps * w->horizon_s) * sched_demand_tokens_per_request(d);
        wsum += weight[m];
        p->models[m].demand_tps = sched_demand_tokens_per_s(d);
    }
    /* Per pool: each model that has a single-type candidate there gets GPUs in proportion to
     * its demand, as replicas of its smallest such candidate; requests go to any replica
     * that can hold them, in the model's class mix. */
    for (int q = 0; q < f->n; q++) {
        int best[1024];
        double ws = 0;
        for (int m = 0; m < w->n && m < 1024; m++) {
            best[m] = -1;
            for (int c = 0; c < cs->n; c++)
                if (cs->c[c].model == m && cs->c[c].nstages == 1 && cs->c[c].stages[0].pool == q &&
                    (best[m] < 0 || cs->c[c].gpus < cs->c[best[m]].gpus))
                    best[m] = c;
            if (best[m] >= 0)
                ws += weight[m];
        }
        int left = f->pools[q].count;
        for (int m = 0; m < w->n && m < 1024 && ws > 0; m++) {
            if (best[m] < 0)
                continue;
            int g = (int)floor(f->pools[q].count * weight[m] / ws);
            int n = g / cs->c[best[m]].gpus;
            if (n * cs->c[best[m]].gpus > left)
                n = left / cs->c[best[m]].gpus;
            counts[best[m]] += n;
            left -= n * cs->c[best[m]].gpus;
        }
        /* Remainders to whoever fits, in order. */
        for (int m = 0; m < w->n && m < 1024 && ws > 0; m++)
            while (best[m] >= 0 && left >= cs->c[best[m]].gpus) {
                counts[best[m]] += 1;
                left -= cs->c[best[m]].gpus;
                if (w->n > 1)
                    break;
            }
    }
    for (int c = 0; c < cs->n; c++) {
        const sched_demand *d = &w->models[cs->c[c].model];
        for (int k = 0; k < d->nclasses; k++)
            if (cs->c[c].serves[k])
                y[c][k] = d->classes[k].share * counts[c]; /* every replica always on */
    }
    (void)cat;
    int rc = sched_materialise(p, f, w, cs, counts, y, e);
    for (int i = 0; i < p->n; i++) {
        const sched_cand *c = &cs->c[p->r[i].cand];
        double t = sched_replica_tokens_per_s(&p->r[i], c, w->models[c->model].nclasses);
        p->models[c->model].served_tps += t;
        p->tokens_per_s += t;
        p->usd_per_hour += cs->c[p->r[i].cand].usd_per_hour;
        p->busy_usd_per_hour += cs->c[p->r[i].cand].usd_per_hour * p->r[i].busy;
    }
    for (int m = 0; m < w->n; m++)
        p->models[m].deadline_met = p->models[m].demand_tps <= 0 ||
                                    p->models[m].served_tps >= p->models[m].demand_tps * (1 - 1e-6);
    free(counts);
    free(y);
    free(weight);
    if (rc)
        sched_plan_free(p);
    return rc;
}
