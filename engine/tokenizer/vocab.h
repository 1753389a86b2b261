/* vocab.h — the tokenizer's private layout and its vocabulary (vocab.c): the string table
 * of tokens and merge parts, the merge table, byte tables, special tokens, pieces, per-call
 * scratch buffers and the tokenizer's lifetime (tok_free releases every field).
 *
 * The bottom of the tokenizer: the loaders (tokenizer_gguf.c, tokenizer_hf.c), the encoders
 * (tokenizer_bpe.c, tokenizer_spm.c, tokenizer_norm.c), chat templates (tokenizer_chat.c)
 * and the dispatcher (tokenizer.c) build on it; it calls none of them. Not part of the
 * engine's contract: everything outside the tokenizer goes through
 * engine/tokenizer/tokenizer.h. */
#ifndef MEDLEY_ENGINE_TOKENIZER_VOCAB_H
#define MEDLEY_ENGINE_TOKENIZER_VOCAB_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "engine/tokenizer/bigram_heap.h"
#include "engine/tokenizer/tokenizer.h"

/* BPE: byte-level BPE; SPM: SentencePiece (and tokenizer.json's character-level BPE); WP:
 * WordPiece from a tokenizer.json (tokenizer_wordpiece.c). */
typedef enum { TOK_KIND_BPE = 1, TOK_KIND_SPM = 2, TOK_KIND_WP = 3 } tok_kind;

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

#define TOK_MAX_RE 8

/* What a pre-tokenizer stage keeps of its matches (Hugging Face's SplitDelimiterBehavior).
 * GGUF families use ISOLATED for every stage: matches and the gaps between them are pieces. */
enum {
    TOK_SPLIT_ISOLATED = 0,
    TOK_SPLIT_REMOVED,     /* matches are dropped */
    TOK_SPLIT_MERGED_PREV, /* a match ends the piece before it */
    TOK_SPLIT_MERGED_NEXT, /* a match starts the piece after it */
    TOK_SPLIT_CONTIGUOUS,  /* runs of matches (and of gaps) are one piece */
};

/* tokenizer.json normalizer steps, applied in order to each text fragment. */
enum { TOK_NORM_NFC = 1, TOK_NORM_PREPEND, TOK_NORM_REPLACE };
typedef struct {
    int kind;
    char *a, *b; /* PREPEND: a; REPLACE: a -> b */
    size_t a_len, b_len;
} tok_norm_step;

/* Added-token flags of tokenizer.json (tok_flags). ADDED_ONLY: the token is not in
 * model.vocab, so WordPiece never produces it. */
enum { TOK_F_LSTRIP = 1, TOK_F_RSTRIP = 2, TOK_F_SINGLE_WORD = 4, TOK_F_ADDED_ONLY = 8 };

struct tok_tokenizer {
    tok_kind kind;
    char model_name[16];
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
    uint8_t re_behavior[TOK_MAX_RE], re_invert[TOK_MAX_RE]; /* TOK_SPLIT_*; invert: gaps match */
    int n_re;

    /* Loaded from tokenizer.json (tokenizer_hf.c): added tokens are found leftmost-longest
     * with their lstrip/rstrip/single_word flags, fragments go through the normalizers
     * below, and BPE follows Hugging Face's rules (merges must produce tokens, the last of
     * duplicate merges wins, unknown characters become unk or are dropped). */
    int hf;
    int char_level; /* BPE over characters, not the byte-level alphabet (SentencePiece-style) */
    int byte_fallback, fuse_unk;
    tok_norm_step *norm;
    int n_norm;
    char metaspace[8];  /* Metaspace replacement ("" when there is no Metaspace) */
    int meta_prepend;   /* 0 never, 1 first fragment only, 2 always */
    int prefix_space;   /* ByteLevel add_prefix_space */
    uint8_t *tok_flags; /* TOK_F_* per token, or NULL */

    /* WordPiece (tokenizer_wordpiece.c): BertNormalizer's switches (all 0 without one),
     * BertPreTokenizer (0: a fragment is one word), the model's options and the decoder's. */
    struct {
        int clean_text, chinese, strip_accents, lowercase, have_norm;
        int bert_pre;
        int max_chars;   /* max_input_chars_per_word: a longer word becomes unk */
        char prefix[32]; /* continuing_subword_prefix */
        size_t prefix_len;
        size_t max_tok; /* longest token text in bytes: no longer candidate is looked up */
        int decoder;    /* a WordPiece decoder: its prefix is cut, other tokens get a space */
        int cleanup;    /* the decoder's cleanup (" ." -> ".", ...) */
        char dec_prefix[32];
        size_t dec_prefix_len;
    } wp;

    /* SentencePiece: <0xXX> byte tokens. */
    int32_t byte_tok[256];

    int32_t *special; /* control, user-defined and unknown tokens, longest text first */
    int n_special;
    /* tokenizer.json: the distinct lengths of the special tokens starting with byte b are
     * sp_lens[sp_first[b] .. sp_first[b + 1]), longest first (leftmost-longest search). */
    uint32_t *sp_lens;
    uint32_t sp_first[257];

    char *piece_arena;
    uint32_t *piece_off, *piece_len;
    size_t max_piece;

    char *chat_template;
    size_t chat_template_len;
    int chat_forced;               /* tok_chat_choose named a template (--chat-template) */
    tok_template chat_forced_tmpl; /* TOK_TMPL_NONE: raw prompts only */
    int tools_forced; /* --chat-template hermes / llama3-json: the family's tool-call format */
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
    tok_bigram *heap; /* candidate merges of one word */
    size_t heap_cap;
    char *enc; /* byte-level encoded word (ignore_merges lookup) */
    size_t enc_cap;
    char *hf_buf[2]; /* tokenizer.json normalizers, ping-pong; WordPiece: word, candidate */
    size_t hf_cap[2];
    uint32_t *marks; /* WordPiece NFD: combining marks after a starter, before reordering */
    size_t marks_cap;
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
/* Release the buffers (the struct itself is the caller's) and zero it. */
void tok_scratch_free(tok_scratch *s);
/* Symbol r joins its left neighbour l, which becomes len bytes long (the encoders' merge step
 * in the word's linked list): r becomes empty and l's next is r's. Returns that next symbol,
 * or -1. */
static inline int32_t tok_sym_join(tok_scratch *s, int32_t l, int32_t r, uint32_t len) {
    s->sym_len[l] = len;
    s->sym_len[r] = 0;
    int32_t nx = s->sym_next[r];
    s->sym_next[l] = nx;
    if (nx >= 0)
        s->sym_prev[nx] = l;
    return nx;
}
/* Room for n symbols in every sym_* array (a failed grow keeps what was there). MD_ENOMEM.
 * Inline check: the encoders call it once per word. */
int tok_grow_symbols_slow(tok_scratch *s, size_t n);
static inline int tok_grow_symbols(tok_scratch *s, size_t n) {
    return n <= s->sym_cap ? 0 : tok_grow_symbols_slow(s, n);
}

#define TOK_NELEM(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* Grow *p (of *cap elements of elem bytes, doubling from 256) to hold need. MD_ENOMEM.
 * Inline: the encoders check their scratch once per word. */
static inline int tok_grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap)
        return 0;
    size_t c = *cap ? *cap : 256;
    while (c < need)
        c *= 2;
    void *n = realloc(*p, c * elem);
    if (!n)
        return MD_ENOMEM;
    *p = n;
    *cap = c;
    return 0;
}

/* Strict decode of one UTF-8 character at s[0..n): returns its length (1..4) and sets *cp.
 * Returns 0 when the bytes there are not a valid shortest-form character: *incomplete is set
 * when they are a valid start cut by the end of the buffer, else *bad is the length of the
 * maximal invalid subpart (what one U+FFFD replaces, as Unicode recommends). */
int tok_utf8_strict(const uint8_t *s, size_t n, uint32_t *cp, int *incomplete, int *bad);

int32_t tok_str_lookup(const tok_tokenizer *t, const char *s, size_t n);
int tok_str_intern(tok_tokenizer *t, const char *s, size_t n, int32_t *id);
/* Append a string (not indexed until tok_index_strings). MD_ENOMEM. */
int tok_strtab_add(tok_tokenizer *t, const char *s, size_t n, int32_t *id);
int tok_index_strings(tok_tokenizer *t);
/* Merge table for about n merges; tok_merge_put adds (l, r) -> (rank, id), replacing an
 * existing entry only when replace is set. */
int tok_merges_alloc(tok_tokenizer *t, size_t n);
void tok_merge_put(tok_tokenizer *t, int32_t l, int32_t r, int32_t rank, int32_t id, int replace);
/* Byte-level alphabet tables (cpt_of_byte, byte_sym, single_byte_tok) from the strings. */
void tok_byte_tables(tok_tokenizer *t);
void tok_spm_byte_tokens(tok_tokenizer *t);
/* End-of-generation tokens found by text (and FIM ids given); make_control turns them
 * into control tokens as llama.cpp does for GGUF vocabularies. */
void tok_mark_eog(tok_tokenizer *t, int32_t fim[3], int make_control);
int tok_list_special(tok_tokenizer *t, md_err *e);
int tok_build_pieces(tok_tokenizer *t);
/* tok_chat_apply_as with the functions of a tool-call format (chat_tools.c): tools, a JSON
 * array of OpenAI tool objects (borrowed), rendered where the family's format puts them
 * (NULL: none). MD_EINVAL when tools is not an array. */
int tok_chat_render(const tok_tokenizer *t, tok_template tmpl, const tok_chat_msg *msgs, int n_msgs,
                    int add_generation_prompt, const json_t *tools, char **out, md_err *e);
/* The tokenizer's chat template: a copy of s[0..n), replacing any it had. MD_ENOMEM. */
int tok_set_chat_template(tok_tokenizer *t, const char *s, size_t n, md_err *e);

#endif
