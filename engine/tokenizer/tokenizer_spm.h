/* tokenizer_spm.h — SentencePiece BPE for GGUF "llama" vocabularies (tokenizer_spm.c). Built
 * on vocab.h; used by the dispatcher (tokenizer.c). Private to the tokenizer. */
#ifndef MEDLEY_ENGINE_TOKENIZER_SPM_H
#define MEDLEY_ENGINE_TOKENIZER_SPM_H

#include "engine/tokenizer/vocab.h"

/* Encode one text fragment (no special tokens in it); space_prefix: it starts the prompt or
 * follows a special token, and add_space_prefix is on. */
int tok_spm_encode(const tok_tokenizer *t, tok_scratch *sc, const char *text, size_t len,
                   int space_prefix, tok_out *out, md_err *e);

#endif
