/* test_cuda_host_emu.c — the CUDA backend's host logic (decode steps as CUDA graphs, the BF16
 * weight copies, the ops' argument checks) on the CPU emulator: the real backend_cuda.c,
 * ctx.cu, gemm.cu and kernels under the real engine, with emu_rt.cc's launch log (emu_log.h)
 * saying what the device executed: each kernel, GEMM and upload with its arguments, pointers
 * as (allocation, offset), taken when it runs, i.e. a replayed graph's frozen arguments at its
 * launch. Every pool buffer is an allocation of its own (MEDLEY_CUDA_POOL_EXACT=1, set in
 * main), so a launch naming a freed buffer is caught, and allocation ids compare across runs.
 *
 * The same workload (20 prompts of 3 to 185 tokens through 10 slots, different max_tokens,
 * greedy and seeded rows) runs with MEDLEY_CUDA_GRAPHS=0 and =1 on the tiny fixture model:
 * the log must be identical launch by launch, and the tokens and logprobs bit for bit (the
 * kernels compute here, so a replay that read stale metadata would answer differently): a
 * replay launches exactly what a direct step would have. Also: graphs were recorded and
 * replayed in every attention split bucket (64, 128, 256 positions) and on the cuBLAS path
 * (more than 8 sequences; the int8 tiled path is turned off, MEDLEY_CUDA_MMQ_MAX_M=0, so
 * those steps take cuBLAS); when the attention partials grow the graphs are dropped and
 * recorded again; captures the driver refuses (injected) re-run with the same launches and
 * tokens and never fail the device; no launch names memory outside live allocations, every
 * KV store stays inside the cache and every attention launch's block table names, at its
 * stride, the blocks the step's K/V went to (checked by a hook as each launch runs).
 *
 * Driven op by op (what the engine cannot produce on demand): scratch growing inside a capture
 * fails only that capture, the step re-runs directly and the key records at its next step; a
 * graph is never replayed after the partials moved; replays equal direct steps at every length
 * from 20 to 240 positions; weight_shadow's copies; rope_kv's refusals.
 *
 * Formerly tests/unit/test_cuda_host.c over a hand-written imitation of ctx.cu and gemm.cu
 * (tests/unit/fake_cuda.c), which had drifted from them (it knew no int8 tiled path). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "engine/engine.h"
#include "gpu/emu/emu_log.h"
#include "kernels/backend.h"
#include "kernels/cuda/backend_cuda.h"
#include "kernels/cuda/graph_cache.h"

#define GEN 30
#define PTR_ID(v) ((v) >> EMU_PTR_SHIFT)

/* ---- checks made as each launch runs (emu_log_set_hook) ----------------------------- */

static struct {
    long violations;
    char first[512];
    int64_t slots, n_slots; /* the latest KV store's slots (logged pointer) and their count */
} chk;

static void violation(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void violation(const char *fmt, ...) {
    if (chk.violations++ == 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(chk.first, sizeof chk.first, fmt, ap);
        va_end(ap);
    }
}

static size_t cache_elem(int64_t dtype) {
    return dtype == 0 ? 4 : 2; /* cuda_dtype: CUDA_F32 0, F16 1, BF16 2 */
}

/* k_rope_kv (q, k, v, kc, vc, ct, pos, slots, n_tokens, n_heads, n_kv_heads, head_dim, ...)
 * and k_kv_write (kc, vc, ct, k, v, slots, n_tokens, kv_dim): every slot inside the cache
 * (-1: a padding row, stored nowhere); the slots are the step's for the attention after. */
static void check_kv_store(const emu_launch_rec *l, int rope) {
    int64_t kc = l->a[rope ? 3 : 0], vc = l->a[rope ? 4 : 1], ct = l->a[rope ? 5 : 2];
    int64_t sl = l->a[rope ? 7 : 5], n = l->a[rope ? 8 : 6];
    int64_t kv_dim = rope ? l->a[10] * l->a[11] : l->a[7];
    size_t rk = 0, rv = 0, rs = 0;
    const char *k = emu_log_addr(kc, &rk), *v = emu_log_addr(vc, &rv);
    const int32_t *slots = emu_log_addr(sl, &rs);
    if (!k || !v || !slots || rs < (size_t)n * 4)
        return; /* emu_rt counted it as a bad pointer */
    size_t row = (size_t)kv_dim * cache_elem(ct), room = rk < rv ? rk : rv;
    for (int64_t t = 0; t < n; t++)
        if (slots[t] < -1 || (slots[t] >= 0 && ((size_t)slots[t] + 1) * row > room))
            violation("%s (step %ld): token %lld goes to slot %d outside the cache", l->name,
                      l->step, (long long)t, slots[t]);
    chk.slots = sl;
    chk.n_slots = n;
}

/* k_attn_dec / k_attn_pf / k_attn_pf_tc (kc, vc, n_kv_heads, block_tokens, q, entries,
 * block_table, max_blocks, ...), one entry per grid.x: the block each token's own position
 * reads is the block its K/V went to (slot / block_tokens of the latest KV store), so a block
 * table packed at the wrong stride or offset cannot pass; decode entries read blocks inside
 * the cache. */
static void check_attention(const emu_launch_rec *l, int dec) {
    int w = dec ? 3 : 4;
    int64_t n = l->grid[0], bt_tok = l->a[3], stride = l->a[7];
    size_t re = 0, rb = 0, rs = 0, rk = 0;
    const int32_t *ent = emu_log_addr(l->a[5], &re), *bt = emu_log_addr(l->a[6], &rb);
    const int32_t *slots = chk.slots ? emu_log_addr(chk.slots, &rs) : NULL;
    const char *kc = emu_log_addr(l->a[0], &rk);
    if (!ent || !bt || !kc || re < (size_t)(n * w) * 4 || bt_tok < 1) {
        violation("%s (step %ld): entries or block table not readable", l->name, l->step);
        return;
    }
    size_t block_bytes = (size_t)bt_tok * l->a[2] * 64 * 2; /* at least: head_dim >= 64, 16-bit */
    for (int64_t i = 0; i < n; i++) {
        const int32_t *x = ent + w * i;
        /* decode {row, sequence, length}: one token at length - 1; tile {sequence, first row,
         * tokens, first position} */
        int32_t s = dec ? x[1] : x[0], row0 = dec ? x[0] : x[1], cnt = dec ? 1 : x[2];
        int64_t pos0 = dec ? (int64_t)x[2] - 1 : x[3];
        if (dec) {
            int64_t nb = (x[2] + bt_tok - 1) / bt_tok;
            if (s < 0 || x[2] < 1 || nb > stride || ((size_t)s + 1) * stride * 4 > rb) {
                violation("%s (step %ld): entry %lld {row %d, sequence %d, length %d} outside "
                          "its buffers",
                          l->name, l->step, (long long)i, x[0], s, x[2]);
                continue;
            }
            for (int64_t k = 0; k < nb; k++)
                if (bt[s * stride + k] < 0 || ((size_t)bt[s * stride + k] + 1) * block_bytes > rk)
                    violation("%s (step %ld): entry %lld reads block %d outside the cache", l->name,
                              l->step, (long long)i, bt[s * stride + k]);
        }
        for (int32_t j = 0; slots && j < cnt; j++) {
            int64_t row = row0 + j, pos = pos0 + j, k = pos / bt_tok;
            if (s >= 0 && pos >= 0 && k >= stride) {
                violation("%s (step %ld): position %lld of sequence %d needs block %lld of a "
                          "block-table row of %lld",
                          l->name, l->step, (long long)pos, s, (long long)k, (long long)stride);
                continue;
            }
            if (row < 0 || row >= chk.n_slots || (size_t)chk.n_slots * 4 > rs || s < 0 || pos < 0 ||
                ((size_t)s * stride + k + 1) * 4 > rb)
                continue;
            if (slots[row] == -1)
                continue; /* a padding row: attends to whatever its entry names, read by no one */
            int32_t id = bt[s * stride + k];
            if ((int64_t)id * bt_tok + pos % bt_tok != slots[row])
                violation("%s (step %ld): sequence %d's block table (stride %lld) names block %d "
                          "for position %lld, whose K/V went to slot %d",
                          l->name, l->step, s, (long long)stride, id, (long long)pos, slots[row]);
        }
    }
}

static void check_launch(const emu_launch_rec *l, void *arg) {
    (void)arg;
    if (!strcmp(l->name, "k_rope_kv"))
        check_kv_store(l, 1);
    else if (!strcmp(l->name, "k_kv_write"))
        check_kv_store(l, 0);
    else if (!strcmp(l->name, "k_attn_dec"))
        check_attention(l, 1);
    else if (!strcmp(l->name, "k_attn_pf") || !strcmp(l->name, "k_attn_pf_tc"))
        check_attention(l, 0);
}

/* Start logging with the hook's checks; fail_every: every fail_every-th capture end refused. */
static void log_start(int fail_every) {
    memset(&chk, 0, sizeof chk);
    emu_log_start();
    emu_fail_capture_end(fail_every);
    emu_log_set_hook(check_launch, NULL);
}

/* No pointer outside live allocations, no hook violation. */
static void assert_clean(void) {
    emu_stats st;
    emu_get_stats(&st);
    if (st.bad_pointers)
        fail_msg("%ld launch arguments outside live allocations; first: %s", st.bad_pointers,
                 st.first_bad);
    if (chk.violations)
        fail_msg("%ld violations; first: %s", chk.violations, chk.first);
}

/* ---- the engine's workload ------------------------------------------------------------ */

/* Prompt i and its token count. The first ten stay under 64 positions: decode graphs of the
 * first split bucket are recorded while they run. Then three pass 128 positions and finish
 * soon (the attention partials grow for 4 splits, so every graph recorded so far is dropped),
 * and three decode from under 128 to past it with the same batch shape: bucket 128 is
 * recorded, then bucket 256 comes without any growth, so only the key tells the two apart.
 * The last four are short again: shapes of the first bucket come back after the growths.
 * (Half the tokens test_cuda_host generated on its fake device: the emulator computes them.)
 * The BF16-copy case runs the first ten alone, SHADOW_GEN tokens each. */
#define NP 20
#define NP_SHADOW 10
#define SHADOW_GEN 8
static const int prompt_len[NP] = {5,   12,  3,   30, 9,   20,  4, 14, 18, 7,
                                   140, 185, 130, 60, 100, 110, 6, 10, 8,  11};
static const int gen_len[NP] = {20, 17, 14, 11, 20, 17, 14, 11, 20, 17,
                                10, 12, 8,  20, 30, 30, 20, 20, 20, 20};
static int np_run = NP; /* prompts of this run: NP, or NP_SHADOW with SHADOW_GEN tokens */

static int make_prompt(int i, int vocab, int32_t *out) {
    int n = prompt_len[i];
    for (int k = 0; k < n; k++)
        out[k] = (int32_t)((1 + i * 131 + k * 17) % (vocab - 1)) + 1;
    return n;
}

static void sampling_for(int i, md_sampling *s) {
    md_sampling_default(s);
    s->max_tokens = np_run == NP ? gen_len[i] : SHADOW_GEN;
    s->ignore_eos = 1;
    if (i % 3 == 1) { /* seeded rows next to greedy ones (device argmax) */
        s->temperature = 0.8f;
        s->top_k = 40;
        s->seed = 77 + (uint64_t)i;
    }
    if (i % 3 == 2 || i % 6 == 1) { /* penalised rows with logprobs: the sample op's entries */
        s->frequency_penalty = 0.5f;
        s->repetition_penalty = i % 2 ? 1.2f : 1.0f;
        s->logprobs = 1;
    }
}

typedef struct {
    emu_launch_rec *l; /* the log, copied */
    size_t n;
    int32_t tok[NP][GEN];
    float lp[NP][GEN]; /* logprobs of the rows that ask for them, else 0 */
    emu_stats st;
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

/* np prompts (NP or NP_SHADOW); bf16: the engine's --bf16-weights (NULL: auto). */
static void run(const char *model, int np, const char *graphs, int fail_every, const char *bf16,
                run_out *o) {
    memset(o, 0, sizeof *o);
    np_run = np;
    setenv("MEDLEY_CUDA_GRAPHS", graphs, 1); /* read when the backend opens */
    log_start(fail_every);
    md_cuda_graph_totals t0, t1;
    md_cuda_graph_get_totals(&t0);
    md_engine_config cfg = {.model_path = model,
                            .device = "cuda:0",
                            .max_seqs = 10, /* 20 prompts through 10 slots; > 8: cuBLAS path */
                            .max_batch_tokens = 64,
                            .n_ctx = 256,
                            .bf16_weights = bf16};
    md_engine *eng;
    md_err e = {0};
    if (md_engine_open(&cfg, &eng, &e))
        fail_msg("engine open on the emulated device: %s", e.msg);
    int vocab = md_engine_n_vocab(eng);
    uint64_t ids[NP];
    for (int i = 0; i < np; i++) {
        int32_t p[256];
        int n = make_prompt(i, vocab, p);
        md_sampling s;
        sampling_for(i, &s);
        if (md_engine_submit(eng, p, n, &s, &ids[i], &e))
            fail_msg("submit: %s", e.msg);
    }
    int got[NP] = {0};
    for (;; o->steps++) {
        assert_true(o->steps < 10000);
        md_step_result r;
        if (md_engine_step(eng, &r, &e))
            fail_msg("step %ld (MEDLEY_CUDA_GRAPHS=%s): %s", o->steps, graphs, e.msg);
        for (int t = 0; t < r.n_tokens; t++)
            for (int i = 0; i < np; i++)
                if (ids[i] == r.tokens[t].seq_id && got[i] < GEN) {
                    md_sampling s;
                    sampling_for(i, &s);
                    o->lp[i][got[i]++] = s.logprobs ? r.tokens[t].logprob : 0.0f;
                }
        if (r.n_live == 0)
            break;
    }
    for (int i = 0; i < np; i++) {
        const int32_t *t;
        int n;
        md_sampling s;
        sampling_for(i, &s);
        if (md_seq_finish(eng, ids[i]) != MD_FINISH_LENGTH)
            fail_msg("prompt %d did not finish by length: %s", i, md_seq_error(eng, ids[i]));
        assert_int_equal(md_seq_tokens(eng, ids[i], &t, &n), 0);
        assert_int_equal(n, s.max_tokens);
        assert_int_equal(got[i], n);
        memcpy(o->tok[i], t, (size_t)n * sizeof *t);
    }
    close_and_read_log(eng, o);
    emu_log_stop();
    md_cuda_graph_get_totals(&t1);
    o->tot.recorded = t1.recorded - t0.recorded;
    o->tot.replayed = t1.replayed - t0.replayed;
    o->tot.reruns = t1.reruns - t0.reruns;
    emu_get_stats(&o->st);
    const emu_launch_rec *l = emu_log(&o->n);
    o->l = malloc((o->n ? o->n : 1) * sizeof *l);
    assert_non_null(o->l);
    memcpy(o->l, l, o->n * sizeof *l);
    printf("  MEDLEY_CUDA_GRAPHS=%s%s: %ld steps, %zu launches; graphs %ld recorded, %ld "
           "replayed, %ld re-run; captures %ld (%ld failed, %ld injected), %ld graphs freed "
           "mid-run, %ld captures after that; log: %ld dropped after scratch moved\n",
           graphs, fail_every ? " + refused captures" : "", o->steps, o->n, o->tot.recorded,
           o->tot.replayed, o->tot.reruns, o->st.captures, o->st.captures_failed,
           o->st.captures_injected, o->st.graphs_freed_running, o->st.captures_after_drop,
           o->log_dropped);
    assert_clean();
}

/* The two runs' launches must be equal one by one; on a difference, print it with the
 * launches before it. Tokens and logprobs bit for bit. */
static void same_launches(const run_out *direct, const run_out *graphed) {
    size_t n = direct->n < graphed->n ? direct->n : graphed->n;
    for (size_t i = 0; i < n; i++) {
        if (emu_launch_eq(&direct->l[i], &graphed->l[i]))
            continue;
        char a[1024], b[1024];
        for (size_t k = i >= 3 ? i - 3 : 0; k < i; k++) {
            emu_launch_format(&direct->l[k], a, sizeof a);
            printf("  launch %zu (both): %s\n", k, a);
        }
        emu_launch_format(&direct->l[i], a, sizeof a);
        emu_launch_format(&graphed->l[i], b, sizeof b);
        fail_msg("launch %zu differs:\n  direct:   %s\n  graphed:  %s", i, a, b);
    }
    if (direct->n != graphed->n)
        fail_msg("%zu launches run directly, %zu with graphs", direct->n, graphed->n);
    for (int i = 0; i < NP; i++) {
        assert_memory_equal(direct->tok[i], graphed->tok[i], sizeof direct->tok[i]);
        assert_memory_equal(direct->lp[i], graphed->lp[i], sizeof direct->lp[i]);
    }
}

/* Distinct values of argument `arg` of `fn` among launches that came from graphs. */
static int distinct_from_graphs(const run_out *o, const char *fn, int arg, int64_t *vals, int max) {
    int nv = 0;
    for (size_t i = 0; i < o->n; i++) {
        const emu_launch_rec *l = &o->l[i];
        if (!l->from_graph || strcmp(l->name, fn))
            continue;
        int64_t v = l->a[arg];
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
        n += o->l[i].step >= from_step && !strcmp(o->l[i].name, fn);
    return n;
}

/* argument positions in the log (the kernels' parameters, cuBLAS's for GEMMs) */
enum {
    DEC_MAX_BLOCKS = 7, /* k_attn_dec */
    DEC_N_SPLITS = 10,
    DEC_WORK = 11,
    ROPE_KV_N_TOKENS = 8, /* k_rope_kv */
    ROPE_KV_N_KV_HEADS = 10,
    ROPE_KV_ROT_DIM = 12,
    ROPE_KV_NEOX = 14,
    DQ_DST = 1, /* k_dequant (src, dst, out, groups) */
    DQ_OUT = 2,
    GEMM_A = 0, /* cublasGemmEx: A (the weight), A's type, B, C, m (weight rows), n, k, beta */
    GEMM_M = 4,
    GEMV_W0 = 0,         /* k_gemv_n: gemv_segs as 13 words (w[0] first), then row_bytes */
    GEMV_ROW_BYTES = 13, /* sizeof(gemv_segs) == 104 */
};

static void check_model(const char *model) {
    printf("%s\n", strrchr(model, '/') + 1);
    run_out direct, graphed, refused;
    run(model, NP, "0", 0, NULL, &direct);
    run(model, NP, "1", 0, NULL, &graphed);
    run(model, NP, "1", 2, NULL, &refused); /* every second capture refused by the "driver" */

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
    int n_split = distinct_from_graphs(&graphed, "k_attn_dec", DEC_N_SPLITS, v, 16);
    printf("  split counts replayed from graphs:");
    for (int i = 0; i < n_split; i++)
        printf(" %lld", (long long)v[i]);
    printf("\n");
    assert_true(n_split >= 3);
    assert_true(distinct_from_graphs(&graphed, "cublasGemmEx", GEMM_M, v, 16) >= 1);

    /* the block table's row stride follows the split bucket (64, 128, 256 positions: 4, 8, 16
     * blocks of 16), not the reserved width of n_ctx 256 in every step; the hook checks that
     * each row names the blocks the step's K/V went to at that stride */
    int n_stride = distinct_from_graphs(&graphed, "k_attn_dec", DEC_MAX_BLOCKS, v, 16);
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
    assert_true(count_fn(&direct, "k_sample", 0) > 0);
    assert_true(count_fn(&direct, "k_argmax", 0) > 0);

    /* each layer's RoPE and KV store ran as one rope_kv launch, in graphs too */
    assert_true(count_fn(&direct, "k_rope_kv", 0) > 0);
    assert_int_equal(count_fn(&direct, "k_rope", 0) + count_fn(&direct, "k_kv_write", 0), 0);
    int n_rows = distinct_from_graphs(&graphed, "k_rope_kv", ROPE_KV_N_TOKENS, v, 16);
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

static const char *tiny_model(void) {
    static char path[4096];
    snprintf(path, sizeof path, "%s/engine/tiny-llama3.gguf", MEDLEY_FIXTURES);
    return path;
}

static void test_tiny_graphs_launch_what_direct_steps_do(void **state) {
    check_model(tiny_model());
}

/* --bf16-weights on against off: at load one BF16 expansion per quantized matrix into memory
 * of its own; then no step expands a weight again, and every cuBLAS product (steps of more
 * than 8 tokens) reads one of those copies; the same launches otherwise (by count) and the
 * same tokens; closing the engine frees every copy (none is left for the pool to free). */
static void check_shadows(const char *model) {
    printf("%s, BF16 weight copies\n", strrchr(model, '/') + 1);
    run_out off, on;
    run(model, NP_SHADOW, "1", 0, "off", &off);
    run(model, NP_SHADOW, "1", 0, "on", &on);
    long dq_load = count_fn(&on, "k_dequant", 0) - count_fn(&on, "k_dequant", 1);
    printf("  copies made at load: %ld; expansions in steps: %ld with copies, %ld without; "
           "GemmEx %ld / %ld; left to the pool at close: %ld allocations, %zu bytes (%ld, %zu "
           "without copies)\n",
           dq_load, count_fn(&on, "k_dequant", 1), count_fn(&off, "k_dequant", 1),
           count_fn(&on, "cublasGemmEx", 1), count_fn(&off, "cublasGemmEx", 1), on.st.live_at_close,
           on.st.live_bytes_at_close, off.st.live_at_close, off.st.live_bytes_at_close);
    assert_int_equal(count_fn(&off, "k_dequant", 0), count_fn(&off, "k_dequant", 1));
    assert_true(dq_load > 0);
    assert_int_equal(count_fn(&on, "k_dequant", 1), 0);
    assert_true(count_fn(&off, "k_dequant", 1) > 0);
    /* every GemmEx of a step reads a copy made at load (out BF16 into an allocation of its own) */
    int64_t *copy = calloc((size_t)dq_load, sizeof *copy);
    assert_non_null(copy);
    long nc = 0, gemms = 0;
    for (size_t i = 0; i < on.n && on.l[i].step == 0; i++)
        if (!strcmp(on.l[i].name, "k_dequant") && nc < dq_load && on.l[i].a[DQ_OUT] == 2)
            copy[nc++] = on.l[i].a[DQ_DST];
    assert_int_equal(nc, dq_load);
    for (size_t i = 0; i < on.n; i++) {
        const emu_launch_rec *l = &on.l[i];
        if (l->step < 1 || strcmp(l->name, "cublasGemmEx"))
            continue;
        int64_t w = l->a[GEMM_A];
        long k = 0;
        while (k < nc && copy[k] != w)
            k++;
        if (k == nc)
            fail_msg("GemmEx at step %ld reads allocation #%lld, not a BF16 copy", l->step,
                     (long long)PTR_ID(w));
        gemms++;
    }
    assert_true(gemms > 0);
    assert_int_equal(gemms, count_fn(&off, "cublasGemmEx", 1));
    assert_int_equal(count_fn(&on, "k_rope_kv", 1), count_fn(&off, "k_rope_kv", 1));
    assert_int_equal(count_fn(&on, "k_gemv_n", 1), count_fn(&off, "k_gemv_n", 1));
    assert_int_equal(on.steps, off.steps);
    for (int i = 0; i < NP; i++)
        assert_memory_equal(on.tok[i], off.tok[i], sizeof on.tok[i]);
    /* the engine freed its buffers before the backend: the copies went with the weights' */
    assert_true(on.st.live_at_close <= 32);
    for (long i = 0; i < on.st.live_at_close; i++)
        for (long k = 0; k < nc; k++)
            if (on.st.live_ids_at_close[i] == PTR_ID(copy[k]))
                fail_msg("BF16 copy #%ld still live when the backend closed",
                         on.st.live_ids_at_close[i]);
    assert_true(on.st.live_at_close <= off.st.live_at_close); /* no scratch W with copies */
    free(copy);
    run_free(&off);
    run_free(&on);
}

static void test_tiny_bf16_copies_replace_expansions(void **state) {
    check_shadows(tiny_model());
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
    log_start(0);
    md_err e = {0};
    if (md_backend_open("cuda:0", 0, &d->be, &e))
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
    emu_log_stop();
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

/* The attention launches of the log, in order. */
static int attention_launches(const emu_launch_rec **out, int max) {
    size_t n;
    const emu_launch_rec *l = emu_log(&n);
    int k = 0;
    for (size_t i = 0; i < n && k < max; i++)
        if (!strcmp(l[i].name, "k_attn_dec"))
            out[k++] = &l[i];
    return k;
}

/* A capture whose attention needs more partials than ever before (its key's first step ran no
 * attention): the allocation is refused inside the capture (ctx.cu's pool: no cudaMalloc is
 * even tried), the capture fails and the step re-runs directly (the device not failed), the
 * partials grow, and the key is recorded at its next step and replayed with the new buffer. */
static void test_scratch_growth_inside_capture_reruns(void **state) {
    direct d;
    direct_open(&d, "1");
    md_cuda_graph_totals t0, t1;
    md_cuda_graph_get_totals(&t0);
    assert_int_equal(direct_step(&d, 2, 20, 0), 0); /* first sighting: direct */
    long live = emu_live_allocs(NULL);
    assert_int_equal(direct_step(&d, 2, 21, 1), MD_STEP_RERUN); /* capture refused the growth */
    assert_int_equal(emu_live_allocs(NULL), live + 1);          /* grown by the re-run, once */
    assert_int_equal(direct_step(&d, 2, 22, 1), 0);             /* recorded */
    assert_int_equal(direct_step(&d, 2, 23, 1), 0);             /* replayed */
    md_cuda_graph_get_totals(&t1);
    emu_stats st;
    emu_get_stats(&st);
    assert_clean();
    assert_int_equal(st.captures, 2); /* the refused one and the recorded one */
    assert_int_equal(st.graph_launches, 2);
    assert_int_equal(t1.reruns - t0.reruns, 1);
    assert_int_equal(t1.recorded - t0.recorded, 1);
    assert_int_equal(t1.replayed - t0.replayed, 1);
    const emu_launch_rec *a[8];
    assert_int_equal(attention_launches(a, 8), 3); /* re-run, recorded, replayed */
    assert_false(a[0]->from_graph);
    assert_true(a[1]->from_graph && a[2]->from_graph);
    assert_true(emu_launch_eq(a[0], a[1])); /* same arguments (other positions) */
    assert_int_equal(a[2]->a[DEC_WORK], a[0]->a[DEC_WORK]);
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
    emu_stats st;
    emu_get_stats(&st);
    assert_clean();
    const emu_launch_rec *a[8];
    int na = attention_launches(a, 8);
    assert_true(st.graphs_freed_running >= 1);
    assert_int_equal(na, 5);
    assert_int_equal(a[3]->a[DEC_N_SPLITS], 2);
    assert_true(a[3]->a[DEC_WORK] != a[0]->a[DEC_WORK]);
    /* the last bucket-64 step uses the grown buffer, whatever path it took */
    assert_int_equal(a[4]->a[DEC_WORK], a[3]->a[DEC_WORK]);
    assert_int_equal(a[4]->a[DEC_N_SPLITS], 1);
    direct_close(&d);
}

/* Decode steps growing one position at a time through every split bucket, graphs on and
 * off: the same launches (a graph recorded at 131 positions and replayed at 200 must split
 * the keys as a direct step at 200 does). */
static void test_replays_match_direct_steps_at_every_length(void **state) {
    emu_launch_rec *l[2];
    size_t n[2];
    for (int on = 0; on < 2; on++) {
        direct d;
        direct_open(&d, on ? "1" : "0");
        for (int p = 20; p < 240; p += 3)
            assert_int_equal(direct_step(&d, D_SEQS, p, 1), 0);
        emu_stats st;
        emu_get_stats(&st);
        assert_clean();
        const emu_launch_rec *s = emu_log(&n[on]);
        l[on] = malloc(n[on] * sizeof *s);
        assert_non_null(l[on]);
        memcpy(l[on], s, n[on] * sizeof *s);
        if (on)
            assert_true(st.graph_launches > 50);
        direct_close(&d);
    }
    assert_int_equal(n[0], n[1]);
    for (size_t i = 0; i < n[0]; i++)
        if (!emu_launch_eq(&l[0][i], &l[1][i])) {
            char a[1024], b[1024];
            emu_launch_format(&l[0][i], a, sizeof a);
            emu_launch_format(&l[1][i], b, sizeof b);
            fail_msg("launch %zu differs:\n  direct:   %s\n  graphed:  %s", i, a, b);
        }
    free(l[0]);
    free(l[1]);
}

/* Launches of fn in the log now. */
static long log_count(const char *fn) {
    size_t n;
    const emu_launch_rec *l = emu_log(&n);
    long k = 0;
    for (size_t i = 0; i < n; i++)
        k += !strcmp(l[i].name, fn);
    return k;
}

/* The last launch of fn in the log, or NULL. */
static const emu_launch_rec *log_last(const char *fn) {
    size_t n;
    const emu_launch_rec *l = emu_log(&n);
    while (n-- > 0)
        if (!strcmp(l[n].name, fn))
            return &l[n];
    return NULL;
}

/* weight_shadow on its own: out of memory refused with the bytes and nothing changed; a
 * copy made once (a second call and F32 weights: nothing done); products of more than 8 rows
 * read it, of 8 or fewer the quantized weight; freeing the weight's buffer frees the copy, and
 * a weight wrapped afterwards (glibc tends to hand back the same address) is expanded into
 * scratch again, never multiplied by the stale copy. The int8 tiled path is off
 * (MEDLEY_CUDA_MMQ_MAX_M=0), so 9 rows without a copy take cuBLAS on an expansion. */
static void test_weight_shadow_made_used_and_dropped(void **state) {
    setenv("MEDLEY_CUDA_GRAPHS", "0", 1);
    log_start(0);
    md_backend *be;
    md_err e = {0};
    if (md_backend_open("cuda:0", 0, &be, &e))
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
    long live = emu_live_allocs(&used);

    emu_set_total(used + 1000); /* the copy needs N * K * 2 = 2048 bytes */
    assert_int_equal(o->weight_shadow(be, &w, &e), MD_ENOMEM);
    printf("  refused: %s\n", e.msg);
    assert_non_null(strstr(e.msg, "2048 bytes"));
    assert_int_equal(emu_live_allocs(NULL), live);
    emu_set_total(0);

    assert_int_equal(o->weight_shadow(be, &wf, &e), 0);
    assert_int_equal(emu_live_allocs(NULL), live);
    assert_int_equal(o->weight_shadow(be, &w, &e), 0);
    assert_int_equal(o->weight_shadow(be, &w, &e), 0);
    assert_int_equal(emu_live_allocs(NULL), live + 1);
    assert_int_equal(log_count("k_dequant"), 1);
    int64_t copy = log_last("k_dequant")->a[DQ_DST];
    assert_int_equal(log_last("k_dequant")->a[DQ_OUT], 2); /* CUDA_BF16 */

    assert_int_equal(o->matmul(be, &w, x, y, M, &e), 0);
    assert_int_equal(log_count("k_dequant"), 1);
    assert_int_equal(log_last("cublasGemmEx")->a[GEMM_A], copy);
    assert_int_equal(o->matmul(be, &w, x, y, 1, &e), 0);
    assert_int_equal(log_last("k_gemv_n")->a[GEMV_ROW_BYTES], (int64_t)rb); /* Q8_0 rows */
    assert_true(log_last("k_gemv_n")->a[GEMV_W0] != copy);

    void *old = *(void **)wb; /* md_buf's device pointer (its first member) */
    long live_before = emu_live_allocs(NULL);
    o->buf_free(be, wb);
    assert_int_equal(emu_live_allocs(NULL), live_before - 2); /* the weight and its copy */
    if (o->buf_wrap(be, host, N * rb, &wb, &e))
        fail_msg("wrap: %s", e.msg);
    printf("  a weight wrapped after the free %s the old address\n",
           *(void **)wb == old ? "reuses" : "does not reuse");
    w.buf = wb;
    assert_int_equal(o->matmul(be, &w, x, y, M, &e), 0);
    assert_int_equal(log_count("k_dequant"), 2); /* expanded into scratch */
    assert_true(log_last("cublasGemmEx")->a[GEMM_A] != copy);
    assert_true(log_last("cublasGemmEx")->a[GEMM_A] == log_last("k_dequant")->a[DQ_DST]);

    md_buf *all[] = {wb, fb, x, y};
    for (int i = 0; i < 4; i++)
        o->buf_free(be, all[i]);
    assert_clean();
    md_backend_free(be);
    emu_log_stop();
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
    long before = log_count("k_rope_kv");
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
    assert_int_equal(log_count("k_rope_kv"), before);
    assert_int_equal(o->rope_kv(d.be, d.q, k, v, d.kc, d.vc, D_HEADS, 1, D_HD, D_HD / 2, inv, 1,
                                MD_TYPE_F16, &e),
                     0);
    const emu_launch_rec *l = log_last("k_rope_kv");
    assert_non_null(l);
    assert_int_equal(l->a[ROPE_KV_N_TOKENS], D_SEQS);
    assert_int_equal(l->a[ROPE_KV_ROT_DIM], D_HD / 2);
    assert_int_equal(l->a[ROPE_KV_NEOX], 1);
    assert_int_equal(l->a[ROPE_KV_N_KV_HEADS], 1);
    o->buf_free(d.be, k);
    o->buf_free(d.be, v);
    o->buf_free(d.be, inv);
    assert_clean();
    direct_close(&d);
}

int main(void) {
    /* before any context opens: every pool buffer its own allocation (freed ones are caught,
     * ids compare across runs), and steps of more than 8 rows on cuBLAS */
    setenv("MEDLEY_CUDA_POOL_EXACT", "1", 1);
    setenv("MEDLEY_CUDA_MMQ_MAX_M", "0", 1);
    if (getenv("MEDLEY_TEST_FILTER"))
        cmocka_set_test_filter(getenv("MEDLEY_TEST_FILTER"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiny_graphs_launch_what_direct_steps_do),
        cmocka_unit_test(test_tiny_bf16_copies_replace_expansions),
        cmocka_unit_test(test_scratch_growth_inside_capture_reruns),
        cmocka_unit_test(test_graphs_dropped_when_partials_move),
        cmocka_unit_test(test_replays_match_direct_steps_at_every_length),
        cmocka_unit_test(test_weight_shadow_made_used_and_dropped),
        cmocka_unit_test(test_rope_kv_refuses_bad_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
