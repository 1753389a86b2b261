/* test_safetensors.c — the safetensors reader on hand-made files: a good file read back,
 * then one hostile file per rule of engine/weights/safetensors.h (truncated, huge header length,
 * non-object header, bad dtype, offsets past the end, overlap, hole, size mismatch,
 * duplicate names, misalignment), each refused with a message naming the file and tensor;
 * and a sharded directory with its index, good and bad. Files are exact-size heap copies so
 * ASan sees any read past the end. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/dtype.h"
#include "engine/weights/safetensors.h"

/* header JSON + data bytes -> a file image: the header length as given, or when hlen is 0
 * the header padded with spaces to a multiple of 8 (as the reference writer pads it, so
 * tensor data is aligned) and its length. */
static uint8_t *image(const char *hdr, uint64_t hlen, const void *data, size_t dlen, size_t *len) {
    size_t hl = strlen(hdr), pad = hlen ? 0 : (8 - hl % 8) % 8;
    *len = 8 + hl + pad + dlen;
    uint8_t *p = malloc(*len);
    uint64_t h = hlen ? hlen : hl + pad;
    memcpy(p, &h, 8);
    memcpy(p + 8, hdr, hl);
    memset(p + 8 + hl, ' ', pad);
    hl += pad;
    if (dlen)
        memcpy(p + 8 + hl, data, dlen);
    return p;
}

/* Open the image; return the code, with e filled. */
static int try_open(const char *hdr, uint64_t hlen, size_t dlen, md_err *e) {
    static uint8_t zeros[4096];
    size_t len;
    uint8_t *p = image(hdr, hlen, zeros, dlen, &len);
    st_file *f = NULL;
    int rc = st_open_mem(p, len, "t.safetensors", &f, e);
    if (rc == 0)
        st_close(f);
    else
        assert_null(f);
    free(p);
    return rc;
}

#define REFUSED(code, needle, hdr, hlen, dlen)                                                     \
    do {                                                                                           \
        md_err e_ = {0};                                                                           \
        assert_int_equal(try_open(hdr, hlen, dlen, &e_), code);                                    \
        if (!strstr(e_.msg, needle))                                                               \
            fail_msg("message \"%s\" lacks \"%s\"", e_.msg, needle);                               \
        assert_non_null(strstr(e_.msg, "t.safetensors"));                                          \
    } while (0)

static void good_file_reads_back(void **state) {
    (void)state;
    /* header padded to 8 bytes like the reference writer: F32 at 0, BF16 after */
    const char *h = ("{\"__metadata__\":{\"format\":\"pt\"},"
                     "\"b\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[8,20]},"
                     "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}");
    uint8_t data[20];
    float a[2] = {1.5f, -2.0f};
    memcpy(data, a, 8);
    for (int i = 0; i < 6; i++) {
        uint16_t b = (uint16_t)(0x3f80 + i);
        memcpy(data + 8 + 2 * i, &b, 2);
    }
    size_t len;
    uint8_t *p = image(h, 0, data, sizeof data, &len);
    st_file *f = NULL;
    md_err e = {0};
    assert_int_equal(st_open_mem(p, len, "t.safetensors", &f, &e), 0);
    assert_int_equal(st_n_tensors(f), 2);
    const st_tensor *ta = st_find(f, "a"), *tb = st_find(f, "b");
    assert_non_null(ta);
    assert_non_null(tb);
    assert_null(st_find(f, "c"));
    assert_int_equal(ta->type, MD_TYPE_F32);
    assert_int_equal(tb->type, MD_TYPE_BF16);
    assert_int_equal(tb->n_dims, 2);
    assert_int_equal(tb->shape[0], 2);
    assert_int_equal(tb->shape[1], 3);
    assert_int_equal(tb->n_bytes, 12);
    float x;
    memcpy(&x, ta->data, 4);
    assert_true(x == 1.5f);
    assert_int_equal(st_data_bytes(f), 20);
    st_close(f);
    free(p);
}

static void hostile_files_refused(void **state) {
    (void)state;
    const char *ok = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    md_err e = {0};
    assert_int_equal(try_open(ok, 0, 8, &e), 0);
    /* truncated: shorter than the length prefix, header cut, data cut */
    {
        st_file *f = NULL;
        assert_int_equal(st_open_mem("\x10\0\0", 3, "t.safetensors", &f, &e), MD_EFORMAT);
        assert_non_null(strstr(e.msg, "too short"));
    }
    REFUSED(MD_EFORMAT, "truncated", ok, 4096, 0);
    REFUSED(MD_EFORMAT, "past the end", ok, 0, 4);
    /* huge header length */
    REFUSED(MD_EFORMAT, "header length", ok, (uint64_t)1 << 62, 8);
    REFUSED(MD_EFORMAT, "header length", ok, 1, 8);
    /* not JSON, not an object */
    REFUSED(MD_EFORMAT, "not valid JSON", "{\"a\":", 0, 0);
    REFUSED(MD_EFORMAT, "not a JSON object", "[1,2,3]", 0, 0);
    REFUSED(MD_EFORMAT, "entry is not a JSON object", "{\"a\":7}", 0, 0);
    /* dtypes: named */
    REFUSED(MD_EUNSUPP, "dtype F64",
            "{\"a\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 0, 8);
    REFUSED(MD_EUNSUPP, "dtype I8",
            "{\"a\":{\"dtype\":\"I8\",\"shape\":[8],\"data_offsets\":[0,8]}}", 0, 8);
    /* shape x dtype size vs span */
    REFUSED(MD_EFORMAT, "span", "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}",
            0, 8);
    REFUSED(MD_EFORMAT, "non-negative",
            "{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 0, 8);
    REFUSED(MD_EFORMAT, "overflows",
            "{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,8]}}",
            0, 8);
    /* offsets: past EOF, reversed, overlapping, a hole, unindexed tail, misaligned */
    REFUSED(MD_EFORMAT, "past the end",
            "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4096,4104]}}", 0, 8);
    REFUSED(MD_EFORMAT, "not a span",
            "{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,0]}}", 0, 8);
    REFUSED(MD_EFORMAT, "overlap",
            "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
            "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
            0, 12);
    REFUSED(MD_EFORMAT, "belong to no tensor",
            "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 0, 8);
    REFUSED(MD_EFORMAT, "cover 8 bytes", ok, 0, 16);
    { /* 57 header bytes: data at file offset 65 */
        const char *h = "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}} ";
        REFUSED(MD_EFORMAT, "not aligned", h, strlen(h), 4);
    }
    /* duplicate names, unknown keys, bad metadata */
    REFUSED(MD_EFORMAT, "not valid JSON",
            "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
            "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
            0, 8);
    REFUSED(MD_EFORMAT, "unknown key",
            "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"x\":1}}", 0, 8);
    REFUSED(MD_EFORMAT, "__metadata__", "{\"__metadata__\":{\"k\":1}}", 0, 0);
    REFUSED(MD_EFORMAT, "two integers",
            "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", 0, 8);
}

static void write_file(const char *path, const void *p, size_t n) {
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    assert_int_equal(fwrite(p, 1, n, fp), n);
    fclose(fp);
}

static void write_shard(const char *path, const char *hdr, size_t dlen) {
    static uint8_t zeros[64];
    size_t len;
    uint8_t *p = image(hdr, 0, zeros, dlen, &len);
    write_file(path, p, len);
    free(p);
}

static void sharded_directory(void **state) {
    (void)state;
    char dir[] = "/tmp/medley-st-XXXXXX", p[256];
    assert_non_null(mkdtemp(dir));
    md_err e = {0};
    st_file *f = NULL;
    assert_int_equal(st_open_dir(dir, &f, &e), MD_ENOTFOUND);
    snprintf(p, sizeof p, "%s/s1.safetensors", dir);
    write_shard(p, "{\"x\":{\"dtype\":\"F16\",\"shape\":[4],\"data_offsets\":[0,8]}}", 8);
    snprintf(p, sizeof p, "%s/s2.safetensors", dir);
    write_shard(p, "{\"y\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8);
    const char *ix =
        "{\"metadata\":{},\"weight_map\":{\"x\":\"s1.safetensors\",\"y\":\"s2.safetensors\"}}";
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    write_file(p, ix, strlen(ix));
    assert_int_equal(st_open_dir(dir, &f, &e), 0);
    assert_int_equal(st_n_shards(f), 2);
    assert_int_equal(st_n_tensors(f), 2);
    assert_int_equal(st_find(f, "y")->shard, 1);
    st_close(f);
    /* a map naming the wrong shard, a path outside the directory, a name in two shards */
    const char *bad[][2] = {
        {"{\"weight_map\":{\"x\":\"s2.safetensors\",\"y\":\"s2.safetensors\"}}", "lacks it"},
        {"{\"weight_map\":{\"x\":\"../s1.safetensors\"}}", "not a file name"},
        {"{\"weight_map\":{\"x\":\"s4.safetensors\"}}", "weight_map lists 1"},
        {"{\"weight_map\":{\"x\":\"s1.safetensors\",\"y\":\"s3.safetensors\"}}", "s3.safetensors"},
        {"[]", "weight_map"},
    };
    snprintf(p, sizeof p, "%s/s3.safetensors", dir);
    write_shard(p, "{\"x\":{\"dtype\":\"F16\",\"shape\":[4],\"data_offsets\":[0,8]}}", 8);
    snprintf(p, sizeof p, "%s/s4.safetensors", dir);
    write_shard(p,
                "{\"x\":{\"dtype\":\"F16\",\"shape\":[4],\"data_offsets\":[0,8]},"
                "\"z\":{\"dtype\":\"F16\",\"shape\":[4],\"data_offsets\":[8,16]}}",
                16);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
        write_file(p, bad[i][0], strlen(bad[i][0]));
        md_err_clear(&e);
        assert_int_not_equal(st_open_dir(dir, &f, &e), 0);
        assert_null(f);
        if (!strstr(e.msg, bad[i][1]))
            fail_msg("case %zu: \"%s\" lacks \"%s\"", i, e.msg, bad[i][1]);
    }
    const char *names[] = {"s1.safetensors", "s2.safetensors", "s3.safetensors", "s4.safetensors",
                           "model.safetensors.index.json"};
    for (size_t i = 0; i < 5; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        unlink(p);
    }
    rmdir(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(good_file_reads_back),
        cmocka_unit_test(hostile_files_refused),
        cmocka_unit_test(sharded_directory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
