/* test_gguf_fuzz.c — feeds mutated GGUF files to the reader: bit flips, byte changes,
 * truncation at every byte of the header, lying counts/lengths/offsets/dims/types, inserted
 * and deleted bytes; built from the small in-memory model (test_gguf_builder.h) and from the
 * header of the real SmolLM2 file when it is present. Every file is copied into a buffer of
 * its exact size so ASan sees any read past the end. A file must either be rejected with
 * MD_EFORMAT/MD_EUNSUPP and a non-empty message, or be accepted and then survive every
 * accessor (all getters on all keys, every string of every array, dequantizing every tensor).
 *
 * MEDLEY_FUZZ_ITERS scales the random rounds (default 4000 per mutator family); the seed is
 * fixed so a failure reproduces; MEDLEY_FUZZ_SEED overrides it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/weights/quant.h"
#include "fuzz/fuzz_util.h"
#include "unit/test_gguf_builder.h"

static long n_files, n_accepted;

/* Touch everything an accepted file exposes. */
static void exercise(gguf_file *f) {
    md_err e = {0};
    for (int64_t i = 0; i < gguf_n_kv(f); i++) {
        const char *k = gguf_key_name(f, i);
        assert_non_null(k);
        assert_int_equal(gguf_find_key(f, k), i);
        uint64_t u;
        int64_t s;
        float x;
        int b;
        const char *str;
        size_t len;
        gguf_vtype et;
        uint64_t n;
        const void *data;
        gguf_get_u64(f, k, &u, &e);
        gguf_get_i64(f, k, &s, &e);
        gguf_get_f32(f, k, &x, &e);
        gguf_get_bool(f, k, &b, &e);
        if (gguf_get_str(f, k, &str, &len, &e) == 0)
            fuzz_touch(str, len);
        if (gguf_get_arr(f, k, &et, &n, &e) == 0) {
            if (et == GGUF_T_STRING) {
                for (uint64_t j = 0; j < n && j < 100000; j++) {
                    assert_int_equal(gguf_arr_str(f, k, j, &str, &len, &e), 0);
                    fuzz_touch(str, len);
                }
                assert_int_equal(gguf_arr_str(f, k, n, &str, &len, &e), MD_ERANGE);
            } else if (et != GGUF_T_ARRAY) {
                assert_int_equal(gguf_arr_data(f, k, &data, &e), 0);
                fuzz_touch(data,
                           (size_t)n *
                               (et == GGUF_T_UINT8 || et == GGUF_T_INT8 || et == GGUF_T_BOOL ? 1
                                : et == GGUF_T_UINT16 || et == GGUF_T_INT16                  ? 2
                                : et == GGUF_T_UINT64 || et == GGUF_T_INT64 || et == GGUF_T_FLOAT64
                                    ? 8
                                    : 4));
            }
        }
    }
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        assert_ptr_equal(gguf_find_tensor(f, t->name), t);
        assert_true(t->n_bytes ==
                    md_type_row_bytes(t->type, t->ne[0]) * (size_t)(t->n_elements / t->ne[0]));
        if (t->n_elements > (1 << 20))
            continue;
        float *y = malloc((size_t)t->n_elements * sizeof *y);
        assert_non_null(y);
        int rc = md_dequantize(t->type, t->data, y, t->n_elements, &e);
        assert_true(rc == 0 || rc == MD_EUNSUPP);
        free(y);
    }
}

/* Open buf[0..len) from an exact-size copy; check the outcome. */
static void try_file(const uint8_t *buf, size_t len) {
    uint8_t *copy = fuzz_copy(buf, len);
    assert_non_null(copy);
    gguf_file *f = NULL;
    md_err e = {0};
    int rc = gguf_open_mem(copy, len, &f, &e);
    n_files++;
    if (rc == 0) {
        assert_non_null(f);
        n_accepted++;
        exercise(f);
        gguf_close(f);
    } else {
        assert_null(f);
        if (rc != MD_EFORMAT && rc != MD_EUNSUPP)
            fail_msg("unexpected code %d (%s) for a %zu-byte file: %s", rc, md_strerror(rc), len,
                     e.msg);
        assert_int_equal(e.code, rc);
        if (strlen(e.msg) < 10)
            fail_msg("rejection without a clear message: '%s'", e.msg);
    }
    free(copy);
}

static const uint64_t interesting[] = {0,
                                       1,
                                       2,
                                       3,
                                       7,
                                       31,
                                       32,
                                       255,
                                       4096,
                                       0x7fffffffULL,
                                       0x80000000ULL,
                                       0xffffffffULL,
                                       0x100000000ULL,
                                       0x7fffffffffffffffULL,
                                       0x8000000000000000ULL,
                                       0xffffffffffffffffULL,
                                       0xfffffffffffffff0ULL};
#define N_INTERESTING (sizeof interesting / sizeof interesting[0])

/* Fields of the small model worth lying about, with their widths. */
typedef struct {
    size_t at;
    int width;
} field;

static int collect_fields(const gb_marks *m, const gb *b, field *out) {
    int n = 0;
    out[n++] = (field){4, 4}; /* version */
    out[n++] = (field){m->n_tensors, 8};
    out[n++] = (field){m->n_kv, 8};
    for (int i = 0; i < m->nkv; i++) {
        out[n++] = (field){m->kv[i], 8};      /* key length */
        out[n++] = (field){m->kv_type[i], 4}; /* value type */
        uint32_t t;
        memcpy(&t, b->buf + m->kv_type[i], 4);
        if (t == GGUF_T_STRING || t == GGUF_T_ARRAY)
            out[n++] = (field){m->kv_type[i] + 4, t == GGUF_T_STRING ? 8 : 4};
        if (t == GGUF_T_ARRAY)
            out[n++] = (field){m->kv_type[i] + 8, 8}; /* array count */
        if (t == GGUF_T_UINT32)
            out[n++] = (field){m->kv_type[i] + 4, 4};
    }
    for (int i = 0; i < m->nt; i++) {
        out[n++] = (field){m->tensor[i], 8};
        out[n++] = (field){m->tensor_ndims[i], 4};
        out[n++] = (field){m->tensor_dims[i], 8};
        out[n++] = (field){m->tensor_dims[i] + 8, 8};
        out[n++] = (field){m->tensor_type[i], 4};
        out[n++] = (field){m->tensor_off[i], 8};
    }
    return n;
}

static void put_field(uint8_t *p, int width, uint64_t v) {
    if (width == 4) {
        uint32_t x = (uint32_t)v;
        memcpy(p, &x, 4);
    } else {
        memcpy(p, &v, 8);
    }
}

static void small_model_is_accepted(void **st) {
    gb_marks m;
    gb b = gb_small_model(&m);
    long before = n_accepted;
    try_file(b.buf, b.len);
    assert_int_equal(n_accepted, before + 1);
    free(b.buf);
}

static void truncation_at_every_byte(void **st) {
    gb_marks m;
    gb b = gb_small_model(&m);
    for (size_t len = 0; len < b.len; len++)
        try_file(b.buf, len);
    free(b.buf);
}

static void lying_fields(void **st) {
    gb_marks m;
    gb b = gb_small_model(&m);
    field fs[256];
    int nf = collect_fields(&m, &b, fs);
    uint8_t *c = malloc(b.len);
    for (int i = 0; i < nf; i++) {
        uint64_t orig = 0;
        memcpy(&orig, b.buf + fs[i].at, (size_t)fs[i].width);
        uint64_t vals[N_INTERESTING + 6];
        size_t nv = 0;
        for (size_t k = 0; k < N_INTERESTING; k++)
            vals[nv++] = interesting[k];
        vals[nv++] = orig + 1;
        vals[nv++] = orig - 1;
        vals[nv++] = orig * 2;
        vals[nv++] = b.len;
        vals[nv++] = b.len - fs[i].at;
        vals[nv++] = b.len - m.data;
        for (size_t k = 0; k < nv; k++) {
            memcpy(c, b.buf, b.len);
            put_field(c + fs[i].at, fs[i].width, vals[k]);
            try_file(c, b.len);
        }
    }
    /* two lies at once */
    for (long r = 0; r < fuzz_iters(); r++) {
        memcpy(c, b.buf, b.len);
        for (int j = 0; j < 2; j++) {
            field f = fs[fuzz_below((size_t)nf)];
            uint64_t v =
                fuzz_rnd() & 1 ? interesting[fuzz_below(N_INTERESTING)] : fuzz_below(b.len * 2);
            put_field(c + f.at, f.width, v);
        }
        try_file(c, b.len);
    }
    free(c);
    free(b.buf);
}

static void bit_flips_and_byte_changes(void **st) {
    gb_marks m;
    gb b = gb_small_model(&m);
    uint8_t *c = malloc(b.len);
    for (long r = 0; r < fuzz_iters(); r++) {
        memcpy(c, b.buf, b.len);
        int k = 1 + (int)fuzz_below(4);
        /* mostly in the header, where the structure is */
        size_t span = fuzz_rnd() & 3 ? m.data : b.len;
        for (int j = 0; j < k; j++) {
            fuzz_flip_or_set(c, fuzz_below(span));
        }
        try_file(c, fuzz_rnd() % 8 ? b.len : fuzz_below(b.len + 1));
    }
    free(c);
    free(b.buf);
}

static void inserted_and_deleted_bytes(void **st) {
    gb_marks m;
    gb b = gb_small_model(&m);
    uint8_t *c = malloc(b.len + 64);
    for (long r = 0; r < fuzz_iters() / 2; r++) {
        size_t at = fuzz_below(m.data), n = 1 + fuzz_below(16), len = b.len;
        memcpy(c, b.buf, b.len);
        if (fuzz_rnd() & 1)
            fuzz_insert(c, &len, at, n);
        else
            fuzz_delete(c, &len, at, n);
        try_file(c, len);
    }
    free(c);
    free(b.buf);
}

/* The real model's metadata and tensor directory (1.8 MB: the vocabulary and merges),
 * without tensor data: flips, lies in the first fields and truncations. */
static void real_model_header_mutations(void **st) {
    char path[1024];
    const char *dir = getenv("MEDLEY_MODELS");
    const char *xdg = getenv("XDG_CACHE_HOME");
    if (dir && *dir)
        snprintf(path, sizeof path, "%s/SmolLM2-135M-Instruct.Q4_1.gguf", dir);
    else if (xdg && *xdg)
        snprintf(path, sizeof path, "%s/medley/models/SmolLM2-135M-Instruct.Q4_1.gguf", xdg);
    else
        snprintf(path, sizeof path, "%s/.cache/medley/models/SmolLM2-135M-Instruct.Q4_1.gguf",
                 getenv("HOME") ? getenv("HOME") : "");
    gguf_file *f = NULL;
    md_err e = {0};
    if (gguf_open(path, &f, &e))
        skip();
    size_t hlen = gguf_data_offset(f);
    FILE *fp = fopen(path, "rb");
    assert_non_null(fp);
    uint8_t *h = malloc(hlen), *c = malloc(hlen);
    assert_int_equal(fread(h, 1, hlen, fp), hlen);
    fclose(fp);
    gguf_close(f);
    long rounds = fuzz_iters() / 4, before = n_files;
    for (long r = 0; r < rounds; r++) {
        memcpy(c, h, hlen);
        switch (r % 4) {
        case 0: c[fuzz_below(hlen)] ^= (uint8_t)(1u << fuzz_below(8)); break;
        case 1: { /* a lying u64 somewhere in the first kilobyte (counts and key lengths) */
            uint64_t v = interesting[fuzz_below(N_INTERESTING)];
            memcpy(c + fuzz_below(1024 - 8), &v, 8);
        } break;
        case 2: c[hlen - 1 - fuzz_below(65536)] = (uint8_t)fuzz_rnd(); break; /* tensor directory */
        case 3: break;                                                        /* truncation only */
        }
        try_file(c, r % 4 == 3 ? fuzz_below(hlen) : hlen);
    }
    assert_int_equal(n_files - before, rounds);
    free(h);
    free(c);
}

static int report(void **st) {
    printf("gguf fuzz: %ld files, %ld accepted, %ld rejected with a message\n", n_files, n_accepted,
           n_files - n_accepted);
    return 0;
}

static void total_is_at_least_ten_thousand(void **st) {
    if (fuzz_iters() >= 4000)
        assert_true(n_files >= 10000);
}

int main(void) {
    fuzz_seed(0x6d65646c6579ULL);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(small_model_is_accepted),
        cmocka_unit_test(truncation_at_every_byte),
        cmocka_unit_test(lying_fields),
        cmocka_unit_test(bit_flips_and_byte_changes),
        cmocka_unit_test(inserted_and_deleted_bytes),
        cmocka_unit_test(real_model_header_mutations),
        cmocka_unit_test(total_is_at_least_ten_thousand),
    };
    return cmocka_run_group_tests(tests, NULL, report);
}
