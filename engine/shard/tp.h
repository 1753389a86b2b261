/* tp.h — a tensor-parallel stage (docs/sharding.md "Tensor parallelism"): the layers [lo, hi)
 * of a model split over tp ranks, each on its own backend. Every rank holds the query and KV
 * heads h * tp_rank / tp ... and the same share of the FFN's columns: Q, K, V, gate and up are
 * split by output rows (column-parallel), O and down by input columns (row-parallel), and the
 * partial products of O and down are summed over the ranks (all-reduce) before the residual
 * add, so every rank holds the same hidden states after each block. The embedding, the norms
 * and the head are replicated; rank 0 computes the logits.
 *
 * All-reduce: between CPU ranks of one process, through shared host memory — every rank
 * downloads its partial sum into its slot, and after a barrier every rank adds the slots in
 * rank order, so all ranks get the same bits. This is for testing the sharding arithmetic on
 * CPU: CPU ranks share the memory bandwidth one rank already saturates, so it is not faster.
 * Between CUDA devices, NCCL's all-reduce (backend.h all_reduce, queued on each GPU's stream)
 * when every rank's backend has it (a CUDA build with NCCL, the library loadable at run time)
 * and no two ranks share a GPU; otherwise the host path. md_tp_describe says which.
 *
 * Ownership: md_tp_open gives a group the caller frees with md_tp_close (NULL is fine). Ranks
 * run in threads the group owns; one caller at a time calls md_tp_run. */
#ifndef MEDLEY_ENGINE_TP_H
#define MEDLEY_ENGINE_TP_H

#include "common/err.h"
#include "engine/weights/gguf.h"
#include "engine/shard/stage.h"

typedef struct md_tp md_tp;

/* c->tp ranks over c->device: a comma list of c->tp devices, or one name every rank opens
 * (each rank gets c->n_threads / tp CPU threads, at least 1). Heads and FFN width must
 * divide (stage.c checked). */
int md_tp_open(const md_stage_config *c, const gguf_file *gf, md_tp **out, md_err *e);
void md_tp_close(md_tp *t);
/* As md_stage_run. */
int md_tp_run(md_tp *t, const md_batch *b, const float *in, float *out, md_err *e);
const char *md_tp_describe(md_tp *t);

#endif
