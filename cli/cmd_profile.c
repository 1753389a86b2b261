/* cmd_profile.c — `medley profile`: measure a model's prefill and decode throughput on one
 * device over batch sizes and context lengths, and write a profile in the scheduler's
 * format (schemas/profile.schema.json, "batches" form, method "measured").
 *
 *   medley profile -m MODEL [--device auto|cpu|cpu:N|cuda:K] [--batches 1,8,32]
 *                  [--contexts 128,512] [--gen 32] [-o profile.json] [options]
 *
 * For every (context c, batch b) it submits b sequences of c synthetic prompt tokens that
 * each generate --gen tokens (greedy, EOS ignored) to one engine and runs steps until they
 * finish. The prefill phase lasts until every sequence has its first token; the rest is the
 * decode phase. One warm-up run precedes the measurements. The same code runs on CPU and
 * CUDA: it goes through the engine exactly as jobs do.
 *
 * The document holds both forms the scheduler reads:
 *  - "batches": the batch sweep at the first (smallest) context: prefill_tokens_per_s =
 *    b*c / prefill time, decode_tokens_per_s = tokens generated in the decode phase / its
 *    time, decode_step_ms = that time / its steps, context = c + gen/2 (the mean KV length
 *    while decoding). Batch sizes increase, as the scheduler requires.
 *  - "buckets": one per context, input lengths split halfway between the contexts asked
 *    for, output lengths [0, 2*gen): max_output_tokens_per_s is the best over the batch
 *    sizes of b*gen / (b*c / prefill rate + gen * decode step time), i.e. what a stream of
 *    such requests sustains with prefill included; "batch" is the b that gave it.
 *
 * An embedding model (engine/embedder.h; docs/embeddings.md, "Scheduling and cost") has no
 * decode: each point embeds b inputs of c tokens with md_embedder_run (packed into its steps
 * as the worker's embedding runner does), repeated for at least PROF_EMBED_S, after one
 * warm-up. "batches" gives prefill_tokens_per_s per batch size at the first context;
 * "buckets" per context the best max_requests_per_s (inputs/s) over the batch sizes, output
 * lengths [0, 1) (no token generated). Contexts default to 16, 64 and 256 tokens, cut to the
 * model's max_seq_length; batch sizes to 1, 16 and 64. */
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/commands.h"
#include "common/util.h"
#include "engine/embedder.h"
#include "engine/engine.h"
#include "engine/weights/registry.h"
#include "engine/weights/synth.h"
#include "kernels/backend.h"

#define MAX_POINTS 16
#define PROF_EMBED_S 0.3 /* an embedding point is repeated at least this long */

typedef struct {
    const char *model, *device, *out, *model_name, *device_type, *bf16_weights;
    int batches[MAX_POINTS], n_batches;
    int contexts[MAX_POINTS], n_contexts;
    int gen, n_threads, batch_tokens;
    long kv_mb;
    int batches_given, contexts_given; /* else an embedding model takes its own defaults */
} prof_opts;

static void usage(FILE *f) {
    fprintf(f,
            "usage: medley profile -m MODEL [options]\n"
            "  -m, --model NAME|PATH   registered model name, GGUF file or HF directory\n"
            "      --device D          auto (default; cuda:0 if a GPU is usable, else cpu),\n"
            "                          cpu, cpu:N, cuda:K\n"
            "      --batches LIST      concurrent sequences, comma-separated (default 1,4,16)\n"
            "      --contexts LIST     prompt tokens per sequence (default 128,512)\n"
            "      --gen N             tokens generated per sequence (default 32, >= 2)\n"
            "  -o, --output FILE       profile JSON (default stdout)\n"
            "      --model-name NAME   model name in the profile (default: the registry name or "
            "file name)\n"
            "      --device-type TYPE  GPU type as in the GPU catalog (default: from the device "
            "name; CPU on cpu)\n"
            "      --batch-tokens N    tokens per engine step (default 2048)\n"
            "      --kv-mb N           KV cache budget (default: what the largest point needs)\n"
            "      --bf16-weights M    GPU: BF16 copies of quantized weights for batched steps:\n"
            "                          auto (default), on, off (as the worker will run)\n"
            "  -t, --threads N         CPU threads (default: every core)\n");
}

/* "1,4,16" -> ints in [1, max]. */
static int parse_list(const char *s, int *out, int *n, int max, const char *what) {
    *n = 0;
    while (*s) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 1 || v > max || *n == MAX_POINTS || (*end && *end != ',')) {
            fprintf(stderr,
                    "medley profile: --%s wants up to %d comma-separated integers in "
                    "1..%d, got \"%s\"\n",
                    what, MAX_POINTS, max, s);
            return -1;
        }
        out[(*n)++] = (int)v;
        s = *end ? end + 1 : end;
    }
    return *n ? 0 : -1;
}

static void sort_unique(int *v, int *n) {
    for (int i = 1; i < *n; i++)
        for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
            int t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    int m = 0;
    for (int i = 0; i < *n; i++)
        if (m == 0 || v[i] != v[m - 1])
            v[m++] = v[i];
    *n = m;
}

static int parse_args(int argc, char **argv, prof_opts *o) {
    enum { O_DEVICE = 256, O_BATCHES, O_CONTEXTS, O_GEN, O_NAME, O_TYPE, O_BT, O_KV, O_BF16W };
    static const struct option lo[] = {{"model", required_argument, 0, 'm'},
                                       {"device", required_argument, 0, O_DEVICE},
                                       {"batches", required_argument, 0, O_BATCHES},
                                       {"contexts", required_argument, 0, O_CONTEXTS},
                                       {"gen", required_argument, 0, O_GEN},
                                       {"output", required_argument, 0, 'o'},
                                       {"model-name", required_argument, 0, O_NAME},
                                       {"device-type", required_argument, 0, O_TYPE},
                                       {"batch-tokens", required_argument, 0, O_BT},
                                       {"kv-mb", required_argument, 0, O_KV},
                                       {"bf16-weights", required_argument, 0, O_BF16W},
                                       {"threads", required_argument, 0, 't'},
                                       {"help", no_argument, 0, 'h'},
                                       {0, 0, 0, 0}};
    memset(o, 0, sizeof *o);
    o->device = "auto";
    o->gen = 32;
    o->batch_tokens = 2048;
    o->batches[0] = 1, o->batches[1] = 4, o->batches[2] = 16, o->n_batches = 3;
    o->contexts[0] = 128, o->contexts[1] = 512, o->n_contexts = 2;
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "m:o:t:h", lo, NULL)) != -1) {
        switch (c) {
        case 'm': o->model = optarg; break;
        case 'o': o->out = optarg; break;
        case 't': o->n_threads = atoi(optarg); break;
        case O_DEVICE: o->device = optarg; break;
        case O_BF16W: o->bf16_weights = optarg; break;
        case O_BATCHES:
            if (parse_list(optarg, o->batches, &o->n_batches, 4096, "batches"))
                return 2;
            o->batches_given = 1;
            break;
        case O_CONTEXTS:
            if (parse_list(optarg, o->contexts, &o->n_contexts, 1 << 20, "contexts"))
                return 2;
            o->contexts_given = 1;
            break;
        case O_GEN: o->gen = atoi(optarg); break;
        case O_NAME: o->model_name = optarg; break;
        case O_TYPE: o->device_type = optarg; break;
        case O_BT: o->batch_tokens = atoi(optarg); break;
        case O_KV: o->kv_mb = atol(optarg); break;
        case 'h': usage(stdout); exit(0);
        default: usage(stderr); return 2;
        }
    }
    sort_unique(o->batches, &o->n_batches);
    sort_unique(o->contexts, &o->n_contexts);
    if (!o->model || optind < argc) {
        usage(stderr);
        return 2;
    }
    if (o->gen < 2 || o->gen > 1 << 16 || o->batch_tokens < 1 || o->n_threads < 0 || o->kv_mb < 0) {
        fprintf(stderr, "medley profile: --gen must be >= 2; --batch-tokens, --threads, --kv-mb "
                        "positive\n");
        return 2;
    }
    return 0;
}

typedef struct {
    double prefill_tps, decode_tps, decode_step_ms;
} point;

/* One measurement: b sequences of c prompt tokens, gen tokens each. */
static int measure(md_engine *eng, int b, int c, int gen, point *pt, md_err *e) {
    int vocab = md_engine_n_vocab(eng);
    int32_t *prompt = malloc((size_t)c * sizeof *prompt);
    uint64_t *ids = malloc((size_t)b * sizeof *ids);
    char *started = calloc((size_t)b, 1);
    if (!prompt || !ids || !started) {
        free(prompt);
        free(ids);
        free(started);
        return md_errf(e, MD_ENOMEM, "out of memory");
    }
    md_sampling s;
    md_sampling_default(&s);
    s.temperature = 0;
    s.max_tokens = gen;
    s.ignore_eos = 1;
    int rc = 0, n_sub = 0;
    uint64_t rng = 0x243F6A8885A308D3ull;
    for (int i = 0; i < b && !rc; i++) {
        /* distinct prompts, so no prefix is shared: ids from the middle of the vocabulary */
        for (int t = 0; t < c; t++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            prompt[t] = (int32_t)(vocab / 8 + (rng >> 33) % (uint64_t)(vocab / 2));
        }
        rc = md_engine_submit(eng, prompt, c, &s, &ids[i], e);
        n_sub += !rc;
    }
    uint64_t t0 = md_mono_ns(), t_prefill = 0;
    int n_started = 0;
    long dec_tokens = 0, dec_steps = 0;
    md_step_result res;
    while (!rc) {
        if ((rc = md_engine_step(eng, &res, e)))
            break;
        int in_decode = t_prefill != 0;
        for (int i = 0; i < res.n_tokens; i++) {
            int k = 0;
            while (k < b && ids[k] != res.tokens[i].seq_id)
                k++;
            if (k < b && !started[k]) {
                started[k] = 1;
                n_started++;
            } else if (in_decode) {
                dec_tokens++;
            }
        }
        if (in_decode)
            dec_steps++;
        if (!in_decode && n_started == b)
            t_prefill = md_mono_ns();
        if (res.n_live == 0)
            break;
    }
    uint64_t t1 = md_mono_ns();
    for (int i = 0; i < n_sub; i++)
        md_engine_release(eng, ids[i]);
    if (!rc) {
        double tp = (t_prefill - t0) / 1e9, td = (t1 - t_prefill) / 1e9;
        pt->prefill_tps = (double)b * c / tp;
        pt->decode_tps = dec_steps ? dec_tokens / td : 0;
        pt->decode_step_ms = dec_steps ? td * 1e3 / dec_steps : 0;
    }
    free(prompt);
    free(ids);
    free(started);
    return rc;
}

/* "NVIDIA H200" -> "H200"; spaces become '-'. */
static void device_type(const prof_opts *o, char *out, size_t n) {
    if (o->device_type) {
        snprintf(out, n, "%s", o->device_type);
        return;
    }
    snprintf(out, n, "CPU");
    md_device_id id;
    md_device_info d;
    md_err e = {0};
    if (md_device_parse(o->device, &id, &e) == 0 && id.kind == MD_DEVICE_CUDA &&
        md_device_get(id.index, &d, &e) == 0) {
        const char *nm = strncmp(d.name, "NVIDIA ", 7) ? d.name : d.name + 7;
        snprintf(out, n, "%s", nm);
        for (char *p = out; *p; p++)
            if (*p == ' ')
                *p = '-';
    }
}

/* The engine sized for the largest point (KV for every sequence at full length): an exit
 * code (0 with *eng open, *n_ctx its context, mf the model's facts). */
static int open_engine(const prof_opts *o, const char *path, md_model_facts *mf, int *n_ctx,
                       md_engine **eng) {
    md_err e = {0};
    if (md_engine_model_facts(path, mf, &e)) {
        fprintf(stderr, "medley profile: %s\n", e.msg);
        return 1;
    }
    int max_b = 1, max_c = 1;
    for (int i = 0; i < o->n_batches; i++)
        max_b = o->batches[i] > max_b ? o->batches[i] : max_b;
    for (int i = 0; i < o->n_contexts; i++)
        max_c = o->contexts[i] > max_c ? o->contexts[i] : max_c;
    *n_ctx = max_c + o->gen + 16;
    if (mf->n_ctx_train > 0 && *n_ctx > mf->n_ctx_train) {
        fprintf(stderr, "medley profile: context %d + %d generated exceeds the model's %d\n", max_c,
                o->gen, mf->n_ctx_train);
        return 2;
    }
    size_t kv = o->kv_mb ? (size_t)o->kv_mb << 20
                         : (size_t)max_b * (*n_ctx + 16) * mf->kv_bytes_per_token_f32 * 5 / 4;
    md_engine_config cfg = {.model_path = path,
                            .device = o->device,
                            .n_threads = o->n_threads,
                            .max_seqs = max_b,
                            .max_batch_tokens = o->batch_tokens,
                            .kv_budget_bytes = kv,
                            .n_ctx = *n_ctx,
                            .bf16_weights = o->bf16_weights};
    uint64_t t_open = md_mono_ns();
    if (md_engine_open(&cfg, eng, &e)) {
        fprintf(stderr, "medley profile: %s\n", e.msg);
        return 1;
    }
    fprintf(stderr, "medley profile: %s on %s loaded in %.1f s\n", o->model, o->device,
            (md_mono_ns() - t_open) / 1e9);
    return 0;
}

/* A warm-up, then every (context, batch) point into pts: 0, or 1 (said on stderr). */
static int measure_grid(md_engine *eng, const prof_opts *o, point (*pts)[MAX_POINTS]) {
    md_err e = {0};
    point warm;
    if (measure(eng, 1, o->contexts[0], 2, &warm, &e)) {
        fprintf(stderr, "medley profile: warm-up: %s\n", e.msg);
        return 1;
    }
    for (int ci = 0; ci < o->n_contexts; ci++)
        for (int bi = 0; bi < o->n_batches; bi++) {
            point *pt = &pts[ci][bi];
            int b = o->batches[bi], c = o->contexts[ci];
            if (measure(eng, b, c, o->gen, pt, &e)) {
                fprintf(stderr, "medley profile: batch %d, context %d: %s\n", b, c, e.msg);
                return 1;
            }
            fprintf(stderr,
                    "  batch %4d  context %6d: prefill %10.1f tok/s, decode %9.1f tok/s "
                    "(%.2f ms/step)\n",
                    b, c, pt->prefill_tps, pt->decode_tps, pt->decode_step_ms);
        }
    return 0;
}

/* The profile's "batches": each batch size at the first context. */
static json_t *batches_json(const prof_opts *o, point (*pts)[MAX_POINTS]) {
    json_t *batches = json_array();
    for (int bi = 0; bi < o->n_batches; bi++) {
        const point *pt = &pts[0][bi];
        json_array_append_new(
            batches,
            json_pack("{s:i, s:i, s:f, s:f, s:f}", "batch", o->batches[bi], "context",
                      o->contexts[0] + o->gen / 2, "prefill_tokens_per_s", pt->prefill_tps,
                      "decode_tokens_per_s", pt->decode_tps, "decode_step_ms", pt->decode_step_ms));
    }
    return batches;
}

/* The profile's "buckets": per context, the batch size that generates fastest. */
static json_t *buckets_json(const prof_opts *o, point (*pts)[MAX_POINTS]) {
    json_t *buckets = json_array();
    for (int ci = 0; ci < o->n_contexts; ci++) {
        int c = o->contexts[ci], best_b = 0;
        double best = 0, best_total = 0;
        for (int bi = 0; bi < o->n_batches; bi++) {
            const point *pt = &pts[ci][bi];
            int b = o->batches[bi];
            double t = (double)b * c / pt->prefill_tps + o->gen * pt->decode_step_ms / 1e3;
            if (t > 0 && b * (double)o->gen / t > best) {
                best = b * (double)o->gen / t;
                best_total = b * (double)(c + o->gen) / t;
                best_b = b;
            }
        }
        if (best_b == 0)
            continue;
        int lo = ci == 0 ? 0 : (o->contexts[ci - 1] + c) / 2;
        int hi = ci + 1 < o->n_contexts ? (c + o->contexts[ci + 1]) / 2 : 2 * c;
        json_array_append_new(buckets,
                              json_pack("{s:i, s:i, s:i, s:i, s:f, s:f, s:f, s:f, s:i}", "input_lo",
                                        lo, "input_hi", hi, "output_lo", 0, "output_hi", 2 * o->gen,
                                        "input_mean", (double)c, "output_mean", (double)o->gen,
                                        "max_output_tokens_per_s", best, "max_total_tokens_per_s",
                                        best_total, "batch", best_b));
    }
    return buckets;
}

/* The model's name in the profile: --name, else the synthetic shape, the registered name or
 * the file's name (shape: room for the first). */
static const char *profile_model_name(const prof_opts *o, char *shape, size_t n) {
    if (o->model_name)
        return o->model_name;
    if (md_synth_is(o->model)) { /* "synthetic:llama-3-8b:q4_0" profiles llama-3-8b */
        snprintf(shape, n, "%s", o->model + strlen(MD_SYNTH_PREFIX));
        char *colon = strchr(shape, ':');
        if (colon)
            *colon = 0;
        return shape;
    }
    const char *slash = strrchr(o->model, '/');
    return md_registry_find(o->model) ? o->model : slash ? slash + 1 : o->model;
}

/* The profile document (schemas/profile.schema.json); steals batches and buckets. quant: the
 * weights' format, NULL when not known (left out). */
static json_t *profile_doc(const prof_opts *o, const char *quant, int n_ctx, json_t *batches,
                           json_t *buckets) {
    char dtype[256], host[256] = "", date[64];
    device_type(o, dtype, sizeof dtype);
    gethostname(host, sizeof host - 1);
    time_t now = time(NULL);
    struct tm tmv;
    gmtime_r(&now, &tmv);
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", &tmv);
    char shape[128];
    const char *name = profile_model_name(o, shape, sizeof shape);
    char tool[64];
    snprintf(tool, sizeof tool, "medley profile 0.1 (%s)",
             strncmp(o->device, "cuda", 4) ? "cpu" : "cuda");
    json_t *doc = json_pack(
        "{s:i, s:s, s:s, s:i, s:i, s:s, s:s?, s:s, s:s, s:s, s:s, s:i, s:o, s:o}", "version", 1,
        "kind", "medley.profile", "device_type", dtype, "device_count", 1, "tp", 1, "model", name,
        "quant", quant, "date", date, "method", "measured", "tool", tool, "host", host,
        "max_context", n_ctx, "batches", batches, "buckets", buckets);
    if (doc && !quant)
        json_object_del(doc, "quant");
    return doc;
}

/* Write doc (stolen) to -o or stdout: an exit code. */
static int write_doc(const prof_opts *o, json_t *doc) {
    int out_rc = 0;
    if (!doc) {
        fprintf(stderr, "medley profile: out of memory\n");
        return 1;
    }
    if (o->out) {
        if (json_dump_file(doc, o->out, JSON_INDENT(2)) != 0) {
            fprintf(stderr, "medley profile: cannot write %s\n", o->out);
            out_rc = 1;
        } else {
            fprintf(stderr, "medley profile: wrote %s\n", o->out);
        }
    } else {
        json_dumpf(doc, stdout, JSON_INDENT(2));
        fputc('\n', stdout);
    }
    json_decref(doc);
    return out_rc;
}

/* ---- embedding models ---- */

/* b inputs of c tokens each (ids from the middle of the vocabulary, distinct), embedded over
 * and over for at least PROF_EMBED_S: tokens/s into *tps. */
static int embed_point(md_embedder *m, int b, int c, double *tps, md_err *e) {
    int V = md_embedder_n_vocab(m), dim = md_embedder_dim(m), rc = 0;
    int32_t *ids = malloc((size_t)b * c * sizeof *ids);
    const int32_t **rows = malloc((size_t)b * sizeof *rows);
    int *lens = malloc((size_t)b * sizeof *lens);
    float *out = malloc((size_t)b * dim * sizeof *out);
    if (!ids || !rows || !lens || !out)
        rc = md_errf(e, MD_ENOMEM, "out of memory for %d inputs of %d tokens", b, c);
    uint64_t rng = 0x243F6A8885A308D3ull;
    for (int i = 0; !rc && i < b; i++) {
        for (int t = 0; t < c; t++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            ids[(size_t)i * c + t] =
                (int32_t)(V / 8 + (rng >> 33) % (uint64_t)(V / 2 > 0 ? V / 2 : 1));
        }
        rows[i] = ids + (size_t)i * c;
        lens[i] = c;
    }
    uint64_t t0 = md_mono_ns();
    long reps = 0;
    while (!rc && (reps == 0 || (md_mono_ns() - t0) / 1e9 < PROF_EMBED_S)) {
        rc = md_embedder_run(m, rows, lens, b, out, e);
        reps++;
    }
    if (!rc)
        *tps = (double)reps * b * c / ((md_mono_ns() - t0) / 1e9);
    free(ids);
    free(rows);
    free(lens);
    free(out);
    return rc;
}

/* `medley profile` of an embedding model: every (context, batch) point, then the document. */
static int profile_embed(prof_opts *o, const char *path) {
    md_err e = {0};
    md_embedder *m = NULL;
    md_embedder_opts eo = {o->device, o->n_threads, 0};
    uint64_t t_open = md_mono_ns();
    if (md_embedder_open(path, &eo, &m, &e)) {
        fprintf(stderr, "medley profile: %s\n", e.msg);
        return 1;
    }
    fprintf(stderr, "medley profile: embedding model %s on %s loaded in %.1f s\n", o->model,
            md_embedder_device(m), (md_mono_ns() - t_open) / 1e9);
    int max = md_embedder_max_len(m);
    if (!o->contexts_given) {
        static const int dc[] = {16, 64, 256};
        o->n_contexts = 0;
        for (int i = 0; i < 3; i++)
            o->contexts[o->n_contexts++] = dc[i] < max ? dc[i] : max;
        sort_unique(o->contexts, &o->n_contexts);
    }
    if (!o->batches_given)
        o->batches[0] = 1, o->batches[1] = 16, o->batches[2] = 64, o->n_batches = 3;
    if (o->contexts[o->n_contexts - 1] > max) {
        fprintf(stderr,
                "medley profile: --contexts %d: this model embeds at most %d tokens an "
                "input (max_seq_length)\n",
                o->contexts[o->n_contexts - 1], max);
        md_embedder_close(m);
        return 2;
    }
    static double tps[MAX_POINTS][MAX_POINTS];
    int rc = embed_point(m, 1, o->contexts[0], &tps[0][0], &e); /* warm-up */
    for (int ci = 0; !rc && ci < o->n_contexts; ci++)
        for (int bi = 0; !rc && bi < o->n_batches; bi++) {
            if ((rc = embed_point(m, o->batches[bi], o->contexts[ci], &tps[ci][bi], &e)))
                break;
            fprintf(stderr, "  batch %4d  context %6d: prefill %10.1f tok/s (%.1f inputs/s)\n",
                    o->batches[bi], o->contexts[ci], tps[ci][bi], tps[ci][bi] / o->contexts[ci]);
        }
    md_embedder_close(m);
    if (rc) {
        fprintf(stderr, "medley profile: %s\n", e.msg);
        return 1;
    }
    json_t *batches = json_array(), *buckets = json_array();
    for (int bi = 0; bi < o->n_batches; bi++)
        json_array_append_new(batches,
                              json_pack("{s:i, s:i, s:f}", "batch", o->batches[bi], "context",
                                        o->contexts[0], "prefill_tokens_per_s", tps[0][bi]));
    for (int ci = 0; ci < o->n_contexts; ci++) {
        int c = o->contexts[ci], best_b = 0;
        double best = 0;
        for (int bi = 0; bi < o->n_batches; bi++)
            if (tps[ci][bi] > best)
                best = tps[ci][bi], best_b = o->batches[bi];
        int lo = ci == 0 ? 1 : (o->contexts[ci - 1] + c) / 2;
        int hi = ci + 1 < o->n_contexts ? (c + o->contexts[ci + 1]) / 2 : max + 1;
        json_array_append_new(buckets,
                              json_pack("{s:i, s:i, s:i, s:i, s:f, s:f, s:f, s:i}", "input_lo", lo,
                                        "input_hi", hi, "output_lo", 0, "output_hi", 1,
                                        "input_mean", (double)c, "max_requests_per_s", best / c,
                                        "max_total_tokens_per_s", best, "batch", best_b));
    }
    return write_doc(o, profile_doc(o, NULL, max, batches, buckets)); /* no quant: not known */
}

int cmd_profile(int argc, char **argv) {
    prof_opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc)
        return rc;
    char path[4096], device[32];
    md_err e = {0};
    if (md_model_resolve(o.model, 1, path, sizeof path, &e) ||
        md_backend_resolve(o.device, device, sizeof device, &e)) {
        fprintf(stderr, "medley profile: %s\n", e.msg);
        return 1;
    }
    o.device = device;
    if (md_embedder_probe(path))
        return profile_embed(&o, path);
    md_model_facts mf;
    int n_ctx;
    md_engine *eng = NULL;
    if ((rc = open_engine(&o, path, &mf, &n_ctx, &eng)))
        return rc;
    static point pts[MAX_POINTS][MAX_POINTS];
    if (measure_grid(eng, &o, pts)) {
        md_engine_close(eng);
        return 1;
    }
    json_t *batches = batches_json(&o, pts), *buckets = buckets_json(&o, pts);
    md_engine_close(eng);
    return write_doc(&o, profile_doc(&o, mf.weight_type, n_ctx, batches, buckets));
}
