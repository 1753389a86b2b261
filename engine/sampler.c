/* sampler.c — penalties, temperature, top_k / top_p / min_p filtering and the draw. Full
 * sorts are avoided: candidates are first cut by a probability threshold that provably keeps
 * the whole top_p nucleus (and the top_k set), then only they are sorted. */
#define _GNU_SOURCE /* qsort_r */
#include "engine/sampler.h"
#include "kernels/cpu/cpu_ops.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

struct smp_scratch {
    int n_vocab;
    int32_t *idx;       /* candidate token ids */
    float *prob;        /* [n_vocab] probabilities */
    int32_t *count;     /* [n_vocab] smp_pen_list's marks, kept all-zero between calls */
    md_sample_pen *pen; /* [n_vocab] smp_sample's penalty entries */
};

static uint64_t splitmix(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void smp_rng_seed(smp_rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix(&seed);
}

static uint64_t rotl(uint64_t x, int k) {
    return (x << k) | (x >> (64 - k));
}

/* xoshiro256** */
uint64_t smp_rng_next(smp_rng *r) {
    uint64_t *s = r->s;
    uint64_t res = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return res;
}

double smp_rng_uniform(smp_rng *r) {
    return (double)(smp_rng_next(r) >> 11) * 0x1.0p-53;
}

smp_scratch *smp_scratch_new(int n_vocab) {
    smp_scratch *sc = calloc(1, sizeof *sc);
    if (!sc)
        return NULL;
    sc->n_vocab = n_vocab;
    sc->idx = malloc((size_t)n_vocab * sizeof *sc->idx);
    sc->prob = malloc((size_t)n_vocab * sizeof *sc->prob);
    sc->count = calloc((size_t)n_vocab, sizeof *sc->count);
    sc->pen = malloc((size_t)n_vocab * sizeof *sc->pen);
    if (!sc->idx || !sc->prob || !sc->count || !sc->pen) {
        smp_scratch_free(sc);
        return NULL;
    }
    return sc;
}

void smp_scratch_free(smp_scratch *sc) {
    if (!sc)
        return;
    free(sc->idx);
    free(sc->prob);
    free(sc->count);
    free(sc->pen);
    free(sc);
}

/* Declared in engine.h; lives here so the sampler links on its own. */
void md_sampling_default(md_sampling *s) {
    memset(s, 0, sizeof *s);
    s->temperature = 0;
    s->top_p = 1;
    s->repetition_penalty = 1;
    s->max_tokens = 256;
}

int md_sampling_validate(const md_sampling *s, md_err *e) {
    return smp_validate(s, e);
}

int smp_validate(const md_sampling *s, md_err *e) {
    if (!(s->temperature >= 0 && s->temperature <= 100))
        return md_errf(e, MD_EINVAL, "temperature %g must be in [0, 100]", s->temperature);
    if (!(s->top_p > 0 && s->top_p <= 1))
        return md_errf(e, MD_EINVAL, "top_p %g must be in (0, 1]", s->top_p);
    if (s->top_k < 0)
        return md_errf(e, MD_EINVAL, "top_k %d must be >= 0", s->top_k);
    if (!(s->min_p >= 0 && s->min_p <= 1))
        return md_errf(e, MD_EINVAL, "min_p %g must be in [0, 1]", s->min_p);
    if (!(s->repetition_penalty > 0 && s->repetition_penalty <= 100))
        return md_errf(e, MD_EINVAL, "repetition_penalty %g must be in (0, 100]",
                       s->repetition_penalty);
    if (!(s->presence_penalty >= -2 && s->presence_penalty <= 2))
        return md_errf(e, MD_EINVAL, "presence_penalty %g must be in [-2, 2]", s->presence_penalty);
    if (!(s->frequency_penalty >= -2 && s->frequency_penalty <= 2))
        return md_errf(e, MD_EINVAL, "frequency_penalty %g must be in [-2, 2]",
                       s->frequency_penalty);
    if (s->top_logprobs < 0 || s->top_logprobs > MD_TOP_LOGPROBS)
        return md_errf(e, MD_EINVAL, "top_logprobs %d must be in [0, %d]", s->top_logprobs,
                       MD_TOP_LOGPROBS);
    if (s->max_tokens < 0)
        return md_errf(e, MD_EINVAL, "max_tokens %d must be >= 0", s->max_tokens);
    if (s->n_logit_bias < 0 || s->n_logit_bias > MD_LOGIT_BIAS_MAX ||
        (s->n_logit_bias > 0 && !s->logit_bias))
        return md_errf(e, MD_EINVAL, "logit_bias has %d entries (at most %d)", s->n_logit_bias,
                       MD_LOGIT_BIAS_MAX);
    for (int i = 0; i < s->n_logit_bias; i++) {
        float b = s->logit_bias[i].bias;
        if (!(b >= -100 && b <= 100))
            return md_errf(e, MD_EINVAL, "logit_bias of token %d is %g: must be in [-100, 100]",
                           s->logit_bias[i].token, b);
        if (s->logit_bias[i].token < 0)
            return md_errf(e, MD_EINVAL, "logit_bias names token %d: ids are >= 0",
                           s->logit_bias[i].token);
    }
    return 0;
}

/* Distinct tokens of prompt (only when the repetition penalty is on) and out, in first
 * occurrence order, with their output counts; count is all-zero before and after. */
int smp_pen_list(const md_sampling *s, const int32_t *prompt, int n_prompt, const int32_t *out,
                 int n_out, int n_vocab, smp_scratch *sc, md_sample_pen *list) {
    int rep = s->repetition_penalty != 1.0f;
    if (!rep && s->presence_penalty == 0.0f && s->frequency_penalty == 0.0f)
        return 0;
    /* count[id]: 0 unseen, else 1 + the entry's index */
    int n = 0;
    for (int pass = rep ? 0 : 1; pass < 2; pass++) {
        const int32_t *t = pass ? out : prompt;
        int nt = pass ? n_out : n_prompt;
        for (int i = 0; i < nt; i++) {
            int32_t id = t[i];
            if (id < 0 || id >= n_vocab)
                continue;
            if (!sc->count[id]) {
                list[n] = (md_sample_pen){id, 0};
                sc->count[id] = ++n;
            }
            list[sc->count[id] - 1].n_out += pass;
        }
    }
    for (int i = 0; i < n; i++)
        sc->count[list[i].token] = 0;
    return n;
}

int smp_constrain(const md_sample_params *p, float *logits, int n) {
    for (int i = 0; i < p->n_bias; i++) {
        md_sample_bias b = p->bias[i];
        if (b.token >= 0 && b.token < n)
            logits[b.token] += b.bias;
    }
    if (!p->mask)
        return n;
    int allowed = 0;
    for (int w = 0; w < MD_MASK_WORDS(n); w++) {
        uint32_t m = p->mask[w];
        int lo = w * 32, hi = lo + 32 < n ? lo + 32 : n;
        if (m == 0xffffffffu && hi - lo == 32) {
            allowed += 32;
            continue;
        }
        if (m == 0) { /* most words of a grammar's mask: one vectorizable fill */
            for (int t = lo; t < hi; t++)
                logits[t] = -INFINITY;
            continue;
        }
        for (int t = lo; t < hi; t++) {
            if (m >> (t - lo) & 1u)
                allowed++;
            else
                logits[t] = -INFINITY;
        }
    }
    return allowed;
}

/* The penalties of p over its entries; the CUDA sample kernel computes the same (unfused). */
static void apply_penalties(const md_sample_params *p, const md_sample_pen *pen, float *logits,
                            int n) {
    for (int i = 0; i < p->pen_n; i++) {
        md_sample_pen e = pen[p->pen_off + i];
        if (e.token < 0 || e.token >= n)
            continue;
        float v = logits[e.token];
        if (p->repetition != 1.0f)
            v = v > 0 ? v / p->repetition : v * p->repetition;
        if (e.n_out > 0)
            v -= p->presence + p->frequency * (float)e.n_out;
        logits[e.token] = v;
    }
}

/* The lowest index of the largest: the vector kernel (kernels/cpu, the backends' greedy pick),
 * or where a NaN makes it decline, the scalar loop, which passes NaN over. */
static int32_t argmax(const float *x, int n) {
    int v = cpu_argmax_f32(x, n);
    if (v >= 0)
        return v;
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}

static int by_index(const void *a, const void *b) {
    int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    return i < j ? -1 : i > j;
}

static int by_prob_desc(const void *a, const void *b, void *ctx) {
    const float *prob = ctx;
    int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    float pi = prob[i], pj = prob[j];
    if (pi != pj)
        return pi > pj ? -1 : 1;
    return i < j ? -1 : i > j;
}

/* Candidates: the tokens with p >= t, lowering t until they provably contain what the
 * filters keep: the top k (when k < n: any set of >= k of the most likely tokens does),
 * else the top_p nucleus (a most-likely set whose mass reaches top_p does), else every token
 * above min_p * p_max. Only the candidates are sorted. */
static int32_t sample_filtered(float min_p, const float *p, int n, int k, double want, double u,
                               smp_scratch *sc) {
    float pmax = p[argmax(p, n)];
    int nc = 0;
    for (double t = 1e-3;; t *= 1e-2) {
        if (t < 1e-12)
            t = 0;
        if (k == n && want >= 1 && t > min_p * pmax)
            continue;
        nc = 0;
        double mass = 0;
        for (int i = 0; i < n; i++)
            if (p[i] >= t) {
                sc->idx[nc++] = i;
                mass += p[i];
            }
        if (t == 0 || (k < n ? nc >= k : want < 1 ? mass >= want : 1))
            break;
    }
    /* No probability is a number (NaN or infinite logits, e.g. from a failing kernel): there
     * is nothing to draw from. Stay inside the arrays and return a valid id; the engine is the
     * one that can refuse such logits. */
    if (nc == 0)
        return argmax(p, n);
    qsort_r(sc->idx, (size_t)nc, sizeof *sc->idx, by_prob_desc, (void *)p);
    if (nc > k)
        nc = k;
    if (want < 1) {
        /* top_p of the mass top_k left (Hugging Face, llama.cpp and vLLM renormalise after
         * top_k; so does cuda_sample) */
        double mass = 1, c = 0; /* the candidates are a subset of the vocabulary... */
        if (k < n) {            /* ...but with top_k they are exactly the k kept */
            mass = 0;
            for (int j = 0; j < nc; j++)
                mass += p[sc->idx[j]];
        }
        int j = 0;
        while (j < nc) {
            c += p[sc->idx[j++]];
            if (c >= want * mass)
                break;
        }
        nc = j;
    }
    if (min_p > 0) {
        float floor_p = min_p * p[sc->idx[0]];
        int j = 1;
        while (j < nc && p[sc->idx[j]] >= floor_p)
            j++;
        nc = j;
    }
    /* the draw walks the kept tokens in index order, as the device samplers do, so one u
     * picks the same token on every backend */
    qsort(sc->idx, (size_t)nc, sizeof *sc->idx, by_index);
    double total = 0;
    for (int j = 0; j < nc; j++)
        total += p[sc->idx[j]];
    double target = u * total, acc = 0;
    int last = 0; /* rounding can leave target unreached: the last kept token of mass > 0 */
    for (int j = 0; j < nc; j++) {
        acc += p[sc->idx[j]];
        if (target < acc)
            return sc->idx[j];
        if (p[sc->idx[j]] > 0)
            last = j;
    }
    return sc->idx[last];
}

/* Temperature softmax of logits into p, then the (filtered) draw at u. */
static int32_t draw(float temperature, int top_k, float top_p, float min_p, double u,
                    const float *logits, float *p, int n, smp_scratch *sc) {
    float mx = logits[argmax(logits, n)];
    float inv_t = 1.0f / temperature;
    double sum = 0;
    for (int i = 0; i < n; i++) {
        p[i] = expf((logits[i] - mx) * inv_t);
        sum += p[i];
    }
    for (int i = 0; i < n; i++)
        p[i] = (float)(p[i] / sum);
    int k = top_k > 0 && top_k < n ? top_k : n;
    double want = top_p < 1 ? top_p : 1.0;
    if (k < n || want < 1 || min_p > 0)
        return sample_filtered(min_p, p, n, k, want, u, sc);
    double acc = 0;
    int last = 0; /* rounding: the last token of mass > 0, never a masked one */
    for (int i = 0; i < n; i++) {
        acc += p[i];
        if (u < acc)
            return i;
        if (p[i] > 0)
            last = i;
    }
    return last;
}

int32_t smp_draw(float temperature, int top_k, float top_p, float min_p, double u,
                 const float *logits, int n, smp_scratch *sc) {
    if (temperature <= 0)
        return argmax(logits, n);
    return draw(temperature, top_k, top_p, min_p, u, logits, sc->prob, n, sc);
}

int32_t smp_sample_row(const md_sample_params *p, const md_sample_pen *pen, float *logits, int n,
                       smp_scratch *sc, float *logprob) {
    smp_constrain(p, logits, n);
    /* raw logprobs need the unmodified (constrained) logits: keep a copy of the max and sum
     * first */
    float raw_mx = -INFINITY;
    double raw_sum = 0;
    if (logprob) {
        for (int i = 0; i < n; i++)
            if (logits[i] > raw_mx)
                raw_mx = logits[i];
        for (int i = 0; i < n; i++)
            raw_sum += exp((double)logits[i] - raw_mx);
        memcpy(sc->prob, logits, (size_t)n * sizeof(float));
    }
    apply_penalties(p, pen, logits, n);
    int32_t tok;
    if (p->temperature <= 0) {
        tok = argmax(logits, n);
    } else {
        float *pr = logprob ? logits : sc->prob; /* probabilities, in place when prob holds raw */
        tok = draw(p->temperature, p->top_k, p->top_p, p->min_p, p->u, logits, pr, n, sc);
    }
    if (logprob)
        *logprob = (float)((double)sc->prob[tok] - raw_mx - log(raw_sum));
    return tok;
}

int smp_top_logprobs(const float *logits, int n, int k, int32_t *tok, float *lp) {
    if (k > MD_TOP_LOGPROBS)
        k = MD_TOP_LOGPROBS;
    if (k <= 0)
        return 0;
    float mx = -INFINITY;
    for (int i = 0; i < n; i++)
        if (logits[i] > mx)
            mx = logits[i];
    double sum = 0;
    for (int i = 0; i < n; i++)
        sum += exp((double)logits[i] - mx);
    /* insertion into a sorted list of at most k: most tokens fail the first comparison */
    int m = 0;
    for (int i = 0; i < n; i++) {
        float x = logits[i];
        if (!(x > -FLT_MAX) || (m == k && !(x > logits[tok[m - 1]])))
            continue; /* -inf and NaN are never alternatives; equals keep the lower id */
        int j = m < k ? m++ : k - 1;
        while (j > 0 && x > logits[tok[j - 1]]) {
            tok[j] = tok[j - 1];
            j--;
        }
        tok[j] = i;
    }
    for (int j = 0; j < m; j++)
        lp[j] = (float)((double)logits[tok[j]] - mx - log(sum));
    return m;
}

md_sample_params smp_params(const md_sampling *s, double u) {
    return (md_sample_params){.temperature = s->temperature,
                              .top_k = s->top_k,
                              .top_p = s->top_p,
                              .min_p = s->min_p,
                              .u = u,
                              .repetition = s->repetition_penalty,
                              .presence = s->presence_penalty,
                              .frequency = s->frequency_penalty,
                              .n_top = s->top_logprobs};
}

int32_t smp_sample(const md_sampling *s, float *logits, int n, const int32_t *prompt, int n_prompt,
                   const int32_t *out, int n_out, smp_rng *rng, smp_scratch *sc, float *logprob) {
    /* one uniform per sampled token, none for greedy: the device path draws the same way */
    md_sample_params p = smp_params(s, s->temperature > 0 ? smp_rng_uniform(rng) : 0);
    p.pen_n = smp_pen_list(s, prompt, n_prompt, out, n_out, n, sc, sc->pen);
    if (logprob)
        *logprob = 0;
    int report = s->logprobs || s->top_logprobs;
    return smp_sample_row(&p, sc->pen, logits, n, sc, logprob && report ? logprob : NULL);
}
