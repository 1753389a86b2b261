/* test_safetensors_fuzz.c — feeds mutated safetensors files to the reader (the GGUF
 * fuzzer's method, tests/fuzz/test_gguf_fuzz.c): bit flips and byte changes in the header,
 * digits rewritten (offsets, shapes), lying header lengths, truncation at every byte of the
 * header, inserted and deleted bytes, and the JSON structure shuffled (keys dropped,
 * duplicated, swapped). Every file is an exact-size heap copy so ASan sees any read past the
 * end. A file must be refused with MD_EFORMAT/MD_EUNSUPP and a non-empty message naming it,
 * or be accepted and then have every tensor's every byte read and dequantized.
 *
 * MEDLEY_FUZZ_ITERS scales the random rounds (default 4000 per family); the seed is fixed so
 * a failure reproduces; MEDLEY_FUZZ_SEED overrides it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine/weights/quant.h"
#include "engine/weights/safetensors.h"
#include "fuzz/fuzz_util.h"

static long n_files, n_accepted;

/* Open a heap copy of exactly len bytes; check the contract either way. */
static void feed(const uint8_t *buf, size_t len) {
    uint8_t *p = fuzz_copy(buf, len);
    assert_non_null(p);
    st_file *f = NULL;
    md_err e = {0};
    int rc = st_open_mem(p, len, "fuzz.safetensors", &f, &e);
    n_files++;
    if (rc) {
        assert_null(f);
        if (rc != MD_EFORMAT && rc != MD_EUNSUPP && rc != MD_ENOMEM)
            fail_msg("unexpected code %d: %s", rc, e.msg);
        assert_non_null(strstr(e.msg, "fuzz.safetensors"));
    } else {
        n_accepted++;
        for (int64_t i = 0; i < st_n_tensors(f); i++) {
            const st_tensor *t = st_tensor_at(f, i);
            assert_ptr_equal(st_find(f, t->name), t);
            fuzz_touch(t->data, t->n_bytes);
            if (t->n_elements && t->n_elements <= 4096) {
                float y[4096];
                assert_int_equal(md_dequantize(t->type, t->data, y, t->n_elements, &e), 0);
            }
        }
        st_close(f);
    }
    free(p);
}

/* The seed file: three tensors of the three dtypes, metadata, 8-byte padded header. */
static uint8_t seed[1024];
static size_t seed_len, seed_hlen;

static void make_seed(void) {
    const char *h =
        "{\"__metadata__\":{\"format\":\"pt\"},"
        "\"w\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]},"
        "\"h\":{\"dtype\":\"F16\",\"shape\":[4],\"data_offsets\":[16,24]},"
        "\"model.layers.0.b\":{\"dtype\":\"BF16\",\"shape\":[1,4],\"data_offsets\":[24,32]}}";
    size_t hl = strlen(h), pad = (8 - hl % 8) % 8;
    seed_hlen = hl + pad;
    uint64_t n = seed_hlen;
    memcpy(seed, &n, 8);
    memcpy(seed + 8, h, hl);
    memset(seed + 8 + hl, ' ', pad);
    for (int i = 0; i < 32; i++)
        seed[8 + seed_hlen + i] = (uint8_t)(i * 37 + 1);
    seed_len = 8 + seed_hlen + 32;
}

static void seed_accepted(void **state) {
    (void)state;
    make_seed();
    long before = n_accepted;
    feed(seed, seed_len);
    assert_int_equal(n_accepted, before + 1);
}

static void truncations(void **state) {
    (void)state;
    make_seed();
    for (size_t n = 0; n < seed_len; n++)
        feed(seed, n);
}

static void byte_mutations(void **state) {
    (void)state;
    make_seed();
    uint8_t b[2048];
    for (long it = 0; it < fuzz_iters() * 4; it++) {
        memcpy(b, seed, seed_len);
        size_t len = seed_len;
        int k = 1 + (int)fuzz_below(4);
        for (int j = 0; j < k; j++) {
            size_t at = fuzz_below(8 + seed_hlen);
            switch (fuzz_below(6)) {
            case 0: b[at] ^= (uint8_t)(1u << fuzz_below(8)); break;
            case 1: b[at] = (uint8_t)fuzz_rnd(); break;
            case 2: /* a digit rewritten: offsets and shapes lie */
                if (b[at] >= '0' && b[at] <= '9')
                    b[at] = (uint8_t)('0' + fuzz_below(10));
                break;
            case 3: { /* the length prefix lies */
                uint64_t v = fuzz_below(3) ? seed_hlen + fuzz_below(64) - 32 : fuzz_rnd();
                memcpy(b, &v, 8);
                break;
            }
            case 4: /* insert a byte */
                if (len < sizeof b - 1) {
                    memmove(b + at + 1, b + at, len - at);
                    b[at] = "{}[],:\"0 9-e."[fuzz_below(13)];
                    len++;
                }
                break;
            default: /* delete a byte */
                if (len > 1) {
                    memmove(b + at, b + at + 1, len - at - 1);
                    len--;
                }
            }
        }
        feed(b, len);
    }
}

/* Well-formed JSON with hostile values: random dtypes, shapes and offsets. */
static void structured(void **state) {
    (void)state;
    static const char *dtypes[] = {"F32", "F16", "BF16", "F64", "I8", "", "BOOL"};
    uint8_t b[4096];
    for (long it = 0; it < fuzz_iters(); it++) {
        char h[2048];
        int n = 0, nt = (int)fuzz_below(4);
        n += snprintf(h + n, sizeof h - n, "{");
        for (int t = 0; t < nt; t++) {
            long long o0 = (long long)fuzz_below(40) - 4, o1 = (long long)fuzz_below(48) - 4;
            n += snprintf(
                h + n, sizeof h - n,
                "%s\"t%d\":{\"dtype\":\"%s\",\"shape\":[%lld,%lld],\"data_offsets\":[%lld,%lld]}",
                t ? "," : "", (int)fuzz_below(3), dtypes[fuzz_below(7)],
                (long long)fuzz_below(5) - (fuzz_below(8) == 0), (long long)fuzz_below(5), o0, o1);
        }
        n += snprintf(h + n, sizeof h - n, "}");
        while (n % 8)
            h[n++] = ' ';
        size_t data = fuzz_below(48);
        uint64_t hl = (uint64_t)n;
        memcpy(b, &hl, 8);
        memcpy(b + 8, h, (size_t)n);
        memset(b + 8 + n, 0x3c, data);
        feed(b, 8 + (size_t)n + data);
    }
}

int main(void) {
    fuzz_seed(0x5afe7e25ULL);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(seed_accepted),
        cmocka_unit_test(truncations),
        cmocka_unit_test(byte_mutations),
        cmocka_unit_test(structured),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    printf("safetensors fuzz: %ld files, %ld accepted\n", n_files, n_accepted);
    return rc;
}
