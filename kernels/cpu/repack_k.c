/* repack_k.c — Q4_K, Q5_K and Q6_K weights copied at load into the row-interleaved layout of
 * repack.c (docs/kernels.md "Repacked weights"), a row of it dequantized back, and the scalar
 * packed K tiles: the reference the AVX2 and AVX-512 packed K kernels are tested against.
 *
 * Rows in groups of CPU_PACK_ROWS = 16 (the last padded with zero rows); group g, super-block
 * b (256 elements) is one record at (g·nb + b)·pk_k_block_bytes. Quants are 64-byte parts of
 * 16 rows × 4 consecutive elements, as the 4-bit 32-element types: byte 4r + i of part k of a
 * 32-element piece holds element 8k + i of row r in its low nibble and 8k + 4 + i in its high.
 *
 * Q4_K record (2368 bytes; 16 GGUF blocks are 2304):
 *   0     8 sub-blocks s × 4 parts: the 32 elements of sub-block s at 256·s
 *   2048  scales, u8 [8 s][16 r]  (a vpmovzxbd gives the 16 rows' scale of s)
 *   2176  mins, u8 [8 s][16 r]    (widened to (mn, mn) int16 pairs: one dpwssd against the
 *                                 two 16-element activation sums of sub-block s)
 *   2304  d, fp16 [16];  2336  dmin, fp16 [16]
 * Q5_K record (2880 bytes; 16 GGUF blocks are 2816): Q4_K's, then
 *   2368  the fifth bits, 64 bytes per sub-block s: bit g of byte 4r + i = element 4g + i of
 *         sub-block s of row r (the part layout's byte, its group g as a bit index)
 * Q6_K record (3360 bytes, the GGUF blocks' size):
 *   0     the low 4 bits: 8 pieces t of 32 elements × 4 parts at 256·t
 *   2048  the high 2 bits: 16 sub-blocks j of 16 elements, 64 bytes each: bits 2g..2g+1 of
 *         byte 4r + i = element 16j + 4g + i of row r
 *   3072  scales, int8 pairs [8 p][16 r][2] = (sc_2p, sc_2p+1): sign-extended to int16 it is
 *         the operand of one dpwssd against the 16-element sums 2p, 2p+1
 *   3328  d, fp16 [16]
 * Per super-block, row r and activation row c (dx, q_x, bsum: matmul.c's K activations):
 *   Q4_K  y += (d·dx)·Σ_s sc_s·dot_s − (dmin·dx)·Σ_s mn_s·(bsum_2s + bsum_2s+1)
 *   Q6_K  y += (d·dx)·(Σ_j sc_j·dot_j − 32·Σ_j sc_j·bsum_j)
 * with dot the exact int32 dot product of the unsigned quants (0..15, 0..31, 0..63) and q_x;
 * Q5_K's sums are Q4_K's. */
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/quant_blocks.h"

#include <string.h>

size_t pk_k_block_bytes(int t) {
    return t == MD_TYPE_Q4_K ? PK_Q4K_BYTES : t == MD_TYPE_Q5_K ? PK_Q5K_BYTES : PK_Q6K_BYTES;
}

/* Super-block b of GGUF row src into rec's lane lr (rec zeroed beforehand). */
static void pack_q4_k(const blk_q4_k *k, uint8_t *rec, int lr) {
    uint8_t sm[16];
    q4k_scales_mins16(k->scales, sm);
    for (int s = 0; s < 8; s++) {
        for (int l = 0; l < 32; l++) {
            int q = (k->qs[(s / 2) * 32 + l] >> ((s & 1) * 4)) & 15, grp = l / 4, i = l % 4;
            rec[256 * s + (grp / 2) * 64 + 4 * lr + i] |= (uint8_t)(q << (grp & 1 ? 4 : 0));
        }
        rec[PK_Q4K_SC + 16 * s + lr] = sm[s];
        rec[PK_Q4K_MN + 16 * s + lr] = sm[8 + s];
    }
    memcpy(rec + PK_Q4K_D + 2 * lr, &k->d, 2);
    memcpy(rec + PK_Q4K_D + 32 + 2 * lr, &k->dmin, 2);
}

/* Q5_K: Q4_K's record of its nibbles (the block's d, dmin, scales and qs are Q4_K's, at
 * the same offsets but qs), then the fifth bits. */
static void pack_q5_k(const blk_q5_k *k, uint8_t *rec, int lr) {
    blk_q4_k k4;
    memcpy(&k4, k, offsetof(blk_q4_k, qs));
    memcpy(k4.qs, k->qs, sizeof k4.qs);
    pack_q4_k(&k4, rec, lr);
    for (int s = 0; s < 8; s++)
        for (int l = 0; l < 32; l++)
            rec[PK_Q5K_QH + 64 * s + 4 * lr + l % 4] |=
                (uint8_t)(((k->qh[l] >> s) & 1) << (l / 4));
}

/* The unsigned quant (0..63) of element e of a Q6_K block. */
static int q6k_elem(const blk_q6_k *k, int e) {
    int h = e / 128, gg = (e % 128) / 32, l = e % 32;
    int lo = (k->ql[64 * h + (gg & 1) * 32 + l] >> ((gg >> 1) * 4)) & 15;
    int hi = (k->qh[32 * h + l] >> (2 * gg)) & 3;
    return lo | hi << 4;
}

static void pack_q6_k(const blk_q6_k *k, uint8_t *rec, int lr) {
    for (int e = 0; e < QK_K; e++) {
        int q = q6k_elem(k, e), t = e / 32, grp = (e % 32) / 4, i = e % 4;
        rec[256 * t + (grp / 2) * 64 + 4 * lr + i] |= (uint8_t)((q & 15) << (grp & 1 ? 4 : 0));
        int j = e / 16, g = (e % 16) / 4;
        rec[PK_Q6K_QH + 64 * j + 4 * lr + i] |= (uint8_t)((q >> 4) << (2 * g));
    }
    for (int j = 0; j < 16; j++)
        rec[PK_Q6K_SC + 32 * (j / 2) + 2 * lr + (j & 1)] = (uint8_t)k->scales[j];
    memcpy(rec + PK_Q6K_D + 2 * lr, &k->d, 2);
}

void pk_k_pack_row(int t, const void *row, int nb, uint8_t *group, int lr) {
    size_t pb = pk_k_block_bytes(t);
    for (int b = 0; b < nb; b++) {
        if (t == MD_TYPE_Q4_K)
            pack_q4_k((const blk_q4_k *)row + b, group + (size_t)b * pb, lr);
        else if (t == MD_TYPE_Q5_K)
            pack_q5_k((const blk_q5_k *)row + b, group + (size_t)b * pb, lr);
        else
            pack_q6_k((const blk_q6_k *)row + b, group + (size_t)b * pb, lr);
    }
}

/* The unsigned quant of element e (0..255) of lane lr in a packed K record. */
static int pk_k_elem(int t, const uint8_t *rec, int lr, int e) {
    int piece = e / 32, grp = (e % 32) / 4, i = e % 4;
    int q = rec[256 * piece + (grp / 2) * 64 + 4 * lr + i] >> (grp & 1 ? 4 : 0) & 15;
    if (t == MD_TYPE_Q6_K)
        q |= (rec[PK_Q6K_QH + 64 * (e / 16) + 4 * lr + i] >> (2 * ((e % 16) / 4)) & 3) << 4;
    if (t == MD_TYPE_Q5_K)
        q |= (rec[PK_Q5K_QH + 64 * piece + 4 * lr + i] >> grp & 1) << 4;
    return q;
}

static float pk_half(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return md_fp16_to_fp32(h);
}

static int q6k_scale(const uint8_t *rec, int lr, int j) {
    return (int8_t)rec[PK_Q6K_SC + 32 * (j / 2) + 2 * lr + (j & 1)];
}

void pk_k_dequant_row(int t, const void *Wp, int cols, int r, float *out) {
    int nb = cols / QK_K, g = r / CPU_PACK_ROWS, lr = r % CPU_PACK_ROWS;
    size_t pb = pk_k_block_bytes(t);
    for (int b = 0; b < nb; b++) {
        const uint8_t *rec = (const uint8_t *)Wp + ((size_t)g * nb + b) * pb;
        float *o = out + b * QK_K;
        if (t != MD_TYPE_Q6_K) { /* Q4_K, Q5_K */
            float d = pk_half(rec + PK_Q4K_D + 2 * lr),
                  dmin = pk_half(rec + PK_Q4K_D + 32 + 2 * lr);
            for (int e = 0; e < QK_K; e++) { /* cpu_dequant_row's expression */
                int sc = rec[PK_Q4K_SC + 16 * (e / 32) + lr];
                int mn = rec[PK_Q4K_MN + 16 * (e / 32) + lr];
                o[e] = d * sc * pk_k_elem(t, rec, lr, e) - dmin * mn;
            }
        } else {
            float d = pk_half(rec + PK_Q6K_D + 2 * lr);
            for (int e = 0; e < QK_K; e++)
                o[e] = d * q6k_scale(rec, lr, e / 16) * (pk_k_elem(t, rec, lr, e) - 32);
        }
    }
}

/* Scalar packed K tile: the integer sums of the SIMD kernels, then per super-block
 *   Q4_K  acc += (float)summ·(−dmin·dx), then acc += (float)sumi·(d·dx)
 *   Q6_K  acc += (float)(sumi − 32·summ)·(d·dx)
 * one lane at a time. */
static void ptile_k_scalar(int t, int nb, const uint8_t *wg, int nr, const act_row *a, int nc,
                           float *y, size_t ldy, int add) {
    size_t pb = pk_k_block_bytes(t);
    for (int c = 0; c < nc; c++)
        for (int r = 0; r < nr; r++) {
            float acc = 0;
            for (int b = 0; b < nb; b++) {
                const uint8_t *rec = wg + (size_t)b * pb;
                const int8_t *xq = a[c].q + b * QK_K;
                const int16_t *bs = a[c].bsum + b * 16;
                float dx = a[c].d[b];
                int sumi = 0, summ = 0;
                if (t != MD_TYPE_Q6_K) { /* Q4_K, Q5_K */
                    for (int s = 0; s < 8; s++) {
                        int dot = 0;
                        for (int e = 32 * s; e < 32 * s + 32; e++)
                            dot += pk_k_elem(t, rec, r, e) * xq[e];
                        int mn = rec[PK_Q4K_MN + 16 * s + r];
                        sumi += rec[PK_Q4K_SC + 16 * s + r] * dot;
                        summ += mn * bs[2 * s] + mn * bs[2 * s + 1];
                    }
                    float dw = pk_half(rec + PK_Q4K_D + 2 * r);
                    float mw = pk_half(rec + PK_Q4K_D + 32 + 2 * r);
                    acc += (float)summ * (-mw * dx);
                    acc += (float)sumi * (dw * dx);
                } else {
                    for (int j = 0; j < 16; j++) {
                        int dot = 0, sc = q6k_scale(rec, r, j);
                        for (int e = 16 * j; e < 16 * j + 16; e++)
                            dot += pk_k_elem(t, rec, r, e) * xq[e];
                        sumi += sc * dot;
                        summ += sc * bs[j];
                    }
                    acc += (float)(sumi - 32 * summ) * (pk_half(rec + PK_Q6K_D + 2 * r) * dx);
                }
            }
            y[c * ldy + r] = add ? y[c * ldy + r] + acc : acc;
        }
}

void cpu_ptile_q4_k_scalar(int nb, const uint8_t *wg, int nr, const act_row *a, int nc, float *y,
                           size_t ldy, int add) {
    ptile_k_scalar(MD_TYPE_Q4_K, nb, wg, nr, a, nc, y, ldy, add);
}

void cpu_ptile_q5_k_scalar(int nb, const uint8_t *wg, int nr, const act_row *a, int nc, float *y,
                           size_t ldy, int add) {
    ptile_k_scalar(MD_TYPE_Q5_K, nb, wg, nr, a, nc, y, ldy, add);
}

void cpu_ptile_q6_k_scalar(int nb, const uint8_t *wg, int nr, const act_row *a, int nc, float *y,
                           size_t ldy, int add) {
    ptile_k_scalar(MD_TYPE_Q6_K, nb, wg, nr, a, nc, y, ldy, add);
}
