/* embedder.c — see embedder.h: open an encoder with its sentence-transformers pipeline,
 * pack inputs into steps, pool and normalise. */
#include "engine/embedder.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model/encoder.h"
#include "engine/model/model.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/weights/hf_model.h"
#include "engine/weights/synth.h"

_Static_assert((int)ST_POOL_MEAN == MD_POOL_MEAN && (int)ST_POOL_CLS == MD_POOL_CLS &&
                   (int)ST_POOL_MAX == MD_POOL_MAX && (int)ST_POOL_MEAN_SQRT == MD_POOL_MEAN_SQRT &&
                   (int)ST_POOL_LAST == MD_POOL_LAST,
               "st_config.h and backend.h number the pooling modes alike");

#define DEC_MAX_SEQS 64 /* decoder steps: sequences per step (block tables of max_len each) */

struct md_embedder {
    gguf_file *gf;
    void *synth; /* a synthetic model's image (engine/weights/synth.h), under gf */
    size_t synth_len;
    md_backend *be;
    md_encoder *enc; /* an encoder, or: */
    md_model *dec;   /* a decoder with last-token pooling, its KV cache (one slot per token of
                        a step: nothing kept between steps) and buffers */
    md_kv_bufs kv;
    md_fwd fwd;
    int32_t *slot, *block_table, *logit_rows; /* [T], [DEC_MAX_SEQS * max_len], [seqs] */
    int max_tokens, n_embd, n_vocab, n_ctx;
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
    if (m->dec) {
        md_fwd_free(m->dec, &m->fwd);
        md_kv_bufs_free(m->dec, &m->kv);
        md_model_free(m->dec);
    }
    md_backend_free(m->be);
    free(m->slot);
    free(m->block_table);
    free(m->logit_rows);
    gguf_close(m->gf);
    md_synth_free(m->synth, m->synth_len);
    tok_free(m->tok);
    free(m->tokens);
    free(m->seq);
    free(m->pos);
    free(m->seq_len);
    free(m->hidden);
    free(m);
}

/* DIR of an HF model file's sentence-transformers pipeline into *st (found 0 when none). */
static int st_of(const gguf_file *gf, st_config *st, md_err *e) {
    size_t n;
    const char *dir = hf_dir_of(gf, &n);
    memset(st, 0, sizeof *st);
    if (!dir)
        return 0;
    char p[4096];
    snprintf(p, sizeof p, "%.*s", (int)n, dir);
    return st_config_load(p, st, e);
}

int md_embedder_probe(const char *path) {
    gguf_file *gf = NULL;
    md_err e = {0};
    st_config st;
    void *img = NULL;
    size_t len = 0;
    if (md_model_open_any(path, 0, &img, &len, &gf, &e)) {
        md_synth_free(img, len);
        return 0;
    }
    int is =
        md_encoder_is(gf) || (st_of(gf, &st, &e) == 0 && st.found && st.pooling == ST_POOL_LAST);
    gguf_close(gf);
    md_synth_free(img, len);
    return is;
}

/* The pipeline's checks and max_len: the directory's sentence-transformers files, else (a
 * GGUF encoder) its pooling_type, numbered as llama.cpp's: 1 mean, 2 cls, 3 last; normalised
 * as llama.cpp does. */
static int read_pipeline(md_embedder *m, int gguf_pooling, md_err *e) {
    int rc = st_of(m->gf, &m->st, e);
    if (rc)
        return rc;
    if (!m->st.found && m->dec)
        return md_errf(e, MD_EUNSUPP,
                       "a decoder model embeds only with a sentence-transformers pipeline of "
                       "last-token pooling (modules.json, 1_Pooling/config.json)");
    if (m->dec && m->st.pooling != ST_POOL_LAST)
        return md_errf(e, MD_EUNSUPP, "a decoder model embeds with last-token pooling, not %s",
                       st_pooling_name(m->st.pooling));
    if (!m->st.found) {
        if (gguf_pooling == 0 || gguf_pooling == 4)
            return md_errf(e, MD_EUNSUPP, "pooling_type %d (none / rank) gives no sentence vector",
                           gguf_pooling);
        m->st.pooling = gguf_pooling == 2   ? ST_POOL_CLS
                        : gguf_pooling == 3 ? ST_POOL_LAST
                                            : ST_POOL_MEAN;
        m->st.normalize = 1;
    }
    m->max_len = m->n_ctx;
    if (m->st.max_seq_length > 0 && m->st.max_seq_length < m->max_len)
        m->max_len = m->st.max_seq_length;
    if (m->st.dim && m->st.dim != m->n_embd)
        return md_errf(e, MD_EFORMAT, "the Pooling module says %d dimensions, the model has %d",
                       m->st.dim, m->n_embd);
    return 0;
}

static int open_encoder(md_embedder *m, const md_embedder_opts *o, int *T, md_err *e) {
    md_enc_hparams hp;
    int rc = md_enc_hparams_read(m->gf, &hp, e);
    if (rc)
        return rc;
    if (*T < hp.n_ctx) /* a step holds at least the longest input */
        *T = hp.n_ctx;
    if ((rc = md_backend_open(o->device ? o->device : "cpu", o->n_threads, &m->be, e)) ||
        (rc = md_encoder_load(m->gf, m->be, *T, &m->enc, e)))
        return rc;
    m->n_embd = m->enc->hp.n_embd;
    m->n_vocab = m->enc->hp.n_vocab;
    m->n_ctx = m->enc->hp.n_ctx;
    return read_pipeline(m, m->enc->hp.pooling, e);
}

/* A decoder (the llama path) whose hidden state of each input's last token is its vector:
 * causal attention over a KV cache of one F32 slot per token of the step, block tables of
 * one-token blocks, the head stopped after the final norm (md_fwd.hidden_only). */
static int open_decoder(md_embedder *m, const md_embedder_opts *o, int *T, md_err *e) {
    int rc;
    if ((rc = md_backend_open(o->device ? o->device : "cpu", o->n_threads, &m->be, e)) ||
        (rc = md_model_load(m->gf, m->be, &m->dec, e)))
        return rc;
    const md_hparams *hp = &m->dec->hp;
    m->n_embd = hp->n_embd;
    m->n_vocab = hp->n_vocab ? hp->n_vocab : (int)m->dec->tok_embd.ne1;
    m->n_ctx = hp->n_ctx_train < *T ? hp->n_ctx_train : *T;
    if ((rc = read_pipeline(m, -1, e)))
        return rc;
    md_reserve r = {.max_tokens = *T,
                    .max_seqs = DEC_MAX_SEQS,
                    .max_cols = hp->n_ff > hp->n_embd ? hp->n_ff : hp->n_embd,
                    .max_ctx = m->max_len,
                    .max_blocks = m->max_len,
                    .n_heads = hp->n_head};
    if (hp->n_head * hp->head_dim > r.max_cols)
        r.max_cols = hp->n_head * hp->head_dim;
    m->slot = malloc((size_t)*T * sizeof *m->slot);
    m->block_table = malloc((size_t)DEC_MAX_SEQS * m->max_len * sizeof *m->block_table);
    m->logit_rows = malloc(DEC_MAX_SEQS * sizeof *m->logit_rows);
    if (!m->slot || !m->block_table || !m->logit_rows)
        return md_errf(e, MD_ENOMEM, "out of memory for steps of %d tokens", *T);
    if ((rc = md_kv_bufs_alloc_type(m->dec, *T, MD_TYPE_F32, &m->kv, e)) ||
        (rc = md_fwd_alloc(m->dec, *T, DEC_MAX_SEQS, &m->fwd, e)) ||
        (rc = m->be->ops->reserve(m->be, &r, e)))
        return rc;
    m->fwd.hidden_only = 1;
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
    if ((rc = md_model_open_any(path, 1, &m->synth, &m->synth_len, &m->gf, e)))
        goto fail;
    if ((rc = md_encoder_is(m->gf) ? open_encoder(m, o, &T, e) : open_decoder(m, o, &T, e)))
        goto fail;
    md_err te = {0};
    if (md_model_tokenizer(m->gf, &m->tok, &te))
        snprintf(m->tok_err, sizeof m->tok_err, "%s", te.msg);
    m->max_tokens = T;
    m->tokens = malloc((size_t)T * sizeof *m->tokens);
    m->seq = malloc((size_t)T * sizeof *m->seq);
    m->pos = malloc((size_t)T * sizeof *m->pos);
    m->seq_len = malloc((size_t)T * sizeof *m->seq_len);
    m->hidden = malloc((size_t)T * m->n_embd * sizeof *m->hidden);
    if (!m->tokens || !m->seq || !m->pos || !m->seq_len || !m->hidden) {
        rc = md_errf(e, MD_ENOMEM, "out of memory for steps of %d tokens", T);
        goto fail;
    }
    *out = m;
    return 0;
fail:
    md_embedder_close(m);
    return md_errctx(e, "%s: ", path);
}

int md_embedder_dim(const md_embedder *m) {
    return m->n_embd;
}
int md_embedder_n_vocab(const md_embedder *m) {
    return m->n_vocab;
}
int md_embedder_max_len(const md_embedder *m) {
    return m->max_len;
}
const st_config *md_embedder_st(const md_embedder *m) {
    return &m->st;
}
int md_embedder_set_bf16(md_embedder *m, int on, md_err *e) {
    if (!m->enc)
        return on ? md_errf(e, MD_EUNSUPP, "BF16 products are for encoder models, not decoders")
                  : 0;
    return md_encoder_set_bf16(m->enc, on, e);
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

/* A decoder's step over the packed layout already in m: one-token blocks, so block p of
 * sequence s is the slot of its token p; the last token of each sequence gives its row. */
static int decoder_step(md_embedder *m, md_batch *b, const int *lens, int i0, int i1, float *out,
                        md_err *e) {
    int L = m->max_len;
    for (int t = 0; t < b->n_tokens; t++)
        m->slot[t] = t;
    for (int i = i0, t0 = 0; i < i1; t0 += lens[i], i++) {
        for (int p = 0; p < lens[i]; p++)
            m->block_table[(size_t)(i - i0) * L + p] = t0 + p;
        m->logit_rows[i - i0] = t0 + lens[i] - 1;
    }
    b->slot = m->slot;
    b->block_table = m->block_table;
    b->max_blocks = L;
    b->block_tokens = 1;
    b->logit_rows = m->logit_rows;
    b->n_logits = i1 - i0;
    return md_model_forward(m->dec, &m->fwd, &m->kv, b, out + (size_t)i0 * m->n_embd, e);
}

/* Inputs [i0, i1) packed as one step, pooled into out rows i0.. */
static int run_step(md_embedder *m, const int32_t *const *ids, const int *lens, int i0, int i1,
                    float *out, md_err *e) {
    int T = 0, C = m->n_embd, rc;
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
    if (m->dec) {
        if ((rc = decoder_step(m, &b, lens, i0, i1, out, e)))
            return rc;
        for (int i = i0; m->st.normalize && i < i1; i++)
            md_l2_normalize(out + (size_t)i * C, C);
        return 0;
    }
    if (m->be->ops->pool_enc) /* pooled on the device: only the vectors come back */
        return md_encoder_forward_pooled(m->enc, &b, (int)m->st.pooling, m->st.normalize,
                                         out + (size_t)i0 * C, e);
    if ((rc = md_encoder_forward(m->enc, &b, m->hidden, e)))
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
    int V = m->n_vocab, cap = m->max_tokens, max_seqs = m->dec ? DEC_MAX_SEQS : cap;
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
        while (i1 < n && i1 - i0 < max_seqs && (T + lens[i1] <= cap || i1 == i0))
            T += lens[i1++];
        int rc = run_step(m, ids, lens, i0, i1, out, e);
        if (rc)
            return rc;
        i0 = i1;
    }
    return 0;
}
