/* validate_int.h — private to queue/validate*.c: the error helper and the body-field steps
 * validate.c calls from q_validate. */
#ifndef MEDLEY_QUEUE_VALIDATE_INT_H
#define MEDLEY_QUEUE_VALIDATE_INT_H

#include <jansson.h>

#include "queue/validate.h"

/* validate.c */
/* Fills *ve (status 400, code, param, message) and returns -1. */
int q_vfail(q_verr *ve, const char *code, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* validate_constraint.c */
int q_vget_response_format(json_t *body, q_request *req, q_verr *ve);
int q_vget_medley(json_t *body, q_request *req, q_verr *ve);
int q_vget_tools(json_t *body, q_request *req, q_verr *ve);

/* validate_fields.c */
/* online: stream and stream_options are taken (into req), not refused */
int q_vcheck_fields(json_t *body, int chat, int online, q_request *req, q_verr *ve);
int q_vget_logit_bias(json_t *body, q_request *req, q_verr *ve);

/* validate_embed.c: a /v1/embeddings body (every key, input, options) */
int q_vget_embeddings(json_t *body, q_request *req, q_verr *ve);

#endif
