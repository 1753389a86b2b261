/* chat_tools.h — tool-call formats of chat templates (docs/structured.md, "tool_choice
 * auto"): which format a model's template defines, its markup (what a call looks like, for
 * the grammar that enforces it), rendering a conversation with its functions, and reading the
 * calls back out of the generated text.
 *
 * Ownership: tok_chat_apply_tools's prompt is the caller's (free); tok_tool_calls_parse's
 * array is the caller's (json_decref). */
#ifndef MEDLEY_ENGINE_TOKENIZER_CHAT_TOOLS_H
#define MEDLEY_ENGINE_TOKENIZER_CHAT_TOOLS_H

#include <jansson.h>
#include <stddef.h>

#include "engine/tokenizer/tokenizer.h"

typedef enum {
    TOK_TOOLS_NONE = 0, /* the template defines no tool-call format */
    TOK_TOOLS_HERMES,   /* Qwen2.5/3, Hermes: <tool_call>{...}</tool_call> */
    TOK_TOOLS_MISTRAL,  /* Mistral: [TOOL_CALLS] [{...}, ...] */
    TOK_TOOLS_LLAMA3,   /* Llama 3.1+: the answer is one bare JSON call {"name", "parameters"} */
} tok_tool_format;

/* The markup of a format's calls. The answer is free text until trigger; from trigger on it
 * is prefix, 1 to n items (item_open, {"name": ..., "arguments": {...}}, item_close)
 * separated by sep, then suffix, where a space stands for optional whitespace (the grammar's
 * gr_frame). */
typedef struct {
    const char *trigger;
    const char *prefix, *item_open, *item_close, *sep, *suffix;
    int anchored;         /* the trigger counts only at the start of the answer */
    int max_calls;        /* the most calls one answer may hold */
    const char *args_key; /* the call's arguments member: "arguments" or "parameters" */
} tok_tool_markup;

/* The format of t's template: the one --chat-template forced ("hermes"), else recognised by
 * markers in the template text. */
tok_tool_format tok_tool_format_of(const tok_tokenizer *t);
const char *tok_tool_format_name(tok_tool_format f);
/* NULL for TOK_TOOLS_NONE. */
const tok_tool_markup *tok_tool_markup_of(tok_tool_format f);

/* Render msgs with the functions (tools: a JSON array of OpenAI tool objects
 * [{"type": "function", "function": {...}}], borrowed) where t's format puts them, and the
 * assistant's opening. MD_EUNSUPP when t's template has no implemented tool format; MD_EINVAL
 * when tools is not an array. */
int tok_chat_apply_tools(const tok_tokenizer *t, const tok_chat_msg *msgs, int n_msgs,
                         const json_t *tools, char **out, md_err *e);

/* The calls in generated text of format f: 1 with *calls an array of {"name": string,
 * "arguments": object} (Llama 3's "parameters" read as "arguments") and *content_len the bytes of
 * text before the markup (trailing whitespace left out); 0 when the text holds no well-formed calls
 * (then the whole text is content). */
int tok_tool_calls_parse(tok_tool_format f, const char *text, size_t *content_len, json_t **calls);

#endif
