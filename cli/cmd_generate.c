/* cmd_generate.c — `medley generate`: run prompts through the engine on this machine.
 *
 *   medley generate -m MODEL (-p PROMPT | --chat MSG [--system SYS]) [options]
 *       streams the completion to stdout; with --json prints one object instead:
 *       {"tokens": [...], "text": "...", "prompt_tokens": N, "finish_reason": "...",
 *        "timings": {...}}, and with --logprobs "logprobs": [...], one per token; with
 *       --top-logprobs N also "top_logprobs": [[{"id", "bytes", "logprob"}, ...], ...], each
 *       token's N most likely tokens (raw logits, most likely first)
 *   medley generate -m MODEL --batch FILE.jsonl [-o OUT.jsonl] [options]
 *       runs every line through one engine (continuous batching), writes one result line per
 *       request and reports throughput and latency on stderr. A line (or --logprobs /
 *       --top-logprobs for every line) asking for logprobs gets "tokens", "logprobs" and, with
 *       top_logprobs, "top_logprobs" in its result, as --json prints them.
 *
 * MODEL is a registry name or a path (md_model_resolve with allow_path). */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cmd_generate.h"
#include "cli/commands.h"
#include "common/log.h"
#include "common/util.h"
#include "engine/engine.h"
#include "engine/shard/pipeline.h"
#include "engine/weights/registry.h"
#include "engine/tokenizer/tokenizer.h"
#include "kernels/backend.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: medley generate -m MODEL (-p PROMPT | --chat MSG | --batch FILE.jsonl) "
            "[options]\n"
            "  -m, --model NAME|PATH   registered model name, GGUF file or HF directory\n"
            "  -p, --prompt TEXT       raw prompt (special tokens such as <|im_start|> parsed)\n"
            "      --chat MSG          user message, rendered with the model's chat template\n"
            "      --system TEXT       system message for --chat\n"
            "      --batch FILE        JSONL: {\"prompt\": TEXT or [token ids]} or\n"
            "                          {\"messages\": [...]}, optional\n"
            "                          max_tokens, temperature, top_p, top_k, min_p, seed, stop,\n"
            "                          presence/frequency/repetition_penalty, logprobs (true or\n"
            "                          N top), top_logprobs, custom_id; OpenAI Batch lines\n"
            "                          ({\"body\": {...}}) too\n"
            "  -o, --output FILE       --batch results (default stdout)\n"
            "  -n, --max-tokens N      tokens to generate (default 256; 0 = up to the context)\n"
            "      --temp T            temperature (default 0 = greedy)\n"
            "      --top-p P --top-k K --min-p P\n"
            "      --repeat-penalty R --presence-penalty P --frequency-penalty F\n"
            "      --seed S            random seed (default 0)\n"
            "      --stop STR          stop string (repeatable, up to %d)\n"
            "      --ignore-eos        keep generating after end-of-generation tokens\n"
            "      --logprobs          with --json or --batch: each generated token's logprob\n"
            "                          (raw logits)\n"
            "      --top-logprobs N    with --json or --batch: also each token's N most likely\n"
            "                          tokens\n"
            "                          (0..%d; implies --logprobs)\n"
            "      --json              one JSON object instead of streamed text\n"
            "  -t, --threads N         CPU threads (default: every core)\n"
            "      --device D          auto (default; cuda:0 if a GPU is usable, else cpu),\n"
            "                          cpu, cpu:N, cpu-exact, cuda:K, cuda-exact:K (the\n"
            "                          exact ones: F32 weights and activations, the\n"
            "                          reference)\n"
            "      --ctx N             context limit per sequence (default: the model's)\n"
            "      --kv-type T         KV cache f16 (default on cpu and cuda) or f32 (the\n"
            "                          reference precision; twice the memory)\n"
            "      --bf16-weights M    GPU: also keep quantized weights as BF16 for batched\n"
            "                          steps: auto (default: when weights and copies take\n"
            "                          at most half the free memory), on, off\n"
            "      --chat-template T   render --chat/--messages with this template instead of\n"
            "                          the model's: chatml, hermes, llama3, llama3-json,\n"
            "                          llama2, mistral, gemma, or none (raw prompts only)\n"
            "      --max-seqs N        sequences per step (default 64 on cpu, 256 on cuda)\n"
            "      --batch-tokens N    tokens per step (default 512 on cpu, 2048 on cuda)\n"
            "      --prefill-chunk N   most prompt tokens of one sequence per step (default:\n"
            "                          the step's budget); decodes run in the same steps\n"
            "      --kv-mb N           KV cache budget in MiB (default: min(needed, 1024))\n"
            "      --stages SPEC       run the model as pipeline stages: a comma list of\n"
            "                          [tcp://HOST:PORT/]DEVICE:LO-HI (layers LO to HI), e.g.\n"
            "                          cpu:0-11,tcp://127.0.0.1:7701/cpu:12-29 (docs/sharding.md)\n"
            "      --tp N              tensor parallelism over N ranks in each local stage\n"
            "      --devices D0,D1,... with --tp and no --stages: the ranks' devices (e.g.\n"
            "                          --devices cuda:0,cuda:1 --tp 2); default: all on --device\n"
            "      --mem-cap SIZE      refuse a local stage whose weights + KV cache exceed\n"
            "                          SIZE (e.g. 512M)\n"
            "      --microbatches N    micro-batches per step through the stages (default:\n"
            "                          eight per stage)\n"
            "      --stage-secret-file FILE  the remote stages' secret (default\n"
            "                          $MEDLEY_STAGE_SECRET_FILE; docs/sharding.md)\n"
            "      --stage-timeout-ms MS  a remote stage's answer to a step (default 60000)\n"
            "      --stage-load-timeout-ms MS  a remote stage's READY while it loads\n"
            "                          (default 60000)\n",
            MAX_STOP, MD_TOP_LOGPROBS);
}

static int parse_int(const char *s, const char *what, long lo, long hi, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "medley generate: %s must be an integer in [%ld, %ld], got \"%s\"\n", what,
                lo, hi, s);
        return -1;
    }
    *out = (int)v;
    return 0;
}

static int parse_float(const char *s, const char *what, float *out) {
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (errno || end == s || *end) {
        fprintf(stderr, "medley generate: %s must be a number, got \"%s\"\n", what, s);
        return -1;
    }
    *out = v;
    return 0;
}

/* Long options without a short form (getopt_long values past any character). */
enum {
    O_CHAT = 256,
    O_SYSTEM,
    O_BATCH,
    O_TEMP,
    O_TOPP,
    O_TOPK,
    O_MINP,
    O_REP,
    O_PRES,
    O_FREQ,
    O_SEED,
    O_STOP,
    O_IGNORE_EOS,
    O_JSON,
    O_DEVICE,
    O_CTX,
    O_MAXSEQS,
    O_PCHUNK,
    O_BTOK,
    O_KVMB,
    O_KVTYPE,
    O_BF16W,
    O_CHAT_TMPL,
    O_LOGPROBS,
    O_TOP_LOGPROBS,
    O_STAGES,
    O_TP,
    O_MEMCAP,
    O_MICRO,
    O_DEVICES,
    O_STAGE_SECRET,
    O_STAGE_TIMEOUT,
    O_STAGE_LOAD_TIMEOUT,
};

static const struct option gen_options[] = {
    {"model", required_argument, 0, 'm'},
    {"prompt", required_argument, 0, 'p'},
    {"chat", required_argument, 0, O_CHAT},
    {"system", required_argument, 0, O_SYSTEM},
    {"batch", required_argument, 0, O_BATCH},
    {"output", required_argument, 0, 'o'},
    {"max-tokens", required_argument, 0, 'n'},
    {"temp", required_argument, 0, O_TEMP},
    {"temperature", required_argument, 0, O_TEMP},
    {"top-p", required_argument, 0, O_TOPP},
    {"top-k", required_argument, 0, O_TOPK},
    {"min-p", required_argument, 0, O_MINP},
    {"repeat-penalty", required_argument, 0, O_REP},
    {"presence-penalty", required_argument, 0, O_PRES},
    {"frequency-penalty", required_argument, 0, O_FREQ},
    {"seed", required_argument, 0, O_SEED},
    {"stop", required_argument, 0, O_STOP},
    {"ignore-eos", no_argument, 0, O_IGNORE_EOS},
    {"logprobs", no_argument, 0, O_LOGPROBS},
    {"top-logprobs", required_argument, 0, O_TOP_LOGPROBS},
    {"json", no_argument, 0, O_JSON},
    {"threads", required_argument, 0, 't'},
    {"device", required_argument, 0, O_DEVICE},
    {"ctx", required_argument, 0, O_CTX},
    {"max-seqs", required_argument, 0, O_MAXSEQS},
    {"prefill-chunk", required_argument, 0, O_PCHUNK},
    {"batch-tokens", required_argument, 0, O_BTOK},
    {"kv-mb", required_argument, 0, O_KVMB},
    {"kv-type", required_argument, 0, O_KVTYPE},
    {"bf16-weights", required_argument, 0, O_BF16W},
    {"chat-template", required_argument, 0, O_CHAT_TMPL},
    {"stages", required_argument, 0, O_STAGES},
    {"tp", required_argument, 0, O_TP},
    {"devices", required_argument, 0, O_DEVICES},
    {"mem-cap", required_argument, 0, O_MEMCAP},
    {"microbatches", required_argument, 0, O_MICRO},
    {"stage-secret-file", required_argument, 0, O_STAGE_SECRET},
    {"stage-timeout-ms", required_argument, 0, O_STAGE_TIMEOUT},
    {"stage-load-timeout-ms", required_argument, 0, O_STAGE_LOAD_TIMEOUT},
    {"help", no_argument, 0, 'h'},
    {0, 0, 0, 0},
};

/* One sampling option (-n, --temp ... --top-logprobs): 0 read, -1 a bad value (said on
 * stderr), 1 not a sampling option. */
static int sampling_opt(int c, gen_opts *o) {
    switch (c) {
    case 'n': return parse_int(optarg, "--max-tokens", 0, INT_MAX, &o->s.max_tokens);
    case O_TEMP: return parse_float(optarg, "--temp", &o->s.temperature);
    case O_TOPP: return parse_float(optarg, "--top-p", &o->s.top_p);
    case O_TOPK: return parse_int(optarg, "--top-k", 0, INT_MAX, &o->s.top_k);
    case O_MINP: return parse_float(optarg, "--min-p", &o->s.min_p);
    case O_REP: return parse_float(optarg, "--repeat-penalty", &o->s.repetition_penalty);
    case O_PRES: return parse_float(optarg, "--presence-penalty", &o->s.presence_penalty);
    case O_FREQ: return parse_float(optarg, "--frequency-penalty", &o->s.frequency_penalty);
    case O_SEED: {
        char *end;
        errno = 0;
        o->s.seed = strtoull(optarg, &end, 10);
        if (errno || end == optarg || *end) {
            fprintf(stderr, "medley generate: --seed must be an unsigned integer\n");
            return -1;
        }
        return 0;
    }
    case O_STOP:
        if (o->n_stop == MAX_STOP) {
            fprintf(stderr, "medley generate: at most %d --stop strings\n", MAX_STOP);
            return -1;
        }
        o->stop[o->n_stop++] = optarg;
        return 0;
    case O_IGNORE_EOS: o->s.ignore_eos = 1; return 0;
    case O_LOGPROBS: o->s.logprobs = 1; return 0;
    case O_TOP_LOGPROBS: {
        int rc = parse_int(optarg, "--top-logprobs", 0, MD_TOP_LOGPROBS, &o->s.top_logprobs);
        o->s.logprobs |= o->s.top_logprobs > 0;
        return rc;
    }
    default: return 1;
    }
}

/* One engine option (-t, --device ... --microbatches): as sampling_opt. */
static int engine_opt(int c, gen_opts *o) {
    switch (c) {
    case 't': return parse_int(optarg, "--threads", 1, 1024, &o->n_threads);
    case O_DEVICE: o->device = optarg; return 0;
    case O_CTX: return parse_int(optarg, "--ctx", 1, 1 << 24, &o->n_ctx);
    case O_MAXSEQS: return parse_int(optarg, "--max-seqs", 1, 4096, &o->max_seqs);
    case O_BTOK: return parse_int(optarg, "--batch-tokens", 1, 1 << 16, &o->batch_tokens);
    case O_PCHUNK: return parse_int(optarg, "--prefill-chunk", 1, 1 << 16, &o->prefill_chunk);
    case O_KVMB: return parse_int(optarg, "--kv-mb", 1, 1 << 24, &o->kv_mb);
    case O_KVTYPE: o->kv_type = optarg; return 0;
    case O_BF16W: o->bf16_weights = optarg; return 0;
    case O_CHAT_TMPL: o->chat_template = optarg; return 0;
    case O_STAGES: o->stages = optarg; return 0;
    case O_DEVICES: o->devices = optarg; return 0;
    case O_TP: return parse_int(optarg, "--tp", 1, 8, &o->tp);
    case O_MICRO: return parse_int(optarg, "--microbatches", 1, 64, &o->microbatches);
    case O_STAGE_SECRET: o->stage_secret_file = optarg; return 0;
    case O_STAGE_TIMEOUT:
        return parse_int(optarg, "--stage-timeout-ms", 1, 86400000, &o->stage_timeout_ms);
    case O_STAGE_LOAD_TIMEOUT:
        return parse_int(optarg, "--stage-load-timeout-ms", 1, 86400000, &o->stage_load_timeout_ms);
    case O_MEMCAP:
        if ((o->mem_cap = md_parse_size(optarg)) <= 0) {
            fprintf(stderr, "medley generate: --mem-cap must be a size such as 512M, got \"%s\"\n",
                    optarg);
            return -1;
        }
        return 0;
    default: return 1;
    }
}

/* The checks across options, once every option is read: 0 or -1 (said on stderr). */
static int check_args(int argc, char **argv, gen_opts *o) {
    if (optind < argc) {
        fprintf(stderr, "medley generate: unexpected argument \"%s\"\n", argv[optind]);
        return -1;
    }
    if (!o->model) {
        fprintf(stderr, "medley generate: -m MODEL is required\n");
        usage(stderr);
        return -1;
    }
    if (!!o->prompt + !!o->chat + !!o->batch != 1) {
        fprintf(stderr, "medley generate: give exactly one of -p, --chat, --batch\n");
        return -1;
    }
    if (o->devices) {
        int n = 1;
        for (const char *c = o->devices; (c = strchr(c, ',')); c++)
            n++;
        if (o->stages || o->device || o->tp != n) {
            fprintf(stderr,
                    "medley generate: --devices lists the ranks of --tp N: give N "
                    "devices, without --device or --stages (got %d devices, --tp %d)\n",
                    n, o->tp);
            return -1;
        }
    }
    if (o->n_stop)
        o->s.stop = o->stop;
    md_err e = {0};
    if (md_sampling_validate(&o->s, &e)) {
        fprintf(stderr, "medley generate: %s\n", e.msg);
        return -1;
    }
    return 0;
}

/* 0 with o filled, 1 after --help, -1 on a bad command line (said on stderr). */
static int parse_args(int argc, char **argv, gen_opts *o) {
    md_sampling_default(&o->s);
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "m:p:o:n:t:h", gen_options, NULL)) != -1) {
        switch (c) {
        case 'm': o->model = optarg; continue;
        case 'p': o->prompt = optarg; continue;
        case O_CHAT: o->chat = optarg; continue;
        case O_SYSTEM: o->system = optarg; continue;
        case O_BATCH: o->batch = optarg; continue;
        case 'o': o->out = optarg; continue;
        case O_JSON: o->json = 1; continue;
        case 'h': usage(stdout); return 1;
        }
        int rc = sampling_opt(c, o);
        if (rc == 1)
            rc = engine_opt(c, o);
        if (rc == 1) {
            usage(stderr);
            return -1;
        }
        if (rc)
            return -1;
    }
    return check_args(argc, argv, o);
}

const char *gen_finish_name(md_finish f) {
    switch (f) {
    case MD_FINISH_STOP: return "stop";
    case MD_FINISH_LENGTH: return "length";
    case MD_FINISH_ERROR: return "error";
    case MD_FINISH_CANCELLED: return "cancelled";
    default: return "none";
    }
}

/* Tokenize a raw prompt or render chat messages (a JSON array of {role, content}, or one user
 * message with an optional system one). *ids is malloc'd. */
int gen_encode(tok_tokenizer *tok, const char *prompt, json_t *messages, const char *user,
               const char *system, int32_t **ids, int *n, md_err *e) {
    char *text = NULL;
    int rc;
    if (prompt) {
        return tok_encode(tok, prompt, strlen(prompt), tok_add_bos(tok), 1, ids, n, e);
    }
    tok_chat_msg msgs[64];
    int nm = 0;
    if (messages) {
        if (!json_is_array(messages) || json_array_size(messages) == 0 ||
            json_array_size(messages) > 64)
            return md_errf(e, MD_EINVAL, "messages must be an array of 1 to 64 objects");
        for (size_t i = 0; i < json_array_size(messages); i++) {
            json_t *m = json_array_get(messages, i);
            const char *role = NULL, *content = NULL;
            if ((rc = md_json_get_str(m, "role", 1, &role, "messages[]", e)) ||
                (rc = md_json_get_str(m, "content", 1, &content, "messages[]", e)))
                return rc;
            msgs[nm++] = (tok_chat_msg){role, content};
        }
    } else {
        if (system)
            msgs[nm++] = (tok_chat_msg){"system", system};
        msgs[nm++] = (tok_chat_msg){"user", user};
    }
    if ((rc = tok_chat_apply(tok, msgs, nm, 1, &text, e)))
        return rc;
    rc = tok_encode(tok, text, strlen(text), tok_add_bos(tok), 1, ids, n, e);
    free(text);
    return rc;
}

static int open_engine(const gen_opts *o, md_engine **eng) {
    char path[4096];
    md_err e = {0};
    if (md_model_resolve(o->model, 1, path, sizeof path, &e)) {
        fprintf(stderr, "medley generate: %s\n", e.msg);
        return 1;
    }
    char device[256];
    if (o->devices) /* the ranks' devices, checked by each rank's open */
        snprintf(device, sizeof device, "%s", o->devices);
    else if (md_backend_resolve(o->device ? o->device : "auto", device, sizeof device, &e)) {
        fprintf(stderr, "medley generate: %s\n", e.msg);
        return 1;
    }
    md_engine_config cfg = {.model_path = path,
                            .device = device,
                            .n_threads = o->n_threads,
                            .max_seqs = o->max_seqs,
                            .max_batch_tokens = o->batch_tokens,
                            .prefill_chunk = o->prefill_chunk,
                            .kv_budget_bytes = (size_t)o->kv_mb << 20,
                            .kv_type = o->kv_type,
                            .bf16_weights = o->bf16_weights,
                            .chat_template = o->chat_template,
                            .n_ctx = o->n_ctx,
                            .stages = o->stages,
                            .model_name = o->model,
                            .tp = o->tp,
                            .microbatches = o->microbatches,
                            .stage_timeout_ms = o->stage_timeout_ms,
                            .stage_load_timeout_ms = o->stage_load_timeout_ms,
                            .stage_secret_file = o->stage_secret_file,
                            .stage_mem_cap = (size_t)(o->mem_cap > 0 ? o->mem_cap : 0)};
    if (md_engine_open(&cfg, eng, &e)) {
        fprintf(stderr, "medley generate: %s\n", e.msg);
        return 1;
    }
    return 0;
}

/* Each token's alternatives: [[{"id", "bytes", "logprob"}, ...], ...], most likely first;
 * bytes exact (a piece may be part of a UTF-8 character). */
static json_t *top_logprobs_json(const tok_tokenizer *tok, const md_step_token *t, int n) {
    json_t *all = json_array();
    for (int i = 0; i < n; i++) {
        json_t *alts = json_array();
        for (int j = 0; j < t[i].n_top; j++) {
            size_t len;
            const char *p = tok_piece(tok, t[i].top_token[j], 0, &len);
            json_t *bytes = json_array();
            for (size_t k = 0; k < len; k++)
                json_array_append_new(bytes, json_integer((unsigned char)p[k]));
            json_array_append_new(alts,
                                  json_pack("{s:i, s:o, s:f}", "id", t[i].top_token[j], "bytes",
                                            bytes, "logprob", (double)t[i].top_logprob[j]));
        }
        json_array_append_new(all, alts);
    }
    return all;
}

/* Append t; -1 when out of memory (the list is kept). */
int gen_lp_push(lp_list *l, const md_step_token *t) {
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 64;
        md_step_token *p = realloc(l->t, (size_t)cap * sizeof *p);
        if (!p)
            return -1;
        l->t = p;
        l->cap = cap;
    }
    l->t[l->n++] = *t;
    return 0;
}

/* obj's "logprobs" (one per token) and, with n_top > 0, "top_logprobs". */
void gen_lp_json(json_t *obj, const tok_tokenizer *tok, const lp_list *l, int n_top) {
    json_t *lpa = json_array();
    for (int i = 0; i < l->n; i++)
        json_array_append_new(lpa, json_real(l->t[i].logprob));
    json_object_set_new(obj, "logprobs", lpa);
    if (n_top > 0)
        json_object_set_new(obj, "top_logprobs", top_logprobs_json(tok, l->t, l->n));
}

static int run_single(const gen_opts *o, md_engine *eng) {
    md_err e = {0};
    int32_t *ids = NULL;
    int n = 0;
    tok_tokenizer *tok = md_engine_tokenizer(eng);
    if (gen_encode(tok, o->prompt, NULL, o->chat, o->system, &ids, &n, &e)) {
        fprintf(stderr, "medley generate: %s\n", e.msg);
        return 1;
    }
    uint64_t id;
    uint64_t t0 = md_mono_ns();
    if (md_engine_submit(eng, ids, n, &o->s, &id, &e)) {
        fprintf(stderr, "medley generate: %s\n", e.msg);
        free(ids);
        return 1;
    }
    free(ids);
    /* stream the text, holding back what could still become a stop string */
    size_t hold = 0, printed = 0;
    for (int i = 0; i < o->n_stop; i++)
        if (strlen(o->stop[i]) > hold)
            hold = strlen(o->stop[i]);
    hold = hold ? hold - 1 : 0;
    lp_list lps = {0};
    int done = 0;
    while (!done) {
        md_step_result r;
        if (md_engine_step(eng, &r, &e)) {
            fprintf(stderr, "medley generate: %s\n", e.msg);
            free(lps.t);
            return 1;
        }
        for (int i = 0; i < r.n_tokens && o->s.logprobs; i++) {
            if (r.tokens[i].seq_id != id)
                continue;
            if (gen_lp_push(&lps, &r.tokens[i])) {
                fprintf(stderr, "medley generate: out of memory\n");
                free(lps.t);
                return 1;
            }
        }
        for (int i = 0; i < r.n_finished; i++)
            done |= r.finished[i] == id;
        if (!o->json) {
            const char *text = md_seq_text(eng, id);
            size_t len = strlen(text);
            size_t upto = done ? len : (len > hold ? len - hold : 0);
            if (upto > printed) {
                fwrite(text + printed, 1, upto - printed, stdout);
                fflush(stdout);
                printed = upto;
            }
        }
    }
    double wall_ms = (double)(md_mono_ns() - t0) / 1e6;
    md_seq_stats st;
    md_seq_get_stats(eng, id, &st);
    const int32_t *toks;
    int nt;
    md_seq_tokens(eng, id, &toks, &nt);
    md_finish fin = md_seq_finish(eng, id);
    if (fin == MD_FINISH_ERROR) {
        fprintf(stderr, "medley generate: %s\n", md_seq_error(eng, id));
        free(lps.t);
        return 1;
    }
    double decode_tps = st.decode_ms > 0 ? (st.completion_tokens - 1) / (st.decode_ms / 1e3) : 0;
    double prompt_tps = st.prefill_ms > 0 ? st.prompt_tokens / (st.prefill_ms / 1e3) : 0;
    if (o->json) {
        json_t *arr = json_array();
        for (int i = 0; i < nt; i++)
            json_array_append_new(arr, json_integer(toks[i]));
        json_t *obj =
            json_pack("{s:o, s:s, s:i, s:i, s:s, s:{s:f, s:f, s:f, s:f, s:f}}", "tokens", arr,
                      "text", md_seq_text(eng, id), "prompt_tokens", st.prompt_tokens,
                      "completion_tokens", nt, "finish_reason", gen_finish_name(fin), "timings",
                      "prompt_ms", st.prefill_ms, "decode_ms", st.decode_ms, "total_ms", wall_ms,
                      "prompt_tokens_per_s", prompt_tps, "decode_tokens_per_s", decode_tps);
        if (o->s.logprobs)
            gen_lp_json(obj, tok, &lps, o->s.top_logprobs);
        char *s = json_dumps(obj, JSON_COMPACT);
        printf("%s\n", s);
        free(s);
        json_decref(obj);
    } else {
        printf("\n");
        fprintf(stderr,
                "[%d prompt tokens in %.1f ms (%.1f tok/s); %d generated in %.1f ms (%.1f "
                "tok/s); finish: %s]\n",
                st.prompt_tokens, st.prefill_ms, prompt_tps, nt, st.decode_ms, decode_tps,
                gen_finish_name(fin));
    }
    free(lps.t);
    md_engine_release(eng, id);
    return 0;
}

/* A sharded engine's traffic on stderr: what crossed between the head and its stages. */
static void report_pipe(md_engine *eng) {
    struct md_pipe *p = md_engine_pipe(eng);
    if (!p)
        return;
    md_pipe_stats st;
    md_pipe_get_stats(p, &st);
    md_engine_stats es;
    md_engine_get_stats(eng, &es);
    size_t all = st.bytes_hidden + st.bytes_layout;
    fprintf(stderr,
            "medley generate: %d stages, %ld steps in %ld micro-batches; %.1f MiB between head "
            "and stages (%.1f MiB hidden states and logits, %.1f MiB layouts), %.0f bytes per "
            "token through the model\n",
            md_pipe_n_stages(p), st.steps, st.microbatches, all / 1048576.0,
            st.bytes_hidden / 1048576.0, st.bytes_layout / 1048576.0,
            es.tokens ? (double)all / (double)es.tokens : 0.0);
    char busy[256] = "";
    size_t n = 0;
    for (int i = 0; i < md_pipe_n_stages(p) && n < sizeof busy; i++)
        n += (size_t)snprintf(busy + n, sizeof busy - n, "%s%.0f%%", i ? ", " : "",
                              st.forward_s > 0 ? 100.0 * st.busy_s[i] / st.forward_s : 0.0);
    fprintf(stderr, "medley generate: %.2f s in the stages' steps; each stage busy %s of it\n",
            st.forward_s, busy);
}

int cmd_generate(int argc, char **argv) {
    gen_opts o = {0};
    int rc = parse_args(argc, argv, &o);
    if (rc)
        return rc > 0 ? 0 : 2;
    md_engine *eng;
    if (open_engine(&o, &eng))
        return 1;
    rc = o.batch ? gen_run_batch(&o, eng) : run_single(&o, eng);
    report_pipe(eng);
    md_engine_close(eng);
    return rc;
}
