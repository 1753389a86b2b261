/* tokenizer_spm.c — SentencePiece BPE as llama.cpp runs it for "llama" vocabularies
 * (Llama 2, TinyLlama, Mistral v0.1).
 *
 * A text fragment gets a leading space when it starts the prompt or follows a special token
 * (tokenizer.ggml.add_space_prefix), every space becomes U+2581, and the text is split into
 * UTF-8 characters (by lead byte, so stray bytes are one-byte symbols). Adjacent symbols
 * whose concatenation is a token are merged, highest score first (leftmost on ties); a final
 * symbol that is not a token becomes its <0xXX> byte tokens (byte fallback). Input bytes are
 * used as they are: invalid UTF-8 ends up as byte tokens, never an error. */
#include <stdlib.h>
#include <string.h>

#include "engine/tokenizer/tokenizer_spm.h"

#include "engine/tokenizer/bigram_heap.h"

/* higher score first, then the leftmost pair */
static int spm_before(const tok_bigram *a, const tok_bigram *b) {
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

static void try_add(const tok_tokenizer *t, tok_scratch *sc, const char *s, size_t *hn, int32_t l,
                    int32_t r) {
    if (l < 0 || r < 0)
        return;
    uint32_t size = sc->sym_len[l] + sc->sym_len[r];
    int32_t id = tok_str_lookup(t, s + sc->sym_off[l], size);
    if (id < 0 || id >= t->n_vocab)
        return;
    tok_bigram b = {.score = t->scores[id], .left = l, .right = r, .len_l = size};
    tok_heap_push(sc->heap, hn, b, spm_before);
}

int tok_spm_encode(const tok_tokenizer *t, tok_scratch *sc, const char *text, size_t len,
                   int space_prefix, tok_out *out, md_err *e) {
    if (len > UINT32_MAX / 4)
        return md_errf(e, MD_ERANGE, "tokenize: a text fragment of %zu bytes", len);
    if (tok_grow((void **)&sc->norm, &sc->norm_cap, len * 3 + 3, 1))
        return md_errf(e, MD_ENOMEM, "tokenize: out of memory");
    char *s = sc->norm;
    size_t n = 0;
    if (space_prefix) {
        memcpy(s, "\xe2\x96\x81", 3);
        n = 3;
    }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') {
            memcpy(s + n, "\xe2\x96\x81", 3);
            n += 3;
        } else {
            s[n++] = text[i];
        }
    }
    if (n == 0)
        return 0;
    /* symbols: one per UTF-8 character, sized by its lead byte */
    static const uint8_t k_len[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    if (tok_grow_symbols(sc, n))
        return md_errf(e, MD_ENOMEM, "tokenize: out of memory");
    if (tok_grow((void **)&sc->heap, &sc->heap_cap, 3 * n, sizeof(tok_bigram)))
        return md_errf(e, MD_ENOMEM, "tokenize: out of memory");
    int32_t ns = 0;
    for (size_t off = 0; off < n;) {
        size_t l = k_len[(uint8_t)s[off] >> 4];
        if (l > n - off)
            l = n - off;
        sc->sym_off[ns] = (uint32_t)off;
        sc->sym_len[ns] = (uint32_t)l;
        sc->sym_prev[ns] = ns - 1;
        off += l;
        sc->sym_next[ns] = off < n ? ns + 1 : -1;
        ns++;
    }
    size_t hn = 0;
    for (int32_t i = 1; i < ns; i++)
        try_add(t, sc, s, &hn, i - 1, i);
    while (hn > 0) {
        tok_bigram b = tok_heap_pop(sc->heap, &hn, spm_before);
        uint32_t ll = sc->sym_len[b.left], rl = sc->sym_len[b.right];
        if (ll == 0 || rl == 0 || ll + rl != b.len_l)
            continue;
        int32_t nx = tok_sym_join(sc, b.left, b.right, ll + rl);
        try_add(t, sc, s, &hn, sc->sym_prev[b.left], b.left);
        try_add(t, sc, s, &hn, b.left, nx);
    }
    for (int32_t i = 0; i >= 0; i = sc->sym_next[i]) {
        const char *p = s + sc->sym_off[i];
        int32_t id = tok_str_lookup(t, p, sc->sym_len[i]);
        if (id >= 0 && id < t->n_vocab) {
            if (tok_out_push(out, id))
                return md_errf(e, MD_ENOMEM, "tokenize: out of memory");
            continue;
        }
        for (uint32_t j = 0; j < sc->sym_len[i]; j++) {
            int32_t bt = t->byte_tok[(uint8_t)p[j]];
            if (bt < 0 || bt >= t->n_vocab)
                bt = t->unk;
            if (bt < 0)
                return md_errf(e, MD_EINVAL,
                               "tokenize: byte 0x%02X has no <0x%02X> token and the vocabulary "
                               "has no unknown token",
                               (uint8_t)p[j], (uint8_t)p[j]);
            if (tok_out_push(out, bt))
                return md_errf(e, MD_ENOMEM, "tokenize: out of memory");
        }
    }
    return 0;
}
