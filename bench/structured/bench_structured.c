/* bench_structured.c — medley's side of bench/structured (bench.py runs it and the peers).
 *
 *   bench_structured MODEL.gguf schemas.json OUT_DIR
 *
 * Loads the model's tokenizer, hands its token bytes to gr_vocab_new, and for each schema of
 * schemas.json ([{"name", "schema", "instance"}]): compile time (the grammar alone, and with
 * every mask-cache entry computed by gr_prepare, which is what xgrammar's compile includes),
 * then the per-token mask time along the instance's tokens, in a cold pass (cache entries
 * computed on first use) and a warm pass (a new matcher on the prepared grammar). Every
 * token of the instance must be in its mask and the end token in the last one. Prints one
 * JSON line per schema; writes OUT_DIR/vocab.bin (the token bytes the peers get) and
 * OUT_DIR/tokens.json (each instance's token ids), so that the peers run on the same
 * vocabulary and the same token sequences. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/grammar/grammar.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/weights/gguf.h"

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

/* CPU time of the process: compile figures are not skewed by other jobs on a shared machine */
static double cpu_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double pct(double *v, int n, double p) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    int i = (int)(p * (n - 1) + 0.5);
    return v[i];
}

/* One pass along the tokens; fills us[] with each mask's time. Returns 0 if every token was
 * allowed. */
static int pass(const gr_grammar *g, const gr_vocab *v, const int32_t *toks, int n, int32_t eos,
                double *us, uint32_t *mask) {
    gr_matcher *m;
    md_err e = {0};
    if (gr_matcher_new(g, v, &m, &e)) {
        fprintf(stderr, "matcher: %s\n", e.msg);
        return -1;
    }
    int rc = 0;
    for (int i = 0; i <= n; i++) {
        double t0 = now_us();
        gr_matcher_fill_mask(m, mask);
        us[i] = now_us() - t0;
        int32_t t = i < n ? toks[i] : eos;
        if (!((mask[t >> 5] >> (t & 31)) & 1) || gr_matcher_accept(m, t)) {
            fprintf(stderr, "token %d (#%d) refused by the mask\n", t, i);
            rc = -1;
            break;
        }
    }
    gr_matcher_free(m);
    return rc;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: bench_structured MODEL.gguf schemas.json OUT_DIR\n");
        return 2;
    }
    md_err e = {0};
    gguf_file *f;
    tok_tokenizer *tk;
    if (gguf_open(argv[1], &f, &e) || tok_load(f, &tk, &e)) {
        fprintf(stderr, "bench_structured: %s\n", e.msg);
        return 1;
    }
    int nv = tok_n_vocab(tk);
    const char **tok = malloc(sizeof *tok * (size_t)nv);
    uint32_t *len = malloc(sizeof *len * (size_t)nv);
    int32_t *eos = malloc(sizeof *eos * (size_t)nv);
    int neos = 0;
    char path[4096];
    snprintf(path, sizeof path, "%s/vocab.bin", argv[3]);
    FILE *vb = fopen(path, "wb");
    if (!vb) {
        perror(path);
        return 1;
    }
    fwrite(&nv, 4, 1, vb);
    for (int i = 0; i < nv; i++) {
        size_t l = 0;
        tok[i] = tok_piece(tk, i, 0, &l);
        len[i] = (uint32_t)l;
        if (tok_is_eog(tk, i) || i == tok_eos(tk))
            eos[neos++] = i;
        uint32_t ll = len[i];
        uint8_t special = tok_is_eog(tk, i) || i == tok_eos(tk) ? 2 : l == 0 ? 1 : 0;
        fwrite(&ll, 4, 1, vb);
        fwrite(&special, 1, 1, vb);
        fwrite(tok[i], 1, l, vb);
    }
    fclose(vb);
    double t0 = now_us();
    gr_vocab *v;
    if (gr_vocab_new(nv, tok, len, eos, neos, &v, &e)) {
        fprintf(stderr, "vocab: %s\n", e.msg);
        return 1;
    }
    double vocab_ms = (now_us() - t0) / 1e3;
    fprintf(stderr, "vocabulary: %d tokens, %d end tokens, built in %.1f ms\n", nv, neos, vocab_ms);
    json_error_t je;
    json_t *list = json_load_file(argv[2], 0, &je);
    if (!json_is_array(list)) {
        fprintf(stderr, "%s: %s\n", argv[2], je.text);
        return 1;
    }
    json_t *tokens_out = json_object();
    uint32_t *mask = malloc(sizeof(uint32_t) * (size_t)((nv + 31) / 32));
    int failed = 0;
    for (size_t k = 0; k < json_array_size(list); k++) {
        json_t *it = json_array_get(list, k);
        const char *name = json_string_value(json_object_get(it, "name"));
        const char *inst = json_string_value(json_object_get(it, "instance"));
        char *schema = json_dumps(json_object_get(it, "schema"), JSON_COMPACT);
        int32_t *ids = NULL;
        int n = 0;
        if (tok_encode(tk, inst, strlen(inst), 0, 0, &ids, &n, &e)) {
            fprintf(stderr, "%s: tokenize: %s\n", name, e.msg);
            return 1;
        }
        json_t *ja = json_array();
        for (int i = 0; i < n; i++)
            json_array_append_new(ja, json_integer(ids[i]));
        json_object_set_new(tokens_out, name, ja);
        /* compile: best of 5 for the grammar alone, best of 3 with gr_prepare (CPU time);
         * masks: 3 passes, each position's time the fastest of the 3 (preemptions on a
         * shared machine otherwise make the p99). Cold passes use a fresh grammar each. */
        double best = 1e18, best_prep = 1e18;
        gr_grammar *g = NULL;
        for (int r = 0; r < 5; r++) {
            gr_free(g);
            g = NULL;
            double a = cpu_us();
            if (gr_from_json_schema(schema, strlen(schema), 1, &g, NULL, 0, &e)) {
                fprintf(stderr, "%s: %s\n", name, e.msg);
                return 1;
            }
            double dt = cpu_us() - a;
            if (dt < best)
                best = dt;
        }
        double *cold = malloc(sizeof(double) * (size_t)(n + 1));
        double *warm = malloc(sizeof(double) * (size_t)(n + 1));
        double *tmp = malloc(sizeof(double) * (size_t)(n + 1));
        for (int i = 0; i <= n; i++)
            cold[i] = warm[i] = 1e18;
        int bad = 0;
        for (int r = 0; r < 3; r++) {
            gr_free(g);
            gr_from_json_schema(schema, strlen(schema), 1, &g, NULL, 0, &e);
            bad |= pass(g, v, ids, n, eos[0], tmp, mask);
            for (int i = 0; i <= n; i++)
                cold[i] = tmp[i] < cold[i] ? tmp[i] : cold[i];
        }
        for (int r = 0; r < 3; r++) {
            gr_free(g);
            double a = cpu_us();
            gr_from_json_schema(schema, strlen(schema), 1, &g, NULL, 0, &e);
            int prc = gr_prepare(g, v, &e);
            double dt = cpu_us() - a;
            if (prc) {
                fprintf(stderr, "%s: prepare: %s\n", name, e.msg);
                return 1;
            }
            best_prep = dt < best_prep ? dt : best_prep;
        }
        for (int r = 0; r < 3; r++) {
            bad |= pass(g, v, ids, n, eos[0], tmp, mask);
            for (int i = 0; i <= n; i++)
                warm[i] = tmp[i] < warm[i] ? tmp[i] : warm[i];
        }
        double prep_ms = best_prep / 1e3;
        free(tmp);
        if (bad)
            failed = 1;
        double cold_max = 0;
        for (int i = 0; i <= n; i++)
            cold_max = cold[i] > cold_max ? cold[i] : cold_max;
        printf("{\"name\":\"%s\",\"tokens\":%d,\"compile_ms\":%.3f,\"compile_prepare_ms\":%.3f,"
               "\"cold_p50_us\":%.2f,\"cold_p99_us\":%.2f,\"cold_max_us\":%.1f,"
               "\"warm_p50_us\":%.2f,\"warm_p99_us\":%.2f,\"ok\":%s}\n",
               name, n, best / 1e3, prep_ms, pct(cold, n + 1, 0.5), pct(cold, n + 1, 0.99),
               cold_max, pct(warm, n + 1, 0.5), pct(warm, n + 1, 0.99), bad ? "false" : "true");
        fflush(stdout);
        gr_free(g);
        free(cold);
        free(warm);
        free(ids);
        free(schema);
    }
    snprintf(path, sizeof path, "%s/tokens.json", argv[3]);
    json_object_set_new(tokens_out, "eos", json_integer(eos[0]));
    json_t *je_all = json_array();
    for (int i = 0; i < neos; i++)
        json_array_append_new(je_all, json_integer(eos[i]));
    json_object_set_new(tokens_out, "eos_all", je_all);
    json_dump_file(tokens_out, path, JSON_COMPACT);
    json_decref(tokens_out);
    json_decref(list);
    free(mask);
    gr_vocab_free(v);
    tok_free(tk);
    gguf_close(f);
    free(tok);
    free(len);
    free(eos);
    return failed;
}
