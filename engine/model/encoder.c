/* encoder.c — the forward pass of an encoder (encoder.h): one step of whole sequences packed
 * end to end, attention block-diagonal over them (no padding), post-LayerNorm blocks. */
#include "engine/model/encoder.h"

#include <math.h>

#define OP(m, op, ...) (m)->be->ops->op((m)->be, __VA_ARGS__)

/* y [T, w->ne1] = x · wᵀ + b */
static int linear(md_encoder *m, const md_tensor *w, const md_tensor *b, const md_buf *x, md_buf *y,
                  int T, md_err *e) {
    int rc = OP(m, matmul, w, x, y, T, e);
    return rc ? rc : OP(m, add_bias, y, b, T, e);
}

/* y [T, ·] = epi(x · wᵀ + b) by the backend's prepared product (lin), else matmul and the ops
 * after it. */
static int lin(md_encoder *m, const md_lin *l, const md_tensor *w, const md_tensor *b,
               const md_buf *x, md_buf *y, int T, int epi, md_err *e) {
    if (l)
        return OP(m, lin, l, x, y, T, epi, e);
    if (epi != MD_LIN_ADD) {
        int rc = linear(m, w, b, x, y, T, e);
        return rc || epi != MD_LIN_GELU ? rc : OP(m, gelu_erf, y, (int64_t)T * w->ne1, e);
    }
    int rc = linear(m, w, b, x, m->xb, T, e);
    return rc ? rc : OP(m, add, y, m->xb, (int64_t)T * w->ne1, e);
}

static int layer(md_encoder *m, const md_enc_layer *L, int T, float scale, md_err *e) {
    const md_enc_hparams *hp = &m->hp;
    int C = hp->n_embd, rc;
    /* attention: x [T, C] = LN(x + Wo · attn(Wq x + bq, Wk x + bk, Wv x + bv) + bo) */
    if ((rc = lin(m, L->lq, &L->wq, &L->bq, m->x, m->q, T, MD_LIN_SET, e)) ||
        (rc = lin(m, L->lk, &L->wk, &L->bk, m->x, m->k, T, MD_LIN_SET, e)) ||
        (rc = lin(m, L->lv, &L->wv, &L->bv, m->x, m->v, T, MD_LIN_SET, e)) ||
        (rc = OP(m, attention_enc, m->q, m->k, m->v, m->att, hp->n_head, hp->head_dim, scale, e)) ||
        (rc = lin(m, L->lo, &L->wo, &L->bo, m->att, m->x, T, MD_LIN_ADD, e)) ||
        (rc = OP(m, layernorm, m->x, &L->attn_norm_w, &L->attn_norm_b, m->x, T, C, hp->eps, e)))
        return rc;
    /* feed-forward: x = LN(x + W2 · gelu(W1 x + b1) + b2), hb [T, F] */
    if ((rc = lin(m, L->l_up, &L->w_up, &L->b_up, m->x, m->hb, T, MD_LIN_GELU, e)) ||
        (rc = lin(m, L->l_down, &L->w_down, &L->b_down, m->hb, m->x, T, MD_LIN_ADD, e)))
        return rc;
    return OP(m, layernorm, m->x, &L->out_norm_w, &L->out_norm_b, m->x, T, C, hp->eps, e);
}

/* The layers of one packed step, leaving the last hidden states in m->x [T, C]. */
static int forward(md_encoder *m, const md_batch *b, md_err *e) {
    const md_enc_hparams *hp = &m->hp;
    int T = b->n_tokens, C = hp->n_embd, rc;
    if (T < 1 || T > m->max_tokens)
        return md_errf(e, MD_ERANGE, "encoder step of %d tokens (1..%d)", T, m->max_tokens);
    for (int t = 0; t < T; t++)
        if (b->tok_pos[t] < 0 || b->tok_pos[t] >= hp->n_ctx)
            return md_errf(e, MD_ERANGE, "position %d: sequences of %s are at most %d tokens",
                           b->tok_pos[t], hp->arch, hp->n_ctx);
    if ((rc = OP(m, batch_prepare, b, e)))
        return rc;
    /* x [T, C] = LN(word[tok] + position[pos + offset] + type[0]) */
    if ((rc = OP(m, embed, &m->tok_embd, m->x, e)) ||
        (rc = OP(m, embed_add, &m->pos_embd, hp->pos_offset, m->x, e)) ||
        (m->type0.buf && (rc = OP(m, add_bias, m->x, &m->type0, T, e))) ||
        (rc = OP(m, layernorm, m->x, &m->embd_norm_w, &m->embd_norm_b, m->x, T, C, hp->eps, e)))
        return rc;
    float scale = 1.0f / sqrtf((float)hp->head_dim);
    for (int l = 0; l < hp->n_layer; l++)
        if ((rc = layer(m, &m->layers[l], T, scale, e)))
            return rc;
    return 0;
}

int md_encoder_forward(md_encoder *m, const md_batch *b, float *hidden, md_err *e) {
    int rc = forward(m, b, e);
    return rc ? rc
              : OP(m, buf_download, m->x, 0, hidden,
                   (size_t)b->n_tokens * m->hp.n_embd * sizeof(float), e);
}

int md_encoder_forward_pooled(md_encoder *m, const md_batch *b, int mode, int normalize, float *out,
                              md_err *e) {
    if (!m->be->ops->pool_enc)
        return md_errf(e, MD_EUNSUPP, "the %s backend has no pool_enc op", m->be->ops->name);
    int rc = forward(m, b, e); /* the pooled rows go to xb: n_seqs <= T rows */
    if (rc || (rc = OP(m, pool_enc, m->x, m->xb, m->hp.n_embd, mode, normalize, e)))
        return rc;
    return OP(m, buf_download, m->xb, 0, out, (size_t)b->n_seqs * m->hp.n_embd * sizeof(float), e);
}
