/* tokenizer.h — tokenizers read from a GGUF vocabulary: byte-level BPE (gpt2, llama-bpe,
 * qwen2, smollm pre-tokenizers through PCRE2) and SentencePiece (llama/TinyLlama, byte
 * fallback); or from a Hugging Face tokenizer.json (BPE with its pre-tokenizer sequence, or
 * BERT's WordPiece); special and added tokens; streaming-safe decoding; chat templates.
 *
 * For a tokenizer.json, BOS and EOS are the tokens its post-processor puts around a single
 * sequence (TemplateProcessing, BertProcessing): for BERT, tok_bos is [CLS] and tok_eos
 * [SEP], and tok_encode with add_bos gives [CLS] ... [SEP] as `tokenizers` does with
 * add_special_tokens; without add_bos, the text's tokens alone. The file's truncation and
 * padding are not applied (the caller knows its sequence length).
 *
 * Ownership: tok_load copies what it needs out of the gguf_file (the file may be closed
 * afterwards), tok_load_hf out of the JSON files; tok_free releases it. A tok_tokenizer is
 * read-only after load, so threads may share it; tok_stream holds per-sequence decoding state. */
#ifndef MEDLEY_ENGINE_TOKENIZER_H
#define MEDLEY_ENGINE_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "engine/weights/gguf.h"

typedef struct tok_tokenizer tok_tokenizer;

/* MD_EFORMAT when a tokenizer key is missing or malformed (naming it), MD_EUNSUPP for a
 * tokenizer.ggml.model or tokenizer.ggml.pre medley does not implement (see
 * docs/tokenizer.md), MD_ENOMEM. */
/* The model's tokenizer: the GGUF vocabulary (tok_load), or for a Hugging Face directory
 * (engine/weights/hf_model.h) its tokenizer.json (tok_load_hf). */
int md_model_tokenizer(const gguf_file *gf, tok_tokenizer **out, md_err *e);
int tok_load(const gguf_file *f, tok_tokenizer **out, md_err *e);
/* A Hugging Face tokenizer (docs/models.md, "Tokenizers"). path: a model directory holding
 * tokenizer.json (and tokenizer_config.json, read when present: bos/eos tokens,
 * add_bos_token, add_eos_token, chat_template), or a tokenizer.json file (its directory's
 * tokenizer_config.json is read the same way). MD_EIO when a file cannot be read,
 * MD_EFORMAT for malformed JSON or a bad value, MD_EUNSUPP for a component medley does not
 * implement; the message names the file, the JSON path and the value
 * ("tokenizer.json: pre_tokenizer.pretokenizers[1].type 'Whitespace' is not supported"). */
int tok_load_hf(const char *path, tok_tokenizer **out, md_err *e);
/* The same from memory: tokenizer.json's text, and tokenizer_config.json's text or NULL. */
int tok_load_hf_mem(const char *json, size_t len, const char *config, size_t config_len,
                    tok_tokenizer **out, md_err *e);
void tok_free(tok_tokenizer *t);

int tok_n_vocab(const tok_tokenizer *t);
int32_t tok_bos(const tok_tokenizer *t); /* -1 if none */
int32_t tok_eos(const tok_tokenizer *t);
/* End-of-generation: EOS, EOT, <|im_end|> and the like. */
int tok_is_eog(const tok_tokenizer *t, int32_t id);
/* Whether the model wants BOS prepended (tokenizer.ggml.add_bos_token). */
int tok_add_bos(const tok_tokenizer *t);

/* Encode len bytes of text. add_bos: prepend BOS when the model uses one (and append EOS
 * when tokenizer.ggml.add_eos_token asks; llama.cpp's add_special). parse_special:
 * recognise control tokens written in the text ("<|im_start|>"); user-defined tokens are
 * always recognised. *ids is malloc'd (caller frees); on error *ids is NULL, *n_ids 0.
 * Invalid UTF-8 is handled as llama.cpp does (BPE: each bad byte becomes U+FFFD, overlong
 * forms their shortest form; SentencePiece: bytes go to <0xXX> tokens); a sequence that
 * decodes past U+10FFFF (llama.cpp aborts on it) is refused with MD_EINVAL naming the byte
 * offset. Never a crash. */
int tok_encode(const tok_tokenizer *t, const char *text, size_t len, int add_bos, int parse_special,
               int32_t **ids, int *n_ids, md_err *e);

/* The bytes a token stands for (byte-level mapping and SentencePiece ▁ undone); may be an
 * incomplete UTF-8 sequence. Control and unknown tokens give their text only when
 * render_special. NUL-terminated; lives as long as t. Unknown ids give "". */
const char *tok_piece(const tok_tokenizer *t, int32_t id, int render_special, size_t *len);
/* The token's vocabulary string as stored (for `medley tokenize` pieces). */
const char *tok_token_text(const tok_tokenizer *t, int32_t id);

/* Tokenizer kind as named in the GGUF ("gpt2" = byte-level BPE, "llama" = SentencePiece)
 * and the BPE pre-tokenizer in use ("smollm", "llama-bpe", "qwen2", "gpt2", "default"). */
const char *tok_model_name(const tok_tokenizer *t);
const char *tok_pre_name(const tok_tokenizer *t);
/* Id of the token whose vocabulary string is exactly text[0..len), or -1. */
int32_t tok_find(const tok_tokenizer *t, const char *text, size_t len);
/* Longest piece in bytes (tok_piece with render_special = 1). */
size_t tok_max_piece_len(const tok_tokenizer *t);

/* Whole-sequence decode to valid UTF-8 (bytes that never form a character become U+FFFD).
 * *out is malloc'd and NUL-terminated (caller frees); *len excludes the NUL. */
int tok_decode(const tok_tokenizer *t, const int32_t *ids, int n_ids, int render_special,
               char **out, size_t *len, md_err *e);

/* Streaming decode: push ids, get back only complete UTF-8 characters; bytes of a
 * character split over tokens are held until it completes. Bytes that can never start or
 * continue a character come out as U+FFFD (one per maximal invalid subpart), so the output
 * is always valid UTF-8. Control
 * tokens (EOS, <|im_end|>) add nothing. out needs tok_max_piece_len(t) + 16 bytes to be
 * sure nothing is cut; with less, output stops at the last character that fits and the
 * rest of that push is dropped. */
typedef struct {
    char pending[8];
    int n_pending;
    int started; /* a token gave text (WordPiece puts no space before the first word) */
} tok_stream;
void tok_stream_init(tok_stream *s);
/* Appends the newly complete text to out (capacity cap, NUL-terminated) and returns the
 * number of bytes appended. */
size_t tok_stream_push(const tok_tokenizer *t, tok_stream *s, int32_t id, char *out, size_t cap);
/* End of stream: held bytes that never completed a character come out as U+FFFD. */
size_t tok_stream_flush(tok_stream *s, char *out, size_t cap);

/* Chat templates: chosen from the template text stored in the GGUF
 * (tokenizer.chat_template). */
typedef enum {
    TOK_TMPL_NONE = 0,
    TOK_TMPL_CHATML,
    TOK_TMPL_LLAMA3,
    TOK_TMPL_LLAMA2,
    TOK_TMPL_MISTRAL,
    TOK_TMPL_GEMMA,
} tok_template;
/* The template text stored in the GGUF (NULL, *len 0 if none); lives as long as t. */
const char *tok_chat_template_text(const tok_tokenizer *t, size_t *len);
/* Short name ("chatml", "llama3", "llama2", "mistral", "gemma", "none") and back (TOK_TMPL_NONE if
 * the name is unknown). */
const char *tok_template_name(tok_template tmpl);
tok_template tok_template_from_name(const char *name);
typedef struct {
    const char *role; /* "system", "user", "assistant" */
    const char *content;
} tok_chat_msg;
/* Template of the model (or the one tok_chat_choose forced); TOK_TMPL_NONE if it has none
 * or it is not recognised. */
tok_template tok_chat_template(const tok_tokenizer *t);
/* Choose the chat template once, after load and before the tokenizer is shared between
 * threads. name (a --chat-template flag) overrides the model's template; "none" means raw
 * prompts only (tok_chat_apply then refuses). With name NULL the model's own template must
 * be one medley recognises, or absent. MD_EINVAL for an unknown name, MD_EUNSUPP for a
 * template medley does not recognise; both messages list the known names and the flag. */
int tok_chat_choose(tok_tokenizer *t, const char *name, md_err *e);
/* Render messages into a prompt (malloc'd, caller frees). add_generation_prompt appends
 * the assistant header. MD_EUNSUPP names the unknown template unless the caller uses raw
 * prompts instead. */
int tok_chat_apply(const tok_tokenizer *t, const tok_chat_msg *msgs, int n_msgs,
                   int add_generation_prompt, char **out, md_err *e);
/* Same with a template the caller names (a --chat-template flag), whatever the GGUF says;
 * t may be NULL (then no default system prompt is taken from the model's template). */
int tok_chat_apply_as(const tok_tokenizer *t, tok_template tmpl, const tok_chat_msg *msgs,
                      int n_msgs, int add_generation_prompt, char **out, md_err *e);

#endif
