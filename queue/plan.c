/* plan.c — see plan.h: classes and worker assignments read from the scheduler's plan. */
#include "queue/plan.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "queue/queue.h"

int q_class_name_check(const char *name, md_err *e) {
    size_t n = strlen(name);
    if (n == 0 || n >= Q_CLASS_NAME)
        return md_errf(e, MD_EINVAL, "plan: class name '%s' must be 1..%d characters", name,
                       Q_CLASS_NAME - 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)name[i];
        if (!isalnum(c) && c != '_' && c != '-' && c != '.')
            return md_errf(e, MD_EINVAL, "plan: class name '%s' may hold only [A-Za-z0-9_.-]",
                           name);
    }
    return 0;
}

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

int q_plan_get(md_redis *r, const char *prefix, json_t **plan, md_err *e) {
    *plan = NULL;
    char key[Q_KEY_MAX];
    snprintf(key, sizeof key, "%splan", prefix);
    redisReply *rep = md_redis_cmd(r, e, "GET %s", key);
    if (!rep)
        return MD_EREDIS;
    int rc = 0;
    if (rep->type == REDIS_REPLY_STRING) {
        json_error_t je;
        json_t *doc = json_loadb(rep->str, rep->len, 0, &je);
        if (!json_is_object(doc)) {
            rc = md_errf(e, MD_EINVAL, "%s is not a JSON object (%s)", key,
                         doc ? "another JSON value" : je.text);
            json_decref(doc);
        } else if (q_plan_version(doc) < 0) {
            rc = md_errf(e, MD_EINVAL, "%s has no integer version", key);
            json_decref(doc);
        } else {
            *plan = doc;
        }
    } else if (rep->type == REDIS_REPLY_ERROR) {
        rc = md_errf(e, MD_EREDIS, "GET %s: %s", key, rep->str);
    }
    freeReplyObject(rep);
    return rc;
}

long long q_plan_version(const json_t *plan) {
    json_t *v = json_object_get(plan, "version");
    return json_is_integer(v) && json_integer_value(v) >= 0 ? (long long)json_integer_value(v) : -1;
}

static int cmp_class(const void *a, const void *b) {
    long long x = ((const q_class *)a)->max_tokens, y = ((const q_class *)b)->max_tokens;
    return x < y ? -1 : x > y;
}

int q_plan_classes(const json_t *plan, const char *model, q_class out[Q_CLASS_MAX], md_err *e) {
    json_t *classes = json_object_get(plan, "classes");
    if (!classes)
        return 0;
    if (!json_is_array(classes))
        return md_errf(e, MD_EINVAL, "plan: classes is not an array");
    int n = 0;
    size_t i;
    json_t *c;
    json_array_foreach(classes, i, c) {
        const char *m = json_string_value(json_object_get(c, "model"));
        const char *name = json_string_value(json_object_get(c, "name"));
        json_t *mt = json_object_get(c, "max_tokens");
        if (!m || !name || !json_is_integer(mt) || json_integer_value(mt) <= 0)
            return md_errf(e, MD_EINVAL,
                           "plan: classes[%zu] needs a model, a name and a positive integer "
                           "max_tokens",
                           i);
        if (strcmp(m, model))
            continue;
        int rc = q_class_name_check(name, e);
        if (rc)
            return rc;
        for (int k = 0; k < n; k++)
            if (!strcmp(out[k].name, name))
                return md_errf(e, MD_EINVAL, "plan: model %s has class '%s' twice", model, name);
        if (n == Q_CLASS_MAX)
            return md_errf(e, MD_EINVAL, "plan: model %s has more than %d classes", model,
                           Q_CLASS_MAX);
        snprintf(out[n].name, sizeof out[n].name, "%s", name);
        out[n].max_tokens = (long long)json_integer_value(mt);
        n++;
    }
    qsort(out, (size_t)n, sizeof *out, cmp_class);
    return n;
}

/* Bytes of every string content: a string, or an array of parts {type: text, text}. */
static long long content_bytes(const json_t *c) {
    if (json_is_string(c))
        return (long long)json_string_length(c);
    long long n = 0;
    size_t i;
    json_t *p;
    if (json_is_array(c))
        json_array_foreach(c, i, p) {
            json_t *t = json_is_string(p) ? p : json_object_get(p, "text");
            if (json_is_string(t))
                n += (long long)json_string_length(t);
        }
    return n;
}

long long q_estimate_tokens(const json_t *body, int default_max_tokens) {
    long long bytes = 0, out = default_max_tokens;
    if (!json_is_object(body))
        return out;
    json_t *msgs = json_object_get(body, "messages");
    size_t i;
    json_t *m;
    if (json_is_array(msgs))
        json_array_foreach(msgs, i, m) bytes += content_bytes(json_object_get(m, "content"));
    else
        bytes += content_bytes(json_object_get(body, "prompt"));
    json_t *mt = json_object_get(body, "max_tokens");
    if (!json_is_integer(mt))
        mt = json_object_get(body, "max_completion_tokens");
    if (json_is_integer(mt) && json_integer_value(mt) > 0)
        out = (long long)json_integer_value(mt);
    return (bytes + 3) / 4 + out;
}

const q_class *q_class_pick(const q_class *c, int n, long long tokens) {
    for (int k = 0; k < n; k++)
        if (c[k].max_tokens >= tokens)
            return &c[k];
    return &c[n - 1];
}

int q_gpu_of_worker(const char *gpu, const char *worker) {
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

static int replica_names(const json_t *rep, const char *worker) {
    size_t i, j;
    json_t *st, *g;
    json_array_foreach(json_object_get(rep, "stages"), i, st)
        json_array_foreach(json_object_get(st, "gpus"), j, g) {
        const char *s = json_string_value(g);
        if (s && q_gpu_of_worker(s, worker))
            return 1;
    }
    return 0;
}

int q_plan_assignment(const json_t *plan, const char *worker, q_assign out[Q_ASSIGN_MAX],
                      md_err *e) {
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
        if (!replica_names(rep, worker))
            continue;
        int rc = model_name_check(model, where, e);
        if (rc)
            return rc;
        q_assign *a = NULL;
        for (int k = 0; k < n && !a; k++)
            if (!strcmp(out[k].model, model))
                a = &out[k];
        if (!a) {
            if (n == Q_ASSIGN_MAX)
                return md_errf(e, MD_EINVAL, "plan: worker %s is given more than %d models", worker,
                               Q_ASSIGN_MAX);
            a = &out[n++];
            memset(a, 0, sizeof *a);
            snprintf(a->model, sizeof a->model, "%s", model);
        }
        const char *id = json_string_value(json_object_get(rep, "id"));
        size_t used = strlen(a->replicas);
        snprintf(a->replicas + used, sizeof a->replicas - used, "%s%s", used ? "," : "",
                 id ? id : where);
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
    return n;
}
