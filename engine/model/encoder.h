/* encoder.h — an encoder model (the BERT family as Hugging Face's BertModel computes it) read
 * from a GGUF file or an HF directory (engine/weights/hf_model.h presents both as a
 * gguf_file with llama.cpp's `bert` names) onto one backend, and its forward pass: the last
 * layer's hidden states of many whole sequences packed into one step, no KV cache.
 *
 * BERT: word + absolute position + token-type (type 0) embeddings, LayerNorm, then per layer
 * x = LN(x + Wo·attn(x) + bo), x = LN(x + W2·gelu(W1·x + b1) + b2), exact (erf) GELU,
 * bidirectional attention within each sequence. Which of these an architecture has is a row of
 * the table in encoder.c (position offset, token types), so the next encoders (XLM-RoBERTa's
 * offset positions; rotary NomicBERT / ModernBERT) are a row and a branch, not another model.
 *
 * Ownership: md_encoder_load keeps pointers into gf (aliased weights on the CPU): the caller
 * keeps gf open until md_encoder_free, and frees the backend after it. The encoder owns its
 * activation buffers, sized at load for steps of up to max_tokens tokens. */
#ifndef MEDLEY_ENGINE_ENCODER_H
#define MEDLEY_ENGINE_ENCODER_H

#include <stdint.h>

#include "common/err.h"
#include "engine/weights/gguf.h"
#include "kernels/backend.h"

typedef struct {
    char arch[32]; /* "bert" */
    int n_layer;
    int n_embd; /* C */
    int n_head, head_dim;
    int n_ff;
    int n_vocab;
    int n_ctx;      /* rows of the position table: the longest sequence */
    int pos_offset; /* row of position 0 in the position table */
    float eps;      /* LayerNorm epsilon */
    int pooling;    /* <arch>.pooling_type as llama.cpp numbers it (1 mean, 2 cls, 3 last), -1
                       when the file does not say (HF directories: sentence-transformers says) */
} md_enc_hparams;

typedef struct {
    md_tensor wq, bq, wk, bk, wv, bv; /* [C, C], [C] */
    md_tensor wo, bo, attn_norm_w, attn_norm_b;
    md_tensor w_up, b_up, w_down, b_down; /* [C, F], [F], [F, C], [C] */
    md_tensor out_norm_w, out_norm_b;
    /* the six products as the backend prepared them (lin_prepare), or all NULL: matmul */
    md_lin *lq, *lk, *lv, *lo, *l_up, *l_down;
} md_enc_layer;

typedef struct md_encoder {
    md_enc_hparams hp;
    md_backend *be;
    md_tensor tok_embd, pos_embd; /* [C, n_vocab], [C, n_ctx + pos_offset] */
    md_tensor type0;              /* token type 0's embedding row, F32 [C] */
    md_tensor embd_norm_w, embd_norm_b;
    md_enc_layer *layers;
    md_buf **bufs;
    int n_bufs;
    void **owned; /* host copies (type0, dequantized weights for an exact backend) */
    int n_owned;
    int max_tokens;
    int bf16; /* products in BF16 (md_encoder_set_bf16) */
    md_buf *x, *xb, *q, *k, *v, *att, *hb; /* activations [max_tokens, C] ([.., F] for hb) */
} md_encoder;

/* 1 when the file's general.architecture is an encoder this module runs. */
int md_encoder_is(const gguf_file *gf);
/* Hyperparameters only (no tensors): MD_EUNSUPP for an architecture outside the table,
 * MD_EFORMAT naming a missing or implausible key. */
int md_enc_hparams_read(const gguf_file *gf, md_enc_hparams *hp, md_err *e);
/* Bind every weight (names, shapes, types checked: a missing or mis-shaped tensor is
 * MD_EFORMAT naming it), reserve the backend for steps of max_tokens tokens, let it prepare
 * the linear layers where it can (lin_prepare: the CPU packs them for its products of many
 * tokens, F32) and allocate the activations. MD_EUNSUPP naming the op when the backend lacks
 * the encoder ops. */
int md_encoder_load(const gguf_file *gf, md_backend *be, int max_tokens, md_encoder **out,
                    md_err *e);
/* Products in BF16 (on = 1; F32 sums) or F32 (0) from now on: the linear layers prepared
 * again. MD_EUNSUPP naming what is missing where the backend cannot (then the encoder is
 * left in F32). */
int md_encoder_set_bf16(md_encoder *m, int on, md_err *e);
void md_encoder_free(md_encoder *m);
/* One packed step: b holds T = b->n_tokens tokens of b->n_seqs whole sequences, each
 * contiguous, tok_seq its sequence and tok_pos 0, 1, ... within it (KV fields unused).
 * hidden [T, n_embd] (host) gets the last layer's output. MD_ERANGE for a token id outside
 * the vocabulary or a sequence longer than n_ctx. */
int md_encoder_forward(md_encoder *m, const md_batch *b, float *hidden, md_err *e);
/* The same step pooled on the backend (its optional pool_enc op; MD_EUNSUPP without it):
 * out [n_seqs, n_embd] (host) = each sequence's pooling (backend.h MD_POOL_*), L2-normalised
 * with normalize, so only the vectors are downloaded. Every sequence of b holds tokens. */
int md_encoder_forward_pooled(md_encoder *m, const md_batch *b, int mode, int normalize, float *out,
                              md_err *e);

#endif
