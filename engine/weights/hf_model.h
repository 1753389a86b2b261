/* hf_model.h — a model path opened as a gguf_file: a GGUF file as it is, or a Hugging Face
 * directory (config.json + safetensors shards) presented as one (or, md_model_open_any, a
 * synthetic model's image, synth.h), so the engine, the stages,
 * `medley models inspect` and the scheduler read both the same way (docs/models.md).
 *
 * An HF directory becomes a gguf_file (gguf_open_parts) whose metadata carries llama.cpp's keys
 * for the architecture (hf_config.h) and whose tensors carry llama.cpp's names, their data
 * pointing into the mmap'd shards: matrices stay as stored (BF16 stays BF16, F16 F16), only
 * 1-D tensors (norms, biases; a few KiB) are widened to F32 copies as the engine binds norms in
 * F32 (Gemma's stored w - 1 becoming 1 + w there). HF keeps q/k projections in the
 * rotate-half RoPE layout (pairs i, i + d/2), which the GGUF llama files permute to adjacent
 * pairs; the metadata says so with medley.rope.neox = true instead of permuting weights.
 * medley.hf.dir holds the directory, for the tokenizer (md_model_tokenizer,
 * engine/tokenizer/tokenizer.h).
 *
 * Ownership: the gguf_file owns the mappings and copies; gguf_close releases them. */
#ifndef MEDLEY_ENGINE_HF_MODEL_H
#define MEDLEY_ENGINE_HF_MODEL_H

#include <stddef.h>

#include "common/err.h"
#include "engine/weights/gguf.h"

/* 1 when path is a directory holding a config.json. */
int md_is_hf_dir(const char *path);
/* Open DIR (config.json + model.safetensors or its index). Errors name the directory, the file
 * and the tensor or key: MD_ENOTFOUND, MD_EFORMAT, MD_EUNSUPP (an architecture, dtype or
 * feature the engine cannot run). */
int hf_open_dir(const char *dir, gguf_file **out, md_err *e);
/* A GGUF file or an HF directory, whichever path is. */
int md_model_open(const char *path, gguf_file **out, md_err *e);
/* A model as the engine and its stages name it: a synthetic name (synth.h) built into *synth
 * (random weights when `weights`, metadata and untouched pages otherwise), else
 * md_model_open(path). *synth (NULL for a file) must outlive *gf: gguf_close it first, then
 * md_synth_free(*synth, *synth_len). */
int md_model_open_any(const char *path, int weights, void **synth, size_t *synth_len,
                      gguf_file **gf, md_err *e);
/* The HF directory a gguf_file was made from, or NULL for a GGUF file. Lives as long as gf. */
const char *hf_dir_of(const gguf_file *gf, size_t *len);

#endif
