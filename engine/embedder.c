/* embedder.c — see embedder.h: open an encoder with its sentence-transformers pipeline,
 * pack inputs into steps, pool and normalise. */
#include "engine/embedder.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model/encoder.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/weights/hf_model.h"

struct md_embedder {
    gguf_file *gf;
    md_backend *be;
    md_encoder *enc;
    tok_tokenizer *tok; /* NULL when the model's tokenizer did not load: tok_err says why */
    char tok_err[256];
    st_config st;
    int max_len;
    int32_t *tokens, *seq, *pos; /* [max_tokens] step layout */
    int32_t *seq_len;            /* [max_tokens] */
    float *hidden;               /* [max_tokens, C] */
};

void md_embedder_close(md_embedder *m) {
    if (!m)
        return;
    md_encoder_free(m->enc);
    md_backend_free(m->be);
    gguf_close(m->gf);
    tok_free(m->tok);
    free(m->tokens);
    free(m->seq);
    free(m->pos);
    free(m->seq_len);
    free(m->hidden);
    free(m);
}

int md_embedder_probe(const char *path) {
    gguf_file *gf = NULL;
    md_err e = {0};
    if (md_model_open(path, &gf, &e))
        return 0;
    int is = md_encoder_is(gf);
    gguf_close(gf);
    return is;
}

/* The pipeline: the directory's sentence-transformers files, else the GGUF's pooling_type. */
static int read_pipeline(md_embedder *m, md_err *e) {
    size_t n;
    const char *dir = hf_dir_of(m->gf, &n);
    if (dir) {
        char p[4096];
        snprintf(p, sizeof p, "%.*s", (int)n, dir);
        int rc = st_config_load(p, &m->st, e);
        if (rc)
            return rc;
    }
    if (!m->st.found) { /* llama.cpp's numbering: 1 mean, 2 cls, 3 last; normalised as it does */
        int pt = m->enc->hp.pooling;
        if (pt == 0 || pt == 4)
            return md_errf(e, MD_EUNSUPP, "pooling_type %d (none / rank) gives no sentence vector",
                           pt);
        m->st.pooling = pt == 2 ? ST_POOL_CLS : pt == 3 ? ST_POOL_LAST : ST_POOL_MEAN;
        m->st.normalize = 1;
    }
    m->max_len = m->enc->hp.n_ctx;
    if (m->st.max_seq_length > 0 && m->st.max_seq_length < m->max_len)
        m->max_len = m->st.max_seq_length;
    if (m->st.dim && m->st.dim != m->enc->hp.n_embd)
        return md_errf(e, MD_EFORMAT, "the Pooling module says %d dimensions, the model has %d",
                       m->st.dim, m->enc->hp.n_embd);
    return 0;
}

int md_embedder_open(const char *path, const md_embedder_opts *o, md_embedder **out, md_err *e) {
    *out = NULL;
    md_embedder_opts d = {0};
    if (!o)
        o = &d;
    int T = o->max_tokens > 0 ? o->max_tokens : 4096, rc;
    md_embedder *m = calloc(1, sizeof *m);
    if (!m)
        return md_errf(e, MD_ENOMEM, "out of memory");
    if ((rc = md_model_open(path, &m->gf, e)))
        goto fail;
    if (!md_encoder_is(m->gf)) {
        rc = md_errf(e, MD_EUNSUPP, "%s is not an encoder model (bert): embeddings need one", path);
        goto fail;
    }
    md_enc_hparams hp;
    if ((rc = md_enc_hparams_read(m->gf, &hp, e)))
        goto fail;
    if (T < hp.n_ctx) /* a step holds at least the longest input */
        T = hp.n_ctx;
    if ((rc = md_backend_open(o->device ? o->device : "cpu", o->n_threads, &m->be, e)) ||
        (rc = md_encoder_load(m->gf, m->be, T, &m->enc, e)) || (rc = read_pipeline(m, e)))
        goto fail;
    md_err te = {0};
    if (md_model_tokenizer(m->gf, &m->tok, &te))
        snprintf(m->tok_err, sizeof m->tok_err, "%s", te.msg);
    int C = m->enc->hp.n_embd;
    m->tokens = malloc((size_t)T * sizeof *m->tokens);
    m->seq = malloc((size_t)T * sizeof *m->seq);
    m->pos = malloc((size_t)T * sizeof *m->pos);
    m->seq_len = malloc((size_t)T * sizeof *m->seq_len);
    m->hidden = malloc((size_t)T * C * sizeof *m->hidden);
    if (!m->tokens || !m->seq || !m->pos || !m->seq_len || !m->hidden) {
        rc = md_errf(e, MD_ENOMEM, "out of memory for steps of %d tokens", T);
        goto fail;
    }
    *out = m;
    return 0;
fail:
    md_embedder_close(m);
    return rc;
}

int md_embedder_dim(const md_embedder *m) {
    return m->enc->hp.n_embd;
}
int md_embedder_n_vocab(const md_embedder *m) {
    return m->enc->hp.n_vocab;
}
int md_embedder_max_len(const md_embedder *m) {
    return m->max_len;
}
const st_config *md_embedder_st(const md_embedder *m) {
    return &m->st;
}
const char *md_embedder_device(const md_embedder *m) {
    return m->be->ops->name;
}

int md_embedder_tokenize(const md_embedder *m, const char *text, size_t len, int32_t **ids,
                         int *n_ids, md_err *e) {
    *ids = NULL;
    *n_ids = 0;
    if (!m->tok)
        return md_errf(e, MD_EUNSUPP,
                       "this model's tokenizer is not one medley runs (%s): give "
                       "token ids instead",
                       m->tok_err);
    return tok_encode(m->tok, text, len, 1, 0, ids, n_ids, e);
}

void md_pool(st_pooling p, const float *h, int n, int C, float *out) {
    if (p == ST_POOL_CLS || p == ST_POOL_LAST) {
        memcpy(out, h + (size_t)(p == ST_POOL_CLS ? 0 : n - 1) * C, (size_t)C * sizeof *out);
        return;
    }
    for (int c = 0; c < C; c++)
        out[c] = p == ST_POOL_MAX ? -INFINITY : 0.0f;
    for (int t = 0; t < n; t++)
        for (int c = 0; c < C; c++) {
            float v = h[(size_t)t * C + c];
            out[c] = p == ST_POOL_MAX ? (v > out[c] ? v : out[c]) : out[c] + v;
        }
    float div = p == ST_POOL_MEAN ? (float)n : p == ST_POOL_MEAN_SQRT ? sqrtf((float)n) : 1.0f;
    for (int c = 0; c < C; c++)
        out[c] /= div;
}

void md_l2_normalize(float *x, int n) {
    double s = 0;
    for (int i = 0; i < n; i++)
        s += (double)x[i] * x[i];
    if (s > 0) /* sentence-transformers divides by max(norm, 1e-12) */
        for (int i = 0; i < n; i++)
            x[i] = (float)(x[i] / (sqrt(s) > 1e-12 ? sqrt(s) : 1e-12));
}

/* Inputs [i0, i1) packed as one step, pooled into out rows i0.. */
static int run_step(md_embedder *m, const int32_t *const *ids, const int *lens, int i0, int i1,
                    float *out, md_err *e) {
    int T = 0, C = m->enc->hp.n_embd;
    for (int i = i0; i < i1; i++) {
        for (int p = 0; p < lens[i]; p++, T++) {
            m->tokens[T] = ids[i][p];
            m->seq[T] = i - i0;
            m->pos[T] = p;
        }
        m->seq_len[i - i0] = lens[i];
    }
    md_batch b = {.n_tokens = T,
                  .n_seqs = i1 - i0,
                  .tokens = m->tokens,
                  .tok_seq = m->seq,
                  .tok_pos = m->pos,
                  .seq_len = m->seq_len};
    int rc = md_encoder_forward(m->enc, &b, m->hidden, e);
    if (rc)
        return rc;
    for (int i = i0, t0 = 0; i < i1; t0 += lens[i], i++) {
        float *o = out + (size_t)i * C;
        md_pool(m->st.pooling, m->hidden + (size_t)t0 * C, lens[i], C, o);
        if (m->st.normalize)
            md_l2_normalize(o, C);
    }
    return 0;
}

int md_embedder_run(md_embedder *m, const int32_t *const *ids, const int *lens, int n, float *out,
                    md_err *e) {
    int V = m->enc->hp.n_vocab, cap = m->enc->max_tokens;
    for (int i = 0; i < n; i++) {
        if (lens[i] < 1 || lens[i] > m->max_len)
            return md_errf(e, MD_ERANGE, "input %d has %d tokens; this model takes 1 to %d", i,
                           lens[i], m->max_len);
        for (int p = 0; p < lens[i]; p++)
            if (ids[i][p] < 0 || ids[i][p] >= V)
                return md_errf(e, MD_EINVAL,
                               "input %d: token id %d is outside the vocabulary "
                               "(0..%d)",
                               i, (int)ids[i][p], V - 1);
    }
    for (int i0 = 0; i0 < n;) {
        int i1 = i0, T = 0;
        while (i1 < n && (T + lens[i1] <= cap || i1 == i0))
            T += lens[i1++];
        int rc = run_step(m, ids, lens, i0, i1, out, e);
        if (rc)
            return rc;
        i0 = i1;
    }
    return 0;
}
