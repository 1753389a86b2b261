/* validate.h — checks one OpenAI Batch input line (schemas/input-line.schema.json) and turns
 * it into a q_request the runners understand. A line that fails gets a q_verr: the
 * OpenAI-style error code, the offending parameter and a human message, which the worker
 * writes as an error output line.
 *
 * Ownership: q_request points into its own parsed JSON (req->root) and into req->text (the
 * joined content parts); q_request_free() releases both. */
#ifndef MEDLEY_QUEUE_VALIDATE_H
#define MEDLEY_QUEUE_VALIDATE_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#define Q_MAX_STOP 4
#define Q_MAX_MSGS 256
#define Q_MAX_TOP_LOGPROBS 20       /* chat's top_logprobs, as OpenAI bounds it */
#define Q_MAX_COMPLETION_LOGPROBS 5 /* completions' logprobs, as OpenAI bounds it */
#define Q_MAX_LOGIT_BIAS 1024       /* logit_bias entries (OpenAI documents no bound) */
#define Q_MAX_TOOLS 128             /* tools, as OpenAI bounds them */
#define Q_MAX_CHOICES 4096          /* medley.choice strings */
#define Q_MAX_EMBED_INPUTS 2048     /* inputs of one /v1/embeddings line, as OpenAI bounds them */

/* One input of a /v1/embeddings line: a string (text, len bytes; borrowed from the parsed
 * line) or token ids (ids [n_ids], into q_request.emb_ids); the other is NULL. */
typedef struct {
    const char *text;
    size_t len;
    const int32_t *ids;
    int n_ids;
} q_embed_input;

typedef struct {
    size_t max_line_bytes;  /* larger lines are refused unparsed (default 1 MiB) */
    int max_tokens_default; /* when the body has no max_tokens (default 256) */
    int max_tokens_limit;   /* largest max_tokens accepted (default 32768) */
    /* 1: an online request (`medley api`'s /v1/chat/completions and /v1/completions, the
     * online lane of docs/protocol.md §9): body.stream and body.stream_options are taken
     * instead of refused; 0 (default): a batch line */
    int online;
} q_limits;
void q_limits_default(q_limits *l);

typedef struct {
    const char *role, *content;
} q_msg;

/* The one output constraint of a line (docs/structured.md, "Request side"): at most one of
 * response_format json_object / json_schema, tools with tool_choice "required" or a named
 * function, medley.regex, medley.choice, medley.grammar. */
typedef enum {
    Q_CON_NONE,
    Q_CON_JSON_OBJECT, /* any JSON object */
    Q_CON_JSON_SCHEMA, /* con_text: the schema, compact JSON (a tool call's is built here) */
    Q_CON_REGEX,       /* con_text: the regular expression */
    Q_CON_CHOICE,      /* con_text: the choices as a compact JSON array of strings */
    Q_CON_GRAMMAR,     /* con_text: EBNF, start rule "root" */
} q_con_kind;

/* tool_choice, after defaults: "none" when there are no tools, "auto" when there are. */
typedef enum { Q_TOOLS_NONE, Q_TOOLS_AUTO, Q_TOOLS_REQUIRED, Q_TOOLS_NAMED } q_tool_choice;

typedef struct {
    const char *name;        /* ^[A-Za-z0-9_-]{1,64}$ */
    const char *description; /* NULL when absent */
    json_t *parameters;      /* the JSON Schema object; borrowed from root, NULL when absent */
    int strict;
} q_tool;

typedef struct {
    const char *custom_id; /* NULL when the line has none that is usable */
    int chat;              /* 1: /v1/chat/completions, 0: /v1/completions */
    /* 1: /v1/embeddings (chat 0; none of the generation fields below is set): emb_in
     * [n_emb_in] the inputs (malloc'd, as emb_ids, their token ids; freed with req),
     * encoding_format base64, dimensions (0: the model's), medley.truncate */
    int embed;
    q_embed_input *emb_in;
    int n_emb_in;
    int32_t *emb_ids;
    int emb_base64, emb_dimensions, emb_truncate;
    const char *url;
    const char *model; /* body.model; NULL when absent (the batch's model applies) */
    /* online requests only (q_limits.online): body.stream, and stream_options.include_usage
     * (a last chunk with the usage) */
    int stream, include_usage;
    q_msg msgs[Q_MAX_MSGS];
    int n_msgs;
    const char *prompt; /* /v1/completions */
    int max_tokens;
    double temperature, top_p;
    int top_k;                 /* 0: off (the body's -1 is off too) */
    double min_p;              /* 0: off */
    double repetition_penalty; /* 1: off */
    double presence_penalty;   /* 0: off */
    double frequency_penalty;  /* 0: off */
    /* Report the chosen tokens' logprobs: chat's logprobs: true, completions' logprobs
     * present; and that many of the most likely tokens at each (chat's top_logprobs,
     * completions' logprobs): 0..Q_MAX_TOP_LOGPROBS, 0..Q_MAX_COMPLETION_LOGPROBS. */
    int logprobs;
    int top_logprobs;
    long long seed;
    int has_seed;
    const char *stop[Q_MAX_STOP + 1]; /* NULL-terminated */
    int n_stop;
    /* logit_bias: n_bias token ids (not yet checked against a vocabulary: the runner does)
     * and the bias added to each one's logit, in [-100, 100]; malloc'd, freed with req */
    int32_t *bias_ids;
    float *bias;
    int n_bias;
    /* tools and tool_choice (Q_TOOLS_NONE: tools are ignored); tool_named: the index of the
     * function tool_choice names */
    q_tool tools[Q_MAX_TOOLS];
    int n_tools;
    q_tool_choice tool_choice;
    int tool_named;
    int parallel_tools; /* body.parallel_tool_calls (default true) */
    /* the constraint: what con_text holds, the body field that set it (for errors:
     * "body.response_format", "body.tools", "body.medley.regex", ...), strict semantics for
     * a schema (keywords medley cannot enforce are refused, not relaxed) */
    q_con_kind con;
    const char *con_param;
    char *con_text; /* malloc'd, NUL-terminated, con_len bytes; freed with req */
    size_t con_len;
    int con_strict;
    /* tool_choice "auto": con is the call schema, but it holds only once the model starts a
     * call in its chat template's tool-call format (docs/structured.md); before that the
     * answer is free text */
    int con_lazy;
    /* Set by the runner's check (worker/runner.h) for con_lazy: the tool-call markup of the
     * model's template (engine/tokenizer/chat_tools.h tok_tool_markup), which frames the
     * compiled grammar; NULL: the runner has none (an echo model ignores constraints). */
    const void *con_markup;
    /* Set by the worker once the constraint is compiled (worker/grammars.h), NULL before:
     * the grammar (borrowed from the worker's cache entry gentry, which the request holds a
     * reference to until wk_grammars_release), how long compiling took (0 on a cache hit),
     * and the keywords relaxed under strict: false ("" when none). */
    const struct gr_grammar *grammar;
    void *gentry;
    double compile_ms;
    int compile_cached;
    char relaxed[512];
    json_t *root;
    char *text; /* storage for content given as an array of parts */
} q_request;

typedef struct {
    char code[48];  /* OpenAI error code: invalid_json, missing_required_parameter, ... */
    char param[64]; /* the field, e.g. body.messages[2].content; empty if none */
    char message[512];
    int status; /* HTTP-like status for the output line (400) */
} q_verr;

#define Q_CUSTOM_ID_MAX 256 /* custom_ids are 1..255 bytes */

/* Bytes of a line a worker looks at for the custom_id of a line it does not parse. */
#define Q_SCAN_WINDOW 65536

/* The custom_id of a line too large to parse (longer than --max-line-bytes), as the worker
 * answers it: the value of the top-level object's first "custom_id" key within the first
 * Q_SCAN_WINDOW bytes, when it is a plain string (no escapes, no control bytes, 1..255
 * bytes); keys of nested objects (a body that holds "custom_id") are skipped. NULL when
 * there is none, and then the line is answered under #<entry id>. `medley submit` counts this
 * id too in its duplicate check, so the two agree (docs/protocol.md §3, §8). */
const char *q_scan_custom_id(const char *line, size_t len, char buf[Q_CUSTOM_ID_MAX]);

/* Validate line[0..len). Every body field either is used or refused (400
 * unsupported_parameter / unsupported_value naming it): docs/protocol.md has the table. A
 * constraint is checked for shape here and compiled by the worker (worker/grammars.h). Returns 0
 * with *req filled, or -1 with *ve filled; in both cases req->custom_id is set when the line had a
 * string custom_id (its storage is either the parsed JSON or custom_id_buf, CUSTOM_ID_MAX bytes),
 * and q_request_free() must be called. */
int q_validate(const char *line, size_t len, const q_limits *lim, q_request *req,
               char custom_id_buf[Q_CUSTOM_ID_MAX], q_verr *ve);
void q_request_free(q_request *req);

/* The request's prompt as one string for runners without a chat template (echo): the
 * last user message for chat, the prompt for completions. */
const char *q_request_prompt_text(const q_request *req);

#endif
