/* gemm.cu — y[m][n] = x[m][k] . W[n][k]^T with FP32 accumulation, for every weight type, one
 * weight at a time (cuda_matmul) or several sharing x (cuda_matmul_n: Q/K/V, gate/up with
 * SwiGLU, a product added into the residual stream).
 *
 * Decode (m <= CUDA_GEMV_MAX_M) is bound by reading the weights once, so it runs on own
 * GEMV kernels: one warp per output row, all m tokens at once; BF16/F16 weights are read
 * with 16-byte vector loads against FP32 x; quantized weights stay quantized in device
 * memory and multiply x quantized to int8 (blocks of 32 with a float scale, as the CPU
 * backend quantizes activations): lanes share each weight block (coalesced loads of weight
 * and x), products in int32 by __dp4a, one float scale per block and token. Several weights of one
 * type are one launch over their concatenated rows (a warp finds its weight in a segment
 * table passed by value); the residual add is the epilogue's beta, and gate/up rows are
 * computed by the same warp, which writes silu(gate) * up. Steps of 9 to CUDA_MMQ_MAX_M
 * tokens on quantized weights without a BF16 copy run an int8 tiled product on the blocks
 * rather than expanding them: __dp4a (k_mmq) up to CUDA_MMQ_DP4A_MAX_M tokens, int8
 * mma.sync on the tensor cores (k_mmq_tc) above. Prefill and large batches use
 * cuBLAS GemmEx: x is converted to the weight's 16-bit type (once per type for several
 * weights), a quantized weight is multiplied by its BF16 copy when the caller keeps one
 * (cuda_mm_w.bf16, backend.h weight_shadow) and otherwise first expanded to BF16 in scratch,
 * and the product accumulates in FP32.
 *
 * Kernels are launched through GEMV_LAUNCH, QX_LAUNCH, MMQ_LAUNCH and MMT_LAUNCH and cuBLAS is
 * called only from blas_gemm, so the host code around them also runs on the CPU emulator
 * (tests/gpu/emu), which supplies both. */
#include <limits.h>
#include <stdint.h>

#include "kernels/cuda/quant.cuh"

#define GEMV_WARPS 4
#define GEMV_LAUNCH(kernel, grid, stream, ...)                                                     \
    kernel<<<(grid), GEMV_WARPS * 32, 0, (stream)>>>(__VA_ARGS__)
#define QX_WARPS 8
#define QX_LAUNCH(grid, stream, ...) k_quant_x<<<(grid), QX_WARPS * 32, 0, (stream)>>>(__VA_ARGS__)

/* ---- x quantized for the quantized weights' GEMV ----
 * x [m][k] (k % 32 == 0) as int8 q [m][k] followed by float d [m][k / 32]: per block of 32,
 * d = amax / 127 and q = round-to-nearest-even(x * 127 / amax), the CPU backend's
 * cpu_quant_q8_32. A block holding a NaN or an infinity gets d = NaN, so the products it
 * enters come out NaN (the engine fails a sequence whose logits are not numbers) instead
 * of the value vanishing into int8. */
static size_t qx_bytes(int m, int k) {
    return (size_t)m * k + (size_t)m * (k / 32) * sizeof(float);
}

/* One warp per block of 32, lane i element i. */
__global__ void __launch_bounds__(QX_WARPS * 32)
    k_quant_x(const float *__restrict__ x, int8_t *__restrict__ q, float *__restrict__ d,
              int64_t n_blocks) {
    int64_t b = (int64_t)blockIdx.x * QX_WARPS + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (b >= n_blocks) /* whole warps: b is the same for a warp's lanes */
        return;
    float v = x[b * 32 + lane], a = fabsf(v);
    if (!(a <= FLT_MAX))
        a = __uint_as_float(0x7f800000u); /* NaN and inf: +inf, so the block sees it */
    a = cuda_warp_max(a);
    int qv = 0;
    if (a <= FLT_MAX) {
        float id = a > 0.0f ? 127.0f / a : 0.0f;
        qv = __float2int_rn(v * id);
    }
    q[b * 32 + lane] = (int8_t)qv;
    if (lane == 0)
        d[b] = a <= FLT_MAX ? a / 127.0f : __uint_as_float(0x7fc00000u);
}

/* 4 bytes at p, 4-byte aligned / 2-byte aligned, little-endian. */
__device__ __forceinline__ uint32_t ld_u32(const uint8_t *p) {
    return __ldg((const uint32_t *)p);
}
__device__ __forceinline__ uint32_t ld_u16x2(const uint8_t *p) {
    const uint16_t *h = (const uint16_t *)p;
    return (uint32_t)__ldg(h) | (uint32_t)__ldg(h + 1) << 16;
}
__device__ __forceinline__ int ld_x4(const int8_t *p) {
    return __ldg((const int *)p);
}
#define QX_ONES 0x01010101 /* __dp4a(QX_ONES, x, 0): the sum of x's four int8 */

/* This lane's share of the dot products of one quantized weight row wr with the m rows of
 * x (as k_quant_x left them: xq [m][k], xd [m][k / 32]), added to acc[t]. The warp walks the
 * row's blocks together so that its loads of weight and x are contiguous:
 * Q4_0/Q4_1/Q8_0: 4 lanes per block of 32, 8 blocks per pass; lane s of a block takes its
 * bytes [4s, 4s + 4) of nibbles (elements 4s.. and 16 + 4s..) or [8s, 8s + 8) of int8;
 * Q4_K: one 256-block per pass, lane l takes nibble bytes [4l, 4l + 4): positions
 * 4 (l % 8).. of sub-blocks 2 (l / 8) (low nibbles) and 2 (l / 8) + 1 (high);
 * Q6_K: one 256-block per pass, lane l takes positions 4 (l % 8).. of groups a and a + 2
 * (a = (l / 8) % 2) of half l / 16, which share their ql and qh bytes.
 * Weight rows must start 4-byte aligned (mm_check): Q4_1 and Q4_K fields are then 4-byte
 * aligned, Q4_0, Q8_0 and Q6_K ones 2-byte aligned. */
template <int T, int MT>
__device__ __forceinline__ void
gemv_row_q8(const uint8_t *__restrict__ wr, const int8_t *__restrict__ xq,
            const float *__restrict__ xd, int m, int k, int lane, float *acc) {
    const int nb = k / 32;
    if constexpr (T == MD_TYPE_Q4_0 || T == MD_TYPE_Q4_1 || T == MD_TYPE_Q8_0) {
        const int s = lane & 3;
#pragma unroll 4
        for (int b = lane >> 2; b < nb; b += 8) {
            float dw, mw = 0.0f;
            int w0, w1;
            if constexpr (T == MD_TYPE_Q4_0) {
                const uint8_t *p = wr + (size_t)b * 18;
                dw = cuda_f16_to_f(__ldg((const uint16_t *)p));
                uint32_t v = ld_u16x2(p + 2 + 4 * s);
                w0 = (int)(v & 0x0F0F0F0Fu);
                w1 = (int)((v >> 4) & 0x0F0F0F0Fu);
            } else if constexpr (T == MD_TYPE_Q4_1) {
                const uint8_t *p = wr + (size_t)b * 20;
                uint32_t h = ld_u32(p), v = ld_u32(p + 4 + 4 * s);
                dw = cuda_f16_to_f((uint16_t)(h & 0xFFFFu));
                mw = cuda_f16_to_f((uint16_t)(h >> 16));
                w0 = (int)(v & 0x0F0F0F0Fu);
                w1 = (int)((v >> 4) & 0x0F0F0F0Fu);
            } else {
                const uint8_t *p = wr + (size_t)b * 34;
                dw = cuda_f16_to_f(__ldg((const uint16_t *)p));
                w0 = (int)ld_u16x2(p + 2 + 8 * s);
                w1 = (int)ld_u16x2(p + 6 + 8 * s);
            }
#pragma unroll
            for (int t = 0; t < MT; t++) {
                if (MT > 1 && t >= m)
                    break;
                const int8_t *xb = xq + (int64_t)t * k + 32 * b;
                float dx = __ldg(xd + (int64_t)t * nb + b);
                int x0, x1;
                if constexpr (T == MD_TYPE_Q8_0) {
                    x0 = ld_x4(xb + 8 * s);
                    x1 = ld_x4(xb + 8 * s + 4);
                } else {
                    x0 = ld_x4(xb + 4 * s);
                    x1 = ld_x4(xb + 16 + 4 * s);
                }
                int dot = __dp4a(w0, x0, __dp4a(w1, x1, 0));
                if constexpr (T == MD_TYPE_Q8_0) {
                    acc[t] += dw * dx * (float)dot;
                } else {
                    int sx = __dp4a(QX_ONES, x0, __dp4a(QX_ONES, x1, 0));
                    if constexpr (T == MD_TYPE_Q4_0)
                        acc[t] += dw * dx * (float)(dot - 8 * sx);
                    else
                        acc[t] += dx * (dw * (float)dot + mw * (float)sx);
                }
            }
        }
    } else if constexpr (T == MD_TYPE_Q4_K) {
        const int pr = lane >> 3, pos = 4 * (lane & 7), j0 = 2 * pr;
#pragma unroll 4
        for (int sb = 0; sb < k / 256; sb++) {
            const uint8_t *p = wr + (size_t)sb * 144;
            uint32_t h = ld_u32(p), v = ld_u32(p + 16 + 32 * pr + pos);
            float d = cuda_f16_to_f((uint16_t)(h & 0xFFFFu));
            float dmin = cuda_f16_to_f((uint16_t)(h >> 16));
            int s0, m0, s1, m1;
            md_q4k_scale_min(p + 4, j0, &s0, &m0);
            md_q4k_scale_min(p + 4, j0 + 1, &s1, &m1);
            float c0 = d * s0, n0 = dmin * m0, c1 = d * s1, n1 = dmin * m1;
            int w0 = (int)(v & 0x0F0F0F0Fu), w1 = (int)((v >> 4) & 0x0F0F0F0Fu);
#pragma unroll
            for (int t = 0; t < MT; t++) {
                if (MT > 1 && t >= m)
                    break;
                const int8_t *xb = xq + (int64_t)t * k + 256 * sb + 32 * j0 + pos;
                const float *db = xd + (int64_t)t * nb + 8 * sb + j0;
                int x0 = ld_x4(xb), x1 = ld_x4(xb + 32);
                int dot0 = __dp4a(w0, x0, 0), dot1 = __dp4a(w1, x1, 0);
                int sx0 = __dp4a(QX_ONES, x0, 0), sx1 = __dp4a(QX_ONES, x1, 0);
                acc[t] += __ldg(db) * (c0 * (float)dot0 - n0 * (float)sx0) +
                          __ldg(db + 1) * (c1 * (float)dot1 - n1 * (float)sx1);
            }
        }
    } else if constexpr (T == MD_TYPE_Q6_K) {
        const int half = lane >> 4, a = (lane >> 3) & 1, pos = 4 * (lane & 7);
#pragma unroll 4
        for (int sb = 0; sb < k / 256; sb++) {
            const uint8_t *p = wr + (size_t)sb * 210;
            uint32_t ql = ld_u16x2(p + 64 * half + 32 * a + pos);
            uint32_t qh = ld_u16x2(p + 128 + 32 * half + pos);
            int v0 = (int)((ql & 0x0F0F0F0Fu) | (((qh >> (2 * a)) & 0x03030303u) << 4));
            int v1 = (int)(((ql >> 4) & 0x0F0F0F0Fu) | (((qh >> (2 * a + 4)) & 0x03030303u) << 4));
            const int8_t *sc = (const int8_t *)(p + 192) + 8 * half + pos / 16;
            float d = cuda_f16_to_f(__ldg((const uint16_t *)(p + 208)));
            float c0 = d * __ldg(sc + 2 * a), c1 = d * __ldg(sc + 2 * (a + 2));
#pragma unroll
            for (int t = 0; t < MT; t++) {
                if (MT > 1 && t >= m)
                    break;
                const int8_t *xb = xq + (int64_t)t * k + 256 * sb + 128 * half + 32 * a + pos;
                const float *db = xd + (int64_t)t * nb + 8 * sb + 4 * half + a;
                int x0 = ld_x4(xb), x1 = ld_x4(xb + 64);
                int dot0 = __dp4a(v0, x0, 0) - 32 * __dp4a(QX_ONES, x0, 0);
                int dot1 = __dp4a(v1, x1, 0) - 32 * __dp4a(QX_ONES, x1, 0);
                acc[t] += __ldg(db) * c0 * (float)dot0 + __ldg(db + 2) * c1 * (float)dot1;
            }
        }
    }
}

/* ---- quantized weights, 8 < m <= CUDA_MMQ_DP4A_MAX_M tokens, no BF16 copy ----
 * A tiled product on int8 (__dp4a) that reads the quantized blocks directly, so a batch of
 * a few dozen sequences on a card without room for BF16 copies does not expand every
 * weight to BF16 at every step (16 GB of scratch traffic for an 8B model). Block: 64 weight
 * rows x 32 tokens, k in steps of 256; weight blocks decoded to int8 with one scale per 16
 * elements and one "min" per 32 (y += min * sum(x)), x as k_quant_x leaves it; each thread
 * owns 4 rows x 2 tokens. */
#define MMQ_BM 64
#define MMQ_BN 32
#define MMQ_BK 256
#define MMQ_THREADS 256
#define MMQ_LAUNCH(kernel, grid, stream, ...)                                                      \
    kernel<<<(grid), MMQ_THREADS, 0, (stream)>>>(__VA_ARGS__)

/* 32-element block b of weight row wr as int8 values v (8 packed ints), the scales of its
 * two halves and its min: element j is d16[j / 16] * v[j] + mn. */
template <int T>
__device__ __forceinline__ void mmq_block(const uint8_t *__restrict__ wr, int b, int *v, float *d16,
                                          float *mn) {
    uint8_t q[32];
    *mn = 0.0f;
    if constexpr (T == MD_TYPE_Q4_0 || T == MD_TYPE_Q4_1) {
        const uint8_t *p = wr + (size_t)b * (T == MD_TYPE_Q4_0 ? 18 : 20);
        const uint8_t *qs = p + (T == MD_TYPE_Q4_0 ? 2 : 4);
        float d = qt_f16(p);
        int off = T == MD_TYPE_Q4_0 ? 8 : 0;
        for (int j = 0; j < 16; j++) {
            q[j] = (uint8_t)((qs[j] & 0xF) - off);
            q[j + 16] = (uint8_t)((qs[j] >> 4) - off);
        }
        d16[0] = d16[1] = d;
        if constexpr (T == MD_TYPE_Q4_1)
            *mn = qt_f16(p + 2);
    } else if constexpr (T == MD_TYPE_Q8_0) {
        const uint8_t *p = wr + (size_t)b * 34;
        for (int j = 0; j < 32; j++)
            q[j] = p[2 + j];
        d16[0] = d16[1] = qt_f16(p);
    } else if constexpr (T == MD_TYPE_Q4_K) {
        const uint8_t *p = wr + (size_t)(b / 8) * 144;
        int j8 = b % 8, sc, mnv;
        md_q4k_scale_min(p + 4, j8, &sc, &mnv);
        const uint8_t *qs = p + 16 + 32 * (j8 / 2);
        int shift = (j8 & 1) * 4;
        for (int l = 0; l < 32; l++)
            q[l] = (uint8_t)((qs[l] >> shift) & 0xF);
        d16[0] = d16[1] = qt_f16(p) * sc;
        *mn = -qt_f16(p + 2) * mnv;
    } else { /* Q6_K, as dq32 */
        const uint8_t *p = wr + (size_t)(b / 8) * 210;
        int half = (b % 8) / 4, g = b % 4;
        const uint8_t *ql = p + 64 * half + 32 * (g & 1), *qh = p + 128 + 32 * half;
        const int8_t *sc = (const int8_t *)(p + 192) + 8 * half + 2 * g;
        float d = qt_f16(p + 208);
        int lshift = (g & 2) ? 4 : 0;
        for (int l = 0; l < 32; l++)
            q[l] = (uint8_t)((((ql[l] >> lshift) & 0xF) | (((qh[l] >> (2 * g)) & 3) << 4)) - 32);
        d16[0] = d * sc[0];
        d16[1] = d * sc[1];
    }
    for (int i = 0; i < 8; i++)
        v[i] = (int)((uint32_t)q[4 * i] | (uint32_t)q[4 * i + 1] << 8 |
                     (uint32_t)q[4 * i + 2] << 16 | (uint32_t)q[4 * i + 3] << 24);
}

/* Item (row, blk) of a tiled kernel's weight stage: mmq_block of that row, or zeros past
 * the matrix (row >= n, or in_k false: a block past k in this step). */
template <int T>
__device__ __forceinline__ void mmq_stage(const uint8_t *__restrict__ w, size_t row_bytes, int row,
                                          int n, int blk, bool in_k, int *v, float *d16,
                                          float *mn) {
    if (row < n && in_k) {
        mmq_block<T>(w + (size_t)row * row_bytes, blk, v, d16, mn);
        return;
    }
    for (int i = 0; i < 8; i++)
        v[i] = 0;
    d16[0] = d16[1] = *mn = 0.0f;
}

/* y[t][r] = (x . w^T)[t][r] + beta * y[t][r] for rows [64 bx, +64) and tokens [32 by, +32). */
template <int T>
__global__ void __launch_bounds__(MMQ_THREADS)
    k_mmq(const uint8_t *__restrict__ w, size_t row_bytes, const int8_t *__restrict__ xq,
          const float *__restrict__ xd, float *__restrict__ y, int m, int n, int k, float beta) {
    __shared__ int sw[MMQ_BM][MMQ_BK / 4 + 1];
    __shared__ float swd[MMQ_BM][MMQ_BK / 16], swm[MMQ_BM][MMQ_BK / 32];
    __shared__ int sx[MMQ_BN][MMQ_BK / 4 + 1], sxs[MMQ_BN][MMQ_BK / 32];
    __shared__ float sxd[MMQ_BN][MMQ_BK / 32];
    const int tid = threadIdx.x, r0 = blockIdx.x * MMQ_BM, t0 = blockIdx.y * MMQ_BN;
    const int nb = k / 32, ri = (tid % 16) * 4, ti = (tid / 16) * 2;
    float acc[4][2] = {{0.0f}};
    for (int k0 = 0; k0 < k; k0 += MMQ_BK) {
        const int kb = min(MMQ_BK, k - k0) / 32; /* 32-blocks in this step */
        /* weights: 64 rows x 8 blocks, two (row, block) items per thread */
        for (int it = tid; it < MMQ_BM * (MMQ_BK / 32); it += MMQ_THREADS) {
            int r = it / (MMQ_BK / 32), b = it % (MMQ_BK / 32);
            int v[8];
            float d16[2], mn;
            mmq_stage<T>(w, row_bytes, r0 + r, n, k0 / 32 + b, b < kb, v, d16, &mn);
            for (int i = 0; i < 8; i++)
                sw[r][8 * b + i] = v[i];
            swd[r][2 * b] = d16[0];
            swd[r][2 * b + 1] = d16[1];
            swm[r][b] = mn;
        }
        /* x: 32 tokens x 8 blocks, one item per thread */
        for (int it = tid; it < MMQ_BN * (MMQ_BK / 32); it += MMQ_THREADS) {
            int t = it / (MMQ_BK / 32), b = it % (MMQ_BK / 32), sum = 0;
            int ok = t0 + t < m && b < kb;
            const int *src = (const int *)(xq + (int64_t)(t0 + t) * k + k0 + 32 * b);
            for (int i = 0; i < 8; i++) {
                int v = ok ? __ldg(src + i) : 0;
                sx[t][8 * b + i] = v;
                sum = __dp4a(QX_ONES, v, sum);
            }
            sxs[t][b] = sum;
            sxd[t][b] = ok ? __ldg(xd + (int64_t)(t0 + t) * nb + k0 / 32 + b) : 0.0f;
        }
        __syncthreads();
        for (int b = 0; b < kb; b++) {
#pragma unroll
            for (int h = 0; h < 2; h++) {
                int dot[4][2] = {{0}};
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    int xv0 = sx[ti][8 * b + 4 * h + i], xv1 = sx[ti + 1][8 * b + 4 * h + i];
#pragma unroll
                    for (int a = 0; a < 4; a++) {
                        int wv = sw[ri + a][8 * b + 4 * h + i];
                        dot[a][0] = __dp4a(wv, xv0, dot[a][0]);
                        dot[a][1] = __dp4a(wv, xv1, dot[a][1]);
                    }
                }
#pragma unroll
                for (int a = 0; a < 4; a++)
#pragma unroll
                    for (int c = 0; c < 2; c++)
                        acc[a][c] += swd[ri + a][2 * b + h] * sxd[ti + c][b] * (float)dot[a][c];
            }
#pragma unroll
            for (int a = 0; a < 4; a++)
#pragma unroll
                for (int c = 0; c < 2; c++)
                    acc[a][c] += swm[ri + a][b] * sxd[ti + c][b] * (float)sxs[ti + c][b];
        }
        __syncthreads();
    }
#pragma unroll
    for (int a = 0; a < 4; a++)
#pragma unroll
        for (int c = 0; c < 2; c++) {
            int r = r0 + ri + a, t = t0 + ti + c;
            if (r < n && t < m) {
                float *o = y + (int64_t)t * n + r;
                *o = beta == 0.0f ? acc[a][c] : acc[a][c] + beta * *o;
            }
        }
}

/* ---- quantized weights, CUDA_MMQ_DP4A_MAX_M < m <= CUDA_MMQ_MAX_M, no BF16 copy ----
 * The same product on the tensor cores: int8 mma.sync (m16n8k32; Q6_K, whose scale changes
 * every 16 elements, two m16n8k16), int32 per 32-element block (16 for Q6_K), then the
 * weight's and x's float scales and the min term in FP32, as k_mmq. So a batch of hundreds
 * of sequences on quantized weights reads ~0.6 byte per weight instead of expanding each to
 * BF16 (write 2, read 2) at every step. Block: 64 weight rows x 64 tokens, k in steps of
 * 256, 8 warps; warp w computes rows 16 (w % 4) .. +16 x tokens 32 (w / 4) .. +32, four
 * 16 x 8 tiles sharing one A fragment. Shared rows are MMT_LD ints: a fragment load (lane
 * g * 4 + t reads int t of row g) then meets 32 different banks. Needs sm_80 (CMake builds
 * nothing older). */
#define MMT_BM 64
#define MMT_BN 64
#define MMT_BK 256
#define MMT_LD (MMT_BK / 4 + 4)
#define MMT_THREADS 256
#define MMT_LAUNCH(kernel, grid, stream, ...)                                                      \
    kernel<<<(grid), MMT_THREADS, 0, (stream)>>>(__VA_ARGS__)

/* d = a . b (+ c = 0) on one warp's fragments; tests/gpu/emu supplies emu_mma_s8. */
__device__ __forceinline__ void mma_k32(int *d, const int *a, const int *b) {
#if defined(__CUDA_ARCH__)
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};"
                 : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "r"(0));
#elif !defined(__CUDACC__)
    const int z[4] = {0, 0, 0, 0};
    emu_mma_s8<32>(d, a, b, z);
#endif
}
__device__ __forceinline__ void mma_k16(int *d, const int *a, const int *b) {
#if defined(__CUDA_ARCH__)
    asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, "
                 "{%4,%5}, {%6}, {%7,%7,%7,%7};"
                 : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(b[0]), "r"(0));
#elif !defined(__CUDACC__)
    const int z[4] = {0, 0, 0, 0};
    emu_mma_s8<16>(d, a, b, z);
#endif
}

/* y[t][r] = (x . w^T)[t][r] + beta * y[t][r] for rows [64 bx, +64) and tokens [64 by, +64). */
template <int T>
__global__ void __launch_bounds__(MMT_THREADS)
    k_mmq_tc(const uint8_t *__restrict__ w, size_t row_bytes, const int8_t *__restrict__ xq,
             const float *__restrict__ xd, float *__restrict__ y, int m, int n, int k, float beta) {
    __shared__ __align__(16) int sw[MMT_BM][MMT_LD];
    __shared__ __align__(16) int sx[MMT_BN][MMT_LD];
    __shared__ float swd[MMT_BM][MMT_BK / 16], swm[MMT_BM][MMT_BK / 32];
    __shared__ float sxd[MMT_BN][MMT_BK / 32], sxm[MMT_BN][MMT_BK / 32];
    constexpr bool has_min = T == MD_TYPE_Q4_1 || T == MD_TYPE_Q4_K;
    const int tid = threadIdx.x, r0 = blockIdx.x * MMT_BM, t0 = blockIdx.y * MMT_BN;
    const int warp = tid >> 5, g = (tid & 31) >> 2, q = tid & 3;
    const int wr = 16 * (warp & 3), wt = 32 * (warp >> 2);
    const int nb = k / 32;
    float acc[4][4] = {{0.0f}};
    for (int k0 = 0; k0 < k; k0 += MMT_BK) {
        const int kb = min(MMT_BK, k - k0) / 32; /* 32-blocks in this step */
        /* weights: 64 rows x 8 blocks, two (row, block) items per thread */
        for (int it = tid; it < MMT_BM * (MMT_BK / 32); it += MMT_THREADS) {
            int r = it / (MMT_BK / 32), b = it % (MMT_BK / 32);
            int v[8];
            float d16[2], mn;
            mmq_stage<T>(w, row_bytes, r0 + r, n, k0 / 32 + b, b < kb, v, d16, &mn);
            uint4 *dst = (uint4 *)&sw[r][8 * b];
            dst[0] = make_uint4((unsigned)v[0], (unsigned)v[1], (unsigned)v[2], (unsigned)v[3]);
            dst[1] = make_uint4((unsigned)v[4], (unsigned)v[5], (unsigned)v[6], (unsigned)v[7]);
            swd[r][2 * b] = d16[0];
            swd[r][2 * b + 1] = d16[1];
            swm[r][b] = mn;
        }
        /* x: 64 tokens x 8 blocks, two items per thread; 32 bytes each, 16-byte aligned */
        for (int it = tid; it < MMT_BN * (MMT_BK / 32); it += MMT_THREADS) {
            int t = it / (MMT_BK / 32), b = it % (MMT_BK / 32);
            uint4 v0 = make_uint4(0u, 0u, 0u, 0u), v1 = v0;
            float d = 0.0f;
            if (t0 + t < m && b < kb) {
                const uint4 *src = (const uint4 *)(xq + (int64_t)(t0 + t) * k + k0 + 32 * b);
                v0 = __ldg(src);
                v1 = __ldg(src + 1);
                d = __ldg(xd + (int64_t)(t0 + t) * nb + k0 / 32 + b);
            }
            uint4 *dst = (uint4 *)&sx[t][8 * b];
            dst[0] = v0;
            dst[1] = v1;
            sxd[t][b] = d;
            if constexpr (has_min) {
                int s = __dp4a(QX_ONES, (int)v0.x, 0);
                s = __dp4a(QX_ONES, (int)v0.y, s);
                s = __dp4a(QX_ONES, (int)v0.z, s);
                s = __dp4a(QX_ONES, (int)v0.w, s);
                s = __dp4a(QX_ONES, (int)v1.x, s);
                s = __dp4a(QX_ONES, (int)v1.y, s);
                s = __dp4a(QX_ONES, (int)v1.z, s);
                s = __dp4a(QX_ONES, (int)v1.w, s);
                sxm[t][b] = d * (float)s;
            }
        }
        __syncthreads();
        for (int b = 0; b < kb; b++) {
            /* this lane's output rows wr + g and wr + g + 8 */
            const float wd0 = swd[wr + g][2 * b], wd1 = swd[wr + g + 8][2 * b];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int tb = wt + 8 * j; /* this tile's tokens; the lane's outputs: tb + 2q, +1 */
                const float x0 = sxd[tb + 2 * q][b], x1 = sxd[tb + 2 * q + 1][b];
                int c[4];
                if constexpr (T == MD_TYPE_Q6_K) {
                    const float we0 = swd[wr + g][2 * b + 1], we1 = swd[wr + g + 8][2 * b + 1];
                    int a0[2] = {sw[wr + g][8 * b + q], sw[wr + g + 8][8 * b + q]};
                    int a1[2] = {sw[wr + g][8 * b + 4 + q], sw[wr + g + 8][8 * b + 4 + q]};
                    int b0[1] = {sx[tb + g][8 * b + q]}, b1[1] = {sx[tb + g][8 * b + 4 + q]};
                    int c1[4];
                    mma_k16(c, a0, b0);
                    mma_k16(c1, a1, b1);
                    acc[j][0] += x0 * (wd0 * (float)c[0] + we0 * (float)c1[0]);
                    acc[j][1] += x1 * (wd0 * (float)c[1] + we0 * (float)c1[1]);
                    acc[j][2] += x0 * (wd1 * (float)c[2] + we1 * (float)c1[2]);
                    acc[j][3] += x1 * (wd1 * (float)c[3] + we1 * (float)c1[3]);
                } else {
                    int a[4] = {sw[wr + g][8 * b + q], sw[wr + g + 8][8 * b + q],
                                sw[wr + g][8 * b + 4 + q], sw[wr + g + 8][8 * b + 4 + q]};
                    int bb[2] = {sx[tb + g][8 * b + q], sx[tb + g][8 * b + 4 + q]};
                    mma_k32(c, a, bb);
                    acc[j][0] += wd0 * x0 * (float)c[0];
                    acc[j][1] += wd0 * x1 * (float)c[1];
                    acc[j][2] += wd1 * x0 * (float)c[2];
                    acc[j][3] += wd1 * x1 * (float)c[3];
                    if constexpr (has_min) {
                        const float m0 = swm[wr + g][b], m1 = swm[wr + g + 8][b];
                        const float s0 = sxm[tb + 2 * q][b], s1 = sxm[tb + 2 * q + 1][b];
                        acc[j][0] += m0 * s0;
                        acc[j][1] += m0 * s1;
                        acc[j][2] += m1 * s0;
                        acc[j][3] += m1 * s1;
                    }
                }
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int j = 0; j < 4; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int r = r0 + wr + g + (i >= 2 ? 8 : 0), t = t0 + wt + 8 * j + 2 * q + (i & 1);
            if (r < n && t < m) {
                float *o = y + (int64_t)t * n + r;
                *o = beta == 0.0f ? acc[j][i] : acc[j][i] + beta * *o;
            }
        }
}

template <int T, int MT>
__device__ __forceinline__ void gemv_row_f(const uint8_t *__restrict__ wr,
                                           const float *__restrict__ x, int m, int k, int v16,
                                           int lane, float *acc);

/* This lane's share of the dot products of one weight row wr (k elements of type T) with
 * the m rows of x, added to acc[t]. Quantized T: gemv_row_q8 over x quantized (xq, xd).
 * v16 (F16/BF16 only): 8 elements per 16-byte load, wr and x 16-byte aligned and
 * k % 8 == 0; otherwise 32-element groups decoded by dq32. MT: the most rows of x the
 * launch serves, known when compiling (launch_gemv_n: 1 for one token, so the loop over
 * tokens has no branch and the unrolled iterations' weight loads are issued together; else
 * CUDA_GEMV_MAX_M); m <= MT. */
template <int T, int MT>
__device__ __forceinline__ void
gemv_row(const uint8_t *__restrict__ wr, const float *__restrict__ x, const int8_t *__restrict__ xq,
         const float *__restrict__ xd, int m, int k, int v16, int lane, float *acc) {
    if constexpr (T != MD_TYPE_F32 && T != MD_TYPE_F16 && T != MD_TYPE_BF16) {
        gemv_row_q8<T, MT>(wr, xq, xd, m, k, lane, acc);
    } else {
        gemv_row_f<T, MT>(wr, x, m, k, v16, lane, acc);
    }
}

/* The float path of gemv_row (F32, F16, BF16 weights; FP32 x). */
template <int T, int MT>
__device__ __forceinline__ void gemv_row_f(const uint8_t *__restrict__ wr,
                                           const float *__restrict__ x, int m, int k, int v16,
                                           int lane, float *acc) {
    if constexpr (T == MD_TYPE_BF16 || T == MD_TYPE_F16) {
        if (v16) {
            const uint4 *w4 = (const uint4 *)wr;
#pragma unroll 4
            for (int i = lane; i < k / 8; i += 32) {
                uint4 pk = __ldg(w4 + i);
                const uint16_t *h = (const uint16_t *)&pk;
                float wf[8];
#pragma unroll
                for (int j = 0; j < 8; j++)
                    wf[j] = T == MD_TYPE_BF16 ? cuda_bf16_to_f(h[j]) : cuda_f16_to_f(h[j]);
#pragma unroll
                for (int t = 0; t < MT; t++) {
                    if (MT > 1 && t >= m)
                        break;
                    const float4 *xr = (const float4 *)(x + (int64_t)t * k + 8 * i);
                    float4 a = __ldg(xr), b = __ldg(xr + 1);
                    acc[t] += wf[0] * a.x + wf[1] * a.y + wf[2] * a.z + wf[3] * a.w + wf[4] * b.x +
                              wf[5] * b.y + wf[6] * b.z + wf[7] * b.w;
                }
            }
            return;
        }
    }
    for (int g = lane; g < k / 32; g += 32) {
        float wf[32];
        dq32<T>(wr, g, wf);
#pragma unroll
        for (int t = 0; t < MT; t++) {
            if (MT > 1 && t >= m)
                break;
            const float *xr = x + (int64_t)t * k + 32 * g;
            float s = 0.0f;
#pragma unroll
            for (int j = 0; j < 32; j++)
                s += wf[j] * __ldg(xr + j);
            acc[t] += s;
        }
    }
}

/* The weights of one GEMV launch: segment s < n_seg holds rows [end[s-1], end[s]) of the
 * concatenation (end[-1] = 0; end[s] of unused segments = the total), its own weight w[s] (rows of
 * the launch's row_bytes) and output y[s] [m][end[s] - end[s-1]]; v16[s]: its rows take 16-byte
 * loads (decided per weight, so a row's sum is the one cuda_matmul of that weight alone computes).
 */
typedef struct {
    const uint8_t *w[CUDA_MM_MAX];
    float *y[CUDA_MM_MAX];
    int end[CUDA_MM_MAX];
    int v16[CUDA_MM_MAX];
    int n_seg;
} gemv_segs;

/* y[s] = x . w[s]^T + beta * y[s] for every segment; one warp per row of the concatenation;
 * m <= MT (gemv_row). */
template <int T, int MT>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    k_gemv_n(gemv_segs sg, size_t row_bytes, const float *__restrict__ x,
             const int8_t *__restrict__ xq, const float *__restrict__ xd, int m, int k,
             float beta) {
    int row = blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= sg.end[CUDA_MM_MAX - 1])
        return;
    /* constant indices only, so the table stays in parameter space (no local copy) */
    const uint8_t *w = sg.w[0];
    float *y = sg.y[0];
    int r0 = 0, n = sg.end[0], v16 = sg.v16[0];
#pragma unroll
    for (int s = 1; s < CUDA_MM_MAX; s++)
        if (s < sg.n_seg && row >= sg.end[s - 1]) {
            w = sg.w[s];
            y = sg.y[s];
            r0 = sg.end[s - 1];
            n = sg.end[s] - r0;
            v16 = sg.v16[s];
        }
    row -= r0;
    float acc[CUDA_GEMV_MAX_M];
#pragma unroll
    for (int t = 0; t < CUDA_GEMV_MAX_M; t++)
        acc[t] = 0.0f;
    gemv_row<T, MT>(w + (size_t)row * row_bytes, x, xq, xd, m, k, v16, lane, acc);
#pragma unroll
    for (int t = 0; t < MT; t++) {
        if (MT > 1 && t >= m)
            break;
        float s = cuda_warp_sum(acc[t]);
        if (lane == 0) {
            float *o = y + (int64_t)t * n + row;
            *o = beta == 0.0f ? s : s + beta * *o;
        }
    }
}

/* y[m][n] = silu(x . wg^T) * (x . wu^T): the warp of row r computes gate row r and up row r
 * exactly as k_gemv_n would, and applies k_swiglu's formula (elementwise.cu), so the result
 * equals the unfused GEMVs + swiglu. */
template <int T, int MT>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    k_gemv_swiglu(const uint8_t *__restrict__ wg, const uint8_t *__restrict__ wu, size_t row_bytes,
                  const float *__restrict__ x, const int8_t *__restrict__ xq,
                  const float *__restrict__ xd, float *__restrict__ y, int m, int n, int k,
                  int v16_g, int v16_u) {
    int row = blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= n)
        return;
    float ag[CUDA_GEMV_MAX_M], au[CUDA_GEMV_MAX_M];
#pragma unroll
    for (int t = 0; t < CUDA_GEMV_MAX_M; t++)
        ag[t] = au[t] = 0.0f;
    gemv_row<T, MT>(wg + (size_t)row * row_bytes, x, xq, xd, m, k, v16_g, lane, ag);
    gemv_row<T, MT>(wu + (size_t)row * row_bytes, x, xq, xd, m, k, v16_u, lane, au);
#pragma unroll
    for (int t = 0; t < MT; t++) {
        if (MT > 1 && t >= m)
            break;
        float g = cuda_warp_sum(ag[t]), u = cuda_warp_sum(au[t]);
        if (lane == 0)
            y[(int64_t)t * n + row] = g / (1.0f + __expf(-g)) * u;
    }
}

/* y[m][n] = x . w^T + beta * y on cuBLAS: w [n][k] and x [m][k] both of dtype t (F32:
 * SGEMM; F16/BF16: GemmEx), FP32 accumulation and output. Declared apart from its
 * definition because the emulator drops the definition and supplies its own. */
static int blas_gemm(cuda_ctx *c, const void *w, cuda_dtype t, const void *x, float *y, int m,
                     int n, int k, float beta, md_err *e);
static int blas_gemm(cuda_ctx *c, const void *w, cuda_dtype t, const void *x, float *y, int m,
                     int n, int k, float beta, md_err *e) {
    const float alpha = 1.0f;
    cublasStatus_t st;
    /* Column-major view: Y^T (n x m) = W (k x n)^T . X^T (k x m). */
    if (t == CUDA_F32) {
        st = cublasSgemm(c->cublas, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha, (const float *)w, k,
                         (const float *)x, k, &beta, y, n);
        if (st != CUBLAS_STATUS_SUCCESS)
            return cuda_fail_blas(c, st, "Sgemm", e);
        return CUDA_LAUNCHED(c, "Sgemm", e);
    }
    cudaDataType dt = t == CUDA_F16 ? CUDA_R_16F : CUDA_R_16BF;
    st = cublasGemmEx(c->cublas, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha, w, dt, k, x, dt, k,
                      &beta, y, CUDA_R_32F, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS)
        return cuda_fail_blas(c, st, "GemmEx", e);
    return CUDA_LAUNCHED(c, "GemmEx", e);
}

/* Every weight's type, shape and row size, before anything is launched. */
static int mm_check(const cuda_mm_w *w, int n_w, int m, int k, int mode, md_err *e) {
    if (n_w < 1 || n_w > CUDA_MM_MAX)
        return md_errf(e, MD_EINVAL, "CUDA matmul: %d weights in one call (1 to %d)", n_w,
                       CUDA_MM_MAX);
    if (mode != CUDA_MM_SET && mode != CUDA_MM_ACC && mode != CUDA_MM_SWIGLU)
        return md_errf(e, MD_EINVAL, "CUDA matmul: unknown mode %d", mode);
    if (mode == CUDA_MM_SWIGLU && (n_w != 2 || w[0].n != w[1].n))
        return md_errf(e, MD_EINVAL,
                       "CUDA matmul: SwiGLU takes a gate and an up weight of one shape (got %d "
                       "weights)",
                       n_w);
    int64_t rows = 0;
    for (int i = 0; i < n_w; i++) {
        int b = qt_block_elems(w[i].wtype);
        if (b == 0)
            return md_errf(e, MD_EUNSUPP,
                           "CUDA matmul: weight type %d is not supported (F32, F16, "
                           "BF16, Q4_0, Q4_1, Q8_0, Q4_K, Q6_K are)",
                           w[i].wtype);
        if (m < 0 || w[i].n <= 0 || k <= 0 || k % b)
            return md_errf(e, MD_EINVAL,
                           "CUDA matmul: bad shape m %d, n %d, k %d (k must be a "
                           "multiple of %d)",
                           m, w[i].n, k, b);
        if (w[i].row_bytes != md_type_row_bytes(w[i].wtype, k))
            return md_errf(e, MD_EINVAL,
                           "CUDA matmul: rows of %zu bytes, expected %zu for %d "
                           "elements of type %d",
                           w[i].row_bytes, md_type_row_bytes(w[i].wtype, k), k, w[i].wtype);
        if (qt_is_quant(w[i].wtype) && ((uintptr_t)w[i].w % 4) != 0)
            return md_errf(e, MD_EINVAL,
                           "CUDA matmul: quantized weight %d at %p is not 4-byte aligned", i,
                           w[i].w);
        rows += w[i].n;
    }
    if (rows > INT_MAX)
        return md_errf(e, MD_EINVAL, "CUDA matmul: %lld output rows in one call", (long long)rows);
    return 0;
}

/* Whether weight w's rows take 16-byte loads with this x. */
static int gemv_v16(const cuda_mm_w *w, const float *x, int k) {
    return (w->wtype == MD_TYPE_F16 || w->wtype == MD_TYPE_BF16) && k % 8 == 0 &&
           ((uintptr_t)x % 16) == 0 && ((uintptr_t)w->w % 16) == 0;
}

/* The weights of w[first..n_w) of w[first]'s type not yet launched (taken[i] == 0), in
 * order, marked taken. */
static void gemv_group(const cuda_mm_w *w, int n_w, int first, const float *x, int k, int *taken,
                       gemv_segs *sg) {
    int t = w[first].wtype, rows = 0;
    sg->n_seg = 0;
    for (int i = first; i < n_w; i++) {
        if (taken[i] || w[i].wtype != t)
            continue;
        taken[i] = 1;
        rows += w[i].n;
        sg->w[sg->n_seg] = (const uint8_t *)w[i].w;
        sg->y[sg->n_seg] = w[i].y;
        sg->v16[sg->n_seg] = gemv_v16(&w[i], x, k);
        sg->end[sg->n_seg++] = rows;
    }
    /* unused segments: never read, but defined, so equal launches have equal parameters */
    for (int s = sg->n_seg; s < CUDA_MM_MAX; s++) {
        sg->w[s] = NULL;
        sg->y[s] = NULL;
        sg->v16[s] = 0;
        sg->end[s] = rows;
    }
}

/* The k_gemv_n / k_gemv_swiglu instance for m rows of x: MT = 1 for one token (the batch-1
 * decode step), else CUDA_GEMV_MAX_M. */
template <int T>
static void launch_gemv_n(cudaStream_t st, const gemv_segs &sg, size_t rb, const float *x,
                          const int8_t *xq, const float *xd, int m, int k, float b) {
    unsigned grid = cuda_blocks(sg.end[CUDA_MM_MAX - 1], GEMV_WARPS);
    if (m == 1) {
        GEMV_LAUNCH((k_gemv_n<T, 1>), grid, st, sg, rb, x, xq, xd, m, k, b);
        return;
    }
    GEMV_LAUNCH((k_gemv_n<T, CUDA_GEMV_MAX_M>), grid, st, sg, rb, x, xq, xd, m, k, b);
}

template <int T>
static void launch_gemv_swiglu(cudaStream_t st, const uint8_t *wg, const uint8_t *wu, size_t rb,
                               const float *x, const int8_t *xq, const float *xd, float *y, int m,
                               int n, int k, int vg, int vu) {
    unsigned grid = cuda_blocks(n, GEMV_WARPS);
    if (m == 1) {
        GEMV_LAUNCH((k_gemv_swiglu<T, 1>), grid, st, wg, wu, rb, x, xq, xd, y, m, n, k, vg, vu);
        return;
    }
    GEMV_LAUNCH((k_gemv_swiglu<T, CUDA_GEMV_MAX_M>), grid, st, wg, wu, rb, x, xq, xd, y, m, n, k,
                vg, vu);
}

/* GEMV path: one launch per weight type (one in all for weights of one type), SwiGLU in the
 * epilogue when gate and up share a type (else their two GEMVs and the swiglu kernel). */
/* x [m][k] quantized by k_quant_x into scratch sized for at least m_room rows: *xq, *xd. */
static int mm_quant_x(cuda_ctx *c, const float *x, int m, int m_room, int k, int8_t **xq,
                      float **xd, md_err *e) {
    void *qs = NULL;
    int rc = cuda_scratch(c, CUDA_SCRATCH_X, qx_bytes(m_room > m ? m_room : m, k), &qs, e);
    if (rc)
        return rc;
    *xq = (int8_t *)qs;
    *xd = (float *)((int8_t *)qs + (size_t)m * k);
    int64_t nb = (int64_t)m * (k / 32);
    QX_LAUNCH(cuda_blocks(nb, QX_WARPS), c->stream, x, *xq, *xd, nb);
    return CUDA_LAUNCHED(c, "quant_x", e);
}

static int mm_gemv(cuda_ctx *c, const cuda_mm_w *w, int n_w, const float *x, int m, int k,
                   float beta, int swiglu, md_err *e) {
    /* x quantized once for all quantized weights of the call (scratch sized for the
     * largest GEMV with this k, so decode steps of any width reuse it) */
    int8_t *xq = NULL;
    float *xd = NULL;
    for (int i = 0; i < n_w; i++)
        if (qt_is_quant(w[i].wtype)) {
            int rc = mm_quant_x(c, x, m, CUDA_GEMV_MAX_M, k, &xq, &xd, e);
            if (rc)
                return rc;
            break;
        }
    if (swiglu && w[0].wtype == w[1].wtype) {
        int vg = gemv_v16(&w[0], x, k), vu = gemv_v16(&w[1], x, k);
        const uint8_t *wg = (const uint8_t *)w[0].w, *wu = (const uint8_t *)w[1].w;
        size_t rb = w[0].row_bytes;
        int n = w[0].n;
        float *y = w[0].y;
        QT_DISPATCH(w[0].wtype,
                    launch_gemv_swiglu<QT>(c->stream, wg, wu, rb, x, xq, xd, y, m, n, k, vg, vu));
        return CUDA_LAUNCHED(c, "gemv_swiglu", e);
    }
    int taken[CUDA_MM_MAX] = {0};
    for (int i = 0; i < n_w; i++) {
        if (taken[i])
            continue;
        gemv_segs sg;
        gemv_group(w, swiglu ? i + 1 : n_w, i, x, k, taken, &sg);
        size_t rb = w[i].row_bytes;
        float b = swiglu ? 0.0f : beta;
        QT_DISPATCH(w[i].wtype, launch_gemv_n<QT>(c->stream, sg, rb, x, xq, xd, m, k, b));
        int rc = CUDA_LAUNCHED(c, "gemv", e);
        if (rc)
            return rc;
    }
    if (swiglu)
        return cuda_swiglu(c, w[0].y, w[1].y, w[0].y, CUDA_F32, (int64_t)m * w[0].n, e);
    return 0;
}

/* cuBLAS path: x converted to BF16 once for all weights but F16 ones, to F16 once for
 * those; quantized weights read from their BF16 copy when they have one, else expanded to
 * BF16 scratch one after another (stream order keeps each GEMM's scratch until it is done);
 * F32 weights on SGEMM. SwiGLU: gate into y[0], up
 * into y[1], then the swiglu kernel, as the unfused ops. */
static int mm_blas(cuda_ctx *c, const cuda_mm_w *w, int n_w, const float *x, int m, int k,
                   float beta, int swiglu, md_err *e) {
    float b = swiglu ? 0.0f : beta;
    int64_t wrows = 0; /* largest weight to expand */
    for (int i = 0; i < n_w; i++)
        if (w[i].wtype != MD_TYPE_F32 && w[i].wtype != MD_TYPE_F16 && w[i].wtype != MD_TYPE_BF16 &&
            !w[i].bf16 && w[i].n > wrows)
            wrows = w[i].n;
    void *ws = NULL;
    int rc = 0;
    if (wrows && (rc = cuda_scratch(c, CUDA_SCRATCH_W, (size_t)wrows * k * 2, &ws, e)))
        return rc;
    for (int i = 0; i < n_w; i++)
        if (w[i].wtype == MD_TYPE_F32 &&
            (rc = blas_gemm(c, w[i].w, CUDA_F32, x, w[i].y, m, w[i].n, k, b, e)))
            return rc;
    for (int pass = 0; pass < 2; pass++) {
        cuda_dtype xt = pass == 0 ? CUDA_BF16 : CUDA_F16;
        void *xs = NULL;
        for (int i = 0; i < n_w; i++) {
            if (w[i].wtype == MD_TYPE_F32 || (w[i].wtype == MD_TYPE_F16) != (xt == CUDA_F16))
                continue;
            if (!xs && ((rc = cuda_scratch(c, CUDA_SCRATCH_X, (size_t)m * k * 2, &xs, e)) ||
                        (rc = cuda_convert(c, x, xs, xt, (int64_t)m * k, e))))
                return rc;
            const void *wm = w[i].w;
            if (w[i].wtype != MD_TYPE_F16 && w[i].wtype != MD_TYPE_BF16) {
                if (w[i].bf16)
                    wm = w[i].bf16;
                else if ((rc = cuda_dequantize(c, w[i].wtype, w[i].w, ws, CUDA_BF16,
                                               (int64_t)w[i].n * k, e)))
                    return rc;
                else
                    wm = ws;
            }
            if ((rc = blas_gemm(c, wm, xt, xs, w[i].y, m, w[i].n, k, b, e)))
                return rc;
        }
    }
    if (swiglu)
        return cuda_swiglu(c, w[0].y, w[1].y, w[0].y, CUDA_F32, (int64_t)m * w[0].n, e);
    return 0;
}

/* Whether weight w takes an int8 tiled path when 8 < m <= CUDA_MMQ_MAX_M: quantized
 * without a BF16 copy (with one, cuBLAS on the copy is the better path). */
static int mmq_ok(const cuda_mm_w *w) {
    return qt_is_quant(w->wtype) && !w->bf16;
}

/* k_mmq / k_mmq_tc for a quantized type (mmq_ok: the quantized types only). */
typedef void (*mmq_fn)(const uint8_t *, size_t, const int8_t *, const float *, float *, int, int,
                       int, float);
static mmq_fn mmq_kernel(int wtype, int tc) {
    switch (wtype) {
    case MD_TYPE_Q4_0: return tc ? k_mmq_tc<MD_TYPE_Q4_0> : k_mmq<MD_TYPE_Q4_0>;
    case MD_TYPE_Q4_1: return tc ? k_mmq_tc<MD_TYPE_Q4_1> : k_mmq<MD_TYPE_Q4_1>;
    case MD_TYPE_Q8_0: return tc ? k_mmq_tc<MD_TYPE_Q8_0> : k_mmq<MD_TYPE_Q8_0>;
    case MD_TYPE_Q4_K: return tc ? k_mmq_tc<MD_TYPE_Q4_K> : k_mmq<MD_TYPE_Q4_K>;
    default: return tc ? k_mmq_tc<MD_TYPE_Q6_K> : k_mmq<MD_TYPE_Q6_K>;
    }
}

/* The int8 tiled path: x quantized once, one launch per weight, y = product + beta y;
 * __dp4a (k_mmq) up to CUDA_MMQ_DP4A_MAX_M tokens, the tensor cores (k_mmq_tc) above. */
static int mm_mmq(cuda_ctx *c, const cuda_mm_w *w, int n_w, const float *x, int m, int k,
                  float beta, md_err *e) {
    int8_t *xq;
    float *xd;
    int rc = mm_quant_x(c, x, m, m, k, &xq, &xd, e);
    if (rc)
        return rc;
    int tc = m > CUDA_MMQ_DP4A_MAX_M;
    for (int i = 0; i < n_w; i++) {
        mmq_fn kernel = mmq_kernel(w[i].wtype, tc);
        if (tc) {
            dim3 grid(cuda_blocks(w[i].n, MMT_BM), cuda_blocks(m, MMT_BN));
            MMT_LAUNCH(kernel, grid, c->stream, (const uint8_t *)w[i].w, w[i].row_bytes, xq, xd,
                       w[i].y, m, w[i].n, k, beta);
        } else {
            dim3 grid(cuda_blocks(w[i].n, MMQ_BM), cuda_blocks(m, MMQ_BN));
            MMQ_LAUNCH(kernel, grid, c->stream, (const uint8_t *)w[i].w, w[i].row_bytes, xq, xd,
                       w[i].y, m, w[i].n, k, beta);
        }
        if ((rc = CUDA_LAUNCHED(c, tc ? "mmq_tc" : "mmq", e)))
            return rc;
    }
    return 0;
}

/* A ctx path threshold (cuda_internal.h): 0 = the default, -1 = never, else the value. */
static int mm_threshold(int v, int dflt) {
    return v > 0 ? v : v < 0 ? 0 : dflt;
}

/* Arguments checked; the ctx's device current. */
static int mm_run(cuda_ctx *c, const cuda_mm_w *w, int n_w, const float *x, int m, int k, int mode,
                  float beta, int force_cublas, md_err *e) {
    int rc = mm_check(w, n_w, m, k, mode, e);
    if (rc || m == 0)
        return rc;
    int swiglu = mode == CUDA_MM_SWIGLU;
    int gemv_max = mm_threshold(c->gemv_max_m, CUDA_GEMV_MAX_M);
    int mmq_max = mm_threshold(c->mmq_max_m, CUDA_MMQ_MAX_M);
    if (m <= gemv_max && !force_cublas)
        return mm_gemv(c, w, n_w, x, m, k, beta, swiglu, e);
    if (!force_cublas && m <= mmq_max) {
        /* quantized weights without a copy on the int8 tiled path, the others on cuBLAS
         * (each weight as cuda_matmul of it alone would run it); SwiGLU as gate into y[0],
         * up into y[1], then the swiglu kernel */
        cuda_mm_w q[CUDA_MM_MAX], o[CUDA_MM_MAX];
        int nq = 0, no = 0;
        for (int i = 0; i < n_w; i++) {
            if (mmq_ok(&w[i]))
                q[nq++] = w[i];
            else
                o[no++] = w[i];
        }
        if (nq) {
            float b = swiglu ? 0.0f : beta;
            if ((rc = mm_mmq(c, q, nq, x, m, k, b, e)) ||
                (no && (rc = mm_blas(c, o, no, x, m, k, b, 0, e))))
                return rc;
            if (swiglu)
                return cuda_swiglu(c, w[0].y, w[1].y, w[0].y, CUDA_F32, (int64_t)m * w[0].n, e);
            return 0;
        }
    }
    return mm_blas(c, w, n_w, x, m, k, beta, swiglu, e);
}

int cuda_matmul(cuda_ctx *c, const void *w, int wtype, size_t row_bytes, const float *x, float *y,
                int m, int n, int k, float beta, int force_cublas, md_err *e) {
    CUDA_GUARD(c, e);
    cuda_mm_w one = {w, wtype, row_bytes, n, y, NULL};
    return mm_run(c, &one, 1, x, m, k, CUDA_MM_SET, beta, force_cublas, e);
}

int cuda_matmul_n(cuda_ctx *c, const cuda_mm_w *w, int n_w, const float *x, int m, int k, int mode,
                  int force_cublas, md_err *e) {
    CUDA_GUARD(c, e);
    return mm_run(c, w, n_w, x, m, k, mode, mode == CUDA_MM_ACC ? 1.0f : 0.0f, force_cublas, e);
}
