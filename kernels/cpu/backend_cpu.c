/* backend_cpu.c — the CPU implementation of backend.h: buffers are host memory, weights are
 * aliased where they lie (the GGUF mmap), the math is cpu_ops.h (thread pool, SIMD matmul,
 * vector ops). Attention over the paged KV cache, RoPE, embedding lookup and KV writes live
 * here. Every op is synchronous; scratch is sized once by reserve(), so no op allocates.
 *
 * Determinism: each output element is computed by the same code in the same summation order
 * whatever the number of tokens in the step or which thread runs it, so a sequence gives the
 * same logits alone or batched (the engine's seeded-sampling guarantee rests on this). */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/backend.h"
#include "kernels/cpu/cpu_ops.h"

struct md_buf {
    void *p;
    size_t n;
    int owned;
    int packed;   /* a weight repacked by weight_wrap (kernels/cpu/repack.c): p is the copy */
    cpu_lin *lin; /* a BF16 weight packed by weight_wrap for cpu_lin_run (enc_gemm.c); p NULL */
};

/* Query tokens per work item of the blocked attention: one sequence's tokens of a step are cut
 * into tiles of at most this many (a tile's K/V rows are converted once for all of them). */
#define ATT_TILE_TOKENS 32

typedef struct {
    md_backend base;
    cpu_pool *pool;
    int n_threads;
    int exact; /* matmul by dequantized weights in double precision (cpu_matmul_ref_mt) */
    md_reserve r;
    void *mm_scratch; /* cpu_matmul's activation blocks */
    size_t mm_scratch_n;
    float *att_scratch; /* [n_threads, CPU_ATT_GROUP * max_ctx] attention scores */
    float *enc_scratch; /* [n_threads, cpu_attention_seq_scratch(max_ctx, enc_head_dim)] */
    float *tile_scratch; /* [n_threads, tile_scratch_n]: the blocked F16 attention's tiles */
    size_t tile_scratch_n;
    int32_t *tiles; /* [max_tokens + 1]: first token of each query tile of the step, then T */
    void *lin_scratch;  /* encoders: cpu_lin_run's BF16 activations, or the unpacked lin's
                           [max_tokens, max_cols] product before MD_LIN_ADD */
    size_t lin_scratch_n;
    md_batch b;
    char desc[128];
} cpu_backend;

static cpu_backend *cb(md_backend *be) {
    return (cpu_backend *)be;
}

static void cpu_free(md_backend *be) {
    cpu_backend *c = cb(be);
    cpu_pool_destroy(c->pool);
    free(c->mm_scratch);
    free(c->att_scratch);
    free(c->enc_scratch);
    free(c->tile_scratch);
    free(c->tiles);
    free(c->lin_scratch);
    free(c);
}

static const char *cpu_describe(md_backend *be) {
    cpu_backend *c = cb(be);
    snprintf(c->desc, sizeof c->desc, "cpu: %d threads, %s", c->n_threads,
             c->exact ? "exact reference matmul" : cpu_simd_name());
    return c->desc;
}

static int cpu_buf_alloc(md_backend *be, size_t bytes, md_buf **out, md_err *e) {
    md_buf *b = calloc(1, sizeof *b);
    void *p = NULL;
    if (!b || posix_memalign(&p, 64, bytes ? bytes : 64)) {
        free(b);
        return md_errf(e, MD_ENOMEM, "cpu backend: cannot allocate %zu bytes", bytes);
    }
    b->p = p;
    b->n = bytes;
    b->owned = 1;
    *out = b;
    return 0;
}

static int cpu_buf_wrap(md_backend *be, const void *host, size_t bytes, md_buf **out, md_err *e) {
    md_buf *b = calloc(1, sizeof *b);
    if (!b)
        return md_errf(e, MD_ENOMEM, "cpu backend: out of memory");
    b->p = (void *)host; /* read-only by contract: no op writes to a wrapped buffer */
    b->n = bytes;
    *out = b;
    return 0;
}

/* A BF16 weight packed into cpu_lin's BF16 panels (the AVX-512 level): its products by the
 * 12-token x 32-output register tiles, x unrounded (CPU_LIN_WBF16) or, where VDPBF16PS is the
 * faster (cpu_lin_bf16_fast), rounded to BF16 (CPU_LIN_BF16; docs/kernels.md "Packed float
 * products"). Packed in parts of about 4 MiB of source, each reported done; NULL when
 * out of memory: the caller then aliases host. */
static cpu_lin *wrap_lin(const void *host, int rows, int cols,
                         void (*done)(void *, const void *, size_t), void *done_ctx) {
    cpu_lin *l = cpu_lin_alloc(rows, cols, cpu_lin_bf16_fast() ? CPU_LIN_BF16 : CPU_LIN_WBF16);
    size_t rb = md_type_row_bytes(MD_TYPE_BF16, cols);
    int step = (int)((4u << 20) / rb) + 1;
    for (int r = 0; l && r < rows; r += step) {
        int r1 = r + step < rows ? r + step : rows;
        if (cpu_lin_pack_rows(l, MD_TYPE_BF16, host, r, r1)) {
            cpu_lin_free(l);
            return NULL;
        }
        if (done)
            done(done_ctx, (const char *)host + (size_t)r * rb, (size_t)(r1 - r) * rb);
    }
    return l;
}

/* Q4_0/Q4_1/Q5_0/Q8_0/Q4_K/Q5_K/Q6_K weights repacked where the SIMD level has fast packed
 * kernels (AVX2, AVX-512): a copy of the same size (rows padded to 16; Q4_K's 2.8% larger,
 * Q5_K's 2.3%), the host
 * bytes never read again.
 * BF16 weights likewise into cpu_lin panels (wrap_lin). Anything else, the exact backend and a
 * failed allocation alias host as buf_wrap does. */
static int cpu_weight_wrap(md_backend *be, const void *host, size_t bytes, int type, int64_t ne0,
                           int64_t ne1, void (*done)(void *, const void *, size_t), void *done_ctx,
                           md_buf **out, int *copied, md_err *e) {
    *copied = 0;
    int shape_ok = ne0 > 0 && ne0 <= INT32_MAX && ne1 > 0 && ne1 <= INT32_MAX &&
                   md_type_row_bytes(type, ne0) * (size_t)ne1 == bytes && !cb(be)->exact;
    if (shape_ok && type == MD_TYPE_BF16 && cpu_simd_level() >= CPU_SIMD_AVX512VNNI) {
        md_buf *b = calloc(1, sizeof *b);
        cpu_lin *l = b ? wrap_lin(host, (int)ne1, (int)ne0, done, done_ctx) : NULL;
        if (!l) {
            free(b);
            return cpu_buf_wrap(be, host, bytes, out, e);
        }
        b->lin = l;
        b->owned = 1;
        *out = b;
        *copied = 1;
        return 0;
    }
    size_t n = shape_ok && cpu_pack_wanted(type) ? cpu_pack_size(type, (int)ne1, (int)ne0) : 0;
    void *p = NULL;
    if (n == 0 || posix_memalign(&p, 64, n))
        return cpu_buf_wrap(be, host, bytes, out, e);
    md_buf *b = calloc(1, sizeof *b);
    if (!b) {
        free(p);
        return cpu_buf_wrap(be, host, bytes, out, e);
    }
    /* parts of about 4 MiB of source, each reported done once packed */
    size_t group_src = md_type_row_bytes(type, ne0) * CPU_PACK_ROWS;
    int rows = (int)ne1, n_groups = (rows + CPU_PACK_ROWS - 1) / CPU_PACK_ROWS;
    int step = (int)((4u << 20) / group_src) + 1;
    for (int g = 0; g < n_groups; g += step) {
        int g1 = g + step < n_groups ? g + step : n_groups;
        cpu_pack_groups(type, host, rows, (int)ne0, g, g1, p); /* checked by cpu_pack_size */
        if (done) {
            size_t lo = (size_t)g * group_src, hi = (size_t)g1 * group_src;
            done(done_ctx, (const char *)host + lo, (hi < bytes ? hi : bytes) - lo);
        }
    }
    b->p = p;
    b->n = n;
    b->owned = 1;
    b->packed = 1;
    *out = b;
    *copied = 1;
    return 0;
}

static void cpu_buf_free(md_backend *be, md_buf *b) {
    if (!b)
        return;
    cpu_lin_free(b->lin);
    if (b->owned)
        free(b->p);
    free(b);
}

static int range_ok(const md_buf *b, size_t off, size_t n, md_err *e) {
    if (off > b->n || n > b->n - off)
        return md_errf(e, MD_ERANGE,
                       "cpu backend: %zu bytes at offset %zu outside a %zu-byte buffer", n, off,
                       b->n);
    return 0;
}

static int cpu_buf_upload(md_backend *be, md_buf *dst, size_t off, const void *src, size_t n,
                          md_err *e) {
    if (range_ok(dst, off, n, e))
        return e->code;
    memcpy((char *)dst->p + off, src, n);
    return 0;
}

static int cpu_buf_download(md_backend *be, const md_buf *src, size_t off, void *dst, size_t n,
                            md_err *e) {
    if (range_ok(src, off, n, e))
        return e->code;
    memcpy(dst, (const char *)src->p + off, n);
    return 0;
}

static int cpu_buf_zero(md_backend *be, md_buf *b, size_t off, size_t n, md_err *e) {
    if (range_ok(b, off, n, e))
        return e->code;
    memset((char *)b->p + off, 0, n);
    return 0;
}

static const int weight_types[] = {MD_TYPE_F32,  MD_TYPE_F16,  MD_TYPE_Q4_0, MD_TYPE_Q4_1,
                                   MD_TYPE_Q5_0, MD_TYPE_Q8_0, MD_TYPE_Q4_K, MD_TYPE_Q5_K,
                                   MD_TYPE_Q6_K, MD_TYPE_BF16};

static int cpu_reserve(md_backend *be, const md_reserve *r, md_err *e) {
    cpu_backend *c = cb(be);
    int cols = (r->max_cols + 255) / 256 * 256;
    size_t need = 0;
    for (size_t i = 0; i < sizeof weight_types / sizeof weight_types[0]; i++) {
        size_t s = cpu_matmul_scratch_size(weight_types[i], cols, r->max_tokens);
        if (s > need)
            need = s;
    }
    void *mm = NULL;
    if (need && posix_memalign(&mm, 64, need))
        return md_errf(e, MD_ENOMEM, "cpu backend: cannot allocate %zu bytes of matmul scratch",
                       need);
    float *att =
        malloc((size_t)c->n_threads * CPU_ATT_GROUP * (size_t)(r->max_ctx > 0 ? r->max_ctx : 1) *
               sizeof(float));
    if (!att) {
        free(mm);
        return md_errf(e, MD_ENOMEM, "cpu backend: cannot allocate attention scratch");
    }
    size_t enc_n = r->enc_head_dim > 0
                       ? (size_t)c->n_threads *
                             cpu_attention_seq_scratch(r->max_ctx > 0 ? r->max_ctx : 1,
                                                       r->enc_head_dim)
                       : 0;
    float *enc = enc_n ? malloc(enc_n * sizeof(float)) : NULL;
    if (enc_n && !enc) {
        free(mm);
        free(att);
        return md_errf(e, MD_ENOMEM, "cpu backend: cannot allocate encoder attention scratch");
    }
    /* The tiled attention: a key tile holds at most max(4096, 16 hd) floats of K and of V
     * (cpu_attention_key_tile), hd <= max_cols; rows <= ATT_TILE_TOKENS * n_heads. */
    int hd_max = r->max_cols > 0 ? r->max_cols : 1, heads = r->n_heads > 0 ? r->n_heads : 1;
    size_t kv_tile = 16 * (size_t)hd_max > 4096 ? 16 * (size_t)hd_max : 4096;
    size_t tile_n = 2 * kv_tile + CPU_ATT_GROUP * 64 + 2 * (size_t)ATT_TILE_TOKENS * heads + 16;
    float *tile = malloc((size_t)c->n_threads * tile_n * sizeof(float));
    int32_t *tiles = malloc(((size_t)(r->max_tokens > 0 ? r->max_tokens : 1) + 1) * sizeof *tiles);
    if (!tile || !tiles) {
        free(mm);
        free(att);
        free(enc);
        free(tile);
        free(tiles);
        return md_errf(e, MD_ENOMEM, "cpu backend: cannot allocate attention tile scratch");
    }
    /* cpu_lin_run's BF16 activations: encoders, and decoders' BF16 weights (wrap_lin) */
    size_t lin_n = cpu_simd_level() >= CPU_SIMD_AVX512VNNI && !c->exact
                       ? cpu_lin_scratch_size(r->max_cols, c->n_threads)
                       : 0;
    if (r->enc_head_dim > 0) {
        lin_n = cpu_lin_scratch_size(r->max_cols, c->n_threads);
        size_t unpacked = (size_t)r->max_tokens * (size_t)r->max_cols * sizeof(float);
        lin_n = unpacked > lin_n ? unpacked : lin_n; /* untouched (not resident) when packed */
    }
    void *lin = NULL;
    if (lin_n && posix_memalign(&lin, 64, lin_n)) {
        free(mm);
        free(att);
        free(enc);
        free(tile);
        free(tiles);
        return md_errf(e, MD_ENOMEM, "cpu backend: cannot allocate encoder product scratch");
    }
    free(c->mm_scratch);
    free(c->att_scratch);
    free(c->enc_scratch);
    free(c->tile_scratch);
    free(c->tiles);
    c->tile_scratch = tile;
    c->tile_scratch_n = tile_n;
    c->tiles = tiles;
    free(c->lin_scratch);
    c->lin_scratch = lin;
    c->lin_scratch_n = lin_n;
    c->enc_scratch = enc;
    c->mm_scratch = mm;
    c->mm_scratch_n = need;
    c->att_scratch = att;
    c->r = *r;
    return 0;
}

static int cpu_batch_prepare(md_backend *be, const md_batch *b, md_err *e) {
    cpu_backend *c = cb(be);
    if (b->n_tokens < 1 || b->n_tokens > c->r.max_tokens || b->n_seqs > c->r.max_seqs ||
        b->max_blocks > c->r.max_blocks)
        return md_errf(e, MD_ERANGE,
                       "cpu backend: step of %d tokens / %d sequences exceeds the reserved "
                       "%d / %d",
                       b->n_tokens, b->n_seqs, c->r.max_tokens, c->r.max_seqs);
    c->b = *b;
    return 0;
}

static const void *tensor_row(const md_tensor *w, int64_t r) {
    return (const char *)w->buf->p + w->offset + (size_t)r * w->row_bytes;
}

/* The type cpu_matmul takes for w: CPU_PACKED for a repacked weight (whose tensor covers its
 * buffer from offset 0). */
static int mm_type(const md_tensor *w) {
    return w->buf->packed ? CPU_PACKED(w->type) : w->type;
}

/* Row r of weight w as floats (embedding lookups), from either layout. */
static void weight_row(const md_tensor *w, int64_t r, float *out) {
    if (w->buf->lin)
        cpu_lin_row(w->buf->lin, (int)r, out);
    else if (w->buf->packed)
        cpu_packed_dequant_row(w->type, w->buf->p, (int)w->ne1, (int)w->ne0, (int)r, out);
    else
        cpu_dequant_row(w->type, tensor_row(w, r), out, (int)w->ne0);
}

static int cpu_embed(md_backend *be, const md_tensor *w, md_buf *out, md_err *e) {
    cpu_backend *c = cb(be);
    float *o = out->p;
    for (int t = 0; t < c->b.n_tokens; t++) {
        int32_t id = c->b.tokens[t];
        if (id < 0 || id >= w->ne1)
            return md_errf(e, MD_ERANGE, "token id %d outside the vocabulary of %lld", (int)id,
                           (long long)w->ne1);
        weight_row(w, id, o + (size_t)t * w->ne0);
    }
    return 0;
}

/* y [T, rows] = x · Wᵀ (epi CPU_LIN_SET) or y += it (CPU_LIN_ADD) for a weight packed by
 * wrap_lin, rows split over the pool; the BF16 activations in lin_scratch. */
static int lin_mm(cpu_backend *c, const md_tensor *w, const float *x, float *y, int T, int epi,
                  md_err *e) {
    if (cpu_lin_scratch_size((int)w->ne0, c->n_threads) > c->lin_scratch_n)
        return md_errf(e, MD_ERANGE,
                       "cpu backend: BF16 matmul of %lld columns exceeds reserved "
                       "scratch",
                       (long long)w->ne0);
    cpu_lin_run(c->pool, w->buf->lin, NULL, x, T, y, epi, c->lin_scratch);
    return 0;
}

typedef struct {
    float *g;
    const float *u;
    int rows, T;
} swiglu_job;

static void swiglu_rows(void *ctx, int ith, int nth) {
    const swiglu_job *j = ctx;
    for (int t = ith; t < j->T; t += nth)
        cpu_swiglu(j->g + (size_t)t * j->rows, j->g + (size_t)t * j->rows,
                   j->u + (size_t)t * j->rows, j->rows);
}

static int cpu_matmul_op(md_backend *be, const md_tensor *w, const md_buf *x, md_buf *y, int T,
                         md_err *e) {
    cpu_backend *c = cb(be);
    if (w->buf->lin)
        return lin_mm(c, w, x->p, y->p, T, CPU_LIN_SET, e);
    if (c->exact) {
        cpu_matmul_ref_mt(c->pool, w->type, tensor_row(w, 0), (int)w->ne1, (int)w->ne0, x->p, T,
                          y->p);
        return 0;
    }
    if (cpu_matmul_scratch_size(w->type, (int)w->ne0, T) > c->mm_scratch_n)
        return md_errf(e, MD_ERANGE, "cpu backend: matmul of %d x %lld exceeds reserved scratch", T,
                       (long long)w->ne0);
    cpu_matmul(c->pool, mm_type(w), tensor_row(w, 0), (int)w->ne1, (int)w->ne0, x->p, T, y->p,
               c->mm_scratch);
    return 0;
}

static int cpu_matmul_n_op(md_backend *be, int n, const md_tensor *const *w, const md_buf *x,
                           md_buf *const *y, int T, int mode, md_err *e) {
    cpu_backend *c = cb(be);
    if (n < 1 || n > MD_MM_MAX || (mode != MD_MM_SET && mode != MD_MM_ACC && mode != MD_MM_SWIGLU))
        return md_errf(e, MD_EINVAL, "cpu backend: matmul_n of %d weights in mode %d", n, mode);
    if (mode == MD_MM_SWIGLU && (n != 2 || w[1]->ne1 != w[0]->ne1))
        return md_errf(e, MD_EINVAL, "cpu backend: SwiGLU product needs 2 weights of one shape");
    int cols = (int)w[0]->ne0;
    if ((size_t)T * cols * sizeof(float) > x->n)
        return md_errf(e, MD_ERANGE, "cpu backend: matmul_n input of %d x %d overruns its buffer",
                       T, cols);
    cpu_mm_seg seg[MD_MM_MAX];
    int n_lin = 0;
    for (int i = 0; i < n; i++) {
        if (w[i]->ne0 != cols)
            return md_errf(e, MD_EINVAL, "cpu backend: matmul_n weights of %lld and %d columns",
                           (long long)w[i]->ne0, cols);
        int alias = y[i] == x;
        for (int j = 0; j < i; j++)
            alias |= y[j] == y[i];
        if ((size_t)T * w[i]->ne1 * sizeof(float) > y[i]->n || alias)
            return md_errf(e, MD_ERANGE,
                           "cpu backend: matmul_n output %d of %d x %lld overruns its buffer "
                           "or aliases the input or another output",
                           i, T, (long long)w[i]->ne1);
        if (cpu_matmul_scratch_size(w[i]->type, cols, T) > c->mm_scratch_n)
            return md_errf(e, MD_ERANGE, "cpu backend: matmul of %d x %d exceeds reserved scratch",
                           T, cols);
        n_lin += w[i]->buf->lin != NULL;
        if (!w[i]->buf->lin)
            seg[i] = (cpu_mm_seg){mm_type(w[i]), tensor_row(w[i], 0), (int)w[i]->ne1, y[i]->p};
    }
    if (n_lin) {
        /* BF16 weights packed for cpu_lin_run (any others beside them by cpu_matmul): one
         * product per weight, then SwiGLU's gating as the fused mode does it */
        int rc, epi = mode == MD_MM_ACC ? CPU_LIN_ADD : CPU_LIN_SET;
        for (int i = 0; i < n; i++) {
            if (w[i]->buf->lin && (rc = lin_mm(c, w[i], x->p, y[i]->p, T, epi, e)))
                return rc;
            if (!w[i]->buf->lin)
                cpu_matmul_n(c->pool, &seg[i], 1, cols, x->p, T,
                             mode == MD_MM_ACC ? CPU_MM_ACC : CPU_MM_SET, c->mm_scratch);
        }
        if (mode == MD_MM_SWIGLU) {
            swiglu_job j = {y[0]->p, y[1]->p, (int)w[0]->ne1, T};
            cpu_pool_run(T >= 8 ? c->pool : NULL, swiglu_rows, &j);
        }
        return 0;
    }
    _Static_assert((int)MD_MM_SET == (int)CPU_MM_SET && (int)MD_MM_ACC == (int)CPU_MM_ACC &&
                       (int)MD_MM_SWIGLU == (int)CPU_MM_SWIGLU && MD_MM_MAX == CPU_MM_MAX,
                   "backend.h and cpu_ops.h number the matmul_n modes alike");
    cpu_matmul_n(c->pool, seg, n, cols, x->p, T, mode, c->mm_scratch);
    return 0;
}

static int cpu_add_bias(md_backend *be, md_buf *y, const md_tensor *bias, int T, md_err *e) {
    float *o = y->p;
    const float *bv = tensor_row(bias, 0);
    int n = (int)bias->ne0;
    for (int t = 0; t < T; t++)
        cpu_add(o + (size_t)t * n, o + (size_t)t * n, bv, n);
    return 0;
}

typedef struct {
    const float *x;
    const float *w;
    float *out;
    int T, C;
    float eps;
} rms_job;

static void rms_run(void *ctx, int ith, int nth) {
    rms_job *j = ctx;
    for (int t = ith; t < j->T; t += nth)
        cpu_rmsnorm(j->out + (size_t)t * j->C, j->x + (size_t)t * j->C, j->w, j->C, j->eps);
}

static int cpu_rmsnorm_op(md_backend *be, const md_buf *x, const md_tensor *w, md_buf *out, int T,
                          int C, float eps, md_err *e) {
    cpu_backend *c = cb(be);
    rms_job j = {x->p, tensor_row(w, 0), out->p, T, C, eps};
    cpu_pool_run(T >= 8 ? c->pool : NULL, rms_run, &j);
    return 0;
}

/* Rotate the n_heads heads of one token's row v by the angles whose cosines and sines are
 * cs / sn (half of them). */
static void rope_row(float *v, int n_heads, int head_dim, int half, int neox, const float *cs,
                     const float *sn) {
    for (int h = 0; h < n_heads; h++, v += head_dim)
        for (int i = 0; i < half; i++) {
            int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
            float x0 = v[a], x1 = v[b];
            v[a] = x0 * cs[i] - x1 * sn[i];
            v[b] = x0 * sn[i] + x1 * cs[i];
        }
}

#define ROPE_MAX_HALF 512

static void rope_angles(float pos, const float *inv_freq, int half, float *cs, float *sn) {
    for (int i = 0; i < half; i++) {
        float th = pos * inv_freq[i];
        cs[i] = cosf(th);
        sn[i] = sinf(th);
    }
}

static int rope_check(int head_dim, int rot_dims, md_err *e) {
    if (rot_dims < 2 || rot_dims > head_dim || rot_dims % 2 || rot_dims / 2 > ROPE_MAX_HALF)
        return md_errf(e, MD_EINVAL, "cpu backend: RoPE over %d of %d dimensions", rot_dims,
                       head_dim);
    return 0;
}

static int cpu_rope(md_backend *be, md_buf *x, int n_heads, int head_dim, int rot_dims,
                    const md_buf *inv_freq, int neox, md_err *e) {
    cpu_backend *c = cb(be);
    int half = rot_dims / 2, rc = rope_check(head_dim, rot_dims, e);
    if (rc)
        return rc;
    float cs[ROPE_MAX_HALF], sn[ROPE_MAX_HALF];
    for (int t = 0; t < c->b.n_tokens; t++) {
        rope_angles((float)c->b.tok_pos[t], inv_freq->p, half, cs, sn);
        rope_row((float *)x->p + (size_t)t * n_heads * head_dim, n_heads, head_dim, half, neox,
                 cs, sn);
    }
    return 0;
}

/* Every token's cache slot inside both caches (checked before the stores, which run on the
 * pool and cannot fail). */
static int kv_slots_check(const cpu_backend *c, const md_buf *k_cache, const md_buf *v_cache,
                          int kv_dim, int cache_type, md_err *e) {
    size_t row = md_type_row_bytes(cache_type, kv_dim);
    size_t n = k_cache->n < v_cache->n ? k_cache->n : v_cache->n;
    for (int t = 0; t < c->b.n_tokens; t++) {
        size_t s = (size_t)c->b.slot[t];
        if (c->b.slot[t] < 0 || (s + 1) * row > n)
            return md_errf(e, MD_ERANGE, "cpu backend: KV slot %d of token %d outside the cache",
                           (int)c->b.slot[t], t);
    }
    return 0;
}

/* Token t's k and v rows into its cache slot (checked by kv_slots_check). */
static void kv_store(const cpu_backend *c, int t, const float *kt, const float *vt, md_buf *k_cache,
                     md_buf *v_cache, int kv_dim, int cache_type) {
    size_t row = md_type_row_bytes(cache_type, kv_dim), s = (size_t)c->b.slot[t];
    if (cache_type == MD_TYPE_F16) {
        cpu_f32_to_f16_row((uint16_t *)((char *)k_cache->p + s * row), kt, kv_dim);
        cpu_f32_to_f16_row((uint16_t *)((char *)v_cache->p + s * row), vt, kv_dim);
    } else {
        memcpy((char *)k_cache->p + s * row, kt, row);
        memcpy((char *)v_cache->p + s * row, vt, row);
    }
}

static int kv_type_check(int cache_type, md_err *e) {
    if (cache_type != MD_TYPE_F32 && cache_type != MD_TYPE_F16)
        return md_errf(e, MD_EUNSUPP, "cpu backend: KV cache type %d not supported (F32, F16)",
                       cache_type);
    return 0;
}

/* rope_kv and kv_write over the step's tokens; q NULL: no rotation (kv_write). */
typedef struct {
    const cpu_backend *c;
    float *q, *k;
    const float *v;
    md_buf *k_cache, *v_cache;
    const float *inv_freq;
    int n_heads, n_kv_heads, head_dim, half, neox, cache_type;
} rope_kv_job;

/* Tokens in contiguous ranges per thread: every token costs the same. */
static void rope_kv_run(void *ctx, int ith, int nth) {
    rope_kv_job *j = ctx;
    int T = j->c->b.n_tokens, per = (T + nth - 1) / nth, t0 = per * ith;
    int t1 = t0 + per < T ? t0 + per : T, kv_dim = j->n_kv_heads * j->head_dim;
    float cs[ROPE_MAX_HALF], sn[ROPE_MAX_HALF];
    for (int t = t0; t < t1; t++) {
        float *kt = j->k + (size_t)t * kv_dim;
        if (j->q) {
            rope_angles((float)j->c->b.tok_pos[t], j->inv_freq, j->half, cs, sn);
            rope_row(j->q + (size_t)t * j->n_heads * j->head_dim, j->n_heads, j->head_dim, j->half,
                     j->neox, cs, sn);
            rope_row(kt, j->n_kv_heads, j->head_dim, j->half, j->neox, cs, sn);
        }
        kv_store(j->c, t, kt, j->v + (size_t)t * kv_dim, j->k_cache, j->v_cache, kv_dim,
                 j->cache_type);
    }
}

/* Steps of fewer tokens run on the calling thread: waking the pool costs more. */
#define ROPE_KV_POOL_TOKENS 8

static int cpu_kv_write(md_backend *be, const md_buf *k, const md_buf *v, md_buf *k_cache,
                        md_buf *v_cache, int kv_dim, int cache_type, md_err *e) {
    cpu_backend *c = cb(be);
    int rc;
    if ((rc = kv_type_check(cache_type, e)) ||
        (rc = kv_slots_check(c, k_cache, v_cache, kv_dim, cache_type, e)))
        return rc;
    rope_kv_job j = {.c = c,
                     .k = k->p,
                     .v = v->p,
                     .k_cache = k_cache,
                     .v_cache = v_cache,
                     .n_kv_heads = 1,
                     .head_dim = kv_dim,
                     .cache_type = cache_type};
    cpu_pool_run(c->b.n_tokens >= ROPE_KV_POOL_TOKENS ? c->pool : NULL, rope_kv_run, &j);
    return 0;
}

/* One pass per token: the angles once for q and k, k rotated in place then stored. */
static int cpu_rope_kv(md_backend *be, md_buf *q, md_buf *k, const md_buf *v, md_buf *k_cache,
                       md_buf *v_cache, int n_heads, int n_kv_heads, int head_dim, int rot_dims,
                       const md_buf *inv_freq, int neox, int cache_type, md_err *e) {
    cpu_backend *c = cb(be);
    int rc;
    if ((rc = rope_check(head_dim, rot_dims, e)) || (rc = kv_type_check(cache_type, e)) ||
        (rc = kv_slots_check(c, k_cache, v_cache, n_kv_heads * head_dim, cache_type, e)))
        return rc;
    rope_kv_job j = {.c = c,
                     .q = q->p,
                     .k = k->p,
                     .v = v->p,
                     .k_cache = k_cache,
                     .v_cache = v_cache,
                     .inv_freq = inv_freq->p,
                     .n_heads = n_heads,
                     .n_kv_heads = n_kv_heads,
                     .head_dim = head_dim,
                     .half = rot_dims / 2,
                     .neox = neox,
                     .cache_type = cache_type};
    cpu_pool_run(c->b.n_tokens >= ROPE_KV_POOL_TOKENS ? c->pool : NULL, rope_kv_run, &j);
    return 0;
}

typedef struct {
    cpu_backend *c;
    const float *q;
    const void *kc, *vc; /* float or uint16_t (f16) rows */
    float *out;
    int n_heads, n_kv_heads, head_dim;
    float scale;
    int f16;
    int window;      /* 0: whole sequence */
    int n_tiles;     /* F16: query tiles of the step (c->tiles) */
    atomic_int next; /* F16: the next (tile, KV head) item to claim */
} att_job;

/* F16 cache: one (query tile, KV head) per work item, claimed in order by whichever thread is
 * free (tiles late in a long prompt cost more than decode tokens), each through the blocked
 * kernel with all the query heads of the KV head; a row's bits do not depend on its tile. */
static void att_run_f16(att_job *j, int ith, int nth) {
    const md_batch *b = &j->c->b;
    int hd = j->head_dim, kv_dim = j->n_kv_heads * hd, group = j->n_heads / j->n_kv_heads;
    size_t qd = (size_t)j->n_heads * hd;
    float *sc = j->c->tile_scratch + (size_t)ith * j->c->tile_scratch_n;
    int items = j->n_tiles * j->n_kv_heads;
    for (int it; (it = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed)) < items;) {
        int ti = it / j->n_kv_heads, kvh = it % j->n_kv_heads;
        int t0 = j->c->tiles[ti], nt = j->c->tiles[ti + 1] - t0, s = b->tok_seq[t0];
        size_t off = (size_t)t0 * qd + (size_t)kvh * group * hd;
        cpu_attention_tiled_f16(j->out + off, qd, j->q + off, qd, nt, b->tok_pos + t0, group,
                                (const uint16_t *)j->kc + (size_t)kvh * hd,
                                (const uint16_t *)j->vc + (size_t)kvh * hd, (size_t)kv_dim,
                                b->block_table + (size_t)s * b->max_blocks, b->block_tokens,
                                j->window, hd, j->scale, sc);
    }
}

/* One (token, head) pair per work item, over the sequence's positions 0..pos in order (fixed
 * summation order: results do not depend on the split or the batch). */
static void att_run(void *ctx, int ith, int nth) {
    att_job *j = ctx;
    if (j->f16) {
        att_run_f16(j, ith, nth);
        return;
    }
    const md_batch *b = &j->c->b;
    int hd = j->head_dim, kv_dim = j->n_kv_heads * hd, group = j->n_heads / j->n_kv_heads;
    float *sc = j->c->att_scratch + (size_t)ith * CPU_ATT_GROUP * j->c->r.max_ctx;
    int64_t items = (int64_t)b->n_tokens * j->n_heads;
    /* interleaved: later positions cost more, so contiguous ranges would be unbalanced */
    for (int64_t it = ith; it < items; it += nth) {
        int t = (int)(it / j->n_heads), h = (int)(it % j->n_heads), kvh = h / group;
        int s = b->tok_seq[t], npos = b->tok_pos[t] + 1;
        int p0 = j->window > 0 && npos > j->window ? npos - j->window : 0;
        const int32_t *bt = b->block_table + (size_t)s * b->max_blocks;
        float *o = j->out + ((size_t)t * j->n_heads + h) * hd;
        const float *q = j->q + ((size_t)t * j->n_heads + h) * hd;
        cpu_attention_paged(o, q, (const float *)j->kc + (size_t)kvh * hd,
                            (const float *)j->vc + (size_t)kvh * hd, (size_t)kv_dim, bt,
                            b->block_tokens, p0, npos, hd, j->scale, sc);
    }
}

static int attention_run(md_backend *be, const md_buf *q, const md_buf *k_cache,
                         const md_buf *v_cache, md_buf *out, int n_heads, int n_kv_heads,
                         int head_dim, int cache_type, float scale, int window, md_err *e) {
    cpu_backend *c = cb(be);
    if (cache_type != MD_TYPE_F32 && cache_type != MD_TYPE_F16)
        return md_errf(e, MD_EUNSUPP, "cpu backend: KV cache type %d not supported (F32, F16)",
                       cache_type);
    for (int t = 0; t < c->b.n_tokens; t++)
        if (c->b.tok_pos[t] >= c->r.max_ctx)
            return md_errf(e, MD_ERANGE, "cpu backend: position %d beyond the reserved context %d",
                           c->b.tok_pos[t], c->r.max_ctx);
    att_job j = {.c = c,
                 .q = q->p,
                 .kc = k_cache->p,
                 .vc = v_cache->p,
                 .out = out->p,
                 .n_heads = n_heads,
                 .n_kv_heads = n_kv_heads,
                 .head_dim = head_dim,
                 .scale = scale,
                 .f16 = cache_type == MD_TYPE_F16,
                 .window = window};
    atomic_init(&j.next, 0);
    if (j.f16) {
        int group = n_heads / n_kv_heads;
        if (cpu_attention_tiled_scratch(head_dim, ATT_TILE_TOKENS * group) > c->tile_scratch_n)
            return md_errf(e, MD_ERANGE,
                           "cpu backend: attention of head dimension %d, %d heads exceeds the "
                           "reserved scratch",
                           head_dim, n_heads);
        /* query tiles: runs of one sequence's tokens, at most ATT_TILE_TOKENS each */
        for (int t = 0; t < c->b.n_tokens; t++)
            if (t == 0 || c->b.tok_seq[t] != c->b.tok_seq[t - 1] ||
                t - c->tiles[j.n_tiles - 1] == ATT_TILE_TOKENS)
                c->tiles[j.n_tiles++] = t;
        c->tiles[j.n_tiles] = c->b.n_tokens;
    }
    cpu_pool_run(c->pool, att_run, &j);
    return 0;
}

static int cpu_attention(md_backend *be, const md_buf *q, const md_buf *k_cache,
                         const md_buf *v_cache, md_buf *out, int n_heads, int n_kv_heads,
                         int head_dim, int cache_type, float scale, md_err *e) {
    return attention_run(be, q, k_cache, v_cache, out, n_heads, n_kv_heads, head_dim, cache_type,
                         scale, 0, e);
}

static int cpu_attention_window(md_backend *be, const md_buf *q, const md_buf *k_cache,
                                const md_buf *v_cache, md_buf *out, int n_heads, int n_kv_heads,
                                int head_dim, int cache_type, float scale, int window, md_err *e) {
    if (window < 1)
        return md_errf(e, MD_EINVAL, "cpu backend: sliding window of %d positions", window);
    return attention_run(be, q, k_cache, v_cache, out, n_heads, n_kv_heads, head_dim, cache_type,
                         scale, window, e);
}

typedef struct {
    const float *a, *b;
    float *out;
    int64_t n;
    int op; /* 0 swiglu, 1 add, 2 geglu, 3 scale by s */
    float s;
} ew_job;

static void ew_run(void *ctx, int ith, int nth) {
    ew_job *j = ctx;
    int64_t per = (j->n + nth - 1) / nth, lo = per * ith, hi = lo + per < j->n ? lo + per : j->n;
    if (lo >= hi)
        return;
    if (j->op == 0)
        cpu_swiglu(j->out + lo, j->a + lo, j->b + lo, (int)(hi - lo));
    else if (j->op == 1)
        cpu_add(j->out + lo, j->a + lo, j->b + lo, (int)(hi - lo));
    else if (j->op == 2)
        cpu_geglu(j->out + lo, j->a + lo, j->b + lo, (int)(hi - lo));
    else
        cpu_scale(j->out + lo, j->s, (int)(hi - lo));
}

static int cpu_swiglu_op(md_backend *be, const md_buf *gate, const md_buf *up, md_buf *out,
                         int64_t n, md_err *e) {
    ew_job j = {gate->p, up->p, out->p, n, 0, 0};
    cpu_pool_run(n >= 16384 ? cb(be)->pool : NULL, ew_run, &j);
    return 0;
}

static int cpu_geglu_op(md_backend *be, const md_buf *gate, const md_buf *up, md_buf *out,
                        int64_t n, md_err *e) {
    ew_job j = {gate->p, up->p, out->p, n, 2, 0};
    cpu_pool_run(n >= 16384 ? cb(be)->pool : NULL, ew_run, &j);
    return 0;
}

static int cpu_scale_op(md_backend *be, md_buf *x, float s, int64_t n, md_err *e) {
    ew_job j = {x->p, NULL, x->p, n, 3, s};
    cpu_pool_run(n >= 65536 ? cb(be)->pool : NULL, ew_run, &j);
    return 0;
}

static int cpu_add_op(md_backend *be, md_buf *x, const md_buf *y, int64_t n, md_err *e) {
    ew_job j = {x->p, y->p, x->p, n, 1, 0};
    cpu_pool_run(n >= 65536 ? cb(be)->pool : NULL, ew_run, &j);
    return 0;
}

static int cpu_gather_rows(md_backend *be, const md_buf *x, md_buf *out, int C, md_err *e) {
    cpu_backend *c = cb(be);
    for (int i = 0; i < c->b.n_logits; i++)
        memmove((float *)out->p + (size_t)i * C,
                (const float *)x->p + (size_t)c->b.logit_rows[i] * C, (size_t)C * sizeof(float));
    return 0;
}

static int cpu_sync(md_backend *be, md_err *e) {
    return 0;
}

/* The host's physical memory bounds what a model can use: weights are mmap'd (paged in from
 * the file) and the KV cache is allocated, so more than the RAM there is would thrash or be
 * killed. Memory available right now is reported but not enforced: the page cache counts
 * as used and is given back on demand. */
static int cpu_check_fits(md_backend *be, size_t need, const char *what, md_err *e) {
    long pages = sysconf(_SC_PHYS_PAGES), avail = sysconf(_SC_AVPHYS_PAGES);
    long psz = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || psz <= 0)
        return 0; /* unknown: nothing to check against */
    double gib = 1024.0 * 1024.0 * 1024.0;
    size_t total = (size_t)pages * (size_t)psz;
    if (need > total)
        return md_errf(e, MD_ENOMEM,
                       "%s does not fit on cpu: needs %.2f GiB, this host has %.2f GiB of RAM "
                       "(%.2f GiB available now)",
                       what, need / gib, total / gib, avail > 0 ? (double)avail * psz / gib : 0.0);
    return 0;
}

typedef struct {
    const float *x;
    int rows, n, parts; /* parts per row: the row split when there are fewer rows than threads */
    int32_t *out;
    int32_t *best; /* [rows * parts]: each part's pick, -2 for a NaN (parts > 1) */
} argmax_job;

static void argmax_run(void *ctx, int ith, int nth) {
    argmax_job *j = ctx;
    if (j->parts == 1) {
        for (int r = ith; r < j->rows; r += nth)
            j->out[r] = cpu_argmax_f32(j->x + (size_t)r * j->n, j->n);
        return;
    }
    int per = (j->n + j->parts - 1) / j->parts;
    for (int it = ith; it < j->rows * j->parts; it += nth) {
        int r = it / j->parts, lo = it % j->parts * per, hi = lo + per < j->n ? lo + per : j->n;
        int i = lo < hi ? cpu_argmax_f32(j->x + (size_t)r * j->n + lo, hi - lo) : -1;
        j->best[it] = lo >= hi ? -1 : i < 0 ? -2 : lo + i;
    }
}

/* Rows of at least this many logits are split over the pool when there are fewer rows than
 * threads (a 262k vocabulary is a 1 MiB row: a few tens of microseconds on one core). */
#define ARGMAX_SPLIT_N 16384

static int cpu_argmax(md_backend *be, const md_buf *x, int rows, int n, int32_t *out, md_err *e) {
    if (rows < 0 || n < 1 || (size_t)rows * n * sizeof(float) > x->n)
        return md_errf(e, MD_ERANGE, "cpu backend: argmax over [%d, %d] outside a %zu-byte buffer",
                       rows, n, x->n);
    cpu_backend *c = cb(be);
    int nth = c->n_threads, parts = 1;
    if (rows < nth && n >= ARGMAX_SPLIT_N)
        parts = nth < 8 ? nth : 8;
    int32_t best[8 * 8];
    argmax_job j = {x->p, rows, n, parts, out, best};
    for (int r0 = 0; r0 < rows; r0 += 8) { /* best holds 8 rows of parts */
        j.x = (const float *)x->p + (size_t)r0 * n;
        j.rows = parts == 1 ? rows : (rows - r0 < 8 ? rows - r0 : 8);
        j.out = out + r0;
        cpu_pool_run((size_t)j.rows * n >= ARGMAX_SPLIT_N ? c->pool : NULL, argmax_run, &j);
        if (parts == 1)
            break;
        /* the largest of the parts' picks, the lowest part on ties: the whole row's pick */
        for (int r = 0; r < j.rows; r++) {
            const float *l = j.x + (size_t)r * n;
            int32_t pick = -1;
            for (int p = 0; p < parts && pick != -2; p++) {
                int32_t b = best[r * parts + p];
                if (b == -2 || (b >= 0 && (pick < 0 || l[b] > l[pick])))
                    pick = b;
            }
            out[r0 + r] = pick < 0 ? -1 : pick;
        }
    }
    return 0;
}

/* ---- encoder ops (enc_ops.c) ---- */

typedef struct {
    const float *x, *w, *b;
    float *out;
    int T, C;
    float eps;
} ln_job;

static void ln_run(void *ctx, int ith, int nth) {
    ln_job *j = ctx;
    for (int t = ith; t < j->T; t += nth)
        cpu_layernorm(j->out + (size_t)t * j->C, j->x + (size_t)t * j->C, j->w, j->b, j->C, j->eps);
}

static int cpu_layernorm_op(md_backend *be, const md_buf *x, const md_tensor *w, const md_tensor *b,
                            md_buf *out, int T, int C, float eps, md_err *e) {
    ln_job j = {x->p, tensor_row(w, 0), tensor_row(b, 0), out->p, T, C, eps};
    cpu_pool_run(T >= 8 ? cb(be)->pool : NULL, ln_run, &j);
    return 0;
}

typedef struct {
    float *x;
    int64_t n;
} gelu_job;

static void gelu_run(void *ctx, int ith, int nth) {
    gelu_job *j = ctx;
    int64_t per = (j->n + nth - 1) / nth, lo = per * ith, hi = lo + per < j->n ? lo + per : j->n;
    if (lo < hi)
        cpu_gelu_erf(j->x + lo, (int)(hi - lo));
}

static int cpu_gelu_erf_op(md_backend *be, md_buf *x, int64_t n, md_err *e) {
    gelu_job j = {x->p, n};
    cpu_pool_run(n >= 16384 ? cb(be)->pool : NULL, gelu_run, &j);
    return 0;
}

static int cpu_embed_add(md_backend *be, const md_tensor *w, int offset, md_buf *out, md_err *e) {
    cpu_backend *c = cb(be);
    float *o = out->p, *row = c->att_scratch; /* [n_threads * max_ctx] floats */
    if ((size_t)w->ne0 > (size_t)c->n_threads * (size_t)c->r.max_ctx)
        return md_errf(e, MD_ERANGE, "cpu backend: embedding rows of %lld exceed the scratch",
                       (long long)w->ne0);
    for (int t = 0; t < c->b.n_tokens; t++) {
        int64_t r = (int64_t)c->b.tok_pos[t] + offset;
        if (r < 0 || r >= w->ne1)
            return md_errf(e, MD_ERANGE, "position %lld outside the %lld position embeddings",
                           (long long)r, (long long)w->ne1);
        float *ot = o + (size_t)t * w->ne0;
        if (w->type == MD_TYPE_F32) {
            cpu_add(ot, ot, tensor_row(w, r), (int)w->ne0);
            continue;
        }
        weight_row(w, r, row);
        cpu_add(ot, ot, row, (int)w->ne0);
    }
    return 0;
}

typedef struct {
    cpu_backend *c;
    const float *q, *k, *v;
    float *out;
    int n_heads, head_dim;
    float scale;
} enc_att_job;

/* One (sequence, head) pair per item, interleaved over the threads; a sequence is a run of
 * equal tok_seq (packed: contiguous). The items of the step are the runs times the heads. */
static void enc_att_run(void *ctx, int ith, int nth) {
    enc_att_job *j = ctx;
    const md_batch *b = &j->c->b;
    int H = j->n_heads, hd = j->head_dim, T = b->n_tokens;
    size_t stride = (size_t)H * hd;
    float *sc = j->c->enc_scratch +
                (size_t)ith * cpu_attention_seq_scratch(j->c->r.max_ctx, j->c->r.enc_head_dim);
    int64_t it = 0;
    for (int lo = 0, hi; lo < T; lo = hi) {
        for (hi = lo + 1; hi < T && b->tok_seq[hi] == b->tok_seq[lo]; hi++)
            ;
        for (int h = 0; h < H; h++, it++) {
            if (it % nth != ith)
                continue;
            size_t off = (size_t)lo * stride + (size_t)h * hd;
            cpu_attention_seq(j->out + off, j->q + off, j->k + off, j->v + off, stride, hi - lo, hd,
                              j->scale, sc);
        }
    }
}

static int cpu_attention_enc(md_backend *be, const md_buf *q, const md_buf *k, const md_buf *v,
                             md_buf *out, int n_heads, int head_dim, float scale, md_err *e) {
    cpu_backend *c = cb(be);
    if (head_dim > c->r.enc_head_dim)
        return md_errf(e, MD_ERANGE,
                       "cpu backend: encoder attention of head dimension %d, %d "
                       "reserved",
                       head_dim, c->r.enc_head_dim);
    for (int t = 0, run = 0; t < c->b.n_tokens; t++) {
        run = t > 0 && c->b.tok_seq[t] == c->b.tok_seq[t - 1] ? run + 1 : 1;
        if (run > c->r.max_ctx)
            return md_errf(e, MD_ERANGE, "cpu backend: a sequence of more than %d tokens",
                           c->r.max_ctx);
    }
    enc_att_job j = {c, q->p, k->p, v->p, out->p, n_heads, head_dim, scale};
    cpu_pool_run(c->pool, enc_att_run, &j);
    return 0;
}

/* An encoder linear layer: packed for cpu_lin_run at the AVX-512 level, else (a lower level,
 * cpu-exact, another weight type) the weight and bias as they are, multiplied by matmul. A
 * BF16 weight weight_wrap packed already: that packing, borrowed, where its precision is the
 * one asked (CPU_LIN_WBF16 gives the sums of F32 panels), else a copy in that precision. */
struct md_lin {
    cpu_lin *pk;
    int borrowed; /* pk is the weight buffer's */
    md_tensor w, b;
};

static int cpu_lin_prepare(md_backend *be, const md_tensor *w, const md_tensor *b, int flags,
                           md_lin **out, md_err *e) {
    cpu_backend *c = cb(be);
    *out = NULL;
    int bf16 = (flags & MD_LIN_BF16) != 0;
    if (bf16 && (c->exact || !cpu_lin_bf16_ok()))
        return md_errf(e, MD_EUNSUPP,
                       "cpu backend: BF16 products need AVX512-BF16 at the AVX-512 level (this "
                       "CPU at level %s%s has none)",
                       cpu_simd_name(), c->exact ? ", exact" : "");
    if (b->type != MD_TYPE_F32 || b->ne0 != w->ne1)
        return md_errf(e, MD_EINVAL, "cpu backend: a bias of %lld for %lld outputs",
                       (long long)b->ne0, (long long)w->ne1);
    md_lin *l = calloc(1, sizeof *l);
    if (!l)
        return md_errf(e, MD_ENOMEM, "cpu backend: out of memory");
    l->w = *w;
    l->b = *b;
    int prec = bf16 ? CPU_LIN_BF16 : CPU_LIN_WBF16;
    l->borrowed = w->buf->lin && cpu_lin_prec(w->buf->lin) == prec;
    if (l->borrowed)
        l->pk = w->buf->lin;
    else if (w->buf->lin)
        l->pk = cpu_lin_copy(w->buf->lin, prec);
    else if (!c->exact)
        l->pk = cpu_lin_pack(w->type, tensor_row(w, 0), (int)w->ne1, (int)w->ne0, bf16);
    if ((bf16 || w->buf->lin) && !l->pk) {
        free(l);
        return md_errf(e, MD_ENOMEM, "cpu backend: no memory to pack a %lld x %lld weight",
                       (long long)w->ne1, (long long)w->ne0);
    }
    *out = l;
    return 0;
}

static void cpu_lin_free_op(md_backend *be, md_lin *l) {
    if (l) {
        if (!l->borrowed)
            cpu_lin_free(l->pk);
        free(l);
    }
}

static int cpu_lin_op(md_backend *be, const md_lin *l, const md_buf *x, md_buf *y, int T, int epi,
                      md_err *e) {
    cpu_backend *c = cb(be);
    int N = (int)l->w.ne1, K = (int)l->w.ne0, rc;
    if (T < 1 || (size_t)T * K * sizeof(float) > x->n || (size_t)T * N * sizeof(float) > y->n ||
        x == y)
        return md_errf(e, MD_ERANGE,
                       "cpu backend: a linear layer of %d x %d over %d tokens overruns its "
                       "buffers",
                       N, K, T);
    _Static_assert((int)MD_LIN_SET == (int)CPU_LIN_SET && (int)MD_LIN_GELU == (int)CPU_LIN_GELU &&
                       (int)MD_LIN_ADD == (int)CPU_LIN_ADD,
                   "backend.h and cpu_ops.h number the linear epilogues alike");
    if (l->pk) {
        if (cpu_lin_scratch_size(K, c->n_threads) > c->lin_scratch_n)
            return md_errf(e, MD_ERANGE, "cpu backend: no encoder scratch reserved for %d columns",
                           K);
        cpu_lin_run(c->pool, l->pk, tensor_row(&l->b, 0), x->p, T, y->p, epi, c->lin_scratch);
        return 0;
    }
    md_buf tmp = {c->lin_scratch, c->lin_scratch_n, 0, 0, NULL},
           *out = epi == MD_LIN_ADD ? &tmp : y;
    if (epi == MD_LIN_ADD && (size_t)T * N * sizeof(float) > c->lin_scratch_n)
        return md_errf(e, MD_ERANGE, "cpu backend: no encoder scratch reserved for %d x %d", T, N);
    if ((rc = cpu_matmul_op(be, &l->w, x, out, T, e)) || (rc = cpu_add_bias(be, out, &l->b, T, e)))
        return rc;
    if (epi == MD_LIN_GELU)
        return cpu_gelu_erf_op(be, y, (int64_t)T * N, e);
    if (epi == MD_LIN_ADD)
        return cpu_add_op(be, y, &tmp, (int64_t)T * N, e);
    return 0;
}

static const md_backend_ops cpu_ops = {
    .name = "cpu",
    .kv_cache_type = MD_TYPE_F16, /* as llama.cpp: half the memory of F32 */
    .extra_weight_types = 1ull << MD_TYPE_Q5_0 | 1ull << MD_TYPE_Q5_K, /* cpu_weight_type */
    .free = cpu_free,
    .describe = cpu_describe,
    .buf_alloc = cpu_buf_alloc,
    .buf_wrap = cpu_buf_wrap,
    .weight_wrap = cpu_weight_wrap,
    .buf_free = cpu_buf_free,
    .buf_upload = cpu_buf_upload,
    .buf_download = cpu_buf_download,
    .buf_zero = cpu_buf_zero,
    .reserve = cpu_reserve,
    .batch_prepare = cpu_batch_prepare,
    .embed = cpu_embed,
    .matmul = cpu_matmul_op,
    .matmul_n = cpu_matmul_n_op,
    .add_bias = cpu_add_bias,
    .rmsnorm = cpu_rmsnorm_op,
    .rope = cpu_rope,
    .kv_write = cpu_kv_write,
    .rope_kv = cpu_rope_kv,
    .attention = cpu_attention,
    .swiglu = cpu_swiglu_op,
    .add = cpu_add_op,
    .gather_rows = cpu_gather_rows,
    .sync = cpu_sync,
    .check_fits = cpu_check_fits,
    .argmax = cpu_argmax,
    .attention_window = cpu_attention_window,
    .scale = cpu_scale_op,
    .geglu = cpu_geglu_op,
    .layernorm = cpu_layernorm_op,
    .gelu_erf = cpu_gelu_erf_op,
    .embed_add = cpu_embed_add,
    .attention_enc = cpu_attention_enc,
    .lin_prepare = cpu_lin_prepare,
    .lin = cpu_lin_op,
    .lin_free = cpu_lin_free_op,
};

/* cpu-exact: the same ops, with an F32 KV cache (the reference precision). */
static md_backend_ops cpu_exact_ops;
static pthread_once_t cpu_exact_once = PTHREAD_ONCE_INIT;
static void cpu_exact_ops_init(void) {
    cpu_exact_ops = cpu_ops;
    cpu_exact_ops.kv_cache_type = MD_TYPE_F32;
    cpu_exact_ops.matmul_n = NULL; /* the engine falls back to the exact matmul */
}

int md_backend_cpu_exact_open(int n_threads, md_backend **out, md_err *e) {
    int rc = md_backend_cpu_open(n_threads, out, e);
    if (rc == 0) {
        cb(*out)->exact = 1;
        pthread_once(&cpu_exact_once, cpu_exact_ops_init);
        (*out)->ops = &cpu_exact_ops;
    }
    return rc;
}

int md_backend_cpu_open(int n_threads, md_backend **out, md_err *e) {
    *out = NULL;
    if (n_threads < 0)
        return md_errf(e, MD_EINVAL, "cpu backend: %d threads requested", n_threads);
    cpu_backend *c = calloc(1, sizeof *c);
    if (!c)
        return md_errf(e, MD_ENOMEM, "cpu backend: out of memory");
    c->base.ops = &cpu_ops;
    c->pool = cpu_pool_create(n_threads);
    if (!c->pool) {
        free(c);
        return md_errf(e, MD_ENOMEM, "cpu backend: cannot start %d threads", n_threads);
    }
    c->n_threads = cpu_pool_size(c->pool);
    *out = &c->base;
    return 0;
}
