/* model_check.h — would the engine load this model? The test `medley models add` runs before
 * it records a name (engine/weights/registry.h, md_model_add's check), so that a directory or
 * file that generate would refuse is refused when it is added, with the same reason.
 *
 * Checks what md_engine_open checks of the model, without a backend: hyperparameters, every
 * tensor's presence, shape and type (md_model_check, engine/model/model.h), the tokenizer
 * (GGUF vocabulary or tokenizer.json + tokenizer_config.json) loads, and it has no more
 * tokens than the output head has rows. Reads metadata and the tokenizer; no weight is read
 * or copied. An encoder (engine/model/encoder.h) is checked by binding its weights on a
 * one-thread CPU backend (aliased, not read); its tokenizer is not required. */
#ifndef MEDLEY_ENGINE_MODEL_CHECK_H
#define MEDLEY_ENGINE_MODEL_CHECK_H

#include "common/err.h"
#include "engine/weights/gguf.h"

/* 0 when the engine would load gf; else its error (MD_EFORMAT, MD_EUNSUPP, ...) naming the
 * key, tensor or file. */
int md_model_loadable(const gguf_file *gf, md_err *e);

#endif
