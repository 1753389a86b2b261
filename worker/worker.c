/* worker.c — see worker.h. One thread: a loop that polls the runners, writes finished answers
 * (completion script, then XACK), does the periodic work (lease renewal, takeover, heartbeat)
 * and reads as many new entries as the runners have free slots, blocking only when idle.
 *
 * This file holds the loop (wk_run and its steps: startup, the connection and its healing,
 * polling, the periodic work, stopping) and owns wk's identity, connection, clocks and step
 * watchdog; reading, answering, leases and the plan live in the files worker_int.h lists,
 * as does the invariant that makes results effectively-once. */
#include "worker/worker.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "common/redis.h"
#include "common/util.h"
#include "engine/shard/pipeline.h"
#include "kernels/backend.h"
#include "queue/online.h"
#include "queue/queue.h"
#include "worker/worker_int.h"

void wk_config_default(wk_config *c) {
    memset(c, 0, sizeof *c);
    c->prefix = "medley:";
    q_limits_default(&c->limits);
    c->visibility_ms = 60000;
    c->max_attempts = 3;
    c->block_ms = 1000;
    c->heartbeat_ms = 5000;
    c->step_timeout_ms = -1;
    c->step_timeout_exit = 1;
    c->load_timeout_ms = -1;
    c->grace_ms = 30000;
    c->connect_timeout_ms = 2000;
    c->command_timeout_ms = 10000;
    c->plan_check_ms = 1000;
    c->online_reserve = 1;
}

/* A new connection: create the groups of every stream. The completion script runs by its
 * SHA1 (EVALSHA); it is loaded by submitters, or by the worker on NOSCRIPT when its user may
 * (the medley-worker role may not: docs/operations.md), never ahead, so a role without
 * SCRIPT LOAD leaves no refusal in the ACL log. */
static int setup_conn(wk *w, md_err *e) {
    int rc = 0;
    q_script_sha(q_complete_lua, w->sha);
    for (int s = 0; s < MAX_STREAMS; s++) {
        if (w->st[s].state == SLOT_FREE || !(rc = wk_create_group(w, w->st[s].key, e)))
            continue;
        if (rc == MD_EREDIS)
            return rc;
        /* Refused (OOM under noeviction: XGROUP CREATE may grow memory). The group most
         * likely exists; if not, XREADGROUP says NOGROUP and the setup runs again. */
        MD_WARN("worker", "%s", e->msg);
    }
    w->gen = md_redis_generation(w->r);
    return 0;
}

/* Reconnect (forever, until stop) and set up again; then resume what is pending for us (a
 * read whose reply was lost with the connection left entries we never saw). A node that
 * takes the connection but refuses the setup (a replica behind a redis:// URL answers
 * -READONLY) is retried with the same backoff as a failed dial, not in a busy loop. */
static int heal(wk *w, int until_stop) {
    md_err e = {0};
    int backoff_ms = 0, tries = 0;
    /* A connection lost again within a second of the last heal (a node that takes the
     * setup but refuses the next write: a primary without its replicas answers NOREPLICAS
     * to writes its OOM check lets through) backs off too, doubling to 2 s. */
    uint64_t now = md_mono_ns();
    if (w->healed_ns && now - w->healed_ns < 1000000000ull) {
        w->flap_ms = w->flap_ms ? (w->flap_ms * 2 > 2000 ? 2000 : w->flap_ms * 2) : 100;
        backoff_ms = w->flap_ms;
    } else {
        w->flap_ms = 0;
    }
    for (;;) {
        /* backoff after a refused setup: 100 ms doubling to 2 s */
        for (int t = 0; t < backoff_ms && !(until_stop && *w->stop); t += 20)
            usleep(20000);
        if (md_redis_reconnect(w->r, -1, until_stop ? w->stop : NULL, &e))
            return -1;
        if (setup_conn(w, &e) == 0) {
            w->broken = 0;
            w->healed_ns = md_mono_ns();
            for (int s = 0; s < MAX_STREAMS; s++)
                snprintf(w->st[s].cursor, ENTRY_ID_MAX, "0-0");
            /* Run the script again for answers not yet XACKed: a Redis that restarted with
             * `appendfsync everysec` may have lost the script's writes of the last second.
             * Harmless when they survived (the script returns 0). */
            for (int i = 0; i < w->n_ans; i++)
                w->ans[i].scripted = 0;
            if (!*w->stop)
                wk_take_own(w, w->resume_counted); /* counted: the start's resume is still due */
            w->resume_counted = 0;
            return 0;
        }
        if (tries++ % 10 == 0)
            MD_WARN("worker", "after reconnecting: %s (try %d; next in %d ms)", e.msg, tries,
                    backoff_ms ? backoff_ms : 100);
        backoff_ms = backoff_ms ? (backoff_ms * 2 > 2000 ? 2000 : backoff_ms * 2) : 100;
    }
}

static int n_served(wk *w) {
    int n = 0;
    for (int m = 0; m < WK_MAX_MODELS; m++)
        n += w->mod[m].state != SLOT_FREE;
    return n;
}

/* Poll every model's runner, each step under the watchdog's limit; only a lone model may
 * wait (wait_ms) for its step, so that one model does not hold up the others. A runner's
 * error marks the device failed; then what failed devices held is handed back. */
static void poll_all(wk *w, int wait_ms) {
    md_err e = {0};
    int one = n_served(w) == 1;
    wk_watch_streams(w);
    for (int m = 0; m < WK_MAX_MODELS; m++) {
        model *md = &w->mod[m];
        if (md->state == SLOT_FREE || !md->runner || wk_runner_live(md->runner) <= 0)
            continue;
        int guard = w->wd && w->step_limit_ms > 0;
        if (guard)
            wk_watchdog_enter(w->wd, "a device step", w->step_limit_ms, 0);
        int rc = wk_runner_poll(md->runner, one ? wait_ms : 0, wk_on_done, w, &e);
        wk_metrics_polled(w, m);
        if (guard) {
            wk_watchdog_leave(w->wd);
            if (wk_watchdog_fired(w->wd)) {
                char why[128];
                snprintf(why, sizeof why,
                         "a device step ran past the %d ms limit: the device looks hung",
                         w->step_limit_ms);
                wk_after_watchdog(w, why);
                return;
            }
        }
        if (rc) {
            MD_ERROR("worker", "model %s: %s", md->name, e.msg);
            if (md->sh.on) { /* a stage failed: hand back, form the replica again */
                wk_shard_failed(w, m, &e);
                continue;
            }
            if (!w->device_failed) {
                w->device_failed = 1;
                md_errf(&w->dev_err, e.code ? e.code : MD_EDEVICE, "model %s: %s", md->name, e.msg);
            }
        }
    }
    wk_online_publish(w);
    wk_hand_back(w);
}

/* Spread the wall time since the last tick over the running jobs (the cost share). */
static void tick(wk *w) {
    uint64_t now = md_mono_ns();
    double dt = (double)(now - w->last_tick) / 1e9;
    w->last_tick = now;
    if (w->live <= 0)
        return;
    double each = dt / w->live;
    for (int m = 0; m < WK_MAX_MODELS; m++)
        for (int i = 0; i < w->mod[m].n_jobs; i++)
            if (w->mod[m].jobs[i].used)
                w->mod[m].jobs[i].share_s += each;
}

/* The work that runs on its own clock: lease renewal (every third of the visibility
 * timeout), the plan check, reaping drained slots, the heartbeat and taking over idle
 * entries (every half visibility timeout, at most 5 s). */
static void periodic(wk *w, int stopping) {
    uint64_t now = md_mono_ns();
    uint64_t vis = (uint64_t)w->cfg->visibility_ms * 1000000ull;
    if (w->live > 0 && now - w->last_lease > vis / 3) {
        wk_renew(w, 0, 0);
        w->last_lease = now;
    }
    if (!stopping && !w->broken &&
        now - w->last_plan > (uint64_t)w->cfg->plan_check_ms * 1000000ull) {
        if (w->cfg->follow_plan)
            wk_check_plan(w);
        else
            wk_check_classes(w);
        w->last_plan = md_mono_ns();
    }
    if (!w->broken)
        wk_reap(w);
    if (!stopping && !w->broken)
        wk_shard_tick(w);
    if (!w->broken && now - w->last_hb > (uint64_t)w->cfg->heartbeat_ms * 1000000ull) {
        if (wk_heartbeat(w, stopping ? "draining" : "running", (double)(now - w->last_hb) / 1e9) ==
            0) {
            wk_roles_refresh(w); /* the stage keys' TTL goes with the heartbeat's */
            wk_metrics_heartbeat(w);
        }
        w->last_hb = now;
    }
    uint64_t claim_every = vis / 2 < 5000000000ull ? vis / 2 : 5000000000ull;
    if (!stopping && !w->broken && !wk_write_blocked(w)) {
        int due = now - w->last_claim > claim_every;
        wk_take_over(w, due);
        if (due && !w->broken)
            wk_audit_acks(w);
        if (due)
            w->last_claim = md_mono_ns();
    }
    if (!w->broken)
        wk_metrics_tick(w);
}

/* The models of the command line, each read from its online lane P online:{M} and from
 * P q:{M}. A model with a remote stage (--stages) is formed later, in the loop: its stages
 * may not be up yet. */
static int open_all(wk *w, const wk_config *cfg, md_err *e) {
    for (int i = 0; i < cfg->n_models; i++) {
        int remote = wk_spec_remote(cfg->runner.stages);
        int m = remote ? wk_new_model(w, cfg->models[i], e) : wk_add_model(w, cfg->models[i], e);
        if (m < 0)
            return m;
        if (remote)
            wk_shard_start(w, m, NULL, cfg->runner.stages);
        char key[Q_KEY_MAX];
        q_key_online(key, w->prefix, cfg->models[i]);
        int rc = wk_add_stream(w, m, key, e);
        q_key_queue(key, w->prefix, cfg->models[i]);
        if (rc || (rc = wk_add_stream(w, m, key, e)))
            return rc;
    }
    return 0;
}

/* Stop the watchdog and the metrics server, and free the models, answers and connection. */
static void close_all(wk *w) {
    wk_watchdog_stop(w->wd);
    w->wd = NULL;
    wk_metrics_stop(w);
    for (int m = 0; m < WK_MAX_MODELS; m++) {
        if (w->mod[m].runner)
            wk_runner_close(w->mod[m].runner);
        free(w->mod[m].jobs);
    }
    for (int i = 0; i < w->n_ans; i++)
        free(w->ans[i].line);
    free(w->ans);
    md_redis_close(w->r);
}

/* The checks of cfg that need no Redis and no model. */
static int check_config(const wk_config *cfg, md_err *e) {
    if (cfg->n_models <= 0 && !cfg->follow_plan)
        return md_errf(e, MD_EINVAL,
                       "no model to serve (give --model NAME, e.g. --model echo, or "
                       "--follow-plan)");
    if (cfg->n_models > 0 && cfg->follow_plan)
        return md_errf(e, MD_EINVAL,
                       "--model and --follow-plan exclude each other: a worker serves either "
                       "the models it is given or those the plan gives it");
    if (cfg->visibility_ms < 100 || cfg->max_attempts < 1 || cfg->heartbeat_ms < 100 ||
        cfg->plan_check_ms < 10)
        return md_errf(e, MD_EINVAL,
                       "visibility must be >= 100 ms, max_attempts >= 1, the heartbeat >= 100 ms "
                       "and the plan check >= 10 ms");
    const char *spec = cfg->runner.stages;
    if (spec && *spec) {
        if (cfg->follow_plan)
            return md_errf(e, MD_EINVAL,
                           "--stages and --follow-plan exclude each other: under a plan the "
                           "plan's replicas say the stages");
        if (cfg->n_models != 1 || !strcmp(cfg->models[0], "echo"))
            return md_errf(e, MD_EINVAL, "--stages runs one engine model: give one --model");
        md_stage_spec sp[MD_STAGE_MAX];
        int n;
        if (md_stages_parse(spec, -1, sp, MD_STAGE_MAX, &n, e))
            return md_errctx(e, "--stages %s: ", spec);
    }
    return 0;
}

/* Who this worker is: its key prefix, consumer name (--id, else <host>-<pid>-<random>), the
 * keys named after them, and the CUDA device's name and memory for the heartbeat. */
static int identify(wk *w, md_err *e) {
    const wk_config *cfg = w->cfg;
    snprintf(w->prefix, sizeof w->prefix, "%s", cfg->prefix ? cfg->prefix : "medley:");
    int rc = q_prefix_check(w->prefix, e);
    if (rc)
        return rc;
    gethostname(w->host, sizeof w->host - 1);
    if (cfg->id && *cfg->id) {
        snprintf(w->me, sizeof w->me, "%s", cfg->id);
    } else {
        char hex[9];
        md_random_hex(hex, sizeof hex, 8);
        snprintf(w->me, sizeof w->me, "%s-%d-%s", w->host, (int)getpid(), hex);
    }
    q_key_events(w->events, w->prefix);
    q_key_worker(w->wkey, w->prefix, w->me);
    w->started_ms = md_wall_ms();
    md_device_id did;
    md_device_info cd;
    md_err ce = {0};
    if (md_device_parse(cfg->runner.device, &did, &ce) == 0 && did.kind == MD_DEVICE_CUDA &&
        md_device_get(did.index, &cd, &ce) == 0) {
        snprintf(w->gpu_name, sizeof w->gpu_name, "%s", cd.name);
        w->gpu_bytes = cd.total_bytes;
    }
    return 0;
}

/* Start the watchdog, open the command line's models under it, connect to Redis (scripts,
 * groups) and give the watchdog its own connection. On an error the caller closes what was
 * opened (close_all). */
static int start(wk *w, md_err *e) {
    const wk_config *cfg = w->cfg;
    /* The watchdog: a step past its limit (auto: 2 minutes on a CUDA device, none on the CPU)
     * or a load past its limit (auto: 10 minutes on a CUDA device, none on the CPU) means a
     * hung device; loads keep the heartbeat and leases alive. It runs from the first load on
     * and gets its Redis connection once the worker has one. */
    const char *dev = cfg->runner.device;
    int on_cuda = dev && !strncmp(dev, "cuda", 4);
    w->step_limit_ms = cfg->step_timeout_ms >= 0 ? cfg->step_timeout_ms : on_cuda ? 120000 : 0;
    w->load_limit_ms = cfg->load_timeout_ms >= 0 ? cfg->load_timeout_ms : on_cuda ? 600000 : 0;
    int rc;
    if ((rc = wk_watchdog_start(Q_GROUP, w->me, (long long)cfg->visibility_ms + 1000,
                                cfg->step_timeout_exit, &w->wd, e)))
        return rc;
    if ((rc = open_all(w, cfg, e)))
        return rc;
    md_redis_url u;
    if ((rc = md_redis_url_parse(cfg->redis_url ? cfg->redis_url : md_redis_default_url(), &u, e)))
        return rc;
    if (cfg->connect_timeout_ms > 0)
        u.connect_timeout_ms = cfg->connect_timeout_ms;
    if (cfg->command_timeout_ms > 0)
        u.command_timeout_ms = cfg->command_timeout_ms;
    if (u.command_timeout_ms > 0 && u.command_timeout_ms <= cfg->block_ms + 1000)
        u.command_timeout_ms = cfg->block_ms + 1000; /* a BLOCKed read must not time out */
    if ((rc = md_redis_open(&u, &w->r, e)) || (rc = md_redis_check_prefix(w->r, w->prefix, e)))
        return rc;
    if ((rc = setup_conn(w, e))) {
        if (rc != MD_EREDIS)
            return rc;
        /* Connected, then lost or refused (a primary without its replicas answers
         * NOREPLICAS, a demoted one READONLY): the loop reconnects with backoff. */
        MD_WARN("worker", "setting up the connection: %s; retrying", e->msg);
        w->broken = 1;
    }
    if ((rc = wk_watchdog_connect(w->wd, &u, e)))
        return rc;
    wk_watchdog_set_keepalive(w->wd, w->wkey, cfg->heartbeat_ms, 3 * cfg->heartbeat_ms,
                              cfg->visibility_ms / 3, cfg->visibility_ms);
    char where[700];
    md_redis_url_describe(&u, where, sizeof where);
    if (cfg->follow_plan)
        MD_INFO("worker", "worker %s following the plan at %splan from %s (device {%s}/0, type %s)",
                w->me, w->prefix, where, w->me, wk_dev_type(w, -1));
    else if (w->mod[0].runner)
        MD_INFO("worker", "worker %s serving %d model(s) from %s (first: %s, %s runner, %d slots)",
                w->me, cfg->n_models, where, w->mod[0].name, wk_runner_kind(w->mod[0].runner),
                wk_runner_capacity(w->mod[0].runner));
    else
        MD_INFO("worker", "worker %s serving %s from %s once its stages answer (%s)", w->me,
                w->mod[0].name, where, cfg->runner.stages);

    if (w->step_limit_ms > 0 || w->load_limit_ms > 0)
        MD_INFO("worker",
                "watchdog: a step running over %d ms or a model load over %d ms (0: no "
                "limit) hands back every request and %s",
                w->step_limit_ms, w->load_limit_ms,
                cfg->step_timeout_exit ? "exits 1" : "stops the worker");
    return 0;
}

/* A turn of a stopping worker (stop_at: when it began to stop): 1 when the loop may end,
 * because nothing runs and every answer is written, or because the grace period is over and
 * what still ran was handed back. */
static int drain_turn(wk *w, uint64_t stop_at) {
    if (w->live == 0 && w->n_ans == 0)
        return 1;
    if (md_mono_ns() - stop_at > (uint64_t)w->cfg->grace_ms * 1000000ull) {
        MD_WARN("worker", "grace period over: handing back %d running request(s)", w->live);
        wk_renew(w, (long long)w->cfg->visibility_ms + 1000, 0);
        wk_flush(w);
        return 1;
    }
    if (w->live > 0)
        poll_all(w, 10);
    return 0;
}

/* How long the next read may block: only when nothing runs and nothing waits to be
 * written. */
static int read_block_ms(const wk *w) {
    const wk_config *cfg = w->cfg;
    /* A blocked read must not outlast half a heartbeat period (the heartbeat key lives 3
     * periods) nor the plan check period while following a plan. */
    int block_max = cfg->block_ms < cfg->heartbeat_ms / 2 ? cfg->block_ms : cfg->heartbeat_ms / 2;
    if (cfg->follow_plan && cfg->plan_check_ms < block_max)
        block_max = cfg->plan_check_ms;
    return (w->live == 0 && w->n_ans == 0) ? block_max : 0;
}

/* The loop, until stopped (SIGTERM, a failed device, a drain asked) and drained, or stopped
 * while Redis is away. */
static void serve(wk *w) {
    uint64_t stop_at = 0;
    int idle_reads = 0;
    for (;;) {
        if (w->broken || w->gen != md_redis_generation(w->r)) {
            if (w->broken)
                MD_WARN("worker", "lost Redis; reconnecting (%d answers held%s)", w->n_ans,
                        w->flap_ms ? "; it keeps dropping: backing off" : "");
            if (heal(w, 1))
                break; /* stopped while Redis is away: unacked entries are redelivered */
        }
        int stopping = *w->stop != 0 || w->device_failed || w->drain_asked;
        if (stopping && !stop_at) {
            stop_at = md_mono_ns();
            MD_INFO("worker", "stopping%s: finishing %d running request(s), grace %d ms",
                    w->device_failed ? " (a device failed)"
                    : w->drain_asked ? " (drain asked)"
                                     : "",
                    w->live, w->cfg->grace_ms);
        }
        tick(w);
        poll_all(w, idle_reads > 0 ? 5 : 0);
        wk_flush(w);
        if (w->broken)
            continue;
        periodic(w, stopping);
        if (w->broken)
            continue;
        if (w->device_failed && !stopping)
            continue; /* read nothing more: the next turn stops */
        if (stopping) {
            if (drain_turn(w, stop_at))
                break;
            continue;
        }
        if (w->drain_hold == 1) { /* drained by an operator: nothing until undrained */
            usleep(50000);
            continue;
        }
        if (wk_write_blocked(w)) { /* Redis refuses answers: take no more work meanwhile */
            usleep(20000);
            continue;
        }
        int got = wk_read_new(w, read_block_ms(w));
        idle_reads = got == 0 ? idle_reads + 1 : 0;
    }
}

/* After the loop: drop the heartbeat key, say what was done and free everything. A failed
 * device that stopped the worker is its result. */
static int finish(wk *w, md_err *e) {
    wk_roles_stop(w);
    if (!w->broken) {
        md_err e2 = {0};
        redisReply *rep = md_redis_cmd(w->r, &e2, "DEL %s", w->wkey);
        if (rep)
            freeReplyObject(rep);
    }
    MD_INFO("worker",
            "worker %s stopped: %lld completed, %lld failed, %d answer(s) not written "
            "(they will be redelivered)",
            w->me, w->n_ok, w->n_failed, w->n_ans);
    close_all(w);
    if (w->device_failed)
        return md_errf(e, w->dev_err.code,
                       "%s (%ld request(s) it was running handed back to other "
                       "workers)",
                       w->dev_err.msg, w->n_handed_back);
    return w->drain_asked ? WK_DRAINED : 0;
}

int wk_run(const wk_config *cfg, volatile sig_atomic_t *stop, md_err *e) {
    int rc = check_config(cfg, e);
    if (rc)
        return rc;
    wk w = {0};
    w.cfg = cfg;
    w.stop = stop;
    w.plan_applied = -1;
    w.drain_hold = -1;
    w.plan_seen = -2;
    w.cls_seen = -2;
    if ((rc = identify(&w, e)) || (rc = wk_metrics_start(&w, e)))
        return rc;
    if ((rc = start(&w, e))) {
        close_all(&w);
        return rc;
    }
    if (w.broken)
        w.resume_counted = 1; /* the first heal resumes a predecessor's entries */
    else
        wk_take_own(&w, 1);
    uint64_t t = md_mono_ns();
    w.last_tick = t;
    w.last_lease = t;
    w.last_claim = 0; /* take over at once: a restarted worker finds its predecessors' work */
    w.last_hb = 0;
    w.last_plan = 0;
    serve(&w);
    return finish(&w, e);
}
