/* assign.c — see assign.h: a worker's models and class streams read from the plan. */
#include "worker/assign.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

static int model_name_check(const char *m, const char *where, md_err *e) {
    size_t n = strlen(m);
    if (n == 0 || n >= Q_MODEL_NAME)
        return md_errf(e, MD_EINVAL, "plan: %s: model name must be 1..%d characters", where,
                       Q_MODEL_NAME - 1);
    for (size_t i = 0; i < n; i++)
        if (m[i] == '{' || m[i] == '}' || !isgraph((unsigned char)m[i]))
            return md_errf(e, MD_EINVAL, "plan: %s: model name '%s' may not hold braces or spaces",
                           where, m);
    return 0;
}

int wk_gpu_of_worker(const char *gpu, const char *worker) {
    size_t n = strlen(worker);
    if (n == 0)
        return 0;
    /* The scheduler names pools after the heartbeat key's tail, hash tag included:
     * "{W}/<i>"; a plan written by hand may say "W/<i>". */
    const char *rest = NULL;
    if (gpu[0] == '{' && !strncmp(gpu + 1, worker, n) && gpu[n + 1] == '}')
        rest = gpu + n + 2;
    else if (!strncmp(gpu, worker, n))
        rest = gpu + n;
    else
        return 0;
    if (*rest == '#') { /* "<W>#<type>/<i>" */
        rest = strrchr(rest, '/');
        if (!rest)
            return 0;
    }
    if (*rest != '/' || !rest[1])
        return 0;
    for (const char *p = rest + 1; *p; p++)
        if (!isdigit((unsigned char)*p))
            return 0;
    return 1;
}

/* The index of the first stage of rep that names one of worker's devices, or -1. */
static int stage_of(const json_t *rep, const char *worker) {
    size_t i, j;
    json_t *st, *g;
    json_array_foreach(json_object_get(rep, "stages"), i, st)
        json_array_foreach(json_object_get(st, "gpus"), j, g) {
        const char *s = json_string_value(g);
        if (s && wk_gpu_of_worker(s, worker))
            return (int)i;
    }
    return -1;
}

/* rep as a pipeline over workers: 1 with p filled when it has two or more stages that each
 * name one GPU, 0 when it is served whole, MD_EINVAL when a pipeline's id or layers are
 * malformed (they become Redis keys and engine stages). */
static int as_pipeline(const json_t *rep, const char *where, wk_pipe *p, md_err *e) {
    json_t *stages = json_object_get(rep, "stages");
    size_t n = json_array_size(stages), i;
    json_t *st;
    memset(p, 0, sizeof *p);
    if (n < 2)
        return 0;
    json_array_foreach(stages, i, st) {
        if (json_array_size(json_object_get(st, "gpus")) != 1)
            return 0;
    }
    if (n > WK_PIPE_MAX)
        return md_errf(e, MD_EINVAL, "plan: %s has %zu stages; at most %d", where, n, WK_PIPE_MAX);
    const char *id = json_string_value(json_object_get(rep, "id"));
    size_t len = id ? strlen(id) : 0;
    int ok = len > 0 && len < WK_REPLICA_ID;
    for (size_t k = 0; ok && k < len; k++)
        ok = id[k] != '{' && id[k] != '}' && isgraph((unsigned char)id[k]);
    if (!ok)
        return md_errf(e, MD_EINVAL,
                       "plan: %s is a pipeline over workers: its id must be 1..%d printable "
                       "characters without braces or spaces (it names Redis keys)",
                       where, WK_REPLICA_ID - 1);
    snprintf(p->replica, sizeof p->replica, "%s", id);
    json_array_foreach(stages, i, st) {
        json_t *l = json_object_get(st, "layers");
        json_t *lo = json_array_get(l, 0), *hi = json_array_get(l, 1);
        int want = i ? p->hi[i - 1] : 0;
        if (json_array_size(l) != 2 || !json_is_integer(lo) || !json_is_integer(hi) ||
            json_integer_value(lo) != want || json_integer_value(hi) <= want ||
            json_integer_value(hi) > 100000)
            return md_errf(e, MD_EINVAL,
                           "plan: %s.stages[%zu].layers must be [%d, last) with last > %d: the "
                           "stages of a pipeline cover the layers in order from 0",
                           where, i, want, want);
        p->lo[i] = want;
        p->hi[i] = (int)json_integer_value(hi);
    }
    p->n_stages = (int)n;
    return 1;
}

/* A replica's "steal" classes (absent: none) into a->steal, once each. 0 or MD_EINVAL. */
static int add_steal(wk_assign *a, json_t *steal, const char *where, md_err *e) {
    size_t j;
    json_t *c;
    if (steal && !json_is_array(steal))
        return md_errf(e, MD_EINVAL, "plan: %s.steal is not an array", where);
    json_array_foreach(steal, j, c) {
        const char *name = json_string_value(c);
        int rc;
        if (!name)
            return md_errf(e, MD_EINVAL, "plan: %s.steal[%zu] is not a string", where, j);
        if ((rc = q_class_name_check(name, e)))
            return rc;
        int seen = 0;
        for (int k = 0; k < a->n_steal; k++)
            seen |= !strcmp(a->steal[k], name);
        if (!seen && a->n_steal < Q_CLASS_MAX)
            snprintf(a->steal[a->n_steal++], Q_CLASS_NAME, "%s", name);
    }
    return 0;
}

/* Drop from a's steal classes those it reads anyway. */
static void steal_minus_classes(wk_assign *a) {
    int kept = 0;
    for (int k = 0; k < a->n_steal; k++) {
        int routed = 0;
        for (int c = 0; c < a->n_classes; c++)
            routed |= !strcmp(a->classes[c], a->steal[k]);
        if (!routed && kept != k)
            memcpy(a->steal[kept], a->steal[k], Q_CLASS_NAME);
        kept += !routed;
    }
    a->n_steal = kept;
}

int wk_plan_assignment(const json_t *plan, const char *worker, wk_assign out[WK_ASSIGN_MAX],
                       md_err *e) {
    json_t *reps = json_object_get(plan, "replicas");
    if (!json_is_array(reps))
        return md_errf(e, MD_EINVAL, "plan: replicas is not an array");
    int n = 0;
    int whole[WK_ASSIGN_MAX] = {0}; /* a replica gives out[k]'s model whole */
    size_t i;
    json_t *rep;
    json_array_foreach(reps, i, rep) {
        char where[48];
        snprintf(where, sizeof where, "replicas[%zu]", i);
        const char *model = json_string_value(json_object_get(rep, "model"));
        if (!model || !json_is_array(json_object_get(rep, "stages")))
            return md_errf(e, MD_EINVAL, "plan: %s needs a model and stages", where);
        int at = stage_of(rep, worker);
        if (at < 0)
            continue;
        wk_pipe pipe;
        int rc = as_pipeline(rep, where, &pipe, e);
        if (rc < 0)
            return rc;
        if (rc == 1 && at > 0)
            continue; /* a stage role (wk_plan_roles): the head reads the streams */
        if ((rc = model_name_check(model, where, e)))
            return rc;
        wk_assign *a = NULL;
        for (int k = 0; k < n && !a; k++)
            if (!strcmp(out[k].model, model))
                a = &out[k];
        if (!a) {
            if (n == WK_ASSIGN_MAX)
                return md_errf(e, MD_EINVAL, "plan: worker %s is given more than %d models", worker,
                               WK_ASSIGN_MAX);
            a = &out[n++];
            memset(a, 0, sizeof *a);
            snprintf(a->model, sizeof a->model, "%s", model);
        }
        if (pipe.n_stages == 0)
            whole[a - out] = 1;
        if (whole[a - out])
            a->pipe.n_stages = 0;
        else if (a->pipe.n_stages == 0)
            a->pipe = pipe;
        const char *id = json_string_value(json_object_get(rep, "id"));
        size_t used = strlen(a->replicas);
        snprintf(a->replicas + used, sizeof a->replicas - used, "%s%s", used ? "," : "",
                 id ? id : where);
        if ((rc = add_steal(a, json_object_get(rep, "steal"), where, e)))
            return rc;
        json_t *cls = json_object_get(rep, "classes");
        size_t j;
        json_t *c;
        json_array_foreach(cls, j, c) {
            const char *name = json_string_value(c);
            if (!name || (rc = q_class_name_check(name, e)))
                return name ? rc
                            : md_errf(e, MD_EINVAL, "plan: %s.classes[%zu] is not a string", where,
                                      j);
            int seen = 0;
            for (int k = 0; k < a->n_classes; k++)
                seen |= !strcmp(a->classes[k], name);
            if (seen)
                continue;
            if (a->n_classes == Q_CLASS_MAX)
                return md_errf(e, MD_EINVAL, "plan: model %s has more than %d classes", model,
                               Q_CLASS_MAX);
            snprintf(a->classes[a->n_classes++], Q_CLASS_NAME, "%s", name);
        }
    }
    /* A class of the model that no replica of the plan lists (a replica planned with no
     * share of any class lists none) would strand its stream: every worker of the model
     * reads it. */
    for (int k = 0; k < n; k++) {
        q_class cls[Q_CLASS_MAX];
        int nc = q_plan_classes(plan, out[k].model, cls, e);
        if (nc < 0)
            return nc;
        for (int c = 0; c < nc; c++) {
            int listed = 0;
            json_array_foreach(reps, i, rep) {
                const char *model = json_string_value(json_object_get(rep, "model"));
                size_t j;
                json_t *x;
                if (strcmp(model, out[k].model))
                    continue;
                json_array_foreach(json_object_get(rep, "classes"), j, x) {
                    const char *xs = json_string_value(x);
                    listed |= xs && !strcmp(xs, cls[c].name);
                }
            }
            int have = 0;
            for (int h = 0; h < out[k].n_classes; h++)
                have |= !strcmp(out[k].classes[h], cls[c].name);
            if (!listed && !have) {
                if (out[k].n_classes == Q_CLASS_MAX)
                    return md_errf(e, MD_EINVAL, "plan: model %s has more than %d classes",
                                   out[k].model, Q_CLASS_MAX);
                snprintf(out[k].classes[out[k].n_classes++], Q_CLASS_NAME, "%s", cls[c].name);
            }
        }
    }
    for (int k = 0; k < n; k++)
        steal_minus_classes(&out[k]);
    return n;
}

int wk_plan_roles(const json_t *plan, const char *worker, wk_role out[WK_ROLES_MAX], md_err *e) {
    json_t *reps = json_object_get(plan, "replicas");
    if (!json_is_array(reps))
        return md_errf(e, MD_EINVAL, "plan: replicas is not an array");
    int n = 0;
    size_t i;
    json_t *rep;
    json_array_foreach(reps, i, rep) {
        char where[48];
        snprintf(where, sizeof where, "replicas[%zu]", i);
        const char *model = json_string_value(json_object_get(rep, "model"));
        if (!model || !json_is_array(json_object_get(rep, "stages")))
            return md_errf(e, MD_EINVAL, "plan: %s needs a model and stages", where);
        wk_pipe pipe;
        int rc = as_pipeline(rep, where, &pipe, e);
        if (rc < 0)
            return rc;
        if (rc == 0)
            continue;
        /* every later stage naming this worker (one device each: normally one of them) */
        size_t k;
        json_t *st;
        json_array_foreach(json_object_get(rep, "stages"), k, st) {
            const char *g = json_string_value(json_array_get(json_object_get(st, "gpus"), 0));
            if (k == 0 || !g || !wk_gpu_of_worker(g, worker))
                continue;
            if ((rc = model_name_check(model, where, e)))
                return rc;
            if (n == WK_ROLES_MAX)
                return md_errf(e, MD_EINVAL, "plan: worker %s is given more than %d stages", worker,
                               WK_ROLES_MAX);
            wk_role *r = &out[n++];
            memset(r, 0, sizeof *r);
            snprintf(r->model, sizeof r->model, "%s", model);
            snprintf(r->replica, sizeof r->replica, "%s", pipe.replica);
            r->stage = (int)k;
            r->lo = pipe.lo[k];
            r->hi = pipe.hi[k];
        }
    }
    return n;
}
