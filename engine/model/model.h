/* model.h — a llama-family model (Llama 2/3, Mistral, Qwen2, Qwen3, SmolLM, TinyLlama) or a
 * Gemma 3 read from a GGUF file onto one backend, and its forward pass over one engine step
 * (docs/models.md, "Architectures", says what each architecture adds to the llama layout).
 *
 * The forward pass is batch-first: a step of T tokens from many sequences makes one matmul
 * per weight with n = T (docs/design.md §5), attention reads each sequence's paged KV cache.
 *
 * Ownership: md_model_load() takes a reference to the open gguf_file (the caller keeps it
 * open until md_model_free(): weights are aliased from its mapping on CPU) and to the
 * backend (the caller frees it after the model). md_fwd holds the activation buffers of
 * one engine (sized once; the step loop does not allocate). */
#ifndef MEDLEY_ENGINE_MODEL_H
#define MEDLEY_ENGINE_MODEL_H

#include <stdint.h>

#include "common/err.h"
#include "engine/weights/gguf.h"
#include "kernels/backend.h"

#define MD_MAX_LAYERS 1024 /* the most layers md_hparams_read accepts */

typedef struct {
    char arch[32]; /* "llama", "qwen2", ... */
    int n_layer;
    int n_embd; /* C */
    int n_head;
    int n_head_kv;
    int head_dim;
    int n_ff;
    int n_vocab;
    int n_ctx_train;
    int rot_dims;  /* rotated dimensions per head (== head_dim for this family) */
    int rope_neox; /* 1: pairs (i, i + d/2) (Qwen2); 0: adjacent pairs (Llama GGUF) */
    md_rope_cfg rope;
    float eps;
    /* Beyond the llama layout (all zero for llama, qwen2; docs/models.md "Architectures"). */
    int n_swa;       /* sliding window (tokens): a query at position p sees keys at
                        (p - n_swa, p]; 0 = every layer attends to the whole sequence */
    int swa_pattern; /* with n_swa: layer l slides iff l % swa_pattern < swa_pattern - 1
                        (Gemma 3: 6, every 6th layer global); 0 = every layer slides;
                        -1 = per layer, as swa_layers says */
    uint64_t swa_layers[MD_MAX_LAYERS / 64]; /* swa_pattern -1: bit l set iff layer l slides */
    float rope_theta_swa; /* RoPE base of the sliding layers, unscaled (Gemma 3: 10000);
                             0 = the same table as the global layers */
    float embd_scale;     /* token embeddings multiplied by it (Gemma: sqrt(n_embd)); 0 = 1 */
    float attn_scale;     /* softmax scale of q·k; 0 = 1 / sqrt(head_dim) */
    int qk_norm;          /* RMSNorm of each q and k head before RoPE (Qwen3, Gemma 3) */
    int post_norms;       /* RMSNorm of the attention and FFN outputs before each residual
                             add (Gemma 3: post_attention_norm, post_ffw_norm) */
    int ffn_gelu;         /* FFN gate through gelu (tanh form): GeGLU (Gemma); 0 = SwiGLU */
} md_hparams;

/* 1 when layer l of a model of these hyperparameters uses the sliding window. */
int md_layer_is_swa(const md_hparams *hp, int l);

typedef struct {
    md_tensor attn_norm, wq, wk, wv, wo, ffn_norm, w_gate, w_up, w_down;
    md_tensor bq, bk, bv;                    /* Qwen2 QKV biases; buf NULL when absent */
    md_tensor q_norm, k_norm;                /* [head_dim] when hp.qk_norm */
    md_tensor post_attn_norm, post_ffn_norm; /* [n_embd] when hp.post_norms */
} md_layer;

typedef struct md_model {
    md_hparams hp;
    md_backend *be;
    md_tensor tok_embd, out_norm, output; /* output aliases tok_embd when tied; tok_embd is
                                             bound when lo == 0, the head when hi == n_layer */
    md_layer *layers;                     /* [n_layer]; only [lo, hi) bound */
    int lo, hi;    /* the layers this model holds: all, or one pipeline stage's (stage.h) */
    md_buf **bufs; /* wrapped weight buffers */
    int n_bufs;
    md_buf *inv_freq;     /* [rot_dims / 2] */
    md_buf *inv_freq_swa; /* [rot_dims / 2] of the sliding layers when hp.rope_theta_swa */
    /* Tensor parallelism (engine/shard/tp.h): this is rank tp_rank of tp_n; hp holds the rank's
     * heads and FFN width. allreduce sums a partial product [n floats] over the ranks in
     * place; rank 0 computes the logits. tp_n == 1: none. */
    int tp_rank, tp_n;
    int (*allreduce)(void *ctx, int rank, md_buf *buf, int64_t n, md_err *e);
    void *allreduce_ctx;
    void **owned; /* host copies of sliced weights, freed with the model */
    int n_owned;
    /* Use the backend's fused matmul_n (Q/K/V in one product, residual adds and SwiGLU
     * folded in) when it has one: 1 unless MEDLEY_FUSED_MATMUL=0 at load (A/B checks). */
    int fused;
} md_model;

/* Read hyperparameters and bind every weight, checking names, shapes and types; a missing
 * or malformed tensor is MD_EFORMAT naming it. */
int md_model_load(const gguf_file *gf, md_backend *be, md_model **out, md_err *e);
/* What md_model_load would refuse, without a backend: hyperparameters, and every tensor's
 * presence, shape, byte count and type (a type some backend multiplies), nothing allocated
 * beyond a few bytes per layer, no weight read. hp (may be NULL) gets the hyperparameters. */
int md_model_check(const gguf_file *gf, md_hparams *hp, md_err *e);
/* Only the layers [lo, hi) (0 <= lo < hi <= n_layer), with the token embedding when lo == 0
 * and the final norm and output head when hi == n_layer: one pipeline stage's weights. */
int md_model_load_range(const gguf_file *gf, md_backend *be, int lo, int hi, md_model **out,
                        md_err *e);
void md_model_free(md_model *m);
/* Rank `rank` of a tp-way tensor-parallel split of layers [lo, hi): query / KV heads and FFN
 * columns [rank * x / tp, (rank + 1) * x / tp); the caller sets allreduce before a forward
 * pass. Heads and FFN width must divide by tp (MD_EINVAL with the numbers). */
int md_model_load_tp(const gguf_file *gf, md_backend *be, int lo, int hi, int rank, int tp,
                     md_model **out, md_err *e);
/* Fill hp from the file's metadata only (no tensors). */
int md_hparams_read(const gguf_file *gf, md_hparams *hp, md_err *e);

/* KV cache of the model's layers [lo, hi) (NULL outside): K and V of n_slots slots of kv_dim
 * = n_head_kv * head_dim each. */
typedef struct {
    md_buf **k, **v; /* [n_layer] */
    int n_slots;
    int type; /* MD_TYPE_F32, F16 or BF16 */
} md_kv_bufs;

/* A KV cache of n_slots slots of the backend's kv_cache_type. */
int md_kv_bufs_alloc(md_model *m, int n_slots, md_kv_bufs *kv, md_err *e);
/* Same, of element type type, taken as it is (MD_TYPE_F32 is 0 and means F32). */
int md_kv_bufs_alloc_type(md_model *m, int n_slots, int type, md_kv_bufs *kv, md_err *e);
void md_kv_bufs_free(md_model *m, md_kv_bufs *kv);
/* Bytes one token's K and V take over all layers, in a cache of element type kv_type. */
size_t md_kv_bytes_per_token(const md_hparams *hp, int kv_type);

/* Activation buffers for steps of up to max_tokens tokens and max_logits logit rows. */
typedef struct {
    int max_tokens, max_logits;
    md_buf *x, *xb, *q, *k, *v, *att, *hb, *hb2, *xl, *logits;
    /* 1: the head stops after the final norm, and md_model_forward hands back those rows'
     * hidden states [n_logits, n_embd] instead of logits (decoders used as embedders,
     * engine/embedder.h: last-token pooling). Set by the caller after md_fwd_alloc. */
    int hidden_only;
} md_fwd;

int md_fwd_alloc(md_model *m, int max_tokens, int max_logits, md_fwd *f, md_err *e);
void md_fwd_free(md_model *m, md_fwd *f);

/* Run the step described by b (already checked by the engine: positions, slots, blocks)
 * and copy the logits of b->logit_rows into logits [n_logits, n_vocab] (host); with logits
 * NULL they stay in f->logits [n_logits, n_vocab] on the device. With f->hidden_only, logits
 * gets the final-normed hidden states of those rows [n_logits, n_embd] instead. */
int md_model_forward(md_model *m, md_fwd *f, md_kv_bufs *kv, const md_batch *b, float *logits,
                     md_err *e);
/* One pipeline stage's part of the step: in [T, n_embd] (host) are the hidden states entering
 * layer lo (ignored when lo == 0: the tokens are embedded); out (host) gets those leaving
 * layer hi - 1 [T, n_embd], or when hi == n_layer the logits [n_logits, n_vocab]. */
int md_model_forward_stage(md_model *m, md_fwd *f, md_kv_bufs *kv, const md_batch *b,
                           const float *in, float *out, md_err *e);

#endif
