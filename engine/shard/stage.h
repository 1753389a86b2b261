/* stage.h — one pipeline stage of a sharded model (docs/sharding.md): the layers [lo, hi) of
 * a model on one backend (or, with tp > 1, on tp backends that split every layer's heads
 * and FFN columns), with the KV cache of those layers and activation buffers for one
 * micro-batch. The first stage (lo == 0) also holds the token embedding, the last (hi ==
 * n_layer) the final norm and the output head. A stage loads only its own weights.
 *
 * A stage does not schedule: the head (engine/engine.c) decides every step's layout — token
 * ids, positions, cache slots, block tables, logit rows — and hands it over with the hidden
 * states; every stage of a replica holds the same number of cache slots, so the head's block
 * tables are valid on each.
 *
 * Ownership: md_stage_open gives a stage the caller frees with md_stage_close. One thread at
 * a time runs a stage. */
#ifndef MEDLEY_ENGINE_STAGE_H
#define MEDLEY_ENGINE_STAGE_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "engine/model/model.h"
#include "kernels/backend.h"

#define MD_STAGE_MAX 8 /* stages in one replica */
#define MD_TP_MAX 8    /* ranks of one tensor-parallel stage */

/* What a stage is and the sizes the head chose; the same on every stage of a replica except
 * lo, hi and the device. Sent as is to a stage in another process (engine/shard/wire.h HELLO). */
typedef struct {
    char model[512]; /* as the head opened it: a GGUF path, a registry name or "synthetic:..." */
    uint64_t model_hash; /* md_model_hash of the head's file; 0 = do not check */
    int lo, hi;          /* layers [lo, hi) */
    char device[64];     /* "cpu", "cpu:N", "cuda:0", ... ; with tp > 1, a comma list of tp devices
                            or one name every rank opens */
    int n_threads;       /* CPU threads of this stage (0 = every core) */
    int tp;              /* tensor-parallel ranks (0 or 1 = none) */
    int n_slots;         /* KV cache slots (blocks * block_tokens) */
    int kv_type;         /* the KV cache's element type as a code (MD_STAGE_KV_*, below) */
    int max_tokens;      /* most tokens in one micro-batch */
    int max_seqs;        /* most sequences in one micro-batch (= most logit rows) */
    int max_blocks;      /* block table width */
    int block_tokens;
    int n_ctx;
    size_t mem_cap; /* refuse when this stage's weights + KV cache exceed it (0 = none) */
} md_stage_config;

/* md_stage_config.kv_type, in memory and on the wire (HELLO): MD_STAGE_KV_BACKEND (0) for the
 * stage backend's own type, else a GGUF type id (MD_TYPE_F16, MD_TYPE_BF16) — except F32,
 * whose id is 0 and so would read as the backend's: it is MD_STAGE_KV_F32. A stage built
 * before this code existed refuses -1 as out of range instead of running its default. */
#define MD_STAGE_KV_BACKEND 0
#define MD_STAGE_KV_F32 (-1)
/* The code of KV element type md_type (MD_TYPE_F32 gives MD_STAGE_KV_F32). */
int md_stage_kv_code(int md_type);
/* The element type a code stands for on a backend whose own KV type is backend_type. */
int md_stage_kv_type(int code, int backend_type);

typedef struct md_stage md_stage;

/* A fingerprint of a model file's contents as the engine sees them: its metadata and tensor
 * directory (names, types, shapes, offsets) and its size. Two processes opening the same file
 * (or the same synthetic name) get the same value. */
int md_model_hash(const char *model, uint64_t *out, md_err *e);
/* The same fingerprint of a file already open (synthetic: its image came from synth.h, whose
 * random weights are not part of the fingerprint). */
uint64_t md_model_hash_gf(const gguf_file *gf, int synthetic);

/* The model's hyperparameters from its metadata (n_vocab from the embedding when the
 * metadata lacks it), loading no weight. */
int md_model_shape(const char *model, md_hparams *hp, md_err *e);
/* The same of a file already open; model names it in errors. */
int md_model_shape_gf(const gguf_file *gf, const char *model, md_hparams *hp, md_err *e);

/* Bytes the layers [lo, hi) of model take on a backend (weights, with the embedding for lo
 * == 0 and the head for hi == n_layer) and per KV slot (K and V of those layers, in a cache
 * of kv_type, an MD_STAGE_KV_* code; the backend's counted as F16). */
int md_stage_bytes(const char *model, int lo, int hi, int kv_type, size_t *weights,
                   size_t *kv_per_slot, md_err *e);

/* Load the stage: checks the model's hash (when c->model_hash != 0), the range against the
 * model's layer count, the memory cap, and tp against the heads (MD_EINVAL with the numbers
 * when they do not divide). */
int md_stage_open(const md_stage_config *c, md_stage **out, md_err *e);
void md_stage_close(md_stage *s);

const md_hparams *md_stage_hparams(const md_stage *s);
const md_stage_config *md_stage_get_config(const md_stage *s);
const char *md_stage_describe(md_stage *s); /* "layers 0-7 on cpu: 1 thread, avx2" */

/* Width of what the stage gives back for b: n_embd floats per token for an inner stage,
 * n_vocab per logit row for the last (1 with b->argmax_only). */
size_t md_stage_out_floats(const md_stage *s, const md_batch *b);

/* Run one micro-batch: in [T, n_embd] F32 host (ignored by a first stage, which embeds
 * b->tokens), out (host) the hidden states [T, n_embd] after layer hi - 1, or for the last
 * stage the logits [n_logits, n_vocab] of b->logit_rows — or with b->argmax_only each row's
 * argmax [n_logits] as floats holding the token ids (-1 for a row with a NaN), the lowest id
 * on ties as the engine's sampler. b must already be checked
 * (md_batch_check) against this stage's sizes. */
int md_stage_run(md_stage *s, const md_batch *b, const float *in, float *out, md_err *e);

/* Check a layout from an untrusted source against a stage's sizes: counts within
 * max_tokens / max_seqs, tokens < n_vocab, sequences contiguous and in range, positions <
 * n_ctx, slots < n_slots, every block a sequence reads < n_slots / block_tokens, logit rows
 * < n_tokens. MD_EINVAL naming the first fault. */
int md_batch_check(const md_batch *b, const md_stage_config *c, int n_vocab, md_err *e);

#endif
