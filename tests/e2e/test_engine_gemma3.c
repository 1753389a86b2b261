/* test_engine_gemma3.c — Gemma 3 270M (`medley models fetch gemma3-270m`; skipped when it is not
 * fetched) against the references of tests/fixtures/engine/make_gemma3_fixtures.py:
 *  - gemma3_llamacpp.json when present (llama.cpp): tokenization of the 312 corpus texts equals
 *    llama.cpp's ids, with and without special-token parsing; greedy continuations of its 20
 *    prompts;
 *  - else gemma3_f64.json (a numpy float64 Gemma 3 forward, not llama.cpp): greedy
 *    continuations only.
 * Greedy: 16 tokens per prompt on the cpu backend (8-bit activations, as llama.cpp); ours may
 * part from the reference only where the reference's own top-2 logit gap is under NEAR_TIE
 * (then the rest of that prompt is not compared: the two texts have diverged).
 * MEDLEY_TEST_DEVICE=cpu-exact runs the reference arithmetic instead (4 minutes on two cores):
 * measured equal to the float64 reference on all 320 steps. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine/weights/gguf.h"
#include "engine/model/model.h"
#include "engine/weights/registry.h"
#include "engine/tokenizer/tokenizer.h"
#include "kernels/backend.h"
#include "e2e/test_engine_util.h"

#define NEAR_TIE 1.0

static const char *gemma_path(void) {
    static char path[4096];
    md_err e = {0};
    if (md_model_resolve("gemma3-270m", 0, path, sizeof path, &e)) {
        printf("skipped: %s\n", e.msg);
        return NULL;
    }
    return path;
}

/* The llama.cpp fixture when it was made, else the float64 one; *which names it. */
static json_t *reference(const char **which) {
    json_t *fx = test_fixture("gemma3_llamacpp.json");
    *which = "llama.cpp";
    if (!fx) {
        fx = test_fixture("gemma3_f64.json");
        *which = "numpy float64 (not llama.cpp)";
    }
    assert_non_null(fx);
    return fx;
}

static void gemma3_tokenizes_as_llama_cpp(void **state) {
    const char *path = gemma_path(), *which;
    if (!path)
        skip();
    json_t *fx = reference(&which);
    json_t *cases = json_object_get(fx, "tokenize");
    if (!cases) {
        printf("skipped: the fixture is %s, which has no tokenizations\n", which);
        json_decref(fx);
        skip();
    }
    gguf_file *gf;
    tok_tokenizer *t;
    md_err e = {0};
    if (gguf_open(path, &gf, &e) || tok_load(gf, &t, &e))
        fail_msg("%s", e.msg);
    int bad = 0;
    size_t n = json_array_size(cases);
    for (size_t i = 0; i < n; i++) {
        json_t *c = json_array_get(cases, i);
        const char *txt = json_string_value(json_object_get(c, "text"));
        char *raw = NULL;
        size_t len;
        if (txt) {
            raw = strdup(txt);
            len = strlen(txt);
        } else {
            const char *hex = json_string_value(json_object_get(c, "hex"));
            len = strlen(hex) / 2;
            raw = malloc(len + 1);
            for (size_t k = 0; k < len; k++)
                sscanf(hex + 2 * k, "%2hhx", (unsigned char *)&raw[k]);
        }
        for (int sp = 0; sp < 2; sp++) {
            int nw, ng;
            int32_t *want = test_ids(json_object_get(c, sp ? "special" : "plain"), &nw), *got;
            if (tok_encode(t, raw, len, 1, sp, &got, &ng, &e))
                fail_msg("case %zu: %s", i, e.msg);
            if (ng != nw || memcmp(got, want, (size_t)ng * sizeof *got)) {
                if (bad++ < 5)
                    print_error("case %zu (special %d): %d ids, %s has %d\n", i, sp, ng, which, nw);
            }
            free(got);
            free(want);
        }
        free(raw);
    }
    printf("gemma3 tokenizer: %zu texts x 2, %d differ from %s\n", n, bad, which);
    assert_int_equal(bad, 0);
    tok_free(t);
    gguf_close(gf);
    json_decref(fx);
}

static void gemma3_greedy_matches_reference_or_parts_at_near_ties(void **state) {
    const char *path = gemma_path(), *which;
    if (!path)
        skip();
    json_t *fx = reference(&which);
    json_t *greedy = json_object_get(fx, "greedy");
    gguf_file *gf;
    md_backend *be;
    md_model *m;
    md_err e = {0};
    const char *dev = getenv("MEDLEY_TEST_DEVICE") ? getenv("MEDLEY_TEST_DEVICE") : "cpu";
    if (gguf_open(path, &gf, &e) || md_backend_open(dev, 2, &be, &e) ||
        md_model_load(gf, be, &m, &e))
        fail_msg("%s", e.msg);
    enum { MAXT = 128, BT = 16 };
    md_reserve res = {.max_tokens = MAXT,
                      .max_seqs = 1,
                      .max_cols = m->hp.n_ff > m->hp.n_head * m->hp.head_dim
                                      ? m->hp.n_ff
                                      : m->hp.n_head * m->hp.head_dim,
                      .max_ctx = MAXT,
                      .max_blocks = MAXT / BT,
                      .n_heads = m->hp.n_head};
    md_kv_bufs kv;
    md_fwd f;
    if (md_kv_bufs_alloc(m, MAXT, &kv, &e) || md_fwd_alloc(m, MAXT, 1, &f, &e) ||
        be->ops->reserve(be, &res, &e))
        fail_msg("%s", e.msg);
    int V = m->hp.n_vocab, same = 0, total = 0, parted = 0, wrong = 0;
    float *lg = malloc((size_t)V * sizeof *lg);
    int32_t table[MAXT / BT];
    for (int i = 0; i < MAXT / BT; i++)
        table[i] = i;
    for (size_t pi = 0; pi < json_array_size(greedy); pi++) {
        json_t *g = json_array_get(greedy, pi);
        int np, ng;
        int32_t *prompt = test_ids(json_object_get(g, "tokens"), &np);
        int32_t *want = test_ids(json_object_get(g, "generated"), &ng);
        json_t *gaps = json_object_get(g, "top2_gap");
        int32_t toks[MAXT], pos[MAXT], seq[MAXT], slot[MAXT];
        assert_true(np + ng <= MAXT);
        memcpy(toks, prompt, (size_t)np * sizeof *toks);
        for (int t = 0; t < MAXT; t++) {
            pos[t] = t;
            seq[t] = 0;
            slot[t] = t;
        }
        int s0 = 0, n = np;
        for (int k = 0; k < ng; k++) {
            int32_t row = n - 1 - s0, seq_len = n;
            md_batch b = {.n_tokens = n - s0,
                          .n_seqs = 1,
                          .tokens = toks + s0,
                          .tok_seq = seq + s0,
                          .tok_pos = pos + s0,
                          .slot = slot + s0,
                          .seq_len = &seq_len,
                          .block_table = table,
                          .max_blocks = MAXT / BT,
                          .block_tokens = BT,
                          .logit_rows = &row,
                          .n_logits = 1};
            if (md_model_forward(m, &f, &kv, &b, lg, &e))
                fail_msg("forward: %s", e.msg);
            int best = 0;
            for (int v = 1; v < V; v++)
                if (lg[v] > lg[best])
                    best = v;
            total++;
            if (best == want[k]) {
                same++;
                toks[n] = best;
                s0 = n++;
                continue;
            }
            double gap = json_real_value(json_array_get(gaps, k));
            printf("prompt %zu step %d: ours %d, %s %d (its top-2 gap %.3f)\n", pi, k, best, which,
                   want[k], gap);
            if (gap < NEAR_TIE)
                parted++;
            else
                wrong++;
            break;
        }
        free(prompt);
        free(want);
    }
    printf("gemma3 greedy on %s vs %s: %d of %d steps equal; %d prompts part at a near tie (gap < %.1f), "
           "%d elsewhere\n",
           dev, which, same, total, parted, NEAR_TIE, wrong);
    assert_int_equal(wrong, 0);
    free(lg);
    md_fwd_free(m, &f);
    md_kv_bufs_free(m, &kv);
    md_model_free(m);
    md_backend_free(be);
    gguf_close(gf);
    json_decref(fx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(gemma3_tokenizes_as_llama_cpp),
        cmocka_unit_test(gemma3_greedy_matches_reference_or_parts_at_near_ties),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
