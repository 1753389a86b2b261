/* cuda_internal.h — what the kernels/cuda sources share and nobody else sees: the cuda_ctx
 * struct, the error plumbing every launcher uses, and small device helpers (bf16/f16
 * conversion, warp and block reductions). CUDA C++ only. */
#ifndef MEDLEY_KERNELS_CUDA_INTERNAL_H
#define MEDLEY_KERNELS_CUDA_INTERNAL_H

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <float.h>

#include "kernels/cuda/cuda_ops.h"

typedef struct cuda_seg cuda_seg;
typedef struct cuda_slab cuda_slab;

struct cuda_ctx {
    int ordinal;
    cudaStream_t stream;
    cublasHandle_t cublas;
    void *cublas_ws; /* cuBLAS workspace (device), fixed so graph capture stays legal */
    size_t cublas_ws_bytes;
    cuda_slab *slabs; /* memory pool, see ctx.cu */
    size_t used, reserved;
    int capturing;
    /* Scratch that grows on demand (never during graph capture): GEMM inputs converted to
     * bf16/f16, and a dequantized weight for quantized GEMMs with many tokens. scratch_gen
     * counts every move of a buffer recorded graphs may read (cuda_ctx_scratch_moved). */
    void *scratch[2];
    size_t scratch_bytes[2];
    unsigned scratch_gen;
    /* Path thresholds (gemm.cu): m <= gemv_max_m takes the GEMV, m <= mmq_max_m with
     * quantized weights the int8 tiled product; 0 = CUDA_GEMV_MAX_M / CUDA_MMQ_MAX_M, -1 =
     * never. Set at open from MEDLEY_CUDA_GEMV_MAX_M / MEDLEY_CUDA_MMQ_MAX_M (tuning). */
    int gemv_max_m, mmq_max_m;
    /* Prefill attention on f16/bf16 caches at head_dim 64/128 on the tensor cores
     * (k_attn_pf_tc): 1 unless MEDLEY_CUDA_ATTN_TC=0 at open; cuda_ctx_set_attn_tc. */
    int attn_tc;
    /* MEDLEY_CUDA_POOL_EXACT=1 at open: every allocation is its own cudaMalloc of exactly
     * the bytes asked for, freed at cuda_pool_free, so a memory checker that knows only the
     * driver's allocations (compute-sanitizer; AddressSanitizer on the CPU emulator) sees
     * every buffer's own bounds, not a 64 MiB slab's. For checking, not for serving. */
    int pool_exact;
    md_err failed;         /* sticky: code != 0 once a device error happened */
    md_err capture_failed; /* a failure while capturing: the capture is dropped, not the ctx */
};

/* Record a CUDA error as the ctx's sticky error and return MD_EDEVICE. */
int cuda_fail(cuda_ctx *c, cudaError_t err, const char *what, md_err *e);
int cuda_fail_blas(cuda_ctx *c, cublasStatus_t st, const char *what, md_err *e);
/* Return the sticky error (copied into e) when the ctx already failed; otherwise make the
 * ctx's device current (cheap when it already is), so several devices can share a thread. */
#define CUDA_GUARD(c, e)                                                                           \
    do {                                                                                           \
        if ((c)->failed.code)                                                                      \
            return cuda_ctx_failed((c), (e));                                                      \
        if (!(c)->capturing)                                                                       \
            cudaSetDevice((c)->ordinal);                                                           \
    } while (0)
/* After a launch: report a launch error as the sticky device error. */
#define CUDA_LAUNCHED(c, what, e) cuda_check((c), (what), (e))

enum { CUDA_SCRATCH_X = 0, CUDA_SCRATCH_W = 1 };
/* Scratch slot `which` with at least `bytes` bytes. */
int cuda_scratch(cuda_ctx *c, int which, size_t bytes, void **out, md_err *e);

static inline unsigned cuda_blocks(int64_t n, int per) {
    return (unsigned)((n + per - 1) / per);
}

/* The device's own half / bfloat16 conversions, not common/dtype.h's md_fp16_to_fp32 & co.:
 * those are portable host code (bit manipulation through memcpy), where the device has a
 * conversion instruction for each. Both are exact and round to nearest even. */
__device__ __forceinline__ float cuda_bf16_to_f(uint16_t h) {
    return __uint_as_float(((unsigned)h) << 16);
}
__device__ __forceinline__ uint16_t cuda_f_to_bf16(float f) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}
__device__ __forceinline__ float cuda_f16_to_f(uint16_t h) {
    return __half2float(__ushort_as_half(h));
}
__device__ __forceinline__ uint16_t cuda_f_to_f16(float f) {
    return __half_as_ushort(__float2half_rn(f));
}
/* Store f into element i of a buffer of dtype t. */
__device__ __forceinline__ void cuda_store(void *dst, cuda_dtype t, int64_t i, float f) {
    if (t == CUDA_F32)
        ((float *)dst)[i] = f;
    else if (t == CUDA_BF16)
        ((uint16_t *)dst)[i] = cuda_f_to_bf16(f);
    else
        ((uint16_t *)dst)[i] = cuda_f_to_f16(f);
}
__device__ __forceinline__ float cuda_load(const void *src, cuda_dtype t, int64_t i) {
    if (t == CUDA_F32)
        return ((const float *)src)[i];
    if (t == CUDA_BF16)
        return cuda_bf16_to_f(((const uint16_t *)src)[i]);
    return cuda_f16_to_f(((const uint16_t *)src)[i]);
}

/* One RoPE pair (x0, x1) rotated by pos * theta into (*r0, *r1). k_rope and k_rope_kv both
 * call it, so a rotated value has the same bits in either kernel: one sincosf argument and
 * one expression for nvcc to contract. r0 / r1 may point at x0's / x1's storage. */
__device__ __forceinline__ void cuda_rope_pair(float x0, float x1, int32_t pos, float theta,
                                               float *r0, float *r1) {
    float s, co;
    sincosf((float)pos * theta, &s, &co);
    *r0 = x0 * co - x1 * s;
    *r1 = x0 * s + x1 * co;
}

__device__ __forceinline__ float cuda_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float cuda_warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
/* Block-wide sum / max; every thread gets the result. sh: 32 floats of shared memory.
 * blockDim.x must be a multiple of 32. */
__device__ __forceinline__ float cuda_block_sum(float v, float *sh) {
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = cuda_warp_sum(v);
    __syncthreads();
    if (lane == 0)
        sh[wid] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : 0.0f;
    return cuda_warp_sum(v);
}
__device__ __forceinline__ float cuda_block_max(float v, float *sh) {
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = cuda_warp_max(v);
    __syncthreads();
    if (lane == 0)
        sh[wid] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : -FLT_MAX;
    return cuda_warp_max(v);
}

#endif
