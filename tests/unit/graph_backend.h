/* graph_backend.h — a test backend that imitates CUDA graph capture and replay on the CPU, so
 * the engine's side of backend.h's step_begin / step_end contract is tested without a GPU.
 *
 * "cpu-graph[:all][:fail=N]" wraps the CPU backend. Steps whose every sequence contributes
 * one token (decode, what the CUDA backend records) are keyed by (tokens, sequences, logit
 * rows); with ":all" every step is, keyed also by each sequence's token count. A key seen
 * for the second time is recorded: the ops between step_begin and step_end are stored, not
 * run, and step_end runs the recording. Later steps with that key replay: each op is checked
 * against the recorded one (same op, same buffers, same sizes: anything else would be a
 * stale kernel argument in a real graph) and queues nothing; step_end runs the recording.
 * Downloads, uploads or syncs between step_begin and step_end are contract violations too.
 * ":sample" adds backend.h's sample op (the engine's smp_sample_row over the row: penalties,
 * draw, logprob, as a device would make them). ":fail=N" makes the N-th recording fail halfway (as
 * an allocation inside a CUDA capture does), so step_end answers MD_STEP_RERUN and the engine must
 * issue the ops again.
 *
 * Violations make the op fail with MD_EINVAL and are counted; the test reads the counters. */
#ifndef MEDLEY_TESTS_GRAPH_BACKEND_H
#define MEDLEY_TESTS_GRAPH_BACKEND_H

#include "kernels/backend.h"

typedef struct {
    long eager_steps, recorded, replayed, reruns;
    long sampled_rows;   /* rows drawn by the ":sample" op */
    long penalised_rows; /* rows it penalised */
    long top_rows;       /* rows it listed top logprobs of */
    long violations;
    char first_violation[256];
} graph_backend_stats;

/* Register the "cpu-graph" device name (md_backend_register). */
int graph_backend_register(md_err *e);
/* Counters summed over every cpu-graph backend opened since the last reset. */
void graph_backend_get_stats(graph_backend_stats *out);
void graph_backend_reset_stats(void);

#endif
