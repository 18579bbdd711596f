/* Chat formatting shared by `tern serve` and `tern run --chat`: the model's chat
 * template (or --chat-template FILE, or a ChatML fallback), the tokenization rule for
 * rendered prompts, and the output format the model speaks. */
#ifndef TERN_SERVER_CHAT_H
#define TERN_SERVER_CHAT_H

#include "cache/cache.h"
#include "server/reply.h"
#include "tern.h"
#include "util/buf.h"

#include <jansson.h>
#include <stdbool.h>

struct tern_template;
struct tern_template_spans;

struct chat_fmt {
    struct tern_template *tmpl;
    const struct tern_tokenizer *tok;     /* borrowed from the model */
    char *bos_text, *eos_text;            /* "" when the vocabulary has none */
    const struct reply_format *fmt;       /* how to read the model's output */
    bool fallback;                        /* no template in the model: ChatML */
    const char *source;                   /* "model", "file", "chatml" */
    int tool_syntax;                      /* enum srv_tool_syntax (server/constrain.h) */
    /* false (the default): text that came from the request (message contents, names,
     * tool results and arguments, tools, extra keywords) never becomes a control token;
     * only the template's own literals do. true: --parse-special-in-content, the old
     * behaviour (control-token text anywhere in the render is parsed). */
    bool parse_special_in_content;
};

/* override_src: a template given by the user (NULL: the model's). */
enum tern_status chat_fmt_init(struct chat_fmt *cf, const struct tern_model *m, const char *override_src,
                               size_t override_len);
void chat_fmt_free(struct chat_fmt *cf);

/* Renders vars (messages, tools, add_generation_prompt ...) into out. marks (may be
 * NULL; emptied first, caller frees with tern_template_spans_free) gets the byte ranges
 * of out that came from the request's strings (tern_template_render_spans; bos_token and
 * eos_token are the server's own); it stays empty with parse_special_in_content. */
enum tern_status chat_fmt_render(const struct chat_fmt *cf, const json_t *vars, struct tern_buf *out,
                                 struct tern_template_spans *marks);

/* Tokenizes text[0..n) of a rendered prompt: control-token text is parsed as control
 * tokens, except inside marks (the request's bytes, from chat_fmt_render; NULL: none),
 * where it is plain text; ranges past n are clipped. A BOS is put in front only when
 * the vocabulary asks for one (add_bos) and the render does not already start with it
 * (llama.cpp's rule, which avoids a double BOS). Appends to *ids (growable, caller
 * frees). */
enum tern_status chat_fmt_tokenize(const struct chat_fmt *cf, const char *text, size_t n,
                                   const struct tern_template_spans *marks, int32_t **ids, size_t *n_ids, size_t *cap);

/* The turn-start token (DESIGN.md §4 checkpoint plan): <|im_start|> when the
 * vocabulary has it, harmony's <|start|>, else -1. */
int32_t chat_turn_token(const struct chat_fmt *cf);

/* The messages as harmony's template (gpt-oss) takes them: an assistant message's
 * reasoning_content becomes its `thinking`; an assistant message with several tool
 * calls becomes one message per call, each followed by its result (matched by
 * tool_call_id, else in order), as the model wrote them; thinking and text before a
 * call join as its analysis (the template refuses both). A new array (NULL: no memory). */
json_t *chat_harmony_messages(const json_t *messages);

/* Fills p->roles / p->n_roles, the cache's role map (cache.h), for the turn-start token
 * p->turn_token (-1: chat_turn_token's default; none: an empty map): the role headers chat templates write after it —
 * ChatML's system/developer/user/assistant/tool, Qwen's tool result (a user turn that
 * opens with <tool_response>), Gemma's "model", Llama 3's "ipython" — as the ids the
 * prompt holds for them. Each header is tokenized the way a rendered prompt is (after
 * the turn-start token, followed by its newline), and only the ids that lie wholly
 * within the header are kept, so a merge with what follows never breaks the match; a
 * header whose ids cover less than all but its last byte gets no rule. */
enum tern_status chat_role_map(const struct tern_tokenizer *tok, struct cache_params *p);

#endif
