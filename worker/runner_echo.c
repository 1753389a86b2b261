/* runner_echo.c — the `echo` model: answers each request with its prompt text (the last
 * user message for chat, the prompt for completions), cut to max_tokens bytes and at the
 * first stop string, after echo_delay_ms. One token is one byte, and it is certain (logprob
 * 0: the answer is deterministic). So its alternatives, however many top_logprobs asks for,
 * are itself alone at 0: every other byte is impossible (-inf), and the engine lists no token
 * at -inf either. The context is echo_ctx bytes. It exercises everything the worker does
 * except inference. */
#define _GNU_SOURCE /* memmem */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/util.h"
#include "worker/runner_impl.h"

typedef struct {
    int used;
    void *tag;
    char *text; /* malloc'd answer */
    const char *finish;
    int logprobs, top_logprobs;
    int prompt_tokens, completion_tokens;
    uint64_t start_ns, due_ns;
} echo_item;

typedef struct {
    int cap, live, delay_ms, n_ctx;
    echo_item *items; /* (cap) */
    wk_token_lp *lp;  /* (cap_lp) the entries of the answer being reported */
    size_t cap_lp;
    wk_alt_lp *alt; /* (cap_alt) their alternatives, one each */
    size_t cap_alt;
} echo_runner;

int wk_echo_open(const wk_runner_opts *o, void **self, md_err *e) {
    echo_runner *r = calloc(1, sizeof *r);
    if (!r)
        return md_errf(e, MD_ENOMEM, "out of memory");
    r->cap = o->max_seqs > 0 ? o->max_seqs : 256;
    r->delay_ms = o->echo_delay_ms > 0 ? o->echo_delay_ms : 0;
    r->n_ctx = o->echo_ctx > 0 ? o->echo_ctx : 8192;
    r->items = calloc((size_t)r->cap, sizeof *r->items);
    if (!r->items) {
        free(r);
        return md_errf(e, MD_ENOMEM, "out of memory");
    }
    *self = r;
    return 0;
}

static void echo_close(void *self) {
    echo_runner *r = self;
    for (int i = 0; i < r->cap; i++)
        free(r->items[i].text);
    free(r->items);
    free(r->lp);
    free(r->alt);
    free(r);
}

static int echo_capacity(void *self) {
    return ((echo_runner *)self)->cap;
}
static int echo_live(void *self) {
    return ((echo_runner *)self)->live;
}
static int echo_n_ctx(void *self) {
    return ((echo_runner *)self)->n_ctx;
}
static const char *echo_device(void *self) {
    return "cpu";
}

/* Length of the longest prefix of s[0..n) that ends on a UTF-8 character boundary. */
static size_t utf8_cut(const char *s, size_t n) {
    size_t i = n;
    while (i > 0 && ((unsigned char)s[i] & 0xC0) == 0x80)
        i--;
    return i;
}

static int echo_start(void *self, const q_request *req, void *tag, md_err *e) {
    echo_runner *r = self;
    if (r->live >= r->cap)
        return md_errf(e, MD_ENOMEM, "echo runner is full (%d requests)", r->cap);
    size_t prompt = 0;
    if (req->chat)
        for (int i = 0; i < req->n_msgs; i++)
            prompt += strlen(req->msgs[i].content);
    else
        prompt = strlen(req->prompt);
    if (prompt + (size_t)req->max_tokens > (size_t)r->n_ctx)
        return md_errf(e, MD_ERANGE,
                       "This model's maximum context length is %d tokens. However, you requested "
                       "%zu tokens (%zu in the messages, %d in the completion).",
                       r->n_ctx, prompt + (size_t)req->max_tokens, prompt, req->max_tokens);
    const char *src = q_request_prompt_text(req);
    size_t n = strlen(src);
    const char *finish = "stop";
    if (n > (size_t)req->max_tokens) {
        n = utf8_cut(src, (size_t)req->max_tokens);
        finish = "length";
    }
    for (int i = 0; i < req->n_stop; i++) {
        const char *hit = memmem(src, n, req->stop[i], strlen(req->stop[i]));
        if (hit) {
            n = (size_t)(hit - src);
            finish = "stop";
        }
    }
    echo_item *it = NULL;
    for (int i = 0; i < r->cap && !it; i++)
        if (!r->items[i].used)
            it = &r->items[i];
    /* room for this answer's entries now, so that poll() never allocates */
    if (req->logprobs && n > r->cap_lp) {
        wk_token_lp *lp = realloc(r->lp, n * sizeof *lp);
        if (!lp)
            return md_errf(e, MD_ENOMEM, "out of memory");
        r->lp = lp;
        r->cap_lp = n;
    }
    if (req->top_logprobs > 0 && n > r->cap_alt) {
        wk_alt_lp *alt = realloc(r->alt, n * sizeof *alt);
        if (!alt)
            return md_errf(e, MD_ENOMEM, "out of memory");
        r->alt = alt;
        r->cap_alt = n;
    }
    char *text = malloc(n + 1);
    if (!text)
        return md_errf(e, MD_ENOMEM, "out of memory");
    memcpy(text, src, n);
    text[n] = 0;
    it->used = 1;
    it->tag = tag;
    it->text = text;
    it->finish = finish;
    it->logprobs = req->logprobs;
    it->top_logprobs = req->top_logprobs;
    it->prompt_tokens = (int)prompt;
    it->completion_tokens = (int)n;
    it->start_ns = md_mono_ns();
    it->due_ns = it->start_ns + (uint64_t)r->delay_ms * 1000000ull;
    r->live++;
    return 0;
}

static int echo_poll(void *self, int wait_ms, wk_done_fn done, void *ctx, md_err *e) {
    echo_runner *r = self;
    if (r->live == 0)
        return 0;
    uint64_t now = md_mono_ns(), next = UINT64_MAX;
    for (int i = 0; i < r->cap; i++)
        if (r->items[i].used && r->items[i].due_ns < next)
            next = r->items[i].due_ns;
    if (next > now && wait_ms > 0) {
        uint64_t wait = next - now;
        if (wait > (uint64_t)wait_ms * 1000000ull)
            wait = (uint64_t)wait_ms * 1000000ull;
        struct timespec ts = {(time_t)(wait / 1000000000ull), (long)(wait % 1000000000ull)};
        nanosleep(&ts, NULL);
        now = md_mono_ns();
    }
    for (int i = 0; i < r->cap; i++) {
        echo_item *it = &r->items[i];
        if (!it->used || it->due_ns > now)
            continue;
        wk_result res = {.text = it->text,
                         .finish_reason = it->finish,
                         .prompt_tokens = it->prompt_tokens,
                         .completion_tokens = it->completion_tokens,
                         .prefill_ms = 0,
                         .decode_ms = (double)(now - it->start_ns) / 1e6,
                         .first_token_ms = (double)(now - it->start_ns) / 1e6,
                         .logprobs = it->logprobs,
                         .top_logprobs = it->top_logprobs};
        if (it->logprobs) {
            int top = it->top_logprobs > 0;
            for (int k = 0; k < it->completion_tokens; k++) {
                r->lp[k] = (wk_token_lp){.bytes = it->text + k,
                                         .n_bytes = 1,
                                         .text_offset = (size_t)k,
                                         .top = top ? r->alt + k : NULL,
                                         .n_top = top};
                if (top)
                    r->alt[k] = (wk_alt_lp){it->text + k, 1, 0.0f};
            }
            res.lp = r->lp;
            res.n_lp = it->completion_tokens;
        }
        void *tag = it->tag;
        it->used = 0;
        r->live--;
        done(ctx, tag, &res);
        free(it->text);
        it->text = NULL;
    }
    return 0;
}

static echo_item *find_tag(echo_runner *r, void *tag) {
    for (int i = 0; i < r->cap; i++)
        if (r->items[i].used && r->items[i].tag == tag)
            return &r->items[i];
    return NULL;
}

/* The answer so far: its share of the bytes that the share of the delay gone by gives, cut on
 * a character boundary (the whole of it without a delay), so a delayed echo streams. */
static const char *echo_partial(void *self, void *tag, size_t *len) {
    echo_item *it = find_tag(self, tag);
    if (!it)
        return NULL;
    size_t n = (size_t)it->completion_tokens;
    uint64_t now = md_mono_ns();
    if (now < it->due_ns) {
        double f = (double)(now - it->start_ns) / (double)(it->due_ns - it->start_ns);
        n = utf8_cut(it->text, (size_t)(f * (double)n));
    }
    *len = n;
    return it->text;
}

/* Answer it at the next poll. */
static void echo_cancel(void *self, void *tag) {
    echo_item *it = find_tag(self, tag);
    if (it)
        it->due_ns = 0;
}

const wk_runner_ops wk_echo_ops = {
    .kind = "echo",
    .capacity = echo_capacity,
    .live = echo_live,
    .n_ctx = echo_n_ctx,
    .device = echo_device,
    .start = echo_start,
    .poll = echo_poll,
    .close = echo_close,
    .partial = echo_partial,
    .cancel = echo_cancel,
};
