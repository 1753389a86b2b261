/* matmul_scalar.c — the portable kernel level: tile kernels in plain C for every weight
 * type, and the activation quantizers every level shares the rounding of (round half to
 * even, as the SIMD converts do, so all levels quantize x identically). */
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/quant_blocks.h"

#include <math.h>

void cpu_quant_q8_32_scalar(const float *x, int cols, int8_t *q, float *d, float *s) {
    for (int b = 0; b < cols / QK32; b++) {
        const float *xb = x + b * QK32;
        float amax = 0;
        for (int i = 0; i < QK32; i++)
            amax = fmaxf(amax, fabsf(xb[i]));
        float id = amax > 0 ? 127.0f / amax : 0.0f;
        int sum = 0;
        for (int i = 0; i < QK32; i++) {
            int v = (int)lrintf(xb[i] * id);
            q[b * QK32 + i] = (int8_t)v;
            sum += v;
        }
        d[b] = amax / 127.0f;
        s[b] = d[b] * (float)sum;
    }
}

void cpu_quant_q8_k_scalar(const float *x, int cols, int8_t *q, float *d, int16_t *bsum) {
    for (int b = 0; b < cols / QK_K; b++) {
        const float *xb = x + b * QK_K;
        float amax = 0;
        for (int i = 0; i < QK_K; i++)
            amax = fmaxf(amax, fabsf(xb[i]));
        float id = amax > 0 ? 127.0f / amax : 0.0f;
        for (int g = 0; g < QK_K / 16; g++) {
            int sum = 0;
            for (int i = 0; i < 16; i++) {
                int v = (int)lrintf(xb[g * 16 + i] * id);
                q[b * QK_K + g * 16 + i] = (int8_t)v;
                sum += v;
            }
            bsum[b * 16 + g] = (int16_t)sum;
        }
        d[b] = amax / 127.0f;
    }
}

static void tile_f32(int cols, const uint8_t *w, size_t ws, int nr, const act_row *a,
                     const float *const *xf, int nc, float *y, size_t ldy) {
    for (int r = 0; r < nr; r++) {
        const float *wr = (const float *)(w + r * ws);
        for (int c = 0; c < nc; c++) {
            float s = 0;
            for (int i = 0; i < cols; i++)
                s += wr[i] * xf[c][i];
            y[c * ldy + r] = s;
        }
    }
}

static void tile_f16(int cols, const uint8_t *w, size_t ws, int nr, const act_row *a,
                     const float *const *xf, int nc, float *y, size_t ldy) {
    for (int r = 0; r < nr; r++) {
        const uint16_t *wr = (const uint16_t *)(w + r * ws);
        for (int c = 0; c < nc; c++) {
            float s = 0;
            for (int i = 0; i < cols; i++)
                s += md_fp16_to_fp32(wr[i]) * xf[c][i];
            y[c * ldy + r] = s;
        }
    }
}

static void tile_bf16(int cols, const uint8_t *w, size_t ws, int nr, const act_row *a,
                      const float *const *xf, int nc, float *y, size_t ldy) {
    for (int r = 0; r < nr; r++) {
        const uint16_t *wr = (const uint16_t *)(w + r * ws);
        for (int c = 0; c < nc; c++) {
            float s = 0;
            for (int i = 0; i < cols; i++)
                s += md_bf16_to_fp32(wr[i]) * xf[c][i];
            y[c * ldy + r] = s;
        }
    }
}

static void tile_q4_0(int nb, const uint8_t *w, size_t ws, int nr, const act_row *a,
                      const float *const *xf, int nc, float *y, size_t ldy) {
    for (int r = 0; r < nr; r++) {
        const blk_q4_0 *wb = (const blk_q4_0 *)(w + r * ws);
        for (int c = 0; c < nc; c++) {
            float acc = 0;
            for (int b = 0; b < nb; b++) {
                const int8_t *q = a[c].q + b * QK32;
                int isum = 0;
                for (int j = 0; j < 16; j++)
                    isum += (wb[b].qs[j] & 15) * q[j] + (wb[b].qs[j] >> 4) * q[j + 16];
                /* (qw - 8)·qx = qw·qx - 8·sum(qx); s = d·sum(qx) */
                float dw = md_fp16_to_fp32(wb[b].d);
                acc += dw * (a[c].d[b] * (float)isum - 8.0f * a[c].s[b]);
            }
            y[c * ldy + r] = acc;
        }
    }
}

static void tile_q4_1(int nb, const uint8_t *w, size_t ws, int nr, const act_row *a,
                      const float *const *xf, int nc, float *y, size_t ldy) {
    for (int r = 0; r < nr; r++) {
        const blk_q4_1 *wb = (const blk_q4_1 *)(w + r * ws);
        for (int c = 0; c < nc; c++) {
            float acc = 0;
            for (int b = 0; b < nb; b++) {
                const int8_t *q = a[c].q + b * QK32;
                int isum = 0;
                for (int j = 0; j < 16; j++)
                    isum += (wb[b].qs[j] & 15) * q[j] + (wb[b].qs[j] >> 4) * q[j + 16];
                acc += md_fp16_to_fp32(wb[b].d) * a[c].d[b] * (float)isum +
                       md_fp16_to_fp32(wb[b].m) * a[c].s[b];
            }
            y[c * ldy + r] = acc;
        }
    }
}

static void tile_q5_0(int nb, const uint8_t *w, size_t ws, int nr, const act_row *a,
                      const float *const *xf, int nc, float *y, size_t ldy) {
    for (int r = 0; r < nr; r++) {
        const blk_q5_0 *wb = (const blk_q5_0 *)(w + r * ws);
        for (int c = 0; c < nc; c++) {
            float acc = 0;
            for (int b = 0; b < nb; b++) {
                const int8_t *q = a[c].q + b * QK32;
                const uint8_t *h = wb[b].qh;
                uint32_t qh = (uint32_t)h[0] | (uint32_t)h[1] << 8 | (uint32_t)h[2] << 16 |
                              (uint32_t)h[3] << 24;
                int isum = 0;
                for (int j = 0; j < 16; j++) {
                    int lo = (wb[b].qs[j] & 15) | (int)(qh >> j & 1) << 4;
                    int hi = (wb[b].qs[j] >> 4) | (int)(qh >> (j + 16) & 1) << 4;
                    isum += lo * q[j] + hi * q[j + 16];
                }
                /* (qw - 16)·qx = qw·qx - 16·sum(qx); s = d·sum(qx) */
                float dw = md_fp16_to_fp32(wb[b].d);
                acc += dw * (a[c].d[b] * (float)isum - 16.0f * a[c].s[b]);
            }
            y[c * ldy + r] = acc;
        }
    }
}

static void tile_q8_0(int nb, const uint8_t *w, size_t ws, int nr, const act_row *a,
                      const float *const *xf, int nc, float *y, size_t ldy) {
    for (int r = 0; r < nr; r++) {
        const blk_q8_0 *wb = (const blk_q8_0 *)(w + r * ws);
        for (int c = 0; c < nc; c++) {
            float acc = 0;
            for (int b = 0; b < nb; b++) {
                const int8_t *q = a[c].q + b * QK32;
                int isum = 0;
                for (int j = 0; j < 32; j++)
                    isum += wb[b].qs[j] * q[j];
                acc += md_fp16_to_fp32(wb[b].d) * a[c].d[b] * (float)isum;
            }
            y[c * ldy + r] = acc;
        }
    }
}

/* One Q4_K or Q5_K super-block against its activations: the two share d, dmin, the packed
 * six-bit scales and mins and the low nibbles; qh (Q5_K's fifth bits; NULL for Q4_K) adds
 * bit 4 of element l of sub-block j from bit j of qh[l]. */
static float dot_k45(uint16_t d, uint16_t dmin, const uint8_t *scales, const uint8_t *qh,
                     const uint8_t *qs, const int8_t *q, const int16_t *bs, float dx) {
    int sumi = 0, summ = 0;
    for (int j = 0; j < 8; j++) {
        int sc, mn;
        md_q4k_scale_min(scales, j, &sc, &mn);
        const uint8_t *qj = qs + (j / 2) * 32;
        int shift = (j & 1) * 4, isum = 0;
        for (int l = 0; l < 32; l++) {
            int v = (qj[l] >> shift) & 15;
            if (qh)
                v |= ((qh[l] >> j) & 1) << 4;
            isum += v * q[j * 32 + l];
        }
        sumi += sc * isum;
        summ += mn * (bs[2 * j] + bs[2 * j + 1]);
    }
    return md_fp16_to_fp32(d) * dx * (float)sumi - md_fp16_to_fp32(dmin) * dx * (float)summ;
}

static void tile_q4_k(int nb, const uint8_t *w, size_t ws, int nr, const act_row *a,
                      const float *const *xf, int nc, float *y, size_t ldy) {
    for (int r = 0; r < nr; r++) {
        const blk_q4_k *wb = (const blk_q4_k *)(w + r * ws);
        for (int c = 0; c < nc; c++) {
            float acc = 0;
            for (int b = 0; b < nb; b++)
                acc += dot_k45(wb[b].d, wb[b].dmin, wb[b].scales, NULL, wb[b].qs,
                               a[c].q + b * QK_K, a[c].bsum + b * 16, a[c].d[b]);
            y[c * ldy + r] = acc;
        }
    }
}

static void tile_q5_k(int nb, const uint8_t *w, size_t ws, int nr, const act_row *a,
                      const float *const *xf, int nc, float *y, size_t ldy) {
    for (int r = 0; r < nr; r++) {
        const blk_q5_k *wb = (const blk_q5_k *)(w + r * ws);
        for (int c = 0; c < nc; c++) {
            float acc = 0;
            for (int b = 0; b < nb; b++)
                acc += dot_k45(wb[b].d, wb[b].dmin, wb[b].scales, wb[b].qh, wb[b].qs,
                               a[c].q + b * QK_K, a[c].bsum + b * 16, a[c].d[b]);
            y[c * ldy + r] = acc;
        }
    }
}

static void tile_q6_k(int nb, const uint8_t *w, size_t ws, int nr, const act_row *a,
                      const float *const *xf, int nc, float *y, size_t ldy) {
    for (int r = 0; r < nr; r++) {
        const blk_q6_k *wb = (const blk_q6_k *)(w + r * ws);
        for (int c = 0; c < nc; c++) {
            float acc = 0;
            for (int b = 0; b < nb; b++) {
                const int8_t *q = a[c].q + b * QK_K;
                const int16_t *bs = a[c].bsum + b * 16;
                int sumi = 0;
                for (int g = 0; g < 16; g++) {
                    int isum = 0;
                    for (int i = 0; i < 16; i++) {
                        int e = g * 16 + i, h = e / 128, gg = (e % 128) / 32, l = e % 32;
                        int lo = (wb[b].ql[64 * h + (gg & 1) * 32 + l] >> ((gg >> 1) * 4)) & 15;
                        int hi = (wb[b].qh[32 * h + l] >> (2 * gg)) & 3;
                        isum += (lo | (hi << 4)) * q[e];
                    }
                    sumi += wb[b].scales[g] * (isum - 32 * bs[g]);
                }
                acc += md_fp16_to_fp32(wb[b].d) * a[c].d[b] * (float)sumi;
            }
            y[c * ldy + r] = acc;
        }
    }
}

const kernel_table cpu_kernels_scalar = {
    .f32 = tile_f32, .f16 = tile_f16, .bf16 = tile_bf16, .q4_0 = tile_q4_0,
    .q4_1 = tile_q4_1, .q5_0 = tile_q5_0, .q8_0 = tile_q8_0, .q4_k = tile_q4_k, .q5_k = tile_q5_k,
    .q6_k = tile_q6_k,
    .p_q4_0 = cpu_ptile_q4_0_scalar, .p_q4_1 = cpu_ptile_q4_1_scalar,
    .p_q5_0 = cpu_ptile_q5_0_scalar, .p_q8_0 = cpu_ptile_q8_0_scalar,
    .p_q4_k = cpu_ptile_q4_k_scalar, .p_q5_k = cpu_ptile_q5_k_scalar,
    .p_q6_k = cpu_ptile_q6_k_scalar,
    .quant32 = cpu_quant_q8_32_scalar, .quantk = cpu_quant_q8_k_scalar,
};
