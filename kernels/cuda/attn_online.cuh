/* attn_online.cuh — one warp's online softmax (FlashAttention's running max and sum) over
 * tiles of up to 32 keys: its state, the scores, the step per tile. Shared by the f32
 * attention kernels that stage K/V tiles in shared memory: the decoder's prefill (attention.cu
 * k_attn_pf) and the encoder's bidirectional attention (encoder.cu k_attn_enc). */
#ifndef MEDLEY_KERNELS_CUDA_ATTN_ONLINE_CUH
#define MEDLEY_KERNELS_CUDA_ATTN_ONLINE_CUH

#include <float.h>

#include "kernels/cuda/cuda_internal.h"

/* Running max -FLT_MAX, sum 0 and output 0 for a warp's QW queries, before the first tile. */
template <int QW, int D>
__device__ __forceinline__ void attn_online_init(float (&m)[QW], float (&l)[QW],
                                                 float (&acc)[QW][D]) {
#pragma unroll
    for (int i = 0; i < QW; i++) {
        m[i] = -FLT_MAX;
        l[i] = 0.0f;
#pragma unroll
        for (int d = 0; d < D; d++)
            acc[i][d] = 0.0f;
    }
}

/* q . k over HD floats in order from 0 (a query row and a key row in shared memory). */
template <int HD> __device__ __forceinline__ float attn_tile_dot(const float *q, const float *k) {
    float s = 0.0f;
#pragma unroll 8
    for (int d = 0; d < HD; d++)
        s += q[d] * k[d];
    return s;
}

/* Lane j holds s, the score of key j of the tile (-FLT_MAX: no key: masked, or past the
 * tile's nk keys). One query's running max m and sum l (the same in every lane) and the
 * lane's D output dims acc (dims lane * D ..) move to the new max, then acc += p_j v_j for the
 * tile's keys j < nk whose weight is not 0 (masked keys are skipped, so their rows are not
 * read into the sum), v_j at sv + j * sv_row. FAST: __expf (the decoder prefill's, as it
 * always was) instead of expf (the encoder's). */
template <int D, bool FAST>
__device__ __forceinline__ void attn_online_step(float s, float &m, float &l, float (&acc)[D],
                                                 const float *sv, int sv_row, int nk, int lane) {
    float mx = fmaxf(m, cuda_warp_max(s));
    float pw = s == -FLT_MAX ? 0.0f : FAST ? __expf(s - mx) : expf(s - mx);
    float corr = FAST ? __expf(m - mx) : expf(m - mx);
    l = l * corr + cuda_warp_sum(pw);
    m = mx;
#pragma unroll
    for (int d = 0; d < D; d++)
        acc[d] *= corr;
    for (int j = 0; j < nk; j++) {
        float pj = __shfl_sync(0xffffffffu, pw, j);
        if (pj == 0.0f)
            continue;
#pragma unroll
        for (int d = 0; d < D; d++)
            acc[d] += pj * sv[j * sv_row + lane * D + d];
    }
}

#endif
