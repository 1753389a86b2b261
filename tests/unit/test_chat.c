/* test_chat.c — chat template rendering per family (tok_chat_apply_as with no model), the
 * template names, and bad messages. The expected prompts are llama.cpp's formats
 * (llm_chat_apply_template) written out by hand; detection from GGUF template text is in
 * test_tok_synth.c, SmolLM2's real template in test_tok_smollm.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "engine/tokenizer/tokenizer.h"

static const tok_chat_msg k_conv[] = {
    {"system", "You are a helpful assistant"},
    {"user", "Hello"},
    {"assistant", "  Hi there  "},
    {"user", "Who are you"},
};
#define N_CONV 4

static char *render(tok_template tmpl, int add_ass) {
    char *out = NULL;
    md_err e = {0};
    if (tok_chat_apply_as(NULL, tmpl, k_conv, N_CONV, add_ass, &out, &e))
        fail_msg("render %s: %s", tok_template_name(tmpl), e.msg);
    return out;
}

static void chatml_writes_every_turn_and_the_assistant_header(void **st) {
    char *p = render(TOK_TMPL_CHATML, 1);
    assert_string_equal(p, "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n"
                           "<|im_start|>user\nHello<|im_end|>\n"
                           "<|im_start|>assistant\n  Hi there  <|im_end|>\n"
                           "<|im_start|>user\nWho are you<|im_end|>\n"
                           "<|im_start|>assistant\n");
    free(p);
    p = render(TOK_TMPL_CHATML, 0);
    assert_null(strstr(p + strlen(p) - 30, "assistant\n"));
    free(p);
}

static void llama3_trims_contents_and_uses_header_ids(void **st) {
    char *p = render(TOK_TMPL_LLAMA3, 1);
    assert_string_equal(p, "<|start_header_id|>system<|end_header_id|>\n\nYou are a helpful "
                           "assistant<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHello<|"
                           "eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHi "
                           "there<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWho are "
                           "you<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
    free(p);
}

static void llama2_puts_the_system_prompt_in_sys_tags(void **st) {
    char *p = render(TOK_TMPL_LLAMA2, 1);
    assert_string_equal(p, "[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello "
                           "[/INST]  Hi there  </s>[INST] Who are you [/INST]");
    free(p);
}

static void mistral_v3_folds_the_system_prompt_into_the_first_turn(void **st) {
    char *p = render(TOK_TMPL_MISTRAL, 1);
    assert_string_equal(p, "[INST] You are a helpful assistant\n\nHello[/INST] Hi "
                           "there</s>[INST] Who are you[/INST]");
    free(p);
}

static void gemma_folds_the_system_prompt_into_the_first_user_turn(void **st) {
    char *p = render(TOK_TMPL_GEMMA, 1);
    assert_string_equal(p,
                        "<start_of_turn>user\nYou are a helpful assistant\n\nHello<end_of_turn>\n"
                        "<start_of_turn>model\nHi there<end_of_turn>\n"
                        "<start_of_turn>user\nWho are you<end_of_turn>\n"
                        "<start_of_turn>model\n");
    free(p);
    /* two system messages are joined; one after the model's turn opens the next user turn */
    static const tok_chat_msg conv[] = {{"system", " A. "}, {"system", "B"},    {"user", "u1"},
                                        {"system", "C"},    {"assistant", "a"}, {"user", "u2"}};
    char *out = NULL;
    md_err e = {0};
    assert_int_equal(tok_chat_apply_as(NULL, TOK_TMPL_GEMMA, conv, 6, 0, &out, &e), 0);
    assert_string_equal(out, "<start_of_turn>user\nA.B\n\nu1<end_of_turn>\n"
                             "<start_of_turn>model\na<end_of_turn>\n"
                             "<start_of_turn>user\nC\n\nu2<end_of_turn>\n");
    free(out);
}

static void names_round_trip_and_unknown_names_are_none(void **st) {
    for (int i = TOK_TMPL_CHATML; i <= TOK_TMPL_GEMMA; i++)
        assert_int_equal(tok_template_from_name(tok_template_name((tok_template)i)), i);
    assert_int_equal(tok_template_from_name("zephyr"), TOK_TMPL_NONE);
    assert_int_equal(tok_template_from_name(NULL), TOK_TMPL_NONE);
    assert_string_equal(tok_template_name((tok_template)99), "none");
}

static void bad_messages_and_no_template_are_clear_errors(void **st) {
    char *out = (char *)1;
    md_err e = {0};
    tok_chat_msg bad[] = {{"user", NULL}};
    assert_int_equal(tok_chat_apply_as(NULL, TOK_TMPL_CHATML, bad, 1, 1, &out, &e), MD_EINVAL);
    assert_null(out);
    assert_non_null(strstr(e.msg, "message 0 has no content"));
    assert_int_equal(tok_chat_apply_as(NULL, TOK_TMPL_NONE, k_conv, 1, 1, &out, &e), MD_EUNSUPP);
    assert_int_equal(tok_chat_apply(NULL, k_conv, 1, 1, &out, &e), MD_EUNSUPP);
    assert_non_null(strstr(e.msg, "no chat template"));
    /* an empty conversation is an empty prompt (plus the header when asked) */
    assert_int_equal(tok_chat_apply_as(NULL, TOK_TMPL_CHATML, NULL, 0, 1, &out, &e), 0);
    assert_string_equal(out, "<|im_start|>assistant\n");
    free(out);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(chatml_writes_every_turn_and_the_assistant_header),
        cmocka_unit_test(llama3_trims_contents_and_uses_header_ids),
        cmocka_unit_test(llama2_puts_the_system_prompt_in_sys_tags),
        cmocka_unit_test(mistral_v3_folds_the_system_prompt_into_the_first_turn),
        cmocka_unit_test(gemma_folds_the_system_prompt_into_the_first_user_turn),
        cmocka_unit_test(names_round_trip_and_unknown_names_are_none),
        cmocka_unit_test(bad_messages_and_no_template_are_clear_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
