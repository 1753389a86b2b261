/* engine.c — the continuous-batching loop (docs/design.md §5): sequences wait, are admitted,
 * run in chunks that mix prefill and decode in one forward pass per step, share prompt-prefix
 * KV blocks, are preempted (blocks released, recomputed later) when the KV budget runs out,
 * and finish on EOS, a stop string, max_tokens or the context limit.
 *
 * A sequence is its token list (prompt + generated) and how many of those have K/V in the
 * cache (n_computed). Each step gives every running sequence the next chunk of its uncomputed
 * tokens (one token when decoding); when a chunk reaches the end of the list, the step's
 * logits at that row pick the next token. Prefill and decode are therefore one code path, and
 * a preempted sequence resumes by recomputing its list: its sampler state (random stream,
 * penalties) is kept, so it produces exactly the tokens it would have produced.
 *
 * Scheduling order is admission order: older sequences get budget and blocks first; when
 * blocks run out, the newest running sequence is preempted (vLLM's recompute policy).
 *
 * Opening and closing the engine live in engine_open.c; the state both files share in
 * engine_int.h. */
#define _GNU_SOURCE /* memmem */
#include "engine/engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"
#include "engine/engine_int.h"
#include "engine/kvcache.h"
#include "engine/model/model.h"
#include "engine/engine_constrain.h"
#include "engine/sampler.h"
#include "engine/shard/pipeline.h"
#include "engine/tokenizer/tokenizer.h"

_Static_assert(MD_SAMPLE_TOP == MD_TOP_LOGPROBS, "backend.h and engine.h top logprobs");

static seq *find_seq(const md_engine *eng, uint64_t id) {
    for (int i = 0; i < eng->n_all; i++)
        if (eng->all[i]->id == id)
            return eng->all[i];
    return NULL;
}

void eng_seq_free(seq *q) {
    if (!q)
        return;
    eng_con_seq_free(q);
    for (int i = 0; i < q->n_stop; i++)
        free(q->stop[i]);
    free(q->stop);
    free(q->toks);
    free(q->blocks);
    free(q->bhash);
    free(q->text);
    free(q);
}

/* Longest generation a request may ask for (max_tokens 0 means up to the context). */
static int gen_limit(const md_engine *eng, const md_sampling *s, int n_prompt) {
    return s->max_tokens ? s->max_tokens : eng->n_ctx - n_prompt;
}

int md_engine_submit(md_engine *eng, const int32_t *prompt, int n_prompt, const md_sampling *s,
                     uint64_t *seq_id, md_err *e) {
    int rc = smp_validate(s, e);
    if (rc)
        return rc;
    if (n_prompt < 1)
        return md_errf(e, MD_EINVAL, "empty prompt");
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= eng->n_vocab)
            return md_errf(e, MD_EINVAL, "prompt token %d at index %d outside the vocabulary of %d",
                           (int)prompt[i], i, eng->n_vocab);
    if (n_prompt >= eng->n_ctx || (long)n_prompt + s->max_tokens > eng->n_ctx)
        return md_errf(e, MD_ERANGE,
                       "prompt of %d tokens + max_tokens %d exceed the context of %d tokens",
                       n_prompt, s->max_tokens, eng->n_ctx);
    int total = n_prompt + gen_limit(eng, s, n_prompt);
    int need_blocks = (total + eng->bs - 1) / eng->bs;
    if (need_blocks > kv_n_blocks(eng->kv))
        return md_errf(e, MD_ERANGE,
                       "prompt of %d tokens + max_tokens %d need %d KV blocks; the KV budget "
                       "holds %d",
                       n_prompt, s->max_tokens, need_blocks, kv_n_blocks(eng->kv));
    if (eng->n_all == eng->cap_all) {
        int cap = eng->cap_all ? eng->cap_all * 2 : 64;
        seq **a = realloc(eng->all, (size_t)cap * sizeof *a);
        uint64_t *f = realloc(eng->finished, (size_t)cap * sizeof *f);
        if (a)
            eng->all = a;
        if (f)
            eng->finished = f;
        if (!a || !f)
            return md_errf(e, MD_ENOMEM, "out of memory");
        eng->cap_all = eng->cap_finished = cap;
    }
    if (eng->n_waiting == eng->cap_waiting) {
        int cap = eng->cap_waiting ? eng->cap_waiting * 2 : 64;
        seq **w = realloc(eng->waiting, (size_t)cap * sizeof *w);
        if (!w)
            return md_errf(e, MD_ENOMEM, "out of memory");
        eng->waiting = w;
        eng->cap_waiting = cap;
    }
    seq *q = calloc(1, sizeof *q);
    if (!q)
        return md_errf(e, MD_ENOMEM, "out of memory");
    q->s = *s;
    q->s.stop = NULL;
    if ((rc = eng_con_seq_init(eng, q, s, e))) {
        eng_seq_free(q);
        return rc;
    }
    q->cap = total;
    q->toks = malloc((size_t)q->cap * sizeof *q->toks);
    q->blocks = malloc((size_t)eng->max_blocks * sizeof *q->blocks);
    q->bhash = malloc((size_t)eng->max_blocks * sizeof *q->bhash);
    q->text_cap = 256;
    q->text = malloc(q->text_cap);
    int n_stop = 0;
    while (s->stop && s->stop[n_stop])
        n_stop++;
    q->stop = calloc((size_t)n_stop + 1, sizeof *q->stop);
    if (!q->toks || !q->blocks || !q->bhash || !q->text || !q->stop) {
        eng_seq_free(q);
        return md_errf(e, MD_ENOMEM, "out of memory");
    }
    for (int i = 0; i < n_stop; i++) {
        if (!s->stop[i][0])
            continue;
        q->stop[q->n_stop] = strdup(s->stop[i]);
        if (!q->stop[q->n_stop]) {
            eng_seq_free(q);
            return md_errf(e, MD_ENOMEM, "out of memory");
        }
        size_t l = strlen(s->stop[i]);
        if (l > q->max_stop_len)
            q->max_stop_len = l;
        q->n_stop++;
    }
    memcpy(q->toks, prompt, (size_t)n_prompt * sizeof *prompt);
    q->n_toks = q->n_prompt = n_prompt;
    q->text[0] = 0;
    smp_rng_seed(&q->rng, s->seed);
    tok_stream_init(&q->ts);
    q->id = ++eng->next_id;
    q->state = SEQ_WAITING;
    q->t_submit = md_mono_ns();
    eng->all[eng->n_all++] = q;
    eng->waiting[eng->n_waiting++] = q;
    *seq_id = q->id;
    return 0;
}

void md_engine_cancel(md_engine *eng, uint64_t seq_id) {
    seq *q = find_seq(eng, seq_id);
    if (q && q->state != SEQ_DONE)
        q->cancel = 1;
}

/* Release a sequence's blocks (published ones stay in the prefix index as cached). */
static void drop_blocks(md_engine *eng, seq *q) {
    for (int i = 0; i < q->n_blocks; i++)
        kv_unref(eng->kv, q->blocks[i]);
    q->n_blocks = 0;
    q->n_published = 0;
    q->n_computed = 0;
}

static void remove_running(md_engine *eng, int i) {
    memmove(eng->running + i, eng->running + i + 1,
            (size_t)(eng->n_running - i - 1) * sizeof *eng->running);
    eng->n_running--;
}

static void flush_text(md_engine *eng, seq *q);

static void finish(md_engine *eng, seq *q, md_finish why, int *n_fin) {
    if (!q->text_cut)
        flush_text(eng, q);
    drop_blocks(eng, q);
    q->state = SEQ_DONE;
    q->finish = why;
    q->t_done = md_mono_ns();
    eng->finished[(*n_fin)++] = q->id;
}

/* Preempt running[i]: its blocks go back, it waits at the front of the queue and recomputes
 * its tokens when readmitted. */
static void preempt(md_engine *eng, int i) {
    seq *q = eng->running[i];
    drop_blocks(eng, q);
    q->state = SEQ_WAITING;
    q->preemptions++;
    eng->st.preemptions++;
    remove_running(eng, i);
    memmove(eng->waiting + 1, eng->waiting, (size_t)eng->n_waiting * sizeof *eng->waiting);
    eng->waiting[0] = q;
    eng->n_waiting++;
}

/* Blocks q needs so that positions [0, upto) have a slot. */
static int blocks_needed(const md_engine *eng, const seq *q, int upto) {
    int want = (upto + eng->bs - 1) / eng->bs;
    return want > q->n_blocks ? want - q->n_blocks : 0;
}

static void grow_blocks(md_engine *eng, seq *q, int upto) {
    int n = blocks_needed(eng, q, upto);
    for (int i = 0; i < n; i++)
        q->blocks[q->n_blocks++] = kv_alloc(eng->kv);
}

/* Share the longest run of indexed full blocks matching q's tokens, leaving at least the last
 * token to compute (its logits are needed). Returns the number of tokens now cached. */
static int match_prefix(md_engine *eng, seq *q) {
    uint64_t parent = 0;
    int full = (q->n_toks - 1) / eng->bs;
    for (int j = 0; j < full; j++) {
        int32_t b = kv_lookup(eng->kv, parent, q->toks + (size_t)j * eng->bs);
        if (b < 0)
            break;
        kv_ref(eng->kv, b);
        parent = kv_hash(parent, q->toks + (size_t)j * eng->bs, eng->bs);
        q->blocks[q->n_blocks] = b;
        q->bhash[q->n_blocks] = parent;
        q->n_blocks++;
    }
    q->n_published = q->n_blocks;
    q->n_computed = q->n_blocks * eng->bs;
    eng->st.prefix_hit_tokens += q->n_computed;
    return q->n_computed;
}

/* Index the blocks that this step's chunk fills (their K/V are written in this step's forward
 * pass, before any later reader's attention in the same or a later step). */
static void publish(md_engine *eng, seq *q, int upto) {
    int full = upto / eng->bs;
    while (q->n_published < full) {
        int j = q->n_published;
        uint64_t parent = j ? q->bhash[j - 1] : 0;
        q->bhash[j] = kv_publish(eng->kv, q->blocks[j], parent, q->toks + (size_t)j * eng->bs);
        q->n_published++;
    }
}

/* The newest running sequence after index i with nothing scheduled this step (its blocks can
 * be taken back without undoing this step's layout), or -1. */
static int victim(const md_engine *eng, int i) {
    for (int v = eng->n_running - 1; v > i; v--)
        if (eng->running[v]->chunk == 0)
            return v;
    return -1;
}

/* Give running[i] a chunk of `chunk` tokens: blocks grown (newer unscheduled sequences
 * preempted for them) and published. Returns 0, or -1 when the blocks cannot be had even so:
 * running[i] itself is then preempted. */
static int take_chunk(md_engine *eng, int i, int chunk) {
    seq *q = eng->running[i];
    int need = blocks_needed(eng, q, q->n_computed + chunk), v;
    while (need > kv_n_available(eng->kv) && (v = victim(eng, i)) >= 0)
        preempt(eng, v);
    if (need > kv_n_available(eng->kv)) {
        preempt(eng, i);
        return -1;
    }
    grow_blocks(eng, q, q->n_computed + chunk);
    publish(eng, q, q->n_computed + chunk);
    q->chunk = chunk;
    return 0;
}

/* Most tokens of its list a sequence computes in this step: what is left of it, of the step's
 * budget, and of the prefill chunk. */
static int chunk_for(const md_engine *eng, const seq *q, int T) {
    int chunk = q->n_toks - q->n_computed;
    if (chunk > eng->max_batch - T)
        chunk = eng->max_batch - T;
    if (eng->prefill_chunk > 0 && chunk > eng->prefill_chunk)
        chunk = eng->prefill_chunk;
    return chunk;
}

/* Pick this step's chunks (docs/engine.md "Chunked prefill"): first one token for every running
 * sequence that decodes (one token left to compute), so a long prompt never holds a decode
 * back; then prompt chunks of the running sequences in admission order; then new sequences
 * from the queue while the step has budget. Returns the number of tokens scheduled. */
static int schedule(md_engine *eng) {
    int T = 0;
    for (int i = 0; i < eng->n_running && T < eng->max_batch;) {
        if (eng->running[i]->n_toks - eng->running[i]->n_computed != 1) {
            i++;
            continue;
        }
        if (take_chunk(eng, i, 1))
            return T;
        T++;
        i++;
    }
    for (int i = 0; i < eng->n_running && T < eng->max_batch;) {
        seq *q = eng->running[i];
        if (q->chunk > 0 || q->n_toks - q->n_computed < 2) {
            i++;
            continue;
        }
        int chunk = chunk_for(eng, q, T);
        if (take_chunk(eng, i, chunk))
            return T;
        T += chunk;
        i++;
    }
    while (eng->n_waiting > 0 && eng->n_running < eng->max_seqs && T < eng->max_batch) {
        seq *q = eng->waiting[0];
        match_prefix(eng, q);
        int chunk = chunk_for(eng, q, T);
        if (blocks_needed(eng, q, q->n_computed + chunk) > kv_n_available(eng->kv)) {
            eng->st.prefix_hit_tokens -= q->n_computed;
            drop_blocks(eng, q);
            break;
        }
        if (q->t_admit == 0)
            q->t_admit = md_mono_ns();
        if (q->preemptions == 0)
            q->cached_prompt = q->n_computed;
        grow_blocks(eng, q, q->n_computed + chunk);
        publish(eng, q, q->n_computed + chunk);
        memmove(eng->waiting, eng->waiting + 1, (size_t)(eng->n_waiting - 1) * sizeof(seq *));
        eng->n_waiting--;
        q->state = SEQ_RUNNING;
        q->chunk = chunk;
        eng->running[eng->n_running++] = q;
        T += chunk;
    }
    return T;
}

/* Append the n bytes in eng->piece to q's text. Returns 0, or -1 out of memory (the piece is
 * dropped: the text stays valid UTF-8). */
static int text_add(md_engine *eng, seq *q, size_t n) {
    if (q->text_len + n + 1 > q->text_cap) {
        size_t cap = (q->text_len + n + 1) * 2;
        char *t = realloc(q->text, cap);
        if (!t)
            return -1;
        q->text = t;
        q->text_cap = cap;
    }
    memcpy(q->text + q->text_len, eng->piece, n);
    q->text_len += n;
    q->text[q->text_len] = 0;
    return 0;
}

/* The sequence ended: bytes of an unfinished UTF-8 character still held by the streaming
 * decoder come out as U+FFFD rather than vanish (the text then says something was cut). */
static void flush_text(md_engine *eng, seq *q) {
    size_t n = tok_stream_flush(&q->ts, eng->piece, 1024);
    if (n)
        text_add(eng, q, n);
}

/* Append the text of token id to q and apply the stop strings. Returns 1 when a stop string
 * ended the sequence (the text is cut before it). */
static int append_text(md_engine *eng, seq *q, int32_t id) {
    size_t n = tok_stream_push(eng->tok, &q->ts, id, eng->piece, 1024);
    if (n == 0)
        return 0;
    size_t old = q->text_len;
    if (text_add(eng, q, n))
        return 0;
    for (int i = 0; i < q->n_stop; i++) {
        size_t l = strlen(q->stop[i]);
        size_t from = old >= l - 1 ? old - (l - 1) : 0;
        char *hit = memmem(q->text + from, q->text_len - from, q->stop[i], l);
        if (hit) {
            q->text_len = (size_t)(hit - q->text);
            q->text[q->text_len] = 0;
            q->text_cut = 1; /* what the decoder still holds came after the stop string */
            return 1;
        }
    }
    return 0;
}

/* Greedy with nothing that reads the logits but the argmax: the device's pick is the
 * sampler's (same lowest-index tie rule). */
static int greedy_plain(const md_sampling *s) {
    return s->temperature <= 0 && s->repetition_penalty == 1.0f && s->presence_penalty == 0 &&
           s->frequency_penalty == 0 && !s->logprobs && !s->top_logprobs && !eng_con_wanted(s);
}

/* Anything but a plain greedy pick, on a backend with a sample op: penalties, the draw and
 * the logprob are made there (engine/sampler.h smp_sample_row semantics, u from the
 * sequence's own stream). */
static int device_sampled(const md_backend *be, const md_sampling *s) {
    return be && be->ops->sample && !greedy_plain(s);
}

/* Room for n more penalty entries after the first used ones. */
static int pen_room(md_engine *eng, size_t used, size_t n, md_err *e) {
    if (used + n <= eng->cap_pen)
        return 0;
    size_t cap = eng->cap_pen ? eng->cap_pen : 4096;
    while (cap < used + n)
        cap *= 2;
    md_sample_pen *p = realloc(eng->b_pen, cap * sizeof *p);
    if (!p)
        return md_errf(e, MD_ENOMEM, "engine: out of memory for %zu penalty entries", cap);
    eng->b_pen = p;
    eng->cap_pen = cap;
    return 0;
}

/* Every logit a number (no NaN, no infinity)? */
static int logits_finite(const float *lg, int n) {
    /* x * 0 is NaN for NaN or infinite x, else 0; eight sums apart, so the adds do not wait on
     * each other (one chain cost ~75 us per 49k-logit row, on every sampled row) */
    float acc[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++)
            acc[j] += lg[i + j] * 0.0f;
    for (; i < n; i++)
        acc[0] += lg[i] * 0.0f;
    float t = 0;
    for (int j = 0; j < 8; j++)
        t += acc[j];
    return t == 0.0f;
}

/* After a forward pass that left the logits on the device: argmax of every logit row into
 * b_argmax (greedy sequences), the backend's draw into b_sampled and b_lp (the others, when it
 * has a sample op), and the full rows of the others into eng->logits. */
static int fetch_logits(md_engine *eng, int ns, md_err *e) {
    md_backend *be = eng->be;
    size_t row = (size_t)eng->n_vocab * sizeof(float);
    int nl = 0, plain = 0, drawn = 0, want_lp = 0, want_top = 0;
    size_t n_pen = 0;
    for (int s = 0; s < ns; s++) {
        seq *q = eng->b_seqs[s];
        if (q->n_computed + q->chunk != q->n_toks)
            continue;
        md_sample_params *p = &eng->b_sparams[nl++];
        memset(p, 0, sizeof *p); /* temperature 0: an argmax the engine does not read */
        if (greedy_plain(&q->s)) {
            plain++;
        } else if (device_sampled(be, &q->s)) {
            drawn++;
            want_lp |= q->s.logprobs || q->s.top_logprobs;
            want_top |= q->s.top_logprobs > 0;
            /* one uniform per sampled token, none for greedy, as smp_sample */
            *p = smp_params(&q->s, q->s.temperature > 0 ? smp_rng_uniform(&q->rng) : 0);
            int n_out = q->n_toks - q->n_prompt;
            int most = q->n_toks < eng->n_vocab ? q->n_toks : eng->n_vocab;
            int rc = pen_room(eng, n_pen, (size_t)most, e);
            if (rc)
                return rc;
            p->pen_off = (int)n_pen;
            p->pen_n = smp_pen_list(&q->s, q->toks, q->n_prompt, q->toks + q->n_prompt, n_out,
                                    eng->n_vocab, eng->sc, eng->b_pen + n_pen);
            eng_con_params(eng, q, nl - 1, p); /* an empty mask: pick_token fails q */
            n_pen += (size_t)p->pen_n;
        }
    }
    int rc = 0;
    if (plain > 0)
        rc = be->ops->argmax(be, eng->fwd.logits, nl, eng->n_vocab, eng->b_argmax, e);
    if (drawn > 0 && rc == 0)
        rc = be->ops->sample(be, eng->fwd.logits, nl, eng->n_vocab, eng->b_sparams, eng->b_pen,
                             (int)n_pen, eng->b_sampled, want_lp ? eng->b_lp : NULL,
                             want_top ? eng->b_top_tok : NULL, want_top ? eng->b_top_lp : NULL, e);
    if (plain + drawn == nl || rc)
        return rc;
    if (plain + drawn == 0) /* one transfer for the whole block */
        return be->ops->buf_download(be, eng->fwd.logits, 0, eng->logits, (size_t)nl * row, e);
    for (int s = 0, li = 0; s < ns && rc == 0; s++) {
        seq *q = eng->b_seqs[s];
        if (q->n_computed + q->chunk != q->n_toks)
            continue;
        if (!greedy_plain(&q->s) && !device_sampled(be, &q->s))
            rc = be->ops->buf_download(be, eng->fwd.logits, (size_t)li * row,
                                       eng->logits + (size_t)li * eng->n_vocab, row, e);
        li++;
    }
    return rc;
}

/* Free the finished sequences their owner has released. */
static void free_released(md_engine *eng) {
    for (int i = 0; i < eng->n_all;) {
        seq *q = eng->all[i];
        if (q->released && q->state == SEQ_DONE) {
            eng_seq_free(q);
            eng->all[i] = eng->all[--eng->n_all];
        } else {
            i++;
        }
    }
}

/* Finish the cancelled sequences, running or waiting. */
static void drop_cancelled(md_engine *eng, int *n_fin) {
    for (int i = 0; i < eng->n_running;) {
        seq *q = eng->running[i];
        if (q->cancel) {
            remove_running(eng, i);
            finish(eng, q, MD_FINISH_CANCELLED, n_fin);
        } else {
            i++;
        }
    }
    for (int i = 0; i < eng->n_waiting;) {
        seq *q = eng->waiting[i];
        if (q->cancel) {
            memmove(eng->waiting + i, eng->waiting + i + 1,
                    (size_t)(eng->n_waiting - i - 1) * sizeof(seq *));
            eng->n_waiting--;
            finish(eng, q, MD_FINISH_CANCELLED, n_fin);
        } else {
            i++;
        }
    }
}

/* Lay out the batch in the step scratch: running sequences with a chunk, in order. *ns gets
 * the number of sequences, *nl that of logit rows (chunks that reach the end of their list). */
static void lay_out_batch(md_engine *eng, int *ns_out, int *nl_out) {
    int t = 0, ns = 0, nl = 0;
    for (int i = 0; i < eng->n_running; i++) {
        seq *q = eng->running[i];
        if (q->chunk == 0)
            continue;
        for (int j = 0; j < q->chunk; j++, t++) {
            int pos = q->n_computed + j;
            eng->b_tokens[t] = q->toks[pos];
            eng->b_seq[t] = ns;
            eng->b_pos[t] = pos;
            eng->b_slot[t] = q->blocks[pos / eng->bs] * eng->bs + pos % eng->bs;
        }
        eng->b_seq_len[ns] = q->n_computed + q->chunk;
        memcpy(eng->b_table + (size_t)ns * eng->max_blocks, q->blocks,
               (size_t)q->n_blocks * sizeof(int32_t));
        if (q->n_computed + q->chunk == q->n_toks)
            eng->b_logit_rows[nl++] = t - 1;
        eng->b_seqs[ns++] = q;
    }
    *ns_out = ns;
    *nl_out = nl;
}

/* The device failed: every running sequence fails with the reason, and blocks indexed this
 * step may hold nothing valid. */
static void fail_running(md_engine *eng, const md_err *e, int *n_fin) {
    while (eng->n_running > 0) {
        seq *q = eng->running[0];
        snprintf(q->err, sizeof q->err, "%s", e->msg);
        remove_running(eng, 0);
        finish(eng, q, MD_FINISH_ERROR, n_fin);
    }
    kv_clear_index(eng->kv);
}

/* Take q out of the running list and finish it. */
static void finish_running(md_engine *eng, seq *q, md_finish why, int *n_fin) {
    for (int i = 0; i < eng->n_running; i++)
        if (eng->running[i] == q) {
            remove_running(eng, i);
            break;
        }
    finish(eng, q, why, n_fin);
}

/* pick_token's answer when q's grammar allows no token at all (q fails saying so). */
#define PICK_NO_TOKEN (-2)

/* q's next token from logit row li: the device's greedy pick or draw, else the sampler on
 * the downloaded row, under q's constraint (eng_con_params); its logprob into *lp, its
 * alternatives into ot. Returns -1 when the row holds a NaN or infinity, PICK_NO_TOKEN when
 * q's grammar allows nothing. */
static int32_t pick_token(md_engine *eng, seq *q, int li, int dev_argmax, md_step_token *ot,
                          float *lp) {
    float *lg = eng->logits + (size_t)li * eng->n_vocab;
    int32_t id = -1;
    int report = q->s.logprobs || q->s.top_logprobs;
    md_sample_params con = {0};
    if (eng_con_params(eng, q, li, &con))
        return PICK_NO_TOKEN;
    if (dev_argmax && greedy_plain(&q->s)) {
        id = eng->b_argmax[li]; /* -1: the row holds a NaN */
    } else if (dev_argmax && device_sampled(eng->be, &q->s)) {
        id = eng->b_sampled[li]; /* drawn on the device at this sequence's u; -1: NaN */
        *lp = report ? eng->b_lp[li] : 0;
        const int32_t *tt = eng->b_top_tok + (size_t)li * MD_TOP_LOGPROBS;
        while (ot->n_top < q->s.top_logprobs && tt[ot->n_top] >= 0 &&
               tt[ot->n_top] < eng->n_vocab) {
            ot->top_token[ot->n_top] = tt[ot->n_top];
            ot->top_logprob[ot->n_top] = eng->b_top_lp[(size_t)li * MD_TOP_LOGPROBS + ot->n_top];
            ot->n_top++;
        }
    } else if (logits_finite(lg, eng->n_vocab)) {
        smp_constrain(&con, lg, eng->n_vocab); /* bias, mask: the "raw" row from here on */
        if (q->s.top_logprobs) /* from the raw row, before smp_sample penalises it */
            ot->n_top = smp_top_logprobs(lg, eng->n_vocab, q->s.top_logprobs, ot->top_token,
                                         ot->top_logprob);
        id = smp_sample(&q->s, lg, eng->n_vocab, q->toks, q->n_prompt, q->toks + q->n_prompt,
                        q->n_toks - q->n_prompt, &q->rng, eng->sc, lp);
    }
    return id;
}

/* No token can be chosen for q (id outside the vocabulary; -1: the logits are not numbers):
 * q fails saying why. */
static void fail_bad_token(md_engine *eng, seq *q, int32_t id, int *n_fin) {
    if (id < 0)
        snprintf(q->err, sizeof q->err,
                 "the model produced logits that are not numbers (NaN or infinite) at "
                 "position %d: the device or the weights are faulty",
                 q->n_toks);
    else
        snprintf(q->err, sizeof q->err,
                 "the device chose token %d at position %d, outside the vocabulary of "
                 "%d: the device is faulty",
                 id, q->n_toks, eng->n_vocab);
    finish_running(eng, q, MD_FINISH_ERROR, n_fin);
}

/* Append the text of q's new token id; why q ends with it (EOS, a stop string, its length
 * limit or the context's), or MD_FINISH_NONE. */
static md_finish finish_reason(md_engine *eng, seq *q, int32_t id) {
    int n_gen = q->n_toks - q->n_prompt;
    md_finish why = MD_FINISH_NONE;
    if (!q->s.ignore_eos && tok_is_eog(eng->tok, id))
        why = MD_FINISH_STOP;
    else if (append_text(eng, q, id))
        why = MD_FINISH_STOP;
    else if (n_gen >= gen_limit(eng, &q->s, q->n_prompt) || q->n_toks >= eng->n_ctx)
        why = MD_FINISH_LENGTH;
    return why;
}

int md_engine_step(md_engine *eng, md_step_result *res, md_err *e) {
    memset(res, 0, sizeof *res);
    int n_fin = 0;
    free_released(eng);
    drop_cancelled(eng, &n_fin);
    for (int i = 0; i < eng->n_running; i++)
        eng->running[i]->chunk = 0;
    int T = schedule(eng);
    res->finished = eng->finished;
    if (T == 0) {
        res->n_finished = n_fin;
        res->n_live = eng->n_running + eng->n_waiting;
        return 0;
    }
    int ns, nl;
    lay_out_batch(eng, &ns, &nl);
    md_batch b = {.n_tokens = T,
                  .n_seqs = ns,
                  .tokens = eng->b_tokens,
                  .tok_seq = eng->b_seq,
                  .tok_pos = eng->b_pos,
                  .slot = eng->b_slot,
                  .seq_len = eng->b_seq_len,
                  .block_table = eng->b_table,
                  .max_blocks = eng->max_blocks,
                  .block_tokens = eng->bs,
                  .logit_rows = eng->b_logit_rows,
                  .n_logits = nl};
    eng->st.steps++;
    eng->st.tokens += T;
    /* A backend with a device argmax keeps the logits there: greedy rows come back as ids,
     * only the rows a sampler needs are downloaded. */
    int dev_argmax = eng->be && eng->be->ops->argmax != NULL;
    int rc;
    eng_con_masks_begin(eng, ns); /* on a device: while the forward pass runs */
    if (eng->pipe) {
        /* every row a plain greedy pick: the last stage sends ids, not rows of logits */
        b.argmax_only = nl > 0;
        for (int s = 0; s < ns && b.argmax_only; s++) {
            seq *q = eng->b_seqs[s];
            if (q->n_computed + q->chunk == q->n_toks && !greedy_plain(&q->s))
                b.argmax_only = 0;
        }
        rc = md_pipe_forward(eng->pipe, &b, eng->logits, e);
        eng_con_masks_end(eng);
        if (rc == 0 && b.argmax_only) {
            dev_argmax = 1;                /* pick_token reads b_argmax for greedy rows */
            for (int i = 0; i < nl; i++) { /* a stage's answer: anything not an id is -1 */
                float v = eng->logits[i];
                eng->b_argmax[i] = v >= 0 && v < (float)eng->n_vocab ? (int32_t)v : -1;
            }
        }
    } else {
        rc = md_model_forward(eng->m, &eng->fwd, &eng->kvb, &b, dev_argmax ? NULL : eng->logits, e);
        eng_con_masks_end(eng);
        if (rc == 0 && dev_argmax)
            rc = fetch_logits(eng, ns, e);
    }
    if (rc) {
        fail_running(eng, e, &n_fin);
        res->n_finished = n_fin;
        res->n_live = eng->n_waiting;
        return rc;
    }
    uint64_t now = md_mono_ns();
    int n_out = 0, li = 0, poisoned = 0;
    for (int s = 0; s < ns; s++) {
        seq *q = eng->b_seqs[s];
        q->n_computed += q->chunk;
        if (q->n_computed < q->n_toks)
            continue;
        md_step_token *ot = &eng->out_toks[n_out]; /* kept only when a token is chosen */
        ot->n_top = 0;
        float lp = 0;
        int32_t id = pick_token(eng, q, li, dev_argmax, ot, &lp);
        li++;
        if (id == PICK_NO_TOKEN) {
            snprintf(q->err, sizeof q->err,
                     "the grammar allows no token at position %d: no token of this vocabulary "
                     "continues the output inside it",
                     q->n_toks);
            finish_running(eng, q, MD_FINISH_ERROR, &n_fin);
            continue;
        }
        if (id < 0 || id >= eng->n_vocab) {
            /* a silent device fault (or broken weights): no token can be chosen, and this
             * sequence's K/V hold garbage; shared prefix blocks may too */
            fail_bad_token(eng, q, id, &n_fin);
            poisoned = 1;
            continue;
        }
        q->toks[q->n_toks++] = id;
        if (q->t_first == 0)
            q->t_first = now;
        ot->seq_id = q->id;
        ot->token = id;
        ot->logprob = lp;
        n_out++;
        size_t text_before = q->text_len;
        md_finish gram = eng_con_accept(eng, q, id);
        md_finish why = gram == MD_FINISH_ERROR ? gram : finish_reason(eng, q, id);
        if (why == MD_FINISH_NONE && gram == MD_FINISH_NONE)
            gram = eng_con_trigger(eng, q, text_before); /* a lazy grammar's trigger */
        if (gram == MD_FINISH_STOP) /* complete: no stop string or limit makes it less so */
            why = MD_FINISH_STOP;
        if (why != MD_FINISH_NONE)
            finish_running(eng, q, why, &n_fin);
    }
    if (poisoned)
        kv_clear_index(eng->kv);
    res->tokens = eng->out_toks;
    res->n_tokens = n_out;
    res->n_finished = n_fin;
    res->n_live = eng->n_running + eng->n_waiting;
    return 0;
}

md_finish md_seq_finish(const md_engine *eng, uint64_t seq_id) {
    seq *q = find_seq(eng, seq_id);
    return q ? q->finish : MD_FINISH_NONE;
}

int md_seq_tokens(const md_engine *eng, uint64_t seq_id, const int32_t **toks, int *n) {
    seq *q = find_seq(eng, seq_id);
    if (!q)
        return MD_ENOTFOUND;
    *toks = q->toks + q->n_prompt;
    *n = q->n_toks - q->n_prompt;
    return 0;
}

const char *md_seq_text(const md_engine *eng, uint64_t seq_id) {
    seq *q = find_seq(eng, seq_id);
    return q ? q->text : NULL;
}

const char *md_seq_error(const md_engine *eng, uint64_t seq_id) {
    seq *q = find_seq(eng, seq_id);
    return q && q->err[0] ? q->err : NULL;
}

void md_seq_get_stats(const md_engine *eng, uint64_t seq_id, md_seq_stats *st) {
    memset(st, 0, sizeof *st);
    seq *q = find_seq(eng, seq_id);
    if (!q)
        return;
    st->prompt_tokens = q->n_prompt;
    st->completion_tokens = q->n_toks - q->n_prompt;
    st->cached_prompt_tokens = q->cached_prompt;
    uint64_t now = md_mono_ns();
    uint64_t admit = q->t_admit ? q->t_admit : now;
    uint64_t first = q->t_first ? q->t_first : (q->t_admit ? now : admit);
    uint64_t done = q->t_done ? q->t_done : now;
    st->queue_ms = (double)(admit - q->t_submit) / 1e6;
    st->prefill_ms = (double)(first - admit) / 1e6;
    st->decode_ms = q->t_first ? (double)(done - first) / 1e6 : 0;
}

void md_engine_release(md_engine *eng, uint64_t seq_id) {
    for (int i = 0; i < eng->n_all; i++) {
        seq *q = eng->all[i];
        if (q->id != seq_id)
            continue;
        if (q->state != SEQ_DONE) {
            q->cancel = 1; /* still live: cancelled now, freed once reported finished */
            q->released = 1;
            return;
        }
        eng_seq_free(q);
        eng->all[i] = eng->all[--eng->n_all];
        return;
    }
}

void md_engine_get_stats(const md_engine *eng, md_engine_stats *st) {
    *st = eng->st;
    st->kv_blocks = kv_n_blocks(eng->kv);
    st->kv_block_tokens = eng->bs;
    st->kv_blocks_free = kv_n_available(eng->kv);
    st->kv_bytes = (size_t)st->kv_blocks * eng->bs * md_kv_bytes_per_token(&eng->hp, eng->kv_type);
}
