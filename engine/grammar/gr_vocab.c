/* gr_vocab.c — vocabularies: token byte strings, end tokens, and the token trie in preorder
 * (sorted, so shared prefixes are walked once and each subtree is a contiguous run). */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "engine/grammar/gr_match_int.h"

static _Atomic uint64_t vocab_uid_next = 1;

static const gr_vocab *sort_vocab;
static int cmp_tok(const void *a, const void *b) {
    const gr_vocab *v = sort_vocab;
    int x = *(const int32_t *)a, y = *(const int32_t *)b;
    uint32_t lx = v->len[x], ly = v->len[y];
    int c = memcmp(v->bytes + v->off[x], v->bytes + v->off[y], lx < ly ? lx : ly);
    if (c)
        return c;
    if (lx != ly)
        return lx < ly ? -1 : 1;
    return (x > y) - (x < y);
}

static pthread_mutex_t sort_lock = PTHREAD_MUTEX_INITIALIZER;

int gr_vocab_new(int n_vocab, const char *const *tok, const uint32_t *len, const int32_t *eos,
                 int n_eos, gr_vocab **out, md_err *e) {
    *out = NULL;
    if (n_vocab <= 0 || !tok || !len || (n_eos > 0 && !eos) || n_eos < 0)
        return md_errf(e, MD_EINVAL, "gr_vocab_new: need n_vocab > 0, tok[], len[] and eos[]");
    gr_vocab *v = calloc(1, sizeof *v);
    if (!v)
        return md_errf(e, MD_ENOMEM, "out of memory building a grammar vocabulary");
    v->n = n_vocab;
    v->uid = atomic_fetch_add(&vocab_uid_next, 1);
    size_t total = 0;
    for (int i = 0; i < n_vocab; i++) {
        if (len[i] && !tok[i]) {
            free(v);
            return md_errf(e, MD_EINVAL, "gr_vocab_new: token %d has %u bytes but no data", i,
                           len[i]);
        }
        total += len[i];
    }
    v->bytes = malloc(total + 1);
    v->off = malloc(sizeof(uint32_t) * (size_t)n_vocab);
    v->len = malloc(sizeof(uint32_t) * (size_t)n_vocab);
    v->is_eos = calloc((size_t)n_vocab, 1);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)n_vocab);
    if (!v->bytes || !v->off || !v->len || !v->is_eos || !ids || total > UINT32_MAX) {
        free(ids);
        gr_vocab_free(v);
        return md_errf(e, MD_ENOMEM, "out of memory building a grammar vocabulary");
    }
    v->eos = malloc(sizeof(int32_t) * (size_t)(n_eos + 1));
    if (!v->eos) {
        free(ids);
        gr_vocab_free(v);
        return md_errf(e, MD_ENOMEM, "out of memory building a grammar vocabulary");
    }
    for (int i = 0; i < n_eos; i++) {
        if (eos[i] < 0 || eos[i] >= n_vocab) {
            free(ids);
            gr_vocab_free(v);
            return md_errf(e, MD_EINVAL, "gr_vocab_new: end token %d outside 0..%d", eos[i],
                           n_vocab - 1);
        }
        if (!v->is_eos[eos[i]])
            v->eos[v->neos++] = eos[i];
        v->is_eos[eos[i]] = 1;
    }
    size_t o = 0;
    int nt = 0;
    for (int i = 0; i < n_vocab; i++) {
        v->off[i] = (uint32_t)o;
        v->len[i] = v->is_eos[i] ? 0 : len[i];
        if (v->len[i]) {
            memcpy(v->bytes + o, tok[i], len[i]);
            ids[nt++] = i;
            if ((int)len[i] > v->maxlen)
                v->maxlen = (int)len[i];
        }
        o += v->len[i];
    }
    pthread_mutex_lock(&sort_lock);
    sort_vocab = v;
    qsort(ids, (size_t)nt, sizeof *ids, cmp_tok);
    pthread_mutex_unlock(&sort_lock);
    /* Trie nodes: at most total bytes. */
    size_t cap = total + 1;
    v->tn_byte = malloc(cap);
    v->tn_depth = malloc(sizeof(int32_t) * cap);
    v->tn_end = malloc(sizeof(int32_t) * cap);
    v->tn_tok = malloc(sizeof(int32_t) * (cap + 1));
    v->toks = malloc(sizeof(int32_t) * ((size_t)nt + 1));
    int32_t *open = malloc(sizeof(int32_t) * ((size_t)v->maxlen + 2));
    if (!v->tn_byte || !v->tn_depth || !v->tn_end || !v->tn_tok || !v->toks || !open) {
        free(ids);
        free(open);
        gr_vocab_free(v);
        return md_errf(e, MD_ENOMEM, "out of memory building a grammar vocabulary");
    }
    int depth_open = 0; /* open[1..depth_open] are the nodes on the current path */
    int prev = -1;
    for (int i = 0; i < nt; i++) {
        int id = ids[i];
        const uint8_t *s = (const uint8_t *)v->bytes + v->off[id];
        int l = (int)v->len[id];
        int lcp = 0;
        if (prev >= 0) {
            const uint8_t *p = (const uint8_t *)v->bytes + v->off[prev];
            int pl = (int)v->len[prev];
            while (lcp < l && lcp < pl && p[lcp] == s[lcp])
                lcp++;
        }
        /* Close the nodes deeper than the shared prefix. */
        while (depth_open > lcp) {
            v->tn_end[open[depth_open]] = v->ntn;
            depth_open--;
        }
        for (int d = lcp + 1; d <= l; d++) {
            int k = v->ntn++;
            v->tn_byte[k] = s[d - 1];
            v->tn_depth[k] = d;
            v->tn_tok[k] = v->ntoks;
            open[d] = k;
            depth_open = d;
        }
        v->toks[v->ntoks++] = id;
        prev = id;
    }
    while (depth_open > 0) {
        v->tn_end[open[depth_open]] = v->ntn;
        depth_open--;
    }
    v->tn_tok[v->ntn] = v->ntoks;
    free(open);
    free(ids);
    *out = v;
    return 0;
}

void gr_vocab_free(gr_vocab *v) {
    if (!v)
        return;
    free(v->bytes);
    free(v->off);
    free(v->len);
    free(v->is_eos);
    free(v->eos);
    free(v->tn_byte);
    free(v->tn_depth);
    free(v->tn_end);
    free(v->tn_tok);
    free(v->toks);
    free(v);
}

int gr_vocab_size(const gr_vocab *v) {
    return v ? v->n : 0;
}
