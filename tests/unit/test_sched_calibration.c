/* test_sched_calibration.c — the roofline (scheduler/perf.c, default efficiencies) against
 * published measurements (bench/scheduler/calibration.json: TensorRT-LLM, NeMo and vLLM on
 * A100 and H100): prints the error table of docs/scheduler.md §2 and holds each error within
 * the bound the file gives. Not a timing test: the figures are computed, not measured. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/util.h"
#include "scheduler/sched.h"

/* The roofline's figure for one measurement, in its unit (see the file's note). */
static double predict(const sched_model *m, const sched_gpu_type *g, const char *kind, int b,
                      double in, double out, const sched_perf_params *pp) {
    double pre = sched_perf_prefill(m, g, 1, m->layers, 1, 1, in, pp);
    double dec = sched_perf_decode_step(m, g, 1, m->layers, 1, 1, b, in + out / 2, pp);
    if (!strcmp(kind, "ttft_ms"))
        return pre * 1e3;
    if (!strcmp(kind, "decode_tps"))
        return b / dec;
    if (!strcmp(kind, "latency_ms"))
        return (b * pre + out * dec) * 1e3;
    return b * out / (b * pre + out * dec); /* throughput: output tokens/s of the batch */
}

static void roofline_within_bounds_of_published_figures(void **st) {
    (void)st;
    md_err e = {0};
    json_t *doc = md_json_load(MEDLEY_SOURCE_DIR "/bench/scheduler/calibration.json", &e);
    assert_non_null(doc);
    sched_catalog cat;
    assert_int_equal(sched_catalog_load(&cat, NULL, &e), 0);
    sched_perf_params pp;
    sched_perf_defaults(&pp);
    size_t i;
    json_t *x;
    int n = 0, gpus = 0;
    double sum_abs = 0;
    printf("| GPU | model | engine | setting | measured | predicted | error |\n");
    json_array_foreach(json_object_get(doc, "measurements"), i, x) {
        const char *gn = json_string_value(json_object_get(x, "gpu"));
        const char *kind = json_string_value(json_object_get(x, "kind"));
        int t = sched_catalog_find(&cat, gn);
        assert_true(t >= 0);
        sched_model m;
        assert_int_equal(
            sched_model_builtin(json_string_value(json_object_get(x, "model")), &m, &e), 0);
        int b = (int)json_integer_value(json_object_get(x, "batch"));
        double in = json_number_value(json_object_get(x, "input"));
        double out = json_number_value(json_object_get(x, "output"));
        double meas = json_number_value(json_object_get(x, "measured"));
        double pred = predict(&m, &cat.gpus[t], kind, b, in, out, &pp);
        double err = 100 * (pred - meas) / meas;
        printf("| %s | %s | %s | %s, batch %d, %g + %g tokens | %g | %.0f | %+.0f%% |\n", gn,
               m.name, json_string_value(json_object_get(x, "engine")), kind, b, in, out, meas,
               pred, err);
        assert_true(fabs(err) <= json_number_value(json_object_get(x, "bound_pct")));
        sum_abs += fabs(err);
        n++;
        gpus |= 1 << t;
    }
    printf("mean |error| over %d measurements: %.0f%%\n", n, sum_abs / n);
    assert_true(n >= 5);
    assert_true(__builtin_popcount((unsigned)gpus) >= 2);
    sched_catalog_free(&cat);
    json_decref(doc);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(roofline_within_bounds_of_published_figures),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
