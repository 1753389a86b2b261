/* tokenizer_int.h — the tokenizer's private layout, shared by tokenizer.c (load, pieces,
 * decode), tokenizer_bpe.c, tokenizer_spm.c and tokenizer_chat.c. Not part of the engine's
 * contract: everything outside the tokenizer goes through engine/tokenizer.h. */
#ifndef MEDLEY_ENGINE_TOKENIZER_INT_H
#define MEDLEY_ENGINE_TOKENIZER_INT_H

#include <stddef.h>
#include <stdint.h>

#include "engine/tokenizer.h"

typedef enum { TOK_KIND_BPE = 1, TOK_KIND_SPM = 2 } tok_kind;

/* Pre-tokenizer families (llama.cpp's LLAMA_VOCAB_PRE_TYPE_*, the ones we support). */
typedef enum {
    TOK_PRE_DEFAULT = 0,
    TOK_PRE_GPT2,
    TOK_PRE_LLAMA3,
    TOK_PRE_QWEN2,
    TOK_PRE_SMOLLM,
} tok_pre;

/* Token attributes, from tokenizer.ggml.token_type. */
enum {
    TOK_A_NORMAL = 1,
    TOK_A_UNKNOWN = 2,
    TOK_A_CONTROL = 4,
    TOK_A_USER = 8,
    TOK_A_UNUSED = 16,
    TOK_A_BYTE = 32,
};

#define TOK_MAX_RE 4

struct tok_tokenizer {
    tok_kind kind;
    char model_name[8];
    char pre_name[32];
    tok_pre pre;
    int n_vocab; /* ids [0, n_vocab) are tokens */

    /* String table: ids [0, n_vocab) are the tokens, ids past it are merge parts that are
     * not tokens (so BPE can merge through them exactly as llama.cpp's string pairs do). */
    char *arena;
    size_t arena_len, arena_cap;
    uint32_t *str_off, *str_len;
    int n_str, str_cap;
    int32_t *hslots; /* open addressing over string ids; -1 empty */
    uint32_t hmask;

    float *scores;
    uint8_t *attr;
    uint8_t *is_eog;
    int32_t bos, eos, eot, eom, unk;
    int add_bos, add_eos, add_space_prefix, ignore_merges;

    /* BPE merges: (left id, right id) -> (rank, merged id), open addressing with key and
     * value side by side (one cache line per probe); key UINT64_MAX = empty. */
    struct tok_merge {
        uint64_t key;
        int32_t rank, id;
    } * merges;
    uint32_t merge_mask;
    /* The merge of two raw bytes' alphabet characters, for the first pairs of every word
     * (most lookups): index (a << 8 | b); rank -1 when there is none. 512 KiB. */
    struct tok_pair0 {
        int32_t rank, id;
    } * pair0;
    uint16_t cpt_of_byte[256];    /* byte-level alphabet */
    int32_t byte_sym[256];        /* string id of the alphabet character of each byte, or -1 */
    int32_t single_byte_tok[256]; /* token whose text is that one byte (llama.cpp's fallback) */
    void *re[TOK_MAX_RE];         /* pcre2_code *, applied in order */
    int n_re;

    /* SentencePiece: <0xXX> byte tokens. */
    int32_t byte_tok[256];

    int32_t *special; /* control, user-defined and unknown tokens, longest text first */
    int n_special;

    char *piece_arena;
    uint32_t *piece_off, *piece_len;
    size_t max_piece;

    char *chat_template;
    size_t chat_template_len;
};

/* Growable output of token ids. */
typedef struct {
    int32_t *ids;
    size_t n, cap;
} tok_out;
int tok_out_push(tok_out *o, int32_t id);

/* Per-call scratch buffers: grown as needed, reused for every word of one tok_encode. */
typedef struct {
    char *norm; /* normalized text (llama.cpp's UTF-8 repair) */
    size_t norm_cap;
    char *view; /* what PCRE2 sees (surrogates swapped for a private-use character) */
    size_t view_cap;
    void *md; /* pcre2_match_data * */
    /* symbols of one word */
    int32_t *sym_id, *sym_prev, *sym_next;
    uint32_t *sym_off, *sym_len;
    size_t sym_cap;
    void *heap;
    size_t heap_cap;
    char *enc; /* byte-level encoded word (ignore_merges lookup) */
    size_t enc_cap;
    /* Word cache for long texts (words repeat): word bytes -> its ids. Lives for one
     * tok_encode call, so no lock is needed; cleared when half full. */
    struct tok_wc_slot *wc;
    uint32_t wc_mask, wc_used;
    int wc_on;
    char *wc_keys;
    size_t wc_keys_len, wc_keys_cap;
    int32_t *wc_ids;
    size_t wc_ids_len, wc_ids_cap;
} tok_scratch;
void tok_scratch_free(tok_scratch *s);

int32_t tok_str_lookup(const tok_tokenizer *t, const char *s, size_t n);
int tok_str_intern(tok_tokenizer *t, const char *s, size_t n, int32_t *id);

int tok_bpe_init(tok_tokenizer *t, md_err *e);
void tok_bpe_free(tok_tokenizer *t);
/* Encode one text fragment (no special tokens in it). base: the fragment's byte offset in
 * the caller's text, for error messages. */
int tok_bpe_encode(const tok_tokenizer *t, tok_scratch *sc, const char *text, size_t len,
                   size_t base, tok_out *out, md_err *e);
int tok_spm_encode(const tok_tokenizer *t, tok_scratch *sc, const char *text, size_t len,
                   int space_prefix, tok_out *out, md_err *e);

#endif
