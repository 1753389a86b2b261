/* logprobs.h — a runner's logprob entries (runner.h wk_token_lp) as the `logprobs` member of
 * an output line's choice, in OpenAI's shape for each endpoint:
 *   chat         {"content": [{"token", "logprob", "bytes",
 *                              "top_logprobs": [{"token", "logprob", "bytes"}, ...]}, ...]}
 *   completions  {"tokens": [...], "token_logprobs": [...],
 *                 "top_logprobs": null | [{"<text>": logprob, ...}, ...], "text_offset": [...]}
 * A token's bytes may be part of a UTF-8 character (or not UTF-8 at all): `bytes` holds them
 * exactly, and the `token` string is them with each maximal invalid subpart replaced by
 * U+FFFD, so the document stays valid UTF-8. Alternatives (top_logprobs) are most likely
 * first; chat's list is empty and completions' member null when none were asked for. In a
 * completion's object two alternatives of the same text keep the more likely one, and one
 * whose text holds NUL is left out (an object key cannot hold it). */
#ifndef MEDLEY_WORKER_LOGPROBS_H
#define MEDLEY_WORKER_LOGPROBS_H

#include <jansson.h>
#include <stddef.h>

#include "worker/runner.h"

/* The `logprobs` value for res: JSON null when the request did not ask for logprobs, else
 * the shape of the endpoint (chat or not). Returns a new reference, or NULL out of memory. */
json_t *wk_logprobs_json(const wk_result *res, int chat);

/* bytes[0..n) as valid UTF-8 into out (room for 3 * n + 1 bytes: U+FFFD is 3 bytes and
 * replaces at least one), NUL-terminated; returns the length written. Embedded NUL bytes
 * are kept (they are valid UTF-8), so the length, not strlen, is the string's. */
size_t wk_utf8_sanitize(const char *bytes, size_t n, char *out);

#endif
