/* test_synth.c — synthetic models (engine/weights/synth.h): parameter counts equal the published
 * ones (Llama-3-8B 8,030,261,248; SmolLM2-135M 134,515,008; Llama-3.2-1B 1,235,814,400), the
 * image is a valid GGUF whose hyperparameters are the shape's, the same name gives the same
 * bytes, BF16 weights have the intended spread (std 0.02), every weight type loads and
 * generates through the engine, and bad names are refused with the known choices. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "common/dtype.h"
#include "engine/engine.h"
#include "engine/weights/gguf.h"
#include "engine/model/model.h"
#include "engine/weights/synth.h"

static void test_parameter_counts_match_published(void **state) {
    static const struct {
        const char *spec;
        int64_t params;
    } want[] = {{"synthetic:llama-3-8b", 8030261248LL},
                {"synthetic:smollm2-135m", 134515008LL},
                {"synthetic:llama-3.2-1b", 1235814400LL}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        size_t bytes;
        int64_t n;
        md_err e = {0};
        assert_int_equal(md_synth_size(want[i].spec, &bytes, &n, &e), 0);
        assert_int_equal(n, want[i].params);
        assert_true(bytes > (size_t)n * 2 && bytes < (size_t)n * 2 + n / 100); /* + F32 norms */
    }
    size_t b16, b8, b4;
    md_err e = {0};
    assert_int_equal(md_synth_size("synthetic:llama-3-8b", &b16, NULL, &e), 0);
    assert_int_equal(md_synth_size("synthetic:llama-3-8b:q8_0", &b8, NULL, &e), 0);
    assert_int_equal(md_synth_size("synthetic:llama-3-8b:q4_0", &b4, NULL, &e), 0);
    /* 16 bits, 8.5 bits, 4.5 bits per matrix weight */
    assert_true(fabs((double)b8 / b16 - 8.5 / 16) < 0.01);
    assert_true(fabs((double)b4 / b16 - 4.5 / 16) < 0.01);
}

static void test_image_is_valid_gguf_with_the_shape(void **state) {
    void *img;
    size_t len;
    md_err e = {0};
    assert_int_equal(md_synth_build("synthetic:smollm2-135m", 1, &img, &len, &e), 0);
    gguf_file *gf;
    if (gguf_open_mem(img, len, &gf, &e))
        fail_msg("%s", e.msg);
    md_hparams hp;
    if (md_hparams_read(gf, &hp, &e))
        fail_msg("%s", e.msg);
    assert_int_equal(hp.n_layer, 30);
    assert_int_equal(hp.n_embd, 576);
    assert_int_equal(hp.n_head, 9);
    assert_int_equal(hp.n_head_kv, 3);
    assert_int_equal(hp.n_ff, 1536);
    assert_int_equal(hp.head_dim, 64);
    /* BF16 weights: mean ~0, std ~0.02 */
    const gguf_tensor *t = gguf_find_tensor(gf, "blk.3.ffn_up.weight");
    assert_non_null(t);
    assert_int_equal(t->type, MD_TYPE_BF16);
    double s = 0, s2 = 0;
    for (int64_t i = 0; i < t->n_elements; i++) {
        double v = md_bf16_to_fp32(((const uint16_t *)t->data)[i]);
        s += v;
        s2 += v * v;
    }
    double mean = s / t->n_elements, sd = sqrt(s2 / t->n_elements - mean * mean);
    printf("blk.3.ffn_up.weight: mean %.6f, std %.5f over %lld values\n", mean, sd,
           (long long)t->n_elements);
    assert_true(fabs(mean) < 1e-3);
    assert_true(fabs(sd - 0.02) < 0.001);
    const gguf_tensor *nrm = gguf_find_tensor(gf, "blk.0.attn_norm.weight");
    assert_non_null(nrm);
    assert_true(((const float *)nrm->data)[5] == 1.0f);
    /* the same name gives the same bytes */
    void *img2;
    size_t len2;
    assert_int_equal(md_synth_build("synthetic:smollm2-135m", 1, &img2, &len2, &e), 0);
    assert_int_equal(len, len2);
    assert_memory_equal(img, img2, len);
    md_synth_free(img2, len2);
    gguf_close(gf);
    md_synth_free(img, len);
}

static void test_every_type_generates(void **state) {
    const char *specs[] = {"synthetic:tiny", "synthetic:tiny:f16", "synthetic:tiny:q8_0",
                           "synthetic:tiny:q4_0"};
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        md_engine_config cfg = {.model_path = specs[i], .n_threads = 2, .max_seqs = 4};
        md_engine *eng;
        md_err e = {0};
        if (md_engine_open(&cfg, &eng, &e))
            fail_msg("%s: %s", specs[i], e.msg);
        int32_t p[5] = {1, 300, 301, 302, 303};
        md_sampling s;
        md_sampling_default(&s);
        s.max_tokens = 8;
        s.ignore_eos = 1;
        uint64_t id;
        assert_int_equal(md_engine_submit(eng, p, 5, &s, &id, &e), 0);
        for (int g = 0; g < 100; g++) {
            md_step_result r;
            if (md_engine_step(eng, &r, &e))
                fail_msg("%s: %s", specs[i], e.msg);
            if (r.n_live == 0)
                break;
        }
        const int32_t *t;
        int n;
        assert_int_equal(md_seq_tokens(eng, id, &t, &n), 0);
        assert_int_equal(n, 8);
        md_engine_close(eng);
    }
}

static void test_bad_names_refused(void **state) {
    void *img;
    size_t len;
    md_err e = {0};
    assert_int_equal(md_synth_build("synthetic:gpt-5", 1, &img, &len, &e), MD_ENOTFOUND);
    assert_non_null(strstr(e.msg, "llama-3-8b"));
    assert_int_equal(md_synth_build("synthetic:tiny:q5_k", 1, &img, &len, &e), MD_ENOTFOUND);
    assert_non_null(strstr(e.msg, "q4_0"));
    assert_int_equal(md_synth_build("tiny", 1, &img, &len, &e), MD_EINVAL);
    assert_int_equal(md_synth_build("synthetic:", 1, &img, &len, &e), MD_ENOTFOUND);
    assert_null(img);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parameter_counts_match_published),
        cmocka_unit_test(test_image_is_valid_gguf_with_the_shape),
        cmocka_unit_test(test_every_type_generates),
        cmocka_unit_test(test_bad_names_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
