/* test_queue_plan.c — queue/plan.c: request-size estimates, class picking, and clear errors
 * for malformed classes. A worker's assignment from a plan is test_worker_assign.c's. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "queue/plan.h"

static json_t *parse(const char *s) {
    json_t *j = json_loads(s, 0, NULL);
    assert_non_null(j);
    return j;
}

static void estimate_is_quarter_bytes_plus_max_tokens(void **st) {
    json_t *chat = parse("{\"messages\": [{\"role\": \"system\", \"content\": \"abcd\"},"
                         "{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": "
                         "\"efghi\"}]}], \"max_tokens\": 10}");
    assert_int_equal(q_estimate_tokens(chat, 256), 3 + 10); /* ceil(9 / 4) + 10 */
    json_t *comp = parse("{\"prompt\": \"12345678\", \"max_completion_tokens\": 7}");
    assert_int_equal(q_estimate_tokens(comp, 256), 2 + 7);
    json_t *bare = parse("{\"messages\": []}");
    assert_int_equal(q_estimate_tokens(bare, 256), 256);
    assert_int_equal(q_estimate_tokens(NULL, 100), 100); /* not JSON: the default */
    json_decref(chat);
    json_decref(comp);
    json_decref(bare);
}

static void classes_sorted_and_picked_smallest_that_fits(void **st) {
    json_t *plan = parse("{\"version\": 3, \"classes\": ["
                         "{\"model\": \"m\", \"name\": \"long\", \"max_tokens\": 4096},"
                         "{\"model\": \"other\", \"name\": \"x\", \"max_tokens\": 1},"
                         "{\"model\": \"m\", \"name\": \"short\", \"max_tokens\": 300}]}");
    q_class c[Q_CLASS_MAX];
    md_err e = {0};
    assert_int_equal(q_plan_version(plan), 3);
    assert_int_equal(q_plan_classes(plan, "m", c, &e), 2);
    assert_string_equal(c[0].name, "short");
    assert_string_equal(q_class_pick(c, 2, 1)->name, "short");
    assert_string_equal(q_class_pick(c, 2, 300)->name, "short");
    assert_string_equal(q_class_pick(c, 2, 301)->name, "long");
    assert_string_equal(q_class_pick(c, 2, 100000)->name, "long"); /* largest otherwise */
    assert_int_equal(q_plan_classes(plan, "none", c, &e), 0);
    json_decref(plan);
}

static void malformed_classes_are_clear_errors(void **st) {
    const char *bad[] = {
        "{\"classes\": {}}",
        "{\"classes\": [{\"model\": \"m\", \"name\": \"a b\", \"max_tokens\": 5}]}",
        "{\"classes\": [{\"model\": \"m\", \"name\": \"a\", \"max_tokens\": 0}]}",
        "{\"classes\": [{\"model\": \"m\", \"name\": \"a\", \"max_tokens\": 5},"
        "{\"model\": \"m\", \"name\": \"a\", \"max_tokens\": 9}]}",
        "{\"classes\": [{\"model\": \"m\", \"name\": \"{x}\", \"max_tokens\": 5}]}"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        json_t *p = parse(bad[i]);
        q_class c[Q_CLASS_MAX];
        md_err e = {0};
        assert_int_equal(q_plan_classes(p, "m", c, &e), MD_EINVAL);
        assert_true(strlen(e.msg) > 0);
        json_decref(p);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(estimate_is_quarter_bytes_plus_max_tokens),
        cmocka_unit_test(classes_sorted_and_picked_smallest_that_fits),
        cmocka_unit_test(malformed_classes_are_clear_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
