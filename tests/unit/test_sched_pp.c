/* test_sched_pp.c — pipelines deep and wide enough for the fleets people have (issue 26
 * item 3): same-type pipelines across hosts plan Llama-3-70B on 2-GPU H100 hosts and meet a
 * deadline in the simulator; one L4 more does not idle the H100s; the pipeline hop costs
 * bandwidth and latency as computed by hand; the DP layer split with 3 and 4 stages equals
 * brute force; pipelines pack into hosts as the MILP's rows allow. */
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

/* Load the catalog, the fleet and workload texts and build the candidates. */
static void world_load(sched_world *x, const char *fleet, const char *workload) {
    md_err e = {0};
    int rc = sched_world_load(x, fleet, workload, &e);
    if (rc)
        print_error("%s\n", e.msg);
    assert_int_equal(rc, 0);
}

/* Solve, validate, and return how many notes say a replica could not be packed. */
static int plan_and_validate(sched_world *x) {
    md_err e = {0};
    sched_opts o;
    sched_opts_defaults(&o);
    int rc = sched_plan_solve(&x->p, &x->w, &x->f, &x->cat, &x->cs, &o, &e);
    if (rc)
        print_error("%s\n", e.msg);
    assert_int_equal(rc, 0);
    rc = sched_plan_validate(&x->p, &x->w, &x->f, &x->cat, &x->cs, &x->pp, &e);
    if (rc)
        print_error("%s\n", e.msg);
    assert_int_equal(rc, 0);
    int dropped = 0;
    size_t i;
    json_t *n;
    json_array_foreach(x->p.notes, i, n) dropped += strstr(json_string_value(n), "packed") != NULL;
    return dropped;
}

/* 28,000 requests of 512 + 256 tokens in 10 minutes: 35,840 tokens/s, which needs every
 * H100 of the 16 (a 4-GPU pipeline gives ~9,000 tokens/s in the roofline model). */
static const char *W70 = "{\"models\":[{\"model\":\"llama-3-70b\",\"requests\":28000,"
                         "\"deadline_s\":600,\"classes\":[{\"name\":\"chat\",\"input_mean\":512,"
                         "\"output_mean\":256,\"max_tokens\":2048,\"share\":1}]}]}";
static const char *H100X16 =
    "{\"pools\":[{\"name\":\"h100\",\"type\":\"H100-SXM\",\"count\":16,\"gpus_per_host\":2}]}";
static const char *H100X16_L4 =
    "{\"pools\":[{\"name\":\"h100\",\"type\":\"H100-SXM\",\"count\":16,\"gpus_per_host\":2},"
    "{\"name\":\"l4\",\"type\":\"L4\",\"count\":1,\"gpus_per_host\":1}]}";

/* The simulated makespan of x's plan. */
static double simulate(sched_world *x) {
    md_err e = {0};
    sched_sim_result r;
    assert_int_equal(sched_simulate(&x->p, &x->w, &x->f, &x->cat, &x->cs, &x->pp, NULL, 0, &r, &e),
                     0);
    assert_int_equal(r.requests_done, r.requests_total);
    print_message("simulated makespan %.1f s, %.0f tokens/s\n", r.makespan_s, r.tokens_per_s);
    return r.makespan_s;
}

static void seventy_b_on_two_gpu_hosts_is_a_pipeline_across_hosts(void **st) {
    (void)st;
    sched_world x;
    world_load(&x, H100X16, W70);
    assert_int_equal(plan_and_validate(&x), 0);
    assert_true(x.p.models[0].deadline_met);
    assert_int_equal(x.p.nidle, 0);
    for (int i = 0; i < x.p.n; i++) {
        const sched_cand *c = &x.cs.c[x.p.r[i].cand];
        assert_true(c->nstages >= 2 && c->nstages <= SCHED_MAX_STAGES);
        /* Same type, same pool; a TP2 stage fills a host, so the stages are on different
         * hosts (GPU ids "h100/<k>", host k / 2). */
        int at = 0, prev_host = -1;
        for (int s = 0; s < c->nstages; s++) {
            assert_int_equal(c->stages[s].type, c->stages[0].type);
            assert_int_equal(c->stages[s].pool, 0);
            int host = atoi(strchr(x.p.r[i].gpu_ids[at], '/') + 1) / 2;
            if (c->stages[s].tp == 2)
                assert_true(host != prev_host);
            prev_host = host;
            at += c->stages[s].tp;
        }
    }
    assert_true(simulate(&x) <= x.w.models[0].deadline_s);
    sched_world_free(&x);
}

static void one_l4_more_does_not_idle_the_h100s(void **st) {
    (void)st;
    sched_world x;
    world_load(&x, H100X16_L4, W70);
    assert_int_equal(plan_and_validate(&x), 0);
    assert_true(x.p.models[0].deadline_met);
    for (int i = 0; i < x.p.nidle; i++)
        assert_non_null(strstr(x.p.idle[i], "l4/")); /* no H100 idle */
    /* A pair of one H100 group and the L4 no longer is the only way to hold the model;
     * the deeper mixed pipeline (two single H100s + the L4) is a candidate too. */
    int deep_mixed = 0;
    for (int c = 0; c < x.cs.n; c++)
        deep_mixed |=
            x.cs.c[c].nstages == 3 && x.cs.c[c].stages[0].type != x.cs.c[c].stages[2].type;
    assert_true(deep_mixed);
    assert_true(simulate(&x) <= x.w.models[0].deadline_s);
    sched_world_free(&x);
}

/* A fleet with 3.5 hosts: one 2x(2xH100) pipeline (two host groups) and one 3x(1xH100)
 * (three GPUs, two of them in one host) fill it; the GPU ids follow the packing rows. */
static void pipelines_pack_into_hosts_as_the_rows_allow(void **st) {
    (void)st;
    sched_world x;
    world_load(&x,
               "{\"pools\":[{\"name\":\"h\",\"type\":\"H100-SXM\",\"count\":7,"
               "\"gpus_per_host\":2}]}",
               W70);
    assert_int_equal(plan_and_validate(&x), 0);
    int gpus = 0;
    for (int i = 0; i < x.p.n; i++)
        gpus += x.cs.c[x.p.r[i].cand].gpus;
    assert_int_equal(gpus + x.p.nidle, 7);
    assert_true(x.p.nidle <= 1);
    sched_world_free(&x);
}

/* The pipeline hop by hand: each stage's decode step of its micro-batch (b / S sequences)
 * plus latency plus the activations (mb x hidden x 2 bytes) over the link at 70% of its
 * rate; the last stage sends the sampled tokens (mb x 4 bytes) back to the first; prefill
 * sends the prompt's activations (in x hidden x 2 bytes) on. The slowest stage's time per
 * request sets the rate: requests/s of a two-stage replica of batch b. */
static double hand_rps(const sched_world *x, const sched_cand *c, int b, double in, double out,
                       double gbps, double lat) {
    const sched_model *m = &x->w.models[0].model;
    double W = gbps * 1e9 * 0.7, mb = b / 2.0, ctx = in + out / 2, worst = 0;
    for (int s = 0; s < 2; s++) {
        const sched_stage *t = &c->stages[s];
        const sched_gpu_type *g = &x->cat.gpus[t->type];
        int layers = t->layer_hi - t->layer_lo, first = s == 0, last = s == 1;
        double pre = sched_perf_prefill(m, g, t->tp, layers, first, last, in, &x->pp);
        double step =
            sched_perf_decode_step(m, g, t->tp, layers, first, last, (int)mb, ctx, &x->pp);
        if (s == 0) {
            pre += lat + in * m->hidden * 2 / W;
            step += lat + mb * m->hidden * 2 / W;
        } else {
            step += lat + mb * 4 / W;
        }
        worst = fmax(worst, pre + out * step / mb);
    }
    return 1 / worst;
}

static void pipeline_hop_costs_bandwidth_and_latency_by_hand(void **st) {
    (void)st;
    sched_world x;
    world_load(&x,
               "{\"inter_host_gbps\":5,\"inter_host_latency_us\":40,\"pools\":[{\"name\":\"h\","
               "\"type\":\"H100-SXM\",\"count\":4,\"gpus_per_host\":2}]}",
               W70);
    assert_true(fabs(x.f.link_latency_s - 40e-6) < 1e-15);
    const sched_model *m = &x.w.models[0].model;
    const sched_cand *c = NULL;
    for (int i = 0; i < x.cs.n; i++)
        if (x.cs.c[i].nstages == 2 && x.cs.c[i].stages[0].tp == 2)
            c = &x.cs.c[i];
    assert_non_null(c);
    /* The candidate, planned with the fleet's 5 GB/s and 40 us. */
    const sched_perf *r = &c->perf[0];
    double want = hand_rps(&x, c, r->batch, 512, 256, 5, 40e-6);
    print_message("2x(2xH100) 70B at 5 GB/s, 40 us: batch %d, %.6f requests/s (hand %.6f)\n",
                  r->batch, r->requests_per_s, want);
    assert_true(fabs(r->requests_per_s - want) <= 1e-12 * want);
    /* The perf model's entry with 1 ms per hop (the latency in its parameters) and 0.1 GB/s:
     * both terms count, as by hand. */
    sched_perf_params pp = x.pp;
    md_err e = {0};
    sched_perf q;
    double lat[] = {1e-3, 0, 1e-3}, gbps[] = {5, 0.1, 0.1};
    for (int i = 0; i < 3; i++) {
        pp.inter_host_latency_s = lat[i];
        assert_int_equal(
            sched_perf_replica(m, &x.cat, c->stages, 2, gbps[i], 512, 256, &pp, NULL, &q, &e), 0);
        want = hand_rps(&x, c, q.batch, 512, 256, gbps[i], lat[i]);
        print_message("%.1f GB/s, %.0f us: %.6f requests/s (hand %.6f)\n", gbps[i], lat[i] * 1e6,
                      q.requests_per_s, want);
        assert_true(fabs(q.requests_per_s - want) <= 1e-12 * want);
        assert_true(q.requests_per_s < r->requests_per_s);
        assert_true(fabs(sched_perf_pp_hop(1e6, gbps[i], &pp) -
                         (lat[i] + 1e6 / (gbps[i] * 0.7e9))) < 1e-15);
    }
    sched_world_free(&x);
    /* A latency outside [0, 1e6] us is refused, naming the key. */
    sched_catalog cat;
    sched_fleet f;
    assert_int_equal(sched_catalog_load(&cat, NULL, &e), 0);
    json_t *bad = json_loads("{\"inter_host_latency_us\":-1,\"pools\":[{\"type\":\"L4\","
                             "\"count\":1}]}",
                             0, NULL);
    assert_int_equal(sched_fleet_from_json(&f, bad, &cat, &e), MD_EINVAL);
    assert_non_null(strstr(e.msg, "inter_host_latency_us"));
    json_decref(bad);
    sched_catalog_free(&cat);
}

/* Brute force over every split of L layers into n non-empty stages: the least slowest-stage
 * cost (the DP's cost: a 16-sequence decode step at 1024 context) under each stage's memory
 * with KV room for min_kv tokens. */
static double brute(const sched_model *m, const sched_catalog *cat, sched_stage *st, int n, int s,
                    int lo, double so_far, double min_kv, const sched_perf_params *pp) {
    if (s == n - 1) {
        sched_stage t = st[s];
        t.layer_lo = lo, t.layer_hi = m->layers;
        if (lo >= m->layers || sched_stage_fits(m, &cat->gpus[t.type], &t, min_kv, pp, NULL))
            return INFINITY;
        return fmax(so_far, sched_perf_decode_step(m, &cat->gpus[t.type], t.tp, m->layers - lo,
                                                   lo == 0, 1, 16, 1024, pp));
    }
    double best = INFINITY;
    for (int hi = lo + 1; hi <= m->layers - (n - 1 - s); hi++) {
        sched_stage t = st[s];
        t.layer_lo = lo, t.layer_hi = hi;
        if (sched_stage_fits(m, &cat->gpus[t.type], &t, min_kv, pp, NULL))
            continue;
        double c = fmax(so_far, sched_perf_decode_step(m, &cat->gpus[t.type], t.tp, hi - lo,
                                                       lo == 0, 0, 16, 1024, pp));
        if (c < best)
            best = fmin(best, brute(m, cat, st, n, s + 1, hi, c, min_kv, pp));
    }
    return best;
}

static void layer_split_dp_matches_brute_force_three_and_four_stages(void **st) {
    (void)st;
    sched_catalog cat;
    md_err e = {0};
    assert_int_equal(sched_catalog_load(&cat, NULL, &e), 0);
    sched_perf_params pp;
    sched_perf_defaults(&pp);
    struct {
        const char *model;
        int n;
        const char *type[4];
        int tp[4];
    } cases[] = {
        {"llama-3-70b", 3, {"H100-SXM", "H100-SXM", "H100-SXM"}, {1, 1, 1}},
        {"llama-3-70b", 3, {"H100-SXM", "H100-SXM", "L4"}, {1, 1, 1}},
        {"llama-3-70b", 4, {"H100-SXM", "A100-80GB-SXM", "L40S", "L4"}, {1, 1, 1, 2}},
        {"llama-3-8b", 4, {"L4", "T4", "A10G", "L4"}, {1, 1, 1, 1}},
        {"llama-3-70b", 4, {"L4", "L4", "L4", "L4"}, {1, 1, 1, 1}}, /* 80 GB: none fits */
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        sched_model m;
        assert_int_equal(sched_model_builtin(cases[k].model, &m, NULL), 0);
        sched_stage s[4];
        for (int i = 0; i < cases[k].n; i++)
            s[i] = (sched_stage){
                sched_catalog_find(&cat, cases[k].type[i]), -1, cases[k].tp[i], 0, 0, 0};
        double want = brute(&m, &cat, s, cases[k].n, 0, 0, 0, 512, &pp);
        int rc = sched_layer_split(&m, &cat, s, cases[k].n, 512, &pp, &e);
        if (!isfinite(want)) {
            assert_int_equal(rc, MD_ERANGE);
            continue;
        }
        assert_int_equal(rc, 0);
        double got = 0;
        int next = 0;
        for (int i = 0; i < cases[k].n; i++) {
            assert_int_equal(s[i].layer_lo, next);
            assert_true(s[i].layer_hi > s[i].layer_lo);
            assert_int_equal(sched_stage_fits(&m, &cat.gpus[s[i].type], &s[i], 512, &pp, NULL), 0);
            got = fmax(got, sched_perf_decode_step(&m, &cat.gpus[s[i].type], s[i].tp,
                                                   s[i].layer_hi - s[i].layer_lo, i == 0,
                                                   i == cases[k].n - 1, 16, 1024, &pp));
            next = s[i].layer_hi;
        }
        assert_int_equal(next, m.layers);
        print_message("%s over %d stages: DP %.6f ms, brute force %.6f ms\n", cases[k].model,
                      cases[k].n, got * 1e3, want * 1e3);
        assert_true(fabs(got - want) <= 1e-12 * want);
    }
    sched_catalog_free(&cat);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(seventy_b_on_two_gpu_hosts_is_a_pipeline_across_hosts),
        cmocka_unit_test(one_l4_more_does_not_idle_the_h100s),
        cmocka_unit_test(pipelines_pack_into_hosts_as_the_rows_allow),
        cmocka_unit_test(pipeline_hop_costs_bandwidth_and_latency_by_hand),
        cmocka_unit_test(layer_split_dp_matches_brute_force_three_and_four_stages),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
