/* hf_config.h — a Hugging Face config.json in the engine's terms: which GGUF architecture a
 * checkpoint is (llama, mistral -> llama, qwen2, qwen3, gemma3), its hyper-parameters, and the
 * GGUF name of each of its tensors (as llama.cpp's convert_hf_to_gguf.py names them), so that
 * engine/weights/hf_model.c can present an HF directory as a gguf_file and the rest of the engine
 * reads it as it reads GGUF.
 *
 * Accepted: model_type llama, mistral, qwen2, qwen3, gemma3_text (and gemma3 with a
 * text_config: its language model), and the encoder bert (hf_encoder.c). Anything else is
 * MD_EUNSUPP naming the model_type and the architectures. Features the engine cannot run exactly
 * are refused here with the key named (docs/models.md, "Hugging Face directories"): an activation
 * other than SiLU (GELU-tanh for Gemma 3), a RoPE type other than default, linear or llama3 (named,
 * in either spelling), MLP or output biases, Qwen's use_sliding_window, layer_types the engine
 * cannot lay out, use_bidirectional_attention true (a decoder run as an encoder). RoPE is read as
 * transformers 4 writes it (top-level rope_theta, rope_scaling, Gemma 3's rope_local_base_freq) and
 * as transformers 5 does (rope_parameters, per layer type for Gemma 3: full_attention,
 * sliding_attention). Gemma 3's layer pattern comes from layer_types (v5) or sliding_window_pattern
 * (v4). A Mistral sliding window slides on every layer, as GGUF Mistral's does; the context stays
 * max_position_embeddings.
 *
 * Nothing here allocates beyond the parse; hf_config is a plain value. */
#ifndef MEDLEY_ENGINE_HF_CONFIG_H
#define MEDLEY_ENGINE_HF_CONFIG_H

#include <jansson.h>
#include <stddef.h>

#include "common/err.h"

typedef struct {
    char model_type[32]; /* as config.json says: "llama", "qwen2", "gemma3_text", ... */
    char arch[16];       /* the GGUF architecture: "llama", "qwen2", "qwen3", "gemma3" */
    char prefix[32];     /* HF tensor name prefix: "model." ("language_model.model." nested) */
    int n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab;
    int n_ctx;             /* max_position_embeddings */
    double rope_theta;     /* global layers (and all layers but Gemma 3's local ones) */
    double rope_theta_swa; /* Gemma 3 local layers; 0 otherwise */
    double eps;            /* rms_norm_eps */
    char rope_scaling[8];  /* "", "linear" or "llama3" */
    double rope_factor;    /* linear / llama3 factor */
    double rope_low_freq_factor, rope_high_freq_factor; /* llama3 */
    int rope_orig_ctx;  /* llama3 original_max_position_embeddings */
    int tie_embeddings; /* lm_head is embed_tokens (tie_word_embeddings) */
    int attn_bias;      /* q/k/v projections have biases (Qwen2; Llama attention_bias) */
    int qk_norm;        /* per-head RMSNorm of q and k (Qwen3, Gemma 3) */
    int sliding_window; /* window in tokens of the sliding layers (Gemma 3's local ones,
                           every Mistral layer); 0: none */
    int swa_pattern;    /* Gemma 3: layer l is global when (l + 1) % swa_pattern == 0; 0:
                           every layer slides (always so for Mistral) */
    int norm_plus_one;  /* Gemma: RMSNorm multiplies by (1 + w); GGUF stores 1 + w */
    /* Encoders (model_type bert, hf_encoder.c): arch "bert", eps is layer_norm_eps */
    int encoder;
    int n_types; /* type_vocab_size */
} hf_config;

/* Read DIR/config.json. MD_ENOTFOUND when it is absent, MD_EFORMAT naming the key for a
 * missing or malformed value, MD_EUNSUPP for an architecture or feature refused above. */
int hf_config_load(const char *dir, hf_config *c, md_err *e);
/* The same from parsed JSON; `where` names it in errors. */
int hf_config_parse(json_t *root, const char *where, hf_config *c, md_err *e);

/* The GGUF name of HF tensor `hf` ("model.layers.3.self_attn.q_proj.weight" ->
 * "blk.3.attn_q.weight"): 1 with gguf filled, 0 for a tensor the engine does not use and may
 * skip (rotary_emb.inv_freq; lm_head when the embeddings are tied; a multimodal checkpoint's
 * vision tower), -1 for a tensor this architecture should not have (its weights would be
 * ignored and the answers wrong: the caller refuses the checkpoint naming it). */
int hf_tensor_gguf_name(const hf_config *c, const char *hf, char *gguf, size_t gguf_sz);

/* Encoder checkpoints (hf_encoder.c), called by the two above for model_type bert:
 * BertModel's config.json keys (hidden_act must be "gelu", position_embedding_type
 * "absolute"), and its tensor names to llama.cpp's `bert` ones (a "bert." prefix is dropped;
 * embeddings.position_ids, pooler.* and cls.* are skipped). */
int hf_encoder_parse(json_t *o, const char *where, hf_config *c, md_err *e);
int hf_encoder_tensor_name(const hf_config *c, const char *hf, char *gguf, size_t gguf_sz);

#endif
