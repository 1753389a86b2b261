/* milp.c — placement on GLPK (docs/scheduler.md §4). Integer replicas n_c per candidate,
 * continuous y_ck (replica-equivalents of c spent on request class k), X_m (requests/s
 * served of model m, in its class mix):
 *
 *   sum_k y_ck <= n_c                      a replica's time is shared among its classes
 *   sum_c rps_ck y_ck >= share_mk X_m      each class served in the model's mix
 *   sum_c gpus_cp n_c <= count_p           GPUs per pool (and per TP size, host packing)
 *
 * (a) fixed fleet: first the most demand-capped throughput (floors F_m), then Dinkelbach
 *     iterations on max T - q C, T = sum prio_m tok_m X_m, C = sum usd_c n_c, which end at
 *     the largest T / C (tokens per dollar) that keeps the floors.
 * (b) rent: X_m >= demand_m, minimise sum usd_c n_c dur_m (each model's GPUs rented until
 *     its deadline, or for the horizon when it only has an arrival rate). */
#include <glpk.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "scheduler/pack.h"
#include "scheduler/sched.h"

void sched_opts_defaults(sched_opts *o) {
    o->only_type = -1;
    o->iterations = 12;
    o->time_limit_s = 10;
    o->node_limit = 1000;
}

typedef struct lp {
    glp_prob *P;
    int *col_n; /* per candidate: column of n_c (0 when excluded) */
    int (*col_y)[SCHED_MAX_CLASSES];
    int *col_x; /* per model */
    int *ia, *ja;
    double *ar;
    int nz, cap;
    double *x;     /* per column (1-based): the integer solution in force (zeros before one) */
    int limited;   /* a solve stopped at its node or time limit: feasible, maybe not optimal */
    int clock;     /* ... at its time limit (the plan may then differ between runs) */
    int unsure;    /* the last failed solve stopped at a limit: no solution is not proven */
    int col_lam;   /* phase 1's common fraction lambda of every demand (0 before phase1_fair) */
    double *dem;   /* per model: demand in requests/s, for lambda (NULL before phase1_fair) */
    double lam_lp; /* lambda of the LP relaxation: no integer plan gives more */
    const sched_workload *w;
    const sched_cands *cs;
} lp;

static int nz_add(lp *L, int r, int c, double v) {
    if (L->nz + 1 >= L->cap) {
        int cap = L->cap ? L->cap * 2 : 1024;
        int *ia = realloc(L->ia, (size_t)cap * sizeof *ia);
        if (ia)
            L->ia = ia;
        int *ja = realloc(L->ja, (size_t)cap * sizeof *ja);
        if (ja)
            L->ja = ja;
        double *ar = realloc(L->ar, (size_t)cap * sizeof *ar);
        if (ar)
            L->ar = ar;
        if (!ia || !ja || !ar)
            return MD_ENOMEM;
        L->cap = cap;
    }
    L->nz++;
    L->ia[L->nz] = r;
    L->ja[L->nz] = c;
    L->ar[L->nz] = v;
    return 0;
}

static void lp_free(lp *L) {
    if (L->P)
        glp_delete_prob(L->P);
    free(L->col_n);
    free(L->col_y);
    free(L->col_x);
    free(L->ia);
    free(L->ja);
    free(L->ar);
    free(L->x);
    free(L->dem);
    memset(L, 0, sizeof *L);
}

static int cand_allowed(const sched_cand *c, const sched_opts *o) {
    if (o->only_type < 0)
        return 1;
    for (int s = 0; s < c->nstages; s++)
        if (c->stages[s].type != o->only_type)
            return 0;
    return 1;
}

/* Pool capacity for groups of at least t GPUs: whole groups of t in each host. */
static int pool_cap_for(const sched_pool *p, int t) {
    if (!p->hosts) {
        int full = p->count / p->gpus_per_host, rest = p->count % p->gpus_per_host;
        return full * (p->gpus_per_host / t * t) + rest / t * t;
    }
    int cap = 0;
    for (int h = 0; h < p->nhosts; h++)
        cap += p->hosts[h].gpus / t * t;
    return cap;
}

/* The whole problem (only_model < 0), or one model's part without the GPU rows: with the
 * GPUs left out the problem separates by model, and when the union of the per-model
 * optima fits the GPUs it is optimal for the whole (docs/scheduler.md §4). */
static int lp_build(lp *L, const sched_workload *w, const sched_fleet *f, const sched_cands *cs,
                    const sched_opts *o, int min_one_replica, int only_model) {
    memset(L, 0, sizeof *L);
    L->w = w;
    L->cs = cs;
    L->P = glp_create_prob();
    L->col_n = calloc((size_t)cs->n + 1, sizeof *L->col_n);
    L->col_y = calloc((size_t)cs->n + 1, sizeof *L->col_y);
    L->col_x = calloc((size_t)w->n + 1, sizeof *L->col_x);
    if (!L->col_n || !L->col_y || !L->col_x)
        return MD_ENOMEM;
    glp_prob *P = L->P;
    int col = 0;
    for (int m = 0; m < w->n; m++) {
        if (only_model >= 0 && m != only_model)
            continue;
        col = glp_add_cols(P, 1);
        L->col_x[m] = col;
        glp_set_col_bnds(P, col, GLP_LO, 0, 0);
    }
    for (int c = 0; c < cs->n; c++) {
        const sched_cand *k = &cs->c[c];
        if (!cand_allowed(k, o) || (only_model >= 0 && k->model != only_model))
            continue;
        /* At most the pool's GPUs over the replica's GPUs in it (a pipeline may have several
         * stages in one pool); the packing rows below bound it by hosts. */
        int ub = 1 << 30;
        for (int s = 0; s < k->nstages; s++) {
            int in_pool = 0;
            for (int s2 = 0; s2 < k->nstages; s2++)
                if (k->stages[s2].pool == k->stages[s].pool)
                    in_pool += k->stages[s2].tp;
            int per = f->pools[k->stages[s].pool].count / in_pool;
            if (per < ub)
                ub = per;
        }
        if (ub < 1)
            continue;
        col = glp_add_cols(P, 1);
        L->col_n[c] = col;
        glp_set_col_kind(P, col, GLP_IV);
        glp_set_col_bnds(P, col, GLP_DB, 0, ub);
        for (int j = 0; j < w->models[k->model].nclasses; j++)
            if (k->serves[j]) {
                col = glp_add_cols(P, 1);
                L->col_y[c][j] = col;
                glp_set_col_bnds(P, col, GLP_LO, 0, 0);
            }
    }
    /* sum_k y_ck - n_c <= 0 */
    for (int c = 0; c < cs->n; c++) {
        if (!L->col_n[c])
            continue;
        int r = glp_add_rows(P, 1);
        glp_set_row_bnds(P, r, GLP_UP, 0, 0);
        if (nz_add(L, r, L->col_n[c], -1))
            return MD_ENOMEM;
        for (int j = 0; j < SCHED_MAX_CLASSES; j++)
            if (L->col_y[c][j] && nz_add(L, r, L->col_y[c][j], 1))
                return MD_ENOMEM;
    }
    /* sum_c rps_ck y_ck - share_mk X_m >= 0 */
    for (int m = 0; m < w->n; m++)
        for (int j = 0; j < w->models[m].nclasses && L->col_x[m]; j++) {
            int r = glp_add_rows(P, 1);
            glp_set_row_bnds(P, r, GLP_LO, 0, 0);
            if (nz_add(L, r, L->col_x[m], -w->models[m].classes[j].share))
                return MD_ENOMEM;
            for (int c = 0; c < cs->n; c++)
                if (cs->c[c].model == m && L->col_y[c][j] &&
                    nz_add(L, r, L->col_y[c][j], cs->c[c].perf[j].requests_per_s))
                    return MD_ENOMEM;
        }
    /* GPUs per pool, and per pool for groups of >= t GPUs (host packing). */
    static const int sizes[] = {1, 2, 4, 8};
    for (int p = 0; p < f->n && only_model < 0; p++)
        for (int si = 0; si < 4; si++) {
            int t = sizes[si], any = 0;
            for (int c = 0; c < cs->n && !any; c++)
                for (int s = 0; L->col_n[c] && s < cs->c[c].nstages; s++)
                    any |= cs->c[c].stages[s].pool == p && cs->c[c].stages[s].tp >= t;
            if (!any || (t > 1 && f->rent))
                continue;
            int r = glp_add_rows(P, 1);
            glp_set_row_bnds(P, r, GLP_UP, 0,
                             t == 1 ? f->pools[p].count : pool_cap_for(&f->pools[p], t));
            for (int c = 0; c < cs->n; c++) {
                if (!L->col_n[c])
                    continue;
                int g = 0;
                for (int s = 0; s < cs->c[c].nstages; s++)
                    if (cs->c[c].stages[s].pool == p && cs->c[c].stages[s].tp >= t)
                        g += cs->c[c].stages[s].tp;
                if (g && nz_add(L, r, L->col_n[c], g))
                    return MD_ENOMEM;
            }
        }
    /* Every model gets a replica (fixed fleet, when asked). */
    if (min_one_replica)
        for (int m = 0; m < w->n; m++) {
            if (!L->col_x[m])
                continue;
            int r = 0;
            for (int c = 0; c < cs->n; c++)
                if (cs->c[c].model == m && L->col_n[c]) {
                    if (!r) {
                        r = glp_add_rows(P, 1);
                        glp_set_row_bnds(P, r, GLP_LO, 1, 0);
                    }
                    if (nz_add(L, r, L->col_n[c], 1))
                        return MD_ENOMEM;
                }
        }
    glp_load_matrix(P, L->nz, L->ia, L->ja, L->ar);
    L->x = calloc((size_t)glp_get_num_cols(P) + 1, sizeof *L->x);
    return L->x ? 0 : MD_ENOMEM;
}

/* The value of a column in the solution in force. */
static double lp_val(const lp *L, int col) {
    return L->x[col];
}

/* The objective at the solution in force. */
static double lp_obj(const lp *L) {
    double v = glp_get_obj_coef(L->P, 0);
    for (int j = 1; j <= glp_get_num_cols(L->P); j++)
        v += glp_get_obj_coef(L->P, j) * L->x[j];
    return v;
}

/* Does x meet every bound, integrality and row of P as it is now? Within GLPK's own
 * tolerances: its solutions are rounded to integers when they are taken. */
static int satisfies(glp_prob *P, const double *x) {
    int n = glp_get_num_cols(P), ok = 1;
    for (int j = 1; j <= n && ok; j++) {
        double v = x[j], lb = glp_get_col_lb(P, j), ub = glp_get_col_ub(P, j);
        int t = glp_get_col_type(P, j);
        if ((t == GLP_LO || t == GLP_DB || t == GLP_FX) && v < lb - 1e-7 * (1 + fabs(lb)))
            ok = 0;
        if ((t == GLP_UP || t == GLP_DB || t == GLP_FX) && v > ub + 1e-7 * (1 + fabs(ub)))
            ok = 0;
        if (glp_get_col_kind(P, j) == GLP_IV && v != floor(v))
            ok = 0;
    }
    int *ind = malloc(((size_t)n + 1) * sizeof *ind);
    double *val = malloc(((size_t)n + 1) * sizeof *val);
    ok = ok && ind && val;
    for (int r = 1; r <= glp_get_num_rows(P) && ok; r++) {
        int nz = glp_get_mat_row(P, r, ind, val), t = glp_get_row_type(P, r);
        double a = 0, mag = 1, lb = glp_get_row_lb(P, r), ub = glp_get_row_ub(P, r);
        for (int k = 1; k <= nz; k++) {
            a += val[k] * x[ind[k]];
            mag += fabs(val[k] * x[ind[k]]);
        }
        if ((t == GLP_LO || t == GLP_DB || t == GLP_FX) && a < lb - 1e-6 * mag)
            ok = 0;
        if ((t == GLP_UP || t == GLP_DB || t == GLP_FX) && a > ub + 1e-6 * mag)
            ok = 0;
    }
    free(ind);
    free(val);
    return ok;
}

/* The LP solution of P rounded to integer replicas in x, up (up = 1: the work and X stay, the
 * GPU rows may break) or down: the GPU rows only have positive terms, so they still hold,
 * class work is scaled into the replicas left and each model's X cut to what that work
 * serves (X's floor and the one-replica rows may break). The caller checks. */
static void round_lp(const lp *L, glp_prob *P, int up, double *x) {
    const sched_cands *cs = L->cs;
    const sched_workload *w = L->w;
    for (int j = 1; j <= glp_get_num_cols(P); j++)
        x[j] = glp_get_col_prim(P, j);
    for (int c = 0; c < cs->n; c++) {
        if (!L->col_n[c])
            continue;
        double n = up ? ceil(x[L->col_n[c]] - 1e-6) : floor(x[L->col_n[c]] + 1e-6), y = 0;
        x[L->col_n[c]] = n;
        for (int k = 0; k < SCHED_MAX_CLASSES; k++)
            if (L->col_y[c][k])
                y += x[L->col_y[c][k]] = fmax(0, x[L->col_y[c][k]]);
        for (int k = 0; k < SCHED_MAX_CLASSES && y > n; k++)
            if (L->col_y[c][k])
                x[L->col_y[c][k]] *= n / y;
    }
    for (int m = 0; m < w->n && !up; m++) {
        if (!L->col_x[m])
            continue;
        double X = x[L->col_x[m]];
        for (int k = 0; k < w->models[m].nclasses; k++) {
            double served = 0;
            for (int c = 0; c < cs->n; c++)
                if (cs->c[c].model == m && L->col_y[c][k])
                    served += cs->c[c].perf[k].requests_per_s * x[L->col_y[c][k]];
            if (w->models[m].classes[k].share > 0)
                X = fmin(X, served / w->models[m].classes[k].share * (1 - 1e-12));
        }
        x[L->col_x[m]] = fmax(0, X);
    }
    if (L->col_lam && !up) {
        double lam = 1;
        for (int m = 0; m < w->n; m++)
            if (L->col_x[m] && L->dem[m] > 0)
                lam = fmin(lam, x[L->col_x[m]] / L->dem[m]);
        x[L->col_lam] = fmax(0, lam * (1 - 1e-12));
    }
}

/* What the branch-and-bound callback needs: the node limit, the solution in force to offer
 * as the first incumbent, and room for a rounded one. */
typedef struct search {
    const lp *L;
    int nodes;
    int offer; /* 1 until the solution in force has been offered */
    int stopped;
    double *x; /* per column: the rounded LP solution of the node */
} search;

/* At each node: offers the solution in force (first) and the node's LP solution rounded down
 * and up as incumbents (GLPK then prunes every branch that cannot beat them), and stops after a
 * number of nodes: a node count, unlike the clock, stops the search at the same place on
 * every run, so the plan is the same on every run. */
static void on_node(glp_tree *T, void *info) {
    search *s = info;
    if (glp_ios_reason(T) == GLP_IHEUR) {
        if (s->offer) {
            s->offer = 0;
            glp_ios_heur_sol(T, s->L->x);
        }
        glp_prob *P = glp_ios_get_prob(T);
        for (int up = 0; up < 2 && s->x && glp_get_status(P) == GLP_OPT; up++) {
            round_lp(s->L, P, up, s->x);
            if (satisfies(P, s->x))
                glp_ios_heur_sol(T, s->x);
        }
    }
    int nodes = 0;
    glp_ios_tree_size(T, NULL, NULL, &nodes);
    if (nodes > s->nodes && !s->stopped) {
        s->stopped = 1;
        glp_ios_terminate(T);
    }
}

/* Solve the MILP as it stands; 0 when an integer solution is in force (L->x). The solution in
 * force, when it still meets the problem, is the search's first incumbent: every solve after
 * the first of a problem only changes its objective or tightens what that solution meets
 * (docs/scheduler.md §4), so a search stopped at its limit is never a false "no solution",
 * and never worse than what it started from. GLPK's MIP presolver would renumber the columns
 * under the callback, so the LP relaxation is solved first and the presolver is off. */
static int lp_solve(lp *L, const sched_opts *o) {
    int keep = satisfies(L->P, L->x);
    search s = {L, o->node_limit > 0 ? o->node_limit : INT_MAX, keep, 0,
                malloc(((size_t)glp_get_num_cols(L->P) + 1) * sizeof(double))};
    glp_smcp sp;
    glp_init_smcp(&sp);
    sp.msg_lev = GLP_MSG_OFF;
    sp.tm_lim = (int)(o->time_limit_s * 1000);
    glp_iocp parm;
    glp_init_iocp(&parm);
    parm.presolve = GLP_OFF;
    parm.msg_lev = GLP_MSG_OFF;
    parm.tm_lim = (int)(o->time_limit_s * 1000);
    parm.mip_gap = 1e-7;
    parm.mir_cuts = GLP_ON;
    parm.cb_func = on_node;
    parm.cb_info = &s;
    int rc = glp_simplex(L->P, &sp);
    if (!rc && glp_get_status(L->P) == GLP_OPT)
        rc = glp_intopt(L->P, &parm);
    else if (!rc)
        rc = GLP_ENOPFS; /* the relaxation has no optimum: nor has the MILP */
    free(s.x);
    int stopped = rc == GLP_ETMLIM || rc == GLP_ESTOP;
    int st = glp_mip_status(L->P);
    int found = (rc == 0 || stopped) && (st == GLP_OPT || st == GLP_FEAS);
    if (found && keep) {
        /* GLPK's best is the one offered unless it found a better one: take it only then. */
        double was = lp_obj(L), now = glp_mip_obj_val(L->P);
        found = glp_get_obj_dir(L->P) == GLP_MAX ? now > was : now < was;
    }
    if (found)
        for (int j = 1; j <= glp_get_num_cols(L->P); j++)
            L->x[j] = glp_get_col_kind(L->P, j) == GLP_IV ? floor(glp_mip_col_val(L->P, j) + 0.5)
                                                          : glp_mip_col_val(L->P, j);
    L->limited |= stopped;
    L->clock |= rc == GLP_ETMLIM;
    L->unsure = stopped && !found && !keep;
    return found || keep ? 0 : -1;
}

static double model_tok(const sched_workload *w, int m) {
    return sched_demand_tokens_per_request(&w->models[m]);
}

/* Cost of a candidate's replicas. Serving (a model with an arrival rate): replicas are on
 * all the time, cost usd x n. Batch (a backlog): a replica is switched off when its work is
 * done, so it costs usd x its busy replica-time sum_k y_ck, plus eps x usd x n so that
 * replicas with no work are not placed (docs/scheduler.md §4). */
#define BUSY_EPS 1e-6

static int provisioned(const sched_workload *w, const sched_cand *c) {
    return w->models[c->model].rate_rps > 0 || w->bill_to_finish;
}

static double cost_n(const sched_workload *w, const sched_cand *c) {
    return provisioned(w, c) ? c->usd_per_hour : BUSY_EPS * c->usd_per_hour;
}

static double cost_y(const sched_workload *w, const sched_cand *c) {
    return provisioned(w, c) ? 0 : c->usd_per_hour;
}

/* Objective coefficients: phase 1 the demand-capped throughput; else T - q C scaled by
 * `scale` on the cost side (q = 0 and scale = -1: least cost, used for renting). */
static void set_objective(lp *L, const sched_workload *w, const sched_cands *cs, double q,
                          int phase1) {
    for (int m = 0; m < w->n; m++) {
        const sched_demand *d = &w->models[m];
        double coef = d->priority * model_tok(w, m);
        if (!L->col_x[m])
            continue;
        if (phase1 && sched_demand_tokens_per_s(d) <= 0)
            coef = 0;
        glp_set_obj_coef(L->P, L->col_x[m], coef);
    }
    for (int c = 0; c < cs->n; c++) {
        if (!L->col_n[c])
            continue;
        glp_set_obj_coef(L->P, L->col_n[c], phase1 ? 0 : -q * cost_n(w, &cs->c[c]));
        for (int j = 0; j < SCHED_MAX_CLASSES; j++)
            if (L->col_y[c][j])
                glp_set_obj_coef(L->P, L->col_y[c][j], phase1 ? 0 : -q * cost_y(w, &cs->c[c]));
    }
}

static double cand_cost(const lp *L, const sched_workload *w, const sched_cand *k, int c) {
    double v = cost_n(w, k) * lp_val(L, L->col_n[c]);
    for (int j = 0; j < SCHED_MAX_CLASSES; j++)
        if (L->col_y[c][j])
            v += cost_y(w, k) * lp_val(L, L->col_y[c][j]);
    return v;
}

static void totals(const lp *L, const sched_workload *w, const sched_cands *cs, double *T,
                   double *C) {
    *T = 0;
    *C = 0;
    for (int m = 0; m < w->n; m++)
        if (L->col_x[m])
            *T += w->models[m].priority * model_tok(w, m) * lp_val(L, L->col_x[m]);
    for (int c = 0; c < cs->n; c++)
        if (L->col_n[c])
            *C += cand_cost(L, w, &cs->c[c], c);
}

/* Explain why a model has no candidate: its weights against the largest group. */
static void note_too_large(sched_plan *p, const sched_demand *d, const sched_fleet *f,
                           const sched_catalog *cat, const sched_perf_params *pp) {
    double wgb = sched_model_params(&d->model) * d->model.bytes_per_weight / 1e9;
    double best = 0;
    const char *bn = "";
    int bg = 0;
    for (int i = 0; i < f->n; i++) {
        int g = f->pools[i].count < f->pools[i].gpus_per_host ? f->pools[i].count
                                                              : f->pools[i].gpus_per_host;
        if (g > 8)
            g = 8;
        double mem = g * (f->pools[i].memory_gb * pp->mem_util - pp->reserve_gb);
        if (mem > best) {
            best = mem;
            bn = cat->gpus[f->pools[i].type].name;
            bg = g;
        }
    }
    double maxt = 0;
    for (int k = 0; k < d->nclasses; k++)
        if (d->classes[k].max_tokens > maxt)
            maxt = d->classes[k].max_tokens;
    json_array_append_new(
        p->notes,
        json_sprintf("%s cannot be placed: it needs %.1f GB of weights plus KV for %.0f tokens "
                     "(%.2f GB); the largest group in this fleet is %dx%s with %.1f GB usable "
                     "(and no pipeline of up to %d stages holds it)",
                     d->model.name, wgb, maxt,
                     maxt * d->model.layers * sched_model_kv_bytes_per_token_layer(&d->model) / 1e9,
                     bg, bn, best, SCHED_MAX_STAGES));
}

/* Does the union of the solutions in ls fit the fleet's GPUs (per pool, and per TP size
 * for host packing)? */
static int fits_gpus(lp **ls, int nl, const sched_fleet *f, const sched_cands *cs) {
    static const int sizes[] = {1, 2, 4, 8};
    for (int p = 0; p < f->n; p++)
        for (int si = 0; si < (f->rent ? 1 : 4); si++) {
            int t = sizes[si];
            double used = 0;
            for (int i = 0; i < nl; i++)
                for (int c = 0; c < cs->n; c++) {
                    if (!ls[i]->col_n[c])
                        continue;
                    double n = floor(lp_val(ls[i], ls[i]->col_n[c]) + 0.5);
                    for (int s = 0; s < cs->c[c].nstages; s++)
                        if (cs->c[c].stages[s].pool == p && cs->c[c].stages[s].tp >= t)
                            used += n * cs->c[c].stages[s].tp;
                }
            int cap = t == 1 ? f->pools[p].count : pool_cap_for(&f->pools[p], t);
            if (used > cap + 1e-9)
                return 0;
        }
    return 1;
}

/* Phase 2 over one or several (per-model) problems: (b) least rental cost; (a) Dinkelbach
 * on T / C: solve max T - qC, set q = T / C, until T - qC is 0. The problems share q, so
 * per-model parts add up to the whole. Returns 0, or -1 when a part has no solution. */
static int phase2(lp **ls, int nl, const sched_workload *w, const sched_fleet *f,
                  const sched_cands *cs, const sched_opts *o, const double *lo, const double *hi) {
    for (int i = 0; i < nl; i++)
        for (int m = 0; m < w->n; m++)
            if (ls[i]->col_x[m]) {
                if (hi[m] <= 0)
                    glp_set_col_bnds(ls[i]->P, ls[i]->col_x[m], GLP_FX, 0, 0);
                else if (isfinite(hi[m]))
                    glp_set_col_bnds(ls[i]->P, ls[i]->col_x[m], GLP_DB, fmin(lo[m], hi[m]), hi[m]);
                else
                    glp_set_col_bnds(ls[i]->P, ls[i]->col_x[m], GLP_LO, lo[m], 0);
            }
    if (f->rent) {
        for (int i = 0; i < nl; i++) {
            glp_set_obj_dir(ls[i]->P, GLP_MIN);
            for (int m = 0; m < w->n; m++)
                if (ls[i]->col_x[m])
                    glp_set_obj_coef(ls[i]->P, ls[i]->col_x[m], 0);
            for (int c = 0; c < cs->n; c++)
                if (ls[i]->col_n[c]) {
                    const sched_demand *d = &w->models[cs->c[c].model];
                    double dur = d->finish_s / 3600;
                    glp_set_obj_coef(ls[i]->P, ls[i]->col_n[c], cost_n(w, &cs->c[c]) * dur);
                    for (int j = 0; j < SCHED_MAX_CLASSES; j++)
                        if (ls[i]->col_y[c][j])
                            glp_set_obj_coef(ls[i]->P, ls[i]->col_y[c][j],
                                             cost_y(w, &cs->c[c]) * dur);
                }
            if (lp_solve(ls[i], o))
                return -1;
        }
        return 0;
    }
    double q = 0;
    for (int it = 0; it <= o->iterations; it++) {
        double T = 0, C = 0, obj = 0;
        for (int i = 0; i < nl; i++) {
            glp_set_obj_dir(ls[i]->P, GLP_MAX);
            set_objective(ls[i], w, cs, q, 0);
            if (lp_solve(ls[i], o))
                return -1;
            double Ti, Ci;
            totals(ls[i], w, cs, &Ti, &Ci);
            T += Ti;
            C += Ci;
            obj += lp_obj(ls[i]);
        }
        if (C <= 0)
            return 0; /* free GPUs: nothing to trade against, throughput is maximal */
        double nq = T / C;
        if (obj <= 1e-9 * (T + 1) || fabs(nq - q) <= 1e-12 * nq || it == o->iterations)
            break;
        q = nq;
    }
    /* Ties in T / C (n replicas of the best candidate are as good as one) go to the most
     * throughput: keep each part's T - qC at its optimum and maximise T. */
    for (int i = 0; i < nl; i++) {
        lp *L = ls[i];
        double v = lp_obj(L);
        int r = glp_add_rows(L->P, 1);
        int nz = 0;
        size_t cap = (size_t)cs->n * (SCHED_MAX_CLASSES + 1) + (size_t)w->n + 2;
        int *ia = calloc(cap, sizeof *ia);
        double *ar = calloc(cap, sizeof *ar);
        if (!ia || !ar) {
            free(ia);
            free(ar);
            return 0;
        }
        for (int m = 0; m < w->n; m++)
            if (L->col_x[m])
                ia[++nz] = L->col_x[m], ar[nz] = w->models[m].priority * model_tok(w, m);
        for (int c = 0; c < cs->n; c++) {
            if (!L->col_n[c])
                continue;
            ia[++nz] = L->col_n[c], ar[nz] = -q * cost_n(w, &cs->c[c]);
            for (int j = 0; j < SCHED_MAX_CLASSES; j++)
                if (L->col_y[c][j] && cost_y(w, &cs->c[c]) > 0)
                    ia[++nz] = L->col_y[c][j], ar[nz] = -q * cost_y(w, &cs->c[c]);
        }
        glp_set_mat_row(L->P, r, nz, ia, ar);
        free(ia);
        free(ar);
        glp_set_row_bnds(L->P, r, GLP_LO, v - 1e-9 * (fabs(v) + 1), 0);
        set_objective(L, w, cs, 0, 0);
        if (lp_solve(L, o)) {
            /* Numerically infeasible: drop the tie-break and restore the optimum. */
            int rows[2] = {0, r};
            glp_del_rows(L->P, 1, rows);
            set_objective(L, w, cs, q, 0);
            if (lp_solve(L, o))
                return -1;
        }
    }
    return 0;
}

/* Each model's demand (tokens/s) into p, and has[m] = 1 when some allowed candidate serves
 * model m; the others get a note saying why none fits. Returns how many models have one. */
static int find_placeable(sched_plan *p, const sched_workload *w, const sched_fleet *f,
                          const sched_catalog *cat, const sched_cands *cs, const sched_opts *o,
                          const sched_perf_params *pp, int *has) {
    int placeable = 0;
    for (int c = 0; c < cs->n; c++)
        if (cand_allowed(&cs->c[c], o))
            has[cs->c[c].model] = 1;
    for (int m = 0; m < w->n; m++) {
        p->models[m].demand_tps = sched_demand_tokens_per_s(&w->models[m]);
        if (!has[m])
            note_too_large(p, &w->models[m], f, cat, pp);
        placeable += has[m];
    }
    return placeable;
}

/* Phase 1's objective on L: the most demand we can serve (capped by each model's demand). */
static void phase1_objective(lp *L, const sched_plan *p, const sched_workload *w,
                             const sched_cands *cs) {
    for (int m = 0; m < w->n; m++) {
        double d = p->models[m].demand_tps / model_tok(w, m);
        if (d > 0)
            glp_set_col_bnds(L->P, L->col_x[m], GLP_DB, 0, d);
    }
    glp_set_obj_dir(L->P, GLP_MAX);
    set_objective(L, w, cs, 0, 1);
}

/* How many models with a demand X (per column, 1-based) leaves short of it. */
static int count_short(const lp *L, const sched_plan *p, const sched_workload *w, const double *x) {
    int n = 0;
    for (int m = 0; m < w->n; m++) {
        double d = p->models[m].demand_tps / model_tok(w, m);
        n += L->col_x[m] && d > 0 && x[L->col_x[m]] < d * (1 - 1e-6);
    }
    return n;
}

/* The LP relaxation of L as it stands (simplex only, integrality ignored): 0 when it has an
 * optimum, read with glp_get_col_prim. */
static int lp_relax(lp *L, const sched_opts *o) {
    glp_smcp sp;
    glp_init_smcp(&sp);
    sp.msg_lev = GLP_MSG_OFF;
    sp.tm_lim = (int)(o->time_limit_s * 1000);
    return glp_simplex(L->P, &sp) || glp_get_status(L->P) != GLP_OPT ? -1 : 0;
}

/* Models short of their demand in L's LP relaxation (phase 1's objective): no integer plan
 * serves them more, so two or more of them call for the fair phase before any branching. */
static int relaxed_short(lp *L, const sched_plan *p, const sched_workload *w, const sched_opts *o) {
    if (lp_relax(L, o))
        return 0;
    double *x = calloc((size_t)glp_get_num_cols(L->P) + 1, sizeof *x);
    if (!x)
        return 0;
    for (int j = 1; j <= glp_get_num_cols(L->P); j++)
        x[j] = glp_get_col_prim(L->P, j);
    int n = count_short(L, p, w, x);
    free(x);
    return n;
}

/* The LP relaxation's solution rounded down to whole replicas (round_lp: work scaled into
 * the replicas kept, X and lambda cut to what it serves) into x, or -1. At thousands of
 * GPUs, losing under one replica per candidate costs little, where a branch-and-bound search
 * that starts from a starving solution stops at its node limit near it (issue 39 item 10). */
static int relaxed_rounded(lp *L, const sched_opts *o, double *x) {
    if (lp_relax(L, o))
        return -1;
    round_lp(L, L->P, 0, x);
    return 0;
}

/* x becomes the solution in force when it meets L's problem as it is now and beats that
 * solution on L's objective. */
static void offer(lp *L, double *x) {
    int keep = satisfies(L->P, L->x);
    double was = lp_obj(L);
    double *old = L->x;
    L->x = x;
    double now = lp_obj(L);
    L->x = old;
    int better = glp_get_obj_dir(L->P) == GLP_MAX ? now > was : now < was;
    if (satisfies(L->P, x) && (!keep || better))
        memcpy(L->x, x, ((size_t)glp_get_num_cols(L->P) + 1) * sizeof *x);
}

/* Adds lambda to L: a column in [0, 1] with X_m >= lambda D_m for every model with a demand;
 * the solution in force grows by it, at the common fraction it already gives. 0 or -1. */
static int add_lambda(lp *L, const sched_plan *p, const sched_workload *w) {
    int lam = glp_add_cols(L->P, 1);
    glp_set_col_bnds(L->P, lam, GLP_DB, 0, 1);
    double *x = realloc(L->x, ((size_t)lam + 1) * sizeof *x);
    if (x)
        L->x = x;
    L->dem = calloc((size_t)w->n + 1, sizeof *L->dem);
    if (!x || !L->dem)
        return -1;
    L->col_lam = lam;
    x[lam] = 1;
    for (int m = 0; m < w->n; m++) {
        L->dem[m] = p->models[m].demand_tps / model_tok(w, m);
        if (L->col_x[m] && L->dem[m] > 0)
            x[lam] = fmin(x[lam], x[L->col_x[m]] / L->dem[m]);
    }
    x[lam] = fmax(0, x[lam]);
    for (int m = 0; m < w->n; m++) {
        if (!L->col_x[m] || L->dem[m] <= 0)
            continue;
        int r = glp_add_rows(L->P, 1), ind[3] = {0, L->col_x[m], lam};
        double val[3] = {0, 1, -L->dem[m]};
        glp_set_mat_row(L->P, r, 2, ind, val);
        glp_set_row_bnds(L->P, r, GLP_LO, 0, 0);
    }
    return 0;
}

/* When two or more models are short of their demand, the most total throughput can starve
 * some of them (their backlogs then set the makespan). Solve for the largest common fraction
 * lambda of every demand, X_m >= lambda D_m, then, with lambda kept, the most throughput
 * again: short models finish together and the rest goes by priority. Each MILP starts from
 * its LP relaxation rounded down (warm_from_relaxation), so that a search stopped at its node
 * limit is still near the fair answer; L->lam_lp keeps the relaxation's lambda (an upper
 * bound). 0, or -1 when a solve fails. */
static int phase1_fair(lp *L, const sched_plan *p, const sched_workload *w, const sched_cands *cs,
                       const sched_opts *o) {
    if (add_lambda(L, p, w))
        return -1;
    int lam = L->col_lam;
    for (int j = 1; j < lam; j++)
        glp_set_obj_coef(L->P, j, 0);
    glp_set_obj_coef(L->P, lam, 1);
    double *x = calloc((size_t)glp_get_num_cols(L->P) + 1, sizeof *x);
    if (!x)
        return -1;
    if (!lp_relax(L, o)) {
        /* the relaxation's most throughput at its lambda, rounded, as the warm start */
        L->lam_lp = glp_get_col_prim(L->P, lam);
        glp_set_col_bnds(L->P, lam, GLP_DB, fmin(1, L->lam_lp * (1 - 1e-9)), 1);
        set_objective(L, w, cs, 0, 1);
        glp_set_obj_coef(L->P, lam, 0);
        int ok = !relaxed_rounded(L, o, x);
        glp_set_col_bnds(L->P, lam, GLP_DB, 0, 1);
        for (int j = 1; j < lam; j++)
            glp_set_obj_coef(L->P, j, 0);
        glp_set_obj_coef(L->P, lam, 1);
        if (ok)
            offer(L, x);
    }
    free(x);
    if (lp_solve(L, o))
        return -1;
    double best = lp_val(L, lam);
    glp_set_col_bnds(L->P, lam, GLP_DB, fmin(1, best * (1 - 1e-9)), 1);
    set_objective(L, w, cs, 0, 1);
    glp_set_obj_coef(L->P, lam, 0);
    return lp_solve(L, o);
}

/* Phase 1 on L as built: the most demand served; when two or more models fall short (in the
 * LP relaxation, or in the MILP's answer), the fair phase. 0, or -1 with no solution. */
static int phase1_once(lp *L, sched_plan *p, const sched_workload *w, const sched_cands *cs,
                       const sched_opts *o) {
    phase1_objective(L, p, w, cs);
    int fair = relaxed_short(L, p, w, o) >= 2;
    if (!fair) {
        if (lp_solve(L, o))
            return -1;
        fair = count_short(L, p, w, L->x) >= 2;
    }
    return fair ? phase1_fair(L, p, w, cs, o) : 0;
}

/* Phase 1 on L; when the fleet cannot hold a replica of every model (*min_one), again on L
 * rebuilt without that requirement, with a note. Returns 0, or nonzero with no solution. */
static int phase1(lp *L, sched_plan *p, const sched_workload *w, const sched_fleet *f,
                  const sched_cands *cs, const sched_opts *o, int *min_one) {
    if (!phase1_once(L, p, w, cs, o))
        return 0;
    if (!*min_one)
        return -1;
    /* Not enough GPUs for a replica of every model (or none found within the limits): drop
     * that requirement; without it, no replicas at all is a solution. */
    json_array_append_new(p->notes,
                          json_string(L->unsure ? "the MILP found no plan with one replica of "
                                                  "every model within its limits; some models "
                                                  "get none"
                                                : "the fleet cannot hold one replica of every "
                                                  "model at once; some models get none"));
    lp_free(L);
    *min_one = 0;
    if (lp_build(L, w, f, cs, o, 0, -1))
        return -1;
    return phase1_once(L, p, w, cs, o);
}

/* What phase 1 gave a model short of its demand, for its note: "the most this fleet gives"
 * only when the search proved it (no node or time limit stopped it); the fair phase's
 * common fraction, and its LP relaxation's bound when a limit cut the search (issue 39
 * item 10: a note said "the most this fleet gives is 715 tokens/s" for a 70B model on
 * 10,000 GPUs where the search had stopped near a starving solution). */
static void shortfall_words(char *out, size_t n, const lp *L, const sched_fleet *f, double tps,
                            double frac) {
    const char *what = f->rent ? "rental limit (max_per_type, max)" : "fleet";
    if (!L->limited && !L->col_lam)
        snprintf(out, n, "the most this %s gives is %.0f tokens/s", what, tps);
    else if (!L->limited)
        snprintf(out, n,
                 "the most this %s gives every model short of its demand alike is %.1f%% of it: "
                 "%.0f tokens/s",
                 what, 100 * frac, tps);
    else if (L->col_lam)
        snprintf(out, n,
                 "this plan gives %.0f tokens/s, %.1f%% of it (the search stopped at its %s "
                 "limit; the LP relaxation bounds the fraction every short model can get alike "
                 "at %.1f%%)",
                 tps, 100 * frac, L->clock ? "time" : "node", 100 * L->lam_lp);
    else
        snprintf(out, n,
                 "this plan gives %.0f tokens/s (the search stopped at its %s limit: the %s may "
                 "give more)",
                 tps, L->clock ? "time" : "node", what);
}

/* The most each placeable model gets (phase 1's X in L) into p, with a note for each whose
 * demand that does not meet. */
static void note_shortfalls(sched_plan *p, const lp *L, const sched_workload *w,
                            const sched_fleet *f, const int *has) {
    for (int m = 0; m < w->n; m++) {
        double x = lp_val(L, L->col_x[m]);
        p->models[m].best_tps = x * model_tok(w, m);
        double d = p->models[m].demand_tps;
        if (d > 0 && x * model_tok(w, m) < d * (1 - 1e-6) && has[m]) {
            const sched_demand *dm = &w->models[m];
            double need_s = dm->finish_s;
            char tail[96] = "";
            if (dm->requests > 0 && x > 0)
                snprintf(tail, sizeof tail, " (the backlog would take %.0f s)", dm->requests / x);
            char gives[320];
            shortfall_words(gives, sizeof gives, L, f, x * model_tok(w, m),
                            x / (d / model_tok(w, m)));
            json_array_append_new(
                p->notes,
                json_sprintf("%s: %s needs %.0f tokens/s (%.0f requests x %.0f "
                             "tokens in %.0f s%s); %s%s",
                             dm->model.name,
                             dm->deadline_s > 0 ? "the deadline"
                             : dm->requests > 0 ? "finishing within the horizon (no deadline "
                                                  "given)"
                                                : "the arrival rate",
                             d, dm->requests, model_tok(w, m), need_s,
                             dm->rate_rps > 0 ? " plus arrivals" : "", gives, tail));
        }
    }
}

/* Bounds on X for phase 2 into lo and hi: (b) at least the achievable part of the demand;
 * (a) the phase-1 floor for capped models, free for the others. */
static void phase2_bounds(sched_plan *p, const lp *L, const sched_workload *w, const sched_fleet *f,
                          double *lo, double *hi) {
    for (int m = 0; m < w->n; m++) {
        double x = lp_val(L, L->col_x[m]);
        double d = p->models[m].demand_tps / model_tok(w, m);
        lo[m] = 0;
        hi[m] = d > 0 ? d : INFINITY;
        if (d > 0)
            lo[m] = fmin(x, d) * (1 - 1e-9);
        if (f->rent && d <= 0) {
            json_array_append_new(p->notes,
                                  json_sprintf("%s has neither a deadline nor an arrival rate; "
                                               "renting needs one of them, so it gets no GPUs",
                                               w->models[m].model.name));
            hi[m] = 0;
        }
    }
}

/* The solutions in ls: replicas per candidate into counts, class shares into y, each model's
 * served tokens/s into p. */
static void read_solution(lp **ls, int nl, sched_plan *p, const sched_workload *w,
                          const sched_cands *cs, double *counts, double (*y)[SCHED_MAX_CLASSES]) {
    for (int i = 0; i < nl; i++) {
        lp *Li = ls[i];
        for (int c = 0; c < cs->n; c++) {
            if (!Li->col_n[c])
                continue;
            counts[c] = floor(lp_val(Li, Li->col_n[c]) + 0.5);
            for (int j = 0; j < SCHED_MAX_CLASSES; j++)
                if (Li->col_y[c][j])
                    y[c][j] = fmax(0, lp_val(Li, Li->col_y[c][j]));
        }
        for (int m = 0; m < w->n; m++)
            if (Li->col_x[m])
                p->models[m].served_tps = lp_val(Li, Li->col_x[m]) * model_tok(w, m);
    }
}

/* A serving model's replicas are on whether or not they have work, so the MILP is free to
 * give them more class time y than the model's requests need (y costs nothing there). Trim
 * each (model, class) to the requests/s the model is planned to serve, so that the
 * replicas' predicted tokens/s add up to the model's (issue 26 item 4). */
static void trim_to_served(const sched_plan *p, const sched_workload *w, const sched_cands *cs,
                           double (*y)[SCHED_MAX_CLASSES]) {
    for (int m = 0; m < w->n; m++) {
        const sched_demand *d = &w->models[m];
        double x = p->models[m].served_tps / model_tok(w, m); /* requests/s */
        for (int k = 0; k < d->nclasses; k++) {
            double routed = 0;
            for (int c = 0; c < cs->n; c++)
                if (cs->c[c].model == m && cs->c[c].serves[k])
                    routed += cs->c[c].perf[k].requests_per_s * y[c][k];
            double need = d->classes[k].share * x;
            if (!(routed > need))
                continue;
            for (int c = 0; c < cs->n; c++)
                if (cs->c[c].model == m)
                    y[c][k] *= need / routed;
        }
    }
}

/* Phase 1 over the whole MILP L (built here; lp_free it whatever the result): the most
 * each model can be served, then fairness between models. */
static int solve_phase1(lp *L, sched_plan *p, const sched_workload *w, const sched_fleet *f,
                        const sched_cands *cs, const sched_opts *o, int *min_one, md_err *e) {
    if (lp_build(L, w, f, cs, o, *min_one, -1))
        return md_errf(e, MD_ENOMEM, "out of memory building the MILP");
    if (phase1(L, p, w, f, cs, o, min_one))
        return md_errf(e, MD_ERANGE, "the placement MILP has no solution for this fleet");
    return 0;
}

/* Phase 2 by model (no GPU rows; sub[m] built here for each placeable model); if the union
 * does not fit the GPUs, the whole MILP L. The solved problems in ls[0..*nl). */
static int solve_phase2(lp *L, lp *sub, lp **ls, int *nl, const sched_workload *w,
                        const sched_fleet *f, const sched_cands *cs, const sched_opts *o,
                        const int *has, int min_one, const double *lo, const double *hi,
                        md_err *e) {
    *nl = 0;
    for (int m = 0; m < w->n; m++) {
        if (!has[m])
            continue;
        if (lp_build(&sub[m], w, f, cs, o, min_one, m))
            return md_errf(e, MD_ENOMEM, "out of memory building the MILP");
        ls[(*nl)++] = &sub[m];
    }
    int rc = phase2(ls, *nl, w, f, cs, o, lo, hi);
    if (rc == 0 && fits_gpus(ls, *nl, f, cs))
        return 0;
    ls[0] = L;
    *nl = 1;
    if (phase2(ls, *nl, w, f, cs, o, lo, hi))
        return md_errf(e, MD_ERANGE, "the placement MILP has no solution for this fleet");
    return 0;
}

/* A note when a solve stopped at its time or node limit. */
static void note_limits(sched_plan *p, const lp *L, lp *const *ls, int nl, const sched_opts *o) {
    int limited = L->limited, clock = L->clock;
    for (int i = 0; i < nl; i++) {
        limited |= ls[i]->limited;
        clock |= ls[i]->clock;
    }
    if (clock)
        json_array_append_new(p->notes,
                              json_sprintf("the MILP stopped at its time limit (%.0f s per solve): "
                                           "the plan is valid but may not be optimal, and another "
                                           "run may give another plan",
                                           o->time_limit_s));
    else if (limited)
        json_array_append_new(p->notes,
                              json_sprintf("the MILP stopped at its node limit (%d branch-and-"
                                           "bound nodes per solve): the plan is valid but may not "
                                           "be optimal",
                                           o->node_limit));
}

/* The plan's totals from its replicas: each model's served tokens/s and deadline, the
 * plan's tokens/s and its cost per hour (all and busy). */
static void plan_totals(sched_plan *p, const sched_workload *w, const sched_cands *cs) {
    /* A replica that could not be packed into hosts was dropped (with a note): its model
     * serves what its remaining replicas give. */
    for (int m = 0; m < w->n; m++) {
        double sum = 0;
        for (int i = 0; i < p->n; i++)
            if (cs->c[p->r[i].cand].model == m)
                sum += sched_replica_tokens_per_s(&p->r[i], &cs->c[p->r[i].cand],
                                                  w->models[m].nclasses);
        if (sum < p->models[m].served_tps * (1 - 1e-7))
            p->models[m].served_tps = sum;
        p->models[m].deadline_met = p->models[m].demand_tps <= 0 ||
                                    p->models[m].served_tps >= p->models[m].demand_tps * (1 - 1e-6);
        p->tokens_per_s += p->models[m].served_tps;
    }
    for (int i = 0; i < p->n; i++) {
        p->usd_per_hour += cs->c[p->r[i].cand].usd_per_hour;
        p->busy_usd_per_hour += cs->c[p->r[i].cand].usd_per_hour * p->r[i].busy;
    }
}

/* Say how batch replicas were costed (issue 39 item 13), when the workload has a backlog. */
static void note_billing(sched_plan *p, const sched_workload *w) {
    int batch = 0;
    for (int m = 0; m < w->n; m++)
        batch |= w->models[m].requests > 0 && w->models[m].rate_rps <= 0;
    if (!batch)
        return;
    json_array_append_new(
        p->notes, json_string(w->bill_to_finish
                                  ? "billing until_deadline: batch replicas are costed from the "
                                    "start until their model's deadline (else the horizon), "
                                    "busy or not; \"billing\": \"busy\" costs them while they work"
                                  : "billing busy: batch replicas are costed only while they work "
                                    "(switched off when their classes are drained); "
                                    "\"billing\": \"until_deadline\" (or --billing) costs them "
                                    "until the deadline"));
}

int sched_plan_solve(sched_plan *p, const sched_workload *w, const sched_fleet *f,
                     const sched_catalog *cat, const sched_cands *cs, const sched_opts *o,
                     md_err *e) {
    uint64_t t0 = md_mono_ns();
    memset(p, 0, sizeof *p);
    p->objective = f->rent ? 1 : 0;
    p->notes = cs->notes ? json_deep_copy(cs->notes) : json_array();
    p->ncands = cs->n;
    p->nmodels = w->n;
    p->models = calloc((size_t)w->n + 1, sizeof *p->models);
    if (!p->models)
        return md_errf(e, MD_ENOMEM, "out of memory");
    sched_perf_params pp;
    sched_perf_defaults(&pp);
    glp_term_out(GLP_OFF);
    int *has = calloc((size_t)w->n + 1, sizeof *has);
    int placeable = find_placeable(p, w, f, cat, cs, o, &pp, has);
    if (!placeable) {
        free(has);
        const char *first = json_string_value(json_array_get(p->notes, 0));
        int rc = md_errf(e, MD_ERANGE, "nothing can be planned: %s", first ? first : "no GPUs");
        sched_plan_free(p);
        return rc;
    }
    lp L;
    int min_one = !f->rent;
    int rc = solve_phase1(&L, p, w, f, cs, o, &min_one, e);
    if (rc) {
        free(has);
        lp_free(&L);
        sched_plan_free(p);
        return rc;
    }
    note_shortfalls(p, &L, w, f, has);
    double *lo = calloc((size_t)w->n + 1, sizeof *lo), *hi = calloc((size_t)w->n + 1, sizeof *hi);
    lp *sub = calloc((size_t)w->n + 1, sizeof *sub);
    lp **ls = calloc((size_t)w->n + 1, sizeof *ls);
    double *counts = calloc((size_t)cs->n + 1, sizeof *counts);
    double(*y)[SCHED_MAX_CLASSES] = calloc((size_t)cs->n + 1, sizeof *y);
    int nl = 0;
    if (!lo || !hi || !sub || !ls || !counts || !y)
        rc = md_errf(e, MD_ENOMEM, "out of memory");
    if (!rc) {
        phase2_bounds(p, &L, w, f, lo, hi);
        rc = solve_phase2(&L, sub, ls, &nl, w, f, cs, o, has, min_one, lo, hi, e);
    }
    if (!rc) {
        read_solution(ls, nl, p, w, cs, counts, y);
        trim_to_served(p, w, cs, y);
        note_limits(p, &L, ls, nl, o);
        rc = sched_materialise(p, f, w, cs, counts, y, e);
    }
    if (!rc) {
        plan_totals(p, w, cs);
        note_billing(p, w);
    }
    for (int m = 0; sub && m < w->n; m++)
        lp_free(&sub[m]);
    free(sub);
    free(ls);
    free(lo);
    free(hi);
    free(counts);
    free(y);
    free(has);
    lp_free(&L);
    if (rc) {
        sched_plan_free(p);
        return rc;
    }
    p->solve_s = (md_mono_ns() - t0) / 1e9;
    return 0;
}

void sched_plan_free(sched_plan *p) {
    for (int i = 0; i < p->n; i++)
        free(p->r[i].gpu_ids);
    free(p->r);
    free(p->models);
    free(p->idle);
    json_decref(p->notes);
    memset(p, 0, sizeof *p);
}
