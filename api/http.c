/* http.c — answering: JSON documents and OpenAI's error envelope with the headers every
 * answer carries, query arguments, id checks. */
#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api_int.h"
#include "common/log.h"

enum MHD_Result api_send_json(api_req *q, struct MHD_Connection *c, unsigned status, json_t *doc) {
    char *s = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
    json_decref(doc);
    if (!s) {
        status = MHD_HTTP_INTERNAL_SERVER_ERROR;
        s = strdup("{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\","
                   "\"param\":null,\"code\":null}}");
        if (!s)
            return MHD_NO;
    }
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(s), s, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(s);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "application/json");
    MHD_add_response_header(r, "Cache-Control", "no-store");
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    if (status == MHD_HTTP_TOO_MANY_REQUESTS || status == MHD_HTTP_SERVICE_UNAVAILABLE)
        MHD_add_response_header(r, "Retry-After", "1");
    if (status == MHD_HTTP_UNAUTHORIZED)
        MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    q->status = status;
    q->answered = 1;
    enum MHD_Result rc = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return rc;
}

static const char *error_type(unsigned status) {
    switch (status) {
    case MHD_HTTP_UNAUTHORIZED: return "authentication_error";
    case MHD_HTTP_FORBIDDEN: return "permission_error";
    case MHD_HTTP_NOT_FOUND: return "invalid_request_error";
    case MHD_HTTP_TOO_MANY_REQUESTS: return "rate_limit_error";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
    }
}

enum MHD_Result api_send_error(api_req *q, struct MHD_Connection *c, unsigned status,
                               const char *param, const char *code, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    /* a message may quote user input cut at a byte count: keep it valid UTF-8 for jansson */
    json_t *m = json_string(msg);
    if (!m)
        m = json_string("the request is invalid (its text is not UTF-8)");
    json_t *err = json_pack("{s:o, s:s, s:o, s:o}", "message", m, "type", error_type(status),
                            "param", param ? json_string(param) : json_null(), "code",
                            code ? json_string(code) : json_null());
    return api_send_json(q, c, status, json_pack("{s:o}", "error", err));
}

enum MHD_Result api_send_redis_error(api_req *q, struct MHD_Connection *c, const md_err *e) {
    if (e->code == MD_EREDIS)
        api_redis_failed();
    MD_WARN("api", "%s", e->msg);
    return api_send_error(q, c, MHD_HTTP_SERVICE_UNAVAILABLE, NULL, "redis_unavailable",
                          "the queue is unavailable: %s", e->msg);
}

enum MHD_Result api_send_not_found(api_req *q, struct MHD_Connection *c, const char *what,
                                   const char *id) {
    /* an id that is not printable ASCII is not echoed */
    int printable = strlen(id) < 100;
    for (const char *p = id; printable && *p; p++)
        printable = isprint((unsigned char)*p);
    return api_send_error(q, c, MHD_HTTP_NOT_FOUND, "id", "not_found", "No such %s object: %s",
                          what, printable ? id : "(id not shown)");
}

int api_id_ok(const char *id) {
    size_t n = strlen(id);
    if (!n || n >= API_ID_MAX)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)id[i]) && id[i] != '_' && id[i] != '-')
            return 0;
    return 1;
}

long long api_int_arg(struct MHD_Connection *c, const char *name, long long def, long long lo,
                      long long hi) {
    const char *v = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, name);
    if (!v)
        return def;
    char *end;
    long long x = strtoll(v, &end, 10);
    return *v && !*end && x >= lo && x <= hi ? x : -1;
}
