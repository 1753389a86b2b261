/* worker_model.c — a model slot's runner: a free slot for a model, its runner opened under the
 * step watchdog's load limit (leases and heartbeat kept alive meanwhile; a load that outruns
 * it stops the worker as a hung device) and the job slots its capacity gives. Below
 * worker_plan.c and worker_shard.c, which both open runners; it calls only worker_lease.c
 * (the watchdog's view of the streams and its verdict). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker/worker_int.h"

/* A free model slot for name, serving, with no runner yet. Returns the slot or an error. */
int wk_new_model(wk *w, const char *name, md_err *e) {
    int m = -1;
    for (int k = 0; k < WK_MAX_MODELS && m < 0; k++)
        if (w->mod[k].state == SLOT_FREE)
            m = k;
    if (m < 0)
        return md_errf(e, MD_EINVAL, "at most %d models at a time", WK_MAX_MODELS);
    model *md = &w->mod[m];
    memset(md, 0, sizeof *md);
    snprintf(md->name, sizeof md->name, "%s", name);
    md->state = SLOT_ON;
    return m;
}

/* Open model m's runner with o and its job slots, under the watchdog (its load limit;
 * heartbeat and leases kept alive meanwhile). */
int wk_open_runner(wk *w, int m, const wk_runner_opts *o, md_err *e) {
    model *md = &w->mod[m];
    if (w->wd) {
        wk_watch_streams(w); /* what it hands back or keeps leased: the streams served so far */
        snprintf(w->load_what, sizeof w->load_what, "loading %s", md->name);
        wk_watchdog_enter(w->wd, w->load_what, w->load_limit_ms, 1);
    }
    wk_runner *r = NULL;
    int rc = wk_runner_open(md->name, o, &r, e);
    if (w->wd) {
        wk_watchdog_leave(w->wd);
        if (wk_watchdog_fired(w->wd)) { /* it gave up on the load: so does the worker */
            if (!rc)
                wk_runner_close(r);
            char why[sizeof w->dev_err.msg];
            snprintf(why, sizeof why,
                     "loading %s ran past the %d ms limit (--load-timeout-ms): the device looks "
                     "hung",
                     md->name, w->load_limit_ms);
            wk_after_watchdog(w, why);
            return md_errf(e, MD_EDEVICE, "%s", why);
        }
    }
    if (rc)
        return rc;
    int cap = wk_runner_capacity(r);
    if (cap != md->n_jobs) { /* every old slot is free: the runner they ran on is closed */
        job *jobs = calloc((size_t)cap, sizeof *jobs);
        if (!jobs) {
            wk_runner_close(r);
            return md_errf(e, MD_ENOMEM, "out of memory");
        }
        free(md->jobs);
        md->jobs = jobs;
        md->n_jobs = cap;
    }
    md->runner = r;
    return 0;
}

/* Open a model's runner and job slots in a free model slot. Returns the slot or an error. */
int wk_add_model(wk *w, const char *name, md_err *e) {
    int m = wk_new_model(w, name, e);
    if (m < 0)
        return m;
    int rc = wk_open_runner(w, m, &w->cfg->runner, e);
    if (rc) {
        memset(&w->mod[m], 0, sizeof w->mod[m]);
        return rc;
    }
    return m;
}
