/* test_sched_milp.c — scheduler placement: the MILP's objective equals exhaustive search on
 * small fleets, costs no more than Melange's ILP on Melange-style inputs, every plan passes
 * the validity check, and impossible inputs get explanations with their numbers. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <glpk.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "scheduler/sched.h"
#include "unit/sched_world.h"

/* ---- exhaustive search ---- */

typedef struct ex {
    sched_world *x;
    int *n;      /* current counts */
    int *left;   /* GPUs left per pool */
    double best; /* best ratio (a) or least cost (b) */
    long long leaves;
} ex;

/* The most requests/s model m can serve in its class mix with counts n (one or two
 * classes): class 1 gets the candidates best at it relative to class 2, fractionally. */
static double max_rate(const sched_world *x, int m, const int *n) {
    const sched_demand *d = &x->w.models[m];
    int N = x->cs.n;
    if (d->nclasses == 1) {
        double r = 0;
        for (int c = 0; c < N; c++)
            if (x->cs.c[c].model == m && n[c] && x->cs.c[c].serves[0])
                r += n[c] * x->cs.c[c].perf[0].requests_per_s;
        return r;
    }
    assert_int_equal(d->nclasses, 2);
    double s1 = d->classes[0].share, s2 = d->classes[1].share;
    /* Candidates sorted by a/b descending (a: class-1 rate, b: class-2 rate). */
    int idx[256], k = 0;
    double a[256], b[256];
    for (int c = 0; c < N; c++)
        if (x->cs.c[c].model == m && n[c]) {
            a[k] = x->cs.c[c].serves[0] ? n[c] * x->cs.c[c].perf[0].requests_per_s : 0;
            b[k] = x->cs.c[c].serves[1] ? n[c] * x->cs.c[c].perf[1].requests_per_s : 0;
            idx[k] = k;
            k++;
        }
    for (int i = 0; i < k; i++)
        for (int j = i + 1; j < k; j++)
            if (a[idx[j]] * b[idx[i]] > a[idx[i]] * b[idx[j]]) {
                int t = idx[i];
                idx[i] = idx[j];
                idx[j] = t;
            }
    /* Walk: after giving the first i candidates wholly to class 1, class-1 capacity A and
     * class-2 capacity B. X is feasible when s1 X <= A(t) and s2 X <= B(t) for some point t
     * along the walk; the best X is where A/s1 and B/s2 cross (or an end). */
    double A = 0, B = 0;
    for (int i = 0; i < k; i++)
        B += b[i];
    double best = fmin(A / s1, B / s2);
    for (int i = 0; i < k; i++) {
        int c = idx[i];
        /* Move fraction t of candidate c from class 2 to class 1. */
        double A1 = A + a[c], B1 = B - b[c];
        /* max over t of min((A + t a)/s1, (B - t b)/s2) */
        double t = (a[c] / s1 + b[c] / s2) > 0 ? (B / s2 - A / s1) / (a[c] / s1 + b[c] / s2) : 0;
        if (t > 0 && t < 1)
            best = fmax(best, (A + t * a[c]) / s1);
        best = fmax(best, fmin(A1 / s1, B1 / s2));
        A = A1;
        B = B1;
    }
    return best;
}

/* Least busy cost ($/h) of serving D requests/s of a one-class batch model with counts n:
 * the cheapest requests first (fractional), plus eps x usd for every placed replica. */
static double batch_cost(const sched_world *x, int m, const int *n, double D) {
    double need = D, cost = 0;
    int used[256] = {0};
    for (;;) {
        int best = -1;
        for (int c = 0; c < x->cs.n; c++)
            if (x->cs.c[c].model == m && n[c] && !used[c] && x->cs.c[c].serves[0] &&
                (best < 0 || x->cs.c[c].usd_per_hour / x->cs.c[c].perf[0].requests_per_s <
                                 x->cs.c[best].usd_per_hour / x->cs.c[best].perf[0].requests_per_s))
                best = c;
        if (best < 0 || need <= 0)
            break;
        used[best] = 1;
        double cap = n[best] * x->cs.c[best].perf[0].requests_per_s;
        double take = fmin(cap, need);
        cost += x->cs.c[best].usd_per_hour * take / x->cs.c[best].perf[0].requests_per_s;
        need -= take;
    }
    for (int c = 0; c < x->cs.n; c++)
        if (x->cs.c[c].model == m)
            cost += 1e-6 * x->cs.c[c].usd_per_hour * n[c];
    return cost;
}

/* Same objective as the MILP: every model served at its demand (the tests keep it
 * achievable); (a) the most tokens per dollar, (b) the least rental cost. Serving models
 * (arrival rates) pay for every replica; batch models for their replicas' busy time. */
static void evaluate(ex *s) {
    sched_world *x = s->x;
    s->leaves++;
    double T = 0, C = 0;
    for (int m = 0; m < x->w.n; m++) {
        const sched_demand *d = &x->w.models[m];
        double X = max_rate(x, m, s->n);
        double D = sched_demand_tokens_per_s(d) / sched_demand_tokens_per_request(d);
        if (X < D * (1 - 1e-9))
            return;
        int reps = 0;
        for (int c = 0; c < x->cs.n; c++)
            reps += x->cs.c[c].model == m ? s->n[c] : 0;
        if (!reps && !x->f.rent)
            return;
        double cm = 0;
        if (d->rate_rps > 0) {
            for (int c = 0; c < x->cs.n; c++)
                if (x->cs.c[c].model == m)
                    cm += s->n[c] * x->cs.c[c].usd_per_hour;
        } else {
            assert_int_equal(d->nclasses, 1);
            cm = batch_cost(x, m, s->n, D);
        }
        C += cm * (x->f.rent ? d->finish_s / 3600 : 1);
        T += d->priority * sched_demand_tokens_per_request(d) * D;
    }
    if (x->f.rent) {
        if (C < s->best)
            s->best = C;
    } else if (C > 0 && T / C > s->best) {
        s->best = T / C;
    }
}

static void dfs(ex *s, int c) {
    sched_world *x = s->x;
    if (c == x->cs.n) {
        evaluate(s);
        return;
    }
    const sched_cand *k = &x->cs.c[c];
    for (int v = 0;; v++) {
        s->n[c] = v;
        dfs(s, c + 1);
        int ok = 1;
        for (int st = 0; st < k->nstages; st++)
            ok &= s->left[k->stages[st].pool] >= k->stages[st].tp;
        if (!ok)
            break;
        for (int st = 0; st < k->nstages; st++)
            s->left[k->stages[st].pool] -= k->stages[st].tp;
    }
    for (int st = 0; st < k->nstages; st++)
        s->left[k->stages[st].pool] += k->stages[st].tp * s->n[c];
    s->n[c] = 0;
}

static double exhaustive(sched_world *x, long long *leaves) {
    ex s = {x, calloc((size_t)x->cs.n + 1, sizeof(int)), calloc((size_t)x->f.n + 1, sizeof(int)),
            x->f.rent ? INFINITY : 0, 0};
    for (int p = 0; p < x->f.n; p++)
        s.left[p] = x->f.pools[p].count;
    dfs(&s, 0);
    free(s.n);
    free(s.left);
    *leaves = s.leaves;
    return s.best;
}

static double plan_value(const sched_world *x, const sched_plan *p) {
    if (!x->f.rent) {
        /* The MILP's cost: busy time, plus eps x usd for each placed batch replica. */
        double c = p->busy_usd_per_hour;
        for (int i = 0; i < p->n; i++)
            if (x->w.models[x->cs.c[p->r[i].cand].model].rate_rps <= 0)
                c += 1e-6 * x->cs.c[p->r[i].cand].usd_per_hour;
        return p->tokens_per_s / c;
    }
    double cost = 0;
    for (int i = 0; i < p->n; i++) {
        const sched_cand *c = &x->cs.c[p->r[i].cand];
        const sched_demand *d = &x->w.models[c->model];
        double busy = d->rate_rps > 0 ? 1 : p->r[i].busy + 1e-6;
        cost += c->usd_per_hour * busy * d->finish_s / 3600;
    }
    return cost;
}

static void check_against_exhaustive(const char *fleet, const char *workload) {
    sched_world x;
    md_err e = {0};
    assert_int_equal(sched_world_load(&x, fleet, workload, &e), 0);
    sched_plan p;
    sched_opts o;
    sched_opts_defaults(&o);
    assert_int_equal(sched_plan_solve(&p, &x.w, &x.f, &x.cat, &x.cs, &o, &e), 0);
    assert_int_equal(sched_plan_validate(&p, &x.w, &x.f, &x.cat, &x.cs, &x.pp, &e), 0);
    long long leaves;
    double best = exhaustive(&x, &leaves);
    double got = plan_value(&x, &p);
    print_message("%d candidates, %lld assignments searched: exhaustive %.9g, MILP %.9g\n", x.cs.n,
                  leaves, best, got);
    assert_true(leaves > 10);
    assert_true(isfinite(best) && best > 0);
    assert_true(fabs(got - best) <= 1e-6 * best);
    sched_plan_free(&p);
    sched_world_free(&x);
}

static void milp_equals_exhaustive_batch_three_models_twelve_gpus(void **st) {
    check_against_exhaustive(
        "{\"name\":\"t\",\"pools\":[{\"name\":\"a\",\"type\":\"A100-80GB-SXM\",\"count\":4,"
        "\"gpus_per_host\":4},{\"name\":\"l\",\"type\":\"L4\",\"count\":4,\"gpus_per_host\":4},"
        "{\"name\":\"g\",\"type\":\"A10G\",\"count\":4,\"gpus_per_host\":4}]}",
        "{\"models\":[{\"model\":\"llama-3-8b\",\"requests\":1000,\"input_mean\":300,"
        "\"output_mean\":200},{\"model\":\"mistral-7b\",\"requests\":1000,\"input_mean\":1000,"
        "\"output_mean\":300},{\"model\":\"qwen2-7b\",\"requests\":500,\"input_mean\":100,"
        "\"output_mean\":100}]}");
}

static void milp_equals_exhaustive_serving_two_classes(void **st) {
    check_against_exhaustive(
        "{\"name\":\"t\",\"pools\":[{\"name\":\"a\",\"type\":\"A100-40GB\",\"count\":4,"
        "\"gpus_per_host\":4},{\"name\":\"s\",\"type\":\"L40S\",\"count\":4,\"gpus_per_host\":4},"
        "{\"name\":\"l\",\"type\":\"L4\",\"count\":4,\"gpus_per_host\":4}]}",
        "{\"models\":[{\"model\":\"llama-3-8b\",\"rate_rps\":5.5,"
        "\"classes\":[{\"name\":\"s\",\"input_mean\":200,\"output_mean\":100,\"max_tokens\":1024,"
        "\"share\":0.6},{\"name\":\"l\",\"input_mean\":4000,\"output_mean\":400,"
        "\"max_tokens\":8192,\"share\":0.4}]},{\"model\":\"mistral-7b\",\"rate_rps\":0.8,"
        "\"classes\":[{\"name\":\"s\",\"input_mean\":300,\"output_mean\":100,\"share\":1},"
        "{\"name\":\"l\",\"input_mean\":6000,\"output_mean\":300,\"max_tokens\":16384,"
        "\"share\":1}]}]}");
}

static void milp_equals_exhaustive_rent_for_serving(void **st) {
    check_against_exhaustive(
        "{\"name\":\"r\",\"rent\":{\"types\":[\"A100-80GB-SXM\",\"L4\",\"L40S\"],"
        "\"max_per_type\":4}}",
        "{\"models\":[{\"model\":\"llama-3-8b\",\"rate_rps\":16,"
        "\"classes\":[{\"name\":\"s\",\"input_mean\":200,\"output_mean\":100,\"max_tokens\":1024,"
        "\"share\":0.7},{\"name\":\"l\",\"input_mean\":3000,\"output_mean\":300,"
        "\"max_tokens\":8192,\"share\":0.3}]},{\"model\":\"qwen2-7b\",\"rate_rps\":3,"
        "\"input_mean\":500,\"output_mean\":200}]}");
}

static void milp_equals_exhaustive_rent_batch_to_deadline(void **st) {
    check_against_exhaustive(
        "{\"name\":\"r\",\"rent\":{\"types\":[\"A100-80GB-SXM\",\"L4\",\"L40S\"],"
        "\"max_per_type\":4}}",
        "{\"models\":[{\"model\":\"llama-3-8b\",\"requests\":60000,\"deadline_s\":1800,"
        "\"input_mean\":300,\"output_mean\":150},{\"model\":\"qwen2-7b\",\"requests\":20000,"
        "\"deadline_s\":3600,\"input_mean\":2000,\"output_mean\":200}]}");
}

/* ---- Melange ---- */

/* Melange's ILP (Griggs et al., arXiv:2404.14527 §5): each bucket's request rate is cut
 * into S equal slices; slice i goes to exactly one GPU type j (binary x_ij); a type's GPU
 * count B_j covers the load it takes, sum_i x_ij rate_i / tput_j(bucket_i) <= B_j; minimise
 * sum_j price_j B_j. Solved here with GLPK directly. */
static double melange_ilp(int nb, int nt, const double *rate, double (*tput)[4],
                          const double *price, int S) {
    glp_prob *P = glp_create_prob();
    glp_set_obj_dir(P, GLP_MIN);
    int nx = nb * S * nt;
    glp_add_cols(P, nx + nt);
    for (int i = 1; i <= nx; i++)
        glp_set_col_kind(P, i, GLP_BV);
    for (int j = 0; j < nt; j++) {
        glp_set_col_kind(P, nx + 1 + j, GLP_IV);
        glp_set_col_bnds(P, nx + 1 + j, GLP_LO, 0, 0);
        glp_set_obj_coef(P, nx + 1 + j, price[j]);
    }
    int cap = 4 * nx + 4 * nt + 8;
    int *ia = calloc((size_t)cap, sizeof *ia), *ja = calloc((size_t)cap, sizeof *ja);
    double *ar = calloc((size_t)cap, sizeof *ar);
    int nz = 0;
    for (int i = 0; i < nb * S; i++) {
        int r = glp_add_rows(P, 1);
        glp_set_row_bnds(P, r, GLP_FX, 1, 1);
        for (int j = 0; j < nt; j++) {
            ia[++nz] = r, ja[nz] = 1 + i * nt + j, ar[nz] = 1;
            if (tput[i / S][j] <= 0)
                glp_set_col_bnds(P, 1 + i * nt + j, GLP_FX, 0, 0);
        }
    }
    for (int j = 0; j < nt; j++) {
        int r = glp_add_rows(P, 1);
        glp_set_row_bnds(P, r, GLP_UP, 0, 0);
        for (int i = 0; i < nb * S; i++)
            if (tput[i / S][j] > 0)
                ia[++nz] = r, ja[nz] = 1 + i * nt + j, ar[nz] = rate[i / S] / S / tput[i / S][j];
        ia[++nz] = r, ja[nz] = nx + 1 + j, ar[nz] = -1;
    }
    glp_load_matrix(P, nz, ia, ja, ar);
    glp_iocp parm;
    glp_init_iocp(&parm);
    parm.presolve = GLP_ON;
    parm.msg_lev = GLP_MSG_OFF;
    assert_int_equal(glp_intopt(P, &parm), 0);
    double v = glp_mip_obj_val(P);
    glp_delete_prob(P);
    free(ia), free(ja), free(ar);
    return v;
}

static void plan_costs_no_more_than_melange(void **st) {
    /* Four GPU types at Melange's prices, Llama-2-7B, six (input, output) buckets, a
     * throughput table per type in requests/s (illustrative numbers shaped like Melange's
     * profiles: small GPUs competitive on short requests, large ones on long). */
    const char *types[4] = {"L4", "A10G", "A100-80GB-SXM", "H100-SXM"};
    const double price[4] = {0.70, 1.01, 3.67, 7.516};
    const int in_lo[6] = {1, 1, 256, 256, 1024, 1024},
              in_hi[6] = {256, 256, 1024, 1024, 3584, 3584};
    const int out_lo[6] = {1, 128, 1, 128, 1, 128}, out_hi[6] = {128, 512, 128, 512, 128, 512};
    double tput[6][4] = {{2.2, 2.6, 11.0, 24.0}, {0.8, 1.0, 4.5, 10.5},  {0.9, 1.1, 6.0, 14.0},
                         {0.45, 0.55, 3.0, 7.5}, {0.20, 0.25, 2.0, 5.0}, {0.10, 0.12, 1.1, 3.0}};
    const double share[6] = {0.30, 0.20, 0.15, 0.15, 0.12, 0.08};
    const double rate = 6.0; /* requests/s */
    char fleet[512];
    snprintf(
        fleet, sizeof fleet,
        "{\"name\":\"m\",\"prices\":{\"L4\":%g,\"A10G\":%g,\"A100-80GB-SXM\":%g,"
        "\"H100-SXM\":%g},\"rent\":{\"types\":[\"L4\",\"A10G\",\"A100-80GB-SXM\",\"H100-SXM\"],"
        "\"max_per_type\":64}}",
        price[0], price[1], price[2], price[3]);
    char wl[2048];
    int at = snprintf(wl, sizeof wl,
                      "{\"horizon_s\":3600,\"models\":[{\"model\":\"llama-2-7b\",\"rate_rps\":%g,"
                      "\"classes\":[",
                      rate);
    for (int b = 0; b < 6; b++)
        at += snprintf(wl + at, sizeof wl - (size_t)at,
                       "%s{\"name\":\"b%d\",\"input_mean\":%g,\"output_mean\":%g,\"max_tokens\":%d,"
                       "\"share\":%g}",
                       b ? "," : "", b, (in_lo[b] + in_hi[b]) / 2.0, (out_lo[b] + out_hi[b]) / 2.0,
                       in_hi[b] + out_hi[b], share[b]);
    snprintf(wl + at, sizeof wl - (size_t)at, "]}]}");
    sched_world x;
    md_err e = {0};
    json_t *fd = json_loads(fleet, 0, NULL), *wd = json_loads(wl, 0, NULL);
    assert_int_equal(sched_world_inputs(&x, fd, wd, 0, &e), 0);
    json_decref(fd);
    json_decref(wd);
    for (int t = 0; t < 4; t++) {
        json_t *bk = json_array();
        for (int b = 0; b < 6; b++)
            json_array_append_new(bk, json_pack("{s:i, s:i, s:i, s:i, s:f}", "input_lo", in_lo[b],
                                                "input_hi", in_hi[b], "output_lo", out_lo[b],
                                                "output_hi", out_hi[b], "max_requests_per_s",
                                                tput[b][t]));
        json_t *pd = json_pack("{s:i, s:s, s:s, s:s, s:o}", "version", 1, "device_type", types[t],
                               "model", "llama-2-7b", "method", "published", "buckets", bk);
        assert_int_equal(sched_profile_from_json(&x.prof, pd, "profile", &e), 0);
        json_decref(pd);
    }
    assert_int_equal(sched_cands_build(&x.cs, &x.w, &x.f, &x.cat, &x.prof, &x.pp, &e), 0);
    /* Like for like: Melange places single GPUs, so keep the single-GPU candidates (their
     * figures come from the profiles above). */
    int k = 0;
    for (int c = 0; c < x.cs.n; c++)
        if (x.cs.c[c].nstages == 1 && x.cs.c[c].stages[0].tp == 1)
            x.cs.c[k++] = x.cs.c[c];
    x.cs.n = k;
    assert_int_equal(k, 4);
    for (int c = 0; c < k; c++)
        for (int b = 0; b < 6; b++)
            assert_string_equal(x.cs.c[c].perf[b].bound, "profile");
    sched_plan p;
    sched_opts o;
    sched_opts_defaults(&o);
    assert_int_equal(sched_plan_solve(&p, &x.w, &x.f, &x.cat, &x.cs, &o, &e), 0);
    assert_int_equal(sched_plan_validate(&p, &x.w, &x.f, &x.cat, &x.cs, &x.pp, &e), 0);
    assert_true(p.models[0].deadline_met);
    double rates[6];
    for (int b = 0; b < 6; b++)
        rates[b] = rate * share[b];
    /* Melange's slice factor: more slices is a finer (cheaper or equal) packing. */
    for (int S = 1; S <= 4; S *= 2) {
        double mel = melange_ilp(6, 4, rates, tput, price, S);
        print_message("Melange ILP (S=%d): $%.4f/h; medley plan: $%.4f/h\n", S, mel,
                      p.usd_per_hour);
        assert_true(p.usd_per_hour <= mel + 1e-9);
    }
    sched_plan_free(&p);
    sched_world_free(&x);
}

/* ---- impossible and malformed inputs ---- */

static void model_too_large_for_every_group_is_explained(void **st) {
    sched_world x;
    md_err e = {0};
    assert_int_equal(
        sched_world_load(&x, "{\"pools\":[{\"type\":\"L4\",\"count\":2,\"gpus_per_host\":2}]}",
                         "{\"models\":[{\"model\":\"qwen2-72b\",\"requests\":10,"
                         "\"input_mean\":100,\"output_mean\":100}]}",
                         &e),
        0);
    assert_int_equal(x.cs.n, 0);
    sched_plan p;
    sched_opts o;
    sched_opts_defaults(&o);
    assert_int_equal(sched_plan_solve(&p, &x.w, &x.f, &x.cat, &x.cs, &o, &e), MD_ERANGE);
    assert_non_null(strstr(e.msg, "qwen2-72b cannot be placed"));
    assert_non_null(strstr(e.msg, "145.")); /* 72.7B x 2 bytes */
    assert_non_null(strstr(e.msg, "2xL4"));
    sched_world_free(&x);
    /* With a model that does fit, the plan is made and the note explains the other. */
    assert_int_equal(
        sched_world_load(&x, "{\"pools\":[{\"type\":\"L4\",\"count\":2,\"gpus_per_host\":2}]}",
                         "{\"models\":[{\"model\":\"qwen2-72b\",\"requests\":10,"
                         "\"input_mean\":100,\"output_mean\":100},{\"model\":\"llama-3-8b\","
                         "\"requests\":10,\"input_mean\":100,\"output_mean\":100}]}",
                         &e),
        0);
    assert_int_equal(sched_plan_solve(&p, &x.w, &x.f, &x.cat, &x.cs, &o, &e), 0);
    assert_true(p.n >= 1);
    assert_non_null(strstr(json_string_value(json_array_get(p.notes, 0)), "qwen2-72b"));
    sched_plan_free(&p);
    sched_world_free(&x);
}

/* A pool's memory_gb (the daemon's: a CPU host's memory from its heartbeat) is what its
 * devices hold: llama-2-13b (26 GB of BF16 weights) has no replica on the catalog's 16 GB
 * `cpu` slice, one on a 68.7 GB host; a host of another size is another pool when the fleet
 * is merged; a memory_gb out of range is refused naming it. Before, every CPU host was 16 GB. */
static void a_pools_memory_decides_what_it_holds(void **st) {
    static const char *wl = "{\"models\":[{\"model\":\"llama-2-13b\",\"requests\":10,"
                            "\"input_mean\":100,\"output_mean\":100}]}";
    sched_world x;
    md_err e = {0};
    assert_int_equal(
        sched_world_load(&x, "{\"pools\":[{\"name\":\"h\",\"type\":\"cpu\",\"count\":1}]}", wl, &e),
        0);
    assert_int_equal(x.cs.n, 0);
    sched_world_free(&x);
    assert_int_equal(sched_world_load(&x,
                                      "{\"pools\":[{\"name\":\"h\",\"type\":\"cpu\",\"count\":1,"
                                      "\"memory_gb\":68.7}]}",
                                      wl, &e),
                     0);
    assert_true(x.cs.n >= 1);
    assert_true(x.cs.c[0].stages[0].memory_gb == 68.7);
    sched_plan p;
    sched_opts o;
    sched_opts_defaults(&o);
    assert_int_equal(sched_plan_solve(&p, &x.w, &x.f, &x.cat, &x.cs, &o, &e), 0);
    assert_int_equal(p.n, 1);
    assert_int_equal(sched_plan_validate(&p, &x.w, &x.f, &x.cat, &x.cs, &x.pp, &e), 0);
    sched_plan_free(&p);
    sched_world_free(&x);
    json_t *f = json_loads("{\"pools\":[{\"name\":\"a\",\"type\":\"cpu\",\"count\":1,"
                           "\"gpus_per_host\":1,\"memory_gb\":68.7},{\"name\":\"b\",\"type\":"
                           "\"cpu\",\"count\":1,\"gpus_per_host\":1,\"memory_gb\":8.6},{\"name\":"
                           "\"c\",\"type\":\"cpu\",\"count\":1,\"gpus_per_host\":1,"
                           "\"memory_gb\":68.7}]}",
                           0, NULL),
           *w = json_loads(wl, 0, NULL);
    assert_int_equal(sched_world_load_json(&x, f, w, 1, &e), 0);
    assert_int_equal(x.f.n, 2);
    sched_world_free(&x);
    json_decref(f);
    f = json_loads("{\"pools\":[{\"type\":\"cpu\",\"count\":1,\"memory_gb\":0}]}", 0, NULL);
    assert_int_equal(sched_world_load_json(&x, f, w, 0, &e), MD_EINVAL);
    assert_non_null(strstr(e.msg, "fleet.pools[0].memory_gb"));
    sched_world_free(&x);
    json_decref(f);
    json_decref(w);
}

static void impossible_deadline_reports_need_and_best(void **st) {
    sched_world x;
    md_err e = {0};
    assert_int_equal(sched_world_load(&x, "{\"pools\":[{\"type\":\"L4\",\"count\":1}]}",
                                      "{\"models\":[{\"model\":\"llama-3-8b\",\"requests\":100000,"
                                      "\"deadline_s\":60,\"input_mean\":100,\"output_mean\":100}]}",
                                      &e),
                     0);
    sched_plan p;
    sched_opts o;
    sched_opts_defaults(&o);
    assert_int_equal(sched_plan_solve(&p, &x.w, &x.f, &x.cat, &x.cs, &o, &e), 0);
    assert_false(p.models[0].deadline_met);
    assert_true(p.models[0].demand_tps > 3e5 && p.models[0].best_tps < 1e5);
    const char *n = json_string_value(json_array_get(p.notes, 0));
    assert_non_null(n);
    assert_non_null(strstr(n, "needs 333333 tokens/s"));
    assert_non_null(strstr(n, "the backlog would take"));
    sched_plan_free(&p);
    sched_world_free(&x);
    /* Renting with too few GPUs allowed: the same explanation. */
    assert_int_equal(sched_world_load(&x, "{\"rent\":{\"types\":[\"L4\"],\"max_per_type\":2}}",
                                      "{\"models\":[{\"model\":\"llama-3-8b\",\"requests\":100000,"
                                      "\"deadline_s\":60,\"input_mean\":100,\"output_mean\":100}]}",
                                      &e),
                     0);
    assert_int_equal(sched_plan_solve(&p, &x.w, &x.f, &x.cat, &x.cs, &o, &e), 0);
    assert_false(p.models[0].deadline_met);
    assert_non_null(strstr(json_string_value(json_array_get(p.notes, 0)), "max_per_type"));
    sched_plan_free(&p);
    sched_world_free(&x);
}

static void malformed_files_get_clear_errors(void **st) {
    struct {
        const char *fleet, *workload, *want;
    } t[] = {
        {"{\"pools\":[{\"type\":\"B9000\",\"count\":2}]}", "{}", "unknown GPU type 'B9000'"},
        {"{\"pools\":[{\"type\":\"L4\",\"count\":-3}]}", "{}", "count must be"},
        {"{\"pools\":[]}", "{}", "pools"},
        {"[1,2]", "{}", "JSON object"},
        {"{\"pools\":[{\"type\":\"L4\",\"count\":1}],\"rent\":{}}", "{}", "not both"},
        {"{\"rent\":{\"types\":[\"Z1\"]}}", "{}", "unknown GPU type 'Z1'"},
        {"{\"prices\":{\"L4\":\"cheap\"},\"pools\":[{\"type\":\"L4\",\"count\":1}]}", "{}",
         "fleet.prices.L4"},
        {"{\"pools\":[{\"type\":\"L4\",\"count\":1}]}", "{\"models\":[{\"model\":\"gpt-9\"}]}",
         "unknown model 'gpt-9'"},
        {"{\"pools\":[{\"type\":\"L4\",\"count\":1}]}", "{\"models\":[{\"model\":\"llama-3-8b\"}]}",
         "backlog"},
        {"{\"pools\":[{\"type\":\"L4\",\"count\":1}]}",
         "{\"models\":[{\"model\":\"llama-3-8b\",\"requests\":5}]}", "input_mean"},
        {"{\"pools\":[{\"type\":\"L4\",\"count\":1}]}",
         "{\"models\":[{\"model\":\"llama-3-8b\",\"requests\":5,\"input_mean\":9000,"
         "\"output_mean\":10}]}",
         "context is 8192"},
        {"{\"pools\":[{\"type\":\"L4\",\"count\":1}]}", "{\"models\":3}", "\"models\" must be"},
    };
    for (size_t i = 0; i < sizeof t / sizeof *t; i++) {
        sched_world x;
        md_err e = {0};
        int rc = sched_world_load(&x, t[i].fleet, t[i].workload, &e);
        if (!rc || !strstr(e.msg, t[i].want))
            print_message("case %zu: rc %d msg '%s' (want '%s')\n", i, rc, e.msg, t[i].want);
        assert_true(rc < 0);
        assert_non_null(strstr(e.msg, t[i].want));
        sched_world_free(&x);
    }
}

static void validity_check_catches_a_gpu_used_twice(void **st) {
    sched_world x;
    md_err e = {0};
    assert_int_equal(
        sched_world_load(&x, "{\"pools\":[{\"name\":\"l\",\"type\":\"L4\",\"count\":4}]}",
                         "{\"models\":[{\"model\":\"llama-3-8b\",\"requests\":100000,"
                         "\"deadline_s\":600,\"input_mean\":100,\"output_mean\":100}]}",
                         &e),
        0);
    sched_plan p;
    sched_opts o;
    sched_opts_defaults(&o);
    assert_int_equal(sched_plan_solve(&p, &x.w, &x.f, &x.cat, &x.cs, &o, &e), 0);
    assert_true(p.n >= 2);
    assert_int_equal(sched_plan_validate(&p, &x.w, &x.f, &x.cat, &x.cs, &x.pp, &e), 0);
    assert_int_equal(p.nidle, 0);
    char saved[SCHED_ID];
    memcpy(saved, p.r[1].gpu_ids[0], SCHED_ID);
    memcpy(p.r[1].gpu_ids[0], p.r[0].gpu_ids[0], SCHED_ID);
    assert_int_equal(sched_plan_validate(&p, &x.w, &x.f, &x.cat, &x.cs, &x.pp, &e), MD_EINVAL);
    assert_non_null(strstr(e.msg, "used twice"));
    snprintf(p.r[1].gpu_ids[0], SCHED_ID, "nowhere/0");
    assert_int_equal(sched_plan_validate(&p, &x.w, &x.f, &x.cat, &x.cs, &x.pp, &e), MD_EINVAL);
    assert_non_null(strstr(e.msg, "not in pool"));
    memcpy(p.r[1].gpu_ids[0], saved, SCHED_ID);
    sched_plan_free(&p);
    sched_world_free(&x);
}

/* Issue 26 items 4 and 5: a plan's numbers are its replicas' numbers. Serving models' replicas
 * are on whether or not they have work, and the MILP gave them class time they do not need:
 * their predicted tokens/s added up to more than the model's. A rent plan's gpus_used counted
 * types x max_per_type. And validate refuses a plan whose claims its replicas do not back. */
static void plan_numbers_are_its_replicas_numbers(void **st) {
    sched_world x;
    md_err e = {0};
    assert_int_equal(
        sched_world_load(&x,
                         "{\"name\":\"t\",\"pools\":[{\"name\":\"a\",\"type\":\"A100-80GB-SXM\","
                         "\"count\":8,\"gpus_per_host\":8},{\"name\":\"l\",\"type\":\"L4\","
                         "\"count\":8,\"gpus_per_host\":8}]}",
                         "{\"models\":[{\"model\":\"llama-3-8b\",\"rate_rps\":7,\"input_mean\":900,"
                         "\"output_mean\":300},{\"model\":\"mistral-7b\",\"rate_rps\":0.5,"
                         "\"input_mean\":300,\"output_mean\":100},{\"model\":\"qwen2-7b\","
                         "\"rate_rps\":0.3,\"input_mean\":300,\"output_mean\":100}]}",
                         &e),
        0);
    sched_plan p;
    sched_opts o;
    sched_opts_defaults(&o);
    assert_int_equal(sched_plan_solve(&p, &x.w, &x.f, &x.cat, &x.cs, &o, &e), 0);
    assert_int_equal(sched_plan_validate(&p, &x.w, &x.f, &x.cat, &x.cs, &x.pp, &e), 0);
    json_t *doc = sched_plan_to_json(&p, &x.w, &x.f, &x.cat, &x.cs);
    for (int m = 0; m < x.w.n; m++) {
        double sum = 0;
        size_t i;
        json_t *r;
        json_array_foreach(json_object_get(doc, "replicas"), i, r) {
            if (!strcmp(json_string_value(json_object_get(r, "model")), x.w.models[m].model.name))
                sum += json_number_value(json_object_get(r, "predicted_tokens_per_s"));
        }
        double model = json_number_value(json_object_get(
            json_array_get(json_object_get(doc, "models"), (size_t)m), "predicted_tokens_per_s"));
        print_message("%s: replicas %.1f tok/s, model %.1f tok/s\n", x.w.models[m].model.name, sum,
                      model);
        assert_true(model > 0);
        assert_true(fabs(sum - model) <= 1e-6 * model);
    }
    json_decref(doc);
    /* Claims the replicas do not back are refused. */
    double saved = p.models[0].served_tps;
    p.models[0].served_tps *= 1.5;
    assert_int_equal(sched_plan_validate(&p, &x.w, &x.f, &x.cat, &x.cs, &x.pp, &e), MD_EINVAL);
    assert_non_null(strstr(e.msg, "replicas give"));
    p.models[0].served_tps = saved;
    p.models[0].demand_tps = saved * 2;
    p.models[0].deadline_met = 1;
    assert_int_equal(sched_plan_validate(&p, &x.w, &x.f, &x.cat, &x.cs, &x.pp, &e), MD_EINVAL);
    assert_non_null(strstr(e.msg, "deadline met"));
    sched_plan_free(&p);
    sched_world_free(&x);
    /* A rent plan's gpus_used is the GPUs rented. */
    assert_int_equal(
        sched_world_load(&x,
                         "{\"name\":\"r\",\"rent\":{\"types\":[\"A100-80GB-SXM\",\"L4\"],"
                         "\"max_per_type\":64}}",
                         "{\"models\":[{\"model\":\"llama-3-8b\",\"requests\":20000,"
                         "\"deadline_s\":1800,\"input_mean\":300,\"output_mean\":150}]}",
                         &e),
        0);
    assert_int_equal(sched_plan_solve(&p, &x.w, &x.f, &x.cat, &x.cs, &o, &e), 0);
    assert_int_equal(sched_plan_validate(&p, &x.w, &x.f, &x.cat, &x.cs, &x.pp, &e), 0);
    int rented = 0;
    for (int i = 0; i < p.n; i++)
        rented += x.cs.c[p.r[i].cand].gpus;
    doc = sched_plan_to_json(&p, &x.w, &x.f, &x.cat, &x.cs);
    json_int_t used =
        json_integer_value(json_object_get(json_object_get(doc, "totals"), "gpus_used"));
    print_message("rent: %d GPUs rented, gpus_used %lld\n", rented, (long long)used);
    assert_true(rented > 0 && rented < 128);
    assert_int_equal(used, rented);
    json_decref(doc);
    sched_plan_free(&p);
    sched_world_free(&x);
}

/* 1,000 GPUs x 10 models: the whole planning path (candidates + MILP) in under a second
 * in an optimised build (the bench prints it); here 5 s leaves room for sanitizers. */
static void thousand_gpus_ten_models_plan_quickly(void **st) {
    sched_world x;
    md_err e = {0};
    const char *fleet = "{\"pools\":[{\"type\":\"H100-SXM\",\"count\":96},{\"type\":\"A100-80GB-"
                        "SXM\",\"count\":160},"
                        "{\"type\":\"A100-40GB\",\"count\":96},{\"type\":\"L40S\",\"count\":128},"
                        "{\"type\":\"L4\",\"count\":256},{\"type\":\"A10G\",\"count\":160},"
                        "{\"type\":\"RTX-4090\",\"count\":64},{\"type\":\"T4\",\"count\":40}]}";
    char wl[4096];
    const char *models[] = {"llama-3-8b", "llama-3-70b", "mistral-7b",  "qwen2-7b",    "qwen2-72b",
                            "llama-2-7b", "llama-2-13b", "llama-2-70b", "smollm2-135m"};
    int at = snprintf(wl, sizeof wl, "{\"models\":[");
    for (int m = 0; m < 10; m++) {
        char card[160];
        if (m < 9)
            snprintf(card, sizeof card, "\"%s\"", models[m]);
        else
            snprintf(card, sizeof card,
                     "{\"name\":\"llama-3-8b-int4\",\"layers\":32,\"hidden\":4096,"
                     "\"heads\":32,\"kv_heads\":8,\"ffn\":14336,\"vocab\":128256,"
                     "\"quant\":\"INT4\"}");
        at += snprintf(wl + at, sizeof wl - (size_t)at,
                       "%s{\"model\":%s,\"requests\":%d,\"deadline_s\":%d,\"classes\":["
                       "{\"name\":\"s\",\"input_mean\":250,\"output_mean\":150,\"max_tokens\":1024,"
                       "\"share\":0.6},{\"name\":\"l\",\"input_mean\":2500,\"output_mean\":350,"
                       "\"max_tokens\":4096,\"share\":0.4}]}",
                       m ? "," : "", card, 20000 + 5000 * m, 3600 * (1 + m % 3));
    }
    snprintf(wl + at, sizeof wl - (size_t)at, "]}");
    sched_perf_params pp;
    sched_perf_defaults(&pp);
    double t0 = (double)clock() / CLOCKS_PER_SEC;
    assert_int_equal(sched_world_load(&x, fleet, wl, &e), 0);
    sched_plan p;
    sched_opts o;
    sched_opts_defaults(&o);
    assert_int_equal(sched_plan_solve(&p, &x.w, &x.f, &x.cat, &x.cs, &o, &e), 0);
    double dt = (double)clock() / CLOCKS_PER_SEC - t0;
    print_message("1000 GPUs x 10 models: %d candidates, %d replicas, %.3f s CPU\n", x.cs.n, p.n,
                  dt);
    assert_int_equal(sched_plan_validate(&p, &x.w, &x.f, &x.cat, &x.cs, &x.pp, &e), 0);
    assert_int_equal(sched_fleet_gpus(&x.f), 1000);
    assert_true(dt < 5.0);
    sched_plan_free(&p);
    sched_world_free(&x);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(milp_equals_exhaustive_batch_three_models_twelve_gpus),
        cmocka_unit_test(milp_equals_exhaustive_serving_two_classes),
        cmocka_unit_test(milp_equals_exhaustive_rent_for_serving),
        cmocka_unit_test(milp_equals_exhaustive_rent_batch_to_deadline),
        cmocka_unit_test(plan_costs_no_more_than_melange),
        cmocka_unit_test(model_too_large_for_every_group_is_explained),
        cmocka_unit_test(impossible_deadline_reports_need_and_best),
        cmocka_unit_test(malformed_files_get_clear_errors),
        cmocka_unit_test(validity_check_catches_a_gpu_used_twice),
        cmocka_unit_test(plan_numbers_are_its_replicas_numbers),
        cmocka_unit_test(thousand_gpus_ten_models_plan_quickly),
        cmocka_unit_test(a_pools_memory_decides_what_it_holds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
