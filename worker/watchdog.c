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
    md_redis *r;
    char group[64], consumer[160];
    int limit_ms, exit_on_fire;
    long long idle_ms;
    uint64_t started; /* mono ns of the step in progress, 0 between steps (atomic) */
    int quit;         /* atomic */
    int fired;        /* atomic */
    long handed_back; /* atomic */
    pthread_mutex_t mu;
    char **keys; /* under mu */
    int n_keys;
};

/* XPENDING + XCLAIM ... IDLE JUSTID on one stream: the entries this consumer holds there. */
static long hand_back_stream(wk_watchdog *w, const char *key, md_err *e) {
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
        snprintf(idle, sizeof idle, "%lld", w->idle_ms);
        int k = 0;
        if (argv && lens) {
            argv[k++] = "XCLAIM";
            argv[k++] = key;
            argv[k++] = w->group;
            argv[k++] = w->consumer;
            argv[k++] = "0";
            for (size_t i = 0; i < p->elements; i++) {
                redisReply *it = p->element[i];
                if (it->type == REDIS_REPLY_ARRAY && it->elements >= 1 &&
                    it->element[0]->type == REDIS_REPLY_STRING) {
                    argv[k++] = it->element[0]->str;
                    n++;
                }
            }
            argv[k++] = "IDLE";
            argv[k++] = idle;
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
            md_errf(e, MD_ENOMEM, "out of memory handing back %zu entries", p->elements);
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

static void fire(wk_watchdog *w, double ran_s) {
    MD_ERROR("worker",
             "watchdog: a device step has been running for %.1f s (limit %.1f s): the device "
             "looks hung; handing back the requests worker %s holds",
             ran_s, w->limit_ms / 1e3, w->consumer);
    long total = 0;
    int failed = 0;
    /* held throughout: the worker's thread is stuck in its step and changes no stream */
    pthread_mutex_lock(&w->mu);
    for (int i = 0; i < w->n_keys; i++) {
        md_err e = {0};
        long n = hand_back_stream(w, w->keys[i], &e);
        if (n < 0 && e.code == MD_EREDIS) { /* the connection: dial once more, then retry */
            volatile sig_atomic_t never = 0;
            md_err re = {0};
            if (md_redis_reconnect(w->r, 5000, &never, &re) == 0) {
                md_err_clear(&e);
                n = hand_back_stream(w, w->keys[i], &e);
            }
        }
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

static void *wd_main(void *arg) {
    wk_watchdog *w = arg;
    long tick_ms = w->limit_ms / 10;
    if (tick_ms < 10)
        tick_ms = 10;
    if (tick_ms > 200)
        tick_ms = 200;
    struct timespec ts = {tick_ms / 1000, (tick_ms % 1000) * 1000000L};
    while (!__atomic_load_n(&w->quit, __ATOMIC_ACQUIRE)) {
        nanosleep(&ts, NULL);
        uint64_t t0 = __atomic_load_n(&w->started, __ATOMIC_ACQUIRE);
        if (!t0 || __atomic_load_n(&w->fired, __ATOMIC_ACQUIRE))
            continue;
        uint64_t now = md_mono_ns();
        if (now > t0 && now - t0 > (uint64_t)w->limit_ms * 1000000ull)
            fire(w, (double)(now - t0) / 1e9);
    }
    return NULL;
}

int wk_watchdog_start(const md_redis_url *u, const char *group, const char *consumer, int limit_ms,
                      long long handback_idle_ms, int exit_on_fire, wk_watchdog **out, md_err *e) {
    *out = NULL;
    if (limit_ms <= 0)
        return md_errf(e, MD_EINVAL, "watchdog: the step limit must be > 0 ms (got %d)", limit_ms);
    wk_watchdog *w = calloc(1, sizeof *w);
    if (!w)
        return md_errf(e, MD_ENOMEM, "watchdog: out of memory");
    snprintf(w->group, sizeof w->group, "%s", group);
    snprintf(w->consumer, sizeof w->consumer, "%s", consumer);
    w->limit_ms = limit_ms;
    w->idle_ms = handback_idle_ms;
    w->exit_on_fire = exit_on_fire;
    pthread_mutex_init(&w->mu, NULL);
    int rc = md_redis_open(u, &w->r, e);
    if (rc) {
        md_errf(e, rc, "watchdog: its own Redis connection: %s", e->msg);
        pthread_mutex_destroy(&w->mu);
        free(w);
        return rc;
    }
    if (pthread_create(&w->th, NULL, wd_main, w)) {
        md_redis_close(w->r);
        pthread_mutex_destroy(&w->mu);
        free(w);
        return md_errf(e, MD_EIO, "watchdog: cannot start its thread");
    }
    *out = w;
    return 0;
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

void wk_watchdog_enter(wk_watchdog *w) {
    __atomic_store_n(&w->started, md_mono_ns(), __ATOMIC_RELEASE);
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
