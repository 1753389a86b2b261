/* tool_calls.h — a line's functions on their way into the prompt and its calls on their way
 * out of the answer (docs/structured.md, "Tool calls"): the system text of medley's own call
 * format ("required" / a named function, for templates without one), the functions as the
 * JSON a template's own format lists ("auto"), and the calls read back from generated text.
 *
 * Ownership: strings from wk_tools_* are malloc'd (caller frees); a wk_calls holds its
 * strings until wk_calls_free. */
#ifndef MEDLEY_WORKER_TOOL_CALLS_H
#define MEDLEY_WORKER_TOOL_CALLS_H

#include "common/err.h"
#include "engine/tokenizer/chat_tools.h"
#include "queue/validate.h"
#include "worker/runner.h"

/* The functions a "required" or named call may name, described in the system turn, then the
 * line's own system text own (NULL: none). */
int wk_tools_system_text(const q_request *req, const char *own, char **out, md_err *e);
/* req's functions as a JSON array of OpenAI tool objects [{"type": "function",
 * "function": {name, description, parameters}}] (what a template's tool format lists): a new
 * reference, NULL when out of memory. */
json_t *wk_tools_array(const q_request *req);
/* The call schema of req (con_text, built by queue/validate_constraint.c with "arguments")
 * with the arguments member named key instead (Llama 3's "parameters"). 0, or -1 when out
 * of memory (req unchanged). */
int wk_tools_rename_args(q_request *req, const char *key);

typedef struct {
    char *content; /* text before the calls ("" when none) */
    wk_call *calls;
    int n;
    json_t *doc; /* what the names point into */
} wk_calls;
/* The calls in text: medley's own format (format TOK_TOOLS_NONE: the whole text is one
 * {"name", "arguments"} object) or a template's. 1 when it holds well-formed calls (*c
 * filled), 0 when not (the text stays content). */
int wk_calls_read(wk_calls *c, const char *text, tok_tool_format format);
void wk_calls_free(wk_calls *c);

#endif
