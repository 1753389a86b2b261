/* enc_ops.c — the CPU math of encoder models (BERT): LayerNorm with bias, the exact (erf)
 * GELU, and one query head's bidirectional attention over a packed sequence's rows. Plain C
 * loops the compiler vectorises; tests/unit/test_enc_ops.c checks each against a double
 * precision reference. No allocation: scratch is the caller's. */
#include <math.h>

#include "kernels/cpu/cpu_ops.h"

void cpu_layernorm(float *out, const float *x, const float *w, const float *b, int n, float eps) {
    float mean = 0, var = 0;
    for (int i = 0; i < n; i++)
        mean += x[i];
    mean /= (float)n;
    for (int i = 0; i < n; i++) {
        float d = x[i] - mean;
        var += d * d;
    }
    float inv = 1.0f / sqrtf(var / (float)n + eps);
    for (int i = 0; i < n; i++)
        out[i] = (x[i] - mean) * inv * w[i] + b[i];
}

void cpu_gelu_erf(float *x, int n) {
    for (int i = 0; i < n; i++)
        x[i] = 0.5f * x[i] * (1.0f + erff(x[i] * 0.70710678118654752f));
}

void cpu_attention_span(float *out, const float *q, const float *k, const float *v,
                        size_t row_stride, int n, int hd, float scale, float *scratch) {
    for (int j = 0; j < n; j++)
        scratch[j] = cpu_dot_f32(q, k + (size_t)j * row_stride, hd) * scale;
    cpu_softmax(scratch, n);
    for (int d = 0; d < hd; d++)
        out[d] = 0;
    for (int j = 0; j < n; j++)
        cpu_axpy(out, scratch[j], v + (size_t)j * row_stride, hd);
}
