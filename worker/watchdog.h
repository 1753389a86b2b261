/* watchdog.h — a worker's guard against a device step that never returns (a GPU kernel that
 * hangs, a driver stuck in a wait): nothing else in the worker runs while a step runs, so
 * without it leases would lapse silently and the process would sit there forever.
 *
 * A thread watches how long the step in progress has run (wk_watchdog_enter / _leave around
 * each runner poll). Past the limit it says so in the log, hands back every entry this
 * consumer holds on the streams it was told about — through a Redis connection of its own,
 * XPENDING by consumer then XCLAIM to itself with IDLE past the visibility timeout and
 * JUSTID, as a failed device's hand-back does, so other workers take them over at once and
 * the delivery count is unchanged — and then ends the process with status 1 (a context
 * stuck in a kernel cannot be recovered in-process; a supervisor restarts the worker).
 * With exit_on_fire 0 it only marks itself fired (wk_watchdog_fired), for tests and for
 * callers that recover the step themselves.
 *
 * Thread-safety: enter/leave/fired are lock-free and cheap (one atomic store or load); the
 * stream list is copied under a mutex. */
#ifndef MEDLEY_WORKER_WATCHDOG_H
#define MEDLEY_WORKER_WATCHDOG_H

#include "common/err.h"
#include "common/redis.h"

typedef struct wk_watchdog wk_watchdog;

/* Start the thread. u: where the worker's Redis is (a connection of the watchdog's own is
 * opened now, so a hung device cannot also keep it from reaching Redis); consumer: the
 * worker's consumer name in group `group`; limit_ms > 0: the longest a step may run;
 * handback_idle_ms: the idle time given to handed-back entries. */
int wk_watchdog_start(const md_redis_url *u, const char *group, const char *consumer, int limit_ms,
                      long long handback_idle_ms, int exit_on_fire, wk_watchdog **out, md_err *e);
/* Stop the thread and close its connection (NULL: nothing). */
void wk_watchdog_stop(wk_watchdog *w);

/* The streams whose pending entries are this worker's to hand back (copied). */
void wk_watchdog_set_streams(wk_watchdog *w, const char *const *keys, int n);

/* A step begins / has ended. */
void wk_watchdog_enter(wk_watchdog *w);
void wk_watchdog_leave(wk_watchdog *w);

/* 1 once the limit passed (and the entries were handed back); the number handed back. */
int wk_watchdog_fired(const wk_watchdog *w);
long wk_watchdog_handed_back(const wk_watchdog *w);

#endif
