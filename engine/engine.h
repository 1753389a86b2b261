/* engine.h — the batch-first inference engine (docs/design.md §5).
 *
 * One md_engine holds one loaded model on one device (one backend) and runs many sequences
 * together: md_engine_submit() adds a sequence, md_engine_step() runs one iteration over
 * every live sequence (chunked prefill mixed with decode) and reports new tokens and
 * finished sequences. Single-threaded API: one caller thread drives an engine (the
 * engine uses its own worker threads inside step()). Nothing here knows about Redis.
 *
 * Ownership: the engine owns its model, KV cache and sequences; md_engine_step() fills a
 * caller-provided md_step_result whose arrays stay valid until the next step() call. */
#ifndef MEDLEY_ENGINE_ENGINE_H
#define MEDLEY_ENGINE_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

typedef struct md_engine md_engine;
typedef struct gr_grammar gr_grammar; /* engine/grammar/grammar.h */

typedef struct {
    const char *model_path;   /* GGUF file (resolved through the registry by the caller) */
    const char *device;       /* "cpu" (default when NULL), "cuda:0", ... */
    int n_threads;            /* CPU threads; 0 = number of cores */
    int max_seqs;             /* most live sequences at once (0 = the backend's default:
                                 256 on cuda, 64 on cpu) */
    int max_batch_tokens;     /* tokens per step over all sequences (0 = the backend's
                                 default: 2048 on cuda, 512 on cpu) */
    int prefill_chunk;        /* most prompt tokens one sequence computes in a step (0 = the
                                 step's budget): a long prompt runs in chunks of this many,
                                 decodes of the other sequences in the same steps
                                 (docs/engine.md "Chunked prefill") */
    size_t kv_budget_bytes;   /* KV cache memory budget (0 = a default that fits) */
    int kv_block_tokens;      /* tokens per KV block (0 = 16) */
    int n_ctx;                /* per-sequence context limit (0 = the model's) */
    const char *kv_type;      /* KV cache element type: "f16", "f32" (NULL = the backend's: F16
                                 on cpu and cuda, F32 on cpu-exact) */
    const char *bf16_weights; /* quantized weights also kept as BF16 for batched steps, on a
                                 backend that offers it (weight_shadow): "on", "off", or
                                 "auto" (NULL): when weights and copies take at most half the
                                 device memory free before loading */
    /* Sharded replicas (docs/sharding.md): a comma list of "[tcp://HOST:PORT/]DEVICE:LO-HI"
     * pipeline stages (engine/shard/pipeline.h); NULL = the whole model on `device`. */
    const char *stages;
    const char *model_name; /* what the stages are told to open (a registry name resolves on
                               each stage's host); NULL = model_path */
    int tp;                 /* tensor-parallel ranks of each local stage (0/1 = none); with
                               no stages, tp > 1 makes one stage of the whole model on
                               `device`, which may list the ranks' devices ("cuda:0,cuda:1") */
    size_t stage_mem_cap;   /* each local stage's memory cap in bytes (0 = none) */
    int microbatches;       /* micro-batches per step through the stages (0 = eight per
                               stage) */
    int stage_timeout_ms;   /* a remote stage's answer (0 = 60 s) */
    /* a remote stage's READY, while it loads (0 = 60 s) */
    int stage_load_timeout_ms;
    /* the remote stages' secret (docs/sharding.md "Authentication"); NULL =
     * $MEDLEY_STAGE_SECRET_FILE */
    const char *stage_secret_file;
    /* --chat-template: a family overriding the model's template, "none" for raw prompts
     * only; NULL = the model's, which must then be one medley recognises (or absent) */
    const char *chat_template;
} md_engine_config;

/* One logit_bias entry (OpenAI's logit_bias map): bias added to token's logit. */
typedef struct {
    int32_t token; /* [0, n_vocab) */
    float bias;    /* [-100, 100] */
} md_logit_bias;

#define MD_LOGIT_BIAS_MAX 1024 /* most logit_bias entries per sequence */

typedef struct {
    float temperature;        /* 0 = greedy */
    float top_p;              /* 1 = off */
    int top_k;                /* 0 = off */
    float min_p;              /* 0 = off */
    float repetition_penalty; /* 1 = off */
    float presence_penalty;   /* 0 = off */
    float frequency_penalty;  /* 0 = off */
    uint64_t seed;            /* same seed + same prompt = same tokens, whatever the batch */
    int max_tokens;           /* generated tokens limit */
    const char *const *stop;  /* stop strings (NULL-terminated list or NULL); copied */
    int logprobs;             /* report the chosen tokens' logprobs */
    int top_logprobs;         /* the most likely tokens at each position too (0..20; their
                                 logprobs and the chosen token's are reported) */
    int ignore_eos;
    /* Structured output (docs/engine.md "Sampling"): grammar (borrowed, must outlive the
     * sequence; NULL = unconstrained) restricts every generated token to those that keep the
     * output inside it; the engine makes the sequence's own matcher at submit. The sequence
     * ends with MD_FINISH_STOP when the grammar allows nothing but an end token or an end
     * token is chosen where the grammar may end (ignore_eos is then ignored: the grammar
     * decides); max_tokens still ends it with MD_FINISH_LENGTH. logit_bias [n_logit_bias]
     * (copied at submit; NULL/0 = none) is added to the raw logits; the same token may
     * appear twice (the biases add up). With either, logprobs and top_logprobs are those of
     * the constrained distribution: log-softmax of the raw logits plus the bias, masked
     * tokens at -inf (never listed), before penalties and temperature. */
    const gr_grammar *grammar;
    /* With grammar: a trigger (copied at submit; NULL = the grammar holds from the first
     * token). The sequence is unconstrained until its generated text contains the trigger;
     * the grammar then holds from the trigger's first byte (it must accept the trigger) to
     * the end. If the text from there (the token that completed the trigger may carry more
     * bytes) already leaves the grammar, the sequence stays unconstrained. A chat template's
     * tool calls: free text, or a call once the model writes "<tool_call>". */
    const char *grammar_trigger;
    int grammar_trigger_anchored; /* the trigger counts only at the start of the text (after
                                     whitespace): Llama 3's bare JSON call */
    const md_logit_bias *logit_bias;
    int n_logit_bias;
} md_sampling;

void md_sampling_default(md_sampling *s);
/* Check ranges (temperature [0, 100], top_p (0, 1], logit_bias entries' biases in [-100, 100]
 * and count <= MD_LOGIT_BIAS_MAX, ...); MD_EINVAL names the field. Token ids of logit_bias are
 * checked against the vocabulary by md_engine_submit (MD_EINVAL naming the entry). */
int md_sampling_validate(const md_sampling *s, md_err *e);

typedef enum {
    MD_FINISH_NONE = 0,
    MD_FINISH_STOP,   /* EOS or a stop string */
    MD_FINISH_LENGTH, /* max_tokens or context limit */
    MD_FINISH_ERROR,  /* see md_seq_error() */
    MD_FINISH_CANCELLED,
} md_finish;

#define MD_TOP_LOGPROBS 20 /* most alternatives md_sampling.top_logprobs can ask for */

typedef struct {
    uint64_t seq_id; /* as returned by md_engine_submit */
    int32_t token;   /* newly generated token */
    float logprob;   /* when requested: log-softmax of the raw logits at token (with a
                        grammar or logit_bias: of the constrained logits, md_sampling) */
    /* top_logprobs: the n_top most likely tokens under the same logits, most likely first
     * (lowest id first among equals), with their logprobs; fewer when fewer are finite */
    int n_top;
    int32_t top_token[MD_TOP_LOGPROBS];
    float top_logprob[MD_TOP_LOGPROBS];
} md_step_token;

typedef struct {
    const md_step_token *tokens; /* tokens generated this step */
    int n_tokens;
    const uint64_t *finished; /* sequences that finished this step */
    int n_finished;
    int n_live; /* sequences still running or waiting */
} md_step_result;

/* What a model file says about itself, read from its metadata without loading a weight: for
 * sizing an engine (and naming what was measured) before opening it. */
typedef struct {
    int n_ctx_train;               /* the context it was trained for */
    size_t kv_bytes_per_token_f32; /* K and V of one token over all layers, F32 cache */
    char weight_type[16];          /* element type of blk.0.attn_q.weight ("Q4_K"), "unknown" */
} md_model_facts;
/* path as md_engine_config.model_path: a GGUF file or a synthetic model (engine/weights/synth.h).
 */
int md_engine_model_facts(const char *path, md_model_facts *out, md_err *e);

int md_engine_open(const md_engine_config *cfg, md_engine **out, md_err *e);
void md_engine_close(md_engine *eng);

/* Model facts the caller needs to validate requests. */
int md_engine_n_ctx(const md_engine *eng);
int md_engine_n_vocab(const md_engine *eng);
/* Most live sequences and most tokens per step, as chosen at open (the configuration's, else
 * the backend's defaults). */
int md_engine_max_seqs(const md_engine *eng);
int md_engine_max_batch_tokens(const md_engine *eng);
/* The pipeline of a sharded engine (engine/shard/pipeline.h), NULL for one device. */
struct md_pipe *md_engine_pipe(md_engine *eng);
struct tok_tokenizer *md_engine_tokenizer(md_engine *eng); /* owned by the engine */

/* Queue a sequence of prompt tokens (copied). Returns 0 and its id in *seq_id, or an error
 * (e.g. MD_ERANGE when the prompt + max_tokens exceed the context). */
int md_engine_submit(md_engine *eng, const int32_t *prompt, int n_prompt, const md_sampling *s,
                     uint64_t *seq_id, md_err *e);
/* Cancel a live sequence; it is reported finished (CANCELLED) at the next step. */
void md_engine_cancel(md_engine *eng, uint64_t seq_id);
/* Run one iteration. Returns 0, or an error that failed every live sequence (device lost). */
int md_engine_step(md_engine *eng, md_step_result *res, md_err *e);

/* Finished sequences stay readable until md_engine_release(). */
md_finish md_seq_finish(const md_engine *eng, uint64_t seq_id);
int md_seq_tokens(const md_engine *eng, uint64_t seq_id, const int32_t **toks, int *n);
/* Generated text (stop string cut off, valid UTF-8). Owned by the engine. */
const char *md_seq_text(const md_engine *eng, uint64_t seq_id);
const char *md_seq_error(const md_engine *eng, uint64_t seq_id);
typedef struct {
    int prompt_tokens, completion_tokens, cached_prompt_tokens;
    double queue_ms, prefill_ms, decode_ms;
} md_seq_stats;
void md_seq_get_stats(const md_engine *eng, uint64_t seq_id, md_seq_stats *st);
void md_engine_release(md_engine *eng, uint64_t seq_id);

/* Counters since open, for logs, benchmarks and tests. */
typedef struct {
    long steps;             /* forward passes run */
    long tokens;            /* tokens through the forward pass (prefill + decode) */
    long preemptions;       /* sequences sent back to wait, their K/V dropped */
    long prefix_hit_tokens; /* prompt tokens whose K/V were shared instead of computed */
    long masks;             /* grammar token masks filled (one per constrained row a step) */
    long mask_ns;           /* time filling them (inline on the CPU backend, else on the
                               mask thread, overlapping the forward pass) */
    long mask_wait_ns;      /* time a step waited for the mask thread after its forward pass */
    int kv_blocks, kv_block_tokens, kv_blocks_free;
    size_t kv_bytes; /* KV cache memory */
} md_engine_stats;
void md_engine_get_stats(const md_engine *eng, md_engine_stats *st);

#endif
