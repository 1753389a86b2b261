/* online.h — private to api/: online requests (POST /v1/chat/completions, /v1/completions;
 * docs/api.md "Online requests"), routed through the online lane of docs/protocol.md §9.
 *   online.c       the routes: validation (queue/validate.c, as for batch lines), the
 *                  request into P online:{M}, and the answer: JSON, or server-sent events
 *                  written as the worker's events arrive
 *   online_wait.c  the waiter: one thread per API process that reads every waiting request's
 *                  P reply:{R} with one blocking XREAD, applies the events to the requests,
 *                  resumes their suspended connections, enforces deadlines and notices
 *                  clients that went away (P cancel:{R})
 *   sse.c          OpenAI's chunk documents (chat.completion.chunk, text_completion) and the
 *                  answer documents made from a worker's output line
 * Threads: the fields of api_online below "under the waiter's lock" are read and written only
 * under api_waiter_lock; a request's connection is suspended (MHD_suspend_connection) only
 * under the lock with parked set, and resumed only by whoever clears parked, after unlocking:
 * so a connection is never resumed twice, and never freed while suspended. */
#ifndef MEDLEY_API_ONLINE_H
#define MEDLEY_API_ONLINE_H

#include <jansson.h>
#include <microhttpd.h>

#include "api/api_int.h"

/* A growing byte buffer (sse.c). */
typedef struct {
    char *p;
    size_t len, cap;
} api_buf;
int api_buf_add(api_buf *b, const char *s, size_t n); /* -1 when out of memory */
void api_buf_free(api_buf *b);

#define API_REPLY_KEY_MAX 160 /* P reply:{R}: a prefix of <= 64 bytes and a 24-hex id */

typedef struct api_online {
    api_server *s;
    struct MHD_Connection *c;
    int fd; /* the client's socket, polled for a hang-up while parked */
    char id[32];
    char key[API_REPLY_KEY_MAX];
    char model[128];
    int chat, stream, include_usage;
    long long created_s;   /* the chunks' `created` */
    long long deadline_ms; /* wall clock: past it the request is answered 504 */
    int queued;            /* in P online:{M}: its end cancels it unless it was answered */
    /* under the waiter's lock */
    char last[48]; /* the last event id of P reply:{R} read */
    int parked;
    int started, finished, gone, failed, diverged;
    unsigned fail_status;
    char fail_code[48], fail_msg[256];
    json_t *done;              /* the worker's output line (finished) */
    char *text;                /* the answer's bytes published so far, in order */
    size_t text_len, text_cap; /* (text_len) */
    api_buf out;               /* event-stream bytes to send */
    size_t out_pos, emitted;   /* out[0..out_pos) sent; text[0..emitted) in chunks */
    int role_sent, ended;
} api_online;

/* online_wait.c */
typedef struct api_waiter api_waiter;
int api_waiter_start(api_server *s, md_err *e);
/* Answer every waiting request 503, resume them, stop the thread; then (after the HTTP
 * server stopped: its connections end unregistering) free it. */
void api_waiter_stop(api_server *s);
void api_waiter_free(api_server *s);
void api_waiter_lock(api_server *s);
void api_waiter_unlock(api_server *s);
/* Register a request (its events are read from then on); -1 when stopping. */
int api_waiter_add(api_server *s, api_online *on);
/* Unregister (the request ended); on may be freed afterwards. */
void api_waiter_remove(api_server *s, api_online *on);
/* 1 while stopping: park nothing more (under the lock). */
int api_waiter_stopping(api_server *s);

/* sse.c: the chunks of one request */
typedef struct {
    int chat;
    const char *id; /* chatcmpl-R / cmpl-R */
    const char *model;
    long long created;
    int include_usage;
} api_sse;
/* Each appends one `data: ...\n\n` event to b; -1 when out of memory. */
int api_sse_role(api_buf *b, const api_sse *m);
/* text[0..n) as a content chunk; logprobs (borrowed, NULL: none) goes with it. */
int api_sse_text(api_buf *b, const api_sse *m, const char *text, size_t n, json_t *logprobs);
int api_sse_error(api_buf *b, json_t *error);
/* The end of a stream from the worker's output line: the text not streamed yet (the line's
 * content past streamed[0..n), which must begin it), tool calls, the finish_reason chunk,
 * the usage chunk (include_usage) and `data: [DONE]`; or an error event when the line is an
 * error or does not begin with what was streamed. Returns -1 when out of memory. */
int api_sse_answer(api_buf *b, const api_sse *m, json_t *line, const char *streamed, size_t n);
/* The HTTP answer of an output line: its status and document (new reference): the response
 * body when it succeeded, else OpenAI's error envelope ({"error": {...}}, param without the
 * batch line's "body." prefix). */
json_t *api_answer_doc(json_t *line, unsigned *status);

#endif
