/* cmd_generate.h — private to `medley generate`: its options, and what the single prompt
 * (cmd_generate.c) and the batch mode (cmd_generate_batch.c) share. */
#ifndef MEDLEY_CLI_CMD_GENERATE_H
#define MEDLEY_CLI_CMD_GENERATE_H

#include <jansson.h>
#include <stdint.h>

#include "common/err.h"
#include "engine/engine.h"
#include "engine/tokenizer/tokenizer.h"

#define MAX_STOP 8

typedef struct {
    const char *model, *prompt, *chat, *system, *batch, *out, *device;
    int json, n_threads, max_seqs, batch_tokens, prefill_chunk, n_ctx, kv_mb;
    const char *kv_type;
    const char *bf16_weights;
    const char *chat_template;
    const char *stages, *devices;
    int tp, microbatches;
    const char *stage_secret_file;
    int stage_timeout_ms, stage_load_timeout_ms;
    long long mem_cap;
    md_sampling s;
    const char *stop[MAX_STOP + 1];
    int n_stop;
} gen_opts;

/* The step results of one sequence's tokens so far (logprobs and alternatives), grown by
 * doubling. */
typedef struct {
    md_step_token *t;
    int n, cap;
} lp_list;

/* "stop", "length", "error", "cancelled" or "none". */
const char *gen_finish_name(md_finish f);
/* Tokenize a raw prompt or render chat messages (a JSON array of {role, content}, or one user
 * message with an optional system one). *ids is malloc'd. */
int gen_encode(tok_tokenizer *tok, const char *prompt, json_t *messages, const char *user,
               const char *system, int32_t **ids, int *n, md_err *e);
/* Append t; -1 when out of memory (the list is kept). */
int gen_lp_push(lp_list *l, const md_step_token *t);
/* obj's "logprobs" (one per token) and, with n_top > 0, "top_logprobs". */
void gen_lp_json(json_t *obj, const tok_tokenizer *tok, const lp_list *l, int n_top);
/* --batch: every line of o->batch through eng, one result line each to o->out (stdout when
 * NULL), throughput and latency on stderr. The exit status: 1 when a line failed. */
int gen_run_batch(const gen_opts *o, md_engine *eng);

#endif
