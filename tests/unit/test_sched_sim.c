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

/* Issue 39 item 11: routing is a preference. Two A100 replicas, one routed the short class
 * only and one the long class only, on a backlog that is 80% long: when the short queue is
 * empty the first replica takes long requests (stealing) instead of idling, so the forced
 * routing finishes about when the MILP's mixed routing does (before: ~1.6x later), and no
 * later than the same replicas as plain work stealing. */
static void idle_replica_steals_other_classes(void **st) {
    static const char *two =
        "{\"seed\":3,\"models\":[{\"model\":\"llama-3-8b\",\"requests\":4000,"
        "\"deadline_s\":100,\"classes\":[{\"name\":\"s\",\"input_mean\":200,"
        "\"output_mean\":100,\"max_tokens\":1024,\"share\":0.2},{\"name\":\"l\","
        "\"input_mean\":1500,\"output_mean\":300,\"max_tokens\":4096,\"share\":0.8}]}]}";
    sched_world x;
    load(&x, fleet2, two, 0);
    assert_int_equal(x.p.n, 2);
    sched_sim_result mixed, forced, pull;
    md_err e = {0};
    assert_int_equal(sched_simulate(&x.p, &x.w, &x.f, &x.cat, &x.cs, &x.pp, NULL, 0, &mixed, &e),
                     0);
    for (int i = 0; i < 2; i++) {
        x.p.r[i].share[0] = i == 0;
        x.p.r[i].share[1] = i == 1;
    }
    assert_int_equal(sched_simulate(&x.p, &x.w, &x.f, &x.cat, &x.cs, &x.pp, NULL, 0, &forced, &e),
                     0);
    x.p.route_pull = 1;
    assert_int_equal(sched_simulate(&x.p, &x.w, &x.f, &x.cat, &x.cs, &x.pp, NULL, 0, &pull, &e), 0);
    print_message("makespan: MILP routing %.1f s, one class each %.1f s, plain pull %.1f s\n",
                  mixed.makespan_s, forced.makespan_s, pull.makespan_s);
    assert_int_equal(forced.requests_done, 4000);
    assert_true(forced.makespan_s < mixed.makespan_s * 1.1);
    assert_true(forced.makespan_s <= pull.makespan_s * 1.02);
    sched_world_free(&x);
}

/* Issue 39 item 11: routed work never loses to plain work stealing on the same replicas.
 * Two A100s routed 99% 3,000-token prompts and 1% 200-token ones (as bench (a)'s plan routes
 * its A100s): the KV fills with long requests at a batch of ~130, and before, a short one
 * went in only at its 1% share, so the KV left by the last long one stayed idle while short
 * ones waited: 0.994x-0.999x of plain stealing over 50-70% short mixes. Now a replica whose
 * next routed request does not fit its free KV takes what fits from its other classes:
 * 1.001x-1.020x. */
static void routed_kv_gap_takes_what_fits(void **st) {
    static const char *fmt =
        "{\"seed\":%d,\"models\":[{\"model\":\"llama-3-8b\",\"requests\":6000,"
        "\"deadline_s\":600,\"classes\":[{\"name\":\"s\",\"input_mean\":200,"
        "\"output_mean\":120,\"max_tokens\":1024,\"share\":%.2f},{\"name\":\"l\","
        "\"input_mean\":3000,\"output_mean\":400,\"max_tokens\":8192,\"share\":%.2f}]}]}";
    double worst = INFINITY;
    for (int i = 0; i < 3; i++) {
        double s = 0.5 + 0.1 * i;
        char wl[512];
        snprintf(wl, sizeof wl, fmt, 7 + i, s, 1 - s);
        sched_world x;
        load(&x, fleet2, wl, 0);
        assert_int_equal(x.p.n, 2);
        for (int r = 0; r < 2; r++)
            x.p.r[r].share[0] = 0.01, x.p.r[r].share[1] = 0.99;
        sched_sim_result routed, pull;
        md_err e = {0};
        assert_int_equal(
            sched_simulate(&x.p, &x.w, &x.f, &x.cat, &x.cs, &x.pp, NULL, 0, &routed, &e), 0);
        x.p.route_pull = 1;
        assert_int_equal(sched_simulate(&x.p, &x.w, &x.f, &x.cat, &x.cs, &x.pp, NULL, 0, &pull, &e),
                         0);
        print_message("short %.0f%%: routed+steal %.1f s, plain stealing %.1f s: %.3fx\n", s * 100,
                      routed.makespan_s, pull.makespan_s, pull.makespan_s / routed.makespan_s);
        assert_int_equal(routed.requests_done, 6000);
        worst = fmin(worst, pull.makespan_s / routed.makespan_s);
        sched_world_free(&x);
    }
    assert_true(worst >= 1.0);
}

/* Issue 39 item 13: a batch rental paid while busy (the default) or until the deadline
 * ("billing": "until_deadline"): the second pays every rented replica for the whole period,
 * in the plan (busy = 1) and in the simulator, and so picks the cheapest replicas per hour
 * rather than per busy hour. */
static void rental_billed_until_the_deadline(void **st) {
    static const char *rent = "{\"rent\":{\"types\":[\"H100-SXM\",\"A100-80GB-SXM\",\"L4\"],"
                              "\"max_per_type\":16}}";
    static const char *batch = "{\"seed\":2,\"billing\":\"until_deadline\",\"models\":[{\"model\":"
                               "\"llama-3-8b\",\"requests\":20000,\"deadline_s\":1800,"
                               "\"input_mean\":300,\"output_mean\":200}]}";
    sched_world x;
    load(&x, rent, batch, 0);
    assert_int_equal(x.w.bill_to_finish, 1);
    sched_sim_result r;
    md_err e = {0};
    assert_true(fabs(x.p.busy_usd_per_hour - x.p.usd_per_hour) < 1e-9);
    /* the plan says which billing it used */
    int said = 0;
    size_t i;
    json_t *n;
    json_array_foreach(x.p.notes, i, n) said |=
        !strncmp(json_string_value(n), "billing until_deadline", 22);
    assert_true(said);
    assert_int_equal(sched_simulate(&x.p, &x.w, &x.f, &x.cat, &x.cs, &x.pp, NULL, 0, &r, &e), 0);
    print_message("until the deadline: $%.2f/h, simulated $%.2f over %.0f s\n", x.p.usd_per_hour,
                  r.usd, r.makespan_s);
    assert_true(r.makespan_s < 1800);
    assert_true(fabs(r.usd - x.p.usd_per_hour * 0.5) < 1e-6 * r.usd);
    double until = x.p.usd_per_hour;
    sched_world_free(&x);
    char busy[512];
    snprintf(busy, sizeof busy, "{%s", strstr(batch, "\"models\"")); /* no billing: busy */
    load(&x, rent, busy, 0);
    print_message("busy: $%.2f/h all on, $%.2f/h while working\n", x.p.usd_per_hour,
                  x.p.busy_usd_per_hour);
    assert_int_equal(x.w.bill_to_finish, 0);
    assert_true(x.p.busy_usd_per_hour < x.p.usd_per_hour);
    assert_true(until <= x.p.usd_per_hour + 1e-9);
    sched_world_free(&x);
}

/* Issue 39 item 12: a TPOT SLO bounds a replica's batch in the simulator as in the
 * performance model. Llama-2-7B on one A10G, Arena-sized requests: at 40 ms per token the
 * batch is cut from 72 to 30, and the simulated rate is the model's SLO-bound rate. */
static void tpot_slo_caps_the_simulated_batch(void **st) {
    static const char *a10g = "{\"pools\":[{\"name\":\"g\",\"type\":\"A10G\",\"count\":1}]}";
    static const char *fmt = "{\"seed\":4,\"models\":[{\"model\":\"llama-2-7b\",\"requests\":3000,"
                             "\"input_mean\":70,\"output_mean\":215,\"max_tokens\":1024%s}]}";
    char wl[512];
    double plan[2];
    sched_sim_result r[2];
    md_err e = {0};
    for (int slo = 0; slo < 2; slo++) {
        snprintf(wl, sizeof wl, fmt, slo ? ",\"tpot_ms\":40" : "");
        sched_world x;
        load(&x, a10g, wl, 0);
        assert_int_equal(x.p.n, 1);
        const sched_cand *c = &x.cs.c[x.p.r[0].cand];
        assert_int_equal(
            sched_simulate(&x.p, &x.w, &x.f, &x.cat, &x.cs, &x.pp, NULL, 0, &r[slo], &e), 0);
        print_message("%s: batch %d, plan %.0f tok/s at full speed, simulated %.0f tok/s\n",
                      slo ? "TPOT 40 ms" : "no SLO", c->perf[0].batch, full_speed(&x),
                      r[slo].tokens_per_s);
        plan[slo] = full_speed(&x);
        sched_world_free(&x);
    }
    /* with the SLO the simulated rate is the model's (within 10%), below the one without
     * (the run without an SLO is 29% under the model's figure here: short prompts in
     * continuous batching, a gap of the steady-state model left as it is) */
    assert_true(plan[1] < 0.9 * plan[0]);
    assert_true(fabs(r[1].tokens_per_s / plan[1] - 1) < 0.10);
    assert_true(r[1].tokens_per_s < r[0].tokens_per_s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(simulated_throughput_matches_the_plan),
        cmocka_unit_test(failed_gpu_hands_its_requests_back),
        cmocka_unit_test(arrivals_are_served_over_the_horizon),
        cmocka_unit_test(proportional_baseline_uses_every_gpu),
        cmocka_unit_test(idle_replica_steals_other_classes),
        cmocka_unit_test(routed_kv_gap_takes_what_fits),
        cmocka_unit_test(rental_billed_until_the_deadline),
        cmocka_unit_test(tpot_slo_caps_the_simulated_batch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
