/* tokenizer_norm.h — tokenizer.json normalization of one text fragment at encode time
 * (tokenizer_norm.c): the normalizer steps tokenizer_hf.c loaded (NFC, Prepend, Replace),
 * Metaspace's replacement and ByteLevel's prefix space. Built on vocab.h; used by the BPE
 * encoder. Private to the tokenizer. */
#ifndef MEDLEY_ENGINE_TOKENIZER_NORM_H
#define MEDLEY_ENGINE_TOKENIZER_NORM_H

#include "engine/tokenizer/vocab.h"

/* Normalize in[0..n) (already valid UTF-8 apart from encoded surrogates); at_start: the
 * fragment starts the text (Metaspace's "first"). *out is in or a scratch buffer of sc.
 * MD_ENOMEM. */
int tok_hf_normalize(const tok_tokenizer *t, tok_scratch *sc, const char *in, size_t n,
                     int at_start, const char **out, size_t *out_len, md_err *e);

#endif
