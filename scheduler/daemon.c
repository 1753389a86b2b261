/* daemon.c — `medley scheduler`: one active scheduler per Redis (a lease key taken with
 * SET NX PX and renewed only by its holder), which every interval reads the fleet from the
 * workers' heartbeat hashes (<prefix>worker:{W}) and the backlogs from the request streams
 * (<prefix>q:{M}[:class]), plans, and publishes the plan (<prefix>plan, version from
 * <prefix>plan:version) with an event on <prefix>events. It re-plans at once when a worker
 * disappears or appears, and otherwise only when the predicted gain in tokens per dollar
 * pays for reloading models (hysteresis; docs/scheduler.md §6). */
#include <glpk.h>
#include <hiredis/hiredis.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "common/redis.h"
#include "common/util.h"
#include "scheduler/daemon_metrics.h"
#include "scheduler/sched.h"

#define LOGC "scheduler"

/* Through common/redis (redis://, unix://, sentinel://: a failover is followed by the
 * reconnect). The socket timeouts stay 2 s: a round must not hang on a dead server. */
static md_redis *connect_redis(const char *url, const char *prefix, md_err *e) {
    md_redis_url u;
    if (md_redis_url_parse(url && *url ? url : md_redis_default_url(), &u, e))
        return NULL;
    u.command_timeout_ms = 2000;
    md_redis *r = NULL;
    if (md_redis_open(&u, &r, e))
        return NULL;
    if (md_redis_check_prefix(r, prefix, e)) { /* the ACL user may use the prefix's keys */
        md_redis_close(r);
        return NULL;
    }
    return r;
}

static int cmp_key(const void *a, const void *b) {
    return strcmp(json_string_value(*(json_t *const *)a), json_string_value(*(json_t *const *)b));
}

/* Keys matching pattern (SCAN, so the server is never blocked), in name order and each once
 * (SCAN's order is the hash table's, and it may return a key twice): the fleet and the
 * workload, and so the plan, are then the same for the same workers and queues. Returns a
 * json array. */
static json_t *scan_keys(redisContext *c, const char *pattern) {
    json_t *out = json_array();
    char cursor[32] = "0";
    do {
        redisReply *r = redisCommand(c, "SCAN %s MATCH %s COUNT 500", cursor, pattern);
        if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 2) {
            freeReplyObject(r);
            json_decref(out);
            return NULL;
        }
        snprintf(cursor, sizeof cursor, "%s", r->element[0]->str);
        for (size_t i = 0; i < r->element[1]->elements; i++)
            json_array_append_new(out, json_string(r->element[1]->element[i]->str));
        freeReplyObject(r);
    } while (strcmp(cursor, "0"));
    size_t n = json_array_size(out);
    json_t **v = malloc((n + 1) * sizeof *v), *sorted = json_array();
    if (!v || !sorted) {
        free(v);
        json_decref(sorted);
        return out; /* out of memory: SCAN's order, still a valid set of keys */
    }
    for (size_t i = 0; i < n; i++)
        v[i] = json_array_get(out, i);
    qsort(v, n, sizeof *v, cmp_key);
    for (size_t i = 0; i < n; i++)
        if (!i || cmp_key(&v[i - 1], &v[i]))
            json_array_append(sorted, v[i]);
    free(v);
    json_decref(out);
    return sorted;
}

/* The catalog type of one heartbeat device (a type name, or an object with "type", else its
 * driver "name" and "memory_bytes"), or NULL when the catalog has none; each odd device is
 * warned about once per worker (warned). */
static const char *device_type(sched_catalog *cat, const char *wid, json_t *d, json_t *warned) {
    const char *t =
        json_is_string(d) ? json_string_value(d) : json_string_value(json_object_get(d, "type"));
    if (!t)
        return NULL;
    if (sched_catalog_find(cat, t) < 0 && json_is_object(d)) {
        /* a worker not told its catalog type: recognise the driver's GPU name */
        int k = sched_catalog_match_device(
            cat, json_string_value(json_object_get(d, "name")),
            (double)json_integer_value(json_object_get(d, "memory_bytes")) / 1e9);
        char odd[128], k2[256];
        const char *dn = json_string_value(json_object_get(d, "name"));
        snprintf(k2, sizeof k2, "%.200s/%s", wid, dn ? dn : "");
        if (k >= 0 && sched_catalog_unmatched_words(cat, k, dn, odd, sizeof odd) &&
            !json_object_get(warned, k2)) {
            MD_WARN(LOGC,
                    "worker %s: GPU '%s' is planned as %s, the closest catalog type, "
                    "though '%s' is not in its name; give the worker its catalog type "
                    "if it is another card",
                    wid, dn, cat->gpus[k].name, odd);
            json_object_set_new(warned, k2, json_true());
        }
        if (k >= 0)
            t = cat->gpus[k].name;
    }
    if (sched_catalog_find(cat, t) < 0) {
        char k2[256];
        snprintf(k2, sizeof k2, "%s/%s", wid, t);
        if (!json_object_get(warned, k2)) {
            MD_WARN(LOGC, "worker %s: GPU type '%s' is not in the catalog; ignored", wid, t);
            json_object_set_new(warned, k2, json_true());
        }
        return NULL;
    }
    return t;
}

/* A worker's GPUs counted by catalog type ({"L4": 2, ...}), left empty when a pool name the
 * fleet cannot hold would come of its id (over SCHED_NAME_MAX characters, a '/', a control
 * character): a cut name would give GPU ids no worker matches, so the worker is left out
 * whole, with a warning. */
static json_t *count_devices(sched_catalog *cat, const char *wid, json_t *devs, json_t *warned) {
    json_t *counts = json_object();
    size_t j;
    json_t *d;
    json_array_foreach(devs, j, d) {
        const char *t = device_type(cat, wid, d, warned);
        if (t)
            json_object_set_new(counts, t,
                                json_integer(json_integer_value(json_object_get(counts, t)) + 1));
    }
    const char *t;
    json_t *n;
    int bad = 0;
    json_object_foreach(counts, t, n) {
        char name[SCHED_ID + SCHED_NAME];
        md_err ne = {0};
        if (json_object_size(counts) == 1)
            snprintf(name, sizeof name, "%.*s", SCHED_ID, wid);
        else
            snprintf(name, sizeof name, "%.*s#%s", SCHED_ID, wid, t);
        if (!bad && strlen(wid) < SCHED_ID && !sched_check_pool_name(name, "pool", &ne))
            continue;
        bad = 1;
        if (!json_object_get(warned, wid)) {
            MD_WARN(LOGC, "worker %.80s...: id not plannable (%s); its GPUs are left out", wid,
                    ne.msg[0] ? ne.msg : "longer than the pool name limit");
            json_object_set_new(warned, wid, json_true());
        }
    }
    if (bad)
        json_object_clear(counts);
    return counts;
}

/* The memory of the worker's host CPU of catalog type t (a type with cores: `cpu`), GB: its
 * heartbeat device's memory_bytes (the host's memory, docs/protocol.md) rounded down to whole
 * GiB, so that hosts of one size whose kernels keep a little more or less still merge into one
 * pool; 0 for a GPU type or when the heartbeat gives none (the catalog's figure then). */
static double host_cpu_memory_gb(const sched_catalog *cat, json_t *devs, const char *t) {
    int k = sched_catalog_find(cat, t);
    if (k < 0 || cat->gpus[k].cores < 1)
        return 0;
    size_t j;
    json_t *d;
    json_array_foreach(devs, j, d) {
        const char *dt = json_string_value(json_object_get(d, "type"));
        json_int_t b = json_integer_value(json_object_get(d, "memory_bytes"));
        if (!dt || sched_catalog_find(cat, dt) != k || b <= 0)
            continue;
        double gib = floor((double)b / 1073741824.0);
        return gib >= 1 ? gib * 1.073741824 : (double)b / 1e9 >= 0.1 ? (double)b / 1e9 : 0;
    }
    return 0;
}

/* One pool per GPU type of a worker (devs, its heartbeat's devices) onto pools. usd (> 0:
 * what the worker says all its devices cost an hour) overrides the catalog's prices, split
 * over its GPUs in proportion to their catalog prices; the pools so priced are named in
 * priced. A host CPU's pool has the host's memory (host_cpu_memory_gb). */
static void append_pools(sched_catalog *cat, const char *wid, json_t *devs, json_t *counts,
                         double usd, json_t *pools, json_t *priced) {
    const char *t;
    json_t *n;
    double catalog_usd = 0; /* the worker's GPUs at catalog prices */
    json_object_foreach(counts, t, n) {
        catalog_usd +=
            cat->gpus[sched_catalog_find(cat, t)].usd_per_hour * (double)json_integer_value(n);
    }
    json_object_foreach(counts, t, n) {
        char name[SCHED_ID];
        if (json_object_size(counts) == 1)
            snprintf(name, sizeof name, "%s", wid);
        else
            snprintf(name, sizeof name, "%s#%s", wid, t);
        json_t *pool = json_pack("{s:s, s:s, s:O, s:O}", "name", name, "type", t, "count", n,
                                 "gpus_per_host", n);
        double mem = host_cpu_memory_gb(cat, devs, t);
        if (mem > 0)
            json_object_set_new(pool, "memory_gb", json_real(mem));
        if (usd > 0) {
            double each = cat->gpus[sched_catalog_find(cat, t)].usd_per_hour;
            double per = catalog_usd > 0 ? usd * each / catalog_usd
                                         : usd / (double)json_object_size(counts) /
                                               (double)json_integer_value(n);
            json_object_set_new(pool, "usd_per_hour", json_real(per));
            json_object_set_new(priced, name, json_true());
        }
        json_array_append_new(pools, pool);
    }
}

/* The fleet as the heartbeats describe it: one pool per (worker, GPU type). Heartbeat
 * field `devices`: a JSON array of {"type": "L4", ...} objects or of type names (a type the
 * catalog does not know is looked up by the object's driver "name" and "memory_bytes",
 * sched_catalog_match_device); field
 * `state` "draining"/"stopping"/"drained" (held after an operator's drain) removes the worker
 * from the plan. Fills `workers` with the worker ids seen (for change detection). */
static json_t *fleet_from_heartbeats(redisContext *c, const char *prefix, sched_catalog *cat,
                                     json_t *workers, json_t *warned, json_t *priced) {
    char pat[256];
    snprintf(pat, sizeof pat, "%sworker:*", prefix);
    json_t *keys = scan_keys(c, pat);
    if (!keys)
        return NULL;
    json_t *pools = json_array();
    size_t i;
    json_t *k;
    json_array_foreach(keys, i, k) {
        const char *key = json_string_value(k);
        const char *wid = key + strlen(prefix) + strlen("worker:");
        redisReply *r = redisCommand(c, "HMGET %s devices state usd_per_hour", key);
        if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 3 ||
            r->element[0]->type != REDIS_REPLY_STRING) {
            freeReplyObject(r);
            continue;
        }
        if (r->element[1]->type == REDIS_REPLY_STRING &&
            (!strcmp(r->element[1]->str, "draining") || !strcmp(r->element[1]->str, "stopping") ||
             !strcmp(r->element[1]->str, "drained"))) {
            freeReplyObject(r);
            continue;
        }
        double usd = -1; /* what the worker says its devices cost ($/h, all of them) */
        if (r->element[2]->type == REDIS_REPLY_STRING) {
            char *end;
            double v = strtod(r->element[2]->str, &end);
            if (!*end && v > 0 && v <= 1e6)
                usd = v;
        }
        json_t *devs = json_loads(r->element[0]->str, 0, NULL);
        freeReplyObject(r);
        if (!json_is_array(devs)) {
            MD_WARN(LOGC, "worker %s: heartbeat field devices is not a JSON array; ignored", wid);
            json_decref(devs);
            continue;
        }
        json_t *counts = count_devices(cat, wid, devs, warned);
        append_pools(cat, wid, devs, counts, usd, pools, priced);
        if (json_object_size(counts))
            json_array_append_new(workers, json_string(wid));
        json_decref(counts);
        json_decref(devs);
    }
    json_decref(keys);
    return pools;
}

/* Backlog per model: entries not yet delivered plus pending, over <prefix>q:{M}[:class]. */
static json_t *backlogs(redisContext *c, const char *prefix) {
    char pat[256];
    snprintf(pat, sizeof pat, "%sq:*", prefix);
    json_t *keys = scan_keys(c, pat);
    if (!keys)
        return NULL;
    json_t *out = json_object();
    size_t i;
    json_t *k;
    json_array_foreach(keys, i, k) {
        const char *key = json_string_value(k);
        const char *m = key + strlen(prefix) + 2;
        char model[SCHED_NAME];
        size_t ml = strcspn(m, ":");
        if (*m == '{') { /* hash-tagged form q:{M} */
            m++;
            ml = strcspn(m, "}");
        }
        if (ml == 0 || ml >= sizeof model)
            continue;
        snprintf(model, sizeof model, "%.*s", (int)ml, m);
        long long n = -1;
        redisReply *r = redisCommand(c, "XINFO GROUPS %s", key);
        if (r && r->type == REDIS_REPLY_ARRAY && r->elements > 0) {
            redisReply *g = r->element[0];
            long long lag = -1, pending = 0;
            for (size_t f = 0; f + 1 < g->elements; f += 2) {
                if (!strcmp(g->element[f]->str, "lag") &&
                    g->element[f + 1]->type == REDIS_REPLY_INTEGER)
                    lag = g->element[f + 1]->integer;
                if (!strcmp(g->element[f]->str, "pending") &&
                    g->element[f + 1]->type == REDIS_REPLY_INTEGER)
                    pending = g->element[f + 1]->integer;
            }
            if (lag >= 0)
                n = lag + pending;
        }
        freeReplyObject(r);
        if (n < 0) {
            r = redisCommand(c, "XLEN %s", key);
            if (r && r->type == REDIS_REPLY_INTEGER)
                n = r->integer;
            freeReplyObject(r);
        }
        if (n > 0)
            json_object_set_new(out, model,
                                json_integer(json_integer_value(json_object_get(out, model)) + n));
    }
    json_decref(keys);
    return out;
}

/* Workload for the backlogs: a model's priority, deadline and classes come from the
 * workload file when it names the model; otherwise one class of 512 prompt + 256 output
 * tokens, or for an embedding model inputs of 128 tokens (at most its limit) and no output
 * (the daemon cannot see lengths in the queue without reading every entry). */
static json_t *workload_doc(json_t *backlog, json_t *file) {
    json_t *models = json_array();
    const char *m;
    json_t *n;
    json_object_foreach(backlog, m, n) {
        json_t *entry = NULL;
        size_t i;
        json_t *x;
        json_array_foreach(json_object_get(file, "models"), i, x) {
            json_t *mm = json_object_get(x, "model");
            const char *nm = json_is_string(mm) ? json_string_value(mm)
                                                : json_string_value(json_object_get(mm, "name"));
            if (nm && !strcmp(nm, m))
                entry = json_deep_copy(x);
        }
        if (!entry) {
            sched_model tmp;
            if (sched_model_builtin(m, &tmp, NULL)) {
                MD_WARN(LOGC, "model %s: no built-in shape and not in the workload file; skipped",
                        m);
                continue;
            }
            entry = tmp.embedding /* no token generated; inputs up to its limit */
                        ? json_pack("{s:s, s:f}", "model", m, "input_mean",
                                    tmp.max_context < 128 ? (double)tmp.max_context : 128.0)
                        : json_pack("{s:s, s:f, s:f}", "model", m, "input_mean", 512.0,
                                    "output_mean", 256.0);
        }
        json_object_set(entry, "requests", n);
        json_array_append_new(models, entry);
    }
    return json_pack("{s:o}", "models", models);
}

/* The writes go through md_redis_cmd: a demoted primary's -READONLY marks the connection
 * dead (ctx->err set), and the next round reconnects instead of waiting forever for a lease
 * it cannot write. */
static int lease(md_redis *rd, const char *key, const char *id, double ms) {
    md_err e = {0};
    redisReply *r = md_redis_cmd(rd, &e, "SET %s %s NX PX %lld", key, id, (long long)ms);
    int ok = r && r->type == REDIS_REPLY_STATUS;
    freeReplyObject(r);
    if (ok)
        return 1;
    r = md_redis_cmd(rd, &e, "EVAL %s 1 %s %s %lld",
                     "if redis.call('get', KEYS[1]) == ARGV[1] then "
                     "return redis.call('pexpire', KEYS[1], ARGV[2]) else return 0 end",
                     key, id, (long long)ms);
    ok = r && r->type == REDIS_REPLY_INTEGER && r->integer == 1;
    freeReplyObject(r);
    return ok;
}

static void sleep_s(double s, volatile int *stop) {
    for (double t = 0; t < s && !(stop && *stop); t += 0.05)
        usleep(50000);
}

int sched_daemon_run(const sched_daemon_opts *o, const sched_catalog *cat0, volatile int *stop,
                     md_err *e) {
    return sched_daemon_run_metered(o, cat0, stop, NULL, e);
}

/* The daemon's state across rounds. */
typedef struct {
    const sched_daemon_opts *o;
    md_redis *rd;
    sched_dm *dm;
    json_t *file;         /* the --workload document, or NULL */
    json_t *last_workers; /* the workers of the last published plan (NULL: none yet) */
    json_t *warned;       /* heartbeats already warned about */
    double last_ratio;    /* tokens per dollar of the last published plan */
    char id[40];          /* this scheduler's lease holder id */
    char key[256];        /* the lease key */
} dstate;

/* One round's parsed inputs and its plan; everything freed by round_free. */
typedef struct {
    sched_fleet f;
    sched_workload w;
    sched_cands cs;
    sched_plan p;
    int have_f, have_w, have_p;
} round_plan;

static void round_free(round_plan *rp) {
    if (rp->have_p)
        sched_plan_free(&rp->p);
    sched_cands_free(&rp->cs);
    if (rp->have_w)
        sched_workload_free(&rp->w);
    if (rp->have_f)
        sched_fleet_free(&rp->f);
}

/* The catalog for one round: the fleet may add types to it, so a copy of cat0. */
static int catalog_copy(sched_catalog *cat, const sched_catalog *cat0, md_err *e) {
    *cat = *cat0;
    cat->gpus = malloc((size_t)cat0->n * sizeof *cat->gpus);
    cat->aliases = json_deep_copy(cat0->aliases);
    if (!cat->gpus)
        return md_errf(e, MD_ENOMEM, "out of memory");
    memcpy(cat->gpus, cat0->gpus, (size_t)cat0->n * sizeof *cat->gpus);
    return 0;
}

/* Parse the round's fleet and workload documents and solve: 1 with rp filled, 0 (rp freed,
 * why in pe, empty when no model is known) otherwise. */
static int solve_round(dstate *d, sched_catalog *cat, json_t *fdoc, json_t *wdoc, json_t *priced,
                       round_plan *rp, md_err *pe) {
    sched_perf_params pp;
    sched_opts so;
    sched_perf_defaults(&pp);
    sched_opts_defaults(&so);
    memset(rp, 0, sizeof *rp);
    /* One pool per (worker, type), merged into one per kind of host: the MILP's size
     * follows the kinds, not the workers (docs/scheduler.md §6). */
    if (!json_array_size(json_object_get(wdoc, "models")) ||
        sched_fleet_from_json(&rp->f, fdoc, cat, pe))
        return 0;
    rp->have_f = 1;
    for (int q = 0; q < rp->f.n; q++)
        if (json_object_get(priced, rp->f.pools[q].name))
            snprintf(rp->f.pools[q].price_from, sizeof rp->f.pools[q].price_from, "heartbeat");
    if (sched_fleet_aggregate(&rp->f, pe) || sched_workload_from_json(&rp->w, wdoc, pe)) {
        round_free(rp);
        return 0;
    }
    rp->have_w = 1;
    uint64_t solve_t0 = md_mono_ns();
    if (sched_cands_build(&rp->cs, &rp->w, &rp->f, cat, NULL, &pp, pe) ||
        sched_plan_solve(&rp->p, &rp->w, &rp->f, cat, &rp->cs, &so, pe)) {
        round_free(rp);
        return 0;
    }
    rp->have_p = 1;
    sched_dm_solved(d->dm, (double)(md_mono_ns() - solve_t0) / 1e9);
    return 1;
}

/* Publish the plan: a new P plan:version, the document in P plan, an event on P events.
 * 1 when the plan was stored. */
static int publish_plan(dstate *d, round_plan *rp, sched_catalog *cat, const char *reason) {
    const char *prefix = d->o->prefix;
    sched_plan *p = &rp->p;
    md_err we = {0};
    redisReply *r = md_redis_cmd(d->rd, &we, "INCR %splan:version", prefix);
    p->version = r && r->type == REDIS_REPLY_INTEGER ? r->integer : 0;
    freeReplyObject(r);
    json_t *doc = sched_plan_to_json(p, &rp->w, &rp->f, cat, &rp->cs);
    json_object_set_new(doc, "reason", json_string(reason));
    char *s = json_dumps(doc, JSON_COMPACT);
    r = md_redis_cmd(d->rd, &we, "SET %splan %s", prefix, s);
    int set_ok = r && r->type == REDIS_REPLY_STATUS;
    freeReplyObject(r);
    if (set_ok)
        sched_dm_published(d->dm, doc, reason);
    json_t *ev = json_pack("{s:s, s:I, s:s, s:f, s:f}", "type", "plan", "version",
                           (json_int_t)p->version, "reason", reason, "tokens_per_s",
                           p->tokens_per_s, "usd_per_hour", p->usd_per_hour);
    char *es = json_dumps(ev, JSON_COMPACT);
    r = md_redis_cmd(d->rd, &we, "PUBLISH %sevents %s", prefix, es);
    freeReplyObject(r);
    free(es);
    json_decref(ev);
    free(s);
    json_decref(doc);
    return set_ok;
}

/* Publish the round's plan when the fleet changed, or when its gain in tokens per dollar
 * pays for reloading (hysteresis). */
static void maybe_publish(dstate *d, round_plan *rp, sched_catalog *cat, json_t *workers,
                          int changed, const char *reason) {
    const sched_plan *p = &rp->p;
    double ratio =
        p->busy_usd_per_hour > 0 ? p->tokens_per_s / p->busy_usd_per_hour : p->tokens_per_s;
    double backlog_tok = 0;
    for (int m = 0; m < rp->w.n; m++)
        backlog_tok += rp->w.models[m].requests * sched_demand_tokens_per_request(&rp->w.models[m]);
    double drain_s = p->tokens_per_s > 0 ? backlog_tok / p->tokens_per_s : INFINITY;
    double gain = d->last_ratio > 0 ? ratio / d->last_ratio - 1 : INFINITY;
    /* Reloading costs reload_s of every GPU; it pays when the gain over the time left to
     * drain the backlog exceeds it. */
    double need =
        d->o->min_gain + (isfinite(drain_s) && drain_s > 0 ? d->o->reload_s / drain_s : 0);
    if (!changed && !(gain > need)) {
        MD_DEBUG(LOGC, "kept the plan: gain %.3f below %.3f", gain, need);
        return;
    }
    if (publish_plan(d, rp, cat, reason)) {
        MD_INFO(LOGC, "published plan v%lld (%s): %d replicas, %.0f tok/s, $%.2f/h", p->version,
                reason, p->n, p->tokens_per_s, p->usd_per_hour);
        d->last_ratio = ratio;
        json_decref(d->last_workers);
        d->last_workers = json_incref(workers);
    }
}

/* Every GPU id of the round's plan is "<pool>/<k>" with <pool> one of the heartbeat pools
 * (a live worker, or "<worker>#<type>") and k below its count: a plan naming anything else
 * would be served by nobody. 0, or MD_EINVAL naming the first id that does not. */
static int ids_name_live_workers(const round_plan *rp, json_t *pools, md_err *e) {
    json_t *live = json_object();
    size_t i;
    json_t *pl;
    json_array_foreach(pools, i, pl) {
        const char *nm = json_string_value(json_object_get(pl, "name"));
        if (nm)
            json_object_set(live, nm, json_object_get(pl, "count"));
    }
    int rc = 0;
    for (int r = 0; r < rp->p.n && !rc; r++) {
        const sched_cand *c = &rp->cs.c[rp->p.r[r].cand];
        for (int g = 0; g < c->gpus && !rc; g++) {
            const char *id = rp->p.r[r].gpu_ids[g];
            const char *slash = strrchr(id, '/');
            char name[SCHED_ID];
            json_t *count = NULL;
            if (slash && (size_t)(slash - id) < sizeof name) {
                snprintf(name, sizeof name, "%.*s", (int)(slash - id), id);
                count = json_object_get(live, name);
            }
            char *end = NULL;
            long k = slash ? strtol(slash + 1, &end, 10) : -1;
            if (!count || !slash[1] || *end || k < 0 || k >= json_integer_value(count))
                rc = md_errf(e, MD_EINVAL,
                             "replica r%d: GPU id '%s' names no live worker's GPU; the plan is "
                             "not published",
                             r, id);
        }
    }
    json_decref(live);
    return rc;
}

/* One round as the lease holder: read the fleet and the backlogs, plan, maybe publish. */
static int lead_round(dstate *d, redisContext *c, const sched_catalog *cat0, md_err *e) {
    sched_catalog cat;
    if (catalog_copy(&cat, cat0, e))
        return e->code;
    int rc = 0;
    json_t *workers = json_array();
    json_t *priced = json_object(); /* pools priced by their worker's heartbeat */
    json_t *pools = fleet_from_heartbeats(c, d->o->prefix, &cat, workers, d->warned, priced);
    json_t *bl = pools ? backlogs(c, d->o->prefix) : NULL;
    sched_dm_round(d->dm, pools, workers, bl);
    int changed = !d->last_workers || !json_equal(workers, d->last_workers);
    const char *reason = !d->last_workers ? "start" : changed ? "fleet changed" : "backlog";
    if (pools && bl && json_array_size(pools) && json_object_size(bl)) {
        json_t *fdoc = json_pack("{s:s, s:O}", "name", "heartbeats", "pools", pools);
        json_t *wdoc = workload_doc(bl, d->file);
        round_plan rp;
        md_err pe = {0};
        if (!solve_round(d, &cat, fdoc, wdoc, priced, &rp, &pe)) {
            MD_WARN(LOGC, "no plan this round: %s", pe.msg[0] ? pe.msg : "no known models");
        } else if (ids_name_live_workers(&rp, pools, &pe)) {
            MD_ERROR(LOGC, "%s", pe.msg);
            if (d->o->once) /* --once: exit non-zero rather than publish it */
                rc = md_errf(e, pe.code, "%s", pe.msg);
            round_free(&rp);
        } else {
            maybe_publish(d, &rp, &cat, workers, changed, reason);
            round_free(&rp);
        }
        json_decref(fdoc);
        json_decref(wdoc);
    }
    json_decref(pools);
    json_decref(priced);
    json_decref(bl);
    json_decref(workers);
    sched_catalog_free(&cat);
    return rc;
}

/* Hand the lease back so a standby takes over at once. */
static void release_lease(dstate *d) {
    redisContext *c = md_redis_ctx(d->rd);
    if (c && !c->err) {
        redisReply *r = redisCommand(c, "EVAL %s 1 %s %s",
                                     "if redis.call('get', KEYS[1]) == ARGV[1] then "
                                     "return redis.call('del', KEYS[1]) else return 0 end",
                                     d->key, d->id);
        freeReplyObject(r);
    }
}

int sched_daemon_run_metered(const sched_daemon_opts *o, const sched_catalog *cat0,
                             volatile int *stop, md_metrics *metrics, md_err *e) {
    dstate d = {.o = o};
    d.rd = connect_redis(o->redis_url, o->prefix, e);
    if (!d.rd)
        return e->code;
    if (o->workload && !(d.file = sched_json_load(o->workload, e))) {
        md_redis_close(d.rd);
        return e->code;
    }
    md_random_hex(d.id, sizeof d.id, 16);
    snprintf(d.key, sizeof d.key, "%sscheduler:lease", o->prefix);
    d.warned = json_object();
    d.dm = sched_dm_new(metrics);
    int rc = 0;
    MD_INFO(LOGC, "scheduler %s starting (prefix %s)", d.id, o->prefix);
    while (!(stop && *stop)) {
        redisContext *c = md_redis_ctx(d.rd);
        if (!c || c->err) {
            if (md_redis_reconnect(d.rd, 0, NULL, e)) {
                if (o->once)
                    break;
                MD_WARN(LOGC, "%s; retrying", e->msg);
                sleep_s(1, stop);
                continue;
            }
            c = md_redis_ctx(d.rd);
        }
        int leader = lease(d.rd, d.key, d.id, o->lease_ms);
        sched_dm_leader(d.dm, leader);
        if (!leader) {
            if (o->once) {
                rc = md_errf(e, MD_EREDIS, "another scheduler holds the lease %s", d.key);
                break;
            }
            sleep_s(o->interval_s, stop);
            continue;
        }
        if ((rc = lead_round(&d, c, cat0, e)))
            break;
        if (o->once)
            break;
        sleep_s(o->interval_s, stop);
    }
    release_lease(&d);
    json_decref(d.last_workers);
    json_decref(d.warned);
    json_decref(d.file);
    sched_dm_free(d.dm);
    md_redis_close(d.rd);
    /* GLPK keeps a per-thread environment; free it as the daemon's thread ends. */
    glp_free_env();
    return rc;
}
