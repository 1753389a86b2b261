/* repack.c — weights of the 32-element block types (Q4_0, Q4_1, Q5_0, Q8_0) copied at load
 * into the row-interleaved layout the packed kernels stream (docs/kernels.md "Repacked
 * weights"; Q4_K, Q5_K and Q6_K: repack_k.c's records, packed through the functions here), a row of that layout dequantized back (embedding lookups), and the scalar packed
 * tile kernels: the reference every SIMD level's packed kernel is tested against, and the
 * kernels a level without its own packed ones falls back to.
 *
 * Layout (quant_blocks.h pk_*): rows in groups of CPU_PACK_ROWS = 16 (the last group padded
 * with zero rows); group g, block b is one record of 16 × the block's bytes at
 * (g·nb + b)·pk_block_bytes:
 *   quants   Q4_0/Q4_1/Q5_0: 4 × 64 bytes; byte 4r + i of part k holds element 8k + i of row
 *            r in its low nibble and element 8k + 4 + i in its high nibble. Q8_0: 8 × 64
 *            bytes, byte 4r + i of part g = element 4g + i of row r, plus 128 (unsigned).
 *            Either way one 64-byte vector is 16 rows × 4 consecutive elements: the operand
 *            of one dpbusd against 4 activation bytes broadcast to every lane.
 *   Q5_0     8 × uint64: bit 4r + i of word g = the fifth bit of element 4g + i of row r
 *   d        16 × fp16, one per row
 *   m        16 × fp16 (Q4_1 only)
 * The same bytes as the GGUF rows (padding aside): a repacked copy costs what the mapping
 * did, and the mapping's pages can be given back (docs/engine.md "Weights in memory"). */
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/quant_blocks.h"

#include <string.h>

static int is_k(int t) { return t == MD_TYPE_Q4_K || t == MD_TYPE_Q5_K || t == MD_TYPE_Q6_K; }

int cpu_pack_type(int t) {
    return t == MD_TYPE_Q4_0 || t == MD_TYPE_Q4_1 || t == MD_TYPE_Q5_0 || t == MD_TYPE_Q8_0 ||
           is_k(t);
}

int cpu_pack_wanted(int t) {
    return cpu_pack_type(t) && cpu_simd_level() >= CPU_SIMD_AVX2;
}

size_t cpu_pack_size(int t, int rows, int cols) {
    if (!cpu_pack_type(t) || rows <= 0 || cpu_matmul_check(t, cols) != 0)
        return 0;
    size_t groups = ((size_t)rows + CPU_PACK_ROWS - 1) / CPU_PACK_ROWS;
    if (is_k(t))
        return groups * (size_t)(cols / QK_K) * pk_k_block_bytes(t);
    return groups * (size_t)(cols / QK32) * pk_block_bytes(t);
}

/* Element e (0..31) of a GGUF block of type t: the unsigned quant (Q8_0: + 128) and, for
 * Q5_0, its fifth bit apart (*hi). */
static int block_elem(int t, const uint8_t *blk, int e, int *hi) {
    *hi = 0;
    switch (t) {
    case MD_TYPE_Q8_0: return (uint8_t)(((const blk_q8_0 *)blk)->qs[e] ^ 0x80);
    case MD_TYPE_Q5_0: {
        const blk_q5_0 *k = (const blk_q5_0 *)blk;
        *hi = k->qh[e / 8] >> (e % 8) & 1;
        return e < 16 ? k->qs[e] & 15 : k->qs[e - 16] >> 4;
    }
    case MD_TYPE_Q4_1: {
        const blk_q4_1 *k = (const blk_q4_1 *)blk;
        return e < 16 ? k->qs[e] & 15 : k->qs[e - 16] >> 4;
    }
    default: {
        const blk_q4_0 *k = (const blk_q4_0 *)blk;
        return e < 16 ? k->qs[e] & 15 : k->qs[e - 16] >> 4;
    }
    }
}

int cpu_pack_groups(int t, const void *W, int rows, int cols, int g0, int g1, void *dst) {
    size_t total = cpu_pack_size(t, rows, cols);
    int n_groups = (rows + CPU_PACK_ROWS - 1) / CPU_PACK_ROWS;
    if (!total || !W || !dst || g0 < 0 || g1 > n_groups || g0 > g1)
        return -1;
    size_t gb = total / (size_t)n_groups, rs = md_type_row_bytes(t, cols);
    uint8_t *out = dst;
    memset(out + (size_t)g0 * gb, 0, (size_t)(g1 - g0) * gb);
    int r1 = g1 * CPU_PACK_ROWS < rows ? g1 * CPU_PACK_ROWS : rows;
    if (is_k(t)) {
        for (int r = g0 * CPU_PACK_ROWS; r < r1; r++)
            pk_k_pack_row(t, (const uint8_t *)W + (size_t)r * rs, cols / QK_K,
                          out + (size_t)(r / CPU_PACK_ROWS) * gb, r % CPU_PACK_ROWS);
        return 0;
    }
    int nb = cols / QK32;
    size_t bsz = rs / (size_t)nb, pb = pk_block_bytes(t);
    for (int r = g0 * CPU_PACK_ROWS; r < r1; r++) {
        int g = r / CPU_PACK_ROWS, lr = r % CPU_PACK_ROWS;
        for (int b = 0; b < nb; b++) {
            const uint8_t *blk = (const uint8_t *)W + (size_t)r * rs + (size_t)b * bsz;
            uint8_t *rec = out + ((size_t)g * nb + b) * pb;
            for (int e = 0; e < QK32; e++) {
                int hi, q = block_elem(t, blk, e, &hi), grp = e / 4, i = e % 4;
                if (t == MD_TYPE_Q8_0) {
                    rec[grp * 64 + 4 * lr + i] = (uint8_t)q;
                    continue;
                }
                /* group grp: part grp / 2, low nibble for even groups, high for odd */
                rec[(grp / 2) * 64 + 4 * lr + i] |= (uint8_t)(q << (grp & 1 ? 4 : 0));
                if (hi)
                    rec[256 + grp * 8 + (4 * lr + i) / 8] |= (uint8_t)(1u << ((4 * lr + i) % 8));
            }
            uint16_t d;
            memcpy(&d, blk, 2); /* every type starts with its fp16 d */
            memcpy(rec + pk_d_off(t) + 2 * lr, &d, 2);
            if (t == MD_TYPE_Q4_1)
                memcpy(rec + pk_d_off(t) + 32 + 2 * lr, blk + 2, 2);
        }
    }
    return 0;
}

int cpu_pack(int t, const void *W, int rows, int cols, void *dst) {
    return cpu_pack_groups(t, W, rows, cols, 0, (rows + CPU_PACK_ROWS - 1) / CPU_PACK_ROWS, dst);
}

/* The unsigned quant of element e (0..31) of row lr in a packed record, fifth bit included. */
static int pk_elem(int t, const uint8_t *rec, int lr, int e) {
    int grp = e / 4, i = e % 4, byte = 4 * lr + i;
    if (t == MD_TYPE_Q8_0)
        return rec[grp * 64 + byte];
    int q = rec[(grp / 2) * 64 + byte] >> (grp & 1 ? 4 : 0) & 15;
    if (t == MD_TYPE_Q5_0)
        q |= (rec[256 + grp * 8 + byte / 8] >> (byte % 8) & 1) << 4;
    return q;
}

/* The value subtracted from the unsigned quant: w = d·(q − off) (+ m for Q4_1, off 0). */
static int pk_off(int t) {
    return t == MD_TYPE_Q4_0 ? 8 : t == MD_TYPE_Q5_0 ? 16 : t == MD_TYPE_Q8_0 ? 128 : 0;
}

void cpu_packed_dequant_row(int t, const void *Wp, int rows, int cols, int r, float *out) {
    (void)rows;
    if (is_k(t)) {
        pk_k_dequant_row(t, Wp, cols, r, out);
        return;
    }
    int nb = cols / QK32, g = r / CPU_PACK_ROWS, lr = r % CPU_PACK_ROWS;
    size_t pb = pk_block_bytes(t);
    for (int b = 0; b < nb; b++) {
        const uint8_t *rec = (const uint8_t *)Wp + ((size_t)g * nb + b) * pb;
        uint16_t h;
        memcpy(&h, rec + pk_d_off(t) + 2 * lr, 2);
        float d = md_fp16_to_fp32(h), m = 0;
        if (t == MD_TYPE_Q4_1) {
            memcpy(&h, rec + pk_d_off(t) + 32 + 2 * lr, 2);
            m = md_fp16_to_fp32(h);
        }
        for (int e = 0; e < QK32; e++) /* cpu_dequant_row's expressions, -0.0 included */
            out[b * QK32 + e] = t == MD_TYPE_Q4_1 ? d * (float)pk_elem(t, rec, lr, e) + m
                                                  : d * (float)(pk_elem(t, rec, lr, e) - pk_off(t));
    }
}

/* Scalar packed tile: per block and (r, c), with dot = Σ q·qx over the unsigned quants,
 *   y += (dw·dx)·dot + mw·s,  mw = m (Q4_1) or −off·dw, s = dx·Σqx
 * the arithmetic of the SIMD packed kernels, one lane at a time. */
static void ptile_scalar(int t, int nb, const uint8_t *wg, int nr, const act_row *a, int nc,
                         float *y, size_t ldy, int add) {
    size_t pb = pk_block_bytes(t);
    for (int c = 0; c < nc; c++)
        for (int r = 0; r < nr; r++) {
            float acc = 0;
            for (int b = 0; b < nb; b++) {
                const uint8_t *rec = wg + (size_t)b * pb;
                const int8_t *xq = a[c].q + b * QK32;
                int dot = 0;
                for (int e = 0; e < QK32; e++)
                    dot += pk_elem(t, rec, r, e) * xq[e];
                uint16_t h;
                memcpy(&h, rec + pk_d_off(t) + 2 * r, 2);
                float dw = md_fp16_to_fp32(h), mw = -(float)pk_off(t) * dw;
                if (t == MD_TYPE_Q4_1) {
                    memcpy(&h, rec + pk_d_off(t) + 32 + 2 * r, 2);
                    mw = md_fp16_to_fp32(h);
                }
                acc += (float)dot * (dw * a[c].d[b]) + mw * a[c].s[b];
            }
            y[c * ldy + r] = add ? y[c * ldy + r] + acc : acc;
        }
}

#define PTILE(name, T)                                                                             \
    void name(int nb, const uint8_t *wg, int nr, const act_row *a, int nc, float *y, size_t ldy,   \
              int add) {                                                                           \
        ptile_scalar(T, nb, wg, nr, a, nc, y, ldy, add);                                           \
    }
PTILE(cpu_ptile_q4_0_scalar, MD_TYPE_Q4_0)
PTILE(cpu_ptile_q4_1_scalar, MD_TYPE_Q4_1)
PTILE(cpu_ptile_q5_0_scalar, MD_TYPE_Q5_0)
PTILE(cpu_ptile_q8_0_scalar, MD_TYPE_Q8_0)
#undef PTILE
