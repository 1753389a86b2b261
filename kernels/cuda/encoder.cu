/* encoder.cu — the kernels of encoder models (BERT, engine/model/encoder.h) that a llama-family
 * layer does not have: LayerNorm with a bias (post-LN), the exact (erf) GELU, position rows
 * added to the embeddings, and bidirectional attention over sequences packed end to end
 * (block-diagonal: each token attends to every token of its own sequence, no padding), and
 * the pooling of each sequence's hidden states into one vector (mean, CLS, max, mean over
 * sqrt(tokens), last token), L2-normalised when the model's pipeline says so.
 * The products around them are gemm.cu's (cuBLAS SGEMM / GemmEx past CUDA_GEMV_MAX_M tokens).
 * The CPU reference of each is kernels/cpu/enc_ops.c (and vec.c's GELU); tests/gpu/
 * test_cuda_encoder.c compares them op by op, on a device and on the emulator. */
#include "kernels/cuda/attn_online.cuh"
#include "kernels/cuda/quant.cuh"

/* One block per row: the mean, then the variance around it (two passes, as the CPU does,
 * rather than E[x^2] - E[x]^2, which cancels badly on rows with a large mean), then scale
 * and shift. out may equal x: every thread reads its own elements before writing them. */
__global__ void k_layernorm(const float *x, const float *w, const float *b, float eps, int dim,
                            float *out) {
    __shared__ float sh[32];
    const float *xr = x + (int64_t)blockIdx.x * dim;
    float s = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        s += xr[i];
    float mean = cuda_block_sum(s, sh) / (float)dim;
    float v = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        float d = xr[i] - mean;
        v += d * d;
    }
    float inv = 1.0f / sqrtf(cuda_block_sum(v, sh) / (float)dim + eps);
    float *o = out + (int64_t)blockIdx.x * dim;
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        o[i] = (xr[i] - mean) * inv * w[i] + b[i];
}

int cuda_layernorm(cuda_ctx *c, const float *x, const float *w, const float *b, float eps, int rows,
                   int dim, float *out, md_err *e) {
    CUDA_GUARD(c, e);
    if (rows < 0 || dim <= 0)
        return md_errf(e, MD_EINVAL, "CUDA layernorm: bad shape [%d, %d]", rows, dim);
    if (rows == 0)
        return 0;
    int threads = dim >= 4096 ? 1024 : dim >= 1024 ? 512 : 128;
    k_layernorm<<<rows, threads, 0, c->stream>>>(x, w, b, eps, dim, out);
    return CUDA_LAUNCHED(c, "layernorm", e);
}

/* 0.5 x (1 + erf(x / sqrt 2)) with the device's erff (error <= 2 ulp). */
__global__ void k_gelu_erf(float *x, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = x[i];
        x[i] = 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
    }
}

int cuda_gelu_erf(cuda_ctx *c, float *x, int64_t n, md_err *e) {
    CUDA_GUARD(c, e);
    if (n <= 0)
        return n == 0 ? 0 : md_errf(e, MD_EINVAL, "CUDA gelu_erf: negative size");
    k_gelu_erf<<<cuda_blocks(n, 256), 256, 0, c->stream>>>(x, n);
    return CUDA_LAUNCHED(c, "gelu_erf", e);
}

/* One thread per (token, 32-element group): out[t] += row ids[t] + offset of the table. The
 * host checked every row; one outside the table adds nothing. */
template <int T>
__global__ void k_add_rows(const uint8_t *table, size_t row_bytes, int64_t n_rows, int dim,
                           const int32_t *ids, int offset, int n, float *out) {
    int groups = dim / 32;
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)n * groups)
        return;
    int t = (int)(i / groups), g = (int)(i % groups);
    int64_t r = (int64_t)ids[t] + offset;
    if (r < 0 || r >= n_rows)
        return;
    float v[32];
    dq32<T>(table + (size_t)r * row_bytes, g, v);
    float *o = out + (int64_t)t * dim + g * 32;
    for (int j = 0; j < 32; j++)
        o[j] += v[j];
}

int cuda_add_rows(cuda_ctx *c, const void *table, int gtype, int64_t n_rows, int dim,
                  const int32_t *ids, int offset, int n, float *out, md_err *e) {
    CUDA_GUARD(c, e);
    int b = qt_block_elems(gtype);
    if (b == 0)
        return md_errf(e, MD_EUNSUPP, "CUDA add_rows: ggml type %d is not supported", gtype);
    if (dim <= 0 || dim % b || dim % 32)
        return md_errf(e, MD_EINVAL, "CUDA add_rows: row length %d is not a multiple of %d", dim,
                       b > 32 ? b : 32);
    if (n <= 0)
        return n == 0 ? 0 : md_errf(e, MD_EINVAL, "CUDA add_rows: negative count");
    int64_t work = (int64_t)n * (dim / 32);
    size_t rb = md_type_row_bytes(gtype, dim);
    const uint8_t *tb = (const uint8_t *)table;
    QT_DISPATCH(gtype, k_add_rows<QT><<<cuda_blocks(work, 128), 128, 0, c->stream>>>(
                           tb, rb, n_rows, dim, ids, offset, n, out));
    return CUDA_LAUNCHED(c, "add_rows", e);
}

/* ---- bidirectional attention over packed sequences ------------------------------------ */

#define ENC_WARPS 4
#define ENC_TK 32 /* keys per K/V tile: lane j scores key j */

/* Block per (tile, head): up to CUDA_ENC_TILE_Q queries of one sequence against every key of
 * that sequence, FlashAttention's online softmax (attn_online.cuh, as k_attn_pf) over K/V tiles
 * staged in shared memory as k_attn_pf does (K rows padded by one against bank conflicts), in f32
 * throughout. Warp w owns queries w, w + 4, ...; lane l owns output dims l * D .. l * D + D - 1.
 * Head dims up to 32 * D are zero-padded in shared memory (any head_dim <= 128). q, k, v, out
 * [T][n_heads] [head_dim]; tiles int32 [n][4] = {first row of the sequence, its length, first query
 * row, queries}. */
template <int D>
__global__ void __launch_bounds__(ENC_WARPS * 32)
    k_attn_enc(const float *q, const float *k, const float *v, const int32_t *tiles, int n_heads,
               int head_dim, float scale, float *out) {
    constexpr int HD = D * 32, TQ = CUDA_ENC_TILE_Q, QW = TQ / ENC_WARPS;
    __shared__ float sq[TQ][HD], sk[ENC_TK][HD + 1], sv[ENC_TK][HD];
    int tile = blockIdx.x, h = blockIdx.y;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int s0 = tiles[tile * 4], len = tiles[tile * 4 + 1], q0 = tiles[tile * 4 + 2],
        nq = tiles[tile * 4 + 3];
    int64_t stride = (int64_t)n_heads * head_dim, hoff = (int64_t)h * head_dim;
    for (int i = threadIdx.x; i < TQ * HD; i += blockDim.x) {
        int r = i / HD, d = i % HD;
        sq[r][d] = r < nq && d < head_dim ? q[(q0 + r) * stride + hoff + d] * scale : 0.0f;
    }
    float m[QW], l[QW], acc[QW][D];
    attn_online_init(m, l, acc);
    for (int kt = 0; kt < len; kt += ENC_TK) {
        __syncthreads();
        for (int i = threadIdx.x; i < ENC_TK * HD; i += blockDim.x) {
            int r = i / HD, d = i % HD;
            float kx = 0.0f, vx = 0.0f;
            if (kt + r < len && d < head_dim) {
                int64_t o = (s0 + kt + r) * stride + hoff + d;
                kx = k[o];
                vx = v[o];
            }
            sk[r][d] = kx;
            sv[r][d] = vx;
        }
        __syncthreads();
#pragma unroll
        for (int i = 0; i < QW; i++) {
            int qi = warp + i * ENC_WARPS;
            if (qi >= nq)
                break;
            float s = -FLT_MAX;
            if (kt + lane < len) {
                s = attn_tile_dot<HD>(sq[qi], sk[lane]);
            }
            int nk = len - kt < ENC_TK ? len - kt : ENC_TK;
            attn_online_step<D, false>(s, m[i], l[i], acc[i], &sv[0][0], HD, nk, lane);
        }
    }
#pragma unroll
    for (int i = 0; i < QW; i++) {
        int qi = warp + i * ENC_WARPS;
        if (qi >= nq)
            break;
        float inv = 1.0f / l[i]; /* l >= 1: the largest score contributes exp(0) */
        float *o = out + (q0 + qi) * stride + hoff;
#pragma unroll
        for (int d = 0; d < D; d++)
            if (lane * D + d < head_dim)
                o[lane * D + d] = acc[i][d] * inv;
    }
}

/* One instance per head-dimension bucket (32 * D). */
template <int D>
static void launch_attn_enc(cudaStream_t st, dim3 grid, const float *q, const float *k,
                            const float *v, const int32_t *tiles, int n_heads, int head_dim,
                            float scale, float *out) {
    k_attn_enc<D><<<grid, ENC_WARPS * 32, 0, st>>>(q, k, v, tiles, n_heads, head_dim, scale, out);
}

int cuda_attn_enc(cuda_ctx *c, const float *q, const float *k, const float *v, const int32_t *tiles,
                  int n_tiles, int n_heads, int head_dim, float scale, float *out, md_err *e) {
    CUDA_GUARD(c, e);
    if (n_tiles < 0 || n_heads < 1 || head_dim < 1 || head_dim > CUDA_ENC_MAX_HEAD_DIM)
        return md_errf(e, MD_EINVAL,
                       "CUDA encoder attention: %d tiles of %d heads of %d dims (at most %d)",
                       n_tiles, n_heads, head_dim, CUDA_ENC_MAX_HEAD_DIM);
    if (n_tiles == 0)
        return 0;
    dim3 grid(n_tiles, n_heads);
    void (*launch[4])(cudaStream_t, dim3, const float *, const float *, const float *,
                      const int32_t *, int, int, float, float *) = {
        launch_attn_enc<1>, launch_attn_enc<2>, launch_attn_enc<3>, launch_attn_enc<4>};
    launch[(head_dim + 31) / 32 - 1](c->stream, grid, q, k, v, tiles, n_heads, head_dim, scale,
                                     out);
    return CUDA_LAUNCHED(c, "attention (encoder)", e);
}

/* ---- pooling -------------------------------------------------------------------------- */

/* Block per sequence (seqs int32 [n][2] = {first row, rows}); thread per column, the rows
 * summed in order as the host does (engine/embedder.c md_pool), then the row's L2 norm over
 * the block and the division by max(norm, 1e-12) (sentence-transformers' Normalize). */
__global__ void k_pool_enc(const float *x, const int32_t *seqs, int dim, int mode, int normalize,
                           float *out) {
    __shared__ float sh[32];
    int s = blockIdx.x, r0 = seqs[2 * s], n = seqs[2 * s + 1];
    float *o = out + (int64_t)s * dim;
    float ss = 0.0f;
    for (int c = threadIdx.x; c < dim; c += blockDim.x) {
        float v;
        if (mode == CUDA_POOL_CLS || mode == CUDA_POOL_LAST) {
            v = x[(int64_t)(mode == CUDA_POOL_CLS ? r0 : r0 + n - 1) * dim + c];
        } else {
            v = mode == CUDA_POOL_MAX ? -INFINITY : 0.0f;
            for (int t = 0; t < n; t++) {
                float y = x[(int64_t)(r0 + t) * dim + c];
                v = mode == CUDA_POOL_MAX ? (y > v ? y : v) : v + y;
            }
            if (mode == CUDA_POOL_MEAN)
                v /= (float)n;
            else if (mode == CUDA_POOL_MEAN_SQRT)
                v /= sqrtf((float)n);
        }
        o[c] = v;
        ss += v * v;
    }
    if (!normalize)
        return;
    ss = cuda_block_sum(ss, sh);
    if (ss > 0.0f) {
        float norm = fmaxf(sqrtf(ss), 1e-12f);
        for (int c = threadIdx.x; c < dim; c += blockDim.x)
            o[c] /= norm;
    }
}

int cuda_pool_enc(cuda_ctx *c, const float *x, const int32_t *seqs, int n_seqs, int dim, int mode,
                  int normalize, float *out, md_err *e) {
    CUDA_GUARD(c, e);
    if (n_seqs < 0 || dim <= 0 || mode < CUDA_POOL_MEAN || mode > CUDA_POOL_LAST)
        return md_errf(e, MD_EINVAL, "CUDA pool: %d sequences of %d, mode %d", n_seqs, dim, mode);
    if (n_seqs == 0)
        return 0;
    k_pool_enc<<<n_seqs, 128, 0, c->stream>>>(x, seqs, dim, mode, normalize, out);
    return CUDA_LAUNCHED(c, "pool", e);
}
