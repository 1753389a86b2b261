/* hf_encoder.c — config.json and tensor names of encoder checkpoints (the BERT family) for
 * hf_config.h: a table of what each encoder model_type is (today BERT: absolute positions,
 * token types, post-LayerNorm, exact GELU) and the tensor names as llama.cpp's converter
 * writes the GGUF `bert` architecture, so an HF directory and a converted GGUF load the
 * same way (engine/model/encoder.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/weights/hf_config.h"

/* Integer key in lo..hi; absent leaves *out unless required. */
static int enc_int(json_t *o, const char *where, const char *key, int required, long long lo,
                   long long hi, int *out, md_err *e) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v))
        return required ? md_errf(e, MD_EFORMAT, "%s: \"%s\" is missing", where, key) : 0;
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return md_errf(e, MD_EFORMAT, "%s: \"%s\" must be an integer in %lld..%lld", where, key, lo,
                       hi);
    *out = (int)json_integer_value(v);
    return 0;
}

/* A string key that must be one value when present. */
static int enc_want(json_t *o, const char *where, const char *key, const char *want, md_err *e) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v))
        return 0;
    const char *s = json_string_value(v);
    if (!s || strcmp(s, want))
        return md_errf(e, MD_EUNSUPP, "%s: %s \"%.32s\" is not supported (\"%s\" is)", where, key,
                       s ? s : "(not a string)", want);
    return 0;
}

int hf_encoder_parse(json_t *o, const char *where, hf_config *c, md_err *e) {
    int rc;
    c->encoder = 1;
    c->n_types = 2;
    c->eps = 1e-12;
    if ((rc = enc_int(o, where, "num_hidden_layers", 1, 1, 1024, &c->n_layer, e)) ||
        (rc = enc_int(o, where, "hidden_size", 1, 1, 65536, &c->n_embd, e)) ||
        (rc = enc_int(o, where, "num_attention_heads", 1, 1, 1024, &c->n_head, e)) ||
        (rc = enc_int(o, where, "intermediate_size", 1, 1, 1 << 20, &c->n_ff, e)) ||
        (rc = enc_int(o, where, "vocab_size", 1, 1, 1 << 24, &c->n_vocab, e)) ||
        (rc = enc_int(o, where, "max_position_embeddings", 1, 1, 1 << 20, &c->n_ctx, e)) ||
        (rc = enc_int(o, where, "type_vocab_size", 0, 0, 1 << 16, &c->n_types, e)) ||
        (rc = enc_want(o, where, "hidden_act", "gelu", e)) ||
        (rc = enc_want(o, where, "position_embedding_type", "absolute", e)))
        return rc;
    json_t *eps = json_object_get(o, "layer_norm_eps");
    if (eps && !json_is_null(eps)) {
        if (!json_is_number(eps) || !(json_number_value(eps) > 0) || json_number_value(eps) > 1)
            return md_errf(e, MD_EFORMAT, "%s: \"layer_norm_eps\" must be a number in (0, 1]",
                           where);
        c->eps = json_number_value(eps);
    }
    if (c->n_embd % c->n_head)
        return md_errf(e, MD_EFORMAT, "%s: hidden_size %d does not divide into %d heads", where,
                       c->n_embd, c->n_head);
    c->n_head_kv = c->n_head;
    c->head_dim = c->n_embd / c->n_head;
    return 0;
}

/* HF suffix -> GGUF name: the embeddings, then per-layer suffixes of encoder.layer.N. */
static const struct {
    const char *hf, *gguf;
} enc_top[] =
    {
        {"embeddings.word_embeddings.weight", "token_embd.weight"},
        {"embeddings.position_embeddings.weight", "position_embd.weight"},
        {"embeddings.token_type_embeddings.weight", "token_types.weight"},
        {"embeddings.LayerNorm.weight", "token_embd_norm.weight"},
        {"embeddings.LayerNorm.bias", "token_embd_norm.bias"},
},
  enc_layer[] = {
      {"attention.self.query.weight", "attn_q.weight"},
      {"attention.self.query.bias", "attn_q.bias"},
      {"attention.self.key.weight", "attn_k.weight"},
      {"attention.self.key.bias", "attn_k.bias"},
      {"attention.self.value.weight", "attn_v.weight"},
      {"attention.self.value.bias", "attn_v.bias"},
      {"attention.output.dense.weight", "attn_output.weight"},
      {"attention.output.dense.bias", "attn_output.bias"},
      {"attention.output.LayerNorm.weight", "attn_output_norm.weight"},
      {"attention.output.LayerNorm.bias", "attn_output_norm.bias"},
      {"intermediate.dense.weight", "ffn_up.weight"},
      {"intermediate.dense.bias", "ffn_up.bias"},
      {"output.dense.weight", "ffn_down.weight"},
      {"output.dense.bias", "ffn_down.bias"},
      {"output.LayerNorm.weight", "layer_output_norm.weight"},
      {"output.LayerNorm.bias", "layer_output_norm.bias"},
};

int hf_encoder_tensor_name(const hf_config *c, const char *hf, char *gguf, size_t gguf_sz) {
    const char *r = !strncmp(hf, "bert.", 5) ? hf + 5 : hf;
    /* position_ids is a buffer; the pooler and a masked-LM head are not sentence embeddings */
    if (!strcmp(r, "embeddings.position_ids") || !strncmp(r, "pooler.", 7) ||
        !strncmp(hf, "cls.", 4))
        return 0;
    for (size_t i = 0; i < sizeof enc_top / sizeof enc_top[0]; i++)
        if (!strcmp(r, enc_top[i].hf)) {
            snprintf(gguf, gguf_sz, "%s", enc_top[i].gguf);
            return 1;
        }
    if (strncmp(r, "encoder.layer.", 14) || r[14] < '0' || r[14] > '9' ||
        (r[14] == '0' && r[15] != '.'))
        return -1;
    int l = 0, n = 14;
    while (r[n] >= '0' && r[n] <= '9' && l < c->n_layer)
        l = l * 10 + (r[n++] - '0');
    if (r[n] != '.' || l >= c->n_layer)
        return -1;
    for (size_t i = 0; i < sizeof enc_layer / sizeof enc_layer[0]; i++)
        if (!strcmp(r + n + 1, enc_layer[i].hf)) {
            snprintf(gguf, gguf_sz, "blk.%d.%s", l, enc_layer[i].gguf);
            return 1;
        }
    return -1;
}
