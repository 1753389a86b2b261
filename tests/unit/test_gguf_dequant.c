/* test_gguf_dequant.c — dequantization and quantization against an independent reference
 * (the `gguf` Python package; fixtures made by tests/fixtures/make_dequant_fixtures.py):
 * synthetic blocks of every supported type, and tensors + metadata of the real SmolLM2 file
 * (skipped when the model is not fetched). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dtype.h"
#include "common/util.h"
#include "engine/weights/gguf.h"
#include "engine/weights/quant.h"

#define MODEL_FILE "SmolLM2-135M-Instruct.Q4_1.gguf"

typedef struct {
    int type;
    uint32_t n;
    const float *src; /* NULL when the blocks were not made by quantize */
    const uint8_t *raw;
    size_t raw_len;
    const float *ref;
    char *buf;
} fixture;

static void load_fixture(const char *name, fixture *fx) {
    char path[1024];
    snprintf(path, sizeof path, "%s/gguf/dequant_%s.bin", MEDLEY_FIXTURES, name);
    size_t len;
    md_err e = {0};
    if (md_read_file(path, 0, &fx->buf, &len, &e))
        fail_msg("%s", e.msg);
    uint32_t hdr[3];
    assert_true(len >= 16);
    assert_memory_equal(fx->buf, "MDQF", 4);
    memcpy(hdr, fx->buf + 4, 12);
    fx->type = (int)hdr[0];
    fx->n = hdr[1];
    size_t off = 16;
    fx->src = hdr[2] ? (const float *)(fx->buf + off) : NULL;
    off += hdr[2] ? (size_t)fx->n * 4 : 0;
    fx->raw = (const uint8_t *)fx->buf + off;
    fx->raw_len = md_type_row_bytes(fx->type, fx->n);
    off += fx->raw_len;
    fx->ref = (const float *)(fx->buf + off);
    assert_int_equal(off + (size_t)fx->n * 4, len);
    assert_string_equal(md_type_name(fx->type), name);
}

/* Equal within float rounding: the reference computes the same products in float32, maybe
 * in another order, so allow a few ulps of the block's scale. */
static void assert_close(const float *got, const float *want, int64_t n, const char *what) {
    for (int64_t i = 0; i < n; i++) {
        float tol = 4e-7f * fabsf(want[i]) + 1e-12f;
        if (!(fabsf(got[i] - want[i]) <= tol))
            fail_msg("%s element %lld: got %.9g, reference %.9g", what, (long long)i, got[i],
                     want[i]);
    }
}

static void check_dequant(const char *name) {
    fixture fx;
    load_fixture(name, &fx);
    float *y = malloc(fx.n * sizeof *y);
    md_err e = {0};
    assert_int_equal(md_dequantize(fx.type, fx.raw, y, fx.n, &e), 0);
    assert_close(y, fx.ref, fx.n, name);
    free(y);
    free(fx.buf);
}

/* Our quantizer must produce the reference's blocks from the same floats: a block may differ
 * only where a value sits on a rounding tie, so compare dequantized values within one step. */
static void check_quantize(const char *name) {
    fixture fx;
    load_fixture(name, &fx);
    assert_non_null(fx.src);
    uint8_t *q = malloc(fx.raw_len);
    md_err e = {0};
    assert_int_equal(md_quantize(fx.type, fx.src, q, fx.n, &e), 0);
    size_t diff = 0;
    for (size_t i = 0; i < fx.raw_len; i++)
        diff += q[i] != fx.raw[i];
    if (diff)
        fail_msg("%s: %zu of %zu quantized bytes differ from the reference", name, diff,
                 fx.raw_len);
    free(q);
    free(fx.buf);
}

static int model_path(char *out, size_t outsz) {
    const char *dir = getenv("MEDLEY_MODELS");
    if (dir && *dir)
        snprintf(out, outsz, "%s/%s", dir, MODEL_FILE);
    else if (getenv("XDG_CACHE_HOME") && *getenv("XDG_CACHE_HOME"))
        snprintf(out, outsz, "%s/medley/models/%s", getenv("XDG_CACHE_HOME"), MODEL_FILE);
    else
        snprintf(out, outsz, "%s/.cache/medley/models/%s", getenv("HOME") ? getenv("HOME") : "",
                 MODEL_FILE);
    FILE *f = fopen(out, "rb");
    if (!f)
        return 0;
    fclose(f);
    return 1;
}

static json_t *load_model_fixture(void) {
    char path[1024];
    snprintf(path, sizeof path, "%s/gguf/model_tensors.json", MEDLEY_FIXTURES);
    md_err e = {0};
    json_t *doc = md_json_load(path, &e);
    if (!doc)
        fail_msg("%s", e.msg);
    return doc;
}

static void real_model_metadata_matches_reference(void **st) {
    char path[1024];
    if (!model_path(path, sizeof path))
        skip();
    json_t *doc = load_model_fixture();
    gguf_file *f = NULL;
    md_err e = {0};
    if (gguf_open(path, &f, &e))
        fail_msg("%s", e.msg);
    assert_int_equal(gguf_n_tensors(f), json_integer_value(json_object_get(doc, "n_tensors")));
    assert_int_equal(gguf_alignment(f), json_integer_value(json_object_get(doc, "alignment")));
    const char *key;
    json_t *v;
    int checked = 0;
    json_object_foreach(json_object_get(doc, "metadata"), key, v) {
        int64_t i = gguf_find_key(f, key);
        if (i < 0)
            fail_msg("key %s missing", key);
        if (json_is_string(v)) {
            const char *s;
            size_t len;
            assert_int_equal(gguf_get_str(f, key, &s, &len, &e), 0);
            assert_int_equal(len, json_string_length(v));
            assert_memory_equal(s, json_string_value(v), len);
        } else if (json_is_boolean(v)) {
            int b;
            assert_int_equal(gguf_get_bool(f, key, &b, &e), 0);
            assert_int_equal(b, json_is_true(v));
        } else if (json_is_integer(v)) {
            int64_t x;
            assert_int_equal(gguf_get_i64(f, key, &x, &e), 0);
            assert_int_equal(x, json_integer_value(v));
        } else if (json_is_real(v)) {
            float x;
            assert_int_equal(gguf_get_f32(f, key, &x, &e), 0);
            assert_true(x == (float)json_real_value(v));
        } else {
            gguf_vtype et;
            uint64_t n;
            assert_int_equal(gguf_get_arr(f, key, &et, &n, &e), 0);
            assert_int_equal(n, json_integer_value(json_object_get(v, "array_len")));
        }
        checked++;
    }
    assert_true(checked >= 30);
    json_object_foreach(json_object_get(doc, "token_samples"), key, v) {
        const char *s;
        size_t len;
        assert_int_equal(
            gguf_arr_str(f, "tokenizer.ggml.tokens", strtoull(key, NULL, 10), &s, &len, &e), 0);
        assert_int_equal(len, json_string_length(v));
        assert_memory_equal(s, json_string_value(v), len);
    }
    json_object_foreach(json_object_get(doc, "type_counts"), key, v) {
        int64_t n = 0;
        for (int64_t i = 0; i < gguf_n_tensors(f); i++)
            n += !strcmp(md_type_name(gguf_tensor_at(f, i)->type), key);
        assert_int_equal(n, json_integer_value(v));
    }
    gguf_close(f);
    json_decref(doc);
}

static void real_model_tensors_match_reference(void **st) {
    char path[1024];
    if (!model_path(path, sizeof path))
        skip();
    json_t *doc = load_model_fixture();
    gguf_file *f = NULL;
    md_err e = {0};
    if (gguf_open(path, &f, &e))
        fail_msg("%s", e.msg);
    size_t i;
    json_t *t;
    json_array_foreach(json_object_get(doc, "tensors"), i, t) {
        const char *name = json_string_value(json_object_get(t, "name"));
        const gguf_tensor *gt = gguf_find_tensor(f, name);
        assert_non_null(gt);
        assert_string_equal(md_type_name(gt->type), json_string_value(json_object_get(t, "type")));
        json_t *ne = json_object_get(t, "ne");
        for (size_t d = 0; d < json_array_size(ne); d++)
            assert_int_equal(gt->ne[d], json_integer_value(json_array_get(ne, d)));
        int64_t n = gt->n_elements;
        assert_int_equal(n, json_integer_value(json_object_get(t, "n_elements")));
        /* where the data lies: distance from the first listed tensor, as the reference
         * reader places them (absolute file offsets) */
        json_t *t0 = json_array_get(json_object_get(doc, "tensors"), 0);
        const gguf_tensor *g0 = gguf_find_tensor(f, json_string_value(json_object_get(t0, "name")));
        assert_int_equal((const uint8_t *)gt->data - (const uint8_t *)g0->data,
                         json_integer_value(json_object_get(t, "data_offset")) -
                             json_integer_value(json_object_get(t0, "data_offset")));
        float *y = malloc((size_t)n * sizeof *y);
        assert_int_equal(md_dequantize(gt->type, gt->data, y, n, &e), 0);
        float want[16];
        json_t *first = json_object_get(t, "first"), *last = json_object_get(t, "last");
        for (int j = 0; j < 16; j++)
            want[j] = (float)json_real_value(json_array_get(first, (size_t)j));
        assert_close(y, want, 16, name);
        for (int j = 0; j < 16; j++)
            want[j] = (float)json_real_value(json_array_get(last, (size_t)j));
        assert_close(y + n - 16, want, 16, name);
        double sum = 0, sq = 0;
        for (int64_t j = 0; j < n; j++) {
            sum += y[j];
            sq += (double)y[j] * y[j];
        }
        double rsum = json_real_value(json_object_get(t, "sum"));
        double rsq = json_real_value(json_object_get(t, "sum_sq"));
        if (fabs(sum - rsum) > 1e-9 * (fabs(rsq) + 1) || fabs(sq - rsq) > 1e-9 * rsq)
            fail_msg("%s: sum %.12g / %.12g, sum of squares %.12g / %.12g", name, sum, rsum, sq,
                     rsq);
        free(y);
    }
    gguf_close(f);
    json_decref(doc);
}

static void dequant_F32_matches_reference(void **st) {
    check_dequant("F32");
}
static void dequant_F16_matches_reference(void **st) {
    check_dequant("F16");
}
static void dequant_BF16_matches_reference(void **st) {
    check_dequant("BF16");
}
static void dequant_Q8_0_matches_reference(void **st) {
    check_dequant("Q8_0");
}
static void dequant_Q4_0_matches_reference(void **st) {
    check_dequant("Q4_0");
}
static void dequant_Q4_1_matches_reference(void **st) {
    check_dequant("Q4_1");
}
static void dequant_Q4_K_matches_reference(void **st) {
    check_dequant("Q4_K");
}
static void dequant_Q6_K_matches_reference(void **st) {
    check_dequant("Q6_K");
}
static void dequant_Q5_K_matches_reference(void **st) {
    check_dequant("Q5_K");
}
static void dequant_Q5_0_matches_reference(void **st) {
    check_dequant("Q5_0");
}
/* Q5_0 recoded as Q8_0 (what the engine multiplies) holds exactly the same values. */
static void q5_0_recoded_as_q8_0_is_exact(void **st) {
    fixture fx;
    load_fixture("Q5_0", &fx);
    uint8_t *q8 = malloc(fx.n / 32 * 34);
    float *y = malloc(fx.n * sizeof *y);
    md_err e = {0};
    assert_int_equal(md_q5_0_to_q8_0(fx.raw, q8, fx.n, &e), 0);
    assert_int_equal(md_dequantize(MD_TYPE_Q8_0, q8, y, fx.n, &e), 0);
    assert_memory_equal(y, fx.ref, fx.n * sizeof *y);
    assert_int_equal(md_q5_0_to_q8_0(fx.raw, q8, 33, &e), MD_EINVAL);
    free(y);
    free(q8);
    free(fx.buf);
}
static void quantize_F16_matches_reference(void **st) {
    check_quantize("F16");
}
static void quantize_BF16_matches_reference(void **st) {
    check_quantize("BF16");
}
static void quantize_Q8_0_matches_reference(void **st) {
    check_quantize("Q8_0");
}
static void quantize_Q4_0_matches_reference(void **st) {
    check_quantize("Q4_0");
}
static void quantize_Q4_1_matches_reference(void **st) {
    check_quantize("Q4_1");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(dequant_F32_matches_reference),
        cmocka_unit_test(dequant_F16_matches_reference),
        cmocka_unit_test(dequant_BF16_matches_reference),
        cmocka_unit_test(dequant_Q8_0_matches_reference),
        cmocka_unit_test(dequant_Q4_0_matches_reference),
        cmocka_unit_test(dequant_Q4_1_matches_reference),
        cmocka_unit_test(dequant_Q4_K_matches_reference),
        cmocka_unit_test(dequant_Q6_K_matches_reference),
        cmocka_unit_test(dequant_Q5_0_matches_reference),
        cmocka_unit_test(dequant_Q5_K_matches_reference),
        cmocka_unit_test(q5_0_recoded_as_q8_0_is_exact),
        cmocka_unit_test(quantize_F16_matches_reference),
        cmocka_unit_test(quantize_BF16_matches_reference),
        cmocka_unit_test(quantize_Q8_0_matches_reference),
        cmocka_unit_test(quantize_Q4_0_matches_reference),
        cmocka_unit_test(quantize_Q4_1_matches_reference),
        cmocka_unit_test(real_model_metadata_matches_reference),
        cmocka_unit_test(real_model_tensors_match_reference),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
