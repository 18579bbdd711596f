/* Predictive priming (issue 9): what the next request of a conversation will start
 * with, rendered with the model's own chat template.
 *
 * An agent client re-sends the whole conversation every turn. After a response the
 * server waits for it (tools run, the user reads), and that idle time is enough to
 * read ahead what the next prompt will begin with:
 *
 *   tool   the reply made tool calls: messages + reply + one tool result per call, cut
 *          at the start of the first tool turn (the client runs the tools and comes
 *          back with their results: the likely case);
 *   user   messages + a new user message, cut at the start of that message's turn
 *          (where the reply's turn begins). A Qwen-style template drops the reasoning
 *          of every earlier assistant turn once a user message follows, so this is the
 *          re-rendered history no checkpoint holds. It depends only on what the client
 *          sent, so it holds even for a client that sends back its own record of the
 *          reply (a replay, a client that re-serialises replies);
 *   reply  messages + the reply as generated (as an OpenAI client sends it back) + a
 *          new user message, cut the same way: "user" extended by the reply.
 *
 * Each cut is found by rendering a unique placeholder and taking the turn-start token
 * (<|im_start|>) that opens the placeholder's turn; it is verified on the tokens (the
 * token at the cut is the turn token; the tokens before it are what the full render
 * tokenizes to, since control tokens split the text). Nothing here is trusted by the
 * cache: a later request resumes from a prediction only where its bytes equal it. */
#ifndef TERN_SERVER_PREDICT_H
#define TERN_SERVER_PREDICT_H

#include "server/chat.h"
#include "server/reply.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum predict_mode {
    PREDICT_OFF = 0,
    PREDICT_USER,   /* the new-user-message variants (user, reply) */
    PREDICT_ALL,    /* ... and the tool-result variant */
};
const char *predict_mode_name(enum predict_mode m);
/* "off" | "user" | "all"; false for anything else. */
bool predict_mode_parse(const char *s, enum predict_mode *out);

#define PREDICT_MAX_ITEMS 3

/* One prediction to prime: a predicted prompt prefix and the extra checkpoint
 * positions inside it (the "user" cut when "reply" extends it). */
struct predict_item {
    const char *variant;     /* "tool", "user", "user+reply", "reply" (static) */
    int32_t *toks;           /* owned */
    size_t n;
    uint32_t marks[1];
    size_t n_marks;
    bool keep;               /* the re-rendered history: the base of the next turn's */
};

/* In order of likelihood: the tool variant first when the reply made tool calls. */
struct predict_set {
    struct predict_item items[PREDICT_MAX_ITEMS];
    size_t n;
};

/* The conversation after a response: the request's normalised messages, tools and
 * chat_template_kwargs (borrowed; tools / kwargs may be NULL) and the reply as an
 * assistant message (predict_reply_message). turn_token: the cache's turn-start token.
 * Variants that the template refuses, or whose cut cannot be verified, are left out
 * (logged at debug level); only allocation failure is an error. On error *out is
 * empty. */
enum tern_status predict_build(const struct chat_fmt *cf, int32_t turn_token, const json_t *messages,
                               const json_t *tools, const json_t *kwargs, const json_t *reply, enum predict_mode mode,
                               struct predict_set *out);
void predict_set_free(struct predict_set *s);

/* The reply as an OpenAI client sends it back: the response's message object
 * (content, reasoning_content, tool_calls with arguments as a JSON string), normalised
 * as a request's messages are. New reference, NULL on allocation failure. */
json_t *predict_reply_message(const struct reply_parser *p);

/* Renders messages (+ tools, kwargs) as a request would be rendered and finds the cut
 * before the turn that holds the first occurrence of placeholder: *toks (caller frees)
 * gets the tokens before the turn-start token that opens it. TERN_ERR_STATE when the
 * placeholder is not rendered or the cut does not fall on a turn token. Exposed for
 * tests. */
enum tern_status predict_render_cut(const struct chat_fmt *cf, int32_t turn_token, const json_t *messages,
                                    const json_t *tools, const json_t *kwargs, const char *placeholder,
                                    int32_t **toks, size_t *n);

#endif
