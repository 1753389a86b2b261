/* synth.h — synthetic models: a GGUF image with a real model's shapes and random weights,
 * built in memory, so throughput can be measured and profiles written (`medley generate`,
 * `medley profile`) for models whose weights are not at hand — a 70B on an H100 before
 * downloading 140 GB, the "Llama-3-8B-shaped BF16 model".
 *
 * Names: "synthetic:<shape>[:<type>]", shape one of md_synth_shapes() (llama-3-8b,
 * llama-3-70b, llama-3.2-1b, mistral-7b, qwen2-7b, smollm2-135m, tiny, ...; the encoders
 * minilm-l6 and bert-tiny, `bert` files that engine/embedder.h opens), type bf16 (default),
 * f32, f16, q8_0 or q4_0 for the matrices (norms and biases are F32). Weights are uniform random
 * with the standard deviation of a fresh initialisation (0.02), from a fixed seed: the same name
 * gives the same bytes everywhere. The tokenizer is a SentencePiece vocabulary of the
 * model's size (byte fallback + numbered pieces): text works, it is just not a language.
 * The output is garbage by design; the point is the arithmetic and memory traffic, which
 * equal the real model's.
 *
 * Ownership: md_synth_build gives an anonymous mapping the caller releases with
 * md_synth_free after closing every gguf_file opened over it (gguf_open_mem). */
#ifndef MEDLEY_ENGINE_SYNTH_H
#define MEDLEY_ENGINE_SYNTH_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

#define MD_SYNTH_PREFIX "synthetic:"

/* 1 when name starts with "synthetic:". */
int md_synth_is(const char *name);
/* The shape names, comma-separated, for help texts and errors. */
const char *md_synth_shapes(void);
/* Build the GGUF image of spec ("synthetic:..."); MD_ENOTFOUND for an unknown shape or type,
 * MD_ENOMEM when the host cannot hold it. weights = 0 leaves the tensor data unwritten
 * (zero pages, no memory used): enough to read the metadata. */
int md_synth_build(const char *spec, int weights, void **image, size_t *len, md_err *e);
void md_synth_free(void *image, size_t len);
/* Without building: the bytes of every tensor and the parameter count of spec. */
int md_synth_size(const char *spec, size_t *weight_bytes, int64_t *n_params, md_err *e);

#endif
