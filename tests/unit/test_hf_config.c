/* test_hf_config.c — config.json to hf_config for each supported architecture, refusals
 * (unknown architecture named, unsupported features, hostile values), HF tensor names to
 * GGUF names; and hf_open_dir on hand-made directories: a tiny llama checkpoint presented as
 * GGUF, a stray tensor refused by name, a config whose shapes disagree with the weights. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "engine/weights/hf_config.h"
#include "engine/weights/hf_model.h"
#include "engine/model/model.h"
#include "engine/tokenizer/tokenizer.h"

static int parse(const char *text, hf_config *c, md_err *e) {
    json_error_t je;
    json_t *j = json_loads(text, 0, &je);
    if (!j)
        fail_msg("bad test JSON: %s", je.text);
    int rc = hf_config_parse(j, "config.json", c, e);
    json_decref(j);
    return rc;
}

#define BASE                                                                                       \
    "\"hidden_size\":64,\"num_hidden_layers\":2,\"num_attention_heads\":4,"                        \
    "\"intermediate_size\":128,\"vocab_size\":100,\"max_position_embeddings\":512"

static void architectures_map(void **state) {
    (void)state;
    hf_config c;
    md_err e = {0};
    assert_int_equal(
        parse("{\"model_type\":\"llama\"," BASE ",\"num_key_value_heads\":2,"
              "\"rope_theta\":500000.0,\"rms_norm_eps\":1e-5,\"tie_word_embeddings\":true}",
              &c, &e),
        0);
    assert_string_equal(c.arch, "llama");
    assert_int_equal(c.n_head_kv, 2);
    assert_int_equal(c.head_dim, 16);
    assert_true(c.rope_theta == 500000.0);
    assert_int_equal(c.tie_embeddings, 1);
    assert_int_equal(c.attn_bias, 0);
    /* mistral: llama with a window on every layer; it slides as GGUF Mistral does (the
     * context stays max_position_embeddings) */
    assert_int_equal(parse("{\"model_type\":\"mistral\"," BASE ",\"sliding_window\":128}", &c, &e),
                     0);
    assert_string_equal(c.arch, "llama");
    assert_int_equal(c.n_ctx, 512);
    assert_int_equal(c.sliding_window, 128);
    assert_int_equal(c.swa_pattern, 0);
    assert_int_equal(parse("{\"model_type\":\"mistral\"," BASE ",\"sliding_window\":null}", &c, &e),
                     0);
    assert_int_equal(c.n_ctx, 512);
    assert_int_equal(c.sliding_window, 0);
    assert_int_equal(parse("{\"architectures\":[\"Qwen2ForCausalLM\"]," BASE "}", &c, &e), 0);
    assert_string_equal(c.arch, "qwen2");
    assert_int_equal(c.attn_bias, 1);
    assert_int_equal(parse("{\"model_type\":\"qwen3\"," BASE ",\"head_dim\":32}", &c, &e), 0);
    assert_string_equal(c.arch, "qwen3");
    assert_int_equal(c.qk_norm, 1);
    assert_int_equal(c.head_dim, 32);
    assert_int_equal(parse("{\"model_type\":\"gemma3_text\"," BASE ",\"head_dim\":16,"
                           "\"query_pre_attn_scalar\":16,\"sliding_window\":64,"
                           "\"hidden_activation\":\"gelu_pytorch_tanh\"}",
                           &c, &e),
                     0);
    assert_string_equal(c.arch, "gemma3");
    assert_int_equal(c.sliding_window, 64);
    assert_int_equal(c.swa_pattern, 6);
    assert_int_equal(c.norm_plus_one, 1);
    assert_int_equal(c.tie_embeddings, 1);
    assert_int_equal(parse("{\"model_type\":\"llama\"," BASE ",\"rope_scaling\":{\"rope_type\":"
                           "\"llama3\",\"factor\":8.0,\"low_freq_factor\":1.0,"
                           "\"high_freq_factor\":4.0,\"original_max_position_embeddings\":8192}}",
                           &c, &e),
                     0);
    assert_string_equal(c.rope_scaling, "llama3");
}

static void refusals_name_the_problem(void **state) {
    (void)state;
    static const char *cases[][2] = {
        {"{\"model_type\":\"gpt_neox\"," BASE "}", "gpt_neox"},
        {"{\"architectures\":[\"PhiForCausalLM\"]," BASE "}", "PhiForCausalLM"},
        {"{" BASE "}", "model_type"},
        {"[]", "not a JSON object"},
        {"{\"model_type\":\"llama\",\"hidden_size\":64}", "num_hidden_layers"},
        {"{\"model_type\":\"llama\"," BASE ",\"num_key_value_heads\":3}", "KV heads"},
        {"{\"model_type\":\"llama\"," BASE ",\"hidden_act\":\"gelu\"}", "gelu"},
        {"{\"model_type\":\"llama\"," BASE ",\"mlp_bias\":true}", "mlp_bias"},
        {"{\"model_type\":\"llama\"," BASE ",\"rope_scaling\":{\"type\":\"yarn\",\"factor\":4}}",
         "yarn"},
        {"{\"model_type\":\"llama\"," BASE ",\"rope_scaling\":{\"type\":\"linear\"}}", "factor"},
        {"{\"model_type\":\"qwen2\"," BASE ",\"use_sliding_window\":true}", "use_sliding_window"},
        {"{\"model_type\":\"llama\",\"hidden_size\":-4,\"num_hidden_layers\":2}", "hidden_size"},
        {"{\"model_type\":\"llama\"," BASE ",\"rope_theta\":\"big\"}", "rope_theta"},
        {"{\"model_type\":\"llama\"," BASE ",\"head_dim\":1e400}", "head_dim"},
        {"{\"model_type\":\"gemma3\"," BASE "}", "text_config"},
        {"{\"model_type\":\"gemma3_text\"," BASE ",\"query_pre_attn_scalar\":7}",
         "query_pre_attn_scalar"},
        {"{\"model_type\":\"gemma3_text\"," BASE ",\"head_dim\":16,"
         "\"use_bidirectional_attention\":true}",
         "use_bidirectional_attention"},
        {"{\"model_type\":\"llama\"," BASE ",\"use_bidirectional_attention\":1}",
         "use_bidirectional_attention"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        hf_config c;
        md_err e = {0};
        json_error_t je;
        json_t *j = json_loads(cases[i][0], 0, &je);
        int rc = j ? hf_config_parse(j, "config.json", &c, &e) : MD_EFORMAT;
        json_decref(j);
        if (!j)
            continue; /* 1e400: jansson itself refuses it */
        assert_true(rc == MD_EFORMAT || rc == MD_EUNSUPP);
        if (!strstr(e.msg, cases[i][1]) || !strstr(e.msg, "config.json"))
            fail_msg("case %zu: \"%s\" lacks \"%s\"", i, e.msg, cases[i][1]);
    }
}

static void tensor_names(void **state) {
    (void)state;
    hf_config c;
    md_err e = {0};
    char g[96];
    assert_int_equal(
        parse("{\"model_type\":\"llama\"," BASE ",\"tie_word_embeddings\":true}", &c, &e), 0);
    assert_int_equal(hf_tensor_gguf_name(&c, "model.layers.1.self_attn.q_proj.weight", g, sizeof g),
                     1);
    assert_string_equal(g, "blk.1.attn_q.weight");
    assert_int_equal(
        hf_tensor_gguf_name(&c, "model.layers.0.post_attention_layernorm.weight", g, sizeof g), 1);
    assert_string_equal(g, "blk.0.ffn_norm.weight");
    assert_int_equal(hf_tensor_gguf_name(&c, "model.embed_tokens.weight", g, sizeof g), 1);
    assert_string_equal(g, "token_embd.weight");
    assert_int_equal(hf_tensor_gguf_name(&c, "lm_head.weight", g, sizeof g), 0); /* tied */
    assert_int_equal(
        hf_tensor_gguf_name(&c, "model.layers.0.self_attn.rotary_emb.inv_freq", g, sizeof g), 0);
    /* not this architecture's, out of range, odd spellings */
    assert_int_equal(hf_tensor_gguf_name(&c, "model.layers.0.self_attn.q_proj.bias", g, sizeof g),
                     -1);
    assert_int_equal(hf_tensor_gguf_name(&c, "model.layers.0.self_attn.q_norm.weight", g, sizeof g),
                     -1);
    assert_int_equal(hf_tensor_gguf_name(&c, "model.layers.2.mlp.up_proj.weight", g, sizeof g), -1);
    assert_int_equal(hf_tensor_gguf_name(&c, "model.layers.01.mlp.up_proj.weight", g, sizeof g),
                     -1);
    assert_int_equal(hf_tensor_gguf_name(&c, "model.layers.-1.mlp.up_proj.weight", g, sizeof g),
                     -1);
    assert_int_equal(hf_tensor_gguf_name(&c, "model.layers.0", g, sizeof g), -1);
    assert_int_equal(hf_tensor_gguf_name(&c, "model.layers.99999999999999999999.mlp.up_proj.weight",
                                         g, sizeof g),
                     -1);
    assert_int_equal(hf_tensor_gguf_name(&c, "model.layers.1x.mlp.up_proj.weight", g, sizeof g),
                     -1);
    assert_int_equal(hf_tensor_gguf_name(&c, "encoder.x", g, sizeof g), -1);
    assert_int_equal(parse("{\"model_type\":\"gemma3_text\"," BASE ",\"head_dim\":16,"
                           "\"query_pre_attn_scalar\":16}",
                           &c, &e),
                     0);
    assert_int_equal(
        hf_tensor_gguf_name(&c, "model.layers.0.pre_feedforward_layernorm.weight", g, sizeof g), 1);
    assert_string_equal(g, "blk.0.ffn_norm.weight");
    assert_int_equal(
        hf_tensor_gguf_name(&c, "model.layers.0.post_attention_layernorm.weight", g, sizeof g), 1);
    assert_string_equal(g, "blk.0.post_attention_norm.weight");
    assert_int_equal(hf_tensor_gguf_name(&c, "model.layers.0.self_attn.k_norm.weight", g, sizeof g),
                     1);
    assert_string_equal(g, "blk.0.attn_k_norm.weight");
    /* multimodal Gemma 3: both transformers layouts of the language model; vision skipped */
    assert_int_equal(parse("{\"model_type\":\"gemma3\",\"text_config\":{" BASE ",\"head_dim\":16,"
                           "\"query_pre_attn_scalar\":16}}",
                           &c, &e),
                     0);
    assert_int_equal(
        hf_tensor_gguf_name(&c, "language_model.model.layers.1.mlp.up_proj.weight", g, sizeof g),
        1);
    assert_string_equal(g, "blk.1.ffn_up.weight");
    assert_int_equal(hf_tensor_gguf_name(&c, "model.language_model.norm.weight", g, sizeof g), 1);
    assert_string_equal(g, "output_norm.weight");
    assert_int_equal(hf_tensor_gguf_name(&c, "model.vision_tower.x.weight", g, sizeof g), 0);
    assert_int_equal(hf_tensor_gguf_name(&c, "vision_tower.x.weight", g, sizeof g), 0);
    assert_int_equal(hf_tensor_gguf_name(&c, "model.layers.0.mlp.up_proj.weight", g, sizeof g), -1);
}

/* ---- hand-made directories ---- */

static char tmpdir[64];

static void put_file(const char *name, const void *p, size_t n) {
    char path[256];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    assert_int_equal(fwrite(p, 1, n, fp), n);
    fclose(fp);
}

/* A safetensors file of BF16 tensors (names, shapes) with data 0x3f80 (1.0) everywhere. */
static void put_weights(const char *const *names, const int (*shapes)[2], int n) {
    char h[8192];
    size_t hl = 0, off = 0;
    hl += (size_t)snprintf(h + hl, sizeof h - hl, "{");
    for (int i = 0; i < n; i++) {
        size_t bytes = (size_t)shapes[i][0] * (shapes[i][1] ? shapes[i][1] : 1) * 2;
        if (shapes[i][1])
            hl += (size_t)snprintf(
                h + hl, sizeof h - hl,
                "%s\"%s\":{\"dtype\":\"BF16\",\"shape\":[%d,%d],\"data_offsets\":[%zu,%zu]}",
                i ? "," : "", names[i], shapes[i][0], shapes[i][1], off, off + bytes);
        else
            hl += (size_t)snprintf(
                h + hl, sizeof h - hl,
                "%s\"%s\":{\"dtype\":\"BF16\",\"shape\":[%d],\"data_offsets\":[%zu,%zu]}",
                i ? "," : "", names[i], shapes[i][0], off, off + bytes);
        off += bytes;
    }
    hl += (size_t)snprintf(h + hl, sizeof h - hl, "}");
    while (hl % 8)
        h[hl++] = ' ';
    size_t len = 8 + hl + off;
    uint8_t *p = malloc(len);
    uint64_t v = hl;
    memcpy(p, &v, 8);
    memcpy(p + 8, h, hl);
    for (size_t i = 0; i < off; i += 2) {
        p[8 + hl + i] = 0x80;
        p[8 + hl + i + 1] = 0x3f;
    }
    put_file("model.safetensors", p, len);
    free(p);
}

#define TINY_CFG                                                                                   \
    "{\"model_type\":\"llama\",\"hidden_size\":8,\"num_hidden_layers\":1,"                         \
    "\"num_attention_heads\":2,\"intermediate_size\":16,\"vocab_size\":10,"                        \
    "\"max_position_embeddings\":64,\"tie_word_embeddings\":%s}"

static const char *const tiny_names[] = {"model.embed_tokens.weight",
                                         "model.norm.weight",
                                         "model.layers.0.input_layernorm.weight",
                                         "model.layers.0.self_attn.q_proj.weight",
                                         "model.layers.0.self_attn.k_proj.weight",
                                         "model.layers.0.self_attn.v_proj.weight",
                                         "model.layers.0.self_attn.o_proj.weight",
                                         "model.layers.0.post_attention_layernorm.weight",
                                         "model.layers.0.mlp.gate_proj.weight",
                                         "model.layers.0.mlp.up_proj.weight",
                                         "model.layers.0.mlp.down_proj.weight",
                                         "lm_head.weight",
                                         "model.layers.0.extra.weight"};
static const int tiny_shapes[][2] = {{10, 8}, {8, 0},  {8, 0},  {8, 8},  {8, 8},  {8, 8}, {8, 8},
                                     {8, 0},  {16, 8}, {16, 8}, {8, 16}, {10, 8}, {8, 0}};

/* Empty tmpdir of whatever a test left there, and remove it. */
static void rm_tmpdir(void) {
    static const char *const files[] = {
        "config.json", "model.safetensors", "model.safetensors.index.json",
        "m.gguf",      "tokenizer.json",    "tokenizer_config.json"};
    char p[256];
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(p, sizeof p, "%s/%s", tmpdir, files[i]);
        unlink(p);
    }
    rmdir(tmpdir);
}

static void tiny_directory(void **state) {
    (void)state;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/medley-hf-XXXXXX");
    assert_non_null(mkdtemp(tmpdir));
    char cfg[512];
    md_err e = {0};
    gguf_file *gf = NULL;
    assert_int_equal(md_is_hf_dir(tmpdir), 0);
    /* untied with lm_head: loads, every weight BF16 in place, norms F32 */
    snprintf(cfg, sizeof cfg, TINY_CFG, "false");
    put_file("config.json", cfg, strlen(cfg));
    assert_int_equal(md_is_hf_dir(tmpdir), 1);
    assert_int_equal(md_model_open(tmpdir, &gf, &e), MD_ENOTFOUND); /* no weights yet */
    put_weights(tiny_names, tiny_shapes, 12);
    if (md_model_open(tmpdir, &gf, &e))
        fail_msg("%s", e.msg);
    assert_int_equal(gguf_n_tensors(gf), 12);
    assert_int_equal(gguf_find_tensor(gf, "output.weight")->type, MD_TYPE_BF16);
    assert_int_equal(gguf_find_tensor(gf, "blk.0.ffn_down.weight")->ne[0], 16);
    assert_int_equal(gguf_find_tensor(gf, "blk.0.ffn_down.weight")->ne[1], 8);
    const gguf_tensor *nw = gguf_find_tensor(gf, "output_norm.weight");
    assert_int_equal(nw->type, MD_TYPE_F32);
    assert_true(((const float *)nw->data)[3] == 1.0f);
    md_hparams hp;
    assert_int_equal(md_hparams_read(gf, &hp, &e), 0);
    assert_int_equal(hp.rope_neox, 1);
    assert_int_equal(hp.n_ctx_train, 64);
    gguf_close(gf);
    /* tied: lm_head is skipped */
    snprintf(cfg, sizeof cfg, TINY_CFG, "true");
    put_file("config.json", cfg, strlen(cfg));
    assert_int_equal(md_model_open(tmpdir, &gf, &e), 0);
    assert_null(gguf_find_tensor(gf, "output.weight"));
    gguf_close(gf);
    /* a tensor with no place in the model: refused by name, not ignored */
    put_weights(tiny_names, tiny_shapes, 13);
    assert_int_equal(md_model_open(tmpdir, &gf, &e), MD_EUNSUPP);
    assert_non_null(strstr(e.msg, "model.layers.0.extra.weight"));
    /* config and weights disagree: the engine's bind names the tensor */
    put_weights(tiny_names, tiny_shapes, 12);
    snprintf(cfg, sizeof cfg, "%s",
             "{\"model_type\":\"llama\",\"hidden_size\":8,\"num_hidden_layers\":1,"
             "\"num_attention_heads\":2,\"intermediate_size\":32,\"vocab_size\":10,"
             "\"max_position_embeddings\":64}");
    put_file("config.json", cfg, strlen(cfg));
    assert_int_equal(md_model_open(tmpdir, &gf, &e), 0);
    md_backend *be = NULL;
    md_model *m = NULL;
    assert_int_equal(md_backend_open("cpu", 1, &be, &e), 0);
    assert_int_equal(md_model_load(gf, be, &m, &e), MD_EFORMAT);
    assert_non_null(strstr(e.msg, "blk.0.ffn_gate.weight"));
    md_backend_free(be);
    gguf_close(gf);
    /* the tokenizer of an HF directory comes from tokenizer.json */
    assert_int_equal(md_model_open(tmpdir, &gf, &e), 0);
    tok_tokenizer *t = NULL;
    assert_int_not_equal(md_model_tokenizer(gf, &t, &e), 0);
    assert_null(t);
    gguf_close(gf);
    char p[256];
    snprintf(p, sizeof p, "%s/config.json", tmpdir);
    unlink(p);
    snprintf(p, sizeof p, "%s/model.safetensors", tmpdir);
    unlink(p);
    rmdir(tmpdir);
}

/* transformers 5 writes RoPE as rope_parameters (per layer type for Gemma 3) instead of the
 * top-level rope_theta / rope_scaling / rope_local_base_freq: both spellings read the same. */
static void rope_parameters_v5(void **state) {
    (void)state;
    hf_config c;
    md_err e = {0};
    assert_int_equal(parse("{\"model_type\":\"llama\"," BASE ",\"rope_parameters\":{\"rope_type\":"
                           "\"default\",\"rope_theta\":500000.0}}",
                           &c, &e),
                     0);
    assert_true(c.rope_theta == 500000.0);
    assert_string_equal(c.rope_scaling, "");
    assert_int_equal(parse("{\"model_type\":\"qwen2\"," BASE ",\"rope_parameters\":{\"rope_type\":"
                           "\"linear\",\"factor\":2.0,\"rope_theta\":1000000.0}}",
                           &c, &e),
                     0);
    assert_true(c.rope_theta == 1e6);
    assert_string_equal(c.rope_scaling, "linear");
    assert_true(c.rope_factor == 2.0);
    assert_int_equal(parse("{\"model_type\":\"llama\"," BASE ",\"rope_parameters\":{\"rope_type\":"
                           "\"llama3\",\"rope_theta\":500000.0,\"factor\":8.0,"
                           "\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,"
                           "\"original_max_position_embeddings\":8192}}",
                           &c, &e),
                     0);
    assert_string_equal(c.rope_scaling, "llama3");
    assert_true(c.rope_theta == 500000.0 && c.rope_factor == 8.0 && c.rope_orig_ctx == 8192);
    assert_int_equal(parse("{\"model_type\":\"gemma3_text\"," BASE ",\"head_dim\":16,"
                           "\"query_pre_attn_scalar\":16,\"sliding_window\":64,"
                           "\"rope_parameters\":{\"full_attention\":{\"rope_type\":\"linear\","
                           "\"factor\":8.0,\"rope_theta\":1000000.0},\"sliding_attention\":{"
                           "\"rope_type\":\"default\",\"rope_theta\":10000.0}}}",
                           &c, &e),
                     0);
    assert_true(c.rope_theta == 1e6 && c.rope_theta_swa == 1e4);
    assert_string_equal(c.rope_scaling, "linear");
    assert_true(c.rope_factor == 8.0);
    /* both spellings given: rope_parameters wins, scaling included */
    assert_int_equal(parse("{\"model_type\":\"llama\"," BASE ",\"rope_theta\":10000.0,"
                           "\"rope_scaling\":{\"rope_type\":\"linear\",\"factor\":4.0},"
                           "\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":5e5}}",
                           &c, &e),
                     0);
    assert_true(c.rope_theta == 5e5);
    assert_string_equal(c.rope_scaling, "");
    /* rope types the engine does not implement are refused, named, in either spelling */
    static const char *refused[][2] = {
        {"{\"model_type\":\"llama\"," BASE ",\"rope_parameters\":{\"rope_type\":\"yarn\","
         "\"factor\":4.0,\"rope_theta\":10000.0}}",
         "yarn"},
        {"{\"model_type\":\"llama\"," BASE ",\"rope_parameters\":{\"rope_type\":\"dynamic\","
         "\"factor\":4.0}}",
         "dynamic"},
        {"{\"model_type\":\"llama\"," BASE ",\"rope_parameters\":{\"rope_type\":\"longrope\"}}",
         "longrope"},
        {"{\"model_type\":\"llama\"," BASE ",\"rope_scaling\":{\"rope_type\":\"dynamic\","
         "\"factor\":4}}",
         "dynamic"},
        {"{\"model_type\":\"gemma3_text\"," BASE ",\"head_dim\":16,\"rope_parameters\":{"
         "\"full_attention\":{\"rope_type\":\"default\",\"rope_theta\":1e6},"
         "\"sliding_attention\":{\"rope_type\":\"yarn\",\"factor\":2.0,\"rope_theta\":1e4}}}",
         "yarn"},
        {"{\"model_type\":\"llama\"," BASE ",\"rope_parameters\":[1]}", "rope_parameters"},
        {"{\"model_type\":\"llama\"," BASE ",\"rope_parameters\":{\"rope_theta\":-1}}",
         "rope_theta"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        int rc = parse(refused[i][0], &c, &e);
        if ((rc != MD_EUNSUPP && rc != MD_EFORMAT) || !strstr(e.msg, refused[i][1]))
            fail_msg("case %zu: rc %d \"%s\" lacks \"%s\"", i, rc, e.msg, refused[i][1]);
    }
}

/* Gemma 3's layer pattern: sliding_window_pattern (v4) or layer_types (v5), passed on to the
 * engine's hparams; a list with no period that ends on a global layer is refused. */
static void gemma3_layer_types(void **state) {
    (void)state;
    hf_config c;
    md_err e = {0};
#define G3 "{\"model_type\":\"gemma3_text\"," BASE ",\"head_dim\":16,\"sliding_window\":8,"
    assert_int_equal(
        parse(G3 "\"layer_types\":[\"sliding_attention\",\"full_attention\"]}", &c, &e), 0);
    assert_int_equal(c.swa_pattern, 2);
    assert_int_equal(parse(G3 "\"sliding_window_pattern\":3}", &c, &e), 0);
    assert_int_equal(c.swa_pattern, 3);
    /* a causal Gemma 3 may say so */
    assert_int_equal(parse(G3 "\"use_bidirectional_attention\":false}", &c, &e), 0);
    assert_int_equal(
        parse(G3 "\"layer_types\":[\"sliding_attention\",\"sliding_attention\"]}", &c, &e), 0);
    assert_int_equal(c.swa_pattern, 0); /* every layer slides */
    assert_int_equal(parse(G3 "\"layer_types\":[\"full_attention\",\"full_attention\"]}", &c, &e),
                     0);
    assert_int_equal(c.sliding_window, 0); /* no layer slides */
    static const char *refused[] = {
        G3 "\"layer_types\":[\"full_attention\",\"sliding_attention\"]}",
        G3 "\"layer_types\":[\"sliding_attention\"]}",
        G3 "\"layer_types\":[\"sliding_attention\",\"chunked_attention\"]}",
        G3 "\"layer_types\":\"sliding_attention\"}",
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        int rc = parse(refused[i], &c, &e);
        if ((rc != MD_EUNSUPP && rc != MD_EFORMAT) || !strstr(e.msg, "layer_types"))
            fail_msg("case %zu: rc %d \"%s\" lacks layer_types", i, rc, e.msg);
    }
#undef G3
    /* the pattern reaches the engine */
    snprintf(tmpdir, sizeof tmpdir, "/tmp/medley-hf-XXXXXX");
    assert_non_null(mkdtemp(tmpdir));
    const char *cfg = "{\"model_type\":\"gemma3_text\",\"hidden_size\":8,\"num_hidden_layers\":4,"
                      "\"num_attention_heads\":2,\"head_dim\":4,\"intermediate_size\":16,"
                      "\"vocab_size\":10,\"max_position_embeddings\":64,\"sliding_window\":4,"
                      "\"query_pre_attn_scalar\":4,\"layer_types\":[\"sliding_attention\","
                      "\"full_attention\",\"sliding_attention\",\"full_attention\"]}";
    put_file("config.json", cfg, strlen(cfg));
    put_weights(tiny_names, tiny_shapes, 1);
    gguf_file *gf = NULL;
    md_hparams hp;
    if (md_model_open(tmpdir, &gf, &e) || md_hparams_read(gf, &hp, &e))
        fail_msg("%s", e.msg);
    assert_int_equal(hp.n_swa, 4);
    assert_true(md_layer_is_swa(&hp, 0) && !md_layer_is_swa(&hp, 1) && md_layer_is_swa(&hp, 2) &&
                !md_layer_is_swa(&hp, 3));
    gguf_close(gf);
    rm_tmpdir();
}

/* A FIFO (or any non-regular file) where a model or tokenizer file should be is refused at
 * once; opening it for reading would wait for a writer forever. alarm() turns a hang into a
 * failure. */
static void fifo_refused(void **state) {
    (void)state;
    md_err e = {0};
    gguf_file *gf = NULL;
    char p[256];
    snprintf(tmpdir, sizeof tmpdir, "/tmp/medley-hf-XXXXXX");
    assert_non_null(mkdtemp(tmpdir));
    alarm(20);
    snprintf(p, sizeof p, "%s/m.gguf", tmpdir);
    assert_int_equal(mkfifo(p, 0600), 0);
    assert_int_not_equal(md_model_open(p, &gf, &e), 0);
    assert_non_null(strstr(e.msg, "not a regular file"));
    const char *cfg = "{\"model_type\":\"llama\",\"hidden_size\":8,\"num_hidden_layers\":1,"
                      "\"num_attention_heads\":2,\"intermediate_size\":16,\"vocab_size\":10,"
                      "\"max_position_embeddings\":64}";
    put_file("config.json", cfg, strlen(cfg));
    snprintf(p, sizeof p, "%s/model.safetensors", tmpdir);
    assert_int_equal(mkfifo(p, 0600), 0);
    assert_int_not_equal(md_model_open(tmpdir, &gf, &e), 0);
    assert_non_null(strstr(e.msg, "not a regular file"));
    unlink(p);
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", tmpdir);
    assert_int_equal(mkfifo(p, 0600), 0);
    assert_int_not_equal(md_model_open(tmpdir, &gf, &e), 0);
    assert_non_null(strstr(e.msg, "not a regular file"));
    unlink(p);
    snprintf(p, sizeof p, "%s/config.json", tmpdir);
    unlink(p);
    assert_int_equal(mkfifo(p, 0600), 0);
    assert_int_not_equal(hf_open_dir(tmpdir, &gf, &e), 0);
    assert_non_null(strstr(e.msg, "not a regular file"));
    snprintf(p, sizeof p, "%s/tokenizer.json", tmpdir);
    assert_int_equal(mkfifo(p, 0600), 0);
    tok_tokenizer *t = NULL;
    assert_int_not_equal(tok_load_hf(tmpdir, &t, &e), 0);
    assert_non_null(strstr(e.msg, "not a regular file"));
    unlink(p);
    put_file("tokenizer.json", "{}", 2);
    snprintf(p, sizeof p, "%s/tokenizer_config.json", tmpdir);
    assert_int_equal(mkfifo(p, 0600), 0);
    assert_int_not_equal(tok_load_hf(tmpdir, &t, &e), 0);
    alarm(0);
    rm_tmpdir();
}

/* tokenizer.json is parsed whole by jansson, which takes 30-40 times the file's size for dense
 * arrays (a 60 MB file of short merges: 2.1 GB). The size cap bounds that: a sparse file one
 * byte over 64 MiB is refused by its size, before a byte is read. */
static void oversized_tokenizer_refused_by_size(void **state) {
    (void)state;
    md_err e = {0};
    char p[256];
    snprintf(tmpdir, sizeof tmpdir, "/tmp/medley-hf-XXXXXX");
    assert_non_null(mkdtemp(tmpdir));
    snprintf(p, sizeof p, "%s/tokenizer.json", tmpdir);
    FILE *fp = fopen(p, "wb");
    assert_non_null(fp);
    assert_int_equal(ftruncate(fileno(fp), (off_t)(64 << 20) + 1), 0);
    fclose(fp);
    tok_tokenizer *t = NULL;
    assert_int_equal(tok_load_hf(tmpdir, &t, &e), MD_ERANGE);
    if (!strstr(e.msg, "67108864"))
        fail_msg("\"%s\" does not state the 64 MiB cap", e.msg);
    rm_tmpdir();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(architectures_map),  cmocka_unit_test(refusals_name_the_problem),
        cmocka_unit_test(tensor_names),       cmocka_unit_test(tiny_directory),
        cmocka_unit_test(rope_parameters_v5), cmocka_unit_test(gemma3_layer_types),
        cmocka_unit_test(fifo_refused),       cmocka_unit_test(oversized_tokenizer_refused_by_size),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
