/* test_cuda_e2e.c — SmolLM2-135M (Q4_1) on the CUDA backend against the CPU backend, the exact
 * float64 forward pass and llama.cpp, on the engine's fixture prompts (tests/fixtures/engine),
 * in two pairs: the fast backends (cuda:0 and cpu, both rounding activations to int8 before
 * every quantized product, as llama.cpp) and the exact ones (cuda-exact:0 and cpu-exact:
 * weights dequantized, activations never rounded below F32, F32 KV caches).
 *  - logits, at the fixture positions of logits.json. Fast pair: test_engine_logits'
 *    measures and bounds for the CPU backend's fast kernels (over the fixture's top-50 tokens
 *    within F64_TOL of the exact values and LLAMA_TOL of llama.cpp's; each vector minus its
 *    vocabulary mean, what softmax sees, a mean error against the exact values within
 *    CENTERED_RATIO of llama.cpp's own; a different argmax only at a near tie) and every
 *    centered token within CUDA_CPU_TOL of the CPU's. Exact pair: every centered token
 *    within EXACT_CPU_TOL of cpu-exact's, the top-50 within EXACT_F64_TOL of the float64 pass;
 *  - greedy: 20 prompts of greedy.json, prompt in one step (tiled prefill) then one token per
 *    step (split-KV decode, GEMV), 32 tokens. Exact pair: equal on at least 18 of 20 (the
 *    issue's bar), any other parting only at a near tie (EXACT_NEAR_TIE). Fast pair: where
 *    they part, the CPU's choice must have been a near tie (GPU_NEAR_TIE), as
 *    test_engine_batch asks of ours against llama.cpp's; the count is printed, not held to
 *    18. Two implementations that round activations to int8 cannot keep each other's tokens:
 *    an element whose x * 127 / amax lies within a float rounding of a half rounds to the
 *    other integer, one such flip in a block with a large amax moves the product by 1e-3 of
 *    its size, and that difference makes the next quantization flip hundreds (measured on the
 *    emulator, first layer, "The capital of France is": the two backends' rmsnorm outputs
 *    differ in the last bit in 1550 of 2880 elements, two of them sit at x * id =
 *    -30.5000019 and -2.50000024 and round apart, wq's product of that token then differs by
 *    2.5e-4 of rms where the CPU's is within 1e-7 of the exact int8 product, and the
 *    gate/up input flips 64 elements, the down input 947 of 7680), so after a few layers the
 *    pair differs by rounding noise as large as each one's distance from the exact logits.
 *    The CPU backend and llama.cpp agree on 8 of these 20 for 32 tokens (test_engine_batch);
 *    the emulated fast pair on 11.
 * Skips (77) without a CUDA device, the model or the fixtures. MEDLEY_TEST_FILTER picks
 * cases, MEDLEY_E2E_GREEDY_PROMPTS=N runs the first N prompts (test_cuda_e2e_emu, the same
 * test on the CPU emulator, runs by hand). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <string.h>

#include "e2e/test_engine_util.h"
#include "engine/weights/gguf.h"
#include "engine/model/model.h"
#include "gpu/gpu_test_util.h"
#include "kernels/backend.h"

#define F64_TOL 2.0
#define LLAMA_TOL 2.0
#define CENTERED_RATIO 1.5
#define CUDA_CPU_TOL 2.0
#define EXACT_CPU_TOL 0.002 /* cuda-exact vs cpu-exact, every token (emulator: 8e-5) */
#define EXACT_F64_TOL 0.002 /* cuda-exact vs the float64 pass, top-50 (emulator: 5e-5) */
#define EXACT_NEAR_TIE 0.005 /* the exact pair may part only at a tie this close */
#define N_GREEDY_PROMPTS 20
#define N_GREEDY_TOKENS 32
#define MAX_TOKENS 512

typedef struct {
    md_backend *be;
    md_model *m;
    md_kv_bufs kv;
    md_fwd fwd;
} rig;

static gguf_file *GF;
static rig CPU, GPU, CPUX, GPUX; /* cpu, cuda:0, cpu-exact, cuda-exact:0 */

static json_t *fixture(const char *name) {
    char path[4096];
    snprintf(path, sizeof path, "%s/engine/%s", gpu_fixtures_dir(), name);
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    if (!j)
        printf("fixture %s: %s (line %d)\n", path, je.text, je.line);
    return j;
}

static void rig_open(rig *r, const char *device) {
    md_err e = {0};
    if (md_backend_open(device, 2, &r->be, &e) || md_model_load(GF, r->be, &r->m, &e))
        fail_msg("%s: %s", device, e.msg);
    md_reserve res = {.max_tokens = MAX_TOKENS,
                      .max_seqs = 1,
                      .max_cols = r->m->hp.n_ff,
                      .max_ctx = 1024,
                      .max_blocks = 64,
                      .n_heads = r->m->hp.n_head};
    if (md_kv_bufs_alloc(r->m, 1024, &r->kv, &e) ||
        md_fwd_alloc(r->m, MAX_TOKENS, 1, &r->fwd, &e) || r->be->ops->reserve(r->be, &res, &e))
        fail_msg("%s: %s", device, e.msg);
}

static void rig_close(rig *r) {
    md_fwd_free(r->m, &r->fwd);
    md_kv_bufs_free(r->m, &r->kv);
    md_model_free(r->m);
    md_backend_free(r->be);
}

/* Positions [start, start + T) of one sequence in one step; logits of the last token. */
static void step(rig *r, const int32_t *ids, int start, int T, float *logits) {
    static int32_t table[64], pos[MAX_TOKENS], seqi[MAX_TOKENS], slot[MAX_TOKENS];
    for (int i = 0; i < 64; i++)
        table[i] = (i * 13 + 7) % 64; /* scrambled block order */
    for (int t = 0; t < T; t++) {
        pos[t] = start + t;
        seqi[t] = 0;
        slot[t] = table[pos[t] / 16] * 16 + pos[t] % 16;
    }
    int32_t seq_len = start + T, row = T - 1;
    md_batch b = {.n_tokens = T,
                  .n_seqs = 1,
                  .tokens = ids,
                  .tok_seq = seqi,
                  .tok_pos = pos,
                  .slot = slot,
                  .seq_len = &seq_len,
                  .block_table = table,
                  .max_blocks = 64,
                  .block_tokens = 16,
                  .logit_rows = &row,
                  .n_logits = 1};
    md_err e = {0};
    if (md_model_forward(r->m, &r->fwd, &r->kv, &b, logits, &e))
        fail_msg("%s forward: %s", r->be->ops->name, e.msg);
}

static int argmax(const float *l, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (l[i] > l[best])
            best = i;
    return best;
}

static double vocab_mean(const float *l, int V) {
    double m = 0;
    for (int i = 0; i < V; i++)
        m += l[i];
    return m / V;
}

static void test_logits_cuda_vs_cpu_and_llama_cpp(void **state) {
    json_t *fx = fixture("logits.json");
    assert_non_null(fx);
    int V = CPU.m->hp.n_vocab;
    float *lc = malloc((size_t)V * 4), *lg = malloc((size_t)V * 4);
    double worst_cpu = 0, cpu_sq = 0, worst_f64 = 0, worst_ref = 0, cen_sum = 0, llama_cen_sum = 0;
    long n_cpu = 0, n_top = 0;
    json_t *p;
    size_t pi;
    json_array_foreach(json_object_get(fx, "prompts"), pi, p) {
        int n;
        int32_t *ids = test_ids(json_object_get(p, "tokens"), &n);
        json_t *row;
        size_t ri;
        json_array_foreach(json_object_get(p, "rows"), ri, row) {
            int pos = (int)json_integer_value(json_object_get(row, "pos"));
            step(&CPU, ids, 0, pos + 1, lc);
            step(&GPU, ids, 0, pos + 1, lg);
            double mc = vocab_mean(lc, V), mg = vocab_mean(lg, V);
            for (int i = 0; i < V; i++) {
                double d = fabs((lg[i] - mg) - (lc[i] - mc));
                worst_cpu = d > worst_cpu ? d : worst_cpu;
                cpu_sq += d * d;
                n_cpu++;
                if (!(d <= CUDA_CPU_TOL))
                    fail_msg("prompt %zu pos %d token %d: cuda %.4f (mean %.4f), cpu %.4f (mean "
                             "%.4f)",
                             pi, pos, i, lg[i], mg, lc[i], mc);
            }
            double f64_mean = json_real_value(json_object_get(row, "f64_mean"));
            double llama_mean = json_real_value(json_object_get(row, "mean"));
            json_t *ti = json_object_get(row, "top_ids"), *tv = json_object_get(row, "top_values");
            json_t *fv = json_object_get(row, "f64_top_values");
            assert_non_null(fv);
            for (size_t k = 0; k < json_array_size(ti); k++) {
                int id = (int)json_integer_value(json_array_get(ti, k));
                double ref = json_real_value(json_array_get(tv, k));
                double exact = json_real_value(json_array_get(fv, k));
                double dr = fabs(lg[id] - ref), df = fabs(lg[id] - exact);
                worst_ref = dr > worst_ref ? dr : worst_ref;
                worst_f64 = df > worst_f64 ? df : worst_f64;
                if (!(dr <= LLAMA_TOL) || !(df <= F64_TOL))
                    fail_msg("prompt %zu pos %d token %d: cuda %.4f, llama.cpp %.4f, exact %.4f",
                             pi, pos, id, lg[id], ref, exact);
                cen_sum += fabs((lg[id] - mg) - (exact - f64_mean));
                llama_cen_sum += fabs((ref - llama_mean) - (exact - f64_mean));
                n_top++;
            }
            /* a different argmax only at a near tie of ours */
            int am = argmax(lg, V),
                ref_am = (int)json_integer_value(json_object_get(row, "f64_argmax"));
            if (am != ref_am && lg[am] - lg[ref_am] > 2 * F64_TOL)
                fail_msg("prompt %zu pos %d: argmax %d, exact %d (our gap %.3f)", pi, pos, am,
                         ref_am, lg[am] - lg[ref_am]);
        }
        free(ids);
    }
    printf("logits, every token, each vector minus its mean: max |cuda - cpu| = %.4f (bound "
           "%.2f), rms %.4f\n",
           worst_cpu, CUDA_CPU_TOL, sqrt(cpu_sq / (double)n_cpu));
    printf("logits, %ld top-50 values: max |cuda - exact f64| = %.4f (bound %.2f), max |cuda - "
           "llama.cpp| = %.4f (bound %.2f); centered mean |cuda - exact| %.4f, llama.cpp's "
           "%.4f (ratio %.2f, bound %.2f)\n",
           n_top, worst_f64, F64_TOL, worst_ref, LLAMA_TOL, cen_sum / (double)n_top,
           llama_cen_sum / (double)n_top, cen_sum / llama_cen_sum, CENTERED_RATIO);
    assert_true(cen_sum <= CENTERED_RATIO * llama_cen_sum);
    free(lc);
    free(lg);
    json_decref(fx);
}

/* cuda-exact against cpu-exact: every token of every fixture row (centered) within
 * EXACT_CPU_TOL, and the top-50 within EXACT_F64_TOL of the float64 forward pass. */
static void test_logits_cuda_exact_vs_cpu_exact(void **state) {
    json_t *fx = fixture("logits.json");
    assert_non_null(fx);
    int V = CPUX.m->hp.n_vocab;
    float *lc = malloc((size_t)V * 4), *lg = malloc((size_t)V * 4);
    double worst = 0, sq = 0, worst_f64 = 0;
    long cnt = 0;
    json_t *p;
    size_t pi;
    json_array_foreach(json_object_get(fx, "prompts"), pi, p) {
        int n;
        int32_t *ids = test_ids(json_object_get(p, "tokens"), &n);
        json_t *row;
        size_t ri;
        json_array_foreach(json_object_get(p, "rows"), ri, row) {
            int pos = (int)json_integer_value(json_object_get(row, "pos"));
            step(&CPUX, ids, 0, pos + 1, lc);
            step(&GPUX, ids, 0, pos + 1, lg);
            double mc = vocab_mean(lc, V), mg = vocab_mean(lg, V);
            for (int i = 0; i < V; i++) {
                double d = fabs((lg[i] - mg) - (lc[i] - mc));
                worst = d > worst ? d : worst;
                sq += d * d;
                cnt++;
                if (!(d <= EXACT_CPU_TOL))
                    fail_msg("prompt %zu pos %d token %d: cuda-exact %.5f (mean %.5f), "
                             "cpu-exact %.5f (mean %.5f)",
                             pi, pos, i, lg[i], mg, lc[i], mc);
            }
            json_t *ti = json_object_get(row, "top_ids"), *fv = json_object_get(row, "f64_top_values");
            for (size_t k = 0; k < json_array_size(ti); k++) {
                int id = (int)json_integer_value(json_array_get(ti, k));
                double df = fabs(lg[id] - json_real_value(json_array_get(fv, k)));
                worst_f64 = df > worst_f64 ? df : worst_f64;
                if (!(df <= EXACT_F64_TOL))
                    fail_msg("prompt %zu pos %d token %d: cuda-exact %.5f, exact %.5f", pi, pos,
                             id, lg[id], json_real_value(json_array_get(fv, k)));
            }
        }
        free(ids);
    }
    printf("logits, every token, centered: max |cuda-exact - cpu-exact| = %.5f (bound %.3f), rms "
           "%.6f; top-50: max |cuda-exact - exact f64| = %.5f (bound %.3f)\n",
           worst, EXACT_CPU_TOL, sqrt(sq / (double)cnt), worst_f64, EXACT_F64_TOL);
    free(lc);
    free(lg);
    json_decref(fx);
}

/* Greedy continuation of prompt on r: tokens into out, and the top-2 logit gap each token
 * was chosen by into gap. */
static void greedy(rig *r, const int32_t *prompt, int n, int32_t *out, float *gap) {
    int V = r->m->hp.n_vocab;
    float *l = malloc((size_t)V * 4);
    step(r, prompt, 0, n, l);
    for (int i = 0; i < N_GREEDY_TOKENS; i++) {
        out[i] = argmax(l, V);
        float second = -INFINITY;
        for (int v = 0; v < V; v++)
            if (v != out[i] && l[v] > second)
                second = l[v];
        gap[i] = l[out[i]] - second;
        if (i + 1 < N_GREEDY_TOKENS)
            step(r, &out[i], n + i, 1, l);
    }
    free(l);
}

/* The greedy continuations of the fixture's first N_GREEDY_PROMPTS prompts on a and b: how
 * many are equal; where they part, a's own choice must have been a near tie (top-2 gap
 * under near_tie). Prints each prompt and the count. */
static int greedy_compare(rig *a, rig *b, const char *an, const char *bn, double near_tie) {
    json_t *fx = fixture("greedy.json");
    assert_non_null(fx);
    json_t *prompts = json_object_get(fx, "prompts");
    assert_true(json_array_size(prompts) >= N_GREEDY_PROMPTS);
    const char *lim = getenv("MEDLEY_E2E_GREEDY_PROMPTS"); /* fewer prompts, by hand */
    int np = lim && atoi(lim) > 0 && atoi(lim) < N_GREEDY_PROMPTS ? atoi(lim) : N_GREEDY_PROMPTS;
    int equal = 0;
    double worst_gap = 0;
    for (int pi = 0; pi < np; pi++) {
        int n;
        int32_t *ids = test_ids(json_object_get(json_array_get(prompts, pi), "tokens"), &n);
        int32_t oa[N_GREEDY_TOKENS], ob[N_GREEDY_TOKENS];
        float ga[N_GREEDY_TOKENS], gb[N_GREEDY_TOKENS];
        greedy(a, ids, n, oa, ga);
        greedy(b, ids, n, ob, gb);
        int first = 0;
        while (first < N_GREEDY_TOKENS && oa[first] == ob[first])
            first++;
        free(ids);
        if (first == N_GREEDY_TOKENS) {
            equal++;
            printf("prompt %2d (%3d tokens): equal\n", pi, n);
            continue;
        }
        printf("prompt %2d (%3d tokens): differs at token %d (%s %d by a top-2 gap of %.3f, "
               "%s %d by %.3f)\n",
               pi, n, first, an, oa[first], ga[first], bn, ob[first], gb[first]);
        worst_gap = ga[first] > worst_gap ? ga[first] : worst_gap;
        if (!(ga[first] < near_tie))
            fail_msg("prompt %d: %s parts from %s at token %d, where %s's choice led by %.3f "
                     "(a near tie is under %.2f)",
                     pi, bn, an, first, an, ga[first], near_tie);
    }
    printf("%s vs %s: greedy continuations (%d tokens) equal on %d of %d prompts (the issue's "
           "target: 18 of 20); every other parts at a near tie of %s's (largest gap %.3f < "
           "%.2f)\n",
           bn, an, N_GREEDY_TOKENS, equal, np, an, worst_gap, near_tie);
    json_decref(fx);
    return equal;
}

static void test_greedy_cuda_vs_cpu(void **state) {
    greedy_compare(&CPU, &GPU, "cpu", "cuda", GPU_NEAR_TIE);
}

/* The exact pair holds the bar: 18 of 20 (over N_GREEDY_TOKENS tokens). */
static void test_greedy_cuda_exact_equals_cpu_exact(void **state) {
    int equal = greedy_compare(&CPUX, &GPUX, "cpu-exact", "cuda-exact", EXACT_NEAR_TIE);
    const char *lim = getenv("MEDLEY_E2E_GREEDY_PROMPTS");
    if (!lim || atoi(lim) <= 0 || atoi(lim) >= N_GREEDY_PROMPTS)
        assert_true(equal >= 18);
}

int main(void) {
    int skip = gpu_test_skip_without_device();
    if (skip)
        return skip;
    const char *path = test_model_path();
    if (!path) {
        printf("SKIP: %s not found (scripts/fetch-model.sh fetches it)\n", TEST_MODEL_FILE);
        return GPU_TEST_SKIP;
    }
    json_t *f1 = fixture("logits.json"), *f2 = fixture("greedy.json");
    int have = f1 && f2;
    json_decref(f1);
    json_decref(f2);
    if (!have) {
        printf("SKIP: engine fixtures missing (tests/fixtures/engine/make_engine_fixtures.py)\n");
        return GPU_TEST_SKIP;
    }
    md_err e = {0};
    if (gguf_open(path, &GF, &e)) {
        fprintf(stderr, "%s\n", e.msg);
        return 1;
    }
    gpu_test_filter_from_env();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_logits_cuda_vs_cpu_and_llama_cpp),
        cmocka_unit_test(test_logits_cuda_exact_vs_cpu_exact),
        cmocka_unit_test(test_greedy_cuda_vs_cpu),
        cmocka_unit_test(test_greedy_cuda_exact_equals_cpu_exact),
    };
    rig_open(&CPU, "cpu");
    rig_open(&GPU, "cuda:0");
    rig_open(&CPUX, "cpu-exact");
    rig_open(&GPUX, "cuda-exact:0");
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    rig_close(&GPUX);
    rig_close(&CPUX);
    rig_close(&GPU);
    rig_close(&CPU);
    gguf_close(GF);
    return rc;
}
