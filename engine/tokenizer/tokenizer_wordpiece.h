/* tokenizer_wordpiece.h — BERT's tokenizer from a tokenizer.json (tokenizer_wordpiece.c):
 * BertNormalizer, BertPreTokenizer and WordPiece with its continuation prefix, read by
 * tokenizer_hf.c when model.type is "WordPiece" and used by the dispatcher (tokenizer.c) to
 * encode. Built on vocab.h and libutf8proc; private to the tokenizer. */
#ifndef MEDLEY_ENGINE_TOKENIZER_WORDPIECE_H
#define MEDLEY_ENGINE_TOKENIZER_WORDPIECE_H

#include <jansson.h>

#include "engine/tokenizer/vocab.h"

/* model of type WordPiece: unk_token (must be in model.vocab), continuing_subword_prefix
 * (default "##"), max_input_chars_per_word (default 100). added: the added_tokens array (or
 * NULL): tokens it adds that are not in model.vocab are never WordPiece pieces. file names
 * tokenizer.json in messages. Sets t->kind to TOK_KIND_WP. */
int tok_wp_load_model(tok_tokenizer *t, json_t *model, json_t *added, const char *file, md_err *e);
/* A BertNormalizer object at path (clean_text, handle_chinese_chars, strip_accents: null
 * follows lowercase, lowercase). MD_EUNSUPP when a second one comes. */
int tok_wp_load_normalizer(tok_tokenizer *t, json_t *p, const char *file, const char *path,
                           md_err *e);
/* A WordPiece decoder object at path (prefix, cleanup). */
int tok_wp_load_decoder(tok_tokenizer *t, json_t *p, const char *file, const char *path, md_err *e);
/* After the vocabulary and components are read: the longest token, the model name. */
void tok_wp_finish(tok_tokenizer *t);

/* Encode one text fragment (no added tokens in it): normalize, split into words, WordPiece
 * each word. Bytes that are not UTF-8 become U+FFFD (one per maximal invalid subpart, as
 * Python's 'replace' decoding), which clean_text then drops. MD_ENOMEM. */
int tok_wp_encode(const tok_tokenizer *t, tok_scratch *sc, const char *text, size_t len,
                  tok_out *out, md_err *e);

#endif
