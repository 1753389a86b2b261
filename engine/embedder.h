/* embedder.h — prefill-only work: text or token ids in, one vector per input out
 * (docs/embeddings.md). An encoder model (engine/model/encoder.h) and its sentence-transformers
 * pipeline (engine/weights/st_config.h: pooling, normalisation, max_seq_length), or a decoder
 * (engine/model/model.h, the llama path) whose pipeline pools the last token (Qwen3-Embedding
 * style). No KV cache is kept: the inputs of a call, from as many requests as the caller
 * gathered, are packed end to end into steps of at most max_tokens tokens (variable-length
 * packing: an encoder's attention is block-diagonal, a decoder's causal within each sequence,
 * so padding costs nothing) and pooled straight from the last hidden states (on the device
 * when the backend has pool_enc: CUDA).
 *
 * Ownership: md_embedder_open owns the model file, backend, tokenizer and buffers it opens;
 * md_embedder_close frees them. One thread drives an embedder. */
#ifndef MEDLEY_ENGINE_EMBEDDER_H
#define MEDLEY_ENGINE_EMBEDDER_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "engine/weights/st_config.h"

typedef struct md_embedder md_embedder;

typedef struct {
    const char *device; /* "cpu", "cpu:N", "cpu-exact", "cuda:K", "cuda-exact:K" (NULL: cpu) */
    int n_threads;      /* 0: every core */
    int max_tokens;     /* tokens per packed step (0: 4096) */
} md_embedder_opts;

/* Open a model path (GGUF with an encoder architecture, or an HF / sentence-transformers
 * directory; a decoder only with last-token pooling). A tokenizer the engine cannot load is
 * not an error here: token-id inputs still work and md_embedder_tokenize reports why text
 * cannot. */
int md_embedder_open(const char *path, const md_embedder_opts *o, md_embedder **out, md_err *e);
void md_embedder_close(md_embedder *m);
/* 1 when path opens as an embedding model: an encoder, or a decoder directory whose
 * sentence-transformers pipeline pools the last token (nothing kept open). */
int md_embedder_probe(const char *path);

int md_embedder_dim(const md_embedder *m);     /* the vector's length */
int md_embedder_n_vocab(const md_embedder *m); /* token ids are 0..n_vocab-1 */
int md_embedder_max_len(const md_embedder *m); /* longest input in tokens: max_seq_length, else
                                                  the model's context */
const st_config *md_embedder_st(const md_embedder *m);
const char *md_embedder_device(const md_embedder *m); /* "cpu" or "cuda" */
/* An encoder's products in BF16 (on = 1; F32 sums) or F32 (0, the default) from now on:
 * about twice the speed on a CPU with AVX512-BF16, at a cosine to the F32 vectors given in
 * docs/embeddings.md "Speed". MD_EUNSUPP for a decoder or a backend / CPU that cannot (the
 * embedder stays F32). */
int md_embedder_set_bf16(md_embedder *m, int on, md_err *e);

/* Text to token ids with the model's special tokens ([CLS] ... [SEP]); *ids malloc'd (caller
 * frees). MD_EUNSUPP with the tokenizer's load error when the model's tokenizer is not one
 * medley runs. */
int md_embedder_tokenize(const md_embedder *m, const char *text, size_t len, int32_t **ids,
                         int *n_ids, md_err *e);

/* Embed n inputs: ids[i] [lens[i]] (1 <= lens[i] <= md_embedder_max_len, ids < n_vocab,
 * checked: MD_ERANGE / MD_EINVAL naming the input) into out [n, dim], pooled and normalised as
 * the model's pipeline says. Packs as many inputs into each step as fit. */
int md_embedder_run(md_embedder *m, const int32_t *const *ids, const int *lens, int n, float *out,
                    md_err *e);

/* Pooling of one sequence's hidden states h [n, C] into out [C] (host math, no normalising). */
void md_pool(st_pooling p, const float *h, int n, int C, float *out);
/* x [n] scaled to unit L2 length (left as is when its length is 0). */
void md_l2_normalize(float *x, int n);

#endif
