/* watchdog.h — a worker's guard against a device that stops answering (a GPU kernel that
 * hangs, a driver stuck in a wait, a weight upload that never completes): nothing else in the
 * worker runs while a step or a model load runs, so without it leases and heartbeats would
 * lapse silently and the process would sit there forever.
 *
 * A thread watches the guarded section in progress (wk_watchdog_enter / _leave around each
 * runner poll and each model load), each section with its own limit:
 *
 * - Past the limit it says so in the log, hands back every entry this consumer holds on the
 *   streams it was told about — through a Redis connection of its own, XPENDING by consumer
 *   then XCLAIM to itself with IDLE past the visibility timeout and JUSTID, as a failed
 *   device's hand-back does, so other workers take them over at once and the delivery count
 *   is unchanged — and then ends the process with status 1 (a context stuck in a kernel
 *   cannot be recovered in-process; a supervisor restarts the worker). With exit_on_fire 0
 *   it only marks itself fired (wk_watchdog_fired), for tests and for callers that recover
 *   the section themselves.
 * - In a section entered with keepalive (a model load: tens of seconds for a large model,
 *   with the worker possibly holding requests of the models it already serves), it does the
 *   periodic work the worker's thread cannot: every heartbeat period it extends the
 *   heartbeat key's life (PEXPIRE), so the scheduler does not take the worker for dead, and
 *   every lease period it renews the entries this consumer holds whose idle time is below
 *   the visibility timeout (XCLAIM ... JUSTID without IDLE; entries already handed back,
 *   idle past it, stay free for others).
 *
 * The thread may run before it has a connection (wk_watchdog_connect): a section that runs
 * past its limit then has nothing to hand back and only ends the process.
 *
 * Thread-safety: enter/leave/fired are lock-free and cheap (atomic stores and loads); the
 * stream list and the connection are set under a mutex. */
#ifndef MEDLEY_WORKER_WATCHDOG_H
#define MEDLEY_WORKER_WATCHDOG_H

#include "common/err.h"
#include "common/redis.h"

typedef struct wk_watchdog wk_watchdog;

/* Start the thread. consumer: the worker's consumer name in group `group`; handback_idle_ms:
 * the idle time given to handed-back entries (the visibility timeout and a margin). */
int wk_watchdog_start(const char *group, const char *consumer, long long handback_idle_ms,
                      int exit_on_fire, wk_watchdog **out, md_err *e);
/* Open the watchdog's own connection to the worker's Redis at u (so that a hung device
 * cannot also keep it from reaching Redis). */
int wk_watchdog_connect(wk_watchdog *w, const md_redis_url *u, md_err *e);
/* What keepalive sections keep alive: the heartbeat key hb_key (TTL hb_ttl_ms, extended
 * every hb_period_ms) and leases (renewed every lease_ms, entries idle less than
 * visibility_ms). */
void wk_watchdog_set_keepalive(wk_watchdog *w, const char *hb_key, int hb_period_ms, int hb_ttl_ms,
                               int lease_ms, int visibility_ms);
/* Stop the thread and close its connection (NULL: nothing). */
void wk_watchdog_stop(wk_watchdog *w);

/* The streams whose pending entries are this worker's to hand back (copied). */
void wk_watchdog_set_streams(wk_watchdog *w, const char *const *keys, int n);

/* A guarded section begins: `what` names it in the log ("a device step", "loading model M";
 * the caller keeps the string alive until wk_watchdog_leave); limit_ms > 0: the longest it
 * may run, 0: no limit; keepalive: heartbeats and leases are kept alive meanwhile. */
void wk_watchdog_enter(wk_watchdog *w, const char *what, int limit_ms, int keepalive);
/* The section has ended. */
void wk_watchdog_leave(wk_watchdog *w);

/* 1 once a limit passed (and the entries were handed back); the number handed back. */
int wk_watchdog_fired(const wk_watchdog *w);
long wk_watchdog_handed_back(const wk_watchdog *w);
/* Keepalive work done so far: heartbeat extensions and entries renewed (for tests). */
long wk_watchdog_kept_alive(const wk_watchdog *w);

#endif
