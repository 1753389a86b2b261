/* tokenizer_bpe.c — byte-level BPE (GPT-2 style): UTF-8 repair, PCRE2 pre-tokenizers,
 * merges by rank.
 *
 * One text fragment (no special tokens in it) goes through:
 *   1. repair: invalid UTF-8 becomes U+FFFD and overlong forms their shortest form, exactly
 *      as llama.cpp's unicode_cpts_from_utf8 + unicode_cpt_to_utf8 do; a sequence that
 *      decodes past U+10FFFF (which makes llama.cpp abort) is refused with MD_EINVAL.
 *   2. pre-tokenization: the family's regexes, applied in order, each splitting the pieces
 *      the previous one produced (matches and the gaps between them both become pieces);
 *      a piece's end is the end of the subject, so look-aheads stop there as in llama.cpp.
 *   3. BPE on each word: bytes mapped to the byte-level alphabet, then the lowest-rank merge
 *      (leftmost on ties) applied until none is left, with a binary heap of candidate pairs;
 *      a final symbol that is not a token falls back to its single-byte tokens. The first
 *      pairs of a word come from a 256x256 byte-pair table, later ones from the merge hash.
 * All buffers live in a per-call tok_scratch (grown, never per word). Fragments of 2 KiB
 * and more also cache each word's ids for the rest of the call: text repeats its words, and
 * the cache is private to the call, so threads sharing the tokenizer need no lock. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <stdlib.h>
#include <string.h>

#include "engine/tokenizer/tokenizer_bpe.h"

#include "engine/tokenizer/bigram_heap.h"
#include "engine/tokenizer/tokenizer_norm.h"

/* White_Space, as llama.cpp's unicode_set_whitespace (PCRE2's \s lacks U+0085). */
#define WSC                                                                                        \
    "\\t\\n\\x{0B}\\f\\r "                                                                         \
    "\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"
#define S "[" WSC "]"
#define NS "[^" WSC "]"
#define OTHER "[^" WSC "\\p{L}\\p{N}]"

static int merge_find(const tok_tokenizer *t, int32_t l, int32_t r);

const char tok_re_gpt2[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?" OTHER "+|" S "+(?!" NS ")|" S "+";
static const char k_re_llama3[] =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
    "\\p{N}{1,3}| ?" OTHER "+[\\r\\n]*|" S "*[\\r\\n]+|" S "+(?!" NS ")|" S "+";
static const char k_re_qwen2[] =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
    "\\p{N}| ?" OTHER "+[\\r\\n]*|" S "*[\\r\\n]+|" S "+(?!" NS ")|" S "+";
static const char k_re_digit[] = "\\p{N}";
static const char k_re_default_punct[] = "[\\p{P}\\$\\+<=>\\^~\\|]+";
static const char k_re_digits[] = "\\p{N}+";
static const char k_re_three[] = "[0-9][0-9][0-9]";

int tok_bpe_init(tok_tokenizer *t, md_err *e) {
    t->pair0 = malloc(65536 * sizeof *t->pair0);
    if (!t->pair0)
        return md_errf(e, MD_ENOMEM, "out of memory building the BPE pair table");
    for (int a = 0; a < 256; a++)
        for (int b = 0; b < 256; b++) {
            int h = t->byte_sym[a] < 0 || t->byte_sym[b] < 0
                        ? -1
                        : merge_find(t, t->byte_sym[a], t->byte_sym[b]);
            t->pair0[a << 8 | b] = h < 0 ? (struct tok_pair0){-1, -1}
                                         : (struct tok_pair0){t->merges[h].rank, t->merges[h].id};
        }
    if (t->hf) /* tokenizer_hf.c compiled the stages tokenizer.json names */
        return 0;
    const char *res[TOK_MAX_RE];
    int n = 0;
    switch (t->pre) {
    case TOK_PRE_GPT2: res[n++] = tok_re_gpt2; break;
    case TOK_PRE_LLAMA3: res[n++] = k_re_llama3; break;
    case TOK_PRE_QWEN2: res[n++] = k_re_qwen2; break;
    case TOK_PRE_SMOLLM:
        res[n++] = k_re_digit;
        res[n++] = tok_re_gpt2;
        break;
    case TOK_PRE_DEFAULT:
        res[n++] = k_re_default_punct;
        res[n++] = tok_re_gpt2;
        res[n++] = k_re_digits;
        res[n++] = k_re_three;
        break;
    }
    for (int i = 0; i < n; i++) {
        int rc = tok_re_add(t, res[i], strlen(res[i]), 0, TOK_SPLIT_ISOLATED, 0, e);
        if (rc)
            return rc;
    }
    return 0;
}

int tok_re_add(tok_tokenizer *t, const char *pattern, size_t len, int literal, int behavior,
               int invert, md_err *e) {
    if (t->n_re >= TOK_MAX_RE)
        return md_errf(e, MD_ERANGE, "more than %d pre-tokenizer splits", TOK_MAX_RE);
    int err;
    PCRE2_SIZE off;
    uint32_t opts = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, len, opts, &err, &off, NULL);
    if (!re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(err, msg, sizeof msg);
        return md_errf(e, MD_EINVAL, "regex: %s at offset %zu", (const char *)msg, (size_t)off);
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* falls back to the interpreter */
    t->re_behavior[t->n_re] = (uint8_t)behavior;
    t->re_invert[t->n_re] = (uint8_t)(invert != 0);
    t->re[t->n_re++] = re;
    return 0;
}

struct tok_wc_slot {
    uint64_t hash; /* 0: empty */
    uint32_t key_off, ids_off;
    uint16_t key_len, n_ids;
};

#define WC_SLOTS (1u << 16) /* per call; cleared when half full */
#define WC_MAX_WORD 48      /* longer words are rare and not worth caching */
#define WC_MIN_TEXT 2048    /* shorter fragments do not repeat enough to pay */

static uint64_t wc_hash(const uint8_t *p, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ n, v;
    while (n >= 8) {
        memcpy(&v, p, 8);
        h = (h ^ v) * 0xff51afd7ed558ccdULL;
        h ^= h >> 32;
        p += 8;
        n -= 8;
    }
    v = 0;
    memcpy(&v, p, n);
    h = (h ^ v) * 0xc4ceb9fe1a85ec53ULL;
    h ^= h >> 29;
    return h | 1;
}

static void wc_clear(tok_scratch *s) {
    memset(s->wc, 0, (size_t)(s->wc_mask + 1) * sizeof *s->wc);
    s->wc_used = 0;
    s->wc_keys_len = 0;
    s->wc_ids_len = 0;
}

/* ---- 1. UTF-8 repair, as llama.cpp ---- */

static int is_cont(uint8_t b) {
    return (b & 0xC0) == 0x80;
}

/* Decode one code point the lenient way llama.cpp does (overlong forms and surrogates are
 * accepted, invalid bytes give U+FFFD and advance one byte). */
static uint32_t lenient_cpt(const uint8_t *s, size_t n, size_t i, size_t *adv) {
    uint8_t b = s[i];
    *adv = 1;
    if (b < 0x80)
        return b;
    if (!(b & 0x40))
        return 0xFFFD;
    if (!(b & 0x20)) {
        if (i + 1 < n && is_cont(s[i + 1])) {
            *adv = 2;
            return ((uint32_t)(b & 0x1F) << 6) | (s[i + 1] & 0x3F);
        }
        return 0xFFFD;
    }
    if (!(b & 0x10)) {
        if (i + 2 < n && is_cont(s[i + 1]) && is_cont(s[i + 2])) {
            *adv = 3;
            return ((uint32_t)(b & 0x0F) << 12) | ((uint32_t)(s[i + 1] & 0x3F) << 6) |
                   (s[i + 2] & 0x3F);
        }
        return 0xFFFD;
    }
    if (!(b & 0x08)) {
        if (i + 3 < n && is_cont(s[i + 1]) && is_cont(s[i + 2]) && is_cont(s[i + 3])) {
            *adv = 4;
            return ((uint32_t)(b & 0x07) << 18) | ((uint32_t)(s[i + 1] & 0x3F) << 12) |
                   ((uint32_t)(s[i + 2] & 0x3F) << 6) | (s[i + 3] & 0x3F);
        }
        return 0xFFFD;
    }
    return 0xFFFD;
}

static size_t cpt_len(uint32_t c) {
    return c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4;
}

static void put_cpt(char *o, uint32_t c) {
    if (c < 0x80) {
        o[0] = (char)c;
    } else if (c < 0x800) {
        o[0] = (char)(0xC0 | (c >> 6));
        o[1] = (char)(0x80 | (c & 0x3F));
    } else if (c < 0x10000) {
        o[0] = (char)(0xE0 | (c >> 12));
        o[1] = (char)(0x80 | ((c >> 6) & 0x3F));
        o[2] = (char)(0x80 | (c & 0x3F));
    } else {
        o[0] = (char)(0xF0 | (c >> 18));
        o[1] = (char)(0x80 | ((c >> 12) & 0x3F));
        o[2] = (char)(0x80 | ((c >> 6) & 0x3F));
        o[3] = (char)(0x80 | (c & 0x3F));
    }
}

/* Sets *out to text itself when it needs no repair, else to sc->norm. *surrogates tells
 * whether the result holds encoded surrogates (which PCRE2 does not accept as UTF-8). */
static int repair(tok_scratch *sc, const char *text, size_t n, size_t base, const char **out,
                  size_t *out_len, int *surrogates, md_err *e) {
    const uint8_t *s = (const uint8_t *)text;
    size_t i = 0;
    *surrogates = 0;
    /* fast scan: stop at the first byte sequence whose repair changes it */
    while (i < n) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        size_t adv;
        uint32_t c = lenient_cpt(s, n, i, &adv);
        if ((c == 0xFFFD && adv == 1) || cpt_len(c) != adv || c > 0x10FFFF ||
            (c >= 0xD800 && c <= 0xDFFF))
            break;
        i += adv;
    }
    if (i == n) {
        *out = text;
        *out_len = n;
        return 0;
    }
    /* slow path: each byte can grow to 3 (U+FFFD) */
    if (tok_grow((void **)&sc->norm, &sc->norm_cap, n * 3 + 4, 1))
        return md_errf(e, MD_ENOMEM, "tokenize: out of memory");
    memcpy(sc->norm, text, i);
    size_t w = i;
    while (i < n) {
        size_t adv;
        uint32_t c = lenient_cpt(s, n, i, &adv);
        if (c > 0x10FFFF)
            return md_errf(e, MD_EINVAL,
                           "invalid UTF-8 at byte %zu: the sequence decodes to U+%X, past "
                           "U+10FFFF",
                           base + i, (unsigned)c);
        if (c >= 0xD800 && c <= 0xDFFF)
            *surrogates = 1;
        put_cpt(sc->norm + w, c);
        w += cpt_len(c);
        i += adv;
    }
    *out = sc->norm;
    *out_len = w;
    return 0;
}

/* ---- 3. BPE on one word ---- */

static int merge_find(const tok_tokenizer *t, int32_t l, int32_t r) {
    uint64_t key = (uint64_t)(uint32_t)l << 32 | (uint32_t)r;
    uint32_t h = (uint32_t)((key * 0x9E3779B97F4A7C15ULL) >> 32) & t->merge_mask;
    for (;;) {
        uint64_t k = t->merges[h].key;
        if (k == key)
            return (int)h;
        if (k == UINT64_MAX)
            return -1;
        h = (h + 1) & t->merge_mask;
    }
}

/* lowest rank first, then the leftmost pair */
static int bigram_less(const tok_bigram *a, const tok_bigram *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

static void try_pair(const tok_tokenizer *t, tok_scratch *sc, size_t *hn, int32_t l, int32_t r) {
    if (l < 0 || r < 0 || sc->sym_id[l] < 0 || sc->sym_id[r] < 0)
        return;
    int h = merge_find(t, sc->sym_id[l], sc->sym_id[r]);
    if (h < 0)
        return;
    tok_bigram b = {.rank = t->merges[h].rank,
                    .left = l,
                    .right = r,
                    .id = t->merges[h].id,
                    .len_l = sc->sym_len[l],
                    .len_r = sc->sym_len[r]};
    tok_heap_push(sc->heap, hn, b, bigram_less);
}

/* Fallback for a symbol that is not a token: the tokens of the single bytes of its
 * byte-level text (llama.cpp's behaviour; most such bytes are not tokens and vanish). */
static int push_bytes(const tok_tokenizer *t, const uint8_t *w, size_t n, tok_out *out) {
    for (size_t i = 0; i < n; i++) {
        char enc[4];
        uint32_t c = t->cpt_of_byte[w[i]];
        size_t k = cpt_len(c);
        put_cpt(enc, c);
        for (size_t j = 0; j < k; j++) {
            int32_t id = t->single_byte_tok[(uint8_t)enc[j]];
            if (id >= 0 && tok_out_push(out, id))
                return MD_ENOMEM;
        }
    }
    return 0;
}

static int bpe_word_uncached(const tok_tokenizer *t, tok_scratch *sc, const uint8_t *w, size_t n,
                             tok_out *out, md_err *e);

/* BPE of one word through the per-call cache when it is on. */
static int bpe_word(const tok_tokenizer *t, tok_scratch *sc, const uint8_t *w, size_t n,
                    tok_out *out, md_err *e) {
    if (!sc->wc_on || n > WC_MAX_WORD || n < 2)
        return bpe_word_uncached(t, sc, w, n, out, e);
    uint64_t h = wc_hash(w, n);
    uint32_t i = (uint32_t)h & sc->wc_mask;
    for (;; i = (i + 1) & sc->wc_mask) {
        struct tok_wc_slot *sl = &sc->wc[i];
        if (!sl->hash)
            break;
        if (sl->hash == h && sl->key_len == n && !memcmp(sc->wc_keys + sl->key_off, w, n)) {
            for (uint32_t k = 0; k < sl->n_ids; k++)
                if (tok_out_push(out, sc->wc_ids[sl->ids_off + k]))
                    return md_errf(e, MD_ENOMEM, "tokenize: out of memory");
            return 0;
        }
    }
    size_t before = out->n;
    int rc = bpe_word_uncached(t, sc, w, n, out, e);
    size_t n_ids = out->n - before;
    if (rc || n_ids > UINT16_MAX)
        return rc;
    if (sc->wc_used >= (sc->wc_mask + 1) / 2) {
        wc_clear(sc);
        for (i = (uint32_t)h & sc->wc_mask; sc->wc[i].hash; i = (i + 1) & sc->wc_mask)
            ;
    }
    if (tok_grow((void **)&sc->wc_keys, &sc->wc_keys_cap, sc->wc_keys_len + n, 1) ||
        tok_grow((void **)&sc->wc_ids, &sc->wc_ids_cap, sc->wc_ids_len + n_ids, sizeof(int32_t)))
        return 0; /* no room to remember it: the ids are out already */
    memcpy(sc->wc_keys + sc->wc_keys_len, w, n);
    memcpy(sc->wc_ids + sc->wc_ids_len, out->ids + before, n_ids * sizeof(int32_t));
    sc->wc[i] = (struct tok_wc_slot){h, (uint32_t)sc->wc_keys_len, (uint32_t)sc->wc_ids_len,
                                     (uint16_t)n, (uint16_t)n_ids};
    sc->wc_keys_len += n;
    sc->wc_ids_len += n_ids;
    sc->wc_used++;
    return 0;
}

/* Merge symbols [0, ns) of the scratch by rank (lowest first, leftmost on ties). */
static void merge_symbols(const tok_tokenizer *t, tok_scratch *sc, size_t hn) {
    while (hn > 0) {
        tok_bigram b = tok_heap_pop(sc->heap, &hn, bigram_less);
        uint32_t ll = sc->sym_len[b.left], rl = sc->sym_len[b.right];
        /* stale: one side was merged since this pair was queued */
        if (ll == 0 || rl == 0 || ll != b.len_l || rl != b.len_r)
            continue;
        sc->sym_id[b.left] = b.id;
        int32_t nx = tok_sym_join(sc, b.left, b.right, ll + rl);
        try_pair(t, sc, &hn, sc->sym_prev[b.left], b.left);
        try_pair(t, sc, &hn, b.left, nx);
    }
}

/* Character-level BPE (tokenizer.json without ByteLevel, e.g. Llama 2, Mistral, Gemma): each
 * UTF-8 character is a symbol when it is a token; otherwise its <0xXX> byte tokens with
 * byte_fallback, else the unknown token (consecutive ones fused with fuse_unk), else it is
 * dropped, as Hugging Face's BPE does. */
static int bpe_word_chars(const tok_tokenizer *t, tok_scratch *sc, const uint8_t *w, size_t n,
                          tok_out *out, md_err *e) {
    if (t->ignore_merges) {
        int32_t id = tok_str_lookup(t, (const char *)w, n);
        if (id >= 0 && id < t->n_vocab)
            return tok_out_push(out, id) ? md_errf(e, MD_ENOMEM, "tokenize: out of memory") : 0;
    }
    if (n > UINT32_MAX / 4)
        return md_errf(e, MD_ERANGE, "tokenize: a single word of %zu bytes", n);
    if (tok_grow_symbols(sc, n) ||
        tok_grow((void **)&sc->heap, &sc->heap_cap, 3 * n, sizeof(tok_bigram)))
        return md_errf(e, MD_ENOMEM, "tokenize: out of memory");
    static const uint8_t k_len[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    int32_t ns = 0;
    int prev_unk = 0;
    for (size_t i = 0; i < n;) {
        size_t l = k_len[w[i] >> 4];
        if (l > n - i)
            l = n - i;
        int32_t id = tok_str_lookup(t, (const char *)w + i, l);
        int nb = 0;
        if (id < 0 || id >= t->n_vocab) {
            id = -1;
            if (t->byte_fallback) {
                nb = (int)l;
                for (size_t k = 0; k < l; k++)
                    if (t->byte_tok[w[i + k]] < 0)
                        nb = 0;
            }
        }
        if (nb) { /* one symbol per byte token */
            for (size_t k = 0; k < l; k++) {
                sc->sym_id[ns] = t->byte_tok[w[i + k]];
                sc->sym_off[ns] = (uint32_t)(i + k);
                sc->sym_len[ns] = 1;
                ns++;
            }
            prev_unk = 0;
        } else if (id >= 0 || t->unk >= 0) {
            if (id < 0 && prev_unk && t->fuse_unk) {
                sc->sym_len[ns - 1] += (uint32_t)l;
            } else {
                sc->sym_id[ns] = id >= 0 ? id : t->unk;
                sc->sym_off[ns] = (uint32_t)i;
                sc->sym_len[ns] = (uint32_t)l;
                ns++;
            }
            prev_unk = id < 0;
        }
        i += l;
    }
    for (int32_t i = 0; i < ns; i++) {
        sc->sym_prev[i] = i - 1;
        sc->sym_next[i] = i + 1 < ns ? i + 1 : -1;
    }
    size_t hn = 0;
    for (int32_t i = 1; i < ns; i++)
        try_pair(t, sc, &hn, i - 1, i);
    merge_symbols(t, sc, hn);
    for (int32_t i = 0; i >= 0 && ns > 0; i = sc->sym_next[i])
        if (tok_out_push(out, sc->sym_id[i]))
            return md_errf(e, MD_ENOMEM, "tokenize: out of memory");
    return 0;
}

static int bpe_word_uncached(const tok_tokenizer *t, tok_scratch *sc, const uint8_t *w, size_t n,
                             tok_out *out, md_err *e) {
    if (n == 0)
        return 0;
    if (t->char_level)
        return bpe_word_chars(t, sc, w, n, out, e);
    if (t->ignore_merges) {
        if (tok_grow((void **)&sc->enc, &sc->enc_cap, n * 2, 1))
            return md_errf(e, MD_ENOMEM, "tokenize: out of memory");
        size_t k = 0;
        for (size_t i = 0; i < n; i++) {
            uint32_t c = t->cpt_of_byte[w[i]];
            put_cpt(sc->enc + k, c);
            k += cpt_len(c);
        }
        int32_t id = tok_str_lookup(t, sc->enc, k);
        if (id >= 0 && id < t->n_vocab)
            return tok_out_push(out, id) ? md_errf(e, MD_ENOMEM, "tokenize: out of memory") : 0;
    }
    if (n == 1) {
        int32_t id = t->byte_sym[w[0]];
        int rc = id >= 0 && id < t->n_vocab ? tok_out_push(out, id) : push_bytes(t, w, 1, out);
        return rc ? md_errf(e, MD_ENOMEM, "tokenize: out of memory") : 0;
    }
    if (n > UINT32_MAX / 4)
        return md_errf(e, MD_ERANGE, "tokenize: a single word of %zu bytes", n);
    if (tok_grow_symbols(sc, n) ||
        tok_grow((void **)&sc->heap, &sc->heap_cap, 3 * n, sizeof(tok_bigram)))
        return md_errf(e, MD_ENOMEM, "tokenize: out of memory");
    for (size_t i = 0; i < n; i++) {
        sc->sym_id[i] = t->byte_sym[w[i]];
        sc->sym_off[i] = (uint32_t)i;
        sc->sym_len[i] = 1;
        sc->sym_prev[i] = (int32_t)i - 1;
        sc->sym_next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    size_t hn = 0;
    for (size_t i = 1; i < n; i++) {
        struct tok_pair0 p = t->pair0[w[i - 1] << 8 | w[i]];
        if (p.rank >= 0) {
            tok_bigram g = {.rank = p.rank,
                            .left = (int32_t)i - 1,
                            .right = (int32_t)i,
                            .id = p.id,
                            .len_l = 1,
                            .len_r = 1};
            tok_heap_push(sc->heap, &hn, g, bigram_less);
        }
    }
    merge_symbols(t, sc, hn);
    for (int32_t i = 0; i >= 0; i = sc->sym_next[i]) {
        int32_t id = sc->sym_id[i];
        int rc = id >= 0 && id < t->n_vocab
                     ? tok_out_push(out, id)
                     : push_bytes(t, w + sc->sym_off[i], sc->sym_len[i], out);
        if (rc)
            return md_errf(e, MD_ENOMEM, "tokenize: out of memory");
    }
    return 0;
}

/* ---- 2. pre-tokenization: regex stage k splits [start, start+len) of the subject ---- */

typedef struct {
    const tok_tokenizer *t;
    tok_scratch *sc;
    const char *view; /* what the regexes see */
    const char *norm; /* the bytes BPE encodes (same offsets) */
    tok_out *out;
    md_err *e;
} split_ctx;

static int split(split_ctx *c, int stage, size_t start, size_t len);

/* The piece a stage is still growing (all behaviours but ISOLATED and REMOVED). */
typedef struct {
    size_t s, e;
    int have, last_match;
} pending;

static int flush(split_ctx *c, int stage, size_t start, pending *p) {
    if (!p->have)
        return 0;
    p->have = 0;
    return split(c, stage + 1, start + p->s, p->e - p->s);
}

/* Segment [s, e) of a stage's subject, a match or not: hand the pieces it completes to the
 * next stage, as Hugging Face's split() groups them for each behaviour. */
static int segment(split_ctx *c, int stage, size_t start, pending *p, size_t s, size_t e, int m) {
    int rc;
    if (c->t->re_invert[stage])
        m = !m;
    switch (c->t->re_behavior[stage]) {
    case TOK_SPLIT_REMOVED:
        if (m)
            return 0;
        /* fall through */
    case TOK_SPLIT_ISOLATED: return split(c, stage + 1, start + s, e - s);
    case TOK_SPLIT_MERGED_PREV:
        if (m && p->have && !p->last_match) {
            p->e = e;
            p->last_match = 1;
            return 0;
        }
        break;
    case TOK_SPLIT_CONTIGUOUS:
        if (p->have && m == p->last_match) {
            p->e = e;
            return 0;
        }
        break;
    case TOK_SPLIT_MERGED_NEXT:
        if (p->have && p->last_match && !m) {
            p->e = e;
            return flush(c, stage, start, p);
        }
        if ((rc = flush(c, stage, start, p)))
            return rc;
        if (!m)
            return split(c, stage + 1, start + s, e - s);
        *p = (pending){s, e, 1, 1};
        return 0;
    }
    if ((rc = flush(c, stage, start, p)))
        return rc;
    *p = (pending){s, e, 1, m};
    return 0;
}

static int split(split_ctx *c, int stage, size_t start, size_t len) {
    if (len == 0)
        return 0;
    if (stage == c->t->n_re)
        return bpe_word(c->t, c->sc, (const uint8_t *)c->norm + start, len, c->out, c->e);
    const pcre2_code *re = c->t->re[stage];
    pending p = {0};
    PCRE2_SPTR subj = (PCRE2_SPTR)c->view + start;
    size_t pos = 0, prev = 0;
    int rc;
    while (pos < len) {
        int m = pcre2_match(re, subj, len, pos, PCRE2_NO_UTF_CHECK, c->sc->md, NULL);
        if (m == PCRE2_ERROR_NOMATCH)
            break;
        if (m < 0)
            return md_errf(c->e, MD_EINVAL, "pre-tokenizer regex failed (PCRE2 error %d)", m);
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(c->sc->md);
        size_t ms = ov[0], me = ov[1];
        if (me <= ms) { /* no pattern matches empty, but never loop on one */
            pos = ms + 1;
            while (pos < len && (subj[pos] & 0xC0) == 0x80)
                pos++;
            continue;
        }
        if (ms > prev && (rc = segment(c, stage, start, &p, prev, ms, 0)))
            return rc;
        if ((rc = segment(c, stage, start, &p, ms, me, 1)))
            return rc;
        prev = pos = me;
    }
    if (prev < len && (rc = segment(c, stage, start, &p, prev, len, 0)))
        return rc;
    return flush(c, stage, start, &p);
}

int tok_bpe_encode(const tok_tokenizer *t, tok_scratch *sc, const char *text, size_t len,
                   size_t base, tok_out *out, md_err *e) {
    const char *norm = text;
    size_t n = len;
    int surrogates = 0, rc;
    if ((rc = repair(sc, text, len, base, &norm, &n, &surrogates, e)))
        return rc;
    if (t->hf && (rc = tok_hf_normalize(t, sc, norm, n, base == 0, &norm, &n, e)))
        return rc;
    const char *view = norm;
    if (surrogates) {
        /* PCRE2 refuses encoded surrogates; U+E000 (also 3 bytes, also neither letter,
         * number nor space) classifies the same way llama.cpp's tables do. */
        if (tok_grow((void **)&sc->view, &sc->view_cap, n, 1))
            return md_errf(e, MD_ENOMEM, "tokenize: out of memory");
        memcpy(sc->view, norm, n);
        for (size_t i = 0; i + 2 < n; i++)
            if ((uint8_t)sc->view[i] == 0xED && (uint8_t)sc->view[i + 1] >= 0xA0) {
                memcpy(sc->view + i, "\xee\x80\x80", 3);
                i += 2;
            }
        view = sc->view;
    }
    if (!sc->md && !(sc->md = pcre2_match_data_create(1, NULL)))
        return md_errf(e, MD_ENOMEM, "tokenize: out of memory");
    if (n >= WC_MIN_TEXT && !sc->wc) {
        sc->wc = calloc(WC_SLOTS, sizeof *sc->wc);
        sc->wc_mask = WC_SLOTS - 1;
    }
    sc->wc_on = sc->wc != NULL;
    split_ctx c = {t, sc, view, norm, out, e};
    return split(&c, 0, 0, n);
}
