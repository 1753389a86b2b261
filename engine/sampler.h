/* sampler.h — choosing the next token from a sequence's logits: penalties (repetition,
 * presence, frequency), temperature, top_k, top_p, min_p, then a draw from the sequence's
 * own random stream, or the argmax when temperature is 0.
 *
 * Determinism: the random stream belongs to the sequence (seeded from md_sampling.seed),
 * so the same request gives the same tokens whatever else shares its batch.
 *
 * Conventions (as llama.cpp / Hugging Face / OpenAI define them):
 *  - repetition_penalty r: over every token in the prompt and the output, a positive logit
 *    is divided by r, a negative one multiplied by r;
 *  - presence p / frequency f (OpenAI): over output tokens only, logit -= p + f * count;
 *  - top_k, then top_p (smallest set of most likely tokens whose mass reaches top_p of what
 *    top_k kept, renormalised as Hugging Face, llama.cpp and vLLM do), then
 *    min_p (drop tokens below min_p times the most likely one's probability), applied to the
 *    distribution after temperature;
 *  - logprob: log-softmax of the raw logits (before penalties and temperature) at the chosen
 *    token, the model's own probability of it;
 *  - a constraint (structured outputs: logit_bias and a grammar's token mask, backend.h
 *    md_sample_params) comes before everything: bias added, disallowed tokens at -inf. The
 *    logprobs are then those of the constrained row (smp_constrain).
 *
 * Ownership: smp_scratch holds the per-vocabulary work arrays, made once per engine
 * (smp_scratch_new / smp_scratch_free); smp_sample never allocates. */
#ifndef MEDLEY_ENGINE_SAMPLER_H
#define MEDLEY_ENGINE_SAMPLER_H

#include <stdint.h>

#include "common/err.h"
#include "engine/engine.h"
#include "kernels/backend.h"

typedef struct {
    uint64_t s[4];
} smp_rng;

void smp_rng_seed(smp_rng *r, uint64_t seed);
uint64_t smp_rng_next(smp_rng *r);
/* Uniform in [0, 1). */
double smp_rng_uniform(smp_rng *r);

typedef struct smp_scratch smp_scratch;
smp_scratch *smp_scratch_new(int n_vocab);
void smp_scratch_free(smp_scratch *sc);

/* Check a request's sampling parameters (ranges, NaN); MD_EINVAL names the field. */
int smp_validate(const md_sampling *s, md_err *e);

/* Pick the next token. logits [n_vocab] is modified (penalties, temperature). prompt and
 * out are the sequence's tokens so far; logprob (may be NULL) receives the chosen token's
 * raw log-probability. */
int32_t smp_sample(const md_sampling *s, float *logits, int n_vocab, const int32_t *prompt,
                   int n_prompt, const int32_t *out, int n_out, smp_rng *rng, smp_scratch *sc,
                   float *logprob);

/* The penalty entries of a sequence (backend.h md_sample_pen): its distinct tokens — those of
 * the prompt too when the repetition penalty is on — with their output counts, in first
 * occurrence order; none when no penalty is on. list holds up to n_vocab entries (no more
 * can be distinct). Returns how many. */
int smp_pen_list(const md_sampling *s, const int32_t *prompt, int n_prompt, const int32_t *out,
                 int n_out, int n_vocab, smp_scratch *sc, md_sample_pen *list);

/* The k (at most MD_TOP_LOGPROBS) most likely tokens of logits, most likely first and the
 * lowest id first among equals, with their log-softmax: md_step_token's top_logprobs, taken
 * from the raw logits (before penalties and temperature). Tokens at -inf are never listed.
 * Returns how many (k unless fewer are finite). */
int smp_top_logprobs(const float *logits, int n, int k, int32_t *tok, float *lp);

/* Apply p's constraint to logits [n] in place: each bias entry added (tokens outside [0, n)
 * skipped), then every token whose p->mask bit is clear set to -inf (no mask: none). Returns
 * how many tokens the mask allows (n without one); 0 leaves nothing to choose from, which the
 * caller must refuse. smp_sample_row starts with it; smp_sample does not (md_sampling carries
 * no mask): the engine constrains the row itself, before its top logprobs. */
int smp_constrain(const md_sample_params *p, float *logits, int n);

/* The row parameters of a sequence's sampling at uniform u (no penalty entries, no
 * constraint yet). */
md_sample_params smp_params(const md_sampling *s, double u);

/* One row's token under p and its entries pen[p->pen_off ..] — backend.h's sample op, which
 * smp_sample is with u from the sequence's stream: smp_constrain, penalties, then smp_draw's
 * draw (or the argmax at temperature <= 0). logits are modified; logprob (may be NULL)
 * receives the chosen token's log-softmax under the logits as they came in, constrained. */
int32_t smp_sample_row(const md_sample_params *p, const md_sample_pen *pen, float *logits, int n,
                       smp_scratch *sc, float *logprob);

/* The draw alone, at a given uniform u in [0, 1): temperature softmax, top_k, top_p, min_p,
 * then the inverse-CDF walk over the kept tokens in index order — what backend.h's sample
 * op computes on a device, and what smp_sample does after penalties with u from the
 * sequence's stream (one u per token). Greedy (argmax) when temperature <= 0. logits are not
 * modified. */
int32_t smp_draw(float temperature, int top_k, float top_p, float min_p, double u,
                 const float *logits, int n_vocab, smp_scratch *sc);

#endif
