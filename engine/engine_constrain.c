/* engine_constrain.c — grammar masks and logit_bias in the step loop: per-sequence matchers
 * and bias copies, the step's masks (filled inline on the CPU backend, where the forward pass
 * already holds every core, and on a thread of their own while a device computes), and the
 * matcher's advance after each chosen token. */
#define _GNU_SOURCE /* memmem */
#include "engine/engine_constrain.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "engine/grammar/grammar.h"
#include "engine/grammar_vocab.h"

_Static_assert(sizeof(md_logit_bias) == sizeof(md_sample_bias) &&
                   offsetof(md_logit_bias, bias) == offsetof(md_sample_bias, bias),
               "engine.h and backend.h bias entries share a layout");

struct eng_con {
    gr_vocab *gv;
    int words;      /* MD_MASK_WORDS(n_vocab): a mask row (the model's logits) */
    int vwords;     /* MD_MASK_WORDS(the tokenizer's tokens), which may differ (padded heads) */
    uint32_t *row;  /* [vwords] a matcher's mask before it is fitted to a row, when they do */
    uint32_t *mask; /* [max_seqs, words] this step's masks, by logit row */
    uint8_t *empty; /* [max_seqs] 1: the row's mask allows no token */
    /* the mask thread (devices only) */
    int async, th_on;
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int job_ns;  /* sequences laid out for the posted job */
    int posted;  /* a job waits or runs */
    int started; /* a job was posted this step (the main thread's own flag) */
    int quit;    /* close asks the thread to end */
    md_engine *eng;
    long fills;  /* masks filled by the last job */
    uint64_t ns; /* their time */
};

int eng_con_wanted(const md_sampling *s) {
    return s->grammar != NULL || s->n_logit_bias > 0;
}

/* The masks of the rows that pick a token this step: fill, note empty ones, time them. */
static void fill_masks(md_engine *eng, struct eng_con *c, int ns) {
    uint64_t t0 = md_mono_ns();
    long n = 0;
    for (int s = 0, li = 0; s < ns; s++) {
        seq *q = eng->b_seqs[s];
        if (q->n_computed + q->chunk != q->n_toks)
            continue;
        if (q->gm) {
            uint32_t *m = c->mask + (size_t)li * c->words, any = 0;
            if (c->vwords == c->words) {
                gr_matcher_fill_mask(q->gm, m);
            } else { /* tokens past the tokenizer's are never allowed, nor past the logits */
                gr_matcher_fill_mask(q->gm, c->row);
                int k = c->vwords < c->words ? c->vwords : c->words;
                memcpy(m, c->row, (size_t)k * sizeof *m);
                memset(m + k, 0, (size_t)(c->words - k) * sizeof *m);
                if (eng->n_vocab % 32 && k == c->words)
                    m[k - 1] &= (1u << (eng->n_vocab % 32)) - 1;
            }
            for (int w = 0; w < c->words; w++)
                any |= m[w];
            c->empty[li] = any == 0;
            n++;
        }
        li++;
    }
    c->fills = n;
    c->ns = md_mono_ns() - t0;
}

static void *mask_thread(void *arg) {
    struct eng_con *c = arg;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while (!c->posted && !c->quit)
            pthread_cond_wait(&c->cv, &c->mu);
        if (c->quit)
            break;
        pthread_mutex_unlock(&c->mu);
        fill_masks(c->eng, c, c->job_ns);
        pthread_mutex_lock(&c->mu);
        c->posted = 0;
        pthread_cond_broadcast(&c->cv);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

/* The engine's constraint state, made on the first constrained submit: the vocabulary (built
 * once), the step's masks, and on a device backend or a sharded model the mask thread. */
static int con_open(md_engine *eng, md_err *e) {
    if (eng->con)
        return 0;
    struct eng_con *c = calloc(1, sizeof *c);
    if (!c)
        return md_errf(e, MD_ENOMEM, "engine: out of memory for structured outputs");
    c->eng = eng;
    c->words = MD_MASK_WORDS(eng->n_vocab);
    c->mask = malloc((size_t)eng->max_seqs * (size_t)c->words * sizeof *c->mask);
    c->empty = calloc((size_t)eng->max_seqs, 1);
    if (!c->mask || !c->empty) {
        free(c->mask);
        free(c->empty);
        free(c);
        return md_errf(e, MD_ENOMEM, "engine: out of memory for %d token masks", eng->max_seqs);
    }
    eng->con = c;
    /* the CPU backend's forward pass keeps every core busy: a mask thread would only take
     * time from it, so masks are filled inline there (and timed) */
    c->async = eng->pipe != NULL || (eng->be && strncmp(eng->be->ops->name, "cpu", 3) != 0);
    if (c->async) {
        pthread_mutex_init(&c->mu, NULL);
        pthread_cond_init(&c->cv, NULL);
        if (pthread_create(&c->th, NULL, mask_thread, c) == 0)
            c->th_on = 1;
        else
            c->async = 0; /* no thread: inline, as on the CPU */
    }
    return 0;
}

int eng_con_seq_init(md_engine *eng, seq *q, const md_sampling *s, md_err *e) {
    q->gm = NULL;
    q->bias = NULL;
    q->n_bias = 0;
    q->s.logit_bias = NULL;
    q->s.n_logit_bias = 0;
    if (!eng_con_wanted(s))
        return 0;
    for (int i = 0; i < s->n_logit_bias; i++)
        if (s->logit_bias[i].token >= eng->n_vocab)
            return md_errf(e, MD_EINVAL,
                           "logit_bias names token %d, outside the vocabulary of %d tokens",
                           s->logit_bias[i].token, eng->n_vocab);
    int rc = con_open(eng, e);
    if (rc)
        return rc;
    if (s->n_logit_bias > 0) {
        q->bias = malloc((size_t)s->n_logit_bias * sizeof *q->bias);
        if (!q->bias)
            return md_errf(e, MD_ENOMEM, "engine: out of memory for %d logit_bias entries",
                           s->n_logit_bias);
        memcpy(q->bias, s->logit_bias, (size_t)s->n_logit_bias * sizeof *q->bias);
        q->n_bias = s->n_logit_bias;
        q->s.logit_bias = (const md_logit_bias *)q->bias; /* the copy, same layout */
        q->s.n_logit_bias = q->n_bias;
    }
    if (s->grammar) {
        struct eng_con *c = eng->con;
        if (!c->gv) {
            if ((rc = md_grammar_vocab_new(eng->tok, &c->gv, e)))
                return rc;
            c->vwords = MD_MASK_WORDS(gr_vocab_size(c->gv));
            if (c->vwords != c->words && !(c->row = malloc((size_t)c->vwords * sizeof *c->row))) {
                gr_vocab_free(c->gv);
                c->gv = NULL;
                return md_errf(e, MD_ENOMEM, "engine: out of memory for a token mask");
            }
        }
        if (s->grammar_trigger && s->grammar_trigger[0]) { /* the matcher comes later */
            if (!(q->trigger = strdup(s->grammar_trigger)))
                return md_errf(e, MD_ENOMEM, "engine: out of memory for a grammar trigger");
            q->lazy = s->grammar;
            q->trigger_len = strlen(q->trigger);
            q->anchored = s->grammar_trigger_anchored;
            return 0;
        }
        if ((rc = gr_matcher_new(s->grammar, c->gv, &q->gm, e)))
            return rc;
    }
    return 0;
}

void eng_con_seq_free(seq *q) {
    gr_matcher_free(q->gm);
    free(q->bias);
    free(q->trigger);
    q->gm = NULL;
    q->bias = NULL;
    q->trigger = NULL;
    q->lazy = NULL;
}

md_finish eng_con_trigger(md_engine *eng, seq *q, size_t text_before) {
    if (!q->lazy)
        return MD_FINISH_NONE;
    size_t l = q->trigger_len;
    const char *hit;
    if (q->anchored) { /* at the start (after whitespace), or never */
        size_t ws = strspn(q->text, " \t\r\n");
        size_t have = q->text_len - ws;
        if (have == 0)
            return MD_FINISH_NONE;
        if (memcmp(q->text + ws, q->trigger, have < l ? have : l)) {
            q->lazy = NULL; /* the text began otherwise: free to the end */
            return MD_FINISH_NONE;
        }
        if (have < l)
            return MD_FINISH_NONE;
        hit = q->text + ws;
    } else {
        size_t from = text_before >= l - 1 ? text_before - (l - 1) : 0;
        if (q->text_len < from + l)
            return MD_FINISH_NONE;
        hit = memmem(q->text + from, q->text_len - from, q->trigger, l);
        if (!hit)
            return MD_FINISH_NONE;
    }
    const struct gr_grammar *g = q->lazy;
    q->lazy = NULL; /* one chance: from the first trigger on, or never */
    md_err e = {0};
    if (gr_matcher_new(g, eng->con->gv, &q->gm, &e))
        return MD_FINISH_NONE; /* out of memory: the text goes on unconstrained */
    if (gr_matcher_accept_bytes(q->gm, hit, q->text_len - (size_t)(hit - q->text))) {
        gr_matcher_free(q->gm);
        q->gm = NULL;
        return MD_FINISH_NONE;
    }
    return gr_matcher_must_end(q->gm) ? MD_FINISH_STOP : MD_FINISH_NONE;
}

void eng_con_masks_begin(md_engine *eng, int ns) {
    struct eng_con *c = eng->con;
    if (!c)
        return;
    int any = 0;
    for (int s = 0; s < ns && !any; s++)
        any = eng->b_seqs[s]->gm != NULL;
    if (!any)
        return;
    if (!c->async) {
        fill_masks(eng, c, ns);
        eng->st.masks += c->fills;
        eng->st.mask_ns += (long)c->ns;
        return;
    }
    c->started = 1;
    pthread_mutex_lock(&c->mu);
    c->job_ns = ns;
    c->posted = 1;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

void eng_con_masks_end(md_engine *eng) {
    struct eng_con *c = eng->con;
    if (!c || !c->async || !c->started)
        return;
    uint64_t t0 = md_mono_ns();
    pthread_mutex_lock(&c->mu);
    while (c->posted)
        pthread_cond_wait(&c->cv, &c->mu);
    pthread_mutex_unlock(&c->mu);
    c->started = 0;
    eng->st.mask_wait_ns += (long)(md_mono_ns() - t0);
    eng->st.masks += c->fills;
    eng->st.mask_ns += (long)c->ns;
}

int eng_con_params(md_engine *eng, const seq *q, int li, md_sample_params *p) {
    p->mask = NULL;
    p->bias = q->bias;
    p->n_bias = q->n_bias;
    if (!q->gm)
        return 0;
    struct eng_con *c = eng->con;
    p->mask = c->mask + (size_t)li * c->words;
    return c->empty[li] ? -1 : 0;
}

md_finish eng_con_accept(md_engine *eng, seq *q, int32_t id) {
    if (!q->gm)
        return MD_FINISH_NONE;
    if (gr_matcher_accept(q->gm, id)) {
        snprintf(q->err, sizeof q->err,
                 "token %d at position %d is not allowed by the sequence's grammar (the engine "
                 "chose outside its mask)",
                 id, q->n_toks);
        return MD_FINISH_ERROR;
    }
    if (tok_is_eog(eng->tok, id) || gr_matcher_must_end(q->gm))
        return MD_FINISH_STOP;
    return MD_FINISH_NONE;
}

void eng_con_close(md_engine *eng) {
    struct eng_con *c = eng->con;
    if (!c)
        return;
    if (c->th_on) {
        pthread_mutex_lock(&c->mu);
        c->quit = 1;
        pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&c->mu);
        pthread_join(c->th, NULL);
    }
    if (c->async) {
        pthread_mutex_destroy(&c->mu);
        pthread_cond_destroy(&c->cv);
    }
    gr_vocab_free(c->gv);
    free(c->row);
    free(c->mask);
    free(c->empty);
    free(c);
    eng->con = NULL;
}
