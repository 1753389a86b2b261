/* model.c — model cards: the shape numbers the performance model needs (layers, widths,
 * heads, vocabulary, bytes per weight), built in for well-known models or read from a card. */
#include <math.h>
#include <string.h>
#include <strings.h>

#include "common/util.h"
#include "scheduler/sched.h"

/* Shapes from each model's config.json on Hugging Face (meta-llama/Meta-Llama-3-8B,
 * meta-llama/Meta-Llama-3-70B, meta-llama/Llama-2-7b-hf, meta-llama/Llama-2-70b-hf,
 * mistralai/Mistral-7B-v0.1, Qwen/Qwen2-7B, Qwen/Qwen2-72B,
 * HuggingFaceTB/SmolLM2-135M-Instruct, sentence-transformers/all-MiniLM-L6-v2). */
static const sched_model builtins[] = {
    {"llama-3-8b", 32, 4096, 32, 8, 14336, 128256, 0, 2.0, 2.0, 8192, 0},
    {"llama-3-70b", 80, 8192, 64, 8, 28672, 128256, 0, 2.0, 2.0, 8192, 0},
    {"llama-2-7b", 32, 4096, 32, 32, 11008, 32000, 0, 2.0, 2.0, 4096, 0},
    {"llama-2-13b", 40, 5120, 40, 40, 13824, 32000, 0, 2.0, 2.0, 4096, 0},
    {"llama-2-70b", 80, 8192, 64, 8, 28672, 32000, 0, 2.0, 2.0, 4096, 0},
    {"mistral-7b", 32, 4096, 32, 8, 14336, 32000, 0, 2.0, 2.0, 32768, 0},
    {"qwen2-7b", 28, 3584, 28, 4, 18944, 152064, 0, 2.0, 2.0, 32768, 0},
    {"qwen2-72b", 80, 8192, 64, 8, 29568, 152064, 0, 2.0, 2.0, 32768, 0},
    {"smollm2-135m", 30, 576, 9, 3, 1536, 49152, 1, 0.625, 2.0, 8192, 0},
    /* sentence-transformers/all-MiniLM-L6-v2 (config.json; F32 safetensors as the registry
     * fetches it; max_seq_length 256 from sentence_bert_config.json) */
    {"all-minilm-l6-v2", 6, 384, 12, 12, 1536, 30522, 1, 4.0, 2.0, 256, SCHED_EMBED_ENCODER},
};

double sched_quant_bytes(const char *q) {
    static const struct {
        const char *name;
        double bytes;
    } t[] = {{"F32", 4},
             {"F16", 2},
             {"BF16", 2},
             {"FP16", 2},
             {"FP8", 1},
             {"INT8", 1},
             {"INT4", 0.5},
             {"Q8_0", 34.0 / 32},
             {"Q4_0", 18.0 / 32},
             {"Q4_1", 20.0 / 32},
             {"Q4_K", 144.0 / 256},
             {"Q4_K_M", 144.0 / 256},
             {"Q5_K", 176.0 / 256},
             {"Q6_K", 210.0 / 256}};
    for (size_t i = 0; q && i < sizeof t / sizeof *t; i++)
        if (!strcasecmp(q, t[i].name))
            return t[i].bytes;
    return 0;
}

int sched_model_builtin(const char *name, sched_model *m, md_err *e) {
    for (size_t i = 0; i < sizeof builtins / sizeof *builtins; i++)
        if (!strcasecmp(name, builtins[i].name)) {
            *m = builtins[i];
            return 0;
        }
    char known[512];
    size_t at = 0;
    for (size_t i = 0; i < sizeof builtins / sizeof *builtins; i++)
        at += (size_t)snprintf(known + at, sizeof known - at, "%s%s", i ? ", " : "",
                               builtins[i].name);
    return md_errf(e, MD_ENOTFOUND,
                   "unknown model '%s': give an inline card (layers, hidden, heads, ...) or one "
                   "of the built-in shapes: %s",
                   name, known);
}

int sched_model_from_json(json_t *card, sched_model *m, const char *where, md_err *e) {
    const char *name = NULL, *quant = NULL;
    memset(m, 0, sizeof *m);
    if (md_json_get_str(card, "name", 1, &name, where, e))
        return e->code;
    if (strlen(name) >= SCHED_NAME)
        return md_errf(e, MD_EINVAL, "%s.name is longer than %d characters", where, SCHED_NAME - 1);
    /* A card naming only a built-in model (maybe with a quant) starts from its shape. */
    json_t *layers = json_object_get(card, "layers");
    if (!layers) {
        if (sched_model_builtin(name, m, e))
            return md_errctx(e, "%s: ", where);
    } else {
        snprintf(m->name, sizeof m->name, "%s", name);
        m->bytes_per_weight = 2.0;
        m->kv_bytes = 2.0;
        m->max_context = 4096;
    }
    struct {
        const char *k;
        int *dst;
        long long lo, hi;
    } ints[] = {{"layers", &m->layers, 1, 1024},
                {"hidden", &m->hidden, 8, 1 << 18},
                {"heads", &m->heads, 1, 4096},
                {"kv_heads", &m->kv_heads, 1, 4096},
                {"ffn", &m->ffn, 1, 1 << 20},
                {"vocab", &m->vocab, 1, 1 << 24},
                {"max_context", &m->max_context, 16, 1 << 24}};
    for (size_t i = 0; i < sizeof ints / sizeof *ints; i++) {
        long long v = *ints[i].dst;
        int required = layers && strcmp(ints[i].k, "max_context") != 0;
        if (md_json_get_int(card, ints[i].k, required, &v, where, e))
            return e->code;
        if (v < ints[i].lo || v > ints[i].hi)
            return md_errf(e, MD_EINVAL, "%s.%s must be in [%lld, %lld], got %lld", where,
                           ints[i].k, ints[i].lo, ints[i].hi, v);
        *ints[i].dst = (int)v;
    }
    if (m->hidden % m->heads || m->heads % m->kv_heads)
        return md_errf(e, MD_EINVAL,
                       "%s: hidden (%d) must divide by heads (%d) and heads by kv_heads (%d)",
                       where, m->hidden, m->heads, m->kv_heads);
    int tied = m->tied_embeddings;
    if (md_json_get_bool(card, "tied_embeddings", 0, &tied, where, e))
        return e->code;
    m->tied_embeddings = tied;
    const char *emb = NULL;
    if (md_json_get_str(card, "embedding", 0, &emb, where, e))
        return e->code;
    if (emb && !strcmp(emb, "encoder"))
        m->embedding = SCHED_EMBED_ENCODER;
    else if (emb && !strcmp(emb, "last_token"))
        m->embedding = SCHED_EMBED_DECODER;
    else if (emb)
        return md_errf(e, MD_EINVAL,
                       "%s.embedding is '%s': \"encoder\" (a BERT-family embedding model) or "
                       "\"last_token\" (a decoder pooled at its last token)",
                       where, emb);
    if (md_json_get_str(card, "quant", 0, &quant, where, e))
        return e->code;
    if (quant) {
        m->bytes_per_weight = sched_quant_bytes(quant);
        if (m->bytes_per_weight <= 0)
            return md_errf(e, MD_EINVAL,
                           "%s.quant '%s' is unknown (F32, F16, BF16, FP8, INT8, INT4, Q8_0, "
                           "Q4_0, Q4_1, Q4_K, Q5_K, Q6_K; or give bytes_per_weight)",
                           where, quant);
    }
    if (md_json_get_num(card, "bytes_per_weight", 0, &m->bytes_per_weight, where, e) ||
        md_json_get_num(card, "kv_bytes", 0, &m->kv_bytes, where, e))
        return e->code;
    if (!(m->bytes_per_weight > 0 && m->bytes_per_weight <= 8) ||
        !(m->kv_bytes > 0 && m->kv_bytes <= 8))
        return md_errf(e, MD_EINVAL, "%s: bytes_per_weight and kv_bytes must be in (0, 8]", where);
    return 0;
}

json_t *sched_model_to_json(const sched_model *m) {
    json_t *j = json_pack(
        "{s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:b, s:f, s:f, s:i}", "name", m->name, "layers",
        m->layers, "hidden", m->hidden, "heads", m->heads, "kv_heads", m->kv_heads, "ffn", m->ffn,
        "vocab", m->vocab, "tied_embeddings", m->tied_embeddings, "bytes_per_weight",
        m->bytes_per_weight, "kv_bytes", m->kv_bytes, "max_context", m->max_context);
    if (j && m->embedding)
        json_object_set_new(
            j, "embedding",
            json_string(m->embedding == SCHED_EMBED_ENCODER ? "encoder" : "last_token"));
    return j;
}

double sched_model_layer_params(const sched_model *m) {
    double h = m->hidden, hd = (double)m->hidden / m->heads;
    if (m->embedding == SCHED_EMBED_ENCODER) /* q, k, v, o; up and down; biases; 2 LayerNorms */
        return 4 * h * h + 2 * h * m->ffn + 9 * h + m->ffn;
    double attn = 2 * h * h + 2 * h * m->kv_heads * hd; /* q, o; k, v */
    return attn + 3 * h * m->ffn + 2 * h;               /* SwiGLU gate/up/down; 2 norms */
}

double sched_model_embed_params(const sched_model *m) {
    return (double)m->vocab * m->hidden;
}

double sched_model_head_params(const sched_model *m) {
    if (m->embedding) /* pooled on the host: no lm_head runs */
        return 0;
    return m->tied_embeddings ? 0 : (double)m->vocab * m->hidden;
}

double sched_model_params(const sched_model *m) {
    return m->layers * sched_model_layer_params(m) + sched_model_embed_params(m) +
           sched_model_head_params(m) + m->hidden;
}

double sched_model_kv_bytes_per_token_layer(const sched_model *m) {
    if (m->embedding) /* nothing is kept between steps */
        return 0;
    return 2.0 * m->kv_heads * ((double)m->hidden / m->heads) * m->kv_bytes;
}
