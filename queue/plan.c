/* plan.c — see plan.h: the plan document and the size classes that route requests. */
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
