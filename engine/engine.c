/* engine.c — the continuous-batching loop (docs/design.md §5): sequences wait, are admitted,
 * run in chunks that mix prefill and decode in one forward pass per step, share prompt-prefix
 * KV blocks, are preempted (blocks released, recomputed later) when the KV budget runs out,
 * and finish on EOS, a stop string, max_tokens or the context limit.
 *
 * A sequence is its token list (prompt + generated) and how many of those have K/V in the
 * cache (n_computed). Each step gives every running sequence the next chunk of its uncomputed
 * tokens (one token when decoding); when a chunk reaches the end of the list, the step's
 * logits at that row pick the next token. Prefill and decode are therefore one code path, and
 * a preempted sequence resumes by recomputing its list: its sampler state (random stream,
 * penalties) is kept, so it produces exactly the tokens it would have produced.
 *
 * Scheduling order is admission order: older sequences get budget and blocks first; when
 * blocks run out, the newest running sequence is preempted (vLLM's recompute policy). */
#define _GNU_SOURCE /* memmem */
#include "engine/engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"
#include "engine/weights/gguf.h"
#include "engine/weights/hf_model.h"
#include "engine/kvcache.h"
#include "engine/model/model.h"
#include "engine/shard/pipeline.h"
#include "engine/sampler.h"
#include "engine/weights/synth.h"

_Static_assert(MD_SAMPLE_TOP == MD_TOP_LOGPROBS, "backend.h and engine.h top logprobs");
#include "engine/tokenizer/tokenizer.h"

enum { SEQ_WAITING, SEQ_RUNNING, SEQ_DONE };

typedef struct {
    uint64_t id;
    int state;
    md_sampling s;
    char **stop; /* owned copies */
    int n_stop;
    size_t max_stop_len;
    int32_t *toks; /* [cap] prompt then generated */
    int n_toks, cap, n_prompt;
    int n_computed;  /* tokens with K/V in the cache */
    int32_t *blocks; /* [max_blocks] block table */
    int n_blocks;
    uint64_t *bhash; /* [max_blocks] prefix hash of each published block */
    int n_published; /* leading blocks in the prefix index */
    smp_rng rng;
    tok_stream ts;
    char *text;
    size_t text_len, text_cap;
    md_finish finish;
    int cancel;
    int released; /* freed at the next step once finished */
    int text_cut; /* a stop string ended the text */
    int chunk;    /* tokens scheduled this step */
    int cached_prompt;
    int preemptions;
    uint64_t t_submit, t_admit, t_first, t_done;
    char err[512];
} seq;

struct md_engine {
    md_engine_config cfg;
    gguf_file *gf;
    int kv_type; /* KV cache element type (MD_TYPE_*) */
    int shadows; /* BF16 copies of the quantized weights requested (want_shadows) */
    void *synth; /* a synthetic model's GGUF image (synth.h), or NULL */
    size_t synth_len;
    tok_tokenizer *tok;
    md_backend *be; /* NULL when sharded */
    md_model *m;    /* NULL when sharded */
    md_pipe *pipe;  /* the stages of a sharded model, else NULL */
    md_hparams hp;  /* from the metadata */
    kv_cache *kv;
    md_kv_bufs kvb;
    md_fwd fwd;
    smp_scratch *sc;
    int n_vocab, n_ctx, bs, max_blocks, max_seqs, max_batch;
    uint64_t next_id;
    seq **all; /* every unreleased sequence */
    int n_all, cap_all;
    seq **running; /* [max_seqs] admission order */
    int n_running;
    seq **waiting; /* FIFO, preempted ones go to the front */
    int n_waiting, cap_waiting;
    /* step scratch, sized at open */
    int32_t *b_tokens, *b_seq, *b_pos, *b_slot, *b_seq_len, *b_table, *b_logit_rows;
    seq **b_seqs;
    float *logits;               /* [max_seqs, n_vocab] */
    int32_t *b_argmax;           /* [max_seqs] device greedy picks */
    int32_t *b_sampled;          /* [max_seqs] device draws (backend sample op) */
    md_sample_params *b_sparams; /* [max_seqs] their parameters */
    float *b_lp;                 /* [max_seqs] their logprobs */
    int32_t *b_top_tok;          /* [max_seqs, MD_TOP_LOGPROBS] their alternatives */
    float *b_top_lp;
    md_sample_pen *b_pen; /* their penalty entries, grown on demand */
    size_t cap_pen;
    md_step_token *out_toks;
    uint64_t *finished;
    int cap_finished;
    char *piece; /* tok_stream_push output */
    md_engine_stats st;
};

static seq *find_seq(const md_engine *eng, uint64_t id) {
    for (int i = 0; i < eng->n_all; i++)
        if (eng->all[i]->id == id)
            return eng->all[i];
    return NULL;
}

static void seq_free(seq *q) {
    if (!q)
        return;
    for (int i = 0; i < q->n_stop; i++)
        free(q->stop[i]);
    free(q->stop);
    free(q->toks);
    free(q->blocks);
    free(q->bhash);
    free(q->text);
    free(q);
}

/* Whether to keep BF16 copies of the quantized weights (backend.h weight_shadow): "on",
 * "off", or "auto" (NULL): on a backend that has the op and reports its memory, when the
 * weights and the copies take at most half of what is free before loading, so batched
 * steps multiply by BF16 matrices instead of expanding each quantized one at every step
 * while the KV cache keeps most of the device. */
static int want_shadows(md_engine *eng, const char *mode, int have_mem, size_t avail,
                        size_t weights, size_t shadows, md_err *e) {
    eng->shadows = 0;
    if (mode && strcmp(mode, "auto") && strcmp(mode, "on") && strcmp(mode, "off"))
        return md_errf(e, MD_EINVAL, "BF16 weight copies \"%s\": expected auto, on or off", mode);
    if (!eng->be->ops->weight_shadow || shadows == 0 || (mode && !strcmp(mode, "off")))
        return 0;
    if (mode && !strcmp(mode, "on"))
        eng->shadows = 1;
    else
        eng->shadows = have_mem && weights + shadows <= avail / 2;
    return 0;
}

/* The BF16 copy of one matrix; *full set when the device ran out (a warning, not an error:
 * the copies made so far stay, the rest multiply from their quantized form). */
static int shadow_one(md_engine *eng, const md_tensor *w, size_t *made, int *full, md_err *e) {
    int rc = eng->be->ops->weight_shadow(eng->be, w, e);
    if (rc == MD_ENOMEM) {
        MD_WARN("engine", "BF16 weight copies stop after %.1f MiB: %s", *made / 1048576.0, e->msg);
        md_err_clear(e);
        *full = 1;
        return 0;
    }
    if (rc == 0 && w->type != MD_TYPE_F32 && w->type != MD_TYPE_F16 && w->type != MD_TYPE_BF16)
        *made += (size_t)w->ne0 * w->ne1 * 2;
    return rc;
}

/* The BF16 copies of every matrix a product reads: the layers' seven and the output head. */
static int make_shadows(md_engine *eng, md_err *e) {
    md_model *m = eng->m;
    size_t made = 0;
    int full = 0, rc = 0;
    for (int l = 0; l < m->hp.n_layer && !full && rc == 0; l++) {
        const md_layer *L = &m->layers[l];
        const md_tensor *w[7] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (int i = 0; i < 7 && !full && rc == 0; i++)
            rc = shadow_one(eng, w[i], &made, &full, e);
    }
    if (!full && rc == 0)
        rc = shadow_one(eng, &m->output, &made, &full, e);
    if (rc)
        return md_errctx(e, "BF16 weight copies: ");
    MD_INFO("engine", "BF16 copies of the quantized weights for batched steps: %.1f MiB",
            made / 1048576.0);
    return 0;
}

/* Open the model file at path into *gf: a GGUF file, an HF directory (hf_model.h), or a synthetic
 * model's image built into *synth (synth.h; with random weights when `weights`, metadata only
 * otherwise), which must outlive *gf and is freed with md_synth_free. */
static int open_model_file(const char *path, int weights, void **synth, size_t *synth_len,
                           gguf_file **gf, md_err *e) {
    if (!md_synth_is(path))
        return md_model_open(path, gf, e);
    int rc = md_synth_build(path, weights, synth, synth_len, e);
    return rc ? rc : gguf_open_mem(*synth, *synth_len, gf, e);
}

int md_engine_model_facts(const char *path, md_model_facts *out, md_err *e) {
    memset(out, 0, sizeof *out);
    gguf_file *gf = NULL;
    void *synth = NULL;
    size_t synth_len = 0;
    md_hparams hp;
    int rc = open_model_file(path, 0, &synth, &synth_len, &gf, e);
    if (rc == 0 && (rc = md_hparams_read(gf, &hp, e)) == 0) {
        const gguf_tensor *wq = gguf_find_tensor(gf, "blk.0.attn_q.weight");
        const char *type = wq ? md_type_name(wq->type) : NULL;
        snprintf(out->weight_type, sizeof out->weight_type, "%s", type ? type : "unknown");
        out->n_ctx_train = hp.n_ctx_train;
        out->kv_bytes_per_token_f32 = md_kv_bytes_per_token(&hp, MD_TYPE_F32);
    }
    gguf_close(gf);
    md_synth_free(synth, synth_len);
    return rc;
}

/* Batch sizes: the configuration's, else the backend's, else a CPU's. */
static void size_batches(md_engine *eng) {
    const md_engine_config *cfg = &eng->cfg;
    const md_backend_ops *bo = eng->be ? eng->be->ops : NULL;
    eng->max_seqs = cfg->max_seqs                ? cfg->max_seqs
                    : bo && bo->default_max_seqs ? bo->default_max_seqs
                                                 : 64;
    eng->max_batch = cfg->max_batch_tokens           ? cfg->max_batch_tokens
                     : bo && bo->default_step_tokens ? bo->default_step_tokens
                                                     : 512;
    if (eng->max_batch < eng->max_seqs)
        eng->max_batch = eng->max_seqs; /* every running sequence can decode each step */
}

/* The KV cache's element type: the configuration's, else the backend's. */
static int pick_kv_type(md_engine *eng, md_err *e) {
    const md_engine_config *cfg = &eng->cfg;
    if (cfg->kv_type && strcmp(cfg->kv_type, "f16") && strcmp(cfg->kv_type, "f32"))
        return md_errf(e, MD_EINVAL, "KV cache type \"%s\": expected f16 or f32", cfg->kv_type);
    eng->kv_type = !cfg->kv_type ? (eng->be ? eng->be->ops->kv_cache_type : MD_TYPE_F16)
                   : !strcmp(cfg->kv_type, "f16") ? MD_TYPE_F16
                                                  : MD_TYPE_F32;
    return 0;
}

/* Bytes of the weights as the backend holds them (*weights), of the largest quantized matrix
 * as BF16 (*widest_q), and of BF16 copies of the quantized matrices a product reads
 * (*shadows). */
static void weight_bytes(const md_engine *eng, size_t *weights, size_t *widest_q, size_t *shadows) {
    int tied = gguf_find_tensor(eng->gf, "output.weight") == NULL;
    int f32 = eng->be->ops->weights_f32; /* an exact backend: every weight as F32 */
    for (int64_t i = 0; i < gguf_n_tensors(eng->gf); i++) {
        const gguf_tensor *t = gguf_tensor_at(eng->gf, i);
        *weights += f32 ? (size_t)t->n_elements * 4 : t->n_bytes;
        if (f32 || t->type == MD_TYPE_F32 || t->type == MD_TYPE_F16 || t->type == MD_TYPE_BF16)
            continue;
        if ((size_t)t->n_elements * 2 > *widest_q)
            *widest_q = (size_t)t->n_elements * 2;
        if (tied || strcmp(t->name, "token_embd.weight")) /* a matrix some product reads */
            *shadows += (size_t)t->n_elements * 2;
    }
}

/* The KV budget when the configuration gives none (bytes): enough for every sequence at full
 * length, capped at 1 GiB on the host; on a device that reports its memory (avail bytes free),
 * up to 90% of what the weights (and their BF16 copies) leave, less 1 GiB for activations and
 * less the GEMM scratch a quantized matrix expands into for steps of many tokens (as vLLM's
 * gpu_memory_utilization). */
static size_t default_kv_budget(const md_engine *eng, size_t per_tok, int have_mem, size_t avail,
                                size_t weights, size_t shadows, size_t widest_q) {
    size_t all = per_tok * (size_t)eng->n_ctx * eng->max_seqs, cap = (size_t)1 << 30;
    if (have_mem && avail > weights + shadows) {
        size_t dev = (size_t)((avail - weights - shadows) * 0.9), keep = cap + widest_q;
        dev = dev > keep ? dev - keep : 0;
        if (dev > cap)
            cap = dev;
    }
    return all < cap ? all : cap;
}

/* Refuse a model that does not fit the device before loading it, with the numbers. */
static int check_fits(md_engine *eng, size_t weights, size_t shadows, size_t kv_bytes, md_err *e) {
    if (!eng->be->ops->check_fits)
        return 0;
    char what[1024];
    char sh[64] = "";
    if (shadows)
        snprintf(sh, sizeof sh, " + BF16 copies %.2f GiB", shadows / 1073741824.0);
    snprintf(what, sizeof what, "%s (weights %.2f GiB%s + KV cache %.2f GiB)", eng->cfg.model_path,
             weights / 1073741824.0, sh, kv_bytes / 1073741824.0);
    return eng->be->ops->check_fits(eng->be, weights + shadows + kv_bytes, what, e);
}

/* The KV cache of n_blocks blocks, the forward pass's buffers and the backend's reservation
 * for the largest step. */
static int reserve(md_engine *eng, size_t n_blocks, md_err *e) {
    const md_hparams *hp = &eng->m->hp;
    md_reserve r = {.max_tokens = eng->max_batch,
                    .max_seqs = eng->max_seqs,
                    .max_cols = hp->n_ff > hp->n_embd ? hp->n_ff : hp->n_embd,
                    .max_ctx = eng->n_ctx,
                    .max_blocks = eng->max_blocks,
                    .n_heads = hp->n_head};
    if (hp->n_head * hp->head_dim > r.max_cols)
        r.max_cols = hp->n_head * hp->head_dim;
    int rc;
    if ((rc = kv_create((int)n_blocks, eng->bs, &eng->kv, e)) ||
        (rc = md_kv_bufs_alloc_type(eng->m, (int)n_blocks * eng->bs, eng->kv_type, &eng->kvb, e)) ||
        (rc = md_fwd_alloc(eng->m, eng->max_batch, eng->max_seqs, &eng->fwd, e)) ||
        (rc = eng->be->ops->reserve(eng->be, &r, e)))
        return rc;
    return 0;
}

/* The step scratch, sized for max_batch tokens of max_seqs sequences. */
static int alloc_step_buffers(md_engine *eng, md_err *e) {
    size_t T = (size_t)eng->max_batch, S = (size_t)eng->max_seqs;
    eng->sc = smp_scratch_new(eng->n_vocab);
    eng->running = calloc(S, sizeof *eng->running);
    eng->b_tokens = malloc(T * sizeof(int32_t));
    eng->b_seq = malloc(T * sizeof(int32_t));
    eng->b_pos = malloc(T * sizeof(int32_t));
    eng->b_slot = malloc(T * sizeof(int32_t));
    eng->b_seq_len = malloc(S * sizeof(int32_t));
    /* uploaded whole: no stale bytes */
    eng->b_table = calloc(S * eng->max_blocks, sizeof(int32_t));
    eng->b_logit_rows = malloc(S * sizeof(int32_t));
    eng->b_seqs = malloc(S * sizeof(seq *));
    eng->logits = malloc(S * eng->n_vocab * sizeof(float));
    eng->b_argmax = malloc(S * sizeof(int32_t));
    eng->b_sampled = malloc(S * sizeof(int32_t));
    eng->b_sparams = malloc(S * sizeof(md_sample_params));
    eng->b_lp = malloc(S * sizeof(float));
    eng->b_top_tok = malloc(S * MD_TOP_LOGPROBS * sizeof(int32_t));
    eng->b_top_lp = malloc(S * MD_TOP_LOGPROBS * sizeof(float));
    eng->out_toks = malloc(S * sizeof(md_step_token));
    eng->piece = malloc(1024);
    if (!eng->sc || !eng->running || !eng->b_tokens || !eng->b_seq || !eng->b_pos || !eng->b_slot ||
        !eng->b_seq_len || !eng->b_table || !eng->b_logit_rows || !eng->b_seqs || !eng->logits ||
        !eng->b_argmax || !eng->b_sampled || !eng->b_sparams || !eng->b_lp || !eng->b_top_tok ||
        !eng->b_top_lp || !eng->out_toks || !eng->piece)
        return md_errf(e, MD_ENOMEM, "engine: out of memory for step buffers");
    return 0;
}

/* A sharded model (cfg->stages, or cfg->tp > 1 on one device): the head keeps the tokenizer,
 * the scheduler, the block tables and the sampler; the stages (engine/shard/pipeline.h) hold the
 * weights and the KV cache of their layers. Sizes as for one device, with a CPU's defaults;
 * the KV budget (default: every sequence at full length, at most 1 GiB) is over all layers,
 * each stage holding its layers' share. */
static int open_sharded(md_engine *eng, md_err *e) {
    const md_engine_config *cfg = &eng->cfg;
    char one[128];
    const char *spec = cfg->stages;
    if (!spec) { /* the whole model as one stage; "cuda:0,cuda:1": the ranks' devices */
        snprintf(one, sizeof one, "%s:0-%d", cfg->device ? cfg->device : "cpu",
                 eng->hp.n_layer - 1);
        for (char *c = one; (c = strchr(c, ',')); c++)
            *c = '+';
        spec = one;
    }
    md_stage_spec sp[MD_STAGE_MAX];
    int n, rc;
    md_hparams hp;
    if ((rc = md_stages_parse(spec, eng->hp.n_layer, sp, MD_STAGE_MAX, &n, e)) ||
        (rc = md_model_shape(cfg->model_path, &hp, e)))
        return md_errctx(e, "stages of %s: ", cfg->model_path);
    eng->hp.n_vocab = hp.n_vocab;
    size_batches(eng);
    if ((rc = pick_kv_type(eng, e)))
        return rc;
    size_t per_tok = md_kv_bytes_per_token(&eng->hp, eng->kv_type);
    size_t budget = cfg->kv_budget_bytes;
    if (budget == 0)
        budget = default_kv_budget(eng, per_tok, 0, 0, 0, 0, 0);
    size_t n_blocks = budget / (per_tok * eng->bs);
    if (n_blocks < 1 || n_blocks > (1u << 26))
        return md_errf(e, MD_ERANGE,
                       "KV budget of %zu bytes holds %zu blocks of %d tokens (%zu bytes each)",
                       budget, n_blocks, eng->bs, per_tok * eng->bs);
    md_stage_config base = {.kv_type = cfg->kv_type ? eng->kv_type : 0,
                            .n_threads = cfg->n_threads,
                            .n_slots = (int)n_blocks * eng->bs,
                            .max_tokens = eng->max_batch,
                            .max_seqs = eng->max_seqs,
                            .max_blocks = eng->max_blocks,
                            .block_tokens = eng->bs,
                            .n_ctx = eng->n_ctx};
    const char *name = cfg->model_name ? cfg->model_name : cfg->model_path;
    if (strlen(name) >= sizeof base.model)
        return md_errf(e, MD_EINVAL, "model name too long for a stage: %s", name);
    snprintf(base.model, sizeof base.model, "%s", name);
    if ((rc = md_model_hash(cfg->model_path, &base.model_hash, e)))
        return rc;
    md_pipe_opts o = {.microbatches = cfg->microbatches,
                      .timeout_ms = cfg->stage_timeout_ms,
                      .tp = cfg->tp,
                      .mem_cap = cfg->stage_mem_cap};
    if ((rc = md_pipe_open(sp, n, &base, &o, &eng->pipe, e)))
        return md_errctx(e, "loading %s: ", cfg->model_path);
    eng->n_vocab = eng->hp.n_vocab;
    if (tok_n_vocab(eng->tok) > eng->n_vocab)
        return md_errf(e, MD_EFORMAT, "%s: tokenizer has %d tokens, the output head %d",
                       cfg->model_path, tok_n_vocab(eng->tok), eng->n_vocab);
    if ((rc = kv_create((int)n_blocks, eng->bs, &eng->kv, e)) || (rc = alloc_step_buffers(eng, e)))
        return rc;
    MD_INFO("engine",
            "%s: %s, %d layers, width %d, context %d; KV %zu blocks x %d tokens (%.0f MiB over "
            "the stages); %d seqs, %d tokens per step; %d stages: %s",
            cfg->model_path, eng->hp.arch, eng->hp.n_layer, eng->hp.n_embd, eng->n_ctx, n_blocks,
            eng->bs, (double)(n_blocks * eng->bs * per_tok) / (1 << 20), eng->max_seqs,
            eng->max_batch, n, md_pipe_describe(eng->pipe));
    return 0;
}

int md_engine_open(const md_engine_config *cfg_in, md_engine **out, md_err *e) {
    *out = NULL;
    md_engine *eng = calloc(1, sizeof *eng);
    if (!eng)
        return md_errf(e, MD_ENOMEM, "out of memory");
    eng->cfg = *cfg_in;
    md_engine_config *cfg = &eng->cfg;
    int rc;
    if (!cfg->model_path) {
        rc = md_errf(e, MD_EINVAL, "engine: no model path");
        goto fail;
    }
    if (cfg->n_threads < 0 || cfg->max_seqs < 0 || cfg->max_batch_tokens < 0 ||
        cfg->kv_block_tokens < 0 || cfg->n_ctx < 0) {
        rc = md_errf(e, MD_EINVAL, "engine: negative size in the configuration");
        goto fail;
    }
    md_hparams hpf; /* from the metadata: sizes are known before any weight is loaded */
    /* a synthetic model (synth.h) gets random weights */
    rc = open_model_file(cfg->model_path, 1, &eng->synth, &eng->synth_len, &eng->gf, e);
    if (rc || (rc = md_model_tokenizer(eng->gf, &eng->tok, e)) ||
        (rc = tok_chat_choose(eng->tok, cfg->chat_template, e)) ||
        (rc = md_hparams_read(eng->gf, &hpf, e))) {
        md_errctx(e, "loading %s: ", cfg->model_path);
        goto fail;
    }
    eng->n_ctx = cfg->n_ctx ? cfg->n_ctx : hpf.n_ctx_train;
    if (eng->n_ctx > hpf.n_ctx_train)
        eng->n_ctx = hpf.n_ctx_train;
    eng->bs = cfg->kv_block_tokens ? cfg->kv_block_tokens : 16;
    eng->max_blocks = (eng->n_ctx + eng->bs - 1) / eng->bs;
    eng->hp = hpf;
    if (cfg->stages || cfg->tp > 1 || cfg->stage_mem_cap) {
        if ((rc = open_sharded(eng, e)))
            goto fail;
        goto opened;
    }
    if ((rc = md_backend_open(cfg->device, cfg->n_threads, &eng->be, e))) {
        md_errctx(e, "loading %s: ", cfg->model_path);
        goto fail;
    }
    size_batches(eng);
    if ((rc = pick_kv_type(eng, e)))
        goto fail;
    /* a model the backend's attention cannot run is refused now, with nothing loaded */
    const md_backend_ops *bo = eng->be->ops;
    if (bo->check_attention && (rc = bo->check_attention(eng->be, hpf.n_head, hpf.n_head_kv,
                                                         hpf.head_dim, eng->kv_type, e))) {
        md_errctx(e, "loading %s on %s: ", cfg->model_path, bo->name);
        goto fail;
    }
    size_t per_tok = md_kv_bytes_per_token(&hpf, eng->kv_type);
    size_t budget = cfg->kv_budget_bytes;
    size_t weights = 0, widest_q = 0, shadows = 0;
    weight_bytes(eng, &weights, &widest_q, &shadows);
    size_t avail = 0, total = 0;
    md_err me = {0};
    int have_mem =
        eng->be->ops->mem_info && eng->be->ops->mem_info(eng->be, &avail, &total, &me) == 0;
    if ((rc = want_shadows(eng, cfg->bf16_weights, have_mem, avail, weights, shadows, e)))
        goto fail;
    if (!eng->shadows)
        shadows = 0;
    if (budget == 0)
        budget = default_kv_budget(eng, per_tok, have_mem, avail, weights, shadows, widest_q);
    size_t n_blocks = budget / (per_tok * eng->bs);
    size_t kv_bytes = n_blocks * eng->bs * per_tok;
    if ((rc = check_fits(eng, weights, shadows, kv_bytes, e)))
        goto fail;
    if (n_blocks < 1 || n_blocks > (1u << 26)) {
        rc = md_errf(e, MD_ERANGE,
                     "KV budget of %zu bytes holds %zu blocks of %d tokens (%zu bytes each)",
                     budget, n_blocks, eng->bs, per_tok * eng->bs);
        goto fail;
    }
    if ((rc = md_model_load(eng->gf, eng->be, &eng->m, e))) {
        md_errctx(e, "loading %s: ", cfg->model_path);
        goto fail;
    }
    if (eng->shadows && (rc = make_shadows(eng, e)))
        goto fail;
    const md_hparams *hp = &eng->m->hp;
    eng->n_vocab = hp->n_vocab;
    if (tok_n_vocab(eng->tok) > eng->n_vocab) {
        rc = md_errf(e, MD_EFORMAT, "%s: tokenizer has %d tokens, the output head %d",
                     cfg->model_path, tok_n_vocab(eng->tok), eng->n_vocab);
        goto fail;
    }
    if ((rc = reserve(eng, n_blocks, e)) || (rc = alloc_step_buffers(eng, e)))
        goto fail;
    eng->hp = *hp;
    MD_INFO("engine",
            "%s: %s, %d layers, width %d, context %d; KV %zu blocks x %d tokens (%.0f MiB, %s); "
            "%d seqs, %d tokens per step; %s",
            cfg->model_path, hp->arch, hp->n_layer, hp->n_embd, eng->n_ctx, n_blocks, eng->bs,
            (double)(n_blocks * eng->bs * per_tok) / (1 << 20),
            eng->kv_type == MD_TYPE_F16    ? "f16"
            : eng->kv_type == MD_TYPE_BF16 ? "bf16"
                                           : "f32",
            eng->max_seqs, eng->max_batch, eng->be->ops->describe(eng->be));
opened:
    *out = eng;
    return 0;
fail:
    md_engine_close(eng);
    return rc;
}

void md_engine_close(md_engine *eng) {
    if (!eng)
        return;
    for (int i = 0; i < eng->n_all; i++)
        seq_free(eng->all[i]);
    free(eng->all);
    free(eng->running);
    free(eng->waiting);
    if (eng->m) {
        md_fwd_free(eng->m, &eng->fwd);
        md_kv_bufs_free(eng->m, &eng->kvb);
        md_model_free(eng->m);
    }
    md_backend_free(eng->be);
    md_pipe_close(eng->pipe);
    kv_free(eng->kv);
    tok_free(eng->tok);
    gguf_close(eng->gf);
    md_synth_free(eng->synth, eng->synth_len);
    smp_scratch_free(eng->sc);
    free(eng->b_tokens);
    free(eng->b_seq);
    free(eng->b_pos);
    free(eng->b_slot);
    free(eng->b_seq_len);
    free(eng->b_table);
    free(eng->b_logit_rows);
    free(eng->b_seqs);
    free(eng->logits);
    free(eng->b_argmax);
    free(eng->b_sampled);
    free(eng->b_sparams);
    free(eng->b_lp);
    free(eng->b_top_tok);
    free(eng->b_top_lp);
    free(eng->b_pen);
    free(eng->out_toks);
    free(eng->finished);
    free(eng->piece);
    free(eng);
}

int md_engine_n_ctx(const md_engine *eng) {
    return eng->n_ctx;
}
int md_engine_n_vocab(const md_engine *eng) {
    return eng->n_vocab;
}
int md_engine_max_seqs(const md_engine *eng) {
    return eng->max_seqs;
}
int md_engine_max_batch_tokens(const md_engine *eng) {
    return eng->max_batch;
}
struct md_pipe *md_engine_pipe(md_engine *eng) {
    return eng->pipe;
}
struct tok_tokenizer *md_engine_tokenizer(md_engine *eng) {
    return eng->tok;
}

/* Longest generation a request may ask for (max_tokens 0 means up to the context). */
static int gen_limit(const md_engine *eng, const md_sampling *s, int n_prompt) {
    return s->max_tokens ? s->max_tokens : eng->n_ctx - n_prompt;
}

int md_engine_submit(md_engine *eng, const int32_t *prompt, int n_prompt, const md_sampling *s,
                     uint64_t *seq_id, md_err *e) {
    int rc = smp_validate(s, e);
    if (rc)
        return rc;
    if (n_prompt < 1)
        return md_errf(e, MD_EINVAL, "empty prompt");
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= eng->n_vocab)
            return md_errf(e, MD_EINVAL, "prompt token %d at index %d outside the vocabulary of %d",
                           (int)prompt[i], i, eng->n_vocab);
    if (n_prompt >= eng->n_ctx || (long)n_prompt + s->max_tokens > eng->n_ctx)
        return md_errf(e, MD_ERANGE,
                       "prompt of %d tokens + max_tokens %d exceed the context of %d tokens",
                       n_prompt, s->max_tokens, eng->n_ctx);
    int total = n_prompt + gen_limit(eng, s, n_prompt);
    int need_blocks = (total + eng->bs - 1) / eng->bs;
    if (need_blocks > kv_n_blocks(eng->kv))
        return md_errf(e, MD_ERANGE,
                       "prompt of %d tokens + max_tokens %d need %d KV blocks; the KV budget "
                       "holds %d",
                       n_prompt, s->max_tokens, need_blocks, kv_n_blocks(eng->kv));
    if (eng->n_all == eng->cap_all) {
        int cap = eng->cap_all ? eng->cap_all * 2 : 64;
        seq **a = realloc(eng->all, (size_t)cap * sizeof *a);
        uint64_t *f = realloc(eng->finished, (size_t)cap * sizeof *f);
        if (a)
            eng->all = a;
        if (f)
            eng->finished = f;
        if (!a || !f)
            return md_errf(e, MD_ENOMEM, "out of memory");
        eng->cap_all = eng->cap_finished = cap;
    }
    if (eng->n_waiting == eng->cap_waiting) {
        int cap = eng->cap_waiting ? eng->cap_waiting * 2 : 64;
        seq **w = realloc(eng->waiting, (size_t)cap * sizeof *w);
        if (!w)
            return md_errf(e, MD_ENOMEM, "out of memory");
        eng->waiting = w;
        eng->cap_waiting = cap;
    }
    seq *q = calloc(1, sizeof *q);
    if (!q)
        return md_errf(e, MD_ENOMEM, "out of memory");
    q->s = *s;
    q->s.stop = NULL;
    q->cap = total;
    q->toks = malloc((size_t)q->cap * sizeof *q->toks);
    q->blocks = malloc((size_t)eng->max_blocks * sizeof *q->blocks);
    q->bhash = malloc((size_t)eng->max_blocks * sizeof *q->bhash);
    q->text_cap = 256;
    q->text = malloc(q->text_cap);
    int n_stop = 0;
    while (s->stop && s->stop[n_stop])
        n_stop++;
    q->stop = calloc((size_t)n_stop + 1, sizeof *q->stop);
    if (!q->toks || !q->blocks || !q->bhash || !q->text || !q->stop) {
        seq_free(q);
        return md_errf(e, MD_ENOMEM, "out of memory");
    }
    for (int i = 0; i < n_stop; i++) {
        if (!s->stop[i][0])
            continue;
        q->stop[q->n_stop] = strdup(s->stop[i]);
        if (!q->stop[q->n_stop]) {
            seq_free(q);
            return md_errf(e, MD_ENOMEM, "out of memory");
        }
        size_t l = strlen(s->stop[i]);
        if (l > q->max_stop_len)
            q->max_stop_len = l;
        q->n_stop++;
    }
    memcpy(q->toks, prompt, (size_t)n_prompt * sizeof *prompt);
    q->n_toks = q->n_prompt = n_prompt;
    q->text[0] = 0;
    smp_rng_seed(&q->rng, s->seed);
    tok_stream_init(&q->ts);
    q->id = ++eng->next_id;
    q->state = SEQ_WAITING;
    q->t_submit = md_mono_ns();
    eng->all[eng->n_all++] = q;
    eng->waiting[eng->n_waiting++] = q;
    *seq_id = q->id;
    return 0;
}

void md_engine_cancel(md_engine *eng, uint64_t seq_id) {
    seq *q = find_seq(eng, seq_id);
    if (q && q->state != SEQ_DONE)
        q->cancel = 1;
}

/* Release a sequence's blocks (published ones stay in the prefix index as cached). */
static void drop_blocks(md_engine *eng, seq *q) {
    for (int i = 0; i < q->n_blocks; i++)
        kv_unref(eng->kv, q->blocks[i]);
    q->n_blocks = 0;
    q->n_published = 0;
    q->n_computed = 0;
}

static void remove_running(md_engine *eng, int i) {
    memmove(eng->running + i, eng->running + i + 1,
            (size_t)(eng->n_running - i - 1) * sizeof *eng->running);
    eng->n_running--;
}

static void flush_text(md_engine *eng, seq *q);

static void finish(md_engine *eng, seq *q, md_finish why, int *n_fin) {
    if (!q->text_cut)
        flush_text(eng, q);
    drop_blocks(eng, q);
    q->state = SEQ_DONE;
    q->finish = why;
    q->t_done = md_mono_ns();
    eng->finished[(*n_fin)++] = q->id;
}

/* Preempt running[i]: its blocks go back, it waits at the front of the queue and recomputes
 * its tokens when readmitted. */
static void preempt(md_engine *eng, int i) {
    seq *q = eng->running[i];
    drop_blocks(eng, q);
    q->state = SEQ_WAITING;
    q->preemptions++;
    eng->st.preemptions++;
    remove_running(eng, i);
    memmove(eng->waiting + 1, eng->waiting, (size_t)eng->n_waiting * sizeof *eng->waiting);
    eng->waiting[0] = q;
    eng->n_waiting++;
}

/* Blocks q needs so that positions [0, upto) have a slot. */
static int blocks_needed(const md_engine *eng, const seq *q, int upto) {
    int want = (upto + eng->bs - 1) / eng->bs;
    return want > q->n_blocks ? want - q->n_blocks : 0;
}

static void grow_blocks(md_engine *eng, seq *q, int upto) {
    int n = blocks_needed(eng, q, upto);
    for (int i = 0; i < n; i++)
        q->blocks[q->n_blocks++] = kv_alloc(eng->kv);
}

/* Share the longest run of indexed full blocks matching q's tokens, leaving at least the last
 * token to compute (its logits are needed). Returns the number of tokens now cached. */
static int match_prefix(md_engine *eng, seq *q) {
    uint64_t parent = 0;
    int full = (q->n_toks - 1) / eng->bs;
    for (int j = 0; j < full; j++) {
        int32_t b = kv_lookup(eng->kv, parent, q->toks + (size_t)j * eng->bs);
        if (b < 0)
            break;
        kv_ref(eng->kv, b);
        parent = kv_hash(parent, q->toks + (size_t)j * eng->bs, eng->bs);
        q->blocks[q->n_blocks] = b;
        q->bhash[q->n_blocks] = parent;
        q->n_blocks++;
    }
    q->n_published = q->n_blocks;
    q->n_computed = q->n_blocks * eng->bs;
    eng->st.prefix_hit_tokens += q->n_computed;
    return q->n_computed;
}

/* Index the blocks that this step's chunk fills (their K/V are written in this step's forward
 * pass, before any later reader's attention in the same or a later step). */
static void publish(md_engine *eng, seq *q, int upto) {
    int full = upto / eng->bs;
    while (q->n_published < full) {
        int j = q->n_published;
        uint64_t parent = j ? q->bhash[j - 1] : 0;
        q->bhash[j] = kv_publish(eng->kv, q->blocks[j], parent, q->toks + (size_t)j * eng->bs);
        q->n_published++;
    }
}

/* Pick this step's chunks. Returns the number of tokens scheduled. */
static int schedule(md_engine *eng) {
    int T = 0;
    for (int i = 0; i < eng->n_running && T < eng->max_batch;) {
        seq *q = eng->running[i];
        int chunk = q->n_toks - q->n_computed;
        if (chunk > eng->max_batch - T)
            chunk = eng->max_batch - T;
        int need = blocks_needed(eng, q, q->n_computed + chunk);
        while (need > kv_n_available(eng->kv) && eng->n_running - 1 > i)
            preempt(eng, eng->n_running - 1);
        if (need > kv_n_available(eng->kv)) {
            preempt(eng, i);
            break;
        }
        grow_blocks(eng, q, q->n_computed + chunk);
        publish(eng, q, q->n_computed + chunk);
        q->chunk = chunk;
        T += chunk;
        i++;
    }
    while (eng->n_waiting > 0 && eng->n_running < eng->max_seqs && T < eng->max_batch) {
        seq *q = eng->waiting[0];
        match_prefix(eng, q);
        int chunk = q->n_toks - q->n_computed;
        if (chunk > eng->max_batch - T)
            chunk = eng->max_batch - T;
        if (blocks_needed(eng, q, q->n_computed + chunk) > kv_n_available(eng->kv)) {
            eng->st.prefix_hit_tokens -= q->n_computed;
            drop_blocks(eng, q);
            break;
        }
        if (q->t_admit == 0)
            q->t_admit = md_mono_ns();
        if (q->preemptions == 0)
            q->cached_prompt = q->n_computed;
        grow_blocks(eng, q, q->n_computed + chunk);
        publish(eng, q, q->n_computed + chunk);
        memmove(eng->waiting, eng->waiting + 1, (size_t)(eng->n_waiting - 1) * sizeof(seq *));
        eng->n_waiting--;
        q->state = SEQ_RUNNING;
        q->chunk = chunk;
        eng->running[eng->n_running++] = q;
        T += chunk;
    }
    return T;
}

/* Append the n bytes in eng->piece to q's text. Returns 0, or -1 out of memory (the piece is
 * dropped: the text stays valid UTF-8). */
static int text_add(md_engine *eng, seq *q, size_t n) {
    if (q->text_len + n + 1 > q->text_cap) {
        size_t cap = (q->text_len + n + 1) * 2;
        char *t = realloc(q->text, cap);
        if (!t)
            return -1;
        q->text = t;
        q->text_cap = cap;
    }
    memcpy(q->text + q->text_len, eng->piece, n);
    q->text_len += n;
    q->text[q->text_len] = 0;
    return 0;
}

/* The sequence ended: bytes of an unfinished UTF-8 character still held by the streaming
 * decoder come out as U+FFFD rather than vanish (the text then says something was cut). */
static void flush_text(md_engine *eng, seq *q) {
    size_t n = tok_stream_flush(&q->ts, eng->piece, 1024);
    if (n)
        text_add(eng, q, n);
}

/* Append the text of token id to q and apply the stop strings. Returns 1 when a stop string
 * ended the sequence (the text is cut before it). */
static int append_text(md_engine *eng, seq *q, int32_t id) {
    size_t n = tok_stream_push(eng->tok, &q->ts, id, eng->piece, 1024);
    if (n == 0)
        return 0;
    size_t old = q->text_len;
    if (text_add(eng, q, n))
        return 0;
    for (int i = 0; i < q->n_stop; i++) {
        size_t l = strlen(q->stop[i]);
        size_t from = old >= l - 1 ? old - (l - 1) : 0;
        char *hit = memmem(q->text + from, q->text_len - from, q->stop[i], l);
        if (hit) {
            q->text_len = (size_t)(hit - q->text);
            q->text[q->text_len] = 0;
            q->text_cut = 1; /* what the decoder still holds came after the stop string */
            return 1;
        }
    }
    return 0;
}

/* Greedy with nothing that reads the logits but the argmax: the device's pick is the
 * sampler's (same lowest-index tie rule). */
static int greedy_plain(const md_sampling *s) {
    return s->temperature <= 0 && s->repetition_penalty == 1.0f && s->presence_penalty == 0 &&
           s->frequency_penalty == 0 && !s->logprobs && !s->top_logprobs;
}

/* Anything but a plain greedy pick, on a backend with a sample op: penalties, the draw and
 * the logprob are made there (engine/sampler.h smp_sample_row semantics, u from the
 * sequence's own stream). */
static int device_sampled(const md_backend *be, const md_sampling *s) {
    return be && be->ops->sample && !greedy_plain(s);
}

/* Room for n more penalty entries after the first used ones. */
static int pen_room(md_engine *eng, size_t used, size_t n, md_err *e) {
    if (used + n <= eng->cap_pen)
        return 0;
    size_t cap = eng->cap_pen ? eng->cap_pen : 4096;
    while (cap < used + n)
        cap *= 2;
    md_sample_pen *p = realloc(eng->b_pen, cap * sizeof *p);
    if (!p)
        return md_errf(e, MD_ENOMEM, "engine: out of memory for %zu penalty entries", cap);
    eng->b_pen = p;
    eng->cap_pen = cap;
    return 0;
}

/* Every logit a number (no NaN, no infinity)? */
static int logits_finite(const float *lg, int n) {
    float acc = 0;
    for (int i = 0; i < n; i++)
        acc += lg[i] * 0.0f; /* NaN for NaN or infinite entries, else 0 */
    return acc == 0.0f;
}

/* After a forward pass that left the logits on the device: argmax of every logit row into
 * b_argmax (greedy sequences), the backend's draw into b_sampled and b_lp (the others, when it
 * has a sample op), and the full rows of the others into eng->logits. */
static int fetch_logits(md_engine *eng, int ns, md_err *e) {
    md_backend *be = eng->be;
    size_t row = (size_t)eng->n_vocab * sizeof(float);
    int nl = 0, plain = 0, drawn = 0, want_lp = 0, want_top = 0;
    size_t n_pen = 0;
    for (int s = 0; s < ns; s++) {
        seq *q = eng->b_seqs[s];
        if (q->n_computed + q->chunk != q->n_toks)
            continue;
        md_sample_params *p = &eng->b_sparams[nl++];
        memset(p, 0, sizeof *p); /* temperature 0: an argmax the engine does not read */
        if (greedy_plain(&q->s)) {
            plain++;
        } else if (device_sampled(be, &q->s)) {
            drawn++;
            want_lp |= q->s.logprobs || q->s.top_logprobs;
            want_top |= q->s.top_logprobs > 0;
            /* one uniform per sampled token, none for greedy, as smp_sample */
            *p = smp_params(&q->s, q->s.temperature > 0 ? smp_rng_uniform(&q->rng) : 0);
            int n_out = q->n_toks - q->n_prompt;
            int most = q->n_toks < eng->n_vocab ? q->n_toks : eng->n_vocab;
            int rc = pen_room(eng, n_pen, (size_t)most, e);
            if (rc)
                return rc;
            p->pen_off = (int)n_pen;
            p->pen_n = smp_pen_list(&q->s, q->toks, q->n_prompt, q->toks + q->n_prompt, n_out,
                                    eng->n_vocab, eng->sc, eng->b_pen + n_pen);
            n_pen += (size_t)p->pen_n;
        }
    }
    int rc = 0;
    if (plain > 0)
        rc = be->ops->argmax(be, eng->fwd.logits, nl, eng->n_vocab, eng->b_argmax, e);
    if (drawn > 0 && rc == 0)
        rc = be->ops->sample(be, eng->fwd.logits, nl, eng->n_vocab, eng->b_sparams, eng->b_pen,
                             (int)n_pen, eng->b_sampled, want_lp ? eng->b_lp : NULL,
                             want_top ? eng->b_top_tok : NULL, want_top ? eng->b_top_lp : NULL, e);
    if (plain + drawn == nl || rc)
        return rc;
    if (plain + drawn == 0) /* one transfer for the whole block */
        return be->ops->buf_download(be, eng->fwd.logits, 0, eng->logits, (size_t)nl * row, e);
    for (int s = 0, li = 0; s < ns && rc == 0; s++) {
        seq *q = eng->b_seqs[s];
        if (q->n_computed + q->chunk != q->n_toks)
            continue;
        if (!greedy_plain(&q->s) && !device_sampled(be, &q->s))
            rc = be->ops->buf_download(be, eng->fwd.logits, (size_t)li * row,
                                       eng->logits + (size_t)li * eng->n_vocab, row, e);
        li++;
    }
    return rc;
}

/* Free the finished sequences their owner has released. */
static void free_released(md_engine *eng) {
    for (int i = 0; i < eng->n_all;) {
        seq *q = eng->all[i];
        if (q->released && q->state == SEQ_DONE) {
            seq_free(q);
            eng->all[i] = eng->all[--eng->n_all];
        } else {
            i++;
        }
    }
}

/* Finish the cancelled sequences, running or waiting. */
static void drop_cancelled(md_engine *eng, int *n_fin) {
    for (int i = 0; i < eng->n_running;) {
        seq *q = eng->running[i];
        if (q->cancel) {
            remove_running(eng, i);
            finish(eng, q, MD_FINISH_CANCELLED, n_fin);
        } else {
            i++;
        }
    }
    for (int i = 0; i < eng->n_waiting;) {
        seq *q = eng->waiting[i];
        if (q->cancel) {
            memmove(eng->waiting + i, eng->waiting + i + 1,
                    (size_t)(eng->n_waiting - i - 1) * sizeof(seq *));
            eng->n_waiting--;
            finish(eng, q, MD_FINISH_CANCELLED, n_fin);
        } else {
            i++;
        }
    }
}

/* Lay out the batch in the step scratch: running sequences with a chunk, in order. *ns gets
 * the number of sequences, *nl that of logit rows (chunks that reach the end of their list). */
static void lay_out_batch(md_engine *eng, int *ns_out, int *nl_out) {
    int t = 0, ns = 0, nl = 0;
    for (int i = 0; i < eng->n_running; i++) {
        seq *q = eng->running[i];
        if (q->chunk == 0)
            continue;
        for (int j = 0; j < q->chunk; j++, t++) {
            int pos = q->n_computed + j;
            eng->b_tokens[t] = q->toks[pos];
            eng->b_seq[t] = ns;
            eng->b_pos[t] = pos;
            eng->b_slot[t] = q->blocks[pos / eng->bs] * eng->bs + pos % eng->bs;
        }
        eng->b_seq_len[ns] = q->n_computed + q->chunk;
        memcpy(eng->b_table + (size_t)ns * eng->max_blocks, q->blocks,
               (size_t)q->n_blocks * sizeof(int32_t));
        if (q->n_computed + q->chunk == q->n_toks)
            eng->b_logit_rows[nl++] = t - 1;
        eng->b_seqs[ns++] = q;
    }
    *ns_out = ns;
    *nl_out = nl;
}

/* The device failed: every running sequence fails with the reason, and blocks indexed this
 * step may hold nothing valid. */
static void fail_running(md_engine *eng, const md_err *e, int *n_fin) {
    while (eng->n_running > 0) {
        seq *q = eng->running[0];
        snprintf(q->err, sizeof q->err, "%s", e->msg);
        remove_running(eng, 0);
        finish(eng, q, MD_FINISH_ERROR, n_fin);
    }
    kv_clear_index(eng->kv);
}

/* Take q out of the running list and finish it. */
static void finish_running(md_engine *eng, seq *q, md_finish why, int *n_fin) {
    for (int i = 0; i < eng->n_running; i++)
        if (eng->running[i] == q) {
            remove_running(eng, i);
            break;
        }
    finish(eng, q, why, n_fin);
}

/* q's next token from logit row li: the device's greedy pick or draw, else the sampler on
 * the downloaded row; its logprob into *lp, its alternatives into ot. Returns -1 when the row
 * holds a NaN or infinity. */
static int32_t pick_token(md_engine *eng, seq *q, int li, int dev_argmax, md_step_token *ot,
                          float *lp) {
    float *lg = eng->logits + (size_t)li * eng->n_vocab;
    int32_t id = -1;
    int report = q->s.logprobs || q->s.top_logprobs;
    if (dev_argmax && greedy_plain(&q->s)) {
        id = eng->b_argmax[li]; /* -1: the row holds a NaN */
    } else if (dev_argmax && device_sampled(eng->be, &q->s)) {
        id = eng->b_sampled[li]; /* drawn on the device at this sequence's u; -1: NaN */
        *lp = report ? eng->b_lp[li] : 0;
        const int32_t *tt = eng->b_top_tok + (size_t)li * MD_TOP_LOGPROBS;
        while (ot->n_top < q->s.top_logprobs && tt[ot->n_top] >= 0 &&
               tt[ot->n_top] < eng->n_vocab) {
            ot->top_token[ot->n_top] = tt[ot->n_top];
            ot->top_logprob[ot->n_top] = eng->b_top_lp[(size_t)li * MD_TOP_LOGPROBS + ot->n_top];
            ot->n_top++;
        }
    } else if (logits_finite(lg, eng->n_vocab)) {
        if (q->s.top_logprobs) /* from the raw row, before smp_sample penalises it */
            ot->n_top = smp_top_logprobs(lg, eng->n_vocab, q->s.top_logprobs, ot->top_token,
                                         ot->top_logprob);
        id = smp_sample(&q->s, lg, eng->n_vocab, q->toks, q->n_prompt, q->toks + q->n_prompt,
                        q->n_toks - q->n_prompt, &q->rng, eng->sc, lp);
    }
    return id;
}

/* No token can be chosen for q (id outside the vocabulary; -1: the logits are not numbers):
 * q fails saying why. */
static void fail_bad_token(md_engine *eng, seq *q, int32_t id, int *n_fin) {
    if (id < 0)
        snprintf(q->err, sizeof q->err,
                 "the model produced logits that are not numbers (NaN or infinite) at "
                 "position %d: the device or the weights are faulty",
                 q->n_toks);
    else
        snprintf(q->err, sizeof q->err,
                 "the device chose token %d at position %d, outside the vocabulary of "
                 "%d: the device is faulty",
                 id, q->n_toks, eng->n_vocab);
    finish_running(eng, q, MD_FINISH_ERROR, n_fin);
}

/* Append the text of q's new token id; why q ends with it (EOS, a stop string, its length
 * limit or the context's), or MD_FINISH_NONE. */
static md_finish finish_reason(md_engine *eng, seq *q, int32_t id) {
    int n_gen = q->n_toks - q->n_prompt;
    md_finish why = MD_FINISH_NONE;
    if (!q->s.ignore_eos && tok_is_eog(eng->tok, id))
        why = MD_FINISH_STOP;
    else if (append_text(eng, q, id))
        why = MD_FINISH_STOP;
    else if (n_gen >= gen_limit(eng, &q->s, q->n_prompt) || q->n_toks >= eng->n_ctx)
        why = MD_FINISH_LENGTH;
    return why;
}

int md_engine_step(md_engine *eng, md_step_result *res, md_err *e) {
    memset(res, 0, sizeof *res);
    int n_fin = 0;
    free_released(eng);
    drop_cancelled(eng, &n_fin);
    for (int i = 0; i < eng->n_running; i++)
        eng->running[i]->chunk = 0;
    int T = schedule(eng);
    res->finished = eng->finished;
    if (T == 0) {
        res->n_finished = n_fin;
        res->n_live = eng->n_running + eng->n_waiting;
        return 0;
    }
    int ns, nl;
    lay_out_batch(eng, &ns, &nl);
    md_batch b = {.n_tokens = T,
                  .n_seqs = ns,
                  .tokens = eng->b_tokens,
                  .tok_seq = eng->b_seq,
                  .tok_pos = eng->b_pos,
                  .slot = eng->b_slot,
                  .seq_len = eng->b_seq_len,
                  .block_table = eng->b_table,
                  .max_blocks = eng->max_blocks,
                  .block_tokens = eng->bs,
                  .logit_rows = eng->b_logit_rows,
                  .n_logits = nl};
    eng->st.steps++;
    eng->st.tokens += T;
    /* A backend with a device argmax keeps the logits there: greedy rows come back as ids,
     * only the rows a sampler needs are downloaded. */
    int dev_argmax = eng->be && eng->be->ops->argmax != NULL;
    int rc;
    if (eng->pipe) {
        /* every row a plain greedy pick: the last stage sends ids, not rows of logits */
        b.argmax_only = nl > 0;
        for (int s = 0; s < ns && b.argmax_only; s++) {
            seq *q = eng->b_seqs[s];
            if (q->n_computed + q->chunk == q->n_toks && !greedy_plain(&q->s))
                b.argmax_only = 0;
        }
        rc = md_pipe_forward(eng->pipe, &b, eng->logits, e);
        if (rc == 0 && b.argmax_only) {
            dev_argmax = 1;                /* pick_token reads b_argmax for greedy rows */
            for (int i = 0; i < nl; i++) { /* a stage's answer: anything not an id is -1 */
                float v = eng->logits[i];
                eng->b_argmax[i] = v >= 0 && v < (float)eng->n_vocab ? (int32_t)v : -1;
            }
        }
    } else {
        rc = md_model_forward(eng->m, &eng->fwd, &eng->kvb, &b, dev_argmax ? NULL : eng->logits, e);
        if (rc == 0 && dev_argmax)
            rc = fetch_logits(eng, ns, e);
    }
    if (rc) {
        fail_running(eng, e, &n_fin);
        res->n_finished = n_fin;
        res->n_live = eng->n_waiting;
        return rc;
    }
    uint64_t now = md_mono_ns();
    int n_out = 0, li = 0, poisoned = 0;
    for (int s = 0; s < ns; s++) {
        seq *q = eng->b_seqs[s];
        q->n_computed += q->chunk;
        if (q->n_computed < q->n_toks)
            continue;
        md_step_token *ot = &eng->out_toks[n_out]; /* kept only when a token is chosen */
        ot->n_top = 0;
        float lp = 0;
        int32_t id = pick_token(eng, q, li, dev_argmax, ot, &lp);
        li++;
        if (id < 0 || id >= eng->n_vocab) {
            /* a silent device fault (or broken weights): no token can be chosen, and this
             * sequence's K/V hold garbage; shared prefix blocks may too */
            fail_bad_token(eng, q, id, &n_fin);
            poisoned = 1;
            continue;
        }
        q->toks[q->n_toks++] = id;
        if (q->t_first == 0)
            q->t_first = now;
        ot->seq_id = q->id;
        ot->token = id;
        ot->logprob = lp;
        n_out++;
        md_finish why = finish_reason(eng, q, id);
        if (why != MD_FINISH_NONE)
            finish_running(eng, q, why, &n_fin);
    }
    if (poisoned)
        kv_clear_index(eng->kv);
    res->tokens = eng->out_toks;
    res->n_tokens = n_out;
    res->n_finished = n_fin;
    res->n_live = eng->n_running + eng->n_waiting;
    return 0;
}

md_finish md_seq_finish(const md_engine *eng, uint64_t seq_id) {
    seq *q = find_seq(eng, seq_id);
    return q ? q->finish : MD_FINISH_NONE;
}

int md_seq_tokens(const md_engine *eng, uint64_t seq_id, const int32_t **toks, int *n) {
    seq *q = find_seq(eng, seq_id);
    if (!q)
        return MD_ENOTFOUND;
    *toks = q->toks + q->n_prompt;
    *n = q->n_toks - q->n_prompt;
    return 0;
}

const char *md_seq_text(const md_engine *eng, uint64_t seq_id) {
    seq *q = find_seq(eng, seq_id);
    return q ? q->text : NULL;
}

const char *md_seq_error(const md_engine *eng, uint64_t seq_id) {
    seq *q = find_seq(eng, seq_id);
    return q && q->err[0] ? q->err : NULL;
}

void md_seq_get_stats(const md_engine *eng, uint64_t seq_id, md_seq_stats *st) {
    memset(st, 0, sizeof *st);
    seq *q = find_seq(eng, seq_id);
    if (!q)
        return;
    st->prompt_tokens = q->n_prompt;
    st->completion_tokens = q->n_toks - q->n_prompt;
    st->cached_prompt_tokens = q->cached_prompt;
    uint64_t now = md_mono_ns();
    uint64_t admit = q->t_admit ? q->t_admit : now;
    uint64_t first = q->t_first ? q->t_first : (q->t_admit ? now : admit);
    uint64_t done = q->t_done ? q->t_done : now;
    st->queue_ms = (double)(admit - q->t_submit) / 1e6;
    st->prefill_ms = (double)(first - admit) / 1e6;
    st->decode_ms = q->t_first ? (double)(done - first) / 1e6 : 0;
}

void md_engine_release(md_engine *eng, uint64_t seq_id) {
    for (int i = 0; i < eng->n_all; i++) {
        seq *q = eng->all[i];
        if (q->id != seq_id)
            continue;
        if (q->state != SEQ_DONE) {
            q->cancel = 1; /* still live: cancelled now, freed once reported finished */
            q->released = 1;
            return;
        }
        seq_free(q);
        eng->all[i] = eng->all[--eng->n_all];
        return;
    }
}

void md_engine_get_stats(const md_engine *eng, md_engine_stats *st) {
    *st = eng->st;
    st->kv_blocks = kv_n_blocks(eng->kv);
    st->kv_block_tokens = eng->bs;
    st->kv_blocks_free = kv_n_available(eng->kv);
    st->kv_bytes = (size_t)st->kv_blocks * eng->bs * md_kv_bytes_per_token(&eng->hp, eng->kv_type);
}
