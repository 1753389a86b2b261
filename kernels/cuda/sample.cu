/* sample.cu — choosing the next token on the device, one block per row of logits.
 *
 * Greedy is an argmax (lowest index on ties). A row with penalty entries is penalised in
 * place first (one thread per distinct token; engine/sampler.c's arithmetic, unfused). Then,
 * with s_i = (logit_i - max) / T:
 * top-k, top-p and min-p become thresholds on s found by radix select (three histogram
 * passes over the row each, counts or fixed-point masses in shared memory: no sort, no
 * scratch memory), and the token is the inverse-CDF draw at the
 * caller's uniform u over the kept tokens in index order (a block-wide prefix scan). The
 * caller's RNG supplies u, so a seed gives the same tokens on every backend. The logprob is
 * the chosen token's log-softmax under the row as it came in (raw, before penalties); the top
 * logprobs are the raw row's most likely tokens, one block-wide argmax pass each. A
 * constrained row (structured outputs) comes in already constrained by k_constrain: its
 * masked tokens at -inf have no mass, are never drawn and never listed. */
#include "kernels/cuda/cuda_internal.h"

#define SAMPLE_THREADS 1024
#define RADIX_BINS 2048         /* 11 bits a pass: 11 + 11 + 10 make a float's 32 */
#define MASS_ONE 68719476736.0f /* 2^36: exp(s) <= 1 in fixed point, sums of 2^24 fit 64 bits */

/* Block argmax: value and lowest index among maxima. */
__device__ void block_argmax(float v, int i, float *shv, int *shi, float *outv, int *outi) {
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, v, o);
        int oi = __shfl_xor_sync(0xffffffffu, i, o);
        if (ov > v || (ov == v && oi < i)) {
            v = ov;
            i = oi;
        }
    }
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) {
        shv[wid] = v;
        shi[wid] = i;
    }
    __syncthreads();
    if (wid == 0) {
        v = lane < nw ? shv[lane] : -FLT_MAX;
        i = lane < nw ? shi[lane] : INT_MAX;
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, v, o);
            int oi = __shfl_xor_sync(0xffffffffu, i, o);
            if (ov > v || (ov == v && oi < i)) {
                v = ov;
                i = oi;
            }
        }
        if (lane == 0) {
            shv[0] = v;
            shi[0] = i;
        }
    }
    __syncthreads();
    *outv = shv[0];
    *outi = shi[0];
}

__global__ void k_argmax(const float *logits, int vocab, int32_t *out) {
    __shared__ float shv[32];
    __shared__ int shi[32];
    const float *l = logits + (int64_t)blockIdx.x * vocab;
    float bv = -FLT_MAX;
    int bi = INT_MAX, nan = 0;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        float x = l[i];
        nan |= x != x;
        if (x > bv) { /* strided ascending: the first maximum seen has the lowest index */
            bv = x;
            bi = i;
        }
    }
    nan = __syncthreads_or(nan);
    float v;
    int idx;
    block_argmax(bv, bi, shv, shi, &v, &idx);
    /* -1: the row holds a NaN (a faulty device or weights), as the CPU backend's argmax; the
     * engine fails such a sequence instead of emitting a token */
    if (threadIdx.x == 0)
        out[blockIdx.x] = nan ? -1 : idx == INT_MAX ? 0 : idx;
}

int cuda_argmax(cuda_ctx *c, const float *logits, int rows, int vocab, int32_t *out, md_err *e) {
    CUDA_GUARD(c, e);
    if (rows < 0 || vocab <= 0)
        return md_errf(e, MD_EINVAL, "CUDA argmax: bad shape [%d, %d]", rows, vocab);
    if (rows == 0)
        return 0;
    k_argmax<<<rows, SAMPLE_THREADS, 0, c->stream>>>(logits, vocab, out);
    return CUDA_LAUNCHED(c, "argmax", e);
}

/* Count and sum of exp(s) over tokens with s >= thr. */
__device__ void kept(const float *l, int vocab, float mx, float invt, float thr, float *sh,
                     float *count, float *mass) {
    float cn = 0.0f, ms = 0.0f;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        float s = (l[i] - mx) * invt;
        if (s >= thr) {
            cn += 1.0f;
            ms += __expf(s);
        }
    }
    *count = cuda_block_sum(cn, sh);
    *mass = cuda_block_sum(ms, sh);
}

/* Max, its lowest index, min and NaN of a row. */
__device__ void row_stats(const float *l, int vocab, float *shv, int *shi, float *sh, float *mx,
                          int *amax, float *lmin, int *nan) {
    float bv = -FLT_MAX, mn = FLT_MAX;
    int bi = INT_MAX, bad = 0;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        float x = l[i];
        bad |= x != x;
        if (x > bv) {
            bv = x;
            bi = i;
        }
        mn = fminf(mn, x);
    }
    *nan = __syncthreads_or(bad);
    block_argmax(bv, bi, shv, shi, mx, amax);
    *lmin = -cuda_block_max(-mn, sh);
}

/* Order-keeping keys of floats: a larger float has a larger key (NaN excluded). */
__device__ __forceinline__ unsigned sample_key(float s) {
    unsigned u = __float_as_uint(s);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float key_value(unsigned k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

typedef struct {
    unsigned digit;
    unsigned long long above;
} radix_pick;

/* Radix select over the keys of s = (l - max) * invt (the expression kept() uses, so the
 * thresholds compare equal there): the largest key at which the running total from the
 * largest key down reaches the target, over keys >= lo only. by_mass 0: the total counts
 * tokens and the target is `want` (top-k: the want-th largest); 1: it sums exp(s) in fixed
 * point (2^36 = 1; integer sums, so the order of the atomics changes nothing) and the target
 * is `want` times the mass of the keys >= lo (top-p). Three passes over the row (11, 11 and
 * 10 bits of the key, histograms in shared memory), where bisection took 40; the result is
 * the s of a token, exact. */
__device__ unsigned radix_cut(const float *l, int vocab, float mx, float invt, unsigned lo,
                              int by_mass, float want, unsigned long long *bins, radix_pick *cut) {
    const int shifts[3] = {21, 10, 0}, widths[3] = {11, 11, 10};
    unsigned prefix = 0, pmask = 0;
    unsigned long long above = 0, target = 0;
    for (int lv = 0; lv < 3; lv++) {
        int sh = shifts[lv], nb = 1 << widths[lv];
        for (int b = threadIdx.x; b < nb; b += blockDim.x)
            bins[b] = 0;
        __syncthreads();
        for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
            float s = (l[i] - mx) * invt;
            unsigned k = sample_key(s);
            if (k < lo || (k & pmask) != prefix)
                continue;
            atomicAdd(&bins[(k >> sh) & (unsigned)(nb - 1)],
                      by_mass ? (unsigned long long)(__expf(s) * MASS_ONE) : 1ull);
        }
        __syncthreads();
        if (threadIdx.x < 32) { /* warp 0: lane j sums the j-th chunk of bins from the top */
            int lane = threadIdx.x, chunk = nb / 32, top = nb - 1 - lane * chunk;
            unsigned long long sum = 0;
            for (int d = top; d > top - chunk; d--)
                sum += bins[d];
            unsigned long long incl = sum; /* inclusive scan over the lanes, from the top */
            for (int o = 1; o < 32; o <<= 1) {
                unsigned long long y = __shfl_up_sync(0xffffffffu, incl, o);
                if (lane >= o)
                    incl += y;
            }
            if (lv == 0) /* the targets, once the first histogram holds every key >= lo */
                target = by_mass ? (unsigned long long)((double)want *
                                                        (double)__shfl_sync(0xffffffffu, incl, 31))
                                 : (unsigned long long)want;
            if (lane == 31) /* not reached (rounding): every key of this range */
                *cut = (radix_pick){0, above + incl - bins[0]};
            __syncwarp();
            if (above + incl >= target && above + incl - sum < target) { /* the crossing lane */
                unsigned long long run = above + incl - sum;
                int d = top;
                while (d > top - chunk + 1 && run + bins[d] < target)
                    run += bins[d--];
                *cut = (radix_pick){(unsigned)d, run};
            }
        }
        __syncthreads();
        prefix |= cut->digit << sh;
        pmask |= (unsigned)(nb - 1) << sh;
        above = cut->above;
        __syncthreads();
    }
    return prefix;
}

/* The row's token, and its logprob from its raw logit: the row's own, unless an entry
 * penalised it (then the value saved before). Every thread of the block calls it. */
__device__ void sample_done(const float *l, int tok, const cuda_sample_params *P,
                            const cuda_sample_pen *pen, const float *pen_raw, float raw_mx,
                            float raw_lse, int32_t *out, float *logprob, float *raw_tok) {
    if (logprob) {
        if (threadIdx.x == 0)
            *raw_tok = l[tok];
        __syncthreads();
        for (int j = threadIdx.x; j < P->pen_n; j += blockDim.x)
            if (pen[P->pen_off + j].token == tok)
                *raw_tok = pen_raw[P->pen_off + j];
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        out[blockIdx.x] = tok;
        if (logprob)
            logprob[blockIdx.x] = *raw_tok - raw_mx - raw_lse;
    }
}

/* The k most likely tokens of the raw row, most likely first and the lowest index first among
 * equals, with their logprobs: k block-wide argmax passes, each over the tokens after the
 * last one found in that order (engine/sampler.h smp_top_logprobs lists the same). -1 / 0
 * past the last. */
__device__ void top_logprobs(const float *l, int vocab, int k, float raw_mx, float raw_lse,
                             float *shv, int *shi, int32_t *tt, float *tl) {
    float pv = FLT_MAX;
    int pi = -1, j = 0;
    for (; j < k && j < CUDA_SAMPLE_TOP; j++) {
        float bv = -FLT_MAX;
        int bi = INT_MAX;
        for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
            float x = l[i];
            if ((x < pv || (x == pv && i > pi)) && x > bv) {
                bv = x;
                bi = i;
            }
        }
        float v;
        int idx;
        block_argmax(bv, bi, shv, shi, &v, &idx);
        if (idx == INT_MAX) /* no finite logit left: the same for every thread */
            break;
        if (threadIdx.x == 0) {
            tt[j] = idx;
            tl[j] = v - raw_mx - raw_lse;
        }
        pv = v;
        pi = idx;
    }
    for (int r = j + threadIdx.x; r < CUDA_SAMPLE_TOP; r += blockDim.x) {
        tt[r] = -1;
        tl[r] = 0.0f;
    }
}

__global__ void k_sample(float *logits, int vocab, const cuda_sample_params *params,
                         const cuda_sample_pen *pen, float *pen_raw, int32_t *out, float *logprob,
                         int32_t *top_tok, float *top_lp) {
    __shared__ float sh[32], shv[32];
    __shared__ int shi[32];
    __shared__ float carry, raw_tok;
    __shared__ int found;
    __shared__ unsigned long long bins[RADIX_BINS];
    __shared__ radix_pick cut;
    float *l = logits + (int64_t)blockIdx.x * vocab;
    cuda_sample_params P = params[blockIdx.x];

    float mx, lmin;
    int amax, nan;
    row_stats(l, vocab, shv, shi, sh, &mx, &amax, &lmin, &nan);
    /* a NaN: a faulty device or weights, the engine fails the row; every logit -inf: no token
     * to pick, and INT_MAX is no index */
    if (nan || amax == INT_MAX) {
        if (threadIdx.x == 0) {
            out[blockIdx.x] = -1;
            if (logprob)
                logprob[blockIdx.x] = 0.0f;
        }
        for (int r = threadIdx.x; top_tok && r < CUDA_SAMPLE_TOP; r += blockDim.x) {
            top_tok[(int64_t)blockIdx.x * CUDA_SAMPLE_TOP + r] = -1;
            top_lp[(int64_t)blockIdx.x * CUDA_SAMPLE_TOP + r] = 0.0f;
        }
        return;
    }
    /* the logprob is the raw row's: its log-sum-exp before the penalties change it */
    float raw_mx = mx, raw_lse = 0.0f;
    if (logprob || top_tok) {
        float dummy, z;
        kept(l, vocab, mx, 1.0f, -FLT_MAX, sh, &dummy, &z);
        raw_lse = logf(z);
    }
    if (top_tok)
        top_logprobs(l, vocab, P.n_top, raw_mx, raw_lse, shv, shi,
                     top_tok + (int64_t)blockIdx.x * CUDA_SAMPLE_TOP,
                     top_lp + (int64_t)blockIdx.x * CUDA_SAMPLE_TOP);
    if (P.pen_n > 0) {
        /* each entry names a distinct token: one thread per entry, no races. Unfused
         * arithmetic, as engine/sampler.c does it on the host, so both give the same bits. */
        for (int j = threadIdx.x; j < P.pen_n; j += blockDim.x) {
            cuda_sample_pen en = pen[P.pen_off + j];
            if (en.token < 0 || en.token >= vocab)
                continue;
            float v = l[en.token];
            pen_raw[P.pen_off + j] = v;
            if (P.repetition != 1.0f)
                v = v > 0.0f ? __fdiv_rn(v, P.repetition) : __fmul_rn(v, P.repetition);
            if (en.n_out > 0)
                v = __fsub_rn(v, __fadd_rn(P.presence, __fmul_rn(P.frequency, (float)en.n_out)));
            l[en.token] = v;
        }
        __syncthreads(); /* the block's writes are visible to the block from here */
        row_stats(l, vocab, shv, shi, sh, &mx, &amax, &lmin, &nan);
    }
    if (P.temperature <= 0.0f) {
        sample_done(l, amax, &P, pen, pen_raw, raw_mx, raw_lse, out, logprob, &raw_tok);
        return;
    }
    float invt = 1.0f / P.temperature;
    float smin = (lmin - mx) * invt; /* every s lies in [smin, 0] */
    float thr = smin;
    if (P.top_k > 0 && P.top_k < vocab) /* the k-th largest s: count(s >= thr) >= k */
        thr = key_value(
            radix_cut(l, vocab, mx, invt, sample_key(thr), 0, (float)P.top_k, bins, &cut));
    if (P.top_p > 0.0f && P.top_p < 1.0f) /* the s at which the mass from the top reaches top_p */
        thr = key_value(radix_cut(l, vocab, mx, invt, sample_key(thr), 1, P.top_p, bins, &cut));
    if (P.min_p > 0.0f && P.min_p <= 1.0f)
        thr = fmaxf(thr, logf(P.min_p));
    float cn, mass;
    kept(l, vocab, mx, invt, thr, sh, &cn, &mass);
    float target = fminf(fmaxf(P.u, 0.0f), 0.99999994f) * mass;
    /* Inverse CDF: first kept index whose running sum exceeds target, chunk by chunk. */
    if (threadIdx.x == 0) {
        carry = 0.0f;
        found = INT_MAX;
    }
    int last_kept = -1;
    for (int base = 0; base < vocab; base += blockDim.x) {
        int i = base + threadIdx.x;
        float s = i < vocab ? (l[i] - mx) * invt : -FLT_MAX;
        float p = (i < vocab && s >= thr) ? __expf(s) : 0.0f;
        if (p > 0.0f)
            last_kept = i;
        /* inclusive scan: warps, then warp totals */
        float x = p;
        int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
        for (int o = 1; o < 32; o <<= 1) {
            float y = __shfl_up_sync(0xffffffffu, x, o);
            if (lane >= o)
                x += y;
        }
        __syncthreads();
        if (lane == 31)
            sh[wid] = x;
        __syncthreads();
        if (wid == 0) {
            float w = sh[lane];
            for (int o = 1; o < 32; o <<= 1) {
                float y = __shfl_up_sync(0xffffffffu, w, o);
                if (lane >= o)
                    w += y;
            }
            sh[lane] = w;
        }
        __syncthreads();
        float incl = carry + x + (wid > 0 ? sh[wid - 1] : 0.0f);
        if (p > 0.0f && incl > target)
            atomicMin(&found, i);
        __syncthreads();
        if (threadIdx.x == blockDim.x - 1)
            carry = incl;
        __syncthreads();
        if (found != INT_MAX)
            break;
    }
    /* Rounding can leave target unreached: fall back to the last kept token. */
    int lk = (int)cuda_block_max((float)last_kept, sh);
    sample_done(l, found != INT_MAX ? found : (lk >= 0 ? lk : amax), &P, pen, pen_raw, raw_mx,
                raw_lse, out, logprob, &raw_tok);
}

/* One block per row: the bias entries in order by one thread (a token may be listed twice:
 * the adds happen in the host's order), then the mask word by word. */
__global__ void k_constrain(float *logits, int vocab, const cuda_sample_params *params,
                            const uint32_t *mask, const cuda_sample_bias *bias) {
    float *l = logits + (int64_t)blockIdx.x * vocab;
    cuda_sample_params P = params[blockIdx.x];
    if (threadIdx.x == 0)
        for (int j = 0; j < P.bias_n; j++) {
            cuda_sample_bias b = bias[P.bias_off + j];
            if (b.token >= 0 && b.token < vocab)
                l[b.token] = __fadd_rn(l[b.token], b.bias);
        }
    if (P.mask_row <= 0)
        return;
    __syncthreads();
    const uint32_t *m = mask + (int64_t)(P.mask_row - 1) * ((vocab + 31) / 32);
    for (int i = threadIdx.x; i < vocab; i += blockDim.x)
        if (!((m[i >> 5] >> (i & 31)) & 1u))
            l[i] = __uint_as_float(0xff800000u); /* -inf */
}

int cuda_constrain(cuda_ctx *c, float *logits, int rows, int vocab, const cuda_sample_params *params,
                   const uint32_t *mask, const cuda_sample_bias *bias, md_err *e) {
    CUDA_GUARD(c, e);
    if (rows < 0 || vocab <= 0)
        return md_errf(e, MD_EINVAL, "CUDA constrain: bad shape [%d, %d]", rows, vocab);
    if (rows == 0)
        return 0;
    k_constrain<<<rows, 256, 0, c->stream>>>(logits, vocab, params, mask, bias);
    return CUDA_LAUNCHED(c, "constrain", e);
}

int cuda_sample(cuda_ctx *c, float *logits, int rows, int vocab, const cuda_sample_params *params,
                const cuda_sample_pen *pen, float *pen_raw, int32_t *out, float *logprob,
                int32_t *top_tok, float *top_lp, md_err *e) {
    CUDA_GUARD(c, e);
    if (rows < 0 || vocab <= 0)
        return md_errf(e, MD_EINVAL, "CUDA sample: bad shape [%d, %d]", rows, vocab);
    if (rows == 0)
        return 0;
    k_sample<<<rows, SAMPLE_THREADS, 0, c->stream>>>(logits, vocab, params, pen, pen_raw, out,
                                                     logprob, top_tok, top_lp);
    return CUDA_LAUNCHED(c, "sample", e);
}
