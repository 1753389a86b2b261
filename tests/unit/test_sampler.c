/* test_sampler.c — the sampler's filters, penalties, seeded determinism and the statistics of
 * its draws, on hand-made logits. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "engine/sampler.h"

#define V 8

static md_sampling base(void) {
    md_sampling s;
    md_sampling_default(&s);
    return s;
}

/* logits whose softmax is probs (any positive probs summing to 1) */
static void from_probs(const double *probs, float *l) {
    for (int i = 0; i < V; i++)
        l[i] = probs[i] > 0 ? (float)log(probs[i]) : -1e30f;
}

static int32_t draw(const md_sampling *s, const float *logits, smp_rng *r, smp_scratch *sc) {
    float l[V];
    memcpy(l, logits, sizeof l);
    return smp_sample(s, l, V, NULL, 0, NULL, 0, r, sc, NULL);
}

static void test_greedy_takes_argmax_lowest_index_on_ties(void **state) {
    smp_scratch *sc = smp_scratch_new(V);
    smp_rng r;
    smp_rng_seed(&r, 1);
    md_sampling s = base();
    float l[V] = {0, 3, 1, 3, -2, 0, 0, 0};
    assert_int_equal(draw(&s, l, &r, sc), 1);
    smp_scratch_free(sc);
}

static void test_same_seed_same_draws_other_seed_other_draws(void **state) {
    smp_scratch *sc = smp_scratch_new(V);
    double p[V] = {.2, .2, .1, .1, .1, .1, .1, .1};
    float l[V];
    from_probs(p, l);
    md_sampling s = base();
    s.temperature = 1;
    int32_t a[64], b[64], c[64];
    smp_rng r1, r2, r3;
    smp_rng_seed(&r1, 42);
    smp_rng_seed(&r2, 42);
    smp_rng_seed(&r3, 43);
    for (int i = 0; i < 64; i++) {
        a[i] = draw(&s, l, &r1, sc);
        b[i] = draw(&s, l, &r2, sc);
        c[i] = draw(&s, l, &r3, sc);
    }
    assert_memory_equal(a, b, sizeof a);
    assert_memory_not_equal(a, c, sizeof a);
    smp_scratch_free(sc);
}

/* Counts of n draws; the frequencies must match the expected distribution. */
static void freq(const md_sampling *s, const float *l, int n, double *f) {
    smp_scratch *sc = smp_scratch_new(V);
    smp_rng r;
    smp_rng_seed(&r, 7);
    memset(f, 0, V * sizeof *f);
    for (int i = 0; i < n; i++)
        f[draw(s, l, &r, sc)] += 1.0 / n;
    smp_scratch_free(sc);
}

static void test_temperature_one_draws_the_softmax(void **state) {
    double p[V] = {.4, .25, .15, .1, .05, .03, .015, .005}, f[V];
    float l[V];
    from_probs(p, l);
    md_sampling s = base();
    s.temperature = 1;
    freq(&s, l, 40000, f);
    for (int i = 0; i < V; i++)
        assert_true(fabs(f[i] - p[i]) < 0.01);
}

static void test_temperature_sharpens(void **state) {
    double p[V] = {.4, .25, .15, .1, .05, .03, .015, .005}, f[V];
    float l[V];
    from_probs(p, l);
    md_sampling s = base();
    s.temperature = 0.5f; /* p^2 renormalised */
    freq(&s, l, 40000, f);
    double z = 0;
    for (int i = 0; i < V; i++)
        z += p[i] * p[i];
    for (int i = 0; i < V; i++)
        assert_true(fabs(f[i] - p[i] * p[i] / z) < 0.01);
}

static void test_top_k_keeps_k_most_likely(void **state) {
    double p[V] = {.1, .3, .05, .2, .15, .1, .05, .05}, f[V];
    float l[V];
    from_probs(p, l);
    md_sampling s = base();
    s.temperature = 1;
    s.top_k = 3; /* tokens 1, 3, 4 renormalised over .65 */
    freq(&s, l, 30000, f);
    assert_true(fabs(f[1] - .3 / .65) < 0.015);
    assert_true(fabs(f[3] - .2 / .65) < 0.015);
    assert_true(fabs(f[4] - .15 / .65) < 0.015);
    assert_true(f[0] + f[2] + f[5] + f[6] + f[7] == 0);
    s.top_k = 1;
    freq(&s, l, 1000, f);
    assert_true(fabs(f[1] - 1.0) < 1e-9);
}

static void test_top_p_keeps_the_nucleus(void **state) {
    double p[V] = {.5, .3, .15, .05, 0, 0, 0, 0}, f[V];
    float l[V];
    from_probs(p, l);
    md_sampling s = base();
    s.temperature = 1;
    s.top_p = 0.7f; /* {0, 1}: .5 < .7 <= .8 */
    freq(&s, l, 30000, f);
    assert_true(fabs(f[0] - .5 / .8) < 0.015);
    assert_true(f[2] + f[3] == 0);
    s.top_p = 0.85f; /* {0, 1, 2} */
    freq(&s, l, 30000, f);
    assert_true(f[2] > 0.1 && f[3] == 0);
}

static void test_min_p_drops_tokens_below_fraction_of_best(void **state) {
    double p[V] = {.4, .25, .15, .1, .05, .03, .015, .005}, f[V];
    float l[V];
    from_probs(p, l);
    md_sampling s = base();
    s.temperature = 1;
    s.min_p = 0.3f; /* keep p >= .12: tokens 0, 1, 2 */
    freq(&s, l, 30000, f);
    assert_true(fabs(f[0] - .4 / .8) < 0.015);
    assert_true(f[2] > 0.1);
    assert_true(f[3] + f[4] + f[5] + f[6] + f[7] == 0);
}

/* Wide vocabulary: the candidate threshold must still find the exact nucleus when the mass
 * is spread thin over thousands of tokens. */
static void test_top_p_on_flat_large_vocabulary(void **state) {
    enum { N = 20000 };
    static float l[N];
    for (int i = 0; i < N; i++)
        l[i] = 0;
    l[5] = 2; /* p5 = e^2 / (e^2 + N - 1) ~ 0.00037 */
    smp_scratch *sc = smp_scratch_new(N);
    smp_rng r;
    smp_rng_seed(&r, 3);
    md_sampling s = base();
    s.temperature = 1;
    s.top_p = 0.5f;
    int seen_other = 0;
    for (int i = 0; i < 200; i++) {
        static float w[N];
        memcpy(w, l, sizeof w);
        int32_t t = smp_sample(&s, w, N, NULL, 0, NULL, 0, &r, sc, NULL);
        assert_true(t >= 0 && t < N);
        seen_other += t != 5;
    }
    assert_true(seen_other > 150);
    smp_scratch_free(sc);
}

static void test_repetition_penalty_divides_positive_multiplies_negative(void **state) {
    smp_scratch *sc = smp_scratch_new(V);
    smp_rng r;
    smp_rng_seed(&r, 1);
    md_sampling s = base();
    s.repetition_penalty = 2;
    float l[V] = {2, 1.9f, -1, -1, -1, -1, -1, -1};
    int32_t prompt[3] = {0, 0, 2};
    assert_int_equal(smp_sample(&s, l, V, prompt, 3, NULL, 0, &r, sc, NULL), 1);
    assert_true(l[0] == 1.0f);  /* divided once, not once per occurrence */
    assert_true(l[2] == -2.0f); /* negative: multiplied */
    assert_true(l[3] == -1.0f);
    /* the scratch counters are reset: a call without history leaves logits alone */
    float m[V] = {2, 1.9f, 0, 0, 0, 0, 0, 0};
    assert_int_equal(smp_sample(&s, m, V, NULL, 0, NULL, 0, &r, sc, NULL), 0);
    smp_scratch_free(sc);
}

static void test_presence_and_frequency_penalties_on_output_only(void **state) {
    smp_scratch *sc = smp_scratch_new(V);
    smp_rng r;
    smp_rng_seed(&r, 1);
    md_sampling s = base();
    s.presence_penalty = 0.5f;
    s.frequency_penalty = 0.25f;
    float l[V] = {3, 2, 1, 0, 0, 0, 0, 0};
    int32_t prompt[1] = {1}, out[3] = {0, 0, 2};
    smp_sample(&s, l, V, prompt, 1, out, 3, &r, sc, NULL);
    assert_true(fabsf(l[0] - (3 - 0.5f - 0.5f)) < 1e-6f);
    assert_true(l[1] == 2.0f); /* prompt tokens are not penalised */
    assert_true(fabsf(l[2] - (1 - 0.5f - 0.25f)) < 1e-6f);
    smp_scratch_free(sc);
}

/* The entries the device's sample op gets: distinct tokens in first-occurrence order with
 * their output counts, prompt tokens only under the repetition penalty, none without
 * penalties, out-of-vocabulary ids skipped; the scratch marks are cleared after. */
static void test_penalty_entries(void **state) {
    smp_scratch *sc = smp_scratch_new(V);
    md_sampling s = base();
    md_sample_pen list[V];
    int32_t prompt[4] = {5, 1, 5, 99}, out[5] = {1, 3, 1, 1, -2};
    assert_int_equal(smp_pen_list(&s, prompt, 4, out, 5, V, sc, list), 0);
    s.frequency_penalty = 0.5f; /* output tokens only */
    assert_int_equal(smp_pen_list(&s, prompt, 4, out, 5, V, sc, list), 2);
    assert_int_equal(list[0].token, 1);
    assert_int_equal(list[0].n_out, 3);
    assert_int_equal(list[1].token, 3);
    assert_int_equal(list[1].n_out, 1);
    s.repetition_penalty = 1.2f; /* the prompt's tokens too, with no output count */
    assert_int_equal(smp_pen_list(&s, prompt, 4, out, 5, V, sc, list), 3);
    assert_int_equal(list[0].token, 5);
    assert_int_equal(list[0].n_out, 0);
    assert_int_equal(list[1].token, 1);
    assert_int_equal(list[1].n_out, 3);
    assert_int_equal(list[2].token, 3);
    assert_int_equal(list[2].n_out, 1);
    /* the marks are clear: a second list of other tokens is not disturbed by the first */
    int32_t p2[1] = {2};
    assert_int_equal(smp_pen_list(&s, p2, 1, NULL, 0, V, sc, list), 1);
    assert_int_equal(list[0].token, 2);
    assert_int_equal(list[0].n_out, 0);
    /* the row sampler over them gives smp_sample's penalised logits, bit for bit */
    float a[V] = {3, 2, 1, -1, 0.5f, 4, 0, 0}, b[V];
    memcpy(b, a, sizeof a);
    md_sample_params p = smp_params(&s, 0);
    p.pen_n = smp_pen_list(&s, prompt, 4, out, 5, V, sc, list);
    smp_sample_row(&p, list, a, V, sc, NULL);
    smp_rng r;
    smp_rng_seed(&r, 1);
    smp_sample(&s, b, V, prompt, 4, out, 5, &r, sc, NULL);
    assert_memory_equal(a, b, sizeof a);
    assert_true(a[5] == 4.0f / 1.2f); /* the prompt-only token: repetition alone */
    smp_scratch_free(sc);
}

/* Top logprobs: most likely first, the lower id first among equals, -inf never listed (so
 * fewer than asked when fewer are finite), log-softmax of the row as given. */
static void test_top_logprobs(void **state) {
    float l[V] = {1, 3, -INFINITY, 3, 0.5f, -INFINITY, 2, -INFINITY};
    int32_t t[MD_TOP_LOGPROBS];
    float lp[MD_TOP_LOGPROBS];
    assert_int_equal(smp_top_logprobs(l, V, 3, t, lp), 3);
    assert_int_equal(t[0], 1);
    assert_int_equal(t[1], 3); /* the tie: lower id first */
    assert_int_equal(t[2], 6);
    double z = exp(1.0) + 2 * exp(3.0) + exp(0.5) + exp(2.0);
    assert_true(fabs(lp[0] - (3 - log(z))) < 1e-6);
    assert_true(lp[0] == lp[1]);
    assert_true(fabs(lp[2] - (2 - log(z))) < 1e-6);
    assert_int_equal(smp_top_logprobs(l, V, MD_TOP_LOGPROBS, t, lp), 5); /* 5 finite */
    int32_t want[5] = {1, 3, 6, 0, 4};
    assert_memory_equal(t, want, sizeof want);
    assert_int_equal(smp_top_logprobs(l, V, 0, t, lp), 0);
}

static void test_logprob_is_raw_log_softmax(void **state) {
    smp_scratch *sc = smp_scratch_new(V);
    smp_rng r;
    smp_rng_seed(&r, 1);
    md_sampling s = base();
    s.logprobs = 1;
    s.repetition_penalty = 3;
    double p[V] = {.4, .25, .15, .1, .05, .03, .015, .005};
    float l[V];
    from_probs(p, l);
    float lp;
    int32_t prompt[1] = {0};
    int32_t t = smp_sample(&s, l, V, prompt, 1, NULL, 0, &r, sc, &lp);
    assert_int_equal(t, 1); /* penalty moved the argmax */
    assert_true(fabs(lp - log(.25)) < 1e-5);
    s.temperature = 0.7f;
    from_probs(p, l);
    t = smp_sample(&s, l, V, NULL, 0, NULL, 0, &r, sc, &lp);
    assert_true(fabs(lp - log(p[t])) < 1e-5);
    smp_scratch_free(sc);
}

static void test_validate_rejects_bad_parameters(void **state) {
    md_err e = {0};
    md_sampling s = base();
    assert_int_equal(smp_validate(&s, &e), 0);
    s.temperature = NAN;
    assert_int_equal(smp_validate(&s, &e), MD_EINVAL);
    assert_non_null(strstr(e.msg, "temperature"));
    s = base();
    s.top_p = 0;
    assert_int_equal(smp_validate(&s, &e), MD_EINVAL);
    s = base();
    s.top_k = -1;
    assert_int_equal(smp_validate(&s, &e), MD_EINVAL);
    s = base();
    s.min_p = 1.5f;
    assert_int_equal(smp_validate(&s, &e), MD_EINVAL);
    s = base();
    s.repetition_penalty = 0;
    assert_int_equal(smp_validate(&s, &e), MD_EINVAL);
    s = base();
    s.frequency_penalty = 3;
    assert_int_equal(smp_validate(&s, &e), MD_EINVAL);
    s = base();
    s.max_tokens = -5;
    assert_int_equal(smp_validate(&s, &e), MD_EINVAL);
}

/* top_p applies to the mass top_k kept (renormalised, as HF / llama.cpp / vLLM and the CUDA
 * sampler do): p = .4 .3 .2 .1, top_k 2 keeps .4 + .3; top_p 0.5 of that (.35) is reached by
 * the first token alone, so every u draws token 0 (of the whole mass, 0.5 would keep two). And
 * the draw walks kept tokens in index order: with top_k 3, u just under .4/.9 is token 0, just
 * over is token 1. */
static void test_top_p_after_top_k_and_index_order_draw(void **state) {
    float l[4] = {logf(0.4f), logf(0.3f), logf(0.2f), logf(0.1f)};
    smp_scratch *sc = smp_scratch_new(4);
    for (double u = 0.0; u < 1.0; u += 0.05)
        assert_int_equal(smp_draw(1.0f, 2, 0.5f, 0.0f, u, l, 4, sc), 0);
    assert_int_equal(smp_draw(1.0f, 2, 1.0f, 0.0f, 0.99, l, 4, sc), 1);
    assert_int_equal(smp_draw(1.0f, 3, 1.0f, 0.0f, 0.4 / 0.9 - 1e-4, l, 4, sc), 0);
    assert_int_equal(smp_draw(1.0f, 3, 1.0f, 0.0f, 0.4 / 0.9 + 1e-4, l, 4, sc), 1);
    assert_int_equal(smp_draw(1.0f, 3, 1.0f, 0.0f, 0.999, l, 4, sc), 2);
    assert_int_equal(smp_draw(0.0f, 3, 1.0f, 0.0f, 0.999, l, 4, sc), 0); /* greedy */
    smp_scratch_free(sc);
    /* top_p alone is of the whole mass, even where the sampler only looks at the likely
     * candidates: .3 .3 .2 and 997 tokens sharing .2 (each below the first candidate
     * threshold): top_p .7 keeps the first three, so u = .99 draws token 2 */
    enum { NV = 1000 };
    static float lv[NV];
    lv[0] = logf(0.3f);
    lv[1] = logf(0.3f);
    lv[2] = logf(0.2f);
    for (int i = 3; i < NV; i++)
        lv[i] = logf(0.2f / (NV - 3));
    sc = smp_scratch_new(NV);
    assert_int_equal(smp_draw(1.0f, 0, 0.7f, 0.0f, 0.99, lv, NV, sc), 2);
    assert_int_equal(smp_draw(1.0f, 0, 0.7f, 0.0f, 0.5, lv, NV, sc), 1);
    smp_scratch_free(sc);
}

/* A mask over a 70-token row (three words, the last partial) allowing only odd tokens >= 33:
 * under every setting (greedy, temperature with each filter, penalties, many seeds) no
 * masked token is ever drawn; greedy picks the best allowed token even when a masked one
 * is far better; the logprob is renormalised over the allowed tokens. */
enum { MV = 70 };
static int allowed(int t) {
    return t >= 33 && (t & 1);
}

static void fill_mask(uint32_t *m) {
    memset(m, 0, MD_MASK_WORDS(MV) * sizeof *m);
    for (int t = 0; t < MV; t++)
        if (allowed(t))
            m[t / 32] |= 1u << (t % 32);
}

static void test_mask_never_draws_a_masked_token(void **state) {
    uint32_t m[MD_MASK_WORDS(MV)];
    fill_mask(m);
    smp_scratch *sc = smp_scratch_new(MV);
    float raw[MV], l[MV];
    for (int t = 0; t < MV; t++)
        raw[t] = (float)((t * 37) % 11) - (allowed(t) ? 4.0f : 0.0f);
    md_sample_pen pen[2] = {{35, 2}, {3, 1}};
    const float temps[] = {0.0f, 0.5f, 1.0f, 3.0f};
    for (int ti = 0; ti < 4; ti++)
        for (int f = 0; f < 4; f++)
            for (int k = 0; k < 400; k++) {
                md_sample_params p = {.temperature = temps[ti],
                                      .top_p = f == 1 ? 0.3f : 1.0f,
                                      .top_k = f == 2   ? 50
                                               : f == 3 ? 3
                                                        : 0,
                                      .min_p = f == 3 ? 0.2f : 0.0f,
                                      .u = (k + 0.5) / 400.0,
                                      .repetition = 1.3f,
                                      .presence = 0.5f,
                                      .frequency = 0.25f,
                                      .pen_n = 2,
                                      .mask = m};
                memcpy(l, raw, sizeof l);
                float lp;
                int32_t t = smp_sample_row(&p, pen, l, MV, sc, &lp);
                assert_true(t >= 0 && t < MV);
                assert_true(allowed(t));
                assert_true(lp <= 0 && isfinite(lp));
            }
    /* u at the very top of [0, 1) over a row where only one allowed token has any mass */
    for (int t = 0; t < MV; t++)
        raw[t] = allowed(t) ? -200.0f : 50.0f;
    raw[67] = 0;
    md_sample_params p = {.temperature = 1, .top_p = 1, .repetition = 1, .u = 0.9999999, .mask = m};
    memcpy(l, raw, sizeof l);
    assert_int_equal(smp_sample_row(&p, NULL, l, MV, sc, NULL), 67);
    smp_scratch_free(sc);
}

static void test_mask_greedy_takes_best_allowed_and_renormalises(void **state) {
    uint32_t m[MD_MASK_WORDS(MV)];
    fill_mask(m);
    smp_scratch *sc = smp_scratch_new(MV);
    float l[MV], raw[MV];
    for (int t = 0; t < MV; t++)
        raw[t] = allowed(t) ? -(float)t / 8 : 10.0f; /* every masked token beats every allowed */
    raw[41] = 2.0f;
    memcpy(l, raw, sizeof l);
    md_sample_params p = {.top_p = 1, .repetition = 1, .mask = m};
    float lp;
    assert_int_equal(smp_sample_row(&p, NULL, l, MV, sc, &lp), 41);
    double z = 0;
    for (int t = 0; t < MV; t++)
        if (allowed(t))
            z += exp((double)raw[t]);
    assert_true(fabs(lp - (2.0 - log(z))) < 1e-5);
    /* the row is left constrained: the top logprobs of it list allowed tokens only */
    int32_t tt[MD_TOP_LOGPROBS];
    float tl[MD_TOP_LOGPROBS];
    int nt = smp_top_logprobs(l, MV, MD_TOP_LOGPROBS, tt, tl);
    assert_int_equal(nt, 19); /* the allowed tokens: 33, 35, .., 69 */
    assert_int_equal(tt[0], 41);
    assert_true(fabs(tl[0] - lp) < 1e-6);
    for (int j = 0; j < nt; j++)
        assert_true(allowed(tt[j]));
    /* the drawn distribution is the softmax over the allowed tokens alone */
    for (int t = 0; t < MV; t++)
        raw[t] = allowed(t) ? 0.0f : 5.0f;
    raw[33] = logf(3.0f); /* p(33) = 3 / (3 + 18) */
    int hits = 0, N = 20000;
    smp_rng r;
    smp_rng_seed(&r, 9);
    for (int i = 0; i < N; i++) {
        memcpy(l, raw, sizeof l);
        p = (md_sample_params){
            .temperature = 1, .top_p = 1, .repetition = 1, .u = smp_rng_uniform(&r), .mask = m};
        hits += smp_sample_row(&p, NULL, l, MV, sc, NULL) == 33;
    }
    assert_true(fabs((double)hits / N - 3.0 / 21.0) < 0.01);
    smp_scratch_free(sc);
}

/* logit_bias is added before everything (greedy follows it, repeated tokens add up, ids
 * outside the row are skipped) and the logprob is of the biased row; -100 all but bans. */
static void test_logit_bias_shifts_logits_and_logprobs(void **state) {
    smp_scratch *sc = smp_scratch_new(V);
    double pr[V] = {.4, .25, .15, .1, .05, .03, .015, .005};
    float l[V], raw[V];
    from_probs(pr, raw);
    md_sample_bias b[4] = {{0, -100.0f}, {2, 1.0f}, {2, 0.5f}, {V + 3, 100.0f}};
    md_sample_params p = {.top_p = 1, .repetition = 1, .bias = b, .n_bias = 4};
    memcpy(l, raw, sizeof l);
    float lp;
    assert_int_equal(smp_sample_row(&p, NULL, l, V, sc, &lp), 2); /* .15 e^1.5 > .25 */
    double z = 0;
    for (int t = 0; t < V; t++)
        z += exp((double)raw[t] + (t == 0 ? -100 : t == 2 ? 1.5 : 0));
    assert_true(fabs(lp - (raw[2] + 1.5 - log(z))) < 1e-5);
    /* with a mask too: bias first, then the mask */
    uint32_t m = 0xffu & ~(1u << 2);
    p.mask = &m;
    memcpy(l, raw, sizeof l);
    assert_int_equal(smp_constrain(&p, l, V), V - 1);
    assert_true(isinf(l[2]) && l[2] < 0);
    assert_true(l[0] == raw[0] - 100.0f);
    smp_scratch_free(sc);
}

static void test_validate_logit_bias(void **state) {
    md_err e = {0};
    md_sampling s = base();
    md_logit_bias lb[2] = {{5, 100.0f}, {7, -100.0f}};
    s.logit_bias = lb;
    s.n_logit_bias = 2;
    assert_int_equal(smp_validate(&s, &e), 0);
    lb[1].bias = -100.5f;
    assert_int_equal(smp_validate(&s, &e), MD_EINVAL);
    assert_non_null(strstr(e.msg, "logit_bias"));
    lb[1].bias = NAN;
    assert_int_equal(smp_validate(&s, &e), MD_EINVAL);
    lb[1] = (md_logit_bias){-1, 0};
    assert_int_equal(smp_validate(&s, &e), MD_EINVAL);
    lb[1] = (md_logit_bias){1, 0};
    s.n_logit_bias = MD_LOGIT_BIAS_MAX + 1;
    assert_int_equal(smp_validate(&s, &e), MD_EINVAL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_takes_argmax_lowest_index_on_ties),
        cmocka_unit_test(test_same_seed_same_draws_other_seed_other_draws),
        cmocka_unit_test(test_temperature_one_draws_the_softmax),
        cmocka_unit_test(test_temperature_sharpens),
        cmocka_unit_test(test_top_k_keeps_k_most_likely),
        cmocka_unit_test(test_top_p_keeps_the_nucleus),
        cmocka_unit_test(test_min_p_drops_tokens_below_fraction_of_best),
        cmocka_unit_test(test_top_p_on_flat_large_vocabulary),
        cmocka_unit_test(test_repetition_penalty_divides_positive_multiplies_negative),
        cmocka_unit_test(test_presence_and_frequency_penalties_on_output_only),
        cmocka_unit_test(test_penalty_entries),
        cmocka_unit_test(test_top_logprobs),
        cmocka_unit_test(test_logprob_is_raw_log_softmax),
        cmocka_unit_test(test_validate_rejects_bad_parameters),
        cmocka_unit_test(test_top_p_after_top_k_and_index_order_draw),
        cmocka_unit_test(test_mask_never_draws_a_masked_token),
        cmocka_unit_test(test_mask_greedy_takes_best_allowed_and_renormalises),
        cmocka_unit_test(test_logit_bias_shifts_logits_and_logprobs),
        cmocka_unit_test(test_validate_logit_bias),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
