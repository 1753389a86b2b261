/* cand.c — candidate replicas per model: same-type groups with TP in {1,2,4,8}; pipelines of
 * 2..SCHED_MAX_STAGES TP groups of one pool across its hosts (for models no group inside a
 * host holds, or holds with less KV room than its weights); and pipelines of one or more
 * groups of a pool plus a last group of another type. Layers are split by a dynamic program
 * that minimises the slowest stage under each stage's memory (HexGen-style uneven splits).
 * Pruned so that the MILP stays small: large TP degrees only where they serve a class the
 * smaller ones cannot, the fewest pipeline stages that hold the model and one more,
 * dominated pipelines dropped, and only the best few mixed pipelines per model. Measured
 * profiles answer the candidates they cover and calibrate the others (sched_cands_build). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "scheduler/sched.h"

#define MIXED_KEEP 4   /* mixed-type pipelines kept per model */
#define EXTRA_STAGES 1 /* same-type pipelines: stages beyond the fewest that hold the model */
#define DP_MAX_LAYERS 1024

/* The DP's stage cost: one decode step of a reference micro-batch. */
static double stage_cost(const sched_model *m, const sched_gpu_type *g, int tp, int layers,
                         int first, int last, const sched_perf_params *pp) {
    return sched_perf_decode_step(m, g, tp, layers, first, last, 16, 1024, pp);
}

int sched_layer_split(const sched_model *m, const sched_catalog *cat, sched_stage *st, int n,
                      double min_kv_tokens, const sched_perf_params *pp, md_err *e) {
    int L = m->layers;
    if (n < 1 || n > SCHED_MAX_STAGES || L > DP_MAX_LAYERS || L < n)
        return md_errf(e, MD_EINVAL, "layer split: %d stages for %d layers is not supported", n, L);
    /* f[s][j]: the least possible slowest-stage cost when stages 0..s hold layers [0, j). */
    static double f[SCHED_MAX_STAGES][DP_MAX_LAYERS + 1];
    static short arg[SCHED_MAX_STAGES][DP_MAX_LAYERS + 1];
    for (int s = 0; s < n; s++) {
        const sched_gpu_type *g = &cat->gpus[st[s].type];
        for (int j = 0; j <= L; j++) {
            f[s][j] = INFINITY;
            arg[s][j] = -1;
            if (j < s + 1 || (s == n - 1 && j != L))
                continue;
            for (int i = (s == 0 ? 0 : s); i < j; i++) {
                if (s == 0 && i != 0)
                    break;
                double prev = s == 0 ? 0 : f[s - 1][i];
                if (!isfinite(prev))
                    continue;
                sched_stage t = st[s];
                t.layer_lo = i;
                t.layer_hi = j;
                if (sched_stage_fits(m, g, &t, min_kv_tokens, pp, NULL))
                    continue;
                double c = fmax(prev, stage_cost(m, g, t.tp, j - i, i == 0, j == L, pp));
                if (c < f[s][j]) {
                    f[s][j] = c;
                    arg[s][j] = (short)i;
                }
            }
        }
    }
    if (!isfinite(f[n - 1][L])) {
        double mem = 0;
        for (int s = 0; s < n; s++)
            mem += st[s].tp * sched_stage_memory_gb(&cat->gpus[st[s].type], &st[s]) * pp->mem_util;
        return md_errf(e, MD_ERANGE,
                       "%s (%.1f GB of weights) has no layer split over these %d stages "
                       "(%.1f GB usable) that leaves KV room for %.0f tokens per stage",
                       m->name, sched_model_params(m) * m->bytes_per_weight / 1e9, n, mem,
                       min_kv_tokens);
    }
    int j = L;
    for (int s = n - 1; s >= 0; s--) {
        int i = arg[s][j];
        st[s].layer_lo = i;
        st[s].layer_hi = j;
        j = i;
    }
    return 0;
}

static int push(sched_cands *cs, const sched_cand *c) {
    if (cs->n == cs->cap) {
        int cap = cs->cap ? cs->cap * 2 : 64;
        sched_cand *n = realloc(cs->c, (size_t)cap * sizeof *n);
        if (!n)
            return MD_ENOMEM;
        cs->c = n;
        cs->cap = cap;
    }
    cs->c[cs->n++] = *c;
    return 0;
}

/* The profile measured for (model, catalog type, tp), matched through aliases and driver
 * names, or NULL. */
static const sched_profile *profile_for(const sched_profiles *ps, const sched_catalog *cat,
                                        const char *model, int type, int tp) {
    for (int i = 0; ps && i < ps->n; i++)
        if (ps->p[i].tp == tp && !strcasecmp(ps->p[i].model, model) &&
            sched_profile_type(&ps->p[i], cat) == type)
            return &ps->p[i];
    return NULL;
}

/* Fill perf and serves for every class of the model; returns how many classes it serves. */
static int evaluate(sched_cand *c, const sched_demand *d, const sched_fleet *f,
                    const sched_catalog *cat, const sched_profiles *prof,
                    const sched_perf_params *pp_in) {
    /* Pipeline hops cost the fleet's inter-host latency (docs/scheduler.md §2). */
    sched_perf_params pq = *pp_in;
    pq.inter_host_latency_s = f->link_latency_s;
    const sched_perf_params *pp = &pq;
    const sched_profile *pr = NULL;
    if (c->nstages == 1)
        pr = profile_for(prof, cat, d->model.name, c->stages[0].type, c->stages[0].tp);
    int served = 0;
    c->best_tokens_per_usd = 0;
    for (int k = 0; k < d->nclasses; k++) {
        const sched_class *cl = &d->classes[k];
        c->serves[k] = 0;
        pq.slo_tpot_s = cl->tpot_ms / 1e3;
        pq.slo_ttft_s = cl->ttft_ms / 1e3;
        if (sched_perf_replica(&d->model, cat, c->stages, c->nstages, f->link_gbps, cl->input_mean,
                               cl->output_mean, pp, pr, &c->perf[k], NULL))
            continue;
        if (c->perf[k].kv_tokens < cl->max_tokens || !(c->perf[k].tokens_per_s > 0))
            continue;
        c->serves[k] = 1;
        served++;
        double tpu = c->usd_per_hour > 0 ? c->perf[k].tokens_per_s * 3600 / c->usd_per_hour
                                         : c->perf[k].tokens_per_s * 3600 / 1e-9;
        if (tpu > c->best_tokens_per_usd)
            c->best_tokens_per_usd = tpu;
    }
    return served;
}

static double max_class_tokens(const sched_demand *d, int smallest) {
    double v = smallest ? INFINITY : 0;
    for (int k = 0; k < d->nclasses; k++)
        v = smallest ? fmin(v, d->classes[k].max_tokens) : fmax(v, d->classes[k].max_tokens);
    return v;
}

static int cmp_tpu(const void *a, const void *b) {
    double x = ((const sched_cand *)a)->best_tokens_per_usd;
    double y = ((const sched_cand *)b)->best_tokens_per_usd;
    return (x < y) - (x > y);
}

/* TP groups of t GPUs a pool holds, each inside one host. */
static int pool_groups(const sched_pool *p, int t) {
    int full = p->count / p->gpus_per_host, rest = p->count % p->gpus_per_host;
    return full * (p->gpus_per_host / t) + rest / t;
}

/* Can a TP group of t GPUs of pool p run model m (host size, head counts)? */
static int tp_ok(const sched_pool *p, const sched_model *m, int t) {
    return t <= p->count && t <= p->gpus_per_host && m->heads % t == 0 && m->kv_heads % t == 0;
}

/* Device memory for weights of one TP group of t GPUs of pool p, bytes. */
static double group_usable_b(const sched_pool *p, int t, const sched_perf_params *pp) {
    return t * (p->memory_gb * pp->mem_util - pp->reserve_gb) * 1e9;
}

/* A stage of a TP group of tp GPUs of pool p of f, layers [lo, hi). */
static sched_stage pool_stage(const sched_fleet *f, int p, int tp, int lo, int hi) {
    return (sched_stage){f->pools[p].type, p, tp, lo, hi, f->pools[p].memory_gb};
}

/* "2xH100-SXM[0,78)+1xL4[78,80) PP"; a run of stages of one type and TP is written once,
 * "2x(2xH100-SXM)[0,40,80) PP" for two stages of 2 H100s. */
static void pp_label(sched_cand *c, const sched_catalog *cat) {
    size_t at = 0, n = sizeof c->label;
    c->label[0] = 0;
    for (int s = 0; s < c->nstages && at < n;) {
        int e = s + 1;
        while (e < c->nstages && c->stages[e].type == c->stages[s].type &&
               c->stages[e].tp == c->stages[s].tp)
            e++;
        const char *name = cat->gpus[c->stages[s].type].name;
        if (e - s > 1)
            at += (size_t)snprintf(c->label + at, n - at, "%s%dx(%dx%s)[%d", s ? "+" : "", e - s,
                                   c->stages[s].tp, name, c->stages[s].layer_lo);
        else
            at += (size_t)snprintf(c->label + at, n - at, "%s%dx%s[%d", s ? "+" : "",
                                   c->stages[s].tp, name, c->stages[s].layer_lo);
        for (int k = s; k < e && at < n; k++)
            at += (size_t)snprintf(c->label + at, n - at, ",%d", c->stages[k].layer_hi);
        if (at < n)
            at += (size_t)snprintf(c->label + at, n - at, ")");
        s = e;
    }
    if (at < n)
        snprintf(c->label + at, n - at, " PP");
}

/* Does a dominate b: no more GPUs of the same pools, every class b serves served at least
 * as many tokens per dollar (per GPU when free)? */
static int dominates(const sched_cand *a, const sched_cand *b, int nclasses) {
    if (a->gpus > b->gpus)
        return 0;
    for (int k = 0; k < nclasses; k++) {
        if (!b->serves[k])
            continue;
        if (!a->serves[k])
            return 0;
        double va = a->usd_per_hour > 0 ? a->perf[k].tokens_per_s / a->usd_per_hour
                                        : a->perf[k].tokens_per_s / a->gpus;
        double vb = b->usd_per_hour > 0 ? b->perf[k].tokens_per_s / b->usd_per_hour
                                        : b->perf[k].tokens_per_s / b->gpus;
        if (va < vb)
            return 0;
    }
    return 1;
}

/* Drop the candidates in cs->c[from, n) that another of them dominates (the later of two
 * equal ones). */
static void drop_dominated(sched_cands *cs, int from, int nclasses) {
    int keep = from;
    for (int i = from; i < cs->n; i++) {
        int dom = 0;
        for (int j = from; j < cs->n && !dom; j++)
            dom = j != i && dominates(&cs->c[j], &cs->c[i], nclasses) &&
                  (j < i || !dominates(&cs->c[i], &cs->c[j], nclasses));
        if (!dom)
            cs->c[keep++] = cs->c[i];
    }
    cs->n = keep;
}

/* Pipelines of TP groups of pool p alone, for a model no group inside one of its hosts
 * holds or holds with little KV room: per TP degree t, the fewest stages (2..SCHED_MAX_STAGES, each
 * a group inside one host) whose memory holds the weights and KV for the smallest class, and
 * EXTRA_STAGES more when the pool has the groups; then the dominated ones dropped. */
static int build_same_type_pp(sched_cands *cs, int mi, const sched_demand *d, int p,
                              const sched_fleet *f, const sched_catalog *cat,
                              const sched_profiles *prof, const sched_perf_params *pp) {
    static const int tps[] = {1, 2, 4, 8};
    const sched_pool *pl = &f->pools[p];
    double wbytes = sched_model_params(&d->model) * d->model.bytes_per_weight;
    double need_kv = max_class_tokens(d, 1);
    int first = cs->n;
    for (int ti = 0; ti < 4; ti++) {
        int t = tps[ti], made = 0;
        if (!tp_ok(pl, &d->model, t))
            continue;
        int groups = pool_groups(pl, t);
        for (int S = 2; S <= SCHED_MAX_STAGES && S <= groups && made <= EXTRA_STAGES; S++) {
            if (!made && S * group_usable_b(pl, t, pp) < wbytes * 1.05)
                continue;
            sched_cand c;
            memset(&c, 0, sizeof c);
            c.model = mi;
            c.nstages = S;
            for (int s = 0; s < S; s++)
                c.stages[s] = pool_stage(f, p, t, 0, 0);
            if (sched_layer_split(&d->model, cat, c.stages, S, need_kv, pp, NULL))
                continue;
            c.gpus = S * t;
            c.usd_per_hour = c.gpus * pl->usd_per_hour;
            made++;
            if (!evaluate(&c, d, f, cat, prof, pp))
                continue;
            pp_label(&c, cat);
            if (push(cs, &c))
                return MD_ENOMEM;
        }
    }
    drop_dominated(cs, first, d->nclasses);
    return 0;
}

static int build_model(sched_cands *cs, int mi, const sched_demand *d, const sched_fleet *f,
                       const sched_catalog *cat, const sched_profiles *prof,
                       const sched_perf_params *pp) {
    static const int tps[] = {1, 2, 4, 8};
    double need_kv = max_class_tokens(d, 1);
    /* Same-type groups; pipelines across the pool's hosts where none holds the model. */
    for (int p = 0; p < f->n; p++) {
        const sched_pool *pl = &f->pools[p];
        int served_mask_before = 0, min_fit = 0, first = cs->n;
        for (int ti = 0; ti < 4; ti++) {
            int tp = tps[ti];
            if (tp > pl->count || tp > pl->gpus_per_host || d->model.heads % tp ||
                d->model.kv_heads % tp)
                continue;
            sched_cand c;
            memset(&c, 0, sizeof c);
            c.model = mi;
            c.nstages = 1;
            c.stages[0] = pool_stage(f, p, tp, 0, d->model.layers);
            c.gpus = tp;
            c.usd_per_hour = tp * pl->usd_per_hour;
            if (!evaluate(&c, d, f, cat, prof, pp))
                continue;
            int mask = 0;
            for (int k = 0; k < d->nclasses; k++)
                mask |= c.serves[k] << k;
            if (!min_fit)
                min_fit = tp;
            /* Larger groups only when they serve more classes or are at most 2x the
             * smallest group that fits. */
            if (tp > 2 * min_fit && (mask & ~served_mask_before) == 0)
                continue;
            served_mask_before |= mask;
            snprintf(c.label, sizeof c.label, "%dx%s%s", tp, cat->gpus[pl->type].name,
                     tp > 1 ? " TP" : "");
            if (push(cs, &c))
                return MD_ENOMEM;
        }
        /* Pipelines across hosts where no group inside a host holds the model, or where the
         * largest one holds it with less room for KV than its weights take (an 80 GiB x 2
         * host holds Llama-3-70B BF16 with ~10 GB to spare: a small batch). */
        int tmax = 0;
        for (int ti = 0; ti < 4; ti++)
            if (tp_ok(pl, &d->model, tps[ti]))
                tmax = tps[ti];
        double wbytes_p = sched_model_params(&d->model) * d->model.bytes_per_weight;
        int tight = tmax > 0 && wbytes_p > 0.5 * group_usable_b(pl, tmax, pp);
        if ((cs->n == first || tight) && build_same_type_pp(cs, mi, d, p, f, cat, prof, pp))
            return MD_ENOMEM;
    }
    /* Pipelines over two pools of different types: k groups of the faster pool (one per
     * host when the groups fill hosts) then one of the other, k + 1 <= SCHED_MAX_STAGES;
     * the Pareto-minimal (TP a, TP b, k) whose memory holds the model, layers split by the
     * DP. k > 1 only where fewer groups of the faster pool cannot hold it with the other. */
    int first_mixed = cs->n;
    double wbytes = sched_model_params(&d->model) * d->model.bytes_per_weight;
    for (int a = 0; a < f->n; a++)
        for (int b = 0; b < f->n; b++) {
            const sched_pool *pa = &f->pools[a], *pb = &f->pools[b];
            if (a == b || pa->type == pb->type)
                continue;
            const sched_gpu_type *ga = &cat->gpus[pa->type], *gb = &cat->gpus[pb->type];
            /* Faster memory first (it also holds the embedding); each pair once. */
            if (ga->hbm_gbps < gb->hbm_gbps || (ga->hbm_gbps == gb->hbm_gbps && a > b))
                continue;
            int fits[4][4][SCHED_MAX_STAGES] = {{{0}}};
            for (int i = 0; i < 4; i++)
                for (int j = 0; j < 4; j++)
                    for (int k = 1; k < SCHED_MAX_STAGES; k++) {
                        int ta = tps[i], tb = tps[j];
                        if (!tp_ok(pa, &d->model, ta) || !tp_ok(pb, &d->model, tb) ||
                            k > pool_groups(pa, ta))
                            continue;
                        double mem = k * group_usable_b(pa, ta, pp) + group_usable_b(pb, tb, pp);
                        if (mem < wbytes * 1.05)
                            continue;
                        /* fits: this or a smaller (TP a, TP b, k) holds the model */
                        if ((i && fits[i - 1][j][k]) || (j && fits[i][j - 1][k]) ||
                            (k > 1 && fits[i][j][k - 1])) {
                            fits[i][j][k] = 1;
                            continue; /* not minimal */
                        }
                        sched_cand c;
                        memset(&c, 0, sizeof c);
                        c.model = mi;
                        c.nstages = k + 1;
                        for (int s = 0; s < k; s++)
                            c.stages[s] = pool_stage(f, a, ta, 0, 0);
                        c.stages[k] = pool_stage(f, b, tb, 0, 0);
                        if (sched_layer_split(&d->model, cat, c.stages, k + 1, need_kv, pp, NULL))
                            continue;
                        fits[i][j][k] = 1;
                        c.gpus = k * ta + tb;
                        c.usd_per_hour = k * ta * pa->usd_per_hour + tb * pb->usd_per_hour;
                        if (!evaluate(&c, d, f, cat, prof, pp))
                            continue;
                        pp_label(&c, cat);
                        if (push(cs, &c))
                            return MD_ENOMEM;
                    }
        }
    int nmixed = cs->n - first_mixed;
    if (nmixed > MIXED_KEEP) {
        qsort(cs->c + first_mixed, (size_t)nmixed, sizeof *cs->c, cmp_tpu);
        cs->n = first_mixed + MIXED_KEEP;
    }
    return 0;
}

/* Measured / modelled throughput of model d on a TP group of `tp` GPUs of `type`, as the
 * geometric mean over the classes profile pr answers: log-sum into *lsum, count into *n. */
static void calib_profile(const sched_demand *d, const sched_catalog *cat, int type, int tp,
                          const sched_profile *pr, const sched_perf_params *pp, double *lsum,
                          int *n) {
    sched_stage st = {type, -1, tp, 0, d->model.layers, 0};
    for (int k = 0; k < d->nclasses; k++) {
        const sched_class *cl = &d->classes[k];
        sched_perf meas, roof;
        if (sched_perf_replica(&d->model, cat, &st, 1, 12.5, cl->input_mean, cl->output_mean, pp,
                               pr, &meas, NULL) ||
            sched_perf_replica(&d->model, cat, &st, 1, 12.5, cl->input_mean, cl->output_mean, pp,
                               NULL, &roof, NULL))
            continue;
        if (strcmp(meas.bound, "profile") || !(roof.tokens_per_s > 0) || !(meas.tokens_per_s > 0))
            continue;
        *lsum += log(meas.tokens_per_s / roof.tokens_per_s);
        (*n)++;
    }
}

/* Check every profile against the catalog and the workload, compute the calibration
 * factor of each (model, type) into scale[m * cat->n + t] (1 where nothing was measured),
 * and note what each profile gave. */
static int calibrate(sched_cands *cs, const sched_workload *w, const sched_catalog *cat,
                     const sched_profiles *prof, const sched_perf_params *pp, double *scale,
                     md_err *e) {
    for (int i = 0; i < w->n * cat->n; i++)
        scale[i] = 1;
    for (int m = 0; m < w->n; m++)
        for (int t = 0; t < cat->n; t++) {
            double lsum = 0;
            int n = 0;
            for (int i = 0; prof && i < prof->n; i++) {
                const sched_profile *pr = &prof->p[i];
                if (strcasecmp(pr->model, w->models[m].model.name) ||
                    sched_profile_type(pr, cat) != t)
                    continue;
                double l1 = 0;
                int n1 = 0;
                calib_profile(&w->models[m], cat, t, pr->tp, pr, pp, &l1, &n1);
                /* a measurement far above the roofline is a wrong figure (a unit slip, a
                 * typo), not a fast card: planning on it claims demand served */
                if (n1 && exp(l1 / n1) > SCHED_PROFILE_MAX_RATIO)
                    return md_errf(e, MD_EINVAL,
                                   "profile %d (%s on %s, TP %d): its max_requests_per_s / "
                                   "max_output_tokens_per_s give %.0fx the roofline's throughput "
                                   "for this model and GPU; at most %gx is plausible (check the "
                                   "figures and their units)",
                                   i, pr->model, pr->device, pr->tp, exp(l1 / n1),
                                   SCHED_PROFILE_MAX_RATIO);
                lsum += l1;
                n += n1;
            }
            if (n) {
                scale[m * cat->n + t] = exp(lsum / n);
                json_array_append_new(
                    cs->notes, json_sprintf("%s on %s: measured throughput is %.2fx the roofline's "
                                            "over %d class(es); modelled candidates on %s are "
                                            "scaled by it",
                                            w->models[m].model.name, cat->gpus[t].name,
                                            exp(lsum / n), n, cat->gpus[t].name));
            }
        }
    for (int i = 0; prof && i < prof->n; i++) {
        const sched_profile *pr = &prof->p[i];
        int t = sched_profile_type(pr, cat), m = -1;
        if (t < 0) {
            char known[512] = "";
            size_t at = 0;
            for (int j = 0; j < cat->n && at < sizeof known; j++)
                at += (size_t)snprintf(known + at, sizeof known - at, "%s%s", j ? ", " : "",
                                       cat->gpus[j].name);
            return md_errf(e, MD_EINVAL,
                           "profile %d (%s on %s, TP %d): device '%s' is no GPU type of the "
                           "catalog, by name, alias or driver name (known: %s)",
                           i, pr->model, pr->device, pr->tp, pr->device, known);
        }
        char odd[128];
        if (sched_catalog_find(cat, pr->device) < 0 &&
            sched_catalog_unmatched_words(cat, t, pr->device, odd, sizeof odd))
            json_array_append_new(
                cs->notes, json_sprintf("profile %d: device '%s' is taken as %s, the closest "
                                        "catalog type, though %s %s not in its name; if it is "
                                        "another card, add it under the fleet's gpu_types",
                                        i, pr->device, cat->gpus[t].name, odd,
                                        strchr(odd, ' ') ? "are" : "is"));
        for (int j = 0; j < w->n && m < 0; j++)
            if (!strcasecmp(pr->model, w->models[j].model.name))
                m = j;
        if (m < 0) {
            json_array_append_new(cs->notes,
                                  json_sprintf("profile %d (%s on %s, TP %d) is not used: no "
                                               "model of the workload is named %s",
                                               i, pr->model, pr->device, pr->tp, pr->model));
            continue;
        }
        int used = 0;
        for (int c = 0; c < cs->n && !used; c++)
            for (int k = 0; k < SCHED_MAX_CLASSES && !used; k++)
                used = cs->c[c].model == m && cs->c[c].serves[k] && cs->c[c].nstages == 1 &&
                       cs->c[c].stages[0].type == t && cs->c[c].stages[0].tp == pr->tp &&
                       !strcmp(cs->c[c].perf[k].bound, "profile");
        if (!used)
            json_array_append_new(
                cs->notes,
                json_sprintf(
                    "profile %d (%s on %s = %s, TP %d) answers no candidate (no %d-GPU "
                    "%s group in the fleet, or no class inside its buckets)%s",
                    i, pr->model, pr->device, cat->gpus[t].name, pr->tp, pr->tp, cat->gpus[t].name,
                    scale[m * cat->n + t] != 1 ? "; it still calibrates the roofline" : ""));
    }
    return 0;
}

/* Scale the modelled classes of every candidate by its types' calibration, and say per
 * candidate where its numbers come from. */
static void apply_calibration(sched_cands *cs, const sched_workload *w, const sched_catalog *cat,
                              const double *scale) {
    for (int c = 0; c < cs->n; c++) {
        sched_cand *k = &cs->c[c];
        const sched_demand *d = &w->models[k->model];
        double f = INFINITY;
        int tf = -1;
        for (int s = 0; s < k->nstages; s++) {
            double v = scale[k->model * cat->n + k->stages[s].type];
            if (v != 1 && v < f) {
                f = v;
                tf = k->stages[s].type;
            }
        }
        int measured = 0, modelled = 0;
        k->best_tokens_per_usd = 0;
        for (int j = 0; j < d->nclasses; j++) {
            if (!k->serves[j])
                continue;
            sched_perf *x = &k->perf[j];
            if (!strcmp(x->bound, "profile")) {
                measured++;
            } else {
                modelled++;
                if (tf >= 0) {
                    x->scale = f;
                    x->tokens_per_s *= f;
                    x->requests_per_s *= f;
                    x->decode_step_s /= f;
                    x->prefill_s /= f;
                }
            }
            double tpu = x->tokens_per_s * 3600 / (k->usd_per_hour > 0 ? k->usd_per_hour : 1e-9);
            if (tpu > k->best_tokens_per_usd)
                k->best_tokens_per_usd = tpu;
        }
        if (measured && !modelled)
            snprintf(k->source, sizeof k->source, "measured");
        else if (tf >= 0)
            snprintf(k->source, sizeof k->source,
                     "%smodelled x%.2f (calibrated by measured profiles on %s)",
                     measured ? "measured+" : "", f, cat->gpus[tf].name);
        else
            snprintf(k->source, sizeof k->source, "%smodelled", measured ? "measured+" : "");
    }
}

int sched_cands_build(sched_cands *cs, const sched_workload *w, const sched_fleet *f,
                      const sched_catalog *cat, const sched_profiles *prof,
                      const sched_perf_params *pp, md_err *e) {
    memset(cs, 0, sizeof *cs);
    cs->notes = json_array();
    double *scale = calloc((size_t)(w->n * cat->n) + 1, sizeof *scale);
    if (!cs->notes || !scale) {
        free(scale);
        sched_cands_free(cs);
        return md_errf(e, MD_ENOMEM, "out of memory building candidates");
    }
    for (int m = 0; m < w->n; m++) {
        if (build_model(cs, m, &w->models[m], f, cat, prof, pp)) {
            free(scale);
            sched_cands_free(cs);
            return md_errf(e, MD_ENOMEM, "out of memory building candidates");
        }
    }
    if (calibrate(cs, w, cat, prof, pp, scale, e)) {
        free(scale);
        sched_cands_free(cs);
        return e->code;
    }
    apply_calibration(cs, w, cat, scale);
    free(scale);
    return 0;
}

void sched_cands_free(sched_cands *cs) {
    free(cs->c);
    json_decref(cs->notes);
    memset(cs, 0, sizeof *cs);
}
