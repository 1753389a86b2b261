/* step_plan.c — checking a step's metadata and sorting its tokens into decode entries and
 * prefill tiles (see step_plan.h). */
#include "kernels/cuda/step_plan.h"

int cuda_plan_step(const md_batch *b, int32_t *dec, int32_t *tiles, cuda_step_plan *out,
                   md_err *e) {
    int T = b->n_tokens, S = b->n_seqs;
    out->n_dec = out->n_tiles = out->max_dec_len = out->max_len = 0;
    out->max_block = -1;
    for (int t = 0; t < T;) {
        int s = b->tok_seq[t];
        if (s < 0 || s >= S)
            return md_errf(e, MD_ERANGE, "cuda backend: token %d belongs to sequence %d of %d", t,
                           s, S);
        int run = 1;
        while (t + run < T && b->tok_seq[t + run] == s)
            run++;
        for (int i = t; i < t + run; i++) {
            int p = b->tok_pos[i];
            if (p < 0 || p >= b->max_blocks * b->block_tokens || b->slot[i] < 0 ||
                (i > t && p != b->tok_pos[i - 1] + 1))
                return md_errf(e, MD_ERANGE,
                               "cuda backend: token %d at position %d (slot %d) does not fit %d "
                               "blocks of %d tokens in order",
                               i, p, b->slot[i], b->max_blocks, b->block_tokens);
        }
        int last = b->tok_pos[t + run - 1];
        if (last + 1 > out->max_len)
            out->max_len = last + 1;
        for (int k = 0; k <= last / b->block_tokens; k++) {
            int32_t id = b->block_table[(int64_t)s * b->max_blocks + k];
            if (id < 0)
                return md_errf(e, MD_ERANGE,
                               "cuda backend: sequence %d has no block %d for position %d", s, k,
                               last);
            if (id > out->max_block)
                out->max_block = id;
        }
        if (run == 1) {
            int32_t *d = dec + 3 * out->n_dec++;
            d[0] = t;
            d[1] = s;
            d[2] = b->tok_pos[t] + 1;
            if (d[2] > out->max_dec_len)
                out->max_dec_len = d[2];
        } else {
            for (int i = 0; i < run; i += CUDA_PLAN_TILE_Q) {
                int32_t *ti = tiles + 4 * out->n_tiles++;
                ti[0] = s;
                ti[1] = t + i;
                ti[2] = run - i < CUDA_PLAN_TILE_Q ? run - i : CUDA_PLAN_TILE_Q;
                ti[3] = b->tok_pos[t + i];
            }
        }
        t += run;
    }
    for (int i = 0; i < b->n_logits; i++)
        if (b->logit_rows[i] < 0 || b->logit_rows[i] >= T)
            return md_errf(e, MD_ERANGE, "cuda backend: logit row %d outside the step's %d tokens",
                           b->logit_rows[i], T);
    return 0;
}

int cuda_plan_enc_step(const md_batch *b, int tile_q, int32_t *tiles, int *n_tiles, int *max_run,
                       md_err *e) {
    int T = b->n_tokens, S = b->n_seqs, runs = 0;
    *n_tiles = *max_run = 0;
    if (tile_q < CUDA_PLAN_TILE_Q)
        return md_errf(e, MD_EINVAL, "cuda backend: encoder tiles of %d queries", tile_q);
    for (int t = 0, hi; t < T; t = hi) {
        int s = b->tok_seq[t];
        if (s < 0 || s >= S)
            return md_errf(e, MD_ERANGE, "cuda backend: token %d belongs to sequence %d of %d", t,
                           s, S);
        if (++runs > S)
            return md_errf(e, MD_ERANGE,
                           "cuda backend: token %d starts a %dth run of sequences in a step of %d "
                           "(a sequence's tokens must be contiguous)",
                           t, runs, S);
        for (hi = t + 1; hi < T && b->tok_seq[hi] == s; hi++)
            ;
        if (hi - t > *max_run)
            *max_run = hi - t;
        for (int q = t; q < hi; q += tile_q) {
            int32_t *ti = tiles + 4 * (*n_tiles)++;
            ti[0] = t;
            ti[1] = hi - t;
            ti[2] = q;
            ti[3] = hi - q < tile_q ? hi - q : tile_q;
        }
    }
    return 0;
}
