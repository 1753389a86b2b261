/* plan_check.c — a plan's claims against its replicas (issue 26 item 5): what `medley plan`
 * prints and the daemon publishes says per model how many tokens/s it serves and whether the
 * deadline is met, and in its totals what it costs. Each of those is re-derived here from
 * the replicas themselves (their candidates' per-class throughput, routing shares, load and
 * price), so that no plan claims work that no replica does. */
#include <math.h>
#include <stdlib.h>

#include "scheduler/sched.h"

double sched_replica_tokens_per_s(const sched_replica *r, const sched_cand *c, int nclasses) {
    double t = 0;
    for (int k = 0; k < nclasses; k++)
        if (c->serves[k])
            t += r->share[k] * c->perf[k].tokens_per_s;
    return t * r->load;
}

/* a and b agree to a part in 1e6 (absolute 1e-6 near zero) */
static int same(double a, double b) {
    return fabs(a - b) <= 1e-6 * fmax(1.0, fmax(fabs(a), fabs(b)));
}

int sched_plan_check_claims(const sched_plan *p, const sched_workload *w, const sched_cands *cs,
                            md_err *e) {
    double *sum = calloc((size_t)w->n + 1, sizeof *sum);
    if (!sum)
        return md_errf(e, MD_ENOMEM, "out of memory");
    double usd = 0, busy_usd = 0, tps = 0;
    int rc = 0;
    for (int i = 0; i < p->n && !rc; i++) {
        const sched_replica *r = &p->r[i];
        if (r->cand < 0 || r->cand >= cs->n) {
            rc = md_errf(e, MD_EINVAL, "replica r%d names candidate %d of %d", i, r->cand, cs->n);
            break;
        }
        const sched_cand *c = &cs->c[r->cand];
        const sched_demand *d = &w->models[c->model];
        double shares = 0;
        for (int k = 0; k < SCHED_MAX_CLASSES && !rc; k++) {
            if (!(r->share[k] >= 0 && r->share[k] <= 1 + 1e-9))
                rc = md_errf(e, MD_EINVAL, "replica r%d: routing share %g of class %d", i,
                             r->share[k], k);
            else if (r->share[k] > 1e-9 && (k >= d->nclasses || !c->serves[k]))
                rc = md_errf(e, MD_EINVAL,
                             "replica r%d (%s) is routed class %d, which it cannot hold", i,
                             c->label, k);
            shares += r->share[k];
        }
        if (!rc && (shares > 1 + 1e-6 || !(r->load >= 0 && r->load <= 1 + 1e-9) ||
                    !(r->busy >= 0 && r->busy <= 1 + 1e-9) || r->load > r->busy + 1e-9))
            rc = md_errf(e, MD_EINVAL,
                         "replica r%d: shares sum to %g, load %g, busy %g (each in [0, 1], load "
                         "<= busy)",
                         i, shares, r->load, r->busy);
        double t = sched_replica_tokens_per_s(r, c, d->nclasses);
        if (!rc && !(isfinite(t) && t >= 0))
            rc = md_errf(e, MD_EINVAL, "replica r%d: predicted %g tokens/s", i, t);
        sum[c->model] += t;
        usd += c->usd_per_hour;
        busy_usd += c->usd_per_hour * r->busy;
    }
    for (int m = 0; m < p->nmodels && m < w->n && !rc; m++) {
        const sched_model_result *x = &p->models[m];
        const char *name = w->models[m].model.name;
        if (!same(sum[m], x->served_tps))
            rc = md_errf(e, MD_EINVAL,
                         "%s: the plan claims %.6g tokens/s served but its replicas give %.6g",
                         name, x->served_tps, sum[m]);
        else if (x->deadline_met && x->demand_tps > 0 && x->served_tps < x->demand_tps * (1 - 1e-6))
            rc = md_errf(e, MD_EINVAL,
                         "%s: the plan claims its deadline met with %.6g of the %.6g tokens/s it "
                         "needs",
                         name, x->served_tps, x->demand_tps);
        else if (!x->deadline_met && x->demand_tps > 0 && x->served_tps >= x->demand_tps)
            rc = md_errf(e, MD_EINVAL,
                         "%s: the plan claims its deadline missed at %.6g of %.6g "
                         "tokens/s",
                         name, x->served_tps, x->demand_tps);
        tps += x->served_tps;
    }
    if (!rc && !same(tps, p->tokens_per_s))
        rc =
            md_errf(e, MD_EINVAL, "the plan claims %.6g tokens/s in all; its models add up to %.6g",
                    p->tokens_per_s, tps);
    if (!rc && (!same(usd, p->usd_per_hour) || !same(busy_usd, p->busy_usd_per_hour)))
        rc = md_errf(e, MD_EINVAL,
                     "the plan claims $%.6g/h ($%.6g/h while working); its replicas cost $%.6g/h "
                     "($%.6g/h)",
                     p->usd_per_hour, p->busy_usd_per_hour, usd, busy_usd);
    free(sum);
    return rc;
}
