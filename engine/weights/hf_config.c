/* hf_config.c — config.json to hf_config, and HF tensor names to GGUF names. */
#include "engine/weights/hf_config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Integer key: JSON null or absent leaves *out (0 returned) unless required. */
static int get_int(json_t *o, const char *where, const char *key, int required, long long lo,
                   long long hi, int *out, md_err *e) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        if (required)
            return md_errf(e, MD_EFORMAT, "%s: \"%s\" is missing", where, key);
        return 0;
    }
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return md_errf(e, MD_EFORMAT, "%s: \"%s\" must be an integer in %lld..%lld", where, key, lo,
                       hi);
    *out = (int)json_integer_value(v);
    return 0;
}

static int get_num(json_t *o, const char *where, const char *key, double *out, md_err *e) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_number(v) || !isfinite(json_number_value(v)) || json_number_value(v) <= 0)
        return md_errf(e, MD_EFORMAT, "%s: \"%s\" must be a positive number", where, key);
    *out = json_number_value(v);
    return 0;
}

static int get_bool(json_t *o, const char *where, const char *key, int *out, md_err *e) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_boolean(v))
        return md_errf(e, MD_EFORMAT, "%s: \"%s\" must be true or false", where, key);
    *out = json_is_true(v);
    return 0;
}

/* A string key; NULL when absent or null. */
static const char *get_str(json_t *o, const char *key) {
    return json_string_value(json_object_get(o, key));
}

/* One RoPE description: a v4 rope_scaling object or a v5 rope_parameters object (or one
 * layer type's entry of it), named `name` in errors. Its rope_theta, when given, goes to
 * *theta. Scaling (linear, llama3) goes to c; with c NULL (Gemma 3's sliding layers, which
 * llama.cpp runs unscaled) only "default" is accepted. A missing type is an error in the v4
 * spelling and "default" in v5. */
static int rope_obj(json_t *rs, const char *where, const char *name, int need_type, double *theta,
                    hf_config *c, md_err *e) {
    if (!json_is_object(rs))
        return md_errf(e, MD_EFORMAT, "%s: \"%s\" must be an object or null", where, name);
    int rc = get_num(rs, where, "rope_theta", theta, e);
    if (rc)
        return rc;
    const char *t = get_str(rs, "rope_type");
    if (!t)
        t = get_str(rs, "type");
    if (!t && need_type)
        return md_errf(e, MD_EFORMAT, "%s: %s has no \"rope_type\"", where, name);
    if (!t || !strcmp(t, "default"))
        return 0;
    if (!c || (strcmp(t, "linear") && strcmp(t, "llama3")))
        return md_errf(e, MD_EUNSUPP, "%s: %s rope_type \"%.32s\" is not supported (%s are)", where,
                       name, t, c ? "default, linear, llama3" : "only default");
    snprintf(c->rope_scaling, sizeof c->rope_scaling, "%s", t);
    c->rope_factor = 0;
    if ((rc = get_num(rs, where, "factor", &c->rope_factor, e)))
        return rc;
    if (!(c->rope_factor > 0) || c->rope_factor > 1e4)
        return md_errf(e, MD_EFORMAT, "%s: %s.factor is missing or not usable", where, name);
    if (!strcmp(t, "linear"))
        return 0;
    c->rope_low_freq_factor = 1.0;
    c->rope_high_freq_factor = 4.0;
    c->rope_orig_ctx = 8192;
    if ((rc = get_num(rs, where, "low_freq_factor", &c->rope_low_freq_factor, e)) ||
        (rc = get_num(rs, where, "high_freq_factor", &c->rope_high_freq_factor, e)) ||
        (rc = get_int(rs, where, "original_max_position_embeddings", 0, 1, 1 << 24,
                      &c->rope_orig_ctx, e)))
        return rc;
    if (!(c->rope_high_freq_factor > c->rope_low_freq_factor))
        return md_errf(e, MD_EFORMAT, "%s: %s high_freq_factor must exceed low_freq_factor", where,
                       name);
    return 0;
}

/* RoPE as transformers 4 writes it (rope_theta, rope_scaling, and Gemma 3's
 * rope_local_base_freq at the top level) and as transformers 5 does (rope_parameters: one
 * object, or one per layer type for Gemma 3); the v5 values win where both are given. */
static int read_rope(json_t *o, const char *where, int gemma, hf_config *c, md_err *e) {
    int rc;
    c->rope_theta = gemma ? 1e6 : 10000.0;
    c->rope_theta_swa = gemma ? 10000.0 : 0;
    json_t *rs = json_object_get(o, "rope_scaling");
    if ((rc = get_num(o, where, "rope_theta", &c->rope_theta, e)) ||
        (gemma && (rc = get_num(o, where, "rope_local_base_freq", &c->rope_theta_swa, e))) ||
        (rs && !json_is_null(rs) &&
         (rc = rope_obj(rs, where, "rope_scaling", 1, &c->rope_theta, c, e))))
        return rc;
    json_t *rp = json_object_get(o, "rope_parameters");
    if (!rp || json_is_null(rp))
        return 0;
    if (!json_is_object(rp))
        return md_errf(e, MD_EFORMAT, "%s: \"rope_parameters\" must be an object or null", where);
    c->rope_scaling[0] = '\0'; /* v5 says the scaling, if any; a stale v4 one does not count */
    json_t *full = json_object_get(rp, "full_attention");
    json_t *slide = json_object_get(rp, "sliding_attention");
    if (!full && !slide)
        return rope_obj(rp, where, "rope_parameters", 0, &c->rope_theta, c, e);
    const char *k;
    json_t *v;
    json_object_foreach(rp, k, v) {
        if (strcmp(k, "full_attention") && strcmp(k, "sliding_attention"))
            return md_errf(e, MD_EUNSUPP,
                           "%s: rope_parameters for layer type \"%.32s\" is not supported "
                           "(full_attention, sliding_attention are)",
                           where, k);
    }
    if (slide && !gemma)
        return md_errf(e, MD_EUNSUPP,
                       "%s: rope_parameters.sliding_attention in a %s model: not supported", where,
                       c->model_type);
    if ((full &&
         (rc = rope_obj(full, where, "rope_parameters.full_attention", 0, &c->rope_theta, c, e))) ||
        (slide && (rc = rope_obj(slide, where, "rope_parameters.sliding_attention", 0,
                                 &c->rope_theta_swa, NULL, e))))
        return rc;
    return 0;
}

/* transformers 5's layer_types: one "full_attention" or "sliding_attention" per layer. The
 * engine runs a window on every layer, or on (p - 1) layers of every p with the p-th global
 * (hparams swa_pattern): *pattern gets p, 0 when every layer slides, -1 when none does. Any
 * other arrangement is refused naming it. */
static int read_layer_types(json_t *o, const char *where, const hf_config *c, int *pattern,
                            md_err *e) {
    json_t *lt = json_object_get(o, "layer_types");
    if (!lt || json_is_null(lt))
        return 0;
    if (!json_is_array(lt) || json_array_size(lt) != (size_t)c->n_layer)
        return md_errf(e, MD_EFORMAT,
                       "%s: \"layer_types\" must be an array of %d strings (one "
                       "per layer)",
                       where, c->n_layer);
    int first_full = -1, n_slide = 0;
    for (int l = 0; l < c->n_layer; l++) {
        const char *t = json_string_value(json_array_get(lt, (size_t)l));
        int sl = t && !strcmp(t, "sliding_attention");
        if (!sl && !(t && !strcmp(t, "full_attention")))
            return md_errf(e, MD_EUNSUPP,
                           "%s: layer_types[%d] \"%.32s\" is not supported (full_attention, "
                           "sliding_attention are)",
                           where, l, t ? t : "(not a string)");
        n_slide += sl;
        if (!sl && first_full < 0)
            first_full = l;
    }
    if (n_slide == 0 || n_slide == c->n_layer) {
        *pattern = n_slide ? 0 : -1;
        return 0;
    }
    int p = first_full + 1;
    for (int l = 0; l < c->n_layer; l++) {
        int sl = !strcmp(json_string_value(json_array_get(lt, (size_t)l)), "sliding_attention");
        if (sl != (l % p < p - 1))
            return md_errf(e, MD_EUNSUPP,
                           "%s: layer_types do not repeat as %d sliding layer(s) then one full "
                           "one (layer %d breaks it): not supported",
                           where, p - 1, l);
    }
    *pattern = p;
    return 0;
}

/* The architecture: model_type first, else the first of "architectures". */
static int pick_arch(json_t *root, const char *where, hf_config *c, md_err *e) {
    static const struct {
        const char *model_type, *class_name, *arch;
    } known[] = {
        {"llama", "LlamaForCausalLM", "llama"},
        {"mistral", "MistralForCausalLM", "llama"},
        {"qwen2", "Qwen2ForCausalLM", "qwen2"},
        {"qwen3", "Qwen3ForCausalLM", "qwen3"},
        {"gemma3_text", "Gemma3ForCausalLM", "gemma3"},
        {"gemma3", "Gemma3ForConditionalGeneration", "gemma3"},
        {"bert", "BertModel", "bert"},
    };
    const char *mt = get_str(root, "model_type");
    json_t *archs = json_object_get(root, "architectures");
    const char *cls = json_string_value(json_array_get(archs, 0));
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if ((mt && !strcmp(mt, known[i].model_type)) ||
            (!mt && cls && !strcmp(cls, known[i].class_name))) {
            snprintf(c->model_type, sizeof c->model_type, "%s", known[i].model_type);
            snprintf(c->arch, sizeof c->arch, "%s", known[i].arch);
            return 0;
        }
    if (!mt && !cls)
        return md_errf(e, MD_EFORMAT, "%s: neither \"model_type\" nor \"architectures\" is given",
                       where);
    return md_errf(e, MD_EUNSUPP,
                   "%s: architecture %.64s%s%.64s is not supported (model_type llama, mistral, "
                   "qwen2, qwen3, gemma3_text, gemma3, bert are)",
                   where, mt ? mt : cls, mt && cls ? " / " : "", mt && cls ? cls : "");
}

int hf_config_parse(json_t *root, const char *where, hf_config *c, md_err *e) {
    memset(c, 0, sizeof *c);
    if (!json_is_object(root))
        return md_errf(e, MD_EFORMAT, "%s: not a JSON object", where);
    int rc = pick_arch(root, where, c, e);
    if (rc)
        return rc;
    if (!strcmp(c->arch, "bert"))
        return hf_encoder_parse(root, where, c, e);
    int gemma = !strcmp(c->arch, "gemma3");
    json_t *o = root;
    snprintf(c->prefix, sizeof c->prefix, "model.");
    if (!strcmp(c->model_type, "gemma3")) { /* multimodal: the language model's part */
        o = json_object_get(root, "text_config");
        if (!json_is_object(o))
            return md_errf(e, MD_EFORMAT, "%s: gemma3 config without a \"text_config\" object",
                           where);
        snprintf(c->prefix, sizeof c->prefix, "language_model.model.");
    }
    c->eps = 1e-6;
    c->tie_embeddings = gemma; /* Gemma ties by default; the others say so */
    int mlp_bias = 0, use_swa = 0, window = 0, qpas = 0, bidir = 0;
    if ((rc = get_int(o, where, "num_hidden_layers", 1, 1, 1024, &c->n_layer, e)) ||
        (rc = get_int(o, where, "hidden_size", 1, 1, 65536, &c->n_embd, e)) ||
        (rc = get_int(o, where, "num_attention_heads", 1, 1, 1024, &c->n_head, e)) ||
        (rc = get_int(o, where, "intermediate_size", 1, 1, 1 << 20, &c->n_ff, e)) ||
        (rc = get_int(o, where, "vocab_size", 1, 1, 1 << 24, &c->n_vocab, e)) ||
        (rc = get_int(o, where, "max_position_embeddings", 1, 1, 1 << 24, &c->n_ctx, e)))
        return rc;
    c->n_head_kv = c->n_head;
    c->head_dim = c->n_embd / c->n_head;
    if (gemma)
        c->head_dim = 256;
    if ((rc = get_int(o, where, "num_key_value_heads", 0, 1, 1024, &c->n_head_kv, e)) ||
        (rc = get_int(o, where, "head_dim", 0, 2, 1024, &c->head_dim, e)) ||
        (rc = get_num(o, where, "rms_norm_eps", &c->eps, e)) ||
        (rc = get_bool(o, where, "tie_word_embeddings", &c->tie_embeddings, e)) ||
        (rc = get_bool(o, where, "attention_bias", &c->attn_bias, e)) ||
        (rc = get_bool(o, where, "mlp_bias", &mlp_bias, e)) ||
        (rc = get_bool(o, where, "use_sliding_window", &use_swa, e)) ||
        (rc = get_bool(o, where, "use_bidirectional_attention", &bidir, e)) ||
        (rc = get_int(o, where, "sliding_window", 0, 1, 1 << 24, &window, e)) ||
        (rc = read_rope(o, where, gemma, c, e)))
        return rc;
    if (c->n_head % c->n_head_kv || c->head_dim % 2)
        return md_errf(e, MD_EFORMAT,
                       "%s: %d attention heads do not divide into %d KV heads, or head_dim %d is "
                       "odd",
                       where, c->n_head, c->n_head_kv, c->head_dim);
    if (!strcmp(c->arch, "qwen2"))
        c->attn_bias = 1;
    if (!strcmp(c->arch, "qwen3") || gemma)
        c->qk_norm = 1;
    if (mlp_bias)
        return md_errf(e, MD_EUNSUPP, "%s: mlp_bias is true: MLP biases are not supported", where);
    if (bidir) /* Gemma 3's embedding variants: every token sees every other */
        return md_errf(e, MD_EUNSUPP,
                       "%s: use_bidirectional_attention is true: this decoder attends both ways "
                       "(an embedding model); medley runs decoders causally only",
                       where);
    const char *act = get_str(o, "hidden_act");
    if (gemma && get_str(o, "hidden_activation"))
        act = get_str(o, "hidden_activation");
    const char *want = gemma ? "gelu_pytorch_tanh" : "silu";
    if (act && strcmp(act, want))
        return md_errf(e, MD_EUNSUPP, "%s: activation \"%.32s\" is not supported (%s is)", where,
                       act, want);
    int types = -2; /* layer_types: see read_layer_types; -2 when not given */
    if ((rc = read_layer_types(o, where, c, &types, e)))
        return rc;
    if (!gemma && types >= 0 && strcmp(c->model_type, "mistral"))
        return md_errf(e, MD_EUNSUPP,
                       "%s: layer_types has sliding_attention layers: not supported for %s", where,
                       c->model_type);
    if (!strcmp(c->model_type, "mistral") && window > 0 && window < c->n_ctx && types != -1) {
        if (types > 0)
            return md_errf(e, MD_EUNSUPP,
                           "%s: layer_types mixes sliding and full layers: not supported for "
                           "mistral",
                           where);
        c->sliding_window = window; /* every layer slides, as GGUF Mistral does */
    }
    if ((!strcmp(c->arch, "qwen2") || !strcmp(c->arch, "qwen3")) && use_swa)
        return md_errf(e, MD_EUNSUPP,
                       "%s: use_sliding_window is true: Qwen's sliding-window layers are not "
                       "supported",
                       where);
    if (gemma) {
        int pattern = 6;
        c->norm_plus_one = 1;
        qpas = c->head_dim;
        if ((rc = get_int(o, where, "sliding_window_pattern", 0, 1, 1024, &pattern, e)) ||
            (rc = get_int(o, where, "query_pre_attn_scalar", 0, 1, 1 << 20, &qpas, e)))
            return rc;
        if (qpas != c->head_dim)
            return md_errf(e, MD_EUNSUPP,
                           "%s: query_pre_attn_scalar %d differs from head_dim %d: not supported",
                           where, qpas, c->head_dim);
        json_t *cap = json_object_get(o, "final_logit_softcapping");
        json_t *acap = json_object_get(o, "attn_logit_softcapping");
        if ((cap && !json_is_null(cap)) || (acap && !json_is_null(acap)))
            return md_errf(e, MD_EUNSUPP, "%s: logit soft-capping is not supported", where);
        if (types != -2) /* layer_types (v5) says what sliding_window_pattern (v4) did */
            pattern = types;
        c->sliding_window = pattern < 0 ? 0 : window;
        c->swa_pattern = pattern < 0 ? 0 : pattern;
    }
    return 0;
}

int hf_config_load(const char *dir, hf_config *c, md_err *e) {
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    struct stat st;
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) /* a FIFO would block fopen forever */
        return md_errf(e, MD_EIO, "%s: not a regular file", path);
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return md_errf(e, MD_ENOTFOUND,
                       "%s: no config.json there (not a Hugging Face model "
                       "directory?)",
                       dir);
    json_error_t je;
    json_t *root = json_loadf(fp, JSON_REJECT_DUPLICATES, &je);
    fclose(fp);
    if (!root)
        return md_errf(e, MD_EFORMAT, "%s: not valid JSON (line %d: %s)", path, je.line, je.text);
    int rc = hf_config_parse(root, path, c, e);
    json_decref(root);
    return rc;
}

/* Per-layer tensors: HF suffix, GGUF suffix, which configs have it. */
enum { ALL = 0, BIAS = 1, QKNORM = 2, GEMMA = 3, NOT_GEMMA = 4 };
static const struct {
    const char *hf, *gguf;
    int when;
} layer_names[] = {
    {"input_layernorm.weight", "attn_norm.weight", ALL},
    {"self_attn.q_proj.weight", "attn_q.weight", ALL},
    {"self_attn.k_proj.weight", "attn_k.weight", ALL},
    {"self_attn.v_proj.weight", "attn_v.weight", ALL},
    {"self_attn.o_proj.weight", "attn_output.weight", ALL},
    {"self_attn.q_proj.bias", "attn_q.bias", BIAS},
    {"self_attn.k_proj.bias", "attn_k.bias", BIAS},
    {"self_attn.v_proj.bias", "attn_v.bias", BIAS},
    {"self_attn.q_norm.weight", "attn_q_norm.weight", QKNORM},
    {"self_attn.k_norm.weight", "attn_k_norm.weight", QKNORM},
    {"post_attention_layernorm.weight", "ffn_norm.weight", NOT_GEMMA},
    {"post_attention_layernorm.weight", "post_attention_norm.weight", GEMMA},
    {"pre_feedforward_layernorm.weight", "ffn_norm.weight", GEMMA},
    {"post_feedforward_layernorm.weight", "post_ffw_norm.weight", GEMMA},
    {"mlp.gate_proj.weight", "ffn_gate.weight", ALL},
    {"mlp.up_proj.weight", "ffn_up.weight", ALL},
    {"mlp.down_proj.weight", "ffn_down.weight", ALL},
};

static int applies(const hf_config *c, int when) {
    int gemma = !strcmp(c->arch, "gemma3");
    return when == ALL || (when == BIAS && c->attn_bias) || (when == QKNORM && c->qk_norm) ||
           (when == GEMMA && gemma) || (when == NOT_GEMMA && !gemma);
}

int hf_tensor_gguf_name(const hf_config *c, const char *hf, char *gguf, size_t gguf_sz) {
    if (c->encoder)
        return hf_encoder_tensor_name(c, hf, gguf, gguf_sz);
    const char *r = NULL;
    if (!strcmp(c->model_type, "gemma3")) {
        /* the language model of a multimodal checkpoint: language_model.model.* (transformers
         * before 4.52) or model.language_model.* (after); the vision parts are not ours */
        static const char *const skip[] = {"vision_tower.", "multi_modal_projector.",
                                           "model.vision_tower.", "model.multi_modal_projector."};
        for (size_t i = 0; i < sizeof skip / sizeof skip[0]; i++)
            if (!strncmp(hf, skip[i], strlen(skip[i])))
                return 0;
        if (!strncmp(hf, "model.language_model.", 21))
            r = hf + 21;
    }
    if (!strcmp(hf, "lm_head.weight") || !strcmp(hf, "language_model.lm_head.weight")) {
        if (c->tie_embeddings)
            return 0;
        snprintf(gguf, gguf_sz, "output.weight");
        return 1;
    }
    if (!r && !strncmp(hf, c->prefix, strlen(c->prefix)))
        r = hf + strlen(c->prefix);
    if (!r)
        return -1;
    if (!strcmp(r, "embed_tokens.weight")) {
        snprintf(gguf, gguf_sz, "token_embd.weight");
        return 1;
    }
    if (!strcmp(r, "norm.weight")) {
        snprintf(gguf, gguf_sz, "output_norm.weight");
        return 1;
    }
    /* "layers.N." with N written plainly (no sign, no leading zero) and below n_layer */
    if (strncmp(r, "layers.", 7) || r[7] < '0' || r[7] > '9' || (r[7] == '0' && r[8] != '.'))
        return -1;
    int l = 0, n = 7;
    while (r[n] >= '0' && r[n] <= '9' && l < c->n_layer)
        l = l * 10 + (r[n++] - '0');
    if (r[n] != '.' || l >= c->n_layer)
        return -1;
    n++;
    const char *s = r + n;
    if (!strcmp(s, "self_attn.rotary_emb.inv_freq"))
        return 0;
    for (size_t i = 0; i < sizeof layer_names / sizeof layer_names[0]; i++)
        if (!strcmp(s, layer_names[i].hf) && applies(c, layer_names[i].when)) {
            snprintf(gguf, gguf_sz, "blk.%d.%s", l, layer_names[i].gguf);
            return 1;
        }
    return -1;
}
