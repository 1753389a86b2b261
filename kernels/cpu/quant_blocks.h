/* quant_blocks.h — private to kernels/cpu: ggml's block layouts (fixed by the GGUF format;
 * common/dtype.h describes them) as structs, the layout of quantized activations in matmul
 * scratch, and the table of per-SIMD-level kernels that matmul.c dispatches to. Half and
 * bfloat16 conversion and Q4_K scale unpacking come from common/dtype.h. */
#ifndef MEDLEY_KERNELS_CPU_QUANT_BLOCKS_H
#define MEDLEY_KERNELS_CPU_QUANT_BLOCKS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "common/dtype.h"

#define QK32 32
#define QK_K 256

typedef struct {
    uint16_t d;
    uint8_t qs[16];
} blk_q4_0;
typedef struct {
    uint16_t d, m;
    uint8_t qs[16];
} blk_q4_1;
typedef struct {
    uint16_t d;
    uint8_t qh[4]; /* bit j: the fifth bit of element j (little-endian uint32 in the file) */
    uint8_t qs[16];
} blk_q5_0;
typedef struct {
    uint16_t d;
    int8_t qs[32];
} blk_q8_0;
typedef struct {
    uint16_t d, dmin;
    uint8_t scales[12];
    uint8_t qs[128];
} blk_q4_k;
typedef struct {
    uint16_t d, dmin;
    uint8_t scales[12]; /* as Q4_K's */
    uint8_t qh[32];     /* bit s of qh[l]: the fifth bit of element l of sub-block s */
    uint8_t qs[128];    /* as Q4_K's */
} blk_q5_k;
typedef struct {
    uint8_t ql[128];
    uint8_t qh[64];
    int8_t scales[16];
    uint16_t d;
} blk_q6_k;

_Static_assert(sizeof(blk_q4_0) == 18, "Q4_0 block is 18 bytes");
_Static_assert(sizeof(blk_q4_1) == 20, "Q4_1 block is 20 bytes");
_Static_assert(sizeof(blk_q5_0) == 22, "Q5_0 block is 22 bytes");
_Static_assert(sizeof(blk_q8_0) == 34, "Q8_0 block is 34 bytes");
_Static_assert(sizeof(blk_q4_k) == 144, "Q4_K block is 144 bytes");
_Static_assert(sizeof(blk_q5_k) == 176, "Q5_K block is 176 bytes");
_Static_assert(sizeof(blk_q6_k) == 210, "Q6_K block is 210 bytes");

/* Q4_K's 12 scale bytes unpacked to 16: out[0..7] the six-bit scales, out[8..15] the mins
 * (the values of md_q4k_scale_min, four at a time: j < 4 in the low 6 bits of bytes j and
 * j + 4; j >= 4 from the nibbles of bytes 8..11 with the top 2 bits of bytes j - 4 and j). */
static inline void q4k_scales_mins16(const uint8_t *s12, uint8_t out[16]) {
    uint32_t s0, s1, s2, u[4];
    memcpy(&s0, s12, 4);
    memcpy(&s1, s12 + 4, 4);
    memcpy(&s2, s12 + 8, 4);
    u[0] = s0 & 0x3f3f3f3fu;
    u[1] = (s2 & 0x0f0f0f0fu) | ((s0 >> 6) & 0x03030303u) << 4;
    u[2] = s1 & 0x3f3f3f3fu;
    u[3] = ((s2 >> 4) & 0x0f0f0f0fu) | ((s1 >> 6) & 0x03030303u) << 4;
    memcpy(out, u, 16);
}

/* Quantized activations of one x row in scratch (row stride act_row_bytes):
 *   int8 q[cols]            at offset 0
 *   float d[cols/32]        per 32-block scale (Q4_0/Q4_1/Q5_0/Q8_0)   | per 256-block (K)
 *   float s[cols/32]        d * sum(q) per 32-block               | int16 bsum[cols/16]
 * x[i] ~= d[blk] * q[i]. */
typedef struct {
    const int8_t *q;
    const float *d;
    const float *s;       /* 32-block types */
    const int16_t *bsum;  /* K types: sums of q over each 16 elements */
} act_row;

/* One kernel computes a tile: rows [0, nr) of W (row stride wstride bytes, nb blocks
 * each) against activations a[0..nc), writing y[c*ldy + r]. nr <= KR, nc <= KC. */
typedef void (*tile_fn)(int nb, const uint8_t *w, size_t wstride, int nr, const act_row *a,
                        const float *const *xf, int nc, float *y, size_t ldy);
#define KR 4
#define KC 4

/* Kernels of one SIMD level, one per weight type (md_type); NULL = not provided (the
 * scalar table provides all). Float weight types get x rows in xf instead of a. */
typedef void (*quant32_fn)(const float *x, int cols, int8_t *q, float *d, float *s);
typedef void (*quantk_fn)(const float *x, int cols, int8_t *q, float *d, int16_t *bsum);
/* A packed tile (repack.c's layout): rows [0, nr) of one group of CPU_PACK_ROWS rows (wg: its
 * block 0; nr <= 16) against activations a[0..nc) (nc <= KCP), y[c*ldy + r] = the product,
 * or y[c*ldy + r] + the product when add (the same float add as a separate cpu_add). */
typedef void (*ptile_fn)(int nb, const uint8_t *wg, int nr, const act_row *a, int nc, float *y,
                         size_t ldy, int add);
#define KCP 8

/* Packed record of one block of 16 rows: quants (Q8_0: 512 bytes, else 256), Q5_0's fifth-bit
 * masks (64 bytes), d (16 fp16), Q4_1's m (16 fp16); 16 × the GGUF block's bytes. */
static inline size_t pk_block_bytes(int t) {
    return t == MD_TYPE_Q8_0 ? 544 : t == MD_TYPE_Q5_0 ? 352 : t == MD_TYPE_Q4_1 ? 320 : 288;
}
static inline size_t pk_d_off(int t) {
    return t == MD_TYPE_Q8_0 ? 512 : t == MD_TYPE_Q5_0 ? 320 : 256;
}

void cpu_ptile_q4_0_scalar(int nb, const uint8_t *wg, int nr, const act_row *a, int nc, float *y,
                           size_t ldy, int add);
void cpu_ptile_q4_1_scalar(int nb, const uint8_t *wg, int nr, const act_row *a, int nc, float *y,
                           size_t ldy, int add);
void cpu_ptile_q5_0_scalar(int nb, const uint8_t *wg, int nr, const act_row *a, int nc, float *y,
                           size_t ldy, int add);
void cpu_ptile_q8_0_scalar(int nb, const uint8_t *wg, int nr, const act_row *a, int nc, float *y,
                           size_t ldy, int add);

/* Packed K records (repack_k.c's layout): one per super-block of 256 elements × 16 rows. */
#define PK_Q4K_BYTES 2368
#define PK_Q4K_SC 2048 /* u8 scales [8][16] */
#define PK_Q4K_MN 2176 /* u8 mins [8][16] */
#define PK_Q4K_D 2304  /* fp16 d [16], then fp16 dmin [16] */
/* Q5_K: Q4_K's record, then the fifth bits, 64 bytes per sub-block s (bit g of byte 4r + i:
 * element 4g + i of sub-block s of row r); 16 GGUF blocks are 2816 bytes (+2.3%) */
#define PK_Q5K_BYTES 2880
#define PK_Q5K_QH 2368
#define PK_Q6K_BYTES 3360
#define PK_Q6K_QH 2048 /* high 2 bits [16 sub-blocks][64] */
#define PK_Q6K_SC 3072 /* int8 (sc_2p, sc_2p+1) [8][16] */
#define PK_Q6K_D 3328  /* fp16 d [16] */
size_t pk_k_block_bytes(int t);
/* A GGUF row of nb super-blocks into lane lr of the group whose record 0 is group (zeroed). */
void pk_k_pack_row(int t, const void *row, int nb, uint8_t *group, int lr);
void pk_k_dequant_row(int t, const void *Wp, int cols, int r, float *out);
void cpu_ptile_q4_k_scalar(int nb, const uint8_t *wg, int nr, const act_row *a, int nc, float *y,
                           size_t ldy, int add);
void cpu_ptile_q6_k_scalar(int nb, const uint8_t *wg, int nr, const act_row *a, int nc, float *y,
                           size_t ldy, int add);
void cpu_ptile_q5_k_scalar(int nb, const uint8_t *wg, int nr, const act_row *a, int nc, float *y,
                           size_t ldy, int add);
void cpu_ptile_q5_k_avx512(int nb, const uint8_t *wg, int nr, const act_row *a, int nc, float *y,
                           size_t ldy, int add);
void cpu_ptile_q5_k_avx2(int nb, const uint8_t *wg, int nr, const act_row *a, int nc, float *y,
                         size_t ldy, int add);
void cpu_ptile_q4_k_avx512(int nb, const uint8_t *wg, int nr, const act_row *a, int nc, float *y,
                           size_t ldy, int add);
void cpu_ptile_q6_k_avx512(int nb, const uint8_t *wg, int nr, const act_row *a, int nc, float *y,
                           size_t ldy, int add);
void cpu_ptile_q4_k_avx2(int nb, const uint8_t *wg, int nr, const act_row *a, int nc, float *y,
                         size_t ldy, int add);
void cpu_ptile_q6_k_avx2(int nb, const uint8_t *wg, int nr, const act_row *a, int nc, float *y,
                         size_t ldy, int add);

/* matmul_amx.c: the AMX packed kernel for type t (Q4_0, Q4_1, Q5_0, Q8_0): as a ptile_fn, but
 * nc a multiple of 16 (any count), the activations' q rows qstride bytes apart (a[c].q =
 * a[0].q + c·qstride), and the same bits as the AVX-512 packed kernel. Only where cpu_amx_use. */
void cpu_amx_ptile(int t, int nb, const uint8_t *wg, int nr, const act_row *a, size_t qstride,
                   int nc, float *y, size_t ldy, int add);
/* The tile configuration this thread's AMX registers hold, by the address of its owner's
 * configuration: an AMX user loads its own (LDTILECFG) where this is not it, and sets it, so
 * kernels with different tile shapes can share a thread. NULL: none loaded. */
extern _Thread_local const void *cpu_amx_cfg_loaded;
/* Products with fewer activation rows run the VNNI kernels (bench/kernels: the crossover). */
#define CPU_AMX_MIN_N 16

typedef struct {
    tile_fn f32, f16, bf16, q4_0, q4_1, q5_0, q8_0, q4_k, q5_k, q6_k;
    ptile_fn p_q4_0, p_q4_1, p_q5_0, p_q8_0; /* packed weights (repack.c) */
    ptile_fn p_q4_k, p_q5_k, p_q6_k;         /* packed K weights (repack_k.c) */
    quant32_fn quant32; /* x row -> int8 blocks of 32 with d and s = d*sum(q) */
    quantk_fn quantk;   /* x row -> int8 blocks of 256 with d and 16-element sums */
} kernel_table;

void cpu_quant_q8_32_scalar(const float *x, int cols, int8_t *q, float *d, float *s);
void cpu_quant_q8_k_scalar(const float *x, int cols, int8_t *q, float *d, int16_t *bsum);

extern const kernel_table cpu_kernels_scalar;
extern const kernel_table cpu_kernels_avx2;
extern const kernel_table cpu_kernels_avx512;

#endif
