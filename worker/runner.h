/* runner.h — a model runner: what the worker drives for one served model. Two kinds:
 *   echo    answers with the prompt (the last user message, or the completion prompt) after
 *           a configurable delay; one "token" is one byte (its logprob 0, itself its
 *           only alternative). Queue behaviour
 *           is tested and benchmarked with it apart from inference.
 *   engine  chat template -> tokens -> md_engine_submit -> step loop -> text and usage.
 *   embed   /v1/embeddings lines on an encoder model: inputs of many lines packed into the
 *           embedder's steps (engine/embedder.h), one vector per input.
 *
 * The worker calls start() for each request it reads (as many as capacity() allows) and
 * poll() in its loop; poll() reports every finished request through the done callback,
 * whose wk_result (text, lp and the bytes they point to) is valid only during the call.
 * Tags are the worker's; runners hand them back untouched. One thread drives a runner. */
#ifndef MEDLEY_WORKER_RUNNER_H
#define MEDLEY_WORKER_RUNNER_H

#include "common/err.h"
#include "queue/validate.h"

/* One of the most likely tokens at a position: an alternative (bytes as wk_token_lp's). */
typedef struct {
    const char *bytes;
    size_t n_bytes;
    float logprob; /* under the model's raw logits, as wk_token_lp's */
} wk_alt_lp;

/* One generated token of the returned text, for logprobs. */
typedef struct {
    const char *bytes; /* the token's bytes as the tokenizer decodes it: possibly part of a
                          UTF-8 character, so not a string (n_bytes of them, no NUL) */
    size_t n_bytes;
    size_t text_offset; /* byte offset in text where this token's text begins */
    float logprob;      /* log-probability of the token under the model's raw logits */
    /* (n_top) the most likely tokens at this position, most likely first: the request's
     * top_logprobs of them, fewer when the model listed fewer, none when not asked */
    const wk_alt_lp *top;
    int n_top;
} wk_token_lp;

/* One function call of an answer: the function's name and its arguments as compact JSON. */
typedef struct wk_call {
    const char *name, *arguments;
} wk_call;

typedef struct {
    const char *text;          /* generated text (valid UTF-8) */
    const char *finish_reason; /* "stop" | "length" | "tool_calls" */
    int prompt_tokens, completion_tokens;
    double prefill_ms, decode_ms;
    double first_token_ms; /* from start() to the first generated token (metrics) */
    /* The request asked for logprobs (q_request.logprobs): lp[0..n_lp) are the tokens of
     * text in order, n_lp possibly 0. Tokens the text does not show are left out: an
     * end-of-generation token, and those past a stop string's start (a token that begins
     * before the cut is kept, with all its bytes). */
    int logprobs;
    int top_logprobs; /* alternatives asked for per token (q_request.top_logprobs) */
    const wk_token_lp *lp;
    int n_lp;
    /* Structured output (docs/structured.md, "Request side"). n_calls > 0: the answer calls
     * functions (finish_reason "tool_calls"): calls[i] names one and gives its arguments as
     * compact JSON text; the worker writes message.tool_calls, and text as content (null
     * when "": a "required" call, or an "auto" one with nothing before it). constrained:
     * the request had a constraint; then compile_ms (0: found compiled in the cache, then
     * compile_cached = 1) and schema_relaxed (keywords not enforced under strict: false, ""
     * when none) go into the answer's medley object. */
    const struct wk_call *calls;
    int n_calls;
    int constrained, compile_cached;
    double compile_ms;
    const char *schema_relaxed;
    /* An embeddings answer (runner_embed.c): the response body, OpenAI's object "list" with
     * data and usage, without "model" (the worker adds it); the runner keeps its reference,
     * the worker takes its own. NULL for text answers. */
    json_t *body;
    const char *error; /* non-NULL: the request failed inside the runner */
    /* Not the request's failure but its device's (a failed engine step: a GPU error). The
     * worker hands the entry back for another worker instead of answering it. */
    int device_lost;
} wk_result;

typedef void (*wk_done_fn)(void *ctx, void *tag, const wk_result *res);

typedef struct {
    int echo_delay_ms;        /* echo: delay before each answer (MEDLEY_ECHO_DELAY_MS) */
    int echo_ctx;             /* echo: context length in bytes (default 8192) */
    int max_seqs;             /* concurrent requests (0: echo 256, engine: the device's
                                 default, 64 on cpu, 256 on cuda) */
    const char *device;       /* engine: "cpu", "cuda:0", ... (NULL = cpu) */
    int n_threads;            /* engine: CPU threads (0 = all cores) */
    const char *kv_type;      /* engine: KV cache "f16" / "f32" (NULL = the backend's) */
    const char *bf16_weights; /* engine: BF16 weight copies "auto" (NULL) / "on" / "off" */
    /* engine, sharded replicas (engine/shard/pipeline.h): the model as pipeline stages, a comma
     * list of "[tcp://HOST:PORT/]DEVICE:LO-HI" (NULL: the whole model on `device`); the
     * stages are told the registry name, which each resolves on its own host */
    const char *stages;
    int tp;         /* engine: tensor-parallel ranks of each local stage (0: none) */
    size_t mem_cap; /* engine: each local stage's memory cap in bytes (0: none) */
    /* engine: --chat-template family or "none" (NULL: the model's own, refused at load
     * when medley does not know it) */
    const char *chat_template;
    int allow_path; /* engine: the model may be a GGUF file or HF directory path (`medley run
                       -m PATH`); workers serving a queue take names only (design §7) */
    /* embedding models: the encoder's products "f32" (NULL, the default) or "bf16" (AVX512-BF16
     * CPUs; docs/embeddings.md "Speed"); refused at open where the device cannot */
    const char *embed_precision;
} wk_runner_opts;

typedef struct wk_runner wk_runner;

/* Open the runner for a model name: "echo" or a registered model (engine). Fails clearly
 * when the model cannot be served (unknown, not fetched, or no engine in this build). */
int wk_runner_open(const char *model, const wk_runner_opts *o, wk_runner **out, md_err *e);
void wk_runner_close(wk_runner *r);

const char *wk_runner_kind(const wk_runner *r);   /* "echo" | "engine" | "embed" */
const char *wk_runner_device(const wk_runner *r); /* device type for output lines: "cpu", ... */
int wk_runner_capacity(const wk_runner *r);
int wk_runner_live(const wk_runner *r);
int wk_runner_n_ctx(const wk_runner *r);
/* Get a validated request ready for this runner (before start): its constraint compiled,
 * or found compiled, in the runner's grammar cache (worker/grammars.h), and what only the
 * model can tell checked (tool_choice "auto" needs a chat template with a tool-call format;
 * logit_bias ids must be in the vocabulary). 0, or -1 with ve filled (a 400 line). Call
 * wk_runner_release for req afterwards, whether or not it was started. */
int wk_runner_prepare(wk_runner *r, q_request *req, q_verr *ve);
void wk_runner_release(wk_runner *r, q_request *req);
/* Start a request. MD_ERANGE (message for the client in e) when the prompt plus max_tokens
 * does not fit the context; other errors are the runner's. */
int wk_runner_start(wk_runner *r, const q_request *req, void *tag, md_err *e);
/* Make progress; blocks at most wait_ms when nothing is ready. Returns 0 or an error that
 * failed every live request (each already reported through done with res->error). */
int wk_runner_poll(wk_runner *r, int wait_ms, wk_done_fn done, void *ctx, md_err *e);
/* The text a running request (tag) has generated so far, *len bytes, valid UTF-8 (the
 * runner's, valid until its next poll), for streaming it; a stop string found is cut off
 * already. NULL when the runner does not know the tag or streams nothing (embeddings). */
const char *wk_runner_partial(wk_runner *r, void *tag, size_t *len);
/* Stop a running request (tag) early: it is reported done at a later poll (its answer then
 * says why). Nothing when the runner does not know the tag. */
void wk_runner_cancel(wk_runner *r, void *tag);

/* What a runner counts for the worker's metrics (docs/operations.md, "Metrics"); zeros for a
 * runner that has none of it (echo: no steps, no KV cache). */
typedef struct {
    long steps;                    /* engine steps run */
    double last_step_s;            /* how long the last one took */
    long preemptions;              /* sequences sent back to wait, their K/V dropped */
    int kv_blocks, kv_blocks_free; /* KV cache blocks (0: no KV cache) */
} wk_runner_stats;
void wk_runner_get_stats(const wk_runner *r, wk_runner_stats *st);

#endif
