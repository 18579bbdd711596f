/* Fuzz target: request JSON -> validated request -> normalised template variables.
 * The first byte picks the door: bit 0 the endpoint (chat or completions), bits 2-3 the
 * protocol (0, 3: OpenAI's; 1: Anthropic Messages, bit 4 its count_tokens; 2: OpenAI
 * Responses); bit 1 allows the test-only fields. The rest is the body. Whatever the
 * input, parsing must end in a request or an error in the protocol's shape. */
#include "server/api/api.h"
#include "server/request.h"

#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    enum srv_endpoint ep = (data[0] & 1) ? SRV_EP_COMPLETION : SRV_EP_CHAT;
    const int door = (data[0] >> 2) & 3;
    const enum srv_proto proto = door == 1 ? SRV_PROTO_MESSAGES : door == 2 ? SRV_PROTO_RESPONSES : SRV_PROTO_CHAT;
    struct srv_parse_opts opts = {.max_body = 1 << 20, .allow_forced_output = (data[0] & 2) != 0};
    struct srv_request req;
    struct srv_error err;
    memset(&err, 0, sizeof err);
    bool ok;
    if (proto == SRV_PROTO_CHAT) {
        ok = srv_request_parse(ep, (const char *)data + 1, size - 1, &opts, &req, &err);
    } else {
        ep = SRV_EP_CHAT;
        ok = srv_request_parse_proto(proto, (data[0] & 16) != 0, (const char *)data + 1, size - 1, &opts, &req, &err);
        if (ok && (req.proto != proto || !req.messages)) abort(); /* an adapter's request is a chat request */
    }
    if (ok) {
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
        char *s = api_error_json(proto, &err);
        if (!s) abort();
        json_t *back = json_loads(s, 0, NULL);
        if (!json_is_object(json_object_get(back, "error"))) abort();
        if (proto == SRV_PROTO_MESSAGES && !json_is_string(json_object_get(json_object_get(back, "error"), "type")))
            abort();
        json_decref(back);
        free(s);
    }
    return 0;
}
