/* workload.c — what the fleet must serve: per model a backlog (requests, deadline) and/or an
 * arrival rate, split into request-size classes (mean prompt and output tokens, a bound on
 * prompt + max output tokens, the share of requests). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "scheduler/sched.h"

static const char *const CLASS_KEYS[] = {"name",  "input_mean", "output_mean", "max_tokens",
                                         "share", "tpot_ms",    "ttft_ms",     NULL};
static const char *const DEMAND_KEYS[] = {
    "model",      "model_file",  "priority",   "requests", "rate_rps", "deadline_s", "classes",
    "input_mean", "output_mean", "max_tokens", "tpot_ms",  "ttft_ms",  NULL};
static const char *const WORKLOAD_KEYS[] = {"version", "kind",   "seed", "horizon_s",
                                            "billing", "models", NULL};

/* A class; embedding (an embedding model's): output_mean may be left out and must be 0 (no
 * token is generated), and a TPOT SLO means nothing. */
static int parse_class(json_t *c, sched_class *k, int embedding, const char *where, md_err *e) {
    const char *name = NULL;
    long long maxt = 0;
    memset(k, 0, sizeof *k);
    if (md_json_check_keys(c, CLASS_KEYS, where, e))
        return e->code;
    if (md_json_get_str(c, "name", 1, &name, where, e) ||
        md_json_get_num(c, "input_mean", 1, &k->input_mean, where, e) ||
        md_json_get_num(c, "output_mean", !embedding, &k->output_mean, where, e) ||
        md_json_get_int(c, "max_tokens", 0, &maxt, where, e))
        return e->code;
    k->share = 1;
    if (md_json_get_num(c, "share", 0, &k->share, where, e) ||
        md_json_get_num(c, "tpot_ms", 0, &k->tpot_ms, where, e) ||
        md_json_get_num(c, "ttft_ms", 0, &k->ttft_ms, where, e))
        return e->code;
    if ((json_object_get(c, "tpot_ms") && !(k->tpot_ms > 0 && k->tpot_ms <= 1e6)) ||
        (json_object_get(c, "ttft_ms") && !(k->ttft_ms > 0 && k->ttft_ms <= 1e8)))
        return md_errf(e, MD_EINVAL,
                       "%s: tpot_ms must be in (0, 1e6] and ttft_ms in (0, 1e8] milliseconds",
                       where);
    if (strlen(name) >= SCHED_NAME || !*name)
        return md_errf(e, MD_EINVAL, "%s.name must be 1..%d characters", where, SCHED_NAME - 1);
    snprintf(k->name, sizeof k->name, "%s", name);
    if (embedding && k->output_mean != 0)
        return md_errf(e, MD_EINVAL,
                       "%s.output_mean is %g: an embedding model generates no token (give 0 or "
                       "leave it out)",
                       where, k->output_mean);
    if (embedding && json_object_get(c, "tpot_ms"))
        return md_errf(e, MD_EINVAL,
                       "%s.tpot_ms: an embedding model generates no token (ttft_ms bounds the "
                       "time of a step)",
                       where);
    if (!(k->input_mean >= 1 && k->input_mean <= 1e7 &&
          ((embedding && k->output_mean == 0) || (k->output_mean >= 1 && k->output_mean <= 1e7))))
        return md_errf(e, MD_EINVAL, "%s: input_mean and output_mean must be in [1, 1e7] tokens",
                       where);
    if (!(k->share > 0 && k->share <= 1e9))
        return md_errf(e, MD_EINVAL, "%s.share must be positive", where);
    if (json_object_get(c, "max_tokens") && (maxt < 1 || maxt > SCHED_MAX_TOKENS))
        return md_errf(e, MD_EINVAL, "%s.max_tokens must be in [1, %d] tokens (got %lld)", where,
                       SCHED_MAX_TOKENS, maxt);
    k->max_tokens = maxt ? (int)maxt : (int)ceil(2 * (k->input_mean + k->output_mean));
    if (k->max_tokens < k->input_mean + k->output_mean)
        return md_errf(e, MD_EINVAL,
                       "%s.max_tokens (%d) must be at least input_mean + output_mean (%.0f)", where,
                       k->max_tokens, k->input_mean + k->output_mean);
    return 0;
}

static int parse_demand(json_t *j, sched_demand *d, const char *where, md_err *e) {
    memset(d, 0, sizeof *d);
    if (md_json_check_keys(j, DEMAND_KEYS, where, e))
        return e->code;
    json_t *model = json_object_get(j, "model");
    json_t *file = json_object_get(j, "model_file");
    char w[128];
    snprintf(w, sizeof w, "%s.model", where);
    if (json_is_string(file)) {
        if (sched_model_from_gguf(json_string_value(file), json_string_value(model), &d->model, e))
            return md_errctx(e, "%s.model_file: ", where);
    } else if (file) {
        return md_errf(e, MD_EINVAL,
                       "%s.model_file must be a path to a GGUF file or a Hugging Face directory",
                       where);
    } else if (json_is_string(model)) {
        if (sched_model_builtin(json_string_value(model), &d->model, e))
            return md_errctx(e, "%s: ", w);
    } else if (json_is_object(model)) {
        if (sched_model_from_json(model, &d->model, w, e))
            return e->code;
    } else {
        return md_errf(e, MD_EINVAL, "%s is required: a built-in model name or a model card", w);
    }
    d->priority = 1;
    if (md_json_get_num(j, "priority", 0, &d->priority, where, e) ||
        md_json_get_num(j, "requests", 0, &d->requests, where, e) ||
        md_json_get_num(j, "rate_rps", 0, &d->rate_rps, where, e) ||
        md_json_get_num(j, "deadline_s", 0, &d->deadline_s, where, e))
        return e->code;
    /* 0 once meant "no deadline" without a word; leave the field out for that */
    if (json_object_get(j, "deadline_s") && !(d->deadline_s > 0))
        return md_errf(e, MD_EINVAL,
                       "%s.deadline_s must be a positive number of seconds (got %g); leave it "
                       "out for no deadline",
                       where, d->deadline_s);
    if (!(d->priority > 0 && d->priority <= 1e6) || d->requests < 0 || d->requests > 1e10 ||
        d->rate_rps < 0 || d->rate_rps > 1e7 || !(d->deadline_s >= 0 && d->deadline_s <= 1e9))
        return md_errf(e, MD_EINVAL,
                       "%s: priority must be in (0, 1e6], requests in [0, 1e10], rate_rps in "
                       "[0, 1e7] and deadline_s in [0, 1e9]",
                       where);
    if (d->requests == 0 && d->rate_rps == 0)
        return md_errf(e, MD_EINVAL, "%s: give a backlog (\"requests\") or a \"rate_rps\"", where);
    json_t *classes = json_object_get(j, "classes");
    if (classes) {
        if (!json_is_array(classes) || json_array_size(classes) == 0 ||
            json_array_size(classes) > SCHED_MAX_CLASSES)
            return md_errf(e, MD_EINVAL, "%s.classes must be an array of 1..%d classes", where,
                           SCHED_MAX_CLASSES);
        size_t i;
        json_t *c;
        double tot = 0;
        json_array_foreach(classes, i, c) {
            snprintf(w, sizeof w, "%s.classes[%zu]", where, i);
            if (parse_class(c, &d->classes[i], d->model.embedding, w, e))
                return e->code;
            for (size_t k = 0; k < i; k++)
                if (!strcmp(d->classes[k].name, d->classes[i].name))
                    return md_errf(e, MD_EINVAL, "%s.name '%s' is used twice", w,
                                   d->classes[i].name);
            tot += d->classes[i].share;
        }
        d->nclasses = (int)json_array_size(classes);
        for (int k = 0; k < d->nclasses; k++)
            d->classes[k].share /= tot;
    } else {
        sched_class *k = &d->classes[0];
        snprintf(k->name, sizeof k->name, "all");
        if (md_json_get_num(j, "input_mean", 1, &k->input_mean, where, e) ||
            md_json_get_num(j, "output_mean", !d->model.embedding, &k->output_mean, where, e))
            return md_errctx(e, "(or give \"classes\") ");
        json_t *c = json_pack("{s:s, s:f, s:f}", "name", "all", "input_mean", k->input_mean,
                              "output_mean", k->output_mean);
        static const char *const pass[] = {"max_tokens", "tpot_ms", "ttft_ms"};
        for (int i = 0; i < 3; i++)
            if (json_object_get(j, pass[i]))
                json_object_set(c, pass[i], json_object_get(j, pass[i]));
        int rc = parse_class(c, k, d->model.embedding, where, e);
        json_decref(c);
        if (rc)
            return rc;
        d->nclasses = 1;
    }
    for (int k = 0; k < d->nclasses; k++)
        if (d->classes[k].max_tokens > d->model.max_context)
            return md_errf(e, MD_ERANGE,
                           "%s: class '%s' allows %d tokens per request but %s's context is %d",
                           where, d->classes[k].name, d->classes[k].max_tokens, d->model.name,
                           d->model.max_context);
    return 0;
}

int sched_workload_billing(sched_workload *w, const char *billing, const char *where, md_err *e) {
    if (billing && !strcmp(billing, "busy"))
        w->bill_to_finish = 0;
    else if (billing && !strcmp(billing, "until_deadline"))
        w->bill_to_finish = 1;
    else
        return md_errf(e, MD_EINVAL, "%s must be \"busy\" or \"until_deadline\" (got %s)", where,
                       billing ? billing : "not a string");
    return 0;
}

int sched_workload_from_json(sched_workload *w, json_t *doc, md_err *e) {
    memset(w, 0, sizeof *w);
    w->horizon_s = 3600;
    w->seed = 1;
    if (!json_is_object(doc))
        return md_errf(e, MD_EFORMAT, "workload: the document must be a JSON object");
    if (md_json_check_keys(doc, WORKLOAD_KEYS, "workload", e))
        return e->code;
    long long seed = 1;
    if (md_json_get_num(doc, "horizon_s", 0, &w->horizon_s, "workload", e) ||
        md_json_get_int(doc, "seed", 0, &seed, "workload", e))
        return e->code;
    if (!(w->horizon_s >= 1 && w->horizon_s <= 1e8))
        return md_errf(e, MD_EINVAL, "workload.horizon_s must be in [1, 1e8] seconds (got %.3g)",
                       w->horizon_s);
    w->seed = (unsigned)seed;
    json_t *bill = json_object_get(doc, "billing");
    if (bill && sched_workload_billing(w, json_string_value(bill), "workload.billing", e))
        return e->code;
    json_t *models = json_object_get(doc, "models");
    if (!json_is_array(models) || json_array_size(models) == 0 || json_array_size(models) > 1000)
        return md_errf(e, MD_EFORMAT,
                       "workload: \"models\" must be an array of 1..1000 {model, requests | "
                       "rate_rps, classes | input_mean+output_mean}");
    w->models = calloc(json_array_size(models), sizeof *w->models);
    if (!w->models)
        return md_errf(e, MD_ENOMEM, "out of memory");
    size_t i;
    json_t *j;
    json_array_foreach(models, i, j) {
        char where[64];
        snprintf(where, sizeof where, "workload.models[%zu]", i);
        if (parse_demand(j, &w->models[i], where, e)) {
            sched_workload_free(w);
            return e->code;
        }
        w->models[i].finish_s =
            w->models[i].deadline_s > 0 ? w->models[i].deadline_s : w->horizon_s;
        for (size_t k = 0; k < i; k++)
            if (!strcmp(w->models[k].model.name, w->models[i].model.name)) {
                md_errf(e, MD_EINVAL, "%s: model '%s' is listed twice", where,
                        w->models[i].model.name);
                sched_workload_free(w);
                return e->code;
            }
        w->n++;
    }
    return 0;
}

int sched_workload_load(sched_workload *w, const char *path, md_err *e) {
    json_t *doc = sched_json_load(path, e);
    if (!doc)
        return e->code;
    int rc = sched_workload_from_json(w, doc, e);
    json_decref(doc);
    if (rc)
        md_errctx(e, "%s: ", path);
    return rc;
}

void sched_workload_free(sched_workload *w) {
    free(w->models);
    memset(w, 0, sizeof *w);
}

double sched_demand_tokens_per_request(const sched_demand *d) {
    double t = 0;
    for (int k = 0; k < d->nclasses; k++)
        t += d->classes[k].share * (d->classes[k].input_mean + d->classes[k].output_mean);
    return t;
}

double sched_demand_tokens_per_s(const sched_demand *d) {
    double rps = d->rate_rps;
    if (d->finish_s > 0)
        rps += d->requests / d->finish_s;
    return rps * sched_demand_tokens_per_request(d);
}
