#pragma once
/* cuBLAS as kernels/cuda calls it, defined by emu_rt.cc: GEMMs by cuBLAS's definition
 * (column-major, f32 accumulation), run on the handle's stream (recorded while it captures). */
#include "cuda_runtime.h"
typedef struct emu_blas *cublasHandle_t;
typedef int cublasStatus_t;
enum {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_ALLOC_FAILED = 3,
    CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_ARCH_MISMATCH = 8,
    CUBLAS_STATUS_EXECUTION_FAILED = 13,
    CUBLAS_STATUS_INTERNAL_ERROR = 14,
    CUBLAS_STATUS_NOT_SUPPORTED = 15,
};
typedef int cublasOperation_t;
enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 };
typedef int cublasComputeType_t;
enum { CUBLAS_COMPUTE_32F = 68 };
typedef int cublasGemmAlgo_t;
enum { CUBLAS_GEMM_DEFAULT = -1 };
extern "C" {
cublasStatus_t cublasCreate(cublasHandle_t *h);
cublasStatus_t cublasDestroy(cublasHandle_t h);
cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s);
cublasStatus_t cublasSetWorkspace(cublasHandle_t h, void *ws, size_t bytes);
cublasStatus_t cublasSgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                           int k, const float *alpha, const float *A, int lda, const float *B, int ldb,
                           const float *beta, float *C, int ldc);
cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                            int k, const void *alpha, const void *A, cudaDataType at, int lda,
                            const void *B, cudaDataType bt, int ldb, const void *beta, void *C,
                            cudaDataType ct, int ldc, cublasComputeType_t compute, cublasGemmAlgo_t algo);
}
