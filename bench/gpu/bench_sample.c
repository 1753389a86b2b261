/* bench_sample.c — choosing the next token on one GPU for a batch of logit rows at Llama-3's
 * vocabulary (128256), what the engine's decode step ends with:
 *
 * - greedy: cuda_argmax;
 * - sampled: cuda_sample at temperature 0.8, top_k 50, top_p 0.9;
 * - penalised: the same with repetition 1.1, presence 0.3, frequency 0.3 over 512 distinct
 *   tokens per row (what a sequence of a few hundred tokens has), the chosen token's logprob
 *   and the 5 most likely tokens with theirs.
 *
 * The kernels alone: the parameters and penalty entries are on the device before timing (the
 * backend uploads them each step: 8 bytes per entry). The penalised case penalises the rows in
 * place at each launch, so later launches see drifted logits; the work per launch is the same.
 * Every token must come back inside the vocabulary.
 *
 * The peer on the same shapes is bench/gpu/torch_sample.py (PyTorch as transformers' logits
 * processors and vLLM's sampler do it); run-device-check.sh prints the ratios.
 *
 *   medley_sample_bench [--rows 1,256] [--vocab 128256] [--out FILE.json]
 *
 * Each figure is the best of 5 rounds of 10 launches after a warm-up. Prints one JSON object
 * (and writes it to --out). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/gpu/bench_gpu_util.h"
#include "common/util.h"
#include "kernels/cuda/cuda_ops.h"

#define N_PEN 512
#define N_TOP 5
#define ROUNDS 5
#define PER_ROUND 10

static md_err e;
#define TRY(call) BENCH_TRY("medley_sample_bench", e, call)

enum { GREEDY, SAMPLED, PENALISED, N_CASES };
static const char *case_name[N_CASES] = {"greedy", "sampled", "penalised"};

typedef struct {
    float *logits;
    int rows, vocab;
    cuda_sample_params *params[N_CASES]; /* device */
    cuda_sample_pen *pen;
    float *pen_raw, *lp, *top_lp;
    int32_t *tok, *top_tok;
} bufs;

static void launch(cuda_ctx *c, const bufs *b, int which) {
    if (which == GREEDY)
        TRY(cuda_argmax(c, b->logits, b->rows, b->vocab, b->tok, &e));
    else if (which == SAMPLED)
        TRY(cuda_sample(c, b->logits, b->rows, b->vocab, b->params[SAMPLED], NULL, NULL, b->tok,
                        NULL, NULL, NULL, &e));
    else
        TRY(cuda_sample(c, b->logits, b->rows, b->vocab, b->params[PENALISED], b->pen, b->pen_raw,
                        b->tok, b->lp, b->top_tok, b->top_lp, &e));
}

/* Best microseconds per launch. */
static double time_case(cuda_ctx *c, const bufs *b, int which) {
    launch(c, b, which);
    TRY(cuda_sync(c, &e));
    double best = 1e30;
    for (int r = 0; r < ROUNDS; r++) {
        uint64_t t0 = md_mono_ns();
        for (int i = 0; i < PER_ROUND; i++)
            launch(c, b, which);
        TRY(cuda_sync(c, &e));
        double t = (md_mono_ns() - t0) / 1e3 / PER_ROUND;
        best = t < best ? t : best;
    }
    return best;
}

/* One batch of rows: appends its JSON object to json. 0, or 1 after saying what failed. */
static int bench_rows(cuda_ctx *c, int rows, int vocab, char *json, size_t cap, int *used) {
    bufs b = {.rows = rows, .vocab = vocab};
    cuda_sample_params *hp = malloc((size_t)rows * sizeof *hp);
    cuda_sample_pen *hpen = malloc((size_t)rows * N_PEN * sizeof *hpen);
    int32_t *tok = malloc((size_t)rows * sizeof *tok);
    int32_t *top = malloc((size_t)rows * CUDA_SAMPLE_TOP * sizeof *top);
    if (!hp || !hpen || !tok || !top) {
        fprintf(stderr, "medley_sample_bench: out of host memory\n");
        return 1;
    }
    TRY(cuda_pool_alloc(c, (size_t)rows * vocab * 4, (void **)&b.logits, &e));
    TRY(cuda_pool_alloc(c, (size_t)rows * N_PEN * sizeof *hpen, (void **)&b.pen, &e));
    TRY(cuda_pool_alloc(c, (size_t)rows * N_PEN * 4, (void **)&b.pen_raw, &e));
    TRY(cuda_pool_alloc(c, (size_t)rows * 4, (void **)&b.tok, &e));
    TRY(cuda_pool_alloc(c, (size_t)rows * 4, (void **)&b.lp, &e));
    TRY(cuda_pool_alloc(c, (size_t)rows * CUDA_SAMPLE_TOP * 4, (void **)&b.top_tok, &e));
    TRY(cuda_pool_alloc(c, (size_t)rows * CUDA_SAMPLE_TOP * 4, (void **)&b.top_lp, &e));
    /* logits of a trained model's spread: uniform in [-12, 12) */
    TRY(cuda_fill_random(c, b.logits, CUDA_F32, (int64_t)rows * vocab, 12.0f, 7, &e));
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < N_PEN; j++) /* distinct per row, spread over the vocabulary */
            hpen[(size_t)r * N_PEN + j] = (cuda_sample_pen){
                (int32_t)(((int64_t)j * 2477 + (int64_t)r * 131) % vocab), j % 3};
    TRY(cuda_upload(c, b.pen, hpen, (size_t)rows * N_PEN * sizeof *hpen, &e));
    for (int k = SAMPLED; k <= PENALISED; k++) {
        for (int r = 0; r < rows; r++) {
            hp[r] = (cuda_sample_params){.temperature = 0.8f,
                                         .top_k = 50,
                                         .top_p = 0.9f,
                                         .u = (r + 0.5f) / rows,
                                         .repetition = 1.0f};
            if (k == PENALISED) {
                hp[r].repetition = 1.1f;
                hp[r].presence = 0.3f;
                hp[r].frequency = 0.3f;
                hp[r].pen_off = r * N_PEN;
                hp[r].pen_n = N_PEN;
                hp[r].n_top = N_TOP;
            }
        }
        TRY(cuda_pool_alloc(c, (size_t)rows * sizeof *hp, (void **)&b.params[k], &e));
        TRY(cuda_upload(c, b.params[k], hp, (size_t)rows * sizeof *hp, &e));
    }
    *used += snprintf(json + *used, cap - *used, "{\"rows\": %d", rows);
    for (int k = 0; k < N_CASES; k++) {
        double us = time_case(c, &b, k);
        TRY(cuda_download(c, tok, b.tok, (size_t)rows * 4, &e));
        for (int r = 0; r < rows; r++)
            if (tok[r] < 0 || tok[r] >= vocab) {
                fprintf(stderr, "medley_sample_bench: %s row %d: token %d outside the vocabulary\n",
                        case_name[k], r, tok[r]);
                return 1;
            }
        if (k == PENALISED) {
            TRY(cuda_download(c, top, b.top_tok, (size_t)rows * CUDA_SAMPLE_TOP * 4, &e));
            for (int r = 0; r < rows; r++)
                if (top[(size_t)r * CUDA_SAMPLE_TOP + N_TOP - 1] < 0 ||
                    top[(size_t)r * CUDA_SAMPLE_TOP + N_TOP] != -1) {
                    fprintf(stderr, "medley_sample_bench: row %d: top tokens not listed\n", r);
                    return 1;
                }
        }
        double gbps = (double)rows * vocab * 4 / (us * 1e-6) / 1e9;
        fprintf(stderr, "%d rows x %d, %s: %.1f us per launch (%.0f GB/s of logits once)\n",
                rows, vocab, case_name[k], us, gbps);
        *used += snprintf(json + *used, cap - *used, ", \"%s_us\": %.2f", case_name[k], us);
    }
    *used += snprintf(json + *used, cap - *used, "}");
    void *p[] = {b.logits, b.pen,    b.pen_raw,        b.tok,
                 b.lp,     b.top_tok, b.top_lp,        b.params[SAMPLED],
                 b.params[PENALISED]};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
        cuda_pool_free(c, p[i]);
    free(hp), free(hpen), free(tok), free(top);
    return 0;
}

int main(int argc, char **argv) {
    int rows[8] = {1, 256}, n_rows = 2, vocab = 128256;
    const char *out_path = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--rows") && i + 1 < argc) {
            n_rows = 0;
            for (char *t = strtok(argv[++i], ","); t && n_rows < 8; t = strtok(NULL, ","))
                rows[n_rows++] = atoi(t);
        } else if (!strcmp(argv[i], "--vocab") && i + 1 < argc) {
            vocab = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--out") && i + 1 < argc) {
            out_path = argv[++i];
        } else {
            fprintf(stderr,
                    "usage: medley_sample_bench [--rows R,R,...] [--vocab V] [--out FILE.json]\n");
            return 2;
        }
    }
    if (vocab < N_PEN || vocab > (1 << 24)) {
        fprintf(stderr, "medley_sample_bench: --vocab must be in %d..%d\n", N_PEN, 1 << 24);
        return 2;
    }
    for (int i = 0; i < n_rows; i++)
        if (rows[i] < 1 || rows[i] > 1024) {
            fprintf(stderr, "medley_sample_bench: --rows must be in 1..1024\n");
            return 2;
        }
    cuda_device_info info;
    cuda_ctx *c;
    int rc = bench_gpu_open("medley_sample_bench", &info, &c);
    if (rc)
        return rc;
    static char json[8192];
    char date[32];
    bench_utc_date(date, sizeof date);
    int used = snprintf(json, sizeof json,
                        "{\"bench\": \"medley_sample\", \"date\": \"%s\", \"device\": \"%s\", "
                        "\"vocab\": %d, \"penalty_entries\": %d, \"top_logprobs\": %d, "
                        "\"results\": [",
                        date, info.name, vocab, N_PEN, N_TOP);
    for (int i = 0; i < n_rows; i++) {
        if (i)
            used += snprintf(json + used, sizeof json - used, ", ");
        if ((rc = bench_rows(c, rows[i], vocab, json, sizeof json, &used)))
            return rc;
    }
    snprintf(json + used, sizeof json - used, "]}");
    cuda_ctx_close(c);
    return bench_emit_json("medley_sample_bench", json, out_path);
}
