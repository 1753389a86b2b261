/* test_chat_tools.c — tool-call formats of chat templates (engine/tokenizer/chat_tools.h):
 * a conversation rendered with its functions in the Hermes (Qwen2.5) and Mistral formats,
 * calls read back out of generated text (well formed, several, text before them, broken
 * ones left as content), and the framed grammar that enforces a format's calls
 * (gr_from_json_schema_framed): what it accepts and refuses, and its limit on calls. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "engine/grammar/grammar.h"
#include "engine/tokenizer/chat_tools.h"
#include "engine/tokenizer/vocab.h"

static const char k_tools[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":"
    "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}}}]";
static const tok_chat_msg k_conv[] = {{"system", "Be brief."}, {"user", "Weather in Paris?"}};

/* Render conv in family tmpl with k_tools (parsed here, as the worker hands them over). */
static int render_tools(tok_template tmpl, const tok_chat_msg *conv, int n, char **p, md_err *e) {
    json_t *tools = json_loads(k_tools, 0, NULL);
    assert_non_null(tools);
    int rc = tok_chat_render(NULL, tmpl, conv, n, 1, tools, p, e);
    json_decref(tools);
    return rc;
}

static void hermes_lists_the_functions_in_the_system_turn(void **st) {
    char *p = NULL;
    md_err e = {0};
    assert_int_equal(render_tools(TOK_TMPL_CHATML, k_conv, 2, &p, &e), 0);
    assert_string_equal(
        p, "<|im_start|>system\nBe brief.\n\n# Tools\n\nYou may call one or more functions to "
           "assist with the user query.\n\nYou are provided with function signatures within "
           "<tools></tools> XML tags:\n<tools>\n{\"type\": \"function\", \"function\": "
           "{\"name\": \"get_weather\", \"parameters\": {\"type\": \"object\", \"properties\": "
           "{\"city\": {\"type\": \"string\"}}}}}\n</tools>\n\nFor each function call, return a "
           "json object with function name and arguments within <tool_call></tool_call> XML "
           "tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
           "<args-json-object>}\n</tool_call><|im_end|>\n<|im_start|>user\nWeather in "
           "Paris?<|im_end|>\n<|im_start|>assistant\n");
    free(p);
}

static void mistral_puts_available_tools_before_the_last_inst(void **st) {
    static const tok_chat_msg conv[] = {
        {"user", "Hi"}, {"assistant", "Hello"}, {"system", "Be brief."}, {"user", "Weather?"}};
    char *p = NULL;
    md_err e = {0};
    assert_int_equal(render_tools(TOK_TMPL_MISTRAL, conv, 4, &p, &e), 0);
    assert_string_equal(p, "[INST] Hi[/INST] Hello</s>[AVAILABLE_TOOLS] [{\"type\": "
                           "\"function\", \"function\": {\"name\": \"get_weather\", "
                           "\"parameters\": {\"type\": \"object\", \"properties\": {\"city\": "
                           "{\"type\": \"string\"}}}}}][/AVAILABLE_TOOLS][INST] Be brief.\n\n"
                           "Weather?[/INST]");
    free(p);
}

static void llama3_lists_the_functions_in_the_first_user_turn(void **st) {
    char *p = NULL;
    md_err e = {0};
    assert_int_equal(render_tools(TOK_TMPL_LLAMA3, k_conv, 2, &p, &e), 0);
    assert_string_equal(
        p, "<|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\n\nBe brief."
           "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nGiven the following "
           "functions, please respond with a JSON for a function call with its proper arguments "
           "that best answers the given prompt.\n\nRespond in the format {\"name\": function "
           "name, \"parameters\": dictionary of argument name and its value}.Do not use "
           "variables.\n\n{\n    \"type\": \"function\",\n    \"function\": {\n        "
           "\"name\": \"get_weather\",\n        \"parameters\": {\n            \"type\": "
           "\"object\",\n            \"properties\": {\n                \"city\": {\n         "
           "           \"type\": \"string\"\n                }\n            }\n        }\n    "
           "}\n}\n\nWeather in Paris?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
    free(p);
}

/* Tools that are not an array are refused in every family, not rendered as no functions. */
static void tools_that_are_not_an_array_are_refused(void **st) {
    static const tok_template fam[] = {TOK_TMPL_CHATML, TOK_TMPL_LLAMA3, TOK_TMPL_MISTRAL};
    json_t *obj = json_loads(k_tools + 1, JSON_DISABLE_EOF_CHECK, NULL);
    assert_true(json_is_object(obj));
    for (size_t f = 0; f < sizeof fam / sizeof *fam; f++) {
        char *p = NULL;
        md_err e = {0};
        assert_int_equal(tok_chat_render(NULL, fam[f], k_conv, 2, 1, obj, &p, &e), MD_EINVAL);
        assert_null(p);
        assert_non_null(strstr(e.msg, "not an array"));
    }
    json_decref(obj);
}

static void calls_are_read_back_in_each_format(void **st) {
    size_t n = 0;
    json_t *c = NULL;
    const char *h = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                    "{\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>{\"name\":\"add\","
                    "\"arguments\":{}}</tool_call>\n";
    assert_int_equal(tok_tool_calls_parse(TOK_TOOLS_HERMES, h, &n, &c), 1);
    assert_int_equal(n, strlen("Let me check."));
    assert_int_equal(json_array_size(c), 2);
    assert_string_equal(json_string_value(json_object_get(json_array_get(c, 1), "name")), "add");
    json_decref(c);
    const char *m = "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"X\"}}]";
    assert_int_equal(tok_tool_calls_parse(TOK_TOOLS_MISTRAL, m, &n, &c), 1);
    assert_int_equal(n, 0);
    assert_int_equal(json_array_size(c), 1);
    json_decref(c);
    /* broken calls, trailing text, no markup, a call without arguments: content */
    static const char *const bad[] = {
        "<tool_call>{\"name\": \"x\", \"arguments\": {}}",
        "<tool_call>{\"name\": \"x\", \"arguments\": {}}</tool_call> and more",
        "plain text",
        "<tool_call>{\"name\": \"x\"}</tool_call>",
        "<tool_call>{\"name\": 3, \"arguments\": {}}</tool_call>",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        assert_int_equal(tok_tool_calls_parse(TOK_TOOLS_HERMES, bad[i], &n, &c), 0);
        assert_null(c);
        assert_int_equal(n, strlen(bad[i]));
    }
    assert_int_equal(
        tok_tool_calls_parse(TOK_TOOLS_MISTRAL, "[TOOL_CALLS] [{\"name\": 1}]", &n, &c), 0);
    assert_int_equal(tok_tool_calls_parse(TOK_TOOLS_NONE, h, &n, &c), 0);
    /* Llama 3: the whole answer is one call, "parameters" read as "arguments" */
    assert_int_equal(tok_tool_calls_parse(TOK_TOOLS_LLAMA3,
                                          " {\"name\": \"f\", \"parameters\": {\"a\": 1}}\n", &n,
                                          &c),
                     1);
    assert_int_equal(n, 0);
    assert_int_equal(json_integer_value(
                         json_object_get(json_object_get(json_array_get(c, 0), "arguments"), "a")),
                     1);
    json_decref(c);
    assert_int_equal(tok_tool_calls_parse(TOK_TOOLS_LLAMA3,
                                          "Sure: {\"name\": \"f\", "
                                          "\"parameters\": {}}",
                                          &n, &c),
                     0);
}

static int accepts(const gr_grammar *g, const char *s) {
    static const char *const toks[] = {"a"};
    static const uint32_t lens[] = {1};
    gr_vocab *v = NULL;
    gr_matcher *m = NULL;
    md_err e = {0};
    int32_t eos = 0;
    if (gr_vocab_new(1, toks, lens, &eos, 0, &v, &e) || gr_matcher_new(g, v, &m, &e))
        fail_msg("matcher: %s", e.msg);
    int ok = gr_matcher_accept_bytes(m, s, strlen(s)) == 0 && gr_matcher_can_end(m);
    gr_matcher_free(m);
    gr_vocab_free(v);
    return ok;
}

static gr_grammar *framed(tok_tool_format f, int max) {
    static const char schema[] = "{\"type\":\"object\",\"properties\":{\"name\":{\"const\":\"f\"},"
                                 "\"arguments\":{\"type\":\"object\",\"properties\":{\"a\":"
                                 "{\"type\":\"integer\"}},\"additionalProperties\":false}},"
                                 "\"required\":[\"name\",\"arguments\"],"
                                 "\"additionalProperties\":false}";
    const tok_tool_markup *k = tok_tool_markup_of(f);
    gr_frame fr = {k->prefix, k->item_open, k->item_close, k->sep, k->suffix, max};
    gr_grammar *g = NULL;
    md_err e = {0};
    if (gr_from_json_schema_framed(schema, strlen(schema), 1, &fr, &g, NULL, 0, &e))
        fail_msg("framed: %s", e.msg);
    return g;
}

static void framed_grammar_holds_the_calls_to_their_format(void **st) {
    gr_grammar *g = framed(TOK_TOOLS_HERMES, 2);
    const char *one = "<tool_call>\n{\"name\":\"f\",\"arguments\":{\"a\":1}}\n</tool_call>";
    assert_true(accepts(g, one));
    assert_true(accepts(g, "<tool_call>{\"name\":\"f\",\"arguments\":{}}</tool_call>\n"));
    assert_true(accepts(g, "<tool_call>{\"name\":\"f\",\"arguments\":{}}</tool_call>\n"
                           "<tool_call>{\"name\":\"f\",\"arguments\":{\"a\":2}}</tool_call>"));
    /* a third call past max_items, a wrong name, an extra argument, a missing close */
    assert_false(accepts(g, "<tool_call>{\"name\":\"f\",\"arguments\":{}}</tool_call>"
                            "<tool_call>{\"name\":\"f\",\"arguments\":{}}</tool_call>"
                            "<tool_call>{\"name\":\"f\",\"arguments\":{}}</tool_call>"));
    assert_false(accepts(g, "<tool_call>{\"name\":\"g\",\"arguments\":{}}</tool_call>"));
    assert_false(accepts(g, "<tool_call>{\"name\":\"f\",\"arguments\":{\"b\":1}}</tool_call>"));
    assert_false(accepts(g, "<tool_call>{\"name\":\"f\",\"arguments\":{}}"));
    gr_free(g);
    g = framed(TOK_TOOLS_MISTRAL, 4);
    assert_true(accepts(g, "[TOOL_CALLS] [{\"name\":\"f\",\"arguments\":{}}, "
                           "{\"name\":\"f\",\"arguments\":{\"a\":3}}]"));
    assert_false(accepts(g, "[TOOL_CALLS] {\"name\":\"f\",\"arguments\":{}}"));
    gr_free(g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(hermes_lists_the_functions_in_the_system_turn),
        cmocka_unit_test(mistral_puts_available_tools_before_the_last_inst),
        cmocka_unit_test(llama3_lists_the_functions_in_the_first_user_turn),
        cmocka_unit_test(tools_that_are_not_an_array_are_refused),
        cmocka_unit_test(calls_are_read_back_in_each_format),
        cmocka_unit_test(framed_grammar_holds_the_calls_to_their_format),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
