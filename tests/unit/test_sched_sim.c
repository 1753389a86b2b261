/* test_sched_sim.c — scheduler: the discrete-event simulator against the plan's
 * prediction, worker failures, arrivals, and the proportional baseline. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "scheduler/sched.h"
#include "unit/sched_world.h"

static void load(sched_world *x, const char *fleet, const char *workload, int proportional) {
    md_err e = {0};
    int rc = sched_world_load(x, fleet, workload, &e);
    if (rc)
        print_error("%s\n", e.msg);
    assert_int_equal(rc, 0);
    sched_opts o;
    sched_opts_defaults(&o);
    if (proportional)
        assert_int_equal(sched_plan_proportional(&x->p, &x->w, &x->f, &x->cat, &x->cs, &e), 0);
    else
        assert_int_equal(sched_plan_solve(&x->p, &x->w, &x->f, &x->cat, &x->cs, &o, &e), 0);
    assert_int_equal(sched_plan_validate(&x->p, &x->w, &x->f, &x->cat, &x->cs, &x->pp, &e), 0);
}

static const char *fleet2 = "{\"pools\":[{\"name\":\"a\",\"type\":\"A100-80GB-SXM\",\"count\":2}]}";
/* 6000 x 300 tokens in 100 s needs more than one A100. */
static const char *backlog = "{\"seed\":5,\"models\":[{\"model\":\"llama-3-8b\",\"requests\":6000,"
                             "\"deadline_s\":100,\"input_mean\":200,\"output_mean\":100}]}";

/* Tokens/s of the plan's replicas working full time (the simulator runs them flat out). */
static double full_speed(const sched_world *x) {
    double t = 0;
    for (int i = 0; i < x->p.n; i++) {
        const sched_cand *c = &x->cs.c[x->p.r[i].cand];
        for (int k = 0; k < x->w.models[c->model].nclasses; k++)
            t += x->p.r[i].share[k] * c->perf[k].tokens_per_s;
    }
    return t;
}

static void simulated_throughput_matches_the_plan(void **st) {
    sched_world x;
    load(&x, fleet2, backlog, 0);
    assert_int_equal(x.p.n, 2);
    sched_sim_result r;
    md_err e = {0};
    assert_int_equal(sched_simulate(&x.p, &x.w, &x.f, &x.cat, &x.cs, &x.pp, NULL, 0, &r, &e), 0);
    assert_int_equal(r.requests_done, 6000);
    assert_int_equal(r.requests_unserved, 0);
    /* Lengths are drawn uniformly around the means: tokens within 3% of 6000 x 300. */
    assert_true(fabs(r.tokens / 1.8e6 - 1) < 0.03);
    double full = full_speed(&x);
    print_message("plan %.0f tok/s at full speed, simulated %.0f tok/s, makespan %.1f s, $%.3f\n",
                  full, r.tokens_per_s, r.makespan_s, r.usd);
    /* The steady-state model and the iteration-level run agree within 15% (the run has a
     * ramp-up and a tail where the batch drains). */
    assert_true(fabs(r.tokens_per_s / full - 1) < 0.15);
    assert_true(fabs(r.usd / (x.p.usd_per_hour * r.makespan_s / 3600) - 1) < 0.05);
    assert_true(x.p.models[0].deadline_met);
    sched_world_free(&x);
}

static void failed_gpu_hands_its_requests_back(void **st) {
    sched_world x;
    load(&x, fleet2, backlog, 0);
    sched_sim_result base, r;
    md_err e = {0};
    assert_int_equal(sched_simulate(&x.p, &x.w, &x.f, &x.cat, &x.cs, &x.pp, NULL, 0, &base, &e), 0);
    sched_sim_failure f = {"a/1", base.makespan_s / 3};
    assert_int_equal(sched_simulate(&x.p, &x.w, &x.f, &x.cat, &x.cs, &x.pp, &f, 1, &r, &e), 0);
    assert_int_equal(r.requests_done, 6000);
    assert_true(r.retried > 0);
    /* One replica does the remaining two thirds alone: about 5/3 of the time. */
    assert_true(r.makespan_s > base.makespan_s * 1.4 && r.makespan_s < base.makespan_s * 1.9);
    /* A failure of an unknown GPU changes nothing. */
    sched_sim_failure g = {"zz/9", 1};
    assert_int_equal(sched_simulate(&x.p, &x.w, &x.f, &x.cat, &x.cs, &x.pp, &g, 1, &r, &e), 0);
    assert_true(fabs(r.makespan_s - base.makespan_s) < 1e-9);
    sched_world_free(&x);
}

static void arrivals_are_served_over_the_horizon(void **st) {
    sched_world x;
    load(&x, "{\"pools\":[{\"type\":\"L4\",\"count\":2}]}",
         "{\"horizon_s\":600,\"seed\":2,\"models\":[{\"model\":\"mistral-7b\",\"rate_rps\":2,"
         "\"input_mean\":300,\"output_mean\":150}]}",
         0);
    assert_true(x.p.models[0].deadline_met);
    sched_sim_result r;
    md_err e = {0};
    assert_int_equal(sched_simulate(&x.p, &x.w, &x.f, &x.cat, &x.cs, &x.pp, NULL, 0, &r, &e), 0);
    /* Poisson(1200): within 5 sigma. */
    assert_true(llabs(r.requests_total - 1200) < 175);
    assert_int_equal(r.requests_done, r.requests_total);
    assert_true(r.makespan_s > 550 && r.makespan_s < 700);
    sched_world_free(&x);
}

static void proportional_baseline_uses_every_gpu(void **st) {
    sched_world x;
    load(&x,
         "{\"pools\":[{\"name\":\"a\",\"type\":\"A100-80GB-SXM\",\"count\":4},"
         "{\"name\":\"l\",\"type\":\"L4\",\"count\":8}]}",
         "{\"models\":[{\"model\":\"llama-3-8b\",\"requests\":3000,\"input_mean\":200,"
         "\"output_mean\":100},{\"model\":\"mistral-7b\",\"requests\":1000,\"input_mean\":200,"
         "\"output_mean\":100}]}",
         1);
    assert_int_equal(x.p.nidle, 0);
    int per_model[2] = {0, 0};
    for (int i = 0; i < x.p.n; i++)
        per_model[x.cs.c[x.p.r[i].cand].model] += x.cs.c[x.p.r[i].cand].gpus;
    assert_int_equal(per_model[0] + per_model[1], 12);
    assert_true(per_model[0] > per_model[1]);
    sched_sim_result r;
    md_err e = {0};
    assert_int_equal(sched_simulate(&x.p, &x.w, &x.f, &x.cat, &x.cs, &x.pp, NULL, 0, &r, &e), 0);
    assert_int_equal(r.requests_done, 4000);
    sched_world_free(&x);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(simulated_throughput_matches_the_plan),
        cmocka_unit_test(failed_gpu_hands_its_requests_back),
        cmocka_unit_test(arrivals_are_served_over_the_horizon),
        cmocka_unit_test(proportional_baseline_uses_every_gpu),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
