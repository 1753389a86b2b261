/* engine_constrain.h — structured outputs inside the step loop (docs/engine.md "Structured
 * outputs"): each constrained sequence's matcher and logit_bias, the step's packed token
 * masks, and the thread that fills them while the forward pass runs on a device. Internal to
 * the engine (engine.c calls it; engine_int.h holds the fields).
 *
 * Per step: eng_con_masks_begin once the batch is laid out (fills the masks of the rows that
 * pick a token: inline on the CPU backend, on the mask thread otherwise), the forward pass,
 * eng_con_masks_end before any row is sampled, then per row eng_con_params (the row's
 * constraint for the sampler) and, once a token is chosen, eng_con_accept.
 *
 * Ownership: eng_con_seq_init gives q its matcher and bias copy, freed by eng_con_seq_free;
 * the engine's vocabulary, masks and thread are made on the first constrained submit and
 * freed by eng_con_close. */
#ifndef MEDLEY_ENGINE_ENGINE_CONSTRAIN_H
#define MEDLEY_ENGINE_ENGINE_CONSTRAIN_H

#include "engine/engine_int.h"

/* 1 when s asks for a constraint (a grammar or logit_bias): such a row is never a plain
 * device argmax. */
int eng_con_wanted(const md_sampling *s);
/* At submit, after smp_validate: copy s's logit_bias into q (MD_EINVAL names an entry whose
 * token is outside the vocabulary) and give q a matcher on s->grammar. */
int eng_con_seq_init(md_engine *eng, seq *q, const md_sampling *s, md_err *e);
void eng_con_seq_free(seq *q);

/* Start the masks of the ns laid-out sequences (eng->b_seqs) whose chunk ends their list;
 * logit row li's mask is eng_con_params's. */
void eng_con_masks_begin(md_engine *eng, int ns);
/* Wait for them (no-op when none were started). */
void eng_con_masks_end(md_engine *eng);
/* Row li of q: its mask and bias into p (cleared when q is unconstrained). Returns 0, or -1
 * when q's grammar allows no token at all here (q must fail: nothing can be chosen). */
int eng_con_params(md_engine *eng, const seq *q, int li, md_sample_params *p);
/* q chose id: advance its matcher. Returns MD_FINISH_NONE, MD_FINISH_STOP when the grammar
 * is done (an end token accepted, or nothing but one can follow), or MD_FINISH_ERROR (q->err
 * says why) when the matcher refuses id. Unconstrained q: MD_FINISH_NONE. */
md_finish eng_con_accept(md_engine *eng, seq *q, int32_t id);

/* After q's new text (from text_before on) was appended: when q waits for a grammar's
 * trigger (md_sampling.grammar_trigger) and the text now holds it, give q its matcher from
 * the trigger on. Returns MD_FINISH_STOP when that text already completes the grammar,
 * otherwise MD_FINISH_NONE. */
md_finish eng_con_trigger(md_engine *eng, seq *q, size_t text_before);

void eng_con_close(md_engine *eng);

#endif
