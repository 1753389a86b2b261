/* test_engine_faults.c — a device error in the middle of a batch (tests/unit/fault_backend.h,
 * an imitation of kernels/cuda's errors over the CPU backend) on SmolLM2-135M: the step that
 * hits it returns the error; the sequences it was running (decoding and prefilling) finish
 * with MD_FINISH_ERROR and the device's sentence; the waiting ones are untouched and, after a
 * transient fault, complete with the tokens a healthy device gives; after a sticky fault every
 * later step fails at once and the loop ends; every KV block comes back; a failure while
 * loading the model is a clear error that frees everything; NaN outputs never become tokens
 * silently. Skipped when the model is not fetched (scripts/fetch-model.sh). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "common/util.h"
#include "e2e/test_engine_util.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "unit/fault_backend.h"

#define N_SEQS 6
#define MAX_SEQS 3 /* so N_SEQS - MAX_SEQS sequences wait */
#define MAX_TOKENS 8
/* With 24 tokens per step, step 3 runs sequence 0 decoding, 1 prefilling (its second chunk)
 * and 2 admitted by that step, while 3..5 wait (the test checks this mix before the fault). */
#define BATCH_TOKENS 24
#define FAULT_STEP 3
#define CUDA_SENTENCE "an illegal memory access was encountered (cudaErrorIllegalAddress)"
/* The sweeps over every op take a transient fault in each (SmolLM2 loaded once per op): the
 * optimized build runs them all; under ASan, where each load and run takes about 18 s here,
 * every fourth (the first, middle and last ops of the unfused pass; the first and the last
 * fused one), which keeps the error paths of both ends of a step under the sanitizer. */
#ifdef __SANITIZE_ADDRESS__
#define ASAN_STRIDE 4
#else
#define ASAN_STRIDE 1
#endif

static int32_t *g_prompt[N_SEQS];
static int g_n_prompt[N_SEQS];
static int32_t g_ref[N_SEQS][MAX_TOKENS]; /* greedy tokens on the healthy CPU backend */

static md_engine *open_with(const char *device, const char *bf16_weights, md_err *e) {
    md_engine_config cfg = {.model_path = test_model_path(),
                            .device = device,
                            .n_threads = 2,
                            .max_seqs = MAX_SEQS,
                            .max_batch_tokens = BATCH_TOKENS,
                            .n_ctx = 256,
                            .bf16_weights = bf16_weights};
    md_engine *eng = NULL;
    if (md_engine_open(&cfg, &eng, e))
        return NULL;
    return eng;
}

static md_engine *open_on(const char *device, md_err *e) {
    return open_with(device, NULL, e);
}

static void sampling(int i, md_sampling *s) {
    md_sampling_default(s);
    s->max_tokens = MAX_TOKENS;
    s->ignore_eos = 1;
    if (i % 3 == 0) { /* a sampled row among greedy ones: its logits are downloaded */
        s->temperature = 0.8f;
        s->top_p = 0.9f;
        s->seed = 77 + (uint64_t)i;
    }
}

static void submit_all(md_engine *eng, uint64_t *ids) {
    for (int i = 0; i < N_SEQS; i++) {
        md_sampling s;
        sampling(i, &s);
        md_err e = {0};
        if (md_engine_submit(eng, g_prompt[i], g_n_prompt[i], &s, &ids[i], &e))
            fail_msg("submit %d: %s", i, e.msg);
    }
}

static int group_setup(void **state) {
    md_err e = {0};
    if (fault_backend_register(&e)) {
        fprintf(stderr, "register: %s\n", e.msg);
        return -1;
    }
    if (!test_model_path())
        return 0; /* each test skips */
    json_t *fx = test_fixture("greedy.json");
    if (!fx)
        return -1;
    json_t *prompts = json_object_get(fx, "prompts");
    for (int i = 0; i < N_SEQS; i++)
        g_prompt[i] =
            test_ids(json_object_get(json_array_get(prompts, (size_t)i), "tokens"), &g_n_prompt[i]);
    json_decref(fx);
    /* the reference: the same requests on the plain CPU backend */
    md_engine *eng = open_on("cpu", &e);
    if (!eng) {
        fprintf(stderr, "engine open: %s\n", e.msg);
        return -1;
    }
    uint64_t ids[N_SEQS];
    submit_all(eng, ids);
    md_step_result r;
    for (int guard = 0; guard < 1000; guard++) {
        if (md_engine_step(eng, &r, &e)) {
            fprintf(stderr, "reference step: %s\n", e.msg);
            return -1;
        }
        if (r.n_live == 0)
            break;
    }
    for (int i = 0; i < N_SEQS; i++) {
        const int32_t *t;
        int n;
        if (md_seq_tokens(eng, ids[i], &t, &n) || n != MAX_TOKENS)
            return -1;
        memcpy(g_ref[i], t, sizeof g_ref[i]);
    }
    md_engine_close(eng);
    return 0;
}

static int group_teardown(void **state) {
    for (int i = 0; i < N_SEQS; i++)
        free(g_prompt[i]);
    return 0;
}

enum { ST_WAITING, ST_PREFILLING, ST_DECODING, ST_FINISHED };
static const char *const state_name[] = {"waiting", "prefilling", "decoding", "finished"};

/* Where a sequence stands between steps: not yet admitted (its prefill time is exactly 0
 * until the engine admits it), admitted without a token, generating, or finished. */
static int state_of(md_engine *eng, uint64_t id) {
    if (md_seq_finish(eng, id) != MD_FINISH_NONE)
        return ST_FINISHED;
    md_seq_stats st;
    md_seq_get_stats(eng, id, &st);
    if (st.completion_tokens > 0)
        return ST_DECODING;
    return st.prefill_ms > 0 ? ST_PREFILLING : ST_WAITING;
}

/* Run steps 1 .. FAULT_STEP - 1 (healthy), then step FAULT_STEP, which must fail with the
 * device error. before[] gets every sequence's state just before the failing step. */
static void run_to_fault(md_engine *eng, const uint64_t *ids, int *before, md_step_result *r) {
    md_err e = {0};
    for (int s = 1; s < FAULT_STEP; s++)
        if (md_engine_step(eng, r, &e))
            fail_msg("step %d before the fault failed: %s", s, e.msg);
    for (int i = 0; i < N_SEQS; i++)
        before[i] = state_of(eng, ids[i]);
    md_err_clear(&e);
    int rc = md_engine_step(eng, r, &e);
    assert_int_equal(rc, MD_EDEVICE);
    assert_non_null(strstr(e.msg, CUDA_SENTENCE));
}

/* After the failed step: every sequence it ran (decoding, prefilling, or admitted by that
 * step) finished with MD_FINISH_ERROR and the device sentence, and was reported finished;
 * the ones still waiting are untouched. Returns the number still waiting. */
static int check_failed_step(md_engine *eng, const uint64_t *ids, const int *before,
                             const md_step_result *r) {
    int n_decoding = 0, n_prefilling = 0, n_failed = 0, n_waiting = 0;
    for (int i = 0; i < N_SEQS; i++) {
        n_decoding += before[i] == ST_DECODING;
        n_prefilling += before[i] == ST_PREFILLING;
        md_finish f = md_seq_finish(eng, ids[i]);
        if (before[i] == ST_DECODING || before[i] == ST_PREFILLING)
            assert_int_equal(f, MD_FINISH_ERROR);
        if (f == MD_FINISH_ERROR) {
            const char *why = md_seq_error(eng, ids[i]);
            assert_non_null(why);
            assert_non_null(strstr(why, CUDA_SENTENCE));
            int reported = 0;
            for (int k = 0; k < r->n_finished; k++)
                reported |= r->finished[k] == ids[i];
            assert_true(reported);
            n_failed++;
        } else {
            /* still waiting: not admitted, no tokens, no error */
            assert_int_equal(f, MD_FINISH_NONE);
            assert_int_equal(before[i], ST_WAITING);
            assert_int_equal(state_of(eng, ids[i]), ST_WAITING);
            assert_null(md_seq_error(eng, ids[i]));
            n_waiting++;
        }
    }
    /* the fault hit the mix the test is about */
    assert_true(n_decoding >= 1);
    assert_true(n_prefilling >= 1);
    assert_true(n_waiting >= 1);
    assert_int_equal(n_failed, r->n_finished);
    assert_int_equal(r->n_live, n_waiting);
    return n_waiting;
}

static void assert_all_blocks_free(md_engine *eng, const uint64_t *ids) {
    for (int i = 0; i < N_SEQS; i++)
        md_engine_release(eng, ids[i]);
    md_step_result r;
    md_err e = {0};
    md_engine_step(eng, &r, &e); /* frees released sequences */
    md_engine_stats st;
    md_engine_get_stats(eng, &st);
    assert_int_equal(st.kv_blocks_free, st.kv_blocks);
}

static void transient(const char *device) {
    if (!test_model_path())
        skip();
    md_err e = {0};
    md_engine *eng = open_on(device, &e);
    if (!eng)
        fail_msg("open %s: %s", device, e.msg);
    uint64_t ids[N_SEQS];
    int before[N_SEQS];
    md_step_result r;
    submit_all(eng, ids);
    run_to_fault(eng, ids, before, &r);
    check_failed_step(eng, ids, before, &r);
    /* the device works again: the waiting sequences run to the end, as on a healthy device */
    int guard = 0;
    do {
        if (md_engine_step(eng, &r, &e))
            fail_msg("step after a transient fault: %s", e.msg);
    } while (r.n_live > 0 && ++guard < 200);
    assert_int_equal(r.n_live, 0);
    for (int i = 0; i < N_SEQS; i++) {
        if (md_seq_finish(eng, ids[i]) == MD_FINISH_ERROR)
            continue;
        assert_int_equal(md_seq_finish(eng, ids[i]), MD_FINISH_LENGTH);
        const int32_t *t;
        int n;
        assert_int_equal(md_seq_tokens(eng, ids[i], &t, &n), 0);
        assert_int_equal(n, MAX_TOKENS);
        assert_memory_equal(t, g_ref[i], sizeof g_ref[i]);
    }
    assert_all_blocks_free(eng, ids);
    md_engine_close(eng);
}

/* A kernel fails in the middle of a layer's matmuls. */
static void test_transient_matmul_fault_fails_the_step_and_spares_the_waiting(void **state) {
    transient("faulty:op=matmul,step=3,after=5");
}

/* The forward pass went through but the greedy picks could not be read back. */
static void test_transient_argmax_fault_fails_the_step_and_spares_the_waiting(void **state) {
    transient("faulty:op=argmax,step=3,after=1");
}

/* The sampled rows' logits could not be downloaded. */
static void test_transient_download_fault_fails_the_step_and_spares_the_waiting(void **state) {
    transient("faulty:op=buf_download,step=3,after=1");
}

/* Whichever op of the pass fails (the first, the last, one in the middle of a layer, the
 * upload of the step's layout), the outcome is the same. */
static void test_transient_fault_in_any_op_fails_the_step_and_spares_the_waiting(void **state) {
    static const char *const devices[] = {
        "faulty:op=batch_prepare,after=3",    "faulty:op=embed,step=3,after=1",
        "faulty:op=rmsnorm,step=3,after=20",  "faulty:op=rope,step=3,after=31",
        "faulty:op=kv_write,step=3,after=30", "faulty:op=swiglu,step=3,after=2",
        "faulty:op=add,step=3,after=59",      "faulty:op=gather_rows,step=3,after=1",
        "faulty:op=matmul,step=3,after=211", /* the output head: 30 layers x 7 + 1 */
    };
    for (size_t i = 0; i < sizeof devices / sizeof devices[0]; i += ASAN_STRIDE)
        transient(devices[i]);
}

/* The same on a backend with the fused products (4 per layer: Q/K/V, wo+x, gate/up,
 * down+x) and RoPE with the KV store in one op. */
static void test_transient_fault_in_any_fused_op_fails_the_step_and_spares_the_waiting(
    void **state) {
    static const char *const devices[] = {
        "faulty:op=matmul_n,step=3,after=1,fused=1",
        "faulty:op=matmul_n,step=3,after=63,fused=1",
        "faulty:op=matmul_n,step=3,after=120,fused=1",
        "faulty:op=matmul,step=3,after=1,fused=1", /* then the head is the only matmul */
        "faulty:op=rope_kv,step=3,after=17,fused=1",
    };
    for (size_t i = 0; i < sizeof devices / sizeof devices[0]; i += ASAN_STRIDE)
        transient(devices[i]);
}

/* A backend that records passes (kernels/cuda's graphs): the launch of step 3's recording
 * fails, or the recording cannot even begin. */
static void test_transient_graph_launch_fault_fails_the_step_and_spares_the_waiting(void **state) {
    transient("faulty:op=step_end,step=3,after=1,record=1");
    transient("faulty:op=step_begin,step=3,after=1,record=1");
}

static void test_sticky_fault_fails_every_later_step_fast(void **state) {
    if (!test_model_path())
        skip();
    md_err e = {0};
    md_engine *eng = open_on("faulty:op=attention,step=3,after=7,sticky=1", &e);
    if (!eng)
        fail_msg("open: %s", e.msg);
    uint64_t ids[N_SEQS];
    int before[N_SEQS];
    md_step_result r;
    submit_all(eng, ids);
    run_to_fault(eng, ids, before, &r);
    int waiting = check_failed_step(eng, ids, before, &r);
    /* every later step admits what waits and fails it at once, with the same first error:
     * the loop ends (no hang, no spinning), in at most one step per waiting sequence */
    uint64_t t0 = md_mono_ns();
    int steps = 0;
    while (r.n_live > 0) {
        assert_true(steps < waiting);
        md_err_clear(&e);
        assert_int_equal(md_engine_step(eng, &r, &e), MD_EDEVICE);
        assert_non_null(strstr(e.msg, "attention failed: " CUDA_SENTENCE));
        assert_true(r.n_finished >= 1);
        assert_int_equal(r.n_tokens, 0);
        steps++;
    }
    double ms = (double)(md_mono_ns() - t0) / 1e6;
    for (int i = 0; i < N_SEQS; i++) {
        assert_int_equal(md_seq_finish(eng, ids[i]), MD_FINISH_ERROR);
        assert_non_null(strstr(md_seq_error(eng, ids[i]), CUDA_SENTENCE));
    }
    fault_backend_stats fs;
    fault_backend_get_stats(&fs);
    assert_int_equal(fs.injected, 1);
    assert_true(fs.refused >= steps); /* the later steps were refused by the sticky error */
    printf("sticky fault: %d later steps failed the %d waiting sequences in %.1f ms\n", steps,
           waiting, ms);
    assert_true(ms < 5000); /* refused before any work: no forward pass ran */
    /* an empty engine on a dead device: a step does nothing and says nothing is live */
    assert_int_equal(md_engine_step(eng, &r, &e), 0);
    assert_int_equal(r.n_live, 0);
    /* a new request on the dead device fails at its first step, it does not hang */
    uint64_t late;
    md_sampling s;
    sampling(0, &s);
    assert_int_equal(md_engine_submit(eng, g_prompt[0], g_n_prompt[0], &s, &late, &e), 0);
    assert_int_equal(md_engine_step(eng, &r, &e), MD_EDEVICE);
    assert_int_equal(md_seq_finish(eng, late), MD_FINISH_ERROR);
    md_engine_release(eng, late);
    assert_all_blocks_free(eng, ids);
    md_engine_close(eng);
    fault_backend_get_stats(&fs);
    assert_int_equal(fs.live_bufs, 0);
}

/* A device that fails while the model loads: the open fails with the device's sentence and
 * gives back every buffer it had (ASan checks the host side). */
static void test_fault_while_loading_is_a_clear_error_and_frees_everything(void **state) {
    if (!test_model_path())
        skip();
    static const char *const devices[] = {
        "faulty:op=buf_wrap,after=1",   /* the first weight */
        "faulty:op=buf_wrap,after=150", /* a weight of a middle layer */
        "faulty:op=buf_upload,after=1", /* the RoPE table */
        "faulty:op=buf_alloc,after=3",  /* the KV cache */
        "faulty:op=buf_alloc,after=70", /* an activation buffer */
        "faulty:op=reserve,after=1",    /* step scratch */
    };
    for (size_t i = 0; i < sizeof devices / sizeof devices[0]; i++) {
        fault_backend_stats before, after;
        fault_backend_get_stats(&before);
        md_err e = {0};
        md_engine *eng = open_on(devices[i], &e);
        if (eng)
            fail_msg("%s: the engine opened on a failing device", devices[i]);
        assert_int_equal(e.code, MD_EDEVICE);
        assert_non_null(strstr(e.msg, CUDA_SENTENCE));
        fault_backend_get_stats(&after);
        assert_int_equal(after.opened, before.opened + 1);
        assert_int_equal(after.freed, before.freed + 1);
        assert_int_equal(after.injected, 1);
        assert_int_equal(after.live_bufs, 0);
        printf("%s -> %s\n", devices[i], e.msg);
    }
    /* a bad fault spec is refused with a reason, not taken for a healthy device */
    md_err e = {0};
    static const char *const bad[] = {"faulty:op=frobnicate",
                                      "faulty:op=matmul,after=0",
                                      "faulty:op=matmul,kind=nan,sticky=2",
                                      "faulty:op=add,x=1",
                                      "faulty:op=step_end",
                                      "faulty:op=matmul_n",
                                      "faulty:op=sync,kind=nan",
                                      "faulty"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        md_err_clear(&e);
        assert_null(open_on(bad[i], &e));
        assert_int_equal(e.code, MD_EINVAL);
        assert_non_null(strstr(e.msg, bad[i]));
        printf("%s -> %s\n", bad[i], e.msg);
    }
}

/* NaN outputs (a kernel that silently computes garbage): whatever the engine does with the
 * step, no sequence of it may finish as a success with tokens picked from NaN logits. */
static void test_nan_logits_are_not_turned_into_tokens_silently(void **state) {
    if (!test_model_path())
        skip();
    md_err e = {0};
    md_engine *eng = open_on("faulty:op=matmul,step=3,after=1,kind=nan", &e);
    if (!eng)
        fail_msg("open: %s", e.msg);
    uint64_t ids[N_SEQS];
    md_step_result r;
    submit_all(eng, ids);
    int before[N_SEQS];
    for (int s = 1; s < FAULT_STEP; s++)
        if (md_engine_step(eng, &r, &e))
            fail_msg("step %d: %s", s, e.msg);
    for (int i = 0; i < N_SEQS; i++)
        before[i] = state_of(eng, ids[i]);
    int rc = md_engine_step(eng, &r, &e);
    int guard = 0;
    while (r.n_live > 0 && guard++ < 200)
        md_engine_step(eng, &r, &e);
    assert_int_equal(r.n_live, 0);
    fault_backend_stats fs;
    fault_backend_get_stats(&fs);
    assert_int_equal(fs.injected, 1);
    int silent = 0;
    for (int i = 0; i < N_SEQS; i++) {
        md_finish f = md_seq_finish(eng, ids[i]);
        const int32_t *t;
        int n;
        md_seq_tokens(eng, ids[i], &t, &n);
        int same = n == MAX_TOKENS && !memcmp(t, g_ref[i], sizeof g_ref[i]);
        printf("NaN step %d (rc %d): seq %d (%s) finished %d, %d tokens (first %d, last %d), %s "
               "the healthy run\n",
               FAULT_STEP, rc, i, state_name[before[i]], f, n, n ? t[0] : -1, n ? t[n - 1] : -1,
               same ? "same as" : "DIFFERENT from");
        if (f != MD_FINISH_ERROR && !same)
            silent++;
    }
    assert_int_equal(silent, 0);
    assert_all_blocks_free(eng, ids);
    md_engine_close(eng);
}

/* The sampler given logits that are not numbers (NaN rows from a faulty kernel, or all -inf)
 * still returns a token id inside the vocabulary for every sampling mode, without reading
 * outside its arrays (ASan). Which token it is means nothing: the engine has to refuse such
 * logits itself (test_engine_faults_nan). No model needed. */
static void test_sampler_stays_in_bounds_on_non_finite_logits(void **state) {
    enum { N = 1000 };
    smp_scratch *sc = smp_scratch_new(N);
    assert_non_null(sc);
    float *lg = malloc(N * sizeof *lg);
    const float fill[] = {NAN, -INFINITY, INFINITY};
    int32_t prev[4] = {5, 6, 7, 8};
    for (size_t f = 0; f < sizeof fill / sizeof fill[0]; f++) {
        for (int mode = 0; mode < 6; mode++) {
            md_sampling s;
            md_sampling_default(&s);
            s.temperature = mode == 0 ? 0 : 0.7f;
            s.top_p = mode == 2 || mode == 5 ? 0.9f : 1.0f;
            s.top_k = mode == 3 || mode == 5 ? 40 : 0;
            s.min_p = mode == 4 || mode == 5 ? 0.05f : 0;
            s.repetition_penalty = mode == 5 ? 1.1f : 1.0f;
            smp_rng rng;
            smp_rng_seed(&rng, 42);
            for (int i = 0; i < N; i++)
                lg[i] = fill[f];
            float lp = 0;
            int32_t t = smp_sample(&s, lg, N, prev, 2, prev + 2, 2, &rng, sc, &lp);
            if (t < 0 || t >= N)
                fail_msg("logits all %g, sampling mode %d: token %d outside [0, %d)",
                         (double)fill[f], mode, t, N);
        }
    }
    free(lg);
    smp_scratch_free(sc);
}

/* Run every sequence to the end on a healthy engine; they give the reference tokens. */
static void run_all_match_ref(md_engine *eng) {
    uint64_t ids[N_SEQS];
    md_step_result r;
    md_err e = {0};
    submit_all(eng, ids);
    int guard = 0;
    do {
        if (md_engine_step(eng, &r, &e))
            fail_msg("step: %s", e.msg);
    } while (r.n_live > 0 && ++guard < 200);
    for (int i = 0; i < N_SEQS; i++) {
        const int32_t *t;
        int n;
        assert_int_equal(md_seq_finish(eng, ids[i]), MD_FINISH_LENGTH);
        assert_int_equal(md_seq_tokens(eng, ids[i], &t, &n), 0);
        assert_int_equal(n, MAX_TOKENS);
        assert_memory_equal(t, g_ref[i], sizeof g_ref[i]);
    }
}

/* BF16 copies of the quantized weights (backend.h weight_shadow): the engine asks for one
 * per matrix a product reads (SmolLM2: 30 layers x 7 + the tied output head) when told to,
 * none when told not to or when "auto" cannot see the device's memory; a device that runs
 * out of memory part-way keeps what it made and the engine serves as before; any other
 * failure is a clear error at open. */
static void test_bf16_weight_copies_policy_and_out_of_memory(void **state) {
    if (!test_model_path())
        skip();
    md_err e = {0};
    fault_backend_stats st;
    static const struct {
        const char *device, *mode;
        long calls;
    } cases[] = {
        {"faulty:op=none,shadow=1", "on", 211},
        {"faulty:op=none,shadow=1", "off", 0},
        {"faulty:op=none,shadow=1", NULL, 0}, /* auto, and the backend has no mem_info */
        {"faulty:op=none,shadow=1", "auto", 0},
        {"faulty:op=weight_shadow,after=5,kind=oom,shadow=1", "on", 4},
        {"faulty:op=weight_shadow,after=211,kind=oom,shadow=1", "on", 210},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        md_engine *eng = open_with(cases[i].device, cases[i].mode, &e);
        if (!eng)
            fail_msg("%s (%s): %s", cases[i].device, cases[i].mode, e.msg);
        fault_backend_get_stats(&st);
        if (st.shadows != cases[i].calls)
            fail_msg("%s (%s): %ld copies, expected %ld", cases[i].device, cases[i].mode,
                     st.shadows, cases[i].calls);
        if (cases[i].calls == 211) /* every quantized matrix, as BF16 */
            assert_true(st.shadow_bytes > 200L << 20 && st.shadow_bytes < 300L << 20);
        if (cases[i].calls) /* the copies change nothing the engine computes */
            run_all_match_ref(eng);
        md_engine_close(eng);
    }
    md_err_clear(&e);
    assert_null(open_with("faulty:op=weight_shadow,after=3,shadow=1", "on", &e));
    assert_int_equal(e.code, MD_EDEVICE);
    assert_non_null(strstr(e.msg, "BF16 weight copies"));
    assert_non_null(strstr(e.msg, CUDA_SENTENCE));
    fault_backend_get_stats(&st);
    assert_int_equal(st.live_bufs, 0);
    md_err_clear(&e);
    assert_null(open_with("faulty:op=none", "sometimes", &e));
    assert_int_equal(e.code, MD_EINVAL);
    printf("bad mode -> %s\n", e.msg);
}

/* Batch sizes the configuration leaves 0 are the backend's defaults (kernels/cuda: 256
 * sequences, 2048 tokens per step), else the CPU's 64 and 512; the configuration's own win,
 * and the step holds at least one token per sequence. A full batch of the backend's size
 * runs. */
static void test_batch_sizes_default_to_the_backends(void **state) {
    if (!test_model_path())
        skip();
    static const struct {
        const char *device;
        int seqs, tokens, want_seqs, want_tokens;
    } cases[] = {
        {"faulty:op=none", 0, 0, 64, 512},
        {"cpu", 0, 0, 64, 512},
        {"faulty:op=none,seqs=256,steptokens=2048", 0, 0, 256, 2048},
        {"faulty:op=none,seqs=256,steptokens=2048", 8, 0, 8, 2048},
        {"faulty:op=none,seqs=256,steptokens=2048", 0, 100, 256, 256},
        {"faulty:op=none,seqs=96", 0, 0, 96, 512},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        md_engine_config cfg = {.model_path = test_model_path(),
                                .device = cases[i].device,
                                .n_threads = 2,
                                .max_seqs = cases[i].seqs,
                                .max_batch_tokens = cases[i].tokens,
                                .n_ctx = 64};
        md_engine *eng = NULL;
        md_err e = {0};
        if (md_engine_open(&cfg, &eng, &e))
            fail_msg("%s: %s", cases[i].device, e.msg);
        printf("%s, configured %d seqs / %d tokens: %d seqs, %d tokens per step\n", cases[i].device,
               cases[i].seqs, cases[i].tokens, md_engine_max_seqs(eng),
               md_engine_max_batch_tokens(eng));
        assert_int_equal(md_engine_max_seqs(eng), cases[i].want_seqs);
        assert_int_equal(md_engine_max_batch_tokens(eng), cases[i].want_tokens);
        if (i == 5) { /* 96 sequences at once: all admitted in one step, each answered */
            md_sampling sp;
            md_sampling_default(&sp);
            sp.max_tokens = 2;
            sp.ignore_eos = 1;
            int32_t prompt[3] = {1, 2, 3};
            uint64_t id;
            for (int q = 0; q < 96; q++)
                assert_int_equal(md_engine_submit(eng, prompt, 3, &sp, &id, &e), 0);
            md_step_result r;
            assert_int_equal(md_engine_step(eng, &r, &e), 0);
            assert_int_equal(r.n_tokens, 96); /* every sequence prefilled in the first step */
            assert_int_equal(r.n_live, 96);
            int steps = 1;
            while (r.n_live > 0 && steps < 10) {
                assert_int_equal(md_engine_step(eng, &r, &e), 0);
                steps++;
            }
            assert_int_equal(r.n_live, 0);
            assert_int_equal(steps, 2);
        }
        md_engine_close(eng);
    }
    md_err e = {0};
    md_engine *eng = NULL;
    md_engine_config cfg = {.model_path = test_model_path(), .device = "faulty:op=none,seqs=0"};
    assert_int_not_equal(md_engine_open(&cfg, &eng, &e), 0);
    assert_null(eng);
    printf("seqs=0 -> %s\n", e.msg);
}

int main(int argc, char **argv) {
    /* Three groups, each its own ctest entry (tests/faults.cmake) so that they run in
     * parallel and each stays well inside its timeout under ASan: every transient() loads
     * SmolLM2 and runs six requests. */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_transient_matmul_fault_fails_the_step_and_spares_the_waiting),
        cmocka_unit_test(test_transient_argmax_fault_fails_the_step_and_spares_the_waiting),
        cmocka_unit_test(test_transient_download_fault_fails_the_step_and_spares_the_waiting),
        cmocka_unit_test(test_sticky_fault_fails_every_later_step_fast),
        cmocka_unit_test(test_fault_while_loading_is_a_clear_error_and_frees_everything),
        cmocka_unit_test(test_bf16_weight_copies_policy_and_out_of_memory),
        cmocka_unit_test(test_sampler_stays_in_bounds_on_non_finite_logits),
        cmocka_unit_test(test_batch_sizes_default_to_the_backends),
    };
    /* "anyop": a fault in each op of the unfused pass */
    const struct CMUnitTest anyop[] = {
        cmocka_unit_test(test_transient_fault_in_any_op_fails_the_step_and_spares_the_waiting),
    };
    /* "fused": the fused products, rope_kv and recorded (graph) passes */
    const struct CMUnitTest fused[] = {
        cmocka_unit_test(
            test_transient_fault_in_any_fused_op_fails_the_step_and_spares_the_waiting),
        cmocka_unit_test(test_transient_graph_launch_fault_fails_the_step_and_spares_the_waiting),
    };
    /* "nan": the NaN probe alone */
    const struct CMUnitTest nan[] = {
        cmocka_unit_test(test_nan_logits_are_not_turned_into_tokens_silently),
    };
    if (getenv("TEST_FILTER"))
        cmocka_set_test_filter(getenv("TEST_FILTER"));
    const char *group = argc > 1 ? argv[1] : "";
    if (!strcmp(group, "nan"))
        return cmocka_run_group_tests(nan, group_setup, group_teardown);
    if (!strcmp(group, "anyop"))
        return cmocka_run_group_tests(anyop, group_setup, group_teardown);
    if (!strcmp(group, "fused"))
        return cmocka_run_group_tests(fused, group_setup, group_teardown);
    if (*group) {
        fprintf(stderr, "test_engine_faults: unknown group '%s' (nan, anyop, fused)\n", group);
        return 2;
    }
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
