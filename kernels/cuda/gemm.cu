/* gemm.cu — y[m][n] = x[m][k] . W[n][k]^T with FP32 accumulation, for every weight type.
 *
 * Decode (m <= CUDA_GEMV_MAX_M) is bound by reading the weights once, so it runs on own
 * GEMV kernels: one warp per output row, all m tokens at once; BF16/F16 weights are read
 * with 16-byte vector loads, quantized weights are decoded in registers (weight-only
 * kernels, so a quantized model stays quantized in device memory). Prefill and large
 * batches use cuBLAS GemmEx: x is converted to the weight's 16-bit type, quantized weights
 * are first expanded to BF16 in scratch, and the product accumulates in FP32. */
#include <stdint.h>

#include "kernels/cuda/quant.cuh"

#define GEMV_WARPS 4

/* 16-bit weights (bf16 when BF = true, else f16), rows 16-byte aligned, k % 8 == 0. */
template <bool BF>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    k_gemv16(const uint16_t *__restrict__ w, const float *__restrict__ x, float *__restrict__ y,
             int m, int n, int k, float beta) {
    int row = blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= n)
        return;
    const uint4 *wr = (const uint4 *)(w + (int64_t)row * k);
    float acc[CUDA_GEMV_MAX_M];
#pragma unroll
    for (int t = 0; t < CUDA_GEMV_MAX_M; t++)
        acc[t] = 0.0f;
#pragma unroll 4
    for (int i = lane; i < k / 8; i += 32) {
        uint4 pk = __ldg(wr + i);
        const uint16_t *h = (const uint16_t *)&pk;
        float wf[8];
#pragma unroll
        for (int j = 0; j < 8; j++)
            wf[j] = BF ? cuda_bf16_to_f(h[j]) : cuda_f16_to_f(h[j]);
#pragma unroll
        for (int t = 0; t < CUDA_GEMV_MAX_M; t++) {
            if (t >= m)
                break;
            const float4 *xr = (const float4 *)(x + (int64_t)t * k + 8 * i);
            float4 a = __ldg(xr), b = __ldg(xr + 1);
            acc[t] += wf[0] * a.x + wf[1] * a.y + wf[2] * a.z + wf[3] * a.w + wf[4] * b.x +
                      wf[5] * b.y + wf[6] * b.z + wf[7] * b.w;
        }
    }
#pragma unroll
    for (int t = 0; t < CUDA_GEMV_MAX_M; t++) {
        if (t >= m)
            break;
        float s = cuda_warp_sum(acc[t]);
        if (lane == 0) {
            float *o = y + (int64_t)t * n + row;
            *o = beta == 0.0f ? s : s + beta * *o;
        }
    }
}

/* Any type dq32 decodes: lane l takes 32-element groups l, l + 32, ... */
template <int T>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    k_gemv_q(const uint8_t *__restrict__ w, size_t row_bytes, const float *__restrict__ x,
             float *__restrict__ y, int m, int n, int k, float beta) {
    int row = blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= n)
        return;
    const uint8_t *wr = w + (size_t)row * row_bytes;
    float acc[CUDA_GEMV_MAX_M];
#pragma unroll
    for (int t = 0; t < CUDA_GEMV_MAX_M; t++)
        acc[t] = 0.0f;
    for (int g = lane; g < k / 32; g += 32) {
        float wf[32];
        dq32<T>(wr, g, wf);
#pragma unroll
        for (int t = 0; t < CUDA_GEMV_MAX_M; t++) {
            if (t >= m)
                break;
            const float *xr = x + (int64_t)t * k + 32 * g;
            float s = 0.0f;
#pragma unroll
            for (int j = 0; j < 32; j++)
                s += wf[j] * __ldg(xr + j);
            acc[t] += s;
        }
    }
#pragma unroll
    for (int t = 0; t < CUDA_GEMV_MAX_M; t++) {
        if (t >= m)
            break;
        float s = cuda_warp_sum(acc[t]);
        if (lane == 0) {
            float *o = y + (int64_t)t * n + row;
            *o = beta == 0.0f ? s : s + beta * *o;
        }
    }
}

static int gemm_cublas(cuda_ctx *c, const void *w, cudaDataType wt, const void *x, float *y, int m,
                       int n, int k, float beta, md_err *e) {
    const float alpha = 1.0f;
    /* Column-major view: Y^T (n x m) = W (k x n)^T . X^T (k x m). */
    cublasStatus_t st =
        cublasGemmEx(c->cublas, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha, w, wt, k, x, wt, k,
                     &beta, y, CUDA_R_32F, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS)
        return cuda_fail_blas(c, st, "GemmEx", e);
    return CUDA_LAUNCHED(c, "GemmEx", e);
}

int cuda_matmul(cuda_ctx *c, const void *w, int wtype, size_t row_bytes, const float *x, float *y,
                int m, int n, int k, float beta, int force_cublas, md_err *e) {
    CUDA_GUARD(c, e);
    int b = qt_block_elems(wtype);
    if (b == 0)
        return md_errf(e, MD_EUNSUPP,
                       "CUDA matmul: weight type %d is not supported (F32, F16, "
                       "BF16, Q4_0, Q4_1, Q8_0, Q4_K, Q6_K are)",
                       wtype);
    if (m < 0 || n <= 0 || k <= 0 || k % b)
        return md_errf(e, MD_EINVAL,
                       "CUDA matmul: bad shape m %d, n %d, k %d (k must be a "
                       "multiple of %d)",
                       m, n, k, b);
    if (row_bytes != qt_row_bytes(wtype, k))
        return md_errf(e, MD_EINVAL,
                       "CUDA matmul: rows of %zu bytes, expected %zu for %d "
                       "elements of type %d",
                       row_bytes, qt_row_bytes(wtype, k), k, wtype);
    if (m == 0)
        return 0;
    const uint8_t *wb = (const uint8_t *)w;
    if (m <= CUDA_GEMV_MAX_M && !force_cublas) {
        unsigned grid = cuda_blocks(n, GEMV_WARPS);
        int aligned = ((uintptr_t)w % 16) == 0 && ((uintptr_t)x % 16) == 0 && k % 8 == 0;
        if (aligned && wtype == QT_BF16)
            k_gemv16<true>
                <<<grid, GEMV_WARPS * 32, 0, c->stream>>>((const uint16_t *)w, x, y, m, n, k, beta);
        else if (aligned && wtype == QT_F16)
            k_gemv16<false>
                <<<grid, GEMV_WARPS * 32, 0, c->stream>>>((const uint16_t *)w, x, y, m, n, k, beta);
        else
            QT_DISPATCH(wtype, k_gemv_q<QT><<<grid, GEMV_WARPS * 32, 0, c->stream>>>(
                                   wb, row_bytes, x, y, m, n, k, beta));
        return CUDA_LAUNCHED(c, "gemv", e);
    }
    if (wtype == QT_F32) {
        const float alpha = 1.0f;
        cublasStatus_t st = cublasSgemm(c->cublas, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha,
                                        (const float *)w, k, x, k, &beta, y, n);
        if (st != CUBLAS_STATUS_SUCCESS)
            return cuda_fail_blas(c, st, "Sgemm", e);
        return CUDA_LAUNCHED(c, "Sgemm", e);
    }
    cuda_dtype xt = wtype == QT_F16 ? CUDA_F16 : CUDA_BF16;
    void *xs = NULL;
    int rc = cuda_scratch(c, CUDA_SCRATCH_X, (size_t)m * k * 2, &xs, e);
    if (rc)
        return rc;
    if ((rc = cuda_convert(c, x, xs, xt, (int64_t)m * k, e)))
        return rc;
    const void *wm = w;
    if (wtype != QT_F16 && wtype != QT_BF16) {
        void *ws = NULL;
        if ((rc = cuda_scratch(c, CUDA_SCRATCH_W, (size_t)n * k * 2, &ws, e)))
            return rc;
        if ((rc = cuda_dequantize(c, wtype, w, ws, CUDA_BF16, (int64_t)n * k, e)))
            return rc;
        wm = ws;
    }
    return gemm_cublas(c, wm, xt == CUDA_F16 ? CUDA_R_16F : CUDA_R_16BF, xs, y, m, n, k, beta, e);
}
