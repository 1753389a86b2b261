/* bench_constrained.c — structured outputs' cost in the engine (issue 36): a batch of
 * extraction requests under a JSON schema against the same batch unconstrained.
 *
 *   build/tests/bench_constrained [MODEL.gguf] [--seqs 64] [--max-tokens 96] [--threads N]
 *
 * The constrained run goes first (greedy, the extraction schema below, each answer ends when
 * the grammar does or at max-tokens); each sequence's generated count is kept and the
 * unconstrained run generates exactly as many tokens per sequence (ignore_eos), so both runs
 * have the same batch shape step by step and the ratio of tokens/s is the cost of masks,
 * their application and the matchers. Prints both rates, the ratio (target >= 0.95) and the
 * engine's mask time per step (md_engine_stats.mask_ns). Also checks every `stop` answer is
 * accepted by the grammar end to end (the engine's own matcher finishing it). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "engine/engine.h"
#include "engine/grammar/grammar.h"
#include "engine/tokenizer/tokenizer.h"

static const char SCHEMA[] =
    "{\"type\": \"object\", \"properties\": {"
    "\"name\": {\"type\": \"string\", \"maxLength\": 40}, "
    "\"age\": {\"type\": \"integer\", \"minimum\": 0, \"maximum\": 150}, "
    "\"city\": {\"type\": \"string\", \"maxLength\": 40}, "
    "\"email\": {\"type\": [\"string\", \"null\"]}, "
    "\"role\": {\"enum\": [\"engineer\", \"manager\", \"student\", \"other\"]}, "
    "\"skills\": {\"type\": \"array\", \"items\": {\"type\": \"string\", \"maxLength\": 24}, "
    "\"maxItems\": 4}}, "
    "\"required\": [\"name\", \"age\", \"city\", \"email\", \"role\", \"skills\"], "
    "\"additionalProperties\": false}";

static const char *NAMES[] = {"Ana", "Bo", "Chen", "Dara", "Eli", "Femi", "Gus", "Hana"};
static const char *CITIES[] = {"Lisbon", "Osaka", "Lagos", "Lima", "Oslo", "Pune", "Quito", "Rome"};
static const char *ROLES[] = {"an engineer", "a manager", "a student", "a baker"};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static const char *default_model(void) {
    static char path[4096];
    const char *d = getenv("MEDLEY_MODELS"), *h = getenv("HOME");
    snprintf(path, sizeof path, "%s/SmolLM2-135M-Instruct.Q4_1.gguf", d && *d ? d : h ? h : ".");
    if (!(d && *d))
        snprintf(path, sizeof path, "%s/.cache/medley/models/SmolLM2-135M-Instruct.Q4_1.gguf",
                 h ? h : ".");
    return path;
}

#define DIE(...)                                                                                   \
    do {                                                                                           \
        fprintf(stderr, "bench_constrained: " __VA_ARGS__);                                        \
        fputc('\n', stderr);                                                                       \
        exit(1);                                                                                   \
    } while (0)

/* This process's CPU seconds (user + system): the rate per CPU second is the figure that
 * other load on a shared machine changes least. */
static double cpu_s(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + (double)ru.ru_stime.tv_sec +
           ru.ru_stime.tv_usec * 1e-6;
}

typedef struct {
    double secs, cpu;
    long tokens, steps;
    long mask_ns, masks;
    int n_stop, n_length;
} run_result;

/* Submit every prompt under s (constrained when g), with per-sequence max_tokens when caps;
 * step to the end. A fresh engine each run, so no run finds the prompts of another in its
 * prefix cache. counts (may be NULL) gets each sequence's generated tokens. */
static run_result run(const md_engine_config *cfg, int32_t **prompts, const int *np, int n,
                      const gr_grammar *g, int max_tokens, const int *caps, int *counts,
                      const gr_vocab *check_v) {
    run_result r = {0};
    md_err e = {0};
    md_engine *eng;
    if (md_engine_open(cfg, &eng, &e))
        DIE("open %s: %s", cfg->model_path, e.msg);
    md_engine_stats st0;
    md_engine_get_stats(eng, &st0);
    uint64_t *ids = calloc((size_t)n, sizeof *ids);
    double t0 = now_s(), c0 = cpu_s();
    for (int i = 0; i < n; i++) {
        md_sampling s;
        md_sampling_default(&s);
        s.max_tokens = caps ? caps[i] : max_tokens;
        s.grammar = g;
        s.ignore_eos = caps != NULL;
        if (md_engine_submit(eng, prompts[i], np[i], &s, &ids[i], &e))
            DIE("submit: %s", e.msg);
    }
    md_step_result res;
    do {
        if (md_engine_step(eng, &res, &e))
            DIE("step: %s", e.msg);
        r.tokens += res.n_tokens;
    } while (res.n_live > 0);
    r.secs = now_s() - t0;
    r.cpu = cpu_s() - c0;
    md_engine_stats st;
    md_engine_get_stats(eng, &st);
    r.steps = st.steps - st0.steps;
    r.mask_ns = st.mask_ns - st0.mask_ns;
    r.masks = st.masks - st0.masks;
    for (int i = 0; i < n; i++) {
        const int32_t *toks;
        int nt;
        md_seq_tokens(eng, ids[i], &toks, &nt);
        md_finish f = md_seq_finish(eng, ids[i]);
        r.n_stop += f == MD_FINISH_STOP;
        r.n_length += f == MD_FINISH_LENGTH;
        if (counts)
            counts[i] = nt;                   /* md_seq_tokens: the generated tokens */
        if (check_v && f == MD_FINISH_STOP) { /* a fresh matcher accepts the whole answer */
            gr_matcher *m;
            if (gr_matcher_new(g, check_v, &m, &e))
                DIE("matcher: %s", e.msg);
            for (int j = 0; j < nt; j++)
                if (gr_matcher_accept(m, toks[j]))
                    DIE("sequence %d: token %d at %d not in the grammar: %s", i, toks[j], j,
                        md_seq_text(eng, ids[i]));
            if (!gr_matcher_can_end(m))
                DIE("sequence %d stopped before the grammar could end: %s", i,
                    md_seq_text(eng, ids[i]));
            gr_matcher_free(m);
        }
        md_engine_release(eng, ids[i]);
    }
    free(ids);
    md_engine_close(eng);
    return r;
}

int main(int argc, char **argv) {
    const char *model = default_model();
    int n = 64, max_tokens = 96, threads = 0, reps = 2;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--seqs") && i + 1 < argc)
            n = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--max-tokens") && i + 1 < argc)
            max_tokens = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (argv[i][0] != '-')
            model = argv[i];
        else
            DIE("unknown argument %s", argv[i]);
    }
    if (n < 1 || max_tokens < 1 || reps < 1)
        DIE("--seqs, --max-tokens and --reps must be >= 1");
    md_err e = {0};
    md_engine_config cfg = {.model_path = model, .n_threads = threads, .max_seqs = n};
    md_engine *eng;
    if (md_engine_open(&cfg, &eng, &e))
        DIE("open %s: %s", model, e.msg);
    tok_tokenizer *tok = md_engine_tokenizer(eng);
    double tc = now_s();
    gr_grammar *g;
    if (gr_from_json_schema(SCHEMA, sizeof SCHEMA - 1, 1, &g, NULL, 0, &e))
        DIE("schema: %s", e.msg);
    tc = now_s() - tc;
    int32_t **prompts = calloc((size_t)n, sizeof *prompts);
    int *np = calloc((size_t)n, sizeof *np), *counts = calloc((size_t)n, sizeof *counts);
    for (int i = 0; i < n; i++) {
        char text[512];
        snprintf(text, sizeof text,
                 "Extract the person as JSON with name, age, city, email, role and skills.\n"
                 "%s is %d, lives in %s and works as %s; reach them at %s%d@example.org. "
                 "They know C and SQL.",
                 NAMES[i % 8], 20 + (i * 7) % 50, CITIES[(i / 8) % 8], ROLES[i % 4], NAMES[i % 8],
                 i);
        tok_chat_msg msg = {"user", text};
        char *p;
        if (tok_chat_apply(tok, &msg, 1, 1, &p, &e))
            DIE("chat template: %s", e.msg);
        if (tok_encode(tok, p, strlen(p), 1, 1, &prompts[i], &np[i], &e))
            DIE("encode: %s", e.msg);
        free(p);
    }
    /* the bench's own vocabulary for the end-to-end check */
    gr_vocab *v = NULL;
    {
        int nv = tok_n_vocab(tok), ne = 0;
        const char **tt = malloc((size_t)nv * sizeof *tt);
        uint32_t *tl = malloc((size_t)nv * sizeof *tl);
        int32_t *eos = malloc((size_t)nv * sizeof *eos);
        for (int i = 0; i < nv; i++) {
            size_t l;
            tt[i] = tok_piece(tok, i, 0, &l);
            tl[i] = tok_is_eog(tok, i) ? 0 : (uint32_t)l;
            if (tok_is_eog(tok, i))
                eos[ne++] = i;
        }
        if (gr_vocab_new(nv, tt, tl, eos, ne, &v, &e))
            DIE("vocab: %s", e.msg);
        free(tt);
        free(tl);
        free(eos);
    }
    /* the tokenizer outlives the runs' engines: the prompts and the vocabulary are made */
    md_engine_close(eng);
    /* constrained and unconstrained runs alternate; the best wall rate of each is kept */
    run_result c = {0}, u = {0};
    for (int k = 0; k < reps; k++) {
        run_result rc1 = run(&cfg, prompts, np, n, g, max_tokens, NULL, counts, v);
        run_result ru1 = run(&cfg, prompts, np, n, NULL, max_tokens, counts, NULL, NULL);
        printf("rep %d: constrained %.1f tok/s (%.1f per CPU s), unconstrained %.1f tok/s (%.1f "
               "per CPU s)\n",
               k, rc1.tokens / rc1.secs, rc1.tokens / rc1.cpu, ru1.tokens / ru1.secs,
               ru1.tokens / ru1.cpu);
        if (k == 0 || rc1.tokens / rc1.secs > c.tokens / c.secs)
            c = rc1;
        if (k == 0 || ru1.tokens / ru1.secs > u.tokens / u.secs)
            u = ru1;
    }
    double rc = c.tokens / c.secs, ru = u.tokens / u.secs;
    printf("model %s, %d sequences, max_tokens %d, schema compiled in %.2f ms\n", model, n,
           max_tokens, tc * 1e3);
    printf("constrained    %6ld tokens %5ld steps %8.3f s %8.1f tok/s  (%d stop, %d length)\n",
           c.tokens, c.steps, c.secs, rc, c.n_stop, c.n_length);
    printf("unconstrained  %6ld tokens %5ld steps %8.3f s %8.1f tok/s\n", u.tokens, u.steps, u.secs,
           ru);
    printf("mask time: %.1f us per mask, %.3f ms per step (%ld masks)\n",
           c.masks ? c.mask_ns / 1e3 / c.masks : 0.0, c.steps ? c.mask_ns / 1e6 / c.steps : 0.0,
           c.masks);
    printf("ratio constrained/unconstrained: %.3fx wall (target >= 0.95x), %.3fx per CPU second\n",
           rc / ru, (c.tokens / c.cpu) / (u.tokens / u.cpu));
    for (int i = 0; i < n; i++)
        free(prompts[i]);
    free(prompts);
    free(np);
    free(counts);
    gr_vocab_free(v);
    gr_free(g);
    return 0;
}
