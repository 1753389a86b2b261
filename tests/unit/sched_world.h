/* sched_world.h — the scheduler's inputs for a unit test, loaded the way the daemon and
 * `medley plan` load them: the built-in catalog, a fleet and a workload from JSON, and the
 * candidates built from them (with the profiles the test added, if any). Header-only, for
 * the test_sched_*.c programs.
 *
 * Every loader leaves the world safe to free with sched_world_free, whatever it returned. */
#ifndef MEDLEY_TESTS_SCHED_WORLD_H
#define MEDLEY_TESTS_SCHED_WORLD_H

#include <jansson.h>
#include <string.h>

#include "scheduler/sched.h"

typedef struct sched_world {
    sched_catalog cat;
    sched_fleet f;
    sched_workload w;
    sched_profiles prof; /* empty unless the test adds some before building candidates */
    sched_cands cs;
    sched_perf_params pp; /* the defaults */
    sched_plan p;         /* for the test's plan */
} sched_world;

static inline void sched_world_free(sched_world *x) {
    sched_plan_free(&x->p);
    sched_cands_free(&x->cs);
    sched_profiles_free(&x->prof);
    sched_workload_free(&x->w);
    sched_fleet_free(&x->f);
    sched_catalog_free(&x->cat);
}

/* The catalog, then the fleet and the workload from documents (borrowed); aggregate: merge
 * the fleet's pools as the daemon does. Candidates are not built yet. The first error. */
static inline int sched_world_inputs(sched_world *x, json_t *fleet, json_t *workload, int aggregate,
                                     md_err *e) {
    memset(x, 0, sizeof *x);
    sched_perf_defaults(&x->pp);
    int rc = sched_catalog_load(&x->cat, NULL, e);
    if (!rc)
        rc = sched_fleet_from_json(&x->f, fleet, &x->cat, e);
    if (!rc && aggregate)
        rc = sched_fleet_aggregate(&x->f, e);
    if (!rc)
        rc = sched_workload_from_json(&x->w, workload, e);
    return rc;
}

/* sched_world_inputs, then the candidates. */
static inline int sched_world_load_json(sched_world *x, json_t *fleet, json_t *workload,
                                        int aggregate, md_err *e) {
    int rc = sched_world_inputs(x, fleet, workload, aggregate, e);
    if (!rc)
        rc = sched_cands_build(&x->cs, &x->w, &x->f, &x->cat, &x->prof, &x->pp, e);
    return rc;
}

/* The same from JSON texts; a text that does not parse is MD_EINVAL. */
static inline int sched_world_load(sched_world *x, const char *fleet, const char *workload,
                                   md_err *e) {
    json_error_t je;
    json_t *fd = json_loads(fleet, 0, &je), *wd = fd ? json_loads(workload, 0, &je) : NULL;
    int rc;
    if (fd && wd) {
        rc = sched_world_load_json(x, fd, wd, 0, e);
    } else {
        memset(x, 0, sizeof *x);
        rc = md_errf(e, MD_EINVAL, "test world: the %s does not parse: %s",
                     fd ? "workload" : "fleet", je.text);
    }
    json_decref(fd);
    json_decref(wd);
    return rc;
}

#endif
