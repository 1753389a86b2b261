/* step_plan.h — the host half of a CUDA step: check a md_batch and sort its tokens for the
 * attention kernels. Pure C, no CUDA calls, so it is tested on machines without a GPU.
 *
 * A sequence contributing one token is a decode entry {token row, block-table row, kv
 * length = position + 1} (split-KV kernel); a longer run of one sequence's tokens becomes
 * tiles {block-table row, first token row, tokens (<= CUDA_ATTN_TILE_Q), first position}
 * (tiled prefill kernel). Every index the device will follow is checked here first. */
#ifndef MEDLEY_KERNELS_CUDA_STEP_PLAN_H
#define MEDLEY_KERNELS_CUDA_STEP_PLAN_H

#include <stdint.h>

#include "common/err.h"
#include "kernels/backend.h"

#define CUDA_PLAN_TILE_Q 16 /* == CUDA_ATTN_TILE_Q */

typedef struct {
    int n_dec, n_tiles;
    int max_dec_len;   /* longest kv length among decode entries (0 when none) */
    int max_len;       /* longest kv length any token reads, decode or prefill (0: none) */
    int64_t max_block; /* largest block id any token reads (-1 when none) */
} cuda_step_plan;

/* Tiles a step of T tokens over S sequences can need: dec holds 3*T ints, tiles 4 * this. */
static inline int cuda_plan_max_tiles(int T, int S) {
    return T / CUDA_PLAN_TILE_Q + S;
}

/* Fill dec and tiles from b; MD_ERANGE naming the token, position, block or row that is
 * out of range or out of order. */
int cuda_plan_step(const md_batch *b, int32_t *dec, int32_t *tiles, cuda_step_plan *out, md_err *e);

/* An encoder step (no KV cache, md_batch max_blocks 0: backend.h attention_enc): each run of
 * equal tok_seq is one whole sequence, and becomes tiles {first row of the sequence, its
 * length, first query row, queries (<= tile_q)} in tiles (room for cuda_plan_max_tiles(T, S)
 * with tile_q >= CUDA_PLAN_TILE_Q); *max_run = the longest sequence. MD_ERANGE for a sequence
 * index outside [0, S) or more runs than sequences (a sequence's tokens not contiguous). */
int cuda_plan_enc_step(const md_batch *b, int tile_q, int32_t *tiles, int *n_tiles, int *max_run,
                       md_err *e);

#endif
