/* test_sched_fair.c — fair share under over-demand (issue 39 item 10): 20 models on 1,000
 * GPUs of 8 types with backlogs far beyond the fleet, where the most total throughput starves
 * some models. Phase 1's common fraction lambda must be reached although the search stops at
 * its node limit (the LP relaxation first, rounded), and no note may call a figure that a
 * node limit cut "the most this fleet gives". */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "scheduler/sched.h"
#include "unit/sched_world.h"

/* fleet-1000's types in hosts of 8 GPUs, one pool per type (as merged hosts are). */
static json_t *fleet_doc(void) {
    static const struct {
        const char *name, *type;
        int count;
    } T[] = {{"h100", "H100-SXM", 96},   {"a100", "A100-80GB-SXM", 160},
             {"a100s", "A100-40GB", 96}, {"l40s", "L40S", 128},
             {"l4", "L4", 256},          {"a10g", "A10G", 160},
             {"r4090", "RTX-4090", 64},  {"t4", "T4", 40}};
    json_t *pools = json_array();
    for (size_t t = 0; t < sizeof T / sizeof *T; t++)
        json_array_append_new(pools, json_pack("{s:s, s:s, s:i, s:i}", "name", T[t].name, "type",
                                               T[t].type, "count", T[t].count, "gpus_per_host", 8));
    return json_pack("{s:o}", "pools", pools);
}

/* bench/scheduler's 20 models (scale by hosts), mult x (20,000 + 5,000 m) requests each. */
static json_t *workload_doc(int mult) {
    static const char *builtin[] = {"llama-3-8b",  "llama-3-70b", "mistral-7b",
                                    "qwen2-7b",    "qwen2-72b",   "llama-2-7b",
                                    "llama-2-13b", "llama-2-70b", "smollm2-135m"};
    static const char *quant[] = {"INT4", "INT8", "Q4_0", "Q8_0", "FP8"};
    json_t *ms = json_array();
    for (int m = 0; m < 20; m++) {
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

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void check_fair(int mult) {
    sched_world x;
    md_err e = {0};
    json_t *fd = fleet_doc(), *wd = workload_doc(mult);
    int rc = sched_world_load_json(&x, fd, wd, 0, &e);
    json_decref(fd);
    json_decref(wd);
    if (rc)
        print_error("%s\n", e.msg);
    assert_int_equal(rc, 0);
    sched_opts o;
    sched_opts_defaults(&o);
    /* 200 nodes: the search stops at its limit here as the default 1,000 does at 10,000
     * GPUs (bench/scheduler, "fair share"); with it the old phase 1 left half the models
     * or more at 0 (median share 0). */
    o.node_limit = 200;
    rc = sched_plan_solve(&x.p, &x.w, &x.f, &x.cat, &x.cs, &o, &e);
    if (rc)
        print_error("%s\n", e.msg);
    assert_int_equal(rc, 0);
    double f[20], lo = INFINITY;
    assert_int_equal(x.p.nmodels, 20);
    for (int m = 0; m < 20; m++) {
        f[m] = x.p.models[m].served_tps / x.p.models[m].demand_tps;
        lo = fmin(lo, f[m]);
    }
    qsort(f, 20, sizeof *f, cmp_d);
    print_message("%dx: served / demand from %.4f (least) to %.4f (median), %.4f (most)\n", mult,
                  lo, f[10], f[19]);
    /* Most models are short (a common fraction, with what is left going to the cheapest), and
     * the least served gets that fraction too. */
    assert_true(f[10] < 1);
    assert_true(lo >= 0.8 * f[10]);
    int limited = 0, most = 0;
    size_t i;
    json_t *n;
    json_array_foreach(x.p.notes, i, n) {
        limited |= strstr(json_string_value(n), "node limit") != NULL;
        most |= strstr(json_string_value(n), "the most this fleet gives") != NULL;
    }
    assert_false(limited && most);
    assert_int_equal(sched_plan_validate(&x.p, &x.w, &x.f, &x.cat, &x.cs, &x.pp, &e), 0);
    sched_world_free(&x);
}

static void test_fair_share_at_50x(void **state) {
    (void)state;
    check_fair(50);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fair_share_at_50x),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
