/* perf.c — the performance model (docs/scheduler.md §2): per stage, prefill is
 * compute-bound and decode reads the weights plus the batch's KV once per step; the KV
 * capacity left after weights bounds the batch; TP adds two all-reduces per layer over the
 * group's link; PP splits the batch into one micro-batch per stage and adds each hop
 * between hosts (latency + bytes over the inter-host link). Measured profiles
 * (schemas/profile.schema.json) replace the roofline for the (model, device, tp) they were
 * measured on. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "scheduler/sched.h"

void sched_perf_defaults(sched_perf_params *p) {
    p->bw_eff = 0.75;
    p->compute_eff = 0.55;
    p->mem_util = 0.90;
    p->reserve_gb = 1.5;
    p->link_eff = 0.7;
    p->link_latency_s = 10e-6;
    p->max_batch = 256;
    p->slo_tpot_s = 0;
    p->slo_ttft_s = 0;
    p->inter_host_latency_s = 15e-6;
}

double sched_perf_pp_hop(double bytes, double inter_host_gbps, const sched_perf_params *pp) {
    return pp->inter_host_latency_s + bytes / (inter_host_gbps * 1e9 * pp->link_eff);
}

/* Parameters a stage holds and runs per token: its blocks, the embedding table on the first
 * stage (only looked up), the lm_head on the last (a copy of the embedding when tied). */
static double stage_params_run(const sched_model *m, int layers, int last) {
    double head = m->embedding         ? 0 /* pooled on the host */
                  : m->tied_embeddings ? sched_model_embed_params(m)
                                       : sched_model_head_params(m);
    return layers * sched_model_layer_params(m) + (last ? head + m->hidden : 0);
}

static double stage_weight_bytes(const sched_model *m, int layers, int first, int last) {
    return (stage_params_run(m, layers, last) + (first ? sched_model_embed_params(m) : 0)) *
           m->bytes_per_weight;
}

/* Two ring all-reduces per layer (after attention and after the MLP) of `tokens` rows. */
static double tp_comm(const sched_model *m, const sched_gpu_type *g, int tp, int layers,
                      double tokens, const sched_perf_params *pp) {
    if (tp <= 1)
        return 0;
    double bytes = tokens * m->hidden * 2.0; /* fp16 activations */
    double link = sched_gpu_link_gbps(g) * 1e9 * pp->link_eff;
    double lat = g->nvlink_gbps > 0 ? pp->link_latency_s : 2.5 * pp->link_latency_s;
    return 2.0 * layers * (lat * 2 * (tp - 1) + 2.0 * (tp - 1) / tp * bytes / link);
}

double sched_perf_decode_step(const sched_model *m, const sched_gpu_type *g, int tp, int layers,
                              int first, int last, int batch, double ctx,
                              const sched_perf_params *pp) {
    double kv = sched_model_kv_bytes_per_token_layer(m);
    double prm = stage_params_run(m, layers, last);
    double bytes = (prm * m->bytes_per_weight + (double)batch * ctx * layers * kv) / tp;
    double flops = (2.0 * batch * prm + 4.0 * batch * ctx * layers * m->hidden) / tp;
    double t_mem = bytes / (g->hbm_gbps * 1e9 * pp->bw_eff);
    double t_cmp = flops / (g->bf16_tflops * 1e12 * pp->compute_eff);
    (void)first;
    return fmax(t_mem, t_cmp) + tp_comm(m, g, tp, layers, batch, pp);
}

double sched_perf_prefill(const sched_model *m, const sched_gpu_type *g, int tp, int layers,
                          int first, int last, double prompt, const sched_perf_params *pp) {
    double prm_layers = layers * sched_model_layer_params(m);
    double head = stage_params_run(m, 0, last);
    /* Causal attention: QK^T and AV over half the square on average; an encoder's is
     * bidirectional, the whole square. */
    double attn = (m->embedding == SCHED_EMBED_ENCODER ? 4.0 : 2.0) * prompt * prompt * m->hidden;
    double flops = (2.0 * prompt * prm_layers + 2.0 * head + attn * layers) / tp;
    double bytes = stage_weight_bytes(m, layers, 0, last) / tp;
    double t_cmp = flops / (g->bf16_tflops * 1e12 * pp->compute_eff);
    double t_mem = bytes / (g->hbm_gbps * 1e9 * pp->bw_eff);
    (void)first;
    return fmax(t_cmp, t_mem) + tp_comm(m, g, tp, layers, prompt, pp);
}

double sched_stage_memory_gb(const sched_gpu_type *g, const sched_stage *s) {
    return s->memory_gb > 0 ? s->memory_gb : g->memory_gb;
}

/* KV tokens the stage can hold after its weights and reserve (negative when weights alone
 * do not fit). */
static double stage_kv_tokens(const sched_model *m, const sched_gpu_type *g, const sched_stage *s,
                              const sched_perf_params *pp) {
    int layers = s->layer_hi - s->layer_lo;
    double usable =
        s->tp * (sched_stage_memory_gb(g, s) * 1e9 * pp->mem_util - pp->reserve_gb * 1e9);
    double w = stage_weight_bytes(m, layers, s->layer_lo == 0, s->layer_hi == m->layers);
    double free_b = usable - w;
    if (layers == 0 || m->embedding) /* an embedding model keeps no KV cache */
        return free_b >= 0 ? INFINITY : -1;
    return free_b / (layers * sched_model_kv_bytes_per_token_layer(m));
}

int sched_stage_fits(const sched_model *m, const sched_gpu_type *g, const sched_stage *s,
                     double min_kv_tokens, const sched_perf_params *pp, md_err *e) {
    double kv = stage_kv_tokens(m, g, s, pp);
    if (kv >= min_kv_tokens)
        return 0;
    int layers = s->layer_hi - s->layer_lo;
    double w = stage_weight_bytes(m, layers, s->layer_lo == 0, s->layer_hi == m->layers);
    double need = w + min_kv_tokens * layers * sched_model_kv_bytes_per_token_layer(m) +
                  s->tp * pp->reserve_gb * 1e9;
    return md_errf(e, MD_ERANGE,
                   "%s layers [%d,%d) on %dx%s need %.1f GB (weights %.1f GB + KV for %.0f "
                   "tokens + reserve) but %d x %.1f GB x %.2f usable = %.1f GB",
                   m->name, s->layer_lo, s->layer_hi, s->tp, g->name, need / 1e9, w / 1e9,
                   min_kv_tokens, s->tp, sched_stage_memory_gb(g, s), pp->mem_util,
                   s->tp * sched_stage_memory_gb(g, s) * pp->mem_util);
}

static const sched_profile_bucket *find_bucket(const sched_profile *p, double in, double out) {
    for (int i = 0; i < p->nbuckets; i++) {
        const sched_profile_bucket *b = &p->buckets[i];
        if (in >= b->in_lo && in < b->in_hi && out >= b->out_lo && out < b->out_hi)
            return b;
    }
    return NULL;
}

/* Decode tokens/s at batch b from the per-batch table (linear between measured sizes,
 * flat beyond the largest). 0 when there is no table. */
static double profile_decode_tps(const sched_profile *p, int b) {
    if (p->nbatches == 0)
        return 0;
    const double *bs = p->batch_decode_tps[0], *tps = p->batch_decode_tps[1];
    if (b <= bs[0])
        return tps[0] * b / bs[0];
    for (int i = 1; i < p->nbatches; i++)
        if (b <= bs[i])
            return tps[i - 1] + (tps[i] - tps[i - 1]) * (b - bs[i - 1]) / (bs[i] - bs[i - 1]);
    return tps[p->nbatches - 1];
}

/* The interval between two output tokens of one sequence, seconds: a decode step of the
 * whole batch (every stage in turn for a pipeline), plus the prefills of the newcomers that
 * interrupt the batch — b / out of them per step on average (an engine without chunked
 * prefill). The TPOT a TPOT SLO bounds. */
static double token_interval(const sched_perf *r, double out) {
    return r->decode_step_s + r->batch / out * r->prefill_s;
}

/* The roofline prediction of a replica at batch b into r (batch, prefill, decode step,
 * requests/s, tokens/s, bound). */
static int roofline_at(const sched_model *m, const sched_catalog *cat, const sched_stage *st,
                       int nstages, double inter_host_gbps, double in, double out, double b,
                       const sched_perf_params *pp, sched_perf *r) {
    double ctx = in + out / 2;
    r->batch = (int)b;
    /* Per request, each stage spends its share of prefill plus `out` decode steps shared
     * by the batch; with one micro-batch per stage a step of the micro-batch (b / S
     * sequences) runs on every stage in turn, so the slowest stage sets the rate. Each
     * stage pays for the hop it sends (docs/scheduler.md §2): its micro-batch's activations
     * to the next stage (mb x hidden fp16), the last stage the sampled tokens (mb int32)
     * back to the first; prefill sends the prompt's activations on. */
    double mb = fmax(1.0, b / nstages);
    double worst = 0, pre_total = 0, step_total = 0;
    int compute_bound = 0;
    for (int s = 0; s < nstages; s++) {
        const sched_gpu_type *g = &cat->gpus[st[s].type];
        int layers = st[s].layer_hi - st[s].layer_lo;
        int first = st[s].layer_lo == 0, last = st[s].layer_hi == m->layers;
        double pre = sched_perf_prefill(m, g, st[s].tp, layers, first, last, in, pp);
        double step = sched_perf_decode_step(m, g, st[s].tp, layers, first, last, (int)mb, ctx, pp);
        if (nstages > 1) {
            int to_next = s + 1 < nstages;
            step +=
                sched_perf_pp_hop(to_next ? mb * m->hidden * 2.0 : mb * 4.0, inter_host_gbps, pp);
            if (to_next)
                pre += sched_perf_pp_hop(in * m->hidden * 2.0, inter_host_gbps, pp);
        }
        double per_req = pre + out * step / mb;
        if (per_req > worst) {
            worst = per_req;
            double prm = stage_params_run(m, layers, last);
            double kvb = sched_model_kv_bytes_per_token_layer(m);
            double t_mem = (prm * m->bytes_per_weight + mb * ctx * layers * kvb) /
                           (g->hbm_gbps * 1e9 * pp->bw_eff);
            double t_cmp = (2.0 * mb * prm + 4.0 * mb * ctx * layers * m->hidden) /
                           (g->bf16_tflops * 1e12 * pp->compute_eff);
            compute_bound = t_cmp > t_mem;
        }
        pre_total += pre;
        step_total += step;
    }
    r->prefill_s = pre_total;
    r->decode_step_s = step_total;
    r->requests_per_s = 1.0 / worst;
    r->tokens_per_s = r->requests_per_s * (in + out);
    if (b < pp->max_batch)
        r->bound = "kv";
    else
        r->bound = compute_bound ? "compute" : "memory";
    return 0;
}

/* An embedding model's replica (docs/embeddings.md, "Scheduling and cost"): each step embeds
 * a batch of b inputs of `in` tokens, reading the weights once; per stage it takes
 * max(compute of b prefills, the weights read) plus its TP all-reduces and, but for the
 * last stage, the hop of the batch's activations; the slowest stage sets the rate,
 * b / step. No token is generated: prefill_s and decode_step_s are both that step. */
static void embed_roofline(const sched_model *m, const sched_catalog *cat, const sched_stage *st,
                           int nstages, double inter_host_gbps, double in, int b,
                           const sched_perf_params *pp, sched_perf *r) {
    double worst = 0;
    int compute_bound = 0;
    for (int s = 0; s < nstages; s++) {
        const sched_gpu_type *g = &cat->gpus[st[s].type];
        int layers = st[s].layer_hi - st[s].layer_lo, tp = st[s].tp;
        double prm = layers * sched_model_layer_params(m);
        double attn = (m->embedding == SCHED_EMBED_ENCODER ? 4.0 : 2.0) * in * in * m->hidden;
        double t_cmp =
            b * (2.0 * in * prm + attn * layers) / tp / (g->bf16_tflops * 1e12 * pp->compute_eff);
        double t_mem = stage_weight_bytes(m, layers, st[s].layer_lo == 0, 0) / tp /
                       (g->hbm_gbps * 1e9 * pp->bw_eff);
        double t = fmax(t_cmp, t_mem) + tp_comm(m, g, tp, layers, b * in, pp);
        if (s + 1 < nstages)
            t += sched_perf_pp_hop(b * in * m->hidden * 2.0, inter_host_gbps, pp);
        if (t > worst) {
            worst = t;
            compute_bound = t_cmp > t_mem;
        }
    }
    r->batch = b;
    r->prefill_s = worst;
    r->decode_step_s = worst; /* the simulator's step: a batch of inputs embedded */
    r->requests_per_s = b / worst;
    r->tokens_per_s = r->requests_per_s * in;
    r->bound = compute_bound ? "compute" : "memory";
}

/* An embedding model's prediction: a profile's bucket (output lengths [0, 1)) or its prefill
 * tokens/s, else the roofline; a TTFT SLO bounds a step's time. */
static int embed_replica(const sched_model *m, const sched_catalog *cat, const sched_stage *st,
                         int nstages, double inter_host_gbps, double in,
                         const sched_perf_params *pp, const sched_profile *prof, sched_perf *r,
                         md_err *e) {
    if (in > m->max_context)
        return md_errf(e, MD_ERANGE, "%s embeds at most %d tokens an input, not %.0f", m->name,
                       m->max_context, in);
    r->batch = pp->max_batch;
    if (prof) {
        const sched_profile_bucket *bk = find_bucket(prof, in, 0);
        double rps = bk && bk->rps > 0       ? bk->rps
                     : prof->prefill_tps > 0 ? prof->prefill_tps / in
                                             : 0;
        if (rps > 0) {
            r->requests_per_s = rps;
            r->tokens_per_s = rps * in;
            r->prefill_s = r->decode_step_s = r->batch / rps;
            r->bound = "profile";
            return 0;
        }
    }
    embed_roofline(m, cat, st, nstages, inter_host_gbps, in, r->batch, pp, r);
    if (pp->slo_ttft_s > 0 && r->prefill_s > pp->slo_ttft_s)
        return md_errf(e, MD_ERANGE,
                       "%s: a step of %d inputs of %.0f tokens takes %.1f ms here, "
                       "over the TTFT SLO of %.1f ms",
                       m->name, r->batch, in, r->prefill_s * 1e3, pp->slo_ttft_s * 1e3);
    return 0;
}

int sched_perf_replica(const sched_model *m, const sched_catalog *cat, const sched_stage *st,
                       int nstages, double inter_host_gbps, double in, double out,
                       const sched_perf_params *pp, const sched_profile *prof, sched_perf *r,
                       md_err *e) {
    memset(r, 0, sizeof *r);
    r->scale = 1;
    double kv = INFINITY;
    for (int s = 0; s < nstages; s++) {
        const sched_gpu_type *g = &cat->gpus[st[s].type];
        int rc = sched_stage_fits(m, g, &st[s], 0, pp, e);
        if (rc)
            return rc;
        kv = fmin(kv, stage_kv_tokens(m, g, &st[s], pp));
    }
    r->kv_tokens = kv;
    if (m->embedding)
        return embed_replica(m, cat, st, nstages, inter_host_gbps, in, pp, prof, r, e);
    /* A sequence holds its prompt and, on average, half its output while it decodes. */
    double occupancy = in + out / 2;
    double b = floor(kv / occupancy);
    if (b > pp->max_batch)
        b = pp->max_batch;
    if (b < 1)
        return md_errf(e, MD_ERANGE,
                       "%s on this group holds %.0f KV tokens, less than one request of %.0f "
                       "prompt + %.0f output tokens",
                       m->name, kv, in, out);
    r->batch = (int)b;
    r->bound = "kv";
    if (prof) {
        const sched_profile_bucket *bk = find_bucket(prof, in, out);
        if (bk && bk->rps > 0) {
            r->requests_per_s = bk->rps;
            r->tokens_per_s = bk->rps * (in + out);
            r->bound = "profile";
            r->decode_step_s = r->batch / (bk->rps * out);
            return 0;
        }
        double dtps = profile_decode_tps(prof, r->batch);
        if (dtps > 0) {
            r->decode_step_s = r->batch / dtps;
            r->prefill_s = prof->prefill_tps > 0 ? in / prof->prefill_tps : 0;
            r->requests_per_s = 1.0 / (r->prefill_s + out * r->decode_step_s / r->batch);
            r->tokens_per_s = r->requests_per_s * (in + out);
            r->bound = "profile";
            return 0;
        }
    }
    int rc = roofline_at(m, cat, st, nstages, inter_host_gbps, in, out, b, pp, r);
    if (pp->slo_tpot_s > 0 && token_interval(r, out) > pp->slo_tpot_s) {
        /* the largest batch whose interval between a sequence's tokens meets the SLO
         * (it grows with the batch): bisect [1, b) */
        double lo = 0, hi = b;
        while (hi - lo > 1) {
            double mid = floor((lo + hi) / 2);
            roofline_at(m, cat, st, nstages, inter_host_gbps, in, out, mid, pp, r);
            if (token_interval(r, out) <= pp->slo_tpot_s)
                lo = mid;
            else
                hi = mid;
        }
        if (lo < 1) {
            roofline_at(m, cat, st, nstages, inter_host_gbps, in, out, 1, pp, r);
            return md_errf(e, MD_ERANGE,
                           "%s: one sequence takes %.1f ms per output token here, over the TPOT "
                           "SLO of %.1f ms",
                           m->name, token_interval(r, out) * 1e3, pp->slo_tpot_s * 1e3);
        }
        roofline_at(m, cat, st, nstages, inter_host_gbps, in, out, lo, pp, r);
        r->bound = "slo";
    }
    if (pp->slo_ttft_s > 0 && r->prefill_s > pp->slo_ttft_s)
        return md_errf(e, MD_ERANGE,
                       "%s: a %.0f-token prompt takes %.1f ms here, over the TTFT "
                       "SLO of %.1f ms",
                       m->name, in, r->prefill_s * 1e3, pp->slo_ttft_s * 1e3);
    return rc;
}

/* ---- profiles ---- */

/* The keys of schemas/profile: the document, its buckets and its batch rows. */
static const char *const PROFILE_KEYS[] = {
    "version", "kind", "device_type", "device_count", "tp",      "model",   "quant",       "date",
    "method",  "tool", "source",      "host",         "buckets", "batches", "max_context", NULL};
static const char *const BUCKET_KEYS[] = {"input_lo",
                                          "input_hi",
                                          "output_lo",
                                          "output_hi",
                                          "input_mean",
                                          "output_mean",
                                          "max_requests_per_s",
                                          "max_output_tokens_per_s",
                                          "max_total_tokens_per_s",
                                          "batch",
                                          "slo_ms_per_token",
                                          NULL};
static const char *const BATCH_KEYS[] = {
    "batch", "context", "decode_step_ms", "decode_tokens_per_s", "prefill_tokens_per_s", NULL};

static int parse_profile(sched_profile *p, json_t *doc, const char *where, md_err *e) {
    const char *dev = NULL, *model = NULL;
    long long tp = 1, count = 1;
    memset(p, 0, sizeof *p);
    if (md_json_check_keys(doc, PROFILE_KEYS, where, e))
        return e->code;
    if (md_json_get_str(doc, "device_type", 1, &dev, where, e) ||
        md_json_get_str(doc, "model", 1, &model, where, e) ||
        md_json_get_int(doc, "tp", 0, &tp, where, e) ||
        md_json_get_int(doc, "device_count", 0, &count, where, e))
        return e->code;
    long long v = 0;
    if (md_json_get_int(doc, "version", 1, &v, where, e))
        return e->code;
    if (v != 1)
        return md_errf(e, MD_EFORMAT, "%s.version is %lld; this build reads version 1", where, v);
    snprintf(p->device, sizeof p->device, "%s", dev);
    snprintf(p->model, sizeof p->model, "%s", model);
    p->tp = (int)(tp > count ? tp : count);
    if (p->tp < 1 || p->tp > 64)
        return md_errf(e, MD_EINVAL, "%s.tp must be in [1, 64]", where);
    json_t *bk = json_object_get(doc, "buckets"), *bs = json_object_get(doc, "batches");
    if (!json_is_array(bk) && !json_is_array(bs))
        return md_errf(e, MD_EFORMAT, "%s: a profile needs \"buckets\" or \"batches\"", where);
    if (json_is_array(bk) && json_array_size(bk)) {
        p->buckets = calloc(json_array_size(bk), sizeof *p->buckets);
        if (!p->buckets)
            return md_errf(e, MD_ENOMEM, "out of memory");
        size_t i;
        json_t *b;
        json_array_foreach(bk, i, b) {
            char w[96];
            snprintf(w, sizeof w, "%s.buckets[%zu]", where, i);
            sched_profile_bucket *x = &p->buckets[i];
            long long a = 0, bb = 0, c = 0, d = 0;
            double otps = 0;
            if (md_json_check_keys(b, BUCKET_KEYS, w, e) ||
                md_json_get_int(b, "input_lo", 1, &a, w, e) ||
                md_json_get_int(b, "input_hi", 1, &bb, w, e) ||
                md_json_get_int(b, "output_lo", 1, &c, w, e) ||
                md_json_get_int(b, "output_hi", 1, &d, w, e) ||
                md_json_get_num(b, "max_requests_per_s", 0, &x->rps, w, e) ||
                md_json_get_num(b, "max_output_tokens_per_s", 0, &otps, w, e))
                return e->code;
            if (a < 0 || bb <= a || c < 0 || d <= c || a > 1e9 || bb > 1e9 || c > 1e9 || d > 1e9)
                return md_errf(e, MD_EINVAL, "%s: bounds must satisfy 0 <= lo < hi", w);
            x->in_lo = (int)a, x->in_hi = (int)bb, x->out_lo = (int)c, x->out_hi = (int)d;
            x->in_mean = (a + bb) / 2.0;
            x->out_mean = (c + d) / 2.0;
            if (md_json_get_num(b, "input_mean", 0, &x->in_mean, w, e) ||
                md_json_get_num(b, "output_mean", 0, &x->out_mean, w, e))
                return e->code;
            if (x->rps <= 0 && otps > 0 && x->out_mean > 0)
                x->rps = otps / x->out_mean;
            if (!(x->rps > 0))
                return md_errf(e, MD_EINVAL,
                               "%s: give max_requests_per_s or max_output_tokens_per_s > 0", w);
            /* a bound far above any card (1e6 requests/s): 1e100 would make a plan of no
             * replicas claim its demand served */
            if (x->rps > 1e6 || !(x->in_mean >= 0 && x->in_mean <= 1e9) ||
                !(x->out_mean > 0 && x->out_mean <= 1e9))
                return md_errf(e, MD_EINVAL,
                               "%s: %g requests/s (at most 1e6 accepted) or means outside "
                               "(0, 1e9]",
                               w, x->rps);
            p->nbuckets++;
        }
    }
    if (json_is_array(bs)) {
        size_t i;
        json_t *b;
        json_array_foreach(bs, i, b) {
            char w[96];
            snprintf(w, sizeof w, "%s.batches[%zu]", where, i);
            long long n = 0;
            double tps = 0, pre = 0;
            if (md_json_check_keys(b, BATCH_KEYS, w, e) ||
                md_json_get_int(b, "batch", 1, &n, w, e) ||
                md_json_get_num(b, "decode_tokens_per_s", 0, &tps, w, e) ||
                md_json_get_num(b, "prefill_tokens_per_s", 0, &pre, w, e))
                return e->code;
            if (tps > 1e9 || pre > 1e10)
                return md_errf(e, MD_EINVAL, "%s: tokens/s above 1e9 (decode) or 1e10 (prefill)",
                               w);
            if (pre > p->prefill_tps)
                p->prefill_tps = pre;
            if (tps <= 0 || n < 1 || p->nbatches >= 16)
                continue;
            if (p->nbatches && n <= p->batch_decode_tps[0][p->nbatches - 1])
                return md_errf(e, MD_EINVAL, "%s: batch sizes must increase", w);
            p->batch_decode_tps[0][p->nbatches] = (double)n;
            p->batch_decode_tps[1][p->nbatches] = tps;
            p->nbatches++;
        }
    }
    return 0;
}

int sched_profile_from_json(sched_profiles *ps, json_t *doc, const char *where, md_err *e) {
    sched_profile p;
    if (parse_profile(&p, doc, where, e)) {
        free(p.buckets);
        return e->code;
    }
    sched_profile *n = realloc(ps->p, (size_t)(ps->n + 1) * sizeof *n);
    if (!n) {
        free(p.buckets);
        return md_errf(e, MD_ENOMEM, "out of memory");
    }
    ps->p = n;
    ps->p[ps->n++] = p;
    return 0;
}

int sched_profile_load(sched_profiles *ps, const char *path, md_err *e) {
    json_t *doc = sched_json_load(path, e);
    if (!doc)
        return e->code;
    int rc = sched_profile_from_json(ps, doc, path, e);
    json_decref(doc);
    return rc;
}

void sched_profiles_free(sched_profiles *ps) {
    for (int i = 0; i < ps->n; i++)
        free(ps->p[i].buckets);
    free(ps->p);
    memset(ps, 0, sizeof *ps);
}

int sched_profile_type(const sched_profile *p, const sched_catalog *cat) {
    int t = sched_catalog_find(cat, p->device);
    if (t >= 0)
        return t;
    /* a "<N>GB" word ("A100-SXM4-80GB", "H100-80GB-HBM3") is the card's memory size */
    double gb = 0;
    for (const char *s = p->device; *s; s++)
        if ((s == p->device || s[-1] == '-' || s[-1] == ' ' || s[-1] == '_') && s[0] >= '0' &&
            s[0] <= '9') {
            char *end;
            double v = strtod(s, &end);
            if ((end[0] == 'G' || end[0] == 'g') && (end[1] == 'B' || end[1] == 'b') &&
                (!end[2] || end[2] == '-' || end[2] == ' ' || end[2] == '_'))
                gb = v;
        }
    /* the match compares memory with the catalog's (driver-reported) figure: a card sold as
     * N GB holds about N GiB */
    return sched_catalog_match_device(cat, p->device, gb * 1.073741824);
}
