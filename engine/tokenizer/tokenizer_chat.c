/* tokenizer_chat.c — chat templates: which family a GGUF's tokenizer.chat_template text
 * belongs to, and rendering messages in it.
 *
 * Not a Jinja interpreter: like llama.cpp's llm_chat_detect_template, the family is
 * recognised by markers in the template text, and each family is rendered by code. The
 * formats follow llama.cpp's llm_chat_apply_template (facts only):
 *   chatml   <|im_start|>ROLE\nCONTENT<|im_end|>\n ... [<|im_start|>assistant\n]
 *   llama3   <|start_header_id|>ROLE<|end_header_id|>\n\nTRIM(CONTENT)<|eot_id|> ...
 *            [<|start_header_id|>assistant<|end_header_id|>\n\n]
 *   llama2   [INST] <<SYS>>\nSYS\n<</SYS>>\n\nUSER [/INST]ASSISTANT</s>[INST] ...
 *            (variants: without <<SYS>>, <s> inside the history, stripped contents)
 *   mistral  v1 " [INST] USER [/INST] ASSISTANT</s>", v3 "[INST] USER[/INST] ASSISTANT</s>",
 *            v3-tekken (no space after [INST]/before the answer), v7 with [SYSTEM_PROMPT]
 *   gemma    <start_of_turn>user\nTRIM(SYSTEM)\n\nTRIM(USER)<end_of_turn>\n
 *            <start_of_turn>model\nTRIM(ASSISTANT)<end_of_turn>\n ... [<start_of_turn>model\n]
 * BOS is not written: tok_encode adds it when the model asks (add_bos_token).
 * One addition over llama.cpp: a ChatML template that writes a literal system turn (SmolLM2's
 * "You are a helpful AI assistant named SmolLM...", Qwen2.5's "You are Qwen...") gets that
 * system turn when the messages do not start with one, as the Jinja template would. */
#include <ctype.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "engine/tokenizer/vocab.h"

enum {
    V_NONE = 0,
    /* llama2 */
    V_L2_PLAIN,
    V_L2_SYS,
    V_L2_SYS_BOS,
    V_L2_SYS_STRIP,
    /* mistral */
    V_M_V1,
    V_M_V3,
    V_M_V3_TEKKEN,
    V_M_V7,
    V_M_V7_TEKKEN,
};

static const char *const k_names[] = {"none", "chatml", "llama3", "llama2", "mistral", "gemma"};
#define KNOWN_NAMES "chatml, hermes, llama3, llama3-json, llama2, mistral, gemma"

const char *tok_template_name(tok_template tmpl) {
    if ((int)tmpl < 0 || (int)tmpl >= (int)(sizeof k_names / sizeof *k_names))
        return "none";
    return k_names[tmpl];
}

tok_template tok_template_from_name(const char *name) {
    for (int i = 1; i < (int)(sizeof k_names / sizeof *k_names); i++)
        if (name && !strcmp(name, k_names[i]))
            return (tok_template)i;
    return TOK_TMPL_NONE;
}

static int has(const char *s, const char *needle) {
    return s && strstr(s, needle) != NULL;
}

/* Family and variant of a template text (llama.cpp's detection order). */
static tok_template detect(const char *s, int *variant) {
    *variant = V_NONE;
    if (!s || !*s)
        return TOK_TMPL_NONE;
    tok_template named = tok_template_from_name(s);
    if (named != TOK_TMPL_NONE) {
        *variant = named == TOK_TMPL_LLAMA2 ? V_L2_SYS : named == TOK_TMPL_MISTRAL ? V_M_V3 : 0;
        return named;
    }
    if (has(s, "<|im_start|>")) {
        /* Phi-4 (<|im_sep|>) and SmolVLM (<end_of_utterance>) only look like ChatML */
        if (has(s, "<|im_sep|>") || has(s, "<end_of_utterance>"))
            return TOK_TMPL_NONE;
        return TOK_TMPL_CHATML;
    }
    if (!strncmp(s, "mistral", 7) || has(s, "[INST]")) {
        if (has(s, "[SYSTEM_PROMPT]")) {
            *variant = has(s, "[SYSTEM_PROMPT] ") || has(s, "[INST] ") ? V_M_V7 : V_M_V7_TEKKEN;
            return TOK_TMPL_MISTRAL;
        }
        if (has(s, "' [INST] ' + system_message") || has(s, "[AVAILABLE_TOOLS]")) {
            *variant = has(s, " [INST]") ? V_M_V1 : has(s, "\"[INST]\"") ? V_M_V3_TEKKEN : V_M_V3;
            return TOK_TMPL_MISTRAL;
        }
        *variant = has(s, "content.strip()")       ? V_L2_SYS_STRIP
                   : has(s, "bos_token + '[INST]") ? V_L2_SYS_BOS
                   : has(s, "<<SYS>>")             ? V_L2_SYS
                                                   : V_L2_PLAIN;
        return TOK_TMPL_LLAMA2;
    }
    if (has(s, "<|start_header_id|>") && has(s, "<|end_header_id|>"))
        return TOK_TMPL_LLAMA3;
    if (has(s, "<start_of_turn>"))
        return TOK_TMPL_GEMMA;
    return TOK_TMPL_NONE;
}

tok_template tok_chat_template(const tok_tokenizer *t) {
    int v;
    if (t && t->chat_forced)
        return t->chat_forced_tmpl;
    return detect(t ? t->chat_template : NULL, &v);
}

int tok_chat_choose(tok_tokenizer *t, const char *name, md_err *e) {
    int v;
    t->tools_forced = 0;
    /* a family with a tool-call format its template text does not show (chat_tools.c):
     * hermes = ChatML with <tool_call>, llama3-json = Llama 3 with its JSON calls */
    if (name && (!strcmp(name, "hermes") || !strcmp(name, "llama3-json"))) {
        t->chat_forced = 1;
        t->chat_forced_tmpl = name[0] == 'h' ? TOK_TMPL_CHATML : TOK_TMPL_LLAMA3;
        t->tools_forced = 1;
        return 0;
    }
    if (name) {
        tok_template tmpl = tok_template_from_name(name);
        if (tmpl == TOK_TMPL_NONE && strcmp(name, "none"))
            return md_errf(e, MD_EINVAL,
                           "--chat-template '%.60s' is not a template medley knows (" KNOWN_NAMES
                           ", or none for raw prompts only)",
                           name);
        t->chat_forced = 1;
        t->chat_forced_tmpl = tmpl;
        return 0;
    }
    t->chat_forced = 0;
    if (!t->chat_template || detect(t->chat_template, &v) != TOK_TMPL_NONE)
        return 0;
    return md_errf(e, MD_EUNSUPP,
                   "the model's chat template is not one medley recognises (" KNOWN_NAMES
                   "); it starts: \"%.60s%s\"; name one with --chat-template NAME, or "
                   "--chat-template none to serve raw prompts only",
                   t->chat_template, t->chat_template_len > 60 ? "..." : "");
}

/* ---- output buffer ---- */

typedef struct {
    char *p;
    size_t n, cap;
    int oom;
} sbuf;

static void put(sbuf *b, const char *s, size_t n) {
    if (b->oom)
        return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *np = realloc(b->p, cap);
        if (!np) {
            b->oom = 1;
            return;
        }
        b->p = np;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}
static void puts_(sbuf *b, const char *s) {
    put(b, s, strlen(s));
}

/* llama.cpp's trim: leading and trailing ASCII whitespace */
static void put_trim(sbuf *b, const char *s) {
    size_t n = strlen(s);
    while (n && isspace((unsigned char)*s))
        s++, n--;
    while (n && isspace((unsigned char)s[n - 1]))
        n--;
    put(b, s, n);
}

/* The literal system turn of a ChatML template, if it writes one ('<|im_start|>system\n'
 * followed by plain text up to <|im_end|>); unescapes \n. Returns a malloc'd string or NULL. */
static char *chatml_default_system(const char *tmpl) {
    if (!tmpl)
        return NULL;
    for (const char *p = strstr(tmpl, "<|im_start|>system"); p;
         p = strstr(p + 1, "<|im_start|>system")) {
        const char *q = p + strlen("<|im_start|>system");
        if (*q == '\n')
            q++;
        else if (q[0] == '\\' && q[1] == 'n')
            q += 2;
        else
            continue;
        const char *end = strstr(q, "<|im_end|>");
        if (!end || end == q)
            continue;
        int literal = 1;
        for (const char *c = q; c < end; c++)
            if (*c == '\'' || *c == '"' || *c == '{' || *c == '}' || *c == '+')
                literal = 0;
        if (!literal)
            continue;
        size_t span = (size_t)(end - q);
        if (span > 1 << 20)
            continue;
        char *out = malloc(span + 1);
        if (!out)
            return NULL;
        size_t w = 0;
        for (const char *c = q; c < end; c++) {
            if (c[0] == '\\' && c + 1 < end && c[1] == 'n') {
                out[w++] = '\n';
                c++;
            } else {
                out[w++] = *c;
            }
        }
        out[w] = '\0';
        return out;
    }
    return NULL;
}

/* One renderer per template family: messages m[0..n) into b, then the assistant's opening
 * when add_ass (the families whose format has one). */

/* Hermes-style tools (Qwen2.5/3's template): the functions in the system turn, after the
 * line's own system text or the template's default one. tools: a JSON array. */
static void chatml_tools_system(const tok_tokenizer *t, const tok_chat_msg *m, int n,
                                const json_t *tools, sbuf *b) {
    puts_(b, "<|im_start|>system\n");
    if (n > 0 && !strcmp(m[0].role, "system")) {
        puts_(b, m[0].content);
    } else {
        char *sys = chatml_default_system(t ? t->chat_template : NULL);
        puts_(b, sys ? sys : "");
        free(sys);
    }
    puts_(b, "\n\n# Tools\n\nYou may call one or more functions to assist with the user "
             "query.\n\nYou are provided with function signatures within <tools></tools> "
             "XML tags:\n<tools>");
    size_t i;
    json_t *x;
    json_array_foreach(tools, i, x) {
        char *one = json_dumps(x, JSON_ENCODE_ANY | JSON_PRESERVE_ORDER);
        puts_(b, "\n");
        puts_(b, one ? one : "");
        free(one);
    }
    puts_(b, "\n</tools>\n\nFor each function call, return a json object with function name "
             "and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
             "{\"name\": <function-name>, \"arguments\": <args-json-object>}\n"
             "</tool_call><|im_end|>\n");
}

static void render_chatml(const tok_tokenizer *t, const tok_chat_msg *m, int n, int add_ass,
                          const json_t *tools, sbuf *b) {
    if (tools) {
        chatml_tools_system(t, m, n, tools, b);
        if (n > 0 && !strcmp(m[0].role, "system")) {
            m++;
            n--;
        }
    } else if (n == 0 || !m[0].role || strcmp(m[0].role, "system")) {
        char *sys = chatml_default_system(t ? t->chat_template : NULL);
        if (sys) {
            puts_(b, "<|im_start|>system\n");
            puts_(b, sys);
            puts_(b, "<|im_end|>\n");
            free(sys);
        }
    }
    for (int i = 0; i < n; i++) {
        puts_(b, "<|im_start|>");
        puts_(b, m[i].role);
        puts_(b, "\n");
        puts_(b, m[i].content);
        puts_(b, "<|im_end|>\n");
    }
    if (add_ass)
        puts_(b, "<|im_start|>assistant\n");
}

/* Llama 3.1's JSON tool calling: the instruction and each function (indented JSON) open
 * the first user turn. */
static void llama3_tools(const json_t *tools, sbuf *b) {
    puts_(b, "Given the following functions, please respond with a JSON for a function call "
             "with its proper arguments that best answers the given prompt.\n\nRespond in the "
             "format {\"name\": function name, \"parameters\": dictionary of argument name and "
             "its value}.Do not use variables.\n\n");
    size_t i;
    json_t *x;
    json_array_foreach(tools, i, x) {
        char *one = json_dumps(x, JSON_INDENT(4) | JSON_PRESERVE_ORDER);
        puts_(b, one ? one : "");
        puts_(b, "\n\n");
        free(one);
    }
}

static void render_llama3(const tok_chat_msg *m, int n, int add_ass, const json_t *tools, sbuf *b) {
    int first_user = tools ? 1 : 0;
    if (tools) { /* the system turn says so, before the line's own system text */
        puts_(b, "<|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\n\n");
        if (n > 0 && !strcmp(m[0].role, "system")) {
            put_trim(b, m[0].content);
            m++;
            n--;
        }
        puts_(b, "<|eot_id|>");
    }
    for (int i = 0; i < n; i++) {
        puts_(b, "<|start_header_id|>");
        puts_(b, m[i].role);
        puts_(b, "<|end_header_id|>\n\n");
        if (first_user && !strcmp(m[i].role, "user")) {
            llama3_tools(tools, b);
            first_user = 0;
        }
        put_trim(b, m[i].content);
        puts_(b, "<|eot_id|>");
    }
    if (add_ass)
        puts_(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

static void render_llama2(int variant, const tok_chat_msg *m, int n, sbuf *b) {
    int sys_ok = variant != V_L2_PLAIN, bos_inside = variant == V_L2_SYS_BOS,
        strip = variant == V_L2_SYS_STRIP, inside = 1;
    puts_(b, "[INST] ");
    for (int i = 0; i < n; i++) {
        if (!inside) {
            inside = 1;
            puts_(b, bos_inside ? "<s>[INST] " : "[INST] ");
        }
        if (!strcmp(m[i].role, "system")) {
            if (sys_ok)
                puts_(b, "<<SYS>>\n");
            strip ? put_trim(b, m[i].content) : puts_(b, m[i].content);
            puts_(b, sys_ok ? "\n<</SYS>>\n\n" : "\n");
        } else if (!strcmp(m[i].role, "user")) {
            strip ? put_trim(b, m[i].content) : puts_(b, m[i].content);
            puts_(b, " [/INST]");
        } else {
            strip ? put_trim(b, m[i].content) : puts_(b, m[i].content);
            puts_(b, "</s>");
            inside = 0;
        }
    }
}

/* Mistral v7 (and v7-tekken): a system prompt of its own, [INST] per user turn. */
/* The last user turn: Mistral's [AVAILABLE_TOOLS] go right before its [INST]. */
static int last_user(const tok_chat_msg *m, int n) {
    int last = -1;
    for (int i = 0; i < n; i++)
        if (!strcmp(m[i].role, "user"))
            last = i;
    return last;
}

static void mistral_tools(const json_t *tools, sbuf *b) {
    puts_(b, "[AVAILABLE_TOOLS] ");
    char *txt = json_dumps(tools, JSON_PRESERVE_ORDER);
    puts_(b, txt ? txt : "[]");
    free(txt);
    puts_(b, "[/AVAILABLE_TOOLS]");
}

static void render_mistral_v7(int variant, const tok_chat_msg *m, int n, const json_t *tools,
                              sbuf *b) {
    const char *sp = variant == V_M_V7 ? " " : "";
    int lu = tools ? last_user(m, n) : -1;
    for (int i = 0; i < n; i++) {
        if (i == lu)
            mistral_tools(tools, b);
        if (!strcmp(m[i].role, "system")) {
            puts_(b, "[SYSTEM_PROMPT]");
            puts_(b, sp);
            puts_(b, m[i].content);
            puts_(b, "[/SYSTEM_PROMPT]");
        } else if (!strcmp(m[i].role, "user")) {
            puts_(b, "[INST]");
            puts_(b, sp);
            puts_(b, m[i].content);
            puts_(b, "[/INST]");
        } else {
            puts_(b, sp);
            puts_(b, m[i].content);
            puts_(b, "</s>");
        }
    }
}

/* Mistral v1, v3 and v3-tekken: system text inside the next [INST]. */
static void render_mistral(int variant, const tok_chat_msg *m, int n, const json_t *tools,
                           sbuf *b) {
    const char *lead = variant == V_M_V1 ? " " : "";
    const char *trail = variant == V_M_V3_TEKKEN ? "" : " ";
    int inside = 0;
    int lu = tools ? last_user(m, n) : -1;
    for (int i = 0; i < n; i++) {
        if (!inside) {
            /* the [INST] this turn opens holds the last user turn: the tools go before it */
            int j = i;
            while (j < n && !strcmp(m[j].role, "system"))
                j++;
            if (j == lu)
                mistral_tools(tools, b);
            puts_(b, lead);
            puts_(b, "[INST]");
            puts_(b, trail);
            inside = 1;
        }
        if (!strcmp(m[i].role, "system")) {
            puts_(b, m[i].content);
            puts_(b, "\n\n");
        } else if (!strcmp(m[i].role, "user")) {
            puts_(b, m[i].content);
            puts_(b, lead);
            puts_(b, "[/INST]");
        } else {
            puts_(b, trail);
            variant == V_M_V3 ? put_trim(b, m[i].content) : puts_(b, m[i].content);
            puts_(b, "</s>");
            inside = 0;
        }
    }
}

/* No system turn: the system texts since the last user turn (trimmed, joined) open the next
 * user turn; assistant is "model". */
static void render_gemma(const tok_chat_msg *m, int n, int add_ass, sbuf *b) {
    int from = 0;
    for (int i = 0; i < n; i++) {
        if (!strcmp(m[i].role, "system"))
            continue;
        int model = !strcmp(m[i].role, "assistant");
        puts_(b, "<start_of_turn>");
        puts_(b, model ? "model" : m[i].role);
        puts_(b, "\n");
        if (!model) {
            size_t before = b->n;
            for (; from < i; from++)
                if (!strcmp(m[from].role, "system"))
                    put_trim(b, m[from].content);
            if (b->n > before)
                puts_(b, "\n\n");
        }
        put_trim(b, m[i].content);
        puts_(b, "<end_of_turn>\n");
    }
    if (add_ass)
        puts_(b, "<start_of_turn>model\n");
}

static int render(const tok_tokenizer *t, tok_template tmpl, int variant, const tok_chat_msg *m,
                  int n, int add_ass, const json_t *tools, sbuf *b) {
    switch (tmpl) {
    case TOK_TMPL_CHATML: render_chatml(t, m, n, add_ass, tools, b); return 0;
    case TOK_TMPL_LLAMA3: render_llama3(m, n, add_ass, tools, b); return 0;
    case TOK_TMPL_LLAMA2: render_llama2(variant, m, n, b); return 0;
    case TOK_TMPL_MISTRAL:
        if (variant == V_M_V7 || variant == V_M_V7_TEKKEN)
            render_mistral_v7(variant, m, n, tools, b);
        else
            render_mistral(variant, m, n, tools, b);
        return 0;
    case TOK_TMPL_GEMMA: render_gemma(m, n, add_ass, b); return 0;
    case TOK_TMPL_NONE: break;
    }
    return MD_EUNSUPP;
}

int tok_chat_apply_as(const tok_tokenizer *t, tok_template tmpl, const tok_chat_msg *msgs,
                      int n_msgs, int add_generation_prompt, char **out, md_err *e) {
    return tok_chat_render(t, tmpl, msgs, n_msgs, add_generation_prompt, NULL, out, e);
}

int tok_chat_render(const tok_tokenizer *t, tok_template tmpl, const tok_chat_msg *msgs, int n_msgs,
                    int add_generation_prompt, const json_t *tools, char **out, md_err *e) {
    *out = NULL;
    if (n_msgs < 0 || (n_msgs > 0 && !msgs))
        return md_errf(e, MD_EINVAL, "chat template: %d messages", n_msgs);
    if (tools && !json_is_array(tools))
        return md_errf(e, MD_EINVAL,
                       "chat template: the tools are a JSON %s, not an array of "
                       "tool objects",
                       json_is_object(tools) ? "object" : "scalar");
    for (int i = 0; i < n_msgs; i++)
        if (!msgs[i].role || !msgs[i].content)
            return md_errf(e, MD_EINVAL, "chat template: message %d has no %s", i,
                           msgs[i].role ? "content" : "role");
    int variant = V_NONE;
    tok_template model = detect(t ? t->chat_template : NULL, &variant);
    if (model != tmpl) /* forced family: its default variant */
        variant = tmpl == TOK_TMPL_LLAMA2 ? V_L2_SYS : tmpl == TOK_TMPL_MISTRAL ? V_M_V3 : V_NONE;
    if (tmpl == TOK_TMPL_NONE)
        return md_errf(e, MD_EUNSUPP, "chat template: no template chosen");
    sbuf b = {0};
    puts_(&b, ""); /* an empty conversation still yields "" rather than NULL */
    render(t, tmpl, variant, msgs, n_msgs, add_generation_prompt, tools, &b);
    if (b.oom) {
        free(b.p);
        return md_errf(e, MD_ENOMEM, "chat template: out of memory");
    }
    *out = b.p;
    return 0;
}

int tok_chat_apply(const tok_tokenizer *t, const tok_chat_msg *msgs, int n_msgs,
                   int add_generation_prompt, char **out, md_err *e) {
    *out = NULL;
    tok_template tmpl = tok_chat_template(t);
    if (tmpl == TOK_TMPL_NONE && t && t->chat_forced)
        return md_errf(e, MD_EUNSUPP,
                       "chat messages are off for this model (--chat-template "
                       "none); send a raw prompt");
    if (tmpl == TOK_TMPL_NONE) {
        if (!t || !t->chat_template)
            return md_errf(e, MD_EUNSUPP,
                           "the model has no chat template (tokenizer.chat_template); send a "
                           "raw prompt or name a template with --chat-template (" KNOWN_NAMES ")");
        size_t n = t->chat_template_len;
        return md_errf(e, MD_EUNSUPP,
                       "the model's chat template is not one medley knows (" KNOWN_NAMES
                       "); it starts: \"%.60s%s\"; send a raw prompt or name a "
                       "template with --chat-template",
                       t->chat_template, n > 60 ? "..." : "");
    }
    return tok_chat_apply_as(t, tmpl, msgs, n_msgs, add_generation_prompt, out, e);
}
