/* grammar_vocab.h — the engine's tokenizer seen by the grammar engine (engine/grammar/grammar.h
 * gr_vocab): each token as the exact bytes it adds to the output, and the end tokens.
 *
 * A token's bytes are what the engine's text decode appends for it: byte-level BPE pieces
 * mapped back to bytes, SentencePiece ▁ as a space and <0xNN> byte tokens as their byte,
 * user-defined tokens as their text; control and unknown tokens (<|im_start|>, <unk>) and the
 * end tokens add nothing (length 0). The end tokens are those the engine stops a sequence on
 * (tokenizer.h tok_is_eog: EOS, EOT, <|im_end|>, ...).
 *
 * Ownership: md_vocab_bytes borrows the token bytes from the tokenizer (valid while it lives)
 * and owns its arrays (md_vocab_bytes_free). Its fields are gr_vocab_new's arguments, which
 * copies what it needs. */
#ifndef MEDLEY_ENGINE_GRAMMAR_VOCAB_H
#define MEDLEY_ENGINE_GRAMMAR_VOCAB_H

#include <stdint.h>

#include "common/err.h"
#include "engine/grammar/grammar.h"
#include "engine/tokenizer/tokenizer.h"

typedef struct {
    int n_vocab;
    const char **tok; /* [n_vocab] token bytes (borrowed from the tokenizer) */
    uint32_t *len;    /* [n_vocab] their lengths; 0: adds nothing to the output */
    int32_t *eos;     /* [n_eos] the end tokens, ascending */
    int n_eos;
} md_vocab_bytes;

/* Fill vb from t: MD_ENOMEM, or MD_EINVAL for a tokenizer without tokens or without any end
 * token (a grammar could never finish). */
int md_vocab_bytes_make(const tok_tokenizer *t, md_vocab_bytes *vb, md_err *e);
void md_vocab_bytes_free(md_vocab_bytes *vb);

/* The gr_vocab of t: md_vocab_bytes_make, then gr_vocab_new (which copies). The caller frees
 * it with gr_vocab_free. */
int md_grammar_vocab_new(const tok_tokenizer *t, gr_vocab **out, md_err *e);

#endif
