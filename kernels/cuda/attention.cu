/* attention.cu — attention over the paged KV cache.
 *
 * Writes: k_kv_write stores rotated k and v rows into their slots; k_rope_kv rotates q and
 * k and stores k and v in one launch (the rotation is k_rope's, cuda_rope_pair).
 *
 * Cache: K and V of one layer are [n_slots][n_kv_heads][head_dim] in f32, f16 or bf16; a
 * sequence's token at position p lives in slot block_table[row][p / bt] * bt + p % bt.
 *
 * Decode (one query per sequence) is bound by reading K/V, so it is split over the KV
 * range (flash-decoding): block (entry, kv head, split) streams its keys once for all the
 * query heads that share that kv head (GQA), keeping an online softmax per query head;
 * a second kernel merges the splits (with one split the block writes the output itself).
 * Prefill tiles queries (up to 16 of one sequence) and
 * keys with the online softmax of FlashAttention, causal masking by position: on f16 and
 * bf16 caches at head_dim 64 and 128, k_attn_pf_tc computes Q K^T and P V on the tensor
 * cores (mma.sync m16n8k16, f32 accumulation; q and the probabilities rounded to the
 * cache's type, as FlashAttention does), one warp per query head and the K/V tiles staged
 * once for the query heads that share a kv head; otherwise (f32 caches, head_dim 256, or
 * MEDLEY_CUDA_ATTN_TC=0) k_attn_pf does it in f32 on the CUDA cores. Head dims 64, 128 and
 * 256. */
#include "kernels/cuda/cuda_internal.h"
#include "kernels/cuda/attn_online.cuh"

#define DEC_WARPS 4
#define DEC_KU 2 /* keys per decode warp per iteration */
#define MAX_GQA 8

template <int CT> __device__ __forceinline__ float ld_kv(const void *p, int64_t i) {
    if (CT == CUDA_F32)
        return ((const float *)p)[i];
    if (CT == CUDA_BF16)
        return cuda_bf16_to_f(((const uint16_t *)p)[i]);
    return cuda_f16_to_f(((const uint16_t *)p)[i]);
}

/* D consecutive elements of a cache row from element i (i a multiple of D, so the widest
 * load that D elements fill is aligned: 16 bytes for 8 halves or 4 floats). */
template <int CT, int D>
__device__ __forceinline__ void ld_kv_vec(const void *p, int64_t i, float *out) {
    static_assert(D == 2 || D == 4 || D == 8, "head_dim 64, 128 or 256");
    if constexpr (CT == CUDA_F32) {
        const float *f = (const float *)p + i;
        if constexpr (D % 4 == 0) {
#pragma unroll
            for (int c = 0; c < D; c += 4) {
                float4 v = *(const float4 *)(f + c);
                out[c] = v.x, out[c + 1] = v.y, out[c + 2] = v.z, out[c + 3] = v.w;
            }
        } else {
            float2 v = *(const float2 *)f;
            out[0] = v.x, out[1] = v.y;
        }
    } else {
        const uint16_t *h = (const uint16_t *)p + i;
        uint16_t raw[D];
        if constexpr (D == 8)
            *(uint4 *)raw = *(const uint4 *)h;
        else if constexpr (D == 4)
            *(uint2 *)raw = *(const uint2 *)h;
        else
            *(uint32_t *)raw = *(const uint32_t *)h;
#pragma unroll
        for (int c = 0; c < D; c++)
            out[c] = CT == CUDA_BF16 ? cuda_bf16_to_f(raw[c]) : cuda_f16_to_f(raw[c]);
    }
}

__device__ __forceinline__ int64_t kv_slot(const int32_t *bt_row, int p, int block_tokens) {
    return (int64_t)bt_row[p / block_tokens] * block_tokens + p % block_tokens;
}

__global__ void k_kv_write(void *kc, void *vc, cuda_dtype ct, const float *k, const float *v,
                           const int32_t *slots, int n_tokens, int kv_dim) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)n_tokens * kv_dim)
        return;
    int t = (int)(i / kv_dim), d = (int)(i % kv_dim);
    if (slots[t] < 0) /* a padding row of a decode step: stores nothing */
        return;
    int64_t o = (int64_t)slots[t] * kv_dim + d;
    cuda_store(kc, ct, o, k[i]);
    cuda_store(vc, ct, o, v[i]);
}

int cuda_attn_shape_ok(int n_heads, int n_kv_heads, int head_dim, cuda_dtype dtype, md_err *e) {
    if (head_dim != 64 && head_dim != 128 && head_dim != 256)
        return md_errf(e, MD_EUNSUPP,
                       "CUDA attention: head_dim %d is not supported (64, 128 or 256)", head_dim);
    if (n_kv_heads <= 0 || n_heads <= 0 || n_heads % n_kv_heads || n_heads / n_kv_heads > MAX_GQA)
        return md_errf(e, MD_EUNSUPP,
                       "CUDA attention: %d query heads over %d kv heads is not supported "
                       "(a whole number of query heads per kv head, at most %d)",
                       n_heads, n_kv_heads, MAX_GQA);
    if (dtype != CUDA_F32 && dtype != CUDA_F16 && dtype != CUDA_BF16)
        return md_errf(e, MD_EUNSUPP, "CUDA attention: cache type %d", (int)dtype);
    return 0;
}

int cuda_kv_write(cuda_ctx *c, void *k_cache, void *v_cache, cuda_dtype dtype, int kv_dim,
                  const float *k, const float *v, const int32_t *slots, int n_tokens, md_err *e) {
    CUDA_GUARD(c, e);
    if (dtype != CUDA_F32 && dtype != CUDA_F16 && dtype != CUDA_BF16)
        return md_errf(e, MD_EUNSUPP, "CUDA kv_write: cache type %d", (int)dtype);
    if (n_tokens < 0 || kv_dim <= 0)
        return md_errf(e, MD_EINVAL, "CUDA kv_write: bad shape [%d, %d]", n_tokens, kv_dim);
    int64_t n = (int64_t)n_tokens * kv_dim;
    if (n == 0)
        return 0;
    k_kv_write<<<cuda_blocks(n, 256), 256, 0, c->stream>>>(k_cache, v_cache, dtype, k, v, slots,
                                                           n_tokens, kv_dim);
    return CUDA_LAUNCHED(c, "kv_write", e);
}

/* RoPE of q and k and the KV store of one layer in one launch (backend.h rope_kv): one
 * thread per (token, head, pair of head_dim / 2), heads being the n_heads query heads then
 * the n_kv_heads key heads. A query thread rotates its pair in place (threads past
 * rot_dim / 2 have nothing to do). A key thread owns two dims of its head: a rotated pair
 * (pairs as k_rope's) or, past rot_dim / 2, dims rot_dim + 2j and + 1 passed through; it
 * stores them into the cache slot, and the value elements of the same two dims beside them,
 * so every dim of k and v reaches the cache once. k itself is not written. */
__global__ void k_rope_kv(float *q, const float *k, const float *v, void *kc, void *vc,
                          cuda_dtype ct, const int32_t *pos, const int32_t *slots, int n_tokens,
                          int n_heads, int n_kv_heads, int head_dim, int rot_dim,
                          const float *inv_freq, int neox) {
    int pairs = head_dim / 2, half = rot_dim / 2, nh = n_heads + n_kv_heads;
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)n_tokens * nh * pairs)
        return;
    int p = (int)(i % pairs);
    int64_t th = i / pairs;
    int h = (int)(th % nh), t = (int)(th / nh);
    int a = p < half ? (neox ? p : 2 * p) : rot_dim + 2 * (p - half);
    int b = p < half ? (neox ? p + half : 2 * p + 1) : a + 1;
    if (h < n_heads) {
        if (p < half) {
            float *x = q + ((int64_t)t * n_heads + h) * head_dim;
            cuda_rope_pair(x[a], x[b], pos[t], inv_freq[p], &x[a], &x[b]);
        }
        return;
    }
    if (slots[t] < 0) /* a padding row of a decode step: stores nothing */
        return;
    int kv_dim = n_kv_heads * head_dim, hk = (h - n_heads) * head_dim;
    const float *kr = k + (int64_t)t * kv_dim + hk, *vr = v + (int64_t)t * kv_dim + hk;
    int64_t o = (int64_t)slots[t] * kv_dim + hk;
    float k0 = kr[a], k1 = kr[b];
    if (p < half)
        cuda_rope_pair(k0, k1, pos[t], inv_freq[p], &k0, &k1);
    cuda_store(kc, ct, o + a, k0);
    cuda_store(kc, ct, o + b, k1);
    cuda_store(vc, ct, o + a, vr[a]);
    cuda_store(vc, ct, o + b, vr[b]);
}

int cuda_rope_kv(cuda_ctx *c, float *q, const float *k, const float *v, void *k_cache,
                 void *v_cache, cuda_dtype dtype, const int32_t *pos, const int32_t *slots,
                 int n_tokens, int n_heads, int n_kv_heads, int head_dim, int rot_dim,
                 const float *inv_freq, int neox, md_err *e) {
    CUDA_GUARD(c, e);
    if (dtype != CUDA_F32 && dtype != CUDA_F16 && dtype != CUDA_BF16)
        return md_errf(e, MD_EUNSUPP, "CUDA rope_kv: cache type %d", (int)dtype);
    if (n_tokens < 0 || n_heads <= 0 || n_kv_heads <= 0 || head_dim <= 0 || head_dim % 2 ||
        rot_dim <= 0 || rot_dim % 2 || rot_dim > head_dim)
        return md_errf(e, MD_EINVAL,
                       "CUDA rope_kv: bad shape (heads %d, kv heads %d, head_dim %d, rot_dims %d)",
                       n_heads, n_kv_heads, head_dim, rot_dim);
    int64_t n = (int64_t)n_tokens * (n_heads + n_kv_heads) * (head_dim / 2);
    if (n == 0)
        return 0;
    k_rope_kv<<<cuda_blocks(n, 256), 256, 0, c->stream>>>(q, k, v, k_cache, v_cache, dtype, pos,
                                                          slots, n_tokens, n_heads, n_kv_heads,
                                                          head_dim, rot_dim, inv_freq, neox);
    return CUDA_LAUNCHED(c, "rope_kv", e);
}

/* ---- decode --------------------------------------------------------------------------- */

/* Per (entry, head, split) partial: m, l, then acc[head_dim]. */
size_t cuda_attn_decode_work_bytes(int n, int n_heads, int head_dim, int n_splits) {
    return (size_t)n * n_heads * n_splits * (2 + head_dim) * sizeof(float);
}

/* DEC_KU keys of the warp (p0, p0 + DEC_WARPS, ...; zeros from k1 on): this lane's D dims
 * of K and V, and the GM query heads' scores summed over the warp. Their loads are in flight
 * together and their GM x DEC_KU warp sums interleave. */
template <int CT, int D, int GM>
__device__ __forceinline__ void dec_keys(const void *kc, const void *vc, const int32_t *bt,
                                         int block_tokens, int n_kv_heads, int kvh, int lane,
                                         int p0, int k1, const float (&qv)[GM][D],
                                         float (&vv)[DEC_KU][D], float (&s)[DEC_KU][GM]) {
    const int HD = D * 32;
    float kk[DEC_KU][D];
#pragma unroll
    for (int j = 0; j < DEC_KU; j++) {
        int p = p0 + j * DEC_WARPS;
        if (p < k1) {
            int64_t base = (kv_slot(bt, p, block_tokens) * n_kv_heads + kvh) * HD + lane * D;
            ld_kv_vec<CT, D>(kc, base, kk[j]);
            ld_kv_vec<CT, D>(vc, base, vv[j]);
        } else {
#pragma unroll
            for (int d = 0; d < D; d++)
                kk[j][d] = vv[j][d] = 0.0f;
        }
    }
#pragma unroll
    for (int j = 0; j < DEC_KU; j++)
#pragma unroll
        for (int g = 0; g < GM; g++) {
            float a = 0.0f;
#pragma unroll
            for (int d = 0; d < D; d++)
                a += qv[g][d] * kk[j][d];
            s[j][g] = a;
        }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
#pragma unroll
        for (int j = 0; j < DEC_KU; j++)
#pragma unroll
            for (int g = 0; g < GM; g++)
                s[j][g] += __shfl_xor_sync(0xffffffffu, s[j][g], o);
}

/* The online softmax takes the keys one by one (those before k1), so the result is the same
 * as one key at a time: per query head g < G, the max m, the sum l and acc move on. */
template <int D, int GM>
__device__ __forceinline__ void dec_online(float (&m)[GM], float (&l)[GM], float (&acc)[GM][D],
                                           const float (&vv)[DEC_KU][D],
                                           const float (&s)[DEC_KU][GM], int G, int p0, int k1) {
#pragma unroll
    for (int j = 0; j < DEC_KU; j++) {
        if (p0 + j * DEC_WARPS >= k1)
            break;
#pragma unroll
        for (int g = 0; g < GM; g++) {
            if (g >= G)
                break;
            float mn = fmaxf(m[g], s[j][g]), corr = __expf(m[g] - mn), pw = __expf(s[j][g] - mn);
            l[g] = l[g] * corr + pw;
#pragma unroll
            for (int d = 0; d < D; d++)
                acc[g][d] = acc[g][d] * corr + pw * vv[j][d];
            m[g] = mn;
        }
    }
}

/* Merge the block's warps (their m, l, acc of one query head staged in sm, sl, sacc) into
 * wo: the output itself with one split (one, as k_attn_dec_merge would from this one
 * partial, its weight exp(0) = 1), else the partial {mx, ls, acc} at wo[-2], wo[-1], wo. */
template <int D>
__device__ __forceinline__ void dec_merge_warps(const float *sm, const float *sl,
                                                const float (*sacc)[D * 32], int one, float *wo) {
    const int HD = D * 32;
    float mx = -FLT_MAX;
    for (int w = 0; w < DEC_WARPS; w++)
        mx = fmaxf(mx, sm[w]);
    float ls = 0.0f;
    for (int w = 0; w < DEC_WARPS; w++)
        if (sl[w] > 0.0f)
            ls += sl[w] * __expf(sm[w] - mx);
    float inv = one && ls > 0.0f ? 1.0f / ls : 0.0f;
    for (int d = threadIdx.x; d < HD; d += blockDim.x) {
        float a = 0.0f;
        for (int w = 0; w < DEC_WARPS; w++)
            if (sl[w] > 0.0f)
                a += sacc[w][d] * __expf(sm[w] - mx);
        wo[d] = one ? a * inv : a;
    }
    if (!one && threadIdx.x == 0) {
        wo[-2] = mx;
        wo[-1] = ls;
    }
}

/* D = head_dim / 32 dims per lane; GM >= G = n_heads / n_kv_heads query heads per kv head,
 * the register arrays' size (launch_dec picks the smallest of 1, 2, 4, 8 that holds G, so a
 * Llama-3-8B group of 4 keeps 4 heads in registers, not MAX_GQA). The warp's keys p = k0 +
 * warp, + DEC_WARPS, ... in order, DEC_KU at a time (dec_keys, dec_online); then the warps
 * merged through shared memory, one query head at a time (dec_merge_warps). */
template <int CT, int D, int GM>
__global__ void __launch_bounds__(DEC_WARPS * 32)
    k_attn_dec(const void *kc, const void *vc, int n_kv_heads, int block_tokens, const float *q,
               const int32_t *dec, const int32_t *block_table, int max_blocks, int n_heads,
               float scale, int n_splits, float *work, float *out) {
    const int HD = D * 32;
    int entry = blockIdx.x, kvh = blockIdx.y, split = blockIdx.z;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int G = n_heads / n_kv_heads;
    int qrow = dec[entry * 3], btrow = dec[entry * 3 + 1], L = dec[entry * 3 + 2];
    int chunk = (L + n_splits - 1) / n_splits;
    int k0 = split * chunk, k1 = min(L, k0 + chunk);
    const int32_t *bt = block_table + (int64_t)btrow * max_blocks;

    float qv[GM][D], acc[GM][D], m[GM], l[GM];
#pragma unroll
    for (int g = 0; g < GM; g++) {
        m[g] = -FLT_MAX;
        l[g] = 0.0f;
#pragma unroll
        for (int d = 0; d < D; d++) {
            acc[g][d] = 0.0f;
            qv[g][d] = g < G
                           ? q[((int64_t)qrow * n_heads + kvh * G + g) * HD + lane * D + d] * scale
                           : 0.0f;
        }
    }
    for (int p0 = k0 + warp; p0 < k1; p0 += DEC_KU * DEC_WARPS) {
        float vv[DEC_KU][D], s[DEC_KU][GM];
        dec_keys<CT, D, GM>(kc, vc, bt, block_tokens, n_kv_heads, kvh, lane, p0, k1, qv, vv, s);
        dec_online<D, GM>(m, l, acc, vv, s, G, p0, k1);
    }
    __shared__ float sm[DEC_WARPS], sl[DEC_WARPS], sacc[DEC_WARPS][HD];
#pragma unroll
    for (int g = 0; g < GM; g++) {
        if (g >= G)
            break;
        if (lane == 0) {
            sm[warp] = m[g];
            sl[warp] = l[g];
        }
#pragma unroll
        for (int d = 0; d < D; d++)
            sacc[warp][lane * D + d] = acc[g][d];
        __syncthreads();
        int one = n_splits == 1;
        float *wo =
            one ? out + ((int64_t)qrow * n_heads + kvh * G + g) * HD
                : work + (((int64_t)entry * n_heads + kvh * G + g) * n_splits + split) * (2 + HD) +
                      2;
        dec_merge_warps<D>(sm, sl, sacc, one, wo);
        __syncthreads();
    }
}

/* Block per (entry, head): merge the splits' partials into out. */
__global__ void k_attn_dec_merge(const float *work, const int32_t *dec, int n_heads, int head_dim,
                                 int n_splits, float *out) {
    int entry = blockIdx.x, h = blockIdx.y;
    const float *w = work + ((int64_t)entry * n_heads + h) * n_splits * (2 + head_dim);
    float mx = -FLT_MAX, ls = 0.0f;
    for (int s = 0; s < n_splits; s++)
        if (w[s * (2 + head_dim) + 1] > 0.0f)
            mx = fmaxf(mx, w[s * (2 + head_dim)]);
    for (int s = 0; s < n_splits; s++) {
        const float *ws = w + s * (2 + head_dim);
        if (ws[1] > 0.0f)
            ls += ws[1] * __expf(ws[0] - mx);
    }
    float inv = ls > 0.0f ? 1.0f / ls : 0.0f;
    float *o = out + ((int64_t)dec[entry * 3] * n_heads + h) * head_dim;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float a = 0.0f;
        for (int s = 0; s < n_splits; s++) {
            const float *ws = w + s * (2 + head_dim);
            if (ws[1] > 0.0f)
                a += ws[2 + d] * __expf(ws[0] - mx);
        }
        o[d] = a * inv;
    }
}

/* The register arrays' size for G query heads per kv head: 1, 2, 4 or MAX_GQA. */
static inline int dec_gm(int G) {
    return G <= 1 ? 1 : G <= 2 ? 2 : G <= 4 ? 4 : MAX_GQA;
}
/* The kernel for head_dim D * 32 holding dec_gm(G) query heads per kv head. */
template <int CT, int D>
static void launch_dec_d(cudaStream_t st, const cuda_kv_layer *kv, dim3 grid, const float *q,
                         const int32_t *dec, const int32_t *bt, int mb, int nh, float scale, int ns,
                         float *work, float *out) {
    const void *k = kv->k, *v = kv->v;
    int nkv = kv->n_kv_heads, btk = kv->block_tokens;
    switch (dec_gm(nh / nkv)) {
    case 1:
        k_attn_dec<CT, D, 1><<<grid, DEC_WARPS * 32, 0, st>>>(k, v, nkv, btk, q, dec, bt, mb, nh,
                                                              scale, ns, work, out);
        break;
    case 2:
        k_attn_dec<CT, D, 2><<<grid, DEC_WARPS * 32, 0, st>>>(k, v, nkv, btk, q, dec, bt, mb, nh,
                                                              scale, ns, work, out);
        break;
    case 4:
        k_attn_dec<CT, D, 4><<<grid, DEC_WARPS * 32, 0, st>>>(k, v, nkv, btk, q, dec, bt, mb, nh,
                                                              scale, ns, work, out);
        break;
    default:
        k_attn_dec<CT, D, MAX_GQA><<<grid, DEC_WARPS * 32, 0, st>>>(k, v, nkv, btk, q, dec, bt, mb,
                                                                    nh, scale, ns, work, out);
        break;
    }
}

template <int CT>
static void launch_dec(cudaStream_t st, const cuda_kv_layer *kv, dim3 grid, const float *q,
                       const int32_t *dec, const int32_t *bt, int max_blocks, int n_heads,
                       float scale, int n_splits, float *work, float *out) {
    switch (kv->head_dim) {
    case 64:
        launch_dec_d<CT, 2>(st, kv, grid, q, dec, bt, max_blocks, n_heads, scale, n_splits, work,
                            out);
        break;
    case 128:
        launch_dec_d<CT, 4>(st, kv, grid, q, dec, bt, max_blocks, n_heads, scale, n_splits, work,
                            out);
        break;
    default:
        launch_dec_d<CT, 8>(st, kv, grid, q, dec, bt, max_blocks, n_heads, scale, n_splits, work,
                            out);
        break;
    }
}

int cuda_attn_decode(cuda_ctx *c, const cuda_kv_layer *kv, const float *q, const int32_t *dec,
                     int n, const int32_t *block_table, int max_blocks, int n_heads, float scale,
                     int n_splits, void *work, float *out, md_err *e) {
    CUDA_GUARD(c, e);
    int rc = cuda_attn_shape_ok(n_heads, kv->n_kv_heads, kv->head_dim, kv->dtype, e);
    if (rc)
        return rc;
    if (kv->block_tokens <= 0)
        return md_errf(e, MD_EINVAL, "CUDA attention: blocks of %d tokens", kv->block_tokens);
    if (n_splits < 1 || n_splits > 1024)
        return md_errf(e, MD_EINVAL, "CUDA attention: %d splits", n_splits);
    if (n <= 0)
        return n == 0 ? 0 : md_errf(e, MD_EINVAL, "CUDA attention: negative count");
    dim3 grid(n, kv->n_kv_heads, n_splits);
    float *w = (float *)work;
    if (kv->dtype == CUDA_F32)
        launch_dec<CUDA_F32>(c->stream, kv, grid, q, dec, block_table, max_blocks, n_heads, scale,
                             n_splits, w, out);
    else if (kv->dtype == CUDA_F16)
        launch_dec<CUDA_F16>(c->stream, kv, grid, q, dec, block_table, max_blocks, n_heads, scale,
                             n_splits, w, out);
    else
        launch_dec<CUDA_BF16>(c->stream, kv, grid, q, dec, block_table, max_blocks, n_heads, scale,
                              n_splits, w, out);
    if (n_splits > 1) /* one split wrote out itself */
        k_attn_dec_merge<<<dim3(n, n_heads), 128, 0, c->stream>>>(w, dec, n_heads, kv->head_dim,
                                                                  n_splits, out);
    return CUDA_LAUNCHED(c, "attention (decode)", e);
}

/* ---- prefill -------------------------------------------------------------------------- */

#define PF_WARPS 4

/* Block per (tile, query head). Warp w owns queries w, w + 4, ... of the tile; K/V tiles of
 * TK keys are staged in shared memory as f32 (K rows padded by one to avoid bank conflicts);
 * lane j scores key j of the tile, then the warp updates its queries' online softmax and
 * lane-owned output dims. */
template <int CT, int D>
__global__ void __launch_bounds__(PF_WARPS * 32)
    k_attn_pf(const void *kc, const void *vc, int n_kv_heads, int block_tokens, const float *q,
              const int32_t *tiles, const int32_t *block_table, int max_blocks, int n_heads,
              float scale, float *out) {
    constexpr int HD = D * 32, TK = D == 8 ? 8 : 32, TQ = CUDA_ATTN_TILE_Q;
    __shared__ float sq[TQ][HD], sk[TK][HD + 1], sv[TK][HD];
    int tile = blockIdx.x, h = blockIdx.y, kvh = h / (n_heads / n_kv_heads);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int btrow = tiles[tile * 4], t0 = tiles[tile * 4 + 1], nq = tiles[tile * 4 + 2],
        p0 = tiles[tile * 4 + 3];
    const int32_t *bt = block_table + (int64_t)btrow * max_blocks;
    for (int i = threadIdx.x; i < TQ * HD; i += blockDim.x) {
        int r = i / HD, d = i % HD;
        sq[r][d] = r < nq ? q[((int64_t)(t0 + r) * n_heads + h) * HD + d] * scale : 0.0f;
    }
    constexpr int QW = TQ / PF_WARPS; /* queries per warp */
    float m[QW], l[QW], acc[QW][D];
    attn_online_init(m, l, acc);
    int kend = p0 + nq; /* keys 0 .. p0 + nq - 1 */
    for (int kt = 0; kt < kend; kt += TK) {
        __syncthreads();
        for (int i = threadIdx.x; i < TK * HD; i += blockDim.x) {
            int r = i / HD, d = i % HD, p = kt + r;
            float kx = 0.0f, vx = 0.0f;
            if (p < kend) {
                int64_t o = (kv_slot(bt, p, block_tokens) * n_kv_heads + kvh) * HD + d;
                kx = ld_kv<CT>(kc, o);
                vx = ld_kv<CT>(vc, o);
            }
            sk[r][d] = kx;
            sv[r][d] = vx;
        }
        __syncthreads();
#pragma unroll
        for (int i = 0; i < QW; i++) {
            int qi = warp + i * PF_WARPS;
            if (qi >= nq)
                break;
            int qpos = p0 + qi;
            float s = -FLT_MAX;
            if (lane < TK && kt + lane <= qpos) {
                s = attn_tile_dot<HD>(sq[qi], sk[lane]);
            }
            attn_online_step<D, true>(s, m[i], l[i], acc[i], &sv[0][0], HD, TK, lane);
        }
    }
#pragma unroll
    for (int i = 0; i < QW; i++) {
        int qi = warp + i * PF_WARPS;
        if (qi >= nq)
            break;
        float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
        float *o = out + ((int64_t)(t0 + qi) * n_heads + h) * HD + lane * D;
#pragma unroll
        for (int d = 0; d < D; d++)
            o[d] = acc[i][d] * inv;
    }
}

/* ---- prefill on the tensor cores ----------------------------------------------------------- */

#define PFT_TK 64       /* keys per K/V tile */
#define PFT_PAD 8       /* 16-bit values of padding per shared row: conflict-free fragments */
#define PFT_MAX_WARPS 8 /* query heads per block */

/* d += a . b on one warp's fragments (mma.sync m16n8k16, f16 or bf16 in, f32 accumulate);
 * tests/gpu/emu supplies emu_mma_h16. */
template <int CT>
__device__ __forceinline__ void mma_h16(float *d, const uint32_t *a, const uint32_t *b) {
#if defined(__CUDA_ARCH__)
    if (CT == CUDA_BF16)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                     "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
                     "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#elif !defined(__CUDACC__)
    emu_mma_h16<CT == CUDA_BF16>(d, a, b);
#endif
}

/* Two floats as the cache's 16-bit type, lo in the low half. */
template <int CT> __device__ __forceinline__ uint32_t pack_h2(float lo, float hi) {
    uint32_t a = CT == CUDA_BF16 ? cuda_f_to_bf16(lo) : cuda_f_to_f16(lo);
    uint32_t b = CT == CUDA_BF16 ? cuda_f_to_bf16(hi) : cuda_f_to_f16(hi);
    return a | b << 16;
}

/* Query heads per k_attn_pf_tc block for G query heads per kv head: the largest divisor of
 * G that is at most PFT_MAX_WARPS (the block's heads then share one kv head). */
static inline int pf_tc_heads(int G) {
    int gw = G < PFT_MAX_WARPS ? G : PFT_MAX_WARPS;
    while (G % gw)
        gw--;
    return gw;
}

/* Q rows g and g + 8 of the tile (scaled, as 16-bit pairs) as A fragments of S = Q K^T;
 * zeros for a row past the tile's queries (v0, v8 false). */
template <int CT, int HD>
__device__ __forceinline__ void pf_load_q(uint32_t (&qa)[HD / 16][4], const float *q0,
                                          const float *q8, bool v0, bool v8, int t, float scale) {
#pragma unroll
    for (int kc = 0; kc < HD / 16; kc++) {
        int c = kc * 16 + 2 * t;
        qa[kc][0] = v0 ? pack_h2<CT>(q0[c] * scale, q0[c + 1] * scale) : 0u;
        qa[kc][1] = v8 ? pack_h2<CT>(q8[c] * scale, q8[c + 1] * scale) : 0u;
        qa[kc][2] = v0 ? pack_h2<CT>(q0[c + 8] * scale, q0[c + 9] * scale) : 0u;
        qa[kc][3] = v8 ? pack_h2<CT>(q8[c + 8] * scale, q8[c + 9] * scale) : 0u;
    }
}

/* The block stages keys kt .. kt + PFT_TK of kv head kvh into sk and sv (rows of LD 16-bit
 * values as cached; zeros from kend on). */
template <int HD>
__device__ __forceinline__ void pf_stage_kv(uint16_t *sk, uint16_t *sv, const void *kc,
                                            const void *vc, const int32_t *bt, int block_tokens,
                                            int n_kv_heads, int kvh, int kt, int kend) {
    constexpr int LD = HD + PFT_PAD;
    for (int i = threadIdx.x; i < PFT_TK * (HD / 8); i += blockDim.x) {
        int r = i / (HD / 8), c8 = i % (HD / 8) * 8, p = kt + r;
        uint4 kx = make_uint4(0, 0, 0, 0), vx = kx;
        if (p < kend) {
            int64_t off = (kv_slot(bt, p, block_tokens) * n_kv_heads + kvh) * HD + c8;
            kx = *(const uint4 *)((const uint16_t *)kc + off);
            vx = *(const uint4 *)((const uint16_t *)vc + off);
        }
        *(uint4 *)&sk[r * LD + c8] = kx;
        *(uint4 *)&sv[r * LD + c8] = vx;
    }
}

/* S = Q K^T over the staged keys: n-tile j holds keys 8j + 2t and + 1 of rows g and g + 8;
 * K read as B with one 32-bit load per register. */
template <int CT, int HD>
__device__ __forceinline__ void pf_scores(float (&s)[PFT_TK / 8][4],
                                          const uint32_t (&qa)[HD / 16][4], const uint16_t *sk,
                                          int g, int t) {
    constexpr int LD = HD + PFT_PAD;
#pragma unroll
    for (int j = 0; j < PFT_TK / 8; j++) {
        s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
        const uint16_t *kr = &sk[(8 * j + g) * LD + 2 * t];
#pragma unroll
        for (int kc = 0; kc < HD / 16; kc++) {
            uint32_t b[2] = {*(const uint32_t *)(kr + kc * 16),
                             *(const uint32_t *)(kr + kc * 16 + 8)};
            mma_h16<CT>(s[j], qa[kc], b);
        }
    }
}

/* The causal mask (query positions qp0, qp8; -1: no query), then the online softmax of rows
 * g and g + 8: s becomes P (unnormalised), the row maxima m and partial sums l move on and O
 * is rescaled. The row max is reduced over the lane quad. */
template <int HD>
__device__ __forceinline__ void pf_softmax(float (&s)[PFT_TK / 8][4], float (&o)[HD / 8][4],
                                           float &m0, float &m8, float &l0, float &l8, int kt,
                                           int t, int qp0, int qp8) {
    float mx0 = -FLT_MAX, mx8 = -FLT_MAX;
#pragma unroll
    for (int j = 0; j < PFT_TK / 8; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int p = kt + 8 * j + 2 * t + (i & 1);
            if (p > (i < 2 ? qp0 : qp8))
                s[j][i] = -FLT_MAX;
            if (i < 2)
                mx0 = fmaxf(mx0, s[j][i]);
            else
                mx8 = fmaxf(mx8, s[j][i]);
        }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx8 = fmaxf(mx8, __shfl_xor_sync(0xffffffffu, mx8, 1));
    mx8 = fmaxf(mx8, __shfl_xor_sync(0xffffffffu, mx8, 2));
    float n0 = fmaxf(m0, mx0), n8 = fmaxf(m8, mx8);
    float c0 = __expf(m0 - n0), c8 = __expf(m8 - n8);
    m0 = n0;
    m8 = n8;
    float sum0 = 0.0f, sum8 = 0.0f;
#pragma unroll
    for (int j = 0; j < PFT_TK / 8; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float mm = i < 2 ? n0 : n8;
            float pv = s[j][i] == -FLT_MAX ? 0.0f : __expf(s[j][i] - mm);
            s[j][i] = pv;
            if (i < 2)
                sum0 += pv;
            else
                sum8 += pv;
        }
    l0 = l0 * c0 + sum0;
    l8 = l8 * c8 + sum8;
#pragma unroll
    for (int j = 0; j < HD / 8; j++) {
        o[j][0] *= c0;
        o[j][1] *= c0;
        o[j][2] *= c8;
        o[j][3] *= c8;
    }
}

/* O += P V over the staged values: S's n-tiles are P's A fragments (two per k16 step); O
 * n-tile j holds dims 8j + 2t, + 1; V read with two 16-bit loads per register. */
template <int CT, int HD>
__device__ __forceinline__ void pf_pv(float (&o)[HD / 8][4], const float (&s)[PFT_TK / 8][4],
                                      const uint16_t *sv, int g, int t) {
    constexpr int LD = HD + PFT_PAD;
#pragma unroll
    for (int kk = 0; kk < PFT_TK / 16; kk++) {
        uint32_t pa[4] = {pack_h2<CT>(s[2 * kk][0], s[2 * kk][1]),
                          pack_h2<CT>(s[2 * kk][2], s[2 * kk][3]),
                          pack_h2<CT>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                          pack_h2<CT>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
        const uint16_t *vr = &sv[(16 * kk + 2 * t) * LD + g];
#pragma unroll
        for (int j = 0; j < HD / 8; j++) {
            const uint16_t *x = vr + 8 * j;
            uint32_t b[2] = {(uint32_t)x[0] | (uint32_t)x[LD] << 16,
                             (uint32_t)x[8 * LD] | (uint32_t)x[9 * LD] << 16};
            mma_h16<CT>(o[j], pa, b);
        }
    }
}

/* Rows g and g + 8 of O over their sums (the threads' partial sums reduced over the lane
 * quad), written where they are queries of the tile. */
template <int HD>
__device__ __forceinline__ void pf_store(const float (&o)[HD / 8][4], float l0, float l8, float *o0,
                                         float *o8, bool v0, bool v8) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l8 += __shfl_xor_sync(0xffffffffu, l8, 1);
    l8 += __shfl_xor_sync(0xffffffffu, l8, 2);
    float i0 = l0 > 0.0f ? 1.0f / l0 : 0.0f, i8 = l8 > 0.0f ? 1.0f / l8 : 0.0f;
#pragma unroll
    for (int j = 0; j < HD / 8; j++) {
        if (v0) {
            o0[8 * j] = o[j][0] * i0;
            o0[8 * j + 1] = o[j][1] * i0;
        }
        if (v8) {
            o8[8 * j] = o[j][2] * i8;
            o8[8 * j + 1] = o[j][3] * i8;
        }
    }
}

/* Block per (tile, group of blockDim.x / 32 query heads sharing a kv head); warp w computes
 * head blockIdx.y * heads + w for the tile's up to 16 queries. Fragments (groupID g = lane
 * / 4, t = lane % 4): Q as A of S = Q K^T, rows g and g + 8; S n-tile j holds keys 8j + 2t
 * and + 1 of rows g and g + 8, which is also P's A fragment for P V (two n-tiles per k16
 * step); O n-tile j holds dims 8j + 2t, + 1. K and V rows are staged as cached (16-bit), K
 * read as B with one 32-bit load per register, V with two 16-bit loads. Each thread keeps
 * a partial row sum, the row max is reduced over the lane quad. The steps: pf_load_q, then
 * per K/V tile pf_stage_kv, pf_scores, pf_softmax, pf_pv; pf_store. */
template <int CT, int HD>
__global__ void __launch_bounds__(PFT_MAX_WARPS * 32)
    k_attn_pf_tc(const void *kc, const void *vc, int n_kv_heads, int block_tokens, const float *q,
                 const int32_t *tiles, const int32_t *block_table, int max_blocks, int n_heads,
                 float scale, float *out) {
    constexpr int LD = HD + PFT_PAD;
    __shared__ __align__(16) uint16_t sk[PFT_TK * LD], sv[PFT_TK * LD];
    int heads = blockDim.x >> 5, tile = blockIdx.x, warp = threadIdx.x >> 5,
        lane = threadIdx.x & 31;
    int h = blockIdx.y * heads + warp, kvh = blockIdx.y * heads / (n_heads / n_kv_heads);
    int g = lane >> 2, t = lane & 3;
    int btrow = tiles[tile * 4], t0 = tiles[tile * 4 + 1], nq = tiles[tile * 4 + 2],
        p0 = tiles[tile * 4 + 3];
    const int32_t *bt = block_table + (int64_t)btrow * max_blocks;
    bool v0 = g < nq, v8 = g + 8 < nq;
    const float *q0 = q + ((int64_t)(t0 + (v0 ? g : 0)) * n_heads + h) * HD;
    const float *q8 = q + ((int64_t)(t0 + (v8 ? g + 8 : 0)) * n_heads + h) * HD;
    uint32_t qa[HD / 16][4];
    pf_load_q<CT, HD>(qa, q0, q8, v0, v8, t, scale);
    float o[HD / 8][4];
#pragma unroll
    for (int j = 0; j < HD / 8; j++)
        o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    float m0 = -FLT_MAX, m8 = -FLT_MAX, l0 = 0.0f, l8 = 0.0f;
    int kend = p0 + nq, qp0 = v0 ? p0 + g : -1, qp8 = v8 ? p0 + g + 8 : -1;
    for (int kt = 0; kt < kend; kt += PFT_TK) {
        __syncthreads();
        pf_stage_kv<HD>(sk, sv, kc, vc, bt, block_tokens, n_kv_heads, kvh, kt, kend);
        __syncthreads();
        float s[PFT_TK / 8][4];
        pf_scores<CT, HD>(s, qa, sk, g, t);
        pf_softmax<HD>(s, o, m0, m8, l0, l8, kt, t, qp0, qp8);
        pf_pv<CT, HD>(o, s, sv, g, t);
    }
    float *o0 = out + ((int64_t)(t0 + g) * n_heads + h) * HD + 2 * t;
    float *o8 = out + ((int64_t)(t0 + g + 8) * n_heads + h) * HD + 2 * t;
    pf_store<HD>(o, l0, l8, o0, o8, v0, v8);
}

template <int CT, int HD>
static void launch_pf_tc(cudaStream_t st, const cuda_kv_layer *kv, int n_tiles, const float *q,
                         const int32_t *tiles, const int32_t *bt, int max_blocks, int n_heads,
                         float scale, float *out) {
    int gw = pf_tc_heads(n_heads / kv->n_kv_heads);
    k_attn_pf_tc<CT, HD><<<dim3(n_tiles, n_heads / gw), gw * 32, 0, st>>>(
        kv->k, kv->v, kv->n_kv_heads, kv->block_tokens, q, tiles, bt, max_blocks, n_heads, scale,
        out);
}

template <int CT>
static void launch_pf(cudaStream_t st, const cuda_kv_layer *kv, dim3 grid, const float *q,
                      const int32_t *tiles, const int32_t *bt, int max_blocks, int n_heads,
                      float scale, float *out) {
    switch (kv->head_dim) {
    case 64:
        k_attn_pf<CT, 2><<<grid, PF_WARPS * 32, 0, st>>>(kv->k, kv->v, kv->n_kv_heads,
                                                         kv->block_tokens, q, tiles, bt, max_blocks,
                                                         n_heads, scale, out);
        break;
    case 128:
        k_attn_pf<CT, 4><<<grid, PF_WARPS * 32, 0, st>>>(kv->k, kv->v, kv->n_kv_heads,
                                                         kv->block_tokens, q, tiles, bt, max_blocks,
                                                         n_heads, scale, out);
        break;
    default:
        k_attn_pf<CT, 8><<<grid, PF_WARPS * 32, 0, st>>>(kv->k, kv->v, kv->n_kv_heads,
                                                         kv->block_tokens, q, tiles, bt, max_blocks,
                                                         n_heads, scale, out);
        break;
    }
}

int cuda_attn_prefill(cuda_ctx *c, const cuda_kv_layer *kv, const float *q, const int32_t *tiles,
                      int n_tiles, const int32_t *block_table, int max_blocks, int n_heads,
                      float scale, float *out, md_err *e) {
    CUDA_GUARD(c, e);
    int rc = cuda_attn_shape_ok(n_heads, kv->n_kv_heads, kv->head_dim, kv->dtype, e);
    if (rc)
        return rc;
    if (kv->block_tokens <= 0)
        return md_errf(e, MD_EINVAL, "CUDA attention: blocks of %d tokens", kv->block_tokens);
    if (n_tiles <= 0)
        return n_tiles == 0 ? 0 : md_errf(e, MD_EINVAL, "CUDA attention: negative count");
    /* the tensor cores for f16/bf16 caches at head_dim 64/128 (unless turned off) */
    int tc = c->attn_tc && (kv->dtype == CUDA_F16 || kv->dtype == CUDA_BF16) &&
             (kv->head_dim == 64 || kv->head_dim == 128);
    dim3 grid(n_tiles, n_heads);
    const int32_t *bt = block_table;
    if (tc && kv->dtype == CUDA_F16 && kv->head_dim == 64)
        launch_pf_tc<CUDA_F16, 64>(c->stream, kv, n_tiles, q, tiles, bt, max_blocks, n_heads, scale,
                                   out);
    else if (tc && kv->dtype == CUDA_F16)
        launch_pf_tc<CUDA_F16, 128>(c->stream, kv, n_tiles, q, tiles, bt, max_blocks, n_heads,
                                    scale, out);
    else if (tc && kv->head_dim == 64)
        launch_pf_tc<CUDA_BF16, 64>(c->stream, kv, n_tiles, q, tiles, bt, max_blocks, n_heads,
                                    scale, out);
    else if (tc)
        launch_pf_tc<CUDA_BF16, 128>(c->stream, kv, n_tiles, q, tiles, bt, max_blocks, n_heads,
                                     scale, out);
    else if (kv->dtype == CUDA_F32)
        launch_pf<CUDA_F32>(c->stream, kv, grid, q, tiles, block_table, max_blocks, n_heads, scale,
                            out);
    else if (kv->dtype == CUDA_F16)
        launch_pf<CUDA_F16>(c->stream, kv, grid, q, tiles, block_table, max_blocks, n_heads, scale,
                            out);
    else
        launch_pf<CUDA_BF16>(c->stream, kv, grid, q, tiles, block_table, max_blocks, n_heads, scale,
                             out);
    return CUDA_LAUNCHED(c, "attention (prefill)", e);
}
