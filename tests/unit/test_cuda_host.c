/* test_cuda_host.c — the CUDA backend's host logic without a GPU: the real backend_cuda.c (decode
 * steps as CUDA graphs, kernels/cuda/graph_cache.c, step_plan.c) under the real engine, over
 * tests/unit/fake_cuda.c, which records every kernel launch instead of running it.
 *
 * The same workload (20 prompts of 3 to 185 tokens through 10 slots, different max_tokens,
 * greedy and seeded rows) runs with MEDLEY_CUDA_GRAPHS=0 and =1. What the device would execute
 * — each launch with its arguments, pointers as (allocation, offset), and the step metadata it
 * follows, taken when the launch runs, i.e. a replayed graph's frozen arguments at its launch —
 * must be identical launch by launch: a replay launches exactly what a direct step would have.
 * Also: graphs were recorded and replayed in every attention split bucket (64, 128, 256
 * positions) and on the cuBLAS path (more than 8 sequences); when the attention partials grow
 * the graphs are dropped and recorded again; captures the driver refuses (injected) re-run with
 * the same launches and tokens and never fail the device; no launch touches memory outside its
 * buffers or freed by then. Tiny fixture model always, SmolLM2 when it is fetched.
 *
 * Driven op by op (what the engine cannot produce on demand): scratch growing inside a capture
 * fails only that capture, the step re-runs directly and the key records at its next step; a
 * graph is never replayed after the partials moved; replays equal direct steps at every length
 * from 20 to 240 positions. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "e2e/test_engine_util.h"
#include "engine/engine.h"
#include "kernels/backend.h"
#include "kernels/cuda/backend_cuda.h"
#include "kernels/cuda/graph_cache.h"
#include "unit/fake_cuda.h"

/* In kernels/backend.h only under MEDLEY_HAVE_CUDA; this binary has its own copy of
 * backend_cuda.c whatever the build. */
int md_backend_cuda_open(int ordinal, md_backend **out, md_err *e);

#define GEN 40

static int open_fakecuda(const char *device, int n_threads, md_backend **out, md_err *e) {
    return md_backend_cuda_open(0, out, e);
}

/* Prompt i and its token count. The first ten stay under 64 positions: decode graphs of the
 * first split bucket are recorded while they run. Then three pass 128 positions and finish
 * soon (the attention partials grow for 4 splits, so every graph recorded so far is dropped),
 * and three decode from under 128 to past it with the same batch shape: bucket 128 is
 * recorded, then bucket 256 comes without any growth, so only the key tells the two apart.
 * The last four are short again: shapes of the first bucket come back after the growths. */
#define NP 20
static const int prompt_len[NP] = {5,   12,  3,   30, 9,   20,  4, 14, 18, 7,
                                   140, 185, 130, 60, 100, 110, 6, 10, 8,  11};
static const int gen_len[NP] = {40, 34, 28, 22, 40, 34, 28, 22, 40, 34,
                                10, 12, 8,  40, 40, 40, 40, 40, 40, 40};

static int make_prompt(int i, int vocab, int32_t *out) {
    int n = prompt_len[i];
    for (int k = 0; k < n; k++)
        out[k] = (int32_t)((1 + i * 131 + k * 17) % (vocab - 1)) + 1;
    return n;
}

static void sampling_for(int i, md_sampling *s) {
    md_sampling_default(s);
    s->max_tokens = gen_len[i];
    s->ignore_eos = 1;
    if (i % 3 == 1) { /* seeded rows next to greedy ones (device argmax) */
        s->temperature = 0.8f;
        s->top_k = 40;
        s->seed = 77 + (uint64_t)i;
    }
    if (i % 3 == 2 || i % 6 == 1) { /* penalised rows with logprobs: the sample op's entries
                                       (fake_cuda checks each row's lie inside pen) */
        s->frequency_penalty = 0.5f;
        s->repetition_penalty = i % 2 ? 1.2f : 1.0f;
        s->logprobs = 1;
    }
}

typedef struct {
    fake_launch *l; /* the stream, copied */
    size_t n;
    int32_t tok[NP][GEN];
    fake_cuda_stats st;
    md_cuda_graph_totals tot;                                  /* this run's share */
    long log_recorded, log_replayed, log_evicted, log_dropped; /* be_free's line; -1: none */
    long steps;
} run_out;

static void run_free(run_out *o) {
    free(o->l);
    memset(o, 0, sizeof *o);
}

/* Close the engine, keeping what the backend logs as it closes (echoed to stderr). */
static void close_and_read_log(md_engine *eng, run_out *o) {
    o->log_recorded = o->log_replayed = o->log_evicted = o->log_dropped = -1;
    fflush(stderr);
    FILE *tf = tmpfile();
    int saved = dup(2);
    assert_non_null(tf);
    assert_true(saved >= 0);
    dup2(fileno(tf), 2);
    md_engine_close(eng);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    rewind(tf);
    char line[1024];
    while (fgets(line, sizeof line, tf)) {
        fputs(line, stderr);
        const char *p = strstr(line, "decode steps as CUDA graphs: ");
        if (p)
            sscanf(p, "decode steps as CUDA graphs: %ld recorded, %ld replayed, %ld evicted, %ld",
                   &o->log_recorded, &o->log_replayed, &o->log_evicted, &o->log_dropped);
    }
    fclose(tf);
}

/* bf16: the engine's --bf16-weights (NULL: auto, which the fake's 80 GiB always grants). */
static void run(const char *model, const char *graphs, int fail_every, const char *bf16,
                run_out *o) {
    memset(o, 0, sizeof *o);
    setenv("MEDLEY_CUDA_GRAPHS", graphs, 1); /* read when the backend opens */
    fake_cuda_reset();
    fake_cuda_fail_capture_end(fail_every);
    md_cuda_graph_totals t0, t1;
    md_cuda_graph_get_totals(&t0);
    md_engine_config cfg = {.model_path = model,
                            .device = "fakecuda",
                            .max_seqs = 10, /* 20 prompts through 10 slots; > 8: cuBLAS path */
                            .max_batch_tokens = 64,
                            .n_ctx = 256,
                            .bf16_weights = bf16};
    md_engine *eng;
    md_err e = {0};
    if (md_engine_open(&cfg, &eng, &e))
        fail_msg("engine open on fakecuda: %s", e.msg);
    int vocab = md_engine_n_vocab(eng);
    uint64_t ids[NP];
    for (int i = 0; i < NP; i++) {
        int32_t p[256];
        int n = make_prompt(i, vocab, p);
        md_sampling s;
        sampling_for(i, &s);
        if (md_engine_submit(eng, p, n, &s, &ids[i], &e))
            fail_msg("submit: %s", e.msg);
    }
    for (;; o->steps++) {
        assert_true(o->steps < 10000);
        md_step_result r;
        if (md_engine_step(eng, &r, &e))
            fail_msg("step %ld (MEDLEY_CUDA_GRAPHS=%s): %s", o->steps, graphs, e.msg);
        if (r.n_live == 0)
            break;
    }
    for (int i = 0; i < NP; i++) {
        const int32_t *t;
        int n;
        md_sampling s;
        sampling_for(i, &s);
        if (md_seq_finish(eng, ids[i]) != MD_FINISH_LENGTH)
            fail_msg("prompt %d did not finish by length: %s", i, md_seq_error(eng, ids[i]));
        assert_int_equal(md_seq_tokens(eng, ids[i], &t, &n), 0);
        assert_int_equal(n, s.max_tokens);
        memcpy(o->tok[i], t, (size_t)n * sizeof *t);
    }
    close_and_read_log(eng, o);
    md_cuda_graph_get_totals(&t1);
    o->tot.recorded = t1.recorded - t0.recorded;
    o->tot.replayed = t1.replayed - t0.replayed;
    o->tot.reruns = t1.reruns - t0.reruns;
    fake_cuda_get_stats(&o->st);
    const fake_launch *l = fake_cuda_stream(&o->n);
    o->l = malloc((o->n ? o->n : 1) * sizeof *l);
    assert_non_null(o->l);
    memcpy(o->l, l, o->n * sizeof *l);
    fake_cuda_reset();
    printf("  MEDLEY_CUDA_GRAPHS=%s%s: %ld steps, %zu launches; graphs %ld recorded, %ld "
           "replayed, %ld re-run; captures %ld (%ld failed, %ld injected, %ld aborted), %ld "
           "allocations refused while capturing, %ld scratch moves, %ld graphs freed mid-run, "
           "%ld captures after that; log: %ld dropped after scratch moved; %ld violations%s%s\n",
           graphs, fail_every ? " + refused captures" : "", o->steps, o->n, o->tot.recorded,
           o->tot.replayed, o->tot.reruns, o->st.captures, o->st.captures_failed,
           o->st.captures_injected, o->st.captures_aborted, o->st.allocs_refused,
           o->st.scratch_moves, o->st.graphs_freed_running, o->st.captures_after_drop,
           o->log_dropped, o->st.violations, o->st.violations ? ": " : "", o->st.first_violation);
    assert_int_equal(o->st.violations, 0);
}

/* The two runs' effective launches must be equal one by one; on a difference, print it with
 * the launches before it. */
static void same_launches(const run_out *direct, const run_out *graphed) {
    size_t n = direct->n < graphed->n ? direct->n : graphed->n;
    for (size_t i = 0; i < n; i++) {
        if (fake_cuda_launch_eq(&direct->l[i], &graphed->l[i]))
            continue;
        char a[1024], b[1024];
        for (size_t k = i >= 3 ? i - 3 : 0; k < i; k++) {
            fake_cuda_format(&direct->l[k], a, sizeof a);
            printf("  launch %zu (both): %s\n", k, a);
        }
        fake_cuda_format(&direct->l[i], a, sizeof a);
        fake_cuda_format(&graphed->l[i], b, sizeof b);
        fail_msg("launch %zu differs:\n  direct:   %s\n  graphed:  %s", i, a, b);
    }
    if (direct->n != graphed->n)
        fail_msg("%zu launches run directly, %zu with graphs", direct->n, graphed->n);
    for (int i = 0; i < NP; i++)
        assert_memory_equal(direct->tok[i], graphed->tok[i], sizeof direct->tok[i]);
}

/* Distinct values of argument `arg` of `fn` among launches that came from graphs. */
static int distinct_from_graphs(const run_out *o, const char *fn, const char *arg, int64_t *vals,
                                int max) {
    int nv = 0;
    for (size_t i = 0; i < o->n; i++) {
        const fake_launch *l = &o->l[i];
        if (!l->from_graph || strcmp(fake_cuda_fn_name(l->fn), fn))
            continue;
        int64_t v = fake_cuda_arg(l, arg);
        int k = 0;
        while (k < nv && vals[k] != v)
            k++;
        if (k == nv && nv < max)
            vals[nv++] = v;
    }
    return nv;
}

/* Launches of fn in o; from_step > 0 counts only those of steps >= from_step (step 0 is the
 * load, before the first batch_prepare). */
static long count_fn(const run_out *o, const char *fn, long from_step) {
    long n = 0;
    for (size_t i = 0; i < o->n; i++)
        n += o->l[i].step >= from_step && !strcmp(fake_cuda_fn_name(o->l[i].fn), fn);
    return n;
}

static void check_model(const char *model) {
    printf("%s\n", strrchr(model, '/') + 1);
    run_out direct, graphed, refused;
    run(model, "0", 0, NULL, &direct);
    run(model, "1", 0, NULL, &graphed);
    run(model, "1", 2, NULL, &refused); /* every second capture refused by the "driver" */

    assert_int_equal(direct.tot.recorded + direct.tot.replayed + direct.st.captures, 0);
    same_launches(&direct, &graphed);
    same_launches(&direct, &refused);

    /* graphs were recorded, replayed, and every launch of the graph path is accounted for */
    assert_true(graphed.tot.recorded > 0);
    assert_true(graphed.tot.replayed > graphed.tot.recorded);
    assert_int_equal(graphed.st.graph_launches, graphed.tot.recorded + graphed.tot.replayed);
    assert_int_equal(graphed.log_recorded, graphed.tot.recorded);
    assert_int_equal(graphed.log_replayed, graphed.tot.replayed);

    /* replays covered every attention split bucket and the cuBLAS path */
    int64_t v[16];
    int n_split = distinct_from_graphs(&graphed, "cuda_attn_decode", "n_splits", v, 16);
    printf("  split counts replayed from graphs:");
    for (int i = 0; i < n_split; i++)
        printf(" %lld", (long long)v[i]);
    printf("\n");
    assert_true(n_split >= 3);
    assert_true(distinct_from_graphs(&graphed, "cublasGemmEx", "m", v, 16) >= 1);

    /* the block table's row stride follows the split bucket (64, 128, 256 positions: 4, 8, 16
     * blocks of 16), not the reserved width of n_ctx 256 in every step; fake_cuda checks that
     * each row names the blocks the step's K/V went to at that stride */
    int n_stride = distinct_from_graphs(&graphed, "cuda_attn_decode", "max_blocks", v, 16);
    printf("  block-table strides replayed from graphs:");
    int64_t lo = INT64_MAX;
    for (int i = 0; i < n_stride; i++) {
        printf(" %lld", (long long)v[i]);
        lo = v[i] < lo ? v[i] : lo;
    }
    printf("\n");
    assert_true(n_stride >= 3);
    assert_int_equal(lo, 4);

    /* sampled and penalised rows were drawn by the sample kernel, greedy ones by argmax */
    assert_true(count_fn(&direct, "cuda_sample", 0) > 0);
    assert_true(count_fn(&direct, "cuda_argmax", 0) > 0);

    /* each layer's RoPE and KV store ran as one rope_kv launch, in graphs too */
    assert_true(count_fn(&direct, "cuda_rope_kv", 0) > 0);
    assert_int_equal(count_fn(&direct, "cuda_rope", 0) + count_fn(&direct, "cuda_kv_write", 0), 0);
    int n_rows = distinct_from_graphs(&graphed, "cuda_rope_kv", "n_tokens", v, 16);
    assert_true(n_rows >= 1);
    /* decode graphs run padded rows: 1, 2, 4, 8 or the 10 reserved, whatever the batch */
    printf("  rows of the steps replayed from graphs:");
    for (int i = 0; i < n_rows; i++) {
        printf(" %lld", (long long)v[i]);
        assert_int_equal(cuda_gc_pad_rows((int)v[i], 10), v[i]);
    }
    printf("\n");

    /* attention partials grew for a new split count after graphs were recorded: the graphs
     * reading the old buffer were dropped and their keys recorded again */
    assert_true(graphed.st.graphs_freed_running > 0);
    assert_true(graphed.log_dropped > 0);
    assert_true(graphed.st.captures_after_drop > 0);

    /* refused captures re-ran directly and the device kept working (every sequence finished
     * by length in run(); later captures still recorded) */
    assert_true(refused.st.captures_injected > 0);
    assert_true(refused.tot.reruns >= refused.st.captures_injected);
    assert_true(refused.tot.recorded > 0);
    assert_true(refused.tot.replayed > 0);

    run_free(&direct);
    run_free(&graphed);
    run_free(&refused);
}

static void test_tiny_graphs_launch_what_direct_steps_do(void **state) {
    static char path[4096];
    snprintf(path, sizeof path, "%s/engine/tiny-llama3.gguf", MEDLEY_FIXTURES);
    check_model(path);
}

static void test_smollm2_graphs_launch_what_direct_steps_do(void **state) {
    const char *m = test_model_path();
    if (!m)
        skip();
    check_model(m);
}

/* --bf16-weights on against off: at load one BF16 expansion per quantized matrix into memory
 * of its own; then no step expands a weight again, and every cuBLAS product (steps of more
 * than 8 tokens) reads one of those copies; the same launches otherwise (by count) and the
 * same tokens; closing the engine frees every copy (none is left for the pool to free). */
static void check_shadows(const char *model) {
    printf("%s, BF16 weight copies\n", strrchr(model, '/') + 1);
    run_out off, on;
    run(model, "1", 0, "off", &off);
    run(model, "1", 0, "on", &on);
    long dq_load = count_fn(&on, "cuda_dequantize", 0) - count_fn(&on, "cuda_dequantize", 1);
    printf("  copies made at load: %ld; expansions in steps: %ld with copies, %ld without; "
           "GemmEx %ld / %ld; left to the pool at close: %ld allocations, %zu bytes (%ld, %zu "
           "without copies)\n",
           dq_load, count_fn(&on, "cuda_dequantize", 1), count_fn(&off, "cuda_dequantize", 1),
           count_fn(&on, "cublasGemmEx", 1), count_fn(&off, "cublasGemmEx", 1), on.st.live_at_close,
           on.st.live_bytes_at_close, off.st.live_at_close, off.st.live_bytes_at_close);
    assert_int_equal(count_fn(&off, "cuda_dequantize", 0), count_fn(&off, "cuda_dequantize", 1));
    assert_true(dq_load > 0);
    assert_int_equal(count_fn(&on, "cuda_dequantize", 1), 0);
    assert_true(count_fn(&off, "cuda_dequantize", 1) > 0);
    /* every GemmEx of a step reads a copy made at load (out BF16 into an allocation of its own) */
    int64_t *copy = calloc((size_t)dq_load, sizeof *copy);
    assert_non_null(copy);
    long nc = 0, gemms = 0;
    for (size_t i = 0; i < on.n && on.l[i].step == 0; i++)
        if (!strcmp(fake_cuda_fn_name(on.l[i].fn), "cuda_dequantize") && nc < dq_load &&
            fake_cuda_arg(&on.l[i], "out") == 2)
            copy[nc++] = fake_cuda_arg(&on.l[i], "dst");
    assert_int_equal(nc, dq_load);
    for (size_t i = 0; i < on.n; i++) {
        const fake_launch *l = &on.l[i];
        if (l->step < 1 || strcmp(fake_cuda_fn_name(l->fn), "cublasGemmEx"))
            continue;
        int64_t w = fake_cuda_arg(l, "w");
        long k = 0;
        while (k < nc && copy[k] != w)
            k++;
        if (k == nc)
            fail_msg("GemmEx at step %ld reads allocation #%lld, not a BF16 copy", l->step,
                     (long long)(w >> 40));
        gemms++;
    }
    assert_true(gemms > 0);
    assert_int_equal(gemms, count_fn(&off, "cublasGemmEx", 1));
    assert_int_equal(count_fn(&on, "cuda_rope_kv", 1), count_fn(&off, "cuda_rope_kv", 1));
    assert_int_equal(count_fn(&on, "gemv_n", 1), count_fn(&off, "gemv_n", 1));
    assert_int_equal(on.steps, off.steps);
    for (int i = 0; i < NP; i++)
        assert_memory_equal(on.tok[i], off.tok[i], sizeof on.tok[i]);
    /* the engine freed its buffers before the backend: the copies went with the weights' */
    assert_true(on.st.live_at_close <= 32);
    for (long i = 0; i < on.st.live_at_close; i++)
        for (long k = 0; k < nc; k++)
            if (on.st.live_ids_at_close[i] == copy[k] >> 40)
                fail_msg("BF16 copy #%lld still live when the backend closed",
                         (long long)on.st.live_ids_at_close[i]);
    assert_true(on.st.live_at_close <= off.st.live_at_close); /* no scratch W with copies */
    free(copy);
    run_free(&off);
    run_free(&on);
}

static void test_tiny_bf16_copies_replace_expansions(void **state) {
    static char path[4096];
    snprintf(path, sizeof path, "%s/engine/tiny-llama3.gguf", MEDLEY_FIXTURES);
    check_shadows(path);
}

static void test_smollm2_bf16_copies_replace_expansions(void **state) {
    const char *m = test_model_path();
    if (!m)
        skip();
    check_shadows(m);
}

/* ---- the backend driven op by op ----------------------------------------------------
 * Steps of one decode token per sequence over a 1-KV-head F16 cache, attention only: the
 * cases the engine's workload cannot produce on demand. */

enum { D_SEQS = 4, D_HEADS = 4, D_HD = 64, D_BT = 16, D_MAXB = 16, D_SLOTS = D_BT * D_MAXB };

typedef struct {
    md_backend *be;
    md_buf *q, *out, *kc, *vc;
    int32_t tokens[D_SEQS], seq[D_SEQS], pos[D_SEQS], slot[D_SEQS], len[D_SEQS],
        table[D_SEQS * D_MAXB], rows[D_SEQS];
} direct;

static void direct_open(direct *d, const char *graphs) {
    memset(d, 0, sizeof *d);
    setenv("MEDLEY_CUDA_GRAPHS", graphs, 1);
    fake_cuda_reset();
    md_err e = {0};
    if (md_backend_open("fakecuda", 0, &d->be, &e))
        fail_msg("open: %s", e.msg);
    md_reserve r = {.max_tokens = D_SEQS,
                    .max_seqs = D_SEQS,
                    .max_cols = D_HEADS * D_HD,
                    .max_ctx = D_SLOTS,
                    .max_blocks = D_MAXB,
                    .n_heads = D_HEADS};
    const md_backend_ops *o = d->be->ops;
    size_t act = (size_t)D_SEQS * D_HEADS * D_HD * 4, cache = (size_t)D_SLOTS * D_HD * 2;
    if (o->reserve(d->be, &r, &e) || o->buf_alloc(d->be, act, &d->q, &e) ||
        o->buf_alloc(d->be, act, &d->out, &e) || o->buf_alloc(d->be, cache, &d->kc, &e) ||
        o->buf_alloc(d->be, cache, &d->vc, &e))
        fail_msg("setup: %s", e.msg);
}

static void direct_close(direct *d) {
    const md_backend_ops *o = d->be->ops;
    md_buf *all[] = {d->q, d->out, d->kc, d->vc};
    for (int i = 0; i < 4; i++)
        o->buf_free(d->be, all[i]);
    md_backend_free(d->be);
    fake_cuda_reset();
}

/* One step: n sequences decoding at position p each (sequence s in blocks s*4..); attention
 * runs when `attend`, again directly when the backend asks for a re-run. Returns step_end's
 * answer. */
static int direct_step(direct *d, int n, int p, int attend) {
    const md_backend_ops *o = d->be->ops;
    for (int s = 0; s < n; s++) {
        d->tokens[s] = 1;
        d->seq[s] = s;
        d->pos[s] = p;
        d->len[s] = p + 1;
        d->rows[s] = s;
        for (int k = 0; k < D_MAXB; k++)
            d->table[s * D_MAXB + k] = (s * 4 + k) % D_MAXB;
        d->slot[s] = d->table[s * D_MAXB + p / D_BT] * D_BT + p % D_BT;
    }
    md_batch b = {.n_tokens = n,
                  .n_seqs = n,
                  .tokens = d->tokens,
                  .tok_seq = d->seq,
                  .tok_pos = d->pos,
                  .slot = d->slot,
                  .seq_len = d->len,
                  .block_table = d->table,
                  .max_blocks = D_MAXB,
                  .block_tokens = D_BT,
                  .logit_rows = d->rows,
                  .n_logits = n};
    md_err e = {0};
    if (o->batch_prepare(d->be, &b, &e) || o->step_begin(d->be, &e))
        fail_msg("step at %d: %s", p, e.msg);
    int rc = 0;
    if (attend)
        rc = o->attention(d->be, d->q, d->kc, d->vc, d->out, D_HEADS, 1, D_HD, MD_TYPE_F16, 0.125f,
                          &e);
    md_err se = {0};
    int end = o->step_end(d->be, rc, &se);
    if (end == MD_STEP_RERUN && attend &&
        o->attention(d->be, d->q, d->kc, d->vc, d->out, D_HEADS, 1, D_HD, MD_TYPE_F16, 0.125f, &e))
        fail_msg("re-run at %d: %s", p, e.msg);
    if (end < 0)
        fail_msg("step_end at %d: %s", p, se.msg);
    return end;
}

/* The attention launches of the stream, in order. */
static int attention_launches(const fake_launch **out, int max) {
    size_t n;
    const fake_launch *l = fake_cuda_stream(&n);
    int k = 0;
    for (size_t i = 0; i < n && k < max; i++)
        if (!strcmp(fake_cuda_fn_name(l[i].fn), "cuda_attn_decode"))
            out[k++] = &l[i];
    return k;
}

/* A capture whose attention needs more partials than ever before (its key's first step ran no
 * attention): the allocation is refused inside the capture, the step re-runs directly (the
 * device not failed), the partials grow, and the key is recorded at its next step and replayed
 * with the new buffer. */
static void test_scratch_growth_inside_capture_reruns(void **state) {
    direct d;
    direct_open(&d, "1");
    md_cuda_graph_totals t0, t1;
    md_cuda_graph_get_totals(&t0);
    assert_int_equal(direct_step(&d, 2, 20, 0), 0);             /* first sighting: direct */
    assert_int_equal(direct_step(&d, 2, 21, 1), MD_STEP_RERUN); /* capture refused the growth */
    assert_int_equal(direct_step(&d, 2, 22, 1), 0);             /* recorded */
    assert_int_equal(direct_step(&d, 2, 23, 1), 0);             /* replayed */
    md_cuda_graph_get_totals(&t1);
    fake_cuda_stats st;
    fake_cuda_get_stats(&st);
    assert_int_equal(st.violations, 0);
    assert_int_equal(st.allocs_refused, 1);
    assert_int_equal(t1.reruns - t0.reruns, 1);
    assert_int_equal(t1.recorded - t0.recorded, 1);
    assert_int_equal(t1.replayed - t0.replayed, 1);
    const fake_launch *a[8];
    assert_int_equal(attention_launches(a, 8), 3); /* re-run, recorded, replayed */
    assert_false(a[0]->from_graph);
    assert_true(a[1]->from_graph && a[2]->from_graph);
    assert_int_equal(a[0]->n_args, a[1]->n_args); /* same arguments (other positions) */
    assert_memory_equal(a[0]->a, a[1]->a, sizeof a[0]->a);
    assert_int_equal(fake_cuda_arg(a[2], "work"), fake_cuda_arg(a[0], "work"));
    direct_close(&d);
}

/* Partials grow in a step of another key (a longer context: more splits, as many sequences
 * as reserved) after a graph was recorded: that graph must not be replayed with the freed buffer;
 * its key records again. */
static void test_graphs_dropped_when_partials_move(void **state) {
    direct d;
    direct_open(&d, "1");
    assert_int_equal(direct_step(&d, D_SEQS, 20, 1), 0);  /* bucket 64, direct */
    assert_int_equal(direct_step(&d, D_SEQS, 21, 1), 0);  /* recorded */
    assert_int_equal(direct_step(&d, D_SEQS, 22, 1), 0);  /* replayed */
    assert_int_equal(direct_step(&d, D_SEQS, 100, 1), 0); /* bucket 128: 2 splits, partials grow */
    assert_int_equal(direct_step(&d, D_SEQS, 23, 1), 0);  /* bucket 64 again */
    fake_cuda_stats st;
    fake_cuda_get_stats(&st);
    assert_int_equal(st.violations, 0);
    const fake_launch *a[8];
    int na = attention_launches(a, 8);
    assert_true(st.graphs_freed_running >= 1);
    assert_int_equal(na, 5);
    assert_int_equal(fake_cuda_arg(a[3], "n_splits"), 2);
    assert_true(fake_cuda_arg(a[3], "work") != fake_cuda_arg(a[0], "work"));
    /* the last bucket-64 step uses the grown buffer, whatever path it took */
    assert_int_equal(fake_cuda_arg(a[4], "work"), fake_cuda_arg(a[3], "work"));
    assert_int_equal(fake_cuda_arg(a[4], "n_splits"), 1);
    direct_close(&d);
}

/* Decode steps growing one position at a time through every split bucket, graphs on and
 * off: the same launches (a graph recorded at 131 positions and replayed at 200 must split
 * the keys as a direct step at 200 does). */
static void test_replays_match_direct_steps_at_every_length(void **state) {
    fake_launch *l[2];
    size_t n[2];
    for (int on = 0; on < 2; on++) {
        direct d;
        direct_open(&d, on ? "1" : "0");
        for (int p = 20; p < 240; p += 3)
            assert_int_equal(direct_step(&d, D_SEQS, p, 1), 0);
        fake_cuda_stats st;
        fake_cuda_get_stats(&st);
        assert_int_equal(st.violations, 0);
        const fake_launch *s = fake_cuda_stream(&n[on]);
        l[on] = malloc(n[on] * sizeof *s);
        assert_non_null(l[on]);
        memcpy(l[on], s, n[on] * sizeof *s);
        if (on)
            assert_true(st.graph_launches > 50);
        direct_close(&d);
    }
    assert_int_equal(n[0], n[1]);
    for (size_t i = 0; i < n[0]; i++)
        if (!fake_cuda_launch_eq(&l[0][i], &l[1][i])) {
            char a[1024], b[1024];
            fake_cuda_format(&l[0][i], a, sizeof a);
            fake_cuda_format(&l[1][i], b, sizeof b);
            fail_msg("launch %zu differs:\n  direct:   %s\n  graphed:  %s", i, a, b);
        }
    free(l[0]);
    free(l[1]);
}

/* Launches of fn in the fake's stream now. */
static long stream_count(const char *fn) {
    size_t n;
    const fake_launch *l = fake_cuda_stream(&n);
    long k = 0;
    for (size_t i = 0; i < n; i++)
        k += !strcmp(fake_cuda_fn_name(l[i].fn), fn);
    return k;
}

/* The last launch of fn in the stream, or NULL. */
static const fake_launch *stream_last(const char *fn) {
    size_t n;
    const fake_launch *l = fake_cuda_stream(&n);
    while (n-- > 0)
        if (!strcmp(fake_cuda_fn_name(l[n].fn), fn))
            return &l[n];
    return NULL;
}

/* weight_shadow on its own: out of memory refused with the bytes and nothing changed; a
 * copy made once (a second call and F32 weights: nothing done); products of more than 8 rows
 * read it, of 8 or fewer the quantized weight; freeing the weight's buffer frees the copy, and
 * a weight wrapped afterwards (glibc tends to hand back the same address) is expanded into
 * scratch again, never multiplied by the stale copy. */
static void test_weight_shadow_made_used_and_dropped(void **state) {
    setenv("MEDLEY_CUDA_GRAPHS", "0", 1);
    fake_cuda_reset();
    md_backend *be;
    md_err e = {0};
    if (md_backend_open("fakecuda", 0, &be, &e))
        fail_msg("open: %s", e.msg);
    const md_backend_ops *o = be->ops;
    enum { K = 64, N = 16, M = 9 };
    size_t rb = md_type_row_bytes(MD_TYPE_Q8_0, K);
    static uint8_t host[N * 68];
    float f32[N * K] = {0};
    md_buf *wb, *fb, *x, *y;
    if (o->buf_wrap(be, host, N * rb, &wb, &e) || o->buf_wrap(be, f32, sizeof f32, &fb, &e) ||
        o->buf_alloc(be, (size_t)M * K * 4, &x, &e) || o->buf_alloc(be, (size_t)M * N * 4, &y, &e))
        fail_msg("setup: %s", e.msg);
    md_tensor w = {wb, 0, MD_TYPE_Q8_0, K, N, rb}, wf = {fb, 0, MD_TYPE_F32, K, N, K * 4};
    size_t used;
    long live = fake_cuda_live(&used);

    fake_cuda_set_total(used + 1000); /* the copy needs N * K * 2 = 2048 bytes */
    assert_int_equal(o->weight_shadow(be, &w, &e), MD_ENOMEM);
    printf("  refused: %s\n", e.msg);
    assert_non_null(strstr(e.msg, "2048 bytes"));
    assert_int_equal(fake_cuda_live(NULL), live);
    fake_cuda_set_total(0);

    assert_int_equal(o->weight_shadow(be, &wf, &e), 0);
    assert_int_equal(fake_cuda_live(NULL), live);
    assert_int_equal(o->weight_shadow(be, &w, &e), 0);
    assert_int_equal(o->weight_shadow(be, &w, &e), 0);
    assert_int_equal(fake_cuda_live(NULL), live + 1);
    assert_int_equal(stream_count("cuda_dequantize"), 1);
    int64_t copy = fake_cuda_arg(stream_last("cuda_dequantize"), "dst");
    assert_int_equal(fake_cuda_arg(stream_last("cuda_dequantize"), "out"), 2);

    assert_int_equal(o->matmul(be, &w, x, y, M, &e), 0);
    assert_int_equal(stream_count("cuda_dequantize"), 1);
    assert_int_equal(fake_cuda_arg(stream_last("cublasGemmEx"), "w"), copy);
    assert_int_equal(o->matmul(be, &w, x, y, 1, &e), 0);
    assert_int_equal(fake_cuda_arg(stream_last("gemv_n"), "wtype"), MD_TYPE_Q8_0);
    assert_true(fake_cuda_arg(stream_last("gemv_n"), "w") != copy);

    void *old = *(void **)wb; /* md_buf's device pointer (its first member) */
    long live_before = fake_cuda_live(NULL);
    o->buf_free(be, wb);
    assert_int_equal(fake_cuda_live(NULL), live_before - 2); /* the weight and its copy */
    if (o->buf_wrap(be, host, N * rb, &wb, &e))
        fail_msg("wrap: %s", e.msg);
    printf("  a weight wrapped after the free %s the old address\n",
           *(void **)wb == old ? "reuses" : "does not reuse");
    w.buf = wb;
    assert_int_equal(o->matmul(be, &w, x, y, M, &e), 0);
    assert_int_equal(stream_count("cuda_dequantize"), 2); /* expanded into scratch */
    assert_true(fake_cuda_arg(stream_last("cublasGemmEx"), "w") != copy);
    assert_true(fake_cuda_arg(stream_last("cublasGemmEx"), "w") ==
                fake_cuda_arg(stream_last("cuda_dequantize"), "dst"));

    md_buf *all[] = {wb, fb, x, y};
    for (int i = 0; i < 4; i++)
        o->buf_free(be, all[i]);
    fake_cuda_stats st;
    fake_cuda_get_stats(&st);
    assert_int_equal(st.violations, 0);
    md_backend_free(be);
    fake_cuda_reset();
}

/* rope_kv checks what rope and kv_write check before it launches anything: a slot outside
 * the cache, an odd rotary width, buffers too small; a good call is one launch with the
 * step's positions and slots. */
static void test_rope_kv_refuses_bad_arguments(void **state) {
    direct d;
    direct_open(&d, "0");
    const md_backend_ops *o = d.be->ops;
    md_err e = {0};
    md_buf *k, *v, *inv;
    float theta[D_HD / 2];
    for (int i = 0; i < D_HD / 2; i++)
        theta[i] = 1.0f / (float)(i + 1);
    if (o->buf_alloc(d.be, (size_t)D_SEQS * D_HD * 4, &k, &e) ||
        o->buf_alloc(d.be, (size_t)D_SEQS * D_HD * 4, &v, &e) ||
        o->buf_alloc(d.be, sizeof theta, &inv, &e) ||
        o->buf_upload(d.be, inv, 0, theta, sizeof theta, &e))
        fail_msg("setup: %s", e.msg);
    direct_step(&d, D_SEQS, 20, 0);
    long before = stream_count("cuda_rope_kv");
    assert_int_equal(o->rope_kv(d.be, d.q, k, v, d.kc, d.vc, D_HEADS, 1, D_HD, D_HD - 1, inv, 0,
                                MD_TYPE_F16, &e),
                     MD_EINVAL);
    assert_int_equal(
        o->rope_kv(d.be, d.q, k, v, d.kc, d.vc, D_HEADS, 2, D_HD, D_HD, inv, 0, MD_TYPE_F16, &e),
        MD_ERANGE); /* k, v hold one kv head per token */
    assert_int_equal(
        o->rope_kv(d.be, d.q, k, v, d.kc, d.vc, D_HEADS, 1, D_HD, D_HD, inv, 0, 99, &e),
        MD_EUNSUPP);
    /* an F32 cache of the same bytes holds half the slots: the step's last slots fall out */
    assert_int_equal(
        o->rope_kv(d.be, d.q, k, v, d.kc, d.vc, D_HEADS, 1, D_HD, D_HD, inv, 0, MD_TYPE_F32, &e),
        MD_ERANGE);
    printf("  refused: %s\n", e.msg);
    assert_int_equal(stream_count("cuda_rope_kv"), before);
    assert_int_equal(o->rope_kv(d.be, d.q, k, v, d.kc, d.vc, D_HEADS, 1, D_HD, D_HD / 2, inv, 1,
                                MD_TYPE_F16, &e),
                     0);
    const fake_launch *l = stream_last("cuda_rope_kv");
    assert_non_null(l);
    assert_int_equal(fake_cuda_arg(l, "n_tokens"), D_SEQS);
    assert_int_equal(fake_cuda_arg(l, "rot_dim"), D_HD / 2);
    assert_int_equal(fake_cuda_arg(l, "neox"), 1);
    assert_int_equal(fake_cuda_arg(l, "n_kv_heads"), 1);
    o->buf_free(d.be, k);
    o->buf_free(d.be, v);
    o->buf_free(d.be, inv);
    fake_cuda_stats st;
    fake_cuda_get_stats(&st);
    assert_int_equal(st.violations, 0);
    direct_close(&d);
}

int main(void) {
    md_err e = {0};
    if (md_backend_register("fakecuda", open_fakecuda, &e)) {
        fprintf(stderr, "%s\n", e.msg);
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiny_graphs_launch_what_direct_steps_do),
        cmocka_unit_test(test_smollm2_graphs_launch_what_direct_steps_do),
        cmocka_unit_test(test_tiny_bf16_copies_replace_expansions),
        cmocka_unit_test(test_smollm2_bf16_copies_replace_expansions),
        cmocka_unit_test(test_scratch_growth_inside_capture_reruns),
        cmocka_unit_test(test_graphs_dropped_when_partials_move),
        cmocka_unit_test(test_replays_match_direct_steps_at_every_length),
        cmocka_unit_test(test_weight_shadow_made_used_and_dropped),
        cmocka_unit_test(test_rope_kv_refuses_bad_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
