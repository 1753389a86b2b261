/* tokenizer.c — the tokenizer's entry points on top of its kinds: tok_encode splits the
 * text at special tokens (llama.cpp's partition for GGUF vocabularies, Hugging Face's
 * added-token rules for tokenizer.json) and hands each text fragment to the kind's encoder
 * (tokenizer_bpe.c, tokenizer_spm.c, tokenizer_wordpiece.c); md_model_tokenizer picks the loader
 * for a model file (tokenizer_gguf.c or tokenizer_hf.c). The vocabulary, pieces and decode are
 * vocab.c's; chat templates tokenizer_chat.c's. */
#define _GNU_SOURCE /* memmem */
#include "engine/tokenizer/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "engine/tokenizer/tokenizer_bpe.h"
#include "engine/tokenizer/tokenizer_spm.h"
#include "engine/tokenizer/tokenizer_wordpiece.h"
#include "engine/tokenizer/vocab.h"
#include "engine/weights/hf_model.h"

/* ---- encode: special-token partition, then the model's encoder per text fragment ---- */

typedef struct {
    size_t off, len;
    int32_t tok; /* -1: text */
} frag;

typedef struct {
    frag *v;
    size_t n, cap;
} frags;

static int frags_push(frags *f, size_t off, size_t len, int32_t tok) {
    if (f->n == f->cap) {
        size_t cap = f->cap ? f->cap * 2 : 16;
        frag *n = realloc(f->v, cap * sizeof *n);
        if (!n)
            return MD_ENOMEM;
        f->v = n;
        f->cap = cap;
    }
    f->v[f->n++] = (frag){off, len, tok};
    return 0;
}

/* llama.cpp's tokenizer_st_partition: for each special token, longest first, split every
 * remaining text fragment at each of its occurrences (leftmost first). */
static int partition(const tok_tokenizer *t, const char *text, size_t len, int parse_special,
                     frags *cur, frags *next) {
    cur->n = 0;
    if (len == 0)
        return 0;
    if (frags_push(cur, 0, len, -1))
        return MD_ENOMEM;
    for (int k = 0; k < t->n_special; k++) {
        int32_t id = t->special[k];
        if (!parse_special && (t->attr[id] & (TOK_A_CONTROL | TOK_A_UNKNOWN)))
            continue;
        const char *st = t->arena + t->str_off[id];
        size_t sl = t->str_len[id];
        next->n = 0;
        int hit = 0;
        for (size_t i = 0; i < cur->n; i++) {
            frag fr = cur->v[i];
            if (fr.tok >= 0 || fr.len < sl) {
                if (frags_push(next, fr.off, fr.len, fr.tok))
                    return MD_ENOMEM;
                continue;
            }
            size_t pos = fr.off, end = fr.off + fr.len;
            for (;;) {
                const char *m = memmem(text + pos, end - pos, st, sl);
                if (!m)
                    break;
                size_t at = (size_t)(m - text);
                hit = 1;
                if (at > pos && frags_push(next, pos, at - pos, -1))
                    return MD_ENOMEM;
                if (frags_push(next, at, sl, id))
                    return MD_ENOMEM;
                pos = at + sl;
            }
            if (pos < end && frags_push(next, pos, end - pos, -1))
                return MD_ENOMEM;
        }
        if (hit) {
            frags tmp = *cur;
            *cur = *next;
            *next = tmp;
        }
    }
    return 0;
}

/* Unicode White_Space (Rust's char::is_whitespace, Hugging Face's lstrip/rstrip). */
static int is_white(uint32_t c) {
    return (c >= 9 && c <= 13) || c == ' ' || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
           c == 0x205F || c == 0x3000;
}

/* A word character for single_word tokens (regex \w: letters, marks, digits, connectors). */
static int is_word(uint32_t c) {
    switch (utf8proc_category((utf8proc_int32_t)c)) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_PC: return 1;
    default: return 0;
    }
}

/* The character ending at text[end) (0 when none or not valid UTF-8), its start in *at. */
static uint32_t char_before(const char *text, size_t end, size_t *at) {
    size_t i = end;
    while (i > 0 && end - i < 4 && ((uint8_t)text[i - 1] & 0xC0) == 0x80)
        i--;
    if (i > 0)
        i--;
    *at = i;
    uint32_t c;
    int inc, bad;
    if (end == 0 ||
        tok_utf8_strict((const uint8_t *)text + i, end - i, &c, &inc, &bad) != (int)(end - i))
        return 0;
    return c;
}

static uint32_t char_at(const char *text, size_t len, size_t i, size_t *n) {
    uint32_t c;
    int inc, bad,
        l = i < len ? tok_utf8_strict((const uint8_t *)text + i, len - i, &c, &inc, &bad) : 0;
    *n = l > 0 ? (size_t)l : 1;
    return l > 0 ? c : 0;
}

/* Hugging Face's added-token split: the leftmost match, longest there, wins and the search
 * goes on after it; a special token when !parse_special, or a single_word token inside a
 * word, is left as text (and is not searched again); lstrip / rstrip take the whitespace
 * beside the token with it. */
static int partition_hf(const tok_tokenizer *t, const char *text, size_t len, int parse_special,
                        frags *cur) {
    cur->n = 0;
    size_t done = 0, i = 0;
    while (i < len) {
        uint8_t b = (uint8_t)text[i];
        int32_t id = -1;
        size_t tl = 0;
        for (uint32_t k = t->sp_first[b]; k < t->sp_first[b + 1] && id < 0; k++) {
            tl = t->sp_lens[k];
            if (tl > len - i)
                continue;
            int32_t f = tok_str_lookup(t, text + i, tl);
            if (f >= 0 && f < t->n_vocab &&
                (t->attr[f] & (TOK_A_CONTROL | TOK_A_USER | TOK_A_UNKNOWN)))
                id = f;
        }
        if (id < 0) {
            i++;
            continue;
        }
        size_t s = i, e = i + tl, at, n;
        uint8_t fl = t->tok_flags ? t->tok_flags[id] : 0;
        int skip = !parse_special && (t->attr[id] & (TOK_A_CONTROL | TOK_A_UNKNOWN));
        if (!skip && (fl & TOK_F_SINGLE_WORD))
            skip = is_word(char_before(text, s, &at)) || is_word(char_at(text, len, e, &n));
        if (skip) {
            i = e;
            continue;
        }
        if (fl & TOK_F_LSTRIP)
            while (s > done && is_white(char_before(text, s, &at)))
                s = at;
        if (fl & TOK_F_RSTRIP)
            while (e < len && is_white(char_at(text, len, e, &n)))
                e += n;
        if (s > done && frags_push(cur, done, s - done, -1))
            return MD_ENOMEM;
        if (frags_push(cur, s, e - s, id))
            return MD_ENOMEM;
        done = i = e;
    }
    if (done < len && frags_push(cur, done, len - done, -1))
        return MD_ENOMEM;
    return 0;
}

int tok_encode(const tok_tokenizer *t, const char *text, size_t len, int add_bos, int parse_special,
               int32_t **ids, int *n_ids, md_err *e) {
    *ids = NULL;
    *n_ids = 0;
    if (!text && len)
        return md_errf(e, MD_EINVAL, "tokenize: NULL text of %zu bytes", len);
    tok_out out = {0};
    frags cur = {0}, next = {0};
    tok_scratch sc = {0};
    int rc = 0;
    if (len > (size_t)INT32_MAX) {
        rc = md_errf(e, MD_ERANGE, "tokenize: text of %zu bytes is longer than 2 GiB", len);
        goto done;
    }
    if (t->hf ? partition_hf(t, text, len, parse_special, &cur)
              : partition(t, text, len, parse_special, &cur, &next)) {
        rc = md_errf(e, MD_ENOMEM, "tokenize: out of memory");
        goto done;
    }
    int special = add_bos; /* llama.cpp's add_special: BOS and EOS as the model asks */
    if (special && t->add_bos && t->bos >= 0 && tok_out_push(&out, t->bos)) {
        rc = md_errf(e, MD_ENOMEM, "tokenize: out of memory");
        goto done;
    }
    int prev_special = 1;
    for (size_t i = 0; i < cur.n; i++) {
        frag fr = cur.v[i];
        if (fr.tok >= 0) {
            if (tok_out_push(&out, fr.tok)) {
                rc = md_errf(e, MD_ENOMEM, "tokenize: out of memory");
                goto done;
            }
            prev_special = 1;
            continue;
        }
        if (t->kind == TOK_KIND_WP)
            rc = tok_wp_encode(t, &sc, text + fr.off, fr.len, &out, e);
        else if (t->kind == TOK_KIND_BPE || t->hf)
            rc = tok_bpe_encode(t, &sc, text + fr.off, fr.len, fr.off, &out, e);
        else
            rc = tok_spm_encode(t, &sc, text + fr.off, fr.len, t->add_space_prefix && prev_special,
                                &out, e);
        if (rc)
            goto done;
        prev_special = 0;
    }
    if (special && t->add_eos && t->eos >= 0 && tok_out_push(&out, t->eos)) {
        rc = md_errf(e, MD_ENOMEM, "tokenize: out of memory");
        goto done;
    }
    if (out.n > (size_t)INT32_MAX) {
        rc = md_errf(e, MD_ERANGE, "tokenize: more than 2^31 tokens");
        goto done;
    }
    *ids = out.ids;
    *n_ids = (int)out.n;
    out.ids = NULL;
done:
    free(out.ids);
    free(cur.v);
    free(next.v);
    tok_scratch_free(&sc);
    return rc;
}

int md_model_tokenizer(const gguf_file *gf, tok_tokenizer **out, md_err *e) {
    size_t n;
    const char *dir = hf_dir_of(gf, &n);
    if (!dir)
        return tok_load(gf, out, e);
    *out = NULL;
    char p[4096];
    snprintf(p, sizeof p, "%.*s", (int)n, dir);
    return tok_load_hf(p, out, e);
}