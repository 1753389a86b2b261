/* sched_world.h — the scheduler's inputs for a unit test, loaded the way the daemon and
 * `medley plan` load them: the built-in catalog, a fleet and a workload from JSON, and the
 * candidates built from them (with the profiles the test added, if any); and the synthetic
 * fleet-1000 fleets and backlog workloads that the tests and bench/scheduler/bench_sched.c
 * share. Header-only, for the test_sched_*.c programs and bench_sched.
 *
 * Every loader leaves the world safe to free with sched_world_free, whatever it returned. */
#ifndef MEDLEY_TESTS_SCHED_WORLD_H
#define MEDLEY_TESTS_SCHED_WORLD_H

#include <jansson.h>
#include <stdio.h>
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

/* The 1,000 GPUs of bench/scheduler/fleet-1000.json, as hosts of 8 GPUs per type. */
static const struct {
    const char *name, *type;
    int hosts;
} SCHED_WORLD_FLEET1000[] = {{"h100", "H100-SXM", 12},   {"a100", "A100-80GB-SXM", 20},
                             {"a100s", "A100-40GB", 12}, {"l40s", "L40S", 16},
                             {"l4", "L4", 32},           {"a10g", "A10G", 20},
                             {"r4090", "RTX-4090", 8},   {"t4", "T4", 5}};
#define SCHED_WORLD_NTYPES ((int)(sizeof SCHED_WORLD_FLEET1000 / sizeof *SCHED_WORLD_FLEET1000))

/* fleet-1000's types with scale times its GPUs (1: 1,000 GPUs, 10: 10,000). per_host 0: one
 * pool per type ("<name>", hosts of 8 GPUs); else workers of per_host GPUs ("<name>-w<i>",
 * i from 000, gpus_per_host = per_host) as the daemon builds them, the last one full where
 * per_host does not divide the type's GPUs. A new reference. */
static inline json_t *sched_world_fleet1000(int scale, int per_host) {
    json_t *pools = json_array();
    for (int t = 0; t < SCHED_WORLD_NTYPES; t++) {
        int gpus = 8 * SCHED_WORLD_FLEET1000[t].hosts * scale;
        if (!per_host) {
            json_array_append_new(pools, json_pack("{s:s, s:s, s:i}", "name",
                                                   SCHED_WORLD_FLEET1000[t].name, "type",
                                                   SCHED_WORLD_FLEET1000[t].type, "count", gpus));
            continue;
        }
        for (int i = 0; i * per_host < gpus; i++) {
            char name[SCHED_NAME];
            snprintf(name, sizeof name, "%s-w%03d", SCHED_WORLD_FLEET1000[t].name, i);
            json_array_append_new(pools, json_pack("{s:s, s:s, s:i, s:i}", "name", name, "type",
                                                   SCHED_WORLD_FLEET1000[t].type, "count", per_host,
                                                   "gpus_per_host", per_host));
        }
    }
    return json_pack("{s:o}", "pools", pools);
}

/* n single-GPU workers of one type ("w0", "w1", ...: the daemon's view of n workers). A new
 * reference. */
static inline json_t *sched_world_workers(int n, const char *type) {
    json_t *pools = json_array();
    for (int i = 0; i < n; i++) {
        char name[32];
        snprintf(name, sizeof name, "w%d", i);
        json_array_append_new(pools,
                              json_pack("{s:s, s:s, s:i}", "name", name, "type", type, "count", 1));
    }
    return json_pack("{s:o}", "pools", pools);
}

/* A backlog of nmodels (at most 20) models: the nine built-ins, then llama-3-8b shapes at
 * other precisions ("llama-3-8b-<quant>-<m>"); model m wants mult x (20,000 + 5,000 m)
 * requests within 1-3 h, in a short and a long request class. A new reference. */
static inline json_t *sched_world_backlog(int nmodels, int mult) {
    static const char *builtin[] = {"llama-3-8b",  "llama-3-70b", "mistral-7b",
                                    "qwen2-7b",    "qwen2-72b",   "llama-2-7b",
                                    "llama-2-13b", "llama-2-70b", "smollm2-135m"};
    static const char *quant[] = {"INT4", "INT8", "Q4_0", "Q8_0", "FP8"};
    json_t *ms = json_array();
    for (int m = 0; m < nmodels && m < 20; m++) {
        json_t *card;
        if (m < 9) {
            card = json_string(builtin[m]);
        } else {
            char name[SCHED_NAME];
            snprintf(name, sizeof name, "llama-3-8b-%s-%d", quant[m % 5], m);
            card = json_pack("{s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:s}", "name", name, "layers", 32,
                             "hidden", 4096, "heads", 32, "kv_heads", 8, "ffn", 14336, "vocab",
                             128256, "quant", quant[m % 5]);
        }
        json_array_append_new(
            ms,
            json_pack("{s:o, s:i, s:i, s:[{s:s, s:i, s:i, s:i, s:f}, {s:s, s:i, s:i, s:i, "
                      "s:f}]}",
                      "model", card, "requests", mult * (20000 + 5000 * m), "deadline_s",
                      3600 * (1 + m % 3), "classes", "name", "s", "input_mean", 250, "output_mean",
                      150, "max_tokens", 1024, "share", 0.6, "name", "l", "input_mean", 2500,
                      "output_mean", 350, "max_tokens", 4096, "share", 0.4));
    }
    return json_pack("{s:o}", "models", ms);
}

#endif
