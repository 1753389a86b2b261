/* test_worker_assign.c — worker/assign.c: the scheduler's device names, a worker's
 * assignment from a plan, and clear errors for malformed replicas. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "worker/assign.h"

static json_t *parse(const char *s) {
    json_t *j = json_loads(s, 0, NULL);
    assert_non_null(j);
    return j;
}

static void device_names_as_the_scheduler_writes_them(void **st) {
    assert_true(wk_gpu_of_worker("{w1}/0", "w1"));
    assert_true(wk_gpu_of_worker("{w1}#L4/3", "w1"));
    assert_true(wk_gpu_of_worker("w1/0", "w1"));
    assert_true(wk_gpu_of_worker("w1#H200/12", "w1"));
    assert_false(wk_gpu_of_worker("{w10}/0", "w1"));
    assert_false(wk_gpu_of_worker("w10/0", "w1"));
    assert_false(wk_gpu_of_worker("{w1}/", "w1"));
    assert_false(wk_gpu_of_worker("{w1}/x", "w1"));
    assert_false(wk_gpu_of_worker("{w1}", "w1"));
    assert_false(wk_gpu_of_worker("l4/0", ""));
}

static void assignment_unions_replicas_and_adds_unlisted_classes(void **st) {
    json_t *plan = parse(
        "{\"version\": 1, \"classes\": ["
        "{\"model\": \"m\", \"name\": \"s\", \"max_tokens\": 100},"
        "{\"model\": \"m\", \"name\": \"l\", \"max_tokens\": 1000},"
        "{\"model\": \"m\", \"name\": \"orphan\", \"max_tokens\": 5000}],"
        "\"replicas\": ["
        "{\"id\": \"r0\", \"model\": \"m\", \"classes\": [\"s\"],"
        " \"stages\": [{\"gpus\": [\"{a}/0\"]}]},"
        "{\"id\": \"r1\", \"model\": \"m\", \"classes\": [\"l\"],"
        " \"stages\": [{\"gpus\": [\"{b}/0\", \"{a}#L4/1\"]}]},"
        "{\"id\": \"r2\", \"model\": \"n\", \"classes\": [], \"stages\": [{\"gpus\": [\"{c}/0\"]}]}"
        "]}");
    wk_assign a[WK_ASSIGN_MAX];
    md_err e = {0};
    assert_int_equal(wk_plan_assignment(plan, "a", a, &e), 1);
    assert_string_equal(a[0].model, "m");
    assert_string_equal(a[0].replicas, "r0,r1");
    assert_int_equal(a[0].n_classes, 3);
    assert_string_equal(a[0].classes[0], "s");
    assert_string_equal(a[0].classes[1], "l");
    assert_string_equal(a[0].classes[2], "orphan");
    assert_int_equal(wk_plan_assignment(plan, "c", a, &e), 1);
    assert_string_equal(a[0].model, "n");
    assert_int_equal(a[0].n_classes, 0);
    assert_int_equal(wk_plan_assignment(plan, "nobody", a, &e), 0);
    json_decref(plan);
    json_t *bad = parse("{\"replicas\": [{\"id\": \"r0\", \"stages\": []}]}");
    assert_int_equal(wk_plan_assignment(bad, "a", a, &e), MD_EINVAL);
    json_decref(bad);
    bad = parse("{\"replicas\": [{\"model\": \"m\", \"classes\": [7], \"stages\": [{\"gpus\": "
                "[\"a/0\"]}]}]}");
    assert_int_equal(wk_plan_assignment(bad, "a", a, &e), MD_EINVAL);
    json_decref(bad);
}

/* A replica of stages that each name one GPU is a pipeline: its stage 0 worker heads it (the
 * model, the replica's classes, the layer ranges), a later stage's worker gets a stage role
 * and not the model; a stage naming several GPUs (TP over workers) is served whole. */
static void pipelines_give_a_head_and_stage_roles(void **st) {
    json_t *plan = parse("{\"version\": 4, \"replicas\": ["
                         "{\"id\": \"p0\", \"model\": \"m\", \"classes\": [\"s\"], \"stages\": ["
                         " {\"gpus\": [\"{h}/0\"], \"tp\": 1, \"layers\": [0, 7]},"
                         " {\"gpus\": [\"{s}/0\"], \"tp\": 1, \"layers\": [7, 20]},"
                         " {\"gpus\": [\"t/0\"], \"tp\": 1, \"layers\": [20, 30]}]},"
                         "{\"id\": \"tp0\", \"model\": \"n\", \"classes\": [], \"stages\": ["
                         " {\"gpus\": [\"{s}/0\", \"{u}/0\"], \"tp\": 2, \"layers\": [0, 10]},"
                         " {\"gpus\": [\"{v}/0\"], \"tp\": 1, \"layers\": [10, 30]}]}"
                         "]}");
    wk_assign a[WK_ASSIGN_MAX];
    wk_role r[WK_ROLES_MAX];
    md_err e = {0};
    assert_int_equal(wk_plan_assignment(plan, "h", a, &e), 1);
    assert_string_equal(a[0].model, "m");
    assert_string_equal(a[0].replicas, "p0");
    assert_int_equal(a[0].n_classes, 1);
    assert_int_equal(a[0].pipe.n_stages, 3);
    assert_string_equal(a[0].pipe.replica, "p0");
    assert_int_equal(a[0].pipe.lo[1], 7);
    assert_int_equal(a[0].pipe.hi[2], 30);
    assert_int_equal(wk_plan_roles(plan, "h", r, &e), 0);
    /* s: stage 1 of p0 (a role), and n whole from the TP replica */
    assert_int_equal(wk_plan_assignment(plan, "s", a, &e), 1);
    assert_string_equal(a[0].model, "n");
    assert_int_equal(a[0].pipe.n_stages, 0);
    assert_int_equal(wk_plan_roles(plan, "s", r, &e), 1);
    assert_string_equal(r[0].replica, "p0");
    assert_string_equal(r[0].model, "m");
    assert_int_equal(r[0].stage, 1);
    assert_int_equal(r[0].lo, 7);
    assert_int_equal(r[0].hi, 20);
    assert_int_equal(wk_plan_assignment(plan, "t", a, &e), 0);
    assert_int_equal(wk_plan_roles(plan, "t", r, &e), 1);
    assert_int_equal(r[0].stage, 2);
    assert_int_equal(wk_plan_roles(plan, "v", r, &e), 0);
    assert_int_equal(wk_plan_assignment(plan, "v", a, &e), 1);
    json_decref(plan);
    /* a pipeline's layers must follow each other from 0; its id names keys */
    json_t *bad = parse("{\"replicas\": [{\"id\": \"p0\", \"model\": \"m\", \"stages\": ["
                        "{\"gpus\": [\"a/0\"], \"layers\": [0, 7]},"
                        "{\"gpus\": [\"b/0\"], \"layers\": [8, 30]}]}]}");
    assert_int_equal(wk_plan_assignment(bad, "a", a, &e), MD_EINVAL);
    assert_non_null(strstr(e.msg, "stages[1].layers"));
    assert_int_equal(wk_plan_roles(bad, "b", r, &e), MD_EINVAL);
    json_decref(bad);
    bad = parse("{\"replicas\": [{\"id\": \"p{0}\", \"model\": \"m\", \"stages\": ["
                "{\"gpus\": [\"a/0\"], \"layers\": [0, 7]},"
                "{\"gpus\": [\"b/0\"], \"layers\": [7, 30]}]}]}");
    assert_int_equal(wk_plan_assignment(bad, "a", a, &e), MD_EINVAL);
    assert_non_null(strstr(e.msg, "braces"));
    json_decref(bad);
}

/* Issue 39 item 11: a replica's "steal" classes (held, routed to other replicas) are read
 * only when its routed streams have nothing: the assignment lists them apart, without the
 * classes the worker reads anyway. */
static void steal_classes_are_listed_apart(void **st) {
    json_t *plan =
        parse("{\"version\": 1, \"classes\": ["
              "{\"model\": \"m\", \"name\": \"s\", \"max_tokens\": 100},"
              "{\"model\": \"m\", \"name\": \"l\", \"max_tokens\": 1000}],"
              "\"replicas\": ["
              "{\"id\": \"r0\", \"model\": \"m\", \"classes\": [\"s\"], \"steal\": [\"l\"],"
              " \"stages\": [{\"gpus\": [\"{a}/0\"]}]},"
              "{\"id\": \"r1\", \"model\": \"m\", \"classes\": [\"l\"], \"steal\": [\"s\"],"
              " \"stages\": [{\"gpus\": [\"{b}/0\"]}]},"
              "{\"id\": \"r2\", \"model\": \"m\", \"classes\": [\"l\"], \"steal\": [\"s\"],"
              " \"stages\": [{\"gpus\": [\"{a}/1\"]}]}]}");
    wk_assign a[WK_ASSIGN_MAX];
    md_err e = {0};
    assert_int_equal(wk_plan_assignment(plan, "b", a, &e), 1);
    assert_int_equal(a[0].n_classes, 1);
    assert_string_equal(a[0].classes[0], "l");
    assert_int_equal(a[0].n_steal, 1);
    assert_string_equal(a[0].steal[0], "s");
    /* worker a holds r0 (s, steals l) and r2 (l, steals s): it reads both, steals nothing */
    assert_int_equal(wk_plan_assignment(plan, "a", a, &e), 1);
    assert_int_equal(a[0].n_classes, 2);
    assert_int_equal(a[0].n_steal, 0);
    json_t *bad = parse("{\"replicas\": [{\"model\": \"m\", \"classes\": [], \"steal\": [7],"
                        " \"stages\": [{\"gpus\": [\"{a}/0\"]}]}]}");
    assert_int_equal(wk_plan_assignment(bad, "a", a, &e), MD_EINVAL);
    assert_non_null(strstr(e.msg, "steal"));
    json_decref(bad);
    json_decref(plan);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(device_names_as_the_scheduler_writes_them),
        cmocka_unit_test(assignment_unions_replicas_and_adds_unlisted_classes),
        cmocka_unit_test(pipelines_give_a_head_and_stage_roles),
        cmocka_unit_test(steal_classes_are_listed_apart),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
