#include "replay/transcript.h"

#include "util/mem.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 512

const char *tern_turn_kind_name(enum tern_turn_kind k) {
    switch (k) {
    case TERN_TURN_COLD: return "cold";
    case TERN_TURN_EXTENSION: return "extension";
    case TERN_TURN_REWRITE: return "rewrite";
    default: return "?";
    }
}

char tern_turn_kind_letter(enum tern_turn_kind k) {
    switch (k) {
    case TERN_TURN_COLD: return 'C';
    case TERN_TURN_EXTENSION: return 'e';
    case TERN_TURN_REWRITE: return 'R';
    default: return '?';
    }
}

/* ---- raw JSON spans -------------------------------------------------------------------
 * The bytes of a request are what both arms must receive, so they are located in the
 * line rather than re-serialized. The scanner runs only over text that jansson has
 * already accepted; it still checks every bound. */

static size_t skip_ws(const char *s, size_t n, size_t i) {
    while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) i++;
    return i;
}

static bool skip_string(const char *s, size_t n, size_t *i) {
    if (*i >= n || s[*i] != '"') return false;
    size_t j = *i + 1;
    while (j < n && s[j] != '"') j += s[j] == '\\' ? 2 : 1;
    if (j >= n) return false;
    *i = j + 1;
    return true;
}

static bool skip_value(const char *s, size_t n, size_t *i, int depth) {
    if (depth > MAX_DEPTH) return false;
    size_t j = skip_ws(s, n, *i);
    if (j >= n) return false;
    char c = s[j];
    if (c == '"') {
        if (!skip_string(s, n, &j)) return false;
    } else if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        j = skip_ws(s, n, j + 1);
        if (j < n && s[j] == close) {
            j++;
        } else {
            for (;;) {
                if (c == '{') {
                    j = skip_ws(s, n, j);
                    if (!skip_string(s, n, &j)) return false;
                    j = skip_ws(s, n, j);
                    if (j >= n || s[j] != ':') return false;
                    j++;
                }
                if (!skip_value(s, n, &j, depth + 1)) return false;
                j = skip_ws(s, n, j);
                if (j >= n) return false;
                if (s[j] == ',') {
                    j++;
                    continue;
                }
                if (s[j] != close) return false;
                j++;
                break;
            }
        }
    } else {
        while (j < n && (s[j] == '-' || s[j] == '+' || s[j] == '.' || (s[j] >= '0' && s[j] <= '9') ||
                         (s[j] >= 'a' && s[j] <= 'z') || (s[j] >= 'A' && s[j] <= 'Z')))
            j++;
        if (j == skip_ws(s, n, *i)) return false;
    }
    *i = j;
    return true;
}

struct member {
    size_t key_start; /* the opening quote of the key */
    size_t val_start;
    size_t val_end;   /* one past the value */
};

/* Finds top-level member `key` (compared to the raw key bytes) of the object whose '{'
 * is at s[obj]. *found false when absent. false on malformed text. */
static bool find_member(const char *s, size_t n, size_t obj, const char *key, struct member *m, bool *found) {
    *found = false;
    size_t klen = strlen(key);
    size_t j = skip_ws(s, n, obj);
    if (j >= n || s[j] != '{') return false;
    j = skip_ws(s, n, j + 1);
    if (j < n && s[j] == '}') return true;
    for (;;) {
        j = skip_ws(s, n, j);
        size_t ks = j;
        if (!skip_string(s, n, &j)) return false;
        bool match = j - ks - 2 == klen && !memcmp(s + ks + 1, key, klen);
        j = skip_ws(s, n, j);
        if (j >= n || s[j] != ':') return false;
        size_t vs = skip_ws(s, n, j + 1);
        j = vs;
        if (!skip_value(s, n, &j, 1)) return false;
        if (match) {
            m->key_start = ks;
            m->val_start = vs;
            m->val_end = j;
            *found = true;
            return true;
        }
        j = skip_ws(s, n, j);
        if (j >= n) return false;
        if (s[j] == ',') {
            j++;
            continue;
        }
        return s[j] == '}';
    }
}

/* ---- loading ------------------------------------------------------------------------ */

void tern_transcript_free(struct tern_replay_transcript *t) {
    if (!t) return;
    for (size_t i = 0; i < t->n_turns; i++) {
        json_decref(t->turns[i].req);
        json_decref(t->turns[i].reply);
    }
    free(t->turns);
    free(t->text);
    free(t->path);
    free(t);
}

static bool parse_kind(const char *s, enum tern_turn_kind *k) {
    for (int i = 0; i < TERN_TURN_KIND_COUNT; i++) {
        if (!strcmp(s, tern_turn_kind_name((enum tern_turn_kind)i))) {
            *k = (enum tern_turn_kind)i;
            return true;
        }
    }
    return false;
}

static long int_member(json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    return json_is_integer(v) ? (long)json_integer_value(v) : -1;
}

static enum tern_status parse_line(struct tern_replay_transcript *t, const char *line, size_t len, size_t line_no,
                                   struct tern_replay_turn *turn) {
    const char *name = t->path;
    json_error_t jerr;
    json_t *root = json_loadb(line, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return tern_errorf(TERN_ERR_FORMAT, "%s line %zu: invalid JSON at column %d: %s", name, line_no, jerr.column,
                           jerr.text);
    enum tern_status st = TERN_OK;
    if (!json_is_object(root)) {
        st = tern_errorf(TERN_ERR_FORMAT, "%s line %zu: a turn must be a JSON object", name, line_no);
        goto out;
    }
    json_t *req = json_object_get(root, "request");
    if (!json_is_object(req)) {
        st = tern_errorf(TERN_ERR_FORMAT, "%s line %zu: %s", name, line_no,
                         req ? "'request' is not an object" : "no 'request' (the chat-completions body to send)");
        goto out;
    }
    json_t *msgs = json_object_get(req, "messages");
    if (!json_is_array(msgs) || json_array_size(msgs) == 0) {
        st = tern_errorf(TERN_ERR_FORMAT, "%s line %zu: request.messages must be a non-empty array", name, line_no);
        goto out;
    }
    size_t k;
    json_t *m;
    json_array_foreach(msgs, k, m) {
        json_t *role = json_object_get(m, "role");
        if (!json_is_object(m) || !json_is_string(role)) {
            st = tern_errorf(TERN_ERR_FORMAT, "%s line %zu: request.messages[%zu] has no string 'role'", name,
                             line_no, k);
            goto out;
        }
    }
    json_t *tools = json_object_get(req, "tools");
    if (tools && !json_is_array(tools) && !json_is_null(tools)) {
        st = tern_errorf(TERN_ERR_FORMAT, "%s line %zu: request.tools is not an array", name, line_no);
        goto out;
    }
    json_t *reply = json_object_get(root, "reply");
    if (reply && !json_is_null(reply) && !json_is_object(reply)) {
        st = tern_errorf(TERN_ERR_FORMAT, "%s line %zu: 'reply' is not an object", name, line_no);
        goto out;
    }
    json_t *jturn = json_object_get(root, "turn");
    long expect = (long)(turn - t->turns);
    if (jturn) {
        if (!json_is_integer(jturn)) {
            st = tern_errorf(TERN_ERR_FORMAT, "%s line %zu: 'turn' is not an integer", name, line_no);
            goto out;
        }
        if (json_integer_value(jturn) != expect) {
            st = tern_errorf(TERN_ERR_FORMAT, "%s line %zu: turn %lld out of order (expected %ld)", name, line_no,
                             (long long)json_integer_value(jturn), expect);
            goto out;
        }
    }
    turn->turn = expect;
    turn->line_no = line_no;
    json_t *jkind = json_object_get(root, "kind");
    if (jkind && !json_is_null(jkind)) {
        if (!json_is_string(jkind) || !parse_kind(json_string_value(jkind), &turn->kind)) {
            st = tern_errorf(TERN_ERR_FORMAT, "%s line %zu: unknown kind %s%s%s (cold, extension or rewrite)", name,
                             line_no, json_is_string(jkind) ? "'" : "",
                             json_is_string(jkind) ? json_string_value(jkind) : "(not a string)",
                             json_is_string(jkind) ? "'" : "");
            goto out;
        }
        if ((expect == 0) != (turn->kind == TERN_TURN_COLD)) {
            st = tern_errorf(TERN_ERR_FORMAT, "%s line %zu: turn %ld is labeled '%s' (the first turn, and only it, "
                             "is cold)", name, line_no, expect, json_string_value(jkind));
            goto out;
        }
        turn->labeled = true;
        json_t *by = json_object_get(root, "rewrite_by");
        if (json_is_string(by)) snprintf(turn->rewrite_by, sizeof turn->rewrite_by, "%s", json_string_value(by));
    }
    /* The raw request bytes: the line is one object; find its "request" member. */
    struct member mem;
    bool found;
    size_t obj = skip_ws(line, len, 0);
    if (!find_member(line, len, obj, "request", &mem, &found) || !found) {
        st = tern_errorf(TERN_ERR_FORMAT, "%s line %zu: cannot locate the bytes of 'request' (its key must be "
                         "written without escapes)", name, line_no);
        goto out;
    }
    turn->request = line + mem.val_start;
    turn->request_len = mem.val_end - mem.val_start;
    turn->req = json_incref(req);
    turn->reply = json_is_object(reply) ? json_incref(reply) : NULL;
    turn->reply_tool_calls = turn->reply && json_array_size(json_object_get(turn->reply, "tool_calls")) > 0;
    turn->max_tokens = int_member(req, "max_tokens");
    if (turn->max_tokens < 0) turn->max_tokens = int_member(req, "max_completion_tokens");
    turn->body_bytes = int_member(root, "body_bytes");
out:
    json_decref(root);
    return st;
}

static enum tern_status derive_unlabeled(struct tern_replay_transcript *t) {
    for (size_t i = 0; i < t->n_turns; i++) {
        struct tern_replay_turn *tu = &t->turns[i];
        if (tu->labeled) continue;
        struct tern_turn_class c;
        enum tern_status st = tern_transcript_classify(t, i, &c);
        if (st != TERN_OK) return st;
        tu->kind = c.kind;
        snprintf(tu->rewrite_by, sizeof tu->rewrite_by, "%s", c.rewrite_by ? c.rewrite_by : "");
    }
    return TERN_OK;
}

enum tern_status tern_transcript_parse(const char *text, size_t len, const char *name,
                                       struct tern_replay_transcript **out) {
    *out = NULL;
    struct tern_replay_transcript *t = tern_calloc(1, sizeof *t);
    if (!t) return tern_errorf(TERN_ERR_NOMEM, "out of memory for a transcript");
    t->path = tern_strdup(name ? name : "(transcript)");
    t->text = tern_malloc(len + 1);
    if (!t->path || !t->text) {
        tern_transcript_free(t);
        return tern_errorf(TERN_ERR_NOMEM, "out of memory for a %zu-byte transcript", len);
    }
    memcpy(t->text, text, len);
    t->text[len] = 0;
    t->text_len = len;
    size_t n_lines = 1;
    for (size_t i = 0; i < len; i++) n_lines += t->text[i] == '\n';
    t->turns = tern_calloc(n_lines, sizeof *t->turns);
    if (!t->turns) {
        tern_transcript_free(t);
        return tern_errorf(TERN_ERR_NOMEM, "out of memory for %zu turns", n_lines);
    }
    size_t pos = 0, line_no = 0;
    enum tern_status st = TERN_OK;
    while (pos < len) {
        line_no++;
        const char *nl = memchr(t->text + pos, '\n', len - pos);
        size_t end = nl ? (size_t)(nl - t->text) : len;
        size_t e = end;
        if (e > pos && t->text[e - 1] == '\r') e--;
        size_t s = skip_ws(t->text, e, pos);
        if (s < e) {
            st = parse_line(t, t->text + pos, e - pos, line_no, &t->turns[t->n_turns]);
            if (st != TERN_OK) break;
            t->n_turns++;
        }
        pos = end + 1;
    }
    if (st == TERN_OK && t->n_turns == 0) st = tern_errorf(TERN_ERR_FORMAT, "%s: no turns (the file is empty)", t->path);
    if (st == TERN_OK) st = derive_unlabeled(t);
    if (st != TERN_OK) {
        tern_transcript_free(t);
        return st;
    }
    *out = t;
    return TERN_OK;
}

enum tern_status tern_transcript_load(const char *path, struct tern_replay_transcript **out) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return tern_errorf(TERN_ERR_IO, "cannot open transcript '%s': %s", path, strerror(errno));
    struct tern_buf b = TERN_BUF_INIT;
    char chunk[65536];
    size_t n;
    enum tern_status st = TERN_OK;
    while (st == TERN_OK && (n = fread(chunk, 1, sizeof chunk, f)) > 0) st = tern_buf_append(&b, chunk, n);
    if (st == TERN_OK && ferror(f)) st = tern_errorf(TERN_ERR_IO, "reading transcript '%s' failed", path);
    fclose(f);
    if (st == TERN_OK) st = tern_transcript_parse(b.data ? b.data : "", b.len, path, out);
    tern_buf_free(&b);
    return st;
}

/* ---- rendering (Qwen3-style) --------------------------------------------------------- */

/* Content as text: a string as is; an array of parts joined with '\n' (text parts only),
 * as llama.cpp flattens them before templating. */
static enum tern_status content_text(json_t *content, struct tern_buf *out) {
    tern_buf_clear(out);
    enum tern_status st = tern_buf_puts(out, "");
    if (json_is_string(content)) return tern_buf_append(out, json_string_value(content), json_string_length(content));
    if (!json_is_array(content)) return st;
    size_t i;
    json_t *p;
    bool first = true;
    json_array_foreach(content, i, p) {
        json_t *type = json_object_get(p, "type");
        json_t *text = json_object_get(p, "text");
        if (!json_is_string(type) || strcmp(json_string_value(type), "text") || !json_is_string(text)) continue;
        if (!first && st == TERN_OK) st = tern_buf_putc(out, '\n');
        if (st == TERN_OK) st = tern_buf_append(out, json_string_value(text), json_string_length(text));
        first = false;
    }
    return st;
}

static bool starts_with(const char *s, size_t n, const char *p) {
    size_t k = strlen(p);
    return n >= k && !memcmp(s, p, k);
}
static bool ends_with(const char *s, size_t n, const char *p) {
    size_t k = strlen(p);
    return n >= k && !memcmp(s + n - k, p, k);
}

/* Last occurrence of needle in s[0..n). */
static const char *mem_rfind(const char *s, size_t n, const char *needle) {
    size_t k = strlen(needle);
    if (n < k) return NULL;
    for (size_t i = n - k + 1; i-- > 0;)
        if (!memcmp(s + i, needle, k)) return s + i;
    return NULL;
}

/* "" when absent: a recorded reply is not validated like the request's messages. */
static const char *role_of(json_t *m) {
    const char *r = json_string_value(json_object_get(m, "role"));
    return r ? r : "";
}

enum tern_status tern_transcript_render(json_t *messages, json_t *tools, bool add_generation_prompt,
                                        struct tern_buf *out, size_t **spans_out) {
    if (spans_out) *spans_out = NULL;
    size_t n = json_array_size(messages);
    size_t *spans = NULL;
    if (spans_out && n > 0) {
        spans = tern_calloc(n * 2, sizeof *spans);
        if (!spans) return tern_errorf(TERN_ERR_NOMEM, "out of memory rendering %zu messages", n);
    }
    struct tern_buf text = TERN_BUF_INIT, rc = TERN_BUF_INIT;
    enum tern_status st = tern_buf_puts(out, "");
    json_t *m0 = json_array_get(messages, 0);
    bool sys0 = m0 && !strcmp(role_of(m0), "system");
    if (json_array_size(tools) > 0) {
        st = tern_buf_puts(out, "<|im_start|>system\n");
        if (st == TERN_OK && sys0) {
            st = content_text(json_object_get(m0, "content"), &text);
            if (st == TERN_OK) st = tern_buf_append(out, text.data, text.len);
            if (st == TERN_OK) st = tern_buf_puts(out, "\n\n");
        }
        if (st == TERN_OK)
            st = tern_buf_puts(out, "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                                    "You are provided with function signatures within <tools></tools> XML tags:\n"
                                    "<tools>");
        size_t i;
        json_t *tool;
        json_array_foreach(tools, i, tool) {
            if (st != TERN_OK) break;
            char *s = json_dumps(tool, JSON_ENCODE_ANY); /* ", " and ": " separators, UTF-8 */
            if (!s) {
                st = tern_errorf(TERN_ERR_NOMEM, "out of memory serializing a tool");
                break;
            }
            st = tern_buf_putc(out, '\n');
            if (st == TERN_OK) st = tern_buf_puts(out, s);
            free(s);
        }
        if (st == TERN_OK)
            st = tern_buf_puts(out, "\n</tools>\n\nFor each function call, return a json object with function name "
                                    "and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
                                    "{\"name\": <function-name>, \"arguments\": <args-json-object>}\n"
                                    "</tool_call><|im_end|>\n");
    } else if (sys0) {
        st = content_text(json_object_get(m0, "content"), &text);
        if (st == TERN_OK) st = tern_buf_puts(out, "<|im_start|>system\n");
        if (st == TERN_OK) st = tern_buf_append(out, text.data, text.len);
        if (st == TERN_OK) st = tern_buf_puts(out, "<|im_end|>\n");
    }
    /* The last "real" user message: tool results the client sent as user messages do
     * not count. Reasoning is rendered only for assistant messages after it. */
    size_t last_query = n ? n - 1 : 0;
    for (size_t i = n; i-- > 0 && st == TERN_OK;) {
        json_t *m = json_array_get(messages, i);
        if (strcmp(role_of(m), "user")) continue;
        st = content_text(json_object_get(m, "content"), &text);
        if (st == TERN_OK && !(starts_with(text.data, text.len, "<tool_response>") &&
                               ends_with(text.data, text.len, "</tool_response>"))) {
            last_query = i;
            break;
        }
    }
    for (size_t i = 0; i < n && st == TERN_OK; i++) {
        json_t *m = json_array_get(messages, i);
        size_t start = i > 0 ? out->len : 0;
        const char *role = role_of(m);
        if (!strcmp(role, "user") || (!strcmp(role, "system") && i != 0)) {
            st = content_text(json_object_get(m, "content"), &text);
            if (st == TERN_OK) st = tern_buf_printf(out, "<|im_start|>%s\n", role);
            if (st == TERN_OK) st = tern_buf_append(out, text.data, text.len);
            if (st == TERN_OK) st = tern_buf_puts(out, "<|im_end|>\n");
        } else if (!strcmp(role, "assistant")) {
            st = content_text(json_object_get(m, "content"), &text);
            json_t *jrc = json_object_get(m, "reasoning_content");
            const char *content = text.data;
            size_t clen = text.len;
            tern_buf_clear(&rc);
            if (st == TERN_OK) st = tern_buf_puts(&rc, "");
            if (st == TERN_OK && json_is_string(jrc)) {
                st = tern_buf_append(&rc, json_string_value(jrc), json_string_length(jrc));
            } else if (st == TERN_OK) {
                const char *close = strstr(content, "</think>");
                if (close) {
                    /* rc = text before the first </think>, trailing newlines off, after its
                     * last <think>, leading newlines off; content = after the last </think>. */
                    size_t pre = (size_t)(close - content);
                    while (pre > 0 && content[pre - 1] == '\n') pre--;
                    const char *open = mem_rfind(content, pre, "<think>");
                    const char *r0 = open ? open + 7 : content;
                    while (r0 < content + pre && *r0 == '\n') r0++;
                    st = tern_buf_append(&rc, r0, (size_t)(content + pre - r0));
                    const char *last_close = mem_rfind(content, clen, "</think>") + 8;
                    while (*last_close == '\n') last_close++;
                    clen -= (size_t)(last_close - content);
                    content = last_close;
                }
            }
            if (st != TERN_OK) break;
            if (i > last_query && (i == n - 1 || rc.len > 0)) {
                const char *r0 = rc.data, *r1 = rc.data + rc.len;
                while (r0 < r1 && *r0 == '\n') r0++;
                while (r1 > r0 && r1[-1] == '\n') r1--;
                const char *c0 = content;
                while (*c0 == '\n') c0++;
                st = tern_buf_puts(out, "<|im_start|>assistant\n<think>\n");
                if (st == TERN_OK) st = tern_buf_append(out, r0, (size_t)(r1 - r0));
                if (st == TERN_OK) st = tern_buf_puts(out, "\n</think>\n\n");
                if (st == TERN_OK) st = tern_buf_append(out, c0, clen - (size_t)(c0 - content));
            } else {
                st = tern_buf_puts(out, "<|im_start|>assistant\n");
                if (st == TERN_OK) st = tern_buf_append(out, content, clen);
            }
            json_t *calls = json_object_get(m, "tool_calls");
            size_t k;
            json_t *tc;
            json_array_foreach(calls, k, tc) {
                if (st != TERN_OK) break;
                if (k > 0 || clen > 0) st = tern_buf_putc(out, '\n');
                json_t *f = json_object_get(tc, "function");
                if (!f) f = tc;
                json_t *name = json_object_get(f, "name");
                json_t *args = json_object_get(f, "arguments");
                char *dumped = NULL;
                const char *a = json_string_value(args);
                if (!a) {
                    dumped = json_dumps(args, JSON_ENCODE_ANY | JSON_ENSURE_ASCII);
                    a = dumped ? dumped : "null";
                }
                if (st == TERN_OK)
                    st = tern_buf_printf(out, "<tool_call>\n{\"name\": \"%s\", \"arguments\": %s}\n</tool_call>",
                                         json_is_string(name) ? json_string_value(name) : "", a);
                free(dumped);
            }
            if (st == TERN_OK) st = tern_buf_puts(out, "<|im_end|>\n");
        } else if (!strcmp(role, "tool")) {
            json_t *prev = i > 0 ? json_array_get(messages, i - 1) : NULL;
            json_t *next = i + 1 < n ? json_array_get(messages, i + 1) : NULL;
            st = content_text(json_object_get(m, "content"), &text);
            if (st == TERN_OK && (!prev || strcmp(role_of(prev), "tool"))) st = tern_buf_puts(out, "<|im_start|>user");
            if (st == TERN_OK) st = tern_buf_puts(out, "\n<tool_response>\n");
            if (st == TERN_OK) st = tern_buf_append(out, text.data, text.len);
            if (st == TERN_OK) st = tern_buf_puts(out, "\n</tool_response>");
            if (st == TERN_OK && (!next || strcmp(role_of(next), "tool"))) st = tern_buf_puts(out, "<|im_end|>\n");
        }
        if (spans) {
            spans[2 * i] = start;
            spans[2 * i + 1] = out->len;
        }
    }
    if (st == TERN_OK && add_generation_prompt) st = tern_buf_puts(out, "<|im_start|>assistant\n");
    tern_buf_free(&text);
    tern_buf_free(&rc);
    if (st != TERN_OK) {
        free(spans);
        return st;
    }
    if (spans_out) *spans_out = spans;
    else free(spans);
    return TERN_OK;
}

/* ---- kinds ------------------------------------------------------------------------- */

static size_t utf8_chars(const char *s, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += ((unsigned char)s[i] & 0xC0) != 0x80;
    return c;
}

static size_t common_prefix(const char *a, size_t na, const char *b, size_t nb) {
    size_t n = na < nb ? na : nb, i = 0;
    while (i < n && a[i] == b[i]) i++;
    /* Back off to a character boundary so that character counts agree. */
    while (i > 0 && i < n && ((unsigned char)a[i] & 0xC0) == 0x80) i--;
    return i;
}

static bool json_same(json_t *a, json_t *b) {
    if (!a || !b) return (!a || json_is_null(a)) && (!b || json_is_null(b));
    return json_equal(a, b);
}

/* The messages the server held after turn i-1: its request's messages and the reply.
 * Without a recorded reply, the new request's next message stands for it when it is
 * an assistant message (the client's record of the reply). New reference. */
static json_t *held_messages(const struct tern_replay_turn *prev, json_t *now_msgs) {
    json_t *pm = json_object_get(prev->req, "messages");
    json_t *held = json_array();
    if (!held) return NULL;
    json_array_extend(held, pm);
    json_t *reply = prev->reply;
    if (!reply) {
        json_t *cand = json_array_get(now_msgs, json_array_size(pm));
        if (cand && !strcmp(role_of(cand), "assistant")) reply = cand;
    }
    if (reply) json_array_append(held, reply);
    return held;
}

enum tern_status tern_transcript_classify(const struct tern_replay_transcript *t, size_t i,
                                          struct tern_turn_class *out) {
    memset(out, 0, sizeof *out);
    out->diverge_msg = -1;
    if (i >= t->n_turns) return tern_errorf(TERN_ERR_RANGE, "turn %zu out of range (%zu turns)", i, t->n_turns);
    const struct tern_replay_turn *tu = &t->turns[i];
    json_t *msgs = json_object_get(tu->req, "messages");
    json_t *tools = json_object_get(tu->req, "tools");
    struct tern_buf now = TERN_BUF_INIT, had = TERN_BUF_INIT, prev_prompt = TERN_BUF_INIT;
    size_t *spans = NULL;
    json_t *held = NULL;
    enum tern_status st = tern_transcript_render(msgs, tools, true, &now, &spans);
    if (st != TERN_OK) goto out;
    out->prompt_chars = utf8_chars(now.data, now.len);
    if (i == 0) {
        out->kind = TERN_TURN_COLD;
        goto out;
    }
    const struct tern_replay_turn *pv = &t->turns[i - 1];
    json_t *ptools = json_object_get(pv->req, "tools");
    st = tern_transcript_render(json_object_get(pv->req, "messages"), ptools, true, &prev_prompt, NULL);
    if (st != TERN_OK) goto out;
    out->shared_prefix_chars =
        utf8_chars(now.data, common_prefix(prev_prompt.data, prev_prompt.len, now.data, now.len));
    held = held_messages(pv, msgs);
    if (!held) {
        st = tern_errorf(TERN_ERR_NOMEM, "out of memory classifying turn %zu", i);
        goto out;
    }
    size_t n_held = json_array_size(held), n_now = json_array_size(msgs);
    bool json_ext = n_now > n_held && json_same(tools, ptools) &&
                    json_same(json_object_get(tu->req, "model"), json_object_get(pv->req, "model"));
    for (size_t k = 0; json_ext && k < n_held; k++)
        json_ext = json_equal(json_array_get(msgs, k), json_array_get(held, k));
    st = tern_transcript_render(held, ptools, false, &had, NULL);
    if (st != TERN_OK) goto out;
    if (json_ext && now.len >= had.len && !memcmp(now.data, had.data, had.len)) {
        out->kind = TERN_TURN_EXTENSION;
        goto out;
    }
    size_t cut = common_prefix(had.data, had.len, now.data, now.len);
    for (size_t k = 0; k < n_now; k++) {
        size_t a = spans[2 * k], b = spans[2 * k + 1];
        if ((a <= cut && cut < b) || (a == b && b == cut)) {
            out->diverge_msg = (long)k;
            break;
        }
    }
    out->kind = TERN_TURN_REWRITE;
    out->rewrite_by = json_ext ? "template" : "client";
out:
    json_decref(held);
    free(spans);
    tern_buf_free(&now);
    tern_buf_free(&had);
    tern_buf_free(&prev_prompt);
    return st;
}

enum tern_status tern_transcript_verify_kinds(const struct tern_replay_transcript *t, size_t n_turns) {
    if (n_turns > t->n_turns) n_turns = t->n_turns;
    for (size_t i = 0; i < n_turns; i++) {
        const struct tern_replay_turn *tu = &t->turns[i];
        struct tern_turn_class c;
        enum tern_status st = tern_transcript_classify(t, i, &c);
        if (st != TERN_OK) return st;
        if (c.kind != tu->kind)
            return tern_errorf(TERN_ERR_INVALID,
                               "%s line %zu: turn %zu is labeled '%s' but its messages make it '%s'%s%s%s "
                               "(bench/README.md defines the kinds; --trust-kinds uses the labels as they are)",
                               t->path, tu->line_no, i, tern_turn_kind_name(tu->kind), tern_turn_kind_name(c.kind),
                               c.rewrite_by ? " by " : "", c.rewrite_by ? c.rewrite_by : "",
                               c.kind == TERN_TURN_REWRITE ? " (the rendered history changes)"
                               : c.kind == TERN_TURN_EXTENSION ? " (it only appends to the previous turn)"
                                                               : "");
        if (c.kind == TERN_TURN_REWRITE && tu->rewrite_by[0] && strcmp(tu->rewrite_by, c.rewrite_by))
            return tern_errorf(TERN_ERR_INVALID, "%s line %zu: turn %zu is a rewrite by '%s' but its messages show a "
                               "rewrite by %s", t->path, tu->line_no, i, tu->rewrite_by, c.rewrite_by);
    }
    return TERN_OK;
}

enum tern_status tern_transcript_check_rewrite(const struct tern_replay_transcript *t, size_t n_turns) {
    if (n_turns > t->n_turns) n_turns = t->n_turns;
    for (size_t i = 0; i < n_turns; i++)
        if (t->turns[i].kind == TERN_TURN_REWRITE) return TERN_OK;
    return tern_errorf(TERN_ERR_INVALID,
                       "%s: none of the %zu replayed turns rewrites its history (kinds %s); a replay without a "
                       "rewrite cannot show what reuse does when clients and templates rewrite, so it is refused",
                       t->path, n_turns, n_turns <= 64 ? "all cold/extension" : "checked");
}

char *tern_transcript_kinds_string(const struct tern_replay_transcript *t, size_t n_turns) {
    if (n_turns > t->n_turns) n_turns = t->n_turns;
    char *s = tern_malloc(n_turns + 1);
    if (!s) return NULL;
    for (size_t i = 0; i < n_turns; i++) s[i] = tern_turn_kind_letter(t->turns[i].kind);
    s[n_turns] = 0;
    return s;
}

/* ---- request bodies ------------------------------------------------------------------ */

/* Sets top-level member key of the object in b to the JSON text val: replaces the
 * value's bytes when the key exists, else appends the member before the closing '}'. */
static enum tern_status set_member(struct tern_buf *b, const char *key, const char *val) {
    struct member m;
    bool found;
    size_t obj = skip_ws(b->data, b->len, 0);
    if (!find_member(b->data, b->len, obj, key, &m, &found))
        return tern_errorf(TERN_ERR_INTERNAL, "request body is not a JSON object the editor can scan");
    struct tern_buf nb = TERN_BUF_INIT;
    enum tern_status st;
    if (found) {
        st = tern_buf_append(&nb, b->data, m.val_start);
        if (st == TERN_OK) st = tern_buf_puts(&nb, val);
        if (st == TERN_OK) st = tern_buf_append(&nb, b->data + m.val_end, b->len - m.val_end);
    } else {
        size_t close = b->len;
        while (close > 0 && b->data[close - 1] != '}') close--;
        if (close == 0) return tern_errorf(TERN_ERR_INTERNAL, "request body has no closing '}'");
        close--;
        size_t before = close;
        while (before > 0 && (b->data[before - 1] == ' ' || b->data[before - 1] == '\n' ||
                              b->data[before - 1] == '\r' || b->data[before - 1] == '\t'))
            before--;
        bool empty = before > 0 && b->data[before - 1] == '{';
        st = tern_buf_append(&nb, b->data, close);
        if (st == TERN_OK) st = tern_buf_printf(&nb, "%s\"%s\":%s", empty ? "" : ",", key, val);
        if (st == TERN_OK) st = tern_buf_append(&nb, b->data + close, b->len - close);
    }
    if (st != TERN_OK) {
        tern_buf_free(&nb);
        return st;
    }
    tern_buf_free(b);
    *b = nb;
    return TERN_OK;
}

static void note(struct tern_body_edits *e, const char *fmt, const char *a) {
    if (!e || e->n >= TERN_BODY_EDITS_MAX) return;
    snprintf(e->what[e->n++], sizeof e->what[0], fmt, a);
}

static enum tern_status member_bytes(const char *s, size_t n, const char *key, const char **p, size_t *len) {
    struct member m;
    bool found;
    *p = NULL;
    *len = 0;
    if (!find_member(s, n, skip_ws(s, n, 0), key, &m, &found))
        return tern_errorf(TERN_ERR_INTERNAL, "request body is not a JSON object the editor can scan");
    if (found) {
        *p = s + m.val_start;
        *len = m.val_end - m.val_start;
    }
    return TERN_OK;
}

enum tern_status tern_replay_body_build(const struct tern_replay_turn *turn, const struct tern_body_opts *opts,
                                        struct tern_buf *out, struct tern_body_edits *edits) {
    if (edits) edits->n = 0;
    tern_buf_clear(out);
    enum tern_status st = tern_buf_append(out, turn->request, turn->request_len);
    if (st != TERN_OK) return st;
    json_t *req = turn->req;
    if (!json_is_true(json_object_get(req, "stream"))) {
        st = set_member(out, "stream", "true");
        note(edits, "set stream=true (TTFT needs a stream)%s", "");
    }
    json_t *so = json_object_get(req, "stream_options");
    if (st == TERN_OK && !json_is_true(json_object_get(so, "include_usage"))) {
        json_t *nso = json_is_object(so) ? json_deep_copy(so) : json_object();
        char *txt = NULL;
        if (nso && json_object_set_new(nso, "include_usage", json_true()) == 0)
            txt = json_dumps(nso, JSON_COMPACT);
        json_decref(nso);
        if (!txt) return tern_errorf(TERN_ERR_NOMEM, "out of memory editing stream_options");
        st = set_member(out, "stream_options", txt);
        free(txt);
        note(edits, "%s stream_options.include_usage=true (usage is measured)", so ? "set" : "added");
    }
    if (st == TERN_OK && opts && opts->max_tokens >= 0) {
        const char *key = json_object_get(req, "max_tokens") || !json_object_get(req, "max_completion_tokens")
                              ? "max_tokens"
                              : "max_completion_tokens";
        char val[32];
        snprintf(val, sizeof val, "%ld", opts->max_tokens);
        if (json_integer_value(json_object_get(req, key)) != opts->max_tokens || !json_object_get(req, key)) {
            st = set_member(out, key, val);
            char what[64];
            snprintf(what, sizeof what, "%s=%s", key, val);
            note(edits, "set %s (--max-tokens)", what);
        }
    }
    if (st == TERN_OK && opts && opts->cache_salt) {
        json_t *old = json_object_get(req, "cache_salt");
        json_t *salt = json_is_string(old) ? json_sprintf("%s/%s", json_string_value(old), opts->cache_salt)
                                           : json_string(opts->cache_salt);
        char *txt = salt ? json_dumps(salt, JSON_ENCODE_ANY) : NULL;
        json_decref(salt);
        if (!txt) return tern_errorf(TERN_ERR_NOMEM, "out of memory editing cache_salt");
        st = set_member(out, "cache_salt", txt);
        free(txt);
        note(edits, "set cache_salt (rep isolation)%s", "");
    }
    if (st != TERN_OK) return st;
    /* What the prompt is made of must not have moved a byte. */
    static const char *const keep[] = {"messages", "tools", "model", "temperature", "tool_choice"};
    for (size_t i = 0; i < TERN_ARRAY_LEN(keep); i++) {
        const char *a, *b;
        size_t na, nb;
        st = member_bytes(turn->request, turn->request_len, keep[i], &a, &na);
        if (st == TERN_OK) st = member_bytes(out->data, out->len, keep[i], &b, &nb);
        if (st != TERN_OK) return st;
        if (na != nb || (na && memcmp(a, b, na)))
            return tern_errorf(TERN_ERR_INTERNAL, "turn %ld: editing the body changed the bytes of '%s'", turn->turn,
                               keep[i]);
    }
    /* And the result must still be JSON. */
    json_error_t jerr;
    json_t *chk = json_loadb(out->data, out->len, 0, &jerr);
    if (!chk) return tern_errorf(TERN_ERR_INTERNAL, "turn %ld: edited body is not JSON: %s", turn->turn, jerr.text);
    json_decref(chk);
    return TERN_OK;
}
