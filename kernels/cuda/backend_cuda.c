/* backend_cuda.c — the CUDA implementation of kernels/backend.h on top of cuda_ops.h.
 *
 * Buffers are device memory from the ctx's pool. Weights (buf_wrap) are copied to the
 * device once, as they are in the file: F16/BF16 stay 16-bit, quantized types stay
 * quantized and are decoded inside the GEMV kernels (decode) or, for cuBLAS (prefill, big
 * batches), read from their BF16 copy when the engine asked for one (weight_shadow: a table
 * from the weight's device address to the copy, emptied by buf_free of the weight's buffer)
 * and otherwise expanded to BF16 scratch, so a Q4 model needs Q4 memory unless it is given
 * the copies. Activations are F32.
 *
 * batch_prepare() copies the step's metadata to the device in one transfer (from pinned
 * staging) and sorts the tokens for attention on the host: a sequence contributing one
 * token is a decode entry (split-KV kernel), longer runs become tiles of up to
 * CUDA_ATTN_TILE_Q queries (tiled prefill kernel). Every index the device will follow
 * (token ids, slots, block ids) is checked on the host first, so a bad batch is an error,
 * not a wild read. A CUDA error is sticky: every later op of this backend returns it.
 *
 * Decode steps run as CUDA graphs (backend.h step_begin/step_end): a step whose every
 * sequence contributes one token is keyed by (rows, attention split bucket) — everything its
 * launches take from the host; the metadata they read is uploaded by batch_prepare to fixed
 * addresses. Such a step runs padded to cuda_gc_pad_rows(n) rows from step_begin on (graphs
 * or not, so both compute the same): a padding row embeds the first token at position 0,
 * stores no K/V (slot -1, which the KV kernels skip), attends to the first key of the first
 * sequence and yields a logit row nobody reads; the ops take the engine's n rows as the
 * padded count. So a batch that shrinks by one sequence at a time replays a few graphs, not
 * one per size. A key's second step is captured and
 * launched, later ones replay it: the ops check their arguments and queue nothing, and
 * step_end launches the graph. A failed capture (an allocation it needed, say) is dropped
 * and the step runs directly (MD_STEP_RERUN). MEDLEY_CUDA_GRAPHS=0 turns graphs off.
 *
 * The collectives (comm_*, all_reduce, send, recv) are nccl.c's, on the ctx's stream, when the
 * build has NCCL (MEDLEY_HAVE_NCCL); a backend that joined a communicator runs its steps
 * without graphs (backend.h comm_init says why).
 *
 * Ownership: md_backend_cuda_open gives a backend freed by md_backend_free (which frees the
 * pool and with it every buffer still live). */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "kernels/backend.h"
#include "kernels/cuda/backend_cuda.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/graph_cache.h"
#include "kernels/cuda/step_plan.h"

#define GIB (1024.0 * 1024.0 * 1024.0)
_Static_assert(CUDA_PLAN_TILE_Q == CUDA_ATTN_TILE_Q, "step_plan.h and cuda_ops.h tile sizes");
#define DEC_MAX_SPLITS 32

struct md_buf {
    void *p;
    size_t n;
};

/* The BF16 copy of one quantized weight (weight_shadow), found by the weight's device address. */
typedef struct {
    const void *w; /* tensor_ptr of the weight */
    int type;      /* and what was expanded from there (a lookup must match both) */
    int64_t n;     /* elements, ne0 * ne1 */
    void *bf16;    /* pool memory, [ne1][ne0] BF16 */
} shadow;

typedef struct {
    md_backend base;
    cuda_ctx *c;
    md_reserve r;
    int reserved;
    /* Step metadata: one device arena and its pinned host staging, same layout. */
    int32_t *d_meta, *h_meta;
    size_t meta_n;           /* int32 elements */
    cudaEvent_t meta_copied; /* staging may be rewritten once this fired */
    int32_t *d_tokens, *d_pos, *d_slot, *d_bt, *d_logit_rows, *d_dec, *d_tiles;
    int32_t *h_tokens, *h_pos, *h_slot, *h_bt, *h_logit_rows, *h_dec, *h_tiles;
    int n_tokens, n_seqs, max_blocks, block_tokens, n_logits, n_dec, n_tiles;
    /* a decode step of t_real tokens runs as t_pad rows (the padding rows' metadata written
     * by batch_prepare) once step_begin set `padding`; t_pad == t_real: not padded */
    int t_real, t_pad, padding;
    /* Row stride of the device block table this step: the blocks of the longest length any
     * token reads, rounded as cuda_gc_len_bucket rounds it (so a decode graph's key fixes
     * it), at most the reserved width. Only the rows' used prefixes cross the bus. */
    int bt_stride;
    int max_dec_len;      /* longest KV length among decode entries */
    int64_t max_block_id; /* largest block id any token of the step reads */
    /* an encoder step (batch_prepare of a step without KV blocks): its attention tiles, in
     * the tiles area of the metadata (cuda_plan_enc_step), and its longest sequence */
    int enc_step, n_enc_tiles, enc_max_run;
    int n_enc_runs; /* its sequences, {first row, rows} each in the dec area (pool_enc) */
    void *att_work;
    size_t att_work_n;
    /* [max_seqs] greedy picks and sampled tokens, then [max_seqs] their logprobs, then
     * [max_seqs, CUDA_SAMPLE_TOP] top tokens and [max_seqs, CUDA_SAMPLE_TOP] their logprobs */
    int32_t *d_argmax;
    cuda_sample_params *d_sparams, *h_sparams; /* [max_seqs] sample op parameters */
    /* the sample op's penalty entries (pinned staging, device copy followed by one raw
     * logit per entry), grown to the largest call */
    cuda_sample_pen *h_pen, *d_pen;
    size_t cap_pen;
    /* the sample op's constraints (pinned staging, device copy): the constrained rows' masks
     * packed, then the bias entries; grown to the largest call */
    uint8_t *h_con, *d_con;
    size_t cap_con;
    int n_sm;
    /* decode-step graphs */
    int graphs_on;      /* MEDLEY_CUDA_GRAPHS != "0" */
    int graphable;      /* this step may be a graph (set by batch_prepare) */
    cuda_gc_key key;    /* its key */
    int dec_len_bucket; /* cuda_gc_len_bucket(max_dec_len): the split count's input */
    enum { ST_IDLE, ST_EAGER, ST_RECORD, ST_REPLAY } st;
    void *replay_graph; /* the graph step_end launches in ST_REPLAY */
    cuda_graph_cache gc;
    shadow *sh; /* sorted by w; n_sh used of cap_sh */
    size_t n_sh, cap_sh;
    md_backend_ops ops; /* cuda_backend_ops, or cuda-exact's variant of them */
    int exact;          /* cuda-exact: F32 weights (the engine dequantizes them) and KV cache */
    char desc[384];
} cuda_backend;

static cuda_backend *cbe(md_backend *be) {
    return (cuda_backend *)be;
}

static cuda_dtype cache_dtype(int t) {
    return t == MD_TYPE_F16 ? CUDA_F16 : t == MD_TYPE_BF16 ? CUDA_BF16 : CUDA_F32;
}

static int cache_type_ok(int t, md_err *e) {
    if (t != MD_TYPE_F32 && t != MD_TYPE_F16 && t != MD_TYPE_BF16)
        return md_errf(e, MD_EUNSUPP,
                       "cuda backend: KV cache type %d not supported (F32, F16, BF16)", t);
    return 0;
}

static size_t cache_elem(int t) {
    return t == MD_TYPE_F32 ? 4 : 2;
}

static md_cuda_graph_totals g_totals; /* md_cuda_graph_get_totals; one engine thread each */

void md_cuda_graph_get_totals(md_cuda_graph_totals *out) {
    *out = g_totals;
}

static void free_graph(void *g) {
    cuda_graph_free((cuda_graph *)g);
}

static void be_free(md_backend *be) {
    cuda_backend *b = cbe(be);
    if (b->c && b->st == ST_RECORD)
        cuda_graph_abort(b->c);
    if (b->c)
        cuda_sync(b->c, NULL);
    if (b->gc.recorded)
        MD_INFO("cuda",
                "cuda:%d: decode steps as CUDA graphs: %ld recorded, %ld replayed, %ld "
                "evicted, %ld dropped after scratch moved",
                b->c ? cuda_ctx_ordinal(b->c) : -1, b->gc.recorded, b->gc.replayed, b->gc.evicted,
                b->gc.dropped);
    cuda_gc_clear(&b->gc);
    free(b->sh); /* the copies themselves go with the pool */
    if (b->h_meta)
        cudaFreeHost(b->h_meta);
    if (b->h_sparams)
        cudaFreeHost(b->h_sparams);
    if (b->h_pen)
        cudaFreeHost(b->h_pen);
    if (b->h_con)
        cudaFreeHost(b->h_con);
    if (b->meta_copied)
        cudaEventDestroy(b->meta_copied);
    cuda_ctx_close(b->c); /* frees the pool: d_meta, att_work and any live buffer */
    free(b);
}

static const char *be_describe(md_backend *be) {
    cuda_backend *b = cbe(be);
    cuda_device_info in;
    md_err e;
    if (cuda_device_query(cuda_ctx_ordinal(b->c), &in, &e))
        snprintf(b->desc, sizeof b->desc, "cuda:%d: %s", cuda_ctx_ordinal(b->c), e.msg);
    else
        snprintf(b->desc, sizeof b->desc, "%s:%d: %s, sm_%d%d, %d SMs, %.1f GiB (%.1f free)%s",
                 b->exact ? "cuda-exact" : "cuda", in.ordinal, in.name, in.cc_major, in.cc_minor,
                 in.n_sm, in.total_bytes / GIB, in.free_bytes / GIB,
                 b->exact ? ", F32 weights and KV cache" : "");
    return b->desc;
}

static int be_buf_alloc(md_backend *be, size_t bytes, md_buf **out, md_err *e) {
    cuda_backend *b = cbe(be);
    md_buf *m = calloc(1, sizeof *m);
    if (!m)
        return md_errf(e, MD_ENOMEM, "cuda backend: out of host memory");
    int rc = cuda_pool_alloc(b->c, bytes, &m->p, e);
    if (rc) {
        free(m);
        return rc;
    }
    m->n = bytes;
    *out = m;
    return 0;
}

static int be_buf_wrap(md_backend *be, const void *host, size_t bytes, md_buf **out, md_err *e) {
    cuda_backend *b = cbe(be);
    int rc = cuda_check_fits(b->c, bytes, "model weights", e);
    if (rc)
        return rc;
    if ((rc = be_buf_alloc(be, bytes, out, e)))
        return rc;
    if ((rc = cuda_upload(b->c, (*out)->p, host, bytes, e))) {
        cuda_pool_free(b->c, (*out)->p);
        free(*out);
        *out = NULL;
    }
    return rc;
}

/* Index of the first shadow whose weight address is >= p. */
static size_t shadow_at(const cuda_backend *b, const void *p) {
    size_t lo = 0, hi = b->n_sh;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if ((const char *)b->sh[mid].w < (const char *)p)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The BF16 copy of weight w, or NULL. */
static const void *shadow_of(const cuda_backend *b, const md_tensor *w) {
    const void *p = (const char *)w->buf->p + w->offset;
    size_t i = shadow_at(b, p);
    if (i < b->n_sh && b->sh[i].w == p && b->sh[i].type == w->type && b->sh[i].n == w->ne0 * w->ne1)
        return b->sh[i].bf16;
    return NULL;
}

/* Freeing a buffer drops the copies of the weights inside it, so a later buffer at the same
 * address never multiplies by a stale copy; graphs recorded with them are dropped too. */
static void be_buf_free(md_backend *be, md_buf *m) {
    if (!m)
        return;
    cuda_backend *b = cbe(be);
    size_t lo = shadow_at(b, m->p), hi = lo;
    while (hi < b->n_sh && (const char *)b->sh[hi].w < (const char *)m->p + m->n)
        cuda_pool_free(b->c, b->sh[hi++].bf16);
    if (hi > lo) {
        memmove(b->sh + lo, b->sh + hi, (b->n_sh - hi) * sizeof *b->sh);
        b->n_sh -= hi - lo;
        cuda_ctx_scratch_moved(b->c);
    }
    cuda_pool_free(b->c, m->p);
    free(m);
}

/* Operations that wait for the device or move data may not sit inside a recorded step. */
static int outside_step(cuda_backend *b, const char *what, md_err *e) {
    if (b->st == ST_RECORD || b->st == ST_REPLAY)
        return md_errf(e, MD_EINVAL, "cuda backend: %s inside a recorded step", what);
    return 0;
}

static int range_ok(const md_buf *m, size_t off, size_t n, md_err *e) {
    if (off > m->n || n > m->n - off)
        return md_errf(e, MD_ERANGE,
                       "cuda backend: %zu bytes at offset %zu outside a %zu-byte "
                       "buffer",
                       n, off, m->n);
    return 0;
}

static int be_buf_upload(md_backend *be, md_buf *dst, size_t off, const void *src, size_t n,
                         md_err *e) {
    int rc = outside_step(cbe(be), "buf_upload", e);
    if (!rc)
        rc = range_ok(dst, off, n, e);
    return rc ? rc : cuda_upload(cbe(be)->c, (char *)dst->p + off, src, n, e);
}

static int be_buf_download(md_backend *be, const md_buf *src, size_t off, void *dst, size_t n,
                           md_err *e) {
    int rc = outside_step(cbe(be), "buf_download", e);
    if (!rc)
        rc = range_ok(src, off, n, e);
    return rc ? rc : cuda_download(cbe(be)->c, dst, (const char *)src->p + off, n, e);
}

static int be_buf_zero(md_backend *be, md_buf *m, size_t off, size_t n, md_err *e) {
    int rc = outside_step(cbe(be), "buf_zero", e);
    if (!rc)
        rc = range_ok(m, off, n, e);
    return rc ? rc : cuda_memset0(cbe(be)->c, (char *)m->p + off, n, e);
}

/* Metadata arena layout (int32): tokens, pos, slot, logit rows [T each], dec [3T],
 * tiles [4 (T + S)], block table [S * max_blocks]. */
static void meta_layout(int32_t *base, const md_reserve *r, int32_t **tok, int32_t **pos,
                        int32_t **slot, int32_t **lr, int32_t **dec, int32_t **tiles,
                        int32_t **bt) {
    size_t T = (size_t)r->max_tokens, S = (size_t)r->max_seqs;
    *tok = base;
    *pos = base + T;
    *slot = base + 2 * T;
    *lr = base + 3 * T;
    *dec = base + 4 * T;
    *tiles = base + 7 * T;
    *bt = base + 7 * T + 4 * (T + S);
}

static int be_reserve(md_backend *be, const md_reserve *r, md_err *e) {
    cuda_backend *b = cbe(be);
    /* an encoder's reserve has no blocks (no KV cache) and names its attention's head size */
    if (r->max_tokens < 1 || r->max_seqs < 1 || r->max_blocks < 0 ||
        (r->max_blocks == 0 && r->enc_head_dim < 1) || r->n_heads < 1)
        return md_errf(e, MD_EINVAL,
                       "cuda backend: reserve of %d tokens, %d sequences, %d "
                       "blocks, %d heads",
                       r->max_tokens, r->max_seqs, r->max_blocks, r->n_heads);
    if (r->enc_head_dim > CUDA_ENC_MAX_HEAD_DIM)
        return md_errf(e, MD_EUNSUPP,
                       "cuda backend: encoder attention of head dimension %d (the kernel takes "
                       "at most %d)",
                       r->enc_head_dim, CUDA_ENC_MAX_HEAD_DIM);
    size_t n = 7 * (size_t)r->max_tokens + 4 * ((size_t)r->max_tokens + r->max_seqs) +
               (size_t)r->max_seqs * r->max_blocks;
    int32_t *h = NULL, *d = NULL;
    cudaError_t err = cudaMallocHost((void **)&h, n * sizeof(int32_t));
    if (err != cudaSuccess) {
        cudaGetLastError();
        return md_errf(e, MD_ENOMEM,
                       "cuda backend: cannot pin %zu bytes of host memory for "
                       "step metadata: %s",
                       n * sizeof(int32_t), cudaGetErrorString(err));
    }
    int32_t *am = NULL;
    cuda_sample_params *sp = NULL, *hsp = NULL;
    size_t sp_bytes = (size_t)r->max_seqs * sizeof(cuda_sample_params);
    int rc = cuda_pool_alloc(b->c, n * sizeof(int32_t), (void **)&d, e);
    if (rc == 0 && (rc = cuda_pool_alloc(
                        b->c, (2 + 2 * CUDA_SAMPLE_TOP) * (size_t)r->max_seqs * sizeof(int32_t),
                        (void **)&am, e)))
        cuda_pool_free(b->c, d);
    if (rc == 0 && (rc = cuda_pool_alloc(b->c, sp_bytes, (void **)&sp, e))) {
        cuda_pool_free(b->c, d);
        cuda_pool_free(b->c, am);
    }
    if (rc == 0 && cudaMallocHost((void **)&hsp, sp_bytes) != cudaSuccess) {
        cudaGetLastError();
        cuda_pool_free(b->c, d);
        cuda_pool_free(b->c, am);
        cuda_pool_free(b->c, sp);
        rc = md_errf(e, MD_ENOMEM, "cuda backend: cannot pin %zu bytes for sampling parameters",
                     sp_bytes);
    }
    if (rc) {
        cudaFreeHost(h);
        return rc;
    }
    if (b->h_meta) {
        cuda_sync(b->c, NULL);
        cudaFreeHost(b->h_meta);
    }
    cuda_pool_free(b->c, b->d_meta);
    cuda_pool_free(b->c, b->d_argmax);
    cuda_pool_free(b->c, b->d_sparams);
    if (b->h_sparams)
        cudaFreeHost(b->h_sparams);
    b->d_argmax = am;
    b->d_sparams = sp;
    b->h_sparams = hsp;
    b->h_meta = h;
    b->d_meta = d;
    b->meta_n = n;
    b->r = *r;
    meta_layout(d, r, &b->d_tokens, &b->d_pos, &b->d_slot, &b->d_logit_rows, &b->d_dec, &b->d_tiles,
                &b->d_bt);
    meta_layout(h, r, &b->h_tokens, &b->h_pos, &b->h_slot, &b->h_logit_rows, &b->h_dec, &b->h_tiles,
                &b->h_bt);
    b->reserved = 1;
    cuda_ctx_scratch_moved(b->c); /* graphs recorded before read the old metadata arena */
    return 0;
}

/* Wait until the previous step's metadata left the staging area (0), or the sticky error. */
static int staging_free(cuda_backend *b, md_err *e) {
    md_err ce;
    if (cudaEventSynchronize(b->meta_copied) != cudaSuccess) {
        cudaGetLastError();
        if (cuda_ctx_failed(b->c, &ce)) {
            if (e)
                *e = ce;
            return ce.code;
        }
    }
    return 0;
}

/* An encoder step (max_blocks 0: no KV cache, backend.h attention_enc): token ids, positions
 * and the attention tiles of its packed sequences go up; nothing of the KV path is used. */
static int enc_batch_prepare(cuda_backend *b, const md_batch *bt, md_err *e) {
    int T = bt->n_tokens, S = bt->n_seqs, n_tiles = 0, max_run = 0;
    if (b->r.enc_head_dim < 1)
        return md_errf(e, MD_EINVAL,
                       "cuda backend: a step without KV blocks on a backend not reserved for an "
                       "encoder");
    if (T < 1 || T > b->r.max_tokens || S < 1 || S > b->r.max_seqs)
        return md_errf(e, MD_ERANGE,
                       "cuda backend: encoder step of %d tokens / %d sequences exceeds the "
                       "reserved %d / %d",
                       T, S, b->r.max_tokens, b->r.max_seqs);
    int rc = staging_free(b, e);
    if (rc || (rc = cuda_plan_enc_step(bt, CUDA_ENC_TILE_Q, b->h_tiles, &n_tiles, &max_run, e)))
        return rc;
    memcpy(b->h_tokens, bt->tokens, (size_t)T * 4);
    memcpy(b->h_pos, bt->tok_pos, (size_t)T * 4);
    int runs = 0; /* a sequence's first tile starts at its first row; 2 runs <= 2 T: the dec area */
    for (int i = 0; i < n_tiles; i++)
        if (b->h_tiles[4 * i + 2] == b->h_tiles[4 * i]) {
            b->h_dec[2 * runs] = b->h_tiles[4 * i];
            b->h_dec[2 * runs++ + 1] = b->h_tiles[4 * i + 1];
        }
    if ((rc = cuda_upload(b->c, b->d_meta, b->h_meta,
                          (size_t)(b->h_tiles - b->h_meta + 4 * (int64_t)n_tiles) * 4, e)))
        return rc;
    cudaEventRecord(b->meta_copied, cuda_ctx_stream(b->c));
    b->n_tokens = b->t_real = b->t_pad = T;
    b->padding = 0;
    b->n_seqs = S;
    b->max_blocks = b->bt_stride = b->block_tokens = b->n_logits = 0;
    b->n_dec = b->n_tiles = b->max_dec_len = b->dec_len_bucket = 0;
    b->max_block_id = -1;
    b->graphable = 0;
    b->enc_step = 1;
    b->n_enc_tiles = n_tiles;
    b->enc_max_run = max_run;
    b->n_enc_runs = runs;
    return cuda_check(b->c, "step metadata", e);
}

static int be_batch_prepare(md_backend *be, const md_batch *bt, md_err *e) {
    cuda_backend *b = cbe(be);
    if (!b->reserved)
        return md_errf(e, MD_EINVAL, "cuda backend: batch_prepare before reserve");
    if (b->st == ST_RECORD || b->st == ST_REPLAY)
        return md_errf(e, MD_EINVAL, "cuda backend: batch_prepare inside a recorded step");
    if (bt->max_blocks == 0)
        return enc_batch_prepare(b, bt, e);
    b->enc_step = 0;
    int T = bt->n_tokens, S = bt->n_seqs;
    if (T < 1 || T > b->r.max_tokens || S < 1 || S > b->r.max_seqs || bt->max_blocks < 1 ||
        bt->max_blocks > b->r.max_blocks || bt->block_tokens < 1 || bt->n_logits < 0 ||
        bt->n_logits > T)
        return md_errf(e, MD_ERANGE,
                       "cuda backend: step of %d tokens / %d sequences / %d blocks "
                       "per sequence / %d logits exceeds the reserved %d / %d / %d",
                       T, S, bt->max_blocks, bt->n_logits, b->r.max_tokens, b->r.max_seqs,
                       b->r.max_blocks);
    cuda_step_plan plan;
    int rc = staging_free(b, e);
    if (rc == 0)
        rc = cuda_plan_step(bt, b->h_dec, b->h_tiles, &plan, e);
    if (rc)
        return rc;
    memcpy(b->h_tokens, bt->tokens, (size_t)T * 4);
    memcpy(b->h_pos, bt->tok_pos, (size_t)T * 4);
    memcpy(b->h_slot, bt->slot, (size_t)T * 4);
    memcpy(b->h_logit_rows, bt->logit_rows, (size_t)bt->n_logits * 4);
    /* a pure decode step: padding rows after the engine's (used from step_begin on) */
    int P = T;
    if (plan.n_tiles == 0 && plan.n_dec == T && bt->n_logits == T && T > 0)
        P = cuda_gc_pad_rows(T, b->r.max_tokens < b->r.max_seqs ? b->r.max_tokens : b->r.max_seqs);
    for (int j = T; j < P; j++) {
        b->h_tokens[j] = b->h_tokens[0];
        b->h_pos[j] = 0;
        b->h_slot[j] = -1;
        b->h_logit_rows[j] = j;
        b->h_dec[3 * j] = j;
        b->h_dec[3 * j + 1] = b->h_dec[1];
        b->h_dec[3 * j + 2] = 1;
    }
    /* Rows at the step's stride: a model of 128k positions has 8192-entry rows, of which a
     * batch of short sequences reads a few. */
    int64_t want =
        ((int64_t)cuda_gc_len_bucket(plan.max_len) + bt->block_tokens - 1) / bt->block_tokens;
    int stride = want < b->r.max_blocks ? (int)want : b->r.max_blocks;
    int row = stride < bt->max_blocks ? stride : bt->max_blocks;
    for (int s = 0; s < S; s++)
        memcpy(b->h_bt + (size_t)s * stride, bt->block_table + (size_t)s * bt->max_blocks,
               (size_t)row * 4);
    rc = cuda_upload(b->c, b->d_meta, b->h_meta,
                     (size_t)(b->h_bt - b->h_meta + (int64_t)S * stride) * 4, e);
    if (rc)
        return rc;
    cudaEventRecord(b->meta_copied, cuda_ctx_stream(b->c));
    b->n_tokens = T;
    b->t_real = T;
    b->t_pad = P;
    b->padding = 0;
    b->n_seqs = S;
    b->max_blocks = bt->max_blocks;
    b->bt_stride = stride;
    b->block_tokens = bt->block_tokens;
    b->n_logits = bt->n_logits;
    b->n_dec = plan.n_dec;
    b->n_tiles = plan.n_tiles;
    b->max_dec_len = plan.max_dec_len;
    b->dec_len_bucket = cuda_gc_len_bucket(plan.max_dec_len);
    b->max_block_id = plan.max_block;
    b->graphable = b->graphs_on && plan.n_tiles == 0 && plan.n_dec == T;
    memset(&b->key, 0, sizeof b->key);
    b->key.k[0] = P; /* tokens = decode entries = logit rows */
    b->key.k[1] = b->dec_len_bucket;
    return cuda_check(b->c, "step metadata", e);
}

/* In a replayed step the ops check their arguments and queue nothing: the graph does. */
#define REPLAYING(be) (cbe(be)->st == ST_REPLAY)

/* The rows an op given the engine's T rows runs on: the padded count in a padded step. */
static int prow(const cuda_backend *b, int T) {
    return b->padding && T == b->t_real ? b->t_pad : T;
}

/* Likewise for an op over n = T * width elements. */
static int64_t pelems(const cuda_backend *b, int64_t n) {
    return b->padding && b->t_real > 0 && n % b->t_real == 0 ? n / b->t_real * b->t_pad : n;
}

static int tensor_ok(const md_tensor *w, md_err *e) {
    size_t rb = md_type_supported(w->type) ? md_type_row_bytes(w->type, w->ne0) : 0;
    if (rb == 0 || rb != w->row_bytes || w->ne1 < 1 || w->offset > w->buf->n ||
        (size_t)w->ne1 * rb > w->buf->n - w->offset)
        return md_errf(e, MD_ERANGE,
                       "cuda backend: tensor of type %d [%lld, %lld] does not lie "
                       "inside its %zu-byte buffer",
                       w->type, (long long)w->ne0, (long long)w->ne1, w->buf->n);
    return 0;
}

static const void *tensor_ptr(const md_tensor *w) {
    return (const char *)w->buf->p + w->offset;
}

static int be_embed(md_backend *be, const md_tensor *w, md_buf *out, md_err *e) {
    cuda_backend *b = cbe(be);
    int rc = tensor_ok(w, e);
    if (rc)
        return rc;
    for (int t = 0; t < b->n_tokens; t++)
        if (b->h_tokens[t] < 0 || b->h_tokens[t] >= w->ne1)
            return md_errf(e, MD_ERANGE, "token id %d outside the vocabulary of %lld",
                           (int)b->h_tokens[t], (long long)w->ne1);
    if ((size_t)b->n_tokens * w->ne0 * 4 > out->n)
        return md_errf(e, MD_ERANGE, "cuda backend: embedding output buffer too small");
    if (REPLAYING(be))
        return 0;
    return cuda_get_rows(b->c, tensor_ptr(w), w->type, w->ne1, (int)w->ne0, b->d_tokens,
                         b->n_tokens, (float *)out->p, NULL, e);
}

static int be_matmul(md_backend *be, const md_tensor *w, const md_buf *x, md_buf *y, int T,
                     md_err *e) {
    T = prow(cbe(be), T);
    int rc = tensor_ok(w, e);
    if (rc)
        return rc;
    if ((size_t)T * w->ne0 * 4 > x->n || (size_t)T * w->ne1 * 4 > y->n)
        return md_errf(e, MD_ERANGE,
                       "cuda backend: matmul of %d x [%lld -> %lld] overruns its "
                       "buffers",
                       T, (long long)w->ne0, (long long)w->ne1);
    if (REPLAYING(be))
        return 0;
    cuda_mm_w one = {tensor_ptr(w), w->type,       w->row_bytes,
                     (int)w->ne1,   (float *)y->p, shadow_of(cbe(be), w)};
    return cuda_matmul_n(cbe(be)->c, &one, 1, (const float *)x->p, T, (int)w->ne0, CUDA_MM_SET, 0,
                         e);
}

_Static_assert((int)CUDA_MM_SET == (int)MD_MM_SET && (int)CUDA_MM_ACC == (int)MD_MM_ACC &&
                   (int)CUDA_MM_SWIGLU == (int)MD_MM_SWIGLU && CUDA_MM_MAX >= MD_MM_MAX,
               "backend.h and cuda_ops.h matmul_n modes");

/* Q/K/V, gate/up with SwiGLU, wo / w_down added into the residual: one call, one GEMV
 * launch per weight type when decoding (cuda_matmul_n). */
static int be_matmul_n(md_backend *be, int n, const md_tensor *const *w, const md_buf *x,
                       md_buf *const *y, int T, int mode, md_err *e) {
    T = prow(cbe(be), T);
    if (n < 1 || n > MD_MM_MAX)
        return md_errf(e, MD_EINVAL, "cuda backend: matmul_n of %d weights (1 to %d)", n,
                       MD_MM_MAX);
    if (mode != MD_MM_SET && mode != MD_MM_ACC && mode != MD_MM_SWIGLU)
        return md_errf(e, MD_EINVAL, "cuda backend: matmul_n mode %d", mode);
    if (mode == MD_MM_SWIGLU && (n != 2 || w[0]->ne1 != w[1]->ne1))
        return md_errf(e, MD_EINVAL,
                       "cuda backend: matmul_n SwiGLU needs a gate and an up weight of one "
                       "shape (%d weights)",
                       n);
    cuda_mm_w cw[MD_MM_MAX];
    for (int i = 0; i < n; i++) {
        int rc = tensor_ok(w[i], e);
        if (rc)
            return rc;
        if (w[i]->ne0 != w[0]->ne0)
            return md_errf(e, MD_EINVAL,
                           "cuda backend: matmul_n weights of %lld and %lld inputs share one x",
                           (long long)w[0]->ne0, (long long)w[i]->ne0);
        if (T < 0 || (size_t)T * w[i]->ne0 * 4 > x->n || (size_t)T * w[i]->ne1 * 4 > y[i]->n)
            return md_errf(e, MD_ERANGE,
                           "cuda backend: matmul_n of %d x [%lld -> %lld] overruns its "
                           "buffers",
                           T, (long long)w[i]->ne0, (long long)w[i]->ne1);
        /* a kernel reads x and other rows of y while a warp writes y[i] */
        for (int j = 0; j < i; j++)
            if (y[j] == y[i])
                return md_errf(e, MD_EINVAL,
                               "cuda backend: matmul_n outputs %d and %d are one "
                               "buffer",
                               j, i);
        if (y[i] == x)
            return md_errf(e, MD_EINVAL, "cuda backend: matmul_n output %d is its input", i);
        cw[i] = (cuda_mm_w){tensor_ptr(w[i]), w[i]->type,       w[i]->row_bytes,
                            (int)w[i]->ne1,   (float *)y[i]->p, shadow_of(cbe(be), w[i])};
    }
    if (REPLAYING(be))
        return 0;
    return cuda_matmul_n(cbe(be)->c, cw, n, (const float *)x->p, T, (int)w[0]->ne0, mode, 0, e);
}

/* A BF16 copy of quantized weight w, made once at load (never inside a step: the allocation
 * would break a capture) and used by the cuBLAS path of matmul / matmul_n. */
static int be_weight_shadow(md_backend *be, const md_tensor *w, md_err *e) {
    cuda_backend *b = cbe(be);
    int rc = tensor_ok(w, e);
    if (rc || (rc = outside_step(b, "weight_shadow", e)))
        return rc;
    if (w->type == MD_TYPE_F32 || w->type == MD_TYPE_F16 || w->type == MD_TYPE_BF16)
        return 0;
    int64_t n = w->ne0 * w->ne1;
    if (cuda_ggml_bytes(w->type, n) == 0)
        return md_errf(e, MD_EUNSUPP, "cuda backend: no BF16 copy of a weight of type %d", w->type);
    const void *src = tensor_ptr(w);
    size_t at = shadow_at(b, src);
    if (shadow_of(b, w))
        return 0;
    if (at < b->n_sh && b->sh[at].w == src)
        return md_errf(e, MD_EINVAL,
                       "cuda backend: a BF16 copy of another weight at this address exists");
    if (b->n_sh == b->cap_sh) {
        size_t cap = b->cap_sh ? 2 * b->cap_sh : 64;
        shadow *ns = realloc(b->sh, cap * sizeof *ns);
        if (!ns)
            return md_errf(e, MD_ENOMEM, "cuda backend: out of host memory");
        b->sh = ns;
        b->cap_sh = cap;
    }
    size_t bytes = (size_t)n * 2;
    void *p = NULL;
    if ((rc = cuda_pool_alloc(b->c, bytes, &p, e))) {
        md_errctx(e, "BF16 copy of a [%lld, %lld] weight (%zu bytes): ", (long long)w->ne0,
                  (long long)w->ne1, bytes);
        return rc;
    }
    if ((rc = cuda_dequantize(b->c, w->type, src, p, CUDA_BF16, n, e))) {
        cuda_pool_free(b->c, p);
        return rc;
    }
    memmove(b->sh + at + 1, b->sh + at, (b->n_sh - at) * sizeof *b->sh);
    b->sh[at] = (shadow){src, w->type, n, p};
    b->n_sh++;
    cuda_ctx_scratch_moved(b->c); /* graphs recorded before expand w into scratch: re-record */
    return 0;
}

static int be_add_bias(md_backend *be, md_buf *y, const md_tensor *bias, int T, md_err *e) {
    T = prow(cbe(be), T);
    int rc = tensor_ok(bias, e);
    if (rc)
        return rc;
    if (bias->type != MD_TYPE_F32)
        return md_errf(e, MD_EUNSUPP, "cuda backend: bias of type %d (F32 only)", bias->type);
    if (REPLAYING(be))
        return 0;
    return cuda_add_bias(cbe(be)->c, (float *)y->p, (const float *)tensor_ptr(bias), T,
                         (int)bias->ne0, e);
}

static int be_rmsnorm(md_backend *be, const md_buf *x, const md_tensor *w, md_buf *out, int T,
                      int C, float eps, md_err *e) {
    T = prow(cbe(be), T);
    if (w->type != MD_TYPE_F32 || w->ne0 != C)
        return md_errf(e, MD_EUNSUPP, "cuda backend: rmsnorm weight must be F32 [%d]", C);
    if (REPLAYING(be))
        return 0;
    return cuda_rmsnorm(cbe(be)->c, (const float *)x->p, (const float *)tensor_ptr(w), eps, T, C,
                        out->p, CUDA_F32, e);
}

static int be_rope(md_backend *be, md_buf *x, int n_heads, int head_dim, int rot_dims,
                   const md_buf *inv_freq, int neox, md_err *e) {
    cuda_backend *b = cbe(be);
    if (REPLAYING(be))
        return 0;
    return cuda_rope(b->c, (float *)x->p, b->d_pos, b->n_tokens, n_heads, head_dim, rot_dims,
                     (const float *)inv_freq->p, neox, e);
}

/* The cache type is one the kernels store, and every slot of the step lies inside both
 * caches of rows of kv_dim elements (the kernels follow the slots without checking). */
static int slots_ok(const cuda_backend *b, const md_buf *k_cache, const md_buf *v_cache, int kv_dim,
                    int cache_type, md_err *e) {
    int rc = cache_type_ok(cache_type, e);
    if (rc)
        return rc;
    size_t row = (size_t)kv_dim * cache_elem(cache_type);
    for (int t = 0; t < b->t_real; t++) { /* padding rows store nothing (slot -1) */
        size_t s = (size_t)b->h_slot[t];
        if ((s + 1) * row > k_cache->n || (s + 1) * row > v_cache->n)
            return md_errf(e, MD_ERANGE, "cuda backend: KV slot %zu outside the cache", s);
    }
    return 0;
}

static int be_kv_write(md_backend *be, const md_buf *k, const md_buf *v, md_buf *k_cache,
                       md_buf *v_cache, int kv_dim, int cache_type, md_err *e) {
    cuda_backend *b = cbe(be);
    int rc = slots_ok(b, k_cache, v_cache, kv_dim, cache_type, e);
    if (rc)
        return rc;
    if (REPLAYING(be))
        return 0;
    return cuda_kv_write(b->c, k_cache->p, v_cache->p, cache_dtype(cache_type), kv_dim,
                         (const float *)k->p, (const float *)v->p, b->d_slot, b->n_tokens, e);
}

/* rope(q), rope(k), kv_write(k, v) as one launch (cuda_rope_kv): k goes rotated straight into
 * the cache and is left unrotated in its buffer, as backend.h allows. */
static int be_rope_kv(md_backend *be, md_buf *q, md_buf *k, const md_buf *v, md_buf *k_cache,
                      md_buf *v_cache, int n_heads, int n_kv_heads, int head_dim, int rot_dims,
                      const md_buf *inv_freq, int neox, int cache_type, md_err *e) {
    cuda_backend *b = cbe(be);
    if (n_heads < 1 || n_kv_heads < 1 || head_dim < 2 || head_dim % 2 || rot_dims < 2 ||
        rot_dims % 2 || rot_dims > head_dim)
        return md_errf(e, MD_EINVAL,
                       "cuda backend: rope_kv of %d heads / %d kv heads of %d dims, %d rotated",
                       n_heads, n_kv_heads, head_dim, rot_dims);
    int kv_dim = n_kv_heads * head_dim;
    size_t T = (size_t)b->n_tokens;
    if (T * n_heads * head_dim * 4 > q->n || T * kv_dim * 4 > k->n || T * kv_dim * 4 > v->n ||
        (size_t)rot_dims / 2 * 4 > inv_freq->n)
        return md_errf(e, MD_ERANGE,
                       "cuda backend: rope_kv of %zu tokens [%d + %d heads of %d] overruns its "
                       "buffers",
                       T, n_heads, n_kv_heads, head_dim);
    int rc = slots_ok(b, k_cache, v_cache, kv_dim, cache_type, e);
    if (rc)
        return rc;
    if (REPLAYING(be))
        return 0;
    return cuda_rope_kv(b->c, (float *)q->p, (const float *)k->p, (const float *)v->p, k_cache->p,
                        v_cache->p, cache_dtype(cache_type), b->d_pos, b->d_slot, b->n_tokens,
                        n_heads, n_kv_heads, head_dim, rot_dims, (const float *)inv_freq->p, neox,
                        e);
}

/* Splits for decode: enough blocks to fill the SMs twice, at least 64 keys per split. */
static int dec_splits(const cuda_backend *b, int n_kv_heads) {
    int blocks = b->n_dec * n_kv_heads;
    int want = (2 * b->n_sm + blocks - 1) / (blocks > 0 ? blocks : 1);
    int by_len = (b->dec_len_bucket + 63) / 64; /* a step's split count depends on its key */
    if (want > by_len)
        want = by_len;
    if (want > DEC_MAX_SPLITS)
        want = DEC_MAX_SPLITS;
    return want < 1 ? 1 : want;
}

static int be_check_attention(md_backend *be, int n_heads, int n_kv_heads, int head_dim,
                              int cache_type, md_err *e) {
    (void)be;
    int rc = cache_type_ok(cache_type, e);
    return rc ? rc : cuda_attn_shape_ok(n_heads, n_kv_heads, head_dim, cache_dtype(cache_type), e);
}

static int be_attention(md_backend *be, const md_buf *q, const md_buf *k_cache,
                        const md_buf *v_cache, md_buf *out, int n_heads, int n_kv_heads,
                        int head_dim, int cache_type, float scale, md_err *e) {
    cuda_backend *b = cbe(be);
    int rc = cache_type_ok(cache_type, e);
    if (rc)
        return rc;
    if (n_kv_heads < 1 || n_heads % n_kv_heads)
        return md_errf(e, MD_EINVAL, "cuda backend: %d heads over %d kv heads", n_heads,
                       n_kv_heads);
    size_t slot_bytes = (size_t)n_kv_heads * head_dim * cache_elem(cache_type);
    size_t n_slots = k_cache->n / slot_bytes;
    if ((size_t)(b->max_block_id + 1) * b->block_tokens > n_slots || v_cache->n < k_cache->n)
        return md_errf(e, MD_ERANGE,
                       "cuda backend: block %lld of %d tokens lies outside a cache "
                       "of %zu slots",
                       (long long)b->max_block_id, b->block_tokens, n_slots);
    cuda_kv_layer kv = {k_cache->p, v_cache->p, cache_dtype(cache_type),
                        n_kv_heads, head_dim,   b->block_tokens};
    if (REPLAYING(be))
        return 0;
    if (b->n_dec) {
        int splits = dec_splits(b, n_kv_heads);
        size_t need = cuda_attn_decode_work_bytes(b->n_dec, n_heads, head_dim, splits);
        if (need > b->att_work_n) {
            /* Grows to its high-water mark during the first steps, then never again. */
            void *p = NULL;
            size_t want = cuda_attn_decode_work_bytes(b->r.max_seqs, n_heads, head_dim, splits);
            if (want < need)
                want = need;
            if ((rc = cuda_pool_alloc(b->c, want, &p, e)))
                return rc;
            cuda_pool_free(b->c, b->att_work);
            b->att_work = p;
            b->att_work_n = want;
            cuda_ctx_scratch_moved(b->c); /* graphs reading the old one are stale */
        }
        if ((rc = cuda_attn_decode(b->c, &kv, (const float *)q->p, b->d_dec, b->n_dec, b->d_bt,
                                   b->bt_stride, n_heads, scale, splits, b->att_work,
                                   (float *)out->p, e)))
            return rc;
    }
    if (b->n_tiles)
        return cuda_attn_prefill(b->c, &kv, (const float *)q->p, b->d_tiles, b->n_tiles, b->d_bt,
                                 b->bt_stride, n_heads, scale, (float *)out->p, e);
    return 0;
}

static int be_swiglu(md_backend *be, const md_buf *gate, const md_buf *up, md_buf *out, int64_t n,
                     md_err *e) {
    n = pelems(cbe(be), n);
    if (REPLAYING(be))
        return 0;
    return cuda_swiglu(cbe(be)->c, (const float *)gate->p, (const float *)up->p, out->p, CUDA_F32,
                       n, e);
}

static int be_add(md_backend *be, md_buf *x, const md_buf *y, int64_t n, md_err *e) {
    n = pelems(cbe(be), n);
    if (REPLAYING(be))
        return 0;
    return cuda_add(cbe(be)->c, (float *)x->p, (const float *)y->p, n, e);
}

static int be_gather_rows(md_backend *be, const md_buf *x, md_buf *out, int C, md_err *e) {
    cuda_backend *b = cbe(be);
    if ((size_t)b->n_logits * C * 4 > out->n)
        return md_errf(e, MD_ERANGE, "cuda backend: %d logit rows of %d overrun the output",
                       b->n_logits, C);
    if (REPLAYING(be))
        return 0;
    return cuda_gather_rows(b->c, (const float *)x->p, b->d_logit_rows, b->n_logits, C,
                            (float *)out->p, e);
}

/* ---- encoder ops (encoder.cu) ------------------------------------------------------ */

static int be_layernorm(md_backend *be, const md_buf *x, const md_tensor *w, const md_tensor *bias,
                        md_buf *out, int T, int C, float eps, md_err *e) {
    int rc = tensor_ok(w, e);
    if (rc || (rc = tensor_ok(bias, e)))
        return rc;
    if (w->type != MD_TYPE_F32 || bias->type != MD_TYPE_F32 || w->ne0 != C || bias->ne0 != C)
        return md_errf(e, MD_EUNSUPP, "cuda backend: layernorm weight and bias must be F32 [%d]",
                       C);
    if (T < 0 || C < 1 || (size_t)T * C * 4 > x->n || (size_t)T * C * 4 > out->n)
        return md_errf(e, MD_ERANGE, "cuda backend: layernorm of [%d, %d] overruns its buffers", T,
                       C);
    if (REPLAYING(be))
        return 0;
    return cuda_layernorm(cbe(be)->c, (const float *)x->p, (const float *)tensor_ptr(w),
                          (const float *)tensor_ptr(bias), eps, T, C, (float *)out->p, e);
}

static int be_gelu_erf(md_backend *be, md_buf *x, int64_t n, md_err *e) {
    if (n < 0 || (size_t)n * 4 > x->n)
        return md_errf(e, MD_ERANGE, "cuda backend: gelu_erf of %lld floats overruns its buffer",
                       (long long)n);
    if (REPLAYING(be))
        return 0;
    return cuda_gelu_erf(cbe(be)->c, (float *)x->p, n, e);
}

/* Every row read is checked here, on the host copy of the positions. */
static int be_embed_add(md_backend *be, const md_tensor *w, int offset, md_buf *out, md_err *e) {
    cuda_backend *b = cbe(be);
    int rc = tensor_ok(w, e);
    if (rc)
        return rc;
    if (offset < 0)
        return md_errf(e, MD_EINVAL, "cuda backend: embed_add at offset %d", offset);
    for (int t = 0; t < b->n_tokens; t++) {
        int64_t r = (int64_t)b->h_pos[t] + offset;
        if (r < 0 || r >= w->ne1)
            return md_errf(e, MD_ERANGE, "position %lld outside the %lld position embeddings",
                           (long long)r, (long long)w->ne1);
    }
    if ((size_t)b->n_tokens * w->ne0 * 4 > out->n)
        return md_errf(e, MD_ERANGE, "cuda backend: embed_add output buffer too small");
    if (REPLAYING(be))
        return 0;
    return cuda_add_rows(b->c, tensor_ptr(w), w->type, w->ne1, (int)w->ne0, b->d_pos, offset,
                         b->n_tokens, (float *)out->p, e);
}

static int be_attention_enc(md_backend *be, const md_buf *q, const md_buf *k, const md_buf *v,
                            md_buf *out, int n_heads, int head_dim, float scale, md_err *e) {
    cuda_backend *b = cbe(be);
    if (!b->enc_step)
        return md_errf(e, MD_EINVAL,
                       "cuda backend: attention_enc outside an encoder step (one prepared "
                       "without KV blocks)");
    if (n_heads < 1 || head_dim < 1 || head_dim > b->r.enc_head_dim)
        return md_errf(e, MD_ERANGE,
                       "cuda backend: encoder attention of %d heads of %d dims, %d reserved",
                       n_heads, head_dim, b->r.enc_head_dim);
    if (b->enc_max_run > b->r.max_ctx)
        return md_errf(e, MD_ERANGE, "cuda backend: a sequence of %d tokens, at most %d reserved",
                       b->enc_max_run, b->r.max_ctx);
    size_t need = (size_t)b->n_tokens * n_heads * head_dim * 4;
    if (need > q->n || need > k->n || need > v->n || need > out->n)
        return md_errf(e, MD_ERANGE,
                       "cuda backend: encoder attention of %d tokens [%d heads of %d] overruns "
                       "its buffers",
                       b->n_tokens, n_heads, head_dim);
    if (REPLAYING(be))
        return 0;
    return cuda_attn_enc(b->c, (const float *)q->p, (const float *)k->p, (const float *)v->p,
                         b->d_tiles, b->n_enc_tiles, n_heads, head_dim, scale, (float *)out->p, e);
}

_Static_assert((int)CUDA_POOL_MEAN == (int)MD_POOL_MEAN && (int)CUDA_POOL_CLS == (int)MD_POOL_CLS &&
                   (int)CUDA_POOL_MAX == (int)MD_POOL_MAX &&
                   (int)CUDA_POOL_MEAN_SQRT == (int)MD_POOL_MEAN_SQRT &&
                   (int)CUDA_POOL_LAST == (int)MD_POOL_LAST,
               "backend.h and cuda_ops.h pooling modes");

static int be_pool_enc(md_backend *be, const md_buf *x, md_buf *out, int C, int mode, int normalize,
                       md_err *e) {
    cuda_backend *b = cbe(be);
    if (!b->enc_step || b->n_enc_runs != b->n_seqs)
        return md_errf(e, MD_EINVAL,
                       "cuda backend: pool_enc outside an encoder step, or over %d sequences of "
                       "which %d hold tokens",
                       b->n_seqs, b->n_enc_runs);
    if (mode < MD_POOL_MEAN || mode > MD_POOL_LAST)
        return md_errf(e, MD_EINVAL, "cuda backend: pooling mode %d", mode);
    if (C < 1 || (size_t)b->n_tokens * C * 4 > x->n || (size_t)b->n_seqs * C * 4 > out->n)
        return md_errf(e, MD_ERANGE,
                       "cuda backend: pooling of %d sequences of %d overruns its "
                       "buffers",
                       b->n_seqs, C);
    if (REPLAYING(be))
        return 0;
    return cuda_pool_enc(b->c, (const float *)x->p, b->d_dec, b->n_enc_runs, C, mode, normalize,
                         (float *)out->p, e);
}

static int be_sync(md_backend *be, md_err *e) {
    int rc = outside_step(cbe(be), "sync", e);
    if (rc)
        return rc;
    return cuda_sync(cbe(be)->c, e);
}

/* Free device memory plus what this backend's pool holds unused (cuda_check_fits). */
static int be_check_fits(md_backend *be, size_t need, const char *what, md_err *e) {
    return cuda_check_fits(cbe(be)->c, need, what, e);
}

static int be_mem_info(md_backend *be, size_t *avail, size_t *total, md_err *e) {
    return cuda_mem_info(cbe(be)->c, avail, total, e);
}

/* Greedy picks of rows logit rows on the device; only rows int32 come back. */
static int be_argmax(md_backend *be, const md_buf *x, int rows, int n, int32_t *out, md_err *e) {
    cuda_backend *b = cbe(be);
    if (outside_step(b, "argmax", e))
        return MD_EINVAL;
    if (!b->reserved || rows < 0 || rows > b->r.max_seqs || n < 1)
        return md_errf(e, MD_EINVAL, "cuda backend: argmax of %d rows (reserved for %d)", rows,
                       b->reserved ? b->r.max_seqs : 0);
    int rc = range_ok(x, 0, (size_t)rows * n * sizeof(float), e);
    if (rc || rows == 0)
        return rc;
    if ((rc = cuda_argmax(b->c, x->p, rows, n, b->d_argmax, e)))
        return rc;
    return cuda_download(b->c, out, b->d_argmax, (size_t)rows * sizeof(int32_t), e);
}

static int be_step_begin(md_backend *be, md_err *e) {
    cuda_backend *b = cbe(be);
    if (b->st != ST_IDLE)
        return md_errf(e, MD_EINVAL, "cuda backend: step_begin inside a step");
    b->st = ST_EAGER;
    if (b->t_pad > b->t_real && !b->padding) { /* until the next batch_prepare (a re-run too) */
        b->padding = 1;
        b->n_tokens = b->n_logits = b->n_dec = b->t_pad;
    }
    if (!b->graphable)
        return 0;
    cuda_gc_sync_gen(&b->gc, cuda_ctx_scratch_gen(b->c));
    switch (cuda_gc_lookup(&b->gc, &b->key, &b->replay_graph)) {
    case CUDA_GC_REPLAY:
        b->st = ST_REPLAY;
        g_totals.replayed++;
        return 0;
    case CUDA_GC_EAGER: return 0;
    case CUDA_GC_RECORD: break;
    }
    int rc = cuda_graph_begin(b->c, e);
    if (rc) {
        b->st = ST_IDLE;
        return rc;
    }
    b->st = ST_RECORD;
    return 0;
}

static int be_step_end(md_backend *be, int failed, md_err *e) {
    cuda_backend *b = cbe(be);
    int st = b->st;
    b->st = ST_IDLE;
    if (st == ST_EAGER)
        return 0;
    if (st == ST_REPLAY) {
        void *g = b->replay_graph;
        b->replay_graph = NULL;
        if (failed) /* an op refused its arguments: nothing was queued */
            return failed;
        return cuda_graph_launch(b->c, (cuda_graph *)g, e);
    }
    if (st != ST_RECORD)
        return md_errf(e, MD_EINVAL, "cuda backend: step_end without step_begin");
    if (failed) {
        cuda_graph_abort(b->c);
        md_err ce;
        if (cuda_ctx_failed(b->c, &ce)) { /* the device itself failed */
            if (e)
                *e = ce;
            return ce.code;
        }
        cuda_gc_failed(&b->gc, &b->key);
        g_totals.reruns++;
        return MD_STEP_RERUN;
    }
    cuda_graph *g = NULL;
    int rc = cuda_graph_end(b->c, &g, e);
    if (rc == CUDA_ECAPTURE) {
        cuda_gc_failed(&b->gc, &b->key);
        g_totals.reruns++;
        return MD_STEP_RERUN;
    }
    if (rc)
        return rc;
    cuda_gc_store(&b->gc, &b->key, g);
    g_totals.recorded++;
    return cuda_graph_launch(b->c, g, e);
}

_Static_assert(sizeof(cuda_sample_pen) == sizeof(md_sample_pen) &&
                   offsetof(cuda_sample_pen, n_out) == offsetof(md_sample_pen, n_out),
               "backend.h and cuda_ops.h penalty entries share a layout");

/* Room for n penalty entries (staging and device), grown to the largest call. */
static int pen_room(cuda_backend *b, size_t n, md_err *e) {
    if (n <= b->cap_pen)
        return 0;
    size_t cap = b->cap_pen ? 2 * b->cap_pen : 4096;
    if (cap < n)
        cap = n;
    size_t dev_bytes = cap * (sizeof(cuda_sample_pen) + sizeof(float));
    /* the last sample call waited for its result: neither copy is in use */
    if (b->h_pen)
        cudaFreeHost(b->h_pen);
    cuda_pool_free(b->c, b->d_pen);
    b->h_pen = b->d_pen = NULL;
    b->cap_pen = 0;
    if (cudaMallocHost((void **)&b->h_pen, cap * sizeof(cuda_sample_pen)) != cudaSuccess) {
        cudaGetLastError();
        b->h_pen = NULL;
        return md_errf(e, MD_ENOMEM, "cuda backend: cannot pin %zu bytes for %zu penalty entries",
                       cap * sizeof(cuda_sample_pen), cap);
    }
    int rc = cuda_pool_alloc(b->c, dev_bytes, (void **)&b->d_pen, e);
    if (rc) {
        cudaFreeHost(b->h_pen);
        b->h_pen = NULL;
        return rc;
    }
    b->cap_pen = cap;
    return 0;
}

/* Room for bytes of constraints (staging and device), grown to the largest call. */
static int con_room(cuda_backend *b, size_t bytes, md_err *e) {
    if (bytes <= b->cap_con)
        return 0;
    size_t cap = b->cap_con ? 2 * b->cap_con : 1 << 20;
    if (cap < bytes)
        cap = bytes;
    /* the last sample call waited for its result: neither copy is in use */
    if (b->h_con)
        cudaFreeHost(b->h_con);
    cuda_pool_free(b->c, b->d_con);
    b->h_con = b->d_con = NULL;
    b->cap_con = 0;
    if (cudaMallocHost((void **)&b->h_con, cap) != cudaSuccess) {
        cudaGetLastError();
        b->h_con = NULL;
        return md_errf(e, MD_ENOMEM, "cuda backend: cannot pin %zu bytes for token masks", cap);
    }
    int rc = cuda_pool_alloc(b->c, cap, (void **)&b->d_con, e);
    if (rc) {
        cudaFreeHost(b->h_con);
        b->h_con = NULL;
        return rc;
    }
    b->cap_con = cap;
    return 0;
}

_Static_assert(sizeof(cuda_sample_bias) == sizeof(md_sample_bias) &&
                   offsetof(cuda_sample_bias, bias) == offsetof(md_sample_bias, bias),
               "backend.h and cuda_ops.h bias entries share a layout");

/* The rows' constraints into h_sparams' mask_row / bias fields and one upload: the masks of
 * the constrained rows packed [n_masked, words], then every bias entry. *any = 0 when no
 * row is constrained (nothing uploaded). */
static int upload_constraints(cuda_backend *b, int rows, int n, const md_sample_params *p,
                              const uint32_t **d_mask, const cuda_sample_bias **d_bias, int *any,
                              md_err *e) {
    size_t words = (size_t)MD_MASK_WORDS(n), n_masked = 0, n_bias = 0;
    for (int r = 0; r < rows; r++) {
        n_masked += p[r].mask != NULL;
        n_bias += p[r].n_bias > 0 ? (size_t)p[r].n_bias : 0;
    }
    *any = n_masked + n_bias > 0;
    if (!*any)
        return 0;
    size_t mask_bytes = n_masked * words * sizeof(uint32_t);
    int rc = con_room(b, mask_bytes + n_bias * sizeof(cuda_sample_bias), e);
    if (rc)
        return rc;
    uint32_t *hm = (uint32_t *)b->h_con;
    cuda_sample_bias *hb = (cuda_sample_bias *)(b->h_con + mask_bytes);
    int mr = 0, bo = 0;
    for (int r = 0; r < rows; r++) {
        cuda_sample_params *q = &b->h_sparams[r];
        if (p[r].mask) {
            memcpy(hm + (size_t)mr * words, p[r].mask, words * sizeof(uint32_t));
            q->mask_row = ++mr;
        }
        if (p[r].n_bias > 0) {
            memcpy(hb + bo, p[r].bias, (size_t)p[r].n_bias * sizeof *hb); /* same layout */
            q->bias_off = bo;
            q->bias_n = p[r].n_bias;
            bo += p[r].n_bias;
        }
    }
    *d_mask = n_masked ? (const uint32_t *)b->d_con : NULL;
    *d_bias = n_bias ? (const cuda_sample_bias *)(b->d_con + mask_bytes) : NULL;
    return cuda_upload(b->c, b->d_con, b->h_con, mask_bytes + n_bias * sizeof(cuda_sample_bias), e);
}

/* Sampled, penalised and logprob rows: one id (and a logprob) per row comes back, not the row
 * of logits; the penalty entries go up instead. */
static int be_sample(md_backend *be, const md_buf *x, int rows, int n, const md_sample_params *p,
                     const md_sample_pen *pen, int n_pen, int32_t *out, float *logprob,
                     int32_t *top_tok, float *top_lp, md_err *e) {
    cuda_backend *b = cbe(be);
    if (outside_step(b, "sample", e))
        return MD_EINVAL;
    if (!b->reserved || rows < 0 || rows > b->r.max_seqs || n < 1 || n_pen < 0 ||
        !top_tok != !top_lp)
        return md_errf(e, MD_EINVAL,
                       "cuda backend: sample of %d rows, %d penalty entries%s "
                       "(reserved for %d rows)",
                       rows, n_pen, !top_tok != !top_lp ? ", top tokens without logprobs" : "",
                       b->reserved ? b->r.max_seqs : 0);
    int rc = range_ok(x, 0, (size_t)rows * n * sizeof(float), e);
    if (rc || rows == 0)
        return rc;
    for (int r = 0; r < rows; r++)
        if (p[r].pen_off < 0 || p[r].pen_n < 0 || p[r].pen_n > n_pen - p[r].pen_off ||
            p[r].n_top < 0 || p[r].n_top > CUDA_SAMPLE_TOP || p[r].n_bias < 0 ||
            (p[r].n_bias > 0 && !p[r].bias))
            return md_errf(e, MD_EINVAL,
                           "cuda backend: sample row %d names penalty entries %d..%d of %d and "
                           "%d top logprobs (at most %d), %d bias entries",
                           r, p[r].pen_off, p[r].pen_off + p[r].pen_n, n_pen, p[r].n_top,
                           CUDA_SAMPLE_TOP, p[r].n_bias);
    if (n_pen > 0 && (rc = pen_room(b, (size_t)n_pen, e)))
        return rc;
    for (int r = 0; r < rows; r++) /* staging is free: the last call waited for its result */
        b->h_sparams[r] = (cuda_sample_params){p[r].temperature,
                                               p[r].top_k,
                                               p[r].top_p,
                                               p[r].min_p,
                                               (float)p[r].u,
                                               p[r].repetition,
                                               p[r].presence,
                                               p[r].frequency,
                                               p[r].pen_off,
                                               p[r].pen_n,
                                               p[r].n_top,
                                               0,
                                               0,
                                               0};
    const uint32_t *d_mask = NULL;
    const cuda_sample_bias *d_bias = NULL;
    int constrained = 0;
    if ((rc = upload_constraints(b, rows, n, p, &d_mask, &d_bias, &constrained, e)))
        return rc;
    float *pen_raw = NULL;
    if (n_pen > 0) {
        memcpy(b->h_pen, pen, (size_t)n_pen * sizeof *pen); /* same layout: two int32 */
        pen_raw = (float *)(b->d_pen + b->cap_pen);
        rc = cuda_upload(b->c, b->d_pen, b->h_pen, (size_t)n_pen * sizeof(cuda_sample_pen), e);
    }
    /* d_argmax's layout: ids, logprobs, top ids, top logprobs (see cuda_backend) */
    size_t S = (size_t)b->r.max_seqs, top_n = (size_t)rows * CUDA_SAMPLE_TOP;
    float *d_lp = logprob || top_tok ? (float *)(b->d_argmax + S) : NULL;
    int32_t *d_top = top_tok ? b->d_argmax + 2 * S : NULL;
    float *d_top_lp = top_tok ? (float *)(b->d_argmax + 2 * S + S * CUDA_SAMPLE_TOP) : NULL;
    if (rc ||
        (rc = cuda_upload(b->c, b->d_sparams, b->h_sparams,
                          (size_t)rows * sizeof(cuda_sample_params), e)) ||
        (constrained &&
         (rc = cuda_constrain(b->c, (float *)x->p, rows, n, b->d_sparams, d_mask, d_bias, e))) ||
        (rc = cuda_sample(b->c, (float *)x->p, rows, n, b->d_sparams, b->d_pen, pen_raw,
                          b->d_argmax, d_lp, d_top, d_top_lp, e)) ||
        (rc = cuda_download(b->c, out, b->d_argmax, (size_t)rows * sizeof(int32_t), e)) ||
        (logprob && (rc = cuda_download(b->c, logprob, d_lp, (size_t)rows * sizeof(float), e))))
        return rc;
    if (top_tok && ((rc = cuda_download(b->c, top_tok, d_top, top_n * sizeof(int32_t), e)) ||
                    (rc = cuda_download(b->c, top_lp, d_top_lp, top_n * sizeof(float), e))))
        return rc;
    return 0;
}

#ifdef MEDLEY_HAVE_NCCL
/* ---- collectives (nccl.c) ----------------------------------------------------------- */

static int be_comm_unique_id(md_backend *be, uint8_t id[MD_COMM_ID_BYTES], md_err *e) {
    return cuda_comm_unique_id(id, e);
}

static int be_comm_init(md_backend *be, const uint8_t id[MD_COMM_ID_BYTES], int rank, int n,
                        md_comm **out, md_err *e) {
    cuda_backend *b = cbe(be);
    int rc = outside_step(b, "comm_init", e);
    if (rc || (rc = cuda_comm_init(b->c, id, rank, n, out, e)))
        return rc;
    /* each rank decides on its own what to record and replay, and a capture that fails on
     * one rank runs its collectives at another time than its peers' (backend.h comm_init) */
    b->graphs_on = 0;
    b->graphable = 0;
    return 0;
}

static void be_comm_free(md_backend *be, md_comm *m) {
    cuda_comm_free(cbe(be)->c, m);
}

static int be_all_reduce(md_backend *be, md_comm *m, md_buf *buf, int64_t n, md_err *e) {
    cuda_backend *b = cbe(be);
    n = pelems(b, n); /* every rank pads its decode steps alike: the same n everywhere */
    int rc = outside_step(b, "all_reduce", e);
    if (rc == 0 && n >= 0)
        rc = range_ok(buf, 0, (size_t)n * sizeof(float), e);
    return rc ? rc : cuda_comm_all_reduce(b->c, m, (float *)buf->p, n, e);
}

static int be_send(md_backend *be, md_comm *m, const md_buf *buf, size_t off, size_t bytes,
                   int peer, md_err *e) {
    int rc = outside_step(cbe(be), "send", e);
    if (!rc)
        rc = range_ok(buf, off, bytes, e);
    return rc ? rc : cuda_comm_send(cbe(be)->c, m, (const char *)buf->p + off, bytes, peer, e);
}

static int be_recv(md_backend *be, md_comm *m, md_buf *buf, size_t off, size_t bytes, int peer,
                   md_err *e) {
    int rc = outside_step(cbe(be), "recv", e);
    if (!rc)
        rc = range_ok(buf, off, bytes, e);
    return rc ? rc : cuda_comm_recv(cbe(be)->c, m, (char *)buf->p + off, bytes, peer, e);
}

static int be_comm_group_start(md_backend *be, md_err *e) {
    return cuda_comm_group_start(e);
}

static int be_comm_group_end(md_backend *be, md_err *e) {
    return cuda_comm_group_end(e);
}

_Static_assert(MD_COMM_ID_BYTES == CUDA_COMM_ID_BYTES, "backend.h and cuda_ops.h comm ids");
#endif

static const md_backend_ops cuda_backend_ops = {
    .name = "cuda",
    .kv_cache_type = MD_TYPE_F16, /* half the memory and attention traffic of F32 */
    /* a decode step reads every weight whatever the batch: 256 sequences (vLLM's
     * max_num_seqs), and prefill chunks of 2048 tokens (docs/cuda.md "Selecting a device") */
    .default_max_seqs = 256,
    .default_step_tokens = 2048,
    .free = be_free,
    .describe = be_describe,
    .buf_alloc = be_buf_alloc,
    .buf_wrap = be_buf_wrap,
    .buf_free = be_buf_free,
    .buf_upload = be_buf_upload,
    .buf_download = be_buf_download,
    .buf_zero = be_buf_zero,
    .check_attention = be_check_attention,
    .reserve = be_reserve,
    .batch_prepare = be_batch_prepare,
    .embed = be_embed,
    .matmul = be_matmul,
    .add_bias = be_add_bias,
    .rmsnorm = be_rmsnorm,
    .rope = be_rope,
    .kv_write = be_kv_write,
    .rope_kv = be_rope_kv,
    .attention = be_attention,
    .swiglu = be_swiglu,
    .add = be_add,
    .gather_rows = be_gather_rows,
    .sync = be_sync,
    .check_fits = be_check_fits,
    .mem_info = be_mem_info,
    .argmax = be_argmax,
    .sample = be_sample,
    .matmul_n = be_matmul_n,
    .weight_shadow = be_weight_shadow,
    .step_begin = be_step_begin,
    .step_end = be_step_end,
    .layernorm = be_layernorm,
    .gelu_erf = be_gelu_erf,
    .embed_add = be_embed_add,
    .attention_enc = be_attention_enc,
    .pool_enc = be_pool_enc,
#ifdef MEDLEY_HAVE_NCCL
    .comm_unique_id = be_comm_unique_id,
    .comm_init = be_comm_init,
    .comm_free = be_comm_free,
    .all_reduce = be_all_reduce,
    .send = be_send,
    .recv = be_recv,
    .comm_group_start = be_comm_group_start,
    .comm_group_end = be_comm_group_end,
#endif
};

static int cuda_open(int ordinal, int exact, md_backend **out, md_err *e) {
    *out = NULL;
    cuda_backend *b = calloc(1, sizeof *b);
    if (!b)
        return md_errf(e, MD_ENOMEM, "cuda backend: out of host memory");
    /* cuda-exact: the same ops on F32 weights (the engine dequantizes them before buf_wrap,
     * so every product is the F32 GEMV or SGEMM against F32 x) and an F32 KV cache (FP32
     * attention: the tensor-core kernel takes 16-bit caches only); no BF16 copies, there is
     * nothing quantized to copy */
    b->ops = cuda_backend_ops;
    if (exact) {
        b->ops.kv_cache_type = MD_TYPE_F32;
        b->ops.weights_f32 = 1;
        b->ops.weight_shadow = NULL;
    }
    b->base.ops = &b->ops;
    b->exact = exact;
    int rc = cuda_ctx_open(ordinal, &b->c, e);
    if (rc) {
        free(b);
        return rc;
    }
    cuda_device_info in;
    if ((rc = cuda_device_query(ordinal, &in, e))) {
        be_free(&b->base);
        return rc;
    }
    b->n_sm = in.n_sm;
    const char *gv = getenv("MEDLEY_CUDA_GRAPHS");
    b->graphs_on = !(gv && !strcmp(gv, "0"));
    cuda_gc_init(&b->gc, free_graph);
    if (cudaEventCreateWithFlags(&b->meta_copied, cudaEventDisableTiming) != cudaSuccess) {
        cudaGetLastError();
        be_free(&b->base);
        return md_errf(e, MD_EDEVICE, "cuda:%d: cannot create an event", ordinal);
    }
    *out = &b->base;
    return 0;
}

int md_backend_cuda_open(int ordinal, md_backend **out, md_err *e) {
    return cuda_open(ordinal, 0, out, e);
}

int md_backend_cuda_exact_open(int ordinal, md_backend **out, md_err *e) {
    return cuda_open(ordinal, 1, out, e);
}

/* ---- backend_cuda.h ---------------------------------------------------------------- */

int md_cuda_device_count(char *why, size_t whysz) {
    return cuda_device_count(why, whysz);
}

int md_cuda_device_get(int ordinal, md_device_info *out, md_err *e) {
    cuda_device_info in;
    int rc = cuda_device_query(ordinal, &in, e);
    if (rc)
        return rc;
    memset(out, 0, sizeof *out);
    memcpy(out->name, in.name, sizeof out->name);
    out->ordinal = in.ordinal;
    out->cc_major = in.cc_major;
    out->cc_minor = in.cc_minor;
    out->n_sm = in.n_sm;
    out->total_bytes = in.total_bytes;
    out->free_bytes = in.free_bytes;
    out->hbm_gbps = in.hbm_gbps;
    return 0;
}

int md_cuda_check_fits(int ordinal, size_t need, const char *what, md_err *e) {
    cuda_device_info in;
    int rc = cuda_device_query(ordinal, &in, e);
    if (rc)
        return rc;
    if (need > in.free_bytes)
        return md_errf(e, MD_ENOMEM,
                       "%s does not fit on cuda:%d (%s): needs %.2f GiB, %.2f GiB "
                       "free of %.2f GiB",
                       what, ordinal, in.name, need / GIB, in.free_bytes / GIB,
                       in.total_bytes / GIB);
    return 0;
}
