/* tokenizer_bpe.h — byte-level and character-level BPE (tokenizer_bpe.c): the PCRE2
 * pre-tokenizer stages and merges by rank. Built on vocab.h and the normalizers of
 * tokenizer_norm.h; used by the loaders (tokenizer_gguf.c, tokenizer_hf.c) to set a
 * vocabulary up and by the dispatcher (tokenizer.c) to encode. Private to the tokenizer. */
#ifndef MEDLEY_ENGINE_TOKENIZER_BPE_H
#define MEDLEY_ENGINE_TOKENIZER_BPE_H

#include "engine/tokenizer/vocab.h"

/* The GPT-2 split (Hugging Face's ByteLevel use_regex), \s spelled as White_Space. */
extern const char tok_re_gpt2[];
/* Compile a pre-tokenizer stage (PCRE2, UTF + UCP; literal: the pattern is a plain string)
 * and append it. MD_EINVAL with PCRE2's message, MD_ERANGE past TOK_MAX_RE stages. The
 * compiled code is the tokenizer's (tok_free releases it). */
int tok_re_add(tok_tokenizer *t, const char *pattern, size_t len, int literal, int behavior,
               int invert, md_err *e);
/* The byte-pair table from the merges, and (GGUF vocabularies) the pre-tokenizer stages of
 * t->pre; tokenizer.json loaders added theirs with tok_re_add already. */
int tok_bpe_init(tok_tokenizer *t, md_err *e);
/* Encode one text fragment (no special tokens in it). base: the fragment's byte offset in
 * the caller's text, for error messages (and, for tokenizer.json, Metaspace's "first"). */
int tok_bpe_encode(const tok_tokenizer *t, tok_scratch *sc, const char *text, size_t len,
                   size_t base, tok_out *out, md_err *e);

#endif
