/* validate_embed.c — the body of a /v1/embeddings line (docs/protocol.md §8, "Embeddings"):
 * OpenAI's fields (model, input, encoding_format, dimensions, user) and medley's extension
 * (medley.truncate), each used or refused naming it. input is a string, an array of strings,
 * an array of token ids or an array of such arrays, at most Q_MAX_EMBED_INPUTS of them; what
 * only the model can tell (ids inside its vocabulary, lengths within its max_seq_length,
 * whether `dimensions` is honoured) is the runner's check. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "queue/validate.h"
#include "queue/validate_int.h"

/* One input that is a token-id array: ids into req->emb_ids at *used. */
static int id_array(json_t *a, const char *param, q_request *req, size_t *used, q_embed_input *in,
                    q_verr *ve) {
    size_t n = json_array_size(a), k;
    json_t *v;
    if (n == 0)
        return q_vfail(ve, "invalid_value", param, "%s is an empty array of token ids", param);
    in->ids = req->emb_ids + *used;
    in->n_ids = (int)n;
    json_array_foreach(a, k, v) {
        if (!json_is_integer(v))
            return q_vfail(ve, "invalid_type", param,
                           "%s[%zu] must be a token id (an integer), not %s", param, k,
                           md_json_type_name(v));
        json_int_t id = json_integer_value(v);
        if (id < 0 || id > INT32_MAX)
            return q_vfail(ve, "invalid_value", param,
                           "%s[%zu] is %lld: not a token id (0 to 2147483647, and inside the "
                           "model's vocabulary)",
                           param, k, (long long)id);
        req->emb_ids[(*used)++] = (int32_t)id;
    }
    return 0;
}

/* Total integers in input (for the one allocation), and whether its shape is one of the four. */
static size_t count_ids(json_t *input) {
    size_t n = 0, i;
    json_t *v;
    if (json_is_array(input))
        json_array_foreach(input, i, v) n += json_is_array(v) ? json_array_size(v) : 1;
    return n;
}

/* body.input into req->emb_in. */
static int get_input(json_t *body, q_request *req, q_verr *ve) {
    json_t *input = json_object_get(body, "input");
    if (!input || json_is_null(input))
        return q_vfail(ve, "missing_required_parameter", "body.input",
                       "an embeddings request needs body.input");
    if (!json_is_string(input) && !json_is_array(input))
        return q_vfail(ve, "invalid_type", "body.input",
                       "body.input must be a string, an array of strings, an array of token ids "
                       "or an array of arrays of token ids, not %s",
                       md_json_type_name(input));
    size_t n = json_is_string(input) ? 1 : json_array_size(input);
    if (n == 0)
        return q_vfail(ve, "invalid_value", "body.input", "body.input is an empty array");
    int flat_ids = json_is_array(input) && json_is_integer(json_array_get(input, 0));
    if (flat_ids)
        n = 1; /* [1, 2, 3]: one input of token ids */
    if (n > Q_MAX_EMBED_INPUTS)
        return q_vfail(ve, "invalid_value", "body.input",
                       "body.input has %zu inputs; at most %d are accepted in one request", n,
                       Q_MAX_EMBED_INPUTS);
    req->emb_in = calloc(n, sizeof *req->emb_in);
    req->emb_ids = malloc((count_ids(input) + 1) * sizeof *req->emb_ids);
    if (!req->emb_in || !req->emb_ids)
        return q_vfail(ve, "server_error", NULL, "out of memory");
    req->n_emb_in = (int)n;
    size_t used = 0;
    if (flat_ids)
        return id_array(input, "body.input", req, &used, &req->emb_in[0], ve);
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_is_string(input) ? input : json_array_get(input, i);
        char param[64];
        snprintf(param, sizeof param, json_is_string(input) ? "body.input" : "body.input[%zu]", i);
        if (json_is_array(v)) {
            if (id_array(v, param, req, &used, &req->emb_in[i], ve))
                return -1;
            continue;
        }
        if (!json_is_string(v))
            return q_vfail(ve, "invalid_type", param,
                           "%s must be a string or an array of token ids, not %s", param,
                           md_json_type_name(v));
        if (json_string_length(v) == 0)
            return q_vfail(ve, "invalid_value", param, "%s is an empty string", param);
        req->emb_in[i].text = json_string_value(v);
        req->emb_in[i].len = json_string_length(v);
    }
    return 0;
}

/* Keys of body: the embeddings endpoint's own, every other refused naming it. */
static int only_embed_keys(json_t *body, q_verr *ve) {
    static const char *const known[] = {"model",      "input", "encoding_format",
                                        "dimensions", "user",  "medley"};
    const char *k;
    json_t *v;
    json_object_foreach(body, k, v) {
        size_t i = 0;
        while (i < sizeof known / sizeof known[0] && strcmp(k, known[i]))
            i++;
        if (i == sizeof known / sizeof known[0]) {
            char param[64];
            snprintf(param, sizeof param, "body.%.50s", k);
            return q_vfail(ve, "unsupported_parameter", param,
                           "%s is not a parameter of /v1/embeddings (model, input, "
                           "encoding_format, dimensions, user, medley are)",
                           param);
        }
    }
    return 0;
}

static int get_options(json_t *body, q_request *req, q_verr *ve) {
    json_t *fmt = json_object_get(body, "encoding_format");
    if (fmt && !json_is_null(fmt)) {
        const char *f = json_string_value(fmt);
        if (!f || (strcmp(f, "float") && strcmp(f, "base64")))
            return q_vfail(ve, "invalid_value", "body.encoding_format",
                           "body.encoding_format must be \"float\" or \"base64\"");
        req->emb_base64 = !strcmp(f, "base64");
    }
    json_t *dim = json_object_get(body, "dimensions");
    if (dim && !json_is_null(dim)) {
        if (!json_is_integer(dim) || json_integer_value(dim) < 1 || json_integer_value(dim) > 65536)
            return q_vfail(ve, "invalid_value", "body.dimensions",
                           "body.dimensions must be a positive integer");
        req->emb_dimensions = (int)json_integer_value(dim);
    }
    json_t *user = json_object_get(body, "user");
    if (user && !json_is_null(user) && !json_is_string(user))
        return q_vfail(ve, "invalid_type", "body.user", "body.user must be a string, not %s",
                       md_json_type_name(user));
    json_t *m = json_object_get(body, "medley");
    if (!m || json_is_null(m))
        return 0;
    const char *k;
    json_t *v;
    if (!json_is_object(m))
        return q_vfail(ve, "invalid_type", "body.medley", "body.medley must be an object, not %s",
                       md_json_type_name(m));
    json_object_foreach(m, k, v) {
        if (strcmp(k, "truncate"))
            return q_vfail(ve, "unsupported_parameter", "body.medley",
                           "body.medley.%.50s is not a medley option of /v1/embeddings (truncate "
                           "is)",
                           k);
        if (!json_is_boolean(v))
            return q_vfail(ve, "invalid_type", "body.medley.truncate",
                           "body.medley.truncate must be true or false");
        req->emb_truncate = json_is_true(v);
    }
    return 0;
}

int q_vget_embeddings(json_t *body, q_request *req, q_verr *ve) {
    if (only_embed_keys(body, ve) || get_input(body, req, ve) || get_options(body, req, ve))
        return -1;
    return 0;
}
