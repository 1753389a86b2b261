/* grammar_vocab.c — a tokenizer's tokens as output bytes for the grammar engine. */
#include "engine/grammar_vocab.h"

#include <stdlib.h>
#include <string.h>

int md_vocab_bytes_make(const tok_tokenizer *t, md_vocab_bytes *vb, md_err *e) {
    memset(vb, 0, sizeof *vb);
    int n = tok_n_vocab(t);
    if (n <= 0)
        return md_errf(e, MD_EINVAL, "grammar vocabulary: the tokenizer has %d tokens", n);
    vb->tok = malloc((size_t)n * sizeof *vb->tok);
    vb->len = malloc((size_t)n * sizeof *vb->len);
    int n_eos = 0;
    for (int i = 0; i < n; i++)
        n_eos += tok_is_eog(t, i) != 0;
    vb->eos = malloc((size_t)(n_eos ? n_eos : 1) * sizeof *vb->eos);
    if (!vb->tok || !vb->len || !vb->eos) {
        md_vocab_bytes_free(vb);
        return md_errf(e, MD_ENOMEM, "grammar vocabulary: out of memory for %d tokens", n);
    }
    if (n_eos == 0) {
        md_vocab_bytes_free(vb);
        return md_errf(e, MD_EINVAL,
                       "grammar vocabulary: the tokenizer has no end-of-generation token, so a "
                       "constrained answer could never end");
    }
    vb->n_vocab = n;
    for (int i = 0; i < n; i++) {
        size_t len = 0;
        /* render_special 0: what the engine's streaming decode appends for the token */
        vb->tok[i] = tok_piece(t, i, 0, &len);
        if (tok_is_eog(t, i)) {
            vb->eos[vb->n_eos++] = i;
            len = 0; /* ends the output instead of adding to it */
        }
        vb->len[i] = (uint32_t)len;
    }
    return 0;
}

void md_vocab_bytes_free(md_vocab_bytes *vb) {
    free(vb->tok);
    free(vb->len);
    free(vb->eos);
    memset(vb, 0, sizeof *vb);
}

int md_grammar_vocab_new(const tok_tokenizer *t, gr_vocab **out, md_err *e) {
    *out = NULL;
    md_vocab_bytes vb;
    int rc = md_vocab_bytes_make(t, &vb, e);
    if (rc)
        return rc;
    rc = gr_vocab_new(vb.n_vocab, vb.tok, vb.len, vb.eos, vb.n_eos, out, e);
    md_vocab_bytes_free(&vb);
    return rc;
}
