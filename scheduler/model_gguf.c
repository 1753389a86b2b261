/* model_gguf.c — a model card from a GGUF file's metadata (llama-family keys under the
 * file's general.architecture) and tensor directory (vocabulary from token_embd, tied
 * embeddings when there is no output.weight, bytes per weight from the tensors' sizes); the
 * `bert` architecture is an embedding model. */
#include <stdint.h>
#include <string.h>

#include "engine/weights/gguf.h"
#include "engine/weights/hf_model.h"
#include "scheduler/sched.h"

static int get_int(const gguf_file *g, const char *arch, const char *key, int required,
                   int64_t *out, md_err *e) {
    char k[128];
    snprintf(k, sizeof k, "%s.%s", arch, key);
    int rc = gguf_get_i64(g, k, out, e);
    if (rc == MD_ENOTFOUND && !required)
        return 0;
    if (rc)
        return md_errf(e, rc == MD_ENOTFOUND ? MD_EFORMAT : rc, "GGUF key %s: %s", k,
                       rc == MD_ENOTFOUND ? "missing" : e->msg);
    return 0;
}

int sched_model_from_gguf(const char *path, const char *name, sched_model *m, md_err *e) {
    gguf_file *g = NULL;
    memset(m, 0, sizeof *m);
    if (md_model_open(path, &g, e))
        return md_errctx(e, "model card from %s: ", path);
    int rc = 0;
    const char *s;
    size_t n;
    char arch[64];
    if ((rc = gguf_get_str(g, "general.architecture", &s, &n, e)))
        goto out;
    snprintf(arch, sizeof arch, "%.*s", (int)(n < 63 ? n : 63), s);
    int64_t layers = 0, hidden = 0, heads = 0, kv = 0, ffn = 0, ctx = 4096;
    if ((rc = get_int(g, arch, "block_count", 1, &layers, e)) ||
        (rc = get_int(g, arch, "embedding_length", 1, &hidden, e)) ||
        (rc = get_int(g, arch, "attention.head_count", 1, &heads, e)) ||
        (rc = get_int(g, arch, "feed_forward_length", 1, &ffn, e)) ||
        (rc = get_int(g, arch, "context_length", 0, &ctx, e)))
        goto out;
    kv = heads;
    if ((rc = get_int(g, arch, "attention.head_count_kv", 0, &kv, e)))
        goto out;
    const gguf_tensor *emb = gguf_find_tensor(g, "token_embd.weight");
    if (!emb || emb->n_dims != 2) {
        rc = md_errf(e, MD_EFORMAT, "%s: no 2-D token_embd.weight tensor", path);
        goto out;
    }
    double bytes = 0, elems = 0;
    for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i);
        bytes += (double)t->n_bytes;
        elems += (double)t->n_elements;
    }
    if (name && *name)
        snprintf(m->name, sizeof m->name, "%s", name);
    else if (gguf_get_str(g, "general.name", &s, &n, NULL) == 0)
        snprintf(m->name, sizeof m->name, "%.*s", (int)(n < SCHED_NAME - 1 ? n : SCHED_NAME - 1),
                 s);
    else
        snprintf(m->name, sizeof m->name, "%s", arch);
    m->layers = (int)layers;
    m->hidden = (int)hidden;
    m->heads = (int)heads;
    m->kv_heads = (int)kv;
    m->ffn = (int)ffn;
    m->vocab = (int)emb->ne[1];
    m->tied_embeddings = gguf_find_tensor(g, "output.weight") == NULL;
    m->bytes_per_weight = elems > 0 ? bytes / elems : 2.0;
    m->kv_bytes = 2.0;
    m->max_context = (int)ctx;
    /* llama.cpp's `bert` (and an HF BertModel directory presented as it): an embedding model
     * (docs/embeddings.md, "Scheduling and cost"); its limit is the position table's */
    if (!strcmp(arch, "bert"))
        m->embedding = SCHED_EMBED_ENCODER;
    if (layers < 1 || layers > 1024 || hidden < 8 || heads < 1 || kv < 1 || hidden % heads ||
        heads % kv || ffn < 1 || ctx < 16 || m->vocab < 1)
        rc = md_errf(e, MD_EFORMAT,
                     "%s: implausible shape (layers %lld, hidden %lld, heads %lld, kv heads %lld, "
                     "ffn %lld, context %lld)",
                     path, (long long)layers, (long long)hidden, (long long)heads, (long long)kv,
                     (long long)ffn, (long long)ctx);
out:
    gguf_close(g);
    return rc;
}
