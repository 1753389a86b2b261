/* engine_open.c — opening the engine (engine.h md_engine_open): the configuration checked,
 * the model file and its tokenizer opened, the batch sizes and KV cache type chosen, the
 * model refused early when the backend's attention cannot run it or the device cannot hold
 * it, the weights loaded (with BF16 copies when they fit), the KV cache and step buffers
 * sized; or, for a sharded model, the head set up over its stages. Also closing, and the
 * sizes an opened engine reports. The step loop is engine.c; the state both share is
 * engine_int.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "engine/engine.h"
#include "engine/engine_constrain.h"
#include "engine/engine_int.h"
#include "engine/kvcache.h"
#include "engine/model/model.h"
#include "engine/sampler.h"
#include "engine/shard/pipeline.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/weights/gguf.h"
#include "engine/weights/hf_model.h"
#include "engine/weights/synth.h"

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

int md_engine_model_facts(const char *path, md_model_facts *out, md_err *e) {
    memset(out, 0, sizeof *out);
    gguf_file *gf = NULL;
    void *synth = NULL;
    size_t synth_len = 0;
    md_hparams hp;
    int rc = md_model_open_any(path, 0, &synth, &synth_len, &gf, e);
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
    eng->prefill_chunk = cfg->prefill_chunk;
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
        (rc = md_model_shape_gf(eng->gf, cfg->model_path, &hp, e)))
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
    md_stage_config base = {.kv_type =
                                cfg->kv_type ? md_stage_kv_code(eng->kv_type) : MD_STAGE_KV_BACKEND,
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
    base.model_hash = md_model_hash_gf(eng->gf, eng->synth != NULL);
    md_pipe_opts o = {.microbatches = cfg->microbatches,
                      .timeout_ms = cfg->stage_timeout_ms,
                      .load_timeout_ms = cfg->stage_load_timeout_ms,
                      .secret_file = cfg->stage_secret_file,
                      .tp = cfg->tp,
                      .mem_cap = cfg->stage_mem_cap,
                      .n_embd = hp.n_embd,
                      .n_vocab = hp.n_vocab};
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
        cfg->prefill_chunk < 0 || cfg->kv_block_tokens < 0 || cfg->n_ctx < 0) {
        rc = md_errf(e, MD_EINVAL, "engine: negative size in the configuration");
        goto fail;
    }
    md_hparams hpf; /* from the metadata: sizes are known before any weight is loaded */
    /* a synthetic model (synth.h) gets random weights */
    rc = md_model_open_any(cfg->model_path, 1, &eng->synth, &eng->synth_len, &eng->gf, e);
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
        eng_seq_free(eng->all[i]);
    eng_con_close(eng); /* after the matchers: the vocabulary outlives them */
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
