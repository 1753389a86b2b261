/* test_dtype.c — common/dtype.h: the type table (names, block sizes, which types medley
 * computes with), half and bfloat16 conversion against their definitions, and Q4_K's scale
 * unpacking against llama.cpp's packing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <string.h>

#include "common/dtype.h"

/* Every half is the value its definition gives: (-1)^s * 2^(e-15) * (1 + m/1024), subnormals
 * 2^-14 * m/1024, e = 31 inf or NaN; bit for bit, zero signs included. */
static void fp16_to_fp32_is_exact_for_every_half(void **st) {
    for (uint32_t h = 0; h < 65536; h++) {
        int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
        float got = md_fp16_to_fp32((uint16_t)h);
        if (e == 31 && m) {
            assert_true(isnan(got));
            continue;
        }
        double v = e == 31 ? INFINITY
                   : e     ? ldexp(1.0 + m / 1024.0, e - 15)
                           : ldexp(m / 1024.0, -14);
        float want = (float)(s ? -v : v);
        uint32_t gb, wb;
        memcpy(&gb, &got, 4);
        memcpy(&wb, &want, 4);
        assert_int_equal(gb, wb);
    }
}

static void fp16_round_trips_every_half(void **st) {
    for (uint32_t h = 0; h < 65536; h++) {
        float f = md_fp16_to_fp32((uint16_t)h);
        if (isnan(f))
            assert_true(isnan(md_fp16_to_fp32(md_fp32_to_fp16(f))));
        else
            assert_int_equal(md_fp32_to_fp16(f), h);
    }
    assert_true(md_fp16_to_fp32(0x3c00) == 1.0f);
    assert_true(md_fp16_to_fp32(0xc000) == -2.0f);
    assert_true(md_fp16_to_fp32(0x0001) == 5.9604644775390625e-8f);
    assert_true(md_fp16_to_fp32(0x03ff) == 1023 * 5.9604644775390625e-8f); /* largest subnormal */
    assert_true(md_fp16_to_fp32(0x0400) == 6.103515625e-5f);               /* smallest normal */
    assert_true(md_fp16_to_fp32(0x7bff) == 65504.0f);
    assert_true(md_fp16_to_fp32(0x7c00) == INFINITY);
    assert_true(md_fp16_to_fp32(0xfc00) == -INFINITY);
    assert_true(isnan(md_fp16_to_fp32(0x7e00)));
    assert_true(signbit(md_fp16_to_fp32(0x8000)) && md_fp16_to_fp32(0x8000) == 0.0f);
    assert_true(md_fp16_to_fp32(0x8001) == -5.9604644775390625e-8f);
    assert_int_equal(md_fp32_to_fp16(65520.0f), 0x7c00);           /* rounds to inf */
    assert_int_equal(md_fp32_to_fp16(65519.0f), 0x7bff);           /* max half */
    assert_int_equal(md_fp32_to_fp16(1.0f + 1.0f / 2048), 0x3c00); /* tie to even */
    assert_int_equal(md_fp32_to_fp16(1.0f + 3.0f / 2048), 0x3c02);
    assert_int_equal(md_fp32_to_fp16(2.9802322387695312e-8f), 0x0000); /* half of min: even */
    assert_int_equal(md_fp32_to_fp16(1e-10f), 0);
}

static void bf16_rounds_to_nearest_even(void **st) {
    assert_true(md_bf16_to_fp32(0x3f80) == 1.0f);
    assert_int_equal(md_fp32_to_bf16(1.0f), 0x3f80);
    float x;
    uint32_t bits = 0x3f808000; /* exactly half way between 0x3f80 and 0x3f81 */
    memcpy(&x, &bits, 4);
    assert_int_equal(md_fp32_to_bf16(x), 0x3f80);
    bits = 0x3f818000;
    memcpy(&x, &bits, 4);
    assert_int_equal(md_fp32_to_bf16(x), 0x3f82);
    bits = 0x3f808001;
    memcpy(&x, &bits, 4);
    assert_int_equal(md_fp32_to_bf16(x), 0x3f81);
    assert_true(isnan(md_bf16_to_fp32(md_fp32_to_bf16(NAN))));
}

static void type_table_sizes(void **st) {
    assert_string_equal(md_type_name(MD_TYPE_Q4_K), "Q4_K");
    assert_int_equal(md_type_block(MD_TYPE_Q6_K), 256);
    assert_int_equal(md_type_block_bytes(MD_TYPE_Q6_K), 210);
    assert_int_equal(md_type_block_bytes(MD_TYPE_Q4_K), 144);
    assert_int_equal(md_type_block_bytes(MD_TYPE_Q4_1), 20);
    assert_int_equal(md_type_row_bytes(MD_TYPE_Q8_0, 576), 18 * 34);
    assert_int_equal(md_type_row_bytes(MD_TYPE_Q8_0, 577), 0);
    assert_null(md_type_name(4));
    assert_int_equal(md_type_block(-1), 0);
    assert_int_equal(md_type_block_bytes(1000), 0);
    assert_int_equal(md_type_row_bytes(99, 64), 0);
    assert_int_equal(md_type_row_bytes(MD_TYPE_Q6_K, 512), 420);
    assert_int_equal(md_type_row_bytes(MD_TYPE_Q5_0, 64), 44); /* sized, though not computed */
    assert_int_equal(md_type_row_bytes(MD_TYPE_F32, -4), 0);
}

/* Every type named is sized; the eight medley computes with, and only they, are supported. */
static void supported_types_are_the_eight_computed_ones(void **st) {
    const int computed[] = {MD_TYPE_F32,  MD_TYPE_F16,  MD_TYPE_BF16, MD_TYPE_Q4_0,
                            MD_TYPE_Q4_1, MD_TYPE_Q8_0, MD_TYPE_Q4_K, MD_TYPE_Q6_K};
    int n_supported = 0;
    for (int t = -2; t < 64; t++) {
        int want = 0;
        for (size_t i = 0; i < sizeof computed / sizeof computed[0]; i++)
            want |= computed[i] == t;
        assert_int_equal(md_type_supported(t), want);
        n_supported += want;
        if (md_type_name(t)) {
            assert_true(md_type_block(t) > 0);
            assert_true(md_type_block_bytes(t) > 0);
        } else {
            assert_int_equal(md_type_block(t), 0);
            assert_int_equal(md_type_block_bytes(t), 0);
        }
    }
    assert_int_equal(n_supported, 8);
}

/* llama.cpp's quantize_row_q4_K packing of eight 6-bit scales and mins, unpacked back. */
static void q4k_scale_min_unpacks_llama_cpp_packing(void **st) {
    uint32_t r = 12345;
    for (int trial = 0; trial < 1000; trial++) {
        uint8_t ls[8], lm[8], q[12] = {0};
        for (int j = 0; j < 8; j++) {
            r = r * 1664525u + 1013904223u;
            ls[j] = (uint8_t)((r >> 8) & 63);
            lm[j] = (uint8_t)((r >> 16) & 63);
        }
        for (int j = 0; j < 8; j++) {
            if (j < 4) {
                q[j] = ls[j];
                q[j + 4] = lm[j];
            } else {
                q[j + 4] = (uint8_t)((ls[j] & 0xf) | ((lm[j] & 0xf) << 4));
                q[j - 4] |= (uint8_t)((ls[j] >> 4) << 6);
                q[j] |= (uint8_t)((lm[j] >> 4) << 6);
            }
        }
        for (int j = 0; j < 8; j++) {
            int sc, mn;
            md_q4k_scale_min(q, j, &sc, &mn);
            assert_int_equal(sc, ls[j]);
            assert_int_equal(mn, lm[j]);
        }
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(fp16_to_fp32_is_exact_for_every_half),
        cmocka_unit_test(fp16_round_trips_every_half),
        cmocka_unit_test(bf16_rounds_to_nearest_even),
        cmocka_unit_test(type_table_sizes),
        cmocka_unit_test(supported_types_are_the_eight_computed_ones),
        cmocka_unit_test(q4k_scale_min_unpacks_llama_cpp_packing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
