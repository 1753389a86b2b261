/* watchdog.c — see watchdog.h. */
#include "worker/watchdog.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"

#define WD_PENDING_MAX 10000 /* entries handed back per stream (a worker holds far fewer) */

struct wk_watchdog {
    pthread_t th;
    char group[64], consumer[160];
    int exit_on_fire;
    long long idle_ms;
    /* the section in progress (atomic): started is 0 between sections and written last */
    uint64_t started; /* mono ns */
    int limit_ms, keepalive;
    const char *what;
    int quit;         /* atomic */
    int fired;        /* atomic */
    long handed_back; /* atomic */
    long kept_alive;  /* atomic */
    pthread_mutex_t mu;
    /* under mu */
    md_redis *r; /* NULL until wk_watchdog_connect */
    char **keys;
    int n_keys;
    char hb_key[256];
    int hb_period_ms, hb_ttl_ms, lease_ms, vis_ms;
};

/* XPENDING by consumer, then XCLAIM to ourselves with JUSTID (no delivery count bump) the
 * entries idle less than below_ms (0: all): with set_idle > 0 marked idle that long (the
 * hand-back), else with their idle time reset (a renewal). Returns how many, or -1. */
static long claim_own(wk_watchdog *w, const char *key, long long set_idle, long long below_ms,
                      md_err *e) {
    redisReply *p = md_redis_cmd(w->r, e, "XPENDING %s %s - + %d %s", key, w->group, WD_PENDING_MAX,
                                 w->consumer);
    if (!p)
        return -1;
    long n = 0;
    if (p->type == REDIS_REPLY_ARRAY && p->elements > 0) {
        size_t argc = p->elements + 8;
        const char **argv = malloc(argc * sizeof *argv);
        size_t *lens = malloc(argc * sizeof *lens);
        char idle[32];
        snprintf(idle, sizeof idle, "%lld", set_idle);
        int k = 0;
        if (argv && lens) {
            argv[k++] = "XCLAIM";
            argv[k++] = key;
            argv[k++] = w->group;
            argv[k++] = w->consumer;
            argv[k++] = "0";
            for (size_t i = 0; i < p->elements; i++) {
                redisReply *it = p->element[i];
                if (it->type != REDIS_REPLY_ARRAY || it->elements < 3 ||
                    it->element[0]->type != REDIS_REPLY_STRING)
                    continue;
                if (below_ms > 0 && (it->element[2]->type != REDIS_REPLY_INTEGER ||
                                     it->element[2]->integer >= below_ms))
                    continue;
                argv[k++] = it->element[0]->str;
                n++;
            }
            if (set_idle > 0) {
                argv[k++] = "IDLE";
                argv[k++] = idle;
            }
            argv[k++] = "JUSTID";
            for (int i = 0; i < k; i++)
                lens[i] = strlen(argv[i]);
            redisReply *c = n ? md_redis_cmd_argv(w->r, k, argv, lens, e) : NULL;
            if (n && !c)
                n = -1;
            else if (c && c->type == REDIS_REPLY_ERROR) {
                md_errf(e, MD_EREDIS, "XCLAIM %s: %s", key, c->str);
                n = -1;
            }
            if (c)
                freeReplyObject(c);
        } else {
            md_errf(e, MD_ENOMEM, "out of memory claiming %zu entries", p->elements);
            n = -1;
        }
        free(argv);
        free(lens);
    } else if (p->type == REDIS_REPLY_ERROR) {
        md_errf(e, MD_EREDIS, "XPENDING %s: %s", key, p->str);
        n = -1;
    }
    freeReplyObject(p);
    return n;
}

/* claim_own on one stream, dialling once more when the connection was lost. Under mu. */
static long claim_own_retry(wk_watchdog *w, const char *key, long long set_idle, long long below_ms,
                            md_err *e) {
    long n = claim_own(w, key, set_idle, below_ms, e);
    if (n < 0 && e->code == MD_EREDIS) {
        volatile sig_atomic_t never = 0;
        md_err re = {0};
        if (md_redis_reconnect(w->r, 5000, &never, &re) == 0) {
            md_err_clear(e);
            n = claim_own(w, key, set_idle, below_ms, e);
        }
    }
    return n;
}

static void fire(wk_watchdog *w, const char *what, int limit_ms, double ran_s) {
    MD_ERROR("worker",
             "watchdog: %s has been running for %.1f s (limit %.1f s): the device looks hung; "
             "handing back the requests worker %s holds",
             what, ran_s, limit_ms / 1e3, w->consumer);
    long total = 0;
    int failed = 0;
    /* held throughout: the worker's thread is stuck in its section and changes no stream */
    pthread_mutex_lock(&w->mu);
    for (int i = 0; i < w->n_keys; i++) {
        md_err e = {0};
        long n = -1;
        if (w->r)
            n = claim_own_retry(w, w->keys[i], w->idle_ms, 0, &e);
        else
            md_errf(&e, MD_EREDIS, "no connection yet");
        if (n < 0) {
            failed = 1;
            MD_ERROR("worker",
                     "watchdog: could not hand back the entries of %s: %s (they are "
                     "taken over once their visibility timeout passes)",
                     w->keys[i], e.msg);
        } else {
            total += n;
        }
    }
    pthread_mutex_unlock(&w->mu);
    __atomic_store_n(&w->handed_back, total, __ATOMIC_RELEASE);
    __atomic_store_n(&w->fired, 1, __ATOMIC_RELEASE);
    MD_ERROR("worker", "watchdog: handed back %ld request(s) to other workers%s%s", total,
             failed ? " (some streams could not be reached)" : "",
             w->exit_on_fire ? "; exiting with status 1 so the worker is restarted" : "");
    if (w->exit_on_fire)
        _exit(1);
}

/* The periodic work of a keepalive section that is due at `now`. Under mu. */
static void keep_alive(wk_watchdog *w, uint64_t now, uint64_t *next_hb, uint64_t *next_lease,
                       int *warned) {
    if (!w->r)
        return;
    md_err e = {0};
    long done = 0;
    int bad = 0;
    if (w->hb_key[0] && w->hb_period_ms > 0 && now >= *next_hb) {
        redisReply *rep = md_redis_cmd(w->r, &e, "PEXPIRE %s %d", w->hb_key, w->hb_ttl_ms);
        bad |= !rep;
        done += rep != NULL;
        if (rep)
            freeReplyObject(rep);
        *next_hb = now + (uint64_t)w->hb_period_ms * 1000000ull;
    }
    if (w->lease_ms > 0 && now >= *next_lease) {
        for (int i = 0; i < w->n_keys && !bad; i++) {
            long n = claim_own_retry(w, w->keys[i], 0, w->vis_ms - w->vis_ms / 4, &e);
            bad |= n < 0;
            done += n > 0 ? n : 0;
        }
        *next_lease = now + (uint64_t)w->lease_ms * 1000000ull;
    }
    __atomic_fetch_add(&w->kept_alive, done, __ATOMIC_RELAXED);
    if (bad && !*warned) {
        *warned = 1;
        MD_WARN("worker",
                "watchdog: cannot keep the heartbeat and leases of worker %s alive during a "
                "load: %s (entries it holds are taken over once their visibility timeout "
                "passes)",
                w->consumer, e.msg);
    }
}

static void *wd_main(void *arg) {
    wk_watchdog *w = arg;
    uint64_t seen = 0, next_hb = 0, next_lease = 0;
    int warned = 0;
    while (!__atomic_load_n(&w->quit, __ATOMIC_ACQUIRE)) {
        uint64_t t0 = __atomic_load_n(&w->started, __ATOMIC_ACQUIRE);
        int limit = __atomic_load_n(&w->limit_ms, __ATOMIC_RELAXED);
        int keep = __atomic_load_n(&w->keepalive, __ATOMIC_RELAXED);
        const char *what = __atomic_load_n(&w->what, __ATOMIC_RELAXED);
        long tick_ms = limit > 0 ? limit / 10 : 200;
        tick_ms = tick_ms < 10 ? 10 : tick_ms > 200 ? 200 : tick_ms;
        struct timespec ts = {tick_ms / 1000, (tick_ms % 1000) * 1000000L};
        /* a section that ended or changed while its fields were read is looked at next tick */
        if (!t0 || t0 != __atomic_load_n(&w->started, __ATOMIC_ACQUIRE) ||
            __atomic_load_n(&w->fired, __ATOMIC_ACQUIRE)) {
            nanosleep(&ts, NULL);
            continue;
        }
        uint64_t now = md_mono_ns();
        if (t0 != seen) { /* a new section: its first keepalive half a period in */
            seen = t0;
            warned = 0;
            pthread_mutex_lock(&w->mu);
            int first =
                w->hb_period_ms < w->lease_ms || w->lease_ms <= 0 ? w->hb_period_ms : w->lease_ms;
            pthread_mutex_unlock(&w->mu);
            next_hb = next_lease = t0 + (uint64_t)(first > 0 ? first / 2 : 0) * 1000000ull;
        }
        if (limit > 0 && now > t0 && now - t0 > (uint64_t)limit * 1000000ull) {
            fire(w, what ? what : "a guarded section", limit, (double)(now - t0) / 1e9);
            continue;
        }
        if (keep) {
            pthread_mutex_lock(&w->mu);
            keep_alive(w, now, &next_hb, &next_lease, &warned);
            pthread_mutex_unlock(&w->mu);
        }
        nanosleep(&ts, NULL);
    }
    return NULL;
}

int wk_watchdog_start(const char *group, const char *consumer, long long handback_idle_ms,
                      int exit_on_fire, wk_watchdog **out, md_err *e) {
    *out = NULL;
    wk_watchdog *w = calloc(1, sizeof *w);
    if (!w)
        return md_errf(e, MD_ENOMEM, "watchdog: out of memory");
    snprintf(w->group, sizeof w->group, "%s", group);
    snprintf(w->consumer, sizeof w->consumer, "%s", consumer);
    w->idle_ms = handback_idle_ms;
    w->exit_on_fire = exit_on_fire;
    pthread_mutex_init(&w->mu, NULL);
    if (pthread_create(&w->th, NULL, wd_main, w)) {
        pthread_mutex_destroy(&w->mu);
        free(w);
        return md_errf(e, MD_EIO, "watchdog: cannot start its thread");
    }
    *out = w;
    return 0;
}

int wk_watchdog_connect(wk_watchdog *w, const md_redis_url *u, md_err *e) {
    md_redis *r = NULL;
    int rc = md_redis_open(u, &r, e);
    if (rc)
        return md_errf(e, rc, "watchdog: its own Redis connection: %s", e->msg);
    pthread_mutex_lock(&w->mu);
    md_redis *old = w->r;
    w->r = r;
    pthread_mutex_unlock(&w->mu);
    md_redis_close(old);
    return 0;
}

void wk_watchdog_set_keepalive(wk_watchdog *w, const char *hb_key, int hb_period_ms, int hb_ttl_ms,
                               int lease_ms, int visibility_ms) {
    pthread_mutex_lock(&w->mu);
    snprintf(w->hb_key, sizeof w->hb_key, "%s", hb_key ? hb_key : "");
    w->hb_period_ms = hb_period_ms;
    w->hb_ttl_ms = hb_ttl_ms;
    w->lease_ms = lease_ms;
    w->vis_ms = visibility_ms;
    pthread_mutex_unlock(&w->mu);
}

void wk_watchdog_stop(wk_watchdog *w) {
    if (!w)
        return;
    __atomic_store_n(&w->quit, 1, __ATOMIC_RELEASE);
    pthread_join(w->th, NULL);
    md_redis_close(w->r);
    for (int i = 0; i < w->n_keys; i++)
        free(w->keys[i]);
    free(w->keys);
    pthread_mutex_destroy(&w->mu);
    free(w);
}

void wk_watchdog_set_streams(wk_watchdog *w, const char *const *keys, int n) {
    char **copy = calloc(n > 0 ? (size_t)n : 1, sizeof *copy);
    int k = 0;
    for (int i = 0; copy && i < n; i++)
        if ((copy[k] = strdup(keys[i])))
            k++;
    pthread_mutex_lock(&w->mu);
    for (int i = 0; i < w->n_keys; i++)
        free(w->keys[i]);
    free(w->keys);
    w->keys = copy;
    w->n_keys = copy ? k : 0;
    pthread_mutex_unlock(&w->mu);
}

void wk_watchdog_enter(wk_watchdog *w, const char *what, int limit_ms, int keepalive) {
    __atomic_store_n(&w->what, what, __ATOMIC_RELAXED);
    __atomic_store_n(&w->limit_ms, limit_ms, __ATOMIC_RELAXED);
    __atomic_store_n(&w->keepalive, keepalive, __ATOMIC_RELAXED);
    uint64_t t = md_mono_ns();
    __atomic_store_n(&w->started, t ? t : 1, __ATOMIC_RELEASE);
}

void wk_watchdog_leave(wk_watchdog *w) {
    __atomic_store_n(&w->started, 0, __ATOMIC_RELEASE);
}

int wk_watchdog_fired(const wk_watchdog *w) {
    return __atomic_load_n(&w->fired, __ATOMIC_ACQUIRE);
}

long wk_watchdog_handed_back(const wk_watchdog *w) {
    return __atomic_load_n(&w->handed_back, __ATOMIC_ACQUIRE);
}

long wk_watchdog_kept_alive(const wk_watchdog *w) {
    return __atomic_load_n(&w->kept_alive, __ATOMIC_RELAXED);
}
