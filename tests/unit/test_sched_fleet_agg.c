/* test_sched_fleet_agg.c — fleets as the daemon builds them (one pool per worker): identical
 * hosts merged before planning give the plan of one pool per type, with GPU ids of real
 * workers and every TP group inside one worker; 1,000 single-GPU workers plan; a search
 * stopped at its limit is never "no solution"; the same inputs give the same plan; hosts
 * that are not full are packed by what they hold (docs/scheduler.md §4). */
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

/* A sched_world from a fleet and a workload document (both stolen); aggregate: merge the pools. */
static void world_load(sched_world *x, json_t *fleet, json_t *workload, int aggregate) {
    md_err e = {0};
    int rc = sched_world_load_json(x, fleet, workload, aggregate, &e);
    if (rc)
        print_error("%s\n", e.msg);
    assert_int_equal(rc, 0);
    json_decref(fleet);
    json_decref(workload);
}

static void solve(sched_world *x, const sched_opts *o, sched_plan *p) {
    md_err e = {0};
    int rc = sched_plan_solve(p, &x->w, &x->f, &x->cat, &x->cs, o, &e);
    if (rc)
        print_message("solve: %s\n", e.msg);
    assert_int_equal(rc, 0);
    assert_int_equal(sched_plan_validate(p, &x->w, &x->f, &x->cat, &x->cs, &x->pp, &e), 0);
}

static int has_note(const sched_plan *p, const char *word) {
    size_t i;
    json_t *n;
    json_array_foreach(p->notes, i, n) if (strstr(json_string_value(n), word)) return 1;
    return 0;
}

/* Replicas per candidate label, as a JSON object (label -> count). */
static json_t *replicas_by_label(const sched_plan *p, const sched_world *x) {
    json_t *o = json_object();
    for (int i = 0; i < p->n; i++) {
        const char *l = x->cs.c[p->r[i].cand].label;
        json_object_set_new(o, l, json_integer(json_integer_value(json_object_get(o, l)) + 1));
    }
    return o;
}

/* Every GPU id is "<worker>/<i>" of a worker in the fleet document's naming, i below its
 * size, and all GPUs of a TP group name one worker. */
static void ids_are_workers_gpus(const sched_plan *p, const sched_world *x, int per_host) {
    for (int i = 0; i < p->n; i++) {
        const sched_cand *c = &x->cs.c[p->r[i].cand];
        int at = 0;
        for (int s = 0; s < c->nstages; s++) {
            const char *first = p->r[i].gpu_ids[at];
            const char *slash = strrchr(first, '/');
            assert_non_null(slash);
            assert_non_null(strstr(first, "-w"));
            for (int g = 0; g < c->stages[s].tp; g++) {
                const char *id = p->r[i].gpu_ids[at + g];
                assert_int_equal(strncmp(id, first, (size_t)(slash - first + 1)), 0);
                assert_true(atoi(id + (slash - first) + 1) < per_host);
            }
            at += c->stages[s].tp;
        }
    }
}

static void workers_of_eight_plan_like_one_pool_per_type(void **st) {
    sched_world one, workers;
    world_load(&one, sched_world_fleet1000(1, 0), sched_world_backlog(10, 1), 1);
    world_load(&workers, sched_world_fleet1000(1, 8), sched_world_backlog(10, 1), 1);
    /* 125 pools merged into one per type, hosts in name order */
    assert_int_equal(workers.f.n, SCHED_WORLD_NTYPES);
    assert_int_equal(workers.f.pools[0].nhosts, 12);
    assert_string_equal(workers.f.pools[0].hosts[11].name, "h100-w011");
    assert_int_equal(sched_fleet_gpus(&workers.f), 1000);
    sched_opts o;
    sched_opts_defaults(&o);
    sched_plan a, b;
    solve(&one, &o, &a);
    solve(&workers, &o, &b);
    json_t *la = replicas_by_label(&a, &one), *lb = replicas_by_label(&b, &workers);
    assert_true(json_equal(la, lb));
    assert_int_equal(a.n, b.n);
    assert_true(fabs(a.tokens_per_s - b.tokens_per_s) <= 1e-6 * a.tokens_per_s);
    assert_true(fabs(a.usd_per_hour - b.usd_per_hour) <= 1e-6 * a.usd_per_hour);
    assert_false(has_note(&b, "limit"));
    ids_are_workers_gpus(&b, &workers, 8);
    assert_int_equal(a.nidle, b.nidle);
    json_decref(la);
    json_decref(lb);
    sched_plan_free(&a);
    sched_plan_free(&b);
    sched_world_free(&one);
    sched_world_free(&workers);
}

static void thousand_single_gpu_workers_plan(void **st) {
    sched_world x;
    world_load(&x, sched_world_fleet1000(1, 1), sched_world_backlog(10, 1), 1);
    assert_int_equal(x.f.n, SCHED_WORLD_NTYPES);
    sched_opts o;
    sched_opts_defaults(&o);
    sched_plan p;
    solve(&x, &o, &p);
    assert_true(p.n >= 10);
    assert_true(p.tokens_per_s > 0);
    ids_are_workers_gpus(&p, &x, 1);
    /* no TP across workers: every stage is one GPU (a pipeline's stages on several workers) */
    int used = 0;
    for (int i = 0; i < p.n; i++) {
        const sched_cand *c = &x.cs.c[p.r[i].cand];
        for (int s = 0; s < c->nstages; s++)
            assert_int_equal(c->stages[s].tp, 1);
        used += c->gpus;
    }
    assert_int_equal(p.nidle + used, 1000);
    sched_plan_free(&p);
    sched_world_free(&x);
}

/* A search stopped at once (one node, or a clock of 1 ms) is a plan with a note, never "no
 * solution": each later solve starts from the solution in force. */
static void a_stopped_search_is_not_no_solution(void **st) {
    sched_world x;
    world_load(&x, sched_world_fleet1000(1, 8), sched_world_backlog(10, 20), 1);
    sched_opts o;
    sched_opts_defaults(&o);
    o.node_limit = 1;
    sched_plan p;
    solve(&x, &o, &p);
    assert_true(p.n > 0);
    assert_true(has_note(&p, "node limit"));
    sched_plan_free(&p);
    sched_opts_defaults(&o);
    o.time_limit_s = 0.001;
    solve(&x, &o, &p);
    assert_true(has_note(&p, "limit"));
    sched_plan_free(&p);
    sched_world_free(&x);
}

static char *plan_text(const sched_plan *p, const sched_world *x) {
    json_t *doc = sched_plan_to_json(p, &x->w, &x->f, &x->cat, &x->cs);
    json_object_del(doc, "created_at");
    json_object_del(json_object_get(doc, "totals"), "solve_s");
    char *s = json_dumps(doc, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(doc);
    return s;
}

/* A contended fleet (demand beyond it, so the search stops at its node limit): the same
 * inputs give the same plan, byte for byte. */
static void contended_fleet_gives_the_same_plan_twice(void **st) {
    sched_world x;
    world_load(&x, sched_world_fleet1000(1, 25), sched_world_backlog(10, 20), 1);
    sched_opts o;
    sched_opts_defaults(&o);
    sched_plan a, b;
    solve(&x, &o, &a);
    solve(&x, &o, &b);
    char *ta = plan_text(&a, &x), *tb = plan_text(&b, &x);
    assert_string_equal(ta, tb);
    assert_true(a.n > 100);
    free(ta);
    free(tb);
    sched_plan_free(&a);
    sched_plan_free(&b);
    sched_world_free(&x);
}

/* Pools of 12, 6 and 8 L4s, 8 per host: hosts of 8 and 4 ("a"), 6 ("b") and 8 ("c"); only
 * the two full hosts hold an 8-GPU group. */
static void partial_hosts_hold_what_they_have(void **st) {
    sched_world x;
    json_t *f = json_pack("{s:[{s:s, s:s, s:i, s:i}, {s:s, s:s, s:i, s:i}, {s:s, s:s, s:i, s:i}]}",
                          "pools", "name", "c", "type", "L4", "count", 8, "gpus_per_host", 8,
                          "name", "a", "type", "L4", "count", 12, "gpus_per_host", 8, "name", "b",
                          "type", "L4", "count", 6, "gpus_per_host", 8);
    json_t *w =
        json_pack("{s:[{s:s, s:i, s:i, s:i, s:i}]}", "models", "model", "llama-3-70b", "requests",
                  1000000, "deadline_s", 3600, "input_mean", 500, "output_mean", 200);
    world_load(&x, f, w, 1);
    assert_int_equal(x.f.n, 1);
    const sched_pool *p = &x.f.pools[0];
    assert_int_equal(p->count, 26);
    assert_int_equal(p->nhosts, 4);
    assert_int_equal(p->gpus_per_host, 8);
    char id[SCHED_ID];
    int h = -1, k0;
    sched_pool_gpu_id(p, 8, id);
    assert_string_equal(id, "a/8");
    sched_pool_gpu_id(p, 12, id);
    assert_string_equal(id, "b/0");
    sched_pool_gpu_id(p, 25, id);
    assert_string_equal(id, "c/7");
    assert_int_equal(sched_pool_find_gpu(p, "a/11", &h), 11);
    assert_int_equal(h, 1);
    assert_int_equal(sched_pool_find_gpu(p, "b/5", &h), 17);
    assert_int_equal(sched_pool_host(p, 2, &k0), 6);
    assert_int_equal(k0, 12);
    assert_int_equal(sched_pool_find_gpu(p, "a/12", &h), -1);
    assert_int_equal(sched_pool_find_gpu(p, "b/6", &h), -1);
    assert_int_equal(sched_pool_find_gpu(p, "d/0", &h), -1);
    assert_int_equal(sched_pool_find_gpu(p, "a/x", &h), -1);
    /* TP groups only (pipelines across these hosts are candidates too): what matters here
     * is which hosts can hold an 8-GPU group */
    int k = 0;
    for (int c = 0; c < x.cs.n; c++)
        if (x.cs.c[c].nstages == 1)
            x.cs.c[k++] = x.cs.c[c];
    x.cs.n = k;
    sched_opts o;
    sched_opts_defaults(&o);
    sched_plan pl;
    solve(&x, &o, &pl);
    int eight[2], n8 = 0;
    for (int i = 0; i < pl.n; i++)
        if (x.cs.c[pl.r[i].cand].gpus == 8) {
            assert_true(n8 < 2);
            eight[n8++] = i;
            assert_true(!strcmp(pl.r[i].gpu_ids[0], "a/0") || !strcmp(pl.r[i].gpu_ids[0], "c/0"));
        }
    assert_int_equal(n8, 2); /* the demand wants all it can get: both full hosts */
    /* Two GPUs swapped between the 8-GPU groups: each group spans two hosts. */
    md_err e = {0};
    char t[SCHED_ID];
    memcpy(t, pl.r[eight[0]].gpu_ids[7], SCHED_ID);
    memcpy(pl.r[eight[0]].gpu_ids[7], pl.r[eight[1]].gpu_ids[7], SCHED_ID);
    memcpy(pl.r[eight[1]].gpu_ids[7], t, SCHED_ID);
    assert_int_equal(sched_plan_validate(&pl, &x.w, &x.f, &x.cat, &x.cs, &x.pp, &e), MD_EINVAL);
    assert_non_null(strstr(e.msg, "spans two hosts"));
    sched_plan_free(&pl);
    sched_world_free(&x);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(workers_of_eight_plan_like_one_pool_per_type),
        cmocka_unit_test(thousand_single_gpu_workers_plan),
        cmocka_unit_test(a_stopped_search_is_not_no_solution),
        cmocka_unit_test(contended_fleet_gives_the_same_plan_twice),
        cmocka_unit_test(partial_hosts_hold_what_they_have),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
