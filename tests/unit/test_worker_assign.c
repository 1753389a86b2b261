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
        " \"stages\": [{\"gpus\": [\"{b}/0\"]}, {\"gpus\": [\"{a}#L4/1\"]}]},"
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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(device_names_as_the_scheduler_writes_them),
        cmocka_unit_test(assignment_unions_replicas_and_adds_unlisted_classes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
