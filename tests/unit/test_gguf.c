/* test_gguf.c — the GGUF reader: metadata of every value type, the tensor directory,
 * validation errors for hostile headers, and quantize round trips (engine/weights/quant.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "engine/weights/quant.h"
#include "unit/test_gguf_builder.h"

static gguf_file *open_ok(const gb *b) {
    gguf_file *f = NULL;
    md_err e = {0};
    int rc = gguf_open_mem(b->buf, b->len, &f, &e);
    if (rc)
        fail_msg("gguf_open_mem failed: %s", e.msg);
    return f;
}

/* Opening must fail with MD_EFORMAT (or `code`) and a message containing `needle`. */
static void expect_reject(const gb *b, size_t len, int code, const char *needle) {
    gguf_file *f = NULL;
    md_err e = {0};
    int rc = gguf_open_mem(b->buf, len, &f, &e);
    if (f)
        fail_msg("accepted a file that should fail with '%s'", needle);
    if (rc != code)
        fail_msg("expected code %d with '%s', got %d: %s", code, needle, rc, e.msg);
    if (!strstr(e.msg, needle))
        fail_msg("expected '%s' in error message, got '%s'", needle, e.msg);
}

static void small_model_metadata_of_every_type(void **st) {
    gb_marks m;
    gb b = gb_small_model(&m);
    gguf_file *f = open_ok(&b);
    md_err e = {0};
    uint64_t u;
    int64_t i;
    float x;
    int bo;
    const char *s;
    size_t len;
    assert_int_equal(gguf_version(f), 3);
    assert_int_equal(gguf_alignment(f), GB_ALIGN);
    assert_int_equal(gguf_n_kv(f), 19);
    assert_int_equal(gguf_get_str(f, "general.architecture", &s, &len, &e), 0);
    assert_int_equal(len, 5);
    assert_memory_equal(s, "llama", 5);
    assert_int_equal(gguf_get_u64(f, "t.u8", &u, &e), 0);
    assert_int_equal(u, 200);
    assert_int_equal(gguf_get_i64(f, "t.i8", &i, &e), 0);
    assert_int_equal(i, -2);
    assert_int_equal(gguf_get_u64(f, "t.i8", &u, &e), MD_EFORMAT);
    assert_non_null(strstr(e.msg, "negative"));
    assert_int_equal(gguf_get_u64(f, "t.u16", &u, &e), 0);
    assert_int_equal(u, 65000);
    assert_int_equal(gguf_get_i64(f, "t.i16", &i, &e), 0);
    assert_int_equal(i, -300);
    assert_int_equal(gguf_get_u64(f, "llama.context_length", &u, &e), 0);
    assert_int_equal(u, 2048);
    assert_int_equal(gguf_get_i64(f, "t.i32", &i, &e), 0);
    assert_int_equal(i, -70000);
    assert_int_equal(gguf_get_f32(f, "llama.rope.freq_base", &x, &e), 0);
    assert_true(x == 10000.0f);
    assert_int_equal(gguf_get_f32(f, "t.i32", &x, &e), 0);
    assert_true(x == -70000.0f);
    assert_int_equal(gguf_get_f32(f, "t.f64", &x, &e), 0);
    assert_true(x == 0.25f);
    assert_int_equal(gguf_get_bool(f, "t.bool", &bo, &e), 0);
    assert_int_equal(bo, 1);
    assert_int_equal(gguf_get_u64(f, "t.u64", &u, &e), 0);
    assert_true(u == UINT64_MAX);
    assert_int_equal(gguf_get_i64(f, "t.u64", &i, &e), MD_EFORMAT);
    assert_int_equal(gguf_get_i64(f, "t.i64", &i, &e), 0);
    assert_true(i == -5000000000LL);
    assert_int_equal(gguf_get_str(f, "t.str", &s, &len, &e), 0);
    assert_int_equal(len, 12);
    /* wrong type and absent keys name the key */
    assert_int_equal(gguf_get_u64(f, "general.architecture", &u, &e), MD_EFORMAT);
    assert_non_null(strstr(e.msg, "'general.architecture' is a string"));
    assert_int_equal(gguf_get_bool(f, "nope", &bo, &e), MD_ENOTFOUND);
    assert_non_null(strstr(e.msg, "'nope'"));
    assert_int_equal(gguf_find_key(f, "nope"), -1);
    int64_t k = gguf_find_key(f, "t.f64");
    assert_true(k >= 0);
    assert_string_equal(gguf_key_name(f, k), "t.f64");
    assert_int_equal(gguf_kv_type(f, k), GGUF_T_FLOAT64);
    gguf_close(f);
    free(b.buf);
}

static void small_model_arrays_plain_string_and_nested(void **st) {
    gb_marks m;
    gb b = gb_small_model(&m);
    gguf_file *f = open_ok(&b);
    md_err e = {0};
    gguf_vtype et;
    uint64_t n;
    const char *s;
    size_t len;
    const void *data;
    assert_int_equal(gguf_get_arr(f, "tokenizer.ggml.tokens", &et, &n, &e), 0);
    assert_int_equal(et, GGUF_T_STRING);
    assert_int_equal(n, 3);
    assert_int_equal(gguf_arr_str(f, "tokenizer.ggml.tokens", 2, &s, &len, &e), 0);
    assert_int_equal(len, 5);
    assert_memory_equal(s, "hello", 5);
    assert_int_equal(gguf_arr_str(f, "tokenizer.ggml.tokens", 1, &s, &len, &e), 0);
    assert_int_equal(len, 0);
    assert_int_equal(gguf_arr_str(f, "tokenizer.ggml.tokens", 3, &s, &len, &e), MD_ERANGE);
    assert_int_equal(gguf_arr_data(f, "tokenizer.ggml.tokens", &data, &e), MD_EFORMAT);
    assert_int_equal(gguf_get_arr(f, "t.arr_i32", &et, &n, &e), 0);
    assert_int_equal(et, GGUF_T_INT32);
    assert_int_equal(n, 4);
    assert_int_equal(gguf_arr_data(f, "t.arr_i32", &data, &e), 0);
    int32_t v[4];
    memcpy(v, data, sizeof v);
    assert_int_equal(v[0], -5);
    assert_int_equal(v[3], 25);
    assert_int_equal(gguf_arr_str(f, "t.arr_i32", 0, &s, &len, &e), MD_EFORMAT);
    assert_int_equal(gguf_get_arr(f, "t.nested", &et, &n, &e), 0);
    assert_int_equal(et, GGUF_T_ARRAY);
    assert_int_equal(n, 3);
    assert_int_equal(gguf_get_arr(f, "t.empty", &et, &n, &e), 0);
    assert_int_equal(n, 0);
    assert_int_equal(gguf_get_arr(f, "t.u8", &et, &n, &e), MD_EFORMAT);
    gguf_close(f);
    free(b.buf);
}

static void small_model_tensor_directory(void **st) {
    gb_marks m;
    gb b = gb_small_model(&m);
    gguf_file *f = open_ok(&b);
    assert_int_equal(gguf_n_tensors(f), GB_NT);
    assert_int_equal(gguf_data_offset(f), m.data);
    for (int i = 0; i < GB_NT; i++) {
        const gguf_tensor *t = gguf_find_tensor(f, gb_tensors[i].name);
        assert_non_null(t);
        assert_ptr_equal(t, gguf_tensor_at(f, i));
        assert_int_equal(t->type, gb_tensors[i].type);
        assert_int_equal(t->n_dims, 2);
        assert_int_equal(t->ne[0], gb_tensors[i].ne0);
        assert_int_equal(t->ne[1], gb_tensors[i].ne1);
        assert_int_equal(t->ne[2], 1);
        assert_int_equal(t->n_elements, gb_tensors[i].ne0 * gb_tensors[i].ne1);
        assert_int_equal(t->n_bytes, md_type_row_bytes(t->type, t->ne[0]) * (size_t)t->ne[1]);
        size_t off = (size_t)((const uint8_t *)t->data - b.buf);
        assert_int_equal((off - m.data) % GB_ALIGN, 0);
        assert_true(off + t->n_bytes <= b.len);
        float out[512];
        md_err e = {0};
        assert_int_equal(md_dequantize(t->type, t->data, out, t->n_elements, &e), 0);
        for (int64_t j = 0; j < t->n_elements; j++)
            assert_true(isfinite(out[j]));
    }
    assert_null(gguf_find_tensor(f, "t.missing"));
    assert_null(gguf_tensor_at(f, GB_NT));
    assert_null(gguf_tensor_at(f, -1));
    gguf_close(f);
    free(b.buf);
}

static void put_u64(gb *b, size_t at, uint64_t v) {
    memcpy(b->buf + at, &v, 8);
}
static void put_u32(gb *b, size_t at, uint32_t v) {
    memcpy(b->buf + at, &v, 4);
}

static void hostile_headers_are_rejected_with_a_reason(void **st) {
    gb_marks m;
    gb b = gb_small_model(&m);
    gb c = {0};
    gb_put(&c, b.buf, b.len);
#define RESET() memcpy(c.buf, b.buf, b.len)
    expect_reject(&c, 0, MD_EFORMAT, "not a GGUF file");
    expect_reject(&c, 3, MD_EFORMAT, "not a GGUF file");
    expect_reject(&c, 6, MD_EFORMAT, "truncated");
    c.buf[0] = 'X';
    expect_reject(&c, c.len, MD_EFORMAT, "not a GGUF file");
    RESET();
    put_u32(&c, 4, 1);
    expect_reject(&c, c.len, MD_EUNSUPP, "version 1");
    put_u32(&c, 4, 0x03000000);
    expect_reject(&c, c.len, MD_EUNSUPP, "big-endian");
    put_u32(&c, 4, 7);
    expect_reject(&c, c.len, MD_EFORMAT, "unknown GGUF version 7");
    RESET();
    put_u64(&c, m.n_kv, UINT64_MAX);
    expect_reject(&c, c.len, MD_EFORMAT, "metadata entries");
    RESET();
    put_u64(&c, m.n_tensors, 1ULL << 40);
    expect_reject(&c, c.len, MD_EFORMAT, "tensors but the file");
    RESET();
    put_u64(&c, m.kv[0], 1ULL << 62); /* key length */
    expect_reject(&c, c.len, MD_EFORMAT, "metadata key at offset");
    RESET();
    put_u32(&c, m.kv_type[2], 13);
    expect_reject(&c, c.len, MD_EFORMAT, "key 't.u8': unknown value type 13");
    RESET();
    c.buf[m.kv_type[9] + 4] = 2; /* t.bool = 2 */
    expect_reject(&c, c.len, MD_EFORMAT, "not 0 or 1");
    RESET();
    put_u64(&c, m.kv_type[13] + 8, 1ULL << 61); /* tokens array count */
    expect_reject(&c, c.len, MD_EFORMAT, "key 'tokenizer.ggml.tokens': array claims");
    RESET();
    put_u64(&c, m.kv_type[14] + 8, 1ULL << 62); /* int32 array count: count*4 overflows */
    expect_reject(&c, c.len, MD_EFORMAT, "key 't.arr_i32': array of");
    RESET();
    put_u32(&c, m.kv_type[1] + 4, 48); /* alignment not a power of two */
    expect_reject(&c, c.len, MD_EFORMAT, "general.alignment is 48");
    RESET();
    put_u32(&c, m.kv_type[1], GGUF_T_INT32); /* alignment of the wrong type */
    expect_reject(&c, c.len, MD_EFORMAT, "general.alignment is a int32");
    RESET();
    memcpy(c.buf + m.kv[3] + 8, "t.u8", 4); /* "t.i8" -> "t.u8": duplicate key */
    expect_reject(&c, c.len, MD_EFORMAT, "duplicate metadata key 't.u8'");
    RESET();
    memcpy(c.buf + m.tensor[1] + 8, "t.f32", 5); /* "t.f16" -> "t.f32" */
    expect_reject(&c, c.len, MD_EFORMAT, "duplicate tensor name 't.f32'");
    RESET();
    put_u32(&c, m.tensor_ndims[0], 5);
    expect_reject(&c, c.len, MD_EFORMAT, "tensor 't.f32': 5 dimensions");
    RESET();
    put_u64(&c, m.tensor_dims[0], 0);
    expect_reject(&c, c.len, MD_EFORMAT, "tensor 't.f32': dimension 0 is 0");
    RESET();
    put_u64(&c, m.tensor_dims[0], 1ULL << 40);
    put_u64(&c, m.tensor_dims[0] + 8, 1ULL << 40);
    expect_reject(&c, c.len, MD_EFORMAT, "overflow");
    RESET();
    put_u64(&c, m.tensor_dims[2], 1ULL << 40); /* huge but no overflow: bigger than the file */
    expect_reject(&c, c.len, MD_EFORMAT, "more bytes than the whole file");
    RESET();
    put_u32(&c, m.tensor_type[0], 4); /* a removed ggml type */
    expect_reject(&c, c.len, MD_EFORMAT, "tensor 't.f32': unknown element type 4");
    RESET();
    put_u64(&c, m.tensor_dims[3], 48); /* Q8_0 row of 48 */
    expect_reject(&c, c.len, MD_EFORMAT, "not a multiple of Q8_0's block of 32");
    RESET();
    put_u64(&c, m.tensor_off[1], 8);
    expect_reject(&c, c.len, MD_EFORMAT, "tensor 't.f16': offset 8 is not a multiple");
    RESET();
    put_u64(&c, m.tensor_off[GB_NT - 1], 1ULL << 50);
    expect_reject(&c, c.len, MD_EFORMAT, "tensor 't.q6_k'");
    RESET();
    put_u64(&c, m.tensor_off[1], 0); /* t.f16 on top of t.f32 */
    expect_reject(&c, c.len, MD_EFORMAT, "overlap");
    RESET();
    expect_reject(&c, c.len - 1, MD_EFORMAT, "end past the end of the file");
    expect_reject(&c, m.data - 1, MD_EFORMAT, "");
    expect_reject(&c, m.tensor[3] + 5, MD_EFORMAT, "header claims 8 tensors but after the");
    expect_reject(&c, m.tensor_dims[7] + 4, MD_EFORMAT, "tensor 't.q6_k': truncated");
#undef RESET
    free(c.buf);
    free(b.buf);
}

static void open_reports_missing_and_empty_files(void **st) {
    gguf_file *f = NULL;
    md_err e = {0};
    assert_int_equal(gguf_open("/nonexistent/x.gguf", &f, &e), MD_ENOTFOUND);
    assert_non_null(strstr(e.msg, "/nonexistent/x.gguf"));
    char path[] = "/tmp/medley-gguf-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(gguf_open(path, &f, &e), MD_EFORMAT);
    assert_non_null(strstr(e.msg, "empty"));
    assert_int_equal(write(fd, "GGUF\3\0\0\0", 8), 8);
    assert_int_equal(gguf_open(path, &f, &e), MD_EFORMAT);
    assert_non_null(strstr(e.msg, path));
    assert_non_null(strstr(e.msg, "truncated"));
    close(fd);
    unlink(path);
    assert_null(f);
}

static void quantize_round_trip_within_half_a_step(void **st) {
    enum { N = 256 };
    float x[N], y[N];
    uint8_t q[N * 4];
    md_err e = {0};
    uint32_t s = 12345;
    for (int i = 0; i < N; i++) {
        s = s * 1664525u + 1013904223u;
        x[i] = ((float)(s >> 8) / 16777216.0f - 0.5f) * 4.0f;
    }
    const int types[] = {MD_TYPE_F32,  MD_TYPE_F16,  MD_TYPE_BF16,
                         MD_TYPE_Q8_0, MD_TYPE_Q4_0, MD_TYPE_Q4_1};
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        int ty = types[t];
        assert_int_equal(md_quantize(ty, x, q, N, &e), 0);
        assert_int_equal(md_dequantize(ty, q, y, N, &e), 0);
        for (int b = 0; b < N; b += 32) {
            float mn = x[b], mx = x[b], amax = 0;
            for (int j = b; j < b + 32; j++) {
                mn = fminf(mn, x[j]);
                mx = fmaxf(mx, x[j]);
                amax = fmaxf(amax, fabsf(x[j]));
            }
            float tol = ty == MD_TYPE_F32    ? 0
                        : ty == MD_TYPE_F16  ? amax / 1024
                        : ty == MD_TYPE_BF16 ? amax / 128
                        : ty == MD_TYPE_Q8_0 ? amax / 127 * 0.51f + amax / 1024
                        : ty == MD_TYPE_Q4_0 ? amax / 8 * 1.01f + amax / 512
                                             : (mx - mn) / 15 * 0.51f + amax / 512;
            for (int j = b; j < b + 32; j++)
                if (fabsf(x[j] - y[j]) > tol)
                    fail_msg("%s element %d: %g -> %g (tolerance %g)", md_type_name(ty), j, x[j],
                             y[j], tol);
        }
    }
    /* non-finite input: defined codes, no crash (and no undefined float->int cast) */
    x[3] = NAN;
    x[40] = INFINITY;
    x[70] = -INFINITY;
    for (size_t t = 3; t < sizeof types / sizeof types[0]; t++) {
        assert_int_equal(md_quantize(types[t], x, q, N, &e), 0);
        assert_int_equal(md_dequantize(types[t], q, y, N, &e), 0);
        for (int j = 96; j < N; j++) /* blocks without a non-finite value are unaffected */
            if (fabsf(x[j] - y[j]) > 0.3f)
                fail_msg("%s element %d: %g -> %g", md_type_name(types[t]), j, x[j], y[j]);
    }
    assert_int_equal(md_quantize(MD_TYPE_Q4_K, x, q, N, &e), MD_EUNSUPP);
    assert_int_equal(md_quantize(MD_TYPE_Q8_0, x, q, 33, &e), MD_EINVAL);
    assert_non_null(strstr(e.msg, "multiple"));
    assert_int_equal(md_dequantize(MD_TYPE_Q4_1, q, y, 31, &e), MD_EINVAL);
    assert_int_equal(md_dequantize(11 /* Q3_K */, q, y, N, &e), MD_EUNSUPP);
    assert_non_null(strstr(e.msg, "Q3_K"));
    assert_int_equal(md_dequantize(999, q, y, N, &e), MD_EUNSUPP);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(small_model_metadata_of_every_type),
        cmocka_unit_test(small_model_arrays_plain_string_and_nested),
        cmocka_unit_test(small_model_tensor_directory),
        cmocka_unit_test(hostile_headers_are_rejected_with_a_reason),
        cmocka_unit_test(open_reports_missing_and_empty_files),
        cmocka_unit_test(quantize_round_trip_within_half_a_step),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
