/* stage.c — one pipeline stage: the layers [lo, hi) of a model on one backend, its KV cache
 * and activation buffers (stage.h; docs/sharding.md). Tensor-parallel stages (tp > 1) run
 * their ranks through engine/shard/tp.c. */
#include "engine/shard/stage.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/weights/gguf.h"
#include "engine/weights/hf_model.h"
#include "engine/weights/registry.h"
#include "engine/weights/synth.h"
#include "engine/shard/tp.h"

struct md_stage {
    md_stage_config c;
    void *synth; /* a synthetic model's image, or NULL */
    size_t synth_len;
    gguf_file *gf;
    md_hparams hp; /* the whole model's */
    /* tp <= 1: one backend; tp > 1: the ranks live in tp */
    md_backend *be;
    md_model *m;
    md_kv_bufs kv;
    md_fwd f;
    md_tp *tp;
    char desc[384];
};

/* A model name as the head gave it: a synthetic name, a path or a registry name. */
static int open_file(const char *model, int weights, void **synth, size_t *synth_len,
                     gguf_file **gf, md_err *e) {
    char path[4096];
    int rc = md_model_resolve(model, 1, path, sizeof path, e);
    return rc ? rc : md_model_open_any(path, weights, synth, synth_len, gf, e);
}

static void fnv(uint64_t *h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        *h ^= b[i];
        *h *= 0x100000001b3ULL;
    }
}

/* Metadata keys and types, the tensor directory, the file size and, for a file, the first
 * bytes of every tensor's data. */
static uint64_t hash_file(const gguf_file *gf, int data) {
    uint64_t h = 0xcbf29ce484222325ULL;
    size_t sz = gguf_file_size(gf);
    fnv(&h, &sz, sizeof sz);
    for (int64_t i = 0; i < gguf_n_kv(gf); i++) {
        const char *k = gguf_key_name(gf, i);
        int t = (int)gguf_kv_type(gf, i);
        fnv(&h, k, strlen(k));
        fnv(&h, &t, sizeof t);
    }
    for (int64_t i = 0; i < gguf_n_tensors(gf); i++) {
        const gguf_tensor *t = gguf_tensor_at(gf, i);
        fnv(&h, t->name, strlen(t->name));
        fnv(&h, &t->type, sizeof t->type);
        fnv(&h, t->ne, sizeof t->ne);
        fnv(&h, &t->n_bytes, sizeof t->n_bytes);
        if (data)
            fnv(&h, t->data, t->n_bytes < 64 ? t->n_bytes : 64);
    }
    return h;
}

uint64_t md_model_hash_gf(const gguf_file *gf, int synthetic) {
    return hash_file(gf, !synthetic);
}

int md_model_hash(const char *model, uint64_t *out, md_err *e) {
    void *synth = NULL;
    size_t synth_len = 0;
    gguf_file *gf = NULL;
    int rc = open_file(model, 0, &synth, &synth_len, &gf, e);
    if (rc == 0)
        *out = hash_file(gf, synth == NULL);
    gguf_close(gf);
    md_synth_free(synth, synth_len);
    return rc;
}

int md_model_shape_gf(const gguf_file *gf, const char *model, md_hparams *hp, md_err *e) {
    int rc = md_hparams_read(gf, hp, e);
    if (rc == 0 && hp->n_vocab == 0) {
        const gguf_tensor *te = gguf_find_tensor(gf, "token_embd.weight");
        if (!te || te->ne[1] < 1 || te->ne[1] > (1 << 24))
            rc = md_errf(e, MD_EFORMAT, "%s: no usable token_embd.weight", model);
        else
            hp->n_vocab = (int)te->ne[1];
    }
    return rc;
}

int md_model_shape(const char *model, md_hparams *hp, md_err *e) {
    void *synth = NULL;
    size_t synth_len = 0;
    gguf_file *gf = NULL;
    int rc = open_file(model, 0, &synth, &synth_len, &gf, e);
    if (rc == 0)
        rc = md_model_shape_gf(gf, model, hp, e);
    gguf_close(gf);
    md_synth_free(synth, synth_len);
    return rc;
}

/* Weight bytes of layers [lo, hi) (+ embedding / head) as the file stores them. */
static size_t range_weights(const gguf_file *gf, const md_hparams *hp, int lo, int hi) {
    int tied = gguf_find_tensor(gf, "output.weight") == NULL;
    size_t sum = 0;
    for (int64_t i = 0; i < gguf_n_tensors(gf); i++) {
        const gguf_tensor *t = gguf_tensor_at(gf, i);
        int l;
        if (sscanf(t->name, "blk.%d.", &l) == 1) {
            if (l >= lo && l < hi)
                sum += t->n_bytes;
        } else if (!strcmp(t->name, "token_embd.weight")) {
            if (lo == 0 || (tied && hi == hp->n_layer))
                sum += t->n_bytes;
        } else if (!strncmp(t->name, "output", 6)) {
            if (hi == hp->n_layer)
                sum += t->n_bytes;
        }
    }
    return sum;
}

int md_stage_kv_code(int md_type) {
    return md_type == MD_TYPE_F32 ? MD_STAGE_KV_F32 : md_type;
}

int md_stage_kv_type(int code, int backend_type) {
    return code == MD_STAGE_KV_F32       ? MD_TYPE_F32
           : code == MD_STAGE_KV_BACKEND ? backend_type
                                         : code;
}

/* K and V bytes of one slot of layers [lo, hi) in a cache of code kv_type (the backend's
 * counted as F16: no backend is open here). */
static size_t kv_slot_bytes(const md_hparams *hp, int lo, int hi, int kv_type) {
    return (size_t)(hi - lo) * 2 *
           md_type_row_bytes(md_stage_kv_type(kv_type, MD_TYPE_F16),
                             (int64_t)hp->n_head_kv * hp->head_dim);
}

int md_stage_bytes(const char *model, int lo, int hi, int kv_type, size_t *weights,
                   size_t *kv_per_slot, md_err *e) {
    void *synth = NULL;
    size_t synth_len = 0;
    gguf_file *gf = NULL;
    md_hparams hp;
    int rc = open_file(model, 0, &synth, &synth_len, &gf, e);
    if (rc == 0 && (rc = md_hparams_read(gf, &hp, e)) == 0) {
        if (lo < 0 || lo >= hi || hi > hp.n_layer)
            rc = md_errf(e, MD_EINVAL, "%s: layers %d-%d are not a range of its %d layers", model,
                         lo, hi - 1, hp.n_layer);
        else {
            *weights = range_weights(gf, &hp, lo, hi);
            *kv_per_slot = kv_slot_bytes(&hp, lo, hi, kv_type);
        }
    }
    gguf_close(gf);
    md_synth_free(synth, synth_len);
    return rc;
}

/* The activation buffers of one micro-batch (model.c md_fwd_alloc), host or device. */
static size_t activation_bytes(const md_hparams *hp, const md_stage_config *c) {
    size_t T = (size_t)c->max_tokens, C = (size_t)hp->n_embd;
    size_t qd = (size_t)hp->n_head * hp->head_dim, kvd = (size_t)hp->n_head_kv * hp->head_dim;
    size_t per_tok = C + (C > qd ? C : qd) + 2 * qd + 2 * kvd + 2 * (size_t)hp->n_ff;
    return (T * per_tok + (size_t)c->max_seqs * (C + (size_t)hp->n_vocab)) * sizeof(float);
}

/* The checks every stage makes before loading anything. */
static int check_config(md_stage *s, md_err *e) {
    const md_stage_config *c = &s->c;
    const md_hparams *hp = &s->hp;
    if (c->lo < 0 || c->lo >= c->hi || c->hi > hp->n_layer)
        return md_errf(e, MD_EINVAL, "layers %d-%d are not a range of the model's %d layers", c->lo,
                       c->hi - 1, hp->n_layer);
    if (c->n_slots < 1 || c->max_tokens < 1 || c->max_seqs < 1 || c->max_blocks < 1 ||
        c->block_tokens < 1 || c->n_ctx < 1 || c->n_ctx > hp->n_ctx_train ||
        (long long)c->max_blocks * c->block_tokens < c->n_ctx || c->n_slots % c->block_tokens ||
        c->max_tokens > (1 << 16) || c->max_seqs > 4096 || c->max_seqs > c->max_tokens ||
        c->n_slots > (1 << 28))
        return md_errf(e, MD_EINVAL,
                       "stage sizes are not usable: %d slots of blocks of %d tokens, %d tokens "
                       "and %d sequences per step, %d blocks per sequence, context %d (model %d)",
                       c->n_slots, c->block_tokens, c->max_tokens, c->max_seqs, c->max_blocks,
                       c->n_ctx, hp->n_ctx_train);
    if (c->tp > 1 && (hp->n_head % c->tp || hp->n_head_kv % c->tp || hp->n_ff % c->tp))
        return md_errf(e, MD_EINVAL,
                       "tensor parallelism over %d ranks needs the heads (%d), the KV heads (%d) "
                       "and the FFN width (%d) to divide by %d",
                       c->tp, hp->n_head, hp->n_head_kv, hp->n_ff, c->tp);
    if (c->tp > MD_TP_MAX)
        return md_errf(e, MD_EINVAL, "tensor parallelism over %d ranks: at most %d", c->tp,
                       MD_TP_MAX);
    if (c->mem_cap) {
        size_t w = range_weights(s->gf, hp, c->lo, c->hi);
        size_t kv = kv_slot_bytes(hp, c->lo, c->hi, c->kv_type) * (size_t)c->n_slots;
        size_t act = activation_bytes(hp, c);
        if (w + kv + act > c->mem_cap)
            return md_errf(e, MD_ENOMEM,
                           "layers %d-%d of %s need %.1f MiB (weights %.1f MiB + KV cache %.1f "
                           "MiB + activations %.1f MiB), over the stage's memory cap of %.1f MiB",
                           c->lo, c->hi - 1, c->model, (w + kv + act) / 1048576.0, w / 1048576.0,
                           kv / 1048576.0, act / 1048576.0, c->mem_cap / 1048576.0);
    }
    return 0;
}

/* Whether the backend's attention takes the model, before anything is loaded. */
static int check_heads(md_stage *s, md_err *e) {
    const md_backend_ops *bo = s->be->ops;
    int kt = md_stage_kv_type(s->c.kv_type, bo->kv_cache_type);
    if (!bo->check_attention)
        return 0;
    return bo->check_attention(s->be, s->hp.n_head, s->hp.n_head_kv, s->hp.head_dim, kt, e);
}

int md_stage_open(const md_stage_config *c, md_stage **out, md_err *e) {
    *out = NULL;
    md_stage *s = calloc(1, sizeof *s);
    if (!s)
        return md_errf(e, MD_ENOMEM, "out of memory");
    s->c = *c;
    s->c.model[sizeof s->c.model - 1] = 0;
    s->c.device[sizeof s->c.device - 1] = 0;
    int rc = open_file(s->c.model, 1, &s->synth, &s->synth_len, &s->gf, e);
    if (rc == 0)
        rc = md_hparams_read(s->gf, &s->hp, e);
    if (rc == 0 && s->hp.n_vocab == 0) {
        const gguf_tensor *te = gguf_find_tensor(s->gf, "token_embd.weight");
        s->hp.n_vocab = te && te->ne[1] > 0 && te->ne[1] < (1 << 24) ? (int)te->ne[1] : 0;
        if (!s->hp.n_vocab)
            rc = md_errf(e, MD_EFORMAT, "%s: no usable token_embd.weight", s->c.model);
    }
    if (rc == 0 && c->model_hash) {
        uint64_t h = hash_file(s->gf, s->synth == NULL);
        if (h != c->model_hash)
            rc = md_errf(e, MD_EINVAL,
                         "model %s here has hash %016llx, the head's has %016llx: not the same "
                         "model file",
                         s->c.model, (unsigned long long)h, (unsigned long long)c->model_hash);
    }
    if (rc == 0)
        rc = check_config(s, e);
    if (rc == 0 && s->c.tp > 1) {
        rc = md_tp_open(&s->c, s->gf, &s->tp, e);
    } else if (rc == 0) {
        if ((rc = md_backend_open(s->c.device[0] ? s->c.device : "cpu", s->c.n_threads, &s->be,
                                  e)) == 0 &&
            (rc = check_heads(s, e)) == 0 &&
            (rc = md_model_load_range(s->gf, s->be, s->c.lo, s->c.hi, &s->m, e)) == 0 &&
            (rc = md_kv_bufs_alloc_type(s->m, s->c.n_slots,
                                        md_stage_kv_type(s->c.kv_type, s->be->ops->kv_cache_type),
                                        &s->kv, e)) == 0 &&
            (rc = md_fwd_alloc(s->m, s->c.max_tokens, s->c.max_seqs, &s->f, e)) == 0) {
            const md_hparams *hp = &s->hp;
            int cols = hp->n_ff > hp->n_embd ? hp->n_ff : hp->n_embd;
            md_reserve r = {.max_tokens = s->c.max_tokens,
                            .max_seqs = s->c.max_seqs,
                            .max_cols =
                                cols > hp->n_head * hp->head_dim ? cols : hp->n_head * hp->head_dim,
                            .max_ctx = s->c.n_ctx,
                            .max_blocks = s->c.max_blocks,
                            .n_heads = hp->n_head};
            rc = s->be->ops->reserve(s->be, &r, e);
        }
    }
    if (rc) {
        md_errctx(e, "stage %s layers %d-%d: ", s->c.model, c->lo, c->hi - 1);
        md_stage_close(s);
        return rc;
    }
    if (s->tp)
        snprintf(s->desc, sizeof s->desc, "layers %d-%d on %s", c->lo, c->hi - 1,
                 md_tp_describe(s->tp));
    else
        snprintf(s->desc, sizeof s->desc, "layers %d-%d on %s", c->lo, c->hi - 1,
                 s->be->ops->describe(s->be));
    *out = s;
    return 0;
}

void md_stage_close(md_stage *s) {
    if (!s)
        return;
    md_tp_close(s->tp);
    if (s->m) {
        md_fwd_free(s->m, &s->f);
        md_kv_bufs_free(s->m, &s->kv);
        md_model_free(s->m);
    }
    md_backend_free(s->be);
    gguf_close(s->gf);
    md_synth_free(s->synth, s->synth_len);
    free(s);
}

const md_hparams *md_stage_hparams(const md_stage *s) {
    return &s->hp;
}

const md_stage_config *md_stage_get_config(const md_stage *s) {
    return &s->c;
}

const char *md_stage_describe(md_stage *s) {
    return s->desc;
}

size_t md_stage_out_floats(const md_stage *s, const md_batch *b) {
    if (s->c.hi < s->hp.n_layer)
        return (size_t)b->n_tokens * s->hp.n_embd;
    return (size_t)b->n_logits * (b->argmax_only ? 1 : (size_t)s->hp.n_vocab);
}

int md_stage_run(md_stage *s, const md_batch *b, const float *in, float *out, md_err *e) {
    int rc = s->tp ? md_tp_run(s->tp, b, in, out, e)
                   : md_model_forward_stage(s->m, &s->f, &s->kv, b, in, out, e);
    if (rc)
        md_errctx(e, "layers %d-%d: ", s->c.lo, s->c.hi - 1);
    return rc;
}

int md_batch_check(const md_batch *b, const md_stage_config *c, int n_vocab, md_err *e) {
    int T = b->n_tokens, S = b->n_seqs, L = b->n_logits;
    if (T < 1 || T > c->max_tokens || S < 1 || S > c->max_seqs || S > T || L < 0 || L > S)
        return md_errf(e, MD_EINVAL,
                       "step of %d tokens, %d sequences, %d logit rows: the stage takes 1-%d "
                       "tokens, 1-%d sequences, at most one logit row per sequence",
                       T, S, L, c->max_tokens, c->max_seqs);
    if (b->max_blocks != c->max_blocks || b->block_tokens != c->block_tokens)
        return md_errf(e, MD_EINVAL,
                       "step with block tables of %d blocks of %d tokens; the stage was opened "
                       "for %d of %d",
                       b->max_blocks, b->block_tokens, c->max_blocks, c->block_tokens);
    int n_blocks = c->n_slots / c->block_tokens;
    for (int s = 0; s < S; s++) {
        int len = b->seq_len[s];
        if (len < 1 || len > c->n_ctx)
            return md_errf(e, MD_EINVAL, "sequence %d has length %d, outside 1-%d", s, len,
                           c->n_ctx);
        int nb = (len + c->block_tokens - 1) / c->block_tokens;
        for (int i = 0; i < nb; i++) {
            int32_t blk = b->block_table[(size_t)s * c->max_blocks + i];
            if (blk < 0 || blk >= n_blocks)
                return md_errf(e, MD_EINVAL, "sequence %d block %d is %d, outside 0-%d", s, i,
                               (int)blk, n_blocks - 1);
        }
    }
    int prev = 0;
    for (int t = 0; t < T; t++) {
        int s = b->tok_seq[t];
        if (b->tokens[t] < 0 || b->tokens[t] >= n_vocab)
            return md_errf(e, MD_EINVAL, "token %d is %d, outside the vocabulary of %d", t,
                           (int)b->tokens[t], n_vocab);
        if (s < prev || s > prev + 1 || s >= S || (t == 0 && s != 0))
            return md_errf(e, MD_EINVAL,
                           "token %d belongs to sequence %d: sequences must be contiguous and "
                           "in order, 0-%d",
                           t, s, S - 1);
        prev = s;
        if (b->tok_pos[t] < 0 || b->tok_pos[t] >= b->seq_len[s])
            return md_errf(e, MD_EINVAL, "token %d at position %d, sequence %d has length %d", t,
                           (int)b->tok_pos[t], s, (int)b->seq_len[s]);
        if (t > 0 && b->tok_seq[t - 1] == s && b->tok_pos[t] != b->tok_pos[t - 1] + 1)
            return md_errf(e, MD_EINVAL, "token %d of sequence %d: positions must follow", t, s);
        if (b->slot[t] < 0 || b->slot[t] >= c->n_slots)
            return md_errf(e, MD_EINVAL, "token %d writes slot %d, outside 0-%d", t,
                           (int)b->slot[t], c->n_slots - 1);
        /* its own block's slot for its position, never another sequence's */
        int pos = b->tok_pos[t], bt = c->block_tokens;
        int32_t want = b->block_table[(size_t)s * c->max_blocks + pos / bt] * bt + pos % bt;
        if (b->slot[t] != want)
            return md_errf(e, MD_EINVAL,
                           "token %d (sequence %d, position %d) writes slot %d; its block table "
                           "puts that position in slot %d",
                           t, s, pos, (int)b->slot[t], (int)want);
    }
    if (prev != S - 1)
        return md_errf(e, MD_EINVAL, "the step names %d sequences, its tokens %d", S, prev + 1);
    for (int i = 0; i < L; i++)
        if (b->logit_rows[i] < 0 || b->logit_rows[i] >= T ||
            (i > 0 && b->logit_rows[i] <= b->logit_rows[i - 1]))
            return md_errf(e, MD_EINVAL, "logit row %d is %d: rows must rise within 0-%d", i,
                           (int)b->logit_rows[i], T - 1);
    return 0;
}
