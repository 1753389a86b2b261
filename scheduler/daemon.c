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

/* The fleet as the heartbeats describe it: one pool per (worker, GPU type). Heartbeat
 * field `devices`: a JSON array of {"type": "L4", ...} objects or of type names (a type the
 * catalog does not know is looked up by the object's driver "name" and "memory_bytes",
 * sched_catalog_match_device); field
 * `state` "draining"/"stopping" removes the worker from the plan. Fills `workers` with
 * the worker ids seen (for change detection). */
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
            (!strcmp(r->element[1]->str, "draining") || !strcmp(r->element[1]->str, "stopping"))) {
            freeReplyObject(r);
            continue;
        }
        /* what the worker says its devices cost ($/h, all of them): it overrides the
         * catalog's price, split over its GPUs in proportion to their catalog prices */
        double usd = -1;
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
        json_t *counts = json_object();
        size_t j;
        json_t *d;
        json_array_foreach(devs, j, d) {
            const char *t = json_is_string(d) ? json_string_value(d)
                                              : json_string_value(json_object_get(d, "type"));
            if (!t)
                continue;
            if (sched_catalog_find(cat, t) < 0 && json_is_object(d)) {
                /* a worker not told its catalog type: recognise the driver's GPU name */
                int k = sched_catalog_match_device(
                    cat, json_string_value(json_object_get(d, "name")),
                    (double)json_integer_value(json_object_get(d, "memory_bytes")) / 1e9);
                if (k >= 0)
                    t = cat->gpus[k].name;
            }
            if (sched_catalog_find(cat, t) < 0) {
                char k2[256];
                snprintf(k2, sizeof k2, "%s/%s", wid, t);
                if (!json_object_get(warned, k2)) {
                    MD_WARN(LOGC, "worker %s: GPU type '%s' is not in the catalog; ignored", wid,
                            t);
                    json_object_set_new(warned, k2, json_true());
                }
                continue;
            }
            json_object_set_new(counts, t,
                                json_integer(json_integer_value(json_object_get(counts, t)) + 1));
        }
        const char *t;
        json_t *n;
        double catalog_usd = 0; /* the worker's GPUs at catalog prices */
        json_object_foreach(counts, t, n) {
            catalog_usd += cat->gpus[sched_catalog_find(cat, t)].usd_per_hour *
                           (double)json_integer_value(n);
        }
        json_object_foreach(counts, t, n) {
            char name[SCHED_NAME];
            if (json_object_size(counts) == 1)
                snprintf(name, sizeof name, "%s", wid);
            else
                snprintf(name, sizeof name, "%s#%s", wid, t);
            json_t *pool = json_pack("{s:s, s:s, s:O, s:O}", "name", name, "type", t, "count", n,
                                     "gpus_per_host", n);
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
 * tokens (the daemon cannot see lengths in the queue without reading every entry). */
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
            entry =
                json_pack("{s:s, s:f, s:f}", "model", m, "input_mean", 512.0, "output_mean", 256.0);
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

int sched_daemon_run_metered(const sched_daemon_opts *o, const sched_catalog *cat0,
                             volatile int *stop, md_metrics *metrics, md_err *e) {
    md_redis *rd = connect_redis(o->redis_url, o->prefix, e);
    if (!rd)
        return e->code;
    json_t *file = NULL;
    if (o->workload && !(file = md_json_load(o->workload, e))) {
        md_redis_close(rd);
        return e->code;
    }
    char id[40], key[256];
    md_random_hex(id, sizeof id, 16);
    snprintf(key, sizeof key, "%sscheduler:lease", o->prefix);
    json_t *last_workers = NULL, *warned = json_object();
    double last_ratio = 0;
    int rc = 0, rounds = 0;
    sched_dm *dm = sched_dm_new(metrics);
    MD_INFO(LOGC, "scheduler %s starting (prefix %s)", id, o->prefix);
    while (!(stop && *stop)) {
        redisContext *c = md_redis_ctx(rd);
        if (!c || c->err) {
            if (md_redis_reconnect(rd, 0, NULL, e)) {
                if (o->once)
                    break;
                MD_WARN(LOGC, "%s; retrying", e->msg);
                sleep_s(1, stop);
                continue;
            }
            c = md_redis_ctx(rd);
        }
        int leader = lease(rd, key, id, o->lease_ms);
        sched_dm_leader(dm, leader);
        if (!leader) {
            if (o->once) {
                rc = md_errf(e, MD_EREDIS, "another scheduler holds the lease %s", key);
                break;
            }
            sleep_s(o->interval_s, stop);
            continue;
        }
        sched_catalog cat = *cat0;
        /* The fleet may add types to the catalog: work on a copy. */
        cat.gpus = malloc((size_t)cat0->n * sizeof *cat.gpus);
        cat.aliases = json_deep_copy(cat0->aliases);
        if (!cat.gpus) {
            rc = md_errf(e, MD_ENOMEM, "out of memory");
            break;
        }
        memcpy(cat.gpus, cat0->gpus, (size_t)cat0->n * sizeof *cat.gpus);
        json_t *workers = json_array();
        json_t *priced = json_object(); /* pools priced by their worker's heartbeat */
        json_t *pools = fleet_from_heartbeats(c, o->prefix, &cat, workers, warned, priced);
        json_t *bl = pools ? backlogs(c, o->prefix) : NULL;
        sched_dm_round(dm, pools, workers, bl);
        int changed = !last_workers || !json_equal(workers, last_workers);
        const char *reason = !last_workers ? "start" : changed ? "fleet changed" : "backlog";
        if (pools && bl && json_array_size(pools) && json_object_size(bl)) {
            json_t *fdoc = json_pack("{s:s, s:O}", "name", "heartbeats", "pools", pools);
            json_t *wdoc = workload_doc(bl, file);
            sched_fleet f;
            sched_workload w;
            sched_cands cs;
            sched_perf_params pp;
            sched_plan p;
            sched_opts so;
            md_err pe = {0};
            sched_perf_defaults(&pp);
            sched_opts_defaults(&so);
            memset(&cs, 0, sizeof cs);
            /* One pool per (worker, type), merged into one per kind of host: the MILP's size
             * follows the kinds, not the workers (docs/scheduler.md §6). */
            int ok = json_array_size(json_object_get(wdoc, "models")) &&
                     !sched_fleet_from_json(&f, fdoc, &cat, &pe);
            for (int q = 0; ok && q < f.n; q++)
                if (json_object_get(priced, f.pools[q].name))
                    snprintf(f.pools[q].price_from, sizeof f.pools[q].price_from, "heartbeat");
            if (ok && sched_fleet_aggregate(&f, &pe)) {
                sched_fleet_free(&f);
                ok = 0;
            }
            if (ok && sched_workload_from_json(&w, wdoc, &pe)) {
                sched_fleet_free(&f);
                ok = 0;
            }
            uint64_t solve_t0 = md_mono_ns();
            if (ok && (sched_cands_build(&cs, &w, &f, &cat, NULL, &pp, &pe) ||
                       sched_plan_solve(&p, &w, &f, &cat, &cs, &so, &pe))) {
                sched_cands_free(&cs);
                sched_workload_free(&w);
                sched_fleet_free(&f);
                ok = 0;
            }
            if (ok)
                sched_dm_solved(dm, (double)(md_mono_ns() - solve_t0) / 1e9);
            if (!ok) {
                MD_WARN(LOGC, "no plan this round: %s", pe.msg[0] ? pe.msg : "no known models");
            } else {
                double ratio =
                    p.busy_usd_per_hour > 0 ? p.tokens_per_s / p.busy_usd_per_hour : p.tokens_per_s;
                double backlog_tok = 0;
                for (int m = 0; m < w.n; m++)
                    backlog_tok +=
                        w.models[m].requests * sched_demand_tokens_per_request(&w.models[m]);
                double drain_s = p.tokens_per_s > 0 ? backlog_tok / p.tokens_per_s : INFINITY;
                double gain = last_ratio > 0 ? ratio / last_ratio - 1 : INFINITY;
                /* Reloading costs reload_s of every GPU; it pays when the gain over the time
                 * left to drain the backlog exceeds it. */
                double need =
                    o->min_gain + (isfinite(drain_s) && drain_s > 0 ? o->reload_s / drain_s : 0);
                if (changed || gain > need) {
                    md_err we = {0};
                    redisReply *r = md_redis_cmd(rd, &we, "INCR %splan:version", o->prefix);
                    p.version = r && r->type == REDIS_REPLY_INTEGER ? r->integer : 0;
                    freeReplyObject(r);
                    json_t *doc = sched_plan_to_json(&p, &w, &f, &cat, &cs);
                    json_object_set_new(doc, "reason", json_string(reason));
                    char *s = json_dumps(doc, JSON_COMPACT);
                    r = md_redis_cmd(rd, &we, "SET %splan %s", o->prefix, s);
                    int set_ok = r && r->type == REDIS_REPLY_STATUS;
                    freeReplyObject(r);
                    if (set_ok)
                        sched_dm_published(dm, doc, reason);
                    json_t *ev = json_pack("{s:s, s:I, s:s, s:f, s:f}", "type", "plan", "version",
                                           (json_int_t)p.version, "reason", reason, "tokens_per_s",
                                           p.tokens_per_s, "usd_per_hour", p.usd_per_hour);
                    char *es = json_dumps(ev, JSON_COMPACT);
                    r = md_redis_cmd(rd, &we, "PUBLISH %sevents %s", o->prefix, es);
                    freeReplyObject(r);
                    free(es);
                    json_decref(ev);
                    free(s);
                    json_decref(doc);
                    if (set_ok) {
                        MD_INFO(LOGC, "published plan v%lld (%s): %d replicas, %.0f tok/s, $%.2f/h",
                                p.version, reason, p.n, p.tokens_per_s, p.usd_per_hour);
                        last_ratio = ratio;
                        json_decref(last_workers);
                        last_workers = json_incref(workers);
                    }
                } else {
                    MD_DEBUG(LOGC, "kept the plan: gain %.3f below %.3f", gain, need);
                }
                sched_plan_free(&p);
                sched_cands_free(&cs);
                sched_workload_free(&w);
                sched_fleet_free(&f);
            }
            json_decref(fdoc);
            json_decref(wdoc);
        }
        json_decref(pools);
        json_decref(priced);
        json_decref(bl);
        json_decref(workers);
        sched_catalog_free(&cat);
        rounds++;
        if (o->once)
            break;
        sleep_s(o->interval_s, stop);
    }
    /* Hand the lease back so a standby takes over at once. */
    redisContext *c = md_redis_ctx(rd);
    if (c && !c->err) {
        redisReply *r = redisCommand(c, "EVAL %s 1 %s %s",
                                     "if redis.call('get', KEYS[1]) == ARGV[1] then "
                                     "return redis.call('del', KEYS[1]) else return 0 end",
                                     key, id);
        freeReplyObject(r);
    }
    json_decref(last_workers);
    json_decref(warned);
    json_decref(file);
    sched_dm_free(dm);
    md_redis_close(rd);
    (void)rounds;
    /* GLPK keeps a per-thread environment; free it as the daemon's thread ends. */
    glp_free_env();
    return rc;
}
