/* online.h — the online lane of the queue (docs/protocol.md §9): the interactive requests of
 * `medley api`'s POST /v1/chat/completions and /v1/completions, served by the same workers as
 * batch lines and read before them. The keys, shared by api/ (which writes requests and reads
 * answers) and worker/ (which reads requests and writes answers), and the streaming rule of
 * what text may be published before a request ends.
 *
 * Keys (prefix P, model M, request id R):
 *   P online:{M}   stream, group `workers`; entry fields reply=R, line=<input line whose
 *                  custom_id is R>, deadline=<ms; 0: none>, tenant=T
 *   P reply:{R}    stream, expires Q_REPLY_TTL_MS after its last write: the worker's events
 *                  for R, type=start (worker, attempt), type=delta (off, text: the answer's
 *                  bytes [off, off + len(text))), type=done (line: the output line)
 *   P cancel:{R}   string, expires after Q_CANCEL_TTL_MS: the client went away; a worker
 *                  stops R (or drops it unread)
 * Nothing here allocates. */
#ifndef MEDLEY_QUEUE_ONLINE_H
#define MEDLEY_QUEUE_ONLINE_H

#include <stddef.h>

#define Q_REPLY_TTL_MS 120000  /* a reply stream outlives its last event by this */
#define Q_CANCEL_TTL_MS 600000 /* longer than any request a deadline lets run */
#define Q_ONLINE_ID_MAX 64     /* request ids: 1..63 chars of [A-Za-z0-9_-] */

/* Key builders: write the key into out (Q_KEY_MAX of queue/queue.h). */
void q_key_online(char *out, const char *prefix, const char *model);
void q_key_reply(char *out, const char *prefix, const char *req);
void q_key_cancel(char *out, const char *prefix, const char *req);

/* 1 when id can be a request id (1..Q_ONLINE_ID_MAX-1 chars of [A-Za-z0-9_-]). */
int q_online_id_ok(const char *id);
/* 1 when model can name a queue key: 1..127 bytes, printable ASCII, no space, no brace. */
int q_online_model_ok(const char *model);

/* How many bytes of text[0..len), the text a request has generated so far, can be published
 * now: all of it but its longest tail that is the start of one of the stop strings (stop
 * [n_stop]; the engine cuts the text where a stop string appears, so a tail that may still
 * become one is held back until it does not). The stop strings are valid UTF-8, so the cut
 * falls on a character boundary of a valid UTF-8 text. */
size_t q_online_publishable(const char *text, size_t len, const char *const *stop, int n_stop);

#endif
