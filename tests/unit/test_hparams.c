/* test_hparams.c — the hyperparameters md_hparams_read takes from a GGUF file's metadata
 * (engine/model/model_load.c), on small files written here: Gemma 3's sliding-window layers as
 * an integer period or as a per-layer array of booleans (llama.cpp writes the array for models
 * whose layers do not repeat one period), and the arrays it refuses, each naming the key. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "engine/model/model.h"
#include "unit/test_gguf_builder.h"

#define KEY "gemma3.attention.sliding_window_pattern"

/* A tensorless gemma3 file of 4 layers with a 16-token window; pattern(b) writes the value of
 * KEY (its type field first), or nothing when pattern is NULL. */
static gb gemma3_file(void (*pattern)(gb *b)) {
    gb b = {0};
    gb_marks m = {0};
    gb_put(&b, "GGUF", 4);
    gb_u32(&b, 3);
    gb_u64(&b, 0);
    gb_u64(&b, pattern ? 8 : 7);
    gb_key(&b, &m, "general.architecture", GGUF_T_STRING);
    gb_str(&b, "gemma3");
    static const struct {
        const char *key;
        uint32_t v;
    } ints[] = {{"gemma3.block_count", 4},          {"gemma3.embedding_length", 64},
                {"gemma3.attention.head_count", 2}, {"gemma3.feed_forward_length", 128},
                {"gemma3.context_length", 256},     {"gemma3.attention.sliding_window", 16}};
    for (size_t i = 0; i < sizeof ints / sizeof *ints; i++) {
        gb_key(&b, &m, ints[i].key, GGUF_T_UINT32);
        gb_u32(&b, ints[i].v);
    }
    if (pattern) {
        gb_str(&b, KEY);
        pattern(&b);
    }
    gb_pad(&b, GB_ALIGN);
    return b;
}

/* md_hparams_read on the file pattern makes: its status, *hp and e filled. */
static int read_hp(void (*pattern)(gb *b), md_hparams *hp, md_err *e) {
    gb b = gemma3_file(pattern);
    gguf_file *gf = NULL;
    int rc = gguf_open_mem(b.buf, b.len, &gf, e);
    if (rc)
        fail_msg("the test file does not open: %s", e->msg);
    rc = md_hparams_read(gf, hp, e);
    gguf_close(gf);
    free(b.buf);
    return rc;
}

static void bools(gb *b, const uint8_t *v, uint64_t n) {
    gb_u32(b, GGUF_T_ARRAY);
    gb_u32(b, GGUF_T_BOOL);
    gb_u64(b, n);
    gb_put(b, v, (size_t)n);
}
static void slide_1001(gb *b) {
    bools(b, (const uint8_t[]){1, 0, 0, 1}, 4);
}
static void period_2(gb *b) {
    gb_u32(b, GGUF_T_UINT32);
    gb_u32(b, 2);
}
static void three_of_four(gb *b) {
    bools(b, (const uint8_t[]){1, 1, 0}, 3);
}
static void int32s(gb *b) {
    gb_u32(b, GGUF_T_ARRAY);
    gb_u32(b, GGUF_T_INT32);
    gb_u64(b, 4);
    for (int i = 0; i < 4; i++)
        gb_u32(b, 1);
}

static void per_layer_array_says_which_layers_slide(void **st) {
    md_hparams hp;
    md_err e = {0};
    if (read_hp(slide_1001, &hp, &e))
        fail_msg("%s", e.msg);
    assert_int_equal(hp.n_swa, 16);
    assert_true(md_layer_is_swa(&hp, 0));
    assert_false(md_layer_is_swa(&hp, 1));
    assert_false(md_layer_is_swa(&hp, 2));
    assert_true(md_layer_is_swa(&hp, 3));
    assert_false(md_layer_is_swa(&hp, 4)); /* past the model */
}

static void integer_period_and_default_still_hold(void **st) {
    md_hparams hp;
    md_err e = {0};
    assert_int_equal(read_hp(period_2, &hp, &e), 0);
    assert_true(md_layer_is_swa(&hp, 0) && !md_layer_is_swa(&hp, 1) && md_layer_is_swa(&hp, 2) &&
                !md_layer_is_swa(&hp, 3));
    assert_int_equal(read_hp(NULL, &hp, &e), 0); /* Gemma 3's 6: 4 layers all slide */
    for (int l = 0; l < 4; l++)
        assert_true(md_layer_is_swa(&hp, l));
}

static void arrays_that_are_not_one_boolean_per_layer_are_refused(void **st) {
    md_hparams hp;
    md_err e = {0};
    assert_int_equal(read_hp(three_of_four, &hp, &e), MD_EFORMAT);
    assert_non_null(strstr(e.msg, KEY));
    assert_non_null(strstr(e.msg, "3 elements for 4 layers"));
    assert_int_equal(read_hp(int32s, &hp, &e), MD_EFORMAT);
    assert_non_null(strstr(e.msg, "array of int32"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(per_layer_array_says_which_layers_slide),
        cmocka_unit_test(integer_period_and_default_still_hold),
        cmocka_unit_test(arrays_that_are_not_one_boolean_per_layer_are_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
