/* Fuzz target: request JSON -> validated request -> normalised template variables.
 * The first byte picks the endpoint (chat or completions); the rest is the body.
 * Whatever the input, parsing must end in a request or an OpenAI-shaped error. */
#include "server/request.h"

#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    enum srv_endpoint ep = (data[0] & 1) ? SRV_EP_COMPLETION : SRV_EP_CHAT;
    struct srv_parse_opts opts = {.max_body = 1 << 20, .allow_forced_output = (data[0] & 2) != 0};
    struct srv_request req;
    struct srv_error err;
    memset(&err, 0, sizeof err);
    if (srv_request_parse(ep, (const char *)data + 1, size - 1, &opts, &req, &err)) {
        if (ep == SRV_EP_CHAT) {
            json_t *vars = srv_template_vars(&req, "<s>", "</s>");
            if (!vars) abort();
            char *s = json_dumps(vars, JSON_COMPACT);
            if (!s) abort();
            free(s);
            json_decref(vars);
        } else if (!req.prompt && req.n_prompt_ids == 0) {
            abort(); /* an accepted completion always has a prompt */
        }
        srv_request_free(&req);
    } else {
        if (err.status < 400 || err.status > 599 || !err.type) abort();
        char *s = srv_error_json(&err);
        if (!s) abort();
        json_t *back = json_loads(s, 0, NULL);
        if (!json_is_object(json_object_get(back, "error"))) abort();
        json_decref(back);
        free(s);
    }
    return 0;
}
