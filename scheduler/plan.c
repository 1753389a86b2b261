/* plan.c — a plan as a document (schemas/plan.schema.json), its validity check, the
 * human table of `medley plan` and the tokens-per-dollar chart (SVG). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/util.h"
#include "scheduler/sched.h"

static double tokens_per_usd(double tps, double usd_h) {
    return usd_h > 0 ? tps * 3600 / usd_h : 0;
}

/* $/M tokens of a replica while it works. */
static double replica_usd_per_mtok(const sched_replica *r, const sched_cand *c, int nclasses) {
    double tps = sched_replica_tokens_per_s(r, c, nclasses);
    return tps > 0 ? c->usd_per_hour * r->busy / (tps * 3600) * 1e6 : 0;
}

/* GPUs the replicas hold (for a rent plan, the GPUs rented: not the fleet's size less its
 * idle ones, since a rent fleet lists types x max_per_type). */
static int plan_gpus(const sched_plan *p, const sched_cands *cs) {
    int n = 0;
    for (int i = 0; i < p->n; i++)
        n += cs->c[p->r[i].cand].gpus;
    return n;
}

json_t *sched_plan_to_json(const sched_plan *p, const sched_workload *w, const sched_fleet *f,
                           const sched_catalog *cat, const sched_cands *cs) {
    char ts[32];
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%SZ", &tm);
    json_t *doc =
        json_pack("{s:i, s:s, s:I, s:s, s:s, s:s}", "schema_version", 1, "kind", "medley.plan",
                  "version", (json_int_t)p->version, "created_at", ts, "objective",
                  p->objective ? "min_cost_to_deadline" : "max_tokens_per_usd", "fleet", f->name);
    json_t *classes = json_array();
    for (int m = 0; m < w->n; m++)
        for (int k = 0; k < w->models[m].nclasses; k++) {
            const sched_class *c = &w->models[m].classes[k];
            json_array_append_new(classes,
                                  json_pack("{s:s, s:s, s:i, s:f, s:f, s:f}", "model",
                                            w->models[m].model.name, "name", c->name, "max_tokens",
                                            c->max_tokens, "input_mean", c->input_mean,
                                            "output_mean", c->output_mean, "share", c->share));
        }
    json_object_set_new(doc, "classes", classes);
    json_t *reps = json_array();
    for (int i = 0; i < p->n; i++) {
        const sched_replica *r = &p->r[i];
        const sched_cand *c = &cs->c[r->cand];
        const sched_demand *d = &w->models[c->model];
        json_t *stages = json_array();
        int at = 0;
        for (int s = 0; s < c->nstages; s++) {
            json_t *ids = json_array();
            for (int g = 0; g < c->stages[s].tp; g++)
                json_array_append_new(ids, json_string(r->gpu_ids[at + g]));
            at += c->stages[s].tp;
            const sched_pool *pl = c->stages[s].pool >= 0 && c->stages[s].pool < f->n
                                       ? &f->pools[c->stages[s].pool]
                                       : NULL;
            json_array_append_new(stages,
                                  json_pack("{s:s, s:o, s:i, s:[i,i], s:f, s:s}", "gpu_type",
                                            cat->gpus[c->stages[s].type].name, "gpus", ids, "tp",
                                            c->stages[s].tp, "layers", c->stages[s].layer_lo,
                                            c->stages[s].layer_hi, "usd_per_gpu_hour",
                                            pl ? pl->usd_per_hour : 0.0, "price_source",
                                            pl && pl->price_from[0] ? pl->price_from : "catalog"));
        }
        json_t *served = json_array(), *routing = json_object(), *perf = json_object();
        json_t *steal = json_array(); /* held but not routed: taken when the routed are empty */
        for (int k = 0; k < d->nclasses; k++) {
            if (r->share[k] > 1e-9) {
                json_array_append_new(served, json_string(d->classes[k].name));
                json_object_set_new(routing, d->classes[k].name, json_real(r->share[k]));
            } else if (c->serves[k]) {
                json_array_append_new(steal, json_string(d->classes[k].name));
            }
            if (c->serves[k])
                json_object_set_new(
                    perf, d->classes[k].name,
                    json_pack("{s:f, s:f, s:i, s:s, s:s, s:f}", "tokens_per_s",
                              c->perf[k].tokens_per_s, "requests_per_s", c->perf[k].requests_per_s,
                              "batch", c->perf[k].batch, "bound", c->perf[k].bound, "source",
                              !strcmp(c->perf[k].bound, "profile") ? "measured"
                              : c->perf[k].scale != 1              ? "calibrated"
                                                                   : "modelled",
                              "calibration", c->perf[k].scale > 0 ? c->perf[k].scale : 1.0));
        }
        double tps = sched_replica_tokens_per_s(r, c, d->nclasses);
        char id[32];
        snprintf(id, sizeof id, "r%d", i);
        json_array_append_new(
            reps,
            json_pack("{s:s, s:s, s:s, s:s, s:o, s:o, s:o, s:o, s:o, s:f, s:f, s:f, s:f}", "id", id,
                      "model", d->model.name, "candidate", c->label, "throughput_source",
                      c->source[0] ? c->source : "modelled", "stages", stages, "classes", served,
                      "routing", routing, "steal", steal, "per_class", perf,
                      "predicted_tokens_per_s", tps, "busy", r->busy, "usd_per_hour",
                      c->usd_per_hour, "usd_per_mtok", replica_usd_per_mtok(r, c, d->nclasses)));
    }
    json_object_set_new(doc, "replicas", reps);
    json_t *models = json_array();
    for (int m = 0; m < p->nmodels; m++)
        json_array_append_new(models, json_pack("{s:s, s:f, s:f, s:f, s:b}", "model",
                                                w->models[m].model.name, "demand_tokens_per_s",
                                                p->models[m].demand_tps, "predicted_tokens_per_s",
                                                p->models[m].served_tps, "best_tokens_per_s",
                                                p->models[m].best_tps, "deadline_met",
                                                p->models[m].deadline_met));
    json_object_set_new(doc, "models", models);
    json_t *idle = json_array();
    for (int i = 0; i < p->nidle; i++)
        json_array_append_new(idle, json_string(p->idle[i]));
    json_object_set_new(doc, "idle_gpus", idle);
    json_object_set_new(
        doc, "totals",
        json_pack("{s:f, s:f, s:f, s:f, s:f, s:i, s:i, s:f}", "tokens_per_s", p->tokens_per_s,
                  "usd_per_hour", p->usd_per_hour, "busy_usd_per_hour", p->busy_usd_per_hour,
                  "usd_per_mtok",
                  p->tokens_per_s > 0 ? p->busy_usd_per_hour / (p->tokens_per_s * 3600) * 1e6 : 0.0,
                  "tokens_per_usd", tokens_per_usd(p->tokens_per_s, p->busy_usd_per_hour),
                  "gpus_used", plan_gpus(p, cs), "candidates", p->ncands, "solve_s", p->solve_s));
    json_object_set(doc, "notes", p->notes ? p->notes : json_array());
    return doc;
}

int sched_plan_validate(const sched_plan *p, const sched_workload *w, const sched_fleet *f,
                        const sched_catalog *cat, const sched_cands *cs,
                        const sched_perf_params *pp, md_err *e) {
    /* What the plan says it serves and costs, against its replicas. */
    if (sched_plan_check_claims(p, w, cs, e))
        return e->code;
    int total = sched_fleet_gpus(f);
    /* Each GPU id maps to (pool, index); mark use. */
    char *used = calloc((size_t)total + 1, 1);
    int *base = calloc((size_t)f->n + 1, sizeof *base);
    if (!used || !base) {
        free(used);
        free(base);
        return md_errf(e, MD_ENOMEM, "out of memory");
    }
    for (int i = 0; i < f->n; i++)
        base[i + 1] = base[i] + f->pools[i].count;
    int rc = 0;
    for (int i = 0; i < p->n && !rc; i++) {
        const sched_cand *c = &cs->c[p->r[i].cand];
        const sched_model *m = &w->models[c->model].model;
        int at = 0, next = 0;
        for (int s = 0; s < c->nstages && !rc; s++) {
            const sched_stage *st = &c->stages[s];
            if (st->layer_lo != next || st->layer_hi <= st->layer_lo)
                rc = md_errf(e, MD_EINVAL,
                             "replica r%d: stage %d covers layers [%d,%d), expected to start at %d",
                             i, s, st->layer_lo, st->layer_hi, next);
            next = st->layer_hi;
            if (!rc && sched_stage_fits(m, &cat->gpus[st->type], st, 0, pp, e))
                rc = md_errctx(e, "replica r%d: ", i);
            int host = -1;
            for (int g = 0; g < st->tp && !rc; g++) {
                const char *id = p->r[i].gpu_ids[at + g];
                const sched_pool *pl = &f->pools[st->pool];
                int h = -1, k = sched_pool_find_gpu(pl, id, &h);
                if (k < 0) {
                    rc = md_errf(e, MD_EINVAL, "replica r%d: GPU '%s' is not in pool %s", i, id,
                                 pl->name);
                    break;
                }
                if (used[base[st->pool] + k]) {
                    rc =
                        md_errf(e, MD_EINVAL, "GPU %s is used twice (again by replica r%d)", id, i);
                    break;
                }
                used[base[st->pool] + k] = 1;
                if (host >= 0 && h != host) {
                    char a[SCHED_ID];
                    int k0;
                    sched_pool_host(pl, host, &k0);
                    sched_pool_gpu_id(pl, k0, a);
                    rc = md_errf(e, MD_EINVAL,
                                 "replica r%d: a TP group spans two hosts (%s is on another host "
                                 "than %s)",
                                 i, id, a);
                }
                host = h;
            }
            at += st->tp;
        }
        if (!rc && next != m->layers)
            rc = md_errf(e, MD_EINVAL, "replica r%d: stages cover %d of %s's %d layers", i, next,
                         m->name, m->layers);
    }
    free(used);
    free(base);
    return rc;
}

void sched_plan_print_table(FILE *out, const sched_plan *p, const sched_workload *w,
                            const sched_catalog *cat, const sched_cands *cs) {
    fprintf(out, "%-5s %-14s %-36s %-22s %-22s %10s %9s %6s\n", "rep", "model", "GPUs", "layers",
            "classes", "tok/s", "$/Mtok", "busy");
    for (int i = 0; i < p->n; i++) {
        const sched_replica *r = &p->r[i];
        const sched_cand *c = &cs->c[r->cand];
        const sched_demand *d = &w->models[c->model];
        char gpus[256] = "", layers[64] = "", cls[128] = "";
        size_t a = 0, b = 0, k2 = 0;
        int at = 0;
        for (int s = 0; s < c->nstages; s++) {
            a += (size_t)snprintf(gpus + a, sizeof gpus - (a < sizeof gpus ? a : sizeof gpus),
                                  "%s%dx%s(%s%s)", s ? "+" : "", c->stages[s].tp,
                                  cat->gpus[c->stages[s].type].name, r->gpu_ids[at],
                                  c->stages[s].tp > 1 ? ".." : "");
            b += (size_t)snprintf(
                layers + b, sizeof layers - (b < sizeof layers ? b : sizeof layers), "%s[%d,%d)",
                s ? "+" : "", c->stages[s].layer_lo, c->stages[s].layer_hi);
            at += c->stages[s].tp;
        }
        for (int k = 0; k < d->nclasses; k++)
            if (r->share[k] > 1e-9)
                k2 += (size_t)snprintf(cls + k2, sizeof cls - (k2 < sizeof cls ? k2 : sizeof cls),
                                       "%s%s:%.0f%%", k2 ? "," : "", d->classes[k].name,
                                       100 * r->share[k]);
        double tps = sched_replica_tokens_per_s(r, c, d->nclasses);
        fprintf(out, "r%-4d %-14s %-36s %-22s %-22s %10.0f %9.3f %5.0f%%\n", i, d->model.name, gpus,
                layers, cls[0] ? cls : "-", tps, replica_usd_per_mtok(r, c, d->nclasses),
                100 * r->busy);
    }
    fprintf(out, "\n%-14s %14s %14s %14s %s\n", "model", "demand tok/s", "plan tok/s", "best tok/s",
            "deadline");
    for (int m = 0; m < p->nmodels; m++)
        fprintf(out, "%-14s %14.0f %14.0f %14.0f %s\n", w->models[m].model.name,
                p->models[m].demand_tps, p->models[m].served_tps, p->models[m].best_tps,
                p->models[m].demand_tps <= 0 ? "-"
                : p->models[m].deadline_met  ? "met"
                                             : "MISSED");
    fprintf(out,
            "\ntotal: %.0f tok/s, $%.2f/h with every replica on ($%.2f/h while working), $%.4f/M "
            "tokens, %.0f tokens/$; %d replicas, %d idle GPUs; %d candidates, solved in %.3f s\n",
            p->tokens_per_s, p->usd_per_hour, p->busy_usd_per_hour,
            p->tokens_per_s > 0 ? p->busy_usd_per_hour / (p->tokens_per_s * 3600) * 1e6 : 0.0,
            tokens_per_usd(p->tokens_per_s, p->busy_usd_per_hour), p->n, p->nidle, p->ncands,
            p->solve_s);
    if (p->nidle) {
        fprintf(out, "idle:");
        for (int i = 0; i < p->nidle && i < 32; i++)
            fprintf(out, " %s", p->idle[i]);
        fprintf(out, "%s\n", p->nidle > 32 ? " ..." : "");
    }
    size_t i;
    json_t *n;
    json_array_foreach(p->notes, i, n) fprintf(out, "note: %s\n", json_string_value(n));
}

int sched_plan_svg(const char *path, const sched_plan *p, const sched_workload *w,
                   const sched_cands *cs, md_err *e) {
    FILE *f = fopen(path, "w");
    if (!f)
        return md_errf(e, MD_EIO, "cannot write %s", path);
    /* One bar per candidate (its best class's tokens per dollar) and one for the plan. */
    int n = cs->n + 1;
    double maxv = tokens_per_usd(p->tokens_per_s, p->busy_usd_per_hour);
    for (int c = 0; c < cs->n; c++)
        maxv = fmax(maxv, cs->c[c].best_tokens_per_usd);
    if (maxv <= 0)
        maxv = 1;
    int row = 18, left = 330, width = 420;
    fprintf(
        f,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
        "font-family=\"sans-serif\" font-size=\"11\">\n"
        "<text x=\"4\" y=\"14\" font-size=\"13\">tokens per dollar: candidates (best class) and "
        "the chosen plan</text>\n",
        left + width + 110, 30 + n * row);
    for (int i = 0; i < n; i++) {
        double v;
        char label[160];
        const char *color = "#6b8fb5";
        if (i < cs->n) {
            v = cs->c[i].best_tokens_per_usd;
            snprintf(label, sizeof label, "%s: %s", w->models[cs->c[i].model].model.name,
                     cs->c[i].label);
        } else {
            v = tokens_per_usd(p->tokens_per_s, p->busy_usd_per_hour);
            snprintf(label, sizeof label, "plan (%d replicas)", p->n);
            color = "#d0743c";
        }
        int y = 24 + i * row;
        fprintf(f, "<text x=\"4\" y=\"%d\">", y + 12);
        for (const char *s = label; *s; s++) {
            if (*s == '<')
                fputs("&lt;", f);
            else if (*s == '&')
                fputs("&amp;", f);
            else
                fputc(*s, f);
        }
        fprintf(f,
                "</text>\n<rect x=\"%d\" y=\"%d\" width=\"%.1f\" height=\"%d\" fill=\"%s\"/>\n"
                "<text x=\"%.1f\" y=\"%d\">%.3g</text>\n",
                left, y + 2, width * v / maxv, row - 4, color, left + width * v / maxv + 4, y + 12,
                v);
    }
    fprintf(f, "</svg>\n");
    int bad = ferror(f);
    if (fclose(f) || bad)
        return md_errf(e, MD_EIO, "writing %s failed", path);
    return 0;
}
