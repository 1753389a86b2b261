/* sched.h — medley's heterogeneity-aware scheduler: GPU catalog, model cards, the
 * performance model, candidate replicas (TP groups, and pipelines of up to four TP groups
 * of one or two types across hosts with a DP layer split), the placement MILP on GLPK, plans
 * (JSON, validity check, table, SVG chart) and a discrete-event fleet simulator.
 * docs/scheduler.md gives the equations.
 *
 * Ownership: every *_load / *_build / sched_plan_* function fills a caller-provided struct
 * whose arrays it malloc's; the matching *_free releases them (safe on a zeroed struct).
 * Units are in the names: _gb (1e9 bytes), _gbps (1e9 bytes/s), _tflops (1e12 FLOP/s),
 * _s (seconds), usd. Nothing here talks to Redis except sched_daemon_run (daemon.c). */
#ifndef MEDLEY_SCHEDULER_SCHED_H
#define MEDLEY_SCHEDULER_SCHED_H

#include <jansson.h>
#include <stdio.h>

#include "common/err.h"

#define SCHED_NAME 48 /* GPU types, models, classes: up to 47 characters */
/* Pool, host and worker names: up to 255 characters (a worker's default id is
 * "<hostname>-<pid>-<hex>"; a GPU id "<name>/<k>" fits SCHED_ID with k's digits). */
#define SCHED_NAME_MAX 255
#define SCHED_ID (SCHED_NAME_MAX + 17)
/* A measured profile above this multiple of the roofline's throughput is refused. */
#define SCHED_PROFILE_MAX_RATIO 20.0
#define SCHED_MAX_STAGES 4
#define SCHED_MAX_CLASSES 8
#define SCHED_MAX_TOKENS 100000000 /* a class's max_tokens bound (prompt + output) */

/* ---- GPU catalog (catalog.c) ---- */
typedef struct sched_gpu_type {
    char name[SCHED_NAME];
    double memory_gb, hbm_gbps, bf16_tflops, int8_tops;
    double nvlink_gbps; /* per-GPU NVLink bandwidth, 0 when there is none */
    int pcie_gen, pcie_lanes;
    double usd_per_hour;
    /* CPU devices ("cpu"): priced per core-hour. cores > 0 and usd_per_core_hour given in the
     * catalog set usd_per_hour = cores x usd_per_core_hour; a fleet pool may give its own
     * usd_per_core_hour. 0 for GPUs. */
    int cores;
    double usd_per_core_hour;
} sched_gpu_type;

typedef struct sched_catalog {
    sched_gpu_type *gpus;
    int n;
    json_t *aliases; /* object: alias -> canonical name (owned) */
} sched_catalog;

/* Load the catalog JSON at path (schemas/gpu-catalog.schema.json); NULL path means the
 * built-in scheduler/catalog/gpus.json (MEDLEY_SCHED_CATALOG overrides it). */
int sched_catalog_load(sched_catalog *c, const char *path, md_err *e);
int sched_catalog_from_json(sched_catalog *c, json_t *doc, const char *where, md_err *e);
void sched_catalog_free(sched_catalog *c);
/* Index of a GPU type by name or alias (case-insensitive), or -1. */
int sched_catalog_find(const sched_catalog *c, const char *name);
/* The catalog type of a GPU as its driver names it ("NVIDIA H100 80GB HBM3", "NVIDIA
 * A100-SXM4-40GB", "NVIDIA GeForce RTX 4090", "Tesla T4") with memory_gb its total memory
 * (0 = unknown): vendor words dropped, then a name or alias, else the types whose model
 * (H100, A100, L4, RTX-4090, ...) is a word of the name: the form factor first ("PCIe" in
 * the name or not), then the closest memory (1e9 bytes, as memory_gb counts it). Index, or -1 when
 * nothing matches. */
int sched_catalog_match_device(const sched_catalog *c, const char *device_name, double memory_gb);
/* Words of device_name (upper case, vendor words dropped) that catalog type t's name does
 * not account for ("NVL" for "H100 NVL" taken as H100-SXM, "TI" for "RTX 3090 Ti"): how
 * many, and the words space-separated into out (n bytes). 0: the name is that type's. */
int sched_catalog_unmatched_words(const sched_catalog *c, int t, const char *device_name, char *out,
                                  size_t n);
/* One GPU's inter-GPU bandwidth for collectives inside a host: NVLink if any, else PCIe. */
double sched_gpu_link_gbps(const sched_gpu_type *g);

/* ---- Model cards (model.c) ---- */
typedef struct sched_model {
    char name[SCHED_NAME];
    int layers, hidden, heads, kv_heads, ffn, vocab;
    int tied_embeddings;
    double bytes_per_weight; /* 2.0 BF16, 1.0625 Q8_0, 0.5625 Q4_0, 0.625 Q4_1 ... */
    double kv_bytes;         /* bytes per KV element (2 for an fp16 cache) */
    int max_context;
    /* An embedding model (docs/embeddings.md, "Scheduling and cost"): its requests are
     * prefill only (one vector per input, no token generated, no KV cache kept between
     * steps, no LM head). SCHED_EMBED_ENCODER: the BERT family (bidirectional attention,
     * a two-matrix GELU MLP, biases); SCHED_EMBED_DECODER: a decoder pooled at its last
     * token (its blocks as a generation model's). 0: a generation model. */
    int embedding;
} sched_model;
enum { SCHED_EMBED_ENCODER = 1, SCHED_EMBED_DECODER = 2 };

/* Built-in shapes for planning without a file (llama-3-8b, llama-3-70b, mistral-7b,
 * qwen2-7b, qwen2-72b, smollm2-135m; the embedding model all-minilm-l6-v2). Returns 0 or
 * MD_ENOTFOUND listing the known names. */
int sched_model_builtin(const char *name, sched_model *m, md_err *e);
/* A model card JSON (schemas/model-card.schema.json). */
int sched_model_from_json(json_t *card, sched_model *m, const char *where, md_err *e);
/* A card from a GGUF file (model_gguf.c): shape keys under general.architecture, the
 * vocabulary from token_embd, tied when there is no output.weight, bytes per weight from the
 * tensors' sizes. name NULL: general.name. */
int sched_model_from_gguf(const char *path, const char *name, sched_model *m, md_err *e);
json_t *sched_model_to_json(const sched_model *m);
double sched_model_params(const sched_model *m);       /* all weights */
double sched_model_layer_params(const sched_model *m); /* one transformer block */
double sched_model_embed_params(const sched_model *m); /* token embedding table */
double sched_model_head_params(const sched_model *m);  /* lm_head (0 when tied) */
double sched_model_kv_bytes_per_token_layer(const sched_model *m);
/* Bytes of a name for bytes_per_weight ("BF16", "Q4_1", ...), or 0 if unknown. */
double sched_quant_bytes(const char *quant);

/* ---- Fleet (catalog.c; host lists fleet_agg.c) ---- */
/* One host of an aggregated pool: its GPUs are "<name>/<first>" .. "<name>/<first+gpus-1>". */
typedef struct sched_host {
    char name[SCHED_ID]; /* the worker (or source pool) that owns the GPUs */
    int first;           /* id of its first GPU under name (8 for the 2nd host of a pool of 12) */
    int gpus;
    int at; /* index of its first GPU in the pool: hosts are contiguous, in (name, first) order */
} sched_host;

typedef struct sched_pool {
    char name[SCHED_ID]; /* GPU ids are "<name>/<k>", k in [0, count) (without hosts) */
    int type;            /* index into the catalog */
    int count;
    int gpus_per_host;   /* a TP group stays inside one host (with hosts: the largest host) */
    double memory_gb;    /* per GPU: the pool's "memory_gb" (the daemon: a CPU host's memory
                            from its heartbeat), else the catalog type's */
    double usd_per_hour; /* per GPU */
    char price_from[16]; /* where usd_per_hour comes from: "catalog", "fleet" (the fleet
                            file's prices or the pool's own), "heartbeat" (the daemon: what
                            the worker reports it costs) */
    /* NULL: hosts are runs of gpus_per_host GPUs from "<name>/0" (the last may be partial).
     * Set by sched_fleet_aggregate: GPU k of the pool is GPU k - at of the host holding it,
     * and the pool owns the array (freed by sched_fleet_free). */
    sched_host *hosts;
    int nhosts;
} sched_pool;

typedef struct sched_fleet {
    char name[SCHED_NAME];
    sched_pool *pools;
    int n;
    int rent;              /* 1: the pools are what may be rented (objective b) */
    double link_gbps;      /* between hosts (PP activations across hosts), default 12.5 */
    double link_latency_s; /* one transfer between hosts ("inter_host_latency_us"), 15e-6 */
} sched_fleet;

/* Fleet JSON (schemas/fleet.schema.json): pools of GPUs, price overrides, extra GPU types
 * (added to cat), or {"rent": {"types": [...], "max_per_type": N, "max": {type: N}}}. */
int sched_fleet_from_json(sched_fleet *f, json_t *doc, sched_catalog *cat, md_err *e);
int sched_fleet_load(sched_fleet *f, const char *path, sched_catalog *cat, md_err *e);
void sched_fleet_free(sched_fleet *f);
int sched_fleet_gpus(const sched_fleet *f);
/* A scheduler input file (catalog, fleet, workload, profiles): JSON with a key given twice
 * refused (jansson's JSON_REJECT_DUPLICATES: a duplicate used to win silently). NULL with
 * MD_EFORMAT naming path, line and column. */
json_t *sched_json_load(const char *path, md_err *e);
/* A pool (worker) name: 1..SCHED_NAME_MAX characters, no '/' (it ends a GPU id's name) and
 * no control character. 0, or MD_EINVAL naming `where`.name, the limit or the character. */
int sched_check_pool_name(const char *name, const char *where, md_err *e);
/* Merge the pools of a fixed fleet that have the same GPU type, memory, gpus_per_host and $/h into
 * one pool whose GPUs span their hosts (docs/scheduler.md §4): identical hosts are
 * interchangeable, and the MILP's size then follows the number of kinds of host, not of
 * hosts. A merged pool lists its hosts in name order; it takes the place of its first member,
 * named "<first host>..<last host>"; a pool alone in its kind is left as it is. Rental fleets
 * are left as they are. 0, or MD_ENOMEM (f unchanged). */
int sched_fleet_aggregate(sched_fleet *f, md_err *e);
/* Hosts of a pool: its host list, or runs of gpus_per_host GPUs. */
int sched_pool_nhosts(const sched_pool *p);
/* Host h of p: the pool index of its first GPU into *k0; returns its GPUs. */
int sched_pool_host(const sched_pool *p, int h, int *k0);
/* The id of GPU k of p ("<host>/<i>"). */
void sched_pool_gpu_id(const sched_pool *p, int k, char id[SCHED_ID]);
/* The pool index of GPU id in p, with its host index in *host; -1 when p has no such GPU. */
int sched_pool_find_gpu(const sched_pool *p, const char *id, int *host);

/* ---- Workload (workload.c) ---- */
typedef struct sched_class {
    char name[SCHED_NAME];
    double input_mean, output_mean; /* tokens per request */
    int max_tokens;                 /* class bound on prompt + max output tokens */
    double share;                   /* fraction of the model's requests, sums to 1 */
    double tpot_ms, ttft_ms;        /* latency SLOs ("tpot_ms", "ttft_ms"), 0: none */
} sched_class;

typedef struct sched_demand {
    sched_model model;
    double priority;   /* weight of this model's tokens in objective (a), default 1 */
    double requests;   /* backlog size (requests) */
    double rate_rps;   /* arrivals per second (0: backlog only) */
    double deadline_s; /* 0: none */
    double finish_s;   /* planned finish: the deadline, else the workload horizon */
    sched_class classes[SCHED_MAX_CLASSES];
    int nclasses;
} sched_demand;

typedef struct sched_workload {
    sched_demand *models;
    int n;
    double horizon_s; /* arrivals last this long; backlogs without a deadline are planned to
                         finish within it (default 3600) */
    unsigned seed;
    int bill_to_finish; /* 0 ("billing": "busy", default): a batch replica is paid while it
                           works; 1 ("until_deadline"): from the start until its model's
                           finish time (the deadline, else the horizon), as a rental that
                           cannot be returned early is */
} sched_workload;
/* "busy" or "until_deadline" into w->bill_to_finish; MD_EINVAL naming `where` otherwise. */
int sched_workload_billing(sched_workload *w, const char *billing, const char *where, md_err *e);

/* Workload JSON (schemas/workload.schema.json). Models are built-in names or inline cards
 * or GGUF paths ("model_file"). */
int sched_workload_from_json(sched_workload *w, json_t *doc, md_err *e);
int sched_workload_load(sched_workload *w, const char *path, md_err *e);
void sched_workload_free(sched_workload *w);
/* Mean tokens (prompt + output) per request of a demand. */
double sched_demand_tokens_per_request(const sched_demand *d);
/* Tokens/s the model must sustain to finish its backlog by finish_s (its deadline, or the
 * workload's horizon when it has none) plus its arrivals. */
double sched_demand_tokens_per_s(const sched_demand *d);

/* ---- Performance model (perf.c) ---- */
typedef struct sched_stage {
    int type;               /* catalog index */
    int pool;               /* fleet pool index (-1 when planning from the catalog) */
    int tp;                 /* GPUs in the group */
    int layer_lo, layer_hi; /* [lo, hi) */
    double memory_gb;       /* per GPU: its pool's, 0: the catalog type's */
} sched_stage;

typedef struct sched_perf_params {
    double bw_eff;               /* fraction of peak memory bandwidth reached by decode (0.75) */
    double compute_eff;          /* fraction of peak tensor FLOP/s reached by prefill (0.55) */
    double mem_util;             /* fraction of device memory for weights + KV (0.90) */
    double reserve_gb;           /* per GPU: activations, CUDA context, workspace (1.5) */
    double link_eff;             /* achieved fraction of link bandwidth (0.7) */
    double link_latency_s;       /* per collective / transfer (10e-6 NVLink, 25e-6 PCIe) */
    int max_batch;               /* engine's cap on concurrent sequences (256) */
    double inter_host_latency_s; /* one PP hop between hosts (15e-6); cand.c and sim.c use
                                    the fleet's inter_host_latency_us instead */
    double slo_tpot_s;           /* 0, or the class's TPOT SLO: the batch is cut until the interval
                                    between a sequence's tokens (a decode step plus the newcomers'
                                    prefills per step) meets it (cand.c sets it per class) */
    double slo_ttft_s;           /* 0, or the class's TTFT SLO: a prompt's prefill must meet it */
} sched_perf_params;

void sched_perf_defaults(sched_perf_params *p);

/* One replica's predicted behaviour on one request class. */
typedef struct sched_perf {
    int batch;             /* concurrent sequences (KV- and cap-bound) */
    double kv_tokens;      /* KV capacity of the replica, tokens */
    double prefill_s;      /* one request's prefill */
    double decode_step_s;  /* one decode iteration over `batch` sequences */
    double requests_per_s; /* sustained */
    double tokens_per_s;   /* (input + output) tokens per second */
    const char *bound;     /* "memory", "compute", "kv", "profile", "slo" (a TPOT SLO cut the
                              batch) */
    double scale;          /* roofline speed multiplied by this calibration (1: none); the
                              simulator divides the roofline's step times by it */
} sched_perf;

/* Measured profile (schemas/profile.schema.json). */
typedef struct sched_profile_bucket {
    int in_lo, in_hi, out_lo, out_hi;
    double in_mean, out_mean, rps;
} sched_profile_bucket;

typedef struct sched_profile {
    char device[SCHED_NAME], model[SCHED_NAME];
    int tp;
    sched_profile_bucket *buckets;
    int nbuckets;
    double batch_decode_tps[2][16]; /* [0]=batch size, [1]=decode tok/s (per-batch table) */
    int nbatches;
    double prefill_tps;
} sched_profile;

typedef struct sched_profiles {
    sched_profile *p;
    int n;
} sched_profiles;

int sched_profile_from_json(sched_profiles *ps, json_t *doc, const char *where, md_err *e);
int sched_profile_load(sched_profiles *ps, const char *path, md_err *e);
void sched_profiles_free(sched_profiles *ps);
/* The catalog type a profile was measured on: its device_type as a catalog name or alias,
 * else as the driver names the card (`medley profile` writes "A100-SXM4-80GB",
 * "H100-80GB-HBM3"; a "<N>GB" word picks the memory size). -1 when nothing matches. */
int sched_profile_type(const sched_profile *p, const sched_catalog *cat);

/* One GPU's memory in stage s of type g: the stage's (its pool's) when set, else g's. */
double sched_stage_memory_gb(const sched_gpu_type *g, const sched_stage *s);
/* Memory check for a stage: 0 when weights + reserve + KV for min_kv_tokens fit, else
 * MD_ERANGE with the numbers in e. */
int sched_stage_fits(const sched_model *m, const sched_gpu_type *g, const sched_stage *s,
                     double min_kv_tokens, const sched_perf_params *pp, md_err *e);
/* Predict a replica (stages cover layers [0, L) in order) on requests of mean prompt
 * `in` and output `out` tokens. prof may be NULL. Returns 0 or MD_ERANGE (does not fit). */
int sched_perf_replica(const sched_model *m, const sched_catalog *cat, const sched_stage *st,
                       int nstages, double inter_host_gbps, double in, double out,
                       const sched_perf_params *pp, const sched_profile *prof, sched_perf *out_p,
                       md_err *e);
/* One pipeline hop between stages on different hosts, seconds:
 * pp->inter_host_latency_s + bytes / (inter_host_gbps * 1e9 * pp->link_eff). */
double sched_perf_pp_hop(double bytes, double inter_host_gbps, const sched_perf_params *pp);
/* Roofline pieces, exposed for tests: seconds on a TP group of `tp` GPUs of type g. */
double sched_perf_decode_step(const sched_model *m, const sched_gpu_type *g, int tp, int layers,
                              int first, int last, int batch, double ctx,
                              const sched_perf_params *pp);
double sched_perf_prefill(const sched_model *m, const sched_gpu_type *g, int tp, int layers,
                          int first, int last, double prompt, const sched_perf_params *pp);

/* ---- Candidates (cand.c) ---- */
typedef struct sched_cand {
    int model; /* index into the workload */
    sched_stage stages[SCHED_MAX_STAGES];
    int nstages;
    int gpus;                           /* total */
    double usd_per_hour;                /* all its GPUs */
    sched_perf perf[SCHED_MAX_CLASSES]; /* per class of its model */
    int serves[SCHED_MAX_CLASSES];      /* 1 when the class fits (KV for its max tokens) */
    double best_tokens_per_usd;
    char label[96];  /* "2xL4 TP2" or "A100-80GB-SXM[0,20)+L4x2[20,32)" */
    char source[96]; /* "measured", "modelled", "measured+modelled", or "modelled x0.83
                        (calibrated by measured profiles on L4)" */
} sched_cand;

typedef struct sched_cands {
    sched_cand *c;
    int n, cap;
    json_t *notes; /* array of strings (owned): profiles that matched no candidate, and
                      the calibration each measured profile gave; copied into plans */
} sched_cands;

/* Candidates for every model of w over the fleet's pools (or the catalog types when
 * f->rent): TP groups inside one host; pipelines of 2..SCHED_MAX_STAGES groups of one pool
 * across its hosts when no group inside a host holds the model; pipelines of k groups of
 * one pool and a last group of another type (k + 1 <= SCHED_MAX_STAGES). Pruned:
 * dominated candidates and all but the best few mixed PP ones dropped.
 * Measured profiles (prof) replace the roofline for the (model, type, TP) they cover and
 * calibrate it elsewhere: each (model, type) with a profile gets the geometric mean of
 * measured / modelled throughput over the classes its profiles answer, and every modelled
 * candidate on that type is scaled by it (a pipeline by the smallest factor among its
 * types). A profile whose device is no catalog type is an error (MD_EINVAL); one whose
 * model is not in the workload or that no candidate uses is a note in cs->notes. */
int sched_cands_build(sched_cands *cs, const sched_workload *w, const sched_fleet *f,
                      const sched_catalog *cat, const sched_profiles *prof,
                      const sched_perf_params *pp, md_err *e);
void sched_cands_free(sched_cands *cs);
/* The DP layer split: sets layer_lo/hi of st[0..n) to minimise the slowest stage's decode
 * time under each stage's memory. Returns 0 or MD_ERANGE when no split fits. */
int sched_layer_split(const sched_model *m, const sched_catalog *cat, sched_stage *st, int n,
                      double min_kv_tokens, const sched_perf_params *pp, md_err *e);

/* ---- Placement (milp.c; packing, the proportional baseline: pack.c), plans (plan.c) ---- */
typedef struct sched_replica {
    int cand;
    char (*gpu_ids)[SCHED_ID];       /* cands.c[cand].gpus entries */
    double share[SCHED_MAX_CLASSES]; /* fraction of its work time on each class */
    double busy; /* fraction of the time it is billed (batch replicas are off when done) */
    double load; /* fraction of its capacity the plan routes to it (predicted tokens/s =
                    load x its classes' tokens/s at their shares) */
} sched_replica;

typedef struct sched_model_result {
    double demand_tps, served_tps, best_tps; /* best_tps: most achievable for the model */
    int deadline_met;
} sched_model_result;

typedef struct sched_plan {
    long long version;
    int objective; /* 0 max tokens per USD (fixed fleet), 1 least cost to deadlines (rent) */
    sched_replica *r;
    int n;
    sched_model_result *models; /* per workload model */
    int nmodels;
    char (*idle)[SCHED_ID];
    int nidle;
    double tokens_per_s, usd_per_hour; /* all replicas on */
    double busy_usd_per_hour;          /* replicas billed while they work */
    double solve_s;
    int ncands;
    json_t *notes;  /* array of strings: infeasibilities with their numbers */
    int route_even; /* 1: a load balancer deals each model's requests to its replicas in turn
                       (the "whole replicas per GPU type" baseline of bench/scheduler); 0:
                       replicas pull from shared per-class queues (medley's workers): their
                       routed classes first, any class they hold when those are empty */
    int route_pull; /* 1 (simulator only): plain work stealing, each replica takes the longest
                       queue of any class it holds, the routing ignored (bench/scheduler) */
} sched_plan;

typedef struct sched_opts {
    int only_type;       /* -1 all; else restrict to one catalog type (homogeneous plan) */
    int iterations;      /* Dinkelbach iterations cap (default 12) */
    double time_limit_s; /* per MILP solve, a safety net (default 10): a plan stopped by the
                            clock depends on the machine's speed */
    int node_limit;      /* branch-and-bound nodes per MILP solve (default 1000): the plan
                            stays the same on every run when this, not the clock, stops it */
} sched_opts;

void sched_opts_defaults(sched_opts *o);
/* Solve: objective (a) on a fixed fleet or (b) when f->rent. Impossible demands are not an
 * error: they go to plan->notes with the numbers; returns an error only when nothing can be
 * planned at all (every model too large, no GPUs), with the explanation in e. */
int sched_plan_solve(sched_plan *p, const sched_workload *w, const sched_fleet *f,
                     const sched_catalog *cat, const sched_cands *cs, const sched_opts *o,
                     md_err *e);
void sched_plan_free(sched_plan *p);
json_t *sched_plan_to_json(const sched_plan *p, const sched_workload *w, const sched_fleet *f,
                           const sched_catalog *cat, const sched_cands *cs);
/* Checks: no GPU used twice or unknown, each stage fits memory, layer splits cover each
 * layer once, TP groups inside one host. 0 or MD_EINVAL with the first violation. */
int sched_plan_validate(const sched_plan *p, const sched_workload *w, const sched_fleet *f,
                        const sched_catalog *cat, const sched_cands *cs,
                        const sched_perf_params *pp, md_err *e);
/* The plan's claims against its replicas (plan_check.c): each model's served tokens/s is
 * what its replicas give at their routing shares and load, a deadline is claimed met only
 * when the served rate covers the demand, totals add up, shares route only classes the
 * replica holds. Called by sched_plan_validate. 0 or MD_EINVAL naming the claim. */
int sched_plan_check_claims(const sched_plan *p, const sched_workload *w, const sched_cands *cs,
                            md_err *e);
/* Tokens/s replica r (of candidate c) is predicted to give: load x its classes' tokens/s at
 * its routing shares. */
double sched_replica_tokens_per_s(const sched_replica *r, const sched_cand *c, int nclasses);
void sched_plan_print_table(FILE *out, const sched_plan *p, const sched_workload *w,
                            const sched_catalog *cat, const sched_cands *cs);
int sched_plan_svg(const char *path, const sched_plan *p, const sched_workload *w,
                   const sched_cands *cs, md_err *e);

/* A plan where each model gets GPUs in proportion to its demand, every GPU in use, and
 * requests spread over replicas regardless of size (the naive baseline). */
int sched_plan_proportional(sched_plan *p, const sched_workload *w, const sched_fleet *f,
                            const sched_catalog *cat, const sched_cands *cs, md_err *e);

/* ---- Simulator (sim.c) ---- */
typedef struct sched_sim_failure {
    char gpu[SCHED_ID];
    double at_s;
} sched_sim_failure;

typedef struct sched_sim_result {
    double makespan_s, tokens, usd, tokens_per_s, usd_per_mtok, tokens_per_usd;
    long long requests_done, requests_total, requests_unserved, retried;
} sched_sim_result;

/* Run w's backlog (and arrivals) through plan p. GPUs are billed from 0 until their
 * replica has no work left (or fails). */
int sched_simulate(const sched_plan *p, const sched_workload *w, const sched_fleet *f,
                   const sched_catalog *cat, const sched_cands *cs, const sched_perf_params *pp,
                   const sched_sim_failure *fails, int nfails, sched_sim_result *r, md_err *e);

/* ---- Daemon (daemon.c) ---- */
typedef struct sched_daemon_opts {
    const char *redis_url;
    const char *prefix;   /* "medley:" */
    const char *workload; /* optional workload file for deadlines/priorities */
    double interval_s;    /* re-plan check period (5) */
    double lease_ms;      /* leadership lease (15000) */
    double reload_s;      /* cost of reloading a model on a GPU, seconds of its time (60) */
    double min_gain;      /* hysteresis: relative gain needed to re-plan (0.1) */
    int once;             /* plan one time and exit (tests) */
} sched_daemon_opts;

int sched_daemon_run(const sched_daemon_opts *o, const sched_catalog *cat, volatile int *stop,
                     md_err *e);
/* The same, keeping the daemon's Prometheus metrics (docs/operations.md, "Metrics") in reg
 * (NULL: none); the caller serves reg (common/metrics_http.h) and frees it after. */
struct md_metrics;
int sched_daemon_run_metered(const sched_daemon_opts *o, const sched_catalog *cat,
                             volatile int *stop, struct md_metrics *reg, md_err *e);

#endif
