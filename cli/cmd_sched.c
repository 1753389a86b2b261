/* cmd_sched.c — `medley plan` (offline placement: table, plan JSON, SVG chart),
 * `medley simulate` (a workload through a plan in the fleet simulator) and
 * `medley scheduler` (the daemon: heartbeats and backlogs from Redis, plans published). */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/metrics_http.h"
#include "common/util.h"
#include "scheduler/sched.h"

typedef struct inputs {
    sched_catalog cat;
    sched_fleet fleet;
    sched_workload w;
    sched_profiles prof;
    sched_perf_params pp;
    sched_cands cs;
} inputs;

static void inputs_free(inputs *in) {
    sched_cands_free(&in->cs);
    sched_profiles_free(&in->prof);
    sched_workload_free(&in->w);
    sched_fleet_free(&in->fleet);
    sched_catalog_free(&in->cat);
}

static int inputs_load(inputs *in, const char *catalog, const char *fleet, const char *workload,
                       char **profiles, int nprof, md_err *e) {
    memset(in, 0, sizeof *in);
    sched_perf_defaults(&in->pp);
    if (sched_catalog_load(&in->cat, catalog, e) ||
        sched_fleet_load(&in->fleet, fleet, &in->cat, e) || sched_fleet_aggregate(&in->fleet, e) ||
        sched_workload_load(&in->w, workload, e))
        return e->code;
    for (int i = 0; i < nprof; i++)
        if (sched_profile_load(&in->prof, profiles[i], e))
            return e->code;
    return sched_cands_build(&in->cs, &in->w, &in->fleet, &in->cat, &in->prof, &in->pp, e);
}

/* Load the inputs and solve the plan (or the proportional baseline) for `medley plan` and
 * `medley simulate`. Returns 0 with *in and *p filled (caller frees both), or the exit status
 * after printing the error as "medley CMD: ..." (nothing left to free). */
static int load_and_plan(const char *cmd, inputs *in, sched_plan *p, const char *catalog,
                         const char *fleet, const char *workload, char **profiles, int nprof,
                         const char *only, int prop, const char *billing) {
    md_err e = {0};
    if (inputs_load(in, catalog, fleet, workload, profiles, nprof, &e) ||
        (billing && sched_workload_billing(&in->w, billing, "--billing", &e))) {
        fprintf(stderr, "medley %s: %s\n", cmd, e.msg);
        inputs_free(in);
        return 1;
    }
    sched_opts o;
    sched_opts_defaults(&o);
    if (only && (o.only_type = sched_catalog_find(&in->cat, only)) < 0) {
        fprintf(stderr, "medley %s: --only-type: unknown GPU type '%s'\n", cmd, only);
        inputs_free(in);
        return 2;
    }
    int rc = prop ? sched_plan_proportional(p, &in->w, &in->fleet, &in->cat, &in->cs, &e)
                  : sched_plan_solve(p, &in->w, &in->fleet, &in->cat, &in->cs, &o, &e);
    if (rc) {
        fprintf(stderr, "medley %s: %s\n", cmd, e.msg);
        inputs_free(in);
        return 1;
    }
    return 0;
}

static void plan_usage(FILE *f) {
    fprintf(
        f,
        "usage: medley plan --fleet FLEET.json --workload WORKLOAD.json [--json] [-o PLAN.json]\n"
        "                  [--svg CHART.svg] [--profile PROFILE.json]... [--catalog GPUS.json]\n"
        "                  [--only-type GPU] [--proportional] [--billing busy|until_deadline]\n"
        "Plans which model runs on which GPUs (MILP on GLPK) and prints a table, or the plan\n"
        "JSON (schemas/plan.schema.json) with --json / -o.\n");
}

enum { OPT_SVG = 256, OPT_PROFILE, OPT_CATALOG, OPT_ONLY, OPT_PROP, OPT_FAIL, OPT_PLAN, OPT_BILL };

int cmd_plan(int argc, char **argv) {
    const char *fleet = NULL, *workload = NULL, *svg = NULL, *catalog = NULL, *only = NULL,
               *billing = NULL, *outp = NULL;
    char *profiles[32];
    int nprof = 0, json = 0, prop = 0;
    static const struct option lo[] = {{"fleet", 1, 0, 'f'},
                                       {"workload", 1, 0, 'w'},
                                       {"json", 0, 0, 'j'},
                                       {"output", 1, 0, 'o'},
                                       {"svg", 1, 0, OPT_SVG},
                                       {"profile", 1, 0, OPT_PROFILE},
                                       {"catalog", 1, 0, OPT_CATALOG},
                                       {"only-type", 1, 0, OPT_ONLY},
                                       {"proportional", 0, 0, OPT_PROP},
                                       {"billing", 1, 0, OPT_BILL},
                                       {"help", 0, 0, 'h'},
                                       {0, 0, 0, 0}};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "f:w:jo:h", lo, NULL)) != -1) {
        switch (c) {
        case 'f': fleet = optarg; break;
        case 'w': workload = optarg; break;
        case 'j': json = 1; break;
        case 'o': outp = optarg; break;
        case OPT_SVG: svg = optarg; break;
        case OPT_CATALOG: catalog = optarg; break;
        case OPT_ONLY: only = optarg; break;
        case OPT_PROP: prop = 1; break;
        case OPT_BILL: billing = optarg; break;
        case OPT_PROFILE:
            if (nprof == 32) {
                fprintf(stderr, "medley plan: at most 32 --profile files\n");
                return 2;
            }
            profiles[nprof++] = optarg;
            break;
        case 'h': plan_usage(stdout); return 0;
        default: plan_usage(stderr); return 2;
        }
    }
    if (!fleet || !workload) {
        plan_usage(stderr);
        return 2;
    }
    md_err e = {0};
    inputs in;
    sched_plan p;
    int rc = load_and_plan("plan", &in, &p, catalog, fleet, workload, profiles, nprof, only, prop,
                           billing);
    if (rc)
        return rc;
    if (sched_plan_validate(&p, &in.w, &in.fleet, &in.cat, &in.cs, &in.pp, &e)) {
        fprintf(stderr, "medley plan: internal error, the plan is invalid: %s\n", e.msg);
        rc = 1;
    }
    json_t *doc = sched_plan_to_json(&p, &in.w, &in.fleet, &in.cat, &in.cs);
    if (outp && json_dump_file(doc, outp, JSON_INDENT(2)) != 0) {
        fprintf(stderr, "medley plan: cannot write %s\n", outp);
        rc = 1;
    }
    if (json) {
        json_dumpf(doc, stdout, JSON_INDENT(2));
        fputc('\n', stdout);
    } else {
        sched_plan_print_table(stdout, &p, &in.w, &in.cat, &in.cs);
    }
    json_decref(doc);
    if (svg && sched_plan_svg(svg, &p, &in.w, &in.cs, &e)) {
        fprintf(stderr, "medley plan: %s\n", e.msg);
        rc = 1;
    }
    sched_plan_free(&p);
    inputs_free(&in);
    return rc;
}

static void sim_usage(FILE *f) {
    fprintf(f,
            "usage: medley simulate --fleet FLEET.json --workload WORKLOAD.json [--json]\n"
            "                      [--fail GPU_ID@SECONDS]... [--only-type GPU] [--proportional]\n"
            "                      [--billing busy|until_deadline]\n"
            "                      [--profile PROFILE.json]... [--catalog GPUS.json]\n"
            "Plans (as `medley plan` would, or the baselines) and runs the workload through the\n"
            "plan in the discrete-event simulator: makespan, tokens/s, $ spent, $/M tokens.\n");
}

static int cmp_fail(const void *a, const void *b) {
    double x = ((const sched_sim_failure *)a)->at_s, y = ((const sched_sim_failure *)b)->at_s;
    return (x > y) - (x < y);
}

int cmd_simulate(int argc, char **argv) {
    const char *fleet = NULL, *workload = NULL, *catalog = NULL, *only = NULL, *billing = NULL;
    char *profiles[32];
    sched_sim_failure fails[64];
    int nprof = 0, nfail = 0, json = 0, prop = 0;
    static const struct option lo[] = {{"fleet", 1, 0, 'f'},
                                       {"workload", 1, 0, 'w'},
                                       {"json", 0, 0, 'j'},
                                       {"fail", 1, 0, OPT_FAIL},
                                       {"profile", 1, 0, OPT_PROFILE},
                                       {"catalog", 1, 0, OPT_CATALOG},
                                       {"only-type", 1, 0, OPT_ONLY},
                                       {"proportional", 0, 0, OPT_PROP},
                                       {"billing", 1, 0, OPT_BILL},
                                       {"help", 0, 0, 'h'},
                                       {0, 0, 0, 0}};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "f:w:jh", lo, NULL)) != -1) {
        switch (c) {
        case 'f': fleet = optarg; break;
        case 'w': workload = optarg; break;
        case 'j': json = 1; break;
        case OPT_CATALOG: catalog = optarg; break;
        case OPT_ONLY: only = optarg; break;
        case OPT_PROP: prop = 1; break;
        case OPT_BILL: billing = optarg; break;
        case OPT_PROFILE:
            if (nprof == 32)
                return 2;
            profiles[nprof++] = optarg;
            break;
        case OPT_FAIL: {
            const char *at = strrchr(optarg, '@');
            char *end;
            if (!at || nfail == 64 || at == optarg || (size_t)(at - optarg) >= SCHED_ID) {
                fprintf(stderr, "medley simulate: --fail wants GPU_ID@SECONDS (e.g. L4-1/3@120)\n");
                return 2;
            }
            double t = strtod(at + 1, &end);
            if (*end || t < 0) {
                fprintf(stderr, "medley simulate: --fail %s: bad time\n", optarg);
                return 2;
            }
            snprintf(fails[nfail].gpu, SCHED_ID, "%.*s", (int)(at - optarg), optarg);
            fails[nfail++].at_s = t;
            break;
        }
        case 'h': sim_usage(stdout); return 0;
        default: sim_usage(stderr); return 2;
        }
    }
    if (!fleet || !workload) {
        sim_usage(stderr);
        return 2;
    }
    qsort(fails, (size_t)nfail, sizeof *fails, cmp_fail);
    md_err e = {0};
    inputs in;
    sched_plan p;
    int rc = load_and_plan("simulate", &in, &p, catalog, fleet, workload, profiles, nprof, only,
                           prop, billing);
    if (rc)
        return rc;
    sched_sim_result r;
    if (sched_simulate(&p, &in.w, &in.fleet, &in.cat, &in.cs, &in.pp, fails, nfail, &r, &e)) {
        fprintf(stderr, "medley simulate: %s\n", e.msg);
        sched_plan_free(&p);
        inputs_free(&in);
        return 1;
    }
    if (json) {
        json_t *j = json_pack(
            "{s:f, s:f, s:f, s:f, s:f, s:f, s:I, s:I, s:I, s:I, s:f}", "makespan_s", r.makespan_s,
            "tokens", r.tokens, "usd", r.usd, "tokens_per_s", r.tokens_per_s, "usd_per_mtok",
            r.usd_per_mtok, "tokens_per_usd", r.tokens_per_usd, "requests_done",
            (json_int_t)r.requests_done, "requests_total", (json_int_t)r.requests_total,
            "requests_unserved", (json_int_t)r.requests_unserved, "retried", (json_int_t)r.retried,
            "plan_tokens_per_s", p.tokens_per_s);
        json_dumpf(j, stdout, JSON_INDENT(2));
        fputc('\n', stdout);
        json_decref(j);
    } else {
        printf("replicas %d, idle GPUs %d, plan predicts %.0f tok/s at $%.2f/h\n", p.n, p.nidle,
               p.tokens_per_s, p.usd_per_hour);
        printf("makespan %.1f s, %lld/%lld requests (%lld unserved, %lld retried after failures)\n",
               r.makespan_s, r.requests_done, r.requests_total, r.requests_unserved, r.retried);
        printf("tokens %.0f, %.0f tok/s, $%.2f spent, $%.4f per M tokens, %.0f tokens/$\n",
               r.tokens, r.tokens_per_s, r.usd, r.usd_per_mtok, r.tokens_per_usd);
        size_t i;
        json_t *n;
        json_array_foreach(p.notes, i, n) printf("note: %s\n", json_string_value(n));
    }
    sched_plan_free(&p);
    inputs_free(&in);
    return 0;
}

static volatile int stop_flag;
static void on_signal(int sig) {
    (void)sig;
    stop_flag = 1;
}

static void daemon_usage(FILE *f) {
    fprintf(f,
            "usage: medley scheduler [--redis URL] [--prefix medley:] [--workload W.json]\n"
            "                       [--interval S] [--min-gain F] [--reload-s S] [--once]\n"
            "                       [--metrics ADDR:PORT]\n"
            "Reads worker heartbeats and queue backlogs from Redis, plans, publishes the plan to\n"
            "<prefix>plan with an event on <prefix>events; one active scheduler (lease).\n"
            "--metrics serves Prometheus metrics at http://ADDR:PORT/metrics\n"
            "(docs/operations.md, Metrics).\n");
}

int cmd_scheduler(int argc, char **argv) {
    sched_daemon_opts o = {NULL, "medley:", NULL, 5, 15000, 60, 0.1, 0};
    static const struct option lo[] = {{"redis", 1, 0, 'r'},    {"prefix", 1, 0, 'p'},
                                       {"workload", 1, 0, 'w'}, {"interval", 1, 0, 'i'},
                                       {"min-gain", 1, 0, 'g'}, {"reload-s", 1, 0, 'l'},
                                       {"once", 0, 0, '1'},     {"help", 0, 0, 'h'},
                                       {"metrics", 1, 0, 'm'},  {0, 0, 0, 0}};
    const char *metrics_addr = NULL;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "r:p:w:i:g:l:1hm:", lo, NULL)) != -1) {
        switch (c) {
        case 'r': o.redis_url = optarg; break;
        case 'p': o.prefix = optarg; break;
        case 'w': o.workload = optarg; break;
        case 'i': o.interval_s = atof(optarg); break;
        case 'g': o.min_gain = atof(optarg); break;
        case 'l': o.reload_s = atof(optarg); break;
        case '1': o.once = 1; break;
        case 'm': metrics_addr = optarg; break;
        case 'h': daemon_usage(stdout); return 0;
        default: daemon_usage(stderr); return 2;
        }
    }
    if (o.interval_s <= 0 || o.min_gain < 0 || o.reload_s < 0) {
        fprintf(stderr,
                "medley scheduler: --interval must be > 0, --min-gain and --reload-s >= 0\n");
        return 2;
    }
    md_err e = {0};
    sched_catalog cat;
    if (sched_catalog_load(&cat, NULL, &e)) {
        fprintf(stderr, "medley scheduler: %s\n", e.msg);
        return 1;
    }
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    md_log_set_json(1);
    md_metrics_http *http = NULL;
    md_metrics *reg = NULL;
    if (metrics_addr) {
        if (!(reg = md_metrics_new())) {
            fprintf(stderr, "medley scheduler: out of memory\n");
            sched_catalog_free(&cat);
            return 1;
        }
        if (md_metrics_http_start(metrics_addr, reg, &http, &e)) {
            fprintf(stderr, "medley scheduler: --metrics: %s\n", e.msg);
            md_metrics_free(reg);
            sched_catalog_free(&cat);
            return 1;
        }
        MD_INFO("scheduler", "metrics at http://%s/metrics (port %d)", metrics_addr,
                md_metrics_http_port(http));
    }
    int rc = sched_daemon_run_metered(&o, &cat, &stop_flag, reg, &e);
    if (rc)
        fprintf(stderr, "medley scheduler: %s\n", e.msg);
    md_metrics_http_stop(http);
    md_metrics_free(reg);
    sched_catalog_free(&cat);
    return rc ? 1 : 0;
}
