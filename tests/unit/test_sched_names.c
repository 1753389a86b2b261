/* test_sched_names.c — pool and worker names of any length a host can have (issue 39 item
 * 8): names up to SCHED_NAME_MAX characters plan, every GPU id names its pool, merged hosts
 * keep their full names, a longer name is refused naming the limit; loading 40,000 pools is
 * linear (item 9: the duplicate-name check was quadratic, 10 s). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "scheduler/sched.h"
#include "unit/sched_world.h"

static const char *WORKLOAD = "{\"models\": [{\"model\": \"llama-3-8b\", \"requests\": 100000, "
                              "\"deadline_s\": 3600, \"input_mean\": 500, \"output_mean\": 200}]}";

/* A name of n characters: a default worker id on a long EC2 host name, padded with 'x'. */
static void long_name(char *s, size_t n, char tag) {
    if (n < 1 || n > SCHED_NAME_MAX + 1)
        fail();
    const char *stem = "ip-172-31-45-123.ec2.internal-123456-deadbeef";
    for (size_t i = 0; i < n; i++)
        s[i] = i < strlen(stem) ? stem[i] : 'x';
    s[n - 1] = tag;
    s[n] = 0;
}

/* Two pools named with n characters each (differing only in the last): the plan is valid
 * and every GPU id is "<its pool's full name>/<k>". aggregate: merged as the daemon does. */
static void plan_with_names(size_t n, int aggregate) {
    char a[SCHED_NAME_MAX + 2], b[SCHED_NAME_MAX + 2];
    long_name(a, n, 'a');
    long_name(b, n, 'b');
    json_t *f = json_pack("{s:[{s:s, s:s, s:i, s:i}, {s:s, s:s, s:i, s:i}]}", "pools", "name", a,
                          "type", "L4", "count", 4, "gpus_per_host", 4, "name", b, "type", "L4",
                          "count", 4, "gpus_per_host", 4);
    json_t *w = json_loads(WORKLOAD, 0, NULL);
    sched_world x;
    md_err e = {0};
    int rc = sched_world_load_json(&x, f, w, aggregate, &e);
    if (rc)
        print_message("load (names of %zu): %s\n", n, e.msg);
    assert_int_equal(rc, 0);
    sched_opts o;
    sched_opts_defaults(&o);
    rc = sched_plan_solve(&x.p, &x.w, &x.f, &x.cat, &x.cs, &o, &e);
    if (!rc)
        rc = sched_plan_validate(&x.p, &x.w, &x.f, &x.cat, &x.cs, &x.pp, &e);
    if (rc)
        print_message("plan (names of %zu): %s\n", n, e.msg);
    assert_int_equal(rc, 0);
    assert_true(x.p.n > 0);
    int seen_a = 0, seen_b = 0;
    for (int i = 0; i < x.p.n; i++)
        for (int g = 0; g < x.cs.c[x.p.r[i].cand].gpus; g++) {
            const char *id = x.p.r[i].gpu_ids[g];
            const char *slash = strrchr(id, '/');
            assert_non_null(slash);
            assert_int_equal((size_t)(slash - id), n);
            seen_a += !strncmp(id, a, n);
            seen_b += !strncmp(id, b, n);
        }
    assert_int_equal(seen_a + seen_b, 8); /* every GPU used, each named after its own pool */
    assert_int_equal(seen_a, 4);
    sched_world_free(&x);
    json_decref(f);
    json_decref(w);
}

static void test_names_47_to_max(void **state) {
    (void)state;
    size_t lens[] = {44, 46, 47, 48, 100, 200, SCHED_NAME_MAX};
    for (size_t i = 0; i < sizeof lens / sizeof *lens; i++) {
        plan_with_names(lens[i], 0);
        plan_with_names(lens[i], 1);
    }
}

static void test_name_over_max_refused(void **state) {
    (void)state;
    char a[SCHED_NAME_MAX + 2];
    long_name(a, SCHED_NAME_MAX + 1, 'a');
    json_t *f = json_pack("{s:[{s:s, s:s, s:i}]}", "pools", "name", a, "type", "L4", "count", 4);
    sched_catalog cat;
    sched_fleet fl;
    md_err e = {0};
    assert_int_equal(sched_catalog_load(&cat, NULL, &e), 0);
    assert_int_equal(sched_fleet_from_json(&fl, f, &cat, &e), MD_EINVAL);
    char limit[16];
    snprintf(limit, sizeof limit, "%d", SCHED_NAME_MAX);
    assert_non_null(strstr(e.msg, "fleet.pools[0].name"));
    assert_non_null(strstr(e.msg, limit));
    sched_fleet_free(&fl);
    sched_catalog_free(&cat);
    json_decref(f);
}

static double load_pools_s(int n) {
    json_t *doc = sched_world_workers(n, "L4");
    sched_catalog cat;
    sched_fleet f;
    md_err e = {0};
    assert_int_equal(sched_catalog_load(&cat, NULL, &e), 0);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = sched_fleet_from_json(&f, doc, &cat, &e);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    assert_int_equal(rc, 0);
    assert_int_equal(f.n, n);
    sched_fleet_free(&f);
    /* a duplicate is still found, naming both */
    json_array_append_new(json_object_get(doc, "pools"),
                          json_pack("{s:s, s:s, s:i}", "name", "w7", "type", "L4", "count", 1));
    assert_int_equal(sched_fleet_from_json(&f, doc, &cat, &e), MD_EINVAL);
    assert_non_null(strstr(e.msg, "'w7' is used twice"));
    sched_catalog_free(&cat);
    json_decref(doc);
    return (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
}

/* 40,000 pools took 10 s with the quadratic check; linear, well under a second. */
static void test_load_40000_pools(void **state) {
    (void)state;
    double s = load_pools_s(40000);
    print_message("40,000 pools loaded in %.3f s\n", s);
    assert_true(s < 2.0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names_47_to_max),
        cmocka_unit_test(test_name_over_max_refused),
        cmocka_unit_test(test_load_40000_pools),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
