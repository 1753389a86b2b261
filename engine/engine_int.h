/* engine_int.h — the engine's state, shared by its files and nothing else: engine_open.c
 * (configuration, backend, model and tokenizer, the fit check, the sharded head, close),
 * engine.c (submit, the step loop, results) and engine_constrain.c (structured outputs: masks
 * and logit_bias). Not installed; callers use engine/engine.h.
 *
 * Ownership: md_engine_open allocates everything below, md_engine_close frees it; a seq
 * belongs to eng->all from submit until md_engine_release frees it (eng_seq_free). */
#ifndef MEDLEY_ENGINE_ENGINE_INT_H
#define MEDLEY_ENGINE_ENGINE_INT_H

#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"
#include "engine/kvcache.h"
#include "engine/model/model.h"
#include "engine/sampler.h"
#include "engine/shard/pipeline.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/weights/gguf.h"

enum { SEQ_WAITING, SEQ_RUNNING, SEQ_DONE };

typedef struct {
    uint64_t id;
    int state;
    md_sampling s;
    char **stop; /* owned copies */
    int n_stop;
    size_t max_stop_len;
    int32_t *toks; /* [cap] prompt then generated */
    int n_toks, cap, n_prompt;
    int n_computed;  /* tokens with K/V in the cache */
    int32_t *blocks; /* [max_blocks] block table */
    int n_blocks;
    uint64_t *bhash; /* [max_blocks] prefix hash of each published block */
    int n_published; /* leading blocks in the prefix index */
    smp_rng rng;
    tok_stream ts;
    char *text;
    size_t text_len, text_cap;
    md_finish finish;
    int cancel;
    int released; /* freed at the next step once finished */
    int text_cut; /* a stop string ended the text */
    int chunk;    /* tokens scheduled this step */
    int cached_prompt;
    int preemptions;
    uint64_t t_submit, t_admit, t_first, t_done;
    char err[512];
    /* structured outputs (engine_constrain.h): the grammar's matcher (NULL: none) and the
     * logit_bias copy */
    struct gr_matcher *gm;
    const struct gr_grammar *lazy; /* a grammar waiting for its trigger (owned copy) */
    char *trigger;
    size_t trigger_len;
    int anchored; /* the trigger counts only at the text's start */
    md_sample_bias *bias;
    int n_bias;
} seq;

struct md_engine {
    md_engine_config cfg;
    gguf_file *gf;
    int kv_type; /* KV cache element type (MD_TYPE_*) */
    int shadows; /* BF16 copies of the quantized weights requested (want_shadows) */
    void *synth; /* a synthetic model's GGUF image (synth.h), or NULL */
    size_t synth_len;
    tok_tokenizer *tok;
    md_backend *be; /* NULL when sharded */
    md_model *m;    /* NULL when sharded */
    md_pipe *pipe;  /* the stages of a sharded model, else NULL */
    md_hparams hp;  /* from the metadata */
    kv_cache *kv;
    md_kv_bufs kvb;
    md_fwd fwd;
    smp_scratch *sc;
    int n_vocab, n_ctx, bs, max_blocks, max_seqs, max_batch;
    int prefill_chunk; /* most prompt tokens of one sequence per step (0: the step budget) */
    uint64_t next_id;
    seq **all; /* every unreleased sequence */
    int n_all, cap_all;
    seq **running; /* [max_seqs] admission order */
    int n_running;
    seq **waiting; /* FIFO, preempted ones go to the front */
    int n_waiting, cap_waiting;
    /* step scratch, sized at open */
    int32_t *b_tokens, *b_seq, *b_pos, *b_slot, *b_seq_len, *b_table, *b_logit_rows;
    seq **b_seqs;
    float *logits;               /* [max_seqs, n_vocab] */
    int32_t *b_argmax;           /* [max_seqs] device greedy picks */
    int32_t *b_sampled;          /* [max_seqs] device draws (backend sample op) */
    md_sample_params *b_sparams; /* [max_seqs] their parameters */
    float *b_lp;                 /* [max_seqs] their logprobs */
    int32_t *b_top_tok;          /* [max_seqs, MD_TOP_LOGPROBS] their alternatives */
    float *b_top_lp;
    md_sample_pen *b_pen; /* their penalty entries, grown on demand */
    size_t cap_pen;
    md_step_token *out_toks;
    uint64_t *finished;
    int cap_finished;
    char *piece; /* tok_stream_push output */
    md_engine_stats st;
    struct eng_con *con; /* structured outputs' state (engine_constrain.c), NULL until used */
};
/* Free a sequence and everything it owns (NULL is a no-op); engine.c. */
void eng_seq_free(seq *q);

#endif
