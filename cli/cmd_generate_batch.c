/* cmd_generate_batch.c — `medley generate --batch FILE.jsonl`: every line ({"prompt": ...}
 * with a string or an array of token ids, or {"messages": [...]}, with optional sampling fields, or
 * an OpenAI Batch line) submitted to one engine, which batches them continuously; one result line
 * per request, and the throughput and latency on stderr. */
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cmd_generate.h"
#include "common/log.h"
#include "common/util.h"
#include "engine/engine.h"
#include "engine/tokenizer/tokenizer.h"

typedef struct {
    uint64_t seq;
    char *custom_id;
    int line;
    double latency_ms;
    int logprobs, n_top;
    lp_list lp; /* its tokens' step results, when logprobs */
} batch_req;

/* The request of sequence seq: reqs are in submission order, so in increasing seq (the
 * engine numbers sequences as they are submitted); NULL if none. */
static batch_req *find_req(batch_req *reqs, int n, uint64_t seq) {
    int lo = 0, hi = n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        if (reqs[mid].seq == seq)
            return &reqs[mid];
        if (reqs[mid].seq < seq)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return NULL;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* A prompt given as token ids (a JSON array of 1 to INT_MAX integers in int32 range) into
 * *ids (malloc'd), as is: no BOS added. The engine checks them against the vocabulary. */
static int prompt_ids(json_t *arr, int32_t **ids, int *n, md_err *e) {
    size_t len = json_array_size(arr);
    if (len == 0 || len > INT_MAX)
        return md_errf(e, MD_EINVAL, "prompt: an array of token ids needs 1 to %d of them",
                       INT_MAX);
    int32_t *v = malloc(len * sizeof *v);
    if (!v)
        return md_errf(e, MD_ENOMEM, "prompt: out of memory for %zu token ids", len);
    for (size_t i = 0; i < len; i++) {
        json_t *x = json_array_get(arr, i);
        long long t = json_is_integer(x) ? json_integer_value(x) : -1;
        if (!json_is_integer(x) || t < 0 || t > INT32_MAX) {
            free(v);
            return md_errf(e, MD_EINVAL, "prompt[%zu] is not a token id (an integer in [0, 2^31))",
                           i);
        }
        v[i] = (int32_t)t;
    }
    *ids = v;
    *n = (int)len;
    return 0;
}

/* One request line: sampling from the line (falling back to the command line's), prompt
 * tokens. Errors name the line. */
static int batch_line(const gen_opts *o, tok_tokenizer *tok, json_t *line, md_sampling *s,
                      char ***stops, int32_t **ids, int *n, md_err *e) {
    json_t *body = json_object_get(line, "body");
    if (!body)
        body = line;
    if (!json_is_object(body))
        return md_errf(e, MD_EINVAL, "expected a JSON object");
    *s = o->s;
    double d;
    long long v;
    int rc;
    d = s->temperature;
    if ((rc = md_json_get_num(body, "temperature", 0, &d, "request", e)))
        return rc;
    s->temperature = (float)d;
    d = s->top_p;
    if ((rc = md_json_get_num(body, "top_p", 0, &d, "request", e)))
        return rc;
    s->top_p = (float)d;
    d = s->min_p;
    if ((rc = md_json_get_num(body, "min_p", 0, &d, "request", e)))
        return rc;
    s->min_p = (float)d;
    d = s->presence_penalty;
    if ((rc = md_json_get_num(body, "presence_penalty", 0, &d, "request", e)))
        return rc;
    s->presence_penalty = (float)d;
    d = s->frequency_penalty;
    if ((rc = md_json_get_num(body, "frequency_penalty", 0, &d, "request", e)))
        return rc;
    s->frequency_penalty = (float)d;
    d = s->repetition_penalty;
    if ((rc = md_json_get_num(body, "repetition_penalty", 0, &d, "request", e)))
        return rc;
    s->repetition_penalty = (float)d;
    /* logprobs: true / false (chat), or N most likely tokens too (completions) */
    json_t *lp = json_object_get(body, "logprobs");
    if (json_is_boolean(lp)) {
        s->logprobs = json_is_true(lp);
        if (!s->logprobs)
            s->top_logprobs = 0; /* the line's false turns off the command line's too */
    } else if (json_is_integer(lp)) {
        v = json_integer_value(lp);
        if (v < 0 || v > MD_TOP_LOGPROBS)
            return md_errf(e, MD_EINVAL, "logprobs %lld must be true, false or 0 to %d", v,
                           MD_TOP_LOGPROBS);
        s->logprobs = 1;
        s->top_logprobs = (int)v;
    } else if (lp && !json_is_null(lp)) {
        return md_errf(e, MD_EINVAL, "logprobs must be true, false or an integer");
    }
    v = s->top_logprobs;
    if ((rc = md_json_get_int(body, "top_logprobs", 0, &v, "request", e)))
        return rc;
    if (v < 0 || v > MD_TOP_LOGPROBS)
        return md_errf(e, MD_EINVAL, "top_logprobs %lld must be in [0, %d]", v, MD_TOP_LOGPROBS);
    s->top_logprobs = (int)v;
    if (s->top_logprobs > 0 && lp && json_is_false(lp))
        return md_errf(e, MD_EINVAL, "top_logprobs needs logprobs");
    s->logprobs |= s->top_logprobs > 0;
    v = s->top_k;
    if ((rc = md_json_get_int(body, "top_k", 0, &v, "request", e)))
        return rc;
    if (v < 0 || v > INT_MAX)
        return md_errf(e, MD_EINVAL, "top_k %lld must be in [0, %d]", v, INT_MAX);
    s->top_k = (int)v;
    v = s->max_tokens;
    if ((rc = md_json_get_int(body, "max_tokens", 0, &v, "request", e)))
        return rc;
    if (v < 0 || v > INT_MAX)
        return md_errf(e, MD_EINVAL, "max_tokens %lld must be in [0, %d]", v, INT_MAX);
    s->max_tokens = (int)v;
    v = (long long)s->seed;
    if ((rc = md_json_get_int(body, "seed", 0, &v, "request", e)))
        return rc;
    s->seed = (uint64_t)v;
    json_t *stop = json_object_get(body, "stop");
    if (stop && !json_is_null(stop)) {
        size_t ns = json_is_string(stop) ? 1 : json_is_array(stop) ? json_array_size(stop) : 0;
        if (ns == 0 || ns > MAX_STOP)
            return md_errf(e, MD_EINVAL, "stop must be a string or 1 to %d strings", MAX_STOP);
        *stops = calloc(ns + 1, sizeof **stops);
        for (size_t i = 0; i < ns; i++) {
            json_t *x = json_is_string(stop) ? stop : json_array_get(stop, i);
            if (!json_is_string(x))
                return md_errf(e, MD_EINVAL, "stop[%zu] is not a string", i);
            (*stops)[i] = (char *)json_string_value(x);
        }
        s->stop = (const char *const *)*stops;
    }
    if ((rc = md_sampling_validate(s, e)))
        return rc;
    json_t *prompt = json_object_get(body, "prompt"), *msgs = json_object_get(body, "messages");
    if (!!prompt == !!msgs)
        return md_errf(e, MD_EINVAL, "give exactly one of prompt and messages");
    if (json_is_array(prompt)) /* token ids, as OpenAI's completions take them */
        return prompt_ids(prompt, ids, n, e);
    if (prompt && !json_is_string(prompt))
        return md_errf(e, MD_EINVAL, "prompt must be a string or an array of token ids");
    return gen_encode(tok, prompt ? json_string_value(prompt) : NULL, msgs, NULL, NULL, ids, n, e);
}

/* The line lineno was rejected: an error line on out naming it. */
static void write_rejected(FILE *out, int lineno, const char *cid, const char *msg) {
    json_t *err = json_pack("{s:i, s:s?, s:{s:s}}", "line", lineno, "custom_id", cid, "error",
                            "message", msg);
    char *js = json_dumps(err, JSON_COMPACT);
    fprintf(out, "%s\n", js);
    free(js);
    json_decref(err);
}

/* A new slot at the end of *reqs (*n used of *cap) for sequence seq, which must come after
 * the last one's; exits when out of memory or out of order. */
static batch_req *push_req(batch_req **reqs, int *n, int *cap, uint64_t seq) {
    if (*n == *cap) {
        *cap = *cap ? *cap * 2 : 64;
        batch_req *r2 = realloc(*reqs, (size_t)*cap * sizeof **reqs);
        if (!r2) {
            fprintf(stderr, "medley generate: out of memory\n");
            exit(1);
        }
        *reqs = r2;
    }
    if (*n && seq <= (*reqs)[*n - 1].seq) { /* find_req relies on the order */
        fprintf(stderr, "medley generate: sequence ids out of order\n");
        exit(1);
    }
    return &(*reqs)[(*n)++];
}

/* The finished request q: its result line on out, its sequence released; its completion
 * tokens add to *gen_tokens. */
static void write_result(md_engine *eng, const tok_tokenizer *tok, batch_req *q, FILE *out,
                         long *gen_tokens) {
    md_seq_stats st;
    md_seq_get_stats(eng, q->seq, &st);
    q->latency_ms = st.queue_ms + st.prefill_ms + st.decode_ms;
    *gen_tokens += st.completion_tokens;
    md_finish fin = md_seq_finish(eng, q->seq);
    json_t *res = json_pack("{s:i, s:s?, s:s, s:i, s:i, s:i, s:s, s:f}", "line", q->line,
                            "custom_id", q->custom_id, "text", md_seq_text(eng, q->seq),
                            "prompt_tokens", st.prompt_tokens, "completion_tokens",
                            st.completion_tokens, "cached_prompt_tokens", st.cached_prompt_tokens,
                            "finish_reason", gen_finish_name(fin), "latency_ms", q->latency_ms);
    if (fin == MD_FINISH_ERROR)
        json_object_set_new(res, "error", json_string(md_seq_error(eng, q->seq)));
    if (q->logprobs) {
        const int32_t *toks;
        int nt;
        md_seq_tokens(eng, q->seq, &toks, &nt);
        json_t *ta = json_array();
        for (int k = 0; k < nt; k++)
            json_array_append_new(ta, json_integer(toks[k]));
        json_object_set_new(res, "tokens", ta);
        gen_lp_json(res, tok, &q->lp, q->n_top);
        free(q->lp.t);
        q->lp = (lp_list){0};
    }
    char *js = json_dumps(res, JSON_COMPACT);
    fprintf(out, "%s\n", js);
    free(js);
    json_decref(res);
    md_engine_release(eng, q->seq);
}

/* Throughput and latency percentiles of the batch on stderr. */
static void report_batch(const batch_req *reqs, int n_req, int n_bad, long prompt_tokens,
                         long gen_tokens, double wall) {
    double *lat = malloc((n_req > 0 ? (size_t)n_req : 1) * sizeof *lat);
    for (int i = 0; i < n_req; i++)
        lat[i] = reqs[i].latency_ms;
    qsort(lat, (size_t)n_req, sizeof *lat, cmp_double);
    fprintf(stderr,
            "medley generate: %d requests (%d rejected), %ld prompt + %ld generated tokens in "
            "%.2f s: %.1f generated tok/s, %.1f total tok/s; latency p50 %.0f ms, p95 %.0f ms\n",
            n_req, n_bad, prompt_tokens, gen_tokens, wall, gen_tokens / wall,
            (prompt_tokens + gen_tokens) / wall, n_req ? lat[n_req / 2] : 0,
            n_req ? lat[(int)(n_req * 0.95) < n_req ? (int)(n_req * 0.95) : n_req - 1] : 0);
    free(lat);
}

int gen_run_batch(const gen_opts *o, md_engine *eng) {
    FILE *in = fopen(o->batch, "r");
    if (!in) {
        fprintf(stderr, "medley generate: cannot open %s: %s\n", o->batch, strerror(errno));
        return 1;
    }
    FILE *out = o->out ? fopen(o->out, "w") : stdout;
    if (!out) {
        fprintf(stderr, "medley generate: cannot write %s: %s\n", o->out, strerror(errno));
        fclose(in);
        return 1;
    }
    tok_tokenizer *tok = md_engine_tokenizer(eng);
    batch_req *reqs = NULL;
    int n_req = 0, cap = 0, n_bad = 0, status = 0;
    long prompt_tokens = 0, gen_tokens = 0;
    char *linebuf = NULL;
    size_t lcap = 0;
    int lineno = 0;
    uint64_t t0 = md_mono_ns();
    /* submit everything (the engine queues what it cannot admit yet) */
    while (getline(&linebuf, &lcap, in) > 0) {
        lineno++;
        if (strspn(linebuf, " \t\r\n") == strlen(linebuf))
            continue;
        md_err e = {0};
        json_error_t je;
        json_t *line = json_loads(linebuf, 0, &je);
        md_sampling s;
        char **stops = NULL;
        int32_t *ids = NULL;
        int n = 0;
        uint64_t id = 0;
        int rc = line ? batch_line(o, tok, line, &s, &stops, &ids, &n, &e)
                      : md_errf(&e, MD_EINVAL, "invalid JSON: %s", je.text);
        if (!rc)
            rc = md_engine_submit(eng, ids, n, &s, &id, &e);
        free(ids);
        free(stops);
        const char *cid = NULL;
        if (line)
            md_json_get_str(line, "custom_id", 0, &cid, "request", NULL);
        if (rc) {
            write_rejected(out, lineno, cid, e.msg);
            n_bad++;
        } else {
            batch_req *r = push_req(&reqs, &n_req, &cap, id);
            *r = (batch_req){.seq = id,
                             .custom_id = cid ? strdup(cid) : NULL,
                             .line = lineno,
                             .logprobs = s.logprobs,
                             .n_top = s.top_logprobs};
            prompt_tokens += n;
        }
        json_decref(line);
    }
    free(linebuf);
    fclose(in);
    int remaining = n_req;
    while (remaining > 0) {
        md_step_result r;
        md_err e = {0};
        int rc = md_engine_step(eng, &r, &e);
        for (int i = 0; i < r.n_tokens; i++) {
            batch_req *q = find_req(reqs, n_req, r.tokens[i].seq_id);
            if (!q || !q->logprobs)
                continue;
            if (gen_lp_push(&q->lp, &r.tokens[i])) {
                fprintf(stderr, "medley generate: out of memory\n");
                exit(1);
            }
        }
        for (int i = 0; i < r.n_finished; i++) {
            batch_req *q = find_req(reqs, n_req, r.finished[i]);
            if (!q)
                continue;
            write_result(eng, tok, q, out, &gen_tokens);
            remaining--;
        }
        if (rc) {
            fprintf(stderr, "medley generate: %s\n", e.msg);
            status = 1;
            break;
        }
    }
    double wall = (double)(md_mono_ns() - t0) / 1e9;
    report_batch(reqs, n_req, n_bad, prompt_tokens, gen_tokens, wall);
    for (int i = 0; i < n_req; i++) {
        free(reqs[i].custom_id);
        free(reqs[i].lp.t);
    }
    free(reqs);
    if (out != stdout)
        fclose(out);
    return status || n_bad ? 1 : 0;
}
