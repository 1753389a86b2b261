/* tokenizer_gguf.c — a vocabulary from a GGUF file's tokenizer.ggml.* keys (tok_load): the
 * tokens with their scores and types, BPE merges and the pre-tokenizer family, special token
 * ids, end-of-generation tokens and the chat template.
 *
 * Behaviour follows llama.cpp's llama-vocab.cpp (facts only, our own code): token attributes
 * from tokenizer.ggml.token_type, duplicate strings resolve to the last id, special-token
 * defaults per tokenizer kind.
 *
 * Memory: everything a tokenizer needs is copied out of the file; tok_free releases it. */
#include "engine/tokenizer/tokenizer_bpe.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
/* Read an optional token id key; keeps *id when absent or out of range. */
static int opt_id(const gguf_file *f, const char *key, int32_t *id, int n_vocab, md_err *e) {
    uint64_t v;
    md_err tmp;
    int rc = gguf_get_u64(f, key, &v, &tmp);
    if (rc == MD_ENOTFOUND)
        return 0;
    if (rc) {
        *e = tmp;
        return rc;
    }
    if (v >= (uint64_t)n_vocab)
        MD_WARN("tokenizer", "%s = %llu is past the %d tokens; using default %d", key,
                (unsigned long long)v, n_vocab, *id);
    else
        *id = (int32_t)v;
    return 0;
}

static int opt_bool(const gguf_file *f, const char *key, int *val, md_err *e) {
    md_err tmp;
    int b, rc = gguf_get_bool(f, key, &b, &tmp);
    if (rc == MD_ENOTFOUND)
        return 0;
    if (rc) {
        *e = tmp;
        return rc;
    }
    *val = b;
    return 0;
}

static int load_vocab(tok_tokenizer *t, const gguf_file *f, md_err *e) {
    gguf_vtype et;
    uint64_t n;
    int rc = gguf_get_arr(f, "tokenizer.ggml.tokens", &et, &n, e);
    if (rc == MD_ENOTFOUND)
        return md_errf(e, MD_EFORMAT, "no tokenizer.ggml.tokens in the model file");
    if (rc)
        return rc;
    if (et != GGUF_T_STRING)
        return md_errf(e, MD_EFORMAT, "tokenizer.ggml.tokens is not an array of strings");
    if (n == 0 || n > INT32_MAX / 4)
        return md_errf(e, MD_EFORMAT, "tokenizer.ggml.tokens has %llu entries",
                       (unsigned long long)n);
    t->n_vocab = (int)n;
    for (uint64_t i = 0; i < n; i++) {
        const char *s;
        size_t len;
        char empty[32];
        if ((rc = gguf_arr_str(f, "tokenizer.ggml.tokens", i, &s, &len, e)))
            return rc;
        if (len == 0) { /* as llama.cpp: an empty token gets a placeholder text */
            len = (size_t)snprintf(empty, sizeof empty, "[EMPTY_%llu]", (unsigned long long)i);
            s = empty;
        }
        int32_t id;
        if ((rc = tok_strtab_add(t, s, len, &id)))
            return md_errf(e, rc, "out of memory reading tokenizer.ggml.tokens");
    }
    if ((rc = tok_index_strings(t)))
        return md_errf(e, rc, "out of memory indexing the vocabulary");

    t->scores = calloc(n, sizeof *t->scores);
    t->attr = calloc(n, 1);
    t->is_eog = calloc(n, 1);
    if (!t->scores || !t->attr || !t->is_eog)
        return md_errf(e, MD_ENOMEM, "out of memory reading the vocabulary");
    const void *data;
    uint64_t m;
    if (gguf_get_arr(f, "tokenizer.ggml.scores", &et, &m, e) == 0) {
        if (et != GGUF_T_FLOAT32 || m != n)
            return md_errf(e, MD_EFORMAT,
                           "tokenizer.ggml.scores: expected %llu float32, found %llu of type %d",
                           (unsigned long long)n, (unsigned long long)m, (int)et);
        if ((rc = gguf_arr_data(f, "tokenizer.ggml.scores", &data, e)))
            return rc;
        memcpy(t->scores, data, n * sizeof(float));
    }
    for (uint64_t i = 0; i < n; i++)
        t->attr[i] = TOK_A_NORMAL;
    if (gguf_get_arr(f, "tokenizer.ggml.token_type", &et, &m, e) == 0) {
        if ((et != GGUF_T_INT32 && et != GGUF_T_UINT32) || m != n)
            return md_errf(e, MD_EFORMAT,
                           "tokenizer.ggml.token_type: expected %llu int32, found %llu of type %d",
                           (unsigned long long)n, (unsigned long long)m, (int)et);
        if ((rc = gguf_arr_data(f, "tokenizer.ggml.token_type", &data, e)))
            return rc;
        for (uint64_t i = 0; i < n; i++) {
            int32_t ty;
            memcpy(&ty, (const char *)data + i * 4, 4);
            switch (ty) {
            case 1: t->attr[i] = TOK_A_NORMAL; break;
            case 2: t->attr[i] = TOK_A_UNKNOWN; break;
            case 3: t->attr[i] = TOK_A_CONTROL; break;
            case 4: t->attr[i] = TOK_A_USER; break;
            case 5: t->attr[i] = TOK_A_UNUSED; break;
            case 6: t->attr[i] = TOK_A_BYTE; break;
            default: t->attr[i] = 0; break; /* undefined */
            }
        }
    }
    md_err_clear(e);
    return 0;
}

static int load_merges(tok_tokenizer *t, const gguf_file *f, md_err *e) {
    gguf_vtype et;
    uint64_t n;
    int rc = gguf_get_arr(f, "tokenizer.ggml.merges", &et, &n, e);
    if (rc == MD_ENOTFOUND)
        return md_errf(e, MD_EFORMAT, "BPE tokenizer without tokenizer.ggml.merges");
    if (rc)
        return rc;
    if (et != GGUF_T_STRING)
        return md_errf(e, MD_EFORMAT, "tokenizer.ggml.merges is not an array of strings");
    if (n > INT32_MAX / 4)
        return md_errf(e, MD_EFORMAT, "tokenizer.ggml.merges has %llu entries",
                       (unsigned long long)n);
    if (tok_merges_alloc(t, (size_t)n))
        return md_errf(e, MD_ENOMEM, "out of memory reading merges");
    for (uint64_t i = 0; i < n; i++) {
        const char *s;
        size_t len;
        if ((rc = gguf_arr_str(f, "tokenizer.ggml.merges", i, &s, &len, e)))
            return rc;
        /* "left right", split at the first space after the first byte (as llama.cpp) */
        const char *sp = len > 1 ? memchr(s + 1, ' ', len - 1) : NULL;
        if (!sp)
            continue;
        size_t ll = (size_t)(sp - s), rl = len - ll - 1;
        int32_t l, r, m;
        if (tok_str_intern(t, s, ll, &l) || tok_str_intern(t, sp + 1, rl, &r))
            return md_errf(e, MD_ENOMEM, "out of memory reading merges");
        char buf[512], *cat = ll + rl <= sizeof buf ? buf : malloc(ll + rl);
        if (!cat)
            return md_errf(e, MD_ENOMEM, "out of memory reading merges");
        memcpy(cat, s, ll);
        memcpy(cat + ll, sp + 1, rl);
        rc = tok_str_intern(t, cat, ll + rl, &m);
        if (cat != buf)
            free(cat);
        if (rc)
            return md_errf(e, MD_ENOMEM, "out of memory reading merges");
        tok_merge_put(t, l, r, (int32_t)i, m, 0); /* first rank wins (llama.cpp's emplace) */
    }
    md_err_clear(e);
    return 0;
}

static const struct {
    const char *name;
    tok_pre pre;
} k_pre_names[] = {
    {"default", TOK_PRE_DEFAULT},  {"llama3", TOK_PRE_LLAMA3},
    {"llama-v3", TOK_PRE_LLAMA3},  {"llama-bpe", TOK_PRE_LLAMA3},
    {"falcon3", TOK_PRE_LLAMA3},   {"pixtral", TOK_PRE_LLAMA3},
    {"dbrx", TOK_PRE_LLAMA3},      {"smaug-bpe", TOK_PRE_LLAMA3},
    {"gpt-2", TOK_PRE_GPT2},       {"gpt2", TOK_PRE_GPT2},
    {"phi-2", TOK_PRE_GPT2},       {"mpt", TOK_PRE_GPT2},
    {"olmo", TOK_PRE_GPT2},        {"jais", TOK_PRE_GPT2},
    {"qwen2", TOK_PRE_QWEN2},      {"deepseek-r1-qwen", TOK_PRE_QWEN2},
    {"megrez", TOK_PRE_QWEN2},     {"stablelm2", TOK_PRE_QWEN2},
    {"smollm", TOK_PRE_SMOLLM},    {"starcoder", TOK_PRE_SMOLLM},
    {"refact", TOK_PRE_SMOLLM},    {"command-r", TOK_PRE_SMOLLM},
    {"codeshell", TOK_PRE_SMOLLM}, {"exaone", TOK_PRE_SMOLLM},
};

/* A BPE vocabulary's pre-tokenizer (tokenizer.ggml.pre, known names only), merges, byte
 * tables and merge index. */
static int load_bpe(tok_tokenizer *t, const gguf_file *f, md_err *e) {
    const char *s;
    size_t len;
    int rc;
    snprintf(t->pre_name, sizeof t->pre_name, "default");
    t->pre = TOK_PRE_DEFAULT;
    if (gguf_get_str(f, "tokenizer.ggml.pre", &s, &len, e) == 0) {
        int known = 0;
        for (int i = 0; i < TOK_NELEM(k_pre_names); i++)
            if (strlen(k_pre_names[i].name) == len && !memcmp(k_pre_names[i].name, s, len)) {
                t->pre = k_pre_names[i].pre;
                snprintf(t->pre_name, sizeof t->pre_name, "%s", k_pre_names[i].name);
                known = 1;
            }
        if (!known) /* as llama.cpp: a wrong split is worse than no model */
            return md_errf(e, MD_EUNSUPP,
                           "tokenizer.ggml.pre '%.*s' is not a supported pre-tokenizer (gpt-2, "
                           "llama-bpe, qwen2, smollm, starcoder, default and their aliases)",
                           (int)(len > 64 ? 64 : len), s);
    }
    t->ignore_merges = t->pre == TOK_PRE_LLAMA3;
    if (t->pre == TOK_PRE_LLAMA3)
        t->add_bos = 1;
    if ((rc = load_merges(t, f, e)))
        return rc;
    tok_byte_tables(t);
    return tok_bpe_init(t, e);
}

/* The special token ids and the add_bos / add_eos flags the file gives (each optional). */
static int load_special_ids(tok_tokenizer *t, const gguf_file *f, md_err *e) {
    int rc;
    struct {
        const char *key;
        int32_t *id;
    } ids[] = {
        {"tokenizer.ggml.bos_token_id", &t->bos},     {"tokenizer.ggml.eos_token_id", &t->eos},
        {"tokenizer.ggml.eot_token_id", &t->eot},     {"tokenizer.ggml.eom_token_id", &t->eom},
        {"tokenizer.ggml.unknown_token_id", &t->unk},
    };
    for (int i = 0; i < TOK_NELEM(ids); i++)
        if ((rc = opt_id(f, ids[i].key, ids[i].id, t->n_vocab, e)))
            return rc;
    if (t->bos >= t->n_vocab)
        t->bos = -1;
    if (t->eos >= t->n_vocab)
        t->eos = -1;
    if (t->unk >= t->n_vocab)
        t->unk = -1;
    if ((rc = opt_bool(f, "tokenizer.ggml.add_bos_token", &t->add_bos, e)) ||
        (rc = opt_bool(f, "tokenizer.ggml.add_eos_token", &t->add_eos, e)))
        return rc;
    return 0;
}

/* End of generation, found by text as llama.cpp does; such tokens become control. */
static int mark_eog(tok_tokenizer *t, const gguf_file *f, md_err *e) {
    int rc;
    int32_t fim[3] = {-1, -1, -1};
    const char *fim_keys[3] = {"tokenizer.ggml.fim_pad_token_id", "tokenizer.ggml.fim_rep_token_id",
                               "tokenizer.ggml.fim_sep_token_id"};
    for (int i = 0; i < 3; i++)
        if ((rc = opt_id(f, fim_keys[i], &fim[i], t->n_vocab, e)))
            return rc;
    tok_mark_eog(t, fim, 1);
    return 0;
}

/* A copy of tokenizer.chat_template, when the file has one. */
static int copy_chat_template(tok_tokenizer *t, const gguf_file *f, md_err *e) {
    const char *s;
    size_t len;
    if (gguf_get_str(f, "tokenizer.chat_template", &s, &len, e) == 0)
        return tok_set_chat_template(t, s, len, e);
    return 0;
}
int tok_load(const gguf_file *f, tok_tokenizer **out, md_err *e) {
    *out = NULL;
    const char *s;
    size_t len;
    int rc = gguf_get_str(f, "tokenizer.ggml.model", &s, &len, e);
    if (rc == MD_ENOTFOUND)
        return md_errf(e, MD_EFORMAT, "no tokenizer.ggml.model in the model file");
    if (rc)
        return rc;
    tok_tokenizer *t = calloc(1, sizeof *t);
    if (!t)
        return md_errf(e, MD_ENOMEM, "out of memory loading the tokenizer");
    if (len == 4 && !memcmp(s, "gpt2", 4)) {
        t->kind = TOK_KIND_BPE;
        t->bos = 11, t->eos = 11, t->unk = -1; /* llama.cpp's defaults for gpt2 */
    } else if (len == 5 && !memcmp(s, "llama", 5)) {
        t->kind = TOK_KIND_SPM;
        t->bos = 1, t->eos = 2, t->unk = 0;
        t->add_bos = 1;
        t->add_space_prefix = 1;
    } else {
        rc = md_errf(e, MD_EUNSUPP,
                     "tokenizer.ggml.model '%.*s' is not supported (expected gpt2 or llama)",
                     (int)(len > 64 ? 64 : len), s);
        free(t);
        return rc;
    }
    snprintf(t->model_name, sizeof t->model_name, "%s", t->kind == TOK_KIND_BPE ? "gpt2" : "llama");
    t->eot = t->eom = -1;
    if ((rc = load_vocab(t, f, e)))
        goto fail;

    if (t->kind == TOK_KIND_BPE) {
        if ((rc = load_bpe(t, f, e)))
            goto fail;
    } else {
        tok_spm_byte_tokens(t);
    }
    if ((rc = opt_bool(f, "tokenizer.ggml.add_space_prefix", &t->add_space_prefix, e)))
        goto fail;
    if ((rc = load_special_ids(t, f, e)) || (rc = mark_eog(t, f, e)) ||
        (rc = tok_list_special(t, e)))
        goto fail;
    if ((rc = tok_build_pieces(t))) {
        rc = md_errf(e, rc, "out of memory building token pieces");
        goto fail;
    }
    if ((rc = copy_chat_template(t, f, e)))
        goto fail;
    md_err_clear(e);
    *out = t;
    return 0;
fail:
    tok_free(t);
    return rc;
}