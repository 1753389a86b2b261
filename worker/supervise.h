/* supervise.h — one process per device: `medley worker --devices D0,...,Dn-1` runs n complete
 * single-device workers as child processes and keeps them running (docs/design.md §5: one
 * engine per device; each child heartbeats as its own one-device worker). Nothing here knows
 * about Redis or about what the children do:
 *  - sv_devices_split / sv_devices_check turn the --devices list into checked device names
 *    before anything starts;
 *  - sv_run starts each child (fork + exec of its argv), relays its stderr line by line into
 *    ours with the child's name added, restarts a child that dies (exit != 0 or a signal) after
 *    a backoff, gives up on one that keeps failing at startup while the others keep running,
 *    and on stop sends every child SIGTERM and waits for all of them.
 * The caller owns every string and array it passes; sv_run allocates its own state and frees
 * it before returning. */
#ifndef MEDLEY_WORKER_SUPERVISE_H
#define MEDLEY_WORKER_SUPERVISE_H

#include <signal.h>

#include "common/err.h"

#define SV_MAX_CHILDREN 64
#define SV_DEVICE_MAX 32 /* bytes of one device name, NUL included */

/* Split "D0,D1,..." into out[0..n-1]. Syntax only: an empty list, an empty entry ("cpu,,cpu",
 * ",cpu", "cpu,"), an entry of SV_DEVICE_MAX bytes or more, or more than max entries is
 * MD_EINVAL naming the problem. Returns n >= 1, or the error. */
int sv_devices_split(const char *list, char out[][SV_DEVICE_MAX], int max, md_err *e);

/* Check and resolve dev[0..n-1] in place, all of them before anything is started:
 * md_backend_resolve ("auto" becomes cuda:0 or cpu; cuda:K is asked of the driver, so a
 * missing GPU fails here with the driver's reason), then CPU names ("cpu", "cpu:N",
 * "cpu-exact") are checked by md_backend_open's own rules; "cuda" becomes "cuda:0". One GPU
 * named twice is MD_EINVAL (two engines would share its memory); a CPU device may repeat
 * (several CPU engines on one host, each with its own threads). The error names the entry
 * (its position and name) and keeps the backend's reason and code. */
int sv_devices_check(char dev[][SV_DEVICE_MAX], int n, md_err *e);

typedef struct {
    const char *name;  /* the child's name in logs, added to each relayed line ("W.0") */
    const char *what;  /* what it runs on, for the supervisor's own logs ("cuda:1") */
    char *const *argv; /* NULL-terminated; argv[0] is the name the child sees */
} sv_child;

typedef struct {
    const char *exe; /* program every child execs (default "/proc/self/exe") */
    const sv_child *children;
    int n;
    /* Relayed lines: with json, a line that is a JSON object gets a "worker": name member
     * and any other line becomes {"ts","level":"info","component":"stderr","msg","worker"};
     * without, each line is prefixed "[name] ". */
    int json;
    int backoff_min_ms, backoff_max_ms; /* restart delay: min, doubled per failure up to max
                                           (1000, 30000) */
    int stable_ms;                      /* a child that ran this long before dying restarts after
                                           backoff_min_ms again (60000) */
    int startup_ms;           /* a child that dies sooner than this failed at startup (10000) */
    int max_startup_failures; /* consecutive startup failures before giving up on it (5) */
    int drained_code;         /* a child's exit code after an operator's drain (0: none) */
} sv_config;

void sv_config_default(sv_config *c);

/* Run cfg's children until *stop (set by the caller's SIGTERM/SIGINT handler, which must not
 * use SA_RESTART so the wait wakes up), then send each running child SIGTERM and wait for all
 * to exit. A child that exits 0 by itself was stopped on purpose and is not restarted.
 * Children get SIGTERM if the supervisor dies (PR_SET_PDEATHSIG), so none outlives it.
 * Returns 0 when every child ended cleanly (exit 0, or killed by the SIGTERM sv_run sent on
 * stop before it could install its handler) and none was given up on; otherwise MD_EIO naming
 * the children that did not, also as soon as no child is left running or waiting to restart.
 * A child exiting with drained_code (an operator drained it) is not restarted either; when
 * every child ended so, returns SV_DRAINED (positive). */
#define SV_DRAINED 1
int sv_run(const sv_config *cfg, volatile sig_atomic_t *stop, md_err *e);

#endif
