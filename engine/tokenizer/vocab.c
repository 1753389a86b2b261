/* vocab.c — the vocabulary every tokenizer kind builds on: the string table (tokens plus
 * merge parts that are not tokens), the merge table, the byte-level alphabet, end-of-
 * generation and special tokens, pieces, the public accessors, streaming decode, and the
 * tokenizer's lifetime (tok_free releases every field, whichever loader filled it).
 *
 * Behaviour follows llama.cpp's llama-vocab.cpp (facts only, our own code): duplicate strings
 * resolve to the last id, EOG tokens found by their text, the same special-token partition
 * order (longest first), and the same pieces (token_to_piece with special=true).
 *
 * Calls nothing else of the tokenizer: the loaders, encoders and the dispatcher sit above. */
#define _GNU_SOURCE /* qsort_r */
#include "engine/tokenizer/vocab.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
/* ---- string table: token strings plus merge parts that are not tokens ---- */

static uint64_t str_hash(const char *s, size_t n) {
    /* FNV-1a over bytes then a final mix; token strings are short. */
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) {
        h ^= (uint8_t)s[i];
        h *= 1099511628211ULL;
    }
    h ^= h >> 31;
    h *= 0x9E3779B97F4A7C15ULL;
    return h ^ (h >> 29);
}

static int strtab_grow(tok_tokenizer *t, size_t need_bytes) {
    if (t->arena_len + need_bytes > t->arena_cap) {
        size_t cap = t->arena_cap ? t->arena_cap : 1 << 16;
        while (cap < t->arena_len + need_bytes)
            cap *= 2;
        char *na = realloc(t->arena, cap);
        if (!na)
            return MD_ENOMEM;
        t->arena = na;
        t->arena_cap = cap;
    }
    if (t->n_str == t->str_cap) {
        int cap = t->str_cap ? t->str_cap * 2 : 1024;
        uint32_t *no = realloc(t->str_off, (size_t)cap * sizeof *no);
        if (!no)
            return MD_ENOMEM;
        t->str_off = no;
        uint32_t *nl = realloc(t->str_len, (size_t)cap * sizeof *nl);
        if (!nl)
            return MD_ENOMEM;
        t->str_len = nl;
        t->str_cap = cap;
    }
    return 0;
}

static int hash_rebuild(tok_tokenizer *t, uint32_t n_slots) {
    int32_t *slots = malloc((size_t)n_slots * sizeof *slots);
    if (!slots)
        return MD_ENOMEM;
    memset(slots, 0xff, (size_t)n_slots * sizeof *slots);
    free(t->hslots);
    t->hslots = slots;
    t->hmask = n_slots - 1;
    for (int id = 0; id < t->n_str; id++) {
        uint64_t h = str_hash(t->arena + t->str_off[id], t->str_len[id]);
        uint32_t i = (uint32_t)h & t->hmask;
        for (;;) {
            int32_t cur = t->hslots[i];
            if (cur < 0) {
                t->hslots[i] = id;
                break;
            }
            /* duplicates: the later id wins (llama.cpp's token_to_id[word] = i) */
            if (t->str_len[cur] == t->str_len[id] &&
                !memcmp(t->arena + t->str_off[cur], t->arena + t->str_off[id], t->str_len[id])) {
                t->hslots[i] = id;
                break;
            }
            i = (i + 1) & t->hmask;
        }
    }
    return 0;
}

int tok_index_strings(tok_tokenizer *t) {
    uint32_t slots = 1024;
    while (slots < (uint32_t)t->n_str * 2)
        slots *= 2;
    return hash_rebuild(t, slots);
}

int32_t tok_str_lookup(const tok_tokenizer *t, const char *s, size_t n) {
    if (!t->hslots)
        return -1;
    uint32_t i = (uint32_t)str_hash(s, n) & t->hmask;
    for (;;) {
        int32_t id = t->hslots[i];
        if (id < 0)
            return -1;
        if (t->str_len[id] == n && !memcmp(t->arena + t->str_off[id], s, n))
            return id;
        i = (i + 1) & t->hmask;
    }
}

/* Append a string to the table without indexing it (ids are dense, in order). */
int tok_strtab_add(tok_tokenizer *t, const char *s, size_t n, int32_t *id) {
    if (n > UINT32_MAX || t->arena_len + n > UINT32_MAX)
        return MD_ENOMEM;
    int rc = strtab_grow(t, n + 1);
    if (rc)
        return rc;
    memcpy(t->arena + t->arena_len, s, n);
    t->arena[t->arena_len + n] = '\0';
    t->str_off[t->n_str] = (uint32_t)t->arena_len;
    t->str_len[t->n_str] = (uint32_t)n;
    t->arena_len += n + 1;
    *id = t->n_str++;
    return 0;
}

/* Id of s, adding it (and indexing it) when absent; used for merge parts. */
int tok_str_intern(tok_tokenizer *t, const char *s, size_t n, int32_t *id) {
    int32_t found = tok_str_lookup(t, s, n);
    if (found >= 0) {
        *id = found;
        return 0;
    }
    int rc = tok_strtab_add(t, s, n, id);
    if (rc)
        return rc;
    if ((uint32_t)t->n_str * 2 > t->hmask + 1)
        return hash_rebuild(t, (t->hmask + 1) * 2);
    uint32_t i = (uint32_t)str_hash(s, n) & t->hmask;
    while (t->hslots[i] >= 0)
        i = (i + 1) & t->hmask;
    t->hslots[i] = *id;
    return 0;
}

/* ---- the byte-level alphabet of GPT-2 BPE ---- */

/* Printable bytes stand for themselves; the other 68 map to U+0100.. in byte order. */
static void byte_alphabet(uint16_t cpt_of_byte[256]) {
    int n = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
        cpt_of_byte[b] = printable ? (uint16_t)b : (uint16_t)(256 + n++);
    }
}

static size_t utf8_put(char *out, uint32_t c) {
    if (c < 0x80) {
        out[0] = (char)c;
        return 1;
    }
    if (c < 0x800) {
        out[0] = (char)(0xC0 | (c >> 6));
        out[1] = (char)(0x80 | (c & 0x3F));
        return 2;
    }
    if (c < 0x10000) {
        out[0] = (char)(0xE0 | (c >> 12));
        out[1] = (char)(0x80 | ((c >> 6) & 0x3F));
        out[2] = (char)(0x80 | (c & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (c >> 18));
    out[1] = (char)(0x80 | ((c >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((c >> 6) & 0x3F));
    out[3] = (char)(0x80 | (c & 0x3F));
    return 4;
}

int tok_utf8_strict(const uint8_t *s, size_t n, uint32_t *cp, int *incomplete, int *bad) {
    *incomplete = 0;
    *bad = 1;
    uint8_t b = s[0];
    int need;
    uint32_t c;
    if (b < 0x80) {
        *cp = b;
        return 1;
    } else if (b >= 0xC2 && b <= 0xDF) {
        need = 1, c = b & 0x1F;
    } else if (b >= 0xE0 && b <= 0xEF) {
        need = 2, c = b & 0x0F;
    } else if (b >= 0xF0 && b <= 0xF4) {
        need = 3, c = b & 0x07;
    } else {
        return 0;
    }
    for (int i = 1; i <= need; i++) {
        if ((size_t)i >= n) {
            *incomplete = 1;
            return 0;
        }
        /* the second byte's range excludes overlong forms, surrogates and > U+10FFFF */
        uint8_t lo = 0x80, hi = 0xBF;
        if (i == 1) {
            if (b == 0xE0)
                lo = 0xA0;
            else if (b == 0xED)
                hi = 0x9F;
            else if (b == 0xF0)
                lo = 0x90;
            else if (b == 0xF4)
                hi = 0x8F;
        }
        if (s[i] < lo || s[i] > hi) {
            *bad = i;
            return 0;
        }
        c = (c << 6) | (s[i] & 0x3F);
    }
    *cp = c;
    return need + 1;
}

/* ---- end-of-generation and special tokens ---- */

static const char *const k_eog_texts[] = {
    "<|eot_id|>",    "<|im_end|>", "<|end|>", "<|return|>", "<|call|>",        "<end_of_turn>",
    "<|endoftext|>", "<|eom_id|>", "<EOT>",   "_<EOT>",     "<|end_of_text|>", "<end_of_utterance>",
};
static const char *const k_eot_texts[] = {
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "<\xef\xbd\x9c"
    "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>",
    "<end_of_utterance>",
};
static const char *const k_fim_pad_texts[] = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>"};
static const char *const k_fim_rep_texts[] = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>",
                                              "<REPO>", "<reponame>"};
static const char *const k_fim_sep_texts[] = {"<|file_sep|>"};

static int32_t find_any(const tok_tokenizer *t, const char *const *texts, int n) {
    for (int i = 0; i < n; i++) {
        int32_t id = tok_str_lookup(t, texts[i], strlen(texts[i]));
        if (id >= 0 && id < t->n_vocab)
            return id;
    }
    return -1;
}

static int cmp_special(const void *a, const void *b, void *ctx) {
    const tok_tokenizer *t = ctx;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    if (t->str_len[x] != t->str_len[y])
        return t->str_len[x] > t->str_len[y] ? -1 : 1;
    return x < y ? -1 : x > y;
}

/* Hugging Face's WordPiece decoder cleanup on out[0..n), in place (every replacement is no
 * longer than what it replaces), each replacement over the whole text in turn. */
static size_t wp_cleanup(char *out, size_t n) {
    static const char *const from[] = {" .",  " ?",      " !",  " ,",   " ' ", " n't",
                                       " 'm", " do not", " 's", " 've", " 're"};
    static const char *const to[] = {".",  "?",      "!",  ",",   "'",  "n't",
                                     "'m", " don't", "'s", "'ve", "'re"};
    for (size_t k = 0; k < sizeof from / sizeof *from; k++) {
        size_t fl = strlen(from[k]), tl = strlen(to[k]), r = 0, w = 0;
        while (r < n) {
            if (r + fl <= n && !memcmp(out + r, from[k], fl)) {
                memmove(out + w, to[k], tl);
                w += tl;
                r += fl;
            } else {
                out[w++] = out[r++];
            }
        }
        n = w;
    }
    return n;
}

/* A WordPiece token's piece, as Hugging Face decodes it after the first token: without its
 * continuation prefix, or with a space before it; then cleanup. Without a WordPiece decoder
 * tokens are joined by spaces. At most n + 1 bytes. */
static size_t wp_piece(const tok_tokenizer *t, const char *s, size_t n, char *out) {
    size_t pl = t->wp.dec_prefix_len, m;
    if (t->wp.decoder && n >= pl && !memcmp(s, t->wp.dec_prefix, pl)) {
        memcpy(out, s + pl, n - pl);
        m = n - pl;
    } else {
        out[0] = ' ';
        memcpy(out + 1, s, n);
        m = n + 1;
    }
    return t->wp.decoder && t->wp.cleanup ? wp_cleanup(out, m) : m;
}

/* Pieces (token_to_piece with special = true) for every token, in one arena. */
int tok_build_pieces(tok_tokenizer *t) {
    size_t cap = 0;
    for (int id = 0; id < t->n_vocab; id++)
        cap += t->str_len[id] + 2; /* pieces outgrow the text by a WordPiece space at most */
    t->piece_arena = malloc(cap ? cap : 1);
    t->piece_off = malloc((size_t)t->n_vocab * sizeof *t->piece_off);
    t->piece_len = malloc((size_t)t->n_vocab * sizeof *t->piece_len);
    if (!t->piece_arena || !t->piece_off || !t->piece_len)
        return MD_ENOMEM;
    int16_t byte_of_cpt[324];
    memset(byte_of_cpt, 0xff, sizeof byte_of_cpt);
    for (int b = 0; b < 256; b++)
        byte_of_cpt[t->cpt_of_byte[b]] = (int16_t)b;
    size_t pos = 0;
    t->max_piece = 0;
    for (int id = 0; id < t->n_vocab; id++) {
        const char *s = t->arena + t->str_off[id];
        size_t n = t->str_len[id];
        char *out = t->piece_arena + pos;
        size_t m = 0;
        uint8_t a = t->attr[id];
        if (t->kind == TOK_KIND_WP) {
            m = wp_piece(t, s, n, out);
        } else if (a & (TOK_A_CONTROL | TOK_A_UNKNOWN | TOK_A_USER)) {
            memcpy(out, s, n);
            m = n;
        } else if (t->kind == TOK_KIND_BPE && (a & TOK_A_NORMAL)) {
            /* undo the byte-level alphabet; characters outside it pass through */
            size_t i = 0;
            while (i < n) {
                uint32_t c;
                int inc, bad, l = tok_utf8_strict((const uint8_t *)s + i, n - i, &c, &inc, &bad);
                if (l > 0 && c < 324 && byte_of_cpt[c] >= 0) {
                    out[m++] = (char)byte_of_cpt[c];
                    i += (size_t)l;
                } else {
                    size_t k = l > 0 ? (size_t)l : 1;
                    memcpy(out + m, s + i, k);
                    m += k;
                    i += k;
                }
            }
        } else if (t->kind == TOK_KIND_SPM && (a & TOK_A_NORMAL)) {
            /* U+2581 (3 bytes) becomes one space: never longer than the text */
            size_t i = 0;
            while (i < n) {
                if (i + 3 <= n && !memcmp(s + i, "\xe2\x96\x81", 3)) {
                    out[m++] = ' ';
                    i += 3;
                } else {
                    out[m++] = s[i++];
                }
            }
        } else if (t->kind == TOK_KIND_SPM && (a & TOK_A_BYTE)) {
            unsigned v;
            if (n == 6 && sscanf(s, "<0x%2x>", &v) == 1)
                out[m++] = (char)v;
        }
        out[m] = '\0';
        t->piece_off[id] = (uint32_t)pos;
        t->piece_len[id] = (uint32_t)m;
        if (m > t->max_piece)
            t->max_piece = m;
        pos += m + 1;
    }
    return 0;
}

int tok_merges_alloc(tok_tokenizer *t, size_t n) {
    uint32_t slots = 1024;
    while (slots < n * 2)
        slots *= 2;
    t->merges = malloc((size_t)slots * sizeof *t->merges);
    if (!t->merges)
        return MD_ENOMEM;
    for (uint32_t i = 0; i < slots; i++)
        t->merges[i].key = UINT64_MAX;
    t->merge_mask = slots - 1;
    return 0;
}

void tok_merge_put(tok_tokenizer *t, int32_t l, int32_t r, int32_t rank, int32_t id, int replace) {
    uint64_t key = (uint64_t)(uint32_t)l << 32 | (uint32_t)r;
    uint32_t h = (uint32_t)((key * 0x9E3779B97F4A7C15ULL) >> 32) & t->merge_mask;
    while (t->merges[h].key != UINT64_MAX && t->merges[h].key != key)
        h = (h + 1) & t->merge_mask;
    if (t->merges[h].key == key && !replace)
        return;
    t->merges[h] = (struct tok_merge){key, rank, id};
}

void tok_byte_tables(tok_tokenizer *t) {
    byte_alphabet(t->cpt_of_byte);
    for (int b = 0; b < 256; b++) {
        char buf[4];
        size_t n = utf8_put(buf, t->cpt_of_byte[b]);
        t->byte_sym[b] = tok_str_lookup(t, buf, n);
        char one = (char)b;
        t->single_byte_tok[b] = tok_str_lookup(t, &one, 1);
        if (t->single_byte_tok[b] >= t->n_vocab)
            t->single_byte_tok[b] = -1;
    }
}

/* A SentencePiece vocabulary's byte tokens: <0xXX>, else the byte itself. */
void tok_spm_byte_tokens(tok_tokenizer *t) {
    snprintf(t->pre_name, sizeof t->pre_name, "none");
    byte_alphabet(t->cpt_of_byte);
    for (int b = 0; b < 256; b++) {
        char buf[8];
        snprintf(buf, sizeof buf, "<0x%02X>", b);
        t->byte_tok[b] = tok_str_lookup(t, buf, 6);
        if (t->byte_tok[b] < 0) {
            char one = (char)b;
            t->byte_tok[b] = tok_str_lookup(t, &one, 1);
        }
    }
}

void tok_mark_eog(tok_tokenizer *t, int32_t fim[3], int make_control) {
    /* found by text (not by key): llama.cpp also makes them control tokens */
    int32_t by_text[4] = {-1, -1, -1, -1};
    if (fim[0] < 0)
        fim[0] = by_text[0] = find_any(t, k_fim_pad_texts, TOK_NELEM(k_fim_pad_texts));
    if (fim[1] < 0)
        fim[1] = by_text[1] = find_any(t, k_fim_rep_texts, TOK_NELEM(k_fim_rep_texts));
    if (fim[2] < 0)
        fim[2] = by_text[2] = find_any(t, k_fim_sep_texts, TOK_NELEM(k_fim_sep_texts));
    if (t->eot < 0)
        t->eot = by_text[3] = find_any(t, k_eot_texts, TOK_NELEM(k_eot_texts));
    for (int i = 0; i < 4 && make_control; i++)
        if (by_text[i] >= 0 && !(t->attr[by_text[i]] & TOK_A_CONTROL))
            t->attr[by_text[i]] = TOK_A_CONTROL;
    for (int i = 0; i < 3; i++)
        if (fim[i] >= 0)
            t->is_eog[fim[i]] = 1;
    for (int i = 0; i < TOK_NELEM(k_eog_texts); i++) {
        int32_t id = tok_str_lookup(t, k_eog_texts[i], strlen(k_eog_texts[i]));
        if (id >= 0 && id < t->n_vocab) {
            t->is_eog[id] = 1;
            if (make_control && !(t->attr[id] & TOK_A_CONTROL))
                t->attr[id] = TOK_A_CONTROL;
        }
    }
    int32_t extra[3] = {t->eos, t->eot, t->eom};
    for (int i = 0; i < 3; i++)
        if (extra[i] >= 0)
            t->is_eog[extra[i]] = 1;
}

/* Special tokens matched in the text before pre-tokenization: longest first. */
int tok_list_special(tok_tokenizer *t, md_err *e) {
    t->special = malloc((size_t)t->n_vocab * sizeof *t->special);
    if (!t->special)
        return md_errf(e, MD_ENOMEM, "out of memory loading the tokenizer");
    for (int id = 0; id < t->n_vocab; id++)
        if (t->attr[id] & (TOK_A_CONTROL | TOK_A_USER | TOK_A_UNKNOWN))
            t->special[t->n_special++] = id;
    qsort_r(t->special, (size_t)t->n_special, sizeof *t->special, cmp_special, t);
    if (!t->hf)
        return 0;
    /* per first byte, its tokens' distinct lengths (they come longest first) */
    t->sp_lens = malloc(((size_t)t->n_special + 1) * sizeof *t->sp_lens);
    if (!t->sp_lens)
        return md_errf(e, MD_ENOMEM, "out of memory loading the tokenizer");
    uint32_t count[256] = {0}, last[256] = {0};
    for (int k = 0; k < t->n_special; k++) {
        int32_t id = t->special[k];
        uint8_t b = (uint8_t)t->arena[t->str_off[id]];
        if (t->str_len[id] != last[b])
            count[b]++;
        last[b] = t->str_len[id];
    }
    t->sp_first[0] = 0;
    for (int b = 0; b < 256; b++)
        t->sp_first[b + 1] = t->sp_first[b] + count[b];
    uint32_t fill[256];
    memcpy(fill, t->sp_first, sizeof fill);
    memset(last, 0, sizeof last);
    for (int k = 0; k < t->n_special; k++) {
        int32_t id = t->special[k];
        uint8_t b = (uint8_t)t->arena[t->str_off[id]];
        if (t->str_len[id] != last[b])
            t->sp_lens[fill[b]++] = t->str_len[id];
        last[b] = t->str_len[id];
    }
    return 0;
}

void tok_free(tok_tokenizer *t) {
    if (!t)
        return;
    for (int i = 0; i < t->n_re; i++)
        pcre2_code_free(t->re[i]);
    free(t->arena);
    free(t->str_off);
    free(t->str_len);
    free(t->hslots);
    free(t->scores);
    free(t->attr);
    free(t->is_eog);
    free(t->merges);
    free(t->pair0);
    free(t->special);
    free(t->sp_lens);
    for (int i = 0; i < t->n_norm; i++) {
        free(t->norm[i].a);
        free(t->norm[i].b);
    }
    free(t->norm);
    free(t->tok_flags);
    free(t->piece_arena);
    free(t->piece_off);
    free(t->piece_len);
    free(t->chat_template);
    free(t);
}

/* ---- accessors ---- */

int tok_n_vocab(const tok_tokenizer *t) {
    return t->n_vocab;
}
int32_t tok_bos(const tok_tokenizer *t) {
    return t->bos;
}
int32_t tok_eos(const tok_tokenizer *t) {
    return t->eos;
}
int tok_add_bos(const tok_tokenizer *t) {
    return t->add_bos && t->bos >= 0;
}
int tok_is_eog(const tok_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_vocab && t->is_eog[id];
}
const char *tok_model_name(const tok_tokenizer *t) {
    return t->model_name;
}
const char *tok_pre_name(const tok_tokenizer *t) {
    return t->pre_name;
}
size_t tok_max_piece_len(const tok_tokenizer *t) {
    return t->max_piece;
}

int32_t tok_find(const tok_tokenizer *t, const char *text, size_t len) {
    int32_t id = tok_str_lookup(t, text, len);
    return id < t->n_vocab ? id : -1;
}

const char *tok_token_text(const tok_tokenizer *t, int32_t id) {
    if (id < 0 || id >= t->n_vocab)
        return NULL;
    return t->arena + t->str_off[id];
}

const char *tok_piece(const tok_tokenizer *t, int32_t id, int render_special, size_t *len) {
    if (id < 0 || id >= t->n_vocab) {
        *len = 0;
        return "";
    }
    if (!render_special && (t->attr[id] & (TOK_A_CONTROL | TOK_A_UNKNOWN))) {
        *len = 0;
        return "";
    }
    *len = t->piece_len[id];
    return t->piece_arena + t->piece_off[id];
}

int tok_set_chat_template(tok_tokenizer *t, const char *s, size_t n, md_err *e) {
    free(t->chat_template);
    t->chat_template = malloc(n + 1);
    if (!t->chat_template)
        return md_errf(e, MD_ENOMEM, "out of memory copying the chat template");
    memcpy(t->chat_template, s, n);
    t->chat_template[n] = '\0';
    t->chat_template_len = n;
    return 0;
}

const char *tok_chat_template_text(const tok_tokenizer *t, size_t *len) {
    if (len)
        *len = t ? t->chat_template_len : 0;
    return t ? t->chat_template : NULL;
}

/* ---- output and scratch of the encoders ---- */

int tok_grow_symbols_slow(tok_scratch *s, size_t n) {
    size_t c = s->sym_cap ? s->sym_cap : 256;
    while (c < n)
        c *= 2;
    void *a = realloc(s->sym_id, c * sizeof(int32_t));
    if (a)
        s->sym_id = a;
    void *b = realloc(s->sym_prev, c * sizeof(int32_t));
    if (b)
        s->sym_prev = b;
    void *d = realloc(s->sym_next, c * sizeof(int32_t));
    if (d)
        s->sym_next = d;
    void *f = realloc(s->sym_off, c * sizeof(uint32_t));
    if (f)
        s->sym_off = f;
    void *g = realloc(s->sym_len, c * sizeof(uint32_t));
    if (g)
        s->sym_len = g;
    if (!a || !b || !d || !f || !g)
        return MD_ENOMEM;
    s->sym_cap = c;
    return 0;
}

void tok_scratch_free(tok_scratch *s) {
    free(s->wc);
    free(s->wc_keys);
    free(s->wc_ids);
    free(s->norm);
    free(s->view);
    if (s->md)
        pcre2_match_data_free(s->md);
    free(s->sym_id);
    free(s->sym_prev);
    free(s->sym_next);
    free(s->sym_off);
    free(s->sym_len);
    free(s->heap);
    free(s->enc);
    free(s->hf_buf[0]);
    free(s->hf_buf[1]);
    free(s->marks);
    memset(s, 0, sizeof *s);
}

int tok_out_push(tok_out *o, int32_t id) {
    if (o->n == o->cap) {
        size_t cap = o->cap ? o->cap * 2 : 64;
        int32_t *n = realloc(o->ids, cap * sizeof *n);
        if (!n)
            return MD_ENOMEM;
        o->ids = n;
        o->cap = cap;
    }
    o->ids[o->n++] = id;
    return 0;
}

/* ---- streaming decode ---- */

void tok_stream_init(tok_stream *s) {
    s->n_pending = 0;
    s->started = 0;
}

/* WordPiece's decoder at the first token of a text: no space before it, and a continuation
 * keeps its prefix. Appends the prefix to out at *w (cap permitting) and moves *p past a
 * leading space. */
static void wp_first(const tok_tokenizer *t, int32_t id, const char **p, size_t *plen, char *out,
                     size_t cap, size_t *w) {
    const char *s = t->arena + t->str_off[id];
    size_t n = t->str_len[id], pl = t->wp.dec_prefix_len;
    if (t->wp.decoder && n >= pl && !memcmp(s, t->wp.dec_prefix, pl)) {
        if (*w + pl + 1 <= cap) {
            memcpy(out + *w, t->wp.dec_prefix, pl);
            *w += pl;
        }
    } else if (*plen && (*p)[0] == ' ') {
        (*p)++;
        (*plen)--;
    }
}

/* Emit the complete characters of buf[0..n) into out; returns bytes consumed. Held bytes
 * (a character's incomplete start) stay unconsumed unless `final`. */
static size_t emit_valid(const uint8_t *buf, size_t n, int final, char *out, size_t cap,
                         size_t *w) {
    size_t i = 0;
    while (i < n) {
        uint32_t c;
        int inc, bad, l = tok_utf8_strict(buf + i, n - i, &c, &inc, &bad);
        if (l == 0 && inc && !final)
            break; /* wait for the rest of the character */
        const char *src = (const char *)buf + i;
        size_t k = (size_t)l, adv = (size_t)l;
        if (l == 0) {
            /* one U+FFFD per maximal invalid subpart (a truncated character at the very
             * end is one) */
            src = "\xef\xbf\xbd";
            k = 3;
            adv = inc ? n - i : (size_t)bad;
        }
        if (*w + k + 1 > cap)
            return n; /* no room: drop the rest (documented) */
        memcpy(out + *w, src, k);
        *w += k;
        i += adv;
    }
    return i;
}

size_t tok_stream_push(const tok_tokenizer *t, tok_stream *s, int32_t id, char *out, size_t cap) {
    size_t plen, w = 0;
    const char *p = tok_piece(t, id, 0, &plen);
    if (cap)
        out[0] = '\0';
    if (!cap)
        return 0;
    if (t->kind == TOK_KIND_WP && !s->started && plen) {
        s->started = 1;
        wp_first(t, id, &p, &plen, out, cap, &w);
    }
    /* the held bytes plus the start of the piece: enough to finish or refute them */
    size_t pos = 0;
    if (s->n_pending > 0) {
        uint8_t tmp[16];
        size_t held = (size_t)s->n_pending, take = plen < 8 ? plen : 8, n = held + take;
        memcpy(tmp, s->pending, held);
        memcpy(tmp + held, p, take);
        size_t used = emit_valid(tmp, n, 0, out, cap, &w);
        s->n_pending = 0;
        if (used < held) {
            /* a character that began in the held bytes is still incomplete at the end of
             * tmp: then tmp is at most 5 bytes and holds the whole piece; keep the rest */
            memcpy(s->pending, tmp + used, n - used);
            s->n_pending = (int)(n - used);
            out[w] = '\0';
            return w;
        }
        pos = used - held;
    }
    size_t used = emit_valid((const uint8_t *)p + pos, plen - pos, 0, out, cap, &w);
    size_t rest = plen - pos - used;
    if (rest > 0 && rest < sizeof s->pending) {
        memcpy(s->pending, p + pos + used, rest);
        s->n_pending = (int)rest;
    }
    out[w] = '\0';
    return w;
}

size_t tok_stream_flush(tok_stream *s, char *out, size_t cap) {
    size_t w = 0;
    if (!cap)
        return 0;
    emit_valid((const uint8_t *)s->pending, (size_t)s->n_pending, 1, out, cap, &w);
    s->n_pending = 0;
    out[w] = '\0';
    return w;
}

int tok_decode(const tok_tokenizer *t, const int32_t *ids, int n_ids, int render_special,
               char **out, size_t *len, md_err *e) {
    *out = NULL;
    *len = 0;
    size_t total = 0;
    for (int i = 0; i < n_ids; i++) {
        size_t l;
        tok_piece(t, ids[i], render_special, &l);
        total += l;
    }
    if (t->kind == TOK_KIND_WP)
        total += t->wp.dec_prefix_len; /* the first token may keep its prefix */
    /* every byte can become a 3-byte U+FFFD at worst */
    uint8_t *raw = malloc(total + 1);
    char *dst = malloc(total * 3 + 1);
    if (!raw || !dst) {
        free(raw);
        free(dst);
        return md_errf(e, MD_ENOMEM, "decode: out of memory for %zu bytes", total);
    }
    size_t r = 0;
    int started = 0;
    for (int i = 0; i < n_ids; i++) {
        if (ids[i] < 0 || ids[i] >= t->n_vocab) {
            free(raw);
            free(dst);
            return md_errf(e, MD_EINVAL, "decode: token id %d at position %d is not in 0..%d",
                           ids[i], i, t->n_vocab - 1);
        }
        size_t l;
        const char *p = tok_piece(t, ids[i], render_special, &l);
        if (t->kind == TOK_KIND_WP && !started && l) {
            started = 1;
            wp_first(t, ids[i], &p, &l, (char *)raw, total + 1, &r);
        }
        memcpy(raw + r, p, l);
        r += l;
    }
    size_t w = 0;
    emit_valid(raw, r, 1, dst, total * 3 + 1, &w);
    dst[w] = '\0';
    free(raw);
    *out = dst;
    *len = w;
    return 0;
}