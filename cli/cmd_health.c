/* cmd_health.c — `medley health`: is a worker alive, is it ready? For probes (a Kubernetes
 * exec probe, a systemd or Nomad check, a shell loop) that must not depend on anything but
 * the worker's own heartbeat hash, <prefix>worker:{W} (worker/worker_lease.c wk_heartbeat,
 * docs/operations.md "Runbook").
 *
 * Alive: the hash exists. The worker writes it every --heartbeat-ms and gives it a life of
 * three periods; while it loads a model its watchdog thread extends that life without
 * rewriting the hash (worker/watchdog.c), so a long load is alive, a hung or dead worker
 * is not (it lapses, or the watchdog exits the process), and a stopped worker deletes it.
 * --max-age-ms N also requires last_seen (the worker's wall clock: run the probe on the
 * worker's host) to be at most N ms old; last_seen does not move during a model load.
 *
 * Ready (--ready): alive, state "running" (not "draining"), and every model it lists has a
 * runner with slots (capacity > 0) and no not_serving reason (a sharded replica waiting for
 * its stages). A --model worker writes its first heartbeat after its models loaded, so
 * "ready" is "its models are loaded and it reads requests". A plan-following worker that
 * the plan gives nothing is ready (it waits for the plan). A `--devices` supervisor has no
 * heartbeat of its own: --children N checks its children W.0 ... W.N-1, all of which must
 * pass.
 *
 * Exit status: 0 alive / ready, 1 not (the reason on stderr), 2 usage error, 3 Redis could
 * not be asked (--redis-down-ok turns that into 0: a liveness probe must not restart every
 * worker of the fleet because Redis is away — they reconnect by themselves). */
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "common/redis.h"
#include "common/util.h"
#include "queue/queue.h"

enum { HEALTH_OK = 0, HEALTH_BAD = 1, HEALTH_USAGE = 2, HEALTH_UNKNOWN = 3 };

static void usage(FILE *f) {
    fprintf(
        f,
        "usage: medley health [--worker-id W] [--ready] [--max-age-ms N] [--redis URL]\n"
        "                     [--prefix medley:] [--children N] [--redis-down-ok] [--quiet]\n"
        "\n"
        "Checks worker W's heartbeat hash <prefix>worker:{W} in Redis. Alive (the default\n"
        "check): the hash exists (the worker renews it every heartbeat, and its watchdog\n"
        "while a model loads). --ready: alive, state running (not draining), every model\n"
        "loaded and serving. Exit 0 yes, 1 no (the reason on stderr), 2 usage, 3 Redis\n"
        "could not be asked.\n"
        "\n"
        "  --worker-id W    the worker's --id (default $MEDLEY_WORKER_ID)\n"
        "  --ready          check readiness instead of liveness\n"
        "  --max-age-ms N   also require the heartbeat's last_seen to be at most N ms old\n"
        "                   (the worker's clock: run on its host; a model load stops it)\n"
        "  --redis URL      as for the worker (default $MEDLEY_REDIS)\n"
        "  --prefix P       key prefix (default medley:)\n"
        "  --children N     W runs --devices with N devices: check W.0 ... W.N-1 (all must pass)\n"
        "  --redis-down-ok  exit 0 when Redis cannot be reached (for liveness probes)\n"
        "  --quiet          print nothing when healthy\n");
}

/* Why the heartbeat doc says the worker is not ready, into why; 0 when it is ready. */
static int not_ready(const char *state, const char *json, char *why, size_t whysz) {
    if (!state || strcmp(state, "running")) {
        snprintf(why, whysz, "state is %s, not running%s", state ? state : "(none)",
                 !state                       ? ""
                 : !strcmp(state, "draining") ? " (stopping: SIGTERM, finishing its work)"
                 : !strcmp(state, "drained")
                     ? " (drained by an operator: undrain with the dashboard or DEL its drain key)"
                     : "");
        return 1;
    }
    json_error_t je;
    json_t *doc = json ? json_loads(json, 0, &je) : NULL;
    json_t *models = json_object_get(doc, "models");
    if (!json_is_array(models)) {
        snprintf(why, whysz, "its heartbeat has no readable models list (%s)",
                 json ? je.text : "no json field");
        json_decref(doc);
        return 1;
    }
    size_t i;
    json_t *m;
    int bad = 0;
    json_array_foreach(models, i, m) {
        const char *name = json_string_value(json_object_get(m, "model"));
        json_t *cap = json_object_get(m, "capacity");
        const char *ns = json_string_value(json_object_get(m, "not_serving"));
        if (ns) {
            snprintf(why, whysz, "model %s is not serving: %s", name ? name : "?", ns);
            bad = 1;
            break;
        }
        if (!json_is_integer(cap) || json_integer_value(cap) <= 0) {
            snprintf(why, whysz, "model %s is loading (no slots yet)", name ? name : "?");
            bad = 1;
            break;
        }
    }
    json_decref(doc);
    return bad;
}

/* The models a ready worker serves, "echo (256 slots), m2 (64 slots)", into out. */
static void models_summary(const char *json, char *out, size_t outsz) {
    json_t *doc = json ? json_loads(json, 0, NULL) : NULL;
    json_t *models = json_object_get(doc, "models");
    size_t i, used = 0;
    json_t *m;
    out[0] = '\0';
    json_array_foreach(models, i, m) {
        if (used >= outsz)
            break;
        const char *name = json_string_value(json_object_get(m, "model"));
        used += (size_t)snprintf(out + used, outsz - used, "%s%s (%lld slots)", i ? ", " : "",
                                 name ? name : "?",
                                 (long long)json_integer_value(json_object_get(m, "capacity")));
    }
    if (!out[0])
        snprintf(out, outsz, "none yet (waiting for the plan)");
    json_decref(doc);
}

/* What the command checks, besides which worker. */
typedef struct {
    const char *prefix;
    int ready, quiet;
    long long max_age_ms;
} hc_opts;

/* Check worker id's heartbeat on r. Returns HEALTH_OK or HEALTH_BAD (said on stdout / stderr),
 * or HEALTH_UNKNOWN with e filled when Redis could not be asked. */
static int check_worker(md_redis *r, const hc_opts *o, const char *id, md_err *e) {
    char key[Q_KEY_MAX];
    q_key_worker(key, o->prefix, id);
    redisReply *rep = md_redis_cmd(r, e, "HMGET %s state last_seen json", key);
    if (!rep || rep->type != REDIS_REPLY_ARRAY || rep->elements != 3) {
        if (rep)
            md_errf(e, MD_EREDIS, "HMGET %s: %s", key,
                    rep->type == REDIS_REPLY_ERROR ? rep->str : "unexpected reply");
        freeReplyObject(rep);
        return HEALTH_UNKNOWN;
    }
    const char *state = rep->element[0]->type == REDIS_REPLY_STRING ? rep->element[0]->str : NULL;
    const char *seen = rep->element[1]->type == REDIS_REPLY_STRING ? rep->element[1]->str : NULL;
    const char *json = rep->element[2]->type == REDIS_REPLY_STRING ? rep->element[2]->str : NULL;
    int rc = HEALTH_OK;
    char why[600] = "";
    long long age_ms = seen ? (long long)md_wall_ms() - atoll(seen) : -1;
    if (!state && !seen && !json) {
        snprintf(why, sizeof why,
                 "no heartbeat at %s (not started yet, still loading its first model, "
                 "stopped, or silent for 3 heartbeat periods)",
                 key);
        rc = HEALTH_BAD;
    } else if (o->max_age_ms > 0 && (!seen || age_ms > o->max_age_ms)) {
        if (seen)
            snprintf(why, sizeof why, "its last heartbeat is %.1f s old (limit %.1f s)",
                     (double)age_ms / 1e3, (double)o->max_age_ms / 1e3);
        else
            snprintf(why, sizeof why, "its heartbeat %s has no last_seen", key);
        rc = HEALTH_BAD;
    } else if (o->ready && not_ready(state, json, why, sizeof why)) {
        rc = HEALTH_BAD;
    }
    if (rc) {
        fprintf(stderr, "medley health: worker %s is not %s: %s\n", id,
                o->ready ? "ready" : "alive", why);
    } else if (!o->quiet) {
        char models[400];
        models_summary(json, models, sizeof models);
        printf("worker %s: %s (%s, heartbeat %.1f s old; models: %s)\n", id,
               o->ready ? "ready" : "alive", state ? state : "?", (double)age_ms / 1e3, models);
    }
    freeReplyObject(rep);
    return rc;
}

int cmd_health(int argc, char **argv) {
    const char *id = getenv("MEDLEY_WORKER_ID"), *url = NULL, *prefix = "medley:";
    int ready = 0, down_ok = 0, quiet = 0, children = 0;
    long long max_age_ms = 0;
    enum {
        OPT_ID = 256,
        OPT_READY,
        OPT_AGE,
        OPT_REDIS,
        OPT_PREFIX,
        OPT_DOWN_OK,
        OPT_QUIET,
        OPT_CHILDREN
    };
    static const struct option lo[] = {
        {"worker-id", 1, 0, OPT_ID},   {"ready", 0, 0, OPT_READY},
        {"max-age-ms", 1, 0, OPT_AGE}, {"redis", 1, 0, OPT_REDIS},
        {"prefix", 1, 0, OPT_PREFIX},  {"redis-down-ok", 0, 0, OPT_DOWN_OK},
        {"quiet", 0, 0, OPT_QUIET},    {"children", 1, 0, OPT_CHILDREN},
        {"help", 0, 0, 'h'},           {0, 0, 0, 0}};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (c) {
        case OPT_ID: id = optarg; break;
        case OPT_READY: ready = 1; break;
        case OPT_AGE: {
            char *end;
            max_age_ms = strtoll(optarg, &end, 10);
            if (*end || max_age_ms <= 0) {
                fprintf(stderr, "medley health: --max-age-ms needs an integer > 0, got \"%s\"\n",
                        optarg);
                return HEALTH_USAGE;
            }
            break;
        }
        case OPT_REDIS: url = optarg; break;
        case OPT_PREFIX: prefix = optarg; break;
        case OPT_DOWN_OK: down_ok = 1; break;
        case OPT_QUIET: quiet = 1; break;
        case OPT_CHILDREN: {
            char *end;
            long n = strtol(optarg, &end, 10);
            if (*end || n < 1 || n > 64) {
                fprintf(stderr, "medley health: --children needs an integer in 1..64, got \"%s\"\n",
                        optarg);
                return HEALTH_USAGE;
            }
            children = (int)n;
            break;
        }
        case 'h': usage(stdout); return HEALTH_OK;
        default: usage(stderr); return HEALTH_USAGE;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "medley health: unexpected argument \"%s\"\n", argv[optind]);
        usage(stderr);
        return HEALTH_USAGE;
    }
    if (!id || !*id) {
        fprintf(stderr, "medley health: which worker? give --worker-id W (the worker's --id) "
                        "or set MEDLEY_WORKER_ID\n");
        return HEALTH_USAGE;
    }
    md_err e = {0};
    if (q_prefix_check(prefix, &e)) {
        fprintf(stderr, "medley health: --prefix: %s\n", e.msg);
        return HEALTH_USAGE;
    }
    md_redis_url u;
    if (md_redis_url_parse(url ? url : md_redis_default_url(), &u, &e)) {
        fprintf(stderr, "medley health: %s\n", e.msg);
        return HEALTH_USAGE;
    }
    /* a probe has a deadline of its own (Kubernetes: timeoutSeconds): answer within ~4 s */
    u.connect_timeout_ms = 2000;
    u.command_timeout_ms = 2000;
    char where[700];
    md_redis_url_describe(&u, where, sizeof where);
    md_redis *r = NULL;
    hc_opts o = {prefix, ready, quiet, max_age_ms};
    int rc = md_redis_open(&u, &r, &e) || md_redis_check_prefix(r, prefix, &e) ? HEALTH_UNKNOWN
                                                                               : HEALTH_OK;
    for (int i = 0; rc == HEALTH_OK && i < (children ? children : 1); i++) {
        char child[200];
        if (children)
            snprintf(child, sizeof child, "%s.%d", id, i);
        else
            snprintf(child, sizeof child, "%s", id);
        rc = check_worker(r, &o, child, &e);
    }
    md_redis_close(r);
    if (rc != HEALTH_UNKNOWN)
        return rc;
    if (down_ok && e.code == MD_EREDIS) {
        if (!quiet)
            printf("worker %s: cannot tell, Redis at %s is not answering (%s); passing "
                   "(--redis-down-ok)\n",
                   id, where, e.msg);
        return HEALTH_OK;
    }
    fprintf(stderr, "medley health: worker %s: cannot read its heartbeat from %s: %s\n", id, where,
            e.msg);
    return e.code == MD_EREDIS ? HEALTH_UNKNOWN : HEALTH_BAD;
}
