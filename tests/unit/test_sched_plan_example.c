/* test_sched_plan_example.c — the hand-written plan of docs/sharding.md ("A plan written by
 * hand", issue 39 item 14) is one a worker can follow: read from the document as a user
 * copies it, the GPU worker heads a two-stage pipeline replica of SmolLM2 (layers 0-19 here,
 * 20-29 remote) and the CPU worker serves stage 1, layers 20-29. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker/assign.h"

/* The JSON block after the "plan example" marker of docs/sharding.md (caller decrefs). */
static json_t *docs_plan(void) {
    FILE *f = fopen(MEDLEY_SOURCE_DIR "/docs/sharding.md", "rb");
    assert_non_null(f);
    static char text[1 << 16];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = 0;
    char *mark = strstr(text, "<!-- plan example:");
    assert_non_null(mark);
    char *open = strstr(mark, "```json\n");
    assert_non_null(open);
    open += 8;
    char *close = strstr(open, "```");
    assert_non_null(close);
    *close = 0;
    json_error_t je;
    json_t *plan = json_loads(open, 0, &je);
    if (!plan)
        print_error("docs/sharding.md plan example, line %d: %s\n", je.line, je.text);
    assert_non_null(plan);
    return plan;
}

static void gpu_worker_heads_the_pipeline(void **st) {
    json_t *plan = docs_plan();
    wk_assign a[WK_ASSIGN_MAX];
    md_err e = {0};
    assert_int_equal(wk_plan_assignment(plan, "gpu-host", a, &e), 1);
    assert_string_equal(a[0].model, "smollm2-135m");
    assert_int_equal(a[0].pipe.n_stages, 2);
    assert_int_equal(a[0].pipe.lo[0], 0);
    assert_int_equal(a[0].pipe.hi[0], 20);
    assert_int_equal(a[0].pipe.lo[1], 20);
    assert_int_equal(a[0].pipe.hi[1], 30);
    wk_role r[WK_ROLES_MAX];
    assert_int_equal(wk_plan_roles(plan, "gpu-host", r, &e), 0);
    json_decref(plan);
}

static void cpu_worker_serves_stage_one(void **st) {
    json_t *plan = docs_plan();
    wk_assign a[WK_ASSIGN_MAX];
    wk_role r[WK_ROLES_MAX];
    md_err e = {0};
    assert_int_equal(wk_plan_assignment(plan, "cpu-host", a, &e), 0);
    assert_int_equal(wk_plan_roles(plan, "cpu-host", r, &e), 1);
    assert_string_equal(r[0].model, "smollm2-135m");
    assert_string_equal(r[0].replica, "r0");
    assert_int_equal(r[0].stage, 1);
    assert_int_equal(r[0].lo, 20);
    assert_int_equal(r[0].hi, 30);
    json_decref(plan);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(gpu_worker_heads_the_pipeline),
        cmocka_unit_test(cpu_worker_serves_stage_one),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
